/* bench_compress - codec throughput in GB/s of float32 input (encode and decode), one thread,
   next to memcpy of the same bytes measured in the same run.
   usage: bench_compress [--mb 64] [--reps 5] [--isa auto|portable|avx2|avx512]
   Output: one line per codec:  codec  enc GB/s (x memcpy)  dec GB/s (x memcpy)  ratio
   Input: uniform random floats; the "sparse" rows take a gradient with one non-zero in 2000
   (fewer than top-k's k: no sampled threshold fits, so top-k selects exactly over all of it). */
#define KVPS_IMPLEMENTATION
#include "kvps_codec.h"
#include "bench/bench_cpu.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

int main(int argc, char **argv) {
    size_t mb = 64;
    int reps = 5;
    kvps_isa isa = KVPS_ISA_AUTO;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *s = argv[++i];
            isa = !strcmp(s, "portable") ? KVPS_ISA_PORTABLE : !strcmp(s, "avx2") ? KVPS_ISA_AVX2 : !strcmp(s, "avx512") ? KVPS_ISA_AVX512 : KVPS_ISA_AUTO;
        } else {
            fprintf(stderr, "usage: %s [--mb MB] [--reps N] [--isa auto|portable|avx2|avx512]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > 100) reps = 5;
    static const char *isa_names[] = {"portable", "avx2+f16c", "avx512"};
    int used = kvps_isa_set(isa);
    size_t n = mb * (1u << 20) / 4;
    float *x = (float *)malloc(n * 4), *y = (float *)malloc(n * 4), *res = (float *)malloc(n * 4);
    uint64_t s = 1;
    for (size_t i = 0; i < n; i++) { s = s * 6364136223846793005ull + 1442695040888963407ull; x[i] = (float)((int64_t)(s >> 11) % 2000000) * 1e-6f; }
    float *xs = (float *)calloc(n, 4); /* sparse: 1 in 2000 non-zero */
    for (size_t i = 0; i < n; i += 2000) xs[i] = x[i] + 1.0f;
    memset(y, 0, n * 4);
    memset(res, 0, n * 4);
    struct { const char *name; kvps_codec_id id; double frac; int ef, sparse; } cs[] = {
        {"fp16", KVPS_CODEC_FP16, 0, 0, 0}, {"bf16", KVPS_CODEC_BF16, 0, 0, 0},
        {"topk 1%", KVPS_CODEC_TOPK, 0.01, 0, 0}, {"topk 0.1%", KVPS_CODEC_TOPK, 0.001, 0, 0},
        {"sign 1-bit", KVPS_CODEC_SIGN, 0, 0, 0},
        {"fp16 +EF", KVPS_CODEC_FP16, 0, 1, 0}, {"topk 1% +EF", KVPS_CODEC_TOPK, 0.01, 1, 0},
        {"topk 0.1% +EF", KVPS_CODEC_TOPK, 0.001, 1, 0}, {"sign 1-bit +EF", KVPS_CODEC_SIGN, 0, 1, 0},
        {"topk 1% sparse", KVPS_CODEC_TOPK, 0.01, 0, 1}, {"topk 1% sp +EF", KVPS_CODEC_TOPK, 0.01, 1, 1},
    };
    size_t cap = 0;
    for (size_t c = 0; c < sizeof cs / sizeof *cs; c++) {
        kvps_codec cd = kvps_codec_get(cs[c].id);
        cd.topk_fraction = cs[c].frac;
        size_t b = kvps_codec_max_bytes(&cd, n);
        if (b > cap) cap = b;
    }
    unsigned char *buf = (unsigned char *)malloc(cap);
    memset(buf, 0, cap);
    double *t = (double *)malloc((size_t)reps * sizeof *t);
    /* memcpy of the same bytes, same buffers */
    for (int r = 0; r < reps; r++) { double t0 = now_s(); memcpy(y, x, n * 4); t[r] = now_s() - t0; }
    qsort(t, (size_t)reps, sizeof *t, cmp_d);
    double mc = (double)n * 4 / t[reps / 2] / 1e9;
    bench_machine(stdout, kvps_isa_set(KVPS_ISA_AUTO));
    printf("# bench_compress: %zu MB of float32, one thread, median of %d, path %s\n", mb, reps, isa_names[used]);
    printf("# GB/s = float32 bytes in (encode) or out (decode) per second; (x) = ratio to memcpy\n");
    printf("%-16s %9s %20s %20s %10s\n", "codec", "bytes", "encode GB/s", "decode GB/s", "ratio");
    printf("%-16s %9zu %12.2f (1.00x) %12.2f (1.00x) %10s\n", "memcpy", n * 4, mc, mc, "1.0");
    for (size_t c = 0; c < sizeof cs / sizeof *cs; c++) {
        kvps_codec cd = kvps_codec_get(cs[c].id);
        cd.topk_fraction = cs[c].frac;
        size_t bytes = 0;
        kvps_result rc = KVPS_OK;
        memset(res, 0, n * 4); /* each codec's error feedback starts from zero */
        for (int r = 0; r < reps && rc == KVPS_OK; r++) {
            double t0 = now_s();
            rc = kvps_codec_encode(&cd, cs[c].sparse ? xs : x, n, cs[c].ef ? res : NULL, buf, cap, &bytes);
            t[r] = now_s() - t0;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_d);
        double enc = (double)n * 4 / t[reps / 2] / 1e9;
        for (int r = 0; r < reps && rc == KVPS_OK; r++) {
            double t0 = now_s();
            rc = kvps_codec_decode(&cd, buf, bytes, y, n, 0);
            t[r] = now_s() - t0;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_d);
        double dec = (double)n * 4 / t[reps / 2] / 1e9;
        if (rc != KVPS_OK) { printf("%-16s error %s\n", cs[c].name, kvps_result_str(rc)); continue; }
        printf("%-16s %9zu %12.2f (%.2fx) %12.2f (%.2fx) %9.1fx\n", cs[c].name, bytes, enc, enc / mc, dec, dec / mc,
               (double)n * 4 / (double)bytes);
    }
    free(x); free(xs); free(y); free(res); free(buf); free(t);
    return 0;
}
