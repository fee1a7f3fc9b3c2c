/* Log-linear latency histogram; see pcb_hist.h. */
#include "pcb_hist.h"

#include <string.h>

#define SUB (1 << PCB_HIST_SUB_BITS)

void pcb_hist_reset(pcb_hist *h)
{
    memset(h, 0, sizeof(*h));
    h->min = INT64_MAX;
}

int pcb_hist_index(int64_t v)
{
    if (v < SUB)
        return (int)v;
    int e = 63 - __builtin_clzll((unsigned long long)v); /* e >= SUB_BITS */
    int shift = e - PCB_HIST_SUB_BITS;
    /* v >> shift is in [SUB, 2*SUB). */
    return SUB + shift * SUB + (int)((v >> shift) - SUB);
}

int64_t pcb_hist_bucket_high(int index)
{
    if (index < SUB)
        return index;
    int shift = (index - SUB) / SUB;
    int64_t sub = (index - SUB) % SUB + SUB;
    return ((sub + 1) << shift) - 1;
}

bool pcb_hist_record(pcb_hist *h, int64_t v)
{
    if (v < PCB_HIST_MIN_NS || v > PCB_HIST_MAX_NS) {
        h->out_of_range++;
        return false;
    }
    h->counts[pcb_hist_index(v)]++;
    h->total++;
    h->sum += (double)v;
    if (v < h->min)
        h->min = v;
    if (v > h->max)
        h->max = v;
    return true;
}

/* The engine's hot path calls pcb_hist_record above; this one is for the Python side. */
bool pcb_hist_record_n(pcb_hist *h, int64_t v, uint64_t n)
{
    if (v < PCB_HIST_MIN_NS || v > PCB_HIST_MAX_NS) {
        h->out_of_range += n;
        return false;
    }
    h->counts[pcb_hist_index(v)] += n;
    h->total += n;
    h->sum += (double)v * (double)n;
    if (v < h->min)
        h->min = v;
    if (v > h->max)
        h->max = v;
    return true;
}

void pcb_hist_merge(pcb_hist *dst, const pcb_hist *src)
{
    for (int i = 0; i < PCB_HIST_BUCKETS; i++)
        dst->counts[i] += src->counts[i];
    dst->total += src->total;
    dst->out_of_range += src->out_of_range;
    dst->sum += src->sum;
    if (src->total) {
        if (src->min < dst->min)
            dst->min = src->min;
        if (src->max > dst->max)
            dst->max = src->max;
    }
}

void pcb_hist_percentiles(const pcb_hist *h, const double *pcts, int64_t *out, size_t n)
{
    size_t k = 0;
    uint64_t seen = 0;
    if (h->total == 0) {
        for (k = 0; k < n; k++)
            out[k] = 0;
        return;
    }
    for (int i = 0; i < PCB_HIST_BUCKETS && k < n; i++) {
        seen += h->counts[i];
        while (k < n) {
            double need = pcts[k] / 100.0 * (double)h->total;
            if (need < 1.0)
                need = 1.0;
            if ((double)seen < need)
                break;
            int64_t high = pcb_hist_bucket_high(i);
            /* Never report past the exact extremes. */
            out[k] = high > h->max ? h->max : (high < h->min ? h->min : high);
            k++;
        }
    }
    for (; k < n; k++)
        out[k] = h->max;
}
