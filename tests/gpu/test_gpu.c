/* test_gpu - kvps_gpu.h on a CUDA device: every kernel against the CPU codecs bit for bit
   (pack/unpack over all 2^32 floats and all 2^16 halves; encode, decode, top-k, sign, sum,
   scale on hard data: ties, zeros, infinities, subnormals, sparse inputs, NaN payloads where the
   GPU keeps them; sizes 0, 1, odd and 2^24 + 3), malformed blobs get the CPU decoder's verdict, NCCL collectives against
   a naive sum for 1 and all visible GPUs (threads, each rank bootstrapped over a kvps_ring on
   inproc://, and one thread driving all GPUs with group calls), a collective one rank never
   joins times out and aborts, and the hierarchical step against kvps servers. Without a device:
   one "skipped: no CUDA device" line. NaN inputs are left out of arithmetic paths (the GPU's
   NaN results are canonical; see kvps_gpu.h, NUMERICS). */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "kvps_ring.h"
#include "kvps_gpu.h"
#include "tests/kvps_test.h"
#include "tests/gpu/decode_cases.h"
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>

static int ndev;

/* ---- device memory helpers: failures are test failures, never crashes ---- */
static void *dalloc(size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 4);
    KT_CHECK(e == cudaSuccess, "cudaMalloc(%zu): %s", bytes, cudaGetErrorString(e));
    return e == cudaSuccess ? p : NULL;
}
static int h2d(void *d, const void *h, size_t bytes) {
    cudaError_t e = cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    KT_CHECK(e == cudaSuccess, "cudaMemcpy H2D: %s", cudaGetErrorString(e));
    return e == cudaSuccess;
}
static int d2h(void *h, const void *d, size_t bytes) {
    cudaError_t e = cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost); /* also waits for the kernels before it */
    KT_CHECK(e == cudaSuccess, "cudaMemcpy D2H: %s", cudaGetErrorString(e));
    return e == cudaSuccess;
}
static int sync_ok(const char *what) {
    cudaError_t e = cudaDeviceSynchronize();
    KT_CHECK(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}
static void dfree(void *p) { if (p) cudaFree(p); }

static int is_nan32(const void *p) { uint32_t u; memcpy(&u, p, 4); return (u & 0x7fffffffu) > 0x7f800000u; }
/* bit-equal, or both NaN where NaN came from arithmetic (nan_ok) */
static size_t first_diff(const void *a, const void *b, size_t n, int nan_ok) {
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    for (size_t i = 0; i < n; i++)
        if (memcmp(x + 4 * i, y + 4 * i, 4) != 0 && !(nan_ok && is_nan32(x + 4 * i) && is_nan32(y + 4 * i))) return i;
    return (size_t)-1;
}

/* Inputs by kind: 0 random; 1 ties (quarters); 2 all equal; 3 hard: both zeros, infinities,
   subnormals, huge and tiny values; 4 sparse: 99% zeros, the rest hard; 5 (KIND_NAN) hard with
   quiet and signalling NaNs of many payloads, for the paths that keep NaNs as the CPU does. */
enum { KIND_NAN = 5 };
static void fill(float *x, size_t n, uint64_t seed, int kind) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        float v = kt_randf(&s);
        if (kind == 1) v = (float)(int)(v * 4.0f) / 4.0f;
        else if (kind == 2) v = 0.5f;
        else if (kind == 4 && kt_rng(&s) % 100 != 0) v = 0.0f;
        else if (kind == KIND_NAN && kt_rng(&s) % 8 == 0) {
            uint32_t u = 0x7f800001u | (uint32_t)(kt_rng(&s) & 0x807fffffu); /* sign, payload; quiet or not */
            memcpy(&v, &u, 4);
        } else if (kind >= 3) {
            uint64_t r = kt_rng(&s) % 16;
            if (r == 0) v = 0.0f;
            else if (r == 1) v = -0.0f;
            else if (r == 2) v = (kt_rng(&s) & 1) ? INFINITY : -INFINITY;
            else if (r == 3) v *= 1e-40f;
            else if (r == 4) v *= 1e30f;
            else if (r == 5) v *= 70000.0f; /* overflows fp16 */
        }
        x[i] = v;
    }
}

/* ---- pack / unpack: every float, every half ---- */
static void test_pack_unpack_exhaustive(void) {
    const size_t B = (size_t)1 << 24;
    uint32_t *in = malloc(B * 4);
    uint16_t *got = malloc(B * 2), *want = malloc(B * 2);
    float *d_in = dalloc(B * 4);
    uint16_t *d_out = dalloc(B * 2);
    if (!in || !got || !want || !d_in || !d_out) goto out;
    size_t stride = kt_quick() ? 37 : 1;
    for (int f16 = 0; f16 < 2; f16++)
        for (uint64_t base = 0; base < ((uint64_t)1 << 32); base += (uint64_t)B * stride) {
            for (size_t i = 0; i < B; i++) in[i] = (uint32_t)(base + i);
            if (!h2d(d_in, in, B * 4)) goto out;
            kvps_result rc = kvps_gpu_pack(d_out, d_in, NULL, B, f16 ? KVPS_FLOAT16 : KVPS_BFLOAT16, NULL);
            KT_CHECK(rc == KVPS_OK, "pack: %s (%s)", kvps_result_str(rc), kvps_gpu_last_error());
            if (rc != KVPS_OK || !d2h(got, d_out, B * 2)) goto out;
            if (f16) kvps_f32_to_f16_n(want, (const float *)(const void *)in, B);
            else kvps_f32_to_bf16_n(want, (const float *)(const void *)in, B);
            if (memcmp(got, want, B * 2) != 0) {
                size_t i = 0;
                while (got[i] == want[i]) i++;
                KT_CHECK(0, "%s(0x%08x) = 0x%04x, CPU 0x%04x", f16 ? "fp16" : "bf16", in[i], got[i], want[i]);
                goto out;
            }
        }
    /* all 65536 halves back to float, and accumulated onto a float */
    {
        uint16_t h[65536];
        float fg[65536], fw[65536], acc[65536];
        for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
        uint64_t s = 5;
        for (int i = 0; i < 65536; i++) acc[i] = kt_randf(&s) * 100.0f;
        if (!h2d(d_out, h, sizeof h)) goto out;
        for (int f16 = 0; f16 < 2; f16++)
            for (int a = 0; a < 2; a++) {
                if (!h2d(d_in, acc, sizeof acc)) goto out;
                kvps_result rc = kvps_gpu_unpack(d_in, d_out, 65536, f16 ? KVPS_FLOAT16 : KVPS_BFLOAT16, a, NULL);
                KT_CHECK(rc == KVPS_OK, "unpack: %s", kvps_result_str(rc));
                if (!d2h(fg, d_in, sizeof fg)) goto out;
                for (int i = 0; i < 65536; i++) {
                    float v = f16 ? kvps_f16_to_f32(h[i]) : kvps_bf16_to_f32(h[i]);
                    fw[i] = a ? acc[i] + v : v;
                }
                size_t i = first_diff(fg, fw, 65536, a);
                KT_CHECK(i == (size_t)-1, "%s unpack acc %d: 0x%04zx", f16 ? "fp16" : "bf16", a, i);
            }
    }
out:
    dfree(d_in); dfree(d_out);
    free(in); free(got); free(want);
}

