/* The load engine; see pcb_load.h. */
#define _GNU_SOURCE
#include "pcb_load.h"
#include "pcb_time.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <math.h>
#include <sys/resource.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_EVENTS 512
#define CONNECT_WINDOW 512
#define SCRATCH_SIZE (256 * 1024)
#define CHECK_EVERY_NS 100000000LL /* signal check, stall and deadline: every 100 ms */
#define HEADER 16

enum conn_state { C_IDLE = 0, C_ACTIVE, C_CLOSED, C_CONNECTING, C_PENDING };

#define NO_HEAP UINT32_MAX
#define LATE_NS 1000000LL /* a message sent more than 1 ms after its intended time is late */
#define WRITEV_MESSAGES 32 /* pipelined messages written by one sendmsg */
#define SPIN_NS 150000LL   /* open loop, pinned: poll from this long before a send is due */

/* A connection's messages are numbered from 1 in the order they are issued; they are written
 * and their echoes read in that order.  Message s has its own slot (s % pipeline) for its
 * header and times while it is in flight. */
typedef struct conn {
    int fd;
    uint8_t state;     /* C_IDLE: nothing in flight; C_ACTIVE: some */
    uint8_t want_out;  /* EPOLLOUT registered */
    uint8_t served;    /* has received a byte since it connected (in any phase) */
    uint32_t wpos;     /* bytes of message seq_written + 1 sent */
    uint32_t rpos;     /* bytes of message seq_done + 1's echo received and checked */
    uint32_t heap;     /* index in the phase's schedule heap, or NO_HEAP */
    uint64_t seq;      /* messages issued on this connection */
    uint64_t seq_written; /* of them, sent whole */
    uint64_t seq_done; /* of them, echoed whole and verified */
    int64_t t_next;    /* open loop: the intended send time of its next message, ns */
    uint64_t rng;      /* open loop, Poisson: this connection's generator */
    uint8_t *payload;  /* size bytes: the per-connection pattern (pipeline 1: the message) */
} conn;

struct pcb_load {
    pcb_load_spec spec;
    uint32_t pipeline;  /* spec.pipeline, at least 1 */
    int ep;
    conn *conns;
    uint64_t *per_conn;
    uint8_t *payloads;  /* connections * size */
    uint8_t *headers;   /* pipeline > 1: connections * pipeline * HEADER, message s's in slot s */
    int64_t *t_sent;    /* connections * pipeline: when message s was issued, ns */
    int64_t *t_meant;   /* connections * pipeline: its intended send time (open loop), ns */
    uint32_t *heap;     /* open loop: idle-enough connections ordered by t_next */
    uint32_t heap_len;
    uint8_t *scratch;
    pcb_hist *hist;
    pcb_hist *hist_unc;
    uint32_t live;
    uint64_t phases;    /* phases run: varies the Poisson schedules */
    cpu_set_t old_mask;
    bool pinned;
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void thread_cpu(double *user, double *sys)
{
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) != 0) {
        *user = *sys = 0.0;
        return;
    }
    *user = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6;
    *sys = (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Fills the whole per-connection pattern once, at open. */
static void fill_pattern(uint8_t *p, uint32_t size, uint64_t seed, uint32_t id)
{
    uint64_t st = seed ^ ((uint64_t)id << 32) ^ 0x5bd1e995ULL;
    for (uint32_t i = 0; i < size; i += 8) {
        uint64_t r = splitmix64(&st);
        uint32_t n = size - i < 8 ? size - i : 8;
        memcpy(p + i, &r, n);
    }
}

/* Where message `s` of connection `id` keeps its header: pipeline 1, the message buffer itself
 * (one message in flight, sent from one buffer); else its own slot. */
static uint8_t *header_slot(const pcb_load *L, uint32_t id, uint64_t s)
{
    if (L->pipeline == 1)
        return L->conns[id].payload;
    return L->headers + ((size_t)id * L->pipeline + (size_t)(s % L->pipeline)) * HEADER;
}

/* Writes message s's header into its slot: a hash of (seed, connection, sequence). */
static void stamp_header(const pcb_load *L, uint32_t id, uint64_t s)
{
    uint64_t st = L->spec.seed ^ ((uint64_t)id * 0xD6E8FEB86659FD93ULL) ^ (s << 1);
    uint64_t h[2] = {splitmix64(&st), splitmix64(&st)};
    uint32_t n = L->spec.size < HEADER ? L->spec.size : HEADER;
    memcpy(header_slot(L, id, s), h, n);
}

static size_t slot_index(const pcb_load *L, uint32_t id, uint64_t s)
{
    if (L->pipeline == 1)
        return id; /* no division on ping-pong's path */
    return (size_t)id * L->pipeline + (size_t)(s % L->pipeline);
}

static int set_events(pcb_load *L, uint32_t id, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.u32 = id};
    return epoll_ctl(L->ep, EPOLL_CTL_MOD, L->conns[id].fd, &ev);
}

static void set_message(pcb_phase_result *res, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_message(pcb_phase_result *res, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->message, sizeof(res->message), fmt, ap);
    va_end(ap);
}

static int fail(pcb_phase_result *res, int status)
{
    if (res->status == PCB_OK)
        res->status = status;
    return res->status;
}

static void close_conn(pcb_load *L, conn *c)
{
    if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
    if (c->state != C_CLOSED && c->state != C_PENDING && c->state != C_CONNECTING)
        L->live--;
    c->state = C_CLOSED;
}

