/* test_rules.c - KVPS_RULE_ADAMW and user rules with per-element state (CONSISTENCY AND UPDATE
   RULES in kvps.h). Every job is BSP with NW workers pushing gradients that depend only on
   (rank, step, element), so the servers' result is a sequential computation: sum the ranks'
   gradients in rank order, apply the rule. The oracles do exactly that in plain C, in this file:
   AdamW's from its formula as the manual writes it, a user rule by calling the rule's own function
   on arrays kept here. BSP sums in rank order, so the results must be equal bit for bit.

     test_adamw_equals_formula      NT tensors over 2 servers, 3 workers, AdamW (given and default
                                    hyper-parameters, weight decay on and off): every weight of
                                    every worker equal to the formula's loop, bit for bit; AdamW
                                    and Adam differ (pow against a running product, decay); with
                                    python3-torch installed, tests/adamw_torch.py replays the same
                                    gradients through torch.optim.AdamW (else one skip line)
     test_adamw_checked             weight_decay < 0, NaN, or set with a rule that does not use it:
                                    KVPS_ERR_HYPERPARAM naming weight_decay, on the worker and (raw
                                    CONFIG) on the server; a CONFIG record of the old size (24
                                    bytes) refused; a sparse table with AdamW refused, named
     test_user_rule_equals_oracle   a stateful user rule (AMSGrad with decoupled decay: 3 state
                                    floats per value, bias correction by step) against the rule
                                    applied sequentially here; a second user rule with no state
     test_user_rule_unknown         a tensor naming a user rule the servers lack: the wait fails
                                    with KVPS_ERR_INVALID_ARG naming the tensor and the rule; a
                                    server desc with a NULL fn or too much state refused
     test_user_rule_checkpoint      steps 0-11, both servers checkpoint, everything stops; new
                                    servers restore, new workers do steps 12-23: bit-identical to
                                    the oracle (the run without the restart); a server without the
                                    rule refuses the checkpoint, naming the tensor and the rule
     test_version4_checkpoint_loads a checkpoint of the version before (no weight_decay, no step),
                                    written here byte by byte: loaded, momentum goes on from its
                                    state
     test_user_rule_primary_killed  2 shards x 2 replicas, server processes; shard 0's primary
                                    SIGKILLed at step 12: bit-identical to the oracle; again with
                                    shard 0's backup SIGKILLed at step 8 and a replacement (its
                                    state from a snapshot) in its place, the primary at step 16
     test_user_rule_reshard         2 -> 3 servers at step 12: bit-identical to the oracle, and
                                    the third server held keys */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"
#include <pthread.h>

enum { NW = 3, NT = 6, NL = 50, N = NT * NL, STEPS = 24 };

static float grad(int rank, int step, int i) {
    return (float)(((rank + 1) * (i % 7 + 1) * (step % 5 + 1) + i) % 13) * 0.01f - 0.06f;
}
static float w0(int i) { return 0.5f - (float)(i % 11) * 0.05f; }

/* ---- the user rules of this test -------------------------------------------------------------- */

/* AMSGrad with decoupled weight decay: m, v, vmax per value; the bias correction needs the step. */
static void amsgradw(const kvps_rule_args *a) {
    const kvps_optim *o = a->opt;
    float *m = a->state[0], *v = a->state[1], *vmax = a->state[2];
    float bc1 = (float)(1.0 - pow((double)o->beta1, (double)a->step));
    float bc2 = (float)(1.0 - pow((double)o->beta2, (double)a->step));
    for (size_t i = 0; i < a->len; i++) {
        float g = a->sum[i] / (float)a->count;
        a->value[i] -= o->lr * o->weight_decay * a->value[i];
        m[i] = o->beta1 * m[i] + (1.0f - o->beta1) * g;
        v[i] = o->beta2 * v[i] + (1.0f - o->beta2) * g * g;
        if (v[i] > vmax[i]) vmax[i] = v[i];
        a->value[i] -= o->lr * (m[i] / bc1) / (sqrtf(vmax[i] / bc2) + o->eps);
    }
}
/* No state: a step-scaled SGD (lr / sqrt(step)). */
static void sgd_sqrt(const kvps_rule_args *a) {
    float lr = a->opt->lr / sqrtf((float)a->step);
    for (size_t i = 0; i < a->len; i++) a->value[i] -= lr * (a->sum[i] / (float)a->count);
}
static const kvps_user_rule urules[] = {{"amsgradw", amsgradw, 3, NULL}, {"sgd-sqrt", sgd_sqrt, 0, NULL}};
enum { NUR = 2 };

/* ---- the oracle ---------------------------------------------------------------------------------- */

