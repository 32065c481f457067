/* test_gpu_host - what of kvps_gpu.h can be checked without a GPU, on every machine: the
   CUDA/NCCL -> kvps result mapping and messages, argument checks (made before the device is
   touched), KVPS_ERR_NO_DEVICE where there is none, the codec sizes against kvps.h, the top-k
   algorithm of the kernels (run on the host with the kernels' own pick and slot functions)
   against kvps_topk, the NCCL id broadcast over kvps_ring, and the hierarchical step's host
   pipeline with host memory standing in for the device (kvps servers, kvps rings, errors). */
#define KVPS_IMPLEMENTATION
#define KVPS_GPU_INTERNAL
#include "kvps.h"
#include "kvps_ring.h"
#include "kvps_gpu.h"
#include "tests/kvps_test.h"
#include "tests/gpu/decode_cases.h"
#include "tests/gpu/emu_ops.h"
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <math.h>

static int have_device(void) {
    int n = 0;
    return kvps_gpu_device_count(&n) == KVPS_OK && n > 0;
}

static void test_result_mapping(void) {
    static const struct { const char *name; int code; kvps_result want; } cuda[] = {
        {"cudaSuccess", cudaSuccess, KVPS_OK},
        {"cudaErrorMemoryAllocation", cudaErrorMemoryAllocation, KVPS_ERR_NOMEM},
        {"cudaErrorNoDevice", cudaErrorNoDevice, KVPS_ERR_NO_DEVICE},
        {"cudaErrorInsufficientDriver", cudaErrorInsufficientDriver, KVPS_ERR_NO_DEVICE},
        {"cudaErrorStubLibrary", cudaErrorStubLibrary, KVPS_ERR_NO_DEVICE},
        {"cudaErrorDevicesUnavailable", cudaErrorDevicesUnavailable, KVPS_ERR_NO_DEVICE},
        {"cudaErrorInvalidValue", cudaErrorInvalidValue, KVPS_ERR_GPU},
        {"cudaErrorIllegalAddress", cudaErrorIllegalAddress, KVPS_ERR_GPU},
        {"cudaErrorLaunchFailure", cudaErrorLaunchFailure, KVPS_ERR_GPU},
    };
    static const struct { const char *name; int code; kvps_result want; } nccl[] = {
        {"ncclSuccess", ncclSuccess, KVPS_OK},
        {"ncclUnhandledCudaError", ncclUnhandledCudaError, KVPS_ERR_GPU},
        {"ncclSystemError", ncclSystemError, KVPS_ERR_GPU},
        {"ncclInternalError", ncclInternalError, KVPS_ERR_GPU},
        {"ncclInvalidArgument", ncclInvalidArgument, KVPS_ERR_INVALID_ARG},
        {"ncclInvalidUsage", ncclInvalidUsage, KVPS_ERR_STATE},
        {"ncclRemoteError", ncclRemoteError, KVPS_ERR_PEER},
        {"ncclInProgress", ncclInProgress, KVPS_ERR_STATE},
    };
    for (size_t i = 0; i < sizeof cuda / sizeof *cuda; i++)
        KT_CHECK(kvps_gpu_result_from_cuda(cuda[i].code) == cuda[i].want, "%s -> %s", cuda[i].name,
                 kvps_result_str(kvps_gpu_result_from_cuda(cuda[i].code)));
    for (size_t i = 0; i < sizeof nccl / sizeof *nccl; i++)
        KT_CHECK(kvps_gpu_result_from_nccl(nccl[i].code) == nccl[i].want, "%s -> %s", nccl[i].name,
                 kvps_result_str(kvps_gpu_result_from_nccl(nccl[i].code)));
    /* the GPU band of kvps.h */
    KT_CHECK(KVPS_ERR_GPU <= -400 && KVPS_ERR_NO_DEVICE <= -400, "GPU results in the -400 band");
}

static void test_device_count(void) {
    int n = -1;
    kvps_result r = kvps_gpu_device_count(&n);
    KT_CHECK(kvps_gpu_device_count(NULL) == KVPS_ERR_INVALID_ARG, "NULL count");
    if (r == KVPS_OK) {
        KT_CHECK(n > 0, "count %d", n);
    } else {
        KT_CHECK(r == KVPS_ERR_NO_DEVICE && n == 0, "%s, count %d", kvps_result_str(r), n);
        /* the library's own reason, named */
        KT_CHECK(strncmp(kvps_gpu_last_error(), "cudaGetDeviceCount", 18) == 0, "message '%s'", kvps_gpu_last_error());
        /* asking again gives the same answer (the failure is not cached as something else) */
        KT_CHECK(kvps_gpu_device_count(&n) == KVPS_ERR_NO_DEVICE, "second call");
    }
}

/* Every argument error is found before the device is touched, so these hold with or without one.
   Pointers are never dereferenced: the calls must return first. */
