/* fuzz_reply - the worker's side of the wire: replies from a broken or hostile server, through
   kvps__on_reply, the function kvps__progress calls for each message a server socket delivers
   (with the frames kept as kvps__recv_msg keeps them: at most 2), for a request of each shape
   in flight: raw pull, raw push, coded tensor pull, row pull with repeated ids, barrier, and a
   coded pushpull of a tensor.

   Input: [kind byte][server bits][message]("\xfe" "MSG"[message])*, frames as in
   fuzz_common.h. (kind & 0x3f) % 6 picks the request; bit 7 of kind: write the request's id into each
   reply header (else the fuzzer's own req_id stands, which finds stale / foreign ids); bit 6:
   the first message is server 0's answer to the worker's hello (its id written in), before the
   request is made: a placement the worker may take (RESHARD), or not one; bit j of the server
   bits: message j comes from server 1 (else server 0).

   Properties: no crash, leak or hang (destinations are exact-size allocations, so a write past
   a key, row or slice is caught); a request completes only when every server it went to has
   answered once; a completed request is OK only if each of those answers was a well-formed
   success (a STATUS answer naming the request is not one of its answers, nor a READ's
   KVPS_ERR_NOT_PRIMARY); a request with an answer KVPS_ERR_PEER_LOST (a lost worker) stays valid, and a wait
   on it re-sends those parts. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/fuzz/fuzz_common.h"

static void *fz_ctx, *fz_srv[2];
static int fz_seq;

/* Two bound ROUTERs stand for the servers, so that the worker's requests have somewhere to go
   (a connect to an inproc endpoint nobody binds keeps its socket alive until the context ends). */
static void fz_up(void) {
    fz_ctx = zmq_ctx_new();
    for (int i = 0; i < 2; i++) {
        char ep[32];
        snprintf(ep, sizeof ep, "inproc://fz-reply-%d", i);
        fz_srv[i] = zmq_socket(fz_ctx, ZMQ_ROUTER);
        int zero = 0;
        zmq_setsockopt(fz_srv[i], ZMQ_LINGER, &zero, sizeof zero);
        FZ_CHECK(zmq_bind(fz_srv[i], ep) == 0, "bind %s", ep);
    }
}

