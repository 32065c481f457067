/* Load: 32 workers (threads) and 4 servers (threads of one child process) over TCP on loopback.
   Async: every worker pushes 10,000 times (1,000 with KVPS_TEST_QUICK=1), 8 requests in flight,
   one key of 64 floats per push, rotating over 4 keys held by the 4 servers; values are small
   integers, so the stored sums are exact and are checked element by element against sums
   computed naively here. BSP: every worker then runs 500 (50) pushpull steps of a 4096-float
   tensor sliced over the 4 servers and checks each step's running sum exactly. No message lost: every
   request completes OK, and the servers' own counters show exactly the pushes sent, no errors.
   Memory: the servers' peak RSS (their process's ru_maxrss) must stay under a bound derived from
   what may be in flight (see server_rss_bound_kb), far below the volume pushed through them. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

enum {
    NS = 4,       /* servers */
    NW = 32,      /* workers */
    L = 64,       /* floats per key */
    NK = 4,       /* keys, one per server */
    WINDOW = 8,   /* requests in flight per worker */
    TLEN = 4096   /* BSP tensor: 4 slices of 1024 */
};

static int pushes_per_worker(void) { return kt_quick() ? 1000 : 10000; }
static int bsp_steps(void) { return kt_quick() ? 50 : 500; }

/* A contribution: small integers, so any sum of them is exact in float32. */
static float contrib(int r, int t, int i) { return (float)((r * 7 + t * 3 + i) % 5); }

/* ---- the server process ------------------------------------------------------------------ */
typedef struct srv_report {
    kvps_server_stats st[NS];
    long maxrss_kb, start_rss_kb;
} srv_report;

static void server_process(int ep_fd, int cmd_fd, int rep_fd, kvps_consistency cons) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long start_rss = ru.ru_maxrss;
    void *ctx = zmq_ctx_new();
    zmq_ctx_set(ctx, ZMQ_IO_THREADS, 2);
    kvps_server *s[NS];
    char eps[1024] = "";
    for (int i = 0; i < NS; i++) {
        kvps_result r = kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .rank = i, .num_workers = NW,
                                                                .consistency = cons, .update = KVPS_UPDATE_ACCUMULATE, .zmq_ctx = ctx,
                                                                .keep_serving = 1},
                                           &s[i]);
        if (r != KVPS_OK) _exit(2);
        kvps_server_start(s[i]);
        snprintf(eps + strlen(eps), sizeof eps - strlen(eps), "%s%s", i ? "," : "", kvps_server_endpoint(s[i]));
    }
    if (write(ep_fd, eps, strlen(eps) + 1) < 0) _exit(3);
    close(ep_fd);
    char c;
    while (read(cmd_fd, &c, 1) == 1) { /* 'S': report the counters and the peak RSS so far */
        srv_report rep;
        memset(&rep, 0, sizeof rep);
        for (int i = 0; i < NS; i++) kvps_server_stats_get(s[i], &rep.st[i]);
        getrusage(RUSAGE_SELF, &ru);
        rep.maxrss_kb = ru.ru_maxrss;
        rep.start_rss_kb = start_rss;
        if (write(rep_fd, &rep, sizeof rep) != (ssize_t)sizeof rep) _exit(4);
    }
    for (int i = 0; i < NS; i++) kvps_server_destroy(&s[i]);
    zmq_ctx_term(ctx);
    _exit(0);
}

typedef struct cluster {
    pid_t pid;
    int cmd, rep;
    char servers[1024];
} cluster;

/* Forks the server process (before this process has threads of its own). */
static int cluster_up(cluster *c, kvps_consistency cons) {
    int ep[2], cmd[2], rep[2];
    if (pipe(ep) || pipe(cmd) || pipe(rep)) return -1;
    fflush(stdout);
    c->pid = fork();
    if (c->pid < 0) return -1;
    if (c->pid == 0) {
        /* keep only its own pipe ends: an inherited write end of another server process's
           command pipe would keep that one from seeing its end of input */
        for (int fd = 3; fd < 1024; fd++)
            if (fd != ep[1] && fd != cmd[0] && fd != rep[1]) close(fd);
        server_process(ep[1], cmd[0], rep[1], cons);
    }
    close(ep[1]); close(cmd[0]); close(rep[1]);
    c->cmd = cmd[1];
    c->rep = rep[0];
    ssize_t n = read(ep[0], c->servers, sizeof c->servers - 1);
    close(ep[0]);
    if (n <= 1) return -1;
    c->servers[n] = 0;
    return 0;
}

