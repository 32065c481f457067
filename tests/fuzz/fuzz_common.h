/* fuzz_common.h - what the kvps libFuzzer targets share: splitting an input into messages and
   frames, a silent logger, and a check that stops the fuzzer with a message.

   Input layout used by the message-driven targets (fuzz_server, fuzz_reply, fuzz_ring):
       [config bytes][message]("\xfeMSG"[message])*
       message = [frame]("\xfeFRM"[frame])*
   Delimiters rather than length prefixes: a mutation that inserts or drops bytes inside one
   frame leaves the others where they were, so the fuzzer keeps its place in the protocol.
   Include after the kvps headers (the server parts with kvps.h's implementation). */
#ifndef KVPS_FUZZ_COMMON_H
#define KVPS_FUZZ_COMMON_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FZ_MSG "\xfe" "MSG"
#define FZ_FRM "\xfe" "FRM"
#define FZ_SEP 4

/* A property the code under test must keep: a violation is a crash the fuzzer saves. */
#define FZ_CHECK(cond, ...)                                                                    \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "FUZZ CHECK FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

static inline const uint8_t *fz_find(const uint8_t *p, size_t n, const char *sep) {
    for (size_t i = 0; i + FZ_SEP <= n; i++)
        if (memcmp(p + i, sep, FZ_SEP) == 0) return p + i;
    return NULL;
}

/* Cuts [p, p + n) at sep: the piece before it in *piece / *plen, the rest after it. Returns 0 when
   nothing is left (n was 0 and the last piece was already given). */
typedef struct fz_cut {
    const uint8_t *p;
    size_t n;
    int done;
} fz_cut;

static inline int fz_next(fz_cut *c, const char *sep, const uint8_t **piece, size_t *plen) {
    if (c->done) return 0;
    const uint8_t *e = fz_find(c->p, c->n, sep);
    *piece = c->p;
    if (!e) {
        *plen = c->n;
        c->done = 1;
        return 1;
    }
    *plen = (size_t)(e - c->p);
    c->n -= *plen + FZ_SEP;
    c->p = e + FZ_SEP;
    return 1;
}

static inline void fz_nolog(void *user, kvps_log_level level, const char *msg) {
    (void)user; (void)level;
    /* read the whole message, so a missing terminator shows up under ASan */
    volatile size_t n = strlen(msg);
    (void)n;
}

#ifdef KVPS__IMPLEMENTED /* the parameter server's (kvps.h): a peer socket, its replies */
/* The peer a server's replies go to: a DEALER with routing id rid (rid_len bytes) connected to
   ep, the connection taken in by the server's ROUTER (s) before the harness hands it messages. */
static inline void *fz_peer(void *ctx, kvps_server *s, const char *ep, const char *rid, size_t rid_len) {
    void *dealer = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(dealer, ZMQ_ROUTING_ID, rid, rid_len);
    FZ_CHECK(dealer && zmq_connect(dealer, ep) == 0, "connect: %s", zmq_strerror(zmq_errno()));
    size_t esz = sizeof(int); /* the ROUTER reads the peer's id */
    int ev;
    zmq_getsockopt(s->router, ZMQ_EVENTS, &ev, &esz);
    return dealer;
}

/* Reads one reply waiting on a DEALER (fuzz_server, fuzz_repl): its frames in f (at most 4
   kept; *nf counts them all) and its header in *h; 0 when none is waiting. Checks its form: the
   DEALER sees [meta] or [meta][values / text] (the routing id is gone), a reply header with a
   known status <= 0, and an error reply carries its text. The caller closes f[0..min(*nf, 4)). */
static inline int fz_reply_next(void *dealer, zmq_msg_t f[4], int *nf, kvps__hdr *h) {
    int more = 1;
    *nf = 0;
    while (more) {
        zmq_msg_t tmp, *m = *nf < 4 ? &f[*nf] : &tmp;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, dealer, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(m);
            FZ_CHECK(*nf == 0, "a reply ended after %d frames", *nf);
            return 0;
        }
        more = zmq_msg_more(m);
        if (m == &tmp) zmq_msg_close(m);
        (*nf)++;
    }
    FZ_CHECK(*nf == 1 || *nf == 2, "reply of %d frames", *nf);
    FZ_CHECK(zmq_msg_size(&f[0]) == KVPS__HDR, "reply meta of %zu bytes", zmq_msg_size(&f[0]));
    memcpy(h, zmq_msg_data(&f[0]), sizeof *h);
    FZ_CHECK(h->magic == KVPS__MAGIC && h->version == KVPS__VERSION && (h->op & KVPS__OP_REPLY),
             "reply magic 0x%x version %u op 0x%x", h->magic, h->version, h->op);
    FZ_CHECK(h->status <= 0 && strcmp(kvps_result_str((kvps_result)h->status), "unknown kvps_result") != 0,
             "reply status %d", h->status);
    if (h->status < 0)
        FZ_CHECK(*nf == 2 && zmq_msg_size(&f[1]) > 0, "error reply: %d frames, text of %zu bytes", *nf,
                 *nf > 1 ? zmq_msg_size(&f[1]) : 0);
    return 1;
}

/* A user rule every fuzzed server has (rule KVPS_RULE_USER + 0), with 2 state floats per value and
   the step, so that CONFIG records, checkpoints and snapshots naming one reach its code. */
static void fz_user_rule(const kvps_rule_args *a) {
    for (size_t i = 0; i < a->len; i++) {
        a->state[0][i] = 0.5f * a->state[0][i] + a->sum[i] / (float)a->count;
        a->state[1][i] += (float)a->step;
        a->value[i] -= a->opt->lr * a->state[0][i];
    }
}
static const kvps_user_rule fz_user_rules[1] = {{"fuzz", fz_user_rule, 2, NULL}};

#endif

static inline uint32_t fz_get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
#endif