/* ---- encode: the same blob and residual as kvps_codec_encode ---- */
typedef struct codec_case { const char *name; kvps_codec_id id; double frac; size_t count; int fp16v; uint32_t chunk; } codec_case;
static const codec_case codec_cases[] = {
    {"none", KVPS_CODEC_NONE, 0, 0, 0, 0},
    {"fp16", KVPS_CODEC_FP16, 0, 0, 0, 0},
    {"bf16", KVPS_CODEC_BF16, 0, 0, 0, 0},
    {"topk 1%", KVPS_CODEC_TOPK, 0, 0, 0, 0},
    {"topk 30%", KVPS_CODEC_TOPK, 0.3, 0, 0, 0},
    {"topk k=1", KVPS_CODEC_TOPK, 0, 1, 0, 0},
    {"topk all", KVPS_CODEC_TOPK, 1.0, 0, 0, 0},
    {"topk fp16 values", KVPS_CODEC_TOPK, 0.05, 0, 1, 0},
    {"sign 256", KVPS_CODEC_SIGN, 0, 0, 0, 0},
    {"sign 8", KVPS_CODEC_SIGN, 0, 0, 0, 8},
    {"sign 100", KVPS_CODEC_SIGN, 0, 0, 0, 100},
    {"sign 1", KVPS_CODEC_SIGN, 0, 0, 0, 1},
    {"sign 4096", KVPS_CODEC_SIGN, 0, 0, 0, 4096},
};
static kvps_codec make_codec(const codec_case *cc) {
    kvps_codec c = kvps_codec_get(cc->id);
    c.topk_fraction = cc->frac;
    c.topk_count = cc->count;
    c.topk_fp16_values = cc->fp16v;
    c.sign_chunk = cc->chunk;
    return c;
}

/* Every case x size x kind x (with / without error feedback): the GPU's blob, bytes and residual
   against kvps_codec_encode, then the CPU's blob decoded on the GPU (plain and accumulated)
   against kvps_codec_decode. NaN inputs only where the GPU keeps NaNs bit for bit (NUMERICS):
   NONE, FP16 and BF16 without a residual, decoded without accumulation. */
static void encode_decode_run(const codec_case *cases, size_t ncases, const size_t *ns, size_t nn, const int *kinds,
                              size_t nkinds) {
    size_t nmax = 1, cap = 0;
    for (size_t ni = 0; ni < nn; ni++) nmax = ns[ni] > nmax ? ns[ni] : nmax;
    for (size_t ci = 0; ci < ncases; ci++) {
        kvps_codec c = make_codec(&cases[ci]);
        size_t b = kvps_codec_max_bytes(&c, nmax) + 64;
        cap = b > cap ? b : cap;
    }
    float *x = malloc(nmax * 4), *r0 = malloc(nmax * 4), *rc_ = malloc(nmax * 4), *rg = malloc(nmax * 4);
    float *dec_c = malloc(nmax * 4), *dec_g = malloc(nmax * 4);
    unsigned char *bc = malloc(cap), *bg = malloc(cap);
    float *d_x = dalloc(nmax * 4), *d_r = dalloc(nmax * 4), *d_dst = dalloc(nmax * 4);
    void *d_blob = dalloc(cap);
    int *d_status = dalloc(4);
    if (!x || !r0 || !rc_ || !rg || !dec_c || !dec_g || !bc || !bg || !d_x || !d_r || !d_dst || !d_blob || !d_status) {
        KT_CHECK(0, "encode/decode up to n=%zu: out of memory", nmax);
        goto out;
    }
    for (size_t ci = 0; ci < ncases; ci++)
        for (size_t ni = 0; ni < nn; ni++)
            for (size_t ki = 0; ki < nkinds; ki++)
                for (int ef = 0; ef < 2; ef++) {
                    const codec_case *cc = &cases[ci];
                    kvps_codec c = make_codec(cc);
                    size_t n = ns[ni], bytes_c = 0, bytes_g = 0;
                    int kind = kinds[ki];
                    if (kind == KIND_NAN && (ef || (cc->id != KVPS_CODEC_NONE && cc->id != KVPS_CODEC_FP16 &&
                                                    cc->id != KVPS_CODEC_BF16)))
                        continue;
                    fill(x, n, 11 * ni + (uint64_t)kind, kind);
                    fill(r0, n, 3 + ni, kind >= 3 ? 0 : kind);
                    for (size_t i = 0; i < n; i++) r0[i] *= 0.01f;
                    memcpy(rc_, r0, n * 4);
                    kvps_result a = kvps_codec_encode(&c, x, n, ef ? rc_ : NULL, bc, cap, &bytes_c);
                    if (!h2d(d_x, x, n * 4) || !h2d(d_r, r0, n * 4)) goto out;
                    kvps_result b = kvps_gpu_encode(&c, d_x, n, ef ? d_r : NULL, d_blob, cap, &bytes_g, NULL);
                    KT_CHECK(a == KVPS_OK && b == KVPS_OK, "%s n=%zu: %s / %s (%s)", cc->name, n, kvps_result_str(a),
                             kvps_result_str(b), kvps_gpu_last_error());
                    if (a != KVPS_OK || b != KVPS_OK) continue;
                    if (!d2h(bg, d_blob, bytes_g) || !d2h(rg, d_r, n * 4)) goto out;
                    KT_CHECK(bytes_c == bytes_g, "%s n=%zu: %zu bytes, CPU %zu", cc->name, n, bytes_g, bytes_c);
                    if (bytes_c != bytes_g) continue;
                    if (memcmp(bc, bg, bytes_c) != 0) {
                        size_t i = 0;
                        while (bc[i] == bg[i]) i++;
                        KT_CHECK(0, "%s n=%zu kind %d ef %d: blob byte %zu of %zu: 0x%02x, CPU 0x%02x", cc->name, n, kind,
                                 ef, i, bytes_c, bg[i], bc[i]);
                    }
                    if (ef) {
                        size_t i = first_diff(rg, rc_, n, 1);
                        KT_CHECK(i == (size_t)-1, "%s n=%zu kind %d: residual %zu: %a, CPU %a", cc->name, n, kind, i,
                                 (double)rg[i], (double)rc_[i]);
                    }
                    /* decode the CPU's blob on the device, plain and accumulated */
                    for (int acc = 0; acc < (kind == KIND_NAN ? 1 : 2); acc++) {
                        fill(dec_c, n, 77, 0);
                        memcpy(dec_g, dec_c, n * 4);
                        kvps_result dc = kvps_codec_decode(&c, bc, bytes_c, dec_c, n, acc);
                        if (!h2d(d_blob, bc, bytes_c) || !h2d(d_dst, dec_g, n * 4)) goto out;
                        kvps_result dg = kvps_gpu_decode(&c, d_blob, bytes_c, d_dst, n, acc, d_status, NULL);
                        int st = 1;
                        if (!d2h(&st, d_status, 4) || !d2h(dec_g, d_dst, n * 4)) goto out;
                        KT_CHECK(dc == KVPS_OK && dg == KVPS_OK && st == KVPS_OK, "%s n=%zu decode: %s / %s / status %d",
                                 cc->name, n, kvps_result_str(dc), kvps_result_str(dg), st);
                        size_t i = first_diff(dec_g, dec_c, n, kind != KIND_NAN);
                        KT_CHECK(i == (size_t)-1, "%s n=%zu kind %d acc %d: decoded %zu: %a, CPU %a", cc->name, n, kind,
                                 acc, i, (double)dec_g[i], (double)dec_c[i]);
                    }
                }
out:
    dfree(d_x); dfree(d_r); dfree(d_dst); dfree(d_blob); dfree(d_status);
    free(x); free(r0); free(rc_); free(rg); free(dec_c); free(dec_g); free(bc); free(bg);
}