static int cluster_report(cluster *c, srv_report *out) {
    return write(c->cmd, "S", 1) == 1 && read(c->rep, out, sizeof *out) == (ssize_t)sizeof *out ? 0 : -1;
}

static int cluster_down(cluster *c) {
    close(c->cmd);
    close(c->rep);
    int st = 0;
    waitpid(c->pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* What the server process may hold at its peak, in KiB, beyond what it had when it started:
   - requests in flight: at most NW * WINDOW, the workers' windows (kvps sets the servers'
     ROUTER high-water marks to 0, unlimited, so that no reply is ever dropped: so it is the
     windows, not the high-water marks, that bound what queues in a server), each a meta frame
     (32 + 16 B) and a values frame (value_bytes), plus its reply (32 B), each ZeroMQ message
     with ~128 B of bookkeeping: counted twice (received and not yet closed, or being copied);
   - stored state: every key's value, round sum and a spare buffer (3 x its bytes), and the
     per-worker receive counters;
   - ZeroMQ per TCP connection (NW * NS of them): its engine's 8 KiB receive and 8 KiB send
     batches and the decoder's buffer (8 KiB), and the pipes' chunks (~2 KiB each way);
   - fixed: 4 server threads, 2 I/O threads and a reaper (stacks as touched, ~64 KiB each),
     glibc's arenas for those threads (a few hundred KiB each as touched), the ZeroMQ context:
     24 MiB, generous (measured here: the whole peak is ~16 MiB above the start).
   None of it grows with the number of pushes: the data pushed through (tens of MB) must not
   stay anywhere. */
static long server_rss_bound_kb(size_t value_bytes, size_t stored_bytes) {
    double inflight = 2.0 * NW * WINDOW * ((48 + 128) + (value_bytes + 128) + (32 + 128));
    double state = 3.0 * (double)stored_bytes + 8.0 * NW * 64;
    double conns = (double)NW * NS * (3 * 8192 + 2 * 2048);
    double fixed = 24.0 * 1024 * 1024;
    return (long)((inflight + state + conns + fixed) / 1024.0);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LOAD_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define LOAD_SANITIZED 1
#endif
#endif
#ifndef LOAD_SANITIZED
#define LOAD_SANITIZED 0
#endif
/* Sanitizers and valgrind keep freed memory aside (ASan's quarantine alone is 256 MiB): the RSS
   is reported there, not held to the bound. */
static int rss_checked(void) {
    const char *pre = getenv("LD_PRELOAD");
    return !LOAD_SANITIZED && !(pre && strstr(pre, "valgrind")) && !getenv("KVPS_TEST_WRAP");
}

static uint64_t g_keys[NK]; /* one per server */
static void *g_wctx;

/* ---- async pushes ------------------------------------------------------------------------ */
/* x's worker in the team's context (g_wctx), or NULL with the failure recorded. */
static kvps_worker *load_worker(kt_wk *x) {
    kvps_worker *w = NULL;
    kvps_result r = kvps_worker_create(&(kvps_worker_desc){.servers = x->ws->servers, .rank = x->rank, .num_workers = NW,
                                                           .timeout_ms = 60000, .zmq_ctx = x->ws->ctx},
                                       &w);
    if (r != KVPS_OK) { kt_wk_fail(x, "create: %s", kvps_result_str(r)); return NULL; }
    return w;
}

static void push_worker(kt_wk *x) {
    kvps_worker *w = load_worker(x);
    if (!w) return;
    kvps_result r;
    static __thread float vals[WINDOW][L];
    kvps_req q[WINDOW];
    size_t len = L;
    int P = pushes_per_worker();
    for (int t = 0; t < P + WINDOW; t++) {
        int slot = t % WINDOW;
        if (t >= WINDOW) { /* the buffer of push t - WINDOW is free once that push completed */
            r = kvps_worker_wait(w, q[slot], -1);
            if (r != KVPS_OK) kt_wk_fail(x, "push %d: %s (%.200s)", t - WINDOW, kvps_result_str(r), kvps_worker_last_error(w));
        }
        if (t >= P) continue;
        for (int i = 0; i < L; i++) vals[slot][i] = contrib(x->rank, t, i);
        r = kvps_worker_push(w, &g_keys[(x->rank + t) % NK], vals[slot], &len, 1, &q[slot]);
        if (r != KVPS_OK) {
            kt_wk_fail(x, "push %d: %s", t, kvps_result_str(r));
            break;
        }
    }
    kvps_worker_destroy(&w);
}

/* Picks NK raw keys, one on each server (a key's server is mix64(key) mod NS). */
static void pick_keys(void) {
    int have = 0;
    for (uint64_t k = 1000; have < NK; k++) {
        int s = (int)(kvps__mix64(k) % NS), used = 0;
        for (int i = 0; i < have; i++) used |= (int)(kvps__mix64(g_keys[i]) % NS) == s;
        if (!used) g_keys[have++] = k;
    }
}

/* NW worker threads running fn against servers, in a context of 2 I/O threads (g_wctx, left for
   the caller to end); each failing worker is reported. Returns how many failed. */
static int run_workers(const char *label, const char *servers, void (*fn)(kt_wk *)) {
    g_wctx = zmq_ctx_new();
    zmq_ctx_set(g_wctx, ZMQ_IO_THREADS, 2);
    static kt_workers ws;
    kt_workers_init(&ws, label, fn, NW, servers, g_wctx);
    return kt_workers_run(&ws);
}

/* Both server processes are forked first, while this process is small and has no threads. */
static cluster g_async, g_bsp;
static int g_async_up, g_bsp_up;

static void test_async_pushes(void) {
    cluster c = g_async;
    if (!g_async_up) { KT_CHECK(0, "server process did not start"); return; }
    pick_keys();
    int64_t t0 = kvps__now_ms();
    int failures = run_workers("async", c.servers, push_worker);
    double secs = (double)(kvps__now_ms() - t0) / 1000.0;
    int P = pushes_per_worker();

    /* every sum, element by element, against the naive sum */
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers, .rank = 0, .num_workers = NW, .zmq_ctx = g_wctx}, &w));
    float got[NK][L];
    size_t lens[NK] = {L, L, L, L};
    kvps_req q;
    KT_OK(kvps_worker_pull(w, g_keys, &got[0][0], lens, NK, &q));
    KT_OK(kvps_worker_wait(w, q, -1));
    kvps_worker_destroy(&w);
    zmq_ctx_term(g_wctx);
    int bad = 0;
    for (int k = 0; k < NK; k++)
        for (int i = 0; i < L; i++) {
            double want = 0;
            for (int r = 0; r < NW; r++)
                for (int t = 0; t < P; t++)
                    if ((r + t) % NK == k) want += contrib(r, t, i);
            if ((double)got[k][i] != want && bad++ < 5)
                KT_CHECK(0, "key %llu [%d]: %.1f, naive sum %.1f", (unsigned long long)g_keys[k], i, (double)got[k][i], want);
        }
    KT_CHECK(bad == 0, "%d of %d sums differ", bad, NK * L);
    KT_CHECK(failures == 0, "%d workers failed", failures);

    /* no message lost: the servers counted exactly the pushes sent, and refused none */
    srv_report rep;
    KT_CHECK(cluster_report(&c, &rep) == 0, "no report from the server process");
    uint64_t pushes = 0, errors = 0, rounds = 0;
    for (int i = 0; i < NS; i++) {
        pushes += rep.st[i].pushes;
        errors += rep.st[i].errors;
        rounds += rep.st[i].rounds;
        KT_CHECK(rep.st[i].pushes == (uint64_t)NW * P / NS, "server %d counted %llu pushes, %llu sent to it", i,
                 (unsigned long long)rep.st[i].pushes, (unsigned long long)NW * P / NS);
    }
    KT_CHECK(pushes == (uint64_t)NW * P && rounds == pushes && errors == 0, "servers: %llu pushes, %llu rounds, %llu errors",
             (unsigned long long)pushes, (unsigned long long)rounds, (unsigned long long)errors);
    KT_CHECK(cluster_down(&c) == 0, "server process exit");

    long bound = rep.start_rss_kb + server_rss_bound_kb(L * sizeof(float), NK * L * sizeof(float));
    double pushed_mb = (double)NW * P * (L * sizeof(float) + 48) / 1e6;
    printf("  async: %d workers x %d pushes of %d floats to %d servers in %.2f s: %.0f pushes/s, %.1f MB pushed\n", NW, P, L,
           NS, secs, NW * P / secs, pushed_mb);
    printf("  servers' peak RSS: %.1f MiB (%.1f MiB at start; bound %.1f MiB, %.2f x the bytes pushed%s)\n",
           rep.maxrss_kb / 1024.0, rep.start_rss_kb / 1024.0, bound / 1024.0, rep.maxrss_kb * 1024.0 / (pushed_mb * 1e6),
           rss_checked() ? "" : "; not checked under a sanitizer or valgrind");
    if (rss_checked()) KT_CHECK(rep.maxrss_kb <= bound, "servers' peak RSS %ld KiB > bound %ld KiB", rep.maxrss_kb, bound);
}

