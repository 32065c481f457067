/* bench_gpu - kvps_gpu.h on this machine's GPUs, every figure next to its peer from the same run.
     1. all-reduce (float32, sum) over all visible GPUs, one thread driving them with group
        calls: through kvps_gpu_allreduce next to raw ncclAllReduce on the same communicators,
        nccl-tests style (size, count, type, time, algbw, busbw), and the ratio;
     2. the kernels: GB/s of memory traffic (bytes read + written) next to a device-to-device
        cudaMemcpy of the same number of bytes, and the ratio;
     3. the hierarchical step on device 0 alone (kvps_gpu_hier_step through a kvps server in this
        process over inproc://, 1 Mi-float pieces) for 1 Mi floats and ResNet-50's 25 557 032, next
        to its two parts measured alone: the copies (pinned device -> host -> device, cudaMemcpy)
        and one pushpull of the same floats from pinned memory; their sum is what a step without
        overlap would take.
   usage: bench_gpu [max_bytes (default 256 MiB)] [iterations (default 20)]
   Without a CUDA device it says so and exits 0. */
#include "kvps.h"
#include "kvps_ring.h"
#include "kvps_gpu.h"
#include <cuda_runtime.h>
#include <nccl.h>
#include <zmq.h>
#include "bench/bench_cpu.h" /* bench_machine */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


#define DIE_IF(cond, ...) do { if (cond) { fprintf(stderr, "bench_gpu: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } } while (0)
#define CUDA_OK(call) do { cudaError_t e_ = (call); DIE_IF(e_ != cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_)); } while (0)

/* raw NCCL with a non-blocking communicator: poll until the group has been launched */
static void nccl_settle(ncclComm_t c) {
    ncclResult_t st = ncclInProgress;
    while (st == ncclInProgress) DIE_IF(ncclCommGetAsyncError(c, &st) != ncclSuccess, "ncclCommGetAsyncError");
    DIE_IF(st != ncclSuccess, "nccl: %s", ncclGetErrorString(st));
}

static int n;
static kvps_gpu_comm *comms[16];
static float *d_buf[16];
static cudaStream_t streams[16];

static void sync_all(void) {
    for (int i = 0; i < n; i++) {
        CUDA_OK(cudaSetDevice(i));
        CUDA_OK(cudaStreamSynchronize(streams[i]));
    }
}

/* one all-reduce of every GPU's buffer, launched together (one thread drives all GPUs) */
static void one_round(int raw, size_t count) {
    if (raw) {
        DIE_IF(ncclGroupStart() != ncclSuccess, "ncclGroupStart");
        for (int i = 0; i < n; i++) {
            ncclResult_t r = ncclAllReduce(d_buf[i], d_buf[i], count, ncclFloat32, ncclSum,
                                           (ncclComm_t)kvps_gpu_comm_nccl(comms[i]), streams[i]);
            DIE_IF(r != ncclSuccess && r != ncclInProgress, "ncclAllReduce: %s", ncclGetErrorString(r));
        }
        ncclResult_t r = ncclGroupEnd();
        DIE_IF(r != ncclSuccess && r != ncclInProgress, "ncclGroupEnd: %s", ncclGetErrorString(r));
        for (int i = 0; i < n; i++) nccl_settle((ncclComm_t)kvps_gpu_comm_nccl(comms[i]));
    } else {
        DIE_IF(kvps_gpu_group_start() != KVPS_OK, "kvps_gpu_group_start: %s", kvps_gpu_last_error());
        for (int i = 0; i < n; i++)
            DIE_IF(kvps_gpu_allreduce(comms[i], d_buf[i], d_buf[i], count, KVPS_FLOAT32, KVPS_SUM, streams[i]) != KVPS_OK,
                   "kvps_gpu_allreduce: %s", kvps_gpu_last_error());
        DIE_IF(kvps_gpu_group_end(comms, n) != KVPS_OK, "kvps_gpu_group_end: %s", kvps_gpu_last_error());
    }
}

/* seconds per round, after two warm-up rounds */
static double time_allreduce(int raw, size_t count, int iters) {
    one_round(raw, count);
    one_round(raw, count);
    sync_all();
    double t0 = now_s();
    for (int it = 0; it < iters; it++) one_round(raw, count);
    sync_all();
    return (now_s() - t0) / iters;
}

