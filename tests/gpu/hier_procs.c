/* hier_procs - the hierarchical step across processes: two processes ("machines" 0 and 1) share
   device 0, each with its own NCCL communicator (size 1) and, between them, the kvps servers (a
   third process, KVPS_UPDATE_ACCUMULATE) or a kvps_ring over ipc://; every step of both against the
   CPU's sum. Then a peer is SIGKILLed, twice per transport: before its step, while the survivor
   waits in the same step for its pieces (that step must fail), and inside its own step, pieces
   on their way (that step or the next must fail). The failing step returns an error naming the
   peer (the ring: rank 1 waited for; the servers: worker 1 lost), the hier says it is broken
   afterwards, and everything tears down. The parent never waits past a case's deadline:
   a process still running then is a hang, killed and reported.
   --host: host memory stands in for the device (tests/gpu/emu_ops.h): the same processes, ring,
   servers and kills run without a GPU (make test runs this); without --host a machine with no
   device prints one "skipped: no CUDA device" line. The parent never touches CUDA (a process
   that has must not fork): the device is probed in a child.
   usage: hier_procs [--host] [--count N] [--piece N] [--steps S]
   Prints a line per case and ends with "N passed, N failed" (exit 1 on a failure). */
#define KVPS_IMPLEMENTATION
#define KVPS_GPU_INTERNAL
#include "kvps.h"
#include "kvps_ring.h"
#include "kvps_gpu.h"
#include "tests/gpu/emu_ops.h"
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct {
    int host, steps;
    size_t count, piece;
} C = {0, 3, (size_t)1 << 20, (size_t)1 << 16};

enum { RING_TIMEOUT_MS = 2000, HIER_TIMEOUT_MS = 8000, CASE_DEADLINE_MS = 90000, DIE_AT = 1 };
static const float SCALE = 0.5f; /* small integers times a power of two: every sum is exact */

static float grad_of(int m, int s, size_t i) { return (float)((int)((i * 7 + (size_t)m * 13 + (size_t)s * 5) % 41) - 20); }
/* what machine m gets back from step s: the ring's sum of this step, the servers' running sum */
static float want_of(int use_ring, int s, size_t i) {
    float w = 0;
    for (int t = use_ring ? s : 0; t <= s; t++) w += grad_of(0, t, i) * SCALE + grad_of(1, t, i) * SCALE;
    return w;
}

/* a child's end: its output first (_exit flushes nothing) */
static void child_exit(int rc) {
    fflush(stdout);
    _exit(rc);
}

/* ---- one machine's process ---------------------------------------------------------------- */
typedef struct machine {
    int m, use_ring;
    const char *servers, *peers;
    int die_at;    /* the step before which it tells the parent (who kills it); -1: none */
    int die_mode;  /* 1: then waits to be killed (never steps); 2: then steps (killed inside it) */
    int fail_from; /* the survivor: a step from this one on must fail, naming the peer; -1: none */
    int fail_exact; /* ... and exactly that one */
    int tell_fd;
} machine;

#define SAY(...) do { printf("  machine %d: ", x->m); printf(__VA_ARGS__); printf("\n"); fflush(stdout); } while (0)

