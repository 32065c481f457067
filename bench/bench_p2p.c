/* bench_p2p - kvps_ring_send / recv between 2 processes on loopback, next to raw ZeroMQ (a PAIR
   socket pair doing the same) and OpenMPI's MPI_Send / MPI_Recv over TCP, measured in the same run.

   usage: bench_p2p [--repeat R] [--time S] [--mpi PATH | --no-mpi] [--kvps tcp|shm|zmq] [--quick]

   Latency: ping-pong, half the round trip, sizes 8 B .. 64 KiB. Bandwidth: streaming, sizes
   1 MiB .. 64 MiB: the receiver posts a window of W receives (W = 8, fewer where 8 x size would
   pass 64 MiB), the sender posts W sends, both wait for all, then the receiver answers 1 byte;
   MB/s = W x size / time of that. Both as OSU's osu_latency and osu_bw do.

   --kvps: the transport kvps's ring uses between the two processes (kvps_ring.h section 10):
   tcp (default: .shm = -1, its own TCP connections, as MPI's TCP here), shm (shared memory, as
   on one host by default), zmq (.shm = -1, .tcp = -1: ZeroMQ, as before issue 30).

   Each of the three (kvps, zmq, mpi) runs as 2 fresh processes (fork; mpirun for MPI), rank 0
   and rank 1, over tcp://127.0.0.1 (kvps: a 2-rank ring on ephemeral ports, endpoints swapped
   through pipes; zmq: PAIR, rank 0 binds an ephemeral port; MPI: pml ob1, btl tcp,self on lo,
   as bench_ring runs mpi_allreduce). Per size: a warm-up whose last message is checked (every
   byte as sent), an estimate that sets the iteration count (about --time seconds per size, 0.2
   by default, in 5 blocks), then 5 timed blocks; the figure is the median block. kvps's and
   zmq's sends of 64 KiB and more go without a copy (kvps does so itself above 64 KiB; the raw
   zmq side with zmq_msg_init_data), and receives copy into the caller's buffer in both.
   The three take turns, --repeat times (3 by default), so that drift on a shared machine hits
   them alike; each figure is printed per repeat, then its range, and the ratios kvps/zmq and
   kvps/mpi (latency: kvps's time over the other's, > 1 is slower; bandwidth: kvps's MB/s over
   the other's, < 1 is slower) per repeat and their range.

   The MPI peer is bench/mpi_p2p.c (`make bench-p2p` builds it with mpicc; by hand: mpicc -O2
   bench/mpi_p2p.c -o build/mpi_p2p). It runs when mpirun is on PATH and mpi_p2p sits next to
   this program (or --mpi PATH); --no-mpi skips it, and the MPI columns then say "-". */
#define _GNU_SOURCE
#define BENCH_NAME "bench_p2p"
#define KVPS_IMPLEMENTATION
#include "kvps_ring.h"
#include "bench/bench_cpu.h"
#include "bench/bench_pipe.h"
#include "bench/p2p_method.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- the two transports measured here, behind p2p_method.h's interface --------------------- */

typedef struct kv_ctx { kvps_ring *r; kvps_ring_req q[P2P_MAXW + 1]; int nq; } kv_ctx;

static void kv_send(void *c, const void *b, size_t n, int peer) {
    kv_ctx *k = (kv_ctx *)c;
    if (kvps_ring_send(k->r, b, n, KVPS_INT32, peer, 1) != KVPS_OK) die("kvps_ring_send", kvps_ring_last_error(k->r));
}
static void kv_recv(void *c, void *b, size_t n, int peer) {
    kv_ctx *k = (kv_ctx *)c;
    if (kvps_ring_recv(k->r, b, n, KVPS_INT32, peer, 1) != KVPS_OK) die("kvps_ring_recv", kvps_ring_last_error(k->r));
}
static void kv_isend(void *c, const void *b, size_t n, int peer) {
    kv_ctx *k = (kv_ctx *)c;
    if (kvps_ring_isend(k->r, b, n, KVPS_INT32, peer, 2, &k->q[k->nq++]) != KVPS_OK) die("kvps_ring_isend", kvps_ring_last_error(k->r));
}
static void kv_irecv(void *c, void *b, size_t n, int peer) {
    kv_ctx *k = (kv_ctx *)c;
    if (kvps_ring_irecv(k->r, b, n, KVPS_INT32, peer, 2, &k->q[k->nq++]) != KVPS_OK) die("kvps_ring_irecv", kvps_ring_last_error(k->r));
}
static void kv_waitall(void *c) {
    kv_ctx *k = (kv_ctx *)c;
    for (int i = 0; i < k->nq; i++)
        if (kvps_ring_wait(k->r, k->q[i], -1) != KVPS_OK) die("kvps_ring_wait", kvps_ring_last_error(k->r));
    k->nq = 0;
}

