/* A job's whole life (issue 17): it finishes by itself (workers say goodbye, servers stop once
   all have), a misconfiguration is refused at first contact with both values named, a stall
   names the workers it waits for (in the server's log and in the worker's error), and a
   server that was never reached is told apart from one that was lost, and a server that starts
   after its worker's last request still hears the worker's goodbye. A job that lost a worker
   ends too (issue 27): once every worker has finished or is lost (elastic: peer_timeout_ms
   later) the servers return KVPS_ERR_PEER_LOST naming the lost, with threads and with real
   processes (a worker SIGKILLed), BSP and elastic; a lost worker that comes back first changes
   nothing; .keep_serving serves on. Launchers with real processes: tests/launch_check.sh. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"
#include <poll.h>

/* ---- the log, captured ---------------------------------------------------------------------- */
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_log[32768];
static void capture(void *user, kvps_log_level level, const char *msg) {
    (void)user;
    if (level > KVPS_LOG_WARN) return;
    pthread_mutex_lock(&g_log_mu);
    size_t n = strlen(g_log);
    snprintf(g_log + n, sizeof g_log - n, "%s\n", msg);
    pthread_mutex_unlock(&g_log_mu);
}
static void log_start(void) {
    pthread_mutex_lock(&g_log_mu);
    g_log[0] = 0;
    pthread_mutex_unlock(&g_log_mu);
    kvps_log_set_level(KVPS_LOG_WARN);
    kvps_log_set_fn(capture, NULL);
}
/* Stops capturing; 1 when the log has needle. */
static int log_has(const char *needle) {
    pthread_mutex_lock(&g_log_mu);
    int r = strstr(g_log, needle) != NULL;
    pthread_mutex_unlock(&g_log_mu);
    return r;
}
static void log_stop(void) {
    kvps_log_set_fn(NULL, NULL);
    kvps_log_set_level(KVPS_LOG_NONE);
}

static kvps_server *server_up(int num_workers, int rank, int stall_ms, int keep) {
    kvps_server *s = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = num_workers, .rank = rank,
                                                  .update = KVPS_UPDATE_ACCUMULATE, .heartbeat_ms = 100, .peer_timeout_ms = 400,
                                                  .stall_ms = stall_ms, .keep_serving = keep},
                             &s));
    if (s) KT_OK(kvps_server_start(s));
    return s;
}

static kvps_worker *worker_up(const char *servers, int rank, int num_workers) {
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = servers, .rank = rank, .num_workers = num_workers,
                                                 .timeout_ms = 5000, .heartbeat_ms = 100, .peer_timeout_ms = 400},
                             &w));
    return w;
}

/* One BSP round of tensor "w" (16 floats) from each worker, checked against the naive sum. */
static void one_round(kvps_worker **w, int m, int round) {
    float g[4][16], v[4][16];
    kvps_tensor t[4];
    kvps_req q[4];
    for (int r = 0; r < m; r++) {
        for (int i = 0; i < 16; i++) g[r][i] = (float)(r + 1);
        KT_OK(kvps_worker_tensor(w[r], "w", 16, &t[r]));
        KT_OK(kvps_worker_pushpull_tensor(w[r], t[r], g[r], v[r], &q[r]));
    }
    for (int r = 0; r < m; r++) {
        KT_OK(kvps_worker_wait(w[r], q[r], 5000));
        float want = (float)((round + 1) * m * (m + 1) / 2); /* SUM: the rounds accumulate */
        KT_CHECK(v[r][0] == want && v[r][15] == want, "worker %d round %d: %g, want %g", r, round, (double)v[r][0], (double)want);
    }
}

/* ---- clean finish ---------------------------------------------------------------------------- */

/* Three workers train, say goodbye (one by kvps_worker_finish, two by destroy) and the server
   stops by itself: kvps_server_wait returns KVPS_OK, no worker is reported lost, nothing
   warned. A keep_serving server does not stop. */
