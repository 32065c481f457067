/* Bounded staleness, adaptive consistency, server-side optimizers and reductions, EASGD. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"
#include <math.h>
#include <pthread.h>
#include <time.h>

/* ---- SSP: clocks recorded at every pull ---- */
enum { SSP_STEPS = 40, MAXW = 4 };
typedef struct ssp_job {
    const char *servers;
    void *ctx;
    int rank, m, slow_ms;
    int *clock;             /* every worker's pushes sent, shared */
    int max_gap, fail;
    int gaps_over;          /* pulls that saw a worker more than `bound` behind */
    int bound;
    float final[8];
    kvps_server **srv;      /* for the adaptive bound */
} ssp_job;

static void *ssp_worker(void *arg) {
    ssp_job *j = (ssp_job *)arg;
    kvps_worker *w = NULL;
    kvps_tensor t = 0;
    kvps_req q = 0;
    if (kvps_worker_create(&(kvps_worker_desc){.servers = j->servers, .rank = j->rank, .num_workers = j->m,
                                               .zmq_ctx = j->ctx, .timeout_ms = 30000}, &w) != KVPS_OK) { j->fail = 1; return NULL; }
    kvps_worker_tensor(w, "ssp", 8, &t);
    float g[8], v[8];
    for (int s = 0; s < SSP_STEPS && !j->fail; s++) {
        if (j->slow_ms) kt_sleep_ms(j->slow_ms);
        for (int i = 0; i < 8; i++) g[i] = (float)(j->rank + 1) * 0.25f + (float)s; /* exact sums */
        /* the clock moves before the push leaves, so a pull that sees a round also sees its clock */
        __atomic_add_fetch(&j->clock[j->rank], 1, __ATOMIC_SEQ_CST);
        if (kvps_worker_pushpull_tensor(w, t, g, v, &q) != KVPS_OK || kvps_worker_wait(w, q, -1) != KVPS_OK) { j->fail = 1; break; }
        int mine = s + 1, slowest = mine;
        for (int r = 0; r < j->m; r++) {
            int c = __atomic_load_n(&j->clock[r], __ATOMIC_SEQ_CST);
            if (c < slowest) slowest = c;
        }
        if (mine - slowest > j->max_gap) j->max_gap = mine - slowest;
        if (mine - slowest > j->bound) j->gaps_over++;
    }
    memcpy(j->final, v, sizeof v);
    /* let the slow ones finish: the last rounds need everyone */
    kvps_worker_destroy(&w);
    return NULL;
}

static void run_ssp(kvps_consistency mode, int k, int kmin, int m, const int *slow_ms, ssp_job *jobs, kvps_server_stats *st) {
    kt_cluster c;
    kt_cluster_up(&c, "inproc", 1, &(kvps_server_desc){.num_workers = m, .consistency = mode, .staleness = k,
                                                       .staleness_min = kmin, .update = KVPS_UPDATE_SUM});
    int clock[MAXW] = {0};
    pthread_t th[MAXW];
    for (int r = 0; r < m; r++) {
        jobs[r] = (ssp_job){.servers = c.servers, .ctx = c.ctx, .rank = r, .m = m, .slow_ms = slow_ms[r], .clock = clock, .bound = k};
        pthread_create(&th[r], NULL, ssp_worker, &jobs[r]);
    }
    for (int r = 0; r < m; r++) pthread_join(th[r], NULL);
    if (st) kvps_server_stats_get(c.srv[0], st);
    kt_cluster_down(&c);
}

