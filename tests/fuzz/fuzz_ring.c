/* fuzz_ring - kvps_ring.h's receive path: what rank 0 of a 2-rank ring does with whatever
   arrives claiming to be from rank 1 (headers checked, pieces stashed, mismatches and aborts
   told apart, 16-bit wire data widened, top-k (index, value) pairs gathered), for each kind of
   collective, and point-to-point messages (data eager and answered, ACK, NACK, abort: kept,
   matched by rank and tag, refusals reported; fuzz_ring_ops.h 14..17), the v-collectives' counts
   (18, 19), messages for sub-rings (20: sub-ring 1 made directly, 21: by kvps_ring_split) and a
   joined rank 0 (22: the agreements of a ring made with .join, kvps_ring_join). The input's messages are queued on rank 0's socket from a
   DEALER, then rank 0 runs the collective with a 2 ms timeout (then a barrier, when the first
   call succeeded, so that late and early pieces of the next collective are looked at too).

   Input: [op byte][count byte][message]("\xfe" "MSG"[message])*, frames as in fuzz_common.h
   (a ring message is [40-byte header][payload]). Seeds are what a real rank 1 sends
   (gen_corpus).

   Rank 1's hello (kvps_ring.h, >>transport) is sent first, from another host; the input's
   messages may carry transport messages too (coll 0x51: a hello, NOSHM).

   Properties: no crash, leak or hang; every call returns within its timeout with a known result;
   a ring that failed refuses further calls (KVPS_ERR_STATE). */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "kvps_ring.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_ring_ops.h"

static void *fz_ctx;
static int fz_seq;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    fz_ctx = zmq_ctx_new();
    kvps_log_set_fn(fz_nolog, NULL);
    kvps_log_set_level(KVPS_LOG_DEBUG);
    return 0;
}

static int fz_known(kvps_result r) { return strcmp(kvps_result_str(r), "unknown kvps_result") != 0; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int which = data[0] % FZ_RING_OPS;
    size_t count = data[1];
    char ep0[64], peers[160];
    int id = fz_seq++;
    snprintf(ep0, sizeof ep0, "inproc://fz-ring-%d-0", id);
    /* rank 1's endpoint: a ROUTER that takes rank 0's pieces and is never read (a connect to an
       inproc endpoint nobody binds would keep the socket until the context ends) */
    snprintf(peers, sizeof peers, "%s,inproc://fz-ring-%d-1", ep0, id);
    void *sink = zmq_socket(fz_ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(sink, ZMQ_LINGER, &zero, sizeof zero);
    FZ_CHECK(zmq_bind(sink, strchr(peers, ',') + 1) == 0, "bind sink");
    kvps_ring *r = NULL;
    kvps_result rc = kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 2, .peers = peers, .timeout_ms = 2,
                                                        .chunk_bytes = 64, .zmq_ctx = fz_ctx, .shm = -1,
                                                        .join = which == FZ_RING_JOIN},
                                      &r);
    FZ_CHECK(rc == KVPS_OK, "ring: %s", kvps_result_str(rc));
    void *peer = zmq_socket(fz_ctx, ZMQ_DEALER);
    zmq_setsockopt(peer, ZMQ_LINGER, &zero, sizeof zero);
    FZ_CHECK(zmq_connect(peer, ep0) == 0, "connect");

    /* rank 1's hello first, as a real rank 1 sends it when it connects (from another host: ZeroMQ
       carries everything); a rank sends nothing to a peer and runs no collective before it */
    kvps_ring__hdr hh;
    kvps_ring__hello hl;
    memset(&hh, 0, sizeof hh);
    memset(&hl, 0, sizeof hl);
    hh.magic = KVPS_RING__MAGIC;
    hh.coll = KVPS_RING__XPORT;
    hh.op = KVPS_RING__X_HELLO;
    hh.src = 1;
    hl.version = 1;
    hl.size = 2;
    hl.pid = 1;
    snprintf(hl.host, sizeof hl.host, "fuzz-peer");
    zmq_send(peer, &hh, sizeof hh, ZMQ_DONTWAIT | ZMQ_SNDMORE);
    zmq_send(peer, &hl, sizeof hl, ZMQ_DONTWAIT);
    fz_cut msgs = {data + 2, size - 2, 0};
    const uint8_t *mp;
    size_t mn;
    while (fz_next(&msgs, FZ_MSG, &mp, &mn)) {
        fz_cut frames = {mp, mn, 0};
        const uint8_t *fp;
        size_t fn;
        int more = fz_next(&frames, FZ_FRM, &fp, &fn);
        while (more) {
            const uint8_t *np;
            size_t nn;
            int next = fz_next(&frames, FZ_FRM, &np, &nn);
            zmq_send(peer, fp, fn, ZMQ_DONTWAIT | (next ? ZMQ_SNDMORE : 0));
            fp = np;
            fn = nn;
            more = next;
        }
    }
    rc = fz_ring_op(r, 0, which, count);
    FZ_CHECK(fz_known(rc), "collective %d: result %d", which, rc);
    if (getenv("FZ_VERBOSE")) fprintf(stderr, "collective %d of %zu: %s (%s)\n", which, count, kvps_result_str(rc), kvps_ring_last_error(r));
    kvps_result rc2 = fz_ring_op(r, 0, 10, 0);
#ifdef FZ_AVOID_KNOWN
    /* reported: a bad index in the top-k gather fails the call but leaves the ring usable */
    if (which == 3 && rc == KVPS_ERR_MALFORMED) rc2 = KVPS_ERR_STATE;
#endif
    /* (a failure on a sub-ring breaks the sub-ring, fz_ring_op checks that; the parent may go on) */
    FZ_CHECK(rc == KVPS_OK || rc2 == KVPS_ERR_STATE || which == 20 || which == 21, "collective %d failed (%s), then the barrier said %s", which,
             kvps_result_str(rc), kvps_result_str(rc2));
    FZ_CHECK(fz_known(rc2), "barrier: result %d", rc2);
    zmq_close(peer);
    kvps_ring_destroy(&r);
    zmq_close(sink);
    if (fz_seq % 64 == 0) { /* see fuzz_server.c: let the reaper catch up */
        zmq_ctx_term(fz_ctx);
        fz_ctx = zmq_ctx_new();
    }
    return 0;
}
