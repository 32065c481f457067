/* kvps_test.h - the tests' tiny harness and cluster helpers (include after the kvps headers a
   test uses, with KVPS_IMPLEMENTATION; the parts for servers need kvps.h, those for rings
   kvps_ring.h, the rank processes both). Each test binary ends with
   "N passed, N failed[, N skipped]".

   What is here, in order:
     the runner       KT_CHECK, KT_OK, KT_SKIP, KT_RUN(test_fn[, limit_s]), kt_finish();
                      kt_vnote: a thread's record of its failures (kt_wk_fail, kt_rk_fail)
     the watchdog     kt_alarm: a hang fails the test instead of stalling the suite
     inputs           kt_rng, kt_randf (deterministic), kt_quick (KVPS_TEST_QUICK), kt_sleep_ms
     commands         kt_run_cmd: a shell command line's exit code and output
     the wire         KT_HDR (a request header by designated initialisers), a raw DEALER,
                      kt_raw_meta, kt_raw_status
     optimizers       kt_optim_tick, kt_optim_apply: the server's update rules, one element
     servers          kt_cluster: n servers in background threads (inproc / ipc / tcp);
                      kt_server_proc: a server in a process of its own
     workers          kt_workers: k worker threads running the same body (kt_wk), each
                      worker's failures reported with its rank by kt_workers_join
     rings            (with kvps_ring.h) kt_team: one thread per rank, each with its own ring;
                      kt_run_procs: ranks as processes that meet through a kvps server;
                      kt_isolated: a scenario in a child process with a time limit */
#ifndef KVPS_TEST_H
#define KVPS_TEST_H
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <stdarg.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <poll.h>
#include <sys/wait.h>
#include <zmq.h>

/* ---- the runner ---------------------------------------------------------------------------- */

static int kt_pass, kt_fail, kt_skip, kt_cur_failed, kt_cur_skipped;
static const char *kt_cur;
/* A suite that runs more than once names each run: with kt_label "tcp", KT_RUN(test_x) is
   "test_x [tcp]". */
static char kt_label[64];
/* Called as each test begins, where a file keeps counters of its own per test. */
static void (*kt_before_each)(void);

#define KT_CHECK(cond, ...)                                                                    \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            if (!kt_cur_failed) printf("FAIL %s\n", kt_cur);                                 \
            kt_cur_failed = 1;                                                                 \
            printf("  %s:%d: %s: ", __FILE__, __LINE__, #cond);                                \
            printf(__VA_ARGS__);                                                               \
            printf("\n");                                                                      \
        }                                                                                      \
    } while (0)
#define KT_OK(expr)                                                                            \
    do {                                                                                       \
        kvps_result kt_r_ = (expr);                                                            \
        KT_CHECK(kt_r_ == KVPS_OK, "%s", kvps_result_str(kt_r_));                              \
    } while (0)

/* KT_SKIP(why...): the current test cannot run here (it needs what this machine lacks); it is
   counted as skipped, not passed, and says why. Return from the test after it. */
#define KT_SKIP(...)                                                                           \
    do {                                                                                       \
        printf("skip %s: ", kt_cur);                                                           \
        printf(__VA_ARGS__);                                                                   \
        printf("\n");                                                                          \
        kt_cur_skipped = 1;                                                                    \
    } while (0)

/* KT_RUN(test_fn) runs one test and counts it: "ok test_fn", or "FAIL test_fn" and the checks
   that failed, or "skip test_fn: why". KT_RUN(test_fn, limit_s) runs it under the watchdog
   (kt_alarm) for limit_s seconds, 8 times that under KVPS_TEST_QUICK (sanitizers, valgrind).
   KVPS_TEST_TIMES=1 prints each test's wall time. */
#define KT_RUN(...) KT_RUN_(__VA_ARGS__, 0, 0)
#define KT_RUN_(fn, limit_s, ...) do { kt_begin(#fn, limit_s); fn(); kt_end(); } while (0)

static inline int kt_quick(void);
static inline void kt_alarm(unsigned seconds, const char *fmt, ...);
static inline int64_t kt_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t kt_t0;
static int kt_limited;
static inline void kt_begin(const char *name, int limit_s) {
    static char full[256];
    if (kt_label[0]) { snprintf(full, sizeof full, "%s [%s]", name, kt_label); kt_cur = full; }
    else kt_cur = name;
    kt_cur_failed = 0;
    kt_cur_skipped = 0;
    kt_t0 = kt_now_ms();
    kt_limited = limit_s > 0;
    if (kt_limited) {
        unsigned s = (unsigned)(kt_quick() ? limit_s * 8 : limit_s);
        kt_alarm(s, "%s", kt_cur);
    }
    if (kt_before_each) kt_before_each();
}
static inline void kt_end(void) {
    if (kt_limited) kt_alarm(0, NULL);
    if (getenv("KVPS_TEST_TIMES")) printf("  time %s: %lld ms\n", kt_cur, (long long)(kt_now_ms() - kt_t0));
    if (kt_cur_failed) kt_fail++;
    else if (kt_cur_skipped) kt_skip++;
    else { kt_pass++; printf("ok %s\n", kt_cur); }
    fflush(stdout);
}
/* The closing line, and main's exit status. */
static inline int kt_finish(void) {
    if (kt_skip) printf("%d passed, %d failed, %d skipped\n", kt_pass, kt_fail, kt_skip);
    else printf("%d passed, %d failed\n", kt_pass, kt_fail);
    fflush(stdout); /* before exit-time checkers (LeakSanitizer) can end the process */
    return kt_fail ? 1 : 0;
}

