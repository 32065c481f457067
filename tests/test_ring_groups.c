/* test_ring_groups - sub-rings (kvps_ring_split) and the uneven collectives (allgatherv,
   gatherv, scatterv, alltoallv) of kvps_ring.h against naive oracles (tests/kt_coll.h and the
   block oracles below): 1..8 ranks as threads on inproc:// and on loopback TCP, and as
   processes on loopback TCP; splits by parity, by a key that reverses the order, with a colour
   that opts out, nested; every collective and algorithm (AUTO's choices too) and p2p on a
   sub-ring, interleaved with the parent's; each dtype for the v-collectives, zero counts,
   gapped displacements, in place; counts that disagree (KVPS_ERR_MISMATCH on every rank, the
   ranks and counts named); a sub-ring rank SIGKILLed during a sub-ring all-reduce (a bounded,
   named error); destroying in the wrong order; posted operations on parent and sub-ring. */
#define KVPS_IMPLEMENTATION
#include "kvps.h" /* kt_run_procs: the ranks meet through a kvps server */
#include "kvps_ring.h"
#include "tests/kvps_test.h"
#include "tests/kt_coll.h"
#include <signal.h>

/* ---- a sub-ring as a rank of its own for kt_coll.h's checks ------------------------------- */

/* y: rank x's view of sub-ring s. salt: seeds of their own (sub-rings of different colours
   must not carry the same data, or a message taken by the wrong ring could pass). */
static void sub_open(kt_rk *y, kt_rk *x, kvps_ring *s, uint64_t salt) {
    memset(y, 0, sizeof *y);
    y->t = x->t;
    y->r = s;
    y->rank = kvps_ring_rank(s);
    y->k = kvps_ring_size(s);
    y->opn = salt << 24;
}
/* Its failures become x's. */
static void sub_close(kt_rk *y, kt_rk *x, const char *what) {
    if (y->fails) kt_rk_fail(x, "%s (sub-ring rank %d of %d): %s", what, y->rank, y->k, y->why);
    if (y->dead) x->dead = 1;
    free(y->hash);
    y->hash = NULL;
}

/* ---- the v-collectives' oracles ------------------------------------------------------------- */
/* Counts are functions of (pattern, ranks) that every rank computes alike; pattern 2 makes one
   block large (zero-copy sends, many pipeline pieces); some blocks are 0 in every pattern. */
static size_t vcount(int pattern, int i, int j) {
    switch (pattern) {
    case 0: return (i + 2 * j) % 4 == 3 ? 0 : (size_t)((i * 7 + j * 3 + 5) % 11);
    case 1: return i == 1 ? 3 : 0;
    default: return i == 0 ? 9000 + (size_t)j : (size_t)(i % 2) * 17;
    }
}
/* Displacements: packed (gap 0) or with gap elements before each block. */
static size_t fill_displs(size_t *d, const size_t *c, int k, size_t gap) {
    size_t o = 0;
    for (int i = 0; i < k; i++) { o += gap; d[i] = o; o += c[i]; }
    return o;
}

/* place 0: packed, out of place; 1: send NULL, the block already in recv; 2: gapped displs
   (the gaps must stay untouched). */
static void t_allgatherv(kt_rk *x, kvps_dtype dt, int pattern, int place) {
    if (x->dead) return;
    uint64_t seed = kt_rk_seed(x);
    int k = x->k;
    size_t es = kvps_dtype_size(dt), c[KT_MAXR], d[KT_MAXR];
    for (int i = 0; i < k; i++) c[i] = vcount(pattern, i, 0);
    size_t end = fill_displs(d, c, k, place == 2 ? 3 : 0);
    char what[128];
    snprintf(what, sizeof what, "allgatherv %s pattern %d place %d", DT_NAME[dt], pattern, place);
    char *sb = (char *)kt_xmalloc(c[x->rank] * es), *rb = (char *)kt_xmalloc(end * es);
    memset(rb, 0xEE, end * es);
    put_raw(dt, place == 1 ? rb + d[x->rank] * es : sb, c[x->rank], seed, x->rank, 0);
    if (kt_rk_call(x, kvps_ring_allgatherv(x->r, place == 1 ? NULL : sb, rb, c, place == 2 ? d : NULL, dt), what)) {
        for (int i = 0; i < k; i++) {
            if (check_raw(x, what, dt, rb + d[i] * es, c[i], seed, i, 0)) break;
            if (place == 2) check_fill(x, what, rb + (d[i] - 3) * es, 3 * es, 0xEE);
        }
    }
    free(sb);
    free(rb);
}

