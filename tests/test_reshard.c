/* test_reshard.c - growing and shrinking the server set while BSP training goes on
   (kvps_worker_reshard, RESHARD in kvps.h). The oracle is a run of the same job on a fixed set of
   2 servers: BSP sums each round in rank order and applies the same rule to the same state, so a
   job whose keys moved between servers must end with the same bits, every one of them.

     test_grow_shrink_bit_identical  4 worker threads, BSP + momentum, two tensors and raw keys;
                                     2 -> 3 servers at step 10, 3 -> 2 at step 20: every final
                                     weight equal, bit for bit, to the fixed run's; the third
                                     server held keys (about a third) and stopped by itself
     test_restart_after_grow         the same job stopped after the grow (step 15): the three
                                     servers checkpoint, new servers restore, new workers with
                                     the 3-server list take the placement the checkpoints record
                                     (2 > 3) from their hellos' answers and go on, shrinking to 2
                                     at step 20: every final weight equal to the fixed run's; a
                                     worker listing 1 server is told the checkpoint's placement
     test_reshard_refused            a list that does not keep the old servers in order, and a
                                     reshard with a request in flight: refused, named, nothing
                                     moved */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"
#include <pthread.h>

enum { NW = 4, STEPS = 30, NT = 2, NRAW = 10 };
static const size_t tlen[NT] = {5000, 300};

typedef struct job {
    char ep[3][96];
    char list2[300], list3[300];
    int reshard; /* 1: grow at 10, shrink at 20 */
    const char *start; /* the list the workers start with (list2 when NULL) */
    int from, to;      /* steps [from, to) (0, STEPS when both 0); from > 0: optimizer state restored */
    kvps_worker *keep[NW]; /* to > 0: the workers stay, unfinished (a job stopped mid-run) */
    float final[NW][5000 + 300 + NRAW * 3];
    kvps_result err[NW];
    char errtext[NW][300];
    uint64_t third_keys; /* keys the third server held after the grow (its stats, read by worker 0) */
} job;
static kvps_server *srv[3];

static float grad(int rank, int t, size_t i) { return (float)(((rank + 1) * (int)(i % 7 + 1) * (t % 5 + 1)) % 13) * 0.01f - 0.05f; }

static void *worker_main(void *arg) {
    job *j = (job *)((void **)arg)[0];
    int rank = (int)(intptr_t)((void **)arg)[1];
    kvps_worker *w = NULL;
    int from = j->from, to = j->to ? j->to : STEPS;
    kvps_result rc = kvps_worker_create(&(kvps_worker_desc){.servers = j->start ? j->start : j->list2, .rank = rank,
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
    }
    j->err[rank] = rc;
    if (rc != KVPS_OK) snprintf(j->errtext[rank], sizeof j->errtext[rank], "%.299s", kvps_worker_last_error(w));
    free(g);
    if (j->to && rc == KVPS_OK) { /* stopped mid-run: every round done, nobody finished */
        kvps_req bq2;
        rc = kvps_worker_barrier(w, &bq2);
        if (rc == KVPS_OK) rc = kvps_worker_wait(w, bq2, 20000);
        j->err[rank] = rc;
        j->keep[rank] = w;
        return NULL;
    }
    kvps_worker_destroy(&w);
    return NULL;
}

static void run_workers(job *j) {
    pthread_t th[NW];
    void *args[NW][2];
    for (int r = 0; r < NW; r++) {
        args[r][0] = j;
        args[r][1] = (void *)(intptr_t)r;
        pthread_create(&th[r], NULL, worker_main, args[r]);
    }
    for (int r = 0; r < NW; r++) pthread_join(th[r], NULL);
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
    run_workers(j);
    for (int r = 0; r < NW; r++) KT_CHECK(j->err[r] == KVPS_OK, "%s: worker %d: %s: %s", tag, r, kvps_result_str(j->err[r]), j->errtext[r]);
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
    size_t nv = 5000 + 300 + NRAW * 3, diff = 0, first = nv;
    for (int r = 0; r < NW; r++)
        for (size_t i = 0; i < nv; i++)
            if (memcmp(&fixed.final[r][i], &moved.final[r][i], sizeof(float)) != 0) {
                if (first == nv) first = i;
                diff++;
            }
    KT_CHECK(diff == 0, "%zu weights differ from the fixed run's, the first at %zu: %.9g vs %.9g", diff, first,
             first < nv ? (double)moved.final[0][first] : 0.0, first < nv ? (double)fixed.final[0][first] : 0.0);
    KT_CHECK(fixed.final[0][0] != 0.0f, "the weights did not move");
    /* 12 keys: 2 slices of layer.w, 1 of layer.b, 10 raw keys: the third server takes about a third */
    KT_CHECK(moved.third_keys >= 1 && moved.third_keys <= 8, "the third server held %llu of 13 keys",
             (unsigned long long)moved.third_keys);
    printf("  the third server held %llu of 13 keys after the grow\n", (unsigned long long)moved.third_keys);
}

/* Weights of the run in j against the fixed run's: how many differ. */
static size_t count_diff(const job *j, size_t *first) {
    size_t nv = 5000 + 300 + NRAW * 3, diff = 0;
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
    run_workers(j);
    for (int r = 0; r < NW; r++) KT_CHECK(j->err[r] == KVPS_OK, "first part: worker %d: %s: %s", r, kvps_result_str(j->err[r]),
                                          j->errtext[r]);
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
    run_workers(j);
    for (int r2 = 0; r2 < NW; r2++) KT_CHECK(j->err[r2] == KVPS_OK, "after the restart: worker %d: %s: %s", r2,
                                             kvps_result_str(j->err[r2]), j->errtext[r2]);
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

int main(void) {
    kvps_log_set_level(getenv("KT_VERBOSE") ? KVPS_LOG_INFO : KVPS_LOG_NONE);
    KT_RUN(test_grow_shrink_bit_identical, 120);
    KT_RUN(test_restart_after_grow, 120);
    KT_RUN(test_reshard_refused, 60);
    return kt_finish();
}