static void test_clean_finish(void) {
    log_start();
    kvps_server *s = server_up(3, 0, 0, 0);
    if (!s) return;
    kvps_worker *w[3];
    for (int r = 0; r < 3; r++) w[r] = worker_up(kvps_server_endpoint(s), r, 3);
    one_round(w, 3, 0);
    KT_CHECK(kvps_server_wait(s, 100) == KVPS_ERR_TIMEOUT, "the server stopped with its workers still there");
    KT_OK(kvps_worker_finish(w[0], -1));
    KT_OK(kvps_worker_finish(w[0], -1)); /* twice is harmless */
    kvps_worker_destroy(&w[0]);
    kvps_worker_destroy(&w[1]);
    /* past peer_timeout_ms: the finished workers' closed connections are no loss */
    KT_CHECK(kvps_server_wait(s, 700) == KVPS_ERR_TIMEOUT, "the server stopped with worker 2 still there");
    kvps_worker_destroy(&w[2]);
    kvps_result r = kvps_server_wait(s, 5000);
    KT_CHECK(r == KVPS_OK, "the server did not stop by itself: %s", kvps_result_str(r));
    kvps_server_stats st;
    kvps_server_stats_get(s, &st);
    KT_CHECK(st.peers_lost == 0, "%llu workers reported lost", (unsigned long long)st.peers_lost);
    kvps_server_destroy(&s);
    KT_CHECK(!log_has("lost") && !log_has("warn"), "warnings in a clean finish:\n%s", g_log);
    log_stop();

    /* keep_serving: finished workers leave it serving; a second job is served too */
    s = server_up(1, 0, 0, 1);
    for (int job = 0; job < 2 && s; job++) {
        kvps_worker *x = worker_up(kvps_server_endpoint(s), 0, 1);
        one_round(&x, 1, job);
        kvps_worker_destroy(&x);
    }
    if (s) KT_CHECK(kvps_server_wait(s, 300) == KVPS_ERR_TIMEOUT, "a keep_serving server stopped by itself");
    kvps_server_destroy(&s);
}

/* Under BSP a worker that finished early is not waited for in vain: the pull that needs its
   push is answered KVPS_ERR_PEER_LOST at once, naming the worker and the tensor. */
static void test_finished_worker_named(void) {
    log_start();
    kvps_server *s = server_up(2, 0, 0, 0);
    if (!s) { log_stop(); return; }
    kvps_worker *w[2] = {worker_up(kvps_server_endpoint(s), 0, 2), worker_up(kvps_server_endpoint(s), 1, 2)};
    one_round(w, 2, 0);
    kvps_worker_destroy(&w[1]);
    float g[16] = {0}, v[16];
    kvps_tensor t;
    kvps_req q;
    KT_OK(kvps_worker_tensor(w[0], "late", 16, &t));
    KT_OK(kvps_worker_pushpull_tensor(w[0], t, g, v, &q));
    kvps_result r = kvps_worker_wait(w[0], q, 3000);
    KT_CHECK(r == KVPS_ERR_PEER_LOST && strstr(kvps_worker_last_error(w[0]), "worker 1 has finished") &&
                 strstr(kvps_worker_last_error(w[0]), "tensor 'late'"),
             "%s: '%s'", kvps_result_str(r), kvps_worker_last_error(w[0]));
    kvps_worker_destroy(&w[0]);
    KT_CHECK(kvps_server_wait(s, 5000) == KVPS_OK, "the server did not stop by itself");
    kvps_server_destroy(&s);
    log_stop();
}

/* ---- configuration checked at first contact -------------------------------------------------- */

/* A worker refused at first contact: its first wait (1 s at most) says so, with both values. */
static void expect_refused(kvps_worker *w, const char *what, kvps_result want, const char *a, const char *b) {
    if (!w) return;
    kvps_req q;
    kvps_result r = kvps_worker_barrier(w, &q);
    if (r == KVPS_OK) r = kvps_worker_wait(w, q, 1000);
    const char *e = kvps_worker_last_error(w);
    KT_CHECK(r == want && strstr(e, a) && strstr(e, b), "%s: %s, '%s': want %s naming '%s' and '%s'", what, kvps_result_str(r), e,
             kvps_result_str(want), a, b);
}

