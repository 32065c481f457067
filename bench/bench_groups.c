/* bench_groups - what a sub-ring costs, and allgatherv with uneven counts next to OpenMPI's
   MPI_Allgatherv measured in the same run.

   usage: bench_groups [--sizes B,B,...] [--iters N] [--repeat R] [--no-mpi]

   4 rank processes on one machine (fork; each makes its ZeroMQ context after the fork) on
   tcp://127.0.0.1 ephemeral ports, endpoints exchanged through pipes (bench_pipe.h).
   1. all-reduce (float32 sum, out of place) of each size on 2 ranks, two ways, both pairs at
      once: "sub": a 4-rank ring split into {0,1} and {2,3} (kvps_ring_split), each pair on its
      sub-ring; "direct": two 2-rank rings made directly, {0,1} and {2,3}. Per repeat and way:
      a warm-up call checked exactly (small integers), then --iters timed calls after a barrier;
      the time is the per-call mean of the slower pair's rank 0. The ways alternate repeat by
      repeat (shared-machine drift hits both); printed: each repeat, the range, and sub /
      direct per repeat.
   2. allgatherv (float32) on 4 ranks with uneven blocks: rank i holds (i + 1) / 10 of the total
      (10%, 20%, 30%, 40%), totals from --sizes; the same for kvps and for OpenMPI
      (bench/mpi_allgatherv.c through mpirun, TCP on loopback: pml ob1, btl tcp,self, lo), each
      repeat kvps then MPI, results checked, ranges and ratios printed. */
#define _GNU_SOURCE
#define BENCH_NAME "bench_groups"
#define KVPS_IMPLEMENTATION
#include "kvps_ring.h"
#include "bench/bench_cpu.h"
#include "bench/bench_pipe.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

enum { N = 4, MAXS = 16, MAXR = 16 };
static size_t g_sizes[MAXS] = {4096, 1 << 20, 16 << 20};
static int g_nsizes = 3, g_iters = 0, g_repeat = 5, g_mpi = 1;

static int iters_for(size_t bytes) { return g_iters ? g_iters : bytes <= 65536 ? 400 : bytes <= (2 << 20) ? 40 : 8; }

static void check(kvps_result rc, const char *what, kvps_ring *r) {
    if (rc == KVPS_OK) return;
    fprintf(stderr, "bench_groups: %s: %s [%s]\n", what, kvps_result_str(rc), r ? kvps_ring_last_error(r) : "");
    exit(1);
}

/* A ring of `size` ranks among processes: bind, endpoint up the pipe, peer list down. */
static kvps_ring *make_ring(int rank, int size, int up, int down) {
    kvps_ring *r = NULL;
    check(kvps_ring_create(&(kvps_ring_desc){.rank = rank, .size = size, .bind = "tcp://127.0.0.1:*", .timeout_ms = 60000}, &r),
          "create", NULL);
    if (write_str(up, kvps_ring_endpoint(r)) != 0) exit(1);
    char *peers = read_str(down);
    if (!peers) exit(1);
    check(kvps_ring_connect(r, peers), "connect", r);
    free(peers);
    return r;
}

/* Timed all-reduces on r; returns the per-call seconds (rank 0 of r, after a barrier). */
static double time_allreduce(kvps_ring *r, float *a, float *b, size_t n, int iters) {
    for (size_t i = 0; i < n; i++) a[i] = (float)(kvps_ring_rank(r) + 1);
    check(kvps_ring_allreduce(r, a, b, n, KVPS_FLOAT32, KVPS_SUM), "warm-up", r);
    float want = (float)(kvps_ring_size(r) * (kvps_ring_size(r) + 1) / 2);
    for (size_t i = 0; i < n; i++)
        if (b[i] != want) { fprintf(stderr, "bench_groups: wrong sum %g at %zu (want %g)\n", b[i], i, want); exit(1); }
    check(kvps_ring_barrier(r), "barrier", r);
    double t0 = now_s();
    for (int i = 0; i < iters; i++) check(kvps_ring_allreduce(r, a, b, n, KVPS_FLOAT32, KVPS_SUM), "allreduce", r);
    return (now_s() - t0) / iters;
}

