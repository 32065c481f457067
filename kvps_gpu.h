/* kvps_gpu.h - v0.1 - CUDA compression kernels, NCCL collectives bootstrapped over ZeroMQ, and the
   hierarchical GPU + server step - MIT licence

   Do this:
       #define KVPS_GPU_IMPLEMENTATION
   before you include this file in *one* file compiled by nvcc (kvps_gpu.cu is that file), and
   link the object with -lcudart -lnccl. The API below is plain C: C and C++ programs include
   this header with any compiler and link the object; one of their files holds the kvps.h and
   kvps_ring.h implementation (KVPS_IMPLEMENTATION) as usual.

   CONTENTS
     1. What it is
     2. Build
     3. Step by step: kernels
     4. Step by step: NCCL communicator
     5. Step by step: hierarchical step (GPUs of a machine + kvps servers)
     6. Numerics: the same bits as the CPU codecs
     7. Streams, ownership and threads
     8. Errors
     9. Config macros
    10. Revision history

   1. WHAT IT IS
   For programs whose gradients live on GPUs. Kernels on device buffers: fp16/bf16 pack and
   unpack, top-k with error feedback, 1-bit sign, sum and scale, and encode / decode in kvps.h's
   codec format, so a blob made on the GPU decodes with kvps_codec_decode and the other way
   round. An NCCL communicator whose unique id travels over a kvps_ring (ZeroMQ), with
   all-reduce, reduce-scatter, all-gather and broadcast on a caller's stream. The hierarchical
   step: NCCL reduce-scatter among the GPUs of one machine, each GPU's shard copied to pinned
   host memory in pieces and pushed/pulled through the kvps servers (or all-reduced on a
   kvps_ring across machines) while the next piece is still being copied, then copied back and
   NCCL all-gathered. Device pointers start with d_.

   2. BUILD
       nvcc -O2 -I. -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
            -c kvps_gpu.cu -o kvps_gpu.o            # kvps_gpu.cu: #define KVPS_GPU_IMPLEMENTATION
       cc -std=c99 -I. app.c kvps_gpu.o -o app -L/usr/local/cuda/lib64 -L/usr/local/cuda/lib \
            -lcudart -lnccl -lzmq -lstdc++ -pthread -lm       # app.c: KVPS_IMPLEMENTATION
   `make gpu` does this (mk/gpu.mk: sm_80, sm_90 and the toolkit's default architecture), builds
   the tests, the bench and a C99 program using this API, and runs the tests; without nvcc it
   says so and succeeds. `make gpu-kit` (mk/gpukit.mk) packs them, with the CUDA runtime linked
   statically and libzmq and what it links beside them, into build/gpu-kit for a GPU box that
   has only the driver, a toolkit and PyTorch's NCCL: build/gpu-kit/device_check.sh OUTDIR runs
   every device check there. Do not build the implementation with --use_fast_math (refused with
   #error), -ftz=true or -prec-div=false: the kernels must round like the CPU (see 6).

   3. STEP BY STEP: KERNELS (all asynchronous on the stream; errors of the launch are returned,
      errors while running show up at the next call or at a wait)
       uint16_t *d_h; float *d_x, *d_r;                      // your cudaMalloc'd buffers
       kvps_gpu_pack(d_h, d_x, d_r, n, KVPS_FLOAT16, stream); // h = fp16(x + r); r = x + r - h
       kvps_gpu_unpack(d_x, d_h, n, KVPS_FLOAT16, 0, stream); // x = float(h)  (1: x += float(h))
       kvps_gpu_topk(d_x, d_r, n, k, d_idx, d_val, stream);   // as kvps_topk, r = residual or NULL
       kvps_gpu_sum(d_a, d_b, n, KVPS_FLOAT32, stream);        // a += b   (FLOAT32/FLOAT16/BFLOAT16)
       kvps_gpu_scale(d_a, d_b, 0.25f, n, KVPS_BFLOAT16, stream); // a = b * 0.25 (d_b NULL: in place)
       kvps_codec c = kvps_codec_get(KVPS_CODEC_TOPK); c.topk_fraction = 0.001;
       size_t bytes;                                          // d_blob: kvps_gpu_codec_bytes(&c, n)
       kvps_gpu_encode(&c, d_x, n, d_r, d_blob, cap, &bytes, stream);  // same bytes as kvps_codec_encode
       kvps_gpu_decode(&c, d_blob, bytes, d_y, n, 0, d_status, stream); // *d_status: a kvps_result
   Codecs: KVPS_CODEC_NONE, FP16, BF16, TOPK (float or fp16 values) and SIGN; a user codec is
   KVPS_ERR_CODEC. Blobs on the device must be 4-byte aligned (cudaMalloc's are). Decoding
   checks the blob on the device exactly as kvps_codec_decode does on the CPU and writes that
   result to *d_status (NULL: not reported); when it is an error, d_dst is left untouched.

   4. STEP BY STEP: NCCL COMMUNICATOR
       kvps_ring *ring;                    // any connected kvps_ring of the same rank and size
       kvps_gpu_comm *c = NULL;
       kvps_result rc = kvps_gpu_comm_create(&(kvps_gpu_comm_desc){
           .rank = rank, .size = size, .ring = ring,  // rank 0's ncclUniqueId is broadcast on it
           .device = KVPS_GPU_DEVICE_AUTO,            // rank mod the visible devices (0: device 0)
           .timeout_ms = 0,                           // 0 -> 60000
       }, &c);
       if (rc != KVPS_OK) fprintf(stderr, "kvps_gpu: %s\n", kvps_gpu_last_error());
       kvps_gpu_allreduce(c, d_grad, d_grad, n, KVPS_FLOAT32, KVPS_SUM, stream);  // in place
       rc = kvps_gpu_comm_wait(c, stream, -1);        // or cudaStreamSynchronize, at your risk
       kvps_gpu_comm_destroy(&c);
   Without a ring: .nccl_id, the KVPS_GPU_ID_BYTES that kvps_gpu_nccl_id made on rank 0 and you
   sent to the others; with size 1 neither is needed. One process driving several GPUs:
   kvps_gpu_comm_create_local(devices, n, timeout_ms, comms), and each collective issued on all
   of them between kvps_gpu_group_start() and kvps_gpu_group_end(comms, n).
   Counts are per rank as in NCCL: reduce_scatter send[count * size] -> recv[count], allgather
   send[count] -> recv[count * size]; in place as NCCL: allreduce send == recv (or NULL),
   reduce_scatter recv == send + rank * count, allgather send == recv + rank * count, broadcast
   send NULL or == recv. dtypes: every kvps_dtype; ops: every kvps_redop (KVPS_AVG is ncclAvg).
   The communicator is non-blocking (NCCL's config.blocking = 0): no call waits for a peer
   without a deadline. kvps_gpu_comm_wait polls the stream and ncclCommGetAsyncError; an
   asynchronous NCCL error, or no completion within the timeout, aborts the communicator
   (ncclCommAbort): the call returns the error (KVPS_ERR_TIMEOUT for the deadline), and every
   later call on it KVPS_ERR_STATE. Destroy it and make a new one.

   5. STEP BY STEP: HIERARCHICAL STEP
   One thread (or process) per GPU. Machines m = 0..M-1 each have L GPUs; GPU l of machine m
   has a kvps_gpu_comm among the L GPUs of its machine (rank l) and a kvps worker of rank m
   (the servers' num_workers is M; the L workers of a machine share the rank and touch
   disjoint tensors):
       kvps_gpu_hier *h = NULL;
       kvps_gpu_hier_create(&(kvps_gpu_hier_desc){
           .local = c,            // NULL: this GPU alone (L = 1)
           .worker = w,           // or .ring: a kvps_ring of the GPUs with this l across machines
           .name = "grads",       // tensors "grads.<l>.<piece>" on the servers
           .count = n,            // float32 elements
           .scale = 1.0f / L,     // applied on the GPU to the machine's sum; 0 -> 1
       }, &h);
       for (step...) {
           kvps_gpu_hier_step(h, d_grad, d_out, stream);   // d_out may be d_grad
           ... d_out is ready when the stream gets there ...
       }
       kvps_gpu_hier_destroy(&h);
   A step: reduce-scatter d_grad among the L GPUs (NCCL; a count not divisible by L is padded
   with zeros on the device), scale, copy the shard to pinned memory in pieces (.piece floats,
   0 -> 1 Mi), and as each piece lands push/pull it (kvps_worker_pushpull_tensor) or post it on
   the ring (kvps_ring_post, all-reduce with .op); as each answer arrives copy it back, then
   NCCL all-gather into d_out. The copies of one piece overlap the network time of the
   others. d_out gets, per element, what the servers return for the scaled machine sums (with
   KVPS_UPDATE_MEAN and scale 1 / L: the mean over all M * L GPUs), or the ring's reduction.
   The call returns when every answer has arrived and the copies back and the all-gather are
   enqueued on the stream. Blocking for the calling thread; each wait is bounded by
   .timeout_ms (0 -> 30000). A step waits (on the device) for the previous step's copies, so
   steps may use different streams. Each piece is a tensor of its own, so the servers spread
   the pieces as they spread tensors. The tensors stay registered on the worker (kvps has no
   unregister): kvps_gpu_hier_tensors gives their handles (for kvps_worker_tensor_optim,
   _codec, _init_tensor); a second hier on the same worker needs another name.
   After a failed step the hier is broken (KVPS_ERR_STATE): requests may still be in flight on
   its pinned buffers, so destroy the worker or ring first, then the hier.

   6. NUMERICS
   Every per-element operation is the kvps_el_* function of kvps.h, compiled for the device
   (conversions, magnitude keys); sums are x + r in float32, so the GPU gives the same bits as
   the CPU codecs for every input that is not a NaN. Top-k is exact (radix select on |x| as an
   integer, ties to the lower index, indices ascending), so it picks the same entries as
   kvps_topk. SIGN's scale sums |x| in the CPU's order (8 interleaved partial sums combined
   pairwise). One difference: when an *arithmetic* result is NaN (x + r, a sum, a scale, an
   accumulating or top-k decode), the GPU produces the canonical NaN 0x7fffffff where the CPU
   keeps an operand's payload; pure conversions (pack and unpack without a residual or
   accumulation, NONE/FP16/BF16 decode) keep NaN payloads exactly like the CPU.
   What runs on the device is mostly __host__ __device__ code that the CPU tests also run: the
   conversions (kvps.h's tests, all 2^32 floats), top-k's digit pick and output slots, the sign
   scale's order, the decoder's checks (kvps_el_blob_verdict, the CPU decoder's own, and top-k's
   index checks; tests/gpu/test_gpu_host.c).

   7. STREAMS, OWNERSHIP AND THREADS
   kvps_gpu_stream is a cudaStream_t (NULL: the legacy default stream); every call enqueues on
   it and returns, unless it says it blocks. Buffers are borrowed until the stream has run the
   work. Kernels run on the current device; communicator calls switch to the communicator's
   device and back. kvps_gpu_x_destroy(&x) frees x and sets it to NULL (NULL is harmless). A
   communicator or hier is used by one thread at a time (NCCL's rule: one thread may drive
   several communicators only through group calls). Scratch memory of top-k, encode and decode
   comes from cudaMallocAsync on the stream (or cudaMalloc + a stream synchronisation where
   the device has no memory pools).

   8. ERRORS
   Every call returns a kvps_result (kvps.h): KVPS_ERR_INVALID_ARG / KVPS_ERR_CONFIG for bad
   arguments (checked before the device is touched), KVPS_ERR_NO_DEVICE when there is no CUDA
   device or driver, KVPS_ERR_NOMEM for cudaErrorMemoryAllocation, KVPS_ERR_GPU for other CUDA
   and NCCL failures, KVPS_ERR_PEER for ncclRemoteError, KVPS_ERR_TIMEOUT, KVPS_ERR_STATE on an
   aborted communicator or broken hier. kvps_gpu_last_error() is this thread's last failure with
   the library's own message ("cudaMalloc: out of memory (cudaErrorMemoryAllocation)", NCCL's
   ncclGetLastError text); kvps_gpu_result_from_cuda / _from_nccl give the mapping.

   9. CONFIG MACROS
   KVPS_GPU_IMPLEMENTATION  compile the implementation here (nvcc only; #error otherwise)
   KVPS_GPU_INTERNAL        also declare the test hooks (kvps_gpu__*; not API) for a test file
   KVPS_API                 linkage, as in kvps.h

   10. REVISION HISTORY
   0.1  kernels (fp16/bf16, top-k, sign, sum, scale, codec encode/decode), NCCL communicator
        over kvps_ring, collectives with abort on timeout, hierarchical step.
*/
#ifndef KVPS_GPU_H
#define KVPS_GPU_H
#include "kvps_codec.h" /* the codecs and element functions its kernels share */
#include "kvps_ring.h"   /* the NCCL communicator's bootstrap */
#include "kvps.h"        /* the hierarchical step's servers */

