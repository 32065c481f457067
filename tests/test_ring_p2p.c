/* test_ring_p2p - kvps_ring.h's point-to-point calls (send, recv, isend, irecv; manual section
   7) for 1..8 ranks as threads (inproc, one ZeroMQ context; and tcp://127.0.0.1 ephemeral) and
   as processes (fork, tcp://127.0.0.1 ephemeral, meeting through a kvps server), every dtype.

   The oracle: every message's elements are gen_bits(seed of (sender, receiver, tag, number),
   sender, index) (kt_coll.h), so a receiver computes what it must hold, bit for bit, without the
   sender. Patterns: all pairs (self included), ping-pong, many messages on one tag (in order,
   blocking and posted receives waited for in reverse), tags received out of sending order, many
   posted then waited for (or tested), self-sends, count 0, a 16 MB message, p2p interleaved with
   all-reduces (posted and blocking) on the same ring. Failures, each in a child process with a
   time limit: a receive naming another count or dtype (both sides fail, both name both ranks,
   the tag and both counts and dtypes; eager and zero-copy sends, the sender's next call a p2p
   call or a collective), a peer killed with SIGKILL during a receive (a named error, in
   bounded time), bad arguments (named, the ring still usable). No test asserts a time. */
#define KVPS_IMPLEMENTATION
#include "kvps.h" /* kt_run_procs: the ranks meet through a kvps server */
#include "kvps_ring.h"
#include "tests/kvps_test.h"
#include "tests/kt_coll.h"
#include <signal.h>

/* ---- messages and their oracle --------------------------------------------------------------- */

static uint64_t msg_seed(int src, int dst, uint32_t tag, unsigned num) {
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(src + 1) ^ 0xbf58476d1ce4e5b9ull * (uint64_t)(dst + 1) ^
                 ((uint64_t)tag << 20) ^ ((uint64_t)num << 44);
    return kt_rng(&s);
}

/* A message from src to dst: n elements of dt. */
static void *msg_make(kvps_dtype dt, size_t n, int src, int dst, uint32_t tag, unsigned num) {
    void *b = kt_xmalloc(n * kvps_dtype_size(dt));
    put_raw(dt, b, n, msg_seed(src, dst, tag, num), src, 0);
    return b;
}

/* Is buf the message (src -> dst, tag, num)? A failure names it. */
static int msg_check(kt_rk *x, const char *what, kvps_dtype dt, const void *buf, size_t n, int src, uint32_t tag,
                     unsigned num) {
    return check_raw(x, what, dt, buf, n, msg_seed(src, x->rank, tag, num), src, 0) == 0;
}

static int p2p_call(kt_rk *x, kvps_result rc, const char *fmt, ...) {
    if (rc == KVPS_OK) return 1;
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kt_rk_call(x, rc, what);
}

static const size_t SIZES[] = {0, 1, 37, 1000, 20000}; /* 20000 x 8 B: over the eager limit */

/* ---- all pairs ------------------------------------------------------------------------------- */

/* Every rank posts a receive from every rank (itself too), sends to every rank with a blocking
   send (starting with its right neighbour), then waits for its receives; per dtype and size. */
static void all_pairs(kt_rk *x) {
    int k = x->k;
    for (int dt = 0; dt < KVPS_DTYPE_COUNT && !x->dead; dt++)
        for (size_t si = 0; si < sizeof SIZES / sizeof *SIZES && !x->dead; si++) {
            size_t n = SIZES[si];
            uint32_t tag = (uint32_t)(dt * 16 + si);
            void *in[KT_MAXR], *out[KT_MAXR];
            kvps_ring_req q[KT_MAXR];
            for (int j = 0; j < k; j++) {
                in[j] = kt_xmalloc(n * kvps_dtype_size((kvps_dtype)dt));
                out[j] = msg_make((kvps_dtype)dt, n, x->rank, j, tag, 0);
                if (x->dead) continue;
                p2p_call(x, kvps_ring_irecv(x->r, in[j], n, (kvps_dtype)dt, j, tag, &q[j]), "irecv from %d", j);
            }
            for (int s = 1; s <= k && !x->dead; s++) {
                int j = (x->rank + s) % k;
                p2p_call(x, kvps_ring_send(x->r, out[j], n, (kvps_dtype)dt, j, tag), "send %s n=%zu to %d", DT_NAME[dt], n, j);
            }
            for (int j = 0; j < k && !x->dead; j++) {
                char what[96];
                snprintf(what, sizeof what, "all pairs %s n=%zu from %d", DT_NAME[dt], n, j);
                if (p2p_call(x, kvps_ring_wait(x->r, q[j], -1), "%s", what)) msg_check(x, what, (kvps_dtype)dt, in[j], n, j, tag, 0);
            }
            for (int j = 0; j < k; j++) { free(in[j]); free(out[j]); }
        }
}

static void test_all_pairs_threads(void) {
    for (int k = 1; k <= 8; k++) kt_run_team("all pairs inproc", all_pairs, k, 0, 20000, NULL);
    for (int k = 2; k <= 4; k++) kt_run_team("all pairs tcp", all_pairs, k, 1, 20000, NULL);
}