/* Raw ZeroMQ: one PAIR socket each. Counts are int32 elements, as for kvps and MPI. */
typedef struct zq_ctx { void *s; void *rb[P2P_MAXW]; size_t rn[P2P_MAXW]; int nr; } zq_ctx;
static void zq_nofree(void *d, void *h) { (void)d; (void)h; }
static void zq_send(void *c, const void *b, size_t n, int peer) {
    (void)peer;
    zmq_msg_t m;
    size_t bytes = n * 4;
    if (bytes >= 65536) zmq_msg_init_data(&m, (void *)(uintptr_t)b, bytes, zq_nofree, NULL); /* the buffer outlives the bench */
    else { zmq_msg_init_size(&m, bytes); memcpy(zmq_msg_data(&m), b, bytes); }
    if (zmq_msg_send(&m, ((zq_ctx *)c)->s, 0) < 0) die("zmq send", zmq_strerror(zmq_errno()));
}
static void zq_recv(void *c, void *b, size_t n, int peer) {
    (void)peer;
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, ((zq_ctx *)c)->s, 0) < 0 || zmq_msg_size(&m) != n * 4) die("zmq recv", "failed or wrong size");
    memcpy(b, zmq_msg_data(&m), n * 4);
    zmq_msg_close(&m);
}
static void zq_irecv(void *c, void *b, size_t n, int peer) {
    (void)peer;
    zq_ctx *z = (zq_ctx *)c;
    z->rb[z->nr] = b;
    z->rn[z->nr++] = n;
}
static void zq_waitall(void *c) {
    zq_ctx *z = (zq_ctx *)c;
    for (int i = 0; i < z->nr; i++) zq_recv(c, z->rb[i], z->rn[i], 0);
    z->nr = 0;
}

/* ---- processes --------------------------------------------------------------------------- */

/* Runs `fn` as ranks 0 and 1 (fork); rank 0's result lines come back through a pipe into out. */
typedef void (*rank_fn)(int rank, int up, int down, int res, const p2p_cfg *cfg);

static const char *g_kvps = "tcp"; /* --kvps */

static void kv_rank(int rank, int up, int down, int res, const p2p_cfg *cfg) {
    kv_ctx k = {0};
    int shm = strcmp(g_kvps, "shm") == 0 ? 1 : -1, tcp = strcmp(g_kvps, "zmq") == 0 ? -1 : 1;
    if (kvps_ring_create(&(kvps_ring_desc){.rank = rank, .size = 2, .bind = "tcp://127.0.0.1:*", .timeout_ms = 120000,
                                           .shm = shm, .tcp = tcp}, &k.r) != KVPS_OK)
        die("kvps_ring_create", "failed");
    if (write_str(up, kvps_ring_endpoint(k.r)) != 0) die("pipe", "write");
    char *peers = read_str(down);
    if (!peers || kvps_ring_connect(k.r, peers) != KVPS_OK) die("kvps_ring_connect", peers ? peers : "no peers");
    free(peers);
    p2p_ops ops = {&k, kv_send, kv_recv, kv_isend, kv_irecv, kv_waitall};
    FILE *f = fdopen(res, "w");
    p2p_run(&ops, rank, cfg, rank == 0 ? f : NULL);
    fclose(f);
    kvps_ring_destroy(&k.r);
}

