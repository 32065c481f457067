/* test_launch - kvps_launch.h: a job formed from its launcher's variables and one rendezvous
   address, as torchrun, mpirun and srun start it.

     test_launch_read       the variables: each missing or malformed one named; torchrun's local
                            rank; KVPS_RENDEZVOUS over MASTER_ADDR; beside torchrun's own store
     test_ifname_match      KVPS_IFNAME's matcher against an independent oracle, every spec of a
                            set of tokens with each of '', '^', '=', '^=' over a set of names
     test_iface_pick        the chooser over made-up interface lists (down ones skipped,
                            loopback only when asked or when nothing else is up)
     test_wire              the rendezvous decoder: every message the writer makes is read back;
                            every shorter cut, a byte more, a string over its limit, a bad magic,
                            version, type, size or rank is refused
     test_ring_torchrun     4 processes with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT alone form
                            a ring (kvps_ring_env_read) whose all-reduces equal the naive sums;
                            their local ranks are 0..3 of 4 (from the table)
     test_ring_mpi_slurm    the same from Open MPI's (OMPI_COMM_WORLD_*, KVPS_RENDEZVOUS) and
                            Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) variables
     test_ps_torchrun       2 servers + 3 workers from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
                            and KVPS_NUM_SERVERS (kvps_env_read): the pushed sums, exactly
     test_rendezvous_faults a rank that never comes (named, on every rank, at the timeout), a
                            size that differs, a rank launched twice, a stranger's garbage and a
                            wrong job token (refused, the job forms), no rank 0 (named), a
                            rendezvous host that does not resolve (named with its port)
   Every process is a fork of this one; every port is on 127.0.0.1. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "kvps_ring.h"
#include "kvps_test.h"

#include <sys/wait.h>

/* Every variable a launcher may set, cleared in a child before it sets its own. */
static const char *const launch_vars[] = {"KVPS_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "KVPS_SIZE",
                                          "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "KVPS_RING_PEERS",
                                          "KVPS_SERVERS", "KVPS_ROLE", "KVPS_NUM_WORKERS", "KVPS_NUM_SERVERS", "MASTER_ADDR",
                                          "MASTER_PORT", "KVPS_RENDEZVOUS", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_LOCALID",
                                          "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "KVPS_JOB_TOKEN",
                                          "KVPS_RENDEZVOUS_TIMEOUT", "KVPS_IFNAME", "TORCHELASTIC_USE_AGENT_STORE"};

/* ---- KVPS_IFNAME's matcher ---- */

/* The oracle: written from NCCL's description, not from the code under test. */
static int oracle_match(const char *spec, const char *name) {
    char buf[256];
    int neg = 0, exact = 0;
    if (spec[0] == '^') { neg = 1; spec++; }
    if (spec[0] == '=') { exact = 1; spec++; }
    snprintf(buf, sizeof buf, "%s", spec);
    int hit = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (exact ? strcmp(tok, name) == 0 : strncmp(tok, name, strlen(tok)) == 0) hit = 1;
    }
    return neg ? !hit : hit;
}

static void test_ifname_match(void) {
    static const char *names[] = {"lo", "eth0", "eth1", "ens3", "docker0", "veth12", "ib0", "e", "eth"};
    static const char *toks[] = {"e", "eth", "eth0", "lo", "docker", "ib0", "x", "ens3", "eth01"};
    static const char *pre[] = {"", "^", "=", "^="};
    int n = 0;
    for (int p = 0; p < 4; p++)
        for (int a = 0; a < 9; a++)
            for (int b = -1; b < 9; b++) {
                char spec[64];
                snprintf(spec, sizeof spec, "%s%s%s%s", pre[p], toks[a], b >= 0 ? "," : "", b >= 0 ? toks[b] : "");
                for (int k = 0; k < 9; k++, n++)
                    KT_CHECK(kvps__ifname_match(spec, names[k]) == oracle_match(spec, names[k]), "spec '%s' name '%s': %d, oracle %d",
                             spec, names[k], kvps__ifname_match(spec, names[k]), oracle_match(spec, names[k]));
            }
    KT_CHECK(n == 4 * 9 * 10 * 9, "%d cases", n);
    /* the forms NCCL's manual shows */
    KT_CHECK(kvps__ifname_match("eth", "eth0") && !kvps__ifname_match("=eth", "eth0") && kvps__ifname_match("=eth0", "eth0"),
             "prefix / exact");
    KT_CHECK(!kvps__ifname_match("^docker,lo", "docker0") && kvps__ifname_match("^docker,lo", "eth0"), "exclusion");
}

