/* test_reshard.c - growing and shrinking the server set while BSP training goes on
   (kvps_worker_reshard, RESHARD in kvps.h). The oracle is a run of the same job on a fixed set of
   2 servers: BSP sums each round in rank order and applies the same rule to the same state, so a
   job whose keys moved between servers must end with the same bits, every one of them. A sparse
   table (momentum) rides along: each row has one writer, whose pushes are in program order, so
   its rows too end with the same bits wherever they were kept.

     test_grow_shrink_bit_identical  4 worker threads, BSP + momentum, two tensors and raw keys,
                                     and a sparse table's rows (pushed, and pulled only);
                                     2 -> 3 servers at step 10, 3 -> 2 at step 20: every final
                                     weight and row equal, bit for bit, to the fixed run's; the
                                     third server held keys (about a third) and table rows, and
                                     stopped by itself
     test_restart_after_grow         the same job stopped after the grow (step 15): the three
                                     servers checkpoint, new servers restore, new workers with
                                     the 3-server list take the placement the checkpoints record
                                     (2 > 3) from their hellos' answers and go on, shrinking to 2
                                     at step 20: every final weight equal to the fixed run's; a
                                     worker listing 1 server is told the checkpoint's placement
     test_reshard_refused            a list that does not keep the old servers in order, and a
                                     reshard with a request in flight: refused, named, nothing
                                     moved
     test_hello_before_place         a grow whose new server (a raw ROUTER standing in for one)
                                     answers worker 1's hello only after 1.5 s, as a slow
                                     connection would: no PLACE reaches it before that answer
                                     (a hello served after the placement changed is answered
                                     with one the worker does not hold yet, and made the server
                                     refuse that worker's keyed requests: CI saw it under load);
                                     the same with old server 1 holding worker 1's first hello,
                                     still in flight when the reshard starts
     test_plan_by_bytes              kvps__vmap_plan on ResNet-50's 161 tensors cut for 10
                                     servers plus 10^4 raw keys: 10 -> 20 servers one at a time
                                     and back; after every step max/mean bytes <= 1.1 and the
                                     bytes moved at most 1.25x the ideal share, a new server has
                                     >= 0.9 V / n' shards; the recorded moves replay
                                     (kvps__vmap_of) to the same map
     test_placement_refused          placements that are not one (V not 256 n0, a move to a
                                     server past its change's count, a shrink that leaves a shard
                                     behind, a forged one too large to replay): refused, named */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"
#include "bench/resnet50.h"
#include <pthread.h>

enum { NW = 4, STEPS = 30, NT = 2, NRAW = 10, NROW = 64, NPULLED = 16, DIM = 4 };
static const size_t tlen[NT] = {5000, 300};
/* every final value: the tensors, the raw keys, the table's pushed rows and its pulled-only rows */
#define NV (5000 + 300 + NRAW * 3 + (NROW + NPULLED) * DIM)

typedef struct job {
    char ep[3][96];
    char list2[300], list3[300];
    int reshard; /* 1: grow at 10, shrink at 20 */
    const char *start; /* the list the workers start with (list2 when NULL) */
    int from, to;      /* steps [from, to) (0, STEPS when both 0); from > 0: optimizer state restored */
    kvps_worker *keep[NW]; /* to > 0: the workers stay, unfinished (a job stopped mid-run) */
    float final[NW][NV];
    uint64_t third_keys; /* keys the third server held after the grow (its stats, read by worker 0) */
    uint64_t third_rows; /* and table rows */
    uint64_t third_bytes; /* and bytes of keys */
} job;
static kvps_server *srv[3];

static float grad(int rank, int t, size_t i) { return (float)(((rank + 1) * (int)(i % 7 + 1) * (t % 5 + 1)) % 13) * 0.01f - 0.05f; }

