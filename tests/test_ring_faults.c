/* test_ring_faults - kvps_ring.h when things go wrong: a dead rank (a thread that destroys its
   ring, a process killed with SIGKILL before or during an all-reduce) and mismatched calls
   (count, dtype, op, root, collective; same or other message paths, send-only ranks, zero-copy
   pieces, count 0) end in errors within the timeout, with a message (a timeout names the rank
   waited for and the collective, and so does the abort it sends), and the ring refuses the
   next call. Each scenario runs in a child process with a time limit, so a hang is reported as
   one. */
#define KVPS_IMPLEMENTATION
#include "kvps.h" /* kt_run_procs: the ranks meet through a kvps server */
#include "kvps_ring.h"
#include "tests/kvps_test.h"
#include "tests/kt_coll.h"
#include <signal.h>

/* ---------------------------------------------------------------------------------------- */
/* Failures: a dead rank, mismatched calls. Each runs in a child process with a time limit, so
   a hang is reported as one. */

/* The timeout of rings expected to fail (longer under valgrind, where a barrier between
   processes may take a second). */
static int fail_timeout_ms(void) { return kt_quick() ? 2000 : 500; }

/* An error, within 5 timeouts (a hang check, not a speed check), with a message, after which
   the ring is broken. */
static void check_failed_rank(kt_rk *x, const char *what, kvps_result rc, int64_t ms) {
    int timeout_ms = x->r->desc.timeout_ms;
    if (rc == KVPS_OK) { kt_rk_fail(x, "%s: rank %d returned KVPS_OK", what, x->rank); return; }
    if (ms > 5 * (int64_t)timeout_ms)
        kt_rk_fail(x, "%s: rank %d took %lld ms to fail (timeout %d)", what, x->rank, (long long)ms, timeout_ms);
    if (!kvps_ring_last_error(x->r)[0]) kt_rk_fail(x, "%s: rank %d: kvps_ring_last_error is empty", what, x->rank);
    kvps_result again = kvps_ring_barrier(x->r);
    if (again != KVPS_ERR_STATE) kt_rk_fail(x, "%s: rank %d: the next call after an error gave %s, want KVPS_ERR_STATE", what, x->rank, kvps_result_str(again));
}

static kvps_ring_algo g_algo; /* the all-reduce's algorithm in the dead-rank tests (AUTO unless set) */

/* An all-reduce of b on a ring whose peer is gone: KVPS_ERR_TIMEOUT or KVPS_ERR_PEER, in time; or,
   where the dead rank's process was on this host (it has its pid), KVPS_ERR_PEER_LOST naming it. */
static void allreduce_with_a_dead_peer(kt_rk *x, const char *what, float *b, size_t n) {
    int64_t t0 = kvps__now_ms();
    kvps_ring_op o = {.coll = KVPS_COLL_ALLREDUCE, .recv = b, .count = n, .dtype = KVPS_FLOAT32, .op = KVPS_SUM, .algo = g_algo};
    kvps_result rc = kvps_ring_run(x->r, &o);
    int64_t ms = kvps__now_ms() - t0;
    if (rc != KVPS_ERR_TIMEOUT && rc != KVPS_ERR_PEER && rc != KVPS_ERR_PEER_LOST)
        kt_rk_fail(x, "rank %d: %s, want KVPS_ERR_TIMEOUT, KVPS_ERR_PEER or KVPS_ERR_PEER_LOST", x->rank, kvps_result_str(rc));
    const char *le = kvps_ring_last_error(x->r); /* (shared memory: its process is gone; TCP: its connection ended) */
    if (rc == KVPS_ERR_PEER_LOST && (!strstr(le, " (process ") || !(strstr(le, "on this host) is gone") ||
                                                                   strstr(le, "its connection"))))
        kt_rk_fail(x, "%s: rank %d: PEER_LOST does not name the rank and its process: '%s'", what, x->rank, kvps_ring_last_error(x->r));
    /* a timeout names the rank waited for and the collective, by name ("rank 0: timed out after
       500 ms waiting for rank 2 in allreduce of 4096 float32 (sum, ..."), and so does the abort
       it sends the others ("rank 0 aborted the allreduce: KVPS_ERR_TIMEOUT: rank 0: timed out ...") */
    const char *e = kvps_ring_last_error(x->r), *at = strstr(e, "waiting for rank ");
    int waited = -1, timed_out = rc == KVPS_ERR_TIMEOUT || (rc == KVPS_ERR_PEER && strstr(e, "KVPS_ERR_TIMEOUT"));
    if (timed_out && (!at || sscanf(at, "waiting for rank %d", &waited) != 1 || waited < 0 || waited >= x->k ||
                      !strstr(at, " in allreduce of ")))
        kt_rk_fail(x, "%s: rank %d's timeout does not name the rank waited for and the collective: '%s'", what, x->rank, e);
    if (rc == KVPS_ERR_PEER && !strstr(e, "allreduce")) /* an abort, or "allreduce: send to rank 2: no connection ..." */
        kt_rk_fail(x, "%s: rank %d's message does not name the collective: '%s'", what, x->rank, e);
    check_failed_rank(x, what, rc, ms);
}

