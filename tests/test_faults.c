/* test_faults - connections dropped mid-run (exactly-once pushes), checkpoints (round trip and
   every kind of bad file; temporary files of writers killed mid-write removed; a full disk tried
   again at the next checkpoint, not every round), a server killed with SIGKILL and restarted
   from its checkpoint, and a worker lost under BSP. Loopback TCP only; temporary files under
   $TMPDIR, removed. KT_ONLY=word runs the tests whose name has it. */
#define _DEFAULT_SOURCE
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>
#include <dirent.h>
#include <time.h>
#include <dirent.h>
#include <fcntl.h>
#ifdef __linux__
#include <sys/mount.h>
#include <sys/syscall.h>
#endif

/* ---- a TCP proxy whose connections can be cut ---------------------------------------------- */
typedef struct proxy {
    int lfd, port, upstream_port;
    int stop, cut; /* cut: close every connection now (the listener stays); atomics */
    int hold;      /* atomic: forward nothing from the server side (replies stay unread) */
    int cut_hs;    /* atomic: this many new connections are closed after the client's first bytes
                      (a cut during the ZeroMQ handshake) */
    int cuts_done;
    pthread_t th;
} proxy;

static int listen_any(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)*port);
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 16) != 0) { close(fd); return -1; }
    getsockname(fd, (struct sockaddr *)&a, &len);
    *port = ntohs(a.sin_port);
    return fd;
}

static int connect_port(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { close(fd); return -1; }
    return fd;
}

static void *proxy_main(void *arg) {
    proxy *p = (proxy *)arg;
    enum { MAXC = 16 };
    int cfd[MAXC], ufd[MAXC], n = 0;
    char buf[65536];
    while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
        if (__atomic_load_n(&p->cut, __ATOMIC_ACQUIRE)) {
            for (int i = 0; i < n; i++) { close(cfd[i]); close(ufd[i]); }
            n = 0;
            __atomic_store_n(&p->cut, 0, __ATOMIC_RELEASE);
            __atomic_add_fetch(&p->cuts_done, 1, __ATOMIC_ACQ_REL);
        }
        struct pollfd pf[1 + 2 * MAXC];
        pf[0] = (struct pollfd){p->lfd, POLLIN, 0};
        for (int i = 0; i < n; i++) {
            pf[1 + 2 * i] = (struct pollfd){cfd[i], POLLIN, 0};
            pf[2 + 2 * i] = (struct pollfd){ufd[i], POLLIN, 0};
        }
        if (poll(pf, (nfds_t)(1 + 2 * n), 20) <= 0) continue;
        int polled = n; /* a connection accepted now has no poll result yet */
        if ((pf[0].revents & POLLIN) && n < MAXC && __atomic_load_n(&p->cut_hs, __ATOMIC_ACQUIRE) > 0) {
            int c = accept(p->lfd, NULL, NULL);
            struct pollfd cp = {c, POLLIN, 0};
            if (c >= 0 && poll(&cp, 1, 2000) == 1) { /* the client's greeting: read, then cut */
                ssize_t got = read(c, buf, sizeof buf);
                (void)got;
                __atomic_sub_fetch(&p->cut_hs, 1, __ATOMIC_ACQ_REL);
            }
            if (c >= 0) close(c);
        } else if ((pf[0].revents & POLLIN) && n < MAXC) {
            int c = accept(p->lfd, NULL, NULL);
            int u = c >= 0 ? connect_port(p->upstream_port) : -1;
            if (c >= 0 && u >= 0) { cfd[n] = c; ufd[n] = u; n++; }
            else { if (c >= 0) close(c); if (u >= 0) close(u); }
        }
        kt_proxy_copy(pf, polled, cfd, ufd, &n, __atomic_load_n(&p->hold, __ATOMIC_ACQUIRE), buf, sizeof buf);
    }
    for (int i = 0; i < n; i++) { close(cfd[i]); close(ufd[i]); }
    return NULL;
}

static int proxy_start(proxy *p, int upstream_port) {
    memset(p, 0, sizeof *p);
    p->upstream_port = upstream_port;
    p->lfd = listen_any(&p->port);
    if (p->lfd < 0) return -1;
    return pthread_create(&p->th, NULL, proxy_main, p);
}

static void proxy_cut(proxy *p) {
    int want = __atomic_load_n(&p->cuts_done, __ATOMIC_ACQUIRE) + 1;
    __atomic_store_n(&p->cut, 1, __ATOMIC_RELEASE);
    while (__atomic_load_n(&p->cuts_done, __ATOMIC_ACQUIRE) < want) usleep(1000);
}

static void proxy_stop(proxy *p) {
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
    pthread_join(p->th, NULL);
    close(p->lfd);
}

static int port_of(const char *endpoint) {
    const char *c = strrchr(endpoint, ':');
    return c ? atoi(c + 1) : -1;
}

/* Waits, retrying while the answer is only late (the request stays valid), up to total_ms. */
static kvps_result wait_patiently(kvps_worker *w, kvps_req q, int total_ms, int *lost_seen) {
    int64_t until = kvps__now_ms() + total_ms;
    for (;;) {
        kvps_result r = kvps_worker_wait(w, q, 200);
        if (r == KVPS_ERR_PEER_LOST && lost_seen) (*lost_seen)++;
        if ((r != KVPS_ERR_TIMEOUT && r != KVPS_ERR_PEER_LOST) || kvps__now_ms() > until) return r;
    }
}

/* Pushes through a proxy whose connections are cut several times mid-run: every push is
   applied exactly once (integer sums, exact), under async and BSP, with the tensor in one slice
   and cut into 5 (max_slice 1000: each push is a chain of 5 requests, all in flight). */
static void test_exactly_once_over_cuts(void) {
    for (int mode = 0; mode < 4; mode++) {
        int bsp = mode & 1, pieces = mode >> 1;
        kvps_server *s = NULL;
        KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1,
                                                      .consistency = bsp ? KVPS_BSP : KVPS_ASYNC,
                                                      .update = KVPS_UPDATE_ACCUMULATE, .heartbeat_ms = 100,
                                                      .peer_timeout_ms = 60000},
                                 &s));
        KT_OK(kvps_server_start(s));
        proxy px;
        KT_CHECK(proxy_start(&px, port_of(kvps_server_endpoint(s))) == 0, "proxy");
        char ep[64];
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", px.port);
        kvps_worker *w = NULL;
        KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = ep, .heartbeat_ms = 100, .peer_timeout_ms = 500,
                                                     .max_slice = pieces ? 1000 : 0}, &w));
        enum { LEN = 4099, STEPS = 400, WIN = 8 };
        float *g = (float *)malloc(LEN * sizeof(float)), *v = (float *)malloc(LEN * sizeof(float));
        for (int i = 0; i < LEN; i++) g[i] = (float)(i % 7 + 1);
        kvps_tensor t;
        KT_OK(kvps_worker_tensor(w, "x", LEN, &t));
        KT_CHECK(kvps_worker_tensor_slices(w, t) == (pieces ? 5u : 1u), "%zu slices", kvps_worker_tensor_slices(w, t));
        kvps_req ring[WIN] = {0};
        int failures = 0;
        for (int k = 0; k < STEPS && !failures; k++) {
            if (k >= WIN && wait_patiently(w, ring[k % WIN], 20000, NULL) != KVPS_OK) failures++;
            if (k % 97 == 50) proxy_cut(&px); /* mid-run, with pushes in flight */
            if (kvps_worker_push_tensor(w, t, g, &ring[k % WIN]) != KVPS_OK) failures++;
        }
        for (int k = STEPS - WIN; k < STEPS && !failures; k++)
            if (wait_patiently(w, ring[k % WIN], 20000, NULL) != KVPS_OK) failures++;
        KT_CHECK(failures == 0, "bsp=%d pieces=%d: a push failed: %s", bsp, pieces, kvps_worker_last_error(w));
        kvps_req q;
        KT_OK(kvps_worker_pull_tensor(w, t, v, &q));
        KT_OK(wait_patiently(w, q, 20000, NULL));
        int bad = 0;
        for (int i = 0; i < LEN && !bad; i++)
            if (v[i] != (float)STEPS * g[i]) {
                KT_CHECK(0, "bsp=%d pieces=%d [%d] = %g, want %g (%d cuts)", bsp, pieces, i, (double)v[i], (double)STEPS * g[i],
                         px.cuts_done);
                bad = 1;
            }
        kvps_server_stats st;
        kvps_server_stats_get(s, &st);
        KT_CHECK(px.cuts_done >= 4, "%d cuts", px.cuts_done);
        printf("  bsp=%d slices=%d: %d connection cuts, %llu re-sent requests answered without applying them again\n", bsp,
               pieces ? 5 : 1, px.cuts_done, (unsigned long long)st.duplicates);
        free(g);
        free(v);
        kvps_worker_destroy(&w);
        proxy_stop(&px);
        kvps_server_destroy(&s);
    }
}

/* ---- checkpoints ---------------------------------------------------------------------------- */
static char tmpdir[256];