static void fz_drain(void) {
    for (int i = 0; i < 2; i++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        while (zmq_msg_recv(&m, fz_srv[i], ZMQ_DONTWAIT) >= 0) {}
        zmq_msg_close(&m);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    fz_up();
    kvps_log_set_fn(fz_nolog, NULL);
    kvps_log_set_level(KVPS_LOG_DEBUG);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    uint8_t kind = data[0], srvbits = data[1];
    kvps_worker *w = NULL;
    kvps_result rc = kvps_worker_create(&(kvps_worker_desc){.servers = "inproc://fz-reply-0,inproc://fz-reply-1",
                                                            .rank = 1, .num_workers = 2, .min_slice = 16,
                                                            .zmq_ctx = fz_ctx, .no_malloc_tuning = 1},
                                        &w);
    FZ_CHECK(rc == KVPS_OK, "worker: %s (%s)", kvps_result_str(rc), zmq_strerror(zmq_errno()));
    fz_cut msgs = {data + 2, size - 2, 0};
    const uint8_t *mp;
    size_t mn;
    int first = 0;
    if ((kind & 0x40) && fz_next(&msgs, FZ_MSG, &mp, &mn)) { /* the hello's answer, as the first keyed call waits for */
        zmq_msg_t fr[2];
        int n = 0;
        fz_cut frames = {mp, mn, 0};
        const uint8_t *fp;
        size_t fn;
        while (fz_next(&frames, FZ_FRM, &fp, &fn)) {
            if (n == 2) continue;
            zmq_msg_init_size(&fr[n], fn);
            if (fn) memcpy(zmq_msg_data(&fr[n]), fp, fn);
            n++;
        }
        kvps__hdr h;
        for (uint32_t i = 0; n && zmq_msg_size(&fr[0]) >= sizeof h && i < w->nslots; i++)
            if (w->slots[i] && w->slots[i]->ctl == KVPS__OP_HELLO) {
                memcpy(&h, zmq_msg_data(&fr[0]), sizeof h);
                h.req_id = w->slots[i]->id;
                memcpy(zmq_msg_data(&fr[0]), &h, sizeof h);
                break;
            }
        kvps__on_reply(w, 0, fr, n);
        for (int i = 0; i < n; i++) zmq_msg_close(&fr[i]);
        first = 1;
    }
    w->place_fixed = 1; /* (no server here answers hellos: the first keyed call does not wait for one) */
    if (w->fatal) { /* the hello's answer was refused, or a placement not to be taken: nothing to request */
        FZ_CHECK(w->place.count >= 1 && w->V == 256 * w->place.n[0], "a refused placement was half taken");
        fz_drain();
        kvps_worker_destroy(&w);
        return 0;
    }
    kvps_req q = 0;
    float *dst = NULL, *src = NULL;
    size_t ndst = 0;
    uint64_t keys[3] = {1, 2, 3};
    size_t lens[3] = {3, 1, 2};
    kvps_tensor t;
    kvps_codec fp16 = kvps_codec_get(KVPS_CODEC_FP16), topk = kvps_codec_get(KVPS_CODEC_TOPK);
    switch ((kind & 0x3f) % 6) {
    case 0: /* raw pull: 6 floats over the two servers */
        ndst = 6;
        dst = (float *)malloc(ndst * sizeof(float));
        rc = kvps_worker_pull(w, keys, dst, lens, 3, &q);
        break;
    case 1: /* raw push */
        src = (float *)calloc(6, sizeof(float));
        rc = kvps_worker_push(w, keys, src, lens, 3, &q);
        break;
    case 2: /* tensor of 40 in 2 slices, pulled fp16-coded */
        ndst = 40;
        dst = (float *)malloc(ndst * sizeof(float));
        rc = kvps_worker_tensor(w, "fz.t", 40, &t);
        if (rc == KVPS_OK) rc = kvps_worker_tensor_codec(w, t, NULL, &fp16, 0);
        if (rc == KVPS_OK) rc = kvps_worker_pull_tensor(w, t, dst, &q);
        break;
    case 3: { /* rows of dim 4, ids repeated: the copies are made when every reply is in */
        kvps_table tb;
        kvps_req tq;
        rc = kvps_worker_table(w, &(kvps_table_desc){.name = "fz.rows", .dim = 4}, &tb, &tq);
        uint64_t ids[5] = {7, 9, 7, 1u << 20, 9};
        ndst = 5 * 4;
        dst = (float *)malloc(ndst * sizeof(float));
        if (rc == KVPS_OK) rc = kvps_worker_pull_rows(w, tb, ids, dst, 5, &q);
        break;
    }
    case 4:
        rc = kvps_worker_barrier(w, &q);
        break;
    case 5: /* coded both ways: top-k push with error feedback, fp16 pull */
        ndst = 40;
        dst = (float *)malloc(ndst * sizeof(float));
        src = (float *)calloc(40, sizeof(float));
        for (int i = 0; i < 40; i++) src[i] = (float)(i % 5);
        topk.topk_count = 3;
        rc = kvps_worker_tensor(w, "fz.t", 40, &t);
        if (rc == KVPS_OK) rc = kvps_worker_tensor_codec(w, t, &topk, &fp16, 1);
        if (rc == KVPS_OK) rc = kvps_worker_pushpull_tensor(w, t, src, dst, &q);
        break;
    }
    FZ_CHECK(rc == KVPS_OK, "request kind %d: %s", (kind & 0x3f) % 6, kvps_result_str(rc));
    for (size_t i = 0; i < ndst; i++) dst[i] = -1.0f;
    kvps__req *rq = kvps__req_get(w, q);
    FZ_CHECK(rq != NULL, "no request");
    int sent = rq->sent, answered[2] = {0, 0}, bad = 0, lost = 0;

    for (int j = first; fz_next(&msgs, FZ_MSG, &mp, &mn); j++) {
        int srv = j < 8 ? (srvbits >> j) & 1 : 0;
        zmq_msg_t fr[2];
        int n = 0;
        fz_cut frames = {mp, mn, 0};
        const uint8_t *fp;
        size_t fn;
        while (fz_next(&frames, FZ_FRM, &fp, &fn)) {
            if (n == 2) continue; /* as kvps__recv_msg with room for 2: the rest are dropped */
            zmq_msg_init_size(&fr[n], fn);
            if (fn) memcpy(zmq_msg_data(&fr[n]), fp, fn);
            n++;
        }
        kvps__hdr h;
        int hdr = zmq_msg_size(&fr[0]) >= sizeof h;
        if (hdr && (kind & 0x80)) { /* aim it at the request in flight */
            memcpy(&h, zmq_msg_data(&fr[0]), sizeof h);
            h.req_id = q;
            memcpy(zmq_msg_data(&fr[0]), &h, sizeof h);
        }
        if (hdr) memcpy(&h, zmq_msg_data(&fr[0]), sizeof h);
        /* what the worker should make of it: counts toward the request only if it is for it */
        kvps__req *cur = kvps__req_get(w, q);
        /* a STATUS answer names a request but is not its reply: it only says what it waits for */
        int status_answer = hdr && h.magic == KVPS__MAGIC && h.op == (KVPS__OP_STATUS | KVPS__OP_REPLY);
        /* nor is a read replica's "cannot tell" (READ, KVPS_ERR_NOT_PRIMARY): that part goes to the primary */
        status_answer |= hdr && h.magic == KVPS__MAGIC && h.op == (KVPS__OP_READ | KVPS__OP_REPLY) &&
                         h.status == KVPS_ERR_NOT_PRIMARY;
        if (cur && hdr && h.magic == KVPS__MAGIC && h.req_id == q && cur->state[srv] == 1 && !status_answer) {
            answered[srv]++;
            bad |= h.status != 0 || n < 1;
            lost |= h.status == KVPS_ERR_PEER_LOST;
        }
        if (getenv("FZ_VERBOSE"))
            fprintf(stderr, "  message %d to server %d: %d frames, header %d, req_id %s, state %d\n", j, srv, n, hdr,
                    hdr && h.req_id == q ? "ours" : "other", cur ? cur->state[srv] : -1);
        kvps__on_reply(w, srv, fr, n);
        for (int i = 0; i < n; i++) zmq_msg_close(&fr[i]);
    }
    int done = 0;
    rc = kvps_worker_test(w, q, &done);
    if (getenv("FZ_VERBOSE"))
        fprintf(stderr, "kind %d: %d of %d answers, done %d: %s\n", (kind & 0x3f) % 6, answered[0] + answered[1], sent, done,
                kvps_result_str(rc));
    int expect_done = 0;
    for (int s = 0; s < 2; s++) expect_done += answered[s];
    if (!lost || expect_done != sent)
        FZ_CHECK(done == (expect_done == sent), "request kind %d: done %d after %d of %d answers", (kind & 0x3f) % 6, done,
                 expect_done, sent);
    else /* a server said a worker is lost: the request stays valid, unless another part failed for good */
        FZ_CHECK((!done && rc == KVPS_ERR_PEER_LOST) || (done && rc != KVPS_OK),
                 "request kind %d: done %d, %s after a PEER_LOST answer", (kind & 0x3f) % 6, done, kvps_result_str(rc));
    if (done && bad) FZ_CHECK(rc != KVPS_OK, "request kind %d: OK after an error reply", (kind & 0x3f) % 6);
    if (!done && rc == KVPS_ERR_PEER_LOST) { /* waiting again re-sends the parts answered so */
        rc = kvps_worker_wait(w, q, 0);
        rq = kvps__req_get(w, q);
        FZ_CHECK(rc == KVPS_ERR_TIMEOUT && rq && rq->lost == 0 && rq->pending > 0, "request kind %d: a wait after PEER_LOST: %s",
                 (kind & 0x3f) % 6, kvps_result_str(rc));
    }
    fz_drain(); /* before the worker goes: nothing left in flight for ZeroMQ to drop behind our back */
#ifdef FZ_AVOID_KNOWN
    /* reported: kvps_worker_destroy leaks the frames kept for re-sending of requests in flight */
    for (uint32_t i = 0; i < w->nslots; i++)
        for (int s = 0; w->slots[i] && s < w->n; s++) kvps__req_drop_kept(w->slots[i], s);
#endif
    kvps_worker_finish(w, 0); /* no goodbye waited for: the fake servers do not answer */
    kvps_worker_destroy(&w);
    free(dst);
    free(src);
    if (++fz_seq % 64 == 0) { /* see fuzz_server.c: let the reaper catch up */
        for (int i = 0; i < 2; i++) zmq_close(fz_srv[i]);
        zmq_ctx_term(fz_ctx);
        fz_up();
    }
    return 0;
}