/* A thread's record of failures: adds one (fmt, ap) to why (cap bytes), the first three one per
   line, and counts every one in *fails. */
static inline void kt_vnote(char *why, size_t cap, int *fails, const char *fmt, va_list ap) {
    if ((*fails)++ >= 3) return;
    size_t len = strlen(why);
    if (len && len + 8 < cap) { memcpy(why + len, "\n    ", 6); len += 5; why[len] = 0; }
    vsnprintf(why + len, cap - len, fmt, ap);
}

/* ---- the watchdog -------------------------------------------------------------------------- */

/* A watchdog for calls that must return: kt_alarm(s, fmt, ...) arms SIGALRM for s seconds; if the
   call has not returned by then (kt_alarm(0, NULL) disarms), the test fails with what was named,
   the closing "N passed, N failed" line is printed and the process exits, so that a hang fails
   the suite instead of stalling it. The message is made when armed (the handler only writes). */
static char kt_alarm_msg[768];
static size_t kt_alarm_len;
static inline void kt_on_alarm(int sig) {
    (void)sig;
    ssize_t w = write(1, kt_alarm_msg, kt_alarm_len);
    (void)w;
    _exit(1);
}
static inline void kt_alarm(unsigned seconds, const char *fmt, ...) {
    if (!seconds) { alarm(0); return; }
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    int len = snprintf(kt_alarm_msg, sizeof kt_alarm_msg, "%s%s%s  %s did not return within %u s (a hang)\n%d passed, %d failed\n",
                       kt_cur_failed ? "" : "FAIL ", kt_cur_failed ? "" : (kt_cur ? kt_cur : "?"), kt_cur_failed ? "" : "\n",
                       what, seconds, kt_pass, kt_fail + 1);
    kt_alarm_len = len < 0 ? 0 : (size_t)len < sizeof kt_alarm_msg ? (size_t)len : sizeof kt_alarm_msg - 1;
    fflush(stdout); /* what was printed before goes out first */
    signal(SIGALRM, kt_on_alarm);
    alarm(seconds);
}

/* ---- inputs ------------------------------------------------------------------------------ */

/* KVPS_TEST_QUICK=1 (sanitizers, valgrind) skips the largest sizes. */
static inline int kt_quick(void) { const char *e = getenv("KVPS_TEST_QUICK"); return e && *e && *e != '0'; }