static void allgatherv_counts(size_t total, size_t *c) {
    size_t used = 0;
    for (int i = 0; i < N; i++) { c[i] = i == N - 1 ? total - used : total * (size_t)(i + 1) / 10; used += c[i]; }
}

/* One rank: the 4-rank ring and its sub-ring, a direct 2-rank ring; each measurement's time
   goes up the pipe as a double (rank 0 and 2 report the all-reduces, rank 0 the allgatherv). */
static void rank_main(int rank, int up4, int down4, int up2, int down2, int out) {
    kvps_ring *r4 = make_ring(rank, N, up4, down4), *sub = NULL;
    kvps_ring *r2 = make_ring(rank % 2, 2, up2, down2); /* {0,1} and {2,3} */
    check(kvps_ring_split(r4, rank / 2, rank, &sub), "split", r4);
    size_t maxb = 0;
    for (int s = 0; s < g_nsizes; s++) if (g_sizes[s] > maxb) maxb = g_sizes[s];
    float *a = (float *)malloc(maxb), *b = (float *)malloc(maxb);
    memset(a, 0, maxb); memset(b, 0, maxb);
    for (int rep = 0; rep < g_repeat; rep++)
        for (int s = 0; s < g_nsizes; s++)
            for (int w = 0; w < 2; w++) {
                int way = (rep + w) % 2; /* alternate which goes first */
                kvps_ring *r = way == 0 ? sub : r2;
                check(kvps_ring_barrier(r4), "barrier 4", r4);
                double t = time_allreduce(r, a, b, g_sizes[s] / 4, iters_for(g_sizes[s]));
                double all[N];
                check(kvps_ring_allgather(r4, &t, all, 1, KVPS_FLOAT64), "gather times", r4);
                double worst = all[0] > all[2] ? all[0] : all[2];
                if (rank == 0) {
                    double rec[4] = {(double)rep, (double)s, (double)way, worst};
                    if (write(out, rec, sizeof rec) != (ssize_t)sizeof rec) exit(1);
                }
            }
    for (int rep = 0; rep < g_repeat; rep++)
        for (int s = 0; s < g_nsizes; s++) {
            size_t c[N], total = g_sizes[s] / 4;
            allgatherv_counts(total, c);
            size_t off = 0;
            for (int i = 0; i < rank; i++) off += c[i];
            for (size_t i = 0; i < c[rank]; i++) a[i] = (float)(off + i);
            check(kvps_ring_allgatherv(r4, a, b, c, NULL, KVPS_FLOAT32), "allgatherv warm-up", r4);
            for (size_t i = 0; i < total; i++)
                if (b[i] != (float)i) { fprintf(stderr, "bench_groups: allgatherv wrong at %zu\n", i); exit(1); }
            int iters = iters_for(g_sizes[s]);
            check(kvps_ring_barrier(r4), "barrier", r4);
            double t0 = now_s();
            for (int i = 0; i < iters; i++) check(kvps_ring_allgatherv(r4, a, b, c, NULL, KVPS_FLOAT32), "allgatherv", r4);
            double t = (now_s() - t0) / iters, all[N];
            check(kvps_ring_allgather(r4, &t, all, 1, KVPS_FLOAT64), "gather times", r4);
            double sum = 0;
            for (int i = 0; i < N; i++) sum += all[i];
            if (rank == 0) {
                double rec[4] = {(double)rep, (double)s, 2, sum / N};
                if (write(out, rec, sizeof rec) != (ssize_t)sizeof rec) exit(1);
            }
        }
    free(a); free(b);
    kvps_ring_destroy(&sub);
    kvps_ring_destroy(&r2);
    kvps_ring_destroy(&r4);
    exit(0);
}

