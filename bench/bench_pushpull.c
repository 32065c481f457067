/* bench_pushpull - kvps push, pull and push+pull round trip against raw ZeroMQ, same run.

   usage: bench_pushpull [--quick] [--csv] [--time SECONDS]

   Everything runs in one process over tcp://127.0.0.1 (ephemeral ports). Each server and the
   worker has a ZeroMQ context of its own, so each side has its own I/O thread, as separate
   processes would. Servers are async with KVPS_UPDATE_SUM, so a push never waits for a round.

   The peer is raw ZeroMQ DEALER -> ROUTER on one connection, with kvps's socket options
   (no high-water marks, no linger) and kvps's message pattern: one request [meta][bytes?],
   one reply [meta][bytes?], zero-copy sends (zmq_msg_init_data) both ways, no copies at
   either end, the same bytes, counts and window as kvps.
     push : request carries the bytes, the reply is a small ack; W requests in flight
     pull : small request, the reply carries the bytes; W requests in flight
     rt   : push+pull one at a time; request and reply both carry the bytes
   kvps pulls twice: into the caller's buffer (kvps_worker_pull_tensor, one copy on the worker)
   and as a zero-copy view of the received message (kvps_worker_pull_tensor_view, "pull0"),
   which is what raw ZeroMQ does; the zmq row's pull0 is its pull.
   Counts are calibrated on raw ZeroMQ so that one measurement takes about --time seconds
   (default 0.2) and then used for every peer at that size. Each figure is the median of 3
   repetitions; the repetitions of raw ZeroMQ and of each kvps configuration are interleaved so
   that drift on a shared machine hits them alike. Buffers are allocated and touched once.

   The headline is 1 server x 1 worker with KVPS_UPDATE_SUM. A second 1x1 row uses an update_fn
   that does nothing, so the cost of the update (a pass over the stored value) shows apart from
   transport and protocol. Rows for 2 and 4 servers (the tensor is cut into
   min(servers, len / 1024 floats) slices) are compared with the same 1x1 raw ZeroMQ figures. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

enum { OP_PUSH = 1, OP_PULL = 2, OP_RT = 3, OP_PULLV = 4, OP_QUIT = 9 };
enum { NREP = 3, MAX_SIZES = 5, NCONF = 4, META_REQ = 48, META_REP = 32 };

static const size_t sizes[MAX_SIZES] = {4096, 65536, 1u << 20, 16u << 20, 64u << 20};
static const int windows[MAX_SIZES] = {64, 32, 16, 4, 2};
/* kvps configurations: servers, and whether the server applies KVPS_UPDATE_SUM or an update_fn
   that does nothing (what is left is transport and protocol: it tells the update's cost apart). */
static const int conf_servers[NCONF] = {1, 1, 2, 4};
static const int conf_noupdate[NCONF] = {0, 1, 0, 0};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what, const char *why) {
    fprintf(stderr, "bench_pushpull: %s: %s\n", what, why);
    exit(1);
}

static void kcheck(kvps_result r, const char *what, kvps_worker *w) {
    if (r != KVPS_OK) {
        fprintf(stderr, "bench_pushpull: %s: %s %s\n", what, kvps_result_str(r), w ? kvps_worker_last_error(w) : "");
        exit(1);
    }
}

static void zcheck(int rc, const char *what) {
    if (rc < 0) die(what, zmq_strerror(zmq_errno()));
}

static void no_hwm(void *sock) {
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
}

/* ---- raw ZeroMQ peer --------------------------------------------------------------------- */

typedef struct raw_req { uint32_t op, pad; uint64_t bytes; } raw_req; /* head of a 48-byte meta */

typedef struct raw_server {
    void *ctx, *router;
    pthread_t thread;
    char endpoint[256];
    const char *buf; /* what pulls send, zero-copy */
} raw_server;

typedef struct raw_client {
    void *ctx, *dealer;
    char meta[META_REQ];
    long sent_zc, released_zc; /* zero-copy frames handed to ZeroMQ / released by it */
} raw_client;

static void raw_nofree(void *data, void *hint) { (void)data; (void)hint; }

