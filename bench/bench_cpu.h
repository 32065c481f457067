/* bench_cpu.h - the CPUs a benchmark pins ZeroMQ I/O threads to. The file that includes it
   defines _GNU_SOURCE before its first include (sched_getaffinity, CPU_COUNT). */
#ifndef KVPS_BENCH_CPU_H
#define KVPS_BENCH_CPU_H

#include <sched.h>

/* The (i mod n)-th of the n CPUs this process may run on (i itself if they cannot be read). */
static int bench_cpu(int i) {
    cpu_set_t s;
    CPU_ZERO(&s);
    if (sched_getaffinity(0, sizeof s, &s) != 0 || CPU_COUNT(&s) < 1) return i;
    int want = i % CPU_COUNT(&s);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &s) && want-- == 0) return c;
    return i;
}

#endif
