/* kt_coll.h - what the ring tests (test_ring_*.c) share beside the team harness in kvps_test.h:
   inputs, the naive oracles, and one collective each checked against them.
   Include after kvps_ring.h and tests/kvps_test.h.

   Inputs are functions of (seed, rank, index), so every rank computes what it should receive.
   Integer results are exact (wrap-around); min/max exact; float sums, products and averages
   within (terms + 1) * 2 * eps * sum|terms| (16-bit floats round after each step, so their own
   eps); all-reduce and broadcast results must be bit-identical on every rank (kt_rk_hash). */
#ifndef KT_COLL_H
#define KT_COLL_H
#include <math.h>

static const char *const DT_NAME[6] = {"f32", "f64", "i32", "i64", "f16", "bf16"};
static const char *const OP_NAME[5] = {"sum", "prod", "min", "max", "avg"};
static const char *const ALGO_NAME[KVPS_ALGO_COUNT] = {"auto", "ring", "biring", "rd", "hier", "rhd", "direct"};

/* Groups for HIER: {0,0,1,1,2,2,2,3} (cut to the size) and alternating. */
static const int GROUPS8[8] = {0, 0, 1, 1, 2, 2, 2, 3};
static const int GROUPS_ALT[8] = {1, 0, 1, 0, 1, 0, 1, 0};

/* ---- inputs and oracles ---------------------------------------------------------------------- */

static inline uint64_t gen_bits(uint64_t seed, int rank, size_t i) {
    uint64_t s = seed ^ ((uint64_t)(unsigned)rank * 0xd1b54a32d192ed03ull) ^ ((uint64_t)i * 0x9e3779b97f4a7c15ull);
    kt_rng(&s);
    return kt_rng(&s);
}

static inline int32_t as_i32(uint32_t u) { int32_t v; memcpy(&v, &u, sizeof v); return v; }
static inline int64_t as_i64(uint64_t u) { int64_t v; memcpy(&v, &u, sizeof v); return v; }
static inline int is_int(kvps_dtype dt) { return dt == KVPS_INT32 || dt == KVPS_INT64; }

typedef struct val { double f; int64_t i; } val;

/* Rank `rank`'s input element i for a reduction: full-range integers (sums and products wrap,
   and wrap-around arithmetic is exact in any order); floats in [-1, 1), for products in
   +-[0.5, 1.5); 16-bit floats are values the format holds exactly. */