static void t_gatherv(kt_rk *x, kvps_dtype dt, int pattern, int root, int place) {
    if (x->dead) return;
    uint64_t seed = kt_rk_seed(x);
    int k = x->k, me_root = x->rank == root;
    size_t es = kvps_dtype_size(dt), c[KT_MAXR], d[KT_MAXR];
    for (int i = 0; i < k; i++) c[i] = vcount(pattern, i, 1);
    size_t end = fill_displs(d, c, k, place == 2 ? 2 : 0);
    char what[128];
    snprintf(what, sizeof what, "gatherv %s pattern %d root %d place %d", DT_NAME[dt], pattern, root, place);
    char *sb = (char *)kt_xmalloc(c[x->rank] * es), *rb = (char *)kt_xmalloc(end * es);
    memset(rb, 0xEE, end * es);
    int inplace = me_root && place == 1;
    put_raw(dt, inplace ? rb + d[x->rank] * es : sb, c[x->rank], seed, x->rank, 0);
    if (kt_rk_call(x, kvps_ring_gatherv(x->r, inplace ? NULL : sb, rb, c, place == 2 ? d : NULL, dt, root), what)) {
        for (int i = 0; me_root && i < k; i++)
            if (check_raw(x, what, dt, rb + d[i] * es, c[i], seed, i, 0)) break;
        if (!me_root) check_fill(x, what, rb, end * es, 0xEE);
    }
    free(sb);
    free(rb);
}

/* Block i of the root's input: rank 100 + i's raw data, so every receiver knows its own. */
static void t_scatterv(kt_rk *x, kvps_dtype dt, int pattern, int root, int place) {
    if (x->dead) return;
    uint64_t seed = kt_rk_seed(x);
    int k = x->k, me_root = x->rank == root;
    size_t es = kvps_dtype_size(dt), c[KT_MAXR], d[KT_MAXR];
    for (int i = 0; i < k; i++) c[i] = vcount(pattern, i, 2);
    size_t end = fill_displs(d, c, k, place == 2 ? 5 : 0);
    char what[128];
    snprintf(what, sizeof what, "scatterv %s pattern %d root %d place %d", DT_NAME[dt], pattern, root, place);
    int inplace = me_root && place == 1;
    char *sb = (char *)kt_xmalloc(end * es), *rb = (char *)kt_xmalloc((inplace ? end : c[x->rank]) * es);
    memset(rb, 0xEE, (inplace ? end : c[x->rank]) * es);
    for (int i = 0; me_root && i < k; i++) put_raw(dt, (inplace ? rb : sb) + d[i] * es, c[i], seed, 100 + i, 0);
    if (kt_rk_call(x, kvps_ring_scatterv(x->r, inplace ? NULL : sb, c, place == 2 ? d : NULL, rb, dt, root), what))
        check_raw(x, what, dt, rb, c[x->rank], seed, 100 + x->rank, 0);
    free(sb);
    free(rb);
}

/* Rank i sends vcount(pattern, i, j) elements to rank j: the raw data of "rank" 64 i + j. */
static void t_alltoallv(kt_rk *x, kvps_dtype dt, int pattern, int place) {
    if (x->dead) return;
    uint64_t seed = kt_rk_seed(x);
    int k = x->k, me = x->rank;
    size_t es = kvps_dtype_size(dt), sc[KT_MAXR], sd[KT_MAXR], rc[KT_MAXR], rd[KT_MAXR];
    for (int j = 0; j < k; j++) { sc[j] = vcount(pattern, me, j); rc[j] = vcount(pattern, j, me); }
    size_t send_end = fill_displs(sd, sc, k, place == 2 ? 1 : 0), recv_end = fill_displs(rd, rc, k, place == 2 ? 4 : 0);
    char what[128];
    snprintf(what, sizeof what, "alltoallv %s pattern %d place %d", DT_NAME[dt], pattern, place);
    size_t rsize = (place == 1 && send_end > recv_end ? send_end : recv_end) * es;
    char *sb = (char *)kt_xmalloc(send_end * es), *rb = (char *)kt_xmalloc(rsize);
    memset(rb, 0xEE, rsize);
    for (int j = 0; j < k; j++) put_raw(dt, (place == 1 ? rb : sb) + sd[j] * es, sc[j], seed, 64 * me + j, 0);
    kvps_result r = kvps_ring_alltoallv(x->r, place == 1 ? NULL : sb, sc, place == 2 ? sd : NULL, rb, rc,
                                        place == 2 ? rd : NULL, dt);
    if (kt_rk_call(x, r, what))
        for (int i = 0; i < k; i++)
            if (check_raw(x, what, dt, rb + rd[i] * es, rc[i], seed, 64 * i + me, 0)) break;
    free(sb);
    free(rb);
}