/* ---- connect ---------------------------------------------------------------------- */

static int start_connect(pcb_load *L, uint32_t id, int *err)
{
    conn *c = &L->conns[id];
    int fam = L->spec.addr.ss_family;
    int fd = socket(fam, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    if (fam != AF_UNIX) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (L->spec.sourcelen) {
            /* the port is picked at connect, for the whole 4-tuple: a bind with port 0 alone
               would take one from the range of every destination */
            setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
            if (bind(fd, (const struct sockaddr *)&L->spec.source, L->spec.sourcelen) != 0) {
                *err = errno;
                close(fd);
                return -1;
            }
        }
    }
    int r = connect(fd, (const struct sockaddr *)&L->spec.addr, L->spec.addrlen);
    if (r != 0 && errno != EINPROGRESS) {
        *err = errno;
        close(fd);
        return errno == EAGAIN ? 1 : -1; /* UNIX backlog full: retry later */
    }
    c->fd = fd;
    c->state = C_CONNECTING;
    c->served = 0;
    struct epoll_event ev = {.events = EPOLLOUT, .data.u32 = id};
    if (epoll_ctl(L->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
        *err = errno;
        close(fd);
        c->fd = -1;
        c->state = C_PENDING;
        return -1;
    }
    return 0;
}

static const char *addr_text(const pcb_load_spec *s, char *buf, size_t n)
{
    if (s->addr.ss_family == AF_UNIX) {
        snprintf(buf, n, "%s", ((const struct sockaddr_un *)&s->addr)->sun_path);
    } else if (s->addr.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&s->addr;
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
        snprintf(buf, n, "%s:%u", ip, ntohs(a->sin_port));
    } else {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&s->addr;
        char ip[INET6_ADDRSTRLEN];
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
        snprintf(buf, n, "[%s]:%u", ip, ntohs(a->sin6_port));
    }
    return buf;
}

static int connect_all(pcb_load *L, pcb_phase_result *res, pcb_check_fn check, void *arg)
{
    struct epoll_event evs[MAX_EVENTS];
    uint32_t n = L->spec.connections, next = 0, inflight = 0, up = 0;
    int64_t t0 = now_ns();
    /* paced: connect i is due at t0 + i / rate, and the timeout runs from the last one due */
    double rate = L->spec.connect_rate;
    double spread = rate > 0 ? (double)(n - 1) / rate : 0.0;
    int64_t deadline = pcb_ns_after(t0, spread + L->spec.connect_timeout);
    int64_t last_check = t0;
    char where[160];

    while (up < n) {
        int64_t due = t0;
        while (next < n && inflight < CONNECT_WINDOW) {
            if (rate > 0) {
                due = pcb_ns_after(t0, (double)next / rate);
                if (now_ns() < due)
                    break; /* not yet: the wait below ends when it is */
            }
            int err = 0;
            int r = start_connect(L, next, &err);
            if (r == 1)
                break; /* UNIX listen queue full: wait for accepts */
            if (r < 0) {
                res->errors[err == ECONNREFUSED ? PCB_E_CONNECT_REFUSED : PCB_E_CONNECT_OTHER]++;
                set_message(res, "connect to %s: %s (%u of %u connections established)",
                            addr_text(&L->spec, where, sizeof(where)), strerror(err), up, n);
                return fail(res, PCB_FAIL_CONNECT);
            }
            next++;
            inflight++;
        }
        int64_t t = now_ns();
        if (t >= deadline) {
            res->errors[PCB_E_TIMEOUT]++;
            set_message(res, "connect to %s: timed out after %.1f s (%u of %u connections established)",
                        addr_text(&L->spec, where, sizeof(where)), spread + L->spec.connect_timeout, up, n);
            return fail(res, PCB_FAIL_CONNECT);
        }
        if (t - last_check >= CHECK_EVERY_NS) {
            last_check = t;
            if (check && check(arg)) {
                set_message(res, "interrupted while connecting");
                return fail(res, PCB_FAIL_INTERRUPTED);
            }
        }
        int wait_ms = (next < n && inflight < CONNECT_WINDOW) ? 1 : 100;
        if (rate > 0 && next < n && inflight < CONNECT_WINDOW && due > t) {
            int64_t ms = (due - t + 999999) / 1000000; /* rounded up: never early */
            wait_ms = ms > 100 ? 100 : (int)ms;
        }
        int k = epoll_wait(L->ep, evs, MAX_EVENTS, wait_ms);
        if (k < 0) {
            if (errno == EINTR) {
                if (check && check(arg)) {
                    set_message(res, "interrupted while connecting");
                    return fail(res, PCB_FAIL_INTERRUPTED);
                }
                continue;
            }
            set_message(res, "epoll_wait: %s", strerror(errno));
            return fail(res, PCB_FAIL_SYSTEM);
        }
        for (int i = 0; i < k; i++) {
            uint32_t id = evs[i].data.u32;
            conn *c = &L->conns[id];
            if (c->state != C_CONNECTING)
                continue;
            int err = 0;
            socklen_t len = sizeof(err);
            if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
                err = errno;
            if (err != 0) {
                res->errors[err == ECONNREFUSED ? PCB_E_CONNECT_REFUSED : PCB_E_CONNECT_OTHER]++;
                set_message(res, "connect to %s: %s (%u of %u connections established)",
                            addr_text(&L->spec, where, sizeof(where)), strerror(err), up, n);
                return fail(res, PCB_FAIL_CONNECT);
            }
            c->state = C_IDLE;
            L->live++;
            inflight--;
            up++;
            if (set_events(L, id, EPOLLIN) != 0) {
                set_message(res, "epoll_ctl: %s", strerror(errno));
                return fail(res, PCB_FAIL_SYSTEM);
            }
        }
    }
    res->elapsed = (double)(now_ns() - t0) / 1e9;
    res->live = L->live;
    return PCB_OK;
}

/* ---- open / close ----------------------------------------------------------------- */

pcb_load *pcb_load_open(const pcb_load_spec *spec, pcb_phase_result *res, pcb_check_fn check,
                        void *arg)
{
    memset(res, 0, sizeof(*res));
    if (spec->connections < 1 || spec->connections > PCB_LOAD_MAX_CONNECTIONS || spec->size < 1 ||
        spec->size > PCB_LOAD_MAX_SIZE ||
        !(spec->connect_rate == 0 ||
          (spec->connect_rate >= PCB_LOAD_MIN_RATE && spec->connect_rate <= PCB_LOAD_MAX_RATE)) ||
        (uint64_t)spec->connections * spec->size > PCB_LOAD_MAX_PAYLOAD ||
        spec->pipeline > PCB_LOAD_MAX_PIPELINE ||
        (uint64_t)spec->connections * (spec->pipeline ? spec->pipeline : 1) > PCB_LOAD_MAX_INFLIGHT ||
        !(spec->connect_timeout > 0) || spec->cpu < -1 || spec->cpu >= CPU_SETSIZE) {
        errno = EINVAL;
        set_message(res, "invalid load spec (connections %u, size %u, pipeline %u, cpu %d)",
                    spec->connections, spec->size, spec->pipeline, spec->cpu);
        fail(res, PCB_FAIL_SYSTEM);
        return NULL;
    }
    pcb_load *L = calloc(1, sizeof(*L));
    if (!L) {
        set_message(res, "out of memory");
        fail(res, PCB_FAIL_SYSTEM);
        return NULL;
    }
    L->spec = *spec;
    L->pipeline = spec->pipeline ? spec->pipeline : 1;
    L->ep = -1;
    uint32_t n = spec->connections;
    size_t slots = (size_t)n * L->pipeline;
    L->conns = calloc(n, sizeof(conn));
    L->per_conn = calloc(n, sizeof(uint64_t));
    L->payloads = malloc((size_t)n * spec->size);
    L->headers = L->pipeline > 1 ? calloc(slots, HEADER) : NULL;
    L->t_sent = calloc(slots, sizeof(int64_t));
    L->t_meant = calloc(slots, sizeof(int64_t));
    L->heap = calloc(n, sizeof(uint32_t));
    L->scratch = malloc(SCRATCH_SIZE);
    L->hist = malloc(sizeof(pcb_hist));
    L->hist_unc = malloc(sizeof(pcb_hist));
    if (!L->conns || !L->per_conn || !L->payloads || (L->pipeline > 1 && !L->headers) || !L->t_sent ||
        !L->t_meant || !L->heap || !L->scratch || !L->hist || !L->hist_unc) {
        set_message(res, "out of memory for %u connections of %u bytes, %u in flight each", n,
                    spec->size, L->pipeline);
        fail(res, PCB_FAIL_SYSTEM);
        goto error;
    }
    pcb_hist_reset(L->hist);
    pcb_hist_reset(L->hist_unc);
    for (uint32_t i = 0; i < n; i++) {
        L->conns[i].fd = -1;
        L->conns[i].heap = NO_HEAP;
        L->conns[i].state = C_PENDING;
        L->conns[i].payload = L->payloads + (size_t)i * spec->size;
        fill_pattern(L->conns[i].payload, spec->size, spec->seed, i);
    }
    L->ep = epoll_create1(EPOLL_CLOEXEC);
    if (L->ep < 0) {
        set_message(res, "epoll_create1: %s", strerror(errno));
        fail(res, PCB_FAIL_SYSTEM);
        goto error;
    }
    if (spec->cpu >= 0) {
        cpu_set_t want;
        if (sched_getaffinity(0, sizeof(L->old_mask), &L->old_mask) != 0) {
            set_message(res, "sched_getaffinity: %s", strerror(errno));
            fail(res, PCB_FAIL_SYSTEM);
            goto error;
        }
        CPU_ZERO(&want);
        CPU_SET(spec->cpu, &want);
        if (sched_setaffinity(0, sizeof(want), &want) != 0) {
            set_message(res, "cannot pin the load generator to CPU %d: %s", spec->cpu, strerror(errno));
            fail(res, PCB_FAIL_SYSTEM);
            goto error;
        }
        L->pinned = true;
    }
    if (connect_all(L, res, check, arg) != PCB_OK)
        goto error;
    return L;

error:
    pcb_load_close(L);
    return NULL;
}

void pcb_load_close(pcb_load *L)
{
    if (!L)
        return;
    if (L->conns)
        for (uint32_t i = 0; i < L->spec.connections; i++)
            if (L->conns[i].fd >= 0)
                close(L->conns[i].fd);
    if (L->ep >= 0)
        close(L->ep);
    if (L->pinned)
        sched_setaffinity(0, sizeof(L->old_mask), &L->old_mask);
    free(L->conns);
    free(L->per_conn);
    free(L->payloads);
    free(L->headers);
    free(L->t_sent);
    free(L->t_meant);
    free(L->heap);
    free(L->scratch);
    free(L->hist);
    free(L->hist_unc);
    free(L);
}

const pcb_hist *pcb_load_hist(const pcb_load *L) { return L->hist; }
const pcb_hist *pcb_load_hist_uncorrected(const pcb_load *L) { return L->hist_unc; }
const uint64_t *pcb_load_per_conn(const pcb_load *L) { return L->per_conn; }
uint32_t pcb_load_connections(const pcb_load *L) { return L->spec.connections; }

/* ---- one phase -------------------------------------------------------------------- */

typedef struct phase {
    pcb_load *L;
    const pcb_phase_spec *ps;
    pcb_phase_result *res;
    uint64_t issued;    /* messages issued (less those lost with a closed connection) */
    uint64_t inflight;  /* messages issued and not yet echoed, every connection's */
    bool issuing;       /* closed loop: may start new messages */
    bool open;          /* an open-loop phase */
    int64_t t_end;      /* duration mode: the end (open loop: of intended send times) */
    int64_t gap;        /* open loop, uniform: ns between one connection's intended sends */
    double mean_gap;    /* open loop, Poisson: their mean, ns */
    int64_t last_done;  /* ns of the latest completion (or of the start) */
    double lag_sum;     /* ns, actual - intended send, over the messages sent */
} phase;

/* ---- the open loop's schedule: a binary min-heap of connections by t_next, holding those
 * that may send their next message once its time comes (fewer than pipeline in flight). */

static void heap_set(pcb_load *L, uint32_t i, uint32_t id)
{
    L->heap[i] = id;
    L->conns[id].heap = i;
}

static void heap_up(pcb_load *L, uint32_t i)
{
    uint32_t id = L->heap[i];
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (!(L->conns[id].t_next < L->conns[L->heap[p]].t_next))
            break;
        heap_set(L, i, L->heap[p]);
        i = p;
    }
    heap_set(L, i, id);
}