static void test_all_pairs_processes(void) {
    int sizes[] = {2, 3, 5};
    for (int i = 0; i < (kt_quick() ? 2 : 3); i++) kt_run_procs(sizes[i], all_pairs, 20000, 120, -1);
}

/* ---- ping-pong, order, tags, many posted ------------------------------------------------------- */

/* Rank 0 and the last rank bounce a message, each round a new one (the number), sizes up to
   over the eager limit; the ranks between watch (a ring's other ranks must not matter). */
static void ping_pong(kt_rk *x) {
    int a = 0, b = x->k - 1;
    if (x->rank != a && x->rank != b) return;
    static const size_t n[] = {1, 8, 200, 4096, 40000};
    for (unsigned round = 0; round < 60 && !x->dead; round++) {
        size_t c = n[round % 5];
        kvps_dtype dt = (kvps_dtype)(round % KVPS_DTYPE_COUNT);
        int me_first = (round & 1) ? x->rank == b : x->rank == a, other = x->rank == a ? b : a;
        void *buf = kt_xmalloc(c * kvps_dtype_size(dt));
        char what[64];
        snprintf(what, sizeof what, "ping-pong round %u", round);
        if (me_first) {
            void *m = msg_make(dt, c, x->rank, other, 3, round);
            if (p2p_call(x, kvps_ring_send(x->r, m, c, dt, other, 3), "%s send", what) &&
                p2p_call(x, kvps_ring_recv(x->r, buf, c, dt, other, 4), "%s recv", what))
                msg_check(x, what, dt, buf, c, other, 4, round);
            free(m);
        } else if (p2p_call(x, kvps_ring_recv(x->r, buf, c, dt, other, 3), "%s recv", what) &&
                   msg_check(x, what, dt, buf, c, other, 3, round)) {
            void *m = msg_make(dt, c, x->rank, other, 4, round);
            p2p_call(x, kvps_ring_send(x->r, m, c, dt, other, 4), "%s send", what);
            free(m);
        }
        free(buf);
    }
}

static void test_ping_pong(void) {
    for (int k = 2; k <= 4; k++) kt_run_team("ping-pong inproc", ping_pong, k, 0, 20000, NULL);
    kt_run_team("ping-pong tcp", ping_pong, 2, 1, 20000, NULL);
    kt_run_procs(2, ping_pong, 20000, 120, -1);
}

/* Rank 0 sends NMSG messages on one tag to rank 1 (sizes cycling over the eager limit, the big
   ones with isend so that rank 0 never waits for rank 1's answer in between); rank 1 receives
   the first half one by one, then posts receives for the second half and waits for them in
   reverse: receive i must hold message i (the receives match in the order posted). */
enum { NMSG = 80 };
static void in_order(kt_rk *x) {
    if (x->rank > 1 || x->k < 2) return;
    size_t sz[NMSG];
    for (int i = 0; i < NMSG; i++) sz[i] = (size_t)(i % 7 == 3 ? 12000 : 1 + (i * 37) % 300);
    kvps_dtype dt = KVPS_INT64;
    if (x->rank == 0) {
        void *m[NMSG];
        kvps_ring_req q[NMSG];
        for (int i = 0; i < NMSG; i++) m[i] = msg_make(dt, sz[i], 0, 1, 5, (unsigned)i);
        for (int i = 0; i < NMSG && !x->dead; i++) {
            p2p_call(x, kvps_ring_isend(x->r, m[i], sz[i], dt, 1, 5, &q[i]), "isend #%d", i);
        }
        for (int i = 0; i < NMSG && !x->dead; i++) p2p_call(x, kvps_ring_wait(x->r, q[i], -1), "wait isend #%d", i);
        for (int i = 0; i < NMSG; i++) free(m[i]);
        return;
    }
    void *b[NMSG];
    kvps_ring_req q[NMSG];
    for (int i = 0; i < NMSG; i++) b[i] = kt_xmalloc(sz[i] * 8);
    for (int i = 0; i < NMSG / 2 && !x->dead; i++)
        if (p2p_call(x, kvps_ring_recv(x->r, b[i], sz[i], dt, 0, 5), "recv #%d", i)) {
            char what[48];
            snprintf(what, sizeof what, "in order, message #%d", i);
            msg_check(x, what, dt, b[i], sz[i], 0, 5, (unsigned)i);
        }
    for (int i = NMSG / 2; i < NMSG && !x->dead; i++)
        p2p_call(x, kvps_ring_irecv(x->r, b[i], sz[i], dt, 0, 5, &q[i]), "irecv #%d", i);
    for (int i = NMSG - 1; i >= NMSG / 2 && !x->dead; i--)
        if (p2p_call(x, kvps_ring_wait(x->r, q[i], -1), "wait irecv #%d", i)) {
            char what[48];
            snprintf(what, sizeof what, "in order, posted receive #%d", i);
            msg_check(x, what, dt, b[i], sz[i], 0, 5, (unsigned)i);
        }
    for (int i = 0; i < NMSG; i++) free(b[i]);
}

static void test_in_order_one_tag(void) {
    kt_run_team("in order inproc", in_order, 2, 0, 20000, NULL);
    kt_run_team("in order tcp", in_order, 3, 1, 20000, NULL);
    kt_run_procs(2, in_order, 20000, 120, -1);
}

