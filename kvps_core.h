/* kvps_core.h - v0.2 - what every kvps header stands on - MIT licence

   You rarely include this file yourself: kvps.h (the parameter server), kvps_ring.h (collectives)
   and kvps_codec.h (compression) include it. It holds what they share and nothing of theirs.

   IMPLEMENTATION SWITCHES (the same in every kvps header)
       #define KVPS_IMPLEMENTATION
   before you include the kvps headers in *one* C or C++ file turns on the implementation of
   every kvps header that file includes. Each header also has a switch of its own, which turns
   on that header's implementation and those of the headers under it (their internals are
   static, so one file holds a header and all it stands on):
       KVPS_CORE_IMPLEMENTATION    this file
       KVPS_CODEC_IMPLEMENTATION   kvps_codec.h + core
       KVPS_LAUNCH_IMPLEMENTATION  kvps_launch.h + core
       KVPS_PS_IMPLEMENTATION      kvps.h + launch + codec + core
       KVPS_RING_IMPLEMENTATION    kvps_ring.h + launch + codec + core
       KVPS_FUSE_IMPLEMENTATION    kvps_fuse.h + ring + launch + codec + core
   Use one file for the implementation of all the kvps headers you use (with KVPS_IMPLEMENTATION
   it is one line); two files that each turn on core would define its functions twice.
   Link with -pthread -lm; and with libzmq where kvps.h or kvps_ring.h is used (core's ZeroMQ
   part, the contexts and frames, is compiled only when one of them is included).

   WHAT IS HERE
     results    kvps_result: every code with its text (kvps_result_str), one X-macro list
     logging    kvps_log_set_level, kvps_log_set_fn; the default writes "kvps LEVEL: message" to
                stderr; KVPS_LOG=error|warn|info|debug sets the level of a program that did not
     launcher   kvps_env_launched: whether a launcher (kvps-run, mpirun, srun) started this process
     cpus       kvps_zmq_ctx_pin: pins a ZeroMQ context's I/O threads (kvps.h: CPU PINNING)
     timeline   the writer of the timelines (Chrome trace-event JSON) that servers, workers and
                rings write (kvps.h: TIMELINE)
   The results are documented in kvps.h's ERRORS AND LOGGING, the variables in its ENVIRONMENT.

   CONFIG MACROS
     KVPS_API     storage class of the public functions (default: extern)
     KVPS_ASSERT  the implementation's assert (default: assert.h's)
*/
/* The implementation switches, one table for every header: each header's own switch implies
   those of the headers under it (kvps_fuse.h > kvps_ring.h > kvps_codec.h and kvps_launch.h >
   this; kvps.h > kvps_codec.h and kvps_launch.h). Every kvps header includes this file first, so
   this runs at each include. */
#if defined(KVPS_FUSE_IMPLEMENTATION) && !defined(KVPS_RING_IMPLEMENTATION)
#define KVPS_RING_IMPLEMENTATION
#endif
#if (defined(KVPS_PS_IMPLEMENTATION) || defined(KVPS_RING_IMPLEMENTATION)) && !defined(KVPS_LAUNCH_IMPLEMENTATION)
#define KVPS_LAUNCH_IMPLEMENTATION
#endif
#if defined(KVPS_LAUNCH_IMPLEMENTATION) && !defined(KVPS_CORE_IMPLEMENTATION)
#define KVPS_CORE_IMPLEMENTATION
#endif
#if (defined(KVPS_PS_IMPLEMENTATION) || defined(KVPS_RING_IMPLEMENTATION)) && !defined(KVPS_CODEC_IMPLEMENTATION)
#define KVPS_CODEC_IMPLEMENTATION
#endif
#if defined(KVPS_CODEC_IMPLEMENTATION) && !defined(KVPS_CORE_IMPLEMENTATION)
#define KVPS_CORE_IMPLEMENTATION
#endif

/* The implementation uses POSIX.1-2008 (clock_gettime, fileno, ...). A strict -std=c99 build
   declares none of it unless a feature macro asks: when nothing has asked yet (no macro, no
   system header seen), ask here. Only in strict mode, where it adds declarations and takes none
   away. A file that includes a system header first must ask itself (an #error below says so). */
#if (defined(KVPS_IMPLEMENTATION) || defined(KVPS_CORE_IMPLEMENTATION)) && defined(__STRICT_ANSI__) && !defined(__cplusplus) && !defined(_FEATURES_H) && \
    !defined(_POSIX_C_SOURCE) && !defined(_XOPEN_SOURCE) && !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#ifndef KVPS_CORE_H
