/* fuzz_server - the server's request path: every message a worker (or anyone who can reach the
   port) may send, through kvps__handle, the function kvps_server_run calls for each received
   message, with frames built exactly as kvps__recv_msg builds them (at most 4 kept, the rest
   counted). No receive socket is needed; the replies go out through the server's real ROUTER
   to a DEALER that this harness reads, so they are checked too.

   Input: [config byte][message]("\xfeMSG"[message])*, a message = its frames after the routing
   id, separated by "\xfeFRM". An empty message is one with no meta frame at all, and it ends a
   batch: kvps__flush_all runs there and at the end of the input, as kvps_server_run runs it
   after each batch it drains (applying the pushes it held back). A frame "\xfe" "BIG" u32 n,
   byte b stands for n bytes of b (n <= 1 MiB), so that values of the lengths the server treats
   differently (held-back pushes from 16384 floats, zero-copy replies from 32 KiB) fit in an
   input. Config byte: bits 0-1 consistency, bit 2 three workers (else one), bit 3 server rank 1
   (not the barrier server), bits 4-5 update rule (3: custom update_fn), bit 6 max_value_len
   1 << 16 (else 64), bit 7 staleness 2. "\xfeGATE" right after the config byte holds the messages
   to the rules of a connection (ONLY THE JOB TALKS TO THE JOB): strangers' messages refused.

   Properties checked beyond "no crash, no leak, no hang":
   - every reply is a well-formed kvps reply (magic, version, op | 0x80, a known status <= 0,
     [meta][text] for errors and STATUS, [meta][values] of the right size for pulls);
   - a rejected request changes nothing (a digest of every key, round, buffered contribution,
     barrier and table row is the same before and after): "a message is checked whole before
     any stored value is touched" (kvps.h, WIRE FORMAT);
   - every request that is rejected, or is not a pull or barrier (which may wait), gets a reply
     by the end of its batch. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/fuzz/fuzz_common.h"

static void *fz_ctx;
static int fz_seq;

/* A user codec, so that the server's path for codecs it does not know itself is covered:
   [8-byte header, id 200][n floats]. */
enum { FZ_USER_ID = 200 };
static size_t fz_user_max(const kvps_codec *c, size_t n) { (void)c; return 8 + 4 * n; }
static kvps_result fz_user_encode(const kvps_codec *c, const float *x, size_t n, float *r, void *out, size_t cap,
                                  size_t *ob) {
    (void)c; (void)r;
    if (cap < 8 + 4 * n) return KVPS_ERR_TOO_LARGE;
    uint8_t *o = (uint8_t *)out;
    uint32_t n32 = (uint32_t)n;
    memset(o, 0, 8);
    o[0] = FZ_USER_ID;
    memcpy(o + 4, &n32, 4);
    if (n) memcpy(o + 8, x, 4 * n);
    *ob = 8 + 4 * n;
    return KVPS_OK;
}
static kvps_result fz_user_decode(const kvps_codec *c, const void *in, size_t bytes, float *dst, size_t n, int acc) {
    (void)c;
    const uint8_t *p = (const uint8_t *)in;
    if (bytes != 8 + 4 * n || p[0] != FZ_USER_ID || fz_get32(p + 4) != n) return KVPS_ERR_MALFORMED;
    for (size_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, p + 8 + 4 * i, 4);
        dst[i] = acc ? dst[i] + v : v;
    }
    return KVPS_OK;
}

static void fz_update(const kvps_update_args *a) {
    for (size_t i = 0; i < a->len; i++) a->value[i] += a->sum[i] * 0.5f;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    fz_ctx = zmq_ctx_new();
    kvps_log_set_fn(fz_nolog, NULL);
    kvps_log_set_level(KVPS_LOG_DEBUG); /* format every message, print none */
    return 0;
}

/* ---- the digest of everything a request may change -------------------------------------- */
static uint64_t fz_h(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = (const uint8_t *)p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 0x100000001b3ull; }
    return h;
}
#define FZ_HV(h, v) ((h) = fz_h((h), &(v), sizeof(v)))