static void worker_main(kt_wk *x) {
    job *j = (job *)x->ws->user;
    int rank = x->rank;
    kvps_worker *w = NULL;
    int from = j->from, to = j->to ? j->to : STEPS;
    kvps_result rc = kvps_worker_create(&(kvps_worker_desc){.servers = x->ws->servers, .rank = rank,
                                                            .num_workers = NW, .min_slice = 256}, &w);
    kvps_tensor t[NT];
    uint64_t keys[NRAW];
    size_t lens[NRAW];
    for (int i = 0; i < NRAW; i++) { keys[i] = 77 + (uint64_t)i * 1000; lens[i] = 3; }
    static const char *names[NT] = {"layer.w", "layer.b"};
    kvps_optim mom = {.rule = KVPS_RULE_MOMENTUM, .lr = 0.1f, .momentum = 0.9f};
    for (int i = 0; i < NT && rc == KVPS_OK; i++) {
        rc = kvps_worker_tensor(w, names[i], tlen[i], &t[i]);
        kvps_req oq;
        if (rc == KVPS_OK && rank == 0 && from == 0) rc = kvps_worker_tensor_optim(w, t[i], &mom, &oq);
        if (rc == KVPS_OK && rank == 0 && from == 0) rc = kvps_worker_wait(w, oq, 20000);
    }
    /* a sparse table: row k (id 1000003 k + 17) pushed by worker k mod NW alone */
    kvps_table emb;
    kvps_req tq;
    uint64_t ids[NROW + NPULLED];
    for (int k = 0; k < NROW + NPULLED; k++) ids[k] = 1000003ull * (uint64_t)k + 17;
    if (rc == KVPS_OK)
        rc = kvps_worker_table(w, &(kvps_table_desc){.name = "emb", .dim = DIM, .opt = mom, .init_scale = 0.1f, .seed = 9},
                               &emb, &tq);
    if (rc == KVPS_OK) rc = kvps_worker_wait(w, tq, 20000);
    kvps_req bq; /* the rule is set before anyone pushes */
    if (rc == KVPS_OK) rc = kvps_worker_barrier(w, &bq);
    if (rc == KVPS_OK) rc = kvps_worker_wait(w, bq, 20000);
    float *g = (float *)calloc(5000, sizeof(float));
    float *out = j->final[rank];
    for (int step = from; step < to && rc == KVPS_OK; step++) {
        if (j->reshard && (step == 10 || step == 20)) {
            rc = kvps_worker_reshard(w, step == 10 ? j->list3 : j->list2, 20000);
            if (rc != KVPS_OK) break;
            if (step == 10 && rank == 0 && srv[2]) {
                kvps_server_stats st;
                kvps_server_stats_get(srv[2], &st);
                j->third_keys = st.keys;
                j->third_rows = st.table_rows;
                j->third_bytes = st.value_bytes;
            }
        }
        kvps_req q[NT + 1];
        size_t off = 0;
        for (int i = 0; i < NT && rc == KVPS_OK; i++) {
            for (size_t e = 0; e < tlen[i]; e++) g[e] = grad(rank, step, e + i);
            rc = kvps_worker_pushpull_tensor(w, t[i], g, out + off, &q[i]);
            if (rc == KVPS_OK) rc = kvps_worker_wait(w, q[i], 20000); /* (g is reused) */
            off += tlen[i];
        }
        for (size_t e = 0; e < NRAW * 3; e++) g[e] = grad(rank, step, e + 9);
        if (rc == KVPS_OK) rc = kvps_worker_pushpull(w, keys, g, out + off, lens, NRAW, &q[NT]);
        if (rc == KVPS_OK) rc = kvps_worker_wait(w, q[NT], 20000);
        uint64_t mine[NROW / NW];
        for (int k = rank, n = 0; k < NROW; k += NW, n++) {
            mine[n] = ids[k];
            for (int d = 0; d < DIM; d++) g[n * DIM + d] = grad(rank, step, (size_t)(k * DIM + d));
        }
        if (rc == KVPS_OK) rc = kvps_worker_push_rows(w, emb, mine, g, NROW / NW, &tq);
        if (rc == KVPS_OK) rc = kvps_worker_wait(w, tq, 20000);
    }
    if (rc == KVPS_OK && to == STEPS) { /* every row, once every worker has pushed its last */
        kvps_req bq3;
        rc = kvps_worker_barrier(w, &bq3);
        if (rc == KVPS_OK) rc = kvps_worker_wait(w, bq3, 20000);
        if (rc == KVPS_OK) rc = kvps_worker_pull_rows(w, emb, ids, out + 5000 + 300 + NRAW * 3, NROW + NPULLED, &tq);
        if (rc == KVPS_OK) rc = kvps_worker_wait(w, tq, 20000);
    }
    if (rc != KVPS_OK) kt_wk_fail(x, "%s: %.299s", kvps_result_str(rc), kvps_worker_last_error(w));
    free(g);
    if (j->to && rc == KVPS_OK) { /* stopped mid-run: every round done, nobody finished */
        kvps_req bq2;
        rc = kvps_worker_barrier(w, &bq2);
        if (rc == KVPS_OK) rc = kvps_worker_wait(w, bq2, 20000);
        if (rc != KVPS_OK) kt_wk_fail(x, "barrier: %s", kvps_result_str(rc));
        j->keep[rank] = w;
        return;
    }
    kvps_worker_destroy(&w);
}

