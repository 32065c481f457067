/* bench_ring - kvps_ring collectives, nccl-tests style, next to OpenMPI's MPI_Allreduce (its
   default transport, shared memory on one host, and TCP) measured in the same run.

   usage: bench_ring [--ranks 2,4,8] [--sizes 4K:64M[:4] | --sizes B,B,...] [--coll LIST]
                     [--algo auto,ring,biring,rd,rhd,hier] [--chunk 256K,...] [--time S] [--inplace]
                     [--io-threads N] [--io-cpus rank|none] [--groups Q] [--shm 0|1] [--tcp 0|1]
                     [--mpi [PATH] | --no-mpi] [--mpi-btl tcp|default|both] [--quick] [--csv]

   Ranks are separate processes on one machine (fork; each makes its ZeroMQ context after the
   fork). --shm 1 (the default) sets KVPS_RING_SHM=1 in every rank: kvps_ring carries the data
   between ranks of one host through shared memory (ZeroMQ still connects them); --shm 0 sets
   KVPS_RING_SHM=0: every peer over the ring's own TCP connections on 127.0.0.1 (--tcp 0 sets
   KVPS_RING_TCP=0: over ZeroMQ, as before issue 30). After its first collective (the barrier before anything is timed) rank 0 asks
   kvps_ring_transport for every peer on every ring and sends the answer to the parent, which
   prints it ("kvps transport: shm", or zmq, or each peer's where they differ) above the
   rank count's tables, and in the CSV as a '#' line. Each rank creates its ring with
   .bind = "tcp://127.0.0.1:*" and no peers, sends kvps_ring_endpoint() to the parent through a
   pipe, gets the comma-separated list of all endpoints back through another and calls
   kvps_ring_connect. With several --chunk values each rank makes one ring per value, all on
   one ZeroMQ context (so they share its I/O thread as a single ring would). Each rank
   allocates its send and receive buffers once, for the largest size, and touches them before
   any timing. By default rank r pins its ZeroMQ I/O thread(s) to the (r mod n)-th of the n CPUs
   it may run on (kvps_zmq_ctx_pin, what .io_cpus does for a ring's own context); the ranks' own threads are
   not pinned. --io-cpus none leaves every thread to the OS. OpenMPI runs with --bind-to none:
   binding its ranks to cores (--bind-to core, core:overload-allowed at 4 ranks) changed its
   figures by less than run-to-run noise here (BENCHMARKS.md).

   Per collective and size, for every variant (chunk size x all-reduce algorithm): one call
   whose result is checked on every rank (exact small integers), then an estimate (2 calls; the
   slowest rank's time sets the count, agreed through the ring itself), then 5 timed blocks of
   that many calls, about --time seconds in all, each after a barrier. The variants take turns
   block by block, so that drift on a shared machine hits them alike. A block's time is the
   per-call time averaged over ranks, as nccl-tests reports it (max_us: the slowest rank's);
   cpu_us is the CPU time per call summed over ranks and threads (ZeroMQ's I/O threads, MPI's
   progress); every figure is the median of the 5 blocks. float32, sum, root 0, out of place
   (--inplace: all-reduce in place, kvps and MPI alike). At the end of each rank count the CPU
   time that other processes took meanwhile is printed: on a shared machine, trust ratios
   measured side by side more than absolute figures. --groups Q gives every ring .groups (rank r
   in group r / Q), so that --algo hier (and auto past .small_bytes) runs the hierarchical
   all-reduce; without it hier is the ring.

   Columns as nccl-tests: size is the bytes of the whole buffer (for reduce_scatter the input,
   for allgather the output, for alltoall what each rank sends), count = size / 4,
   algbw = size / time, busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for reduce-scatter,
   all-gather and all-to-all, x 1 for broadcast and reduce.

   The peer: bench/mpi_allreduce.c (build it with `mpicc -O2 bench/mpi_allreduce.c -o
   build/mpi_allreduce`), which times MPI_Allreduce the same way. This program runs it through
   mpirun with the same sizes and --time, after the kvps ranks of the same count have exited,
   as up to three peers (--mpi-btl; default both):
     MPI(shm)       (--mpi-btl default or both; CSV peer mpi_shm): OpenMPI's default transport
                    selection, no --mca pml/btl given. On one host that is shared memory (where
                    this was written, with UCX excluded by the system's openmpi-mca-params.conf:
                    pml ob1, btl vader between the ranks); default algorithm choice.
     MPI(tcp)       (--mpi-btl tcp or both; CSV peer mpi_tcp): OpenMPI's TCP transport on
                    loopback (pml ob1, btl tcp,self, lo only); default algorithm choice.
     MPI(tcp,ring)  (with MPI(tcp); CSV peer mpi_tcp_ring): the same with its ring forced
                    (coll_tuned algorithm 4).
   Every kvps/MPI ratio is printed against each of them that ran. It runs when mpirun is on
   PATH and mpi_allreduce sits next to this program (or --mpi PATH); --no-mpi skips it. Where
   there are fewer CPUs than ranks (4 and 8 on a 2-CPU machine) both kvps and MPI are
   oversubscribed; OpenMPI's ranks poll while they wait, kvps's sleep in zmq_poll (and in a
   futex, over shared memory). */
#define _GNU_SOURCE /* sched_getaffinity (bench_cpu.h) */
#define BENCH_NAME "bench_ring" /* die() (bench_cpu.h) */
#define KVPS_IMPLEMENTATION
#include "kvps_ring.h"
#include "bench/bench_cpu.h"
#include "bench/bench_pipe.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { NREP = 5, MAX_SIZES = 40, MAX_RANKS = 64, MAX_LIST = 16, MAX_ROWS = 4096 };

/* ---- what can be measured ------------------------------------------------------------------ */

typedef struct coll_info {
    const char *name;
    kvps_coll coll;
    int busf; /* 2: 2(n-1)/n, 1: (n-1)/n, 0: 1 */
} coll_info;

static const coll_info colls[] = {
    {"allreduce", KVPS_COLL_ALLREDUCE, 2},     {"reduce_scatter", KVPS_COLL_REDUCE_SCATTER, 1},
    {"allgather", KVPS_COLL_ALLGATHER, 1},     {"broadcast", KVPS_COLL_BROADCAST, 0},
    {"reduce", KVPS_COLL_REDUCE, 0},           {"alltoall", KVPS_COLL_ALLTOALL, 1},
};
enum { NCOLLS = sizeof colls / sizeof colls[0] };

static const char *algo_names[] = {"auto", "ring", "biring", "rd", "hier", "rhd", "direct", "oneshot"};

static double bus_factor(int busf, int n) {
    return busf == 2 ? 2.0 * (n - 1) / n : busf == 1 ? (double)(n - 1) / n : 1.0;
}