static void v_suite(kt_rk *x, int thin) {
    long it = 0;
    for (int dt = 0; dt < KVPS_DTYPE_COUNT; dt++)
        for (int pattern = 0; pattern < 3; pattern++)
            for (int place = 0; place < 3; place++) {
                if (it++ % thin == 0) t_allgatherv(x, (kvps_dtype)dt, pattern, place);
                if (it++ % thin == 0) t_alltoallv(x, (kvps_dtype)dt, pattern, place);
                int root = (dt + pattern + place) % x->k;
                if (it++ % thin == 0) t_gatherv(x, (kvps_dtype)dt, pattern, root, place);
                if (it++ % thin == 0) t_scatterv(x, (kvps_dtype)dt, pattern, (root + 1) % x->k, place);
            }
}

/* ---- every collective on a ring (a sub-ring here) ------------------------------------------ */
static void coll_suite(kt_rk *x, int thin) {
    static const kvps_ring_algo algos[] = {KVPS_ALGO_AUTO, KVPS_ALGO_RING, KVPS_ALGO_BIRING, KVPS_ALGO_RD, KVPS_ALGO_RHD,
                                           KVPS_ALGO_HIER};
    size_t counts[4] = {0, 1, 13, 1031};
    long it = 0;
    for (int dt = 0; dt < KVPS_DTYPE_COUNT; dt++)
        for (int ci = 0; ci < 4; ci++) {
            for (int a = 0; a < 6; a++)
                if (it++ % thin == 0) t_allreduce(x, (kvps_dtype)dt, (kvps_redop)((dt + a) % 5), counts[ci], algos[a], (ci + a) % 3);
            int root = (dt + ci) % x->k, place = (dt + ci) % 3;
            if (it++ % thin == 0) t_reduce(x, (kvps_dtype)dt, (kvps_redop)(ci % 5), counts[ci], root, place);
            if (it++ % thin == 0) t_reduce_scatter(x, (kvps_dtype)dt, KVPS_SUM, counts[ci], place);
            if (it++ % thin == 0) t_allgather(x, (kvps_dtype)dt, counts[ci], (dt + ci) % 4);
            if (it++ % thin == 0) t_broadcast(x, (kvps_dtype)dt, counts[ci], root, place);
            if (it++ % thin == 0) t_gather(x, (kvps_dtype)dt, counts[ci], root, (dt + ci) % 4);
            if (it++ % thin == 0) t_scatter(x, (kvps_dtype)dt, counts[ci], root, place);
            if (it++ % thin == 0) t_alltoall(x, (kvps_dtype)dt, counts[ci], place);
        }
    if (!x->dead) kt_rk_call(x, kvps_ring_barrier(x->r), "barrier");
}

/* A ring exchange and a message to itself by p2p on ring x (every rank sends to the next). */
static void p2p_round(kt_rk *x, uint32_t tag) {
    if (x->dead) return;
    int k = x->k, me = x->rank;
    int64_t out[100], in[100], self[3] = {7, 8, 9}, back[3];
    for (int i = 0; i < 100; i++) out[i] = (int64_t)me * 1000 + i + tag;
    kvps_ring_req q;
    if (!kt_rk_call(x, kvps_ring_irecv(x->r, in, 100, KVPS_INT64, (me - 1 + k) % k, tag, &q), "irecv")) return;
    if (!kt_rk_call(x, kvps_ring_send(x->r, out, 100, KVPS_INT64, (me + 1) % k, tag), "send")) return;
    if (!kt_rk_call(x, kvps_ring_wait(x->r, q, -1), "wait irecv")) return;
    for (int i = 0; i < 100; i++)
        if (in[i] != (int64_t)((me - 1 + k) % k) * 1000 + i + tag) {
            kt_rk_fail(x, "p2p tag %u: rank %d got %lld at [%d]", tag, me, (long long)in[i], i);
            break;
        }
    if (kt_rk_call(x, kvps_ring_send(x->r, self, 3, KVPS_INT64, me, tag + 1), "send to itself") &&
        kt_rk_call(x, kvps_ring_recv(x->r, back, 3, KVPS_INT64, me, tag + 1), "recv from itself") && back[2] != 9)
        kt_rk_fail(x, "p2p to itself: got %lld", (long long)back[2]);
}

