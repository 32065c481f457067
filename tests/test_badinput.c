/* Bad input: a raw ZeroMQ DEALER sends garbage, truncated frames, wrong sizes, wrong ranks and
   oversized lengths (a table of named cases, fed whole and byte by byte, then random garbage and
   a fuzz with known faults); each gets its error reply, and the servers' stored values and the
   other clients are unaffected. Also the worker API's argument checks, handles and timeouts, and
   a worker facing a broken server. Bad descs, environments and result strings: test_api.c. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"
#include <stddef.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#define BI_MAXLEN ((uint64_t)1 << 20) /* the servers' max_value_len */
#define BI_M 2                        /* workers */
#define BI_NRAW 12                    /* raw keys the legit worker sets */
#define BI_TLEN 3000                  /* "bad.tensor": 2 slices of 1500, one per server */
#define BI_NLEGIT 6                   /* raw keys the legit workers train on under fire */
#define BI_LTLEN 2500                 /* "legit.tensor" */
#define BI_ROUNDS 20
#define BI_REPLY_MS 2000
#define BI_WAIT_MS 4000               /* a legit worker's wait (ms of work even under valgrind) */
#define BI_MAXF 256                   /* frames in one test message */
#define BI_ANY 1                      /* expected: any error (several faults at once) */

/* Placeholders in the case table, resolved for the server a case is sent to. */
#define K_EXIST 0xE0E0E0E0E0E00001ull    /* a raw key the server holds */
#define K_EXIST2 0xE0E0E0E0E0E00002ull   /* another one */
#define K_SLICE 0xE0E0E0E0E0E00003ull    /* a tensor slice the server holds */
#define L_EXIST 0xE0E0E0E0E0E00011ull    /* K_EXIST's length */
#define L_EXIST_P1 0xE0E0E0E0E0E00012ull /* ... plus one */
#define L_EXIST_M1 0xE0E0E0E0E0E00013ull /* ... minus one (lengths are >= 2) */
#define L_EXIST2 0xE0E0E0E0E0E00014ull
#define L_SLICE 0xE0E0E0E0E0E00015ull
#define L_SLICE_P1 0xE0E0E0E0E0E00016ull
/* Keys that only bad messages name: they must never come to exist. */
#define N1 0x0BADBADBAD000001ull
#define N2 0x0BADBADBAD000002ull
#define N3 0x0BADBADBAD000003ull
#define N4 0x0BADBADBAD000004ull

#define PUSH KVPS__OP_PUSH
#define PULL KVPS__OP_PULL
#define PUSHPULL KVPS__OP_PUSHPULL
#define INIT KVPS__OP_INIT
#define BARRIER KVPS__OP_BARRIER

/* ---------------------------------------------------------------------------------------- */
/* The fixture: 2 servers, 2 legit workers, one raw DEALER per server. */

typedef struct bi_poolkey {
    uint64_t key, len; /* len 0: a new key, any length */
    int exists;
} bi_poolkey;

typedef struct bi_fx {
    kt_cluster c;
    int up, async;
    kvps_worker *w[BI_M];
    void *raw[2];
    uint64_t keys[BI_NRAW];
    size_t lens[BI_NRAW], vtot;
    float *vals;
    kvps_tensor t;
    float *tvals;
    uint64_t ek[2], el[2], ek2[2], el2[2], sk[2], sl[2];
    uint64_t lk[BI_NLEGIT];
    size_t ll[BI_NLEGIT], ltot;
    kvps_tensor lt[BI_M];
    bi_poolkey pool[2][32];
    int npool[2];
    uint64_t bad[2]; /* bad messages sent to each server */
    void *deferred[64]; /* buffers of requests that timed out: borrowed until the workers go */
    int ndeferred;
    uint64_t req_id;
    kvps_server_stats st0[2];
} bi_fx;

static bi_fx F;
static int bi_reported; /* failures printed in this test; the rest only count */
static int bi_missing;  /* replies that never came in this test: after 3 wait 100 ms, after 10 stop */

#define BI_CHECK(cond, ...)                                                                    \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            if (bi_reported++ < 20) KT_CHECK(cond, __VA_ARGS__);                               \
            else kt_cur_failed = 1;                                                            \
        }                                                                                      \
    } while (0)

/* Before each test (kt_before_each): its own count of printed failures and missing replies. */
static void bi_reset(void) { bi_reported = bi_missing = 0; }

/* Frees p once the workers are destroyed (a request that timed out still borrows it). */
static void bi_defer_free(void *p) {
    if (F.ndeferred < 64) F.deferred[F.ndeferred++] = p;
}

static const char *bi_str(int r) { return r == BI_ANY ? "any error" : kvps_result_str((kvps_result)r); }
static int bi_known(int r) { return strcmp(kvps_result_str((kvps_result)r), "unknown kvps_result") != 0; }

/* ---------------------------------------------------------------------------------------- */
/* Messages: built, sent whole from a raw DEALER, answered by exactly one reply. */

typedef struct bi_msg {
    int nf;
    size_t size[BI_MAXF];
    unsigned char *data[BI_MAXF];
} bi_msg;

static void bi_add(bi_msg *m, const void *data, size_t size) {
    if (m->nf >= BI_MAXF) return;
    unsigned char *p = (unsigned char *)malloc(size ? size : 1);
    if (!p) return;
    if (size) {
        if (data) memcpy(p, data, size);
        else memset(p, 0x44, size); /* values: 785.07f each, never what is stored */
    }
    m->data[m->nf] = p;
    m->size[m->nf] = size;
    m->nf++;
}

static void bi_free(bi_msg *m) {
    for (int i = 0; i < m->nf; i++) free(m->data[i]);
    m->nf = 0;
}

/* Resizes frame i to size bytes (new bytes are 0x5A). */
static void bi_resize(bi_msg *m, int i, size_t size) {
    unsigned char *p = (unsigned char *)realloc(m->data[i], size ? size : 1);
    if (!p) return;
    if (size > m->size[i]) memset(p + m->size[i], 0x5A, size - m->size[i]);
    m->data[i] = p;
    m->size[i] = size;
}

/* A request header; req_id distinct per message (echoed in the reply). */
static kvps__hdr bi_hdr(int op, uint32_t rank, uint32_t nkeys) {
    return KT_HDR(.op = (uint8_t)op, .rank = rank, .nkeys = nkeys, .req_id = ++F.req_id * 0x10001ull);
}

/* Appends a meta frame for h and n entries. */
static void bi_add_meta(bi_msg *m, const kvps__hdr *h, const kvps__kent *e, int n) {
    unsigned char buf[KVPS__HDR + 8 * KVPS__KENT];
    memcpy(buf, h, sizeof *h);
    if (n) memcpy(buf + KVPS__HDR, e, (size_t)n * KVPS__KENT);
    bi_add(m, buf, KVPS__HDR + (size_t)n * KVPS__KENT);
}

/* sum(len) * 4, or 0 when that is not a size anyone should allocate. */
static size_t bi_values_bytes(const kvps__kent *e, int n) {
    uint64_t t = 0;
    for (int i = 0; i < n; i++) {
        if (e[i].len > BI_MAXLEN) return 0;
        t += e[i].len;
    }
    return (size_t)t * sizeof(float);
}

static int bi_send(void *sock, const bi_msg *m) {
    for (int i = 0; i < m->nf; i++)
        if (zmq_send(sock, m->data[i], m->size[i], i + 1 < m->nf ? ZMQ_SNDMORE : 0) < 0) return -1;
    return 0;
}

typedef struct bi_reply {
    int nf; /* frames; 0: nothing within the timeout */
    size_t size[2];
    kvps__hdr hdr;
    char text[512];
} bi_reply;

static int bi_recv(void *sock, int timeout_ms, bi_reply *r) {
    memset(r, 0, sizeof *r);
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) <= 0) return 0;
    int more = 1;
    while (more) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, sock, 0) < 0) { zmq_msg_close(&f); break; }
        size_t n = zmq_msg_size(&f);
        if (r->nf == 0) {
            r->size[0] = n;
            memcpy(&r->hdr, zmq_msg_data(&f), n < sizeof r->hdr ? n : sizeof r->hdr);
        } else if (r->nf == 1) {
            r->size[1] = n;
            memcpy(r->text, zmq_msg_data(&f), n < sizeof r->text - 1 ? n : sizeof r->text - 1);
        }
        r->nf++;
        more = zmq_msg_more(&f);
        zmq_msg_close(&f);
    }
    return r->nf;
}

/* Messages already waiting (there should be none: one reply per request). */
static int bi_drain(void *sock) {
    int n = 0;
    bi_reply r;
    while (bi_recv(sock, 0, &r) > 0) n++;
    return n;
}

/* Sends m (freed) from sock and checks the one reply: [meta][text], magic, version, status
   `want` (or any error), a text, and op|0x80, rank and req_id echoed when the header was
   readable. Returns the reply's status (1 when there was none). */
static int bi_roundtrip(void *sock, bi_msg *m, int want, const char *what, int srv) {
    kvps__hdr sent;
    int echo = m->nf > 0 && m->size[0] >= KVPS__HDR;
    if (echo) memcpy(&sent, m->data[0], sizeof sent);
    echo = echo && sent.magic == KVPS__MAGIC;
    if (bi_missing >= 10) { /* the server stopped answering: fail fast, not 2 s a case */
        bi_free(m);
        kt_cur_failed = 1;
        return 1;
    }
    int stray = bi_drain(sock);
    BI_CHECK(stray == 0, "before '%s': %d stray replies", what, stray);
    int rc = bi_send(sock, m);
    bi_free(m);
    BI_CHECK(rc == 0, "'%s': send: %s", what, zmq_strerror(zmq_errno()));
    bi_reply r;
    int n = bi_recv(sock, bi_missing >= 3 ? 100 : BI_REPLY_MS, &r);
    bi_missing += n == 0;
    BI_CHECK(n == 2, "'%s' (server %d): %d reply frames (0: no reply in time)", what, srv, n);
    if (n < 1) return 1;
    BI_CHECK(r.size[0] == KVPS__HDR, "'%s': reply meta of %zu bytes", what, r.size[0]);
    if (r.size[0] < KVPS__HDR) return 1;
    BI_CHECK(r.hdr.magic == KVPS__MAGIC && r.hdr.version == KVPS__VERSION && (r.hdr.op & KVPS__OP_REPLY),
             "'%s': reply magic 0x%08x version %u op 0x%02x", what, r.hdr.magic, r.hdr.version, r.hdr.op);
    if (want == BI_ANY)
        BI_CHECK(r.hdr.status < 0 && bi_known(r.hdr.status), "'%s' (server %d): status %d (%s), want an error",
                 what, srv, r.hdr.status, bi_str(r.hdr.status));
    else
        BI_CHECK(r.hdr.status == want, "'%s' (server %d): got %s, want %s", what, srv, bi_str(r.hdr.status),
                 bi_str(want));
    BI_CHECK(n < 2 || (r.size[1] > 0 && r.text[0]), "'%s': empty error text", what);
    if (echo)
        BI_CHECK(r.hdr.req_id == sent.req_id && r.hdr.rank == sent.rank &&
                     r.hdr.op == (uint8_t)(sent.op | KVPS__OP_REPLY),
                 "'%s': reply echoes req_id %llu rank %u op 0x%02x, sent %llu %u 0x%02x", what,
                 (unsigned long long)r.hdr.req_id, r.hdr.rank, r.hdr.op, (unsigned long long)sent.req_id,
                 sent.rank, sent.op);
    return r.hdr.status;
}

/* A bad message to fixture server srv. */
static int bi_expect(int srv, bi_msg *m, int want, const char *what) {
    F.bad[srv]++;
    return bi_roundtrip(F.raw[srv], m, want, what, srv);
}

/* ---------------------------------------------------------------------------------------- */
/* The table. Zero fields mean "as a valid message would have it". */

typedef struct bi_patch {
    int set;
    size_t off, size;
    uint64_t val;
} bi_patch;
/* Overwrites a header field after the message is built. */
#define P(field, v) {1, offsetof(kvps__hdr, field), sizeof(((kvps__hdr *)0)->field), (uint64_t)(v)}
#define KEEP(n) ((n) + 1)  /* the meta frame cut to exactly n bytes */
#define VSIZE(n) ((n) + 1) /* a values frame of exactly n bytes */
#define E1(k, l) .nk = 1, .key = {k}, .len = {l}
#define E2(k1, l1, k2, l2) .nk = 2, .key = {k1, k2}, .len = {l1, l2}
#define E3(k1, l1, k2, l2, k3, l3) .nk = 3, .key = {k1, k2, k3}, .len = {l1, l2, l3}
#define EX E1(K_EXIST, L_EXIST)

