/* bench_pushpull - kvps push, pull and push+pull round trip against raw ZeroMQ, same run.

   usage: bench_pushpull [--quick] [--csv] [--time SECONDS] [--only BYTES] [--reps N] [--one-process]
                         [--max-slice FLOATS] [--io-cpus split|none] [--timeline DIR] [--replicas]

   Over tcp://127.0.0.1 (ephemeral ports; --replicas' chain: ports picked free beforehand). Each server side (the raw ROUTER, and each kvps
   configuration's servers) runs in a process of its own, forked at the start; the clients (raw
   DEALER, kvps workers) run in this process, each with a ZeroMQ context of its own. That is how a
   job is deployed. --one-process runs the servers as threads here instead: that layout favours
   the raw peer (its figures rise by up to a third while kvps's stay), so it is kept for comparison
   only. Servers are async with KVPS_UPDATE_ACCUMULATE, so a push never waits for a round.

   The peer is raw ZeroMQ DEALER -> ROUTER on one connection, with kvps's socket options
   (no high-water marks, no linger), kvps's receive loops at both ends (wait in zmq_poll, then
   drain what is queued without blocking) and kvps's message pattern: one request [meta][bytes?],
   one reply [meta][bytes?], zero-copy sends (zmq_msg_init_data) both ways, no copies at
   either end, the same bytes, counts and window as kvps.
     push : request carries the bytes, the reply is a small ack; W requests in flight
     pull : small request, the reply carries the bytes; W requests in flight
     rt   : push+pull one at a time; request and reply both carry the bytes
   kvps pulls twice: into the caller's buffer (kvps_worker_pull_tensor, one copy on the worker)
   and as a zero-copy view of the received message (kvps_worker_pull_tensor_view, "pull0"),
   which is what raw ZeroMQ does; the zmq row's pull0 is its pull.
   Counts are calibrated on raw ZeroMQ so that one measurement takes about --time seconds
   (default 0.2) and then used for every peer at that size. Each figure is the median of --reps
   (default 5) repetitions; the repetitions of raw ZeroMQ and of each kvps configuration are interleaved so
   that drift on a shared machine hits them alike. Buffers are allocated and touched once.

   The headline is 1 server x 1 worker with KVPS_UPDATE_ACCUMULATE. A second 1x1 row uses an update_fn
   that does nothing, so the cost of the update (a pass over the stored value) shows apart from
   transport and protocol. Rows for 2 and 4 servers (the tensor is cut into
   min(servers, len / 1024 floats) slices) are compared with the same 1x1 raw ZeroMQ figures.
   Values past kvps's max_slice (1 MiB: 16 and 64 MB here) go out from kvps as several slices,
   one message each, all in flight; a second raw ZeroMQ row then sends each value as the same
   pieces, so that the peer keeps kvps's message pattern, and the kvps rows compare to it.
   --timeline DIR adds a sixth peer: the 1 server x 1 worker KVPS_UPDATE_ACCUMULATE configuration again
   with its timeline on (server and worker write into DIR; upd "tl"), measured in the same
   interleaved repetitions as the one with it off, and a line per size with the ratios on / off
   of each repetition (min..max, median): the timeline's cost. It is measured right after its
   twin, in every repetition. Every other peer has it off, even with KVPS_TIMELINE set;
   --timeline '' turns it off in the sixth as well: the same lines then show how far two equal
   configurations differ on this machine (the noise floor of the ratios).
   --replicas adds a seventh peer: the 1 server x 1 worker KVPS_UPDATE_ACCUMULATE configuration with its
   shard replicated, r = 2 (REPLICAS in kvps.h): a primary and its backup, each in a process of
   its own (threads here with --one-process), the worker's server list the chain
   "tcp://127.0.0.1:A|tcp://127.0.0.1:B". The chain names both endpoints before either server
   starts, so A and B are picked free beforehand (bound to port 0 and closed again, here, before
   any ZeroMQ context). The primary forwards every push to its backup and holds its reply until
   the backup has acknowledged it; pulls are not forwarded. The primary's process reports its
   endpoint only once the backup is live, so nothing is measured without it. It is measured in the
   same interleaved repetitions as its twin with r = 1 (the headline configuration), next to it:
   after it in even repetitions, before it in odd ones (so that neither always follows the
   other); a line per size gives the ratios r=2 / r=1 of each repetition (min..max, median), as
   --timeline's do (above 1: more for GB/s and ops/s, slower for the round trip), and, after the
   last size, a line with both servers' counters: the backup must have served every push the
   primary served, with no takeover and no second snapshot. */
#define _GNU_SOURCE /* sched_getaffinity (bench_cpu.h) */
#define BENCH_NAME "bench_pushpull" /* die() (bench_cpu.h) */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "bench/bench_cpu.h"
#include "bench/bench_pipe.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

enum { OP_PUSH = 1, OP_PULL = 2, OP_RT = 3, OP_PULLV = 4, OP_QUIT = 9 };
enum { MAX_REP = 15, MAX_SIZES = 5, NCONF = 6, META_REQ = 48, META_REP = 32 };

static const size_t sizes[MAX_SIZES] = {4096, 65536, 1u << 20, 16u << 20, 64u << 20};
static const int windows[MAX_SIZES] = {64, 32, 16, 4, 2};
/* kvps configurations: servers, and whether the server applies KVPS_UPDATE_ACCUMULATE or an update_fn
   that does nothing (what is left is transport and protocol: it tells the update's cost apart). */
static const int conf_servers[NCONF] = {1, 1, 2, 4, 1, 1};
static const int conf_noupdate[NCONF] = {0, 1, 0, 0, 0, 0};
/* the fifth configuration is the first with its timeline on: measured with --timeline only */
static const int conf_timeline[NCONF] = {0, 0, 0, 0, 1, 0};
/* the sixth is the first with its shard on 2 replicas (primary + backup): with --replicas only */
static const int conf_replicas[NCONF] = {1, 1, 1, 1, 1, 2};
enum { CONF_TL = 4, CONF_R2 = 5 };
static const char *g_timeline; /* --timeline DIR */
static int g_tl_on, g_r2_on;   /* --timeline, --replicas */

