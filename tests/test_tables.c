/* Sparse embedding tables: lazy rows with a placement-independent initialiser, merged duplicate
   ids, per-row optimizer state against a one-process reference, bad input, memory per row. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"
#include <math.h>

enum { DIM = 8 };

static kvps_worker *connect_w(kt_cluster *c, int rank) {
    kvps_worker *w = NULL;
    kvps_worker_create(&(kvps_worker_desc){.servers = c->servers, .rank = rank, .zmq_ctx = c->ctx}, &w);
    return w;
}

static kvps_result sync_req(kvps_worker *w, kvps_result r, const kvps_req *q) { return r == KVPS_OK ? kvps_worker_wait(w, *q, -1) : r; }

static void test_lazy_rows_same_everywhere(void) {
    /* the same ids pulled from clusters of 1 and 3 servers: the initial values depend only on
       (seed, id, j), never on which server creates the row */
    uint64_t ids[6] = {0, 1, 42, 1ull << 40, UINT64_MAX, 987654321};
    float a[6 * DIM], b[6 * DIM];
    float *outs[2] = {a, b};
    for (int v = 0; v < 2; v++) {
        kt_cluster c;
        kt_cluster_up(&c, "inproc", v ? 3 : 1, &(kvps_server_desc){.num_workers = 1});
        kvps_worker *w = connect_w(&c, 0);
        kvps_table t;
        kvps_req q;
        KT_OK(sync_req(w, kvps_worker_table(w, &(kvps_table_desc){.name = "emb", .dim = DIM, .init_scale = 0.1f, .seed = 5}, &t, &q), &q));
        KT_OK(sync_req(w, kvps_worker_pull_rows(w, t, ids, outs[v], 6, &q), &q));
        kvps_worker_destroy(&w);
        kt_cluster_down(&c);
    }
    KT_CHECK(memcmp(a, b, sizeof a) == 0, "initial rows differ between 1 and 3 servers");
    int in_range = 1, distinct = 0;
    for (int i = 0; i < 6 * DIM; i++) {
        in_range &= a[i] >= -0.1f && a[i] < 0.1f;
        distinct += i && a[i] != a[i - 1];
    }
    KT_CHECK(in_range && distinct > 6 * DIM - 3, "initial values not uniform in [-0.1, 0.1)");
}

static void test_push_merges_duplicates(void) {
    kt_cluster c;
    kt_cluster_up(&c, "inproc", 2, &(kvps_server_desc){.num_workers = 2});
    kvps_worker *w0 = connect_w(&c, 0), *w1 = connect_w(&c, 1);
    kvps_table t0, t1;
    kvps_req q;
    kvps_table_desc d = {.name = "dup", .dim = DIM, .opt = {KVPS_RULE_SGD, 0.5f, 0, 0, 0, 0, 0}, .init_scale = 0.2f, .seed = 9};
    KT_OK(sync_req(w0, kvps_worker_table(w0, &d, &t0, &q), &q));
    KT_OK(sync_req(w1, kvps_worker_table(w1, &d, &t1, &q), &q)); /* the same call on every worker */
    uint64_t ids[5] = {5, 9, 5, 1ull << 60, 9};
    float g[5 * DIM], before[5 * DIM], after[5 * DIM];
    for (int i = 0; i < 5 * DIM; i++) g[i] = (float)(i % 7) * 0.125f;
    KT_OK(sync_req(w1, kvps_worker_pull_rows(w1, t1, ids, before, 5, &q), &q));
    KT_CHECK(memcmp(before, before + 2 * DIM, DIM * 4) == 0, "a repeated id must come back the same");
    KT_OK(sync_req(w0, kvps_worker_push_rows(w0, t0, ids, g, 5, &q), &q));
    KT_OK(sync_req(w1, kvps_worker_pull_rows(w1, t1, ids, after, 5, &q), &q));
    int bad = 0;
    for (int j = 0; j < DIM; j++) {
        float g5 = g[0 * DIM + j] + g[2 * DIM + j], g9 = g[1 * DIM + j] + g[4 * DIM + j], g60 = g[3 * DIM + j];
        bad += after[0 * DIM + j] != before[0 * DIM + j] - 0.5f * (g5 / 1.0f);
        bad += after[1 * DIM + j] != before[1 * DIM + j] - 0.5f * (g9 / 1.0f);
        bad += after[3 * DIM + j] != before[3 * DIM + j] - 0.5f * (g60 / 1.0f);
        bad += after[2 * DIM + j] != after[0 * DIM + j] || after[4 * DIM + j] != after[1 * DIM + j];
    }
    KT_CHECK(bad == 0, "%d values differ from one merged SGD step", bad);
    kvps_server_stats st0, st1;
    kvps_server_stats_get(c.srv[0], &st0);
    kvps_server_stats_get(c.srv[1], &st1);
    KT_CHECK(st0.table_rows + st1.table_rows == 3, "%llu rows held, 3 distinct ids", (unsigned long long)(st0.table_rows + st1.table_rows));
    kvps_worker_destroy(&w0);
    kvps_worker_destroy(&w1);
    kt_cluster_down(&c);
}