static void raw_released(void *data, void *hint) {
    (void)data;
    __atomic_add_fetch((long *)hint, 1, __ATOMIC_RELEASE);
}

static void *raw_server_main(void *arg) {
    raw_server *s = (raw_server *)arg;
    for (;;) {
        zmq_msg_t id, meta, val;
        zmq_msg_init(&id);
        zmq_msg_init(&meta);
        zmq_msg_init(&val);
        zcheck(zmq_msg_recv(&id, s->router, 0), "raw server recv");
        zcheck(zmq_msg_recv(&meta, s->router, 0), "raw server recv");
        if (zmq_msg_more(&meta)) zcheck(zmq_msg_recv(&val, s->router, 0), "raw server recv");
        raw_req rq;
        memcpy(&rq, zmq_msg_data(&meta), sizeof rq);
        zmq_msg_close(&val); /* released before the reply, as kvps does */
        zmq_msg_close(&meta);
        if (rq.op == OP_QUIT) { zmq_msg_close(&id); break; }
        int has_bytes = rq.op == OP_PULL || rq.op == OP_RT;
        zmq_msg_t rep;
        zmq_msg_init_size(&rep, META_REP);
        memset(zmq_msg_data(&rep), 0, META_REP);
        memcpy(zmq_msg_data(&rep), &rq, sizeof rq);
        zcheck(zmq_msg_send(&id, s->router, ZMQ_SNDMORE), "raw server send");
        zcheck(zmq_msg_send(&rep, s->router, has_bytes ? ZMQ_SNDMORE : 0), "raw server send");
        if (has_bytes) {
            zmq_msg_t b;
            zmq_msg_init_data(&b, (void *)(uintptr_t)s->buf, (size_t)rq.bytes, raw_nofree, NULL);
            zcheck(zmq_msg_send(&b, s->router, 0), "raw server send");
        }
    }
    return NULL;
}

static void raw_send(raw_client *c, int op, const char *payload, size_t bytes) {
    raw_req rq = {(uint32_t)op, 0, bytes};
    memcpy(c->meta, &rq, sizeof rq);
    zmq_msg_t m;
    zmq_msg_init_size(&m, META_REQ);
    memcpy(zmq_msg_data(&m), c->meta, META_REQ);
    int more = (op == OP_PUSH || op == OP_RT);
    zcheck(zmq_msg_send(&m, c->dealer, more ? ZMQ_SNDMORE : 0), "raw send");
    if (more) {
        zmq_msg_t b;
        c->sent_zc++;
        zmq_msg_init_data(&b, (void *)(uintptr_t)payload, bytes, raw_released, &c->released_zc);
        zcheck(zmq_msg_send(&b, c->dealer, 0), "raw send");
    }
}

static void raw_recv(raw_client *c) { /* one whole reply; the bytes stay in ZeroMQ's buffer */
    int more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        zcheck(zmq_msg_recv(&m, c->dealer, 0), "raw recv");
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
}

static void raw_drain_zc(raw_client *c) { /* kvps's wait also waits for this */
    while (__atomic_load_n(&c->released_zc, __ATOMIC_ACQUIRE) != c->sent_zc) sched_yield();
}

static void raw_up(raw_server *s, raw_client *c, const char *buf) {
    memset(s, 0, sizeof *s);
    memset(c, 0, sizeof *c);
    s->buf = buf;
    s->ctx = zmq_ctx_new();
    c->ctx = zmq_ctx_new();
    if (!s->ctx || !c->ctx) die("zmq_ctx_new", zmq_strerror(zmq_errno()));
    s->router = zmq_socket(s->ctx, ZMQ_ROUTER);
    c->dealer = zmq_socket(c->ctx, ZMQ_DEALER);
    if (!s->router || !c->dealer) die("zmq_socket", zmq_strerror(zmq_errno()));
    no_hwm(s->router);
    no_hwm(c->dealer);
    zcheck(zmq_bind(s->router, "tcp://127.0.0.1:*"), "raw bind");
    size_t sz = sizeof s->endpoint;
    zcheck(zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, s->endpoint, &sz), "raw endpoint");
    zcheck(zmq_connect(c->dealer, s->endpoint), "raw connect");
    if (pthread_create(&s->thread, NULL, raw_server_main, s) != 0) die("pthread_create", "failed");
}

