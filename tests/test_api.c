/* The API's front door: bad server and worker descs (each refused with its result, *out
   cleared, endpoints already taken), the KVPS_* environment as kvps_env_read and
   kvps_env_launched read it (a table of named cases), and every result's string. The ring's
   descs and environment: test_ring_api.c; malformed requests on the wire: test_badinput.c. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"
#include <ctype.h>

static char g_bind_log[600];
static void grab_bind_log(void *user, kvps_log_level lv, const char *msg) {
    (void)user; (void)lv;
    if (strstr(msg, "cannot bind")) snprintf(g_bind_log, sizeof g_bind_log, "%s", msg);
}

static void test_server_bad_desc(void) {
    static const struct { const char *name; kvps_server_desc d; kvps_result want; } cs[] = {
        {"num_workers 0", {.endpoint = "inproc://api-d", .num_workers = 0}, KVPS_ERR_CONFIG},
        {"num_workers -1", {.endpoint = "inproc://api-d", .num_workers = -1}, KVPS_ERR_CONFIG},
        {"no endpoint", {.endpoint = NULL, .num_workers = 1}, KVPS_ERR_CONFIG},
        {"rank -1", {.endpoint = "inproc://api-d", .num_workers = 1, .rank = -1}, KVPS_ERR_CONFIG},
        {"io_threads -1", {.endpoint = "inproc://api-d", .num_workers = 1, .io_threads = -1}, KVPS_ERR_CONFIG},
        {"consistency 4", {.endpoint = "inproc://api-d", .num_workers = 1, .consistency = (kvps_consistency)4}, KVPS_ERR_CONFIG},
        {"consistency -1", {.endpoint = "inproc://api-d", .num_workers = 1, .consistency = (kvps_consistency)-1}, KVPS_ERR_CONFIG},
        {"update 4", {.endpoint = "inproc://api-d", .num_workers = 1, .update = (kvps_update)4}, KVPS_ERR_CONFIG},
        {"CUSTOM without update_fn", {.endpoint = "inproc://api-d", .num_workers = 1, .update = KVPS_UPDATE_CUSTOM}, KVPS_ERR_CONFIG},
        {"unbindable address", {.endpoint = "tcp://999.1.1.1:1", .num_workers = 1}, KVPS_ERR_BIND},
        {"unknown transport", {.endpoint = "bogus://x", .num_workers = 1}, KVPS_ERR_BIND},
        {"empty endpoint", {.endpoint = "", .num_workers = 1}, KVPS_ERR_BIND},
        {"no scheme", {.endpoint = "127.0.0.1:5555", .num_workers = 1}, KVPS_ERR_BIND},
        /* what cannot work is refused at once (issue 17): a rate no rule reads, heartbeats that
           would drop idle connections */
        {"lr with MEAN", {.endpoint = "inproc://api-d", .num_workers = 1, .lr = 0.1f}, KVPS_ERR_CONFIG},
        {"lr with SUM", {.endpoint = "inproc://api-d", .num_workers = 1, .update = KVPS_UPDATE_ACCUMULATE, .lr = 0.1f}, KVPS_ERR_CONFIG},
        {"peer_timeout = heartbeat", {.endpoint = "inproc://api-d", .num_workers = 1, .heartbeat_ms = 2000, .peer_timeout_ms = 2000},
         KVPS_ERR_CONFIG},
        {"peer_timeout under 2 default heartbeats", {.endpoint = "inproc://api-d", .num_workers = 1, .peer_timeout_ms = 1999},
         KVPS_ERR_CONFIG},
        {"heartbeat over half the default timeout", {.endpoint = "inproc://api-d", .num_workers = 1, .heartbeat_ms = 2501},
         KVPS_ERR_CONFIG},
        {"peer_timeout -5", {.endpoint = "inproc://api-d", .num_workers = 1, .peer_timeout_ms = -5}, KVPS_ERR_CONFIG},
        {"heartbeat -2", {.endpoint = "inproc://api-d", .num_workers = 1, .heartbeat_ms = -2}, KVPS_ERR_CONFIG},
    };
    char marker;
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        kvps_server *s = (kvps_server *)(void *)&marker;
        kvps_result r = kvps_server_create(&cs[i].d, &s);
        KT_CHECK(r == cs[i].want, "%s: %s, want %s", cs[i].name, kvps_result_str(r), kvps_result_str(cs[i].want));
        KT_CHECK(s == NULL, "%s: *out not cleared", cs[i].name);
        if (r == KVPS_OK && s) kvps_server_destroy(&s);
    }
    kvps_server *s = NULL;
    KT_CHECK(kvps_server_create(NULL, &s) == KVPS_ERR_INVALID_ARG, "NULL desc");
    KT_CHECK(kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://x", .num_workers = 1}, NULL) ==
                 KVPS_ERR_INVALID_ARG, "NULL out");
    /* an endpoint already taken, on tcp and on inproc */
    kt_cluster c;
    if (kt_cluster_up(&c, "tcp", 1, &(kvps_server_desc){.num_workers = 1}) == 0) {
        g_bind_log[0] = 0;
        kvps_log_set_fn(grab_bind_log, NULL);
        kvps_log_level before = (kvps_log_level)kvps__log_level_get();
        kvps_log_set_level(KVPS_LOG_ERROR);
        kvps_result r = kvps_server_create(&(kvps_server_desc){.endpoint = kvps_server_endpoint(c.srv[0]), .num_workers = 1}, &s);
        kvps_log_set_fn(NULL, NULL);
        kvps_log_set_level(before);
        KT_CHECK(r == KVPS_ERR_BIND && !s, "tcp port in use: %s", kvps_result_str(r));
        char want[400]; /* the role, the endpoint and the system's words */
        snprintf(want, sizeof want, "server 0: cannot bind its endpoint '%s' (the server's ZeroMQ socket): Address already in use",
                 kvps_server_endpoint(c.srv[0]));
        KT_CHECK(strstr(g_bind_log, want) != NULL, "the log says '%s', want '%s'", g_bind_log, want);
        kvps_server_destroy(&s);
    }
    kt_cluster_down(&c);
    if (kt_cluster_up(&c, "inproc", 1, &(kvps_server_desc){.num_workers = 1}) == 0) {
        kvps_result r = kvps_server_create(
            &(kvps_server_desc){.endpoint = kvps_server_endpoint(c.srv[0]), .num_workers = 1, .zmq_ctx = c.ctx}, &s);
        KT_CHECK(r == KVPS_ERR_BIND && !s, "inproc name in use: %s", kvps_result_str(r));
        kvps_server_destroy(&s);
    }
    kt_cluster_down(&c);
}