static inline val gen_val(kvps_dtype dt, kvps_redop op, uint64_t seed, int rank, size_t i) {
    uint64_t b = gen_bits(seed, rank, i);
    val v = {0, 0};
    if (dt == KVPS_INT32) { v.i = as_i32((uint32_t)b); return v; }
    if (dt == KVPS_INT64) { v.i = as_i64(b); return v; }
    double u = (double)(b >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    if (op == KVPS_PROD) u = (u < 0 ? -1.0 : 1.0) * (0.5 + fabs(u));
    switch (dt) {
    case KVPS_FLOAT32: v.f = (float)u; break;
    case KVPS_FLOAT16: v.f = kvps_f16_to_f32(kvps_f32_to_f16((float)u)); break;
    case KVPS_BFLOAT16: v.f = kvps_bf16_to_f32(kvps_f32_to_bf16((float)u)); break;
    default: v.f = u; break;
    }
    return v;
}

static inline void store_val(kvps_dtype dt, void *buf, size_t pos, val v) {
    switch (dt) {
    case KVPS_FLOAT32: ((float *)buf)[pos] = (float)v.f; break;
    case KVPS_FLOAT64: ((double *)buf)[pos] = v.f; break;
    case KVPS_INT32: ((int32_t *)buf)[pos] = (int32_t)v.i; break;
    case KVPS_INT64: ((int64_t *)buf)[pos] = v.i; break;
    case KVPS_FLOAT16: ((uint16_t *)buf)[pos] = kvps_f32_to_f16((float)v.f); break;
    case KVPS_BFLOAT16: ((uint16_t *)buf)[pos] = kvps_f32_to_bf16((float)v.f); break;
    default: break;
    }
}

static inline val load_val(kvps_dtype dt, const void *buf, size_t pos) {
    val v = {0, 0};
    switch (dt) {
    case KVPS_FLOAT32: v.f = ((const float *)buf)[pos]; break;
    case KVPS_FLOAT64: v.f = ((const double *)buf)[pos]; break;
    case KVPS_INT32: v.i = ((const int32_t *)buf)[pos]; break;
    case KVPS_INT64: v.i = ((const int64_t *)buf)[pos]; break;
    case KVPS_FLOAT16: v.f = kvps_f16_to_f32(((const uint16_t *)buf)[pos]); break;
    case KVPS_BFLOAT16: v.f = kvps_bf16_to_f32(((const uint16_t *)buf)[pos]); break;
    default: break;
    }
    return v;
}

/* Unit roundoff, and the absolute error of rounding near zero (16-bit: subnormal spacing). */
static inline double dt_eps(kvps_dtype dt) {
    switch (dt) {
    case KVPS_FLOAT32: return ldexp(1.0, -24);
    case KVPS_FLOAT64: return ldexp(1.0, -53);
    case KVPS_FLOAT16: return ldexp(1.0, -11);
    case KVPS_BFLOAT16: return ldexp(1.0, -8);
    default: return 0;
    }
}
static inline double dt_tiny(kvps_dtype dt) { return dt == KVPS_FLOAT16 ? ldexp(1.0, -24) : 1e-35; }

/* Is `got` the reduction over ranks 0..k-1 of input element gi? Else a message in msg. */
static inline int red_ok(kvps_dtype dt, kvps_redop op, int k, uint64_t seed, size_t gi, val got, char *msg, size_t cap) {
    if (is_int(dt)) {
        uint64_t acc = op == KVPS_PROD ? 1 : 0;
        int64_t mn = INT64_MAX, mx = INT64_MIN;
        for (int r = 0; r < k; r++) {
            int64_t v = gen_val(dt, op, seed, r, gi).i;
            acc = op == KVPS_PROD ? acc * (uint64_t)v : acc + (uint64_t)v;
            if (v < mn) mn = v;
            if (v > mx) mx = v;
        }
        int64_t s = dt == KVPS_INT32 ? (int64_t)as_i32((uint32_t)acc) : as_i64(acc), want;
        switch (op) {
        case KVPS_MIN: want = mn; break;
        case KVPS_MAX: want = mx; break;
        case KVPS_AVG: want = s / k; break;
        default: want = s; break;
        }
        if (got.i == want) return 1;
        snprintf(msg, cap, "got %lld want %lld", (long long)got.i, (long long)want);
        return 0;
    }
    long double s = 0, p = 1;
    double a = 0, mn = INFINITY, mx = -INFINITY;
    for (int r = 0; r < k; r++) {
        double v = gen_val(dt, op, seed, r, gi).f;
        s += v;
        p *= v;
        a += fabs(v);
        if (v < mn) mn = v;
        if (v > mx) mx = v;
    }
    double u = dt_eps(dt), tiny = dt_tiny(dt), want, tol;
    switch (op) {
    case KVPS_SUM: want = (double)s; tol = 2.0 * (k + 1) * u * a + k * tiny; break;
    case KVPS_AVG: want = (double)(s / k); tol = (2.0 * (k + 2) * u * a + k * tiny) / k; break;
    case KVPS_PROD: want = (double)p; tol = 2.0 * (k + 1) * u * fabs(want) + tiny; break;
    case KVPS_MIN: want = mn; tol = 0; break;
    default: want = mx; tol = 0; break;
    }
    if (isfinite(got.f) && fabs(got.f - want) <= tol) return 1;
    snprintf(msg, cap, "got %.9g want %.9g (tolerance %.3g)", got.f, want, tol);
    return 0;
}

/* Raw elements for data movement: es bytes of gen_bits. */
static inline void put_raw(kvps_dtype dt, void *buf, size_t n, uint64_t seed, int rank, size_t base) {
    size_t es = kvps_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        uint64_t b = gen_bits(seed, rank, base + i);
        memcpy((char *)buf + i * es, &b, es);
    }
}

static inline void put_red(kvps_dtype dt, kvps_redop op, void *buf, size_t n, uint64_t seed, int rank, size_t base) {
    for (size_t i = 0; i < n; i++) store_val(dt, buf, i, gen_val(dt, op, seed, rank, base + i));
}

/* Checks of a result: against the reduction oracle, against rank src's raw input, untouched. */
static inline size_t check_red(kt_rk *x, const char *what, kvps_dtype dt, kvps_redop op, uint64_t seed, const void *buf,
                        size_t n, size_t base) {
    size_t bad = 0, first = 0;
    char msg[160], first_msg[160] = "";
    for (size_t i = 0; i < n; i++)
        if (!red_ok(dt, op, x->k, seed, base + i, load_val(dt, buf, i), msg, sizeof msg) && bad++ == 0) {
            first = i;
            memcpy(first_msg, msg, sizeof msg);
        }
    if (bad) kt_rk_fail(x, "%s: rank %d: %zu of %zu wrong, first [%zu] %s", what, x->rank, bad, n, first, first_msg);
    return bad;
}

