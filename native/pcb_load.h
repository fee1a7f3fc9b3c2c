/* The load engine: one thread, epoll, many non-blocking connections to one echo server.
 *
 * A load is opened once (all connections established, the thread pinned), then runs any
 * number of phases (warm-up, measured rounds) on the same connections, then is closed.  In a
 * closed-loop phase each connection keeps `pipeline` messages in flight (1: ping-pong): it
 * sends, reads the echoes in order, checks each byte for byte against what it sent, records
 * its round trip's latency, and sends the next.
 *
 * In an open-loop phase (rate > 0) every message has an intended send time: each connection
 * follows its own schedule at rate / connections (uniform and staggered, or Poisson; the
 * connections' Poisson schedules add up to one Poisson process at `rate`).  A message is sent at
 * its intended time, or, when the connection already has `pipeline` messages in flight, as soon
 * as one of them is echoed: it queued, and its wait counts.  Latency is recorded twice: from
 * the intended time (corrected for coordinated omission: the histogram) and from the actual
 * send (uncorrected).  Nothing is allocated while a phase runs.
 *
 * Payloads differ per connection and per message: the first min(16, size) bytes of every
 * message are a hash of (seed, connection id, sequence number), the rest a per-connection
 * pseudo-random pattern.  So crossed, dropped, duplicated, reordered or corrupted bytes are
 * caught as a payload mismatch, which fails the phase at once.
 */
#ifndef PCB_LOAD_H
#define PCB_LOAD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "pcb_hist.h"

/* Error kinds, counted per phase (and during connect). */
enum pcb_err_kind {
    PCB_E_CONNECT_REFUSED = 0,
    PCB_E_CONNECT_OTHER,
    PCB_E_RESET,
    PCB_E_EOF,
    PCB_E_TIMEOUT,
    PCB_E_MISMATCH,
    PCB_E_IO,
    PCB_E_COUNT
};

/* Why a phase (or connect) ended. */
enum pcb_status {
    PCB_OK = 0,
    PCB_FAIL_CONNECT,     /* a connection could not be established (or timed out) */
    PCB_FAIL_MISMATCH,    /* echoed bytes differ from the bytes sent */
    PCB_FAIL_STALL,       /* no round trip completed for stall_timeout seconds */
    PCB_FAIL_DEADLINE,    /* the phase's hard deadline passed */
    PCB_FAIL_ERRORS,      /* more connection errors than max_errors, or none left */
    PCB_FAIL_INTERRUPTED, /* the signal check asked to stop (Ctrl-C, pytest-timeout) */
    PCB_FAIL_SYSTEM,      /* epoll/clock/affinity failure; message says which */
};

/* Limits of a load (pcb_load_open refuses anything beyond them with EINVAL; the binding checks
 * them first and names the argument). */
#define PCB_LOAD_MAX_CONNECTIONS (1u << 20)
#define PCB_LOAD_MAX_SIZE (1u << 20)                  /* bytes per message */
#define PCB_LOAD_MAX_PAYLOAD (2ULL << 30)             /* connections x size: message buffers */
#define PCB_LOAD_MAX_MESSAGES ((1ULL << 63) - 1)      /* round trips in one phase */
#define PCB_LOAD_MIN_RATE 0.1                         /* paced connects per second, when paced */
#define PCB_LOAD_MAX_RATE 1e7
#define PCB_LOAD_MAX_PIPELINE 1024                    /* messages in flight per connection */
#define PCB_LOAD_MAX_INFLIGHT (1u << 22)              /* connections x pipeline: per-message slots */
#define PCB_LOAD_MIN_OPEN_RATE 1.0                    /* open loop: round trips per second, all */
#define PCB_LOAD_MAX_OPEN_RATE 1e8                    /* connections together */

/* Arrival processes of an open-loop phase. */
enum pcb_arrival { PCB_ARRIVAL_UNIFORM = 0, PCB_ARRIVAL_POISSON = 1 };

