/* Compressed collectives: float32 all-reduce with fp16/bf16 on the wire, and the top-k sparse
   all-reduce, for 1..6 ranks as threads on inproc (kvps_test.h's team). */
#define KVPS_IMPLEMENTATION
#include "kvps_ring.h"
#include "tests/kvps_test.h"
#include <math.h>

enum { MAXK = 6 };

/* k ranks as threads (kvps_test.h's team), 4 KiB pipeline pieces; the number of ranks that failed. */
static int run_ranks(int k, void (*body)(kt_rk *)) {
    kt_team t;
    kt_team_init(&t, "compressed all-reduce", body, k, 0, 20000);
    t.base.chunk_bytes = 4096;
    return kt_team_run(&t);
}

static float input_at(int rank, size_t i) {
    uint64_t s = ((uint64_t)rank << 40) ^ i;
    return kt_randf(&s);
}

/* results of every rank, to compare bits across ranks */
static float *g_out[MAXK];
static size_t g_n;
static int g_wire, g_algo;

static void wire_body(kt_rk *x) {
    float *v = g_out[x->rank];
    for (size_t i = 0; i < g_n; i++) v[i] = input_at(x->rank, i);
    kvps_ring_op op = {.coll = KVPS_COLL_ALLREDUCE, .send = v, .recv = v, .count = g_n, .dtype = KVPS_FLOAT32,
                       .op = KVPS_SUM, .algo = (kvps_ring_algo)g_algo, .wire = (kvps_dtype)g_wire};
    kt_rk_call(x, kvps_ring_run(x->r, &op), "all-reduce with a 16-bit wire");
}

static void test_wire_allreduce(void) {
    size_t ns[] = {0, 1, 7, 1000, 70001};
    int algos[] = {KVPS_ALGO_RING, KVPS_ALGO_BIRING, KVPS_ALGO_RD, KVPS_ALGO_AUTO, KVPS_ALGO_RHD};
    int wires[] = {KVPS_FLOAT16, KVPS_BFLOAT16};
    for (int w = 0; w < 2; w++)
        for (int a = 0; a < 5; a++)
            for (int k = 1; k <= MAXK; k++)
                for (size_t c = 0; c < sizeof ns / sizeof *ns; c++) {
                    if (kt_quick() && ns[c] > 1000) continue;
                    g_n = ns[c];
                    g_wire = wires[w];
                    g_algo = algos[a];
                    for (int i = 0; i < k; i++) g_out[i] = (float *)malloc((g_n ? g_n : 1) * sizeof(float));
                    int f = run_ranks(k, wire_body);
                    KT_CHECK(f == 0, "wire %d algo %d k=%d n=%zu: %d ranks failed", g_wire, g_algo, k, g_n, f);
                    /* same bits everywhere; close to the exact sum */
                    double eps = g_wire == KVPS_FLOAT16 ? ldexp(1, -10) : ldexp(1, -7);
                    int diff = 0, far = 0;
                    for (size_t i = 0; i < g_n; i++) {
                        double exact = 0, mag = 0;
                        for (int q = 0; q < k; q++) { exact += input_at(q, i); mag += fabs(input_at(q, i)); }
                        for (int q = 1; q < k; q++) diff += memcmp(&g_out[q][i], &g_out[0][i], 4) != 0;
                        far += fabs(g_out[0][i] - exact) > (k + 1) * eps * mag;
                    }
                    KT_CHECK(diff == 0, "wire %d algo %d k=%d n=%zu: %d elements differ between ranks", g_wire, g_algo, k, g_n, diff);
                    KT_CHECK(far == 0, "wire %d algo %d k=%d n=%zu: %d elements too far from the sum", g_wire, g_algo, k, g_n, far);
                    for (int i = 0; i < k; i++) free(g_out[i]);
                }
}

/* top-k: oracle = each rank's kvps_topk of (x + residual), summed in rank order */
static size_t g_topk;
static float *g_resid[MAXK];

static void topk_body(kt_rk *x) {
    float *v = g_out[x->rank];
    for (int step = 0; step < 3; step++) {
        for (size_t i = 0; i < g_n; i++) v[i] = input_at(x->rank * 7 + step, i);
        if (!kt_rk_call(x, kvps_ring_allreduce_topk(x->r, v, g_n, g_topk, g_resid[x->rank]), "top-k all-reduce")) return;
    }
}