static void test_encode_decode_vs_cpu(void) {
    static const size_t ns[] = {1, 7, 8, 255, 4095, 4096, 4097, 65541, (size_t)1 << 20, ((size_t)1 << 22) + 3};
    static const int kinds[] = {0, 1, 2, 3, 4, KIND_NAN};
    encode_decode_run(codec_cases, sizeof codec_cases / sizeof *codec_cases, ns, kt_quick() ? 8 : 10, kinds, 6);
}

/* ---- decode of malformed blobs (decode_cases.h): the CPU decoder's verdict, and nothing written ---- */

static void test_decode_malformed(void) {
    enum { N = DECODE_N };
    float x[N], dst[N], sentinel[N];
    unsigned char good[3][8 + 4 + N * 8], blob[8 + 4 + N * 8 + 16];
    size_t gbytes[3];
    kvps_codec cs[3] = {kvps_codec_get(KVPS_CODEC_FP16), kvps_codec_get(KVPS_CODEC_TOPK), kvps_codec_get(KVPS_CODEC_SIGN)};
    cs[1].topk_count = 10;
    cs[2].sign_chunk = 100;
    fill(x, N, 1, 0);
    for (int c = 0; c < 3; c++) KT_OK(kvps_codec_encode(&cs[c], x, N, NULL, good[c], sizeof good[c], &gbytes[c]));
    fill(sentinel, N, 2, 0);
    void *d_blob = dalloc(sizeof blob);
    float *d_dst = dalloc(sizeof dst);
    int *d_status = dalloc(4);
    if (!d_blob || !d_dst || !d_status) goto out;
    for (size_t i = 0; i < sizeof decode_cases / sizeof *decode_cases; i++) {
        const decode_case *t = &decode_cases[i];
        if (t->host_only) continue;
        int c = t->c;
        size_t bytes = decode_case_blob(t, blob, sizeof blob, good[c], gbytes[c]);
        memcpy(dst, sentinel, sizeof dst);
        kvps_result want = kvps_codec_decode(&cs[c], blob, bytes, dst, t->n, 0);
        if (!h2d(d_blob, blob, sizeof blob) || !h2d(d_dst, sentinel, sizeof sentinel)) goto out;
        kvps_result rc = kvps_gpu_decode(&cs[c], d_blob, bytes, d_dst, t->n, 0, d_status, NULL);
        int st = 1;
        float back[N];
        if (!d2h(&st, d_status, 4) || !d2h(back, d_dst, sizeof back)) goto out;
        KT_CHECK(rc == KVPS_OK && st == (int)want, "%s: status %d (%s), CPU %s", t->name, st,
                 kvps_result_str((kvps_result)st), kvps_result_str(want));
        if (want != KVPS_OK)
            KT_CHECK(memcmp(back, sentinel, sizeof back) == 0, "%s: destination written on a bad blob", t->name);
        else
            KT_CHECK(first_diff(back, dst, t->n, 0) == (size_t)-1, "%s: decoded values differ", t->name);
    }
    /* the same through an internal status (d_status NULL) */
    KT_CHECK(kvps_gpu_decode(&cs[0], d_blob, 3, d_dst, N, 0, NULL, NULL) == KVPS_OK, "NULL status");
    sync_ok("decode with NULL status");
out:
    dfree(d_blob); dfree(d_dst); dfree(d_status);
}