static void path_in_tmp(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", tmpdir, name); }

/* Every update rule (the rules table, KVPS_RULE_COUNT of them) on a tensor and on a sparse
   table: a few rounds, a checkpoint, a restore into a second server, then the same pushes to
   both; the restored one must give the same bits as the one never stopped. A rule added as a row
   of kvps__rules is covered here without a change to this test. */
static void test_every_rule_checkpoints(void) {
    char path[320];
    path_in_tmp(path, sizeof path, "rules.ckpt");
    enum { LEN = 300, DIM = 4, NROWS = 10 };
    float g[LEN], a[LEN], b[LEN];
    uint64_t ids[NROWS];
    for (int i = 0; i < NROWS; i++) ids[i] = (uint64_t)i * 7919u + 1u;
    for (int rule = KVPS_RULE_DEFAULT + 1; rule < KVPS_RULE_COUNT; rule++) {
        kvps_server *s[2] = {NULL, NULL};
        kvps_worker *w[2] = {NULL, NULL};
        kvps_tensor t[2];
        kvps_table tb[2];
        kvps_req q;
        kvps_optim o = {(kvps_rule)rule, 0.05f, 0, 0, 0, 0, rule == KVPS_RULE_ADAMW ? 0.01f : 0.0f};
        kvps_table_desc td = {.name = "emb", .dim = DIM, .opt = o, .init_scale = 0.1f, .seed = 9};
        if (rule == KVPS_RULE_ADAMW) td.opt = (kvps_optim){.rule = KVPS_RULE_ADAM, .lr = 0.05f}; /* (rows keep no step) */
        for (int i = 0; i < 2; i++) {
            KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1,
                                                          .checkpoint_path = path}, &s[i]));
            if (i == 1) KT_CHECK(kvps_server_restore(s[1], path) == KVPS_OK, "rule %d: the checkpoint is refused", rule);
            KT_OK(kvps_server_start(s[i]));
            KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(s[i])}, &w[i]));
            KT_OK(kvps_worker_tensor(w[i], "w", LEN, &t[i]));
            KT_OK(kvps_worker_table(w[i], &td, &tb[i], &q));
            KT_OK(kvps_worker_wait(w[i], q, -1));
            if (i == 1) break;
            KT_OK(kvps_worker_tensor_optim(w[0], t[0], &o, &q));
            KT_OK(kvps_worker_wait(w[0], q, -1));
            uint64_t seed = 11;
            for (int step = 0; step < 3; step++) {
                for (int j = 0; j < LEN; j++) g[j] = kt_randf(&seed);
                KT_OK(kvps_worker_push_tensor(w[0], t[0], g, &q));
                KT_OK(kvps_worker_wait(w[0], q, -1));
                KT_OK(kvps_worker_push_rows(w[0], tb[0], ids, g, NROWS, &q));
                KT_OK(kvps_worker_wait(w[0], q, -1));
            }
            KT_OK(kvps_server_checkpoint(s[0], 5000));
        }
        uint64_t seed = 12;
        for (int step = 0; step < 2; step++) {
            for (int j = 0; j < LEN; j++) g[j] = kt_randf(&seed);
            for (int i = 0; i < 2; i++) {
                KT_OK(kvps_worker_push_tensor(w[i], t[i], g, &q));
                KT_OK(kvps_worker_wait(w[i], q, -1));
                KT_OK(kvps_worker_push_rows(w[i], tb[i], ids, g, NROWS, &q));
                KT_OK(kvps_worker_wait(w[i], q, -1));
            }
        }
        float *out[2] = {a, b};
        for (int i = 0; i < 2; i++) {
            KT_OK(kvps_worker_pull_tensor(w[i], t[i], out[i], &q));
            KT_OK(kvps_worker_wait(w[i], q, -1));
        }
        KT_CHECK(memcmp(a, b, sizeof a) == 0, "rule %d: the restored tensor diverged", rule);
        for (int i = 0; i < 2; i++) {
            KT_OK(kvps_worker_pull_rows(w[i], tb[i], ids, out[i], NROWS, &q));
            KT_OK(kvps_worker_wait(w[i], q, -1));
        }
        KT_CHECK(memcmp(a, b, NROWS * DIM * sizeof(float)) == 0, "rule %d: the restored table diverged", rule);
        for (int i = 0; i < 2; i++) { kvps_worker_destroy(&w[i]); kvps_server_destroy(&s[i]); }
    }
    unlink(path); /* (left behind, it kept the temporary folder from going) */
}

/* A server with momentum and Adam keys after a few rounds, checkpointed, then restored into a
   fresh server: continuing both with the same pushes gives the same bits as never stopping. */
static void test_checkpoint_round_trip(void) {
    char path[320];
    path_in_tmp(path, sizeof path, "a.ckpt");
    kt_cluster c;
    kt_cluster_up(&c, "tcp", 1, &(kvps_server_desc){.num_workers = 1, .update = KVPS_UPDATE_SGD, .lr = 0.1f,
                                                     .checkpoint_path = path});
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers}, &w));
    enum { LEN = 1000 };
    kvps_tensor t[2];
    kvps_req q;
    KT_OK(kvps_worker_tensor(w, "m", LEN, &t[0]));
    KT_OK(kvps_worker_tensor(w, "a", LEN, &t[1]));
    KT_OK(kvps_worker_tensor_optim(w, t[0], &(kvps_optim){.rule = KVPS_RULE_MOMENTUM, .lr = 0.05f}, &q));
    KT_OK(kvps_worker_wait(w, q, -1));
    KT_OK(kvps_worker_tensor_optim(w, t[1], &(kvps_optim){.rule = KVPS_RULE_ADAM, .lr = 0.01f}, &q));
    KT_OK(kvps_worker_wait(w, q, -1));
    float g[LEN], a[LEN], b[LEN];
    uint64_t seed = 5;
    /* and a sparse table with Adam state per row */
    enum { DIM = 8, NROWS = 50 };
    kvps_table_desc td = {.name = "emb", .dim = DIM, .opt = {KVPS_RULE_ADAM, 0.01f, 0, 0, 0, 0, 0}, .init_scale = 0.1f, .seed = 3};
    kvps_table tb, tb2;
    uint64_t ids[NROWS];
    for (int i = 0; i < NROWS; i++) ids[i] = (uint64_t)i * 1000003u + 7u;
    KT_OK(kvps_worker_table(w, &td, &tb, &q));
    KT_OK(kvps_worker_wait(w, q, -1));
    for (int step = 0; step < 6; step++) {
        for (int i = 0; i < 2; i++) {
            for (int j = 0; j < LEN; j++) g[j] = kt_randf(&seed);
            KT_OK(kvps_worker_push_tensor(w, t[i], g, &q));
            KT_OK(kvps_worker_wait(w, q, -1));
        }
        for (int j = 0; j < NROWS * DIM; j++) g[j] = kt_randf(&seed);
        KT_OK(kvps_worker_push_rows(w, tb, ids, g, NROWS - step * 5, &q)); /* rows touched a varying number of times */
        KT_OK(kvps_worker_wait(w, q, -1));
    }
    KT_OK(kvps_server_checkpoint(c.srv[0], 5000));
    kvps_server_stats st;
    kvps_server_stats_get(c.srv[0], &st);
    KT_CHECK(st.checkpoints == 1, "%llu checkpoints", (unsigned long long)st.checkpoints);

    /* the file's CRC, checked with zlib's crc32 (an independent implementation) */
    FILE *f = fopen(path, "rb");
    KT_CHECK(f != NULL, "no file at %s", path);
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *file = (unsigned char *)malloc((size_t)size);
    KT_CHECK(fread(file, 1, (size_t)size, f) == (size_t)size, "read");
    fclose(f);
    uint32_t stored;
    memcpy(&stored, file + size - 8, 4);
    KT_CHECK(stored == (uint32_t)crc32(0L, file, (uInt)(size - 8)), "CRC differs from zlib's");

    /* a second server restored from the file, next to the first, both continued */
    kvps_server *s2 = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1,
                                                  .update = KVPS_UPDATE_SGD, .lr = 0.1f},
                             &s2));
    KT_OK(kvps_server_restore(s2, path));
    KT_CHECK(kvps_server_restore(s2, path) == KVPS_ERR_STATE, "restore twice");
    KT_OK(kvps_server_start(s2));
    kvps_worker *w2 = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(s2)}, &w2));
    kvps_tensor t2[2];
    KT_OK(kvps_worker_tensor(w2, "m", LEN, &t2[0]));
    KT_OK(kvps_worker_tensor(w2, "a", LEN, &t2[1]));
    KT_OK(kvps_worker_table(w2, &td, &tb2, &q));
    KT_OK(kvps_worker_wait(w2, q, -1));
    for (int step = 0; step < 4; step++) {
        for (int i = 0; i < 2; i++) {
            for (int j = 0; j < LEN; j++) g[j] = kt_randf(&seed);
            KT_OK(kvps_worker_push_tensor(w, t[i], g, &q));
            KT_OK(kvps_worker_wait(w, q, -1));
            KT_OK(kvps_worker_push_tensor(w2, t2[i], g, &q));
            KT_OK(kvps_worker_wait(w2, q, -1));
        }
        for (int j = 0; j < NROWS * DIM; j++) g[j] = kt_randf(&seed);
        KT_OK(kvps_worker_push_rows(w, tb, ids, g, NROWS, &q));
        KT_OK(kvps_worker_wait(w, q, -1));
        KT_OK(kvps_worker_push_rows(w2, tb2, ids, g, NROWS, &q));
        KT_OK(kvps_worker_wait(w2, q, -1));
    }
    KT_OK(kvps_worker_pull_rows(w, tb, ids, a, NROWS, &q));
    KT_OK(kvps_worker_wait(w, q, -1));
    KT_OK(kvps_worker_pull_rows(w2, tb2, ids, b, NROWS, &q));
    KT_OK(kvps_worker_wait(w2, q, -1));
    KT_CHECK(memcmp(a, b, NROWS * DIM * sizeof(float)) == 0, "table rows diverged after the restore");
    for (int i = 0; i < 2; i++) {
        KT_OK(kvps_worker_pull_tensor(w, t[i], a, &q));
        KT_OK(kvps_worker_wait(w, q, -1));
        KT_OK(kvps_worker_pull_tensor(w2, t2[i], b, &q));
        KT_OK(kvps_worker_wait(w2, q, -1));
        KT_CHECK(memcmp(a, b, sizeof a) == 0, "tensor %d: restored server diverged (optimizer state or rounds lost)", i);
    }

    /* bad files: each refused with KVPS_ERR_CHECKPOINT, nothing loaded */
    char bad[320];
    path_in_tmp(bad, sizeof bad, "bad.ckpt");
    struct { const char *what; long keep; long flip; } cases[] = {
        {"torn (cut short)", size / 2, -1}, {"torn (last byte gone)", size - 1, -1},
        {"a flipped bit", size, size / 3}, {"empty", 0, -1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        f = fopen(bad, "wb");
        if (cases[i].flip >= 0) file[cases[i].flip] ^= 0x10;
        fwrite(file, 1, (size_t)cases[i].keep, f);
        if (cases[i].flip >= 0) file[cases[i].flip] ^= 0x10;
        fclose(f);
        kvps_server *s3 = NULL;
        KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://ckpt-bad", .num_workers = 1}, &s3));
        KT_CHECK(kvps_server_restore(s3, bad) == KVPS_ERR_CHECKPOINT, "%s accepted", cases[i].what);
        kvps_server_stats_get(s3, &st);
        KT_CHECK(st.keys == 0, "%s: %llu keys loaded", cases[i].what, (unsigned long long)st.keys);
        kvps_server_destroy(&s3);
    }
    f = fopen(bad, "wb");
    fputs("#!/bin/sh\necho not a checkpoint\n", f);
    fclose(f);
    const struct { const char *what, *file; int rank, workers; } other[] = {
        {"a foreign file", bad, 0, 1}, {"another rank's file", path, 1, 1}, {"another job's file", path, 0, 3},
        {"a missing file", "/nonexistent/kvps.ckpt", 0, 1}};
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        kvps_server *s3 = NULL;
        KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://ckpt-bad", .num_workers = other[i].workers,
                                                      .rank = other[i].rank},
                                 &s3));
        KT_CHECK(kvps_server_restore(s3, other[i].file) == KVPS_ERR_CHECKPOINT, "%s accepted", other[i].what);
        kvps_server_destroy(&s3);
    }
    /* no checkpoint_path: a configuration error, not a crash */
    kvps_server *s4 = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://ckpt-none", .num_workers = 1}, &s4));
    KT_CHECK(kvps_server_checkpoint(s4, 100) == KVPS_ERR_CONFIG, "checkpoint without a path");
    kvps_server_destroy(&s4);
    unlink(bad);
    unlink(path);
    free(file);
    kvps_worker_destroy(&w2);
    kvps_server_destroy(&s2);
    kvps_worker_destroy(&w);
    kt_cluster_down(&c);
}

