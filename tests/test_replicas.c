/* test_replicas.c - replicated shards (REPLICAS in kvps.h), with real server processes killed by
   SIGKILL. The oracle is arithmetic: every worker pushes exact integers (sums stay far below
   2^24, so float addition is exact whatever the order), so each key's final value is known; a
   push lost or applied twice changes it.

     test_async_primary_killed   2 shards x 2 replicas, 4 worker threads pushing (4 requests in
                                 flight each), ASYNC + SUM; shard 0's primary SIGKILLed mid-run:
                                 every sum exact, the backup took over, the job ends by itself
     test_async_backup_killed    the same with shard 0's backup killed: the primary goes on alone
     test_bsp_primary_killed     BSP + SGD over 2 shards x 2 replicas; the primary killed: the
                                 final weights equal the sequential oracle's, bit for bit; again
                                 with the workers reading from the backups (.read_local)
     test_replacement_then_kill  the backup killed, a replacement started on its endpoint gets a
                                 snapshot and the stream while pushes go on; then the primary is
                                 killed too: the replacement takes over, every sum exact
     test_reply_waits_for_backup a push is not answered while shard 0's backup is stopped
                                 (SIGSTOP), until heartbeats drop it; resumed, it rejoins
     test_all_replicas_gone      both replicas of shard 0 killed: the wait is PEER_LOST naming
                                 the shard
     test_wrong_shard_refused    a server of another shard placed in a chain refuses the snapshot
                                 (another layout); the primary goes on without it
     test_env_replicas           kvps_env_read with chains: kvps-run's KVPS_REPLICA, mpirun's
                                 mapping (process p: shard p % n, replica p / n), uneven chains
     test_grow_then_kill         BSP + SUM on 2 shards x 2 replicas grows to 3 (kvps_worker_reshard
                                 with a third chain); then the new shard's primary is killed: the
                                 keys moved to it had reached its backup, every sum is exact
     test_bsp_half_replicated,   (see each: BSP rounds down the chain, a request half replicated
     test_bsp_sends_rounds       when the primary dies, 1/m of the pushed bytes)
     test_bsp_read_local         .read_local in this process (1 x 2 on ipc, BSP + momentum): every
                                 step's pulled values are the oracle's, the backup answered the
                                 READs; with the backup stopped mid-run, the primary takes them
     test_read_local_async       .read_local on an async shard: the backup says it never answers
                                 READs, the worker reads from the primary, every sum exact
     test_read_local_cut         .read_local with connections destroyed (issue 27: a pushpull got
                                 the round before its own): 1 x 2 in this process, each replica
                                 behind an ipc proxy that can hold, cut and refuse connections.
                                 A push lost with the primary's connection while its READ waits
                                 at the backup, whose connection is cut next (the READ goes to
                                 the primary before the push is re-sent); a READ refused while
                                 the push is lost; 2 workers with both connections cut every 4
                                 steps. Every pushpull's value is the oracle's
     test_forged_repl_refused    a stranger process sends every replica REPL of every kind
                                 (epoch 9), REPL hellos with another token and BYEs: all refused
                                 (KVPS_ERR_AUTH), no failover, every sum exact
     test_worker_lost_ends_chains  a worker vanishes (BSP, elastic, and BSP with the loss the job's
                                 last event): every server process, backups too, ends by itself
                                 with KVPS_ERR_PEER_LOST; elastic sums exact
     test_clean_finish_quiet     the primary finds its backup gone at a clean finish (held until
                                 the backup has ended): nothing logged at warning level
     test_stopped_primary_steps_down  the primary SIGSTOPped past its backup's take-over, a push
                                 sent to it during the stop: once resumed it answers nothing as
                                 primary, steps down, and the push reaches the new primary */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>

enum { NW = 4, NSH = 2, NREP = 2, NKEY = 6 };

typedef struct job {
    char ep[NSH][NREP][96];
    char chain[NSH][200];
    char servers[512];
    pid_t pid[NSH][NREP];
    kvps_consistency cons;
    kvps_update update;
    float lr;
    int steps;                   /* BSP: every worker's; async: at most (the test says stop) */
    int stop;                    /* async: the workers stop pushing (atomic) */
    int done_steps[NW];          /* per worker: pushes completed (atomic) */
    float final[NW][NKEY * 3];
    int grow_at;                 /* BSP: the step before which every worker grows to servers3 */
    char ep2[NREP][96], chain2[200], servers3[800]; /* the third shard that grow adds */
    pid_t pid2[NREP];
    int read_local;              /* the workers' .read_local */
    int elastic;                 /* the servers' .elastic */
} job;

static void job_init(job *j, const char *name, kvps_consistency cons, kvps_update upd, int steps) {
    memset(j, 0, sizeof *j);
    j->cons = cons;
    j->update = upd;
    j->lr = 0.5f;
    j->steps = steps;
    size_t used = 0;
    for (int s = 0; s < NSH; s++) {
        for (int r = 0; r < NREP; r++)
            snprintf(j->ep[s][r], sizeof j->ep[s][r], "ipc://@kvps-test-%s-%d-%d-%d", name, (int)getpid(), s, r);
        snprintf(j->chain[s], sizeof j->chain[s], "%s|%s", j->ep[s][0], j->ep[s][1]);
        used += (size_t)snprintf(j->servers + used, sizeof j->servers - used, "%s%s", s ? "," : "", j->chain[s]);
    }
}

static kvps_server_desc job_desc(const job *j, int s, int r, int replacement) {
    kvps_server_desc d = {.endpoint = j->ep[s][r], .num_workers = NW, .rank = s, .consistency = j->cons,
                          .update = j->update, .lr = j->update == KVPS_UPDATE_SGD ? j->lr : 0.0f,
                          .heartbeat_ms = 200, .peer_timeout_ms = 1000, .elastic = j->elastic};
    d.replicas = j->chain[s];
    d.replica = r;
    d.replacement = replacement;
    return d;
}

/* A server process; with report_synced, it writes one byte to the pipe once it holds the shard.
   It exits 0 when it stopped with KVPS_OK, 5 with KVPS_ERR_PEER_LOST (the job ended with a
   worker lost), 6 with another result. */
static pid_t server_proc(const kvps_server_desc *d, int *synced_fd) {
    int p[2];
    if (pipe(p) != 0) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        signal(SIGTERM, kt_proc_on_term);
        if (kvps_server_create(d, &kt_proc_srv) != KVPS_OK) _exit(2);
        kvps_result r;
        if (!synced_fd) { /* as a launcher's server process does: run, destroy at once, exit */
            r = kvps_server_run(kt_proc_srv);
            kvps_server_destroy(&kt_proc_srv);
            _exit(r == KVPS_OK ? 0 : r == KVPS_ERR_PEER_LOST ? 5 : 6);
        }
        if (kvps_server_start(kt_proc_srv) != KVPS_OK) _exit(3);
        int told = 0;
        while ((r = kvps_server_wait(kt_proc_srv, 5)) == KVPS_ERR_TIMEOUT) {
            kvps_server_stats st;
            kvps_server_stats_get(kt_proc_srv, &st);
            if (!told && st.replicas_live >= 1 && !st.primary) {
                if (write(p[1], "s", 1) != 1) _exit(4);
                told = 1;
            }
        }
        kvps_server_destroy(&kt_proc_srv);
        _exit(r == KVPS_OK ? 0 : r == KVPS_ERR_PEER_LOST ? 5 : 6);
    }
    close(p[1]);
    if (synced_fd) *synced_fd = p[0];
    else close(p[0]);
    return pid;
}

static void job_start(job *j) {
    for (int s = 0; s < NSH; s++)
        for (int r = 0; r < NREP; r++) {
            kvps_server_desc d = job_desc(j, s, r, 0);
            j->pid[s][r] = server_proc(&d, NULL);
        }
}

/* A worker of the job: heartbeats as the servers', the next replica after failover_ms. */
static kvps_result job_worker(const job *j, int rank, int failover_ms, kvps_worker **w) {
    return kvps_worker_create(&(kvps_worker_desc){.servers = j->servers, .rank = rank, .num_workers = NW, .timeout_ms = 20000,
                                                  .heartbeat_ms = 200, .peer_timeout_ms = 1000, .failover_ms = failover_ms,
                                                  .read_local = j->read_local},
                              w);
}

/* A raw key that lives on shard 0 (the first from `from` on). */
static uint64_t key_on_shard0_from(uint64_t k) {
    while (kvps__mix64(k) % NSH != 0) k++;
    return k;
}
static uint64_t key_on_shard0(void) { return key_on_shard0_from(1); }

/* Key i of this test: raw key 1000 + i, length 3. */
static void worker_main(kt_wk *x) {
    job *j = (job *)x->ws->user;
    int rank = x->rank;
    kvps_worker *w = NULL;
    kvps_result rc = job_worker(j, rank, 300, &w);
    if (rc != KVPS_OK) { kt_wk_fail(x, "create: %s", kvps_result_str(rc)); return; }
    uint64_t keys[NKEY];
    size_t lens[NKEY];
    float vals[4][NKEY * 3];
    for (int i = 0; i < NKEY; i++) { keys[i] = 1000 + (uint64_t)i; lens[i] = 3; }
    kvps_req q[4] = {0};
    int inflight = j->cons == KVPS_BSP ? 1 : 4;
    for (int t = 0; t < j->steps && rc == KVPS_OK && !__atomic_load_n(&j->stop, __ATOMIC_ACQUIRE); t++) {
        if (j->grow_at && t == j->grow_at && (rc = kvps_worker_reshard(w, j->servers3, 20000)) != KVPS_OK) break;
        int slot = t % inflight;
        if (q[slot]) {
            rc = kvps_worker_wait(w, q[slot], -1);
            q[slot] = 0;
            if (rc != KVPS_OK) break;
        }
        for (int i = 0; i < NKEY * 3; i++) vals[slot][i] = (float)(rank + 1 + (i % 3)); /* exact small integers */
        if (j->cons == KVPS_BSP) { /* a step: push, then pull the weights after it */
            rc = kvps_worker_pushpull(w, keys, vals[slot], j->final[rank], lens, NKEY, &q[slot]);
            if (rc == KVPS_OK) { rc = kvps_worker_wait(w, q[slot], -1); q[slot] = 0; }
        } else {
            rc = kvps_worker_push(w, keys, vals[slot], lens, NKEY, &q[slot]);
        }
        __atomic_store_n(&j->done_steps[rank], t + 1, __ATOMIC_RELEASE);
    }
    for (int i = 0; i < inflight && rc == KVPS_OK; i++)
        if (q[i]) rc = kvps_worker_wait(w, q[i], -1);
    kvps_req b;
    if (rc == KVPS_OK) rc = kvps_worker_barrier(w, &b);
    if (rc == KVPS_OK) rc = kvps_worker_wait(w, b, -1);
    if (rc == KVPS_OK) rc = kvps_worker_pull(w, keys, j->final[rank], lens, NKEY, &b);
    if (rc == KVPS_OK) rc = kvps_worker_wait(w, b, -1);
    if (rc != KVPS_OK) kt_wk_fail(x, "%s: %.399s", kvps_result_str(rc), kvps_worker_last_error(w));
    kvps_worker_destroy(&w);
}

