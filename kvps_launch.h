/* kvps_launch.h - v0.1 - how a launched process finds its job: the launcher's variables, the
   network card, and a rendezvous at one address - MIT licence

   You rarely include this file yourself: kvps.h and kvps_ring.h include it, and their readers
   of the environment (kvps_env_read, kvps_ring_env_read) stand on it. Its implementation is on
   wherever theirs is (kvps_core.h: IMPLEMENTATION SWITCHES; its own switch is
   KVPS_LAUNCH_IMPLEMENTATION). Link libzmq, -pthread.

   CONTENTS
     1. The launcher's variables
     2. Rendezvous at one address
     3. The network card: KVPS_IFNAME
     4. Wire format of the rendezvous
     5. Errors

   1. THE LAUNCHER'S VARIABLES (kvps_launch_read)
     rank        KVPS_RANK, RANK (torchrun, Kubeflow's PyTorchJob), OMPI_COMM_WORLD_RANK (Open MPI),
                 PMI_RANK (MPICH / Hydra), SLURM_PROCID (srun)
     size        KVPS_SIZE, WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS
     local rank  LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID
     local size  LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS
   The first that is set of each list counts. A rank or size that is set but not a number, a rank
   not below the size, or none set is an error that names the variables (KVPS_ERR_ENV). The local
   rank (a process's index among the job's processes on its host: the GPU it should take) comes
   from the launcher where it says, else from the rendezvous (ranks on one host, in rank order),
   else it is -1: kvps_launch_local.

   2. RENDEZVOUS AT ONE ADDRESS
   KVPS_RENDEZVOUS=host:port, else MASTER_ADDR and MASTER_PORT (torchrun's and PyTorchJob's):
   with that address and the rank and size, a job forms with no list of endpoints. Under
   torchrun's default (static) rendezvous its agent already serves PyTorch's store at
   MASTER_PORT, and tells its workers so (TORCHELASTIC_USE_AGENT_STORE=True): kvps then meets at
   MASTER_PORT + 1 on MASTER_ADDR (that port must be free there; else set KVPS_RENDEZVOUS).
     - Rank 0 listens at the address (a numeric address is bound as it is, so a rank 0 started on
       another host fails at once naming it; "localhost" binds 127.0.0.1; another host name binds
       every interface of rank 0's host, as a name may resolve to 127.0.1.1 there and to the
       network's address elsewhere).
     - Every rank binds its own socket on the chosen network card (section 3) at a port the
       kernel picks, and registers that endpoint, its host and the job's shape ("ring", or "ps"
       with the number of servers) with rank 0. The port stays bound from the moment it is
       chosen until the ring or server takes it over (ZMQ_USE_FD): no other process can take it
       in between.
     - Once every rank has registered, rank 0 checks that they agree (the same size and shape,
       each rank once, and no loopback address in a job that spans hosts) and sends everyone
       the table; each acknowledges it.
   Users: kvps_ring_env_read (the table is the ring's peers) and kvps_env_read (the first
   KVPS_NUM_SERVERS ranks serve, the rest work; the table gives the servers' endpoints).
   KVPS_RING_PEERS and KVPS_SERVERS, where set, are used as before and no rendezvous happens.
   Time: rank 0 waits KVPS_RENDEZVOUS_TIMEOUT seconds (default 300) for every rank, logs the
   ranks it still waits for every 30 s, and at the end sends the others an error naming the
   ranks that never registered (and returns it: KVPS_ERR_TIMEOUT); the others wait 10 s longer
   (at most as long again) for that answer before they say that rank 0 never answered. A rank
   that registers twice, or a size or shape that differs, ends the rendezvous on every rank with
   a message naming them (rank 0 answers the ranks that register after that for 5 s more). With KVPS_JOB_TOKEN set (kvps.h: SECURITY), a registration must carry
   the token's digest: one that does not is refused and logged with its address, and the
   rendezvous goes on; without a token any process that reaches the port may register (as with
   torchrun's store). Replicated shards ('|' chains) need KVPS_SERVERS.

   3. THE NETWORK CARD: KVPS_IFNAME (NCCL_SOCKET_IFNAME's syntax)
     KVPS_IFNAME=eth           every interface whose name starts with "eth"
     KVPS_IFNAME=eth0,ens      a list: any of the prefixes
     KVPS_IFNAME==eth0         '=' first: exact names ("==eth0" ... "=eth0,ib0")
     KVPS_IFNAME=^docker,virbr '^' first: every interface but these (prefixes; "^=" exact names)
   The first interface (in the kernel's order) that is up, has an IPv4 address and matches.
   Without KVPS_IFNAME: loopback when the rendezvous address is a loopback one (every rank is on
   that host), else the first interface that is up and not loopback, else loopback. A job whose
   ranks span hosts (different boot ids or network namespaces) in which a rank advertises a
   loopback address is refused at once, on every rank, naming that rank's host and address. IPv6
   is not chosen.

   4. WIRE FORMAT (ZeroMQ DEALER -> ROUTER at the rendezvous address; little-endian)
   Every message: u32 magic "KVRV", u16 version 1, u16 type, u32 rank, u32 size, then by type:
     1 REGISTER  u64 job token digest (0: none), then four strings, each u16 length + bytes:
                 shape (<= 63), endpoint (<= 255, "" for a rank that binds nothing), host (the
                 kernel's boot id and namespaces, <= 255), host name (<= 255)
     2 TABLE     for each rank in order: endpoint, host, host name (strings as above); rank is the
                 receiver's
     3 ERROR     one string (<= 1023): why the rendezvous ended
     4 ACK       nothing more (the table arrived)
   Anything else, or a string longer than its limit, or bytes left over, is malformed: rank 0
   logs it with the sender's address and drops it; a rank that gets a malformed answer fails
   (KVPS_ERR_MALFORMED). tests/fuzz/fuzz_rendezvous.c feeds the decoder.

   5. ERRORS
   The calls that fail leave their words, per thread, for kvps_launch_last_error() (the callers
   log them): "rendezvous at 10.0.0.1:29500: ranks 2, 3 of 4 did not register within 300 s
   (registered: 0 on node1, 1 on node1)". kvps_ring_env_read passes them on to
   kvps_ring_last_error(NULL); kvps_env_read logs them.
*/
#ifndef KVPS__CORE_ZMQ
#define KVPS__CORE_ZMQ /* (core's ZeroMQ part) */
#endif
#include "kvps_core.h"
#ifndef KVPS_LAUNCH_H
#define KVPS_LAUNCH_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvps_launch {
    int rank, size;                   /* this process in the job (section 1) */
    int local_rank, local_size;       /* on this host: the launcher's, else -1 (kvps_launch_local) */
    const char *rank_var, *size_var;  /* the variables they were read from */
    char rendezvous[256];             /* "host:port" (section 2), "" when none is given */
    const char *rendezvous_var;       /* "KVPS_RENDEZVOUS" or "MASTER_ADDR/MASTER_PORT"; NULL */
} kvps_launch;

/* Reads section 1's variables and the rendezvous address. KVPS_OK, or KVPS_ERR_ENV naming the
   variable (kvps_launch_last_error). */