/* Who a row measures. The MPI peers' order is the order they run in and their columns'. */
enum { P_KVPS = 0, P_MPI_SHM = 1, P_MPI_TCP = 2, P_MPI_TCP_RING = 3, NPEERS = 4 };
static const char *peer_csv[NPEERS] = {"kvps", "mpi_shm", "mpi_tcp", "mpi_tcp_ring"};
static const char *peer_label[NPEERS] = {"kvps", "MPI(shm)", "MPI(tcp)", "MPI(tcp,ring)"};

/* One measured row: kvps or one of the MPI peers (P_*). */
typedef struct row {
    int peer, n, coll, algo, ok;
    size_t chunk, bytes;
    long iters;
    double t_us, tmax_us, cpu_us;
} row;

typedef struct config {
    int ranks[MAX_LIST], nranks;
    size_t sizes[MAX_SIZES];
    int nsizes;
    int coll[NCOLLS], ncoll;
    int algo[MAX_LIST], nalgo;
    size_t chunk[MAX_LIST];
    int nchunk;
    double target;
    int inplace, csv, io_threads, io_cpus_none;
    int groups; /* --groups Q: ranks r / Q form a group (.groups, for HIER); 0: none */
    int shm;    /* --shm: KVPS_RING_SHM for the ranks (1 default, 0: every peer over TCP or ZeroMQ) */
    int tcp;    /* --tcp: KVPS_RING_TCP for the ranks (1 default: the ring's own connections; 0: ZeroMQ) */
    int mpi_shm, mpi_tcp; /* --mpi-btl: which MPI peers run (default both) */
} config;

/* ---- one rank ------------------------------------------------------------------------------ */

typedef struct rank_ctx {
    kvps_ring *r;              /* rings[0]: barriers and the ranks' agreements */
    kvps_ring *rings[MAX_LIST]; /* one per --chunk value, all on one ZeroMQ context */
    void *zctx;
    int rank, n;
    float *send, *recv;
} rank_ctx;

static void kcheck(kvps_result rc, const char *what, const rank_ctx *c) {
    if (rc != KVPS_OK) {
        fprintf(stderr, "bench_ring: rank %d of %d: %s: %s: %s\n", c->rank, c->n, what, kvps_result_str(rc),
                c->r ? kvps_ring_last_error(c->r) : "");
        exit(1);
    }
}

static void run_op(const rank_ctx *c, kvps_ring *ring, const kvps_ring_op *op, const char *what) {
    kvps_result rc = kvps_ring_run(ring, op);
    if (rc != KVPS_OK) {
        fprintf(stderr, "bench_ring: rank %d of %d: %s: %s: %s\n", c->rank, c->n, what, kvps_result_str(rc),
                kvps_ring_last_error(ring));
        exit(1);
    }
}

/* The operation of one call at `bytes` (nccl-tests' size). */
static kvps_ring_op make_op(const rank_ctx *c, const config *cf, int ci, int algo, size_t bytes) {
    kvps_ring_op op;
    memset(&op, 0, sizeof op);
    op.coll = colls[ci].coll;
    op.dtype = KVPS_FLOAT32;
    op.op = KVPS_SUM;
    op.root = 0;
    op.algo = (kvps_ring_algo)algo;
    op.send = c->send;
    op.recv = c->recv;
    size_t total = bytes / sizeof(float);
    switch (op.coll) {
    case KVPS_COLL_ALLREDUCE:
        op.count = total;
        if (cf->inplace) op.send = c->recv;
        break;
    case KVPS_COLL_BROADCAST:
    case KVPS_COLL_REDUCE: op.count = total; break;
    default: op.count = total / (size_t)c->n; /* per rank, as NCCL counts */
    }
    return op;
}

/* Fills the buffers for the check. Returns the number of elements to check in recv. */
static size_t check_fill(const rank_ctx *c, const kvps_ring_op *op) {
    size_t cnt = op->count, k = (size_t)c->n;
    float *s = c->send, *d = c->recv, me = (float)(c->rank + 1);
    switch (op->coll) {
    case KVPS_COLL_ALLREDUCE:
        for (size_t i = 0; i < cnt; i++) { s[i] = me; d[i] = -1; }
        if (op->send == op->recv) for (size_t i = 0; i < cnt; i++) d[i] = me;
        return cnt;
    case KVPS_COLL_REDUCE:
        for (size_t i = 0; i < cnt; i++) { s[i] = me; d[i] = -1; }
        return c->rank == 0 ? cnt : 0;
    case KVPS_COLL_BROADCAST:
        for (size_t i = 0; i < cnt; i++) { s[i] = 7; d[i] = -1; }
        return cnt;
    case KVPS_COLL_REDUCE_SCATTER:
        for (size_t i = 0; i < cnt * k; i++) s[i] = me + (float)(i / cnt); /* block j: rank + 1 + j */
        for (size_t i = 0; i < cnt; i++) d[i] = -1;
        return cnt;
    case KVPS_COLL_ALLGATHER:
        for (size_t i = 0; i < cnt; i++) s[i] = me;
        for (size_t i = 0; i < cnt * k; i++) d[i] = -1;
        return cnt * k;
    case KVPS_COLL_ALLTOALL:
        for (size_t i = 0; i < cnt * k; i++) { s[i] = (float)((size_t)c->rank * k + i / cnt + 1); d[i] = -1; }
        return cnt * k;
    default: return 0;
    }
}

static float expect(const rank_ctx *c, const kvps_ring_op *op, size_t i) {
    float k = (float)c->n, tri = k * (k + 1) / 2;
    switch (op->coll) {
    case KVPS_COLL_ALLREDUCE: case KVPS_COLL_REDUCE: return tri;
    case KVPS_COLL_BROADCAST: return 7;
    case KVPS_COLL_REDUCE_SCATTER: return tri + k * (float)c->rank;
    case KVPS_COLL_ALLGATHER: return (float)(i / op->count + 1);
    case KVPS_COLL_ALLTOALL: return (float)((i / op->count) * (size_t)c->n + (size_t)c->rank + 1);
    default: return 0;
    }
}

static double ring_reduce_d(rank_ctx *c, double v, kvps_redop op) {
    kcheck(kvps_ring_allreduce(c->r, &v, &v, 1, KVPS_FLOAT64, op), "allreduce (coordination)", c);
    return v;
}