/* The job's NW workers (worker_main); workers_join reports each one that failed, named by what. */
static kt_workers jw;
static void workers_start(job *j) {
    kt_workers_init(&jw, "", worker_main, NW, j->servers, NULL);
    jw.user = j;
    kt_workers_start(&jw);
}
static void workers_join(const char *what) {
    jw.label = what;
    kt_workers_join(&jw);
}
static int min_steps(const job *j) {
    int m = j->steps;
    for (int r = 0; r < NW; r++)
        if (__atomic_load_n(&j->done_steps[r], __ATOMIC_ACQUIRE) < m) m = __atomic_load_n(&j->done_steps[r], __ATOMIC_ACQUIRE);
    return m;
}
static void wait_steps(const job *j, int n) {
    int64_t end = kt_now_ms() + 30000;
    while (min_steps(j) < n && kt_now_ms() < end) kt_sleep_ms(1);
}

/* Every key's sum exact (every worker OK: workers_join): worker r's pushes each add r + 1 + i % 3. */
static void check_sums(const job *j, const char *what) {
    for (int r = 0; r < NW; r++)
        for (int i = 0; i < NKEY * 3; i++) {
            float want = 0.0f;
            for (int x = 0; x < NW; x++) want += (float)j->done_steps[x] * (float)(x + 1 + i % 3);
            KT_CHECK(j->final[r][i] == want, "%s: worker %d sees key %d element %d = %.1f, want %.1f (a push %s)", what, r,
                     i / 3, i % 3, (double)j->final[r][i], (double)want, j->final[r][i] < want ? "lost" : "applied twice");
            if (j->final[r][i] != want) return;
        }
}

/* The server processes end by themselves with exit code `code` (0: every worker finished; 5:
   the job ended with a worker lost); killed ones are reaped. */
static void reap_code(job *j, const char *what, int code) {
    for (int s = 0; s < NSH + 1; s++)
        for (int r = 0; r < NREP; r++) {
            pid_t pid = s < NSH ? j->pid[s][r] : j->pid2[r];
            if (pid <= 0) continue;
            int st = kt_wait_pid(pid, kt_now_ms() + 10000);
            KT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == code, "%s: server %d replica %d did not end by itself "
                     "with exit code %d (status %d%s)", what, s, r, code, st, st == -1 ? ": still running, killed" : "");
        }
}
static void reap(job *j, const char *what) { reap_code(j, what, 0); }
static void kill_server(job *j, int s, int r) {
    kill(j->pid[s][r], SIGKILL);
    waitpid(j->pid[s][r], NULL, 0);
    j->pid[s][r] = 0;
}

static job J;

static void async_kill(int victim_replica) {
    int steps = kt_quick() ? 150 : 400;
    job_init(&J, victim_replica ? "ab" : "ap", KVPS_ASYNC, KVPS_UPDATE_ACCUMULATE, 1 << 30);
    job_start(&J);
    workers_start(&J);
    wait_steps(&J, steps / 3);
    kill_server(&J, 0, victim_replica);
    wait_steps(&J, steps); /* going on after the kill */
    __atomic_store_n(&J.stop, 1, __ATOMIC_RELEASE);
    workers_join(victim_replica ? "backup killed" : "primary killed");
    check_sums(&J, victim_replica ? "backup killed" : "primary killed");
    reap(&J, "after the kill");
}

static void test_async_primary_killed(void) { async_kill(0); }
static void test_async_backup_killed(void) { async_kill(1); }

/* BSP + SGD: w_{t+1} = w_t - lr * (sum / NW); the oracle runs the same float operations.
   read_local: the workers' pulls are READs from the backup (all on this host), which takes over. */
static void bsp_primary_killed(int read_local) {
    int steps = kt_quick() ? 40 : 100;
    job_init(&J, read_local ? "bspr" : "bsp", KVPS_BSP, KVPS_UPDATE_SGD, steps);
    J.read_local = read_local;
    job_start(&J);
    workers_start(&J);
    wait_steps(&J, steps / 2);
    kill_server(&J, 0, 0);
    workers_join(read_local ? "BSP, .read_local, the primary killed" : "BSP, the primary killed");
    for (int i = 0; i < NKEY * 3; i++) {
        float wv = 0.0f;
        for (int t = 0; t < steps; t++) {
            float sum = 0.0f;
            for (int r = 0; r < NW; r++) sum += (float)(r + 1 + (i % 3));
            wv -= J.lr * (sum / (float)NW);
        }
        for (int r = 0; r < NW; r++)
            KT_CHECK(J.final[r][i] == wv, "%sworker %d element %d: %.9g, the oracle %.9g", read_local ? ".read_local: " : "", r, i,
                     (double)J.final[r][i], (double)wv);
    }
    reap(&J, "bsp");
}
static void test_bsp_primary_killed(void) {
    bsp_primary_killed(0);
    bsp_primary_killed(1);
}

/* 2 -> 3 shards, each of 2 replicas, while BSP (SUM) goes on; then the new shard's primary is
   killed. The 6 keys' 72 bytes: the planner gives the new shard the 2 keys that fit under the
   mean (24 bytes), through its primary, which forwards the IMPORT to its backup as any request:
   after the kill the backup serves them, and every sum is exact. */
static void test_grow_then_kill(void) {
    int steps = kt_quick() ? 30 : 60;
    job_init(&J, "grow", KVPS_BSP, KVPS_UPDATE_ACCUMULATE, steps);
    for (int r = 0; r < NREP; r++) snprintf(J.ep2[r], sizeof J.ep2[r], "ipc://@kvps-test-grow-%d-2-%d", (int)getpid(), r);
    snprintf(J.chain2, sizeof J.chain2, "%s|%s", J.ep2[0], J.ep2[1]);
    snprintf(J.servers3, sizeof J.servers3, "%s,%s", J.servers, J.chain2);
    J.grow_at = steps / 3;
    job_start(&J);
    for (int r = 0; r < NREP; r++) {
        kvps_server_desc d = job_desc(&J, 0, r, 0);
        d.endpoint = J.ep2[r];
        d.rank = NSH;
        d.replicas = J.chain2;
        J.pid2[r] = server_proc(&d, NULL);
    }
    workers_start(&J);
    wait_steps(&J, steps / 2); /* after the grow */
    kill(J.pid2[0], SIGKILL);
    waitpid(J.pid2[0], NULL, 0);
    J.pid2[0] = 0;
    workers_join("grown to 3 shards, the new primary killed");
    check_sums(&J, "grown to 3 shards, the new primary killed");
    reap(&J, "grow");
}

static void test_replacement_then_kill(void) {
    int steps = kt_quick() ? 100 : 200;
    job_init(&J, "rep", KVPS_ASYNC, KVPS_UPDATE_ACCUMULATE, 1 << 30);
    job_start(&J);
    workers_start(&J);
    wait_steps(&J, steps / 6);
    kill_server(&J, 0, 1);
    kt_sleep_ms(100);
    int synced = -1;
    kvps_server_desc d = job_desc(&J, 0, 1, 1);
    J.pid[0][1] = server_proc(&d, &synced);
    char c = 0;
    struct pollfd pf = {synced, POLLIN, 0};
    ssize_t got = poll(&pf, 1, 20000) == 1 ? read(synced, &c, 1) : 0; /* the replacement holds the shard */
    close(synced);
    KT_CHECK(got == 1, "the replacement never said it holds the shard");
    wait_steps(&J, min_steps(&J) + steps); /* pushes through the new chain */
    kill_server(&J, 0, 0);
    wait_steps(&J, min_steps(&J) + steps); /* and after the primary's death */
    __atomic_store_n(&J.stop, 1, __ATOMIC_RELEASE);
    workers_join("replacement, then the primary killed");
    check_sums(&J, "replacement, then the primary killed");
    reap(&J, "replacement");
}

static void test_all_replicas_gone(void) {
    job_init(&J, "gone", KVPS_ASYNC, KVPS_UPDATE_ACCUMULATE, 1);
    job_start(&J);
    kvps_worker *w = NULL;
    KT_OK(job_worker(&J, 0, 200, &w));
    uint64_t key = 7;
    float v = 1.0f;
    size_t len = 1;
    kvps_req q;
    KT_OK(kvps_worker_push(w, &key, &v, &len, 1, &q));
    KT_OK(kvps_worker_wait(w, q, -1));
    kill_server(&J, 0, 0);
    kill_server(&J, 0, 1);
    key = key_on_shard0();
    KT_OK(kvps_worker_push(w, &key, &v, &len, 1, &q));
    kvps_result r = kvps_worker_wait(w, q, 1500);
    const char *e = kvps_worker_last_error(w);
    KT_CHECK(r == KVPS_ERR_PEER_LOST && strstr(e, "shard 0") && strstr(e, "no replica answers"), "%s: '%s'",
             kvps_result_str(r), e);
    kvps_worker_destroy(&w);
    for (int s = 1; s < NSH; s++)
        for (int rr = 0; rr < NREP; rr++) { kill_server(&J, s, rr); }
}

/* The guarantee itself: no answer while a live backup has not acknowledged what it depends on.
   Shard 0's backup is stopped (SIGSTOP): a push is not answered (it would be at once without the
   hold); once heartbeats drop the stopped backup (peer_timeout_ms), the primary goes on alone and
   answers. Resumed, the backup rejoins with a snapshot, and every sum is exact. */
static void test_reply_waits_for_backup(void) {
    job_init(&J, "hold", KVPS_ASYNC, KVPS_UPDATE_ACCUMULATE, 1);
    job_start(&J);
    kvps_worker *w = NULL;
    KT_OK(job_worker(&J, 0, 300, &w));
    uint64_t key = key_on_shard0();
    float v = 1.0f, got = 0.0f;
    size_t len = 1;
    kvps_req q;
    for (int i = 0; i < 3; i++) { /* the chain is up: these are answered */
        KT_OK(kvps_worker_push(w, &key, &v, &len, 1, &q));
        KT_OK(kvps_worker_wait(w, q, 5000));
    }
    kill(J.pid[0][1], SIGSTOP);
    int st; /* stopped, not only signalled: a busy machine let the backup apply and acknowledge the next push first */
    while (waitpid(J.pid[0][1], &st, WUNTRACED) < 0 && errno == EINTR) {}
    KT_OK(kvps_worker_push(w, &key, &v, &len, 1, &q));
    kvps_result r = kvps_worker_wait(w, q, 300);
    KT_CHECK(r == KVPS_ERR_TIMEOUT, "a push was answered (%s) while shard 0's backup, stopped, could not hold it",
             kvps_result_str(r));
    if (r == KVPS_ERR_TIMEOUT) KT_OK(kvps_worker_wait(w, q, 10000)); /* the backup is dropped: the primary goes on */
    kill(J.pid[0][1], SIGCONT);
    for (int i = 0; i < 3; i++) {
        KT_OK(kvps_worker_push(w, &key, &v, &len, 1, &q));
        KT_OK(kvps_worker_wait(w, q, 5000));
    }
    KT_OK(kvps_worker_pull(w, &key, &got, &len, 1, &q));
    KT_OK(kvps_worker_wait(w, q, 5000));
    KT_CHECK(got == 7.0f, "sum %g, want 7", (double)got);
    kvps_worker_destroy(&w);
    for (int s = 0; s < NSH; s++)
        for (int rr = 0; rr < NREP; rr++) kill_server(&J, s, rr);
}