/* AdamW as the manual writes it (f(x): x rounded to float; d, s, c2 in double). */
static void adamw_step(const kvps_optim *o, float *w, float *m, float *v, const float *sum, float c, uint64_t t, int n) {
    float d = (float)(1.0 - (double)o->lr * (double)o->weight_decay);
    float a1 = (float)(1.0 - (double)o->beta1), a2 = (float)(1.0 - (double)o->beta2);
    float s = (float)((double)o->lr / (1.0 - pow((double)o->beta1, (double)t)));
    float c2 = (float)sqrt(1.0 - pow((double)o->beta2, (double)t));
    for (int i = 0; i < n; i++) {
        float g = sum[i] / c;
        w[i] = w[i] * d;
        m[i] = fmaf(a1, g, o->beta1 * m[i]);
        v[i] = fmaf(a2 * g, g, o->beta2 * v[i]);
        w[i] = w[i] - s * m[i] / (sqrtf(v[i]) / c2 + o->eps);
    }
}

/* The defaults resolved as the servers resolve them. */
static kvps_optim resolved(kvps_optim o) {
    if (o.lr == 0) o.lr = KVPS_DEFAULT_LR;
    if (o.momentum == 0) o.momentum = KVPS_DEFAULT_MOMENTUM;
    if (o.beta1 == 0) o.beta1 = KVPS_DEFAULT_BETA1;
    if (o.beta2 == 0) o.beta2 = KVPS_DEFAULT_BETA2;
    if (o.eps == 0) o.eps = KVPS_DEFAULT_EPS;
    return o;
}

/* The weights after `steps` steps of rule o, sequentially, one tensor at a time (state per tensor). */
static void oracle(kvps_optim o, int steps, float *w, float *gmeans /* NULL, or [steps][N]: the mean gradients */) {
    o = resolved(o);
    static float st[KVPS_MAX_RULE_STATE][N];
    memset(st, 0, sizeof st);
    float sum[N];
    for (int i = 0; i < N; i++) w[i] = w0(i);
    for (int t = 0; t < steps; t++) {
        for (int i = 0; i < N; i++) {
            sum[i] = grad(0, t, i);
            for (int r = 1; r < NW; r++) sum[i] += grad(r, t, i);
            if (gmeans) gmeans[(size_t)t * N + i] = sum[i] / (float)NW;
        }
        for (int k = 0; k < NT; k++) {
            int off = k * NL;
            if (o.rule == KVPS_RULE_ADAMW) {
                adamw_step(&o, w + off, st[0] + off, st[1] + off, sum + off, (float)NW, (uint64_t)t + 1, NL);
            } else if (o.rule == KVPS_RULE_ADAM) {
                static float b1t[NT], b2t[NT];
                if (t == 0) b1t[k] = b2t[k] = 1.0f;
                kt_optim_tick(&o, &b1t[k], &b2t[k]);
                for (int i = 0; i < NL; i++)
                    kt_optim_apply(&o, &w[off + i], &st[0][off + i], &st[1][off + i], sum[off + i], (float)NW, b1t[k], b2t[k]);
            } else {
                const kvps_user_rule *u = &urules[o.rule - KVPS_RULE_USER];
                float *sp[KVPS_MAX_RULE_STATE];
                for (int j = 0; j < u->n_state; j++) sp[j] = st[j] + off;
                kvps_rule_args a = {0, w + off, sum + off, NW, sp, NL, (uint64_t)t + 1, &o, u->user};
                u->fn(&a);
            }
        }
    }
}

/* ---- the job: NW workers, NT tensors of NL floats, steps [from, to) -------------------------------- */

typedef struct rjob {
    char servers[800], grow[1200]; /* grow: the list resharded to before step grow_at */
    int grow_at, from, to;
    int keep;                      /* the workers stay, unfinished, in kept[] (a job stopped mid-run) */
    int failover;                  /* replicas: fast heartbeats, the next replica after 300 ms */
    int gate;                      /* > 0: no worker starts step gate or later until it is raised (atomic) */
    kvps_optim opt;
    int done[NW];                  /* steps done (atomic) */
    kvps_worker *kept[NW];
    float final[NW][N];
} rjob;