#ifdef __cplusplus
extern "C" {
#endif

enum { KVPS_GPU_ID_BYTES = 128, KVPS_GPU_DEVICE_AUTO = -1 };
typedef void *kvps_gpu_stream; /* a cudaStream_t; NULL: the legacy default stream */

/* ---- errors and devices --------------------------------------------------------------- */
KVPS_API kvps_result kvps_gpu_result_from_cuda(int cuda_error);   /* cudaError_t -> kvps_result */
KVPS_API kvps_result kvps_gpu_result_from_nccl(int nccl_result);  /* ncclResult_t -> kvps_result */
KVPS_API const char *kvps_gpu_last_error(void);  /* this thread's last failure; "" if none */
/* Visible CUDA devices; KVPS_ERR_NO_DEVICE (count 0) when there are none or no driver. */
KVPS_API kvps_result kvps_gpu_device_count(int *count);

/* ---- kernels (device buffers, asynchronous on stream) ---------------------------------- */
/* d_out = wire(d_x + d_residual) with wire KVPS_FLOAT16 or KVPS_BFLOAT16, round to nearest
   even; with a residual (NULL: none), d_residual = (d_x + d_residual) - float(d_out). */
KVPS_API kvps_result kvps_gpu_pack(uint16_t *d_out, const float *d_x, float *d_residual, size_t n, kvps_dtype wire,
                                   kvps_gpu_stream stream);
/* d_out = float(d_in), or d_out += float(d_in) when accumulate is 1. */
KVPS_API kvps_result kvps_gpu_unpack(float *d_out, const uint16_t *d_in, size_t n, kvps_dtype wire, int accumulate,
                                     kvps_gpu_stream stream);
/* kvps_topk on the device, with error feedback when d_residual is not NULL (r += x; the k
   largest |r| are selected, their values written and their residual zeroed). */
KVPS_API kvps_result kvps_gpu_topk(const float *d_x, float *d_residual, size_t n, size_t k, uint32_t *d_idx,
                                   float *d_val, kvps_gpu_stream stream);
/* d_dst[i] += d_src[i]; 16-bit types are added in float32 and rounded (as kvps_reduce_into). */
KVPS_API kvps_result kvps_gpu_sum(void *d_dst, const void *d_src, size_t n, kvps_dtype dt, kvps_gpu_stream stream);
/* d_dst[i] = d_src[i] * factor (d_src NULL: d_dst in place). */
KVPS_API kvps_result kvps_gpu_scale(void *d_dst, const void *d_src, float factor, size_t n, kvps_dtype dt,
                                    kvps_gpu_stream stream);
/* Bytes kvps_gpu_encode writes for n floats (kvps_codec_max_bytes of a built-in codec; exact). */
KVPS_API size_t kvps_gpu_codec_bytes(const kvps_codec *c, size_t n);
/* kvps_codec_encode on the device: same blob, same residual. d_out 4-byte aligned, cap bytes. */
KVPS_API kvps_result kvps_gpu_encode(const kvps_codec *c, const float *d_x, size_t n, float *d_residual, void *d_out,
                                     size_t cap, size_t *out_bytes, kvps_gpu_stream stream);
/* kvps_codec_decode on the device; *d_status (a device int; may be NULL) gets its result. */
KVPS_API kvps_result kvps_gpu_decode(const kvps_codec *c, const void *d_in, size_t bytes, float *d_dst, size_t n,
                                     int accumulate, int *d_status, kvps_gpu_stream stream);

/* ---- NCCL communicator ----------------------------------------------------------------- */
typedef struct kvps_gpu_comm kvps_gpu_comm;
/* Zero means default.
   | field      | default                                                        |
   | rank, size | required, 0 <= rank < size                                     |
   | ring       | NULL: use nccl_id (or nothing when size is 1)                  |
   | nccl_id    | NULL: from rank 0 over ring                                    |
   | device     | 0 (device 0); KVPS_GPU_DEVICE_AUTO: rank mod the visible count |
   | timeout_ms | 60000: init, finalize and each kvps_gpu_comm_wait (-1 there)   | */
typedef struct kvps_gpu_comm_desc {
    int rank, size;
    kvps_ring *ring;
    const void *nccl_id;
    int device;
    int timeout_ms;
} kvps_gpu_comm_desc;

/* Every rank calls it: rank 0 makes an ncclUniqueId and broadcasts it on the ring; id receives
   KVPS_GPU_ID_BYTES. (kvps_gpu_comm_create with .ring does this itself.) */
KVPS_API kvps_result kvps_gpu_nccl_id(kvps_ring *ring, int rank, void *id);
KVPS_API kvps_result kvps_gpu_comm_create(const kvps_gpu_comm_desc *desc, kvps_gpu_comm **out);
/* n communicators of one process, rank i on devices[i] (NULL: device i). */
KVPS_API kvps_result kvps_gpu_comm_create_local(const int *devices, int n, int timeout_ms, kvps_gpu_comm **out);
KVPS_API void kvps_gpu_comm_destroy(kvps_gpu_comm **c);
KVPS_API int kvps_gpu_comm_rank(const kvps_gpu_comm *c);
KVPS_API int kvps_gpu_comm_size(const kvps_gpu_comm *c);
KVPS_API int kvps_gpu_comm_device(const kvps_gpu_comm *c);
KVPS_API void *kvps_gpu_comm_nccl(const kvps_gpu_comm *c); /* its ncclComm_t (NULL once aborted) */
KVPS_API const char *kvps_gpu_comm_last_error(const kvps_gpu_comm *c);
/* Polls for an asynchronous NCCL error (aborting on one); never blocks. */
KVPS_API kvps_result kvps_gpu_comm_check(kvps_gpu_comm *c);
/* Waits until the stream has run everything enqueued on it, polling NCCL's errors; aborts the
   communicator on an error or after timeout_ms (-1: the communicator's). */
KVPS_API kvps_result kvps_gpu_comm_wait(kvps_gpu_comm *c, kvps_gpu_stream stream, int timeout_ms);
/* Aborts now (from the thread that uses the communicator): pending collectives end. */
KVPS_API void kvps_gpu_comm_abort(kvps_gpu_comm *c);

KVPS_API kvps_result kvps_gpu_allreduce(kvps_gpu_comm *c, const void *d_send, void *d_recv, size_t count,
                                        kvps_dtype dt, kvps_redop op, kvps_gpu_stream stream);
KVPS_API kvps_result kvps_gpu_reduce_scatter(kvps_gpu_comm *c, const void *d_send, void *d_recv, size_t count,
                                             kvps_dtype dt, kvps_redop op, kvps_gpu_stream stream);
KVPS_API kvps_result kvps_gpu_allgather(kvps_gpu_comm *c, const void *d_send, void *d_recv, size_t count,
                                        kvps_dtype dt, kvps_gpu_stream stream);
KVPS_API kvps_result kvps_gpu_broadcast(kvps_gpu_comm *c, const void *d_send, void *d_recv, size_t count,
                                        kvps_dtype dt, int root, kvps_gpu_stream stream);
/* One thread, several communicators: collectives between these two are launched together. */
KVPS_API kvps_result kvps_gpu_group_start(void);
KVPS_API kvps_result kvps_gpu_group_end(kvps_gpu_comm **comms, int n);

/* ---- hierarchical step ----------------------------------------------------------------- */
typedef struct kvps_gpu_hier kvps_gpu_hier;
/* Zero means default.
   | field      | default                                                      |
   | local      | NULL: this GPU alone                                         |
   | worker     | one of worker (kvps servers) and ring (kvps_ring) is required |
   | name       | required with worker: tensors "<name>.<local rank>.<piece>"  |
   | count      | required, float32 elements                                   |
   | piece      | 1048576 floats (4 MiB) per pipelined piece                   |
   | scale      | 1                                                            |
   | op         | KVPS_SUM (ring only)                                         |
   | timeout_ms | 30000 per wait                                               | */
typedef struct kvps_gpu_hier_desc {
    kvps_gpu_comm *local;
    kvps_worker *worker;
    kvps_ring *ring;
    const char *name;
    size_t count;
    size_t piece;
    float scale;
    kvps_redop op;
    int timeout_ms;
} kvps_gpu_hier_desc;

KVPS_API kvps_result kvps_gpu_hier_create(const kvps_gpu_hier_desc *desc, kvps_gpu_hier **out);
/* Blocking for the caller (see 5); d_out may be d_grad. */
KVPS_API kvps_result kvps_gpu_hier_step(kvps_gpu_hier *h, const float *d_grad, float *d_out, kvps_gpu_stream stream);
KVPS_API size_t kvps_gpu_hier_tensors(const kvps_gpu_hier *h, const kvps_tensor **tensors);
KVPS_API const char *kvps_gpu_hier_last_error(const kvps_gpu_hier *h);
KVPS_API void kvps_gpu_hier_destroy(kvps_gpu_hier **h);

#ifdef __cplusplus
}
#endif
#endif /* KVPS_GPU_H */

/* Test hooks, not API: declared for the tests (KVPS_GPU_INTERNAL) and the implementation. */
#if (defined(KVPS_GPU_INTERNAL) || defined(KVPS_GPU_IMPLEMENTATION)) && !defined(KVPS_GPU__INTERNAL_DECLARED)
#define KVPS_GPU__INTERNAL_DECLARED
#ifdef __cplusplus
extern "C" {
#endif
/* The hier's host side with its device operations replaced (host memory standing in for the
   device, so the pipeline runs in CPU tests); local must be NULL. */
typedef struct kvps_gpu__ops {
    kvps_result (*ready)(void);
    kvps_result (*alloc_host)(void **p, size_t bytes);
    void (*free_host)(void *p);
    kvps_result (*alloc_dev)(void **p, size_t bytes);
    void (*free_dev)(void *p);
    kvps_result (*copy)(void *dst, const void *src, size_t bytes, kvps_gpu_stream s);
    kvps_result (*zero)(void *d, size_t bytes, kvps_gpu_stream s);
    kvps_result (*scale)(float *d_dst, const float *d_src, float factor, size_t n, kvps_gpu_stream s);
    kvps_result (*event_create)(void **e);
    void (*event_destroy)(void *e);
    kvps_result (*event_record)(void *e, kvps_gpu_stream s);
    kvps_result (*event_query)(void *e, int *done);
    kvps_result (*event_wait)(void *e, kvps_gpu_stream s); /* s waits for e */
} kvps_gpu__ops;
KVPS_API kvps_result kvps_gpu__hier_create_ops(const kvps_gpu_hier_desc *desc, const kvps_gpu__ops *ops,
                                               kvps_gpu_hier **out);
/* The top-k of kvps_gpu_topk run on the host with the kernels' own per-element and per-digit
   functions (radix pick, tie-aware slot): checks the algorithm against kvps_topk on the CPU. */
KVPS_API kvps_result kvps_gpu__topk_host(const float *x, float *r, size_t n, size_t k, uint32_t *idx, float *val);
/* The device decoder's verdict (its header and index checks) run on the host. */
KVPS_API kvps_result kvps_gpu__verdict_host(const void *blob, size_t bytes, int id, size_t n);
/* The sign encoder's arithmetic, lane by lane as the kernel orders it, on the host. */
KVPS_API void kvps_gpu__sign_host(const float *x, float *r, size_t n, uint32_t ch, float *scales, unsigned char *bits);
#ifdef __cplusplus
}
#endif
#endif

/* ============================================================================================ */
#ifdef KVPS_GPU_IMPLEMENTATION
/* Sections (grep "// >>name"), lowest layer first:
     errors       the thread's message, CUDA and NCCL results, whether there is a device
     util         clock, polling back-off, device switch, stream-ordered scratch
     elementwise  launch shape; pack / unpack, sum and scale kernels
     blob         the codec blob: layout, header kernel, NONE's copies, the verdict and index checks
     topk         exact top-k (radix select, slots in index order); top-k decode kernels
     sign         1-bit sign: scale in the CPU's order, encode and decode kernels
     kernel-api   kvps_gpu_pack ... kvps_gpu_decode
     comm         the NCCL communicator: errors, settle, unique id, create, wait, abort
     collectives  kvps_dtype / kvps_redop to NCCL; all-reduce ... broadcast; groups
     hier         the hierarchical step: device operations, create, the pipelined step
     host-twin    test hooks: the kernels' algorithms run on the host */
#ifndef KVPS_GPU__IMPLEMENTED
#define KVPS_GPU__IMPLEMENTED
#ifndef __CUDACC__
#error "kvps_gpu.h: KVPS_GPU_IMPLEMENTATION must be compiled by nvcc (a .cu file)"
#endif
#ifdef __USE_FAST_MATH__
#error "kvps_gpu.h: do not build the kernels with --use_fast_math: they must round like the CPU codecs"
#endif

#include <cuda_runtime.h>
#include <nccl.h>
#include <cub/block/block_load.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// >>errors
static thread_local char kvps_gpu__err[512];

static void kvps_gpu__seterr(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kvps_gpu__err, sizeof kvps_gpu__err, fmt, ap);
    va_end(ap);
}

KVPS_API const char *kvps_gpu_last_error(void) { return kvps_gpu__err; }

KVPS_API kvps_result kvps_gpu_result_from_cuda(int e) {
    switch (e) {
    case cudaSuccess: return KVPS_OK;
    case cudaErrorMemoryAllocation: return KVPS_ERR_NOMEM;
    /* nothing to run on: no device, no (or a stub, or a too old) driver, devices all taken */
    case cudaErrorNoDevice: case cudaErrorInsufficientDriver: case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch: case cudaErrorDevicesUnavailable:
        return KVPS_ERR_NO_DEVICE;
    default: return KVPS_ERR_GPU;
    }
}

KVPS_API kvps_result kvps_gpu_result_from_nccl(int r) {
    switch (r) {
    case ncclSuccess: return KVPS_OK;
    case ncclInvalidArgument: return KVPS_ERR_INVALID_ARG;
    case ncclInvalidUsage: return KVPS_ERR_STATE;
    case ncclInProgress: return KVPS_ERR_STATE; /* not finished: not a final result */
    case ncclRemoteError: return KVPS_ERR_PEER;
    default: return KVPS_ERR_GPU;               /* unhandled CUDA, system, internal */
    }
}

static kvps_result kvps_gpu__cuda_fail(cudaError_t e, const char *what) {
    kvps_gpu__seterr("%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return kvps_gpu_result_from_cuda((int)e);
}
#define KVPS_GPU__TRY(call, what)                                              \
    do {                                                                       \
        cudaError_t kvps_gpu__e = (call);                                      \
        if (kvps_gpu__e != cudaSuccess) return kvps_gpu__cuda_fail(kvps_gpu__e, what); \
    } while (0)
/* after a <<<launch>>>: configuration errors are reported here, faults of the run later */
#define KVPS_GPU__LAUNCHED(what) KVPS_GPU__TRY(cudaGetLastError(), what)

static int kvps_gpu__have_device; /* set once a device was seen: devices do not go away */

KVPS_API kvps_result kvps_gpu_device_count(int *count) {
    if (!count) return KVPS_ERR_INVALID_ARG;
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        kvps_gpu__cuda_fail(e, "cudaGetDeviceCount");
        (void)cudaGetLastError(); /* not sticky: leave no trace for the next call */
        return KVPS_ERR_NO_DEVICE;
    }
    if (n <= 0) {
        kvps_gpu__seterr("cudaGetDeviceCount: no CUDA device");
        return KVPS_ERR_NO_DEVICE;
    }
    __atomic_store_n(&kvps_gpu__have_device, 1, __ATOMIC_RELAXED);
    *count = n;
    return KVPS_OK;
}

static kvps_result kvps_gpu__ready(void) {
    if (__atomic_load_n(&kvps_gpu__have_device, __ATOMIC_RELAXED)) return KVPS_OK;
    int n;
    return kvps_gpu_device_count(&n);
}

