/* test_ring_api - kvps_ring.h's API around the collectives: non-blocking post / wait / test
   (handles, timeouts, an op queued at destroy), argument checks (nothing reaches the wire, the
   ring still works after them), bad descs, .io_cpus against the kernel's affinity of the
   threads it pinned (ring, server and worker), and kvps_ring_env_read. */
#define _GNU_SOURCE /* sched_getaffinity of a thread: the oracle for .io_cpus */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "kvps_ring.h"
#include "tests/kvps_test.h"
#include "tests/kt_coll.h"
#include <dirent.h>
#include <sched.h>
#include <signal.h>

/* ---------------------------------------------------------------------------------------- */
/* Non-blocking */

static void nb_main(kt_rk *x) {
    int k = x->k, me = x->rank;
    size_t n1 = 1031, n2 = 77, n3 = 13;
    float *a = (float *)kt_xmalloc(n1 * sizeof *a), *ar = (float *)kt_xmalloc(n1 * sizeof *ar);
    int64_t *b = (int64_t *)kt_xmalloc(n2 * sizeof *b);
    double *c = (double *)kt_xmalloc(n3 * sizeof *c), *cr = (double *)kt_xmalloc(n3 * (size_t)k * sizeof *cr);
    int32_t *d = (int32_t *)kt_xmalloc(n3 * (size_t)k * sizeof *d);
    for (size_t i = 0; i < n1; i++) a[i] = (float)(me + 1) * (float)(i % 7);
    for (size_t i = 0; i < n2; i++) b[i] = me == 1 ? (int64_t)i * 1000003 : -1;
    for (size_t i = 0; i < n3; i++) c[i] = me * 100.0 + (double)i;
    for (size_t i = 0; i < n3 * (size_t)k; i++) d[i] = (int32_t)((size_t)me * 1000 + i);
    kvps_ring_op ops[5] = {
        {.coll = KVPS_COLL_ALLREDUCE, .send = a, .recv = ar, .count = n1, .dtype = KVPS_FLOAT32, .algo = KVPS_ALGO_RING},
        {.coll = KVPS_COLL_BROADCAST, .recv = b, .count = n2, .dtype = KVPS_INT64, .root = 1},
        {.coll = KVPS_COLL_ALLGATHER, .send = c, .recv = cr, .count = n3, .dtype = KVPS_FLOAT64},
        {.coll = KVPS_COLL_REDUCE_SCATTER, .recv = d, .count = n3, .dtype = KVPS_INT32, .op = KVPS_MAX},
        {.coll = KVPS_COLL_BARRIER},
    };
    kvps_ring_req q[5];
    for (int i = 0; i < 5; i++) {
        kvps_result rc = kvps_ring_post(x->r, &ops[i], &q[i]);
        if (rc != KVPS_OK || q[i] == 0) kt_rk_fail(x, "post %d: %s", i, kvps_result_str(rc));
    }
    /* the last by test(), then the rest in reverse order by wait() */
    int done = 0;
    for (int spin = 0; spin < 200000 && !done; spin++) {
        kvps_result rc = kvps_ring_test(x->r, q[4], &done);
        if (rc != KVPS_OK) { kt_rk_fail(x, "test: %s", kvps_result_str(rc)); break; }
        if (!done) kt_sleep_ms(1);
    }
    if (!done) kt_rk_fail(x, "rank %d: barrier never completed", me);
    for (int i = 3; i >= 0; i--) {
        kvps_result rc = kvps_ring_wait(x->r, q[i], -1);
        if (rc != KVPS_OK) kt_rk_fail(x, "wait %d: %s", i, kvps_result_str(rc));
    }
    for (size_t i = 0; i < n1; i++) {
        float want = 0;
        for (int r = 0; r < k; r++) want += (float)(r + 1) * (float)(i % 7);
        if (ar[i] != want) { kt_rk_fail(x, "posted allreduce [%zu] = %g want %g", i, ar[i], want); break; }
    }
    for (size_t i = 0; i < n2; i++)
        if (b[i] != (int64_t)i * 1000003) { kt_rk_fail(x, "posted broadcast [%zu] = %lld", i, (long long)b[i]); break; }
    for (int r = 0; r < k; r++)
        for (size_t i = 0; i < n3; i++)
            if (cr[(size_t)r * n3 + i] != r * 100.0 + (double)i) { kt_rk_fail(x, "posted allgather [%d][%zu]", r, i); r = k; break; }
    for (size_t i = 0; i < n3; i++)
        if (d[i] != (int32_t)((size_t)(k - 1) * 1000 + (size_t)me * n3 + i)) { kt_rk_fail(x, "posted reduce_scatter [%zu] = %d", i, d[i]); break; }
    /* handles: completed, zero, never issued */
    if (kvps_ring_wait(x->r, q[0], 0) != KVPS_ERR_INVALID_REQ) kt_rk_fail(x, "wait on a completed handle is not INVALID_REQ");
    if (kvps_ring_wait(x->r, 0, 0) != KVPS_ERR_INVALID_REQ) kt_rk_fail(x, "wait on handle 0 is not INVALID_REQ");
    if (kvps_ring_wait(x->r, 987654321, 10) != KVPS_ERR_INVALID_REQ) kt_rk_fail(x, "wait on an unknown handle is not INVALID_REQ");
    done = 7;
    if (kvps_ring_test(x->r, 987654321, &done) != KVPS_ERR_INVALID_REQ || done != 0) kt_rk_fail(x, "test on an unknown handle");
    /* a posted op, then a blocking call behind it, then the wait */
    for (size_t i = 0; i < n1; i++) a[i] = (float)me;
    kvps_ring_req q1;
    kvps_ring_op o1 = {.coll = KVPS_COLL_ALLREDUCE, .recv = a, .count = n1, .dtype = KVPS_FLOAT32, .op = KVPS_MAX};
    if (kvps_ring_post(x->r, &o1, &q1) != KVPS_OK) kt_rk_fail(x, "post");
    for (size_t i = 0; i < n3; i++) c[i] = 1.5;
    if (!kt_rk_call(x, kvps_ring_allreduce(x->r, NULL, c, n3, KVPS_FLOAT64, KVPS_SUM), "blocking behind posted")) goto out;
    if (kvps_ring_wait(x->r, q1, -1) != KVPS_OK) kt_rk_fail(x, "wait q1");
    for (size_t i = 0; i < n1; i++)
        if (a[i] != (float)(k - 1)) { kt_rk_fail(x, "posted max [%zu] = %g", i, a[i]); break; }
    for (size_t i = 0; i < n3; i++)
        if (c[i] != 1.5 * k) { kt_rk_fail(x, "blocking sum [%zu] = %g", i, c[i]); break; }
    /* wait with a timeout: rank 0 posts first and the others come 300 ms later */
    if (me != 0) kt_sleep_ms(300);
    for (size_t i = 0; i < n3; i++) c[i] = 2.0;
    kvps_ring_op o2 = {.coll = KVPS_COLL_ALLREDUCE, .recv = c, .count = n3, .dtype = KVPS_FLOAT64, .op = KVPS_SUM};
    if (kvps_ring_post(x->r, &o2, &q1) != KVPS_OK) kt_rk_fail(x, "post o2");
    if (me == 0) {
        kvps_result rc = kvps_ring_wait(x->r, q1, 50);
        if (rc != KVPS_ERR_TIMEOUT) kt_rk_fail(x, "wait(50 ms) on an op the others have not joined: %s", kvps_result_str(rc));
        done = 1;
        rc = kvps_ring_test(x->r, q1, &done);
        if (rc != KVPS_OK || done) kt_rk_fail(x, "test on a pending op: %s done=%d", kvps_result_str(rc), done);
    }
    if (kvps_ring_wait(x->r, q1, -1) != KVPS_OK) kt_rk_fail(x, "wait o2");
    for (size_t i = 0; i < n3; i++)
        if (c[i] != 2.0 * k) { kt_rk_fail(x, "o2 [%zu] = %g", i, c[i]); break; }
    /* an invalid op is refused at post and gives no handle */
    kvps_ring_op bad = {.coll = KVPS_COLL_ALLREDUCE, .recv = c, .count = n3, .dtype = (kvps_dtype)9};
    q1 = 77;
    if (kvps_ring_post(x->r, &bad, &q1) != KVPS_ERR_INVALID_ARG || q1 != 0) kt_rk_fail(x, "post of a bad dtype");
    /* an op still queued at destroy runs first: destroy returns after it, buffers released */
    for (size_t i = 0; i < n3; i++) c[i] = 1.0;
    if (kvps_ring_post(x->r, &o2, &q1) != KVPS_OK) kt_rk_fail(x, "post o2 again");
    kvps_ring_destroy(&x->r);
    for (size_t i = 0; i < n3; i++)
        if (c[i] != 1.0 * k) { kt_rk_fail(x, "op queued at destroy: [%zu] = %g", i, c[i]); break; }
out:
    free(a); free(ar); free(b); free(c); free(cr); free(d);
}