#define KVPS_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifndef KVPS_API
#define KVPS_API extern
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* One list makes both the enum and the strings, so they never drift. */
#define KVPS__RESULTS(X)                                                                        \
    X(KVPS_OK, 0, "ok")                                                                         \
    X(KVPS_ERR_INVALID_ARG, -1, "invalid argument")                                             \
    X(KVPS_ERR_NOMEM, -2, "out of memory")                                                      \
    X(KVPS_ERR_INVALID_REQ, -3, "unknown or already completed request handle")                  \
    X(KVPS_ERR_KEY_RESERVED, -4, "raw keys must be below 2^63 (bit 63 marks tensor slices)")    \
    X(KVPS_ERR_TENSOR, -5, "unknown tensor, or tensor name registered twice / hash collision")  \
    X(KVPS_ERR_STATE, -6, "call not valid in this state")                                       \
    X(KVPS_ERR_CONFIG, -100, "bad configuration")                                               \
    X(KVPS_ERR_ENV, -101, "missing or malformed KVPS_* environment variable")                  \
    X(KVPS_ERR_ZMQ, -200, "ZeroMQ call failed")                                                 \
    X(KVPS_ERR_BIND, -201, "cannot bind an endpoint (in use, or not this host's)")                                   \
    X(KVPS_ERR_CONNECT, -202, "cannot connect to a server endpoint")                            \
    X(KVPS_ERR_TIMEOUT, -203, "timed out")                                                      \
    X(KVPS_ERR_PEER, -204, "a peer aborted the operation")                                      \
    X(KVPS_ERR_PEER_LOST, -205, "a peer is unreachable: its connection or heartbeats stopped")  \
    X(KVPS_ERR_AUTH, -206, "the server refused: not of this job (no accepted hello on that connection, or another job token) or a CURVE key not allowed") \
    X(KVPS_ERR_MALFORMED, -300, "malformed message")                                            \
    X(KVPS_ERR_TRUNCATED, -301, "truncated message: a frame is shorter than its header says")  \
    X(KVPS_ERR_MAGIC, -302, "wrong magic number: not a kvps message")                           \
    X(KVPS_ERR_VERSION, -303, "unsupported protocol version")                                   \
    X(KVPS_ERR_OP, -304, "unknown operation")                                                   \
    X(KVPS_ERR_RANK, -305, "worker rank out of range 0..num_workers-1")                         \
    X(KVPS_ERR_LEN_MISMATCH, -306, "value length does not match the registered key")            \
    X(KVPS_ERR_TOO_LARGE, -307, "length exceeds the server's limit")                            \
    X(KVPS_ERR_DUP_KEY, -308, "the same key appears twice in one request")                     \
    X(KVPS_ERR_NOT_BARRIER, -309, "barrier sent to a server other than server 0")              \
    X(KVPS_ERR_MISMATCH, -310, "ranks disagree: a collective's arguments, or a receive's count or dtype")      \
    X(KVPS_ERR_CODEC, -311, "wrong or unknown codec id")                                       \
    X(KVPS_ERR_HYPERPARAM, -312, "optimizer hyper-parameter out of range")                      \
    X(KVPS_ERR_TABLE, -313, "unknown table, or a table configured differently")                \
    X(KVPS_ERR_REPLAY, -314, "re-sent request too old to tell whether it was applied")         \
    X(KVPS_ERR_CHECKPOINT, -315, "checkpoint file unreadable, torn, or from another server")   \
    X(KVPS_ERR_NOT_PRIMARY, -316, "this server is a backup replica: its shard's primary is alive") \
    X(KVPS_ERR_GPU, -400, "CUDA or NCCL call failed")                                          \
    X(KVPS_ERR_NO_DEVICE, -401, "no CUDA device")

typedef enum kvps_result {
#define KVPS__ENUM(name, value, text) name = value,
    KVPS__RESULTS(KVPS__ENUM)
#undef KVPS__ENUM
} kvps_result;
/* How many results there are (their values are not contiguous: use kvps_result_str for text). */
#define KVPS__ONE(name, value, text) +1
enum { KVPS_RESULT_COUNT = 0 KVPS__RESULTS(KVPS__ONE) };
#undef KVPS__ONE

typedef enum kvps_log_level {
    KVPS_LOG_NONE = 0, KVPS_LOG_ERROR = 1, KVPS_LOG_WARN = 2, KVPS_LOG_INFO = 3, KVPS_LOG_DEBUG = 4, KVPS_LOG_COUNT
} kvps_log_level;
typedef void (*kvps_log_fn)(void *user, kvps_log_level level, const char *msg);

KVPS_API const char *kvps_result_str(kvps_result r);
KVPS_API void kvps_log_set_level(kvps_log_level level);
KVPS_API void kvps_log_set_fn(kvps_log_fn fn, void *user);
KVPS_API int kvps_env_launched(void);
/* Pins the I/O threads of your ZeroMQ context to the CPUs in cpus ("3", "0-3", "0,2-3"); call
   it before the context's first socket. KVPS_ERR_CONFIG (logged) for a malformed list or a CPU
   the calling thread may not run on. See CPU PINNING. */
KVPS_API kvps_result kvps_zmq_ctx_pin(void *zmq_ctx, const char *cpus);

#ifdef __cplusplus
}
#endif
#endif /* KVPS_CORE_H */

/* ============================================================================================ */
#if (defined(KVPS_IMPLEMENTATION) || defined(KVPS_CORE_IMPLEMENTATION)) && !defined(KVPS_CORE__IMPLEMENTED)
#define KVPS_CORE__IMPLEMENTED
/* THE IMPLEMENTATION (find a section with `// >>name`):
     result     kvps_result_str
     log        the level, the user's function, kvps__log
     util       hashes, clocks, deadlines, aligned floats, string lists
     env        kvps__env_int, kvps_env_launched
     malloc     glibc's malloc tuned for large buffers; sorting keys
     timeline   the timeline writer (Chrome trace-event JSON, KVPS_TIMELINE): files, buffer,
                escaping, lanes; what servers, workers and rings put in it is in their headers
   and, only where kvps.h or kvps_ring.h is included (they define KVPS__CORE_ZMQ), its ZeroMQ part:
     cpus       CPU lists, kvps_zmq_ctx_pin, contexts of kvps's own
     frames     sending and receiving whole multipart messages
     liveness   ZMTP heartbeats and socket monitors (how kvps.h and kvps_ring.h see a peer go)
   The layers above call these functions: they are static and may go unused in a program that
   includes only some headers, so the unused-function warnings are off here. */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#endif
#include <pthread.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <dirent.h>
#include <signal.h>
#include <time.h>
#include <limits.h>
#include <sched.h>
#include <math.h>
#include <netdb.h>
#include <sys/socket.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if !defined(CLOCK_MONOTONIC) && !defined(__cplusplus)
#error "kvps_core.h: the implementation needs POSIX: include the kvps headers before any system header in the file that defines KVPS_IMPLEMENTATION, or compile it with -D_POSIX_C_SOURCE=200809L"
#endif
/* posix_memalign is POSIX.1-2001 advisory: <stdlib.h> may leave it out (as under -pthread's
   _POSIX_C_SOURCE 199506L); declared here as the system does. C++ compilers see it already. */
#ifndef __cplusplus
int posix_memalign(void **memptr, size_t alignment, size_t size);
#endif

#ifndef KVPS_ASSERT
#include <assert.h>
#define KVPS_ASSERT(x) assert(x)
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvps: the wire format is little-endian; big-endian hosts are not supported yet"
#endif

#define kvps__def(v, d) ((v) ? (v) : (d))
/* Thread-local storage (the words of a failed call, per thread: kvps_ring.h, kvps_launch.h, kvps_abi.h). */
#if defined(__cplusplus)
#define KVPS__TLS thread_local
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define KVPS__TLS _Thread_local
#else
#define KVPS__TLS __thread
#endif
#if defined(__GNUC__) || defined(_MSC_VER)
#define KVPS__RESTRICT __restrict
#else
#define KVPS__RESTRICT
#endif

