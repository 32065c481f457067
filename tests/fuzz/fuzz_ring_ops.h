/* fuzz_ring_ops.h - the collectives fuzz_ring drives on rank 0 of a 2-rank ring, shared with
   gen_corpus (which runs the same call on a real rank 1 and records what it sends, as seeds).
   Include after kvps_ring.h. */
#ifndef KVPS_FUZZ_RING_OPS_H
#define KVPS_FUZZ_RING_OPS_H

enum { FZ_RING_OPS = 14 };

/* Runs collective `which` with `count` elements per rank on r (rank `rank` of 2), on buffers it
   owns; returns the call's result. */
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
    }
    free(a);
    free(b);
    return rc;
}
#endif
