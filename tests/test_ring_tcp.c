/* test_ring_tcp - the ring's own TCP connections (kvps_ring.h, section 10). The collective, p2p,
   sub-ring and fault suites run over them too (make test reruns a cross-section with
   KVPS_RING_SHM=0, "[tcp]"; make test-all every ring suite); this file checks what is particular
   to them:
     - the transport chosen: "tcp" to every peer of a tcp:// ring with shared memory off, "zmq"
       with .tcp = -1 or KVPS_RING_TCP=0, results exact either way;
     - strangers at a rank's data port: garbage, a wrong token, the right token for a rank that is
       connected already, a connection that closes at once, one that says nothing for the ring's
       timeout. Each is closed, with one warning naming its address (the stranger's own port) and
       why; nothing it sent is read (a well-formed frame after a refused preamble changes no
       result); the ring works on, all-reduces exact against the naive sum. */
#define KVPS_IMPLEMENTATION
#include "kvps_ring.h"
#include "tests/kvps_test.h"
#include <netinet/in.h>
#include <arpa/inet.h>

static int32_t val(int r, int i) { return (int32_t)((r + 1) * 100 + i % 89); }

/* An all-reduce of 1000 int32 checked against the naive sum; 0 when it failed (recorded). */
static int allreduce_ok(kt_rk *x, const char *what) {
    int32_t b[1000];
    for (int i = 0; i < 1000; i++) b[i] = val(x->rank, i);
    if (!kt_rk_call(x, kvps_ring_allreduce(x->r, b, b, 1000, KVPS_INT32, KVPS_SUM), what)) return 0;
    for (int i = 0; i < 1000; i++) {
        int32_t want = 0;
        for (int r = 0; r < x->k; r++) want += val(r, i);
        if (b[i] != want) { kt_rk_fail(x, "%s: element %d is %d, want %d", what, i, b[i], want); return 0; }
    }
    return 1;
}

/* ---- the transport chosen ----------------------------------------------------------------- */
static void transport_main(kt_rk *x) {
    const char *want = (const char *)x->t->arg;
    if (!allreduce_ok(x, "allreduce")) return;
    for (int j = 0; j < x->k; j++) {
        const char *got = kvps_ring_transport(x->r, j), *w = j == x->rank ? "self" : want;
        if (strcmp(got, w) != 0) kt_rk_fail(x, "rank %d reaches rank %d by %s, want %s", x->rank, j, got, w);
    }
}

static void test_transport(void) {
    for (int k = 2; k <= 4; k++) {
        kt_team t;
        kt_team_init(&t, "tcp, shm off", transport_main, k, 1, 10000);
        t.arg = "tcp";
        t.base.shm = -1;
        kt_team_run(&t);
        kt_team_init(&t, "tcp off", transport_main, k, 1, 10000);
        t.arg = "zmq";
        t.base.shm = -1;
        t.base.tcp = -1;
        kt_team_run(&t);
    }
    setenv("KVPS_RING_TCP", "0", 1);
    kt_team t;
    kt_team_init(&t, "KVPS_RING_TCP=0", transport_main, 3, 1, 10000);
    t.arg = "zmq";
    t.base.shm = -1;
    kt_team_run(&t);
    unsetenv("KVPS_RING_TCP");
}

/* ---- strangers ---------------------------------------------------------------------------- */
static char g_log[8192];
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static void grab_log(void *user, kvps_log_level lv, const char *msg) {
    (void)user; (void)lv;
    pthread_mutex_lock(&g_log_mu);
    if (strstr(msg, "data port")) snprintf(g_log + strlen(g_log), sizeof g_log - strlen(g_log), "%s\n", msg);
    pthread_mutex_unlock(&g_log_mu);
}

enum { S_GARBAGE, S_WRONG_TOKEN, S_TAKEN_RANK, S_CLOSES, S_SILENT, S_COUNT };
static const char *const S_NAME[] = {"garbage", "a wrong token", "the token of a rank connected already",
                                     "a connection closed at once", "a silent connection"};
static const char *const S_WHY[] = {"not a kvps ring connection", "a wrong token", "its rank is connected already",
                                    "it closed before it said who it is", "it said nothing for the ring's timeout"};

/* A frame as a peer writes it: an all-reduce piece claiming to be rank 1's, for the next
   collectives (if it were read, a result would be wrong or the ring would fail). */
static size_t forged_frame(unsigned char *b, uint32_t seq) {
    kvps_ring__hdr h;
    memset(&h, 0, sizeof h);
    h.magic = KVPS_RING__MAGIC;
    h.seq = seq;
    h.src = 1;
    h.coll = KVPS_COLL_ALLREDUCE;
    h.dtype = KVPS_INT32;
    h.count = 1000;
    uint64_t len = 4000;
    memcpy(b, &len, 8);
    memcpy(b + 8, &h, sizeof h);
    memset(b + 48, 0x7f, 4000);
    return 48 + 4000;
}

