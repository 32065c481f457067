/* test_examples.c - runs the built examples and scripts/kvps-run the way a user would, with small
   sizes, and checks what they print and how they exit:
     ring_allreduce   the exact sums, standalone (threads) and one process per rank (kvps-run)
     ctr              learns: held-out AUC within a margin of the true model's AUC (LR under
                      BSP, FM under SSP, LR async under kvps-run)
     fmnist           ssp, easgd and allreduce modes for one epoch, standalone and under kvps-run
                      (skipped without Debian's dataset-fashion-mnist); with replicated shards
                      (kvps-run --replicas 2), plain and with shard 0's primary SIGKILLed mid-run:
                      the same final weights (crc32) as without replicas
     fsdp             fmnist --mode fsdp against --mode allreduce (adam, one epoch): the same bits with
                      2 workers (standalone and kvps-run), test accuracy within 0.3 points with 4,
                      parameter + optimizer bytes per rank exactly 1/4 of allreduce's plus padding
     pipeline         2 stages GPipe and 4 stages 1F1B, one epoch with --check: every step's loss
                      within 1e-5 (relative) of one process running the same micro-batches; accuracy
     mpirun           ring_allreduce (-n 3) and fmnist bsp (-n 4: 2 servers, 2 workers) under a real
                      Open MPI mpirun, ranks from OMPI_COMM_WORLD_RANK (skipped without mpirun)
     kvps-run         prefixes, a worker exiting 3 (the rest stopped, exit 3, no orphans),
                      SIGINT (exit 130, nothing left), host file over a stand-in ssh, quoting;
                      --replicas: the chains in KVPS_SERVERS, KVPS_REPLICA, [server I.J], a failed
                      replica's shard going on, a shard with none left failing the job
     make install     into a DESTDIR, then a program built with `pkg-config --cflags --libs kvps`
     README           the heart of hello_ps.c it shows is the program's; its build lines for
                      hello_ps.c and hello_ring.c, run verbatim, build them; they print what it says
     hello_ps, hello_ring  the known weights, standalone (threads), under kvps-run and (through
                      tests/mpi_check.sh) under mpirun; a clean finish: exit 0 by itself, every
                      server back from kvps_server_run, nobody "lost", times printed
   Run from the repository root (make test does), or from anywhere as build/test_examples.
   Ends with "N passed, N failed[, N skipped]". */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#define _XOPEN_SOURCE 700 /* realpath */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include "kvps.h" /* the API only: kvps_test.h names its types */
#include "tests/kvps_test.h"

static char root[4096]; /* the repository */
static char bdir[4096]; /* the build directory holding the examples */
static char tmp[4096];  /* this run's scratch directory */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void show(const char *out) { /* the tail of a failing command's output */
    size_t len = strlen(out);
    const char *p = len > 3000 ? out + len - 3000 : out;
    printf("  --- output (last %zu bytes) ---\n%s  ---\n", strlen(p), p);
}

static int has_line(const char *out, const char *line) { /* a whole line equal to `line` */
    size_t n = strlen(line);
    for (const char *p = out; (p = strstr(p, line)) != NULL; p++)
        if ((p == out || p[-1] == '\n') && (p[n] == '\n' || p[n] == 0)) return 1;
    return 0;
}

static int count_lines_starting(const char *out, const char *prefix) {
    int n = 0;
    size_t k = strlen(prefix);
    for (const char *p = out; *p;) {
        if (strncmp(p, prefix, k) == 0) n++;
        const char *e = strchr(p, '\n');
        if (!e) break;
        p = e + 1;
    }
    return n;
}

/* Processes whose command line starts with `marker` (orphans of a stopped job). */
static int count_procs(const char *marker) {
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char path[300], buf[4096];
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0) continue;
        ssize_t len = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (len <= 0) continue;
        for (ssize_t i = 0; i < len; i++) if (!buf[i]) buf[i] = ' ';
        buf[len] = 0;
        if (strncmp(buf, marker, strlen(marker)) == 0) n++;
    }
    closedir(d);
    return n;
}

static int wait_no_procs(const char *marker, double seconds) {
    double end = now_s() + seconds;
    while (count_procs(marker) > 0 && now_s() < end) kt_sleep_ms(50);
    return count_procs(marker);
}

static int file_exists(const char *path) { struct stat st; return stat(path, &st) == 0; }

/* ---------------------------------------------------------------------------------------------
   ring_allreduce */
static void test_ring_allreduce_threads(void) {
    char *out;
    int rc = kt_run_cmd(root, &out, "timeout 60 %s/ring_allreduce --ranks 3 --count 1000", bdir);
    KT_CHECK(rc == 0, "exit %d", rc);
    /* rank r adds (r + 1) * (i % 8 + 1): 1 + 2 + 3 = 6, times 1 at i = 0 and 8 at i = 999 */
    for (int r = 0; r < 3; r++) {
        char want[200];
        snprintf(want, sizeof want, "rank %d of 3: all-reduce of 1000 floats: ok (x[0] = 6, x[999] = 48; expected 6 and 48)", r);
        KT_CHECK(has_line(out, want), "missing '%s'", want);
    }
    KT_CHECK(has_line(out, "ring_allreduce: 3 ranks, 1000 floats: every rank holds the exact sum"), "no summary");
    if (kt_cur_failed) show(out);
    free(out);
}

static void test_ring_allreduce_processes(void) {
    char *out;
    int rc = kt_run_cmd(root, &out, "timeout 90 scripts/kvps-run -s 0 -w 3 --timeout 60 -- %s/ring_allreduce", bdir);
    KT_CHECK(rc == 0, "exit %d", rc);
    for (int r = 0; r < 3; r++) {
        char want[200];
        snprintf(want, sizeof want,
                 "[worker %d] rank %d of 3: all-reduce of 1000000 floats: ok (x[0] = 6, x[999999] = 48; expected 6 and 48)", r, r);
        KT_CHECK(has_line(out, want), "missing '%s'", want);
    }
    if (kt_cur_failed) show(out);
    free(out);
}

/* ---------------------------------------------------------------------------------------------
   hello_ps and hello_ring, the starting points: the known weights on every worker, and a clean
   finish. Under a launcher the job must end by itself: exit 0 within HANG_S (a hang check; no
   other time is asserted, the times are printed), every server back from kvps_server_run by
   itself ("every worker finished": a server stopped by a signal never says it), kvps-run not
   having to stop one ("stopping the servers"), and no process saying it lost a peer. */
enum { HANG_S = 20 };

/* kt_run_cmd (from the repository root) that also times the command: *wall_s from start to exit, *tail_s from the last line
   containing `last` to exit (-1: no such line). */
