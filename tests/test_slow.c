/* test_slow - slow is not dead (issue 31). A PS worker and a ring rank whose main thread sleeps
   (alive: their ZeroMQ I/O threads answer heartbeats), every desc at its defaults, are waited
   for: both jobs end with the naive oracle's results, and the stall inspectors' warnings name the
   sleeper. The pause is $KVPS_TEST_PAUSE_S seconds (default 61: past the 60 s stall warning; 5
   under KVPS_TEST_QUICK, as in the sanitizer runs, where the warnings are not looked for);
   the PS and the ring pause run at once, so the suite pays it once. A ring rank or PS worker
   killed with SIGKILL ends every wait with a named error (KVPS_ERR_PEER_LOST, or a peer's abort
   that names it), ring over shared memory, over its TCP connections and over ZeroMQ alone; a
   stopped one (SIGSTOP) is treated as dead, as the manuals say. Defaults everywhere (no
   .timeout_ms): a hang is caught by each scenario's time limit, never by a deadline of kvps. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "kvps_ring.h"
#include "tests/kvps_test.h"
#include <signal.h>
#include <sys/wait.h>

/* ---- this process's log lines, kept to find the stall inspector's ---- */
static char g_log[1 << 16];
static size_t g_log_len;
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static void keep_log(void *user, kvps_log_level level, const char *msg) {
    (void)user;
    (void)level;
    pthread_mutex_lock(&g_log_mu);
    size_t n = strlen(msg);
    if (g_log_len + n + 2 < sizeof g_log) {
        memcpy(g_log + g_log_len, msg, n);
        g_log_len += n;
        g_log[g_log_len++] = '\n';
        g_log[g_log_len] = 0;
    }
    pthread_mutex_unlock(&g_log_mu);
}
static void log_keep(void) {
    g_log_len = 0;
    g_log[0] = 0;
    kvps_log_set_level(KVPS_LOG_WARN);
    kvps_log_set_fn(keep_log, NULL);
}
/* Whether a kept line holds both a and b. */
static int log_has(const char *a, const char *b) {
    pthread_mutex_lock(&g_log_mu);
    int found = 0;
    for (const char *l = g_log; *l && !found;) {
        const char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l) : strlen(l);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line - 1 ? n : sizeof line - 1), l);
        found = strstr(line, a) && strstr(line, b);
        l += n + (e ? 1 : 0);
    }
    pthread_mutex_unlock(&g_log_mu);
    return found;
}

static int pause_s(void) {
    int s = kt_quick() ? 5 : 61; /* quick (the sanitizer runs): 5 s, the stall warnings not looked for */
    const char *e = getenv("KVPS_TEST_PAUSE_S");
    if (e && *e) s = atoi(e);
    return s > 0 ? s : 1;
}
/* The main thread sleeps s seconds (however often a signal wakes it). */
static void sleep_s(int s) {
    int64_t until = kt_now_ms() + (int64_t)s * 1000;
    for (int64_t now = kt_now_ms(); now < until; now = kt_now_ms()) kt_sleep_ms((long)(until - now));
}

enum { STEPS = 4, N = 1000, SLEEP_AT = 2 };
/* What rank (or worker) r contributes at step t: small integers, exact in float at any sum. */
static float grad_of(int r, int t, int i) { return (float)((r + 1) * (t + 1) + i % 7); }

/* ---- a ring rank sleeps ---- */
/* Two ranks, defaults: rank 1 sleeps before step SLEEP_AT's all-reduce; every step's result is
   the naive sum; rank 0, which waits for it, has logged a stall naming rank 1. */
