/* bench_fusion - a model of many small tensors (ResNet-50's 161 parameter tensors, 25.6 M floats,
   sizes from the published architecture: bench/resnet50.h) synchronised among N processes on
   loopback TCP, unfused and fused, through the ring and through the servers, next to OpenMPI in
   the same run.

   usage: bench_fusion [--ranks N] [--servers S] [--iters I] [--repeat R] [--compute-ms F]
                       [--credit BYTES] [--threshold BYTES] [--fusion-bytes BYTES]
                       [--bucket BYTES] [--mpi PATH | --no-mpi] [--no-ps] [--no-ring] [--only MEASURE]
                       [--sndbuf BYTES]
   (--threshold: kvps_fuse's bucket (the training step's, and allreduce_many's where it uses buckets), default 4 MiB; --fusion-bytes: the worker's fusion_bytes,
   default 256 KiB; --bucket: the training step's gradient bucket, default 4 MiB; --credit: the
   priority step's credit_bytes, default 4 MiB; --only: run that ring measure alone, e.g. under
   perf: bench/perf_fusion.sh; --sndbuf: the ring's .sndbuf_bytes, default 0: 256 KiB on
   loopback, -1 the OS's autotuning)

   Ring (N ranks, float32 sums), seconds per step (all 161 tensors), the slowest rank's:
     one_by_one     161 kvps_ring_allreduce calls
     fused          kvps_ring_allreduce_many (kvps_fuse.h: one all-reduce over the list of buffers)
     concatenated   one kvps_ring_allreduce of all 25.6 M floats (what fusion can at best reach)
     mpi one_by_one / mpi concatenated: the same with MPI_Allreduce (bench/mpi_fusion.c through
                    mpirun, pml ob1, btl tcp,self on lo, as bench_ring runs OpenMPI)
   Servers (S servers, N workers, BSP, the servers average), seconds per step:
     one_by_one     161 kvps_worker_pushpull_tensor requests, all in flight, then every wait
     fused          one kvps_worker_pushpull_tensors
   And a training step with simulated compute (sleeps: the GPU's time, which costs no CPU here):
   backward F x 2 ms, last tensor first, each tensor's share by its size, then forward F ms,
   first tensor first, each waiting for its tensor's new values:
     step_one_by_one       each tensor's pushpull posted when its gradient is ready
     step_fused            gradients gathered into 4 MiB buckets, a bucket's pushpull_tensors
                           posted when it is full (as PyTorch DDP and Horovod do)
     step_fused_priority   the same, with tensor priorities 161 - index (early layers first) and
                           credit_bytes (default 4 MiB) in flight per server: a late bucket with
                           the first layers overtakes what waits (BytePS's scheduling)
     ring_step_overlap     the ring's: kvps_fuse_add per gradient during backward, flush, forward
   Every figure is the median over I iterations (after one warm-up) of the slowest rank's time;
   --repeat R runs kvps and MPI R times, alternating, and prints each run's figures and the
   ranges, with ratios against OpenMPI from the same repeat. For the ring it also prints the CPU
   time of a step (user + system, every thread of every rank, summed over the ranks: the mean over
   the I iterations), which is what the ranks compete for on a machine with fewer CPUs than ranks;
   OpenMPI's is not comparable (its ranks poll while they wait) and not printed. The machine has 2 vCPUs: N ranks
   and S servers share them (MPI's ranks poll while they wait, kvps's sleep in zmq_poll). */
#define KVPS_IMPLEMENTATION
#define BENCH_NAME "bench_fusion"
#include "kvps.h" /* the parameter-server peer of the fused steps */
#include "kvps_fuse.h"
#include "bench/resnet50.h"
#include "bench/bench_cpu.h"
#include "bench/bench_pipe.h"
#include "examples/clock.h"
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>

enum { MAXR = 16, NT = RESNET50_TENSORS };
enum { R_ONE, R_FUSED, R_CAT, R_STEP, R_NM };                   /* ring measures */
enum { P_ONE, P_FUSED, P_STEP_ONE, P_STEP_FUSED, P_STEP_PRIO, P_NM }; /* server measures */
static const char *ring_names[R_NM] = {"one_by_one", "fused", "concatenated", "ring_step_overlap"};
static const char *ps_names[P_NM] = {"one_by_one", "fused", "step_one_by_one", "step_fused", "step_fused_priority"};

