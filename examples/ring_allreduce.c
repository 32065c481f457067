/* ring_allreduce.c - the smallest kvps_ring.h program: every rank adds its vector into the sum
   of all ranks' vectors (one all-reduce) and checks the result.

   Rank r contributes x[i] = (r + 1) * (i % 8 + 1), so after the all-reduce every rank must hold
   x[i] = size * (size + 1) / 2 * (i % 8 + 1), exactly (small integers are exact in float32).

   usage: ring_allreduce [--ranks N] [--count C]

   Two ways to run it:
   - Standalone (default): N ranks as threads of this process, talking over inproc:// through one
     shared ZeroMQ context. --ranks N (default 4).
   - One process per rank, when the environment names the rank (kvps_ring_env_read):
     KVPS_RANK (or OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID), KVPS_SIZE (or
     OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS) and KVPS_RING_PEERS (one endpoint per rank,
     in rank order; rank r binds entry r):
         scripts/kvps-run -s 0 -w 4 -- build/ring_allreduce
         mpirun -n 4 -x KVPS_RING_PEERS=tcp://127.0.0.1:7000,tcp://127.0.0.1:7001,tcp://127.0.0.1:7002,tcp://127.0.0.1:7003 build/ring_allreduce

   Each rank prints one line; exit code 0 when every rank holds the exact sum, 1 otherwise, 2 on
   bad usage or environment. */
#define KVPS_IMPLEMENTATION
#include "kvps_ring.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rank_job {
    int rank, size;
    size_t count;
    const char *peers;
    void *zmq_ctx; /* threads on inproc:// share one context; NULL: the ring makes its own */
    int ok;
} rank_job;

/* What a newcomer copies: create the ring, all-reduce, destroy. */
static void *run_rank(void *arg) {
    rank_job *j = (rank_job *)arg;
    float *x = (float *)malloc(j->count * sizeof *x);
    if (!x) { fprintf(stderr, "rank %d: out of memory\n", j->rank); return NULL; }
    for (size_t i = 0; i < j->count; i++) x[i] = (float)(j->rank + 1) * (float)(i % 8 + 1);

    kvps_ring *r = NULL;
    kvps_result rc = kvps_ring_create(&(kvps_ring_desc){.rank = j->rank, .size = j->size, .peers = j->peers,
                                                        .zmq_ctx = j->zmq_ctx}, &r);
    if (rc == KVPS_OK) rc = kvps_ring_allreduce(r, x, x, j->count, KVPS_FLOAT32, KVPS_SUM); /* in place */
    if (rc != KVPS_OK) {
        fprintf(stderr, "rank %d: %s%s%s\n", j->rank, kvps_result_str(rc), r ? " - " : "", r ? kvps_ring_last_error(r) : "");
        kvps_ring_destroy(&r);
        free(x);
        return NULL;
    }
    kvps_ring_destroy(&r);

    double tri = (double)j->size * (j->size + 1) / 2; /* 1 + 2 + ... + size */
    size_t bad = 0;
    for (size_t i = 0; i < j->count; i++) bad += x[i] != (float)(tri * (double)(i % 8 + 1));
    size_t last = j->count ? j->count - 1 : 0;
    if (j->count)
        printf("rank %d of %d: all-reduce of %zu floats: %s (x[0] = %g, x[%zu] = %g; expected %g and %g)\n", j->rank,
               j->size, j->count, bad ? "WRONG" : "ok", (double)x[0], last, (double)x[last], tri,
               tri * (double)(last % 8 + 1));
    else
        printf("rank %d of %d: all-reduce of 0 floats: ok\n", j->rank, j->size);
    fflush(stdout);
    j->ok = bad == 0;
    free(x);
    return NULL;
}

/* The environment names a rank when a launcher (kvps-run, mpirun, srun) started us. */
static int rank_from_env(void) {
    if (getenv("KVPS_RING_PEERS") || getenv("KVPS_RANK")) return 1;
    static const char *sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(sizes[i]);
        if (v && atoi(v) > 1) return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    int size = 4;
    long count = 1000000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--ranks") == 0 && i + 1 < argc && (size = atoi(argv[++i])) >= 1 && size <= 256) continue;
        if (strcmp(argv[i], "--count") == 0 && i + 1 < argc && (count = atol(argv[++i])) >= 0 && count <= (1L << 28)) continue;
        fprintf(stderr, "usage: ring_allreduce [--ranks N (1..256, default 4)] [--count C (floats, default 1000000)]\n");
        return 2;
    }

    if (rank_from_env()) { /* one process per rank */
        const char *role = getenv("KVPS_ROLE");
        if (role && strcmp(role, "server") == 0) { /* kvps-run -s N with N > 0: nothing to serve */
            printf("ring_allreduce: a ring needs no server; this one leaves (use kvps-run -s 0)\n");
            return 0;
        }
        rank_job j = {.count = (size_t)count};
        if (kvps_ring_env_read(&j.rank, &j.size, &j.peers) != KVPS_OK) {
            fprintf(stderr, "ring_allreduce: set KVPS_RANK, KVPS_SIZE and KVPS_RING_PEERS (one endpoint per rank), or\n"
                            "  run under kvps-run -s 0 -w N, or mpirun/srun with KVPS_RING_PEERS exported\n");
            return 2;
        }
        run_rank(&j);
        return j.ok ? 0 : 1;
    }

    /* Standalone: one thread per rank, inproc:// endpoints in one shared context. */
    void *ctx = zmq_ctx_new();
    char *peers = (char *)calloc((size_t)size, 32);
    rank_job *jobs = (rank_job *)calloc((size_t)size, sizeof *jobs);
    pthread_t *th = (pthread_t *)calloc((size_t)size, sizeof *th);
    if (!ctx || !peers || !jobs || !th) { fprintf(stderr, "ring_allreduce: out of memory\n"); return 1; }
    for (int r = 0; r < size; r++)
        sprintf(peers + strlen(peers), "%sinproc://ring-%d", r ? "," : "", r);
    for (int r = 0; r < size; r++) {
        jobs[r] = (rank_job){.rank = r, .size = size, .count = (size_t)count, .peers = peers, .zmq_ctx = ctx};
        pthread_create(&th[r], NULL, run_rank, &jobs[r]);
    }
    int ok = 1;
    for (int r = 0; r < size; r++) {
        pthread_join(th[r], NULL);
        ok &= jobs[r].ok;
    }
    printf("ring_allreduce: %d ranks, %ld floats: %s\n", size, count, ok ? "every rank holds the exact sum" : "FAILED");
    zmq_ctx_term(ctx);
    free(th);
    free(jobs);
    free(peers);
    return ok ? 0 : 1;
}