static void ring_pause_main(kt_rk *x) {
    log_keep();
    float *b = (float *)kt_xmalloc(N * sizeof *b);
    for (int t = 0; t < STEPS && !x->dead; t++) {
        for (int i = 0; i < N; i++) b[i] = grad_of(x->rank, t, i);
        if (x->rank == 1 && t == SLEEP_AT) sleep_s(pause_s());
        if (!kt_rk_call(x, kvps_ring_allreduce(x->r, b, b, N, KVPS_FLOAT32, KVPS_SUM), "allreduce")) break;
        int wrong = 0;
        for (int i = 0; i < N; i++) {
            float want = 0.0f;
            for (int r = 0; r < x->k; r++) want += grad_of(r, t, i);
            wrong += b[i] != want;
        }
        if (wrong) kt_rk_fail(x, "rank %d step %d: %d elements differ from the naive sum", x->rank, t, wrong);
    }
    if (x->rank == 0 && pause_s() * 1000 > 60000 && !log_has("stalled for", "waiting for rank 1 (process "))
        kt_rk_fail(x, "rank 0 waited %d s for rank 1 and logged no stall naming it; its log:\n%s", pause_s(), g_log);
    kvps_log_set_fn(NULL, NULL);
    free(b);
}
static void ring_pause_body(void) { kt_run_procs(2, ring_pause_main, 0, pause_s() + 60, -1); }

/* ---- a PS worker sleeps ---- */
/* Worker `rank` of 2 under BSP (the server's defaults: mean of the round): STEPS pushpulls of
   tensor 'w'; worker 1 sleeps before step SLEEP_AT. Each result must be the naive mean; worker
   0, whose pull waits, must have logged a stall that names tensor 'w' and worker 1. Exit 0 when
   all is well. */
static int ps_pause_worker(const char *ep, int rank) {
    log_keep();
    kvps_worker *w = NULL;
    kvps_tensor t = 0;
    float g[N], v[N];
    int bad = 0;
    kvps_result rc = kvps_worker_create(&(kvps_worker_desc){.servers = ep, .rank = rank, .num_workers = 2}, &w);
    if (rc == KVPS_OK) rc = kvps_worker_tensor(w, "w", N, &t);
    for (int s = 0; s < STEPS && rc == KVPS_OK; s++) {
        for (int i = 0; i < N; i++) g[i] = grad_of(rank, s, i);
        if (rank == 1 && s == SLEEP_AT) sleep_s(pause_s());
        kvps_req q;
        rc = kvps_worker_pushpull_tensor(w, t, g, v, &q);
        if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, -1);
        for (int i = 0; rc == KVPS_OK && i < N; i++)
            if (v[i] != (grad_of(0, s, i) + grad_of(1, s, i)) / 2.0f) bad++;
    }
    if (rc != KVPS_OK) printf("  PS worker %d: %s: %s\n", rank, kvps_result_str(rc), w ? kvps_worker_last_error(w) : "");
    if (bad) printf("  PS worker %d: %d elements differ from the naive mean\n", rank, bad);
    int named = rank != 0 || pause_s() * 1000 <= 60000 ||
                (log_has("worker 0: stalled for", "tensor 'w'") && log_has("worker 0: stalled for", "workers 1 (connected)"));
    if (!named) printf("  PS worker 0 logged no stall naming tensor 'w' and worker 1; its log:\n%s", g_log);
    if (rc == KVPS_OK) rc = kvps_worker_finish(w, -1);
    kvps_worker_destroy(&w);
    kvps_log_set_fn(NULL, NULL);
    fflush(stdout);
    return rc == KVPS_OK && !bad && named ? 0 : 1;
}
static void ps_pause_body(void) {
    char ep[256];
    pid_t srv = kt_server_proc(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 2}, ep, sizeof ep);
    KT_CHECK(srv > 0 && ep[0], "server did not start");
    if (srv <= 0 || !ep[0]) { kt_server_proc_stop(srv); return; }
    pid_t pid[2];
    fflush(stdout);
    for (int r = 0; r < 2; r++)
        if ((pid[r] = fork()) == 0) exit(ps_pause_worker(ep, r));
    int64_t deadline = kt_now_ms() + (int64_t)(pause_s() + 60) * 1000;
    for (int r = 0; r < 2; r++) {
        int st = kt_wait_pid(pid[r], deadline);
        KT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "PS worker %d: status %d (-1: a hang, killed)", r, st);
    }
    kt_server_proc_stop(srv);
}

/* Both pauses at once, each in a child of its own: started first, waited for last, so that the
   tests of deaths run meanwhile and the suite pays the pause once. */
