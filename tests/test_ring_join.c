/* test_ring_join - kvps_ring_join (kvps_ring.h, section 11): ranks with uneven amounts of data.
   4 ranks, rank i runs 10 + 5 i steps of all-reduces (sum and avg of float32, min of int32, sum
   with bfloat16 on the wire) and
   a barrier every 4 steps, then joins; every rank's result at every step is checked against a
   naive oracle over the ranks still present (avg: their sum divided by their number), with
   every algorithm forced in turn and AUTO at a size where it picks the large-message ones, over
   shared memory and over TCP, in threads and (AUTO) in processes. Then: a collective a joined rank cannot shadow fails on every
   rank naming it and the joined rank; join on a ring made without .join is refused. */
#define KVPS_IMPLEMENTATION
#include "kvps.h" /* kt_run_procs: the rank processes meet through a kvps server */
#include "kvps_ring.h"
#include "tests/kvps_test.h"

enum { K = 4 };

typedef struct join_cfg {
    size_t n;
    kvps_ring_algo algo;
} join_cfg;

static int steps_of(int rank) { return 10 + 5 * rank; }

/* Rank r's input element e at step s: small integers, so float sums are exact in any order. */
static float in_f(int r, int s, size_t e) { return (float)((int)((e * 7 + (size_t)s * 13 + (size_t)r * 31) % 61) - 30); }
static int32_t in_i(int r, int s, size_t e) { return (int32_t)((e * 11 + (size_t)s * 5 + (size_t)r * 17) % 1001) - 500; }

static void join_main(kt_rk *x) {
    const join_cfg *c = (const join_cfg *)x->t->arg;
    size_t n = c->n;
    float *a = (float *)malloc(n * sizeof *a), *b = (float *)malloc(n * sizeof *b), *h = (float *)malloc(n * sizeof *h);
    int32_t *m = (int32_t *)malloc(n * sizeof *m);
    for (int s = 0; s < steps_of(x->rank) && !x->dead; s++) {
        int present = 0;
        for (int r = 0; r < K; r++) present += steps_of(r) > s;
        for (size_t e = 0; e < n; e++) { a[e] = b[e] = h[e] = in_f(x->rank, s, e); m[e] = in_i(x->rank, s, e); }
        if (!kt_rk_call(x, kvps_ring_allreduce(x->r, a, a, n, KVPS_FLOAT32, KVPS_SUM), "sum")) break;
        if (!kt_rk_call(x, kvps_ring_allreduce(x->r, b, b, n, KVPS_FLOAT32, KVPS_AVG), "avg")) break;
        if (!kt_rk_call(x, kvps_ring_allreduce(x->r, NULL, m, n, KVPS_INT32, KVPS_MIN), "min")) break;
        if (!kt_rk_call(x, kvps_ring_allreduce_wire(x->r, h, h, n, KVPS_SUM, KVPS_BFLOAT16), "sum, bf16 wire")) break;
        if (kvps_ring_joined(x->r, NULL, 0) != K - present)
            kt_rk_fail(x, "step %d: kvps_ring_joined says %d, want %d", s, kvps_ring_joined(x->r, NULL, 0), K - present);
        for (size_t e = 0; e < n; e++) {
            float sum = 0;
            int32_t mn = INT32_MAX;
            for (int r = 0; r < K; r++)
                if (steps_of(r) > s) { sum += in_f(r, s, e); if (in_i(r, s, e) < mn) mn = in_i(r, s, e); }
            if (a[e] != sum || b[e] != sum / (float)present || m[e] != mn || h[e] != sum) { /* (bf16 holds these sums) */
                kt_rk_fail(x, "step %d (%d ranks present) element %zu: sum %g avg %g min %d bf16-wire sum %g, want %g %g %d",
                           s, present, e, a[e], b[e], m[e], h[e], sum, sum / (float)present, mn);
                break;
            }
        }
        if (s % 4 == 3) kt_rk_call(x, kvps_ring_barrier(x->r), "barrier");
    }
    if (!x->dead && kt_rk_call(x, kvps_ring_join(x->r), "join")) {
        int who[K];
        int nj = kvps_ring_joined(x->r, who, K);
        if (nj != K || who[0] != 0 || who[3] != 3) kt_rk_fail(x, "after join: kvps_ring_joined says %d", nj);
        /* the ring is as before: one more all-reduce among all */
        for (size_t e = 0; e < n; e++) a[e] = (float)x->rank;
        if (kt_rk_call(x, kvps_ring_allreduce(x->r, a, a, n, KVPS_FLOAT32, KVPS_AVG), "avg after join") && a[0] != 1.5f)
            kt_rk_fail(x, "avg after join: %g, want 1.5", a[0]);
    }
    free(a); free(b); free(h); free(m);
}