static inline size_t check_raw(kt_rk *x, const char *what, kvps_dtype dt, const void *buf, size_t n, uint64_t seed, int src,
                        size_t base) {
    size_t es = kvps_dtype_size(dt), bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t b = gen_bits(seed, src, base + i);
        if (memcmp((const char *)buf + i * es, &b, es) != 0 && bad++ == 0) first = i;
    }
    if (bad)
        kt_rk_fail(x, "%s: rank %d: %zu of %zu elements from rank %d wrong, first [%zu] (its index %zu)", what, x->rank, bad,
                n, src, first, base + first);
    return bad;
}

static inline void check_fill(kt_rk *x, const char *what, const void *buf, size_t bytes, unsigned char c) {
    for (size_t i = 0; i < bytes; i++)
        if (((const unsigned char *)buf)[i] != c) {
            kt_rk_fail(x, "%s: rank %d: byte %zu of a buffer it must not touch was written", what, x->rank, i);
            return;
        }
}

/* ---- one collective each ---------------------------------------------------------------------- */
/* One operation each, checked against the oracle. place: 0 out of place, 1 send == recv,
   2 send == NULL (see each for what that means). */

static inline void t_allreduce(kt_rk *x, kvps_dtype dt, kvps_redop op, size_t n, kvps_ring_algo algo, int place) {
    if (x->dead) return;
    uint64_t seed = kt_rk_seed(x);
    size_t es = kvps_dtype_size(dt), bytes = n * es;
    char what[128];
    snprintf(what, sizeof what, "allreduce %s %s n=%zu algo=%s place=%d", DT_NAME[dt], OP_NAME[op], n, ALGO_NAME[algo], place);
    char *sb = (char *)kt_xmalloc(bytes), *rb = (char *)kt_xmalloc(bytes);
    put_red(dt, op, place == 0 ? sb : rb, n, seed, x->rank, 0);
    if (place == 0) memset(rb, 0xEE, bytes);
    kvps_ring_op o = {.coll = KVPS_COLL_ALLREDUCE, .send = place == 0 ? sb : place == 1 ? rb : NULL, .recv = rb,
                      .count = n, .dtype = dt, .op = op, .algo = algo};
    if (place == 2 && n == 0) o.recv = NULL;
    kvps_result rc = algo == KVPS_ALGO_AUTO && place == 0 ? kvps_ring_allreduce(x->r, sb, rb, n, dt, op)
                                                          : kvps_ring_run(x->r, &o);
    if (kt_rk_call(x, rc, what)) {
        check_red(x, what, dt, op, seed, rb, n, 0);
        if (place == 0) {
            char *again = (char *)kt_xmalloc(bytes);
            put_red(dt, op, again, n, seed, x->rank, 0);
            if (memcmp(again, sb, bytes) != 0) kt_rk_fail(x, "%s: rank %d: the send buffer was modified", what, x->rank);
            free(again);
        }
        kt_rk_hash(x, rb, bytes);
    }
    free(sb);
    free(rb);
}

/* place 1: send == recv, 2: send NULL, on every rank: the input is in recv (clobbered on
   non-roots). Out of place, non-roots pass recv = NULL (odd operations) or a buffer that must
   stay untouched. */
static inline void t_reduce(kt_rk *x, kvps_dtype dt, kvps_redop op, size_t n, int root, int place) {
    if (x->dead) return;
    uint64_t seed = kt_rk_seed(x);
    size_t es = kvps_dtype_size(dt), bytes = n * es;
    int me_root = x->rank == root;
    char what[128];
    snprintf(what, sizeof what, "reduce %s %s n=%zu root=%d place=%d", DT_NAME[dt], OP_NAME[op], n, root, place);
    char *sb = (char *)kt_xmalloc(bytes), *rb = (char *)kt_xmalloc(bytes);
    const void *s = sb;
    void *r = rb;
    if (place == 0) {
        put_red(dt, op, sb, n, seed, x->rank, 0);
        memset(rb, 0xEE, bytes);
        if (!me_root && (x->opn & 1)) r = NULL;
    } else {
        put_red(dt, op, rb, n, seed, x->rank, 0);
        s = place == 1 ? rb : NULL;
    }
    if (kt_rk_call(x, kvps_ring_reduce(x->r, s, r, n, dt, op, root), what)) {
        if (me_root) check_red(x, what, dt, op, seed, rb, n, 0);
        else if (place == 0 && r) check_fill(x, what, rb, bytes, 0xEE);
    }
    free(sb);
    free(rb);
}

