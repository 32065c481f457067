/* test_fuse - tensor fusion, among peers (kvps_fuse.h) and through servers (kvps_worker_*_tensors).
   Among peers, against the naive oracles of tests/kt_coll.h: many
   buffers of uneven sizes (some empty, some large enough to go in place) all-reduced through
   buckets, 1..8 ranks as threads on inproc and 4 over TCP, every dtype and op; the incremental
   form over several steps with one kvps_fuse; a rank that adds another count (every rank fails,
   one with KVPS_ERR_MISMATCH); bad arguments.

     test_many_matrix        kvps_ring_allreduce_many: 6 dtypes x 5 ops, 37 buffers, a 4 KiB
                             threshold (many buckets, buffers of 1 KiB and more in place),
                             1..8 ranks; every element checked, results equal on every rank
     test_incremental        kvps_fuse_add / flush, three steps with the same object, the
                             buffers refilled each step; one bucket and eight
     test_tcp                the same over TCP, 4 ranks, a 64 KiB threshold, ResNet-50's 161
                             tensor sizes scaled down by 64
     test_list_ring          kvps_ring_allreduce_many as one all-reduce over the list (a ring
                             forced to RING, 1000-byte chunks: pieces cut at the buffers' edges,
                             short runs packed): every dtype and op, 1..8 ranks
     test_tcp_list           the same over TCP with ResNet-50's sizes / 16 (pieces sent without
                             a copy from the buffers), 3 ranks (AUTO) and 4 (RING), float and int64
     test_layout_mismatch    rank 1 passes the same total in another list: every rank gets an
                             error, one KVPS_ERR_MISMATCH naming the lists (packed path and ring)
     test_mismatch           rank 1 adds one element more: every rank gets an error, one of
                             them KVPS_ERR_MISMATCH; nothing hangs
     test_bad_args           NULL buffer, bad dtype, too many buckets; allreduce_many: a NULL
                             buffer in the list, bad dtype or op, 2^62 elements, named, the
                             ring usable after
   Through servers (2 servers, 3 worker threads, BSP, server-side SGD), against the same job made
   of one request per tensor (kvps_worker_pushpull_tensor), whose BSP sums in rank order must give
   the same bits, and a naive sum:
     test_ps_fused           ResNet-50's 161 tensors (sizes / 256), 4 steps of pushpull_tensors
                             with 4 KiB messages (many rounds), one tensor coded fp16 on push
                             (its own messages); push_tensors + pull_tensors for the last step;
                             again with credit for 6000 bytes in flight per server
     test_ps_priority        a fused push's first message to each server carries the
                             higher-priority tensor's slices
     test_ps_credit_order    credit for one message: a priority-5 pushpull made after a fused
                             push of 64 messages is applied by the server second, before 63
                             of them
     test_ps_bad_args        empty or NULL lists, a tensor twice, an unregistered one, a NULL
                             gradient: refused, named */
#define KVPS_IMPLEMENTATION
#include "kvps.h" /* the fused tensors of a parameter server */
#include "kvps_fuse.h"
#include "tests/kvps_test.h"
#include "tests/kt_coll.h"
#include "bench/resnet50.h"

enum { NB = 37 };
static size_t counts_for(int i) { return i % 7 == 3 ? 0 : (size_t)((i * 37) % 300) + (i % 11 == 5 ? 900 : 0); }

typedef struct fcase { kvps_dtype dt; kvps_redop op; size_t threshold; int buckets, steps, incremental, scale; } fcase;

