/* fuzz_env - the launcher environment and every other text kvps parses: kvps_env_read
   (KVPS_ROLE, KVPS_RANK and the MPI / Slurm rank variables, KVPS_SERVERS, KVPS_NUM_WORKERS),
   kvps_ring_env_read (KVPS_SIZE and its MPI / Slurm equivalents, KVPS_RING_PEERS), the
   comma-separated endpoint lists (kvps__split, as kvps_worker_create and kvps_ring_create use
   it), KVPS_LOG, and CURVE certificate files (kvps_cert_load).

   Input: [u16 mask][value]("\xfe" "MSG"[value])*: value i is set in variable i of fz_vars when
   bit i of the mask is set, else the variable is unset (a value stops at its first NUL, as an
   environment would). With bit 13 set, what follows the 13 values is written to a file and
   read as a certificate.

   Properties: no crash or leak; an accepted environment is consistent (a role, ranks in range,
   the server's own endpoint is its entry of KVPS_SERVERS, trimmed and shorter than the buffer);
   a refused one says KVPS_ERR_ENV; the list splitter returns exactly the comma-separated entries,
   trimmed of spaces, or refuses a list with an empty entry; KVPS_LOG picks the named level or
   warn. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "kvps_ring.h"
#include "tests/fuzz/fuzz_common.h"
#include <unistd.h>

extern char **environ;

static const char *const fz_vars[] = {
    "KVPS_SERVERS", "KVPS_RANK", "KVPS_NUM_WORKERS", "KVPS_ROLE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID",
    "KVPS_LOG", "KVPS_SIZE", "KVPS_RING_PEERS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "KVPS_REPLICA",
    "KVPS_REPLACEMENT",
};
enum { FZ_NVARS = sizeof fz_vars / sizeof fz_vars[0] };

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    kvps_log_set_fn(fz_nolog, NULL);
    return 0;
}

/* The splitter's oracle, written independently: entry i of list, spaces trimmed. */
static void fz_entry(const char *list, int i, const char **b, size_t *n) {
    const char *p = list;
    for (int k = 0; k < i; k++) p = strchr(p, ',') + 1;
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    while (len && *p == ' ') { p++; len--; }
    while (len && p[len - 1] == ' ') len--;
    *b = p;
    *n = len;
}

