/* Codecs against independent oracles: exhaustive enumeration of 16-bit values and of all 2^32
   float bit patterns (fast path vs scalar path, and F16C hardware where present), top-k
   against a full sort, error feedback conservation, malformed payloads. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h"
#include <math.h>

static int is_nan16(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }

static void test_half_roundtrip_all_65536(void) {
    int bad16 = 0, badb = 0, badn = 0;
    static uint16_t h[65536], back[65536];
    static float f[65536];
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    for (int isa = KVPS_ISA_PORTABLE; isa <= KVPS_ISA_AVX512; isa++) {
        kvps_isa_set((kvps_isa)isa);
        kvps_f16_to_f32_n(f, h, 65536);
        kvps_f32_to_f16_n(back, f, 65536);
        for (uint32_t i = 0; i < 65536; i++) {
            bad16 += back[i] != h[i];
            /* scalar agrees with bulk */
            float s = kvps_f16_to_f32(h[i]);
            badn += memcmp(&s, &f[i], 4) != 0;
            /* value check against double arithmetic for finite halves */
            if ((h[i] & 0x7c00) != 0x7c00) {
                int e = (h[i] >> 10) & 31, m = h[i] & 0x3ff;
                double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
                if (h[i] & 0x8000) v = -v;
                badn += (double)f[i] != v || (v == 0 && !!signbit(f[i]) != !!(h[i] & 0x8000));
            } else {
                badn += is_nan16(h[i]) ? !isnan(f[i]) : !isinf(f[i]);
            }
        }
        kvps_bf16_to_f32_n(f, h, 65536);
        kvps_f32_to_bf16_n(back, f, 65536);
        for (uint32_t i = 0; i < 65536; i++) {
            uint32_t u;
            memcpy(&u, &f[i], 4);
            badb += back[i] != h[i] || u != (uint32_t)h[i] << 16;
        }
    }
    kvps_isa_set(KVPS_ISA_AUTO);
    KT_CHECK(bad16 == 0, "%d fp16 values changed on the round trip", bad16);
    KT_CHECK(badb == 0, "%d bf16 values changed on the round trip", badb);
    KT_CHECK(badn == 0, "%d fp16 decodes differ from the exact value", badn);
}

/* Every float bit pattern through the fast path(s) equals the scalar path; where the CPU has
   F16C, non-NaN results also equal the hardware instruction (an independent oracle). */
static uint16_t hw_f16(float f);
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("f16c"))) static uint16_t hw_f16(float f) {
    return (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0);
}
#else
static uint16_t hw_f16(float f) { return kvps_f32_to_f16(f); }
#endif

static void test_all_2_32_floats(void) {
    enum { B = 1 << 16 };
    static float in[B];
    static uint16_t fast[B], fastb[B];
    uint64_t bad = 0, badb = 0, badhw = 0;
    int have_hw = kvps_isa_set(KVPS_ISA_AUTO) >= KVPS_ISA_AVX2;
    int best = kvps_isa_set(KVPS_ISA_AUTO);
    uint64_t step = kt_quick() ? 257 : 1; /* quick: every 257th block (sanitizers, valgrind) */
    for (uint64_t base = 0; base < (1ull << 32); base += (uint64_t)B * step) {
        for (uint32_t i = 0; i < B; i++) { uint32_t u = (uint32_t)(base + i); memcpy(&in[i], &u, 4); }
        for (int isa = KVPS_ISA_AVX2; isa <= best; isa++) {
            kvps_isa_set((kvps_isa)isa);
            kvps_f32_to_f16_n(fast, in, B);
            kvps_f32_to_bf16_n(fastb, in, B);
            for (uint32_t i = 0; i < B; i++) {
                bad += fast[i] != kvps_f32_to_f16(in[i]);
                badb += fastb[i] != kvps_f32_to_bf16(in[i]);
            }
        }
        if (have_hw) {
            for (uint32_t i = 0; i < B; i++) {
                if (!isnan(in[i])) badhw += hw_f16(in[i]) != kvps_f32_to_f16(in[i]);
                else badhw += !is_nan16(kvps_f32_to_f16(in[i]));
            }
        }
    }
    kvps_isa_set(KVPS_ISA_AUTO);
    KT_CHECK(bad == 0, "%llu float patterns convert to fp16 differently on the fast path", (unsigned long long)bad);
    KT_CHECK(badb == 0, "%llu float patterns convert to bf16 differently on the fast path", (unsigned long long)badb);
    KT_CHECK(badhw == 0, "%llu float patterns differ from the F16C instruction", (unsigned long long)badhw);
    if (!have_hw) printf("  note: no AVX2/F16C on this CPU: fast path = portable path\n");
}