/* ---- the scenarios ----------------------------------------------------------------------------- */
typedef struct grp_cfg {
    int thin;
} grp_cfg;

/* Split by parity (key: rank), check shape, run everything on the sub-ring, nested split by
   halves, then the reversed split and an opt-out, with the parent's collectives between. */
static void groups_main(kt_rk *x) {
    const grp_cfg *c = (const grp_cfg *)x->t->arg;
    int thin = c ? c->thin : 1, k = x->k, me = x->rank;
    kvps_ring *par = NULL, *rev = NULL, *none = NULL, *nest = NULL;
    if (!kt_rk_call(x, kvps_ring_split(x->r, me % 2, me, &par), "split by parity")) return;
    int want_k = (k - me % 2 + 1) / 2;
    if (!par || kvps_ring_size(par) != want_k || kvps_ring_rank(par) != me / 2) {
        kt_rk_fail(x, "parity split: rank %d got size %d rank %d, want %d and %d", me, kvps_ring_size(par),
                   kvps_ring_rank(par), want_k, me / 2);
        kvps_ring_destroy(&par);
        return;
    }
    kt_rk y;
    sub_open(&y, x, par, 1 + (uint64_t)(me % 2));
    t_allreduce(x, KVPS_FLOAT32, KVPS_SUM, 777, KVPS_ALGO_AUTO, 0); /* parent, sub, parent, sub... */
    t_allreduce(&y, KVPS_FLOAT32, KVPS_SUM, 777, KVPS_ALGO_AUTO, 0);
    t_allgather(x, KVPS_INT32, 5, 0);
    p2p_round(&y, 40);
    t_allgather(&y, KVPS_INT32, 5, 0);
    p2p_round(x, 40); /* the same tag on the parent: kept apart */
    coll_suite(&y, thin);
    v_suite(&y, thin);
    /* nested: the sub-ring cut in halves (key reversed) */
    int ys = kvps_ring_size(par), yr = kvps_ring_rank(par);
    if (kt_rk_call(&y, kvps_ring_split(par, yr < ys / 2, -yr, &nest), "nested split")) {
        int lo = yr < ys / 2, nk = lo ? ys / 2 : ys - ys / 2, nr = lo ? ys / 2 - 1 - yr : ys - 1 - yr;
        if (!nest || kvps_ring_size(nest) != nk || kvps_ring_rank(nest) != nr) {
            kt_rk_fail(x, "nested split: got size %d rank %d, want %d and %d", kvps_ring_size(nest), kvps_ring_rank(nest), nk, nr);
        } else {
            kt_rk z;
            sub_open(&z, x, nest, 10 + (uint64_t)(me % 2) * 2 + (uint64_t)lo);
            t_allreduce(&z, KVPS_INT64, KVPS_SUM, 100, KVPS_ALGO_AUTO, 0);
            t_allreduce(&y, KVPS_INT64, KVPS_SUM, 100, KVPS_ALGO_AUTO, 0); /* the middle ring between */
            t_alltoallv(&z, KVPS_FLOAT64, 0, 0);
            p2p_round(&z, 40);
            t_allgatherv(&z, KVPS_BFLOAT16, 2, 2);
            t_allreduce(x, KVPS_INT64, KVPS_SUM, 100, KVPS_ALGO_AUTO, 0);
            sub_close(&z, x, "nested");
        }
    }
    t_allgatherv(x, KVPS_FLOAT16, 0, 0);
    sub_close(&y, x, "parity");
    /* the middle ring destroyed before its own sub-ring: the sub-ring goes on (it needs only the
       family's sockets) */
    kvps_ring_destroy(&par);
    if (nest && !x->dead) {
        kt_rk z;
        sub_open(&z, x, nest, 20 + (uint64_t)me);
        kt_rk_call(&z, kvps_ring_barrier(nest), "nested barrier after its parent's destroy");
        sub_close(&z, x, "nested after");
    }
    kvps_ring_destroy(&nest);
    if (x->dead) return;
    /* reversed order, and rank 0 opting out */
    if (kt_rk_call(x, kvps_ring_split(x->r, 0, k - me, &rev), "reversed split") &&
        (!rev || kvps_ring_rank(rev) != k - 1 - me || kvps_ring_size(rev) != k))
        kt_rk_fail(x, "reversed split: rank %d got rank %d of %d", me, kvps_ring_rank(rev), kvps_ring_size(rev));
    if (rev) {
        kt_rk z;
        sub_open(&z, x, rev, 50);
        t_allreduce(&z, KVPS_FLOAT64, KVPS_SUM, 4099, KVPS_ALGO_RING, 0);
        t_scatter(&z, KVPS_INT32, 3, 0, 0);
        sub_close(&z, x, "reversed");
    }
    if (kt_rk_call(x, kvps_ring_split(x->r, me == 0 ? KVPS_UNDEFINED : 5, 0, &none), "split with an opt-out")) {
        if (me == 0 ? none != NULL : !none || kvps_ring_size(none) != k - 1 || kvps_ring_rank(none) != me - 1)
            kt_rk_fail(x, "opt-out split: rank %d got %p (rank %d of %d)", me, (void *)none, kvps_ring_rank(none), kvps_ring_size(none));
        if (none) {
            kt_rk z;
            sub_open(&z, x, none, 60);
            t_alltoallv(&z, KVPS_INT32, 0, 0);
            sub_close(&z, x, "opt-out");
        }
    }
    /* posted on both, in the same order everywhere: one queue runs them in that order */
    if (rev && !x->dead) {
        float a[64], b[64], ra[64], rb[64];
        for (int i = 0; i < 64; i++) { a[i] = (float)me; b[i] = (float)(me * me); }
        kvps_ring_op o1 = {.coll = KVPS_COLL_ALLREDUCE, .send = a, .recv = ra, .count = 64, .dtype = KVPS_FLOAT32};
        kvps_ring_op o2 = {.coll = KVPS_COLL_ALLREDUCE, .send = b, .recv = rb, .count = 64, .dtype = KVPS_FLOAT32};
        kvps_ring_req q1, q2;
        if (kt_rk_call(x, kvps_ring_post(rev, &o1, &q1), "post on the sub-ring") &&
            kt_rk_call(x, kvps_ring_post(x->r, &o2, &q2), "post on the parent") &&
            kt_rk_call(x, kvps_ring_wait(x->r, q2, -1), "wait parent") && kt_rk_call(x, kvps_ring_wait(rev, q1, -1), "wait sub")) {
            float s1 = 0, s2 = 0;
            for (int i = 0; i < k; i++) { s1 += (float)i; s2 += (float)(i * i); }
            if (ra[63] != s1 || rb[0] != s2) kt_rk_fail(x, "posted: got %g and %g, want %g and %g", ra[63], rb[0], s1, s2);
        }
    }
    kvps_ring_destroy(&none);
    kvps_ring_destroy(&rev);
    if (!x->dead) t_allreduce(x, KVPS_FLOAT32, KVPS_AVG, 50, KVPS_ALGO_AUTO, 1);
}