static void test_config_refused(void) {
    log_start();
    kvps_server *s0 = server_up(3, 0, 0, 1), *s1 = server_up(3, 1, 0, 1);
    if (!s0 || !s1) { kvps_server_destroy(&s0); kvps_server_destroy(&s1); log_stop(); return; }
    char list[600], reversed[600], one[300];
    snprintf(list, sizeof list, "%s,%s", kvps_server_endpoint(s0), kvps_server_endpoint(s1));
    snprintf(reversed, sizeof reversed, "%s,%s", kvps_server_endpoint(s1), kvps_server_endpoint(s0));
    snprintf(one, sizeof one, "%s", kvps_server_endpoint(s0));
    kvps_worker *ok = worker_up(list, 0, 3); /* the first, which sets what the rest must match */
    kvps_req q;
    KT_OK(kvps_worker_tensor(ok, "layer1", 100, &(kvps_tensor){0}));
    KT_OK(kvps_worker_barrier(ok, &q)); /* (its hello is in: answered in order) */
    KT_CHECK(kvps_worker_wait(ok, q, 300) == KVPS_ERR_TIMEOUT, "a barrier of 1 of 3 workers completed");

    kvps_worker *w = worker_up(list, 1, 4);
    expect_refused(w, "num_workers 4 vs 3", KVPS_ERR_CONFIG, "was told num_workers = 4", "was told 3");
    kvps_worker_destroy(&w);
    w = worker_up(reversed, 1, 3);
    expect_refused(w, "servers in another order", KVPS_ERR_CONFIG, "lists this server", "but it was started as server");
    kvps_worker_destroy(&w);
    w = worker_up(one, 1, 3);
    expect_refused(w, "a shorter server list", KVPS_ERR_CONFIG, "lists 1 servers", "worker 0 listed 2");
    kvps_worker_destroy(&w);
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = list, .rank = 1, .num_workers = 3, .min_slice = 7}, &w));
    expect_refused(w, "another min_slice", KVPS_ERR_CONFIG, "min_slice 7", "worker 0 with 1024");
    kvps_worker_destroy(&w);
    w = worker_up(list, 0, 3);
    expect_refused(w, "rank 0 twice", KVPS_ERR_CONFIG, "rank 0 is taken by a live worker", "two workers were given rank 0");
    kvps_worker_destroy(&w);
    /* a tensor registered with another length: refused by name, both lengths said */
    w = worker_up(list, 1, 3);
    kvps_tensor t;
    KT_OK(kvps_worker_tensor(w, "layer1", 120, &t));
    KT_OK(kvps_worker_barrier(w, &q));
    kvps_worker_wait(w, q, 300); /* (the name's answer is in by then) */
    float g[120] = {0};
    kvps_result r = kvps_worker_push_tensor(w, t, g, &q);
    KT_CHECK(r == KVPS_ERR_LEN_MISMATCH && strstr(kvps_worker_last_error(w), "tensor 'layer1': worker 1 registered it with 120 "
                                                                              "floats, worker 0 with 100"),
             "tensor of another length: %s, '%s'", kvps_result_str(r), kvps_worker_last_error(w));
    kvps_worker_destroy(&w);
    /* and the one that was right was not disturbed: its rank, its barrier */
    KT_CHECK(kvps_worker_wait(ok, q, 10) != KVPS_OK, "(handle)");
    kvps_worker_destroy(&ok);
    /* a hello of another protocol, by hand */
    void *ctx = zmq_ctx_new(), *d = kt_raw_dealer(ctx, kvps_server_endpoint(s0), 0, 2000);
    kvps__hdr h = KT_HDR(.op = KVPS__OP_HELLO, .rank = 2, .req_id = 1, .status = 77);
    unsigned char v[KVPS__HELLO_BYTES] = {0};
    kvps__put32(v, 99);
    zmq_send(d, &h, sizeof h, ZMQ_SNDMORE);
    zmq_send(d, v, sizeof v, 0);
    kvps__hdr rh;
    char text[300] = "";
    int n = zmq_recv(d, &rh, sizeof rh, 0);
    int tn = n == (int)sizeof rh ? zmq_recv(d, text, sizeof text - 1, 0) : -1;
    if (tn >= 0) text[tn < (int)sizeof text - 1 ? tn : (int)sizeof text - 1] = 0;
    char spk[32];
    snprintf(spk, sizeof spk, "speaks %d", KVPS__PROTO);
    KT_CHECK(n == (int)sizeof rh && rh.status == KVPS_ERR_VERSION && strstr(text, "protocol 99") && strstr(text, spk),
             "hello of protocol 99: status %d, '%s'", n == (int)sizeof rh ? rh.status : 0, text);
    zmq_close(d);
    zmq_ctx_term(ctx);
    KT_CHECK(log_has("refused worker 1: worker 1 was told num_workers = 4"), "the server's log does not name the refusal:\n%s",
             g_log);
    kvps_server_destroy(&s0);
    kvps_server_destroy(&s1);
    log_stop();
}

/* ---- stalls ---------------------------------------------------------------------------------- */

/* Workers 0 and 1 of 3 train; worker 2 never comes. The server's stall inspector (stall_ms
   300) names it in its log, and the workers' timed-out waits name it, the tensor and the round.
   Then worker 2 comes, does one round, and vanishes (no goodbye): it is named lost. */