static void rjob_worker(kt_wk *x) {
    rjob *j = (rjob *)x->ws->user;
    int rank = x->rank;
    kvps_worker *w = NULL;
    int fo = j->failover;
    kvps_result rc = kvps_worker_create(&(kvps_worker_desc){.servers = j->servers, .rank = rank, .num_workers = NW,
                                                            .min_slice = 64, .timeout_ms = 20000, .heartbeat_ms = fo ? 200 : 0,
                                                            .peer_timeout_ms = fo ? 1000 : 0, .failover_ms = fo ? 300 : 0}, &w);
    kvps_tensor t[NT];
    kvps_req q;
    for (int k = 0; k < NT && rc == KVPS_OK; k++) {
        char name[32];
        snprintf(name, sizeof name, "layer%d", k);
        rc = kvps_worker_tensor(w, name, NL, &t[k]);
        if (rc == KVPS_OK && rank == 0 && j->from == 0) {
            float v0[NL];
            for (int i = 0; i < NL; i++) v0[i] = w0(k * NL + i);
            rc = kvps_worker_tensor_optim(w, t[k], &j->opt, &q);
            if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, -1);
            if (rc == KVPS_OK) rc = kvps_worker_init_tensor(w, t[k], v0, &q);
            if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, -1);
        }
    }
    if (rc == KVPS_OK) rc = kvps_worker_barrier(w, &q); /* the rules are set before anyone pushes */
    if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, -1);
    float g[N];
    for (int step = j->from; step < j->to && rc == KVPS_OK; step++) {
        while (__atomic_load_n(&j->gate, __ATOMIC_ACQUIRE) && step >= __atomic_load_n(&j->gate, __ATOMIC_ACQUIRE)) kt_sleep_ms(1);
        if (j->grow_at && step == j->grow_at && (rc = kvps_worker_reshard(w, j->grow, 20000)) != KVPS_OK) break;
        for (int i = 0; i < N; i++) g[i] = grad(rank, step, i);
        for (int k = 0; k < NT && rc == KVPS_OK; k++) {
            rc = kvps_worker_pushpull_tensor(w, t[k], g + k * NL, j->final[rank] + k * NL, &q);
            if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, -1);
        }
        __atomic_store_n(&j->done[rank], step + 1, __ATOMIC_RELEASE);
    }
    if (rc != KVPS_OK) kt_wk_fail(x, "%s: %.400s", kvps_result_str(rc), kvps_worker_last_error(w));
    if (j->keep && rc == KVPS_OK) { /* every round done, nobody finished */
        rc = kvps_worker_barrier(w, &q);
        if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, -1);
        if (rc != KVPS_OK) kt_wk_fail(x, "barrier: %s", kvps_result_str(rc));
        j->kept[rank] = w;
        return;
    }
    kvps_worker_destroy(&w);
}

static void rjob_run(rjob *j, const char *what) {
    kt_workers ws;
    kt_workers_init(&ws, what, rjob_worker, NW, j->servers, NULL);
    ws.user = j;
    kt_workers_run(&ws);
}

/* n servers in this process on ipc (tag names them), with this test's user rules; with ckpt, each
   checkpoints to /tmp/kvps-rules-TAG-PID-i. Their list in list (the first `first` of them). */
static kvps_server *srv[3];
static char ep[3][96], ckpt[3][128];
static void servers_up(const char *tag, int n, int first, int with_ckpt, int restore, char *list, size_t cap) {
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        snprintf(ep[i], sizeof ep[i], "ipc://@kvps-rules-%s-%d-%d", tag, (int)getpid(), i);
        snprintf(ckpt[i], sizeof ckpt[i], "/tmp/kvps-rules-%s-%d-%d", tag, (int)getpid(), i);
        KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = ep[i], .rank = i, .num_workers = NW,
                                                     .checkpoint_path = with_ckpt ? ckpt[i] : NULL, .user_rules = urules,
                                                     .num_user_rules = NUR}, &srv[i]));
        if (srv[i] && restore) KT_OK(kvps_server_restore(srv[i], ckpt[i]));
        if (srv[i]) KT_OK(kvps_server_start(srv[i]));
        if (i < first) used += (size_t)snprintf(list + used, cap - used, "%s%s", i ? "," : "", ep[i]);
    }
}
static void servers_down(int n, const char *what) {
    for (int i = 0; i < n; i++) {
        if (!srv[i]) continue;
        KT_CHECK(kvps_server_wait(srv[i], 10000) == KVPS_OK, "%s: server %d did not stop by itself", what, i);
        kvps_server_destroy(&srv[i]);
    }
}

/* Every worker's weights against the oracle's: how many differ (and the first, named). */
static int check_bits(const rjob *j, const float *want, const char *what) {
    int bad = 0, first = -1, fr = 0;
    for (int r = 0; r < NW; r++)
        for (int i = 0; i < N; i++)
            if (memcmp(&j->final[r][i], &want[i], sizeof(float)) != 0) {
                if (first < 0) { first = i; fr = r; }
                bad++;
            }
    KT_CHECK(bad == 0, "%s: %d of %d weights differ from the oracle's, the first worker %d element %d: %.9g vs %.9g", what, bad,
             NW * N, fr, first, first >= 0 ? (double)j->final[fr][first] : 0.0, first >= 0 ? (double)want[first] : 0.0);
    return bad;
}

