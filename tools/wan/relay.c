#include "tools/wan/relay.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "runtime/error.h"

#define PACKET_MAX 65536
#define EVENTS_MAX 16

typedef struct held_packet {
    struct held_packet *next;
    int64_t release_ns;
    size_t length;
    unsigned char data[];
} held_packet;

/* Packets of one ordered pair of sites: one latency, so release times are in
 * arrival order and a FIFO is a priority queue. */
typedef struct packet_fifo {
    held_packet *head, *tail;
} packet_fifo;

struct pt_relay {
    int sites, subnet_b;
    const int *tun_fds;
    int64_t *delay_ns;   /* [from·sites + to] */
    packet_fifo *queues; /* [from·sites + to] */
    int epoll_fd, timer_fd, stop_fd;
    pthread_t thread;
    bool thread_started;
    pt_relay_stats stats;
    unsigned char buffer[PACKET_MAX];
};

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* The site an IPv4 packet is for, or −1 (IPv6, too short, another network). */
static int destination_site(const pt_relay *r, const unsigned char *packet, size_t length)
{
    if (length < 20 || packet[0] >> 4 != 4) return -1;
    const unsigned char *dst = packet + 16;
    if (dst[0] != 10 || dst[1] != r->subnet_b || dst[2] >= r->sites) return -1;
    return dst[2];
}

static void deliver(pt_relay *r, int to, const unsigned char *packet, size_t length)
{
    if (write(r->tun_fds[to], packet, length) == (ssize_t)length) {
        r->stats.packets++;
        r->stats.bytes += length;
    } else {
        r->stats.dropped++; /* the device is down (EIO) or its queue full */
    }
}

static void hold(pt_relay *r, int from, int to, const unsigned char *packet, size_t length)
{
    held_packet *p = malloc(sizeof *p + length);
    if (!p) {
        r->stats.dropped++;
        return;
    }
    p->next = NULL;
    p->release_ns = now_ns() + r->delay_ns[from * r->sites + to];
    p->length = length;
    memcpy(p->data, packet, length);
    packet_fifo *q = &r->queues[from * r->sites + to];
    if (q->tail) q->tail->next = p;
    else q->head = p;
    q->tail = p;
}

/* Everything site `from` has sent since the last call. */
static void read_site(pt_relay *r, int from)
{
    for (;;) {
        ssize_t n = read(r->tun_fds[from], r->buffer, sizeof r->buffer);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return; /* EAGAIN: drained */
        int to = destination_site(r, r->buffer, (size_t)n);
        if (to < 0 || to == from) r->stats.dropped++;
        else if (r->delay_ns[from * r->sites + to] == 0) deliver(r, to, r->buffer, (size_t)n);
        else hold(r, from, to, r->buffer, (size_t)n);
    }
}

/* Delivers every packet whose time has come; the earliest release still
 * ahead, or INT64_MAX. */
static int64_t release_due(pt_relay *r)
{
    int64_t now = now_ns(), next = INT64_MAX;
    for (int k = 0; k < r->sites * r->sites; k++) {
        packet_fifo *q = &r->queues[k];
        while (q->head && q->head->release_ns <= now) {
            held_packet *p = q->head;
            q->head = p->next;
            if (!q->head) q->tail = NULL;
            deliver(r, k % r->sites, p->data, p->length);
            free(p);
        }
        if (q->head && q->head->release_ns < next) next = q->head->release_ns;
    }
    return next;
}

static void arm_timer(pt_relay *r, int64_t at_ns)
{
    struct itimerspec when = {0};
    if (at_ns != INT64_MAX) {
        when.it_value.tv_sec = at_ns / 1000000000;
        when.it_value.tv_nsec = at_ns % 1000000000;
    }
    timerfd_settime(r->timer_fd, TFD_TIMER_ABSTIME, &when, NULL);
}

