/*
 * Test server for the C API: registers names on one control descriptor,
 * answers flow requests (accepting, or refusing those whose requester's
 * name starts with "refuse") and echoes every SDU of an accepted flow until
 * the client closes it. Exercises every server-side call and flag.
 *
 * Prints "ready" once registered, a line per request, "done" at the end,
 * and exits 0 once the client's five requests (client.c) are served.
 */
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include "check.h"

static void echo(int fd)
{
    char buf[2048];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0) {
            break; /* the client closed the flow */
        }
        CHECK(write(fd, buf, n) == n);
    }
    close(fd);
}

static void wait_readable(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    CHECK(poll(&p, 1, 20000) == 1);
}

static void registrations(int cfd)
{
    /* Two-step registration, completed after poll. */
    int wfd = rina_register(cfd, "udp", "capi-echo|1", RINA_F_NOWAIT);
    CHECK(wfd >= 0 && wfd != cfd);
    wait_readable(wfd);
    CHECK(rina_register_wait(cfd, wfd) == 0);
    /* Blocking registration, in every DIF. */
    CHECK(rina_register(cfd, NULL, "capi-refuse", 0) == 0);

    CHECK_FAILS(rina_register(cfd, NULL, "capi-echo|1", 0), EBUSY);
    CHECK_FAILS(rina_register(cfd, "no-such-dif", "x", 0), ENXIO);
    CHECK_FAILS(rina_register(cfd, NULL, "a|b|c|d|e", 0), EINVAL);
    {
        static char long_dif[70000];
        memset(long_dif, 'd', sizeof(long_dif) - 1);
        CHECK_FAILS(rina_register(cfd, long_dif, "x", 0), EINVAL);
    }
    CHECK_FAILS(rina_register(cfd, NULL, NULL, 0), EINVAL);
    CHECK_FAILS(rina_register(0, NULL, "x", 0), EBADF);
    CHECK_FAILS(rina_unregister(cfd, NULL, "never-registered", 0), EINVAL);

    /* Register and withdraw, the second step without waiting. */
    CHECK(rina_register(cfd, "udp", "capi-temp", 0) == 0);
    wfd = rina_unregister(cfd, "udp", "capi-temp", RINA_F_NOWAIT);
    CHECK(wfd >= 0);
    CHECK(rina_register_wait(cfd, wfd) == 0);
    CHECK_FAILS(rina_register_wait(cfd, 12345), EBADF);
}

static void not_ready(int cfd)
{
    /* Nothing waits: a non-blocking control descriptor says EAGAIN. */
    int fl = fcntl(cfd, F_GETFL);
    CHECK(fcntl(cfd, F_SETFL, fl | O_NONBLOCK) == 0);
    CHECK_FAILS(rina_flow_accept(cfd, NULL, NULL, 0), EAGAIN);
    CHECK(fcntl(cfd, F_SETFL, fl) == 0);
    CHECK_FAILS(rina_flow_respond(cfd, 4242, 0), EINVAL);
    CHECK_FAILS(rina_flow_accept(0, NULL, NULL, 0), EBADF);
    CHECK(rina_flow_mss_get(cfd) == 0 && errno == EBADF);
}

/* Prints what was accepted: the test checks the names and the QoS. */
static void report(int fd, const char *remote, const struct rina_flow_spec *spec)
{
    CHECK(spec->version == RINA_FLOW_SPEC_VERSION);
    printf("accepted %s mss %u gap %lld bw %llu loss %u in_order %u\n", remote,
           rina_flow_mss_get(fd), (long long)spec->max_sdu_gap,
           (unsigned long long)spec->avg_bandwidth, spec->max_loss,
           spec->in_order_delivery);
    fflush(stdout);
}

/* Takes one request; accepts it (plainly, or in two steps with NORESP) or
 * refuses it if the requester's name starts with "refuse". Returns the flow
 * or -1 if refused. */
static int take(int cfd, int two_steps)
{
    char *remote = NULL;
    struct rina_flow_spec spec;
    int fd;
    memset(&spec, 0xff, sizeof(spec));
    wait_readable(cfd);
    if (two_steps) {
        int h = rina_flow_accept(cfd, &remote, &spec, RINA_F_NORESP);
        CHECK(h > 0);
        if (strncmp(remote, "refuse", 6) == 0) {
            CHECK(rina_flow_respond(cfd, h, -1) == 0);
            CHECK_FAILS(rina_flow_respond(cfd, h, 0), EINVAL); /* used up */
            printf("refused %s\n", remote);
            fflush(stdout);
            free(remote);
            return -1;
        }
        fd = rina_flow_respond(cfd, h, 0);
    } else {
        fd = rina_flow_accept(cfd, &remote, &spec, 0);
    }
    CHECK(fd >= 0);
    report(fd, remote, &spec);
    free(remote);
    return fd;
}

/* Echoes one SDU. */
static void echo_one(int fd)
{
    char buf[2048];
    ssize_t n = read(fd, buf, sizeof(buf));
    CHECK(n > 0);
    CHECK(write(fd, buf, n) == n);
}

int main(void)
{
    int cfd = rina_open();
    CHECK(cfd >= 0);
    registrations(cfd);
    not_ready(cfd);
    printf("ready\n");
    fflush(stdout);

    /* The client's blocking allocation, its NOWAIT one, its refused one. */
    echo(take(cfd, 1));
    echo(take(cfd, 0));
    CHECK(take(cfd, 1) == -1);
    /* Two allocations at once: the second request arrives while the first
     * is being accepted, and must still make cfd readable. */
    int a = take(cfd, 0);
    int b = take(cfd, 1);
    echo_one(a);
    echo_one(b);
    echo(a);
    echo(b);

    CHECK(rina_unregister(cfd, "udp", "capi-echo|1", 0) == 0);
    CHECK(close(cfd) == 0);
    printf("done\n");
    return 0;
}
