/* kvps_fuse.h - v0.1 - tensor fusion for kvps_ring: many buffers all-reduced as one - MIT licence

   Do this:
       #define KVPS_IMPLEMENTATION
   before you include this file (it includes kvps_ring.h and kvps.h) in *one* C or C++ file.

   CONTENTS
     1. Step by step
     2. What it does, and why
     3. Errors, ownership, threads

   1. STEP BY STEP
       // every rank, the same buffers in the same order (here: a model's gradients)
       kvps_result rc = kvps_ring_allreduce_many(ring, bufs, counts, 161, KVPS_FLOAT32, KVPS_AVG, 0);
   Or, to overlap the all-reduces with the backward pass (as PyTorch's DDP buckets and Horovod's
   tensor fusion do), hand each gradient over as soon as it is computed:
       kvps_fuse *f = NULL;
       kvps_fuse_create(ring, &(kvps_fuse_desc){.dtype = KVPS_FLOAT32, .op = KVPS_AVG}, &f);
       for (int l = nlayers - 1; l >= 0; l--) {       // backward, last layer first
           backward(l);
           kvps_fuse_add(f, grad[l], count[l]);        // packed; a full bucket goes out at once
       }
       rc = kvps_fuse_flush(f);                        // the last bucket, then every result home
       ...                                             // next step: add, add, ..., flush again
       kvps_fuse_destroy(&f);

   2. WHAT IT DOES, AND WHY
   A model has many small tensors (ResNet-50: 161, most under 1 MB) and each all-reduce of a
   small buffer costs a few round trips whatever its size, so one by one they are slow.
   kvps_ring_allreduce_many makes the whole list one all-reduce: where the ring runs RING on the
   total (past .small_bytes, and past 16 MiB with 4, 8, ... ranks; kvps_ring.h, 3.), the
   pipelined ring runs over the buffers taken as one, reducing into and copying out to the
   buffers where they are (kvps_ring.h, >>list): no bucket, no copy in or out, one collective.
   Pieces are cut at the buffers' edges and sent from where they lie; runs under 32 KiB (batch
   norms) are packed together into one message. Where the ring would run another algorithm (RD
   for a small list, RHD up to 16 MiB, HIER), the list is packed into the ring's work buffer for
   it (at most 16 MiB); a larger list on such a ring goes through buckets, as kvps_fuse_add does.
   Measured (bench/bench_fusion.c, ResNet-50's 161 tensors, 4 ranks on this project's 2 vCPUs,
   BENCHMARKS.md, tensor fusion; alternated runs): 4 MiB buckets took 145.7-159.4 ms a step, the
   list 137.6-147.5, level with one all-reduce of the concatenated model.
   kvps_fuse_add / kvps_fuse_flush, which hand buffers over one at a time (to overlap with the
   backward pass), use buckets: added buffers are copied into a bucket of .threshold_bytes
   (default 4 MiB; Horovod's HOROVOD_FUSION_THRESHOLD, 64 MiB, plays the same part) in the order
   added; a full bucket is all-reduced in place on the ring's background thread
   (kvps_ring_post) while the next one fills, and its results are copied back into the buffers
   when a later bucket needs its place or at kvps_fuse_flush. A buffer of .direct_bytes or more
   (default threshold / 4) is not copied: it is all-reduced where it is, in its turn. The
   defaults were measured (the same bench, thresholds alternated, two runs): 1, 4 and 16 MiB
   buckets took 179-209 ms a step, 64 MiB 340-367 ms: past a few MiB the copies in and out of a
   bucket cost more than the round trips they save. Two buckets are kept (.buckets, at most 8):
   memory is buckets x threshold.
   Every rank must pass (or add) the same buffers (counts) in the same order with the same dtype
   and op. kvps_ring_allreduce_many puts a hash of the list's non-zero counts in every message
   (kvps_ring.h, 4.), so a rank whose list differs, even with the same total, gets
   KVPS_ERR_MISMATCH and the others an error; through kvps_fuse_add the buckets are then the
   same collectives everywhere, and a rank that differs gets the ring's KVPS_ERR_MISMATCH (a
   bucket of another count). The reductions are the ring's (kvps_ring.h, 2. and 3.). Integer
   results, and min and max, are exactly those of all-reducing each buffer alone; float sums may
   differ in the last bits, as the ring adds the ranks' values in an order that depends on the
   algorithm (chosen by size) and on the element's place in the list.

   3. ERRORS, OWNERSHIP, THREADS
   kvps_ring_allreduce_many returns KVPS_ERR_INVALID_ARG at once for bad arguments (a NULL buffer
   with a count > 0, no such dtype or op, over 2^40 bytes), with the reason in
   kvps_ring_last_error, and leaves the ring as it was; its other errors are the ring's (a dead
   peer, a mismatch), after which the ring is broken. kvps_fuse_add returns an error at once for
   bad arguments (NULL buffer with count > 0, count too large) and when an earlier bucket has failed; the all-reduce's own errors (a dead peer, a
   mismatch) come from the add that had to wait for it or from kvps_fuse_flush, with the ring's
   text in kvps_fuse_last_error. After an error the ring is broken (kvps_ring.h, 5.): destroy
   both. Buffers handed to kvps_fuse_add are borrowed until the kvps_fuse_flush that follows
   returns: do not touch them in between. A kvps_fuse is used by one thread at a time, and
   while it holds buckets out (between an add and the flush) the ring must not be used for
   anything else from another thread. kvps_fuse_destroy without a flush waits for what is out.
*/
#include "kvps_core.h" /* (first: its table of implementation switches) */
#ifndef KVPS_FUSE_H
#define KVPS_FUSE_H
#include "kvps_ring.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Zero means default.
   | threshold_bytes | 4 MiB: a bucket's size                                    |
   | direct_bytes    | threshold / 4: buffers this large are all-reduced in place |
   | buckets         | 2: buckets out at once (1..8)                             | */
