#define _GNU_SOURCE /* unshare, CLONE_NEWNS (the small /dev/shm test) */
/* test_ring_shm - the shared-memory transport between ranks on one host (kvps_ring.h, section 10).
   The collective, p2p, sub-ring and fault suites (test_ring_*) run over it by default (their
   ranks share a host) and again with KVPS_RING_SHM=0 over ZeroMQ (make test runs both); this
   file checks what is particular to it:
     - the transport chosen: shared memory between ranks on one host, ZeroMQ with .shm = -1 or
       KVPS_RING_SHM=0 (threads), and between "hosts" that KVPS_RING_HOST_ID tells apart;
     - ranks as processes: all-reduce (every algorithm), all-to-all and 3 MB p2p messages (larger
       than a queue: they stream through it) exact against a naive oracle; each rank's segment
       gone from /dev/shm once every peer has mapped it;
     - a job SIGKILLed mid-collective leaves nothing in /dev/shm; a segment of a process killed
       before it could unlink its own is removed by the next ring (when over a minute old);
     - a rank killed while its peers wait (asleep on their futex) or while a peer's send waits
       for room in its full queue: the peers return KVPS_ERR_PEER_LOST naming it, never a hang;
     - two simulated hosts of two ranks each: shared memory inside, ZeroMQ between, the groups
       found by themselves (AUTO runs HIER), results exact;
     - a /dev/shm too small (a private tmpfs of 256 KiB, as root): one warning naming it, every
       peer over ZeroMQ, results exact.
   Ranks as processes here get their endpoints from the parent through pipes. */
#define KVPS_IMPLEMENTATION
#include "kvps.h" /* (kt_isolated) */
#include "kvps_ring.h"
#include "tests/kvps_test.h"
#include <dirent.h>
#include <sched.h>
#include <sys/mount.h>

/* Segments in /dev/shm made by process pid (0: by any process). */
static int segs_of(pid_t pid) {
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    char pre[64];
    snprintf(pre, sizeof pre, pid ? "kvps-ring-%d-" : "kvps-ring-", (int)pid);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strncmp(e->d_name, pre, strlen(pre)) == 0;
    closedir(d);
    return n;
}

/* ---- threads: the transport chosen ------------------------------------------------------- */
static void transports_main(kt_rk *x) {
    const char *want = (const char *)x->t->arg;
    if (!kt_rk_call(x, kvps_ring_barrier(x->r), "barrier")) return;
    for (int j = 0; j < x->k; j++) {
        const char *got = kvps_ring_transport(x->r, j), *w = j == x->rank ? "self" : want;
        if (strcmp(got, w) != 0) kt_rk_fail(x, "rank %d reaches rank %d by %s, want %s", x->rank, j, got, w);
    }
    if (strcmp(kvps_ring_transport(x->r, x->k), "?") != 0) kt_rk_fail(x, "rank %d: no such rank, but not '?'", x->k);
}

static void test_transport_chosen(void) {
    for (int k = 2; k <= 4; k++) {
        kt_team t;
        kt_team_init(&t, "shm, inproc", transports_main, k, 0, 10000);
        t.arg = "shm";
        kt_team_run(&t);
        kt_team_init(&t, "shm, tcp", transports_main, k, 1, 10000);
        t.arg = "shm";
        kt_team_run(&t);
        kt_team_init(&t, ".shm = -1, inproc", transports_main, k, 0, 10000);
        t.arg = "zmq"; /* (inproc endpoints: no TCP either) */
        t.base.shm = -1;
        kt_team_run(&t);
        kt_team_init(&t, ".shm = -1, tcp", transports_main, k, 1, 10000);
        t.arg = "tcp"; /* the ring's own connections (tests/test_ring_tcp.c) */
        t.base.shm = -1;
        kt_team_run(&t);
    }
    setenv("KVPS_RING_SHM", "0", 1);
    kt_team t;
    kt_team_init(&t, "KVPS_RING_SHM=0", transports_main, 3, 1, 10000);
    t.arg = "tcp";
    kt_team_run(&t);
    setenv("KVPS_RING_TCP", "0", 1);
    kt_team_init(&t, "KVPS_RING_SHM=0 KVPS_RING_TCP=0", transports_main, 3, 1, 10000);
    t.arg = "zmq";
    kt_team_run(&t);
    unsetenv("KVPS_RING_TCP");
    unsetenv("KVPS_RING_SHM");
}

