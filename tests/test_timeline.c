/* test_timeline - the timeline (KVPS_TIMELINE, desc.timeline; kvps.h's TIMELINE), read back with
   Python's strict json module (tests/timeline_check.py):
     ps job         2 servers + 2 workers as processes under scripts/kvps-run --timeline: every
                    worker's pushpulls per tensor (bytes, servers), inits, barriers and raw-key
                    requests; every server's rounds of exactly the keys it holds, round numbers
                    1..steps, 2 contributions, straggler wait inside the round; events on a lane
                    nest; the merged file (a pid per process, rounds named after their tensors),
                    the summary and the PNG of scripts/kvps-timeline
     ring job       3 ranks as processes under kvps-run --timeline: each collective (ring and
                    recursive-doubling all-reduce, tree broadcast, all-gather, barrier, posted
                    all-reduces) with its algorithm, bytes and exactly its phases, nested under it
     off            the same job without --timeline writes no file; desc "" turns the variable
                    off; objects have no timeline unless asked
     strings        tensor names with quotes, backslashes, control bytes, non-UTF-8 bytes come
                    back from the JSON as they were (U+FFFD for the bad byte); a file of several
                    64 KiB writes holds every event
     killed         a process killed with SIGKILL leaves whole JSON (written at most a second ago)
     async          an async server counts its pushes in 100 ms windows, every push once
     lanes, rows    requests in flight together sit on lanes of their own; sparse rows' requests
     bad dir        a directory that cannot be made refuses create (KVPS_ERR_CONFIG)
   The jobs run this binary again (--ps-job, --ring-job) as the job's processes.
   Ends with "N passed, N failed". */
#define _XOPEN_SOURCE 700 /* realpath */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "kvps_ring.h"
#include "tests/kvps_test.h"
#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char root[4096]; /* the repository (scripts/, tests/) */
static char self[4096]; /* this binary */
static char tmp[4096];  /* this run's scratch directory, removed at the end */

/* ---- helpers --------------------------------------------------------------------------------- */

static void show(const char *out) {
    size_t len = strlen(out);
    const char *p = len > 4000 ? out + len - 4000 : out;
    printf("  --- output (last %zu bytes) ---\n%s  ---\n", strlen(p), p);
}

/* The checker on DIR (or FILE) with a spec file holding `spec`; KT_CHECKs that it said ok. */
static void check_with(const char *mode, const char *what, const char *spec) {
    char path[4200];
    snprintf(path, sizeof path, "%s/spec.json", tmp);
    FILE *f = fopen(path, "w");
    KT_CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(spec, f);
    fclose(f);
    char *out;
    int rc = kt_run_cmd(root, &out, "python3 tests/timeline_check.py %s '%s' '%s'", mode, what, path);
    KT_CHECK(rc == 0 && strstr(out, "check: ok"), "timeline_check %s %s: exit %d", mode, what, rc);
    if (kt_cur_failed) show(out);
    free(out);
}

/* A fresh empty directory under tmp. */
static void fresh_dir(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmp, name);
    char *out;
    kt_run_cmd(root, &out, "rm -rf '%s' && mkdir -p '%s'", buf, buf);
    free(out);
}

/* Files in dir (not . and ..). */
static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* The one file in dir whose name starts with prefix ("kvps-worker-0-"), into path. */
static int find_file(const char *dir, const char *prefix, char *path, size_t cap) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            snprintf(path, cap, "%s/%s", dir, e->d_name);
            n++;
        }
    closedir(d);
    return n == 1;
}

/* ---- the jobs (this binary, started by kvps-run) --------------------------------------------- */

enum { PS_STEPS = 5, PS_RAW_LEN = 8, PS_RAW_KEYS = 3, BIG_LEN = 6000, SMALL_LEN = 100 };
/* a tensor name that needs escaping: quotes, a backslash, e-acute, a control byte */
#define ODD_NAME "bias \"q\" \\ \xc3\xa9\x01"
#define ODD_NAME_JSON "bias \\\"q\\\" \\\\ \\u00e9\\u0001"
static const uint64_t raw_keys[PS_RAW_KEYS] = {7, 42, 1001};

static kvps_server *job_srv;
static void job_on_term(int sig) { (void)sig; if (job_srv) kvps_server_stop(job_srv); }

static int job_fail(const char *what, kvps_result r, kvps_worker *w) {
    fprintf(stderr, "ps-job: %s: %s %s\n", what, kvps_result_str(r), w ? kvps_worker_last_error(w) : "");
    return 1;
}

