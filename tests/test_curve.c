/* test_curve - CURVE encryption and authentication: the listed worker gets in; a plaintext
   client, an unlisted key, and a worker holding the wrong server key get no data and change
   nothing. A CURVE worker grows the server set (kvps_worker_reshard with one server key for
   all; kvps_worker_reshard_keys with one per server) and its keys reach the new server. Certificates are made with CZMQ's zcert (the reference implementation of the file
   format) and read back with kvps_cert_load, and the other way round with kvps-keygen's files. */
#define _DEFAULT_SOURCE
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"

#include <czmq.h>
#include <unistd.h>

static char dir[256];

typedef struct keys { char pub[41], sec[41]; } keys;

/* A key pair through a zcert file written by CZMQ. */
static keys czmq_keys(const char *name) {
    keys k = {{0}, {0}};
    char path[320];
    snprintf(path, sizeof path, "%s/%s.cert", dir, name);
    zcert_t *c = zcert_new();
    zcert_save(c, path);
    char secret_path[340];
    snprintf(secret_path, sizeof secret_path, "%s_secret", path);
    KT_OK(kvps_cert_load(secret_path, k.pub, k.sec));
    KT_CHECK(strcmp(k.pub, zcert_public_txt(c)) == 0 && strcmp(k.sec, zcert_secret_txt(c)) == 0,
             "kvps_cert_load read other keys than CZMQ wrote");
    char pub_only[41], none[41];
    KT_OK(kvps_cert_load(path, pub_only, none));
    KT_CHECK(strcmp(pub_only, k.pub) == 0 && none[0] == 0, "public certificate: %s / '%s'", pub_only, none);
    zcert_destroy(&c);
    unlink(path);
    unlink(secret_path);
    return k;
}

/* Pushes 1s to "x" through a worker built from desc and waits at most 1.5 s; the worker's last
   error goes to g_why. */
static char g_why[400];
static kvps_result try_push(const kvps_worker_desc *d, const float *g, size_t len) {
    kvps_worker *w = NULL;
    kvps_result r = kvps_worker_create(d, &w);
    if (r != KVPS_OK) return r;
    kvps_tensor t;
    kvps_req q;
    r = kvps_worker_tensor(w, "x", len, &t);
    if (r == KVPS_OK) r = kvps_worker_push_tensor(w, t, g, &q);
    if (r == KVPS_OK) r = kvps_worker_wait(w, q, 1500);
    snprintf(g_why, sizeof g_why, "%.399s", kvps_worker_last_error(w));
    kvps_worker_destroy(&w);
    return r;
}

static void test_curve_access(void) {
    keys srv = czmq_keys("server"), good = czmq_keys("good"), other = czmq_keys("other"), fake = czmq_keys("fake");
    const char *allowed[1] = {good.pub};
    kvps_server *s = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1,
                                                  .update = KVPS_UPDATE_SUM, .keep_serving = 1, .curve_secret_key = srv.sec,
                                                  .curve_clients = allowed, .num_curve_clients = 1},
                             &s));
    if (!s) return;
    KT_OK(kvps_server_start(s));
    const char *ep = kvps_server_endpoint(s);
    enum { LEN = 64 };
    float g[LEN], v[LEN];
    for (int i = 0; i < LEN; i++) g[i] = 1.0f;
    kvps_worker_desc ok = {.servers = ep, .curve_server_keys = srv.pub, .curve_public_key = good.pub,
                           .curve_secret_key = good.sec};
    KT_OK(try_push(&ok, g, LEN));

    kvps_worker_desc bad[3] = {
        {.servers = ep}, /* plaintext */
        {.servers = ep, .curve_server_keys = srv.pub, .curve_public_key = other.pub, .curve_secret_key = other.sec},
        {.servers = ep, .curve_server_keys = fake.pub, .curve_public_key = good.pub, .curve_secret_key = good.sec}};
    const char *what[3] = {"plaintext", "an unlisted key", "the wrong server key"};
    /* and the error says which: what each failure looks like on the wire differs */
    const char *why[3] = {"use different security", "refused our CURVE key (ZAP status 400)",
                          "closed the connection during the handshake"};
    for (int i = 0; i < 3; i++) {
        kvps_result r = try_push(&bad[i], g, LEN);
        KT_CHECK(r == KVPS_ERR_AUTH, "%s: %s", what[i], kvps_result_str(r));
        KT_CHECK(strstr(g_why, why[i]) != NULL, "%s: the error says '%s'", what[i], g_why);
        printf("  %s: %s\n", what[i], g_why);
    }
    /* a raw plaintext DEALER with a well-formed push gets nothing back either */
    void *ctx = zmq_ctx_new(), *d = kt_raw_dealer(ctx, ep, 0, 500);
    unsigned char meta[KVPS__HDR + KVPS__KENT];
    kt_raw_meta(meta, KVPS__OP_PUSH, 1, LEN);
    zmq_send(d, meta, sizeof meta, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(d, g, sizeof g, ZMQ_DONTWAIT);
    char reply[64];
    KT_CHECK(zmq_recv(d, reply, sizeof reply, 0) < 0, "plaintext raw client got an answer");
    zmq_close(d);
    zmq_ctx_term(ctx);

    /* only the one authorised push was applied */
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&ok, &w));
    kvps_tensor t;
    kvps_req q;
    KT_OK(kvps_worker_tensor(w, "x", LEN, &t));
    KT_OK(kvps_worker_pull_tensor(w, t, v, &q));
    KT_OK(kvps_worker_wait(w, q, 5000));
    for (int i = 0; i < LEN; i++)
        if (v[i] != 1.0f) { KT_CHECK(0, "[%d] = %g: an unauthorised push got through", i, (double)v[i]); break; }
    kvps_server_stats st;
    kvps_server_stats_get(s, &st);
    KT_CHECK(st.keys == 1, "%llu keys: an unauthorised request created one", (unsigned long long)st.keys);
    kvps_worker_destroy(&w);
    kvps_server_destroy(&s);
}