/* ---- ranks as processes ------------------------------------------------------------------ */
typedef struct prank {
    int rank, k;
    kvps_ring *r;
    int note_fd;   /* to the parent: a line "pid PID" once the job's first collective is done */
    pid_t parent;
    char why[400]; /* the first failure */
} prank;

static void pr_fail(prank *p, const char *fmt, ...) {
    if (p->why[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->why, sizeof p->why, fmt, ap);
    va_end(ap);
}

typedef void (*prank_fn)(prank *p);

/* k rank processes: each binds tcp://127.0.0.1:*, sends its endpoint up a pipe, gets the list,
   connects and runs fn. host_ids: KVPS_RING_HOST_ID per rank (NULL: none). kill_all: once every
   rank has noted its pid, SIGKILL them all kill_all ms later (0: wait for them). pids and wait
   statuses out; returns whether a rank did not exit 0. */
static int procs_run(int k, prank_fn fn, int timeout_ms, const char *const *host_ids, int kill_all, pid_t *pids, int *sts) {
    int up[KT_MAXR][2], down[KT_MAXR][2], note[2];
    if (pipe(note) != 0) return -1;
    fflush(stdout);
    for (int i = 0; i < k; i++) {
        if (pipe(up[i]) != 0 || pipe(down[i]) != 0) return -1;
        pids[i] = fork();
        if (pids[i] == 0) {
            if (host_ids) setenv("KVPS_RING_HOST_ID", host_ids[i], 1);
            prank p;
            memset(&p, 0, sizeof p);
            p.rank = i;
            p.k = k;
            p.note_fd = note[1];
            p.parent = getppid();
            kvps_result rc = kvps_ring_create(&(kvps_ring_desc){.rank = i, .size = k, .bind = "tcp://127.0.0.1:*",
                                                                .timeout_ms = timeout_ms}, &p.r);
            char peers[KT_MAXR * 64] = "";
            const char *ep = rc == KVPS_OK ? kvps_ring_endpoint(p.r) : "tcp://127.0.0.1:1";
            if (write(up[i][1], ep, strlen(ep) + 1) < 0) _exit(3);
            ssize_t got = 0, m;
            while ((m = read(down[i][0], peers + got, sizeof peers - 1 - (size_t)got)) > 0 && !memchr(peers, 0, (size_t)(got + m))) got += m;
            if (rc != KVPS_OK) _exit(3);
            rc = kvps_ring_connect(p.r, peers);
            if (rc != KVPS_OK) pr_fail(&p, "connect: %s", kvps_result_str(rc));
            else fn(&p);
            kvps_ring_destroy(&p.r);
            if (p.why[0]) printf("  rank process %d of %d: %s\n", i, k, p.why);
            fflush(stdout);
            _exit(p.why[0] ? 1 : 0);
        }
    }
    char eps[KT_MAXR][256], all[KT_MAXR * 64] = "";
    for (int i = 0; i < k; i++) {
        ssize_t n = read(up[i][0], eps[i], sizeof eps[i] - 1);
        eps[i][n > 0 ? n : 0] = 0;
        snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", i ? "," : "", eps[i]);
    }
    for (int i = 0; i < k; i++)
        if (write(down[i][1], all, strlen(all) + 1) < 0) return -1;
    if (kill_all) {
        char buf[64];
        ssize_t m;
        for (int lines = 0; lines < k && (m = read(note[0], buf, sizeof buf)) > 0;)
            for (ssize_t j = 0; j < m; j++) lines += buf[j] == '\n';
        kt_sleep_ms(kill_all);
        for (int i = 0; i < k; i++) kill(pids[i], SIGKILL);
    }
    int bad = 0;
    for (int i = 0; i < k; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        if (sts) sts[i] = st;
        bad |= !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        close(up[i][0]); close(up[i][1]); close(down[i][0]); close(down[i][1]);
    }
    close(note[0]);
    close(note[1]);
    return bad;
}

/* rank r's element i: small integers, so that every sum is exact whatever the order */
static int32_t val(int r, size_t i) { return (int32_t)((r + 1) * 1000 + (int)(i % 991)); }

static void check_allreduce(prank *p, size_t n, kvps_ring_algo algo) {
    int32_t *b = (int32_t *)kt_xmalloc(n * sizeof *b + 4);
    for (size_t i = 0; i < n; i++) b[i] = val(p->rank, i);
    kvps_ring_op op = {.coll = KVPS_COLL_ALLREDUCE, .send = NULL, .recv = b, .count = n, .dtype = KVPS_INT32, .op = KVPS_SUM,
                       .algo = algo};
    kvps_result rc = kvps_ring_run(p->r, &op);
    if (rc != KVPS_OK) pr_fail(p, "allreduce of %zu (%s): %s [%s]", n, kvps_algo_name(algo), kvps_result_str(rc), kvps_ring_last_error(p->r));
    for (size_t i = 0; rc == KVPS_OK && i < n; i++) {
        int32_t want = 0;
        for (int r = 0; r < p->k; r++) want += val(r, i);
        if (b[i] != want) { pr_fail(p, "allreduce of %zu (%s): element %zu is %d, want %d", n, kvps_algo_name(algo), i, b[i], want); break; }
    }
    free(b);
}

/* The job's first collective has every peer's hello read and every segment mapped. */
static void note_pid(prank *p) {
    char line[32];
    int n = snprintf(line, sizeof line, "pid %d\n", (int)getpid());
    if (write(p->note_fd, line, (size_t)n) < 0) pr_fail(p, "note");
}

static void oracle_main(prank *p) {
    if (kvps_ring_barrier(p->r) != KVPS_OK) { pr_fail(p, "barrier: %s", kvps_ring_last_error(p->r)); return; }
    for (int j = 0; j < p->k; j++)
        if (j != p->rank && strcmp(kvps_ring_transport(p->r, j), "shm") != 0)
            pr_fail(p, "rank %d reaches rank %d by %s", p->rank, j, kvps_ring_transport(p->r, j));
    /* every peer has mapped this rank's segment by the end of the next collective (each maps it on
       reading the hello, before its first message to it): the segment is unlinked */
    check_allreduce(p, 1000, KVPS_ALGO_AUTO);
    if (kvps_ring_barrier(p->r) != KVPS_OK) pr_fail(p, "barrier 2");
    if (segs_of(getpid()) != 0) pr_fail(p, "rank %d's segment is still in /dev/shm after every peer mapped it", p->rank);
    static const size_t sizes[] = {1, 7, 1000, 300000, 5000000};
    static const kvps_ring_algo algos[] = {KVPS_ALGO_AUTO, KVPS_ALGO_RING, KVPS_ALGO_RD, KVPS_ALGO_RHD, KVPS_ALGO_BIRING,
                                           KVPS_ALGO_DIRECT};
    /* DIRECT reads the peers' buffers with process_vm_readv here (they are processes) */
    if (p->r->fam->cma_all != 1) pr_fail(p, "rank %d: the ranks did not agree that DIRECT can run", p->rank);
    for (int s = 0; s < 5; s++)
        for (int a = 0; a < 6; a++) check_allreduce(p, sizes[s], algos[a]);
    /* all-to-all: every pair at once */
    size_t blk = 40000;
    int32_t *in = (int32_t *)kt_xmalloc(blk * (size_t)p->k * 4), *out = (int32_t *)kt_xmalloc(blk * (size_t)p->k * 4);
    for (int j = 0; j < p->k; j++)
        for (size_t i = 0; i < blk; i++) in[(size_t)j * blk + i] = val(p->rank, i) * 10 + j;
    kvps_result rc = kvps_ring_alltoall(p->r, in, out, blk, KVPS_INT32);
    if (rc != KVPS_OK) pr_fail(p, "alltoall: %s", kvps_ring_last_error(p->r));
    for (int j = 0; rc == KVPS_OK && j < p->k; j++)
        for (size_t i = 0; i < blk; i++)
            if (out[(size_t)j * blk + i] != val(j, i) * 10 + p->rank) { pr_fail(p, "alltoall block %d element %zu", j, i); break; }
    free(in);
    free(out);
    /* 3 MB to the next rank while receiving 3 MB from the previous one: larger than a queue, both
       ways at once (each sender reads its own queues while it waits for room) */
    size_t n = 750000;
    int32_t *s = (int32_t *)kt_xmalloc(n * 4), *d = (int32_t *)kt_xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) s[i] = val(p->rank, i) ^ (int32_t)i;
    int next = (p->rank + 1) % p->k, prev = (p->rank + p->k - 1) % p->k;
    kvps_ring_req q;
    rc = kvps_ring_irecv(p->r, d, n, KVPS_INT32, prev, 9, &q);
    if (rc == KVPS_OK) rc = kvps_ring_send(p->r, s, n, KVPS_INT32, next, 9);
    if (rc == KVPS_OK) rc = kvps_ring_wait(p->r, q, -1);
    if (rc != KVPS_OK) pr_fail(p, "p2p 3 MB: %s", kvps_ring_last_error(p->r));
    for (size_t i = 0; rc == KVPS_OK && i < n; i++)
        if (d[i] != (val(prev, i) ^ (int32_t)i)) { pr_fail(p, "p2p 3 MB: element %zu", i); break; }
    free(s);
    free(d);
}

