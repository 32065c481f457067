/* Bounded staleness, adaptive consistency, server-side optimizers and reductions, EASGD. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"
#include <math.h>
#include <time.h>

/* ---- SSP: clocks recorded at every pull ---- */
enum { SSP_STEPS = 40, MAXW = 4 };
typedef struct ssp_run {
    const int *slow_ms;     /* per worker */
    int clock[MAXW];        /* every worker's pushes sent, shared */
    int bound;
} ssp_run;
typedef struct ssp_res {
    int max_gap;
    int gaps_over;          /* pulls that saw a worker more than `bound` behind */
    float final[8];
} ssp_res;

static void ssp_worker(kt_wk *x) {
    ssp_run *j = (ssp_run *)x->ws->user;
    ssp_res *me = (ssp_res *)x->mine;
    kvps_worker *w = NULL;
    kvps_tensor t = 0;
    kvps_req q = 0;
    kvps_result r = kvps_worker_create(&(kvps_worker_desc){.servers = x->ws->servers, .rank = x->rank, .num_workers = x->k,
                                                            .zmq_ctx = x->ws->ctx, .timeout_ms = 30000}, &w);
    if (r != KVPS_OK) { kt_wk_fail(x, "create: %s", kvps_result_str(r)); return; }
    kvps_worker_tensor(w, "ssp", 8, &t);
    float g[8], v[8];
    for (int s = 0; s < SSP_STEPS && !x->fails; s++) {
        if (j->slow_ms[x->rank]) kt_sleep_ms(j->slow_ms[x->rank]);
        for (int i = 0; i < 8; i++) g[i] = (float)(x->rank + 1) * 0.25f + (float)s; /* exact sums */
        /* the clock moves before the push leaves, so a pull that sees a round also sees its clock */
        __atomic_add_fetch(&j->clock[x->rank], 1, __ATOMIC_SEQ_CST);
        if ((r = kvps_worker_pushpull_tensor(w, t, g, v, &q)) != KVPS_OK || (r = kvps_worker_wait(w, q, -1)) != KVPS_OK) {
            kt_wk_fail(x, "step %d: %s", s, kvps_result_str(r));
            break;
        }
        int mine = s + 1, slowest = mine;
        for (int rr = 0; rr < x->k; rr++) {
            int c = __atomic_load_n(&j->clock[rr], __ATOMIC_SEQ_CST);
            if (c < slowest) slowest = c;
        }
        if (mine - slowest > me->max_gap) me->max_gap = mine - slowest;
        if (mine - slowest > j->bound) me->gaps_over++;
    }
    memcpy(me->final, v, sizeof v);
    /* let the slow ones finish: the last rounds need everyone */
    kvps_worker_destroy(&w);
}

/* m workers (slow_ms[r] of sleep before each step) against one server (on_switch: its
   callback, or NULL); each one's results in res[r], the server's stats in *st (st not NULL). A
   worker that failed is reported. */
static void run_ssp(const char *label, kvps_consistency mode, int k, int kmin, int m, const int *slow_ms, ssp_res *res,
                   kvps_server_stats *st, void (*on_switch)(void *, int, int)) {
    kt_cluster c;
    kt_cluster_up(&c, "inproc", 1, &(kvps_server_desc){.num_workers = m, .consistency = mode, .staleness = k,
                                                       .staleness_min = kmin, .on_switch = on_switch,
                                                       .update = KVPS_UPDATE_ACCUMULATE});
    ssp_run j = {.slow_ms = slow_ms, .bound = k};
    memset(res, 0, (size_t)m * sizeof *res);
    kt_workers ws;
    kt_workers_init(&ws, label, ssp_worker, m, c.servers, c.ctx);
    ws.user = &j;
    ws.each = res;
    ws.each_size = sizeof *res;
    kt_workers_run(&ws);
    if (st) kvps_server_stats_get(c.srv[0], st);
    kt_cluster_down(&c);
}