static void test_nonblocking(void) {
    kt_team t;
    kt_team_init(&t, "nonblocking", nb_main, 3, 0, kt_quick() ? 60000 : 10000);
    kt_team_run(&t);
}

/* ---------------------------------------------------------------------------------------- */
/* Arguments, descs, environment */

static void badarg_main(kt_rk *x) {
    kvps_ring *r = x->r;
    float f[8] = {0}, g[16] = {0};
    kvps_ring_req req = 0;
    if (x->rank == 0) {
        struct { const char *name; kvps_result rc; } c[] = {
            {"dtype 6", kvps_ring_allreduce(r, f, g, 8, (kvps_dtype)6, KVPS_SUM)},
            {"dtype -1", kvps_ring_allreduce(r, f, g, 8, (kvps_dtype)-1, KVPS_SUM)},
            {"op 5", kvps_ring_allreduce(r, f, g, 8, KVPS_FLOAT32, (kvps_redop)5)},
            {"op -1", kvps_ring_reduce(r, f, g, 8, KVPS_FLOAT32, (kvps_redop)-1, 0)},
            {"allreduce recv NULL", kvps_ring_allreduce(r, f, NULL, 8, KVPS_FLOAT32, KVPS_SUM)},
            {"reduce root -1", kvps_ring_reduce(r, f, g, 8, KVPS_FLOAT32, KVPS_SUM, -1)},
            {"reduce root = size", kvps_ring_reduce(r, f, g, 8, KVPS_FLOAT32, KVPS_SUM, x->k)},
            {"reduce root's recv NULL", kvps_ring_reduce(r, f, NULL, 8, KVPS_FLOAT32, KVPS_SUM, 0)},
            {"reduce non-root send and recv NULL", kvps_ring_reduce(r, NULL, NULL, 8, KVPS_FLOAT32, KVPS_SUM, 1)},
            {"reduce_scatter recv NULL", kvps_ring_reduce_scatter(r, g, NULL, 8, KVPS_FLOAT32, KVPS_SUM)},
            {"allgather recv NULL", kvps_ring_allgather(r, f, NULL, 8, KVPS_FLOAT32)},
            {"broadcast recv NULL", kvps_ring_broadcast(r, f, NULL, 8, KVPS_FLOAT32, 0)},
            {"broadcast root 2", kvps_ring_broadcast(r, f, g, 8, KVPS_FLOAT32, 2)},
            {"gather root's recv NULL", kvps_ring_gather(r, f, NULL, 8, KVPS_FLOAT32, 0)},
            {"gather non-root send NULL", kvps_ring_gather(r, NULL, g, 8, KVPS_FLOAT32, 1)},
            {"scatter recv NULL", kvps_ring_scatter(r, g, NULL, 8, KVPS_FLOAT32, 0)},
            {"alltoall recv NULL", kvps_ring_alltoall(r, g, NULL, 8, KVPS_FLOAT32)},
            {"count 2^40", kvps_ring_allreduce(r, f, g, (size_t)1 << 40, KVPS_FLOAT32, KVPS_SUM)},
            {"ring NULL", kvps_ring_allreduce(NULL, f, g, 8, KVPS_FLOAT32, KVPS_SUM)},
            {"barrier NULL", kvps_ring_barrier(NULL)},
            {"run op NULL", kvps_ring_run(r, NULL)},
            {"run coll 0", kvps_ring_run(r, &(kvps_ring_op){.coll = (kvps_coll)0, .recv = g, .count = 1})},
            {"run coll 10", kvps_ring_run(r, &(kvps_ring_op){.coll = (kvps_coll)10, .recv = g, .count = 1})},
            {"run algo KVPS_ALGO_COUNT", kvps_ring_run(r, &(kvps_ring_op){.coll = KVPS_COLL_ALLREDUCE, .recv = g, .count = 1, .algo = KVPS_ALGO_COUNT})},
            {"post out NULL", kvps_ring_post(r, &(kvps_ring_op){.coll = KVPS_COLL_ALLREDUCE, .recv = g, .count = 1}, NULL)},
            {"post ring NULL", kvps_ring_post(NULL, &(kvps_ring_op){.coll = KVPS_COLL_ALLREDUCE, .recv = g, .count = 1}, &req)},
            {"wait ring NULL", kvps_ring_wait(NULL, 1, 0)},
            {"test done NULL", kvps_ring_test(r, 1, NULL)},
            {"connect peers NULL", kvps_ring_connect(r, NULL)},
        };
        for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
            if (c[i].rc != KVPS_ERR_INVALID_ARG) kt_rk_fail(x, "%s: %s, want KVPS_ERR_INVALID_ARG", c[i].name, kvps_result_str(c[i].rc));
        kvps_result rc = kvps_ring_connect(r, "inproc://a,inproc://b");
        if (rc != KVPS_ERR_STATE) kt_rk_fail(x, "second connect: %s, want KVPS_ERR_STATE", kvps_result_str(rc));
        /* count 0 needs no buffers */
        if (!kt_rk_call(x, kvps_ring_allreduce(r, NULL, NULL, 0, KVPS_FLOAT32, KVPS_SUM), "count 0, NULL buffers")) return;
    } else {
        if (!kt_rk_call(x, kvps_ring_allreduce(r, NULL, NULL, 0, KVPS_FLOAT32, KVPS_SUM), "count 0, NULL buffers")) return;
    }
    /* nothing above reached the wire: the ring still works, in step */
    for (int i = 0; i < 8; i++) f[i] = (float)(x->rank + i);
    if (kt_rk_call(x, kvps_ring_allreduce(r, NULL, f, 8, KVPS_FLOAT32, KVPS_SUM), "allreduce after bad calls"))
        for (int i = 0; i < 8; i++)
            if (f[i] != (float)(1 + 2 * i)) { kt_rk_fail(x, "after bad calls [%d] = %g", i, f[i]); break; }
}

