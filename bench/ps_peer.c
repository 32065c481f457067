/* ps_peer - one kvps server or worker of a push/pull benchmark, configured from the environment
   (KVPS_ROLE, KVPS_RANK, KVPS_SERVERS, KVPS_NUM_WORKERS; see kvps_env_read), so that servers and
   workers can run on different hosts or network namespaces (bench/ethernet.sh).

   usage: ps_peer [--bytes B] [--steps N] [--warmup W] [--codec none|fp16|topk|topk+fp16]
                  [--topk FRACTION] [--tensors K] [--timeout MS] [--tag TEXT] [--max-slice F]
                  [--failover-ms MS] [--stamps 0|1]
          ps_peer --link-recv PORT [--bytes B]        (plain TCP sink: prints the link's goodput)
          ps_peer --link-send HOST:PORT [--bytes B]   (plain TCP source)

   Every process gets the same options. A worker registers a model of B bytes of float32
   (default 16 MiB) as K tensors (default 1) of B / K bytes, each cut by kvps into one slice per
   server, waits at a barrier, then runs W unmeasured and N measured BSP steps: one
   kvps_worker_pushpull_tensor per tensor (push the gradient, pull the mean of all workers'
   gradients), all K in flight at once, then wait for all. One CSV line per measured step:
       tag,rank,step,sync_us,push_wire_bytes,pull_wire_bytes,push_raw_bytes,pull_raw_bytes
   sync_us runs from the call to the end of its wait; bytes are this worker's, for that step
   (wire = what was sent, raw = float32 bytes the step stands for; kvps_worker_tensor_stats).
   Codecs: fp16 = pushes and pulls in fp16; topk = pushes keep the top FRACTION (default 0.01)
   by magnitude with error feedback, pulls in float32; topk+fp16 = the same with pulls in fp16.
   --stamps 1 adds a ninth column, end_unix_us: when the step ended on this worker's wall clock
   (CLOCK_REALTIME, microseconds since 1970), and flushes every line as it is written (so that
   a script can follow the steps and compare them with when it did something, e.g. a kill).
   A server (BSP, KVPS_UPDATE_MEAN) leaves by itself once every worker has finished
   (kvps_worker_finish), or on SIGINT / SIGTERM.
   Replicated shards (kvps.h FAULTS, REPLICAS): an entry of KVPS_SERVERS may be a chain
   "tcp://a:p|tcp://b:q"; a server is then its chain's KVPS_REPLICA-th (0, the first primary,
   by default) and is created with .replicas (its chain) and .replica (and .replacement from
   KVPS_REPLACEMENT); workers take the list as it is and move to a shard's next replica once its
   server has been unreachable for --failover-ms (default 1000, kvps's own).

   The link modes measure the raw TCP goodput of one connection in one direction, the ceiling
   every figure above is compared with:  link_bytes: N  link_s: T  link_Gbps: G  (receiver's
   clock, first byte to last). Exit codes: 0 done, 1 a kvps or socket call failed, 2 bad usage. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "examples/launch.h" /* the server process, now_s, sleep_ms: as the examples run one */

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct opts {
    size_t bytes, max_slice;
    int steps, warmup, timeout_ms, tensors, failover_ms, stamps;
    const char *codec, *tag;
    double topk;
} opts;

static void usage(const char *prog) {
    fprintf(stderr,
            "usage: %s [--bytes B] [--steps N] [--warmup W] [--codec none|fp16|topk|topk+fp16] [--topk F]\n"
            "          [--tensors K] [--timeout MS] [--tag TEXT] [--max-slice F] [--failover-ms MS] [--stamps 0|1]\n"
            "          (role, rank, servers - 'a|b' chains for replicated shards - and KVPS_REPLICA from KVPS_*)\n"
            "       %s --link-recv PORT [--bytes B] | --link-send HOST:PORT [--bytes B]\n",
            prog, prog);
}

