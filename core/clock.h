// The monotonic clock, for durations and rates (the op profile, the progress line, the verbs' timings).
#pragma once

// Seconds on CLOCK_MONOTONIC: only differences mean anything.
double now_s(void);