/* The server process is killed with SIGKILL mid-training and started again from its last
   checkpoint on the same port; the workers reconnect by themselves and finish. The oracle is
   exact: at step k worker r pushes a one into element k * M + r alone, so each element of the
   final value counts how often that one push was applied. Two kills, each at a step the test
   chooses (the workers pause there, so that the kill lands mid-run by construction):
   - K1, the last step before a checkpoint, with the server's replies held back in the proxy:
     the round is applied and checkpointed but no worker hears of it, so after the restart both
     re-send a push that the restored server has already applied. Exactly once: every element
     of step K1 is 1 (with the duplicate check off it is 2).
   - K2, five steps after a checkpoint: the restored server lacks the five steps since it, which
     the workers had been answered; they send them again behind their hellos (FAULTS,
     checkpoints), so nothing is lost: every element is 1 (before issue 27 item 4 those steps'
     elements were 0). */
static pid_t spawn_server(int port, const char *path, int restore, int every) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    kvps_server *s = NULL;
    kvps_result r = kvps_server_create(&(kvps_server_desc){.endpoint = ep, .num_workers = 2, .update = KVPS_UPDATE_ACCUMULATE,
                                                           .checkpoint_path = path, .checkpoint_every = every,
                                                           .heartbeat_ms = 100, .peer_timeout_ms = 30000},
                                       &s);
    if (r == KVPS_OK && restore) r = kvps_server_restore(s, path);
    if (r != KVPS_OK) _exit(3);
    kvps_server_run(s); /* until killed */
    _exit(0);
}

enum { KM = 2, KSTEPS = 60, KEVERY = 10, KLEN = 2048 };
/* Where the workers stop before pushing, until released (-1: nowhere). */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int at, paused, ended; /* ended: workers that finished or failed */
} kpause = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, -1, 0, 0};

static void kpause_here(int step) {
    pthread_mutex_lock(&kpause.mu);
    if (step == kpause.at) {
        kpause.paused++;
        pthread_cond_broadcast(&kpause.cv);
        while (step == kpause.at) pthread_cond_wait(&kpause.cv, &kpause.mu);
    }
    pthread_mutex_unlock(&kpause.mu);
}
static void kpause_end(void) {
    pthread_mutex_lock(&kpause.mu);
    kpause.ended++;
    pthread_cond_broadcast(&kpause.cv);
    pthread_mutex_unlock(&kpause.mu);
}
/* Waits (up to 30 s) until every worker has stopped at the pause; 0 when they all did. */
static int kpause_wait_all(void) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    pthread_mutex_lock(&kpause.mu);
    int rc = 0;
    while (kpause.paused + kpause.ended < KM && rc == 0) rc = pthread_cond_timedwait(&kpause.cv, &kpause.mu, &until);
    int ok = kpause.paused == KM;
    pthread_mutex_unlock(&kpause.mu);
    return ok ? 0 : -1;
}
static void kpause_move(int at) {
    pthread_mutex_lock(&kpause.mu);
    kpause.at = at;
    kpause.paused = 0;
    pthread_cond_broadcast(&kpause.cv);
    pthread_mutex_unlock(&kpause.mu);
}

/* A worker's record: the values it pulled last, and its waits that saw the server lost. */
typedef struct kres {
    int lost_seen;
    float v[KLEN];
} kres;

static void kill_worker(kt_wk *x) {
    kres *j = (kres *)x->mine;
    kvps_worker *w = NULL;
    /* peer_timeout 3 s: while the proxy holds the server's side (kill 1), a worker must still get
       its push of step K1 out on the connection it has; with 300 ms a slow moment (ASan, a busy
       machine) dropped that connection first, the new one could not finish its handshake through
       the hold, the round never completed and no checkpoint came (seen once in CI) */
    kvps_result r = kvps_worker_create(&(kvps_worker_desc){.servers = x->ws->servers, .rank = x->rank, .heartbeat_ms = 100,
                                                            .peer_timeout_ms = 3000}, &w);
    if (r != KVPS_OK) {
        kt_wk_fail(x, "create: %s", kvps_result_str(r));
        kpause_end();
        return;
    }
    static float g[KM][KLEN];
    kvps_tensor t;
    kvps_worker_tensor(w, "w", KLEN, &t);
    for (int k = 0; k < KSTEPS && !x->fails; k++) {
        kpause_here(k);
        memset(g[x->rank], 0, sizeof g[x->rank]);
        g[x->rank][k * KM + x->rank] = 1.0f;
        kvps_req q;
        r = kvps_worker_pushpull_tensor(w, t, g[x->rank], j->v, &q);
        if (r == KVPS_OK) r = wait_patiently(w, q, 30000, &j->lost_seen);
        if (r != KVPS_OK) kt_wk_fail(x, "step %d: %s %.200s", k, kvps_result_str(r), kvps_worker_last_error(w));
        /* this step's pushes, each once; nothing of later steps */
        for (int i = k * KM; i < KLEN && !x->fails; i++)
            if (j->v[i] != (i < (k + 1) * KM ? 1.0f : 0.0f)) kt_wk_fail(x, "step %d: element %d is %g", k, i, (double)j->v[i]);
    }
    kvps_worker_destroy(&w);
    kpause_end();
}

static ino_t inode_of(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? sb.st_ino : 0;
}

static void test_kill9_and_restart(void) {
    char path[320];
    path_in_tmp(path, sizeof path, "kill.ckpt");
    unlink(path);
    int port = 0, lfd = listen_any(&port); /* a free port for every server life */
    close(lfd);
    const int K1 = 3 * KEVERY - 1, K2 = 4 * KEVERY + 5;
    pid_t pid = spawn_server(port, path, 0, KEVERY);
    proxy px;
    KT_CHECK(proxy_start(&px, port) == 0, "proxy");
    static kres jobs[KM];
    memset(jobs, 0, sizeof jobs);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", px.port);
    static kt_workers ws;
    kt_workers_init(&ws, "kill -9", kill_worker, KM, ep, NULL);
    ws.each = jobs;
    ws.each_size = sizeof jobs[0];
    kpause.ended = 0;
    kpause_move(K1);
    kt_workers_start(&ws);
    int status = 0, at1 = 0, at2 = 0, ckpt1 = 0;
    /* kill 1: step K1's round applied and checkpointed, its replies never delivered */
    if (kpause_wait_all() == 0) {
        at1 = 1;
        ino_t before = inode_of(path); /* the checkpoint of round K1 + 1 - KEVERY */
        __atomic_store_n(&px.hold, 1, __ATOMIC_RELEASE);
        kpause_move(K2);
        for (int i = 0; i < 3000 && inode_of(path) == before; i++) usleep(10000); /* renamed into place */
        ckpt1 = inode_of(path) != before;
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        pid = spawn_server(port, path, 1, KEVERY);
        proxy_cut(&px);
        __atomic_store_n(&px.hold, 0, __ATOMIC_RELEASE);
    }
    KT_CHECK(at1, "the workers never reached step %d", K1);
    KT_CHECK(ckpt1, "no checkpoint of round %d was written", K1 + 1);
    /* kill 2: five rounds after the checkpoint of round 4 x KEVERY */
    if (at1 && kpause_wait_all() == 0) {
        at2 = 1;
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        pid = spawn_server(port, path, 1, KEVERY);
        proxy_cut(&px);
    }
    KT_CHECK(at2, "the workers never reached step %d", K2);
    kpause_move(-1);
    int failures = kt_workers_join(&ws); /* (each reported) */
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    proxy_stop(&px);
    KT_CHECK(failures == 0, "%d workers failed", failures);
    /* the exact oracle: every push applied once, none lost (the steps since the checkpoint
       included) */
    int lost_from = K2 / KEVERY * KEVERY, wrong = 0;
    for (int i = 0; i < KLEN; i++) {
        int step = i / KM;
        float want = step >= KSTEPS ? 0.0f : 1.0f;
        if (jobs[0].v[i] != want || jobs[1].v[i] != want) {
            if (wrong++ < 5)
                printf("  element %d (step %d, rank %d): %g / %g, want %g\n", i, step, i % KM, (double)jobs[0].v[i],
                       (double)jobs[1].v[i], (double)want);
        }
    }
    KT_CHECK(wrong == 0, "%d elements applied other than once (steps %d-%d were answered after the checkpoint the server "
             "was restored from)", wrong, lost_from, K2 - 1);
    printf("  killed at steps %d (applied, unanswered) and %d (%d answered steps since the checkpoint, sent again); %d "
           "waits reported the server lost\n", K1, K2, K2 - lost_from, jobs[0].lost_seen + jobs[1].lost_seen);
    unlink(path);
}

