/* bench_cpu.h - what every benchmark shares: the clocks (examples/clock.h: wall time, this
   process's CPU time), die() for what it cannot go on without, and the CPUs a benchmark pins
   ZeroMQ I/O threads to. POSIX. bench_cpu() is there where the file that includes it defines
   _GNU_SOURCE before its first include (sched_getaffinity, CPU_COUNT); die() where it defines
   BENCH_NAME, the name its messages start with; bench_machine() the CPU a table was measured on.
   Static inline: a benchmark takes what it uses and no more. */
#ifndef KVPS_BENCH_CPU_H
#define KVPS_BENCH_CPU_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../examples/clock.h" /* now_s, cpu_s, sleep_ms (relative: mpicc runs without -I.) */

#ifdef BENCH_NAME
/* "BENCH_NAME: what: why" on stderr, exit 1. */
static inline void die(const char *what, const char *why) {
    fprintf(stderr, "%s: %s: %s\n", BENCH_NAME, what, why);
    exit(1);
}
#endif

/* "# machine: <CPU model> (<vendor>), N CPUs online[, kvps path P]" once per process, for a
   benchmark's header: figures differ by CPU (a compress-store is microcoded on AMD's Zen 4 and
   fast on Intel: issue 32), so every table says where it was measured. isa: kvps_isa_set's
   answer (0 portable, 1 avx2+f16c, 2 avx512), -1 for a bench that runs none of kvps's SIMD. */
static inline void bench_machine(FILE *f, int isa) {
    static int done;
    if (done++) return;
    static const char *const names[] = {"portable", "avx2+f16c", "avx512"};
    char line[512], model[200] = "", vendor[64] = "";
    FILE *c = fopen("/proc/cpuinfo", "r");
    while (c && fgets(line, sizeof line, c) && (!model[0] || !vendor[0])) {
        char *v = strchr(line, ':');
        if (!v) continue;
        for (v++; *v == ' ' || *v == '\t'; v++) {}
        v[strcspn(v, "\n")] = 0;
        if (!model[0] && strncmp(line, "model name", 10) == 0) snprintf(model, sizeof model, "%s", v);
        if (!vendor[0] && strncmp(line, "vendor_id", 9) == 0) snprintf(vendor, sizeof vendor, "%s", v);
    }
    if (c) fclose(c);
    fprintf(f, "# machine: %s (%s), %ld CPUs online%s%s\n", model[0] ? model : "unknown CPU", vendor[0] ? vendor : "?",
            sysconf(_SC_NPROCESSORS_ONLN), isa >= 0 && isa <= 2 ? ", kvps path " : "", isa >= 0 && isa <= 2 ? names[isa] : "");
}

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