static void test_worker_bad_desc(void) {
    static const struct { const char *name; kvps_worker_desc d; kvps_result want; } cs[] = {
        {"no servers", {.servers = NULL}, KVPS_ERR_CONFIG},
        {"empty server list", {.servers = ""}, KVPS_ERR_CONFIG},
        {"blank server list", {.servers = " , "}, KVPS_ERR_CONFIG},
        {"empty entry", {.servers = "inproc://a,,inproc://b"}, KVPS_ERR_CONFIG},
        {"trailing comma", {.servers = "inproc://a,"}, KVPS_ERR_CONFIG},
        {"rank -1", {.servers = "inproc://a", .rank = -1}, KVPS_ERR_CONFIG},
        {"rank = num_workers", {.servers = "inproc://a", .rank = 2, .num_workers = 2}, KVPS_ERR_CONFIG},
        {"num_workers -1", {.servers = "inproc://a", .num_workers = -1}, KVPS_ERR_CONFIG},
        {"timeout -1", {.servers = "inproc://a", .timeout_ms = -1}, KVPS_ERR_CONFIG},
        {"io_threads -1", {.servers = "inproc://a", .io_threads = -1}, KVPS_ERR_CONFIG},
        {"unknown transport", {.servers = "bogus://x"}, KVPS_ERR_CONNECT},
        {"second endpoint bad", {.servers = "inproc://a,nonsense"}, KVPS_ERR_CONNECT},
        {"peer_timeout = heartbeat", {.servers = "inproc://a", .heartbeat_ms = 1000, .peer_timeout_ms = 1000}, KVPS_ERR_CONFIG},
        {"peer_timeout under 2 heartbeats", {.servers = "inproc://a", .heartbeat_ms = 100, .peer_timeout_ms = 150}, KVPS_ERR_CONFIG},
        {"peer_timeout -1", {.servers = "inproc://a", .peer_timeout_ms = -1}, KVPS_ERR_CONFIG},
    };
    char marker;
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        kvps_worker *w = (kvps_worker *)(void *)&marker;
        kvps_result r = kvps_worker_create(&cs[i].d, &w);
        KT_CHECK(r == cs[i].want, "%s: %s, want %s", cs[i].name, kvps_result_str(r), kvps_result_str(cs[i].want));
        KT_CHECK(w == NULL, "%s: *out not cleared", cs[i].name);
        if (r == KVPS_OK && w) kvps_worker_destroy(&w);
    }
    kvps_worker *w = NULL;
    KT_CHECK(kvps_worker_create(NULL, &w) == KVPS_ERR_INVALID_ARG, "NULL desc");
    KT_CHECK(kvps_worker_create(&(kvps_worker_desc){.servers = "inproc://a"}, NULL) == KVPS_ERR_INVALID_ARG, "NULL out");
}

static const char *api_env_vars[] = {"KVPS_SERVERS", "KVPS_NUM_WORKERS", "KVPS_RANK", "OMPI_COMM_WORLD_RANK",
                                    "PMI_RANK", "SLURM_PROCID", "KVPS_ROLE"};