/* One whole job on 2 servers in this process. */
static void plain_job(rjob *j, const char *tag, kvps_optim o) {
    memset(j, 0, sizeof *j);
    j->opt = o;
    j->to = STEPS;
    servers_up(tag, 2, 2, 0, 0, j->servers, sizeof j->servers);
    rjob_run(j, tag);
    servers_down(2, tag);
}

static rjob J;

/* ---- AdamW ------------------------------------------------------------------------------------- */

/* With python3-torch: tests/adamw_torch.py replays the mean gradients through torch.optim.AdamW
   and compares its weights with kvps's; it prints the largest difference in ulps. 0: skipped. */
static int torch_check(const kvps_optim *o, const float *gmeans, const float *got) {
    /* Debian's python3-torch is for Debian's python3, which may not be the first on PATH */
    const char *py = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
    char path[128], cmd[300];
    snprintf(cmd, sizeof cmd, "%s -c 'import torch' >/dev/null 2>&1", py);
    if (system(cmd) != 0) return 0;
    snprintf(path, sizeof path, "/tmp/kvps-adamw-%d.bin", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint32_t hdr[3] = {STEPS, N, 0};
    float hp[5] = {o->lr, o->beta1, o->beta2, o->eps, o->weight_decay}, init[N];
    for (int i = 0; i < N; i++) init[i] = w0(i);
    fwrite(hdr, sizeof hdr, 1, f);
    fwrite(hp, sizeof hp, 1, f);
    fwrite(init, sizeof init, 1, f);
    fwrite(gmeans, sizeof(float), (size_t)STEPS * N, f);
    fwrite(got, sizeof(float), N, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s tests/adamw_torch.py %s", py, path);
    fflush(stdout);
    int rc = system(cmd);
    unlink(path);
    return rc == 0 ? 1 : -1;
}

static void test_adamw_equals_formula(void) {
    kvps_optim os[] = {{.rule = KVPS_RULE_ADAMW, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-7f, .weight_decay = 0.1f},
                       {.rule = KVPS_RULE_ADAMW, .weight_decay = 0.01f}, /* the defaults, torch's weight decay */
                       {.rule = KVPS_RULE_ADAMW, .lr = 0.002f}};         /* no decay */
    static float want[N], adam[N], gm[STEPS * N];
    int torch_ran = 0;
    for (size_t c = 0; c < sizeof os / sizeof *os; c++) {
        char tag[16];
        snprintf(tag, sizeof tag, "adamw%zu", c);
        plain_job(&J, tag, os[c]);
        oracle(os[c], STEPS, want, gm);
        check_bits(&J, want, tag);
        KT_CHECK(J.final[0][0] != w0(0), "%s: the weights did not move", tag);
        kvps_optim o = resolved(os[c]);
        int tr = torch_check(&o, gm, J.final[0]);
        KT_CHECK(tr >= 0, "%s: torch.optim.AdamW disagrees (tests/adamw_torch.py said why above)", tag);
        torch_ran |= tr > 0;
    }
    /* Adam on the same job: not the same bits (a running product for the bias correction) */
    kvps_optim adam_o = {.rule = KVPS_RULE_ADAM, .lr = 0.002f};
    oracle(adam_o, STEPS, adam, NULL);
    int same = 0;
    for (int i = 0; i < N; i++) same += memcmp(&adam[i], &want[i], 4) == 0;
    printf("  Adam and AdamW (no decay) on the same gradients: %d of %d weights the same bits after %d steps\n", same, N, STEPS);
    if (!torch_ran) printf("  torch.optim.AdamW not compared: python3 cannot import torch here (python3-torch not installed)\n");
}

static void test_adamw_checked(void) {
    /* on inproc, where a raw client needs no hello */
    void *ctx = zmq_ctx_new();
    const char *list = "inproc://rules-hp";
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = list, .num_workers = NW, .zmq_ctx = ctx}, &srv[0]));
    KT_OK(kvps_server_start(srv[0]));
    kvps_worker *w = NULL;
    kvps_tensor t;
    kvps_req q;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = list, .rank = 0, .num_workers = NW, .zmq_ctx = ctx}, &w));
    KT_OK(kvps_worker_tensor(w, "hp", 4, &t));
    kvps_optim bad[] = {{.rule = KVPS_RULE_ADAMW, .weight_decay = -0.1f}, {.rule = KVPS_RULE_ADAMW, .weight_decay = NAN},
                        {.rule = KVPS_RULE_ADAM, .weight_decay = 0.01f}, {.rule = KVPS_RULE_SGD, .weight_decay = 0.01f}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kvps_result r = kvps_worker_tensor_optim(w, t, &bad[i], &q);
        KT_CHECK(r == KVPS_ERR_HYPERPARAM && strstr(kvps_worker_last_error(w), "weight_decay") &&
                 strstr(kvps_worker_last_error(w), "'hp'"), "case %zu: %s: %s", i, kvps_result_str(r), kvps_worker_last_error(w));
    }
    /* the server checks too: a raw CONFIG with weight_decay -1, one with decay under SGD */
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    zmq_connect(d, list);
    kvps__kent e = {123, 4};
    unsigned char meta[48], rec[KVPS__OPTREC];
    kvps_optim raw[] = {{.rule = KVPS_RULE_ADAMW, .weight_decay = -1.0f}, {.rule = KVPS_RULE_SGD, .weight_decay = 0.5f}};
    for (int i = 0; i < 2; i++) {
        kvps__hdr h = KT_HDR(.op = KVPS__OP_CONFIG, .nkeys = 1, .req_id = (uint64_t)(9 + i));
        memcpy(meta, &h, 32);
        memcpy(meta + 32, &e, 16);
        kvps__optim_rec(&raw[i], rec);
        int32_t st = kt_raw_status(d, meta, 48, rec, sizeof rec, 2000);
        KT_CHECK(st == KVPS_ERR_HYPERPARAM, "raw CONFIG %d: the server answered %s", i, kvps_result_str((kvps_result)st));
    }
    /* a record of the old size (24 bytes) is refused, not read */
    kvps__hdr h = KT_HDR(.op = KVPS__OP_CONFIG, .nkeys = 1, .req_id = 20);
    memcpy(meta, &h, 32);
    int32_t st = kt_raw_status(d, meta, 48, rec, 24, 2000);
    KT_CHECK(st == KVPS_ERR_TRUNCATED, "a 24-byte CONFIG record: %s", kvps_result_str((kvps_result)st));
    zmq_close(d);
    /* a sparse table cannot count steps */
    kvps_table tb;
    kvps_result r = kvps_worker_table(w, &(kvps_table_desc){.name = "emb", .dim = 4, .opt = {.rule = KVPS_RULE_ADAMW}}, &tb, &q);
    KT_CHECK(r == KVPS_ERR_INVALID_ARG && strstr(kvps_worker_last_error(w), "'emb'"), "a table with AdamW: %s: %s",
             kvps_result_str(r), kvps_worker_last_error(w));
    /* a good AdamW config is taken */
    kvps_optim good = {.rule = KVPS_RULE_ADAMW, .lr = 0.1f, .weight_decay = 0.5f};
    KT_OK(kvps_worker_tensor_optim(w, t, &good, &q));
    KT_OK(kvps_worker_wait(w, q, -1));
    kvps_worker_destroy(&w);
    kvps_server_stop(srv[0]);
    kvps_server_destroy(&srv[0]);
    zmq_ctx_term(ctx);
}