/* Every rank sends to its right neighbour on tags 1, 2, 3 (in that order; small and large), and
   receives from its left on 3, then 1, then 2. */
static void tags_out_of_order(kt_rk *x) {
    int right = (x->rank + 1) % x->k, left = (x->rank - 1 + x->k) % x->k;
    static const size_t n[4] = {0, 100, 30000, 7};
    kvps_ring_req q[4];
    void *m[4];
    for (uint32_t t = 1; t <= 3; t++) {
        m[t] = msg_make(KVPS_FLOAT32, n[t], x->rank, right, t, 0);
        if (!x->dead) p2p_call(x, kvps_ring_isend(x->r, m[t], n[t], KVPS_FLOAT32, right, t, &q[t]), "isend tag %u", t);
    }
    static const uint32_t order[3] = {3, 1, 2};
    for (int i = 0; i < 3 && !x->dead; i++) {
        uint32_t t = order[i];
        float *b = (float *)kt_xmalloc(n[t] * 4);
        if (p2p_call(x, kvps_ring_recv(x->r, b, n[t], KVPS_FLOAT32, left, t), "recv tag %u", t)) {
            char what[48];
            snprintf(what, sizeof what, "tag %u received %d-th", t, i + 1);
            msg_check(x, what, KVPS_FLOAT32, b, n[t], left, t, 0);
        }
        free(b);
    }
    for (uint32_t t = 1; t <= 3 && !x->dead; t++) p2p_call(x, kvps_ring_wait(x->r, q[t], -1), "wait isend tag %u", t);
    for (uint32_t t = 1; t <= 3; t++) free(m[t]);
}

static void test_tags_out_of_order(void) {
    for (int k = 1; k <= 5; k++) kt_run_team("tags inproc", tags_out_of_order, k, 0, 20000, NULL);
    kt_run_team("tags tcp", tags_out_of_order, 3, 1, 20000, NULL);
    kt_run_procs(3, tags_out_of_order, 20000, 120, -1);
}

/* Many posted: every rank posts NPOST receives from each neighbour and NPOST sends to each
   (tags per message, bfloat16 and float64, eager and zero-copy sizes), then completes them in a
   shuffled order, half by wait and half by polling kvps_ring_test. */
enum { NPOST = 24 };
static void many_posted(kt_rk *x) {
    int k = x->k, right = (x->rank + 1) % k, left = (x->rank - 1 + k) % k;
    int nreq = 4 * NPOST, idx[4 * NPOST];
    kvps_ring_req q[4 * NPOST];
    void *buf[4 * NPOST];
    size_t cnt[4 * NPOST];
    kvps_dtype dts[4 * NPOST];
    for (int i = 0; i < nreq; i++) {
        int m = i / 4, kind = i % 4; /* 0 recv from left, 1 recv from right, 2 send right, 3 send left */
        int peer = kind == 0 || kind == 3 ? left : right;
        uint32_t tag = (uint32_t)(m * 4 + (kind == 0 || kind == 2 ? 0 : 1));
        cnt[i] = m % 5 == 4 ? 50000 : (size_t)(m * 13 % 200);
        dts[i] = m & 1 ? KVPS_FLOAT64 : KVPS_BFLOAT16;
        if (kind >= 2) buf[i] = msg_make(dts[i], cnt[i], x->rank, peer, tag, 1);
        else buf[i] = kt_xmalloc(cnt[i] * kvps_dtype_size(dts[i]));
        idx[i] = i;
        if (x->dead) continue;
        if (kind >= 2) p2p_call(x, kvps_ring_isend(x->r, buf[i], cnt[i], dts[i], peer, tag, &q[i]), "isend %d", i);
        else p2p_call(x, kvps_ring_irecv(x->r, buf[i], cnt[i], dts[i], peer, tag, &q[i]), "irecv %d", i);
    }
    uint64_t s = 77 + (uint64_t)x->rank;
    for (int i = nreq - 1; i > 0; i--) { int j = (int)(kt_rng(&s) % (uint64_t)(i + 1)); int t = idx[i]; idx[i] = idx[j]; idx[j] = t; }
    for (int n = 0; n < nreq && !x->dead; n++) {
        int i = idx[n], m = i / 4, kind = i % 4;
        if (n & 1) {
            int done = 0;
            kvps_result rc = KVPS_OK;
            while (!done && rc == KVPS_OK) {
                rc = kvps_ring_test(x->r, q[i], &done);
                if (!done && rc == KVPS_OK) kt_sleep_ms(1);
            }
            if (!p2p_call(x, rc, "test %d", i)) break;
        } else if (!p2p_call(x, kvps_ring_wait(x->r, q[i], -1), "wait %d", i)) {
            break;
        }
        if (kind < 2) {
            int peer = kind == 0 ? left : right;
            uint32_t tag = (uint32_t)(m * 4 + (kind == 0 ? 0 : 1));
            char what[48];
            snprintf(what, sizeof what, "posted receive %d", i);
            msg_check(x, what, dts[i], buf[i], cnt[i], peer, tag, 1);
        }
    }
    for (int i = 0; i < nreq; i++) free(buf[i]);
    /* a request is gone once done */
    if (!x->dead && kvps_ring_wait(x->r, q[0], 0) != KVPS_ERR_INVALID_REQ)
        kt_rk_fail(x, "rank %d: waiting again on a finished request did not give KVPS_ERR_INVALID_REQ", x->rank);
}