static void test_env(void) {
    static const struct {
        const char *name;
        const char *var[7]; /* as api_env_vars; NULL: unset */
        kvps_result want;
        kvps_role role;
        int rank, nservers, nworkers;
        const char *endpoint;
    } cs[] = {
#define SV "tcp://a:1, tcp://b:2"
#define ENVFAIL KVPS_ERR_ENV, KVPS_ROLE_NONE, 0, 0, 0, ""
        {"nothing set", {NULL}, ENVFAIL},
        {"KVPS_SERVERS empty", {"", "4", "0", NULL, NULL, NULL, "worker"}, ENVFAIL},
        {"KVPS_SERVERS ','", {",", "4", "0", NULL, NULL, NULL, "worker"}, ENVFAIL},
        {"KVPS_SERVERS with an empty entry", {"tcp://a:1,,tcp://b:2", "4", "0", NULL, NULL, NULL, "worker"}, ENVFAIL},
        {"KVPS_SERVERS blank", {"   ", "4", "0", NULL, NULL, NULL, "worker"}, ENVFAIL},
        {"KVPS_NUM_WORKERS unset", {SV, NULL, "0", NULL, NULL, NULL, "worker"}, ENVFAIL},
        {"KVPS_NUM_WORKERS 0", {SV, "0", "0", NULL, NULL, NULL, "worker"}, ENVFAIL},
        {"KVPS_NUM_WORKERS -1", {SV, "-1", "0", NULL, NULL, NULL, "worker"}, ENVFAIL},
        {"KVPS_NUM_WORKERS 4x", {SV, "4x", "0", NULL, NULL, NULL, "worker"}, ENVFAIL},
        {"KVPS_NUM_WORKERS abc", {SV, "abc", "0", NULL, NULL, NULL, "worker"}, ENVFAIL},
        {"KVPS_NUM_WORKERS 2^64", {SV, "18446744073709551616", "0", NULL, NULL, NULL, "worker"}, ENVFAIL},
        {"KVPS_RANK x", {SV, "4", "x", NULL, NULL, NULL, "worker"}, ENVFAIL},
        {"KVPS_RANK -1", {SV, "4", "-1", NULL, NULL, NULL, "worker"}, ENVFAIL},
        {"KVPS_RANK 1.5", {SV, "4", "1.5", NULL, NULL, NULL, "worker"}, ENVFAIL},
        {"KVPS_RANK garbage, OMPI rank fine", {SV, "4", "zz", "3", NULL, NULL, NULL}, ENVFAIL},
        {"no rank anywhere", {SV, "4", NULL, NULL, NULL, NULL, "worker"}, ENVFAIL},
        {"OMPI rank garbage", {SV, "4", NULL, "three", NULL, NULL, NULL}, ENVFAIL},
        {"KVPS_ROLE boss", {SV, "4", "0", NULL, NULL, NULL, "boss"}, ENVFAIL},
        {"KVPS_ROLE Server (case)", {SV, "4", "0", NULL, NULL, NULL, "Server"}, ENVFAIL},
        {"server rank 2 of 2", {SV, "4", "2", NULL, NULL, NULL, "server"}, ENVFAIL},
        {"worker rank 4 of 4", {SV, "4", "4", NULL, NULL, NULL, "worker"}, ENVFAIL},
        {"OMPI rank 6: worker 4 of 4", {SV, "4", NULL, "6", NULL, NULL, NULL}, ENVFAIL},
        {"server 1", {SV, "4", "1", NULL, NULL, NULL, "server"}, KVPS_OK, KVPS_ROLE_SERVER, 1, 2, 4, "tcp://b:2"},
        {"server 0", {SV, "4", "0", NULL, NULL, NULL, "server"}, KVPS_OK, KVPS_ROLE_SERVER, 0, 2, 4, "tcp://a:1"},
        {"worker 3", {SV, "4", "3", NULL, NULL, NULL, "worker"}, KVPS_OK, KVPS_ROLE_WORKER, 3, 2, 4, ""},
        {"OMPI rank 0: server 0", {SV, "4", NULL, "0", NULL, NULL, NULL}, KVPS_OK, KVPS_ROLE_SERVER, 0, 2, 4, "tcp://a:1"},
        {"OMPI rank 1: server 1", {SV, "4", NULL, "1", NULL, NULL, NULL}, KVPS_OK, KVPS_ROLE_SERVER, 1, 2, 4, "tcp://b:2"},
        {"OMPI rank 3: worker 1", {SV, "4", NULL, "3", NULL, NULL, NULL}, KVPS_OK, KVPS_ROLE_WORKER, 1, 2, 4, ""},
        {"OMPI rank 5: worker 3", {SV, "4", NULL, "5", NULL, NULL, NULL}, KVPS_OK, KVPS_ROLE_WORKER, 3, 2, 4, ""},
        {"empty KVPS_ROLE: from the rank", {SV, "4", NULL, "2", NULL, NULL, ""}, KVPS_OK, KVPS_ROLE_WORKER, 0, 2, 4, ""},
        {"KVPS_RANK before OMPI", {SV, "4", "1", "5", NULL, NULL, NULL}, KVPS_OK, KVPS_ROLE_SERVER, 1, 2, 4, "tcp://b:2"},
        {"empty KVPS_RANK: OMPI", {SV, "4", "", "4", NULL, NULL, NULL}, KVPS_OK, KVPS_ROLE_WORKER, 2, 2, 4, ""},
        {"PMI_RANK", {SV, "4", NULL, NULL, "2", NULL, NULL}, KVPS_OK, KVPS_ROLE_WORKER, 0, 2, 4, ""},
        {"SLURM_PROCID", {SV, "4", NULL, NULL, NULL, "1", NULL}, KVPS_OK, KVPS_ROLE_SERVER, 1, 2, 4, "tcp://b:2"},
        {"one server, explicit worker", {"ipc:///tmp/x", "1", "0", NULL, NULL, NULL, "worker"}, KVPS_OK, KVPS_ROLE_WORKER, 0, 1, 1, ""},
#undef SV
#undef ENVFAIL
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        for (int v = 0; v < 7; v++) {
            if (cs[i].var[v]) setenv(api_env_vars[v], cs[i].var[v], 1);
            else unsetenv(api_env_vars[v]);
        }
        kvps_env env;
        memset(&env, 0xab, sizeof env);
        kvps_result r = kvps_env_read(&env);
        KT_CHECK(r == cs[i].want, "%s: %s, want %s", cs[i].name, kvps_result_str(r), kvps_result_str(cs[i].want));
        if (r != KVPS_OK || cs[i].want != KVPS_OK) continue;
        KT_CHECK(env.role == cs[i].role && env.rank == cs[i].rank && env.num_servers == cs[i].nservers &&
                     env.num_workers == cs[i].nworkers,
                 "%s: role %d rank %d servers %d workers %d, want %d %d %d %d", cs[i].name, (int)env.role, env.rank,
                 env.num_servers, env.num_workers, (int)cs[i].role, cs[i].rank, cs[i].nservers, cs[i].nworkers);
        KT_CHECK(strcmp(env.endpoint, cs[i].endpoint) == 0, "%s: endpoint '%s', want '%s'", cs[i].name, env.endpoint,
                 cs[i].endpoint);
        KT_CHECK(env.servers && strcmp(env.servers, cs[i].var[0]) == 0, "%s: servers '%s'", cs[i].name,
                 env.servers ? env.servers : "(null)");
    }
    for (int v = 0; v < 7; v++) unsetenv(api_env_vars[v]);
}