static void test_stall_named(void) {
    log_start();
    kvps_server *s = server_up(3, 0, 300, 1);
    if (!s) { log_stop(); return; }
    const char *ep = kvps_server_endpoint(s);
    kvps_worker *w[3] = {worker_up(ep, 0, 3), worker_up(ep, 1, 3), NULL};
    float g[16] = {0}, v[16];
    kvps_tensor t[3];
    kvps_req q[3];
    for (int r = 0; r < 2; r++) {
        KT_OK(kvps_worker_tensor(w[r], "layer2.bias", 16, &t[r]));
        KT_OK(kvps_worker_pushpull_tensor(w[r], t[r], g, v, &q[r]));
    }
    kvps_result r = kvps_worker_wait(w[0], q[0], 1500);
    const char *e = kvps_worker_last_error(w[0]);
    KT_CHECK(r == KVPS_ERR_TIMEOUT && strstr(e, "pull of tensor 'layer2.bias' waits for round 1, which workers 2 (never "
                                                 "connected) have not pushed"),
             "worker 0: %s, '%s'", kvps_result_str(r), e);
    printf("  worker 0's error: %s\n", e);
    KT_CHECK(log_has("stalled for") && log_has("tensor 'layer2.bias' waits for round 1, which workers 2 (never connected)"),
             "the server's log does not name worker 2:\n%s", g_log);
    /* a barrier too */
    kvps_req b;
    KT_OK(kvps_worker_barrier(w[1], &b));
    r = kvps_worker_wait(w[1], b, 1000);
    KT_CHECK(r == KVPS_ERR_TIMEOUT && strstr(kvps_worker_last_error(w[1]), "barrier 1 waits for workers 0 (connected), 2 (never "
                                                                             "connected)"),
             "barrier: %s, '%s'", kvps_result_str(r), kvps_worker_last_error(w[1]));
    /* worker 2 comes: the round completes */
    w[2] = worker_up(ep, 2, 3);
    KT_OK(kvps_worker_tensor(w[2], "layer2.bias", 16, &t[2]));
    KT_OK(kvps_worker_pushpull_tensor(w[2], t[2], g, v, &q[2]));
    for (int k = 0; k < 3; k++) KT_OK(kvps_worker_wait(w[k], q[k], 5000));
    kvps_req bb[2];
    KT_OK(kvps_worker_barrier(w[0], &bb[0]));
    KT_OK(kvps_worker_barrier(w[2], &bb[1]));
    KT_OK(kvps_worker_wait(w[1], b, 5000));
    KT_OK(kvps_worker_wait(w[0], bb[0], 5000));
    KT_OK(kvps_worker_wait(w[2], bb[1], 5000));
    /* it dies: the next round's wait names it lost */
    kt_worker_vanish(&w[2]);
    kt_sleep_ms(600);
    KT_OK(kvps_worker_pushpull_tensor(w[0], t[0], g, v, &q[0]));
    r = kvps_worker_wait(w[0], q[0], 1500);
    KT_CHECK(r == KVPS_ERR_PEER_LOST && strstr(kvps_worker_last_error(w[0]), "lost"), "after worker 2 died: %s, '%s'",
             kvps_result_str(r), kvps_worker_last_error(w[0]));
    for (int k = 0; k < 2; k++) kvps_worker_destroy(&w[k]);
    kvps_server_destroy(&s);
    log_stop();
}

/* A server nobody listens for: "never connected", with the endpoint; one that was there and
   went away: "unreachable". */
static void test_never_connected(void) {
    void *ctx = zmq_ctx_new(), *sock = zmq_socket(ctx, ZMQ_ROUTER);
    char ep[256];
    size_t sz = sizeof ep;
    zmq_bind(sock, "tcp://127.0.0.1:*");
    zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &sz);
    zmq_close(sock);
    zmq_ctx_term(ctx); /* a port nobody listens on */
    kvps_worker *w = worker_up(ep, 0, 1);
    if (!w) return;
    kvps_req q;
    KT_OK(kvps_worker_barrier(w, &q));
    kvps_result r = kvps_worker_wait(w, q, 300);
    KT_CHECK(r == KVPS_ERR_PEER_LOST && strstr(kvps_worker_last_error(w), "never connected") &&
                 strstr(kvps_worker_last_error(w), ep),
             "%s, '%s'", kvps_result_str(r), kvps_worker_last_error(w));
    int64_t t0 = kt_now_ms();
    kvps_worker_destroy(&w); /* no goodbye to wait for: nothing is there */
    KT_CHECK(kt_now_ms() - t0 < 500, "destroy took %lld ms", (long long)(kt_now_ms() - t0));

    kvps_server *s = server_up(1, 0, 0, 1);
    w = worker_up(kvps_server_endpoint(s), 0, 1);
    one_round(&w, 1, 0);
    kvps_server_destroy(&s);
    KT_OK(kvps_worker_barrier(w, &q));
    r = kvps_worker_wait(w, q, 800);
    KT_CHECK(r == KVPS_ERR_PEER_LOST && strstr(kvps_worker_last_error(w), "unreachable"), "%s, '%s'", kvps_result_str(r),
             kvps_worker_last_error(w));
    kvps_worker_destroy(&w);
}