static void run_groups(int k, int tcp, size_t chunk, size_t small, const int *groups, int thin) {
    kt_team t;
    grp_cfg c = {thin};
    kt_team_init(&t, tcp ? "groups tcp" : "groups inproc", groups_main, k, tcp, kt_quick() ? 60000 : 20000);
    t.arg = &c;
    t.base.chunk_bytes = chunk;
    t.base.small_bytes = small;
    t.base.groups = groups;
    kt_team_run(&t);
}

/* 1..8 ranks as threads on inproc: default settings, and small pieces and a small limit with
   groups (so AUTO picks RHD, RING and HIER on the sub-rings). */
static void test_groups_threads(void) {
    for (int k = 1; k <= KT_MAXR; k++) {
        if (kt_quick() && k != 1 && k != 3 && k != 4 && k != 8) continue;
        run_groups(k, 0, 0, 0, NULL, kt_quick() ? 7 : 1);
        run_groups(k, 0, 64, 256, GROUPS8, kt_quick() ? 11 : 3);
    }
}

static void test_groups_tcp(void) {
    int ks[] = {2, 5, 8};
    for (int i = 0; i < 3; i++) run_groups(ks[i], 1, 4096, 1024, NULL, kt_quick() ? 13 : 5);
}

static void test_groups_procs(void) {
    kvps_log_set_level(KVPS_LOG_ERROR);
    kt_run_procs(3, groups_main, kt_quick() ? 60000 : 20000, 120, -1);
    kt_run_procs(4, groups_main, kt_quick() ? 60000 : 20000, 120, -1);
    if (!kt_quick()) kt_run_procs(6, groups_main, 20000, 180, -1);
}