/* A server runs until SIGTERM (kvps-run stops it when the workers are done); a worker inits
   (rank 0), meets the others at a barrier, pushpulls two tensors PS_STEPS times (each result
   checked: the mean of the ranks' gradients), pushes and pulls raw keys, meets them again. */
static int ps_job(void) {
    kvps_env env;
    if (kvps_env_read(&env) != KVPS_OK) return 2;
    if (env.role == KVPS_ROLE_SERVER) {
        kvps_result r = kvps_server_create(&(kvps_server_desc){.endpoint = env.endpoint, .num_workers = env.num_workers,
                                                               .rank = env.rank}, &job_srv);
        if (r != KVPS_OK) return job_fail("server create", r, NULL);
        signal(SIGTERM, job_on_term);
        r = kvps_server_run(job_srv);
        kvps_server_destroy(&job_srv);
        return r == KVPS_OK ? 0 : 1;
    }
    kvps_worker *w = NULL;
    kvps_result r = kvps_worker_create(&(kvps_worker_desc){.servers = env.servers, .rank = env.rank,
                                                           .num_workers = env.num_workers, .timeout_ms = 30000}, &w);
    if (r != KVPS_OK) return job_fail("worker create", r, NULL);
    kvps_tensor t[2];
    static float g[BIG_LEN], v[BIG_LEN];
    const size_t lens[2] = {BIG_LEN, SMALL_LEN};
    kvps_req q;
    if ((r = kvps_worker_tensor(w, "layer1.w", BIG_LEN, &t[0])) || (r = kvps_worker_tensor(w, ODD_NAME, SMALL_LEN, &t[1])))
        return job_fail("tensor", r, w);
    for (int i = 0; i < 2 && env.rank == 0; i++) {
        memset(v, 0, sizeof v);
        if ((r = kvps_worker_init_tensor(w, t[i], v, &q)) || (r = kvps_worker_wait(w, q, -1))) return job_fail("init", r, w);
    }
    if ((r = kvps_worker_barrier(w, &q)) || (r = kvps_worker_wait(w, q, -1))) return job_fail("barrier", r, w);
    for (int step = 0; step < PS_STEPS; step++)
        for (int i = 0; i < 2; i++) {
            for (size_t j = 0; j < lens[i]; j++) g[j] = (float)((env.rank + 1) * (step + 1));
            if ((r = kvps_worker_pushpull_tensor(w, t[i], g, v, &q)) || (r = kvps_worker_wait(w, q, -1)))
                return job_fail("pushpull", r, w);
            float want = 1.5f * (float)(step + 1); /* mean of 1 and 2, times step + 1 */
            for (size_t j = 0; j < lens[i]; j++)
                if (v[j] != want) { fprintf(stderr, "ps-job: step %d: v[%zu] = %g, want %g\n", step, j, (double)v[j], (double)want); return 1; }
        }
    size_t rl[PS_RAW_KEYS];
    for (int i = 0; i < PS_RAW_KEYS; i++) rl[i] = PS_RAW_LEN;
    for (int j = 0; j < PS_RAW_KEYS * PS_RAW_LEN; j++) g[j] = (float)(env.rank + 1);
    if ((r = kvps_worker_push(w, raw_keys, g, rl, PS_RAW_KEYS, &q)) || (r = kvps_worker_wait(w, q, -1))) return job_fail("push", r, w);
    if ((r = kvps_worker_pull(w, raw_keys, v, rl, PS_RAW_KEYS, &q)) || (r = kvps_worker_wait(w, q, -1))) return job_fail("pull", r, w);
    for (int j = 0; j < PS_RAW_KEYS * PS_RAW_LEN; j++)
        if (v[j] != 1.5f) { fprintf(stderr, "ps-job: raw v[%d] = %g\n", j, (double)v[j]); return 1; }
    if ((r = kvps_worker_barrier(w, &q)) || (r = kvps_worker_wait(w, q, -1))) return job_fail("barrier", r, w);
    kvps_worker_destroy(&w);
    printf("ps-job worker %d ok\n", env.rank);
    return 0;
}

enum { RING_BIG = 300000, RING_SMALL = 1000 };

/* Each rank: a ring all-reduce (forced), a small one (recursive doubling), a broadcast from rank
   1, an all-gather, a barrier, and two all-reduces posted together; every result checked. */
