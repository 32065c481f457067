/* Sharded push/pull: n = 1..4 servers x m = 1..8 workers on inproc, ipc and tcp, threads and
   processes; sums checked bit for bit against a naive sum in rank order. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"
#include <signal.h>
#include <sys/wait.h>

/* Gradient element i of tensor t from worker r in round k: deterministic, independent of order. */
static float grad_at(int r, int k, int t, size_t i) {
    uint64_t s = ((uint64_t)r << 48) ^ ((uint64_t)k << 32) ^ ((uint64_t)t << 24) ^ (uint64_t)i;
    return kt_randf(&s);
}

/* Oracle: UPDATE_SUM after `rounds` rounds = sum over rounds of (rank-order sum of workers). */
static float expected_at(int m, int rounds, int t, size_t i) {
    float acc = 0.0f;
    for (int k = 0; k < rounds; k++) {
        float s = grad_at(0, k, t, i);
        for (int r = 1; r < m; r++) s += grad_at(r, k, t, i);
        acc += s;
    }
    return acc;
}

/* What every worker of a run does: `rounds` rounds of push then pull over `ntensors` tensors. */
typedef struct pp_spec {
    int rounds, ntensors;
    const size_t *lens;
    size_t min_slice, max_slice;
} pp_spec;

static void worker_main(kt_wk *x) {
    const pp_spec *j = (const pp_spec *)x->ws->user;
    kvps_worker *w = NULL;
    kvps_result r = kvps_worker_create(&(kvps_worker_desc){.servers = x->ws->servers, .rank = x->rank,
                                                            .num_workers = x->k, .zmq_ctx = x->ws->ctx,
                                                            .min_slice = j->min_slice, .max_slice = j->max_slice,
                                                            .timeout_ms = 30000},
                                       &w);
    if (r != KVPS_OK) { kt_wk_fail(x, "create: %s", kvps_result_str(r)); return; }
    kvps_tensor t[16];
    float *g[16], *v[16];
    kvps_req q[32];
    for (int i = 0; i < j->ntensors; i++) {
        char name[32];
        snprintf(name, sizeof name, "tensor.%d", i);
        kvps_worker_tensor(w, name, j->lens[i], &t[i]);
        g[i] = (float *)malloc(j->lens[i] * sizeof(float));
        v[i] = (float *)malloc(j->lens[i] * sizeof(float));
    }
    for (int k = 0; k < j->rounds && !x->fails; k++) {
        for (int i = 0; i < j->ntensors; i++)
            for (size_t e = 0; e < j->lens[i]; e++) g[i][e] = grad_at(x->rank, k, i, e);
        /* all pushes in flight, then all pulls: a pull waits for its round under BSP */
        for (int i = 0; i < j->ntensors; i++) kvps_worker_push_tensor(w, t[i], g[i], &q[i]);
        for (int i = 0; i < j->ntensors; i++) kvps_worker_pull_tensor(w, t[i], v[i], &q[j->ntensors + i]);
        for (int i = 0; i < 2 * j->ntensors; i++) {
            r = kvps_worker_wait(w, q[i], -1);
            if (r != KVPS_OK)
                kt_wk_fail(x, "round %d wait: %s %.100s", k, kvps_result_str(r), kvps_worker_last_error(w));
        }
        for (int i = 0; i < j->ntensors && !x->fails; i++)
            for (size_t e = 0; e < j->lens[i]; e++) {
                float want = expected_at(x->k, k + 1, i, e);
                if (memcmp(&v[i][e], &want, sizeof want) != 0) {
                    kt_wk_fail(x, "round %d tensor %d [%zu]: %.9g want %.9g", k, i, e, v[i][e], want);
                    break;
                }
            }
    }
    for (int i = 0; i < j->ntensors; i++) { free(g[i]); free(v[i]); }
    kvps_worker_destroy(&w);
}

static size_t g_max_slice; /* 0: the default */