/* ---- a restore keeps BSP rounds aligned (issue 27, item 4) ----------------------------------
   Two server processes, each checkpointing its shard every few rounds (4 and 7: the shards'
   checkpoints fall at different rounds), three worker threads doing BSP pushpull steps on three
   tensors (two cut over both servers, one on a single server; an aggregate sum, an accumulating
   sum, and a barrier every 16 steps). The test SIGKILLs a server at random points of the run
   (after a random step, then a random pause: mid-round as often as not) and restarts it on the
   same port from its checkpoint (kvps_server_restore), at least KR_KILLS times and until at
   least KR_REPLAYED of those restores lacked rounds the workers had already been answered.
   The oracle is exact: at step t worker r pushes (r + 1)(t + 1) + i % 3 into element i of
   "agg" (aggregate sum: the pull returns step t's sum alone), (r + 1) + t % 4 + i % 2 into
   "acc" (accumulated: the pull returns the sum of steps 0..t) and (r + 1)(t + 2) + i % 5 into
   "one"; small integers, exact in float32. A round holding one worker's step t and another's
   step t + 1 cannot pass; at the end every worker finishes and both servers end by themselves
   (exit 0). Servers are this binary again (exec, "--kserver"): no fork of a threaded process
   goes on running. */
enum { KR_W = 3, KR_STEPS = 300, KR_KILLS = 6, KR_REPLAYED = 3, KR_AGG = 3000, KR_ACC = 2500, KR_ONE = 100 };
static const int kr_every[2] = {4, 7};
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done[KR_W];  /* steps completed, per worker */
    int failed;      /* a worker failed: no more kills */
    int go;          /* the test has made its last kill: workers may finish */
} kr = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {0}, 0, 0};
static char kr_self[4096] = "/proc/self/exe"; /* this binary (main sets it from argv[0]) */


/* "--kserver PORT RANK PATH RESTORE": one shard's server; with RESTORE 0 it writes its first
   checkpoint before it serves (so that a restart always finds one). Exits 0 once every worker
   has finished (the clean finish), else 3. */
static int kr_server_main(char **argv) {
    char ep[64];
    int rank = atoi(argv[3]);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%s", argv[2]);
    kvps_server *s = NULL;
    kvps_result r = kvps_server_create(&(kvps_server_desc){.endpoint = ep, .rank = rank, .num_workers = KR_W,
                                                           .update = KVPS_UPDATE_ACCUMULATE, .checkpoint_path = argv[4],
                                                           .checkpoint_every = kr_every[rank], .heartbeat_ms = 100,
                                                           .peer_timeout_ms = 30000},
                                       &s);
    if (r == KVPS_OK) r = atoi(argv[5]) ? kvps_server_restore(s, argv[4]) : kvps_server_checkpoint(s, 0);
    if (r == KVPS_OK) r = kvps_server_run(s);
    if (r != KVPS_OK) fprintf(stderr, "kserver %d: %s\n", rank, kvps_result_str(r));
    kvps_server_destroy(&s);
    return r == KVPS_OK ? 0 : 3;
}

static pid_t kr_spawn(int port, int rank, const char *path, int restore) {
    char ps[16], rs[16], re[16];
    snprintf(ps, sizeof ps, "%d", port);
    snprintf(rs, sizeof rs, "%d", rank);
    snprintf(re, sizeof re, "%d", restore);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid != 0) return pid;
    execl(kr_self, "test_faults", "--kserver", ps, rs, path, re, (char *)NULL); /* (nothing but exec in the child) */
    _exit(127);
}

static float kr_agg(int r, int t, int i) { return (float)((r + 1) * (t + 1) + i % 3); }
static float kr_acc(int r, int t, int i) { return (float)((r + 1) + t % 4 + i % 2); }
static float kr_one(int r, int t, int i) { return (float)((r + 1) * (t + 2) + i % 5); }

static void kr_worker(kt_wk *x) {
    kvps_worker *w = NULL;
    if (kvps_worker_create(&(kvps_worker_desc){.servers = x->ws->servers, .rank = x->rank, .num_workers = KR_W,
                                               .heartbeat_ms = 100, .peer_timeout_ms = 3000},
                           &w) != KVPS_OK) {
        kt_wk_fail(x, "create failed");
        pthread_mutex_lock(&kr.mu);
        kr.failed = 1;
        pthread_cond_broadcast(&kr.cv);
        pthread_mutex_unlock(&kr.mu);
        return;
    }
    static float g[KR_W][3][KR_AGG], v[KR_W][3][KR_AGG];
    const char *names[3] = {"agg", "acc", "one"};
    const size_t lens[3] = {KR_AGG, KR_ACC, KR_ONE};
    const kvps_rule rules[3] = {KVPS_RULE_SUM, KVPS_RULE_ACCUMULATE, KVPS_RULE_SUM};
    kvps_tensor t[3];
    kvps_req q[3];
    kvps_result r = KVPS_OK;
    for (int k = 0; k < 3 && r == KVPS_OK; k++) r = kvps_worker_tensor(w, names[k], lens[k], &t[k]);
    for (int k = 0; k < 3 && r == KVPS_OK && x->rank == 0; k++) {
        r = kvps_worker_tensor_optim(w, t[k], &(kvps_optim){.rule = rules[k]}, &q[k]);
        if (r == KVPS_OK) r = wait_patiently(w, q[k], 60000, NULL);
    }
    if (r == KVPS_OK) r = kvps_worker_barrier(w, &q[0]);
    if (r == KVPS_OK) r = wait_patiently(w, q[0], 60000, NULL);
    if (r != KVPS_OK) kt_wk_fail(x, "setting up: %s %s", kvps_result_str(r), kvps_worker_last_error(w));
    double acc_want[KR_ACC] = {0};
    for (int step = 0; step < KR_STEPS && !x->fails; step++) {
        for (size_t i = 0; i < KR_AGG; i++) g[x->rank][0][i] = kr_agg(x->rank, step, (int)i);
        for (size_t i = 0; i < KR_ACC; i++) g[x->rank][1][i] = kr_acc(x->rank, step, (int)i);
        for (size_t i = 0; i < KR_ONE; i++) g[x->rank][2][i] = kr_one(x->rank, step, (int)i);
        for (int k = 0; k < 3 && r == KVPS_OK; k++) r = kvps_worker_pushpull_tensor(w, t[k], g[x->rank][k], v[x->rank][k], &q[k]);
        for (int k = 0; k < 3 && r == KVPS_OK; k++) r = wait_patiently(w, q[k], 60000, NULL);
        if (r == KVPS_OK && step % 16 == 15) {
            r = kvps_worker_barrier(w, &q[0]);
            if (r == KVPS_OK) r = wait_patiently(w, q[0], 60000, NULL);
        }
        if (r != KVPS_OK) {
            kt_wk_fail(x, "step %d: %s %s", step, kvps_result_str(r), kvps_worker_last_error(w));
            break;
        }
        for (size_t i = 0; i < KR_ACC; i++)
            for (int o = 0; o < KR_W; o++) acc_want[i] += kr_acc(o, step, (int)i);
        for (int k = 0; k < 3 && !x->fails; k++)
            for (size_t i = 0; i < lens[k]; i++) {
                double want = 0;
                for (int o = 0; o < KR_W; o++) want += k == 0 ? kr_agg(o, step, (int)i) : k == 2 ? kr_one(o, step, (int)i) : 0;
                if (k == 1) want = acc_want[i];
                if (v[x->rank][k][i] != (float)want) {
                    kt_wk_fail(x, "step %d: tensor '%s' element %zu is %g, the oracle says %g (a round summed from other "
                               "steps than this one)", step, names[k], i, (double)v[x->rank][k][i], want);
                    break;
                }
            }
        pthread_mutex_lock(&kr.mu);
        kr.done[x->rank] = step + 1;
        pthread_cond_broadcast(&kr.cv);
        pthread_mutex_unlock(&kr.mu);
    }
    pthread_mutex_lock(&kr.mu);
    if (x->fails) kr.failed = 1;
    pthread_cond_broadcast(&kr.cv);
    while (!kr.go && !x->fails) pthread_cond_wait(&kr.cv, &kr.mu);
    pthread_mutex_unlock(&kr.mu);
    r = kvps_worker_finish(w, 30000);
    if (r != KVPS_OK && !x->fails) kt_wk_fail(x, "finish: %s %s", kvps_result_str(r), kvps_worker_last_error(w));
    kvps_worker_destroy(&w);
}

/* The fewest steps any worker has completed; waits (up to 60 s) until that is at least `at`. */
static int kr_progress_at_least(int at) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    pthread_mutex_lock(&kr.mu);
    int least = 0, rc = 0;
    for (;;) {
        least = KR_STEPS;
        for (int r = 0; r < KR_W; r++) least = kr.done[r] < least ? kr.done[r] : least;
        if (least >= at || rc != 0 || kr.failed) break;
        rc = pthread_cond_timedwait(&kr.cv, &kr.mu, &until);
    }
    pthread_mutex_unlock(&kr.mu);
    return least;
}

/* The rounds a checkpoint file holds (its keys' highest): read by restoring it into a server
   that never starts. */