/* ---- kvps_gpu_topk against kvps_topk / kvps__topk_ef ---- */
/* every size x kind x (with / without error feedback) x k in {0, 1, n/1000, n/3, n} (those <= n) */
static void topk_run(const size_t *ns, size_t nn, const int *kinds, size_t nkinds) {
    size_t nmax = 1;
    for (size_t ni = 0; ni < nn; ni++) nmax = ns[ni] > nmax ? ns[ni] : nmax;
    float *x = malloc(nmax * 4), *r1 = malloc(nmax * 4), *r2 = malloc(nmax * 4), *v1 = malloc(nmax * 4), *v2 = malloc(nmax * 4);
    uint32_t *i1 = malloc(nmax * 4), *i2 = malloc(nmax * 4);
    float *d_x = dalloc(nmax * 4), *d_r = dalloc(nmax * 4), *d_v = dalloc(nmax * 4);
    uint32_t *d_i = dalloc(nmax * 4);
    if (!x || !r1 || !r2 || !v1 || !v2 || !i1 || !i2 || !d_x || !d_r || !d_v || !d_i) {
        KT_CHECK(0, "top-k up to n=%zu: out of memory", nmax);
        goto out;
    }
    for (size_t ni = 0; ni < nn; ni++)
        for (size_t kk = 0; kk < nkinds; kk++)
            for (int ef = 0; ef < 2; ef++) {
                int kind = kinds[kk];
                /* NaNs: only without error feedback (x + r would make the GPU's NaNs canonical,
                   and their magnitude keys, so the pick among them, differ from the CPU's) */
                if (kind == KIND_NAN && ef) continue;
                size_t n = ns[ni], ks[] = {0, 1, n / 1000, n / 3, n};
                for (size_t ki = 0; ki < 5; ki++) {
                    size_t k = ks[ki];
                    if (k > n || (ki && k == ks[ki - 1])) continue;
                    fill(x, n, 5 * ni + (uint64_t)kind + 100 * ki, kind);
                    fill(r1, n, 9 + ni, kind);
                    if (kind == 4) memset(r1, 0, n * 4); /* sparse stays sparse with error feedback */
                    memcpy(r2, r1, n * 4);
                    kvps_result a = kvps__topk_ef(x, ef ? r1 : NULL, n, k, i1, v1);
                    if (!h2d(d_x, x, n * 4) || !h2d(d_r, r2, n * 4)) goto out;
                    kvps_result b = kvps_gpu_topk(d_x, ef ? d_r : NULL, n, k, d_i, d_v, NULL);
                    KT_CHECK(a == KVPS_OK && b == KVPS_OK, "n=%zu k=%zu: %s / %s (%s)", n, k, kvps_result_str(a),
                             kvps_result_str(b), kvps_gpu_last_error());
                    if (a != KVPS_OK || b != KVPS_OK) continue;
                    if ((k && (!d2h(i2, d_i, k * 4) || !d2h(v2, d_v, k * 4))) || !d2h(r2, d_r, n * 4)) goto out;
                    KT_CHECK(memcmp(i1, i2, k * 4) == 0, "n=%zu k=%zu kind %d ef %d: indices", n, k, kind, ef);
                    KT_CHECK(first_diff(v1, v2, k, 1) == (size_t)-1, "n=%zu k=%zu kind %d ef %d: values", n, k, kind, ef);
                    if (ef) KT_CHECK(first_diff(r1, r2, n, 1) == (size_t)-1, "n=%zu k=%zu kind %d: residual", n, k, kind);
                }
            }
out:
    dfree(d_x); dfree(d_r); dfree(d_v); dfree(d_i);
    free(x); free(r1); free(r2); free(v1); free(v2); free(i1); free(i2);
}

static void test_topk(void) {
    static const size_t ns[] = {1, 2, 4097, 100003, (size_t)1 << 22};
    static const int kinds[] = {0, 1, 2, 3, 4, KIND_NAN};
    topk_run(ns, kt_quick() ? 4 : 5, kinds, 6);
}

/* ---- sum and scale, three dtypes ---- */
static void sum_scale_run(size_t N) {
    float *a = malloc(N * 4 + 4), *b = malloc(N * 4 + 4), *fa = malloc(N * 4 + 4), *fb = malloc(N * 4 + 4);
    uint16_t *ha = malloc(N * 2 + 2), *hb = malloc(N * 2 + 2), *hg = malloc(N * 2 + 2), *want = malloc(N * 2 + 2);
    void *d_a = dalloc(N * 4), *d_b = dalloc(N * 4);
    if (!a || !b || !fa || !fb || !ha || !hb || !hg || !want || !d_a || !d_b) { KT_CHECK(0, "n=%zu: memory", N); goto out; }
    fill(fa, N, 1, 3);
    fill(fb, N, 2, 0);
    for (int dt = 0; dt < 3; dt++) {
        kvps_dtype t = dt == 0 ? KVPS_FLOAT32 : dt == 1 ? KVPS_FLOAT16 : KVPS_BFLOAT16;
        size_t es = dt ? 2 : 4;
        for (int op = 0; op < 3; op++) { /* sum, scale out of place, scale in place */
            const void *ha_ = fa, *hb_ = fb;
            if (dt == 1) { kvps_f32_to_f16_n(ha, fa, N); kvps_f32_to_f16_n(hb, fb, N); ha_ = ha; hb_ = hb; }
            if (dt == 2) { kvps_f32_to_bf16_n(ha, fa, N); kvps_f32_to_bf16_n(hb, fb, N); ha_ = ha; hb_ = hb; }
            if (!h2d(d_a, ha_, N * es) || !h2d(d_b, hb_, N * es)) goto out;
            kvps_result rc = op == 0 ? kvps_gpu_sum(d_a, d_b, N, t, NULL)
                           : op == 1 ? kvps_gpu_scale(d_a, d_b, 0.375f, N, t, NULL)
                                     : kvps_gpu_scale(d_a, NULL, -3.0f, N, t, NULL);
            KT_CHECK(rc == KVPS_OK, "dt %d op %d: %s", dt, op, kvps_result_str(rc));
            /* the CPU: kvps_reduce_into for the sum, the element functions for the scale */
            if (dt == 0) {
                memcpy(a, fa, N * 4);
                memcpy(b, fb, N * 4);
                if (op == 0) kvps_reduce_into(a, b, N, KVPS_FLOAT32, KVPS_SUM);
                else for (size_t i = 0; i < N; i++) a[i] = (op == 1 ? b[i] : a[i]) * (op == 1 ? 0.375f : -3.0f);
                if (!d2h(b, d_a, N * 4)) goto out;
                size_t i = first_diff(b, a, N, 1);
                KT_CHECK(i == (size_t)-1, "n=%zu float32 op %d: element %zu", N, op, i);
            } else {
                memcpy(want, ha, N * 2);
                if (op == 0) kvps_reduce_into(want, hb, N, t, KVPS_SUM);
                for (size_t i = 0; op && i < N; i++) {
                    float v = (op == 1 ? (dt == 1 ? kvps_f16_to_f32(hb[i]) : kvps_bf16_to_f32(hb[i]))
                                       : (dt == 1 ? kvps_f16_to_f32(ha[i]) : kvps_bf16_to_f32(ha[i]))) *
                              (op == 1 ? 0.375f : -3.0f);
                    want[i] = dt == 1 ? kvps_f32_to_f16(v) : kvps_f32_to_bf16(v);
                }
                if (!d2h(hg, d_a, N * 2)) goto out;
                size_t bad = (size_t)-1;
                for (size_t i = 0; i < N && bad == (size_t)-1; i++)
                    if (hg[i] != want[i] && !((hg[i] & 0x7fff) > (dt == 1 ? 0x7c00 : 0x7f80) &&
                                              (want[i] & 0x7fff) > (dt == 1 ? 0x7c00 : 0x7f80)))
                        bad = i;
                KT_CHECK(bad == (size_t)-1, "n=%zu dt %d op %d: element %zu: 0x%04x, CPU 0x%04x", N, dt, op, bad,
                         hg[bad == (size_t)-1 ? 0 : bad], want[bad == (size_t)-1 ? 0 : bad]);
            }
        }
    }
out:
    dfree(d_a); dfree(d_b);
    free(a); free(b); free(fa); free(fb); free(ha); free(hb); free(hg); free(want);
}

