/* kvps_abi.h - v0.1 - a flat C ABI over kvps.h and kvps_ring.h, for libkvps.so and foreign callers (Python's ctypes) - MIT licence

   You rarely include this file yourself: `make` builds build/libkvps.so from lib/libkvps.c,
   which is
       #define KVPS_IMPLEMENTATION
       #include "kvps_abi.h"
   and python/kvps loads that library with ctypes. Include it (it includes kvps.h and
   kvps_ring.h) in *one* C or C++ file with KVPS_IMPLEMENTATION, or with its own switch
   KVPS_ABI_IMPLEMENTATION (which turns on kvps.h's and kvps_ring.h's as well), to build such a
   library yourself. Link libzmq, -lz, -pthread, -lm.

   CONTENTS
     1. What is flat, and why
     2. Step by step (C)
     3. Functions
     4. Errors, ownership, threads
     5. The library: libkvps.so, its symbols, pkg-config

   1. WHAT IS FLAT, AND WHY
   A caller that is not C (ctypes, cffi, a JIT's FFI) can pass integers, floats, pointers and C
   strings, and read them back through pointers; it cannot fill a desc struct whose layout
   changes between versions, and it has no kvps_result enum. So every function here:
     - takes only scalars (int, size_t, float, uint64_t), data pointers and C strings: no desc
       structs, no nested structs; the zero-means-default rule of the descs holds for its
       scalars (timeout_ms 0: the default);
     - returns an int that is a kvps_result (0: KVPS_OK; kvps_abi_result_name(rc) is its name,
       "KVPS_ERR_TIMEOUT", kvps_result_str(rc) its text) and writes handles through out
       pointers (the object, NULL on failure);
     - leaves the words of a failure in kvps_abi_last_error(), per thread: the call that failed
       and what kvps said (kvps_ring_last_error, kvps_worker_last_error, kvps_launch_last_error,
       or the error line kvps logged, whichever exists).
   Data goes by pointer, element count and dtype (kvps_dtype as an int: 0 float32, 1 float64,
   2 int32, 3 int64, 4 float16, 5 bfloat16), so any array whose memory is one contiguous block
   (a numpy array's ctypes.data, a torch tensor's data_ptr()) is used where it lies: nothing is
   copied on the way in or out. The public kvps_* functions that are flat already are used as
   they are and are exported by libkvps.so too: kvps_ring_rank, kvps_ring_size,
   kvps_ring_endpoint, kvps_ring_transport, kvps_server_endpoint, kvps_result_str,
   kvps_dtype_size, kvps_dtype_name, kvps_redop_name.
   A worker is wrapped (kvps_abi_worker): it remembers each tensor's length and each table's
   dim, so a push of the wrong number of floats is refused here, naming the tensor and both
   lengths, instead of reading past the caller's array; kvps_abi_worker_handle gives the
   kvps_worker inside for C code. Rings and servers are kvps's own objects.

   2. STEP BY STEP (C; python/kvps does the same through ctypes)
       kvps_ring *r = NULL;                                  // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
       if (kvps_abi_ring_from_env(0, &r) != 0) fprintf(stderr, "%s\n", kvps_abi_last_error());
       kvps_abi_ring_allreduce(r, g, g, n, 0, 0);            // float32, sum, in place
       kvps_abi_ring_destroy(&r);

       int role, rank, ns, nw;                               // a parameter-server job
       kvps_abi_env_read(&role, &rank, &ns, &nw);            // KVPS_NUM_SERVERS=2 and the above
       if (role == KVPS_ROLE_SERVER) {
           kvps_server *s = NULL;
           kvps_abi_server_from_env(KVPS_BSP, KVPS_UPDATE_SGD, 0.1f, 0, &s);
           kvps_abi_server_run(s);                           // until every worker has finished
           kvps_abi_server_destroy(&s);
       } else {
           kvps_abi_worker *w = NULL; int t; uint64_t q;
           kvps_abi_worker_from_env(0, &w);
           kvps_abi_worker_tensor(w, "w", 4, &t);
           kvps_abi_worker_pushpull(w, t, grad, weights, 4, &q);
           kvps_abi_worker_wait(w, q, -1);
           kvps_abi_worker_finish(w, -1);
           kvps_abi_worker_destroy(&w);
       }

   3. FUNCTIONS
     general   kvps_abi_version (1, this ABI's), kvps_abi_last_error, kvps_abi_result_name,
               kvps_abi_log_level (KVPS_LOG_*: 0 none .. 4 debug; -1: $KVPS_LOG again)
     launch    kvps_abi_env_read: role (1 server, 2 worker), rank, servers and workers from the
               environment (kvps_env_read; with MASTER_ADDR / MASTER_PORT the rendezvous of
               kvps_launch.h). Read once per process: a rendezvous happens once, later calls
               return what the first found. kvps_abi_local_rank: the launcher's (or the
               rendezvous's) local rank and size, -1 where none says.
     ring      kvps_abi_ring_from_env (kvps_ring_env_read, then kvps_ring_create), _create
               (rank, size, peers, timeout_ms), _destroy, _split; the collectives allreduce,
               reduce, broadcast, allgather, reduce_scatter, gather, scatter, alltoall, barrier
               and send / recv: kvps_ring.h's, with its counts (section 2 of its manual: count
               is per rank where data is cut by rank), dtype and op as ints.
               kvps_abi_ring_allreduce_wire: a float32 all-reduce with float16 (wire 4) or
               bfloat16 (5) on the wire (kvps_ring_allreduce_wire); _allreduce_topk: the sparse
               all-reduce of float32 (kvps_ring_allreduce_topk: the k largest |buf + residual| of
               each rank, summed in rank order; residual may be NULL).
     worker    kvps_abi_worker_from_env / _create (servers, rank, num_workers, timeout_ms),
               _handle, _tensor (name, len: the same name again with the same len gives the
               same handle), _tensor_optim (rule and lr, momentum, beta1, beta2, eps: kvps_optim;
               0: defaults; _tensor_optim_wd adds weight_decay, KVPS_RULE_ADAMW's and user
               rules'), _push / _pull / _pushpull / _init (count must be the tensor's len),
               _barrier, _wait, _table (name, dim, rule and its hyper-parameters, init_scale,
               seed), _push_rows / _pull_rows (count: the floats of the array, nrows * dim),
               _finish, _destroy. The requests are kvps.h's: wait for each with _wait.
     server    kvps_abi_server_from_env (its shard's chain of replicas too, as kvps_env_read
               gives it) / _create (endpoint, rank, num_workers, consistency, update, lr,
               staleness), _run (in the calling thread), _start (on a thread of its
               own), _wait, _stop, _destroy; kvps_server_endpoint for the bound endpoint.

   4. ERRORS, OWNERSHIP, THREADS
   Arguments are checked first (a NULL handle or out pointer, a count that is not the
   tensor's): KVPS_ERR_INVALID_ARG with the reason in kvps_abi_last_error; the rest are kvps's
   own results with kvps's words. kvps_abi_last_error is this thread's, and a call that
   succeeds leaves it as it was. The objects' rules are their headers': buffers are borrowed
   until the call returns (a worker's request: until _wait returns for it), a ring is used by
   one thread at a time and is broken after an error (kvps_ring.h, 5.), a worker by one thread
   at a time; a sub-ring is destroyed before its parent. _destroy(&x) frees x and sets it to
   NULL; NULL is harmless. To name what kvps_env_read and the constructors log, the first call
   of this ABI that may log installs a log callback that keeps each thread's last error line
   and prints every line as kvps does by default ("kvps error: ..." on stderr), unless the
   program has set its own with kvps_log_set_fn (then only the result's text is given). Lines
   below the log level are neither printed nor kept: under KVPS_LOG=none a failure that kvps
   only logs (kvps_env_read's, a server's) comes with the result's text alone.

   5. THE LIBRARY
   lib/libkvps.c is compiled -fPIC -shared -fvisibility=hidden with
   KVPS_API='extern __attribute__((visibility("default")))', so libkvps.so exports exactly the
   public kvps_* API of the headers and this ABI (`nm -D build/libkvps.so`), none of the kvps__
   internals. `make install` installs it next to the headers' pkg-config file; a program that
   links it instead of defining KVPS_IMPLEMENTATION uses `-lkvps` (pkg-config --libs kvps), one
   that defines it keeps building as before.
*/
/* This header's switch implies kvps.h's and kvps_ring.h's, set before kvps_core.h reads its
   table of implementation switches (which turns on what those two stand on). */