/* Oracle: full sort by (magnitude desc, index asc), first k, by index. */
static const float *g_x;
static int cmp_mag(const void *a, const void *b) {
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b, mi, mj;
    memcpy(&mi, &g_x[i], 4);
    memcpy(&mj, &g_x[j], 4);
    mi &= 0x7fffffff;
    mj &= 0x7fffffff;
    if (mi != mj) return mi > mj ? -1 : 1;
    return i < j ? -1 : 1;
}
static int cmp_u32v(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static int check_topk(const float *x, size_t n, size_t k, const char *what) {
    uint32_t *idx = (uint32_t *)malloc((k + 1) * 4), *ref = (uint32_t *)malloc((n + 1) * 4);
    float *val = (float *)malloc((k + 1) * 4);
    for (size_t i = 0; i < n; i++) ref[i] = (uint32_t)i;
    g_x = x;
    qsort(ref, n, 4, cmp_mag);
    qsort(ref, k, 4, cmp_u32v);
    kvps_result rc = kvps_topk(x, n, k, idx, val);
    int bad = rc != KVPS_OK;
    for (size_t j = 0; !bad && j < k; j++) bad |= idx[j] != ref[j] || memcmp(&val[j], &x[idx[j]], 4) != 0;
    if (bad) printf("  top-k %s n=%zu k=%zu: %s, first idx %u vs %u\n", what, n, k, kvps_result_str(rc), k ? idx[0] : 0, k ? ref[0] : 0);
    free(idx); free(ref); free(val);
    return bad;
}

static void test_topk_against_full_sort(void) {
    size_t ns[] = {1, 2, 7, 100, 1000, 65537, 300000};
    uint64_t seed = 7;
    int bad = 0;
    for (int isa = KVPS_ISA_PORTABLE; isa <= KVPS_ISA_AVX512; isa++) {
        kvps_isa_set((kvps_isa)isa);
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
            size_t n = ns[a];
            float *x = (float *)malloc(n * 4);
            size_t ks[] = {0, 1, n / 1000, n / 100, n / 3, n - 1, n};
            for (int kind = 0; kind < 6; kind++) {
                for (size_t i = 0; i < n; i++) {
                    float v = kt_randf(&seed);
                    switch (kind) {
                    case 0: x[i] = v; break;                              /* random */
                    case 1: x[i] = 0.5f; break;                           /* constant: ties by index */
                    case 2: x[i] = 0.0f * v; break;                       /* all zero, signed */
                    case 3: x[i] = (i % 17 == 3) ? NAN : v; break;        /* NaN-containing */
                    case 4: x[i] = v * 1e-42f; break;                     /* tiny (subnormal) */
                    case 5: x[i] = (float)((int)(v * 4)); break;          /* few distinct values */
                    }
                }
                static const char *names[] = {"random", "constant", "zero", "nan", "tiny", "ties"};
                for (size_t b = 0; b < sizeof ks / sizeof *ks; b++) bad += check_topk(x, n, ks[b], names[kind]);
            }
            free(x);
        }
    }
    kvps_isa_set(KVPS_ISA_AUTO);
    KT_CHECK(bad == 0, "%d top-k results differ from the full sort", bad);
    uint32_t i1;
    float v1, one = 1;
    KT_CHECK(kvps_topk(&one, 1, 2, &i1, &v1) == KVPS_ERR_INVALID_ARG, "k > n is rejected");
}

/* Error feedback: over many steps, (sum of decoded) + residual == sum of inputs. Inputs and
   codecs are chosen so that float arithmetic is exact (small dyadic values), making the
   invariant exact rather than approximate. */
static void test_error_feedback_conserves(void) {
    kvps_codec_id ids[] = {KVPS_CODEC_TOPK, KVPS_CODEC_FP16, KVPS_CODEC_BF16, KVPS_CODEC_SIGN};
    enum { N = 1000, STEPS = 50 };
    for (size_t c = 0; c < sizeof ids / sizeof *ids; c++) {
        kvps_codec cd = kvps_codec_get(ids[c]);
        cd.topk_fraction = 0.05;
        cd.sign_chunk = 64;
        static float x[N], r[N], dec[N], sum_in[N], sum_out[N];
        memset(r, 0, sizeof r);
        memset(sum_in, 0, sizeof sum_in);
        memset(sum_out, 0, sizeof sum_out);
        size_t cap = kvps_codec_max_bytes(&cd, N);
        unsigned char *buf = (unsigned char *)malloc(cap);
        uint64_t seed = 99;
        int ok = 1;
        for (int s = 0; s < STEPS && ok; s++) {
            for (int i = 0; i < N; i++) {
                /* multiples of 2^-8 in [-4, 4): sums stay exact in float */
                x[i] = (float)((int)(kt_randf(&seed) * 1024)) / 256.0f;
                sum_in[i] += x[i];
            }
            size_t bytes = 0;
            ok &= kvps_codec_encode(&cd, x, N, r, buf, cap, &bytes) == KVPS_OK;
            ok &= kvps_codec_decode(&cd, buf, bytes, dec, N, 0) == KVPS_OK;
            for (int i = 0; i < N; i++) sum_out[i] += dec[i];
        }
        double worst = 0;
        for (int i = 0; i < N; i++) {
            double d = fabs((double)sum_out[i] + (double)r[i] - (double)sum_in[i]);
            if (d > worst) worst = d;
        }
        /* exact for top-k and the 16-bit formats on these inputs; 1-bit scales are means (not
           exact), so its bound is float rounding of the running sums */
        double tol = ids[c] == KVPS_CODEC_SIGN ? 1e-3 : 0.0;
        KT_CHECK(ok && worst <= tol, "%s: sent + residual differs from the inputs by %g", cd.name, worst);
        free(buf);
    }
}