static double median(double *v, int n) { /* sorts v */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One collective at one size, for every variant (ring of a chunk size x algorithm): the timed
   blocks of the variants take turns, so that drift on a shared machine hits them alike. */
static void bench_size(rank_ctx *c, const config *cf, int ci, const int *algos, int na, size_t bytes, int out_fd) {
    size_t unit = sizeof(float) * (size_t)c->n;
    if (colls[ci].coll != KVPS_COLL_ALLREDUCE && colls[ci].coll != KVPS_COLL_BROADCAST &&
        colls[ci].coll != KVPS_COLL_REDUCE)
        bytes = bytes / unit * unit;
    enum { MAXV = MAX_LIST * MAX_LIST };
    int nv = na * cf->nchunk;
    kvps_ring *ring[MAXV];
    kvps_ring_op op[MAXV];
    int ok[MAXV];
    long iters[MAXV];
    double blk[MAXV][NREP], blk_max[MAXV][NREP], blk_cpu[MAXV][NREP];
    for (int v = 0; v < nv; v++) {
        ring[v] = c->rings[v / na];
        op[v] = make_op(c, cf, ci, algos[v % na], bytes);
        /* warm-up, checked */
        size_t nchk = check_fill(c, &op[v]);
        run_op(c, ring[v], &op[v], colls[ci].name);
        int good = 1;
        for (size_t i = 0; i < nchk && good; i++) good = c->recv[i] == expect(c, &op[v], i);
        ok[v] = ring_reduce_d(c, good, KVPS_MIN) > 0;
        if (op[v].send == op[v].recv) memset(c->recv, 0, bytes); /* in place, sums would grow call after call */
        /* the slowest rank's estimate sets the count, the same on every rank */
        kcheck(kvps_ring_barrier(c->r), "barrier", c);
        double t0 = now_s();
        for (int i = 0; i < 2; i++) run_op(c, ring[v], &op[v], colls[ci].name);
        double est = ring_reduce_d(c, (now_s() - t0) / 2, KVPS_MAX);
        iters[v] = (long)(cf->target / NREP / est);
        if (iters[v] < 1) iters[v] = 1;
        if (iters[v] > 100000) iters[v] = 100000;
    }
    for (int rep = 0; rep < NREP; rep++) {
        for (int v = 0; v < nv; v++) {
            kcheck(kvps_ring_barrier(c->r), "barrier", c);
            double c0 = cpu_s(), t0 = now_s();
            for (long i = 0; i < iters[v]; i++) run_op(c, ring[v], &op[v], colls[ci].name);
            double t = (now_s() - t0) / (double)iters[v], cpu = (cpu_s() - c0) / (double)iters[v];
            blk[v][rep] = ring_reduce_d(c, t, KVPS_SUM) / c->n;
            blk_max[v][rep] = ring_reduce_d(c, t, KVPS_MAX);
            blk_cpu[v][rep] = ring_reduce_d(c, cpu, KVPS_SUM);
        }
    }
    if (c->rank != 0) return;
    for (int v = 0; v < nv; v++) {
        row w;
        memset(&w, 0, sizeof w);
        w.peer = 0;
        w.n = c->n;
        w.coll = ci;
        w.algo = algos[v % na];
        w.ok = ok[v];
        w.chunk = cf->chunk[v / na];
        w.bytes = bytes;
        w.iters = iters[v];
        w.t_us = 1e6 * median(blk[v], NREP);
        w.tmax_us = 1e6 * median(blk_max[v], NREP);
        w.cpu_us = 1e6 * median(blk_cpu[v], NREP);
        if (write(out_fd, &w, sizeof w) != (ssize_t)sizeof w) die("write", strerror(errno));
    }
}

static void rank_main(const config *cf, int rank, int n, int up, int down) {
    rank_ctx c;
    memset(&c, 0, sizeof c);
    c.rank = rank;
    c.n = n;
    /* before any ring is made: kvps_ring_create reads it (.shm left 0 defers to it) */
    if (setenv("KVPS_RING_SHM", cf->shm ? "1" : "0", 1) != 0) die("setenv", strerror(errno));
    if (setenv("KVPS_RING_TCP", cf->tcp ? "1" : "0", 1) != 0) die("setenv", strerror(errno));
    /* One context for every ring, so the rings of all chunk sizes share the I/O thread(s) as one
       ring would: only one is busy at a time. */
    c.zctx = zmq_ctx_new();
    if (!c.zctx) die("zmq_ctx_new", zmq_strerror(zmq_errno()));
    zmq_ctx_set(c.zctx, ZMQ_IO_THREADS, cf->io_threads ? cf->io_threads : 1);
    if (!cf->io_cpus_none) { /* before the first socket: the I/O threads start with it */
        char cpu[16];
        snprintf(cpu, sizeof cpu, "%d", bench_cpu(rank));
        kcheck(kvps_zmq_ctx_pin(c.zctx, cpu), "kvps_zmq_ctx_pin", &c);
    }
    static int grp[MAX_RANKS];
    for (int i = 0; i < n; i++) grp[i] = cf->groups ? i / cf->groups : 0;
    for (int k = 0; k < cf->nchunk; k++) {
        kcheck(kvps_ring_create(&(kvps_ring_desc){.rank = rank, .size = n, .bind = "tcp://127.0.0.1:*",
                                                  .chunk_bytes = cf->chunk[k], .timeout_ms = 120000,
                                                  .zmq_ctx = c.zctx, .groups = cf->groups ? grp : NULL},
                                &c.rings[k]),
               "kvps_ring_create", &c);
        /* endpoint exchange through the parent: [u32 len][text] up, the list of all back down */
        if (write_str(up, kvps_ring_endpoint(c.rings[k])) != 0) die("write", strerror(errno));
    }
    c.r = c.rings[0];
    for (int k = 0; k < cf->nchunk; k++) {
        char *peers = read_str(down);
        if (!peers) die("read", "no peer list from the parent");
        kcheck(kvps_ring_connect(c.rings[k], peers), "kvps_ring_connect", &c);
        free(peers);
    }
    close(down);

    /* buffers once, touched (fresh pages cost ~3 us per 4 KiB here) */
    size_t maxb = 0;
    for (int i = 0; i < cf->nsizes; i++) maxb = cf->sizes[i] > maxb ? cf->sizes[i] : maxb;
    if (posix_memalign((void **)&c.send, 64, maxb) || posix_memalign((void **)&c.recv, 64, maxb))
        die("posix_memalign", "out of memory");
    memset(c.send, 0, maxb);
    memset(c.recv, 0, maxb);

    for (int k = 0; k < cf->nchunk; k++) /* every connection up before anything is timed */
        kcheck(kvps_ring_barrier(c.rings[k]), "barrier", &c);
    if (rank == 0) { /* how rank 0 reaches each peer, now that a collective has read every hello */
        char tr[MAX_LIST * MAX_RANKS * 24] = "";
        size_t used = 0;
        int same = 1;
        for (int k = 0; k < cf->nchunk; k++)
            for (int j = 1; j < n; j++)
                same &= strcmp(kvps_ring_transport(c.rings[k], j), kvps_ring_transport(c.rings[0], 1)) == 0;
        if (same) snprintf(tr, sizeof tr, "%s", kvps_ring_transport(c.rings[0], 1));
        else
            for (int k = 0; k < cf->nchunk && used < sizeof tr; k++)
                for (int j = 1; j < n && used < sizeof tr; j++)
                    used += (size_t)snprintf(tr + used, sizeof tr - used, "%sring %d rank %d %s", used ? ", " : "",
                                             k, j, kvps_ring_transport(c.rings[k], j));
        if (write_str(up, tr) != 0) die("write", strerror(errno));
    }
    for (int k = 0; k < cf->ncoll; k++) {
        int ci = cf->coll[k];
        static const int auto_only[1] = {KVPS_ALGO_AUTO};
        int ar = colls[ci].coll == KVPS_COLL_ALLREDUCE;
        for (int s = 0; s < cf->nsizes; s++)
            bench_size(&c, cf, ci, ar ? cf->algo : auto_only, ar ? cf->nalgo : 1, cf->sizes[s], up);
    }
    close(up);
    for (int k = 0; k < cf->nchunk; k++) kvps_ring_destroy(&c.rings[k]);
    zmq_ctx_term(c.zctx);
    free(c.send);
    free(c.recv);
}

/* ---- the parent: processes, MPI, tables ----------------------------------------------------- */

static row rows[MAX_ROWS];
static int nrows;

static void add_row(const row *w) {
    if (nrows == MAX_ROWS) die("rows", "too many");
    rows[nrows++] = *w;
}

static const char *fmt_bytes(size_t b, char *buf, size_t cap) {
    if (b >= (1u << 20) && b % (1u << 20) == 0) snprintf(buf, cap, "%zuM", b >> 20);
    else if (b >= 1024 && b % 1024 == 0) snprintf(buf, cap, "%zuK", b >> 10);
    else snprintf(buf, cap, "%zu", b);
    return buf;
}

/* How the kvps ranks of the latest run_kvps reached each other, as rank 0 reported it. */
static char kvps_transport[MAX_LIST * MAX_RANKS * 24] = "?";

static double busbw_of(const row *w) {
    double algbw = (double)w->bytes / (w->t_us * 1e-6) / 1e9;
    return algbw * bus_factor(colls[w->coll].busf, w->n);
}

static const char *algo_of(const row *w) {
    return w->peer == P_KVPS ? algo_names[w->algo] : w->peer == P_MPI_TCP_RING ? "ring" : "default";
}

static void print_table_head(const config *cf, const row *w) {
    if (cf->csv) return;
    bench_machine(stdout, kvps_isa_set(KVPS_ISA_AUTO));
    if (w->peer == P_KVPS)
        printf("#\n# kvps %s  ranks %d  float32 sum root 0%s  transport %s (--shm %d)\n", colls[w->coll].name, w->n,
               colls[w->coll].coll == KVPS_COLL_ALLREDUCE && cf->inplace ? "  in place" : "  out of place",
               kvps_transport, cf->shm);
    else if (w->peer == P_MPI_SHM)
        printf("#\n# %s: OpenMPI MPI_Allreduce, its default transport (shared memory on one host)  ranks %d  float32 sum%s"
               "  (algo default: coll tuned's decision)\n",
               peer_label[w->peer], w->n, cf->inplace ? "  in place" : "  out of place");
    else
        printf("#\n# %s and %s: OpenMPI MPI_Allreduce over TCP  ranks %d  float32 sum%s  (algo default: coll tuned's"
               " decision; ring: coll_tuned_allreduce_algorithm 4)\n",
               peer_label[P_MPI_TCP], peer_label[P_MPI_TCP_RING], w->n, cf->inplace ? "  in place" : "  out of place");
    printf("#%11s %12s %8s %7s %5s %6s %10s %10s %10s %8s %8s %5s\n", "size", "count", "type", "algo", "chunk",
           "iters", "time_us", "max_us", "cpu_us", "algbw", "busbw", "check");
}

static void print_row(const config *cf, const row *w) {
    double algbw = (double)w->bytes / (w->t_us * 1e-6) / 1e9, busbw = busbw_of(w);
    if (cf->csv) {
        printf("%s,%s,%s,%zu,%d,%zu,%zu,float32,%ld,%.2f,%.2f,%.2f,%.4f,%.4f,%d\n", peer_csv[w->peer],
               colls[w->coll].name, algo_of(w), w->chunk, w->n, w->bytes, w->bytes / sizeof(float), w->iters, w->t_us,
               w->tmax_us, w->cpu_us, algbw, busbw, w->ok);
    } else {
        char cb[24];
        printf(" %11zu %12zu %8s %7s %5s %6ld %10.1f %10.1f %10.1f %8.3f %8.3f %5s\n", w->bytes,
               w->bytes / sizeof(float), "float32", algo_of(w), w->peer ? "-" : fmt_bytes(w->chunk, cb, sizeof cb),
               w->iters, w->t_us, w->tmax_us, w->cpu_us, algbw, busbw, w->ok ? "ok" : "BAD");
    }
    fflush(stdout);
}

/* Runs n ranks (every chunk size at once); rows arrive from rank 0 and are printed as they come. */
static int run_kvps(const config *cf, int n) {
    int up[MAX_RANKS][2], down[MAX_RANKS][2];
    pid_t pid[MAX_RANKS];
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < n; i++) {
        if (pipe(up[i]) || pipe(down[i])) die("pipe", strerror(errno));
        pid[i] = fork();
        if (pid[i] < 0) die("fork", strerror(errno));
        if (pid[i] == 0) {
            for (int j = 0; j < i; j++) { close(up[j][0]); close(down[j][1]); }
            close(up[i][0]);
            close(down[i][1]);
            rank_main(cf, i, n, up[i][1], down[i][0]);
            _exit(0);
        }
        close(up[i][1]);
        close(down[i][0]);
    }
    static char peers[MAX_LIST][MAX_RANKS * 64];
    size_t used[MAX_LIST] = {0};
    for (int i = 0; i < n; i++)
        for (int k = 0; k < cf->nchunk; k++) {
            char *ep = read_str(up[i][0]);
            if (!ep) die("endpoint exchange", "a rank did not report its endpoint");
            used[k] += (size_t)snprintf(peers[k] + used[k], sizeof peers[k] - used[k], "%s%s", i ? "," : "", ep);
            free(ep);
        }
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < cf->nchunk; k++)
            if (write_str(down[i][1], peers[k]) != 0) die("write", strerror(errno));
        close(down[i][1]);
    }
    for (int i = 1; i < n; i++) close(up[i][0]);
    char *tr = read_str(up[0][0]); /* rank 0's kvps_ring_transport answers, after its first collective */
    snprintf(kvps_transport, sizeof kvps_transport, "%s", tr ? tr : "? (rank 0 did not report it)");
    free(tr);
    printf("%s# kvps transport, %d ranks: %s (rank 0 to every peer, kvps_ring_transport; --shm %d: KVPS_RING_SHM=%d)\n",
           cf->csv ? "" : "#\n", n, kvps_transport, cf->shm, cf->shm);
    row w, prev;
    int have_prev = 0;
    while (read_full(up[0][0], &w, sizeof w) == 0) {
        if (!have_prev || prev.coll != w.coll) print_table_head(cf, &w);
        print_row(cf, &w);
        add_row(&w);
        prev = w;
        have_prev = 1;
    }
    close(up[0][0]);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int st;
        while (waitpid(pid[i], &st, 0) < 0 && errno == EINTR) {}
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad = 1;
    }
    return bad ? -1 : 0;
}