static void run_join(const char *label, size_t n, kvps_ring_algo algo, int shm) {
    static const int groups[K] = {0, 0, 1, 1};
    join_cfg c = {n, algo};
    kt_team t;
    kt_team_init(&t, label, join_main, K, 1, kt_quick() ? 60000 : 20000);
    t.arg = &c;
    t.base.join = 1;
    t.base.algo = algo;
    t.base.shm = shm;
    if (algo == KVPS_ALGO_HIER) t.base.groups = groups;
    kt_team_run(&t);
}

static void test_join_every_algorithm(void) {
    static const kvps_ring_algo algos[] = {KVPS_ALGO_RD, KVPS_ALGO_RING, KVPS_ALGO_BIRING, KVPS_ALGO_RHD,
                                           KVPS_ALGO_HIER, KVPS_ALGO_DIRECT, KVPS_ALGO_ONESHOT};
    for (int shm = 1; shm >= -1; shm -= 2)
        for (size_t i = 0; i < sizeof algos / sizeof *algos; i++) {
            char label[64];
            snprintf(label, sizeof label, "join %s over %s", kvps_algo_name(algos[i]), shm > 0 ? "shm" : "tcp");
            run_join(label, 1000, algos[i], shm);
        }
}

static void test_join_auto_large(void) {
    run_join("join auto 1.2 MB over shm", 300000, KVPS_ALGO_AUTO, 1); /* DIRECT where it can run */
    run_join("join auto 1.2 MB over tcp", 300000, KVPS_ALGO_AUTO, -1); /* RHD */
}

/* The same as processes (kt_run_procs: shared memory between them; their rings are made by the
   harness, so .join is set here, on every rank before its first collective). */
static const join_cfg proc_cfg = {1000, KVPS_ALGO_AUTO};
static void proc_join_main(kt_rk *x) {
    x->r->desc.join = 1;
    x->t->arg = &proc_cfg;
    join_main(x);
}

static void test_join_processes(void) { kt_run_procs(K, proc_join_main, 30000, 120, -1); }

/* Rank 3 joins at once; the others call a broadcast: every rank fails, naming it and rank 3. */
static void refuse_main(kt_rk *x) {
    float v[4] = {1, 2, 3, 4};
    kvps_result rc = x->rank == 3 ? kvps_ring_join(x->r) : kvps_ring_broadcast(x->r, v, v, 4, KVPS_FLOAT32, 0);
    const char *e = kvps_ring_last_error(x->r);
    if (rc != KVPS_ERR_STATE || !strstr(e, "broadcast called while rank(s) 3 had joined"))
        kt_rk_fail(x, "rank %d: %s [%s], want KVPS_ERR_STATE naming broadcast and rank 3", x->rank, kvps_result_str(rc), e);
}

static void test_join_refuses_other_collectives(void) {
    kt_team t;
    kt_team_init(&t, "join refuses broadcast", refuse_main, K, 1, kt_quick() ? 60000 : 10000);
    t.base.join = 1;
    kt_team_run(&t);
}

static void nojoin_main(kt_rk *x) {
    kvps_result rc = kvps_ring_join(x->r);
    if (rc != KVPS_ERR_INVALID_ARG || !strstr(kvps_ring_last_error(x->r), ".join = 1"))
        kt_rk_fail(x, "join without .join: %s [%s]", kvps_result_str(rc), kvps_ring_last_error(x->r));
    kt_rk_call(x, kvps_ring_barrier(x->r), "barrier after a refused join"); /* the ring is as it was */
}

static void test_join_needs_the_flag(void) {
    kt_team t;
    kt_team_init(&t, "join without .join", nojoin_main, 2, 0, 10000);
    kt_team_run(&t);
}

int main(void) {
    kvps_log_set_level(KVPS_LOG_ERROR);
    KT_RUN(test_join_needs_the_flag, 60);
    KT_RUN(test_join_refuses_other_collectives, 60);
    KT_RUN(test_join_every_algorithm, 300);
    KT_RUN(test_join_auto_large, 200);
    KT_RUN(test_join_processes, 200);
    return kt_finish();
}
