/* hello_ps.c - a whole kvps parameter-server program: servers hold the weights of a linear model
   y = w.x and apply SGD to the mean of each round's gradients (KVPS_UPDATE_SGD, BSP); each worker
   pushpulls the gradient of its own examples and after STEPS steps prints the weights, which must
   be (1, -2, 3, 0.5). It finishes (kvps_worker_finish); each server's kvps_server_run returns by
   itself once all workers have, and every process exits 0 (1: wrong weights or an error).
     build/hello_ps [-s N] [-w M]               N servers, M workers as threads (default 1, 2)
     scripts/kvps-run -s 2 -w 3 build/hello_ps  or mpirun/srun -n 5, KVPS_SERVERS (2 of them) and
   KVPS_NUM_WORKERS set (ranks 0..1 serve): a process each.
     KVPS_NUM_SERVERS=2 torchrun --nproc_per_node 5 --no_python build/hello_ps   (or mpirun / srun
   -n 5 with MASTER_ADDR, MASTER_PORT and KVPS_NUM_SERVERS=2: the processes meet at rank 0's
   address, ranks 0..1 serve; kvps_launch.h). hello_ring.c: the same, no server. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* getopt */

enum { DIM = 4, EXAMPLES = 64, STEPS = 40, MAX_PEERS = 64 };
static const float TRUE_W[DIM] = {1, -2, 3, 0.5f}, LR = 0.5f;

/* The gradient at w of the mean squared error over rank's examples: x in [-1, 1), y = TRUE_W.x. */
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

/* A server or worker: servers; a server's endpoint and its shard's replicas (REPLICAS, kvps.h); rank; workers; a ZeroMQ context */
typedef struct job { const char *servers, *endpoint, *replicas; int rank, workers, replica, replacement; void *zmq_ctx; } job;

static void *server_main(void *arg) { /* returns NULL on an error */
    job *j = (job *)arg;
    kvps_server *s = NULL; /* w -= LR * (the round's sum of gradients / workers), once all have pushed */
    kvps_result rc = kvps_server_create(&(kvps_server_desc){
        .endpoint = j->endpoint, .rank = j->rank, .num_workers = j->workers, .update = KVPS_UPDATE_SGD, .lr = LR,
        .zmq_ctx = j->zmq_ctx, .replicas = j->replicas, .replica = j->replica, .replacement = j->replacement}, &s);
    if (rc == KVPS_OK) rc = kvps_server_run(s); /* returns by itself once every worker has finished */
    printf("hello_ps: server %d: %s\n", j->rank, rc == KVPS_OK ? "every worker finished" : kvps_result_str(rc));
    kvps_server_destroy(&s);
    return rc == KVPS_OK ? arg : NULL;
}

static void *worker_main(void *arg) { /* returns NULL on an error or wrong weights */
    job *j = (job *)arg;
    float w[DIM] = {0}, g[DIM], err = 0; /* the servers' weights start at zero too */
    kvps_worker *wk = NULL; kvps_tensor t; kvps_req q;
    kvps_result rc = kvps_worker_create(&(kvps_worker_desc){.servers = j->servers, .rank = j->rank, .num_workers = j->workers,
                                                            .min_slice = 1, .zmq_ctx = j->zmq_ctx}, &wk);
    if (rc == KVPS_OK) rc = kvps_worker_tensor(wk, "w", DIM, &t); /* min_slice 1: a slice on each server */
    for (int step = 0; step < STEPS && rc == KVPS_OK; step++) {
        gradient(j->rank, w, g);
        rc = kvps_worker_pushpull_tensor(wk, t, g, w, &q); /* push g; pull w after this round */
        /* -1: no deadline: as long as the servers live (a slow worker holds the round back; a warning
           each minute names it); a dead server: KVPS_ERR_PEER_LOST within peer_timeout_ms (5 s) */
        if (rc == KVPS_OK) rc = kvps_worker_wait(wk, q, -1);
    }
    if (rc == KVPS_OK) rc = kvps_worker_finish(wk, -1); /* a server stops once every worker has */
    if (rc != KVPS_OK) fprintf(stderr, "hello_ps: worker %d: %s: %s\n", j->rank, kvps_result_str(rc), kvps_worker_last_error(wk));
    kvps_worker_destroy(&wk);
    for (int i = 0; i < DIM; i++) err = fmaxf(err, fabsf(w[i] - TRUE_W[i]));
    printf("hello_ps: worker %d of %d: w = %.4f %.4f %.4f %.4f after %d steps (want 1 -2 3 0.5): %s\n", j->rank,
           j->workers, w[0], w[1], w[2], w[3], STEPS, rc == KVPS_OK && err < 1e-3f ? "ok" : "WRONG");
    return rc == KVPS_OK && err < 1e-3f ? arg : NULL;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* each line as it is printed, also into a launcher's pipe */
    kvps_env env;
    if (kvps_env_launched()) { /* kvps-run, mpirun, srun: this process is one server or worker */
        if (kvps_env_read(&env) != KVPS_OK) return 2; /* it said what is missing */
        job j = {env.servers, env.endpoint, env.replicas, env.rank, env.num_workers, env.replica, env.replacement, NULL};
        return (env.role == KVPS_ROLE_SERVER ? server_main(&j) : worker_main(&j)) ? 0 : 1;
    }
    int ns = 1, nw = 2, ok = 1; /* standalone: every server and worker a thread, on inproc:// */
    for (int c; (c = getopt(argc, argv, "s:w:")) != -1;) /* an unknown option: ns 0, the usage */
        if (c == 's') ns = atoi(optarg); else if (c == 'w') nw = atoi(optarg); else ns = 0;
    if (optind < argc || ns < 1 || nw < 1 || ns > MAX_PEERS || nw > MAX_PEERS) {
        fprintf(stderr, "usage: hello_ps [-s SERVERS] [-w WORKERS] (or under kvps-run, mpirun, srun)\n");
        return 2;
    }
    void *ctx = zmq_ctx_new(); /* inproc:// endpoints live in one context */
    char servers[MAX_PEERS * 32] = "", eps[MAX_PEERS][32];
    for (int i = 0; i < ns; i++) {
        snprintf(eps[i], sizeof eps[i], "inproc://hello-ps-%d", i);
        snprintf(servers + strlen(servers), sizeof servers - strlen(servers), "%s%s", i ? "," : "", eps[i]);
    }
    job jobs[2 * MAX_PEERS];
    pthread_t th[2 * MAX_PEERS];
    for (int i = 0; i < ns + nw; i++) {
        jobs[i] = (job){servers, i < ns ? eps[i] : NULL, NULL, i < ns ? i : i - ns, nw, 0, 0, ctx}; /* no replicas */
        pthread_create(&th[i], NULL, i < ns ? server_main : worker_main, &jobs[i]);
    }
    for (int i = 0; i < ns + nw; i++) { void *right; pthread_join(th[i], &right); ok &= right != NULL; }
    zmq_ctx_term(ctx);
    return ok ? 0 : 1;
}