/* ---- user rules -------------------------------------------------------------------------------- */

static const kvps_optim ams = {.rule = (kvps_rule)(KVPS_RULE_USER + 0), .lr = 0.01f, .beta1 = 0.8f, .beta2 = 0.95f,
                               .eps = 1e-6f, .weight_decay = 0.05f};

static void test_user_rule_equals_oracle(void) {
    static float want[N];
    plain_job(&J, "user", ams);
    oracle(ams, STEPS, want, NULL);
    check_bits(&J, want, "amsgradw");
    KT_CHECK(J.final[0][0] != w0(0), "the weights did not move");
    kvps_optim sq = {.rule = (kvps_rule)(KVPS_RULE_USER + 1), .lr = 0.05f};
    plain_job(&J, "user1", sq);
    oracle(sq, STEPS, want, NULL);
    check_bits(&J, want, "sgd-sqrt (no state)");
}

/* The last warning or error logged, while capture(1) is on. */
static char logged[2048];
static void log_keep(void *user, kvps_log_level level, const char *msg) {
    (void)user;
    if (level <= KVPS_LOG_WARN) snprintf(logged, sizeof logged, "%s", msg);
}
static void capture(int on) {
    logged[0] = 0;
    kvps_log_set_fn(on ? log_keep : NULL, NULL);
    kvps_log_set_level(on ? KVPS_LOG_WARN : KVPS_LOG_NONE);
}

