/* Context-switch microbenchmarks: the native baselines of the context-switch study.
 *
 * Each case times a loop of `n` iterations inside C with CLOCK_MONOTONIC, in a driver thread
 * pinned to spec->cpu_a (threads it creates inherit that CPU; the second party of a two-party
 * hand-off is pinned to spec->cpu_b).  The same number of iterations of an empty loop (the
 * loop's own counter and a compiler barrier, nothing else) is timed just before, so the
 * caller can subtract it.  Nothing is allocated while a loop is timed, and a short untimed
 * warm-up precedes every timed hand-off loop.
 *
 * What one "op" is, per case (res->ops counts them):
 *   call              one call of a non-inlined function (a direct `call`, proven by test)
 *   syscall_getpid    one syscall(SYS_getpid)
 *   setjmp_longjmp    one round trip between two stacks: _longjmp there, _longjmp back
 *   swapcontext       one round trip between two ucontexts: two swapcontext calls
 *   coroutine         one resume of a stackless (switch-based) coroutine until it yields
 *   mutex_uncontended one pthread_mutex_lock + unlock, one thread
 *   mutex_contended   one lock + unlock by either of two threads (cpu_a, cpu_b)
 *   sched_yield       one sched_yield() by any of spec->threads threads, all on cpu_a
 *   usleep0           one usleep(0) by any of spec->threads threads, all on cpu_a
 *   pthread_create_join  one pthread_create + pthread_join of a thread that returns at once
 *   fork_waitpid      one fork + waitpid of a child that _exit(0)s at once
 *   futex_handoff     one hand-off of the turn between two threads (futex wake, futex wait)
 *   pipe_threads      one 1-byte message from one thread to the other over a pipe
 *   pipe_processes    the same between this process and a forked child
 * For futex_handoff and pipe_* n is the number of round trips and ops = 2n hand-offs; for
 * mutex_contended each thread does n/2 (rounded up) of the n lock + unlock pairs.
 *
 * Every run is bounded: when it has not finished within spec->timeout seconds the caller's
 * thread aborts it (sets a flag every loop checks at least every 65536 iterations, wakes
 * futex waiters, writes into the pipes, SIGKILLs a child) and it fails with ETIMEDOUT.
 * Threads are joined and child processes reaped before pcb_micro_run returns.
 */
#ifndef PCB_MICRO_H
#define PCB_MICRO_H

#include <stddef.h>
#include <stdint.h>

/* Largest n accepted (EINVAL above). */
#define PCB_MICRO_MAX_N 4000000000ULL
/* Largest spec->threads accepted. */
#define PCB_MICRO_MAX_THREADS 4096

typedef struct pcb_micro_spec {
    uint64_t n;       /* iterations of the timed loop, 1 .. PCB_MICRO_MAX_N */
    uint32_t threads; /* sched_yield, usleep0: threads sharing the n ops (>= 1); others: 1 */
    int cpu_a;        /* CPU of the driver (and of every thread it creates); -1: not pinned */
    int cpu_b;        /* CPU of the second party of a two-party case; -1: not pinned */
    double timeout;   /* seconds the whole run may take, > 0 */
} pcb_micro_spec;

typedef struct pcb_micro_result {
    uint64_t ops;       /* operations timed (see above) */
    int64_t elapsed_ns; /* the timed loop */
    int64_t empty_ns;   /* the empty loop, same iteration count, same thread */
    uint64_t check;     /* operations counted by the other side (callee, coroutine, peer
                           thread, child, futex waiter): equals ops, or n for a round trip,
                           when every operation really ran */
    int64_t waited_ns;  /* how long the driver thread was runnable but waiting for its CPU
                           during the case (other processes, or this run's own threads on
                           that CPU); -1 when /proc/thread-self/schedstat is unreadable */
} pcb_micro_result;

/* The case names, in a fixed order, NULL-terminated. */
extern const char *const pcb_micro_names[];

/* Index of the case called `name` in pcb_micro_names, or -1. */
int pcb_micro_find(const char *name);

/* Whether case `index` is a two-party case (uses spec->cpu_b), and whether it uses
 * spec->threads.  0 for an unknown index. */
int pcb_micro_two_party(int index);
int pcb_micro_threaded(int index);

/* Called by the waiting caller about every 100 ms; returns nonzero to abort the run (Python's
 * PyErr_CheckSignals under the GIL, in the binding).  May be NULL. */
typedef int (*pcb_micro_check_fn)(void *arg);

/* Runs case `index` once (see the header comment).  Returns 0 with *res filled; or -1 with
 * errno set and err holding "what: why": EINVAL (unknown case, n, threads, a CPU outside
 * this process's affinity mask, timeout), ETIMEDOUT (not finished within spec->timeout),
 * EINTR (check asked to stop), or the errno of the call that failed (pthread_create EAGAIN,
 * fork, pipe, mmap, ...).  Blocks the calling thread for the whole run, waiting in slices of
 * 100 ms; call it without holding any lock the run could need (the binding releases the
 * GIL).  The run's own threads block every signal, so signals reach the caller's thread. */
int pcb_micro_run(int index, const pcb_micro_spec *spec, pcb_micro_result *res,
                  pcb_micro_check_fn check, void *arg, char *err, size_t errlen);

#endif
