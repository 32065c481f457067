/* launch.h - what the examples share about how they are launched: standalone (threads or forked
   processes on this machine), or one process per role under a launcher (scripts/kvps-run,
   mpirun, srun) that names the role in the KVPS_* environment (kvps_env_read).

   Include it after kvps.h or kvps_ring.h (its server and environment parts only with kvps.h); POSIX. Every function is static inline, so a
   program takes what it uses and no more. Used by examples/fmnist.c, examples/pipeline.c,
   examples/ctr.c and bench/ps_peer.c. Not by examples/ring_allreduce.c: that one is the program a newcomer copies
   away from this repository and builds against the installed headers alone (make test checks
   that it does).

     now_s, cpu_s, sleep_ms   the clocks (wall, CPU); a sleep that outlasts signals (clock.h)
     parse_long, parse_double one option's value, within bounds
     launch_opt               "--name=value" or "--name": the name, and the value if it came with it
     launch_read_line         one line from a pipe within a time limit (an endpoint from a child)
     launch_catch_signals     one handler for SIGINT and SIGTERM
     launch_server            a server process: create, serve until every worker has finished
                              (kvps_server_run returns by itself), SIGINT/SIGTERM, or the
                              standalone parent is gone; destroy (or, a test hook, SIGKILL
                              itself after a number of rounds)
     launch_env_read          a server or worker process: role, rank and cluster from KVPS_*
     launch_list_add          "a,b,c": endpoint lists */
#ifndef KVPS_EXAMPLES_LAUNCH_H
#define KVPS_EXAMPLES_LAUNCH_H

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "clock.h" /* now_s, cpu_s, sleep_ms */

/* ---- options: every process of a job is given the same ------------------------------------ */