static char mpi_prog[1024];

static int find_in_path(const char *name) {
    const char *path = getenv("PATH");
    if (!path) return 0;
    char buf[1024];
    while (*path) {
        const char *e = strchr(path, ':');
        size_t l = e ? (size_t)(e - path) : strlen(path);
        snprintf(buf, sizeof buf, "%.*s/%s", (int)l, path, name);
        if (access(buf, X_OK) == 0) return 1;
        path += l + (e ? 1 : 0);
    }
    return 0;
}

/* The mpirun line of MPI peer `peer` (P_MPI_*) at n ranks. */
static void mpi_command(const config *cf, int n, int peer, char *cmd, size_t cap) {
    char sizes[MAX_SIZES * 16] = "";
    size_t used = 0;
    for (int i = 0; i < cf->nsizes; i++)
        used += (size_t)snprintf(sizes + used, sizeof sizes - used, "%s%zu", i ? "," : "", cf->sizes[i]);
    snprintf(cmd, cap, "mpirun --allow-run-as-root --oversubscribe -np %d --bind-to none%s%s %s --csv --time %g --sizes %s%s",
             n, peer == P_MPI_SHM ? "" : " --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo",
             peer == P_MPI_TCP_RING ? " --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4" : "",
             mpi_prog, cf->target, sizes, cf->inplace ? " --inplace" : "");
}