/* kvps_env_launched: a launcher's variables, each alone, and srun's only with several tasks. */
static void test_env_launched(void) {
    static const char *vars[] = {"KVPS_ROLE", "KVPS_SERVERS", "KVPS_RANK", "KVPS_RING_PEERS", "OMPI_COMM_WORLD_RANK",
                                 "PMI_RANK", "SLURM_PROCID", "SLURM_NTASKS"};
    enum { NV = sizeof vars / sizeof vars[0] };
    for (int v = 0; v < NV; v++) unsetenv(vars[v]);
    KT_CHECK(kvps_env_launched() == 0, "nothing set: launched");
    for (int v = 0; v < 6; v++) {
        setenv(vars[v], "", 1);
        KT_CHECK(kvps_env_launched() == 0, "%s empty: launched", vars[v]);
        setenv(vars[v], "0", 1);
        KT_CHECK(kvps_env_launched() == 1, "%s=0: not launched", vars[v]);
        unsetenv(vars[v]);
    }
    setenv("SLURM_PROCID", "0", 1);
    KT_CHECK(kvps_env_launched() == 0, "SLURM_PROCID without SLURM_NTASKS: launched");
    setenv("SLURM_NTASKS", "1", 1);
    KT_CHECK(kvps_env_launched() == 0, "one srun task: launched");
    setenv("SLURM_NTASKS", "4", 1);
    KT_CHECK(kvps_env_launched() == 1, "srun -n 4: not launched");
    unsetenv("SLURM_PROCID");
    KT_CHECK(kvps_env_launched() == 0, "SLURM_NTASKS alone: launched");
    for (int v = 0; v < NV; v++) unsetenv(vars[v]);
}