static void test_ssp_bound_holds_and_is_used(void) {
    for (int k = 1; k <= 3; k++) {
        ssp_res res[2];
        int slow[2] = {0, 3};
        char label[32];
        snprintf(label, sizeof label, "SSP k=%d", k);
        run_ssp(label, KVPS_SSP, k, 0, 2, slow, res, NULL, NULL);
        KT_CHECK(res[0].gaps_over == 0, "k=%d: the fast worker was %d steps ahead (bound %d)", k, res[0].max_gap, k);
        KT_CHECK(res[0].max_gap == k, "k=%d: the fast worker got only %d ahead", k, res[0].max_gap);
    }
    ssp_res res[2];
    int slow[2] = {0, 3};
    run_ssp("BSP", KVPS_BSP, 0, 0, 2, slow, res, NULL, NULL);
    KT_CHECK(res[0].max_gap == 0, "BSP: the fast worker got %d ahead", res[0].max_gap);
}

static void test_ssp0_equals_bsp(void) {
    ssp_res a[3], b[3];
    int slow[3] = {0, 1, 2};
    run_ssp("BSP", KVPS_BSP, 0, 0, 3, slow, a, NULL, NULL);
    run_ssp("SSP k=0", KVPS_SSP, 0, 0, 3, slow, b, NULL, NULL);
    for (int r = 0; r < 3; r++) KT_CHECK(memcmp(a[r].final, b[r].final, sizeof a[r].final) == 0, "rank %d differs", r);
    /* and the value is the exact sum of every push */
    float want = 0;
    for (int s = 0; s < SSP_STEPS; s++)
        for (int r = 0; r < 3; r++) want += (float)(r + 1) * 0.25f + (float)s;
    KT_CHECK(a[0].final[0] == want, "sum %g want %g", a[0].final[0], want);
}

static int g_switches_seen;
static void on_switch(void *user, int old_k, int new_k) {
    (void)user;
    (void)old_k;
    (void)new_k;
    __atomic_add_fetch(&g_switches_seen, 1, __ATOMIC_RELAXED);
}

static void test_adaptive_moves_within_bounds(void) {
    /* a persistent straggler: the server should raise k to its maximum, never past it */
    enum { M = 3 };
    g_switches_seen = 0;
    ssp_res res[M];
    int slow[M] = {0, 0, 4};
    kvps_server_stats st;
    run_ssp("adaptive", KVPS_ADAPTIVE, 3, 0, M, slow, res, &st, on_switch);
    KT_CHECK(res[0].gaps_over == 0 && res[1].gaps_over == 0, "a worker got past the largest bound (gaps %d %d)", res[0].max_gap,
             res[1].max_gap);
    KT_CHECK(st.switches >= 1 && (int)st.switches == g_switches_seen, "switches %llu, reported %d", (unsigned long long)st.switches,
             g_switches_seen);
    KT_CHECK(st.staleness <= 3, "k in force %llu", (unsigned long long)st.staleness);
}

/* ---- optimizers against a one-process reference (same formulas, same float order) ---- */
enum { ON = 37, OSTEPS = 30, OM = 2 };
static float ograd(int r, int s, int i) {
    uint64_t x = ((uint64_t)r << 40) ^ ((uint64_t)s << 20) ^ (uint64_t)i;
    return kt_randf(&x);
}

static void reference(kvps_optim o, float *w) {
    float v[ON] = {0}, m2[ON] = {0}, b1t = 1, b2t = 1;
    for (int s = 0; s < OSTEPS; s++) {
        kt_optim_tick(&o, &b1t, &b2t);
        for (int i = 0; i < ON; i++) {
            float sum = ograd(0, s, i);
            for (int r = 1; r < OM; r++) {
                float gr = ograd(r, s, i);
                if (o.rule == KVPS_RULE_MAX) sum = gr > sum ? gr : sum;
                else if (o.rule == KVPS_RULE_MIN) sum = gr < sum ? gr : sum;
                else sum += gr;
            }
            kt_optim_apply(&o, &w[i], &v[i], &m2[i], sum, (float)OM, b1t, b2t);
        }
    }
}

