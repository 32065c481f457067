/* test_ring_coll - the collectives of kvps_ring.h against naive oracles (tests/kt_coll.h): every
   collective, dtype and op for 1..8 ranks as threads on inproc:// (one shared context) with
   forced algorithms, small pipeline pieces and in-place variants, and hierarchical groups; 2, 3,
   4 and 8 ranks as processes on loopback TCP that meet through kvps_ring_rendezvous; a 64 MB
   all-reduce over TCP; kvps_reduce_into against a scalar reference. Failures and mismatches:
   test_ring_faults; API, descs and environment: test_ring_api; zero-copy and in-place forms:
   test_ring_zc. */
#define KVPS_IMPLEMENTATION
#include "kvps.h" /* kt_run_procs: the ranks meet through a kvps server */
#include "kvps_ring.h"
#include "tests/kvps_test.h"
#include "tests/kt_coll.h"
#include <signal.h>

/* ---------------------------------------------------------------------------------------- */
/* The matrix */

typedef struct suite_cfg {
    kvps_ring_algo algos[7];
    int nalgo;
    int others;   /* run the other collectives too */
    int thin;     /* quick mode: a stride through the dtype x op x count cross product */
} suite_cfg;

/* Every dtype x op x count x algorithm x placement for all-reduce; every root for the rooted
   collectives. Quick mode takes every thin-th combination. */
static void suite_main(kt_rk *x) {
    const suite_cfg *c = (const suite_cfg *)x->t->arg;
    int k = x->k, th = c->thin ? c->thin : 1;
    size_t counts[6] = {0, 1, (size_t)k - 1, (size_t)k + 1, 13, 1031};
    long it = 0;
    for (int dt = 0; dt < 6; dt++)
        for (int op = 0; op < 5; op++)
            for (int ci = 0; ci < 6; ci++)
                for (int ai = 0; ai < c->nalgo; ai++)
                    for (int place = 0; place < 3; place++)
                        if (it++ % th == 0) t_allreduce(x, (kvps_dtype)dt, (kvps_redop)op, counts[ci], c->algos[ai], place);
    if (!c->others) return;
    for (int dt = 0; dt < 6; dt++)
        for (int op = 0; op < 5; op++)
            for (int ci = 0; ci < 6; ci++) {
                for (int root = 0; root < k; root++)
                    if (it++ % th == 0) t_reduce(x, (kvps_dtype)dt, (kvps_redop)op, counts[ci], root, (dt + op + ci + root) % 3);
                for (int place = 0; place < 3; place++)
                    if (it++ % th == 0) t_reduce_scatter(x, (kvps_dtype)dt, (kvps_redop)op, counts[ci], place);
            }
    for (int dt = 0; dt < 6; dt++)
        for (int ci = 0; ci < 6; ci++)
            for (int place = 0; place < 4; place++) {
                size_t n = counts[ci];
                if (it++ % th == 0) t_allgather(x, (kvps_dtype)dt, n, place);
                if (place < 3 && it++ % th == 0) t_alltoall(x, (kvps_dtype)dt, n, place);
                for (int root = 0; root < k; root++) {
                    if (place < 3 && it++ % th == 0) t_broadcast(x, (kvps_dtype)dt, n, root, place);
                    if (it++ % th == 0) t_gather(x, (kvps_dtype)dt, n, root, place);
                    if (place < 3 && it++ % th == 0) t_scatter(x, (kvps_dtype)dt, n, root, place);
                }
            }
    t_barrier(x, 4);
}

static int run_suite(const char *label, int k, const suite_cfg *c, size_t chunk, size_t small, const int *groups) {
    kt_team t;
    kt_team_init(&t, label, suite_main, k, 0, kt_quick() ? 60000 : 20000);
    t.arg = c;
    t.base.chunk_bytes = chunk;
    t.base.small_bytes = small;
    t.base.groups = groups;
    return kt_team_run(&t);
}

static int matrix_size_included(int k) { return !kt_quick() || k <= 3 || k == 5 || k == 8; }

