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

/* ---- top-k as a property against a full sort --------------------------------------------- */
static int cmp_u64v(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}
static int cmp_u32v(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}
static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* The oracle: every index of v sorted by magnitude (the float's bits without the sign: NaN
   above infinity), largest first, ties to the lower index. */
static uint32_t *topk_order(const float *v, size_t n) {
    uint64_t *key = (uint64_t *)malloc((n ? n : 1) * sizeof *key);
    uint32_t *order = (uint32_t *)malloc((n ? n : 1) * sizeof *order);
    for (size_t i = 0; i < n; i++) key[i] = ((uint64_t)(0x7fffffffu - (fbits(v[i]) & 0x7fffffffu)) << 32) | i;
    qsort(key, n, sizeof *key, cmp_u64v);
    for (size_t i = 0; i < n; i++) order[i] = (uint32_t)key[i];
    free(key);
    return order;
}

/* The shapes top-k must survive, each as its own generator (n entries of x). */
enum { TK_DISTINCT, TK_RANDOM, TK_HEAVY_TIES, TK_ALL_EQUAL, TK_SIGNED_ZEROS, TK_MOSTLY_ZEROS, TK_FEW_NONZEROS,
       TK_PLATEAU, TK_SUBNORMAL, TK_INF_NAN, TK_UNSAMPLED, TK_SHAPES };
static const char *const tk_shape_name[TK_SHAPES] = {"no ties", "random", "heavy ties", "all equal", "signed zeros",
                                                     "mostly zeros", "50 non-zeros", "50 x 2.0 on 1.0", "subnormal",
                                                     "inf/NaN", "unsampled"};
static void topk_shape(int shape, float *x, size_t n, uint64_t *seed) {
    for (size_t i = 0; i < n; i++) {
        float v = kt_randf(seed);
        switch (shape) {
        case TK_DISTINCT: x[i] = (float)(i + 1) * (v < 0 ? -1.0f : 1.0f); break; /* shuffled below */
        case TK_RANDOM: x[i] = v; break;
        case TK_HEAVY_TIES: x[i] = (float)((int)(v * 4)); break;
        case TK_ALL_EQUAL: x[i] = 0.5f; break;
        case TK_SIGNED_ZEROS: x[i] = 0.0f * v; break;
        case TK_MOSTLY_ZEROS: x[i] = kt_rng(seed) % 100 == 0 ? v : 0.0f; break;
        case TK_FEW_NONZEROS: x[i] = i % (n / 50 + 1) == 1 ? v + 2.0f : 0.0f; break;
        case TK_PLATEAU: x[i] = i < 50 ? 2.0f : 1.0f; break; /* the report's input */
        case TK_SUBNORMAL: x[i] = v * 1e-42f; break;
        case TK_INF_NAN: {
            uint32_t u = 0x7f800000u | (uint32_t)(kt_rng(seed) & 0x803fffffu); /* NaN payloads, either sign */
            if (i % 17 == 3) memcpy(&x[i], &u, 4);
            else x[i] = i % 29 == 5 ? (v < 0 ? -INFINITY : INFINITY) : v;
            if (i % 17 == 3 && (u & 0x7fffffu) == 0) x[i] = NAN; /* not infinity */
            break;
        }
        }
    }
    if (shape == TK_UNSAMPLED) { /* the sampler's positions (kvps__topk_ef) hold 0 or 10, the rest
                                    distinct values between: no sampled threshold can split them */
        size_t m = n / 16 < 256 ? (n < 256 ? n : 256) : n / 16 > 8192 ? 8192 : n / 16;
        for (size_t i = 0; i < n; i++) x[i] = 1.0f + 8.0f * (float)((double)(kt_rng(seed) >> 11) / 9007199254740992.0);
        for (size_t j = 0; j < m; j++) x[(size_t)((uint64_t)j * n / m)] = j % 64 == 0 ? 10.0f : 0.0f;
    }
    if (shape == TK_DISTINCT)
        for (size_t i = n; i > 1; i--) { /* Fisher-Yates: distinct magnitudes in random places */
            size_t j = kt_rng(seed) % i;
            float t = x[i - 1]; x[i - 1] = x[j]; x[j] = t;
        }
}