/* Every value of each enum has its own name (for messages); a value past _COUNT is "?". */
static const char *name_dtype(int v) { return kvps_dtype_name((kvps_dtype)v); }
static const char *name_redop(int v) { return kvps_redop_name((kvps_redop)v); }
static const char *name_coll(int v) { return kvps_coll_name((kvps_coll)v); }
static const char *name_algo(int v) { return kvps_algo_name((kvps_ring_algo)v); }
static void test_names(void) {
    struct { const char *(*name)(int); int count; const char *what; const char *first; } enums[] = {
        {name_dtype, KVPS_DTYPE_COUNT, "dtype", "float32"},
        {name_redop, KVPS_REDOP_COUNT, "redop", "sum"},
        {name_coll, KVPS_COLL_COUNT, "coll", "none"},
        {name_algo, KVPS_ALGO_COUNT, "algo", "auto"},
    };
    for (size_t e = 0; e < sizeof enums / sizeof enums[0]; e++) {
        KT_CHECK(strcmp(enums[e].name(0), enums[e].first) == 0, "%s 0 is '%s'", enums[e].what, enums[e].name(0));
        for (int i = 0; i < enums[e].count; i++) {
            KT_CHECK(strcmp(enums[e].name(i), "?") != 0, "%s %d has no name", enums[e].what, i);
            for (int j = 0; j < i; j++)
                KT_CHECK(strcmp(enums[e].name(i), enums[e].name(j)) != 0, "%s %d and %d are both '%s'", enums[e].what, j, i,
                         enums[e].name(i));
        }
        KT_CHECK(strcmp(enums[e].name(enums[e].count), "?") == 0 && strcmp(enums[e].name(-1), "?") == 0,
                 "%s out of range is not '?'", enums[e].what);
    }
    KT_CHECK(strcmp(kvps_dtype_name(KVPS_BFLOAT16), "bfloat16") == 0 && strcmp(kvps_coll_name(KVPS_COLL_REDUCE_SCATTER),
             "reduce_scatter") == 0 && strcmp(kvps_redop_name(KVPS_AVG), "avg") == 0, "names out of order");
}

