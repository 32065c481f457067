/* kvps_test.h - the tests' tiny harness and cluster helpers (include after kvps.h, and
   kvps_ring.h where a test uses it, with KVPS_IMPLEMENTATION). Each test binary ends with
   "N passed, N failed[, N skipped]".

   What is here, in order:
     the runner       KT_CHECK, KT_OK, KT_SKIP, KT_RUN(test_fn[, limit_s]), kt_finish()
     the watchdog     kt_alarm: a hang fails the test instead of stalling the suite
     inputs           kt_rng, kt_randf (deterministic), kt_quick (KVPS_TEST_QUICK), kt_sleep_ms
     the wire         KT_HDR (a request header by designated initialisers), a raw DEALER,
                      kt_raw_meta, kt_raw_status
     optimizers       kt_optim_tick, kt_optim_apply: the server's update rules, one element
     servers          kt_cluster: n servers in background threads (inproc / ipc / tcp) */
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
#ifdef KVPS_IMPLEMENTATION
static inline void kt_raw_meta(unsigned char meta[KVPS__HDR + KVPS__KENT], int op, uint64_t key, uint64_t len) {
    kvps__hdr h = KT_HDR(.op = (uint8_t)op, .nkeys = 1, .req_id = 1);
    kvps__kent e = {key, len};
    memcpy(meta, &h, sizeof h);
    memcpy(meta + KVPS__HDR, &e, sizeof e);
}

/* Sends [meta][vals] from raw DEALER d and returns the status in the reply's header (its text
   frame, if any, read and dropped), or 0 when no reply came within timeout_ms. */
static inline int32_t kt_raw_status(void *d, const void *meta, size_t msz, const void *vals, size_t vsz, int timeout_ms) {
    zmq_send(d, meta, msz, ZMQ_SNDMORE);
    zmq_send(d, vals, vsz, 0);
    kvps__hdr rh;
    memset(&rh, 0, sizeof rh);
    zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) == 1) {
        zmq_recv(d, &rh, sizeof rh, 0);
        int more;
        size_t ml = sizeof more;
        zmq_getsockopt(d, ZMQ_RCVMORE, &more, &ml);
        char text[300];
        if (more) zmq_recv(d, text, sizeof text, 0);
    }
    return rh.status;
}
#endif

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

#endif /* KVPS_TEST_H */