typedef struct kvps_fuse_desc {
    kvps_dtype dtype;
    kvps_redop op;
    size_t threshold_bytes;
    size_t direct_bytes;
    int buckets;
} kvps_fuse_desc;

typedef struct kvps_fuse kvps_fuse;

KVPS_API kvps_result kvps_fuse_create(kvps_ring *r, const kvps_fuse_desc *desc, kvps_fuse **out);
KVPS_API kvps_result kvps_fuse_add(kvps_fuse *f, void *buf, size_t count);
KVPS_API kvps_result kvps_fuse_flush(kvps_fuse *f);
KVPS_API const char *kvps_fuse_last_error(const kvps_fuse *f);
KVPS_API void kvps_fuse_destroy(kvps_fuse **f);
/* All of it at once, as one all-reduce over the list (section 2); threshold_bytes (0: the
   default) is the buckets' size where a list goes through buckets. */
KVPS_API kvps_result kvps_ring_allreduce_many(kvps_ring *r, void *const *bufs, const size_t *counts, size_t n,
                                              kvps_dtype dt, kvps_redop op, size_t threshold_bytes);

#ifdef __cplusplus
}
#endif
#endif /* KVPS_FUSE_H */

/* ============================================================================================ */
#if (defined(KVPS_IMPLEMENTATION) || defined(KVPS_FUSE_IMPLEMENTATION)) && !defined(KVPS_FUSE_IMPLEMENTED)
#define KVPS_FUSE_IMPLEMENTED
/* Sections (grep "// >>name"), lowest layer first:
     state        pieces, buckets and the fuse itself
     buckets      errors; filling a bucket, posting its all-reduce, copying it back
     api          create, add, flush, destroy, the last error; kvps_ring_allreduce_many */

// >>state
enum { KVPS_FUSE__MAX_BUCKETS = 8 };
typedef struct kvps_fuse__piece { void *dst; size_t bytes; } kvps_fuse__piece;
typedef struct kvps_fuse__bucket {
    unsigned char *buf;
    size_t used;              /* bytes packed */
    kvps_fuse__piece *pieces; /* where each packed buffer goes back to */
    size_t npieces, cap_pieces;
    kvps_ring_req req;        /* posted: its all-reduce (0: filling or idle) */
} kvps_fuse__bucket;

struct kvps_fuse {
    kvps_ring *r;
    kvps_fuse_desc d;
    size_t esz;
    kvps_fuse__bucket b[KVPS_FUSE__MAX_BUCKETS];
    int cur;                  /* the bucket being filled */
    kvps_ring_req *direct;    /* in-place all-reduces out, in order */
    size_t ndirect, cap_direct;
    kvps_result err;          /* the first error: every later call returns it */
    char errmsg[512];
};

