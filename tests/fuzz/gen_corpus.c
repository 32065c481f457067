/* gen_corpus - writes the seed corpora of the kvps fuzz targets: valid messages and blobs, a few
   of each kind, so that fuzzing starts past the magic numbers and length checks.
   usage: gen_corpus <dir>      (writes <dir>/<target>/<name>; `make fuzz-corpus`) */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "kvps_ring.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_ring_ops.h"
#include "tests/kvps_test.h" /* KT_HDR */
#include <pthread.h>
#include <sys/stat.h>
#include <errno.h>

static const char *root;

/* An input under construction. */
typedef struct buf {
    uint8_t d[1 << 16];
    size_t n;
    int frames; /* frames in the current message */
} buf;

static void put(buf *b, const void *p, size_t n) {
    if (b->n + n > sizeof b->d) { fprintf(stderr, "gen_corpus: seed too large\n"); exit(1); }
    memcpy(b->d + b->n, p, n);
    b->n += n;
}
static void begin(buf *b, const void *cfg, size_t ncfg) { b->n = 0; b->frames = -1; put(b, cfg, ncfg); }
static void msg(buf *b) { if (b->frames >= 0) put(b, FZ_MSG, FZ_SEP); b->frames = 0; }
static void frame(buf *b, const void *p, size_t n) {
    if (b->frames > 0) put(b, FZ_FRM, FZ_SEP);
    put(b, p, n);
    b->frames++;
}

static void save(const char *target, const char *name, const buf *b) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) { perror(path); exit(1); }
    snprintf(path, sizeof path, "%s/%s/%s", root, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b->d, 1, b->n, f) != b->n || fclose(f) != 0) { perror(path); exit(1); }
}

/* ---- server requests ---------------------------------------------------------------------- */
static uint64_t req_id;

static void meta(buf *b, int op, uint32_t rank, uint16_t flags, uint32_t aux, const uint64_t *keys,
                 const uint64_t *lens, uint32_t nk) {
    uint8_t m[KVPS__HDR + 8 * KVPS__KENT];
    kvps__hdr h = KT_HDR(.op = (uint8_t)op, .flags = flags, .rank = rank, .nkeys = nk, .req_id = ++req_id, .aux = aux);
    memcpy(m, &h, sizeof h);
    for (uint32_t i = 0; i < nk; i++) {
        kvps__kent e = {keys[i], lens[i]};
        memcpy(m + KVPS__HDR + i * KVPS__KENT, &e, sizeof e);
    }
    msg(b);
    frame(b, m, KVPS__HDR + (size_t)nk * KVPS__KENT);
}

/* Integer-valued floats: easy to read in a hex dump. */
static void values(buf *b, uint64_t n, float base) {
    float v[1024];
    for (uint64_t i = 0; i < n; i++) v[i] = base + (float)i;
    frame(b, v, n * sizeof(float));
}

static void coded(buf *b, kvps_codec c, uint64_t n, float base) {
    float x[256];
    uint8_t out[4 + 2048];
    for (uint64_t i = 0; i < n; i++) x[i] = (float)((int)(i * 7 % 11) - 5) + base;
    size_t nb = 0;
    if (kvps_codec_encode(&c, x, n, NULL, out + 4, sizeof out - 4, &nb) != KVPS_OK) { fprintf(stderr, "encode\n"); exit(1); }
    uint32_t nb32 = (uint32_t)nb;
    memcpy(out, &nb32, 4);
    frame(b, out, 4 + nb);
}

static void optrec(uint8_t *r, uint32_t rule, float lr) {
    float f[6] = {lr, 0, 0, 0, 0, rule == KVPS_RULE_ADAMW || rule >= KVPS_RULE_USER ? 0.01f : 0.0f}; /* (weight_decay) */
    memcpy(r, &rule, 4);
    memcpy(r + 4, f, sizeof f);
}

static void table_meta(buf *b, int op, uint32_t rank, uint64_t tid, uint32_t dim, const uint64_t *ids, uint32_t nrows) {
    uint8_t m[KVPS__HDR + 16 + 8 * 16];
    kvps__hdr h = KT_HDR(.op = (uint8_t)op, .rank = rank, .nkeys = nrows, .req_id = ++req_id);
    memcpy(m, &h, sizeof h);
    memset(m + KVPS__HDR, 0, 16);
    memcpy(m + KVPS__HDR, &tid, 8);
    memcpy(m + KVPS__HDR + 8, &dim, 4);
    if (nrows) memcpy(m + KVPS__HDR + 16, ids, (size_t)nrows * 8);
    msg(b);
    frame(b, m, KVPS__HDR + 16 + (size_t)nrows * 8);
}

/* A session message (HELLO, BYE, STATUS, NAME) from rank with incarnation inc; req 0: a new id. */
static void sess(buf *b, int op, uint32_t rank, int32_t inc, uint64_t req, const void *v, size_t nv) {
    kvps__hdr h = KT_HDR(.op = (uint8_t)op, .rank = rank, .req_id = req ? req : ++req_id, .status = inc);
    msg(b);
    frame(b, &h, sizeof h);
    if (v) frame(b, v, nv);
}
static void hello(buf *b, uint32_t rank, int32_t inc, uint32_t nw, uint32_t ns, uint32_t at, uint64_t mins) {
    uint8_t v[KVPS__HELLO_BYTES] = {0};
    uint32_t u[4] = {KVPS__PROTO, nw, ns, at};
    uint64_t x[3] = {0x1234abcdull, mins, 262144};
    memcpy(v, u, 16);
    memcpy(v + 16, x, 24);
    sess(b, KVPS__OP_HELLO, rank, inc, 0, v, sizeof v);
}
static void tname(buf *b, uint32_t rank, int32_t inc, const char *name, uint64_t len, uint32_t ns) {
    uint8_t v[KVPS__NAME_REC + 64];
    uint64_t base = (1ull << 63) | (0x1234ull << 16);
    uint32_t nb = (uint32_t)strlen(name);
    memcpy(v, &base, 8);
    memcpy(v + 8, &len, 8);
    memcpy(v + 16, &ns, 4);
    memcpy(v + 20, &nb, 4);
    memcpy(v + KVPS__NAME_REC, name, nb);
    sess(b, KVPS__OP_NAME, rank, inc, 0, v, KVPS__NAME_REC + nb);
}