static void test_processes_oracle(void) {
    for (int k = 2; k <= 4; k += 2) {
        pid_t pids[KT_MAXR];
        KT_CHECK(procs_run(k, oracle_main, 30000, NULL, 0, pids, NULL) == 0, "%d rank processes failed (above)", k);
        for (int i = 0; i < k; i++) KT_CHECK(segs_of(pids[i]) == 0, "rank %d's segment outlived its process", i);
    }
}

/* ---- a job SIGKILLed mid-collective -------------------------------------------------------- */
static void busy_main(prank *p) {
    check_allreduce(p, 1000, KVPS_ALGO_AUTO);
    note_pid(p);
    /* killed in one of these (bounded: a parent gone, killed by the watchdog, leaves no spinners) */
    for (int64_t end = kvps__now_ms() + 60000; kvps__now_ms() < end && getppid() == p->parent && !p->why[0];)
        check_allreduce(p, 2000000, KVPS_ALGO_RING);
}

static void test_sigkill_leaves_nothing(void) {
    pid_t pids[KT_MAXR];
    procs_run(4, busy_main, 30000, NULL, 300, pids, NULL);
    int left = 0;
    for (int i = 0; i < 4; i++) left += segs_of(pids[i]);
    KT_CHECK(left == 0, "%d segments of the SIGKILLed job are still in /dev/shm", left);
}