static void test_iface_pick(void) {
    kvps__iface a[] = {{"lo", "127.0.0.1", 1, 1}, {"eth0", "10.0.0.2", 0, 0}, {"eth1", "10.1.0.2", 1, 0}, {"ib0", "10.2.0.2", 1, 0}};
    KT_CHECK(kvps__iface_pick(a, 4, NULL, 0) == 2, "default: %d, want eth1 (eth0 is down)", kvps__iface_pick(a, 4, NULL, 0));
    KT_CHECK(kvps__iface_pick(a, 4, "", 1) == 0, "loopback asked: %d", kvps__iface_pick(a, 4, "", 1));
    KT_CHECK(kvps__iface_pick(a, 4, "ib", 0) == 3, "KVPS_IFNAME=ib: %d", kvps__iface_pick(a, 4, "ib", 0));
    KT_CHECK(kvps__iface_pick(a, 4, "eth0", 0) == -1, "eth0 is down: %d", kvps__iface_pick(a, 4, "eth0", 0));
    KT_CHECK(kvps__iface_pick(a, 4, "^eth,lo", 0) == 3, "^eth,lo: %d", kvps__iface_pick(a, 4, "^eth,lo", 0));
    KT_CHECK(kvps__iface_pick(a, 4, "=lo", 0) == 0, "=lo named: %d", kvps__iface_pick(a, 4, "=lo", 0));
    kvps__iface only_lo[] = {{"lo", "127.0.0.1", 1, 1}, {"eth0", "10.0.0.2", 0, 0}};
    KT_CHECK(kvps__iface_pick(only_lo, 2, NULL, 0) == 0, "nothing else up: loopback (%d)", kvps__iface_pick(only_lo, 2, NULL, 0));
    KT_CHECK(kvps__iface_pick(a, 0, NULL, 0) == -1, "no interfaces");
    /* the real call: a KVPS_IFNAME that matches nothing names itself and lists what there is */
    char ip[64];
    setenv("KVPS_IFNAME", "=nosuchcard0", 1);
    KT_CHECK(kvps_launch_address(0, ip, sizeof ip) == KVPS_ERR_ENV && strstr(kvps_launch_last_error(), "KVPS_IFNAME='=nosuchcard0'") &&
             strstr(kvps_launch_last_error(), "lo 127.0.0.1"), "no match: '%s'", kvps_launch_last_error());
    setenv("KVPS_IFNAME", "lo", 1);
    KT_CHECK(kvps_launch_address(0, ip, sizeof ip) == KVPS_OK && strcmp(ip, "127.0.0.1") == 0, "KVPS_IFNAME=lo: %s", ip);
    unsetenv("KVPS_IFNAME");
    KT_CHECK(kvps_launch_address(1, ip, sizeof ip) == KVPS_OK && strcmp(ip, "127.0.0.1") == 0, "loopback rendezvous: %s", ip);
}