/* Adagrad and Adam per row: rows touched at different steps keep their own state */
static void test_row_optimizers_equal_reference(void) {
    kvps_optim os[2] = {{KVPS_RULE_ADAGRAD, 0.1f, 0, 0, 0, 1e-6f, 0}, {KVPS_RULE_ADAM, 0.05f, 0, 0.9f, 0.99f, 1e-7f, 0}};
    for (int c2 = 0; c2 < 2; c2++) {
        kt_cluster c;
        kt_cluster_up(&c, "inproc", 3, &(kvps_server_desc){.num_workers = 1});
        kvps_worker *w = connect_w(&c, 0);
        kvps_table t;
        kvps_req q;
        KT_OK(sync_req(w, kvps_worker_table(w, &(kvps_table_desc){.name = "opt", .dim = DIM, .opt = os[c2]}, &t, &q), &q));
        enum { R = 20, STEPS = 25 };
        float ref[R][DIM] = {{0}}, v[R][DIM] = {{0}}, m2[R][DIM] = {{0}}, b1t[R], b2t[R];
        for (int r = 0; r < R; r++) b1t[r] = b2t[r] = 1.0f;
        uint64_t seed = 3;
        for (int s = 0; s < STEPS; s++) {
            uint64_t ids[4];
            float g[4 * DIM];
            int n = 0;
            for (int r = 0; r < R; r++)
                if ((r * 7 + s) % 5 == 0 && n < 4) ids[n++] = (uint64_t)r * 1000003u;
            for (int i = 0; i < n * DIM; i++) g[i] = kt_randf(&seed);
            KT_OK(sync_req(w, kvps_worker_push_rows(w, t, ids, g, (size_t)n, &q), &q));
            for (int k = 0; k < n; k++) {
                int r = (int)(ids[k] / 1000003u);
                kt_optim_tick(&os[c2], &b1t[r], &b2t[r]);
                for (int j = 0; j < DIM; j++)
                    kt_optim_apply(&os[c2], &ref[r][j], &v[r][j], &m2[r][j], g[k * DIM + j], 1.0f, b1t[r], b2t[r]);
            }
        }
        uint64_t all[R];
        float got[R * DIM];
        for (int r = 0; r < R; r++) all[r] = (uint64_t)r * 1000003u;
        KT_OK(sync_req(w, kvps_worker_pull_rows(w, t, all, got, R, &q), &q));
        KT_CHECK(memcmp(got, ref, sizeof got) == 0, "%s: rows differ from the per-row reference", c2 ? "adam" : "adagrad");
        kvps_worker_destroy(&w);
        kt_cluster_down(&c);
    }
}