static void heap_down(pcb_load *L, uint32_t i)
{
    uint32_t id = L->heap[i], n = L->heap_len;
    for (;;) {
        uint32_t ch = 2 * i + 1;
        if (ch >= n)
            break;
        if (ch + 1 < n && L->conns[L->heap[ch + 1]].t_next < L->conns[L->heap[ch]].t_next)
            ch++;
        if (!(L->conns[L->heap[ch]].t_next < L->conns[id].t_next))
            break;
        heap_set(L, i, L->heap[ch]);
        i = ch;
    }
    heap_set(L, i, id);
}

static void heap_push(pcb_load *L, uint32_t id)
{
    uint32_t i = L->heap_len++;
    heap_set(L, i, id);
    heap_up(L, i);
}

static void heap_remove(pcb_load *L, uint32_t id)
{
    uint32_t i = L->conns[id].heap;
    if (i == NO_HEAP)
        return;
    L->conns[id].heap = NO_HEAP;
    uint32_t last = L->heap[--L->heap_len];
    if (i == L->heap_len)
        return;
    heap_set(L, i, last);
    heap_up(L, i);
    heap_down(L, L->conns[last].heap);
}

static void heap_clear(pcb_load *L)
{
    for (uint32_t i = 0; i < L->heap_len; i++)
        L->conns[L->heap[i]].heap = NO_HEAP;
    L->heap_len = 0;
}