/* ---- the launcher's variables ---- */
static void clear_launch_vars(void);
static void test_launch_read(void) {
    kvps_launch l;
    clear_launch_vars();
    KT_CHECK(kvps_launch_read(&l) == KVPS_ERR_ENV && strstr(kvps_launch_last_error(), "no rank: none of KVPS_RANK, RANK,"),
             "nothing set: '%s'", kvps_launch_last_error());
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    KT_OK(kvps_launch_read(&l));
    KT_CHECK(l.rank == 1 && l.size == 4 && l.local_rank == 1 && l.local_size == 2 && !l.rendezvous[0] &&
             strcmp(l.rank_var, "RANK") == 0, "torchrun's variables: %d %d %d %d", l.rank, l.size, l.local_rank, l.local_size);
    int lr = -5, ls = -5;
    kvps_launch_local(&lr, &ls);
    KT_CHECK(lr == 1 && ls == 2, "kvps_launch_local: the launcher's %d %d", lr, ls);
    setenv("MASTER_ADDR", "node1", 1);
    KT_CHECK(kvps_launch_read(&l) == KVPS_ERR_ENV && strstr(kvps_launch_last_error(), "MASTER_ADDR is set but MASTER_PORT is not"),
             "no port: '%s'", kvps_launch_last_error());
    setenv("MASTER_PORT", "70000", 1);
    KT_CHECK(kvps_launch_read(&l) == KVPS_ERR_ENV && strstr(kvps_launch_last_error(), "MASTER_PORT is '70000', not a port"),
             "port 70000: '%s'", kvps_launch_last_error());
    setenv("MASTER_PORT", "29500", 1);
    KT_OK(kvps_launch_read(&l));
    KT_CHECK(strcmp(l.rendezvous, "node1:29500") == 0, "rendezvous '%s'", l.rendezvous);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1); /* torchrun's own store is at 29500 */
    KT_OK(kvps_launch_read(&l));
    KT_CHECK(strcmp(l.rendezvous, "node1:29501") == 0, "beside torchrun's store: '%s'", l.rendezvous);
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
    setenv("KVPS_RENDEZVOUS", "10.0.0.1:", 1);
    KT_CHECK(kvps_launch_read(&l) == KVPS_ERR_ENV && strstr(kvps_launch_last_error(), "KVPS_RENDEZVOUS is '10.0.0.1:', not host:port"),
             "bad KVPS_RENDEZVOUS: '%s'", kvps_launch_last_error());
    setenv("KVPS_RENDEZVOUS", "10.0.0.1:7000", 1); /* it wins over MASTER_ADDR */
    KT_OK(kvps_launch_read(&l));
    KT_CHECK(strcmp(l.rendezvous, "10.0.0.1:7000") == 0 && strcmp(l.rendezvous_var, "KVPS_RENDEZVOUS") == 0, "'%s'", l.rendezvous);
    setenv("LOCAL_RANK", "x", 1);
    KT_CHECK(kvps_launch_read(&l) == KVPS_ERR_ENV && strstr(kvps_launch_last_error(), "LOCAL_RANK is 'x', not a number"),
             "bad LOCAL_RANK: '%s'", kvps_launch_last_error());
    clear_launch_vars();
}

/* ---- the decoder ---- */

static void wire_message(kvps__rdv_buf *b, int type, uint32_t rank, uint32_t size) {
    kvps__rdv_put_hdr(b, (uint32_t)type, rank, size);
    if (type == KVPS__RDV_REGISTER) {
        uint64_t tok = 0x1234;
        kvps__rdv_put(b, &tok, 8);
        kvps__rdv_put_str(b, "ps 2", KVPS__RDV_SHAPE_MAX);
        kvps__rdv_put_str(b, "tcp://10.0.0.1:4000", KVPS__RDV_STR_MAX);
        kvps__rdv_put_str(b, "boot n1", KVPS__RDV_STR_MAX);
        kvps__rdv_put_str(b, "node1", KVPS__RDV_STR_MAX);
    } else if (type == KVPS__RDV_TABLE) {
        for (uint32_t i = 0; i < size; i++) {
            char ep[64];
            snprintf(ep, sizeof ep, "tcp://10.0.0.%u:4000", i);
            kvps__rdv_put_str(b, ep, KVPS__RDV_STR_MAX);
            kvps__rdv_put_str(b, i % 2 ? "boot n2" : "boot n1", KVPS__RDV_STR_MAX);
            kvps__rdv_put_str(b, "", KVPS__RDV_STR_MAX);
        }
    } else if (type == KVPS__RDV_ERROR) {
        kvps__rdv_put_str(b, "rank 3 did not register", KVPS__RDV_ERR_MAX);
    }
}