/* Default pieces (RD for everything here under AUTO; trees for reduce and broadcast). */
static void test_matrix_default(void) {
    suite_cfg c = {{KVPS_ALGO_AUTO, KVPS_ALGO_RING, KVPS_ALGO_BIRING, KVPS_ALGO_RD, KVPS_ALGO_RHD, KVPS_ALGO_DIRECT, KVPS_ALGO_ONESHOT}, 7, 1, kt_quick() ? 5 : 0};
    for (int k = 1; k <= KT_MAXR; k++)
        if (matrix_size_included(k)) run_suite("default", k, &c, 0, 0, NULL);
}

/* 64-byte pieces and a 256-byte small limit: many pieces per block, AUTO picks the ring
   algorithms, reduce and broadcast take their large-message paths. */
static void test_matrix_pipelined(void) {
    suite_cfg c = {{KVPS_ALGO_AUTO, KVPS_ALGO_RING, KVPS_ALGO_BIRING, KVPS_ALGO_RD, KVPS_ALGO_RHD, KVPS_ALGO_DIRECT, KVPS_ALGO_ONESHOT}, 7, 1, kt_quick() ? 11 : 0};
    for (int k = 1; k <= KT_MAXR; k++)
        if (matrix_size_included(k)) run_suite("pipelined", k, &c, 64, 256, NULL);
}

/* Hierarchical: groups {0,0,1,1,2,2,2,3} (cut to the size) and alternating groups; forced HIER
   and AUTO (which picks HIER at every size), with small and large inner messages. */
static void test_matrix_hier(void) {
    suite_cfg c = {{KVPS_ALGO_HIER, KVPS_ALGO_AUTO}, 2, 0, kt_quick() ? 5 : 0};
    for (int k = 1; k <= KT_MAXR; k++) {
        if (!matrix_size_included(k)) continue;
        run_suite("hier", k, &c, 64, 256, GROUPS8);
        if (k == 4 || k == 7) run_suite("hier-alternating", k, &c, 0, 0, GROUPS_ALT);
    }
    suite_cfg one = {{KVPS_ALGO_HIER}, 1, 0, kt_quick() ? 7 : 3};
    run_suite("hier-1-piece-per-element", 5, &one, 1, 1, GROUPS8);
}

/* ---------------------------------------------------------------------------------------- */
/* 64 MB: 16M float32 on 4 ranks over loopback TCP. Small integers, so the sum is exact. */

static size_t big_n(void) { return kt_quick() ? (size_t)1 << 20 : (size_t)16 << 20; }
static float big_val(int r, size_t i) { return (float)((int)(((uint32_t)i * 2654435761u + (uint32_t)r * 40503u) >> 27) - 16); }

static void big_main(kt_rk *x) {
    size_t n = big_n();
    float *b = (float *)kt_xmalloc(n * sizeof *b);
    for (size_t i = 0; i < n; i++) b[i] = big_val(x->rank, i);
    int64_t t0 = kvps__now_ms();
    if (kt_rk_call(x, kvps_ring_allreduce(x->r, NULL, b, n, KVPS_FLOAT32, KVPS_SUM), "64 MB allreduce")) {
        x->ms1 = kvps__now_ms() - t0;
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int r = 0; r < x->k; r++) want += big_val(r, i);
            if (b[i] != want && bad++ == 0) kt_rk_fail(x, "64 MB allreduce: [%zu] = %g, want %g", i, b[i], want);
        }
        if (bad) kt_rk_fail(x, "64 MB allreduce: %zu wrong", bad);
        kt_rk_hash(x, b, n * sizeof *b);
    }
    free(b);
}

static void test_64mb_tcp(void) {
    kt_team t;
    kt_team_init(&t, "64MB-tcp", big_main, 4, 1, 120000);
    kt_team_run(&t);
    printf("  info: all-reduce of %zu MB float32 on 4 ranks over loopback TCP: %lld ms\n", big_n() * 4 >> 20,
           (long long)t.ranks[0].ms1);
}