/* ---- the v-collectives on the parent, each dtype ------------------------------------------- */
static void v_main(kt_rk *x) { v_suite(x, 1); }
static void test_v_threads(void) {
    for (int k = 1; k <= KT_MAXR; k++) kt_run_team("v inproc", v_main, k, 0, kt_quick() ? 60000 : 20000, NULL);
    kt_run_team("v tcp", v_main, 4, 1, kt_quick() ? 60000 : 20000, NULL);
}
static void test_v_procs(void) { kt_run_procs(3, v_main, kt_quick() ? 60000 : 20000, 120, -1); }

/* ---- counts that disagree: KVPS_ERR_MISMATCH on every rank, named --------------------------- */
typedef struct mm_cfg { int coll, on_sub; const char *want; } mm_cfg;

static void mismatch_main(kt_rk *x) {
    const mm_cfg *c = (const mm_cfg *)x->t->arg;
    kvps_ring *s = NULL, *r = x->r;
    int me = x->rank;
    if (c->on_sub) { /* ranks 1..k-1 in reverse: rank k-1 is the sub-ring's rank 0 */
        if (!kt_rk_call(x, kvps_ring_split(x->r, me == 0 ? KVPS_UNDEFINED : 3, -me, &s), "split")) return;
        if (me == 0) return; /* (not in it: not checked) */
        r = s;
    }
    int k = kvps_ring_size(r), rk = kvps_ring_rank(r);
    size_t cnt[KT_MAXR], rc[KT_MAXR];
    int32_t sb[64] = {0}, rb[64 * KT_MAXR];
    for (int i = 0; i < k; i++) cnt[i] = rc[i] = 5;
    if (c->coll == KVPS_COLL_ALLTOALLV) { if (rk == 2) rc[1] = 6; } /* rank 2 expects 6 from rank 1, which sends 5 */
    else if (rk == 1) cnt[1] = 6;                                     /* rank 1 says 6, the others 5 */
    kvps_ring_op o = {.coll = (kvps_coll)c->coll, .send = sb, .recv = rb, .dtype = KVPS_INT32, .root = 0, .counts = cnt,
                      .recv_counts = c->coll == KVPS_COLL_ALLTOALLV ? rc : NULL};
    int64_t t0 = kvps__now_ms();
    x->rc1 = kvps_ring_run(r, &o);
    x->ms1 = kvps__now_ms() - t0;
    snprintf(x->err1, sizeof x->err1, "%s", kvps_ring_last_error(r));
    kvps_ring_destroy(&s);
}