static int ring_job(void) {
    int rank, size;
    const char *peers;
    if (kvps_ring_env_read(&rank, &size, &peers) != KVPS_OK) return 2;
    kvps_ring *r = NULL;
    kvps_result rc = kvps_ring_create(&(kvps_ring_desc){.rank = rank, .size = size, .peers = peers, .timeout_ms = 30000}, &r);
    if (rc != KVPS_OK) { fprintf(stderr, "ring-job: create: %s\n", kvps_result_str(rc)); return 1; }
    float *a = (float *)kt_xmalloc(RING_BIG * sizeof *a), *b = (float *)kt_xmalloc(RING_SMALL * (size_t)size * sizeof *b);
    float *c = (float *)kt_xmalloc(RING_SMALL * sizeof *c), *d = (float *)kt_xmalloc(RING_SMALL * sizeof *d);
    float tri = (float)(size * (size + 1) / 2);
    int bad = 0;
    for (size_t i = 0; i < RING_BIG; i++) a[i] = (float)(rank + 1);
    kvps_ring_op big = {.coll = KVPS_COLL_ALLREDUCE, .recv = a, .count = RING_BIG, .dtype = KVPS_FLOAT32, .algo = KVPS_ALGO_RING};
    if ((rc = kvps_ring_run(r, &big)) == KVPS_OK) bad |= a[0] != tri || a[RING_BIG - 1] != tri;
    for (size_t i = 0; rc == KVPS_OK && i < RING_SMALL; i++) c[i] = (float)(rank + 1);
    if (rc == KVPS_OK && (rc = kvps_ring_allreduce(r, c, c, RING_SMALL, KVPS_FLOAT32, KVPS_SUM)) == KVPS_OK) bad |= c[7] != tri;
    for (size_t i = 0; rc == KVPS_OK && i < RING_SMALL; i++) c[i] = rank == 1 ? 5.0f : 0.0f;
    if (rc == KVPS_OK && (rc = kvps_ring_broadcast(r, NULL, c, RING_SMALL, KVPS_FLOAT32, 1)) == KVPS_OK) bad |= c[9] != 5.0f;
    for (size_t i = 0; rc == KVPS_OK && i < RING_SMALL; i++) c[i] = (float)rank;
    if (rc == KVPS_OK && (rc = kvps_ring_allgather(r, c, b, RING_SMALL, KVPS_FLOAT32)) == KVPS_OK)
        for (int q = 0; q < size; q++) bad |= b[(size_t)q * RING_SMALL + 3] != (float)q;
    if (rc == KVPS_OK) rc = kvps_ring_barrier(r);
    kvps_ring_req q1 = 0, q2 = 0;
    for (size_t i = 0; rc == KVPS_OK && i < RING_SMALL; i++) { c[i] = 1.0f; d[i] = 2.0f; }
    kvps_ring_op p1 = {.coll = KVPS_COLL_ALLREDUCE, .recv = c, .count = RING_SMALL, .dtype = KVPS_FLOAT32};
    kvps_ring_op p2 = {.coll = KVPS_COLL_ALLREDUCE, .recv = d, .count = RING_SMALL, .dtype = KVPS_FLOAT32};
    if (rc == KVPS_OK) rc = kvps_ring_post(r, &p1, &q1);
    if (rc == KVPS_OK) rc = kvps_ring_post(r, &p2, &q2);
    if (rc == KVPS_OK) rc = kvps_ring_wait(r, q1, -1);
    if (rc == KVPS_OK) rc = kvps_ring_wait(r, q2, -1);
    if (rc == KVPS_OK) bad |= c[0] != (float)size || d[0] != 2.0f * (float)size;
    if (rc != KVPS_OK) fprintf(stderr, "ring-job rank %d: %s: %s\n", rank, kvps_result_str(rc), kvps_ring_last_error(r));
    kvps_ring_destroy(&r);
    free(a); free(b); free(c); free(d);
    if (rc != KVPS_OK || bad) { fprintf(stderr, "ring-job rank %d: wrong results\n", rank); return 1; }
    printf("ring-job rank %d ok\n", rank);
    return 0;
}

/* ---- the tests ------------------------------------------------------------------------------- */

/* What the ps job's files must hold: its tensors' slice keys and servers, its raw keys' servers,
   as the worker lays them out (kvps.h's sharding), for 2 servers. */
