/* fuzz_ring_ops.h - the collectives fuzz_ring drives on rank 0 of a 2-rank ring, shared with
   gen_corpus (which runs the same call on a real rank 1 and records what it sends, as seeds).
   Include after kvps_ring.h. */
#ifndef KVPS_FUZZ_RING_OPS_H
#define KVPS_FUZZ_RING_OPS_H

enum { FZ_RING_OPS = 23 }; /* 14..17: point-to-point, rank 1 sending to rank 0; 18, 19: v-collectives;
                              20, 21: a sub-ring (made directly with id 1; made by kvps_ring_split);
                              22: join (on a ring made with .join: FZ_RING_JOIN) */
#define FZ_RING_JOIN 22

/* A sub-ring's failure must break it (a barrier on it then says KVPS_ERR_STATE); its parent,
   which the outer check looks at, may go on. This result says it did not. */
#define FZ_SUB_NOT_BROKEN ((kvps_result)-99999)

/* The 2-rank sub-ring with id 1 that both sides make without a split (the split's own
   messages are op 21's): the receive path of messages for a sub-ring. */
static inline kvps_ring *fz_sub(kvps_ring *r, int rank) {
    static const int members[2] = {0, 1};
    kvps_ring *s = NULL;
    kvps_ring__hold(r->fam);
    if (kvps_ring__sub_new(r, members, 2, rank, 1, 0, &s) == KVPS_OK) {
        r->fam->max_ring = 1;
        r->fam->next_ring = 2;
    }
    kvps_ring__release(r->fam);
    return s;
}

static inline kvps_result fz_sub_end(kvps_ring *s, kvps_result rc) {
    if (rc != KVPS_OK && kvps_ring_barrier(s) != KVPS_ERR_STATE) rc = FZ_SUB_NOT_BROKEN;
    kvps_ring_destroy(&s);
    return rc;
}

/* Runs collective (or p2p exchange) `which` with `count` elements per rank on r (rank `rank` of
   2), on buffers it owns; returns the call's result (the first failure). */