static int run_mpi(const config *cf, int n, int peer) {
    char cmd[4096];
    mpi_command(cf, n, peer, cmd, sizeof cmd);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) { fprintf(stderr, "bench_ring: cannot run %s\n", cmd); return -1; }
    char line[512];
    int first = 1, got = 0;
    while (fgets(line, sizeof line, p)) {
        row w;
        memset(&w, 0, sizeof w);
        int pn;
        if (sscanf(line, "mpi,%d,%zu,%*d,%ld,%lf,%lf,%lf,%*f,%*f,%d", &pn, &w.bytes, &w.iters, &w.t_us, &w.tmax_us,
                   &w.cpu_us, &w.ok) != 7)
            continue;
        w.peer = peer;
        w.n = pn;
        w.coll = 0;
        w.algo = 0;
        if (first && peer != P_MPI_TCP_RING) print_table_head(cf, &w); /* the ring's rows continue MPI(tcp)'s table */
        first = 0;
        print_row(cf, &w);
        add_row(&w);
        got++;
    }
    int st = pclose(p);
    if (st != 0 || got != cf->nsizes) {
        fprintf(stderr, "bench_ring: %s run gave %d of %d sizes (status %d): %s\n", peer_label[peer], got, cf->nsizes, st,
                cmd);
        return -1;
    }
    return 0;
}

static const row *find(int peer, int n, int coll, int algo, size_t chunk, size_t bytes) {
    for (int i = 0; i < nrows; i++) {
        const row *w = &rows[i];
        if (w->peer == peer && w->n == n && w->coll == coll && w->bytes == bytes &&
            (peer != 0 || (w->algo == algo && w->chunk == chunk)))
            return w;
    }
    return NULL;
}

static const char *ratio_name[NPEERS] = {"", "auto/shm", "auto/tcp", "auto/ring"};

/* All-reduce at n ranks: kvps (every algorithm, chunk 0 of the list) against each MPI peer that
   ran (ran[P_MPI_*]). */
static void print_compare(const config *cf, int n, const int *ran) {
    if (cf->csv) return;
    int ar = -1;
    for (int k = 0; k < cf->ncoll; k++)
        if (colls[cf->coll[k]].coll == KVPS_COLL_ALLREDUCE) ar = cf->coll[k];
    if (ar < 0) return;
    char cb[24], sb[16];
    bench_machine(stdout, kvps_isa_set(KVPS_ISA_AUTO));
    printf("#\n# all-reduce busbw GB/s, %d ranks%s, kvps chunk %s, transport %s; x = kvps auto / each MPI peer"
           " (same run)\n", n, n > 2 ? " (oversubscribed: 2 CPUs)" : "", fmt_bytes(cf->chunk[0], cb, sizeof cb),
           kvps_transport);
    printf("#%7s", "size");
    for (int a = 0; a < cf->nalgo; a++) printf(" %8s", algo_names[cf->algo[a]]);
    for (int p = P_MPI_SHM; p < NPEERS; p++)
        if (ran[p]) printf(" %*s %9s", p == P_MPI_TCP_RING ? 13 : 8, peer_label[p], ratio_name[p]);
    printf("\n");
    for (int s = 0; s < cf->nsizes; s++) {
        printf(" %7s", fmt_bytes(cf->sizes[s], sb, sizeof sb));
        double kauto = 0;
        for (int a = 0; a < cf->nalgo; a++) {
            const row *w = find(0, n, ar, cf->algo[a], cf->chunk[0], cf->sizes[s]);
            double b = w ? busbw_of(w) : 0;
            if (cf->algo[a] == KVPS_ALGO_AUTO) kauto = b;
            printf(" %8.3f", b);
        }
        for (int p = P_MPI_SHM; p < NPEERS; p++) {
            if (!ran[p]) continue;
            const row *m = find(p, n, 0, 0, 0, cf->sizes[s]);
            double bm = m ? busbw_of(m) : 0;
            printf(" %*.3f", p == P_MPI_TCP_RING ? 13 : 8, bm);
            if (kauto > 0 && bm > 0) printf(" %8.2fx", kauto / bm);
            else printf(" %9s", "-");
        }
        printf("\n");
    }
    /* where ring / biring overtake recursive doubling */
    int rd = -1, rg[2] = {-1, -1};
    for (int a = 0; a < cf->nalgo; a++) {
        if (cf->algo[a] == KVPS_ALGO_RD) rd = a;
        if (cf->algo[a] == KVPS_ALGO_RING) rg[0] = a;
        if (cf->algo[a] == KVPS_ALGO_BIRING) rg[1] = a;
    }
    for (int g = 0; g < 2 && rd >= 0; g++) {
        if (rg[g] < 0 || (g == 1 && n == 2)) continue;
        size_t first = 0;
        for (int s = 0; s < cf->nsizes; s++) {
            const row *x = find(0, n, ar, KVPS_ALGO_RD, cf->chunk[0], cf->sizes[s]);
            const row *y = find(0, n, ar, cf->algo[rg[g]], cf->chunk[0], cf->sizes[s]);
            if (x && y && y->t_us < x->t_us) { if (!first) first = cf->sizes[s]; }
            else first = 0; /* the first size from which it stays ahead */
        }
        printf("# crossover %d ranks: %s faster than rd from %s up\n", n, algo_names[cf->algo[rg[g]]],
               first ? fmt_bytes(first, sb, sizeof sb) : "(never, in these sizes)");
    }
}