static uint64_t kr_ckpt_round(const char *path, int rank) {
    kvps_server *s = NULL;
    uint64_t round = UINT64_MAX;
    if (kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://kr-peek", .rank = rank, .num_workers = KR_W,
                                                .update = KVPS_UPDATE_ACCUMULATE}, &s) == KVPS_OK &&
        kvps_server_restore(s, path) == KVPS_OK)
        round = s->max_round;
    kvps_server_destroy(&s);
    return round;
}

static void test_restore_keeps_rounds(void) {
    char path[2][320];
    int port[2];
    pid_t pid[2];
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    if (getenv("KR_SEED")) seed = strtoull(getenv("KR_SEED"), NULL, 10);
    printf("  seed %llu (KR_SEED=%llu reruns these kill points)\n", (unsigned long long)seed, (unsigned long long)seed);
    for (int s = 0; s < 2; s++) {
        char name[32];
        snprintf(name, sizeof name, "kr%d.ckpt", s);
        path_in_tmp(path[s], sizeof path[s], name);
        unlink(path[s]);
        port[s] = 0;
        close(listen_any(&port[s]));
    }
    for (int s = 0; s < 2; s++) pid[s] = kr_spawn(port[s], s, path[s], 0);
    char servers[128];
    snprintf(servers, sizeof servers, "tcp://127.0.0.1:%d,tcp://127.0.0.1:%d", port[0], port[1]);
    static kt_workers ws;
    kt_workers_init(&ws, "restores", kr_worker, KR_W, servers, NULL);
    memset(&kr.done, 0, sizeof kr.done);
    kr.go = kr.failed = 0;
    kt_workers_start(&ws);
    int kills = 0, replayed = 0, at = 0, spawn_bad = 0;
    while ((kills < KR_KILLS || replayed < KR_REPLAYED) && at < KR_STEPS - 20) {
        at += 4 + (int)(kt_rng(&seed) % (KR_STEPS / KR_KILLS - 10)); /* (spread over the run, barriers too) */
        int least = kr_progress_at_least(at);
        if (least < at) break; /* (the workers stopped: they say why) */
        usleep((useconds_t)(kt_rng(&seed) % 3000)); /* mid-round as often as not */
        int s = (int)(kt_rng(&seed) % 2), st = 0;
        least = kr_progress_at_least(0);
        kill(pid[s], SIGKILL);
        waitpid(pid[s], &st, 0);
        uint64_t round = kr_ckpt_round(path[s], s);
        kills++;
        if (round < (uint64_t)least) replayed++;
        printf("  kill %d: server %d with every worker past step %d; its checkpoint holds %llu rounds%s\n", kills, s, least,
               (unsigned long long)round, round < (uint64_t)least ? ": answered rounds are missing from it" : "");
        pid[s] = kr_spawn(port[s], s, path[s], 1);
        if (pid[s] < 0) spawn_bad++;
    }
    pthread_mutex_lock(&kr.mu);
    kr.go = 1;
    pthread_cond_broadcast(&kr.cv);
    pthread_mutex_unlock(&kr.mu);
    int failures = kt_workers_join(&ws); /* (each reported) */
    KT_CHECK(failures == 0, "%d of %d workers failed", failures, KR_W);
    KT_CHECK(spawn_bad == 0, "a server could not be started again");
    KT_CHECK(kills >= KR_KILLS && replayed >= KR_REPLAYED, "%d kills, %d of them restored without answered rounds", kills,
             replayed);
    for (int s = 0; s < 2; s++) { /* the servers end by themselves once every worker has finished */
        int st = kt_wait_pid(pid[s], kt_now_ms() + 30000);
        KT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "server %d: status %d (%s)", s, st,
                 st == -1 ? "did not end by itself within 30 s after its workers finished" : "not a clean finish");
    }
    printf("  %d kills at random points, %d of them restored from a checkpoint older than rounds already answered\n", kills,
           replayed);
    for (int s = 0; s < 2; s++) unlink(path[s]);
    DIR *d = opendir(tmpdir); /* and a checkpoint that was being written when its server was killed */
    for (struct dirent *e; d && (e = readdir(d)) != NULL;)
        if (strncmp(e->d_name, "kr", 2) == 0 && strstr(e->d_name, ".ckpt.tmp.")) {
            char tmp[600];
            snprintf(tmp, sizeof tmp, "%s/%s", tmpdir, e->d_name);
            unlink(tmp);
        }
    if (d) closedir(d);
}

/* Under BSP a worker that disconnects is lost after peer_timeout_ms: the survivor's pull,
   waiting for a round that cannot complete, gets KVPS_ERR_PEER_LOST instead of hanging. */
/* A BSP server (KVPS_UPDATE_ACCUMULATE, heartbeats 50 ms, a worker lost after 300 ms) and its two
   workers over TCP. */
static void bsp_pair_up(kvps_server **s, kvps_worker *w[2]) {
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 2,
                                                  .update = KVPS_UPDATE_ACCUMULATE, .heartbeat_ms = 50, .peer_timeout_ms = 300},
                             s));
    KT_OK(kvps_server_start(*s));
    for (int r = 0; r < 2; r++)
        KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(*s), .rank = r}, &w[r]));
}

static void test_worker_lost_bsp(void) {
    kvps_server *s = NULL;
    kvps_worker *w[2] = {NULL, NULL};
    bsp_pair_up(&s, w);
    float g[16] = {1}, v[16];
    kvps_tensor t[2];
    kvps_req q[2];
    for (int r = 0; r < 2; r++) {
        KT_OK(kvps_worker_tensor(w[r], "x", 16, &t[r]));
        KT_OK(kvps_worker_pushpull_tensor(w[r], t[r], g, v, &q[r]));
    }
    for (int r = 0; r < 2; r++) KT_OK(kvps_worker_wait(w[r], q[r], 5000));
    kt_worker_vanish(&w[1]); /* worker 1 dies: its connection closes */
    KT_OK(kvps_worker_pushpull_tensor(w[0], t[0], g, v, &q[0]));
    kvps_result r = kvps_worker_wait(w[0], q[0], 20000);
    KT_CHECK(r == KVPS_ERR_PEER_LOST, "survivor got %s (%s)", kvps_result_str(r), kvps_worker_last_error(w[0]));
    kvps_server_stats st;
    kvps_server_stats_get(s, &st);
    KT_CHECK(st.peers_lost == 1, "%llu peers lost", (unsigned long long)st.peers_lost);
    /* a barrier now fails the same way */
    KT_OK(kvps_worker_barrier(w[0], &q[0]));
    r = kvps_worker_wait(w[0], q[0], 20000);
    KT_CHECK(r == KVPS_ERR_PEER_LOST, "barrier got %s", kvps_result_str(r));
    kvps_worker_destroy(&w[0]);
    kvps_server_destroy(&s);
}

/* Retrying after KVPS_ERR_PEER_LOST is safe. Under BSP worker 1 dies; worker 0's pushpull of
   round 1 is answered PEER_LOST, though its push is applied (the pull cannot complete). The
   request stays valid: waiting again re-sends it and the server answers only its pull, so when
   a new worker 1 arrives the round holds worker 0's push once. A barrier that was waiting for
   worker 1 when it was lost is entered again by its re-send, in the same generation as the
   others'. Each push is a distinct power of two, so the sums show exactly which pushes were
   applied, and how often. */
static void test_retry_after_peer_lost(void) {
    kvps_server *s = NULL;
    kvps_worker *w[2] = {NULL, NULL};
    bsp_pair_up(&s, w);
    enum { N = 16 };
    float g[2][N], v[2][N];
    kvps_tensor t[2];
    kvps_req q[2], b[2];
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < N; i++) g[r][i] = (float)(1 << r); /* round 0: 1 and 2 */
        KT_OK(kvps_worker_tensor(w[r], "x", N, &t[r]));
        KT_OK(kvps_worker_pushpull_tensor(w[r], t[r], g[r], v[r], &q[r]));
    }
    for (int r = 0; r < 2; r++) KT_OK(kvps_worker_wait(w[r], q[r], 5000));
    KT_CHECK(v[0][0] == 3 && v[1][0] == 3, "round 0: %g %g", (double)v[0][0], (double)v[1][0]);
    KT_OK(kvps_worker_barrier(w[0], &b[0])); /* waits for worker 1, which dies */
    kt_worker_vanish(&w[1]);
    kvps_result r = kvps_worker_wait(w[0], b[0], 20000);
    KT_CHECK(r == KVPS_ERR_PEER_LOST, "barrier: %s", kvps_result_str(r));
    for (int i = 0; i < N; i++) g[0][i] = 4;
    KT_OK(kvps_worker_pushpull_tensor(w[0], t[0], g[0], v[0], &q[0]));
    r = kvps_worker_wait(w[0], q[0], 20000);
    KT_CHECK(r == KVPS_ERR_PEER_LOST, "round 1: %s (%s)", kvps_result_str(r), kvps_worker_last_error(w[0]));
    r = kvps_worker_wait(w[0], q[0], 300); /* still lost: the wait rides it out, then says so again */
    KT_CHECK(r == KVPS_ERR_PEER_LOST, "round 1, waited again: %s (%s)", kvps_result_str(r), kvps_worker_last_error(w[0]));
    int done = 1;
    KT_CHECK(kvps_worker_test(w[0], q[0], &done) == KVPS_ERR_PEER_LOST && !done, "test: the request is not done");
    /* worker 1 comes back (a new process would do the same) and pushes its round 1: 8 */
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(s), .rank = 1}, &w[1]));
    for (int i = 0; i < N; i++) g[1][i] = 8;
    KT_OK(kvps_worker_tensor(w[1], "x", N, &t[1]));
    KT_OK(kvps_worker_pushpull_tensor(w[1], t[1], g[1], v[1], &q[1]));
    KT_OK(kvps_worker_wait(w[1], q[1], 5000));
    r = kvps_worker_wait(w[0], q[0], 5000); /* the same handle: re-sent, answered with the pull */
    KT_CHECK(r == KVPS_OK, "round 1, waited once worker 1 is back: %s (%s)", kvps_result_str(r), kvps_worker_last_error(w[0]));
    KT_CHECK(v[0][0] == 15 && v[1][0] == 15 && v[0][N - 1] == 15, "round 1: %g and %g, want 1+2+4+8 = 15",
             (double)v[0][0], (double)v[1][0]);
    KT_CHECK(kvps_worker_wait(w[0], q[0], 10) == KVPS_ERR_INVALID_REQ, "a completed request ends");
    /* the barrier refused meanwhile: re-sent by waiting again, it meets worker 1's */
    KT_OK(kvps_worker_barrier(w[1], &b[1]));
    KT_OK(kvps_worker_wait(w[0], b[0], 5000));
    KT_OK(kvps_worker_wait(w[1], b[1], 5000));
    for (int k = 0; k < 2; k++) KT_OK(kvps_worker_barrier(w[k], &b[k])); /* and the next one too */
    for (int k = 0; k < 2; k++) KT_OK(kvps_worker_wait(w[k], b[k], 5000));
    /* round 2: 16 and 32, each once */
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < N; i++) g[k][i] = (float)(16 << k);
        KT_OK(kvps_worker_pushpull_tensor(w[k], t[k], g[k], v[k], &q[k]));
    }
    for (int k = 0; k < 2; k++) KT_OK(kvps_worker_wait(w[k], q[k], 5000));
    KT_CHECK(v[0][0] == 63 && v[1][0] == 63, "round 2: %g and %g, want 63", (double)v[0][0], (double)v[1][0]);
    kvps_server_stats st;
    kvps_server_stats_get(s, &st);
    KT_CHECK(st.duplicates >= 1, "the re-sent pushpull was not seen as a re-send (%llu)", (unsigned long long)st.duplicates);
    for (int k = 0; k < 2; k++) kvps_worker_destroy(&w[k]);
    kvps_server_destroy(&s);
}