/* Worker x->rank's weights after every step, to its record (float[ON]); rank 0 sets the rule
   (the kvps_optim in user) and the start. */
static void opt_worker(kt_wk *x) {
    const kvps_optim *o = (const kvps_optim *)x->ws->user;
    float *wout = (float *)x->mine;
    kvps_worker *w = NULL;
    kvps_tensor t = 0;
    kvps_req q = 0;
    float g[ON];
    kvps_result r = kvps_worker_create(&(kvps_worker_desc){.servers = x->ws->servers, .rank = x->rank, .num_workers = OM,
                                                            .zmq_ctx = x->ws->ctx, .min_slice = 8}, &w);
    if (r == KVPS_OK) r = kvps_worker_tensor(w, "opt", ON, &t);
    if (r == KVPS_OK && x->rank == 0) {
        float w0[ON];
        for (int i = 0; i < ON; i++) w0[i] = 0.5f;
        r = kvps_worker_tensor_optim(w, t, o, &q);
        if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
        if (r == KVPS_OK) r = kvps_worker_init_tensor(w, t, w0, &q);
        if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
    }
    if (r == KVPS_OK) r = kvps_worker_barrier(w, &q);
    if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
    for (int s = 0; s < OSTEPS && r == KVPS_OK; s++) {
        for (int i = 0; i < ON; i++) g[i] = ograd(x->rank, s, i);
        r = kvps_worker_pushpull_tensor(w, t, g, wout, &q);
        if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
    }
    if (r != KVPS_OK) kt_wk_fail(x, "%s %s", kvps_result_str(r), kvps_worker_last_error(w));
    kvps_worker_destroy(&w);
}

static void test_optimizers_equal_reference(void) {
    kvps_optim os[] = {
        {KVPS_RULE_SGD, 0.1f, 0, 0, 0, 0, 0},          {KVPS_RULE_MOMENTUM, 0.05f, 0.8f, 0, 0, 0, 0},
        {KVPS_RULE_NESTEROV, 0.05f, 0.9f, 0, 0, 0, 0}, {KVPS_RULE_ADAGRAD, 0.1f, 0, 0, 0, 1e-6f, 0},
        {KVPS_RULE_ADAM, 0.01f, 0, 0.9f, 0.99f, 1e-7f, 0}, {KVPS_RULE_ADAM, 0, 0, 0, 0, 0, 0}, /* defaults */
        {KVPS_RULE_MEAN, 0, 0, 0, 0, 0, 0}, {KVPS_RULE_SUM, 0, 0, 0, 0, 0, 0}, {KVPS_RULE_MAX, 0, 0, 0, 0, 0, 0},
        {KVPS_RULE_MIN, 0, 0, 0, 0, 0, 0},  {KVPS_RULE_ACCUMULATE, 0, 0, 0, 0, 0, 0},
    };
    static const char *names[] = {"sgd", "momentum", "nesterov", "adagrad", "adam", "adam-defaults", "mean", "sum", "max", "min", "accumulate"};
    for (size_t c = 0; c < sizeof os / sizeof *os; c++) {
        kt_cluster cl;
        kt_cluster_up(&cl, "inproc", 2, &(kvps_server_desc){.num_workers = OM});
        float got[OM][ON];
        memset(got, 0, sizeof got);
        kt_workers ws;
        kt_workers_init(&ws, names[c], opt_worker, OM, cl.servers, cl.ctx); /* (a worker that failed is reported) */
        ws.user = &os[c];
        ws.each = got;
        ws.each_size = sizeof got[0];
        kt_workers_run(&ws);
        kt_cluster_down(&cl);
        kvps_optim o = os[c]; /* the documented defaults */
        if (o.lr == 0) o.lr = 0.01f;
        if (o.momentum == 0) o.momentum = 0.9f;
        if (o.beta1 == 0) o.beta1 = 0.9f;
        if (o.beta2 == 0) o.beta2 = 0.999f;
        if (o.eps == 0) o.eps = 1e-8f;
        float ref[ON];
        for (int i = 0; i < ON; i++) ref[i] = 0.5f;
        reference(o, ref);
        for (int r = 0; r < OM; r++) {
            int bad = 0;
            for (int i = 0; i < ON; i++) bad += memcmp(&got[r][i], &ref[i], 4) != 0;
            KT_CHECK(bad == 0, "%s: worker %d: %d of %d values differ from the reference (w[0] %.9g vs %.9g)", names[c], r, bad, ON,
                     got[r][0], ref[0]);
        }
    }
}