typedef struct bi_case {
    const char *name;
    kvps_result expect;
    int op; /* 0: PUSH */
    int nk;
    uint64_t key[3], len[3];
    bi_patch patch[2];
    int keep, meta_cut, meta_add;
    int novalues, vsize, values_cut, values_add;
    int extra;        /* empty frames after the last one */
    int server1_only; /* a valid message for server 0 */
    const char *raw;  /* one frame of text instead of a kvps message */
} bi_case;

static const bi_case bi_cases[] = {
    /* frames that are no kvps message at all */
    {"empty meta frame", KVPS_ERR_TRUNCATED, .op = PULL, EX, .keep = KEEP(0)},
    {"1-byte meta frame", KVPS_ERR_TRUNCATED, .op = PULL, EX, .keep = KEEP(1)},
    {"31-byte header", KVPS_ERR_TRUNCATED, .op = PULL, EX, .keep = KEEP(31)},
    {"empty meta frame, then values", KVPS_ERR_TRUNCATED, EX, .keep = KEEP(0)},
    {"5 bytes of text", KVPS_ERR_TRUNCATED, .raw = "hello"},
    {"an HTTP request", KVPS_ERR_MAGIC, .raw = "GET / HTTP/1.1\r\nHost: kvps\r\nAccept: */*\r\n\r\n"},
    /* header fields */
    {"wrong magic", KVPS_ERR_MAGIC, EX, .patch = {P(magic, 0xdeadbeef)}},
    {"magic 0", KVPS_ERR_MAGIC, EX, .patch = {P(magic, 0)}},
    {"byte-swapped magic", KVPS_ERR_MAGIC, EX, .patch = {P(magic, 0x4B565053)}},
    {"magic off by one", KVPS_ERR_MAGIC, EX, .patch = {P(magic, 0x5350564C)}},
    {"version 0", KVPS_ERR_VERSION, EX, .patch = {P(version, 0)}},
    {"version 2", KVPS_ERR_VERSION, EX, .patch = {P(version, 2)}},
    {"version 255", KVPS_ERR_VERSION, .op = PULL, EX, .patch = {P(version, 255)}},
    {"op 0", KVPS_ERR_OP, .op = PULL, EX, .patch = {P(op, 0)}},
    {"op after the last known", KVPS_ERR_OP, .op = PULL, EX, .patch = {P(op, KVPS__OP_COUNT)}},
    {"op 0x7f", KVPS_ERR_OP, .op = PULL, EX, .patch = {P(op, 0x7f)}},
    {"op 0x80 (the reply bit alone)", KVPS_ERR_OP, .op = PULL, EX, .patch = {P(op, 0x80)}},
    {"op 0x81 (a push reply sent back)", KVPS_ERR_OP, EX, .patch = {P(op, 0x81)}},
    {"op 0x82 (a pull reply sent back)", KVPS_ERR_OP, .op = PULL, EX, .patch = {P(op, 0x82)}},
    {"op 255", KVPS_ERR_OP, EX, .patch = {P(op, 255)}},
    {"rank = num_workers", KVPS_ERR_RANK, EX, .patch = {P(rank, BI_M)}},
    {"rank 3, pull", KVPS_ERR_RANK, .op = PULL, EX, .patch = {P(rank, 3)}},
    {"rank 2^31-1", KVPS_ERR_RANK, EX, .patch = {P(rank, 0x7fffffff)}},
    {"rank 2^31 (negative as int)", KVPS_ERR_RANK, EX, .patch = {P(rank, 0x80000000u)}},
    {"rank 2^32-1 (-1)", KVPS_ERR_RANK, .op = INIT, EX, .patch = {P(rank, 0xffffffffu)}},
    {"barrier from rank 2", KVPS_ERR_RANK, .op = BARRIER, .patch = {P(rank, 2)}},
    /* nkeys against the meta frame */
    {"nkeys 2, one entry", KVPS_ERR_TRUNCATED, EX, .patch = {P(nkeys, 2)}},
    {"nkeys 1, two entries", KVPS_ERR_MALFORMED, E2(K_EXIST, L_EXIST, K_EXIST2, L_EXIST2), .patch = {P(nkeys, 1)}},
    {"nkeys 0, one entry", KVPS_ERR_MALFORMED, EX, .patch = {P(nkeys, 0)}},
    {"nkeys 2^32-1", KVPS_ERR_TRUNCATED, EX, .patch = {P(nkeys, 0xffffffffu)}},
    {"nkeys 0x10000001 (x16 wraps 32 bits to 16)", KVPS_ERR_TRUNCATED, EX, .patch = {P(nkeys, 0x10000001u)}},
    {"nkeys 0x10000000 (x16 wraps 32 bits to 0)", KVPS_ERR_TRUNCATED, .op = PULL, .patch = {P(nkeys, 0x10000000u)}},
    {"meta 1 byte short", KVPS_ERR_TRUNCATED, EX, .meta_cut = 1},
    {"meta 15 bytes short", KVPS_ERR_TRUNCATED, .op = PULL, EX, .meta_cut = 15},
    {"meta 16 bytes short (an entry missing)", KVPS_ERR_TRUNCATED, E2(K_EXIST, L_EXIST, K_EXIST2, L_EXIST2), .meta_cut = 16},
    {"meta 1 byte long", KVPS_ERR_MALFORMED, EX, .meta_add = 1},
    {"meta 16 bytes long (an unannounced entry)", KVPS_ERR_MALFORMED, .op = PULL, EX, .meta_add = 16},
    /* frame count */
    {"push without values frame", KVPS_ERR_TRUNCATED, EX, .novalues = 1},
    {"pushpull without values frame", KVPS_ERR_TRUNCATED, .op = PUSHPULL, EX, .novalues = 1},
    {"init without values frame", KVPS_ERR_TRUNCATED, .op = INIT, EX, .novalues = 1},
    {"pull with a values frame", KVPS_ERR_MALFORMED, .op = PULL, EX, .extra = 1},
    {"push with an extra frame", KVPS_ERR_MALFORMED, EX, .extra = 1},
    {"push with 12 extra frames", KVPS_ERR_MALFORMED, EX, .extra = 12},
    {"barrier with an extra frame", KVPS_ERR_MALFORMED, .op = BARRIER, .extra = 1},
    {"barrier with a key", KVPS_ERR_MALFORMED, .op = BARRIER, E1(N1, 1)},
    {"barrier sent to server 1", KVPS_ERR_NOT_BARRIER, .op = BARRIER, .server1_only = 1},
    /* no keys */
    {"push with no keys", KVPS_ERR_MALFORMED, .op = PUSH},
    {"pull with no keys", KVPS_ERR_MALFORMED, .op = PULL},
    {"pushpull with no keys", KVPS_ERR_MALFORMED, .op = PUSHPULL},
    {"init with no keys", KVPS_ERR_MALFORMED, .op = INIT},
    /* the values frame against sum(len) * 4 */
    {"values 1 float short", KVPS_ERR_TRUNCATED, EX, .values_cut = 4},
    {"values 1 byte short", KVPS_ERR_TRUNCATED, EX, .values_cut = 1},
    {"values frame empty", KVPS_ERR_TRUNCATED, EX, .vsize = VSIZE(0)},
    {"values 1 byte long", KVPS_ERR_MALFORMED, EX, .values_add = 1},
    {"values 1 float long", KVPS_ERR_MALFORMED, EX, .values_add = 4},
    {"values for two keys, 1 float short", KVPS_ERR_TRUNCATED, E2(K_EXIST, L_EXIST, K_EXIST2, L_EXIST2), .values_cut = 4},
    {"values for a new key, 1 float long", KVPS_ERR_MALFORMED, E1(N1, 3), .values_add = 4},
    {"pushpull values 3 bytes short", KVPS_ERR_TRUNCATED, .op = PUSHPULL, EX, .values_cut = 3},
    {"init values 1 float long", KVPS_ERR_MALFORMED, .op = INIT, EX, .values_add = 4},
    {"tensor slice values 1 float short", KVPS_ERR_TRUNCATED, E1(K_SLICE, L_SLICE), .values_cut = 4},
    /* lengths */
    {"len 0", KVPS_ERR_MALFORMED, E1(N1, 0)},
    {"len 0, pull", KVPS_ERR_MALFORMED, .op = PULL, E1(N1, 0)},
    {"len 0 after a good key", KVPS_ERR_MALFORMED, E2(K_EXIST, L_EXIST, N1, 0)},
    {"len max_value_len + 1", KVPS_ERR_TOO_LARGE, .op = PULL, E1(N1, BI_MAXLEN + 1)},
    {"len 2^40", KVPS_ERR_TOO_LARGE, E1(N1, 1ull << 40), .vsize = VSIZE(4)},
    {"len 2^62 (x4 wraps to 0)", KVPS_ERR_TOO_LARGE, E1(N1, 1ull << 62), .vsize = VSIZE(0)},
    {"len 2^64-1", KVPS_ERR_TOO_LARGE, E1(N1, UINT64_MAX), .vsize = VSIZE(0)},
    {"a good new key, then len 2^40", KVPS_ERR_TOO_LARGE, .op = PULL, E2(N1, 1, N2, 1ull << 40)},
    {"existing key, len + 1", KVPS_ERR_LEN_MISMATCH, E1(K_EXIST, L_EXIST_P1)},
    {"existing key, len - 1", KVPS_ERR_LEN_MISMATCH, E1(K_EXIST, L_EXIST_M1)},
    {"existing key, len + 1, pull", KVPS_ERR_LEN_MISMATCH, .op = PULL, E1(K_EXIST, L_EXIST_P1)},
    {"existing key, len - 1, pushpull", KVPS_ERR_LEN_MISMATCH, .op = PUSHPULL, E1(K_EXIST, L_EXIST_M1)},
    {"existing key, len + 1, init", KVPS_ERR_LEN_MISMATCH, .op = INIT, E1(K_EXIST, L_EXIST_P1)},
    {"tensor slice, len + 1", KVPS_ERR_LEN_MISMATCH, E1(K_SLICE, L_SLICE_P1)},
    {"tensor slice, len 1, pull", KVPS_ERR_LEN_MISMATCH, .op = PULL, E1(K_SLICE, 1)},
    {"a good new key, then a len mismatch", KVPS_ERR_LEN_MISMATCH, E2(N1, 2, K_EXIST, L_EXIST_P1)},
    /* the same key twice in one request */
    {"existing key twice", KVPS_ERR_DUP_KEY, E2(K_EXIST, L_EXIST, K_EXIST, L_EXIST)},
    {"existing key twice, pull", KVPS_ERR_DUP_KEY, .op = PULL, E2(K_EXIST, L_EXIST, K_EXIST, L_EXIST)},
    {"existing key twice, apart", KVPS_ERR_DUP_KEY, E3(K_EXIST, L_EXIST, N1, 1, K_EXIST, L_EXIST)},
    {"new key twice", KVPS_ERR_DUP_KEY, E2(N1, 2, N1, 2)},
    {"new key twice, lengths differ", KVPS_ERR_DUP_KEY, E2(N1, 2, N1, 3)},
    {"new key twice, apart, pull", KVPS_ERR_DUP_KEY, .op = PULL, E3(N1, 1, N2, 1, N1, 1)},
    {"tensor slice twice, pushpull", KVPS_ERR_DUP_KEY, .op = PUSHPULL, E2(K_SLICE, L_SLICE, K_SLICE, L_SLICE)},
    {"existing key twice, init", KVPS_ERR_DUP_KEY, .op = INIT, E2(K_EXIST2, L_EXIST2, K_EXIST2, L_EXIST2)},
    /* several faults: the first check wins */
    {"magic 0 and rank 9", KVPS_ERR_MAGIC, EX, .patch = {P(magic, 0), P(rank, 9)}},
    {"version 9 and op 9", KVPS_ERR_VERSION, EX, .patch = {P(version, 9), P(op, 9)}},
    {"rank 9 and no values frame", KVPS_ERR_RANK, EX, .patch = {P(rank, 9)}, .novalues = 1},
    {"31-byte header and wrong magic", KVPS_ERR_TRUNCATED, EX, .patch = {P(magic, 1)}, .keep = KEEP(31)},
};