static void test_bad_arguments(void) {
    kt_team t;
    kt_team_init(&t, "bad-arguments", badarg_main, 2, 0, 10000);
    kt_team_run(&t);
}

static void test_bad_desc(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    void *ctx = zmq_ctx_new();
    kvps_ring *r = (kvps_ring *)&r;
    struct { const char *name; kvps_ring_desc d; kvps_result want; } c[] = {
        {"size 0", {.rank = 0, .size = 0, .bind = "inproc://bd"}, KVPS_ERR_CONFIG},
        {"rank -1", {.rank = -1, .size = 2, .bind = "inproc://bd"}, KVPS_ERR_CONFIG},
        {"rank = size", {.rank = 2, .size = 2, .bind = "inproc://bd"}, KVPS_ERR_CONFIG},
        {"size 65536", {.rank = 0, .size = 65536, .bind = "inproc://bd"}, KVPS_ERR_CONFIG},
        {"timeout -1", {.rank = 0, .size = 2, .bind = "inproc://bd", .timeout_ms = -1}, KVPS_ERR_CONFIG},
        {"algo KVPS_ALGO_COUNT", {.rank = 0, .size = 2, .bind = "inproc://bd", .algo = KVPS_ALGO_COUNT}, KVPS_ERR_CONFIG},
        {"no peers, no bind", {.rank = 0, .size = 2}, KVPS_ERR_CONFIG},
        {"3 peers for 2 ranks", {.rank = 0, .size = 2, .peers = "inproc://x0,inproc://x1,inproc://x2"}, KVPS_ERR_CONFIG},
        {"1 peer for 2 ranks", {.rank = 0, .size = 2, .peers = "inproc://x0"}, KVPS_ERR_CONFIG},
        {"empty peer entry", {.rank = 0, .size = 2, .peers = "inproc://x0,"}, KVPS_ERR_CONFIG},
        {"unbindable", {.rank = 0, .size = 2, .bind = "nonsense://x"}, KVPS_ERR_BIND},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        c[i].d.zmq_ctx = ctx;
        r = (kvps_ring *)&r;
        kvps_result rc = kvps_ring_create(&c[i].d, &r);
        KT_CHECK(rc == c[i].want, "%s: %s, want %s", c[i].name, kvps_result_str(rc), kvps_result_str(c[i].want));
        KT_CHECK(r == NULL, "%s: *out not NULL", c[i].name);
        if (rc == KVPS_OK) kvps_ring_destroy(&r);
    }
    KT_CHECK(kvps_ring_create(NULL, &r) == KVPS_ERR_INVALID_ARG, "NULL desc");
    KT_CHECK(kvps_ring_create(&(kvps_ring_desc){.size = 1, .bind = "inproc://bd"}, NULL) == KVPS_ERR_INVALID_ARG, "NULL out");
    /* bound but not connected: collectives refuse; connect checks its list */
    KT_OK(kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 2, .bind = "inproc://bd-ok", .zmq_ctx = ctx}, &r));
    if (r) {
        KT_CHECK(strcmp(kvps_ring_endpoint(r), "inproc://bd-ok") == 0, "endpoint '%s'", kvps_ring_endpoint(r));
        float v = 1;
        KT_CHECK(kvps_ring_allreduce(r, NULL, &v, 1, KVPS_FLOAT32, KVPS_SUM) == KVPS_ERR_STATE, "collective before connect");
        KT_CHECK(kvps_ring_last_error(r)[0] != 0, "no message for the state error");
        KT_CHECK(kvps_ring_connect(r, "inproc://bd-ok") == KVPS_ERR_CONFIG, "connect with 1 endpoint for 2 ranks");
        kvps_ring_destroy(&r);
        KT_CHECK(r == NULL, "destroy sets NULL");
    }
    kvps_ring_destroy(&r);
    kvps_ring_destroy(NULL);
    KT_CHECK(kvps_ring_endpoint(NULL) == NULL, "endpoint(NULL)");
    KT_CHECK(kvps_ring_last_error(NULL) != NULL, "last_error(NULL)");
    /* a ring of one, with its own context: everything is local */
    KT_OK(kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 1, .peers = "tcp://127.0.0.1:*"}, &r));
    if (r) {
        double d[3] = {1, 2, 3}, e[3] = {0, 0, 0};
        KT_OK(kvps_ring_allreduce(r, d, e, 3, KVPS_FLOAT64, KVPS_AVG));
        KT_CHECK(e[0] == 1 && e[1] == 2 && e[2] == 3, "size-1 avg %g %g %g", e[0], e[1], e[2]);
        KT_OK(kvps_ring_barrier(r));
        kvps_ring_destroy(&r);
    }
    KT_CHECK(kvps_dtype_size(KVPS_FLOAT32) == 4 && kvps_dtype_size(KVPS_FLOAT64) == 8 && kvps_dtype_size(KVPS_INT32) == 4 &&
             kvps_dtype_size(KVPS_INT64) == 8 && kvps_dtype_size(KVPS_FLOAT16) == 2 && kvps_dtype_size(KVPS_BFLOAT16) == 2 &&
             kvps_dtype_size((kvps_dtype)6) == 0 && kvps_dtype_size((kvps_dtype)-1) == 0, "kvps_dtype_size");
    zmq_ctx_term(ctx);
    kvps_log_set_level(KVPS_LOG_ERROR);
}