/* A server that starts after its worker's last request still hears the goodbye: finish waits
   for it (up to its timeout), and the server stops by itself. (ps_peer jobs on loopback, 4
   servers x 4 workers, left a late server running in 3-4 of 10 runs when finish skipped servers
   it had never reached.) */
static void finish_main(kt_wk *x) { /* the worker (user) finishes */
    kvps_worker *w = (kvps_worker *)x->ws->user;
    kvps_result rc = kvps_worker_finish(w, 5000);
    if (rc != KVPS_OK) kt_wk_fail(x, "finish: %s: %s", kvps_result_str(rc), kvps_worker_last_error(w));
}
static void test_late_server_hears_goodbye(void) {
    char ep[2][96], list[200];
    for (int i = 0; i < 2; i++) snprintf(ep[i], sizeof ep[i], "ipc://@kvps-session-late-%d-%d", (int)getpid(), i);
    snprintf(list, sizeof list, "%s,%s", ep[0], ep[1]);
    kvps_server *s[2] = {NULL, NULL};
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = ep[0], .num_workers = 1, .rank = 0, .update = KVPS_UPDATE_ACCUMULATE}, &s[0]));
    KT_OK(kvps_server_start(s[0]));
    kvps_worker *w = worker_up(list, 0, 1);
    if (!w || !s[0]) return;
    uint64_t key = 1;
    while (kvps__server_of(w, key) != 0) key++; /* a key on the server that is up */
    float v = 2.0f;
    size_t len = 1;
    kvps_req q;
    KT_OK(kvps_worker_push(w, &key, &v, &len, 1, &q));
    KT_OK(kvps_worker_wait(w, q, 5000));
    kt_workers ws;
    kt_workers_init(&ws, "late server", finish_main, 1, list, NULL);
    ws.user = w;
    kt_workers_start(&ws);
    struct timespec ts = {0, 300 * 1000000L};
    nanosleep(&ts, NULL); /* the worker is in finish, server 1 not up yet */
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = ep[1], .num_workers = 1, .rank = 1, .update = KVPS_UPDATE_ACCUMULATE}, &s[1]));
    KT_OK(kvps_server_start(s[1]));
    kt_workers_join(&ws); /* (its failure reported) */
    for (int i = 0; i < 2; i++) KT_CHECK(kvps_server_wait(s[i], 5000) == KVPS_OK, "server %d did not stop by itself", i);
    kvps_worker_destroy(&w);
    for (int i = 0; i < 2; i++) kvps_server_destroy(&s[i]);
}

/* ---- a job that lost a worker ends too ------------------------------------------------------ */

/* Polls the server's stats until it has declared n workers lost (at most 10 s: a hang bound). */
static int lost_reached(kvps_server *s, uint64_t n) {
    for (int64_t end = kt_now_ms() + 10000; kt_now_ms() < end; kt_sleep_ms(5)) {
        kvps_server_stats st;
        kvps_server_stats_get(s, &st);
        if (st.peers_lost >= n) return 1;
    }
    return 0;
}

/* BSP (not elastic), 3 workers. Worker 2 vanishes (no goodbye, as when its process is killed).
   While another worker is still at work nothing changes: worker 0 finishes, worker 1 goes on,
   the server serves on, worker 2 comes back (a restart) and everyone finishes: KVPS_OK, the
   clean finish. Then a second job: worker 2 vanishes again, the others' waits say it is lost,
   they finish, and the server stops by itself with KVPS_ERR_PEER_LOST, its log naming worker 2
   lost and workers 0 and 1 finished. */