/* seconds per call of fn over iters calls on stream 0 of device 0 */
typedef kvps_result (*kernel_fn)(void *ctx);
static double time_kernel(kernel_fn fn, void *ctx, int iters) {
    DIE_IF(fn(ctx) != KVPS_OK, "warm-up: %s", kvps_gpu_last_error());
    CUDA_OK(cudaStreamSynchronize(streams[0]));
    double t0 = now_s();
    for (int i = 0; i < iters; i++) DIE_IF(fn(ctx) != KVPS_OK, "kernel: %s", kvps_gpu_last_error());
    CUDA_OK(cudaStreamSynchronize(streams[0]));
    return (now_s() - t0) / iters;
}

typedef struct kctx {
    size_t n;
    float *x, *r, *y;
    uint16_t *h;
    uint32_t *idx;
    void *blob;
    size_t cap;
    kvps_codec codec;
} kctx;
static kvps_result k_memcpy(void *p) {
    kctx *k = (kctx *)p; /* n floats read and written: 8n bytes, as the sum's 12n below is counted */
    return cudaMemcpyAsync(k->y, k->x, k->n * 4, cudaMemcpyDeviceToDevice, streams[0]) == cudaSuccess ? KVPS_OK : KVPS_ERR_GPU;
}
static kvps_result k_pack(void *p) { kctx *k = (kctx *)p; return kvps_gpu_pack(k->h, k->x, NULL, k->n, KVPS_FLOAT16, streams[0]); }
static kvps_result k_pack_ef(void *p) { kctx *k = (kctx *)p; return kvps_gpu_pack(k->h, k->x, k->r, k->n, KVPS_BFLOAT16, streams[0]); }
static kvps_result k_unpack(void *p) { kctx *k = (kctx *)p; return kvps_gpu_unpack(k->y, k->h, k->n, KVPS_FLOAT16, 0, streams[0]); }
static kvps_result k_sum(void *p) { kctx *k = (kctx *)p; return kvps_gpu_sum(k->y, k->x, k->n, KVPS_FLOAT32, streams[0]); }
static kvps_result k_scale(void *p) { kctx *k = (kctx *)p; return kvps_gpu_scale(k->y, k->x, 0.5f, k->n, KVPS_FLOAT32, streams[0]); }
static kvps_result k_encode(void *p) {
    kctx *k = (kctx *)p;
    size_t b;
    return kvps_gpu_encode(&k->codec, k->x, k->n, k->r, k->blob, k->cap, &b, streams[0]);
}