static uint64_t bi_resolve(uint64_t v, int srv) {
    switch (v) {
    case K_EXIST: return F.ek[srv];
    case K_EXIST2: return F.ek2[srv];
    case K_SLICE: return F.sk[srv];
    case L_EXIST: return F.el[srv];
    case L_EXIST_P1: return F.el[srv] + 1;
    case L_EXIST_M1: return F.el[srv] - 1;
    case L_EXIST2: return F.el2[srv];
    case L_SLICE: return F.sl[srv];
    case L_SLICE_P1: return F.sl[srv] + 1;
    default: return v;
    }
}

static void bi_case_build(const bi_case *c, int srv, bi_msg *m) {
    memset(m, 0, sizeof *m);
    if (c->raw) { bi_add(m, c->raw, strlen(c->raw)); return; }
    int op = c->op ? c->op : PUSH;
    kvps__kent e[3];
    for (int i = 0; i < c->nk; i++) {
        e[i].key = bi_resolve(c->key[i], srv);
        e[i].len = bi_resolve(c->len[i], srv);
    }
    kvps__hdr h = bi_hdr(op, 0, (uint32_t)c->nk);
    bi_add_meta(m, &h, e, c->nk);
    for (int i = 0; i < 2; i++)
        if (c->patch[i].set) memcpy(m->data[0] + c->patch[i].off, &c->patch[i].val, c->patch[i].size);
    if (c->keep) bi_resize(m, 0, (size_t)(c->keep - 1));
    if (c->meta_cut) bi_resize(m, 0, m->size[0] - (size_t)c->meta_cut);
    if (c->meta_add) bi_resize(m, 0, m->size[0] + (size_t)c->meta_add);
    if (kvps__op_has_values(op) && !c->novalues) {
        size_t vb = c->vsize ? (size_t)(c->vsize - 1) : bi_values_bytes(e, c->nk);
        bi_add(m, NULL, vb + (size_t)c->values_add - (size_t)c->values_cut);
    }
    for (int i = 0; i < c->extra; i++) bi_add(m, NULL, 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Setup and teardown. */

static float bi_grad(int rank, int round, size_t i, int integer) {
    uint64_t s = ((uint64_t)rank << 56) ^ ((uint64_t)round << 40) ^ (uint64_t)i ^ 0x5eedull;
    if (integer) return (float)((int)(kt_rng(&s) % 7) - 3);
    return kt_randf(&s);
}

static int bi_server_of(uint64_t key) { return (int)(kvps__mix64(key) % 2); }

static void bi_pool_add(int srv, uint64_t key, uint64_t len, int exists) {
    if (F.npool[srv] < 32) F.pool[srv][F.npool[srv]++] = (bi_poolkey){key, len, exists};
}

static int bi_waitq(kvps_worker *w, kvps_req q, const char *what) {
    kvps_result r = kvps_worker_wait(w, q, BI_WAIT_MS);
    KT_CHECK(r == KVPS_OK, "%s: %s (%s)", what, kvps_result_str(r), kvps_worker_last_error(w));
    return r == KVPS_OK ? 0 : -1;
}

static int bi_up(const char *transport, kvps_consistency cons) {
    F.async = cons == KVPS_ASYNC;
    kvps_server_desc d = {.num_workers = BI_M, .consistency = cons,
                          .update = F.async ? KVPS_UPDATE_ACCUMULATE : KVPS_UPDATE_MEAN, .max_value_len = BI_MAXLEN};
    F.up = 1;
    if (kt_cluster_up(&F.c, transport, 2, &d) != 0) return -1;
    for (int r = 0; r < BI_M; r++) {
        kvps_result rc = kvps_worker_create(&(kvps_worker_desc){.servers = F.c.servers, .rank = r,
                                                                 .num_workers = BI_M, .zmq_ctx = F.c.ctx,
                                                                 .timeout_ms = BI_WAIT_MS},
                                            &F.w[r]);
        KT_CHECK(rc == KVPS_OK, "worker %d: %s", r, kvps_result_str(rc));
        if (rc != KVPS_OK) return -1;
    }
    /* the cases below are the server's own checks: its door (ONLY THE JOB TALKS TO THE JOB) is
       opened for them; test_strangers_refused closes it */
    for (int s = 0; s < 2; s++) __atomic_store_n(&F.c.srv[s]->gate, -1, __ATOMIC_RELAXED);
    for (int s = 0; s < 2; s++) {
        int zero = 0;
        F.raw[s] = zmq_socket(F.c.ctx, ZMQ_DEALER);
        if (!F.raw[s]) return -1;
        zmq_setsockopt(F.raw[s], ZMQ_LINGER, &zero, sizeof zero);
        if (zmq_connect(F.raw[s], kvps_server_endpoint(F.c.srv[s])) != 0) return -1;
    }
    /* Raw keys with known values, lengths 2..6, a few on each server. */
    uint64_t seed = 42;
    int per[2] = {0, 0};
    for (int i = 0; i < BI_NRAW; i++) {
        F.keys[i] = 1000 + 7 * (uint64_t)i;
        F.lens[i] = 2 + (size_t)i % 5;
        F.vtot += F.lens[i];
        int s = bi_server_of(F.keys[i]);
        if (per[s] == 0) { F.ek[s] = F.keys[i]; F.el[s] = F.lens[i]; }
        if (per[s] == 1) { F.ek2[s] = F.keys[i]; F.el2[s] = F.lens[i]; }
        per[s]++;
        bi_pool_add(s, F.keys[i], F.lens[i], 1);
    }
    KT_CHECK(per[0] >= 2 && per[1] >= 2, "raw keys per server: %d %d", per[0], per[1]);
    if (per[0] < 2 || per[1] < 2) return -1;
    F.vals = (float *)malloc(F.vtot * sizeof(float));
    F.tvals = (float *)malloc(BI_TLEN * sizeof(float));
    for (size_t i = 0; i < F.vtot; i++) F.vals[i] = kt_randf(&seed);
    for (size_t i = 0; i < BI_TLEN; i++) F.tvals[i] = kt_randf(&seed);
    kvps_req q;
    KT_OK(kvps_worker_init(F.w[0], F.keys, F.vals, F.lens, BI_NRAW, &q));
    if (bi_waitq(F.w[0], q, "init raw keys")) return -1;
    /* A tensor: one slice per server. */
    KT_OK(kvps_worker_tensor(F.w[0], "bad.tensor", BI_TLEN, &F.t));
    const kvps__tensor_info *ti = &F.w[0]->tensors[F.t];
    KT_CHECK(ti->nslices == 2 && ti->server[0] != ti->server[1], "bad.tensor: %u slices", ti->nslices);
    if (ti->nslices != 2 || ti->server[0] == ti->server[1]) return -1;
    for (int i = 0; i < 2; i++) {
        F.sk[ti->server[i]] = ti->keys[i];
        F.sl[ti->server[i]] = ti->slen[i];
        bi_pool_add(ti->server[i], ti->keys[i], ti->slen[i], 1);
    }
    KT_OK(kvps_worker_init_tensor(F.w[0], F.t, F.tvals, &q));
    if (bi_waitq(F.w[0], q, "init bad.tensor")) return -1;
    /* The keys and tensor the legit workers train on later, zeroed now so that they exist. */
    for (int i = 0; i < BI_NLEGIT; i++) {
        F.lk[i] = 5000 + 13 * (uint64_t)i;
        F.ll[i] = 1 + 3 * (size_t)i;
        F.ltot += F.ll[i];
        bi_pool_add(bi_server_of(F.lk[i]), F.lk[i], F.ll[i], 1);
    }
    for (int r = 0; r < BI_M; r++) KT_OK(kvps_worker_tensor(F.w[r], "legit.tensor", BI_LTLEN, &F.lt[r]));
    float *zeros = (float *)calloc(BI_LTLEN + F.ltot, sizeof(float));
    KT_OK(kvps_worker_init(F.w[0], F.lk, zeros, F.ll, BI_NLEGIT, &q));
    int bad = bi_waitq(F.w[0], q, "init legit keys");
    KT_OK(kvps_worker_init_tensor(F.w[0], F.lt[0], zeros, &q));
    bad |= bi_waitq(F.w[0], q, "init legit.tensor");
    free(zeros);
    if (bad) return -1;
    ti = &F.w[0]->tensors[F.lt[0]];
    for (uint32_t i = 0; i < ti->nslices; i++) bi_pool_add(ti->server[i], ti->keys[i], ti->slen[i], 1);
    for (int s = 0; s < 2; s++) {
        bi_pool_add(s, N1, 0, 0);
        bi_pool_add(s, N2, 0, 0);
        bi_pool_add(s, N3, 0, 0);
        bi_pool_add(s, N4, 0, 0);
        kvps_server_stats_get(F.c.srv[s], &F.st0[s]);
    }
    return 0;
}

static void bi_down(void) {
    for (int s = 0; s < 2; s++)
        if (F.raw[s]) zmq_close(F.raw[s]);
    for (int r = 0; r < BI_M; r++) kvps_worker_destroy(&F.w[r]);
    if (F.up) kt_cluster_down(&F.c);
    for (int i = 0; i < F.ndeferred; i++) free(F.deferred[i]);
    free(F.vals);
    free(F.tvals);
    memset(&F, 0, sizeof F);
}

/* ---------------------------------------------------------------------------------------- */
/* Tests against the fixture. */

static void test_table(void) {
    size_t n = sizeof bi_cases / sizeof bi_cases[0];
    for (int s = 0; s < 2; s++)
        for (size_t i = 0; i < n; i++) {
            const bi_case *c = &bi_cases[i];
            if (c->server1_only && s != 1) continue;
            bi_msg m;
            bi_case_build(c, s, &m);
            bi_expect(s, &m, c->expect, c->name);
        }
}

/* A valid PUSH of two existing keys from rank 1: meta frame and values frame. */
static void bi_template(int srv, unsigned char *meta, size_t *msz, unsigned char *vals, size_t *vsz) {
    kvps__kent e[2] = {{F.ek[srv], F.el[srv]}, {F.ek2[srv], F.el2[srv]}};
    kvps__hdr h = bi_hdr(PUSH, 1, 2);
    memcpy(meta, &h, sizeof h);
    memcpy(meta + KVPS__HDR, e, sizeof e);
    *msz = KVPS__HDR + sizeof e;
    *vsz = bi_values_bytes(e, 2);
    memset(vals, 0x44, *vsz);
}

/* Every prefix, every extension and every split of a valid message, then every checked header
   byte and every length byte inverted. The whole message itself is never sent. */
static void test_byte_by_byte(void) {
    unsigned char meta[256], vals[256], cat[512];
    size_t msz, vsz;
    char what[128];
    for (int s = 0; s < 2; s++) {
        bi_template(s, meta, &msz, vals, &vsz);
        for (size_t k = 0; k < msz; k++) {
            bi_msg m = {0};
            bi_template(s, meta, &msz, vals, &vsz);
            bi_add(&m, meta, k);
            bi_add(&m, vals, vsz);
            snprintf(what, sizeof what, "meta cut to %zu of %zu bytes", k, msz);
            bi_expect(s, &m, KVPS_ERR_TRUNCATED, what);
            bi_template(s, meta, &msz, vals, &vsz);
            bi_add(&m, meta, k);
            snprintf(what, sizeof what, "meta cut to %zu of %zu bytes, no values frame", k, msz);
            bi_expect(s, &m, KVPS_ERR_TRUNCATED, what);
        }
        for (size_t k = 0; k < vsz; k++) {
            bi_msg m = {0};
            bi_template(s, meta, &msz, vals, &vsz);
            bi_add(&m, meta, msz);
            bi_add(&m, vals, k);
            snprintf(what, sizeof what, "values cut to %zu of %zu bytes", k, vsz);
            bi_expect(s, &m, KVPS_ERR_TRUNCATED, what);
        }
        for (size_t k = 1; k <= 16; k++) {
            bi_msg m = {0};
            bi_template(s, meta, &msz, vals, &vsz);
            bi_add(&m, meta, msz);
            bi_resize(&m, 0, msz + k);
            bi_add(&m, vals, vsz);
            snprintf(what, sizeof what, "meta %zu bytes long", k);
            bi_expect(s, &m, KVPS_ERR_MALFORMED, what);
            bi_template(s, meta, &msz, vals, &vsz);
            bi_add(&m, meta, msz);
            bi_add(&m, vals, vsz);
            bi_resize(&m, 1, vsz + k);
            snprintf(what, sizeof what, "values %zu bytes long", k);
            bi_expect(s, &m, KVPS_ERR_MALFORMED, what);
        }
        /* meta || values split into two frames at every wrong place */
        for (size_t k = 0; k <= msz + vsz; k++) {
            if (k == msz) continue;
            bi_msg m = {0};
            bi_template(s, meta, &msz, vals, &vsz);
            memcpy(cat, meta, msz);
            memcpy(cat + msz, vals, vsz);
            bi_add(&m, cat, k);
            bi_add(&m, cat + k, msz + vsz - k);
            snprintf(what, sizeof what, "split at byte %zu of %zu (meta is %zu)", k, msz + vsz, msz);
            bi_expect(s, &m, k < msz ? KVPS_ERR_TRUNCATED : KVPS_ERR_MALFORMED, what);
        }
        {
            bi_msg m = {0};
            bi_template(s, meta, &msz, vals, &vsz);
            memcpy(cat, meta, msz);
            memcpy(cat + msz, vals, vsz);
            for (size_t k = 0; k < msz + vsz; k++) bi_add(&m, cat + k, 1);
            bi_expect(s, &m, KVPS_ERR_TRUNCATED, "one byte per frame");
        }
        /* Each byte of magic, version, op, rank, nkeys and both lengths, inverted. Key bytes are
           left alone: a changed key is just another (new) key. */
        static const struct { size_t off; kvps_result want; } hb[] = {
            {0, KVPS_ERR_MAGIC}, {1, KVPS_ERR_MAGIC}, {2, KVPS_ERR_MAGIC}, {3, KVPS_ERR_MAGIC},
            {4, KVPS_ERR_VERSION}, {5, KVPS_ERR_OP},
            {8, KVPS_ERR_RANK}, {9, KVPS_ERR_RANK}, {10, KVPS_ERR_RANK}, {11, KVPS_ERR_RANK},
            {12, KVPS_ERR_TRUNCATED}, {13, KVPS_ERR_TRUNCATED}, {14, KVPS_ERR_TRUNCATED}, {15, KVPS_ERR_TRUNCATED}};
        for (size_t i = 0; i < sizeof hb / sizeof hb[0]; i++) {
            bi_msg m = {0};
            bi_template(s, meta, &msz, vals, &vsz);
            meta[hb[i].off] ^= 0xFF;
            bi_add(&m, meta, msz);
            bi_add(&m, vals, vsz);
            snprintf(what, sizeof what, "header byte %zu inverted", hb[i].off);
            bi_expect(s, &m, hb[i].want, what);
        }
        for (int j = 0; j < 2; j++)
            for (int b = 0; b < 8; b++) {
                bi_msg m = {0};
                bi_template(s, meta, &msz, vals, &vsz);
                size_t off = KVPS__HDR + (size_t)j * KVPS__KENT + offsetof(kvps__kent, len) + (size_t)b;
                uint64_t len;
                meta[off] ^= 0xFF;
                memcpy(&len, meta + off - (size_t)b, sizeof len);
                bi_add(&m, meta, msz);
                bi_add(&m, vals, vsz);
                snprintf(what, sizeof what, "entry %d length byte %d inverted (len %llu)", j, b,
                         (unsigned long long)len);
                bi_expect(s, &m, len > BI_MAXLEN ? KVPS_ERR_TOO_LARGE : KVPS_ERR_LEN_MISMATCH, what);
            }
    }
}

/* Random bytes: 1-4 frames of 0-100 bytes; a third start with a good magic and version. */
static void test_random_garbage(void) {
    uint64_t seed = 0xbadc0ffee;
    unsigned char buf[128];
    char what[96];
    for (int i = 0; i < 200; i++) {
        int s = i % 2, nf = 1 + (int)(kt_rng(&seed) % 4);
        bi_msg m = {0};
        int want = BI_ANY;
        for (int f = 0; f < nf; f++) {
            size_t n = (size_t)(kt_rng(&seed) % 101);
            for (size_t b = 0; b < n; b++) buf[b] = (unsigned char)kt_rng(&seed);
            if (f == 0 && n >= 6 && i % 3 == 0) {
                uint32_t magic = KVPS__MAGIC;
                memcpy(buf, &magic, 4);
                buf[4] = KVPS__VERSION;
            }
            if (f == 0) {
                kvps__hdr h;
                memcpy(&h, buf, n < sizeof h ? n : sizeof h);
                if (n >= KVPS__HDR && h.op > KVPS__OP_TABLE && h.op < KVPS__OP_COUNT) {
                    /* (the session, replica and reshard ops have checks of their own, and a
                       replica's stream is not answered: an unknown op instead) */
                    h.op = (uint8_t)(h.op + KVPS__OP_COUNT);
                    memcpy(buf, &h, sizeof h);
                }
                if (n < KVPS__HDR) want = KVPS_ERR_TRUNCATED;
                else if (h.magic != KVPS__MAGIC) want = KVPS_ERR_MAGIC;
                else if (h.version != KVPS__VERSION) want = KVPS_ERR_VERSION;
                else if (h.op < PUSH || h.op > KVPS__OP_TABLE) want = KVPS_ERR_OP;
                else if (h.rank >= BI_M) want = KVPS_ERR_RANK;
            }
            bi_add(&m, buf, n);
        }
        snprintf(what, sizeof what, "random garbage #%d", i);
        bi_expect(s, &m, want, what);
    }
}

/* A message that would be valid, with one to three faults from a list; with one fault the
   expected error is known exactly. Keys come from the server's pool (stored raw keys, slices,
   the keys the legit workers are training on, and keys nobody may create). */
enum { D_MAGIC, D_VERSION, D_OP, D_RANK, D_NKEYS, D_METALEN, D_LEN0, D_LENBIG, D_LENEXIST, D_DUP,
       D_VALUES, D_FRAMES, D_COUNT };

static int bi_fuzz_one(uint64_t *seed, int srv, bi_msg *m) {
    static const int ops[4] = {PUSH, PULL, PUSHPULL, INIT};
    memset(m, 0, sizeof *m);
    int op = ops[kt_rng(seed) % 4], nk = 1 + (int)(kt_rng(seed) % 3);
    uint32_t rank = (uint32_t)(kt_rng(seed) % BI_M);
    int values = kvps__op_has_values(op);
    kvps__kent e[8];
    int isold[8];
    for (int i = 0; i < nk; i++) {
        for (;;) { /* distinct keys */
            const bi_poolkey *p = &F.pool[srv][kt_rng(seed) % (uint64_t)F.npool[srv]];
            int dup = 0;
            for (int j = 0; j < i; j++) dup |= e[j].key == p->key;
            if (dup) continue;
            e[i].key = p->key;
            e[i].len = p->exists ? p->len : 1 + kt_rng(seed) % 6;
            isold[i] = p->exists;
            break;
        }
    }
    int d[3], nd = kt_rng(seed) % 4 == 0 ? 2 + (int)(kt_rng(seed) % 2) : 1;
    for (int i = 0; i < nd; i++) {
        int ok;
        do {
            d[i] = (int)(kt_rng(seed) % D_COUNT);
            ok = !(d[i] == D_VALUES && !values);
            for (int j = 0; j < i; j++)
                ok &= d[j] != d[i] && !((d[j] == D_NKEYS && d[i] == D_METALEN) || (d[j] == D_METALEN && d[i] == D_NKEYS));
        } while (!ok);
    }
    int want = BI_ANY, has[D_COUNT] = {0};
    for (int i = 0; i < nd; i++) has[d[i]] = 1;
    /* faults in the entries */
    if (has[D_LENEXIST]) {
        int i = (int)(kt_rng(seed) % (uint64_t)nk);
        if (!isold[i]) { /* make entry i a stored key not yet in the message */
            for (int tries = 0; tries < 64; tries++) {
                const bi_poolkey *p = &F.pool[srv][kt_rng(seed) % (uint64_t)F.npool[srv]];
                int dup = !p->exists;
                for (int j = 0; j < nk; j++) dup |= e[j].key == p->key;
                if (!dup) { e[i].key = p->key; e[i].len = p->len; isold[i] = 1; break; }
            }
        }
        if (!isold[i]) e[i].len = 0; /* (no stored key left: a zero length is a fault too) */
        else e[i].len = e[i].len > 1 && kt_rng(seed) % 2 ? e[i].len - 1 : e[i].len + 1;
        if (nd == 1) want = isold[i] ? KVPS_ERR_LEN_MISMATCH : KVPS_ERR_MALFORMED;
    }
    if (has[D_LEN0]) {
        e[kt_rng(seed) % (uint64_t)nk].len = 0;
        if (nd == 1) want = KVPS_ERR_MALFORMED;
    }
    if (has[D_LENBIG]) {
        static const uint64_t big[5] = {BI_MAXLEN + 1, BI_MAXLEN * 2 + 12345, 1ull << 40, 1ull << 62, UINT64_MAX};
        e[kt_rng(seed) % (uint64_t)nk].len = big[kt_rng(seed) % 5];
        if (nd == 1) want = KVPS_ERR_TOO_LARGE;
    }
    if (has[D_DUP]) {
        int from = (int)(kt_rng(seed) % (uint64_t)nk), at = (int)(kt_rng(seed) % (uint64_t)(nk + 1));
        kvps__kent x = e[from];
        for (int j = nk; j > at; j--) e[j] = e[j - 1];
        e[at] = x;
        nk++;
        if (nd == 1) want = KVPS_ERR_DUP_KEY;
    }
    kvps__hdr h = bi_hdr(op, rank, (uint32_t)nk);
    h.req_id ^= kt_rng(seed) << 20;
    if (has[D_MAGIC]) {
        h.magic ^= (uint32_t)(1 + kt_rng(seed) % 0xfffffffeu);
        if (nd == 1) want = KVPS_ERR_MAGIC;
    }
    if (has[D_VERSION]) {
        h.version = (uint8_t)(2 + kt_rng(seed) % 254); /* 2..255 */
        if (kt_rng(seed) % 4 == 0) h.version = 0;
        if (nd == 1) want = KVPS_ERR_VERSION;
    }
    if (has[D_OP]) {
        uint8_t bad_ops[] = {0, KVPS__OP_COUNT, KVPS__OP_COUNT + 1, 0x40, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0xfe, 0xff};
        h.op = bad_ops[kt_rng(seed) % sizeof bad_ops];
        if (nd == 1) want = KVPS_ERR_OP;
    }
    if (has[D_RANK]) {
        h.rank = kt_rng(seed) % 2 ? (uint32_t)(BI_M + kt_rng(seed) % 100) : (uint32_t)(BI_M + kt_rng(seed) % (0xffffffffu - BI_M));
        if (nd == 1) want = KVPS_ERR_RANK;
    }
    if (has[D_NKEYS]) {
        uint32_t v[4] = {0, (uint32_t)nk + 1, (uint32_t)nk + 1 + (uint32_t)(kt_rng(seed) % 1000), 0xffffffffu};
        if (nk > 1) v[0] = (uint32_t)(kt_rng(seed) % (uint64_t)nk);
        h.nkeys = v[kt_rng(seed) % 4];
        if (nd == 1) want = h.nkeys > (uint32_t)nk ? KVPS_ERR_TRUNCATED : KVPS_ERR_MALFORMED;
    }
    bi_add_meta(m, &h, e, nk);
    if (values) {
        size_t vb = bi_values_bytes(e, nk);
        if (has[D_VALUES]) {
            int64_t delta = 1 + (int64_t)(kt_rng(seed) % 9);
            if (kt_rng(seed) % 2 && (size_t)delta <= vb) {
                vb -= (size_t)delta;
                if (nd == 1) want = KVPS_ERR_TRUNCATED;
            } else {
                vb += (size_t)delta;
                if (nd == 1) want = KVPS_ERR_MALFORMED;
            }
        }
        bi_add(m, NULL, vb);
    }
    if (has[D_FRAMES]) {
        if (values && kt_rng(seed) % 2) {
            free(m->data[--m->nf]);
            if (nd == 1) want = KVPS_ERR_TRUNCATED;
        } else {
            int extra = 1 + (int)(kt_rng(seed) % 3);
            for (int i = 0; i < extra; i++) bi_add(m, NULL, (size_t)(kt_rng(seed) % 24));
            if (nd == 1) want = KVPS_ERR_MALFORMED;
        }
    }
    if (has[D_METALEN]) {
        size_t full = m->size[0];
        if (kt_rng(seed) % 2) {
            bi_resize(m, 0, full - 1 - (size_t)(kt_rng(seed) % full));
            if (nd == 1) want = KVPS_ERR_TRUNCATED;
        } else {
            bi_resize(m, 0, full + 1 + (size_t)(kt_rng(seed) % 40));
            if (nd == 1) want = KVPS_ERR_MALFORMED;
        }
    }
    return want;
}

static void test_fuzz_known_faults(void) {
    uint64_t seed = 0xf00d;
    char what[64];
    for (int i = 0; i < 300; i++) {
        bi_msg m;
        int s = i % 2, want = bi_fuzz_one(&seed, s, &m);
        snprintf(what, sizeof what, "fuzz #%d", i);
        bi_expect(s, &m, want, what);
    }
}

/* A REQ socket puts an empty delimiter before the meta frame: an error the REQ never sees
   (it drops a reply without the delimiter). */
static void test_req_socket(void) {
    void *req = zmq_socket(F.c.ctx, ZMQ_REQ);
    int zero = 0;
    zmq_setsockopt(req, ZMQ_LINGER, &zero, sizeof zero);
    KT_CHECK(zmq_connect(req, kvps_server_endpoint(F.c.srv[0])) == 0, "connect");
    unsigned char meta[256], vals[256];
    size_t msz, vsz;
    bi_template(0, meta, &msz, vals, &vsz);
    kvps_server_stats st;
    kvps_server_stats_get(F.c.srv[0], &st);
    uint64_t want = st.errors + 1;
    zmq_send(req, meta, msz, ZMQ_SNDMORE);
    zmq_send(req, vals, vsz, 0);
    F.bad[0]++;
    int64_t t0 = kvps__now_ms();
    while (st.errors < want && kvps__now_ms() - t0 < BI_REPLY_MS) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        kvps_server_stats_get(F.c.srv[0], &st);
    }
    KT_CHECK(st.errors == want, "server errors %llu, want %llu", (unsigned long long)st.errors,
             (unsigned long long)want);
    zmq_close(req);
}

/* Bytes that are not ZMTP at all, straight to the TCP port: ZeroMQ drops the connection and
   the server serves on. */
static void test_raw_tcp(void) {
    const char *ep = kvps_server_endpoint(F.c.srv[0]);
    const char *colon = strrchr(ep, ':');
    KT_CHECK(strncmp(ep, "tcp://", 6) == 0 && colon, "endpoint %s", ep);
    if (!colon) return;
    static const unsigned char bogus_zmtp[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0, 'B', 'O', 'G', 'U', 'S'};
    const char *http = "GET / HTTP/1.1\r\nHost: kvps\r\n\r\n";
    for (int i = 0; i < 3; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        KT_CHECK(fd >= 0, "socket");
        if (fd < 0) return;
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)atoi(colon + 1));
        a.sin_addr.s_addr = htonl(0x7f000001);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            ssize_t w = 0;
            if (i == 0) w = write(fd, http, strlen(http));
            if (i == 1) w = write(fd, bogus_zmtp, sizeof bogus_zmtp);
            (void)w; /* i == 2: connect and hang up */
        } else {
            KT_CHECK(0, "connect to %s failed", ep);
        }
        close(fd);
    }
    /* still answering */
    bi_msg m;
    bi_case_build(&bi_cases[0], 0, &m);
    bi_expect(0, &m, bi_cases[0].expect, "after raw TCP garbage");
}