/* The job's NW workers; each one that failed is reported, named by `what`. */
static void run_workers(job *j, const char *what) {
    kt_workers ws;
    kt_workers_init(&ws, what, worker_main, NW, j->start ? j->start : j->list2, NULL);
    ws.user = j;
    kt_workers_run(&ws);
}

static void run_job(job *j, const char *tag, int reshard) {
    memset(j, 0, sizeof *j);
    j->reshard = reshard;
    for (int i = 0; i < 3; i++) snprintf(j->ep[i], sizeof j->ep[i], "ipc://@kvps-reshard-%s-%d-%d", tag, (int)getpid(), i);
    snprintf(j->list2, sizeof j->list2, "%.95s,%.95s", j->ep[0], j->ep[1]);
    snprintf(j->list3, sizeof j->list3, "%.95s,%.95s,%.95s", j->ep[0], j->ep[1], j->ep[2]);
    for (int i = 0; i < 3; i++) {
        srv[i] = NULL;
        if (i == 2 && !reshard) continue;
        KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = j->ep[i], .rank = i, .num_workers = NW}, &srv[i]));
        if (srv[i]) KT_OK(kvps_server_start(srv[i]));
    }
    run_workers(j, tag);
    for (int i = 0; i < 3; i++) {
        if (!srv[i]) continue;
        KT_CHECK(kvps_server_wait(srv[i], 10000) == KVPS_OK, "%s: server %d did not stop by itself", tag, i);
        kvps_server_destroy(&srv[i]);
    }
}

static job fixed, moved;

static void test_grow_shrink_bit_identical(void) {
    run_job(&fixed, "fixed", 0);
    run_job(&moved, "moved", 1);
    size_t nv = NV, diff = 0, first = nv;
    for (int r = 0; r < NW; r++)
        for (size_t i = 0; i < nv; i++)
            if (memcmp(&fixed.final[r][i], &moved.final[r][i], sizeof(float)) != 0) {
                if (first == nv) first = i;
                diff++;
            }
    KT_CHECK(diff == 0, "%zu weights differ from the fixed run's, the first at %zu: %.9g vs %.9g", diff, first,
             first < nv ? (double)moved.final[0][first] : 0.0, first < nv ? (double)fixed.final[0][first] : 0.0);
    KT_CHECK(fixed.final[0][0] != 0.0f, "the weights did not move");
    /* 13 keys: 2 slices of layer.w (10,000 B each), 1 of layer.b (1,200 B), 10 raw keys (12 B): the
       grow gives the third server what fits under the mean (7,106 B) without moving a 10,000 B slice */
    KT_CHECK(moved.third_keys >= 1 && moved.third_keys <= 12 && moved.third_bytes > 0 && moved.third_bytes <= 21320 / 3,
             "the third server held %llu of 13 keys, %llu of 21,320 bytes", (unsigned long long)moved.third_keys,
             (unsigned long long)moved.third_bytes);
    /* 64 rows pushed in steps 0-9 (the pulled-only rows are made at the end): about a third */
    KT_CHECK(moved.third_rows >= 8 && moved.third_rows <= 40, "the third server held %llu of 64 table rows",
             (unsigned long long)moved.third_rows);
    KT_CHECK(fixed.final[0][NV - 1] != 0.0f && fixed.final[0][NV - NPULLED * DIM - 1] != fixed.final[0][NV - 1],
             "the table's rows are not what they should be");
    printf("  the third server held %llu of 13 keys (%llu of 21,320 bytes) and %llu of 64 table rows after the grow\n",
           (unsigned long long)moved.third_keys, (unsigned long long)moved.third_bytes, (unsigned long long)moved.third_rows);
}

/* Weights of the run in j against the fixed run's: how many differ. */
static size_t count_diff(const job *j, size_t *first) {
    size_t nv = NV, diff = 0;
    *first = nv;
    for (int r = 0; r < NW; r++)
        for (size_t i = 0; i < nv; i++)
            if (memcmp(&fixed.final[r][i], &j->final[r][i], sizeof(float)) != 0) {
                if (*first == nv) *first = i;
                diff++;
            }
    return diff;
}