/* ns until connection c's next intended send after this one. */
static int64_t next_gap(phase *P, conn *c)
{
    if (P->ps->arrival != PCB_ARRIVAL_POISSON)
        return P->gap;
    double u = (double)((splitmix64(&c->rng) >> 11) + 1) * 0x1.0p-53; /* (0, 1] */
    double g = -log(u) * P->mean_gap;
    return g > 1e18 ? (int64_t)1e18 : (int64_t)g;
}

/* Writes what the socket takes of c's issued messages, in order (pipelined ones several to a
 * sendmsg); registers EPOLLOUT while some is left.  Returns 0, or -1 with errno set. */
static int pump_send(phase *P, uint32_t id)
{
    pcb_load *L = P->L;
    conn *c = &L->conns[id];
    uint32_t size = L->spec.size;
    uint32_t hn = size < HEADER ? size : HEADER;
    while (c->seq_written < c->seq) {
        ssize_t n;
        if (L->pipeline == 1 || P->ps->minimal) {
            /* one message in flight: its header is stamped into the buffer it is sent from */
            n = send(c->fd, c->payload + c->wpos, size - c->wpos, MSG_NOSIGNAL);
        } else {
            struct iovec iov[2 * WRITEV_MESSAGES];
            int cnt = 0;
            uint32_t off = c->wpos;
            for (uint64_t s = c->seq_written + 1; s <= c->seq && cnt < 2 * WRITEV_MESSAGES; s++, off = 0) {
                if (off < hn) {
                    iov[cnt].iov_base = header_slot(L, id, s) + off;
                    iov[cnt++].iov_len = hn - off;
                    off = hn;
                }
                if (off < size) {
                    iov[cnt].iov_base = c->payload + off;
                    iov[cnt++].iov_len = size - off;
                }
            }
            struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
            n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        }
        if (n > 0) {
            uint64_t left = (uint64_t)n;
            while (left > 0) {
                uint32_t rest = size - c->wpos;
                if (left < rest) {
                    c->wpos += (uint32_t)left;
                    break;
                }
                left -= rest;
                c->wpos = 0;
                c->seq_written++;
            }
            continue;
        }
        if (n == 0)
            errno = EIO; /* nothing taken of a non-empty write: not a state we can wait out */
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (!c->want_out) {
                c->want_out = 1;
                set_events(L, id, EPOLLIN | EPOLLOUT);
            }
            return 0;
        }
        return -1;
    }
    if (c->want_out) {
        c->want_out = 0;
        set_events(L, id, EPOLLIN);
    }
    return 0;
}