static void server_seeds(void) {
    buf b;
    uint64_t k2[2] = {11, 12}, l2[2] = {4, 3};
    uint64_t k1[1] = {11}, l1[1] = {4};
    uint8_t cfg;

    /* one worker, BSP, mean: push, pull, pushpull, init */
    cfg = 0x40;
    begin(&b, &cfg, 1);
    meta(&b, KVPS__OP_PUSH, 0, 0, 0, k2, l2, 2); values(&b, 7, 1);
    meta(&b, KVPS__OP_PULL, 0, 0, 0, k2, l2, 2);
    meta(&b, KVPS__OP_PUSHPULL, 0, 0, 0, k1, l1, 1); values(&b, 4, 10);
    meta(&b, KVPS__OP_INIT, 0, 0, 0, k1, l1, 1); values(&b, 4, -3);
    save("fuzz_server", "push_pull_bsp", &b);

    /* three workers, BSP: pushes out of rank order and a pull that has to wait */
    cfg = 0x40 | 4;
    begin(&b, &cfg, 1);
    meta(&b, KVPS__OP_PUSH, 2, 0, 0, k1, l1, 1); values(&b, 4, 2);
    meta(&b, KVPS__OP_PULL, 2, 0, 0, k1, l1, 1);
    meta(&b, KVPS__OP_PUSH, 0, 0, 0, k1, l1, 1); values(&b, 4, 0);
    meta(&b, KVPS__OP_PUSH, 1, 0, 0, k1, l1, 1); values(&b, 4, 1);
    meta(&b, KVPS__OP_PUSH, 2, 0, 0, k1, l1, 1); values(&b, 4, 5);
    save("fuzz_server", "bsp_three_ranks", &b);

    /* async and SSP/adaptive (staleness 2), SGD */
    cfg = 0x40 | 0x20 | 1;
    begin(&b, &cfg, 1);
    meta(&b, KVPS__OP_PUSHPULL, 0, 0, 0, k2, l2, 2); values(&b, 7, 1);
    save("fuzz_server", "async_sgd", &b);
    cfg = 0x80 | 0x40 | 4 | 3;
    begin(&b, &cfg, 1);
    for (int r = 0; r < 4; r++) { meta(&b, KVPS__OP_PUSH, 1, 0, 0, k1, l1, 1); values(&b, 4, (float)r); }
    meta(&b, KVPS__OP_PULL, 1, 0, 0, k1, l1, 1);
    meta(&b, KVPS__OP_PUSH, 0, 0, 0, k1, l1, 1); values(&b, 4, 9);
    save("fuzz_server", "adaptive_stale", &b);

    /* coded pushes with every codec, and a pull answered coded */
    cfg = 0x40 | 0x10;
    begin(&b, &cfg, 1);
    uint64_t kc[1] = {21}, lc[1] = {40};
    kvps_codec c = kvps_codec_get(KVPS_CODEC_FP16);
    meta(&b, KVPS__OP_PUSH, 0, KVPS__FLAG_CODED, 0, kc, lc, 1); coded(&b, c, 40, 0.5f);
    c = kvps_codec_get(KVPS_CODEC_BF16);
    meta(&b, KVPS__OP_PUSH, 0, KVPS__FLAG_CODED, 0, kc, lc, 1); coded(&b, c, 40, 0.25f);
    c = kvps_codec_get(KVPS_CODEC_TOPK);
    c.topk_count = 5;
    meta(&b, KVPS__OP_PUSH, 0, KVPS__FLAG_CODED, 0, kc, lc, 1); coded(&b, c, 40, 0);
    c.topk_fp16_values = 1;
    meta(&b, KVPS__OP_PUSH, 0, KVPS__FLAG_CODED, 0, kc, lc, 1); coded(&b, c, 40, 0);
    c = kvps_codec_get(KVPS_CODEC_SIGN);
    c.sign_chunk = 16;
    meta(&b, KVPS__OP_PUSH, 0, KVPS__FLAG_CODED, 0, kc, lc, 1); coded(&b, c, 40, 0);
    c = kvps_codec_get(KVPS_CODEC_NONE);
    meta(&b, KVPS__OP_PUSHPULL, 0, KVPS__FLAG_CODED | KVPS__FLAG_CODED_REPLY, KVPS_CODEC_SIGN, kc, lc, 1);
    coded(&b, c, 40, 1);
    meta(&b, KVPS__OP_PULL, 0, KVPS__FLAG_CODED_REPLY, KVPS_CODEC_FP16, kc, lc, 1);
    save("fuzz_server", "coded", &b);

    /* the user codec (id 200: header then raw floats) */
    begin(&b, &cfg, 1);
    {
        uint8_t blob[4 + 8 + 16];
        uint32_t nb = 8 + 16, n = 4;
        memcpy(blob, &nb, 4);
        memset(blob + 4, 0, 8);
        blob[4] = 200;
        memcpy(blob + 8, &n, 4);
        float v[4] = {1, 2, 3, 4};
        memcpy(blob + 12, v, 16);
        meta(&b, KVPS__OP_PUSH, 0, KVPS__FLAG_CODED, 0, k1, l1, 1);
        frame(&b, blob, sizeof blob);
        meta(&b, KVPS__OP_PULL, 0, KVPS__FLAG_CODED_REPLY, 200, k1, l1, 1);
    }
    save("fuzz_server", "user_codec", &b);

    /* per-key rules, then pushes under them */
    cfg = 0x40 | 1;
    begin(&b, &cfg, 1);
    {
        uint8_t rec[2 * KVPS__OPTREC];
        optrec(rec, KVPS_RULE_ADAM, 0.001f);
        optrec(rec + KVPS__OPTREC, KVPS_RULE_MAX, 0);
        meta(&b, KVPS__OP_CONFIG, 0, 0, 0, k2, l2, 2);
        frame(&b, rec, sizeof rec);
        meta(&b, KVPS__OP_PUSH, 0, 0, 0, k2, l2, 2); values(&b, 7, 3);
        meta(&b, KVPS__OP_PULL, 0, 0, 0, k2, l2, 2);
    }
    save("fuzz_server", "config_rules", &b);

    /* AdamW (weight decay, a step count) and a user rule the fuzzed server does not have */
    cfg = 0x40 | 1;
    begin(&b, &cfg, 1);
    {
        uint8_t rec[2 * KVPS__OPTREC];
        optrec(rec, KVPS_RULE_ADAMW, 0.001f);
        optrec(rec + KVPS__OPTREC, KVPS_RULE_USER + 1, 0);
        meta(&b, KVPS__OP_CONFIG, 0, 0, 0, k2, l2, 1);
        frame(&b, rec, KVPS__OPTREC);
        meta(&b, KVPS__OP_PUSH, 0, 0, 0, k2, l2, 1); values(&b, 4, 2);
        meta(&b, KVPS__OP_CONFIG, 0, 0, 0, k2 + 1, l2 + 1, 1);
        frame(&b, rec + KVPS__OPTREC, KVPS__OPTREC);
        meta(&b, KVPS__OP_PULL, 0, 0, 0, k2, l2, 2);
    }
    save("fuzz_server", "config_adamw_user", &b);

    /* barrier on server 0 from every rank */
    cfg = 0x40 | 4;
    begin(&b, &cfg, 1);
    for (uint32_t r = 0; r < 3; r++) meta(&b, KVPS__OP_BARRIER, r, 0, 0, NULL, NULL, 0);
    save("fuzz_server", "barrier", &b);

    /* the scalar all-reduce from every rank (the last one's op differs), then a join and pushes */
    begin(&b, &cfg, 1);
    for (uint32_t r = 0; r < 3; r++) {
        uint8_t v[16] = {0};
        double x = 1.5 * (r + 1);
        uint32_t op = r == 2 ? KVPS_SCALAR_MAX : KVPS_SCALAR_MEAN;
        memcpy(v, &x, 8);
        memcpy(v + 8, &op, 4);
        meta(&b, KVPS__OP_ALLREDUCE, r, 0, 0, NULL, NULL, 0);
        frame(&b, v, sizeof v);
    }
    meta(&b, KVPS__OP_JOIN, 1, 0, 0, NULL, NULL, 0);
    meta(&b, KVPS__OP_PUSH, 1, 0, 0, k1, l1, 1); values(&b, 4, 2);
    meta(&b, KVPS__OP_PUSH, 0, 0, 0, k1, l1, 1); values(&b, 4, 3);
    meta(&b, KVPS__OP_BARRIER, 0, 0, 0, NULL, NULL, 0);
    save("fuzz_server", "allreduce_join", &b);

    /* sparse table: configure, push rows, pull rows */
    cfg = 0x40;
    begin(&b, &cfg, 1);
    {
        uint8_t trec[KVPS__TREC];
        memset(trec, 0, sizeof trec);
        optrec(trec, KVPS_RULE_ADAGRAD, 0.1f);
        float scale = 0.5f;
        uint64_t seed = 42;
        memcpy(trec + KVPS__OPTREC, &scale, 4);
        memcpy(trec + KVPS__OPTREC + 4, &seed, 8);
        table_meta(&b, KVPS__OP_TABLE, 0, 7, 4, NULL, 0);
        frame(&b, trec, sizeof trec);
        uint64_t ids[3] = {5, 1u << 31, 99};
        table_meta(&b, KVPS__OP_PUSH_ROWS, 0, 7, 4, ids, 3);
        values(&b, 12, 1);
        table_meta(&b, KVPS__OP_PULL_ROWS, 0, 7, 4, ids, 3);
    }
    save("fuzz_server", "table_rows", &b);

    /* async, one key of 16384 floats (a "\xfe" "BIG" frame): pushes held back and applied
       together at the end of the batch (the empty message), then a zero-copy pull reply */
    cfg = 0x40 | 0x10 | 1;
    begin(&b, &cfg, 1);
    {
        uint64_t kb[1] = {31}, lb[1] = {16384};
        uint8_t big[9] = {0xfe, 'B', 'I', 'G', 0, 0, 1, 0, 0x3f}; /* 65536 bytes of 0x3f */
        for (int i = 0; i < 3; i++) { meta(&b, KVPS__OP_PUSH, 0, 0, 0, kb, lb, 1); frame(&b, big, sizeof big); }
        msg(&b);
        meta(&b, KVPS__OP_PULL, 0, 0, 0, kb, lb, 1);
    }
    save("fuzz_server", "held_back_pushes", &b);

    /* sessions, three workers under BSP: hellos (rank 1's refused: 4 workers; rank 0 again from
       another incarnation: refused), tensor names (rank 2's other length refused), a pull that
       waits and a question about it, goodbyes (a refused incarnation's too) */
    cfg = 0x40 | 4;
    begin(&b, &cfg, 1);
    {
        uint64_t ks[1] = {(1ull << 63) | (0x1234ull << 16)}, ls[1] = {100};
        hello(&b, 0, 11, 3, 2, 0, 1024);
        hello(&b, 1, 12, 4, 2, 0, 1024);
        hello(&b, 2, 13, 3, 2, 0, 1024);
        hello(&b, 0, 14, 3, 2, 0, 1024);
        tname(&b, 0, 11, "layer1.weight", 100, 1);
        tname(&b, 2, 13, "layer1.weight", 120, 1);
        meta(&b, KVPS__OP_PUSH, 0, 0, 0, ks, ls, 1); values(&b, 100, 1);
        meta(&b, KVPS__OP_PULL, 0, 0, 0, ks, ls, 1);
        sess(&b, KVPS__OP_STATUS, 0, 11, req_id, NULL, 0);
        sess(&b, KVPS__OP_BYE, 1, 12, 0, NULL, 0);
        sess(&b, KVPS__OP_BYE, 2, 13, 0, NULL, 0);
        meta(&b, KVPS__OP_BARRIER, 0, 0, 0, NULL, NULL, 0);
        sess(&b, KVPS__OP_BYE, 0, 11, 0, NULL, 0);
    }
    save("fuzz_server", "session", &b);

    /* a message with one frame too many, and one with no meta frame */
    begin(&b, &cfg, 1);
    meta(&b, KVPS__OP_PULL, 0, 0, 0, k1, l1, 1);
    frame(&b, "x", 1);
    msg(&b);
    save("fuzz_server", "odd_frames", &b);

    /* a reshard's moves: keys held, two exported, taken in again (one is held already: refused),
       dropped; an import of a record for a new key */
    cfg = 0x40;
    begin(&b, &cfg, 1);
    meta(&b, KVPS__OP_PUSH, 0, 0, 0, k2, l2, 2); values(&b, 7, 1);
    sess(&b, KVPS__OP_KEYS, 0, 0, 0, NULL, 0);
    sess(&b, KVPS__OP_EXPORT, 0, 0, 0, k2, sizeof k2);
    sess(&b, KVPS__OP_DROP, 0, 0, 0, k1, sizeof k1);
    {
        kvps_server *s = NULL; /* a record the way a server writes it: key 11 of 4 floats */
        kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://gen-move", .num_workers = 1}, &s);
        kvps__key_create(s, 11, 4);
        char *rec = NULL;
        size_t nrec = 0;
        FILE *f = open_memstream(&rec, &nrec);
        kvps__cw w = {f, 0, 0};
        kvps__key_put(s, &w, s->keys[0]);
        fclose(f);
        sess(&b, KVPS__OP_IMPORT, 0, 0, 0, rec, nrec);
        sess(&b, KVPS__OP_IMPORT, 0, 0, 0, rec, nrec);
        free(rec);
        kvps_server_destroy(&s);
    }
    sess(&b, KVPS__OP_KEYS, 0, 0, 0, NULL, 0);
    {   /* the placement after a grow from 2 to 3 servers, one that is not one, and a hello that
           does not know it (answered with it; its keyed requests refused until it does) */
        /* (V, count, n[], m[], then (shard, server) pairs: shards 5 and 7 moved to the new server) */
        uint32_t pl[10] = {512, 2, 2, 3, 0, 2, 5, 2, 7, 2}, bad[10] = {500, 2, 2, 3, 0, 2, 5, 2, 7, 2};
        sess(&b, KVPS__OP_PLACE_GET, 0, 0, 0, NULL, 0);
        sess(&b, KVPS__OP_PLACE, 0, 0, 0, bad, sizeof bad);
        sess(&b, KVPS__OP_PLACE, 0, 0, 0, pl, sizeof pl);
        sess(&b, KVPS__OP_PLACE_GET, 0, 0, 0, NULL, 0);
        uint8_t hv[KVPS__HELLO_BYTES] = {0};
        uint32_t hw[4] = {KVPS__PROTO, 1, 3, 0};
        memcpy(hv, hw, sizeof hw);
        sess(&b, KVPS__OP_HELLO, 0, 0, 0, hv, sizeof hv);
        meta(&b, KVPS__OP_PULL, 0, 0, 0, k1, l1, 1);
    }
    save("fuzz_server", "reshard_moves", &b);

    /* a reshard's moves of a sparse table's rows: rows made, the rows of some virtual shards
       exported and dropped, a record of a table taken in (then again: its rows are held, refused),
       a shard list that is not one */
    cfg = 0x40;
    begin(&b, &cfg, 1);
    {
        uint8_t trec[KVPS__TREC];
        memset(trec, 0, sizeof trec);
        optrec(trec, KVPS_RULE_MOMENTUM, 0.1f);
        table_meta(&b, KVPS__OP_TABLE, 0, 7, 4, NULL, 0);
        frame(&b, trec, sizeof trec);
        uint64_t ids[4] = {5, 6, 1u << 31, 99};
        table_meta(&b, KVPS__OP_PUSH_ROWS, 0, 7, 4, ids, 4);
        values(&b, 16, 1);
        uint32_t sel[5] = {8, 0, 2, 5, 7}, bad[3] = {8, 9, 1};
        sess(&b, KVPS__OP_EXPORT_ROWS, 0, 0, 0, sel, sizeof sel);
        sess(&b, KVPS__OP_DROP_ROWS, 0, 0, 0, sel, sizeof sel);
        sess(&b, KVPS__OP_DROP_ROWS, 0, 0, 0, bad, sizeof bad);
        kvps_server *s = NULL; /* a record the way a server writes it: table 7 (momentum), rows 1000 and 1001 */
        kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://gen-rows", .num_workers = 1}, &s);
        kvps__table *t = (kvps__table *)calloc(1, sizeof *t);
        t->id = 7;
        t->dim = 4;
        kvps__optim_read(trec, &t->opt); /* (configured as the TABLE above) */
        t->sdim = kvps__table_sdim(KVPS_RULE_MOMENTUM, 4);
        kvps__table_row(s, t, 1000);
        kvps__table_row(s, t, 1001);
        char *rec = NULL;
        size_t nrec = 0;
        FILE *f = open_memstream(&rec, &nrec);
        kvps__cw w = {f, 0, 0};
        kvps__table_put(&w, t, NULL);
        fclose(f);
        sess(&b, KVPS__OP_IMPORT_ROWS, 0, 0, 0, rec, nrec);
        sess(&b, KVPS__OP_IMPORT_ROWS, 0, 0, 0, rec, nrec);
        free(rec);
        kvps__table_free(t);
        kvps_server_destroy(&s);
        table_meta(&b, KVPS__OP_PULL_ROWS, 0, 7, 4, ids, 4);
    }
    save("fuzz_server", "reshard_rows", &b);
}