#if defined(KVPS_ABI_IMPLEMENTATION) && !defined(KVPS_PS_IMPLEMENTATION)
#define KVPS_PS_IMPLEMENTATION
#endif
#if defined(KVPS_ABI_IMPLEMENTATION) && !defined(KVPS_RING_IMPLEMENTATION)
#define KVPS_RING_IMPLEMENTATION
#endif
#include "kvps_core.h"
#ifndef KVPS_ABI_H
#define KVPS_ABI_H
#include "kvps.h"
#include "kvps_ring.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVPS_ABI_VERSION 1

typedef struct kvps_abi_worker kvps_abi_worker;

/* general */
KVPS_API int kvps_abi_version(void);
KVPS_API const char *kvps_abi_last_error(void);
KVPS_API const char *kvps_abi_result_name(int rc);
KVPS_API void kvps_abi_log_level(int level);

/* launch */
KVPS_API int kvps_abi_env_read(int *role, int *rank, int *num_servers, int *num_workers);
KVPS_API int kvps_abi_local_rank(int *local_rank, int *local_size);

/* ring */
KVPS_API int kvps_abi_ring_from_env(int timeout_ms, kvps_ring **out);
KVPS_API int kvps_abi_ring_create(int rank, int size, const char *peers, int timeout_ms, kvps_ring **out);
KVPS_API void kvps_abi_ring_destroy(kvps_ring **r);
KVPS_API int kvps_abi_ring_split(kvps_ring *r, int colour, int key, kvps_ring **out);
KVPS_API int kvps_abi_ring_allreduce(kvps_ring *r, const void *send, void *recv, size_t count, int dtype, int op);
KVPS_API int kvps_abi_ring_reduce(kvps_ring *r, const void *send, void *recv, size_t count, int dtype, int op, int root);
KVPS_API int kvps_abi_ring_broadcast(kvps_ring *r, const void *send, void *recv, size_t count, int dtype, int root);
KVPS_API int kvps_abi_ring_allgather(kvps_ring *r, const void *send, void *recv, size_t count, int dtype);
KVPS_API int kvps_abi_ring_reduce_scatter(kvps_ring *r, const void *send, void *recv, size_t count, int dtype, int op);
KVPS_API int kvps_abi_ring_gather(kvps_ring *r, const void *send, void *recv, size_t count, int dtype, int root);
KVPS_API int kvps_abi_ring_scatter(kvps_ring *r, const void *send, void *recv, size_t count, int dtype, int root);
KVPS_API int kvps_abi_ring_alltoall(kvps_ring *r, const void *send, void *recv, size_t count, int dtype);
KVPS_API int kvps_abi_ring_barrier(kvps_ring *r);
KVPS_API int kvps_abi_ring_allreduce_wire(kvps_ring *r, const void *send, void *recv, size_t count, int op, int wire);
KVPS_API int kvps_abi_ring_allreduce_topk(kvps_ring *r, float *buf, size_t count, size_t k, float *residual);
KVPS_API int kvps_abi_ring_send(kvps_ring *r, const void *buf, size_t count, int dtype, int dst, uint32_t tag);
KVPS_API int kvps_abi_ring_recv(kvps_ring *r, void *buf, size_t count, int dtype, int src, uint32_t tag);