// >>util
static int64_t kvps_gpu__now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Polling back-off: spin first (collectives of small messages end in microseconds), then sleep
   longer and longer, up to 1 ms. */
static void kvps_gpu__pause(int *spins) {
    int s = (*spins)++;
    if (s < 64) return;
    long us = s < 256 ? 10 : s < 1024 ? 100 : 1000;
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

typedef struct kvps_gpu__dev { int old, dev; } kvps_gpu__dev;

static kvps_result kvps_gpu__dev_enter(kvps_gpu__dev *g, int dev) {
    g->dev = dev;
    g->old = -1;
    KVPS_GPU__TRY(cudaGetDevice(&g->old), "cudaGetDevice");
    if (g->old != dev) KVPS_GPU__TRY(cudaSetDevice(dev), "cudaSetDevice");
    return KVPS_OK;
}
static void kvps_gpu__dev_leave(const kvps_gpu__dev *g) {
    if (g->old >= 0 && g->old != g->dev) (void)cudaSetDevice(g->old);
}

/* Stream-ordered scratch: cudaMallocAsync where the device has memory pools, else cudaMalloc
   and, on release, a synchronisation of the stream. */
typedef struct kvps_gpu__scratch { void *p; int pooled; } kvps_gpu__scratch;

static kvps_result kvps_gpu__scratch_get(kvps_gpu__scratch *s, size_t bytes, cudaStream_t st) {
    int dev = 0, pools = 0;
    s->p = NULL;
    s->pooled = 0;
    KVPS_GPU__TRY(cudaGetDevice(&dev), "cudaGetDevice");
    if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev) != cudaSuccess) pools = 0;
    if (pools) {
        KVPS_GPU__TRY(cudaMallocAsync(&s->p, bytes ? bytes : 1, st), "cudaMallocAsync");
        s->pooled = 1;
    } else {
        KVPS_GPU__TRY(cudaMalloc(&s->p, bytes ? bytes : 1), "cudaMalloc");
    }
    return KVPS_OK;
}
static void kvps_gpu__scratch_put(kvps_gpu__scratch *s, cudaStream_t st) {
    if (!s->p) return;
    if (s->pooled) (void)cudaFreeAsync(s->p, st);
    else { (void)cudaStreamSynchronize(st); (void)cudaFree(s->p); }
    s->p = NULL;
}

// >>elementwise
enum { KVPS_GPU__T = 256, KVPS_GPU__ITEMS = 16, KVPS_GPU__TILE = KVPS_GPU__T * KVPS_GPU__ITEMS };

static unsigned kvps_gpu__grid(size_t n, size_t per_thread, size_t cap) {
    size_t per_block = (size_t)KVPS_GPU__T * per_thread, b = (n + per_block - 1) / per_block;
    return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}
#define KVPS_GPU__GRID(n) kvps_gpu__grid((n), 4, 16384)
#define KVPS_GPU__LOOP(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

static __global__ void kvps_gpu__pack_k(uint16_t *out, const float *x, float *r, size_t n, int f16) {
    KVPS_GPU__LOOP(i, n) {
        float v = r ? x[i] + r[i] : x[i];
        uint16_t h = f16 ? kvps_el_f32_to_f16(v) : kvps_el_f32_to_bf16(v);
        out[i] = h;
        if (r) r[i] = v - (f16 ? kvps_el_f16_to_f32(h) : kvps_el_bf16_to_f32(h));
    }
}

/* status (may be NULL): a decode's verdict; anything but 0 means write nothing */
static __global__ void kvps_gpu__unpack_k(float *out, const uint16_t *in, size_t n, int f16, int acc, const int *status) {
    if (status && *status) return;
    KVPS_GPU__LOOP(i, n) {
        float v = f16 ? kvps_el_f16_to_f32(in[i]) : kvps_el_bf16_to_f32(in[i]);
        out[i] = acc ? out[i] + v : v;
    }
}

static __device__ __forceinline__ float kvps_gpu__load(const void *p, size_t i, int dt) {
    if (dt == KVPS_FLOAT32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == KVPS_FLOAT16 ? kvps_el_f16_to_f32(h) : kvps_el_bf16_to_f32(h);
}
static __device__ __forceinline__ void kvps_gpu__store(void *p, size_t i, int dt, float v) {
    if (dt == KVPS_FLOAT32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = dt == KVPS_FLOAT16 ? kvps_el_f32_to_f16(v) : kvps_el_f32_to_bf16(v);
}

static __global__ void kvps_gpu__sum_k(void *d, const void *s, size_t n, int dt) {
    KVPS_GPU__LOOP(i, n) kvps_gpu__store(d, i, dt, kvps_gpu__load(d, i, dt) + kvps_gpu__load(s, i, dt));
}

static __global__ void kvps_gpu__scale_k(void *d, const void *s, float f, size_t n, int dt) {
    KVPS_GPU__LOOP(i, n) kvps_gpu__store(d, i, dt, kvps_gpu__load(s, i, dt) * f);
}

// >>blob
/* A built-in codec's blob (kvps.h, CODECS): the payload starts at KVPS_CODEC_HEADER; top-k's k
   and sign's chunk are its first u32 (the word), top-k's indices and sign's scales follow. */
enum { KVPS_GPU__ARRAYS = KVPS_CODEC_HEADER + 4 };
static inline KVPS_HD uint32_t kvps_gpu__word(const unsigned char *blob) { return kvps_el_get32(blob + KVPS_CODEC_HEADER); }

/* The GPU has kernels for the built-in codecs, the rows of KVPS_CODEC_TABLE: a new row needs its
   kvps_gpu__enc_NAME and kvps_gpu__dec_NAME (>>kernel-api; their checks and sizes come from
   kvps_codec.h). */
static int kvps_gpu__builtin(int id) { return id >= 0 && id < KVPS_CODEC_COUNT; }

/* The 8-byte codec header, plus the u32 after it (top-k: k; sign: chunk) when word_too. */
static __global__ void kvps_gpu__header_k(unsigned char *o, int id, int flags, uint32_t n, int word_too, uint32_t word) {
    o[0] = (unsigned char)id;
    o[1] = (unsigned char)flags;
    o[2] = o[3] = 0;
    for (int b = 0; b < 4; b++) o[4 + b] = (unsigned char)(n >> (8 * b));
    if (word_too)
        for (int b = 0; b < 4; b++) o[KVPS_CODEC_HEADER + b] = (unsigned char)(word >> (8 * b));
}

static __global__ void kvps_gpu__none_enc_k(float *out, const float *x, float *r, size_t n) {
    KVPS_GPU__LOOP(i, n) {
        float v = r ? x[i] + r[i] : x[i];
        out[i] = v;
        if (r) r[i] = 0.0f;
    }
}

static __global__ void kvps_gpu__none_dec_k(float *dst, const float *in, size_t n, int acc, const int *status) {
    if (*status) return;
    KVPS_GPU__LOOP(i, n) dst[i] = acc ? dst[i] + in[i] : in[i];
}

/* top-k index j of a blob whose sizes are checked: < n and above the one before */
static inline KVPS_HD int kvps_gpu__index_ok(const unsigned char *p, size_t j, size_t n) {
    uint32_t i = kvps_el_get32(p + KVPS_GPU__ARRAYS + 4 * j);
    return i < n && (j == 0 || i > kvps_el_get32(p + KVPS_GPU__ARRAYS + 4 * (j - 1)));
}

static __global__ void kvps_gpu__dec_check_k(const unsigned char *p, size_t bytes, int id, size_t n, int *status) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *status = kvps_el_blob_verdict(p, bytes, id, n);
}

// >>topk
/* Exact top-k in four steps, all on the device (no host round trip):
   1. three histogram passes over |x| as an integer (11 + 11 + 10 bits, as kvps__kth_largest),
      each followed by a one-thread pick of the digit: T = the k-th largest key, and `ties` =
      how many keys equal to T belong to the top k (the lowest-index ones);
   2. per tile of 4096 elements, the count of keys > T and == T;
   3. an exclusive scan of those counts (CUB);
   4. per tile, a block scan gives each element its slot: with gt and eq the counts of keys
      > T and == T before it, a key > T goes to gt + min(eq, ties), a key == T with eq < ties to
      gt + eq; so the output is in index order, as on the CPU.
   With error feedback the first pass also does r += x, and the last writes the selected
   entries' residual. */
typedef struct kvps_gpu__sel {
    unsigned int prefix, pmask;
    unsigned long long krem;
    unsigned int hist[2048];
} kvps_gpu__sel;

static inline KVPS_HD void kvps_gpu__pass(int pass, int *shift, unsigned *width) {
    *shift = pass == 0 ? 21 : pass == 1 ? 10 : 0;
    *width = pass == 2 ? 1024u : 2048u;
}

/* The digit holding the k-th largest (k = *krem, 1-based) in a histogram; *krem becomes its
   rank among the keys with that digit. Same loop as kvps__kth_largest. */
static inline KVPS_HD unsigned kvps_gpu__radix_pick(const unsigned *hist, unsigned width, unsigned long long *krem) {
    unsigned long long above = 0, k = *krem;
    unsigned b = width - 1;
    for (;; b--) {
        if (above + hist[b] >= k || b == 0) break;
        above += hist[b];
    }
    *krem = k - above;
    return b;
}

/* The slot of one element, visited in index order with gt / eq = keys > T / == T before it;
   -1: not selected. Advances the counts. */
static inline KVPS_HD long long kvps_gpu__slot(uint32_t key, uint32_t T, unsigned long long ties, unsigned long long *gt,
                                        unsigned long long *eq) {
    if (key > T) {
        long long s = (long long)(*gt + (*eq < ties ? *eq : ties));
        (*gt)++;
        return s;
    }
    if (key == T) {
        long long s = *eq < ties ? (long long)(*gt + *eq) : -1;
        (*eq)++;
        return s;
    }
    return -1;
}

/* acc_r != NULL (first pass with error feedback): v = x + r, stored into r; else v = src. */
static __global__ void kvps_gpu__hist_k(const float *x, float *acc_r, const float *src, size_t n, kvps_gpu__sel *sel, int pass) {
    __shared__ unsigned h[2048];
    int shift;
    unsigned width;
    kvps_gpu__pass(pass, &shift, &width);
    for (unsigned b = threadIdx.x; b < width; b += blockDim.x) h[b] = 0;
    __syncthreads();
    const unsigned prefix = sel->prefix, pmask = sel->pmask;
    KVPS_GPU__LOOP(i, n) {
        float v;
        if (acc_r) { v = x[i] + acc_r[i]; acc_r[i] = v; }
        else v = src[i];
        uint32_t key = kvps_el_mag(v);
        if ((key & pmask) == prefix) atomicAdd(&h[(key >> shift) & (width - 1)], 1u);
    }
    __syncthreads();
    for (unsigned b = threadIdx.x; b < width; b += blockDim.x)
        if (h[b]) atomicAdd(&sel->hist[b], h[b]);
}

static __global__ void kvps_gpu__pick_k(kvps_gpu__sel *sel, int pass, unsigned long long k) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int shift;
    unsigned width;
    kvps_gpu__pass(pass, &shift, &width);
    unsigned long long krem = pass == 0 ? k : sel->krem;
    unsigned b = kvps_gpu__radix_pick(sel->hist, width, &krem);
    sel->krem = krem;
    sel->prefix |= b << shift;
    sel->pmask |= (width - 1) << shift;
    for (unsigned i = 0; i < 2048; i++) sel->hist[i] = 0;
}

/* per tile: (keys > T) in the low 32 bits, (keys == T) in the high 32 (n < 2^32: no carry) */
static __global__ void kvps_gpu__count_k(const float *src, size_t n, const kvps_gpu__sel *sel, unsigned long long *cnt) {
    typedef cub::BlockReduce<unsigned long long, KVPS_GPU__T> Reduce;
    __shared__ typename Reduce::TempStorage tmp;
    const uint32_t T = sel->prefix;
    size_t base = (size_t)blockIdx.x * KVPS_GPU__TILE;
    unsigned long long c = 0;
    for (int j = 0; j < KVPS_GPU__ITEMS; j++) {
        size_t i = base + (size_t)j * KVPS_GPU__T + threadIdx.x;
        if (i < n) {
            uint32_t key = kvps_el_mag(src[i]);
            c += (key > T) + ((unsigned long long)(key == T) << 32);
        }
    }
    unsigned long long total = Reduce(tmp).Sum(c);
    if (threadIdx.x == 0) cnt[blockIdx.x] = total;
}

/* r (error feedback, may be NULL) is src: selected entries' residual becomes 0, or with fp16
   values what the rounding lost (as the CPU encoder). */
static __global__ void kvps_gpu__compact_k(const float *src, float *r, size_t n, const unsigned long long *tile_before,
                                    const kvps_gpu__sel *sel, uint32_t *idx, float *val32, uint16_t *val16) {
    typedef cub::BlockLoad<float, KVPS_GPU__T, KVPS_GPU__ITEMS, cub::BLOCK_LOAD_TRANSPOSE> Load;
    typedef cub::BlockScan<unsigned long long, KVPS_GPU__T> Scan;
    __shared__ union { typename Load::TempStorage load; typename Scan::TempStorage scan; } tmp;
    const size_t base = (size_t)blockIdx.x * KVPS_GPU__TILE;
    const int valid = (int)(n - base < (size_t)KVPS_GPU__TILE ? n - base : (size_t)KVPS_GPU__TILE);
    float v[KVPS_GPU__ITEMS];
    Load(tmp.load).Load(src + base, v, valid, 0.0f);
    __syncthreads();
    const uint32_t T = sel->prefix;
    const unsigned long long ties = sel->krem;
    unsigned long long mine = 0, before;
    for (int j = 0; j < KVPS_GPU__ITEMS; j++) {
        int li = threadIdx.x * KVPS_GPU__ITEMS + j;
        if (li < valid) {
            uint32_t key = kvps_el_mag(v[j]);
            mine += (key > T) + ((unsigned long long)(key == T) << 32);
        }
    }
    Scan(tmp.scan).ExclusiveSum(mine, before);
    before += tile_before[blockIdx.x];
    unsigned long long gt = before & 0xffffffffull, eq = before >> 32;
    for (int j = 0; j < KVPS_GPU__ITEMS; j++) {
        int li = threadIdx.x * KVPS_GPU__ITEMS + j;
        if (li >= valid) break;
        long long s = kvps_gpu__slot(kvps_el_mag(v[j]), T, ties, &gt, &eq);
        if (s < 0) continue;
        size_t i = base + (size_t)li;
        idx[s] = (uint32_t)i;
        if (val16) {
            uint16_t h = kvps_el_f32_to_f16(v[j]);
            val16[s] = h;
            if (r) r[i] = v[j] - kvps_el_f16_to_f32(h);
        } else {
            val32[s] = v[j];
            if (r) r[i] = 0.0f;
        }
    }
}