/* BSP sends rounds down the chain, not pushes, so a request of two keys can be half replicated
   when the primary dies: worker 0 pushes keys a and b in one request, workers 1-3 push only a.
   a's round completes and reaches the backup (workers 1-3 are answered); b's cannot, so worker 0
   is not answered. The primary is SIGKILLed; workers 1-3 push b to the backup, which takes over,
   and worker 0's request is re-sent there: its push of a must not be applied again (its round
   is in the backup already), its push of b must. The oracle: a = b = 1 + 2 + 3 + 4 after one
   round each, and worker 0's pull (which waits for the round its own pushes reach) answers. */
/* Drives the workers (one thread, and their requests depend on each other's) until each of
   q[0..n) is done: KVPS_OK, or the first error (*which: whose). */
static kvps_result drive(kvps_worker **w, kvps_req *q, int n, int timeout_ms, int *which) {
    int64_t end = kt_now_ms() + timeout_ms;
    for (;;) {
        int left = 0;
        for (int i = 0; i < n; i++) {
            if (!q[i]) continue;
            int done = 0;
            kvps_result rc = kvps_worker_test(w[i], q[i], &done);
            if (rc != KVPS_OK) { *which = i; return rc; }
            if (done) q[i] = 0;
            else left++;
        }
        if (!left) return KVPS_OK;
        if (kt_now_ms() > end) { *which = -1; return KVPS_ERR_TIMEOUT; }
        kt_sleep_ms(1);
    }
}

static void test_bsp_half_replicated(void) {
    job_init(&J, "half", KVPS_BSP, KVPS_UPDATE_ACCUMULATE, 1);
    job_start(&J);
    kvps_worker *w[NW] = {0};
    kvps_req qs[NW];
    int who = -1;
    for (int r = 0; r < NW; r++) KT_OK(job_worker(&J, r, 300, &w[r]));
    for (int r = 0; r < NW; r++) KT_OK(kvps_worker_barrier(w[r], &qs[r])); /* every hello answered: pushes go at once */
    KT_OK(drive(w, qs, NW, 20000, &who));
    uint64_t ka = key_on_shard0_from(5000), kb = key_on_shard0_from(ka + 1), both[2] = {ka, kb};
    size_t lens[2] = {4, 4};
    float v[NW][8], got[8];
    for (int r = 0; r < NW; r++)
        for (int i = 0; i < 8; i++) v[r][i] = (float)(r + 1);
    kvps_req q0, q[NW], qb[NW];
    KT_OK(kvps_worker_push(w[0], both, v[0], lens, 2, &q0));
    for (int r = 1; r < NW; r++) KT_OK(kvps_worker_push(w[r], &ka, v[r], lens, 1, &q[r]));
    q[0] = 0;
    KT_OK(drive(w, q, NW, 20000, &who)); /* a's round is on both replicas */
    kvps_result r0 = kvps_worker_wait(w[0], q0, 300);
    KT_CHECK(r0 == KVPS_ERR_TIMEOUT, "worker 0's push of a and b was answered (%s) before b's round was complete",
             kvps_result_str(r0));
    kill_server(&J, 0, 0);
    qb[0] = q0;
    for (int r = 1; r < NW; r++) KT_OK(kvps_worker_push(w[r], &kb, v[r], lens, 1, &qb[r]));
    kvps_result dr = drive(w, qb, NW, 20000, &who);
    KT_CHECK(dr == KVPS_OK, "after the kill: worker %d: %s (%s)", who, kvps_result_str(dr), who >= 0 ? kvps_worker_last_error(w[who]) : "");
    kvps_req pq;
    KT_OK(kvps_worker_pull(w[0], both, got, lens, 2, &pq));
    kvps_result pr = kvps_worker_wait(w[0], pq, 5000);
    KT_CHECK(pr == KVPS_OK, "worker 0's pull: %s (%s): its push of a was applied again, as a second round's",
             kvps_result_str(pr), kvps_worker_last_error(w[0]));
    for (int i = 0; pr == KVPS_OK && i < 8; i++)
        KT_CHECK(got[i] == 10.0f, "key %s element %d = %g, want 10 (a push %s)", i < 4 ? "a" : "b", i % 4, (double)got[i],
                 got[i] < 10.0f ? "lost" : "applied twice");
    for (int r = 0; r < NW; r++) kvps_worker_destroy(&w[r]);
    reap(&J, "half replicated");
}

/* What goes down the chain under BSP: one sum per round, not every push. One shard of 2
   replicas in this process, 4 workers pushpulling a tensor of 4096 floats with momentum for 20
   steps: the primary sends its backup 1/4 of the pushed bytes (a round's sum and its record),
   where forwarding the pushes would send all of them; and the backup ends holding the same
   bits, momentum and round as the primary. */
enum { TR_LEN = 4096, TR_STEPS = 20 };
static float tr_want[TR_STEPS][TR_LEN]; /* test_bsp_read_local: the weights after each step, by the oracle */
static int tr_steps[NW];                /* steps each worker has finished */
/* A worker of chain x->ws->servers, .read_local when user points to a nonzero int; its record
   (int) is the first step whose values were not the oracle's (-1: none; read_local only). */
static void traffic_worker(kt_wk *x) {
    int read_local = *(const int *)x->ws->user, *bad_step = (int *)x->mine, rank = x->rank;
    kvps_worker *w = NULL;
    *bad_step = -1;
    kvps_result rc = kvps_worker_create(&(kvps_worker_desc){.servers = x->ws->servers, .rank = rank, .num_workers = NW,
                                                             .timeout_ms = 20000, .heartbeat_ms = 100, .peer_timeout_ms = 500,
                                                             .read_local = read_local}, &w);
    static float g[NW][TR_LEN], out[NW][TR_LEN];
    kvps_tensor ten;
    kvps_req q;
    if (rc == KVPS_OK) rc = kvps_worker_tensor(w, "w", TR_LEN, &ten);
    if (rc == KVPS_OK && rank == 0) {
        kvps_optim o = {.rule = KVPS_RULE_MOMENTUM, .lr = 0.1f, .momentum = 0.9f};
        rc = kvps_worker_tensor_optim(w, ten, &o, &q);
        if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, -1);
    }
    if (rc == KVPS_OK) rc = kvps_worker_barrier(w, &q);
    if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, -1);
    for (int s = 0; s < TR_STEPS && rc == KVPS_OK; s++) {
        for (int i = 0; i < TR_LEN; i++) g[rank][i] = (float)((rank + 1) * (i % 7 + 1)) * 0.001f * (float)(s + 1);
        rc = kvps_worker_pushpull_tensor(w, ten, g[rank], out[rank], &q);
        if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, -1);
        if (rc == KVPS_OK && read_local && *bad_step < 0 && memcmp(out[rank], tr_want[s], sizeof tr_want[s]) != 0) *bad_step = s;
        __atomic_store_n(&tr_steps[rank], s + 1, __ATOMIC_RELEASE);
    }
    if (rc != KVPS_OK) kt_wk_fail(x, "%s: %.299s", kvps_result_str(rc), w ? kvps_worker_last_error(w) : "create");
    kvps_worker_destroy(&w);
}

static void test_bsp_sends_rounds(void) {
    char ep[2][96], chain[200];
    for (int r = 0; r < 2; r++) snprintf(ep[r], sizeof ep[r], "ipc://@kvps-test-rounds-%d-%d", (int)getpid(), r);
    snprintf(chain, sizeof chain, "%s|%s", ep[0], ep[1]);
    kvps_server *srv[2] = {0};
    for (int r = 1; r >= 0; r--) { /* the backup first: the primary's first snapshot finds it */
        kvps_server_desc d = {.endpoint = ep[r], .num_workers = NW, .consistency = KVPS_BSP, .update = KVPS_UPDATE_SGD,
                              .lr = 0.1f, .replicas = chain, .replica = r};
        KT_OK(kvps_server_create(&d, &srv[r]));
        KT_OK(kvps_server_start(srv[r]));
    }
    int read_local = 0, bad_step[NW];
    kt_workers ws;
    kt_workers_init(&ws, "rounds down the chain", traffic_worker, NW, chain, NULL); /* (each failure reported) */
    ws.user = &read_local;
    ws.each = bad_step;
    ws.each_size = sizeof bad_step[0];
    kt_workers_run(&ws);
    for (int r = 0; r < 2; r++) KT_OK(kvps_server_wait(srv[r], 10000)); /* every worker said goodbye */
    kvps_server_stats st[2];
    for (int r = 0; r < 2; r++) kvps_server_stats_get(srv[r], &st[r]);
    double pushed = (double)TR_STEPS * NW * TR_LEN * sizeof(float), sent = (double)st[0].repl_bytes;
    KT_CHECK(st[0].primary == 1 && st[1].primary == 0 && st[1].replicas_live == 1, "roles: primary %llu/%llu, backup holds %llu",
             (unsigned long long)st[0].primary, (unsigned long long)st[1].primary, (unsigned long long)st[1].replicas_live);
    KT_CHECK(sent >= pushed / NW && sent < pushed / NW * 1.1, "the primary sent its backup %.0f bytes for %.0f pushed: want "
             "1/%d of them (one sum a round), up to 10%% more for the records", sent, pushed, NW);
    KT_CHECK(srv[0]->nkeys == 1 && srv[1]->nkeys == 1, "keys: %u on the primary, %u on the backup, want the tensor's 1",
             srv[0]->nkeys, srv[1]->nkeys);
    if (srv[0]->nkeys == 1 && srv[1]->nkeys == 1) {
        const kvps__key *a = srv[0]->keys[0], *b = srv[1]->keys[0];
        KT_CHECK(a->round == TR_STEPS && b->round == TR_STEPS, "rounds %llu and %llu, want %d", (unsigned long long)a->round,
                 (unsigned long long)b->round, TR_STEPS);
        KT_CHECK(memcmp(a->value, b->value, TR_LEN * sizeof(float)) == 0, "the backup's value differs from the primary's");
        KT_CHECK(a->state && b->state && memcmp(a->state, b->state, TR_LEN * sizeof(float)) == 0,
                 "the backup's momentum differs from the primary's");
    }
    for (int r = 0; r < 2; r++) kvps_server_destroy(&srv[r]);
}

/* .read_local: 1 shard x 2 replicas in this process, on ipc (both "on this host"), 4 workers,
   BSP + momentum; each pushpull's push goes to the primary and its pull, as READ, to the backup.
   Every step's result is the oracle's, bit for bit (the update rule in float over rank-order
   sums); the backup answered READs and the primary almost none of the pulls. stop_backup: the
   backup is stopped after step 8 and the workers, whose READs then go to the primary, end with
   the oracle's values too. */