KVPS_API kvps_result kvps_launch_read(kvps_launch *l);
/* The IPv4 address this process binds (section 3) as text into ip[cap]; loopback_ok: the
   rendezvous address is a loopback one. KVPS_OK or KVPS_ERR_ENV / KVPS_ERR_CONFIG (words). */
KVPS_API kvps_result kvps_launch_address(int loopback_ok, char *ip, size_t cap);
/* This process's local rank and size: the launcher's, else the last rendezvous's; -1 unknown. */
KVPS_API void kvps_launch_local(int *local_rank, int *local_size);
/* The words of this thread's last failed kvps_launch_* call ("" none). */
KVPS_API const char *kvps_launch_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* KVPS_LAUNCH_H */

/* ============================================================================================ */
#if (defined(KVPS_IMPLEMENTATION) || defined(KVPS_LAUNCH_IMPLEMENTATION)) && !defined(KVPS_LAUNCH__IMPLEMENTED)
#define KVPS_LAUNCH__IMPLEMENTED
/* THE IMPLEMENTATION (find a section with `// >>name`):
     vars       the launcher's variables, the error words
     ifname     KVPS_IFNAME's matcher (a pure function), the interfaces, the address to bind
     host       this host as the kernel separates hosts (also the ring's: shared memory)
     reserve    ports bound before their socket exists, handed over at its zmq_bind
     wire       the rendezvous messages: writer and the one decoder
     meet       the rendezvous: rank 0's side, the others' side, the table
   The ring and the parameter server call the static functions; unused ones are not warned of. */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#endif
#include <zmq.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <netdb.h>
/* (a strict POSIX build leaves the interface flags out of <net/if.h>; these are Linux's and BSD's) */
#ifdef IFF_UP
#define KVPS__IFF_UP IFF_UP
#define KVPS__IFF_LOOPBACK IFF_LOOPBACK
#else
#define KVPS__IFF_UP 0x1
#define KVPS__IFF_LOOPBACK 0x8
#endif

// >>vars
static KVPS__TLS char kvps__launch_err[768];
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static kvps_result kvps__launch_fail(kvps_result rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kvps__launch_err, sizeof kvps__launch_err, fmt, ap);
    va_end(ap);
    return rc;
}
KVPS_API const char *kvps_launch_last_error(void) { return kvps__launch_err; }

/* The first of vars that is set: 1 (its value in *out), 0 none set, -1 set but not a number
   (*v names the variable either way when one is set). */
static int kvps__env_first(const char *const *vars, int n, int *out, const char **v) {
    for (int i = 0; i < n; i++) {
        int got = kvps__env_int(vars[i], out);
        if (got != 0) { *v = vars[i]; return got; }
    }
    return 0;
}