/* Deterministic pseudo-random floats in [-1, 1). */
static inline uint64_t kt_rng(uint64_t *s) {
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline float kt_randf(uint64_t *s) { return (float)((double)(kt_rng(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

static inline void kt_sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* malloc that ends the binary when memory runs out (a test's buffers, never what is tested). */
static inline void *kt_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { printf("out of memory (%zu bytes)\n", n); exit(2); }
    return p;
}

/* ---- commands ------------------------------------------------------------------------------ */

/* Runs a shell command line (fmt, ...) in directory dir (NULL: this one); returns its exit code
   (128 + the signal that ended it; -1: not run) and its stdout + stderr in *out (caller frees). */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static inline int kt_run_cmd(const char *dir, char **out, const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[sizeof cmd + 4096 + 32];
    if (dir) snprintf(full, sizeof full, "cd '%.4095s' && { %s ; } 2>&1", dir, cmd);
    else snprintf(full, sizeof full, "{ %s ; } 2>&1", cmd);
    fflush(stdout);
    FILE *p = popen(full, "r");
    size_t cap = 1 << 16, len = 0;
    char *buf = (char *)kt_xmalloc(cap);
    buf[0] = 0;
    if (!p) { *out = buf; return -1; }
    size_t got;
    while ((got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (cap - len < 4096) {
            char *more = (char *)realloc(buf, cap *= 2);
            if (!more) { printf("out of memory (%zu bytes)\n", cap); exit(2); }
            buf = more;
        }
    }
    buf[len] = 0;
    int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* ---- the wire ------------------------------------------------------------------------------ */

/* A request or reply header (kvps.h's kvps__hdr: 32 bytes, no padding) with the magic and
   version of this build and the fields named, every other one zero:
       kvps__hdr h = KT_HDR(.op = KVPS__OP_PUSH, .nkeys = 1, .req_id = 7); */
#define KT_HDR(...) ((kvps__hdr){.magic = KVPS__MAGIC, .version = KVPS__VERSION, __VA_ARGS__})

/* A raw DEALER on endpoint, and the meta frame of a one-key request of op for (key, len). */
static inline void *kt_raw_dealer(void *ctx, const char *endpoint, int rcvhwm, int rcvtimeo_ms) {
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    if (rcvhwm) zmq_setsockopt(d, ZMQ_RCVHWM, &rcvhwm, sizeof rcvhwm);
    if (rcvtimeo_ms) zmq_setsockopt(d, ZMQ_RCVTIMEO, &rcvtimeo_ms, sizeof rcvtimeo_ms);
    zmq_connect(d, endpoint);
    return d;
}
#ifdef KVPS__IMPLEMENTED /* kvps.h's implementation: the wire's internals */
static inline void kt_raw_meta(unsigned char meta[KVPS__HDR + KVPS__KENT], int op, uint64_t key, uint64_t len) {
    kvps__hdr h = KT_HDR(.op = (uint8_t)op, .nkeys = 1, .req_id = 1);
    kvps__kent e = {key, len};
    memcpy(meta, &h, sizeof h);
    memcpy(meta + KVPS__HDR, &e, sizeof e);
}

/* Sends [meta][vals] from raw DEALER d ([meta] alone when vals is NULL) and returns the status in
   the reply's header, or 1 when no reply came within timeout_ms; the reply's text frame, if any,
   goes to text (cap bytes, NUL-terminated; NULL: read and dropped). */
static inline int32_t kt_raw_reply(void *d, const void *meta, size_t msz, const void *vals, size_t vsz, int timeout_ms,
                                   char *text, size_t cap) {
    zmq_send(d, meta, msz, vals ? ZMQ_SNDMORE : 0);
    if (vals) zmq_send(d, vals, vsz, 0);
    if (text && cap) text[0] = 0;
    kvps__hdr rh;
    memset(&rh, 0, sizeof rh);
    zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) != 1) return 1;
    zmq_recv(d, &rh, sizeof rh, 0);
    int more = 0;
    size_t ml = sizeof more;
    zmq_getsockopt(d, ZMQ_RCVMORE, &more, &ml);
    while (more) {
        char buf[600];
        int n = (int)zmq_recv(d, buf, sizeof buf - 1, 0);
        if (n >= 0 && text && cap) snprintf(text, cap, "%.*s", n < (int)sizeof buf - 1 ? n : (int)sizeof buf - 1, buf);
        zmq_getsockopt(d, ZMQ_RCVMORE, &more, &ml);
    }
    return rh.status;
}
/* The chain hash a REPL hello must carry for chain "a|b|..." (kvps__repl_setup's, computed apart:
   a stranger can compute it too; what it lacks is the job token). */
static inline uint64_t kt_chain_hash(const char *chain) {
    uint64_t h = KVPS__FNV_BASIS;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", chain);
    for (char *e = strtok(buf, "|"); e; e = strtok(NULL, "|")) h = kvps__fnv(h, e, strlen(e) + 1);
    return h;
}

/* The same, the text dropped; 0 when no reply came (what the tests that use it expect). */
static inline int32_t kt_raw_status(void *d, const void *meta, size_t msz, const void *vals, size_t vsz, int timeout_ms) {
    int32_t st = kt_raw_reply(d, meta, msz, vals, vsz, timeout_ms, NULL, 0);
    return st == 1 ? 0 : st;
}
#endif

/* ---- the parameter server (kvps.h) ------------------------------------------------------ */
#ifdef KVPS_H
/* ---- optimizers ---------------------------------------------------------------------------- */

/* The server's update rules for one element, as the manual gives them, in float32 and in the
   order the server computes them, so that a one-process replay is bit-equal to what the servers
   hold. w is the element, v and m2 its rule state (zero at first); sum is the round's aggregate
   of n pushes (their sum; for MAX / MIN the largest / smallest); b1t, b2t are beta1^t and
   beta2^t, which kt_optim_tick moves once a round (per row for a table), before the elements. */
static inline void kt_optim_tick(const kvps_optim *o, float *b1t, float *b2t) {
    if (o->rule == KVPS_RULE_ADAM) { *b1t *= o->beta1; *b2t *= o->beta2; }
}
static inline void kt_optim_apply(const kvps_optim *o, float *w, float *v, float *m2, float sum, float n, float b1t,
                                  float b2t) {
    float g = sum / n;
    switch (o->rule) {
    case KVPS_RULE_MEAN: *w = g; break;
    case KVPS_RULE_SUM: case KVPS_RULE_MAX: case KVPS_RULE_MIN: *w = sum; break;
    case KVPS_RULE_ACCUMULATE: *w += sum; break;
    case KVPS_RULE_SGD: *w -= o->lr * g; break;
    case KVPS_RULE_MOMENTUM: *v = o->momentum * *v + g; *w -= o->lr * *v; break;
    case KVPS_RULE_NESTEROV: *v = o->momentum * *v + g; *w -= o->lr * (g + o->momentum * *v); break;
    case KVPS_RULE_ADAGRAD: *v += g * g; *w -= o->lr * g / (sqrtf(*v) + o->eps); break;
    case KVPS_RULE_ADAM:
        *v = o->beta1 * *v + (1.0f - o->beta1) * g;
        *m2 = o->beta2 * *m2 + (1.0f - o->beta2) * (g * g);
        *w -= o->lr * (*v / (1.0f - b1t)) / (sqrtf(*m2 / (1.0f - b2t)) + o->eps);
        break;
    default: break;
    }
}

/* ---- servers ------------------------------------------------------------------------------- */

/* n servers in background threads. transport: "inproc", "ipc" or "tcp". */
typedef struct kt_cluster {
    int n;
    void *ctx;
    kvps_server *srv[16];
    char servers[4096];
} kt_cluster;

static inline int kt_cluster_up(kt_cluster *c, const char *transport, int n, const kvps_server_desc *base) {
    static int seq;
    memset(c, 0, sizeof *c);
    c->n = n;
    c->ctx = zmq_ctx_new();
    for (int i = 0; i < n; i++) {
        char ep[256];
        if (strcmp(transport, "inproc") == 0) snprintf(ep, sizeof ep, "inproc://kt-%d-%d", seq, i);
        else if (strcmp(transport, "ipc") == 0) snprintf(ep, sizeof ep, "ipc:///tmp/kvps-test-%d-%d-%d", (int)getpid(), seq, i);
        else snprintf(ep, sizeof ep, "tcp://127.0.0.1:*");
        kvps_server_desc d = *base;
        d.endpoint = ep;
        d.rank = i;
        d.zmq_ctx = c->ctx;
        d.keep_serving = 1; /* a test's cluster outlives its workers: tests make worker after worker */
        kvps_result r = kvps_server_create(&d, &c->srv[i]);
        if (r != KVPS_OK) { printf("  server %d: %s\n", i, kvps_result_str(r)); return -1; }
        kvps_server_start(c->srv[i]);
        size_t len = strlen(c->servers);
        snprintf(c->servers + len, sizeof c->servers - len, "%s%s", i ? "," : "", kvps_server_endpoint(c->srv[i]));
    }
    seq++;
    return 0;
}

static inline void kt_cluster_down(kt_cluster *c) {
    for (int i = 0; i < c->n; i++) {
        const char *ep = c->srv[i] ? kvps_server_endpoint(c->srv[i]) : NULL;
        char path[300] = "";
        if (ep && strncmp(ep, "ipc://", 6) == 0) snprintf(path, sizeof path, "%s", ep + 6);
        kvps_server_destroy(&c->srv[i]);
        if (*path) unlink(path);
    }
    if (c->ctx) zmq_ctx_term(c->ctx);
    c->ctx = NULL;
}

/* A worker that dies: its connection closes with no goodbye (kvps_worker_finish), as when its
   process is killed; the servers see it lost, not finished. */
#ifdef KVPS__IMPLEMENTED /* (it reaches into the worker: test_examples includes the API only) */
static inline void kt_worker_vanish(kvps_worker **w) {
    if (*w) (*w)->finished = 1;
    kvps_worker_destroy(w);
}
#endif

/* ---- server processes ---------------------------------------------------------------------- */
#include <sys/wait.h>

static kvps_server *kt_proc_srv;
static inline void kt_proc_on_term(int sig) { (void)sig; if (kt_proc_srv) kvps_server_stop(kt_proc_srv); }

/* Forks a process running a kvps server made from d (ended by kt_server_proc_stop); returns its
   pid (-1: no pipe) and writes its endpoint to ep ("" when it did not start). */
static inline pid_t kt_server_proc(const kvps_server_desc *d, char *ep, size_t cap) {
    int p[2];
    if (pipe(p) != 0) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        signal(SIGTERM, kt_proc_on_term);
        kvps_result r = kvps_server_create(d, &kt_proc_srv);
        const char *e = r == KVPS_OK ? kvps_server_endpoint(kt_proc_srv) : "";
        if (write(p[1], e, strlen(e) + 1) < 0) _exit(3);
        close(p[1]);
        if (r != KVPS_OK) _exit(2);
        kvps_server_run(kt_proc_srv);
        kvps_server_destroy(&kt_proc_srv);
        exit(0);
    }
    close(p[1]);
    ssize_t got = read(p[0], ep, cap - 1);
    close(p[0]);
    if (got <= 1) { ep[0] = 0; return pid; }
    ep[got] = 0;
    return pid;
}

/* Waits for pid until deadline (ms); kills it if it is still running. Returns its status, or -1. */
static inline int kt_wait_pid(pid_t pid, int64_t deadline) {
    int st = 0;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) return st;
        if (w < 0) return -2;
        if (kt_now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        kt_sleep_ms(5);
    }
}

/* SIGTERM to a server process; it must exit 0 within 10 s. */
static inline void kt_server_proc_stop(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    int st = kt_wait_pid(pid, kt_now_ms() + 10000);
    KT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "server process status %d", st);
}

/* ---- workers ------------------------------------------------------------------------------- */
#include <pthread.h>

/* k worker threads, each running the same body with its rank (what kt_team is for rings):
       kt_workers ws;
       kt_workers_init(&ws, "label", body, k, c.servers, c.ctx);
       kt_workers_run(&ws);            (or kt_workers_start(&ws); ...; kt_workers_join(&ws))
   The body, void body(kt_wk *x), makes its worker with rank x->rank of x->k from
   x->ws->servers and x->ws->ctx (NULL: its own), finds what the workers share in x->ws->user,
   and records what goes wrong with kt_wk_fail(x, fmt, ...). kt_workers_join reports every
   worker that failed, naming the label and its rank, and returns how many did. What a test
   examines after the workers (their values, an error it expects) goes to records of its own, one
   per rank: with ws.each (k records of ws.each_size bytes), x->mine is rank x->rank's. */
enum { KT_MAXW = 64 };
typedef struct kt_workers kt_workers;

typedef struct kt_wk {
    kt_workers *ws;
    int rank, k;
    void *mine;     /* this rank's record in ws->each (NULL without) */
    int fails;
    int done;       /* the body has returned (atomic: kt_workers_done) */
    int started;    /* a thread runs it (kt_workers_start) */
    char why[1024]; /* the first three failures */
} kt_wk;

struct kt_workers {
    const char *label; /* names the failures: "label: worker r of k ..." */
    int k;
    void (*fn)(kt_wk *);
    const char *servers;
    void *ctx;
    void *user;        /* shared by every worker */
    void *each;        /* k records of each_size bytes, one per rank (optional) */
    size_t each_size;
    kt_wk wk[KT_MAXW];
    pthread_t th[KT_MAXW];
};

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static inline void kt_wk_fail(kt_wk *x, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kt_vnote(x->why, sizeof x->why, &x->fails, fmt, ap);
    va_end(ap);
}

static inline void kt_workers_init(kt_workers *ws, const char *label, void (*fn)(kt_wk *), int k, const char *servers,
                                   void *ctx) {
    memset(ws, 0, sizeof *ws);
    ws->label = label;
    ws->fn = fn;
    ws->k = k;
    ws->servers = servers;
    ws->ctx = ctx;
    if (k < 1 || k > KT_MAXW) { printf("kt_workers %s: %d workers (1 to %d)\n", label, k, KT_MAXW); exit(2); }
}

static inline kt_wk *kt_wk_setup(kt_workers *ws, int rank) {
    kt_wk *x = &ws->wk[rank];
    memset(x, 0, sizeof *x);
    x->ws = ws;
    x->rank = rank;
    x->k = ws->k;
    x->mine = ws->each ? (char *)ws->each + (size_t)rank * ws->each_size : NULL;
    return x;
}

static inline void *kt_wk_thread(void *arg) {
    kt_wk *x = (kt_wk *)arg;
    x->ws->fn(x);
    __atomic_store_n(&x->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Starts every worker (every record is set before the first thread starts). */
static inline void kt_workers_start(kt_workers *ws) {
    for (int r = 0; r < ws->k; r++) kt_wk_setup(ws, r);
    for (int r = 0; r < ws->k; r++) {
        kt_wk *x = &ws->wk[r];
        x->started = pthread_create(&ws->th[r], NULL, kt_wk_thread, x) == 0;
        if (!x->started) { kt_wk_fail(x, "pthread_create failed"); __atomic_store_n(&x->done, 1, __ATOMIC_RELEASE); }
    }
}

/* Whether every worker's body has returned. */
static inline int kt_workers_done(kt_workers *ws) {
    for (int r = 0; r < ws->k; r++)
        if (!__atomic_load_n(&ws->wk[r].done, __ATOMIC_ACQUIRE)) return 0;
    return 1;
}

/* Waits for every worker, then reports each one that failed; returns how many did. */
static inline int kt_workers_join(kt_workers *ws) {
    for (int r = 0; r < ws->k; r++)
        if (ws->wk[r].started) pthread_join(ws->th[r], NULL);
    int failed = 0;
    for (int r = 0; r < ws->k; r++) {
        kt_wk *x = &ws->wk[r];
        if (x->fails) failed++;
        KT_CHECK(x->fails == 0, "%s: worker %d of %d: %d failure%s: %s", ws->label, r, ws->k, x->fails, x->fails == 1 ? "" : "s",
                 x->why);
    }
    return failed;
}

static inline int kt_workers_run(kt_workers *ws) {
    kt_workers_start(ws);
    return kt_workers_join(ws);
}

/* Runs rank `rank`'s body alone, in this thread (a worker process of its own); its record is
   ws->wk[rank]. Returns its failures, reported by the caller. */
static inline int kt_workers_run_one(kt_workers *ws, int rank) {
    kt_wk *x = kt_wk_setup(ws, rank);
    ws->fn(x);
    x->done = 1;
    return x->fails;
}


#endif /* KVPS_H */

/* ---- a proxy's copying (the tests' TCP and ipc proxies, which cut connections) --------------- */

/* One pass: pair i's client side cfd[i] was polled as pf[1 + 2i], its upstream side ufd[i] as
   pf[2 + 2i]; what is readable on either side goes to the other (the upstream's not while
   hold_up). A pair whose side closed or failed is closed and removed (the last pair takes its
   place), and the pass ends there: the pf indices no longer match. */
static inline void kt_proxy_copy(const struct pollfd *pf, int polled, int *cfd, int *ufd, int *n, int hold_up, char *buf,
                                 size_t cap) {
    for (int i = 0; i < polled; i++) {
        int dead = 0;
        for (int d = 0; d < 2 && !dead; d++) {
            if (!(pf[1 + 2 * i + d].revents & (POLLIN | POLLHUP | POLLERR)) || (d && hold_up)) continue;
            int from = d ? ufd[i] : cfd[i], to = d ? cfd[i] : ufd[i];
            ssize_t got = read(from, buf, cap);
            if (got <= 0) { dead = 1; break; }
            for (ssize_t off = 0; off < got;) {
                ssize_t w = write(to, buf + off, (size_t)(got - off));
                if (w <= 0) { dead = 1; break; }
                off += w;
            }
        }
        if (dead) {
            close(cfd[i]); close(ufd[i]);
            cfd[i] = cfd[*n - 1]; ufd[i] = ufd[*n - 1];
            (*n)--;
            return;
        }
    }
}

/* ---- rings (kvps_ring.h) ------------------------------------------------------------------- */
#ifdef KVPS_RING_H
#include <poll.h>
#include <pthread.h>
#include <sys/wait.h>

enum { KT_MAXR = 8 };

/* A team: one thread per rank, each with its own ring, all running the same program t->fn:
       kt_run_team("label", body, k, tcp, timeout_ms, groups);
   A rank (kt_rk) records its failures (kt_rk_fail; kt_rk_call for a collective's result, after
   which a broken ring stops the rank) and hashes results that must be equal on every rank
   (kt_rk_hash); kt_team_run checks both once every rank is done. */

static inline uint64_t kt_fnv(const void *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) { h ^= ((const unsigned char *)p)[i]; h *= 0x100000001b3ull; }
    return h;
}

typedef struct kt_team kt_team;

typedef struct kt_rk {
    kt_team *t;
    kvps_ring *r;
    int rank, k;
    uint64_t opn;         /* operations so far: the same on every rank, so seeds agree */
    int dead;             /* the ring returned an error: it is broken, stop */
    int fails;
    char why[1400];
    uint64_t *hash;       /* results that must be equal on every rank */
    size_t nhash, caphash;
    /* scenario results */
    kvps_result rc1, rc2;
    int64_t ms1;
    char err1[520];
} kt_rk;

struct kt_team {
    const char *label;
    int k;
    int tcp;              /* 0: inproc, one shared context; 1: tcp://127.0.0.1:*, endpoints swapped here */
    kvps_ring_desc base;  /* timeout, chunk, algo, small_bytes, groups */
    void (*fn)(kt_rk *);
    const void *arg;
    void *ctx;
    char peers[KT_MAXR * 64];
    kt_rk ranks[KT_MAXR];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int nready, nfinished, counter, flag;
    char eps[KT_MAXR][256];
};

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static inline void kt_rk_fail(kt_rk *x, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kt_vnote(x->why, sizeof x->why, &x->fails, fmt, ap);
    va_end(ap);
}

/* A collective's result: on error the ring is broken, so the rank stops. */
static inline int kt_rk_call(kt_rk *x, kvps_result rc, const char *what) {
    if (rc == KVPS_OK) return 1;
    kt_rk_fail(x, "%s: %s [%s]", what, kvps_result_str(rc), x->r ? kvps_ring_last_error(x->r) : "");
    x->dead = 1;
    return 0;
}

static inline void kt_rk_hash(kt_rk *x, const void *p, size_t n) {
    if (x->nhash == x->caphash) {
        x->caphash = x->caphash ? 2 * x->caphash : 256;
        x->hash = (uint64_t *)realloc(x->hash, x->caphash * sizeof *x->hash);
        if (!x->hash) { printf("out of memory\n"); exit(2); }
    }
    x->hash[x->nhash++] = kt_fnv(p, n) ^ x->opn;
}

static inline uint64_t kt_rk_seed(kt_rk *x) {
    uint64_t s = 0x5eed5eedull + x->opn++ * 0x2545f4914f6cdd1dull;
    return kt_rng(&s);
}

static inline void *kt_team_thread(void *arg) {
    kt_rk *x = (kt_rk *)arg;
    kt_team *t = x->t;
    kvps_ring_desc d = t->base;
    d.rank = x->rank;
    d.size = t->k;
    if (t->tcp) { d.bind = "tcp://127.0.0.1:*"; d.peers = NULL; d.zmq_ctx = NULL; }
    else { d.peers = t->peers; d.zmq_ctx = t->ctx; }
    kvps_result rc = kvps_ring_create(&d, &x->r);
    if (rc != KVPS_OK) { kt_rk_fail(x, "create: %s", kvps_result_str(rc)); x->dead = 1; }
    if (t->tcp) {
        char peers[KT_MAXR * 64] = "";
        pthread_mutex_lock(&t->mu);
        snprintf(t->eps[x->rank], sizeof t->eps[x->rank], "%s", x->r ? kvps_ring_endpoint(x->r) : "tcp://127.0.0.1:1");
        t->nready++;
        pthread_cond_broadcast(&t->cv);
        while (t->nready < t->k) pthread_cond_wait(&t->cv, &t->mu);
        for (int i = 0; i < t->k; i++)
            snprintf(peers + strlen(peers), sizeof peers - strlen(peers), "%s%s", i ? "," : "", t->eps[i]);
        pthread_mutex_unlock(&t->mu);
        if (!x->dead) {
            rc = kvps_ring_connect(x->r, peers);
            if (rc != KVPS_OK) { kt_rk_fail(x, "connect: %s", kvps_result_str(rc)); x->dead = 1; }
        }
    }
    if (!x->dead) t->fn(x);
    /* a ring stays up until every rank is done: peers may still be sending to it */
    pthread_mutex_lock(&t->mu);
    t->nfinished++;
    pthread_cond_broadcast(&t->cv);
    while (t->nfinished < t->k) pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
    kvps_ring_destroy(&x->r);
    return NULL;
}

/* A team with zeroed settings: label, function, k ranks, inproc (tcp 0) or TCP, timeout. */
static inline void kt_team_init(kt_team *t, const char *label, void (*fn)(kt_rk *), int k, int tcp, int timeout_ms) {
    memset(t, 0, sizeof *t);
    t->label = label;
    t->fn = fn;
    t->k = k;
    t->tcp = tcp;
    t->base.timeout_ms = timeout_ms;
}

/* Runs t->fn on every rank; reports each rank's first failure and results that differ across
   ranks. Returns the number of ranks that failed. */
static inline int kt_team_run(kt_team *t) {
    static int seq;
    seq++;
    const char *tcp = getenv("KVPS_TEST_TEAM_TCP"); /* (tests/run.sh's [tcp] reruns: inproc teams on loopback TCP) */
    if (tcp && strcmp(tcp, "1") == 0) t->tcp = 1;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->nready = t->nfinished = t->counter = t->flag = 0;
    if (!t->tcp) {
        t->ctx = zmq_ctx_new();
        t->peers[0] = 0;
        for (int i = 0; i < t->k; i++)
            snprintf(t->peers + strlen(t->peers), sizeof t->peers - strlen(t->peers), "%sinproc://kt-ring-%d-%d",
                     i ? "," : "", seq, i);
    }
    pthread_t th[KT_MAXR];
    for (int i = 0; i < t->k; i++) {
        memset(&t->ranks[i], 0, sizeof t->ranks[i]);
        t->ranks[i].t = t;
        t->ranks[i].rank = i;
        t->ranks[i].k = t->k;
        pthread_create(&th[i], NULL, kt_team_thread, &t->ranks[i]);
    }
    for (int i = 0; i < t->k; i++) pthread_join(th[i], NULL);
    int failed = 0;
    for (int i = 0; i < t->k; i++) {
        kt_rk *x = &t->ranks[i];
        if (x->fails) failed++;
        KT_CHECK(x->fails == 0, "%s k=%d rank %d: %d failures; first: %s", t->label, t->k, i, x->fails, x->why);
    }
    if (!failed)
        for (int i = 1; i < t->k; i++) {
            kt_rk *a = &t->ranks[0], *b = &t->ranks[i];
            size_t n = a->nhash < b->nhash ? a->nhash : b->nhash, bad = 0, first = 0;
            for (size_t j = 0; j < n; j++)
                if (a->hash[j] != b->hash[j] && bad++ == 0) first = j;
            KT_CHECK(a->nhash == b->nhash && bad == 0, "%s k=%d: rank %d's results differ from rank 0's in %zu of %zu "
                     "collectives (first: #%zu)", t->label, t->k, i, bad, n, first);
        }
    for (int i = 0; i < t->k; i++) free(t->ranks[i].hash);
    if (t->ctx) zmq_ctx_term(t->ctx);
    t->ctx = NULL;
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    return failed;
}

/* A team with timeout_ms (3 times that under KVPS_TEST_QUICK) and groups (NULL: none), run. */
static inline void kt_run_team(const char *label, void (*fn)(kt_rk *), int k, int tcp, int timeout_ms, const int *groups) {
    kt_team t;
    kt_team_init(&t, label, fn, k, tcp, kt_quick() ? 3 * timeout_ms : timeout_ms);
    t.base.groups = groups;
    kt_team_run(&t);
}

/* Ranks as processes on loopback TCP: a kvps server process for the rendezvous, then `size` rank
   processes; no process forks with a live ZeroMQ context. */
/* A rank that is to die writes to kt_die_pipe and waits for the parent's SIGKILL (a death from
   outside: no exit path runs, no leak report from valgrind). */
static int kt_die_pipe[2] = {-1, -1};

static inline void kt_die_now(void) {
    if (write(kt_die_pipe[1], "x", 1) < 0) _exit(4);
    for (;;) pause();
}

/* Called by every rank of ring r after a collective: returns on rank `who` once every other
   rank has said, by a send on a tag of its own, that it is past that collective (the others
   return at once: their sends are eager). Before a rank dies: a SIGKILL can beat ZeroMQ's I/O
   thread to the wire, and without this the collective's last pieces from the dying rank may
   never leave it, so that a peer fails in the collective, not after it. Returns 0 when a call
   failed (recorded on x). */
static inline int kt_all_past(kt_rk *x, kvps_ring *r, int who) {
    int64_t past = 1;
    int me = kvps_ring_rank(r), n = kvps_ring_size(r);
    if (me != who) return kt_rk_call(x, kvps_ring_send(r, &past, 1, KVPS_INT64, who, 0x7ffffff0u), "past (send)");
    for (int j = 0; j < n; j++)
        if (j != me && !kt_rk_call(x, kvps_ring_recv(r, &past, 1, KVPS_INT64, j, 0x7ffffff0u), "past (recv)")) return 0;
    return 1;
}

#ifdef KVPS_H /* the rank processes meet through a kvps server */
/* A rank process: worker for the rendezvous, ring on an ephemeral port, then `fn`. */
typedef struct kt_proc_cfg {
    const char *server;
    int size, timeout_ms;
    void (*fn)(kt_rk *);
} kt_proc_cfg;

/* 1: each rank process is a host of its own to the ring (KVPS_RING_HOST_ID): no shared memory,
   no process to look at, only connections and heartbeats tell a peer's death. */
static int kt_proc_hosts_apart;

static inline int kt_proc_rank(const kt_proc_cfg *c, int rank) {
    if (kt_proc_hosts_apart) {
        char id[32];
        snprintf(id, sizeof id, "kt-host-%d", rank);
        setenv("KVPS_RING_HOST_ID", id, 1);
    }
    kt_team t;
    memset(&t, 0, sizeof t);
    t.label = "process";
    t.k = c->size;
    kt_rk *x = &t.ranks[0];
    x->t = &t;
    x->rank = rank;
    x->k = c->size;
    kvps_worker *w = NULL;
    char peers[KT_MAXR * 64];
    kvps_result rc = kvps_ring_create(&(kvps_ring_desc){.rank = rank, .size = c->size, .bind = "tcp://127.0.0.1:*",
                                                        .timeout_ms = c->timeout_ms}, &x->r);
    if (rc == KVPS_OK)
        rc = kvps_worker_create(&(kvps_worker_desc){.servers = c->server, .rank = rank, .num_workers = c->size,
                                                    .timeout_ms = 20000}, &w);
    if (rc == KVPS_OK) rc = kvps_ring_rendezvous(w, rank, c->size, kvps_ring_endpoint(x->r), peers, sizeof peers, 20000);
    if (rc == KVPS_OK) {
        /* every rank sees the same list, with its own endpoint at its index */
        char **eps = NULL;
        int n = kvps__split(peers, &eps);
        if (n != c->size || strcmp(eps[rank], kvps_ring_endpoint(x->r)) != 0)
            kt_rk_fail(x, "rendezvous gave '%s' (rank %d is %s)", peers, rank, kvps_ring_endpoint(x->r));
        kvps__free_strv(eps, n > 0 ? n : 0);
        rc = kvps_ring_connect(x->r, peers);
    }
    kvps_worker_destroy(&w);
    if (rc != KVPS_OK) kt_rk_fail(x, "setup: %s", kvps_result_str(rc));
    else c->fn(x);
    kvps_ring_destroy(&x->r);
    free(x->hash);
    if (x->fails) printf("  process rank %d of %d: %d failures; first: %s\n", rank, c->size, x->fails, x->why);
    fflush(stdout);
    return x->fails ? 1 : 0;
}

/* The signal kt_run_procs sends the rank that asks to die (0: SIGKILL). Another (SIGSTOP) leaves
   it in that state until the others have exited, then it is killed. */
static int kt_die_signal;

/* Runs fn on `size` rank processes (kt_proc_rank) that meet through a server process; each must
   exit 0 within limit_s seconds (4 times that under KVPS_TEST_QUICK). expect_dead: the rank that
   asks to be killed (through kt_die_pipe), or -1. */
static inline void kt_run_procs(int size, void (*fn)(kt_rk *), int timeout_ms, int limit_s, int expect_dead) {
    char ep[256];
    pid_t srv = kt_server_proc(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = size}, ep, sizeof ep);
    KT_CHECK(srv > 0 && ep[0], "server did not start");
    if (srv <= 0 || !ep[0]) { kt_server_proc_stop(srv); return; }
    kt_proc_cfg c = {ep, size, timeout_ms, fn};
    pid_t pid[KT_MAXR];
    fflush(stdout);
    for (int r = 0; r < size; r++) {
        pid[r] = fork();
        if (pid[r] == 0) exit(kt_proc_rank(&c, r));
    }
    int64_t deadline = kvps__now_ms() + (int64_t)limit_s * 1000 * (kt_quick() ? 4 : 1);
    if (expect_dead >= 0) {
        struct pollfd pf = {kt_die_pipe[0], POLLIN, 0};
        char byte;
        int asked = poll(&pf, 1, limit_s * 1000) == 1 && read(kt_die_pipe[0], &byte, 1) == 1;
        KT_CHECK(asked, "size %d: rank %d never got to the point where it dies", size, expect_dead);
        kill(pid[expect_dead], kt_die_signal ? kt_die_signal : SIGKILL);
    }
    for (int r = 0; r < size; r++) {
        if (r == expect_dead && kt_die_signal && kt_die_signal != SIGKILL) continue; /* (stopped: killed below) */
        int st = kt_wait_pid(pid[r], deadline);
        KT_CHECK(st != -1, "size %d: rank process %d still running after %d s: killed", size, r, limit_s);
        if (r != expect_dead)
            KT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "size %d: rank process %d status %d", size, r, st);
    }
    if (expect_dead >= 0 && kt_die_signal && kt_die_signal != SIGKILL) {
        kill(pid[expect_dead], SIGKILL);
        waitpid(pid[expect_dead], NULL, 0);
    }
    kt_server_proc_stop(srv);
}

/* Runs fn in a child process within limit_s seconds (twice that under KVPS_TEST_QUICK): a hang
   or a crash is reported as a failure of the current test, and the parent goes on. */
static inline void kt_isolated(void (*fn)(void), int limit_s) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        kt_cur_failed = 0;
        fn();
        fflush(stdout);
        exit(kt_cur_failed ? 1 : 0);
    }
    int st = kt_wait_pid(pid, kvps__now_ms() + (int64_t)limit_s * 1000 * (kt_quick() ? 2 : 1));
    KT_CHECK(st != -1, "still running after %d s: killed (a hang)", limit_s * (kt_quick() ? 2 : 1));
    if (st != -1) KT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d (failures above)", st);
}

#endif /* KVPS_H */
#endif /* KVPS_RING_H */
#endif /* KVPS_TEST_H */