typedef struct cfg {
    int ranks, servers, iters, repeat, ring, ps, only; /* only: -1, or the one ring measure to run */
    int sndbuf;                                        /* the ring's .sndbuf_bytes (0: its default) */
    double compute_ms;
    size_t credit, threshold, fusion, bucket;
    char mpi[1024];
} cfg;

static size_t cnt[NT], total;

static double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* Forks n children running fn(i, up write end, down read end); returns their pids in pid. */
typedef void (*child_fn)(const cfg *c, int i, int up, int down, const void *arg);
static void spawn(const cfg *c, int n, child_fn fn, const void *arg, pid_t *pid, int *up, int *down) {
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < n; i++) {
        int u[2], d[2];
        if (pipe(u) || pipe(d)) die("pipe", strerror(errno));
        pid[i] = fork();
        if (pid[i] < 0) die("fork", strerror(errno));
        if (pid[i] == 0) {
            close(u[0]);
            close(d[1]);
            fn(c, i, u[1], d[0], arg);
            _exit(0);
        }
        close(u[1]);
        close(d[0]);
        up[i] = u[0];
        down[i] = d[1];
    }
}

/* The endpoints n children report, one each, joined by commas into list[cap]. */
static void gather_endpoints(const int *up, int n, char *list, size_t cap, const char *who) {
    list[0] = 0;
    for (int i = 0; i < n; i++) {
        char *ep = read_str(up[i]);
        if (!ep) die(who, "a child did not report its endpoint");
        snprintf(list + strlen(list), cap - strlen(list), "%s%s", i ? "," : "", ep);
        free(ep);
    }
}

static int reap(int n, pid_t *pid) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int st;
        while (waitpid(pid[i], &st, 0) < 0 && errno == EINTR) {}
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad = 1;
    }
    return bad;
}

static float **alloc_model(void) {
    float **b = (float **)malloc(NT * sizeof *b);
    for (int t = 0; t < NT; t++) {
        b[t] = (float *)malloc(cnt[t] * sizeof(float));
        for (size_t i = 0; i < cnt[t]; i++) b[t][i] = 1.0f;
    }
    return b;
}

