/* test_curve - CURVE encryption and authentication: the listed worker gets in; a plaintext
   client, an unlisted key, and a worker holding the wrong server key get no data and change
   nothing. A CURVE worker grows the server set (kvps_worker_reshard with one server key for
   all; kvps_worker_reshard_keys with one per server) and its keys reach the new server. Certificates are made with CZMQ's zcert (the reference implementation of the file
   format) and read back with kvps_cert_load, and the other way round with kvps-keygen's files.
   A CURVE chain of 2 replicas (server processes) replicates over CURVE links with the chain's
   keys; a worker key cannot send REPL, a replica key is no worker; the primary SIGKILLed: sums
   exact (test_curve_replicas); CURVE and replicas without curve_replica_keys, or with keys that
   do not fit, refused at create (test_curve_replicas_config). */
#define _DEFAULT_SOURCE
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"

#include <czmq.h>
#include <limits.h>
#include <signal.h>
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
                                                  .update = KVPS_UPDATE_ACCUMULATE, .keep_serving = 1, .curve_secret_key = srv.sec,
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
                                                      .update = KVPS_UPDATE_ACCUMULATE, .curve_secret_key = sk[i].sec,
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

/* ---- CURVE with REPLICAS (kvps.h, SECURITY): a 1 shard x 2 replica chain of CURVE server
   processes (the replicas share one key pair, as a worker's failover needs: its curve_server_keys
   has one key per shard) and 2 CURVE workers pushing exact integers (ASYNC + SUM, 4 requests in
   flight each). The replica link speaks CURVE with the chain's keys (curve_replica_keys). A
   worker key listed in curve_clients, holding the job token, sends the backup a REPL hello with
   the right token and chain hash and then REPL of every kind claiming epoch 9: every one is
   refused (KVPS_ERR_AUTH), and a worker made with the replicas' key pair is refused too. The
   primary is SIGKILLed: the backup takes over and every sum is exact. ---- */
enum { CW = 2, CKEY = 4, CLEN = 3 };
static keys c_srv, c_wk[CW], c_rogue;
static char c_ep[2][96], c_chain[200], c_rkeys[100];
static const char *c_allowed[CW + 1];
static int c_stop, c_done[CW];
static float c_final[CW][CKEY * CLEN];

static kvps_server_desc chain_desc(int r) {
    kvps_server_desc d = {.endpoint = c_ep[r], .num_workers = CW, .consistency = KVPS_ASYNC, .update = KVPS_UPDATE_ACCUMULATE,
                          .heartbeat_ms = 200, .peer_timeout_ms = 1000, .curve_secret_key = c_srv.sec,
                          .curve_clients = c_allowed, .num_curve_clients = CW + 1};
    d.replicas = c_chain;
    d.replica = r;
    d.curve_replica_keys = c_rkeys;
    return d;
}

/* A server process: exits 0 when it stopped with KVPS_OK, 5 with PEER_LOST, 6 otherwise, 2 when
   it could not be created. */
static pid_t chain_proc(int r) {
    kvps_server_desc d = chain_desc(r);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGTERM, kt_proc_on_term);
        if (kvps_server_create(&d, &kt_proc_srv) != KVPS_OK) _exit(2);
        kvps_result rc = kvps_server_run(kt_proc_srv);
        kvps_server_destroy(&kt_proc_srv);
        _exit(rc == KVPS_OK ? 0 : rc == KVPS_ERR_PEER_LOST ? 5 : 6);
    }
    return pid;
}