/* ---- codec blobs: [id][mode][u32 n][blob], see fuzz_codec.c ---------------------------------- */
static void codec_seed(const char *name, kvps_codec c, uint32_t n, uint8_t mode) {
    buf b;
    float x[512];
    for (uint32_t i = 0; i < n; i++) x[i] = (float)((int)(i * 13 % 17) - 8) * 0.75f;
    uint8_t out[4096];
    size_t nb = 0;
    if (kvps_codec_encode(&c, x, n, NULL, out, sizeof out, &nb) != KVPS_OK) { fprintf(stderr, "encode %s\n", name); exit(1); }
    uint8_t hdr[6] = {(uint8_t)c.id, mode};
    memcpy(hdr + 2, &n, 4);
    begin(&b, hdr, sizeof hdr);
    put(&b, out, nb);
    save("fuzz_codec", name, &b);
}

/* Round trips of top-k over the input shapes its threshold search must survive: [codec][mode]
   [u32 n = count][floats]; mode 0x80 = round trip, 0x90 with error feedback. The fuzz build keeps
   2k + 16 candidates (KVPS__TOPK_SLACK), so the plateau and sparse seeds (80 floats, k = 20)
   have no sampled threshold that fits. */
static void topk_rt_seed(const char *name, uint8_t mode, uint32_t count, const float *x, size_t m) {
    buf b;
    uint8_t hdr[6] = {KVPS_CODEC_TOPK, mode};
    memcpy(hdr + 2, &count, 4);
    begin(&b, hdr, sizeof hdr);
    put(&b, x, m * sizeof *x);
    save("fuzz_codec", name, &b);
}