/* 3. the hierarchical step against its parts; milliseconds, best of iters after a warm-up */
static double ms_since(double t0) { return (now_s() - t0) * 1e3; }
static void bench_hier(int iters) {
    void *ctx = zmq_ctx_new();
    kvps_server_desc sd;
    memset(&sd, 0, sizeof sd);
    sd.endpoint = "inproc://bench-gpu-hier";
    sd.num_workers = 1;
    sd.zmq_ctx = ctx;
    sd.keep_serving = 1;
    kvps_server *srv = NULL;
    DIE_IF(kvps_server_create(&sd, &srv) != KVPS_OK || kvps_server_start(srv) != KVPS_OK, "kvps server");
    kvps_worker_desc wd;
    memset(&wd, 0, sizeof wd);
    wd.servers = kvps_server_endpoint(srv);
    wd.num_workers = 1;
    wd.zmq_ctx = ctx;
    kvps_worker *w = NULL;
    DIE_IF(kvps_worker_create(&wd, &w) != KVPS_OK, "kvps worker");
    printf("# hierarchical step, device 0 alone, kvps server in this process (inproc), 1 Mi-float pieces; ms, best of %d\n", iters);
    printf("# %10s %9s | %9s | %9s %9s %9s | %11s\n", "floats", "MB", "step", "copies", "pushpull", "sum", "sum/step");
    const size_t counts[] = {(size_t)1 << 20, 25557032};
    for (int ci = 0; ci < 2; ci++) {
        size_t count = counts[ci], bytes = count * 4;
        char name[32];
        snprintf(name, sizeof name, "bench%d", ci);
        kvps_gpu_hier_desc hd;
        memset(&hd, 0, sizeof hd);
        hd.worker = w;
        hd.name = name;
        hd.count = count;
        kvps_gpu_hier *h = NULL;
        DIE_IF(kvps_gpu_hier_create(&hd, &h) != KVPS_OK, "kvps_gpu_hier_create: %s", kvps_gpu_last_error());
        float *d_g = NULL, *h_a = NULL, *h_b = NULL;
        CUDA_OK(cudaMalloc((void **)&d_g, bytes));
        CUDA_OK(cudaMemset(d_g, 0, bytes));
        CUDA_OK(cudaMallocHost((void **)&h_a, bytes));
        CUDA_OK(cudaMallocHost((void **)&h_b, bytes));
        memset(h_a, 0, bytes);
        kvps_tensor t;
        snprintf(name, sizeof name, "plain%d", ci);
        DIE_IF(kvps_worker_tensor(w, name, count, &t) != KVPS_OK, "kvps_worker_tensor: %s", kvps_worker_last_error(w));
        double best_step = 1e30, best_copy = 1e30, best_pp = 1e30;
        for (int it = -1; it < iters; it++) { /* it -1: warm-up, not counted */
            double t0 = now_s();
            DIE_IF(kvps_gpu_hier_step(h, d_g, d_g, streams[0]) != KVPS_OK, "kvps_gpu_hier_step: %s", kvps_gpu_hier_last_error(h));
            CUDA_OK(cudaStreamSynchronize(streams[0]));
            double ts = ms_since(t0);
            t0 = now_s();
            CUDA_OK(cudaMemcpyAsync(h_a, d_g, bytes, cudaMemcpyDeviceToHost, streams[0]));
            CUDA_OK(cudaMemcpyAsync(d_g, h_a, bytes, cudaMemcpyHostToDevice, streams[0]));
            CUDA_OK(cudaStreamSynchronize(streams[0]));
            double tc = ms_since(t0);
            kvps_req q;
            t0 = now_s();
            DIE_IF(kvps_worker_pushpull_tensor(w, t, h_a, h_b, &q) != KVPS_OK || kvps_worker_wait(w, q, 60000) != KVPS_OK,
                   "pushpull: %s", kvps_worker_last_error(w));
            double tp = ms_since(t0);
            if (it >= 0) {
                best_step = ts < best_step ? ts : best_step;
                best_copy = tc < best_copy ? tc : best_copy;
                best_pp = tp < best_pp ? tp : best_pp;
            }
        }
        printf("  %10zu %9.1f | %9.3f | %9.3f %9.3f %9.3f | %11.2f\n", count, bytes / 1e6, best_step, best_copy, best_pp,
               best_copy + best_pp, (best_copy + best_pp) / best_step);
        kvps_gpu_hier_destroy(&h);
        cudaFree(d_g);
        cudaFreeHost(h_a);
        cudaFreeHost(h_b);
    }
    kvps_worker_destroy(&w);
    kvps_server_destroy(&srv);
    zmq_ctx_term(ctx);
}

