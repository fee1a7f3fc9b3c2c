/* Machine-state probes run beside each measured round. */
#ifndef PCB_PROBE_H
#define PCB_PROBE_H

/* Cross-CPU cache-line round trip: the calling thread pinned to cpu_a and a helper thread
 * pinned to cpu_b bounce one cache line (an atomic counter) `iterations` times.  The caller's
 * previous CPU affinity is restored before returning.
 * Returns the median over 5 batches of the mean ns per round trip, or -1.0 with errno set
 * (EINVAL for a CPU not in the process's allowed set, or a pthread/affinity error). */
double pcb_cacheline_rtt(int cpu_a, int cpu_b, long iterations);

#endif