static void test_many_posted(void) {
    for (int k = 1; k <= 8; k *= 2) kt_run_team("many posted inproc", many_posted, k, 0, 20000, NULL);
    kt_run_team("many posted tcp", many_posted, 3, 1, 20000, NULL);
    kt_run_procs(4, many_posted, 20000, 120, -1);
}

/* ---- self, count 0, large --------------------------------------------------------------------- */

static void self_and_zero(kt_rk *x) {
    for (int dt = 0; dt < KVPS_DTYPE_COUNT && !x->dead; dt++) {
        /* to itself, blocking, small and over the eager limit (never waits for an answer) */
        size_t n = dt == 1 ? 100000 : 33;
        void *m = msg_make((kvps_dtype)dt, n, x->rank, x->rank, 11, (unsigned)dt);
        void *b = kt_xmalloc(n * kvps_dtype_size((kvps_dtype)dt));
        if (p2p_call(x, kvps_ring_send(x->r, m, n, (kvps_dtype)dt, x->rank, 11), "self send") &&
            p2p_call(x, kvps_ring_recv(x->r, b, n, (kvps_dtype)dt, x->rank, 11), "self recv"))
            msg_check(x, "self", (kvps_dtype)dt, b, n, x->rank, 11, (unsigned)dt);
        free(m);
        free(b);
    }
    /* count 0 (NULL buffers) to the right, from the left, and to itself */
    int right = (x->rank + 1) % x->k, left = (x->rank - 1 + x->k) % x->k;
    kvps_ring_req q;
    if (!x->dead) p2p_call(x, kvps_ring_irecv(x->r, NULL, 0, KVPS_INT32, left, 0xFFFFFFFFu, &q), "irecv count 0");
    if (!x->dead) p2p_call(x, kvps_ring_send(x->r, NULL, 0, KVPS_INT32, right, 0xFFFFFFFFu), "send count 0");
    if (!x->dead) p2p_call(x, kvps_ring_wait(x->r, q, -1), "wait count 0");
    if (!x->dead) p2p_call(x, kvps_ring_send(x->r, NULL, 0, KVPS_FLOAT16, x->rank, 0), "self count 0");
    if (!x->dead) p2p_call(x, kvps_ring_recv(x->r, NULL, 0, KVPS_FLOAT16, x->rank, 0), "self recv count 0");
}

static void test_self_and_count_zero(void) {
    for (int k = 1; k <= 3; k++) kt_run_team("self inproc", self_and_zero, k, 0, 20000, NULL);
    kt_run_team("self tcp", self_and_zero, 2, 1, 20000, NULL);
}

/* 16 MB from rank 0 to the last rank (4 MB under KVPS_TEST_QUICK) and back, blocking. */
static void large(kt_rk *x) {
    size_t n = (kt_quick() ? 1u : 4u) << 20; /* float32 */
    int other = x->rank == 0 ? x->k - 1 : 0;
    if (x->rank != 0 && x->rank != x->k - 1) return;
    float *b = (float *)kt_xmalloc(n * 4), *m = (float *)msg_make(KVPS_FLOAT32, n, x->rank, other, 9, 0);
    memset(b, 0xEE, n * 4);
    if (x->rank == 0) {
        if (p2p_call(x, kvps_ring_send(x->r, m, n, KVPS_FLOAT32, other, 9), "large send") &&
            p2p_call(x, kvps_ring_recv(x->r, b, n, KVPS_FLOAT32, other, 9), "large recv"))
            msg_check(x, "16 MB back", KVPS_FLOAT32, b, n, other, 9, 0);
    } else if (p2p_call(x, kvps_ring_recv(x->r, b, n, KVPS_FLOAT32, other, 9), "large recv")) {
        msg_check(x, "16 MB", KVPS_FLOAT32, b, n, other, 9, 0);
        p2p_call(x, kvps_ring_send(x->r, m, n, KVPS_FLOAT32, other, 9), "large send");
    }
    free(b);
    free(m);
}

static void test_large(void) {
    kt_run_team("large inproc", large, 2, 0, 30000, NULL);
    kt_run_team("large tcp", large, 3, 1, 30000, NULL);
    kt_run_procs(2, large, 30000, 120, -1);
}

/* ---- with collectives on the same ring -------------------------------------------------------- */

/* The last rank sends to rank 0 only after a pause, while the others have begun an all-reduce
   (their pieces reach rank 0 during its receive: kept for the all-reduce); every rank sends to its
   right before the all-reduce and receives from its left after it (that message arrives during
   the all-reduce: kept for the receive); then a posted all-reduce, p2p calls behind it (which
   wait for it), and the same tags and numbers as the all-reduce's pieces. */