/* ONLY THE JOB TALKS TO THE JOB (kvps.h, SECURITY), over tcp: with the door shut, messages from
   connections that never said hello are refused (KVPS_ERR_AUTH) and change nothing: a valid push
   to a raw key, BYE for every rank (which would stop the servers), DROP and PLACE (reshard), a
   barrier, REPL of several kinds claiming a later epoch, then every op but HELLO with and without
   a values frame; the same from a socket that forges worker 0's routing id with another
   incarnation; and a hello with a job token the servers do not have.
   test_nothing_changed then finds every value and the servers serving. */
static void test_strangers_refused(void) {
    for (int s = 0; s < 2; s++) __atomic_store_n(&F.c.srv[s]->gate, 0, __ATOMIC_RELAXED);
    uint64_t st0[2];
    for (int s = 0; s < 2; s++) {
        kvps_server_stats st;
        kvps_server_stats_get(F.c.srv[s], &st);
        st0[s] = st.strangers;
    }
    int sent[2] = {0, 0};
    for (int forged = 0; forged < 2; forged++)
        for (int s = 0; s < 2; s++) {
            void *d = zmq_socket(F.c.ctx, ZMQ_DEALER);
            int zero = 0;
            zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
            uint32_t inc = F.w[0]->incarnation + 1 + (uint32_t)forged, rk = 0, si = (uint32_t)s; /* (a refused hello is remembered by incarnation) */
            if (forged) { /* worker 0's socket's routing id, but not its incarnation */
                unsigned char rid[16] = {'k', 'v', 'p', 's'};
                memcpy(rid + 4, &inc, 4);
                memcpy(rid + 8, &rk, 4);
                memcpy(rid + 12, &si, 4);
                zmq_setsockopt(d, ZMQ_ROUTING_ID, rid, sizeof rid);
            }
            zmq_connect(d, kvps_server_endpoint(F.c.srv[s]));
            unsigned char meta[KVPS__HDR + KVPS__KENT];
            float vals[8] = {1, 2, 3, 4, 5, 6, 7, 8};
            struct { const char *what; int op; uint32_t rank, nkeys, aux; uint64_t req; size_t vbytes; } cs[] = {
                {"a valid push", PUSH, 0, 1, 0, 1, F.el[s] * 4},
                {"BYE of rank 0", KVPS__OP_BYE, 0, 0, 0, 2, 0},
                {"BYE of rank 1", KVPS__OP_BYE, 1, 0, 0, 3, 0},
                {"DROP", KVPS__OP_DROP, 0, 0, 0, 4, 8},
                {"PLACE", KVPS__OP_PLACE, 1, 0, 0, 5, 8},
                {"barrier", BARRIER, 1, 0, 0, 6, 0},
                {"REPL forward, epoch 9", KVPS__OP_REPL, KVPS__REPL_FWD, 9, 1, 1, 8},
                {"REPL snapshot, epoch 9", KVPS__OP_REPL, KVPS__REPL_SNAP, 9, 1, 1, 8},
                {"REPL worker lost, epoch 9", KVPS__OP_REPL, KVPS__REPL_LOST, 9, 1, 1, 4},
                {"REPL hello without the chain", KVPS__OP_REPL, KVPS__REPL_HELLO, 9, 1, 0, 16},
            };
            for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
                kt_raw_meta(meta, cs[i].op, F.ek[s], F.el[s]);
                kvps__hdr h = KT_HDR(.op = (uint8_t)cs[i].op, .rank = cs[i].rank, .nkeys = cs[i].op == PUSH ? 1 : cs[i].nkeys,
                                     .aux = cs[i].aux, .req_id = cs[i].req, .status = (int32_t)inc);
                memcpy(meta, &h, sizeof h);
                size_t msz = cs[i].op == PUSH ? sizeof meta : KVPS__HDR;
                int32_t st = kt_raw_status(d, meta, msz, vals, cs[i].vbytes, BI_REPLY_MS);
                KT_CHECK(st == KVPS_ERR_AUTH, "%s%s to server %d: status %d (%s), want KVPS_ERR_AUTH", cs[i].what,
                         forged ? " (forged routing id)" : "", s, st, bi_str(st));
                sent[s]++;
            }
            /* every other op, header only and with a values frame */
            for (int op = KVPS__OP_PUSH; op < KVPS__OP_COUNT; op++) {
                if (op == KVPS__OP_HELLO) continue;
                for (int withv = 0; withv < 2; withv++) {
                    kvps__hdr h = KT_HDR(.op = (uint8_t)op, .rank = 1, .nkeys = op == KVPS__OP_REPL ? 9 : 0, .aux = 1,
                                         .req_id = 100 + (uint64_t)op, .status = (int32_t)inc);
                    int32_t st = kt_raw_status(d, &h, sizeof h, withv ? vals : NULL, 8, BI_REPLY_MS);
                    KT_CHECK(st == KVPS_ERR_AUTH, "op %d (%s)%s%s to server %d: status %d (%s), want KVPS_ERR_AUTH", op,
                             kvps__ops[op].name, withv ? " with values" : "", forged ? ", forged routing id" : "", s, st,
                             bi_str(st));
                    sent[s]++;
                }
            }
            /* a hello carrying a job token these servers do not have */
            unsigned char v[KVPS__HELLO_BYTES] = {0};
            uint64_t tok = 0x1234567890abcdefull, hash = 0;
            kvps__put32(v, KVPS__PROTO);
            kvps__put32(v + 4, BI_M);
            kvps__put32(v + 8, 2);
            kvps__put32(v + 12, (uint32_t)s);
            memcpy(v + 16, &hash, 8);
            memcpy(v + 48, &tok, 8);
            kvps__hdr h = KT_HDR(.op = KVPS__OP_HELLO, .rank = 1, .req_id = 9, .status = (int32_t)inc);
            int32_t st = kt_raw_status(d, &h, sizeof h, v, sizeof v, BI_REPLY_MS);
            KT_CHECK(st == KVPS_ERR_AUTH, "a hello with another job token to server %d: %d (%s)", s, st, bi_str(st));
            sent[s]++;
            zmq_close(d);
        }
    for (int s = 0; s < 2; s++) {
        kvps_server_stats st;
        kvps_server_stats_get(F.c.srv[s], &st);
        KT_CHECK(st.strangers - st0[s] == (uint64_t)sent[s], "server %d: %llu strangers counted, %d refused",
                 s, (unsigned long long)(st.strangers - st0[s]), sent[s]);
        F.bad[s] += (uint64_t)sent[s];
    }
    for (int s = 0; s < 2; s++) __atomic_store_n(&F.c.srv[s]->gate, -1, __ATOMIC_RELAXED);
}