/* ---- .sndbuf_bytes: SO_SNDBUF of the connections to peers (manual section 4) ---------------- */

/* Connects rank 0 of a 5-rank ring to peers that need not exist (ZeroMQ connects in the
   background) and reads the SO_SNDBUF each connection's socket was given (-1: the OS's). */
static void test_sndbuf(void) {
    const char *peers = "tcp://127.0.0.1:*,tcp://127.0.0.1:1,tcp://localhost:2,tcp://[::1]:3,tcp://192.0.2.1:4";
    struct { const char *name; int desc; int want[5]; } c[] = {
        {"default: 256 KiB on loopback, the OS's autotuning to 192.0.2.1", 0, {0, 262144, 262144, 262144, -1}},
        {"100000 to every peer", 100000, {0, 100000, 100000, 100000, 100000}},
        {"-1: the OS's everywhere", -1, {0, -1, -1, -1, -1}},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        kvps_ring *r = NULL;
        KT_OK(kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 5, .bind = "tcp://127.0.0.1:*",
                                                 .sndbuf_bytes = c[i].desc}, &r));
        if (!r) continue;
        KT_OK(kvps_ring_connect(r, peers));
        for (int k = 1; k < 5; k++) {
            int v = -2;
            size_t sz = sizeof v;
            KT_CHECK(r->fam->dealers[k] && zmq_getsockopt(r->fam->dealers[k], ZMQ_SNDBUF, &v, &sz) == 0, "%s: no socket", c[i].name);
            KT_CHECK(v == c[i].want[k], "%s: rank %d's connection has SO_SNDBUF %d, want %d", c[i].name, k, v, c[i].want[k]);
        }
        kvps_ring_destroy(&r);
    }
}

/* ---- .io_cpus: the ring's ZeroMQ I/O threads pinned ------------------------------------------ */

/* Thread ids of this process's ZeroMQ I/O threads (named "ZMQbg/IO/<n>" by libzmq). */
static int zmq_io_tids(pid_t *tids, int cap) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char path[300], comm[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
        fclose(f);
        if (strncmp(comm, "ZMQbg/IO/", 9) == 0 && n < cap) tids[n++] = (pid_t)atoi(e->d_name);
    }
    closedir(d);
    return n;
}

typedef struct tidset { pid_t t[64]; int n; } tidset;

static int tid_in(const tidset *s, pid_t t) {
    for (int j = 0; j < s->n; j++)
        if (s->t[j] == t) return 1;
    return 0;
}

/* Checks that exactly expect ZeroMQ I/O threads appeared since before, each allowed on exactly
   the CPUs of want. A thread pins itself, then names itself, as it starts: the names are waited
   for (2 s at most). */