static void with_allreduce(kt_rk *x) {
    int k = x->k, right = (x->rank + 1) % k, left = (x->rank - 1 + k) % k;
    size_t n = 3000;
    for (int round = 0; round < 3 && !x->dead; round++) {
        uint32_t tag = (uint32_t)round;
        void *m = msg_make(KVPS_INT32, 500, x->rank, right, tag, 2), *in = kt_xmalloc(500 * 4);
        p2p_call(x, kvps_ring_send(x->r, m, 500, KVPS_INT32, right, tag), "send before allreduce");
        if (x->rank == k - 1 && k > 1) {
            kt_sleep_ms(20);
            void *z = msg_make(KVPS_FLOAT64, 10, x->rank, 0, 100 + tag, 2);
            p2p_call(x, kvps_ring_send(x->r, z, 10, KVPS_FLOAT64, 0, 100 + tag), "late send");
            free(z);
        }
        if (x->rank == 0 && k > 1 && !x->dead) {
            double z[10];
            if (p2p_call(x, kvps_ring_recv(x->r, z, 10, KVPS_FLOAT64, k - 1, 100 + tag), "recv during allreduce"))
                msg_check(x, "received while pieces came in", KVPS_FLOAT64, z, 10, k - 1, 100 + tag, 2);
        }
        t_allreduce(x, KVPS_FLOAT32, KVPS_SUM, n, round == 1 ? KVPS_ALGO_RING : KVPS_ALGO_AUTO, 0);
        if (!x->dead && p2p_call(x, kvps_ring_recv(x->r, in, 500, KVPS_INT32, left, tag), "recv after allreduce"))
            msg_check(x, "sent before the allreduce", KVPS_INT32, in, 500, left, tag, 2);
        free(m);
        free(in);
    }
    /* posted all-reduce, then p2p behind it */
    if (x->dead) return;
    uint64_t seed = kt_rk_seed(x);
    int32_t *a = (int32_t *)kt_xmalloc(n * 4);
    put_red(KVPS_INT32, KVPS_SUM, a, n, seed, x->rank, 0);
    kvps_ring_op o = {.coll = KVPS_COLL_ALLREDUCE, .recv = a, .count = n, .dtype = KVPS_INT32, .op = KVPS_SUM};
    kvps_ring_req qa, qs;
    void *m = msg_make(KVPS_INT32, 40000, x->rank, right, 1u << 31, 3), *in = kt_xmalloc(40000 * 4);
    if (p2p_call(x, kvps_ring_post(x->r, &o, &qa), "post allreduce") &&
        p2p_call(x, kvps_ring_isend(x->r, m, 40000, KVPS_INT32, right, 1u << 31, &qs), "isend behind a posted allreduce") &&
        p2p_call(x, kvps_ring_recv(x->r, in, 40000, KVPS_INT32, left, 1u << 31), "recv behind a posted allreduce") &&
        p2p_call(x, kvps_ring_wait(x->r, qs, -1), "wait isend") && p2p_call(x, kvps_ring_wait(x->r, qa, -1), "wait allreduce")) {
        msg_check(x, "behind a posted allreduce", KVPS_INT32, in, 40000, left, 1u << 31, 3);
        check_red(x, "posted allreduce", KVPS_INT32, KVPS_SUM, seed, a, n, 0);
    }
    free(a);
    free(m);
    free(in);
    if (!x->dead) t_allreduce(x, KVPS_FLOAT64, KVPS_MAX, 100, KVPS_ALGO_RD, 0);
}

static void test_with_allreduce(void) {
    for (int k = 1; k <= 8; k++) kt_run_team("with allreduce inproc", with_allreduce, k, 0, 20000, NULL);
    kt_run_team("with allreduce tcp", with_allreduce, 4, 1, 20000, NULL);
    kt_run_procs(3, with_allreduce, 20000, 120, -1);
}

/* ---- failures ----------------------------------------------------------------------------------- */

static int fail_timeout_ms(void) { return kt_quick() ? 2000 : 500; }

/* A mismatch: rank 0 sends count[0] of dt[0] on tag 7; rank 1 receives count[1] of dt[1]. */
typedef struct mm_case {
    const char *name;
    size_t count[2];
    kvps_dtype dt[2];
    int next; /* the sender's next call: 0 a recv, 1 a barrier (eager sends learn there) */
} mm_case;

static const mm_case MM[] = {
    {"size 50 vs 100 (eager)", {50, 100}, {KVPS_FLOAT32, KVPS_FLOAT32}, 0},
    {"dtype f32 vs i32 (eager)", {64, 64}, {KVPS_FLOAT32, KVPS_INT32}, 0},
    {"size, next call a barrier", {9, 8}, {KVPS_BFLOAT16, KVPS_BFLOAT16}, 1},
    {"size 100000 vs 100001 (zero-copy)", {100000, 100001}, {KVPS_FLOAT64, KVPS_FLOAT64}, 0},
    {"dtype f16 vs bf16 (zero-copy)", {70000, 70000}, {KVPS_FLOAT16, KVPS_BFLOAT16}, 1},
};