static const char *const kvps__rank_vars[] = {"KVPS_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
static const char *const kvps__size_vars[] = {"KVPS_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
static const char *const kvps__lrank_vars[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};
static const char *const kvps__lsize_vars[] = {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"};
#define KVPS__NVARS(a) ((int)(sizeof a / sizeof *a))

/* The local rank and size the last rendezvous found (-1 before one). */
static int kvps__launch_lrank = -1, kvps__launch_lsize = -1;
static pthread_mutex_t kvps__launch_mu = PTHREAD_MUTEX_INITIALIZER;

KVPS_API kvps_result kvps_launch_read(kvps_launch *l) {
    if (!l) return kvps__launch_fail(KVPS_ERR_INVALID_ARG, "kvps_launch_read: NULL");
    memset(l, 0, sizeof *l);
    l->local_rank = l->local_size = -1;
    int got_r = kvps__env_first(kvps__rank_vars, KVPS__NVARS(kvps__rank_vars), &l->rank, &l->rank_var),
        got_s = kvps__env_first(kvps__size_vars, KVPS__NVARS(kvps__size_vars), &l->size, &l->size_var);
    if (got_r < 0 || got_s < 0) {
        const char *bad = got_r < 0 ? l->rank_var : l->size_var;
        return kvps__launch_fail(KVPS_ERR_ENV, "%s is '%.40s', not a number", bad, getenv(bad));
    }
    if (got_r == 0 || got_s == 0) {
        const char *const *names = got_r == 0 ? kvps__rank_vars : kvps__size_vars;
        return kvps__launch_fail(KVPS_ERR_ENV, "no %s: none of %s, %s, %s, %s, %s is set", got_r == 0 ? "rank" : "size",
                                 names[0], names[1], names[2], names[3], names[4]);
    }
    if (l->size < 1 || l->rank >= l->size)
        return kvps__launch_fail(KVPS_ERR_ENV, "rank %d (%s) and size %d (%s): need 0 <= rank < size", l->rank,
                                 l->rank_var, l->size, l->size_var);
    const char *v = NULL;
    int lr = -1, ls = -1;
    if (kvps__env_first(kvps__lrank_vars, KVPS__NVARS(kvps__lrank_vars), &lr, &v) < 0)
        return kvps__launch_fail(KVPS_ERR_ENV, "%s is '%.40s', not a number", v, getenv(v));
    if (kvps__env_first(kvps__lsize_vars, KVPS__NVARS(kvps__lsize_vars), &ls, &v) < 0)
        return kvps__launch_fail(KVPS_ERR_ENV, "%s is '%.40s', not a number", v, getenv(v));
    l->local_rank = lr;
    l->local_size = ls;
    const char *rv = getenv("KVPS_RENDEZVOUS"), *ma = getenv("MASTER_ADDR"), *mp = getenv("MASTER_PORT");
    if (rv && *rv) {
        const char *colon = strrchr(rv, ':');
        char *end = NULL;
        long port = colon ? strtol(colon + 1, &end, 10) : -1;
        if (!colon || colon == rv || !end || *end || port < 1 || port > 65535 || strlen(rv) >= sizeof l->rendezvous)
            return kvps__launch_fail(KVPS_ERR_ENV, "KVPS_RENDEZVOUS is '%.80s', not host:port (a port 1-65535)", rv);
        snprintf(l->rendezvous, sizeof l->rendezvous, "%s", rv);
        l->rendezvous_var = "KVPS_RENDEZVOUS";
    } else if ((ma && *ma) || (mp && *mp)) {
        int port = 0;
        if (!ma || !*ma || !mp || !*mp)
            return kvps__launch_fail(KVPS_ERR_ENV, "%s is set but %s is not: the rendezvous needs both",
                                     ma && *ma ? "MASTER_ADDR" : "MASTER_PORT", ma && *ma ? "MASTER_PORT" : "MASTER_ADDR");
        if (kvps__env_int("MASTER_PORT", &port) != 1 || port < 1 || port > 65535)
            return kvps__launch_fail(KVPS_ERR_ENV, "MASTER_PORT is '%.40s', not a port (1-65535)", mp);
        if (strlen(ma) + 8 >= sizeof l->rendezvous || strchr(ma, '/') || strchr(ma, ','))
            return kvps__launch_fail(KVPS_ERR_ENV, "MASTER_ADDR is '%.80s', not a host name or address", ma);
        /* torchrun's static rendezvous (its default) serves its own store at MASTER_PORT from the
           launcher's agent (and says so to its workers): the port after it is kvps's */
        const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
        int torch_store = agent && (strcmp(agent, "True") == 0 || strcmp(agent, "1") == 0 || strcmp(agent, "true") == 0);
        if (torch_store && port == 65535)
            return kvps__launch_fail(KVPS_ERR_ENV, "MASTER_PORT is 65535, torchrun's store's: kvps's rendezvous takes the port "
                                     "after it; give torchrun another --master_port, or set KVPS_RENDEZVOUS=host:port");
        snprintf(l->rendezvous, sizeof l->rendezvous, "%s:%d", ma, port + torch_store);
        l->rendezvous_var = torch_store ? "MASTER_ADDR/MASTER_PORT + 1 (MASTER_PORT is torchrun's store)" : "MASTER_ADDR/MASTER_PORT";
    }
    kvps__launch_err[0] = 0;
    return KVPS_OK;
}

KVPS_API void kvps_launch_local(int *local_rank, int *local_size) {
    int lr = -1, ls = -1;
    const char *v = NULL;
    if (kvps__env_first(kvps__lrank_vars, KVPS__NVARS(kvps__lrank_vars), &lr, &v) != 1) lr = -1;
    if (kvps__env_first(kvps__lsize_vars, KVPS__NVARS(kvps__lsize_vars), &ls, &v) != 1) ls = -1;
    pthread_mutex_lock(&kvps__launch_mu);
    if (lr < 0) lr = kvps__launch_lrank;
    if (ls < 0) ls = kvps__launch_lsize;
    pthread_mutex_unlock(&kvps__launch_mu);
    if (local_rank) *local_rank = lr;
    if (local_size) *local_size = ls;
}

// >>ifname
/* Whether interface `name` is chosen by spec (KVPS_IFNAME, NCCL_SOCKET_IFNAME's syntax: a
   comma-separated list of prefixes; '=' first: exact names; '^' first: all but those, '^='
   exact). An empty spec chooses every name. */
static int kvps__ifname_match(const char *spec, const char *name) {
    int neg = 0, exact = 0;
    if (*spec == '^') { neg = 1; spec++; }
    if (*spec == '=') { exact = 1; spec++; }
    int hit = 0;
    size_t nl = strlen(name);
    while (*spec && !hit) {
        const char *e = strchr(spec, ',');
        size_t len = e ? (size_t)(e - spec) : strlen(spec);
        if (len) hit = exact ? (len == nl && memcmp(spec, name, len) == 0) : (len <= nl && memcmp(spec, name, len) == 0);
        spec += len + (e ? 1 : 0);
    }
    return neg ? !hit : hit;
}

/* One interface as the chooser sees it. */
typedef struct kvps__iface {
    char name[IF_NAMESIZE + 1];
    char ip[INET_ADDRSTRLEN];
    int up, loopback;
} kvps__iface;

/* The chooser (section 3) over a list: the index of the interface chosen, or -1. spec NULL or
   "": the default rule. */
static int kvps__iface_pick(const kvps__iface *ifs, int n, const char *spec, int loopback_ok) {
    if (spec && *spec) {
        for (int i = 0; i < n; i++)
            if (ifs[i].up && kvps__ifname_match(spec, ifs[i].name)) return i;
        return -1;
    }
    for (int pass = loopback_ok ? 0 : 1; pass < 3; pass++) /* 0: loopback asked; 1: not loopback; 2: any */
        for (int i = 0; i < n; i++)
            if (ifs[i].up && (pass == 2 || ifs[i].loopback == (pass == 0))) return i;
    return -1;
}

/* This host's IPv4 interfaces, at most max, in the kernel's order; their count. */
static int kvps__ifaces(kvps__iface *ifs, int max) {
    struct ifaddrs *all = NULL;
    if (getifaddrs(&all) != 0) return 0;
    int n = 0;
    for (struct ifaddrs *a = all; a && n < max; a = a->ifa_next) {
        if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !a->ifa_name) continue;
        kvps__iface *f = &ifs[n];
        snprintf(f->name, sizeof f->name, "%s", a->ifa_name);
        if (!inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)a->ifa_addr)->sin_addr, f->ip, sizeof f->ip)) continue;
        f->up = (a->ifa_flags & KVPS__IFF_UP) != 0;
        f->loopback = (a->ifa_flags & KVPS__IFF_LOOPBACK) != 0;
        n++;
    }
    freeifaddrs(all);
    return n;
}

KVPS_API kvps_result kvps_launch_address(int loopback_ok, char *ip, size_t cap) {
    if (!ip || cap < INET_ADDRSTRLEN) return kvps__launch_fail(KVPS_ERR_INVALID_ARG, "kvps_launch_address: buffer too small");
    kvps__iface ifs[64];
    int n = kvps__ifaces(ifs, 64);
    const char *spec = getenv("KVPS_IFNAME");
    int i = kvps__iface_pick(ifs, n, spec, loopback_ok);
    if (i >= 0) {
        snprintf(ip, cap, "%s", ifs[i].ip);
        return KVPS_OK;
    }
    char list[512] = "";
    for (int k = 0; k < n; k++) {
        size_t used = strlen(list);
        if (used + 48 > sizeof list) break;
        snprintf(list + used, sizeof list - used, "%s%.16s %.15s%s", k ? ", " : "", ifs[k].name, ifs[k].ip,
                 ifs[k].up ? "" : " (down)");
    }
    if (spec && *spec)
        return kvps__launch_fail(KVPS_ERR_ENV, "KVPS_IFNAME='%.60s' matches no interface that is up with an IPv4 "
                                 "address (this host has: %s)", spec, n ? list : "none");
    return kvps__launch_fail(KVPS_ERR_CONFIG, "no interface is up with an IPv4 address (this host has: %s)",
                             n ? list : "none");
}

