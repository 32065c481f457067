/* test_join - the parameter server's join and scalar all-reduce (kvps.h, CONSISTENCY AND UPDATE
   RULES): 3 workers under BSP with uneven amounts of data (worker r runs 6 + 4 r steps of
   pushpull with SGD on 2 servers, a barrier every 3 steps, a scalar all-reduce of a "loss" each
   step), then join; every weight each worker gets back is checked bit for bit against a
   sequential oracle over the workers present in each round (SGD divides by their number), every
   scalar against the naive sum / mean over them; a joined worker's push and scalar all-reduce are
   refused; the servers,
   made without .keep_serving, stop by themselves (CLEAN FINISH) once every worker has finished.
   Then the scalar all-reduce's ops and its mismatch on its own. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"

enum { M = 3, N = 37, NS = 2 };
static const float LR = 0.1f;

static int steps_of(int r) { return 6 + 4 * r; }
static float grad(int r, int s, int i) { return (float)((i * 7 + s * 3 + r * 5) % 17 - 8) / 8.0f; }
static double loss(int r, int s) { return 0.25 * (double)(r + 1) + (double)s; }

/* The weights after round s (w0 = 0.5), SGD over the workers present in each round, in rank order. */
static void oracle(float *w, int upto) {
    kvps_optim o = {KVPS_RULE_SGD, LR, 0, 0, 0, 0, 0};
    for (int i = 0; i < N; i++) w[i] = 0.5f;
    for (int s = 0; s <= upto; s++) {
        int n = 0;
        for (int r = 0; r < M; r++) n += steps_of(r) > s;
        for (int i = 0; i < N; i++) {
            float sum = 0;
            int first = 1;
            for (int r = 0; r < M; r++)
                if (steps_of(r) > s) { sum = first ? grad(r, s, i) : sum + grad(r, s, i); first = 0; }
            kt_optim_apply(&o, &w[i], NULL, NULL, sum, (float)n, 1, 1);
        }
    }
}

static void join_worker(kt_wk *x) {
    kvps_worker *w = NULL;
    kvps_tensor t = 0;
    kvps_req q = 0;
    float g[N], got[N], ref[N];
    kvps_optim o = {KVPS_RULE_SGD, LR, 0, 0, 0, 0, 0};
    kvps_result r = kvps_worker_create(&(kvps_worker_desc){.servers = x->ws->servers, .rank = x->rank, .num_workers = M,
                                                            .zmq_ctx = x->ws->ctx, .min_slice = 8}, &w);
    if (r == KVPS_OK) r = kvps_worker_tensor(w, "w", N, &t);
    if (r == KVPS_OK && x->rank == 0) {
        for (int i = 0; i < N; i++) g[i] = 0.5f;
        r = kvps_worker_tensor_optim(w, t, &o, &q);
        if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
        if (r == KVPS_OK) r = kvps_worker_init_tensor(w, t, g, &q);
        if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
    }
    if (r == KVPS_OK) r = kvps_worker_barrier(w, &q);
    if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
    for (int s = 0; s < steps_of(x->rank) && r == KVPS_OK; s++) {
        for (int i = 0; i < N; i++) g[i] = grad(x->rank, s, i);
        r = kvps_worker_pushpull_tensor(w, t, g, got, &q);
        if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
        if (r != KVPS_OK) break;
        oracle(ref, s);
        int bad = 0;
        for (int i = 0; i < N; i++) bad += memcmp(&got[i], &ref[i], sizeof(float)) != 0;
        if (bad) kt_wk_fail(x, "step %d: %d of %d weights differ from the oracle (w[0] %.9g, want %.9g)", s, bad, N, got[0], ref[0]);
        double sum = loss(x->rank, s), mean = sum, want = 0;
        int n = 0;
        for (int p = 0; p < M; p++)
            if (steps_of(p) > s) { want += loss(p, s); n++; }
        r = kvps_worker_allreduce_scalar(w, &sum, KVPS_SCALAR_SUM);
        if (r == KVPS_OK) r = kvps_worker_allreduce_scalar(w, &mean, KVPS_SCALAR_MEAN);
        if (r == KVPS_OK && (sum != want || mean != want / n))
            kt_wk_fail(x, "step %d: scalar sum %.17g mean %.17g, want %.17g %.17g (%d workers)", s, sum, mean, want, want / n, n);
        if (r == KVPS_OK && s % 3 == 2) {
            r = kvps_worker_barrier(w, &q);
            if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
        }
    }
    if (r == KVPS_OK) r = kvps_worker_join(w);
    if (r != KVPS_OK) kt_wk_fail(x, "%s %s", kvps_result_str(r), kvps_worker_last_error(w));
    if (r == KVPS_OK) { /* a joined worker pushes no more */
        kvps_result p = kvps_worker_push_tensor(w, t, g, &q);
        if (p == KVPS_OK) p = kvps_worker_wait(w, q, -1);
        if (p != KVPS_ERR_STATE || !strstr(kvps_worker_last_error(w), "has joined"))
            kt_wk_fail(x, "push after join: %s [%s], want KVPS_ERR_STATE", kvps_result_str(p), kvps_worker_last_error(w));
        double y = 1; /* nor takes part in barriers */
        p = kvps_worker_allreduce_scalar(w, &y, KVPS_SCALAR_SUM);
        if (p != KVPS_ERR_STATE || !strstr(kvps_worker_last_error(w), "not allreduce"))
            kt_wk_fail(x, "allreduce_scalar after join: %s [%s], want KVPS_ERR_STATE", kvps_result_str(p), kvps_worker_last_error(w));
    }
    kvps_worker_destroy(&w);
}