static void test_argument_checks(void) {
    float *fx = (float *)(uintptr_t)0x10000;
    uint16_t *hx = (uint16_t *)(uintptr_t)0x20000;
    uint32_t *ix = (uint32_t *)(uintptr_t)0x30000;
    void *blob = (void *)(uintptr_t)0x40000, *odd = (void *)(uintptr_t)0x40002;
    kvps_codec top = kvps_codec_get(KVPS_CODEC_TOPK), user = kvps_codec_get(KVPS_CODEC_FP16);
    user.id = KVPS_CODEC_USER;
    size_t ob = 0;
    kvps_gpu_comm *c = NULL;
    kvps_gpu_hier *h = NULL;
    struct { const char *name; kvps_result got, want; } t[] = {
        {"pack wire float32", kvps_gpu_pack(hx, fx, NULL, 4, KVPS_FLOAT32, NULL), KVPS_ERR_INVALID_ARG},
        {"pack NULL out", kvps_gpu_pack(NULL, fx, NULL, 4, KVPS_FLOAT16, NULL), KVPS_ERR_INVALID_ARG},
        {"pack NULL x", kvps_gpu_pack(hx, NULL, NULL, 4, KVPS_BFLOAT16, NULL), KVPS_ERR_INVALID_ARG},
        {"unpack accumulate 2", kvps_gpu_unpack(fx, hx, 4, KVPS_FLOAT16, 2, NULL), KVPS_ERR_INVALID_ARG},
        {"unpack wire int32", kvps_gpu_unpack(fx, hx, 4, KVPS_INT32, 0, NULL), KVPS_ERR_INVALID_ARG},
        {"topk k > n", kvps_gpu_topk(fx, NULL, 4, 5, ix, fx, NULL), KVPS_ERR_INVALID_ARG},
        {"topk NULL idx", kvps_gpu_topk(fx, NULL, 4, 2, NULL, fx, NULL), KVPS_ERR_INVALID_ARG},
        {"topk n >= 2^32", kvps_gpu_topk(fx, NULL, (size_t)1 << 32, 2, ix, fx, NULL), KVPS_ERR_INVALID_ARG},
        {"sum float64", kvps_gpu_sum(fx, fx, 4, KVPS_FLOAT64, NULL), KVPS_ERR_INVALID_ARG},
        {"sum NULL src", kvps_gpu_sum(fx, NULL, 4, KVPS_FLOAT32, NULL), KVPS_ERR_INVALID_ARG},
        {"scale int32", kvps_gpu_scale(fx, NULL, 2.0f, 4, KVPS_INT32, NULL), KVPS_ERR_INVALID_ARG},
        {"scale NULL dst", kvps_gpu_scale(NULL, fx, 2.0f, 4, KVPS_FLOAT32, NULL), KVPS_ERR_INVALID_ARG},
        {"encode unaligned out", kvps_gpu_encode(&top, fx, 100, NULL, odd, 1000, &ob, NULL), KVPS_ERR_INVALID_ARG},
        {"encode NULL codec", kvps_gpu_encode(NULL, fx, 100, NULL, blob, 1000, &ob, NULL), KVPS_ERR_INVALID_ARG},
        {"encode NULL out_bytes", kvps_gpu_encode(&top, fx, 100, NULL, blob, 1000, NULL, NULL), KVPS_ERR_INVALID_ARG},
        {"encode user codec", kvps_gpu_encode(&user, fx, 100, NULL, blob, 1000, &ob, NULL), KVPS_ERR_CODEC},
        {"encode cap short", kvps_gpu_encode(&top, fx, 1000, NULL, blob, 8 + 4 + 10 * 8 - 1, &ob, NULL),
         KVPS_ERR_TOO_LARGE},
        {"decode unaligned in", kvps_gpu_decode(&top, odd, 100, fx, 10, 0, NULL, NULL), KVPS_ERR_INVALID_ARG},
        {"decode unaligned status", kvps_gpu_decode(&top, blob, 100, fx, 10, 0, (int *)(uintptr_t)0x50001, NULL),
         KVPS_ERR_INVALID_ARG},
        {"decode accumulate 3", kvps_gpu_decode(&top, blob, 100, fx, 10, 3, NULL, NULL), KVPS_ERR_INVALID_ARG},
        {"decode user codec", kvps_gpu_decode(&user, blob, 100, fx, 10, 0, NULL, NULL), KVPS_ERR_CODEC},
        {"comm NULL desc", kvps_gpu_comm_create(NULL, &c), KVPS_ERR_INVALID_ARG},
        {"comm size 0", kvps_gpu_comm_create(&(kvps_gpu_comm_desc){.size = 0}, &c), KVPS_ERR_CONFIG},
        {"comm rank = size", kvps_gpu_comm_create(&(kvps_gpu_comm_desc){.rank = 2, .size = 2}, &c), KVPS_ERR_CONFIG},
        {"comm size 2 without ring or id", kvps_gpu_comm_create(&(kvps_gpu_comm_desc){.rank = 0, .size = 2}, &c),
         KVPS_ERR_CONFIG},
        {"comm device -2", kvps_gpu_comm_create(&(kvps_gpu_comm_desc){.size = 1, .device = -2}, &c), KVPS_ERR_CONFIG},
        {"comm timeout -1", kvps_gpu_comm_create(&(kvps_gpu_comm_desc){.size = 1, .timeout_ms = -1}, &c),
         KVPS_ERR_CONFIG},
        {"local n 0", kvps_gpu_comm_create_local(NULL, 0, 0, &c), KVPS_ERR_INVALID_ARG},
        {"allreduce NULL comm", kvps_gpu_allreduce(NULL, fx, fx, 4, KVPS_FLOAT32, KVPS_SUM, NULL), KVPS_ERR_INVALID_ARG},
        {"wait NULL comm", kvps_gpu_comm_wait(NULL, NULL, -1), KVPS_ERR_INVALID_ARG},
        {"check NULL comm", kvps_gpu_comm_check(NULL), KVPS_ERR_INVALID_ARG},
        {"group_end unbalanced", kvps_gpu_group_end(NULL, 0), KVPS_ERR_STATE},
        {"nccl_id NULL ring", kvps_gpu_nccl_id(NULL, 0, blob), KVPS_ERR_INVALID_ARG},
        {"hier NULL desc", kvps_gpu_hier_create(NULL, &h), KVPS_ERR_INVALID_ARG},
        {"hier count 0", kvps_gpu_hier_create(&(kvps_gpu_hier_desc){.ring = (kvps_ring *)blob}, &h), KVPS_ERR_CONFIG},
        {"hier neither worker nor ring", kvps_gpu_hier_create(&(kvps_gpu_hier_desc){.count = 10}, &h), KVPS_ERR_CONFIG},
        {"hier both worker and ring",
         kvps_gpu_hier_create(&(kvps_gpu_hier_desc){.count = 10, .worker = (kvps_worker *)blob,
                                                    .ring = (kvps_ring *)blob, .name = "x"}, &h),
         KVPS_ERR_CONFIG},
        {"hier worker without name",
         kvps_gpu_hier_create(&(kvps_gpu_hier_desc){.count = 10, .worker = (kvps_worker *)blob}, &h), KVPS_ERR_CONFIG},
        {"hier op 9", kvps_gpu_hier_create(&(kvps_gpu_hier_desc){.count = 10, .ring = (kvps_ring *)blob,
                                                                 .op = (kvps_redop)9}, &h),
         KVPS_ERR_CONFIG},
        {"hier step NULL", kvps_gpu_hier_step(NULL, fx, fx, NULL), KVPS_ERR_INVALID_ARG},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        KT_CHECK(t[i].got == t[i].want, "%s: %s, want %s", t[i].name, kvps_result_str(t[i].got), kvps_result_str(t[i].want));
    KT_CHECK(c == NULL && h == NULL, "no object made");
    /* harmless NULLs */
    kvps_gpu_comm_destroy(NULL);
    kvps_gpu_comm_destroy(&c);
    kvps_gpu_hier_destroy(NULL);
    kvps_gpu_hier_destroy(&h);
    KT_CHECK(kvps_gpu_comm_rank(NULL) == -1 && kvps_gpu_comm_size(NULL) == 0 && kvps_gpu_comm_nccl(NULL) == NULL,
             "NULL getters");
    KT_CHECK(kvps_gpu_hier_tensors(NULL, NULL) == 0 && *kvps_gpu_hier_last_error(NULL) == 0, "NULL hier getters");
}

/* Without a device, every device call answers KVPS_ERR_NO_DEVICE (never a crash, never
   KVPS_ERR_GPU) and says why. */
static void test_no_device(void) {
    if (have_device()) { KT_SKIP("a CUDA device is here (the device tests cover that case)"); return; }
    float *fx = (float *)(uintptr_t)0x10000;
    uint16_t *hx = (uint16_t *)(uintptr_t)0x20000;
    uint32_t *ix = (uint32_t *)(uintptr_t)0x30000;
    void *blob = (void *)(uintptr_t)0x40000;
    kvps_codec fp16 = kvps_codec_get(KVPS_CODEC_FP16), top = kvps_codec_get(KVPS_CODEC_TOPK);
    size_t ob = 0;
    kvps_gpu_comm *c = NULL, *cs[2] = {NULL, NULL};
    kvps_gpu_hier *h = NULL;
    struct { const char *name; kvps_result got; } t[] = {
        {"pack", kvps_gpu_pack(hx, fx, fx, 4, KVPS_FLOAT16, NULL)},
        {"unpack", kvps_gpu_unpack(fx, hx, 4, KVPS_BFLOAT16, 1, NULL)},
        {"topk", kvps_gpu_topk(fx, fx, 4, 2, ix, fx, NULL)},
        {"sum", kvps_gpu_sum(fx, fx, 4, KVPS_FLOAT16, NULL)},
        {"scale", kvps_gpu_scale(fx, NULL, 2.0f, 4, KVPS_FLOAT32, NULL)},
        {"encode fp16", kvps_gpu_encode(&fp16, fx, 4, NULL, blob, 100, &ob, NULL)},
        {"encode topk", kvps_gpu_encode(&top, fx, 4, fx, blob, 100, &ob, NULL)},
        {"decode", kvps_gpu_decode(&top, blob, 100, fx, 4, 0, NULL, NULL)},
        {"comm size 1", kvps_gpu_comm_create(&(kvps_gpu_comm_desc){.size = 1}, &c)},
        {"comm local", kvps_gpu_comm_create_local(NULL, 2, 0, cs)},
        {"hier", kvps_gpu_hier_create(&(kvps_gpu_hier_desc){.count = 10, .ring = (kvps_ring *)blob}, &h)},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        KT_CHECK(t[i].got == KVPS_ERR_NO_DEVICE, "%s: %s", t[i].name, kvps_result_str(t[i].got));
    }
    KT_CHECK(strstr(kvps_gpu_last_error(), "cuda") != NULL, "reason: '%s'", kvps_gpu_last_error());
    KT_CHECK(c == NULL && cs[0] == NULL && cs[1] == NULL && h == NULL, "nothing made");
}

/* kvps_gpu_codec_bytes is kvps_codec_max_bytes for every built-in codec and parameter. */
static void test_codec_bytes(void) {
    static const size_t ns[] = {0, 1, 7, 8, 9, 255, 256, 257, 1000, 4096, 100003, (size_t)1 << 24};
    for (int id = KVPS_CODEC_NONE; id <= KVPS_CODEC_SIGN; id++)
        for (int v = 0; v < 6; v++)
            for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
                kvps_codec c = kvps_codec_get((kvps_codec_id)id);
                if (v == 1) c.topk_fraction = 0.3;
                if (v == 2) c.topk_count = 5;
                if (v == 3) { c.topk_fp16_values = 1; c.topk_count = 1000; }
                if (v == 4) c.sign_chunk = 100;
                if (v == 5) c.sign_chunk = 1;
                KT_CHECK(kvps_gpu_codec_bytes(&c, ns[i]) == kvps_codec_max_bytes(&c, ns[i]), "%s v%d n=%zu: %zu vs %zu",
                         c.name, v, ns[i], kvps_gpu_codec_bytes(&c, ns[i]), kvps_codec_max_bytes(&c, ns[i]));
            }
}

