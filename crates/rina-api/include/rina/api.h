/*
 * rina/api.h: the POSIX-like RINA API (as defined by rlite and adopted by
 * IRATI), implemented by librina_api over rinad's control socket.
 *
 * Link with: cc prog.c $(pkg-config --cflags --libs rina-api)
 *
 * Every function returns 0 or a positive value on success and -1 with errno
 * set on failure (rina_flow_mss_get returns 0 on failure);
 * rina_api_last_error() has a sentence saying what went wrong. Flags a call
 * does not take fail with EINVAL, as in rlite.
 *
 * Application names are written "name|instance|entity|instance"; trailing
 * separators may be left out ("aa|bb", "aa"). A name without '|' is read in
 * rinad's own syntax, "name/instance/entity/instance". Application and
 * DIF names have at most 255 bytes; longer ones fail with EINVAL.
 *
 * The daemon's socket is $RINA_SOCKET, else $XDG_RUNTIME_DIR/rinad.sock,
 * else /run/rinad.sock for root, else /tmp/rinad-<uid>/rinad.sock.
 *
 * Each descriptor from rina_open() has a thread of the library behind it,
 * which passes the daemon's flow requests to it (and blocks every signal,
 * so the program's signals reach its own threads). A child made with fork()
 * cannot use its parent's control descriptors (flow descriptors are fine).
 * The functions may be called from several threads at once.
 *
 * A call that waits for the daemon (to take its connection or its request,
 * or to answer) gives up after 30 s with ETIMEDOUT, so a daemon that is
 * alive but stuck does not block the program for ever.
 */

#ifndef __RINA_API_H__
#define __RINA_API_H__

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * QoS asked of a flow. Fill it with rina_flow_spec_unreliable() first, then
 * change fields. max_sdu_gap == 0 asks for a reliable (and in-order) flow;
 * "no bound" is (uint64_t)-1 in max_sdu_gap, RINA_FLOW_SPEC_LOSS_MAX in
 * max_loss and 0 in max_delay, avg_bandwidth and max_jitter.
 */
struct rina_flow_spec {
    uint32_t version; /* RINA_FLOW_SPEC_VERSION */
#define RINA_FLOW_SPEC_VERSION 2
    uint32_t max_delay;     /* in microseconds */
    uint64_t max_sdu_gap;   /* in SDUs, at most 2^31 - 1 (or "no bound") */
    uint64_t avg_bandwidth; /* in bits per second */
#define RINA_FLOW_SPEC_LOSS_MAX 10000
    uint16_t max_loss;         /* from 0 (0%) to 10000 (100%) */
    uint8_t in_order_delivery; /* boolean */
    uint8_t msg_boundaries;    /* boolean; flows always keep boundaries */
    uint32_t max_jitter;       /* in microseconds; not used by rinad's DIFs */
};

/* Start the operation and return a descriptor to wait on (poll for POLLIN). */
#define RINA_F_NOWAIT (1 << 0)
/* rina_flow_accept(): take the request, answer later with rina_flow_respond(). */
#define RINA_F_NORESP (1 << 1)
/*
 * rina_register() (rinad's, not rlite's): the daemon accepts every flow
 * request for the name at once, as a listening TCP socket's backlog does,
 * so that an allocation waits for no round trip to the program;
 * rina_flow_accept() then hands the flows over. The library holds at
 * most 1024 flows the program has not taken; past that it closes (and so
 * deallocates) the flows that come, which their requesters see end.
 */
#define RINA_F_ACCEPT (1 << 2)

/*
 * A control descriptor for registering names and receiving flow requests.
 * It turns readable when a flow request for one of its names waits, or a
 * flow the daemon accepted for one (RINA_F_ACCEPT).
 * close() it to withdraw its registrations. If rinad goes away, it reads
 * end-of-file and the calls on it fail with ECONNRESET.
 */
int rina_open(void);

/*
 * Register @local_appl in @dif_name (NULL: every DIF of the system). Blocks
 * and returns 0, or with RINA_F_NOWAIT returns a descriptor that turns
 * readable when the registration is done; finish with rina_register_wait().
 * With RINA_F_ACCEPT the daemon accepts the name's flows itself.
 */