static void test_lost_worker_ends_job(void) {
    log_start();
    kvps_server *s = server_up(3, 0, 0, 0);
    if (!s) { log_stop(); return; }
    const char *ep = kvps_server_endpoint(s);
    kvps_worker *w[3];
    for (int r = 0; r < 3; r++) w[r] = worker_up(ep, r, 3);
    one_round(w, 3, 0);
    kt_worker_vanish(&w[2]);
    KT_CHECK(lost_reached(s, 1), "worker 2 was never declared lost");
    KT_OK(kvps_worker_finish(w[0], -1)); /* finished 0 (acknowledged), lost 2, worker 1 still at work */
    kvps_worker_destroy(&w[0]);
    KT_CHECK(kvps_server_wait(s, 700) == KVPS_ERR_TIMEOUT, "the server stopped with worker 1 still at work");
    w[2] = worker_up(ep, 2, 3); /* back: a barrier of 1 and 2 (worker 0 has finished: refused, naming it) */
    kvps_req b;
    KT_OK(kvps_worker_barrier(w[2], &b));
    kvps_result r = kvps_worker_wait(w[2], b, 5000);
    KT_CHECK(r == KVPS_ERR_PEER_LOST && strstr(kvps_worker_last_error(w[2]), "worker 0 has finished"),
             "the returning worker's barrier: %s '%s'", kvps_result_str(r), kvps_worker_last_error(w[2]));
    kvps_worker_destroy(&w[1]);
    kvps_worker_destroy(&w[2]);
    r = kvps_server_wait(s, 10000);
    KT_CHECK(r == KVPS_OK, "a job whose lost worker came back: %s, want a clean finish", kvps_result_str(r));
    kvps_server_destroy(&s);

    /* the job ends with worker 2 lost */
    log_start();
    s = server_up(3, 0, 0, 0);
    if (!s) { log_stop(); return; }
    ep = kvps_server_endpoint(s);
    for (int k = 0; k < 3; k++) w[k] = worker_up(ep, k, 3);
    one_round(w, 3, 0);
    kt_worker_vanish(&w[2]);
    float g[16] = {0}, v[16];
    kvps_tensor t;
    kvps_req q;
    for (int k = 0; k < 2; k++) {
        KT_OK(kvps_worker_tensor(w[k], "next", 16, &t));
        KT_OK(kvps_worker_pushpull_tensor(w[k], t, g, v, &q));
        r = kvps_worker_wait(w[k], q, 10000);
        const char *e = kvps_worker_last_error(w[k]);
        KT_CHECK(r == KVPS_ERR_PEER_LOST && (strstr(e, "worker 2 lost") || strstr(e, "lost (worker 2")), "worker %d: %s '%s'",
                 k, kvps_result_str(r), e);
    }
    KT_CHECK(kvps_server_wait(s, 100) == KVPS_ERR_TIMEOUT, "the server stopped with workers 0 and 1 still at work");
    kvps_worker_destroy(&w[0]);
    kvps_worker_destroy(&w[1]);
    r = kvps_server_wait(s, 10000);
    KT_CHECK(r == KVPS_ERR_PEER_LOST, "the job ended with worker 2 lost: kvps_server_wait says %s", kvps_result_str(r));
    KT_CHECK(log_has("server 0: the job has ended with workers lost: lost 2, finished 0-1 (of 3); stopping"),
             "the server's log does not name the lost worker:\n%s", g_log);
    kvps_server_destroy(&s);
    log_stop();
}

/* Elastic: worker 2 of 3 vanishes; the rounds go on as the mean of workers 0 and 1 (checked
   against float arithmetic); they finish, and the server, having waited peer_timeout_ms for
   worker 2 to come back, stops by itself with KVPS_ERR_PEER_LOST. */
static void test_lost_worker_ends_elastic_job(void) {
    log_start();
    kvps_server *s = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 3, .update = KVPS_UPDATE_MEAN,
                                                  .heartbeat_ms = 100, .peer_timeout_ms = 400, .elastic = 1},
                             &s));
    if (!s) { log_stop(); return; }
    KT_OK(kvps_server_start(s));
    kvps_worker *w[3];
    kvps_tensor t[3];
    float g[3][16], v[16];
    kvps_req q[3];
    for (int r = 0; r < 3; r++) {
        w[r] = worker_up(kvps_server_endpoint(s), r, 3);
        for (int i = 0; i < 16; i++) g[r][i] = (float)(r + 1) * 0.25f + (float)i;
        KT_OK(kvps_worker_tensor(w[r], "w", 16, &t[r]));
        KT_OK(kvps_worker_push_tensor(w[r], t[r], g[r], &q[r]));
    }
    for (int r = 0; r < 3; r++) KT_OK(kvps_worker_wait(w[r], q[r], 5000));
    kt_worker_vanish(&w[2]);
    for (int step = 0; step < 3; step++) {
        for (int r = 0; r < 2; r++) KT_OK(kvps_worker_pushpull_tensor(w[r], t[r], g[r], v, &q[r]));
        for (int r = 0; r < 2; r++) {
            KT_OK(kvps_worker_wait(w[r], q[r], 10000));
            for (int i = 0; i < 16; i++) {
                float want = (g[0][i] + g[1][i]) / 2.0f;
                KT_CHECK(v[i] == want, "step %d worker %d element %d: %g, want the mean of two, %g", step, r, i, (double)v[i],
                         (double)want);
                if (v[i] != want) break;
            }
        }
    }
    kvps_worker_destroy(&w[0]);
    kvps_worker_destroy(&w[1]);
    kvps_result r = kvps_server_wait(s, 10000);
    KT_CHECK(r == KVPS_ERR_PEER_LOST, "the elastic job ended with worker 2 lost: kvps_server_wait says %s", kvps_result_str(r));
    KT_CHECK(log_has("server 0: the job has ended with workers lost: lost 2, finished 0-1 (of 3); stopping"),
             "the server's log does not name the lost worker:\n%s", g_log);
    kvps_server_destroy(&s);
    log_stop();
}