/* Fills, all-reduces and checks one list of buffers; `base` numbers elements across the list. */
static void run_case(kt_rk *x, const fcase *c, const size_t *cnt, size_t nb, kvps_fuse *f) {
    size_t es = kvps_dtype_size(c->dt);
    void **bufs = (void **)kt_xmalloc(nb * sizeof *bufs);
    for (size_t i = 0; i < nb; i++) bufs[i] = kt_xmalloc(cnt[i] * es + 1);
    for (int step = 0; step < c->steps && !x->dead; step++) {
        uint64_t seed = kt_rk_seed(x);
        size_t base = 0;
        for (size_t i = 0; i < nb; i++) {
            put_red(c->dt, c->op, bufs[i], cnt[i], seed, x->rank, base);
            base += cnt[i];
        }
        char what[160];
        snprintf(what, sizeof what, "%s %s %s threshold %zu buckets %d step %d", c->incremental ? "fuse" : "allreduce_many",
                 DT_NAME[c->dt], OP_NAME[c->op], c->threshold, c->buckets, step);
        kvps_result rc = KVPS_OK;
        if (c->incremental) {
            for (size_t i = 0; i < nb && rc == KVPS_OK; i++) rc = kvps_fuse_add(f, bufs[i], cnt[i]);
            if (rc == KVPS_OK) rc = kvps_fuse_flush(f);
            if (rc != KVPS_OK) kt_rk_fail(x, "%s: %s", what, kvps_fuse_last_error(f));
        } else
            rc = kvps_ring_allreduce_many(x->r, bufs, cnt, nb, c->dt, c->op, c->threshold);
        if (!kt_rk_call(x, rc, what)) break;
        base = 0;
        for (size_t i = 0; i < nb; i++) {
            check_red(x, what, c->dt, c->op, seed, bufs[i], cnt[i], base);
            kt_rk_hash(x, bufs[i], cnt[i] * es);
            base += cnt[i];
        }
    }
    for (size_t i = 0; i < nb; i++) free(bufs[i]);
    free(bufs);
}

static void matrix_main(kt_rk *x) {
    size_t cnt[NB];
    for (int i = 0; i < NB; i++) cnt[i] = counts_for(i);
    for (int dt = 0; dt < KVPS_DTYPE_COUNT; dt++)
        for (int op = 0; op < KVPS_REDOP_COUNT; op++) {
            fcase c = {(kvps_dtype)dt, (kvps_redop)op, 4096, 2, 1, 0, 1};
            run_case(x, &c, cnt, NB, NULL);
        }
}

static void test_many_matrix(void) {
    for (int k = 1; k <= 8; k++) {
        char label[32];
        snprintf(label, sizeof label, "many, %d ranks", k);
        kt_run_team(label, matrix_main, k, 0, 20000, NULL);
    }
}

static void incremental_main(kt_rk *x) {
    size_t cnt[NB];
    for (int i = 0; i < NB; i++) cnt[i] = counts_for(i);
    for (int buckets = 1; buckets <= 8; buckets += 7)
        for (int op = 0; op < 2; op++) {
            fcase c = {op ? KVPS_INT64 : KVPS_FLOAT32, op ? KVPS_SUM : KVPS_AVG, 2048, buckets, 3, 1, 1};
            kvps_fuse *f = NULL;
            kvps_result rc = kvps_fuse_create(x->r, &(kvps_fuse_desc){.dtype = c.dt, .op = c.op, .threshold_bytes = c.threshold,
                                                                       .buckets = buckets}, &f);
            if (!kt_rk_call(x, rc, "fuse_create")) return;
            run_case(x, &c, cnt, NB, f);
            kvps_fuse_destroy(&f);
        }
}

static void test_incremental(void) {
    for (int k = 1; k <= 5; k += 2) {
        char label[32];
        snprintf(label, sizeof label, "incremental, %d ranks", k);
        kt_run_team(label, incremental_main, k, 0, 20000, NULL);
    }
}

static void tcp_main(kt_rk *x) {
    size_t cnt[200];
    size_t n = resnet50_sizes(cnt);
    if (n != 161) { kt_rk_fail(x, "ResNet-50 has %zu parameter tensors here, not 161", n); return; }
    for (size_t i = 0; i < n; i++) cnt[i] = (cnt[i] + 63) / 64;
    fcase c = {KVPS_FLOAT32, KVPS_SUM, 65536, 2, 2, 0, 64};
    run_case(x, &c, cnt, n, NULL);
}

static void test_tcp(void) { kt_run_team("tcp, 4 ranks", tcp_main, 4, 1, 20000, NULL); }