/* Nothing changed: counters other than errors, and every stored value bit for bit. */
static void bi_check_unchanged(int check_counters) {
    for (int s = 0; s < 2; s++) {
        kvps_server_stats st;
        kvps_server_stats_get(F.c.srv[s], &st);
        KT_CHECK(st.keys == F.st0[s].keys && st.value_bytes == F.st0[s].value_bytes,
                 "server %d: %llu keys / %llu bytes, were %llu / %llu", s, (unsigned long long)st.keys,
                 (unsigned long long)st.value_bytes, (unsigned long long)F.st0[s].keys,
                 (unsigned long long)F.st0[s].value_bytes);
        if (check_counters)
            KT_CHECK(st.pushes == F.st0[s].pushes && st.pulls == F.st0[s].pulls && st.rounds == F.st0[s].rounds,
                     "server %d: pushes %llu pulls %llu rounds %llu, were %llu %llu %llu", s,
                     (unsigned long long)st.pushes, (unsigned long long)st.pulls, (unsigned long long)st.rounds,
                     (unsigned long long)F.st0[s].pushes, (unsigned long long)F.st0[s].pulls,
                     (unsigned long long)F.st0[s].rounds);
        KT_CHECK(st.errors == F.st0[s].errors + F.bad[s], "server %d: %llu errors counted, %llu bad messages sent",
                 s, (unsigned long long)(st.errors - F.st0[s].errors), (unsigned long long)F.bad[s]);
    }
    float *v = (float *)malloc(F.vtot * sizeof(float));
    float *tv = (float *)malloc(BI_TLEN * sizeof(float));
    memset(v, 0xee, F.vtot * sizeof(float));
    memset(tv, 0xee, BI_TLEN * sizeof(float));
    kvps_req q[2];
    KT_OK(kvps_worker_pull(F.w[0], F.keys, v, F.lens, BI_NRAW, &q[0]));
    KT_OK(kvps_worker_pull_tensor(F.w[0], F.t, tv, &q[1]));
    int bad = bi_waitq(F.w[0], q[0], "pull raw keys");
    bad |= bi_waitq(F.w[0], q[1], "pull bad.tensor");
    if (!bad) {
        KT_CHECK(memcmp(v, F.vals, F.vtot * sizeof(float)) == 0, "raw keys changed");
        KT_CHECK(memcmp(tv, F.tvals, BI_TLEN * sizeof(float)) == 0, "bad.tensor changed");
    }
    if (bad) { bi_defer_free(v); bi_defer_free(tv); }
    else { free(v); free(tv); }
}

