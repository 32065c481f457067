/* clock.h - the monotonic clock, this process's CPU time and a sleep, for the examples (through
   launch.h) and the benchmarks (through bench/bench_cpu.h); POSIX, nothing else. Static inline:
   a program takes what it uses. */
#ifndef KVPS_EXAMPLES_CLOCK_H
#define KVPS_EXAMPLES_CLOCK_H

#include <errno.h>
#include <sys/resource.h>
#include <time.h>

/* Seconds on the monotonic clock. */
static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU seconds of this process, every thread (ZeroMQ's I/O threads, MPI's progress), user + system. */
static inline double cpu_s(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

/* Sleeps ms milliseconds in all, signals or not. */
static inline void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

#endif