static void topk_shape_seeds(void) {
    float x[128];
    uint32_t nan1 = 0x7fc00123u, nan2 = 0xffa00001u; /* a quiet NaN with a payload, a signalling one */
    for (int i = 0; i < 64; i++) x[i] = (float)((i * 37) % 64 + 1) * (i % 3 ? 1.0f : -1.0f); /* no ties */
    topk_rt_seed("topk_rt_distinct", 0x80, 8, x, 64);
    topk_rt_seed("topk_rt_k1", 0x80, 1, x, 64);
    topk_rt_seed("topk_rt_k_n_minus_1", 0x90, 63, x, 64);
    topk_rt_seed("topk_rt_k_is_n", 0x80, 64, x, 64);
    for (int i = 0; i < 64; i++) x[i] = (float)(i % 4) - 1.0f; /* heavy ties */
    topk_rt_seed("topk_rt_heavy_ties", 0x80, 10, x, 64);
    for (int i = 0; i < 32; i++) x[i] = 0.5f; /* all equal */
    topk_rt_seed("topk_rt_all_equal", 0x90, 5, x, 32);
    for (int i = 0; i < 100; i++) x[i] = i == 17 ? 3.0f : i == 80 ? -1.5f : 0.0f; /* mostly zeros */
    topk_rt_seed("topk_rt_mostly_zeros", 0x80, 10, x, 100);
    for (int i = 0; i < 40; i++) x[i] = (float)(i - 20) * 1e-42f; /* subnormal */
    topk_rt_seed("topk_rt_subnormal", 0x80, 4, x, 40);
    for (int i = 0; i < 40; i++) x[i] = (float)(i % 7) - 3.0f; /* inf and NaN among them */
    x[3] = INFINITY; x[9] = -INFINITY;
    memcpy(&x[5], &nan1, 4);
    memcpy(&x[30], &nan2, 4);
    topk_rt_seed("topk_rt_inf_nan", 0x90, 6, x, 40);
    /* the report's shapes at the fuzz build's scale: 10 x 2.0 on a plateau of 1.0, and 10
       non-zeros among zeros; 80 floats, k = 20 > 10, and 80 > 2k + 16 */
    for (int i = 0; i < 80; i++) x[i] = i < 10 ? 2.0f : 1.0f;
    topk_rt_seed("topk_plateau", 0x80, 20, x, 80);
    topk_rt_seed("topk_plateau_ef", 0x90, 20, x, 80);
    for (int i = 0; i < 80; i++) x[i] = i % 8 == 3 ? (float)(i + 1) * 0.25f : 0.0f;
    topk_rt_seed("topk_sparse", 0x80, 20, x, 80);
}

static void codec_seeds(void) {
    kvps_codec c;
    c = kvps_codec_get(KVPS_CODEC_NONE); codec_seed("none_17", c, 17, 0);
    c = kvps_codec_get(KVPS_CODEC_FP16); codec_seed("fp16_40_acc", c, 40, 1);
    c = kvps_codec_get(KVPS_CODEC_BF16); codec_seed("bf16_33", c, 33, 0);
    c = kvps_codec_get(KVPS_CODEC_TOPK); c.topk_count = 6; codec_seed("topk_64", c, 64, 0);
    c.topk_fp16_values = 1; codec_seed("topk_fp16_64", c, 64, 1);
    c = kvps_codec_get(KVPS_CODEC_SIGN); c.sign_chunk = 8; codec_seed("sign_70_chunk8", c, 70, 0);
    c.sign_chunk = 0; codec_seed("sign_300", c, 300, 1);
    /* round-trip mode (bit 7): the rest is float32 input to encode, see fuzz_codec.c */
    buf b;
    uint8_t hdr[6] = {KVPS_CODEC_TOPK, 0x80 | 0x04, 3, 0, 0, 0};
    begin(&b, hdr, sizeof hdr);
    for (int i = 0; i < 24; i++) { float v = (float)(i % 5) - 2.5f; put(&b, &v, 4); }
    save("fuzz_codec", "roundtrip_topk", &b);
    hdr[0] = KVPS_CODEC_FP16; hdr[1] = 0x80 | 0x40;
    begin(&b, hdr, sizeof hdr);
    uint32_t specials[] = {0x7f800001u, 0xff800000u, 0x477fe000u, 0x33800000u, 0x80000001u, 0x3f800000u, 0x7fc00000u, 0};
    put(&b, specials, sizeof specials);
    save("fuzz_codec", "roundtrip_fp16_specials", &b);
    topk_shape_seeds();
}

/* ---- environments: fields separated by "\xfe" "MSG", see fuzz_env.c ---------------------------- */
static void env_seed(const char *name, uint16_t set, const char *const *vals, int n) {
    buf b;
    begin(&b, &set, 2);
    b.frames = 0;
    for (int i = 0; i < n; i++) {
        if (i) put(&b, FZ_MSG, FZ_SEP);
        put(&b, vals[i], strlen(vals[i]));
    }
    save("fuzz_env", name, &b);
}

static void env_seeds(void) {
    /* order: SERVERS, RANK, NUM_WORKERS, ROLE, OMPI rank, PMI rank, SLURM rank, LOG, SIZE, RING_PEERS */
    const char *a[] = {"tcp://10.0.0.1:5555,tcp://10.0.0.2:5555", "1", "4", "server", "", "", "", "info", "2",
                       "tcp://a:1,tcp://b:2"};
    env_seed("server_1", 0x3ff & ~0x70, a, 10);
    const char *w[] = {"tcp://h:1, tcp://h:2 ,tcp://h:3", "", "8", "", "5", "", "", "debug", "", ""};
    env_seed("mpirun_worker", 0x01 | 0x04 | 0x10 | 0x80, w, 10);
    const char *s[] = {"ipc:///tmp/x", "", "2", "", "", "", "0", "nonsense", "1", "ipc:///tmp/x"};
    env_seed("slurm", 0x01 | 0x04 | 0x40 | 0x80 | 0x100 | 0x200, s, 10);
    const char *bad[] = {"a,,b", "-1", "1x", "worker", "", "", "", "", "", ""};
    env_seed("malformed", 0x0f, bad, 10);
    /* a CURVE certificate (bit 13): 13 empty values, then the file */
    char pub[41], sec[41], cert[512];
    if (zmq_curve_keypair(pub, sec) != 0) { fprintf(stderr, "gen_corpus: no CURVE in this libzmq\n"); exit(1); }
    snprintf(cert, sizeof cert,
             "#   ****  Generated by gen_corpus  ****\n#   ZeroMQ CURVE **Secret** Certificate\n"
             "metadata\n    name = \"fuzz\"\ncurve\n    public-key = \"%s\"\n    secret-key = \"%s\"\n", pub, sec);
    const char *c[14] = {"", "", "", "", "", "", "", "", "", "", "", "", "", cert};
    env_seed("cert", 1u << 13, c, 14);
}