static void test_ssp_bound_holds_and_is_used(void) {
    for (int k = 1; k <= 3; k++) {
        ssp_job jobs[2];
        int slow[2] = {0, 3};
        run_ssp(KVPS_SSP, k, 0, 2, slow, jobs, NULL);
        KT_CHECK(!jobs[0].fail && !jobs[1].fail, "k=%d: a worker failed", k);
        KT_CHECK(jobs[0].gaps_over == 0, "k=%d: the fast worker was %d steps ahead (bound %d)", k, jobs[0].max_gap, k);
        KT_CHECK(jobs[0].max_gap == k, "k=%d: the fast worker got only %d ahead", k, jobs[0].max_gap);
    }
    ssp_job jobs[2];
    int slow[2] = {0, 3};
    run_ssp(KVPS_BSP, 0, 0, 2, slow, jobs, NULL);
    KT_CHECK(jobs[0].max_gap == 0, "BSP: the fast worker got %d ahead", jobs[0].max_gap);
}

static void test_ssp0_equals_bsp(void) {
    ssp_job a[3], b[3];
    int slow[3] = {0, 1, 2};
    run_ssp(KVPS_BSP, 0, 0, 3, slow, a, NULL);
    run_ssp(KVPS_SSP, 0, 0, 3, slow, b, NULL);
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
    kt_cluster c;
    g_switches_seen = 0;
    kt_cluster_up(&c, "inproc", 1, &(kvps_server_desc){.num_workers = M, .consistency = KVPS_ADAPTIVE, .staleness = 3,
                                                       .staleness_min = 0, .on_switch = on_switch, .update = KVPS_UPDATE_SUM});
    int clock[MAXW] = {0};
    ssp_job jobs[M];
    pthread_t th[M];
    int slow[M] = {0, 0, 4};
    for (int r = 0; r < M; r++) {
        jobs[r] = (ssp_job){.servers = c.servers, .ctx = c.ctx, .rank = r, .m = M, .slow_ms = slow[r], .clock = clock, .bound = 3};
        pthread_create(&th[r], NULL, ssp_worker, &jobs[r]);
    }
    for (int r = 0; r < M; r++) pthread_join(th[r], NULL);
    kvps_server_stats st;
    kvps_server_stats_get(c.srv[0], &st);
    kt_cluster_down(&c);
    for (int r = 0; r < M; r++) KT_CHECK(!jobs[r].fail, "worker %d failed", r);
    KT_CHECK(jobs[0].gaps_over == 0 && jobs[1].gaps_over == 0, "a worker got past the largest bound (gaps %d %d)", jobs[0].max_gap,
             jobs[1].max_gap);
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

typedef struct opt_job {
    const char *servers;
    void *ctx;
    int rank;
    kvps_optim o;
    float w[ON];
    int fail;
} opt_job;

static void *opt_worker(void *arg) {
    opt_job *j = (opt_job *)arg;
    kvps_worker *w = NULL;
    kvps_tensor t = 0;
    kvps_req q = 0;
    float g[ON];
    kvps_result r = kvps_worker_create(&(kvps_worker_desc){.servers = j->servers, .rank = j->rank, .num_workers = OM,
                                                            .zmq_ctx = j->ctx, .min_slice = 8}, &w);
    if (r == KVPS_OK) r = kvps_worker_tensor(w, "opt", ON, &t);
    if (r == KVPS_OK && j->rank == 0) {
        float w0[ON];
        for (int i = 0; i < ON; i++) w0[i] = 0.5f;
        r = kvps_worker_tensor_optim(w, t, &j->o, &q);
        if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
        if (r == KVPS_OK) r = kvps_worker_init_tensor(w, t, w0, &q);
        if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
    }
    if (r == KVPS_OK) r = kvps_worker_barrier(w, &q);
    if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
    for (int s = 0; s < OSTEPS && r == KVPS_OK; s++) {
        for (int i = 0; i < ON; i++) g[i] = ograd(j->rank, s, i);
        r = kvps_worker_pushpull_tensor(w, t, g, j->w, &q);
        if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
    }
    if (r != KVPS_OK) { j->fail = 1; printf("  worker %d: %s %s\n", j->rank, kvps_result_str(r), kvps_worker_last_error(w)); }
    kvps_worker_destroy(&w);
    return NULL;
}

static void test_optimizers_equal_reference(void) {
    kvps_optim os[] = {
        {KVPS_RULE_SGD, 0.1f, 0, 0, 0, 0},          {KVPS_RULE_MOMENTUM, 0.05f, 0.8f, 0, 0, 0},
        {KVPS_RULE_NESTEROV, 0.05f, 0.9f, 0, 0, 0}, {KVPS_RULE_ADAGRAD, 0.1f, 0, 0, 0, 1e-6f},
        {KVPS_RULE_ADAM, 0.01f, 0, 0.9f, 0.99f, 1e-7f}, {KVPS_RULE_ADAM, 0, 0, 0, 0, 0}, /* defaults */
        {KVPS_RULE_MEAN, 0, 0, 0, 0, 0}, {KVPS_RULE_SUM, 0, 0, 0, 0, 0}, {KVPS_RULE_MAX, 0, 0, 0, 0, 0},
        {KVPS_RULE_MIN, 0, 0, 0, 0, 0},  {KVPS_RULE_ACCUMULATE, 0, 0, 0, 0, 0},
    };
    static const char *names[] = {"sgd", "momentum", "nesterov", "adagrad", "adam", "adam-defaults", "mean", "sum", "max", "min", "accumulate"};
    for (size_t c = 0; c < sizeof os / sizeof *os; c++) {
        kt_cluster cl;
        kt_cluster_up(&cl, "inproc", 2, &(kvps_server_desc){.num_workers = OM});
        opt_job jobs[OM];
        pthread_t th[OM];
        for (int r = 0; r < OM; r++) {
            jobs[r] = (opt_job){.servers = cl.servers, .ctx = cl.ctx, .rank = r, .o = os[c]};
            pthread_create(&th[r], NULL, opt_worker, &jobs[r]);
        }
        for (int r = 0; r < OM; r++) pthread_join(th[r], NULL);
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
            KT_CHECK(!jobs[r].fail, "%s: worker %d failed", names[c], r);
            int bad = 0;
            for (int i = 0; i < ON; i++) bad += memcmp(&jobs[r].w[i], &ref[i], 4) != 0;
            KT_CHECK(bad == 0, "%s: worker %d: %d of %d values differ from the reference (w[0] %.9g vs %.9g)", names[c], r, bad, ON,
                     jobs[r].w[0], ref[0]);
        }
    }
}