/* .keep_serving: a job that lost a worker leaves the server serving: after worker 1 is lost and
   worker 0 has finished, a new worker 0 pulls the weights (the first job's sum, 1 + 2) and
   finishes, and the server still serves. */
static void test_lost_worker_keep_serving(void) {
    kvps_server *s = server_up(2, 0, 0, 1);
    if (!s) return;
    kvps_worker *w[2] = {worker_up(kvps_server_endpoint(s), 0, 2), worker_up(kvps_server_endpoint(s), 1, 2)};
    one_round(w, 2, 0);
    kt_worker_vanish(&w[1]);
    KT_CHECK(lost_reached(s, 1), "worker 1 was never declared lost");
    KT_OK(kvps_worker_finish(w[0], -1));
    kvps_worker_destroy(&w[0]);
    KT_CHECK(kvps_server_wait(s, 700) == KVPS_ERR_TIMEOUT, "a keep_serving server stopped after a job that lost a worker");
    w[0] = worker_up(kvps_server_endpoint(s), 0, 2);
    float v[16] = {0};
    kvps_tensor t;
    kvps_req q;
    KT_OK(kvps_worker_tensor(w[0], "w", 16, &t));
    KT_OK(kvps_worker_pull_tensor(w[0], t, v, &q));
    KT_OK(kvps_worker_wait(w[0], q, 5000));
    KT_CHECK(v[0] == 3.0f && v[15] == 3.0f, "pulled %g, want 3", (double)v[0]);
    kvps_worker_destroy(&w[0]);
    KT_CHECK(kvps_server_wait(s, 300) == KVPS_ERR_TIMEOUT, "a keep_serving server stopped by itself");
    kvps_server_destroy(&s);
}

/* Real processes: 2 server processes and 3 worker processes (ipc), BSP and elastic; worker 2's
   process is SIGKILLed after round 2. BSP: the others' waits say worker 2 is lost, they finish
   and exit 0. Elastic: rounds 3-7 are the mean of workers 0 and 1 (checked), they finish and
   exit 0. Either way both server processes end by themselves within the hang bound, their
   kvps_server_run having returned KVPS_ERR_PEER_LOST (exit code 5) and logged the loss. */
