/* bench_keys - many small keys, sparse rows, memory per row, consistency under a straggler.
   usage: bench_keys [--quick] [--rows N (10000000)]
   Servers run in this process on tcp://127.0.0.1 (each with its own ZeroMQ context); output is
   "key: value [unit]" lines, per the house style. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "bench/bench_cpu.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}

static int g_fail;
#define CHECK(call)                                                                              \
    do {                                                                                         \
        kvps_result r_ = (call);                                                                 \
        if (r_ != KVPS_OK) { fprintf(stderr, "%s: %s\n", #call, kvps_result_str(r_)); g_fail = 1; } \
    } while (0)

static void cluster(int n, kvps_consistency mode, int k, int kmin, int m, kvps_server **srv, char *servers, size_t cap) {
    servers[0] = 0;
    for (int i = 0; i < n; i++) {
        CHECK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .rank = i, .num_workers = m,
                                                     .consistency = mode, .staleness = k, .staleness_min = kmin,
                                                     .update = KVPS_UPDATE_ACCUMULATE}, &srv[i]));
        kvps_server_start(srv[i]);
        snprintf(servers + strlen(servers), cap - strlen(servers), "%s%s", i ? "," : "", kvps_server_endpoint(srv[i]));
    }
}

/* One async server in this process, in srv[0], and a worker of it. */
static kvps_worker *one_pair(kvps_server **srv) {
    char servers[256];
    cluster(1, KVPS_ASYNC, 0, 0, 1, srv, servers, sizeof servers);
    kvps_worker *w = NULL;
    CHECK(kvps_worker_create(&(kvps_worker_desc){.servers = servers, .timeout_ms = 120000}, &w));
    return w;
}

static void many_keys(int quick) {
    kvps_server *srv[1];
    kvps_worker *w = one_pair(srv);
    size_t nk = quick ? 100000 : 1000000, *lens = (size_t *)malloc(nk * sizeof *lens);
    uint64_t *keys = (uint64_t *)malloc(nk * sizeof *keys);
    float *vals = (float *)malloc(nk * 16 * sizeof(float));
    for (size_t i = 0; i < nk; i++) { keys[i] = i * 2654435761u % (1ull << 40); lens[i] = 16; }
    for (size_t i = 0; i < nk * 16; i++) vals[i] = 1.0f;
    kvps_req q;
    CHECK(kvps_worker_push(w, keys, vals, lens, nk, &q)); /* creates the keys */
    CHECK(kvps_worker_wait(w, q, -1));
    int reps = 5;
    double t0 = now_s();
    for (int r = 0; r < reps; r++) {
        CHECK(kvps_worker_push(w, keys, vals, lens, nk, &q));
        CHECK(kvps_worker_wait(w, q, -1));
    }
    double push = (double)nk * reps / (now_s() - t0);
    t0 = now_s();
    for (int r = 0; r < reps; r++) {
        CHECK(kvps_worker_pull(w, keys, vals, lens, nk, &q));
        CHECK(kvps_worker_wait(w, q, -1));
    }
    double pull = (double)nk * reps / (now_s() - t0);
    bench_machine(stdout, kvps_isa_set(KVPS_ISA_AUTO));
    printf("small_keys: %zu keys x 16 floats per request, 1 server, 1 worker\n", nk);
    printf("small_keys_push: %.2f M keys/s\n", push / 1e6);
    printf("small_keys_pull: %.2f M keys/s\n", pull / 1e6);
    kvps_worker_destroy(&w);
    kvps_server_destroy(&srv[0]);
    free(lens); free(keys); free(vals);
}

enum { SPARSE_R = 1000, SPARSE_W = 16 }; /* rows per request, requests in flight */

/* Rows per second over iters requests of SPARSE_R random rows of t (ids drawn from *seed), pulls
   (push = 0) or pushes of rows, SPARSE_W in flight. ids and rows hold SPARSE_W requests. */