/* worker */
KVPS_API int kvps_abi_worker_from_env(int timeout_ms, kvps_abi_worker **out);
KVPS_API int kvps_abi_worker_create(const char *servers, int rank, int num_workers, int timeout_ms, kvps_abi_worker **out);
KVPS_API kvps_worker *kvps_abi_worker_handle(kvps_abi_worker *w);
KVPS_API int kvps_abi_worker_tensor(kvps_abi_worker *w, const char *name, size_t len, int *out);
KVPS_API int kvps_abi_worker_tensor_optim(kvps_abi_worker *w, int t, int rule, float lr, float momentum, float beta1,
                                          float beta2, float eps, uint64_t *req);
KVPS_API int kvps_abi_worker_tensor_optim_wd(kvps_abi_worker *w, int t, int rule, float lr, float momentum, float beta1,
                                             float beta2, float eps, float weight_decay, uint64_t *req);
KVPS_API int kvps_abi_worker_push(kvps_abi_worker *w, int t, const float *grad, size_t count, uint64_t *req);
KVPS_API int kvps_abi_worker_pull(kvps_abi_worker *w, int t, float *vals, size_t count, uint64_t *req);
KVPS_API int kvps_abi_worker_pushpull(kvps_abi_worker *w, int t, const float *grad, float *vals, size_t count, uint64_t *req);
KVPS_API int kvps_abi_worker_init(kvps_abi_worker *w, int t, const float *vals, size_t count, uint64_t *req);
KVPS_API int kvps_abi_worker_barrier(kvps_abi_worker *w, uint64_t *req);
KVPS_API int kvps_abi_worker_wait(kvps_abi_worker *w, uint64_t req, int timeout_ms);
KVPS_API int kvps_abi_worker_table(kvps_abi_worker *w, const char *name, uint32_t dim, int rule, float lr, float momentum,
                                   float beta1, float beta2, float eps, float init_scale, uint64_t seed, int *out,
                                   uint64_t *req);
KVPS_API int kvps_abi_worker_push_rows(kvps_abi_worker *w, int table, const uint64_t *ids, size_t nrows, const float *grads,
                                       size_t count, uint64_t *req);
KVPS_API int kvps_abi_worker_pull_rows(kvps_abi_worker *w, int table, const uint64_t *ids, size_t nrows, float *rows,
                                       size_t count, uint64_t *req);
KVPS_API int kvps_abi_worker_finish(kvps_abi_worker *w, int timeout_ms);
KVPS_API void kvps_abi_worker_destroy(kvps_abi_worker **w);

/* server */
KVPS_API int kvps_abi_server_from_env(int consistency, int update, float lr, int staleness, kvps_server **out);
KVPS_API int kvps_abi_server_create(const char *endpoint, int rank, int num_workers, int consistency, int update, float lr,
                                    int staleness, kvps_server **out);
KVPS_API int kvps_abi_server_run(kvps_server *s);
KVPS_API int kvps_abi_server_start(kvps_server *s);
KVPS_API int kvps_abi_server_wait(kvps_server *s, int timeout_ms);
KVPS_API void kvps_abi_server_stop(kvps_server *s);
KVPS_API void kvps_abi_server_destroy(kvps_server **s);

#ifdef __cplusplus
}
#endif
#endif /* KVPS_ABI_H */

/* ============================================================================================ */
#if (defined(KVPS_IMPLEMENTATION) || defined(KVPS_ABI_IMPLEMENTATION)) && !defined(KVPS_ABI__IMPLEMENTED)
#define KVPS_ABI__IMPLEMENTED
/* Sections (grep "// >>name"), lowest layer first:
     errors       the per-thread last error, result names, the log callback that keeps error lines
     launch       the environment, read once; the local rank
     ring         create, destroy, split, every collective and send / recv
     worker       the wrapped worker: tensors and their lengths, push / pull, tables, finish
     server       create, run, start, wait, stop, destroy */

// >>errors
static KVPS__TLS char kvps_abi__err[1024];
static KVPS__TLS char kvps_abi__logged[512]; /* this thread's last error line kvps logged */

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int kvps_abi__fail(int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kvps_abi__err, sizeof kvps_abi__err, fmt, ap);
    va_end(ap);
    return rc;
}

/* A call's result: OK as it is; else the call's name, the result and kvps's words (words may
   be NULL or empty: then the error line logged during the call, if any). */
static int kvps_abi__result(kvps_result rc, const char *call, const char *words) {
    if (rc == KVPS_OK) return 0;
    if (!words || !*words) words = kvps_abi__logged;
    return kvps_abi__fail((int)rc, "%s: %s%s%s", call, kvps_result_str(rc), *words ? ": " : "", words);
}

KVPS_API const char *kvps_abi_last_error(void) { return kvps_abi__err; }
KVPS_API int kvps_abi_version(void) { return KVPS_ABI_VERSION; }

KVPS_API const char *kvps_abi_result_name(int rc) {
#define KVPS_ABI__NAME(name, value, text) if (rc == (value)) return #name;
    KVPS__RESULTS(KVPS_ABI__NAME)
#undef KVPS_ABI__NAME
    return "?";
}