typedef struct pcb_load_spec {
    struct sockaddr_storage addr; /* AF_INET, AF_INET6 or AF_UNIX; the caller checked it is loopback */
    socklen_t addrlen;
    uint32_t connections;         /* 1 .. PCB_LOAD_MAX_CONNECTIONS */
    uint32_t size;                /* message size, 1 .. PCB_LOAD_MAX_SIZE; connections x size at
                                     most PCB_LOAD_MAX_PAYLOAD */
    double connect_timeout;       /* seconds for all connections, > 0 (clamped: pcb_time.h);
                                     with connect_rate, counted from when the last connect is
                                     due ((connections - 1) / connect_rate after the first) */
    double connect_rate;          /* connects started per second: 0 (as fast as the window of
                                     512 in flight allows) or PCB_LOAD_MIN_RATE .. PCB_LOAD_MAX_RATE */
    int cpu;                      /* pin the calling thread there (< CPU_SETSIZE); -1: leave as is */
    uint32_t max_errors;          /* connection errors tolerated per phase before failing */
    uint64_t seed;
    struct sockaddr_storage source; /* TCP: the local address each connection binds (its port
                                     chosen at connect: IP_BIND_ADDRESS_NO_PORT); family 0: none,
                                     the kernel's choice.  Each source address has its own range of
                                     local ports towards the server, so several let one server port
                                     take more connections than one range holds */
    socklen_t sourcelen;
    uint32_t pipeline;            /* messages in flight per connection, 1 .. PCB_LOAD_MAX_PIPELINE
                                     (0 counts as 1); connections x pipeline at most
                                     PCB_LOAD_MAX_INFLIGHT */
} pcb_load_spec;

typedef struct pcb_phase_spec {
    uint64_t messages;    /* round trips to complete (<= PCB_LOAD_MAX_MESSAGES); 0: run for
                             `duration` seconds */
    double duration;      /* seconds; this and the two below are clamped (pcb_time.h) */
    double stall_timeout; /* seconds without any completed round trip */
    double deadline;      /* hard limit on the phase, seconds */
    int minimal;          /* 1: the ceiling client: no clock per message, no payload check,
                             no histogram; only counts (closed loop only) */
    double rate;          /* 0: closed loop; else open loop at this many round trips per second
                             in all (PCB_LOAD_MIN_OPEN_RATE .. PCB_LOAD_MAX_OPEN_RATE) */
    int arrival;          /* enum pcb_arrival, open loop */
} pcb_phase_spec;

typedef struct pcb_phase_result {
    int status;                     /* enum pcb_status */
    char message[320];              /* why, when status != PCB_OK */
    uint64_t completed;             /* verified round trips */
    double elapsed;                 /* seconds, phase start to its last completion (connect: to the last connection up) */
    double cpu_user, cpu_sys;       /* the engine thread's CPU seconds in the phase */
    uint64_t errors[PCB_E_COUNT];
    uint32_t waiting;               /* at the end: connections with a message outstanding */
    uint32_t live;                  /* connections open at the end */
    uint32_t unserved;              /* at the end: of `waiting`, the TCP connections that never
                                       received a byte since they connected and whose bytes the
                                       server's kernel never acknowledged (an overflowed accept
                                       queue); 0 over UNIX sockets */
    uint32_t served;                /* at the end: open connections that have received a byte
                                       since they connected (in any phase) */
    uint64_t bytes;                 /* payload bytes received and verified */
    /* open loop: how late messages went out against their intended times (the engine's own
       lateness, and the queueing behind messages in flight); 0 in a closed loop */
    uint64_t sent;                  /* messages sent */
    uint64_t late;                  /* of them, sent more than 1 ms after their intended time */
    double lag_mean, lag_max;       /* seconds: actual send - intended send */
} pcb_phase_result;

/* Called about every 100 ms and on EINTR; returns nonzero to stop the run (Python's
 * PyErr_CheckSignals under the GIL, in the binding). */
typedef int (*pcb_check_fn)(void *arg);

typedef struct pcb_load pcb_load;

/* Validates spec, pins the thread, allocates everything, and establishes every connection
 * (at most 512 connects in flight) before returning.  Returns the load, with res->elapsed the
 * connect time; or NULL with res->status/message set (errno ENOMEM, EINVAL, or the connect
 * error) and every socket closed. */
pcb_load *pcb_load_open(const pcb_load_spec *spec, pcb_phase_result *res, pcb_check_fn check,
                        void *arg);

/* Runs one phase; the histogram and per-connection counts are reset at its start.  Must be
 * called from the thread that opened the load.  Returns res->status. */
int pcb_load_phase(pcb_load *load, const pcb_phase_spec *ps, pcb_phase_result *res,
                   pcb_check_fn check, void *arg);

/* The last phase's latency histogram (open loop: from each message's intended send time),
 * its uncorrected one (open loop: from the actual send; empty after a closed-loop phase, where
 * the two are the same), and per-connection completed counts (connections entries). */
const pcb_hist *pcb_load_hist(const pcb_load *load);
const pcb_hist *pcb_load_hist_uncorrected(const pcb_load *load);
const uint64_t *pcb_load_per_conn(const pcb_load *load);
uint32_t pcb_load_connections(const pcb_load *load);

/* Closes every socket, restores the thread's CPU affinity, frees the load.  NULL is a no-op. */
void pcb_load_close(pcb_load *load);

#endif