/* ---- segments of processes killed before they unlinked theirs ------------------------------ */
/* Two segments named after a process that is gone: one a minute old is removed when a ring is
   made, one just made is left (it could be a live process's in another PID namespace). */
static void test_stale_segment_swept(void) {
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char old[96], young[96];
    snprintf(old, sizeof old, "/dev/shm/kvps-ring-%d-00000000000000aa", (int)dead);
    snprintf(young, sizeof young, "/dev/shm/kvps-ring-%d-00000000000000bb", (int)dead);
    FILE *a = fopen(old, "w"), *b = fopen(young, "w");
    KT_CHECK(a && b, "cannot make the stale segments");
    if (a) fclose(a);
    if (b) fclose(b);
    struct timespec ts[2] = {{time(NULL) - 120, 0}, {time(NULL) - 120, 0}};
    KT_CHECK(utimensat(AT_FDCWD, old, ts, 0) == 0, "utimensat: %s", strerror(errno));
    kt_team t;
    kt_team_init(&t, "sweep", transports_main, 2, 0, 10000);
    t.arg = "shm";
    kt_team_run(&t);
    KT_CHECK(access(old, F_OK) != 0, "the dead process's old segment %s was not removed", old);
    KT_CHECK(access(young, F_OK) == 0, "a segment under a minute old was removed");
    unlink(old);
    unlink(young);
}