static void test_sum_scale(void) { sum_scale_run(100003); }

/* ---- sizes 0, 1, odd and 2^24 + 3 (counts and indices past float's exact integers) for every
   kernel: the encoders and decoders of each codec, top-k with sparse and tied inputs, sum and
   scale ---- */
static void test_sizes(void) {
    static const codec_case cases[] = {
        {"none", KVPS_CODEC_NONE, 0, 0, 0, 0},
        {"fp16", KVPS_CODEC_FP16, 0, 0, 0, 0},
        {"bf16", KVPS_CODEC_BF16, 0, 0, 0, 0},
        {"topk 0.1%", KVPS_CODEC_TOPK, 0.001, 0, 0, 0},
        {"topk fp16 values", KVPS_CODEC_TOPK, 0.0005, 0, 1, 0},
        {"sign 256", KVPS_CODEC_SIGN, 0, 0, 0, 0},
        {"sign 100", KVPS_CODEC_SIGN, 0, 0, 0, 100},
    };
    const size_t big = ((size_t)1 << 24) + 3;
    const size_t small[] = {0, 1, 3}, large[] = {big};
    static const int all[] = {0, 1, 2, 3, 4, KIND_NAN}, hard[] = {3, 4, KIND_NAN}, sparse[] = {2, 4};
    size_t nc = sizeof cases / sizeof *cases;
    encode_decode_run(cases, nc, small, 3, all, 6);
    topk_run(small, 3, all, 6);
    for (size_t i = 0; i < 3; i++) sum_scale_run(small[i]);
    if (kt_quick()) return;
    encode_decode_run(cases, nc, large, 1, hard, 3);
    topk_run(large, 1, sparse, 2);
    sum_scale_run(big);
}

/* ---- NCCL: a team of threads, one per rank, bootstrapped over kvps rings on inproc ---- */
typedef struct team team;
typedef struct member {
    team *t;
    int rank;
    int fails;
    char why[600];
} member;
struct team {
    int size;
    void *ctx;
    char peers[2048];
    void (*fn)(member *m, kvps_gpu_comm *c, kvps_ring *r);
    int timeout_ms;
    member m[16];
};

#define M_CHECK(m, cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if (!(m)->fails++) snprintf((m)->why, sizeof (m)->why, __VA_ARGS__);                   \
        }                                                                                          \
    } while (0)

static void *member_thread(void *p) {
    member *m = (member *)p;
    kvps_ring *r = NULL;
    kvps_gpu_comm *c = NULL;
    kvps_result rc = kvps_ring_create(&(kvps_ring_desc){.rank = m->rank, .size = m->t->size, .peers = m->t->peers,
                                                        .zmq_ctx = m->t->ctx, .timeout_ms = 30000}, &r);
    M_CHECK(m, rc == KVPS_OK, "ring: %s", kvps_result_str(rc));
    if (rc == KVPS_OK) {
        rc = kvps_gpu_comm_create(&(kvps_gpu_comm_desc){.rank = m->rank, .size = m->t->size, .ring = r,
                                                        .device = m->rank, .timeout_ms = m->t->timeout_ms}, &c);
        M_CHECK(m, rc == KVPS_OK, "comm: %s (%s)", kvps_result_str(rc), kvps_gpu_last_error());
    }
    if (rc == KVPS_OK) {
        if (cudaSetDevice(m->rank) != cudaSuccess) M_CHECK(m, 0, "cudaSetDevice");
        else m->t->fn(m, c, r);
    }
    kvps_gpu_comm_destroy(&c);
    kvps_ring_destroy(&r);
    return NULL;
}