/* Bad key material is a configuration error, not a crash or a silent plaintext connection. */
static void test_curve_config(void) {
    kvps_server *s = NULL;
    KT_CHECK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1,
                                                     .curve_secret_key = "short"},
                                &s) == KVPS_ERR_CONFIG && !s, "short server key");
    keys k = czmq_keys("cfg");
    const char *bad_list[1] = {"not-a-key"};
    KT_CHECK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1,
                                                     .curve_secret_key = k.sec, .curve_clients = bad_list,
                                                     .num_curve_clients = 1},
                                &s) == KVPS_ERR_CONFIG && !s, "bad client key");
    void *ctx = zmq_ctx_new();
    KT_CHECK(kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://c", .num_workers = 1, .zmq_ctx = ctx,
                                                     .curve_secret_key = k.sec},
                                &s) == KVPS_ERR_CONFIG && !s, "shared context");
    zmq_ctx_term(ctx);
    kvps_worker *w = NULL;
    KT_CHECK(kvps_worker_create(&(kvps_worker_desc){.servers = "tcp://127.0.0.1:1", .curve_server_keys = k.pub}, &w) ==
                 KVPS_ERR_CONFIG && !w, "worker with a server key only");
    KT_CHECK(kvps_worker_create(&(kvps_worker_desc){.servers = "tcp://127.0.0.1:1,tcp://127.0.0.1:2",
                                                    .curve_server_keys = "a,b,c", .curve_public_key = k.pub,
                                                    .curve_secret_key = k.sec},
                                &w) == KVPS_ERR_CONFIG && !w, "three server keys for two servers");
    char p[41], q[41];
    KT_CHECK(kvps_cert_load("/nonexistent.cert", p, q) == KVPS_ERR_CONFIG, "missing certificate");
}

/* 2 -> 3 CURVE servers while a worker pushes: the new server is reached with the worker's kept
   key pair and the right server key, holds some of the tensor, and every value is right. shared:
   one key pair for all servers (kvps_worker_reshard); else one each (kvps_worker_reshard_keys,
   and kvps_worker_reshard refused, nothing changed). */