/* kvps_ring_allreduce_many on a ring that runs RING: one all-reduce over the list itself
   (kvps_ring.h, >>list). 1000-byte chunks cut the 37 buffers into many pieces, at their edges,
   the short runs packed together; every dtype and op, 1..8 ranks. */
static void test_list_ring(void) {
    for (int k = 1; k <= 8; k++) {
        char label[48];
        snprintf(label, sizeof label, "list ring, %d ranks", k);
        kt_team t;
        kt_team_init(&t, label, matrix_main, k, 0, kt_quick() ? 60000 : 20000);
        t.base.algo = KVPS_ALGO_RING;
        t.base.chunk_bytes = 1000;
        kt_team_run(&t);
    }
}

/* The same over TCP with ResNet-50's sizes / 16 (6.4 MB): pieces sent without a copy from the
   buffers (the convolutions), the batch norms packed; 3 ranks (AUTO runs RING there) and 4 with
   RING forced; float sums and exact int64 sums, two steps each. */
static void tcp_list_main(kt_rk *x) {
    size_t cnt[200];
    size_t n = resnet50_sizes(cnt);
    for (size_t i = 0; i < n; i++) cnt[i] = (cnt[i] + 15) / 16;
    fcase f = {KVPS_FLOAT32, KVPS_SUM, 0, 2, 2, 0, 16}, g = {KVPS_INT64, KVPS_SUM, 0, 2, 2, 0, 16};
    run_case(x, &f, cnt, n, NULL);
    run_case(x, &g, cnt, n, NULL);
}

static void test_tcp_list(void) {
    kt_run_team("list ring over tcp, 3 ranks", tcp_list_main, 3, 1, 20000, NULL);
    kt_team t;
    kt_team_init(&t, "list ring over tcp, 4 ranks", tcp_list_main, 4, 1, kt_quick() ? 60000 : 20000);
    t.base.algo = KVPS_ALGO_RING;
    kt_team_run(&t);
}

static void mismatch_main(kt_rk *x) {
    size_t cnt[4] = {10, 20, 30, 40};
    if (x->rank == 1) cnt[2]++;
    float *b[4];
    for (int i = 0; i < 4; i++) b[i] = (float *)calloc(cnt[i], sizeof(float));
    kvps_result rc = kvps_ring_allreduce_many(x->r, (void *const *)b, cnt, 4, KVPS_FLOAT32, KVPS_SUM, 0);
    x->rc1 = rc;
    snprintf(x->err1, sizeof x->err1, "%.300s", kvps_ring_last_error(x->r));
    for (int i = 0; i < 4; i++) free(b[i]);
}

/* Rank 1 passes the same total in another list (its first two counts swapped): every rank gets
   an error, one of them KVPS_ERR_MISMATCH naming the lists; through the packed path (a small list:
   RD) and the list ring (RING forced). */
static void layout_main(kt_rk *x) {
    size_t cnt[4] = {10, 20, 30, 40};
    if (x->rank == 1) { cnt[0] = 20; cnt[1] = 10; }
    float *b[4];
    for (int i = 0; i < 4; i++) b[i] = (float *)calloc(cnt[i], sizeof(float));
    x->rc1 = kvps_ring_allreduce_many(x->r, (void *const *)b, cnt, 4, KVPS_FLOAT32, KVPS_SUM, 0);
    snprintf(x->err1, sizeof x->err1, "%.300s", kvps_ring_last_error(x->r));
    for (int i = 0; i < 4; i++) free(b[i]);
}

static void test_layout_mismatch(void) {
    for (int ring = 0; ring < 2; ring++) {
        kt_team t;
        kt_team_init(&t, ring ? "layout, ring" : "layout", layout_main, 3, 0, 3000);
        if (ring) t.base.algo = KVPS_ALGO_RING;
        kt_team_run(&t);
        int mism = 0;
        for (int i = 0; i < 3; i++) {
            KT_CHECK(t.ranks[i].rc1 != KVPS_OK, "%s: rank %d: another list of the same total went through", t.label, i);
            if (t.ranks[i].rc1 == KVPS_ERR_MISMATCH) {
                mism++;
                KT_CHECK(strstr(t.ranks[i].err1, "list of buffers") != NULL, "%s: rank %d: the error does not name the "
                         "lists: %s", t.label, i, t.ranks[i].err1);
            }
            printf("  %s: rank %d: %s: %s\n", t.label, i, kvps_result_str(t.ranks[i].rc1), t.ranks[i].err1);
        }
        KT_CHECK(mism >= 1, "%s: no rank reported KVPS_ERR_MISMATCH", t.label);
    }
}