int rina_register(int fd, const char *dif_name, const char *local_appl,
                  int flags);

/* Withdraw a registration made on @fd; flags as for rina_register(). */
int rina_unregister(int fd, const char *dif_name, const char *local_appl,
                    int flags);

/*
 * Finish a RINA_F_NOWAIT (un)registration; closes @wfd (also when it fails
 * because @fd is no control descriptor, e.g. closed meanwhile); returns 0.
 * If @wfd was made O_NONBLOCK and the answer has not come, fails with
 * EAGAIN and leaves @wfd open.
 */
int rina_register_wait(int fd, int wfd);

/*
 * Take the next flow request that arrived on @fd (blocks unless @fd is
 * O_NONBLOCK, then fails with EAGAIN; a signal whose handler was installed
 * without SA_RESTART interrupts the wait with EINTR). *@remote_appl (if not
 * NULL) gets the requester's name, to be freed with free(), or NULL if the
 * call fails; *@spec (if not NULL) the QoS it asked for. Without
 * RINA_F_NORESP the flow is accepted and its descriptor returned (a request
 * the daemon withdrew meanwhile, because its requester gave up or the DIF's
 * accept timeout passed, is passed over); with it, a handle for
 * rina_flow_respond() is returned. A flow the daemon accepted (a name
 * registered with RINA_F_ACCEPT) comes the same way: its descriptor, or a
 * handle whose refusal closes (deallocates) the flow.
 */
int rina_flow_accept(int fd, char **remote_appl, struct rina_flow_spec *spec,
                     unsigned int flags);

/*
 * Answer a request taken with RINA_F_NORESP: @response 0 accepts it and
 * returns the flow's descriptor; any other value refuses it and returns 0.
 * Fails with EINVAL if the handle was answered already or the daemon
 * withdrew the request meanwhile (its requester gave up, or the DIF's
 * accept timeout passed). A handle of a flow the daemon accepted
 * (RINA_F_ACCEPT) holds that flow until it is answered or @fd closed;
 * refusing it closes the flow, whose requester then sees it end.
 */
int rina_flow_respond(int fd, int handle, int response);

/*
 * Allocate a flow from @local_appl to @remote_appl, in @dif_name if not
 * NULL, with @flowspec (NULL: best effort). Returns the flow's descriptor
 * (one write() is one SDU, one read() one SDU, close() deallocates), or with
 * RINA_F_NOWAIT a descriptor that turns readable when the daemon answers;
 * finish with rina_flow_alloc_wait().
 */
int rina_flow_alloc(const char *dif_name, const char *local_appl,
                    const char *remote_appl,
                    const struct rina_flow_spec *flowspec, unsigned int flags);

/*
 * Finish a RINA_F_NOWAIT allocation; closes @wfd; returns the flow. If @wfd
 * was made O_NONBLOCK and the answer has not come, fails with EAGAIN and
 * leaves @wfd open (as in rlite). A control or flow descriptor given as
 * @wfd (here or to rina_register_wait()) fails with EBADF, untouched.
 */
int rina_flow_alloc_wait(int wfd);

/* Fill @spec with the best-effort QoS (unreliable, no bounds). */
void rina_flow_spec_unreliable(struct rina_flow_spec *spec);

/* The older name of rina_flow_spec_unreliable(). */
void rina_flow_spec_default(struct rina_flow_spec *spec);

/* Largest SDU one write() may carry on flow @fd; 0 on error. A larger
 * write() still returns its length (the descriptor is a socket, and the
 * daemon reads the SDU after the call returned) but the SDU is dropped,
 * and counted in the flow's drops_out (rinactl flows): check the size
 * against this before writing. Works on any flow descriptor: one this
 * process did not open (inherited across exec(), or passed over a Unix
 * socket) is looked up in the daemon, once. */
unsigned int rina_flow_mss_get(int fd);

/*
 * Extension of this implementation: the calling thread's last error as a
 * sentence (never NULL; valid until its next failing call).
 */
const char *rina_api_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* __RINA_API_H__ */