/* kvps_topk(x) and, with error feedback, the top-k of x + r with r = x (so x + r = 2x exactly,
   the same shape) against the oracle's first k by index; the residual left must be x + r
   outside the selection and 0 inside. Each call runs under an alarm: a hang fails the test. */
static int check_topk(const float *x, const float *acc2, const uint32_t *order, const uint32_t *order2, size_t n,
                      size_t k, const char *what, int isa) {
    uint32_t *idx = (uint32_t *)malloc((k + 1) * 4), *ref = (uint32_t *)malloc((k + 1) * 4);
    float *val = (float *)malloc((k + 1) * 4), *r = (float *)malloc((n ? n : 1) * 4);
    uint8_t *sel = (uint8_t *)malloc(n ? n : 1);
    int bad = 0;
    for (int ef = 0; ef < 2; ef++) {
        const float *v = ef ? acc2 : x;
        memcpy(ref, ef ? order2 : order, k * 4);
        qsort(ref, k, 4, cmp_u32v);
        memcpy(r, x, n * 4);
        kt_alarm(60, "top-k of %s, n=%zu k=%zu, isa %d, %s", what, n, k, isa, ef ? "error feedback" : "plain");
        kvps_result rc = ef ? kvps__topk_ef(x, r, n, k, idx, val) : kvps_topk(x, n, k, idx, val);
        kt_alarm(0, NULL);
        int b = rc != KVPS_OK;
        for (size_t j = 0; !b && j < k; j++) b |= idx[j] != ref[j] || fbits(val[j]) != fbits(v[idx[j]]);
        memset(sel, 0, n);
        for (size_t j = 0; !b && j < k; j++) sel[idx[j]] = 1;
        for (size_t i = 0; !b && ef && i < n; i++) b |= fbits(r[i]) != (sel[i] ? 0u : fbits(v[i]));
        if (b)
            printf("  top-k %s n=%zu k=%zu isa=%d %s: %s, first idx %u vs %u\n", what, n, k, isa, ef ? "ef" : "plain",
                   kvps_result_str(rc), k ? idx[0] : 0, k ? ref[0] : 0);
        bad += b;
    }
    free(idx); free(ref); free(val); free(r); free(sel);
    return bad;
}

static void test_topk_against_full_sort(void) {
    size_t ns[] = {1, 2, 7, 100, 1000, 65537, 100000, 300000};
    uint64_t seed = 7;
    int bad = 0, best = kvps_isa_set(KVPS_ISA_AUTO);
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
        size_t n = ns[a];
        if (kt_quick() && n > 100000) continue;
        float *x = (float *)malloc(n * 4), *acc2 = (float *)malloc(n * 4);
        /* k = 1, 2, n - 1, n, the 50 / 100 around the sparse shapes' non-zeros, 0.1%, 1%, n/3 */
        size_t ks[] = {0, 1, 2, 50, 100, n / 1000, n / 100, n / 3, n - 1, n};
        for (int shape = 0; shape < TK_SHAPES; shape++) {
            topk_shape(shape, x, n, &seed);
            for (size_t i = 0; i < n; i++) acc2[i] = x[i] + x[i];
            uint32_t *order = topk_order(x, n), *order2 = topk_order(acc2, n);
            for (size_t b = 0; b < sizeof ks / sizeof *ks; b++) {
                if (ks[b] > n || (b && ks[b] == ks[b - 1])) continue;
                for (int isa = KVPS_ISA_PORTABLE; isa <= best; isa++) {
                    kvps_isa_set((kvps_isa)isa);
                    bad += check_topk(x, acc2, order, order2, n, ks[b], tk_shape_name[shape], isa);
                }
            }
            free(order); free(order2);
        }
        free(x); free(acc2);
    }
    kvps_isa_set(KVPS_ISA_AUTO);
    KT_CHECK(bad == 0, "%d top-k results differ from the full sort", bad);
    uint32_t i1;
    float v1, one = 1;
    KT_CHECK(kvps_topk(&one, 1, 2, &i1, &v1) == KVPS_ERR_INVALID_ARG, "k > n is rejected");
}