/* The endpoints of n ranks read from ups, the list written to downs. */
static void exchange(int n, const int *ups, const int *downs) {
    char list[4096] = "";
    for (int i = 0; i < n; i++) {
        char *ep = read_str(ups[i]);
        if (!ep) die("a rank did not send its endpoint", "");
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? "," : "", ep);
        free(ep);
    }
    for (int i = 0; i < n; i++) if (write_str(downs[i], list) != 0) die("pipe", "");
}

static double mpi_t[MAXR][MAXS];
static int mpi_ok;

/* OpenMPI's MPI_Allgatherv, same counts: one line "bytes per_call_s" per size. */
static void run_mpi(int rep) {
    char prog[512], cmd[2048], sizes[512] = "";
    snprintf(prog, sizeof prog, "%s", "build/mpi_allgatherv");
    if (access(prog, X_OK) != 0) { mpi_ok = 0; return; }
    for (int s = 0; s < g_nsizes; s++)
        snprintf(sizes + strlen(sizes), sizeof sizes - strlen(sizes), "%s%zu:%d", s ? "," : "", g_sizes[s], iters_for(g_sizes[s]));
    snprintf(cmd, sizeof cmd, "mpirun --allow-run-as-root --oversubscribe -np %d --bind-to none --mca pml ob1 --mca btl tcp,self "
             "--mca btl_tcp_if_include lo %s %s 2>/dev/null", N, prog, sizes);
    FILE *p = popen(cmd, "r");
    if (!p) { mpi_ok = 0; return; }
    int got = 0;
    size_t bytes;
    double t;
    while (fscanf(p, "%zu %lf", &bytes, &t) == 2)
        for (int s = 0; s < g_nsizes; s++) if (g_sizes[s] == bytes) { mpi_t[rep][s] = t; got++; }
    mpi_ok = pclose(p) == 0 && got == g_nsizes;
}