static void bsp_read_local(int stop_backup) {
    kvps_optim o = {.rule = KVPS_RULE_MOMENTUM, .lr = 0.1f, .momentum = 0.9f};
    static float wv[TR_LEN], mv[TR_LEN];
    memset(wv, 0, sizeof wv);
    memset(mv, 0, sizeof mv);
    for (int s = 0; s < TR_STEPS; s++) {
        for (int i = 0; i < TR_LEN; i++) {
            float sum = 0.0f;
            for (int r = 0; r < NW; r++) sum += (float)((r + 1) * (i % 7 + 1)) * 0.001f * (float)(s + 1);
            kt_optim_apply(&o, &wv[i], &mv[i], NULL, sum, (float)NW, 1.0f, 1.0f);
        }
        memcpy(tr_want[s], wv, sizeof wv);
    }
    char ep[2][96], chain[200];
    for (int r = 0; r < 2; r++) snprintf(ep[r], sizeof ep[r], "ipc://@kvps-test-reads-%d-%d-%d", (int)getpid(), stop_backup, r);
    snprintf(chain, sizeof chain, "%s|%s", ep[0], ep[1]);
    kvps_server *srv[2] = {0};
    for (int r = 1; r >= 0; r--) {
        kvps_server_desc d = {.endpoint = ep[r], .num_workers = NW, .consistency = KVPS_BSP, .update = KVPS_UPDATE_SGD,
                              .lr = 0.1f, .replicas = chain, .replica = r, .heartbeat_ms = 100, .peer_timeout_ms = 500};
        KT_OK(kvps_server_create(&d, &srv[r]));
        KT_OK(kvps_server_start(srv[r]));
    }
    const char *what = stop_backup ? "backup stopped after step 8" : "both replicas up";
    int read_local = 1, bad_step[NW];
    kt_workers ws;
    kt_workers_init(&ws, what, traffic_worker, NW, chain, NULL);
    ws.user = &read_local;
    ws.each = bad_step;
    ws.each_size = sizeof bad_step[0];
    memset(tr_steps, 0, sizeof tr_steps);
    kt_workers_start(&ws);
    kvps_server_stats st[2];
    memset(st, 0, sizeof st);
    if (stop_backup) {
        int64_t end = kt_now_ms() + 30000;
        while (__atomic_load_n(&tr_steps[0], __ATOMIC_ACQUIRE) < 8 && kt_now_ms() < end) kt_sleep_ms(1);
        kvps_server_stats_get(srv[1], &st[1]);
        kvps_server_destroy(&srv[1]);
    }
    kt_workers_join(&ws); /* (each failure reported) */
    for (int r = 0; r < NW; r++)
        KT_CHECK(bad_step[r] < 0, "%s: worker %d pulled other values than the oracle's at step %d", what, r, bad_step[r]);
    KT_OK(kvps_server_wait(srv[0], 10000));
    kvps_server_stats_get(srv[0], &st[0]);
    if (srv[1]) {
        KT_OK(kvps_server_wait(srv[1], 10000));
        kvps_server_stats_get(srv[1], &st[1]);
    }
    uint64_t pulls = (uint64_t)TR_STEPS * NW; /* one slice per pushpull */
    KT_CHECK(st[1].reads >= pulls / 4, "%s: the backup answered %llu READs of %llu pulls", what, (unsigned long long)st[1].reads,
             (unsigned long long)pulls);
    if (!stop_backup)
        KT_CHECK(st[0].pulls + st[1].reads == pulls && st[0].pulls <= NW * 2, "the primary answered %llu pulls, the backup %llu "
                 "READs: want %llu in all, the primary's only the first steps'", (unsigned long long)st[0].pulls,
                 (unsigned long long)st[1].reads, (unsigned long long)pulls);
    printf("  .read_local, %s: the backup answered %llu of %llu pulls, the primary %llu\n", what,
           (unsigned long long)st[1].reads, (unsigned long long)pulls, (unsigned long long)st[0].pulls);
    for (int r = 0; r < 2; r++) kvps_server_destroy(&srv[r]);
}
static void test_bsp_read_local(void) {
    bsp_read_local(0);
    bsp_read_local(1);
}

/* .read_local where the shard is not BSP (async, 1 x 2): the backup answers the first READ that
   it never answers READs, the worker reads from the primary from then on, and every pushpull
   still returns the sum so far. */
static void test_read_local_async(void) {
    char ep[2][96], chain[200];
    for (int r = 0; r < 2; r++) snprintf(ep[r], sizeof ep[r], "ipc://@kvps-test-reada-%d-%d", (int)getpid(), r);
    snprintf(chain, sizeof chain, "%s|%s", ep[0], ep[1]);
    kvps_server *srv[2] = {0};
    for (int r = 1; r >= 0; r--) {
        kvps_server_desc d = {.endpoint = ep[r], .num_workers = 1, .consistency = KVPS_ASYNC, .update = KVPS_UPDATE_ACCUMULATE,
                              .replicas = chain, .replica = r};
        KT_OK(kvps_server_create(&d, &srv[r]));
        KT_OK(kvps_server_start(srv[r]));
    }
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = chain, .rank = 0, .num_workers = 1, .timeout_ms = 10000,
                                                 .read_local = 1}, &w));
    uint64_t key = 5;
    size_t len = 2;
    float one[2] = {1.0f, 2.0f}, got[2] = {0, 0};
    for (int t = 1; t <= 10; t++) {
        kvps_req q;
        KT_OK(kvps_worker_pushpull(w, &key, one, got, &len, 1, &q));
        KT_OK(kvps_worker_wait(w, q, 10000));
        KT_CHECK(got[0] == (float)t && got[1] == 2.0f * (float)t, "pushpull %d: %g %g, want %d %d", t, (double)got[0],
                 (double)got[1], t, 2 * t);
    }
    KT_CHECK(w->rsocks && w->rsocks[0] && w->rnever[0] == 1, "the worker did not learn that the backup never answers READs");
    kvps_worker_destroy(&w);
    kvps_server_stats st;
    kvps_server_stats_get(srv[1], &st);
    KT_CHECK(st.reads == 0, "the async backup answered %llu READs", (unsigned long long)st.reads);
    for (int r = 0; r < 2; r++) kvps_server_destroy(&srv[r]);
}

/* ---- an ipc:// proxy whose connections can be cut (test_read_local_cut) ----------------------
   Between the worker and one server, on abstract Unix sockets (ipc://@name): what one side
   writes is passed to the other. cut closes every connection at once, bytes not yet passed on
   included (they are lost, as on a connection destroyed under load); hold leaves what the
   workers send unread in the socket (held counts it); shut accepts nothing (a worker's reconnect
   waits in the backlog until shut is cleared). */
typedef struct uproxy {
    char name[96], up[96]; /* the abstract names it listens on and passes to (no '@') */
    int lfd;
    int stop, cut, cuts_done, hold, shut, held, turns; /* atomics (turns: rounds of its loop) */
    pthread_t th;
} uproxy;

static socklen_t uproxy_addr(struct sockaddr_un *a, const char *name) {
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    size_t n = strlen(name);
    memcpy(a->sun_path + 1, name, n); /* sun_path[0] = 0: the abstract namespace, as ZeroMQ's '@' */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static void *uproxy_main(void *arg) {
    uproxy *p = (uproxy *)arg;
    enum { MAXC = 16 };
    int cfd[MAXC], ufd[MAXC], n = 0;
    char buf[65536];
    while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
        __atomic_add_fetch(&p->turns, 1, __ATOMIC_ACQ_REL);
        if (__atomic_load_n(&p->cut, __ATOMIC_ACQUIRE)) {
            for (int i = 0; i < n; i++) { close(cfd[i]); close(ufd[i]); }
            n = 0;
            __atomic_store_n(&p->held, 0, __ATOMIC_RELEASE);
            __atomic_store_n(&p->cut, 0, __ATOMIC_RELEASE);
            __atomic_add_fetch(&p->cuts_done, 1, __ATOMIC_ACQ_REL);
        }
        int hold = __atomic_load_n(&p->hold, __ATOMIC_ACQUIRE), shut = __atomic_load_n(&p->shut, __ATOMIC_ACQUIRE);
        if (hold) {
            int held = 0;
            for (int i = 0; i < n; i++) {
                int b = 0;
                if (ioctl(cfd[i], FIONREAD, &b) == 0) held += b;
            }
            __atomic_store_n(&p->held, held, __ATOMIC_RELEASE);
        }
        struct pollfd pf[1 + 2 * MAXC];
        pf[0] = (struct pollfd){p->lfd, (short)(shut || n == MAXC ? 0 : POLLIN), 0};
        for (int i = 0; i < n; i++) {
            pf[1 + 2 * i] = (struct pollfd){cfd[i], (short)(hold ? 0 : POLLIN), 0};
            pf[2 + 2 * i] = (struct pollfd){ufd[i], POLLIN, 0};
        }
        if (poll(pf, (nfds_t)(1 + 2 * n), 5) <= 0) continue;
        int polled = n; /* a connection accepted now has no poll result yet */
        if (pf[0].revents & POLLIN) {
            int c = accept(p->lfd, NULL, NULL), u = c >= 0 ? socket(AF_UNIX, SOCK_STREAM, 0) : -1;
            struct sockaddr_un a;
            socklen_t al = uproxy_addr(&a, p->up);
            if (u >= 0 && connect(u, (struct sockaddr *)&a, al) == 0) { cfd[n] = c; ufd[n] = u; n++; }
            else { if (c >= 0) close(c); if (u >= 0) close(u); }
        }
        kt_proxy_copy(pf, polled, cfd, ufd, &n, 0, buf, sizeof buf);
    }
    for (int i = 0; i < n; i++) { close(cfd[i]); close(ufd[i]); }
    return NULL;
}

static int uproxy_start(uproxy *p, const char *name, const char *up) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(p->up, sizeof p->up, "%s", up);
    struct sockaddr_un a;
    socklen_t al = uproxy_addr(&a, p->name);
    p->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&a, al) != 0 || listen(p->lfd, 16) != 0) {
        if (p->lfd >= 0) close(p->lfd);
        p->lfd = -1;
        return -1;
    }
    if (pthread_create(&p->th, NULL, uproxy_main, p) != 0) { close(p->lfd); p->lfd = -1; return -1; }
    return 0;
}
static void uproxy_cut(uproxy *p) {
    int want = __atomic_load_n(&p->cuts_done, __ATOMIC_ACQUIRE) + 1;
    __atomic_store_n(&p->cut, 1, __ATOMIC_RELEASE);
    while (__atomic_load_n(&p->cuts_done, __ATOMIC_ACQUIRE) < want) kt_sleep_ms(1);
}
/* Sets p's hold or shut flag and returns once p's loop has begun a round with it. */
static void uproxy_set(uproxy *p, int *flag, int on) {
    __atomic_store_n(flag, on, __ATOMIC_RELEASE);
    int want = __atomic_load_n(&p->turns, __ATOMIC_ACQUIRE) + 2; /* (the round under way may have read it before) */
    while (__atomic_load_n(&p->turns, __ATOMIC_ACQUIRE) < want) kt_sleep_ms(1);
}
static void uproxy_stop(uproxy *p) {
    if (p->lfd < 0) return;
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
    pthread_join(p->th, NULL);
    close(p->lfd);
    p->lfd = -1;
}

