/* UCX's listening sockets, and closing them to strangers once every peer is connected.
 *
 * Endpoints to a worker address reach the peer through UCX's TCP transport, which listens on
 * each network device it uses (one uct tcp iface, one socket, per device) for as long as the
 * worker lives. UCX 1.13 checks the 8-byte magic number that a connection must begin with and
 * silently closes one that begins otherwise (random bytes, an empty or idle connection are
 * harmless), but parses what follows the magic number with assertions: a stranger who sends
 * that public number and then a message header announcing 4 GiB aborts the process
 * (tcp_ep.c:1404; built without assertions, UCX would read past its buffer instead). pipert
 * cannot reach into that parser, so it keeps strangers from reaching it once no peer needs to:
 *
 *   - pt_transport_create notes the TCP sockets that listen before ucp_worker_create; UCX's
 *     are those that listen after it and whose port is written in the worker's address;
 *   - pt_transport_stop_listening attaches to each a socket filter that drops every packet
 *     (classic BPF: "return 0"). The kernel then drops new connections' SYNs: a stranger's
 *     connect times out and no byte of it reaches UCX. UCX keeps its socket, its handler and
 *     its ordinary teardown (closing the socket under it would leave UCX a stale handler, and
 *     a warning or an error at exit);
 *   - connections UCX accepted that have not sent a byte by then (a stranger who connected
 *     while peers were still expected, and waits) get the same filter: nothing of theirs
 *     arrives any more. A peer's connection has always sent UCX's greeting by then.
 *
 * Connections already made are other sockets and go on; no new peer can connect afterwards,
 * which is why the session calls it only once all of its peers are (session/job.c). Until
 * then a stranger who speaks UCX's protocol can still abort a worker: a window of the
 * seconds that connecting takes, which docs/ARCHITECTURE.md ("Strangers") states.
 *
 * A replica rejoining an elastic job is such a new peer: pt_transport_listen_again detaches
 * the filters while the survivors of its stage connect to it (session/join.c), and they stop
 * listening again once it is in — the same window, once per join. */
#include "comm/transport_internal.h"
#include "comm/transport_listeners.h"

#include <dirent.h>
#include <errno.h>
#include <linux/filter.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/clock.h"
#include "runtime/log.h"

/* tcp_info's tcpi_state of an established connection (the kernel's TCP_ESTABLISHED). */
#define STATE_ESTABLISHED 1
/* How long stop_listening waits for connections a listener has queued to be accepted by UCX. */
#define ACCEPT_QUEUE_WAIT_S 2.0

/* One TCP socket of this process. */
typedef struct tcp_socket {
    int fd;
    ino_t inode;
    struct sockaddr_storage local;
    int port; /* local's */
    int listening;
} tcp_socket;

typedef void (*socket_fn)(const tcp_socket *s, void *arg);

static int describe_socket(int fd, tcp_socket *out)
{
    struct stat st;
    int protocol = 0, listening = 0;
    socklen_t length = sizeof protocol;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode) ||
        getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &length) != 0 ||
        protocol != IPPROTO_TCP)
        return 0;
    length = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) != 0) return 0;
    struct sockaddr_storage address;
    length = sizeof address;
    if (getsockname(fd, (struct sockaddr *)&address, &length) != 0) return 0;
    int port = address.ss_family == AF_INET    ? ntohs(((struct sockaddr_in *)&address)->sin_port)
               : address.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&address)->sin6_port)
                                               : 0;
    *out = (tcp_socket){
        .fd = fd, .inode = st.st_ino, .local = address, .port = port, .listening = listening};
    return port != 0;
}

/* Calls fn for every TCP socket this process has open (from /proc/self/fd). */
static void each_tcp_socket(socket_fn fn, void *arg)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        tcp_socket s;
        if (*end || end == e->d_name || fd == dirfd(d) || !describe_socket((int)fd, &s)) continue;
        fn(&s, arg);
    }
    closedir(d);
}

/* ---- finding UCX's ------------------------------------------------------- */

static void note_listening(const tcp_socket *s, void *arg)
{
    pt_transport *t = arg;
    if (!s->listening) return;
    ino_t *grown =
        realloc(t->listening_before, (size_t)(t->n_listening_before + 1) * sizeof *grown);
    if (!grown) return;
    t->listening_before = grown;
    t->listening_before[t->n_listening_before++] = s->inode;
}

void pt_transport_note_listening_sockets(pt_transport *t) { each_tcp_socket(note_listening, t); }