static int machine_main(const machine *x) {
    int fails = 0, failed_named = 0;
    kvps_gpu_comm *c = NULL;
    kvps_gpu_hier *h = NULL;
    kvps_worker *w = NULL;
    kvps_ring *r = NULL;
    float *g = malloc(C.count * 4), *out = malloc(C.count * 4), *d_g = NULL, *d_o = NULL;
    cudaStream_t st = NULL;
    kvps_result rc = g && out ? KVPS_OK : KVPS_ERR_NOMEM;
    if (rc == KVPS_OK && !C.host) {
        cudaError_t e = cudaSetDevice(0);
        if (e == cudaSuccess) e = cudaStreamCreate(&st);
        if (e == cudaSuccess) e = cudaMalloc((void **)&d_g, C.count * 4);
        if (e == cudaSuccess) e = cudaMalloc((void **)&d_o, C.count * 4);
        if (e != cudaSuccess) { SAY("CUDA: %s", cudaGetErrorString(e)); rc = KVPS_ERR_GPU; }
        if (rc == KVPS_OK) rc = kvps_gpu_comm_create(&(kvps_gpu_comm_desc){.rank = 0, .size = 1, .device = 0}, &c);
        if (rc != KVPS_OK) SAY("kvps_gpu_comm_create: %s (%s)", kvps_result_str(rc), kvps_gpu_last_error());
    }
    if (rc == KVPS_OK) {
        rc = x->use_ring ? kvps_ring_create(&(kvps_ring_desc){.rank = x->m, .size = 2, .peers = x->peers,
                                                              .timeout_ms = RING_TIMEOUT_MS}, &r)
                         : kvps_worker_create(&(kvps_worker_desc){.servers = x->servers, .rank = x->m, .num_workers = 2,
                                                                  .timeout_ms = HIER_TIMEOUT_MS}, &w);
        if (rc != KVPS_OK) SAY("%s: %s", x->use_ring ? "kvps_ring_create" : "kvps_worker_create", kvps_result_str(rc));
    }
    if (rc == KVPS_OK) {
        kvps_gpu_hier_desc d = {.local = c, .worker = w, .ring = r, .name = "hp", .count = C.count, .piece = C.piece,
                                .scale = SCALE, .timeout_ms = HIER_TIMEOUT_MS};
        rc = C.host ? kvps_gpu__hier_create_ops(&d, &emu_ops, &h) : kvps_gpu_hier_create(&d, &h);
        if (rc != KVPS_OK) SAY("kvps_gpu_hier_create: %s (%s)", kvps_result_str(rc), kvps_gpu_last_error());
    }
    fails += rc != KVPS_OK;
    for (int s = 0; s < C.steps && rc == KVPS_OK; s++) {
        for (size_t i = 0; i < C.count; i++) g[i] = grad_of(x->m, s, i);
        /* the parent kills machine 1 once it has read both: machine 1 is at step die_at ('k'), and
           machine 0 has all of step die_at - 1 ('p': a SIGKILL can beat ZeroMQ's I/O thread to the
           wire, so machine 1 finishing its part of a step is not machine 0 having it) */
        if (s == x->fail_from && write(x->tell_fd, "p", 1) != 1) SAY("cannot tell the parent: %s", strerror(errno));
        if (s == x->die_at) {
            if (write(x->tell_fd, "k", 1) != 1) SAY("cannot tell the parent: %s", strerror(errno));
            if (x->die_mode == 1)
                for (;;) pause();
        }
        int64_t t0 = kvps__now_ms();
        if (C.host) {
            rc = kvps_gpu_hier_step(h, g, out, NULL);
        } else {
            rc = cudaMemcpy(d_g, g, C.count * 4, cudaMemcpyHostToDevice) == cudaSuccess ? KVPS_OK : KVPS_ERR_GPU;
            if (rc == KVPS_OK) rc = kvps_gpu_hier_step(h, d_g, d_o, st);
            if (rc == KVPS_OK) rc = kvps_gpu_comm_wait(c, st, -1);
            if (rc == KVPS_OK && cudaMemcpy(out, d_o, C.count * 4, cudaMemcpyDeviceToHost) != cudaSuccess) rc = KVPS_ERR_GPU;
        }
        int64_t dt = kvps__now_ms() - t0;
        if (rc != KVPS_OK) {
            const char *why = kvps_gpu_hier_last_error(h), *name = x->use_ring ? "rank 1" : "worker 1";
            if (x->fail_from >= 0 && (x->fail_exact ? s == x->fail_from : s >= x->fail_from)) {
                failed_named = strstr(why, name) != NULL;
                SAY("step %d failed after %lld ms, as it must with its peer killed: %s: %s", s, (long long)dt,
                    kvps_result_str(rc), why);
                if (!failed_named) { SAY("FAIL: the error does not name %s", name); fails++; }
                kvps_result again = C.host ? kvps_gpu_hier_step(h, g, out, NULL) : kvps_gpu_hier_step(h, d_g, d_o, st);
                if (again != KVPS_ERR_STATE) { SAY("FAIL: a step after the failure: %s, want KVPS_ERR_STATE", kvps_result_str(again)); fails++; }
            } else {
                SAY("FAIL: step %d: %s: %s", s, kvps_result_str(rc), why);
                fails++;
            }
            break;
        }
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < C.count; i++)
            if (out[i] != want_of(x->use_ring, s, i) && bad++ == 0) first = i;
        if (bad) {
            SAY("FAIL: step %d: %zu of %zu elements differ from the CPU's sum; element %zu: %g, want %g", s, bad, C.count,
                first, (double)out[first], (double)want_of(x->use_ring, s, first));
            fails++;
        }
    }
    if (x->fail_from >= 0 && !failed_named && fails == 0) { SAY("FAIL: no step failed with its peer killed"); fails++; }
    /* requests may still be in flight on the hier's pinned buffers: the worker / ring goes first */
    if (w) kvps_worker_destroy(&w);
    kvps_ring_destroy(&r);
    kvps_gpu_hier_destroy(&h);
    kvps_gpu_comm_destroy(&c);
    if (d_g) cudaFree(d_g);
    if (d_o) cudaFree(d_o);
    if (st) cudaStreamDestroy(st);
    free(g);
    free(out);
    return fails ? 1 : 0;
}