/* The report's codec case: the default 1% of n = 1e5 with 50 non-zeros (fewer than k) returns,
   sends every non-zero, and decodes to x exactly. */
static void test_topk_codec_sparse(void) {
    enum { N = 100000 };
    static float x[N], y[N], r[N];
    for (int i = 0; i < N; i++) x[i] = i % 2000 == 1 ? (float)(i / 2000 + 1) : 0.0f;
    kvps_codec c = kvps_codec_get(KVPS_CODEC_TOPK);
    size_t cap = kvps_codec_max_bytes(&c, N), bytes = 0;
    unsigned char *buf = (unsigned char *)malloc(cap);
    for (int ef = 0; ef < 2; ef++) {
        memset(r, 0, sizeof r);
        kt_alarm(60, "a top-k encode of 50 non-zeros in 1e5 floats%s", ef ? " with error feedback" : "");
        KT_OK(kvps_codec_encode(&c, x, N, ef ? r : NULL, buf, cap, &bytes));
        kt_alarm(0, NULL);
        KT_CHECK(bytes == 8 + 4 + 1000 * 8, "%zu bytes", bytes);
        KT_OK(kvps_codec_decode(&c, buf, bytes, y, N, 0));
        KT_CHECK(memcmp(x, y, sizeof x) == 0, "decoded differs from the input");
        int left = 0;
        for (int i = 0; i < N; i++) left += r[i] != 0.0f;
        KT_CHECK(left == 0, "%d residuals left non-zero", left);
    }
    free(buf);
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
        if (c < 3) { /* exact, or the format's relative rounding on inputs in [-1, 1) */
            double tol[3] = {0, 1.0 / 2048, 1.0 / 256};
            KT_CHECK(err <= tol[c], "%s: max error %g", cs[c].name, err);
        } else if (c == 3) { /* top-k: the 40 largest |x| come back exactly, the rest as 0 */
            size_t k = 40, kept = 0, wrong = 0;
            uint32_t *order = topk_order(x, N);
            uint8_t sel[N] = {0};
            for (size_t j = 0; j < k; j++) sel[order[j]] = 1;
            for (int i = 0; i < N; i++) {
                kept += y[i] != 0.0f;
                wrong += sel[i] ? fbits(y[i]) != fbits(x[i]) : y[i] != 0.0f;
            }
            KT_CHECK(kept == k && wrong == 0, "%s: %zu values decoded, %zu wrong", cs[c].name, kept, wrong);
            free(order);
        } else { /* 1-bit: x's sign, times the mean |x| of its 256-element chunk (in double here) */
            size_t wrong = 0;
            for (int b = 0; b < N; b += 256) {
                int m = N - b < 256 ? N - b : 256;
                double mean = 0;
                for (int i = b; i < b + m; i++) mean += fabs((double)x[i]);
                mean /= m;
                for (int i = b; i < b + m; i++)
                    wrong += signbit(y[i]) != signbit(x[i]) || fabs(fabs((double)y[i]) - mean) > 1e-5 * mean;
            }
            KT_CHECK(wrong == 0, "%s: %zu values are not sign x chunk mean", cs[c].name, wrong);
        }
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

/* ---- codecs on the parameter server's paths ---- */

/* Workers with different codecs push one tensor (sliced over 3 servers) under BSP + SUM; the
   server's value must equal the rank-order sum of what each worker's codec decodes to. */
static void test_ps_mixed_codecs(void) {
    enum { M = 3, N = 5003, STEPS = 4 };
    kt_cluster c;
    kt_cluster_up(&c, "inproc", 3, &(kvps_server_desc){.num_workers = M, .update = KVPS_UPDATE_ACCUMULATE});
    kvps_codec cs[M] = {kvps_codec_get(KVPS_CODEC_FP16), kvps_codec_get(KVPS_CODEC_NONE), kvps_codec_get(KVPS_CODEC_TOPK)};
    cs[2].topk_fraction = 0.05;
    kvps_worker *w[M];
    kvps_tensor t[M];
    static float g[M][N], out[M][N], expect[N], dec[N], resid_local[M][N];
    memset(expect, 0, sizeof expect);
    memset(resid_local, 0, sizeof resid_local);
    for (int r = 0; r < M; r++) {
        KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers, .rank = r, .zmq_ctx = c.ctx, .min_slice = 64}, &w[r]));
        KT_OK(kvps_worker_tensor(w[r], "mixed", N, &t[r]));
        KT_OK(kvps_worker_tensor_codec(w[r], t[r], r == 1 ? NULL : &cs[r], NULL, 1));
    }
    uint64_t seed = 17;
    int bad = 0;
    for (int step = 0; step < STEPS; step++) {
        kvps_req q[M];
        for (int r = 0; r < M; r++) for (int i = 0; i < N; i++) g[r][i] = kt_randf(&seed);
        for (int r = M - 1; r >= 0; r--) KT_OK(kvps_worker_pushpull_tensor(w[r], t[r], g[r], out[r], &q[r]));
        for (int r = 0; r < M; r++) KT_OK(kvps_worker_wait(w[r], q[r], -1));
        /* oracle: each worker's slices encoded locally with its own residual, summed in rank order */
        static float round_sum[N];
        for (int r = 0; r < M; r++) {
            for (uint32_t sl = 0; sl < 3; sl++) {
                size_t b = (size_t)N * sl / 3, e = (size_t)N * (sl + 1) / 3, len = e - b;
                if (r == 1) { memcpy(dec + b, g[r] + b, len * 4); continue; }
                size_t cap = kvps_codec_max_bytes(&cs[r], len), nb = 0;
                unsigned char *buf = (unsigned char *)malloc(cap);
                kvps_codec_encode(&cs[r], g[r] + b, len, resid_local[r] + b, buf, cap, &nb);
                kvps_codec_decode(&cs[r], buf, nb, dec + b, len, 0);
                free(buf);
            }
            for (int i = 0; i < N; i++) round_sum[i] = r == 0 ? dec[i] : round_sum[i] + dec[i];
        }
        for (int i = 0; i < N; i++) expect[i] += round_sum[i];
        for (int r = 0; r < M; r++) bad += memcmp(out[r], expect, sizeof expect) != 0;
    }
    KT_CHECK(bad == 0, "%d (step, worker) results differ from the rank-order sum of decoded contributions", bad);
    kvps_tensor_stats st;
    KT_OK(kvps_worker_tensor_stats(w[0], t[0], &st));
    KT_CHECK(st.pushes == STEPS && st.push_raw_bytes == (uint64_t)STEPS * N * 4, "fp16 stats %llu pushes %llu bytes",
             (unsigned long long)st.pushes, (unsigned long long)st.push_raw_bytes);
    KT_CHECK(st.push_wire_bytes == (uint64_t)STEPS * (3 * (4 + 8) + N * 2), "fp16 wire bytes %llu", (unsigned long long)st.push_wire_bytes);
    KT_OK(kvps_worker_tensor_stats(w[2], t[2], &st));
    /* 5% of the entries at 8 bytes each (index + value) against 4 bytes per float: about 10x */
    KT_CHECK(st.push_raw_bytes > 9 * st.push_wire_bytes, "top-k 5%%: %llu raw vs %llu wire", (unsigned long long)st.push_raw_bytes,
             (unsigned long long)st.push_wire_bytes);
    for (int r = 0; r < M; r++) kvps_worker_destroy(&w[r]);
    kt_cluster_down(&c);
}