// >>result
KVPS_API const char *kvps_result_str(kvps_result r) {
    switch (r) {
#define KVPS__STR(name, value, text) case name: return #name ": " text;
        KVPS__RESULTS(KVPS__STR)
#undef KVPS__STR
    }
    return "unknown kvps_result";
}

// >>log
static int kvps__log_level = -1;
static kvps_log_fn kvps__log_fn;
static void *kvps__log_user;

static int kvps__log_level_get(void) {
    int lv = __atomic_load_n(&kvps__log_level, __ATOMIC_RELAXED);
    if (lv < 0) {
        const char *e = getenv("KVPS_LOG");
        lv = KVPS_LOG_WARN;
        if (e) {
            static const char *names[] = {"none", "error", "warn", "info", "debug"};
            for (int i = 0; i < 5; i++)
                if (strcmp(e, names[i]) == 0) lv = i;
        }
        __atomic_store_n(&kvps__log_level, lv, __ATOMIC_RELAXED);
    }
    return lv;
}

KVPS_API void kvps_log_set_level(kvps_log_level level) {
    __atomic_store_n(&kvps__log_level, (int)level, __ATOMIC_RELAXED);
}

/* The callback and its user pointer change together and may change while other threads log
   (a server's thread, say): a lock keeps the pair whole. Taken only for a line that is logged. */
static pthread_mutex_t kvps__log_mu = PTHREAD_MUTEX_INITIALIZER;

KVPS_API void kvps_log_set_fn(kvps_log_fn fn, void *user) {
    pthread_mutex_lock(&kvps__log_mu);
    kvps__log_fn = fn;
    kvps__log_user = user;
    pthread_mutex_unlock(&kvps__log_mu);
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void kvps__log(kvps_log_level level, const char *fmt, ...) {
    if ((int)level > kvps__log_level_get()) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&kvps__log_mu);
    kvps_log_fn fn = kvps__log_fn;
    void *user = kvps__log_user;
    pthread_mutex_unlock(&kvps__log_mu);
    if (fn) {
        fn(user, level, buf);
    } else {
        static const char *tag[] = {"", "error", "warn", "info", "debug"};
        fprintf(stderr, "kvps %s: %s\n", tag[level], buf);
    }
}

// >>util
static uint64_t kvps__mix64(uint64_t x) { /* splitmix64 finaliser */
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* FNV-1a (64 bits) of n bytes, continuing from h (a new hash starts from KVPS__FNV_BASIS). */
#define KVPS__FNV_BASIS 0xcbf29ce484222325ull
static uint64_t kvps__fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = (const unsigned char *)p;
    while (n--) h = (h ^ *c++) * 0x100000001b3ull;
    return h;
}
static uint64_t kvps__fnv1a(const char *s) { return kvps__fnv(KVPS__FNV_BASIS, s, strlen(s)); }

static int64_t kvps__now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}
static int64_t kvps__now_ms(void) { return kvps__now_us() / 1000; }
/* The deadline of a wait that has none (far enough from every now that deadline - now never
   overflows, and never reached). */
#define KVPS__NEVER (INT64_MAX / 4)