static int run_timed(char **out, const char *last, double *wall_s, double *tail_s, const char *fmt, ...) {
    char cmd[8192], full[sizeof cmd + sizeof root + 32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "cd '%s' && { %s ; } 2>&1", root, cmd);
    fflush(stdout);
    double t0 = now_s(), t_last = -1;
    FILE *p = popen(full, "r");
    size_t cap = 1 << 16, len = 0;
    char *buf = (char *)malloc(cap);
    buf[0] = 0;
    if (!p) { *out = buf; return -1; }
    char line[4096];
    while (fgets(line, sizeof line, p)) {
        size_t n = strlen(line);
        if (strstr(line, last)) t_last = now_s();
        if (cap - len <= n + 1) buf = (char *)realloc(buf, cap = 2 * cap + n);
        memcpy(buf + len, line, n + 1);
        len += n;
    }
    int st = pclose(p);
    double t_end = now_s();
    *wall_s = t_end - t0;
    *tail_s = t_last < 0 ? -1 : t_end - t_last;
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* The first line of out that says "lost" in any case, or NULL. */
static const char *line_saying_lost(const char *out, char *line, size_t cap) {
    for (const char *p = out; *p;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        snprintf(line, cap, "%.*s", (int)n, p);
        for (char *c = line; *c; c++)
            if ((c[0] | 32) == 'l' && (c[1] | 32) == 'o' && (c[2] | 32) == 's' && (c[3] | 32) == 't') return line;
        if (!e) break;
        p = e + 1;
    }
    return NULL;
}

/* The clean-finish checks on a job's output; `results` lines "PROG: worker|rank R of N: ...: ok". */
static void check_clean_finish(const char *what, int rc, const char *out, const char *prog, int results, int servers,
                               double wall_s, double tail_s) {
    char line[512], want[128];
    KT_CHECK(rc == 0, "%s: exit %d%s", what, rc, rc == 124 ? " (still running after the hang bound: killed)" : "");
    int ok = 0, fin = 0;
    for (int r = 0; r < results; r++) {
        snprintf(want, sizeof want, "%s: %s %d of %d: w = 1.0000 -2.0000 3.0000 0.5000 after 40 steps (want 1 -2 3 0.5): ok",
                 prog, strcmp(prog, "hello_ring") == 0 ? "rank" : "worker", r, results);
        ok += strstr(out, want) != NULL;
    }
    for (int i = 0; i < servers; i++) {
        snprintf(want, sizeof want, "hello_ps: server %d: every worker finished\n", i);
        fin += strstr(out, want) != NULL;
    }
    KT_CHECK(ok == results, "%s: %d of %d workers hold the known weights", what, ok, results);
    KT_CHECK(fin == servers, "%s: %d of %d servers returned from kvps_server_run by themselves", what, fin, servers);
    KT_CHECK(!strstr(out, "stopping the servers"), "%s: kvps-run had to stop servers", what);
    const char *lost = line_saying_lost(out, line, sizeof line);
    KT_CHECK(!lost, "%s: a process lost a peer: '%s'", what, lost ? lost : "");
    KT_CHECK(tail_s >= 0, "%s: no result line", what);
    printf("  %s: exit %d after %.2f s, %.2f s after the last worker's result\n", what, rc, wall_s, tail_s);
    if (kt_cur_failed) show(out);
}

static void test_hello_threads(void) {
    char *out;
    double wall, tail;
    int rc = run_timed(&out, "hello_ps: worker", &wall, &tail, "timeout %d %s/hello_ps -s 2 -w 3", HANG_S, bdir);
    check_clean_finish("hello_ps -s 2 -w 3 (threads)", rc, out, "hello_ps", 3, 2, wall, tail);
    free(out);
    rc = run_timed(&out, "hello_ring: rank", &wall, &tail, "timeout %d %s/hello_ring -n 3", HANG_S, bdir);
    check_clean_finish("hello_ring -n 3 (threads)", rc, out, "hello_ring", 3, 0, wall, tail);
    free(out);
}

static void test_hello_under_kvps_run(void) {
    char *out;
    double wall, tail;
    int rc = run_timed(&out, "hello_ps: worker", &wall, &tail, "timeout %d scripts/kvps-run -s 2 -w 3 %s/hello_ps", HANG_S,
                       bdir);
    check_clean_finish("kvps-run -s 2 -w 3 hello_ps", rc, out, "hello_ps", 3, 2, wall, tail);
    KT_CHECK(has_line(out, "[server 1] hello_ps: server 1: every worker finished"), "no prefixed line of server 1");
    free(out);
    rc = run_timed(&out, "hello_ring: rank", &wall, &tail, "timeout %d scripts/kvps-run -s 0 -w 3 %s/hello_ring", HANG_S,
                   bdir);
    check_clean_finish("kvps-run -s 0 -w 3 hello_ring", rc, out, "hello_ring", 3, 0, wall, tail);
    free(out);
}

/* A new user's first program written from hello_ps.c (issue 17): examples/first_ps.c, 2 servers,
   3 workers, a server-side SGD rule, in well under 100 lines: the line count, and under kvps-run
   every worker holds the fitted line, every process exits 0, nobody says lost. */
static void test_first_program(void) {
    char *out;
    int rc = kt_run_cmd(root, &out, "wc -l < examples/first_ps.c");
    KT_CHECK(rc == 0 && atoi(out) > 0 && atoi(out) < 70, "examples/first_ps.c: %d lines", atoi(out));
    printf("  examples/first_ps.c: %d lines\n", atoi(out));
    free(out);
    rc = kt_run_cmd(root, &out, "timeout %d scripts/kvps-run -s 2 -w 3 %s/first_ps", HANG_S, bdir);
    KT_CHECK(rc == 0, "kvps-run -s 2 -w 3 first_ps: exit %d", rc);
    for (int r = 0; r < 3; r++) {
        char want[128];
        snprintf(want, sizeof want, "[worker %d] first_ps: worker %d: w = 3.0000, b = -1.0000 (want 3, -1): ok", r, r);
        KT_CHECK(has_line(out, want), "no line '%s'", want);
    }
    char line[512];
    const char *lost = line_saying_lost(out, line, sizeof line);
    KT_CHECK(!lost && !strstr(out, "stopping the servers"), "first_ps: not a clean finish: '%s'", lost ? lost : "kvps-run stopped the servers");
    if (kt_cur_failed) show(out);
    free(out);
}

/* tests/mpi_check.sh: hello_ps and hello_ring under a real mpirun (exit 77: no Open MPI here). */
static void test_hello_under_mpirun(void) {
    char *out;
    int rc = kt_run_cmd(root, &out, "tests/mpi_check.sh '%s'", bdir);
    if (rc == 77) {
        const char *why = strstr(out, "skipped: ");
        why = why ? why + 9 : "skipped";
        KT_SKIP("tests/mpi_check.sh: %.*s", (int)strcspn(why, "\n"), why);
    } else {
        KT_CHECK(rc == 0, "tests/mpi_check.sh: exit %d", rc);
        for (const char *p = out; (p = strstr(p, "ok mpirun")) != NULL; p++) { /* its times, in this log */
            const char *e = strchr(p, '\n');
            printf("  %.*s\n", e ? (int)(e - p) : (int)strlen(p), p);
        }
        if (kt_cur_failed) show(out);
    }
    free(out);
}

/* ---------------------------------------------------------------------------------------------
   ctr: "ctr: test AUC A, true model AUC T (gap G)..." */
static void check_ctr(const char *out, const char *prefix, double max_gap) {
    const char *p = strstr(out, "ctr: test AUC ");
    double a = 0, t = 0;
    int got = p && sscanf(p, "ctr: test AUC %lf, true model AUC %lf", &a, &t) == 2;
    KT_CHECK(got, "no result line");
    if (!got) return;
    if (prefix) KT_CHECK(p - out >= (long)strlen(prefix) && strncmp(p - strlen(prefix), prefix, strlen(prefix)) == 0,
                      "the result line lacks the prefix '%s'", prefix);
    KT_CHECK(t > 0.75 && t < 0.95, "true model AUC %.4f out of the expected range", t);
    KT_CHECK(a > 0.70, "test AUC %.4f: nothing learnt", a);
    KT_CHECK(t - a < max_gap, "test AUC %.4f is %.4f below the true model's %.4f (allowed %.2f)", a, t - a, t, max_gap);
    KT_CHECK(count_lines_starting(out, prefix ? "[worker 0]     " : "    ") >= 2, "fewer than 2 epoch lines");
}

static void test_ctr_lr_bsp(void) {
    char *out;
    int rc = kt_run_cmd(root, &out, "timeout 120 %s/ctr --model lr --servers 2 --workers 2 --train 100000 --test 10000 --epochs 2 "
                                    "--target-gap 0.04", bdir);
    KT_CHECK(rc == 0, "exit %d", rc);
    check_ctr(out, NULL, 0.04);
    if (kt_cur_failed) show(out);
    free(out);
}

static void test_ctr_fm_ssp(void) {
    char *out;
    int rc = kt_run_cmd(root, &out, "timeout 120 %s/ctr --model fm --mode ssp:2 --servers 2 --workers 2 --train 100000 --test 10000 "
                                    "--epochs 2", bdir);
    KT_CHECK(rc == 0, "exit %d", rc);
    check_ctr(out, NULL, 0.08);
    KT_CHECK(strstr(out, "SSP (k = 2)") != NULL, "mode not reported");
    if (kt_cur_failed) show(out);
    free(out);
}

static void test_ctr_async_under_kvps_run(void) {
    char *out;
    int rc = kt_run_cmd(root, &out, "timeout 120 scripts/kvps-run -s 2 -w 2 --timeout 90 -- %s/ctr --mode async --train 60000 "
                                    "--test 10000 --epochs 2", bdir);
    KT_CHECK(rc == 0, "exit %d", rc);
    check_ctr(out, "[worker 0] ", 0.06);
    /* the servers left by themselves once every worker had finished, and said so */
    KT_CHECK(strstr(out, "[server 0] ctr: server 0: ") && strstr(out, "[server 1] ctr: server 1: "), "server lines");
    KT_CHECK(!strstr(out, "stopping the servers"), "servers had to be stopped by kvps-run");
    char line[512];
    const char *lost = line_saying_lost(out, line, sizeof line);
    KT_CHECK(!lost, "a process lost a peer on the way out: '%s'", lost ? lost : "");
    if (kt_cur_failed) show(out);
    free(out);
}

/* ---------------------------------------------------------------------------------------------
   fmnist: one epoch of softmax regression per mode */
static int have_fmnist_data(void) { return file_exists("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"); }

static void check_fmnist(const char *out, const char *prefix, const char *mode) {
    char want[64];
    snprintf(want, sizeof want, "%s    1 ", prefix); /* the epoch line: 8 columns */
    const char *p = strstr(out, want);
    double v[7];
    int cols = p ? sscanf(p + strlen(prefix), "%*d %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6]) : 0;
    KT_CHECK(cols == 7, "no epoch line with 8 columns");
    if (cols == 7) {
        KT_CHECK(v[2] > 0.75, "test accuracy %.4f after one epoch", v[2]);
        KT_CHECK(v[3] > 0 && v[4] > 0, "samples/s %g, net_MB %g", v[3], v[4]);
    }
    KT_CHECK(strstr(out, mode) != NULL, "result does not name mode %s", mode);
}

static void test_fmnist_modes(void) {
    if (!have_fmnist_data()) { KT_SKIP("no dataset-fashion-mnist"); return; }
    static const char *modes[] = {"ssp:1", "easgd", "allreduce"};
    for (int i = 0; i < 3; i++) {
        char *out;
        int rc = kt_run_cmd(root, &out, "timeout 120 %s/fmnist --model softmax --servers 2 --workers 2 --epochs 1 --mode %s --timeout 100",
                            bdir, modes[i]);
        KT_CHECK(rc == 0, "--mode %s: exit %d", modes[i], rc);
        check_fmnist(out, "", modes[i]);
        KT_CHECK(!strstr(out, "did not leave by itself"), "--mode %s: a server had to be stopped", modes[i]);
        if (kt_cur_failed) { show(out); free(out); return; }
        free(out);
    }
}

static void test_fmnist_under_kvps_run(void) {
    if (!have_fmnist_data()) { KT_SKIP("no dataset-fashion-mnist"); return; }
    char *out;
    int rc = kt_run_cmd(root, &out, "timeout 120 scripts/kvps-run -s 0 -w 2 --timeout 100 -- %s/fmnist --model softmax --epochs 1 "
                                    "--mode allreduce --codec fp16", bdir);
    KT_CHECK(rc == 0, "allreduce: exit %d", rc);
    check_fmnist(out, "[worker 0] ", "allreduce");
    if (kt_cur_failed) { show(out); free(out); return; }
    free(out);
    rc = kt_run_cmd(root, &out, "timeout 120 scripts/kvps-run -s 2 -w 2 --timeout 100 -- %s/fmnist --model softmax --epochs 1 --mode bsp",
                    bdir);
    KT_CHECK(rc == 0, "bsp: exit %d", rc);
    check_fmnist(out, "[worker 0] ", "bsp");
    KT_CHECK(!strstr(out, "stopping the servers"), "servers had to be stopped by kvps-run");
    char line[512];
    const char *lost = line_saying_lost(out, line, sizeof line);
    KT_CHECK(!lost, "a process lost a peer on the way out: '%s'", lost ? lost : "");
    if (kt_cur_failed) show(out);
    free(out);
}

/* fmnist's last line under BSP, "final weights crc32 XXXXXXXX" from worker 0 (after `prefix`):
   its 8 hex digits into crc; 0 when there is no such line. */
static int fmnist_crc(const char *out, const char *prefix, char crc[9]) {
    char want[64];
    snprintf(want, sizeof want, "%sfinal weights crc32 ", prefix);
    const char *p = strstr(out, want);
    if (!p || (p != out && p[-1] != '\n')) return 0;
    p += strlen(want);
    for (int i = 0; i < 8; i++)
        if (!strchr("0123456789abcdef", p[i]) || !p[i]) return 0;
    if (p[8] != '\n' && p[8] != 0) return 0;
    memcpy(crc, p, 8);
    crc[8] = 0;
    return 1;
}

/* ---------------------------------------------------------------------------------------------
   fmnist --mode fsdp against --mode allreduce with the same rule (adam), one epoch of the MLP
   (issue 19). What fsdp prints: "fmnist: memory per rank: params_bytes P state_bytes S ..." and
   the result row's test_acc. */
static int fmnist_acc(const char *out, double *acc) { /* the result row: "  mlp-128 0 M mode E B lr ACC ..." */
    const char *p = strstr(out, "\n  mlp-");
    return p && sscanf(p, " %*s %*d %*d %*s %*d %*d %*g %lf", acc) == 1;
}

static int fmnist_mem(const char *out, long long *params, long long *state) {
    const char *p = strstr(out, "fmnist: memory per rank: params_bytes ");
    return p && sscanf(p, "fmnist: memory per rank: params_bytes %lld state_bytes %lld", params, state) == 2;
}

/* Runs one fmnist job; its output in *out, 0 or the exit code (the test failed). */
static int run_fmnist_ring(char **out, const char *args) {
    int rc = kt_run_cmd(root, out, "timeout 120 %s/fmnist --model mlp --epochs 1 --timeout 100 --optim adam %s", bdir, args);
    KT_CHECK(rc == 0, "fmnist %s: exit %d", args, rc);
    return rc;
}

/* 2 workers: every sum is of two floats, the same in either order, and fsdp's update is
   allreduce's on a block: the two end with the same bits (crc32), standalone and under kvps-run.
   4 workers: the sums' order differs (the ring cuts the buffer differently), the accuracy may
   not by more than 0.3 points; each rank holds exactly ceil(len / 4) floats of each layer
   (784x128 + 128 = 100480 and 128x10 + 10 = 1290 floats: 25120 + 323) and twice that in adam's
   state, against allreduce's 101770 and 203540 floats. */
static void test_fmnist_fsdp(void) {
    if (!have_fmnist_data()) { KT_SKIP("no dataset-fashion-mnist"); return; }
    static const char *runs[] = {"--workers 2 --mode allreduce", "--workers 2 --mode fsdp", "--workers 4 --mode allreduce",
                                 "--workers 4 --mode fsdp"};
    char *out[5] = {NULL};
    char crc[5][9];
    double acc[4] = {0};
    long long pb[4] = {0}, sb[4] = {0};
    for (int i = 0; i < 4 && !kt_cur_failed; i++) {
        if (run_fmnist_ring(&out[i], runs[i]) != 0) break;
        KT_CHECK(fmnist_crc(out[i], "", crc[i]), "%s: no 'final weights crc32' line", runs[i]);
        KT_CHECK(fmnist_acc(out[i], &acc[i]), "%s: no result row", runs[i]);
        KT_CHECK(fmnist_mem(out[i], &pb[i], &sb[i]), "%s: no memory line", runs[i]);
        check_fmnist(out[i], "", strstr(runs[i], "fsdp") ? "fsdp" : "allreduce");
        if (kt_cur_failed) show(out[i]);
    }
    if (!kt_cur_failed) {
        KT_CHECK(strcmp(crc[0], crc[1]) == 0, "2 workers: allreduce crc32 %s, fsdp %s", crc[0], crc[1]);
        printf("  2 workers: final weights crc32 %s (allreduce), %s (fsdp); test_acc %.4f, %.4f\n", crc[0], crc[1], acc[0],
               acc[1]);
        printf("  4 workers: test_acc %.4f (allreduce), %.4f (fsdp); params + state bytes per rank %lld + %lld, %lld + %lld\n",
               acc[2], acc[3], pb[2], sb[2], pb[3], sb[3]);
        KT_CHECK(fabs(acc[2] - acc[3]) <= 0.003, "4 workers: test_acc %.4f (allreduce) vs %.4f (fsdp)", acc[2], acc[3]);
        KT_CHECK(pb[2] == 101770 * 4 && sb[2] == 2 * 101770 * 4, "allreduce holds %lld + %lld bytes", pb[2], sb[2]);
        KT_CHECK(pb[3] == (25120 + 323) * 4 && sb[3] == 2 * pb[3], "fsdp, 4 ranks, holds %lld + %lld bytes", pb[3], sb[3]);
        KT_CHECK(pb[1] == (50240 + 645) * 4 && sb[1] == 2 * pb[1], "fsdp, 2 ranks, holds %lld + %lld bytes", pb[1], sb[1]);
        double ratio = (double)(pb[3] + sb[3]) / (double)(pb[2] + sb[2]);
        KT_CHECK(ratio > 0.25 && ratio < 0.2501, "fsdp / allreduce bytes per rank %.5f, want 1/4 + padding", ratio);
    }
    if (!kt_cur_failed) { /* one process per rank under kvps-run: the same bits */
        int rc = kt_run_cmd(root, &out[4], "timeout 120 scripts/kvps-run -s 0 -w 2 --timeout 100 -- %s/fmnist --model mlp --epochs 1 "
                                           "--mode fsdp --optim adam", bdir);
        KT_CHECK(rc == 0, "fsdp under kvps-run: exit %d", rc);
        KT_CHECK(fmnist_crc(out[4], "[worker 0] ", crc[4]) && strcmp(crc[4], crc[1]) == 0,
                 "fsdp under kvps-run: crc32 %s, standalone %s", crc[4], crc[1]);
        if (kt_cur_failed) show(out[4]);
    }
    for (int i = 0; i < 5; i++) free(out[i]);
}

/* ---------------------------------------------------------------------------------------------
   pipeline (issue 19): one epoch with --check, which runs the same micro-batches through one
   process holding every layer and compares every step's loss (relative difference < 1e-5 at
   every step; "max relative loss difference X (step N)" is the worst); 2 stages GPipe, 4 stages
   1F1B; the test accuracy through the pipeline after one epoch; a memory line per stage. */
static void check_pipeline(const char *args, int stages) {
    char *out;
    int rc = kt_run_cmd(root, &out, "timeout 150 %s/pipeline --epochs 1 --check --timeout 120 %s", bdir, args);
    KT_CHECK(rc == 0, "pipeline %s: exit %d", args, rc);
    const char *p = strstr(out, "check: one-process reference, ");
    double worst = 1, acc = 0;
    long steps = 0;
    KT_CHECK(p && sscanf(p, "check: one-process reference, %ld steps (%*[^)]): max relative loss difference %lf",
                         &steps, &worst) == 2, "pipeline %s: no check line", args);
    KT_CHECK(steps == 468 && worst < 1e-5 && strstr(p, "PASS"), "pipeline %s: %ld steps, max relative loss difference %g",
             args, steps, worst);
    p = strstr(out, "\nresult:\n");
    KT_CHECK(p && sscanf(p, "\nresult:\n%*[^\n]\n %*d %*d %*s %*d %*d %*g %lf", &acc) == 1, "pipeline %s: no result row", args);
    KT_CHECK(acc > 0.80, "pipeline %s: test accuracy %.4f after one epoch", args, acc);
    KT_CHECK(count_lines_starting(out, "memory: stage ") == stages, "pipeline %s: not %d memory lines", args, stages);
    printf("  pipeline %s: max relative loss difference %g over %ld steps, test_acc %.4f\n", args, worst, steps, acc);
    if (kt_cur_failed) show(out);
    free(out);
}

static void test_pipeline(void) {
    if (!have_fmnist_data()) { KT_SKIP("no dataset-fashion-mnist"); return; }
    check_pipeline("--stages 2 --schedule gpipe", 2);
    if (!kt_cur_failed) check_pipeline("--stages 4 --schedule 1f1b", 4);
}

/* Replicated shards (issue 18): one epoch of the MLP, BSP, 2 shards and 4 workers under kvps-run,
   three ways: without replicas; with 2 replicas per shard; and with 2 replicas and shard 0's
   primary SIGKILLed mid-run (--kill-primary-at 700: with 2 shards shard 0 holds 3 of the MLP's
   slices, so it applies 3 rounds a step, 1404 in the epoch's 468 steps; round 700 is in step 234).
   Each exits 0 and prints the same "final weights crc32" line: replication and a failover must
   not change the arithmetic (BSP sums in rank order: the run without replicas fixes the bits).
   The kill run's workers read their pushpulls' results from the backups (KVPS_READ_LOCAL=1: every
   replica is on this host), through the take-over too. */
static void test_fmnist_replicas(void) {
    if (!have_fmnist_data()) { KT_SKIP("no dataset-fashion-mnist"); return; }
    static const char *runs[3][2] = {
        {"without replicas", "-s 2 -w 4"},
        {"2 replicas per shard", "-s 2 --replicas 2 -w 4"},
        {"2 replicas, .read_local, shard 0's primary killed at round 700", "-s 2 --replicas 2 -w 4"}};
    char crc[3][9] = {"", "", ""};
    for (int i = 0; i < 3; i++) {
        char *out, line[512];
        int rc = kt_run_cmd(root, &out, "%stimeout 150 scripts/kvps-run %s --timeout 120 -- %s/fmnist --model mlp --epochs 1%s",
                            i == 2 ? "KVPS_READ_LOCAL=1 " : "", runs[i][1], bdir, i == 2 ? " --kill-primary-at 700" : "");
        KT_CHECK(rc == 0, "%s: exit %d", runs[i][0], rc);
        check_fmnist(out, "[worker 0] ", "bsp");
        KT_CHECK(fmnist_crc(out, "[worker 0] ", crc[i]), "%s: no line '[worker 0] final weights crc32 XXXXXXXX'", runs[i][0]);
        KT_CHECK(!strstr(out, "stopping the servers"), "%s: kvps-run had to stop servers", runs[i][0]);
        if (i < 2) { /* a clean finish; the kill run's workers do say they lost server 0's primary */
            const char *lost = line_saying_lost(out, line, sizeof line);
            KT_CHECK(!lost, "%s: a process lost a peer: '%s'", runs[i][0], lost ? lost : "");
        } else {
            KT_CHECK(strstr(out, "[server 0.0] fmnist: server 0 (replica 0): ") &&
                         strstr(out, " rounds applied: raising SIGKILL (test hook: at 700)"),
                     "%s: the primary did not kill itself", runs[i][0]);
            KT_CHECK(strstr(out, "kvps-run: server 0.0 exited with code 137; shard 0 goes on with server 0.1 (--replicas)"),
                     "%s: kvps-run did not see server 0.0 die", runs[i][0]);
        }
        if (i > 0 && *crc[0] && *crc[i])
            KT_CHECK(strcmp(crc[i], crc[0]) == 0, "%s: final weights crc32 %s, without replicas %s", runs[i][0], crc[i], crc[0]);
        printf("  %s: exit %d, final weights crc32 %s\n", runs[i][0], rc, *crc[i] ? crc[i] : "(none)");
        if (kt_cur_failed) show(out);
        free(out);
        if (i == 0 && kt_cur_failed) return; /* no reference */
    }
}

/* ---------------------------------------------------------------------------------------------
   mpirun: the examples take their rank from OMPI_COMM_WORLD_RANK (they use no MPI themselves) */
static int port_free(int port) { /* nothing bound to 127.0.0.1:port, not even in TIME_WAIT */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* n loopback endpoints "tcp://127.0.0.1:P,..." on ports free now, from 20000-32767 (below the
   ephemeral range, as kvps-run picks them) */
static void free_endpoints(char *buf, size_t cap, int n) {
    static int next;
    if (!next) next = 20000 + (int)(getpid() * 7919L % 12000);
    buf[0] = 0;
    for (int i = 0; i < n; i++) {
        for (int tries = 0; tries < 200 && !port_free(next); tries++) next = next >= 32767 ? 20000 : next + 1;
        snprintf(buf + strlen(buf), cap - strlen(buf), "%stcp://127.0.0.1:%d", i ? "," : "", next);
        next = next >= 32767 ? 20000 : next + 1;
    }
}

/* "mpirun OPTIONS" for this machine: Open MPI refuses root without --allow-run-as-root and more
   ranks than cores without --oversubscribe; only the self and tcp transports (no shared memory
   or fabric probing in a container). 0: not usable (skipped). */
static int mpirun_cmd(char *buf, size_t cap) {
    char *out;
    int rc = kt_run_cmd(root, &out, "command -v mpirun >/dev/null && mpirun --version");
    int openmpi = rc == 0 && (strstr(out, "Open MPI") || strstr(out, "OpenRTE"));
    free(out);
    if (rc != 0) { KT_SKIP("no mpirun"); return 0; }
    if (!openmpi) { KT_SKIP("mpirun is not Open MPI's (these tests use its -x and --oversubscribe)"); return 0; }
    snprintf(buf, cap, "mpirun%s --oversubscribe --mca btl self,tcp", geteuid() == 0 ? " --allow-run-as-root" : "");
    return 1;
}

static void test_ring_allreduce_mpirun(void) {
    char mpirun[200], peers[200], *out;
    if (!mpirun_cmd(mpirun, sizeof mpirun)) return;
    free_endpoints(peers, sizeof peers, 3);
    int rc = kt_run_cmd(root, &out, "timeout 90 %s -n 3 -x KVPS_RING_PEERS=%s %s/ring_allreduce </dev/null", mpirun, peers, bdir);
    KT_CHECK(rc == 0, "exit %d", rc);
    for (int r = 0; r < 3; r++) {
        char want[200];
        snprintf(want, sizeof want,
                 "rank %d of 3: all-reduce of 1000000 floats: ok (x[0] = 6, x[999999] = 48; expected 6 and 48)", r);
        KT_CHECK(has_line(out, want), "missing '%s'", want);
    }
    if (kt_cur_failed) show(out);
    free(out);
}

static void test_fmnist_mpirun(void) {
    if (!have_fmnist_data()) { KT_SKIP("no dataset-fashion-mnist"); return; }
    char mpirun[200], servers[200], *out;
    if (!mpirun_cmd(mpirun, sizeof mpirun)) return;
    free_endpoints(servers, sizeof servers, 2);
    /* ranks 0 and 1 serve, 2 and 3 work; -x NAME passes the variable set here, as in the README */
    int rc = kt_run_cmd(root, &out, "export KVPS_SERVERS=%s KVPS_NUM_WORKERS=2 && timeout 120 %s -n 4 -x KVPS_SERVERS -x KVPS_NUM_WORKERS "
                                    "%s/fmnist --model softmax --epochs 1 --mode bsp --timeout 100 </dev/null", servers, mpirun, bdir);
    KT_CHECK(rc == 0, "exit %d", rc);
    check_fmnist(out, "", "bsp");
    KT_CHECK(strstr(out, "bsp, 2 servers, 2 workers") != NULL, "not 2 servers and 2 workers from the environment");
    char line[512];
    const char *lost = line_saying_lost(out, line, sizeof line);
    KT_CHECK(!lost, "a process lost a peer on the way out: '%s'", lost ? lost : "");
    if (kt_cur_failed) show(out);
    free(out);
}

/* ---------------------------------------------------------------------------------------------
   kvps-run */
static void test_launcher_env_and_prefixes(void) {
    char *out;
    int rc = kt_run_cmd(root, &out, "timeout 60 scripts/kvps-run -s 2 -w 3 --server-wait 1 -- sh -c "
                                    "'echo \"role=$KVPS_ROLE rank=$KVPS_RANK n=$KVPS_NUM_WORKERS size=${KVPS_SIZE:-}\"; "
                                    "echo err >&2; [ \"$KVPS_ROLE\" = worker ] || sleep 30'");
    KT_CHECK(rc == 0, "exit %d", rc);
    /* these servers never leave by themselves: stopped after --server-wait, and named */
    KT_CHECK(strstr(out, "kvps-run: server 0, server 1 still running 1 s after the last worker (--server-wait): "
                         "stopping the servers") != NULL, "no message naming the servers stopped");
    KT_CHECK(has_line(out, "[server 0] role=server rank=0 n=3 size="), "server 0 line");
    KT_CHECK(has_line(out, "[server 1] role=server rank=1 n=3 size="), "server 1 line");
    for (int r = 0; r < 3; r++) {
        char want[100];
        snprintf(want, sizeof want, "[worker %d] role=worker rank=%d n=3 size=3", r, r);
        KT_CHECK(has_line(out, want), "missing '%s'", want);
        snprintf(want, sizeof want, "[worker %d] err", r);
        KT_CHECK(has_line(out, want), "missing '%s' (stderr)", want);
    }
    if (kt_cur_failed) show(out);
    free(out);
}

/* --port P: the endpoints take P, P+1, ... in order (servers, then the workers' ring peers). */
static void test_launcher_port(void) {
    char *out;
    int base = 20000 + (int)(getpid() % 10000) * 2;
    int rc = kt_run_cmd(root, &out, "timeout 60 scripts/kvps-run -s 2 -w 2 --port %d --server-wait 1 -- sh -c "
                                    "'echo \"$KVPS_SERVERS|$KVPS_RING_PEERS\"; [ \"$KVPS_ROLE\" = worker ] || sleep 30'", base);
    KT_CHECK(rc == 0, "exit %d", rc);
    char want[300];
    snprintf(want, sizeof want, "[worker 0] tcp://127.0.0.1:%d,tcp://127.0.0.1:%d|tcp://127.0.0.1:%d,tcp://127.0.0.1:%d", base,
             base + 1, base + 2, base + 3);
    KT_CHECK(has_line(out, want), "want '%s'", want);
    if (kt_cur_failed) show(out);
    free(out);
}

/* --replicas R: N x R servers; KVPS_SERVERS lists each shard's chain joined by '|', its ports in
   --port order (shard 0's replicas, shard 1's, then the workers' ring peers); a server gets its
   shard as KVPS_RANK and its place as KVPS_REPLICA, and its lines say [server I.J]. A replica that
   fails while another of its shard runs is named and the job goes on (exit 0); a shard with no
   replica left fails the job with the code of the last one (--respawn 0). With --respawn (3 by
   default) a dead replica is started again with KVPS_REPLACEMENT=1, so that a shard survives one
   kill after another: replica 0 killed, its replacement up, then replica 1 killed: exit 0. */
static void test_launcher_replicas(void) {
    char *out, want[400];
    int base = 20000 + (int)(getpid() % 5000) * 2;
    int rc = kt_run_cmd(root, &out, "timeout 60 scripts/kvps-run -s 2 --replicas 2 -w 2 --port %d --server-wait 1 -- sh -c "
                                    "'echo \"$KVPS_ROLE $KVPS_RANK ${KVPS_REPLICA:--} n=$KVPS_NUM_SERVERS $KVPS_SERVERS ${KVPS_RING_PEERS:--}\"; "
                                    "[ \"$KVPS_ROLE\" = worker ] || sleep 30'", base);
    KT_CHECK(rc == 0, "exit %d", rc);
    char servers[300];
    snprintf(servers, sizeof servers, "tcp://127.0.0.1:%d|tcp://127.0.0.1:%d,tcp://127.0.0.1:%d|tcp://127.0.0.1:%d", base, base + 1,
             base + 2, base + 3);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            snprintf(want, sizeof want, "[server %d.%d] server %d %d n=2 %s -", i, j, i, j, servers);
            KT_CHECK(has_line(out, want), "want '%s'", want);
        }
    for (int r = 0; r < 2; r++) {
        snprintf(want, sizeof want, "[worker %d] worker %d - n=2 %s tcp://127.0.0.1:%d,tcp://127.0.0.1:%d", r, r, servers, base + 4,
                 base + 5);
        KT_CHECK(has_line(out, want), "want '%s'", want);
    }
    KT_CHECK(strstr(out, "kvps-run: server 0.0, server 0.1, server 1.0, server 1.1 still running 1 s after the last worker "
                         "(--server-wait): stopping the servers") != NULL, "no message naming the servers stopped");
    if (kt_cur_failed) show(out);
    free(out);
    /* replica 0 dies (SIGKILL), replica 1 carries on: the job ends well */
    rc = kt_run_cmd(root, &out, "timeout 60 scripts/kvps-run -s 1 --replicas 2 --respawn 0 -w 1 -- sh -c 'case \"$KVPS_ROLE ${KVPS_REPLICA:-}\" in "
                                "\"server 0\") sleep 0.2; kill -9 $$ ;; \"server 1\") sleep 2.5; echo left ;; *) sleep 1; echo done ;; esac'");
    KT_CHECK(rc == 0, "one replica killed: exit %d, want 0", rc);
    KT_CHECK(strstr(out, "kvps-run: server 0.0 exited with code 137; shard 0 goes on with server 0.1 (--replicas)") != NULL,
             "no message naming the dead replica");
    KT_CHECK(has_line(out, "[server 0.1] left") && has_line(out, "[worker 0] done"), "the others did not finish");
    if (kt_cur_failed) show(out);
    free(out);
    /* then replica 1 fails too: the shard is gone, the job stops with its code */
    double t0 = now_s();
    rc = kt_run_cmd(root, &out, "timeout 60 scripts/kvps-run -s 1 --replicas 2 --respawn 0 -w 1 -- sh -c 'case \"$KVPS_ROLE ${KVPS_REPLICA:-}\" in "
                                "\"server 0\") sleep 0.2; kill -9 $$ ;; \"server 1\") sleep 1; exit 5 ;; *) sleep 30 ;; esac'");
    KT_CHECK(rc == 5, "both replicas failed: exit %d, want 5", rc);
    KT_CHECK(now_s() - t0 < 20, "took %.1f s: the worker was not stopped", now_s() - t0);
    KT_CHECK(strstr(out, "kvps-run: server 0.1 exited with code 5; stopping the job") != NULL, "no message naming the failure");
    if (kt_cur_failed) show(out);
    free(out);
    /* respawn (the default): replica 0 killed and started again as a replacement, then replica 1
       killed: the replacement carries the shard, the job ends well */
    rc = kt_run_cmd(root, &out, "timeout 60 scripts/kvps-run -s 1 --replicas 2 -w 1 -- sh -c "
                                "'case \"$KVPS_ROLE ${KVPS_REPLICA:-} ${KVPS_REPLACEMENT:-0}\" in "
                                "\"server 0 0\") sleep 0.2; kill -9 $$ ;; \"server 0 1\") echo replacement; sleep 3; echo left ;; "
                                "\"server 1 0\") sleep 1.5; kill -9 $$ ;; \"server 1 1\") sleep 2; echo left ;; *) sleep 3.5; echo done ;; esac'");
    KT_CHECK(rc == 0, "replica 0, then replica 1 killed, with a replacement between: exit %d, want 0", rc);
    KT_CHECK(strstr(out, "kvps-run: started server 0.0 again as a replacement (1 of 3 for shard 0, --respawn)") != NULL,
             "no message naming the replacement");
    KT_CHECK(has_line(out, "[server 0.0] replacement") && has_line(out, "[server 0.0] left") &&
             has_line(out, "[worker 0] done"), "the replacement did not carry the shard to the end");
    KT_CHECK(strstr(out, "kvps-run: server 0.1 exited with code 137; shard 0 goes on with server 0.0 (--replicas)") != NULL,
             "the second kill did not leave the shard to the replacement");
    if (kt_cur_failed) show(out);
    free(out);
}

static void test_launcher_failure_stops_job(void) {
    char marker[64], *out;
    snprintf(marker, sizeof marker, "sleep 41.%d", (int)getpid() % 100000);
    double t0 = now_s();
    int rc = kt_run_cmd(root, &out, "timeout 60 scripts/kvps-run -s 1 -w 3 -- sh -c "
                                    "'if [ \"$KVPS_ROLE $KVPS_RANK\" = \"worker 1\" ]; then sleep 0.5; echo failing; exit 3; fi; "
                                    "%s & wait'", marker);
    double dt = now_s() - t0;
    KT_CHECK(rc == 3, "exit %d, want 3", rc);
    KT_CHECK(dt < 30, "took %.1f s: the others were not stopped", dt); /* they sleep 41 s */
    KT_CHECK(has_line(out, "[worker 1] failing"), "no output of the failing worker");
    KT_CHECK(strstr(out, "kvps-run: worker 1 exited with code 3") != NULL, "no message naming the failure");
    int left = wait_no_procs(marker, 5);
    KT_CHECK(left == 0, "%d processes of the job still running", left);
    if (kt_cur_failed) show(out);
    free(out);
}

static void test_launcher_sigint(void) {
    char marker[64], script[256];
    snprintf(marker, sizeof marker, "sleep 43.%d", (int)getpid() % 100000);
    snprintf(script, sizeof script, "echo ready; %s & wait", marker);
    int fd[2];
    if (pipe(fd) != 0) { KT_CHECK(0, "pipe"); return; }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGINT, SIG_DFL); /* as from a terminal, whatever started this test */
        if (chdir(root) != 0) _exit(126);
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        close(fd[0]);
        close(fd[1]);
        execl("scripts/kvps-run", "kvps-run", "-s", "2", "-w", "2", "--", "sh", "-c", script, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    /* wait for all four "ready" lines, so the job is really running */
    char buf[1 << 14];
    size_t len = 0;
    double end = now_s() + 20;
    while (count_lines_starting(buf, "[") < 4 && now_s() < end && len + 1 < sizeof buf) {
        struct pollfd p = {fd[0], POLLIN, 0};
        if (poll(&p, 1, 100) == 1) {
            ssize_t got = read(fd[0], buf + len, sizeof buf - 1 - len);
            if (got <= 0) break;
            len += (size_t)got;
        }
        buf[len] = 0;
    }
    buf[len] = 0;
    KT_CHECK(count_lines_starting(buf, "[") == 4, "the job did not start: '%s'", buf);
    end = now_s() + 10; /* "ready" comes just before the sleeps start */
    while (count_procs(marker) < 4 && now_s() < end) kt_sleep_ms(20);
    KT_CHECK(count_procs(marker) == 4, "%d of 4 processes running", count_procs(marker));
    kill(pid, SIGINT);
    int st = 0;
    end = now_s() + 20;
    while (waitpid(pid, &st, WNOHANG) == 0 && now_s() < end) kt_sleep_ms(20);
    int exited = waitpid(pid, &st, WNOHANG) != 0 || WIFEXITED(st) || WIFSIGNALED(st);
    if (!exited) { kill(pid, SIGKILL); waitpid(pid, &st, 0); }
    KT_CHECK(exited, "kvps-run still running 20 s after SIGINT");
    KT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 130, "status %d, want exit 130", st);
    int left = wait_no_procs(marker, 5);
    KT_CHECK(left == 0, "%d processes of the job still running", left);
    close(fd[0]);
}

/* --host-file: hosts 127.0.0.1 and 127.0.0.2 (both loopback on Linux), started through a stand-in
   for ssh that runs the remote command here, as sshd would. */
static void test_launcher_host_file(void) {
    char ssh[4200], hosts[4200], *out;
    snprintf(ssh, sizeof ssh, "%s/fake-ssh", tmp);
    snprintf(hosts, sizeof hosts, "%s/hosts", tmp);
    FILE *f = fopen(ssh, "w");
    if (!f) { KT_CHECK(0, "cannot write %s", ssh); return; }
    fprintf(f, "#!/bin/sh\n# stand-in for ssh HOST COMMAND: runs COMMAND here\nshift\nexec sh -c \"$*\"\n");
    fclose(f);
    chmod(ssh, 0755);
    f = fopen(hosts, "w");
    fprintf(f, "# two hosts\n127.0.0.1\n127.0.0.2   slots=1\n\n");
    fclose(f);
    int rc = kt_run_cmd(root, &out, "KVPS_RUN_SSH='%s' KVPS_EXAMPLE_VAR='x y' timeout 90 scripts/kvps-run -s 0 -w 3 --timeout 60 "
                                    "--host-file '%s' -- %s/ring_allreduce", ssh, hosts, bdir);
    KT_CHECK(rc == 0, "ring over hosts: exit %d", rc);
    KT_CHECK(strstr(out, "[worker 1] rank 1 of 3: all-reduce of 1000000 floats: ok") != NULL, "no result of worker 1");
    if (kt_cur_failed) { show(out); free(out); return; }
    free(out);
    /* arguments and KVPS_* variables reach the remote side intact */
    rc = kt_run_cmd(root, &out, "KVPS_RUN_SSH='%s' KVPS_EXAMPLE_VAR='x y' timeout 60 scripts/kvps-run -s 1 -w 2 --server-wait 1 "
                                "--host-file '%s' -- sh -c 'echo \"[$1] [$KVPS_EXAMPLE_VAR] $KVPS_SERVERS\"' argv0 \"a b'c \\$HOME\"",
                    ssh, hosts);
    KT_CHECK(rc == 0, "quoting: exit %d", rc);
    KT_CHECK(strstr(out, "[worker 1] [a b'c $HOME] [x y] tcp://127.0.0.1:") != NULL, "arguments or environment mangled");
    if (kt_cur_failed) show(out);
    free(out);
}

/* ---------------------------------------------------------------------------------------------
   README.md's "Using it": the heart of hello_ps.c it shows (the ```c block after "The heart of
   hello_ps.c") is the program's own text, line for line ("..." skips); and its ```sh block that
   opens with "cc -std=c99 hello_ps.c" is run verbatim in a directory holding only the two
   programs and the headers (as a user who copied them would): each "cc" line builds (also with
   -Wall -Wextra -Werror: the headers need no feature macro), each "./prog args   # line" prints
   that line. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0, got;
    char *b = (char *)malloc(cap);
    while ((got = fread(b + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len < 4096) b = (char *)realloc(b, cap *= 2);
    }
    fclose(f);
    b[len] = 0;
    return b;
}

/* The text of the fenced block that opens right after `after`, with `fence` ("```c\n"), up to
   its closing fence, in place inside md; NULL when there is none. */
static char *readme_block(char *md, const char *after, const char *fence) {
    char *p = strstr(md, after);
    p = p ? strstr(p, fence) : NULL;
    char *end = p ? strstr(p + strlen(fence), "\n```\n") : NULL;
    if (!end) return NULL;
    end[1] = 0;
    return p + strlen(fence);
}

static void test_readme_program(void) {
    char path[4200];
    snprintf(path, sizeof path, "%s/README.md", root);
    char *md = slurp(path), *md2 = slurp(path), *prog = NULL;
    snprintf(path, sizeof path, "%s/examples/hello_ps.c", root);
    prog = slurp(path);
    KT_CHECK(md && md2 && prog, "cannot read README.md or examples/hello_ps.c");
    char *heart = md ? readme_block(md, "The heart of hello_ps.c", "```c\n") : NULL;
    char *lines = md2 ? readme_block(md2, "\n```sh\ncc -std=c99 hello_ps.c", "```sh\n") : NULL;
    KT_CHECK(heart && lines, "README.md has no heart of hello_ps.c (```c) or no ```sh block of its build lines");
    if (!(heart && lines && prog)) { free(md); free(md2); free(prog); return; }
    int shown = 0;
    for (char *l = strtok(heart, "\n"); l; l = strtok(NULL, "\n")) {
        if (strcmp(l + strspn(l, " "), "...") == 0) continue;
        char *at = strstr(prog, l);
        size_t n = strlen(l);
        while (at && !((at == prog || at[-1] == '\n') && (at[n] == '\n' || at[n] == 0))) at = strstr(at + 1, l);
        KT_CHECK(at != NULL, "README.md shows a line hello_ps.c does not have: '%s'", l);
        shown++;
    }
    KT_CHECK(shown >= 10, "the heart of hello_ps.c in README.md is %d lines", shown);
    char dir[4120], *out;
    snprintf(dir, sizeof dir, "%.4000s/readme", tmp);
    int rc = kt_run_cmd(root, &out, "mkdir -p '%s' && cp kvps_core.h kvps_codec.h kvps_launch.h kvps.h kvps_ring.h examples/hello_ps.c examples/hello_ring.c '%s/'", dir, dir);
    free(out);
    KT_CHECK(rc == 0, "copying the programs to %s", dir);
    int builds = 0, runs = 0;
    for (char *l = lines, *nl; rc == 0 && *l; l = nl + 1) {
        nl = strchr(l, '\n');
        if (!nl) break;
        *nl = 0;
        if (strncmp(l, "cc ", 3) == 0) {
            builds++;
            rc = kt_run_cmd(root, &out, "cd '%s' && %s", dir, l);
            KT_CHECK(rc == 0, "the README's build line failed (exit %d): %s", rc, l);
            if (rc == 0) {
                free(out);
                rc = kt_run_cmd(root, &out, "cd '%s' && %s -Wall -Wextra -Werror -o strict", dir, l);
                KT_CHECK(rc == 0, "the README's build line with -Wall -Wextra -Werror failed (exit %d): %s", rc, l);
            }
        } else if (strncmp(l, "./", 2) == 0) {
            char *hash = strchr(l, '#'), *want = hash ? hash + 1 : NULL;
            KT_CHECK(hash != NULL, "the README's run line '%s' does not say what it prints ('# line')", l);
            if (!hash) break;
            runs++;
            while (*want == ' ') want++;
            for (*hash = 0; hash > l && hash[-1] == ' ';) *--hash = 0;
            rc = kt_run_cmd(root, &out, "cd '%s' && timeout %d %s", dir, HANG_S, l);
            KT_CHECK(rc == 0 && has_line(out, want), "%s: exit %d; the README says it prints '%s'", l, rc, want);
        } else {
            continue;
        }
        if (kt_cur_failed) show(out);
        free(out);
    }
    if (rc == 0) KT_CHECK(builds == 2 && runs == 2, "the README's block has %d build lines and %d run lines, want 2 and 2", builds, runs);
    free(md);
    free(md2);
    free(prog);
}

/* ---------------------------------------------------------------------------------------------
   make install */
static void test_install_and_pkg_config(void) {
    char *out;
    int rc = kt_run_cmd(root, &out, "command -v pkg-config >/dev/null");
    free(out);
    if (rc != 0) { KT_SKIP("no pkg-config"); return; }
    /* not the jobserver of a `make test` that runs us */
    rc = kt_run_cmd(root, &out, "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s install DESTDIR='%s/dest' PREFIX=/usr/local B='%s/b'",
                    tmp, tmp);
    KT_CHECK(rc == 0, "make install: exit %d", rc);
    if (kt_cur_failed) { show(out); free(out); return; }
    free(out);
    static const char *files[] = {"include/kvps_core.h", "include/kvps_codec.h", "include/kvps_launch.h", "include/kvps.h", "include/kvps_ring.h",
                                  "include/kvps_fuse.h", "include/kvps_gpu.h", "bin/kvps-run", "bin/kvps-timeline",
                                  "include/kvps_abi.h", "lib/libkvps.so", "lib/pkgconfig/kvps.pc"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[4300];
        snprintf(p, sizeof p, "%s/dest/usr/local/%s", tmp, files[i]);
        KT_CHECK(file_exists(p), "%s not installed", p);
    }
    char p[4300];
    snprintf(p, sizeof p, "%s/dest/usr/local/bin/kvps-run", tmp);
    KT_CHECK(access(p, X_OK) == 0, "kvps-run is not executable");
    rc = kt_run_cmd(root, &out, "grep -qx 'prefix=/usr/local' '%s/dest/usr/local/lib/pkgconfig/kvps.pc'", tmp);
    KT_CHECK(rc == 0, "kvps.pc does not say prefix=/usr/local (DESTDIR leaked?)");
    free(out);
    /* a user's program, away from the repository, built against the installed copy only */
    rc = kt_run_cmd(root, &out, "mkdir -p '%s/user' && cp examples/ring_allreduce.c '%s/user/' && cd '%s/user' && "
                                "export PKG_CONFIG_PATH='%s/dest/usr/local/lib/pkgconfig' PKG_CONFIG_SYSROOT_DIR='%s/dest' && "
                                "${CC:-cc} -std=c99 -D_POSIX_C_SOURCE=200809L ring_allreduce.c -o ring_allreduce "
                                "$(pkg-config --cflags --libs kvps) && ./ring_allreduce --ranks 2 --count 100",
                    tmp, tmp, tmp, tmp, tmp);
    KT_CHECK(rc == 0, "build with pkg-config: exit %d", rc);
    KT_CHECK(strstr(out, "ring_allreduce: 2 ranks, 100 floats: every rank holds the exact sum") != NULL, "wrong output");
    if (kt_cur_failed) show(out);
    free(out);
    /* a program that links the installed libkvps.so (kvps_abi.h) instead of defining the implementation */
    rc = kt_run_cmd(root, &out, "cd '%s/user' && printf '#include \"kvps_abi.h\"\n#include <stdio.h>\nint main(void) { "
                                "puts(kvps_abi_result_name(KVPS_ERR_TIMEOUT)); return kvps_abi_version() != KVPS_ABI_VERSION; }\n' >abi.c && "
                                "export PKG_CONFIG_PATH='%s/dest/usr/local/lib/pkgconfig' PKG_CONFIG_SYSROOT_DIR='%s/dest' && "
                                "${CC:-cc} -std=c99 abi.c -o abi $(pkg-config --cflags --libs kvps) -lkvps && "
                                "LD_LIBRARY_PATH='%s/dest/usr/local/lib' ./abi", tmp, tmp, tmp, tmp);
    KT_CHECK(rc == 0 && strstr(out, "KVPS_ERR_TIMEOUT") != NULL, "a program linked with -lkvps: exit %d", rc);
    if (kt_cur_failed) show(out);
    free(out);
    rc = kt_run_cmd(root, &out, "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s uninstall DESTDIR='%s/dest' PREFIX=/usr/local "
                                "B='%s/b'", tmp, tmp);
    KT_CHECK(rc == 0, "make uninstall: exit %d", rc);
    free(out);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/dest/usr/local/%s", tmp, files[i]);
        KT_CHECK(!file_exists(p), "%s left after uninstall", p);
    }
}