static void *relay_main(void *arg)
{
    pt_relay *r = arg;
    for (;;) {
        arm_timer(r, release_due(r));
        struct epoll_event events[EVENTS_MAX];
        int n = epoll_wait(r->epoll_fd, events, EVENTS_MAX, -1);
        for (int e = 0; e < n; e++) {
            int site = (int)events[e].data.u32;
            if (site == -1) return NULL; /* the stop event */
            if (site == -2) {
                uint64_t expirations;
                if (read(r->timer_fd, &expirations, sizeof expirations) < 0) { /* spurious */ }
            } else {
                read_site(r, site);
            }
        }
    }
}

static pipert_result watch_fd(pt_relay *r, int fd, int32_t tag)
{
    struct epoll_event event = {.events = EPOLLIN, .data.u32 = (uint32_t)tag};
    if (epoll_ctl(r->epoll_fd, EPOLL_CTL_ADD, fd, &event) != 0)
        return pt_fail(PIPERT_ERR_IO, "relay: epoll_ctl: %s", strerror(errno));
    return PIPERT_OK;
}

static pipert_result setup(pt_relay *r, const double *latency_s)
{
    for (int k = 0; k < r->sites * r->sites; k++) r->delay_ns[k] = (int64_t)(latency_s[k] * 1e9 + 0.5);
    r->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    r->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    r->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (r->epoll_fd < 0 || r->timer_fd < 0 || r->stop_fd < 0)
        return pt_fail(PIPERT_ERR_IO, "relay: %s", strerror(errno));
    PT_TRY(watch_fd(r, r->stop_fd, -1));
    PT_TRY(watch_fd(r, r->timer_fd, -2));
    for (int i = 0; i < r->sites; i++) PT_TRY(watch_fd(r, r->tun_fds[i], i));
    int rc = pthread_create(&r->thread, NULL, relay_main, r);
    if (rc != 0) return pt_fail(PIPERT_ERR_IO, "relay: cannot start its thread: %s", strerror(rc));
    r->thread_started = true;
    return PIPERT_OK;
}

pipert_result pt_relay_start(int sites, const int *tun_fds, const double *latency_s, int subnet_b,
                             pt_relay **out)
{
    *out = NULL;
    pt_relay *r = calloc(1, sizeof *r);
    size_t pairs = (size_t)sites * (size_t)sites;
    if (r) {
        r->delay_ns = calloc(pairs, sizeof *r->delay_ns);
        r->queues = calloc(pairs, sizeof *r->queues);
    }
    if (!r || !r->delay_ns || !r->queues) {
        pt_relay_stop(r, NULL);
        return pt_fail(PIPERT_ERR_NOMEM, "relay: out of memory");
    }
    r->sites = sites;
    r->subnet_b = subnet_b;
    r->tun_fds = tun_fds;
    r->epoll_fd = r->timer_fd = r->stop_fd = -1;
    pipert_result rc = setup(r, latency_s);
    if (rc != PIPERT_OK) {
        pt_relay_stop(r, NULL);
        return rc;
    }
    *out = r;
    return PIPERT_OK;
}

void pt_relay_stop(pt_relay *r, pt_relay_stats *stats)
{
    if (!r) return;
    if (r->thread_started) {
        uint64_t one = 1;
        if (write(r->stop_fd, &one, sizeof one) < 0) { /* the thread then never wakes: cannot happen */ }
        pthread_join(r->thread, NULL);
    }
    for (int k = 0; r->queues && k < r->sites * r->sites; k++)
        while (r->queues[k].head) {
            held_packet *p = r->queues[k].head;
            r->queues[k].head = p->next;
            free(p);
        }
    if (stats) *stats = r->stats;
    if (r->epoll_fd >= 0) close(r->epoll_fd);
    if (r->timer_fd >= 0) close(r->timer_fd);
    if (r->stop_fd >= 0) close(r->stop_fd);
    free(r->delay_ns);
    free(r->queues);
    free(r);
}