static void chain_worker(kt_wk *x) {
    int rank = x->rank;
    kvps_worker *w = NULL;
    kvps_result rc = kvps_worker_create(&(kvps_worker_desc){.servers = x->ws->servers, .rank = rank, .num_workers = CW,
                                                             .timeout_ms = 20000, .heartbeat_ms = 200, .peer_timeout_ms = 1000,
                                                             .failover_ms = 300, .curve_server_keys = c_srv.pub,
                                                             .curve_public_key = c_wk[rank].pub, .curve_secret_key = c_wk[rank].sec},
                                        &w);
    if (rc != KVPS_OK) { kt_wk_fail(x, "create: %s", kvps_result_str(rc)); return; }
    uint64_t kk[CKEY];
    size_t lens[CKEY];
    static float vals[CW][4][CKEY * CLEN];
    for (int i = 0; i < CKEY; i++) { kk[i] = 500 + (uint64_t)i; lens[i] = CLEN; }
    kvps_req q[4] = {0};
    for (int t = 0; rc == KVPS_OK && !__atomic_load_n(&c_stop, __ATOMIC_ACQUIRE); t++) {
        int slot = t % 4;
        if (q[slot]) {
            rc = kvps_worker_wait(w, q[slot], -1);
            q[slot] = 0;
            if (rc != KVPS_OK) break;
            __atomic_add_fetch(&c_done[rank], 1, __ATOMIC_RELEASE); /* counted once answered */
        }
        for (int i = 0; i < CKEY * CLEN; i++) vals[rank][slot][i] = (float)(rank + 1 + i % CLEN);
        rc = kvps_worker_push(w, kk, vals[rank][slot], lens, CKEY, &q[slot]);
    }
    for (int i = 0; i < 4 && rc == KVPS_OK; i++)
        if (q[i]) {
            rc = kvps_worker_wait(w, q[i], -1);
            if (rc == KVPS_OK) __atomic_add_fetch(&c_done[rank], 1, __ATOMIC_RELEASE);
        }
    kvps_req b;
    if (rc == KVPS_OK) rc = kvps_worker_barrier(w, &b);
    if (rc == KVPS_OK) rc = kvps_worker_wait(w, b, -1);
    if (rc == KVPS_OK) rc = kvps_worker_pull(w, kk, c_final[rank], lens, CKEY, &b);
    if (rc == KVPS_OK) rc = kvps_worker_wait(w, b, -1);
    if (rc != KVPS_OK) kt_wk_fail(x, "%s: %.399s", kvps_result_str(rc), kvps_worker_last_error(w));
    kvps_worker_destroy(&w);
}

static int c_min_done(void) {
    int m = INT_MAX;
    for (int r = 0; r < CW; r++) {
        int d = __atomic_load_n(&c_done[r], __ATOMIC_ACQUIRE);
        if (d < m) m = d;
    }
    return m;
}
static void c_wait_done(int n) {
    int64_t end = kt_now_ms() + 60000;
    while (c_min_done() < n && kt_now_ms() < end) kt_sleep_ms(2);
}

/* The rogue: a CURVE worker key the servers list, and the job's token. It sends the backup a REPL
   hello (right token, right chain, naming replica 0), then REPL of every kind (epoch 9, replica
   0) and the hello once more. Returns how many were not answered KVPS_ERR_AUTH. */
static int rogue_repl(void) {
    void *ctx = zmq_ctx_new(), *d = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0, bad = 0;
    uint8_t sk[32], pk[32], ck[32];
    zmq_z85_decode(sk, c_srv.pub);
    zmq_z85_decode(pk, c_rogue.pub);
    zmq_z85_decode(ck, c_rogue.sec);
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(d, ZMQ_CURVE_SERVERKEY, sk, 32);
    zmq_setsockopt(d, ZMQ_CURVE_PUBLICKEY, pk, 32);
    zmq_setsockopt(d, ZMQ_CURVE_SECRETKEY, ck, 32);
    zmq_connect(d, c_ep[1]);
    uint64_t proof[2] = {kvps__token_digest(NULL), kt_chain_hash(c_chain)};
    int order[KVPS__REPL_KINDS + 1] = {KVPS__REPL_HELLO, KVPS__REPL_FWD, KVPS__REPL_SNAP, KVPS__REPL_LOST, KVPS__REPL_ROUND,
                                       KVPS__REPL_HELLO};
    for (int i = 0; i < KVPS__REPL_KINDS + 1; i++) {
        int kind = order[i];
        kvps__hdr h = KT_HDR(.op = KVPS__OP_REPL, .rank = (uint32_t)kind, .nkeys = kind == KVPS__REPL_HELLO ? 1 : 9,
                             .aux = 0, .req_id = (uint64_t)i + 1);
        char text[600];
        int32_t st = kt_raw_reply(d, &h, sizeof h, proof, kind == KVPS__REPL_LOST ? 4 : sizeof proof, 3000, text, sizeof text);
        if (st != KVPS_ERR_AUTH) {
            printf("  rogue: REPL kind %d: %s %s\n", kind, st == 1 ? "no reply" : kvps_result_str((kvps_result)st), text);
            bad++;
        } else if (i == 0) {
            printf("  a worker key's REPL hello: %s\n", text);
        }
    }
    zmq_close(d);
    zmq_ctx_term(ctx);
    return bad;
}

