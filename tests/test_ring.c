/* Collectives among peers (kvps_ring.h) against naive oracles: every collective, dtype and op
   for 1..8 ranks as threads on inproc:// (one shared context) with forced algorithms, small
   pipeline pieces and in-place variants; 2, 3, 4 and 8 ranks as processes on loopback TCP that
   meet through kvps_ring_rendezvous; a 64 MB all-reduce; a dead rank and mismatched calls end in
   errors within the timeout; non-blocking post/wait/test; argument, desc and environment checks;
   kvps_reduce_into against a scalar reference; .io_cpus against the kernel's affinity of the
   threads it pinned.
   Inputs are functions of (seed, rank, index), so every rank computes what it should receive.
   Integer results are exact (wrap-around); min/max exact; float sums, products and averages
   within (terms + 1) * 2 * eps * sum|terms| (16-bit floats round after each step, so their own
   eps); all-reduce and broadcast results must be bit-identical on every rank. */
#define _GNU_SOURCE /* sched_getaffinity of a thread: the oracle for .io_cpus */
#define KVPS_IMPLEMENTATION
#include "kvps_ring.h"
#include "tests/kvps_test.h"
#include <dirent.h>
#include <math.h>
#include <sched.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MAXR = 8 };
static const char *DT_NAME[6] = {"f32", "f64", "i32", "i64", "f16", "bf16"};
static const char *OP_NAME[5] = {"sum", "prod", "min", "max", "avg"};
static const char *ALGO_NAME[6] = {"auto", "ring", "biring", "rd", "hier", "rhd"};

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {}
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { printf("out of memory (%zu bytes)\n", n); exit(2); }
    return p;
}

/* A test that hangs is killed by the alarm with its name, instead of stalling the run. */
static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "HANG: test_ring watchdog fired in ";
    if (write(1, msg, sizeof msg - 1) < 0) {}
    if (kt_cur && write(1, kt_cur, strlen(kt_cur)) < 0) {}
    if (write(1, "\n", 1) < 0) {}
    _exit(3);
}
static void watchdog(int seconds) { alarm((unsigned)(kt_quick() ? seconds * 8 : seconds)); }

/* ---------------------------------------------------------------------------------------- */
/* Inputs and oracles */

static uint64_t gen_bits(uint64_t seed, int rank, size_t i) {
    uint64_t s = seed ^ ((uint64_t)(unsigned)rank * 0xd1b54a32d192ed03ull) ^ ((uint64_t)i * 0x9e3779b97f4a7c15ull);
    kt_rng(&s);
    return kt_rng(&s);
}

static int32_t as_i32(uint32_t u) { int32_t v; memcpy(&v, &u, sizeof v); return v; }
static int64_t as_i64(uint64_t u) { int64_t v; memcpy(&v, &u, sizeof v); return v; }
static int is_int(kvps_dtype dt) { return dt == KVPS_INT32 || dt == KVPS_INT64; }

typedef struct val { double f; int64_t i; } val;

/* Rank `rank`'s input element i for a reduction: full-range integers (sums and products wrap,
   and wrap-around arithmetic is exact in any order); floats in [-1, 1), for products in
   +-[0.5, 1.5); 16-bit floats are values the format holds exactly. */
static val gen_val(kvps_dtype dt, kvps_redop op, uint64_t seed, int rank, size_t i) {
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

static void store_val(kvps_dtype dt, void *buf, size_t pos, val v) {
    switch (dt) {
    case KVPS_FLOAT32: ((float *)buf)[pos] = (float)v.f; break;
    case KVPS_FLOAT64: ((double *)buf)[pos] = v.f; break;
    case KVPS_INT32: ((int32_t *)buf)[pos] = (int32_t)v.i; break;
    case KVPS_INT64: ((int64_t *)buf)[pos] = v.i; break;
    case KVPS_FLOAT16: ((uint16_t *)buf)[pos] = kvps_f32_to_f16((float)v.f); break;
    case KVPS_BFLOAT16: ((uint16_t *)buf)[pos] = kvps_f32_to_bf16((float)v.f); break;
    }
}

static val load_val(kvps_dtype dt, const void *buf, size_t pos) {
    val v = {0, 0};
    switch (dt) {
    case KVPS_FLOAT32: v.f = ((const float *)buf)[pos]; break;
    case KVPS_FLOAT64: v.f = ((const double *)buf)[pos]; break;
    case KVPS_INT32: v.i = ((const int32_t *)buf)[pos]; break;
    case KVPS_INT64: v.i = ((const int64_t *)buf)[pos]; break;
    case KVPS_FLOAT16: v.f = kvps_f16_to_f32(((const uint16_t *)buf)[pos]); break;
    case KVPS_BFLOAT16: v.f = kvps_bf16_to_f32(((const uint16_t *)buf)[pos]); break;
    }
    return v;
}

/* Unit roundoff, and the absolute error of rounding near zero (16-bit: subnormal spacing). */
static double dt_eps(kvps_dtype dt) {
    switch (dt) {
    case KVPS_FLOAT32: return ldexp(1.0, -24);
    case KVPS_FLOAT64: return ldexp(1.0, -53);
    case KVPS_FLOAT16: return ldexp(1.0, -11);
    case KVPS_BFLOAT16: return ldexp(1.0, -8);
    default: return 0;
    }
}
static double dt_tiny(kvps_dtype dt) { return dt == KVPS_FLOAT16 ? ldexp(1.0, -24) : 1e-35; }

/* Is `got` the reduction over ranks 0..k-1 of input element gi? Else a message in msg. */
static int red_ok(kvps_dtype dt, kvps_redop op, int k, uint64_t seed, size_t gi, val got, char *msg, size_t cap) {
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
static void put_raw(kvps_dtype dt, void *buf, size_t n, uint64_t seed, int rank, size_t base) {
    size_t es = kvps_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        uint64_t b = gen_bits(seed, rank, base + i);
        memcpy((char *)buf + i * es, &b, es);
    }
}

static void put_red(kvps_dtype dt, kvps_redop op, void *buf, size_t n, uint64_t seed, int rank, size_t base) {
    for (size_t i = 0; i < n; i++) store_val(dt, buf, i, gen_val(dt, op, seed, rank, base + i));
}

static uint64_t fnv(const void *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) { h ^= ((const unsigned char *)p)[i]; h *= 0x100000001b3ull; }
    return h;
}

/* ---------------------------------------------------------------------------------------- */
/* A team: one thread per rank, each with its own ring, all running the same program. */

typedef struct team team;

typedef struct rk {
    team *t;
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
    char err1[330];
} rk;

struct team {
    const char *label;
    int k;
    int tcp;              /* 0: inproc, one shared context; 1: tcp://127.0.0.1:*, endpoints swapped here */
    kvps_ring_desc base;  /* timeout, chunk, algo, small_bytes, groups */
    void (*fn)(rk *);
    const void *arg;
    void *ctx;
    char peers[MAXR * 64];
    rk ranks[MAXR];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int nready, nfinished, counter, flag;
    char eps[MAXR][256];
};

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void rk_fail(rk *x, const char *fmt, ...) {
    /* the first three failures, one per line */
    if (x->fails++ < 3) {
        size_t len = strlen(x->why);
        if (len && len + 8 < sizeof x->why) { memcpy(x->why + len, "\n    ", 6); len += 5; x->why[len] = 0; }
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(x->why + len, sizeof x->why - len, fmt, ap);
        va_end(ap);
    }
}

/* A collective's result: on error the ring is broken, so the rank stops. */
static int rk_call(rk *x, kvps_result rc, const char *what) {
    if (rc == KVPS_OK) return 1;
    rk_fail(x, "%s: %s [%s]", what, kvps_result_str(rc), x->r ? kvps_ring_last_error(x->r) : "");
    x->dead = 1;
    return 0;
}

static void rk_hash(rk *x, const void *p, size_t n) {
    if (x->nhash == x->caphash) {
        x->caphash = x->caphash ? 2 * x->caphash : 256;
        x->hash = (uint64_t *)realloc(x->hash, x->caphash * sizeof *x->hash);
        if (!x->hash) { printf("out of memory\n"); exit(2); }
    }
    x->hash[x->nhash++] = fnv(p, n) ^ x->opn;
}

static uint64_t next_seed(rk *x) {
    uint64_t s = 0x5eed5eedull + x->opn++ * 0x2545f4914f6cdd1dull;
    return kt_rng(&s);
}

static size_t check_red(rk *x, const char *what, kvps_dtype dt, kvps_redop op, uint64_t seed, const void *buf,
                        size_t n, size_t base) {
    size_t bad = 0, first = 0;
    char msg[160], first_msg[160] = "";
    for (size_t i = 0; i < n; i++)
        if (!red_ok(dt, op, x->k, seed, base + i, load_val(dt, buf, i), msg, sizeof msg) && bad++ == 0) {
            first = i;
            memcpy(first_msg, msg, sizeof msg);
        }
    if (bad) rk_fail(x, "%s: rank %d: %zu of %zu wrong, first [%zu] %s", what, x->rank, bad, n, first, first_msg);
    return bad;
}

static size_t check_raw(rk *x, const char *what, kvps_dtype dt, const void *buf, size_t n, uint64_t seed, int src,
                        size_t base) {
    size_t es = kvps_dtype_size(dt), bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t b = gen_bits(seed, src, base + i);
        if (memcmp((const char *)buf + i * es, &b, es) != 0 && bad++ == 0) first = i;
    }
    if (bad)
        rk_fail(x, "%s: rank %d: %zu of %zu elements from rank %d wrong, first [%zu] (its index %zu)", what, x->rank, bad,
                n, src, first, base + first);
    return bad;
}

static void check_fill(rk *x, const char *what, const void *buf, size_t bytes, unsigned char c) {
    for (size_t i = 0; i < bytes; i++)
        if (((const unsigned char *)buf)[i] != c) {
            rk_fail(x, "%s: rank %d: byte %zu of a buffer it must not touch was written", what, x->rank, i);
            return;
        }
}