/* A whole decimal number in [lo, hi] into *out; 0, or -1 (and *out untouched). */
static inline int parse_long(const char *s, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* A number (strtod's syntax) in [lo, hi] into *out; 0, or -1 (and *out untouched). */
static inline int parse_double(const char *s, double lo, double hi, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

/* An option, "--name=value" or "--name" (then *val is NULL: the value, if any, is the next
   argument): its name into name[cap]; 0, or -1 when arg is not an option or its name is longer. */
static inline int launch_opt(const char *arg, char *name, size_t cap, const char **val) {
    const char *eq = strchr(arg, '=');
    *val = NULL;
    if (strncmp(arg, "--", 2) != 0 || (eq && (size_t)(eq - arg) >= cap)) return -1;
    if (eq) {
        memcpy(name, arg, (size_t)(eq - arg));
        name[eq - arg] = 0;
        *val = eq + 1;
    } else {
        snprintf(name, cap, "%s", arg);
    }
    return 0;
}

/* One line from fd within timeout_ms, without its newline, into buf[cap]; 0, or -1 (timed out,
   end of input, or longer than cap). */
static inline int launch_read_line(int fd, char *buf, size_t cap, int timeout_ms) {
    size_t len = 0;
    double deadline = now_s() + timeout_ms / 1000.0;
    while (len + 1 < cap) {
        int left = (int)((deadline - now_s()) * 1000);
        if (left <= 0) return -1;
        struct pollfd p = {fd, POLLIN, 0};
        int rc = poll(&p, 1, left);
        if (rc < 0 && errno == EINTR) continue;
        if (rc <= 0) return -1;
        ssize_t got = read(fd, buf + len, 1);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        if (buf[len] == '\n') { buf[len] = 0; return 0; }
        len++;
    }
    return -1;
}

/* fn for SIGINT and SIGTERM. */
static inline void launch_catch_signals(void (*fn)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

#ifdef KVPS_H /* the parts for servers and workers need kvps.h (a ring-only program goes without) */
/* ---- a server process --------------------------------------------------------------------- */

/* A server leaves by itself: kvps_server_run returns once every worker has finished
   (kvps_worker_finish, or kvps_worker_destroy), so a job under a launcher ends when its workers
   do (and with KVPS_ERR_PEER_LOST, exit code 1, once every worker has finished or is lost).
   What is left to watch for is a standalone parent that died without telling anyone. */
typedef struct launch_server_desc {
    const char *prog;        /* names the process in messages: "PROG: server RANK: ..." */
    kvps_server_desc server; /* what kvps_server_create gets */
    pid_t parent;            /* > 0: leave (at once) when this is no longer the parent process */
    int poll_ms;             /* how often the parent is looked at */
    int report_fd;           /* >= 0: the bound endpoint is written there, one line, before serving */
    /* What the server says when it leaves, given the result of kvps_server_run (NULL: a
       failure, on stderr). */
    void (*on_end)(kvps_server *s, int rank, kvps_result r);
    /* A test hook: > 0 serves from a background thread (kvps_server_start), reads the server's
       stats every millisecond and, once it has applied this many rounds (kvps_server_stats
       .rounds: one per key or tensor slice it holds, per round), raises SIGKILL on this
       process: a real crash at a known point (fmnist --kill-primary-at). */
    uint64_t kill_at_rounds;
} launch_server_desc;

static kvps_server *volatile launch__server; /* the server that SIGINT / SIGTERM stop */
static volatile sig_atomic_t launch__stop;

static inline void launch__on_stop(int sig) {
    (void)sig;
    launch__stop = 1;
    kvps_server *s = launch__server;
    if (s) kvps_server_stop(s); /* async-signal-safe: one write() to a pipe */
}

typedef struct launch__watch { kvps_server *s; const launch_server_desc *d; } launch__watch;

static inline void *launch__watch_main(void *arg) {
    const launch__watch *w = (const launch__watch *)arg;
    while (!launch__stop) {
        if (getppid() != w->d->parent) {
            kvps_server_stop(w->s);
            return NULL;
        }
        sleep_ms(w->d->poll_ms > 0 ? w->d->poll_ms : 50);
    }
    return NULL;
}

/* Writes the bound endpoint to fd, one line, and closes fd; 0 or -1. */
static inline int launch__report(kvps_server *s, int fd) {
    char line[300];
    int len = snprintf(line, sizeof line, "%s\n", kvps_server_endpoint(s));
    if (write(fd, line, (size_t)len) != len) return -1;
    close(fd);
    return 0;
}

/* A server process from start to end: the exit code, 0 when it served until its workers had
   finished (or it was stopped). */
static inline int launch_server(const launch_server_desc *d) {
    int rank = d->server.rank;
    launch_catch_signals(launch__on_stop);
    kvps_server *s = NULL;
    kvps_result r = kvps_server_create(&d->server, &s);
    if (r != KVPS_OK) {
        fprintf(stderr, "%s: server %d: create on %s: %s\n", d->prog, rank, d->server.endpoint, kvps_result_str(r));
        return 1;
    }
    launch__server = s;
    if (launch__stop) kvps_server_stop(s); /* a signal came before launch__server was set */
    if (d->report_fd >= 0 && launch__report(s, d->report_fd) != 0) {
        fprintf(stderr, "%s: server %d: cannot report its endpoint: %s\n", d->prog, rank, strerror(errno));
        launch__server = NULL;
        kvps_server_destroy(&s);
        return 1;
    }
    launch__watch w = {s, d};
    pthread_t th;
    int watching = d->parent > 0 && pthread_create(&th, NULL, launch__watch_main, &w) == 0;
    if (d->kill_at_rounds > 0) {
        r = kvps_server_start(s);
        kvps_result wr = KVPS_ERR_TIMEOUT;
        while (r == KVPS_OK && (wr = kvps_server_wait(s, 1)) == KVPS_ERR_TIMEOUT) { /* not stopped: look every ms */
            kvps_server_stats st;
            kvps_server_stats_get(s, &st);
            if (st.rounds >= d->kill_at_rounds) {
                fprintf(stderr, "%s: server %d (replica %d): %llu rounds applied: raising SIGKILL (test hook: at %llu)\n",
                        d->prog, rank, d->server.replica, (unsigned long long)st.rounds,
                        (unsigned long long)d->kill_at_rounds);
                fflush(NULL);
                raise(SIGKILL);
            }
        }
        if (r == KVPS_OK) r = wr; /* what kvps_server_run returned */
    } else {
        r = kvps_server_run(s);
    }
    launch__stop = 1;
    if (watching) pthread_join(th, NULL);
    launch__server = NULL;
    if (d->on_end) d->on_end(s, rank, r);
    else if (r != KVPS_OK) fprintf(stderr, "%s: server %d: %s\n", d->prog, rank, kvps_result_str(r));
    kvps_server_destroy(&s);
    return r == KVPS_OK ? 0 : 1;
}

/* ---- under a launcher --------------------------------------------------------------------- */

/* Reads the launcher's environment into *env and makes *servers and *workers the job's (saying
   so on stderr where options that were given differ). 0, or 2, the exit code for a bad
   environment, after a message. */
static inline int launch_env_read(const char *prog, kvps_env *env, int *servers, int set_servers, int *workers,
                                  int set_workers) {
    kvps_result r = kvps_env_read(env);
    if (r != KVPS_OK) {
        fprintf(stderr, "%s: launcher environment: %s\n", prog, kvps_result_str(r));
        return 2;
    }
    if ((set_servers && *servers != env->num_servers) || (set_workers && *workers != env->num_workers))
        fprintf(stderr, "%s: using the environment's %d servers and %d workers, not the options'\n", prog,
                env->num_servers, env->num_workers);
    *servers = env->num_servers;
    *workers = env->num_workers;
    return 0;
}

#endif /* KVPS_H */

/* ---- standalone --------------------------------------------------------------------------- */

/* Appends item to the comma-separated list in buf (cap bytes in all). */
static inline void launch_list_add(char *buf, size_t cap, const char *item) {
    size_t len = strlen(buf);
    snprintf(buf + len, cap - len, "%s%s", len ? "," : "", item);
}

#endif