/* n servers, m workers on `transport`; returns how many workers failed (each reported). */
static int run_threads(const char *transport, int n, int m, const size_t *lens, int ntensors, int rounds,
                       size_t min_slice) {
    kt_cluster c;
    if (kt_cluster_up(&c, transport, n,
                      &(kvps_server_desc){.num_workers = m, .update = KVPS_UPDATE_ACCUMULATE}) != 0) {
        kt_cluster_down(&c);
        return 1;
    }
    pp_spec spec = {.rounds = rounds, .ntensors = ntensors, .lens = lens, .min_slice = min_slice, .max_slice = g_max_slice};
    char label[64];
    snprintf(label, sizeof label, "%s n=%d m=%d", transport, n, m);
    kt_workers ws;
    kt_workers_init(&ws, label, worker_main, m, c.servers, c.ctx);
    ws.user = &spec;
    int fails = kt_workers_run(&ws);
    /* Each server holds about 1/n of the bytes of the large tensors. */
    kt_cluster_down(&c);
    return fails;
}

static void test_matrix_inproc(void) {
    for (int n = 1; n <= 4; n++)
        for (int m = 1; m <= 8; m++) {
            size_t lens[6] = {1, (size_t)(n > 1 ? n - 1 : 2), 13, 101, 1031, 4099};
            int f = run_threads("inproc", n, m, lens, 6, 3, 8);
            KT_CHECK(f == 0, "n=%d m=%d: %d workers failed", n, m, f);
        }
}

static void test_tcp_and_ipc(void) {
    size_t lens[4] = {1, 7, 10007, 65537};
    KT_CHECK(run_threads("tcp", 3, 4, lens, 4, 3, 0) == 0, "tcp 3x4");
    KT_CHECK(run_threads("ipc", 2, 3, lens, 4, 3, 0) == 0, "ipc 2x3");
    KT_CHECK(run_threads("tcp", 4, 8, lens, 4, 2, 0) == 0, "tcp 4x8");
}

static void test_large_tensor(void) {
    /* 64 MB of float32 (16M floats), 2 servers x 2 workers on loopback TCP. */
    size_t lens[1] = {kt_quick() ? (size_t)1 << 20 : (size_t)16 << 20};
    KT_CHECK(run_threads("tcp", 2, 2, lens, 1, 1, 0) == 0, "64 MB tensor");
}

/* Tensors whose slices would pass max_slice are cut into more slices, a multiple of n, and each
   op goes out in rounds of one slice per server, all in flight: BSP sums stay exact with 1..13
   slices per server, pushes and pulls of several tensors interleaved. */
static void test_pieces_sums(void) {
    g_max_slice = 1000;
    size_t lens[6] = {1, 999, 1000, 1001, 10007, 65537};
    for (int n = 1; n <= 3; n++)
        for (int m = 1; m <= 3; m += 2) {
            int f = run_threads("inproc", n, m, lens, 6, 3, 8);
            KT_CHECK(f == 0, "n=%d m=%d: %d workers failed", n, m, f);
        }
    size_t big[2] = {10007, 262147};
    KT_CHECK(run_threads("tcp", 2, 2, big, 2, 2, 0) == 0, "tcp 2x2");
    g_max_slice = 0;
}

/* Slices of a cut tensor, seen through a zero-copy pull: they cover it in order, each at most
   max_slice (unless there are as many slices as elements), lengths within one element, a
   multiple of n of them (so every server holds as many), and no fewer slices would do. */