/* ---- a rank killed while its peers wait on it --------------------------------------------- */
static void dies_main(prank *p) {
    check_allreduce(p, 1000, KVPS_ALGO_AUTO);
    if (p->rank == 1) { kt_sleep_ms(200); raise(SIGKILL); }
    kvps_result rc;
    const char *what;
    int64_t t0 = kvps__now_ms();
    if (p->rank == 0) { /* a send that waits for room in the dead rank's full queue */
        size_t n = 4 << 20;
        float *b = (float *)calloc(n, sizeof *b);
        what = "send of 16 MB to it";
        rc = kvps_ring_send(p->r, b, n, KVPS_FLOAT32, 1, 5);
        free(b);
    } else if (p->rank == 2) { /* a receive asleep on its futex */
        float v;
        what = "recv from it";
        rc = kvps_ring_recv(p->r, &v, 1, KVPS_FLOAT32, 1, 5);
    } else { /* a collective */
        what = "allreduce";
        float b[256] = {0};
        rc = kvps_ring_allreduce(p->r, b, b, 256, KVPS_FLOAT32, KVPS_SUM);
    }
    const char *e = kvps_ring_last_error(p->r);
    /* the collective may wait on a live rank that failed first (PEER) or on the dead one */
    int named = strstr(e, "rank 1 (process ") && strstr(e, "is gone");
    if (!(rc == KVPS_ERR_PEER_LOST && named) && !(p->rank == 3 && rc == KVPS_ERR_PEER))
        pr_fail(p, "rank %d, %s a dead rank 1: %s [%s], want KVPS_ERR_PEER_LOST naming rank 1", p->rank, what,
                kvps_result_str(rc), e);
    if (kvps__now_ms() - t0 > 5 * 20000) pr_fail(p, "rank %d: took %lld ms (a hang check)", p->rank, (long long)(kvps__now_ms() - t0));
}

static void test_dead_rank_named(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    pid_t pids[KT_MAXR];
    int sts[KT_MAXR];
    procs_run(4, dies_main, 20000, NULL, 0, pids, sts);
    KT_CHECK(WIFSIGNALED(sts[1]), "rank 1 was not killed (status %d)", sts[1]);
    for (int i = 0; i < 4; i++)
        if (i != 1) KT_CHECK(WIFEXITED(sts[i]) && WEXITSTATUS(sts[i]) == 0, "rank %d: status %d (above)", i, sts[i]);
    kvps_log_set_level(KVPS_LOG_ERROR);
}

/* ---- two hosts of two ranks (KVPS_RING_HOST_ID) --------------------------------------------- */
static void hosts_main(prank *p) {
    check_allreduce(p, 10, KVPS_ALGO_AUTO);
    for (int j = 0; j < p->k; j++) {
        const char *want = j == p->rank ? "self" : j / 2 == p->rank / 2 ? "shm" : "tcp";
        if (strcmp(kvps_ring_transport(p->r, j), want) != 0)
            pr_fail(p, "rank %d reaches rank %d by %s, want %s", p->rank, j, kvps_ring_transport(p->r, j), want);
    }
    const int *g = p->r->desc.groups;
    if (!g || g[0] != g[1] || g[2] != g[3] || g[0] == g[2]) pr_fail(p, "groups not found from the hosts");
    if (kvps_ring__allreduce_algo(p->r, KVPS_ALGO_AUTO, 4 << 20, 0) != KVPS_ALGO_HIER)
        pr_fail(p, "AUTO does not run HIER for 4 MB across two hosts");
    static const size_t sizes[] = {1, 1000, 200000, 3000000};
    static const kvps_ring_algo algos[] = {KVPS_ALGO_AUTO, KVPS_ALGO_HIER, KVPS_ALGO_RD, KVPS_ALGO_RING};
    for (int s = 0; s < 4; s++)
        for (int a = 0; a < 4; a++) check_allreduce(p, sizes[s], algos[a]);
}

