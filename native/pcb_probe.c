/* Machine-state probes run beside each measured round (see pcb_probe.h).
 *
 * pcb_cacheline_rtt: the caller (pinned to cpu_a) stores odd values into one 64-byte-aligned
 * counter and waits for the helper thread (pinned to cpu_b) to answer with the next even
 * value.  One round trip = the line moving to cpu_b and back.  Waits are bounded: ~2 s
 * without an answer ends the probe with ETIMEDOUT.
 */
#define _GNU_SOURCE
#include "pcb_probe.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BATCHES 5
#define WARMUP_MAX 10000L         /* untimed round trips before the batches */
#define SPINS_BEFORE_YIELD 1000   /* cross-CPU; on one CPU yield at once */
#define CLOCK_CHECK_MASK 1023     /* read the clock every 1024 spins */
#define WAIT_LIMIT_NS 2000000000LL
#define CHECK_MASK 1023           /* read the clock every 1024 round trips ... */
#define CHECK_EVERY_NS 100000000LL /* ... and call check every 100 ms */

typedef struct probe {
    _Alignas(64) uint64_t counter;  /* the bounced line: caller odd, helper even */
    _Alignas(64) int stop;          /* set by the caller; helper checks every 1024 spins */
    long refs;                      /* caller + helper; the last one out frees */
    int spin_limit;
} probe;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void probe_unref(probe *p)
{
    if (__atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL) == 0)
        free(p);
}

/* Waits until p->counter == want.  Returns 0, or -1 on timeout (caller side: no answer for
 * ~2 s) or stop (helper side: the caller gave up). */
static int wait_for(probe *p, uint64_t want, int is_helper)
{
    unsigned long spins = 0;
    int64_t since = -1;
    while (__atomic_load_n(&p->counter, __ATOMIC_ACQUIRE) != want) {
        spins++;
        if ((spins & CLOCK_CHECK_MASK) == 0) {
            if (is_helper) {
                if (__atomic_load_n(&p->stop, __ATOMIC_RELAXED))
                    return -1;
            } else {
                int64_t t = now_ns();
                if (since < 0)
                    since = t;
                else if (t - since > WAIT_LIMIT_NS)
                    return -1;
            }
        }
        if (spins > (unsigned long)p->spin_limit)
            sched_yield();
        else
            cpu_relax();
    }
    return 0;
}

static void *helper(void *arg)
{
    probe *p = arg;
    for (uint64_t want = 1;; want += 2) {
        if (wait_for(p, want, 1) < 0)
            break;
        __atomic_store_n(&p->counter, want + 1, __ATOMIC_RELEASE);
    }
    probe_unref(p);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Pins the calling thread to one CPU.  Returns 0, or -1 with errno set. */
static int pin_self(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return sched_setaffinity(0, sizeof(set), &set);
}

/* Validation: the CPU must exist (0 <= cpu < configured CPUs, and fit a cpu_set_t).  Whether
 * the process may run on it is decided by the kernel (cgroup cpuset), not by the caller's
 * current mask: a caller already pinned elsewhere can still probe any CPU it is allowed to
 * move to; a forbidden one fails sched_setaffinity / pthread_create with EINVAL. */
static int cpu_valid(int cpu)
{
    long n = sysconf(_SC_NPROCESSORS_CONF);
    return cpu >= 0 && cpu < CPU_SETSIZE && (n <= 0 || cpu < n);
}

/* Every 1024 round trips: when 100 ms passed since the last check, calls `check` (the helper
 * spins meanwhile).  Returns 0 to go on, or -1 to stop; *excluded grows by the time the check
 * took, which the batch then leaves out. */
static int maybe_check(pcb_probe_check_fn check, void *arg, long i, int64_t *last,
                       int64_t *excluded)
{
    if (!check || (i & CHECK_MASK) != CHECK_MASK)
        return 0;
    int64_t t = now_ns();
    if (t - *last < CHECK_EVERY_NS)
        return 0;
    int stop = check(arg);
    *last = now_ns();
    *excluded += *last - t;
    return stop ? -1 : 0;
}

double pcb_cacheline_rtt(int cpu_a, int cpu_b, long iterations, pcb_probe_check_fn check,
                         void *arg)
{
    cpu_set_t saved;
    double means[BATCHES];
    double result = -1.0;
    int err = 0, r;
    pthread_attr_t attr;
    pthread_t th;

    if (!cpu_valid(cpu_a) || !cpu_valid(cpu_b) || iterations <= 0 ||
        iterations > PCB_PROBE_MAX_ITERATIONS) {
        errno = EINVAL;
        return -1.0;
    }
    if (sched_getaffinity(0, sizeof(saved), &saved) < 0)
        return -1.0;

    probe *p = aligned_alloc(64, sizeof(probe));
    if (p == NULL)
        return -1.0;
    memset(p, 0, sizeof(*p));
    p->refs = 2;
    p->spin_limit = cpu_a == cpu_b ? 0 : SPINS_BEFORE_YIELD;

    if (pin_self(cpu_a) < 0) {
        err = errno;
        free(p);
        goto restore;
    }
    if ((r = pthread_attr_init(&attr)) != 0) {
        err = r;
        free(p);
        goto restore;
    }
    cpu_set_t bset;
    CPU_ZERO(&bset);
    CPU_SET(cpu_b, &bset);
    r = pthread_attr_setaffinity_np(&attr, sizeof(bset), &bset);
    if (r == 0) {
        /* The helper blocks all signals: they stay with the caller (Python's main thread). */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        r = pthread_create(&th, &attr, helper, p);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    pthread_attr_destroy(&attr);
    if (r != 0) {
        err = r;
        free(p);
        goto restore;
    }

    uint64_t v = 1;
    int64_t last_check = now_ns(), excluded = 0;
    long warmup = iterations < WARMUP_MAX ? iterations : WARMUP_MAX;
    for (long i = 0; i < warmup; i++, v += 2) {
        __atomic_store_n(&p->counter, v, __ATOMIC_RELEASE);
        if (wait_for(p, v + 1, 0) < 0)
            goto timeout;
        if (maybe_check(check, arg, i, &last_check, &excluded) < 0)
            goto interrupted;
    }
    for (int b = 0; b < BATCHES; b++) {
        excluded = 0;
        int64_t t0 = now_ns();
        for (long i = 0; i < iterations; i++, v += 2) {
            __atomic_store_n(&p->counter, v, __ATOMIC_RELEASE);
            if (wait_for(p, v + 1, 0) < 0)
                goto timeout;
            if (maybe_check(check, arg, i, &last_check, &excluded) < 0)
                goto interrupted;
        }
        means[b] = (double)(now_ns() - t0 - excluded) / (double)iterations;
    }
    qsort(means, BATCHES, sizeof(means[0]), cmp_double);
    result = means[BATCHES / 2];
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELAXED);
    pthread_join(th, NULL);
    probe_unref(p);
    goto restore;

interrupted:
    /* The helper answered the last round trip and spins for the next: it sees stop within
     * 1024 spins, so the join below is prompt. */
    err = EINTR;
    goto stop_helper;

timeout:
    err = ETIMEDOUT;
stop_helper:
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELAXED);
    {
        /* The helper sees stop within 1024 spins once it runs; if it is not scheduled at
         * all, don't hang: detach it and let the last reference free the block. */
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 1;
        if (pthread_timedjoin_np(th, NULL, &dl) != 0)
            pthread_detach(th);
    }
    probe_unref(p);

restore:
    (void)sched_setaffinity(0, sizeof(saved), &saved);
    if (result < 0)
        errno = err;
    return result;
}