static void print_chunks(const config *cf, int n) {
    if (cf->csv || cf->nchunk < 2) return;
    int ar = -1;
    for (int k = 0; k < cf->ncoll; k++)
        if (colls[cf->coll[k]].coll == KVPS_COLL_ALLREDUCE) ar = cf->coll[k];
    if (ar < 0) return;
    char cb[24], sb[16];
    for (int a = 0; a < cf->nalgo; a++) {
        bench_machine(stdout, kvps_isa_set(KVPS_ISA_AUTO));
    printf("#\n# all-reduce busbw GB/s by chunk_bytes, %d ranks, algo %s\n#%7s", n, algo_names[cf->algo[a]], "size");
        for (int c = 0; c < cf->nchunk; c++) printf(" %8s", fmt_bytes(cf->chunk[c], cb, sizeof cb));
        printf("\n");
        for (int s = 0; s < cf->nsizes; s++) {
            printf(" %7s", fmt_bytes(cf->sizes[s], sb, sizeof sb));
            for (int c = 0; c < cf->nchunk; c++) {
                const row *w = find(0, n, ar, cf->algo[a], cf->chunk[c], cf->sizes[s]);
                printf(" %8.3f", w ? busbw_of(w) : 0);
            }
            printf("\n");
        }
    }
}

/* kvps auto against each MPI peer measured: the targets were set against MPI over TCP; against
   MPI(shm) the ratios are printed with no target. */
static void print_targets(const config *cf, int have_mpi) {
    int ar = -1, has_auto = 0;
    for (int k = 0; k < cf->ncoll; k++)
        if (colls[cf->coll[k]].coll == KVPS_COLL_ALLREDUCE) ar = cf->coll[k];
    for (int a = 0; a < cf->nalgo; a++) has_auto |= cf->algo[a] == KVPS_ALGO_AUTO;
    if (ar < 0 || !has_auto || !have_mpi) return;
    char sb[24];
    printf("#\n# targets (all-reduce busbw, kvps auto, chunk %s, --shm %d, 1 MB - 64 MB; information, not a test):\n",
           fmt_bytes(cf->chunk[0], sb, sizeof sb), cf->shm);
    static const struct { int peer; double min; const char *what; } tg[] = {
        {P_MPI_TCP, 1.0, "default (target)"}, {P_MPI_TCP_RING, 0.8, "ring (stretch)"}, {P_MPI_SHM, 0, "default"}};
    for (int t = 0; t < (int)(sizeof tg / sizeof tg[0]); t++) {
        for (int i = 0; i < cf->nranks; i++) {
            int n = cf->ranks[i];
            if (n != 2 && n != 4) continue;
            char buf[512] = "";
            size_t used = 0;
            int pass = 1, any = 0;
            for (int s = 0; s < cf->nsizes; s++) {
                if (cf->sizes[s] < (1u << 20) || cf->sizes[s] > (64u << 20)) continue;
                const row *k = find(0, n, ar, KVPS_ALGO_AUTO, cf->chunk[0], cf->sizes[s]);
                const row *m = find(tg[t].peer, n, 0, 0, 0, cf->sizes[s]);
                if (!k || !m) continue;
                double x = busbw_of(k) / busbw_of(m);
                pass &= x >= tg[t].min;
                any = 1;
                used += (size_t)snprintf(buf + used, sizeof buf - used, " %s %.2fx", fmt_bytes(cf->sizes[s], sb, sizeof sb), x);
            }
            if (any && tg[t].min > 0)
                printf("#   %-4s %d ranks: >= %.1fx %s %s:%s\n", pass ? "PASS" : "MISS", n, tg[t].min,
                       peer_label[tg[t].peer], tg[t].what, buf);
            else if (any)
                printf("#   %-4s %d ranks: x %s %s (no target set):%s\n", "--", n, peer_label[tg[t].peer], tg[t].what, buf);
        }
    }
}

/* CPU time of other processes while we ran: /proc/stat's busy time minus our own and our
   children's (the ranks and mpirun, once waited for). A shared machine distorts every figure. */
typedef struct cpu_mark { double busy, all, ours; } cpu_mark;

static cpu_mark cpu_now(void) {
    cpu_mark m = {0, 0, 0};
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[10] = {0};
    if (f) {
        if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                   &v[7]) == 8) {
            double hz = (double)sysconf(_SC_CLK_TCK);
            m.all = (double)(v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7]) / hz;
            m.busy = m.all - (double)(v[3] + v[4]) / hz;
        }
        fclose(f);
    }
    struct rusage a, b;
    getrusage(RUSAGE_SELF, &a);
    getrusage(RUSAGE_CHILDREN, &b);
    m.ours = (double)(a.ru_utime.tv_sec + a.ru_stime.tv_sec + b.ru_utime.tv_sec + b.ru_stime.tv_sec) +
             (double)(a.ru_utime.tv_usec + a.ru_stime.tv_usec + b.ru_utime.tv_usec + b.ru_stime.tv_usec) * 1e-6;
    return m;
}

static void cpu_report(const config *cf, const cpu_mark *t0, const char *what) {
    cpu_mark t1 = cpu_now();
    double all = t1.all - t0->all, others = (t1.busy - t0->busy) - (t1.ours - t0->ours);
    if (all <= 0) return;
    if (others < 0) others = 0;
    printf("%s# CPU (%s): this benchmark used %.0f%% of the machine, other processes %.0f%%%s\n", cf->csv ? "" : "#\n",
           what, 100 * (t1.ours - t0->ours) / all, 100 * others / all,
           others / all > 0.05 ? " (shared machine: figures are distorted)" : "");
}

/* ---- arguments ------------------------------------------------------------------------------ */

static void usage(void) {
    fprintf(stderr,
            "usage: bench_ring [--ranks 2,4,8] [--sizes 4K:64M[:4] | --sizes B,B,...] [--coll LIST]\n"
            "                  [--algo auto,ring,biring,rd,rhd,hier] [--chunk 256K,...] [--time S] [--inplace]\n"
            "                  [--io-threads N] [--io-cpus rank|none] [--groups Q] [--shm 0|1] [--tcp 0|1]\n"
            "                  [--mpi [PATH] | --no-mpi] [--mpi-btl tcp|default|both] [--quick] [--csv]\n"
            "  --ranks   rank counts (processes), each 2..%d\n"
            "  --sizes   MIN:MAX[:FACTOR] (default 4K:64M:4) or a list; K/M suffixes are 1024-based\n"
            "  --coll    allreduce,reduce_scatter,allgather,broadcast,reduce,alltoall or all (default all)\n"
            "  --algo    all-reduce algorithms (auto,ring,biring,rd,rhd,hier), default auto,ring,biring,rd\n"
            "  --groups Q  rank r in group r / Q (.groups): hier (and auto) run hierarchically; hier without it is ring\n"
            "  --chunk   kvps .chunk_bytes values (default 0: the ring's default, 1M)\n"
            "  --time S  seconds per size and algorithm, 5 blocks together (default 0.3)\n"
            "  --inplace all-reduce in place (kvps and MPI)\n"
            "  --io-threads N  ZeroMQ I/O threads per rank (kvps_ring_desc.io_threads; default 1)\n"
            "  --io-cpus  rank (default): rank r's I/O thread(s) on CPU r mod CPUs allowed (kvps_zmq_ctx_pin);\n"
            "             none: the OS places every thread\n"
            "  --shm 0|1 KVPS_RING_SHM for the kvps ranks: 1 (default) shared memory between them, 0 every peer\n"
            "            over TCP; the transport used is printed (kvps_ring_transport)\n"
            "  --tcp 0|1 KVPS_RING_TCP for the kvps ranks: 1 (default) the ring's own TCP connections where shared\n"
            "            memory does not carry the data, 0 ZeroMQ there\n"
            "  --mpi     run the OpenMPI peer (PATH: mpi_allreduce binary; default next to this program,\n"
            "            run when found); --no-mpi skips it\n"
            "  --mpi-btl tcp: MPI(tcp) (btl tcp,self on lo) and MPI(tcp,ring); default: MPI(shm), OpenMPI's\n"
            "            default transport (shared memory on one host); both (default): all three\n"
            "  --quick   2 and 4 ranks, 64K:16M, 0.15 s per size\n"
            "  --csv     CSV rows instead of tables\n",
            MAX_RANKS);
    exit(2);
}

