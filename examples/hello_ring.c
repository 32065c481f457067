/* hello_ring.c - a whole kvps_ring.h program, no server: data-parallel training of a linear
   model y = w.x with 4 weights. Every rank computes the gradient on its own examples, one
   all-reduce (KVPS_AVG) gives every rank the mean of them all, and every rank takes the same SGD
   step, so all ranks hold the same weights. After STEPS steps they are (1, -2, 3, 0.5), the
   weights the examples were made with; each rank prints them, destroys its ring at once (what
   the last all-reduce sent still arrives: kvps_ring.h's manual, section 5) and exits 0.
   hello_ps.c is the same program with a parameter server.

     build/hello_ring [-n N]                      N ranks as threads of this process (default 4)
     scripts/kvps-run -s 0 -w 3 build/hello_ring  one process per rank, from KVPS_RANK, KVPS_SIZE
                                                  and KVPS_RING_PEERS (kvps_ring_env_read)
     torchrun --nproc_per_node 4 --no_python build/hello_ring     (RANK, WORLD_SIZE, MASTER_ADDR,
                                                  MASTER_PORT: the ranks meet at rank 0's address)
     mpirun -n 3 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 build/hello_ring
     srun -n 3 build/hello_ring                   (MASTER_ADDR, MASTER_PORT exported)
   With KVPS_RING_PEERS rank r binds its entry r; else the ranks meet at the rendezvous address
   (kvps_launch.h). Exit 0 when every rank holds the right weights. */
#define KVPS_IMPLEMENTATION
#include "kvps_ring.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { DIM = 4, EXAMPLES = 64, STEPS = 40 };
static const float TRUE_W[DIM] = {1, -2, 3, 0.5f}, LR = 0.5f;

/* The gradient at w of the mean squared error over rank's own examples: x uniform in [-1, 1)
   from a generator seeded by the rank, y = TRUE_W.x. */
static void gradient(int rank, const float *w, float *g) {
    unsigned s = 1u + 7919u * (unsigned)rank;
    memset(g, 0, DIM * sizeof *g);
    for (int n = 0; n < EXAMPLES; n++) {
        float x[DIM], err = 0; /* w.x - y */
        for (int i = 0; i < DIM; i++) { s = s * 1664525u + 1013904223u; x[i] = (float)(s >> 8) / 8388608.0f - 1; }
        for (int i = 0; i < DIM; i++) err += (w[i] - TRUE_W[i]) * x[i];
        for (int i = 0; i < DIM; i++) g[i] += 2 * err * x[i] / EXAMPLES;
    }
}

typedef struct rank_job { int rank, size; const char *peers; void *zmq_ctx; int ok; } rank_job;

static void *run_rank(void *arg) {
    rank_job *j = (rank_job *)arg;
    float w[DIM] = {0}, g[DIM], err = 0;
    kvps_ring *r = NULL;
    /* no .timeout_ms: a slow rank (a checkpoint, an evaluation) is waited for, a warning logged each
       minute it is late; a dead one ends the call with KVPS_ERR_PEER_LOST naming it within 5 s */
    kvps_result rc = kvps_ring_create(&(kvps_ring_desc){.rank = j->rank, .size = j->size, .peers = j->peers,
                                                        .zmq_ctx = j->zmq_ctx}, &r);
    for (int step = 0; step < STEPS && rc == KVPS_OK; step++) {
        gradient(j->rank, w, g);
        rc = kvps_ring_allreduce(r, g, g, DIM, KVPS_FLOAT32, KVPS_AVG); /* in place: the mean over all ranks */
        for (int i = 0; i < DIM; i++) w[i] -= LR * g[i];
    }
    if (rc != KVPS_OK)
        fprintf(stderr, "hello_ring: rank %d: %s: %s\n", j->rank, kvps_result_str(rc), r ? kvps_ring_last_error(r) : "");
    kvps_ring_destroy(&r);
    for (int i = 0; i < DIM; i++) err = fmaxf(err, fabsf(w[i] - TRUE_W[i]));
    j->ok = rc == KVPS_OK && err < 1e-3f;
    printf("hello_ring: rank %d of %d: w = %.4f %.4f %.4f %.4f after %d steps (want 1 -2 3 0.5): %s\n", j->rank,
           j->size, w[0], w[1], w[2], w[3], STEPS, j->ok ? "ok" : "WRONG");
    return NULL;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* each line as it is printed, also into a launcher's pipe */
    if (kvps_env_launched()) {        /* kvps-run, mpirun, srun: this process is one rank */
        rank_job j = {0, 0, NULL, NULL, 0};
        if (kvps_ring_env_read(&j.rank, &j.size, &j.peers) != KVPS_OK) {
            fprintf(stderr, "hello_ring: no ring: %s\n", kvps_ring_last_error(NULL)); /* names what is missing */
            return 2;
        }
        run_rank(&j);
        return j.ok ? 0 : 1;
    }
    int n = argc == 1 ? 4 : argc == 3 && strcmp(argv[1], "-n") == 0 ? atoi(argv[2]) : 0;
    if (n < 1 || n > 64) { fprintf(stderr, "usage: hello_ring [-n RANKS (1-64, default 4)]\n"); return 2; }
    void *ctx = zmq_ctx_new(); /* threads on inproc:// share one context */
    char peers[64 * 32] = "";
    rank_job jobs[64];
    pthread_t th[64];
    for (int i = 0; i < n; i++) snprintf(peers + strlen(peers), sizeof peers - strlen(peers), "%sinproc://hello-ring-%d", i ? "," : "", i);
    for (int i = 0; i < n; i++) {
        jobs[i] = (rank_job){i, n, peers, ctx, 0};
        pthread_create(&th[i], NULL, run_rank, &jobs[i]);
    }
    int ok = 1;
    for (int i = 0; i < n; i++) { pthread_join(th[i], NULL); ok &= jobs[i].ok; }
    zmq_ctx_term(ctx);
    return ok ? 0 : 1;
}