int main(int argc, char **argv) {
    size_t max_bytes = (size_t)256 << 20;
    int iters = 20;
    if (argc > 3 || (argc > 1 && (max_bytes = strtoull(argv[1], NULL, 0)) < 8) || (argc > 2 && (iters = atoi(argv[2])) < 1)) {
        fprintf(stderr, "usage: bench_gpu [max_bytes (default 268435456)] [iterations (default 20)]\n");
        return 2;
    }
    if (kvps_gpu_device_count(&n) != KVPS_OK) {
        printf("bench_gpu: no CUDA device (%s); nothing to measure\n", kvps_gpu_last_error());
        return 0;
    }
    if (n > 16) n = 16;
    kvps_log_set_level(KVPS_LOG_WARN);
    DIE_IF(kvps_gpu_comm_create_local(NULL, n, 60000, comms) != KVPS_OK, "create_local: %s", kvps_gpu_last_error());
    for (int i = 0; i < n; i++) {
        CUDA_OK(cudaSetDevice(i));
        CUDA_OK(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
        CUDA_OK(cudaMalloc((void **)&d_buf[i], max_bytes));
        CUDA_OK(cudaMemset(d_buf[i], 0, max_bytes));
    }
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    bench_machine(stdout, kvps_isa_set(KVPS_ISA_AUTO));
    int nv = 0; /* the NCCL that runs (the box's), not the headers' it was built with */
    if (ncclGetVersion(&nv) != ncclSuccess) nv = 0;
    printf("# bench_gpu: %d x %s, NCCL %d.%d.%d (built with %d.%d.%d headers), %d iterations\n", n, prop.name, nv / 10000,
           nv / 100 % 100, nv % 100, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, iters);
    printf("# all-reduce float32 sum, in place, %d ranks (busbw = algbw * 2(n-1)/n)\n", n);
    printf("# %12s %12s %6s | %10s %8s %8s | %10s %8s %8s | %9s\n", "size", "count", "type", "kvps(us)", "algbw", "busbw",
           "nccl(us)", "algbw", "busbw", "kvps/nccl");
    for (size_t bytes = 8; bytes <= max_bytes; bytes *= 4) {
        size_t count = bytes / 4;
        double tk = time_allreduce(0, count, iters), tn = time_allreduce(1, count, iters);
        double f = n > 1 ? 2.0 * (n - 1) / n : 0.0;
        double ak = (double)bytes / tk / 1e9, an = (double)bytes / tn / 1e9;
        printf("  %12zu %12zu %6s | %10.1f %8.2f %8.2f | %10.1f %8.2f %8.2f | %9.3f\n", bytes, count, "float", tk * 1e6, ak,
               ak * f, tn * 1e6, an, an * f, tn / tk);
    }

    /* kernels on device 0 */
    CUDA_OK(cudaSetDevice(0));
    kctx k;
    memset(&k, 0, sizeof k);
    k.n = max_bytes / 4;
    k.x = d_buf[0];
    CUDA_OK(cudaMalloc((void **)&k.r, k.n * 4));
    CUDA_OK(cudaMalloc((void **)&k.y, k.n * 4));
    CUDA_OK(cudaMalloc((void **)&k.h, k.n * 2));
    CUDA_OK(cudaMemset(k.r, 0, k.n * 4));
    for (int id = KVPS_CODEC_FP16; id <= KVPS_CODEC_SIGN; id++) { /* room for the largest blob */
        kvps_codec c = kvps_codec_get((kvps_codec_id)id);
        if (kvps_gpu_codec_bytes(&c, k.n) > k.cap) k.cap = kvps_gpu_codec_bytes(&c, k.n);
    }
    CUDA_OK(cudaMalloc(&k.blob, k.cap));
    /* non-trivial data for top-k and sign: a ramp of mixed signs */
    {
        float *h = (float *)malloc(k.n * 4);
        DIE_IF(!h, "malloc");
        for (size_t i = 0; i < k.n; i++) h[i] = (float)((long)((i * 2654435761u) % 2001) - 1000) * 1e-3f;
        CUDA_OK(cudaMemcpy(k.x, h, k.n * 4, cudaMemcpyHostToDevice));
        free(h);
    }
    double tm = time_kernel(k_memcpy, &k, iters), mem_gbs = 8.0 * (double)k.n / tm / 1e9;
    printf("# kernels on device 0, n = %zu floats; GB/s = bytes read + written per second; peer: cudaMemcpy D2D %.1f GB/s\n",
           k.n, mem_gbs);
    struct { const char *name; kernel_fn fn; double bytes_per_elem; kvps_codec_id codec; } ks[] = {
        {"pack fp16", k_pack, 6, KVPS_CODEC_NONE},
        {"pack bf16 + residual", k_pack_ef, 14, KVPS_CODEC_NONE},
        {"unpack fp16", k_unpack, 6, KVPS_CODEC_NONE},
        {"sum float32", k_sum, 12, KVPS_CODEC_NONE},
        {"scale float32", k_scale, 8, KVPS_CODEC_NONE},
        {"encode topk 1% + residual", k_encode, 0, KVPS_CODEC_TOPK},
        {"encode sign + residual", k_encode, 0, KVPS_CODEC_SIGN},
        {"encode fp16 + residual", k_encode, 14, KVPS_CODEC_FP16},
    };
    printf("# %-28s %12s %10s %10s\n", "kernel", "time(us)", "GB/s", "vs memcpy");
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) {
        if (ks[i].codec != KVPS_CODEC_NONE) k.codec = kvps_codec_get(ks[i].codec);
        double t = time_kernel(ks[i].fn, &k, iters);
        /* top-k: 5 passes over x + r (first reads both and writes r); sign: 3 (x, r read, r written twice) */
        double bpe = ks[i].bytes_per_elem ? ks[i].bytes_per_elem : ks[i].codec == KVPS_CODEC_TOPK ? 4.0 * 7 : 4.0 * 5;
        double gbs = bpe * (double)k.n / t / 1e9;
        printf("  %-28s %12.1f %10.1f %10.3f\n", ks[i].name, t * 1e6, gbs, gbs / mem_gbs);
    }
    bench_hier(iters < 5 ? iters : 5);
    for (int i = 0; i < n; i++) {
        cudaSetDevice(i);
        cudaFree(d_buf[i]);
        cudaStreamDestroy(streams[i]);
        kvps_gpu_comm_destroy(&comms[i]);
    }
    cudaSetDevice(0);
    cudaFree(k.r); cudaFree(k.y); cudaFree(k.h); cudaFree(k.blob);
    return 0;
}