static void test_user_rule_unknown(void) {
    char list[400];
    servers_up("unk", 1, 1, 0, 0, list, sizeof list);
    kvps_worker *w = NULL;
    kvps_tensor t;
    kvps_req q;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = list, .rank = 0, .num_workers = NW}, &w));
    KT_OK(kvps_worker_tensor(w, "emb.proj", 4, &t));
    kvps_optim o = {.rule = (kvps_rule)(KVPS_RULE_USER + 5)};
    KT_OK(kvps_worker_tensor_optim(w, t, &o, &q));
    kvps_result r = kvps_worker_wait(w, q, 5000);
    const char *e = kvps_worker_last_error(w);
    KT_CHECK(r == KVPS_ERR_INVALID_ARG && strstr(e, "'emb.proj'") && strstr(e, "user rule 5"), "%s: %s", kvps_result_str(r), e);
    printf("  %s\n", e);
    kvps_worker_destroy(&w);
    kvps_server_stop(srv[0]);
    kvps_server_destroy(&srv[0]);
    /* server descs that cannot work */
    kvps_user_rule nofn[] = {{"x", NULL, 1, NULL}}, big[] = {{"y", amsgradw, KVPS_MAX_RULE_STATE + 1, NULL}};
    kvps_server *s = NULL;
    capture(1);
    KT_CHECK(kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://rules-bad", .num_workers = 1, .user_rules = nofn,
                                                    .num_user_rules = 1}, &s) == KVPS_ERR_CONFIG && strstr(logged, "fn is NULL"),
             "a user rule without fn: %s", logged);
    KT_CHECK(kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://rules-bad", .num_workers = 1, .user_rules = big,
                                                    .num_user_rules = 1}, &s) == KVPS_ERR_CONFIG && strstr(logged, "n_state"),
             "a user rule with 9 state floats: %s", logged);
    capture(0);
}

static void test_user_rule_checkpoint(void) {
    static float want[N];
    oracle(ams, STEPS, want, NULL);
    memset(&J, 0, sizeof J);
    J.opt = ams;
    J.to = STEPS / 2;
    J.keep = 1;
    servers_up("ckpt", 2, 2, 1, 0, J.servers, sizeof J.servers);
    rjob_run(&J, "before the checkpoint");
    for (int i = 0; i < 2; i++) KT_OK(kvps_server_checkpoint(srv[i], 10000));
    for (int i = 0; i < 2; i++) kvps_server_destroy(&srv[i]);
    for (int r = 0; r < NW; r++) kvps_worker_destroy(&J.kept[r]);
    /* a server without the user rules refuses its checkpoint, naming the key and the rule */
    kvps_server *s = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://rules-norule", .num_workers = NW}, &s));
    capture(1);
    kvps_result r = kvps_server_restore(s, ckpt[0]);
    char why[sizeof logged];
    memcpy(why, logged, sizeof why);
    capture(0);
    KT_CHECK(r == KVPS_ERR_CHECKPOINT && strstr(why, "user rule 0") && strstr(why, "does not have"),
             "%s: %s", kvps_result_str(r), why);
    printf("  %s\n", why);
    kvps_server_destroy(&s);
    /* new servers from the checkpoints, new workers: steps 12-23 */
    J.from = STEPS / 2;
    J.to = STEPS;
    J.keep = 0;
    servers_up("ckpt", 2, 2, 1, 1, J.servers, sizeof J.servers);
    rjob_run(&J, "after the restore");
    servers_down(2, "after the restore");
    check_bits(&J, want, "restored from checkpoints");
    for (int i = 0; i < 2; i++) unlink(ckpt[i]);
}

/* A version-4 checkpoint (before weight_decay and the step), written here byte by byte as that
   version's writer wrote it: one momentum key of 3 floats with its state. It loads into this
   release, and the next round applies momentum to the loaded state. */
