/* Machine-state probes run beside each measured round. */
#ifndef PCB_PROBE_H
#define PCB_PROBE_H

/* Cross-CPU cache-line round trip: the calling thread pinned to cpu_a and a helper thread
 * pinned to cpu_b bounce one cache line (an atomic counter) `iterations` times.  The caller's
 * previous CPU affinity is restored before returning.
 * After an untimed warm-up of min(iterations, 10000) round trips, returns the median over 5
 * batches of the mean ns per round trip, or -1.0 with errno set: EINVAL for a negative or
 * non-existent CPU or iterations <= 0 (a CPU outside the cgroup's cpuset fails in the
 * kernel's affinity call, also EINVAL); ETIMEDOUT when the partner thread does not answer for
 * about 2 s (the call then returns within about 3 s); or a pthread error. */
double pcb_cacheline_rtt(int cpu_a, int cpu_b, long iterations);

#endif
