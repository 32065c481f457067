/* test_ring_zc - zero-copy sends and in-place forms of kvps_ring.h's collectives, against the
   naive oracles of tests/kt_coll.h: messages of 32 KiB and more go out without a copy (nothing
   may write a buffer before its frames are let go), AVG's division on such pieces, in-place
   reduce_scatter and scatter with big blocks, and each in-place form the manual states (send
   NULL or send == recv), on its own so that a failure names the form. */
#define KVPS_IMPLEMENTATION
#include "kvps_ring.h"
#include "tests/kvps_test.h"
#include "tests/kt_coll.h"
#include <signal.h>

/* Messages of 32 KiB and more go out without a copy (ZeroMQ holds the caller's buffer until it
   has sent it; on inproc the receiver reads it in place): nothing may write a buffer before
   its frames are let go. */
static void zc_main(kt_rk *x) {
    int k = x->k;
    size_t big = 100003, mid = 20011;
    for (int place = 0; place < 3; place++) {
        t_allreduce(x, KVPS_FLOAT32, KVPS_SUM, big, KVPS_ALGO_AUTO, place);
        t_allreduce(x, KVPS_FLOAT32, KVPS_MAX, big, KVPS_ALGO_RING, place);
        t_allreduce(x, KVPS_FLOAT64, KVPS_SUM, big, KVPS_ALGO_BIRING, place);
        t_allreduce(x, KVPS_INT64, KVPS_PROD, mid, KVPS_ALGO_RD, place);
        t_allreduce(x, KVPS_FLOAT32, KVPS_SUM, big, KVPS_ALGO_RHD, place);
        t_allreduce(x, KVPS_INT32, KVPS_MIN, big, KVPS_ALGO_RHD, place);
        t_allreduce(x, KVPS_BFLOAT16, KVPS_SUM, big, KVPS_ALGO_AUTO, place);
        t_allreduce(x, KVPS_FLOAT16, KVPS_MIN, big, KVPS_ALGO_BIRING, place);
        t_allreduce(x, KVPS_FLOAT32, KVPS_AVG, big, KVPS_ALGO_AUTO, place);
        t_reduce(x, KVPS_FLOAT32, KVPS_SUM, big, k - 1, place);
        t_reduce(x, KVPS_INT32, KVPS_AVG, big, 0, place);
        t_reduce(x, KVPS_FLOAT16, KVPS_AVG, big, k / 2, place);
        t_reduce_scatter(x, KVPS_FLOAT32, KVPS_SUM, mid, place);
        t_reduce_scatter(x, KVPS_INT32, KVPS_AVG, mid, place);
        t_allgather(x, KVPS_FLOAT64, mid, place);
        t_allgather(x, KVPS_FLOAT32, mid, 3);
        t_broadcast(x, KVPS_FLOAT32, big, k / 2, place);
        t_gather(x, KVPS_INT32, mid, k - 1, place);
        t_gather(x, KVPS_INT32, mid, 0, 3);
        t_alltoall(x, KVPS_FLOAT32, mid, place);
        t_scatter(x, KVPS_FLOAT32, 16384, k - 1, place);
    }
}

static void test_zero_copy_sizes(void) {
    kt_run_team("zero-copy", zc_main, 2, 0, 20000, NULL);
    kt_run_team("zero-copy", zc_main, 3, 0, 20000, NULL);
    kt_run_team("zero-copy", zc_main, 4, 0, 20000, NULL); /* RHD's halving and doubling */
    if (!kt_quick()) kt_run_team("zero-copy-tcp", zc_main, 4, 1, 20000, NULL);
    if (!kt_quick()) kt_run_team("zero-copy", zc_main, 5, 0, 20000, NULL);
    if (!kt_quick()) kt_run_team("zero-copy-tcp", zc_main, 3, 1, 20000, NULL);
    /* HIER's reduce, leader ring and chain broadcast on big messages */
    if (!kt_quick()) kt_run_team("zero-copy-hier", zc_main, 6, 0, 20000, GROUPS8);
}

/* AVG divides the sum by the number of ranks once, also when the ring's last pieces went out
   without a copy: every dtype, ring, bidirectional ring, AUTO and HIER, inproc and TCP. */
static void avg_zc_main(kt_rk *x) {
    kvps_ring_algo algos[4] = {KVPS_ALGO_RING, KVPS_ALGO_BIRING, x->t->base.groups ? KVPS_ALGO_HIER : KVPS_ALGO_AUTO,
                               KVPS_ALGO_RHD};
    for (int dt = 0; dt < 6; dt++)
        for (int a = 0; a < 4; a++) t_allreduce(x, (kvps_dtype)dt, KVPS_AVG, 100003, algos[a], (dt + a) % 3);
}

static void test_avg_zero_copy(void) {
    kt_run_team("avg 100003 elements", avg_zc_main, 2, 0, 20000, NULL);
    if (!kt_quick()) kt_run_team("avg 100003 elements", avg_zc_main, 3, 0, 20000, NULL);
    if (!kt_quick()) kt_run_team("avg 100003 elements tcp", avg_zc_main, 3, 1, 20000, NULL);
    if (!kt_quick()) kt_run_team("avg 100003 elements hier", avg_zc_main, 4, 0, 20000, GROUPS8);
}

/* reduce_scatter in place (send NULL, everything in recv) with 80 KB blocks. */
static void rs_zc_main(kt_rk *x) {
    for (int rep = 0; rep < 3; rep++) t_reduce_scatter(x, KVPS_FLOAT32, KVPS_SUM, 20011, 2);
}