/* The wall-clock time ms milliseconds from now, as pthread_cond_timedwait takes it. */
static struct timespec kvps__deadline_ts(int64_t ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t ns = (int64_t)ts.tv_nsec + ms * 1000000;
    ts.tv_sec += (time_t)(ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    return ts;
}

static void *kvps__alloc_floats(uint64_t n) {
    void *p = NULL;
    if (n > (SIZE_MAX - 63) / sizeof(float)) return NULL;
    size_t bytes = (size_t)n * sizeof(float);
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

/* Values arriving off the wire may sit at any byte offset in ZeroMQ's receive buffer. */
static int kvps__aligned(const void *p) { return ((uintptr_t)p & (sizeof(float) - 1)) == 0; }

/* Splits a comma-separated list into at most max fresh strings; returns the count or -1. */
/* Splits list at sep into trimmed, non-empty strings; their count, or -1. */
static int kvps__split_by(const char *list, char sep, char ***out) {
    int n = 1;
    for (const char *p = list; *p; p++) n += (*p == sep);
    char **v = (char **)calloc((size_t)n, sizeof *v);
    if (!v) return -1;
    const char *p = list;
    for (int i = 0; i < n; i++) {
        const char *e = strchr(p, sep);
        size_t len = e ? (size_t)(e - p) : strlen(p);
        while (len && (*p == ' ')) { p++; len--; }
        while (len && p[len - 1] == ' ') len--;
        v[i] = (char *)malloc(len + 1);
        if (!v[i] || len == 0) {
            for (int j = 0; j <= i; j++) free(v[j]);
            free(v);
            return -1;
        }
        memcpy(v[i], p, len);
        v[i][len] = 0;
        p = e ? e + 1 : p + len;
    }
    *out = v;
    return n;
}

static int kvps__split(const char *list, char ***out) { return kvps__split_by(list, ',', out); }

static void kvps__free_strv(char **v, int n) {
    if (!v) return;
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

// >>env
static int kvps__env_int(const char *name, int *out) {
    const char *e = getenv(name);
    if (!e || !*e) return 0;
    char *end = NULL;
    long v = strtol(e, &end, 10);
    if (*end || v < 0 || v > 1 << 30) return -1;
    *out = (int)v;
    return 1;
}

KVPS_API int kvps_env_launched(void) {
    static const char *vars[] = {"KVPS_ROLE", "KVPS_SERVERS", "KVPS_RANK", "KVPS_RING_PEERS", "KVPS_RENDEZVOUS",
                                 "OMPI_COMM_WORLD_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return 1;
    }
    const char *rk = getenv("RANK"), *ws = getenv("WORLD_SIZE"); /* torchrun's, PyTorchJob's: both */
    if (rk && *rk && ws && *ws) return 1;
    const char *nt = getenv("SLURM_NTASKS");
    return getenv("SLURM_PROCID") && nt && atoi(nt) > 1;
}


// >>malloc
static void kvps__tune_malloc(int skip) {
#if defined(__GLIBC__) && defined(M_MMAP_THRESHOLD)
    static int done;
    if (skip || __atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL)) return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#else
    (void)skip;
#endif
}

static int kvps__cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

// >>timeline
/* The timeline writer (KVPS_TIMELINE, desc.timeline; manual: TIMELINE): Chrome trace-event JSON,
   one file per server, worker or ring. Events are formatted into a buffer of KVPS__TL_BUF bytes
   and written when it is nearly full, or at the first event a second after the last write, or at
   destroy. 64 KiB, not more: a buffer the size of a core's L2 evicted the worker's own data as
   it filled (4 KB requests with the timeline on ran 0.87-1.01x with 1 MiB, 0.95-1.02x with 64
   KiB, as two equal configurations differ; BENCHMARKS.md), and a write per ~300 events costs
   nothing that shows. Every write puts the closing brackets after the events and the next
   write goes over them, so the file is whole JSON after each write: a process that dies loses
   at most its last second of events. The owner (a server's thread, a worker's caller, a ring's running
   collective) is the only thread that writes, so there are no locks. Each thing drawn is a
   track ("tensor w", "rounds", "collectives") cut into lanes: an event goes on the first lane
   that is free at its start, so events that overlap in time (requests in flight together) sit
   on lanes of their own and nest as Perfetto wants. The events themselves are made where they
   happen (>>timeline-events below, and kvps_ring.h's >>timeline). */
enum {
    KVPS__TL_BUF = 1 << 16,     /* bytes of events held before a write */
    KVPS__TL_ROOM = 8192,       /* the most one event may take (names are cut to KVPS__TL_NAME) */
    KVPS__TL_NAME = 200,        /* bytes of a name written (tensor names are the user's) */
    KVPS__TL_LANES = 16,        /* lanes per track; past them events overlap on the last */
    KVPS__TL_SERVERS = 64       /* servers listed in a request's event (then "more") */
};
#define KVPS__TL_FLUSH_NS 1000000000ull /* a write at least this often while events come */
#define KVPS__TL_WINDOW_NS 100000000ull /* async servers: one event per this much time */

typedef struct kvps__tl_track {
    int nlanes;
    int tid[KVPS__TL_LANES];
    uint64_t end[KVPS__TL_LANES]; /* when the lane's last event ends */
    char *text;                   /* its second label (a tensor's name) escaped, made once */
} kvps__tl_track;

typedef struct kvps__tl {
    int fd;
    int failed;          /* a write failed: nothing more is written */
    long pid;
    char *buf;           /* events not written yet, then room for the tail */
    size_t len;
    uint64_t off;        /* where buf goes in the file (the tail written last time is there) */
    uint64_t last_write; /* ns */
    uint64_t now;        /* the current event's end (the time a write is due is read from it) */
    int next_tid;
    kvps__tl_track *tracks;
    int ntracks;
    int any;             /* an event has been made (the next one starts with a comma) */
    char tail[256];      /* what closes the JSON after the events */
    size_t tail_len;
    char pid_text[40];   /* ,"pid":PID,"tid": */
    size_t pid_len;
    uint64_t sec;        /* the second whose digits are in sec_text (timestamps: its digits, then
                            the microseconds'; formatted again when the second changes) */
    char sec_text[24];
    size_t sec_len;
    /* async servers: the pushes applied in the current window, one event per window */
    uint64_t agg_t0, agg_t1, agg_n, agg_keys, agg_bytes;
    uint32_t agg_win;
} kvps__tl;

static uint64_t kvps__tl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* wall time: files of processes on one machine line up */
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Appenders: each writes at p and returns the end. An event costs a few hundred bytes and
   comes with every request, so they avoid printf: literals by their size, digits two at a time. */
#define KVPS__TL_LIT(p, s) (memcpy((p), (s), sizeof(s) - 1), (p) + sizeof(s) - 1)
static char *kvps__tl_put(char *p, const char *s) { /* short strings: a loop beats strlen + memcpy */
    while (*s) *p++ = *s++;
    return p;
}
static const char kvps__tl_d2[] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                  "4041424344454647484950515253545556575859606162636465666768697071727374757677787980"
                                  "81828384858687888990919293949596979899";
static char *kvps__tl_u64(char *p, uint64_t v) {
    char t[24], *e = t + sizeof t, *b = e;
    while (v >= 100) {
        b -= 2;
        memcpy(b, kvps__tl_d2 + 2 * (v % 100), 2);
        v /= 100;
    }
    if (v >= 10) { b -= 2; memcpy(b, kvps__tl_d2 + 2 * v, 2); }
    else *--b = (char)('0' + v);
    memcpy(p, b, (size_t)(e - b));
    return p + (e - b);
}
static char *kvps__tl_i64(char *p, int64_t v) {
    if (v < 0) { *p++ = '-'; return kvps__tl_u64(p, (uint64_t)0 - (uint64_t)v); }
    return kvps__tl_u64(p, (uint64_t)v);
}
static char *kvps__tl_frac3(char *p, unsigned f) { /* ".ddd" */
    p[0] = '.';
    p[1] = (char)('0' + f / 100);
    memcpy(p + 2, kvps__tl_d2 + 2 * (f % 100), 2);
    return p + 4;
}
static char *kvps__tl_us(char *p, uint64_t ns) { /* a duration: microseconds with three decimals */
    return kvps__tl_frac3(kvps__tl_u64(p, ns / 1000), (unsigned)(ns % 1000));
}
/* A timestamp (ns since the epoch) in microseconds with three decimals: the second's digits
   (kept while it lasts), the six of the microsecond, the three of the nanosecond. */
static char *kvps__tl_ts(kvps__tl *tl, char *p, uint64_t ns) {
    uint64_t sec = ns / 1000000000u;
    unsigned us = (unsigned)(ns / 1000 % 1000000);
    if (sec != tl->sec || !tl->sec_len) {
        tl->sec = sec;
        tl->sec_len = (size_t)(kvps__tl_u64(tl->sec_text, sec) - tl->sec_text);
    }
    memcpy(p, tl->sec_text, tl->sec_len);
    p += tl->sec_len;
    memcpy(p, kvps__tl_d2 + 2 * (us / 10000), 2);
    memcpy(p + 2, kvps__tl_d2 + 2 * (us / 100 % 100), 2);
    memcpy(p + 4, kvps__tl_d2 + 2 * (us % 100), 2);
    return kvps__tl_frac3(p + 6, (unsigned)(ns % 1000));
}
/* How long a valid UTF-8 sequence starts at s (at most n bytes there), 0 if none does. */
static int kvps__tl_utf8(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    int len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (!len || (size_t)len > n) return 0;
    for (int i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] > 0x9f) || (c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] > 0x8f))
        return 0; /* overlong, a surrogate, or past U+10FFFF */
    return len;
}
/* The escaped text of at most KVPS__TL_NAME bytes of s, for inside a JSON string: quotes,
   backslashes and control characters escaped, a byte that is not UTF-8 written as U+FFFD (a JSON
   reader must be able to decode the file). */