/* ---- BSP pushpull -------------------------------------------------------------------------- */
static void bsp_worker(kt_wk *x) {
    kvps_worker *w = load_worker(x);
    if (!w) return;
    kvps_result r;
    kvps_tensor t;
    float *g = (float *)malloc(TLEN * sizeof(float)), *v = (float *)malloc(TLEN * sizeof(float));
    r = kvps_worker_tensor(w, "load.bsp", TLEN, &t);
    if (r == KVPS_OK && kvps_worker_tensor_slices(w, t) != NS) r = KVPS_ERR_CONFIG;
    /* the stored value is the running sum (UPDATE_SUM): a running naive sum here, from the sum
       over ranks of each step's contributions (which depends on (3 s + i) mod 5 only) */
    double over_ranks[5], *want = (double *)calloc(TLEN, sizeof(double));
    for (int c = 0; c < 5; c++) {
        over_ranks[c] = 0;
        for (int rr = 0; rr < NW; rr++) over_ranks[c] += contrib(rr, 0, c);
    }
    if (r != KVPS_OK) kt_wk_fail(x, "tensor: %s", kvps_result_str(r));
    for (int s = 0; s < bsp_steps() && r == KVPS_OK; s++) {
        for (int i = 0; i < TLEN; i++) g[i] = contrib(x->rank, s, i);
        kvps_req q;
        r = kvps_worker_pushpull_tensor(w, t, g, v, &q);
        if (r == KVPS_OK) r = kvps_worker_wait(w, q, -1);
        if (r != KVPS_OK) { kt_wk_fail(x, "step %d: %s (%.200s)", s, kvps_result_str(r), kvps_worker_last_error(w)); break; }
        for (int i = 0; i < TLEN; i++) {
            want[i] += over_ranks[(3 * s + i) % 5];
            if ((double)v[i] != want[i]) kt_wk_fail(x, "step %d [%d]: %.1f, naive %.1f", s, i, (double)v[i], want[i]);
        }
    }
    free(want);
    free(g);
    free(v);
    kvps_worker_destroy(&w);
}