static void test_curve_replicas(void) {
    c_srv = czmq_keys("chain");
    c_rogue = czmq_keys("rogue");
    for (int r = 0; r < CW; r++) c_wk[r] = czmq_keys(r ? "w1" : "w0");
    for (int r = 0; r < CW; r++) c_allowed[r] = c_wk[r].pub;
    c_allowed[CW] = c_rogue.pub;
    for (int r = 0; r < 2; r++) snprintf(c_ep[r], sizeof c_ep[r], "ipc://@kvps-test-curve-%d-%d", (int)getpid(), r);
    snprintf(c_chain, sizeof c_chain, "%s|%s", c_ep[0], c_ep[1]);
    snprintf(c_rkeys, sizeof c_rkeys, "%s|%s", c_srv.pub, c_srv.pub);
    setenv("KVPS_JOB_TOKEN", "the curve chain's token", 1); /* the servers (forked), the workers and the rogue */
    memset(c_done, 0, sizeof c_done);
    c_stop = 0;
    pid_t pid[2];
    for (int r = 0; r < 2; r++) pid[r] = chain_proc(r);
    kt_workers ws;
    kt_workers_init(&ws, "CURVE chain", chain_worker, CW, c_chain, NULL);
    kt_workers_start(&ws);
    int steps = kt_quick() ? 60 : 150;
    c_wait_done(steps);
    KT_CHECK(c_min_done() >= steps, "the workers did %d pushes, not %d (the chain never went live?)", c_min_done(), steps);
    /* a worker key cannot speak for a replica, with the token and the chain hash */
    KT_CHECK(rogue_repl() == 0, "a worker key's REPL was not refused");
    /* a replica key is not a worker's: a worker made with the replicas' key pair is refused */
    kvps_result r = try_push(&(kvps_worker_desc){.servers = c_ep[0], .rank = 1, .num_workers = CW,
                                                  .curve_server_keys = c_srv.pub, .curve_public_key = c_srv.pub,
                                                  .curve_secret_key = c_srv.sec},
                             (float[CLEN]){100, 100, 100}, CLEN);
    KT_CHECK(r == KVPS_ERR_AUTH, "a worker with the replicas' key: %s (%s)", kvps_result_str(r), g_why);
    printf("  a replica key as a worker: %s\n", g_why);
    int at = c_min_done();
    c_wait_done(at + steps / 2); /* the job goes on */
    kill(pid[0], SIGKILL);
    waitpid(pid[0], NULL, 0);
    at = c_min_done();
    c_wait_done(at + steps); /* on the backup now */
    KT_CHECK(c_min_done() >= at + steps, "after the kill the workers did %d pushes, not %d", c_min_done(), at + steps);
    __atomic_store_n(&c_stop, 1, __ATOMIC_RELEASE);
    kt_workers_join(&ws); /* (each failure reported) */
    int wrong = 0;
    for (int w = 0; w < CW && !wrong; w++)
        for (int i = 0; i < CKEY * CLEN && !wrong; i++) {
            float want = 0.0f;
            for (int x = 0; x < CW; x++) want += (float)c_done[x] * (float)(x + 1 + i % CLEN);
            if (c_final[w][i] != want) {
                wrong = 1;
                KT_CHECK(0, "worker %d sees element %d = %.1f, want %.1f (a push %s)", w, i, (double)c_final[w][i], (double)want,
                         c_final[w][i] < want ? "lost" : "applied twice");
            }
        }
    printf("  %d + %d pushes, the primary killed after %d each: every sum exact on the backup\n", c_done[0], c_done[1], at);
    int st = kt_wait_pid(pid[1], kt_now_ms() + 10000);
    KT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the backup did not end by itself with 0 (status %d)", st);
    unsetenv("KVPS_JOB_TOKEN");
}