static void put(unsigned char *b, size_t *n, const void *p, size_t k) { memcpy(b + *n, p, k); *n += k; }
static void test_version4_checkpoint_loads(void) {
    static unsigned char b[1 << 16];
    size_t n = 0;
    uint32_t hdr[6] = {4, 0, 1, KVPS_BSP, 1, 0}, zero32 = 0, rule = KVPS_RULE_MOMENTUM, nstate = 1;
    uint64_t key = 4242, len = 3, round = 2, recv = 2, zero64 = 0;
    float f5[5] = {0.125f, 0.5f, KVPS_DEFAULT_BETA1, KVPS_DEFAULT_BETA2, KVPS_DEFAULT_EPS}, bt[2] = {1, 1};
    float value[3] = {1.0f, 2.0f, 3.0f}, state[3] = {0.5f, -1.0f, 2.0f};
    put(b, &n, "KVPSCKPT", 8);
    put(b, &n, hdr, sizeof hdr);
    put(b, &n, &zero32, 4); /* no placement */
    put(b, &n, &zero32, 4); /* generation */
    put(b, &n, &key, 8); put(b, &n, &len, 8); put(b, &n, &round, 8); put(b, &n, &rule, 4);
    put(b, &n, f5, sizeof f5); put(b, &n, &nstate, 4); put(b, &n, bt, sizeof bt);
    put(b, &n, &recv, 8); put(b, &n, value, sizeof value); put(b, &n, state, sizeof state);
    put(b, &n, &zero64, 8); /* worker 0: barriers */
    b[n++] = 0;             /* left */
    put(b, &n, &zero32, 4); /* incarnation */
    put(b, &n, &zero64, 8); /* hi */
    n += sizeof ((kvps__seen *)0)->bits; /* the window, zeros */
    uint32_t crc = kvps__crc32(0, b, n);
    put(b, &n, &crc, 4);
    put(b, &n, "KEND", 4);
    char path[96];
    snprintf(path, sizeof path, "/tmp/kvps-rules-v4-%d", (int)getpid());
    FILE *f = fopen(path, "wb");
    KT_CHECK(f && fwrite(b, 1, n, f) == n, "cannot write %s", path);
    if (f) fclose(f);
    void *ctx = zmq_ctx_new();
    kvps_server *sv = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://rules-v4", .num_workers = 1, .zmq_ctx = ctx}, &sv));
    capture(1);
    KT_CHECK(kvps_server_restore(sv, path) == KVPS_OK, "a version-4 checkpoint refused: %s", logged);
    capture(0);
    KT_OK(kvps_server_start(sv));
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = "inproc://rules-v4", .num_workers = 1, .zmq_ctx = ctx}, &w));
    float g[3] = {1.0f, 1.0f, 1.0f}, got[3];
    size_t l = 3;
    kvps_req q;
    KT_OK(kvps_worker_pushpull(w, &key, g, got, &l, 1, &q));
    KT_OK(kvps_worker_wait(w, q, 5000));
    for (int i = 0; i < 3; i++) {
        float v = f5[1] * state[i] + g[i], want = value[i] - f5[0] * v; /* momentum from the loaded state */
        KT_CHECK(memcmp(&got[i], &want, 4) == 0, "element %d: %.9g, want %.9g", i, (double)got[i], (double)want);
    }
    kvps_worker_destroy(&w);
    kvps_server_destroy(&sv);
    zmq_ctx_term(ctx);
    unlink(path);
}

/* A server process of a chain (shard s, place r); it exits 0 when it stopped by itself with KVPS_OK.
   A backup writes one byte to *synced_fd once it holds the shard (its snapshot came). */
static pid_t chain_server(const char *chain, int s, int r, int replacement, int *synced_fd) {
    int p[2];
    if (pipe(p) != 0) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        char me[96];
        const char *bar = strchr(chain, '|');
        if (r == 0) snprintf(me, sizeof me, "%.*s", (int)(bar - chain), chain);
        else snprintf(me, sizeof me, "%s", bar + 1);
        kvps_server *x = NULL;
        if (kvps_server_create(&(kvps_server_desc){.endpoint = me, .rank = s, .num_workers = NW, .heartbeat_ms = 200,
                                                   .peer_timeout_ms = 1000, .replicas = chain, .replica = r,
                                                   .replacement = replacement,
                                                   .user_rules = urules, .num_user_rules = NUR}, &x) != KVPS_OK)
            _exit(2);
        if (kvps_server_start(x) != KVPS_OK) _exit(3);
        kvps_result rc;
        int told = r == 0;
        while ((rc = kvps_server_wait(x, 5)) == KVPS_ERR_TIMEOUT) {
            kvps_server_stats st;
            kvps_server_stats_get(x, &st);
            if (!told && st.replicas_live >= 1 && !st.primary) told = write(p[1], "s", 1) == 1;
        }
        kvps_server_destroy(&x);
        _exit(rc == KVPS_OK ? 0 : 6);
    }
    close(p[1]);
    *synced_fd = p[0];
    return pid;
}

/* Every worker has done n steps (the gate holds them there). */
static void wait_done(const rjob *j, int n) {
    int64_t end = kt_now_ms() + 30000;
    for (int m = 0; m < n && kt_now_ms() < end; kt_sleep_ms(1)) {
        m = n;
        for (int r = 0; r < NW; r++) {
            int d = __atomic_load_n(&j->done[r], __ATOMIC_ACQUIRE);
            if (d < m) m = d;
        }
    }
}
/* Waits for a backup's byte saying it holds its shard; closes the pipe. */
static int synced_wait(int fd) {
    struct pollfd pf = {fd, POLLIN, 0};
    char c;
    int ok = poll(&pf, 1, 10000) == 1 && read(fd, &c, 1) == 1;
    close(fd);
    return ok;
}

/* 2 shards x 2 replicas, server processes. replace: at step 8 shard 0's backup is SIGKILLed and a
   replacement takes its place, which gets the user rule's state in a snapshot; at step 16 (12
   without replace) shard 0's primary is SIGKILLed and the backup goes on. */