static inline kvps_result fz_ring_op(kvps_ring *r, int rank, int which, size_t count) {
    size_t n2 = 2 * count + 1; /* room for the largest per-call layout (count * size) */
    double *a = (double *)calloc(n2, sizeof(double)), *b = (double *)calloc(n2, sizeof(double));
    for (size_t i = 0; i < n2; i++) { a[i] = (double)(i % 5) + rank; }
    float *fa = (float *)a, *fb = (float *)b;
    for (size_t i = 0; i < n2; i++) { fa[i] = (float)(i % 7) - 3.0f + (float)rank; }
    kvps_result rc = KVPS_ERR_INVALID_ARG;
    kvps_ring_op op;
    memset(&op, 0, sizeof op);
    op.send = a;
    op.recv = b;
    op.count = count;
    switch (which % FZ_RING_OPS) {
    case 0: rc = kvps_ring_allreduce(r, fa, fb, count, KVPS_FLOAT32, KVPS_SUM); break;
    case 1: rc = kvps_ring_allreduce_wire(r, fa, fb, count, KVPS_SUM, KVPS_FLOAT16); break;
    case 2: rc = kvps_ring_allreduce_wire(r, fa, fb, count, KVPS_SUM, KVPS_BFLOAT16); break;
    case 3: rc = kvps_ring_allreduce_topk(r, fa, count, count < 3 ? count : 3, fb); break;
    case 4: rc = kvps_ring_allgather(r, fa, fb, count, KVPS_INT32); break;
    case 5: rc = kvps_ring_broadcast(r, fa, fb, count, KVPS_FLOAT32, 1); break;
    case 6: rc = kvps_ring_reduce_scatter(r, a, b, count, KVPS_FLOAT64, KVPS_MAX); break;
    case 7: rc = kvps_ring_alltoall(r, a, b, count, KVPS_INT64); break;
    case 8: rc = kvps_ring_gather(r, fa, fb, count, KVPS_FLOAT32, 0); break;
    case 9: rc = kvps_ring_scatter(r, fa, fb, count, KVPS_FLOAT32, 1); break;
    case 10: rc = kvps_ring_barrier(r); break;
    case 11: rc = kvps_ring_allreduce(r, fa, fb, count, KVPS_FLOAT16, KVPS_PROD); break;
    case 12: /* the pipelined ring with small pieces: many tags */
        op.coll = KVPS_COLL_ALLREDUCE; op.dtype = KVPS_FLOAT32; op.op = KVPS_AVG; op.algo = KVPS_ALGO_RING;
        rc = kvps_ring_run(r, &op);
        break;
    case 13:
        op.coll = KVPS_COLL_REDUCE; op.dtype = KVPS_INT32; op.op = KVPS_MIN; op.root = 0; op.algo = KVPS_ALGO_RING;
        rc = kvps_ring_run(r, &op);
        break;
    case 14: /* a blocking receive of float32 on tag 7 */
        rc = rank ? kvps_ring_send(r, fa, count, KVPS_FLOAT32, 0, 7) : kvps_ring_recv(r, fb, count, KVPS_FLOAT32, 1, 7);
        break;
    case 15: { /* int64 on tags 1 and 2: sent 2 then 1, a posted receive of 1, a blocking one of 2 */
        kvps_ring_req q1, q2;
        if (rank) {
            rc = kvps_ring_isend(r, a, count, KVPS_INT64, 0, 2, &q2);
            if (rc == KVPS_OK) rc = kvps_ring_isend(r, b, count, KVPS_INT64, 0, 1, &q1);
            if (rc == KVPS_OK) rc = kvps_ring_wait(r, q2, -1);
            if (rc == KVPS_OK) rc = kvps_ring_wait(r, q1, -1);
        } else {
            rc = kvps_ring_irecv(r, a, count, KVPS_INT64, 1, 1, &q1);
            if (rc == KVPS_OK) rc = kvps_ring_recv(r, b, count, KVPS_INT64, 1, 2);
            if (rc == KVPS_OK) rc = kvps_ring_wait(r, q1, -1);
        }
        break;
    }
    case 16: { /* a send that wants an answer (over the eager limit, made 0 here): ACK to it */
        size_t eager = r->p2p_eager;
        r->p2p_eager = 0;
        rc = rank ? kvps_ring_send(r, a, count, KVPS_FLOAT64, 0, 3) : kvps_ring_recv(r, b, count, KVPS_FLOAT64, 1, 3);
        r->p2p_eager = eager;
        break;
    }
    case 18: { /* allgatherv of float32, rank 1's block one longer */
        size_t c[2] = {count / 2, count / 2 + 1};
        rc = kvps_ring_allgatherv(r, fa, fb, c, NULL, KVPS_FLOAT32);
        break;
    }
    case 19: { /* alltoallv of int32: rank i sends (count + i + 2 j) / 2 to rank j */
        size_t sc[2], rcv[2];
        for (int j = 0; j < 2; j++) { sc[j] = (count + (size_t)rank + 2 * (size_t)j) / 2; rcv[j] = (count + (size_t)j + 2 * (size_t)rank) / 2; }
        rc = kvps_ring_alltoallv(r, fa, sc, NULL, fb, rcv, NULL, KVPS_INT32);
        break;
    }
    case 20: { /* on sub-ring 1: an allgatherv, then a receive from rank 1 */
        kvps_ring *s = fz_sub(r, rank);
        size_t c[2] = {count / 2 + 1, count / 2};
        rc = s ? kvps_ring_allgatherv(s, fa, fb, c, NULL, KVPS_FLOAT32) : KVPS_ERR_NOMEM;
        if (rc == KVPS_OK) rc = rank ? kvps_ring_send(s, fa, count, KVPS_FLOAT32, 0, 4) : kvps_ring_recv(s, fb, count, KVPS_FLOAT32, 1, 4);
        if (s) rc = fz_sub_end(s, rc);
        break;
    }
    case 22: /* rank 0 has joined: what it learns from the agreement (its parameters checked), then
                rank 1's all-reduce shadowed */
        rc = rank ? kvps_ring_allreduce(r, fa, fb, count, KVPS_FLOAT32, KVPS_AVG) : kvps_ring_join(r);
        break;
    case 21: { /* a split (both colour 0), then an all-reduce on the sub-ring */
        kvps_ring *s = NULL;
        rc = kvps_ring_split(r, 0, rank, &s);
        if (rc == KVPS_OK && s) rc = fz_sub_end(s, kvps_ring_allreduce(s, fa, fb, count, KVPS_FLOAT32, KVPS_SUM));
        else kvps_ring_destroy(&s);
        break;
    }
    case 17: /* rank 0's eager send refused (NACK), then an answer (ACK) and an abort: its next call */
        if (rank) {
            kvps_ring__hdr h = kvps_ring__p2p_hdr(r, KVPS_RING__P2P_NACK, 1, 9, KVPS_FLOAT32, count + 1);
            kvps_ring__hdr sent = kvps_ring__p2p_hdr(r, KVPS_RING__P2P_EAGER, 1, 9, KVPS_FLOAT32, count);
            sent.src = 0;
            zmq_msg_t m;
            if (kvps__msg_from_buf(&m, &sent, sizeof sent) == 0) kvps_ring__p2p_post(r, 0, &h, &m);
            h = kvps_ring__p2p_hdr(r, KVPS_RING__P2P_ACK, 2, 9, KVPS_FLOAT32, count);
            zmq_msg_init(&m);
            kvps_ring__p2p_post(r, 0, &h, &m);
            h = kvps_ring__p2p_hdr(r, KVPS_RING__P2P_ABORT, 0, 0, 0, (uint64_t)(int64_t)KVPS_ERR_MISMATCH);
            if (kvps__msg_from_buf(&m, "rank 1: recv from rank 0 tag 9", 30) == 0) kvps_ring__p2p_post(r, 0, &h, &m);
            rc = KVPS_OK;
        } else {
            rc = kvps_ring_send(r, fa, count, KVPS_FLOAT32, 1, 9);
            if (rc == KVPS_OK) rc = kvps_ring_recv(r, fb, count, KVPS_FLOAT32, 1, 9);
        }
        break;
    }
    free(a);
    free(b);
    return rc;
}
#endif