static uint64_t fz_digest(const kvps_server *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    FZ_HV(h, s->nkeys);
    for (uint32_t i = 0; i < s->nkeys; i++) {
        const kvps__key *k = s->keys[i];
        FZ_HV(h, k->key); FZ_HV(h, k->len); FZ_HV(h, k->round); FZ_HV(h, k->summed);
        FZ_HV(h, k->opt); FZ_HV(h, k->b1t); FZ_HV(h, k->b2t);
        h = fz_h(h, k->value, (size_t)k->len * sizeof(float));
        if (k->summed && k->accum) h = fz_h(h, k->accum, (size_t)k->len * sizeof(float));
        int has_state = k->state != NULL;
        FZ_HV(h, has_state);
        h = fz_h(h, k->recv, (size_t)s->m * sizeof *k->recv);
        for (int r = 0; k->qhead && r < s->m; r++)
            for (const kvps__pend *p = k->qhead[r]; p; p = p->next) h = fz_h(h, p->data, (size_t)k->len * sizeof(float));
        uint32_t nw = 0;
        for (const kvps__parked *p = k->waiters; p; p = p->next) nw++;
        FZ_HV(h, nw);
    }
    h = fz_h(h, s->barrier_gen, (size_t)s->m * sizeof *s->barrier_gen);
    uint32_t nb = 0;
    for (const kvps__parked *p = s->barrier_waiters; p; p = p->next) nb++;
    FZ_HV(h, nb);
    FZ_HV(h, s->cur_k);
    for (const kvps__table *t = s->tables; t; t = t->next) {
        FZ_HV(h, t->id); FZ_HV(h, t->dim); FZ_HV(h, t->sdim); FZ_HV(h, t->opt); FZ_HV(h, t->init_scale);
        FZ_HV(h, t->seed); FZ_HV(h, t->nrows);
        uint32_t d = t->dim < 64 ? t->dim : 64; /* the head of each row is enough to see a write */
        for (uint64_t r = 0; r < t->nrows; r++) h = fz_h(h, kvps__row(t, r), d * sizeof(float));
    }
    return h;
}

/* ---- replies ------------------------------------------------------------------------------ */
typedef struct fz_sent {
    int nfr;
    kvps__hdr h;
    int has_hdr;
} fz_sent;

