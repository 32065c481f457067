/* test_ring_close - rings close as cleanly as they run: every rank calls kvps_ring_destroy the
   moment its last collective returns, as a program that then exits does, while a slower peer
   may still be waiting for that rank's last pieces. The last call's result must be exact on
   every rank (a sender that leaves first loses nothing it sent), and every destroy must return
   well before the 5 s a lingering socket would hold it (nothing stays unsent, nothing hangs).
   Ranks are processes on loopback TCP (kt_run_procs), 2, 3 and 4 of them; the last call is each
   collective whose senders can finish first (broadcast root, gather non-roots, reduce leaves),
   and all-reduces small and large, with and without a slow rank, with and without a collective
   before it (a ring whose connections are still being made). */
#define KVPS_IMPLEMENTATION
#include "kvps.h" /* kt_run_procs: the ranks meet through a kvps server */
#include "kvps_ring.h"
#include "tests/kvps_test.h"

/* A destroy that takes this long waited for its linger: a piece was stuck (a hang check). */
enum { DESTROY_LIMIT_MS = 4000, SLOW_MS = 300 };

typedef struct close_case {
    const char *name;
    kvps_coll coll;
    size_t count;  /* int32 per rank (per block for gather / alltoall) */
    int root;      /* -1: the last rank */
    int slow;      /* the rank that comes SLOW_MS late to the last call; -1: none, -2: the last rank */
    int cold;      /* 1: the last call is the ring's first (its connections may still be coming up) */
} close_case;

static const close_case CASES[] = {
    {"allreduce 64 (recursive doubling)", KVPS_COLL_ALLREDUCE, 64, 0, -1, 0},
    {"allreduce 64, slow rank 0", KVPS_COLL_ALLREDUCE, 64, 0, 0, 0},
    {"allreduce 1M (ring, zero-copy pieces), slow last rank", KVPS_COLL_ALLREDUCE, 1 << 20, 0, -2, 0},
    {"allreduce 1M, first call", KVPS_COLL_ALLREDUCE, 1 << 20, 0, -1, 1},
    {"broadcast 1M from 0, slow last rank", KVPS_COLL_BROADCAST, 1 << 20, 0, -2, 0},
    {"broadcast 100 from 0, first call, slow last rank", KVPS_COLL_BROADCAST, 100, 0, -2, 1},
    {"gather 1000 to the slow last rank", KVPS_COLL_GATHER, 1000, -1, -2, 0},
    {"reduce 256K to the slow rank 0", KVPS_COLL_REDUCE, 1 << 18, 0, 0, 0},
    {"alltoall 1000, slow rank 1", KVPS_COLL_ALLTOALL, 1000, 0, 1, 0},
};
static const close_case *g_case;

/* Rank r's input element i: small integers, so every sum is exact. */
static int32_t in_val(int r, size_t i) { return (int32_t)((r + 1) * 1000 + (int)(i % 997)); }
static int32_t in_sum(int k, size_t i) {
    int32_t s = 0;
    for (int r = 0; r < k; r++) s += in_val(r, i);
    return s;
}

/* The first element of recv that is wrong after the case's collective, or -1. */
static long first_wrong(const close_case *c, int k, int me, int root, const int32_t *recv) {
    size_t n = c->count;
    switch (c->coll) {
    case KVPS_COLL_ALLREDUCE:
        for (size_t i = 0; i < n; i++) if (recv[i] != in_sum(k, i)) return (long)i;
        return -1;
    case KVPS_COLL_REDUCE:
        for (size_t i = 0; me == root && i < n; i++) if (recv[i] != in_sum(k, i)) return (long)i;
        return -1;
    case KVPS_COLL_BROADCAST:
        for (size_t i = 0; i < n; i++) if (recv[i] != in_val(root, i)) return (long)i;
        return -1;
    case KVPS_COLL_GATHER:
        for (size_t i = 0; me == root && i < n * (size_t)k; i++) if (recv[i] != in_val((int)(i / n), i % n)) return (long)i;
        return -1;
    case KVPS_COLL_ALLTOALL: /* block me of rank j lands as block j here */
        for (size_t i = 0; i < n * (size_t)k; i++) if (recv[i] != in_val((int)(i / n), (size_t)me * n + i % n)) return (long)i;
        return -1;
    default:
        return 0;
    }
}

static void close_main(kt_rk *x) {
    const close_case *c = g_case;
    int k = x->k, me = x->rank, root = c->root < 0 ? k - 1 : c->root, slow = c->slow == -2 ? k - 1 : c->slow;
    size_t total = c->count * (size_t)k;
    int32_t *send = (int32_t *)kt_xmalloc(total * sizeof *send), *recv = (int32_t *)kt_xmalloc(total * sizeof *recv);
    for (size_t i = 0; i < total; i++) { send[i] = in_val(me, i); recv[i] = -1; }
    if (!c->cold && !kt_rk_call(x, kvps_ring_barrier(x->r), "barrier")) { free(send); free(recv); return; }
    if (me == slow) kt_sleep_ms(SLOW_MS);
    kvps_ring_op op = {.coll = c->coll, .send = send, .recv = recv, .count = c->count, .dtype = KVPS_INT32,
                       .op = KVPS_SUM, .root = root};
    kvps_result rc = kvps_ring_run(x->r, &op);
    char err[520];
    snprintf(err, sizeof err, "%s", kvps_ring_last_error(x->r));
    int64_t t0 = kt_now_ms();
    kvps_ring_destroy(&x->r); /* at once, as a program that is done */
    int64_t destroy_ms = kt_now_ms() - t0;
    if (rc != KVPS_OK) kt_rk_fail(x, "%s: rank %d: %s [%s]", c->name, me, kvps_result_str(rc), err);
    long bad = rc == KVPS_OK ? first_wrong(c, k, me, root, recv) : -1;
    if (bad >= 0) kt_rk_fail(x, "%s: rank %d of %d: element %ld is %d", c->name, me, k, bad, (int)recv[bad]);
    if (destroy_ms > DESTROY_LIMIT_MS)
        kt_rk_fail(x, "%s: rank %d of %d: kvps_ring_destroy took %lld ms (a piece stuck until the linger ran out)",
                   c->name, me, k, (long long)destroy_ms);
    free(send);
    free(recv);
}

static void test_destroy_right_after_the_last_call(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
        for (int k = 2; k <= 4; k++) {
            g_case = &CASES[i];
            int before = kt_cur_failed;
            kt_cur_failed = 0;
            kt_run_procs(k, close_main, 20000, 60, -1);
            if (kt_cur_failed) printf("  (case '%s', %d ranks)\n", CASES[i].name, k);
            kt_cur_failed |= before;
        }
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    kvps_log_set_level(KVPS_LOG_ERROR);
    int64_t t0 = kt_now_ms();
    KT_RUN(test_destroy_right_after_the_last_call, 300);
    printf("  info: test_ring_close: %zu cases x 2-4 rank processes in %.1f s\n", sizeof CASES / sizeof CASES[0],
           (double)(kt_now_ms() - t0) / 1000.0);
    return kt_finish();
}