/* Calls test on worker w's request q (q 0: the worker's progress alone: replies, connection
   events) until cond() holds (1), or q ends or ms pass (0). */
static int drive_until(kvps_worker *w, kvps_req q, int (*cond)(void *), void *arg, int ms) {
    int64_t end = kt_now_ms() + ms;
    while (!cond(arg)) {
        int done = 0;
        kvps_result r = q ? kvps_worker_test(w, q, &done) : kvps__progress(w, 0);
        if (r != KVPS_OK || done || kt_now_ms() > end) return 0;
        kt_sleep_ms(1);
    }
    return 1;
}

/* Issue 27: with .read_local, a pushpull whose READ goes to the primary after a connection loss
   must still get the round holding its own push, never the round before. 1 shard x 2 replicas in
   this process, each reached through a uproxy; the worker reads from the backup (its "local"
   replica) and pushes to the primary. Every value a pushpull returns is checked against the
   oracle: each worker pushes exact integers c(step, rank, i) and SUM keeps their running total. */
enum { CUT_LEN = 1024, CUT_NW = 2, CUT_STEPS = 120, CUT_EVERY = 4 };
static float cut_c(int step, int rank, int i) { return (float)((rank + 1) * (i % 5 + 1) * (step % 4 + 1)); }
/* The value after step t, when workers 0..nw-1 each pushed steps 0..t. */
static float cut_want(int t, int nw, int i) {
    float v = 0.0f;
    for (int s = 0; s <= t; s++)
        for (int r = 0; r < nw; r++) v += cut_c(s, r, i);
    return v;
}
typedef struct cutjob {
    char sname[2][96], pname[2][96], chain[220], list[220];
    kvps_server *srv[2];
    uproxy px[2];
} cutjob;
static int cutjob_start(cutjob *c, const char *tag, int nw) {
    memset(c, 0, sizeof *c);
    for (int r = 0; r < 2; r++) {
        snprintf(c->sname[r], sizeof c->sname[r], "kvps-test-%s-%d-s%d", tag, (int)getpid(), r);
        snprintf(c->pname[r], sizeof c->pname[r], "kvps-test-%s-%d-p%d", tag, (int)getpid(), r);
        c->px[r].lfd = -1;
    }
    snprintf(c->chain, sizeof c->chain, "ipc://@%s|ipc://@%s", c->sname[0], c->sname[1]);
    snprintf(c->list, sizeof c->list, "ipc://@%s|ipc://@%s", c->pname[0], c->pname[1]);
    for (int r = 1; r >= 0; r--) { /* the backup first: the primary's first snapshot finds it */
        char ep[120];
        snprintf(ep, sizeof ep, "ipc://@%s", c->sname[r]);
        kvps_server_desc d = {.endpoint = ep, .num_workers = nw, .consistency = KVPS_BSP, .update = KVPS_UPDATE_ACCUMULATE,
                              .replicas = c->chain, .replica = r, .heartbeat_ms = 200, .peer_timeout_ms = 5000};
        if (kvps_server_create(&d, &c->srv[r]) != KVPS_OK || kvps_server_start(c->srv[r]) != KVPS_OK) return -1;
    }
    for (int r = 0; r < 2; r++)
        if (uproxy_start(&c->px[r], c->pname[r], c->sname[r]) != 0) return -1;
    return 0;
}
static void cutjob_end(cutjob *c) {
    for (int r = 0; r < 2; r++) /* (every worker said goodbye: the servers end by themselves) */
        if (c->srv[r]) KT_CHECK(kvps_server_wait(c->srv[r], 10000) == KVPS_OK, "server replica %d did not end by itself", r);
    for (int r = 0; r < 2; r++) kvps_server_destroy(&c->srv[r]);
    for (int r = 0; r < 2; r++) uproxy_stop(&c->px[r]);
}
static kvps_result cut_worker_create(const cutjob *c, int rank, int nw, int failover_ms, kvps_worker **w) {
    return kvps_worker_create(&(kvps_worker_desc){.servers = c->list, .rank = rank, .num_workers = nw, .timeout_ms = 20000,
                                                  .heartbeat_ms = 200, .peer_timeout_ms = 5000, .failover_ms = failover_ms,
                                                  .read_local = 1}, w);
}
/* Checks values v after step t of nw workers against the oracle: -1 when right, else the first
   element that is not (*got, *want). */
static int cut_check(const float *v, int t, int nw, float *got, float *want) {
    for (int i = 0; i < CUT_LEN; i++)
        if (v[i] != cut_want(t, nw, i)) { *got = v[i]; *want = cut_want(t, nw, i); return i; }
    return -1;
}

typedef struct cutstage { uproxy *p0; kvps_server *backup; uint64_t stalls; kvps_worker *w; kvps_req q; uproxy *p1; } cutstage;
static int cut_push_held(void *a) { /* the push sits unread in front of the primary, the READ waits at the backup */
    cutstage *x = (cutstage *)a;
    kvps_server_stats st;
    kvps_server_stats_get(x->backup, &st);
    return __atomic_load_n(&x->p0->held, __ATOMIC_ACQUIRE) >= CUT_LEN * (int)sizeof(float) && st.stalls > x->stalls;
}
static int cut_both_held(void *a) { /* the push sits in front of the primary, the READ in front of the backup */
    cutstage *x = (cutstage *)a;
    return __atomic_load_n(&x->p0->held, __ATOMIC_ACQUIRE) >= CUT_LEN * (int)sizeof(float) &&
           __atomic_load_n(&x->p1->held, __ATOMIC_ACQUIRE) >= KVPS__HDR + KVPS__KENT + 8;
}
static int cut_refusal_taken(void *a) { /* the worker took the backup's refusal of the READ: it waits for the push */
    cutstage *x = (cutstage *)a;
    kvps__req *qa = kvps__req_get(x->w, x->q), *qb = qa && qa->next ? kvps__req_get(x->w, qa->next) : NULL;
    return qb && qb->read && qb->rwait && qb->rwait[0];
}
static int cut_primary_seen(void *a) { return ((cutstage *)a)->w->down[0]; } /* the worker has seen it go */
static int cut_backup_seen(void *a) { return !((cutstage *)a)->w->rup[0]; }
static int cut_backup_back(void *a) { return ((cutstage *)a)->w->rup[0]; }

/* The bad moment, made on purpose (one worker): the push of step 4 is lost with the primary's
   connection while its READ waits at the backup; once the worker has seen that drop, the
   backup's connection is cut too, so the READ goes to the primary, whose connection is not
   back yet (the proxies accept nothing until the worker has seen both drops). When it is, what
   was queued for it goes first, then the re-sent push. The pushpull must return the round with
   step 4's push (a pull sent there before the push was answered got step 3's), and so must
   every step after. */
static void read_local_cut_once(void) {
    cutjob c;
    int up = cutjob_start(&c, "cut1", 1) == 0;
    KT_CHECK(up, "servers or proxies did not start");
    kvps_worker *w = NULL;
    if (up) KT_OK(cut_worker_create(&c, 0, 1, 60000, &w));
    KT_CHECK(w && w->rj && w->rj[0] == 1, "the worker does not read from replica 1 (its proxy is on this host)");
    if (!w || !w->rj || w->rj[0] != 1) {
        kvps_worker_destroy(&w);
        cutjob_end(&c);
        return;
    }
    static float g[CUT_LEN], v[CUT_LEN];
    uint64_t key = 7;
    size_t len = CUT_LEN;
    for (int t = 0; t < 8; t++) {
        for (int i = 0; i < CUT_LEN; i++) g[i] = cut_c(t, 0, i);
        kvps_req q;
        cutstage x = {&c.px[0], c.srv[1], 0, w, 0, &c.px[1]};
        if (t == 4) {
            kvps_server_stats st;
            kvps_server_stats_get(c.srv[1], &st);
            x.stalls = st.stalls;
            KT_CHECK(kvps__reads_on(w), "step 4: the worker does not read from the backup");
            uproxy_set(&c.px[0], &c.px[0].hold, 1);
        }
        KT_OK(kvps_worker_pushpull(w, &key, g, v, &len, 1, &q));
        if (t == 4) {
            KT_CHECK(drive_until(w, q, cut_push_held, &x, 20000), "step 4: the push was not held (%d bytes) or the READ did not wait "
                     "at the backup", __atomic_load_n(&c.px[0].held, __ATOMIC_ACQUIRE));
            for (int r = 0; r < 2; r++) uproxy_set(&c.px[r], &c.px[r].shut, 1);
            uproxy_cut(&c.px[0]); /* the held push is gone */
            uproxy_set(&c.px[0], &c.px[0].hold, 0);
            KT_CHECK(drive_until(w, q, cut_primary_seen, &x, 20000), "step 4: the worker did not see the primary's connection drop");
            uproxy_cut(&c.px[1]); /* its READ goes to the primary now, whose connection is not back */
            KT_CHECK(drive_until(w, q, cut_backup_seen, &x, 20000), "step 4: the worker did not see the backup's connection drop");
            for (int r = 0; r < 2; r++) uproxy_set(&c.px[r], &c.px[r].shut, 0);
        }
        kvps_result rc = kvps_worker_wait(w, q, -1);
        KT_CHECK(rc == KVPS_OK, "step %d: %s: %s", t, kvps_result_str(rc), kvps_worker_last_error(w));
        float got = 0, want = 0;
        int bad = rc == KVPS_OK ? cut_check(v, t, 1, &got, &want) : -1;
        KT_CHECK(bad < 0, "step %d element %d: got %g want %g%s", t, bad, (double)got, (double)want,
                 bad >= 0 && got == cut_want(t - 1, 1, bad) ? " (the step before's: a stale read)" : "");
        if (rc != KVPS_OK || bad >= 0) break;
    }
    /* A READ the backup refuses (key 8 was only initialised: no round of this worker's on it
       yet) while the push is lost with the primary's connection: its pull must wait for the
       push's answer, not go out now into what is queued for that connection. */
    uint64_t k2 = 8;
    static float v0[CUT_LEN];
    for (int i = 0; i < CUT_LEN; i++) { v0[i] = (float)(100 + i % 3); g[i] = cut_c(9, 0, i); }
    kvps_req q;
    KT_OK(kvps_worker_init(w, &k2, v0, &len, 1, &q));
    KT_OK(kvps_worker_wait(w, q, -1));
    cutstage x = {&c.px[0], c.srv[1], 0, w, 0, &c.px[1]};
    KT_CHECK(drive_until(w, 0, cut_backup_back, &x, 20000), "the worker's connection to the backup did not come back");
    for (int r = 0; r < 2; r++) uproxy_set(&c.px[r], &c.px[r].hold, 1);
    KT_OK(kvps_worker_pushpull(w, &k2, g, v, &len, 1, &q));
    x.q = q;
    KT_CHECK(drive_until(w, q, cut_both_held, &x, 20000), "key 8: the push (%d bytes) or the READ (%d bytes) was not held",
             __atomic_load_n(&c.px[0].held, __ATOMIC_ACQUIRE), __atomic_load_n(&c.px[1].held, __ATOMIC_ACQUIRE));
    uproxy_set(&c.px[0], &c.px[0].shut, 1);
    uproxy_cut(&c.px[0]); /* the held push is gone */
    uproxy_set(&c.px[0], &c.px[0].hold, 0);
    KT_CHECK(drive_until(w, q, cut_primary_seen, &x, 20000), "key 8: the worker did not see the primary's connection drop");
    uproxy_set(&c.px[1], &c.px[1].hold, 0); /* the READ reaches the backup, which refuses it */
    drive_until(w, q, cut_refusal_taken, &x, 2000); /* (a worker that pulls at once does that meanwhile) */
    uproxy_set(&c.px[0], &c.px[0].shut, 0);
    kvps_result rc = kvps_worker_wait(w, q, -1);
    KT_CHECK(rc == KVPS_OK, "key 8: %s: %s", kvps_result_str(rc), kvps_worker_last_error(w));
    for (int i = 0; rc == KVPS_OK && i < CUT_LEN; i++)
        if (v[i] != v0[i] + g[i]) {
            KT_CHECK(v[i] == v0[i] + g[i], "key 8 element %d: got %g want %g%s", i, (double)v[i], (double)(v0[i] + g[i]),
                     v[i] == v0[i] ? " (the value before the push: a stale read)" : "");
            break;
        }
    kvps_server_stats st;
    kvps_server_stats_get(c.srv[1], &st);
    KT_CHECK(st.reads > 0, "the backup answered no READ");
    kvps_worker_destroy(&w);
    cutjob_end(&c);
}