/* ---- worker replies: [kind][server bits][messages], see fuzz_reply.c ------------------------ */
typedef struct rbuf { buf b; uint8_t srvbits; int nmsg; } rbuf;

static void rbegin(rbuf *r, uint8_t kind) { uint8_t cfg[2] = {kind, 0}; begin(&r->b, cfg, 2); r->srvbits = 0; r->nmsg = 0; }
static void rmsg(rbuf *r, int srv, int op, int status, const void *p, size_t n) {
    kvps__hdr h = KT_HDR(.op = (uint8_t)(op | KVPS__OP_REPLY), .status = status);
    if (srv) r->srvbits |= (uint8_t)(1u << r->nmsg);
    r->nmsg++;
    msg(&r->b);
    frame(&r->b, &h, sizeof h);
    if (p) frame(&r->b, p, n);
}
static void rsave(rbuf *r, const char *name) { r->b.d[1] = r->srvbits; save("fuzz_reply", name, &r->b); }

static void reply_seeds(void) {
    /* as fuzz_reply.c sets them up: 2 servers; raw keys 1, 2, 3 of 3, 1, 2 floats */
    uint64_t keys[3] = {1, 2, 3}, lens[3] = {3, 1, 2};
    float v[64];
    for (int i = 0; i < 64; i++) v[i] = (float)i;
    uint64_t per[2] = {0, 0};
    for (int i = 0; i < 3; i++) per[kvps__mix64(keys[i]) % 2] += lens[i];
    rbuf r;
    rbegin(&r, 0x80 | 0); /* raw pull, answered by each server it went to */
    for (int s = 0; s < 2; s++) if (per[s]) rmsg(&r, s, KVPS__OP_PULL, 0, v, per[s] * 4);
    rsave(&r, "pull_ok");
    rbegin(&r, 0x80 | 0); /* a read replica's refusals (READ, KVPS_ERR_NOT_PRIMARY), then the pull's answers */
    static const char cannot[] = "server 0 replica 1 (ipc://@b): no round of this worker's since it got key 1";
    for (int s = 0; s < 2; s++) if (per[s]) rmsg(&r, s, KVPS__OP_READ, KVPS_ERR_NOT_PRIMARY, cannot, sizeof cannot - 1);
    for (int s = 0; s < 2; s++) if (per[s]) rmsg(&r, s, KVPS__OP_PULL, 0, v, per[s] * 4);
    rsave(&r, "read_refused_then_pull");
    rbegin(&r, 0x80 | 0); /* the same, one server twice and one with an error */
    for (int s = 0; s < 2; s++) if (per[s]) rmsg(&r, s, KVPS__OP_PULL, 0, v, per[s] * 4);
    for (int s = 0; s < 2; s++) if (per[s]) rmsg(&r, s, KVPS__OP_PULL, KVPS_ERR_LEN_MISMATCH, "key 1: length 3, registered 4", 30);
    rsave(&r, "pull_twice_error");
    rbegin(&r, 0x80 | 1); /* raw push */
    for (int s = 0; s < 2; s++) if (per[s]) rmsg(&r, s, KVPS__OP_PUSH, 0, NULL, 0);
    rsave(&r, "push_ok");
    /* coded tensor pull and coded pushpull: one fp16 slice of 20 per server */
    kvps_codec c = kvps_codec_get(KVPS_CODEC_FP16);
    uint8_t blob[4 + 8 + 40];
    size_t nb = 0;
    kvps_codec_encode(&c, v, 20, NULL, blob + 4, sizeof blob - 4, &nb);
    uint32_t nb32 = (uint32_t)nb;
    memcpy(blob, &nb32, 4);
    rbegin(&r, 0x80 | 2);
    for (int s = 0; s < 2; s++) rmsg(&r, s, KVPS__OP_PULL, 0, blob, 4 + nb);
    rsave(&r, "coded_pull");
    rbegin(&r, 0x80 | 5);
    for (int s = 0; s < 2; s++) rmsg(&r, s, KVPS__OP_PUSHPULL, 0, blob, 4 + nb);
    rsave(&r, "coded_pushpull");
    /* the hello's answer from server 0 carries a placement (2 > 3 > 2 servers: the worker takes
       it), then the raw pull answered by both servers */
    {
        uint32_t pl[12] = {512, 3, 2, 3, 2, 0, 1, 1, 5, 2, 5, 0}; /* shard 5 to the new server and back */
        rbegin(&r, 0x80 | 0x40 | 0);
        rmsg(&r, 0, KVPS__OP_HELLO, 0, pl, sizeof pl);
        for (int s = 0; s < 2; s++) rmsg(&r, s, KVPS__OP_PULL, 0, v, 24);
        rsave(&r, "hello_placement_then_pull");
    }
    /* rows 7, 9, 7, 2^20, 9 of dim 4 in table "fz.rows": one row per distinct id, per server */
    kvps_worker fake;
    memset(&fake, 0, sizeof fake);
    fake.n = 2;
    static uint32_t vmap[512]; /* the placement before any reshard: virtual shard v on server v mod 2 */
    for (uint32_t i = 0; i < 512; i++) vmap[i] = i % 2;
    fake.V = 512;
    fake.vmap = vmap;
    uint64_t table = kvps__fnv1a("fz.rows"), uniq[3] = {7, 9, 1u << 20};
    uint64_t rows[2] = {0, 0};
    for (int i = 0; i < 3; i++) rows[kvps__row_server(&fake, table, uniq[i])]++;
    rbegin(&r, 0x80 | 3);
    for (int s = 0; s < 2; s++) if (rows[s]) rmsg(&r, s, KVPS__OP_PULL_ROWS, 0, v, rows[s] * 4 * 4);
    rsave(&r, "rows");
    rbegin(&r, 0x80 | 4);
    rmsg(&r, 0, KVPS__OP_BARRIER, 0, NULL, 0);
    rsave(&r, "barrier");
    /* a lost worker: the barrier, and one part of the coded pushpull, answered PEER_LOST (the
       request stays valid and is re-sent) */
    static const char lost[] = "worker 1 lost (no connection for 300 ms): the round cannot complete";
    rbegin(&r, 0x80 | 4);
    rmsg(&r, 0, KVPS__OP_BARRIER, KVPS_ERR_PEER_LOST, lost, sizeof lost - 1);
    rsave(&r, "barrier_peer_lost");
    rbegin(&r, 0x80 | 5);
    rmsg(&r, 0, KVPS__OP_PUSHPULL, 0, blob, 4 + nb);
    rmsg(&r, 1, KVPS__OP_PUSHPULL, KVPS_ERR_PEER_LOST, lost, sizeof lost - 1);
    rsave(&r, "pushpull_peer_lost");
    /* the worker's own requests: its hello (the first request: sequence 1, slot 1) refused by
       server 0, and an answer to a STATUS question, then the pull's real answers */
    static const char refused[] = "worker 1 was told num_workers = 2, server 0 (inproc://fz-reply-0) was told 3";
    static const char waits[] = "pull of key 1 waits for round 1, which workers 0 (never connected) have not pushed";
    rbegin(&r, 0x00 | 0);
    rmsg(&r, 0, KVPS__OP_HELLO, KVPS_ERR_CONFIG, refused, sizeof refused - 1);
    memcpy(r.b.d + r.b.n - (sizeof refused - 1) - 4 - 32 + 16, &(uint64_t){(1ull << 24) | 1}, 8); /* its req_id */
    rmsg(&r, 1, KVPS__OP_STATUS, 0, waits, sizeof waits - 1);
    rsave(&r, "hello_refused_status");
}

/* ---- ring messages: what a real rank 1 sends to rank 0, see fuzz_ring.c ------------------- */
typedef struct ring_job { kvps_ring *r; int which; size_t count; } ring_job;
static void *ring_thread(void *arg) {
    ring_job *j = (ring_job *)arg;
    fz_ring_op(j->r, 1, j->which, j->count); /* times out: rank 0 is only listening */
    return NULL;
}