/* ---- the ring ---------------------------------------------------------------------------------- */
static void ring_rank(const cfg *c, int rank, int up, int down, const void *arg) {
    (void)arg;
    kvps_ring *r = NULL;
    if (kvps_ring_create(&(kvps_ring_desc){.rank = rank, .size = c->ranks, .bind = "tcp://127.0.0.1:*", .timeout_ms = 120000,
                                           .sndbuf_bytes = c->sndbuf},
                         &r) != KVPS_OK)
        die("ring", "create");
    if (write_str(up, kvps_ring_endpoint(r)) != 0) die("pipe", "write");
    char *peers = read_str(down);
    if (!peers || kvps_ring_connect(r, peers) != KVPS_OK) die("ring", "connect");
    free(peers);
    float **b = alloc_model(), *cat = (float *)malloc(total * sizeof(float));
    for (size_t i = 0; i < total; i++) cat[i] = 1.0f;
    double res[2 * R_NM]; /* seconds per step, then CPU seconds per step */
    int ok = 1;
    kvps_fuse *f = NULL;
    if (kvps_fuse_create(r, &(kvps_fuse_desc){.dtype = KVPS_FLOAT32, .op = KVPS_SUM, .threshold_bytes = c->threshold}, &f) !=
        KVPS_OK)
        die("fuse", "create");
    for (int m = 0; m < R_NM; m++) {
        double t[64], c0 = 0;
        res[m] = res[R_NM + m] = 0;
        if (c->only >= 0 && m != c->only) continue;
        for (int it = 0; it <= c->iters && ok; it++) {
            for (int t2 = 0; t2 < NT; t2++) b[t2][0] = 1.0f; /* (values grow by N a step: keep the first checkable) */
            kvps_ring_barrier(r);
            if (it == 1) c0 = cpu_s();
            double t0 = now_s();
            kvps_result rc = KVPS_OK;
            if (m == R_ONE)
                for (int k = 0; k < NT && rc == KVPS_OK; k++) rc = kvps_ring_allreduce(r, b[k], b[k], cnt[k], KVPS_FLOAT32, KVPS_SUM);
            else if (m == R_FUSED)
                rc = kvps_ring_allreduce_many(r, (void *const *)b, cnt, NT, KVPS_FLOAT32, KVPS_SUM, c->threshold);
            else if (m == R_CAT)
                rc = kvps_ring_allreduce(r, cat, cat, total, KVPS_FLOAT32, KVPS_SUM);
            else { /* backward (2F), handing each gradient over; forward (F) after the flush */
                for (int k = NT - 1; k >= 0 && rc == KVPS_OK; k--) {
                    sleep_s(2e-3 * c->compute_ms * (double)cnt[k] / (double)total);
                    rc = kvps_fuse_add(f, b[k], cnt[k]);
                }
                if (rc == KVPS_OK) rc = kvps_fuse_flush(f);
                sleep_s(1e-3 * c->compute_ms);
            }
            if (rc != KVPS_OK) { fprintf(stderr, "ring rank %d: %s: %s\n", rank, ring_names[m], kvps_ring_last_error(r)); ok = 0; }
            if (m != R_CAT && b[0][0] != (float)c->ranks) ok = 0;
            if (it) t[it - 1] = now_s() - t0;
        }
        res[m] = ok ? median(t, c->iters) : -1;
        res[R_NM + m] = (cpu_s() - c0) / c->iters; /* (a barrier per iteration included) */
    }
    kvps_fuse_destroy(&f);
    if (write(up, res, sizeof res) != (ssize_t)sizeof res) die("pipe", "write");
    kvps_ring_destroy(&r);
}

static int run_ring(const cfg *c, double *out, double *cpu) {
    pid_t pid[MAXR];
    int up[MAXR], down[MAXR];
    spawn(c, c->ranks, ring_rank, NULL, pid, up, down);
    char peers[MAXR * 64];
    gather_endpoints(up, c->ranks, peers, sizeof peers, "ring");
    for (int i = 0; i < c->ranks; i++) { write_str(down[i], peers); close(down[i]); }
    for (int m = 0; m < R_NM; m++) out[m] = cpu[m] = 0;
    for (int i = 0; i < c->ranks; i++) {
        double res[2 * R_NM];
        if (read_full(up[i], res, sizeof res) != 0) die("ring", "a rank died");
        for (int m = 0; m < R_NM; m++) out[m] = res[m] < 0 || out[m] < 0 ? -1 : (res[m] > out[m] ? res[m] : out[m]);
        for (int m = 0; m < R_NM; m++) cpu[m] += res[R_NM + m];
        close(up[i]);
    }
    return reap(c->ranks, pid);
}

static int run_mpi(const cfg *c, double *one, double *cat) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "mpirun --allow-run-as-root --oversubscribe -np %d --bind-to none --mca pml ob1 --mca btl tcp,self "
             "--mca btl_tcp_if_include lo %s --iters %d 2>/dev/null", c->ranks, c->mpi, c->iters);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[256];
    int got = 0;
    while (fgets(line, sizeof line, p)) {
        double v;
        char ok[8];
        if (sscanf(line, "mpi,one_by_one,%lf,%7s", &v, ok) == 2 && strcmp(ok, "ok") == 0) { *one = v; got++; }
        if (sscanf(line, "mpi,concatenated,%lf,%7s", &v, ok) == 2 && strcmp(ok, "ok") == 0) { *cat = v; got++; }
    }
    int st = pclose(p);
    return st == 0 && got == 2 ? 0 : -1;
}