static void conn_error(phase *P, uint32_t id, int kind, const char *what, int err)
{
    pcb_load *L = P->L;
    conn *c = &L->conns[id];
    P->res->errors[kind]++;
    if (P->res->message[0] == '\0') {
        if (err)
            set_message(P->res, "connection %u: %s: %s (message %llu, %u of %u bytes echoed)", id,
                        what, strerror(err), (unsigned long long)c->seq_done + 1, c->rpos, L->spec.size);
        else
            set_message(P->res, "connection %u: %s (message %llu, %u of %u bytes echoed)", id, what,
                        (unsigned long long)c->seq_done + 1, c->rpos, L->spec.size);
    }
    /* its messages in flight will never complete; other connections take them */
    uint64_t lost = c->seq - c->seq_done;
    P->issued = P->issued > lost ? P->issued - lost : 0;
    P->inflight = P->inflight > lost ? P->inflight - lost : 0;
    heap_remove(L, id);
    close_conn(L, c);
}

/* Starts message seq + 1 of connection id, issued at t and meant for `meant` (the same in a
 * closed loop): stamps its header and keeps its times; pump_send writes it. */
static void issue(phase *P, uint32_t id, int64_t t, int64_t meant)
{
    pcb_load *L = P->L;
    conn *c = &L->conns[id];
    uint64_t s = ++c->seq;
    if (!P->ps->minimal)
        stamp_header(L, id, s);
    size_t k = slot_index(L, id, s);
    L->t_sent[k] = t;
    L->t_meant[k] = meant;
    c->state = C_ACTIVE;
    P->issued++;
    P->inflight++;
    if (P->open) {
        int64_t lag = t - meant;
        P->res->sent++;
        P->res->late += lag > LATE_NS;
        P->lag_sum += (double)lag;
        if ((double)lag / 1e9 > P->res->lag_max)
            P->res->lag_max = (double)lag / 1e9;
    }
}

static bool may_issue(const phase *P, const conn *c)
{
    if (!P->issuing)
        return false;
    if (P->ps->messages)
        return P->issued < P->ps->messages;
    return P->open ? c->t_next < P->t_end : true; /* closed loop: issuing stops at t_end */
}

/* Issues what connection id may send at t: closed loop, until pipeline messages are in flight;
 * open loop, also only those whose intended time has come (the rest wait in the schedule).
 * Then writes them.  Returns -1 when the connection was closed (error counted). */
static int refill(phase *P, uint32_t id, int64_t t)
{
    pcb_load *L = P->L;
    conn *c = &L->conns[id];
    bool any = false;
    while (c->seq - c->seq_done < L->pipeline && may_issue(P, c)) {
        if (P->open) {
            if (c->t_next > t)
                break;
            issue(P, id, t, c->t_next);
            c->t_next += next_gap(P, c);
        } else {
            issue(P, id, t, t);
        }
        any = true;
    }
    if (P->open) {
        bool waits = c->seq - c->seq_done < L->pipeline && may_issue(P, c);
        if (!waits)
            heap_remove(L, id);
        else if (c->heap == NO_HEAP)
            heap_push(L, id);
        else if (any) {
            heap_remove(L, id);
            heap_push(L, id);
        }
    }
    if (any && pump_send(P, id) != 0) {
        int err = errno;
        conn_error(P, id, err == ECONNRESET || err == EPIPE ? PCB_E_RESET : PCB_E_IO, "send", err);
        return -1;
    }
    return 0;
}

/* The first differing byte of `got` against message s's expected bytes at [from, from + n). */
static int64_t first_difference(const pcb_load *L, uint32_t id, uint64_t s, uint32_t from,
                                const uint8_t *got, uint32_t n)
{
    uint32_t hn = L->spec.size < HEADER ? L->spec.size : HEADER;
    const uint8_t *hdr = header_slot(L, id, s);
    const uint8_t *body = L->conns[id].payload;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t at = from + i;
        uint8_t want = at < hn ? hdr[at] : body[at];
        if (got[i] != want)
            return at;
    }
    return -1;
}

/* Reads what has arrived on c and checks it against the messages in flight, in order; a
 * completed echo is recorded, and what may be sent then is issued.  Returns -1 only for a
 * payload mismatch (the phase fails). */