static void test_pieces_layout(void) {
    size_t maxs[3] = {1, 7, 1000}, lens[6] = {1, 5, 999, 1001, 2500, 10007};
    for (int n = 1; n <= 4; n++) {
        kt_cluster c;
        kt_cluster_up(&c, "inproc", n, &(kvps_server_desc){.num_workers = 1, .update = KVPS_UPDATE_ACCUMULATE});
        for (int mi = 0; mi < 3; mi++) {
            kvps_worker *w = NULL;
            KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers, .zmq_ctx = c.ctx, .min_slice = 1,
                                                         .max_slice = maxs[mi]}, &w));
            for (int li = 0; li < 6; li++) {
                size_t len = lens[li], ms = maxs[mi];
                char name[32];
                snprintf(name, sizeof name, "p%zu.%zu", len, ms);
                kvps_tensor t;
                kvps_req q;
                float *g = (float *)calloc(len, sizeof(float));
                KT_OK(kvps_worker_tensor(w, name, len, &t));
                KT_OK(kvps_worker_init_tensor(w, t, g, &q));
                KT_OK(kvps_worker_wait(w, q, -1));
                kvps_view *v = NULL;
                KT_OK(kvps_worker_pull_tensor_view(w, t, &v, &q));
                KT_OK(kvps_worker_wait(w, q, -1));
                size_t ns = kvps_worker_tensor_slices(w, t), covered = 0, lo = (size_t)-1, hi = 0;
                KT_CHECK(kvps_view_parts(v) == ns, "n=%d len %zu: %zu parts, %zu slices", n, len, kvps_view_parts(v), ns);
                for (size_t p = 0; p < kvps_view_parts(v); p++) {
                    size_t off = 0, plen = 0;
                    kvps_view_part(v, p, &off, &plen);
                    KT_CHECK(off == covered, "n=%d len %zu part %zu at %zu", n, len, p, off);
                    covered += plen;
                    if (plen < lo) lo = plen;
                    if (plen > hi) hi = plen;
                }
                KT_CHECK(covered == len && hi - lo <= 1, "n=%d len %zu: covered %zu, lengths %zu..%zu", n, len, covered, lo, hi);
                KT_CHECK(hi <= ms || ns == len, "n=%d len %zu max %zu: a slice of %zu in %zu", n, len, ms, hi, ns);
                size_t fewer = ns > (size_t)n ? ns - (size_t)n : 0; /* the next smaller multiple of n */
                KT_CHECK(ns <= (size_t)n || fewer == 0 || (len + fewer - 1) / fewer > ms,
                         "n=%d len %zu max %zu: %zu slices, %zu would do", n, len, ms, ns, fewer);
                KT_CHECK(ns <= (size_t)n || ns == len || ns % (size_t)n == 0, "n=%d len %zu: %zu slices, not a multiple",
                         n, len, ns);
                kvps_view_release(&v);
                free(g);
            }
            kvps_worker_destroy(&w);
        }
        kt_cluster_down(&c);
    }
}

/* Optimizers on a cut tensor: the CONFIG goes to every slice (two rounds per server here), and
   momentum SGD over three async pushes equals the same updates done one at a time here. */