static void ring_seed(int which, size_t count) {
    void *ctx = zmq_ctx_new();
    void *sniff = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(sniff, ZMQ_LINGER, &zero, sizeof zero);
    zmq_bind(sniff, "inproc://gen-ring-0");
    ring_job j = {NULL, which, count};
    if (kvps_ring_create(&(kvps_ring_desc){.rank = 1, .size = 2, .peers = "inproc://gen-ring-0,inproc://gen-ring-1",
                                           .timeout_ms = 150, .chunk_bytes = 64, .zmq_ctx = ctx,
                                           .join = which == FZ_RING_JOIN},
                         &j.r) != KVPS_OK) { fprintf(stderr, "ring\n"); exit(1); }
    pthread_t th;
    pthread_create(&th, NULL, ring_thread, &j);
    buf b;
    uint8_t cfg[2] = {(uint8_t)which, (uint8_t)count};
    begin(&b, cfg, 2);
    int64_t end = kvps__now_ms() + 100;
    zmq_pollitem_t it = {sniff, 0, ZMQ_POLLIN, 0};
    while (kvps__now_ms() < end) {
        if (zmq_poll(&it, 1, 10) <= 0) continue;
        zmq_msg_t m;
        int more = 1, k = 0;
        msg(&b);
        while (more) {
            zmq_msg_init(&m);
            zmq_msg_recv(&m, sniff, 0);
            more = zmq_msg_more(&m);
            if (k++ > 0) frame(&b, zmq_msg_data(&m), zmq_msg_size(&m)); /* not the routing id */
            zmq_msg_close(&m);
        }
    }
    pthread_join(th, NULL);
    kvps_ring_destroy(&j.r);
    zmq_close(sniff);
    zmq_ctx_term(ctx);
    static const char *names[FZ_RING_OPS] = {"allreduce", "allreduce_fp16", "allreduce_bf16", "topk", "allgather",
                                             "broadcast", "reduce_scatter", "alltoall", "gather", "scatter", "barrier",
                                             "allreduce_f16_prod", "ring_avg", "reduce_ring", "p2p_recv", "p2p_tags",
                                             "p2p_answered", "p2p_refused", "allgatherv", "alltoallv",
                                             "subring_allgatherv_p2p", "split_allreduce", "join"};
    char name[64];
    snprintf(name, sizeof name, "%s_%zu", names[which], count);
    save("fuzz_ring", name, &b);
}

/* A joined rank 0 (FZ_RING_JOIN), written by hand: rank 1's agreement for an AVG all-reduce of
   8 float32 and that all-reduce's recursive-doubling message, then an agreement in which rank 1
   has joined too (kvps_ring_join returns), then the barrier fuzz_ring runs next: its agreement
   and its message. */
static void ring_join_agreement(buf *b, uint32_t seq, int joined, const int64_t *p) {
    int64_t v[2 + 2 * KVPS_RING__JOIN_NP] = {0, joined};
    for (int j = 0; j < KVPS_RING__JOIN_NP; j++) {
        v[2 + j] = joined ? INT64_MIN : p[j];
        v[2 + KVPS_RING__JOIN_NP + j] = joined ? INT64_MIN : -p[j];
    }
    kvps_ring__hdr h = {KVPS_RING__MAGIC, seq, kvps_ring__tag(KVPS_RING__PH_RD, 0, 0, 0), 1, KVPS_COLL_ALLREDUCE,
                        KVPS_INT64, KVPS_MAX, 0, 0, sizeof v / sizeof *v, 0, KVPS_RING__JOIN_LAYOUT};
    msg(b);
    frame(b, &h, sizeof h);
    frame(b, v, sizeof v);
}
static void ring_join_seed(void) {
    buf b;
    uint8_t cfg[2] = {FZ_RING_JOIN, 8};
    begin(&b, cfg, 2);
    int64_t avg[KVPS_RING__JOIN_NP] = {KVPS_COLL_ALLREDUCE, KVPS_FLOAT32, 0, KVPS_AVG, 8, 0, 0, 0};
    int64_t bar[KVPS_RING__JOIN_NP] = {KVPS_COLL_BARRIER, 0, 0, 0, 0, 0, 0, 0};
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ring_join_agreement(&b, 1, 0, avg);
    kvps_ring__hdr h = {KVPS_RING__MAGIC, 2, kvps_ring__tag(KVPS_RING__PH_RD, 0, 0, 0), 1, KVPS_COLL_ALLREDUCE,
                        KVPS_FLOAT32, KVPS_AVG, 0, 0, 8, 0, 0};
    msg(&b);
    frame(&b, &h, sizeof h);
    frame(&b, x, sizeof x);
    ring_join_agreement(&b, 3, 1, avg);
    ring_join_agreement(&b, 4, 0, bar);
    kvps_ring__hdr hb = {KVPS_RING__MAGIC, 5, kvps_ring__tag(KVPS_RING__PH_BARRIER, 0, 0, 0), 1, KVPS_COLL_BARRIER,
                         0, 0, 0, 0, 0, 0, 0};
    msg(&b);
    frame(&b, &hb, sizeof hb);
    frame(&b, "", 0);
    save("fuzz_ring", "join_agreements", &b);
}

static void ring_seeds(void) {
    ring_join_seed();
    for (int w = 0; w < FZ_RING_OPS; w++) ring_seed(w, w == 12 || w == 13 ? 40 : 8);
    ring_seed(0, 0);
    ring_seed(14, 0);
}

/* ---- checkpoints: [mode][file], see fuzz_ckpt.c -------------------------------------------- */
static void ckpt_seeds(void) {
    /* one worker: the file is mostly each worker's window of request ids, 8 KiB apiece */
    const char *path = "/tmp/kvps-gen-corpus.ckpt";
    void *ctx = zmq_ctx_new();
    kvps_server *s = NULL;
    kvps_worker *w = NULL;
    int ok = kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://gen-ckpt", .num_workers = 1,
                                                   .max_value_len = 1 << 16, .zmq_ctx = ctx, .checkpoint_path = path,
                                                   .user_rules = fz_user_rules, .num_user_rules = 1},
                                &s) == KVPS_OK && kvps_server_start(s) == KVPS_OK;
    if (ok)
        ok = kvps_worker_create(&(kvps_worker_desc){.servers = "inproc://gen-ckpt", .rank = 0, .num_workers = 1, .zmq_ctx = ctx},
                                &w) == KVPS_OK;
    enum { NCK = 5 }; /* the last without a rule of its own */
    static const char *names[NCK] = {"ck.adam", "ck.momentum", "ck.adamw", "ck.user", "ck.plain"};
    static const kvps_rule rules[NCK] = {KVPS_RULE_ADAM, KVPS_RULE_MOMENTUM, KVPS_RULE_ADAMW, KVPS_RULE_USER, KVPS_RULE_DEFAULT};
    static const size_t lens[NCK] = {8, 5, 6, 4, 3};
    kvps_tensor t[NCK];
    kvps_table tb;
    kvps_req q;
    for (int i = 0; i < NCK && ok; i++) ok = kvps_worker_tensor(w, names[i], lens[i], &t[i]) == KVPS_OK;
    for (int i = 0; i < NCK - 1 && ok; i++)
        ok = kvps_worker_tensor_optim(w, t[i], &(kvps_optim){.rule = rules[i], .lr = 0.125f,
                                                             .weight_decay = i >= 2 ? 0.25f : 0.0f}, &q) == KVPS_OK &&
             kvps_worker_wait(w, q, 5000) == KVPS_OK;
    if (ok)
        ok = kvps_worker_table(w, &(kvps_table_desc){.name = "ck.rows", .dim = 4, .opt = {.rule = KVPS_RULE_ADAGRAD},
                                                      .init_scale = 0.25f, .seed = 3},
                               &tb, &q) == KVPS_OK && kvps_worker_wait(w, q, 5000) == KVPS_OK;
    float g[8] = {1, -2, 3, -4, 5, -6, 7, -8};
    for (int step = 0; step < 2 && ok; step++)
        for (int i = 0; i < NCK && ok; i++)
            ok = kvps_worker_push_tensor(w, t[i], g, &q) == KVPS_OK && kvps_worker_wait(w, q, 5000) == KVPS_OK;
    uint64_t ids[2] = {11, 1u << 30};
    if (ok) ok = kvps_worker_push_rows(w, tb, ids, g, 2, &q) == KVPS_OK && kvps_worker_wait(w, q, 5000) == KVPS_OK;
    if (ok) { /* the placement of a job that went from 2 to 3 servers (RESHARD) */
        s->place.V = 512;
        s->place.count = 2;
        s->place.n[0] = 2;
        s->place.n[1] = 3;
        s->place.m[1] = 1; /* shard 5 moved to the new server */
        s->place.nmv = 1;
        s->place.mv = (uint32_t *)malloc(8);
        ok = s->place.mv != NULL;
        if (ok) { s->place.mv[0] = 5; s->place.mv[1] = 2; }
        ok = ok && kvps_server_checkpoint(s, 5000) == KVPS_OK;
    }
    kvps_worker_destroy(&w);
    kvps_server_destroy(&s);
    zmq_ctx_term(ctx);
    buf b;
    FILE *f = ok ? fopen(path, "rb") : NULL;
    size_t n = f ? fread(b.d + 1, 1, sizeof b.d - 1, f) : 0;
    if (f) fclose(f);
    remove(path);
    if (!ok || n < 16) { fprintf(stderr, "gen_corpus: no checkpoint written\n"); exit(1); }
    b.d[0] = 1; /* without checksum and end marker: the harness puts them back (mode bit 0) */
    b.n = 1 + n - 8;
    save("fuzz_ckpt", "body", &b);
}


