/*
 * Test client for the C API: allocates flows to the test server (server.c)
 * blocking and with RINA_F_NOWAIT, with and without a flow spec, checks the
 * echoes, and checks the errors of every client-side call.
 *
 * usage: client            the full run against server.c
 *        client nodaemon   only checks that rina_open() and rina_flow_alloc()
 *                          fail cleanly when no daemon listens
 *        client signals    checks that a signal the program blocks (to take
 *                          it with sigtimedwait) is not delivered to the
 *                          library's relay thread, which it would kill
 *        client exit       checks that calls failing in an atexit handler
 *                          and a thread key's destructor set errno
 *        client fork       checks that a child of fork() using its parent's
 *                          control descriptor fails at once with EBADF (the
 *                          relay thread stayed in the parent) and that a
 *                          descriptor of its own works
 *        client exec       allocates a flow to server.c and exec()s itself
 *                          ("inherited FD MSS"), whose fresh library gets
 *                          the flow's MSS from the daemon
 */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

/* Sends @n SDUs of growing size and checks each echo. */
static void exchange(int fd, int n)
{
    char out[1400], in[1400];
    unsigned mss = rina_flow_mss_get(fd);
    CHECK(mss >= sizeof(out));
    for (int i = 0; i < n; i++) {
        size_t len = 1 + (size_t)i * 97 % sizeof(out);
        memset(out, 'a' + i % 26, len);
        CHECK(write(fd, out, len) == (ssize_t)len);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        CHECK(poll(&p, 1, 10000) == 1);
        CHECK(read(fd, in, sizeof(in)) == (ssize_t)len);
        CHECK(memcmp(in, out, len) == 0);
    }
    /* The largest SDU passes in one write. */
    memset(out, 'z', sizeof(out));
    CHECK(write(fd, out, sizeof(out)) == (ssize_t)sizeof(out));
    CHECK(read(fd, in, sizeof(in)) == (ssize_t)sizeof(in));
}

static int wait_alloc(int wfd)
{
    struct pollfd p = {.fd = wfd, .events = POLLIN};
    CHECK(poll(&p, 1, 10000) == 1);
    return rina_flow_alloc_wait(wfd);
}

static void errors(void)
{
    struct rina_flow_spec spec;
    rina_flow_spec_default(&spec);

    CHECK_FAILS(rina_flow_alloc("udp", "me", "nobody", NULL, 0), EHOSTUNREACH);
    CHECK_FAILS(rina_flow_alloc("no-such-dif", "me", "capi-echo|1", NULL, 0), ENXIO);
    CHECK_FAILS(rina_flow_alloc(NULL, "a|b|c|d|e", "capi-echo|1", NULL, 0), EINVAL);
    CHECK_FAILS(rina_flow_alloc(NULL, "me", NULL, NULL, 0), EINVAL);
    CHECK_FAILS(rina_flow_alloc(NULL, NULL, "capi-echo|1", NULL, 0), EINVAL);
    spec.version = 1;
    CHECK_FAILS(rina_flow_alloc(NULL, "me", "capi-echo|1", &spec, 0), EINVAL);
    rina_flow_spec_unreliable(&spec);
    spec.max_loss = RINA_FLOW_SPEC_LOSS_MAX + 1;
    CHECK_FAILS(rina_flow_alloc(NULL, "me", "capi-echo|1", &spec, 0), EINVAL);
    /* A DIF name longer than any DIF's is refused before it is sent (the
     * daemon's answer, quoting it, would be too large to read). */
    static char long_dif[70000];
    memset(long_dif, 'd', sizeof(long_dif) - 1);
    CHECK_FAILS(rina_flow_alloc(long_dif, "me", "capi-echo|1", NULL, 0), EINVAL);
    CHECK(strstr(rina_api_last_error(), "dif_name") != NULL);
    CHECK_FAILS(rina_flow_alloc_wait(-1), EBADF);
    CHECK(rina_flow_mss_get(0) == 0 && errno == EBADF);
    CHECK(rina_flow_mss_get(-1) == 0 && errno == EBADF);
}