static void test_mismatch(void) {
    kt_team t;
    kt_team_init(&t, "mismatch", mismatch_main, 3, 0, 3000);
    kt_team_run(&t);
    int mism = 0;
    for (int i = 0; i < 3; i++) {
        KT_CHECK(t.ranks[i].rc1 != KVPS_OK, "rank %d: a bucket of another count on rank 1 went through (%s)", i,
                 kvps_result_str(t.ranks[i].rc1));
        mism += t.ranks[i].rc1 == KVPS_ERR_MISMATCH;
        printf("  rank %d: %s: %s\n", i, kvps_result_str(t.ranks[i].rc1), t.ranks[i].err1);
    }
    KT_CHECK(mism >= 1, "no rank reported KVPS_ERR_MISMATCH");
}

static void test_bad_args(void) {
    kvps_ring *r = NULL;
    KT_OK(kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 1, .peers = "inproc://fuse-bad"}, &r));
    kvps_fuse *f = NULL;
    KT_CHECK(kvps_fuse_create(r, &(kvps_fuse_desc){.dtype = (kvps_dtype)9}, &f) == KVPS_ERR_INVALID_ARG && !f, "bad dtype");
    KT_CHECK(kvps_fuse_create(r, &(kvps_fuse_desc){.buckets = 9}, &f) == KVPS_ERR_INVALID_ARG && !f, "9 buckets");
    KT_OK(kvps_fuse_create(r, &(kvps_fuse_desc){.dtype = KVPS_FLOAT32}, &f));
    KT_CHECK(kvps_fuse_add(f, NULL, 3) == KVPS_ERR_INVALID_ARG && strstr(kvps_fuse_last_error(f), "NULL"), "NULL buffer: %s",
             kvps_fuse_last_error(f));
    float v[3] = {1, 2, 3};
    KT_OK(kvps_fuse_add(f, v, 3)); /* a bad call leaves it usable */
    KT_OK(kvps_fuse_add(f, NULL, 0));
    KT_OK(kvps_fuse_flush(f));
    KT_CHECK(v[0] == 1 && v[2] == 3, "one rank's sum changed the values");
    kvps_fuse_destroy(&f);
    KT_CHECK(f == NULL, "destroy leaves the pointer");
    kvps_fuse_destroy(&f);
    KT_CHECK(kvps_ring_allreduce_many(r, NULL, NULL, 0, KVPS_FLOAT32, KVPS_SUM, 0) == KVPS_OK, "an empty list");
    KT_CHECK(kvps_ring_allreduce_many(r, NULL, NULL, 2, KVPS_FLOAT32, KVPS_SUM, 0) == KVPS_ERR_INVALID_ARG, "NULL lists");
    void *bl[2] = {v, NULL};
    size_t cl[2] = {3, 2}, huge = (size_t)1 << 62;
    KT_CHECK(kvps_ring_allreduce_many(r, bl, cl, 2, KVPS_FLOAT32, KVPS_SUM, 0) == KVPS_ERR_INVALID_ARG &&
             strstr(kvps_ring_last_error(r), "buffer 1 is NULL"), "a NULL buffer in the list: %s", kvps_ring_last_error(r));
    KT_CHECK(kvps_ring_allreduce_many(r, bl, cl, 1, (kvps_dtype)9, KVPS_SUM, 0) == KVPS_ERR_INVALID_ARG, "bad dtype");
    KT_CHECK(kvps_ring_allreduce_many(r, bl, cl, 1, KVPS_FLOAT32, (kvps_redop)7, 0) == KVPS_ERR_INVALID_ARG, "bad op");
    KT_CHECK(kvps_ring_allreduce_many(r, bl, &huge, 1, KVPS_FLOAT32, KVPS_SUM, 0) == KVPS_ERR_INVALID_ARG &&
             strstr(kvps_ring_last_error(r), "2^40"), "2^62 elements: %s", kvps_ring_last_error(r));
    cl[1] = 0; /* (an empty buffer may be NULL) */
    KT_OK(kvps_ring_allreduce_many(r, bl, cl, 2, KVPS_FLOAT32, KVPS_AVG, 0)); /* the bad calls left the ring usable */
    KT_CHECK(v[0] == 1 && v[1] == 2 && v[2] == 3, "one rank's average changed the values");
    kvps_ring_destroy(&r);
}