static void ps_spec(char *buf, size_t cap) {
    const char *names[2] = {"layer1.w", ODD_NAME}, *jnames[2] = {"layer1.w", ODD_NAME_JSON};
    const size_t lens[2] = {BIG_LEN, SMALL_LEN};
    const int n = 2;
    size_t used = (size_t)snprintf(buf, cap, "{\"workers\": 2, \"servers\": %d, \"steps\": %d, \"barriers\": 2, \"raw_len\": %d, \"tensors\": [",
                                   n, PS_STEPS, PS_RAW_LEN);
    for (int t = 0; t < 2; t++) {
        /* kvps_worker_tensor: min(n, ceil(len / 1024)) slices, slice i on server (h + i) mod n */
        uint64_t h = kvps__fnv1a(names[t]), base = (1ull << 63) | ((h & 0x7fffffffffffull) << 16);
        uint64_t ns = (lens[t] + 1023) / 1024;
        if (ns > (uint64_t)n) ns = (uint64_t)n;
        used += (size_t)snprintf(buf + used, cap - used, "%s{\"name\": \"%s\", \"len\": %zu, \"keys\": [", t ? ", " : "", jnames[t], lens[t]);
        for (uint64_t i = 0; i < ns; i++)
            used += (size_t)snprintf(buf + used, cap - used, "%s\"%llu\"", i ? ", " : "", (unsigned long long)(base | i));
        used += (size_t)snprintf(buf + used, cap - used, "], \"servers\": [");
        for (uint64_t i = 0; i < ns; i++)
            used += (size_t)snprintf(buf + used, cap - used, "%s%d", i ? ", " : "", (int)((h % (uint64_t)n + i) % (uint64_t)n));
        used += (size_t)snprintf(buf + used, cap - used, "]}");
    }
    used += (size_t)snprintf(buf + used, cap - used, "], \"raw_keys\": [");
    for (int i = 0; i < PS_RAW_KEYS; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s{\"key\": \"%llu\", \"server\": %d}", i ? ", " : "",
                                 (unsigned long long)raw_keys[i], (int)(kvps__mix64(raw_keys[i]) % (uint64_t)n));
    snprintf(buf + used, cap - used, "]}");
}

static void test_ps_job_under_kvps_run(void) {
    char dir[4200], spec[4096], *out;
    fresh_dir(dir, sizeof dir, "ps");
    int rc = kt_run_cmd(root, &out, "env -u KVPS_TIMELINE timeout 120 scripts/kvps-run -s 2 -w 2 --server-wait 1 --timeout 90 --timeline '%s' -- '%s' --ps-job",
                        dir, self);
    KT_CHECK(rc == 0, "kvps-run: exit %d", rc);
    KT_CHECK(strstr(out, "[worker 0] ps-job worker 0 ok") && strstr(out, "[worker 1] ps-job worker 1 ok"), "the job's results");
    /* kvps-run merged and summarised at the end */
    KT_CHECK(strstr(out, "kvps-timeline: 4 files in"), "kvps-run did not merge the timeline");
    KT_CHECK(strstr(out, "pushpull x10:"), "summary: no 'pushpull x10' (2 tensors x %d steps)", PS_STEPS);
    KT_CHECK(strstr(out, "straggler wait"), "summary: no straggler wait");
    if (kt_cur_failed) { show(out); free(out); return; }
    free(out);
    ps_spec(spec, sizeof spec);
    check_with("ps", dir, spec);
    char merged[4300];
    snprintf(merged, sizeof merged, "%s/timeline.json", dir);
    rc = kt_run_cmd(root, &out, "python3 tests/timeline_check.py merged '%s' 4", merged);
    KT_CHECK(rc == 0 && strstr(out, "check: ok"), "merged file: exit %d", rc);
    KT_CHECK(strstr(out, "processes: server 0, server 1, worker 0, worker 1"), "merged: processes not in order");
    /* rounds: 2 slices x 5 steps + 1 slice x 5 steps + 3 raw keys, every tensor slice named */
    KT_CHECK(strstr(out, "rounds: 18, named after their tensor: 15"), "merged: rounds or their names");
    if (kt_cur_failed) show(out);
    free(out);
    /* the picture, where gnuplot is */
    if (access("/usr/bin/gnuplot", X_OK) == 0) {
        rc = kt_run_cmd(root, &out, "scripts/kvps-timeline '%s' -o '%s/m2.json' --png '%s/t.png' --quiet && head -c 8 '%s/t.png' | od -An -c",
                        dir, tmp, tmp, tmp);
        KT_CHECK(rc == 0 && strstr(out, "P   N   G"), "--png: exit %d, not a PNG", rc);
        if (kt_cur_failed) show(out);
        free(out);
    }
}

static void test_ring_job_under_kvps_run(void) {
    char dir[4200], *out;
    fresh_dir(dir, sizeof dir, "ring");
    int rc = kt_run_cmd(root, &out, "env -u KVPS_TIMELINE timeout 120 scripts/kvps-run -s 0 -w 3 --timeout 90 --timeline '%s' -- '%s' --ring-job", dir, self);
    KT_CHECK(rc == 0, "kvps-run: exit %d", rc);
    for (int r = 0; r < 3; r++) {
        char want[64];
        snprintf(want, sizeof want, "[worker %d] ring-job rank %d ok", r, r);
        KT_CHECK(strstr(out, want), "missing '%s'", want);
    }
    if (kt_cur_failed) { show(out); free(out); return; }
    free(out);
    /* 3 ranks: the ring has 2 steps per phase; recursive doubling folds rank 0 into rank 1
       (2 is not a power of two), then ranks 1 and 2 exchange once; the barrier's dissemination
       takes 2 rounds */
    static const char *spec =
        "{\"ranks\": 3, \"colls\": ["
        "{\"coll\": \"allreduce\", \"algorithm\": \"ring\", \"count\": 300000, \"phases\": {\"reduce-scatter\": 1, "
        "\"reduce-scatter step 0\": 2, \"reduce-scatter step 1\": 2, \"all-gather\": 1, \"all-gather step 0\": 2, "
        "\"all-gather step 1\": 2}},"
        "{\"coll\": \"allreduce\", \"algorithm\": \"rd\", \"count\": 1000, \"phases\": ["
        "{\"fold: hand over, wait for the result\": 1},"
        "{\"fold\": 1, \"recursive doubling\": 1, \"recursive doubling step 0\": 2},"
        "{\"recursive doubling\": 1, \"recursive doubling step 0\": 2}]},"
        "{\"coll\": \"broadcast\", \"algorithm\": \"binomial tree\", \"count\": 1000, \"phases\": {\"tree broadcast\": 1}},"
        "{\"coll\": \"allgather\", \"algorithm\": \"ring\", \"count\": 1000, \"phases\": {\"all-gather\": 1, "
        "\"all-gather step 0\": 2, \"all-gather step 1\": 2}},"
        "{\"coll\": \"barrier\", \"algorithm\": \"dissemination\", \"phases\": {\"dissemination step 0\": 1, "
        "\"dissemination step 1\": 1}},"
        "{\"coll\": \"allreduce\", \"algorithm\": \"rd\", \"count\": 1000, \"posted\": true, \"phases\": ["
        "{\"fold: hand over, wait for the result\": 1},"
        "{\"fold\": 1, \"recursive doubling\": 1, \"recursive doubling step 0\": 2},"
        "{\"recursive doubling\": 1, \"recursive doubling step 0\": 2}]},"
        "{\"coll\": \"allreduce\", \"algorithm\": \"rd\", \"count\": 1000, \"posted\": true, \"phases\": ["
        "{\"fold: hand over, wait for the result\": 1},"
        "{\"fold\": 1, \"recursive doubling\": 1, \"recursive doubling step 0\": 2},"
        "{\"recursive doubling\": 1, \"recursive doubling step 0\": 2}]}"
        "]}";
    check_with("ring", dir, spec);
    char merged[4300];
    snprintf(merged, sizeof merged, "%s/timeline.json", dir);
    rc = kt_run_cmd(root, &out, "python3 tests/timeline_check.py merged '%s' 3", merged);
    KT_CHECK(rc == 0 && strstr(out, "processes: ring rank 0, ring rank 1, ring rank 2"), "merged: exit %d", rc);
    if (kt_cur_failed) show(out);
    free(out);
}

/* Without --timeline (and KVPS_TIMELINE unset) the same job, run from an empty directory, leaves
   it empty and writes no timeline directory. */
static void test_off_under_kvps_run(void) {
    char dir[4200], *out;
    fresh_dir(dir, sizeof dir, "off");
    int rc = kt_run_cmd(root, &out, "cd '%s' && env -u KVPS_TIMELINE timeout 120 '%s/scripts/kvps-run' -s 2 -w 2 --server-wait 1 --timeout 90 -- '%s' --ps-job",
                        dir, root, self);
    KT_CHECK(rc == 0, "kvps-run: exit %d", rc);
    KT_CHECK(strstr(out, "ps-job worker 1 ok"), "the job's results");
    KT_CHECK(!strstr(out, "kvps-timeline"), "kvps-run merged a timeline that was not asked for");
    KT_CHECK(count_files(dir) == 0, "%d files appeared in the job's directory", count_files(dir));
    if (kt_cur_failed) show(out);
    free(out);
}

/* In a process: no timeline unless asked; "" turns KVPS_TIMELINE off; KVPS_TIMELINE turns it on. */
static void test_off_unless_asked(void) {
    char dir[4200];
    fresh_dir(dir, sizeof dir, "env");
    unsetenv("KVPS_TIMELINE");
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 1) setenv("KVPS_TIMELINE", dir, 1);
        const char *field = pass == 1 ? "" : NULL; /* pass 2: the variable, desc NULL */
        if (pass == 2) setenv("KVPS_TIMELINE", dir, 1);
        kvps_server *s = NULL;
        kvps_worker *w = NULL;
        kvps_ring *r = NULL;
        KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1, .timeline = field}, &s));
        if (!s) break;
        KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(s), .timeline = field}, &w));
        KT_OK(kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 1, .bind = "tcp://127.0.0.1:*", .timeline = field}, &r));
        int on = pass == 2;
        KT_CHECK((s->tl != NULL) == on && w && (w->tl != NULL) == on && r && (r->tl != NULL) == on,
                 "pass %d: timelines server %d worker %d ring %d, expected %d", pass, s->tl != NULL, w && w->tl, r && r->tl, on);
        kvps_ring_destroy(&r);
        kvps_worker_destroy(&w);
        kvps_server_destroy(&s);
        KT_CHECK(count_files(dir) == (on ? 3 : 0), "pass %d: %d files in %s", pass, count_files(dir), dir);
    }
    unsetenv("KVPS_TIMELINE");
}