static void test_wire(void) {
    for (int type = 1; type <= 4; type++) {
        kvps__rdv_buf b = {NULL, 0, 0, 1};
        wire_message(&b, type, 2, 3);
        kvps__rdv_msg m;
        KT_CHECK(b.ok && kvps__rdv_parse(b.p, b.n, &m) == KVPS_OK && (int)m.type == type && m.rank == 2 && m.size == 3,
                 "type %d not read back", type);
        if (type == KVPS__RDV_REGISTER)
            KT_CHECK(m.token == 0x1234 && strcmp(m.shape, "ps 2") == 0 && strcmp(m.e.endpoint, "tcp://10.0.0.1:4000") == 0 &&
                     strcmp(m.e.host, "boot n1") == 0 && strcmp(m.e.name, "node1") == 0, "register's fields");
        if (type == KVPS__RDV_TABLE) {
            size_t off = 0;
            kvps__rdv_entry e;
            for (int i = 0; i < 3; i++) {
                char want[64];
                snprintf(want, sizeof want, "tcp://10.0.0.%d:4000", i);
                KT_CHECK(kvps__rdv_next(m.body, m.blen, &off, &e) && strcmp(e.endpoint, want) == 0, "table entry %d", i);
            }
        }
        if (type == KVPS__RDV_ERROR) KT_CHECK(strcmp(m.text, "rank 3 did not register") == 0, "error text '%s'", m.text);
        for (size_t cut = 0; cut < b.n; cut++)
            KT_CHECK(kvps__rdv_parse(b.p, cut, &m) != KVPS_OK, "type %d cut at %zu of %zu read as whole", type, cut, b.n);
        unsigned char *more = (unsigned char *)kt_xmalloc(b.n + 1);
        memcpy(more, b.p, b.n);
        more[b.n] = 0;
        KT_CHECK(kvps__rdv_parse(more, b.n + 1, &m) == KVPS_ERR_MALFORMED, "type %d with a byte more accepted", type);
        /* header fields one by one */
        memcpy(more, b.p, b.n);
        more[0] ^= 1;
        KT_CHECK(kvps__rdv_parse(more, b.n, &m) == KVPS_ERR_MAGIC, "bad magic");
        memcpy(more, b.p, b.n);
        more[4] = 2;
        KT_CHECK(kvps__rdv_parse(more, b.n, &m) == KVPS_ERR_VERSION, "version 2");
        memcpy(more, b.p, b.n);
        uint32_t big = 3;
        memcpy(more + 8, &big, 4); /* rank 3 of 3 */
        KT_CHECK(kvps__rdv_parse(more, b.n, &m) == KVPS_ERR_MALFORMED, "rank = size accepted");
        free(more);
        free(b.p);
    }
    kvps__rdv_buf b = {NULL, 0, 0, 1};
    kvps__rdv_put_hdr(&b, 9, 0, 1);
    kvps__rdv_msg m;
    KT_CHECK(kvps__rdv_parse(b.p, b.n, &m) == KVPS_ERR_OP, "type 9 accepted");
    free(b.p);
    /* a string over its limit (the writer never makes one: written by hand) */
    char longs[300];
    memset(longs, 'a', sizeof longs);
    longs[299] = 0;
    kvps__rdv_buf c = {NULL, 0, 0, 1};
    kvps__rdv_put_hdr(&c, KVPS__RDV_REGISTER, 0, 1);
    uint64_t tok = 0;
    uint16_t l = 299;
    kvps__rdv_put(&c, &tok, 8);
    kvps__rdv_put_str(&c, "ring", KVPS__RDV_SHAPE_MAX);
    kvps__rdv_put(&c, &l, 2);
    kvps__rdv_put(&c, longs, 299);
    kvps__rdv_put_str(&c, "h", KVPS__RDV_STR_MAX);
    kvps__rdv_put_str(&c, "n", KVPS__RDV_STR_MAX);
    KT_CHECK(kvps__rdv_parse(c.p, c.n, &m) == KVPS_ERR_MALFORMED, "an endpoint of 299 bytes accepted");
    free(c.p);
    /* a table of size 2^24 + 1 is refused before anything is read */
    kvps__rdv_buf d = {NULL, 0, 0, 1};
    kvps__rdv_put_hdr(&d, KVPS__RDV_TABLE, 0, (1u << 24) + 1);
    KT_CHECK(kvps__rdv_parse(d.p, d.n, &m) == KVPS_ERR_MALFORMED, "size 2^24 + 1 accepted");
    free(d.p);
}

/* ---- jobs of real processes ---- */

static void clear_launch_vars(void) {
    for (size_t i = 0; i < sizeof launch_vars / sizeof *launch_vars; i++) unsetenv(launch_vars[i]);
}