/* Error feedback through the server: async SUM, 1 worker, top-k 2% with EF. After many steps,
   stored value + the worker's residual = sum of all gradients (dyadic values: exact). */
static void test_ps_error_feedback_conserves(void) {
    enum { N = 2000, STEPS = 40 };
    kt_cluster c;
    kt_cluster_up(&c, "tcp", 2, &(kvps_server_desc){.num_workers = 1, .consistency = KVPS_ASYNC, .update = KVPS_UPDATE_ACCUMULATE});
    kvps_worker *w;
    kvps_tensor t;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers, .min_slice = 100}, &w));
    KT_OK(kvps_worker_tensor(w, "ef", N, &t));
    kvps_codec tk = kvps_codec_get(KVPS_CODEC_TOPK);
    tk.topk_fraction = 0.02;
    KT_OK(kvps_worker_tensor_codec(w, t, &tk, NULL, 1));
    static float g[N], total[N], val[N];
    memset(total, 0, sizeof total);
    uint64_t seed = 23;
    kvps_req q;
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < N; i++) { g[i] = (float)((int)(kt_randf(&seed) * 512)) / 128.0f; total[i] += g[i]; }
        KT_OK(kvps_worker_push_tensor(w, t, g, &q));
        KT_OK(kvps_worker_wait(w, q, -1));
    }
    KT_OK(kvps_worker_pull_tensor(w, t, val, &q));
    KT_OK(kvps_worker_wait(w, q, -1));
    kvps__tensor_info *ti = &w->tensors[t];
    int bad = 0;
    for (uint32_t sl = 0; sl < ti->nslices; sl++)
        for (uint64_t i = 0; i < ti->slen[sl]; i++) {
            size_t e = (size_t)(ti->off[sl] + i);
            bad += val[e] + ti->resid[sl][i] != total[e];
        }
    KT_CHECK(bad == 0, "%d elements: server value + residual != sum of gradients", bad);
    kvps_worker_destroy(&w);
    kt_cluster_down(&c);
}