/* The same under load: 2 workers in threads pushpull CUT_STEPS steps; every CUT_EVERY steps of
   worker 0 the test holds what goes to the primary until a push is in it (or 200 ms pass), then
   cuts the primary's connections and the backup's (the other order the next time). Each worker
   checks every step's value. */
/* A worker's record: steps done (atomic), the first step whose value was not the oracle's. */
typedef struct cutw { int bad_step, bad_elem, steps; float got, want; } cutw;
static void cut_worker(kt_wk *wk) {
    const cutjob *c = (const cutjob *)wk->ws->user;
    cutw *x = (cutw *)wk->mine;
    kvps_worker *w = NULL;
    float *g = (float *)malloc(CUT_LEN * sizeof(float)), *v = (float *)malloc(CUT_LEN * sizeof(float));
    uint64_t key = 7;
    size_t len = CUT_LEN;
    x->bad_step = -1;
    kvps_result rc = g && v ? cut_worker_create(c, wk->rank, CUT_NW, 1000, &w) : KVPS_ERR_NOMEM;
    for (int t = 0; t < CUT_STEPS && rc == KVPS_OK; t++) {
        for (int i = 0; i < CUT_LEN; i++) g[i] = cut_c(t, wk->rank, i);
        kvps_req q;
        rc = kvps_worker_pushpull(w, &key, g, v, &len, 1, &q);
        if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, -1);
        if (rc == KVPS_OK && x->bad_step < 0 && (x->bad_elem = cut_check(v, t, CUT_NW, &x->got, &x->want)) >= 0)
            x->bad_step = t;
        __atomic_store_n(&x->steps, t + 1, __ATOMIC_RELEASE);
    }
    if (rc != KVPS_OK) kt_wk_fail(wk, "%s: %.299s", kvps_result_str(rc), w ? kvps_worker_last_error(w) : "create");
    __atomic_store_n(&x->steps, CUT_STEPS, __ATOMIC_RELEASE);
    kvps_worker_destroy(&w);
    free(g);
    free(v);
}
static void read_local_cuts_under_load(void) {
    cutjob c;
    int up = cutjob_start(&c, "cutn", CUT_NW) == 0;
    KT_CHECK(up, "servers or proxies did not start");
    if (!up) { cutjob_end(&c); return; }
    cutw x[CUT_NW];
    for (int r = 0; r < CUT_NW; r++) x[r] = (cutw){-1, -1, 0, 0, 0};
    kt_workers ws;
    kt_workers_init(&ws, "under load", cut_worker, CUT_NW, c.list, NULL);
    ws.user = &c;
    ws.each = x;
    ws.each_size = sizeof x[0];
    kt_workers_start(&ws);
    int cuts = 0;
    for (int next = CUT_EVERY; next < CUT_STEPS; next += CUT_EVERY) {
        while (__atomic_load_n(&x[0].steps, __ATOMIC_ACQUIRE) < next) kt_sleep_ms(1);
        if (__atomic_load_n(&x[0].steps, __ATOMIC_ACQUIRE) >= CUT_STEPS) break;
        uproxy_set(&c.px[0], &c.px[0].hold, 1);
        int64_t end = kt_now_ms() + 200;
        while (__atomic_load_n(&c.px[0].held, __ATOMIC_ACQUIRE) < CUT_LEN * (int)sizeof(float) && kt_now_ms() < end)
            kt_sleep_ms(1);
        uproxy_cut(&c.px[cuts % 2]);
        uproxy_cut(&c.px[1 - cuts % 2]);
        uproxy_set(&c.px[0], &c.px[0].hold, 0);
        cuts++;
    }
    kt_workers_join(&ws); /* (each failure reported) */
    for (int r = 0; r < CUT_NW; r++) {
        KT_CHECK(x[r].bad_step < 0, "under load: worker %d step %d element %d: got %g want %g%s", r, x[r].bad_step,
                 x[r].bad_elem, (double)x[r].got, (double)x[r].want,
                 x[r].bad_step > 0 && x[r].got == cut_want(x[r].bad_step - 1, CUT_NW, x[r].bad_elem) ? " (the step before's: a stale read)" : "");
    }
    kvps_server_stats st;
    kvps_server_stats_get(c.srv[1], &st);
    printf("  .read_local under %d cuts: the backup answered %llu READs of %d pushpulls\n", cuts, (unsigned long long)st.reads,
           CUT_STEPS * CUT_NW);
    cutjob_end(&c);
}
static void test_read_local_cut(void) {
    read_local_cut_once();
    read_local_cuts_under_load();
}

/* Logs of the servers in this process, for the refusal's words. */
static char logbuf[8192];
static size_t loglen;
static pthread_mutex_t logmu = PTHREAD_MUTEX_INITIALIZER;
static void log_keep(void *u, kvps_log_level lv, const char *msg) {
    (void)u; (void)lv;
    pthread_mutex_lock(&logmu);
    int n = snprintf(logbuf + loglen, sizeof logbuf - loglen, "%s\n", msg);
    if (n > 0 && loglen + (size_t)n < sizeof logbuf) loglen += (size_t)n;
    pthread_mutex_unlock(&logmu);
}

static void test_wrong_shard_refused(void) {
    job_init(&J, "wrong", KVPS_ASYNC, KVPS_UPDATE_ACCUMULATE, 1);
    kvps_log_set_fn(log_keep, NULL);
    kvps_log_set_level(KVPS_LOG_WARN);
    loglen = 0;
    kvps_server *p = NULL, *b = NULL;
    kvps_server_desc dp = job_desc(&J, 0, 0, 0), db = job_desc(&J, 0, 1, 0);
    db.rank = 1; /* a server of shard 1 in shard 0's chain */
    KT_OK(kvps_server_create(&db, &b));
    KT_OK(kvps_server_create(&dp, &p));
    KT_OK(kvps_server_start(b));
    KT_OK(kvps_server_start(p));
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = J.chain[0], .rank = 0, .num_workers = NW}, &w));
    uint64_t key = 3;
    float v = 2.0f, got = 0.0f;
    size_t len = 1;
    kvps_req q;
    KT_OK(kvps_worker_push(w, &key, &v, &len, 1, &q));
    KT_OK(kvps_worker_wait(w, q, 5000));
    KT_OK(kvps_worker_pull(w, &key, &got, &len, 1, &q));
    KT_OK(kvps_worker_wait(w, q, 5000));
    KT_CHECK(got == 2.0f, "pulled %g", (double)got);
    kvps_server_stats st;
    kvps_server_stats_get(b, &st);
    KT_CHECK(st.replicas_live == 0, "the wrong replica says it holds the shard");
    pthread_mutex_lock(&logmu);
    KT_CHECK(strstr(logbuf, "refused the snapshot") && strstr(logbuf, "another server"), "log: %s", logbuf);
    pthread_mutex_unlock(&logmu);
    kvps_worker_destroy(&w);
    kvps_server_destroy(&p);
    kvps_server_destroy(&b);
    kvps_log_set_fn(NULL, NULL);
    kvps_log_set_level(KVPS_LOG_NONE);
}

/* A job that loses a worker ends, backups included: 2 shards x 2 replicas (processes), 4 worker
   threads pushpulling NKEY raw keys with SUM; worker 3 vanishes (no goodbye) after step LW_K.
   BSP (rounds down the chain): the others' next waits say worker 3 is lost and they finish.
   Elastic (pushes down the chain): they go on without it to the end, every key's value exact
   (steps 0..LW_K of four workers, the rest of three). And BSP where the others finish after
   step LW_K too, before worker 3 is found lost: the loss is the job's last event. Each time all
   four server processes, the backups too, end by themselves with KVPS_ERR_PEER_LOST (exit
   code 5): the primaries from their own liveness, the backups from the LOST and goodbyes the
   primaries sent them. */
enum { LW_K = 3, LW_STEPS = 10 };
/* What the workers share: the job, and the step after which they stop (-1: none). A worker's
   record: how it ended (the result it expects depends on the case), the steps it did, its values. */