static int nodaemon(void)
{
    CHECK_FAILS(rina_open(), ECONNREFUSED);
    CHECK(strlen(rina_api_last_error()) > 0);
    CHECK_FAILS(rina_flow_alloc(NULL, "me", "you", NULL, 0), ECONNREFUSED);
    CHECK_FAILS(rina_flow_alloc(NULL, "me", "you", NULL, RINA_F_NOWAIT), ECONNREFUSED);
    /* As in rlite: flags a call does not take are refused before anything
     * else, and *remote_appl is NULL after a failed accept. */
    CHECK_FAILS(rina_flow_alloc(NULL, "me", "you", NULL, RINA_F_NORESP), EINVAL);
    CHECK_FAILS(rina_register(-1, NULL, "me", 1 << 5), EINVAL);
    CHECK_FAILS(rina_unregister(-1, NULL, "me", RINA_F_NORESP), EINVAL);
    CHECK_FAILS(rina_flow_accept(-1, NULL, NULL, RINA_F_NOWAIT), EINVAL);
    char *remote = (char *)&remote;
    CHECK_FAILS(rina_flow_accept(-1, &remote, NULL, 0), EBADF);
    CHECK(remote == NULL);
    printf("nodaemon ok\n");
    return 0;
}

static int signals(void)
{
    int cfd = rina_open();
    CHECK(cfd >= 0);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    CHECK(sigprocmask(SIG_BLOCK, &set, NULL) == 0);
    CHECK(kill(getpid(), SIGUSR1) == 0);
    struct timespec t = {.tv_sec = 10};
    CHECK(sigtimedwait(&set, NULL, &t) == SIGUSR1);
    CHECK(close(cfd) == 0);
    printf("signals ok\n");
    return 0;
}

/* Failing calls after the thread's storage is gone (glibc destroys it
 * before atexit handlers and pthread key destructors run). */
static pthread_key_t exit_key;

static void on_thread_exit(void *p)
{
    (void)p;
    errno = 0;
    if (rina_flow_mss_get(-1) == 0 && errno == EBADF) {
        printf("key destructor ok\n");
    }
}

static void *exit_worker(void *p)
{
    (void)p;
    CHECK(pthread_setspecific(exit_key, (void *)1) == 0);
    CHECK(rina_flow_mss_get(-1) == 0 && errno == EBADF);
    return NULL;
}

static void at_exit(void)
{
    CHECK_FAILS(rina_flow_alloc_wait(-1), EBADF);
    CHECK(rina_api_last_error() != NULL);
    printf("atexit ok\n");
    fflush(stdout);
}