/* Whether an address (numeric or "localhost") is a loopback one. */
static int kvps__addr_loopback(const char *host) {
    struct in_addr a;
    if (strcmp(host, "localhost") == 0 || strcmp(host, "::1") == 0) return 1;
    return inet_pton(AF_INET, host, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

/* The host part of an endpoint "tcp://HOST:PORT" into host[cap]; 0 when it has none. */
static int kvps__endpoint_host(const char *ep, char *host, size_t cap) {
    const char *h = strstr(ep, "://"), *c = strrchr(ep, ':');
    if (!h || !c || c <= h + 3 || (size_t)(c - h - 3) >= cap) return 0;
    memcpy(host, h + 3, (size_t)(c - h - 3));
    host[c - h - 3] = 0;
    return 1;
}

/* Whether the host of a tcp:// endpoint resolves (numeric addresses, '*' and other transports
   do); when it does not, why[cap] names the host, the port and the resolver's words. ZeroMQ
   resolves a connect's name in the background and retries for ever, so a name that does not
   resolve is otherwise a silent wait. */
static int kvps__endpoint_resolves(const char *ep, char *why, size_t cap) {
    char host[256];
    const char *c = strrchr(ep, ':');
    struct in_addr a4;
    if (strncmp(ep, "tcp://", 6) != 0 || !kvps__endpoint_host(ep, host, sizeof host)) return 1;
    if (inet_pton(AF_INET, host, &a4) == 1 || strcmp(host, "*") == 0 || host[0] == '[') return 1;
    if (strchr(host, ';')) snprintf(host, sizeof host, "%s", strchr(host, ';') + 1); /* "src;dst" */
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int e = getaddrinfo(host, NULL, &hints, &res);
    if (res) freeaddrinfo(res);
    if (e == 0) return 1;
    snprintf(why, cap, "host '%s' (port %s) does not resolve: %s", host, c ? c + 1 : "?", gai_strerror(e));
    return 0;
}

// >>host
/* This host as the kernel separates hosts: the boot, the network, IPC and PID namespaces, and
   /dev/shm's file system (a container has its own; `ip netns exec` keeps the host's, though it
   makes a mount namespace of its own for each command), so that two containers or two network
   namespaces of one machine are two hosts; $KVPS_RING_HOST_ID appended (kvps_ring.h, section
   10). "" when /proc cannot tell. */
static void kvps__host_ident(char *buf, size_t cap) {
    char boot[64] = "";
    FILE *fp = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (fp) { if (!fgets(boot, sizeof boot, fp)) boot[0] = 0; fclose(fp); }
    boot[strcspn(boot, "\n")] = 0;
    static const char *ns[] = {"net", "ipc", "pid"};
    unsigned long long ino[5] = {0, 0, 0, 0, 0};
    struct stat st;
    for (int i = 0; i < 3; i++) {
        char p[32];
        snprintf(p, sizeof p, "/proc/self/ns/%s", ns[i]);
        if (stat(p, &st) == 0) ino[i] = (unsigned long long)st.st_ino;
    }
    if (stat("/dev/shm", &st) == 0) { ino[3] = (unsigned long long)st.st_dev; ino[4] = (unsigned long long)st.st_ino; }
    const char *extra = getenv("KVPS_RING_HOST_ID");
    if (!boot[0] || !ino[0]) { buf[0] = 0; return; }
    snprintf(buf, cap, "%s n%llx i%llx p%llx s%llx:%llx%s%.40s", boot, ino[0], ino[1], ino[2], ino[3], ino[4],
             extra && *extra ? " " : "", extra ? extra : "");
}

/* The job token's digest (kvps.h: JOB TOKEN): the given token, else $KVPS_JOB_TOKEN; 0 when there
   is none (NULL or ""), never 0 otherwise. What travels is the digest, never the token. */
static uint64_t kvps__token_digest(const char *desc_token) {
    const char *t = desc_token ? desc_token : getenv("KVPS_JOB_TOKEN");
    if (!t || !*t) return 0;
    uint64_t h = kvps__fnv(KVPS__FNV_BASIS, "kvps job token:", 15);
    h = kvps__mix64(kvps__fnv(h, t, strlen(t)));
    return h ? h : 1;
}

// >>reserve
/* Ports chosen before the socket that will serve them exists (a rendezvous registers the port
   first): the listening socket is made and bound at once, kept here, and handed to ZeroMQ at
   that endpoint's bind (ZMQ_USE_FD), so no other process can take the port in between. */
enum { KVPS__RESERVED_MAX = 8 };
static struct { char endpoint[256]; int fd; } kvps__reserved[KVPS__RESERVED_MAX];
static int kvps__nreserved;

/* Binds a listening TCP socket at ip, port 0, and writes "tcp://ip:port"; KVPS_OK or an error
   with words. */
static kvps_result kvps__reserve_port(const char *ip, const char *role, char *endpoint, size_t cap) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1)
        return kvps__launch_fail(KVPS_ERR_CONFIG, "%s address '%s' is not an IPv4 address", role, ip);
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    socklen_t al = sizeof a;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &al) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return kvps__launch_fail(KVPS_ERR_BIND, "the %s cannot bind a port on %s: %s", role, ip, strerror(e));
    }
    snprintf(endpoint, cap, "tcp://%s:%u", ip, (unsigned)ntohs(a.sin_port));
    pthread_mutex_lock(&kvps__launch_mu);
    if (kvps__nreserved == KVPS__RESERVED_MAX) { /* the oldest is dropped: a process meets a few times at most */
        close(kvps__reserved[0].fd);
        memmove(kvps__reserved, kvps__reserved + 1, sizeof kvps__reserved[0] * (KVPS__RESERVED_MAX - 1));
        kvps__nreserved--;
    }
    snprintf(kvps__reserved[kvps__nreserved].endpoint, sizeof kvps__reserved[0].endpoint, "%s", endpoint);
    kvps__reserved[kvps__nreserved++].fd = fd;
    pthread_mutex_unlock(&kvps__launch_mu);
    return KVPS_OK;
}

/* zmq_bind, with the socket reserved for that endpoint if there is one (its ownership passes to
   ZeroMQ, which closes it with the socket). Every kvps socket that binds a user's endpoint calls
   this. */
static int kvps__zmq_bind(void *sock, const char *endpoint) {
    int fd = -1;
    pthread_mutex_lock(&kvps__launch_mu);
    for (int i = 0; i < kvps__nreserved; i++)
        if (strcmp(kvps__reserved[i].endpoint, endpoint) == 0) {
            fd = kvps__reserved[i].fd;
            kvps__reserved[i] = kvps__reserved[--kvps__nreserved];
            break;
        }
    pthread_mutex_unlock(&kvps__launch_mu);
    if (fd < 0) return zmq_bind(sock, endpoint);
    int none = -1;
    if (zmq_setsockopt(sock, ZMQ_USE_FD, &fd, sizeof fd) != 0) { close(fd); return zmq_bind(sock, endpoint); }
    int rc = zmq_bind(sock, endpoint);
    int e = zmq_errno();
    zmq_setsockopt(sock, ZMQ_USE_FD, &none, sizeof none);
    if (rc != 0) { close(fd); errno = e; }
    return rc;
}

// >>wire
#define KVPS__RDV_MAGIC 0x5652564bu /* "KVRV" */
enum { KVPS__RDV_REGISTER = 1, KVPS__RDV_TABLE = 2, KVPS__RDV_ERROR = 3, KVPS__RDV_ACK = 4 };
enum { KVPS__RDV_SHAPE_MAX = 63, KVPS__RDV_STR_MAX = 255, KVPS__RDV_ERR_MAX = 1023, KVPS__RDV_HDR = 16 };

/* One rank's entry: what it registered. */
typedef struct kvps__rdv_entry {
    char endpoint[KVPS__RDV_STR_MAX + 1], host[KVPS__RDV_STR_MAX + 1], name[KVPS__RDV_STR_MAX + 1];
} kvps__rdv_entry;

/* A decoded message (kvps__rdv_parse). For a TABLE, the entries are read one by one
   (kvps__rdv_next) from body[blen]. */
typedef struct kvps__rdv_msg {
    uint32_t type, rank, size;
    uint64_t token;
    char shape[KVPS__RDV_SHAPE_MAX + 1];
    char text[KVPS__RDV_ERR_MAX + 1];
    kvps__rdv_entry e; /* REGISTER */
    const unsigned char *body;
    size_t blen;
} kvps__rdv_msg;