/* ---- through servers ------------------------------------------------------------------------ */
enum { PS_NW = 3, PS_STEPS = 4 };
typedef struct psjob {
    char ep[2][96], list[200];
    int fused;
    size_t credit; /* credit_bytes */
    size_t cnt[RESNET50_TENSORS];
    float *final[PS_NW][RESNET50_TENSORS];
} psjob;

static float ps_grad(int rank, int step, int t, size_t i) {
    return (float)((rank + 1) * (int)((i * 7 + (size_t)t * 3) % 11) - 5 * (step + 1)) * 0.01f;
}

static void ps_worker(kt_wk *x) {
    psjob *j = (psjob *)x->ws->user;
    int rank = x->rank;
    kvps_worker *w = NULL;
    kvps_result rc = kvps_worker_create(&(kvps_worker_desc){.servers = x->ws->servers, .rank = rank, .num_workers = PS_NW,
                                                            .min_slice = 64, .max_slice = 512, .fusion_bytes = 4096,
                                                            .credit_bytes = j->credit}, &w);
    kvps_tensor t[RESNET50_TENSORS];
    float *g[RESNET50_TENSORS];
    for (int i = 0; i < RESNET50_TENSORS && rc == KVPS_OK; i++) {
        char name[32];
        snprintf(name, sizeof name, "resnet.%d", i);
        rc = kvps_worker_tensor(w, name, j->cnt[i], &t[i]);
        g[i] = (float *)malloc(j->cnt[i] * sizeof(float));
        j->final[rank][i] = (float *)calloc(j->cnt[i], sizeof(float));
    }
    kvps_codec fp16 = kvps_codec_get(KVPS_CODEC_FP16);
    if (rc == KVPS_OK) rc = kvps_worker_tensor_codec(w, t[7], &fp16, NULL, 1);
    for (int step = 0; step < PS_STEPS && rc == KVPS_OK; step++) {
        for (int i = 0; i < RESNET50_TENSORS; i++)
            for (size_t e = 0; e < j->cnt[i]; e++) g[i][e] = ps_grad(rank, step, i, e);
        kvps_req q, q2;
        if (!j->fused) {
            for (int i = 0; i < RESNET50_TENSORS && rc == KVPS_OK; i++) {
                rc = kvps_worker_pushpull_tensor(w, t[i], g[i], j->final[rank][i], &q);
                if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, 20000);
            }
        } else if (step < PS_STEPS - 1) {
            rc = kvps_worker_pushpull_tensors(w, t, RESNET50_TENSORS, (const float *const *)g, j->final[rank], &q);
            if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, 20000);
        } else { /* the last step: a push, then a pull, both fused */
            rc = kvps_worker_push_tensors(w, t, RESNET50_TENSORS, (const float *const *)g, &q);
            if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, 20000);
            if (rc == KVPS_OK) rc = kvps_worker_pull_tensors(w, t, RESNET50_TENSORS, j->final[rank], &q2);
            if (rc == KVPS_OK) rc = kvps_worker_wait(w, q2, 20000);
        }
    }
    if (rc != KVPS_OK) kt_wk_fail(x, "%s: %.299s", kvps_result_str(rc), kvps_worker_last_error(w));
    for (int i = 0; i < RESNET50_TENSORS; i++) free(g[i]);
    kvps_worker_finish(w, 5000);
    kvps_worker_destroy(&w);
}