static void *team_thread(void *arg) {
    rk *x = (rk *)arg;
    team *t = x->t;
    kvps_ring_desc d = t->base;
    d.rank = x->rank;
    d.size = t->k;
    if (t->tcp) { d.bind = "tcp://127.0.0.1:*"; d.peers = NULL; d.zmq_ctx = NULL; }
    else { d.peers = t->peers; d.zmq_ctx = t->ctx; }
    kvps_result rc = kvps_ring_create(&d, &x->r);
    if (rc != KVPS_OK) { rk_fail(x, "create: %s", kvps_result_str(rc)); x->dead = 1; }
    if (t->tcp) {
        char peers[MAXR * 64] = "";
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
            if (rc != KVPS_OK) { rk_fail(x, "connect: %s", kvps_result_str(rc)); x->dead = 1; }
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
static void team_init(team *t, const char *label, void (*fn)(rk *), int k, int tcp, int timeout_ms) {
    memset(t, 0, sizeof *t);
    t->label = label;
    t->fn = fn;
    t->k = k;
    t->tcp = tcp;
    t->base.timeout_ms = timeout_ms;
}

/* Runs t->fn on every rank; reports each rank's first failure and results that differ across
   ranks. Returns the number of ranks that failed. */
static int team_run(team *t) {
    static int seq;
    seq++;
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
    pthread_t th[MAXR];
    for (int i = 0; i < t->k; i++) {
        memset(&t->ranks[i], 0, sizeof t->ranks[i]);
        t->ranks[i].t = t;
        t->ranks[i].rank = i;
        t->ranks[i].k = t->k;
        pthread_create(&th[i], NULL, team_thread, &t->ranks[i]);
    }
    for (int i = 0; i < t->k; i++) pthread_join(th[i], NULL);
    int failed = 0;
    for (int i = 0; i < t->k; i++) {
        rk *x = &t->ranks[i];
        if (x->fails) failed++;
        KT_CHECK(x->fails == 0, "%s k=%d rank %d: %d failures; first: %s", t->label, t->k, i, x->fails, x->why);
    }
    if (!failed)
        for (int i = 1; i < t->k; i++) {
            rk *a = &t->ranks[0], *b = &t->ranks[i];
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

/* ---------------------------------------------------------------------------------------- */
/* One operation each, checked against the oracle. place: 0 out of place, 1 send == recv,
   2 send == NULL (see each for what that means). */

static void t_allreduce(rk *x, kvps_dtype dt, kvps_redop op, size_t n, kvps_ring_algo algo, int place) {
    if (x->dead) return;
    uint64_t seed = next_seed(x);
    size_t es = kvps_dtype_size(dt), bytes = n * es;
    char what[128];
    snprintf(what, sizeof what, "allreduce %s %s n=%zu algo=%s place=%d", DT_NAME[dt], OP_NAME[op], n, ALGO_NAME[algo], place);
    char *sb = (char *)xmalloc(bytes), *rb = (char *)xmalloc(bytes);
    put_red(dt, op, place == 0 ? sb : rb, n, seed, x->rank, 0);
    if (place == 0) memset(rb, 0xEE, bytes);
    kvps_ring_op o = {.coll = KVPS_COLL_ALLREDUCE, .send = place == 0 ? sb : place == 1 ? rb : NULL, .recv = rb,
                      .count = n, .dtype = dt, .op = op, .algo = algo};
    if (place == 2 && n == 0) o.recv = NULL;
    kvps_result rc = algo == KVPS_ALGO_AUTO && place == 0 ? kvps_ring_allreduce(x->r, sb, rb, n, dt, op)
                                                          : kvps_ring_run(x->r, &o);
    if (rk_call(x, rc, what)) {
        check_red(x, what, dt, op, seed, rb, n, 0);
        if (place == 0) {
            char *again = (char *)xmalloc(bytes);
            put_red(dt, op, again, n, seed, x->rank, 0);
            if (memcmp(again, sb, bytes) != 0) rk_fail(x, "%s: rank %d: the send buffer was modified", what, x->rank);
            free(again);
        }
        rk_hash(x, rb, bytes);
    }
    free(sb);
    free(rb);
}

/* place 1: send == recv, 2: send NULL, on every rank: the input is in recv (clobbered on
   non-roots). Out of place, non-roots pass recv = NULL (odd operations) or a buffer that must
   stay untouched. */
static void t_reduce(rk *x, kvps_dtype dt, kvps_redop op, size_t n, int root, int place) {
    if (x->dead) return;
    uint64_t seed = next_seed(x);
    size_t es = kvps_dtype_size(dt), bytes = n * es;
    int me_root = x->rank == root;
    char what[128];
    snprintf(what, sizeof what, "reduce %s %s n=%zu root=%d place=%d", DT_NAME[dt], OP_NAME[op], n, root, place);
    char *sb = (char *)xmalloc(bytes), *rb = (char *)xmalloc(bytes);
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
    if (rk_call(x, kvps_ring_reduce(x->r, s, r, n, dt, op, root), what)) {
        if (me_root) check_red(x, what, dt, op, seed, rb, n, 0);
        else if (place == 0 && r) check_fill(x, what, rb, bytes, 0xEE);
    }
    free(sb);
    free(rb);
}

/* place 1: send == recv holding all count * size inputs; place 2: send NULL, the same. */
static void t_reduce_scatter(rk *x, kvps_dtype dt, kvps_redop op, size_t n, int place) {
    if (x->dead) return;
    uint64_t seed = next_seed(x);
    size_t es = kvps_dtype_size(dt), total = n * (size_t)x->k;
    char what[128];
    snprintf(what, sizeof what, "reduce_scatter %s %s n=%zu place=%d", DT_NAME[dt], OP_NAME[op], n, place);
    char *sb = (char *)xmalloc(total * es), *rb = (char *)xmalloc((place ? total : n) * es);
    put_red(dt, op, place == 0 ? sb : rb, total, seed, x->rank, 0);
    const void *s = place == 0 ? sb : place == 1 ? rb : NULL;
    if (rk_call(x, kvps_ring_reduce_scatter(x->r, s, rb, n, dt, op), what))
        check_red(x, what, dt, op, seed, rb, n, (size_t)x->rank * n);
    free(sb);
    free(rb);
}

/* In place, the rank's block already at recv[rank * count]: place 1 send = recv + rank * count,
   2 send NULL, 3 send == recv. */
static void t_allgather(rk *x, kvps_dtype dt, size_t n, int place) {
    if (x->dead) return;
    uint64_t seed = next_seed(x);
    size_t es = kvps_dtype_size(dt), bytes = n * es;
    char what[128];
    snprintf(what, sizeof what, "allgather %s n=%zu place=%d", DT_NAME[dt], n, place);
    char *sb = (char *)xmalloc(bytes), *rb = (char *)xmalloc(bytes * (size_t)x->k);
    memset(rb, 0xEE, bytes * (size_t)x->k);
    char *mine = rb + (size_t)x->rank * bytes;
    put_raw(dt, place == 0 ? sb : mine, n, seed, x->rank, 0);
    const void *s = place == 0 ? sb : place == 1 ? mine : place == 2 ? NULL : rb;
    if (rk_call(x, kvps_ring_allgather(x->r, s, rb, n, dt), what)) {
        for (int i = 0; i < x->k; i++)
            if (check_raw(x, what, dt, rb + (size_t)i * bytes, n, seed, i, 0)) break;
        rk_hash(x, rb, bytes * (size_t)x->k);
    }
    free(sb);
    free(rb);
}

/* place 0: every rank passes a send buffer (only the root's counts); 1: send == recv; 2: NULL. */
static void t_broadcast(rk *x, kvps_dtype dt, size_t n, int root, int place) {
    if (x->dead) return;
    uint64_t seed = next_seed(x);
    size_t es = kvps_dtype_size(dt), bytes = n * es;
    char what[128];
    snprintf(what, sizeof what, "broadcast %s n=%zu root=%d place=%d", DT_NAME[dt], n, root, place);
    char *sb = (char *)xmalloc(bytes), *rb = (char *)xmalloc(bytes);
    memset(rb, 0xEE, bytes);
    put_raw(dt, place == 0 ? sb : rb, n, seed, x->rank, 0); /* non-roots: data that must not win */
    const void *s = place == 0 ? sb : place == 1 ? rb : NULL;
    if (rk_call(x, kvps_ring_broadcast(x->r, s, rb, n, dt, root), what)) {
        check_raw(x, what, dt, rb, n, seed, root, 0);
        rk_hash(x, rb, bytes);
    }
    free(sb);
    free(rb);
}

/* In place on the root, its block already at recv[root * count]: place 1 send = recv + root *
   count, 2 send NULL, 3 send == recv. Non-roots pass recv = NULL or a buffer that must stay
   untouched. */
static void t_gather(rk *x, kvps_dtype dt, size_t n, int root, int place) {
    if (x->dead) return;
    uint64_t seed = next_seed(x);
    size_t es = kvps_dtype_size(dt), bytes = n * es;
    int me_root = x->rank == root;
    char what[128];
    snprintf(what, sizeof what, "gather %s n=%zu root=%d place=%d", DT_NAME[dt], n, root, place);
    char *sb = (char *)xmalloc(bytes), *rb = (char *)xmalloc(bytes * (size_t)x->k);
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
    if (rk_call(x, kvps_ring_gather(x->r, s, r, n, dt, root), what)) {
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
static void t_scatter(rk *x, kvps_dtype dt, size_t n, int root, int place) {
    if (x->dead) return;
    uint64_t seed = next_seed(x);
    size_t es = kvps_dtype_size(dt), total = n * (size_t)x->k;
    int me_root = x->rank == root;
    char what[128];
    snprintf(what, sizeof what, "scatter %s n=%zu root=%d place=%d", DT_NAME[dt], n, root, place);
    char *sb = (char *)xmalloc(total * es), *rb = (char *)xmalloc((me_root && place ? total : n) * es);
    memset(rb, 0xEE, (me_root && place ? total : n) * es);
    put_raw(dt, me_root && place ? rb : sb, total, seed, x->rank, 0);
    const void *s = me_root ? (place == 0 ? sb : place == 1 ? rb : NULL) : (x->opn & 1) ? sb : NULL;
    if (rk_call(x, kvps_ring_scatter(x->r, s, rb, n, dt, root), what))
        check_raw(x, what, dt, rb, n, seed, root, (size_t)x->rank * n);
    free(sb);
    free(rb);
}

static void t_alltoall(rk *x, kvps_dtype dt, size_t n, int place) {
    if (x->dead) return;
    uint64_t seed = next_seed(x);
    size_t es = kvps_dtype_size(dt), total = n * (size_t)x->k;
    char what[128];
    snprintf(what, sizeof what, "alltoall %s n=%zu place=%d", DT_NAME[dt], n, place);
    char *sb = (char *)xmalloc(total * es), *rb = (char *)xmalloc(total * es);
    memset(rb, 0xEE, total * es);
    put_raw(dt, place == 0 ? sb : rb, total, seed, x->rank, 0);
    const void *s = place == 0 ? sb : place == 1 ? rb : NULL;
    if (rk_call(x, kvps_ring_alltoall(x->r, s, rb, n, dt), what))
        for (int i = 0; i < x->k; i++)
            if (check_raw(x, what, dt, rb + (size_t)i * n * es, n, seed, i, (size_t)x->rank * n)) break;
    free(sb);
    free(rb);
}

/* Nobody leaves a barrier before everyone has entered it (threads only: a shared counter). */
static void t_barrier(rk *x, int rounds) {
    team *t = x->t;
    for (int i = 0; i < rounds && !x->dead; i++) {
        sleep_ms((x->rank * 3 + i) % 4);
        __atomic_add_fetch(&t->counter, 1, __ATOMIC_SEQ_CST);
        if (!rk_call(x, kvps_ring_barrier(x->r), "barrier")) return;
        int seen = __atomic_load_n(&t->counter, __ATOMIC_SEQ_CST);
        if (seen < x->k * (i + 1)) rk_fail(x, "barrier round %d: rank %d left with only %d of %d arrivals", i, x->rank, seen, x->k * (i + 1));
        x->opn++;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* The matrix */

typedef struct suite_cfg {
    kvps_ring_algo algos[6];
    int nalgo;
    int others;   /* run the other collectives too */
    int thin;     /* quick mode: a stride through the dtype x op x count cross product */
} suite_cfg;

/* Every dtype x op x count x algorithm x placement for all-reduce; every root for the rooted
   collectives. Quick mode takes every thin-th combination. */
static void suite_main(rk *x) {
    const suite_cfg *c = (const suite_cfg *)x->t->arg;
    int k = x->k, th = c->thin ? c->thin : 1;
    size_t counts[6] = {0, 1, (size_t)k - 1, (size_t)k + 1, 13, 1031};
    long it = 0;
    for (int dt = 0; dt < 6; dt++)
        for (int op = 0; op < 5; op++)
            for (int ci = 0; ci < 6; ci++)
                for (int ai = 0; ai < c->nalgo; ai++)
                    for (int place = 0; place < 3; place++)
                        if (it++ % th == 0) t_allreduce(x, (kvps_dtype)dt, (kvps_redop)op, counts[ci], c->algos[ai], place);
    if (!c->others) return;
    for (int dt = 0; dt < 6; dt++)
        for (int op = 0; op < 5; op++)
            for (int ci = 0; ci < 6; ci++) {
                for (int root = 0; root < k; root++)
                    if (it++ % th == 0) t_reduce(x, (kvps_dtype)dt, (kvps_redop)op, counts[ci], root, (dt + op + ci + root) % 3);
                for (int place = 0; place < 3; place++)
                    if (it++ % th == 0) t_reduce_scatter(x, (kvps_dtype)dt, (kvps_redop)op, counts[ci], place);
            }
    for (int dt = 0; dt < 6; dt++)
        for (int ci = 0; ci < 6; ci++)
            for (int place = 0; place < 4; place++) {
                size_t n = counts[ci];
                if (it++ % th == 0) t_allgather(x, (kvps_dtype)dt, n, place);
                if (place < 3 && it++ % th == 0) t_alltoall(x, (kvps_dtype)dt, n, place);
                for (int root = 0; root < k; root++) {
                    if (place < 3 && it++ % th == 0) t_broadcast(x, (kvps_dtype)dt, n, root, place);
                    if (it++ % th == 0) t_gather(x, (kvps_dtype)dt, n, root, place);
                    if (place < 3 && it++ % th == 0) t_scatter(x, (kvps_dtype)dt, n, root, place);
                }
            }
    t_barrier(x, 4);
}

static int run_suite(const char *label, int k, const suite_cfg *c, size_t chunk, size_t small, const int *groups) {
    team t;
    team_init(&t, label, suite_main, k, 0, kt_quick() ? 60000 : 20000);
    t.arg = c;
    t.base.chunk_bytes = chunk;
    t.base.small_bytes = small;
    t.base.groups = groups;
    return team_run(&t);
}

static const int GROUPS8[8] = {0, 0, 1, 1, 2, 2, 2, 3};
static const int GROUPS_ALT[8] = {1, 0, 1, 0, 1, 0, 1, 0};

static int matrix_size_included(int k) { return !kt_quick() || k <= 3 || k == 5 || k == 8; }

/* Default pieces (RD for everything here under AUTO; trees for reduce and broadcast). */
static void test_matrix_default(void) {
    suite_cfg c = {{KVPS_ALGO_AUTO, KVPS_ALGO_RING, KVPS_ALGO_BIRING, KVPS_ALGO_RD, KVPS_ALGO_RHD}, 5, 1, kt_quick() ? 5 : 0};
    for (int k = 1; k <= MAXR; k++)
        if (matrix_size_included(k)) run_suite("default", k, &c, 0, 0, NULL);
}

/* 64-byte pieces and a 256-byte small limit: many pieces per block, AUTO picks the ring
   algorithms, reduce and broadcast take their large-message paths. */
static void test_matrix_pipelined(void) {
    suite_cfg c = {{KVPS_ALGO_AUTO, KVPS_ALGO_RING, KVPS_ALGO_BIRING, KVPS_ALGO_RD, KVPS_ALGO_RHD}, 5, 1, kt_quick() ? 11 : 0};
    for (int k = 1; k <= MAXR; k++)
        if (matrix_size_included(k)) run_suite("pipelined", k, &c, 64, 256, NULL);
}

/* Hierarchical: groups {0,0,1,1,2,2,2,3} (cut to the size) and alternating groups; forced HIER
   and AUTO (which picks HIER above small_bytes), with small and large inner messages. */
static void test_matrix_hier(void) {
    suite_cfg c = {{KVPS_ALGO_HIER, KVPS_ALGO_AUTO}, 2, 0, kt_quick() ? 5 : 0};
    for (int k = 1; k <= MAXR; k++) {
        if (!matrix_size_included(k)) continue;
        run_suite("hier", k, &c, 64, 256, GROUPS8);
        if (k == 4 || k == 7) run_suite("hier-alternating", k, &c, 0, 0, GROUPS_ALT);
    }
    suite_cfg one = {{KVPS_ALGO_HIER}, 1, 0, kt_quick() ? 7 : 3};
    run_suite("hier-1-piece-per-element", 5, &one, 1, 1, GROUPS8);
}

/* Messages of 32 KiB and more go out without a copy (ZeroMQ holds the caller's buffer until it
   has sent it; on inproc the receiver reads it in place): nothing may write a buffer before
   its frames are let go. */
static void zc_main(rk *x) {
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

static void run_team(const char *label, void (*fn)(rk *), int k, int tcp, int timeout_ms, const int *groups) {
    team t;
    team_init(&t, label, fn, k, tcp, kt_quick() ? 3 * timeout_ms : timeout_ms);
    t.base.groups = groups;
    team_run(&t);
}

static void test_zero_copy_sizes(void) {
    run_team("zero-copy", zc_main, 2, 0, 20000, NULL);
    run_team("zero-copy", zc_main, 3, 0, 20000, NULL);
    run_team("zero-copy", zc_main, 4, 0, 20000, NULL); /* RHD's halving and doubling */
    if (!kt_quick()) run_team("zero-copy-tcp", zc_main, 4, 1, 20000, NULL);
    if (!kt_quick()) run_team("zero-copy", zc_main, 5, 0, 20000, NULL);
    if (!kt_quick()) run_team("zero-copy-tcp", zc_main, 3, 1, 20000, NULL);
    /* HIER's reduce, leader ring and chain broadcast on big messages */
    if (!kt_quick()) run_team("zero-copy-hier", zc_main, 6, 0, 20000, GROUPS8);
}

/* AVG divides the sum by the number of ranks once, also when the ring's last pieces went out
   without a copy: every dtype, ring, bidirectional ring, AUTO and HIER, inproc and TCP. */
static void avg_zc_main(rk *x) {
    kvps_ring_algo algos[4] = {KVPS_ALGO_RING, KVPS_ALGO_BIRING, x->t->base.groups ? KVPS_ALGO_HIER : KVPS_ALGO_AUTO,
                               KVPS_ALGO_RHD};
    for (int dt = 0; dt < 6; dt++)
        for (int a = 0; a < 4; a++) t_allreduce(x, (kvps_dtype)dt, KVPS_AVG, 100003, algos[a], (dt + a) % 3);
}

static void test_avg_zero_copy(void) {
    run_team("avg 100003 elements", avg_zc_main, 2, 0, 20000, NULL);
    if (!kt_quick()) run_team("avg 100003 elements", avg_zc_main, 3, 0, 20000, NULL);
    if (!kt_quick()) run_team("avg 100003 elements tcp", avg_zc_main, 3, 1, 20000, NULL);
    if (!kt_quick()) run_team("avg 100003 elements hier", avg_zc_main, 4, 0, 20000, GROUPS8);
}

/* reduce_scatter in place (send NULL, everything in recv) with 80 KB blocks. */
static void rs_zc_main(rk *x) {
    for (int rep = 0; rep < 3; rep++) t_reduce_scatter(x, KVPS_FLOAT32, KVPS_SUM, 20011, 2);
}

static void test_reduce_scatter_inplace_zero_copy(void) {
    for (int k = 2; k <= 4; k++) run_team("reduce_scatter send NULL 20011 elements", rs_zc_main, k, 0, 20000, NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* 64 MB: 16M float32 on 4 ranks over loopback TCP. Small integers, so the sum is exact. */

static size_t big_n(void) { return kt_quick() ? (size_t)1 << 20 : (size_t)16 << 20; }
static float big_val(int r, size_t i) { return (float)((int)(((uint32_t)i * 2654435761u + (uint32_t)r * 40503u) >> 27) - 16); }

static void big_main(rk *x) {
    size_t n = big_n();
    float *b = (float *)xmalloc(n * sizeof *b);
    for (size_t i = 0; i < n; i++) b[i] = big_val(x->rank, i);
    int64_t t0 = kvps__now_ms();
    if (rk_call(x, kvps_ring_allreduce(x->r, NULL, b, n, KVPS_FLOAT32, KVPS_SUM), "64 MB allreduce")) {
        x->ms1 = kvps__now_ms() - t0;
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int r = 0; r < x->k; r++) want += big_val(r, i);
            if (b[i] != want && bad++ == 0) rk_fail(x, "64 MB allreduce: [%zu] = %g, want %g", i, b[i], want);
        }
        if (bad) rk_fail(x, "64 MB allreduce: %zu wrong", bad);
        rk_hash(x, b, n * sizeof *b);
    }
    free(b);
}

static void test_64mb_tcp(void) {
    team t;
    team_init(&t, "64MB-tcp", big_main, 4, 1, 120000);
    team_run(&t);
    printf("  info: all-reduce of %zu MB float32 on 4 ranks over loopback TCP: %lld ms\n", big_n() * 4 >> 20,
           (long long)t.ranks[0].ms1);
}

/* ---------------------------------------------------------------------------------------- */
/* Processes on loopback TCP: a kvps server process for the rendezvous, then `size` rank
   processes; no process forks with a live ZeroMQ context. */

static kvps_server *g_srv;
static void on_term(int sig) { (void)sig; if (g_srv) kvps_server_stop(g_srv); }

/* Forks a kvps server for `workers` workers; returns its pid and writes its endpoint. */
static pid_t spawn_server(int workers, char *ep, size_t cap) {
    int p[2];
    if (pipe(p) != 0) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        signal(SIGTERM, on_term);
        kvps_result r = kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = workers}, &g_srv);
        const char *e = r == KVPS_OK ? kvps_server_endpoint(g_srv) : "";
        if (write(p[1], e, strlen(e) + 1) < 0) _exit(3);
        close(p[1]);
        if (r != KVPS_OK) _exit(2);
        kvps_server_run(g_srv);
        kvps_server_destroy(&g_srv);
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
static int wait_until(pid_t pid, int64_t deadline) {
    int st = 0;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) return st;
        if (w < 0) return -2;
        if (kvps__now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        sleep_ms(5);
    }
}

static void stop_server(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    int st = wait_until(pid, kvps__now_ms() + 10000);
    KT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "server process status %d", st);
}

/* A rank that is to die writes to g_die_pipe and waits for the parent's SIGKILL (a death from
   outside: no exit path runs, no leak report from valgrind). */
static int g_die_before;
static int g_die_pipe[2] = {-1, -1};

static void die_now(void) {
    if (write(g_die_pipe[1], "x", 1) < 0) _exit(4);
    for (;;) pause();
}

/* A rank process: worker for the rendezvous, ring on an ephemeral port, then `fn`. */
typedef struct proc_cfg {
    const char *server;
    int size, timeout_ms;
    void (*fn)(rk *);
} proc_cfg;

static int proc_rank(const proc_cfg *c, int rank) {
    team t;
    memset(&t, 0, sizeof t);
    t.label = "process";
    t.k = c->size;
    rk *x = &t.ranks[0];
    x->t = &t;
    x->rank = rank;
    x->k = c->size;
    kvps_worker *w = NULL;
    char peers[MAXR * 64];
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
            rk_fail(x, "rendezvous gave '%s' (rank %d is %s)", peers, rank, kvps_ring_endpoint(x->r));
        kvps__free_strv(eps, n > 0 ? n : 0);
        rc = kvps_ring_connect(x->r, peers);
    }
    kvps_worker_destroy(&w);
    if (rc != KVPS_OK) rk_fail(x, "setup: %s", kvps_result_str(rc));
    else c->fn(x);
    kvps_ring_destroy(&x->r);
    free(x->hash);
    if (x->fails) printf("  process rank %d of %d: %d failures; first: %s\n", rank, c->size, x->fails, x->why);
    fflush(stdout);
    return x->fails ? 1 : 0;
}

static void proc_suite(rk *x) {
    int k = x->k;
    size_t counts[5] = {0, 1, (size_t)k + 1, 1031, 65537};
    int it = 0, th = kt_quick() ? 7 : 1;
    for (int dt = 0; dt < 6; dt++)
        for (int op = 0; op < 5; op++)
            for (int ci = 0; ci < 5; ci++)
                if (it++ % th == 0)
                    t_allreduce(x, (kvps_dtype)dt, (kvps_redop)op, counts[ci], KVPS_ALGO_AUTO, (dt + op + ci) % 3);
    t_allreduce(x, KVPS_FLOAT32, KVPS_SUM, 300007, KVPS_ALGO_RING, 0);
    t_allreduce(x, KVPS_INT32, KVPS_SUM, 1031, KVPS_ALGO_RD, 1);
    for (int ci = 0; ci < 5; ci++) {
        size_t n = counts[ci];
        t_reduce(x, KVPS_FLOAT32, KVPS_SUM, n, k - 1, ci % 3);
        t_reduce_scatter(x, KVPS_INT64, KVPS_SUM, n / 4 + 1, ci % 3);
        t_allgather(x, KVPS_FLOAT16, n, ci % 4);
        t_broadcast(x, KVPS_FLOAT64, n, ci % k, ci % 3);
        t_gather(x, KVPS_INT32, n / 4, (ci + 1) % k, ci % 4);
        t_scatter(x, KVPS_BFLOAT16, n / 4, (ci + 2) % k, ci % 3);
        t_alltoall(x, KVPS_FLOAT32, n / 8, ci % 3);
        if (!x->dead) rk_call(x, kvps_ring_barrier(x->r), "barrier");
    }
}

/* expect_dead: the rank that asks to be killed (through g_die_pipe), or -1. */
static void run_processes(int size, void (*fn)(rk *), int timeout_ms, int limit_s, int expect_dead) {
    char ep[256];
    pid_t srv = spawn_server(size, ep, sizeof ep);
    KT_CHECK(srv > 0 && ep[0], "server did not start");
    if (srv <= 0 || !ep[0]) { stop_server(srv); return; }
    proc_cfg c = {ep, size, timeout_ms, fn};
    pid_t pid[MAXR];
    fflush(stdout);
    for (int r = 0; r < size; r++) {
        pid[r] = fork();
        if (pid[r] == 0) exit(proc_rank(&c, r));
    }
    int64_t deadline = kvps__now_ms() + (int64_t)limit_s * 1000 * (kt_quick() ? 4 : 1);
    if (expect_dead >= 0) {
        struct pollfd pf = {g_die_pipe[0], POLLIN, 0};
        char byte;
        int asked = poll(&pf, 1, limit_s * 1000) == 1 && read(g_die_pipe[0], &byte, 1) == 1;
        KT_CHECK(asked, "size %d: rank %d never got to the point where it dies", size, expect_dead);
        kill(pid[expect_dead], SIGKILL);
    }
    for (int r = 0; r < size; r++) {
        int st = wait_until(pid[r], deadline);
        KT_CHECK(st != -1, "size %d: rank process %d still running after %d s: killed", size, r, limit_s);
        if (r != expect_dead)
            KT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "size %d: rank process %d status %d", size, r, st);
    }
    stop_server(srv);
}

static void test_processes_tcp(void) {
    int sizes[4] = {2, 3, 8, 4};
    for (int i = 0; i < (kt_quick() ? 3 : 4); i++) run_processes(sizes[i], proc_suite, 30000, 120, -1);
}

/* ---------------------------------------------------------------------------------------- */
/* Failures: a dead rank, mismatched calls. Each runs in a child process with a time limit, so
   a hang is reported as one. */

static void run_isolated(void (*fn)(void), int limit_s) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        kt_cur_failed = 0;
        fn();
        fflush(stdout);
        exit(kt_cur_failed ? 1 : 0);
    }
    int st = wait_until(pid, kvps__now_ms() + (int64_t)limit_s * 1000 * (kt_quick() ? 2 : 1));
    KT_CHECK(st != -1, "still running after %d s: killed (a hang)", limit_s * (kt_quick() ? 2 : 1));
    if (st != -1) KT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d (failures above)", st);
}

/* The timeout of rings expected to fail (longer under valgrind, where a barrier between
   processes may take a second). */
static int fail_timeout_ms(void) { return kt_quick() ? 2000 : 500; }

/* An error, within 5 timeouts (a hang check, not a speed check), with a message, after which
   the ring is broken. */
static void check_failed_rank(rk *x, const char *what, kvps_result rc, int64_t ms) {
    int timeout_ms = x->r->desc.timeout_ms;
    if (rc == KVPS_OK) { rk_fail(x, "%s: rank %d returned KVPS_OK", what, x->rank); return; }
    if (ms > 5 * (int64_t)timeout_ms)
        rk_fail(x, "%s: rank %d took %lld ms to fail (timeout %d)", what, x->rank, (long long)ms, timeout_ms);
    if (!kvps_ring_last_error(x->r)[0]) rk_fail(x, "%s: rank %d: kvps_ring_last_error is empty", what, x->rank);
    kvps_result again = kvps_ring_barrier(x->r);
    if (again != KVPS_ERR_STATE) rk_fail(x, "%s: rank %d: the next call after an error gave %s, want KVPS_ERR_STATE", what, x->rank, kvps_result_str(again));
}

/* Thread ranks: the last rank destroys its ring after a barrier; the others all-reduce. */
static void dead_main(rk *x) {
    team *t = x->t;
    if (!rk_call(x, kvps_ring_barrier(x->r), "barrier")) return;
    if (x->rank == x->k - 1) {
        kvps_ring_destroy(&x->r);
        __atomic_store_n(&t->flag, 1, __ATOMIC_SEQ_CST);
        return;
    }
    while (!__atomic_load_n(&t->flag, __ATOMIC_SEQ_CST)) sleep_ms(1);
    float *b = (float *)xmalloc(4096 * sizeof *b);
    for (int i = 0; i < 4096; i++) b[i] = (float)i;
    int64_t t0 = kvps__now_ms();
    kvps_result rc = kvps_ring_allreduce(x->r, NULL, b, 4096, KVPS_FLOAT32, KVPS_SUM);
    int64_t ms = kvps__now_ms() - t0;
    if (rc != KVPS_ERR_TIMEOUT && rc != KVPS_ERR_PEER)
        rk_fail(x, "rank %d: %s, want KVPS_ERR_TIMEOUT or KVPS_ERR_PEER", x->rank, kvps_result_str(rc));
    check_failed_rank(x, "dead rank", rc, ms);
    free(b);
}

static void dead_threads_body(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    int sizes[2] = {3, 4};
    for (int i = 0; i < 2; i++) {
        team t;
        team_init(&t, "dead-thread", dead_main, sizes[i], 0, fail_timeout_ms());
        t.base.algo = i ? KVPS_ALGO_RING : KVPS_ALGO_AUTO;
        team_run(&t);
    }
}

static void test_dead_rank_thread(void) { run_isolated(dead_threads_body, 10); }

/* Process ranks: the last one is killed (SIGKILL, by the parent) before the all-reduce
   (g_die_before), or 2 ms after its posted all-reduce has started running (16 MB: far from
   done). The others must fail within 5 timeouts: with a timeout this short the all-reduce may
   time out on its own on a slow machine, which is also an error in time. */
static void dead_proc_main(rk *x) {
    if (!rk_call(x, kvps_ring_barrier(x->r), "barrier")) return;
    size_t n = (size_t)4 << 20;
    float *b = (float *)xmalloc(n * sizeof *b);
    for (size_t i = 0; i < n; i++) b[i] = 1.0f;
    if (x->rank == x->k - 1) {
        fflush(stdout);
        if (g_die_before) die_now();
        kvps_ring_op o = {.coll = KVPS_COLL_ALLREDUCE, .recv = b, .count = n, .dtype = KVPS_FLOAT32, .op = KVPS_SUM};
        kvps_ring_req q;
        kvps_ring_post(x->r, &o, &q);
        for (int busy = 0; !busy;) {
            pthread_mutex_lock(&x->r->mu);
            busy = x->r->busy;
            pthread_mutex_unlock(&x->r->mu);
        }
        sleep_ms(2);
        die_now();
    }
    int64_t t0 = kvps__now_ms();
    kvps_result rc = kvps_ring_allreduce(x->r, NULL, b, n, KVPS_FLOAT32, KVPS_SUM);
    int64_t ms = kvps__now_ms() - t0;
    if (rc != KVPS_ERR_TIMEOUT && rc != KVPS_ERR_PEER)
        rk_fail(x, "rank %d: %s, want KVPS_ERR_TIMEOUT or KVPS_ERR_PEER", x->rank, kvps_result_str(rc));
    check_failed_rank(x, "rank process died", rc, ms);
    free(b);
}

static void test_dead_rank_process(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    if (pipe(g_die_pipe) != 0) { KT_CHECK(0, "pipe"); return; }
    g_die_before = 1;
    run_processes(3, dead_proc_main, 2 * fail_timeout_ms(), 60, 2);
    g_die_before = 0;
    run_processes(3, dead_proc_main, 2 * fail_timeout_ms(), 60, 2);
    if (!kt_quick()) run_processes(4, dead_proc_main, 2 * fail_timeout_ms(), 60, 3);
    close(g_die_pipe[0]);
    close(g_die_pipe[1]);
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

static void mm_main(rk *x) {
    const mm_case *c = (const mm_case *)x->t->arg;
    if (!rk_call(x, kvps_ring_barrier(x->r), "barrier")) return;
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
            rk_fail(x, "%s: rank %d returned KVPS_OK, then its next call gave %s, want KVPS_ERR_MISMATCH or KVPS_ERR_PEER "
                    "[%s]", c->name, x->rank, kvps_result_str(x->rc2), kvps_ring_last_error(x->r));
        if (ms > 5 * (int64_t)x->r->desc.timeout_ms)
            rk_fail(x, "%s: rank %d's next call took %lld ms to fail", c->name, x->rank, (long long)ms);
        if (x->rc2 == KVPS_ERR_MISMATCH) snprintf(x->err1, sizeof x->err1, "%s", kvps_ring_last_error(x->r));
    } else {
        check_failed_rank(x, c->name, x->rc1, x->ms1);
    }
    free(sb);
    free(rb);
}

static void mismatch_body(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    for (size_t i = 0; i < g_mm_n; i++) {
        const mm_case *c = &g_mm_cases[i];
        team t;
        team_init(&t, c->name, mm_main, 3, 0, fail_timeout_ms());
        t.arg = c;
        team_run(&t);
        int nmm = 0;
        char got[200] = "";
        for (int r = 0; r < t.k; r++) {
            kvps_result rc = t.ranks[r].rc1;
            nmm += rc == KVPS_ERR_MISMATCH || t.ranks[r].rc2 == KVPS_ERR_MISMATCH;
            snprintf(got + strlen(got), sizeof got - strlen(got), " %d:%d", r, (int)rc);
            KT_CHECK(rc == KVPS_ERR_MISMATCH || rc == KVPS_ERR_PEER || rc == KVPS_ERR_TIMEOUT || rc == KVPS_OK,
                     "%s: rank %d: %s", c->name, r, kvps_result_str(rc));
            if (rc == KVPS_ERR_MISMATCH || t.ranks[r].rc2 == KVPS_ERR_MISMATCH)
                KT_CHECK(strstr(t.ranks[r].err1, "coll") || strstr(t.ranks[r].err1, "bytes"),
                         "%s: rank %d's message does not name the call: '%s'", c->name, r, t.ranks[r].err1);
        }
        if (c->need_mismatch)
            KT_CHECK(nmm > 0, "%s: no rank reported KVPS_ERR_MISMATCH (rank:result%s; -203 timeout, -204 peer); "
                     "rank %d said '%s'", c->name, got, c->odd, t.ranks[c->odd].err1);
    }
}

#define MM_RUN(cases) do { g_mm_cases = cases; g_mm_n = sizeof cases / sizeof cases[0]; run_isolated(mismatch_body, 30); } while (0)
static void test_mismatch_same_path(void) { MM_RUN(MM_SAME_PATH); }
static void test_mismatch_send_only_ranks(void) { MM_RUN(MM_SEND_ONLY); }
static void test_mismatch_zero_copy_error_path(void) { MM_RUN(MM_ZERO_COPY); }
static void test_mismatch_other_path(void) { MM_RUN(MM_OTHER_PATH); }
static void test_mismatch_count_zero(void) { MM_RUN(MM_COUNT_ZERO); }

/* ---------------------------------------------------------------------------------------- */
/* Non-blocking */

static void nb_main(rk *x) {
    int k = x->k, me = x->rank;
    size_t n1 = 1031, n2 = 77, n3 = 13;
    float *a = (float *)xmalloc(n1 * sizeof *a), *ar = (float *)xmalloc(n1 * sizeof *ar);
    int64_t *b = (int64_t *)xmalloc(n2 * sizeof *b);
    double *c = (double *)xmalloc(n3 * sizeof *c), *cr = (double *)xmalloc(n3 * (size_t)k * sizeof *cr);
    int32_t *d = (int32_t *)xmalloc(n3 * (size_t)k * sizeof *d);
    for (size_t i = 0; i < n1; i++) a[i] = (float)(me + 1) * (float)(i % 7);
    for (size_t i = 0; i < n2; i++) b[i] = me == 1 ? (int64_t)i * 1000003 : -1;
    for (size_t i = 0; i < n3; i++) c[i] = me * 100.0 + (double)i;
    for (size_t i = 0; i < n3 * (size_t)k; i++) d[i] = (int32_t)((size_t)me * 1000 + i);
    kvps_ring_op ops[5] = {
        {.coll = KVPS_COLL_ALLREDUCE, .send = a, .recv = ar, .count = n1, .dtype = KVPS_FLOAT32, .algo = KVPS_ALGO_RING},
        {.coll = KVPS_COLL_BROADCAST, .recv = b, .count = n2, .dtype = KVPS_INT64, .root = 1},
        {.coll = KVPS_COLL_ALLGATHER, .send = c, .recv = cr, .count = n3, .dtype = KVPS_FLOAT64},
        {.coll = KVPS_COLL_REDUCE_SCATTER, .recv = d, .count = n3, .dtype = KVPS_INT32, .op = KVPS_MAX},
        {.coll = KVPS_COLL_BARRIER},
    };
    kvps_ring_req q[5];
    for (int i = 0; i < 5; i++) {
        kvps_result rc = kvps_ring_post(x->r, &ops[i], &q[i]);
        if (rc != KVPS_OK || q[i] == 0) rk_fail(x, "post %d: %s", i, kvps_result_str(rc));
    }
    /* the last by test(), then the rest in reverse order by wait() */
    int done = 0;
    for (int spin = 0; spin < 200000 && !done; spin++) {
        kvps_result rc = kvps_ring_test(x->r, q[4], &done);
        if (rc != KVPS_OK) { rk_fail(x, "test: %s", kvps_result_str(rc)); break; }
        if (!done) sleep_ms(1);
    }
    if (!done) rk_fail(x, "rank %d: barrier never completed", me);
    for (int i = 3; i >= 0; i--) {
        kvps_result rc = kvps_ring_wait(x->r, q[i], -1);
        if (rc != KVPS_OK) rk_fail(x, "wait %d: %s", i, kvps_result_str(rc));
    }
    for (size_t i = 0; i < n1; i++) {
        float want = 0;
        for (int r = 0; r < k; r++) want += (float)(r + 1) * (float)(i % 7);
        if (ar[i] != want) { rk_fail(x, "posted allreduce [%zu] = %g want %g", i, ar[i], want); break; }
    }
    for (size_t i = 0; i < n2; i++)
        if (b[i] != (int64_t)i * 1000003) { rk_fail(x, "posted broadcast [%zu] = %lld", i, (long long)b[i]); break; }
    for (int r = 0; r < k; r++)
        for (size_t i = 0; i < n3; i++)
            if (cr[(size_t)r * n3 + i] != r * 100.0 + (double)i) { rk_fail(x, "posted allgather [%d][%zu]", r, i); r = k; break; }
    for (size_t i = 0; i < n3; i++)
        if (d[i] != (int32_t)((size_t)(k - 1) * 1000 + (size_t)me * n3 + i)) { rk_fail(x, "posted reduce_scatter [%zu] = %d", i, d[i]); break; }
    /* handles: completed, zero, never issued */
    if (kvps_ring_wait(x->r, q[0], 0) != KVPS_ERR_INVALID_REQ) rk_fail(x, "wait on a completed handle is not INVALID_REQ");
    if (kvps_ring_wait(x->r, 0, 0) != KVPS_ERR_INVALID_REQ) rk_fail(x, "wait on handle 0 is not INVALID_REQ");
    if (kvps_ring_wait(x->r, 987654321, 10) != KVPS_ERR_INVALID_REQ) rk_fail(x, "wait on an unknown handle is not INVALID_REQ");
    done = 7;
    if (kvps_ring_test(x->r, 987654321, &done) != KVPS_ERR_INVALID_REQ || done != 0) rk_fail(x, "test on an unknown handle");
    /* a posted op, then a blocking call behind it, then the wait */
    for (size_t i = 0; i < n1; i++) a[i] = (float)me;
    kvps_ring_req q1;
    kvps_ring_op o1 = {.coll = KVPS_COLL_ALLREDUCE, .recv = a, .count = n1, .dtype = KVPS_FLOAT32, .op = KVPS_MAX};
    if (kvps_ring_post(x->r, &o1, &q1) != KVPS_OK) rk_fail(x, "post");
    for (size_t i = 0; i < n3; i++) c[i] = 1.5;
    if (!rk_call(x, kvps_ring_allreduce(x->r, NULL, c, n3, KVPS_FLOAT64, KVPS_SUM), "blocking behind posted")) goto out;
    if (kvps_ring_wait(x->r, q1, -1) != KVPS_OK) rk_fail(x, "wait q1");
    for (size_t i = 0; i < n1; i++)
        if (a[i] != (float)(k - 1)) { rk_fail(x, "posted max [%zu] = %g", i, a[i]); break; }
    for (size_t i = 0; i < n3; i++)
        if (c[i] != 1.5 * k) { rk_fail(x, "blocking sum [%zu] = %g", i, c[i]); break; }
    /* wait with a timeout: rank 0 posts first and the others come 300 ms later */
    if (me != 0) sleep_ms(300);
    for (size_t i = 0; i < n3; i++) c[i] = 2.0;
    kvps_ring_op o2 = {.coll = KVPS_COLL_ALLREDUCE, .recv = c, .count = n3, .dtype = KVPS_FLOAT64, .op = KVPS_SUM};
    if (kvps_ring_post(x->r, &o2, &q1) != KVPS_OK) rk_fail(x, "post o2");
    if (me == 0) {
        kvps_result rc = kvps_ring_wait(x->r, q1, 50);
        if (rc != KVPS_ERR_TIMEOUT) rk_fail(x, "wait(50 ms) on an op the others have not joined: %s", kvps_result_str(rc));
        done = 1;
        rc = kvps_ring_test(x->r, q1, &done);
        if (rc != KVPS_OK || done) rk_fail(x, "test on a pending op: %s done=%d", kvps_result_str(rc), done);
    }
    if (kvps_ring_wait(x->r, q1, -1) != KVPS_OK) rk_fail(x, "wait o2");
    for (size_t i = 0; i < n3; i++)
        if (c[i] != 2.0 * k) { rk_fail(x, "o2 [%zu] = %g", i, c[i]); break; }
    /* an invalid op is refused at post and gives no handle */
    kvps_ring_op bad = {.coll = KVPS_COLL_ALLREDUCE, .recv = c, .count = n3, .dtype = (kvps_dtype)9};
    q1 = 77;
    if (kvps_ring_post(x->r, &bad, &q1) != KVPS_ERR_INVALID_ARG || q1 != 0) rk_fail(x, "post of a bad dtype");
    /* an op still queued at destroy runs first: destroy returns after it, buffers released */
    for (size_t i = 0; i < n3; i++) c[i] = 1.0;
    if (kvps_ring_post(x->r, &o2, &q1) != KVPS_OK) rk_fail(x, "post o2 again");
    kvps_ring_destroy(&x->r);
    for (size_t i = 0; i < n3; i++)
        if (c[i] != 1.0 * k) { rk_fail(x, "op queued at destroy: [%zu] = %g", i, c[i]); break; }
out:
    free(a); free(ar); free(b); free(c); free(cr); free(d);
}

static void test_nonblocking(void) {
    team t;
    team_init(&t, "nonblocking", nb_main, 3, 0, kt_quick() ? 60000 : 10000);
    team_run(&t);
}

/* ---------------------------------------------------------------------------------------- */
/* Arguments, descs, environment */

static void badarg_main(rk *x) {
    kvps_ring *r = x->r;
    float f[8] = {0}, g[16] = {0};
    kvps_ring_req req = 0;
    if (x->rank == 0) {
        struct { const char *name; kvps_result rc; } c[] = {
            {"dtype 6", kvps_ring_allreduce(r, f, g, 8, (kvps_dtype)6, KVPS_SUM)},
            {"dtype -1", kvps_ring_allreduce(r, f, g, 8, (kvps_dtype)-1, KVPS_SUM)},
            {"op 5", kvps_ring_allreduce(r, f, g, 8, KVPS_FLOAT32, (kvps_redop)5)},
            {"op -1", kvps_ring_reduce(r, f, g, 8, KVPS_FLOAT32, (kvps_redop)-1, 0)},
            {"allreduce recv NULL", kvps_ring_allreduce(r, f, NULL, 8, KVPS_FLOAT32, KVPS_SUM)},
            {"reduce root -1", kvps_ring_reduce(r, f, g, 8, KVPS_FLOAT32, KVPS_SUM, -1)},
            {"reduce root = size", kvps_ring_reduce(r, f, g, 8, KVPS_FLOAT32, KVPS_SUM, x->k)},
            {"reduce root's recv NULL", kvps_ring_reduce(r, f, NULL, 8, KVPS_FLOAT32, KVPS_SUM, 0)},
            {"reduce non-root send and recv NULL", kvps_ring_reduce(r, NULL, NULL, 8, KVPS_FLOAT32, KVPS_SUM, 1)},
            {"reduce_scatter recv NULL", kvps_ring_reduce_scatter(r, g, NULL, 8, KVPS_FLOAT32, KVPS_SUM)},
            {"allgather recv NULL", kvps_ring_allgather(r, f, NULL, 8, KVPS_FLOAT32)},
            {"broadcast recv NULL", kvps_ring_broadcast(r, f, NULL, 8, KVPS_FLOAT32, 0)},
            {"broadcast root 2", kvps_ring_broadcast(r, f, g, 8, KVPS_FLOAT32, 2)},
            {"gather root's recv NULL", kvps_ring_gather(r, f, NULL, 8, KVPS_FLOAT32, 0)},
            {"gather non-root send NULL", kvps_ring_gather(r, NULL, g, 8, KVPS_FLOAT32, 1)},
            {"scatter recv NULL", kvps_ring_scatter(r, g, NULL, 8, KVPS_FLOAT32, 0)},
            {"alltoall recv NULL", kvps_ring_alltoall(r, g, NULL, 8, KVPS_FLOAT32)},
            {"count 2^40", kvps_ring_allreduce(r, f, g, (size_t)1 << 40, KVPS_FLOAT32, KVPS_SUM)},
            {"ring NULL", kvps_ring_allreduce(NULL, f, g, 8, KVPS_FLOAT32, KVPS_SUM)},
            {"barrier NULL", kvps_ring_barrier(NULL)},
            {"run op NULL", kvps_ring_run(r, NULL)},
            {"run coll 0", kvps_ring_run(r, &(kvps_ring_op){.coll = (kvps_coll)0, .recv = g, .count = 1})},
            {"run coll 10", kvps_ring_run(r, &(kvps_ring_op){.coll = (kvps_coll)10, .recv = g, .count = 1})},
            {"run algo 6", kvps_ring_run(r, &(kvps_ring_op){.coll = KVPS_COLL_ALLREDUCE, .recv = g, .count = 1, .algo = (kvps_ring_algo)6})},
            {"post out NULL", kvps_ring_post(r, &(kvps_ring_op){.coll = KVPS_COLL_ALLREDUCE, .recv = g, .count = 1}, NULL)},
            {"post ring NULL", kvps_ring_post(NULL, &(kvps_ring_op){.coll = KVPS_COLL_ALLREDUCE, .recv = g, .count = 1}, &req)},
            {"wait ring NULL", kvps_ring_wait(NULL, 1, 0)},
            {"test done NULL", kvps_ring_test(r, 1, NULL)},
            {"connect peers NULL", kvps_ring_connect(r, NULL)},
        };
        for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
            if (c[i].rc != KVPS_ERR_INVALID_ARG) rk_fail(x, "%s: %s, want KVPS_ERR_INVALID_ARG", c[i].name, kvps_result_str(c[i].rc));
        kvps_result rc = kvps_ring_connect(r, "inproc://a,inproc://b");
        if (rc != KVPS_ERR_STATE) rk_fail(x, "second connect: %s, want KVPS_ERR_STATE", kvps_result_str(rc));
        /* count 0 needs no buffers */
        if (!rk_call(x, kvps_ring_allreduce(r, NULL, NULL, 0, KVPS_FLOAT32, KVPS_SUM), "count 0, NULL buffers")) return;
    } else {
        if (!rk_call(x, kvps_ring_allreduce(r, NULL, NULL, 0, KVPS_FLOAT32, KVPS_SUM), "count 0, NULL buffers")) return;
    }
    /* nothing above reached the wire: the ring still works, in step */
    for (int i = 0; i < 8; i++) f[i] = (float)(x->rank + i);
    if (rk_call(x, kvps_ring_allreduce(r, NULL, f, 8, KVPS_FLOAT32, KVPS_SUM), "allreduce after bad calls"))
        for (int i = 0; i < 8; i++)
            if (f[i] != (float)(1 + 2 * i)) { rk_fail(x, "after bad calls [%d] = %g", i, f[i]); break; }
}

static void test_bad_arguments(void) {
    team t;
    team_init(&t, "bad-arguments", badarg_main, 2, 0, 10000);
    team_run(&t);
}

static void test_bad_desc(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    void *ctx = zmq_ctx_new();
    kvps_ring *r = (kvps_ring *)&r;
    struct { const char *name; kvps_ring_desc d; kvps_result want; } c[] = {
        {"size 0", {.rank = 0, .size = 0, .bind = "inproc://bd"}, KVPS_ERR_CONFIG},
        {"rank -1", {.rank = -1, .size = 2, .bind = "inproc://bd"}, KVPS_ERR_CONFIG},
        {"rank = size", {.rank = 2, .size = 2, .bind = "inproc://bd"}, KVPS_ERR_CONFIG},
        {"size 65536", {.rank = 0, .size = 65536, .bind = "inproc://bd"}, KVPS_ERR_CONFIG},
        {"timeout -1", {.rank = 0, .size = 2, .bind = "inproc://bd", .timeout_ms = -1}, KVPS_ERR_CONFIG},
        {"algo 6", {.rank = 0, .size = 2, .bind = "inproc://bd", .algo = (kvps_ring_algo)6}, KVPS_ERR_CONFIG},
        {"no peers, no bind", {.rank = 0, .size = 2}, KVPS_ERR_CONFIG},
        {"3 peers for 2 ranks", {.rank = 0, .size = 2, .peers = "inproc://x0,inproc://x1,inproc://x2"}, KVPS_ERR_CONFIG},
        {"1 peer for 2 ranks", {.rank = 0, .size = 2, .peers = "inproc://x0"}, KVPS_ERR_CONFIG},
        {"empty peer entry", {.rank = 0, .size = 2, .peers = "inproc://x0,"}, KVPS_ERR_CONFIG},
        {"unbindable", {.rank = 0, .size = 2, .bind = "nonsense://x"}, KVPS_ERR_BIND},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        c[i].d.zmq_ctx = ctx;
        r = (kvps_ring *)&r;
        kvps_result rc = kvps_ring_create(&c[i].d, &r);
        KT_CHECK(rc == c[i].want, "%s: %s, want %s", c[i].name, kvps_result_str(rc), kvps_result_str(c[i].want));
        KT_CHECK(r == NULL, "%s: *out not NULL", c[i].name);
        if (rc == KVPS_OK) kvps_ring_destroy(&r);
    }
    KT_CHECK(kvps_ring_create(NULL, &r) == KVPS_ERR_INVALID_ARG, "NULL desc");
    KT_CHECK(kvps_ring_create(&(kvps_ring_desc){.size = 1, .bind = "inproc://bd"}, NULL) == KVPS_ERR_INVALID_ARG, "NULL out");
    /* bound but not connected: collectives refuse; connect checks its list */
    KT_OK(kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 2, .bind = "inproc://bd-ok", .zmq_ctx = ctx}, &r));
    if (r) {
        KT_CHECK(strcmp(kvps_ring_endpoint(r), "inproc://bd-ok") == 0, "endpoint '%s'", kvps_ring_endpoint(r));
        float v = 1;
        KT_CHECK(kvps_ring_allreduce(r, NULL, &v, 1, KVPS_FLOAT32, KVPS_SUM) == KVPS_ERR_STATE, "collective before connect");
        KT_CHECK(kvps_ring_last_error(r)[0] != 0, "no message for the state error");
        KT_CHECK(kvps_ring_connect(r, "inproc://bd-ok") == KVPS_ERR_CONFIG, "connect with 1 endpoint for 2 ranks");
        kvps_ring_destroy(&r);
        KT_CHECK(r == NULL, "destroy sets NULL");
    }
    kvps_ring_destroy(&r);
    kvps_ring_destroy(NULL);
    KT_CHECK(kvps_ring_endpoint(NULL) == NULL, "endpoint(NULL)");
    KT_CHECK(kvps_ring_last_error(NULL) != NULL, "last_error(NULL)");
    /* a ring of one, with its own context: everything is local */
    KT_OK(kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 1, .peers = "tcp://127.0.0.1:*"}, &r));
    if (r) {
        double d[3] = {1, 2, 3}, e[3] = {0, 0, 0};
        KT_OK(kvps_ring_allreduce(r, d, e, 3, KVPS_FLOAT64, KVPS_AVG));
        KT_CHECK(e[0] == 1 && e[1] == 2 && e[2] == 3, "size-1 avg %g %g %g", e[0], e[1], e[2]);
        KT_OK(kvps_ring_barrier(r));
        kvps_ring_destroy(&r);
    }
    KT_CHECK(kvps_dtype_size(KVPS_FLOAT32) == 4 && kvps_dtype_size(KVPS_FLOAT64) == 8 && kvps_dtype_size(KVPS_INT32) == 4 &&
             kvps_dtype_size(KVPS_INT64) == 8 && kvps_dtype_size(KVPS_FLOAT16) == 2 && kvps_dtype_size(KVPS_BFLOAT16) == 2 &&
             kvps_dtype_size((kvps_dtype)6) == 0 && kvps_dtype_size((kvps_dtype)-1) == 0, "kvps_dtype_size");
    zmq_ctx_term(ctx);
    kvps_log_set_level(KVPS_LOG_ERROR);
}