static void mm_main(kt_rk *x) {
    const mm_case *c = (const mm_case *)x->t->arg;
    if (x->rank > 1) return;
    int j = x->rank;
    void *b = calloc(c->count[j] ? c->count[j] : 1, kvps_dtype_size(c->dt[j]));
    int64_t t0 = kvps__now_ms();
    if (j == 0) {
        x->rc1 = kvps_ring_send(x->r, b, c->count[0], c->dt[0], 1, 7);
        if (x->rc1 == KVPS_OK) { /* eager: its next call learns it */
            int32_t z;
            x->rc2 = c->next ? kvps_ring_barrier(x->r) : kvps_ring_recv(x->r, &z, 1, KVPS_INT32, 1, 99);
        }
    } else {
        x->rc1 = kvps_ring_recv(x->r, b, c->count[1], c->dt[1], 0, 7);
    }
    x->ms1 = kvps__now_ms() - t0;
    snprintf(x->err1, sizeof x->err1, "%s", kvps_ring_last_error(x->r));
    if (kvps_ring_recv(x->r, b, 1, KVPS_INT32, 1 - j, 0) != KVPS_ERR_STATE)
        kt_rk_fail(x, "%s: rank %d: the call after the error did not give KVPS_ERR_STATE", c->name, j);
    free(b);
}

static const mm_case *g_mm;
static void mismatch_body(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    for (int k = 2; k <= 3; k++) {
        kt_team t;
        /* (a refusal is answered at once: no passing run waits for a timeout, so a long one
           costs nothing, and a receiver thread slow to start on a busy machine fails nothing) */
        kt_team_init(&t, g_mm->name, mm_main, k, k == 3, 10000);
        t.arg = g_mm;
        kt_team_run(&t);
        /* "rank 1: recv from rank 0 tag 7 expected 100 float32, rank 0 sent 50 float32" on both sides */
        char want[200];
        snprintf(want, sizeof want, "rank 1: recv from rank 0 tag 7 expected %zu %s, rank 0 sent %zu %s", g_mm->count[1],
                 kvps_dtype_name(g_mm->dt[1]), g_mm->count[0], kvps_dtype_name(g_mm->dt[0]));
        kt_rk *s = &t.ranks[0], *rcv = &t.ranks[1];
        kvps_result srv = s->rc1 == KVPS_OK ? s->rc2 : s->rc1;
        KT_CHECK(rcv->rc1 == KVPS_ERR_MISMATCH, "%s k=%d: the receiver got %s [%s]", g_mm->name, k, kvps_result_str(rcv->rc1), rcv->err1);
        KT_CHECK(strstr(rcv->err1, want), "%s k=%d: the receiver's message '%s' lacks '%s'", g_mm->name, k, rcv->err1, want);
        KT_CHECK(srv == KVPS_ERR_MISMATCH, "%s k=%d: the sender got %s, then %s [%s]", g_mm->name, k, kvps_result_str(s->rc1),
                 kvps_result_str(s->rc2), s->err1);
        KT_CHECK(strstr(s->err1, want) && strstr(s->err1, "rank 0: send to rank 1 tag 7"),
                 "%s k=%d: the sender's message '%s' lacks '%s'", g_mm->name, k, s->err1, want);
        /* a zero-copy send learns it in the send itself; an eager one at its next call */
        size_t bytes = g_mm->count[0] * kvps_dtype_size(g_mm->dt[0]);
        KT_CHECK((s->rc1 == KVPS_ERR_MISMATCH) == (bytes > KVPS_RING__P2P_EAGER_MAX), "%s k=%d: the send returned %s",
                 g_mm->name, k, kvps_result_str(s->rc1));
    }
}

static void test_mismatch_both_sides(void) {
    for (size_t i = 0; i < sizeof MM / sizeof *MM; i++) {
        g_mm = &MM[i];
        kt_isolated(mismatch_body, 30);
    }
}

/* A dead peer during a receive: the last rank of 3 processes is killed (SIGKILL) while rank 0
   waits in a blocking receive from it and rank 1 in a posted one; both end in a named error
   within a few timeouts (a hang check, not a speed check). */
static void dead_main(kt_rk *x) {
    int dead = x->k - 1;
    if (!kt_rk_call(x, kvps_ring_barrier(x->r), "barrier") || !kt_all_past(x, x->r, dead)) return;
    x->r->desc.timeout_ms = 4 * fail_timeout_ms(); /* (the receives below: a few of these at most) */
    if (x->rank == dead) { fflush(stdout); kt_die_now(); }
    float b[64];
    int64_t t0 = kvps__now_ms();
    kvps_result rc;
    if (x->rank == 0) {
        rc = kvps_ring_recv(x->r, b, 64, KVPS_FLOAT32, dead, 3);
    } else {
        kvps_ring_req q;
        rc = kvps_ring_irecv(x->r, b, 64, KVPS_FLOAT32, dead, 4, &q);
        if (rc == KVPS_OK) rc = kvps_ring_wait(x->r, q, -1);
    }
    int64_t ms = kvps__now_ms() - t0;
    const char *e = kvps_ring_last_error(x->r);
    char want[96];
    snprintf(want, sizeof want, "waiting for rank %d in recv of 64 float32 from rank %d tag %d", dead, dead, x->rank ? 4 : 3);
    char gone[64]; /* over shared memory the dead process is seen: PEER_LOST naming it */
    snprintf(gone, sizeof gone, "rank %d (process ", dead);
    if (rc != KVPS_ERR_TIMEOUT && rc != KVPS_ERR_PEER && !(rc == KVPS_ERR_PEER_LOST && strstr(e, gone)))
        kt_rk_fail(x, "rank %d: %s, want a timeout or the dead rank named [%s]", x->rank, kvps_result_str(rc), e);
    if (rc == KVPS_ERR_TIMEOUT && !strstr(e, want)) kt_rk_fail(x, "rank %d: '%s' lacks '%s'", x->rank, e, want);
    if (ms > 5 * (int64_t)x->r->desc.timeout_ms) kt_rk_fail(x, "rank %d: took %lld ms to fail", x->rank, (long long)ms);
    if (kvps_ring_send(x->r, b, 1, KVPS_FLOAT32, 0, 0) != KVPS_ERR_STATE) kt_rk_fail(x, "rank %d: ring not broken", x->rank);
}