/* CURVE and replicas without the chain's keys, keys that do not fit, a worker key in the chain. */
static char cfg_log[2048];
static void cfg_keep(void *u, kvps_log_level lv, const char *msg) {
    (void)u; (void)lv;
    size_t n = strlen(cfg_log);
    snprintf(cfg_log + n, sizeof cfg_log - n, "%s\n", msg);
}
static void test_curve_replicas_config(void) {
    keys a = czmq_keys("ra"), b = czmq_keys("rb"), w = czmq_keys("rw");
    const char *allowed[1] = {w.pub};
    char two[100], wrong[100], withw[100];
    snprintf(two, sizeof two, "%s|%s", a.pub, b.pub);
    snprintf(wrong, sizeof wrong, "%s|%s", b.pub, a.pub);
    snprintf(withw, sizeof withw, "%s|%s", a.pub, w.pub);
    struct { const char *keys, *want; } cases[] = {
        {NULL, "curve_replica_keys"},            /* none: refused, naming the field */
        {"", "curve_replica_keys"},
        {a.pub, "is not this server's public key"}, /* replica 1 given replica 0's key for all */
        {wrong, "is not this server's public key"},
        {"x|y", "curve_replica_keys must be"},
        {withw, "a worker's key cannot speak for a replica"}};
    unsetenv("KVPS_CURVE_REPLICA_KEYS");
    kvps_log_set_fn(cfg_keep, NULL);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvps_server *s = NULL;
        cfg_log[0] = 0;
        kvps_result r = kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1,
                                                                .curve_secret_key = i == 5 ? a.sec : b.sec,
                                                                .curve_clients = allowed, .num_curve_clients = 1,
                                                                .replicas = "tcp://127.0.0.1:1|tcp://127.0.0.1:2",
                                                                .replica = i == 5 ? 0 : 1, .curve_replica_keys = cases[i].keys},
                                           &s);
        KT_CHECK(r == KVPS_ERR_CONFIG && !s, "case %zu: %s", i, kvps_result_str(r));
        KT_CHECK(strstr(cfg_log, cases[i].want) != NULL, "case %zu: the error says '%s'", i, cfg_log);
        if (i == 0) printf("  CURVE and replicas, no keys: %s", cfg_log);
        if (s) kvps_server_destroy(&s);
    }
    /* the environment variable serves as the field */
    setenv("KVPS_CURVE_REPLICA_KEYS", two, 1);
    kvps_server *s = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1, .curve_secret_key = b.sec,
                                                  .curve_clients = allowed, .num_curve_clients = 1,
                                                  .replicas = "tcp://127.0.0.1:1|tcp://127.0.0.1:2", .replica = 1},
                             &s));
    kvps_server_destroy(&s);
    unsetenv("KVPS_CURVE_REPLICA_KEYS");
    kvps_log_set_fn(NULL, NULL);
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
        printf("skipped: libzmq without CURVE\n0 passed, 0 failed, 6 skipped\n");
        return 0;
    }
    KT_RUN(test_curve_access);
    KT_RUN(test_curve_config);
    KT_RUN(test_curve_grow);
    KT_RUN(test_curve_replicas_config);
    KT_RUN(test_curve_replicas);
    KT_RUN(test_keygen_files);
    rmdir(dir);
    return kt_finish();
}