static __global__ void kvps_gpu__addto_k(const float *x, float *r, size_t n) {
    KVPS_GPU__LOOP(i, n) r[i] = x[i] + r[i];
}

static kvps_result kvps_gpu__topk_run(const float *x, float *r, size_t n, size_t k, uint32_t *idx, float *val32,
                                      uint16_t *val16, cudaStream_t st) {
    if (n == 0) return KVPS_OK;
    if (k == 0) { /* nothing selected: the residual still takes x */
        if (r) {
            kvps_gpu__addto_k<<<KVPS_GPU__GRID(n), KVPS_GPU__T, 0, st>>>(x, r, n);
            KVPS_GPU__LAUNCHED("kvps_gpu__addto_k");
        }
        return KVPS_OK;
    }
    size_t ntiles = (n + KVPS_GPU__TILE - 1) / KVPS_GPU__TILE, cub_bytes = 0;
    KVPS_GPU__TRY(cub::DeviceScan::ExclusiveSum(NULL, cub_bytes, (unsigned long long *)NULL,
                                                (unsigned long long *)NULL, (int)ntiles, st),
                  "cub::DeviceScan::ExclusiveSum (size)");
    size_t off_cnt = (sizeof(kvps_gpu__sel) + 255) & ~(size_t)255;
    size_t off_before = off_cnt + ((ntiles * 8 + 255) & ~(size_t)255);
    size_t off_cub = off_before + ((ntiles * 8 + 255) & ~(size_t)255);
    kvps_gpu__scratch scr;
    kvps_result rc = kvps_gpu__scratch_get(&scr, off_cub + cub_bytes, st);
    if (rc != KVPS_OK) return rc;
    char *base = (char *)scr.p;
    kvps_gpu__sel *sel = (kvps_gpu__sel *)(void *)base;
    unsigned long long *cnt = (unsigned long long *)(void *)(base + off_cnt);
    unsigned long long *before = (unsigned long long *)(void *)(base + off_before);
    const float *src = r ? r : x;
    cudaError_t e = cudaMemsetAsync(sel, 0, sizeof *sel, st);
    const char *what = "cudaMemsetAsync";
    for (int pass = 0; pass < 3 && e == cudaSuccess; pass++) {
        kvps_gpu__hist_k<<<kvps_gpu__grid(n, 8, 4096), KVPS_GPU__T, 0, st>>>(x, pass == 0 ? r : NULL, src, n, sel, pass);
        what = "kvps_gpu__hist_k";
        if ((e = cudaGetLastError()) != cudaSuccess) break;
        kvps_gpu__pick_k<<<1, 1, 0, st>>>(sel, pass, (unsigned long long)k);
        what = "kvps_gpu__pick_k";
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) {
        kvps_gpu__count_k<<<(unsigned)ntiles, KVPS_GPU__T, 0, st>>>(src, n, sel, cnt);
        what = "kvps_gpu__count_k";
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) {
        what = "cub::DeviceScan::ExclusiveSum";
        e = cub::DeviceScan::ExclusiveSum(base + off_cub, cub_bytes, cnt, before, (int)ntiles, st);
    }
    if (e == cudaSuccess) {
        kvps_gpu__compact_k<<<(unsigned)ntiles, KVPS_GPU__T, 0, st>>>(src, r, n, before, sel, idx, val32, val16);
        what = "kvps_gpu__compact_k";
        e = cudaGetLastError();
    }
    kvps_gpu__scratch_put(&scr, st);
    return e == cudaSuccess ? KVPS_OK : kvps_gpu__cuda_fail(e, what);
}

/* indices strictly ascending and < n, all checked before anything is written */
static __global__ void kvps_gpu__topk_check_k(const unsigned char *in, size_t n, int *status) {
    if (*(volatile int *)status) return;
    const size_t k = kvps_gpu__word(in);
    KVPS_GPU__LOOP(j, k)
        if (!kvps_gpu__index_ok(in, j, n)) atomicCAS(status, 0, (int)KVPS_ERR_MALFORMED);
}
static __global__ void kvps_gpu__zero_k(float *dst, size_t n, const int *status) {
    if (*status) return;
    KVPS_GPU__LOOP(i, n) dst[i] = 0.0f;
}
static __global__ void kvps_gpu__topk_scatter_k(const unsigned char *in, float *dst, const int *status) {
    if (*status) return;
    const size_t k = kvps_gpu__word(in);
    const int f16 = in[1] & KVPS_CODEC_FLAG_FP16_VALUES;
    const uint32_t *ix = (const uint32_t *)(const void *)(in + KVPS_GPU__ARRAYS);
    const unsigned char *vv = in + KVPS_GPU__ARRAYS + k * 4;
    KVPS_GPU__LOOP(j, k) {
        float v = f16 ? kvps_el_f16_to_f32(((const uint16_t *)(const void *)vv)[j]) : ((const float *)(const void *)vv)[j];
        dst[ix[j]] += v; /* indices are distinct: no two threads share a slot */
    }
}

// >>sign
/* The CPU's order: 8 interleaved partial sums, combined pairwise; NaN made canonical. */
static inline KVPS_HD float kvps_gpu__sign_scale(const float s[8], size_t m) {
    float t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    float sc = m ? t / (float)m : 0.0f;
    if (sc != sc) {
        uint32_t q = 0x7fc00000u;
        memcpy(&sc, &q, sizeof sc);
    }
    return sc;
}

/* Lane j's part of the chunk [b, b + m): |x + r| of elements j, j + 8, ... summed in order (the
   CPU's partial sum j); with error feedback (r not NULL) x + r is stored into r. */
static inline KVPS_HD float kvps_gpu__lane_sum(const float *x, float *r, size_t b, size_t m, unsigned j) {
    float s = 0.0f;
    for (size_t i = j; i < m; i += 8) {
        float a;
        if (r) { a = r[b + i] + x[b + i]; r[b + i] = a; }
        else a = x[b + i];
        s += fabsf(a);
    }
    return s;
}

/* chunk % 8 == 0: 8 threads per chunk, thread j summing elements j, j + 8, ... (the CPU's
   partial sum j); the sign bits of 8 consecutive elements come from the 8 threads (a ballot). */
static __global__ void kvps_gpu__sign_k(const float *x, float *r, size_t n, unsigned ch, float *scales, unsigned char *bits) {
    const unsigned g = threadIdx.x >> 3, j = threadIdx.x & 7, gw = (threadIdx.x & 31) >> 3;
    const size_t nc = (n + ch - 1) / ch;
    for (size_t cb = (size_t)blockIdx.x * (KVPS_GPU__T / 8); cb < nc; cb += (size_t)gridDim.x * (KVPS_GPU__T / 8)) {
        size_t c = cb + g, b = c * ch, m = 0;
        int valid = c < nc;
        if (valid) m = n - b < ch ? n - b : ch;
        float s = kvps_gpu__lane_sum(x, r, b, m, j);
        float p[8];
        for (int q = 0; q < 8; q++) p[q] = __shfl_sync(0xffffffffu, s, q, 8);
        float sc = kvps_gpu__sign_scale(p, m);
        if (valid && j == 0) scales[c] = sc;
        for (size_t t = 0; t < ch / 8; t++) {
            if (!__any_sync(0xffffffffu, t * 8 < m)) break; /* the warp's chunks are done (a huge chunk) */
            size_t i = t * 8 + j;
            int in = i < m;
            float a = in ? (r ? r[b + i] : x[b + i]) : 0.0f;
            int neg = in && (__float_as_uint(a) >> 31);
            unsigned bal = __ballot_sync(0xffffffffu, neg);
            if (in && r) r[b + i] = a - (neg ? -sc : sc);
            if (valid && j == 0 && t * 8 < m) bits[(b >> 3) + t] = (unsigned char)(bal >> (gw * 8));
        }
    }
}

/* Any other chunk: one thread per chunk for the scale, then per byte and per element. */
static __global__ void kvps_gpu__sign_scale_k(const float *x, float *r, size_t n, unsigned ch, float *scales) {
    const size_t nc = (n + ch - 1) / ch;
    KVPS_GPU__LOOP(c, nc) {
        size_t b = c * ch, m = n - b < ch ? n - b : ch;
        float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (size_t i = 0; i < m; i++) {
            float a;
            if (r) { a = r[b + i] + x[b + i]; r[b + i] = a; }
            else a = x[b + i];
            s[i & 7] += fabsf(a);
        }
        scales[c] = kvps_gpu__sign_scale(s, m);
    }
}
static __global__ void kvps_gpu__sign_bits_k(const float *acc, size_t n, unsigned char *bits) {
    const size_t nb = (n + 7) / 8;
    KVPS_GPU__LOOP(B, nb) {
        unsigned byte = 0;
        for (size_t e = 0; e < 8 && B * 8 + e < n; e++) byte |= (__float_as_uint(acc[B * 8 + e]) >> 31) << e;
        bits[B] = (unsigned char)byte;
    }
}
static __global__ void kvps_gpu__sign_resid_k(float *r, size_t n, unsigned ch, const float *scales) {
    KVPS_GPU__LOOP(i, n) {
        float a = r[i], sc = scales[i / ch];
        r[i] = a - ((__float_as_uint(a) >> 31) ? -sc : sc);
    }
}

static __global__ void kvps_gpu__sign_dec_k(const unsigned char *in, size_t n, float *dst, int acc, const int *status) {
    if (*status) return;
    const unsigned ch = kvps_gpu__word(in);
    const size_t nc = (n + ch - 1) / ch;
    const float *scales = (const float *)(const void *)(in + KVPS_GPU__ARRAYS);
    const unsigned char *bits = in + KVPS_GPU__ARRAYS + nc * 4;
    KVPS_GPU__LOOP(i, n) {
        float sc = scales[i / ch], v = (bits[i >> 3] >> (i & 7) & 1) ? -sc : sc;
        dst[i] = acc ? dst[i] + v : v;
    }
}

// >>kernel-api
static int kvps_gpu__half(kvps_dtype wire) { return wire == KVPS_FLOAT16 ? 1 : wire == KVPS_BFLOAT16 ? 0 : -1; }

KVPS_API kvps_result kvps_gpu_pack(uint16_t *d_out, const float *d_x, float *d_residual, size_t n, kvps_dtype wire,
                                   kvps_gpu_stream stream) {
    int f16 = kvps_gpu__half(wire);
    if (f16 < 0 || (n && (!d_out || !d_x))) return KVPS_ERR_INVALID_ARG;
    kvps_result rc = kvps_gpu__ready();
    if (rc != KVPS_OK || n == 0) return rc;
    kvps_gpu__pack_k<<<KVPS_GPU__GRID(n), KVPS_GPU__T, 0, (cudaStream_t)stream>>>(d_out, d_x, d_residual, n, f16);
    KVPS_GPU__LAUNCHED("kvps_gpu__pack_k");
    return KVPS_OK;
}

KVPS_API kvps_result kvps_gpu_unpack(float *d_out, const uint16_t *d_in, size_t n, kvps_dtype wire, int accumulate,
                                     kvps_gpu_stream stream) {
    int f16 = kvps_gpu__half(wire);
    if (f16 < 0 || (n && (!d_out || !d_in)) || (accumulate != 0 && accumulate != 1)) return KVPS_ERR_INVALID_ARG;
    kvps_result rc = kvps_gpu__ready();
    if (rc != KVPS_OK || n == 0) return rc;
    kvps_gpu__unpack_k<<<KVPS_GPU__GRID(n), KVPS_GPU__T, 0, (cudaStream_t)stream>>>(d_out, d_in, n, f16, accumulate, NULL);
    KVPS_GPU__LAUNCHED("kvps_gpu__unpack_k");
    return KVPS_OK;
}

KVPS_API kvps_result kvps_gpu_topk(const float *d_x, float *d_residual, size_t n, size_t k, uint32_t *d_idx,
                                   float *d_val, kvps_gpu_stream stream) {
    if ((n && !d_x) || (k && (!d_idx || !d_val)) || k > n || n > UINT32_MAX) return KVPS_ERR_INVALID_ARG;
    kvps_result rc = kvps_gpu__ready();
    if (rc != KVPS_OK) return rc;
    return kvps_gpu__topk_run(d_x, d_residual, n, k, d_idx, d_val, NULL, (cudaStream_t)stream);
}

static int kvps_gpu__dtype_ok(kvps_dtype dt) { return dt == KVPS_FLOAT32 || dt == KVPS_FLOAT16 || dt == KVPS_BFLOAT16; }

KVPS_API kvps_result kvps_gpu_sum(void *d_dst, const void *d_src, size_t n, kvps_dtype dt, kvps_gpu_stream stream) {
    if (!kvps_gpu__dtype_ok(dt) || (n && (!d_dst || !d_src))) return KVPS_ERR_INVALID_ARG;
    kvps_result rc = kvps_gpu__ready();
    if (rc != KVPS_OK || n == 0) return rc;
    kvps_gpu__sum_k<<<KVPS_GPU__GRID(n), KVPS_GPU__T, 0, (cudaStream_t)stream>>>(d_dst, d_src, n, (int)dt);
    KVPS_GPU__LAUNCHED("kvps_gpu__sum_k");
    return KVPS_OK;
}

KVPS_API kvps_result kvps_gpu_scale(void *d_dst, const void *d_src, float factor, size_t n, kvps_dtype dt,
                                    kvps_gpu_stream stream) {
    if (!kvps_gpu__dtype_ok(dt) || (n && !d_dst)) return KVPS_ERR_INVALID_ARG;
    kvps_result rc = kvps_gpu__ready();
    if (rc != KVPS_OK || n == 0) return rc;
    kvps_gpu__scale_k<<<KVPS_GPU__GRID(n), KVPS_GPU__T, 0, (cudaStream_t)stream>>>(d_dst, d_src ? d_src : d_dst, factor,
                                                                                  n, (int)dt);
    KVPS_GPU__LAUNCHED("kvps_gpu__scale_k");
    return KVPS_OK;
}