typedef struct lwj { job *j; int stop_after; } lwj;
typedef struct lwc { kvps_result rc; int steps; char err[400]; float v[NKEY * 3]; } lwc;
static void lost_worker_main(kt_wk *x) {
    const lwj *lj = (const lwj *)x->ws->user;
    lwc *c = (lwc *)x->mine;
    int rank = x->rank;
    kvps_worker *w = NULL;
    c->rc = job_worker(lj->j, rank, 300, &w);
    uint64_t keys[NKEY];
    size_t lens[NKEY];
    float g[NKEY * 3];
    for (int i = 0; i < NKEY; i++) { keys[i] = 1000 + (uint64_t)i; lens[i] = 3; }
    for (int i = 0; i < NKEY * 3; i++) g[i] = (float)(rank + 1 + i % 3);
    for (int t = 0; t < LW_STEPS && c->rc == KVPS_OK; t++) {
        kvps_req q;
        c->rc = kvps_worker_pushpull(w, keys, g, c->v, lens, NKEY, &q);
        if (c->rc == KVPS_OK) c->rc = kvps_worker_wait(w, q, -1);
        if (c->rc == KVPS_OK) c->steps = t + 1;
        if (rank == NW - 1 && t == LW_K) {
            kt_worker_vanish(&w);
            return;
        }
        if (t == lj->stop_after) break;
    }
    if (c->rc != KVPS_OK) snprintf(c->err, sizeof c->err, "%.399s", kvps_worker_last_error(w));
    kvps_worker_destroy(&w);
}
static void worker_lost_ends_chains(int elastic, int lost_last) {
    const char *what = elastic ? "elastic" : lost_last ? "BSP, the loss last" : "BSP";
    job_init(&J, elastic ? "lwe" : lost_last ? "lwl" : "lwb", KVPS_BSP, KVPS_UPDATE_ACCUMULATE, LW_STEPS);
    J.elastic = elastic;
    job_start(&J);
    lwj lj = {&J, lost_last ? LW_K : -1};
    lwc c[NW];
    memset(c, 0, sizeof c);
    kt_workers ws;
    kt_workers_init(&ws, what, lost_worker_main, NW, J.servers, NULL); /* (their results are checked here) */
    ws.user = &lj;
    ws.each = c;
    ws.each_size = sizeof c[0];
    kt_workers_run(&ws);
    KT_CHECK(c[NW - 1].rc == KVPS_OK && c[NW - 1].steps == LW_K + 1, "%s: worker %d: %d steps, %s", what, NW - 1,
             c[NW - 1].steps, kvps_result_str(c[NW - 1].rc));
    for (int r = 0; r < NW - 1; r++) {
        if (lost_last) {
            KT_CHECK(c[r].rc == KVPS_OK && c[r].steps == LW_K + 1, "%s: worker %d: %s after %d steps: '%s'", what, r,
                     kvps_result_str(c[r].rc), c[r].steps, c[r].err);
            continue;
        }
        if (!elastic) {
            KT_CHECK(c[r].rc == KVPS_ERR_PEER_LOST && c[r].steps == LW_K + 1 && strstr(c[r].err, "worker 3"),
                     "BSP: worker %d: %s after %d steps, want KVPS_ERR_PEER_LOST naming worker 3 after %d: '%s'", r,
                     kvps_result_str(c[r].rc), c[r].steps, LW_K + 1, c[r].err);
            continue;
        }
        KT_CHECK(c[r].rc == KVPS_OK && c[r].steps == LW_STEPS, "elastic: worker %d: %s after %d steps: '%s'", r,
                 kvps_result_str(c[r].rc), c[r].steps, c[r].err);
        for (int i = 0; i < NKEY * 3; i++) {
            float want = 0.0f;
            for (int t = 0; t < LW_STEPS; t++)
                for (int x = 0; x < (t <= LW_K ? NW : NW - 1); x++) want += (float)(x + 1 + i % 3);
            KT_CHECK(c[r].v[i] == want, "elastic: worker %d key %d element %d = %.1f, want %.1f", r, i / 3, i % 3,
                     (double)c[r].v[i], (double)want);
            if (c[r].v[i] != want) break;
        }
    }
    reap_code(&J, what, 5);
}
static void test_worker_lost_ends_chains(void) {
    worker_lost_ends_chains(0, 0);
    worker_lost_ends_chains(1, 0);
    worker_lost_ends_chains(0, 1);
}

/* A clean finish of a replicated shard warns of nothing, whichever replica leaves first. One
   shard of 2 replicas in this process, one worker. The primary is held (in the log callback)
   right after it has sent the worker's goodbye down the chain, until the backup, which ends
   with that goodbye, is destroyed: the primary then finds its backup gone at the very end, as
   a busy primary does (a fault run saw untouched shards' primaries warn "backup replica 1 ...
   is gone" at the clean finish). Nothing at warning level or above may be logged. */
static pthread_mutex_t quiet_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t quiet_cv = PTHREAD_COND_INITIALIZER;
static pthread_t quiet_primary;
static int quiet_known, quiet_gone, quiet_held;
static void quiet_log(void *u, kvps_log_level lv, const char *msg) {
    if (lv <= KVPS_LOG_WARN) log_keep(u, lv, msg);
    pthread_mutex_lock(&quiet_mu);
    if (!quiet_known && strstr(msg, "server 0 replica 0: replica 1") && strstr(msg, "holds the shard now")) {
        quiet_primary = pthread_self(); /* the primary's serving thread */
        quiet_known = 1;
    }
    if (quiet_known && pthread_equal(quiet_primary, pthread_self()) && strstr(msg, "worker 0 finished (1 of 1)")) {
        quiet_held = 1;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 20; /* a hang bound */
        while (!quiet_gone && pthread_cond_timedwait(&quiet_cv, &quiet_mu, &until) == 0) {}
    }
    pthread_mutex_unlock(&quiet_mu);
}
static void test_clean_finish_quiet(void) {
    job_init(&J, "quiet", KVPS_BSP, KVPS_UPDATE_ACCUMULATE, 1);
    loglen = 0;
    logbuf[0] = 0;
    quiet_known = quiet_gone = quiet_held = 0;
    kvps_log_set_fn(quiet_log, NULL);
    kvps_log_set_level(KVPS_LOG_INFO);
    kvps_server *srv[2] = {NULL, NULL};
    for (int r = 1; r >= 0; r--) {
        kvps_server_desc d = job_desc(&J, 0, r, 0);
        d.num_workers = 1;
        KT_OK(kvps_server_create(&d, &srv[r]));
        KT_OK(kvps_server_start(srv[r]));
    }
    kvps_server_stats st = {0};
    for (int64_t end = kt_now_ms() + 20000; st.replicas_live < 2 && kt_now_ms() < end; kt_sleep_ms(5))
        kvps_server_stats_get(srv[0], &st);
    KT_CHECK(st.replicas_live == 2, "the backup never joined");
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = J.chain[0], .rank = 0, .num_workers = 1, .timeout_ms = 10000}, &w));
    uint64_t key = 3;
    float v = 2.0f;
    size_t len = 1;
    kvps_req q;
    KT_OK(kvps_worker_push(w, &key, &v, &len, 1, &q));
    KT_OK(kvps_worker_wait(w, q, 10000));
    kvps_worker_finish(w, 0); /* the goodbye goes; its answer is not waited for (the primary is held) */
    kvps_result r = kvps_server_wait(srv[1], 20000);
    KT_CHECK(r == KVPS_OK, "the backup: %s", kvps_result_str(r));
    kvps_server_destroy(&srv[1]);
    pthread_mutex_lock(&quiet_mu);
    int held = quiet_held;
    quiet_gone = 1;
    pthread_cond_broadcast(&quiet_cv);
    pthread_mutex_unlock(&quiet_mu);
    KT_CHECK(held, "the primary was not held at the goodbye (the test did not do what it says)");
    r = kvps_server_wait(srv[0], 20000);
    KT_CHECK(r == KVPS_OK, "the primary: %s", kvps_result_str(r));
    kvps_worker_destroy(&w);
    kvps_server_destroy(&srv[0]);
    kvps_log_set_fn(NULL, NULL);
    kvps_log_set_level(KVPS_LOG_NONE);
    pthread_mutex_lock(&logmu);
    KT_CHECK(loglen == 0, "a clean finish logged warnings:\n%s", logbuf);
    pthread_mutex_unlock(&logmu);
}

/* kvps_env_read with chains: KVPS_REPLICA under kvps-run, and mpirun's mapping (the first n x r
   processes serve, process p being shard p % n, replica p / n); uneven chains refused. */