/* ---- .io_cpus: the ring's ZeroMQ I/O threads pinned ------------------------------------------ */

/* Thread ids of this process's ZeroMQ I/O threads (named "ZMQbg/IO/<n>" by libzmq). */
static int zmq_io_tids(pid_t *tids, int cap) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char path[300], comm[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
        fclose(f);
        if (strncmp(comm, "ZMQbg/IO/", 9) == 0 && n < cap) tids[n++] = (pid_t)atoi(e->d_name);
    }
    closedir(d);
    return n;
}

typedef struct tidset { pid_t t[64]; int n; } tidset;

static int tid_in(const tidset *s, pid_t t) {
    for (int j = 0; j < s->n; j++)
        if (s->t[j] == t) return 1;
    return 0;
}

/* Checks that exactly expect ZeroMQ I/O threads appeared since before, each allowed on exactly
   the CPUs of want. A thread pins itself, then names itself, as it starts: the names are waited
   for (2 s at most). */
static void check_new_io_threads(const tidset *before, int expect, const cpu_set_t *want, const char *label) {
    tidset after;
    int fresh = 0;
    for (int tries = 0; tries < 200; tries++, sleep_ms(10)) {
        after.n = zmq_io_tids(after.t, 64);
        fresh = 0;
        for (int i = 0; i < after.n; i++) fresh += !tid_in(before, after.t[i]);
        if (fresh >= expect) break;
    }
    KT_CHECK(before->n >= 0 && fresh == expect, "%s: %d new I/O threads, want %d", label, fresh, expect);
    for (int i = 0; i < after.n; i++) {
        if (tid_in(before, after.t[i])) continue;
        cpu_set_t got;
        CPU_ZERO(&got);
        KT_CHECK(sched_getaffinity(after.t[i], sizeof got, &got) == 0, "sched_getaffinity(%d): %s", (int)after.t[i],
                 strerror(errno));
        KT_CHECK(CPU_EQUAL(&got, want), "%s: I/O thread %d may run on %d CPUs, not just those asked for", label,
                 (int)after.t[i], CPU_COUNT(&got));
    }
}