static void fz_check_split(const char *list) {
    int commas = 0, empty = 0;
    for (const char *p = list; *p; p++) commas += *p == ',';
    for (int i = 0; i <= commas; i++) {
        const char *b;
        size_t n;
        fz_entry(list, i, &b, &n);
        empty |= n == 0;
    }
    char **v = NULL;
    int n = kvps__split(list, &v);
    if (empty) {
        FZ_CHECK(n == -1, "split '%s': %d entries, one of them empty", list, n);
        return;
    }
    FZ_CHECK(n == commas + 1, "split '%s': %d entries for %d commas", list, n, commas);
    for (int i = 0; i < n; i++) {
        const char *b;
        size_t len;
        fz_entry(list, i, &b, &len);
        FZ_CHECK(strlen(v[i]) == len && memcmp(v[i], b, len) == 0, "split '%s': entry %d is '%s'", list, i, v[i]);
    }
    kvps__free_strv(v, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    uint16_t mask;
    memcpy(&mask, data, 2);
    fz_cut cut = {data + 2, size - 2, 0};
    const uint8_t *p;
    size_t n;
    /* The environment is this array, not setenv's: glibc keeps every value ever set, which
       would grow without bound over millions of inputs. */
    static char store[FZ_NVARS][4200], *envp[FZ_NVARS + 1];
    int ne = 0;
    for (int i = 0; i < FZ_NVARS; i++) {
        size_t len = 0, off = (size_t)snprintf(store[i], sizeof store[i], "%s=", fz_vars[i]);
        if (fz_next(&cut, FZ_MSG, &p, &n)) {
            len = n < sizeof store[i] - off - 1 ? n : sizeof store[i] - off - 1;
            memcpy(store[i] + off, p, len);
        }
        store[i][off + len] = 0;
        if (mask >> i & 1) envp[ne++] = store[i];
    }
    envp[ne] = NULL;
    environ = envp;

    kvps_env env;
    kvps_result r = kvps_env_read(&env);
    const char *servers = getenv("KVPS_SERVERS");
    if (servers && *servers) fz_check_split(servers);
    if (r == KVPS_OK) {
        FZ_CHECK(env.servers == servers, "env.servers is not KVPS_SERVERS");
        FZ_CHECK(env.num_servers >= 1 && env.num_workers >= 1, "%d servers, %d workers", env.num_servers, env.num_workers);
        if (env.role == KVPS_ROLE_SERVER) {
            FZ_CHECK(env.rank >= 0 && env.rank < env.num_servers, "server rank %d of %d", env.rank, env.num_servers);
            const char *b;
            size_t len;
            fz_entry(servers, env.rank, &b, &len);
            /* its shard's entry is the chain; its own endpoint is its replica's piece of it */
            FZ_CHECK(len < sizeof env.replicas && strlen(env.replicas) == len && memcmp(env.replicas, b, len) == 0,
                     "server %d: chain '%s'", env.rank, env.replicas);
            char **chain = NULL;
            int nc = kvps__split_by(env.replicas, '|', &chain);
            FZ_CHECK(nc >= 1 && env.replica >= 0 && env.replica < nc && strcmp(env.endpoint, chain[env.replica]) == 0,
                     "server %d replica %d: endpoint '%s' of chain '%s'", env.rank, env.replica, env.endpoint, env.replicas);
            kvps__free_strv(chain, nc);
        } else {
            FZ_CHECK(env.role == KVPS_ROLE_WORKER, "role %d", (int)env.role);
            FZ_CHECK(env.rank >= 0 && env.rank < env.num_workers, "worker rank %d of %d", env.rank, env.num_workers);
        }
    } else {
        FZ_CHECK(r == KVPS_ERR_ENV, "kvps_env_read: %s", kvps_result_str(r));
    }

    int rank = -7, sz = -7;
    const char *peers = NULL;
    r = kvps_ring_env_read(&rank, &sz, &peers);
    if (r == KVPS_OK) {
        FZ_CHECK(sz >= 1 && rank >= 0 && rank < sz && peers && *peers, "ring env: rank %d size %d", rank, sz);
        fz_check_split(peers);
    } else {
        FZ_CHECK(r == KVPS_ERR_ENV, "kvps_ring_env_read: %s", kvps_result_str(r));
    }

    /* A CURVE certificate file (kvps_cert_load): the rest of the input, when bit 13 is set. */
    if (mask >> 13 & 1) {
        char path[64], pub[41], sec[41];
        snprintf(path, sizeof path, "/tmp/kvps-fuzz-cert-%d", (int)getpid());
        FILE *f = fopen(path, "wb");
        FZ_CHECK(f != NULL, "cannot write %s", path);
        if (!cut.done) fwrite(cut.p, 1, cut.n, f);
        fclose(f);
        memset(pub, 'x', sizeof pub);
        memset(sec, 'x', sizeof sec);
        r = kvps_cert_load(path, pub, sec);
        unlink(path);
        if (r == KVPS_OK) {
            FZ_CHECK(strnlen(pub, 41) == 40 && (sec[0] == 0 || strnlen(sec, 41) == 40), "cert: keys of %zu and %zu chars",
                     strnlen(pub, 41), strnlen(sec, 41));
        } else {
            FZ_CHECK(r == KVPS_ERR_CONFIG && pub[0] == 0 && sec[0] == 0, "cert: %s, keys left behind", kvps_result_str(r));
        }
    }

    /* KVPS_LOG is read once per process; forget it so that this input's value is read */
    __atomic_store_n(&kvps__log_level, -1, __ATOMIC_RELAXED);
    const char *lv = getenv("KVPS_LOG");
    static const char *names[] = {"none", "error", "warn", "info", "debug"};
    int want = KVPS_LOG_WARN;
    for (int i = 0; lv && i < 5; i++)
        if (strcmp(lv, names[i]) == 0) want = i;
    FZ_CHECK(kvps__log_level_get() == want, "KVPS_LOG='%s': level %d, want %d", lv ? lv : "(unset)", kvps__log_level_get(), want);
    kvps__log(KVPS_LOG_ERROR, "KVPS_LOG=%s", lv ? lv : "(unset)");
    return 0;
}
