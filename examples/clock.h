/* clock.h - the monotonic clock and a sleep, for the examples (through launch.h) and the
   benchmarks (through bench/bench_cpu.h); POSIX, nothing else. Static inline: a program takes
   what it uses. */
#ifndef KVPS_EXAMPLES_CLOCK_H
#define KVPS_EXAMPLES_CLOCK_H

#include <errno.h>
#include <time.h>

/* Seconds on the monotonic clock. */
static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Sleeps ms milliseconds in all, signals or not. */
static inline void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

#endif