static void test_codec_bytes_and_roundtrip(void) {
    enum { N = 4099 };
    static float x[N], y[N];
    uint64_t seed = 5;
    for (int i = 0; i < N; i++) x[i] = kt_randf(&seed);
    kvps_codec cs[5] = {kvps_codec_get(KVPS_CODEC_NONE), kvps_codec_get(KVPS_CODEC_FP16), kvps_codec_get(KVPS_CODEC_BF16),
                        kvps_codec_get(KVPS_CODEC_TOPK), kvps_codec_get(KVPS_CODEC_SIGN)};
    size_t expect[5] = {8 + N * 4, 8 + N * 2, 8 + N * 2, 8 + 4 + 40 * 8, 8 + 4 + 17 * 4 + (N + 7) / 8};
    for (int c = 0; c < 5; c++) {
        size_t cap = kvps_codec_max_bytes(&cs[c], N), bytes = 0;
        unsigned char *buf = (unsigned char *)malloc(cap);
        KT_OK(kvps_codec_encode(&cs[c], x, N, NULL, buf, cap, &bytes));
        KT_CHECK(bytes == expect[c], "%s: %zu bytes, want %zu", cs[c].name, bytes, expect[c]);
        KT_OK(kvps_codec_decode(&cs[c], buf, bytes, y, N, 0));
        double err = 0;
        for (int i = 0; i < N; i++) err = fmax(err, fabs((double)y[i] - x[i]));
        double tol[5] = {0, 1.0 / 2048, 1.0 / 256, 1.0, 1.0};
        KT_CHECK(err <= tol[c], "%s: max error %g", cs[c].name, err);
        KT_CHECK(kvps_codec_encode(&cs[c], x, N, NULL, buf, cap - 1, &bytes) == KVPS_ERR_TOO_LARGE, "%s: small cap", cs[c].name);
        free(buf);
    }
}

static void test_malformed_payloads(void) {
    enum { N = 100 };
    float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = (float)(i - 50);
    kvps_codec tk = kvps_codec_get(KVPS_CODEC_TOPK), f16 = kvps_codec_get(KVPS_CODEC_FP16), sg = kvps_codec_get(KVPS_CODEC_SIGN);
    tk.topk_count = 5;
    unsigned char good[1024], bad[1024];
    size_t gb = 0, fb = 0, sb = 0;
    unsigned char fgood[1024], sgood[1024];
    kvps_codec_encode(&tk, x, N, NULL, good, sizeof good, &gb);
    kvps_codec_encode(&f16, x, N, NULL, fgood, sizeof fgood, &fb);
    kvps_codec_encode(&sg, x, N, NULL, sgood, sizeof sgood, &sb);
    struct { const char *name; int which; size_t off; uint32_t val; int trunc; kvps_result want; } cases[] = {
        {"topk k > n", 0, 8, 101, 0, KVPS_ERR_MALFORMED},
        {"topk index out of range", 0, 12, 100, 0, KVPS_ERR_MALFORMED},
        {"topk index repeated", 0, 16, 0xffffffff, 0, KVPS_ERR_MALFORMED}, /* set idx[1] = idx[0] below */
        {"topk truncated", 0, 0, 0, 1, KVPS_ERR_TRUNCATED},
        {"topk wrong codec id", 0, 0, 2, 0, KVPS_ERR_CODEC},
        {"topk n differs", 0, 4, 99, 0, KVPS_ERR_LEN_MISMATCH},
        {"topk unknown flag", 0, 1, 0x80, 0, KVPS_ERR_MALFORMED},
        {"fp16 truncated", 1, 0, 0, 1, KVPS_ERR_TRUNCATED},
        {"fp16 wrong codec id", 1, 0, 4, 0, KVPS_ERR_CODEC},
        {"sign chunk 0", 2, 8, 0, 0, KVPS_ERR_MALFORMED},
        {"sign truncated", 2, 0, 0, 1, KVPS_ERR_TRUNCATED},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const unsigned char *src = cases[c].which == 0 ? good : cases[c].which == 1 ? fgood : sgood;
        size_t len = cases[c].which == 0 ? gb : cases[c].which == 1 ? fb : sb;
        kvps_codec *cd = cases[c].which == 0 ? &tk : cases[c].which == 1 ? &f16 : &sg;
        memcpy(bad, src, len);
        if (cases[c].trunc) len--;
        else if (cases[c].off == 16 && cases[c].val == 0xffffffff) memcpy(bad + 16, bad + 12, 4);
        else if (cases[c].off < 2) bad[cases[c].off] = (unsigned char)cases[c].val;
        else memcpy(bad + cases[c].off, &cases[c].val, 4);
        for (int i = 0; i < N; i++) y[i] = 7.0f;
        kvps_result rc = kvps_codec_decode(cd, bad, len, y, N, 1);
        int untouched = 1;
        for (int i = 0; i < N; i++) untouched &= y[i] == 7.0f;
        KT_CHECK(rc == cases[c].want, "%s: %s", cases[c].name, kvps_result_str(rc));
        KT_CHECK(untouched, "%s: output written although rejected", cases[c].name);
        /* every truncation of a good payload is rejected */
        for (size_t cut = 0; cut < len; cut++)
            KT_CHECK(kvps_codec_decode(cd, src, cut, y, N, 1) != KVPS_OK, "%s: cut at %zu accepted", cases[c].name, cut);
    }
}