/* A ring of one with io_cpus and io_threads: its I/O threads pinned, and it works. */
static void check_pinned(const char *io_cpus, int io_threads, const cpu_set_t *want) {
    tidset before;
    before.n = zmq_io_tids(before.t, 64);
    kvps_ring *r = NULL;
    KT_OK(kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 1, .peers = "inproc://kt-pin", .io_threads = io_threads,
                                             .io_cpus = io_cpus}, &r));
    char label[64];
    snprintf(label, sizeof label, "ring io_cpus '%s'", io_cpus);
    check_new_io_threads(&before, io_threads, want, label);
    if (r) {
        double d[2] = {1.5, -2}, e[2] = {0, 0};
        KT_OK(kvps_ring_allreduce(r, d, e, 2, KVPS_FLOAT64, KVPS_SUM));
        KT_CHECK(e[0] == 1.5 && e[1] == -2, "pinned ring of one: %g %g", e[0], e[1]);
    }
    kvps_ring_destroy(&r);
}

/* The same helper serves kvps.h: a server and a worker with io_cpus, over TCP. */
static void check_pinned_ps(const char *srv_cpus, const cpu_set_t *srv_want, const char *wrk_cpus,
                            const cpu_set_t *wrk_want) {
    tidset before;
    before.n = zmq_io_tids(before.t, 64);
    kvps_server *sv = NULL;
    kvps_worker *w = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1,
                                                 .update = KVPS_UPDATE_SUM, .io_cpus = srv_cpus}, &sv));
    check_new_io_threads(&before, 1, srv_want, "server io_cpus");
    if (!sv) return;
    KT_OK(kvps_server_start(sv));
    before.n = zmq_io_tids(before.t, 64);
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(sv), .io_cpus = wrk_cpus}, &w));
    check_new_io_threads(&before, 1, wrk_want, "worker io_cpus");
    if (w) {
        uint64_t key = 7;
        size_t len = 3;
        float g[3] = {1, -2, 0.5f}, v[3] = {0, 0, 0};
        kvps_req q = 0;
        for (int i = 0; i < 2; i++) {
            KT_OK(kvps_worker_push(w, &key, g, &len, 1, &q));
            KT_OK(kvps_worker_wait(w, q, 10000));
        }
        KT_OK(kvps_worker_pull(w, &key, v, &len, 1, &q));
        KT_OK(kvps_worker_wait(w, q, 10000));
        KT_CHECK(v[0] == 2 && v[1] == -4 && v[2] == 1, "pinned server and worker: %g %g %g, want 2 -4 1", v[0], v[1], v[2]);
    }
    kvps_worker_destroy(&w);
    kvps_server_stop(sv);
    kvps_server_destroy(&sv);
}