static void team_run(team *t, int size, void (*fn)(member *, kvps_gpu_comm *, kvps_ring *), int timeout_ms) {
    static int seq;
    t->size = size;
    t->fn = fn;
    t->timeout_ms = timeout_ms;
    t->ctx = zmq_ctx_new();
    t->peers[0] = 0;
    for (int i = 0; i < size; i++)
        snprintf(t->peers + strlen(t->peers), sizeof t->peers - strlen(t->peers), "%sinproc://gpu-team-%d-%d",
                 i ? "," : "", seq, i);
    seq++;
    pthread_t th[16];
    for (int i = 0; i < size; i++) {
        memset(&t->m[i], 0, sizeof t->m[i]);
        t->m[i].t = t;
        t->m[i].rank = i;
        pthread_create(&th[i], NULL, member_thread, &t->m[i]);
    }
    for (int i = 0; i < size; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < size; i++)
        KT_CHECK(t->m[i].fails == 0, "size %d rank %d: %d failures; first: %s", size, i, t->m[i].fails, t->m[i].why);
    zmq_ctx_term(t->ctx);
}

/* rank r's element i: a small integer, so every sum is exact in fp32, fp16 and bf16 */
static float val_of(int r, size_t i) { return (float)((int)((i * 3 + (size_t)r * 7) % 9) - 4); }

static void store(void *h, size_t i, kvps_dtype dt, float v) {
    if (dt == KVPS_FLOAT32) ((float *)h)[i] = v;
    else ((uint16_t *)h)[i] = dt == KVPS_FLOAT16 ? kvps_f32_to_f16(v) : kvps_f32_to_bf16(v);
}
static float load(const void *h, size_t i, kvps_dtype dt) {
    if (dt == KVPS_FLOAT32) return ((const float *)h)[i];
    uint16_t u = ((const uint16_t *)h)[i];
    return dt == KVPS_FLOAT16 ? kvps_f16_to_f32(u) : kvps_bf16_to_f32(u);
}

static void collectives(member *m, kvps_gpu_comm *c, kvps_ring *r) {
    (void)r;
    const int P = m->t->size, me = m->rank;
    const size_t count = 100003; /* per rank where cut by rank */
    cudaStream_t st;
    if (cudaStreamCreate(&st) != cudaSuccess) { M_CHECK(m, 0, "cudaStreamCreate"); return; }
    size_t big = count * (size_t)P;
    void *h = malloc(big * 4), *d_s = NULL, *d_r = NULL;
    if (cudaMalloc(&d_s, big * 4) != cudaSuccess || cudaMalloc(&d_r, big * 4) != cudaSuccess || !h) {
        M_CHECK(m, 0, "allocation");
        goto out;
    }
    for (int dti = 0; dti < 3; dti++) {
        kvps_dtype dt = dti == 0 ? KVPS_FLOAT32 : dti == 1 ? KVPS_FLOAT16 : KVPS_BFLOAT16;
        size_t es = dti ? 2 : 4;
        for (int coll = 0; coll < 5; coll++) { /* allreduce, in-place allreduce, reduce-scatter, allgather, broadcast */
            size_t in_n = coll == 2 ? big : count, out_n = coll == 3 ? big : count;
            for (size_t i = 0; i < in_n; i++) store(h, i, dt, val_of(me, i));
            if (cudaMemcpy(d_s, h, in_n * es, cudaMemcpyHostToDevice) != cudaSuccess) { M_CHECK(m, 0, "H2D"); goto out; }
            if (coll == 1 && cudaMemcpy(d_r, h, in_n * es, cudaMemcpyHostToDevice) != cudaSuccess) { M_CHECK(m, 0, "H2D"); goto out; }
            kvps_result rc = KVPS_OK;
            switch (coll) {
            case 0: rc = kvps_gpu_allreduce(c, d_s, d_r, count, dt, KVPS_SUM, st); break;
            case 1: rc = kvps_gpu_allreduce(c, NULL, d_r, count, dt, KVPS_SUM, st); break;
            case 2: rc = kvps_gpu_reduce_scatter(c, d_s, d_r, count, dt, KVPS_SUM, st); break;
            case 3: rc = kvps_gpu_allgather(c, d_s, d_r, count, dt, st); break;
            case 4: rc = kvps_gpu_broadcast(c, d_s, d_r, count, dt, P - 1, st); break;
            }
            M_CHECK(m, rc == KVPS_OK, "dt %d coll %d: %s (%s)", dti, coll, kvps_result_str(rc), kvps_gpu_last_error());
            if (rc == KVPS_OK) rc = kvps_gpu_comm_wait(c, st, -1);
            M_CHECK(m, rc == KVPS_OK, "dt %d coll %d wait: %s (%s)", dti, coll, kvps_result_str(rc), kvps_gpu_last_error());
            if (rc != KVPS_OK) goto out;
            if (cudaMemcpy(h, d_r, out_n * es, cudaMemcpyDeviceToHost) != cudaSuccess) { M_CHECK(m, 0, "D2H"); goto out; }
            for (size_t i = 0; i < out_n; i++) {
                double want = 0;
                if (coll <= 1) for (int q = 0; q < P; q++) want += val_of(q, i);
                else if (coll == 2) for (int q = 0; q < P; q++) want += val_of(q, (size_t)me * count + i);
                else if (coll == 3) want = val_of((int)(i / count), i % count);
                else want = val_of(P - 1, i);
                double got = load(h, i, dt);
                if (got != want) { M_CHECK(m, 0, "dt %d coll %d: element %zu = %g, want %g", dti, coll, i, got, want); break; }
            }
        }
    }
    /* average and max of float32, in place */
    for (size_t i = 0; i < count; i++) ((float *)h)[i] = (float)(me + 1) * 4.0f;
    if (cudaMemcpy(d_r, h, count * 4, cudaMemcpyHostToDevice) == cudaSuccess) {
        kvps_result rc = kvps_gpu_allreduce(c, d_r, d_r, count, KVPS_FLOAT32, KVPS_MAX, st);
        if (rc == KVPS_OK) rc = kvps_gpu_comm_wait(c, st, -1);
        M_CHECK(m, rc == KVPS_OK, "max: %s", kvps_result_str(rc));
        float got = 0;
        cudaMemcpy(&got, (float *)d_r + 7, 4, cudaMemcpyDeviceToHost);
        M_CHECK(m, got == (float)P * 4.0f, "max = %g, want %g", got, (double)P * 4.0);
    }
    M_CHECK(m, kvps_gpu_comm_check(c) == KVPS_OK, "check");
out:
    cudaFree(d_s);
    cudaFree(d_r);
    cudaStreamDestroy(st);
    free(h);
}