static char *kvps__tl_text(char *p, const char *s) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)(s ? s : "");
    size_t n = strlen((const char *)u);
    if (n > KVPS__TL_NAME) n = KVPS__TL_NAME;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') { *p++ = (char)c; i++; continue; }
        if (c == '"' || c == '\\') { *p++ = '\\'; *p++ = (char)c; i++; continue; }
        if (c < 0x20) {
            p = kvps__tl_put(p, "\\u00");
            *p++ = hex[c >> 4];
            *p++ = hex[c & 15];
            i++;
            continue;
        }
        int len = kvps__tl_utf8(u + i, n - i);
        if (len) { memcpy(p, u + i, (size_t)len); p += len; i += (size_t)len; }
        else { p = kvps__tl_put(p, "\\ufffd"); i++; }
    }
    return p;
}
static char *kvps__tl_str(char *p, const char *s) {
    *p++ = '"';
    p = kvps__tl_text(p, s);
    *p++ = '"';
    return p;
}
/* "key": (each value is followed by a comma; kvps__tl_end drops the last) */
static char *kvps__tl_jkey(char *p, const char *key) {
    *p++ = '"';
    p = kvps__tl_put(p, key);
    *p++ = '"';
    *p++ = ':';
    return p;
}
static char *kvps__tl_arg_u64(char *p, const char *key, uint64_t v) { p = kvps__tl_u64(kvps__tl_jkey(p, key), v); *p++ = ','; return p; }
static char *kvps__tl_arg_i64(char *p, const char *key, int64_t v) { p = kvps__tl_i64(kvps__tl_jkey(p, key), v); *p++ = ','; return p; }
static char *kvps__tl_arg_us(char *p, const char *key, uint64_t ns) { p = kvps__tl_us(kvps__tl_jkey(p, key), ns); *p++ = ','; return p; }
static char *kvps__tl_arg_str(char *p, const char *key, const char *v) { p = kvps__tl_str(kvps__tl_jkey(p, key), v); *p++ = ','; return p; }
/* "key":"TEXT", with TEXT written as it is (plain ASCII, or escaped already) */
static char *kvps__tl_arg_raw(char *p, const char *key, const char *text) {
    p = kvps__tl_jkey(p, key);
    *p++ = '"';
    p = kvps__tl_put(p, text);
    *p++ = '"';
    *p++ = ',';
    return p;
}
/* 64-bit keys go as strings: a JavaScript number holds 53 bits (a viewer would round them) */
static char *kvps__tl_arg_key(char *p, const char *key, uint64_t v) {
    p = kvps__tl_jkey(p, key);
    *p++ = '"';
    p = kvps__tl_u64(p, v);
    *p++ = '"';
    *p++ = ',';
    return p;
}

/* The result's name ("ok", "KVPS_ERR_TIMEOUT") as a JSON argument. */
static char *kvps__tl_arg_result(char *p, kvps_result r) {
    if (r == KVPS_OK) return KVPS__TL_LIT(p, "\"result\":\"ok\",");
    char name[64];
    const char *str = kvps_result_str(r);
    size_t n = strcspn(str, ":");
    if (n >= sizeof name) n = sizeof name - 1;
    memcpy(name, str, n);
    name[n] = 0;
    return kvps__tl_arg_raw(p, "result", name);
}