/* Async pushes pipelined from one worker (arrival order = send order) on a key large enough
   that the server applies queued pushes together: bit-equal to applying them one at a time. */
static void test_async_pipelined_equal_sequential(void) {
    enum { LEN = 20011, NP = 40, WIN = 24 };
    kvps_optim os[] = {{KVPS_RULE_SGD, 0.1f, 0, 0, 0, 0, 0}, {KVPS_RULE_MOMENTUM, 0.05f, 0.8f, 0, 0, 0, 0},
                       {KVPS_RULE_NESTEROV, 0.05f, 0.9f, 0, 0, 0, 0}, {KVPS_RULE_ADAGRAD, 0.1f, 0, 0, 0, 1e-6f, 0},
                       {KVPS_RULE_ACCUMULATE, 0, 0, 0, 0, 0, 0}, {KVPS_RULE_MEAN, 0, 0, 0, 0, 0, 0},
                       {KVPS_RULE_ADAM, 0.01f, 0, 0.9f, 0.99f, 1e-7f, 0}};
    const char *tr[2] = {"tcp", "inproc"};
    float *g = (float *)malloc((size_t)NP * LEN * sizeof(float)), *ref = (float *)malloc(LEN * sizeof(float));
    float *v = (float *)calloc(LEN, sizeof(float)), *m2 = (float *)calloc(LEN, sizeof(float)), *got = (float *)malloc(LEN * sizeof(float));
    uint64_t seed = 77;
    for (size_t i = 0; i < (size_t)NP * LEN; i++) g[i] = kt_randf(&seed);
    uint64_t fused = 0;
    for (int x = 0; x < 2; x++)
        for (size_t c = 0; c < sizeof os / sizeof *os; c++) {
            kt_cluster cl;
            kt_cluster_up(&cl, tr[x], 1, &(kvps_server_desc){.num_workers = 1, .consistency = KVPS_ASYNC});
            kvps_worker *w = NULL;
            KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = cl.servers, .zmq_ctx = cl.ctx}, &w));
            kvps_tensor t;
            kvps_req q[WIN];
            KT_OK(kvps_worker_tensor(w, "a", LEN, &t));
            KT_OK(kvps_worker_tensor_optim(w, t, &os[c], &q[0]));
            KT_OK(kvps_worker_wait(w, q[0], -1));
            for (int p = 0; p < NP; p++) {
                if (p >= WIN) KT_OK(kvps_worker_wait(w, q[p % WIN], -1));
                KT_OK(kvps_worker_push_tensor(w, t, g + (size_t)p * LEN, &q[p % WIN]));
            }
            for (int p = NP - WIN; p < NP; p++) KT_OK(kvps_worker_wait(w, q[p % WIN], -1));
            KT_OK(kvps_worker_pull_tensor(w, t, got, &q[0]));
            KT_OK(kvps_worker_wait(w, q[0], -1));
            kvps_server_stats st;
            kvps_server_stats_get(cl.srv[0], &st);
            fused += st.fused;
            KT_CHECK(st.rounds == NP, "%llu rounds", (unsigned long long)st.rounds);
            kvps_worker_destroy(&w);
            kt_cluster_down(&cl);
            /* the reference: one push at a time, count 1 (documented formulas, float32) */
            kvps_optim o = os[c];
            memset(ref, 0, LEN * sizeof(float));
            memset(v, 0, LEN * sizeof(float));
            memset(m2, 0, LEN * sizeof(float));
            float b1t = 1, b2t = 1;
            for (int p = 0; p < NP; p++) {
                kt_optim_tick(&o, &b1t, &b2t);
                for (int i = 0; i < LEN; i++) kt_optim_apply(&o, &ref[i], &v[i], &m2[i], g[(size_t)p * LEN + i], 1.0f, b1t, b2t);
            }
            int bad = 0;
            for (int i = 0; i < LEN; i++) bad += memcmp(&got[i], &ref[i], 4) != 0;
            KT_CHECK(bad == 0, "%s rule %d: %d of %d values differ from one-at-a-time", tr[x], (int)o.rule, bad, LEN);
        }
    printf("  %llu pushes were applied together with others queued for their key\n", (unsigned long long)fused);
    free(g); free(ref); free(v); free(m2); free(got);
}