static int conf_on(int c) { return c < CONF_TL || (c == CONF_TL && g_tl_on) || (c == CONF_R2 && g_r2_on); }

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
    pid_t pid;
    int ctl; /* server process: the child reads EOF here if the parent is gone; -1 as a thread */
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

/* Like kvps's server loop: wait in zmq_poll, then drain every queued request without blocking
   (a blocking receive per frame costs the raw peer a wake-up per message when the server is a
   process of its own: its push rate fell to 0.6x of this loop's). */
static void *raw_server_main(void *arg) {
    raw_server *s = (raw_server *)arg;
    zmq_pollitem_t it[2] = {{s->router, 0, ZMQ_POLLIN, 0}, {NULL, s->ctl, ZMQ_POLLIN, 0}};
    for (;;) {
        zcheck(zmq_poll(it, s->ctl >= 0 ? 2 : 1, -1), "raw server poll");
        if (s->ctl >= 0 && it[1].revents) return NULL; /* EOF or hang-up: the parent died without OP_QUIT */
        for (;;) {
            zmq_msg_t id, meta, val;
            zmq_msg_init(&id);
            zmq_msg_init(&meta);
            zmq_msg_init(&val);
            if (zmq_msg_recv(&id, s->router, ZMQ_DONTWAIT) < 0) {
                if (zmq_errno() == EAGAIN) { zmq_msg_close(&id); break; }
                die("raw server recv", zmq_strerror(zmq_errno()));
            }
            zcheck(zmq_msg_recv(&meta, s->router, 0), "raw server recv");
            if (zmq_msg_more(&meta)) zcheck(zmq_msg_recv(&val, s->router, 0), "raw server recv");
            raw_req rq;
            memcpy(&rq, zmq_msg_data(&meta), sizeof rq);
            zmq_msg_close(&val); /* released before the reply, as kvps does */
            zmq_msg_close(&meta);
            if (rq.op == OP_QUIT) { zmq_msg_close(&id); return NULL; }
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
    }
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

/* Like kvps's worker (kvps__progress): wait in zmq_poll, then drain every reply already queued
   without blocking; a reply's later frames are there once its first is. Returns how many whole
   replies it took (>= 1); the bytes stay in ZeroMQ's buffer. A blocking receive per reply, as
   this peer had before, costs a wake-up per message (see raw_server_main) and made the raw
   figures lower than this loop's, so kvps's ratios higher than they are. */
static long raw_recv(raw_client *c) {
    zmq_pollitem_t it = {c->dealer, 0, ZMQ_POLLIN, 0};
    long n = 0;
    while (n == 0) {
        zcheck(zmq_poll(&it, 1, -1), "raw client poll");
        for (;;) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, c->dealer, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m);
                if (zmq_errno() == EAGAIN) break;
                die("raw recv", zmq_strerror(zmq_errno()));
            }
            int more = zmq_msg_more(&m);
            zmq_msg_close(&m);
            while (more) {
                zmq_msg_init(&m);
                zcheck(zmq_msg_recv(&m, c->dealer, 0), "raw recv");
                more = zmq_msg_more(&m);
                zmq_msg_close(&m);
            }
            n++;
        }
    }
    return n;
}

static void raw_drain_zc(raw_client *c) { /* kvps's wait also waits for this */
    while (__atomic_load_n(&c->released_zc, __ATOMIC_ACQUIRE) != c->sent_zc) sched_yield();
}

/* By default every server side runs in a process of its own, forked before the
   parent makes any ZeroMQ context, as a deployment runs it; it sends its endpoints up a pipe and
   ends when the parent closes the pipe it reads (kvps) or sends OP_QUIT (raw). */
static int g_procs = 1;
static size_t g_max_slice; /* --max-slice: kvps_worker_desc.max_slice (0: the default) */
/* --io-cpus split: server sides' I/O threads on the second CPU this process may use, clients' on
   the first (bench_cpu), raw ZeroMQ and kvps alike */
static const char *g_srv_cpus, *g_cli_cpus;

static pid_t fork_server(int *ctl_w, int *ep_r) { /* parent: pid; child: 0 */
    int ep[2], ctl[2];
    if (pipe(ep) != 0 || pipe(ctl) != 0) die("pipe", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) die("fork", strerror(errno));
    if (pid == 0) { /* nothing but its own pipe ends: another child's must reach EOF when the parent closes it */
        for (int fd = 3; fd < 1024; fd++)
            if (fd != ep[1] && fd != ctl[0]) close(fd);
        *ctl_w = ctl[0]; /* the child reads EOF here when the parent is done */
        *ep_r = ep[1];   /* and writes its endpoints here */
        return 0;
    }
    close(ep[1]);
    close(ctl[0]);
    *ctl_w = ctl[1];
    *ep_r = ep[0];
    return pid;
}

/* the endpoint line(s) a server process sends up its pipe, into buf */
static void read_endpoints(int fd, char *buf, size_t cap) {
    char *str = read_str(fd);
    if (!str) die("server process", "ended before it sent its endpoints");
    if (strlen(str) >= cap) die("server process", "endpoint list too long");
    strcpy(buf, str);
    free(str);
}

/* A ZeroMQ context of its own (its I/O thread pinned to cpus, unless NULL) and a socket of the
   given type in it, with kvps's socket options. */
static void *raw_socket(void **ctx, const char *cpus, int type) {
    *ctx = zmq_ctx_new();
    if (!*ctx) die("zmq_ctx_new", zmq_strerror(zmq_errno()));
    if (cpus) kcheck(kvps_zmq_ctx_pin(*ctx, cpus), "kvps_zmq_ctx_pin", NULL);
    void *sock = zmq_socket(*ctx, type);
    if (!sock) die("zmq_socket", zmq_strerror(zmq_errno()));
    no_hwm(sock);
    return sock;
}

static void raw_server_bind(raw_server *s) {
    s->router = raw_socket(&s->ctx, g_srv_cpus, ZMQ_ROUTER);
    zcheck(zmq_bind(s->router, "tcp://127.0.0.1:*"), "raw bind");
    size_t sz = sizeof s->endpoint;
    zcheck(zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, s->endpoint, &sz), "raw endpoint");
}