static void test_table_bad_input(void) {
    kt_cluster c;
    kt_cluster_up(&c, "inproc", 1, &(kvps_server_desc){.num_workers = 2});
    kvps_log_set_level(KVPS_LOG_NONE);
    kvps_worker *w0 = connect_w(&c, 0), *w1 = connect_w(&c, 1);
    kvps_table t, t2;
    kvps_req q;
    KT_OK(sync_req(w0, kvps_worker_table(w0, &(kvps_table_desc){.name = "bad", .dim = DIM}, &t, &q), &q));
    /* another worker registering the same table with another dim */
    KT_CHECK(sync_req(w1, kvps_worker_table(w1, &(kvps_table_desc){.name = "bad", .dim = 4}, &t2, &q), &q) == KVPS_ERR_TABLE, "dim conflict");
    /* out-of-range hyper-parameters */
    kvps_table t3;
    KT_CHECK(kvps_worker_table(w0, &(kvps_table_desc){.name = "hp", .dim = 4, .opt = {KVPS_RULE_SGD, -1, 0, 0, 0, 0, 0}}, &t3, &q) ==
                 KVPS_ERR_HYPERPARAM, "negative lr");
    KT_CHECK(kvps_worker_table(w0, &(kvps_table_desc){.name = "hp2", .dim = 4, .opt = {KVPS_RULE_ADAM, 0, 0, 1.0f, 0, 0, 0}}, &t3, &q) ==
                 KVPS_ERR_HYPERPARAM, "beta1 = 1");
    KT_CHECK(kvps_worker_pull_rows(w0, 77, (uint64_t[]){1}, (float[DIM]){0}, 1, &q) == KVPS_ERR_TABLE, "unknown table handle");
    /* raw messages: an unknown table id, and rows of the wrong dim */
    uint64_t id1 = 1;
    float row[DIM], before[DIM], after[DIM];
    KT_OK(sync_req(w0, kvps_worker_pull_rows(w0, t, &id1, before, 1, &q), &q));
    void *d = zmq_socket(c.ctx, ZMQ_DEALER);
    zmq_connect(d, c.servers);
    struct { uint64_t table; uint32_t dim; kvps_result want; } cases[] = {
        {kvps__fnv1a("nope"), DIM, KVPS_ERR_TABLE}, {kvps__fnv1a("bad"), DIM - 1, KVPS_ERR_LEN_MISMATCH}};
    for (int i = 0; i < 2; i++) {
        kvps__hdr h = KT_HDR(.op = KVPS__OP_PUSH_ROWS, .nkeys = 1, .req_id = 5);
        unsigned char meta[32 + 16 + 8];
        uint32_t zero = 0;
        memcpy(meta, &h, 32);
        memcpy(meta + 32, &cases[i].table, 8);
        memcpy(meta + 40, &cases[i].dim, 4);
        memcpy(meta + 44, &zero, 4);
        memcpy(meta + 48, &id1, 8);
        for (int j = 0; j < DIM; j++) row[j] = 100.0f;
        int32_t st = kt_raw_status(d, meta, sizeof meta, row, cases[i].dim * sizeof(float), 2000);
        KT_CHECK(st == cases[i].want, "case %d: %s", i, kvps_result_str((kvps_result)st));
    }
    zmq_close(d);
    KT_OK(sync_req(w0, kvps_worker_pull_rows(w0, t, &id1, after, 1, &q), &q));
    KT_CHECK(memcmp(before, after, sizeof before) == 0, "a rejected push changed a row");
    kvps_worker_destroy(&w0);
    kvps_worker_destroy(&w1);
    kt_cluster_down(&c);
    kvps_log_set_level(KVPS_LOG_WARN);
}

static void test_memory_per_row(void) {
    /* 64-dim rows: values are 256 B; with the index the server holds at most 1.5x that */
    kt_cluster c;
    kt_cluster_up(&c, "inproc", 1, &(kvps_server_desc){.num_workers = 1});
    kvps_worker *w = connect_w(&c, 0);
    kvps_table t;
    kvps_req q;
    KT_OK(sync_req(w, kvps_worker_table(w, &(kvps_table_desc){.name = "mem", .dim = 64}, &t, &q), &q));
    enum { BATCH = 4096 };
    size_t total = kt_quick() ? 20000 : 200000;
    static uint64_t ids[BATCH];
    static float rows[BATCH * 64];
    for (size_t b = 0; b < total; b += BATCH) {
        for (int i = 0; i < BATCH; i++) ids[i] = kvps__mix64(b + (size_t)i); /* any ids */
        KT_OK(sync_req(w, kvps_worker_pull_rows(w, t, ids, rows, BATCH, &q), &q));
    }
    kvps_server_stats st;
    kvps_server_stats_get(c.srv[0], &st);
    double per_row = (double)st.table_bytes / (double)st.table_rows;
    KT_CHECK(st.table_rows >= total && per_row <= 1.5 * 256, "%llu rows, %.1f bytes per row", (unsigned long long)st.table_rows, per_row);
    kvps_worker_destroy(&w);
    kt_cluster_down(&c);
}

int main(void) {
    kvps_log_set_level(KVPS_LOG_ERROR);
    KT_RUN(test_lazy_rows_same_everywhere);
    KT_RUN(test_push_merges_duplicates);
    KT_RUN(test_row_optimizers_equal_reference);
    KT_RUN(test_table_bad_input);
    KT_RUN(test_memory_per_row);
    return kt_finish();
}