static void proc_suite(kt_rk *x) {
    int k = x->k;
    size_t counts[5] = {0, 1, (size_t)k + 1, 1031, 65537};
    int it = 0, th = kt_quick() ? 7 : 1;
    for (int dt = 0; dt < 6; dt++)
        for (int op = 0; op < 5; op++)
            for (int ci = 0; ci < 5; ci++)
                if (it++ % th == 0)
                    t_allreduce(x, (kvps_dtype)dt, (kvps_redop)op, counts[ci], KVPS_ALGO_AUTO, (dt + op + ci) % 3);
    t_allreduce(x, KVPS_FLOAT32, KVPS_SUM, 300007, KVPS_ALGO_RING, 0);
    t_allreduce(x, KVPS_INT32, KVPS_SUM, 1031, KVPS_ALGO_RD, 1);
    for (int ci = 0; ci < 5; ci++) {
        size_t n = counts[ci];
        t_reduce(x, KVPS_FLOAT32, KVPS_SUM, n, k - 1, ci % 3);
        t_reduce_scatter(x, KVPS_INT64, KVPS_SUM, n / 4 + 1, ci % 3);
        t_allgather(x, KVPS_FLOAT16, n, ci % 4);
        t_broadcast(x, KVPS_FLOAT64, n, ci % k, ci % 3);
        t_gather(x, KVPS_INT32, n / 4, (ci + 1) % k, ci % 4);
        t_scatter(x, KVPS_BFLOAT16, n / 4, (ci + 2) % k, ci % 3);
        t_alltoall(x, KVPS_FLOAT32, n / 8, ci % 3);
        if (!x->dead) kt_rk_call(x, kvps_ring_barrier(x->r), "barrier");
    }
}

static void test_processes_tcp(void) {
    int sizes[4] = {2, 3, 8, 4};
    for (int i = 0; i < (kt_quick() ? 3 : 4); i++) kt_run_procs(sizes[i], proc_suite, 30000, 120, -1);
}

/* ---------------------------------------------------------------------------------------- */
/* kvps_reduce_into against a scalar reference */

/* One step of each op, NaN on either side propagating: the same code for float and double. */
#define REF_OP(T)                                                                                 \
    static T ref_op_##T(T a, T b, kvps_redop op) {                                                \
        if (a != a || b != b) return a != a ? a : b;                                              \
        switch (op) {                                                                             \
        case KVPS_PROD: return a * b;                                                             \
        case KVPS_MIN: return b < a ? b : a;                                                      \
        case KVPS_MAX: return b > a ? b : a;                                                      \
        default: return a + b;                                                                    \
        }                                                                                         \
    }
REF_OP(float)
REF_OP(double)