/* A growing byte buffer for the writer; ok turns 0 when memory runs out. */
typedef struct kvps__rdv_buf { unsigned char *p; size_t n, cap; int ok; } kvps__rdv_buf;
static void kvps__rdv_put(kvps__rdv_buf *b, const void *d, size_t n) {
    if (!b->ok) return;
    if (b->n + n > b->cap) {
        size_t c = (b->cap ? b->cap * 2 : 256) + n;
        unsigned char *q = (unsigned char *)realloc(b->p, c);
        if (!q) { b->ok = 0; return; }
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void kvps__rdv_put_u32(kvps__rdv_buf *b, uint32_t v) { kvps__rdv_put(b, &v, 4); }
static void kvps__rdv_put_str(kvps__rdv_buf *b, const char *s, size_t max) {
    size_t l = strlen(s);
    uint16_t n = (uint16_t)(l < max ? l : max);
    kvps__rdv_put(b, &n, 2);
    kvps__rdv_put(b, s, n);
}
static void kvps__rdv_put_hdr(kvps__rdv_buf *b, uint32_t type, uint32_t rank, uint32_t size) {
    uint16_t ver = 1, ty = (uint16_t)type;
    kvps__rdv_put_u32(b, KVPS__RDV_MAGIC);
    kvps__rdv_put(b, &ver, 2);
    kvps__rdv_put(b, &ty, 2);
    kvps__rdv_put_u32(b, rank);
    kvps__rdv_put_u32(b, size);
}

/* Reads a string of at most max bytes at *off into out[max + 1]; 0 when it runs past n, is
   longer than max or holds a NUL. */
static int kvps__rdv_str(const unsigned char *p, size_t n, size_t *off, char *out, size_t max) {
    uint16_t l;
    if (n - *off < 2) return 0;
    memcpy(&l, p + *off, 2);
    if (l > max || n - *off - 2 < l || memchr(p + *off + 2, 0, l)) return 0;
    memcpy(out, p + *off + 2, l);
    out[l] = 0;
    *off += 2 + (size_t)l;
    return 1;
}

/* The next entry of a TABLE; 1, 0 at a malformed one. */
static int kvps__rdv_next(const unsigned char *p, size_t n, size_t *off, kvps__rdv_entry *e) {
    return kvps__rdv_str(p, n, off, e->endpoint, KVPS__RDV_STR_MAX) && kvps__rdv_str(p, n, off, e->host, KVPS__RDV_STR_MAX) &&
           kvps__rdv_str(p, n, off, e->name, KVPS__RDV_STR_MAX);
}

/* The one decoder of what arrives at or from a rendezvous: KVPS_OK, KVPS_ERR_MAGIC,
   KVPS_ERR_VERSION, KVPS_ERR_OP (unknown type) or KVPS_ERR_MALFORMED (too short, a string too
   long, bytes left over, a size of 0 or over 2^24, a rank not below the size; a TABLE whose
   entries do not parse or are not size of them). */
static kvps_result kvps__rdv_parse(const unsigned char *p, size_t n, kvps__rdv_msg *m) {
    uint32_t magic;
    uint16_t ver, type;
    memset(m, 0, sizeof *m);
    if (n < KVPS__RDV_HDR) return KVPS_ERR_MALFORMED;
    memcpy(&magic, p, 4);
    memcpy(&ver, p + 4, 2);
    memcpy(&type, p + 6, 2);
    memcpy(&m->rank, p + 8, 4);
    memcpy(&m->size, p + 12, 4);
    if (magic != KVPS__RDV_MAGIC) return KVPS_ERR_MAGIC;
    if (ver != 1) return KVPS_ERR_VERSION;
    m->type = type;
    if (m->size == 0 || m->size > (1u << 24) || m->rank >= m->size) return KVPS_ERR_MALFORMED;
    size_t off = KVPS__RDV_HDR;
    switch (type) {
    case KVPS__RDV_REGISTER:
        if (n - off < 8) return KVPS_ERR_MALFORMED;
        memcpy(&m->token, p + off, 8);
        off += 8;
        if (!kvps__rdv_str(p, n, &off, m->shape, KVPS__RDV_SHAPE_MAX) || !kvps__rdv_next(p, n, &off, &m->e))
            return KVPS_ERR_MALFORMED;
        break;
    case KVPS__RDV_TABLE: {
        m->body = p + off;
        m->blen = n - off;
        kvps__rdv_entry e;
        for (uint32_t i = 0; i < m->size; i++)
            if (!kvps__rdv_next(p, n, &off, &e)) return KVPS_ERR_MALFORMED;
        break;
    }
    case KVPS__RDV_ERROR:
        if (!kvps__rdv_str(p, n, &off, m->text, KVPS__RDV_ERR_MAX)) return KVPS_ERR_MALFORMED;
        break;
    case KVPS__RDV_ACK: break;
    default: return KVPS_ERR_OP;
    }
    return off == n ? KVPS_OK : KVPS_ERR_MALFORMED;
}

// >>meet
/* Where a registration came from: its routing id and its address. */
typedef struct kvps__rdv_from { unsigned char id[256]; size_t n; char addr[64]; } kvps__rdv_from;
/* The job as the rendezvous gathers it. */
typedef struct kvps__rdv {
    const kvps_launch *l;
    const char *shape, *addr; /* the job's shape ("ring", "ps 2"); "host:port" */
    kvps__rdv_entry *ent;     /* [size] */
    kvps__rdv_from *who;      /* [size]: where each rank registered from (rank 0's: nothing) */
    char *seen;               /* [size]: registered (then: acknowledged) */
    int nseen;
    uint64_t token;
    int timeout_s;
    void *ctx, *sock;
} kvps__rdv;

/* Sends b (to a routing id through rank 0's ROUTER; to NULL: through a DEALER). */
static void kvps__rdv_send(void *sock, const kvps__rdv_from *to, const kvps__rdv_buf *b) {
    zmq_msg_t f[2];
    int n = 0;
    if (to && kvps__msg_from_buf(&f[n++], to->id, to->n) != 0) return;
    if (kvps__msg_from_buf(&f[n], b->p, b->n) != 0) { if (n) zmq_msg_close(&f[0]); return; }
    kvps__send_frames(sock, f, n + 1);
}

static void kvps__rdv_send_error(void *sock, const kvps__rdv_from *to, uint32_t rank, uint32_t size, const char *text) {
    kvps__rdv_buf b = {NULL, 0, 0, 1};
    kvps__rdv_put_hdr(&b, KVPS__RDV_ERROR, rank, size);
    kvps__rdv_put_str(&b, text, KVPS__RDV_ERR_MAX);
    if (b.ok) kvps__rdv_send(sock, to, &b);
    free(b.p);
}

/* Rank 0's end: tells every rank that registered why the rendezvous ended, and for up to 5 s
   more (at most the rendezvous's timeout) answers the same to every rank that registers late,
   until size - 1 were told (told: those told already, as the one at fault), then fails. */
static kvps_result kvps__rdv_abort(kvps__rdv *r, kvps_result rc, const char *text, int told) {
    for (int i = 1; i < r->l->size; i++)
        if (r->seen[i]) { kvps__rdv_send_error(r->sock, &r->who[i], (uint32_t)i, (uint32_t)r->l->size, text); told++; }
    int64_t until = kvps__now_ms() + (r->timeout_s < 5 ? r->timeout_s * 1000 : 5000);
    while (told < r->l->size - 1 && kvps__now_ms() < until) {
        zmq_pollitem_t it = {r->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 50) <= 0) continue;
        zmq_msg_t f[2];
        int extra = 0, nf = kvps__recv_msg(r->sock, f, 2, &extra);
        kvps__rdv_msg m;
        if (nf == 2 && !extra && zmq_msg_size(&f[0]) <= sizeof r->who[0].id &&
            kvps__rdv_parse((const unsigned char *)zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), &m) == KVPS_OK &&
            m.type == KVPS__RDV_REGISTER) {
            kvps__rdv_from src;
            src.n = zmq_msg_size(&f[0]);
            memcpy(src.id, zmq_msg_data(&f[0]), src.n);
            kvps__rdv_send_error(r->sock, &src, m.rank, m.size, text);
            told++;
        }
        for (int i = 0; i < nf; i++) zmq_msg_close(&f[i]);
    }
    return kvps__launch_fail(rc, "%s", text);
}