static void grow_curve(int shared) {
    keys sk[3], wk = czmq_keys("grower");
    for (int i = 0; i < 3; i++) sk[i] = shared && i ? sk[0] : czmq_keys(i == 0 ? "s0" : i == 1 ? "s1" : "s2");
    const char *allowed[1] = {wk.pub};
    kvps_server *s[3] = {NULL, NULL, NULL};
    char list2[600], list3[900], keys2[100], keys3[150];
    for (int i = 0; i < 3; i++) {
        KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .rank = i, .num_workers = 1,
                                                      .update = KVPS_UPDATE_SUM, .curve_secret_key = sk[i].sec,
                                                      .curve_clients = allowed, .num_curve_clients = 1},
                                 &s[i]));
        if (!s[i]) return;
        KT_OK(kvps_server_start(s[i]));
    }
    snprintf(list2, sizeof list2, "%s,%s", kvps_server_endpoint(s[0]), kvps_server_endpoint(s[1]));
    snprintf(list3, sizeof list3, "%s,%s", list2, kvps_server_endpoint(s[2]));
    snprintf(keys2, sizeof keys2, "%s,%s", sk[0].pub, sk[1].pub);
    snprintf(keys3, sizeof keys3, "%s,%s", keys2, sk[2].pub);
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = list2, .curve_server_keys = shared ? sk[0].pub : keys2,
                                                 .curve_public_key = wk.pub, .curve_secret_key = wk.sec,
                                                 .min_slice = 256, .timeout_ms = 5000},
                             &w));
    if (!w) return;
    enum { LEN = 3000 };
    static float g[LEN], v[LEN];
    for (int i = 0; i < LEN; i++) g[i] = (float)(i % 9);
    kvps_tensor t;
    kvps_req q;
    KT_OK(kvps_worker_tensor(w, "x", LEN, &t));
    KT_OK(kvps_worker_push_tensor(w, t, g, &q));
    KT_OK(kvps_worker_wait(w, q, 5000));
    enum { NK = 30 }; /* and raw keys, of which about a third move */
    uint64_t kk[NK];
    size_t lens[NK];
    float kv[NK * 4];
    for (int i = 0; i < NK; i++) { kk[i] = 100 + (uint64_t)i; lens[i] = 4; }
    KT_OK(kvps_worker_push(w, kk, g, lens, NK, &q));
    KT_OK(kvps_worker_wait(w, q, 5000));
    if (!shared) {
        kvps_result r = kvps_worker_reshard(w, list3, 5000);
        KT_CHECK(r == KVPS_ERR_CONFIG && strstr(kvps_worker_last_error(w), "kvps_worker_reshard_keys"), "%s: %s",
                 kvps_result_str(r), kvps_worker_last_error(w));
        KT_CHECK(kvps_worker_num_servers(w) == 2, "a refused reshard left %d servers", kvps_worker_num_servers(w));
        r = kvps_worker_reshard_keys(w, list3, "not-a-key", 5000);
        KT_CHECK(r == KVPS_ERR_CONFIG && strstr(kvps_worker_last_error(w), "curve_server_keys"), "%s: %s",
                 kvps_result_str(r), kvps_worker_last_error(w));
        KT_OK(kvps_worker_reshard_keys(w, list3, keys3, 5000));
    } else {
        KT_OK(kvps_worker_reshard(w, list3, 5000));
    }
    KT_CHECK(kvps_worker_num_servers(w) == 3, "%d servers after the grow", kvps_worker_num_servers(w));
    KT_OK(kvps_worker_push_tensor(w, t, g, &q));
    KT_OK(kvps_worker_wait(w, q, 5000));
    KT_OK(kvps_worker_push(w, kk, g, lens, NK, &q));
    KT_OK(kvps_worker_wait(w, q, 5000));
    KT_OK(kvps_worker_pull_tensor(w, t, v, &q));
    KT_OK(kvps_worker_wait(w, q, 5000));
    KT_OK(kvps_worker_pull(w, kk, kv, lens, NK, &q));
    KT_OK(kvps_worker_wait(w, q, 5000));
    int bad = -1;
    for (int i = 0; i < LEN && bad < 0; i++)
        if (v[i] != 2.0f * g[i] || (i < NK * 4 && kv[i] != 2.0f * g[i])) bad = i;
    KT_CHECK(bad < 0, "value %d is %g / %g, want %g", bad, bad < 0 ? 0.0 : (double)v[bad],
             bad < 0 || bad >= NK * 4 ? 0.0 : (double)kv[bad], bad < 0 ? 0.0 : 2.0 * g[bad]);
    kvps_server_stats st;
    kvps_server_stats_get(s[2], &st);
    KT_CHECK(st.keys >= 1, "the new server holds %llu keys", (unsigned long long)st.keys);
    printf("  %s: the new server holds %llu of the 32 keys and slices\n", shared ? "one server key" : "a key per server",
           (unsigned long long)st.keys);
    kvps_worker_destroy(&w);
    for (int i = 0; i < 3; i++) {
        KT_CHECK(kvps_server_wait(s[i], 5000) == KVPS_OK, "server %d did not stop by itself", i);
        kvps_server_destroy(&s[i]);
    }
}

static void test_curve_grow(void) {
    grow_curve(1);
    grow_curve(0);
}

/* kvps-keygen's files load in CZMQ (zcert_load) with the same keys. */
static void test_keygen_files(void) {
    /* kvps-keygen: beside this test (make B=...), else the default build's (asan-test builds
       only the tests, in build-asan) */
    char cmd[900], path[320], keygen[512];
    ssize_t n = readlink("/proc/self/exe", keygen, sizeof keygen - 16);
    keygen[n > 0 ? n : 0] = 0;
    char *slash = strrchr(keygen, '/');
    snprintf(slash ? slash + 1 : keygen, 16, "kvps-keygen");
    if (access(keygen, X_OK) != 0) snprintf(keygen, sizeof keygen, "./build/kvps-keygen");
    snprintf(cmd, sizeof cmd, "%s %s/kg >/dev/null", keygen, dir);
    if (access(keygen, X_OK) != 0) { KT_CHECK(0, "%s missing", keygen); return; }
    KT_CHECK(system(cmd) == 0, "%s", cmd);
    snprintf(path, sizeof path, "%s/kg.cert_secret", dir);
    char pub[41], sec[41];
    KT_OK(kvps_cert_load(path, pub, sec));
    zcert_t *c = zcert_load(path);
    KT_CHECK(c != NULL, "CZMQ cannot load %s", path);
    if (c) {
        KT_CHECK(strcmp(zcert_public_txt(c), pub) == 0 && strcmp(zcert_secret_txt(c), sec) == 0, "keys differ");
        zcert_destroy(&c);
    }
    unlink(path);
    snprintf(path, sizeof path, "%s/kg.cert", dir);
    unlink(path);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/kvps-curve-XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    if (!zmq_has("curve")) {
        printf("skipped: libzmq without CURVE\n0 passed, 0 failed, 4 skipped\n");
        return 0;
    }
    KT_RUN(test_curve_access);
    KT_RUN(test_curve_config);
    KT_RUN(test_curve_grow);
    KT_RUN(test_keygen_files);
    rmdir(dir);
    return kt_finish();
}