static void test_result_strings(void) {
#define API_STR(name, value, text)                                                                  \
    KT_CHECK(strncmp(kvps_result_str(name), #name ": ", strlen(#name) + 2) == 0 &&                 \
                 strcmp(kvps_result_str(name) + strlen(#name) + 2, text) == 0 && (value) <= 0,   \
             "%s", kvps_result_str(name));
    KVPS__RESULTS(API_STR)
#undef API_STR
    KT_CHECK(strcmp(kvps_result_str((kvps_result)12345), "unknown kvps_result") == 0, "unknown code");
    KT_CHECK(strcmp(kvps_result_str((kvps_result)7), "unknown kvps_result") == 0, "unknown code 7");
}

/* Every non-OK return of a worker call leaves last_error saying why, naming the argument or
   the thing at fault (issue 17: "last_error set on every non-OK return, naming the argument").
   Each case: the call's result and a piece of text only that call's message has. */
#define API_CASE(want, text, call)                                                                       \
    do {                                                                                                 \
        kvps_result r_ = (call);                                                                         \
        const char *e_ = kvps_worker_last_error(w);                                                      \
        KT_CHECK(r_ == (want) && strstr(e_, text) != NULL, "%s: got %s, last_error '%s', want %s and '%s'", \
                 #call, kvps_result_str(r_), e_, kvps_result_str(want), text);                            \
        n++;                                                                                             \
    } while (0)

/* The edges that are accepted: a timeout of exactly two heartbeats, no heartbeats at all (any
   timeout), lr with SGD. */
static void test_desc_edges_accepted(void) {
    kvps_server *s = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://api-e1", .num_workers = 1, .heartbeat_ms = 500,
                                                  .peer_timeout_ms = 1000, .update = KVPS_UPDATE_SGD, .lr = 0.5f}, &s));
    kvps_server_destroy(&s);
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "inproc://api-e2", .num_workers = 1, .heartbeat_ms = -1,
                                                  .peer_timeout_ms = 10}, &s));
    kvps_server_destroy(&s);
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = "inproc://a", .heartbeat_ms = 100, .peer_timeout_ms = 200}, &w));
    kvps_worker_destroy(&w);
}

/* A tensor request in flight while more tensors are registered (w->tensors grows and moves):
   its reply still lands in the right tensor's stats (it used to write through a stale pointer:
   a use after free that asan-test reports). And a server's error about a tensor's slice names
   the tensor: two workers registering "shared" with different lengths. */
static void test_tensor_requests_and_names(void) {
    kvps_server *s = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 2}, &s));
    KT_OK(kvps_server_start(s));
    kvps_worker *w = NULL, *w2 = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(s), .rank = 0, .num_workers = 2}, &w));
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(s), .rank = 1, .num_workers = 2}, &w2));
    enum { N = 40 };
    kvps_tensor t[N];
    char name[16];
    for (int i = 0; i < 16; i++) { snprintf(name, sizeof name, "t%d", i); KT_OK(kvps_worker_tensor(w, name, 4, &t[i])); }
    float v[10] = {0};
    kvps_req q;
    KT_OK(kvps_worker_pull_tensor(w, t[3], v, &q));
    for (int i = 16; i < N; i++) { snprintf(name, sizeof name, "t%d", i); KT_OK(kvps_worker_tensor(w, name, 4, &t[i])); }
    KT_OK(kvps_worker_wait(w, q, 5000));
    kvps_tensor_stats st;
    KT_OK(kvps_worker_tensor_stats(w, t[3], &st));
    KT_CHECK(st.pulls == 1 && st.pull_raw_bytes == 16, "t3: %llu pulls, %llu bytes", (unsigned long long)st.pulls,
             (unsigned long long)st.pull_raw_bytes);
    kvps_tensor a, b;
    KT_OK(kvps_worker_tensor(w, "shared", 8, &a));
    KT_OK(kvps_worker_push_tensor(w, a, v, &q));
    KT_OK(kvps_worker_wait(w, q, 5000)); /* (its name is in first: answered in order) */
    KT_OK(kvps_worker_tensor(w2, "shared", 10, &b));
    /* the server refuses w2's name of the tensor (NAME, sent at registration), or its push:
       whichever w2 hears of first, the error names the tensor */
    kvps_result r = kvps_worker_push_tensor(w2, b, v, &q);
    if (r == KVPS_OK) r = kvps_worker_wait(w2, q, 5000);
    KT_CHECK(r == KVPS_ERR_LEN_MISMATCH && strstr(kvps_worker_last_error(w2), "tensor 'shared'"),
             "%s, '%s': want KVPS_ERR_LEN_MISMATCH naming tensor 'shared'", kvps_result_str(r), kvps_worker_last_error(w2));
    /* once the name's refusal is in, the tensor's calls say both lengths */
    kvps_worker_barrier(w2, &q); /* (answered after the name: the server answers in order) */
    kvps_worker_wait(w2, q, 200);
    r = kvps_worker_push_tensor(w2, b, v, &q);
    KT_CHECK(r == KVPS_ERR_LEN_MISMATCH && strstr(kvps_worker_last_error(w2), "worker 1 registered it with 10 floats, worker 0 with 8"),
             "%s, '%s': want both lengths named", kvps_result_str(r), kvps_worker_last_error(w2));
    kvps_worker_destroy(&w);
    kvps_worker_destroy(&w2);
    kvps_server_destroy(&s);
}

