/* bench_cpu.h - what every benchmark shares: the clocks (examples/clock.h: wall time, this
   process's CPU time), die() for what it cannot go on without, and the CPUs a benchmark pins
   ZeroMQ I/O threads to. POSIX. bench_cpu() is there where the file that includes it defines
   _GNU_SOURCE before its first include (sched_getaffinity, CPU_COUNT); die() where it defines
   BENCH_NAME, the name its messages start with. Static inline: a benchmark takes what it uses
   and no more. */
#ifndef KVPS_BENCH_CPU_H
#define KVPS_BENCH_CPU_H

#include <stdio.h>
#include <stdlib.h>

#include "../examples/clock.h" /* now_s, cpu_s, sleep_ms (relative: mpicc runs without -I.) */

#ifdef BENCH_NAME
/* "BENCH_NAME: what: why" on stderr, exit 1. */
static inline void die(const char *what, const char *why) {
    fprintf(stderr, "%s: %s: %s\n", BENCH_NAME, what, why);
    exit(1);
}
#endif

#ifdef _GNU_SOURCE
#include <sched.h>

/* The (i mod n)-th of the n CPUs this process may run on (i itself if they cannot be read). */
static inline int bench_cpu(int i) {
    cpu_set_t s;
    CPU_ZERO(&s);
    if (sched_getaffinity(0, sizeof s, &s) != 0 || CPU_COUNT(&s) < 1) return i;
    int want = i % CPU_COUNT(&s);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &s) && want-- == 0) return c;
    return i;
}
#endif

#endif