static void test_pieces_optim(void) {
    enum { LEN = 10007, NP = 3 };
    kt_cluster c;
    kt_cluster_up(&c, "tcp", 2, &(kvps_server_desc){.num_workers = 1, .consistency = KVPS_ASYNC});
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers, .max_slice = 2000}, &w));
    kvps_tensor t;
    kvps_req q[NP];
    KT_OK(kvps_worker_tensor(w, "m", LEN, &t));
    KT_CHECK(kvps_worker_tensor_slices(w, t) == 6, "%zu slices", kvps_worker_tensor_slices(w, t));
    kvps_optim o = {KVPS_RULE_MOMENTUM, 0.05f, 0.8f, 0, 0, 0, 0};
    KT_OK(kvps_worker_tensor_optim(w, t, &o, &q[0]));
    KT_OK(kvps_worker_wait(w, q[0], -1));
    float *w0 = (float *)malloc(LEN * sizeof(float)), *g = (float *)malloc((size_t)NP * LEN * sizeof(float));
    float *ref = (float *)malloc(LEN * sizeof(float)), *v = (float *)calloc(LEN, sizeof(float));
    float *got = (float *)malloc(LEN * sizeof(float));
    uint64_t seed = 5;
    for (int i = 0; i < LEN; i++) ref[i] = w0[i] = kt_randf(&seed);
    for (int i = 0; i < NP * LEN; i++) g[i] = kt_randf(&seed);
    KT_OK(kvps_worker_init_tensor(w, t, w0, &q[0]));
    KT_OK(kvps_worker_wait(w, q[0], -1));
    for (int p = 0; p < NP; p++) KT_OK(kvps_worker_push_tensor(w, t, g + (size_t)p * LEN, &q[p]));
    for (int p = 0; p < NP; p++) KT_OK(kvps_worker_wait(w, q[p], -1));
    KT_OK(kvps_worker_pull_tensor(w, t, got, &q[0]));
    KT_OK(kvps_worker_wait(w, q[0], -1));
    for (int p = 0; p < NP; p++)
        for (int i = 0; i < LEN; i++) kt_optim_apply(&o, &ref[i], &v[i], NULL, g[(size_t)p * LEN + i], 1.0f, 1, 1);
    int bad = 0;
    for (int i = 0; i < LEN; i++) bad += memcmp(&got[i], &ref[i], 4) != 0;
    KT_CHECK(bad == 0, "%d of %d values differ from one update at a time", bad, LEN);
    kvps_worker_destroy(&w);
    kt_cluster_down(&c);
    free(w0); free(g); free(ref); free(v); free(got);
}

static void test_balance(void) {
    /* Slices are balanced by bytes: each of n servers holds within 1% of 1/n of a big tensor.
       1000003 floats need 4 slices of at most 1 MiB (the default max_slice); the count is then
       the next multiple of n. */
    static const size_t want[5] = {0, 4, 4, 6, 4};
    for (int n = 1; n <= 4; n++) {
        kt_cluster c;
        kt_cluster_up(&c, "inproc", n, &(kvps_server_desc){.num_workers = 1, .update = KVPS_UPDATE_ACCUMULATE});
        kvps_worker *w = NULL;
        KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers, .zmq_ctx = c.ctx}, &w));
        size_t len = 1000003;
        float *g = (float *)calloc(len, sizeof(float));
        kvps_tensor t;
        kvps_req q;
        KT_OK(kvps_worker_tensor(w, "big", len, &t));
        KT_CHECK(kvps_worker_tensor_slices(w, t) == want[n], "n=%d: %zu slices, want %zu", n, kvps_worker_tensor_slices(w, t),
                 want[n]);
        KT_OK(kvps_worker_push_tensor(w, t, g, &q));
        KT_OK(kvps_worker_wait(w, q, -1));
        for (int i = 0; i < n; i++) {
            kvps_server_stats st;
            kvps_server_stats_get(c.srv[i], &st);
            double share = (double)st.value_bytes / (double)(len * sizeof(float));
            KT_CHECK(share > 1.0 / n - 0.01 && share < 1.0 / n + 0.01, "server %d holds %.4f of n=%d", i, share, n);
        }
        free(g);
        kvps_worker_destroy(&w);
        kt_cluster_down(&c);
    }
}

/* Zero-copy pulls: the view's parts cover the tensor in order and hold the same bits as a
   copying pull, plain and fp16-coded, on 1..4 servers over inproc and TCP. */