static void env_clear(void) {
    static const char *vars[] = {"KVPS_ROLE", "KVPS_RANK", "KVPS_REPLICA", "KVPS_REPLACEMENT", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                 "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}
static void test_env_replicas(void) {
    kvps_env e;
    env_clear();
    setenv("KVPS_SERVERS", "tcp://a:1|tcp://b:1,tcp://c:2|tcp://d:2", 1);
    setenv("KVPS_NUM_WORKERS", "3", 1);
    setenv("KVPS_ROLE", "server", 1);
    setenv("KVPS_RANK", "1", 1);
    setenv("KVPS_REPLICA", "1", 1);
    setenv("KVPS_REPLACEMENT", "1", 1);
    KT_OK(kvps_env_read(&e));
    KT_CHECK(e.role == KVPS_ROLE_SERVER && e.rank == 1 && e.replica == 1 && e.replacement == 1 &&
                 strcmp(e.endpoint, "tcp://d:2") == 0 && strcmp(e.replicas, "tcp://c:2|tcp://d:2") == 0,
             "kvps-run's server 1.1: role %d rank %d replica %d endpoint '%s' chain '%s'", (int)e.role, e.rank, e.replica,
             e.endpoint, e.replicas);
    env_clear();
    static const struct { int p, role, rank, replica; const char *ep; } want[] = {
        {0, KVPS_ROLE_SERVER, 0, 0, "tcp://a:1"}, {1, KVPS_ROLE_SERVER, 1, 0, "tcp://c:2"}, {2, KVPS_ROLE_SERVER, 0, 1, "tcp://b:1"},
        {3, KVPS_ROLE_SERVER, 1, 1, "tcp://d:2"}, {4, KVPS_ROLE_WORKER, 0, 0, ""},          {6, KVPS_ROLE_WORKER, 2, 0, ""}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char p[8];
        snprintf(p, sizeof p, "%d", want[i].p);
        setenv("OMPI_COMM_WORLD_RANK", p, 1);
        KT_OK(kvps_env_read(&e));
        KT_CHECK((int)e.role == want[i].role && e.rank == want[i].rank && e.replica == want[i].replica &&
                     (want[i].role == KVPS_ROLE_WORKER || strcmp(e.endpoint, want[i].ep) == 0),
                 "mpirun process %d: role %d rank %d replica %d endpoint '%s'", want[i].p, (int)e.role, e.rank, e.replica,
                 e.endpoint);
    }
    setenv("KVPS_SERVERS", "tcp://a:1|tcp://b:1,tcp://c:2", 1);
    kvps_log_set_level(KVPS_LOG_NONE);
    KT_CHECK(kvps_env_read(&e) == KVPS_ERR_ENV, "uneven chains accepted");
    env_clear();
    unsetenv("KVPS_SERVERS");
    unsetenv("KVPS_NUM_WORKERS");
}

/* ONLY THE JOB TALKS TO THE JOB (kvps.h, SECURITY): a stranger process, which knows the endpoints
   and the header layout but not the job token, sends every replica of both shards REPL of every
   kind claiming epoch 9 (to a primary: "replica 1 is primary of epoch 9"; to a backup: "replica 0
   speaks for epoch 9"), REPL hellos with the right chain and another token, and BYE for every
   rank, from plain sockets and from sockets that take the replica links' routing id, while four
   workers push (async + SUM). Every reply is KVPS_ERR_AUTH; the workers go on without an error
   (a primary that stepped down or a backup that raised its epoch would fail them, as the issue
   saw), every sum is exact and the servers end by themselves (a forged BYE would end them early). */
static int stranger_main(const job *j) {
    void *ctx = zmq_ctx_new();
    int bad = 0;
    for (int s = 0; s < NSH; s++)
        for (int r = 0; r < NREP; r++)
            for (int idmode = 0; idmode < 2; idmode++) {
                void *d = zmq_socket(ctx, ZMQ_DEALER);
                int zero = 0;
                zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
                if (idmode) { /* the replica link's routing id (without its random part: unknowable) */
                    unsigned char rid[12] = {'k', 'v', 'p', 's', 'r', 'e', 'p', 'l'};
                    uint32_t other = (uint32_t)(1 - r);
                    memcpy(rid + 8, &other, 4);
                    zmq_setsockopt(d, ZMQ_ROUTING_ID, rid, sizeof rid);
                }
                zmq_connect(d, j->ep[s][r]);
                uint64_t proof[2] = {0x5eed5eed5eed5eedull, kt_chain_hash(j->chain[s])};
                for (int kind = 0; kind <= KVPS__REPL_HELLO + 1; kind++) {
                    int bye = kind == KVPS__REPL_HELLO + 1;
                    kvps__hdr h = KT_HDR(.op = bye ? KVPS__OP_BYE : KVPS__OP_REPL, .rank = bye ? (uint32_t)(s % NW) : (uint32_t)kind,
                                         .nkeys = bye ? 0 : 9, .aux = (uint32_t)(1 - r), .req_id = 1);
                    char text[600];
                    int32_t st = kt_raw_reply(d, &h, sizeof h, proof, kind == KVPS__REPL_LOST ? 4 : 16, 3000, text, sizeof text);
                    if (st != KVPS_ERR_AUTH) {
                        printf("  stranger: shard %d replica %d, %s kind %d%s: status %d (%s) %s\n", s, r, bye ? "BYE" : "REPL", kind,
                               idmode ? " (link's routing id)" : "", st, st == 1 ? "no reply" : kvps_result_str((kvps_result)st), text);
                        bad++;
                    }
                }
                zmq_close(d);
            }
    zmq_ctx_term(ctx);
    return bad ? 1 : 0;
}
static void test_forged_repl_refused(void) {
    int steps = kt_quick() ? 150 : 300;
    setenv("KVPS_JOB_TOKEN", "the job's own token", 1); /* the servers (forked) and workers take it */
    job_init(&J, "st", KVPS_ASYNC, KVPS_UPDATE_ACCUMULATE, 1 << 30);
    job_start(&J);
    workers_start(&J);
    wait_steps(&J, steps / 3);
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        unsetenv("KVPS_JOB_TOKEN"); /* a stranger has no token */
        fflush(stdout);
        int rc = stranger_main(&J);
        fflush(stdout);
        _exit(rc);
    }
    int st = kt_wait_pid(p, kt_now_ms() + 60000);
    KT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the stranger's messages were not all refused (%d)", st);
    int at = min_steps(&J);
    wait_steps(&J, at + steps / 3); /* the job goes on after them */
    __atomic_store_n(&J.stop, 1, __ATOMIC_RELEASE);
    workers_join("after a stranger's REPL and BYE");
    check_sums(&J, "after a stranger's REPL and BYE");
    reap(&J, "after a stranger's REPL and BYE");
    unsetenv("KVPS_JOB_TOKEN");
}

/* A primary stopped (SIGSTOP) past its backup's take-over, then resumed, with a request that a
   worker sent it during the stop still in its socket (issue 27): it must not answer that request
   as if it were still the primary (the job's truth is the new primary's, which never had it).
   Async + SUM on 1 x 2 server processes; worker 0 fails over after 300 ms and brings the backup
   to take over; worker 1 (failover only after 60 s) pushes 1000s to the stopped primary. Once
   resumed, whatever the old primary answers, every push a worker was told is applied must be in
   the sum the new primary holds: 1 + 10 + 2 + 1000 per element. */
static void test_stopped_primary_steps_down(void) {
    char ep[2][96], chain[200];
    for (int r = 0; r < 2; r++) snprintf(ep[r], sizeof ep[r], "ipc://@kvps-test-sp-%d-%d", (int)getpid(), r);
    snprintf(chain, sizeof chain, "%s|%s", ep[0], ep[1]);
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        kvps_server_desc d = {.endpoint = ep[r], .num_workers = 2, .consistency = KVPS_ASYNC, .update = KVPS_UPDATE_ACCUMULATE,
                              .heartbeat_ms = 200, .peer_timeout_ms = 1000};
        d.replicas = chain;
        d.replica = r;
        char bound[256]; /* (the endpoint, ep[r]) */
        pid[r] = kt_server_proc(&d, bound, sizeof bound);
    }
    kvps_worker *w[2] = {NULL, NULL};
    for (int r = 0; r < 2; r++)
        KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = chain, .rank = r, .num_workers = 2, .timeout_ms = 20000,
                                                     .heartbeat_ms = 200, .peer_timeout_ms = 1000,
                                                     .failover_ms = r ? 60000 : 300}, &w[r]));
    uint64_t key[1] = {7};
    size_t len[1] = {3};
    float a[3] = {1, 1, 1}, b[3] = {10, 10, 10}, c[3] = {2, 2, 2}, big[3] = {1000, 1000, 1000}, got[3] = {0, 0, 0};
    kvps_req q, q1;
    if (w[0] && w[1]) {
        KT_OK(kvps_worker_push(w[0], key, a, len, 1, &q));
        KT_OK(kvps_worker_wait(w[0], q, -1));
        KT_OK(kvps_worker_push(w[1], key, b, len, 1, &q));
        KT_OK(kvps_worker_wait(w[1], q, -1));
        kill(pid[0], SIGSTOP);
        KT_OK(kvps_worker_push(w[0], key, c, len, 1, &q));
        kvps_result r0 = kvps_worker_wait(w[0], q, -1); /* through the backup, once it has taken over */
        KT_CHECK(r0 == KVPS_OK, "worker 0's push after the stop: %s (%s)", kvps_result_str(r0), kvps_worker_last_error(w[0]));
        KT_OK(kvps_worker_push(w[1], key, big, len, 1, &q1)); /* into the stopped primary's socket */
        kt_sleep_ms(1500);
        kill(pid[0], SIGCONT);
        kvps_result r1 = kvps_worker_wait(w[1], q1, -1);
        KT_CHECK(r1 == KVPS_OK, "worker 1's push sent during the stop: %s (%s)", kvps_result_str(r1),
                 kvps_worker_last_error(w[1]));
        KT_OK(kvps_worker_pull(w[0], key, got, len, 1, &q));
        KT_OK(kvps_worker_wait(w[0], q, -1));
        for (int i = 0; i < 3; i++)
            KT_CHECK(got[i] == 1013.0f, "element %d: %g, want 1013 (%s)", i, (double)got[i],
                     got[i] == 13.0f ? "a push answered OK is not in the new primary's sum" : "?");
    }
    for (int r = 0; r < 2; r++) kvps_worker_destroy(&w[r]);
    for (int r = 0; r < 2; r++) {
        int st = kt_wait_pid(pid[r], kt_now_ms() + 10000);
        if (st < 0) { kill(pid[r], SIGKILL); waitpid(pid[r], NULL, 0); }
    }
}

/* A backup that serves nothing now (here a replacement that holds no snapshot yet) sends every
   worker request on with KVPS_ERR_NOT_PRIMARY, from a worker's connection that said no hello there
   too (a connection that names no worker stays a stranger's: test_forged_repl_refused): a
   worker whose connection came back to a replacement at the dead primary's endpoint (kvps-run
   --respawn) before its hello was answered must move on to the next replica, not be refused as
   a stranger (KVPS_ERR_AUTH ends its request: test_examples' fmnist under --replicas failed so
   once). Nothing is applied, and it is not counted as a stranger. */
static void test_backup_sends_unknown_on(void) {
    job_init(&J, "decline", KVPS_BSP, KVPS_UPDATE_ACCUMULATE, 1);
    kvps_server *b = NULL;
    kvps_server_desc db = job_desc(&J, 0, 1, 1); /* replica 1, a replacement: waits for a snapshot */
    KT_OK(kvps_server_create(&db, &b));
    KT_OK(kvps_server_start(b));
    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER); /* named as worker 1's connection is (kvps__worker_dealer) */
    unsigned char rid[16] = {'k', 'v', 'p', 's'};
    uint32_t inc = 12345, rank = 1, srv = 0;
    memcpy(rid + 4, &inc, 4);
    memcpy(rid + 8, &rank, 4);
    memcpy(rid + 12, &srv, 4);
    zmq_setsockopt(d, ZMQ_ROUTING_ID, rid, sizeof rid);
    int zero = 0, tmo = 3000;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    zmq_connect(d, J.ep[0][1]);
    unsigned char meta[KVPS__HDR + KVPS__KENT];
    kt_raw_meta(meta, KVPS__OP_PUSH, 3, 1);
    kvps__hdr h;
    memcpy(&h, meta, sizeof h);
    h.rank = 1;
    h.status = (int32_t)inc; /* a worker's incarnation that said no hello here */
    memcpy(meta, &h, sizeof h);
    float v = 1.0f;
    char text[600];
    int32_t st = kt_raw_reply(d, meta, sizeof meta, &v, sizeof v, 5000, text, sizeof text);
    KT_CHECK(st == KVPS_ERR_NOT_PRIMARY, "the backup answered %d (%s), want KVPS_ERR_NOT_PRIMARY: %s", st,
             kvps_result_str((kvps_result)st), text);
    KT_CHECK(strstr(text, "does not hold the shard yet") != NULL, "text: %s", text);
    kvps_server_stats ss;
    kvps_server_stats_get(b, &ss);
    KT_CHECK(ss.strangers == 0 && ss.keys == 0, "strangers %llu, keys %llu", (unsigned long long)ss.strangers,
             (unsigned long long)ss.keys);
    zmq_close(d);
    zmq_ctx_term(ctx);
    kvps_server_destroy(&b);
}

#define RUN(fn, s) do { if (!only || strstr(#fn, only)) KT_RUN(fn, s); } while (0)
int main(void) {
    kvps_log_set_level(getenv("KT_VERBOSE") ? KVPS_LOG_INFO : KVPS_LOG_NONE);
    const char *only = getenv("KT_ONLY"); /* runs the tests whose name has this in it */
    RUN(test_async_primary_killed, 120);
    RUN(test_async_backup_killed, 120);
    RUN(test_bsp_primary_killed, 120);
    RUN(test_replacement_then_kill, 120);
    RUN(test_grow_then_kill, 120);
    RUN(test_bsp_half_replicated, 60);
    RUN(test_bsp_sends_rounds, 60);
    RUN(test_bsp_read_local, 60);
    RUN(test_read_local_async, 60);
    RUN(test_read_local_cut, 120);
    RUN(test_reply_waits_for_backup, 60);
    RUN(test_all_replicas_gone, 60);
    RUN(test_wrong_shard_refused, 60);
    RUN(test_worker_lost_ends_chains, 120);
    RUN(test_clean_finish_quiet, 60);
    RUN(test_env_replicas, 30);
    RUN(test_forged_repl_refused, 120);
    RUN(test_stopped_primary_steps_down, 90);
    RUN(test_backup_sends_unknown_on, 30);
    return kt_finish();
}