static void pinned_main(rk *x) {
    t_allreduce(x, KVPS_FLOAT32, KVPS_SUM, 300007, KVPS_ALGO_RING, 0);
    t_allreduce(x, KVPS_INT64, KVPS_MAX, 70001, KVPS_ALGO_AUTO, 1);
}

static void test_io_cpus(void) {
    cpu_set_t allowed, one, two;
    KT_CHECK(sched_getaffinity(0, sizeof allowed, &allowed) == 0, "sched_getaffinity: %s", strerror(errno));
    int first = -1, last = -1, outside = -1;
    for (int c = 0; c < 1024; c++) {
        if (CPU_ISSET(c, &allowed)) { if (first < 0) first = c; last = c; }
        else if (outside < 0) outside = c;
    }
    char s_last[16], s_two[32], s_out[16];
    snprintf(s_last, sizeof s_last, "%d", last);
    snprintf(s_two, sizeof s_two, "%d,%d", first, last);
    snprintf(s_out, sizeof s_out, "%d", outside);
    CPU_ZERO(&one);
    CPU_SET(last, &one);
    CPU_ZERO(&two);
    CPU_SET(first, &two);
    CPU_SET(last, &two);
    check_pinned(s_last, 1, &one);
    check_pinned(s_last, 2, &one);
    check_pinned(s_two, 2, &two);
    check_pinned_ps(s_last, &one, s_two, &two);
    /* every rank's own context pinned to one CPU: results as always */
    team t;
    team_init(&t, "io_cpus tcp", pinned_main, 3, 1, 20000);
    t.base.io_cpus = s_last;
    team_run(&t);

    kvps_log_set_level(KVPS_LOG_NONE);
    const char *bad[] = {"", "x", "1-0", "0-", "-1", "0,", ",0", "0,,1", "0 ", " 0", "0;1", "1024", "0-1024",
                         "99999999999999999999", "0-99999999999999999999", s_out};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (bad[i] == s_out && outside < 0) continue; /* every CPU below 1024 allowed: nothing to refuse */
        kvps_ring *r = (kvps_ring *)&r;
        kvps_result rc = kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 1, .peers = "inproc://kt-pin-bad",
                                                            .io_cpus = bad[i]}, &r);
        KT_CHECK(rc == KVPS_ERR_CONFIG && r == NULL, "io_cpus '%s': %s, want KVPS_ERR_CONFIG", bad[i], kvps_result_str(rc));
    }
    void *ctx = zmq_ctx_new();
    kvps_ring *r = (kvps_ring *)&r;
    kvps_result rc = kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 1, .peers = "inproc://kt-pin-ctx",
                                                        .zmq_ctx = ctx, .io_cpus = s_last}, &r);
    KT_CHECK(rc == KVPS_ERR_CONFIG && r == NULL, "io_cpus with a zmq_ctx of the caller's: %s", kvps_result_str(rc));
    KT_CHECK(kvps_zmq_ctx_pin(ctx, "x") == KVPS_ERR_CONFIG, "kvps_zmq_ctx_pin(ctx, \"x\")");
    KT_OK(kvps_zmq_ctx_pin(ctx, s_last));
    zmq_ctx_term(ctx);
    KT_CHECK(kvps_zmq_ctx_pin(NULL, "0") == KVPS_ERR_INVALID_ARG, "kvps_zmq_ctx_pin(NULL)");
    kvps_server *sv = NULL;
    kvps_worker *w = NULL;
    KT_CHECK(kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://kt-pin-s", .num_workers = 1, .io_cpus = "0-"},
                                &sv) == KVPS_ERR_CONFIG && !sv, "server io_cpus '0-'");
    KT_CHECK(kvps_worker_create(&(kvps_worker_desc){.servers = "inproc://kt-pin-s", .io_cpus = "1024"}, &w) ==
                 KVPS_ERR_CONFIG && !w, "worker io_cpus '1024'");
    ctx = zmq_ctx_new();
    KT_CHECK(kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://kt-pin-s", .num_workers = 1, .zmq_ctx = ctx,
                                                    .io_cpus = s_last}, &sv) == KVPS_ERR_CONFIG && !sv,
             "server io_cpus with a zmq_ctx of the caller's");
    KT_CHECK(kvps_worker_create(&(kvps_worker_desc){.servers = "inproc://kt-pin-s", .zmq_ctx = ctx, .io_cpus = s_last},
                                &w) == KVPS_ERR_CONFIG && !w, "worker io_cpus with a zmq_ctx of the caller's");
    zmq_ctx_term(ctx);
    kvps_log_set_level(KVPS_LOG_ERROR);
}