/* Every ISA path encodes to the same bytes and leaves the same residual, specials included. */
static void test_paths_identical(void) {
    enum { N = 10007 };
    static float x[N], r0[N], r1[N];
    static unsigned char b0[N * 5], b1[N * 5];
    uint64_t seed = 3;
    for (int i = 0; i < N; i++) {
        x[i] = kt_randf(&seed) * 100.0f;
        if (i % 97 == 5) x[i] = NAN;
        if (i % 89 == 7) { /* signalling NaNs whose payload survives the narrowing */
            uint32_t u = 0x7f800000u | (((uint32_t)i & 0x1ffu) << 13) | (((uint32_t)i & 0x3fu) << 16) | 1u;
            memcpy(&x[i], &u, 4);
        }
        if (i % 101 == 9) x[i] = -INFINITY;
        if (i % 103 == 11) x[i] = 1e-40f;
        if (i % 107 == 13) x[i] = 70000.0f;
    }
    kvps_codec_id ids[] = {KVPS_CODEC_FP16, KVPS_CODEC_BF16, KVPS_CODEC_TOPK, KVPS_CODEC_SIGN};
    int best = kvps_isa_set(KVPS_ISA_AUTO), bad = 0;
    for (size_t c = 0; c < sizeof ids / sizeof *ids; c++) {
        for (int ef = 0; ef < 2; ef++) {
            kvps_codec cd = kvps_codec_get(ids[c]);
            size_t n0 = 0, n1 = 0;
            uint64_t s2 = 11;
            for (int i = 0; i < N; i++) r0[i] = r1[i] = kt_randf(&s2) * 0.01f;
            kvps_isa_set(KVPS_ISA_PORTABLE);
            kvps_codec_encode(&cd, x, N, ef ? r0 : NULL, b0, sizeof b0, &n0);
            for (int isa = KVPS_ISA_AVX2; isa <= best; isa++) {
                kvps_isa_set((kvps_isa)isa);
                /* same starting residual as the portable run */
                uint64_t s3 = 11;
                for (int i = 0; i < N; i++) r1[i] = kt_randf(&s3) * 0.01f;
                kvps_codec_encode(&cd, x, N, ef ? r1 : NULL, b1, sizeof b1, &n1);
                int diff = n0 != n1 || memcmp(b0, b1, n0) != 0 || (ef && memcmp(r0, r1, sizeof r0) != 0);
                if (diff) printf("  %s ef=%d isa=%d differs from portable\n", cd.name, ef, isa);
                bad += diff;
            }
        }
    }
    kvps_isa_set(KVPS_ISA_AUTO);
    KT_CHECK(bad == 0, "%d codec/path combinations differ", bad);
}

int main(void) {
    KT_RUN(test_paths_identical);
    KT_RUN(test_half_roundtrip_all_65536);
    KT_RUN(test_topk_against_full_sort);
    KT_RUN(test_error_feedback_conserves);
    KT_RUN(test_codec_bytes_and_roundtrip);
    KT_RUN(test_malformed_payloads);
    KT_RUN(test_all_2_32_floats);
    return kt_finish();
}