static void test_nothing_changed(void) {
    bi_check_unchanged(1);
    /* stray replies: exactly one per bad message */
    for (int s = 0; s < 2; s++) {
        bi_reply r;
        KT_CHECK(bi_recv(F.raw[s], 50, &r) == 0, "server %d: a stray reply", s);
    }
}

/* Two legit workers train while the raw DEALER keeps sending faulty messages, many of them
   naming the very keys being trained, from the workers' own ranks. Each leaves its buffers in
   its record, freed by the main thread (after the workers when a wait failed). */
typedef struct bi_bufs { float *buf[4]; } bi_bufs;

static float bi_mean(int k, size_t i) {
    float s = bi_grad(0, k, i, 0);
    s += bi_grad(1, k, i, 0);
    return s / 2.0f;
}

static void bi_legit_main(kt_wk *x) {
    bi_bufs *j = (bi_bufs *)x->mine;
    kvps_worker *w = F.w[x->rank];
    float *g = (float *)malloc(F.ltot * sizeof(float)), *v = (float *)malloc(F.ltot * sizeof(float));
    float *gt = (float *)malloc(BI_LTLEN * sizeof(float)), *vt = (float *)malloc(BI_LTLEN * sizeof(float));
    for (int k = 0; k < BI_ROUNDS && !x->fails; k++) {
        for (size_t i = 0; i < F.ltot; i++) g[i] = bi_grad(x->rank, k, i, F.async);
        for (size_t i = 0; i < BI_LTLEN; i++) gt[i] = bi_grad(x->rank, k, 100000 + i, F.async);
        kvps_req q[2];
        kvps_result r0 = kvps_worker_pushpull(w, F.lk, g, v, F.ll, BI_NLEGIT, &q[0]);
        kvps_result r1 = kvps_worker_pushpull_tensor(w, F.lt[x->rank], gt, vt, &q[1]);
        if (r0 == KVPS_OK) r0 = kvps_worker_wait(w, q[0], BI_WAIT_MS);
        if (r1 == KVPS_OK) r1 = kvps_worker_wait(w, q[1], BI_WAIT_MS);
        if (r0 != KVPS_OK || r1 != KVPS_OK) {
            kt_wk_fail(x, "round %d: %s / %s (%.100s)", k, kvps_result_str(r0), kvps_result_str(r1), kvps_worker_last_error(w));
            break;
        }
        if (F.async) continue; /* async: only the final sum is determined */
        for (size_t i = 0; i < F.ltot + BI_LTLEN && !x->fails; i++) {
            float got = i < F.ltot ? v[i] : vt[i - F.ltot];
            float want = i < F.ltot ? bi_mean(k, i) : bi_mean(k, 100000 + i - F.ltot);
            if (memcmp(&got, &want, sizeof got) != 0) kt_wk_fail(x, "round %d element %zu: %.9g, want %.9g", k, i, got, want);
        }
    }
    j->buf[0] = g; j->buf[1] = v; j->buf[2] = gt; j->buf[3] = vt;
}

static void test_legit_workers_under_fire(void) {
    bi_bufs bufs[BI_M];
    kt_workers ws;
    kt_workers_init(&ws, "legit", bi_legit_main, BI_M, NULL, NULL); /* (the fixture's workers, F.w) */
    ws.each = bufs;
    ws.each_size = sizeof bufs[0];
    kt_workers_start(&ws);
    uint64_t seed = 0xfeed;
    int sent = 0;
    char what[64];
    for (;;) {
        if (kt_workers_done(&ws) && sent >= 100) break;
        bi_msg m;
        int s = sent % 2, want = bi_fuzz_one(&seed, s, &m);
        snprintf(what, sizeof what, "under fire #%d", sent);
        bi_expect(s, &m, want, what);
        sent++;
    }
    kt_workers_join(&ws); /* (each failure reported) */
    for (int r = 0; r < BI_M; r++)
        for (int i = 0; i < 4; i++) {
            if (ws.wk[r].fails) bi_defer_free(bufs[r].buf[i]);
            else free(bufs[r].buf[i]);
        }
    /* The final values: the last round's mean (BSP) or the sum of everything pushed (async). */
    float *v = (float *)malloc(F.ltot * sizeof(float)), *vt = (float *)malloc(BI_LTLEN * sizeof(float));
    kvps_req q[2];
    KT_OK(kvps_worker_pull(F.w[0], F.lk, v, F.ll, BI_NLEGIT, &q[0]));
    KT_OK(kvps_worker_pull_tensor(F.w[0], F.lt[0], vt, &q[1]));
    int failed = bi_waitq(F.w[0], q[0], "pull legit keys");
    failed |= bi_waitq(F.w[0], q[1], "pull legit.tensor");
    if (!failed) {
        int bad = 0;
        for (size_t i = 0; i < F.ltot + BI_LTLEN; i++) {
            size_t gi = i < F.ltot ? i : 100000 + i - F.ltot;
            float want = 0.0f;
            if (F.async)
                for (int k = 0; k < BI_ROUNDS; k++)
                    for (int r = 0; r < BI_M; r++) want += bi_grad(r, k, gi, 1);
            else
                want = bi_mean(BI_ROUNDS - 1, gi);
            float got = i < F.ltot ? v[i] : vt[i - F.ltot];
            if (memcmp(&got, &want, sizeof got) != 0 && bad++ < 3)
                KT_CHECK(0, "element %zu: %.9g, want %.9g", i, got, want);
        }
    }
    if (failed) { bi_defer_free(v); bi_defer_free(vt); }
    else { free(v); free(vt); }
    /* and the bad messages changed nothing else */
    bi_check_unchanged(0);
}

/* The fixture as a test of its own ("setup [tcp BSP]"), so that a failure to set up is counted. */
static const char *bi_transport;
static kvps_consistency bi_cons;
static int bi_setup_rc;
static void setup(void) {
    bi_setup_rc = bi_up(bi_transport, bi_cons);
    KT_CHECK(bi_setup_rc == 0, "fixture setup failed");
}

static void bi_suite(const char *transport, kvps_consistency cons) {
    memset(&F, 0, sizeof F);
    snprintf(kt_label, sizeof kt_label, "%s %s", transport, cons == KVPS_ASYNC ? "async" : "BSP");
    bi_transport = transport;
    bi_cons = cons;
    KT_RUN(setup);
    if (bi_setup_rc == 0) {
        KT_RUN(test_table);
        KT_RUN(test_byte_by_byte);
        KT_RUN(test_random_garbage);
        KT_RUN(test_fuzz_known_faults);
        KT_RUN(test_req_socket);
        if (strcmp(transport, "tcp") == 0) KT_RUN(test_raw_tcp);
        if (strcmp(transport, "tcp") == 0) KT_RUN(test_strangers_refused);
        KT_RUN(test_nothing_changed);
        KT_RUN(test_legit_workers_under_fire);
    }
    bi_down();
    kt_label[0] = 0;
}

/* ---------------------------------------------------------------------------------------- */
/* A server told to take lengths of any size: sizes read off the wire must still not overflow,
   and a request that fails must not leave keys behind. */