/* A port the kernel has free on 127.0.0.1 now. */
static int free_port(void) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* "NAME=value;NAME=value" into the environment (after clearing the launcher's variables). */
static void child_env(const char *assigns) {
    clear_launch_vars();
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", assigns);
    char *save = NULL;
    for (char *a = strtok_r(buf, ";", &save); a; a = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(a, '=');
        if (!eq) continue;
        *eq = 0;
        setenv(a, eq + 1, 1);
    }
}

static int32_t val(int r, size_t i) { return (int32_t)((r + 1) * 1000 + (int)(i % 997)); }

/* One ring rank: kvps_ring_env_read, create, all-reduces of 3 sizes against the naive sums, the
   local rank; exit status 0, or 10 + what failed (the error on stderr). want_local: the local
   rank and size the table must give (-1: the launcher's, not checked). */
static int ring_child(int want_lsize) {
    int rank = -1, size = -1;
    const char *peers = NULL;
    if (kvps_ring_env_read(&rank, &size, &peers) != KVPS_OK) return 11;
    kvps_ring *r = NULL;
    if (kvps_ring_create(&(kvps_ring_desc){.rank = rank, .size = size, .peers = peers, .timeout_ms = 30000}, &r) != KVPS_OK) return 12;
    static const size_t sizes[] = {1, 1000, 300000};
    int32_t *b = (int32_t *)malloc(300000 * sizeof *b);
    int bad = 0;
    for (int s = 0; s < 3 && !bad; s++) {
        for (size_t i = 0; i < sizes[s]; i++) b[i] = val(rank, i);
        if (kvps_ring_allreduce(r, b, b, sizes[s], KVPS_INT32, KVPS_SUM) != KVPS_OK) { bad = 13; break; }
        for (size_t i = 0; i < sizes[s]; i++) {
            int32_t want = 0;
            for (int k = 0; k < size; k++) want += val(k, i);
            if (b[i] != want) { fprintf(stderr, "rank %d: element %zu is %d, want %d\n", rank, i, b[i], want); bad = 14; break; }
        }
    }
    int lr = -2, ls = -2;
    kvps_launch_local(&lr, &ls);
    if (!bad && want_lsize > 0 && (lr != rank || ls != want_lsize)) {
        fprintf(stderr, "rank %d: local rank %d of %d, want %d of %d\n", rank, lr, ls, rank, want_lsize);
        bad = 15;
    }
    free(b);
    kvps_ring_destroy(&r);
    return bad;
}

/* Starts n children, child i with env_fmt's assignments (%d: its rank, then the port) and fn;
   waits for all (a hang guard of 60 s kills the rest); fills status[]. */
static void run_job(int n, const char *const *envs, int (*fn)(int), int arg, int *status) {
    pid_t pids[8];
    for (int i = 0; i < n; i++) {
        fflush(NULL);
        pids[i] = fork();
        if (pids[i] == 0) {
            child_env(envs[i]);
            _exit(fn(arg));
        }
    }
    int64_t deadline = kt_now_ms() + 60000;
    for (int i = 0; i < n; i++) {
        int st = kt_wait_pid(pids[i], deadline);
        status[i] = st < 0 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 100 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    }
}

static void ring_job(const char *what, const char *fmt) {
    int port = free_port(), st[4];
    char envs[4][512];
    const char *ev[4];
    for (int i = 0; i < 4; i++) { snprintf(envs[i], sizeof envs[i], fmt, i, port); ev[i] = envs[i]; }
    run_job(4, ev, ring_child, 4, st);
    for (int i = 0; i < 4; i++) KT_CHECK(st[i] == 0, "%s: rank %d ended with %d", what, i, st[i]);
}

static void test_ring_torchrun(void) {
    ring_job("torchrun", "RANK=%d;WORLD_SIZE=4;MASTER_ADDR=127.0.0.1;MASTER_PORT=%d");
}

static void test_ring_mpi_slurm(void) {
    ring_job("Open MPI", "OMPI_COMM_WORLD_RANK=%d;OMPI_COMM_WORLD_SIZE=4;KVPS_RENDEZVOUS=127.0.0.1:%d");
    ring_job("Slurm", "SLURM_PROCID=%d;SLURM_NTASKS=4;MASTER_ADDR=localhost;MASTER_PORT=%d");
}

/* ---- a parameter-server job ---- */
enum { PS_KEYS = 7, PS_STEPS = 5 };
static float ps_grad(int w, int step, int k) { return (float)((w + 1) * 100 + step * 10 + k); }

/* A server or worker of a job formed at the rendezvous: servers serve until every worker
   finished; workers push PS_STEPS rounds and pull the accumulated sums, checked exactly. */
static int ps_child(int unused) {
    (void)unused;
    kvps_env env;
    if (kvps_env_read(&env) != KVPS_OK) return 11;
    if (env.num_servers != 2 || env.num_workers != 3) return 16;
    if (env.role == KVPS_ROLE_SERVER) {
        kvps_server *s = NULL;
        kvps_result rc = kvps_server_create(&(kvps_server_desc){.endpoint = env.endpoint, .rank = env.rank,
                                                                .num_workers = env.num_workers,
                                                                .update = KVPS_UPDATE_ACCUMULATE}, &s);
        if (rc == KVPS_OK) rc = kvps_server_run(s);
        kvps_server_destroy(&s);
        return rc == KVPS_OK ? 0 : 12;
    }
    kvps_worker *w = NULL;
    kvps_tensor t;
    kvps_req q;
    float g[PS_KEYS], v[PS_KEYS];
    kvps_result rc = kvps_worker_create(&(kvps_worker_desc){.servers = env.servers, .rank = env.rank, .num_workers = env.num_workers,
                                                            .min_slice = 1}, &w);
    if (rc == KVPS_OK) rc = kvps_worker_tensor(w, "t", PS_KEYS, &t);
    for (int s = 0; rc == KVPS_OK && s < PS_STEPS; s++) {
        for (int k = 0; k < PS_KEYS; k++) g[k] = ps_grad(env.rank, s, k);
        rc = kvps_worker_pushpull_tensor(w, t, g, v, &q);
        if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, -1);
    }
    int bad = rc != KVPS_OK ? 13 : 0;
    for (int k = 0; !bad && k < PS_KEYS; k++) {
        float want = 0; /* integers: exact in any order */
        for (int s = 0; s < PS_STEPS; s++)
            for (int r = 0; r < 3; r++) want += ps_grad(r, s, k);
        if (v[k] != want) { fprintf(stderr, "worker %d: key %d is %g, want %g\n", env.rank, k, v[k], want); bad = 14; }
    }
    if (rc == KVPS_OK) rc = kvps_worker_finish(w, -1);
    kvps_worker_destroy(&w);
    return bad ? bad : rc == KVPS_OK ? 0 : 15;
}