static void range(const double *v, int n, double *lo, double *hi) {
    *lo = *hi = v[0];
    for (int i = 1; i < n; i++) { if (v[i] < *lo) *lo = v[i]; if (v[i] > *hi) *hi = v[i]; }
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
            g_nsizes = 0;
            for (char *t = strtok(argv[++i], ","); t && g_nsizes < MAXS; t = strtok(NULL, ",")) g_sizes[g_nsizes++] = strtoull(t, NULL, 10);
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) g_iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) g_repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-mpi")) g_mpi = 0;
        else { fprintf(stderr, "usage: bench_groups [--sizes B,B,...] [--iters N] [--repeat R] [--no-mpi]\n"); return 2; }
    }
    if (g_repeat < 3) g_repeat = 3;
    if (g_repeat > MAXR) g_repeat = MAXR;
    signal(SIGPIPE, SIG_IGN);
    kvps_log_set_level(KVPS_LOG_ERROR);
    int up4[N][2], down4[N][2], up2[N][2], down2[N][2], res[2];
    if (pipe(res) != 0) die("pipe", "");
    pid_t pid[N];
    for (int r = 0; r < N; r++) {
        if (pipe(up4[r]) || pipe(down4[r]) || pipe(up2[r]) || pipe(down2[r])) die("pipe", "");
    }
    fflush(stdout);
    for (int r = 0; r < N; r++)
        if ((pid[r] = fork()) == 0) rank_main(r, up4[r][1], down4[r][0], up2[r][1], down2[r][0], res[1]);
    close(res[1]);
    int u4[N], d4[N], u2a[2], d2a[2], u2b[2], d2b[2];
    for (int r = 0; r < N; r++) { u4[r] = up4[r][0]; d4[r] = down4[r][1]; }
    exchange(N, u4, d4);
    for (int r = 0; r < 2; r++) { u2a[r] = up2[r][0]; d2a[r] = down2[r][1]; u2b[r] = up2[2 + r][0]; d2b[r] = down2[2 + r][1]; }
    exchange(2, u2a, d2a);
    exchange(2, u2b, d2b);
    double ar[MAXR][MAXS][2], agv[MAXR][MAXS];
    int nrec = g_repeat * g_nsizes * 3;
    for (int i = 0; i < nrec; i++) {
        double rec[4];
        if (read_full(res[0], rec, sizeof rec) != 0) die("a rank failed", "");
        int rep = (int)rec[0], s = (int)rec[1], way = (int)rec[2];
        if (way < 2) ar[rep][s][way] = rec[3];
        else agv[rep][s] = rec[3];
    }
    for (int r = 0; r < N; r++) {
        int st;
        waitpid(pid[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) die("a rank exited with an error", "");
    }
    mpi_ok = g_mpi;
    for (int rep = 0; g_mpi && mpi_ok && rep < g_repeat; rep++) run_mpi(rep);

    bench_machine(stdout, kvps_isa_set(KVPS_ISA_AUTO));
    printf("# bench_groups: 4 rank processes, tcp://127.0.0.1, float32, %d repeats\n", g_repeat);
    printf("# all-reduce on 2 ranks, both pairs at once: sub-ring of a 4-rank ring vs a 2-rank ring made directly\n");
    printf("%10s %26s %26s %22s\n", "bytes", "sub us (min-max)", "direct us (min-max)", "sub/direct (min-max)");
    for (int s = 0; s < g_nsizes; s++) {
        double sub[MAXR], dir[MAXR], q[MAXR], lo, hi, l2, h2, l3, h3;
        for (int rep = 0; rep < g_repeat; rep++) { sub[rep] = ar[rep][s][0] * 1e6; dir[rep] = ar[rep][s][1] * 1e6; q[rep] = sub[rep] / dir[rep]; }
        range(sub, g_repeat, &lo, &hi);
        range(dir, g_repeat, &l2, &h2);
        range(q, g_repeat, &l3, &h3);
        printf("%10zu %12.1f-%-13.1f %12.1f-%-13.1f %10.2f-%-11.2f\n", g_sizes[s], lo, hi, l2, h2, l3, h3);
    }
    printf("# allgatherv on 4 ranks, blocks 10/20/30/40%% of the total (bytes), per call\n");
    printf("%10s %26s %26s %22s\n", "bytes", "kvps us (min-max)", "mpi us (min-max)", "kvps/mpi (min-max)");
    for (int s = 0; s < g_nsizes; s++) {
        double k[MAXR], m[MAXR], q[MAXR], lo, hi, l2 = 0, h2 = 0, l3 = 0, h3 = 0;
        for (int rep = 0; rep < g_repeat; rep++) { k[rep] = agv[rep][s] * 1e6; m[rep] = mpi_t[rep][s] * 1e6; q[rep] = k[rep] / m[rep]; }
        range(k, g_repeat, &lo, &hi);
        if (mpi_ok) { range(m, g_repeat, &l2, &h2); range(q, g_repeat, &l3, &h3); }
        if (mpi_ok) printf("%10zu %12.1f-%-13.1f %12.1f-%-13.1f %10.2f-%-11.2f\n", g_sizes[s], lo, hi, l2, h2, l3, h3);
        else printf("%10zu %12.1f-%-13.1f %26s %22s\n", g_sizes[s], lo, hi, "(no mpirun / mpi_allgatherv)", "-");
    }
    printf("# each repeat (us): size sub direct | kvps_allgatherv mpi_allgatherv\n");
    for (int rep = 0; rep < g_repeat; rep++)
        for (int s = 0; s < g_nsizes; s++)
            printf("#  rep %d %10zu %10.1f %10.1f | %10.1f %10.1f\n", rep, g_sizes[s], ar[rep][s][0] * 1e6, ar[rep][s][1] * 1e6,
                   agv[rep][s] * 1e6, mpi_ok ? mpi_t[rep][s] * 1e6 : 0.0);
    return 0;
}