static job restarted;

static void test_restart_after_grow(void) {
    job *j = &restarted;
    memset(j, 0, sizeof *j);
    char path[3][128];
    for (int i = 0; i < 3; i++) {
        snprintf(j->ep[i], sizeof j->ep[i], "ipc://@kvps-reshard-restart-%d-%d", (int)getpid(), i);
        snprintf(path[i], sizeof path[i], "/tmp/kvps-reshard-ckpt-%d-%d", (int)getpid(), i);
    }
    snprintf(j->list2, sizeof j->list2, "%.95s,%.95s", j->ep[0], j->ep[1]);
    snprintf(j->list3, sizeof j->list3, "%.95s,%.95s,%.95s", j->ep[0], j->ep[1], j->ep[2]);
    /* 1. steps 0-14 with the grow at 10; the servers checkpoint; everything stops */
    for (int i = 0; i < 3; i++) {
        KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = j->ep[i], .rank = i, .num_workers = NW,
                                                     .checkpoint_path = path[i]}, &srv[i]));
        KT_OK(kvps_server_start(srv[i]));
    }
    j->reshard = 1;
    j->to = 15;
    run_workers(j, "first part");
    for (int i = 0; i < 3; i++) KT_OK(kvps_server_checkpoint(srv[i], 10000));
    for (int i = 0; i < 3; i++) kvps_server_destroy(&srv[i]);
    for (int r = 0; r < NW; r++) kvps_worker_destroy(&j->keep[r]);
    /* 2. new servers from the checkpoints, new workers with the 3-server list: steps 15-29 */
    for (int i = 0; i < 3; i++) {
        KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = j->ep[i], .rank = i, .num_workers = NW}, &srv[i]));
        KT_OK(kvps_server_restore(srv[i], path[i]));
        KT_OK(kvps_server_start(srv[i]));
    }
    /* a worker that lists one server is told how many the checkpoint's keys were placed for */
    kvps_worker *odd = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = j->ep[0], .rank = 0, .num_workers = NW, .timeout_ms = 5000}, &odd));
    uint64_t key = 77;
    size_t len = 3;
    float v[3];
    kvps_req q;
    kvps_result r = kvps_worker_pull(odd, &key, v, &len, 1, &q);
    if (r == KVPS_OK) r = kvps_worker_wait(odd, q, 5000);
    KT_CHECK(r == KVPS_ERR_CONFIG && strstr(kvps_worker_last_error(odd), "placed by 2 > 3 servers") &&
                 strstr(kvps_worker_last_error(odd), "list of 3"),
             "a worker listing 1 server: %s: %s", kvps_result_str(r), kvps_worker_last_error(odd));
    kvps_worker_destroy(&odd);
    j->start = j->list3;
    j->from = 15;
    j->to = 0;
    run_workers(j, "after the restart");
    for (int i = 0; i < 3; i++) {
        KT_CHECK(kvps_server_wait(srv[i], 10000) == KVPS_OK, "server %d did not stop by itself", i);
        kvps_server_destroy(&srv[i]);
        remove(path[i]);
    }
    size_t first, diff = count_diff(j, &first);
    KT_CHECK(diff == 0, "%zu weights differ from the fixed run's, the first at %zu", diff, first);
}

static void test_reshard_refused(void) {
    char ep[2][96], list[300], bad[300];
    for (int i = 0; i < 2; i++) snprintf(ep[i], sizeof ep[i], "ipc://@kvps-reshard-bad-%d-%d", (int)getpid(), i);
    snprintf(list, sizeof list, "%s,%s", ep[0], ep[1]);
    snprintf(bad, sizeof bad, "%s,%s", ep[1], ep[0]);
    kvps_server *s[2];
    for (int i = 0; i < 2; i++) {
        KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = ep[i], .rank = i, .num_workers = 1}, &s[i]));
        KT_OK(kvps_server_start(s[i]));
    }
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = list, .rank = 0, .num_workers = 1}, &w));
    kvps_result r = kvps_worker_reshard(w, bad, 2000);
    KT_CHECK(r == KVPS_ERR_CONFIG && strstr(kvps_worker_last_error(w), "keep the servers in order"), "%s: %s",
             kvps_result_str(r), kvps_worker_last_error(w));
    uint64_t key = 5;
    float v = 1.0f;
    size_t len = 1;
    kvps_req q;
    KT_OK(kvps_worker_push(w, &key, &v, &len, 1, &q));
    r = kvps_worker_reshard(w, ep[0], 2000);
    KT_CHECK(r == KVPS_ERR_STATE && strstr(kvps_worker_last_error(w), "in flight"), "%s: %s", kvps_result_str(r),
             kvps_worker_last_error(w));
    KT_OK(kvps_worker_wait(w, q, 5000));
    KT_CHECK(kvps_worker_num_servers(w) == 2, "servers: %d", kvps_worker_num_servers(w));
    kvps_worker_destroy(&w);
    for (int i = 0; i < 2; i++) kvps_server_destroy(&s[i]);
}