/* Whether the worker address holds `port` as UCX writes it (network byte order). */
static int address_names_port(const pt_transport *t, int port)
{
    const uint8_t high = (uint8_t)(port >> 8), low = (uint8_t)port;
    for (size_t i = 0; i + 1 < t->worker_address_length; i++)
        if (t->worker_address[i] == high && t->worker_address[i + 1] == low) return 1;
    return 0;
}

static void note_ucx_listener(const tcp_socket *s, void *arg)
{
    pt_transport *t = arg;
    if (!s->listening || !address_names_port(t, s->port)) return;
    for (int i = 0; i < t->n_listening_before; i++)
        if (t->listening_before[i] == s->inode) return;
    ucx_listener *grown = realloc(t->listeners, (size_t)(t->n_listeners + 1) * sizeof *grown);
    if (!grown) return;
    t->listeners = grown;
    t->listeners[t->n_listeners++] =
        (ucx_listener){.fd = s->fd, .inode = s->inode, .local = s->local, .port = s->port};
}

void pt_transport_find_ucx_listeners(pt_transport *t)
{
    each_tcp_socket(note_ucx_listener, t);
    free(t->listening_before);
    t->listening_before = NULL;
    t->n_listening_before = 0;
    for (int i = 0; i < t->n_listeners; i++)
        pt_debug("transport: UCX listens on port %d (fd %d)", t->listeners[i].port,
                 t->listeners[i].fd);
}

/* ---- closing them -------------------------------------------------------- */

static int drop_every_packet(int fd)
{
    struct sock_filter code[] = {BPF_STMT(BPF_RET | BPF_K, 0)};
    struct sock_fprog program = {.len = 1, .filter = code};
    return setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &program, sizeof program);
}

static int still_ucx_listener(const ucx_listener *l)
{
    tcp_socket s;
    return describe_socket(l->fd, &s) && s.listening && s.inode == l->inode;
}

/* Connections the kernel completed and UCX has not accepted yet (tcpi_unacked, for a listener). */
static unsigned accept_queue_length(int fd)
{
    struct tcp_info info;
    socklen_t length = sizeof info;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) return 0;
    return info.tcpi_unacked;
}

/* A connection accepted by a listener has the listener's local address and port (no socket
 * that dials out can have them: the listener holds them). */
static int same_local_address(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family) return 0;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
    return x->sin6_port == y->sin6_port && !memcmp(&x->sin6_addr, &y->sin6_addr, 16);
}

static void close_silent_stranger(const tcp_socket *s, void *arg)
{
    const pt_transport *t = arg;
    if (s->listening) return;
    int accepted_by_ucx = 0;
    for (int i = 0; i < t->n_listeners; i++)
        accepted_by_ucx |= same_local_address(&t->listeners[i].local, &s->local);
    struct tcp_info info;
    socklen_t length = sizeof info;
    if (!accepted_by_ucx || getsockopt(s->fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0 ||
        info.tcpi_state != STATE_ESTABLISHED || info.tcpi_bytes_received != 0)
        return;
    if (drop_every_packet(s->fd) == 0)
        pt_warn("transport: a connection to UCX's port %d had sent nothing once every peer was "
                "connected (a stranger's): nothing from it reaches UCX any more",
                s->port);
}

pipert_result pt_transport_listen_again(pt_transport *t)
{
    for (int i = 0; i < t->n_listeners; i++) {
        const ucx_listener *l = &t->listeners[i];
        if (!still_ucx_listener(l)) continue;
        int unused = 0;
        if (setsockopt(l->fd, SOL_SOCKET, SO_DETACH_FILTER, &unused, sizeof unused) != 0 &&
            errno != ENOENT)
            return pt_fail(PIPERT_ERR_TRANSPORT, "transport: cannot open UCX's listening socket "
                                                 "(port %d) again: %s",
                           l->port, strerror(errno));
        pt_debug("transport: UCX's port %d takes new connections again", l->port);
    }
    return PIPERT_OK;
}

pipert_result pt_transport_stop_listening(pt_transport *t)
{
    for (int i = 0; i < t->n_listeners; i++) {
        const ucx_listener *l = &t->listeners[i];
        if (!still_ucx_listener(l)) continue; /* UCX closed it */
        double until = pt_now_s() + ACCEPT_QUEUE_WAIT_S;
        while (accept_queue_length(l->fd) > 0 && pt_now_s() < until) usleep(1000);
        if (drop_every_packet(l->fd) != 0)
            return pt_fail(PIPERT_ERR_TRANSPORT,
                           "transport: cannot close UCX's listening socket (port %d) to new "
                           "connections: %s",
                           l->port, strerror(errno));
        pt_debug("transport: UCX's port %d takes no new connection", l->port);
    }
    each_tcp_socket(close_silent_stranger, t);
    return PIPERT_OK;
}