static pid_t g_pause_ring, g_pause_ps;
static void test_pause_start(void) {
    fflush(stdout);
    g_pause_ring = fork();
    if (g_pause_ring == 0) { kt_cur_failed = 0; ring_pause_body(); fflush(stdout); exit(kt_cur_failed ? 1 : 0); }
    g_pause_ps = fork();
    if (g_pause_ps == 0) { kt_cur_failed = 0; ps_pause_body(); fflush(stdout); exit(kt_cur_failed ? 1 : 0); }
    KT_CHECK(g_pause_ring > 0 && g_pause_ps > 0, "fork");
}
static void test_pause_is_waited_for(void) {
    int64_t deadline = kt_now_ms() + (int64_t)(pause_s() + 120) * 1000;
    int a = g_pause_ring > 0 ? kt_wait_pid(g_pause_ring, deadline) : -3;
    int b = g_pause_ps > 0 ? kt_wait_pid(g_pause_ps, deadline) : -3;
    KT_CHECK(a >= 0 && WIFEXITED(a) && WEXITSTATUS(a) == 0, "ring with a rank asleep %d s: status %d (failures above)", pause_s(), a);
    KT_CHECK(b >= 0 && WIFEXITED(b) && WEXITSTATUS(b) == 0, "PS with a worker asleep %d s: status %d (failures above)", pause_s(), b);
}

/* ---- a ring rank dies or stops ---- */
static int g_stopped;      /* the dying rank is stopped (SIGSTOP), not killed */
static char g_case[64];    /* "SIGKILL, over TCP": named in failures */

/* Ranks of 3 at defaults; the last asks to die (kt_die_now: the parent sends kt_die_signal)
   before the all-reduce. The others' all-reduce must end with KVPS_ERR_PEER_LOST naming rank 2
   (or KVPS_ERR_PEER: the abort of a rank that named it), never a timeout (there is none). */
static void dying_main(kt_rk *x) {
    if (!kt_rk_call(x, kvps_ring_barrier(x->r), "barrier") || !kt_all_past(x, x->r, x->k - 1)) return;
    float b[256];
    for (int i = 0; i < 256; i++) b[i] = 1.0f;
    if (x->rank == x->k - 1) {
        fflush(stdout);
        kt_die_now();
    }
    kvps_result rc = kvps_ring_allreduce(x->r, b, b, 256, KVPS_FLOAT32, KVPS_SUM);
    const char *e = kvps_ring_last_error(x->r);
    char dead[32];
    snprintf(dead, sizeof dead, "rank %d ", x->k - 1);
    if ((rc != KVPS_ERR_PEER_LOST && rc != KVPS_ERR_PEER) || !strstr(e, dead))
        kt_rk_fail(x, "%s: rank %d: %s '%s': want KVPS_ERR_PEER_LOST (or a peer's abort) naming rank %d", g_case, x->rank,
                   kvps_result_str(rc), e, x->k - 1);
    if (strstr(g_case, "ZeroMQ alone") && strcmp(kvps_ring_transport(x->r, x->k - 1), "zmq"))
        kt_rk_fail(x, "%s: rank %d reaches rank %d over %s", g_case, x->rank, x->k - 1, kvps_ring_transport(x->r, x->k - 1));
    /* stopped, on this host: said so by whoever waited for it directly */
    if (rc == KVPS_ERR_PEER_LOST && g_stopped && !strcmp(kvps_ring_transport(x->r, x->k - 1), "shm") && !strstr(e, "stopped"))
        kt_rk_fail(x, "%s: rank %d: a stopped rank on this host is not said to be stopped: '%s'", g_case, x->rank, e);
}

/* One run of dying_main with KVPS_RING_SHM / KVPS_RING_TCP as given (NULL: unset). ZeroMQ alone
   (both "0"): every rank a host of its own, so that no rank looks at another's process and
   only the ZeroMQ connection (its drop, its heartbeats) tells the death. */