/* Whether a routing id frame is the one a rank registered from. */
static int kvps__rdv_same(const kvps__rdv_from *w, const zmq_msg_t *id) {
    return zmq_msg_size((zmq_msg_t *)id) == w->n && memcmp(zmq_msg_data((zmq_msg_t *)id), w->id, w->n) == 0;
}

/* "2, 3" (at most 16 named, then "and N more") of the ranks with seen[i] == want. */
static void kvps__rdv_ranks(const kvps__rdv *r, int want, char *out, size_t cap) {
    int n = 0, more = 0;
    out[0] = 0;
    for (int i = 0; i < r->l->size; i++) {
        if ((r->seen[i] != 0) != want) continue;
        if (n++ < 16) snprintf(out + strlen(out), cap - strlen(out), "%s%d", n > 1 ? ", " : "", i);
        else more++;
    }
    if (more) snprintf(out + strlen(out), cap - strlen(out), " and %d more", more);
}

/* Rank 0: checks the whole table (one host per job or no loopback address), sends it, waits
   for the acknowledgements. */
static kvps_result kvps__rdv_finish(kvps__rdv *r, int64_t deadline) {
    int size = r->l->size, hosts = 1;
    for (int i = 1; i < size && hosts == 1; i++) hosts += strcmp(r->ent[i].host, r->ent[0].host) != 0;
    for (int i = 0; hosts > 1 && i < size; i++) {
        char h[KVPS__RDV_STR_MAX + 1];
        if (kvps__endpoint_host(r->ent[i].endpoint, h, sizeof h) && kvps__addr_loopback(h)) {
            char text[KVPS__RDV_ERR_MAX + 1];
            snprintf(text, sizeof text, "rendezvous at %s: rank %d on host %s advertises %s, a loopback address, in a job "
                     "whose ranks are on more than one host: the others cannot reach it (set KVPS_IFNAME to the network "
                     "card the hosts share, e.g. KVPS_IFNAME=eth0)", r->addr, i, r->ent[i].name, r->ent[i].endpoint);
            return kvps__rdv_abort(r, KVPS_ERR_CONFIG, text, 0);
        }
    }
    for (int me = 1; me < size; me++) {
        kvps__rdv_buf b = {NULL, 0, 0, 1};
        kvps__rdv_put_hdr(&b, KVPS__RDV_TABLE, (uint32_t)me, (uint32_t)size);
        for (int i = 0; i < size; i++) {
            kvps__rdv_put_str(&b, r->ent[i].endpoint, KVPS__RDV_STR_MAX);
            kvps__rdv_put_str(&b, r->ent[i].host, KVPS__RDV_STR_MAX);
            kvps__rdv_put_str(&b, r->ent[i].name, KVPS__RDV_STR_MAX);
        }
        if (!b.ok) { free(b.p); return kvps__rdv_abort(r, KVPS_ERR_NOMEM, "rendezvous: out of memory for the table", 0); }
        kvps__rdv_send(r->sock, &r->who[me], &b);
        free(b.p);
    }
    /* the acknowledgements: so that rank 0 closes its socket only once the table is out (a rank
       that died in between is found by whatever the job does next) */
    memset(r->seen, 0, (size_t)size);
    int acks = 1;
    int64_t until = kvps__now_ms() + 10000;
    if (until > deadline + 10000) until = deadline + 10000;
    while (acks < size && kvps__now_ms() < until) {
        zmq_pollitem_t it = {r->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) <= 0) continue;
        zmq_msg_t f[2];
        int extra = 0, nf = kvps__recv_msg(r->sock, f, 2, &extra);
        if (nf <= 0) continue;
        kvps__rdv_msg m;
        if (nf == 2 && !extra && kvps__rdv_parse((const unsigned char *)zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), &m) == KVPS_OK &&
            m.type == KVPS__RDV_ACK && (int)m.size == size && m.rank > 0 && !r->seen[m.rank] &&
            kvps__rdv_same(&r->who[m.rank], &f[0])) {
            r->seen[m.rank] = 1;
            acks++;
        }
        for (int i = 0; i < nf; i++) zmq_msg_close(&f[i]);
    }
    if (acks < size) {
        char miss[160];
        r->seen[0] = 1;
        kvps__rdv_ranks(r, 0, miss, sizeof miss);
        kvps__log(KVPS_LOG_WARN, "rendezvous at %s: ranks %s did not acknowledge the table (gone since they registered?)",
                  r->addr, miss);
    }
    return KVPS_OK;
}

/* Rank 0's side: serves the rendezvous at its address until every rank has registered (or the
   deadline), then sends the table. */