/* Thread ranks: the last rank destroys its ring after a barrier; the others all-reduce. */
static void dead_main(kt_rk *x) {
    kt_team *t = x->t;
    if (!kt_rk_call(x, kvps_ring_barrier(x->r), "barrier")) return;
    if (x->rank == x->k - 1) {
        kvps_ring_destroy(&x->r);
        __atomic_store_n(&t->flag, 1, __ATOMIC_SEQ_CST);
        return;
    }
    while (!__atomic_load_n(&t->flag, __ATOMIC_SEQ_CST)) kt_sleep_ms(1);
    float *b = (float *)kt_xmalloc(4096 * sizeof *b);
    for (int i = 0; i < 4096; i++) b[i] = (float)i;
    allreduce_with_a_dead_peer(x, "dead rank", b, 4096);
    free(b);
}

static void dead_threads_body(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    int sizes[2] = {3, 4};
    for (int i = 0; i < 2; i++) {
        kt_team t;
        kt_team_init(&t, "dead-thread", dead_main, sizes[i], 0, fail_timeout_ms());
        t.base.algo = i ? KVPS_ALGO_RING : KVPS_ALGO_AUTO;
        kt_team_run(&t);
    }
}

static void test_dead_rank_thread(void) { kt_isolated(dead_threads_body, 10); }

/* g_die_before: the dying rank dies before its all-reduce rather than during it. g_algo (above): the
   all-reduce's algorithm for every rank (AUTO; RING keeps 16 MB far from done 2 ms in; DIRECT,
   on one host, is faster: its rank dies as it starts, in a 64 MB all-reduce). */
static int g_die_before;

/* Process ranks: the last one is killed (SIGKILL, by the parent) before the all-reduce
   (g_die_before), or 2 ms after its posted all-reduce has started running (16 MB: far from
   done). The others must fail within 5 timeouts: with a timeout this short the all-reduce may
   time out on its own on a slow machine, which is also an error in time. */
static void dead_proc_main(kt_rk *x) {
    if (!kt_rk_call(x, kvps_ring_barrier(x->r), "barrier") || !kt_all_past(x, x->r, x->k - 1)) return;
    size_t n = (size_t)(g_algo == KVPS_ALGO_DIRECT ? 16 : 4) << 20; /* (64 MB: DIRECT is far from done as its rank dies) */
    float *b = (float *)kt_xmalloc(n * sizeof *b);
    for (size_t i = 0; i < n; i++) b[i] = 1.0f;
    if (x->rank == x->k - 1) {
        fflush(stdout);
        if (g_die_before) kt_die_now();
        kvps_ring_op o = {.coll = KVPS_COLL_ALLREDUCE, .recv = b, .count = n, .dtype = KVPS_FLOAT32, .op = KVPS_SUM,
                          .algo = g_algo};
        kvps_ring_req q;
        kvps_ring_post(x->r, &o, &q);
        for (int busy = 0; !busy;) {
            pthread_mutex_lock(&x->r->fam->mu);
            busy = x->r->fam->busy;
            pthread_mutex_unlock(&x->r->fam->mu);
        }
        if (g_algo != KVPS_ALGO_DIRECT) kt_sleep_ms(2);
        kt_die_now();
    }
    allreduce_with_a_dead_peer(x, "rank process died", b, n);
    free(b);
}

static void test_dead_rank_process(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    if (pipe(kt_die_pipe) != 0) { KT_CHECK(0, "pipe"); return; }
    g_die_before = 1;
    kt_run_procs(3, dead_proc_main, 2 * fail_timeout_ms(), 60, 2);
    g_die_before = 0;
    g_algo = KVPS_ALGO_RING;
    kt_run_procs(3, dead_proc_main, 2 * fail_timeout_ms(), 60, 2);
    if (!kt_quick()) kt_run_procs(4, dead_proc_main, 2 * fail_timeout_ms(), 60, 3);
    if (!getenv("KVPS_RING_SHM") || strcmp(getenv("KVPS_RING_SHM"), "0") != 0) { /* DIRECT runs on one host */
        g_algo = KVPS_ALGO_DIRECT;
        kt_run_procs(4, dead_proc_main, 2 * fail_timeout_ms(), 60, 3);
    }
    g_algo = KVPS_ALGO_AUTO;
    close(kt_die_pipe[0]);
    close(kt_die_pipe[1]);
    kvps_log_set_level(KVPS_LOG_ERROR);
}

