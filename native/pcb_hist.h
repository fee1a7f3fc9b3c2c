/* Latency histogram: log-linear buckets, fixed memory, O(1) record.
 *
 * Values are nanoseconds.  Below 2^PCB_HIST_SUB_BITS each value has its own bucket; above,
 * every power of two is split into 2^PCB_HIST_SUB_BITS equal buckets, so a bucket is never
 * wider than 1/128 of its lower bound: the relative error of any reported value is <= 0.79 %.
 * Trackable range: PCB_HIST_MIN_NS (100 ns) .. PCB_HIST_MAX_NS (100 s); values outside it are
 * not recorded (record returns false and the caller counts them).
 */
#ifndef PCB_HIST_H
#define PCB_HIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCB_HIST_SUB_BITS 7
#define PCB_HIST_MIN_NS 100LL
#define PCB_HIST_MAX_NS 100000000000LL /* 100 s */
/* 2^37 > 1e11: exponents 7..36 above the exact range. */
#define PCB_HIST_BUCKETS ((1 << PCB_HIST_SUB_BITS) * (37 - PCB_HIST_SUB_BITS + 1))

typedef struct pcb_hist {
    uint64_t counts[PCB_HIST_BUCKETS];
    uint64_t total;
    uint64_t out_of_range;
    int64_t min, max;
    double sum; /* for the mean */
} pcb_hist;

/* Empties the histogram. */
void pcb_hist_reset(pcb_hist *h);

/* Records one value; returns false (and counts it in out_of_range) when the value is outside
 * [PCB_HIST_MIN_NS, PCB_HIST_MAX_NS]. */
bool pcb_hist_record(pcb_hist *h, int64_t value_ns);

/* Records one value `count` times (count >= 1); the same rule for values out of range. */
bool pcb_hist_record_n(pcb_hist *h, int64_t value_ns, uint64_t count);

/* Adds every count of src into dst. */
void pcb_hist_merge(pcb_hist *dst, const pcb_hist *src);

/* Bucket index of a value in range, and the highest value that bucket holds. */
int pcb_hist_index(int64_t value_ns);
int64_t pcb_hist_bucket_high(int index);

/* Batch percentile query: pcts[i] in [0, 100], ascending; out[i] is the highest value
 * equivalent to the smallest recorded value v such that at least pcts[i] % of the recorded
 * values are <= v (100 gives the exact max).  All zeros when the histogram is empty. */
void pcb_hist_percentiles(const pcb_hist *h, const double *pcts, int64_t *out, size_t n);

#endif
