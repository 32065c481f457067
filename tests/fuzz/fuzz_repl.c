/* fuzz_repl - a backup replica's side of the chain (REPLICAS in kvps.h): every message its
   primary (or anyone who can reach the port) may send it, through kvps__handle, which hands
   REPL messages to kvps__repl_serve: snapshots (the checkpoint's bytes + session state), the
   primary's copies of worker requests (served again through kvps__handle), lost-worker events,
   and worker requests that make it take over. The server starts as replica 1 of a chain of 2,
   holding an empty shard (synced, epoch 1), as after its primary's first snapshot.

   Input: [config byte][message]("\xfe" "MSG"[message])*, frames as in fuzz_common.h, each message
   given as [the peer's routing id][frames] with at most 5 frames kept (kvps_server_run's
   receive). Config byte: bits 0-1 consistency, bit 2 three workers (else one).

   Properties: no crash, leak or hang; the acknowledgement the serving loop sends after a batch
   (kvps__repl_ack) goes out; every message the server sends back is a well-formed reply (magic,
   the reply bit, a known status <= 0, at most [meta][text or values]). */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/fuzz/fuzz_common.h"

static void *fz_ctx;
static int fz_seq;

/* Every reply waiting: each checked for its form (fz_reply_next). */
static void fz_read_replies(void *dealer) {
    zmq_msg_t f[4];
    int nf;
    kvps__hdr h;
    while (fz_reply_next(dealer, f, &nf, &h))
        for (int i = 0; i < nf && i < 4; i++) zmq_msg_close(&f[i]);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    fz_ctx = zmq_ctx_new();
    kvps_log_set_fn(fz_nolog, NULL);
    kvps_log_set_level(KVPS_LOG_DEBUG);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t cfg = data[0];
    char a[64], b[64], chain[140];
    snprintf(a, sizeof a, "inproc://fz-repl-a-%d", fz_seq);
    snprintf(b, sizeof b, "inproc://fz-repl-b-%d", fz_seq++);
    snprintf(chain, sizeof chain, "%s|%s", a, b);
    kvps_server_desc d = {.endpoint = b, .num_workers = (cfg & 4) ? 3 : 1, .consistency = (kvps_consistency)(cfg & 3),
                          .update = KVPS_UPDATE_ACCUMULATE, .max_value_len = 64, .zmq_ctx = fz_ctx, .no_malloc_tuning = 1,
                          .staleness = 1, .user_rules = fz_user_rules, .num_user_rules = 1};
    d.replicas = chain;
    d.replica = 1;
    kvps_server *s = NULL;
    FZ_CHECK(kvps_server_create(&d, &s) == KVPS_OK, "server create");
    s->synced = 1; /* as after the primary's first snapshot (of an empty shard) */
    s->epoch = 1;
    static const char rid[] = "kvpsrepl\0\0\0";
    void *dealer = fz_peer(fz_ctx, s, b, rid, sizeof rid - 1);

    fz_cut msgs = {data + 1, size - 1, 0};
    const uint8_t *mp;
    size_t mn;
    while (fz_next(&msgs, FZ_MSG, &mp, &mn)) {
        zmq_msg_t fr[5];
        int n = 1, total = 1;
        zmq_msg_init_size(&fr[0], sizeof rid - 1);
        memcpy(zmq_msg_data(&fr[0]), rid, sizeof rid - 1);
        fz_cut frames = {mp, mn, 0};
        const uint8_t *fp;
        size_t fn;
        while (mn && fz_next(&frames, FZ_FRM, &fp, &fn)) {
            total++;
            if (n < 5) {
                zmq_msg_init_size(&fr[n], fn);
                if (fn) memcpy(zmq_msg_data(&fr[n]), fp, fn);
                n++;
            }
        }
        kvps__handle(s, fr, total);
        for (int j = 0; j < n; j++) zmq_msg_close(&fr[j]);
        kvps__flush_all(s);
        if (s->ack_now) kvps__repl_ack(s);
        if (s->role == KVPS__ROLE_PRIMARY) kvps__repl_release(s);
        fz_read_replies(dealer);
    }
    fz_read_replies(dealer);
    zmq_close(dealer);
    kvps_server_destroy(&s);
    if (fz_seq % 64 == 0) { /* see fuzz_server.c: let the reaper catch up */
        zmq_ctx_term(fz_ctx);
        fz_ctx = zmq_ctx_new();
    }
    return 0;
}
