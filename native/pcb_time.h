/* Seconds given by a caller, as nanosecond deadlines that cannot overflow.
 *
 * A timeout arrives as a double (any finite or infinite value the binding let through); the
 * engine keeps CLOCK_MONOTONIC nanoseconds in int64_t.  Converting a huge double to int64_t is
 * undefined behaviour, and so is an int64_t addition that overflows: every such conversion goes
 * through these two functions, which clamp instead.
 */
#ifndef PCB_TIME_H
#define PCB_TIME_H

#include <stdint.h>

/* The longest wait the engine keeps apart from "forever": about 31 years.  Longer ones, and
 * infinity, are clamped to it. */
#define PCB_MAX_SECONDS 1e9

/* Returns `seconds` in nanoseconds, clamped to 0 .. PCB_MAX_SECONDS (NaN and negatives give 0). */
static inline int64_t pcb_seconds_ns(double seconds)
{
    if (!(seconds > 0))
        return 0;
    if (seconds > PCB_MAX_SECONDS)
        seconds = PCB_MAX_SECONDS;
    return (int64_t)(seconds * 1e9);
}

/* Returns t + seconds in nanoseconds (t >= 0, a CLOCK_MONOTONIC reading), saturating at
 * INT64_MAX. */
static inline int64_t pcb_ns_after(int64_t t, double seconds)
{
    int64_t d = pcb_seconds_ns(seconds);
    return t > INT64_MAX - d ? INT64_MAX : t + d;
}

#endif