static void ps_run(psjob *j, int fused, size_t credit) {
    memset(j, 0, sizeof *j);
    j->fused = fused;
    j->credit = credit;
    resnet50_sizes(j->cnt);
    for (int i = 0; i < RESNET50_TENSORS; i++) j->cnt[i] = (j->cnt[i] + 255) / 256;
    kvps_server *srv[2];
    for (int i = 0; i < 2; i++) {
        snprintf(j->ep[i], sizeof j->ep[i], "ipc://@kvps-fuse-%d-%d-%zu-%d", (int)getpid(), fused, credit, i);
        KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = j->ep[i], .rank = i, .num_workers = PS_NW,
                                                     .update = KVPS_UPDATE_SGD, .lr = 0.5f}, &srv[i]));
        KT_OK(kvps_server_start(srv[i]));
    }
    snprintf(j->list, sizeof j->list, "%.95s,%.95s", j->ep[0], j->ep[1]);
    kt_workers ws;
    kt_workers_init(&ws, fused ? "fused" : "one by one", ps_worker, PS_NW, j->list, NULL); /* (each failure reported) */
    ws.user = j;
    kt_workers_run(&ws);
    for (int i = 0; i < 2; i++) {
        KT_CHECK(kvps_server_wait(srv[i], 10000) == KVPS_OK, "server %d did not stop by itself", i);
        kvps_server_destroy(&srv[i]);
    }
}

static psjob ps_one, ps_fused;

static void test_ps_fused(void) {
    ps_run(&ps_one, 0, 0);
    for (int c = 0; c < 2; c++) {
    ps_run(&ps_fused, 1, c ? 6000 : 0); /* the second time with credit: at most 6000 bytes in flight per server */
    size_t diff = 0, total = 0;
    int first_t = -1;
    for (int r = 0; r < PS_NW; r++)
        for (int i = 0; i < RESNET50_TENSORS; i++) {
            total += ps_one.cnt[i];
            for (size_t e = 0; e < ps_one.cnt[i]; e++)
                if (memcmp(&ps_one.final[r][i][e], &ps_fused.final[r][i][e], sizeof(float)) != 0 && diff++ == 0) first_t = i;
        }
    KT_CHECK(diff == 0, "%s: %zu of %zu values differ from the one-by-one run's, the first in tensor %d",
             c ? "with credit" : "fused", diff, total, first_t);
    /* a naive check of one plain value: SGD from 0 with lr 0.5 on the mean of the ranks' gradients */
    double wv = 0;
    for (int step = 0; step < PS_STEPS; step++) {
        double sum = 0;
        for (int r = 0; r < PS_NW; r++) sum += ps_grad(r, step, 3, 5);
        wv = (float)(wv - (float)(0.5f * (float)((float)sum / PS_NW)));
    }
    KT_CHECK(fabs(ps_fused.final[0][3][5] - wv) < 1e-5, "tensor 3 [5]: %.9g, the naive sum says %.9g",
             (double)ps_fused.final[0][3][5], wv);
    for (int r = 0; r < PS_NW; r++)
        for (int i = 0; i < RESNET50_TENSORS; i++) free(ps_fused.final[r][i]);
    }
    for (int r = 0; r < PS_NW; r++)
        for (int i = 0; i < RESNET50_TENSORS; i++) free(ps_one.final[r][i]);
}

/* The server's order of applying (update_fn): the length of each key's round, in turn. */
static size_t credit_order[256];
static int credit_n;
static void credit_record(const kvps_update_args *a) {
    for (size_t i = 0; i < a->len; i++) a->value[i] += a->sum[i];
    if (credit_n < 256) credit_order[credit_n++] = a->len;
}

/* With credit for one message in flight, a pushpull of priority 5 made after a fused push of 64
   messages goes second: the server applies it before nearly all of the push (its own order,
   which no timing on the worker's side changes). */
