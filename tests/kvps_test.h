/* kvps_test.h - the tests' tiny harness and cluster helpers (include after kvps.h with
   KVPS_IMPLEMENTATION). Each test binary ends with "N passed, N failed". */
#ifndef KVPS_TEST_H
#define KVPS_TEST_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <stdarg.h>
#include <signal.h>
#include <unistd.h>
#include <zmq.h>

static int kt_pass, kt_fail, kt_skip, kt_cur_failed, kt_cur_skipped;
static const char *kt_cur;

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

static void kt_begin(const char *name) { kt_cur = name; kt_cur_failed = 0; kt_cur_skipped = 0; }
static void kt_end(void) {
    if (kt_cur_failed) kt_fail++;
    else if (kt_cur_skipped) kt_skip++;
    else { kt_pass++; printf("ok %s\n", kt_cur); }
    fflush(stdout);
}
#define KT_RUN(fn) do { kt_begin(#fn); fn(); kt_end(); } while (0)
static int kt_finish(void) {
    if (kt_skip) printf("%d passed, %d failed, %d skipped\n", kt_pass, kt_fail, kt_skip);
    else printf("%d passed, %d failed\n", kt_pass, kt_fail);
    fflush(stdout); /* before exit-time checkers (LeakSanitizer) can end the process */
    return kt_fail ? 1 : 0;
}
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
static inline void kt_raw_meta(unsigned char meta[KVPS__HDR + KVPS__KENT], int op, uint64_t key, uint64_t len) {
    kvps__hdr h = {KVPS__MAGIC, KVPS__VERSION, (uint8_t)op, 0, 0, 1, 1, 0, 0};
    kvps__kent e = {key, len};
    memcpy(meta, &h, sizeof h);
    memcpy(meta + KVPS__HDR, &e, sizeof e);
}

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
#endif