static int server_main(const char *ep) {
    kvps_server *s = NULL;
    /* a killed worker is lost after 1 s: the survivor's pulls are refused, naming it */
    kvps_result rc = kvps_server_create(&(kvps_server_desc){.endpoint = ep, .num_workers = 2, .update = KVPS_UPDATE_ACCUMULATE,
                                                            .heartbeat_ms = 300, .peer_timeout_ms = 1000}, &s);
    if (rc == KVPS_OK) rc = kvps_server_run(s); /* until both workers have finished */
    if (rc != KVPS_OK) printf("  server: %s\n", kvps_result_str(rc));
    kvps_server_destroy(&s);
    return rc == KVPS_OK ? 0 : 1;
}

/* ---- the parent ------------------------------------------------------------------------------ */
static int probe_main(void) {
    int n = 0;
    kvps_result rc = kvps_gpu_device_count(&n);
    if (rc == KVPS_OK && n > 0) return 0;
    printf("skipped: no CUDA device (%s)\n", kvps_gpu_last_error());
    return 3;
}

static pid_t spawn_machine(const machine *x) {
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) child_exit(machine_main(x));
    return p;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static const char *status_text(int st, char *buf, size_t n) {
    if (WIFEXITED(st)) snprintf(buf, n, "exit %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st)) snprintf(buf, n, "signal %d", WTERMSIG(st));
    else snprintf(buf, n, "status %d", st);
    return buf;
}

/* One case: the processes, a kill when asked (kill_one: a machine's die_mode), a deadline for
   all. 1 when it passed. */
static int run_case(int use_ring, int kill_one) {
    const char *what = use_ring ? "ring" : "servers";
    char dir[] = "/tmp/kvps-hp-XXXXXX", servers[96] = "", peers[200] = "";
    if (!mkdtemp(dir)) { printf("FAIL %s: mkdtemp: %s\n", what, strerror(errno)); return 0; }
    snprintf(servers, sizeof servers, "ipc://%s/server", dir);
    snprintf(peers, sizeof peers, "ipc://%s/rank0,ipc://%s/rank1", dir, dir);
    int fds[2];
    if (pipe(fds) != 0) { printf("FAIL %s: pipe: %s\n", what, strerror(errno)); rmdir(dir); return 0; }
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    pid_t srv = -1, pm[2];
    if (!use_ring) {
        fflush(stdout);
        if ((srv = fork()) == 0) child_exit(server_main(servers));
    }
    for (int m = 0; m < 2; m++) {
        machine x = {m, use_ring, servers, peers, kill_one && m == 1 ? DIE_AT : -1, kill_one, kill_one && m == 0 ? DIE_AT : -1,
                     kill_one == 1, fds[1]};
        pm[m] = spawn_machine(&x);
    }
    int stm[2] = {0, 0}, sts = 0, left = 2, hung = 0, killed = 0, told_k = 0, told_p = 0;
    int64_t deadline = kvps__now_ms() + CASE_DEADLINE_MS;
    while (left > 0) {
        struct pollfd pf = {fds[0], POLLIN, 0};
        if (poll(&pf, 1, 10) > 0) {
            char b;
            while (read(fds[0], &b, 1) == 1) {
                told_k |= b == 'k';
                told_p |= b == 'p';
            }
            if (told_k && told_p && !killed) {
                if (kill_one == 1) sleep_ms(300); /* machine 0 is waiting in the step by then */
                kill(pm[1], SIGKILL);
                killed = 1;
            }
        }
        for (int m = 0; m < 2; m++)
            if (pm[m] > 0 && waitpid(pm[m], &stm[m], WNOHANG) == pm[m]) { pm[m] = -1; left--; }
        if (left > 0 && kvps__now_ms() > deadline) {
            hung = 1;
            for (int m = 0; m < 2; m++)
                if (pm[m] > 0) {
                    printf("  machine %d still running after %d s: a hang; killed\n", m, CASE_DEADLINE_MS / 1000);
                    kill(pm[m], SIGKILL);
                    waitpid(pm[m], &stm[m], 0);
                    pm[m] = -1;
                    left--;
                }
        }
    }
    int srv_ok = 1;
    if (srv > 0) { /* it ends by itself once both workers have finished; with one killed it serves on */
        int64_t until = kvps__now_ms() + (kill_one ? 0 : 10000);
        while (waitpid(srv, &sts, WNOHANG) == 0) {
            if (kvps__now_ms() > until) {
                if (!kill_one) printf("  server still running 10 s after its workers finished\n");
                kill(srv, SIGKILL);
                waitpid(srv, &sts, 0);
                srv_ok = kill_one;
                break;
            }
            sleep_ms(10);
        }
        if (!kill_one && srv_ok) srv_ok = WIFEXITED(sts) && WEXITSTATUS(sts) == 0;
    }
    close(fds[0]);
    close(fds[1]);
    char path[160];
    const char *names[] = {"server", "rank0", "rank1"};
    for (int i = 0; i < 3; i++) { snprintf(path, sizeof path, "%s/%s", dir, names[i]); unlink(path); }
    rmdir(dir);
    char b0[32], b1[32];
    int ok0 = WIFEXITED(stm[0]) && WEXITSTATUS(stm[0]) == 0;
    int ok1 = kill_one ? WIFSIGNALED(stm[1]) && WTERMSIG(stm[1]) == SIGKILL : WIFEXITED(stm[1]) && WEXITSTATUS(stm[1]) == 0;
    int ok = ok0 && ok1 && srv_ok && !hung && (!kill_one || killed);
    char title[160];
    if (kill_one)
        snprintf(title, sizeof title, "%s, machine 1 killed %s step %d: machine 0's step fails naming it, no hang", what,
                 kill_one == 1 ? "before its" : "inside its", DIE_AT);
    else
        snprintf(title, sizeof title, "%s: 2 processes x %d steps, %zu floats in %zu pieces, against the CPU's sum", what,
                 C.steps, C.count, (C.count + C.piece - 1) / C.piece);
    printf("%s %s%s (machine 0 %s, machine 1 %s)\n", ok ? "ok" : "FAIL", title, C.host ? " [host memory]" : "",
           status_text(stm[0], b0, sizeof b0), status_text(stm[1], b1, sizeof b1));
    fflush(stdout);
    return ok;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--host") == 0) C.host = 1;
        else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc) C.count = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--piece") == 0 && i + 1 < argc) C.piece = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) C.steps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: hier_procs [--host] [--count N] [--piece N] [--steps S]\n");
            return 2;
        }
    }
    if (C.count == 0 || C.piece == 0 || C.steps < DIE_AT + 1 || C.steps > 1000) {
        fprintf(stderr, "hier_procs: need count > 0, piece > 0 and 2 <= steps <= 1000\n");
        return 2;
    }
    kvps_log_set_level(KVPS_LOG_NONE);
    signal(SIGPIPE, SIG_IGN);
    if (!C.host) { /* the device is probed in a child: the parent must not touch CUDA before forking */
        fflush(stdout);
        pid_t p = fork();
        if (p == 0) child_exit(probe_main());
        int st = 0;
        waitpid(p, &st, 0);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 3) {
            printf("0 passed, 0 failed, 6 skipped\n");
            return 0;
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            printf("FAIL the device probe (%s)\n0 passed, 1 failed\n", status_text(st, (char[32]){0}, 32));
            return 1;
        }
    }
    int pass = 0, fail = 0;
    for (int use_ring = 0; use_ring < 2; use_ring++)
        for (int kill_one = 0; kill_one < 3; kill_one++) {
            if (run_case(use_ring, kill_one)) pass++;
            else fail++;
        }
    printf("%d passed, %d failed\n", pass, fail);
    return fail ? 1 : 0;
}