/* Pulls answered in fp16 / bf16 / 1-bit: the worker gets exactly the codec's rounding of the value. */
static void test_ps_coded_pull(void) {
    enum { N = 3001 };
    kt_cluster c;
    kt_cluster_up(&c, "inproc", 2, &(kvps_server_desc){.num_workers = 1});
    kvps_worker *w;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers, .zmq_ctx = c.ctx, .min_slice = 100}, &w));
    static float v[N], out[N], want[N];
    uint64_t seed = 31;
    for (int i = 0; i < N; i++) v[i] = kt_randf(&seed) * 3.0f;
    kvps_codec_id ids[] = {KVPS_CODEC_FP16, KVPS_CODEC_BF16, KVPS_CODEC_SIGN};
    for (int c2 = 0; c2 < 3; c2++) {
        char name[16];
        snprintf(name, sizeof name, "pull%d", c2);
        kvps_tensor t = 0;
        kvps_req q = 0;
        KT_OK(kvps_worker_tensor(w, name, N, &t));
        kvps_codec cd = kvps_codec_get(ids[c2]);
        KT_OK(kvps_worker_tensor_codec(w, t, NULL, &cd, 0));
        KT_OK(kvps_worker_init_tensor(w, t, v, &q)); /* exact: init is never coded */
        KT_OK(kvps_worker_wait(w, q, -1));
        KT_OK(kvps_worker_pull_tensor(w, t, out, &q));
        KT_OK(kvps_worker_wait(w, q, -1));
        kvps__tensor_info *ti = &w->tensors[t];
        for (uint32_t sl = 0; sl < ti->nslices; sl++) { /* the oracle: the codec applied per slice */
            size_t b = (size_t)ti->off[sl], len = (size_t)ti->slen[sl], cap = kvps_codec_max_bytes(&cd, len), nb;
            unsigned char *buf = (unsigned char *)malloc(cap);
            kvps_codec_encode(&cd, v + b, len, NULL, buf, cap, &nb);
            kvps_codec_decode(&cd, buf, nb, want + b, len, 0);
            free(buf);
        }
        KT_CHECK(memcmp(out, want, sizeof want) == 0, "%s pull differs from the codec's rounding", cd.name);
        kvps_tensor_stats st;
        memset(&st, 0, sizeof st);
        KT_OK(kvps_worker_tensor_stats(w, t, &st));
        KT_CHECK(st.pull_wire_bytes < st.pull_raw_bytes, "%s: pulled %llu wire bytes for %llu raw", cd.name,
                 (unsigned long long)st.pull_wire_bytes, (unsigned long long)st.pull_raw_bytes);
    }
    kvps_codec tk = kvps_codec_get(KVPS_CODEC_TOPK);
    kvps_tensor t2;
    KT_OK(kvps_worker_tensor(w, "notopkpull", 10, &t2));
    KT_CHECK(kvps_worker_tensor_codec(w, t2, NULL, &tk, 0) == KVPS_ERR_INVALID_ARG, "top-k is not a pull codec");
    kvps_worker_destroy(&w);
    kt_cluster_down(&c);
}