/* The CPU codec's bound (the blob format is the same); the built-in codecs only. */
KVPS_API size_t kvps_gpu_codec_bytes(const kvps_codec *c, size_t n) {
    if (!c || !kvps_gpu__builtin(c->id)) return 0;
    kvps_codec b = kvps_codec_get((kvps_codec_id)c->id);
    b.topk_fraction = c->topk_fraction;
    b.topk_count = c->topk_count;
    b.topk_fp16_values = c->topk_fp16_values;
    b.sign_chunk = c->sign_chunk;
    return kvps_codec_max_bytes(&b, n);
}

/* Each built-in codec's GPU encode and decode, found by name from KVPS_CODEC_TABLE (as the CPU's
   kvps__enc_NAME / kvps__dec_NAME). An encode writes the whole blob at o (kvps_gpu__head for the
   header) from d_x + d_residual; a decode runs after kvps_gpu__dec_check_k on the same stream,
   names the kernel it launched last in *what, and returns the launch's error. */
static kvps_result kvps_gpu__head(unsigned char *o, const kvps_codec *c, size_t n, int flags, int word_too, uint32_t word,
                                  cudaStream_t st) {
    kvps_gpu__header_k<<<1, 1, 0, st>>>(o, c->id, flags, (uint32_t)n, word_too, word);
    KVPS_GPU__LAUNCHED("kvps_gpu__header_k");
    return KVPS_OK;
}
static kvps_result kvps_gpu__enc_NONE(const kvps_codec *c, const float *d_x, float *d_residual, size_t n, unsigned char *o,
                                      cudaStream_t st) {
    kvps_result rc = kvps_gpu__head(o, c, n, 0, 0, 0, st);
    if (rc != KVPS_OK || !n) return rc;
    kvps_gpu__none_enc_k<<<KVPS_GPU__GRID(n), KVPS_GPU__T, 0, st>>>((float *)(void *)(o + KVPS_CODEC_HEADER), d_x, d_residual, n);
    KVPS_GPU__LAUNCHED("kvps_gpu__none_enc_k");
    return KVPS_OK;
}
static kvps_result kvps_gpu__enc_half(const kvps_codec *c, const float *d_x, float *d_residual, size_t n, unsigned char *o,
                                      cudaStream_t st, int f16) {
    kvps_result rc = kvps_gpu__head(o, c, n, 0, 0, 0, st);
    if (rc != KVPS_OK || !n) return rc;
    kvps_gpu__pack_k<<<KVPS_GPU__GRID(n), KVPS_GPU__T, 0, st>>>((uint16_t *)(void *)(o + KVPS_CODEC_HEADER), d_x, d_residual, n, f16);
    KVPS_GPU__LAUNCHED("kvps_gpu__pack_k");
    return KVPS_OK;
}
static kvps_result kvps_gpu__enc_FP16(const kvps_codec *c, const float *d_x, float *d_residual, size_t n, unsigned char *o,
                                      cudaStream_t st) {
    return kvps_gpu__enc_half(c, d_x, d_residual, n, o, st, 1);
}
static kvps_result kvps_gpu__enc_BF16(const kvps_codec *c, const float *d_x, float *d_residual, size_t n, unsigned char *o,
                                      cudaStream_t st) {
    return kvps_gpu__enc_half(c, d_x, d_residual, n, o, st, 0);
}
static kvps_result kvps_gpu__enc_TOPK(const kvps_codec *c, const float *d_x, float *d_residual, size_t n, unsigned char *o,
                                      cudaStream_t st) {
    int fp16v = c->topk_fp16_values != 0;
    size_t k = kvps_el_topk_k(c, n);
    kvps_result rc = kvps_gpu__head(o, c, n, fp16v ? (int)KVPS_CODEC_FLAG_FP16_VALUES : 0, 1, (uint32_t)k, st);
    if (rc != KVPS_OK || !n) return rc;
    uint32_t *idx = (uint32_t *)(void *)(o + KVPS_GPU__ARRAYS);
    unsigned char *vals = o + KVPS_GPU__ARRAYS + k * 4;
    return kvps_gpu__topk_run(d_x, d_residual, n, k, idx, fp16v ? NULL : (float *)(void *)vals,
                              fp16v ? (uint16_t *)(void *)vals : NULL, st);
}
static kvps_result kvps_gpu__enc_SIGN(const kvps_codec *c, const float *d_x, float *d_residual, size_t n, unsigned char *o,
                                      cudaStream_t st) {
    uint32_t ch = c->sign_chunk ? c->sign_chunk : KVPS_DEFAULT_SIGN_CHUNK;
    kvps_result rc = kvps_gpu__head(o, c, n, 0, 1, ch, st);
    if (rc != KVPS_OK || !n) return rc;
    size_t nc = (n + ch - 1) / ch;
    float *scales = (float *)(void *)(o + KVPS_GPU__ARRAYS);
    unsigned char *bits = o + KVPS_GPU__ARRAYS + nc * 4;
    if (ch % 8 == 0) {
        kvps_gpu__sign_k<<<kvps_gpu__grid(nc * 8, 1, 16384) /* 8 threads a chunk */, KVPS_GPU__T, 0, st>>>(
            d_x, d_residual, n, ch, scales, bits);
        KVPS_GPU__LAUNCHED("kvps_gpu__sign_k");
        return KVPS_OK;
    }
    kvps_gpu__sign_scale_k<<<KVPS_GPU__GRID(nc), KVPS_GPU__T, 0, st>>>(d_x, d_residual, n, ch, scales);
    KVPS_GPU__LAUNCHED("kvps_gpu__sign_scale_k");
    kvps_gpu__sign_bits_k<<<KVPS_GPU__GRID((n + 7) / 8), KVPS_GPU__T, 0, st>>>(d_residual ? d_residual : d_x, n, bits);
    KVPS_GPU__LAUNCHED("kvps_gpu__sign_bits_k");
    if (d_residual) {
        kvps_gpu__sign_resid_k<<<KVPS_GPU__GRID(n), KVPS_GPU__T, 0, st>>>(d_residual, n, ch, scales);
        KVPS_GPU__LAUNCHED("kvps_gpu__sign_resid_k");
    }
    return KVPS_OK;
}

static cudaError_t kvps_gpu__dec_NONE(const unsigned char *in, float *d_dst, size_t n, int accumulate, int *status,
                                      cudaStream_t st, const char **what) {
    kvps_gpu__none_dec_k<<<KVPS_GPU__GRID(n), KVPS_GPU__T, 0, st>>>(d_dst, (const float *)(const void *)(in + KVPS_CODEC_HEADER), n,
                                                                   accumulate, status);
    *what = "kvps_gpu__none_dec_k";
    return cudaGetLastError();
}
static cudaError_t kvps_gpu__dec_half(const unsigned char *in, float *d_dst, size_t n, int accumulate, int *status,
                                      cudaStream_t st, const char **what, int f16) {
    kvps_gpu__unpack_k<<<KVPS_GPU__GRID(n), KVPS_GPU__T, 0, st>>>(d_dst, (const uint16_t *)(const void *)(in + KVPS_CODEC_HEADER), n,
                                                                 f16, accumulate, status);
    *what = "kvps_gpu__unpack_k";
    return cudaGetLastError();
}
static cudaError_t kvps_gpu__dec_FP16(const unsigned char *in, float *d_dst, size_t n, int accumulate, int *status,
                                      cudaStream_t st, const char **what) {
    return kvps_gpu__dec_half(in, d_dst, n, accumulate, status, st, what, 1);
}
static cudaError_t kvps_gpu__dec_BF16(const unsigned char *in, float *d_dst, size_t n, int accumulate, int *status,
                                      cudaStream_t st, const char **what) {
    return kvps_gpu__dec_half(in, d_dst, n, accumulate, status, st, what, 0);
}
static cudaError_t kvps_gpu__dec_TOPK(const unsigned char *in, float *d_dst, size_t n, int accumulate, int *status,
                                      cudaStream_t st, const char **what) {
    cudaError_t e;
    kvps_gpu__topk_check_k<<<KVPS_GPU__GRID(n), KVPS_GPU__T, 0, st>>>(in, n, status);
    *what = "kvps_gpu__topk_check_k";
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if (!accumulate) {
        kvps_gpu__zero_k<<<KVPS_GPU__GRID(n), KVPS_GPU__T, 0, st>>>(d_dst, n, status);
        *what = "kvps_gpu__zero_k";
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    kvps_gpu__topk_scatter_k<<<KVPS_GPU__GRID(n), KVPS_GPU__T, 0, st>>>(in, d_dst, status);
    *what = "kvps_gpu__topk_scatter_k";
    return cudaGetLastError();
}
static cudaError_t kvps_gpu__dec_SIGN(const unsigned char *in, float *d_dst, size_t n, int accumulate, int *status,
                                      cudaStream_t st, const char **what) {
    kvps_gpu__sign_dec_k<<<KVPS_GPU__GRID(n), KVPS_GPU__T, 0, st>>>(in, n, d_dst, accumulate, status);
    *what = "kvps_gpu__sign_dec_k";
    return cudaGetLastError();
}

/* The GPU's row of each built-in codec (KVPS_CODEC_TABLE): a new row there needs the two functions
   above, or this does not compile. */
typedef struct kvps_gpu__codec {
    kvps_result (*enc)(const kvps_codec *c, const float *d_x, float *d_residual, size_t n, unsigned char *o, cudaStream_t st);
    cudaError_t (*dec)(const unsigned char *in, float *d_dst, size_t n, int accumulate, int *status, cudaStream_t st,
                       const char **what);
} kvps_gpu__codec;
static const kvps_gpu__codec kvps_gpu__codecs[] = {
#define KVPS_GPU__ROW(cid, num, name, dense, fl, size_fn, max_fn) {kvps_gpu__enc_##cid, kvps_gpu__dec_##cid},
    KVPS_CODEC_TABLE(KVPS_GPU__ROW)
#undef KVPS_GPU__ROW
};

KVPS_API kvps_result kvps_gpu_encode(const kvps_codec *c, const float *d_x, size_t n, float *d_residual, void *d_out,
                                     size_t cap, size_t *out_bytes, kvps_gpu_stream stream) {
    if (!c || (!d_x && n) || !d_out || !out_bytes || n > UINT32_MAX || ((uintptr_t)d_out & 3)) return KVPS_ERR_INVALID_ARG;
    if (!kvps_gpu__builtin(c->id)) {
        kvps_gpu__seterr("kvps_gpu_encode: codec id %d has no GPU encoder", c->id);
        return KVPS_ERR_CODEC;
    }
    size_t need = kvps_gpu_codec_bytes(c, n);
    if (cap < need) return KVPS_ERR_TOO_LARGE;
    kvps_result rc = kvps_gpu__ready();
    if (rc != KVPS_OK) return rc;
    rc = kvps_gpu__codecs[c->id].enc(c, d_x, d_residual, n, (unsigned char *)d_out, (cudaStream_t)stream);
    if (rc != KVPS_OK) return rc;
    *out_bytes = need;
    return KVPS_OK;
}

KVPS_API kvps_result kvps_gpu_decode(const kvps_codec *c, const void *d_in, size_t bytes, float *d_dst, size_t n,
                                     int accumulate, int *d_status, kvps_gpu_stream stream) {
    if (!c || !d_in || (!d_dst && n) || (accumulate != 0 && accumulate != 1) || ((uintptr_t)d_in & 3) ||
        ((uintptr_t)d_status & 3))
        return KVPS_ERR_INVALID_ARG;
    if (!kvps_gpu__builtin(c->id)) {
        kvps_gpu__seterr("kvps_gpu_decode: codec id %d has no GPU decoder", c->id);
        return KVPS_ERR_CODEC;
    }
    kvps_result rc = kvps_gpu__ready();
    if (rc != KVPS_OK) return rc;
    cudaStream_t st = (cudaStream_t)stream;
    kvps_gpu__scratch scr = {NULL, 0};
    int *status = d_status;
    if (!status) {
        rc = kvps_gpu__scratch_get(&scr, sizeof(int), st);
        if (rc != KVPS_OK) return rc;
        status = (int *)scr.p;
    }
    const unsigned char *in = (const unsigned char *)d_in;
    const char *what = "kvps_gpu__dec_check_k";
    kvps_gpu__dec_check_k<<<1, 1, 0, st>>>(in, bytes, c->id, n, status);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && n) e = kvps_gpu__codecs[c->id].dec(in, d_dst, n, accumulate, status, st, &what);
    kvps_gpu__scratch_put(&scr, st);
    return e == cudaSuccess ? KVPS_OK : kvps_gpu__cuda_fail(e, what);
}

// >>comm
struct kvps_gpu_comm {
    ncclComm_t nccl;
    int rank, size, device, timeout_ms;
    int broken; /* aborted or failed: KVPS_ERR_STATE from then on */
    char err[512];
};

static thread_local int kvps_gpu__group_depth; /* NCCL groups are per thread */

/* Records a failure in the thread's and the communicator's message. */
static void kvps_gpu__comm_err(kvps_gpu_comm *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kvps_gpu__err, sizeof kvps_gpu__err, fmt, ap);
    va_end(ap);
    if (c) snprintf(c->err, sizeof c->err, "%s", kvps_gpu__err);
}

static void kvps_gpu__abort(kvps_gpu_comm *c) {
    if (c->nccl) (void)ncclCommAbort(c->nccl);
    c->nccl = NULL;
    c->broken = 1;
}

/* An NCCL failure: message with NCCL's own text, then the communicator is aborted (NCCL's rule:
   after an error nothing is known about the operations in flight). */
static kvps_result kvps_gpu__nccl_fail(kvps_gpu_comm *c, ncclResult_t r, const char *what) {
    const char *last = c->nccl ? ncclGetLastError(c->nccl) : ncclGetLastError(NULL);
    kvps_gpu__comm_err(c, "%s: %s%s%s; communicator aborted", what, ncclGetErrorString(r), last && *last ? ": " : "",
                       last ? last : "");
    kvps_gpu__abort(c);
    return kvps_gpu_result_from_nccl((int)r);
}

/* Non-blocking NCCL: a call may answer ncclInProgress; poll the communicator until it settles,
   within the deadline, else abort. */