/* A connection cut during the ZeroMQ handshake is a network event, not a refusal: the worker
   logs it as a cut at warning level (no error, no word of refusing), reconnects, and its push
   goes through. The log is captured and read. */
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_log[8192];
static void capture_log(void *user, kvps_log_level level, const char *msg) {
    (void)user;
    pthread_mutex_lock(&g_log_mu);
    size_t n = strlen(g_log);
    snprintf(g_log + n, sizeof g_log - n, "%s: %s\n", level == KVPS_LOG_ERROR ? "error" : level == KVPS_LOG_WARN ? "warn" : "info", msg);
    pthread_mutex_unlock(&g_log_mu);
}

static void test_handshake_cut(void) {
    kvps_server *s = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1,
                                                  .update = KVPS_UPDATE_ACCUMULATE},
                             &s));
    KT_OK(kvps_server_start(s));
    proxy px;
    KT_CHECK(proxy_start(&px, port_of(kvps_server_endpoint(s))) == 0, "proxy");
    __atomic_store_n(&px.cut_hs, 1, __ATOMIC_RELEASE);
    g_log[0] = 0;
    kvps_log_set_fn(capture_log, NULL);
    kvps_log_set_level(KVPS_LOG_INFO);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", px.port);
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = ep}, &w));
    float g[8] = {1, 2, 3, 4, 5, 6, 7, 8}, v[8];
    kvps_tensor t;
    kvps_req q;
    KT_OK(kvps_worker_tensor(w, "x", 8, &t));
    KT_OK(kvps_worker_pushpull_tensor(w, t, g, v, &q));
    KT_OK(kvps_worker_wait(w, q, 10000));
    KT_CHECK(memcmp(g, v, sizeof g) == 0, "pushpull through a cut handshake");
    kvps_worker_destroy(&w);
    kvps_log_set_fn(NULL, NULL);
    kvps_log_set_level(KVPS_LOG_WARN);
    pthread_mutex_lock(&g_log_mu);
    KT_CHECK(__atomic_load_n(&px.cut_hs, __ATOMIC_ACQUIRE) == 0, "no handshake was cut");
    KT_CHECK(strstr(g_log, "warn: worker 0: the connection to server 0") && strstr(g_log, "was cut during the handshake"),
             "the cut was not reported as one:\n%s", g_log);
    KT_CHECK(!strstr(g_log, "refuse") && !strstr(g_log, "error:"), "the log reads as a refusal or an error:\n%s", g_log);
    pthread_mutex_unlock(&g_log_mu);
    proxy_stop(&px);
    kvps_server_destroy(&s);
}

/* Elastic BSP: worker 2 of 3 dies; once it is lost the round completes as the mean of the two
   left (and a barrier completes without it); a new worker 2 joins, pulls the current weights
   and the next round is the mean of all three again. Means are checked against float sums in
   rank order. */
static void test_elastic(void) {
    kvps_server *s = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 3,
                                                  .update = KVPS_UPDATE_MEAN, .heartbeat_ms = 50,
                                                  .peer_timeout_ms = 300, .elastic = 1},
                             &s));
    KT_OK(kvps_server_start(s));
    enum { LEN = 257 };
    kvps_worker *w[3];
    kvps_tensor t[3];
    float g[3][LEN], v[LEN], want[LEN];
    uint64_t seed = 9;
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < LEN; i++) g[r][i] = kt_randf(&seed);
        KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(s), .rank = r}, &w[r]));
        KT_OK(kvps_worker_tensor(w[r], "x", LEN, &t[r]));
    }
    kvps_req q[3];
    for (int r = 0; r < 3; r++) KT_OK(kvps_worker_push_tensor(w[r], t[r], g[r], &q[r]));
    for (int r = 0; r < 3; r++) KT_OK(kvps_worker_wait(w[r], q[r], 5000));
    kt_worker_vanish(&w[2]);
    /* round 2 with two workers: completes when worker 2 is declared lost */
    for (int r = 0; r < 2; r++) KT_OK(kvps_worker_pushpull_tensor(w[r], t[r], g[r], v, &q[r]));
    for (int r = 0; r < 2; r++) KT_OK(kvps_worker_wait(w[r], q[r], 20000));
    for (int i = 0; i < LEN; i++) want[i] = (g[0][i] + g[1][i]) / 2.0f;
    KT_CHECK(memcmp(v, want, sizeof v) == 0, "round without worker 2 is not the mean of the two left");
    /* a barrier of the two that are left completes */
    for (int r = 0; r < 2; r++) KT_OK(kvps_worker_barrier(w[r], &q[r]));
    for (int r = 0; r < 2; r++) KT_OK(kvps_worker_wait(w[r], q[r], 20000));
    /* a new worker 2 joins, pulls the current weights, and takes part in round 3 */
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(s), .rank = 2}, &w[2]));
    KT_OK(kvps_worker_tensor(w[2], "x", LEN, &t[2]));
    float cur[LEN];
    KT_OK(kvps_worker_pull_tensor(w[2], t[2], cur, &q[2]));
    KT_OK(kvps_worker_wait(w[2], q[2], 5000));
    KT_CHECK(memcmp(cur, want, sizeof cur) == 0, "the new worker pulled something else than the current weights");
    for (int r = 0; r < 3; r++) KT_OK(kvps_worker_pushpull_tensor(w[r], t[r], g[(r + 1) % 3], v, &q[r]));
    for (int r = 0; r < 3; r++) KT_OK(kvps_worker_wait(w[r], q[r], 20000));
    for (int i = 0; i < LEN; i++) want[i] = (g[1][i] + g[2][i] + g[0][i]) / 3.0f;
    KT_CHECK(memcmp(v, want, sizeof v) == 0, "round after the join is not the mean of all three");
    kvps_server_stats st;
    kvps_server_stats_get(s, &st);
    KT_CHECK(st.peers_lost == 1 && st.rounds == 3, "%llu lost, %llu rounds", (unsigned long long)st.peers_lost,
             (unsigned long long)st.rounds);
    for (int r = 0; r < 3; r++) kvps_worker_destroy(&w[r]);
    kvps_server_destroy(&s);
}

/* A worker with tensor "x" of len floats on server s, set to g by a first push. */
static void worker_with_x(kvps_server *s, kvps_worker **w, kvps_tensor *t, const float *g, size_t len) {
    kvps_req q;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(s)}, w));
    KT_OK(kvps_worker_tensor(*w, "x", len, t));
    KT_OK(kvps_worker_push_tensor(*w, *t, g, &q));
    KT_OK(kvps_worker_wait(*w, q, 5000));
}

/* A frame over max_msg_bytes: ZeroMQ drops that connection before kvps allocates it; the
   stored value and another client are unaffected. */
static void test_size_limit(void) {
    kvps_server *s = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1,
                                                  .update = KVPS_UPDATE_ACCUMULATE, .max_msg_bytes = 1 << 20},
                             &s));
    KT_OK(kvps_server_start(s));
    enum { LEN = 1000 };
    float g[LEN], v[LEN];
    for (int i = 0; i < LEN; i++) g[i] = 1.0f;
    kvps_worker *w = NULL;
    kvps_tensor t;
    kvps_req q;
    worker_with_x(s, &w, &t, g, LEN);
    /* a raw client sends a well-formed header for the same key, then 8 MiB of values */
    void *ctx = zmq_ctx_new(), *d = kt_raw_dealer(ctx, kvps_server_endpoint(s), 0, 1000);
    unsigned char meta[KVPS__HDR + KVPS__KENT];
    kt_raw_meta(meta, KVPS__OP_PUSH, w->tensors[t].keys[0], 8u << 18);
    size_t big = (size_t)8 << 20;
    char *junk = (char *)calloc(big, 1);
    zmq_send(d, meta, sizeof meta, ZMQ_SNDMORE);
    zmq_send(d, junk, big, 0);
    char reply[256];
    KT_CHECK(zmq_recv(d, reply, sizeof reply, 0) < 0, "an oversized frame was answered");
    free(junk);
    zmq_close(d);
    zmq_ctx_term(ctx);
    KT_OK(kvps_worker_pull_tensor(w, t, v, &q));
    KT_OK(kvps_worker_wait(w, q, 5000));
    KT_CHECK(memcmp(v, g, sizeof v) == 0, "the stored value changed");
    kvps_server_stats st;
    kvps_server_stats_get(s, &st);
    KT_CHECK(st.pushes == 1, "%llu pushes", (unsigned long long)st.pushes);
    kvps_worker_destroy(&w);
    kvps_server_destroy(&s);
}

