/* Native echo servers: the C baselines every Python model is compared with.
 *
 * Both serve an already bound, listening socket (TCP or UNIX, the caller made it and keeps
 * ownership of it) until `stop_fd` becomes readable (the server process points Python's
 * signal wake-up fd at it, so SIGTERM/SIGINT/parent death stop the server promptly), then
 * return.  Neither prints anything.  Neither closes listen_fd or stop_fd.
 */
#ifndef PCB_ECHO_H
#define PCB_ECHO_H

#include <stddef.h>
#include <stdint.h>

typedef struct pcb_echo_stats {
    uint64_t accepted;  /* connections accepted */
    uint64_t bytes;     /* bytes echoed (written back) */
    uint64_t errors;    /* connections ended by an I/O error other than EOF/ECONNRESET/EPIPE,
                           plus failed accepts (EMFILE...) and failed thread creations, once
                           per 10 ms retry */
} pcb_echo_stats;

/* Both functions zero *stats at entry (NULL is allowed), set listen_fd O_NONBLOCK for the
 * duration of the call and restore its flags on return.  They return -1 with errno set and
 * a message in err also when fcntl, epoll_wait or poll fail (EBADF for a bad fd). */

/* One thread, level-triggered epoll, non-blocking sockets, TCP_NODELAY on TCP.
 * Each connection has a fixed 64 KiB buffer; while echoed bytes are pending the connection
 * is not read (backpressure: the server never buffers more than that per connection).
 * Returns 0 after a clean stop; -1 with errno set and a message in err (errlen bytes)
 * when a setup call (epoll_create1, epoll_ctl on listen_fd/stop_fd) fails. */
int pcb_echo_epoll(int listen_fd, int stop_fd, pcb_echo_stats *stats, char *err, size_t errlen);

/* One detached OS thread per connection, blocking recv/send with a 16 KiB buffer on the
 * thread's stack; stack_size bytes per thread (0 means 64 KiB; raised to at least
 * PTHREAD_STACK_MIN + 16 KiB, rounded to pages) so 10k connections fit.  The calling
 * thread accepts (poll on listen_fd and stop_fd).  Worker threads block all signals so the
 * caller's thread receives them.  On stop, returns while workers may still be running (the
 * process is about to exit): *stats is a snapshot taken at return, and workers still running
 * keep their connections open until the process exits or the clients close.
 * Returns 0 after a clean stop; -1 with errno and err set when setup fails.  A failed
 * pthread_create (EAGAIN) closes that connection and counts it in stats->errors. */
int pcb_echo_threads(int listen_fd, int stop_fd, size_t stack_size, pcb_echo_stats *stats,
                     char *err, size_t errlen);

#endif