/* Mismatch scenarios: rank `odd` calls something else than the others. */
typedef struct mm_case {
    const char *name;
    kvps_coll coll[2];   /* [0] the others, [1] the odd rank */
    size_t count[2];
    kvps_dtype dt[2];
    kvps_redop op[2];
    int root[2];
    int odd;
    int need_mismatch;   /* some rank must say KVPS_ERR_MISMATCH */
    int late_ok;         /* a rank may return KVPS_OK if its next call fails (manual section 2) */
} mm_case;

/* Calls that take the same path (same tags), where every rank receives from the odd one: every
   rank fails the call itself. */
static const mm_case MM_SAME_PATH[] = {
    {"count 13 vs 14", {KVPS_COLL_ALLREDUCE, KVPS_COLL_ALLREDUCE}, {13, 14}, {KVPS_FLOAT32, KVPS_FLOAT32}, {KVPS_SUM, KVPS_SUM}, {0, 0}, 0, 1, 0},
    {"dtype f32 vs f64", {KVPS_COLL_ALLREDUCE, KVPS_COLL_ALLREDUCE}, {100, 100}, {KVPS_FLOAT32, KVPS_FLOAT64}, {KVPS_SUM, KVPS_SUM}, {0, 0}, 1, 1, 0},
    {"dtype f32 vs i32", {KVPS_COLL_ALLREDUCE, KVPS_COLL_ALLREDUCE}, {100, 100}, {KVPS_FLOAT32, KVPS_INT32}, {KVPS_SUM, KVPS_SUM}, {0, 0}, 2, 1, 0},
    {"op sum vs max", {KVPS_COLL_ALLREDUCE, KVPS_COLL_ALLREDUCE}, {100, 100}, {KVPS_FLOAT32, KVPS_FLOAT32}, {KVPS_SUM, KVPS_MAX}, {0, 0}, 2, 1, 0},
    {"reduce_scatter count 50 vs 51", {KVPS_COLL_REDUCE_SCATTER, KVPS_COLL_REDUCE_SCATTER}, {50, 51}, {KVPS_INT32, KVPS_INT32}, {KVPS_SUM, KVPS_SUM}, {0, 0}, 1, 1, 0},
    {"allgather dtype i32 vs f32", {KVPS_COLL_ALLGATHER, KVPS_COLL_ALLGATHER}, {10, 10}, {KVPS_INT32, KVPS_FLOAT32}, {KVPS_SUM, KVPS_SUM}, {0, 0}, 0, 1, 0},
    {"alltoall count 4 vs 3", {KVPS_COLL_ALLTOALL, KVPS_COLL_ALLTOALL}, {4, 3}, {KVPS_INT64, KVPS_INT64}, {KVPS_SUM, KVPS_SUM}, {0, 0}, 2, 1, 0},
};

/* Collectives in which some ranks only send (broadcast root, reduce-tree leaves, gather
   non-roots) or receive only from ranks that agree with them: manual section 2, such a rank
   "may finish before its peers notice and return KVPS_OK; the receivers report the error, and
   the sender's next call on the ring fails with KVPS_ERR_MISMATCH or KVPS_ERR_PEER". */
static const mm_case MM_SEND_ONLY[] = {
    {"broadcast dtype f16 vs bf16", {KVPS_COLL_BROADCAST, KVPS_COLL_BROADCAST}, {100, 100}, {KVPS_FLOAT16, KVPS_BFLOAT16}, {KVPS_SUM, KVPS_SUM}, {0, 0}, 2, 1, 1},
    {"reduce op sum vs avg", {KVPS_COLL_REDUCE, KVPS_COLL_REDUCE}, {100, 100}, {KVPS_INT64, KVPS_INT64}, {KVPS_SUM, KVPS_AVG}, {0, 0}, 1, 1, 1},
    {"gather count 8 vs 9", {KVPS_COLL_GATHER, KVPS_COLL_GATHER}, {8, 9}, {KVPS_INT32, KVPS_INT32}, {KVPS_SUM, KVPS_SUM}, {0, 0}, 2, 1, 1},
    {"scatter dtype i32 vs f32, root 1", {KVPS_COLL_SCATTER, KVPS_COLL_SCATTER}, {8, 8}, {KVPS_INT32, KVPS_FLOAT32}, {KVPS_SUM, KVPS_SUM}, {1, 1}, 0, 1, 1},
};