KVPS_API void kvps_abi_log_level(int level) {
    if (level >= 0 && level < KVPS_LOG_COUNT) kvps_log_set_level((kvps_log_level)level);
    else __atomic_store_n(&kvps__log_level, -1, __ATOMIC_RELAXED); /* $KVPS_LOG is read again */
}

/* kvps's default output, and each thread's last error line kept for its result. */
static void kvps_abi__log(void *user, kvps_log_level level, const char *msg) {
    static const char *tag[] = {"", "error", "warn", "info", "debug"};
    (void)user;
    if (level == KVPS_LOG_ERROR) snprintf(kvps_abi__logged, sizeof kvps_abi__logged, "%s", msg);
    fprintf(stderr, "kvps %s: %s\n", (unsigned)level < KVPS_LOG_COUNT ? tag[level] : "?", msg);
}
static void kvps_abi__log_install(void) {
    pthread_mutex_lock(&kvps__log_mu); /* kvps_core.h's: the callback is left alone if the program set one */
    if (!kvps__log_fn) kvps__log_fn = kvps_abi__log;
    pthread_mutex_unlock(&kvps__log_mu);
}
/* Every call that may log starts here: the callback is in place, this thread's line cleared. */
static void kvps_abi__begin(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, kvps_abi__log_install);
    kvps_abi__logged[0] = 0;
}

// >>launch
static pthread_mutex_t kvps_abi__env_mu = PTHREAD_MUTEX_INITIALIZER;
static kvps_env kvps_abi__env;
static char kvps_abi__servers[8192]; /* env.servers points into the environment or the rendezvous's table: a copy */
static int kvps_abi__env_read = 0;   /* 1: read (the result below); a failure is read again next time */

/* The environment, read once per process (a rendezvous cannot happen twice). */
static int kvps_abi__env_get(kvps_env *out) {
    kvps_abi__begin();
    pthread_mutex_lock(&kvps_abi__env_mu);
    kvps_result rc = KVPS_OK;
    if (!kvps_abi__env_read) {
        rc = kvps_env_read(&kvps_abi__env);
        if (rc == KVPS_OK && kvps_abi__env.servers) {
            snprintf(kvps_abi__servers, sizeof kvps_abi__servers, "%s", kvps_abi__env.servers);
            kvps_abi__env.servers = kvps_abi__servers;
        }
        kvps_abi__env_read = rc == KVPS_OK;
    }
    if (rc == KVPS_OK) *out = kvps_abi__env;
    pthread_mutex_unlock(&kvps_abi__env_mu);
    return kvps_abi__result(rc, "kvps_env_read", kvps_launch_last_error());
}

KVPS_API int kvps_abi_env_read(int *role, int *rank, int *num_servers, int *num_workers) {
    if (!role || !rank || !num_servers || !num_workers) return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "kvps_abi_env_read: a NULL argument");
    kvps_env e;
    int rc = kvps_abi__env_get(&e);
    if (rc != 0) return rc;
    *role = (int)e.role;
    *rank = e.rank;
    *num_servers = e.num_servers;
    *num_workers = e.num_workers;
    return 0;
}

KVPS_API int kvps_abi_local_rank(int *local_rank, int *local_size) {
    if (!local_rank || !local_size) return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "kvps_abi_local_rank: a NULL argument");
    kvps_launch_local(local_rank, local_size);
    return 0;
}

// >>ring
#define KVPS_ABI__NEED(x, call) \
    do { if (!(x)) return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "%s: %s is NULL", call, #x); } while (0)
/* A collective's result, with the ring's words. */
static int kvps_abi__ring(kvps_ring *r, kvps_result rc, const char *call) {
    return kvps_abi__result(rc, call, kvps_ring_last_error(r));
}

KVPS_API int kvps_abi_ring_create(int rank, int size, const char *peers, int timeout_ms, kvps_ring **out) {
    KVPS_ABI__NEED(out, "kvps_ring_create");
    *out = NULL;
    KVPS_ABI__NEED(peers, "kvps_ring_create");
    kvps_abi__begin();
    kvps_ring_desc d; /* (fields set one by one: this also compiles as C++) */
    memset(&d, 0, sizeof d);
    d.rank = rank;
    d.size = size;
    d.peers = peers;
    d.timeout_ms = timeout_ms;
    kvps_result rc = kvps_ring_create(&d, out);
    return kvps_abi__result(rc, "kvps_ring_create", kvps_ring_last_error(NULL));
}

KVPS_API int kvps_abi_ring_from_env(int timeout_ms, kvps_ring **out) {
    KVPS_ABI__NEED(out, "kvps_ring_env_read");
    *out = NULL;
    int rank = -1, size = 0;
    const char *peers = NULL;
    kvps_abi__begin();
    kvps_result rc = kvps_ring_env_read(&rank, &size, &peers);
    if (rc != KVPS_OK) return kvps_abi__result(rc, "kvps_ring_env_read", kvps_ring_last_error(NULL));
    return kvps_abi_ring_create(rank, size, peers, timeout_ms, out);
}

KVPS_API void kvps_abi_ring_destroy(kvps_ring **r) { kvps_ring_destroy(r); }

KVPS_API int kvps_abi_ring_split(kvps_ring *r, int colour, int key, kvps_ring **out) {
    KVPS_ABI__NEED(r, "kvps_ring_split");
    KVPS_ABI__NEED(out, "kvps_ring_split");
    *out = NULL;
    return kvps_abi__ring(r, kvps_ring_split(r, colour, key, out), "kvps_ring_split");
}

/* A collective's dtype, op and root, checked here (before the int becomes an enum) and named:
   kvps_ring.h refuses them too, with KVPS_ERR_INVALID_ARG alone. op -1 / root -1: none. */
static int kvps_abi__args(const kvps_ring *r, const char *call, int dtype, int op, int root) {
    if (!r) return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "%s: the ring is NULL", call);
    if (dtype < 0 || dtype >= KVPS_DTYPE_COUNT)
        return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "%s: no dtype %d (0 float32 .. %d)", call, dtype, KVPS_DTYPE_COUNT - 1);
    if (op != -1 && (op < 0 || op >= KVPS_REDOP_COUNT))
        return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "%s: no reduction op %d (0 sum .. %d)", call, op, KVPS_REDOP_COUNT - 1);
    if (root != -1 && (root < 0 || root >= kvps_ring_size(r)))
        return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "%s: root %d is not a rank of this ring of %d", call, root, kvps_ring_size(r));
    return 0;
}
#define KVPS_ABI__DT(d) ((kvps_dtype)(d))
#define KVPS_ABI__OP(o) ((kvps_redop)(o))
#define KVPS_ABI__ARGS(call, dtype, op, root) \
    do { int a_ = kvps_abi__args(r, call, dtype, op, root); if (a_ != 0) return a_; } while (0)