static void test_worker_last_error(void) {
    kvps_server *s = NULL;
    KT_OK(kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1}, &s));
    KT_OK(kvps_server_start(s));
    kvps_worker *w = NULL;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = kvps_server_endpoint(s)}, &w));
    uint64_t keys[2] = {1, 2}, bad_keys[2] = {1, 1ull << 63};
    size_t lens[2] = {4, 4}, bad_lens[2] = {4, 0};
    float v[8] = {0};
    kvps_req q;
    int done, n = 0;
    kvps_tensor t;
    KT_OK(kvps_worker_tensor(w, "weights", 8, &t));
    API_CASE(KVPS_ERR_INVALID_ARG, "push: keys is NULL", kvps_worker_push(w, NULL, v, lens, 2, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "push: lens is NULL", kvps_worker_push(w, keys, v, NULL, 2, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "push: out is NULL", kvps_worker_push(w, keys, v, lens, 2, NULL));
    API_CASE(KVPS_ERR_INVALID_ARG, "push: nkeys is 0", kvps_worker_push(w, keys, v, lens, 0, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "push: vals is NULL", kvps_worker_push(w, keys, NULL, lens, 2, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "pull: vals (the destination) is NULL", kvps_worker_pull(w, keys, NULL, lens, 2, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "pushpull: vals is NULL", kvps_worker_pushpull(w, keys, NULL, v, lens, 2, &q));
    API_CASE(KVPS_ERR_KEY_RESERVED, "push: keys[1] = 9223372036854775808", kvps_worker_push(w, bad_keys, v, lens, 2, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "init: lens[1] is 0 (key 2)", kvps_worker_init(w, keys, v, bad_lens, 2, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "tensor: name is NULL", kvps_worker_tensor(w, NULL, 8, &t));
    API_CASE(KVPS_ERR_INVALID_ARG, "tensor: out is NULL", kvps_worker_tensor(w, "x", 8, NULL));
    API_CASE(KVPS_ERR_INVALID_ARG, "tensor: the name is empty", kvps_worker_tensor(w, "", 8, &t));
    API_CASE(KVPS_ERR_INVALID_ARG, "tensor 'x': len is 0", kvps_worker_tensor(w, "x", 0, &t));
    API_CASE(KVPS_ERR_TENSOR, "tensor 'weights': already registered", kvps_worker_tensor(w, "weights", 8, &t));
    API_CASE(KVPS_ERR_TENSOR, "push: tensor 99 is not registered (this worker has 1)", kvps_worker_push_tensor(w, 99, v, &q));
    API_CASE(KVPS_ERR_TENSOR, "pull: tensor -1 is not registered", kvps_worker_pull_tensor(w, -1, v, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "push of tensor 'weights': the values are NULL", kvps_worker_push_tensor(w, t, NULL, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "pull of tensor 'weights': the destination is NULL", kvps_worker_pull_tensor(w, t, NULL, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "pushpull: out is NULL", kvps_worker_pushpull_tensor(w, t, v, v, NULL));
    API_CASE(KVPS_ERR_INVALID_ARG, "pull_tensor_view: view is NULL", kvps_worker_pull_tensor_view(w, t, NULL, &q));
    kvps_codec topk = kvps_codec_get(KVPS_CODEC_TOPK), fp16 = kvps_codec_get(KVPS_CODEC_FP16);
    API_CASE(KVPS_ERR_INVALID_ARG, "tensor 'weights': pull codec is sparse", kvps_worker_tensor_codec(w, t, NULL, &topk, 0));
    API_CASE(KVPS_ERR_INVALID_ARG, "error_feedback is not 0 or 1", kvps_worker_tensor_codec(w, t, &fp16, NULL, 2));
    API_CASE(KVPS_ERR_TENSOR, "tensor_codec: tensor 7 is not registered", kvps_worker_tensor_codec(w, 7, &fp16, NULL, 0));
    API_CASE(KVPS_ERR_INVALID_ARG, "tensor_optim of tensor 'weights': rule 200 is not a kvps_rule",
             kvps_worker_tensor_optim(w, t, &(kvps_optim){.rule = (kvps_rule)200}, &q));
    API_CASE(KVPS_ERR_HYPERPARAM, "tensor_optim of tensor 'weights': beta1 (in [0, 1)) out of range",
             kvps_worker_tensor_optim(w, t, &(kvps_optim){.rule = KVPS_RULE_ADAM, .beta1 = 1.0f}, &q));
    API_CASE(KVPS_ERR_HYPERPARAM, "lr (>= 0) out of range", kvps_worker_tensor_optim(w, t, &(kvps_optim){.rule = KVPS_RULE_SGD, .lr = -1}, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "tensor_optim: o is NULL", kvps_worker_tensor_optim(w, t, NULL, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "easgd: alpha 1.5 is not in (0, 1)", kvps_worker_easgd(w, t, v, 1.5f, 100));
    API_CASE(KVPS_ERR_INVALID_ARG, "easgd: local is NULL", kvps_worker_easgd(w, t, NULL, 0.5f, 100));
    kvps_tensor_stats ts;
    API_CASE(KVPS_ERR_INVALID_ARG, "tensor_stats: out is NULL", kvps_worker_tensor_stats(w, t, NULL));
    API_CASE(KVPS_ERR_TENSOR, "tensor_stats: tensor 3 is not registered", kvps_worker_tensor_stats(w, 3, &ts));
    kvps_table tb;
    kvps_table_desc td = {.name = "emb", .dim = 4};
    API_CASE(KVPS_ERR_INVALID_ARG, "table 'emb': dim 0 is not 1 to 2^20",
             kvps_worker_table(w, &(kvps_table_desc){.name = "emb", .dim = 0}, &tb, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "table: the desc has no name", kvps_worker_table(w, &(kvps_table_desc){.dim = 4}, &tb, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "table 'emb': init_scale -1 is not", kvps_worker_table(w, &(kvps_table_desc){.name = "emb", .dim = 4, .init_scale = -1}, &tb, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "table 'emb': rule 42 is not a kvps_rule",
             kvps_worker_table(w, &(kvps_table_desc){.name = "emb", .dim = 4, .opt = {.rule = (kvps_rule)42}}, &tb, &q));
    KT_OK(kvps_worker_table(w, &td, &tb, &q));
    KT_OK(kvps_worker_wait(w, q, 5000));
    API_CASE(KVPS_ERR_TABLE, "table 'emb': registered twice on this worker", kvps_worker_table(w, &td, &tb, &q));
    uint64_t ids[2] = {5, 6};
    API_CASE(KVPS_ERR_TABLE, "push_rows: table 5 is not registered (this worker has 1)", kvps_worker_push_rows(w, 5, ids, v, 2, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "push_rows: grads is NULL", kvps_worker_push_rows(w, tb, ids, NULL, 2, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "pull_rows: rows is NULL", kvps_worker_pull_rows(w, tb, ids, NULL, 2, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "pull_rows: nrows is 0", kvps_worker_pull_rows(w, tb, ids, v, 0, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "pull_rows: ids is NULL", kvps_worker_pull_rows(w, tb, NULL, v, 2, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "barrier: out is NULL", kvps_worker_barrier(w, NULL));
    API_CASE(KVPS_ERR_INVALID_REQ, "wait: request 123456 is unknown or already completed", kvps_worker_wait(w, 123456, 10));
    API_CASE(KVPS_ERR_INVALID_REQ, "test: request 123456 is unknown", kvps_worker_test(w, 123456, &done));
    KT_OK(kvps_worker_barrier(w, &q));
    API_CASE(KVPS_ERR_INVALID_ARG, "test: done is NULL", kvps_worker_test(w, q, NULL));
    KT_OK(kvps_worker_wait(w, q, 5000));
    KT_CHECK(n == 45, "%d cases", n);
    kvps_worker_destroy(&w);
    kvps_server_destroy(&s);
}

/* ---- the manuals agree with the code ------------------------------------------------------ */

/* The repository's root: where kvps.h is, from the working directory or the program's (build/..). */
static const char *repo_root(void) {
    static char root[4096];
    if (root[0]) return root;
    if (access("kvps.h", R_OK) == 0) return strcpy(root, ".");
    ssize_t n = readlink("/proc/self/exe", root, sizeof root - 8);
    if (n <= 0) return strcpy(root, ".");
    root[n] = 0;
    for (int up = 0; up < 2; up++) { char *s = strrchr(root, '/'); if (s) *s = 0; }
    return root;
}

static char *read_text(const char *name) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", repo_root(), name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = (char *)malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

/* The manual's WIRE FORMAT (section 6, OPS) lists every op by number and name, as the code's ops
   table (KVPS__OPS) has them, and names the protocol release the code sends in HELLO. */
static void test_wire_format_lists_every_op(void) {
    char *m = read_text("kvps.h");
    KT_CHECK(m != NULL, "cannot read kvps.h");
    if (!m) return;
    const char *ops = strstr(m, "     OPS (protocol release ");
    KT_CHECK(ops != NULL, "kvps.h's manual has no OPS list");
    if (!ops) { free(m); return; }
    int proto = atoi(ops + strlen("     OPS (protocol release "));
    KT_CHECK(proto == KVPS__PROTO, "the manual says protocol release %d, the code sends %d", proto, KVPS__PROTO);
    const char *hello = strstr(ops, " HELLO        u32 protocol ");
    KT_CHECK(hello && atoi(hello + strlen(" HELLO        u32 protocol ")) == KVPS__PROTO,
             "the manual's HELLO does not name protocol %d", KVPS__PROTO);
    int seen[KVPS__OP_COUNT] = {0}, listed = 0;
    const char *line = strchr(ops, '\n') + 1;
    line = strchr(line, '\n') + 1; /* (the sentence after the heading) */
    line = strchr(line, '\n') + 1; /* (the column names) */
    for (; line && strncmp(line, "       ", 7) == 0; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        int num = 0, used = 0;
        char name[32];
        if (strspn(line, " ") > 9 || sscanf(line, " %d %31s%n", &num, name, &used) != 2) continue; /* a continuation line */
        listed++;
        KT_CHECK(num > 0 && num < KVPS__OP_COUNT, "the manual lists op %d (%s), which the code does not have", num, name);
        if (num <= 0 || num >= KVPS__OP_COUNT) continue;
        seen[num]++;
        char want[32];
        size_t i;
        for (i = 0; kvps__ops[num].name[i] && i + 1 < sizeof want; i++)
            want[i] = (char)toupper((unsigned char)kvps__ops[num].name[i]);
        want[i] = 0;
        KT_CHECK(strcmp(name, want) == 0, "the manual calls op %d %s, the code %s", num, name, want);
    }
    for (int op = 1; op < KVPS__OP_COUNT; op++)
        KT_CHECK(seen[op] == 1, "op %d (%s) is listed %d times in the manual's OPS", op, kvps__ops[op].name, seen[op]);
    KT_CHECK(listed == KVPS__OP_COUNT - 1, "the manual lists %d ops, the code has %d", listed, KVPS__OP_COUNT - 1);
    free(m);
}

/* Each header's implementation map (the comment that says where to find `// >>name`) names
   exactly the sections that header has, no more, no fewer. */
static void test_maps_name_every_section(void) {
    static const char *headers[] = {"kvps_core.h", "kvps_codec.h", "kvps_launch.h", "kvps.h", "kvps_ring.h", "kvps_fuse.h", "kvps_gpu.h", "kvps_abi.h"};
    for (size_t h = 0; h < sizeof headers / sizeof headers[0]; h++) {
        char *m = read_text(headers[h]);
        KT_CHECK(m != NULL, "cannot read %s", headers[h]);
        if (!m) continue;
        char markers[64][40], mapped[64][40];
        int nmark = 0, nmap = 0;
        for (const char *p = m; (p = strstr(p, "\n// >>")) != NULL; p++) {
            int l = 0;
            p += 6;
            while (p[l] && p[l] != '\n' && p[l] != ' ' && l < 39) l++;
            if (nmark < 64) { memcpy(markers[nmark], p, (size_t)l); markers[nmark++][l] = 0; }
        }
        const char *map = strstr(m, ">>name`):");
        if (!map) map = strstr(m, ">>name\"), lowest layer first:");
        KT_CHECK(map != NULL, "%s has no implementation map", headers[h]);
        if (!map) { free(m); continue; }
        const char *end = strstr(map, "*/");
        for (const char *line = strchr(map, '\n') + 1; line && line < end; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
            if (strncmp(line, "     ", 5) != 0 || line[5] == ' ') continue; /* a continuation */
            const char *p = line + 5;
            for (;;) { /* "name", or "a, b, c", then two spaces */
                int l = 0;
                while (p[l] && p[l] != ',' && p[l] != ' ' && p[l] != '\n' && l < 39) l++;
                if (nmap < 64) { memcpy(mapped[nmap], p, (size_t)l); mapped[nmap++][l] = 0; }
                if (p[l] != ',') break;
                p += l + 2;
            }
        }
        for (int i = 0; i < nmark; i++) {
            int found = 0;
            for (int j = 0; j < nmap; j++) found |= strcmp(markers[i], mapped[j]) == 0;
            KT_CHECK(found, "%s: section >>%s is not in the map", headers[h], markers[i]);
        }
        for (int j = 0; j < nmap; j++) {
            int found = 0;
            for (int i = 0; i < nmark; i++) found |= strcmp(markers[i], mapped[j]) == 0;
            KT_CHECK(found, "%s: the map names %s, which has no // >>%s", headers[h], mapped[j], mapped[j]);
        }
        free(m);
    }
}

int main(void) {
    kvps_log_set_level(KVPS_LOG_NONE); /* the expected errors would flood the output */
    KT_RUN(test_server_bad_desc);
    KT_RUN(test_worker_bad_desc);
    KT_RUN(test_env);
    KT_RUN(test_env_launched);
    KT_RUN(test_result_strings);
    KT_RUN(test_worker_last_error);
    KT_RUN(test_tensor_requests_and_names);
    KT_RUN(test_desc_edges_accepted);
    KT_RUN(test_wire_format_lists_every_op);
    KT_RUN(test_maps_name_every_section);
    return kt_finish();
}