/* The stranger connects to rank 0's data port and does its thing; its own port returned in *port. */
static int stranger(kvps_ring *r, int kind, unsigned *port) {
    kvps_ring__fam *f = r->fam;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(f->tcp_port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) return -1;
    struct sockaddr_in me;
    socklen_t len = sizeof me;
    getsockname(fd, (struct sockaddr *)&me, &len);
    *port = ntohs(me.sin_port);
    static unsigned char b[32 + 48 + 4000];
    size_t n = 0;
    if (kind == S_GARBAGE) {
        memcpy(b, "GET / HTTP/1.1\r\nHost: kvps\r\n\r\n..", 32);
        n = 32;
    } else if (kind == S_WRONG_TOKEN || kind == S_TAKEN_RANK) {
        unsigned char tok[16];
        if (kind == S_TAKEN_RANK) memcpy(tok, f->tok + 16, 16); /* rank 1's true token: it is connected already */
        else { memcpy(tok, f->tok + 16, 16); tok[5] ^= 1; }
        kvps_ring__tcp_auth_make(b, 1, f->size, tok);
        n = 32 + forged_frame(b + 32, kvps_ring_rank(r) >= 0 ? r->seq + 1 : 0);
    }
    if (n && write(fd, b, n) < 0) { close(fd); return -1; }
    if (kind == S_CLOSES) { close(fd); return -2; }
    return fd;
}

/* Whether the stranger's connection was closed by the ring (0 s wait). */
static int closed_by_ring(int fd) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return 0;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

static void strangers_main(kt_rk *x) {
    if (!allreduce_ok(x, "first allreduce")) return;
    for (int kind = 0; kind < S_COUNT && !x->dead; kind++) {
        int fd = -1;
        unsigned port = 0;
        if (x->rank == 0) {
            pthread_mutex_lock(&g_log_mu);
            g_log[0] = 0;
            pthread_mutex_unlock(&g_log_mu);
            fd = stranger(x->r, kind, &port);
            if (fd == -1) kt_rk_fail(x, "%s: the stranger could not connect", S_NAME[kind]);
        }
        /* the ring at work until rank 0 has seen the stranger refused (rank 0 says when, in the
           all-reduce's max), at most about 3 s */
        int64_t end = kvps__now_ms() + 3000;
        for (int round = 0; !x->dead; round++) {
            if (!allreduce_ok(x, S_NAME[kind])) return;
            int32_t done = 0;
            if (x->rank == 0) {
                pthread_mutex_lock(&g_log_mu);
                done = strstr(g_log, S_WHY[kind]) != NULL && (fd < 0 || closed_by_ring(fd));
                pthread_mutex_unlock(&g_log_mu);
                done = done || kvps__now_ms() > end;
            }
            if (!kt_rk_call(x, kvps_ring_allreduce(x->r, &done, &done, 1, KVPS_INT32, KVPS_MAX), "done?")) return;
            if (done) break;
            kt_sleep_ms(2);
        }
        if (x->rank != 0) continue;
        char addr[64];
        snprintf(addr, sizeof addr, "from 127.0.0.1:%u: %s", port, S_WHY[kind]);
        pthread_mutex_lock(&g_log_mu);
        if (!strstr(g_log, addr)) kt_rk_fail(x, "%s: no warning '%s' (got: %s)", S_NAME[kind], addr, g_log);
        int warnings = 0;
        for (const char *w = g_log; (w = strstr(w, "refused a connection")); w++) warnings++;
        if (warnings != 1) kt_rk_fail(x, "%s: %d warnings, want one: %s", S_NAME[kind], warnings, g_log);
        pthread_mutex_unlock(&g_log_mu);
        if (fd >= 0 && !closed_by_ring(fd)) kt_rk_fail(x, "%s: its connection is still open", S_NAME[kind]);
        if (fd >= 0) close(fd);
    }
    allreduce_ok(x, "allreduce after the strangers");
    for (int j = 0; j < x->k; j++)
        if (j != x->rank && strcmp(kvps_ring_transport(x->r, j), "tcp") != 0)
            kt_rk_fail(x, "rank %d reaches rank %d by %s after the strangers", x->rank, j, kvps_ring_transport(x->r, j));
}

static void test_strangers_refused(void) {
    kvps_log_set_fn(grab_log, NULL);
    kt_team t;
    kt_team_init(&t, "strangers", strangers_main, 2, 1, 1000); /* (the silent one is cut after the 1 s timeout) */
    t.base.shm = -1;
    kt_team_run(&t);
    kvps_log_set_fn(NULL, NULL);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    int64_t t0 = kvps__now_ms();
    const char *off = getenv("KVPS_RING_TCP");
    if (off && strcmp(off, "0") == 0) { printf("skipped: KVPS_RING_TCP=0 turns off what this tests\n0 passed, 0 failed\n"); return 0; }
    KT_RUN(test_transport, 60);
    KT_RUN(test_strangers_refused, 60);
    printf("  info: test_ring_tcp took %.1f s\n", (double)(kvps__now_ms() - t0) / 1000.0);
    return kt_finish();
}