static void check_new_io_threads(const tidset *before, int expect, const cpu_set_t *want, const char *label) {
    tidset after;
    int fresh = 0;
    for (int tries = 0; tries < 200; tries++, kt_sleep_ms(10)) {
        after.n = zmq_io_tids(after.t, 64);
        fresh = 0;
        for (int i = 0; i < after.n; i++) fresh += !tid_in(before, after.t[i]);
        if (fresh >= expect) break;
    }
    KT_CHECK(before->n >= 0 && fresh == expect, "%s: %d new I/O threads, want %d", label, fresh, expect);
    for (int i = 0; i < after.n; i++) {
        if (tid_in(before, after.t[i])) continue;
        cpu_set_t got;
        CPU_ZERO(&got);
        KT_CHECK(sched_getaffinity(after.t[i], sizeof got, &got) == 0, "sched_getaffinity(%d): %s", (int)after.t[i],
                 strerror(errno));
        KT_CHECK(CPU_EQUAL(&got, want), "%s: I/O thread %d may run on %d CPUs, not just those asked for", label,
                 (int)after.t[i], CPU_COUNT(&got));
    }
}

/* A ring of one with io_cpus and io_threads: its I/O threads pinned, and it works. */
static void check_pinned(const char *io_cpus, int io_threads, const cpu_set_t *want) {
    tidset before;
    before.n = zmq_io_tids(before.t, 64);
    kvps_ring *r = NULL;
    KT_OK(kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 1, .peers = "inproc://kt-pin", .io_threads = io_threads,
                                             .io_cpus = io_cpus}, &r));
    char label[64];
    snprintf(label, sizeof label, "ring io_cpus '%s'", io_cpus);
    check_new_io_threads(&before, io_threads, want, label);
    if (r) {
        double d[2] = {1.5, -2}, e[2] = {0, 0};
        KT_OK(kvps_ring_allreduce(r, d, e, 2, KVPS_FLOAT64, KVPS_SUM));
        KT_CHECK(e[0] == 1.5 && e[1] == -2, "pinned ring of one: %g %g", e[0], e[1]);
    }
    kvps_ring_destroy(&r);
}

/* The same helper serves kvps.h: a server and a worker with io_cpus, over TCP. */
static void check_pinned_ps(const char *srv_cpus, const cpu_set_t *srv_want, const char *wrk_cpus,
                            const cpu_set_t *wrk_want) {
    tidset before;
    before.n = zmq_io_tids(before.t, 64);
    kvps_server *sv = NULL;
    kvps_worker *w = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1,
                                                 .update = KVPS_UPDATE_ACCUMULATE, .io_cpus = srv_cpus}, &sv));
    check_new_io_threads(&before, 1, srv_want, "server io_cpus");
    if (!sv) return;
    KT_OK(kvps_server_start(sv));
    before.n = zmq_io_tids(before.t, 64);
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(sv), .io_cpus = wrk_cpus}, &w));
    check_new_io_threads(&before, 1, wrk_want, "worker io_cpus");
    if (w) {
        uint64_t key = 7;
        size_t len = 3;
        float g[3] = {1, -2, 0.5f}, v[3] = {0, 0, 0};
        kvps_req q = 0;
        for (int i = 0; i < 2; i++) {
            KT_OK(kvps_worker_push(w, &key, g, &len, 1, &q));
            KT_OK(kvps_worker_wait(w, q, 10000));
        }
        KT_OK(kvps_worker_pull(w, &key, v, &len, 1, &q));
        KT_OK(kvps_worker_wait(w, q, 10000));
        KT_CHECK(v[0] == 2 && v[1] == -4 && v[2] == 1, "pinned server and worker: %g %g %g, want 2 -4 1", v[0], v[1], v[2]);
    }
    kvps_worker_destroy(&w);
    kvps_server_stop(sv);
    kvps_server_destroy(&sv);
}

static void pinned_main(kt_rk *x) {
    t_allreduce(x, KVPS_FLOAT32, KVPS_SUM, 300007, KVPS_ALGO_RING, 0);
    t_allreduce(x, KVPS_INT64, KVPS_MAX, 70001, KVPS_ALGO_AUTO, 1);
}