/* Writes the buffered events and the tail after them, over the previous tail. */
static void kvps__tl_write(kvps__tl *tl) {
    if (tl->failed) { tl->len = 0; return; }
    memcpy(tl->buf + tl->len, tl->tail, tl->tail_len);
    size_t n = tl->len + tl->tail_len, done = 0;
    while (done < n) {
        ssize_t w = pwrite(tl->fd, tl->buf + done, n - done, (off_t)(tl->off + done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            kvps__log(KVPS_LOG_ERROR, "timeline: write failed (%s): no more events are written", w < 0 ? strerror(errno) : "no space");
            tl->failed = 1;
            break;
        }
        done += (size_t)w;
    }
    tl->off += tl->len;
    tl->len = 0;
    tl->last_write = tl->now;
}

/* Starts a complete event ("ph":"X") at the end of the buffer (after a write when there is no
   room for one; the file's first event is always its process_name, so every event here follows
   another):
     ,{"name":"NAME[ NAME2]","cat":"CAT","ph":"X","ts":T0,"dur":T1-T0,"pid":..,"tid":TID,"args":{
   NAME, NAME2 and CAT are written as they are: literals of plain ASCII, or text escaped by
   kvps__tl_text. Its arguments follow (kvps__tl_arg_*); kvps__tl_end closes it. */
static char *kvps__tl_begin(kvps__tl *tl, const char *name, const char *name2, const char *cat, uint64_t t0, uint64_t t1,
                            int tid) {
    if (tl->len + KVPS__TL_ROOM > KVPS__TL_BUF) kvps__tl_write(tl);
    if (t1 < t0) t1 = t0;
    tl->now = t1;
    char *p = tl->buf + tl->len;
    p = KVPS__TL_LIT(p, ",\n{\"name\":\"");
    p = kvps__tl_put(p, name);
    if (name2) { *p++ = ' '; p = kvps__tl_put(p, name2); }
    p = KVPS__TL_LIT(p, "\",\"cat\":\"");
    p = kvps__tl_put(p, cat);
    p = KVPS__TL_LIT(p, "\",\"ph\":\"X\",\"ts\":");
    p = kvps__tl_ts(tl, p, t0);
    p = KVPS__TL_LIT(p, ",\"dur\":");
    p = kvps__tl_us(p, t1 - t0);
    memcpy(p, tl->pid_text, tl->pid_len);
    p = kvps__tl_u64(p + tl->pid_len, (uint64_t)tid);
    return KVPS__TL_LIT(p, ",\"args\":{");
}
/* Closes the event begun at the end of the buffer; p is where its arguments end. */
static void kvps__tl_end(kvps__tl *tl, char *p) {
    if (p[-1] == ',') p--;
    *p++ = '}';
    *p++ = '}';
    tl->len = (size_t)(p - tl->buf);
    if (tl->now - tl->last_write >= KVPS__TL_FLUSH_NS) kvps__tl_write(tl);
}

/* A metadata event (process_name, thread_name, ...): {"name":WHAT,"ph":"M","pid":..,"tid":TID,"args":{
   then its arguments and kvps__tl_end. */
static char *kvps__tl_meta(kvps__tl *tl, const char *what, int tid) {
    if (tl->len + KVPS__TL_ROOM > KVPS__TL_BUF) kvps__tl_write(tl);
    char *p = tl->buf + tl->len;
    p = kvps__tl_put(p, tl->any ? ",\n{\"name\":\"" : "{\"name\":\"");
    tl->any = 1;
    p = kvps__tl_put(p, what);
    p = kvps__tl_put(p, "\",\"ph\":\"M\",\"pid\":");
    p = kvps__tl_u64(p, (uint64_t)tl->pid);
    p = kvps__tl_put(p, ",\"tid\":");
    p = kvps__tl_u64(p, (uint64_t)tid);
    return kvps__tl_put(p, ",\"args\":{");
}

/* The lane (a tid) of track for an event from t0 to t1: the first lane free at t0, or a new one,
   named "LABEL[ LABEL2][ (lane N)]" (a thread_name event; key_base != 0 adds it as an argument,
   for kvps-timeline to name the server's slices of a tensor). Events are placed as they end and
   each ends after every event placed before it, so an event placed on a lane free at its start
   overlaps none there. */
static int kvps__tl_lane(kvps__tl *tl, int track, const char *label, const char *label2, uint64_t key_base, uint64_t t0,
                         uint64_t t1) {
    if (track >= tl->ntracks) {
        int n = track + 8;
        kvps__tl_track *nt = (kvps__tl_track *)realloc(tl->tracks, (size_t)n * sizeof *nt);
        if (!nt) return 0; /* tid 0: "other" */
        memset(nt + tl->ntracks, 0, (size_t)(n - tl->ntracks) * sizeof *nt);
        tl->tracks = nt;
        tl->ntracks = n;
    }
    kvps__tl_track *t = &tl->tracks[track];
    int lane = 0;
    while (lane < t->nlanes && t->end[lane] > t0) lane++;
    if (lane == KVPS__TL_LANES) lane = KVPS__TL_LANES - 1;
    if (label2 && !t->text) {
        char *e = (char *)malloc(6 * KVPS__TL_NAME + 1);
        if (e) *kvps__tl_text(e, label2) = 0;
        t->text = e;
    }
    if (lane == t->nlanes) {
        t->nlanes++;
        t->tid[lane] = ++tl->next_tid;
        char *p = kvps__tl_meta(tl, "thread_name", t->tid[lane]);
        p = kvps__tl_put(kvps__tl_jkey(p, "name"), "\"");
        p = kvps__tl_text(p, label);
        if (label2) { *p++ = ' '; p = kvps__tl_text(p, label2); }
        if (lane) { p = kvps__tl_put(p, " (lane "); p = kvps__tl_u64(p, (uint64_t)lane + 1); *p++ = ')'; }
        p = kvps__tl_put(p, "\",");
        if (key_base) p = kvps__tl_arg_key(p, "key_base", key_base);
        kvps__tl_end(tl, p);
        p = kvps__tl_meta(tl, "thread_sort_index", t->tid[lane]);
        kvps__tl_end(tl, kvps__tl_arg_u64(p, "sort_index", (uint64_t)t->tid[lane]));
    }
    if (t1 > t->end[lane]) t->end[lane] = t1;
    return t->tid[lane];
}

/* A track's second label as escaped by kvps__tl_lane ("" when it has none). */
static const char *kvps__tl_track_text(const kvps__tl *tl, int track) {
    return track < tl->ntracks && tl->tracks[track].text ? tl->tracks[track].text : "";
}

/* The directory asked for: desc's field, else KVPS_TIMELINE; NULL when off ("" is off too). */
static const char *kvps__tl_dir(const char *desc_dir) {
    const char *d = desc_dir ? desc_dir : getenv("KVPS_TIMELINE");
    return d && *d ? d : NULL;
}

static void kvps__tl_close(kvps__tl **tlp);

/* Opens DIR/kvps-ROLE-RANK-PID.json (-2, -3, ... when that name is taken: two objects of one
   rank in a process) and writes its header: process name (LABEL RANK: "worker 0", "ring rank
   2"), sort index, and which process on which host. *out stays NULL when the timeline is off. A directory that cannot be
   made or a file that cannot be created is KVPS_ERR_CONFIG (logged): asked for, it must work. */
static kvps_result kvps__tl_open(kvps__tl **out, const char *desc_dir, const char *role, const char *label, int rank,
                                 int sort) {
    *out = NULL;
    const char *dir = kvps__tl_dir(desc_dir);
    if (!dir) return KVPS_OK;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        kvps__log(KVPS_LOG_ERROR, "timeline: cannot make the directory '%s': %s", dir, strerror(errno));
        return KVPS_ERR_CONFIG;
    }
    kvps__tl *tl = (kvps__tl *)calloc(1, sizeof *tl);
    if (!tl || !(tl->buf = (char *)malloc(KVPS__TL_BUF + sizeof tl->tail))) { free(tl); return KVPS_ERR_NOMEM; }
    tl->pid = (long)getpid();
    char path[4096];
    tl->fd = -1;
    for (int i = 1; i < 1000 && tl->fd < 0; i++) {
        int n = i == 1 ? snprintf(path, sizeof path, "%s/kvps-%s-%d-%ld.json", dir, role, rank, tl->pid)
                       : snprintf(path, sizeof path, "%s/kvps-%s-%d-%ld-%d.json", dir, role, rank, tl->pid, i);
        if (n < 0 || (size_t)n >= sizeof path) { errno = ENAMETOOLONG; break; }
        tl->fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (tl->fd < 0 && errno != EEXIST) break;
    }
    if (tl->fd < 0) {
        kvps__log(KVPS_LOG_ERROR, "timeline: cannot create a file in '%s': %s", dir, strerror(errno));
        free(tl->buf);
        free(tl);
        return KVPS_ERR_CONFIG;
    }
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    char *p = tl->tail;
    p = kvps__tl_put(p, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"kvps\":\"timeline\",\"role\":\"");
    p = kvps__tl_put(p, role);
    p = kvps__tl_put(p, "\",\"rank\":");
    p = kvps__tl_i64(p, rank);
    p = kvps__tl_put(p, ",\"pid\":");
    p = kvps__tl_u64(p, (uint64_t)tl->pid);
    p = kvps__tl_put(p, "}}\n");
    tl->tail_len = (size_t)(p - tl->tail);
    p = KVPS__TL_LIT(tl->pid_text, ",\"pid\":");
    p = KVPS__TL_LIT(kvps__tl_u64(p, (uint64_t)tl->pid), ",\"tid\":");
    tl->pid_len = (size_t)(p - tl->pid_text);
    static const char head[] = "{\"traceEvents\":[\n";
    if (pwrite(tl->fd, head, sizeof head - 1, 0) != (ssize_t)(sizeof head - 1)) tl->failed = 1;
    tl->off = sizeof head - 1;
    p = kvps__tl_meta(tl, "process_name", 0);
    p = kvps__tl_put(kvps__tl_jkey(p, "name"), "\"");
    p = kvps__tl_put(p, label);
    *p++ = ' ';
    p = kvps__tl_i64(p, rank);
    p = kvps__tl_put(p, "\",");
    kvps__tl_end(tl, p);
    p = kvps__tl_meta(tl, "process_sort_index", 0);
    kvps__tl_end(tl, kvps__tl_arg_u64(p, "sort_index", (uint64_t)sort));
    char labels[300];
    snprintf(labels, sizeof labels, "pid %ld on %s", tl->pid, host);
    kvps__tl_end(tl, kvps__tl_arg_str(kvps__tl_meta(tl, "process_labels", 0), "labels", labels));
    tl->now = kvps__tl_now();
    kvps__tl_write(tl);
    if (tl->failed) { kvps__tl_close(&tl); return KVPS_ERR_CONFIG; }
    kvps__log(KVPS_LOG_INFO, "timeline: %s", path);
    *out = tl;
    return KVPS_OK;
}