static void dying_run(const char *shm, const char *tcp, int sig) {
    if (shm) setenv("KVPS_RING_SHM", shm, 1); else unsetenv("KVPS_RING_SHM");
    if (tcp) setenv("KVPS_RING_TCP", tcp, 1); else unsetenv("KVPS_RING_TCP");
    kt_proc_hosts_apart = shm && tcp;
    kt_die_signal = sig;
    g_stopped = sig == SIGSTOP;
    snprintf(g_case, sizeof g_case, "%s, over %s", sig == SIGSTOP ? "SIGSTOP" : "SIGKILL",
             shm ? tcp ? "ZeroMQ alone" : "TCP" : "shared memory");
    kt_run_procs(3, dying_main, 0, 60, 2);
    kt_die_signal = 0;
    kt_proc_hosts_apart = 0;
    unsetenv("KVPS_RING_SHM");
    unsetenv("KVPS_RING_TCP");
}

static void test_ring_rank_killed(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    if (pipe(kt_die_pipe) != 0) { KT_CHECK(0, "pipe"); return; }
    dying_run(NULL, NULL, SIGKILL);
    dying_run("0", NULL, SIGKILL);
    dying_run("0", "0", SIGKILL);
    close(kt_die_pipe[0]);
    close(kt_die_pipe[1]);
    kvps_log_set_level(KVPS_LOG_ERROR);
}

static void test_ring_rank_stopped(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    if (pipe(kt_die_pipe) != 0) { KT_CHECK(0, "pipe"); return; }
    dying_run(NULL, NULL, SIGSTOP);
    close(kt_die_pipe[0]);
    close(kt_die_pipe[1]);
    kvps_log_set_level(KVPS_LOG_ERROR);
}

/* ---- a PS worker dies or stops, then the server ---- */
/* Worker 1 pushes one round and waits (pause) to be signalled (sig: SIGKILL or SIGSTOP); worker 0
   (this process) then pushpulls round 2 with defaults: its wait ends with KVPS_ERR_PEER_LOST
   naming worker 1 (the server answers once the worker is lost: its connection closed, or silent,
   for peer_timeout_ms). Then the server gets sig: the next wait ends with KVPS_ERR_PEER_LOST
   naming server 0 (its connection closed, or its heartbeats unanswered, for peer_timeout_ms). */
static void ps_dying(int sig) {
    char ep[256];
    pid_t srv = kt_server_proc(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 2}, ep, sizeof ep);
    KT_CHECK(srv > 0 && ep[0], "server did not start");
    if (srv <= 0 || !ep[0]) { kt_server_proc_stop(srv); return; }
    int ready[2];
    if (pipe(ready) != 0) { KT_CHECK(0, "pipe"); kt_server_proc_stop(srv); return; }
    float g[N], v[N];
    for (int i = 0; i < N; i++) g[i] = 1.0f;
    fflush(stdout);
    pid_t w1 = fork();
    if (w1 == 0) {
        kvps_worker *w = NULL;
        kvps_tensor t;
        kvps_req q;
        int ok = kvps_worker_create(&(kvps_worker_desc){.servers = ep, .rank = 1, .num_workers = 2}, &w) == KVPS_OK &&
                 kvps_worker_tensor(w, "w", N, &t) == KVPS_OK && kvps_worker_pushpull_tensor(w, t, g, v, &q) == KVPS_OK &&
                 kvps_worker_wait(w, q, -1) == KVPS_OK;
        if (write(ready[1], ok ? "y" : "n", 1) < 0) _exit(3);
        for (;;) pause();
    }
    kvps_worker *w = NULL;
    kvps_tensor t = 0;
    kvps_req q;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = ep, .rank = 0, .num_workers = 2}, &w));
    KT_OK(kvps_worker_tensor(w, "w", N, &t));
    KT_OK(kvps_worker_pushpull_tensor(w, t, g, v, &q));
    KT_OK(kvps_worker_wait(w, q, -1));
    char c = 0;
    KT_CHECK(read(ready[0], &c, 1) == 1 && c == 'y', "worker 1 did not get through its first round");
    kill(w1, sig);
    kvps_result rc = kvps_worker_pushpull_tensor(w, t, g, v, &q);
    if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, -1);
    const char *e = kvps_worker_last_error(w);
    KT_CHECK(rc == KVPS_ERR_PEER_LOST && strstr(e, "worker 1"), "worker 1 %s: worker 0's wait gave %s '%s', want "
             "KVPS_ERR_PEER_LOST naming worker 1", sig == SIGSTOP ? "stopped" : "killed", kvps_result_str(rc), e);
    kill(srv, sig);
    kvps_req q2;
    rc = kvps_worker_pull_tensor(w, t, v, &q2);
    if (rc == KVPS_OK) rc = kvps_worker_wait(w, q2, -1);
    e = kvps_worker_last_error(w);
    KT_CHECK(rc == KVPS_ERR_PEER_LOST && strstr(e, "server 0 (") && strstr(e, "unreachable"),
             "server %s: the wait gave %s '%s', want KVPS_ERR_PEER_LOST naming server 0", sig == SIGSTOP ? "stopped" : "killed",
             kvps_result_str(rc), e);
    kill(srv, SIGKILL);
    waitpid(srv, NULL, 0);
    kvps_worker_destroy(&w);
    kill(w1, SIGKILL);
    waitpid(w1, NULL, 0);
    close(ready[0]);
    close(ready[1]);
}
static void ps_killed_body(void) { kvps_log_set_level(KVPS_LOG_NONE); ps_dying(SIGKILL); }
static void ps_stopped_body(void) { kvps_log_set_level(KVPS_LOG_NONE); ps_dying(SIGSTOP); }
static void test_ps_worker_and_server_killed(void) { kt_isolated(ps_killed_body, 60); }
static void test_ps_worker_and_server_stopped(void) { kt_isolated(ps_stopped_body, 60); }