/* fuzz_repl: what a backup replica's primary sends it. */
static void repl_msg(buf *b, int kind, uint64_t seq) {
    kvps__hdr h = KT_HDR(.op = KVPS__OP_REPL, .rank = (uint32_t)kind, .nkeys = 1, .req_id = seq);
    msg(b);
    frame(b, &h, sizeof h);
}
static void push_frame(buf *b, uint64_t key, uint64_t len) { /* a push's meta as one frame of the message begun */
    kvps__hdr h = KT_HDR(.op = KVPS__OP_PUSH, .rank = 0, .nkeys = 1, .req_id = ++req_id << 24, .status = 77);
    uint8_t m[KVPS__HDR + KVPS__KENT];
    memcpy(m, &h, sizeof h);
    memcpy(m + KVPS__HDR, &key, 8);
    memcpy(m + KVPS__HDR + 8, &len, 8);
    frame(b, m, sizeof m);
}
/* A ROUND message (REPL sequence seq) of key 11 (4 floats) at round `round`, all 3 workers in
   it with incarnation 77, worker r's contribution from its request round + r; the done list
   names worker 0's request `round` in round 1. */
static void round_msg(buf *b, uint64_t round, uint64_t seq) {
    repl_msg(b, KVPS__REPL_ROUND, seq);
    uint8_t done[8 + KVPS__RDONE] = {0};
    uint32_t nd = round == 1, one = 1, inc = 77, w0 = 0;
    memcpy(done, &one, 4);
    memcpy(done + 4, &nd, 4);
    memcpy(done + 8, &w0, 4);
    memcpy(done + 12, &inc, 4);
    memcpy(done + 16, &round, 8);
    frame(b, done, 8 + nd * KVPS__RDONE);
    uint8_t rec[KVPS__RREC + 3 * KVPS__RTAG + 16] = {0};
    uint64_t key = 11, len = 4;
    uint32_t count = 3;
    memcpy(rec, &key, 8);
    memcpy(rec + 8, &len, 8);
    memcpy(rec + 16, &round, 8);
    memcpy(rec + 24, &count, 4);
    for (uint32_t r = 0; r < 3; r++) {
        uint8_t *t = rec + KVPS__RREC + r * KVPS__RTAG;
        uint64_t q = round + r;
        memcpy(t, &inc, 4);
        memcpy(t + 4, &one, 4);
        memcpy(t + 8, &q, 8);
    }
    float sum[4] = {1.0f, 2.0f, 3.0f, (float)round};
    memcpy(rec + KVPS__RREC + 3 * KVPS__RTAG, sum, sizeof sum);
    frame(b, rec, sizeof rec);
}
/* A worker's READ (incarnation 77) of one key, after its request `after`. */
static void read_msg(buf *b, uint32_t rank, uint64_t key, uint64_t len, uint64_t after) {
    kvps__hdr h = KT_HDR(.op = KVPS__OP_READ, .rank = rank, .nkeys = 1, .req_id = ++req_id << 24, .status = 77);
    uint8_t m[KVPS__HDR + KVPS__KENT];
    memcpy(m, &h, sizeof h);
    memcpy(m + KVPS__HDR, &key, 8);
    memcpy(m + KVPS__HDR + 8, &len, 8);
    msg(b);
    frame(b, m, sizeof m);
    frame(b, &after, 8);
}
static void repl_seeds(void) {
    buf b;
    uint64_t k1[1] = {11}, l1[1] = {4};
    uint8_t cfg = 1; /* async */
    /* the primary's copies of a hello, a push and a pushpull, a lost worker, then a pull from a
       worker (this backup takes over) */
    begin(&b, &cfg, 1);
    repl_msg(&b, KVPS__REPL_FWD, 1); frame(&b, "wid", 3); push_frame(&b, k1[0], l1[0]); values(&b, 4, 1);
    repl_msg(&b, KVPS__REPL_LOST, 2); { uint32_t r = 0; frame(&b, &r, 4); }
    meta(&b, KVPS__OP_PULL, 0, 0, 0, k1, l1, 1);
    save("fuzz_repl", "forward_lost_takeover", &b);
    /* a snapshot of a server holding one key, then a copy of a push after it, then a gap */
    kvps_server *s = NULL;
    kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://gen-repl", .num_workers = 1,
                                            .consistency = KVPS_ASYNC, .update = KVPS_UPDATE_ACCUMULATE}, &s);
    kvps__key_create(s, 11, 4);
    char *snap = NULL;
    size_t nsnap = 0;
    FILE *f = open_memstream(&snap, &nsnap);
    kvps__cw w = {f, 0, 0};
    kvps__ckpt_put(s, &w);
    fclose(f);
    uint8_t sess[64];
    kvps__session_put(s, sess);
    size_t nsess = kvps__session_bytes(s);
    cfg = 1;
    begin(&b, &cfg, 1);
    repl_msg(&b, KVPS__REPL_SNAP, 5); frame(&b, snap, nsnap); frame(&b, sess, nsess);
    repl_msg(&b, KVPS__REPL_FWD, 6); frame(&b, "wid", 3); push_frame(&b, k1[0], l1[0]); values(&b, 4, 2);
    repl_msg(&b, KVPS__REPL_FWD, 9); frame(&b, "wid", 3);
    save("fuzz_repl", "snapshot_then_stream", &b);
    free(snap);
    kvps_server_destroy(&s);
    /* BSP, 3 workers: two rounds of key 11 as the primary sends them (kvps__round_note), the
       first completing worker 0's push 1, then worker 0 re-sends its push 2 (this backup takes
       over: key 11's part of it is in round 2 already) */
    cfg = 4; /* BSP, three workers */
    begin(&b, &cfg, 1);
    for (uint64_t round = 1; round <= 2; round++) round_msg(&b, round, round);
    req_id = 1; /* the re-sent push is worker 0's request 2 */
    msg(&b); push_frame(&b, k1[0], l1[0]); values(&b, 4, 3);
    save("fuzz_repl", "bsp_rounds_then_takeover", &b);
    /* READs (a worker's .read_local) at this backup: after round 1, worker 0's READ for its
       request 2 waits, worker 1's for its request 2 is answered at once, one for a key this
       replica does not hold is sent to the primary; round 2 then answers worker 0's */
    begin(&b, &cfg, 1);
    round_msg(&b, 1, 1);
    read_msg(&b, 0, 11, 4, 2);
    read_msg(&b, 1, 11, 4, 2);
    read_msg(&b, 2, 12, 4, 2);
    round_msg(&b, 2, 2);
    save("fuzz_repl", "bsp_reads_wait_for_rounds", &b);
}