/* Writes what is buffered (the file is then whole JSON) and closes it; *tlp = NULL. */
static void kvps__tl_close(kvps__tl **tlp) {
    kvps__tl *tl = *tlp;
    if (!tl) return;
    *tlp = NULL;
    if (tl->len) kvps__tl_write(tl);
    close(tl->fd);
    free(tl->buf);
    for (int i = 0; i < tl->ntracks; i++) free(tl->tracks[i].text);
    free(tl->tracks);
    free(tl);
}

#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#endif /* KVPS_CORE__IMPLEMENTED */

#if (defined(KVPS_IMPLEMENTATION) || defined(KVPS_CORE_IMPLEMENTATION)) && defined(KVPS__CORE_ZMQ) && \
    !defined(KVPS_CORE__ZMQ_IMPLEMENTED)
#define KVPS_CORE__ZMQ_IMPLEMENTED
#include <zmq.h>
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#endif
// >>cpus
#define KVPS__MAX_CPUS 1024 /* glibc's CPU_SETSIZE: libzmq pins its threads with a cpu_set_t */

/* Parses a CPU list ("0-3,8") into set (a bit per CPU below KVPS__MAX_CPUS). 0, or -1 when it
   is empty, malformed, a range runs backwards or a CPU is out of range. */
static int kvps__cpu_list(const char *s, uint8_t set[KVPS__MAX_CPUS / 8]) {
    memset(set, 0, KVPS__MAX_CPUS / 8);
    if (!s) return -1;
    for (;;) {
        char *end;
        if (*s < '0' || *s > '9') return -1;
        unsigned long lo = strtoul(s, &end, 10), hi = lo;
        if (*end == '-') {
            s = end + 1;
            if (*s < '0' || *s > '9') return -1;
            hi = strtoul(s, &end, 10);
        }
        if (lo > hi || hi >= KVPS__MAX_CPUS) return -1; /* strtoul's overflow (ULONG_MAX) too */
        for (unsigned long c = lo; c <= hi; c++) set[c / 8] |= (uint8_t)(1u << (c % 8));
        if (!*end) return 0;
        if (*end != ',') return -1;
        s = end + 1;
    }
}

/* The CPUs the calling thread may run on (Cpus_allowed_list, read as text: no _GNU_SOURCE). */
static int kvps__cpus_allowed(uint8_t set[KVPS__MAX_CPUS / 8]) {
    FILE *f = fopen("/proc/thread-self/status", "r");
    if (!f) f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[8192];
    int rc = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "Cpus_allowed_list:", 18) == 0) {
            char *p = line + 18 + strspn(line + 18, " \t");
            p[strcspn(p, "\n")] = 0;
            rc = kvps__cpu_list(p, set);
            break;
        }
    fclose(f);
    return rc;
}

KVPS_API kvps_result kvps_zmq_ctx_pin(void *zmq_ctx, const char *cpus) {
    uint8_t want[KVPS__MAX_CPUS / 8], ok[KVPS__MAX_CPUS / 8];
    if (!zmq_ctx) return KVPS_ERR_INVALID_ARG;
    if (kvps__cpu_list(cpus, want) != 0) {
        kvps__log(KVPS_LOG_ERROR, "io_cpus '%s': not a CPU list such as \"3\", \"0-3\" or \"0,2-3\" (CPUs below %d)",
                  cpus ? cpus : "(null)", KVPS__MAX_CPUS);
        return KVPS_ERR_CONFIG;
    }
    if (kvps__cpus_allowed(ok) != 0) {
        kvps__log(KVPS_LOG_ERROR, "io_cpus '%s': cannot read the CPUs this thread may run on (/proc/thread-self/status)", cpus);
        return KVPS_ERR_CONFIG;
    }
    for (int c = 0; c < KVPS__MAX_CPUS; c++)
        if ((want[c / 8] >> (c % 8) & 1) && !(ok[c / 8] >> (c % 8) & 1)) {
            kvps__log(KVPS_LOG_ERROR, "io_cpus '%s': CPU %d is not one this thread may run on", cpus, c);
            return KVPS_ERR_CONFIG;
        }
#ifdef ZMQ_THREAD_AFFINITY_CPU_ADD
    for (int c = 0; c < KVPS__MAX_CPUS; c++)
        if ((want[c / 8] >> (c % 8) & 1) && zmq_ctx_set(zmq_ctx, ZMQ_THREAD_AFFINITY_CPU_ADD, c) != 0) {
            kvps__log(KVPS_LOG_ERROR, "io_cpus '%s': CPU %d: %s", cpus, c, zmq_strerror(zmq_errno()));
            return KVPS_ERR_ZMQ;
        }
    return KVPS_OK;
#else
    kvps__log(KVPS_LOG_ERROR, "io_cpus '%s': this libzmq cannot pin its threads (ZMQ_THREAD_AFFINITY_CPU_ADD)", cpus);
    return KVPS_ERR_CONFIG;
#endif
}