/* ---- the servers ------------------------------------------------------------------------------- */
static void server_proc(const cfg *c, int rank, int up, int down, const void *arg) {
    (void)arg;
    (void)down;
    kvps_server *s = NULL;
    if (kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .rank = rank, .num_workers = c->ranks},
                           &s) != KVPS_OK)
        die("server", "create");
    if (write_str(up, kvps_server_endpoint(s)) != 0) die("pipe", "write");
    close(up);
    kvps_server_run(s);
    kvps_server_destroy(&s);
}

/* Waits for the requests of tensors from..to (reqs[k] for tensor k; shared handles once). */
static kvps_result wait_tensors(kvps_worker *w, kvps_req *req, int from, int to) {
    kvps_result rc = KVPS_OK;
    for (int k = from; k <= to && rc == KVPS_OK; k++)
        if (req[k]) {
            kvps_req h = req[k];
            rc = kvps_worker_wait(w, h, 120000);
            for (int j = k; j < NT; j++)
                if (req[j] == h) req[j] = 0;
        }
    return rc;
}

static void worker_proc(const cfg *c, int rank, int up, int down, const void *arg) {
    (void)arg;
    char *list = read_str(down);
    if (!list) die("worker", "no server list");
    double res[P_NM];
    for (int m = 0; m < P_NM; m++) res[m] = -1;
    kvps_worker *w = NULL;
    if (kvps_worker_create(&(kvps_worker_desc){.servers = list, .rank = rank, .num_workers = c->ranks, .timeout_ms = 120000,
                                               .fusion_bytes = c->fusion}, &w) != KVPS_OK)
        die("worker", "create");
    kvps_tensor t[NT];
    for (int k = 0; k < NT; k++) {
        char name[32];
        snprintf(name, sizeof name, "resnet50.%d", k);
        if (kvps_worker_tensor(w, name, cnt[k], &t[k]) != KVPS_OK) die("worker", kvps_worker_last_error(w));
    }
    float **g = alloc_model(), **v = alloc_model();
    int ok = 1;
    for (int m = 0; m < P_NM && ok; m++) {
        for (int k = 0; k < NT; k++) kvps_worker_tensor_priority(w, t[k], m == P_STEP_PRIO ? NT - k : 0);
        /* credit for the priority step only, the others as a worker made without it: the field is
           read per request, and nothing is in flight between measures */
        w->desc.credit_bytes = m == P_STEP_PRIO ? c->credit : 0;
        double tm[64];
        for (int it = 0; it <= c->iters && ok; it++) {
            kvps_req b;
            if (kvps_worker_barrier(w, &b) != KVPS_OK || kvps_worker_wait(w, b, 120000) != KVPS_OK) { ok = 0; break; }
            double t0 = now_s();
            kvps_result rc = KVPS_OK;
            kvps_req req[NT];
            memset(req, 0, sizeof req);
            if (m == P_ONE) {
                for (int k = 0; k < NT && rc == KVPS_OK; k++) rc = kvps_worker_pushpull_tensor(w, t[k], g[k], v[k], &req[k]);
                if (rc == KVPS_OK) rc = wait_tensors(w, req, 0, NT - 1);
            } else if (m == P_FUSED) {
                rc = kvps_worker_pushpull_tensors(w, t, NT, (const float *const *)g, v, &req[0]);
                if (rc == KVPS_OK) rc = kvps_worker_wait(w, req[0], 120000);
            } else { /* a step: backward, posting as gradients are ready; forward, waiting per tensor */
                size_t bucket = 0;
                int top = NT - 1; /* the bucket holds tensors k+1..top */
                for (int k = NT - 1; k >= 0 && rc == KVPS_OK; k--) {
                    sleep_s(2e-3 * c->compute_ms * (double)cnt[k] / (double)total);
                    if (m == P_STEP_ONE) {
                        rc = kvps_worker_pushpull_tensor(w, t[k], g[k], v[k], &req[k]);
                        continue;
                    }
                    bucket += cnt[k] * sizeof(float);
                    if (bucket >= c->bucket || k == 0) {
                        kvps_req h;
                        rc = kvps_worker_pushpull_tensors(w, t + k, (size_t)(top - k + 1), (const float *const *)g + k, v + k, &h);
                        for (int j = k; j <= top; j++) req[j] = h;
                        bucket = 0;
                        top = k - 1;
                    }
                }
                for (int k = 0; k < NT && rc == KVPS_OK; k++) {
                    rc = wait_tensors(w, req, k, k);
                    sleep_s(1e-3 * c->compute_ms * (double)cnt[k] / (double)total);
                }
            }
            if (rc != KVPS_OK) { fprintf(stderr, "worker %d: %s: %s\n", rank, ps_names[m], kvps_worker_last_error(w)); ok = 0; }
            if (ok && v[0][0] != 1.0f) ok = 0; /* the mean of ones */
            if (it) tm[it - 1] = now_s() - t0;
        }
        if (ok) res[m] = median(tm, c->iters);
    }
    if (write(up, res, sizeof res) != (ssize_t)sizeof res) die("pipe", "write");
    kvps_worker_finish(w, 10000);
    kvps_worker_destroy(&w);
    free(list);
}