static void raw_down(raw_server *s, raw_client *c) {
    raw_send(c, OP_QUIT, NULL, 0);
    pthread_join(s->thread, NULL);
    raw_drain_zc(c);
    zmq_close(c->dealer);
    zmq_close(s->router);
    zmq_ctx_term(c->ctx);
    zmq_ctx_term(s->ctx);
}

/* W requests in flight; replies come back in order on one connection. Returns seconds. */
static double raw_window(raw_client *c, int op, const char *payload, size_t bytes, long count, int W) {
    double t0 = now_s();
    long sent = 0, done = 0;
    while (done < count) {
        while (sent < count && sent - done < W) { raw_send(c, op, payload, bytes); sent++; }
        raw_recv(c);
        done++;
    }
    raw_drain_zc(c);
    return now_s() - t0;
}

static void raw_rt(raw_client *c, const char *payload, size_t bytes, long count, double *lat) {
    for (long i = 0; i < count; i++) {
        double t0 = now_s();
        raw_send(c, OP_RT, payload, bytes);
        raw_recv(c);
        lat[i] = now_s() - t0;
    }
    raw_drain_zc(c);
}

/* ---- kvps -------------------------------------------------------------------------------- */

typedef struct kcluster {
    int n;
    kvps_server *srv[4];
    kvps_worker *w;
    kvps_tensor t[MAX_SIZES];
    char servers[1024];
    kvps_req *ring;
    kvps_view **views;
} kcluster;

static void update_nothing(const kvps_update_args *a) { (void)a; }

static void kvps_up(kcluster *k, int n, int noupdate, int nsizes) {
    memset(k, 0, sizeof *k);
    k->n = n;
    for (int i = 0; i < n; i++) {
        kcheck(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1,
                                                      .rank = i, .consistency = KVPS_ASYNC,
                                                      .update = noupdate ? KVPS_UPDATE_CUSTOM : KVPS_UPDATE_SUM,
                                                      .update_fn = noupdate ? update_nothing : NULL},
                                  &k->srv[i]),
               "kvps_server_create", NULL);
        kcheck(kvps_server_start(k->srv[i]), "kvps_server_start", NULL);
        size_t len = strlen(k->servers);
        snprintf(k->servers + len, sizeof k->servers - len, "%s%s", i ? "," : "", kvps_server_endpoint(k->srv[i]));
    }
    kcheck(kvps_worker_create(&(kvps_worker_desc){.servers = k->servers, .rank = 0, .num_workers = 1,
                                                  .timeout_ms = 120000}, &k->w),
           "kvps_worker_create", NULL);
    for (int i = 0; i < nsizes; i++) {
        char name[32];
        snprintf(name, sizeof name, "bench.%zu", sizes[i]);
        kcheck(kvps_worker_tensor(k->w, name, sizes[i] / sizeof(float), &k->t[i]), "kvps_worker_tensor", k->w);
    }
    k->ring = (kvps_req *)calloc(64, sizeof *k->ring);
    k->views = (kvps_view **)calloc(64, sizeof *k->views);
    if (!k->ring || !k->views) die("calloc", "out of memory");
}

static void kvps_down(kcluster *k) {
    kvps_worker_destroy(&k->w);
    for (int i = 0; i < k->n; i++) kvps_server_destroy(&k->srv[i]);
    free(k->ring);
    free(k->views);
}

static kvps_result kvps_issue(kcluster *k, int ti, int op, const float *grad, float *dst, kvps_req *q) {
    switch (op) {
    case OP_PUSH: return kvps_worker_push_tensor(k->w, k->t[ti], grad, q);
    case OP_PULL: return kvps_worker_pull_tensor(k->w, k->t[ti], dst, q);
    case OP_PULLV: return kvps_worker_pull_tensor_view(k->w, k->t[ti], &k->views[q - k->ring], q);
    default: return kvps_worker_pushpull_tensor(k->w, k->t[ti], grad, dst, q);
    }
}

