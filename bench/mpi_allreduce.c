/* mpi_allreduce - the OpenMPI peer of bench_ring: MPI_Allreduce of float32 sums, timed the way
   bench_ring times kvps_ring_allreduce, so the two tables can be set side by side.

   usage: mpirun -np N [mpirun options] mpi_allreduce [--sizes B,B,...] [--time S] [--csv] [--inplace]

   Build by hand (not part of `make`, it needs mpicc):
       mpicc -O2 bench/mpi_allreduce.c -o build/mpi_allreduce
   bench_ring runs it itself (--mpi-btl tcp|default|both), over TCP:
       mpirun --allow-run-as-root --oversubscribe -np N --bind-to none \
              --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo build/mpi_allreduce --csv
   (pml ob1 so that the btl list decides what carries the data: a UCX pml, where selected,
   ignores it; with btl tcp,self the ranks' traffic goes through the kernel's TCP stack, as
   perf shows: tcp_sendmsg and the socket copies; vader,self, shared memory, is 1.7-2x faster
   here), once more with the ring forced:
       ... --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4 ...
   and with OpenMPI's default transport, no --mca pml/btl (shared memory on one host):
       mpirun --allow-run-as-root --oversubscribe -np N --bind-to none build/mpi_allreduce --csv

   Method, the same as bench_ring: buffers allocated and touched once; per size a warm-up, then
   an estimate whose maximum over ranks sets the iteration count (about --time seconds in all,
   in 5 timed blocks, each after a barrier); a block's time is its per-iteration time averaged
   over ranks (as nccl-tests does); the reported time is the median of the 5 blocks; cpu_us is
   the CPU time per call summed over ranks (every thread, user + system).
   Out of place by default (send != recv), as nccl-tests' first column; --inplace uses
   MPI_IN_PLACE. busbw = algbw x 2(n-1)/n. The result of the warm-up is checked: every element
   must equal n(n+1)/2. */
#include <mpi.h>
#include "bench_cpu.h" /* cpu_s; beside this file, so a bare mpicc line finds it */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NREP = 5, MAX_SIZES = 64 };

static double median(double *v, int n) { /* sorts v */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static size_t parse_size(const char *s, int *ok) {
    char *end = NULL;
    double v = strtod(s, &end);
    size_t mul = 1;
    if (*end == 'K' || *end == 'k') { mul = 1024; end++; }
    else if (*end == 'M' || *end == 'm') { mul = 1024 * 1024; end++; }
    else if (*end == 'G' || *end == 'g') { mul = 1024ull * 1024 * 1024; end++; }
    *ok = end != s && *end == 0 && v > 0;
    return (size_t)(v * (double)mul);
}

static void usage(int rank) {
    if (rank == 0)
        fprintf(stderr, "usage: mpi_allreduce [--sizes B,B,...] [--time S] [--csv] [--inplace]\n"
                        "  --sizes   bytes per rank, with K/M/G suffixes (default 4K,16K,...,64M)\n"
                        "  --time S  seconds per size, all blocks together (default 0.3)\n"
                        "  --csv     CSV rows instead of the table\n"
                        "  --inplace MPI_IN_PLACE instead of separate send and receive buffers\n");
    MPI_Finalize();
    exit(2);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t sizes[MAX_SIZES];
    int nsizes = 0, csv = 0, inplace = 0;
    double target = 0.3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0) csv = 1;
        else if (strcmp(argv[i], "--inplace") == 0) inplace = 1;
        else if (strcmp(argv[i], "--time") == 0 && i + 1 < argc) {
            char *end = NULL;
            target = strtod(argv[++i], &end);
            if (*end || !(target > 0 && target <= 60)) usage(rank);
        } else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            char *list = strdup(argv[++i]), *save = NULL;
            for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                int ok;
                size_t b = parse_size(t, &ok);
                if (!ok || nsizes == MAX_SIZES || b % 4) usage(rank);
                sizes[nsizes++] = b;
            }
            free(list);
        } else usage(rank);
    }
    if (nsizes == 0)
        for (size_t b = 4096; b <= (64u << 20); b *= 4) sizes[nsizes++] = b;
    size_t maxb = 0;
    for (int i = 0; i < nsizes; i++) maxb = sizes[i] > maxb ? sizes[i] : maxb;

    float *send = NULL, *recv = NULL;
    if (posix_memalign((void **)&send, 64, maxb) || posix_memalign((void **)&recv, 64, maxb)) {
        fprintf(stderr, "mpi_allreduce: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < maxb / 4; i++) send[i] = (float)(rank + 1);
    memset(recv, 0, maxb);

    if (rank == 0) {
        if (csv) printf("peer,ranks,bytes,count,iters,time_us,time_max_us,cpu_us,algbw,busbw,ok\n");
        else printf("# mpi_allreduce: %d ranks, float32 sum, %s, time averaged over ranks, median of %d blocks\n"
                    "#%11s %12s %6s %10s %10s %10s %8s %8s %3s\n",
                    n, inplace ? "in place" : "out of place", NREP, "size", "count", "iters", "time_us",
                    "max_us", "cpu_us", "algbw", "busbw", "ok");
        fflush(stdout);
    }
    const float want = (float)n * (float)(n + 1) / 2;
    for (int si = 0; si < nsizes; si++) {
        size_t bytes = sizes[si];
        int count = (int)(bytes / 4);
        const void *sb = inplace ? MPI_IN_PLACE : send;
        /* warm-up with a check */
        if (inplace) for (int i = 0; i < count; i++) recv[i] = (float)(rank + 1);
        MPI_Allreduce(sb, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        int ok = 1;
        for (int i = 0; i < count; i++) ok &= recv[i] == want;
        int all_ok;
        MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (inplace) memset(recv, 0, bytes); /* in place, the sums would grow each iteration */
        /* estimate: 2 iterations, the slowest rank decides */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int it = 0; it < 2; it++) MPI_Allreduce(sb, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double est = (MPI_Wtime() - t0) / 2, est_max;
        MPI_Allreduce(&est, &est_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        long iters = (long)(target / NREP / est_max);
        if (iters < 1) iters = 1;
        if (iters > 100000) iters = 100000;
        double blk[NREP], blk_max[NREP], blk_cpu[NREP];
        for (int rep = 0; rep < NREP; rep++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double c0 = cpu_s();
            t0 = MPI_Wtime();
            for (long it = 0; it < iters; it++) MPI_Allreduce(sb, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double t = (MPI_Wtime() - t0) / (double)iters, cpu = (cpu_s() - c0) / (double)iters, sum, mx, csum;
            MPI_Allreduce(&t, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            MPI_Allreduce(&t, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            MPI_Allreduce(&cpu, &csum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            blk[rep] = sum / n;
            blk_max[rep] = mx;
            blk_cpu[rep] = csum;
        }
        if (rank == 0) {
            double t = median(blk, NREP), tm = median(blk_max, NREP), tc = median(blk_cpu, NREP);
            double algbw = (double)bytes / t / 1e9, busbw = algbw * 2.0 * (n - 1) / n;
            if (csv) printf("mpi,%d,%zu,%d,%ld,%.2f,%.2f,%.2f,%.4f,%.4f,%d\n", n, bytes, count, iters, t * 1e6, tm * 1e6,
                            tc * 1e6, algbw, busbw, all_ok);
            else printf(" %11zu %12d %6ld %10.1f %10.1f %10.1f %8.3f %8.3f %3s\n", bytes, count, iters, t * 1e6,
                        tm * 1e6, tc * 1e6, algbw, busbw, all_ok ? "ok" : "BAD");
            fflush(stdout);
        }
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