/* Data with what top-k finds hard: ties (values on a coarse grid), zeros of both signs,
   infinities, subnormals, and a few huge values. */
static void fill_hard(float *x, size_t n, uint64_t seed, int kind) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        float v = kt_randf(&s);
        switch (kind) {
        case 0: break;
        case 1: v = (float)(int)(v * 4.0f) / 4.0f; break; /* 9 distinct values: ties everywhere */
        case 2: v = 1.0f; break;                          /* all equal */
        case 3: {
            uint64_t r = kt_rng(&s) % 16;
            if (r == 0) v = 0.0f;
            else if (r == 1) v = -0.0f;
            else if (r == 2) v = (kt_rng(&s) & 1) ? INFINITY : -INFINITY;
            else if (r == 3) v = v * 1e-40f; /* subnormal */
            else if (r == 4) v = v * 1e30f;
            break;
        }
        }
        x[i] = v;
    }
}

static int same_bits(const float *a, const float *b, size_t n, size_t *where) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4) != 0) { *where = i; return 0; }
    return 1;
}

/* The kernels' algorithm against kvps.h's top-k: same indices, same value bits, same residual. */
static void test_topk_algorithm(void) {
    static const size_t ns[] = {1, 2, 5, 100, 4095, 4096, 4097, 12289, 100000};
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
        for (int kind = 0; kind < 4; kind++)
            for (int ef = 0; ef < 2; ef++) {
                size_t n = ns[ni];
                size_t ks[] = {0, 1, 2, n / 100, n / 2, n > 1 ? n - 1 : 1, n};
                float *x = malloc(n * 4), *r1 = malloc(n * 4), *r2 = malloc(n * 4), *v1 = malloc(n * 4), *v2 = malloc(n * 4);
                uint32_t *i1 = malloc(n * 4), *i2 = malloc(n * 4);
                for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
                    size_t k = ks[ki];
                    if (k > n) continue;
                    fill_hard(x, n, 1000 * ni + 10 * (uint64_t)kind + ki, kind);
                    fill_hard(r1, n, 7 + ni + (uint64_t)kind, kind == 2 ? 1 : kind);
                    memcpy(r2, r1, n * 4);
                    kvps_result a = kvps__topk_ef(x, ef ? r1 : NULL, n, k, i1, v1);
                    kvps_result b = kvps_gpu__topk_host(x, ef ? r2 : NULL, n, k, i2, v2);
                    size_t w = 0;
                    KT_CHECK(a == KVPS_OK && b == KVPS_OK, "n=%zu k=%zu kind %d ef %d: %s / %s", n, k, kind, ef,
                             kvps_result_str(a), kvps_result_str(b));
                    if (a != KVPS_OK || b != KVPS_OK) continue;
                    KT_CHECK(memcmp(i1, i2, k * 4) == 0, "n=%zu k=%zu kind %d ef %d: indices differ", n, k, kind, ef);
                    KT_CHECK(same_bits(v1, v2, k, &w), "n=%zu k=%zu kind %d ef %d: value %zu", n, k, kind, ef, w);
                    if (ef) KT_CHECK(same_bits(r1, r2, n, &w), "n=%zu k=%zu kind %d: residual %zu", n, k, kind, w);
                }
                free(x); free(r1); free(r2); free(v1); free(v2); free(i1); free(i2);
            }
    /* the digit pick itself: the k-th largest of random keys, by both */
    uint64_t s = 99;
    for (int t = 0; t < 200; t++) {
        size_t n = 1 + kt_rng(&s) % 5000, k = 1 + kt_rng(&s) % n;
        uint32_t *v = malloc(n * 4), *tmp = malloc(n * 4), *srt = malloc(n * 4);
        for (size_t i = 0; i < n; i++) v[i] = (uint32_t)(kt_rng(&s) >> 33) >> (t % 20);
        memcpy(srt, v, n * 4);
        qsort(srt, n, 4, kvps__cmp_u32);
        KT_CHECK(kvps__kth_largest(v, NULL, n, k, tmp, NULL) == srt[n - k], "kth_largest oracle");
        float *xf = malloc(n * 4); /* the same keys as floats' magnitudes (keys < 2^31), signs mixed */
        for (size_t i = 0; i < n; i++) { uint32_t u = v[i] | (i % 3 ? 0u : 0x80000000u); memcpy(&xf[i], &u, 4); }
        KT_CHECK(kvps__kth_largest(NULL, xf, n, k, NULL, NULL) == srt[n - k], "kth_largest oracle, over floats");
        free(xf); free(v); free(tmp); free(srt);
    }
}