// >>buckets
static kvps_result kvps_fuse__fail(kvps_fuse *f, kvps_result rc, const char *fmt, ...) {
    if (f->err == KVPS_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(f->errmsg, sizeof f->errmsg, fmt, ap);
        va_end(ap);
        f->err = rc;
    }
    return rc;
}

/* Posts an all-reduce of count elements in place at buf, on the ring's thread. */
static kvps_result kvps_fuse__post_at(kvps_fuse *f, void *buf, size_t count, kvps_ring_req *req) {
    kvps_ring_op o;
    memset(&o, 0, sizeof o);
    o.coll = KVPS_COLL_ALLREDUCE;
    o.send = buf;
    o.recv = buf;
    o.count = count;
    o.dtype = f->d.dtype;
    o.op = f->d.op;
    return kvps_ring_post(f->r, &o, req);
}

/* Posts bucket i's all-reduce when it holds anything. */
static kvps_result kvps_fuse__post(kvps_fuse *f, int i) {
    kvps_fuse__bucket *b = &f->b[i];
    if (!b->used || b->req) return KVPS_OK;
    kvps_result rc = kvps_fuse__post_at(f, b->buf, b->used / f->esz, &b->req);
    if (rc != KVPS_OK)
        return kvps_fuse__fail(f, rc, "fused all-reduce of %zu buffers (%zu bytes): %s", b->npieces, b->used,
                               kvps_ring_last_error(f->r));
    return KVPS_OK;
}

/* Waits for bucket i's all-reduce and copies its results home; the bucket is empty after. */
static kvps_result kvps_fuse__land(kvps_fuse *f, int i) {
    kvps_fuse__bucket *b = &f->b[i];
    kvps_result rc = KVPS_OK;
    if (b->req) {
        rc = kvps_ring_wait(f->r, b->req, -1);
        b->req = 0;
        if (rc != KVPS_OK)
            kvps_fuse__fail(f, rc, "fused all-reduce of %zu buffers (%zu bytes): %s", b->npieces, b->used,
                            kvps_ring_last_error(f->r));
        else {
            size_t at = 0;
            for (size_t k = 0; k < b->npieces; k++) {
                memcpy(b->pieces[k].dst, b->buf + at, b->pieces[k].bytes);
                at += b->pieces[k].bytes;
            }
        }
    }
    b->used = 0;
    b->npieces = 0;
    return rc;
}

/* Waits for the in-place all-reduces out. */
static kvps_result kvps_fuse__land_direct(kvps_fuse *f) {
    kvps_result first = KVPS_OK;
    for (size_t k = 0; k < f->ndirect; k++) {
        kvps_result rc = kvps_ring_wait(f->r, f->direct[k], -1);
        if (rc != KVPS_OK && first == KVPS_OK) {
            first = rc;
            kvps_fuse__fail(f, rc, "in-place all-reduce %zu of this flush: %s", k, kvps_ring_last_error(f->r));
        }
    }
    f->ndirect = 0;
    return first;
}

// >>api
KVPS_API kvps_result kvps_fuse_create(kvps_ring *r, const kvps_fuse_desc *desc, kvps_fuse **out) {
    if (!out) return KVPS_ERR_INVALID_ARG;
    *out = NULL;
    if (!r || !desc) return KVPS_ERR_INVALID_ARG;
    size_t esz = kvps_dtype_size(desc->dtype);
    if (!esz || (unsigned)desc->op >= KVPS_REDOP_COUNT || desc->buckets < 0 || desc->buckets > KVPS_FUSE__MAX_BUCKETS)
        return KVPS_ERR_INVALID_ARG;
    kvps_fuse *f = (kvps_fuse *)calloc(1, sizeof *f);
    if (!f) return KVPS_ERR_NOMEM;
    f->r = r;
    f->d = *desc;
    f->esz = esz;
    if (!f->d.threshold_bytes) f->d.threshold_bytes = (size_t)4 << 20;
    f->d.threshold_bytes -= f->d.threshold_bytes % esz;
    if (f->d.threshold_bytes < esz) f->d.threshold_bytes = esz;
    if (!f->d.direct_bytes) f->d.direct_bytes = f->d.threshold_bytes / 4 ? f->d.threshold_bytes / 4 : esz;
    if (!f->d.buckets) f->d.buckets = 2;
    for (int i = 0; i < f->d.buckets; i++)
        if (!(f->b[i].buf = (unsigned char *)malloc(f->d.threshold_bytes))) {
            kvps_fuse_destroy(&f);
            return KVPS_ERR_NOMEM;
        }
    *out = f;
    return KVPS_OK;
}