static double sparse_rate(kvps_worker *w, kvps_table t, int push, int iters, uint64_t table_rows, uint64_t *seed,
                          uint64_t *ids, float *rows) {
    enum { R = SPARSE_R, W = SPARSE_W };
    kvps_req win[W];
    double t0 = now_s();
    for (int it = 0; it < iters; it++) {
        int slot = it % W;
        if (it >= W) CHECK(kvps_worker_wait(w, win[slot], -1));
        for (int i = 0; i < R; i++) { *seed = *seed * 6364136223846793005ull + 1; ids[slot * R + i] = (*seed >> 20) % table_rows; }
        if (push) CHECK(kvps_worker_push_rows(w, t, ids + slot * R, rows + (size_t)slot * R * 64, R, &win[slot]));
        else CHECK(kvps_worker_pull_rows(w, t, ids + slot * R, rows + (size_t)slot * R * 64, R, &win[slot]));
    }
    for (int it = iters - W; it < iters; it++) CHECK(kvps_worker_wait(w, win[it % W], -1));
    return (double)iters * R / (now_s() - t0);
}

static void sparse_rows(int quick) {
    kvps_server *srv[1];
    kvps_worker *w = one_pair(srv);
    kvps_table t;
    kvps_req q;
    CHECK(kvps_worker_table(w, &(kvps_table_desc){.name = "emb", .dim = 64, .init_scale = 0.01f}, &t, &q));
    CHECK(kvps_worker_wait(w, q, -1));
    enum { R = SPARSE_R, W = SPARSE_W };
    uint64_t table_rows = quick ? 100000 : 1000000;
    uint64_t *ids = (uint64_t *)malloc((size_t)W * R * sizeof *ids);
    float *rows = (float *)malloc((size_t)W * R * 64 * sizeof(float));
    uint64_t seed = 1;
    for (uint64_t b = 0; b < table_rows; b += R) { /* create the table */
        for (int i = 0; i < R; i++) ids[i] = b + (uint64_t)i;
        CHECK(kvps_worker_pull_rows(w, t, ids, rows, R, &q));
        CHECK(kvps_worker_wait(w, q, -1));
    }
    int iters = quick ? 200 : 2000;
    double pull = sparse_rate(w, t, 0, iters, table_rows, &seed, ids, rows);
    double push = sparse_rate(w, t, 1, iters, table_rows, &seed, ids, rows);
    bench_machine(stdout, kvps_isa_set(KVPS_ISA_AUTO));
    printf("sparse: table of %llu rows x 64 floats, requests of %d random rows, %d in flight, 1 server\n",
           (unsigned long long)table_rows, R, W);
    printf("sparse_pull: %.2f M rows/s\n", pull / 1e6);
    printf("sparse_push_sgd: %.2f M rows/s\n", push / 1e6);
    kvps_worker_destroy(&w);
    kvps_server_destroy(&srv[0]);
    free(ids); free(rows);
}

static void memory_per_row(uint64_t nrows) {
    enum { N = 4, R = 65536 };
    kvps_server *srv[N];
    char servers[1024];
    long rss0 = rss_kb();
    cluster(N, KVPS_ASYNC, 0, 0, 1, srv, servers, sizeof servers);
    kvps_worker *w = NULL;
    CHECK(kvps_worker_create(&(kvps_worker_desc){.servers = servers, .timeout_ms = 120000}, &w));
    kvps_table t;
    kvps_req q;
    CHECK(kvps_worker_table(w, &(kvps_table_desc){.name = "big", .dim = 64, .init_scale = 0.01f}, &t, &q));
    CHECK(kvps_worker_wait(w, q, -1));
    uint64_t *ids = (uint64_t *)malloc(R * sizeof *ids);
    float *rows = (float *)malloc((size_t)R * 64 * sizeof(float));
    double t0 = now_s();
    for (uint64_t b = 0; b < nrows && !g_fail; b += R) {
        size_t n = nrows - b < R ? (size_t)(nrows - b) : R;
        for (size_t i = 0; i < n; i++) ids[i] = kvps__mix64(b + i); /* ids anywhere in 64 bits */
        CHECK(kvps_worker_pull_rows(w, t, ids, rows, n, &q));
        CHECK(kvps_worker_wait(w, q, -1));
    }
    double secs = now_s() - t0;
    uint64_t rows_held = 0, bytes = 0;
    for (int i = 0; i < N; i++) {
        kvps_server_stats st;
        kvps_server_stats_get(srv[i], &st);
        rows_held += st.table_rows;
        bytes += st.table_bytes;
    }
    long rss1 = rss_kb();
    printf("table_rows: %llu x 64 floats over %d servers (created in %.1f s)\n", (unsigned long long)rows_held, N, secs);
    printf("table_bytes_per_row: %.1f B (raw values 256 B: %.2fx)\n", (double)bytes / rows_held, (double)bytes / rows_held / 256.0);
    printf("process_rss_per_row: %.1f B (whole process, servers and worker)\n", (double)(rss1 - rss0) * 1024.0 / rows_held);
    kvps_worker_destroy(&w);
    for (int i = 0; i < N; i++) kvps_server_destroy(&srv[i]);
    free(ids); free(rows);
}

