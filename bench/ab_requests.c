/* ab_requests - a fixed, deterministic load for counting instructions (bench/ab.sh runs it under
   valgrind --tool=callgrind, built against two versions of the headers): "server" pushes and
   pulls a 4 KB tensor 3,000 times each and pushes a 1 MB tensor 100 times through an async
   KVPS_UPDATE_ACCUMULATE server thread over inproc; "ring" runs 3,000 broadcasts of 4 KB among 4 ranks
   as threads over inproc. It prints the number of requests or collectives it made; it measures
   no time (speed is bench_pushpull's and bench_ring's). */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "kvps_ring.h"
#include <pthread.h>
#include <stdio.h>

enum { N = 3000, K = 4, COUNT = 1024, BIG = 262144 };

static void need(kvps_result r, const char *what) {
    if (r != KVPS_OK) { fprintf(stderr, "ab_requests: %s: %s\n", what, kvps_result_str(r)); exit(1); }
}

static float g[BIG], v[BIG];

static int server_load(void) {
    void *ctx = zmq_ctx_new();
    kvps_server *s = NULL;
    need(kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://ab", .num_workers = 1, .consistency = KVPS_ASYNC,
                                                .update = KVPS_UPDATE_ACCUMULATE, .zmq_ctx = ctx, .no_malloc_tuning = 1}, &s), "server");
    need(kvps_server_start(s), "start");
    kvps_worker *w = NULL;
    need(kvps_worker_create(&(kvps_worker_desc){.servers = "inproc://ab", .zmq_ctx = ctx}, &w), "worker");
    kvps_tensor t, big;
    need(kvps_worker_tensor(w, "small", COUNT, &t), "tensor");
    need(kvps_worker_tensor(w, "big", BIG, &big), "tensor");
    kvps_req q;
    int n = 0;
    for (int i = 0; i < N; i++, n += 2) {
        need(kvps_worker_push_tensor(w, t, g, &q), "push");
        need(kvps_worker_wait(w, q, -1), "push");
        need(kvps_worker_pull_tensor(w, t, v, &q), "pull");
        need(kvps_worker_wait(w, q, -1), "pull");
    }
    for (int i = 0; i < N / 30; i++, n++) {
        need(kvps_worker_push_tensor(w, big, g, &q), "push");
        need(kvps_worker_wait(w, q, -1), "push");
    }
    kvps_worker_destroy(&w);
    kvps_server_destroy(&s);
    zmq_ctx_term(ctx);
    return n;
}

typedef struct { int rank; const char *peers; void *ctx; } rank_job;
static void *ring_rank(void *arg) {
    rank_job *j = (rank_job *)arg;
    static float buf[K][COUNT];
    kvps_ring *r = NULL;
    need(kvps_ring_create(&(kvps_ring_desc){.rank = j->rank, .size = K, .peers = j->peers, .zmq_ctx = j->ctx}, &r), "ring");
    for (int i = 0; i < N; i++) need(kvps_ring_broadcast(r, buf[j->rank], buf[j->rank], COUNT, KVPS_FLOAT32, i % K), "broadcast");
    kvps_ring_destroy(&r);
    return NULL;
}
static int ring_load(void) {
    void *ctx = zmq_ctx_new();
    char peers[256] = "";
    for (int r = 0; r < K; r++) snprintf(peers + strlen(peers), sizeof peers - strlen(peers), "%sinproc://ab-%d", r ? "," : "", r);
    pthread_t th[K];
    rank_job jobs[K];
    for (int r = 0; r < K; r++) {
        jobs[r] = (rank_job){r, peers, ctx};
        pthread_create(&th[r], NULL, ring_rank, &jobs[r]);
    }
    for (int r = 0; r < K; r++) pthread_join(th[r], NULL);
    zmq_ctx_term(ctx);
    return N;
}

int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "server") && strcmp(argv[1], "ring"))) {
        fprintf(stderr, "usage: ab_requests server|ring\n");
        return 2;
    }
    printf("%d\n", strcmp(argv[1], "server") == 0 ? server_load() : ring_load());
    return 0;
}