static int run_ps(const cfg *c, double *out) {
    pid_t spid[MAXR], wpid[MAXR];
    int sup[MAXR], sdown[MAXR], wup[MAXR], wdown[MAXR];
    spawn(c, c->servers, server_proc, NULL, spid, sup, sdown);
    char list[MAXR * 64];
    gather_endpoints(sup, c->servers, list, sizeof list, "server");
    for (int i = 0; i < c->servers; i++) {
        close(sup[i]);
        close(sdown[i]);
    }
    spawn(c, c->ranks, worker_proc, NULL, wpid, wup, wdown);
    for (int i = 0; i < c->ranks; i++) { write_str(wdown[i], list); close(wdown[i]); }
    for (int m = 0; m < P_NM; m++) out[m] = 0;
    for (int i = 0; i < c->ranks; i++) {
        double res[P_NM];
        if (read_full(wup[i], res, sizeof res) != 0) die("ps", "a worker died");
        for (int m = 0; m < P_NM; m++) out[m] = res[m] < 0 || out[m] < 0 ? -1 : (res[m] > out[m] ? res[m] : out[m]);
        close(wup[i]);
    }
    int bad = reap(c->ranks, wpid);
    return reap(c->servers, spid) | bad;
}

/* ---- main -------------------------------------------------------------------------------------- */
static void range(const double *v, int n, double *lo, double *hi) {
    *lo = 1e300;
    *hi = -1e300;
    for (int i = 0; i < n; i++) {
        if (v[i] < *lo) *lo = v[i];
        if (v[i] > *hi) *hi = v[i];
    }
}