static void test_pull_view(void) {
    const char *transports[2] = {"inproc", "tcp"};
    for (int tr = 0; tr < 2; tr++)
        for (int n = 1; n <= 4; n++)
            for (int coded = 0; coded <= 1; coded++) {
                kt_cluster c;
                if (kt_cluster_up(&c, transports[tr], n, &(kvps_server_desc){.num_workers = 1, .update = KVPS_UPDATE_ACCUMULATE})) {
                    KT_CHECK(0, "cluster");
                    kt_cluster_down(&c);
                    return;
                }
                kvps_worker *w = NULL;
                KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers, .zmq_ctx = c.ctx}, &w));
                size_t len = 100003;
                float *g = (float *)malloc(len * sizeof(float)), *copy = (float *)malloc(len * sizeof(float));
                uint64_t seed = (uint64_t)(n * 2 + coded);
                for (size_t i = 0; i < len; i++) g[i] = kt_randf(&seed);
                kvps_tensor t;
                kvps_req q;
                KT_OK(kvps_worker_tensor(w, "v", len, &t));
                kvps_codec f16 = kvps_codec_get(KVPS_CODEC_FP16);
                if (coded) KT_OK(kvps_worker_tensor_codec(w, t, NULL, &f16, 0));
                KT_OK(kvps_worker_init_tensor(w, t, g, &q));
                KT_OK(kvps_worker_wait(w, q, -1));
                KT_OK(kvps_worker_pull_tensor(w, t, copy, &q));
                KT_OK(kvps_worker_wait(w, q, -1));
                kvps_view *v = NULL;
                KT_OK(kvps_worker_pull_tensor_view(w, t, &v, &q));
                KT_OK(kvps_worker_wait(w, q, -1));
                /* a push after the pull must not change what the view shows (the server copies
                   a value still referenced by a reply before it writes: inproc shares buffers) */
                KT_OK(kvps_worker_push_tensor(w, t, g, &q));
                KT_OK(kvps_worker_wait(w, q, -1));
                size_t covered = 0, np = kvps_view_parts(v);
                KT_CHECK(np == kvps_worker_tensor_slices(w, t), "%zu parts", np);
                for (size_t p = 0; p < np; p++) {
                    size_t off = 0, plen = 0;
                    const float *d = kvps_view_part(v, p, &off, &plen);
                    KT_CHECK(d && off == covered, "%s n=%d part %zu at %zu, want %zu", transports[tr], n, p, off, covered);
                    if (!d || off != covered) break;
                    KT_CHECK(memcmp(d, copy + off, plen * sizeof(float)) == 0, "%s n=%d coded=%d part %zu differs",
                             transports[tr], n, coded, p);
                    covered += plen;
                }
                KT_CHECK(covered == len, "parts cover %zu of %zu", covered, len);
                if (!coded) KT_CHECK(memcmp(copy, g, len * sizeof(float)) == 0, "plain pull differs from init");
                KT_CHECK(kvps_view_part(v, np, NULL, NULL) == NULL, "part past the end");
                kvps_view_release(&v);
                KT_CHECK(v == NULL, "release clears the pointer");
                kvps_view_release(&v); /* NULL is fine */
                KT_CHECK(kvps_worker_pull_tensor_view(w, t, NULL, &q) == KVPS_ERR_INVALID_ARG, "NULL view");
                KT_CHECK(kvps_worker_pull_tensor_view(w, t + 7, &v, &q) == KVPS_ERR_TENSOR && v == NULL, "bad tensor");
                free(g);
                free(copy);
                kvps_worker_destroy(&w);
                kt_cluster_down(&c);
            }
}