/* Names that need escaping come back as they were; a file written in several 64 KiB pieces holds
   every event, and nests. */
static void test_strings_and_big_files(void) {
    char dir[4200], path[4300], spec[2048];
    fresh_dir(dir, sizeof dir, "strings");
    /* 150 bytes: quotes, backslash, newline, tab, 0x01, a byte that is not UTF-8 (0xff), the euro sign */
    char name[160];
    memset(name, 'n', sizeof name);
    memcpy(name, "a\"b\\c\nd\te\x01" "f\xffg\xe2\x82\xac", 16);
    name[150] = 0;
    kvps_server *s = NULL;
    kvps_worker *w = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1, .timeline = dir}, &s));
    if (!s) return;
    kvps_server_start(s);
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(s), .timeline = dir}, &w));
    kvps_tensor t;
    KT_OK(kvps_worker_tensor(w, name, 4, &t));
    float g[4] = {1, 1, 1, 1}, v[4];
    enum { N = 6000 };
    kvps_req q;
    for (int i = 0; i < N && !kt_cur_failed; i++) {
        KT_OK(kvps_worker_pushpull_tensor(w, t, g, v, &q));
        KT_OK(kvps_worker_wait(w, q, -1));
    }
    kvps_worker_destroy(&w);
    kvps_server_destroy(&s);
    KT_CHECK(find_file(dir, "kvps-worker-0-", path, sizeof path), "no worker file in %s", dir);
    struct stat st;
    KT_CHECK(stat(path, &st) == 0 && st.st_size > 2 * KVPS__TL_BUF, "the worker file is %lld bytes: expected several 64 KiB writes",
             (long long)st.st_size);
    /* Python's replacement decoding of the bytes is the oracle: the name as JSON must decode to it */
    char *out;
    int rc = kt_run_cmd(root, &out, "python3 -c \"import json,sys; b=bytes.fromhex(sys.argv[1]); print(json.dumps(b.decode('utf-8','replace')))\" %s",
                        "6122625c630a6409650166ff67e282ac");
    KT_CHECK(rc == 0, "python3: exit %d", rc);
    char want[256];
    snprintf(want, sizeof want, "%.*s", (int)strcspn(out, "\n") - 2, out + 1); /* without the quotes */
    free(out);
    char tail[140];
    memset(tail, 'n', 134);
    tail[134] = 0;
    snprintf(spec, sizeof spec, "{\"count\": {\"pushpull %s%s\": %d}, \"names\": [\"tensor %s%s\"]}", want, tail, N, want, tail);
    check_with("events", path, spec);
    KT_CHECK(find_file(dir, "kvps-server-0-", path, sizeof path), "no server file in %s", dir);
    snprintf(spec, sizeof spec, "{\"count\": {\"round %s%s[0]\": %d}}", want, tail, N); /* the server knows the name */
    check_with("events", path, spec);
}