KVPS_API int kvps_abi_ring_allreduce(kvps_ring *r, const void *send, void *recv, size_t count, int dtype, int op) {
    KVPS_ABI__ARGS("allreduce", dtype, op, -1);
    return kvps_abi__ring(r, kvps_ring_allreduce(r, send, recv, count, KVPS_ABI__DT(dtype), KVPS_ABI__OP(op)), "allreduce");
}
KVPS_API int kvps_abi_ring_reduce(kvps_ring *r, const void *send, void *recv, size_t count, int dtype, int op, int root) {
    KVPS_ABI__ARGS("reduce", dtype, op, root);
    return kvps_abi__ring(r, kvps_ring_reduce(r, send, recv, count, KVPS_ABI__DT(dtype), KVPS_ABI__OP(op), root), "reduce");
}
KVPS_API int kvps_abi_ring_broadcast(kvps_ring *r, const void *send, void *recv, size_t count, int dtype, int root) {
    KVPS_ABI__ARGS("broadcast", dtype, -1, root);
    return kvps_abi__ring(r, kvps_ring_broadcast(r, send, recv, count, KVPS_ABI__DT(dtype), root), "broadcast");
}
KVPS_API int kvps_abi_ring_allgather(kvps_ring *r, const void *send, void *recv, size_t count, int dtype) {
    KVPS_ABI__ARGS("allgather", dtype, -1, -1);
    return kvps_abi__ring(r, kvps_ring_allgather(r, send, recv, count, KVPS_ABI__DT(dtype)), "allgather");
}
KVPS_API int kvps_abi_ring_reduce_scatter(kvps_ring *r, const void *send, void *recv, size_t count, int dtype, int op) {
    KVPS_ABI__ARGS("reduce_scatter", dtype, op, -1);
    return kvps_abi__ring(r, kvps_ring_reduce_scatter(r, send, recv, count, KVPS_ABI__DT(dtype), KVPS_ABI__OP(op)),
                          "reduce_scatter");
}
KVPS_API int kvps_abi_ring_gather(kvps_ring *r, const void *send, void *recv, size_t count, int dtype, int root) {
    KVPS_ABI__ARGS("gather", dtype, -1, root);
    return kvps_abi__ring(r, kvps_ring_gather(r, send, recv, count, KVPS_ABI__DT(dtype), root), "gather");
}
KVPS_API int kvps_abi_ring_scatter(kvps_ring *r, const void *send, void *recv, size_t count, int dtype, int root) {
    KVPS_ABI__ARGS("scatter", dtype, -1, root);
    return kvps_abi__ring(r, kvps_ring_scatter(r, send, recv, count, KVPS_ABI__DT(dtype), root), "scatter");
}
KVPS_API int kvps_abi_ring_alltoall(kvps_ring *r, const void *send, void *recv, size_t count, int dtype) {
    KVPS_ABI__ARGS("alltoall", dtype, -1, -1);
    return kvps_abi__ring(r, kvps_ring_alltoall(r, send, recv, count, KVPS_ABI__DT(dtype)), "alltoall");
}
KVPS_API int kvps_abi_ring_barrier(kvps_ring *r) {
    KVPS_ABI__NEED(r, "barrier");
    return kvps_abi__ring(r, kvps_ring_barrier(r), "barrier");
}
KVPS_API int kvps_abi_ring_allreduce_wire(kvps_ring *r, const void *send, void *recv, size_t count, int op, int wire) {
    KVPS_ABI__ARGS("allreduce_wire", KVPS_FLOAT32, op, -1);
    if (wire != KVPS_FLOAT16 && wire != KVPS_BFLOAT16)
        return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "allreduce_wire: wire dtype %d is not float16 (%d) or bfloat16 (%d)", wire,
                              (int)KVPS_FLOAT16, (int)KVPS_BFLOAT16);
    return kvps_abi__ring(r, kvps_ring_allreduce_wire(r, send, recv, count, KVPS_ABI__OP(op), KVPS_ABI__DT(wire)),
                          "allreduce_wire");
}
KVPS_API int kvps_abi_ring_allreduce_topk(kvps_ring *r, float *buf, size_t count, size_t k, float *residual) {
    KVPS_ABI__NEED(r, "allreduce_topk");
    if (!buf && count) return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "allreduce_topk: buf is NULL with count %zu", count);
    if (k > count || count > UINT32_MAX)
        return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "allreduce_topk: k %zu of count %zu (k <= count <= 2^32 - 1 needed)", k, count);
    return kvps_abi__ring(r, kvps_ring_allreduce_topk(r, buf, count, k, residual), "allreduce_topk");
}
KVPS_API int kvps_abi_ring_send(kvps_ring *r, const void *buf, size_t count, int dtype, int dst, uint32_t tag) {
    KVPS_ABI__ARGS("send", dtype, -1, -1);
    if (dst < 0 || dst >= kvps_ring_size(r))
        return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "send: dst %d is not a rank of this ring of %d", dst, kvps_ring_size(r));
    return kvps_abi__ring(r, kvps_ring_send(r, buf, count, KVPS_ABI__DT(dtype), dst, tag), "send");
}
KVPS_API int kvps_abi_ring_recv(kvps_ring *r, void *buf, size_t count, int dtype, int src, uint32_t tag) {
    KVPS_ABI__ARGS("recv", dtype, -1, -1);
    if (src < 0 || src >= kvps_ring_size(r))
        return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "recv: src %d is not a rank of this ring of %d", src, kvps_ring_size(r));
    return kvps_abi__ring(r, kvps_ring_recv(r, buf, count, KVPS_ABI__DT(dtype), src, tag), "recv");
}