static void test_reduce_into(void) {
    enum { N = 37 };
    uint64_t s = 99;
    for (int dt = 0; dt < 6; dt++)
        for (int op = 0; op < 5; op++) {
            size_t es = kvps_dtype_size((kvps_dtype)dt);
            unsigned char dst[N * 8], src[N * 8], want[N * 8];
            for (size_t i = 0; i < N; i++) {
                uint64_t a = kt_rng(&s), b = kt_rng(&s);
                float fa = kt_randf(&s) * 4, fb = kt_randf(&s) * 4;
                double da = (double)kt_randf(&s) * 1e3, db = (double)kt_randf(&s) * 1e-3;
                if (i == 3) fa = NAN, da = NAN;        /* NaN on either side propagates (min, max; sums anyway) */
                if (i == 4) fb = NAN, db = NAN;
                if (i == 5) fa = fb = 0.5f, da = db = 7; /* ties */
                if (i == 6) { a = (uint64_t)INT64_MIN; b = (uint64_t)-1; fa = 65504.0f; fb = 65504.0f; } /* overflow: wrap, inf */
                if (i == 7) { a = 0x7fffffffull; b = 0x7fffffffull; }
                switch (dt) {
                case KVPS_FLOAT32: memcpy(dst + i * 4, &fa, 4); memcpy(src + i * 4, &fb, 4); break;
                case KVPS_FLOAT64: memcpy(dst + i * 8, &da, 8); memcpy(src + i * 8, &db, 8); break;
                case KVPS_INT32: { uint32_t a32 = (uint32_t)a, b32 = (uint32_t)b; memcpy(dst + i * 4, &a32, 4); memcpy(src + i * 4, &b32, 4); break; }
                case KVPS_INT64: memcpy(dst + i * 8, &a, 8); memcpy(src + i * 8, &b, 8); break;
                case KVPS_FLOAT16: { uint16_t ha = kvps_f32_to_f16(fa), hb = kvps_f32_to_f16(fb); memcpy(dst + i * 2, &ha, 2); memcpy(src + i * 2, &hb, 2); break; }
                default: { uint16_t ha = kvps_f32_to_bf16(fa), hb = kvps_f32_to_bf16(fb); memcpy(dst + i * 2, &ha, 2); memcpy(src + i * 2, &hb, 2); break; }
                }
            }
            /* scalar reference */
            for (size_t i = 0; i < N; i++) {
                const unsigned char *pa = dst + i * es, *pb = src + i * es;
                unsigned char *pw = want + i * es;
                if (dt == KVPS_INT32 || dt == KVPS_INT64) {
                    int64_t va, vb;
                    if (dt == KVPS_INT32) { int32_t x, y; memcpy(&x, pa, 4); memcpy(&y, pb, 4); va = x; vb = y; }
                    else { memcpy(&va, pa, 8); memcpy(&vb, pb, 8); }
                    uint64_t w;
                    switch (op) {
                    case KVPS_PROD: w = (uint64_t)va * (uint64_t)vb; break;
                    case KVPS_MIN: w = (uint64_t)(va < vb ? va : vb); break;
                    case KVPS_MAX: w = (uint64_t)(va > vb ? va : vb); break;
                    default: w = (uint64_t)va + (uint64_t)vb; break;
                    }
                    if (dt == KVPS_INT32) { uint32_t w32 = (uint32_t)w; memcpy(pw, &w32, 4); }
                    else memcpy(pw, &w, 8);
                } else if (dt == KVPS_FLOAT32) {
                    float x, y, w;
                    memcpy(&x, pa, 4); memcpy(&y, pb, 4);
                    w = ref_op_float(x, y, (kvps_redop)op);
                    memcpy(pw, &w, 4);
                } else if (dt == KVPS_FLOAT64) {
                    double x, y, w;
                    memcpy(&x, pa, 8); memcpy(&y, pb, 8);
                    w = ref_op_double(x, y, (kvps_redop)op);
                    memcpy(pw, &w, 8);
                } else {
                    uint16_t x, y, w;
                    memcpy(&x, pa, 2); memcpy(&y, pb, 2);
                    int h = dt == KVPS_FLOAT16;
                    float fx = h ? kvps_f16_to_f32(x) : kvps_bf16_to_f32(x), fy = h ? kvps_f16_to_f32(y) : kvps_bf16_to_f32(y);
                    float fw = ref_op_float(fx, fy, (kvps_redop)op);
                    w = h ? kvps_f32_to_f16(fw) : kvps_f32_to_bf16(fw);
                    memcpy(pw, &w, 2);
                }
            }
            unsigned char src_copy[N * 8];
            memcpy(src_copy, src, N * es);
            kvps_reduce_into(dst, src, N, (kvps_dtype)dt, (kvps_redop)op);
            KT_CHECK(memcmp(src, src_copy, N * es) == 0, "%s %s: src modified", DT_NAME[dt], OP_NAME[op]);
            for (size_t i = 0; i < N; i++) {
                int same = memcmp(dst + i * es, want + i * es, es) == 0;
                if (!same && dt != KVPS_INT32 && dt != KVPS_INT64) {
                    /* NaN == NaN whatever the payload */
                    val g = load_val((kvps_dtype)dt, dst, i), w = load_val((kvps_dtype)dt, want, i);
                    same = g.f != g.f && w.f != w.f;
                }
                KT_CHECK(same, "%s %s [%zu]: differs from the scalar reference", DT_NAME[dt], OP_NAME[op], i);
                if (!same) break;
            }
        }
    /* NaN propagates through min and max in both positions, every float dtype */
    float fn = NAN, one = 1.0f;
    for (int op = KVPS_MIN; op <= KVPS_MAX; op++) {
        float a = fn, b = one;
        kvps_reduce_into(&a, &b, 1, KVPS_FLOAT32, (kvps_redop)op);
        KT_CHECK(a != a, "f32 %s(NaN, 1) = %g", OP_NAME[op], a);
        a = one; b = fn;
        kvps_reduce_into(&a, &b, 1, KVPS_FLOAT32, (kvps_redop)op);
        KT_CHECK(a != a, "f32 %s(1, NaN) = %g", OP_NAME[op], a);
        double da = 1, db = NAN;
        kvps_reduce_into(&da, &db, 1, KVPS_FLOAT64, (kvps_redop)op);
        KT_CHECK(da != da, "f64 %s(1, NaN) = %g", OP_NAME[op], da);
        uint16_t ha = 0x3c00, hb = 0x7e00;
        kvps_reduce_into(&ha, &hb, 1, KVPS_FLOAT16, (kvps_redop)op);
        KT_CHECK((ha & 0x7c00) == 0x7c00 && (ha & 0x3ff), "f16 %s(1, NaN) = %04x", OP_NAME[op], ha);
        ha = 0x7e00; hb = 0x3c00;
        kvps_reduce_into(&ha, &hb, 1, KVPS_FLOAT16, (kvps_redop)op);
        KT_CHECK((ha & 0x7c00) == 0x7c00 && (ha & 0x3ff), "f16 %s(NaN, 1) = %04x", OP_NAME[op], ha);
        ha = 0x3f80; hb = 0x7fc0;
        kvps_reduce_into(&ha, &hb, 1, KVPS_BFLOAT16, (kvps_redop)op);
        KT_CHECK((ha & 0x7f80) == 0x7f80 && (ha & 0x7f), "bf16 %s(1, NaN) = %04x", OP_NAME[op], ha);
    }
    /* 16-bit steps round to nearest even: 2048 + 1 in f16 is 2048; 1 + 2^-11 ties to 1 */
    uint16_t h1 = kvps_f32_to_f16(2048.0f), h2 = kvps_f32_to_f16(1.0f);
    kvps_reduce_into(&h1, &h2, 1, KVPS_FLOAT16, KVPS_SUM);
    KT_CHECK(kvps_f16_to_f32(h1) == 2048.0f, "f16 2048 + 1 = %g", kvps_f16_to_f32(h1));
    uint16_t b1 = kvps_f32_to_bf16(256.0f), b2 = kvps_f32_to_bf16(1.0f);
    kvps_reduce_into(&b1, &b2, 1, KVPS_BFLOAT16, KVPS_SUM);
    KT_CHECK(kvps_bf16_to_f32(b1) == 256.0f, "bf16 256 + 1 = %g", kvps_bf16_to_f32(b1));
    /* an empty reduction touches nothing */
    kvps_reduce_into(NULL, NULL, 0, KVPS_FLOAT32, KVPS_SUM);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    kvps_log_set_level(KVPS_LOG_ERROR);
    int64_t t0 = kvps__now_ms();
    KT_RUN(test_processes_tcp, 300);
    KT_RUN(test_reduce_into, 60);
    KT_RUN(test_matrix_default, 240);
    KT_RUN(test_matrix_pipelined, 240);
    KT_RUN(test_matrix_hier, 240);
    KT_RUN(test_64mb_tcp, 120);
    printf("  info: test_ring_coll took %.1f s\n", (double)(kvps__now_ms() - t0) / 1000.0);
    return kt_finish();
}