static kvps_result kvps_gpu__settle(kvps_gpu_comm *c, ncclResult_t r, const char *what, int timeout_ms) {
    int64_t deadline = kvps_gpu__now_ms() + timeout_ms;
    int spins = 0;
    while (r == ncclInProgress) {
        if (kvps_gpu__now_ms() > deadline) {
            kvps_gpu__comm_err(c, "%s: not done within %d ms; communicator aborted", what, timeout_ms);
            kvps_gpu__abort(c);
            return KVPS_ERR_TIMEOUT;
        }
        kvps_gpu__pause(&spins);
        ncclResult_t st = ncclSuccess, q = ncclCommGetAsyncError(c->nccl, &st);
        r = q != ncclSuccess ? q : st;
    }
    return r == ncclSuccess ? KVPS_OK : kvps_gpu__nccl_fail(c, r, what);
}

KVPS_API kvps_result kvps_gpu_nccl_id(kvps_ring *ring, int rank, void *id) {
    if (!ring || !id || rank < 0) return KVPS_ERR_INVALID_ARG;
    /* [status][id]: a failure on rank 0 still reaches every rank, none waits for an id */
    int32_t buf[1 + KVPS_GPU_ID_BYTES / 4];
    memset(buf, 0, sizeof buf);
    if (rank == 0) {
        ncclUniqueId u;
        ncclResult_t r = ncclGetUniqueId(&u);
        buf[0] = (int32_t)r;
        if (r == ncclSuccess) memcpy(buf + 1, &u, KVPS_GPU_ID_BYTES);
    }
    kvps_result rc = kvps_ring_broadcast(ring, NULL, buf, sizeof buf / 4, KVPS_INT32, 0);
    if (rc != KVPS_OK) {
        kvps_gpu__seterr("kvps_gpu_nccl_id: broadcast: %s (%s)", kvps_result_str(rc), kvps_ring_last_error(ring));
        return rc;
    }
    if (buf[0] != ncclSuccess) {
        kvps_gpu__seterr("kvps_gpu_nccl_id: ncclGetUniqueId failed on rank 0: %s",
                         ncclGetErrorString((ncclResult_t)buf[0]));
        return kvps_gpu_result_from_nccl(buf[0]) == KVPS_OK ? KVPS_ERR_GPU : kvps_gpu_result_from_nccl(buf[0]);
    }
    memcpy(id, buf + 1, KVPS_GPU_ID_BYTES);
    return KVPS_OK;
}

static ncclConfig_t kvps_gpu__config(void) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* every call returns; we poll with a deadline */
    return cfg;
}

KVPS_API kvps_result kvps_gpu_comm_create(const kvps_gpu_comm_desc *d, kvps_gpu_comm **out) {
    if (!d || !out) return KVPS_ERR_INVALID_ARG;
    *out = NULL;
    if (d->size < 1 || d->rank < 0 || d->rank >= d->size || d->timeout_ms < 0 || d->device < KVPS_GPU_DEVICE_AUTO ||
        (d->size > 1 && !d->ring && !d->nccl_id)) {
        kvps_gpu__seterr("kvps_gpu_comm_create: need 0 <= rank < size, timeout_ms >= 0, device >= -1, and for size "
                         "> 1 a ring or an nccl_id");
        return KVPS_ERR_CONFIG;
    }
    /* the id first: every rank takes part in the broadcast even if it then fails locally */
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (d->nccl_id) memcpy(&id, d->nccl_id, KVPS_GPU_ID_BYTES);
    else if (d->ring) {
        kvps_result rc = kvps_gpu_nccl_id(d->ring, d->rank, &id);
        if (rc != KVPS_OK) return rc;
    } else {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) {
            kvps_gpu__seterr("ncclGetUniqueId: %s", ncclGetErrorString(r));
            return kvps_gpu_result_from_nccl((int)r);
        }
    }
    int ndev = 0;
    kvps_result rc = kvps_gpu_device_count(&ndev);
    if (rc != KVPS_OK) return rc;
    int dev = d->device == KVPS_GPU_DEVICE_AUTO ? d->rank % ndev : d->device;
    if (dev >= ndev) {
        kvps_gpu__seterr("kvps_gpu_comm_create: device %d, but %d visible", dev, ndev);
        return KVPS_ERR_CONFIG;
    }
    kvps_gpu_comm *c = (kvps_gpu_comm *)calloc(1, sizeof *c);
    if (!c) return KVPS_ERR_NOMEM;
    c->rank = d->rank;
    c->size = d->size;
    c->device = dev;
    c->timeout_ms = d->timeout_ms ? d->timeout_ms : 60000;
    kvps_gpu__dev g;
    rc = kvps_gpu__dev_enter(&g, dev);
    if (rc == KVPS_OK) {
        ncclConfig_t cfg = kvps_gpu__config();
        ncclResult_t r = ncclCommInitRankConfig(&c->nccl, c->size, id, c->rank, &cfg);
        if (r != ncclSuccess && r != ncclInProgress && !c->nccl) {
            kvps_gpu__comm_err(c, "ncclCommInitRankConfig: %s: %s", ncclGetErrorString(r), ncclGetLastError(NULL));
            rc = kvps_gpu_result_from_nccl((int)r);
        } else {
            rc = kvps_gpu__settle(c, r, "ncclCommInitRankConfig", c->timeout_ms);
        }
    }
    kvps_gpu__dev_leave(&g);
    if (rc != KVPS_OK) {
        if (c->nccl) kvps_gpu__abort(c);
        free(c);
        return rc;
    }
    *out = c;
    return KVPS_OK;
}

KVPS_API kvps_result kvps_gpu_comm_create_local(const int *devices, int n, int timeout_ms, kvps_gpu_comm **out) {
    if (!out || n < 1 || timeout_ms < 0) return KVPS_ERR_INVALID_ARG;
    for (int i = 0; i < n; i++) out[i] = NULL;
    int ndev = 0;
    kvps_result rc = kvps_gpu_device_count(&ndev);
    if (rc != KVPS_OK) return rc;
    for (int i = 0; i < n; i++) {
        int dv = devices ? devices[i] : i;
        if (dv < 0 || dv >= ndev) {
            kvps_gpu__seterr("kvps_gpu_comm_create_local: device %d, but %d visible", dv, ndev);
            return KVPS_ERR_CONFIG;
        }
    }
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
        kvps_gpu__seterr("ncclGetUniqueId: %s", ncclGetErrorString(r));
        return kvps_gpu_result_from_nccl((int)r);
    }
    for (int i = 0; i < n; i++) {
        out[i] = (kvps_gpu_comm *)calloc(1, sizeof **out);
        if (!out[i]) { rc = KVPS_ERR_NOMEM; goto fail; }
        out[i]->rank = i;
        out[i]->size = n;
        out[i]->device = devices ? devices[i] : i;
        out[i]->timeout_ms = timeout_ms ? timeout_ms : 60000;
    }
    {
        int old = 0;
        cudaError_t e = cudaGetDevice(&old);
        if (e != cudaSuccess) { rc = kvps_gpu__cuda_fail(e, "cudaGetDevice"); goto fail; }
        ncclConfig_t cfg = kvps_gpu__config();
        /* one thread, n devices: NCCL wants the inits in one group */
        r = ncclGroupStart();
        for (int i = 0; i < n && r == ncclSuccess; i++) {
            e = cudaSetDevice(out[i]->device);
            if (e != cudaSuccess) break;
            r = ncclCommInitRankConfig(&out[i]->nccl, n, id, i, &cfg);
            if (r == ncclInProgress) r = ncclSuccess;
        }
        ncclResult_t ge = ncclGroupEnd();
        (void)cudaSetDevice(old);
        if (e != cudaSuccess) { rc = kvps_gpu__cuda_fail(e, "cudaSetDevice"); goto fail; }
        if (r == ncclSuccess) r = ge;
        for (int i = 0; i < n && rc == KVPS_OK; i++) {
            if (!out[i]->nccl) {
                kvps_gpu__comm_err(out[i], "ncclCommInitRankConfig (rank %d): %s", i, ncclGetErrorString(r));
                rc = r == ncclSuccess || r == ncclInProgress ? KVPS_ERR_GPU : kvps_gpu_result_from_nccl((int)r);
                break;
            }
            kvps_gpu__dev g;
            rc = kvps_gpu__dev_enter(&g, out[i]->device);
            if (rc == KVPS_OK) rc = kvps_gpu__settle(out[i], r == ncclSuccess ? ncclInProgress : r, "ncclCommInitRankConfig",
                                                     out[i]->timeout_ms);
            kvps_gpu__dev_leave(&g);
        }
        if (rc != KVPS_OK) goto fail;
    }
    return KVPS_OK;
fail:
    for (int i = 0; i < n; i++) {
        if (out[i] && out[i]->nccl) kvps_gpu__abort(out[i]);
        free(out[i]);
        out[i] = NULL;
    }
    return rc;
}

KVPS_API void kvps_gpu_comm_destroy(kvps_gpu_comm **cp) {
    if (!cp || !*cp) return;
    kvps_gpu_comm *c = *cp;
    *cp = NULL;
    if (c->nccl) {
        kvps_gpu__dev g;
        if (kvps_gpu__dev_enter(&g, c->device) == KVPS_OK && !c->broken) {
            /* finalize flushes what is in flight (bounded by the timeout), then destroy */
            if (kvps_gpu__settle(c, ncclCommFinalize(c->nccl), "ncclCommFinalize", c->timeout_ms) == KVPS_OK) {
                (void)ncclCommDestroy(c->nccl);
                c->nccl = NULL;
            }
        }
        if (c->nccl) kvps_gpu__abort(c);
        kvps_gpu__dev_leave(&g);
    }
    free(c);
}

KVPS_API int kvps_gpu_comm_rank(const kvps_gpu_comm *c) { return c ? c->rank : -1; }
KVPS_API int kvps_gpu_comm_size(const kvps_gpu_comm *c) { return c ? c->size : 0; }
KVPS_API int kvps_gpu_comm_device(const kvps_gpu_comm *c) { return c ? c->device : -1; }
KVPS_API void *kvps_gpu_comm_nccl(const kvps_gpu_comm *c) { return c ? (void *)c->nccl : NULL; }
KVPS_API const char *kvps_gpu_comm_last_error(const kvps_gpu_comm *c) { return c ? c->err : ""; }

static kvps_result kvps_gpu__broken(kvps_gpu_comm *c) {
    kvps_gpu__seterr("communicator aborted earlier (%s); destroy it and create a new one", c->err);
    return KVPS_ERR_STATE;
}

/* the communicator's pending asynchronous error, if any (aborting on one) */
static kvps_result kvps_gpu__poll(kvps_gpu_comm *c, const char *what) {
    ncclResult_t st = ncclSuccess, q = ncclCommGetAsyncError(c->nccl, &st);
    ncclResult_t r = q != ncclSuccess ? q : st;
    if (r == ncclSuccess || r == ncclInProgress) return KVPS_OK;
    return kvps_gpu__nccl_fail(c, r, what);
}

KVPS_API kvps_result kvps_gpu_comm_check(kvps_gpu_comm *c) {
    if (!c) return KVPS_ERR_INVALID_ARG;
    if (c->broken) return kvps_gpu__broken(c);
    kvps_gpu__dev g;
    kvps_result rc = kvps_gpu__dev_enter(&g, c->device);
    if (rc == KVPS_OK) rc = kvps_gpu__poll(c, "ncclCommGetAsyncError");
    kvps_gpu__dev_leave(&g);
    return rc;
}

KVPS_API void kvps_gpu_comm_abort(kvps_gpu_comm *c) {
    if (!c || !c->nccl) return;
    kvps_gpu__dev g;
    kvps_result rc = kvps_gpu__dev_enter(&g, c->device);
    snprintf(c->err, sizeof c->err, "aborted by kvps_gpu_comm_abort");
    kvps_gpu__abort(c);
    if (rc == KVPS_OK) kvps_gpu__dev_leave(&g);
}

KVPS_API kvps_result kvps_gpu_comm_wait(kvps_gpu_comm *c, kvps_gpu_stream stream, int timeout_ms) {
    if (!c || timeout_ms < -1) return KVPS_ERR_INVALID_ARG;
    if (c->broken) return kvps_gpu__broken(c);
    if (timeout_ms < 0) timeout_ms = c->timeout_ms;
    kvps_gpu__dev g;
    kvps_result rc = kvps_gpu__dev_enter(&g, c->device);
    if (rc != KVPS_OK) return rc;
    int64_t deadline = kvps_gpu__now_ms() + timeout_ms;
    int spins = 0;
    for (;;) {
        cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
        if (e != cudaSuccess && e != cudaErrorNotReady) {
            rc = kvps_gpu__cuda_fail(e, "cudaStreamQuery");
            snprintf(c->err, sizeof c->err, "%.480s; communicator aborted", kvps_gpu__err);
            kvps_gpu__abort(c);
            break;
        }
        rc = kvps_gpu__poll(c, "collective");
        if (rc != KVPS_OK || e == cudaSuccess) break;
        if (kvps_gpu__now_ms() > deadline) {
            kvps_gpu__comm_err(c, "kvps_gpu_comm_wait: stream not done within %d ms (a rank missing, or "
                                  "mismatched collectives); communicator aborted", timeout_ms);
            kvps_gpu__abort(c);
            rc = KVPS_ERR_TIMEOUT;
            break;
        }
        kvps_gpu__pause(&spins);
    }
    kvps_gpu__dev_leave(&g);
    return rc;
}

// >>collectives
/* NCCL's names of the kvps_dtype and kvps_redop values, one entry each, in their order. */
static const ncclDataType_t kvps_gpu__nccl_types[] = {ncclFloat32, ncclFloat64, ncclInt32,
                                                      ncclInt64,   ncclFloat16, ncclBfloat16};
static const ncclRedOp_t kvps_gpu__nccl_ops[] = {ncclSum, ncclProd, ncclMin, ncclMax, ncclAvg};
static_assert(sizeof kvps_gpu__nccl_types / sizeof kvps_gpu__nccl_types[0] == KVPS_DTYPE_COUNT,
              "kvps_gpu.h: an NCCL type for every kvps_dtype");
static_assert(sizeof kvps_gpu__nccl_ops / sizeof kvps_gpu__nccl_ops[0] == KVPS_REDOP_COUNT,
              "kvps_gpu.h: an NCCL op for every kvps_redop");