/* The new desc fields are checked: a stall_ms below -1 or a negative peer_timeout_ms is refused,
   the field named; 0 takes the defaults (60 s, 5 s) and -1 turns the inspector off. */
static void test_desc_fields_checked(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    kvps_ring *r = NULL;
    KT_CHECK(kvps_ring_create(&(kvps_ring_desc){.size = 1, .bind = "inproc://slow-a", .stall_ms = -2}, &r) == KVPS_ERR_CONFIG &&
             !r && strstr(kvps_ring_last_error(NULL), "stall_ms"), "ring stall_ms -2: '%s'", kvps_ring_last_error(NULL));
    KT_CHECK(kvps_ring_create(&(kvps_ring_desc){.size = 1, .bind = "inproc://slow-b", .peer_timeout_ms = -1}, &r) ==
             KVPS_ERR_CONFIG && !r && strstr(kvps_ring_last_error(NULL), "peer_timeout_ms"), "ring peer_timeout_ms -1: '%s'",
             kvps_ring_last_error(NULL));
    KT_OK(kvps_ring_create(&(kvps_ring_desc){.size = 1, .bind = "inproc://slow-c", .stall_ms = -1}, &r));
    KT_CHECK(r && r->desc.stall_ms == -1 && r->desc.peer_timeout_ms == 5000 && r->desc.timeout_ms == 0,
             "ring desc resolved to stall %d, peer timeout %d, timeout %d", r ? r->desc.stall_ms : 0,
             r ? r->desc.peer_timeout_ms : 0, r ? r->desc.timeout_ms : 0);
    kvps_ring_destroy(&r);
    kvps_worker *w = NULL;
    KT_CHECK(kvps_worker_create(&(kvps_worker_desc){.servers = "tcp://127.0.0.1:1", .stall_ms = -2}, &w) == KVPS_ERR_CONFIG && !w,
             "worker stall_ms -2 accepted");
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = "tcp://127.0.0.1:1"}, &w));
    KT_CHECK(w && w->desc.stall_ms == 60000 && w->desc.timeout_ms == 0, "worker desc resolved to stall %d, timeout %d",
             w ? w->desc.stall_ms : 0, w ? w->desc.timeout_ms : 0);
    kvps_worker_destroy(&w);
    kvps_log_set_level(KVPS_LOG_ERROR);
}

int main(void) {
    kvps_log_set_level(KVPS_LOG_ERROR);
    KT_RUN(test_pause_start, 10); /* (the pauses run while the deaths are tested) */
    KT_RUN(test_desc_fields_checked, 30);
    KT_RUN(test_ring_rank_killed, 200);
    KT_RUN(test_ring_rank_stopped, 100);
    KT_RUN(test_ps_worker_and_server_killed, 100);
    KT_RUN(test_ps_worker_and_server_stopped, 100);
    KT_RUN(test_pause_is_waited_for, 400);
    return kt_finish();
}
