/* Training a least-squares model through the servers. BSP with 4 workers must equal sequential
   mini-batch SGD bit for bit (the batch cut into 4 parts, part gradients summed in rank order,
   divided by 4); async must converge to the true weights. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"
#include <math.h>

enum { D = 17, N = 512, M = 4, PART = 8, T = 60 };
static float X[N][D], Y[N], WSTAR[D], W0[D];
static const float LR = 0.05f;

static void make_data(void) {
    uint64_t s = 12345;
    for (int j = 0; j < D; j++) { WSTAR[j] = kt_randf(&s); W0[j] = 0.1f * kt_randf(&s); }
    for (int i = 0; i < N; i++) {
        float dot = 0;
        for (int j = 0; j < D - 1; j++) { X[i][j] = kt_randf(&s); }
        X[i][D - 1] = 1.0f; /* bias */
        for (int j = 0; j < D; j++) dot += X[i][j] * WSTAR[j];
        Y[i] = dot + 0.01f * kt_randf(&s);
    }
}

/* Mean gradient of 0.5 (x.w - y)^2 over samples first..first+count-1 (wrapping). */
static void lsq_grad(const float *w, int first, int count, float *g) {
    for (int j = 0; j < D; j++) g[j] = 0;
    for (int k = 0; k < count; k++) {
        int i = (first + k) % N;
        float err = -Y[i];
        for (int j = 0; j < D; j++) err += X[i][j] * w[j];
        for (int j = 0; j < D; j++) g[j] += err * X[i][j];
    }
    for (int j = 0; j < D; j++) g[j] /= (float)count;
}

static double loss(const float *w) {
    double l = 0;
    for (int i = 0; i < N; i++) {
        double e = -Y[i];
        for (int j = 0; j < D; j++) e += (double)X[i][j] * w[j];
        l += 0.5 * e * e;
    }
    return l / N;
}

/* Worker x->rank: its weights after every step, traj[step] (its record, float[T][D]), for the
   steps in user (int). */
static void bsp_worker(kt_wk *x) {
    int steps = *(const int *)x->ws->user;
    float (*traj)[D] = (float (*)[D])x->mine;
    kvps_worker *w = NULL;
    kvps_req q = 0;
    kvps_tensor t = 0;
    float wt[D], g[D];
    kvps_result r = kvps_worker_create(&(kvps_worker_desc){.servers = x->ws->servers, .rank = x->rank, .num_workers = M,
                                                            .zmq_ctx = x->ws->ctx, .min_slice = 4},
                                       &w);
    if (r != KVPS_OK) { kt_wk_fail(x, "create: %s", kvps_result_str(r)); return; }
    kvps_worker_tensor(w, "lsq.w", D, &t);
    if (x->rank == 0) {
        kvps_worker_init_tensor(w, t, W0, &q);
        r = kvps_worker_wait(w, q, -1);
    }
    if (r == KVPS_OK && (r = kvps_worker_barrier(w, &q)) == KVPS_OK) r = kvps_worker_wait(w, q, -1);
    if (r == KVPS_OK && (r = kvps_worker_pull_tensor(w, t, wt, &q)) == KVPS_OK) r = kvps_worker_wait(w, q, -1);
    for (int s = 0; s < steps && r == KVPS_OK; s++) {
        lsq_grad(wt, s * M * PART + x->rank * PART, PART, g);
        if ((r = kvps_worker_pushpull_tensor(w, t, g, wt, &q)) == KVPS_OK) r = kvps_worker_wait(w, q, -1);
        memcpy(traj[s], wt, sizeof wt);
    }
    if (r != KVPS_OK) kt_wk_fail(x, "%s %.100s", kvps_result_str(r), kvps_worker_last_error(w));
    kvps_worker_destroy(&w);
}

/* M workers, `steps` steps each; worker r's trajectory to traj[r]. A worker that failed is
   reported. */
static void run_cluster(const char *label, kvps_consistency mode, int steps, float (*traj)[T][D]) {
    kt_cluster c;
    kt_cluster_up(&c, "inproc", 2,
                  &(kvps_server_desc){.num_workers = M, .consistency = mode, .update = KVPS_UPDATE_SGD, .lr = LR});
    memset(traj, 0, M * sizeof *traj);
    kt_workers ws;
    kt_workers_init(&ws, label, bsp_worker, M, c.servers, c.ctx);
    ws.user = &steps;
    ws.each = traj;
    ws.each_size = sizeof *traj;
    kt_workers_run(&ws);
    kt_cluster_down(&c);
}

static float g_traj[M][T][D];