static void test_bsp_pushpull(void) {
    cluster c = g_bsp;
    if (!g_bsp_up) { KT_CHECK(0, "server process did not start"); return; }
    int64_t t0 = kvps__now_ms();
    run_workers("BSP", c.servers, bsp_worker);
    double secs = (double)(kvps__now_ms() - t0) / 1000.0;
    zmq_ctx_term(g_wctx);
    srv_report rep;
    KT_CHECK(cluster_report(&c, &rep) == 0, "no report from the server process");
    uint64_t pushes = 0, errors = 0, rounds = 0;
    for (int i = 0; i < NS; i++) { pushes += rep.st[i].pushes; errors += rep.st[i].errors; rounds += rep.st[i].rounds; }
    uint64_t steps = (uint64_t)bsp_steps();
    KT_CHECK(pushes == NW * steps * NS && rounds == steps * NS && errors == 0,
             "servers: %llu slice pushes (want %llu), %llu rounds (want %llu), %llu errors", (unsigned long long)pushes,
             (unsigned long long)(NW * steps * NS), (unsigned long long)rounds, (unsigned long long)(steps * NS),
             (unsigned long long)errors);
    KT_CHECK(cluster_down(&c) == 0, "server process exit");
    long bound = rep.start_rss_kb + server_rss_bound_kb(TLEN / NS * sizeof(float), TLEN * sizeof(float));
    printf("  BSP: %d workers x %llu pushpull steps of %d floats over %d servers in %.2f s: %.0f steps/s\n", NW,
           (unsigned long long)steps, TLEN, NS, secs, (double)steps / secs);
    printf("  servers' peak RSS: %.1f MiB (%.1f MiB at start; bound %.1f MiB%s)\n", rep.maxrss_kb / 1024.0,
           rep.start_rss_kb / 1024.0, bound / 1024.0, rss_checked() ? "" : ", not checked under a sanitizer or valgrind");
    if (rss_checked()) KT_CHECK(rep.maxrss_kb <= bound, "servers' peak RSS %ld KiB > bound %ld KiB", rep.maxrss_kb, bound);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    kvps_log_set_level(KVPS_LOG_ERROR);
    g_async_up = cluster_up(&g_async, KVPS_ASYNC) == 0;
    g_bsp_up = cluster_up(&g_bsp, KVPS_BSP) == 0;
    KT_RUN(test_async_pushes);
    KT_RUN(test_bsp_pushpull);
    return kt_finish();
}