static int kvps_gpu__nccl_type(kvps_dtype dt, ncclDataType_t *t) {
    if ((unsigned)dt >= KVPS_DTYPE_COUNT) return 0;
    *t = kvps_gpu__nccl_types[dt];
    return 1;
}
static int kvps_gpu__nccl_op(kvps_redop op, ncclRedOp_t *o) {
    if ((unsigned)op >= KVPS_REDOP_COUNT) return 0;
    *o = kvps_gpu__nccl_ops[op];
    return 1;
}

enum { KVPS_GPU__ALLREDUCE, KVPS_GPU__REDUCE_SCATTER, KVPS_GPU__ALLGATHER, KVPS_GPU__BROADCAST, KVPS_GPU__COLL_COUNT };

static kvps_result kvps_gpu__coll(kvps_gpu_comm *c, int coll, const void *send, void *recv, size_t count, kvps_dtype dt,
                                  kvps_redop op, int root, kvps_gpu_stream stream) {
    static const char *names[KVPS_GPU__COLL_COUNT] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast"};
    ncclDataType_t t;
    ncclRedOp_t o = ncclSum;
    if (!c || !kvps_gpu__nccl_type(dt, &t) || (coll <= KVPS_GPU__REDUCE_SCATTER && !kvps_gpu__nccl_op(op, &o)))
        return KVPS_ERR_INVALID_ARG;
    if (count && (!recv || (!send && (coll == KVPS_GPU__REDUCE_SCATTER || coll == KVPS_GPU__ALLGATHER))))
        return KVPS_ERR_INVALID_ARG;
    if (coll == KVPS_GPU__BROADCAST && (root < 0 || root >= c->size)) return KVPS_ERR_INVALID_ARG;
    if (c->broken) return kvps_gpu__broken(c);
    if (count == 0) return KVPS_OK;
    if (!send) send = recv;
    kvps_gpu__dev g;
    kvps_result rc = kvps_gpu__dev_enter(&g, c->device);
    if (rc != KVPS_OK) return rc;
    /* an earlier collective's asynchronous failure surfaces here rather than as a hang */
    rc = kvps_gpu__group_depth ? KVPS_OK : kvps_gpu__poll(c, names[coll]);
    if (rc == KVPS_OK) {
        cudaStream_t st = (cudaStream_t)stream;
        ncclResult_t r = ncclSuccess;
        switch (coll) {
        case KVPS_GPU__ALLREDUCE: r = ncclAllReduce(send, recv, count, t, o, c->nccl, st); break;
        case KVPS_GPU__REDUCE_SCATTER: r = ncclReduceScatter(send, recv, count, t, o, c->nccl, st); break;
        case KVPS_GPU__ALLGATHER: r = ncclAllGather(send, recv, count, t, c->nccl, st); break;
        case KVPS_GPU__BROADCAST: r = ncclBroadcast(send, recv, count, t, root, c->nccl, st); break;
        }
        /* inside a group the launch happens at kvps_gpu_group_end, which settles */
        if (kvps_gpu__group_depth && r == ncclInProgress) r = ncclSuccess;
        rc = kvps_gpu__settle(c, r, names[coll], c->timeout_ms);
    }
    kvps_gpu__dev_leave(&g);
    return rc;
}

KVPS_API kvps_result kvps_gpu_allreduce(kvps_gpu_comm *c, const void *d_send, void *d_recv, size_t count,
                                        kvps_dtype dt, kvps_redop op, kvps_gpu_stream stream) {
    return kvps_gpu__coll(c, KVPS_GPU__ALLREDUCE, d_send, d_recv, count, dt, op, 0, stream);
}
KVPS_API kvps_result kvps_gpu_reduce_scatter(kvps_gpu_comm *c, const void *d_send, void *d_recv, size_t count,
                                             kvps_dtype dt, kvps_redop op, kvps_gpu_stream stream) {
    return kvps_gpu__coll(c, KVPS_GPU__REDUCE_SCATTER, d_send, d_recv, count, dt, op, 0, stream);
}
KVPS_API kvps_result kvps_gpu_allgather(kvps_gpu_comm *c, const void *d_send, void *d_recv, size_t count,
                                        kvps_dtype dt, kvps_gpu_stream stream) {
    return kvps_gpu__coll(c, KVPS_GPU__ALLGATHER, d_send, d_recv, count, dt, KVPS_SUM, 0, stream);
}
KVPS_API kvps_result kvps_gpu_broadcast(kvps_gpu_comm *c, const void *d_send, void *d_recv, size_t count,
                                        kvps_dtype dt, int root, kvps_gpu_stream stream) {
    return kvps_gpu__coll(c, KVPS_GPU__BROADCAST, d_send, d_recv, count, dt, KVPS_SUM, root, stream);
}

KVPS_API kvps_result kvps_gpu_group_start(void) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) {
        kvps_gpu__seterr("ncclGroupStart: %s", ncclGetErrorString(r));
        return kvps_gpu_result_from_nccl((int)r);
    }
    kvps_gpu__group_depth++;
    return KVPS_OK;
}

KVPS_API kvps_result kvps_gpu_group_end(kvps_gpu_comm **comms, int n) {
    if (n < 0 || (n && !comms)) return KVPS_ERR_INVALID_ARG;
    if (kvps_gpu__group_depth == 0) {
        kvps_gpu__seterr("kvps_gpu_group_end without kvps_gpu_group_start");
        return KVPS_ERR_STATE;
    }
    kvps_gpu__group_depth--;
    ncclResult_t r = ncclGroupEnd();
    kvps_result rc = KVPS_OK;
    if (r != ncclSuccess && r != ncclInProgress) {
        kvps_gpu__seterr("ncclGroupEnd: %s: %s", ncclGetErrorString(r), ncclGetLastError(NULL));
        rc = kvps_gpu_result_from_nccl((int)r);
        for (int i = 0; i < n; i++)
            if (comms[i] && !comms[i]->broken) {
                snprintf(comms[i]->err, sizeof comms[i]->err, "%.480s; communicator aborted", kvps_gpu__err);
                kvps_gpu__abort(comms[i]);
            }
        return rc;
    }
    if (kvps_gpu__group_depth) return KVPS_OK; /* nested: the outermost end launches */
    for (int i = 0; i < n; i++) {
        kvps_gpu_comm *c = comms[i];
        if (!c || c->broken) continue;
        kvps_gpu__dev g;
        kvps_result ri = kvps_gpu__dev_enter(&g, c->device);
        if (ri == KVPS_OK) ri = kvps_gpu__settle(c, ncclInProgress, "ncclGroupEnd", c->timeout_ms);
        kvps_gpu__dev_leave(&g);
        if (ri != KVPS_OK && rc == KVPS_OK) rc = ri;
    }
    return rc;
}

// >>hier
struct kvps_gpu_hier {
    kvps_gpu_hier_desc d;
    const kvps_gpu__ops *ops;
    int L, lr, broken, inflight, stepped;
    size_t shard, np;
    float *d_shard, *d_pad, *h_send, *h_recv;
    void **ev;
    void *done; /* recorded at the end of a step: the next one, on any stream, waits for it */
    kvps_tensor *t;
    uint64_t *req; /* kvps_req or kvps_ring_req */
    char err[512];
};

static kvps_result kvps_gpu__ops_ready(void) { return kvps_gpu__ready(); }
static kvps_result kvps_gpu__ops_alloc_host(void **p, size_t b) {
    KVPS_GPU__TRY(cudaMallocHost(p, b ? b : 1), "cudaMallocHost");
    return KVPS_OK;
}
static void kvps_gpu__ops_free_host(void *p) { if (p) (void)cudaFreeHost(p); }
static kvps_result kvps_gpu__ops_alloc_dev(void **p, size_t b) {
    KVPS_GPU__TRY(cudaMalloc(p, b ? b : 1), "cudaMalloc");
    return KVPS_OK;
}
static void kvps_gpu__ops_free_dev(void *p) { if (p) (void)cudaFree(p); }
static kvps_result kvps_gpu__ops_copy(void *dst, const void *src, size_t b, kvps_gpu_stream s) {
    KVPS_GPU__TRY(cudaMemcpyAsync(dst, src, b, cudaMemcpyDefault, (cudaStream_t)s), "cudaMemcpyAsync");
    return KVPS_OK;
}
static kvps_result kvps_gpu__ops_zero(void *d, size_t b, kvps_gpu_stream s) {
    KVPS_GPU__TRY(cudaMemsetAsync(d, 0, b, (cudaStream_t)s), "cudaMemsetAsync");
    return KVPS_OK;
}
static kvps_result kvps_gpu__ops_scale(float *d, const float *s, float f, size_t n, kvps_gpu_stream st) {
    return kvps_gpu_scale(d, s, f, n, KVPS_FLOAT32, st);
}
static kvps_result kvps_gpu__ops_event_create(void **e) {
    KVPS_GPU__TRY(cudaEventCreateWithFlags((cudaEvent_t *)e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return KVPS_OK;
}
static void kvps_gpu__ops_event_destroy(void *e) { if (e) (void)cudaEventDestroy((cudaEvent_t)e); }
static kvps_result kvps_gpu__ops_event_record(void *e, kvps_gpu_stream s) {
    KVPS_GPU__TRY(cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s), "cudaEventRecord");
    return KVPS_OK;
}
static kvps_result kvps_gpu__ops_event_query(void *e, int *done) {
    cudaError_t r = cudaEventQuery((cudaEvent_t)e);
    *done = r == cudaSuccess;
    if (r == cudaSuccess || r == cudaErrorNotReady) return KVPS_OK;
    return kvps_gpu__cuda_fail(r, "cudaEventQuery");
}
static kvps_result kvps_gpu__ops_event_wait(void *e, kvps_gpu_stream s) {
    KVPS_GPU__TRY(cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0), "cudaStreamWaitEvent");
    return KVPS_OK;
}
static const kvps_gpu__ops kvps_gpu__cuda_ops = {
    kvps_gpu__ops_ready, kvps_gpu__ops_alloc_host, kvps_gpu__ops_free_host, kvps_gpu__ops_alloc_dev,
    kvps_gpu__ops_free_dev, kvps_gpu__ops_copy, kvps_gpu__ops_zero, kvps_gpu__ops_scale,
    kvps_gpu__ops_event_create, kvps_gpu__ops_event_destroy, kvps_gpu__ops_event_record, kvps_gpu__ops_event_query,
    kvps_gpu__ops_event_wait};

static void kvps_gpu__hier_err(kvps_gpu_hier *h, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->err, sizeof h->err, fmt, ap);
    va_end(ap);
    snprintf(kvps_gpu__err, sizeof kvps_gpu__err, "%s", h->err);
}

static size_t kvps_gpu__piece_len(const kvps_gpu_hier *h, size_t p) {
    size_t off = p * h->d.piece;
    return h->shard - off < h->d.piece ? h->shard - off : h->d.piece;
}

static void kvps_gpu__hier_free(kvps_gpu_hier *h) {
    const kvps_gpu__ops *o = h->ops;
    if (h->ev)
        for (size_t p = 0; p < h->np; p++) o->event_destroy(h->ev[p]);
    o->event_destroy(h->done);
    o->free_dev(h->d_shard);
    o->free_dev(h->d_pad);
    o->free_host(h->h_send);
    o->free_host(h->h_recv);
    free(h->ev);
    free(h->t);
    free(h->req);
    free(h);
}

KVPS_API kvps_result kvps_gpu__hier_create_ops(const kvps_gpu_hier_desc *d, const kvps_gpu__ops *ops,
                                               kvps_gpu_hier **out) {
    if (!d || !out || !ops) return KVPS_ERR_INVALID_ARG;
    *out = NULL;
    if (d->count == 0 || !d->worker == !d->ring || (d->worker && (!d->name || !*d->name)) || d->timeout_ms < 0 ||
        (unsigned)d->op >= KVPS_REDOP_COUNT || (d->local && ops != &kvps_gpu__cuda_ops) || (d->local && d->local->broken)) {
        kvps_gpu__seterr("kvps_gpu_hier_create: need count > 0, exactly one of worker and ring, a name with a "
                         "worker, timeout_ms >= 0, a valid op and a live local communicator");
        return KVPS_ERR_CONFIG;
    }
    kvps_result rc = ops->ready();
    if (rc != KVPS_OK) return rc;
    kvps_gpu_hier *h = (kvps_gpu_hier *)calloc(1, sizeof *h);
    if (!h) return KVPS_ERR_NOMEM;
    h->d = *d;
    h->d.name = NULL; /* borrowed for this call only */
    h->ops = ops;
    if (!h->d.piece) h->d.piece = (size_t)1 << 20;
    if (h->d.scale == 0.0f) h->d.scale = 1.0f;
    if (!h->d.timeout_ms) h->d.timeout_ms = 30000;
    h->L = d->local ? d->local->size : 1;
    h->lr = d->local ? d->local->rank : 0;
    h->shard = (d->count + (size_t)h->L - 1) / (size_t)h->L;
    h->np = (h->shard + h->d.piece - 1) / h->d.piece;
    kvps_gpu__dev g = {-1, -1};
    if (d->local && (rc = kvps_gpu__dev_enter(&g, d->local->device)) != KVPS_OK) { free(h); return rc; }
    h->ev = (void **)calloc(h->np, sizeof *h->ev);
    h->t = (kvps_tensor *)calloc(h->np, sizeof *h->t);
    h->req = (uint64_t *)calloc(h->np, sizeof *h->req);
    if (!h->ev || !h->t || !h->req) rc = KVPS_ERR_NOMEM;
    if (rc == KVPS_OK && (d->local || h->d.scale != 1.0f)) rc = ops->alloc_dev((void **)&h->d_shard, h->shard * 4);
    if (rc == KVPS_OK && d->local && h->shard * (size_t)h->L != d->count)
        rc = ops->alloc_dev((void **)&h->d_pad, h->shard * (size_t)h->L * 4);
    if (rc == KVPS_OK) rc = ops->alloc_host((void **)&h->h_send, h->shard * 4);
    if (rc == KVPS_OK) rc = ops->alloc_host((void **)&h->h_recv, h->shard * 4);
    for (size_t p = 0; p < h->np && rc == KVPS_OK; p++) rc = ops->event_create(&h->ev[p]);
    if (rc == KVPS_OK) rc = ops->event_create(&h->done);
    /* one tensor per piece, so each is pushed as soon as it has landed */
    for (size_t p = 0; p < h->np && rc == KVPS_OK && d->worker; p++) {
        char nm[512];
        snprintf(nm, sizeof nm, "%s.%d.%zu", d->name, h->lr, p);
        rc = kvps_worker_tensor(d->worker, nm, kvps_gpu__piece_len(h, p), &h->t[p]);
        if (rc != KVPS_OK)
            kvps_gpu__seterr("kvps_gpu_hier_create: tensor '%s': %s (%s)", nm, kvps_result_str(rc),
                             kvps_worker_last_error(d->worker));
    }
    if (d->local) kvps_gpu__dev_leave(&g);
    if (rc != KVPS_OK) {
        kvps_gpu__hier_free(h);
        return rc;
    }
    *out = h;
    return KVPS_OK;
}