static kvps_result kvps__rdv_host(kvps__rdv *r, int64_t deadline, int timeout_s) {
    int size = r->l->size;
    const char *colon = strrchr(r->addr, ':');
    char host[256], bind[300];
    snprintf(host, sizeof host, "%.*s", (int)(colon - r->addr), r->addr);
    struct in_addr a4;
    const char *iface = inet_pton(AF_INET, host, &a4) == 1 ? host : strcmp(host, "localhost") == 0 ? "127.0.0.1" : "*";
    snprintf(bind, sizeof bind, "tcp://%s:%s", iface, colon + 1);
    int linger = 2000;
    zmq_setsockopt(r->sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(r->sock, bind) != 0)
        return kvps__launch_fail(KVPS_ERR_BIND, "rendezvous: rank 0 cannot listen at %s (%s, as %s; from %s): %s", r->addr, bind,
                                 "the rendezvous", r->l->rendezvous_var, zmq_strerror(zmq_errno()));
    int64_t next_note = kvps__now_ms() + 30000;
    while (r->nseen < size) {
        int64_t now = kvps__now_ms();
        char text[KVPS__RDV_ERR_MAX + 1], miss[160], got[600];
        if (now >= deadline) {
            kvps__rdv_ranks(r, 0, miss, sizeof miss);
            got[0] = 0;
            for (int i = 0, k = 0; i < size && k < 8; i++)
                if (r->seen[i]) snprintf(got + strlen(got), sizeof got - strlen(got), "%s%d on %.40s", k++ ? ", " : "", i, r->ent[i].name);
            snprintf(text, sizeof text, "rendezvous at %s: rank%s %s of %d did not register within %d s (registered: %s; "
                     "KVPS_RENDEZVOUS_TIMEOUT sets the wait)", r->addr, size - r->nseen > 1 ? "s" : "", miss, size, timeout_s, got);
            return kvps__rdv_abort(r, KVPS_ERR_TIMEOUT, text, 0);
        }
        if (now >= next_note) {
            kvps__rdv_ranks(r, 0, miss, sizeof miss);
            kvps__log(KVPS_LOG_WARN, "rendezvous at %s: %d of %d ranks registered; waiting for %s", r->addr, r->nseen, size, miss);
            next_note = now + 30000;
        }
        zmq_pollitem_t it = {r->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) <= 0) continue;
        zmq_msg_t f[2];
        int extra = 0, nf = kvps__recv_msg(r->sock, f, 2, &extra);
        if (nf <= 0) continue;
        const char *pa = zmq_msg_gets(&f[nf - 1], "Peer-Address");
        char from[64];
        snprintf(from, sizeof from, "%s", pa ? pa : "?");
        kvps__rdv_msg m;
        kvps_result prc = nf == 2 && !extra && zmq_msg_size(&f[0]) <= sizeof r->who[0].id
                              ? kvps__rdv_parse((const unsigned char *)zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), &m)
                              : KVPS_ERR_MALFORMED;
        kvps__rdv_from src;
        src.n = zmq_msg_size(&f[0]) <= sizeof src.id ? zmq_msg_size(&f[0]) : 0;
        memcpy(src.id, zmq_msg_data(&f[0]), src.n);
        snprintf(src.addr, sizeof src.addr, "%s", from);
        kvps_result fatal = KVPS_OK;
        if (prc != KVPS_OK || m.type != KVPS__RDV_REGISTER) {
            kvps__log(KVPS_LOG_WARN, "rendezvous at %s: dropped a message from %s: %s", r->addr, from,
                      prc != KVPS_OK ? kvps_result_str(prc) : "not a registration");
        } else if (m.token != r->token) {
            kvps__log(KVPS_LOG_WARN, "rendezvous at %s: refused a registration as rank %u from %s: %s", r->addr, m.rank, from,
                      r->token ? "its KVPS_JOB_TOKEN differs from rank 0's" : "it has a KVPS_JOB_TOKEN, rank 0 has none");
            kvps__rdv_send_error(r->sock, &src, m.rank, m.size, "rendezvous: refused: the job token (KVPS_JOB_TOKEN) differs from rank 0's");
        } else if ((int)m.size != size || strcmp(m.shape, r->shape) != 0) {
            snprintf(text, sizeof text, "rendezvous at %s: rank %u on host %s (%s) says the job is %u ranks, '%s'; rank 0 says "
                     "%d ranks, '%s': every rank must be launched with the same size and servers", r->addr, m.rank, m.e.name,
                     from, m.size, m.shape, size, r->shape);
            kvps__rdv_send_error(r->sock, &src, m.rank, m.size, text);
            fatal = KVPS_ERR_MISMATCH;
        } else if (m.rank == 0 || (r->seen[m.rank] && !kvps__rdv_same(&r->who[m.rank], &f[0]))) {
            snprintf(text, sizeof text, "rendezvous at %s: rank %u registered twice: on host %s (%s) and on host %s (%s): two "
                     "processes launched with one rank?", r->addr, m.rank, r->ent[m.rank].name,
                     m.rank ? r->who[m.rank].addr : "rank 0 itself", m.e.name, from);
            kvps__rdv_send_error(r->sock, &src, m.rank, m.size, text);
            fatal = KVPS_ERR_MISMATCH;
        } else if (!r->seen[m.rank]) {
            r->ent[m.rank] = m.e;
            r->who[m.rank] = src;
            r->seen[m.rank] = 1;
            r->nseen++;
        }
        for (int i = 0; i < nf; i++) zmq_msg_close(&f[i]);
        if (fatal != KVPS_OK) return kvps__rdv_abort(r, fatal, text, 1);
    }
    return kvps__rdv_finish(r, deadline);
}

/* Another rank's side: registers, then waits for the table or the error. */
static kvps_result kvps__rdv_join(kvps__rdv *r, int64_t deadline, int timeout_s) {
    char ep[300], id[64];
    snprintf(ep, sizeof ep, "tcp://%s", r->addr);
    snprintf(id, sizeof id, "kvps-rdv-%d-%ld-%llx", r->l->rank, (long)getpid(), (unsigned long long)kvps__now_us());
    zmq_setsockopt(r->sock, ZMQ_ROUTING_ID, id, strlen(id));
    int linger = 2000, ivl = 100;
    zmq_setsockopt(r->sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(r->sock, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    char unresolved[400] = "";
    if (!kvps__endpoint_resolves(ep, unresolved, sizeof unresolved))
        kvps__log(KVPS_LOG_WARN, "rendezvous: rank %d: the rendezvous's %s; trying on (a name that appears later is used)",
                  r->l->rank, unresolved);
    if (zmq_connect(r->sock, ep) != 0)
        return kvps__launch_fail(KVPS_ERR_CONNECT, "rendezvous: rank %d cannot connect to %s (from %s): %s", r->l->rank, r->addr,
                                 r->l->rendezvous_var, zmq_strerror(zmq_errno()));
    kvps__rdv_buf b = {NULL, 0, 0, 1};
    const kvps__rdv_entry *me = &r->ent[r->l->rank];
    kvps__rdv_put_hdr(&b, KVPS__RDV_REGISTER, (uint32_t)r->l->rank, (uint32_t)r->l->size);
    kvps__rdv_put(&b, &r->token, 8);
    kvps__rdv_put_str(&b, r->shape, KVPS__RDV_SHAPE_MAX);
    kvps__rdv_put_str(&b, me->endpoint, KVPS__RDV_STR_MAX);
    kvps__rdv_put_str(&b, me->host, KVPS__RDV_STR_MAX);
    kvps__rdv_put_str(&b, me->name, KVPS__RDV_STR_MAX);
    if (!b.ok) { free(b.p); return kvps__launch_fail(KVPS_ERR_NOMEM, "rendezvous: out of memory"); }
    kvps__rdv_send(r->sock, NULL, &b);
    free(b.p);
    int64_t grace = timeout_s < 10 ? (int64_t)timeout_s * 1000 : 10000; /* for rank 0's answer to arrive first */
    while (kvps__now_ms() < deadline + grace) {
        zmq_pollitem_t it = {r->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) <= 0) continue;
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, r->sock, ZMQ_DONTWAIT) < 0) { zmq_msg_close(&f); continue; }
        kvps__rdv_msg m;
        kvps_result prc = zmq_msg_more(&f) ? KVPS_ERR_MALFORMED
                                           : kvps__rdv_parse((const unsigned char *)zmq_msg_data(&f), zmq_msg_size(&f), &m);
        kvps_result rc = KVPS_OK;
        if (prc != KVPS_OK || (m.type != KVPS__RDV_TABLE && m.type != KVPS__RDV_ERROR) || (int)m.rank != r->l->rank) {
            rc = kvps__launch_fail(prc != KVPS_OK ? prc : KVPS_ERR_MALFORMED, "rendezvous at %s: rank %d got a malformed answer "
                                   "(%s): not a kvps rendezvous, or another version", r->addr, r->l->rank,
                                   prc != KVPS_OK ? kvps_result_str(prc) : "not a table");
        } else if (m.type == KVPS__RDV_ERROR) {
            rc = kvps__launch_fail(strstr(m.text, "did not register") ? KVPS_ERR_TIMEOUT : strstr(m.text, "loopback") ? KVPS_ERR_CONFIG
                                   : strstr(m.text, "token") ? KVPS_ERR_AUTH : KVPS_ERR_MISMATCH, "%s (rank %d: rank 0's answer)",
                                   m.text, r->l->rank);
        } else if ((int)m.size != r->l->size) {
            rc = kvps__launch_fail(KVPS_ERR_MISMATCH, "rendezvous at %s: rank 0's table has %u ranks, this rank's job %d", r->addr,
                                   m.size, r->l->size);
        } else {
            size_t off = 0;
            for (int i = 0; i < r->l->size; i++) kvps__rdv_next(m.body, m.blen, &off, &r->ent[i]);
            kvps__rdv_buf a = {NULL, 0, 0, 1};
            kvps__rdv_put_hdr(&a, KVPS__RDV_ACK, (uint32_t)r->l->rank, (uint32_t)r->l->size);
            if (a.ok) kvps__rdv_send(r->sock, NULL, &a);
            free(a.p);
        }
        zmq_msg_close(&f);
        return rc;
    }
    if (unresolved[0] && !kvps__endpoint_resolves(ep, unresolved, sizeof unresolved))
        return kvps__launch_fail(KVPS_ERR_TIMEOUT, "rendezvous: rank %d had no answer from rank 0 at %s (%s) within %d s: its %s",
                                 r->l->rank, r->addr, r->l->rendezvous_var, timeout_s + (int)(grace / 1000), unresolved);
    return kvps__launch_fail(KVPS_ERR_TIMEOUT, "rendezvous: rank %d had no answer from rank 0 at %s (%s) within %d s: is rank 0 "
                             "running, listening there, and launched with the same address?", r->l->rank, r->addr,
                             r->l->rendezvous_var, timeout_s + (int)(grace / 1000));
}