/* A process killed with SIGKILL: its files are whole JSON (the closing brackets follow every
   write; one is written at the first event a second after the last). */
static void test_killed_process_leaves_json(void) {
    char dir[4200], path[4300];
    fresh_dir(dir, sizeof dir, "killed");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(30);
        kvps_server *s = NULL;
        kvps_worker *w = NULL;
        if (kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1, .timeline = dir}, &s)) _exit(3);
        kvps_server_start(s);
        if (kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(s), .timeline = dir}, &w)) _exit(3);
        kvps_tensor t;
        float g[4] = {1, 1, 1, 1}, v[4];
        kvps_worker_tensor(w, "w", 4, &t);
        for (int64_t end = kt_now_ms() + 1300; kt_now_ms() < end;) {
            kvps_req q;
            if (kvps_worker_pushpull_tensor(w, t, g, v, &q) || kvps_worker_wait(w, q, -1)) _exit(4);
        }
        raise(SIGKILL);
        _exit(5);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    KT_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the child ended otherwise (status 0x%x)", st);
    KT_CHECK(find_file(dir, "kvps-worker-0-", path, sizeof path), "no worker file");
    check_with("events", path, "{\"min_count\": {\"pushpull w\": 1}}");
    KT_CHECK(find_file(dir, "kvps-server-0-", path, sizeof path), "no server file");
    check_with("events", path, "{\"min_count\": {\"round w[0]\": 1}}");
}