KVPS_API kvps_result kvps_gpu_hier_create(const kvps_gpu_hier_desc *d, kvps_gpu_hier **out) {
    return kvps_gpu__hier_create_ops(d, &kvps_gpu__cuda_ops, out);
}

static kvps_result kvps_gpu__net_start(kvps_gpu_hier *h, size_t p) {
    size_t off = p * h->d.piece, len = kvps_gpu__piece_len(h, p);
    if (h->d.worker)
        return kvps_worker_pushpull_tensor(h->d.worker, h->t[p], h->h_send + off, h->h_recv + off, &h->req[p]);
    kvps_ring_op op;
    memset(&op, 0, sizeof op);
    op.coll = KVPS_COLL_ALLREDUCE;
    op.send = h->h_send + off;
    op.recv = h->h_recv + off;
    op.count = len;
    op.dtype = KVPS_FLOAT32;
    op.op = h->d.op;
    return kvps_ring_post(h->d.ring, &op, &h->req[p]);
}
static kvps_result kvps_gpu__net_test(kvps_gpu_hier *h, size_t p, int *done) {
    return h->d.worker ? kvps_worker_test(h->d.worker, h->req[p], done) : kvps_ring_test(h->d.ring, h->req[p], done);
}
static kvps_result kvps_gpu__net_wait(kvps_gpu_hier *h, size_t p, int timeout_ms) {
    return h->d.worker ? kvps_worker_wait(h->d.worker, h->req[p], timeout_ms)
                       : kvps_ring_wait(h->d.ring, h->req[p], timeout_ms);
}
static const char *kvps_gpu__net_error(const kvps_gpu_hier *h) {
    return h->d.worker ? kvps_worker_last_error(h->d.worker) : kvps_ring_last_error(h->d.ring);
}

/* Where a step has got to: pieces sent and answered, the piece whose request failed
   ((size_t)-1: none), and the stage an error is reported in. */
typedef struct kvps_gpu__progress {
    size_t issued, landed, failed;
    const char *stage;
} kvps_gpu__progress;

/* Step 3: send each piece as it lands; copy each answer back into res as it arrives (in order,
   so that the copies back queue behind each other on the stream). */
static kvps_result kvps_gpu__hier_pipeline(kvps_gpu_hier *h, float *res, kvps_gpu_stream s, kvps_gpu__progress *g) {
    const kvps_gpu__ops *o = h->ops;
    kvps_gpu_comm *lc = h->d.local;
    kvps_result rc = KVPS_OK;
    int64_t deadline = kvps_gpu__now_ms() + h->d.timeout_ms;
    int spins = 0;
    while (rc == KVPS_OK && g->landed < h->np) {
        int progress = 0, done = 0;
        if (g->issued < h->np) {
            rc = o->event_query(h->ev[g->issued], &done);
            if (rc != KVPS_OK) { g->stage = "copy to host"; break; }
            if (done) {
                rc = kvps_gpu__net_start(h, g->issued);
                if (rc != KVPS_OK) { g->failed = g->issued; break; } /* refused as it was sent */
                g->issued++;
                progress = 1;
            }
        }
        if (g->landed < g->issued) {
            if (g->issued == h->np) { /* all sent: block on the oldest answer */
                rc = kvps_gpu__net_wait(h, g->landed, (int)(deadline - kvps_gpu__now_ms() > 0 ? deadline - kvps_gpu__now_ms() : 0));
                done = rc != KVPS_ERR_TIMEOUT;
            } else {
                rc = kvps_gpu__net_test(h, g->landed, &done);
            }
            if (done) {
                if (rc != KVPS_OK) { g->failed = g->landed++; break; } /* that request has ended */
                size_t off = g->landed * h->d.piece;
                rc = o->copy(res + off, h->h_recv + off, kvps_gpu__piece_len(h, g->landed) * 4, s);
                g->landed++;
                progress = 1;
                if (rc != KVPS_OK) { g->stage = "copy to device"; break; }
            } else if (rc != KVPS_OK && rc != KVPS_ERR_TIMEOUT) {
                break;
            }
            if (rc == KVPS_ERR_TIMEOUT) break;
        }
        if (progress) { deadline = kvps_gpu__now_ms() + h->d.timeout_ms; spins = 0; continue; }
        if (lc && (rc = kvps_gpu_comm_check(lc)) != KVPS_OK) { g->stage = "reduce-scatter"; break; }
        if (kvps_gpu__now_ms() > deadline) {
            rc = KVPS_ERR_TIMEOUT;
            if (g->issued < h->np) { /* the device never got there: the reduce-scatter hangs */
                g->stage = "reduce-scatter / copy to host";
                if (lc) kvps_gpu_comm_abort(lc);
            }
            break;
        }
        kvps_gpu__pause(&spins);
    }
    return rc;
}

KVPS_API kvps_result kvps_gpu_hier_step(kvps_gpu_hier *h, const float *d_grad, float *d_out, kvps_gpu_stream s) {
    if (!h || !d_grad || !d_out) return KVPS_ERR_INVALID_ARG;
    if (h->broken) {
        kvps_gpu__seterr("kvps_gpu_hier_step: broken by an earlier failure (%s)", h->err);
        return KVPS_ERR_STATE;
    }
    const kvps_gpu__ops *o = h->ops;
    kvps_gpu_comm *lc = h->d.local;
    kvps_gpu__dev g = {-1, -1};
    kvps_result rc = lc ? kvps_gpu__dev_enter(&g, lc->device) : KVPS_OK;
    if (rc != KVPS_OK) return rc;
    kvps_gpu__progress pg = {0, 0, (size_t)-1, "reduce-scatter"};
    /* the last step's copies back read the pinned buffers this step refills: order after them
       even when this step runs on another stream */
    if (h->stepped && (rc = o->event_wait(h->done, s)) != KVPS_OK) pg.stage = "wait for the last step";
    /* 1. this GPU's shard of the machine's sum, scaled */
    const float *src = d_grad;
    float *res = d_out;
    if (rc != KVPS_OK) {
        /* nothing enqueued */
    } else if (lc) {
        const float *in = d_grad;
        if (h->d_pad) {
            rc = o->copy(h->d_pad, d_grad, h->d.count * 4, s);
            if (rc == KVPS_OK) rc = o->zero(h->d_pad + h->d.count, (h->shard * (size_t)h->L - h->d.count) * 4, s);
            in = h->d_pad;
        }
        if (rc == KVPS_OK) rc = kvps_gpu_reduce_scatter(lc, in, h->d_shard, h->shard, KVPS_FLOAT32, KVPS_SUM, s);
        if (rc == KVPS_OK && h->d.scale != 1.0f) rc = o->scale(h->d_shard, h->d_shard, h->d.scale, h->shard, s);
        src = res = h->d_shard;
    } else if (h->d.scale != 1.0f) {
        rc = o->scale(h->d_shard, d_grad, h->d.scale, h->shard, s);
        src = h->d_shard;
    }
    /* 2. every piece to pinned memory, each with an event to say it has landed */
    if (rc == KVPS_OK) pg.stage = "copy to host";
    for (size_t p = 0; p < h->np && rc == KVPS_OK; p++) {
        size_t off = p * h->d.piece;
        rc = o->copy(h->h_send + off, src + off, kvps_gpu__piece_len(h, p) * 4, s);
        if (rc == KVPS_OK) rc = o->event_record(h->ev[p], s);
    }
    /* 3. through the servers or the ring, piece by piece, and back */
    if (rc == KVPS_OK) {
        pg.stage = "network";
        rc = kvps_gpu__hier_pipeline(h, res, s, &pg);
    }
    /* 4. the machine's result from every shard */
    if (rc == KVPS_OK && lc) {
        pg.stage = "all-gather";
        rc = kvps_gpu_allgather(lc, h->d_shard, h->d_pad ? h->d_pad : d_out, h->shard, KVPS_FLOAT32, s);
        if (rc == KVPS_OK && h->d_pad) rc = o->copy(d_out, h->d_pad, h->d.count * 4, s);
    }
    if (rc == KVPS_OK) {
        pg.stage = "copy to device";
        rc = o->event_record(h->done, s);
        h->stepped = 1;
    }
    if (rc != KVPS_OK) {
        int net = strcmp(pg.stage, "network") == 0;
        size_t piece = pg.failed != (size_t)-1 ? pg.failed : net && pg.landed < pg.issued ? pg.landed : pg.issued;
        kvps_gpu__hier_err(h, "kvps_gpu_hier_step: %s, piece %zu of %zu: %s (%.380s)", pg.stage, piece, h->np,
                           kvps_result_str(rc), net ? kvps_gpu__net_error(h) : kvps_gpu__err);
        h->broken = 1;
        /* requests that ended already are harmless; any still running keep the buffers */
        for (size_t p = pg.landed; p < pg.issued; p++)
            if (kvps_gpu__net_wait(h, p, 0) == KVPS_ERR_TIMEOUT) h->inflight = 1;
    }
    if (lc) kvps_gpu__dev_leave(&g);
    return rc;
}

KVPS_API size_t kvps_gpu_hier_tensors(const kvps_gpu_hier *h, const kvps_tensor **tensors) {
    if (tensors) *tensors = h && h->d.worker ? h->t : NULL;
    return h && h->d.worker ? h->np : 0;
}
KVPS_API const char *kvps_gpu_hier_last_error(const kvps_gpu_hier *h) { return h ? h->err : ""; }

KVPS_API void kvps_gpu_hier_destroy(kvps_gpu_hier **hp) {
    if (!hp || !*hp) return;
    kvps_gpu_hier *h = *hp;
    *hp = NULL;
    kvps_gpu__dev g = {-1, -1};
    int entered = h->d.local && kvps_gpu__dev_enter(&g, h->d.local->device) == KVPS_OK;
    kvps_gpu__hier_free(h);
    if (entered) kvps_gpu__dev_leave(&g);
}

// >>host-twin
/* kvps_gpu_topk's algorithm run sequentially on the host, with the same pick and slot functions. */
KVPS_API kvps_result kvps_gpu__topk_host(const float *x, float *r, size_t n, size_t k, uint32_t *idx, float *val) {
    if ((n && !x) || (k && (!idx || !val)) || k > n || n > UINT32_MAX) return KVPS_ERR_INVALID_ARG;
    if (n == 0) return KVPS_OK;
    if (k == 0) {
        if (r) for (size_t i = 0; i < n; i++) r[i] = x[i] + r[i];
        return KVPS_OK;
    }
    unsigned *hist = (unsigned *)calloc(2048, sizeof *hist);
    if (!hist) return KVPS_ERR_NOMEM;
    const float *src = r ? r : x;
    unsigned prefix = 0, pmask = 0;
    unsigned long long krem = k;
    for (int pass = 0; pass < 3; pass++) {
        int shift;
        unsigned width;
        kvps_gpu__pass(pass, &shift, &width);
        memset(hist, 0, 2048 * sizeof *hist);
        for (size_t i = 0; i < n; i++) {
            float v;
            if (pass == 0 && r) { v = x[i] + r[i]; r[i] = v; }
            else v = src[i];
            uint32_t key = kvps_el_mag(v);
            if ((key & pmask) == prefix) hist[(key >> shift) & (width - 1)]++;
        }
        unsigned b = kvps_gpu__radix_pick(hist, width, &krem);
        prefix |= b << shift;
        pmask |= (width - 1) << shift;
    }
    free(hist);
    unsigned long long gt = 0, eq = 0;
    size_t got = 0;
    for (size_t i = 0; i < n; i++) {
        float v = src[i];
        long long sl = kvps_gpu__slot(kvps_el_mag(v), prefix, krem, &gt, &eq);
        if (sl < 0) continue;
        if ((size_t)sl >= k) return KVPS_ERR_STATE; /* would be an out-of-bounds write on the device */
        idx[sl] = (uint32_t)i;
        val[sl] = v;
        if (r) r[i] = 0.0f;
        got++;
    }
    return got == k ? KVPS_OK : KVPS_ERR_STATE;
}

/* The device decoder's verdict on a blob (header checks, then every top-k index), on the host. */
KVPS_API kvps_result kvps_gpu__verdict_host(const void *blob, size_t bytes, int id, size_t n) {
    const unsigned char *p = (const unsigned char *)blob;
    int v = kvps_el_blob_verdict(p, bytes, id, n);
    if (v == KVPS_OK && id == KVPS_CODEC_TOPK)
        for (size_t j = 0, k = kvps_gpu__word(p); j < k; j++)
            if (!kvps_gpu__index_ok(p, j, n)) return KVPS_ERR_MALFORMED;
    return (kvps_result)v;
}

/* The sign encoder as the fused kernel does it (8 lanes a chunk, lane j summing elements j,
   j + 8, ...; the combine and division of kvps_gpu__sign_scale), on the host. */
KVPS_API void kvps_gpu__sign_host(const float *x, float *r, size_t n, uint32_t ch, float *scales, unsigned char *bits) {
    size_t nc = (n + ch - 1) / ch;
    memset(bits, 0, (n + 7) / 8);
    for (size_t c = 0; c < nc; c++) {
        size_t b = c * ch, m = n - b < ch ? n - b : ch;
        float part[8];
        for (unsigned j = 0; j < 8; j++) part[j] = kvps_gpu__lane_sum(x, r, b, m, j);
        float sc = kvps_gpu__sign_scale(part, m);
        scales[c] = sc;
        for (size_t i = 0; i < m; i++) {
            float a = r ? r[b + i] : x[b + i];
            uint32_t u;
            memcpy(&u, &a, 4);
            if (u >> 31) bits[(b + i) >> 3] |= (unsigned char)(1u << ((b + i) & 7));
            if (r) r[b + i] = a - ((u >> 31) ? -sc : sc);
        }
    }
}

#endif /* KVPS_GPU__IMPLEMENTED */
#endif /* KVPS_GPU_IMPLEMENTATION */