static void test_topk_allreduce(void) {
    size_t ns[] = {1, 10, 1000, 50000};
    for (int k = 1; k <= MAXK; k++)
        for (size_t c = 0; c < sizeof ns / sizeof *ns; c++) {
            g_n = ns[c];
            g_topk = g_n / 20 + 1;
            for (int i = 0; i < k; i++) {
                g_out[i] = (float *)malloc(g_n * sizeof(float));
                g_resid[i] = (float *)calloc(g_n, sizeof(float));
            }
            int f = run_ranks(k, topk_body);
            KT_CHECK(f == 0, "top-k k=%d n=%zu: %d ranks failed", k, g_n, f);
            /* replay the three steps in one process */
            float *want = (float *)calloc(g_n, sizeof(float)), *acc = (float *)malloc(g_n * sizeof(float));
            float *res[MAXK];
            uint32_t *idx = (uint32_t *)malloc(g_topk * 4);
            float *val = (float *)malloc(g_topk * 4);
            for (int q = 0; q < k; q++) res[q] = (float *)calloc(g_n, sizeof(float));
            for (int step = 0; step < 3; step++) {
                memset(want, 0, g_n * sizeof(float));
                for (int q = 0; q < k; q++) {
                    for (size_t i = 0; i < g_n; i++) acc[i] = input_at(q * 7 + step, i) + res[q][i];
                    kvps_topk(acc, g_n, g_topk, idx, val);
                    memcpy(res[q], acc, g_n * sizeof(float));
                    for (size_t j = 0; j < g_topk; j++) { res[q][idx[j]] = 0; want[idx[j]] += val[j]; }
                }
            }
            int bad = 0;
            for (int q = 0; q < k; q++) {
                bad += memcmp(g_out[q], want, g_n * sizeof(float)) != 0;
                bad += memcmp(g_resid[q], res[q], g_n * sizeof(float)) != 0;
            }
            KT_CHECK(bad == 0, "top-k k=%d n=%zu: %d results or residuals differ from the replay", k, g_n, bad);
            for (int q = 0; q < k; q++) { free(res[q]); free(g_out[q]); free(g_resid[q]); }
            free(want); free(acc); free(idx); free(val);
        }
}

/* top-k on sparse gradients (fewer non-zeros than k, the report's hang): each rank's 50
   non-zeros, small integers at rank-dependent places, are all sent, so the result is the naive
   sum exactly and every residual ends at zero. Under an alarm: a hang fails the test. */
static float sparse_at(int rank, int step, size_t i) {
    size_t period = g_n / 50;
    return i % period == (size_t)(rank * 7 + step) % period ? (float)(rank + 2 * step + 1) : 0.0f;
}
static void topk_sparse_body(kt_rk *x) {
    float *v = g_out[x->rank];
    for (int step = 0; step < 2; step++) {
        for (size_t i = 0; i < g_n; i++) v[i] = sparse_at(x->rank, step, i);
        if (!kt_rk_call(x, kvps_ring_allreduce_topk(x->r, v, g_n, g_topk, g_resid[x->rank]), "sparse top-k all-reduce")) return;
    }
}

static void test_topk_allreduce_sparse(void) {
    g_n = 100000;
    g_topk = g_n / 100; /* the default 1% */
    for (int k = 1; k <= MAXK; k++) {
        for (int i = 0; i < k; i++) {
            g_out[i] = (float *)malloc(g_n * sizeof(float));
            g_resid[i] = (float *)calloc(g_n, sizeof(float));
        }
        kt_alarm(120, "a top-k all-reduce of 50 non-zeros per rank, %d ranks", k);
        int f = run_ranks(k, topk_sparse_body);
        kt_alarm(0, NULL);
        KT_CHECK(f == 0, "sparse top-k k=%d: %d ranks failed", k, f);
        int bad = 0, left = 0;
        for (size_t i = 0; i < g_n; i++) {
            double want = 0;
            for (int q = 0; q < k; q++) want += sparse_at(q, 1, i);
            for (int q = 0; q < k; q++) { bad += g_out[q][i] != want; left += g_resid[q][i] != 0.0f; }
        }
        KT_CHECK(bad == 0 && left == 0, "sparse top-k k=%d: %d sums wrong, %d residuals non-zero", k, bad, left);
        for (int q = 0; q < k; q++) { free(g_out[q]); free(g_resid[q]); }
    }
}

static void test_wire_bad_args(void) {
    void *ctx = zmq_ctx_new();
    kvps_ring *r = NULL;
    KT_OK(kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 1, .peers = "inproc://rc-single", .zmq_ctx = ctx}, &r));
    double d = 1;
    float f = 1;
    KT_CHECK(kvps_ring_allreduce_wire(r, &f, &f, 1, KVPS_SUM, KVPS_INT32) == KVPS_ERR_INVALID_ARG, "wire must be fp16/bf16");
    kvps_ring_op op = {.coll = KVPS_COLL_ALLREDUCE, .send = &d, .recv = &d, .count = 1, .dtype = KVPS_FLOAT64, .wire = KVPS_FLOAT16};
    KT_CHECK(kvps_ring_run(r, &op) == KVPS_ERR_INVALID_ARG, "wire needs float32 data");
    op.coll = KVPS_COLL_BROADCAST;
    op.dtype = KVPS_FLOAT32;
    op.send = op.recv = &f;
    KT_CHECK(kvps_ring_run(r, &op) == KVPS_ERR_INVALID_ARG, "wire is for all-reduce");
    KT_CHECK(kvps_ring_allreduce_topk(r, &f, 1, 2, NULL) == KVPS_ERR_INVALID_ARG, "k > count");
    KT_OK(kvps_ring_allreduce_wire(r, &f, &f, 1, KVPS_SUM, KVPS_FLOAT16));
    kvps_ring_destroy(&r);
    zmq_ctx_term(ctx);
}

int main(void) {
    kvps_log_set_level(KVPS_LOG_ERROR);
    KT_RUN(test_wire_bad_args);
    KT_RUN(test_wire_allreduce);
    KT_RUN(test_topk_allreduce);
    KT_RUN(test_topk_allreduce_sparse);
    return kt_finish();
}