static int parse_size(const char *s, size_t *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    double mul = 1;
    if (end == s || errno) return -1;
    if (*end == 'K' || *end == 'k') { mul = 1024; end++; }
    else if (*end == 'M' || *end == 'm') { mul = 1048576; end++; }
    else if (*end == 'G' || *end == 'g') { mul = 1073741824.0; end++; }
    if (*end || !(v >= 0) || v * mul > 4294967296.0) return -1;
    *out = (size_t)(v * mul);
    return 0;
}

/* Splits a comma list; calls f on each item; -1 on any bad item. */
static int each_item(const char *list, int (*f)(const char *, void *), void *arg) {
    char buf[1024];
    if (strlen(list) >= sizeof buf) return -1;
    strcpy(buf, list);
    char *save = NULL;
    int n = 0;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save), n++)
        if (f(t, arg) != 0) return -1;
    return n > 0 ? 0 : -1;
}

static int add_rank(const char *t, void *a) {
    config *cf = (config *)a;
    char *end = NULL;
    long v = strtol(t, &end, 10);
    if (*end || v < 2 || v > MAX_RANKS || cf->nranks == MAX_LIST) return -1;
    cf->ranks[cf->nranks++] = (int)v;
    return 0;
}
static int add_size(const char *t, void *a) {
    config *cf = (config *)a;
    size_t b;
    if (parse_size(t, &b) != 0 || b < 4 || b % 4 || cf->nsizes == MAX_SIZES) return -1;
    cf->sizes[cf->nsizes++] = b;
    return 0;
}
static int add_coll(const char *t, void *a) {
    config *cf = (config *)a;
    if (strcmp(t, "all") == 0) {
        for (int i = 0; i < NCOLLS; i++) cf->coll[i] = i;
        cf->ncoll = NCOLLS;
        return 0;
    }
    for (int i = 0; i < NCOLLS; i++)
        if (strcmp(t, colls[i].name) == 0 && cf->ncoll < NCOLLS) { cf->coll[cf->ncoll++] = i; return 0; }
    return -1;
}
static int add_algo(const char *t, void *a) {
    config *cf = (config *)a;
    for (int i = 0; i < (int)(sizeof algo_names / sizeof *algo_names); i++) /* hier: with --groups (before or after) */
        if (strcmp(t, algo_names[i]) == 0 && cf->nalgo < MAX_LIST) {
            cf->algo[cf->nalgo++] = i;
            return 0;
        }
    return -1;
}
static int add_chunk(const char *t, void *a) {
    config *cf = (config *)a;
    size_t b;
    if (parse_size(t, &b) != 0 || cf->nchunk == MAX_LIST) return -1;
    cf->chunk[cf->nchunk++] = b ? b : (size_t)1 << 20;
    return 0;
}

static int size_range(const char *s, config *cf) {
    char buf[128];
    if (strlen(s) >= sizeof buf) return -1;
    strcpy(buf, s);
    char *a = buf, *b = strchr(a, ':'), *f = NULL;
    if (!b) return each_item(s, add_size, cf);
    *b++ = 0;
    if ((f = strchr(b, ':'))) *f++ = 0;
    size_t lo, hi, fac = 4;
    if (parse_size(a, &lo) || parse_size(b, &hi) || (f && parse_size(f, &fac)) || lo < 4 || lo > hi || fac < 2) return -1;
    for (size_t x = lo; x <= hi && cf->nsizes < MAX_SIZES; x *= fac) {
        if (x % 4) return -1;
        cf->sizes[cf->nsizes++] = x;
    }
    return 0;
}