// >>worker
typedef struct kvps_abi__named { char *name; size_t n; } kvps_abi__named; /* a tensor's len, a table's dim */
struct kvps_abi_worker {
    kvps_worker *w;
    kvps_abi__named *tensors; /* by kvps_tensor handle */
    int ntensors;
    kvps_abi__named *tables;  /* by kvps_table handle */
    int ntables;
};

/* A worker call's result, with the worker's words. */
static int kvps_abi__wk(const kvps_abi_worker *w, kvps_result rc, const char *call) {
    return kvps_abi__result(rc, call, w ? kvps_worker_last_error(w->w) : NULL);
}

static int kvps_abi__wrap(kvps_worker *kw, kvps_abi_worker **out) {
    *out = (kvps_abi_worker *)calloc(1, sizeof **out);
    if (!*out) {
        kvps_worker_destroy(&kw);
        return kvps_abi__fail(KVPS_ERR_NOMEM, "kvps_worker_create: out of memory");
    }
    (*out)->w = kw;
    return 0;
}

KVPS_API int kvps_abi_worker_create(const char *servers, int rank, int num_workers, int timeout_ms, kvps_abi_worker **out) {
    KVPS_ABI__NEED(out, "kvps_worker_create");
    *out = NULL;
    KVPS_ABI__NEED(servers, "kvps_worker_create");
    kvps_abi__begin();
    kvps_worker *kw = NULL;
    kvps_worker_desc d;
    memset(&d, 0, sizeof d);
    d.servers = servers;
    d.rank = rank;
    d.num_workers = num_workers;
    d.timeout_ms = timeout_ms;
    kvps_result rc = kvps_worker_create(&d, &kw);
    if (rc != KVPS_OK) return kvps_abi__result(rc, "kvps_worker_create", NULL);
    return kvps_abi__wrap(kw, out);
}

KVPS_API int kvps_abi_worker_from_env(int timeout_ms, kvps_abi_worker **out) {
    KVPS_ABI__NEED(out, "kvps_worker_create");
    *out = NULL;
    kvps_env e;
    int rc = kvps_abi__env_get(&e);
    if (rc != 0) return rc;
    if (e.role != KVPS_ROLE_WORKER)
        return kvps_abi__fail(KVPS_ERR_ENV, "kvps_worker_create: the environment makes this process server %d of %d, "
                              "not a worker", e.rank, e.num_servers);
    return kvps_abi_worker_create(e.servers, e.rank, e.num_workers, timeout_ms, out);
}

KVPS_API kvps_worker *kvps_abi_worker_handle(kvps_abi_worker *w) { return w ? w->w : NULL; }

/* Records handle h's name and size n in *list (grown to h + 1 entries). */
static int kvps_abi__remember(kvps_abi__named **list, int *len, int h, const char *name, size_t n) {
    if (h < 0) return kvps_abi__fail(KVPS_ERR_STATE, "kvps gave a negative handle for '%s'", name);
    if (h >= *len) {
        kvps_abi__named *nl = (kvps_abi__named *)realloc(*list, (size_t)(h + 1) * sizeof *nl);
        if (!nl) return kvps_abi__fail(KVPS_ERR_NOMEM, "'%s': out of memory", name);
        memset(nl + *len, 0, (size_t)(h + 1 - *len) * sizeof *nl);
        *list = nl;
        *len = h + 1;
    }
    free((*list)[h].name);
    (*list)[h].name = (char *)malloc(strlen(name) + 1);
    if (!(*list)[h].name) return kvps_abi__fail(KVPS_ERR_NOMEM, "'%s': out of memory", name);
    memcpy((*list)[h].name, name, strlen(name) + 1);
    (*list)[h].n = n;
    return 0;
}

KVPS_API int kvps_abi_worker_tensor(kvps_abi_worker *w, const char *name, size_t len, int *out) {
    KVPS_ABI__NEED(w, "tensor");
    KVPS_ABI__NEED(name, "tensor");
    KVPS_ABI__NEED(out, "tensor");
    for (int i = 0; i < w->ntensors; i++)
        if (w->tensors[i].name && strcmp(w->tensors[i].name, name) == 0) {
            if (w->tensors[i].n != len)
                return kvps_abi__fail(KVPS_ERR_TENSOR, "tensor '%s': registered with %zu floats, now asked for with %zu",
                                      name, w->tensors[i].n, len);
            *out = i;
            return 0;
        }
    kvps_abi__begin();
    kvps_tensor t = -1;
    kvps_result rc = kvps_worker_tensor(w->w, name, len, &t);
    if (rc != KVPS_OK) return kvps_abi__wk(w, rc, "tensor");
    *out = t;
    return kvps_abi__remember(&w->tensors, &w->ntensors, t, name, len);
}