static void zq_rank(int rank, int up, int down, int res, const p2p_cfg *cfg) {
    void *ctx = zmq_ctx_new();
    zq_ctx z = {0};
    z.s = zmq_socket(ctx, ZMQ_PAIR);
    if (rank == 0) {
        char ep[256];
        size_t sz = sizeof ep;
        if (zmq_bind(z.s, "tcp://127.0.0.1:*") != 0) die("zmq_bind", zmq_strerror(zmq_errno()));
        zmq_getsockopt(z.s, ZMQ_LAST_ENDPOINT, ep, &sz);
        if (write_str(up, ep) != 0) die("pipe", "write");
    } else if (write_str(up, "") != 0) die("pipe", "write");
    char *peers = read_str(down); /* "EP0,": rank 1 connects to rank 0's */
    if (!peers) die("pipe", "read");
    if (rank == 1) { *strchr(peers, ',') = 0; if (zmq_connect(z.s, peers) != 0) die("zmq_connect", peers); }
    free(peers);
    p2p_ops ops = {&z, zq_send, zq_recv, zq_send, zq_irecv, zq_waitall};
    FILE *f = fdopen(res, "w");
    p2p_run(&ops, rank, cfg, rank == 0 ? f : NULL);
    fclose(f);
    int zero = 0;
    zmq_setsockopt(z.s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(z.s);
    zmq_ctx_term(ctx);
}

/* Reads result lines "lat BYTES US" / "bw BYTES MBPS" into lat[] / bw[] (by size index); other
   lines (mpirun's) are passed through to stderr. */
static void parse(FILE *f, const p2p_cfg *cfg, double *lat, double *bw) {
    char line[512], kind[8];
    double bytes, v;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%7s %lf %lf", kind, &bytes, &v) != 3 || (strcmp(kind, "lat") != 0 && strcmp(kind, "bw") != 0)) {
            fputs(line, stderr);
            continue;
        }
        for (int i = 0; i < cfg->nlat; i++) if (kind[0] == 'l' && (size_t)bytes == cfg->lat[i]) lat[i] = v;
        for (int i = 0; i < cfg->nbw; i++) if (kind[0] == 'b' && (size_t)bytes == cfg->bw[i]) bw[i] = v;
    }
}

static void run_pair(rank_fn fn, const p2p_cfg *cfg, double *lat, double *bw) {
    int up[2][2], down[2][2], res[2];
    pid_t pid[2];
    if (pipe(res) != 0) die("pipe", strerror(errno));
    fflush(stdout);
    for (int r = 0; r < 2; r++) {
        if (pipe(up[r]) != 0 || pipe(down[r]) != 0) die("pipe", strerror(errno));
        pid[r] = fork();
        if (pid[r] < 0) die("fork", strerror(errno));
        if (pid[r] == 0) {
            close(res[0]);
            fn(r, up[r][1], down[r][0], res[1], cfg);
            _exit(0);
        }
    }
    close(res[1]);
    char *ep[2], peers[600];
    for (int r = 0; r < 2; r++) if (!(ep[r] = read_str(up[r][0]))) die("a rank", "did not start");
    snprintf(peers, sizeof peers, "%s,%s", ep[0], ep[1]);
    for (int r = 0; r < 2; r++) { write_str(down[r][1], peers); free(ep[r]); close(up[r][0]); close(up[r][1]); close(down[r][0]); close(down[r][1]); }
    FILE *f = fdopen(res[0], "r");
    parse(f, cfg, lat, bw);
    fclose(f);
    for (int r = 0; r < 2; r++) {
        int st;
        waitpid(pid[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die("a rank", "failed (see above)");
    }
}

static void run_mpi(const char *prog, const p2p_cfg *cfg, double *lat, double *bw) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "mpirun --allow-run-as-root --oversubscribe -np 2 --bind-to none --mca pml ob1 --mca btl tcp,self "
             "--mca btl_tcp_if_include lo %s --time %g%s", prog, cfg->time_s, cfg->quick ? " --quick" : "");
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) die("popen", cmd);
    parse(p, cfg, lat, bw);
    if (pclose(p) != 0) die("mpirun", "failed (its output above)");
}

/* ---- the report ---------------------------------------------------------------------------- */

enum { MAXREP = 20, KV = 0, ZQ = 1, MP = 2 };
static double LAT[3][MAXREP][P2P_MAXSIZES], BW[3][MAXREP][P2P_MAXSIZES];

static void range(const double *v, int n, int stride, double *lo, double *hi) {
    *lo = 1e300; *hi = -1e300;
    for (int i = 0; i < n; i++) { double x = v[i * stride]; if (x < *lo) *lo = x; if (x > *hi) *hi = x; }
}