/* An async server: pushes counted in windows of 100 ms, each push once (small keys applied one
   by one, and a large tensor's pushes applied together in one pass). */
static void test_async_windows(void) {
    char dir[4200], path[4300], spec[512];
    fresh_dir(dir, sizeof dir, "async");
    kvps_server *s = NULL;
    kvps_worker *w = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1, .consistency = KVPS_ASYNC,
                                                 .update = KVPS_UPDATE_ACCUMULATE, .timeline = dir}, &s));
    if (!s) return;
    kvps_server_start(s);
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(s), .timeline = ""}, &w));
    kvps_tensor small, big;
    enum { BIG = 20000, W = 8 };
    static float g[BIG];
    for (int i = 0; i < BIG; i++) g[i] = 1.0f;
    KT_OK(kvps_worker_tensor(w, "small", 4, &small));
    KT_OK(kvps_worker_tensor(w, "big", BIG, &big));
    long n = 0, nbig = 0;
    kvps_req q[W];
    for (int64_t end = kt_now_ms() + 350; kt_now_ms() < end && !kt_cur_failed; n++) {
        KT_OK(kvps_worker_push_tensor(w, small, g, &q[0]));
        KT_OK(kvps_worker_wait(w, q[0], -1));
    }
    for (int round = 0; round < 20 && !kt_cur_failed; round++) { /* W in flight: the server fuses them */
        for (int i = 0; i < W; i++) KT_OK(kvps_worker_push_tensor(w, big, g, &q[i]));
        for (int i = 0; i < W; i++) KT_OK(kvps_worker_wait(w, q[i], -1));
        nbig += W;
    }
    kvps_server_stats st;
    kvps_server_stats_get(s, &st);
    kvps_worker_destroy(&w);
    kvps_server_destroy(&s);
    KT_CHECK(count_files(dir) == 1, "%d files (the worker's timeline was turned off with \"\")", count_files(dir));
    KT_CHECK(find_file(dir, "kvps-server-0-", path, sizeof path), "no server file");
    /* every push counted once; windows of at most 100 ms (and a little) between first and last push */
    snprintf(spec, sizeof spec, "{\"sum\": {\"async applies.pushes\": %ld}, \"min_count\": {\"async applies\": 3}, "
             "\"max_dur\": {\"async applies\": 120000}}", n + nbig);
    check_with("events", path, spec);
    KT_CHECK(st.fused > 0, "no pushes were fused (the deferred path was not exercised)");
}

/* Requests in flight together on one tensor go on lanes of their own (and nest); sparse rows
   have their row, with how many rows and bytes. */