/* Tensor t of w with count floats (SIZE_MAX: any), or the reason it is not. */
static int kvps_abi__tensor_ok(const kvps_abi_worker *w, int t, size_t count, const char *call) {
    if (!w) return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "%s: the worker is NULL", call);
    if (t < 0 || t >= w->ntensors || !w->tensors[t].name)
        return kvps_abi__fail(KVPS_ERR_TENSOR, "%s: no tensor %d on this worker (kvps_abi_worker_tensor gives them)", call, t);
    if (count != SIZE_MAX && count != w->tensors[t].n)
        return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "%s: tensor '%s' has %zu floats, the array %zu", call, w->tensors[t].name,
                              w->tensors[t].n, count);
    return 0;
}

KVPS_API int kvps_abi_worker_tensor_optim(kvps_abi_worker *w, int t, int rule, float lr, float momentum, float beta1,
                                          float beta2, float eps, uint64_t *req) {
    return kvps_abi_worker_tensor_optim_wd(w, t, rule, lr, momentum, beta1, beta2, eps, 0.0f, req);
}
KVPS_API int kvps_abi_worker_tensor_optim_wd(kvps_abi_worker *w, int t, int rule, float lr, float momentum, float beta1,
                                             float beta2, float eps, float weight_decay, uint64_t *req) {
    KVPS_ABI__NEED(req, "tensor_optim");
    int rc = kvps_abi__tensor_ok(w, t, SIZE_MAX, "tensor_optim");
    if (rc != 0) return rc;
    if (rule < 0 || rule >= KVPS_RULE_COUNT)
        return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "tensor_optim: tensor '%s': no rule %d (0 to %d)", w->tensors[t].name, rule,
                              KVPS_RULE_COUNT - 1);
    kvps_optim o = {(kvps_rule)rule, lr, momentum, beta1, beta2, eps, weight_decay};
    return kvps_abi__wk(w, kvps_worker_tensor_optim(w->w, t, &o, req), "tensor_optim");
}

KVPS_API int kvps_abi_worker_push(kvps_abi_worker *w, int t, const float *grad, size_t count, uint64_t *req) {
    int rc = kvps_abi__tensor_ok(w, t, count, "push");
    if (rc != 0) return rc;
    return kvps_abi__wk(w, kvps_worker_push_tensor(w->w, t, grad, req), "push");
}
KVPS_API int kvps_abi_worker_pull(kvps_abi_worker *w, int t, float *vals, size_t count, uint64_t *req) {
    int rc = kvps_abi__tensor_ok(w, t, count, "pull");
    if (rc != 0) return rc;
    return kvps_abi__wk(w, kvps_worker_pull_tensor(w->w, t, vals, req), "pull");
}
KVPS_API int kvps_abi_worker_pushpull(kvps_abi_worker *w, int t, const float *grad, float *vals, size_t count, uint64_t *req) {
    int rc = kvps_abi__tensor_ok(w, t, count, "pushpull");
    if (rc != 0) return rc;
    return kvps_abi__wk(w, kvps_worker_pushpull_tensor(w->w, t, grad, vals, req), "pushpull");
}
KVPS_API int kvps_abi_worker_init(kvps_abi_worker *w, int t, const float *vals, size_t count, uint64_t *req) {
    int rc = kvps_abi__tensor_ok(w, t, count, "init");
    if (rc != 0) return rc;
    return kvps_abi__wk(w, kvps_worker_init_tensor(w->w, t, vals, req), "init");
}
KVPS_API int kvps_abi_worker_barrier(kvps_abi_worker *w, uint64_t *req) {
    KVPS_ABI__NEED(w, "barrier");
    return kvps_abi__wk(w, kvps_worker_barrier(w->w, req), "barrier");
}
KVPS_API int kvps_abi_worker_wait(kvps_abi_worker *w, uint64_t req, int timeout_ms) {
    KVPS_ABI__NEED(w, "wait");
    return kvps_abi__wk(w, kvps_worker_wait(w->w, req, timeout_ms), "wait");
}

KVPS_API int kvps_abi_worker_table(kvps_abi_worker *w, const char *name, uint32_t dim, int rule, float lr, float momentum,
                                   float beta1, float beta2, float eps, float init_scale, uint64_t seed, int *out,
                                   uint64_t *req) {
    KVPS_ABI__NEED(w, "table");
    KVPS_ABI__NEED(name, "table");
    KVPS_ABI__NEED(out, "table");
    if (rule < 0 || rule >= KVPS_RULE_COUNT)
        return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "table '%s': no rule %d (0 to %d)", name, rule, KVPS_RULE_COUNT - 1);
    kvps_table_desc d = {name, dim, {(kvps_rule)rule, lr, momentum, beta1, beta2, eps, 0.0f}, init_scale, seed};
    kvps_table t = -1;
    kvps_abi__begin();
    kvps_result rc = kvps_worker_table(w->w, &d, &t, req);
    if (rc != KVPS_OK) return kvps_abi__wk(w, rc, "table");
    *out = t;
    return kvps_abi__remember(&w->tables, &w->ntables, t, name, dim);
}

/* Table t of w, and count == nrows * its dim, or the reason not. */
static int kvps_abi__rows_ok(const kvps_abi_worker *w, int t, size_t nrows, size_t count, const char *call) {
    if (!w) return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "%s: the worker is NULL", call);
    if (t < 0 || t >= w->ntables || !w->tables[t].name)
        return kvps_abi__fail(KVPS_ERR_TABLE, "%s: no table %d on this worker (kvps_abi_worker_table gives them)", call, t);
    size_t dim = w->tables[t].n;
    if (nrows > SIZE_MAX / dim || count != nrows * dim)
        return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "%s: table '%s': %zu rows of dim %zu, the array has %zu floats", call,
                              w->tables[t].name, nrows, dim, count);
    return 0;
}