static int on_readable(phase *P, uint32_t id)
{
    pcb_load *L = P->L;
    conn *c = &L->conns[id];
    uint32_t size = L->spec.size;
    uint32_t hn = size < HEADER ? size : HEADER;
    bool minimal = P->ps->minimal;
    for (;;) {
        /* bytes sent and not yet echoed: never read more, so an extra byte is caught */
        uint64_t owed = (c->seq_written - c->seq_done) * (uint64_t)size + c->wpos - c->rpos;
        size_t want = owed == 0 || owed > SCRATCH_SIZE ? SCRATCH_SIZE : (size_t)owed;
        ssize_t n = recv(c->fd, L->scratch, want, 0);
        if (n > 0)
            c->served = 1;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            int err = errno;
            conn_error(P, id, err == ECONNRESET ? PCB_E_RESET : PCB_E_IO, "recv", err);
            return 0;
        }
        if (n == 0) {
            conn_error(P, id, PCB_E_EOF, c->state == C_ACTIVE ? "early EOF" : "EOF while idle", 0);
            return 0;
        }
        if ((uint64_t)n > owed) {
            P->res->errors[PCB_E_MISMATCH]++;
            if (c->seq == c->seq_done)
                set_message(P->res, "connection %u: %zd unexpected bytes after message %llu was echoed "
                            "whole (duplicated data?)", id, n, (unsigned long long)c->seq);
            else
                set_message(P->res, "connection %u: %zd bytes arrived where %llu were sent and not yet "
                            "echoed: the echo of message %llu outran its send (duplicated data?)", id, n,
                            (unsigned long long)owed, (unsigned long long)c->seq_done + 1);
            return -1;
        }
        int64_t t = minimal ? 0 : now_ns();
        uint32_t off = 0, done = 0;
        while (off < (uint32_t)n) {
            uint64_t s = c->seq_done + 1;
            uint32_t take = size - c->rpos;
            if (take > (uint32_t)n - off)
                take = (uint32_t)n - off;
            if (!minimal) {
                const uint8_t *got = L->scratch + off;
                const uint8_t *hdr = header_slot(L, id, s);
                uint32_t a = c->rpos, b = c->rpos + take, h = b < hn ? b : hn;
                bool bad;
                if (hdr == c->payload) /* pipeline 1: the message is one buffer */
                    bad = memcmp(got, c->payload + a, take) != 0;
                else
                    bad = (a < h && memcmp(got, hdr + a, h - a) != 0) ||
                          (b > hn && memcmp(got + (a < hn ? hn - a : 0), c->payload + (a < hn ? hn : a),
                                            b - (a < hn ? hn : a)) != 0);
                if (bad) {
                    int64_t at = first_difference(L, id, s, a, got, take);
                    uint8_t want_b = at < hn ? hdr[at] : c->payload[at];
                    P->res->errors[PCB_E_MISMATCH]++;
                    set_message(P->res, "connection %u: payload mismatch in message %llu at byte %lld of "
                                "%u: expected 0x%02x, got 0x%02x", id, (unsigned long long)s,
                                (long long)at, size, want_b, got[at - a]);
                    return -1;
                }
            }
            c->rpos += take;
            off += take;
            P->res->bytes += take;
            if (c->rpos < size)
                break;
            /* a whole, verified round trip */
            c->rpos = 0;
            c->seq_done = s;
            if (!minimal) {
                size_t k = slot_index(L, id, s);
                pcb_hist_record(L->hist, t - (P->open ? L->t_meant[k] : L->t_sent[k]));
                if (P->open)
                    pcb_hist_record(L->hist_unc, t - L->t_sent[k]);
            }
            P->res->completed++;
            L->per_conn[id]++;
            P->last_done = t;
            P->inflight--;
            done++;
        }
        if (!done)
            continue; /* part of an echo: read on */
        if (c->seq == c->seq_done)
            c->state = C_IDLE;
        refill(P, id, minimal ? 0 : t);
        return 0; /* level-triggered: whatever else arrived wakes the next wait */
    }
}

static uint32_t count_waiting(const pcb_load *L)
{
    uint32_t w = 0;
    for (uint32_t i = 0; i < L->spec.connections; i++)
        w += L->conns[i].state == C_ACTIVE;
    return w;
}

/* TCP connections waiting that never received a byte since they connected and whose bytes
 * the server's kernel never acknowledged either: no established socket over there, what an
 * overflowed accept queue leaves (*unserved; UNIX: 0, a full backlog makes connect wait
 * instead), and open connections that received a byte (*served). */
static void count_served(const pcb_load *L, uint32_t *unserved, uint32_t *served)
{
    uint32_t u = 0, s = 0;
    bool tcp = L->spec.addr.ss_family != AF_UNIX;
    for (uint32_t i = 0; i < L->spec.connections; i++) {
        const conn *c = &L->conns[i];
        s += c->state != C_CLOSED && c->served;
        if (!tcp || c->state != C_ACTIVE || c->served)
            continue;
        struct tcp_info ti;
        socklen_t len = sizeof(ti);
        if (getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 && ti.tcpi_unacked > 0)
            u++; /* else its bytes reached the server's socket: not served is the server's doing */
    }
    *unserved = u;
    *served = s;
}

/* Waits for events until `due` (ns; 0: up to 100 ms).  epoll_pwait2 takes a timeout in ns, so
 * an open loop's sends are not rounded to the millisecond (where the kernel lacks it, a wait
 * shorter than 1 ms polls).  A timer wakes a sleeping thread tens of microseconds late on a
 * virtual machine, and every microsecond of it would count in the corrected latency: on a CPU
 * of its own (pinned), the engine sleeps until SPIN_NS before the send is due and polls from
 * there; unpinned, it sleeps until the time itself (polling would take CPU from the server). */