static void test_join_bsp_uneven(void) {
    const char *tr[2] = {"inproc", "tcp"};
    for (int ti = 0; ti < 2; ti++) {
        void *ctx = zmq_ctx_new();
        kvps_server *srv[NS];
        char servers[512] = "";
        for (int i = 0; i < NS; i++) {
            char ep[64];
            if (ti == 0) snprintf(ep, sizeof ep, "inproc://join-%d", i);
            else snprintf(ep, sizeof ep, "tcp://127.0.0.1:*");
            KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = ep, .rank = i, .num_workers = M, .zmq_ctx = ctx}, &srv[i]));
            kvps_server_start(srv[i]);
            snprintf(servers + strlen(servers), sizeof servers - strlen(servers), "%s%s", i ? "," : "", kvps_server_endpoint(srv[i]));
        }
        kt_workers ws;
        kt_workers_init(&ws, tr[ti], join_worker, M, servers, ctx);
        kt_workers_run(&ws);
        for (int i = 0; i < NS; i++) { /* every worker finished: the servers stop by themselves */
            kvps_result rc = kvps_server_wait(srv[i], 20000);
            KT_CHECK(rc == KVPS_OK, "%s: server %d ended with %s", tr[ti], i, kvps_result_str(rc));
            kvps_server_destroy(&srv[i]);
        }
        zmq_ctx_term(ctx);
    }
}

/* Every op of the scalar all-reduce against the naive result; then workers that disagree. */
static void scalar_worker(kt_wk *x) {
    kvps_worker *w = NULL;
    kvps_result r = kvps_worker_create(&(kvps_worker_desc){.servers = x->ws->servers, .rank = x->rank, .num_workers = M,
                                                            .zmq_ctx = x->ws->ctx}, &w);
    static const double v[M] = {1.5, -7.25, 3e10};
    double want[KVPS_SCALAR_OP_COUNT] = {1.5 + -7.25 + 3e10, (1.5 + -7.25 + 3e10) / 3, -7.25, 3e10};
    for (int op = 0; op < KVPS_SCALAR_OP_COUNT && r == KVPS_OK; op++) {
        double x1 = v[x->rank];
        r = kvps_worker_allreduce_scalar(w, &x1, (kvps_scalar_op)op);
        if (r == KVPS_OK && x1 != want[op])
            kt_wk_fail(x, "%s: %.17g, want %.17g", kvps_scalar_op_name((kvps_scalar_op)op), x1, want[op]);
    }
    if (r != KVPS_OK) kt_wk_fail(x, "%s %s", kvps_result_str(r), kvps_worker_last_error(w));
    double y = 1;
    r = kvps_worker_allreduce_scalar(w, &y, x->rank == 1 ? KVPS_SCALAR_MAX : KVPS_SCALAR_SUM);
    if (r != KVPS_ERR_MISMATCH || !strstr(kvps_worker_last_error(w), "worker 0 called allreduce_scalar sum, worker 1 "
                                                                        "allreduce_scalar max"))
        kt_wk_fail(x, "ops that differ: %s [%s]", kvps_result_str(r), kvps_worker_last_error(w));
    if (kvps_worker_allreduce_scalar(w, &y, (kvps_scalar_op)9) != KVPS_ERR_INVALID_ARG) kt_wk_fail(x, "op 9 accepted");
    kvps_worker_destroy(&w);
}

static void test_allreduce_scalar(void) {
    kt_cluster c;
    if (kt_cluster_up(&c, "inproc", 2, &(kvps_server_desc){.num_workers = M}) != 0) { KT_CHECK(0, "cluster"); return; }
    kt_workers ws;
    kt_workers_init(&ws, "scalar", scalar_worker, M, c.servers, c.ctx);
    kt_workers_run(&ws);
    kt_cluster_down(&c);
}

int main(void) {
    kvps_log_set_level(KVPS_LOG_ERROR);
    KT_RUN(test_allreduce_scalar, 60);
    KT_RUN(test_join_bsp_uneven, 120);
    return kt_finish();
}