static void test_unlimited_max_value_len(void) {
    kt_cluster c;
    if (kt_cluster_up(&c, "inproc", 1, &(kvps_server_desc){.num_workers = 1, .max_value_len = UINT64_MAX}) != 0) {
        KT_CHECK(0, "cluster");
        kt_cluster_down(&c);
        return;
    }
    void *d = zmq_socket(c.ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    zmq_connect(d, kvps_server_endpoint(c.srv[0]));
    static const struct {
        const char *name;
        int op, nk;
        kvps__kent e[2];
        size_t vbytes;
        int wire_error; /* 1: a wire error (TRUNCATED / TOO_LARGE) is the only right answer */
    } cases[] = {
        {"push len 1 + len 2^62 with a 4-byte values frame (sum x4 wraps to 4)", PUSH, 2,
         {{11, 1}, {12, 1ull << 62}}, 4, 1},
        {"push len 2^62 with an empty values frame (x4 wraps to 0)", PUSH, 1, {{21, 1ull << 62}, {0, 0}}, 0, 1},
        {"push len 2^63 + len 2^63 with an empty values frame (the sum wraps to 0)", PUSH, 2,
         {{31, 1ull << 63}, {32, 1ull << 63}}, 0, 1},
        {"pull len 1 + len 2^62 (the second cannot be allocated)", PULL, 2, {{41, 1}, {42, 1ull << 62}}, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bi_msg m = {0};
        kvps_server_stats st0, sst;
        kvps_server_stats_get(c.srv[0], &st0);
        kvps__hdr h = bi_hdr(cases[i].op, 0, (uint32_t)cases[i].nk);
        bi_add_meta(&m, &h, cases[i].e, cases[i].nk);
        if (cases[i].op == PUSH) bi_add(&m, NULL, cases[i].vbytes);
        int st = bi_roundtrip(d, &m, BI_ANY, cases[i].name, 0);
        if (cases[i].wire_error)
            KT_CHECK(st == KVPS_ERR_TRUNCATED || st == KVPS_ERR_TOO_LARGE, "'%s': got %s, want TRUNCATED or TOO_LARGE",
                     cases[i].name, bi_str(st));
        kvps_server_stats_get(c.srv[0], &sst);
        KT_CHECK(sst.keys == st0.keys && sst.value_bytes == st0.value_bytes,
                 "'%s' was rejected (%s) but left %llu keys (%llu bytes) behind", cases[i].name, bi_str(st),
                 (unsigned long long)(sst.keys - st0.keys), (unsigned long long)(sst.value_bytes - st0.value_bytes));
    }
    zmq_close(d);
    kt_cluster_down(&c);
}

/* ---------------------------------------------------------------------------------------- */
/* The worker API's side. */

typedef struct bi_api {
    kt_cluster c;
    kvps_worker *w;
} bi_api;

static int bi_api_up(bi_api *a) {
    memset(a, 0, sizeof *a);
    if (kt_cluster_up(&a->c, "inproc", 2,
                      &(kvps_server_desc){.num_workers = 2, .consistency = KVPS_ASYNC, .update = KVPS_UPDATE_ACCUMULATE}) != 0)
        return -1;
    return kvps_worker_create(&(kvps_worker_desc){.servers = a->c.servers, .num_workers = 2, .zmq_ctx = a->c.ctx,
                                                  .timeout_ms = 5000},
                              &a->w) == KVPS_OK ? 0 : -1;
}

static void bi_api_down(bi_api *a) {
    kvps_worker_destroy(&a->w);
    kt_cluster_down(&a->c);
}

static uint64_t bi_api_errors(bi_api *a) {
    uint64_t e = 0;
    for (int s = 0; s < 2; s++) {
        kvps_server_stats st;
        kvps_server_stats_get(a->c.srv[s], &st);
        e += st.errors;
    }
    return e;
}

/* Anything that reached a server: keys created or pushes received. */
static uint64_t bi_api_activity(bi_api *a) {
    uint64_t e = 0;
    for (int s = 0; s < 2; s++) {
        kvps_server_stats st;
        kvps_server_stats_get(a->c.srv[s], &st);
        e += st.pushes + st.keys;
    }
    return e;
}

static void test_worker_reserved_keys(void) {
    bi_api a;
    if (bi_api_up(&a) != 0) { KT_CHECK(0, "setup"); bi_api_down(&a); return; }
    uint64_t keys[3] = {7, 1ull << 63, 9};
    uint64_t k63[1] = {UINT64_MAX};
    size_t lens[3] = {2, 2, 2};
    float vals[6] = {1, 2, 3, 4, 5, 6}, out[6];
    kvps_req q = 12345;
    KT_CHECK(kvps_worker_push(a.w, keys, vals, lens, 3, &q) == KVPS_ERR_KEY_RESERVED, "push");
    KT_CHECK(q == 0, "handle %llu after an error", (unsigned long long)q);
    KT_CHECK(kvps_worker_pull(a.w, keys + 1, out, lens, 1, &q) == KVPS_ERR_KEY_RESERVED, "pull");
    KT_CHECK(kvps_worker_pushpull(a.w, keys, vals, out, lens, 3, &q) == KVPS_ERR_KEY_RESERVED, "pushpull");
    KT_CHECK(kvps_worker_init(a.w, k63, vals, lens, 1, &q) == KVPS_ERR_KEY_RESERVED, "init");
    /* nothing went out: the good keys 7 and 9 were not pushed either */
    KT_CHECK(bi_api_activity(&a) == 0, "a push reached a server");
    KT_OK(kvps_worker_push(a.w, keys, vals, lens, 1, &q));
    KT_OK(kvps_worker_wait(a.w, q, -1));
    bi_api_down(&a);
}

static void test_worker_len_mismatch(void) {
    bi_api a;
    if (bi_api_up(&a) != 0) { KT_CHECK(0, "setup"); bi_api_down(&a); return; }
    uint64_t key[1] = {77};
    size_t l3[1] = {3}, l4[1] = {4}, l2[1] = {2};
    float v[4] = {1, 2, 3, 4}, out[4];
    kvps_req q;
    KT_OK(kvps_worker_push(a.w, key, v, l3, 1, &q));
    KT_OK(kvps_worker_wait(a.w, q, -1));
    uint64_t e0 = bi_api_errors(&a);
    struct { const char *name; int op; const size_t *lens; } cs[] = {
        {"push, len 4", PUSH, l4}, {"push, len 2", PUSH, l2}, {"pull, len 4", PULL, l4},
        {"pushpull, len 2", PUSHPULL, l2}, {"init, len 4", INIT, l4}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        kvps_result r;
        memset(out, 0x7f, sizeof out);
        switch (cs[i].op) {
        case PUSH: r = kvps_worker_push(a.w, key, v, cs[i].lens, 1, &q); break;
        case PULL: r = kvps_worker_pull(a.w, key, out, cs[i].lens, 1, &q); break;
        case PUSHPULL: r = kvps_worker_pushpull(a.w, key, v, out, cs[i].lens, 1, &q); break;
        default: r = kvps_worker_init(a.w, key, v, cs[i].lens, 1, &q); break;
        }
        KT_CHECK(r == KVPS_OK, "%s: %s", cs[i].name, kvps_result_str(r));
        if (r != KVPS_OK) continue;
        r = kvps_worker_wait(a.w, q, -1);
        KT_CHECK(r == KVPS_ERR_LEN_MISMATCH, "%s: %s", cs[i].name, kvps_result_str(r));
        const char *msg = kvps_worker_last_error(a.w);
        KT_CHECK(msg && strstr(msg, "server") && strlen(msg) > strlen("server 0: "), "%s: last_error '%s'",
                 cs[i].name, msg ? msg : "(null)");
        unsigned char sentinel[sizeof out];
        memset(sentinel, 0x7f, sizeof sentinel);
        KT_CHECK(memcmp(out, sentinel, sizeof out) == 0, "%s: the destination was written", cs[i].name);
    }
    KT_CHECK(bi_api_errors(&a) == e0 + 5, "%llu errors counted, 5 sent", (unsigned long long)(bi_api_errors(&a) - e0));
    /* the same key twice in one call */
    uint64_t kk[2] = {77, 77};
    size_t ll[2] = {3, 3};
    float vv[6] = {0};
    KT_OK(kvps_worker_push(a.w, kk, vv, ll, 2, &q));
    kvps_result r = kvps_worker_wait(a.w, q, -1);
    KT_CHECK(r == KVPS_ERR_DUP_KEY, "duplicate key: %s", kvps_result_str(r));
    /* the key still holds what the one good push put there */
    KT_OK(kvps_worker_pull(a.w, key, out, l3, 1, &q));
    KT_OK(kvps_worker_wait(a.w, q, -1));
    KT_CHECK(memcmp(out, v, 3 * sizeof(float)) == 0, "key 77 = %g %g %g", out[0], out[1], out[2]);
    /* A tensor registered with another length on another worker: every slice mismatches. */
    kvps_worker *w2 = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = a.c.servers, .rank = 1, .zmq_ctx = a.c.ctx, .timeout_ms = 5000}, &w2));
    kvps_tensor t1, t2;
    float *tv = (float *)calloc(3002, sizeof(float)), *tg = (float *)malloc(3002 * sizeof(float));
    for (int i = 0; i < 3002; i++) tg[i] = 1.0f;
    KT_OK(kvps_worker_tensor(a.w, "t", 3000, &t1));
    KT_OK(kvps_worker_tensor(w2, "t", 3002, &t2));
    KT_OK(kvps_worker_push_tensor(a.w, t1, tg, &q));
    KT_OK(kvps_worker_wait(a.w, q, -1));
    KT_OK(kvps_worker_push_tensor(w2, t2, tg, &q));
    r = kvps_worker_wait(w2, q, -1);
    KT_CHECK(r == KVPS_ERR_LEN_MISMATCH, "tensor of another length: %s", kvps_result_str(r));
    KT_CHECK(kvps_worker_last_error(w2)[0] != 0, "no last_error");
    KT_OK(kvps_worker_pull_tensor(a.w, t1, tv, &q));
    KT_OK(kvps_worker_wait(a.w, q, -1));
    int ones = 0;
    for (int i = 0; i < 3000; i++) ones += tv[i] == 1.0f;
    KT_CHECK(ones == 3000, "tensor t: %d of 3000 elements still 1", ones);
    kvps_worker_destroy(&w2);
    bi_api_down(&a); /* first: after a timeout the buffers are still borrowed */
    free(tv);
    free(tg);
}

static void test_worker_invalid_args(void) {
    bi_api a;
    if (bi_api_up(&a) != 0) { KT_CHECK(0, "setup"); bi_api_down(&a); return; }
    kvps_worker *w = a.w;
    uint64_t k[2] = {1, 2};
    size_t l[2] = {2, 2}, l0[2] = {2, 0};
    float v[4] = {1, 2, 3, 4}, o[4];
    kvps_req q;
    kvps_tensor t, tn;
    int done = -1;
    KT_OK(kvps_worker_tensor(w, "x", 10, &t));
    const struct { const char *name; kvps_result got, want; } cs[] = {
        {"push: no worker", kvps_worker_push(NULL, k, v, l, 2, &q), KVPS_ERR_INVALID_ARG},
        {"push: no keys", kvps_worker_push(w, NULL, v, l, 2, &q), KVPS_ERR_INVALID_ARG},
        {"push: no values", kvps_worker_push(w, k, NULL, l, 2, &q), KVPS_ERR_INVALID_ARG},
        {"push: no lens", kvps_worker_push(w, k, v, NULL, 2, &q), KVPS_ERR_INVALID_ARG},
        {"push: no out", kvps_worker_push(w, k, v, l, 2, NULL), KVPS_ERR_INVALID_ARG},
        {"push: nkeys 0", kvps_worker_push(w, k, v, l, 0, &q), KVPS_ERR_INVALID_ARG},
        {"push: len 0", kvps_worker_push(w, k, v, l0, 2, &q), KVPS_ERR_INVALID_ARG},
        {"pull: no destination", kvps_worker_pull(w, k, NULL, l, 2, &q), KVPS_ERR_INVALID_ARG},
        {"pull: len 0", kvps_worker_pull(w, k, o, l0, 2, &q), KVPS_ERR_INVALID_ARG},
        {"pushpull: no grads", kvps_worker_pushpull(w, k, NULL, o, l, 2, &q), KVPS_ERR_INVALID_ARG},
        {"pushpull: no destination", kvps_worker_pushpull(w, k, v, NULL, l, 2, &q), KVPS_ERR_INVALID_ARG},
        {"init: no values", kvps_worker_init(w, k, NULL, l, 2, &q), KVPS_ERR_INVALID_ARG},
        {"init: nkeys 0", kvps_worker_init(w, k, v, l, 0, &q), KVPS_ERR_INVALID_ARG},
        {"tensor: no name", kvps_worker_tensor(w, NULL, 10, &tn), KVPS_ERR_INVALID_ARG},
        {"tensor: empty name", kvps_worker_tensor(w, "", 10, &tn), KVPS_ERR_INVALID_ARG},
        {"tensor: len 0", kvps_worker_tensor(w, "y", 0, &tn), KVPS_ERR_INVALID_ARG},
        {"tensor: no out", kvps_worker_tensor(w, "y", 10, NULL), KVPS_ERR_INVALID_ARG},
        {"tensor: no worker", kvps_worker_tensor(NULL, "y", 10, &tn), KVPS_ERR_INVALID_ARG},
        {"tensor: name registered twice", kvps_worker_tensor(w, "x", 10, &tn), KVPS_ERR_TENSOR},
        {"push_tensor: handle -1", kvps_worker_push_tensor(w, -1, v, &q), KVPS_ERR_TENSOR},
        {"push_tensor: handle 99", kvps_worker_push_tensor(w, 99, v, &q), KVPS_ERR_TENSOR},
        {"pull_tensor: handle 1", kvps_worker_pull_tensor(w, t + 1, o, &q), KVPS_ERR_TENSOR},
        {"pushpull_tensor: bad handle", kvps_worker_pushpull_tensor(w, 12345, v, o, &q), KVPS_ERR_TENSOR},
        {"init_tensor: bad handle", kvps_worker_init_tensor(w, -7, v, &q), KVPS_ERR_TENSOR},
        {"push_tensor: no values", kvps_worker_push_tensor(w, t, NULL, &q), KVPS_ERR_INVALID_ARG},
        {"pull_tensor: no destination", kvps_worker_pull_tensor(w, t, NULL, &q), KVPS_ERR_INVALID_ARG},
        {"pull_tensor: no out", kvps_worker_pull_tensor(w, t, o, NULL), KVPS_ERR_INVALID_ARG},
        {"pull_tensor: no worker", kvps_worker_pull_tensor(NULL, t, o, &q), KVPS_ERR_INVALID_ARG},
        {"barrier: no worker", kvps_worker_barrier(NULL, &q), KVPS_ERR_INVALID_ARG},
        {"barrier: no out", kvps_worker_barrier(w, NULL), KVPS_ERR_INVALID_ARG},
        {"wait: no worker", kvps_worker_wait(NULL, 1, 0), KVPS_ERR_INVALID_ARG},
        {"wait: handle 0", kvps_worker_wait(w, 0, 0), KVPS_ERR_INVALID_REQ},
        {"wait: made-up handle", kvps_worker_wait(w, 0xdeadbeef00000001ull, 0), KVPS_ERR_INVALID_REQ},
        {"wait: handle 2^64-1", kvps_worker_wait(w, UINT64_MAX, 0), KVPS_ERR_INVALID_REQ},
        {"test: no done", kvps_worker_test(w, 1, NULL), KVPS_ERR_INVALID_ARG},
        {"test: no worker", kvps_worker_test(NULL, 1, &done), KVPS_ERR_INVALID_ARG},
        {"env_read: NULL", kvps_env_read(NULL), KVPS_ERR_INVALID_ARG},
        {"server_run: NULL", kvps_server_run(NULL), KVPS_ERR_INVALID_ARG},
        {"server_start: NULL", kvps_server_start(NULL), KVPS_ERR_INVALID_ARG},
        {"server_start: started twice", kvps_server_start(a.c.srv[0]), KVPS_ERR_STATE},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        KT_CHECK(cs[i].got == cs[i].want, "%s: %s, want %s", cs[i].name, kvps_result_str(cs[i].got),
                 kvps_result_str(cs[i].want));
    KT_CHECK(kvps_worker_tensor_slices(w, 99) == 0 && kvps_worker_tensor_slices(w, -1) == 0 &&
                 kvps_worker_tensor_slices(NULL, 0) == 0, "tensor_slices of a bad handle");
    KT_CHECK(kvps_worker_num_servers(NULL) == 0 && kvps_worker_num_servers(w) == 2, "num_servers");
    KT_CHECK(kvps_worker_last_error(NULL) != NULL, "last_error(NULL)");
    KT_CHECK(kvps_server_endpoint(NULL) == NULL, "server_endpoint(NULL)");
    kvps_server_stats st;
    memset(&st, 0xab, sizeof st);
    kvps_server_stats_get(NULL, &st);
    kvps_server_stats_get(a.c.srv[0], NULL);
    kvps_server_stop(NULL);
    kvps_server_destroy(NULL);
    kvps_worker_destroy(NULL);
    kvps_server *ns = NULL;
    kvps_worker *nw = NULL;
    kvps_server_destroy(&ns);
    kvps_worker_destroy(&nw);
    /* Handles: a completed one is gone, also once its slot is reused. */
    kvps_req q1, q2;
    KT_OK(kvps_worker_push(w, k, v, l, 2, &q1));
    KT_OK(kvps_worker_wait(w, q1, -1));
    KT_CHECK(kvps_worker_wait(w, q1, 0) == KVPS_ERR_INVALID_REQ, "wait on a completed handle");
    KT_CHECK(kvps_worker_test(w, q1, &done) == KVPS_ERR_INVALID_REQ, "test on a completed handle");
    KT_OK(kvps_worker_pull(w, k, o, l, 2, &q2));
    KT_CHECK(kvps_worker_wait(w, q1, 0) == KVPS_ERR_INVALID_REQ, "wait on a stale handle once its slot is reused");
    KT_OK(kvps_worker_wait(w, q2, -1));
    KT_CHECK(o[0] == 1 && o[1] == 2 && o[2] == 3 && o[3] == 4, "pull after bad calls: %g %g %g %g", o[0], o[1],
             o[2], o[3]);
    bi_api_down(&a);
}

/* Nothing listens: wait gives up on time, the request stays valid, destroy drops it. */
static void test_worker_timeout(void) {
    char ep[256];
    size_t sz = sizeof ep;
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_ROUTER);
    zmq_bind(s, "tcp://127.0.0.1:*");
    zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &sz);
    zmq_close(s);
    zmq_ctx_term(ctx); /* the port is free again */
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = ep, .timeout_ms = 300}, &w));
    if (!w) return;
    uint64_t k[1] = {5};
    size_t l[1] = {4}, lbig[1] = {1 << 16};
    float v[4] = {1, 2, 3, 4}, o[4];
    float *big = (float *)calloc(1 << 16, sizeof(float)); /* 256 KiB: sent without a copy */
    kvps_req q, qp, qz;
    KT_OK(kvps_worker_push(w, k, v, l, 1, &q));
    KT_OK(kvps_worker_pull(w, k, o, l, 1, &qp));
    uint64_t kz[1] = {6};
    KT_OK(kvps_worker_push(w, kz, big, lbig, 1, &qz));
    int64_t t0 = kvps__now_ms();
    kvps_result r = kvps_worker_wait(w, q, 300);
    int64_t dt = kvps__now_ms() - t0;
    /* nothing listens there: the server was never reached, which the error says, with the endpoint */
    KT_CHECK(r == KVPS_ERR_PEER_LOST, "wait(300): %s", kvps_result_str(r));
    KT_CHECK(dt >= 290 && dt < 2000, "wait(300) took %lld ms", (long long)dt);
    KT_CHECK(strstr(kvps_worker_last_error(w), "never connected") && strstr(kvps_worker_last_error(w), ep),
             "last_error after a timeout: '%s'", kvps_worker_last_error(w));
    t0 = kvps__now_ms();
    r = kvps_worker_wait(w, qp, -1); /* the desc's 300 ms */
    dt = kvps__now_ms() - t0;
    KT_CHECK(r == KVPS_ERR_PEER_LOST && dt >= 290 && dt < 2000, "wait(-1): %s after %lld ms", kvps_result_str(r),
             (long long)dt);
    t0 = kvps__now_ms();
    r = kvps_worker_wait(w, q, 0);
    KT_CHECK(r == KVPS_ERR_PEER_LOST && kvps__now_ms() - t0 < 200, "wait(0): %s", kvps_result_str(r));
    int done = -1;
    r = kvps_worker_test(w, q, &done);
    KT_CHECK(r == KVPS_OK && done == 0, "test: %s, done %d", kvps_result_str(r), done);
    r = kvps_worker_wait(w, qz, 50);
    KT_CHECK(r == KVPS_ERR_PEER_LOST, "zero-copy push: %s", kvps_result_str(r));
    kvps_worker_destroy(&w); /* with three requests in flight */
    KT_CHECK(w == NULL, "destroy sets the pointer to NULL");
    free(big);
}