/* A client that sends pulls and never reads the replies: past max_queued_replies they are
   dropped and counted, the server stays bounded, and another worker is still served. */
static void test_unread_replies_bounded(void) {
    kvps_server *s = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1,
                                                  .update = KVPS_UPDATE_ACCUMULATE, .max_queued_replies = 100},
                             &s));
    s->gate = -1; /* (test hook) the raw client's pulls are served: the bound is on replies to a worker */
    KT_OK(kvps_server_start(s));
    enum { LEN = 4096, NPULL = 3000 };
    static float g[LEN], v[LEN];
    for (int i = 0; i < LEN; i++) g[i] = (float)i;
    kvps_worker *w = NULL;
    kvps_tensor t;
    kvps_req q;
    worker_with_x(s, &w, &t, g, LEN);
    void *ctx = zmq_ctx_new(), *d = kt_raw_dealer(ctx, kvps_server_endpoint(s), 10, 0);
    unsigned char meta[KVPS__HDR + KVPS__KENT];
    kt_raw_meta(meta, KVPS__OP_PULL, w->tensors[t].keys[0], LEN);
    for (int i = 0; i < NPULL; i++) zmq_send(d, meta, sizeof meta, 0);
    kvps_server_stats st;
    for (int i = 0; i < 6000; i++) { /* the server answers them all, or drops what cannot be queued (60 s at most: TSan is slow) */
        kvps_server_stats_get(s, &st);
        if (st.pulls >= NPULL) break; /* (every pull served counts, its reply dropped or not: all read, none
                                          left to count as a stranger's below) */
        usleep(10000);
    }
    KT_CHECK(st.replies_dropped > 0, "no reply dropped: %llu pulls", (unsigned long long)st.pulls);
    printf("  %llu of %d replies to a client that reads none were dropped\n", (unsigned long long)st.replies_dropped, NPULL);
    KT_OK(kvps_worker_pull_tensor(w, t, v, &q)); /* the well-behaved worker is unaffected */
    KT_OK(kvps_worker_wait(w, q, 30000));
    KT_CHECK(memcmp(v, g, sizeof v) == 0, "pull differs");
    zmq_close(d);
    /* a stranger (no hello: ONLY THE JOB TALKS TO THE JOB) that reads none of its refusals: they
       are bounded by the same queue, and the worker is unaffected */
    __atomic_store_n(&s->gate, 0, __ATOMIC_RELAXED);
    kvps_server_stats_get(s, &st);
    uint64_t dropped0 = st.replies_dropped, strangers0 = st.strangers;
    d = kt_raw_dealer(ctx, kvps_server_endpoint(s), 10, 0);
    /* Refusals are small (~250 bytes): the kernel's socket buffers on both sides (several MB on
       loopback) may hold a few thousand of them before the server's queue fills, so the stranger
       sends batches of NPULL until one is dropped, up to 64 batches (~48 MB of refusals, past any
       buffer: an unbounded queue would hold them all). */
    uint64_t sent = 0;
    for (int b = 0; b < 64 && st.replies_dropped == dropped0; b++) {
        for (int i = 0; i < NPULL; i++) zmq_send(d, meta, sizeof meta, 0);
        sent += NPULL;
        for (int i = 0; i < 6000; i++) { /* (60 s at most) */
            kvps_server_stats_get(s, &st);
            if (st.strangers - strangers0 >= sent) break;
            usleep(10000);
        }
    }
    /* (>=: on a slow run the first client's last pulls may still be queued when the door shuts) */
    KT_CHECK(st.strangers - strangers0 >= sent, "%llu of %llu strangers' pulls refused",
             (unsigned long long)(st.strangers - strangers0), (unsigned long long)sent);
    KT_CHECK(st.replies_dropped > dropped0, "no refusal dropped after %llu: the stranger's queue is unbounded",
             (unsigned long long)sent);
    printf("  %llu of %llu refusals to a stranger that reads none were dropped\n",
           (unsigned long long)(st.replies_dropped - dropped0), (unsigned long long)sent);
    KT_OK(kvps_worker_pull_tensor(w, t, v, &q));
    KT_OK(kvps_worker_wait(w, q, 30000));
    KT_CHECK(memcmp(v, g, sizeof v) == 0, "pull differs after the stranger");
    zmq_close(d);
    zmq_ctx_term(ctx);
    kvps_worker_destroy(&w);
    kvps_server_destroy(&s);
}

/* ---- checkpoint hygiene -------------------------------------------------------------------- */

/* What a writer killed mid-checkpoint leaves: a child process writes part of PATH.tmp.<its pid>
   and is SIGKILLed there (the parent reaps it: no process has that pid now). Returns the pid. */
static pid_t dead_writer(const char *path) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        char tmp[400];
        snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
        int fd = open(tmp, O_CREAT | O_WRONLY | O_TRUNC, 0600);
        static char part[8192];
        if (fd < 0 || write(fd, part, sizeof part) != (ssize_t)sizeof part) _exit(2);
        raise(SIGKILL);
        _exit(3);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    KT_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the dead writer did not die mid-write (status %d)", st);
    return pid;
}
static int file_there(const char *fmt, ...) {
    char p[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p, sizeof p, fmt, ap);
    va_end(ap);
    return access(p, F_OK) == 0;
}
static void touch(const char *p) {
    int fd = open(p, O_CREAT | O_WRONLY, 0600);
    if (fd >= 0) close(fd);
}

/* Temporary files that writers killed mid-checkpoint left (PATH.tmp.PID) are removed at the
   next start (create with that checkpoint_path, and restore from it) and at the next successful
   write; files of a live writer (a child process that has its file open), of another path, or
   that only look alike (no pid, not only digits, a suffix after the pid, another suffix) stay. */
static void test_checkpoint_stale_tmp(void) {
    char path[320], other[320], p[512];
    path_in_tmp(path, sizeof path, "stale.ckpt");
    path_in_tmp(other, sizeof other, "other.ckpt");
    int go[2], ready[2];
    if (pipe(go) != 0 || pipe(ready) != 0) return;
    fflush(stdout);
    pid_t live = fork();
    if (live == 0) { /* a live writer: its file open, until the parent lets it go */
        close(go[1]);
        char tmp[400], c;
        snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
        int fd = open(tmp, O_CREAT | O_WRONLY, 0600);
        if (fd < 0 || write(ready[1], "r", 1) != 1) _exit(2);
        if (read(go[0], &c, 1) < 0) _exit(3);
        _exit(0);
    }
    close(go[0]);
    close(ready[1]);
    char c;
    KT_CHECK(read(ready[0], &c, 1) == 1, "the live writer did not start");
    close(ready[0]);
    pid_t d0 = dead_writer(path), d1 = dead_writer(path), d2 = dead_writer(path);
    static const char *alike[] = {"%s.tmp.", "%s.tmp.12x", "%s.tmp.-5", "%s.old"};
    for (size_t i = 0; i < sizeof alike / sizeof alike[0]; i++) {
        snprintf(p, sizeof p, alike[i], path);
        touch(p);
    }
    snprintf(p, sizeof p, "%s.tmp.%d.bak", path, (int)d0);
    touch(p);
    snprintf(p, sizeof p, "%s.tmp.%d", other, (int)d0);
    touch(p);
    KT_CHECK(file_there("%s.tmp.%d", path, (int)d0) && file_there("%s.tmp.%d", path, (int)d1), "the dead writers left no file");

    /* at start: create with this checkpoint path */
    kvps_server *s = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1, .checkpoint_path = path}, &s));
    KT_CHECK(!file_there("%s.tmp.%d", path, (int)d0), "create: a dead writer's temporary file is still there");
    KT_CHECK(file_there("%s.tmp.%d", path, (int)live), "create removed a live writer's temporary file");
    KT_CHECK(file_there("%s.tmp.%d", other, (int)d0), "create removed another checkpoint path's file");
    KT_CHECK(file_there("%s.tmp.%d.bak", path, (int)d0), "create removed a file that only starts like one");
    for (size_t i = 0; i < sizeof alike / sizeof alike[0]; i++)
        KT_CHECK(file_there(alike[i], path), "create removed '%s' (a file that only looks like one)", alike[i]);
    /* at the next successful write */
    d0 = dead_writer(path);
    KT_OK(kvps_server_checkpoint(s, 5000));
    KT_CHECK(!file_there("%s.tmp.%d", path, (int)d0) && !file_there("%s.tmp.%d", path, (int)d1),
             "a checkpoint written: dead writers' temporary files are still there");
    KT_CHECK(file_there("%s.tmp.%d", path, (int)live) && file_there("%s", path), "the write removed a live writer's file");
    kvps_server_destroy(&s);
    /* at start: restore from it */
    d2 = dead_writer(path);
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1}, &s));
    KT_OK(kvps_server_restore(s, path));
    KT_CHECK(!file_there("%s.tmp.%d", path, (int)d2), "restore: a dead writer's temporary file is still there");
    KT_CHECK(file_there("%s.tmp.%d", path, (int)live), "restore removed a live writer's temporary file");
    kvps_server_destroy(&s);
    close(go[1]); /* the live writer ends */
    waitpid(live, NULL, 0);
    DIR *d = opendir(tmpdir); /* every file this test made */
    for (struct dirent *e; d && (e = readdir(d)) != NULL;)
        if (strncmp(e->d_name, "stale.ckpt", 10) == 0 || strncmp(e->d_name, "other.ckpt", 10) == 0) {
            snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
            unlink(p);
        }
    if (d) closedir(d);
}