static void test_io_cpus(void) {
    cpu_set_t allowed, one, two;
    KT_CHECK(sched_getaffinity(0, sizeof allowed, &allowed) == 0, "sched_getaffinity: %s", strerror(errno));
    int first = -1, last = -1, outside = -1;
    for (int c = 0; c < 1024; c++) {
        if (CPU_ISSET(c, &allowed)) { if (first < 0) first = c; last = c; }
        else if (outside < 0) outside = c;
    }
    char s_last[16], s_two[32], s_out[16];
    snprintf(s_last, sizeof s_last, "%d", last);
    snprintf(s_two, sizeof s_two, "%d,%d", first, last);
    snprintf(s_out, sizeof s_out, "%d", outside);
    CPU_ZERO(&one);
    CPU_SET(last, &one);
    CPU_ZERO(&two);
    CPU_SET(first, &two);
    CPU_SET(last, &two);
    check_pinned(s_last, 1, &one);
    check_pinned(s_last, 2, &one);
    check_pinned(s_two, 2, &two);
    check_pinned_ps(s_last, &one, s_two, &two);
    /* every rank's own context pinned to one CPU: results as always */
    kt_team t;
    kt_team_init(&t, "io_cpus tcp", pinned_main, 3, 1, 20000);
    t.base.io_cpus = s_last;
    kt_team_run(&t);

    kvps_log_set_level(KVPS_LOG_NONE);
    const char *bad[] = {"", "x", "1-0", "0-", "-1", "0,", ",0", "0,,1", "0 ", " 0", "0;1", "1024", "0-1024",
                         "99999999999999999999", "0-99999999999999999999", s_out};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (bad[i] == s_out && outside < 0) continue; /* every CPU below 1024 allowed: nothing to refuse */
        kvps_ring *r = (kvps_ring *)&r;
        kvps_result rc = kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 1, .peers = "inproc://kt-pin-bad",
                                                            .io_cpus = bad[i]}, &r);
        KT_CHECK(rc == KVPS_ERR_CONFIG && r == NULL, "io_cpus '%s': %s, want KVPS_ERR_CONFIG", bad[i], kvps_result_str(rc));
    }
    void *ctx = zmq_ctx_new();
    kvps_ring *r = (kvps_ring *)&r;
    kvps_result rc = kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 1, .peers = "inproc://kt-pin-ctx",
                                                        .zmq_ctx = ctx, .io_cpus = s_last}, &r);
    KT_CHECK(rc == KVPS_ERR_CONFIG && r == NULL, "io_cpus with a zmq_ctx of the caller's: %s", kvps_result_str(rc));
    KT_CHECK(kvps_zmq_ctx_pin(ctx, "x") == KVPS_ERR_CONFIG, "kvps_zmq_ctx_pin(ctx, \"x\")");
    KT_OK(kvps_zmq_ctx_pin(ctx, s_last));
    zmq_ctx_term(ctx);
    KT_CHECK(kvps_zmq_ctx_pin(NULL, "0") == KVPS_ERR_INVALID_ARG, "kvps_zmq_ctx_pin(NULL)");
    kvps_server *sv = NULL;
    kvps_worker *w = NULL;
    KT_CHECK(kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://kt-pin-s", .num_workers = 1, .io_cpus = "0-"},
                                &sv) == KVPS_ERR_CONFIG && !sv, "server io_cpus '0-'");
    KT_CHECK(kvps_worker_create(&(kvps_worker_desc){.servers = "inproc://kt-pin-s", .io_cpus = "1024"}, &w) ==
                 KVPS_ERR_CONFIG && !w, "worker io_cpus '1024'");
    ctx = zmq_ctx_new();
    KT_CHECK(kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://kt-pin-s", .num_workers = 1, .zmq_ctx = ctx,
                                                    .io_cpus = s_last}, &sv) == KVPS_ERR_CONFIG && !sv,
             "server io_cpus with a zmq_ctx of the caller's");
    KT_CHECK(kvps_worker_create(&(kvps_worker_desc){.servers = "inproc://kt-pin-s", .zmq_ctx = ctx, .io_cpus = s_last},
                                &w) == KVPS_ERR_CONFIG && !w, "worker io_cpus with a zmq_ctx of the caller's");
    zmq_ctx_term(ctx);
    kvps_log_set_level(KVPS_LOG_ERROR);
}