/* ---- server ------------------------------------------------------------------------------ */
static int server_main(const kvps_env *env) {
    return launch_server(&(launch_server_desc){
        .prog = "ps_peer",
        .server = {.endpoint = env->endpoint, .num_workers = env->num_workers, .rank = env->rank,
                   .consistency = KVPS_BSP, .update = KVPS_UPDATE_MEAN,
                   .replicas = env->replicas, .replica = env->replica, .replacement = env->replacement},
        .report_fd = -1});
}

/* ---- worker ------------------------------------------------------------------------------ */
static int worker_fail(kvps_worker *w, int rank, const char *what, kvps_result r) {
    fprintf(stderr, "ps_peer: worker %d: %s: %s %s\n", rank, what, kvps_result_str(r), w ? kvps_worker_last_error(w) : "");
    fflush(NULL);
    return 1;
}

static int worker_main(const opts *o, const kvps_env *env) {
    int rank = env->rank;
    kvps_worker *w = NULL;
    kvps_result r = kvps_worker_create(&(kvps_worker_desc){.servers = env->servers, .rank = rank,
                                                           .num_workers = env->num_workers, .timeout_ms = o->timeout_ms,
                                                           .max_slice = o->max_slice, .failover_ms = o->failover_ms},
                                       &w);
    if (r != KVPS_OK) return worker_fail(NULL, rank, "create", r);
    size_t n = o->bytes / sizeof(float), per = n / (size_t)o->tensors;
    kvps_tensor t[64];
    kvps_req q[64];
    for (int i = 0; i < o->tensors; i++) {
        char name[32];
        snprintf(name, sizeof name, "model.%d", i);
        size_t len = i == o->tensors - 1 ? n - per * (size_t)i : per;
        if ((r = kvps_worker_tensor(w, name, len, &t[i])) != KVPS_OK) return worker_fail(w, rank, "tensor", r);
    }
    kvps_codec push = {0}, pull = {0};
    const kvps_codec *pushp = NULL, *pullp = NULL;
    if (!strcmp(o->codec, "fp16")) {
        push = kvps_codec_get(KVPS_CODEC_FP16), pull = push, pushp = &push, pullp = &pull;
    } else if (!strcmp(o->codec, "topk") || !strcmp(o->codec, "topk+fp16")) {
        push = kvps_codec_get(KVPS_CODEC_TOPK);
        push.topk_fraction = o->topk;
        pushp = &push;
        if (!strcmp(o->codec, "topk+fp16")) pull = kvps_codec_get(KVPS_CODEC_FP16), pullp = &pull;
    }
    for (int i = 0; pushp && i < o->tensors; i++)
        if ((r = kvps_worker_tensor_codec(w, t[i], pushp, pullp, pushp->id == KVPS_CODEC_TOPK)) != KVPS_OK)
            return worker_fail(w, rank, "codec", r);
    float *grad = (float *)malloc(n * sizeof(float)), *vals = (float *)malloc(n * sizeof(float));
    if (!grad || !vals) return worker_fail(w, rank, "malloc", KVPS_ERR_NOMEM);
    /* A gradient-like spread of magnitudes (so top-k has something to choose), touched once:
       fresh pages are expensive. */
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(rank + 1);
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        grad[i] = ((float)(x >> 40) / (float)(1u << 24) - 0.5f) * ((x & 15) == 0 ? 10.0f : 1.0f);
    }
    memset(vals, 0, n * sizeof(float));
    if ((r = kvps_worker_barrier(w, &q[0])) != KVPS_OK || (r = kvps_worker_wait(w, q[0], -1)) != KVPS_OK)
        return worker_fail(w, rank, "barrier", r);
    for (int step = -o->warmup; step < o->steps; step++) {
        kvps_tensor_stats before = {0}, after = {0}, st;
        for (int i = 0; i < o->tensors; i++) {
            kvps_worker_tensor_stats(w, t[i], &st);
            before.push_wire_bytes += st.push_wire_bytes, before.pull_wire_bytes += st.pull_wire_bytes;
            before.push_raw_bytes += st.push_raw_bytes, before.pull_raw_bytes += st.pull_raw_bytes;
        }
        double t0 = now_s();
        for (int i = 0; i < o->tensors; i++)
            if ((r = kvps_worker_pushpull_tensor(w, t[i], grad + per * (size_t)i, vals + per * (size_t)i, &q[i])) != KVPS_OK)
                return worker_fail(w, rank, "pushpull", r);
        for (int i = 0; i < o->tensors; i++)
            if ((r = kvps_worker_wait(w, q[i], -1)) != KVPS_OK) return worker_fail(w, rank, "wait", r);
        double dt = now_s() - t0;
        for (int i = 0; i < o->tensors; i++) {
            kvps_worker_tensor_stats(w, t[i], &st);
            after.push_wire_bytes += st.push_wire_bytes, after.pull_wire_bytes += st.pull_wire_bytes;
            after.push_raw_bytes += st.push_raw_bytes, after.pull_raw_bytes += st.pull_raw_bytes;
        }
        struct timespec wall;
        clock_gettime(CLOCK_REALTIME, &wall);
        if (step >= 0) {
            printf("%s,%d,%d,%.0f,%llu,%llu,%llu,%llu", o->tag, rank, step, dt * 1e6,
                   (unsigned long long)(after.push_wire_bytes - before.push_wire_bytes),
                   (unsigned long long)(after.pull_wire_bytes - before.pull_wire_bytes),
                   (unsigned long long)(after.push_raw_bytes - before.push_raw_bytes),
                   (unsigned long long)(after.pull_raw_bytes - before.pull_raw_bytes));
            if (o->stamps) {
                printf(",%lld\n", (long long)wall.tv_sec * 1000000 + wall.tv_nsec / 1000);
                fflush(stdout);
            } else {
                printf("\n");
            }
        }
    }
    fflush(stdout);
    if ((r = kvps_worker_finish(w, -1)) != KVPS_OK) return worker_fail(w, rank, "finish", r);
    kvps_worker_destroy(&w);
    free(grad);
    free(vals);
    return 0;
}