static void test_env(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    static const char *vars[] = {"KVPS_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "KVPS_SIZE",
                                 "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "KVPS_RING_PEERS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
    int rank = -5, size = -5;
    const char *peers = "x";
    KT_CHECK(kvps_ring_env_read(&rank, &size, &peers) == KVPS_ERR_ENV, "nothing set");
    KT_CHECK(kvps_ring_env_read(NULL, &size, &peers) == KVPS_ERR_INVALID_ARG, "NULL rank");
    setenv("KVPS_RANK", "1", 1);
    setenv("KVPS_SIZE", "3", 1);
    KT_CHECK(kvps_ring_env_read(&rank, &size, &peers) == KVPS_ERR_ENV, "no KVPS_RING_PEERS");
    setenv("KVPS_RING_PEERS", "tcp://a:1,tcp://b:1,tcp://c:1", 1);
    KT_OK(kvps_ring_env_read(&rank, &size, &peers));
    KT_CHECK(rank == 1 && size == 3 && peers && strcmp(peers, "tcp://a:1,tcp://b:1,tcp://c:1") == 0, "read %d %d %s", rank, size,
             peers ? peers : "(null)");
    setenv("KVPS_RANK", "3", 1);
    KT_CHECK(kvps_ring_env_read(&rank, &size, &peers) == KVPS_ERR_ENV, "rank = size");
    setenv("KVPS_RANK", "one", 1);
    KT_CHECK(kvps_ring_env_read(&rank, &size, &peers) == KVPS_ERR_ENV, "malformed rank");
    unsetenv("KVPS_RANK");
    unsetenv("KVPS_SIZE");
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    setenv("SLURM_NTASKS", "4", 1);
    KT_OK(kvps_ring_env_read(&rank, &size, &peers));
    KT_CHECK(rank == 2 && size == 4, "launcher variables: %d %d", rank, size);
    setenv("SLURM_NTASKS", "0", 1);
    KT_CHECK(kvps_ring_env_read(&rank, &size, &peers) == KVPS_ERR_ENV, "size 0");
    setenv("KVPS_RING_PEERS", "", 1);
    setenv("SLURM_NTASKS", "4", 1);
    KT_CHECK(kvps_ring_env_read(&rank, &size, &peers) == KVPS_ERR_ENV, "empty KVPS_RING_PEERS");
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
    kvps_log_set_level(KVPS_LOG_ERROR);
}

/* ---------------------------------------------------------------------------------------- */
/* kvps_reduce_into against a scalar reference */

static float ref_op(float a, float b, kvps_redop op) {
    if (a != a || b != b) return a != a ? a : b;
    switch (op) {
    case KVPS_PROD: return a * b;
    case KVPS_MIN: return b < a ? b : a;
    case KVPS_MAX: return b > a ? b : a;
    default: return a + b;
    }
}
static double ref_opd(double a, double b, kvps_redop op) {
    if (a != a || b != b) return a != a ? a : b;
    switch (op) {
    case KVPS_PROD: return a * b;
    case KVPS_MIN: return b < a ? b : a;
    case KVPS_MAX: return b > a ? b : a;
    default: return a + b;
    }
}

static void test_reduce_into(void) {
    enum { N = 37 };
    uint64_t s = 99;
    for (int dt = 0; dt < 6; dt++)
        for (int op = 0; op < 5; op++) {
            size_t es = kvps_dtype_size((kvps_dtype)dt);
            unsigned char dst[N * 8], src[N * 8], want[N * 8];
            for (size_t i = 0; i < N; i++) {
                uint64_t a = kt_rng(&s), b = kt_rng(&s);
                float fa = kt_randf(&s) * 4, fb = kt_randf(&s) * 4;
                double da = (double)kt_randf(&s) * 1e3, db = (double)kt_randf(&s) * 1e-3;
                if (i == 3) fa = NAN, da = NAN;        /* NaN on either side propagates (min, max; sums anyway) */
                if (i == 4) fb = NAN, db = NAN;
                if (i == 5) fa = fb = 0.5f, da = db = 7; /* ties */
                if (i == 6) { a = (uint64_t)INT64_MIN; b = (uint64_t)-1; fa = 65504.0f; fb = 65504.0f; } /* overflow: wrap, inf */
                if (i == 7) { a = 0x7fffffffull; b = 0x7fffffffull; }
                switch (dt) {
                case KVPS_FLOAT32: memcpy(dst + i * 4, &fa, 4); memcpy(src + i * 4, &fb, 4); break;
                case KVPS_FLOAT64: memcpy(dst + i * 8, &da, 8); memcpy(src + i * 8, &db, 8); break;
                case KVPS_INT32: { uint32_t a32 = (uint32_t)a, b32 = (uint32_t)b; memcpy(dst + i * 4, &a32, 4); memcpy(src + i * 4, &b32, 4); break; }
                case KVPS_INT64: memcpy(dst + i * 8, &a, 8); memcpy(src + i * 8, &b, 8); break;
                case KVPS_FLOAT16: { uint16_t ha = kvps_f32_to_f16(fa), hb = kvps_f32_to_f16(fb); memcpy(dst + i * 2, &ha, 2); memcpy(src + i * 2, &hb, 2); break; }
                default: { uint16_t ha = kvps_f32_to_bf16(fa), hb = kvps_f32_to_bf16(fb); memcpy(dst + i * 2, &ha, 2); memcpy(src + i * 2, &hb, 2); break; }
                }
            }
            /* scalar reference */
            for (size_t i = 0; i < N; i++) {
                const unsigned char *pa = dst + i * es, *pb = src + i * es;
                unsigned char *pw = want + i * es;
                if (dt == KVPS_INT32 || dt == KVPS_INT64) {
                    int64_t va, vb;
                    if (dt == KVPS_INT32) { int32_t x, y; memcpy(&x, pa, 4); memcpy(&y, pb, 4); va = x; vb = y; }
                    else { memcpy(&va, pa, 8); memcpy(&vb, pb, 8); }
                    uint64_t w;
                    switch (op) {
                    case KVPS_PROD: w = (uint64_t)va * (uint64_t)vb; break;
                    case KVPS_MIN: w = (uint64_t)(va < vb ? va : vb); break;
                    case KVPS_MAX: w = (uint64_t)(va > vb ? va : vb); break;
                    default: w = (uint64_t)va + (uint64_t)vb; break;
                    }
                    if (dt == KVPS_INT32) { uint32_t w32 = (uint32_t)w; memcpy(pw, &w32, 4); }
                    else memcpy(pw, &w, 8);
                } else if (dt == KVPS_FLOAT32) {
                    float x, y, w;
                    memcpy(&x, pa, 4); memcpy(&y, pb, 4);
                    w = ref_op(x, y, (kvps_redop)op);
                    memcpy(pw, &w, 4);
                } else if (dt == KVPS_FLOAT64) {
                    double x, y, w;
                    memcpy(&x, pa, 8); memcpy(&y, pb, 8);
                    w = ref_opd(x, y, (kvps_redop)op);
                    memcpy(pw, &w, 8);
                } else {
                    uint16_t x, y, w;
                    memcpy(&x, pa, 2); memcpy(&y, pb, 2);
                    int h = dt == KVPS_FLOAT16;
                    float fx = h ? kvps_f16_to_f32(x) : kvps_bf16_to_f32(x), fy = h ? kvps_f16_to_f32(y) : kvps_bf16_to_f32(y);
                    float fw = ref_op(fx, fy, (kvps_redop)op);
                    w = h ? kvps_f32_to_f16(fw) : kvps_f32_to_bf16(fw);
                    memcpy(pw, &w, 2);
                }
            }
            unsigned char src_copy[N * 8];
            memcpy(src_copy, src, N * es);
            kvps_reduce_into(dst, src, N, (kvps_dtype)dt, (kvps_redop)op);
            KT_CHECK(memcmp(src, src_copy, N * es) == 0, "%s %s: src modified", DT_NAME[dt], OP_NAME[op]);
            for (size_t i = 0; i < N; i++) {
                int same = memcmp(dst + i * es, want + i * es, es) == 0;
                if (!same && dt != KVPS_INT32 && dt != KVPS_INT64) {
                    /* NaN == NaN whatever the payload */
                    val g = load_val((kvps_dtype)dt, dst, i), w = load_val((kvps_dtype)dt, want, i);
                    same = g.f != g.f && w.f != w.f;
                }
                KT_CHECK(same, "%s %s [%zu]: differs from the scalar reference", DT_NAME[dt], OP_NAME[op], i);
                if (!same) break;
            }
        }
    /* NaN propagates through min and max in both positions, every float dtype */
    float fn = NAN, one = 1.0f;
    for (int op = KVPS_MIN; op <= KVPS_MAX; op++) {
        float a = fn, b = one;
        kvps_reduce_into(&a, &b, 1, KVPS_FLOAT32, (kvps_redop)op);
        KT_CHECK(a != a, "f32 %s(NaN, 1) = %g", OP_NAME[op], a);
        a = one; b = fn;
        kvps_reduce_into(&a, &b, 1, KVPS_FLOAT32, (kvps_redop)op);
        KT_CHECK(a != a, "f32 %s(1, NaN) = %g", OP_NAME[op], a);
        double da = 1, db = NAN;
        kvps_reduce_into(&da, &db, 1, KVPS_FLOAT64, (kvps_redop)op);
        KT_CHECK(da != da, "f64 %s(1, NaN) = %g", OP_NAME[op], da);
        uint16_t ha = 0x3c00, hb = 0x7e00;
        kvps_reduce_into(&ha, &hb, 1, KVPS_FLOAT16, (kvps_redop)op);
        KT_CHECK((ha & 0x7c00) == 0x7c00 && (ha & 0x3ff), "f16 %s(1, NaN) = %04x", OP_NAME[op], ha);
        ha = 0x7e00; hb = 0x3c00;
        kvps_reduce_into(&ha, &hb, 1, KVPS_FLOAT16, (kvps_redop)op);
        KT_CHECK((ha & 0x7c00) == 0x7c00 && (ha & 0x3ff), "f16 %s(NaN, 1) = %04x", OP_NAME[op], ha);
        ha = 0x3f80; hb = 0x7fc0;
        kvps_reduce_into(&ha, &hb, 1, KVPS_BFLOAT16, (kvps_redop)op);
        KT_CHECK((ha & 0x7f80) == 0x7f80 && (ha & 0x7f), "bf16 %s(1, NaN) = %04x", OP_NAME[op], ha);
    }
    /* 16-bit steps round to nearest even: 2048 + 1 in f16 is 2048; 1 + 2^-11 ties to 1 */
    uint16_t h1 = kvps_f32_to_f16(2048.0f), h2 = kvps_f32_to_f16(1.0f);
    kvps_reduce_into(&h1, &h2, 1, KVPS_FLOAT16, KVPS_SUM);
    KT_CHECK(kvps_f16_to_f32(h1) == 2048.0f, "f16 2048 + 1 = %g", kvps_f16_to_f32(h1));
    uint16_t b1 = kvps_f32_to_bf16(256.0f), b2 = kvps_f32_to_bf16(1.0f);
    kvps_reduce_into(&b1, &b2, 1, KVPS_BFLOAT16, KVPS_SUM);
    KT_CHECK(kvps_bf16_to_f32(b1) == 256.0f, "bf16 256 + 1 = %g", kvps_bf16_to_f32(b1));
    /* an empty reduction touches nothing */
    kvps_reduce_into(NULL, NULL, 0, KVPS_FLOAT32, KVPS_SUM);
}

/* ---------------------------------------------------------------------------------------- */
/* In-place forms as the manual states them (section 2: "In place: send == NULL or send ==
   recv ... the data is already in recv"), each on its own so a failure names the form. */

/* reduce, every rank in place with send == NULL: a non-root's contribution is in its recv. */
static void inplace_reduce_main(rk *x) {
    for (int root = 0; root < x->k; root++)
        for (int dt = 0; dt < 6; dt += 2) {
            if (x->dead) return;
            uint64_t seed = next_seed(x);
            size_t n = 13, es = kvps_dtype_size((kvps_dtype)dt);
            char what[96];
            snprintf(what, sizeof what, "reduce %s sum n=13 root=%d, send NULL on every rank", DT_NAME[dt], root);
            char *rb = (char *)xmalloc(n * es);
            put_red((kvps_dtype)dt, KVPS_SUM, rb, n, seed, x->rank, 0);
            if (rk_call(x, kvps_ring_reduce(x->r, NULL, rb, n, (kvps_dtype)dt, KVPS_SUM, root), what) && x->rank == root)
                check_red(x, what, (kvps_dtype)dt, KVPS_SUM, seed, rb, n, 0);
            free(rb);
        }
}

/* allgather with send == recv, the rank's block already at recv[rank * count]. */
static void inplace_allgather_main(rk *x) {
    for (int dt = 0; dt < 6 && !x->dead; dt++) {
        uint64_t seed = next_seed(x);
        size_t n = 5, es = kvps_dtype_size((kvps_dtype)dt), bytes = n * es;
        char what[96];
        snprintf(what, sizeof what, "allgather %s n=5, send == recv", DT_NAME[dt]);
        char *rb = (char *)xmalloc(bytes * (size_t)x->k);
        memset(rb, 0xEE, bytes * (size_t)x->k);
        put_raw((kvps_dtype)dt, rb + (size_t)x->rank * bytes, n, seed, x->rank, 0);
        if (rk_call(x, kvps_ring_allgather(x->r, rb, rb, n, (kvps_dtype)dt), what))
            for (int i = 0; i < x->k; i++)
                if (check_raw(x, what, (kvps_dtype)dt, rb + (size_t)i * bytes, n, seed, i, 0)) break;
        free(rb);
    }
}

/* scatter with send == NULL on the root: all count * size elements in its recv, its own block
   lands in recv[0 .. count) (as reduce_scatter's in-place form). */
static void inplace_scatter_main(rk *x) {
    for (int root = 0; root < x->k && !x->dead; root++) {
        uint64_t seed = next_seed(x);
        size_t n = 7, total = n * (size_t)x->k;
        char what[96];
        snprintf(what, sizeof what, "scatter i32 n=7 root=%d, send NULL on the root", root);
        int32_t *rb = (int32_t *)xmalloc(total * sizeof *rb);
        memset(rb, 0xEE, total * sizeof *rb);
        if (x->rank == root) put_raw(KVPS_INT32, rb, total, seed, root, 0);
        if (rk_call(x, kvps_ring_scatter(x->r, NULL, rb, n, KVPS_INT32, root), what))
            check_raw(x, what, KVPS_INT32, rb, n, seed, root, (size_t)x->rank * n);
        free(rb);
    }
}

/* scatter in place (send == recv) with blocks of 64 KiB: the root sends its blocks without a
   copy, then moves its own block to recv[0 .. count); the block it overwrites must already be
   on its way. Every root, several times. */
static void inplace_scatter_big_main(rk *x) {
    for (int rep = 0; rep < 4; rep++)
        for (int root = 0; root < x->k; root++)
            t_scatter(x, KVPS_FLOAT32, 16384, root, 1);
}

static void run_inplace(const char *label, void (*fn)(rk *), int k) { run_team(label, fn, k, 0, 2000, NULL); }

static void test_inplace_reduce_nonroot_null(void) { run_inplace("reduce send NULL", inplace_reduce_main, 3); }
static void test_inplace_allgather_send_eq_recv(void) { run_inplace("allgather send == recv", inplace_allgather_main, 3); }
static void test_inplace_scatter_root_null(void) { run_inplace("scatter root send NULL", inplace_scatter_main, 3); }
static void test_inplace_scatter_zero_copy(void) {
    run_inplace("scatter in place 64 KiB blocks", inplace_scatter_big_main, 2);
    run_inplace("scatter in place 64 KiB blocks", inplace_scatter_big_main, 3);
}

/* ---------------------------------------------------------------------------------------- */

/* KVPS_TEST_TIMES=1 prints each test's wall time. */
#define RUN(fn, limit_s)                                                                          \
    do {                                                                                          \
        int64_t t_ = kvps__now_ms();                                                              \
        watchdog(limit_s);                                                                        \
        KT_RUN(fn);                                                                               \
        if (getenv("KVPS_TEST_TIMES")) printf("  time %s: %lld ms\n", #fn, (long long)(kvps__now_ms() - t_)); \
    } while (0)

int main(void) {
    signal(SIGALRM, on_alarm);
    signal(SIGPIPE, SIG_IGN);
    kvps_log_set_level(KVPS_LOG_ERROR);
    int64_t t0 = kvps__now_ms();
    /* forks first, while this process has no threads (children inherit none of their stacks) */
    RUN(test_processes_tcp, 300);
    RUN(test_dead_rank_process, 120);
    RUN(test_dead_rank_thread, 120);
    RUN(test_mismatch_same_path, 120);
    RUN(test_mismatch_send_only_ranks, 120);
    RUN(test_mismatch_zero_copy_error_path, 120);
    RUN(test_mismatch_other_path, 120);
    RUN(test_mismatch_count_zero, 120);
    RUN(test_reduce_into, 60);
    RUN(test_bad_desc, 60);
    RUN(test_env, 60);
    RUN(test_io_cpus, 60);
    RUN(test_bad_arguments, 60);
    RUN(test_nonblocking, 60);
    RUN(test_matrix_default, 240);
    RUN(test_matrix_pipelined, 240);
    RUN(test_matrix_hier, 240);
    RUN(test_zero_copy_sizes, 120);
    RUN(test_64mb_tcp, 120);
    RUN(test_avg_zero_copy, 120);
    RUN(test_reduce_scatter_inplace_zero_copy, 120);
    RUN(test_inplace_reduce_nonroot_null, 60);
    RUN(test_inplace_allgather_send_eq_recv, 60);
    RUN(test_inplace_scatter_root_null, 60);
    RUN(test_inplace_scatter_zero_copy, 60);
    alarm(0);
    printf("  info: test_ring took %.1f s\n", (double)(kvps__now_ms() - t0) / 1000.0);
    return kt_finish();
}