/* fuzz_shm: [cap byte][flags][u64 start] then writes [n byte][n % 128 + 1 bytes] of a queue's
   byte stream, messages [u64 length][40-byte ring header][payload] as a peer writes them. */
static void shm_write(buf *b, const uint8_t *p, size_t n) { /* in writes of at most 128 bytes */
    for (size_t at = 0; at < n;) {
        size_t m = n - at < 128 ? n - at : 128;
        uint8_t nb = (uint8_t)(m - 1);
        put(b, &nb, 1);
        put(b, p + at, m);
        at += m;
    }
}
/* A ring frame as a peer writes it, into m (8 + 40 + len bytes, len <= 300): [u64 len][40-byte
   header: magic, zeros][len bytes of fill]. fuzz_shm and fuzz_tcp read these. */
static size_t ring_frame(uint8_t *m, uint32_t magic, uint64_t len, uint8_t fill) {
    memset(m, fill, 8 + 40 + (size_t)len);
    memcpy(m, &len, 8);
    memset(m + 8, 0, 40);
    memcpy(m + 8, &magic, 4);
    return 8 + 40 + (size_t)len;
}
static void shm_msg(buf *b, uint32_t magic, uint64_t len, uint8_t fill) {
    uint8_t m[8 + 40 + 300];
    shm_write(b, m, ring_frame(m, magic, len, fill));
}
static void shm_seeds(void) {
    buf b;
    uint8_t cfg[10] = {2, 0}; /* 256-byte queue */
    uint64_t start = 0;
    memcpy(cfg + 2, &start, 8);
    begin(&b, cfg, sizeof cfg);
    shm_msg(&b, 0x5250564Bu, 16, 1);
    shm_msg(&b, 0x5250564Bu, 0, 2);
    shm_msg(&b, 0x5250564Bu, 200, 3);
    save("fuzz_shm", "three_messages", &b);
    start = ~(uint64_t)0 - 100; /* the indices wrap at 2^64 within the stream */
    cfg[0] = 0;                 /* 64 bytes: every message streams through in parts */
    memcpy(cfg + 2, &start, 8);
    begin(&b, cfg, sizeof cfg);
    shm_msg(&b, 0x5250564Bu, 150, 4);
    shm_msg(&b, 0x5250564Bu, 7, 5);
    save("fuzz_shm", "wrapping_indices", &b);
    cfg[1] = 1;
    begin(&b, cfg, sizeof cfg);
    shm_msg(&b, 0x12345678u, 100, 0xEE);
    save("fuzz_shm", "bad_magic_bad_tail", &b);
}

/* fuzz_tcp: [flags][size][me][preamble 32][tokens 16 x ranks][cuts 8][stream]: a preamble
   (right token via flags bit 0, or a wrong one, or garbage), then frames as a peer writes them. */
static void tcp_frame(buf *b, uint32_t magic, uint64_t len, uint8_t fill) {
    uint8_t m[8 + 40 + 300];
    put(b, m, ring_frame(m, magic, len, fill));
}
static void tcp_seeds(void) {
    buf b;
    uint8_t cfg[3] = {1, 2, 0}; /* 4 ranks, this is rank 0, the preamble gets the true token */
    uint8_t pre[32], tok[64], cuts[8] = {0, 5, 47, 2, 100, 255, 9, 30};
    uint32_t magic = 0x5450564Bu, size = 4;
    uint16_t v = 1, src = 2;
    memset(pre, 0, sizeof pre);
    memcpy(pre, &magic, 4);
    memcpy(pre + 4, &v, 2);
    memcpy(pre + 6, &src, 2);
    memcpy(pre + 8, &size, 4);
    for (int i = 0; i < 64; i++) tok[i] = (uint8_t)(i * 7 + 1);
    begin(&b, cfg, sizeof cfg);
    put(&b, pre, sizeof pre); put(&b, tok, sizeof tok); put(&b, cuts, sizeof cuts);
    tcp_frame(&b, 0x5250564Bu, 16, 1);
    tcp_frame(&b, 0x5250564Bu, 0, 2);
    tcp_frame(&b, 0x5250564Bu, 300, 3);
    save("fuzz_tcp", "accepted_three_frames", &b);
    cfg[0] = 0; /* the token as written (zeros): refused */
    begin(&b, cfg, sizeof cfg);
    put(&b, pre, sizeof pre); put(&b, tok, sizeof tok); put(&b, cuts, sizeof cuts);
    tcp_frame(&b, 0x5250564Bu, 40, 4);
    tcp_frame(&b, 0x12345678u, 10, 5);
    save("fuzz_tcp", "wrong_token_bad_magic", &b);
    begin(&b, cfg, sizeof cfg);
    put(&b, (const uint8_t *)"GET / HTTP/1.1\r\nHost: x\r\n\r\n  ", 32);
    save("fuzz_tcp", "stranger_http", &b);
}

/* fuzz_rendezvous: one message as it arrives, each kind made by kvps_launch.h's own writer. */
static void rdv_save(const char *name, kvps__rdv_buf *r) {
    buf b;
    begin(&b, NULL, 0);
    put(&b, r->p, r->n);
    save("fuzz_rendezvous", name, &b);
    free(r->p);
    *r = (kvps__rdv_buf){NULL, 0, 0, 1};
}
static void rendezvous_seeds(void) {
    kvps__rdv_buf r = {NULL, 0, 0, 1};
    uint64_t tok = 0x1234;
    kvps__rdv_put_hdr(&r, KVPS__RDV_REGISTER, 1, 3);
    kvps__rdv_put(&r, &tok, 8);
    kvps__rdv_put_str(&r, "ps 2", KVPS__RDV_SHAPE_MAX);
    kvps__rdv_put_str(&r, "tcp://10.0.0.2:41000", KVPS__RDV_STR_MAX);
    kvps__rdv_put_str(&r, "0f3c n4026531840 i1 p2 s3:4", KVPS__RDV_STR_MAX);
    kvps__rdv_put_str(&r, "node2", KVPS__RDV_STR_MAX);
    rdv_save("register", &r);
    kvps__rdv_put_hdr(&r, KVPS__RDV_TABLE, 2, 3);
    for (int i = 0; i < 3; i++) {
        kvps__rdv_put_str(&r, i < 2 ? "tcp://10.0.0.1:41000" : "", KVPS__RDV_STR_MAX);
        kvps__rdv_put_str(&r, i ? "boot n2" : "boot n1", KVPS__RDV_STR_MAX);
        kvps__rdv_put_str(&r, "node", KVPS__RDV_STR_MAX);
    }
    rdv_save("table", &r);
    kvps__rdv_put_hdr(&r, KVPS__RDV_ERROR, 1, 4);
    kvps__rdv_put_str(&r, "rendezvous at 10.0.0.1:29500: rank 3 of 4 did not register within 300 s", KVPS__RDV_ERR_MAX);
    rdv_save("error", &r);
    kvps__rdv_put_hdr(&r, KVPS__RDV_ACK, 3, 4);
    rdv_save("ack", &r);
}

/* gen_corpus DIR [TARGET]: every target's seeds, or only TARGET's (e.g. fuzz_ring). */
int main(int argc, char **argv) {
    static const struct { const char *target; void (*fn)(void); } gens[] = {
        {"fuzz_server", server_seeds}, {"fuzz_codec", codec_seeds}, {"fuzz_env", env_seeds}, {"fuzz_reply", reply_seeds},
        {"fuzz_ring", ring_seeds},     {"fuzz_ckpt", ckpt_seeds},   {"fuzz_repl", repl_seeds},
        {"fuzz_shm", shm_seeds},       {"fuzz_tcp", tcp_seeds},     {"fuzz_rendezvous", rendezvous_seeds}};
    if (argc != 2 && argc != 3) { fprintf(stderr, "usage: gen_corpus <dir> [target]\n"); return 2; }
    root = argv[1];
    if (mkdir(root, 0755) != 0 && errno != EEXIST) { perror(root); return 1; }
    for (size_t i = 0; i < sizeof gens / sizeof gens[0]; i++)
        if (argc == 2 || strcmp(argv[2], gens[i].target) == 0) gens[i].fn();
    return 0;
}