/* max/mean of the servers' bytes under vmap (n servers) */
/* The stand-in third server: acknowledges every request at once, but worker 1's hello only
   after hold_ms; counts PLACE requests that came while that hello waited. */
typedef struct fake3 { char ep[96]; int hold_ms, stop, hellos, places, places_early; } fake3;
static void *fake3_main(void *arg) {
    fake3 *f = (fake3 *)arg;
    void *ctx = zmq_ctx_new();
    void *r = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0, to = 20;
    zmq_setsockopt(r, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(r, ZMQ_RCVTIMEO, &to, sizeof to);
    zmq_bind(r, f->ep);
    zmq_msg_t held_id;
    kvps__hdr held_h;
    int64_t held_until = 0; /* 0: nothing held */
    while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
        if (held_until && kt_now_ms() >= held_until) {
            kvps__hdr a = kvps__reply_hdr(&held_h, KVPS_OK);
            a.nkeys = 0;
            zmq_msg_send(&held_id, r, ZMQ_SNDMORE);
            zmq_send(r, &a, sizeof a, 0);
            held_until = 0;
        }
        zmq_msg_t fr[3];
        int n = 0, more = 1;
        while (more && n < 3) {
            zmq_msg_init(&fr[n]);
            if (zmq_msg_recv(&fr[n], r, 0) < 0) { zmq_msg_close(&fr[n]); break; }
            more = zmq_msg_more(&fr[n]);
            n++;
        }
        if (n >= 2 && zmq_msg_size(&fr[1]) >= sizeof(kvps__hdr)) {
            kvps__hdr h;
            memcpy(&h, zmq_msg_data(&fr[1]), sizeof h);
            if (h.op == KVPS__OP_PLACE) { f->places++; f->places_early += held_until != 0; }
            if (h.op == KVPS__OP_HELLO) f->hellos++;
            if (h.op == KVPS__OP_HELLO && h.rank == 1 && !held_until && f->hellos <= 2) {
                zmq_msg_init(&held_id);
                zmq_msg_copy(&held_id, &fr[0]);
                held_h = h;
                held_until = kt_now_ms() + f->hold_ms;
            } else {
                kvps__hdr a = kvps__reply_hdr(&h, KVPS_OK);
                a.nkeys = 0;
                zmq_msg_send(&fr[0], r, ZMQ_SNDMORE);
                zmq_send(r, &a, sizeof a, 0);
            }
        }
        for (int i = 0; i < n; i++) zmq_msg_close(&fr[i]);
    }
    if (held_until) zmq_msg_close(&held_id);
    zmq_close(r);
    zmq_ctx_term(ctx);
    return NULL;
}

/* A worker of the 2-server list (servers) that grows to the 3-server list (user). */
static void late_hello_worker(kt_wk *x) {
    kvps_worker *w = NULL;
    kvps_result rc = kvps_worker_create(&(kvps_worker_desc){.servers = x->ws->servers, .rank = x->rank, .num_workers = 2}, &w);
    if (rc == KVPS_OK) rc = kvps_worker_reshard(w, (const char *)x->ws->user, 20000);
    if (rc != KVPS_OK) kt_wk_fail(x, "%s: %.299s", kvps_result_str(rc), w ? kvps_worker_last_error(w) : "create");
    kvps_worker_destroy(&w);
}