/* Async pushes pipelined from one worker (arrival order = send order) on a key large enough
   that the server applies queued pushes together: bit-equal to applying them one at a time. */
static void test_async_pipelined_equal_sequential(void) {
    enum { LEN = 20011, NP = 40, WIN = 24 };
    kvps_optim os[] = {{KVPS_RULE_SGD, 0.1f, 0, 0, 0, 0}, {KVPS_RULE_MOMENTUM, 0.05f, 0.8f, 0, 0, 0},
                       {KVPS_RULE_NESTEROV, 0.05f, 0.9f, 0, 0, 0}, {KVPS_RULE_ADAGRAD, 0.1f, 0, 0, 0, 1e-6f},
                       {KVPS_RULE_ACCUMULATE, 0, 0, 0, 0, 0}, {KVPS_RULE_MEAN, 0, 0, 0, 0, 0},
                       {KVPS_RULE_ADAM, 0.01f, 0, 0.9f, 0.99f, 1e-7f}};
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
    kvps_optim bad[] = {{KVPS_RULE_SGD, -0.1f, 0, 0, 0, 0}, {KVPS_RULE_ADAM, 0, 0, 1.0f, 0, 0}, {KVPS_RULE_ADAM, 0, 0, 0, 1.5f, 0},
                        {KVPS_RULE_MOMENTUM, 0, -0.5f, 0, 0, 0}, {KVPS_RULE_ADAGRAD, 0, 0, 0, 0, -1e-8f}, {KVPS_RULE_SGD, NAN, 0, 0, 0, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        KT_CHECK(kvps_worker_tensor_optim(w, t, &bad[i], &q) == KVPS_ERR_HYPERPARAM, "case %zu accepted", i);
    kvps_optim unknown = {(kvps_rule)99, 0, 0, 0, 0, 0};
    KT_CHECK(kvps_worker_tensor_optim(w, t, &unknown, &q) == KVPS_ERR_INVALID_ARG, "unknown rule");
    /* the server checks too: a raw CONFIG with beta1 = 1 */
    void *d = zmq_socket(c.ctx, ZMQ_DEALER);
    zmq_connect(d, c.servers);
    kvps__hdr h = KT_HDR(.op = KVPS__OP_CONFIG, .nkeys = 1, .req_id = 9);
    kvps__kent e = {123, 4};
    unsigned char meta[48], rec[24];
    uint32_t rule = KVPS_RULE_ADAM;
    float f[5] = {0.01f, 0, 1.0f, 0.999f, 1e-8f};
    memcpy(meta, &h, 32);
    memcpy(meta + 32, &e, 16);
    memcpy(rec, &rule, 4);
    memcpy(rec + 4, f, 20);
    int32_t st = kt_raw_status(d, meta, 48, rec, 24, 2000);
    KT_CHECK(st == KVPS_ERR_HYPERPARAM, "server answered %s", kvps_result_str((kvps_result)st));
    zmq_close(d);
    /* a good config then training still works */
    kvps_optim good = {KVPS_RULE_SGD, 0.5f, 0, 0, 0, 0};
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

typedef struct ea_job {
    const char *servers;
    void *ctx;
    int rank, fail;
    float local[D];
} ea_job;

static void *ea_worker(void *arg) {
    ea_job *j = (ea_job *)arg;
    kvps_worker *w = NULL;
    kvps_tensor t = 0;
    kvps_req q = 0;
    kvps_result r = kvps_worker_create(&(kvps_worker_desc){.servers = j->servers, .rank = j->rank, .num_workers = EW,
                                                            .zmq_ctx = j->ctx}, &w);
    if (r == KVPS_OK) r = kvps_worker_tensor(w, "centre", D, &t);
    memset(j->local, 0, sizeof j->local);
    if (r == KVPS_OK && j->rank == 0) {
        kvps_optim acc = {KVPS_RULE_ACCUMULATE, 0, 0, 0, 0, 0};
        r = kvps_worker_tensor_optim(w, t, &acc, &q);
        if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
    }
    if (r == KVPS_OK) r = kvps_worker_barrier(w, &q);
    if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
    for (int s = 0; s < ESTEPS && r == KVPS_OK; s++) {
        /* local SGD on this worker's shard */
        int i = (j->rank * (NS / EW) + s % (NS / EW));
        float err = -Y[i];
        for (int k = 0; k < D; k++) err += X[i][k] * j->local[k];
        for (int k = 0; k < D; k++) j->local[k] -= 0.05f * err * X[i][k];
        if ((s + 1) % TAU == 0) r = kvps_worker_easgd(w, t, j->local, 0.2f, 10000);
    }
    if (r != KVPS_OK) { j->fail = 1; printf("  easgd worker %d: %s\n", j->rank, kvps_result_str(r)); }
    kvps_worker_destroy(&w);
    return NULL;
}

static void test_easgd_least_squares(void) {
    make_data();
    kt_cluster c;
    kt_cluster_up(&c, "inproc", 1, &(kvps_server_desc){.num_workers = EW, .consistency = KVPS_ASYNC});
    ea_job jobs[EW];
    pthread_t th[EW];
    for (int r = 0; r < EW; r++) {
        jobs[r] = (ea_job){.servers = c.servers, .ctx = c.ctx, .rank = r};
        pthread_create(&th[r], NULL, ea_worker, &jobs[r]);
    }
    for (int r = 0; r < EW; r++) pthread_join(th[r], NULL);
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
    for (int r = 0; r < EW; r++) KT_CHECK(!jobs[r].fail, "worker %d failed", r);
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