/* The device decoder's verdicts (kvps_gpu__verdict, kvps_gpu__index_ok: the code the kernels
   run) against kvps_codec_decode: the named cases of decode_cases.h, then random corruptions. */

static void test_decode_verdicts(void) {
    enum { N = DECODE_N };
    float x[N], dst[N];
    static unsigned char good[4][8 + 4 + N * 8], blob[8 + 4 + N * 8 + 64];
    size_t gbytes[4];
    kvps_codec cs[4] = {kvps_codec_get(KVPS_CODEC_FP16), kvps_codec_get(KVPS_CODEC_TOPK), kvps_codec_get(KVPS_CODEC_SIGN),
                        kvps_codec_get(KVPS_CODEC_TOPK)};
    cs[1].topk_count = 10;
    cs[2].sign_chunk = 100;
    cs[3].topk_count = 7;
    cs[3].topk_fp16_values = 1;
    fill_hard(x, N, 1, 0);
    for (int c = 0; c < 4; c++) KT_OK(kvps_codec_encode(&cs[c], x, N, NULL, good[c], sizeof good[c], &gbytes[c]));
    for (size_t i = 0; i < sizeof decode_cases / sizeof *decode_cases; i++) {
        const decode_case *t = &decode_cases[i];
        int c = t->c;
        size_t bytes = decode_case_blob(t, blob, sizeof blob, good[c], gbytes[c]);
        kvps_result want = kvps_codec_decode(&cs[c], blob, bytes, dst, t->n, 0);
        kvps_result got = kvps_gpu__verdict_host(blob, bytes, cs[c].id, t->n);
        KT_CHECK(got == want, "%s: %s, CPU %s", t->name, kvps_result_str(got), kvps_result_str(want));
    }
    /* random corruptions: one to three bytes changed, the length moved, n moved */
    uint64_t s = 4242;
    int disagree = 0;
    for (int it = 0; it < 200000 && disagree < 5; it++) {
        int c = (int)(kt_rng(&s) % 4);
        memset(blob, 0, sizeof blob);
        memcpy(blob, good[c], gbytes[c]);
        int edits = (int)(kt_rng(&s) % 4);
        for (int e = 0; e < edits; e++) {
            size_t at = kt_rng(&s) % (kt_rng(&s) & 1 ? 24 : gbytes[c]); /* mostly the header and first indices */
            blob[at] = (unsigned char)(kt_rng(&s) & 1 ? kt_rng(&s) : blob[at] ^ (1u << (kt_rng(&s) % 8)));
        }
        long db = (kt_rng(&s) % 3 == 0) ? (long)(kt_rng(&s) % 17) - 8 : 0;
        size_t bytes = (size_t)((long)gbytes[c] + db < 0 ? 0 : (long)gbytes[c] + db);
        size_t n = N + ((kt_rng(&s) % 8 == 0) ? (size_t)(kt_rng(&s) % 3) - 1 : 0);
        kvps_result want = kvps_codec_decode(&cs[c], blob, bytes, dst, n, 0);
        kvps_result got = kvps_gpu__verdict_host(blob, bytes, cs[c].id, n);
        if (got != want) {
            disagree++;
            KT_CHECK(0, "random case %d (codec %d, %zu bytes, n %zu): %s, CPU %s", it, c, bytes, n, kvps_result_str(got),
                     kvps_result_str(want));
        }
    }
}