static void test_raw_keys(void) {
    /* Many raw keys of different lengths in one call, spread over 3 servers, 2 workers. */
    kt_cluster c;
    kt_cluster_up(&c, "inproc", 3, &(kvps_server_desc){.num_workers = 2, .update = KVPS_UPDATE_ACCUMULATE});
    kvps_worker *w[2];
    enum { NK = 50 };
    uint64_t keys[NK];
    size_t lens[NK], total = 0;
    for (int i = 0; i < NK; i++) { keys[i] = (uint64_t)i * 7919u + 3; lens[i] = (size_t)(i % 9) + 1; total += lens[i]; }
    float *g[2], *v = (float *)malloc(total * sizeof(float));
    for (int r = 0; r < 2; r++) {
        KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers, .rank = r, .zmq_ctx = c.ctx}, &w[r]));
        g[r] = (float *)malloc(total * sizeof(float));
        for (size_t e = 0; e < total; e++) g[r][e] = grad_at(r, 0, 0, e);
    }
    kvps_req q0, q1;
    KT_OK(kvps_worker_push(w[1], keys, g[1], lens, NK, &q1)); /* rank 1 first: order must not matter */
    KT_OK(kvps_worker_push(w[0], keys, g[0], lens, NK, &q0));
    KT_OK(kvps_worker_wait(w[1], q1, -1));
    KT_OK(kvps_worker_wait(w[0], q0, -1));
    KT_OK(kvps_worker_pull(w[0], keys, v, lens, NK, &q0));
    KT_OK(kvps_worker_wait(w[0], q0, -1));
    int bad = 0;
    for (size_t e = 0; e < total; e++) {
        float want = grad_at(0, 0, 0, e) + grad_at(1, 0, 0, e);
        bad += memcmp(&v[e], &want, sizeof want) != 0;
    }
    KT_CHECK(bad == 0, "%d of %zu values differ", bad, total);
    /* keys really are spread: every server holds some */
    for (int i = 0; i < 3; i++) {
        kvps_server_stats st;
        kvps_server_stats_get(c.srv[i], &st);
        KT_CHECK(st.keys > 5, "server %d holds %llu keys", i, (unsigned long long)st.keys);
    }
    for (int r = 0; r < 2; r++) { kvps_worker_destroy(&w[r]); free(g[r]); }
    free(v);
    kt_cluster_down(&c);
}

/* Many requests in flight, completed out of order with test() and wait(). One worker, so every
   pushpull returns the running sum. With a large value the server sends replies without a copy
   while later pushes update the key: each reply must still hold the value of its own step. */
static void inflight(size_t len) {
    kt_cluster c;
    kt_cluster_up(&c, "tcp", 2, &(kvps_server_desc){.num_workers = 1, .update = KVPS_UPDATE_ACCUMULATE});
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers}, &w));
    enum { NQ = 200 };
    kvps_req q[NQ];
    float *one = (float *)malloc(len * sizeof(float)), *out = (float *)malloc(NQ * len * sizeof(float));
    for (size_t e = 0; e < len; e++) one[e] = (float)(e % 5);
    uint64_t key = 42;
    for (int i = 0; i < NQ; i++) KT_OK(kvps_worker_pushpull(w, &key, one, out + i * len, &len, 1, &q[i]));
    int done_count = 0;
    for (int spin = 0; spin < 100000 && done_count < NQ / 2; spin++) {
        for (int i = NQ - 1; i >= NQ / 2; i--) {
            if (!q[i]) continue;
            int done = 0;
            KT_OK(kvps_worker_test(w, q[i], &done));
            if (done) { q[i] = 0; done_count++; }
        }
    }
    KT_CHECK(done_count == NQ / 2, "test() completed %d", done_count);
    for (int i = 0; i < NQ / 2; i++) KT_OK(kvps_worker_wait(w, q[i], -1));
    int bad = 0;
    for (int i = 0; i < NQ; i++)
        for (size_t e = 0; e < len; e++) bad += out[i * len + e] != (float)(i + 1) * (float)(e % 5);
    KT_CHECK(bad == 0, "len %zu: %d values differ from their step's sum", len, bad);
    KT_CHECK(kvps_worker_wait(w, q[0], 0) == KVPS_ERR_INVALID_REQ, "completed handle is invalid");
    free(one);
    free(out);
    kvps_worker_destroy(&w);
    kt_cluster_down(&c);
}

static void test_inflight_and_test(void) {
    inflight(3);
    inflight(20000); /* 80 KB: zero-copy replies, copy-on-write updates */
}