static void report(const char *what, const char *unit, double (*t)[MAXREP][P2P_MAXSIZES], const size_t *sizes, int ns, int reps,
                   int mpi, int lat) {
    printf("\n# %s: %s per repeat; range; ratios kvps/zmq and kvps/mpi per repeat (%s)\n", what, unit,
           lat ? "time over time: > 1 is kvps slower" : "MB/s over MB/s: < 1 is kvps slower");
    printf("%10s %-6s %-40s %-20s\n", "bytes", "who", "per repeat", "range");
    for (int s = 0; s < ns; s++) {
        static const char *who[3] = {"kvps", "zmq", "mpi"};
        for (int w = 0; w < (mpi ? 3 : 2); w++) {
            char per[256] = "";
            double v[MAXREP], lo, hi;
            for (int r = 0; r < reps; r++) {
                v[r] = t[w][r][s];
                snprintf(per + strlen(per), sizeof per - strlen(per), "%.*f ", lat ? 1 : 0, v[r]);
            }
            range(v, reps, 1, &lo, &hi);
            printf("%10zu %-6s %-40s %.*f-%.*f %s\n", sizes[s], who[w], per, lat ? 1 : 0, lo, lat ? 1 : 0, hi, unit);
        }
        for (int w = 1; w < (mpi ? 3 : 2); w++) {
            char per[256] = "";
            double v[MAXREP], lo, hi;
            for (int r = 0; r < reps; r++) {
                v[r] = t[KV][r][s] / t[w][r][s];
                snprintf(per + strlen(per), sizeof per - strlen(per), "%.2f ", v[r]);
            }
            range(v, reps, 1, &lo, &hi);
            printf("%10zu %-6s %-40s %.2f-%.2f\n", sizes[s], w == 1 ? "k/zmq" : "k/mpi", per, lo, hi);
        }
    }
}

static int in_path(const char *name) {
    const char *path = getenv("PATH");
    char buf[1024];
    while (path && *path) {
        const char *c = strchr(path, ':');
        size_t n = c ? (size_t)(c - path) : strlen(path);
        snprintf(buf, sizeof buf, "%.*s/%s", (int)n, path, name);
        if (access(buf, X_OK) == 0) return 1;
        path = c ? c + 1 : NULL;
    }
    return 0;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    p2p_cfg cfg;
    p2p_cfg_default(&cfg);
    int reps = 3, want_mpi = -1;
    char mpi_prog[512];
    const char *slash = strrchr(argv[0], '/');
    snprintf(mpi_prog, sizeof mpi_prog, "%.*smpi_p2p", slash ? (int)(slash - argv[0] + 1) : 0, argv[0]);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--time") == 0 && i + 1 < argc) cfg.time_s = atof(argv[++i]);
        else if (strcmp(argv[i], "--quick") == 0) p2p_cfg_quick(&cfg);
        else if (strcmp(argv[i], "--kvps") == 0 && i + 1 < argc &&
                 (!strcmp(argv[i + 1], "tcp") || !strcmp(argv[i + 1], "shm") || !strcmp(argv[i + 1], "zmq")))
            g_kvps = argv[++i];
        else if (strcmp(argv[i], "--no-mpi") == 0) want_mpi = 0;
        else if (strcmp(argv[i], "--mpi") == 0 && i + 1 < argc) { want_mpi = 1; snprintf(mpi_prog, sizeof mpi_prog, "%s", argv[++i]); }
        else {
            fprintf(stderr, "usage: bench_p2p [--repeat R] [--time S] [--mpi PATH | --no-mpi] [--kvps tcp|shm|zmq] [--quick]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > MAXREP || !(cfg.time_s > 0)) { fprintf(stderr, "bench_p2p: --repeat 1..%d, --time > 0\n", MAXREP); return 2; }
    int mpi = want_mpi != 0 && in_path("mpirun") && access(mpi_prog, X_OK) == 0;
    if (want_mpi == 1 && !mpi) die("--mpi", "needs mpirun on PATH and an executable mpi_p2p (make bench-p2p)");
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    bench_machine(stdout, kvps_isa_set(KVPS_ISA_AUTO));
    printf("# bench_p2p: 2 processes on tcp://127.0.0.1, %ld CPUs online, %d repeats, %.2f s per size; int32 elements\n", ncpu,
           reps, cfg.time_s);
    printf("# MPI peer: %s\n", mpi ? mpi_prog : want_mpi == 0 ? "not run (--no-mpi)" : "not run (mpirun or mpi_p2p not found)");
    printf("# kvps transport: %s (--kvps)\n", g_kvps);
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        run_pair(kv_rank, &cfg, LAT[KV][r], BW[KV][r]);
        run_pair(zq_rank, &cfg, LAT[ZQ][r], BW[ZQ][r]);
        if (mpi) run_mpi(mpi_prog, &cfg, LAT[MP][r], BW[MP][r]);
        printf("# repeat %d done in %.1f s\n", r + 1, now_s() - t0);
    }
    report("latency (ping-pong, half round trip)", "us", LAT, cfg.lat, cfg.nlat, reps, mpi, 1);
    report("bandwidth (streaming, window of posted receives)", "MB/s", BW, cfg.bw, cfg.nbw, reps, mpi, 0);
    return 0;
}