KVPS_API kvps_result kvps_fuse_add(kvps_fuse *f, void *buf, size_t count) {
    if (!f) return KVPS_ERR_INVALID_ARG;
    if (f->err) return f->err;
    if (count && !buf) {
        snprintf(f->errmsg, sizeof f->errmsg, "add: buf is NULL with count %zu", count);
        return KVPS_ERR_INVALID_ARG;
    }
    if (count > ((size_t)1 << 40) / f->esz) {
        snprintf(f->errmsg, sizeof f->errmsg, "add: count %zu is over 2^40 bytes of %s", count, kvps_dtype_name(f->d.dtype));
        return KVPS_ERR_INVALID_ARG;
    }
    size_t bytes = count * f->esz;
    if (!bytes) return KVPS_OK;
    if (bytes >= f->d.direct_bytes) { /* large: in place, in its turn */
        if (f->ndirect == f->cap_direct) {
            size_t nc = f->cap_direct ? 2 * f->cap_direct : 16;
            kvps_ring_req *nd = (kvps_ring_req *)realloc(f->direct, nc * sizeof *nd);
            if (!nd) return kvps_fuse__fail(f, KVPS_ERR_NOMEM, "add: out of memory");
            f->direct = nd;
            f->cap_direct = nc;
        }
        kvps_result rc = kvps_fuse__post_at(f, buf, count, &f->direct[f->ndirect]);
        if (rc != KVPS_OK)
            return kvps_fuse__fail(f, rc, "in-place all-reduce of %zu %s: %s", count, kvps_dtype_name(f->d.dtype),
                                   kvps_ring_last_error(f->r));
        f->ndirect++;
        return KVPS_OK;
    }
    kvps_fuse__bucket *b = &f->b[f->cur];
    if (b->used + bytes > f->d.threshold_bytes) { /* full: out it goes, and the next bucket fills */
        kvps_result rc = kvps_fuse__post(f, f->cur);
        if (rc != KVPS_OK) return rc;
        f->cur = (f->cur + 1) % f->d.buckets;
        b = &f->b[f->cur];
        rc = kvps_fuse__land(f, f->cur); /* (its last all-reduce, if still out: the wait that overlaps) */
        if (rc != KVPS_OK) return rc;
    }
    if (b->npieces == b->cap_pieces) {
        size_t nc = b->cap_pieces ? 2 * b->cap_pieces : 64;
        kvps_fuse__piece *np = (kvps_fuse__piece *)realloc(b->pieces, nc * sizeof *np);
        if (!np) return kvps_fuse__fail(f, KVPS_ERR_NOMEM, "add: out of memory");
        b->pieces = np;
        b->cap_pieces = nc;
    }
    memcpy(b->buf + b->used, buf, bytes);
    b->pieces[b->npieces].dst = buf;
    b->pieces[b->npieces].bytes = bytes;
    b->npieces++;
    b->used += bytes;
    return KVPS_OK;
}

KVPS_API kvps_result kvps_fuse_flush(kvps_fuse *f) {
    if (!f) return KVPS_ERR_INVALID_ARG;
    if (f->err) return f->err;
    kvps_result rc = kvps_fuse__post(f, f->cur);
    /* every bucket out lands, oldest first (the one after cur was posted before cur) */
    for (int k = 1; k <= f->d.buckets; k++) {
        kvps_result r2 = kvps_fuse__land(f, (f->cur + k) % f->d.buckets);
        if (rc == KVPS_OK) rc = r2;
    }
    kvps_result r3 = kvps_fuse__land_direct(f);
    if (rc == KVPS_OK) rc = r3;
    f->cur = 0;
    return rc;
}

KVPS_API const char *kvps_fuse_last_error(const kvps_fuse *f) { return f ? f->errmsg : ""; }

KVPS_API void kvps_fuse_destroy(kvps_fuse **pf) {
    kvps_fuse *f = pf ? *pf : NULL;
    if (!f) return;
    for (int i = 0; i < KVPS_FUSE__MAX_BUCKETS; i++) {
        if (f->b[i].req) kvps_ring_wait(f->r, f->b[i].req, -1); /* the ring still reads and writes it */
        free(f->b[i].buf);
        free(f->b[i].pieces);
    }
    for (size_t k = 0; k < f->ndirect; k++) kvps_ring_wait(f->r, f->direct[k], -1);
    free(f->direct);
    free(f);
    *pf = NULL;
}