static void test_reduce_scatter_inplace_zero_copy(void) {
    for (int k = 2; k <= 4; k++) kt_run_team("reduce_scatter send NULL 20011 elements", rs_zc_main, k, 0, 20000, NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* In-place forms as the manual states them (section 2: "In place: send == NULL or send ==
   recv ... the data is already in recv"), each on its own so a failure names the form. */

/* reduce, every rank in place with send == NULL: a non-root's contribution is in its recv. */
static void inplace_reduce_main(kt_rk *x) {
    for (int root = 0; root < x->k; root++)
        for (int dt = 0; dt < 6; dt += 2) {
            if (x->dead) return;
            uint64_t seed = kt_rk_seed(x);
            size_t n = 13, es = kvps_dtype_size((kvps_dtype)dt);
            char what[96];
            snprintf(what, sizeof what, "reduce %s sum n=13 root=%d, send NULL on every rank", DT_NAME[dt], root);
            char *rb = (char *)kt_xmalloc(n * es);
            put_red((kvps_dtype)dt, KVPS_SUM, rb, n, seed, x->rank, 0);
            if (kt_rk_call(x, kvps_ring_reduce(x->r, NULL, rb, n, (kvps_dtype)dt, KVPS_SUM, root), what) && x->rank == root)
                check_red(x, what, (kvps_dtype)dt, KVPS_SUM, seed, rb, n, 0);
            free(rb);
        }
}

/* allgather with send == recv, the rank's block already at recv[rank * count]. */
static void inplace_allgather_main(kt_rk *x) {
    for (int dt = 0; dt < 6 && !x->dead; dt++) {
        uint64_t seed = kt_rk_seed(x);
        size_t n = 5, es = kvps_dtype_size((kvps_dtype)dt), bytes = n * es;
        char what[96];
        snprintf(what, sizeof what, "allgather %s n=5, send == recv", DT_NAME[dt]);
        char *rb = (char *)kt_xmalloc(bytes * (size_t)x->k);
        memset(rb, 0xEE, bytes * (size_t)x->k);
        put_raw((kvps_dtype)dt, rb + (size_t)x->rank * bytes, n, seed, x->rank, 0);
        if (kt_rk_call(x, kvps_ring_allgather(x->r, rb, rb, n, (kvps_dtype)dt), what))
            for (int i = 0; i < x->k; i++)
                if (check_raw(x, what, (kvps_dtype)dt, rb + (size_t)i * bytes, n, seed, i, 0)) break;
        free(rb);
    }
}

/* scatter with send == NULL on the root: all count * size elements in its recv, its own block
   lands in recv[0 .. count) (as reduce_scatter's in-place form). */
static void inplace_scatter_main(kt_rk *x) {
    for (int root = 0; root < x->k && !x->dead; root++) {
        uint64_t seed = kt_rk_seed(x);
        size_t n = 7, total = n * (size_t)x->k;
        char what[96];
        snprintf(what, sizeof what, "scatter i32 n=7 root=%d, send NULL on the root", root);
        int32_t *rb = (int32_t *)kt_xmalloc(total * sizeof *rb);
        memset(rb, 0xEE, total * sizeof *rb);
        if (x->rank == root) put_raw(KVPS_INT32, rb, total, seed, root, 0);
        if (kt_rk_call(x, kvps_ring_scatter(x->r, NULL, rb, n, KVPS_INT32, root), what))
            check_raw(x, what, KVPS_INT32, rb, n, seed, root, (size_t)x->rank * n);
        free(rb);
    }
}

/* scatter in place (send == recv) with blocks of 64 KiB: the root sends its blocks without a
   copy, then moves its own block to recv[0 .. count); the block it overwrites must already be
   on its way. Every root, several times. */
static void inplace_scatter_big_main(kt_rk *x) {
    for (int rep = 0; rep < 4; rep++)
        for (int root = 0; root < x->k; root++)
            t_scatter(x, KVPS_FLOAT32, 16384, root, 1);
}

static void run_inplace(const char *label, void (*fn)(kt_rk *), int k) { kt_run_team(label, fn, k, 0, 2000, NULL); }

static void test_inplace_reduce_nonroot_null(void) { run_inplace("reduce send NULL", inplace_reduce_main, 3); }
static void test_inplace_allgather_send_eq_recv(void) { run_inplace("allgather send == recv", inplace_allgather_main, 3); }
static void test_inplace_scatter_root_null(void) { run_inplace("scatter root send NULL", inplace_scatter_main, 3); }
static void test_inplace_scatter_zero_copy(void) {
    run_inplace("scatter in place 64 KiB blocks", inplace_scatter_big_main, 2);
    run_inplace("scatter in place 64 KiB blocks", inplace_scatter_big_main, 3);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    kvps_log_set_level(KVPS_LOG_ERROR);
    int64_t t0 = kvps__now_ms();
    KT_RUN(test_zero_copy_sizes, 120);
    KT_RUN(test_avg_zero_copy, 120);
    KT_RUN(test_reduce_scatter_inplace_zero_copy, 120);
    KT_RUN(test_inplace_reduce_nonroot_null, 60);
    KT_RUN(test_inplace_allgather_send_eq_recv, 60);
    KT_RUN(test_inplace_scatter_root_null, 60);
    KT_RUN(test_inplace_scatter_zero_copy, 60);
    printf("  info: test_ring_zc took %.1f s\n", (double)(kvps__now_ms() - t0) / 1000.0);
    return kt_finish();
}