static int wait_events(pcb_load *L, struct epoll_event *evs, int64_t due)
{
    static int have_pwait2 = 1;
    if (due == 0)
        return epoll_wait(L->ep, evs, MAX_EVENTS, 100);
    int64_t wait = (L->pinned ? due - SPIN_NS : due) - now_ns();
    if (wait <= 0 && L->pinned)
        return epoll_wait(L->ep, evs, MAX_EVENTS, 0);
    if (wait < 0)
        wait = 0;
    if (wait > CHECK_EVERY_NS)
        wait = CHECK_EVERY_NS;
    if (__atomic_load_n(&have_pwait2, __ATOMIC_RELAXED)) {
        struct timespec ts = {.tv_sec = wait / 1000000000LL, .tv_nsec = wait % 1000000000LL};
        int k = epoll_pwait2(L->ep, evs, MAX_EVENTS, &ts, NULL);
        if (k >= 0 || errno != ENOSYS)
            return k;
        __atomic_store_n(&have_pwait2, 0, __ATOMIC_RELAXED);
    }
    return epoll_wait(L->ep, evs, MAX_EVENTS, (int)(wait / 1000000LL));
}

int pcb_load_phase(pcb_load *L, const pcb_phase_spec *ps, pcb_phase_result *res, pcb_check_fn check,
                   void *arg)
{
    struct epoll_event evs[MAX_EVENTS];
    double u0, s0, u1, s1;
    char where[160];
    memset(res, 0, sizeof(*res));
    pcb_hist_reset(L->hist);
    pcb_hist_reset(L->hist_unc);
    memset(L->per_conn, 0, sizeof(uint64_t) * L->spec.connections);

    phase P = {.L = L, .ps = ps, .res = res, .issuing = true, .open = ps->rate > 0};
    if (ps->messages > PCB_LOAD_MAX_MESSAGES || (ps->messages == 0 && !(ps->duration > 0)) ||
        !(ps->stall_timeout > 0) || !(ps->deadline > 0) ||
        !(ps->rate == 0 || (ps->rate >= PCB_LOAD_MIN_OPEN_RATE && ps->rate <= PCB_LOAD_MAX_OPEN_RATE)) ||
        (P.open && ps->minimal) ||
        (ps->arrival != PCB_ARRIVAL_UNIFORM && ps->arrival != PCB_ARRIVAL_POISSON)) {
        errno = EINVAL;
        set_message(res, "invalid phase spec (messages %llu, rate %g, arrival %d)",
                    (unsigned long long)ps->messages, ps->rate, ps->arrival);
        return fail(res, PCB_FAIL_SYSTEM);
    }
    if (L->live == 0) {
        set_message(res, "no connection left to %s", addr_text(&L->spec, where, sizeof(where)));
        return fail(res, PCB_FAIL_ERRORS);
    }
    int old_slack = -1;
    if (P.open) {
        /* sends are due at exact times: wake within 1 us of them, not the default 50 us */
        old_slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
        prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    }
    thread_cpu(&u0, &s0);
    int64_t t0 = now_ns();
    P.t_end = ps->messages ? INT64_MAX : pcb_ns_after(t0, ps->duration);
    int64_t t_deadline = pcb_ns_after(t0, ps->deadline);
    int64_t stall_ns = pcb_seconds_ns(ps->stall_timeout);
    int64_t last_check = t0;
    int64_t last_progress = t0;
    uint64_t seen_completed = 0;
    P.last_done = t0;

    if (P.open) {
        /* each idle connection's own schedule at rate / connections, staggered (uniform) or
           from its own generator (Poisson) */
        uint32_t idle = 0;
        for (uint32_t id = 0; id < L->spec.connections; id++)
            idle += L->conns[id].state == C_IDLE;
        P.mean_gap = (double)idle / ps->rate * 1e9;
        P.gap = P.mean_gap < 1.0 ? 1 : (int64_t)P.mean_gap;
        uint32_t rank = 0;
        L->phases++;
        for (uint32_t id = 0; id < L->spec.connections; id++) {
            conn *c = &L->conns[id];
            if (c->state != C_IDLE)
                continue;
            c->rng = L->spec.seed ^ (L->phases * 0x9E3779B97F4A7C15ULL) ^ ((uint64_t)id << 20);
            if (ps->arrival == PCB_ARRIVAL_POISSON)
                c->t_next = t0 + next_gap(&P, c);
            else
                c->t_next = t0 + (int64_t)((double)rank * 1e9 / ps->rate);
            rank++;
            if (may_issue(&P, c))
                heap_push(L, id);
        }
    } else {
        for (uint32_t id = 0; id < L->spec.connections; id++) {
            if (L->conns[id].state != C_IDLE)
                continue;
            if (!may_issue(&P, &L->conns[id]))
                break;
            refill(&P, id, t0);
        }
    }

    for (;;) {
        if (res->status != PCB_OK)
            break;
        uint64_t errs = 0;
        for (int k = 0; k < PCB_E_COUNT; k++)
            errs += res->errors[k];
        if (errs > L->spec.max_errors) {
            fail(res, PCB_FAIL_ERRORS);
            break;
        }
        if (L->live == 0) {
            if (res->message[0] == '\0')
                set_message(res, "every connection was closed");
            fail(res, PCB_FAIL_ERRORS);
            break;
        }
        if (ps->messages && res->completed >= ps->messages)
            break;
        if (!ps->messages && !P.open && P.issuing && now_ns() >= P.t_end)
            P.issuing = false; /* closed loop, duration mode: stop issuing at t_end, then drain */
        if (P.open && ps->messages && P.issued >= ps->messages && L->heap_len)
            heap_clear(L); /* every message is issued: nothing is scheduled any more */
        if (P.inflight == 0 && ps->messages && P.issued < ps->messages &&
            (P.open ? L->heap_len == 0 : P.issuing)) {
            /* messages lost with a closed connection (tolerated errors) and nothing else in
               flight or scheduled: the idle connections take them */
            int64_t tr = now_ns();
            for (uint32_t id = 0; id < L->spec.connections; id++) {
                conn *c = &L->conns[id];
                if (c->state != C_IDLE || !may_issue(&P, c))
                    continue;
                if (P.open) {
                    if (c->heap == NO_HEAP)
                        heap_push(L, id);
                } else {
                    refill(&P, id, tr);
                }
            }
        }
        if (P.inflight == 0 && (P.open ? L->heap_len == 0 : !P.issuing))
            break;

        int64_t due = P.open && L->heap_len ? L->conns[L->heap[0]].t_next : 0;
        int k = wait_events(L, evs, due);
        int64_t t = now_ns();
        if (k < 0) {
            if (errno != EINTR) {
                set_message(res, "epoll_wait: %s", strerror(errno));
                fail(res, PCB_FAIL_SYSTEM);
                break;
            }
            k = 0;
            last_check = 0; /* a signal: check now */
        }
        for (int i = 0; i < k && res->status == PCB_OK; i++) {
            uint32_t id = evs[i].data.u32;
            conn *c = &L->conns[id];
            if (c->state == C_CLOSED)
                continue;
            uint32_t ev = evs[i].events;
            if (ev & (EPOLLERR | EPOLLHUP))
                ev |= EPOLLIN | EPOLLOUT; /* the read or write that follows reports it */
            if ((ev & EPOLLOUT) && c->seq_written < c->seq) {
                if (pump_send(&P, id) != 0) {
                    int err = errno;
                    conn_error(&P, id, err == ECONNRESET || err == EPIPE ? PCB_E_RESET : PCB_E_IO,
                               "send", err);
                    continue;
                }
            }
            if ((ev & EPOLLIN) && c->state != C_CLOSED) {
                if (on_readable(&P, id) != 0)
                    fail(res, PCB_FAIL_MISMATCH);
            }
        }
        if (P.open && res->status == PCB_OK) {
            /* the connections whose next message is due */
            t = now_ns();
            while (L->heap_len && L->conns[L->heap[0]].t_next <= t)
                refill(&P, L->heap[0], t);
        }
        if (res->completed != seen_completed || P.inflight == 0) {
            seen_completed = res->completed;
            last_progress = t; /* nothing waiting is no stall */
        }
        if (t - last_check >= CHECK_EVERY_NS) {
            last_check = t;
            if (check && check(arg)) {
                set_message(res, "interrupted after %llu round trips", (unsigned long long)res->completed);
                fail(res, PCB_FAIL_INTERRUPTED);
                break;
            }
            if (t - last_progress >= stall_ns) {
                res->errors[PCB_E_TIMEOUT]++;
                set_message(res, "stalled: no round trip completed for %.1f s; %u of %u connections "
                            "waiting for an echo (%llu round trips done)", ps->stall_timeout,
                            count_waiting(L), L->live, (unsigned long long)res->completed);
                fail(res, PCB_FAIL_STALL);
                break;
            }
            if (t >= t_deadline) {
                set_message(res, "deadline: phase still running after %.1f s (%llu round trips done, "
                            "%u connections waiting)", ps->deadline,
                            (unsigned long long)res->completed, count_waiting(L));
                fail(res, PCB_FAIL_DEADLINE);
                break;
            }
        }
    }
    thread_cpu(&u1, &s1);
    if (old_slack >= 0)
        prctl(PR_SET_TIMERSLACK, (unsigned long)old_slack, 0, 0, 0);
    heap_clear(L);
    int64_t t_last = ps->minimal ? now_ns() : P.last_done;
    res->elapsed = (double)(t_last - t0) / 1e9;
    res->cpu_user = u1 - u0;
    res->cpu_sys = s1 - s0;
    res->lag_mean = res->sent ? P.lag_sum / (double)res->sent / 1e9 : 0.0;
    res->waiting = count_waiting(L);
    res->live = L->live;
    count_served(L, &res->unserved, &res->served);
    if (res->status == PCB_OK && ps->messages && res->completed < ps->messages) {
        /* cannot happen while the loop above re-issues lost messages; a guard against a phase
           that says ok having done less than asked */
        set_message(res, "only %llu of %llu round trips completed", (unsigned long long)res->completed,
                    (unsigned long long)ps->messages);
        fail(res, PCB_FAIL_ERRORS);
    }
    if (res->status != PCB_OK) {
        /* connections with a message outstanding are now out of step: they cannot be reused
           (their echoes would arrive in the next phase) */
        for (uint32_t id = 0; id < L->spec.connections; id++)
            if (L->conns[id].state == C_ACTIVE)
                close_conn(L, &L->conns[id]);
    }
    return res->status;
}