int main(int argc, char **argv) {
    cfg c = {4, 2, 5, 3, 1, 1, -1, 0, 100.0, (size_t)4 << 20, 0, 0, (size_t)4 << 20, ""};
    int use_mpi = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--ranks") && v) c.ranks = atoi(argv[++i]);
        else if (!strcmp(a, "--servers") && v) c.servers = atoi(argv[++i]);
        else if (!strcmp(a, "--iters") && v) c.iters = atoi(argv[++i]);
        else if (!strcmp(a, "--repeat") && v) c.repeat = atoi(argv[++i]);
        else if (!strcmp(a, "--compute-ms") && v) c.compute_ms = atof(argv[++i]);
        else if (!strcmp(a, "--credit") && v) c.credit = (size_t)atoll(argv[++i]);
        else if (!strcmp(a, "--threshold") && v) c.threshold = (size_t)atoll(argv[++i]);
        else if (!strcmp(a, "--fusion-bytes") && v) c.fusion = (size_t)atoll(argv[++i]);
        else if (!strcmp(a, "--bucket") && v) c.bucket = (size_t)atoll(argv[++i]);
        else if (!strcmp(a, "--mpi") && v) snprintf(c.mpi, sizeof c.mpi, "%s", argv[++i]);
        else if (!strcmp(a, "--no-mpi")) use_mpi = 0;
        else if (!strcmp(a, "--no-ps")) c.ps = 0;
        else if (!strcmp(a, "--no-ring")) c.ring = 0;
        else if (!strcmp(a, "--sndbuf") && v) c.sndbuf = atoi(argv[++i]);
        else if (!strcmp(a, "--only") && v) {
            const char *w = argv[++i];
            for (int m = 0; m < R_NM; m++)
                if (!strcmp(w, ring_names[m])) c.only = m;
            if (c.only < 0) { fprintf(stderr, "bench_fusion: --only one_by_one|fused|concatenated|ring_step_overlap\n"); return 2; }
        }
        else {
            fprintf(stderr, "usage: bench_fusion [--ranks N] [--servers S] [--iters I] [--repeat R] [--compute-ms F] "
                            "[--credit BYTES] [--threshold BYTES] [--fusion-bytes BYTES] [--bucket BYTES] [--mpi PATH | --no-mpi] "
                            "[--no-ps] [--no-ring] [--only MEASURE] [--sndbuf BYTES]\n");
            return 2;
        }
    }
    if (c.ranks < 1 || c.ranks > MAXR || c.servers < 1 || c.servers > MAXR || c.iters < 1 || c.iters > 64 || c.repeat < 1 ||
        c.repeat > 32) {
        fprintf(stderr, "bench_fusion: ranks and servers 1..16, iters 1..64, repeat 1..32\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    kvps_log_set_level(KVPS_LOG_ERROR);
    total = 0;
    resnet50_sizes(cnt);
    for (int t = 0; t < NT; t++) total += cnt[t];
    if (!c.mpi[0]) { /* next to this program */
        snprintf(c.mpi, sizeof c.mpi, "%s", argv[0]);
        char *slash = strrchr(c.mpi, '/');
        snprintf(slash ? slash + 1 : c.mpi, sizeof c.mpi - (size_t)(slash ? slash + 1 - c.mpi : 0), "mpi_fusion");
    }
    if (use_mpi && (access(c.mpi, X_OK) != 0 || system("command -v mpirun >/dev/null 2>&1") != 0)) {
        printf("# OpenMPI peer not run: %s or mpirun missing (make builds it where mpicc is)\n", c.mpi);
        use_mpi = 0;
    }
    bench_machine(stdout, kvps_isa_set(KVPS_ISA_AUTO));
    printf("# bench_fusion: ResNet-50, %d tensors, %zu floats (%.1f MB); %d ranks, %d servers; %d iterations (median), %d "
           "repeats; compute %.0f ms forward + %.0f ms backward (sleeps); credit %zu bytes\n",
           NT, total, (double)total * 4 / 1e6, c.ranks, c.servers, c.iters, c.repeat, c.compute_ms, 2 * c.compute_ms, c.credit);
    double ring[32][R_NM], rcpu[32][R_NM], mpi1[32], mpic[32], ps[32][P_NM];
    int fails = 0;
    for (int r = 0; r < c.repeat; r++) {
        if (c.ring) {
            if (run_ring(&c, ring[r], rcpu[r]) != 0) { fails++; fprintf(stderr, "bench_fusion: ring run %d failed\n", r); }
            printf("repeat %d ring ms:", r);
            for (int m = 0; m < R_NM; m++)
                if (c.only < 0 || m == c.only) printf(" %s %.1f", ring_names[m], ring[r][m] * 1e3);
            printf(" | cpu ms:");
            for (int m = 0; m < R_NM; m++)
                if (c.only < 0 || m == c.only) printf(" %s %.1f", ring_names[m], rcpu[r][m] * 1e3);
            if (use_mpi && c.only < 0) {
                if (run_mpi(&c, &mpi1[r], &mpic[r]) != 0) { fails++; mpi1[r] = mpic[r] = -1; fprintf(stderr, "bench_fusion: MPI failed\n"); }
                printf(" | mpi one_by_one %.1f concatenated %.1f | fused/mpi_one_by_one %.2f, mpi_concatenated/fused %.2f",
                       mpi1[r] * 1e3, mpic[r] * 1e3, ring[r][R_FUSED] / mpi1[r], mpic[r] / ring[r][R_FUSED]);
            }
            printf("\n");
        }
        if (c.ps) {
            if (run_ps(&c, ps[r]) != 0) { fails++; fprintf(stderr, "bench_fusion: server run %d failed\n", r); }
            printf("repeat %d servers ms:", r);
            for (int m = 0; m < P_NM; m++) printf(" %s %.1f", ps_names[m], ps[r][m] * 1e3);
            printf("\n");
        }
        fflush(stdout);
    }
    printf("# ranges over %d repeats (ms per step; x = ratio in the same repeat)\n", c.repeat);
    double v[32], lo, hi;
    for (int m = 0; c.ring && m < R_NM; m++) {
        if (c.only >= 0 && m != c.only) continue;
        for (int r = 0; r < c.repeat; r++) v[r] = ring[r][m] * 1e3;
        range(v, c.repeat, &lo, &hi);
        printf("ring    %-20s %8.1f - %8.1f\n", ring_names[m], lo, hi);
    }
    for (int m = 0; c.ring && m < R_NM; m++) {
        if (c.only >= 0 && m != c.only) continue;
        for (int r = 0; r < c.repeat; r++) v[r] = rcpu[r][m] * 1e3;
        range(v, c.repeat, &lo, &hi);
        printf("cpu     %-20s %8.1f - %8.1f   (ms of CPU a step, all ranks)\n", ring_names[m], lo, hi);
    }
    if (c.ring && use_mpi && c.only < 0) {
        for (int r = 0; r < c.repeat; r++) v[r] = mpi1[r] * 1e3;
        range(v, c.repeat, &lo, &hi);
        printf("mpi     %-20s %8.1f - %8.1f\n", "one_by_one", lo, hi);
        for (int r = 0; r < c.repeat; r++) v[r] = mpic[r] * 1e3;
        range(v, c.repeat, &lo, &hi);
        printf("mpi     %-20s %8.1f - %8.1f\n", "concatenated", lo, hi);
        for (int r = 0; r < c.repeat; r++) v[r] = mpi1[r] / ring[r][R_FUSED];
        range(v, c.repeat, &lo, &hi);
        printf("x  mpi one_by_one / kvps fused    %.2f - %.2f   (target >= 1)\n", lo, hi);
        for (int r = 0; r < c.repeat; r++) v[r] = mpic[r] / ring[r][R_FUSED];
        range(v, c.repeat, &lo, &hi);
        printf("x  mpi concatenated / kvps fused  %.2f - %.2f   (target >= 0.9)\n", lo, hi);
        for (int r = 0; r < c.repeat; r++) v[r] = ring[r][R_ONE] / ring[r][R_FUSED];
        range(v, c.repeat, &lo, &hi);
        printf("x  kvps one_by_one / kvps fused   %.2f - %.2f\n", lo, hi);
    }
    for (int m = 0; c.ps && m < P_NM; m++) {
        for (int r = 0; r < c.repeat; r++) v[r] = ps[r][m] * 1e3;
        range(v, c.repeat, &lo, &hi);
        printf("servers %-20s %8.1f - %8.1f\n", ps_names[m], lo, hi);
    }
    if (c.ps) {
        for (int r = 0; r < c.repeat; r++) v[r] = ps[r][P_ONE] / ps[r][P_FUSED];
        range(v, c.repeat, &lo, &hi);
        printf("x  servers one_by_one / fused     %.2f - %.2f\n", lo, hi);
        for (int r = 0; r < c.repeat; r++) v[r] = ps[r][P_STEP_FUSED] / ps[r][P_STEP_PRIO];
        range(v, c.repeat, &lo, &hi);
        printf("x  step fused / fused+priority    %.2f - %.2f\n", lo, hi);
        for (int r = 0; r < c.repeat; r++) v[r] = ps[r][P_STEP_ONE] / ps[r][P_STEP_FUSED];
        range(v, c.repeat, &lo, &hi);
        printf("x  step one_by_one / fused        %.2f - %.2f\n", lo, hi);
    }
    if (fails) printf("# %d runs failed (see stderr): their figures are -1 or missing\n", fails);
    return fails ? 1 : 0;
}