/* place 1: send == recv holding all count * size inputs; place 2: send NULL, the same. */
static inline void t_reduce_scatter(kt_rk *x, kvps_dtype dt, kvps_redop op, size_t n, int place) {
    if (x->dead) return;
    uint64_t seed = kt_rk_seed(x);
    size_t es = kvps_dtype_size(dt), total = n * (size_t)x->k;
    char what[128];
    snprintf(what, sizeof what, "reduce_scatter %s %s n=%zu place=%d", DT_NAME[dt], OP_NAME[op], n, place);
    char *sb = (char *)kt_xmalloc(total * es), *rb = (char *)kt_xmalloc((place ? total : n) * es);
    put_red(dt, op, place == 0 ? sb : rb, total, seed, x->rank, 0);
    const void *s = place == 0 ? sb : place == 1 ? rb : NULL;
    if (kt_rk_call(x, kvps_ring_reduce_scatter(x->r, s, rb, n, dt, op), what))
        check_red(x, what, dt, op, seed, rb, n, (size_t)x->rank * n);
    free(sb);
    free(rb);
}

/* In place, the rank's block already at recv[rank * count]: place 1 send = recv + rank * count,
   2 send NULL, 3 send == recv. */
static inline void t_allgather(kt_rk *x, kvps_dtype dt, size_t n, int place) {
    if (x->dead) return;
    uint64_t seed = kt_rk_seed(x);
    size_t es = kvps_dtype_size(dt), bytes = n * es;
    char what[128];
    snprintf(what, sizeof what, "allgather %s n=%zu place=%d", DT_NAME[dt], n, place);
    char *sb = (char *)kt_xmalloc(bytes), *rb = (char *)kt_xmalloc(bytes * (size_t)x->k);
    memset(rb, 0xEE, bytes * (size_t)x->k);
    char *mine = rb + (size_t)x->rank * bytes;
    put_raw(dt, place == 0 ? sb : mine, n, seed, x->rank, 0);
    const void *s = place == 0 ? sb : place == 1 ? mine : place == 2 ? NULL : rb;
    if (kt_rk_call(x, kvps_ring_allgather(x->r, s, rb, n, dt), what)) {
        for (int i = 0; i < x->k; i++)
            if (check_raw(x, what, dt, rb + (size_t)i * bytes, n, seed, i, 0)) break;
        kt_rk_hash(x, rb, bytes * (size_t)x->k);
    }
    free(sb);
    free(rb);
}

/* place 0: every rank passes a send buffer (only the root's counts); 1: send == recv; 2: NULL. */
static inline void t_broadcast(kt_rk *x, kvps_dtype dt, size_t n, int root, int place) {
    if (x->dead) return;
    uint64_t seed = kt_rk_seed(x);
    size_t es = kvps_dtype_size(dt), bytes = n * es;
    char what[128];
    snprintf(what, sizeof what, "broadcast %s n=%zu root=%d place=%d", DT_NAME[dt], n, root, place);
    char *sb = (char *)kt_xmalloc(bytes), *rb = (char *)kt_xmalloc(bytes);
    memset(rb, 0xEE, bytes);
    put_raw(dt, place == 0 ? sb : rb, n, seed, x->rank, 0); /* non-roots: data that must not win */
    const void *s = place == 0 ? sb : place == 1 ? rb : NULL;
    if (kt_rk_call(x, kvps_ring_broadcast(x->r, s, rb, n, dt, root), what)) {
        check_raw(x, what, dt, rb, n, seed, root, 0);
        kt_rk_hash(x, rb, bytes);
    }
    free(sb);
    free(rb);
}

/* In place on the root, its block already at recv[root * count]: place 1 send = recv + root *
   count, 2 send NULL, 3 send == recv. Non-roots pass recv = NULL or a buffer that must stay
   untouched. */