/* Ring pieces of 32 KiB and more go out without a copy: the error path must still end within
   the timeout and keep the message that names the mismatch. */
static const mm_case MM_ZERO_COPY[] = {
    {"count 100000 vs 100001", {KVPS_COLL_ALLREDUCE, KVPS_COLL_ALLREDUCE}, {100000, 100001}, {KVPS_FLOAT32, KVPS_FLOAT32}, {KVPS_SUM, KVPS_SUM}, {0, 0}, 2, 1, 0},
};

/* Calls whose messages carry other tags (another algorithm, phase or root): "a rank that
   receives any piece of a different call reports KVPS_ERR_MISMATCH". */
static const mm_case MM_OTHER_PATH[] = {
    {"broadcast root 0 vs 1", {KVPS_COLL_BROADCAST, KVPS_COLL_BROADCAST}, {100, 100}, {KVPS_INT32, KVPS_INT32}, {KVPS_SUM, KVPS_SUM}, {0, 1}, 1, 1, 1},
    {"count 100 vs 100000 (RD vs ring)", {KVPS_COLL_ALLREDUCE, KVPS_COLL_ALLREDUCE}, {100, 100000}, {KVPS_FLOAT32, KVPS_FLOAT32}, {KVPS_SUM, KVPS_SUM}, {0, 0}, 0, 1, 0},
    {"allreduce vs broadcast", {KVPS_COLL_ALLREDUCE, KVPS_COLL_BROADCAST}, {100, 100}, {KVPS_FLOAT32, KVPS_FLOAT32}, {KVPS_SUM, KVPS_SUM}, {0, 0}, 1, 1, 1},
    {"allreduce vs allgather", {KVPS_COLL_ALLREDUCE, KVPS_COLL_ALLGATHER}, {64, 64}, {KVPS_FLOAT32, KVPS_FLOAT32}, {KVPS_SUM, KVPS_SUM}, {0, 0}, 0, 1, 0},
};

/* A rank with count 0 has nothing to send or receive: it returns KVPS_OK at once, and its next
   call fails. */
static const mm_case MM_COUNT_ZERO[] = {
    {"count 0 vs 13", {KVPS_COLL_ALLREDUCE, KVPS_COLL_ALLREDUCE}, {13, 0}, {KVPS_FLOAT32, KVPS_FLOAT32}, {KVPS_SUM, KVPS_SUM}, {0, 0}, 1, 0, 1},
};

static const mm_case *g_mm_cases;
static size_t g_mm_n;

static void mm_main(kt_rk *x) {
    const mm_case *c = (const mm_case *)x->t->arg;
    if (!kt_rk_call(x, kvps_ring_barrier(x->r), "barrier")) return;
    int j = x->rank == c->odd;
    size_t n = c->count[j] * (size_t)x->k, es = kvps_dtype_size(c->dt[j]);
    char *sb = (char *)calloc(n ? n : 1, es), *rb = (char *)calloc(n ? n : 1, es);
    kvps_ring_op o = {.coll = c->coll[j], .send = sb, .recv = rb, .count = c->count[j], .dtype = c->dt[j], .op = c->op[j],
                      .root = c->root[j]};
    int64_t t0 = kvps__now_ms();
    x->rc1 = kvps_ring_run(x->r, &o);
    x->ms1 = kvps__now_ms() - t0;
    snprintf(x->err1, sizeof x->err1, "%s", kvps_ring_last_error(x->r));
    if (x->rc1 == KVPS_OK && c->late_ok) {
        /* the next call learns of it */
        t0 = kvps__now_ms();
        x->rc2 = kvps_ring_barrier(x->r);
        int64_t ms = kvps__now_ms() - t0;
        if (x->rc2 != KVPS_ERR_MISMATCH && x->rc2 != KVPS_ERR_PEER)
            kt_rk_fail(x, "%s: rank %d returned KVPS_OK, then its next call gave %s, want KVPS_ERR_MISMATCH or KVPS_ERR_PEER "
                    "[%s]", c->name, x->rank, kvps_result_str(x->rc2), kvps_ring_last_error(x->r));
        if (ms > 5 * (int64_t)x->r->desc.timeout_ms)
            kt_rk_fail(x, "%s: rank %d's next call took %lld ms to fail", c->name, x->rank, (long long)ms);
        if (x->rc2 == KVPS_ERR_MISMATCH) snprintf(x->err1, sizeof x->err1, "%s", kvps_ring_last_error(x->r));
    } else {
        check_failed_rank(x, c->name, x->rc1, x->ms1);
    }
    free(sb);
    free(rb);
}