static void test_lanes_and_rows(void) {
    char dir[4200], path[4300], spec[512];
    fresh_dir(dir, sizeof dir, "lanes");
    kvps_server *s = NULL;
    kvps_worker *w = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1, .consistency = KVPS_ASYNC,
                                                 .update = KVPS_UPDATE_ACCUMULATE, .timeline = ""}, &s));
    if (!s) return;
    kvps_server_start(s);
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(s), .timeline = dir}, &w));
    kvps_tensor t;
    kvps_table tab;
    enum { W = 8, DIM = 4, ROWS = 10 };
    float g[64] = {0}, rows[ROWS * DIM] = {0};
    uint64_t ids[ROWS];
    for (int i = 0; i < ROWS; i++) ids[i] = (uint64_t)i * 1000003u;
    kvps_req q[W];
    KT_OK(kvps_worker_tensor(w, "w", 64, &t));
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < W; i++) KT_OK(kvps_worker_push_tensor(w, t, g, &q[i]));
        for (int i = W - 1; i >= 0; i--) KT_OK(kvps_worker_wait(w, q[i], -1)); /* the last posted ends first */
    }
    KT_OK(kvps_worker_table(w, &(kvps_table_desc){.name = "emb", .dim = DIM}, &tab, &q[0]));
    KT_OK(kvps_worker_wait(w, q[0], -1));
    KT_OK(kvps_worker_push_rows(w, tab, ids, rows, ROWS, &q[0]));
    KT_OK(kvps_worker_wait(w, q[0], -1));
    KT_OK(kvps_worker_pull_rows(w, tab, ids, rows, ROWS, &q[0]));
    KT_OK(kvps_worker_wait(w, q[0], -1));
    kvps_worker_destroy(&w);
    kvps_server_destroy(&s);
    KT_CHECK(find_file(dir, "kvps-worker-0-", path, sizeof path), "no worker file");
    snprintf(spec, sizeof spec, "{\"count\": {\"push w\": %d, \"push_rows\": 1, \"pull_rows\": 1}, "
             "\"names\": [\"tensor w\", \"tensor w (lane 2)\", \"tensor w (lane %d)\", \"rows\"], "
             "\"sum\": {\"push_rows.rows\": %d, \"push_rows.bytes\": %d, \"pull_rows.rows\": %d}}",
             3 * W, W, ROWS, ROWS * DIM * 4, ROWS);
    check_with("events", path, spec);
}

/* A timeline that cannot be written refuses create, for all three kinds of object. */
static void test_bad_dir_refused(void) {
    const char *bad = "/proc/self/no/such/dir";
    kvps_server *s = NULL;
    kvps_worker *w = NULL;
    kvps_ring *r = NULL;
    kvps_log_set_level(KVPS_LOG_NONE);
    kvps_result rs = kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1, .timeline = bad}, &s);
    kvps_result rw = kvps_worker_create(&(kvps_worker_desc){.servers = "tcp://127.0.0.1:9", .timeline = bad}, &w);
    kvps_result rr = kvps_ring_create(&(kvps_ring_desc){.rank = 0, .size = 1, .bind = "tcp://127.0.0.1:*", .timeline = bad}, &r);
    kvps_log_set_level(KVPS_LOG_WARN);
    KT_CHECK(rs == KVPS_ERR_CONFIG && !s, "server: %s", kvps_result_str(rs));
    KT_CHECK(rw == KVPS_ERR_CONFIG && !w, "worker: %s", kvps_result_str(rw));
    KT_CHECK(rr == KVPS_ERR_CONFIG && !r, "ring: %s", kvps_result_str(rr));
    kvps_server_destroy(&s);
    kvps_worker_destroy(&w);
    kvps_ring_destroy(&r);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--ps-job") == 0) return ps_job();
    if (argc > 1 && strcmp(argv[1], "--ring-job") == 0) return ring_job();
    if (!realpath(argv[0], self)) { perror(argv[0]); return 1; }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", self);
    *strrchr(dir, '/') = 0;
    if (access("scripts/kvps-run", X_OK) == 0 && access("tests/timeline_check.py", R_OK) == 0) {
        if (!getcwd(root, sizeof root)) return 1;
    } else {
        snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/..");
        if (!realpath(dir, root)) { perror(dir); return 1; }
    }
    snprintf(tmp, sizeof tmp, "%s/kvps-test-timeline.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmp)) { perror("mkdtemp"); return 1; }
    signal(SIGPIPE, SIG_IGN);
    char *out;
    if (kt_run_cmd(root, &out, "python3 -c 'import json'") != 0) {
        printf("skip: no python3 (the timeline is read back with its json module)\n");
        free(out);
        printf("0 passed, 0 failed, 1 skipped\n");
        return 0;
    }
    free(out);
    KT_RUN(test_off_unless_asked, 60);
    KT_RUN(test_bad_dir_refused, 60);
    KT_RUN(test_strings_and_big_files, 120);
    KT_RUN(test_killed_process_leaves_json, 60);
    KT_RUN(test_async_windows, 60);
    KT_RUN(test_lanes_and_rows, 60);
    KT_RUN(test_ps_job_under_kvps_run, 150);
    KT_RUN(test_ring_job_under_kvps_run, 150);
    KT_RUN(test_off_under_kvps_run, 150);
    kt_run_cmd(root, &out, "rm -rf '%s'", tmp);
    free(out);
    return kt_finish();
}