static void test_nccl_collectives(void) {
    team t;
    int sizes[2] = {1, ndev > 16 ? 16 : ndev};
    for (int i = 0; i < (sizes[1] > 1 ? 2 : 1); i++) team_run(&t, sizes[i], collectives, 60000);
}

/* One thread drives all GPUs: kvps_gpu_comm_create_local and group calls. */
static void test_nccl_local_group(void) {
    int n = ndev > 16 ? 16 : ndev;
    const size_t count = 4099;
    kvps_gpu_comm *cs[16] = {0};
    float *d[16] = {0};
    float h[4099];
    kvps_result rc = kvps_gpu_comm_create_local(NULL, n, 60000, cs);
    KT_CHECK(rc == KVPS_OK, "create_local(%d): %s (%s)", n, kvps_result_str(rc), kvps_gpu_last_error());
    if (rc != KVPS_OK) return;
    for (int i = 0; i < n; i++) {
        KT_CHECK(kvps_gpu_comm_rank(cs[i]) == i && kvps_gpu_comm_size(cs[i]) == n && kvps_gpu_comm_device(cs[i]) == i,
                 "comm %d identity", i);
        cudaSetDevice(i);
        for (size_t e = 0; e < count; e++) h[e] = val_of(i, e);
        if (cudaMalloc((void **)&d[i], count * 4) != cudaSuccess || !h2d(d[i], h, count * 4)) { KT_CHECK(0, "alloc"); goto out; }
    }
    KT_OK(kvps_gpu_group_start());
    for (int i = 0; i < n; i++) KT_OK(kvps_gpu_allreduce(cs[i], d[i], d[i], count, KVPS_FLOAT32, KVPS_SUM, NULL));
    rc = kvps_gpu_group_end(cs, n);
    KT_CHECK(rc == KVPS_OK, "group_end: %s (%s)", kvps_result_str(rc), kvps_gpu_last_error());
    for (int i = 0; i < n && rc == KVPS_OK; i++) {
        KT_OK(kvps_gpu_comm_wait(cs[i], NULL, -1));
        cudaSetDevice(i);
        if (!d2h(h, d[i], count * 4)) break;
        for (size_t e = 0; e < count; e++) {
            double want = 0;
            for (int q = 0; q < n; q++) want += val_of(q, e);
            if (h[e] != want) { KT_CHECK(0, "gpu %d element %zu: %g, want %g", i, e, (double)h[e], want); break; }
        }
    }
out:
    for (int i = 0; i < n; i++) { cudaSetDevice(i); dfree(d[i]); }
    cudaSetDevice(0);
    for (int i = 0; i < n; i++) kvps_gpu_comm_destroy(&cs[i]);
}

/* Rank 1 never joins the all-reduce: rank 0's wait times out within its deadline, the
   communicator is aborted and says so, and later calls are KVPS_ERR_STATE. Needs 2 GPUs. */
static void missing_rank(member *m, kvps_gpu_comm *c, kvps_ring *r) {
    float *d = NULL;
    if (cudaMalloc((void **)&d, 1024 * 4) != cudaSuccess) { M_CHECK(m, 0, "cudaMalloc"); return; }
    cudaMemset(d, 0, 1024 * 4);
    if (m->rank == 0) {
        int64_t t0 = kvps__now_ms();
        kvps_result rc = kvps_gpu_allreduce(c, d, d, 1024, KVPS_FLOAT32, KVPS_SUM, NULL);
        if (rc == KVPS_OK) rc = kvps_gpu_comm_wait(c, NULL, 1000);
        int64_t dt = kvps__now_ms() - t0;
        M_CHECK(m, rc == KVPS_ERR_TIMEOUT, "wait: %s (%s)", kvps_result_str(rc), kvps_gpu_last_error());
        M_CHECK(m, dt < 5000, "took %lld ms", (long long)dt);
        M_CHECK(m, strstr(kvps_gpu_comm_last_error(c), "aborted") != NULL, "message '%s'", kvps_gpu_comm_last_error(c));
        M_CHECK(m, kvps_gpu_comm_nccl(c) == NULL, "still an ncclComm");
        M_CHECK(m, kvps_gpu_allreduce(c, d, d, 1024, KVPS_FLOAT32, KVPS_SUM, NULL) == KVPS_ERR_STATE, "after abort");
        M_CHECK(m, kvps_gpu_comm_wait(c, NULL, 10) == KVPS_ERR_STATE, "wait after abort");
    }
    kvps_ring_barrier(r); /* rank 1 leaves only now; its destroy is bounded by its timeout */
    cudaFree(d);
}

static void test_nccl_timeout_aborts(void) {
    if (ndev < 2) { KT_SKIP("needs 2 GPUs, %d here", ndev); return; }
    team t;
    team_run(&t, 2, missing_rank, 3000);
}

/* ---- the hierarchical step: M machines x L GPUs, kvps servers with KVPS_UPDATE_ACCUMULATE ---- */
typedef struct gpuhier {
    int m, l, M, L, dev;
    const char *servers;
    void *ctx;
    char peers[1024]; /* the machine's local ring */
    size_t count, piece;
    float *out;       /* steps x count */
    kvps_result rc;
    char why[600];
} gpuhier;

static float hgrad(int m, int l, int s, size_t i) { return (float)((int)((i * 5 + (size_t)m * 11 + (size_t)l * 3 + (size_t)s) % 17) - 8); }