static void test_dead_peer_during_recv(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    if (pipe(kt_die_pipe) != 0) { KT_CHECK(0, "pipe"); return; }
    /* (the barrier before the death must not time out on a busy machine, where the rank
       processes may start seconds apart; dead_main shortens the timeout for the receives after
       it, and kills its rank only once the others are past the barrier: kt_all_past) */
    kt_run_procs(3, dead_main, 10000, 60, 2);
    close(kt_die_pipe[0]);
    close(kt_die_pipe[1]);
    kvps_log_set_level(KVPS_LOG_ERROR);
}

/* A thread rank that destroys its ring (its peers' messages then go nowhere): the receive from it
   times out, named. */
static void gone_main(kt_rk *x) {
    kt_team *t = x->t;
    if (x->rank == 1) {
        kvps_ring_destroy(&x->r);
        __atomic_store_n(&t->flag, 1, __ATOMIC_SEQ_CST);
        return;
    }
    while (!__atomic_load_n(&t->flag, __ATOMIC_SEQ_CST)) kt_sleep_ms(1);
    int32_t b[3];
    kvps_result rc = kvps_ring_recv(x->r, b, 3, KVPS_INT32, 1, 12);
    if (rc != KVPS_ERR_TIMEOUT || !strstr(kvps_ring_last_error(x->r), "waiting for rank 1 in recv of 3 int32 from rank 1 tag 12"))
        kt_rk_fail(x, "rank %d: %s '%s'", x->rank, kvps_result_str(rc), kvps_ring_last_error(x->r));
}

static void gone_body(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    kt_run_team("gone", gone_main, 2, 0, fail_timeout_ms(), NULL);
}
static void test_gone_peer_thread(void) { kt_isolated(gone_body, 30); }

/* Bad arguments: KVPS_ERR_INVALID_ARG with a message, and the ring still works. */
static void bad_args(kt_rk *x) {
    float f[4] = {1, 2, 3, 4}, g[4];
    kvps_ring_req q;
    struct { kvps_result rc; const char *name, *word; } c[] = {
        {kvps_ring_send(x->r, f, 4, KVPS_FLOAT32, x->k, 1), "dst = size", "is not a rank"},
        {kvps_ring_send(x->r, f, 4, KVPS_FLOAT32, -1, 1), "dst -1", "is not a rank"},
        {kvps_ring_recv(x->r, g, 4, KVPS_FLOAT32, 99, 1), "src 99", "is not a rank"},
        {kvps_ring_send(x->r, NULL, 4, KVPS_FLOAT32, 0, 1), "NULL send buffer", "NULL"},
        {kvps_ring_irecv(x->r, NULL, 1, KVPS_INT64, 0, 1, &q), "NULL recv buffer", "NULL"},
        {kvps_ring_send(x->r, f, 4, (kvps_dtype)KVPS_DTYPE_COUNT, 0, 1), "dtype COUNT", "dtype"},
        {kvps_ring_recv(x->r, g, 4, (kvps_dtype)-1, 0, 1), "dtype -1", "dtype"},
        {kvps_ring_send(x->r, f, (size_t)1 << 62, KVPS_FLOAT32, 0, 1), "count 2^62", "too large"},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        if (c[i].rc != KVPS_ERR_INVALID_ARG) kt_rk_fail(x, "%s: %s", c[i].name, kvps_result_str(c[i].rc));
        /* (the message of the last one is the one kept; each is checked right after its call below) */
    }
    if (kvps_ring_send(x->r, f, 4, KVPS_FLOAT32, -3, 1) == KVPS_ERR_INVALID_ARG && !strstr(kvps_ring_last_error(x->r), "dst -3 is not a rank"))
        kt_rk_fail(x, "message: '%s'", kvps_ring_last_error(x->r));
    if (kvps_ring_recv(x->r, NULL, 2, KVPS_FLOAT32, 0, 1) == KVPS_ERR_INVALID_ARG && !strstr(kvps_ring_last_error(x->r), "buffer NULL with count 2"))
        kt_rk_fail(x, "message: '%s'", kvps_ring_last_error(x->r));
    if (kvps_ring_isend(x->r, f, 4, KVPS_FLOAT32, 0, 1, NULL) != KVPS_ERR_INVALID_ARG) kt_rk_fail(x, "isend with out NULL");
    if (kvps_ring_send(NULL, f, 4, KVPS_FLOAT32, 0, 1) != KVPS_ERR_INVALID_ARG) kt_rk_fail(x, "send on NULL ring");
    if (kvps_ring_wait(x->r, 987654321, 0) != KVPS_ERR_INVALID_REQ) kt_rk_fail(x, "wait on an unknown request");
    /* still usable */
    int right = (x->rank + 1) % x->k, left = (x->rank - 1 + x->k) % x->k;
    if (p2p_call(x, kvps_ring_isend(x->r, f, 4, KVPS_FLOAT32, right, 1, &q), "isend after bad args") &&
        p2p_call(x, kvps_ring_recv(x->r, g, 4, KVPS_FLOAT32, left, 1), "recv after bad args") &&
        p2p_call(x, kvps_ring_wait(x->r, q, -1), "wait after bad args") && memcmp(f, g, sizeof f) != 0)
        kt_rk_fail(x, "rank %d: wrong data after bad arguments", x->rank);
    t_allreduce(x, KVPS_INT64, KVPS_SUM, 10, KVPS_ALGO_AUTO, 0);
}