static int exit_handlers(void)
{
    pthread_t t;
    CHECK(pthread_key_create(&exit_key, on_thread_exit) == 0);
    CHECK(pthread_create(&t, NULL, exit_worker, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(atexit(at_exit) == 0);
    /* A failure first, so that this thread's error text exists. */
    CHECK_FAILS(rina_flow_alloc_wait(-1), EBADF);
    fflush(stdout);
    return 0;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int forked(void)
{
    int cfd = rina_open();
    CHECK(cfd >= 0);
    CHECK(rina_register(cfd, NULL, "capi-parent", 0) == 0);
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        double t0 = now_s();
        CHECK_FAILS(rina_register(cfd, NULL, "capi-child", 0), EBADF);
        CHECK(strstr(rina_api_last_error(), "before a fork") != NULL);
        CHECK(now_s() - t0 < 5.0);
        int own = rina_open();
        CHECK(own >= 0);
        CHECK(rina_register(own, NULL, "capi-child", 0) == 0);
        CHECK(close(own) == 0);
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The parent's descriptor still works. */
    CHECK(rina_unregister(cfd, NULL, "capi-parent", 0) == 0);
    CHECK(close(cfd) == 0);
    printf("fork ok\n");
    return 0;
}

/* Allocates a flow and hands it to a fresh image of this program. */
static int exec_flow(const char *self)
{
    int fd = rina_flow_alloc("udp", "capi-client|exec", "capi-echo|1", NULL, 0);
    CHECK(fd >= 0);
    unsigned mss = rina_flow_mss_get(fd);
    CHECK(mss > 0);
    int flags = fcntl(fd, F_GETFD);
    CHECK(flags >= 0 && fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC) == 0);
    char fds[16], msss[16];
    snprintf(fds, sizeof(fds), "%d", fd);
    snprintf(msss, sizeof(msss), "%u", mss);
    execl(self, self, "inherited", fds, msss, (char *)NULL);
    CHECK(!"execl");
    return 1;
}

/* The flow descriptor @fds came across exec(): this library never saw it. */
static int inherited(const char *fds, const char *msss)
{
    int fd = atoi(fds);
    unsigned want = (unsigned)strtoul(msss, NULL, 10);
    CHECK(rina_flow_mss_get(fd) == want);
    /* A duplicate is the same socket. */
    int d = dup(fd);
    CHECK(d >= 0 && rina_flow_mss_get(d) == want);
    CHECK(close(d) == 0);
    /* A socket that is no flow: the daemon says so. */
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
    errno = 0;
    CHECK(rina_flow_mss_get(sv[0]) == 0 && errno == EBADF);
    CHECK(close(sv[0]) == 0 && close(sv[1]) == 0);
    /* And the flow still carries SDUs. */
    exchange(fd, 3);
    CHECK(close(fd) == 0);
    printf("inherited ok\n");
    return 0;
}

int main(int argc, char **argv)
{
    struct rina_flow_spec spec;
    int fd, wfd, a, b;

    if (argc > 1 && strcmp(argv[1], "nodaemon") == 0) {
        return nodaemon();
    }
    if (argc > 1 && strcmp(argv[1], "signals") == 0) {
        return signals();
    }
    if (argc > 1 && strcmp(argv[1], "exit") == 0) {
        return exit_handlers();
    }
    if (argc > 1 && strcmp(argv[1], "fork") == 0) {
        return forked();
    }
    if (argc > 1 && strcmp(argv[1], "exec") == 0) {
        return exec_flow(argv[0]);
    }
    if (argc > 3 && strcmp(argv[1], "inherited") == 0) {
        return inherited(argv[2], argv[3]);
    }
    errors();

    /* 1. Blocking, best effort (NULL spec), in a named DIF. */
    fd = rina_flow_alloc("udp", "capi-client|1", "capi-echo|1", NULL, 0);
    CHECK(fd >= 0);
    exchange(fd, 10);
    CHECK(close(fd) == 0);

    /* 2. Two steps, with a spec, in any DIF. */
    rina_flow_spec_unreliable(&spec);
    CHECK(spec.version == RINA_FLOW_SPEC_VERSION && spec.msg_boundaries == 1);
    spec.avg_bandwidth = 1000000;
    spec.max_loss = 500; /* 5 % */
    spec.max_sdu_gap = 3;
    wfd = rina_flow_alloc(NULL, "capi-client|2", "capi-echo|1", &spec, RINA_F_NOWAIT);
    CHECK(wfd >= 0);
    fd = wait_alloc(wfd);
    CHECK(fd >= 0);
    exchange(fd, 5);
    CHECK(close(fd) == 0);

    /* 3. Refused by the server. */
    CHECK_FAILS(rina_flow_alloc(NULL, "refuse-me", "capi-refuse", NULL, 0), ECONNREFUSED);

    /* 4. Two allocations in flight at once. */
    a = rina_flow_alloc("udp", "capi-client|3", "capi-echo|1", NULL, RINA_F_NOWAIT);
    b = rina_flow_alloc("udp", "capi-client|4", "capi-echo|1", NULL, RINA_F_NOWAIT);
    CHECK(a >= 0 && b >= 0);
    a = wait_alloc(a);
    b = wait_alloc(b);
    CHECK(a >= 0 && b >= 0);
    {
        char buf[8];
        CHECK(write(a, "A", 1) == 1 && write(b, "B", 1) == 1);
        CHECK(read(a, buf, sizeof(buf)) == 1 && buf[0] == 'A');
        CHECK(read(b, buf, sizeof(buf)) == 1 && buf[0] == 'B');
    }
    CHECK(close(a) == 0 && close(b) == 0);
    printf("client ok\n");
    return 0;
}