/* Malformed coded pushes from a raw DEALER: rejected with their error, nothing stored changes. */
static void test_ps_bad_coded_push(void) {
    kt_cluster c;
    kt_cluster_up(&c, "inproc", 1, &(kvps_server_desc){.num_workers = 1, .update = KVPS_UPDATE_ACCUMULATE});
    kvps_log_set_level(KVPS_LOG_NONE);
    kvps_worker *w;
    KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers, .zmq_ctx = c.ctx}, &w));
    uint64_t key = 77;
    size_t len = 10;
    float init[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, out[10];
    kvps_req q;
    KT_OK(kvps_worker_init(w, &key, init, &len, 1, &q));
    KT_OK(kvps_worker_wait(w, q, -1));
    void *d = zmq_socket(c.ctx, ZMQ_DEALER);
    zmq_connect(d, c.servers);
    kvps_codec tk = kvps_codec_get(KVPS_CODEC_TOPK);
    tk.topk_count = 3;
    unsigned char blob[64];
    size_t nb = 0;
    kvps_codec_encode(&tk, init, 10, NULL, blob, sizeof blob, &nb);
    struct { const char *name; int mutate; kvps_result want; } cases[] = {
        {"good blob, wrong codec id byte", 1, KVPS_ERR_CODEC},
        {"top-k index out of range", 2, KVPS_ERR_MALFORMED},
        {"blob length past the frame", 3, KVPS_ERR_TRUNCATED},
        {"trailing bytes after the blob", 4, KVPS_ERR_MALFORMED},
        {"blob n differs from the key length", 5, KVPS_ERR_LEN_MISMATCH},
        {"zero-length blob", 6, KVPS_ERR_MALFORMED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        unsigned char frame[128], b2[64];
        memcpy(b2, blob, nb);
        uint32_t bl = (uint32_t)nb;
        size_t fsz = 4 + nb;
        if (cases[i].mutate == 1) b2[0] = 99;
        if (cases[i].mutate == 2) { uint32_t bad = 10; memcpy(b2 + 8 + 4 + 8, &bad, 4); }
        if (cases[i].mutate == 3) bl = (uint32_t)nb + 10;
        if (cases[i].mutate == 4) fsz += 3;
        if (cases[i].mutate == 5) { uint32_t n9 = 9; memcpy(b2 + 4, &n9, 4); }
        if (cases[i].mutate == 6) { bl = 0; fsz = 4; }
        memcpy(frame, &bl, 4);
        memcpy(frame + 4, b2, nb);
        memset(frame + 4 + nb, 0, 8);
        kvps__hdr h = KT_HDR(.op = KVPS__OP_PUSH, .flags = KVPS__FLAG_CODED, .nkeys = 1, .req_id = 1000 + i);
        kvps__kent e = {key, 10};
        unsigned char meta[48];
        memcpy(meta, &h, 32);
        memcpy(meta + 32, &e, 16);
        int32_t st = kt_raw_status(d, meta, 48, frame, fsz, 2000);
        KT_CHECK(st == cases[i].want, "%s: got %s", cases[i].name, kvps_result_str((kvps_result)st));
    }
    KT_OK(kvps_worker_pull(w, &key, out, &len, 1, &q));
    KT_OK(kvps_worker_wait(w, q, -1));
    KT_CHECK(memcmp(out, init, sizeof init) == 0, "stored value changed by rejected pushes");
    zmq_close(d);
    kvps_worker_destroy(&w);
    kt_cluster_down(&c);
    kvps_log_set_level(KVPS_LOG_WARN);
}

/* A user codec through the interface: int16 fixed point (x * 256), id 200. */
static size_t q8_max(const kvps_codec *c, size_t n) { (void)c; return 8 + n * 2; }
static kvps_result q8_encode(const kvps_codec *c, const float *x, size_t n, float *r, void *out, size_t cap, size_t *nb) {
    unsigned char *o = (unsigned char *)out;
    if (cap < 8 + n * 2) return KVPS_ERR_TOO_LARGE;
    uint32_t n32 = (uint32_t)n;
    o[0] = (unsigned char)c->id; o[1] = o[2] = o[3] = 0;
    memcpy(o + 4, &n32, 4);
    for (size_t i = 0; i < n; i++) {
        float v = x[i] + (r ? r[i] : 0.0f);
        int16_t q = (int16_t)lrintf(fmaxf(-32768.0f, fminf(32767.0f, v * 256.0f)));
        memcpy(o + 8 + i * 2, &q, 2);
        if (r) r[i] = v - (float)q / 256.0f;
    }
    *nb = 8 + n * 2;
    return KVPS_OK;
}
static kvps_result q8_decode(const kvps_codec *c, const void *in, size_t bytes, float *dst, size_t n, int acc) {
    const unsigned char *p = (const unsigned char *)in;
    uint32_t n32;
    if (bytes < 8) return KVPS_ERR_TRUNCATED;
    if (p[0] != (unsigned char)c->id) return KVPS_ERR_CODEC;
    memcpy(&n32, p + 4, 4);
    if (n32 != n || bytes != 8 + n * 2) return KVPS_ERR_MALFORMED;
    for (size_t i = 0; i < n; i++) {
        int16_t q;
        memcpy(&q, p + 8 + i * 2, 2);
        dst[i] = acc ? dst[i] + (float)q / 256.0f : (float)q / 256.0f;
    }
    return KVPS_OK;
}

static void test_ps_user_codec(void) {
    kvps_codec q8 = {.id = 200, .name = "q8", .max_bytes = q8_max, .encode = q8_encode, .decode = q8_decode};
    for (int known = 0; known < 2; known++) {
        kt_cluster c;
        kt_cluster_up(&c, "inproc", 1, &(kvps_server_desc){.num_workers = 1, .update = KVPS_UPDATE_ACCUMULATE,
                                                           .codecs = known ? &q8 : NULL, .num_codecs = known});
        kvps_log_set_level(KVPS_LOG_NONE);
        kvps_worker *w;
        kvps_tensor t;
        kvps_req q;
        float g[5] = {1.0f, -0.5f, 0.3f, 2.0f, 100.0f}, out[5];
        KT_OK(kvps_worker_create(&(kvps_worker_desc){.servers = c.servers, .zmq_ctx = c.ctx}, &w));
        KT_OK(kvps_worker_tensor(w, "user", 5, &t));
        KT_OK(kvps_worker_tensor_codec(w, t, &q8, known ? &q8 : NULL, 0));
        KT_OK(kvps_worker_pushpull_tensor(w, t, g, out, &q));
        kvps_result rc = kvps_worker_wait(w, q, -1);
        if (known) {
            KT_CHECK(rc == KVPS_OK, "%s", kvps_result_str(rc));
            for (int i = 0; i < 5; i++)
                KT_CHECK(out[i] == (float)lrintf(g[i] * 256.0f) / 256.0f, "[%d] %g", i, out[i]);
        } else {
            KT_CHECK(rc == KVPS_ERR_CODEC, "a server without the codec: %s", kvps_result_str(rc));
        }
        kvps_worker_destroy(&w);
        kt_cluster_down(&c);
        kvps_log_set_level(KVPS_LOG_WARN);
    }
}

int main(void) {
    KT_RUN(test_ps_user_codec);
    KT_RUN(test_ps_mixed_codecs);
    KT_RUN(test_ps_error_feedback_conserves);
    KT_RUN(test_ps_coded_pull);
    KT_RUN(test_ps_bad_coded_push);
    KT_RUN(test_paths_identical);
    KT_RUN(test_half_roundtrip_all_65536);
    KT_RUN(test_topk_against_full_sort);
    KT_RUN(test_topk_codec_sparse);
    KT_RUN(test_error_feedback_conserves);
    KT_RUN(test_codec_bytes_and_roundtrip);
    KT_RUN(test_malformed_payloads);
    KT_RUN(test_all_2_32_floats);
    return kt_finish();
}