KVPS_API int kvps_abi_worker_push_rows(kvps_abi_worker *w, int table, const uint64_t *ids, size_t nrows, const float *grads,
                                       size_t count, uint64_t *req) {
    int rc = kvps_abi__rows_ok(w, table, nrows, count, "push_rows");
    if (rc != 0) return rc;
    return kvps_abi__wk(w, kvps_worker_push_rows(w->w, table, ids, grads, nrows, req), "push_rows");
}
KVPS_API int kvps_abi_worker_pull_rows(kvps_abi_worker *w, int table, const uint64_t *ids, size_t nrows, float *rows,
                                       size_t count, uint64_t *req) {
    int rc = kvps_abi__rows_ok(w, table, nrows, count, "pull_rows");
    if (rc != 0) return rc;
    return kvps_abi__wk(w, kvps_worker_pull_rows(w->w, table, ids, rows, nrows, req), "pull_rows");
}

KVPS_API int kvps_abi_worker_finish(kvps_abi_worker *w, int timeout_ms) {
    KVPS_ABI__NEED(w, "finish");
    return kvps_abi__wk(w, kvps_worker_finish(w->w, timeout_ms), "finish");
}

KVPS_API void kvps_abi_worker_destroy(kvps_abi_worker **wp) {
    if (!wp || !*wp) return;
    kvps_abi_worker *w = *wp;
    kvps_worker_destroy(&w->w);
    for (int i = 0; i < w->ntensors; i++) free(w->tensors[i].name);
    for (int i = 0; i < w->ntables; i++) free(w->tables[i].name);
    free(w->tensors);
    free(w->tables);
    free(w);
    *wp = NULL;
}

// >>server
/* A server from the flat arguments; replicas / replica / replacement: kvps_env's (NULL, 0, 0: none). */
static int kvps_abi__server(const char *endpoint, int rank, int num_workers, int consistency, int update, float lr,
                            int staleness, const char *replicas, int replica, int replacement, kvps_server **out) {
    if (consistency < 0 || consistency >= KVPS_CONSISTENCY_COUNT)
        return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "kvps_server_create: no consistency %d (0 to %d)", consistency,
                              KVPS_CONSISTENCY_COUNT - 1);
    if (update < 0 || update >= KVPS_UPDATE_COUNT || update == KVPS_UPDATE_CUSTOM)
        return kvps_abi__fail(KVPS_ERR_INVALID_ARG, "kvps_server_create: update %d is not MEAN (0), ACCUMULATE (1) or SGD (2)",
                              update);
    kvps_abi__begin();
    kvps_server_desc d;
    memset(&d, 0, sizeof d);
    d.endpoint = endpoint;
    d.rank = rank;
    d.num_workers = num_workers;
    d.consistency = (kvps_consistency)consistency;
    d.update = (kvps_update)update;
    d.lr = lr;
    d.staleness = staleness;
    d.replicas = replicas;
    d.replica = replica;
    d.replacement = replacement;
    kvps_result rc = kvps_server_create(&d, out);
    return kvps_abi__result(rc, "kvps_server_create", NULL);
}

KVPS_API int kvps_abi_server_create(const char *endpoint, int rank, int num_workers, int consistency, int update, float lr,
                                    int staleness, kvps_server **out) {
    KVPS_ABI__NEED(out, "kvps_server_create");
    *out = NULL;
    KVPS_ABI__NEED(endpoint, "kvps_server_create");
    return kvps_abi__server(endpoint, rank, num_workers, consistency, update, lr, staleness, NULL, 0, 0, out);
}

/* From kvps_env_read, replicated shards ('|' chains in KVPS_SERVERS) included. */
KVPS_API int kvps_abi_server_from_env(int consistency, int update, float lr, int staleness, kvps_server **out) {
    KVPS_ABI__NEED(out, "kvps_server_create");
    *out = NULL;
    kvps_env e;
    int rc = kvps_abi__env_get(&e);
    if (rc != 0) return rc;
    if (e.role != KVPS_ROLE_SERVER)
        return kvps_abi__fail(KVPS_ERR_ENV, "kvps_server_create: the environment makes this process worker %d of %d, "
                              "not a server", e.rank, e.num_workers);
    return kvps_abi__server(kvps_abi__env.endpoint, e.rank, e.num_workers, consistency, update, lr, staleness,
                            kvps_abi__env.replicas, e.replica, e.replacement, out);
}

KVPS_API int kvps_abi_server_run(kvps_server *s) {
    KVPS_ABI__NEED(s, "kvps_server_run");
    kvps_abi__begin();
    return kvps_abi__result(kvps_server_run(s), "kvps_server_run", NULL);
}
KVPS_API int kvps_abi_server_start(kvps_server *s) {
    KVPS_ABI__NEED(s, "kvps_server_start");
    kvps_abi__begin();
    return kvps_abi__result(kvps_server_start(s), "kvps_server_start", NULL);
}
KVPS_API int kvps_abi_server_wait(kvps_server *s, int timeout_ms) {
    KVPS_ABI__NEED(s, "kvps_server_wait");
    return kvps_abi__result(kvps_server_wait(s, timeout_ms), "kvps_server_wait", NULL);
}
KVPS_API void kvps_abi_server_stop(kvps_server *s) { kvps_server_stop(s); }
KVPS_API void kvps_abi_server_destroy(kvps_server **s) { kvps_server_destroy(s); }

#endif /* KVPS_ABI__IMPLEMENTED */