/* Three workers, each stalling 8 ms at random steps (1 in 8): steps per second. */
typedef struct cw { const char *servers; int rank, steps; double secs; } cw;
static void *cons_worker(void *arg) {
    cw *c = (cw *)arg;
    kvps_worker *w = NULL;
    kvps_tensor t;
    kvps_req q;
    float g[1024], v[1024];
    for (int i = 0; i < 1024; i++) g[i] = 1.0f;
    CHECK(kvps_worker_create(&(kvps_worker_desc){.servers = c->servers, .rank = c->rank, .num_workers = 3, .timeout_ms = 60000}, &w));
    CHECK(kvps_worker_tensor(w, "m", 1024, &t));
    double t0 = now_s();
    for (int s = 0; s < c->steps && !g_fail; s++) {
        if (kvps__mix64(((uint64_t)c->rank << 32) ^ (uint64_t)s) % 8 == 0) { /* a stall at a random step */
            struct timespec ts = {0, 8000000};
            nanosleep(&ts, NULL);
        }
        struct timespec work = {0, 500000}; /* 0.5 ms of "compute" per step */
        nanosleep(&work, NULL);
        CHECK(kvps_worker_pushpull_tensor(w, t, g, v, &q));
        CHECK(kvps_worker_wait(w, q, -1));
    }
    c->secs = now_s() - t0;
    kvps_worker_destroy(&w);
    return NULL;
}

static void consistency(int quick) {
    struct { const char *name; kvps_consistency mode; int k, kmin; } cs[] = {
        {"BSP", KVPS_BSP, 0, 0}, {"SSP(4)", KVPS_SSP, 4, 0}, {"adaptive(0..4)", KVPS_ADAPTIVE, 4, 0}, {"async", KVPS_ASYNC, 0, 0}};
    int steps = quick ? 100 : 400;
    printf("consistency: 3 workers, 1024-float tensor, 0.5 ms compute per step, each worker stalls 8 ms at random 1 step in 8\n");
    double ssp = 0;
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        kvps_server *srv[1];
        char servers[256];
        cluster(1, cs[i].mode, cs[i].k, cs[i].kmin, 3, srv, servers, sizeof servers);
        cw c[3];
        pthread_t th[3];
        for (int r = 0; r < 3; r++) { c[r] = (cw){servers, r, steps, 0}; pthread_create(&th[r], NULL, cons_worker, &c[r]); }
        for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
        kvps_server_stats st;
        kvps_server_stats_get(srv[0], &st);
        kvps_server_destroy(&srv[0]);
        double fast = steps / ((c[0].secs + c[1].secs + c[2].secs) / 3);
        if (cs[i].mode == KVPS_SSP) ssp = fast;
        printf("steps_per_s %-15s %8.1f (mean of workers)  stalls %6llu  switches %3llu  final k %llu%s\n", cs[i].name, fast,
               (unsigned long long)st.stalls, (unsigned long long)st.switches, (unsigned long long)st.staleness,
               cs[i].mode == KVPS_ADAPTIVE && ssp > 0 ? "" : "");
        if (cs[i].mode == KVPS_ADAPTIVE && ssp > 0) printf("adaptive_vs_ssp: %.2fx\n", fast / ssp);
    }
}

int main(int argc, char **argv) {
    int quick = 0;
    uint64_t rows = 10000000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = strtoull(argv[++i], NULL, 10);
        else { fprintf(stderr, "usage: %s [--quick] [--rows N]\n", argv[0]); return 2; }
    }
    if (quick && rows == 10000000) rows = 1000000;
    many_keys(quick);
    sparse_rows(quick);
    memory_per_row(rows);
    consistency(quick);
    return g_fail;
}