static void test_hyperparameters_checked(void) {
    kt_cluster c;
    kt_cluster_up(&c, "inproc", 1, &(kvps_server_desc){.num_workers = 1});
    kvps_log_set_level(KVPS_LOG_NONE);
    kvps_worker *w;
    kvps_tensor t;
    kvps_req q;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers, .zmq_ctx = c.ctx}, &w));
    KT_OK(kvps_worker_tensor(w, "hp", 4, &t));
    kvps_optim bad[] = {{KVPS_RULE_SGD, -0.1f, 0, 0, 0, 0, 0}, {KVPS_RULE_ADAM, 0, 0, 1.0f, 0, 0, 0}, {KVPS_RULE_ADAM, 0, 0, 0, 1.5f, 0, 0},
                        {KVPS_RULE_MOMENTUM, 0, -0.5f, 0, 0, 0, 0}, {KVPS_RULE_ADAGRAD, 0, 0, 0, 0, -1e-8f, 0}, {KVPS_RULE_SGD, NAN, 0, 0, 0, 0, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        KT_CHECK(kvps_worker_tensor_optim(w, t, &bad[i], &q) == KVPS_ERR_HYPERPARAM, "case %zu accepted", i);
    kvps_optim unknown = {(kvps_rule)200, 0, 0, 0, 0, 0, 0}; /* (64-127: user rules, the servers' to check) */
    KT_CHECK(kvps_worker_tensor_optim(w, t, &unknown, &q) == KVPS_ERR_INVALID_ARG, "unknown rule");
    /* the server checks too: a raw CONFIG with beta1 = 1 */
    void *d = zmq_socket(c.ctx, ZMQ_DEALER);
    zmq_connect(d, c.servers);
    kvps__hdr h = KT_HDR(.op = KVPS__OP_CONFIG, .nkeys = 1, .req_id = 9);
    kvps__kent e = {123, 4};
    unsigned char meta[48], rec[KVPS__OPTREC];
    uint32_t rule = KVPS_RULE_ADAM;
    float f[6] = {0.01f, 0, 1.0f, 0.999f, 1e-8f, 0};
    memcpy(meta, &h, 32);
    memcpy(meta + 32, &e, 16);
    memcpy(rec, &rule, 4);
    memcpy(rec + 4, f, 24);
    int32_t st = kt_raw_status(d, meta, 48, rec, sizeof rec, 2000);
    KT_CHECK(st == KVPS_ERR_HYPERPARAM, "server answered %s", kvps_result_str((kvps_result)st));
    zmq_close(d);
    /* a good config then training still works */
    kvps_optim good = {KVPS_RULE_SGD, 0.5f, 0, 0, 0, 0, 0};
    float g[4] = {1, 1, 1, 1}, v[4];
    KT_OK(kvps_worker_tensor_optim(w, t, &good, &q));
    KT_OK(kvps_worker_wait(w, q, -1));
    KT_OK(kvps_worker_pushpull_tensor(w, t, g, v, &q));
    KT_OK(kvps_worker_wait(w, q, -1));
    KT_CHECK(v[0] == -0.5f, "sgd step gave %g", v[0]);
    kvps_worker_destroy(&w);
    kt_cluster_down(&c);
    kvps_log_set_level(KVPS_LOG_WARN);
}

/* ---- EASGD on least squares ---- */
enum { D = 9, NS = 256, EW = 4, TAU = 4, ESTEPS = 400 };
static float X[NS][D], Y[NS], WSTAR[D];

static void make_data(void) {
    uint64_t s = 77;
    for (int j = 0; j < D; j++) WSTAR[j] = kt_randf(&s);
    for (int i = 0; i < NS; i++) {
        float dot = 0;
        for (int j = 0; j < D; j++) { X[i][j] = kt_randf(&s); dot += X[i][j] * WSTAR[j]; }
        Y[i] = dot;
    }
}

/* Worker x->rank's local model to its record (float[D]). */
static void ea_worker(kt_wk *x) {
    float *local = (float *)x->mine;
    kvps_worker *w = NULL;
    kvps_tensor t = 0;
    kvps_req q = 0;
    kvps_result r = kvps_worker_create(&(kvps_worker_desc){.servers = x->ws->servers, .rank = x->rank, .num_workers = EW,
                                                            .zmq_ctx = x->ws->ctx}, &w);
    if (r == KVPS_OK) r = kvps_worker_tensor(w, "centre", D, &t);
    memset(local, 0, D * sizeof *local);
    if (r == KVPS_OK && x->rank == 0) {
        kvps_optim acc = {KVPS_RULE_ACCUMULATE, 0, 0, 0, 0, 0, 0};
        r = kvps_worker_tensor_optim(w, t, &acc, &q);
        if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
    }
    if (r == KVPS_OK) r = kvps_worker_barrier(w, &q);
    if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
    for (int s = 0; s < ESTEPS && r == KVPS_OK; s++) {
        /* local SGD on this worker's shard */
        int i = (x->rank * (NS / EW) + s % (NS / EW));
        float err = -Y[i];
        for (int k = 0; k < D; k++) err += X[i][k] * local[k];
        for (int k = 0; k < D; k++) local[k] -= 0.05f * err * X[i][k];
        if ((s + 1) % TAU == 0) r = kvps_worker_easgd(w, t, local, 0.2f, 10000);
    }
    if (r != KVPS_OK) kt_wk_fail(x, "%s", kvps_result_str(r));
    kvps_worker_destroy(&w);
}

static void test_easgd_least_squares(void) {
    make_data();
    kt_cluster c;
    kt_cluster_up(&c, "inproc", 1, &(kvps_server_desc){.num_workers = EW, .consistency = KVPS_ASYNC});
    float local[EW][D];
    kt_workers ws;
    kt_workers_init(&ws, "easgd", ea_worker, EW, c.servers, c.ctx); /* (a worker that failed is reported) */
    ws.each = local;
    ws.each_size = sizeof local[0];
    kt_workers_run(&ws);
    kvps_worker *w;
    kvps_tensor t;
    kvps_req q;
    float centre[D];
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers, .zmq_ctx = c.ctx}, &w));
    KT_OK(kvps_worker_tensor(w, "centre", D, &t));
    KT_OK(kvps_worker_pull_tensor(w, t, centre, &q));
    KT_OK(kvps_worker_wait(w, q, -1));
    double d = 0, d0 = 0;
    for (int j = 0; j < D; j++) { d += pow(centre[j] - WSTAR[j], 2); d0 += pow(WSTAR[j], 2); }
    KT_CHECK(sqrt(d) < 0.05 * sqrt(d0), "centre is %.4f from w* (start %.4f)", sqrt(d), sqrt(d0));
    kvps_worker_destroy(&w);
    kt_cluster_down(&c);
}

int main(void) {
    kvps_log_set_level(KVPS_LOG_ERROR);
    KT_RUN(test_ssp_bound_holds_and_is_used);
    KT_RUN(test_ssp0_equals_bsp);
    KT_RUN(test_adaptive_moves_within_bounds);
    KT_RUN(test_optimizers_equal_reference);
    KT_RUN(test_async_pipelined_equal_sequential);
    KT_RUN(test_hyperparameters_checked);
    KT_RUN(test_easgd_least_squares);
    return kt_finish();
}