/* ---------------------------------------------------------------------------------------- */
/* A worker facing a broken server: replies that are short, foreign, stale, of the wrong size,
   or with errors of any shape. */

typedef struct bi_fake {
    void *ctx, *router;
    unsigned char id[256];
    size_t idlen;
    kvps__hdr req;
} bi_fake;

static int bi_fake_recv1(bi_fake *f) {
    zmq_pollitem_t it = {f->router, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 2000) <= 0) return -1;
    int more = 1, n = 0;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, f->router, 0) < 0) { zmq_msg_close(&m); return -1; }
        size_t sz = zmq_msg_size(&m);
        if (n == 0) { f->idlen = sz < sizeof f->id ? sz : sizeof f->id; memcpy(f->id, zmq_msg_data(&m), f->idlen); }
        if (n == 1 && sz >= sizeof f->req) memcpy(&f->req, zmq_msg_data(&m), sizeof f->req);
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        n++;
    }
    return 0;
}

/* The worker's next request; its own (hello, tensor names, goodbye) are taken and not answered. */
static int bi_fake_recv(bi_fake *f) {
    for (;;) {
        int rc = bi_fake_recv1(f);
        if (rc != 0 || (f->req.op != KVPS__OP_HELLO && f->req.op != KVPS__OP_NAME && f->req.op != KVPS__OP_BYE)) return rc;
    }
}

/* Sends [id][a][b], b only when bsize >= 0 */
static void bi_fake_send(bi_fake *f, const void *a, size_t asize, const void *b, long bsize) {
    zmq_send(f->router, f->id, f->idlen, ZMQ_SNDMORE);
    zmq_send(f->router, a, asize, bsize >= 0 ? ZMQ_SNDMORE : 0);
    if (bsize >= 0) zmq_send(f->router, b, (size_t)bsize, 0);
}

/* A fake server on inproc endpoint ep, and a worker connected to it. */
static kvps_worker *bi_fake_up(bi_fake *f, const char *ep) {
    memset(f, 0, sizeof *f);
    f->ctx = zmq_ctx_new();
    f->router = zmq_socket(f->ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(f->router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_bind(f->router, ep);
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = ep, .zmq_ctx = f->ctx, .timeout_ms = 2000}, &w));
    return w;
}

static void bi_fake_down(bi_fake *f, kvps_worker *w) {
    kvps_worker_destroy(&w);
    zmq_close(f->router);
    zmq_ctx_term(f->ctx);
}

static kvps__hdr bi_fake_hdr(const bi_fake *f, int32_t status) {
    kvps__hdr h = f->req;
    h.op |= KVPS__OP_REPLY;
    h.status = status;
    return h;
}

/* The fake server takes the request the worker just posted (posted: the post's result) and
   makes the header of its reply, with status. */
static kvps__hdr bi_fake_request(bi_fake *f, kvps_result posted, int32_t status) {
    KT_OK(posted);
    KT_CHECK(bi_fake_recv(f) == 0, "request");
    return bi_fake_hdr(f, status);
}

static void test_worker_broken_server(void) {
    bi_fake f;
    kvps_worker *w = bi_fake_up(&f, "inproc://bi-fake");
    uint64_t k[1] = {5};
    size_t l[1] = {4};
    float v[4] = {1, 2, 3, 4}, o[4];
    unsigned char sentinel[sizeof o];
    memset(sentinel, 0x7f, sizeof sentinel);
    char text[1000];
    memset(text, 'x', sizeof text);
    kvps_req q;
    kvps_result r;

    /* a pull answered by junk, then by values of the wrong size */
    memset(o, 0x7f, sizeof o);
    kvps__hdr h = bi_fake_request(&f, kvps_worker_pull(w, k, o, l, 1, &q), KVPS_OK);
    bi_fake_send(&f, "abc", 3, NULL, -1);                          /* short */
    kvps__hdr hm = h;
    hm.magic = 0x12345678;
    bi_fake_send(&f, &hm, sizeof hm, v, sizeof v);                 /* foreign */
    kvps__hdr hs = h;
    hs.req_id ^= 0x1234500000000ull;
    bi_fake_send(&f, &hs, sizeof hs, v, sizeof v);                 /* unknown request */
    bi_fake_send(&f, &h, sizeof h, v, sizeof v - 1);               /* 15 bytes for 4 floats */
    r = kvps_worker_wait(w, q, -1);
    KT_CHECK(r == KVPS_ERR_MALFORMED, "pull answered with 15 bytes: %s", kvps_result_str(r));
    KT_CHECK(memcmp(o, sentinel, sizeof o) == 0, "the destination was written");
    /* a pull answered without values */
    h = bi_fake_request(&f, kvps_worker_pull(w, k, o, l, 1, &q), KVPS_OK);
    bi_fake_send(&f, &h, sizeof h, NULL, -1);
    r = kvps_worker_wait(w, q, -1);
    KT_CHECK(r == KVPS_ERR_MALFORMED, "pull answered without values: %s", kvps_result_str(r));
    /* an error with a 1000-byte text, then one with no text frame */
    h = bi_fake_request(&f, kvps_worker_push(w, k, v, l, 1, &q), KVPS_ERR_LEN_MISMATCH);
    bi_fake_send(&f, &h, sizeof h, text, sizeof text);
    r = kvps_worker_wait(w, q, -1);
    KT_CHECK(r == KVPS_ERR_LEN_MISMATCH, "error reply: %s", kvps_result_str(r));
    KT_CHECK(strncmp(kvps_worker_last_error(w), "server 0: xxx", 13) == 0 && strlen(kvps_worker_last_error(w)) < 320,
             "last_error '%.40s...'", kvps_worker_last_error(w));
    h = bi_fake_request(&f, kvps_worker_push(w, k, v, l, 1, &q), KVPS_ERR_MALFORMED);
    bi_fake_send(&f, &h, sizeof h, NULL, -1);
    r = kvps_worker_wait(w, q, -1);
    KT_CHECK(r == KVPS_ERR_MALFORMED, "error reply without text: %s", kvps_result_str(r));
    /* junk does not end a request: it times out, stays valid, and completes on the real reply */
    h = bi_fake_request(&f, kvps_worker_pull(w, k, o, l, 1, &q), KVPS_OK);
    bi_fake_send(&f, "", 0, NULL, -1);
    r = kvps_worker_wait(w, q, 200);
    KT_CHECK(r == KVPS_ERR_TIMEOUT, "after an empty reply: %s", kvps_result_str(r));
    bi_fake_send(&f, &h, sizeof h, v, sizeof v);
    r = kvps_worker_wait(w, q, -1);
    KT_CHECK(r == KVPS_OK && memcmp(o, v, sizeof v) == 0, "the real reply: %s", kvps_result_str(r));
    bi_fake_down(&f, w);
}

/* Errors are negative (manual, section 8), whatever status a broken server puts in a reply. */
static void test_worker_positive_status_reply(void) {
    bi_fake f;
    kvps_worker *w = bi_fake_up(&f, "inproc://bi-fake2");
    uint64_t k[1] = {5};
    size_t l[1] = {4};
    float o[4];
    memset(o, 0x7f, sizeof o);
    kvps_req q;
    kvps__hdr h = bi_fake_request(&f, kvps_worker_pull(w, k, o, l, 1, &q), 7);
    bi_fake_send(&f, &h, sizeof h, "seven", 5);
    kvps_result r = kvps_worker_wait(w, q, -1);
    KT_CHECK((int)r < 0, "a pull answered with status 7 (nothing written) returns %d (%s)", (int)r, kvps_result_str(r));
    bi_fake_down(&f, w);
}

int main(void) {
    kvps_log_set_level(KVPS_LOG_NONE); /* the expected warnings would flood the output */
    kt_before_each = bi_reset;
    bi_suite("tcp", KVPS_BSP);
    bi_suite("inproc", KVPS_ASYNC);
    KT_RUN(test_unlimited_max_value_len);
    KT_RUN(test_worker_reserved_keys);
    KT_RUN(test_worker_len_mismatch);
    KT_RUN(test_worker_invalid_args);
    KT_RUN(test_worker_timeout);
    KT_RUN(test_worker_broken_server);
    KT_RUN(test_worker_positive_status_reply);
    return kt_finish();
}