static void test_ps_credit_order(void) {
    char ep[96];
    snprintf(ep, sizeof ep, "ipc://@kvps-fuse-credit-%d", (int)getpid());
    kvps_server *srv = NULL;
    credit_n = 0;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = ep, .num_workers = 1, .update_fn = credit_record}, &srv));
    KT_OK(kvps_server_start(srv));
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = ep, .num_workers = 1, .min_slice = 64, .max_slice = 1024,
                                                 .fusion_bytes = 4096, .credit_bytes = 1}, &w));
    kvps_tensor big, small;
    KT_OK(kvps_worker_tensor(w, "bulk", 65536, &big));
    KT_OK(kvps_worker_tensor(w, "first.layer", 100, &small));
    KT_OK(kvps_worker_tensor_priority(w, small, 5));
    float *g = (float *)malloc(65536 * sizeof(float)), v[100], sg[100];
    for (int i = 0; i < 65536; i++) g[i] = 1.0f;
    for (int i = 0; i < 100; i++) sg[i] = 2.0f;
    kvps_req qb, qs;
    const float *gp[1] = {g};
    KT_OK(kvps_worker_push_tensors(w, &big, 1, gp, &qb));
    KT_OK(kvps_worker_pushpull_tensor(w, small, sg, v, &qs));
    size_t queued_before = w->ncq;
    KT_OK(kvps_worker_wait(w, qs, 10000));
    KT_OK(kvps_worker_wait(w, qb, 10000));
    int at = -1; /* where the server applied the 100-float tensor among the push's 64 slices of 1024 */
    for (int i = 0; i < credit_n && at < 0; i++)
        if (credit_order[i] == 100) at = i;
    KT_CHECK(credit_n == 65 && at >= 0 && at <= 2, "the server applied %d rounds, the priority-5 pushpull as number %d: it "
             "did not go ahead of the push's queued messages", credit_n, at + 1);
    KT_CHECK(v[0] == 2.0f && v[99] == 2.0f, "the pushpull's values: %g, %g", (double)v[0], (double)v[99]);
    printf("  %zu messages waited for credit (63 of the push's 64, and the pushpull); the server applied the priority-5 "
           "pushpull as number %d of 65\n", queued_before, at + 1);
    KT_CHECK(w->ncq == 0 && w->inflight[0] == 0, "after the wait: %zu queued, %llu bytes in flight", w->ncq,
             (unsigned long long)w->inflight[0]);
    float back[65536];
    KT_OK(kvps_worker_pull_tensor(w, big, back, &qb));
    KT_OK(kvps_worker_wait(w, qb, 10000));
    KT_CHECK(back[0] == 1.0f && back[65535] == 1.0f, "the pushed values came back as %g, %g", (double)back[0], (double)back[65535]);
    free(g);
    kvps_worker_destroy(&w);
    kvps_server_destroy(&srv);
}

static void test_ps_priority(void) {
    char ep[2][96], list[200];
    kvps_server *srv[2];
    for (int i = 0; i < 2; i++) {
        snprintf(ep[i], sizeof ep[i], "ipc://@kvps-fuse-prio-%d-%d", (int)getpid(), i);
        KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = ep[i], .rank = i, .num_workers = 1}, &srv[i]));
        KT_OK(kvps_server_start(srv[i]));
    }
    snprintf(list, sizeof list, "%.95s,%.95s", ep[0], ep[1]);
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = list, .num_workers = 1, .min_slice = 64, .max_slice = 256,
                                                 .fusion_bytes = 1024}, &w));
    kvps_tensor t[3];
    float *g[3];
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        KT_OK(kvps_worker_tensor(w, name, 2048, &t[i]));
        g[i] = (float *)calloc(2048, sizeof(float));
    }
    KT_OK(kvps_worker_tensor_priority(w, t[2], 9)); /* the last in the list, the first out */
    kvps_req q;
    KT_OK(kvps_worker_push_tensors(w, t, 3, (const float *const *)g, &q));
    kvps__req *rq = kvps__req_get(w, q);
    uint64_t base2 = w->tensors[t[2]].keys[0] & ~0xffffull;
    for (int s = 0; rq && s < 2; s++) {
        KT_CHECK(rq->nkept[s] >= 1, "no message kept for server %d", s);
        if (rq->nkept[s] < 1) continue;
        const kvps__kent *e = (const kvps__kent *)((const char *)zmq_msg_data(&rq->kept[s][0]) + KVPS__HDR);
        KT_CHECK((e->key & ~0xffffull) == base2, "server %d: the first message starts with key %016llx, not a slice of the "
                 "priority-9 tensor (%016llx)", s, (unsigned long long)e->key, (unsigned long long)base2);
    }
    KT_OK(kvps_worker_wait(w, q, 10000));
    kvps_worker_destroy(&w);
    for (int i = 0; i < 3; i++) free(g[i]);
    for (int i = 0; i < 2; i++) kvps_server_destroy(&srv[i]);
}