/* A kvps object's own context: io_threads I/O threads, pinned to io_cpus when given. NULL on
   failure (logged). */
static void *kvps__ctx_new(int io_threads, const char *io_cpus) {
    void *ctx = zmq_ctx_new();
    if (!ctx) {
        kvps__log(KVPS_LOG_ERROR, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        return NULL;
    }
    zmq_ctx_set(ctx, ZMQ_IO_THREADS, kvps__def(io_threads, 1));
    if (io_cpus && kvps_zmq_ctx_pin(ctx, io_cpus) != KVPS_OK) {
        zmq_ctx_term(ctx);
        return NULL;
    }
    return ctx;
}

/* The ZeroMQ context of a kvps object: the caller's (borrowed, *own 0), or one of its own with
   io_threads I/O threads pinned to *io_cpus (read here only: cleared). KVPS_ERR_CONFIG for an
   io_cpus that cannot be used, KVPS_ERR_ZMQ when no context can be made (both logged). */
static kvps_result kvps__ctx_take(void *borrowed, int io_threads, const char **io_cpus, void **ctx, int *own) {
    *ctx = borrowed;
    *own = 0;
    if (borrowed) return KVPS_OK;
    const char *cpus = *io_cpus;
    *io_cpus = NULL;
    *own = 1;
    *ctx = kvps__ctx_new(io_threads, cpus);
    return *ctx ? KVPS_OK : cpus ? KVPS_ERR_CONFIG : KVPS_ERR_ZMQ;
}


/* io_cpus pins a context of kvps's own; a context passed in is the caller's to pin. */
static int kvps__io_cpus_ok(const void *zmq_ctx, const char *io_cpus, const char *who) {
    if (!zmq_ctx || !io_cpus) return 1;
    kvps__log(KVPS_LOG_ERROR, "%s desc: io_cpus pins the I/O threads of kvps's own context; with zmq_ctx, "
                              "call kvps_zmq_ctx_pin on yours before its first socket", who);
    return 0;
}

// >>frames
/* Sends a whole multipart message; frames are closed (ownership passes to ZeroMQ). */
static int kvps__send_frames(void *sock, zmq_msg_t *frames, int n) {
    int rc = 0;
    for (int i = 0; i < n; i++) {
        /* never block: a DEALER whose peer is gone (inproc) has no pipe and would wait forever */
        if (rc == 0 && zmq_msg_send(&frames[i], sock, ZMQ_DONTWAIT | (i + 1 < n ? ZMQ_SNDMORE : 0)) < 0) rc = -1;
        if (rc != 0) zmq_msg_close(&frames[i]);
    }
    return rc;
}

static int kvps__msg_from_buf(zmq_msg_t *m, const void *data, size_t size) {
    if (zmq_msg_init_size(m, size) != 0) return -1;
    if (size) memcpy(zmq_msg_data(m), data, size);
    return 0;
}

/* Receives one whole multipart message (at most 3 frames kept; extra frames are counted and
   dropped) without blocking; returns the frame count, 0 when none is waiting, -1 on error. */
static int kvps__recv_msg(void *sock, zmq_msg_t *fr, int max, int *extra) {
    int n = 0, more = 1;
    *extra = 0;
    while (more) {
        zmq_msg_t tmp, *m = n < max ? &fr[n] : &tmp;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(m);
            for (int i = 0; i < n && i < max; i++) zmq_msg_close(&fr[i]);
            return (n == 0 && zmq_errno() == EAGAIN) ? 0 : -1;
        }
        more = zmq_msg_more(m);
        if (n < max) n++;
        else { zmq_msg_close(m); (*extra)++; }
    }
    return n;
}

// >>liveness
/* ZMTP heartbeats: a PING every ivl ms; a connection with no traffic for timeout ms is closed
   (and, on the connecting side, made again). */
static void kvps__heartbeats(void *sock, int ivl, int timeout) {
    if (ivl <= 0) return;
    zmq_setsockopt(sock, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl);
    zmq_setsockopt(sock, ZMQ_HEARTBEAT_TIMEOUT, &timeout, sizeof timeout);
    zmq_setsockopt(sock, ZMQ_HEARTBEAT_TTL, &timeout, sizeof timeout);
}

/* Socket events (connects, drops) of sock, delivered to a PAIR socket *out. */
static int kvps__monitor(void *ctx, void *sock, int events, void **out) {
    static int counter;
    char ep[96];
    snprintf(ep, sizeof ep, "inproc://kvps-monitor-%p-%d", sock, __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    if (zmq_socket_monitor(sock, ep, events) != 0) return -1;
    void *m = zmq_socket(ctx, ZMQ_PAIR);
    if (!m) return -1;
    int zero = 0;
    zmq_setsockopt(m, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_connect(m, ep) != 0) { zmq_close(m); return -1; }
    *out = m;
    return 0;
}

/* Reads one event from a monitor socket without blocking: 1 and its event and value (the fd
   for a drop), 0 when none is waiting. */
static int kvps__monitor_event(void *mon, uint16_t *event, int32_t *value) {
    zmq_msg_t a, b;
    zmq_msg_init(&a);
    if (zmq_msg_recv(&a, mon, ZMQ_DONTWAIT) < 0) { zmq_msg_close(&a); return 0; }
    int ok = zmq_msg_size(&a) >= 6;
    if (ok) {
        memcpy(event, zmq_msg_data(&a), 2);
        memcpy(value, (char *)zmq_msg_data(&a) + 2, 4);
    }
    int more = zmq_msg_more(&a);
    zmq_msg_close(&a);
    while (more) { /* the endpoint frame */
        zmq_msg_init(&b);
        if (zmq_msg_recv(&b, mon, 0) < 0) { zmq_msg_close(&b); break; }
        more = zmq_msg_more(&b);
        zmq_msg_close(&b);
    }
    return ok;
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#endif /* KVPS_CORE__ZMQ_IMPLEMENTED */