/* The rendezvous (section 2): this rank registers `endpoint` ("" for none) with the job's shape;
   on KVPS_OK, table[size] holds every rank's endpoint (kvps__free_strv), and the local rank and
   size are known. */
static kvps_result kvps__launch_meet(const kvps_launch *l, const char *shape, const char *endpoint, char ***table) {
    *table = NULL;
    int timeout_s = 300;
    if (kvps__env_int("KVPS_RENDEZVOUS_TIMEOUT", &timeout_s) < 0 || timeout_s < 1)
        return kvps__launch_fail(KVPS_ERR_ENV, "KVPS_RENDEZVOUS_TIMEOUT is '%.40s', not a positive number of seconds",
                                 getenv("KVPS_RENDEZVOUS_TIMEOUT"));
    kvps__rdv r;
    memset(&r, 0, sizeof r);
    r.l = l;
    r.shape = shape;
    r.addr = l->rendezvous;
    r.token = kvps__token_digest(NULL);
    r.timeout_s = timeout_s;
    r.ent = (kvps__rdv_entry *)calloc((size_t)l->size, sizeof *r.ent);
    r.who = (kvps__rdv_from *)calloc((size_t)l->size, sizeof *r.who);
    r.seen = (char *)calloc((size_t)l->size, 1);
    r.ctx = zmq_ctx_new();
    if (r.ctx) r.sock = zmq_socket(r.ctx, l->rank == 0 ? ZMQ_ROUTER : ZMQ_DEALER);
    kvps_result rc = KVPS_OK;
    if (!r.ent || !r.who || !r.seen) rc = kvps__launch_fail(KVPS_ERR_NOMEM, "rendezvous: out of memory for %d ranks", l->size);
    else if (!r.sock) rc = kvps__launch_fail(KVPS_ERR_ZMQ, "rendezvous: no ZeroMQ socket: %s", zmq_strerror(zmq_errno()));
    if (rc == KVPS_OK) {
        kvps__rdv_entry *me = &r.ent[l->rank];
        snprintf(me->endpoint, sizeof me->endpoint, "%s", endpoint);
        kvps__host_ident(me->host, sizeof me->host);
        if (gethostname(me->name, sizeof me->name - 1) != 0) snprintf(me->name, sizeof me->name, "?");
        if (!me->host[0]) snprintf(me->host, sizeof me->host, "%s", me->name); /* no /proc: the name tells hosts apart */
        int64_t deadline = kvps__now_ms() + (int64_t)timeout_s * 1000;
        if (l->rank == 0) {
            r.seen[0] = 1;
            r.nseen = 1;
            rc = kvps__rdv_host(&r, deadline, timeout_s);
        } else {
            rc = kvps__rdv_join(&r, deadline, timeout_s);
        }
    }
    if (rc == KVPS_OK) {
        char **t = (char **)calloc((size_t)l->size, sizeof *t);
        int lr = 0, ls = 0;
        for (int i = 0; t && i < l->size; i++) {
            size_t n = strlen(r.ent[i].endpoint) + 1;
            if ((t[i] = (char *)malloc(n)) == NULL) { kvps__free_strv(t, l->size); t = NULL; break; }
            memcpy(t[i], r.ent[i].endpoint, n);
            if (strcmp(r.ent[i].host, r.ent[l->rank].host) == 0) { ls++; lr += i < l->rank; }
        }
        if (!t) rc = kvps__launch_fail(KVPS_ERR_NOMEM, "rendezvous: out of memory for the table");
        *table = t;
        pthread_mutex_lock(&kvps__launch_mu);
        kvps__launch_lrank = lr;
        kvps__launch_lsize = ls;
        pthread_mutex_unlock(&kvps__launch_mu);
    }
    if (r.sock) zmq_close(r.sock);
    if (r.ctx) zmq_ctx_term(r.ctx);
    free(r.ent); free(r.who); free(r.seen);
    return rc;
}

/* What kvps_ring_env_read and kvps_env_read share: the address this rank binds (numeric IPv4)
   for a rendezvous at l's address. */
static kvps_result kvps__launch_bind_ip(const kvps_launch *l, char *ip, size_t cap) {
    char host[256];
    const char *colon = strrchr(l->rendezvous, ':');
    snprintf(host, sizeof host, "%.*s", (int)(colon - l->rendezvous), l->rendezvous);
    return kvps_launch_address(kvps__addr_loopback(host), ip, cap);
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#endif /* KVPS_LAUNCH__IMPLEMENTED */