static void test_env(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    static const char *vars[] = {"KVPS_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "KVPS_SIZE",
                                 "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "KVPS_RING_PEERS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
    int rank = -5, size = -5;
    const char *peers = "x";
    /* each failure names what is missing or wrong, in kvps_ring_last_error(NULL) */
#define KT_ENV_SAYS(what, text)                                                                                      \
    KT_CHECK(kvps_ring_env_read(&rank, &size, &peers) == KVPS_ERR_ENV && strstr(kvps_ring_last_error(NULL), text),  \
             "%s: '%s' lacks '%s'", what, kvps_ring_last_error(NULL), text)
    KT_ENV_SAYS("nothing set", "no rank: none of KVPS_RANK, RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID is set");
    KT_CHECK(kvps_ring_env_read(NULL, &size, &peers) == KVPS_ERR_INVALID_ARG, "NULL rank");
    setenv("KVPS_RANK", "1", 1);
    KT_ENV_SAYS("no size", "no size: none of KVPS_SIZE, WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS is set");
    setenv("KVPS_SIZE", "3", 1);
    KT_ENV_SAYS("no KVPS_RING_PEERS", "KVPS_RING_PEERS is not set (rank 1 of 3 read from KVPS_RANK and KVPS_SIZE)");
    setenv("KVPS_RING_PEERS", "tcp://a:1,tcp://b:1,tcp://c:1", 1);
    KT_OK(kvps_ring_env_read(&rank, &size, &peers));
    KT_CHECK(rank == 1 && size == 3 && peers && strcmp(peers, "tcp://a:1,tcp://b:1,tcp://c:1") == 0, "read %d %d %s", rank, size,
             peers ? peers : "(null)");
    setenv("KVPS_RANK", "3", 1);
    KT_ENV_SAYS("rank = size", "rank 3 (KVPS_RANK) and size 3 (KVPS_SIZE): need 0 <= rank < size");
    setenv("KVPS_RANK", "one", 1);
    KT_ENV_SAYS("malformed rank", "KVPS_RANK is 'one', not a number");
    unsetenv("KVPS_RANK");
    unsetenv("KVPS_SIZE");
    setenv("RANK", "2", 1); /* torchrun's */
    setenv("WORLD_SIZE", "3", 1);
    KT_OK(kvps_ring_env_read(&rank, &size, &peers));
    KT_CHECK(rank == 2 && size == 3, "torchrun's variables: %d %d", rank, size);
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    setenv("SLURM_NTASKS", "4", 1);
    KT_OK(kvps_ring_env_read(&rank, &size, &peers));
    KT_CHECK(rank == 2 && size == 4, "launcher variables: %d %d", rank, size);
    setenv("SLURM_NTASKS", "0", 1);
    KT_CHECK(kvps_ring_env_read(&rank, &size, &peers) == KVPS_ERR_ENV, "size 0");
    setenv("KVPS_RING_PEERS", "", 1);
    setenv("SLURM_NTASKS", "4", 1);
    KT_ENV_SAYS("empty KVPS_RING_PEERS", "KVPS_RING_PEERS is empty (rank 2 of 4 read from OMPI_COMM_WORLD_RANK and SLURM_NTASKS)");
#undef KT_ENV_SAYS
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
    kvps_log_set_level(KVPS_LOG_ERROR);
}

/* A kvps_ring_create that fails leaves its reason for kvps_ring_last_error(NULL): a port in use
   (named as the ring's, with the endpoint and the system's words), a bad desc, a wrong peer count;
   a success clears it. Per thread: another thread's failure is not seen here. */
static void *other_thread_fails(void *arg) {
    (void)arg;
    kvps_ring *r = NULL;
    kvps_ring_create(&(kvps_ring_desc){.rank = 7, .size = 2, .bind = "tcp://127.0.0.1:*"}, &r);
    return NULL;
}
static void test_create_error_readable(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    kvps_ring *a = NULL, *b = NULL;
    KT_OK(kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 2, .bind = "tcp://127.0.0.1:*"}, &a));
    KT_CHECK(kvps_ring_last_error(NULL)[0] == 0, "a success leaves no error: '%s'", kvps_ring_last_error(NULL));
    char taken[300], want[400];
    snprintf(taken, sizeof taken, "%s", kvps_ring_endpoint(a));
    KT_CHECK(kvps_ring_create(&(kvps_ring_desc){.rank = 1, .size = 2, .bind = taken}, &b) == KVPS_ERR_BIND && !b, "port in use");
    snprintf(want, sizeof want, "kvps_ring_create: ring rank 1 cannot bind its endpoint '%s': Address already in use", taken);
    KT_CHECK(strcmp(kvps_ring_last_error(NULL), want) == 0, "'%s', want '%s'", kvps_ring_last_error(NULL), want);
    pthread_t th;
    pthread_create(&th, NULL, other_thread_fails, NULL);
    pthread_join(th, NULL);
    KT_CHECK(strcmp(kvps_ring_last_error(NULL), want) == 0, "another thread's failure seen here: '%s'", kvps_ring_last_error(NULL));
    KT_CHECK(kvps_ring_create(&(kvps_ring_desc){.rank = 2, .size = 2, .bind = "tcp://127.0.0.1:*"}, &b) == KVPS_ERR_CONFIG &&
             strstr(kvps_ring_last_error(NULL), "rank 2 and size 2: need 0 <= rank < size"), "bad rank: '%s'",
             kvps_ring_last_error(NULL));
    KT_CHECK(kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 3, .peers = "tcp://127.0.0.1:1,tcp://127.0.0.1:2"}, &b) ==
                 KVPS_ERR_CONFIG && strstr(kvps_ring_last_error(NULL), "2 endpoints in peers for 3 ranks"),
             "wrong peer count: '%s'", kvps_ring_last_error(NULL));
    kvps_ring_destroy(&a);
    kvps_log_set_level(KVPS_LOG_ERROR);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    kvps_log_set_level(KVPS_LOG_ERROR);
    int64_t t0 = kvps__now_ms();
    KT_RUN(test_names, 60);
    KT_RUN(test_bad_desc, 60);
    KT_RUN(test_sndbuf, 60);
    KT_RUN(test_create_error_readable, 60);
    KT_RUN(test_env, 60);
    KT_RUN(test_io_cpus, 60);
    KT_RUN(test_bad_arguments, 60);
    KT_RUN(test_nonblocking, 60);
    printf("  info: test_ring_api took %.1f s\n", (double)(kvps__now_ms() - t0) / 1000.0);
    return kt_finish();
}