static void test_mismatch(void) {
    static const mm_cfg cases[] = {
        {KVPS_COLL_ALLGATHERV, 0, "allgatherv counts disagree: rank 0 says rank 1's block is 5 int32, rank 1 says 6"},
        {KVPS_COLL_GATHERV, 0, "gatherv counts disagree: rank 0 says rank 1's block is 5 int32, rank 1 says 6"},
        {KVPS_COLL_SCATTERV, 0, "scatterv counts disagree: rank 0 says rank 1's block is 5 int32, rank 1 says 6"},
        {KVPS_COLL_ALLTOALLV, 0, "alltoallv counts disagree: rank 1 sends 5 int32 to rank 2, rank 2 expects 6 from rank 1"},
        {KVPS_COLL_ALLGATHERV, 1, "allgatherv counts disagree: rank 0 says rank 1's block is 5 int32, rank 1 says 6"},
        {KVPS_COLL_ALLTOALLV, 1, "alltoallv counts disagree: rank 1 sends 5 int32 to rank 2, rank 2 expects 6 from rank 1"},
    };
    kvps_log_set_level(KVPS_LOG_NONE);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int k = 3; k <= 5; k++) {
            const mm_cfg *c = &cases[i];
            kt_team t;
            kt_team_init(&t, "mismatch", mismatch_main, k + c->on_sub, k == 4, 3000);
            t.arg = c;
            kt_team_run(&t);
            for (int r = c->on_sub; r < t.k; r++) {
                kt_rk *x = &t.ranks[r];
                KT_CHECK(x->rc1 == KVPS_ERR_MISMATCH, "%s k=%d sub=%d: rank %d got %s [%s]", kvps_coll_name((kvps_coll)c->coll),
                         k, c->on_sub, r, kvps_result_str(x->rc1), x->err1);
                KT_CHECK(strstr(x->err1, c->want), "%s k=%d sub=%d: rank %d's message '%s' does not say '%s'",
                         kvps_coll_name((kvps_coll)c->coll), k, c->on_sub, r, x->err1, c->want);
                if (c->on_sub) {
                    char who[96];
                    snprintf(who, sizeof who, "(colour 3, parent ranks");
                    KT_CHECK(strncmp(x->err1, "sub-ring ", 9) == 0 && strstr(x->err1, who) && strstr(x->err1, "= parent rank"),
                             "rank %d: '%s' does not name the sub-ring", r, x->err1);
                }
                KT_CHECK(x->ms1 < 3000, "rank %d took %lld ms (the check is not a timeout)", r, (long long)x->ms1);
            }
        }
    kvps_log_set_level(KVPS_LOG_ERROR);
}

/* ---- a sub-ring's rank killed during a sub-ring all-reduce ------------------------------------ */
static int fail_ms(void) { return kt_quick() ? 3000 : 1500; }

static void dead_main(kt_rk *x) {
    kvps_ring *s = NULL;
    int me = x->rank;
    if (!kt_rk_call(x, kvps_ring_split(x->r, me % 2, me, &s), "split")) return;
    float b[1000];
    for (int i = 0; i < 1000; i++) b[i] = 1;
    if (!kt_rk_call(x, kvps_ring_allreduce(s, b, b, 1000, KVPS_FLOAT32, KVPS_SUM), "first sub-ring allreduce")) return;
    /* rank 3 dies only once rank 1 has its last piece of the first all-reduce */
    if (me % 2 && !kt_all_past(x, s, 1)) return;
    if (me == 3) kt_die_now(); /* the odd sub-ring (1, 3) loses its rank 1 */
    int64_t t0 = kvps__now_ms();
    kvps_result rc = kvps_ring_allreduce(s, b, b, 1000, KVPS_FLOAT32, KVPS_SUM);
    int64_t ms = kvps__now_ms() - t0;
    const char *e = kvps_ring_last_error(s);
    if (me == 1) {
        /* over ZeroMQ a timeout; over shared memory (the peer's process on this host) or TCP (its connection) PEER_LOST naming it */
        if (rc != KVPS_ERR_TIMEOUT && rc != KVPS_ERR_PEER && !(rc == KVPS_ERR_PEER_LOST && strstr(e, "rank 1 (process ")))
            kt_rk_fail(x, "rank 1: the sub-ring allreduce with its peer dead gave %s [%s]", kvps_result_str(rc), e);
        if (ms > 5 * (int64_t)fail_ms()) kt_rk_fail(x, "rank 1: took %lld ms to fail", (long long)ms);
        if (!strstr(e, "sub-ring ") || !strstr(e, "parent ranks 1 3") || !strstr(e, "rank 0 = parent rank 1"))
            kt_rk_fail(x, "rank 1: '%s' does not name the sub-ring and the parent's ranks", e);
        printf("  info: rank 1 after %lld ms: %s: %s\n", (long long)ms, kvps_result_str(rc), e);
        /* the parent: broken with it (KVPS_ERR_STATE) when the failure had to close the sockets,
           else its own barrier waits for the dead rank 3 and fails too, in bounded time */
        t0 = kvps__now_ms();
        rc = kvps_ring_barrier(x->r);
        ms = kvps__now_ms() - t0;
        if (rc != KVPS_ERR_STATE && rc != KVPS_ERR_TIMEOUT && rc != KVPS_ERR_PEER && rc != KVPS_ERR_PEER_LOST)
            kt_rk_fail(x, "rank 1: the parent's barrier gave %s [%s]", kvps_result_str(rc), kvps_ring_last_error(x->r));
        if (ms > 5 * (int64_t)fail_ms()) kt_rk_fail(x, "rank 1: the parent's barrier took %lld ms to fail", (long long)ms);
    } else if (rc != KVPS_OK) {
        kt_rk_fail(x, "rank %d: the even sub-ring failed: %s [%s]", me, kvps_result_str(rc), e);
    }
    kvps_ring_destroy(&s);
}