/* Servers 0, 1, 2 (2 joins by the reshard), the one at fake_at the stand-in. */
static void hello_before_place(int fake_at) {
    char ep[3][96], list2[300], list3[400];
    static fake3 f;
    memset(&f, 0, sizeof f);
    f.hold_ms = 1500;
    for (int i = 0; i < 3; i++) snprintf(ep[i], sizeof ep[i], "ipc://@kvps-reshard-late-%d-%d-%d", (int)getpid(), fake_at, i);
    snprintf(f.ep, sizeof f.ep, "%s", ep[fake_at]);
    snprintf(list2, sizeof list2, "%s,%s", ep[0], ep[1]);
    snprintf(list3, sizeof list3, "%s,%s", list2, ep[2]);
    kvps_server *s[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        if (i == fake_at) continue;
        KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = ep[i], .rank = i, .num_workers = 2}, &s[i]));
        KT_OK(kvps_server_start(s[i]));
    }
    const char *what = fake_at == 2 ? "the new server held worker 1's hello" : "server 1 held worker 1's first hello";
    pthread_t ft;
    pthread_create(&ft, NULL, fake3_main, &f); /* (the stand-in server's thread) */
    kt_workers ws;
    kt_workers_init(&ws, what, late_hello_worker, 2, list2, NULL); /* (each failure reported) */
    ws.user = list3;
    kt_workers_run(&ws);
    __atomic_store_n(&f.stop, 1, __ATOMIC_RELEASE);
    pthread_join(ft, NULL);
    for (int i = 0; i < 3; i++) kvps_server_destroy(&s[i]);
    KT_CHECK(f.hellos == 2 && f.places == 1, "%s: it heard %d hellos and %d PLACE requests, want 2 and 1", what, f.hellos,
             f.places);
    KT_CHECK(f.places_early == 0, "%s: PLACE reached it while that hello waited for its answer", what);
}
static void test_hello_before_place(void) {
    hello_before_place(2);
    hello_before_place(1); /* the reshard grows the worker's tables while that hello is in flight */
}

static double max_mean(const uint32_t *vmap, uint32_t V, int n, const uint64_t *bytes) {
    uint64_t load[64] = {0}, tot = 0, mx = 0;
    for (uint32_t v = 0; v < V; v++) { load[vmap[v]] += bytes[v]; tot += bytes[v]; }
    for (int i = 0; i < n; i++) mx = load[i] > mx ? load[i] : mx;
    return (double)mx * n / (double)tot;
}

static void test_plan_by_bytes(void) {
    enum { N0 = 10, NMAX = 20, V = 256 * N0 };
    static uint64_t bytes[V];
    static uint32_t vmap[V], byrule[V];
    size_t sizes[RESNET50_TENSORS];
    resnet50_sizes(sizes);
    uint64_t total = 0;
    for (int t = 0; t < RESNET50_TENSORS; t++) { /* cut as kvps_worker_tensor cuts for N0 servers */
        char name[32];
        snprintf(name, sizeof name, "resnet.%d", t);
        uint64_t ns = (sizes[t] + 1023) / 1024, hv = kvps__fnv1a(name) % V;
        ns = ns < N0 ? ns : N0;
        for (uint64_t i = 0; i < ns; i++) bytes[(hv + i) % V] += (sizes[t] / ns + (i < sizes[t] % ns)) * 4;
    }
    for (uint64_t k = 0; k < 10000; k++) bytes[kvps__mix64(k) % V] += 16 * 4;
    for (uint32_t v = 0; v < V; v++) { vmap[v] = byrule[v] = v % N0; total += bytes[v]; }
    kvps__place pl;
    memset(&pl, 0, sizeof pl);
    pl.V = V;
    pl.count = 1;
    pl.n[0] = N0;
    double worst = 0, worst_rule = 0, worst_moved = 0;
    for (int step = 0; step < 2 * (NMAX - N0); step++) {
        int n = step < NMAX - N0 ? N0 + step : NMAX - (step - (NMAX - N0)), n2 = step < NMAX - N0 ? n + 1 : n - 1;
        uint64_t load_leaving = 0, nmoved = 0, before = pl.nmv;
        for (uint32_t v = 0; v < V; v++) load_leaving += vmap[v] >= (uint32_t)n2 ? bytes[v] : 0;
        static uint32_t old[V];
        memcpy(old, vmap, sizeof vmap);
        KT_CHECK(kvps__vmap_plan(vmap, V, n, n2, bytes, &pl.mv, &pl.nmv) == 0, "plan %d -> %d", n, n2);
        pl.n[pl.count] = (uint32_t)n2;
        pl.m[pl.count++] = (uint32_t)(pl.nmv - before);
        kvps__vmap_change(byrule, V, n, n2);
        for (uint32_t v = 0; v < V; v++) {
            KT_CHECK(vmap[v] < (uint32_t)n2, "%d -> %d: shard %u on server %u", n, n2, v, vmap[v]);
            nmoved += old[v] != vmap[v] ? bytes[v] : 0;
        }
        double mm = max_mean(vmap, V, n2, bytes), ideal = n2 > n ? (double)total / n2 : (double)load_leaving;
        double mr = max_mean(byrule, V, n2, bytes), share = (double)nmoved / ideal;
        KT_CHECK(mm <= 1.1, "%d -> %d servers: max/mean %.3f", n, n2, mm);
        KT_CHECK(share <= 1.25, "%d -> %d servers: moved %.3f x the ideal share", n, n2, share);
        if (n2 > n) { /* the newcomer's share of shards, where keys made later land: nearly every
                         shard holds raw keys here, so it has to take small ones, not empty ones */
            uint32_t got = 0;
            for (uint32_t v = 0; v < V; v++) got += vmap[v] == (uint32_t)n;
            KT_CHECK(got >= 9 * (V / (uint32_t)n2) / 10, "%d -> %d servers: the new server has %u shards of %u", n, n2, got, V);
        }
        worst = mm > worst ? mm : worst;
        worst_rule = mr > worst_rule ? mr : worst_rule;
        worst_moved = share > worst_moved ? share : worst_moved;
    }
    const char *why = NULL;
    uint32_t *re = kvps__vmap_of(&pl, &why);
    KT_CHECK(re && memcmp(re, vmap, sizeof vmap) == 0, "the recorded moves replay to another map (%s)", why ? why : "");
    free(re);
    kvps__place_free(&pl);
    printf("  10 -> 20 -> 10 servers: max/mean <= %.3f by bytes (%.3f by shard counts), moved <= %.2f x the ideal\n", worst,
           worst_rule, worst_moved);
}