static void raw_server_up(raw_server *s, const char *buf) {
    memset(s, 0, sizeof *s);
    s->buf = buf;
    s->ctl = -1;
    if (!g_procs) {
        raw_server_bind(s);
        if (pthread_create(&s->thread, NULL, raw_server_main, s) != 0) die("pthread_create", "failed");
        return;
    }
    int ctl, ep;
    s->pid = fork_server(&ctl, &ep);
    s->ctl = ctl;
    if (s->pid == 0) {
        raw_server_bind(s);
        if (write_str(ep, s->endpoint) != 0) die("write", strerror(errno));
        raw_server_main(s);
        zmq_close(s->router);
        zmq_ctx_term(s->ctx);
        _exit(0);
    }
    read_endpoints(ep, s->endpoint, sizeof s->endpoint);
    close(ep);
}

static void raw_client_up(raw_client *c, const raw_server *s) {
    memset(c, 0, sizeof *c);
    c->dealer = raw_socket(&c->ctx, g_cli_cpus, ZMQ_DEALER);
    zcheck(zmq_connect(c->dealer, s->endpoint), "raw connect");
}

static void raw_down(raw_server *s, raw_client *c) {
    raw_send(c, OP_QUIT, NULL, 0);
    if (g_procs) {
        waitpid(s->pid, NULL, 0);
        close(s->ctl);
    } else {
        pthread_join(s->thread, NULL);
    }
    raw_drain_zc(c);
    zmq_close(c->dealer);
    zmq_ctx_term(c->ctx);
    if (!g_procs) {
        zmq_close(s->router);
        zmq_ctx_term(s->ctx);
    }
}

/* Piece i of P of a value, cut as kvps cuts a tensor into slices: floats [len i / P, len (i+1) / P). */
static void raw_send_piece(raw_client *c, int op, const char *payload, size_t bytes, long i, int P) {
    size_t len = bytes / sizeof(float), b = len * (size_t)i / (size_t)P, e = len * (size_t)(i + 1) / (size_t)P;
    raw_send(c, op, payload + b * sizeof(float), (e - b) * sizeof(float));
}

/* W values in flight, each sent as P messages (1: whole); replies come back in order on one
   connection. Returns seconds. */
static double raw_window(raw_client *c, int op, const char *payload, size_t bytes, long count, int W, int P) {
    double t0 = now_s();
    long sent = 0, done = 0, total = count * P, win = (long)W * P;
    while (done < total) {
        while (sent < total && sent - done < win) { raw_send_piece(c, op, payload, bytes, sent % P, P); sent++; }
        done += raw_recv(c);
    }
    raw_drain_zc(c);
    return now_s() - t0;
}

static void raw_rt(raw_client *c, const char *payload, size_t bytes, long count, double *lat, int P) {
    for (long i = 0; i < count; i++) {
        double t0 = now_s();
        for (int k = 0; k < P; k++) raw_send_piece(c, OP_RT, payload, bytes, k, P);
        for (long k = 0; k < P;) k += raw_recv(c);
        lat[i] = now_s() - t0;
    }
    raw_drain_zc(c);
}

/* ---- kvps -------------------------------------------------------------------------------- */

typedef struct kcluster {
    int n;    /* shards */
    int nrep; /* replicas per shard: 1, or 2 (--replicas: srv[0] the primary, srv[1] its backup) */
    kvps_server *srv[4];
    kvps_worker *w;
    kvps_tensor t[MAX_SIZES];
    char servers[1024]; /* the worker's server list (nrep 2: the chain "A|B") */
    char ep[2][64];     /* nrep 2: the primary's and the backup's endpoints */
    kvps_req *ring;
    kvps_view **views;
    pid_t pid[2]; /* server process(es): one for all servers, or one per replica (nrep 2) */
    int ctl[2];   /* closing this ends that process; nrep 2: a byte asks it for its counters */
    int rep_ep[2]; /* nrep 2: the pipe each replica's process answers on (its endpoint, its counters) */
    int tl;       /* timeline on (--timeline) */
} kcluster;

static void update_nothing(const kvps_update_args *a) { (void)a; }

static void kvps_servers_run(kcluster *k, int noupdate) {
    const char *tl = k->tl ? g_timeline : ""; /* "": off, whatever KVPS_TIMELINE says */
    for (int i = 0; i < k->n; i++) {
        kcheck(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1,
                                                      .rank = i, .consistency = KVPS_ASYNC,
                                                      .update = noupdate ? KVPS_UPDATE_CUSTOM : KVPS_UPDATE_ACCUMULATE,
                                                      .update_fn = noupdate ? update_nothing : NULL,
                                                      .io_cpus = g_srv_cpus, .timeline = tl},
                                  &k->srv[i]),
               "kvps_server_create", NULL);
        kcheck(kvps_server_start(k->srv[i]), "kvps_server_start", NULL);
        size_t len = strlen(k->servers);
        snprintf(k->servers + len, sizeof k->servers - len, "%s%s", i ? "," : "", kvps_server_endpoint(k->srv[i]));
    }
}

/* Two loopback ports free now (bound to port 0 together, so that they differ, then closed):
   a replicated shard's chain names its servers' endpoints before they start. */