static void test_bad_arguments(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    kt_run_team("bad args", bad_args, 3, 0, 20000, NULL);
    kvps_log_set_level(KVPS_LOG_ERROR);
}

/* Untrusted p2p messages: from a raw DEALER, a payload that is not count elements, an unknown
   dtype, an unknown kind, a tag over 32 bits, and a message out of sequence are dropped (the
   last makes receives from that rank fail, named), never crash; a good one is taken. */
static void test_malformed_p2p(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    void *ctx = zmq_ctx_new();
    kvps_ring *r = NULL;
    void *sink = zmq_socket(ctx, ZMQ_ROUTER);
    zmq_bind(sink, "inproc://p2p-bad-1");
    KT_OK(kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 2, .peers = "inproc://p2p-bad-0,inproc://p2p-bad-1",
                                             .timeout_ms = 300, .zmq_ctx = ctx}, &r));
    void *d = kt_raw_dealer(ctx, "inproc://p2p-bad-0", 0, 0);
    struct { uint32_t seq; uint64_t tag; uint8_t dt, op; uint64_t count; size_t bytes; } m[] = {
        {1, 5, KVPS_FLOAT32, KVPS_RING__P2P_EAGER, 4, 15},       /* short payload */
        {1, 5, 9, KVPS_RING__P2P_EAGER, 4, 16},                  /* no such dtype */
        {1, 5, KVPS_FLOAT32, 77, 4, 16},                         /* no such kind */
        {1, (uint64_t)1 << 40, KVPS_FLOAT32, KVPS_RING__P2P_EAGER, 4, 16}, /* tag over 32 bits */
        {1, 5, KVPS_FLOAT32, KVPS_RING__P2P_EAGER, 4, 16},       /* good: #1 */
        {3, 6, KVPS_FLOAT32, KVPS_RING__P2P_EAGER, 4, 16},       /* #3 when #2 is due */
    };
    for (size_t i = 0; r && i < sizeof m / sizeof *m; i++) {
        kvps_ring__hdr h = kvps_ring__p2p_hdr(r, m[i].op, m[i].seq, 0, m[i].dt, m[i].count);
        h.src = 1;
        h.tag = m[i].tag;
        float v[4] = {1, 2, 3, 4};
        zmq_send(d, &h, sizeof h, ZMQ_SNDMORE);
        zmq_send(d, v, m[i].bytes, 0);
    }
    float got[4] = {0};
    if (r) {
        KT_OK(kvps_ring_recv(r, got, 4, KVPS_FLOAT32, 1, 5));
        KT_CHECK(got[3] == 4.0f, "the good message: %g", got[3]);
        kvps_result rc = kvps_ring_recv(r, got, 4, KVPS_FLOAT32, 1, 6);
        KT_CHECK(rc == KVPS_ERR_PEER && strstr(kvps_ring_last_error(r), "arrived when #2 was due"), "out of sequence: %s '%s'",
                 kvps_result_str(rc), kvps_ring_last_error(r));
    }
    zmq_close(d);
    kvps_ring_destroy(&r);
    zmq_close(sink);
    zmq_ctx_term(ctx);
    kvps_log_set_level(KVPS_LOG_ERROR);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    kvps_log_set_level(KVPS_LOG_ERROR);
    int64_t t0 = kvps__now_ms();
    KT_RUN(test_all_pairs_threads, 300);
    KT_RUN(test_all_pairs_processes, 300);
    KT_RUN(test_ping_pong, 120);
    KT_RUN(test_in_order_one_tag, 120);
    KT_RUN(test_tags_out_of_order, 120);
    KT_RUN(test_many_posted, 120);
    KT_RUN(test_self_and_count_zero, 60);
    KT_RUN(test_large, 120);
    KT_RUN(test_with_allreduce, 120);
    KT_RUN(test_mismatch_both_sides, 120);
    KT_RUN(test_dead_peer_during_recv, 120);
    KT_RUN(test_gone_peer_thread, 60);
    KT_RUN(test_bad_arguments, 60);
    KT_RUN(test_malformed_p2p, 60);
    printf("  info: test_ring_p2p took %.1f s\n", (double)(kvps__now_ms() - t0) / 1000.0);
    return kt_finish();
}