static const char *dec(const uint32_t *w, size_t n, kvps__place *p) {
    return kvps__place_dec(p, (const unsigned char *)w, n * 4);
}

static void test_placement_refused(void) {
    kvps__place p;
    const char *why;
    uint32_t bad_v[6] = {500, 2, 2, 3, 0, 0};
    why = dec(bad_v, 6, &p);
    KT_CHECK(why && strstr(why, "256"), "V 500 for 2 servers: %s", why ? why : "accepted");
    uint32_t past[8] = {512, 2, 2, 3, 0, 1, 5, 3}; /* shard 5 to server 3 of a 3-server change */
    why = dec(past, 8, &p);
    KT_CHECK(why && strstr(why, "past its change's count"), "a move to server 3 of 3: %s", why ? why : "accepted");
    uint32_t shrink[8] = {768, 2, 3, 2, 0, 1, 2, 0}; /* 3 -> 2 moving only shard 2: shard 5 stays on server 2 */
    why = dec(shrink, 8, &p);
    KT_CHECK(!why, "a well-formed shrink: %s", why ? why : "");
    uint32_t *vm = why ? NULL : kvps__vmap_of(&p, &why);
    KT_CHECK(!vm && why && strstr(why, "past its count"), "a shrink that leaves shards behind: %s", vm ? "replayed" : why);
    free(vm);
    kvps__place_free(&p);
    uint32_t forged[6] = {256u * 65536u, 2, 65536, 1, 0, 0}; /* 65536 -> 1 by counts: 2^24 x 65551 steps */
    int64_t t0 = kt_now_ms();
    why = dec(forged, 6, &p);
    KT_CHECK(why && strstr(why, "too large to replay"), "a forged placement: %s", why ? why : "accepted");
    printf("  a forged placement (65536 -> 1 servers by counts) refused in %lld ms: %s\n", (long long)(kt_now_ms() - t0),
           why ? why : "");
}

int main(void) {
    kvps_log_set_level(getenv("KT_VERBOSE") ? KVPS_LOG_INFO : KVPS_LOG_NONE);
    KT_RUN(test_grow_shrink_bit_identical, 120);
    KT_RUN(test_restart_after_grow, 120);
    KT_RUN(test_reshard_refused, 60);
    KT_RUN(test_hello_before_place, 60);
    KT_RUN(test_plan_by_bytes, 60);
    KT_RUN(test_placement_refused, 30);
    return kt_finish();
}