/* ---- raw TCP link test ------------------------------------------------------------------- */
static int link_recv(const char *port, size_t bytes) {
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_INET, hints.ai_socktype = SOCK_STREAM, hints.ai_flags = AI_PASSIVE;
    if (getaddrinfo(NULL, port, &hints, &ai) != 0 || !ai) { fprintf(stderr, "ps_peer: bad port %s\n", port); return 2; }
    int one = 1, ls = socket(ai->ai_family, ai->ai_socktype, 0);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ls < 0 || bind(ls, ai->ai_addr, ai->ai_addrlen) != 0 || listen(ls, 1) != 0) {
        fprintf(stderr, "ps_peer: link-recv on %s: %s\n", port, strerror(errno));
        freeaddrinfo(ai);
        return 1;
    }
    freeaddrinfo(ai);
    int s = accept(ls, NULL, NULL);
    close(ls);
    if (s < 0) { fprintf(stderr, "ps_peer: accept: %s\n", strerror(errno)); return 1; }
    static char buf[1 << 20];
    size_t got = 0;
    double t0 = 0;
    while (got < bytes) {
        ssize_t k = read(s, buf, sizeof buf);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        if (got == 0) t0 = now_s();
        got += (size_t)k;
    }
    double dt = now_s() - t0;
    close(s);
    if (got < bytes) { fprintf(stderr, "ps_peer: link-recv: got %zu of %zu bytes\n", got, bytes); return 1; }
    printf("link_bytes: %zu  link_s: %.4f  link_Gbps: %.4f\n", got, dt, (double)got * 8 / dt / 1e9);
    return 0;
}