/* The sign encoder's order of operations, as the kernel runs it, against the CPU codec. */
static void test_sign_order(void) {
    static const uint32_t chunks[] = {1, 7, 8, 100, 256, 4096};
    static const size_t ns[] = {1, 9, 255, 1000, 65541};
    for (size_t ci = 0; ci < sizeof chunks / sizeof *chunks; ci++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            for (int kind = 0; kind < 4; kind++)
                for (int ef = 0; ef < 2; ef++) {
                    size_t n = ns[ni];
                    uint32_t ch = chunks[ci];
                    kvps_codec c = kvps_codec_get(KVPS_CODEC_SIGN);
                    c.sign_chunk = ch;
                    size_t cap = kvps_codec_max_bytes(&c, n), nc = (n + ch - 1) / ch, ob = 0;
                    unsigned char *blob = malloc(cap), *bits = malloc((n + 7) / 8);
                    float *x = malloc(n * 4), *r1 = malloc(n * 4), *r2 = malloc(n * 4), *sc = malloc(nc * 4);
                    fill_hard(x, n, 31 * ni + (uint64_t)kind, kind);
                    fill_hard(r1, n, 5 + ci, 0);
                    memcpy(r2, r1, n * 4);
                    KT_OK(kvps_codec_encode(&c, x, n, ef ? r1 : NULL, blob, cap, &ob));
                    kvps_gpu__sign_host(x, ef ? r2 : NULL, n, ch, sc, bits);
                    size_t w = 0;
                    KT_CHECK(memcmp(blob + 12, sc, nc * 4) == 0, "chunk %u n=%zu kind %d ef %d: scales", ch, n, kind, ef);
                    KT_CHECK(memcmp(blob + 12 + nc * 4, bits, (n + 7) / 8) == 0, "chunk %u n=%zu kind %d ef %d: bits", ch, n,
                             kind, ef);
                    if (ef) KT_CHECK(same_bits(r1, r2, n, &w), "chunk %u n=%zu kind %d: residual %zu", ch, n, kind, w);
                    free(blob); free(bits); free(x); free(r1); free(r2); free(sc);
                }
}

/* ---- NCCL id over a ring: threads on inproc ---- */
typedef struct idrank {
    int rank, size;
    void *ctx;
    const char *peers;
    unsigned char id[KVPS_GPU_ID_BYTES];
    kvps_result rc;
} idrank;

static void *id_thread(void *p) {
    idrank *x = (idrank *)p;
    kvps_ring *r = NULL;
    x->rc = kvps_ring_create(&(kvps_ring_desc){.rank = x->rank, .size = x->size, .peers = x->peers, .zmq_ctx = x->ctx,
                                               .timeout_ms = 10000}, &r);
    if (x->rc == KVPS_OK) x->rc = kvps_gpu_nccl_id(r, x->rank, x->id);
    kvps_ring_destroy(&r);
    return NULL;
}

static void test_nccl_id_over_ring(void) {
    static int seq;
    for (int size = 1; size <= 4; size *= 2) {
        void *ctx = zmq_ctx_new();
        char peers[512] = "";
        for (int i = 0; i < size; i++)
            snprintf(peers + strlen(peers), sizeof peers - strlen(peers), "%sinproc://gpu-id-%d-%d", i ? "," : "", seq, i);
        seq++;
        idrank x[4];
        pthread_t th[4];
        for (int i = 0; i < size; i++) {
            memset(&x[i], 0, sizeof x[i]);
            x[i].rank = i; x[i].size = size; x[i].ctx = ctx; x[i].peers = peers;
            pthread_create(&th[i], NULL, id_thread, &x[i]);
        }
        for (int i = 0; i < size; i++) pthread_join(th[i], NULL);
        unsigned char zero[KVPS_GPU_ID_BYTES];
        memset(zero, 0, sizeof zero);
        for (int i = 0; i < size; i++) {
            KT_CHECK(x[i].rc == KVPS_OK, "size %d rank %d: %s (%s)", size, i, kvps_result_str(x[i].rc), kvps_gpu_last_error());
            KT_CHECK(memcmp(x[i].id, x[0].id, KVPS_GPU_ID_BYTES) == 0, "size %d rank %d: id differs from rank 0's", size, i);
        }
        KT_CHECK(memcmp(x[0].id, zero, sizeof zero) != 0, "size %d: an id was made", size);
        zmq_ctx_term(ctx);
    }
}

/* ---- the hierarchical step with host memory as the "device" ---- */

static float grad_of(int m, int step, size_t i) { return (float)((int)((i * 7 + (size_t)m * 13 + (size_t)step * 5) % 41) - 20); }

typedef struct machine {
    int m, M, steps, use_ring, skip; /* skip: never steps (a dead machine) */
    size_t count, piece;
    float scale;
    const char *servers;
    void *ctx;
    const char *peers;
    float *out; /* count * steps */
    kvps_result rc, rc2;
    char why[600];
} machine;

static void *machine_thread(void *p) {
    machine *x = (machine *)p;
    kvps_worker *w = NULL;
    kvps_ring *r = NULL;
    kvps_gpu_hier *h = NULL;
    float *g = malloc(x->count * 4);
    x->rc = x->use_ring
                ? kvps_ring_create(&(kvps_ring_desc){.rank = x->m, .size = x->M, .peers = x->peers, .zmq_ctx = x->ctx,
                                                     .timeout_ms = 10000}, &r)
                : kvps_worker_create(&(kvps_worker_desc){.servers = x->servers, .rank = x->m, .num_workers = x->M,
                                                         .zmq_ctx = x->ctx, .timeout_ms = 10000}, &w);
    if (x->rc == KVPS_OK)
        x->rc = kvps_gpu__hier_create_ops(&(kvps_gpu_hier_desc){.worker = w, .ring = r, .name = "g", .count = x->count,
                                                                .piece = x->piece, .scale = x->scale,
                                                                .timeout_ms = x->skip >= 0 ? 400 : 0},
                                          &emu_ops, &h);
    if (x->rc == KVPS_OK && w) { /* the same name again on this worker: kvps refuses it */
        kvps_gpu_hier *h2 = NULL;
        kvps_result r2 = kvps_gpu__hier_create_ops(&(kvps_gpu_hier_desc){.worker = w, .name = "g", .count = x->count,
                                                                         .piece = x->piece}, &emu_ops, &h2);
        if (r2 != KVPS_ERR_TENSOR || h2) { x->rc = KVPS_ERR_STATE; snprintf(x->why, sizeof x->why, "duplicate name: %s", kvps_result_str(r2)); }
        const kvps_tensor *ts = NULL;
        size_t nt = kvps_gpu_hier_tensors(h, &ts);
        size_t pc = x->piece ? x->piece : (size_t)1 << 20;
        if (nt != (x->count + pc - 1) / pc || !ts) { x->rc = KVPS_ERR_STATE; snprintf(x->why, sizeof x->why, "%zu tensors", nt); }
    }
    for (int s = 0; s < x->steps && x->rc == KVPS_OK && x->skip != x->m; s++) {
        for (size_t i = 0; i < x->count; i++) g[i] = grad_of(x->m, s, i);
        x->rc = kvps_gpu_hier_step(h, g, x->out + (size_t)s * x->count, NULL);
        if (x->rc != KVPS_OK) {
            snprintf(x->why, sizeof x->why, "%s", kvps_gpu_hier_last_error(h));
            x->rc2 = kvps_gpu_hier_step(h, g, g, NULL); /* broken from now on */
        }
    }
    if (x->rc != KVPS_OK && !*x->why) snprintf(x->why, sizeof x->why, "%s", kvps_gpu_last_error());
    /* after a failure requests may be in flight: the worker / ring goes first */
    kvps_worker_destroy(&w);
    kvps_ring_destroy(&r);
    kvps_gpu_hier_destroy(&h);
    free(g);
    return NULL;
}

static int run_machines(machine *ms, int M) {
    pthread_t th[8];
    for (int i = 0; i < M; i++) pthread_create(&th[i], NULL, machine_thread, &ms[i]);
    for (int i = 0; i < M; i++) pthread_join(th[i], NULL);
    return 0;
}

static void hier_case(int use_ring, int M, size_t count, size_t piece, float scale, int steps) {
    static int seq;
    kt_cluster cl;
    memset(&cl, 0, sizeof cl);
    char peers[1024] = "";
    void *ctx = NULL;
    if (!use_ring) {
        if (kt_cluster_up(&cl, "inproc", 2, &(kvps_server_desc){.num_workers = M, .update = KVPS_UPDATE_ACCUMULATE}) != 0) {
            KT_CHECK(0, "cluster");
            return;
        }
        ctx = cl.ctx;
    } else {
        ctx = zmq_ctx_new();
        for (int i = 0; i < M; i++)
            snprintf(peers + strlen(peers), sizeof peers - strlen(peers), "%sinproc://gpu-hier-%d-%d", i ? "," : "", seq, i);
        seq++;
    }
    machine ms[8];
    for (int i = 0; i < M; i++) {
        memset(&ms[i], 0, sizeof ms[i]);
        ms[i].m = i; ms[i].M = M; ms[i].steps = steps; ms[i].use_ring = use_ring; ms[i].skip = -1;
        ms[i].count = count; ms[i].piece = piece; ms[i].scale = scale;
        ms[i].servers = cl.servers; ms[i].ctx = ctx; ms[i].peers = peers;
        ms[i].out = malloc(count * (size_t)steps * 4);
    }
    run_machines(ms, M);
    for (int i = 0; i < M; i++)
        KT_CHECK(ms[i].rc == KVPS_OK, "%s M=%d count=%zu piece=%zu machine %d: %s: %s", use_ring ? "ring" : "servers", M,
                 count, piece, i, kvps_result_str(ms[i].rc), ms[i].why);
    /* oracle: per step the sum over machines of grad * scale (small integers times a power of
       two: exact in any order). KVPS_UPDATE_ACCUMULATE accumulates over steps: value += round sum. */
    int bad = 0;
    for (int i = 0; i < M && !bad; i++)
        for (int s = 0; s < steps && !bad; s++)
            for (size_t e = 0; e < count && !bad; e++) {
                double want = 0;
                for (int t = 0; t <= s; t++) {
                    if (use_ring && t != s) continue;
                    for (int m = 0; m < M; m++) want += (double)(grad_of(m, t, e) * (scale == 0.0f ? 1.0f : scale));
                }
                float got = ms[i].out[(size_t)s * count + e];
                if ((double)got != want) {
                    KT_CHECK(0, "%s M=%d count=%zu piece=%zu: machine %d step %d elem %zu: %g, want %g",
                             use_ring ? "ring" : "servers", M, count, piece, i, s, e, got, want);
                    bad = 1;
                }
            }
    for (int i = 0; i < M; i++) free(ms[i].out);
    if (!use_ring) kt_cluster_down(&cl);
    else zmq_ctx_term(ctx);
}

static void test_hier_pipeline(void) {
    hier_case(0, 1, 1000, 0, 0.0f, 2);       /* one piece, one machine */
    hier_case(0, 3, 10007, 1000, 0.5f, 3);   /* 11 pieces, the last short; scaled */
    hier_case(0, 2, 64, 1, 0.0f, 2);         /* a piece per element */
    hier_case(1, 3, 5003, 512, 0.25f, 2);    /* across machines on a kvps ring */
    hier_case(1, 1, 77, 10, 0.0f, 1);
}

/* A machine that never steps: the others' pulls wait, the step fails (bounded): it times out,
   or, once the idle machine's worker has finished (its destroy says goodbye), the server says
   that worker has finished (KVPS_ERR_PEER_LOST); the hier is broken afterwards, and everything
   tears down (worker first). */
static void test_hier_timeout(void) {
    kt_cluster cl;
    if (kt_cluster_up(&cl, "inproc", 1, &(kvps_server_desc){.num_workers = 2}) != 0) { KT_CHECK(0, "cluster"); return; }
    machine ms[2];
    for (int i = 0; i < 2; i++) {
        memset(&ms[i], 0, sizeof ms[i]);
        ms[i].m = i; ms[i].M = 2; ms[i].steps = 1; ms[i].skip = 1;
        ms[i].count = 3000; ms[i].piece = 1000;
        ms[i].servers = cl.servers; ms[i].ctx = cl.ctx;
        ms[i].out = malloc(3000 * 4);
    }
    int64_t t0 = kvps__now_ms();
    run_machines(ms, 2);
    int64_t dt = kvps__now_ms() - t0;
    KT_CHECK(ms[0].rc == KVPS_ERR_TIMEOUT || (ms[0].rc == KVPS_ERR_PEER_LOST && strstr(ms[0].why, "worker 1 has finished")),
             "machine 0: %s (%s)", kvps_result_str(ms[0].rc), ms[0].why);
    KT_CHECK(strstr(ms[0].why, "network") != NULL, "message names the stage: '%s'", ms[0].why);
    KT_CHECK(ms[0].rc2 == KVPS_ERR_STATE, "after the failure: %s", kvps_result_str(ms[0].rc2));
    KT_CHECK(dt < 5000, "bounded: %lld ms", (long long)dt);
    KT_CHECK(ms[1].rc == KVPS_OK, "idle machine: %s", kvps_result_str(ms[1].rc));
    for (int i = 0; i < 2; i++) free(ms[i].out);
    kt_cluster_down(&cl);
}

/* A server that rejects a piece (its key was registered with another length): the error comes
   back from the step with the server's text and the piece named, and the other pieces' requests
   are drained. The refusal of the piece's name may reach the worker before the step sends that
   piece (the send is refused at once) or after (its request fails): refused_first forces the
   first order (the H200 box met it by chance and the step named piece 0). */
static void hier_server_error(int refused_first) {
    kt_cluster cl;
    if (kt_cluster_up(&cl, "inproc", 1, &(kvps_server_desc){.num_workers = 1}) != 0) { KT_CHECK(0, "cluster"); return; }
    kvps_worker *w1 = NULL, *w2 = NULL;
    /* piece 1 of "e" (elements 100..199) first used with 50 floats by an earlier worker of rank 0,
       which has finished (two live workers of one rank would be refused) */
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = cl.servers, .rank = 0, .num_workers = 1, .zmq_ctx = cl.ctx}, &w2));
    kvps_tensor t;
    kvps_req q;
    float junk[50] = {0};
    KT_OK(kvps_worker_tensor(w2, "e.0.1", 50, &t));
    KT_OK(kvps_worker_push_tensor(w2, t, junk, &q));
    KT_OK(kvps_worker_wait(w2, q, -1));
    kvps_worker_destroy(&w2);
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = cl.servers, .rank = 0, .num_workers = 1, .zmq_ctx = cl.ctx}, &w1));
    kvps_gpu_hier *h = NULL;
    KT_OK(kvps_gpu__hier_create_ops(&(kvps_gpu_hier_desc){.worker = w1, .name = "e", .count = 300, .piece = 100,
                                                          .timeout_ms = 2000}, &emu_ops, &h));
    const kvps_tensor *ts = NULL;
    KT_CHECK(kvps_gpu_hier_tensors(h, &ts) == 3, "three pieces");
    for (int i = 0; refused_first && ts && !w1->tensors[ts[1]].bad && i < 200; i++) kvps__progress(w1, 10);
    KT_CHECK(!refused_first || (ts && w1->tensors[ts[1]].bad), "the refusal of piece 1's name has arrived");
    float g[300], o[300];
    for (int i = 0; i < 300; i++) g[i] = (float)i;
    kvps_result rc = kvps_gpu_hier_step(h, g, o, NULL);
    KT_CHECK(rc == KVPS_ERR_LEN_MISMATCH, "step: %s (%s)", kvps_result_str(rc), kvps_gpu_hier_last_error(h));
    KT_CHECK(strstr(kvps_gpu_hier_last_error(h), "piece 1") != NULL, "names the piece: '%s'", kvps_gpu_hier_last_error(h));
    KT_CHECK(kvps_gpu_hier_step(h, g, o, NULL) == KVPS_ERR_STATE, "broken afterwards");
    kvps_worker_destroy(&w1);
    kvps_worker_destroy(&w2);
    kvps_gpu_hier_destroy(&h);
    kt_cluster_down(&cl);
}
static void test_hier_server_error(void) {
    hier_server_error(0);
    hier_server_error(1);
}

int main(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    KT_RUN(test_result_mapping);
    KT_RUN(test_device_count);
    KT_RUN(test_argument_checks);
    KT_RUN(test_no_device);
    KT_RUN(test_codec_bytes);
    KT_RUN(test_topk_algorithm);
    KT_RUN(test_decode_verdicts);
    KT_RUN(test_sign_order);
    KT_RUN(test_nccl_id_over_ring);
    KT_RUN(test_hier_pipeline);
    KT_RUN(test_hier_timeout);
    KT_RUN(test_hier_server_error);
    return kt_finish();
}