static void free_ports(int port[2]) {
    int fd[2];
    for (int i = 0; i < 2; i++) {
        struct sockaddr_in a;
        socklen_t len = sizeof a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        fd[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (fd[i] < 0 || bind(fd[i], (struct sockaddr *)&a, sizeof a) != 0 ||
            getsockname(fd[i], (struct sockaddr *)&a, &len) != 0)
            die("a free port", strerror(errno));
        port[i] = ntohs(a.sin_port);
    }
    close(fd[0]);
    close(fd[1]);
}

/* Replica r of the replicated shard (0: the primary), started; the primary returns once it has
   sent its backup the snapshot (the backup connected). The backup acknowledges a snapshot of an
   empty stream only with the first message after it, so "live" is checked later, after the first
   size's warm-up (replicas_check), and again at the end (replicas_report). */
static void kvps_replica_run(kcluster *k, int r, int noupdate) {
    kcheck(kvps_server_create(&(kvps_server_desc){.endpoint = k->ep[r], .num_workers = 1, .rank = 0,
                                                  .consistency = KVPS_ASYNC,
                                                  .update = noupdate ? KVPS_UPDATE_CUSTOM : KVPS_UPDATE_ACCUMULATE,
                                                  .update_fn = noupdate ? update_nothing : NULL, .io_cpus = g_srv_cpus,
                                                  .timeline = k->tl ? g_timeline : "", .replicas = k->servers,
                                                  .replica = r},
                              &k->srv[r]),
           "kvps_server_create (replica)", NULL);
    kcheck(kvps_server_start(k->srv[r]), "kvps_server_start (replica)", NULL);
    for (double t0 = now_s(); r == 0;) {
        kvps_server_stats st;
        kvps_server_stats_get(k->srv[0], &st);
        if (st.primary && st.snapshots >= 1) break;
        if (now_s() - t0 > 30) die("replicas", "the backup did not connect to its primary within 30 s");
        sleep_ms(2);
    }
}

/* A replica's counters, as one line: primary, replicas_live, pushes, pulls, snapshots, takeovers. */
static void replica_counters(const kvps_server *s, char *buf, size_t cap) {
    kvps_server_stats st;
    kvps_server_stats_get(s, &st);
    snprintf(buf, cap, "%llu %llu %llu %llu %llu %llu", (unsigned long long)st.primary,
             (unsigned long long)st.replicas_live, (unsigned long long)st.pushes, (unsigned long long)st.pulls,
             (unsigned long long)st.snapshots, (unsigned long long)st.takeovers);
}

static void kvps_replicas_up(kcluster *k, int noupdate) {
    int port[2];
    free_ports(port);
    for (int r = 0; r < 2; r++) snprintf(k->ep[r], sizeof k->ep[r], "tcp://127.0.0.1:%d", port[r]);
    snprintf(k->servers, sizeof k->servers, "%s|%s", k->ep[0], k->ep[1]);
    if (!g_procs) {
        kvps_replica_run(k, 1, noupdate);
        kvps_replica_run(k, 0, noupdate);
        return;
    }
    for (int r = 0; r < 2; r++) { /* both forked before either is waited for: the primary waits for its backup */
        int ctl, ep;
        k->pid[r] = fork_server(&ctl, &ep);
        if (k->pid[r] == 0) {
            kvps_replica_run(k, r, noupdate);
            if (write_str(ep, kvps_server_endpoint(k->srv[r])) != 0) die("write", strerror(errno));
            for (;;) { /* a byte: send the counters up; EOF: the parent is done */
                char c, line[256];
                ssize_t g = read(ctl, &c, 1);
                if (g < 0 && errno == EINTR) continue;
                if (g <= 0) break;
                replica_counters(k->srv[r], line, sizeof line);
                if (write_str(ep, line) != 0) die("write", strerror(errno));
            }
            kvps_server_destroy(&k->srv[r]);
            _exit(0);
        }
        k->ctl[r] = ctl;
        k->rep_ep[r] = ep;
    }
    for (int r = 0; r < 2; r++) {
        char got[256];
        read_endpoints(k->rep_ep[r], got, sizeof got);
        if (strcmp(got, k->ep[r]) != 0) die("replica endpoint", got);
    }
}

/* Both replicas' counters (replica_counters' six each) */
static void replicas_counters(kcluster *k, unsigned long long c[2][6]) {
    for (int r = 0; r < 2; r++) {
        char line[256];
        if (g_procs) {
            if (write(k->ctl[r], "c", 1) != 1) die("write", strerror(errno));
            read_endpoints(k->rep_ep[r], line, sizeof line);
        } else {
            replica_counters(k->srv[r], line, sizeof line);
        }
        if (sscanf(line, "%llu %llu %llu %llu %llu %llu", &c[r][0], &c[r][1], &c[r][2], &c[r][3], &c[r][4], &c[r][5]) != 6)
            die("replica counters", line);
    }
}

/* Before the first figure (after a warm-up): the primary counts its backup live, the backup
   holds the shard and is not primary. */
static void replicas_check(kcluster *k) {
    unsigned long long c[2][6];
    replicas_counters(k, c);
    if (c[0][0] != 1 || c[0][1] != 2 || c[1][0] != 0 || c[1][1] != 1)
        die("replicas", "the backup is not live after the warm-up (primary, live, backup primary, backup live: not 1 2 0 1)");
}

/* After the last figure: both replicas' counters on one line. Every reply has come back, so the
   backup has acknowledged (served) every push the primary served. */
static void replicas_report(kcluster *k, int csv) {
    unsigned long long c[2][6];
    replicas_counters(k, c);
    int ok = c[0][0] == 1 && c[0][1] == 2 && c[1][0] == 0 && c[1][1] == 1 && c[0][2] == c[1][2] && c[0][4] == 1 &&
             c[1][4] == 1 && c[0][5] == 0 && c[1][5] == 0;
    if (csv) {
        printf("# replicas_counters,%s,primary_pushes,%llu,backup_pushes,%llu,primary_pulls,%llu,backup_pulls,%llu,"
               "snapshots,%llu,%llu,takeovers,%llu,%llu\n", ok ? "ok" : "BROKEN", c[0][2], c[1][2], c[0][3], c[1][3],
               c[0][4], c[1][4], c[0][5], c[1][5]);
        return;
    }
    printf("#   replicas %s: the primary served %llu pushes and %llu pulls, its backup %llu pushes and %llu pulls (the\n"
           "#     round trips': a pushpull goes on whole); replicas live %llu (the primary's count); snapshots %llu\n"
           "#     sent, %llu loaded; takeovers %llu, %llu\n",
           ok ? "ok" : "BROKEN", c[0][2], c[0][3], c[1][2], c[1][3], c[0][1], c[0][4], c[1][4], c[0][5], c[1][5]);
}

static void kvps_servers_up(kcluster *k, int n, int nrep, int noupdate, int tl) {
    memset(k, 0, sizeof *k);
    k->n = n;
    k->nrep = nrep;
    k->tl = tl;
    k->ctl[0] = k->ctl[1] = k->rep_ep[0] = k->rep_ep[1] = -1;
    if (nrep > 1) {
        kvps_replicas_up(k, noupdate);
        return;
    }
    if (!g_procs) {
        kvps_servers_run(k, noupdate);
        return;
    }
    int ctl, ep;
    k->pid[0] = fork_server(&ctl, &ep);
    if (k->pid[0] == 0) {
        kvps_servers_run(k, noupdate);
        if (write_str(ep, k->servers) != 0) die("write", strerror(errno));
        char c;
        while (read(ctl, &c, 1) != 0 && errno == EINTR) {} /* EOF: the parent is done */
        for (int i = 0; i < n; i++) kvps_server_destroy(&k->srv[i]);
        _exit(0);
    }
    k->ctl[0] = ctl;
    read_endpoints(ep, k->servers, sizeof k->servers);
    close(ep);
}

static void kvps_worker_up(kcluster *k, int nsizes) {
    kcheck(kvps_worker_create(&(kvps_worker_desc){.servers = k->servers, .rank = 0, .num_workers = 1,
                                                  .timeout_ms = 120000, .max_slice = g_max_slice,
                                                  .io_cpus = g_cli_cpus, .timeline = k->tl ? g_timeline : ""}, &k->w),
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
    int nproc = k->nrep > 1 ? 2 : 1, nsrv = k->nrep > 1 ? 2 : k->n;
    if (g_procs) {
        for (int p = nproc - 1; p >= 0; p--) { /* (a replicated shard: the backup first, its primary then) */
            close(k->ctl[p]);
            if (k->rep_ep[p] >= 0) close(k->rep_ep[p]);
            waitpid(k->pid[p], NULL, 0);
        }
    } else {
        for (int i = nsrv - 1; i >= 0; i--) kvps_server_destroy(&k->srv[i]);
    }
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

static int g_reps = 5; /* repetitions per figure (odd); the median is reported */

static double median(const double *v) {
    double t[MAX_REP];
    memcpy(t, v, (size_t)g_reps * sizeof *t);
    qsort(t, (size_t)g_reps, sizeof *t, cmp_double);
    return t[g_reps / 2];
}

typedef struct row { /* medians over g_reps */
    double push_gbs, pull_gbs, push_ops, p50_us, p99_us, pullv_gbs;
} row;

static void print_header(int csv) {
    bench_machine(csv ? stderr : stdout, kvps_isa_set(KVPS_ISA_AUTO)); /* (not in the CSV) */
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

/* --timeline: per repetition, the 1x1 sum configuration with its timeline on over the same with it
   off (measured back to back in that repetition): min..max and median of the ratios, for push,
   pull and zero-copy pull GB/s, push ops/s and the round trip's p50 (above 1: slower there).
   --replicas: the same for the 1x1 sum configuration on r = 2 replicas over r = 1 (tag
   "replicas", what "r=2/r=1", na "r=2", nb "r=1"). */
static void pair_cost(int csv, const char *tag, const char *what, const char *na, const char *nb, size_t bytes,
                      double off[6][MAX_REP], double on[6][MAX_REP], double coff[5][MAX_REP], double con[5][MAX_REP]) {
    static const int idx[5] = {0, 1, 5, 2, 3};
    static const char *name[5] = {"push GB/s", "pull GB/s", "pull0 GB/s", "push ops/s", "rt p50"};
    if (csv) printf("# %s,%zu", tag, bytes);
    else printf("#   %s %s, 1x1 sum, %zu bytes, per repetition (min..max, median):", tag, what, bytes);
    for (int m = 0; m < 5; m++) {
        double x[MAX_REP];
        for (int r = 0; r < g_reps; r++) x[r] = on[idx[m]][r] / off[idx[m]][r];
        double mid = median(x);
        qsort(x, (size_t)g_reps, sizeof *x, cmp_double);
        if (csv) printf(",%s,%.4f,%.4f,%.4f", name[m], x[0], x[g_reps - 1], mid);
        else printf("%s %s %.3f..%.3f (%.3f)", m ? "," : "", name[m], x[0], x[g_reps - 1], mid);
    }
    printf("\n");
    /* The client process's CPU time per op (the worker's thread and its ZeroMQ I/O thread; the
       server is another process): less at the mercy of other loads than throughput. */
    static const int ops[4] = {OP_PUSH, OP_PULL, OP_PULLV, OP_RT};
    static const char *oname[4] = {"push", "pull", "pull0", "pushpull rt"};
    if (csv) printf("# %s_cpu,%zu", tag, bytes);
    else printf("#     this process's CPU per op, %s - %s (min..max, median), and %s/%s of the medians:", na, nb, na, nb);
    for (int m = 0; m < 4; m++) {
        double d[MAX_REP], a[MAX_REP], b[MAX_REP];
        for (int r = 0; r < g_reps; r++) {
            d[r] = (con[ops[m]][r] - coff[ops[m]][r]) * 1e9;
            a[r] = con[ops[m]][r];
            b[r] = coff[ops[m]][r];
        }
        double mid = median(d), x = median(a) / median(b);
        qsort(d, (size_t)g_reps, sizeof *d, cmp_double);
        if (csv) printf(",%s,%.1f,%.1f,%.1f,%.4f", oname[m], d[0], d[g_reps - 1], mid, x);
        else printf("%s %s %+.0f..%+.0f (%+.0f) ns, %.3f", m ? "," : "", oname[m], d[0], d[g_reps - 1], mid, x);
    }
    printf("\n");
}

/* --timeline: what an event costs on its own, in this process (the functions the hooks call,
   on a worker, a request, a server and a key made for the purpose, into a file in DIR): a worker
   request (its post-time clock read, the event formatted, its share of the 64 KiB writes), a BSP
   round (two arrivals and the event), an async push (counted into its 100 ms window). */
static void timeline_event_cost(int csv) {
    enum { N = 200000 };
    kvps_worker *w = (kvps_worker *)calloc(1, sizeof *w);
    kvps_server *s = (kvps_server *)calloc(1, sizeof *s);
    kvps__key *k = (kvps__key *)calloc(1, sizeof *k);
    kvps__tensor_info t;
    kvps__req q;
    uint64_t key0 = (1ull << 63) | (12345ull << 16);
    uint8_t state = 2;
    if (!w || !s || !k) die("calloc", "out of memory");
    memset(&t, 0, sizeof t);
    memset(&q, 0, sizeof q);
    t.name = (char *)"bench.4096";
    t.nslices = 1;
    t.keys = &key0;
    w->n = 1;
    w->tensors = &t;
    w->ntensors = 1;
    q.state = &state;
    q.tensor = 1;
    q.tl_op = KVPS__OP_PUSHPULL;
    q.tl_bytes = 4096;
    k->key = key0;
    k->len = 1024;
    s->desc.consistency = KVPS_BSP;
    kcheck(kvps__tl_open(&w->tl, g_timeline, "cost", "cost of worker events", 0, 9000), "timeline", NULL);
    kcheck(kvps__tl_open(&s->tl, g_timeline, "cost", "cost of server events", 1, 9001), "timeline", NULL);
    double t0 = now_s();
    for (int i = 0; i < N; i++) {
        q.tl_t0 = kvps__tl_now();
        kvps__tl_req_end(w, &q);
    }
    double t1 = now_s();
    for (int i = 0; i < N; i++) {
        kvps__tl_arrive(s, k, k->round);
        kvps__tl_arrive(s, k, k->round);
        k->round++;
        kvps__tl_round(s, k, 2);
    }
    double t2 = now_s();
    s->desc.consistency = KVPS_ASYNC;
    for (int i = 0; i < N; i++) kvps__tl_round(s, k, 1);
    double t3 = now_s();
    kvps__tl_server_end(s);
    kvps__tl_close(&w->tl);
    free(k->tl);
    free(k); free(s); free(w);
    if (csv) printf("# timeline_event_ns,request,%.1f,round,%.1f,async_push,%.1f\n", (t1 - t0) / N * 1e9, (t2 - t1) / N * 1e9,
                    (t3 - t2) / N * 1e9);
    else printf("#   timeline: one event costs %.0f ns for a worker request, %.0f ns for a BSP round (two arrivals\n"
                "#     noted), %.0f ns for an async push (counted); %d of each, formatted and written here\n",
                (t1 - t0) / N * 1e9, (t2 - t1) / N * 1e9, (t3 - t2) / N * 1e9, N);
}

/* which 0: push, 1: pull into the caller's buffer, 2: zero-copy pull */
static double row_gbs(const row *r, int which) {
    return which == 0 ? r->push_gbs : which == 1 ? r->pull_gbs : r->pullv_gbs;
}

static void usage(const char *argv0) {
    fprintf(stderr, "usage: %s [--quick] [--csv] [--time SECONDS] [--only BYTES] [--reps N] [--one-process]\n"
                    "          [--max-slice FLOATS] [--io-cpus split|none] [--timeline DIR] [--replicas]\n"
                    "  --quick      skip 64 MB values\n"
                    "  --only B     measure one of the sizes only (4096 65536 1048576 16777216 67108864)\n"
                    "  --csv        print CSV rows instead of the table\n"
                    "  --reps N     repetitions per figure, odd, at most 15 (default 5); medians are reported\n"
                    "  --one-process  servers as threads of this process (default: a process per server side)\n"
                    "  --time S     target seconds per raw ZeroMQ measurement (default 0.2)\n"
                    "  --max-slice F  kvps_worker_desc.max_slice in floats (default 262144 = 1 MiB; 268435456:\n"
                    "               a value is never cut beyond one slice per server, as before it existed)\n"
                    "  --io-cpus split  server sides' ZeroMQ I/O threads on the second CPU allowed, clients' on the\n"
                    "               first, zmq and kvps alike (kvps_zmq_ctx_pin, .io_cpus); none (default): the OS\n"
                    "               places them\n"
                    "  --timeline DIR  also the 1x1 sum configuration with its timeline on (written into DIR),\n"
                    "               and the ratio on / off of each repetition\n"
                    "  --replicas   also the 1x1 sum configuration with its shard on 2 replicas (primary + backup,\n"
                    "               a process each), and the ratio r=2 / r=1 of each repetition\n", argv0);
    exit(2);
}

int main(int argc, char **argv) {
    int quick = 0, csv = 0, only = -1;
    double target = 0.2;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) quick = 1;
        else if (strcmp(argv[i], "--csv") == 0) csv = 1;
        else if (strcmp(argv[i], "--one-process") == 0) g_procs = 0;
        else if (strcmp(argv[i], "--max-slice") == 0 && i + 1 < argc) {
            char *end = NULL;
            unsigned long long f = strtoull(argv[++i], &end, 10);
            if (*end || f == 0) usage(argv[0]);
            g_max_slice = (size_t)f;
        }
        else if (strcmp(argv[i], "--io-cpus") == 0 && i + 1 < argc) {
            i++;
            static char srv[16], cli[16];
            snprintf(srv, sizeof srv, "%d", bench_cpu(1));
            snprintf(cli, sizeof cli, "%d", bench_cpu(0));
            if (strcmp(argv[i], "split") == 0) { g_srv_cpus = srv; g_cli_cpus = cli; }
            else if (strcmp(argv[i], "none") != 0) usage(argv[0]);
        }
        else if (strcmp(argv[i], "--timeline") == 0 && i + 1 < argc) {
            g_timeline = argv[++i];
            g_tl_on = 1;
        }
        else if (strcmp(argv[i], "--replicas") == 0) g_r2_on = 1;
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            g_reps = atoi(argv[++i]);
            if (g_reps < 1 || g_reps > MAX_REP || g_reps % 2 == 0) usage(argv[0]);
        }
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            char *end = NULL;
            unsigned long long b = strtoull(argv[++i], &end, 10);
            for (int k = 0; k < MAX_SIZES && !*end; k++)
                if (sizes[k] == b) only = k;
            if (only < 0) usage(argv[0]);
        }
        else if (strcmp(argv[i], "--time") == 0 && i + 1 < argc) {
            char *end = NULL;
            target = strtod(argv[++i], &end);
            if (*end || !(target > 0.0 && target <= 60.0)) usage(argv[0]);
        } else usage(argv[0]);
    }
    int nsizes = only >= 0 ? only + 1 : quick ? MAX_SIZES - 1 : MAX_SIZES;
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
    kcluster kc[NCONF];
    raw_server_up(&rs, srvbuf); /* every server side first: forked before any context here */
    for (int c = 0; c < NCONF; c++)
        if (conf_on(c)) kvps_servers_up(&kc[c], conf_servers[c], conf_replicas[c], conf_noupdate[c], conf_timeline[c]);
    raw_client_up(&rc, &rs);
    for (int c = 0; c < NCONF; c++)
        if (conf_on(c)) kvps_worker_up(&kc[c], nsizes);

    int major, minor, patch;
    zmq_version(&major, &minor, &patch);
    if (!csv) {
        printf("# bench_pushpull: kvps push / pull / push+pull round trip vs raw ZeroMQ, same run\n");
        printf("# tcp loopback; %s; servers and worker have a ZeroMQ context (1 I/O thread) each;\n",
               g_procs ? "each server side in a process of its own, clients in this one" : "one process (--one-process)");
        printf("# servers async + KVPS_UPDATE_ACCUMULATE; 1 worker; libzmq %d.%d.%d; %ld CPUs; I/O threads %s\n", major, minor,
               patch, sysconf(_SC_NPROCESSORS_ONLN),
               g_srv_cpus ? "pinned (--io-cpus split)" : "placed by the OS");
        if (g_srv_cpus)
            printf("#   zmq and kvps alike: server sides' I/O threads on CPU %s, clients' on CPU %s\n", g_srv_cpus, g_cli_cpus);
        printf("# peer zmq: raw DEALER->ROUTER, zero-copy sends both ways, same bytes, counts, window, framing\n");
        printf("#   push: W in flight, request carries the bytes, small reply; pull: W in flight, small request,\n");
        printf("#   reply carries the bytes; rt: pushpull one at a time, latency per op (p50, p99)\n");
        printf("# W = requests in flight, n_thr = pushes (and pulls) per repetition, n_rt = round trips,\n");
        printf("# sl = tensor slices (servers used); GB/s = 1e9 bytes/s of values; median of %d repetitions;\n", g_reps);
        printf("# upd = server update: sum (KVPS_UPDATE_ACCUMULATE, the headline) or none (an update_fn that does nothing:\n");
        printf("#   transport and protocol only); (x) = kvps / zmq at the same size: above 1 is better for GB/s\n");
        printf("#   and ops/s, worse for latency. The zmq row is 1 server x 1 worker; every kvps row compares to it.\n");
        printf("# kvps cuts a tensor past max_slice (1 MiB) into slices (sl): there a second zmq row sends each value\n");
        printf("#   as the same sl pieces (W values in flight = W x sl messages), the same message pattern as kvps,\n");
        printf("#   and the kvps rows compare to that one; the targets also show the ratio to whole values.\n");
        printf("# ZeroMQ allocates each received message: past glibc's mmap threshold (at most 32 MiB) that is fresh\n");
        printf("#   pages every time, for zmq and kvps alike, which is why 64 MB runs slower than 16 MB.\n");
        if (g_r2_on)
            printf("# upd r2 (--replicas): 1x1 sum with the shard on 2 replicas, primary %s and backup %s\n"
                   "#   (%s); a push goes on to the backup and is answered once the backup acknowledges it\n",
                   kc[CONF_R2].ep[0], kc[CONF_R2].ep[1], g_procs ? "a process each" : "threads here");
        printf("#\n");
    }
    print_header(csv);
    fflush(stdout);

    row res[MAX_SIZES][2 + NCONF];
    int pieces[MAX_SIZES] = {0}; /* kvps's slices of each size (1 server): the same-pattern peer's pieces */
    double t_start = now_s();
    for (int si = only >= 0 ? only : 0; si < nsizes; si++) {
        size_t bytes = sizes[si], len = bytes / sizeof(float);
        int W = windows[si];

        /* Warm-up and a correctness check for every peer at this size. */
        for (int c = 0; c < NCONF; c++) {
            if (!conf_on(c)) continue;
            kvps_sanity(&kc[c], si, conf_noupdate[c], scratch, grad, dst, len);
            kvps_window(&kc[c], si, OP_PUSH, grad, dst, 2 * W, W);
            kvps_window(&kc[c], si, OP_PULL, grad, dst, 2 * W, W);
        }
        if (g_r2_on && si == (only >= 0 ? only : 0)) replicas_check(&kc[CONF_R2]);
        /* kvps cuts values past max_slice into pieces: the same-pattern peer sends the same pieces */
        int P = pieces[si] = (int)kvps_worker_tensor_slices(kc[0].w, kc[0].t[si]);
        raw_window(&rc, OP_PUSH, (const char *)grad, bytes, 2 * W, W, 1);
        raw_window(&rc, OP_PULL, (const char *)grad, bytes, 2 * W, W, 1);

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
                    raw_rt(&rc, (const char *)grad, bytes, n, lat, 1);
                    t = now_s() - t;
                    free(lat);
                } else {
                    t = raw_window(&rc, op, (const char *)grad, bytes, n, W, 1);
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

        double v[2 + NCONF][6][MAX_REP];
        double cpu[2 + NCONF][5][MAX_REP]; /* this process's CPU seconds per op (the client's), by op */
        for (int op = OP_PUSH; op <= OP_PULLV; op++) {
            for (int rep = 0; rep < g_reps; rep++) {
                /* p 0: raw ZeroMQ, whole values; 1: raw ZeroMQ in kvps's pieces (when P > 1); 2..: kvps;
                   the timeline's configuration (--timeline) right after its twin with it off; the
                   replicated one (--replicas) next to its twin too: after it (and the timeline's) in
                   even repetitions, before it in odd ones */
                int ord[2 + NCONF], no = 0;
                ord[no++] = 0;
                ord[no++] = 1;
                if (g_r2_on && rep % 2) ord[no++] = 2 + CONF_R2;
                ord[no++] = 2;
                if (g_tl_on) ord[no++] = 2 + CONF_TL;
                if (g_r2_on && rep % 2 == 0) ord[no++] = 2 + CONF_R2;
                for (int c = 1; c < CONF_TL; c++) ord[no++] = 2 + c;
                for (int i = 0; i < no; i++) {
                    int p = ord[i];
                    if (p == 1 && P == 1) continue;
                    int rp = p == 1 ? P : 1;
                    double c0 = cpu_s();
                    if (op == OP_RT) {
                        if (p <= 1) raw_rt(&rc, (const char *)grad, bytes, n_rt, lat, rp);
                        else kvps_rt(&kc[p - 2], si, grad, dst, n_rt, lat);
                        cpu[p][op][rep] = (cpu_s() - c0) / (double)n_rt;
                        v[p][3][rep] = percentile(lat, n_rt, 0.50) * 1e6;
                        v[p][4][rep] = percentile(lat, n_rt, 0.99) * 1e6;
                        continue;
                    }
                    double t = p <= 1 ? raw_window(&rc, op == OP_PULLV ? OP_PULL : op, (const char *)grad, bytes, n_thr, W, rp)
                                      : kvps_window(&kc[p - 2], si, op, grad, dst, n_thr, W);
                    cpu[p][op][rep] = (cpu_s() - c0) / (double)n_thr;
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
        if (P == 1) memcpy(v[1], v[0], sizeof v[0]); /* the same peer */
        for (int p = 0; p < 2 + NCONF; p++) {
            if (p >= 2 && !conf_on(p - 2)) continue;
            row *r = &res[si][p];
            r->push_gbs = median(v[p][0]);
            r->pull_gbs = median(v[p][1]);
            r->push_ops = median(v[p][2]);
            r->p50_us = median(v[p][3]);
            r->p99_us = median(v[p][4]);
            r->pullv_gbs = median(v[p][5]);
        }
        print_row(csv, "zmq", "-", 1, bytes, W, n_thr, n_rt, 0, &res[si][0], NULL);
        if (P > 1) print_row(csv, "zmq", "-", 1, bytes, W, n_thr, n_rt, P, &res[si][1], NULL);
        for (int c = 0; c < NCONF; c++)
            if (conf_on(c))
                print_row(csv, "kvps", conf_replicas[c] > 1 ? "r2" : conf_timeline[c] ? "tl" : conf_noupdate[c] ? "none" : "sum",
                          conf_servers[c], bytes, W, n_thr, n_rt, (int)kvps_worker_tensor_slices(kc[c].w, kc[c].t[si]),
                          &res[si][2 + c], &res[si][1]);
        if (g_tl_on)
            pair_cost(csv, "timeline", *g_timeline ? "on/off" : "off/off (the control: --timeline '')", "on", "off", bytes,
                      v[2], v[2 + CONF_TL], cpu[2], cpu[2 + CONF_TL]);
        if (g_r2_on) pair_cost(csv, "replicas", "r=2/r=1", "r=2", "r=1", bytes, v[2], v[2 + CONF_R2], cpu[2], cpu[2 + CONF_R2]);
        fflush(stdout);
    }
    double elapsed = now_s() - t_start;
    if (g_tl_on && *g_timeline) timeline_event_cost(csv);
    if (g_r2_on) replicas_report(&kc[CONF_R2], csv);

    /* Targets from the issue, 1 server x 1 worker: information for the reader, not a test. */
    printf("#\n# targets (1 server x 1 worker, KVPS_UPDATE_ACCUMULATE, loopback; whole run %.0f s):\n", elapsed);
    for (int which = 0; which < 3; which++) {
        int pass = 1;
        char buf[256] = "";
        size_t used = 0;
        for (int si = only >= 0 ? only : 0; si < nsizes; si++) {
            if (sizes[si] < (1u << 20)) continue;
            /* kvps 1x1 against the same-pattern peer (res[si][1]) and whole values (res[si][0]) */
            double x = row_gbs(&res[si][2], which) / row_gbs(&res[si][1], which);
            double x1 = row_gbs(&res[si][2], which) / row_gbs(&res[si][0], which);
            pass &= x >= 0.9;
            used += (size_t)snprintf(buf + used, sizeof buf - used, " %zuMB %.2fx", sizes[si] >> 20, x);
            if (pieces[si] > 1)
                used += (size_t)snprintf(buf + used, sizeof buf - used, " (%.2fx of whole)", x1);
        }
        if (!used) snprintf(buf, sizeof buf, " not measured (--only)");
        printf("#   %-4s %s payload GB/s >= 0.9x zmq at >= 1 MB:%s\n", !used ? "-" : pass ? "PASS" : "MISS",
               which == 0 ? "push" : which == 1 ? "pull (into the caller's buffer)" : "pull (zero-copy view)", buf);
    }
    if (only > 0) goto done; /* the 4 KB targets need the 4 KB row */
    double xo = res[0][2].push_ops / res[0][0].push_ops;
    printf("#   %-4s 4 KB pipelined push ops/s >= 0.5x zmq: %.2fx\n", xo >= 0.5 ? "PASS" : "MISS", xo);
    double xl = res[0][2].p50_us / res[0][0].p50_us;
    printf("#   %-4s 4 KB pushpull round trip p50 <= 1.5x zmq: %.1f us vs %.1f us = %.2fx\n",
           xl <= 1.5 ? "PASS" : "MISS", res[0][2].p50_us, res[0][0].p50_us, xl);
done:
    for (int c = 0; c < NCONF; c++)
        if (conf_on(c)) kvps_down(&kc[c]);
    raw_down(&rs, &rc);
    free(grad); free(dst); free(scratch); free(srvbuf);
    return 0;
}