static void *gpuhier_thread(void *p) {
    gpuhier *x = (gpuhier *)p;
    kvps_ring *lr = NULL;
    kvps_gpu_comm *c = NULL;
    kvps_worker *w = NULL;
    kvps_gpu_hier *h = NULL;
    float *d_g = NULL, *hg = malloc(x->count * 4);
    cudaStream_t st = NULL;
    cudaSetDevice(x->dev);
    x->rc = cudaStreamCreate(&st) == cudaSuccess && cudaMalloc((void **)&d_g, x->count * 4) == cudaSuccess ? KVPS_OK
                                                                                                            : KVPS_ERR_GPU;
    if (x->rc == KVPS_OK)
        x->rc = kvps_ring_create(&(kvps_ring_desc){.rank = x->l, .size = x->L, .peers = x->peers, .zmq_ctx = x->ctx}, &lr);
    if (x->rc == KVPS_OK)
        x->rc = kvps_gpu_comm_create(&(kvps_gpu_comm_desc){.rank = x->l, .size = x->L, .ring = lr, .device = x->dev}, &c);
    if (x->rc == KVPS_OK)
        x->rc = kvps_worker_create(&(kvps_worker_desc){.servers = x->servers, .rank = x->m, .num_workers = x->M,
                                                       .zmq_ctx = x->ctx}, &w);
    if (x->rc == KVPS_OK)
        x->rc = kvps_gpu_hier_create(&(kvps_gpu_hier_desc){.local = c, .worker = w, .name = "hg", .count = x->count,
                                                           .piece = x->piece, .scale = 0.5f}, &h);
    for (int s = 0; s < 2 && x->rc == KVPS_OK; s++) {
        for (size_t i = 0; i < x->count; i++) hg[i] = hgrad(x->m, x->l, s, i);
        if (cudaMemcpy(d_g, hg, x->count * 4, cudaMemcpyHostToDevice) != cudaSuccess) { x->rc = KVPS_ERR_GPU; break; }
        x->rc = kvps_gpu_hier_step(h, d_g, d_g, st); /* in place */
        if (x->rc == KVPS_OK) x->rc = kvps_gpu_comm_wait(c, st, -1);
        if (x->rc == KVPS_OK && cudaMemcpy(x->out + (size_t)s * x->count, d_g, x->count * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
            x->rc = KVPS_ERR_GPU;
    }
    if (x->rc != KVPS_OK) snprintf(x->why, sizeof x->why, "%s", h ? kvps_gpu_hier_last_error(h) : kvps_gpu_last_error());
    kvps_worker_destroy(&w);
    kvps_gpu_hier_destroy(&h);
    kvps_gpu_comm_destroy(&c);
    kvps_ring_destroy(&lr);
    cudaFree(d_g);
    if (st) cudaStreamDestroy(st);
    free(hg);
    return NULL;
}

static void hier_run(int M, int L, size_t count, size_t piece) {
    static int seq;
    kt_cluster cl;
    if (kt_cluster_up(&cl, "inproc", 2, &(kvps_server_desc){.num_workers = M, .update = KVPS_UPDATE_ACCUMULATE}) != 0) {
        KT_CHECK(0, "cluster");
        return;
    }
    gpuhier xs[16];
    pthread_t th[16];
    for (int m = 0; m < M; m++)
        for (int l = 0; l < L; l++) {
            gpuhier *x = &xs[m * L + l];
            memset(x, 0, sizeof *x);
            x->m = m; x->l = l; x->M = M; x->L = L; x->dev = (m * L + l) % ndev;
            x->servers = cl.servers; x->ctx = cl.ctx; x->count = count; x->piece = piece;
            for (int q = 0; q < L; q++)
                snprintf(x->peers + strlen(x->peers), sizeof x->peers - strlen(x->peers), "%sinproc://gpu-hier-%d-%d-%d",
                         q ? "," : "", seq, m, q);
            x->out = malloc(count * 2 * 4);
        }
    seq++;
    for (int i = 0; i < M * L; i++) pthread_create(&th[i], NULL, gpuhier_thread, &xs[i]);
    for (int i = 0; i < M * L; i++) pthread_join(th[i], NULL);
    int bad = 0;
    for (int i = 0; i < M * L && !bad; i++) {
        KT_CHECK(xs[i].rc == KVPS_OK, "M=%d L=%d machine %d gpu %d: %s: %s", M, L, xs[i].m, xs[i].l,
                 kvps_result_str(xs[i].rc), xs[i].why);
        if (xs[i].rc != KVPS_OK) { bad = 1; break; }
        for (int s = 0; s < 2 && !bad; s++)
            for (size_t e = 0; e < count; e++) { /* SUM accumulates the rounds: value += round's sum */
                double want = 0;
                for (int t = 0; t <= s; t++)
                    for (int m = 0; m < M; m++)
                        for (int l = 0; l < L; l++) want += 0.5 * hgrad(m, l, t, e);
                if ((double)xs[i].out[(size_t)s * count + e] != want) {
                    KT_CHECK(0, "M=%d L=%d gpu %d step %d element %zu: %g, want %g", M, L, i, s, e,
                             (double)xs[i].out[(size_t)s * count + e], want);
                    bad = 1;
                    break;
                }
            }
    }
    for (int i = 0; i < M * L; i++) free(xs[i].out);
    kt_cluster_down(&cl);
}

static void test_hier_step(void) {
    int L = ndev > 8 ? 8 : ndev;
    hier_run(1, 1, 100003, 10000);         /* one GPU, 11 pieces */
    hier_run(2, 1, 4097, 0);               /* two "machines" of one GPU each (may share a device) */
    if (L > 1) hier_run(1, L, 100003, 7777); /* all GPUs in one machine; count not divisible by L */
    if (ndev >= 4) hier_run(2, ndev / 2 > 8 ? 8 : ndev / 2, 65537, 5000);
}

int main(void) {
    /* the list of device tests, for the skip line */
    static const char *const tests[] = {"pack_unpack_exhaustive", "encode_decode_vs_cpu", "decode_malformed", "topk",
                                        "sum_scale", "sizes", "nccl_collectives", "nccl_local_group", "nccl_timeout_aborts",
                                        "hier_step"};
    kvps_log_set_level(KVPS_LOG_NONE);
    if (kvps_gpu_device_count(&ndev) != KVPS_OK) {
        printf("skipped: no CUDA device\n");
        printf("0 passed, 0 failed, %d skipped\n", (int)(sizeof tests / sizeof *tests));
        return 0;
    }
    cudaSetDevice(0);
    KT_RUN(test_pack_unpack_exhaustive);
    KT_RUN(test_encode_decode_vs_cpu);
    KT_RUN(test_decode_malformed);
    KT_RUN(test_topk);
    KT_RUN(test_sum_scale);
    KT_RUN(test_sizes);
    KT_RUN(test_nccl_collectives);
    KT_RUN(test_nccl_local_group);
    KT_RUN(test_nccl_timeout_aborts);
    KT_RUN(test_hier_step);
    return kt_finish();
}