int main(int argc, char **argv) {
    config cf;
    memset(&cf, 0, sizeof cf);
    cf.target = 0.3;
    cf.shm = 1;
    cf.tcp = 1;
    cf.mpi_shm = cf.mpi_tcp = 1;
    int quick = 0, want_mpi = -1; /* -1: when found */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0) quick = 1;
        else if (strcmp(a, "--csv") == 0) cf.csv = 1;
        else if (strcmp(a, "--inplace") == 0) cf.inplace = 1;
        else if (strcmp(a, "--no-mpi") == 0) want_mpi = 0;
        else if (strcmp(a, "--mpi") == 0) {
            want_mpi = 1;
            if (v && v[0] != '-') { snprintf(mpi_prog, sizeof mpi_prog, "%s", v); i++; }
        } else if (!v) usage();
        else if (strcmp(a, "--ranks") == 0) { cf.nranks = 0; if (each_item(v, add_rank, &cf)) usage(); i++; }
        else if (strcmp(a, "--sizes") == 0) { cf.nsizes = 0; if (size_range(v, &cf)) usage(); i++; }
        else if (strcmp(a, "--coll") == 0) { cf.ncoll = 0; if (each_item(v, add_coll, &cf)) usage(); i++; }
        else if (strcmp(a, "--algo") == 0) { cf.nalgo = 0; if (each_item(v, add_algo, &cf)) usage(); i++; }
        else if (strcmp(a, "--chunk") == 0) { cf.nchunk = 0; if (each_item(v, add_chunk, &cf)) usage(); i++; }
        else if (strcmp(a, "--io-threads") == 0) {
            char *end = NULL;
            long t = strtol(v, &end, 10);
            if (*end || t < 1 || t > 16) usage();
            cf.io_threads = (int)t;
            i++;
        } else if (strcmp(a, "--io-cpus") == 0) {
            if (strcmp(v, "rank") && strcmp(v, "none")) usage();
            cf.io_cpus_none = strcmp(v, "none") == 0;
            i++;
        } else if (strcmp(a, "--groups") == 0) {
            char *end = NULL;
            long q = strtol(v, &end, 10);
            if (*end || q < 1 || q > MAX_RANKS) usage();
            cf.groups = (int)q;
            i++;
        } else if (strcmp(a, "--shm") == 0) {
            if (strcmp(v, "0") && strcmp(v, "1")) usage();
            cf.shm = v[0] == '1';
            i++;
        } else if (strcmp(a, "--tcp") == 0) {
            if (strcmp(v, "0") && strcmp(v, "1")) usage();
            cf.tcp = v[0] == '1';
            i++;
        } else if (strcmp(a, "--mpi-btl") == 0) {
            if (strcmp(v, "tcp") && strcmp(v, "default") && strcmp(v, "both")) usage();
            cf.mpi_tcp = strcmp(v, "default") != 0;
            cf.mpi_shm = strcmp(v, "tcp") != 0;
            i++;
        } else if (strcmp(a, "--time") == 0) {
            char *end = NULL;
            cf.target = strtod(v, &end);
            if (*end || !(cf.target > 0 && cf.target <= 60)) usage();
            i++;
        } else usage();
    }
    if (!cf.nranks) {
        if (quick) { cf.ranks[0] = 2; cf.ranks[1] = 4; cf.nranks = 2; }
        else { cf.ranks[0] = 2; cf.ranks[1] = 4; cf.ranks[2] = 8; cf.nranks = 3; }
    }
    if (!cf.nsizes) size_range(quick ? "64K:16M:4" : "4K:64M:4", &cf);
    if (!cf.ncoll) add_coll("all", &cf);
    if (!cf.nalgo) each_item("auto,ring,biring,rd", add_algo, &cf);
    if (!cf.nchunk) { cf.chunk[0] = (size_t)1 << 20; /* kvps_ring's default */ cf.nchunk = 1; }
    if (quick && cf.target == 0.3) cf.target = 0.15;

    int have_mpi = 0;
    if (want_mpi != 0) {
        if (!mpi_prog[0]) { /* next to this program */
            const char *slash = strrchr(argv[0], '/');
            snprintf(mpi_prog, sizeof mpi_prog, "%.*smpi_allreduce", slash ? (int)(slash - argv[0] + 1) : 0, argv[0]);
            if (!slash) snprintf(mpi_prog, sizeof mpi_prog, "./mpi_allreduce");
        }
        have_mpi = find_in_path("mpirun") && access(mpi_prog, X_OK) == 0;
        if (want_mpi == 1 && !have_mpi) die("--mpi", "needs mpirun on PATH and an executable mpi_allreduce "
                                                     "(mpicc -O2 bench/mpi_allreduce.c -o build/mpi_allreduce)");
    }
    signal(SIGPIPE, SIG_IGN);

    int major, minor, patch;
    zmq_version(&major, &minor, &patch);
    if (cf.csv) {
        printf("peer,coll,algo,chunk,ranks,bytes,count,type,iters,time_us,time_max_us,cpu_us,algbw,busbw,ok\n");
    } else {
        char cmd[4096];
        printf("# bench_ring: kvps_ring collectives, nccl-tests style, next to OpenMPI (%s) in the same run\n",
               cf.mpi_shm && cf.mpi_tcp ? "its default transport, shared memory, and TCP"
               : cf.mpi_shm             ? "its default transport, shared memory"
                                        : "over TCP");
        printf("# ranks are processes on one host, connected on tcp://127.0.0.1; --shm %d --tcp %d: %s\n", cf.shm, cf.tcp,
               cf.shm ? "data between them through shared memory where kvps_ring accepts it"
               : cf.tcp ? "every peer over the ring's own TCP connections" : "every peer over ZeroMQ");
        printf("# libzmq %d.%d.%d, %d I/O thread(s) per rank, %s; %ld CPUs%s\n", major, minor, patch,
               cf.io_threads ? cf.io_threads : 1,
               cf.io_cpus_none ? "placed by the OS (--io-cpus none)" : "pinned to CPU rank mod CPUs allowed (--io-cpus rank)",
               sysconf(_SC_NPROCESSORS_ONLN),
               sysconf(_SC_NPROCESSORS_ONLN) < 8 ? " (more ranks than CPUs are oversubscribed, for kvps and MPI alike)" : "");
        printf("# time = per-call time averaged over ranks (max_us: the slowest rank), median of %d blocks,\n", NREP);
        printf("#   each about %.2f s / %d after a barrier; sizes as nccl-tests (whole buffer); GB/s = 1e9 B/s\n",
               cf.target, NREP);
        printf("# busbw = algbw x 2(n-1)/n (allreduce), x (n-1)/n (reduce_scatter, allgather, alltoall), x 1 (broadcast, reduce)\n");
        printf("# cpu_us = CPU time per call summed over ranks, every thread (ZeroMQ's, MPI's), user + system\n");
        printf("# check: the first call's result compared element by element on every rank\n");
        if (have_mpi) {
            for (int p = P_MPI_SHM; p < NPEERS; p++) {
                if (!(p == P_MPI_SHM ? cf.mpi_shm : cf.mpi_tcp)) continue;
                mpi_command(&cf, 2, p, cmd, sizeof cmd);
                printf("# %s peer (2 ranks; N ranks: -np N): %s\n", peer_label[p], cmd);
            }
            if (cf.mpi_shm) printf("# MPI(shm): no --mca pml/btl, OpenMPI's own choice: shared memory between ranks on one host\n");
        } else {
            printf("# MPI peer: not run (%s)\n", want_mpi == 0 ? "--no-mpi" : "mpirun or mpi_allreduce not found");
        }
    }
    fflush(stdout);

    double t_start = now_s();
    int fail = 0;
    cpu_mark cpu_start = cpu_now();
    for (int i = 0; i < cf.nranks; i++) {
        int n = cf.ranks[i];
        cpu_mark cpu_part = cpu_now();
        char what[32];
        snprintf(what, sizeof what, "%d ranks", n);
        if (run_kvps(&cf, n) != 0) { fprintf(stderr, "bench_ring: a rank failed (%d ranks)\n", n); fail = 1; }
        int ran[NPEERS] = {0}; /* the MPI peers measured in full at n ranks */
        if (have_mpi) {
            int ar = 0;
            for (int k = 0; k < cf.ncoll; k++) ar |= colls[cf.coll[k]].coll == KVPS_COLL_ALLREDUCE;
            for (int p = P_MPI_SHM; ar && p < NPEERS; p++)
                if (p == P_MPI_SHM ? cf.mpi_shm : cf.mpi_tcp) ran[p] = run_mpi(&cf, n, p) == 0;
        }
        print_compare(&cf, n, ran);
        print_chunks(&cf, n);
        cpu_report(&cf, &cpu_part, what);
    }
    print_targets(&cf, have_mpi);
    cpu_report(&cf, &cpu_start, "whole run");
    for (int i = 0; i < nrows; i++) fail |= !rows[i].ok;
    printf("#\n# whole run %.0f s%s\n", now_s() - t_start, fail ? "; SOME CHECKS OR RANKS FAILED" : "");
    return fail ? 1 : 0;
}