static double kvps_window(kcluster *k, int ti, int op, const float *grad, float *dst, long count, int W) {
    double t0 = now_s();
    for (long i = 0; i < count; i++) {
        kvps_req *slot = &k->ring[i % W];
        if (i >= W) kcheck(kvps_worker_wait(k->w, *slot, -1), "kvps_worker_wait", k->w);
        kvps_view_release(&k->views[i % W]);
        kcheck(kvps_issue(k, ti, op, grad, dst, slot), "kvps push/pull", k->w);
    }
    for (long i = count > W ? count - W : 0; i < count; i++) {
        kcheck(kvps_worker_wait(k->w, k->ring[i % W], -1), "kvps_worker_wait", k->w);
        kvps_view_release(&k->views[i % W]);
    }
    return now_s() - t0;
}

static void kvps_rt(kcluster *k, int ti, const float *grad, float *dst, long count, double *lat) {
    for (long i = 0; i < count; i++) {
        double t0 = now_s();
        kvps_req q;
        kcheck(kvps_worker_pushpull_tensor(k->w, k->t[ti], grad, dst, &q), "kvps_worker_pushpull_tensor", k->w);
        kcheck(kvps_worker_wait(k->w, q, -1), "kvps_worker_wait", k->w);
        lat[i] = now_s() - t0;
    }
}

/* Sets the tensor to zero (ones when the update does nothing), pushes ones once, pulls: every
   element must read 1. */
static void kvps_sanity(kcluster *k, int ti, int noupdate, float *zeros, const float *ones, float *dst,
                        size_t len) {
    kvps_req q;
    memset(zeros, 0, len * sizeof(float));
    kcheck(kvps_worker_init_tensor(k->w, k->t[ti], noupdate ? ones : zeros, &q), "kvps_worker_init_tensor", k->w);
    kcheck(kvps_worker_wait(k->w, q, -1), "kvps_worker_wait", k->w);
    kcheck(kvps_worker_push_tensor(k->w, k->t[ti], ones, &q), "kvps_worker_push_tensor", k->w);
    kcheck(kvps_worker_wait(k->w, q, -1), "kvps_worker_wait", k->w);
    memset(dst, 0, len * sizeof(float));
    kcheck(kvps_worker_pull_tensor(k->w, k->t[ti], dst, &q), "kvps_worker_pull_tensor", k->w);
    kcheck(kvps_worker_wait(k->w, q, -1), "kvps_worker_wait", k->w);
    for (size_t i = 0; i < len; i++)
        if (dst[i] != 1.0f) {
            fprintf(stderr, "bench_pushpull: %d servers, %zu bytes: element %zu reads %g, expected 1\n",
                    k->n, len * sizeof(float), i, (double)dst[i]);
            exit(1);
        }
}

/* ---- statistics and output --------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile(double *v, long n, double p) { /* sorts v; nearest rank */
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    long i = (long)ceil(p * (double)n) - 1;
    if (i < 0) i = 0;
    if (i >= n) i = n - 1;
    return v[i];
}

static double median3(const double *v) {
    double a = v[0], b = v[1], c = v[2];
    if (a > b) { double t = a; a = b; b = t; }
    if (b > c) b = c;
    return a > b ? a : b;
}

typedef struct row { /* medians over NREP */
    double push_gbs, pull_gbs, push_ops, p50_us, p99_us, pullv_gbs;
} row;

static void print_header(int csv) {
    if (csv) {
        printf("peer,update,servers,workers,bytes,window,n_thr,n_rt,slices,push_gbs,pull_gbs,push_ops,rt_p50_us,rt_p99_us,"
               "pull0_gbs,push_x,pull_x,ops_x,p50_x,p99_x,pull0_x\n");
        return;
    }
    printf("#%4s %4s %3s %3s %9s %3s %6s %5s %2s %16s %16s %16s %18s %17s %17s\n", "peer", "upd", "srv", "wrk",
           "bytes", "W", "n_thr", "n_rt", "sl", "push GB/s", "pull GB/s", "pull0 GB/s", "push ops/s", "rt p50 us",
           "rt p99 us");
}