static int link_send(const char *hostport, size_t bytes) {
    char host[256];
    const char *colon = strrchr(hostport, ':');
    if (!colon || (size_t)(colon - hostport) >= sizeof host) { fprintf(stderr, "ps_peer: want HOST:PORT\n"); return 2; }
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = 0;
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_INET, hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, colon + 1, &hints, &ai) != 0 || !ai) { fprintf(stderr, "ps_peer: cannot resolve %s\n", hostport); return 2; }
    int s = -1;
    for (int tries = 0; tries < 100; tries++) { /* the receiver may not listen yet */
        s = socket(ai->ai_family, ai->ai_socktype, 0);
        if (s >= 0 && connect(s, ai->ai_addr, ai->ai_addrlen) == 0) break;
        if (s >= 0) close(s);
        s = -1;
        sleep_ms(50);
    }
    freeaddrinfo(ai);
    if (s < 0) { fprintf(stderr, "ps_peer: connect %s: %s\n", hostport, strerror(errno)); return 1; }
    static char buf[1 << 20];
    memset(buf, 0x5a, sizeof buf);
    size_t sent = 0;
    while (sent < bytes) {
        size_t want = bytes - sent < sizeof buf ? bytes - sent : sizeof buf;
        ssize_t k = write(s, buf, want);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { fprintf(stderr, "ps_peer: link-send: %s\n", strerror(errno)); close(s); return 1; }
        sent += (size_t)k;
    }
    close(s);
    return 0;
}

int main(int argc, char **argv) {
    opts o = {.bytes = 16u << 20, .steps = 10, .warmup = 2, .timeout_ms = 120000, .tensors = 1, .codec = "none", .tag = "ps",
              .topk = 0.01, .failover_ms = 1000};
    const char *lrecv = NULL, *lsend = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { usage(argv[0]); return 2; }
        if (!strcmp(a, "--bytes")) o.bytes = (size_t)strtoull(v, NULL, 10);
        else if (!strcmp(a, "--steps")) o.steps = atoi(v);
        else if (!strcmp(a, "--warmup")) o.warmup = atoi(v);
        else if (!strcmp(a, "--codec")) o.codec = v;
        else if (!strcmp(a, "--topk")) o.topk = atof(v);
        else if (!strcmp(a, "--timeout")) o.timeout_ms = atoi(v);
        else if (!strcmp(a, "--tag")) o.tag = v;
        else if (!strcmp(a, "--tensors")) o.tensors = atoi(v);
        else if (!strcmp(a, "--max-slice")) o.max_slice = (size_t)strtoull(v, NULL, 10);
        else if (!strcmp(a, "--failover-ms")) o.failover_ms = atoi(v);
        else if (!strcmp(a, "--stamps")) o.stamps = atoi(v);
        else if (!strcmp(a, "--link-recv")) lrecv = v;
        else if (!strcmp(a, "--link-send")) lsend = v;
        else { usage(argv[0]); return 2; }
        i++;
    }
    int codec_ok = !strcmp(o.codec, "none") || !strcmp(o.codec, "fp16") || !strcmp(o.codec, "topk") ||
                   !strcmp(o.codec, "topk+fp16");
    if (o.tensors < 1 || o.tensors > 64 || o.bytes < sizeof(float) * (size_t)o.tensors || o.steps < 1 || o.warmup < 0 || o.timeout_ms < 1 || o.failover_ms < 1 || !codec_ok || !(o.topk > 0 && o.topk <= 1)) {
        usage(argv[0]);
        return 2;
    }
    if (lrecv) return link_recv(lrecv, o.bytes);
    if (lsend) return link_send(lsend, o.bytes);
    kvps_env env;
    kvps_result r = kvps_env_read(&env);
    if (r != KVPS_OK || env.role == KVPS_ROLE_NONE) {
        fprintf(stderr, "ps_peer: set KVPS_ROLE, KVPS_RANK, KVPS_SERVERS and KVPS_NUM_WORKERS (%s)\n", kvps_result_str(r));
        return 2;
    }
    return env.role == KVPS_ROLE_SERVER ? server_main(&env) : worker_main(&o, &env);
}