static void test_two_hosts(void) {
    static const char *const hosts[] = {"host-a", "host-a", "host-b", "host-b"};
    pid_t pids[KT_MAXR];
    KT_CHECK(procs_run(4, hosts_main, 30000, hosts, 0, pids, NULL) == 0, "two hosts of two ranks failed (above)");
}

/* ---- a /dev/shm too small ------------------------------------------------------------------ */
static char g_log[2048];
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER; /* (every rank thread logs) */
static void grab_log(void *user, kvps_log_level lv, const char *msg) {
    (void)user; (void)lv;
    pthread_mutex_lock(&g_log_mu);
    if (strstr(msg, "shared memory")) snprintf(g_log + strlen(g_log), sizeof g_log - strlen(g_log), "%s\n", msg);
    pthread_mutex_unlock(&g_log_mu);
}

static void small_main(kt_rk *x) {
    int32_t b[1000];
    for (int i = 0; i < 1000; i++) b[i] = val(x->rank, (size_t)i);
    if (!kt_rk_call(x, kvps_ring_allreduce(x->r, b, b, 1000, KVPS_INT32, KVPS_SUM), "allreduce")) return;
    for (int i = 0; i < 1000; i++) {
        int32_t want = 0;
        for (int r = 0; r < x->k; r++) want += val(r, (size_t)i);
        if (b[i] != want) { kt_rk_fail(x, "element %d", i); break; }
    }
    for (int j = 0; j < x->k; j++)
        if (j != x->rank && strcmp(kvps_ring_transport(x->r, j), "shm") == 0) kt_rk_fail(x, "rank %d: shm to %d", x->rank, j);
}

static void small_devshm_body(void) {
    /* a mount namespace of its own, /dev/shm a 256 KiB tmpfs there: a queue (1 MiB) cannot be reserved */
    if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) != 0 /* (type ignored here) */ ||
        mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=256k") != 0) {
        KT_CHECK(0, "a small tmpfs on /dev/shm: %s (the probe could make one)", strerror(errno));
        return;
    }
    kvps_log_set_fn(grab_log, NULL);
    kvps_log_set_level(KVPS_LOG_WARN);
    kt_run_team("small /dev/shm", small_main, 3, 1, 10000, NULL);
    pthread_mutex_lock(&g_log_mu);
    KT_CHECK(strstr(g_log, "/dev/shm is full"), "no warning names the full /dev/shm: '%s'", g_log);
    pthread_mutex_unlock(&g_log_mu);
}

/* Whether a child can make a mount namespace with a tmpfs of its own on /dev/shm (root, and
   CAP_SYS_ADMIN: a container may refuse it). */
static int can_mount_small_devshm(void) {
    fflush(stdout);
    pid_t p = fork();
    if (p == 0)
        _exit(unshare(CLONE_NEWNS) == 0 && mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) == 0 &&
                      mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=256k") == 0
                  ? 0
                  : 1);
    int st = 0;
    return p > 0 && waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void test_small_devshm_falls_back(void) {
    if (!can_mount_small_devshm()) { KT_SKIP("cannot mount a small tmpfs on /dev/shm in a mount namespace here (root and CAP_SYS_ADMIN)"); return; }
    kt_isolated(small_devshm_body, 60);
}

int main(void) {
    int64_t t0 = kvps__now_ms();
    if (!KVPS_RING__HAS_SHM) { printf("skipped: no shared memory transport on this OS\n0 passed, 0 failed\n"); return 0; }
    const char *off = getenv("KVPS_RING_SHM");
    if (off && strcmp(off, "0") == 0) { printf("skipped: KVPS_RING_SHM=0 turns off what this tests\n0 passed, 0 failed\n"); return 0; }
    KT_RUN(test_transport_chosen, 60);
    KT_RUN(test_processes_oracle, 120);
    KT_RUN(test_sigkill_leaves_nothing, 60);
    KT_RUN(test_stale_segment_swept, 30);
    KT_RUN(test_dead_rank_named, 120);
    KT_RUN(test_two_hosts, 120);
    KT_RUN(test_small_devshm_falls_back, 60);
    printf("  info: test_ring_shm took %.1f s\n", (double)(kvps__now_ms() - t0) / 1000.0);
    return kt_finish();
}