enum { LP_STEPS = 8, LP_DIE_AFTER = 2, LP_LEN = 64 };
static int lp_server(const char *ep, int rank, int elastic, int logfd) {
    kvps_server *s = NULL;
    kvps_log_set_fn(NULL, NULL);
    kvps_log_set_level(KVPS_LOG_WARN);
    if (dup2(logfd, 2) < 0) return 9; /* warnings go to the parent through the pipe */
    if (kvps_server_create(&(kvps_server_desc){.endpoint = ep, .rank = rank, .num_workers = 3, .update = KVPS_UPDATE_MEAN,
                                               .heartbeat_ms = 100, .peer_timeout_ms = 1000, .elastic = elastic},
                           &s) != KVPS_OK)
        return 8;
    kvps_result r = kvps_server_run(s);
    kvps_server_destroy(&s);
    return r == KVPS_OK ? 0 : r == KVPS_ERR_PEER_LOST ? 5 : 7;
}
static int lp_worker(const char *servers, int rank, int elastic, int diefd) {
    kvps_log_set_level(KVPS_LOG_NONE);
    kvps_worker *w = NULL;
    if (kvps_worker_create(&(kvps_worker_desc){.servers = servers, .rank = rank, .num_workers = 3, .timeout_ms = 20000,
                                               .min_slice = 16, .heartbeat_ms = 100, .peer_timeout_ms = 1000},
                           &w) != KVPS_OK)
        return 10;
    kvps_tensor t;
    float g[LP_LEN], v[LP_LEN];
    kvps_req q;
    int rc = kvps_worker_tensor(w, "w", LP_LEN, &t) == KVPS_OK ? 0 : 11;
    for (int step = 0; step < LP_STEPS && !rc; step++) {
        for (int i = 0; i < LP_LEN; i++) g[i] = (float)((rank + 1) * (step + 1)) + (float)i;
        kvps_result r = kvps_worker_pushpull_tensor(w, t, g, v, &q);
        if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
        if (r == KVPS_ERR_PEER_LOST && !elastic && step == LP_DIE_AFTER + 1) {
            if (!strstr(kvps_worker_last_error(w), "worker 2 lost")) {
                printf("  worker %d: '%s' does not name worker 2\n", rank, kvps_worker_last_error(w));
                rc = 12;
            }
            break; /* the job cannot go on: it finishes */
        }
        if (r != KVPS_OK) {
            printf("  worker %d step %d: %s '%s'\n", rank, step, kvps_result_str(r), kvps_worker_last_error(w));
            rc = 13;
            break;
        }
        int n = step <= LP_DIE_AFTER ? 3 : 2; /* the mean of those who pushed */
        for (int i = 0; i < LP_LEN && !rc; i++) {
            float sum = 0.0f;
            for (int k = 0; k < n; k++) sum += (float)((k + 1) * (step + 1)) + (float)i;
            if (v[i] != sum / (float)n) {
                printf("  worker %d step %d element %d: %g, want %g\n", rank, step, i, (double)v[i], (double)(sum / (float)n));
                rc = 14;
            }
        }
        if (rank == 2 && step == LP_DIE_AFTER) { /* asks to be killed, and waits for it */
            if (write(diefd, "x", 1) != 1) _exit(15);
            for (;;) pause();
        }
    }
    fflush(stdout);
    kvps_worker_destroy(&w);
    return rc;
}
static void lost_worker_processes(int elastic) {
    char ep[2][96], servers[200];
    for (int i = 0; i < 2; i++) snprintf(ep[i], sizeof ep[i], "ipc://@kvps-session-lp-%d-%d-%d", (int)getpid(), elastic, i);
    snprintf(servers, sizeof servers, "%s,%s", ep[0], ep[1]);
    int logp[2][2], die[2];
    pid_t spid[2], wpid[3];
    if (pipe(die) != 0) return;
    fflush(stdout);
    for (int i = 0; i < 2; i++) {
        if (pipe(logp[i]) != 0) return;
        spid[i] = fork();
        if (spid[i] == 0) { close(logp[i][0]); _exit(lp_server(ep[i], i, elastic, logp[i][1])); }
        close(logp[i][1]);
    }
    for (int r = 0; r < 3; r++) {
        wpid[r] = fork();
        if (wpid[r] == 0) _exit(lp_worker(servers, r, elastic, die[1]));
    }
    close(die[1]);
    char c;
    struct pollfd pf = {die[0], POLLIN, 0};
    int asked = poll(&pf, 1, 30000) == 1 && read(die[0], &c, 1) == 1;
    close(die[0]);
    KT_CHECK(asked, "%s: worker 2 never reached round %d", elastic ? "elastic" : "BSP", LP_DIE_AFTER);
    kill(wpid[2], SIGKILL);
    int64_t deadline = kt_now_ms() + 60000; /* a hang bound */
    for (int r = 0; r < 3; r++) {
        int st = kt_wait_pid(wpid[r], deadline);
        if (r < 2)
            KT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: worker %d: status %d", elastic ? "elastic" : "BSP", r, st);
    }
    for (int i = 0; i < 2; i++) {
        int st = kt_wait_pid(spid[i], deadline);
        KT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 5, "%s: server %d did not end by itself with "
                 "KVPS_ERR_PEER_LOST (status %d: %s)", elastic ? "elastic" : "BSP", i, st,
                 st == -1 ? "still running: killed" : st >= 0 && WIFEXITED(st) ? "exit code" : "signalled");
        char log[8192];
        ssize_t n = 0, got;
        while (n < (ssize_t)sizeof log - 1 && (got = read(logp[i][0], log + n, sizeof log - 1 - (size_t)n)) > 0) n += got;
        log[n < 0 ? 0 : n] = 0;
        close(logp[i][0]);
        char want[160];
        snprintf(want, sizeof want, "server %d: the job has ended with workers lost: lost 2, finished 0-1 (of 3); stopping", i);
        KT_CHECK(strstr(log, want), "%s: server %d's log does not say '%s':\n%s", elastic ? "elastic" : "BSP", i, want, log);
    }
}
static void test_lost_worker_processes(void) {
    lost_worker_processes(0);
    lost_worker_processes(1);
}

int main(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    KT_RUN(test_clean_finish);
    KT_RUN(test_finished_worker_named);
    KT_RUN(test_config_refused);
    KT_RUN(test_stall_named);
    KT_RUN(test_never_connected);
    KT_RUN(test_late_server_hears_goodbye, 60);
    KT_RUN(test_lost_worker_ends_job, 60);
    KT_RUN(test_lost_worker_ends_elastic_job, 60);
    KT_RUN(test_lost_worker_keep_serving, 60);
    KT_RUN(test_lost_worker_processes, 150);
    return kt_finish();
}