/* Reads every reply waiting on the DEALER and checks its form. Returns how many. */
static int fz_replies(void *dealer, const kvps_server *s) {
    int n = 0;
    for (;;) {
        zmq_msg_t f[4];
        int nf;
        kvps__hdr h;
        if (!fz_reply_next(dealer, f, &nf, &h)) return n; /* (checks the form of each) */
        n++;
#ifdef FZ_WIRE_DUMP /* tests/fuzz/wire_diff.sh: every reply byte, to compare two versions */
        printf("R%d", nf);
        for (int i = 0; i < nf && i < 4; i++) {
            const unsigned char *b = (const unsigned char *)zmq_msg_data(&f[i]);
            printf(" ");
            for (size_t j = 0; j < zmq_msg_size(&f[i]); j++) printf("%02x", b[j]);
        }
        printf("\n");
#endif
        if (h.status < 0) {
            if (getenv("FZ_VERBOSE"))
                fprintf(stderr, "  op %u: %s: %.*s\n", h.op & 0x7f, kvps_result_str((kvps_result)h.status), (int)zmq_msg_size(&f[1]),
                        (const char *)zmq_msg_data(&f[1]));
        } else {
            int op = h.op & 0x7f;
            int data = kvps__op_pulls(op) || op == KVPS__OP_PULL_ROWS || op == KVPS__OP_STATUS || op == KVPS__OP_KEYS ||
                       op == KVPS__OP_EXPORT || op == KVPS__OP_EXPORT_ROWS || op == KVPS__OP_ALLREDUCE; /* (KEYS: {key,
                                                                                len} entries; EXPORT(_ROWS): key / table
                                                                                records; ALLREDUCE: the f64 result) */
            if (op == KVPS__OP_ALLREDUCE) FZ_CHECK(zmq_msg_size(&f[1]) == 8, "ALLREDUCE answered with %zu bytes", zmq_msg_size(&f[1]));
            if ((op == KVPS__OP_HELLO && nf == 2) || op == KVPS__OP_PLACE_GET) { /* the server's placement */
                kvps__place p;
                const char *bad = kvps__place_dec(&p, (const unsigned char *)zmq_msg_data(&f[1]), zmq_msg_size(&f[1]));
                FZ_CHECK(!bad && (op == KVPS__OP_PLACE_GET || kvps__place_hash(&s->place)) &&
                             kvps__place_hash(&p) == kvps__place_hash(&s->place),
                         "%s answered with %zu bytes that are not this server's placement", kvps__ops[op].name,
                         zmq_msg_size(&f[1]));
                kvps__place_free(&p);
                data = 1;
            }
            FZ_CHECK(nf == (data ? 2 : 1), "op %d answered with %d frames", op, nf);
            if (op == KVPS__OP_KEYS)
                FZ_CHECK(zmq_msg_size(&f[1]) == (size_t)s->nkeys * KVPS__KENT, "KEYS answered with %zu bytes for %u keys",
                         zmq_msg_size(&f[1]), s->nkeys);
            if (op == KVPS__OP_STATUS) /* [meta][text]: words about the request */
                FZ_CHECK(zmq_msg_size(&f[1]) > 0 && !memchr(zmq_msg_data(&f[1]), 0, zmq_msg_size(&f[1])),
                         "STATUS answered with %zu bytes of text", zmq_msg_size(&f[1]));
            if (op == KVPS__OP_PULL_ROWS) {
                /* rows x dim floats, dim of one of the tables (the reply does not say which) */
                int ok = 0;
                for (const kvps__table *t = s->tables; t && !ok; t = t->next)
                    ok = zmq_msg_size(&f[1]) == (size_t)h.nkeys * t->dim * sizeof(float);
                FZ_CHECK(ok, "PULL_ROWS reply of %zu bytes for %u rows", zmq_msg_size(&f[1]), h.nkeys);
            }
        }
        for (int i = 0; i < nf && i < 4; i++) zmq_msg_close(&f[i]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t cfg = data[0];
    kvps_codec user = kvps_codec_get(KVPS_CODEC_NONE);
    user.id = FZ_USER_ID;
    user.name = "fuzz-user";
    user.max_bytes = fz_user_max;
    user.encode = fz_user_encode;
    user.decode = fz_user_decode;
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://fuzz-server-%d", fz_seq++);
    int upd = (cfg >> 4) & 3;
    kvps_server_desc d = {
        .endpoint = ep,
        .num_workers = (cfg & 4) ? 3 : 1,
        .rank = (cfg >> 3) & 1,
        .consistency = (kvps_consistency)(cfg & 3),
        .update = (kvps_update)upd,
        .update_fn = upd == KVPS_UPDATE_CUSTOM ? fz_update : NULL,
        .max_value_len = (cfg & 64) ? 1 << 16 : 64,
        .zmq_ctx = fz_ctx,
        .no_malloc_tuning = 1,
        .codecs = &user,
        .num_codecs = 1,
        .staleness = (cfg & 128) ? 2 : 0,
        .user_rules = fz_user_rules,
        .num_user_rules = 1,
    };
    kvps_server *s = NULL;
    FZ_CHECK(kvps_server_create(&d, &s) == KVPS_OK, "server create");
    /* The peer the replies go to: a DEALER whose routing id the messages carry. */
    static const char rid[] = "fuzz-peer";
    void *dealer = fz_peer(fz_ctx, s, kvps_server_endpoint(s), rid, sizeof rid - 1);

    fz_cut msgs = {data + 1, size - 1, 0};
    /* "\xfeGATE" first: the harness's messages count as a connection's (kvps__admit, SECURITY):
       only a hello opens the door, and everything else from strangers is refused unchanged */
    static const uint8_t gate_mark[5] = {0xfe, 'G', 'A', 'T', 'E'};
    if (msgs.n >= sizeof gate_mark && memcmp(msgs.p, gate_mark, sizeof gate_mark) == 0) {
        s->gate = 1;
        msgs.p += sizeof gate_mark;
        msgs.n -= sizeof gate_mark;
    }
    const uint8_t *mp;
    size_t mn;
    long owed = 0, replies = 0; /* replies due by the end of the batch, and received */
    while (fz_next(&msgs, FZ_MSG, &mp, &mn)) {
        zmq_msg_t fr[4];
        int n = 0, total = 1;
        zmq_msg_init_size(&fr[0], sizeof rid - 1);
        memcpy(zmq_msg_data(&fr[0]), rid, sizeof rid - 1);
        n = 1;
        fz_sent sent = {0};
        if (mn) {
            fz_cut frames = {mp, mn, 0};
            const uint8_t *fp;
            size_t fn;
            while (fz_next(&frames, FZ_FRM, &fp, &fn)) {
                if (total == 1 && fn >= KVPS__HDR) { memcpy(&sent.h, fp, sizeof sent.h); sent.has_hdr = 1; }
                total++;
                if (n < 4) { /* as kvps__recv_msg: at most 4 kept */
                    if (fn >= 9 && memcmp(fp, "\xfe" "BIG", 4) == 0 && fz_get32(fp + 4) <= (1u << 20)) {
                        zmq_msg_init_size(&fr[n], fz_get32(fp + 4));
                        memset(zmq_msg_data(&fr[n]), fp[8], zmq_msg_size(&fr[n]));
                    } else {
                        zmq_msg_init_size(&fr[n], fn);
                        if (fn) memcpy(zmq_msg_data(&fr[n]), fp, fn);
                    }
                    n++;
                }
            }
        }
        sent.nfr = total;
#ifdef FZ_AVOID_KNOWN
        /* Bugs already reported, skipped so that a run can look past them (-DFZ_AVOID_KNOWN). */
        if (sent.has_hdr && sent.h.op == KVPS__OP_TABLE && total == 3 && zmq_msg_size(&fr[2]) != KVPS__TREC) {
            for (int j = 0; j < n; j++) zmq_msg_close(&fr[j]);
            continue;
        }
#endif
        /* A request that moves keys (EXPORT, DROP, KEYS, IMPORT) first applies the pushes held
           back (kvps__flush_all), then checks that its keys are between rounds: a refusal there
           follows a change that is not its own (the held-back pushes were accepted earlier). */
        if (sent.has_hdr && sent.h.op < KVPS__OP_COUNT && kvps__ops[sent.h.op].serve == kvps__serve_move) kvps__flush_all(s);
        uint64_t before = fz_digest(s), errs = s->stats.errors, pushes = s->stats.pushes;
        int in_range = sent.has_hdr && sent.h.rank < (uint32_t)s->m;
        uint64_t gen0 = in_range ? s->barrier_gen[sent.h.rank] : 0;
        kvps__handle(s, fr, total);
        for (int j = 0; j < n; j++) zmq_msg_close(&fr[j]);
        /* (an accepted BYE may answer others' waiting pulls and barriers with errors: they need
           a worker that has finished. Those are not its rejection) */
        int bye_ok = sent.has_hdr && sent.h.op == KVPS__OP_BYE && sent.h.rank < (uint32_t)s->m && s->done[sent.h.rank];
        /* (a pushpull whose push was applied and whose pull then fails, say for a worker that
           has finished, is answered with an error: that is not a rejection either) */
        int pp_applied = sent.has_hdr && sent.h.op == KVPS__OP_PUSHPULL && s->stats.pushes != pushes;
        /* (a barrier or ALLREDUCE that entered its generation may complete it with an error for
           every entry, as when they disagree on the call: its entry is no rejection) */
        int entered = in_range && s->barrier_gen[sent.h.rank] != gen0;
        /* (an accepted JOIN, as a BYE, may complete others' rounds and barriers with errors) */
        int join_ok = in_range && sent.h.op == KVPS__OP_JOIN && s->out[sent.h.rank] == KVPS__OUT_JOINED;
        int rejected = s->stats.errors != errs && !bye_ok && !pp_applied && !entered && !join_ok;
        if (getenv("FZ_VERBOSE"))
            fprintf(stderr, "request: op %d rank %u nkeys %u flags %x, %d frames%s\n", sent.has_hdr ? (int)sent.h.op : -1,
                    sent.h.rank, sent.h.nkeys, sent.h.flags, total - 1, rejected ? ", refused" : "");
        if (rejected)
            FZ_CHECK(fz_digest(s) == before, "a rejected request (op %d) changed the server's state",
                     sent.has_hdr ? (int)sent.h.op : -1);
        replies += fz_replies(dealer, s);
        int may_wait = sent.has_hdr && (kvps__op_pulls(sent.h.op) || sent.h.op == KVPS__OP_BARRIER ||
                                        sent.h.op == KVPS__OP_ALLREDUCE);
        owed += total >= 2 && (rejected || !may_wait);
        if (total == 1) { /* end of a batch */
            kvps__flush_all(s);
            replies += fz_replies(dealer, s);
            FZ_CHECK(replies >= owed, "%ld requests due an answer, %ld replies", owed, replies);
        }
    }
    kvps__flush_all(s);
    replies += fz_replies(dealer, s);
    FZ_CHECK(replies >= owed, "%ld requests due an answer, %ld replies", owed, replies);
    if (getenv("FZ_VERBOSE"))
        fprintf(stderr, "cfg 0x%02x: %ld replies (%ld due), %llu pushes, %llu rounds, %llu fused, %llu errors\n", cfg, replies,
                owed, (unsigned long long)s->stats.pushes, (unsigned long long)s->stats.rounds,
                (unsigned long long)s->stats.fused, (unsigned long long)s->stats.errors);
    zmq_close(dealer);
    kvps_server_destroy(&s);
    /* ZeroMQ frees closed sockets on its reaper thread; on a busy machine thousands of inputs a
       second can outrun it (EMFILE at ZMQ_MAX_SOCKETS, 1023: a server is 3 sockets with its
       monitor, plus our DEALER). A new context every 64 inputs waits for it. */
    if (fz_seq % 64 == 0) {
        zmq_ctx_term(fz_ctx);
        fz_ctx = zmq_ctx_new();
    }
    return 0;
}

#ifdef FZ_WIRE_DUMP
/* A driver without libFuzzer for tests/fuzz/wire_diff.sh: each input file, then FZ_MUTATIONS
   (environment) variants of it from a fixed-seed generator (bytes changed, runs deleted, words
   zeroed, another server config), so that two builds see the same inputs. */
static uint64_t fz_rng = 88172645463325252ull;
static uint64_t fz_rand(void) {
    fz_rng ^= fz_rng << 13;
    fz_rng ^= fz_rng >> 7;
    fz_rng ^= fz_rng << 17;
    return fz_rng;
}
static size_t fz_mutate(uint8_t *b, size_t n) {
    int nm = 1 + (int)(fz_rand() % 4);
    for (int k = 0; k < nm && n > 1; k++) {
        size_t at = 1 + fz_rand() % (n - 1), len;
        switch (fz_rand() % 6) {
        case 0: b[at] = (uint8_t)fz_rand(); break;
        case 1: b[at] ^= (uint8_t)(1u << (fz_rand() % 8)); break;
        case 2: b[at] = (uint8_t)(fz_rand() % 3 == 0 ? 0 : 0xff); break;
        case 3: b[at] = (uint8_t)(fz_rand() % 12); break; /* ops, flags, small counts */
        case 4:
            len = 1 + fz_rand() % 32;
            if (at + len > n) len = n - at;
            memmove(b + at, b + at + len, n - at - len);
            n -= len;
            break;
        default: if (at + 4 <= n) memset(b + at, 0, 4); break;
        }
    }
    if (fz_rand() % 4 == 0) b[0] = (uint8_t)fz_rand(); /* another server config */
    return n;
}
int main(int argc, char **argv) {
    static uint8_t in[1 << 22], buf[1 << 22];
    int mutations = getenv("FZ_MUTATIONS") ? atoi(getenv("FZ_MUTATIONS")) : 0;
    LLVMFuzzerInitialize(&argc, &argv);
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) { perror(argv[i]); return 1; }
        size_t n = fread(in, 1, sizeof in, f);
        fclose(f);
        printf("== %s\n", argv[i]);
        LLVMFuzzerTestOneInput(in, n);
        for (int m = 0; m < mutations; m++) {
            memcpy(buf, in, n);
            size_t n2 = fz_mutate(buf, n);
            printf("-- %d\n", m);
            LLVMFuzzerTestOneInput(buf, n2);
        }
        fflush(stdout);
    }
    return 0;
}
#endif