/* Through buckets: create, add each buffer in order, flush, destroy. */
static kvps_result kvps_fuse__many_buckets(kvps_ring *r, void *const *bufs, const size_t *counts, size_t n, kvps_dtype dt,
                                          kvps_redop op, size_t threshold_bytes) {
    kvps_fuse *f = NULL;
    kvps_fuse_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dt;
    d.op = op;
    d.threshold_bytes = threshold_bytes;
    kvps_result rc = kvps_fuse_create(r, &d, &f);
    for (size_t i = 0; i < n && rc == KVPS_OK; i++) rc = kvps_fuse_add(f, bufs[i], counts[i]);
    if (rc == KVPS_OK) rc = kvps_fuse_flush(f);
    kvps_fuse_destroy(&f);
    return rc;
}

/* One all-reduce over the whole list (kvps_ring.h, >>list): its layout, a hash of the non-zero
   counts in order (FNV-1a), goes in every piece's header, so ranks whose lists differ (even with
   the same total) get KVPS_ERR_MISMATCH. */
static kvps_result kvps_fuse__many_list(kvps_ring *r, void *const *bufs, const size_t *counts, size_t n, size_t total,
                                       kvps_dtype dt, kvps_redop op) {
    kvps_ring__list l;
    l.bufs = bufs;
    l.counts = counts;
    l.n = n;
    l.start = (size_t *)malloc((n + 1) * sizeof *l.start);
    if (!l.start) return KVPS_ERR_NOMEM;
    uint32_t hash = 2166136261u;
    l.start[0] = 0;
    for (size_t i = 0; i < n; i++) {
        l.start[i + 1] = l.start[i] + counts[i];
        for (int b = 0; counts[i] && b < 64; b += 8) hash = (hash ^ (uint32_t)((uint64_t)counts[i] >> b & 255)) * 16777619u;
    }
    l.layout = hash ? hash : 1;
    kvps_ring_op o;
    memset(&o, 0, sizeof o);
    o.coll = KVPS_COLL_ALLREDUCE;
    o.count = total;
    o.dtype = dt;
    o.op = op;
    kvps_result rc = kvps_ring__run_op(r, &o, &l);
    free(l.start);
    return rc;
}

KVPS_API kvps_result kvps_ring_allreduce_many(kvps_ring *r, void *const *bufs, const size_t *counts, size_t n,
                                              kvps_dtype dt, kvps_redop op, size_t threshold_bytes) {
    if (!r || (n && (!bufs || !counts))) return KVPS_ERR_INVALID_ARG;
    size_t es = kvps_dtype_size(dt), total = 0, lim = es ? ((size_t)1 << 40) / es : 0;
    if (!es || (unsigned)op >= KVPS_REDOP_COUNT)
        return kvps_ring__fail(r, KVPS_ERR_INVALID_ARG, "allreduce_many: %s", !es ? "no such dtype" : "no such op");
    for (size_t i = 0; i < n; i++) {
        if (counts[i] && !bufs[i])
            return kvps_ring__fail(r, KVPS_ERR_INVALID_ARG, "allreduce_many: buffer %zu is NULL with count %zu", i, counts[i]);
        if (counts[i] > lim || (total += counts[i]) > lim / (size_t)kvps_ring_size(r))
            return kvps_ring__fail(r, KVPS_ERR_INVALID_ARG, "allreduce_many: over 2^40 bytes of %s", kvps_dtype_name(dt));
    }
    if (!total) return KVPS_OK;
    /* one collective over the list where the ring's algorithm runs on it in place (RING), or
       where packing it costs little (small lists, RD; up to 16 MiB, RHD); else buckets */
    kvps_ring_algo algo = kvps_ring__allreduce_algo(r, KVPS_ALGO_AUTO, total * es, 0);
    if (algo == KVPS_ALGO_RING || total * es <= KVPS_RING__RHD_MAX) return kvps_fuse__many_list(r, bufs, counts, n, total, dt, op);
    return kvps_fuse__many_buckets(r, bufs, counts, n, dt, op, threshold_bytes);
}

#endif /* KVPS_IMPLEMENTATION */
