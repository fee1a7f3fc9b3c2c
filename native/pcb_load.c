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

typedef struct conn {
    int fd;
    uint8_t state;
    uint8_t want_out;  /* EPOLLOUT registered */
    uint8_t served;    /* has received a byte since it connected (in any phase) */
    uint32_t wpos;     /* bytes of the current message sent */
    uint32_t rpos;     /* bytes of its echo received and checked */
    uint64_t seq;      /* messages started on this connection */
    int64_t t_send;    /* ns, when the current message's first byte went out */
    uint8_t *payload;  /* size bytes: the current message */
} conn;

struct pcb_load {
    pcb_load_spec spec;
    int ep;
    conn *conns;
    uint64_t *per_conn;
    uint8_t *payloads; /* connections * size */
    uint8_t *scratch;
    pcb_hist *hist;
    uint32_t live;
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

/* Rewrites the message header: a hash of (seed, connection, sequence). */
static void stamp_header(const pcb_load *L, uint32_t id, conn *c)
{
    uint64_t st = L->spec.seed ^ ((uint64_t)id * 0xD6E8FEB86659FD93ULL) ^ (c->seq << 1);
    uint64_t h[2] = {splitmix64(&st), splitmix64(&st)};
    uint32_t n = L->spec.size < HEADER ? L->spec.size : HEADER;
    memcpy(c->payload, h, n);
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
        !(spec->connect_timeout > 0) || spec->cpu < -1 || spec->cpu >= CPU_SETSIZE) {
        errno = EINVAL;
        set_message(res, "invalid load spec (connections %u, size %u, cpu %d)", spec->connections,
                    spec->size, spec->cpu);
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
    L->ep = -1;
    uint32_t n = spec->connections;
    L->conns = calloc(n, sizeof(conn));
    L->per_conn = calloc(n, sizeof(uint64_t));
    L->payloads = malloc((size_t)n * spec->size);
    L->scratch = malloc(SCRATCH_SIZE);
    L->hist = malloc(sizeof(pcb_hist));
    if (!L->conns || !L->per_conn || !L->payloads || !L->scratch || !L->hist) {
        set_message(res, "out of memory for %u connections of %u bytes", n, spec->size);
        fail(res, PCB_FAIL_SYSTEM);
        goto error;
    }
    pcb_hist_reset(L->hist);
    for (uint32_t i = 0; i < n; i++) {
        L->conns[i].fd = -1;
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
    free(L->scratch);
    free(L->hist);
    free(L);
}

const pcb_hist *pcb_load_hist(const pcb_load *L) { return L->hist; }
const uint64_t *pcb_load_per_conn(const pcb_load *L) { return L->per_conn; }
uint32_t pcb_load_connections(const pcb_load *L) { return L->spec.connections; }

/* ---- one phase -------------------------------------------------------------------- */

typedef struct phase {
    pcb_load *L;
    const pcb_phase_spec *ps;
    pcb_phase_result *res;
    uint64_t issued;    /* messages started */
    bool issuing;       /* may start new messages */
    int64_t last_done;  /* ns of the latest completion (or of the start) */
} phase;

/* Sends what it can of c's message; registers EPOLLOUT while some is left.
 * Returns 0, or -1 after closing the connection (error counted). */
static int pump_send(phase *P, uint32_t id)
{
    pcb_load *L = P->L;
    conn *c = &L->conns[id];
    uint32_t size = L->spec.size;
    while (c->wpos < size) {
        ssize_t n = send(c->fd, c->payload + c->wpos, size - c->wpos, MSG_NOSIGNAL);
        if (n > 0) {
            c->wpos += (uint32_t)n;
            continue;
        }
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
    conn *c = &P->L->conns[id];
    P->res->errors[kind]++;
    if (P->res->message[0] == '\0') {
        if (err)
            set_message(P->res, "connection %u: %s: %s (message %llu, %u of %u bytes echoed)", id,
                        what, strerror(err), (unsigned long long)c->seq, c->rpos, P->L->spec.size);
        else
            set_message(P->res, "connection %u: %s (message %llu, %u of %u bytes echoed)", id, what,
                        (unsigned long long)c->seq, c->rpos, P->L->spec.size);
    }
    if (c->state == C_ACTIVE && P->issued > 0)
        P->issued--; /* that message will never complete; another connection takes it */
    close_conn(P->L, c);
}

static int start_message(phase *P, uint32_t id, int64_t t)
{
    conn *c = &P->L->conns[id];
    c->seq++;
    if (!P->ps->minimal)
        stamp_header(P->L, id, c);
    c->wpos = c->rpos = 0;
    c->t_send = t;
    c->state = C_ACTIVE;
    P->issued++;
    if (pump_send(P, id) != 0) {
        int err = errno;
        conn_error(P, id, err == ECONNRESET || err == EPIPE ? PCB_E_RESET : PCB_E_IO, "send", err);
        return -1;
    }
    return 0;
}

static bool may_issue(const phase *P, int64_t t, int64_t t_end)
{
    if (!P->issuing)
        return false;
    if (P->ps->messages)
        return P->issued < P->ps->messages;
    return t < t_end;
}

/* Reads what has arrived on c; on a completed echo, records it and starts the next message.
 * Returns -1 only for a payload mismatch (the phase fails). */
static int on_readable(phase *P, uint32_t id, int64_t t_end)
{
    pcb_load *L = P->L;
    conn *c = &L->conns[id];
    uint32_t size = L->spec.size;
    bool minimal = P->ps->minimal;
    for (;;) {
        size_t want;
        if (c->state == C_ACTIVE)
            want = size - c->rpos;
        else
            want = SCRATCH_SIZE; /* nothing is owed: any byte is an error */
        if (want > SCRATCH_SIZE)
            want = SCRATCH_SIZE;
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
        if (c->state != C_ACTIVE) {
            P->res->errors[PCB_E_MISMATCH]++;
            set_message(P->res, "connection %u: %zd unexpected bytes after message %llu was echoed "
                        "whole (duplicated data?)", id, n, (unsigned long long)c->seq);
            return -1;
        }
        if (!minimal && memcmp(L->scratch, c->payload + c->rpos, (size_t)n) != 0) {
            size_t off = 0;
            while (L->scratch[off] == c->payload[c->rpos + off])
                off++;
            P->res->errors[PCB_E_MISMATCH]++;
            set_message(P->res, "connection %u: payload mismatch in message %llu at byte %zu of %u: "
                        "expected 0x%02x, got 0x%02x", id, (unsigned long long)c->seq,
                        c->rpos + off, size, c->payload[c->rpos + off], L->scratch[off]);
            return -1;
        }
        c->rpos += (uint32_t)n;
        P->res->bytes += (uint64_t)n;
        if (c->rpos < size)
            continue;
        /* a whole, verified round trip */
        int64_t t = minimal ? 0 : now_ns();
        if (!minimal)
            pcb_hist_record(L->hist, t - c->t_send);
        P->res->completed++;
        L->per_conn[id]++;
        P->last_done = t;
        if (c->wpos < size) {
            /* the echo outran our send: only a broken server can do that */
            P->res->errors[PCB_E_MISMATCH]++;
            set_message(P->res, "connection %u: echo of message %llu complete before it was sent whole",
                        id, (unsigned long long)c->seq);
            return -1;
        }
        c->state = C_IDLE;
        if (may_issue(P, t, t_end)) {
            if (start_message(P, id, t) != 0)
                return 0;
        }
        return 0;
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

int pcb_load_phase(pcb_load *L, const pcb_phase_spec *ps, pcb_phase_result *res, pcb_check_fn check,
                   void *arg)
{
    struct epoll_event evs[MAX_EVENTS];
    double u0, s0, u1, s1;
    char where[160];
    memset(res, 0, sizeof(*res));
    pcb_hist_reset(L->hist);
    memset(L->per_conn, 0, sizeof(uint64_t) * L->spec.connections);

    phase P = {.L = L, .ps = ps, .res = res, .issuing = true};
    if (ps->messages > PCB_LOAD_MAX_MESSAGES || (ps->messages == 0 && !(ps->duration > 0)) ||
        !(ps->stall_timeout > 0) || !(ps->deadline > 0)) {
        errno = EINVAL;
        set_message(res, "invalid phase spec (messages %llu)", (unsigned long long)ps->messages);
        return fail(res, PCB_FAIL_SYSTEM);
    }
    if (L->live == 0) {
        set_message(res, "no connection left to %s", addr_text(&L->spec, where, sizeof(where)));
        return fail(res, PCB_FAIL_ERRORS);
    }
    thread_cpu(&u0, &s0);
    int64_t t0 = now_ns();
    int64_t t_end = ps->messages ? INT64_MAX : pcb_ns_after(t0, ps->duration);
    int64_t t_deadline = pcb_ns_after(t0, ps->deadline);
    int64_t stall_ns = pcb_seconds_ns(ps->stall_timeout);
    int64_t last_check = t0;
    int64_t last_progress = t0;
    uint64_t seen_completed = 0;
    P.last_done = t0;

    for (uint32_t id = 0; id < L->spec.connections; id++) {
        if (L->conns[id].state != C_IDLE)
            continue;
        if (!may_issue(&P, t0, t_end))
            break;
        start_message(&P, id, t0);
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
        uint32_t inflight_done = ps->messages ? (res->completed >= ps->messages) : 0;
        if (inflight_done)
            break;
        if (!ps->messages && P.issuing) {
            /* duration mode: stop issuing at t_end, then drain */
            if (now_ns() >= t_end)
                P.issuing = false;
        }
        if (!P.issuing && count_waiting(L) == 0)
            break;

        int k = epoll_wait(L->ep, evs, MAX_EVENTS, 100);
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
            if ((ev & EPOLLOUT) && c->state == C_ACTIVE && c->wpos < L->spec.size) {
                if (pump_send(&P, id) != 0) {
                    int err = errno;
                    conn_error(&P, id, err == ECONNRESET || err == EPIPE ? PCB_E_RESET : PCB_E_IO,
                               "send", err);
                    continue;
                }
            }
            if ((ev & EPOLLIN) && c->state != C_CLOSED) {
                if (on_readable(&P, id, t_end) != 0)
                    fail(res, PCB_FAIL_MISMATCH);
            }
        }
        if (res->completed != seen_completed) {
            seen_completed = res->completed;
            last_progress = t;
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
    int64_t t_last = ps->minimal ? now_ns() : P.last_done;
    res->elapsed = (double)(t_last - t0) / 1e9;
    res->cpu_user = u1 - u0;
    res->cpu_sys = s1 - s0;
    res->waiting = count_waiting(L);
    res->live = L->live;
    count_served(L, &res->unserved, &res->served);
    if (res->status != PCB_OK && res->status != PCB_FAIL_ERRORS) {
        /* connections with a message outstanding are now out of step: they cannot be reused */
        for (uint32_t id = 0; id < L->spec.connections; id++)
            if (L->conns[id].state == C_ACTIVE)
                close_conn(L, &L->conns[id]);
    }
    return res->status;
}