static void test_ps_bad_args(void) {
    char ep[96];
    snprintf(ep, sizeof ep, "ipc://@kvps-fuse-bad-%d", (int)getpid());
    kvps_server *srv = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = ep, .num_workers = 1}, &srv));
    KT_OK(kvps_server_start(srv));
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = ep, .num_workers = 1}, &w));
    kvps_tensor t[2];
    KT_OK(kvps_worker_tensor(w, "a", 10, &t[0]));
    KT_OK(kvps_worker_tensor(w, "b", 10, &t[1]));
    float a[10] = {0}, b[10] = {0};
    const float *g[2] = {a, b}, *gnull[2] = {a, NULL};
    kvps_tensor twice[2] = {t[1], t[1]}, unknown[2] = {t[0], 7};
    kvps_req q;
    struct { kvps_result want; const char *text; kvps_result got; } c[5];
    c[0].got = kvps_worker_push_tensors(w, t, 0, g, &q); c[0].want = KVPS_ERR_INVALID_ARG; c[0].text = "0 tensors";
    c[1].got = kvps_worker_push_tensors(w, NULL, 2, g, &q); c[1].want = KVPS_ERR_INVALID_ARG; c[1].text = "ts";
    c[2].got = kvps_worker_push_tensors(w, twice, 2, g, &q); c[2].want = KVPS_ERR_DUP_KEY; c[2].text = "'b' is in the list twice";
    c[3].got = kvps_worker_push_tensors(w, unknown, 2, g, &q); c[3].want = KVPS_ERR_TENSOR; c[3].text = "tensor 7";
    c[4].got = kvps_worker_push_tensors(w, t, 2, gnull, &q); c[4].want = KVPS_ERR_INVALID_ARG; c[4].text = "'b' (list entry 1)";
    for (int i = 0; i < 5; i++) {
        KT_CHECK(c[i].got == c[i].want, "case %d: %s, expected %s", i, kvps_result_str(c[i].got), kvps_result_str(c[i].want));
    }
    /* (the last error names the last case) */
    KT_CHECK(strstr(kvps_worker_last_error(w), c[4].text) != NULL, "the error says '%s'", kvps_worker_last_error(w));
    KT_OK(kvps_worker_push_tensors(w, t, 2, g, &q)); /* still usable */
    KT_OK(kvps_worker_wait(w, q, 5000));
    kvps_worker_destroy(&w);
    kvps_server_destroy(&srv);
}

int main(void) {
    kvps_log_set_level(getenv("KT_VERBOSE") ? KVPS_LOG_INFO : KVPS_LOG_NONE);
    KT_RUN(test_many_matrix, 300);
    KT_RUN(test_incremental, 120);
    KT_RUN(test_tcp, 120);
    KT_RUN(test_list_ring, 300);
    KT_RUN(test_tcp_list, 120);
    KT_RUN(test_layout_mismatch, 60);
    KT_RUN(test_mismatch, 60);
    KT_RUN(test_bad_args, 30);
    KT_RUN(test_ps_fused, 120);
    KT_RUN(test_ps_priority, 30);
    KT_RUN(test_ps_credit_order, 30);
    KT_RUN(test_ps_bad_args, 30);
    return kt_finish();
}