static void test_barrier_and_pull_waits(void) {
    /* BSP: a pull after a push waits for the slow worker's push. */
    kt_cluster c;
    kt_cluster_up(&c, "inproc", 1, &(kvps_server_desc){.num_workers = 2, .update = KVPS_UPDATE_MEAN});
    kvps_worker *a, *b;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers, .rank = 0, .zmq_ctx = c.ctx}, &a));
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers, .rank = 1, .zmq_ctx = c.ctx}, &b));
    uint64_t key = 5;
    size_t len = 1;
    float ga = 2.0f, gb = 6.0f, va = -1, vb = -1;
    kvps_req qa, qb;
    KT_OK(kvps_worker_pushpull(a, &key, &ga, &va, &len, 1, &qa));
    KT_CHECK(kvps_worker_wait(a, qa, 200) == KVPS_ERR_TIMEOUT, "pull must wait for worker 1");
    KT_OK(kvps_worker_pushpull(b, &key, &gb, &vb, &len, 1, &qb));
    KT_OK(kvps_worker_wait(a, qa, -1));
    KT_OK(kvps_worker_wait(b, qb, -1));
    KT_CHECK(va == 4.0f && vb == 4.0f, "mean %g %g", va, vb);
    /* barrier: a's barrier completes only after b enters */
    KT_OK(kvps_worker_barrier(a, &qa));
    KT_CHECK(kvps_worker_wait(a, qa, 100) == KVPS_ERR_TIMEOUT, "barrier must wait");
    KT_OK(kvps_worker_barrier(b, &qb));
    KT_OK(kvps_worker_wait(b, qb, -1));
    KT_OK(kvps_worker_wait(a, qa, -1));
    kvps_worker_destroy(&a);
    kvps_worker_destroy(&b);
    kt_cluster_down(&c);
}

/* Processes on loopback TCP: servers and workers are separate processes. */
static void test_processes(void) {
    enum { N = 3, M = 4 };
    pid_t spid[N], wpid[M];
    char servers[1024] = "";
    for (int i = 0; i < N; i++) {
        char ep[256];
        spid[i] = kt_server_proc(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .rank = i, .num_workers = M,
                                                     .update = KVPS_UPDATE_ACCUMULATE},
                                 ep, sizeof ep);
        if (spid[i] < 0) { KT_CHECK(0, "pipe"); return; }
        KT_CHECK(ep[0], "server %d did not report an endpoint", i);
        snprintf(servers + strlen(servers), sizeof servers - strlen(servers), "%s%s", i ? "," : "", ep);
    }
    size_t lens[3] = {3, 4099, 300007};
    for (int r = 0; r < M; r++) {
        wpid[r] = fork();
        if (wpid[r] == 0) {
            pp_spec spec = {.rounds = 3, .ntensors = 3, .lens = lens};
            static kt_workers ws;
            kt_workers_init(&ws, "process", worker_main, M, servers, NULL);
            ws.user = &spec;
            int fails = kt_workers_run_one(&ws, r);
            if (fails) printf("  process worker %d: %s\n", r, ws.wk[r].why);
            fflush(stdout);
            _exit(fails ? 1 : 0);
        }
    }
    for (int r = 0; r < M; r++) {
        int st = 0;
        waitpid(wpid[r], &st, 0);
        KT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker process %d status %d", r, st);
    }
    for (int i = 0; i < N; i++) kt_server_proc_stop(spid[i]);
}

int main(void) {
    kvps_log_set_level(KVPS_LOG_ERROR);
    KT_RUN(test_raw_keys);
    KT_RUN(test_barrier_and_pull_waits);
    KT_RUN(test_inflight_and_test);
    KT_RUN(test_balance);
    KT_RUN(test_pieces_sums);
    KT_RUN(test_pieces_layout);
    KT_RUN(test_pieces_optim);
    KT_RUN(test_pull_view);
    KT_RUN(test_processes);
    KT_RUN(test_matrix_inproc);
    KT_RUN(test_tcp_and_ipc);
    KT_RUN(test_large_tensor);
    return kt_finish();
}