static inline void t_gather(kt_rk *x, kvps_dtype dt, size_t n, int root, int place) {
    if (x->dead) return;
    uint64_t seed = kt_rk_seed(x);
    size_t es = kvps_dtype_size(dt), bytes = n * es;
    int me_root = x->rank == root;
    char what[128];
    snprintf(what, sizeof what, "gather %s n=%zu root=%d place=%d", DT_NAME[dt], n, root, place);
    char *sb = (char *)kt_xmalloc(bytes), *rb = (char *)kt_xmalloc(bytes * (size_t)x->k);
    memset(rb, 0xEE, bytes * (size_t)x->k);
    char *mine = rb + (size_t)x->rank * bytes;
    const void *s = sb;
    void *r = me_root || (x->opn & 1) ? rb : NULL;
    if (me_root && place) {
        put_raw(dt, mine, n, seed, x->rank, 0);
        s = place == 1 ? mine : place == 2 ? NULL : rb;
    } else {
        put_raw(dt, sb, n, seed, x->rank, 0);
    }
    if (kt_rk_call(x, kvps_ring_gather(x->r, s, r, n, dt, root), what)) {
        if (me_root) {
            for (int i = 0; i < x->k; i++)
                if (check_raw(x, what, dt, rb + (size_t)i * bytes, n, seed, i, 0)) break;
        } else if (r) {
            check_fill(x, what, rb, bytes * (size_t)x->k, 0xEE);
        }
    }
    free(sb);
    free(rb);
}

/* In place on the root, all count * size elements in its recv: place 1 send == recv, 2 send
   NULL. Non-roots pass send NULL or a buffer of their own (ignored). */
static inline void t_scatter(kt_rk *x, kvps_dtype dt, size_t n, int root, int place) {
    if (x->dead) return;
    uint64_t seed = kt_rk_seed(x);
    size_t es = kvps_dtype_size(dt), total = n * (size_t)x->k;
    int me_root = x->rank == root;
    char what[128];
    snprintf(what, sizeof what, "scatter %s n=%zu root=%d place=%d", DT_NAME[dt], n, root, place);
    char *sb = (char *)kt_xmalloc(total * es), *rb = (char *)kt_xmalloc((me_root && place ? total : n) * es);
    memset(rb, 0xEE, (me_root && place ? total : n) * es);
    put_raw(dt, me_root && place ? rb : sb, total, seed, x->rank, 0);
    const void *s = me_root ? (place == 0 ? sb : place == 1 ? rb : NULL) : (x->opn & 1) ? sb : NULL;
    if (kt_rk_call(x, kvps_ring_scatter(x->r, s, rb, n, dt, root), what))
        check_raw(x, what, dt, rb, n, seed, root, (size_t)x->rank * n);
    free(sb);
    free(rb);
}

static inline void t_alltoall(kt_rk *x, kvps_dtype dt, size_t n, int place) {
    if (x->dead) return;
    uint64_t seed = kt_rk_seed(x);
    size_t es = kvps_dtype_size(dt), total = n * (size_t)x->k;
    char what[128];
    snprintf(what, sizeof what, "alltoall %s n=%zu place=%d", DT_NAME[dt], n, place);
    char *sb = (char *)kt_xmalloc(total * es), *rb = (char *)kt_xmalloc(total * es);
    memset(rb, 0xEE, total * es);
    put_raw(dt, place == 0 ? sb : rb, total, seed, x->rank, 0);
    const void *s = place == 0 ? sb : place == 1 ? rb : NULL;
    if (kt_rk_call(x, kvps_ring_alltoall(x->r, s, rb, n, dt), what))
        for (int i = 0; i < x->k; i++)
            if (check_raw(x, what, dt, rb + (size_t)i * n * es, n, seed, i, (size_t)x->rank * n)) break;
    free(sb);
    free(rb);
}

/* Nobody leaves a barrier before everyone has entered it (threads only: a shared counter). */
static inline void t_barrier(kt_rk *x, int rounds) {
    kt_team *t = x->t;
    for (int i = 0; i < rounds && !x->dead; i++) {
        kt_sleep_ms((x->rank * 3 + i) % 4);
        __atomic_add_fetch(&t->counter, 1, __ATOMIC_SEQ_CST);
        if (!kt_rk_call(x, kvps_ring_barrier(x->r), "barrier")) return;
        int seen = __atomic_load_n(&t->counter, __ATOMIC_SEQ_CST);
        if (seen < x->k * (i + 1)) kt_rk_fail(x, "barrier round %d: rank %d left with only %d of %d arrivals", i, x->rank, seen, x->k * (i + 1));
        x->opn++;
    }
}

#endif /* KT_COLL_H */