static void test_ps_torchrun(void) {
    int port = free_port(), st[5];
    char envs[5][512];
    const char *ev[5];
    for (int i = 0; i < 5; i++) {
        snprintf(envs[i], sizeof envs[i], "RANK=%d;WORLD_SIZE=5;KVPS_NUM_SERVERS=2;MASTER_ADDR=127.0.0.1;MASTER_PORT=%d", i, port);
        ev[i] = envs[i];
    }
    run_job(5, ev, ps_child, 0, st);
    for (int i = 0; i < 5; i++) KT_CHECK(st[i] == 0, "rank %d (%s) ended with %d", i, i < 2 ? "server" : "worker", st[i]);
}

/* ---- faults ---- */

/* A rank that only meets: kvps_ring_env_read's result and words into a file of the test's. */
static char fault_dir[64];
static int meet_child(int unused) {
    (void)unused;
    kvps_log_set_level(KVPS_LOG_NONE);
    int rank = -1, size = -1;
    const char *peers = NULL;
    kvps_result rc = kvps_ring_env_read(&rank, &size, &peers);
    char path[128];
    const char *r = getenv("RANK");
    snprintf(path, sizeof path, "%s/%s-%d", fault_dir, r ? r : "x", (int)getpid());
    FILE *f = fopen(path, "w");
    if (f) { fprintf(f, "%d %s\n", (int)rc, kvps_ring_last_error(NULL)); fclose(f); }
    return rc == KVPS_OK ? 0 : 20;
}

/* The words of the child that ran as RANK=rank (the first file found). */
static int said(int rank, char *out, size_t cap) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "cat %s/%d-* 2>/dev/null | head -1", fault_dir, rank);
    FILE *p = popen(cmd, "r");
    out[0] = 0;
    if (p) { if (!fgets(out, (int)cap, p)) out[0] = 0; pclose(p); }
    return out[0] != 0;
}