/* A mismatch message names the call: either a piece of the wrong size ("bytes"), or both calls
   by name, so the words that differ between the two calls (collective, dtype, op, count) are
   in it, e.g. "rank 1 called allreduce of 100 float64 (sum, root 0); this rank (0) called
   allreduce of 100 float32 (sum, root 0)". */
static void mm_check_text(const mm_case *c, int r, const char *err) {
    if (strstr(err, "bytes") && !strstr(err, " called ")) return;
    const char *words[8];
    char counts[2][24];
    int nw = 0;
    for (int j = 0; j < 2; j++) {
        words[nw++] = kvps_coll_name(c->coll[j]);
        words[nw++] = kvps_dtype_name(c->dt[j]);
        words[nw++] = kvps_redop_name(c->op[j]);
        snprintf(counts[j], sizeof counts[j], "of %zu ", c->count[j]);
        words[nw++] = counts[j];
    }
    for (int i = 0; i < nw; i++)
        KT_CHECK(strstr(err, words[i]) != NULL, "%s: rank %d's message does not name '%s': '%s'", c->name, r, words[i], err);
}

static void mismatch_body(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    for (size_t i = 0; i < g_mm_n; i++) {
        const mm_case *c = &g_mm_cases[i];
        kt_team t;
        kt_team_init(&t, c->name, mm_main, 3, 0, fail_timeout_ms());
        t.arg = c;
        kt_team_run(&t);
        int nmm = 0;
        char got[200] = "";
        for (int r = 0; r < t.k; r++) {
            kvps_result rc = t.ranks[r].rc1;
            nmm += rc == KVPS_ERR_MISMATCH || t.ranks[r].rc2 == KVPS_ERR_MISMATCH;
            snprintf(got + strlen(got), sizeof got - strlen(got), " %d:%d", r, (int)rc);
            KT_CHECK(rc == KVPS_ERR_MISMATCH || rc == KVPS_ERR_PEER || rc == KVPS_ERR_TIMEOUT || rc == KVPS_OK,
                     "%s: rank %d: %s", c->name, r, kvps_result_str(rc));
            if (rc == KVPS_ERR_MISMATCH) mm_check_text(c, r, t.ranks[r].err1);
            else if (t.ranks[r].rc2 == KVPS_ERR_MISMATCH) /* its next call (a barrier) against the others' */
                KT_CHECK(strstr(t.ranks[r].err1, " called ") || strstr(t.ranks[r].err1, "bytes"),
                         "%s: rank %d's message does not name the call: '%s'", c->name, r, t.ranks[r].err1);
        }
        if (c->need_mismatch)
            KT_CHECK(nmm > 0, "%s: no rank reported KVPS_ERR_MISMATCH (rank:result%s; -203 timeout, -204 peer); "
                     "rank %d said '%s'", c->name, got, c->odd, t.ranks[c->odd].err1);
    }
}

#define MM_RUN(cases) do { g_mm_cases = cases; g_mm_n = sizeof cases / sizeof cases[0]; kt_isolated(mismatch_body, 30); } while (0)
static void test_mismatch_same_path(void) { MM_RUN(MM_SAME_PATH); }
static void test_mismatch_send_only_ranks(void) { MM_RUN(MM_SEND_ONLY); }
static void test_mismatch_zero_copy_error_path(void) { MM_RUN(MM_ZERO_COPY); }
static void test_mismatch_other_path(void) { MM_RUN(MM_OTHER_PATH); }
static void test_mismatch_count_zero(void) { MM_RUN(MM_COUNT_ZERO); }

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    kvps_log_set_level(KVPS_LOG_ERROR);
    int64_t t0 = kvps__now_ms();
    KT_RUN(test_dead_rank_process, 120);
    KT_RUN(test_dead_rank_thread, 120);
    KT_RUN(test_mismatch_same_path, 120);
    KT_RUN(test_mismatch_send_only_ranks, 120);
    KT_RUN(test_mismatch_zero_copy_error_path, 120);
    KT_RUN(test_mismatch_other_path, 120);
    KT_RUN(test_mismatch_count_zero, 120);
    printf("  info: test_ring_faults took %.1f s\n", (double)(kvps__now_ms() - t0) / 1000.0);
    return kt_finish();
}