int main(int argc, char **argv) {
    (void)argc;
    /* the examples sit beside this binary; the repository is here, or that directory's parent */
    char self[4096];
    if (!realpath(argv[0], self)) { perror(argv[0]); return 1; }
    *strrchr(self, '/') = 0;
    snprintf(bdir, sizeof bdir, "%s", self);
    if (file_exists("kvps.h") && file_exists("scripts/kvps-run")) {
        if (!getcwd(root, sizeof root)) return 1;
    } else {
        snprintf(self + strlen(self), sizeof self - strlen(self), "/..");
        if (!realpath(self, root)) { perror(self); return 1; }
    }
    snprintf(tmp, sizeof tmp, "%s/kvps-test-examples.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmp)) { perror("mkdtemp"); return 1; }
    signal(SIGPIPE, SIG_IGN);

    /* make asan-test builds only the tests into build-asan: use the examples in build/ then */
    static const char *bins[] = {"ring_allreduce", "ctr", "fmnist", "hello_ps", "hello_ring", "pipeline"};
    char p[4300];
    snprintf(p, sizeof p, "%s/ctr", bdir);
    if (access(p, X_OK) != 0) {
        snprintf(bdir, sizeof bdir, "%.4000s/build", root);
    }
    for (int i = 0; i < 6; i++) {
        snprintf(p, sizeof p, "%s/%s", bdir, bins[i]);
        if (access(p, X_OK) != 0) printf("note: %s is not built (make %s)\n", p, p);
    }
    KT_RUN(test_hello_threads);
    KT_RUN(test_hello_under_kvps_run);
    KT_RUN(test_first_program);
    KT_RUN(test_hello_under_mpirun);
    KT_RUN(test_ring_allreduce_threads);
    KT_RUN(test_ring_allreduce_processes);
    KT_RUN(test_ctr_lr_bsp);
    KT_RUN(test_ctr_fm_ssp);
    KT_RUN(test_ctr_async_under_kvps_run);
    KT_RUN(test_fmnist_modes);
    KT_RUN(test_fmnist_under_kvps_run);
    KT_RUN(test_fmnist_replicas);
    KT_RUN(test_fmnist_fsdp);
    KT_RUN(test_pipeline);
    KT_RUN(test_ring_allreduce_mpirun);
    KT_RUN(test_fmnist_mpirun);
    KT_RUN(test_launcher_env_and_prefixes);
    KT_RUN(test_launcher_port);
    KT_RUN(test_launcher_replicas);
    KT_RUN(test_launcher_failure_stops_job);
    KT_RUN(test_launcher_sigint);
    KT_RUN(test_launcher_host_file);
    KT_RUN(test_install_and_pkg_config);
    KT_RUN(test_readme_program);

    char *out;
    kt_run_cmd(root, &out, "rm -rf '%s'", tmp);
    free(out);
    return kt_finish();
}
