/* Machine-state probes run beside each measured round. */
#ifndef PCB_PROBE_H
#define PCB_PROBE_H

/* Largest `iterations` accepted (EINVAL above): at ~5 us a round trip on one CPU, the probe
 * then takes about 5 minutes, every 100 ms of which can be interrupted. */
#define PCB_PROBE_MAX_ITERATIONS 10000000L

/* Called by the probing thread about every 100 ms; returns nonzero to stop the probe (Python's
 * PyErr_CheckSignals under the GIL, in the binding).  May be NULL. */
typedef int (*pcb_probe_check_fn)(void *arg);

/* Cross-CPU cache-line round trip: the calling thread pinned to cpu_a and a helper thread
 * pinned to cpu_b bounce one cache line (an atomic counter) `iterations` times.  The caller's
 * previous CPU affinity is restored before returning.
 * After an untimed warm-up of min(iterations, 10000) round trips, returns the median over 5
 * batches of the mean ns per round trip, or -1.0 with errno set: EINVAL for a negative or
 * non-existent CPU or iterations outside 1 .. PCB_PROBE_MAX_ITERATIONS (a CPU outside the
 * cgroup's cpuset fails in the kernel's affinity call, also EINVAL); EINTR when `check` asked
 * to stop; ETIMEDOUT when the partner thread does not answer for about 2 s (the call then
 * returns within about 3 s); or a pthread error.  The time spent in `check` is not counted in
 * any batch. */
double pcb_cacheline_rtt(int cpu_a, int cpu_b, long iterations, pcb_probe_check_fn check,
                         void *arg);

#endif