static void print_row(int csv, const char *peer, const char *upd, int srv, size_t bytes, int W, long n_thr,
                      long n_rt, int slices, const row *r, const row *ref) {
    double x[6] = {1, 1, 1, 1, 1, 1};
    if (ref) {
        x[0] = r->push_gbs / ref->push_gbs;
        x[1] = r->pull_gbs / ref->pull_gbs;
        x[2] = r->push_ops / ref->push_ops;
        x[3] = r->p50_us / ref->p50_us;
        x[4] = r->p99_us / ref->p99_us;
        x[5] = r->pullv_gbs / ref->pullv_gbs;
    }
    if (csv) {
        printf("%s,%s,%d,1,%zu,%d,%ld,%ld,%d,%.4f,%.4f,%.0f,%.2f,%.2f,%.4f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n", peer, upd, srv,
               bytes, W, n_thr, n_rt, slices, r->push_gbs, r->pull_gbs, r->push_ops, r->p50_us, r->p99_us, r->pullv_gbs,
               x[0], x[1], x[2], x[3], x[4], x[5]);
        return;
    }
    char sl[16];
    if (slices > 0) snprintf(sl, sizeof sl, "%d", slices);
    else snprintf(sl, sizeof sl, "-");
    if (!ref) {
        printf(" %4s %4s %3d %3d %9zu %3d %6ld %5ld %2s %8.3f %7s %8.3f %7s %8.3f %7s %9.0f %8s %9.1f %7s %9.1f\n", peer,
               upd, srv, 1, bytes, W, n_thr, n_rt, sl, r->push_gbs, "", r->pull_gbs, "", r->pullv_gbs, "", r->push_ops, "",
               r->p50_us, "", r->p99_us);
        return;
    }
    printf(" %4s %4s %3d %3d %9zu %3d %6ld %5ld %2s %8.3f (%4.2fx) %8.3f (%4.2fx) %8.3f (%4.2fx) %9.0f (%4.2fx) %9.1f "
           "(%4.2fx) %9.1f (%4.2fx)\n",
           peer, upd, srv, 1, bytes, W, n_thr, n_rt, sl, r->push_gbs, x[0], r->pull_gbs, x[1], r->pullv_gbs, x[5],
           r->push_ops, x[2], r->p50_us, x[3], r->p99_us, x[4]);
}

static void usage(const char *argv0) {
    fprintf(stderr, "usage: %s [--quick] [--csv] [--time SECONDS]\n"
                    "  --quick      skip 64 MB values\n"
                    "  --csv        print CSV rows instead of the table\n"
                    "  --time S     target seconds per raw ZeroMQ measurement (default 0.2)\n", argv0);
    exit(2);
}