/* A checkpoint that cannot be written (a full disk) is tried again at the next checkpoint, not
   every round. As root (in a private mount namespace, in a child process) the path is on a 64
   KiB tmpfs and the shard is 128 KiB: each write fails with ENOSPC; elsewhere the path's
   directory does not exist. BSP, one worker, checkpoint_every 5, 30 rounds: the server's round
   at each failed write (read in the log callback, on the serving thread) is 5 or more past the
   last attempt's (every round after the first failure would be 1 apart: 184 errors in 200
   rounds were seen), at most 6 attempts in all (fewer where the server applied several rounds
   in one batch); no temporary file is left behind. Then there is
   room (the tmpfs grows, or the directory is made): the next checkpoint, again 5 or more
   rounds on, is written, and a server restored from it holds that round's value (SUM of ones:
   the value is the round). */
enum { FD_EVERY = 5, FD_ROUNDS = 30, FD_MAX = 64 };
static kvps_server *g_fd_srv;
static uint64_t g_fd_at[FD_MAX]; /* the server's round at each attempt: failed ones, then the written one */
static int g_fd_n, g_fd_written;
static void fd_log(void *u, kvps_log_level lv, const char *msg) {
    (void)u;
    int failed = lv == KVPS_LOG_ERROR && strstr(msg, "checkpoint:"), written = strstr(msg, ": checkpoint of ") != NULL;
    if (!failed && !written) return;
    kvps_server_stats st;
    kvps_server_stats_get(g_fd_srv, &st);
    int n = __atomic_load_n(&g_fd_n, __ATOMIC_ACQUIRE);
    if (n < FD_MAX) g_fd_at[n] = st.rounds;
    if (written) __atomic_store_n(&g_fd_written, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&g_fd_n, n + 1, __ATOMIC_RELEASE);
}
/* The server's round at the last attempt so far (0: none). */
static uint64_t fd_last(void) {
    int n = __atomic_load_n(&g_fd_n, __ATOMIC_ACQUIRE);
    return n > 0 && n <= FD_MAX ? g_fd_at[n - 1] : 0;
}
static int dir_entries(const char *dir) {
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    if (d) closedir(d);
    return n;
}
static void full_disk_child(void) {
    enum { LEN = 32768 };
    char dir[300], sub[320], path[360];
    snprintf(dir, sizeof dir, "%s/full", tmpdir);
    mkdir(dir, 0700);
    int tiny = 0;
#ifdef __linux__
    tiny = geteuid() == 0 && syscall(SYS_unshare, 0x00020000 /* CLONE_NEWNS */) == 0 &&
           mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 && mount("tmpfs", dir, "tmpfs", 0, "size=64k") == 0;
#endif
    snprintf(sub, sizeof sub, "%s/%s", dir, tiny ? "." : "missing");
    snprintf(path, sizeof path, "%s/full.ckpt", sub);
    printf("  %s\n", tiny ? "a 64 KiB tmpfs in a private mount namespace" : "no private tmpfs here: the directory is missing");
    kvps_server *s = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1, .update = KVPS_UPDATE_ACCUMULATE,
                                                  .checkpoint_path = path, .checkpoint_every = FD_EVERY},
                             &s));
    if (!s) return;
    g_fd_srv = s;
    kvps_log_set_fn(fd_log, NULL);
    kvps_log_set_level(KVPS_LOG_INFO);
    KT_OK(kvps_server_start(s));
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(s), .timeout_ms = 10000}, &w));
    static float g[LEN], v[LEN];
    for (int i = 0; i < LEN; i++) g[i] = 1.0f;
    kvps_tensor t;
    KT_OK(kvps_worker_tensor(w, "w", LEN, &t));
    int fails = 0;
    for (int round = 1; !kt_cur_failed; round++) {
        if (round == FD_ROUNDS + 1) { /* room again */
            /* (the failed write that may follow round 30's reply, and its clean-up: waited for, bounded) */
            for (int64_t end = kt_now_ms() + 2000; kt_now_ms() < end && fd_last() + FD_EVERY <= FD_ROUNDS; kt_sleep_ms(2)) {}
            for (int64_t end = kt_now_ms() + 10000; kt_now_ms() < end && dir_entries(dir) > 0; kt_sleep_ms(2)) {}
            fails = __atomic_load_n(&g_fd_n, __ATOMIC_ACQUIRE);
            kvps_server_stats st;
            kvps_server_stats_get(s, &st);
            KT_CHECK(fails >= 2 && fails <= FD_ROUNDS / FD_EVERY, "%d failed checkpoint writes in %d rounds with "
                     "checkpoint_every %d: want 2 to %d, one at each checkpoint", fails, FD_ROUNDS, FD_EVERY, FD_ROUNDS / FD_EVERY);
            KT_CHECK(st.checkpoints == 0, "%llu checkpoints written on a full disk", (unsigned long long)st.checkpoints);
            KT_CHECK(dir_entries(dir) == 0, "%d files left in the checkpoint's directory by failed writes", dir_entries(dir));
#ifdef __linux__
            if (tiny) KT_CHECK(mount("tmpfs", dir, "tmpfs", MS_REMOUNT, "size=4m") == 0, "remount: %s", strerror(errno));
#endif
            if (!tiny) KT_CHECK(mkdir(sub, 0700) == 0, "mkdir: %s", strerror(errno));
        }
        if (round > FD_ROUNDS && __atomic_load_n(&g_fd_written, __ATOMIC_ACQUIRE)) break;
        if (round > FD_ROUNDS + 3 * FD_EVERY) break; /* (no checkpoint came: said below) */
        kvps_req q;
        KT_OK(kvps_worker_pushpull_tensor(w, t, g, v, &q));
        KT_OK(kvps_worker_wait(w, q, -1));
        KT_CHECK(v[0] == (float)round && v[LEN - 1] == (float)round, "round %d: %g", round, (double)v[0]);
        for (int64_t end = kt_now_ms() + 10000; round > FD_ROUNDS && kt_now_ms() < end; kt_sleep_ms(1)) { /* its checkpoint, if due */
            kvps_server_stats st;
            kvps_server_stats_get(s, &st);
            if (st.checkpoints || (uint64_t)round < fd_last() + FD_EVERY) break;
        }
    }
    int n = __atomic_load_n(&g_fd_n, __ATOMIC_ACQUIRE);
    KT_CHECK(__atomic_load_n(&g_fd_written, __ATOMIC_ACQUIRE) && n == fails + 1, "with room again: %s (%d failed writes)",
             g_fd_written ? "written" : "no checkpoint written", n - fails);
    for (int i = 0; i < n && i < FD_MAX; i++) {
        uint64_t prev = i ? g_fd_at[i - 1] : 0;
        KT_CHECK(g_fd_at[i] >= prev + FD_EVERY, "attempt %d at round %llu, %llu rounds after the last (%s): want %d or more",
                 i + 1, (unsigned long long)g_fd_at[i], (unsigned long long)(g_fd_at[i] - prev), i ? "a failed write" : "the start",
                 FD_EVERY);
    }
    printf("  checkpoint attempts at rounds");
    for (int i = 0; i < n && i < FD_MAX; i++) printf(" %llu%s", (unsigned long long)g_fd_at[i], i == n - 1 ? " (written)" : "");
    printf("\n");
    kvps_worker_destroy(&w);
    kvps_server_destroy(&s);
    kvps_log_set_fn(NULL, NULL);
    kvps_log_set_level(KVPS_LOG_NONE);
    uint64_t at = n > 0 && n <= FD_MAX ? g_fd_at[n - 1] : 0;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1, .update = KVPS_UPDATE_ACCUMULATE},
                             &s));
    KT_OK(kvps_server_restore(s, path));
    KT_OK(kvps_server_start(s));
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(s), .timeout_ms = 10000}, &w));
    kvps_req q;
    KT_OK(kvps_worker_tensor(w, "w", LEN, &t));
    KT_OK(kvps_worker_pull_tensor(w, t, v, &q));
    KT_OK(kvps_worker_wait(w, q, -1));
    KT_CHECK(v[0] == (float)at && v[LEN - 1] == (float)at, "restored: %g, want round %llu's value", (double)v[0],
             (unsigned long long)at);
    kvps_worker_destroy(&w);
    kvps_server_destroy(&s);
    unlink(path);
#ifdef __linux__
    if (tiny) umount(dir);
#endif
    if (!tiny) rmdir(sub);
    rmdir(dir);
}
static void test_checkpoint_full_disk(void) { /* in a child process: the mount namespace stays there */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        full_disk_child();
        fflush(stdout);
        _exit(kt_cur_failed ? 1 : 0);
    }
    int st = kt_wait_pid(pid, kt_now_ms() + 60000 * (kt_quick() ? 4 : 1));
    KT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d (failures above; -1: a hang, killed)", st);
}

/* KT_ONLY=part runs the tests whose name has it in it. */
static const char *f_only;
#define F_RUN(...) F_RUN_(__VA_ARGS__, 0, 0)
#define F_RUN_(fn, limit_s, ...) do { if (!f_only || strstr(#fn, f_only)) KT_RUN(fn, limit_s); } while (0)

int main(int argc, char **argv) {
    if (argc >= 6 && strcmp(argv[1], "--kserver") == 0) return kr_server_main(argv);
    char self[PATH_MAX];
    if (realpath(argv[0], self)) snprintf(kr_self, sizeof kr_self, "%s", self);
    signal(SIGPIPE, SIG_IGN);
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/kvps-faults-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    f_only = getenv("KT_ONLY");
    F_RUN(test_checkpoint_round_trip);
    F_RUN(test_every_rule_checkpoints);
    F_RUN(test_checkpoint_stale_tmp);
    F_RUN(test_checkpoint_full_disk);
    F_RUN(test_worker_lost_bsp);
    F_RUN(test_elastic);
    F_RUN(test_size_limit);
    F_RUN(test_unread_replies_bounded);
    F_RUN(test_exactly_once_over_cuts);
    F_RUN(test_kill9_and_restart);
    F_RUN(test_retry_after_peer_lost);
    F_RUN(test_handshake_cut);
    F_RUN(test_restore_keeps_rounds, 300);
    rmdir(tmpdir);
    return kt_finish();
}