static void test_dead_peer(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    if (pipe(kt_die_pipe) != 0) { KT_CHECK(0, "pipe"); return; }
    kt_run_procs(4, dead_main, fail_ms(), 60, 3);
    close(kt_die_pipe[0]);
    close(kt_die_pipe[1]);
    kvps_log_set_level(KVPS_LOG_ERROR);
}

/* ---- destroying in the wrong order; bad arguments ------------------------------------------- */
static void order_main(kt_rk *x) {
    kvps_ring *s = NULL;
    if (!kt_rk_call(x, kvps_ring_split(x->r, 0, 0, &s), "split")) return;
    float v = 1, w = 0;
    kt_rk_call(x, kvps_ring_allreduce(s, &v, &w, 1, KVPS_FLOAT32, KVPS_SUM), "allreduce");
    /* bad arguments leave the sub-ring as it was */
    size_t c[KT_MAXR] = {0};
    if (kvps_ring_split(s, 0, 0, NULL) != KVPS_ERR_INVALID_ARG) kt_rk_fail(x, "split to NULL accepted");
    if (kvps_ring_allgatherv(s, &v, &w, NULL, NULL, KVPS_FLOAT32) != KVPS_ERR_INVALID_ARG) kt_rk_fail(x, "counts NULL accepted");
    c[x->rank] = 1;
    if (kvps_ring_gatherv(s, NULL, &w, c, NULL, KVPS_FLOAT32, (x->rank + 1) % x->k) != KVPS_ERR_INVALID_ARG && x->k > 1)
        kt_rk_fail(x, "gatherv with nothing to send accepted");
    if (kvps_ring_send(s, &v, 1, KVPS_FLOAT32, x->k, 1) != KVPS_ERR_INVALID_ARG) kt_rk_fail(x, "send to rank size accepted");
    kt_rk_call(x, kvps_ring_barrier(s), "barrier after bad arguments");
    /* everyone is done with the sockets before the first ring goes */
    kt_rk_call(x, kvps_ring_barrier(x->r), "barrier");
    kvps_ring_destroy(&x->r);
    kvps_result rc = kvps_ring_barrier(s);
    if (rc != KVPS_ERR_STATE || !strstr(kvps_ring_last_error(s), "destroyed first"))
        kt_rk_fail(x, "a sub-ring whose first ring is gone: %s [%s]", kvps_result_str(rc), kvps_ring_last_error(s));
    kvps_ring_req q;
    if (kvps_ring_isend(s, &v, 1, KVPS_FLOAT32, 0, 1, &q) != KVPS_ERR_STATE) kt_rk_fail(x, "isend on it accepted");
    kvps_ring_destroy(&s);
}

static void test_destroy_order(void) {
    for (int k = 1; k <= 4; k++) kt_run_team("order", order_main, k, k == 3, 5000, NULL);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    kvps_log_set_level(KVPS_LOG_ERROR);
    int64_t t0 = kvps__now_ms();
    KT_RUN(test_destroy_order, 60);
    KT_RUN(test_mismatch, 120);
    KT_RUN(test_v_threads, 300);
    KT_RUN(test_groups_threads, 600);
    KT_RUN(test_groups_tcp, 300);
    KT_RUN(test_v_procs, 200);
    KT_RUN(test_groups_procs, 600);
    KT_RUN(test_dead_peer, 120);
    printf("  info: test_ring_groups took %.1f s\n", (double)(kvps__now_ms() - t0) / 1000.0);
    return kt_finish();
}