static void primary_killed(int replace) {
    static float want[N];
    oracle(ams, STEPS, want, NULL);
    memset(&J, 0, sizeof J);
    J.opt = ams;
    J.to = STEPS;
    J.failover = 1;
    J.gate = replace ? 8 : 12;
    char chain[2][200];
    pid_t pid[2][2];
    int synced[2][2];
    size_t used = 0;
    for (int s = 0; s < 2; s++) {
        snprintf(chain[s], sizeof chain[s], "ipc://@kvps-rules-rep%d-%d-%d-0|ipc://@kvps-rules-rep%d-%d-%d-1", replace,
                 (int)getpid(), s, replace, (int)getpid(), s);
        used += (size_t)snprintf(J.servers + used, sizeof J.servers - used, "%s%s", s ? "," : "", chain[s]);
        for (int r = 0; r < 2; r++) pid[s][r] = chain_server(chain[s], s, r, 0, &synced[s][r]);
    }
    /* the workers start at once, while the backups may still be joining: a backup of the first
       chain that joins while the start barrier is open gets its snapshot all the same (before,
       the snapshot waited for the barrier, the barrier for rank 0, and rank 0 for its CONFIG
       answer, held for that backup: 5 of 15 runs stood still until the workers' timeouts) */
    for (int s = 0; s < 2; s++) close(synced[s][0]); /* (the backups' are closed at the end: they write to them) */
    kt_workers ws;
    kt_workers_init(&ws, replace ? "a replacement, then the primary killed" : "primary killed", rjob_worker, NW, J.servers, NULL);
    ws.user = &J;
    kt_workers_start(&ws);
    wait_done(&J, J.gate);
    if (replace) { /* the backup dies; a replacement on its endpoint catches up from a snapshot */
        kill(pid[0][1], SIGKILL);
        waitpid(pid[0][1], NULL, 0);
        kt_sleep_ms(100);
        int fd;
        pid[0][1] = chain_server(chain[0], 0, 1, 1, &fd);
        KT_CHECK(synced_wait(fd), "the replacement never held its shard");
        __atomic_store_n(&J.gate, 16, __ATOMIC_RELEASE);
        wait_done(&J, 16);
    }
    int killed_at = J.done[0];
    kill(pid[0][0], SIGKILL);
    waitpid(pid[0][0], NULL, 0);
    __atomic_store_n(&J.gate, 0, __ATOMIC_RELEASE);
    kt_workers_join(&ws);
    check_bits(&J, want, replace ? "a replacement, then shard 0's primary SIGKILLed" : "shard 0's primary SIGKILLed");
    KT_CHECK(killed_at == (replace ? 16 : 12), "the primary was killed after step %d", killed_at);
    printf("  %sshard 0's primary killed after step %d of %d\n", replace ? "a replacement took the backup's place at step 8, " : "",
           killed_at, STEPS);
    for (int s = 0; s < 2; s++)
        for (int r = 0; r < 2; r++) {
            if (s == 0 && r == 0) continue;
            int st = kt_wait_pid(pid[s][r], kt_now_ms() + 10000);
            KT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "server %d replica %d did not end by itself (status %d)", s,
                     r, st);
        }
    for (int s = 0; s < 2; s++) close(synced[s][1]);
}
static void test_user_rule_primary_killed(void) {
    primary_killed(0);
    primary_killed(1);
}

static void test_user_rule_reshard(void) {
    static float want[N];
    oracle(ams, STEPS, want, NULL);
    memset(&J, 0, sizeof J);
    J.opt = ams;
    J.to = STEPS;
    J.grow_at = STEPS / 2;
    servers_up("grow", 3, 2, 0, 0, J.servers, sizeof J.servers);
    snprintf(J.grow, sizeof J.grow, "%s,%s", J.servers, ep[2]);
    rjob_run(&J, "2 -> 3 servers");
    kvps_server_stats st;
    for (int i = 0; i < 3; i++) KT_CHECK(kvps_server_wait(srv[i], 10000) == KVPS_OK, "server %d did not stop by itself", i);
    kvps_server_stats_get(srv[2], &st);
    servers_down(3, "2 -> 3 servers");
    check_bits(&J, want, "2 -> 3 servers at step 12");
    KT_CHECK(st.keys >= 1, "the third server held no keys: nothing moved");
    printf("  the third server held %llu of %d keys\n", (unsigned long long)st.keys, NT);
}

int main(void) {
    kvps_log_set_level(getenv("KT_VERBOSE") ? KVPS_LOG_INFO : KVPS_LOG_NONE);
    KT_RUN(test_adamw_equals_formula, 120);
    KT_RUN(test_adamw_checked, 60);
    KT_RUN(test_user_rule_equals_oracle, 60);
    KT_RUN(test_user_rule_unknown, 60);
    KT_RUN(test_user_rule_checkpoint, 60);
    KT_RUN(test_version4_checkpoint_loads, 30);
    KT_RUN(test_user_rule_primary_killed, 120);
    KT_RUN(test_user_rule_reshard, 60);
    return kt_finish();
}