static void test_bsp_equals_sequential_sgd(void) {
    float w[D], g[D], sum[D];
    memcpy(w, W0, sizeof w);
    run_cluster("BSP", KVPS_BSP, T, g_traj);
    int mismatches = 0;
    for (int s = 0; s < T; s++) {
        /* the oracle: one process, the batch's four parts in rank order */
        for (int r = 0; r < M; r++) {
            lsq_grad(w, s * M * PART + r * PART, PART, g);
            if (r == 0) memcpy(sum, g, sizeof g);
            else for (int j = 0; j < D; j++) sum[j] += g[j];
        }
        for (int j = 0; j < D; j++) w[j] -= LR * (sum[j] / (float)M);
        for (int r = 0; r < M; r++)
            if (memcmp(g_traj[r][s], w, sizeof w) != 0 && mismatches++ < 3)
                printf("  step %d worker %d: w[0] %.9g, sequential %.9g\n", s, r, g_traj[r][s][0], w[0]);
    }
    KT_CHECK(mismatches == 0, "%d (step, worker) pairs differ from sequential SGD", mismatches);
    KT_CHECK(loss(w) < 0.5 * loss(W0), "SGD made progress: %g -> %g", loss(W0), loss(w));
}

static void test_async_converges(void) {
    run_cluster("async", KVPS_ASYNC, T, g_traj);
    /* every worker ends close to the true weights (noise 0.01): compare with the start */
    double d0 = 0;
    for (int j = 0; j < D; j++) d0 += (W0[j] - WSTAR[j]) * (W0[j] - WSTAR[j]);
    for (int r = 0; r < M; r++) {
        double d = 0;
        for (int j = 0; j < D; j++) d += pow(g_traj[r][T - 1][j] - WSTAR[j], 2);
        KT_CHECK(sqrt(d) < 0.1 * sqrt(d0), "worker %d: |w - w*| = %.4f, started at %.4f", r, sqrt(d), sqrt(d0));
    }
    KT_CHECK(loss(g_traj[0][T - 1]) < 0.01 * loss(W0), "loss %g vs initial %g", loss(g_traj[0][T - 1]),
             loss(W0));
}

/* A user update rule: the server keeps the running maximum of the round means. */
static void max_rule(const kvps_update_args *a) {
    int *calls = (int *)a->user;
    (*calls)++;
    for (size_t i = 0; i < a->len; i++) {
        float mean = a->sum[i] / (float)a->count;
        if (a->round == 0 || mean > a->value[i]) a->value[i] = mean;
    }
}

static void test_custom_update_and_init_fn(void) {
    int calls = 0;
    kt_cluster c;
    kt_cluster_up(&c, "inproc", 1,
                  &(kvps_server_desc){.num_workers = 1, .update = KVPS_UPDATE_CUSTOM, .update_fn = max_rule,
                                      .update_user = &calls});
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers, .zmq_ctx = c.ctx}, &w));
    uint64_t key = 9;
    size_t len = 2;
    float seq[4][2] = {{1, 5}, {3, 2}, {2, 7}, {-1, -1}}, out[2];
    kvps_req q;
    for (int i = 0; i < 4; i++) {
        KT_OK(kvps_worker_pushpull(w, &key, seq[i], out, &len, 1, &q));
        KT_OK(kvps_worker_wait(w, q, -1));
    }
    KT_CHECK(out[0] == 3 && out[1] == 7, "max %g %g", out[0], out[1]);
    kvps_worker_destroy(&w);
    kt_cluster_down(&c);
    KT_CHECK(calls == 4, "update_fn called %d times", calls);
}

static void init_ramp(void *user, uint64_t key, float *v, size_t len) {
    (void)user;
    for (size_t i = 0; i < len; i++) v[i] = (float)(key + i);
}

static void test_init_fn(void) {
    kt_cluster c;
    kt_cluster_up(&c, "inproc", 1, &(kvps_server_desc){.num_workers = 1, .init_fn = init_ramp});
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers, .zmq_ctx = c.ctx}, &w));
    uint64_t key = 100;
    size_t len = 3;
    float out[3] = {0};
    kvps_req q;
    KT_OK(kvps_worker_pull(w, &key, out, &len, 1, &q));
    KT_OK(kvps_worker_wait(w, q, -1));
    KT_CHECK(out[0] == 100 && out[2] == 102, "init_fn values %g %g", out[0], out[2]);
    kvps_worker_destroy(&w);
    kt_cluster_down(&c);
}

int main(void) {
    kvps_log_set_level(KVPS_LOG_ERROR);
    make_data();
    KT_RUN(test_bsp_equals_sequential_sgd);
    KT_RUN(test_async_converges);
    KT_RUN(test_custom_update_and_init_fn);
    KT_RUN(test_init_fn);
    return kt_finish();
}