static void clear_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -f %s/*", fault_dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot clear %s\n", fault_dir);
}

static void test_rendezvous_faults(void) {
    snprintf(fault_dir, sizeof fault_dir, "/tmp/kvps-launch-%d", (int)getpid());
    mkdir(fault_dir, 0700);
    char envs[4][512], w[1024];
    const char *ev[4];
    int st[4];
    /* 1. rank 3 never comes: every rank that came names it */
    int port = free_port();
    for (int i = 0; i < 3; i++) {
        snprintf(envs[i], sizeof envs[i], "RANK=%d;WORLD_SIZE=4;MASTER_ADDR=127.0.0.1;MASTER_PORT=%d;KVPS_RENDEZVOUS_TIMEOUT=2", i, port);
        ev[i] = envs[i];
    }
    clear_dir();
    run_job(3, ev, meet_child, 0, st);
    for (int i = 0; i < 3; i++) {
        KT_CHECK(st[i] == 20 && said(i, w, sizeof w) && atoi(w) == KVPS_ERR_TIMEOUT && strstr(w, "rank 3 of 4 did not register within 2 s"),
                 "missing rank 3: rank %d ended %d saying '%s'", i, st[i], w);
    }
    /* 2. rank 2 launched with another size */
    port = free_port();
    for (int i = 0; i < 3; i++) {
        snprintf(envs[i], sizeof envs[i], "RANK=%d;WORLD_SIZE=%d;MASTER_ADDR=127.0.0.1;MASTER_PORT=%d;KVPS_RENDEZVOUS_TIMEOUT=20", i,
                 i == 2 ? 4 : 3, port);
        ev[i] = envs[i];
    }
    clear_dir();
    run_job(3, ev, meet_child, 0, st);
    KT_CHECK(st[2] == 20 && said(2, w, sizeof w) && strstr(w, "rank 2 on host") && strstr(w, "says the job is 4 ranks"),
             "size 4 among 3: rank 2 ended %d saying '%s'", st[2], w);
    KT_CHECK(st[0] == 20 && said(0, w, sizeof w) && atoi(w) == KVPS_ERR_MISMATCH && strstr(w, "says the job is 4 ranks"),
             "size 4 among 3: rank 0 ended %d saying '%s'", st[0], w);
    /* 3. two processes as rank 1 */
    port = free_port();
    for (int i = 0; i < 4; i++) {
        snprintf(envs[i], sizeof envs[i], "RANK=%d;WORLD_SIZE=4;MASTER_ADDR=127.0.0.1;MASTER_PORT=%d;KVPS_RENDEZVOUS_TIMEOUT=20",
                 i == 3 ? 1 : i, port);
        ev[i] = envs[i];
    }
    clear_dir();
    run_job(4, ev, meet_child, 0, st);
    KT_CHECK(st[0] == 20 && said(0, w, sizeof w) && strstr(w, "rank 1 registered twice"), "rank 1 twice: rank 0 ended %d: '%s'", st[0], w);
    /* 4. a stranger's garbage and a registration with the wrong token are dropped; the job forms */
    port = free_port();
    for (int i = 0; i < 3; i++) {
        snprintf(envs[i], sizeof envs[i], "RANK=%d;WORLD_SIZE=3;MASTER_ADDR=127.0.0.1;MASTER_PORT=%d;KVPS_JOB_TOKEN=s3cret", i, port);
        ev[i] = envs[i];
    }
    pid_t stranger = fork();
    if (stranger == 0) { /* garbage, then rank 2 with another token, before the job's rank 2 comes */
        void *ctx = zmq_ctx_new(), *d = zmq_socket(ctx, ZMQ_DEALER);
        char ep[64];
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
        zmq_connect(d, ep);
        zmq_send(d, "GET / HTTP/1.0\r\n\r\n", 18, 0);
        kvps__rdv_buf b = {NULL, 0, 0, 1};
        uint64_t tok = kvps__token_digest("other");
        kvps__rdv_put_hdr(&b, KVPS__RDV_REGISTER, 2, 3);
        kvps__rdv_put(&b, &tok, 8);
        kvps__rdv_put_str(&b, "ring", KVPS__RDV_SHAPE_MAX);
        kvps__rdv_put_str(&b, "tcp://127.0.0.1:9", KVPS__RDV_STR_MAX);
        kvps__rdv_put_str(&b, "x", KVPS__RDV_STR_MAX);
        kvps__rdv_put_str(&b, "stranger", KVPS__RDV_STR_MAX);
        zmq_send(d, b.p, b.n, 0);
        char reply[2048];
        int n = zmq_recv(d, reply, sizeof reply, 0); /* the refusal */
        kvps__rdv_msg m;
        int ok = n > 0 && kvps__rdv_parse((unsigned char *)reply, (size_t)n, &m) == KVPS_OK && m.type == KVPS__RDV_ERROR &&
                 strstr(m.text, "job token");
        free(b.p);
        int zero = 0;
        zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
        zmq_close(d);
        zmq_ctx_term(ctx);
        _exit(ok ? 0 : 21);
    }
    pid_t job[3];
    for (int i = 0; i < 3; i++) {
        if (i == 2) { int sst = kt_wait_pid(stranger, kt_now_ms() + 30000); KT_CHECK(sst == 0, "the stranger was not refused by name (%d)", sst); }
        fflush(NULL);
        job[i] = fork();
        if (job[i] == 0) { child_env(ev[i]); _exit(ring_child(3)); }
    }
    for (int i = 0; i < 3; i++) {
        int s = kt_wait_pid(job[i], kt_now_ms() + 60000);
        KT_CHECK(s == 0, "with a stranger at the door: rank %d ended %d", i, s);
    }
    /* 5. no rank 0 at all */
    port = free_port();
    snprintf(envs[0], sizeof envs[0], "RANK=1;WORLD_SIZE=2;MASTER_ADDR=127.0.0.1;MASTER_PORT=%d;KVPS_RENDEZVOUS_TIMEOUT=1", port);
    ev[0] = envs[0];
    clear_dir();
    run_job(1, ev, meet_child, 0, st);
    KT_CHECK(st[0] == 20 && said(1, w, sizeof w) && atoi(w) == KVPS_ERR_TIMEOUT && strstr(w, "had no answer from rank 0 at 127.0.0.1:"),
             "no rank 0: ended %d saying '%s'", st[0], w);
    /* 6. a rendezvous host that does not resolve: named with its port (a label of 100 letters is
       refused by the resolver itself, no query leaves the machine) */
    char host[128];
    memset(host, 'a', 100);
    snprintf(host + 100, sizeof host - 100, ".invalid");
    snprintf(envs[0], sizeof envs[0], "RANK=1;WORLD_SIZE=2;MASTER_ADDR=%s;MASTER_PORT=29999;KVPS_RENDEZVOUS_TIMEOUT=1", host);
    ev[0] = envs[0];
    clear_dir();
    run_job(1, ev, meet_child, 0, st);
    KT_CHECK(st[0] == 20 && said(1, w, sizeof w) && strstr(w, "(port 29999) does not resolve: ") && strstr(w, host),
             "unresolvable MASTER_ADDR: ended %d saying '%s'", st[0], w);
    char why[400], ep[200];
    snprintf(ep, sizeof ep, "tcp://%s:5555", host);
    KT_CHECK(!kvps__endpoint_resolves(ep, why, sizeof why) && strstr(why, "(port 5555) does not resolve"), "'%s'", why);
    KT_CHECK(kvps__endpoint_resolves("tcp://127.0.0.1:1", why, sizeof why) && kvps__endpoint_resolves("ipc:///tmp/x", why, sizeof why) &&
             kvps__endpoint_resolves("tcp://localhost:1", why, sizeof why), "numeric, ipc, localhost");
    clear_dir();
    rmdir(fault_dir);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    kvps_log_set_level(KVPS_LOG_NONE);
    KT_RUN(test_launch_read, 30);
    KT_RUN(test_ifname_match, 30);
    KT_RUN(test_iface_pick, 30);
    KT_RUN(test_wire, 30);
    KT_RUN(test_ring_torchrun, 90);
    KT_RUN(test_ring_mpi_slurm, 120);
    KT_RUN(test_ps_torchrun, 90);
    KT_RUN(test_rendezvous_faults, 180);
    return kt_finish();
}