int main(int argc, char **argv) {
    int quick = 0, csv = 0;
    double target = 0.2;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) quick = 1;
        else if (strcmp(argv[i], "--csv") == 0) csv = 1;
        else if (strcmp(argv[i], "--time") == 0 && i + 1 < argc) {
            char *end = NULL;
            target = strtod(argv[++i], &end);
            if (*end || !(target > 0.0 && target <= 60.0)) usage(argv[0]);
        } else usage(argv[0]);
    }
    int nsizes = quick ? MAX_SIZES - 1 : MAX_SIZES;
    size_t maxb = sizes[nsizes - 1], maxf = maxb / sizeof(float);

    /* Buffers once, touched before any timing (fresh pages cost ~3 us per 4 KiB here). */
    float *grad = NULL, *dst = NULL, *scratch = NULL;
    char *srvbuf = NULL;
    if (posix_memalign((void **)&grad, 64, maxb) || posix_memalign((void **)&dst, 64, maxb) ||
        posix_memalign((void **)&scratch, 64, maxb) || posix_memalign((void **)&srvbuf, 64, maxb))
        die("posix_memalign", "out of memory");
    for (size_t i = 0; i < maxf; i++) grad[i] = 1.0f;
    memset(dst, 0, maxb);
    memset(scratch, 0, maxb);
    memset(srvbuf, 0x3f, maxb);

    raw_server rs;
    raw_client rc;
    raw_up(&rs, &rc, srvbuf);
    kcluster kc[NCONF];
    for (int c = 0; c < NCONF; c++) kvps_up(&kc[c], conf_servers[c], conf_noupdate[c], nsizes);

    int major, minor, patch;
    zmq_version(&major, &minor, &patch);
    if (!csv) {
        printf("# bench_pushpull: kvps push / pull / push+pull round trip vs raw ZeroMQ, same run\n");
        printf("# tcp loopback, one process; servers and worker have a ZeroMQ context (1 I/O thread) each;\n");
        printf("# servers async + KVPS_UPDATE_SUM; 1 worker; libzmq %d.%d.%d; %ld CPUs\n", major, minor, patch,
               sysconf(_SC_NPROCESSORS_ONLN));
        printf("# peer zmq: raw DEALER->ROUTER, zero-copy sends both ways, same bytes, counts, window, framing\n");
        printf("#   push: W in flight, request carries the bytes, small reply; pull: W in flight, small request,\n");
        printf("#   reply carries the bytes; rt: pushpull one at a time, latency per op (p50, p99)\n");
        printf("# W = requests in flight, n_thr = pushes (and pulls) per repetition, n_rt = round trips,\n");
        printf("# sl = tensor slices (servers used); GB/s = 1e9 bytes/s of values; median of %d repetitions;\n", NREP);
        printf("# upd = server update: sum (KVPS_UPDATE_SUM, the headline) or none (an update_fn that does nothing:\n");
        printf("#   transport and protocol only); (x) = kvps / zmq at the same size: above 1 is better for GB/s\n");
        printf("#   and ops/s, worse for latency. The zmq row is 1 server x 1 worker; every kvps row compares to it.\n");
        printf("# ZeroMQ allocates each received message: past glibc's mmap threshold (at most 32 MiB) that is fresh\n");
        printf("#   pages every time, for zmq and kvps alike, which is why 64 MB runs slower than 16 MB.\n#\n");
    }
    print_header(csv);
    fflush(stdout);

    row res[MAX_SIZES][1 + NCONF];
    double t_start = now_s();
    for (int si = 0; si < nsizes; si++) {
        size_t bytes = sizes[si], len = bytes / sizeof(float);
        int W = windows[si];

        /* Warm-up and a correctness check for every peer at this size. */
        for (int c = 0; c < NCONF; c++) {
            kvps_sanity(&kc[c], si, conf_noupdate[c], scratch, grad, dst, len);
            kvps_window(&kc[c], si, OP_PUSH, grad, dst, 2 * W, W);
            kvps_window(&kc[c], si, OP_PULL, grad, dst, 2 * W, W);
        }
        raw_window(&rc, OP_PUSH, (const char *)grad, bytes, 2 * W, W);
        raw_window(&rc, OP_PULL, (const char *)grad, bytes, 2 * W, W);

        /* Counts from raw ZeroMQ: double until a run takes target/8, then scale to target. */
        long n_op[4] = {0};
        for (int op = OP_PUSH; op <= OP_RT; op++) {
            long n = op == OP_RT ? 4 : 2 * W;
            for (;;) {
                double t;
                if (op == OP_RT) {
                    double *lat = (double *)malloc((size_t)n * sizeof *lat);
                    if (!lat) die("malloc", "out of memory");
                    t = now_s();
                    raw_rt(&rc, (const char *)grad, bytes, n, lat);
                    t = now_s() - t;
                    free(lat);
                } else {
                    t = raw_window(&rc, op, (const char *)grad, bytes, n, W);
                }
                if (t >= target / 8 || n >= 100000000L) {
                    n = (long)((double)n * target / t);
                    break;
                }
                n *= 2;
            }
            long min_n = op == OP_RT ? 4 : 3 * W; /* 64 MB: 6 pushes, 4 round trips */
            n_op[op] = n < min_n ? min_n : n;
        }
        /* One count for push and pull, so the table has one n_thr. */
        long n_thr = n_op[OP_PUSH] < n_op[OP_PULL] ? n_op[OP_PUSH] : n_op[OP_PULL];
        long n_rt = n_op[OP_RT];
        double *lat = (double *)malloc((size_t)n_rt * sizeof *lat);
        if (!lat) die("malloc", "out of memory");

        double v[1 + NCONF][6][NREP];
        for (int op = OP_PUSH; op <= OP_PULLV; op++) {
            for (int rep = 0; rep < NREP; rep++) {
                for (int p = 0; p < 1 + NCONF; p++) { /* p 0: raw ZeroMQ, 1..: kvps configurations */
                    if (op == OP_RT) {
                        if (p == 0) raw_rt(&rc, (const char *)grad, bytes, n_rt, lat);
                        else kvps_rt(&kc[p - 1], si, grad, dst, n_rt, lat);
                        v[p][3][rep] = percentile(lat, n_rt, 0.50) * 1e6;
                        v[p][4][rep] = percentile(lat, n_rt, 0.99) * 1e6;
                        continue;
                    }
                    double t = p == 0 ? raw_window(&rc, op == OP_PULLV ? OP_PULL : op, (const char *)grad, bytes, n_thr, W)
                                      : kvps_window(&kc[p - 1], si, op, grad, dst, n_thr, W);
                    if (op == OP_PUSH) {
                        v[p][0][rep] = (double)n_thr * (double)bytes / t / 1e9;
                        v[p][2][rep] = (double)n_thr / t;
                    } else {
                        v[p][op == OP_PULLV ? 5 : 1][rep] = (double)n_thr * (double)bytes / t / 1e9;
                    }
                }
            }
        }
        free(lat);
        for (int p = 0; p < 1 + NCONF; p++) {
            row *r = &res[si][p];
            r->push_gbs = median3(v[p][0]);
            r->pull_gbs = median3(v[p][1]);
            r->push_ops = median3(v[p][2]);
            r->p50_us = median3(v[p][3]);
            r->p99_us = median3(v[p][4]);
            r->pullv_gbs = median3(v[p][5]);
        }
        print_row(csv, "zmq", "-", 1, bytes, W, n_thr, n_rt, 0, &res[si][0], NULL);
        for (int c = 0; c < NCONF; c++)
            print_row(csv, "kvps", conf_noupdate[c] ? "none" : "sum", conf_servers[c], bytes, W, n_thr, n_rt,
                      (int)kvps_worker_tensor_slices(kc[c].w, kc[c].t[si]), &res[si][1 + c], &res[si][0]);
        fflush(stdout);
    }
    double elapsed = now_s() - t_start;

    /* Targets from the issue, 1 server x 1 worker: information for the reader, not a test. */
    printf("#\n# targets (1 server x 1 worker, KVPS_UPDATE_SUM, loopback; whole run %.0f s):\n", elapsed);
    for (int which = 0; which < 3; which++) {
        int pass = 1;
        char buf[256] = "";
        size_t used = 0;
        for (int si = 0; si < nsizes; si++) {
            if (sizes[si] < (1u << 20)) continue;
            double x = which == 0   ? res[si][1].push_gbs / res[si][0].push_gbs
                       : which == 1 ? res[si][1].pull_gbs / res[si][0].pull_gbs
                                    : res[si][1].pullv_gbs / res[si][0].pullv_gbs;
            pass &= x >= 0.9;
            used += (size_t)snprintf(buf + used, sizeof buf - used, " %zuMB %.2fx", sizes[si] >> 20, x);
        }
        printf("#   %-4s %s payload GB/s >= 0.9x zmq at >= 1 MB:%s\n", pass ? "PASS" : "MISS",
               which == 0 ? "push" : which == 1 ? "pull (into the caller's buffer)" : "pull (zero-copy view)", buf);
    }
    double xo = res[0][1].push_ops / res[0][0].push_ops;
    printf("#   %-4s 4 KB pipelined push ops/s >= 0.5x zmq: %.2fx (ps-lite ~0.16x)\n",
           xo >= 0.5 ? "PASS" : "MISS", xo);
    double xl = res[0][1].p50_us / res[0][0].p50_us;
    printf("#   %-4s 4 KB pushpull round trip p50 <= 1.5x zmq: %.1f us vs %.1f us = %.2fx\n",
           xl <= 1.5 ? "PASS" : "MISS", res[0][1].p50_us, res[0][0].p50_us, xl);

    for (int c = 0; c < NCONF; c++) kvps_down(&kc[c]);
    raw_down(&rs, &rc);
    free(grad); free(dst); free(scratch); free(srvbuf);
    return 0;
}
