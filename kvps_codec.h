/* kvps_codec.h - v0.2 - gradient compression and the element-wise numerics of kvps - MIT licence

   Needs no ZeroMQ: a program that includes only this header links with -lm (and -pthread).
       #define KVPS_IMPLEMENTATION        (or KVPS_CODEC_IMPLEMENTATION: this header and core)
       #include "kvps_codec.h"
   kvps.h and kvps_ring.h include it: their workers, servers and rings put these codecs on the wire.

   WHAT IS HERE
     half       kvps_f32_to_f16 ... kvps_bf16_to_f32_n: scalar and bulk fp16 / bf16 conversions,
                round to nearest even, the same bits on every ISA path (kvps_isa_set forces one)
     top-k      kvps_topk: the k entries of largest magnitude
     codecs     kvps_codec_get, kvps_codec_encode, kvps_codec_decode, kvps_codec_max_bytes:
                NONE, FP16, BF16, TOPK (with fp16 values), SIGN (1-bit with a scale per chunk), all
                with error feedback; user codecs from id KVPS_CODEC_USER
     elements   the per-element operations (KVPS_HD, kvps_el_*) that kvps_gpu.h's kernels share,
                so that CPU and GPU give the same bits
   A codec is one row of KVPS_CODEC_TABLE (its id, name, whether it is dense, the header flags it
   allows, its size check, its size bound) plus its encode and decode (>>codecs).
   The codecs per tensor of a parameter server: kvps.h's kvps_worker_tensor_codec; a ring's 16-bit
   wire and top-k all-reduce: kvps_ring.h (kvps_ring_allreduce_wire, kvps_ring_allreduce_topk).
   Every decoder rejects malformed input with a result, never reads past the buffer
   (tests/fuzz/fuzz_codec.c).

   REVISION HISTORY
   0.2  split from kvps.h (issue 28): every name as before. KVPS_CODEC_TABLE's rows are now
        X(NAME, id, "name", dense, flags, size rule, size bound), NAME the part after KVPS_CODEC_
        (they were X(KVPS_CODEC_NAME, "name", dense, flags, size rule, size bound)); the enum
        kvps_codec_id is made from it, and the dispatch on CPU and GPU finds each codec's encode
        and decode by NAME.
*/
#include "kvps_core.h" /* (first: its table of implementation switches) */
#ifndef KVPS_CODEC_H
#define KVPS_CODEC_H

#ifdef __cplusplus
extern "C" {
#endif

#define KVPS_DEFAULT_TOPK_FRACTION 0.01
#define KVPS_DEFAULT_SIGN_CHUNK 256u

/* Scalar conversions, round to nearest even; infinities, signed zeros and subnormals exact.
   A NaN stays a NaN with the top of its payload (so a 16-bit value converts to float and back
   unchanged, signalling NaNs included); it is quieted only when the kept payload would be 0.
   (F16C/AVX-512 quiet every NaN: the bulk functions below redo NaN lanes to match these.) */
KVPS_API uint16_t kvps_f32_to_f16(float f);
KVPS_API float kvps_f16_to_f32(uint16_t h);
KVPS_API uint16_t kvps_f32_to_bf16(float f);
KVPS_API float kvps_bf16_to_f32(uint16_t h);

/* Bulk conversions: the fastest path this CPU has (AVX-512, F16C/AVX2, or portable C), chosen at
   run time; every path gives the same bits as the scalar functions above. */
KVPS_API void kvps_f32_to_f16_n(uint16_t *dst, const float *src, size_t n);
KVPS_API void kvps_f16_to_f32_n(float *dst, const uint16_t *src, size_t n);
KVPS_API void kvps_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n);
KVPS_API void kvps_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n);
/* Which path the bulk functions use: KVPS_ISA_AUTO (default), or one forced for tests/benches
   (a forced path the CPU lacks falls back to the best it has). Returns the path now in use. */
typedef enum kvps_isa {
    KVPS_ISA_AUTO = -1, KVPS_ISA_PORTABLE = 0, KVPS_ISA_AVX2 = 1, KVPS_ISA_AVX512 = 2, KVPS_ISA_COUNT
} kvps_isa;
KVPS_API kvps_isa kvps_isa_set(kvps_isa isa);

/* Top-k by magnitude: the k entries of largest |x| (NaN counts as larger than infinity), ties to
   the lower index; idx ascending. Sampled threshold + one filter pass + exact trim to k. */
KVPS_API kvps_result kvps_topk(const float *x, size_t n, size_t k, uint32_t *idx, float *val);

/* CODECS. An encoded buffer: 8-byte header { u8 codec id; u8 flags; u16 reserved (0); u32 n }
   then the codec's payload:
     KVPS_CODEC_FP16 / BF16  n x u16
     KVPS_CODEC_TOPK         u32 k; k x u32 index (strictly ascending, < n); k x f32 values, or
                             k x u16 fp16 values when flags & KVPS_CODEC_FLAG_FP16_VALUES
     KVPS_CODEC_SIGN         u32 chunk; ceil(n / chunk) x f32 scale; ceil(n / 8) bytes of sign
                             bits (bit j of byte b: element 8b + j is negative); decodes to
                             +-scale of its chunk (scale = mean |x| of the chunk)
   Error feedback: pass a residual (n floats, zero at first) to encode. The codec encodes
   x + residual and leaves in residual what was not sent, in the same pass over the data, so the
   sum of everything decoded plus the residual always equals the sum of the inputs. */
/* THE BUILT-IN CODECS, one row each: the name after KVPS_CODEC_ (the enum constant); its id; its
   name; dense (decodes to every element, so a pull may be answered with it; top-k is sparse); the
   header flags it may carry; its payload size rule (above); its largest blob for a codec's
   parameters. The enum kvps_codec_id, the blob verdict (CPU and GPU), kvps_codec_get and the CPU
   and GPU dispatch all come from here: a new built-in codec is a row here plus its encode and
   decode functions, kvps__enc_NAME / kvps__dec_NAME (kvps_codec.h, >>codecs) and
   kvps_gpu__enc_NAME / kvps_gpu__dec_NAME (kvps_gpu.h, >>kernel-api), which the dispatch finds
   by their names. Ids are 0, 1, 2, ... in row order (checked). */
#define KVPS_CODEC_TABLE(X)                                                                     \
    X(NONE, 0, "none", 1, 0, kvps_el_body_f32, kvps__max_f32)                                  \
    X(FP16, 1, "fp16", 1, 0, kvps_el_body_half, kvps__max_half)                                \
    X(BF16, 2, "bf16", 1, 0, kvps_el_body_half, kvps__max_half)                                \
    X(TOPK, 3, "topk", 0, KVPS_CODEC_FLAG_FP16_VALUES, kvps_el_body_topk, kvps__max_topk)      \
    X(SIGN, 4, "sign", 1, 0, kvps_el_body_sign, kvps__max_sign)

typedef enum kvps_codec_id {
#define KVPS__CODEC_ENUM(cid, num, name, dense, fl, size_fn, max_fn) KVPS_CODEC_##cid = num,
    KVPS_CODEC_TABLE(KVPS__CODEC_ENUM)
#undef KVPS__CODEC_ENUM
    KVPS_CODEC_COUNT,     /* one more than the last built-in codec (they are 0, 1, 2, ...) */
    KVPS_CODEC_USER = 128 /* ids from here on are yours */
} kvps_codec_id;
/* The built-in codecs' ids are their places in the table (so the table can be indexed by id). */
enum {
#define KVPS__CODEC_IX(cid, num, name, dense, fl, size_fn, max_fn) KVPS__CODEC_IX_##cid,
    KVPS_CODEC_TABLE(KVPS__CODEC_IX)
#undef KVPS__CODEC_IX
    KVPS__CODEC_IX_COUNT
};
#define KVPS__CODEC_CHECK(cid, num, name, dense, fl, size_fn, max_fn) \
    typedef char kvps__codec_place_##cid[KVPS__CODEC_IX_##cid == num ? 1 : -1];
KVPS_CODEC_TABLE(KVPS__CODEC_CHECK)
#undef KVPS__CODEC_CHECK
enum { KVPS_CODEC_FLAG_FP16_VALUES = 1, KVPS_CODEC_HEADER = 8 };

typedef struct kvps_codec kvps_codec;
struct kvps_codec {
    int id;             /* kvps_codec_id, written into the header */
    const char *name;
    /* parameters of the built-in codecs; zero means default */
    double topk_fraction; /* top-k: k = max(1, fraction * n) when topk_count is 0; default 0.01 */
    size_t topk_count;
    int topk_fp16_values;
    uint32_t sign_chunk;  /* 1-bit: elements per scale; default 256 */
    /* the interface: a user codec fills these (the built-ins have them set by kvps_codec_get) */
    size_t (*max_bytes)(const kvps_codec *c, size_t n);
    kvps_result (*encode)(const kvps_codec *c, const float *x, size_t n, float *residual, void *out,
                          size_t cap, size_t *out_bytes);
    /* dst = decoded (accumulate 0) or dst += decoded (accumulate 1); must reject malformed input */
    kvps_result (*decode)(const kvps_codec *c, const void *in, size_t bytes, float *dst, size_t n, int accumulate);
    void *user;
};
/* A built-in codec with its functions set; parameters can be changed afterwards. */
KVPS_API kvps_codec kvps_codec_get(kvps_codec_id id);
KVPS_API kvps_result kvps_codec_encode(const kvps_codec *c, const float *x, size_t n, float *residual, void *out,
                                       size_t cap, size_t *out_bytes);
KVPS_API kvps_result kvps_codec_decode(const kvps_codec *c, const void *in, size_t bytes, float *dst, size_t n,
                                       int accumulate);
KVPS_API size_t kvps_codec_max_bytes(const kvps_codec *c, size_t n);

/* ---- Element-wise numerics shared with kvps_gpu.h ----------------------------------------
   One definition of each per-element operation of the codecs, compiled by the C compiler for
   the CPU paths (and checked by the CPU tests) and by nvcc as __host__ __device__ for the CUDA
   kernels, so both give the same bits. */
#if defined(__CUDACC__)
#define KVPS_HD __host__ __device__
#else
#define KVPS_HD
#endif
#include <string.h>
static inline KVPS_HD uint16_t kvps_el_f32_to_f16(float fin) {
    uint32_t f;
    memcpy(&f, &fin, sizeof f);
    uint32_t sign = f & 0x80000000u;
    f ^= sign;
    uint16_t o;
    if (f >= 0x47800000u) { /* >= 65536: inf; NaN keeps the top 10 bits of its payload (and so
                                whether it signals), quieted only when those bits are all 0 */
        o = 0x7c00u;
        if (f > 0x7f800000u) {
            o = (uint16_t)(o | ((f >> 13) & 0x3ffu));
            if ((o & 0x3ffu) == 0) o |= 0x200u;
        }
    } else if (f < 0x38800000u) { /* below 2^-14: subnormal half; the FPU rounds (RNE) */
        const uint32_t magic_u = 126u << 23; /* 0.5f: aligns the half's ulp to bit 0 */
        float magic, ff;
        memcpy(&magic, &magic_u, sizeof magic);
        memcpy(&ff, &f, sizeof ff);
        ff += magic;
        uint32_t r;
        memcpy(&r, &ff, sizeof r);
        o = (uint16_t)(r - magic_u);
    } else { /* normal: rebias and round the 13 dropped bits to nearest even (may carry to inf) */
        uint32_t odd = (f >> 13) & 1u;
        f += 0xc8000fffu + odd; /* (15 - 127) << 23, plus rounding */
        o = (uint16_t)(f >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}

static inline KVPS_HD float kvps_el_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, f;
    if (e == 0x1f) {
        f = sign | 0x7f800000u | (m << 13);
    } else if (e) {
        f = sign | ((e + 112u) << 23) | (m << 13);
    } else {
        float v = (float)m * (1.0f / 16777216.0f); /* m * 2^-24, exact */
        memcpy(&f, &v, sizeof f);
        f |= sign;
    }
    float out;
    memcpy(&out, &f, sizeof out);
    return out;
}

static inline KVPS_HD uint16_t kvps_el_f32_to_bf16(float fin) {
    uint32_t f;
    memcpy(&f, &fin, sizeof f);
    if ((f & 0x7fffffffu) > 0x7f800000u) { /* NaN: top of the payload kept, quieted if that is 0 */
        uint16_t b = (uint16_t)(f >> 16);
        return (b & 0x7fu) ? b : (uint16_t)(b | 0x40u);
    }
    f += 0x7fffu + ((f >> 16) & 1u);
    return (uint16_t)(f >> 16);
}

static inline KVPS_HD float kvps_el_bf16_to_f32(uint16_t h) {
    uint32_t f = (uint32_t)h << 16;
    float out;
    memcpy(&out, &f, sizeof out);
    return out;
}

/* How many values a top-k codec keeps of n: topk_count, else max(1, fraction x n); at most n. */
static inline size_t kvps_el_topk_k(const struct kvps_codec *c, size_t n) {
    size_t k = c->topk_count;
    if (!k) {
        double f = c->topk_fraction > 0 ? c->topk_fraction : KVPS_DEFAULT_TOPK_FRACTION;
        k = (size_t)(f * (double)n);
        if (k < 1) k = 1;
    }
    return k > n ? n : k;
}

/* |x| as an integer: a total order on magnitudes, NaN above infinity (top-k's key). */
static inline KVPS_HD uint32_t kvps_el_mag(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u & 0x7fffffffu;
}

static inline KVPS_HD uint32_t kvps_el_get32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* What a built-in codec's payload must measure for n values, from the blob's own fields
   (p: the whole blob; body: its bytes after the 8-byte header): KVPS_OK (0) and *want, or the
   result that refuses the blob before its size is known. */
static inline KVPS_HD int kvps_el_body_f32(const unsigned char *p, size_t body, size_t n, size_t *want) {
    (void)p; (void)body;
    *want = n * 4;
    return 0;
}
static inline KVPS_HD int kvps_el_body_half(const unsigned char *p, size_t body, size_t n, size_t *want) {
    (void)p; (void)body;
    *want = n * 2;
    return 0;
}
static inline KVPS_HD int kvps_el_body_topk(const unsigned char *p, size_t body, size_t n, size_t *want) {
    if (body < 4) return KVPS_ERR_TRUNCATED;
    size_t k = kvps_el_get32(p + KVPS_CODEC_HEADER), vs = (p[1] & KVPS_CODEC_FLAG_FP16_VALUES) ? 2 : 4;
    if (k > n) return KVPS_ERR_MALFORMED;
    *want = 4 + k * (4 + vs);
    return 0;
}
static inline KVPS_HD int kvps_el_body_sign(const unsigned char *p, size_t body, size_t n, size_t *want) {
    if (body < 4) return KVPS_ERR_TRUNCATED;
    size_t ch = kvps_el_get32(p + KVPS_CODEC_HEADER);
    if (ch == 0) return KVPS_ERR_MALFORMED;
    *want = 4 + (n + ch - 1) / ch * 4 + (n + 7) / 8;
    return 0;
}

/* The verdict on a blob of codec id for n values, the same on CPU and GPU: its header, then its
   size, in this order (top-k's indices are checked by the decoder). KVPS_OK or the result. */
static inline KVPS_HD int kvps_el_blob_verdict(const unsigned char *p, size_t bytes, int id, size_t n) {
    int flags = 0, v = KVPS_ERR_CODEC;
    size_t body, want = 0;
    if (bytes < KVPS_CODEC_HEADER) return KVPS_ERR_TRUNCATED;
    if (p[0] != (unsigned char)id) return KVPS_ERR_CODEC;
    body = bytes - KVPS_CODEC_HEADER;
    switch (id) {
#define KVPS__ROW(cid, num, name, dense, fl, size_fn, max_fn) case num: flags = fl; break;
        KVPS_CODEC_TABLE(KVPS__ROW)
#undef KVPS__ROW
    default: break;
    }
    if (p[2] || p[3] || (p[1] & ~flags)) return KVPS_ERR_MALFORMED;
    if ((size_t)kvps_el_get32(p + 4) != n) return KVPS_ERR_LEN_MISMATCH;
    switch (id) {
#define KVPS__ROW(cid, num, name, dense, fl, size_fn, max_fn) case num: v = size_fn(p, body, n, &want); break;
        KVPS_CODEC_TABLE(KVPS__ROW)
#undef KVPS__ROW
    default: break;
    }
    if (v != KVPS_OK) return v;
    return body < want ? KVPS_ERR_TRUNCATED : body > want ? KVPS_ERR_MALFORMED : KVPS_OK;
}


#ifdef __cplusplus
}
#endif
#endif /* KVPS_CODEC_H */

/* ============================================================================================ */
#if (defined(KVPS_IMPLEMENTATION) || defined(KVPS_CODEC_IMPLEMENTATION)) && !defined(KVPS_CODEC__IMPLEMENTED)
#define KVPS_CODEC__IMPLEMENTED
/* THE IMPLEMENTATION (find a section with `// >>name`):
     half       the scalar conversions (the element functions above)
     numerics   ISA detection, element-wise kernels (d += g, mean, SGD step), fp16/bf16 bulk
     topk       top-k selection with error feedback
     sign       1-bit sign coding
     codecs     the built-in codecs (KVPS_CODEC_TABLE in the element part): encode, decode */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#endif
// >>half
KVPS_API uint16_t kvps_f32_to_f16(float f) { return kvps_el_f32_to_f16(f); }
KVPS_API float kvps_f16_to_f32(uint16_t h) { return kvps_el_f16_to_f32(h); }
KVPS_API uint16_t kvps_f32_to_bf16(float f) { return kvps_el_f32_to_bf16(f); }
KVPS_API float kvps_bf16_to_f32(uint16_t h) { return kvps_el_bf16_to_f32(h); }

// >>numerics
/* Element-wise kernels on the widest vectors the CPU has (ISA detection, d += g, mean, SGD step)
   and the bulk fp16 / bf16 conversions. Every path does the same IEEE operation per element, so
   the bits never depend on the path. */
/* Element-wise kernels. GNU vector types (4 floats, SSE on any x86-64) so that they vectorise at -O2 too; the
   arithmetic is the same IEEE operation per element as the scalar tail, so results are
   bit-identical whichever path an element takes. */
#if defined(__GNUC__) || defined(__clang__)
#define KVPS__VW 4
typedef float kvps__vf __attribute__((vector_size(16)));
static kvps__vf kvps__ld(const float *p) { kvps__vf v; memcpy(&v, p, sizeof v); return v; }
static void kvps__st(float *p, kvps__vf v) { memcpy(p, &v, sizeof v); }
static kvps__vf kvps__splat(float x) { kvps__vf v = {x, x, x, x}; return v; }
#define KVPS__VLOOP(n, i, vbody) for (; i + KVPS__VW <= (n); i += KVPS__VW) { vbody; }
#else
#define KVPS__VLOOP(n, i, vbody)
#endif

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && !defined(KVPS_NO_SIMD)
#define KVPS__X86 1
#include <immintrin.h>
#define KVPS__TARGET_AVX2 __attribute__((target("avx2,f16c,sse4.1,popcnt,bmi")))
#define KVPS__TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c,sse4.1,popcnt,bmi")))
#endif

static int kvps__isa_forced = KVPS_ISA_AUTO;

static int kvps__isa_best(void) {
#ifdef KVPS__X86
    static int best = -1;
    int b = __atomic_load_n(&best, __ATOMIC_RELAXED);
    if (b < 0) {
        __builtin_cpu_init();
        b = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")
                ? KVPS_ISA_AVX512
                : __builtin_cpu_supports("avx2") ? KVPS_ISA_AVX2 : KVPS_ISA_PORTABLE;
        __atomic_store_n(&best, b, __ATOMIC_RELAXED);
    }
    return b;
#else
    return KVPS_ISA_PORTABLE;
#endif
}

static int kvps__isa(void) {
    int f = __atomic_load_n(&kvps__isa_forced, __ATOMIC_RELAXED), best = kvps__isa_best();
    return f < 0 || f > best ? best : f;
}

#ifdef KVPS__X86
KVPS__TARGET_AVX2 static void kvps__add_avx2(float *KVPS__RESTRICT d, const float *KVPS__RESTRICT g, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_add_ps(_mm256_loadu_ps(d + i), _mm256_loadu_ps(g + i));
        __m256 b = _mm256_add_ps(_mm256_loadu_ps(d + i + 8), _mm256_loadu_ps(g + i + 8));
        _mm256_storeu_ps(d + i, a);
        _mm256_storeu_ps(d + i + 8, b);
    }
    for (; i < n; i++) d[i] += g[i];
}
KVPS__TARGET_AVX512 static void kvps__add_avx512(float *KVPS__RESTRICT d, const float *KVPS__RESTRICT g, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 a = _mm512_add_ps(_mm512_loadu_ps(d + i), _mm512_loadu_ps(g + i));
        __m512 b = _mm512_add_ps(_mm512_loadu_ps(d + i + 16), _mm512_loadu_ps(g + i + 16));
        _mm512_storeu_ps(d + i, a);
        _mm512_storeu_ps(d + i + 16, b);
    }
    for (; i < n; i++) d[i] += g[i];
}
#endif

/* d += g: the aggregation pass, with the widest vectors this CPU has (one IEEE add per element
   on every path, so the bits do not depend on the path). */
static void kvps__add(float *KVPS__RESTRICT d, const float *KVPS__RESTRICT g, size_t n) {
    size_t i = 0;
#ifdef KVPS__X86
    if (n >= 64) {
        int isa = kvps__isa();
        if (isa == KVPS_ISA_AVX512) { kvps__add_avx512(d, g, n); return; }
        if (isa == KVPS_ISA_AVX2) { kvps__add_avx2(d, g, n); return; }
    }
#endif
    KVPS__VLOOP(n, i, kvps__st(d + i, kvps__ld(d + i) + kvps__ld(g + i)))
    for (; i < n; i++) d[i] += g[i];
}
/* v = g / c (the mean of a round) and v -= lr * (g / c) (SGD): the two hot rules, vectorised. */
static void kvps__mean_into(float *KVPS__RESTRICT v, const float *KVPS__RESTRICT g, float c, size_t n) {
    size_t i = 0;
    KVPS__VLOOP(n, i, kvps__st(v + i, kvps__ld(g + i) / kvps__splat(c)))
    for (; i < n; i++) v[i] = g[i] / c;
}
static void kvps__sgd_step(float *KVPS__RESTRICT v, const float *KVPS__RESTRICT g, float lr, float c, size_t n) {
    size_t i = 0;
    KVPS__VLOOP(n, i, kvps__st(v + i, kvps__ld(v + i) - kvps__splat(lr) * (kvps__ld(g + i) / kvps__splat(c))))
    for (; i < n; i++) v[i] -= lr * (g[i] / c);
}

KVPS_API kvps_isa kvps_isa_set(kvps_isa isa) {
    __atomic_store_n(&kvps__isa_forced, (int)isa, __ATOMIC_RELAXED);
    return (kvps_isa)kvps__isa();
}

#ifdef KVPS__X86
/* F16C has no signalling-NaN-preserving mode: NaN lanes (rare) are redone by the scalar code,
   which defines the semantics, so every path gives the same bits. */
KVPS__TARGET_AVX2 static void kvps__f2h_avx2(uint16_t *d, const float *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(s + i);
        _mm_storeu_si128((__m128i *)(void *)(d + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        int nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        for (int j = 0; nan && j < 8; j++)
            if (nan >> j & 1) d[i + j] = kvps_el_f32_to_f16(s[i + j]);
    }
    for (; i < n; i++) d[i] = kvps_el_f32_to_f16(s[i]);
}
KVPS__TARGET_AVX2 static void kvps__h2f_avx2(float *d, const uint16_t *s, size_t n) {
    size_t i = 0;
    const __m128i em = _mm_set1_epi16(0x7c00);
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
        int special = _mm_movemask_epi8(_mm_cmpeq_epi16(_mm_and_si128(h, em), em)); /* inf / NaN */
        for (int j = 0; special && j < 8; j++)
            if (special >> (2 * j) & 1) d[i + j] = kvps_el_f16_to_f32(s[i + j]);
    }
    for (; i < n; i++) d[i] = kvps_el_f16_to_f32(s[i]);
}
KVPS__TARGET_AVX512 static void kvps__f2h_avx512(uint16_t *d, const float *s, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(s + i);
        _mm256_storeu_si256((__m256i *)(void *)(d + i), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        for (int j = 0; nan && j < 16; j++)
            if (nan >> j & 1) d[i + j] = kvps_el_f32_to_f16(s[i + j]);
    }
    kvps__f2h_avx2(d + i, s + i, n - i);
}
KVPS__TARGET_AVX512 static void kvps__h2f_avx512(float *d, const uint16_t *s, size_t n) {
    size_t i = 0;
    const __m256i em = _mm256_set1_epi16(0x7c00);
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(s + i));
        _mm512_storeu_ps(d + i, _mm512_cvtph_ps(h));
        __mmask16 special = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, em), em);
        for (int j = 0; special && j < 16; j++)
            if (special >> j & 1) d[i + j] = kvps_el_f16_to_f32(s[i + j]);
    }
    kvps__h2f_avx2(d + i, s + i, n - i);
}
KVPS__TARGET_AVX2 static void kvps__f2b_avx2(uint16_t *d, const float *s, size_t n) {
    size_t i = 0;
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff);
    for (; i + 8 <= n; i += 8) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(s + i));
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, half)), 16);
        __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
        _mm_storeu_si128((__m128i *)(void *)(d + i), p);
        __m256 v = _mm256_castsi256_ps(x);
        int nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        for (int j = 0; nan && j < 8; j++)
            if (nan >> j & 1) d[i + j] = kvps_el_f32_to_bf16(s[i + j]);
    }
    for (; i < n; i++) d[i] = kvps_el_f32_to_bf16(s[i]);
}
KVPS__TARGET_AVX2 static void kvps__b2f_avx2(float *d, const uint16_t *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(s + i)));
        _mm256_storeu_si256((__m256i *)(void *)(d + i), _mm256_slli_epi32(w, 16));
    }
    for (; i < n; i++) d[i] = kvps_el_bf16_to_f32(s[i]);
}
KVPS__TARGET_AVX512 static void kvps__f2b_avx512(uint16_t *d, const float *s, size_t n) {
    size_t i = 0;
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff);
    for (; i + 16 <= n; i += 16) {
        __m512i x = _mm512_loadu_si512((const void *)(s + i));
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(x, 16), one), half)), 16);
        _mm256_storeu_si256((__m256i *)(void *)(d + i), _mm512_cvtepi32_epi16(r));
        __m512 v = _mm512_castsi512_ps(x);
        __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        for (int j = 0; nan && j < 16; j++)
            if (nan >> j & 1) d[i + j] = kvps_el_f32_to_bf16(s[i + j]);
    }
    kvps__f2b_avx2(d + i, s + i, n - i);
}
KVPS__TARGET_AVX512 static void kvps__b2f_avx512(float *d, const uint16_t *s, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(s + i)));
        _mm512_storeu_si512((void *)(d + i), _mm512_slli_epi32(w, 16));
    }
    kvps__b2f_avx2(d + i, s + i, n - i);
}
#endif

KVPS_API void kvps_f32_to_f16_n(uint16_t *dst, const float *src, size_t n) {
#ifdef KVPS__X86
    int isa = kvps__isa();
    if (isa == KVPS_ISA_AVX512) { kvps__f2h_avx512(dst, src, n); return; }
    if (isa == KVPS_ISA_AVX2) { kvps__f2h_avx2(dst, src, n); return; }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = kvps_el_f32_to_f16(src[i]);
}
KVPS_API void kvps_f16_to_f32_n(float *dst, const uint16_t *src, size_t n) {
#ifdef KVPS__X86
    int isa = kvps__isa();
    if (isa == KVPS_ISA_AVX512) { kvps__h2f_avx512(dst, src, n); return; }
    if (isa == KVPS_ISA_AVX2) { kvps__h2f_avx2(dst, src, n); return; }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = kvps_el_f16_to_f32(src[i]);
}
KVPS_API void kvps_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n) {
#ifdef KVPS__X86
    if (kvps__isa() == KVPS_ISA_AVX512) { kvps__f2b_avx512(dst, src, n); return; }
    if (kvps__isa() >= KVPS_ISA_AVX2) { kvps__f2b_avx2(dst, src, n); return; }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = kvps_el_f32_to_bf16(src[i]);
}
KVPS_API void kvps_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n) {
#ifdef KVPS__X86
    if (kvps__isa() == KVPS_ISA_AVX512) { kvps__b2f_avx512(dst, src, n); return; }
    if (kvps__isa() >= KVPS_ISA_AVX2) { kvps__b2f_avx2(dst, src, n); return; }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = kvps_el_bf16_to_f32(src[i]);
}

/* Error feedback for the 16-bit formats, one pass: v = x + r; h = half(v); r = v - float(h). */
static void kvps__half_ef_portable(const float *x, float *r, uint16_t *h, size_t n, int f16) {
    for (size_t i = 0; i < n; i++) {
        float v = x[i] + r[i];
        h[i] = f16 ? kvps_el_f32_to_f16(v) : kvps_el_f32_to_bf16(v);
        r[i] = v - (f16 ? kvps_el_f16_to_f32(h[i]) : kvps_el_bf16_to_f32(h[i]));
    }
}
#ifdef KVPS__X86
KVPS__TARGET_AVX2 static void kvps__half_ef_avx2(const float *x, float *r, uint16_t *h, size_t n, int f16) {
    size_t i = 0;
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff);
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(r + i));
        __m128i hv;
        __m256 back;
        if (f16) {
            hv = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            back = _mm256_cvtph_ps(hv);
        } else {
            __m256i xi = _mm256_castps_si256(v);
            __m256i rr = _mm256_srli_epi32(_mm256_add_epi32(xi, _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(xi, 16), one), half)), 16);
            hv = _mm_packus_epi32(_mm256_castsi256_si128(rr), _mm256_extracti128_si256(rr, 1));
            back = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(hv), 16));
        }
        _mm_storeu_si128((__m128i *)(void *)(h + i), hv);
        _mm256_storeu_ps(r + i, _mm256_sub_ps(v, back));
        int nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        if (nan) { /* NaN lanes by the scalar rules, from the sums */
            float vs[8];
            _mm256_storeu_ps(vs, v);
            for (int j = 0; j < 8; j++) {
                if (!(nan >> j & 1)) continue;
                h[i + j] = f16 ? kvps_el_f32_to_f16(vs[j]) : kvps_el_f32_to_bf16(vs[j]);
                r[i + j] = vs[j] - (f16 ? kvps_el_f16_to_f32(h[i + j]) : kvps_el_bf16_to_f32(h[i + j]));
            }
        }
    }
    kvps__half_ef_portable(x + i, r + i, h + i, n - i, f16);
}
KVPS__TARGET_AVX512 static void kvps__half_ef_avx512(const float *x, float *r, uint16_t *h, size_t n, int f16) {
    size_t i = 0;
    for (; f16 && i + 16 <= n; i += 16) {
        __m512 v = _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(r + i));
        __m256i hv = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_si256((__m256i *)(void *)(h + i), hv);
        _mm512_storeu_ps(r + i, _mm512_sub_ps(v, _mm512_cvtph_ps(hv)));
        __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        if (nan) { /* NaN lanes by the scalar rules, from the sums */
            float vs[16];
            _mm512_storeu_ps(vs, v);
            for (int j = 0; j < 16; j++) {
                if (!(nan >> j & 1)) continue;
                h[i + j] = kvps_el_f32_to_f16(vs[j]);
                r[i + j] = vs[j] - kvps_el_f16_to_f32(h[i + j]);
            }
        }
    }
    kvps__half_ef_avx2(x + i, r + i, h + i, n - i, f16);
}
#endif
static void kvps__half_ef(const float *x, float *r, uint16_t *h, size_t n, int f16) {
#ifdef KVPS__X86
    int isa = kvps__isa();
    if (isa == KVPS_ISA_AVX512) { kvps__half_ef_avx512(x, r, h, n, f16); return; }
    if (isa == KVPS_ISA_AVX2) { kvps__half_ef_avx2(x, r, h, n, f16); return; }
#endif
    kvps__half_ef_portable(x, r, h, n, f16);
}

// >>topk
/* Top-k by magnitude. A threshold is guessed from a sorted sample, one filter pass keeps the
   indices at or above it (at most cap of them), and an exact radix select trims those to k. The
   guess is searched by bisection over the sample's positions; when no sample value lies between a
   threshold that keeps too many and one that keeps too few (heavy ties, or fewer than k entries
   above a value most of the input shares: a sparse gradient), the k-th largest magnitude is
   selected exactly over the whole input instead. Every path ends in a bounded number of passes. */

/* r[i] = x[i] + r[i] for i in [from, n): a filter pass that stops early finishes the
   error-feedback accumulation with it (x + r, the order the pass uses: NaN payloads match). */
static void kvps__acc_rest(const float *x, float *r, size_t from, size_t n) {
    if (r)
        for (size_t i = from; i < n; i++) r[i] = x[i] + r[i];
}

/* Indices i with |x[i] (+ r[i])| >= t into out (at most cap); with r, r += x on the way (the
   error-feedback accumulation, fused into the same pass, and always finished over all n).
   Returns the count, or cap + 1 when there are more than cap. */
static size_t kvps__filter_portable(const float *x, float *r, size_t n, uint32_t t, uint32_t *out, uint32_t *keys,
                                    size_t cap) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        if (r) { v += r[i]; r[i] = v; }
        uint32_t key = kvps_el_mag(v);
        if (key >= t) {
            if (c == cap) { kvps__acc_rest(x, r, i + 1, n); return cap + 1; }
            keys[c] = key;
            out[c++] = (uint32_t)i;
        }
    }
    return c;
}

#ifdef KVPS__X86
KVPS__TARGET_AVX2 static size_t kvps__filter_avx2(const float *x, float *r, size_t n, uint32_t t, uint32_t *out, uint32_t *keys,
                                                  size_t cap) {
    size_t c = 0, i = 0;
    /* t >= 1 here and keys < 2^31: a signed compare against t - 1 is exact */
    const __m256i am = _mm256_set1_epi32(0x7fffffff), tm1 = _mm256_set1_epi32((int)(t - 1));
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        if (r) { v = _mm256_add_ps(v, _mm256_loadu_ps(r + i)); _mm256_storeu_ps(r + i, v); }
        __m256i key = _mm256_and_si256(_mm256_castps_si256(v), am);
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(key, tm1)));
        if (!m) continue;
        if (c + (size_t)__builtin_popcount(m) > cap) { kvps__acc_rest(x, r, i + 8, n); return cap + 1; }
        uint32_t kl[8];
        _mm256_storeu_si256((__m256i *)(void *)kl, key);
        while (m) { unsigned j = (unsigned)__builtin_ctz(m); keys[c] = kl[j]; out[c++] = (uint32_t)(i + j); m &= m - 1; }
    }
    size_t rest = kvps__filter_portable(x + i, r ? r + i : NULL, n - i, t, out + c, keys + c, cap - c);
    if (rest > cap - c) return cap + 1;
    for (size_t j = 0; j < rest; j++) out[c + j] += (uint32_t)i;
    return c + rest;
}
KVPS__TARGET_AVX512 static size_t kvps__filter_avx512(const float *x, float *r, size_t n, uint32_t t, uint32_t *out,
                                                      uint32_t *keys, size_t cap) {
    size_t c = 0, i = 0;
    const __m512i am = _mm512_set1_epi32(0x7fffffff), tv = _mm512_set1_epi32((int)t), step = _mm512_set1_epi32(16);
    __m512i iv = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; i + 16 <= n; i += 16, iv = _mm512_add_epi32(iv, step)) {
        __m512 v = _mm512_loadu_ps(x + i);
        if (r) { v = _mm512_add_ps(v, _mm512_loadu_ps(r + i)); _mm512_storeu_ps(r + i, v); }
        __m512i key = _mm512_and_si512(_mm512_castps_si512(v), am);
        __mmask16 m = _mm512_cmpge_epu32_mask(key, tv);
        if (!m) continue;
        size_t k = (size_t)__builtin_popcount(m);
        if (c + k > cap) { kvps__acc_rest(x, r, i + 16, n); return cap + 1; }
        if (c + 16 <= cap) { /* compress in a register, store whole: a compress-store to memory is
                                microcoded on AMD's Zen 4 (7.6x slower there), fast on Intel */
            _mm512_storeu_si512((void *)(out + c), _mm512_maskz_compress_epi32(m, iv));
            _mm512_storeu_si512((void *)(keys + c), _mm512_maskz_compress_epi32(m, key));
        } else { /* the last entries below cap: only the k kept ones may be written */
            _mm512_mask_compressstoreu_epi32(out + c, m, iv);
            _mm512_mask_compressstoreu_epi32(keys + c, m, key);
        }
        c += k;
    }
    size_t rest = kvps__filter_avx2(x + i, r ? r + i : NULL, n - i, t, out + c, keys + c, cap - c);
    if (rest > cap - c) return cap + 1;
    for (size_t j = 0; j < rest; j++) out[c + j] += (uint32_t)i;
    return c + rest;
}
#endif

static size_t kvps__filter(const float *x, float *r, size_t n, uint32_t t, uint32_t *out, uint32_t *keys, size_t cap) {
#ifdef KVPS__X86
    int isa = kvps__isa();
    if (t > 0 && isa == KVPS_ISA_AVX512) return kvps__filter_avx512(x, r, n, t, out, keys, cap);
    if (t > 0 && isa == KVPS_ISA_AVX2) return kvps__filter_avx2(x, r, n, t, out, keys, cap);
#endif
    return kvps__filter_portable(x, r, n, t, out, keys, cap); /* t == 0 takes everything */
}

static int kvps__cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The k-th largest key (1 <= k <= n) of keys[0..n), or of |x[0..n)| when keys is NULL: radix
   select on 11 + 11 + 10 bits. With tmp (n entries, not aliasing keys) each pass keeps the
   survivors of the last; without it each pass reads all n again. *above (if given): how many
   keys are strictly larger. */
static uint32_t kvps__kth_largest(const uint32_t *keys, const float *x, size_t n, size_t k, uint32_t *tmp,
                                  size_t *above_out) {
    static const int sh[3] = {21, 10, 0}, wb[3] = {11, 11, 10};
    /* four histograms, entry j counted in the (j % 4)-th: when most keys fall in one bin (a
       sparse gradient's zeros) one counter would make each increment wait for the last */
    uint32_t h4[4][2048];
    size_t hist[2048], above_all = 0;
    uint32_t prefix = 0, pmask = 0;
    const uint32_t *cur = keys;
    size_t cn = n;
    for (int pass = 0; pass < 3; pass++) {
        uint32_t w = 1u << wb[pass], sv = (uint32_t)sh[pass], wm = w - 1;
        memset(h4, 0, sizeof h4);
#define KVPS__HIST(KEY)                                                                            \
    do {                                                                                           \
        size_t j = 0;                                                                              \
        for (; j + 4 <= cn; j += 4) {                                                              \
            uint32_t k0 = KEY(j), k1 = KEY(j + 1), k2 = KEY(j + 2), k3 = KEY(j + 3);               \
            h4[0][(k0 >> sv) & wm] += (k0 & pmask) == prefix;                                      \
            h4[1][(k1 >> sv) & wm] += (k1 & pmask) == prefix;                                      \
            h4[2][(k2 >> sv) & wm] += (k2 & pmask) == prefix;                                      \
            h4[3][(k3 >> sv) & wm] += (k3 & pmask) == prefix;                                      \
        }                                                                                          \
        for (; j < cn; j++) {                                                                      \
            uint32_t key = KEY(j);                                                                 \
            h4[0][(key >> sv) & wm] += (key & pmask) == prefix;                                    \
        }                                                                                          \
    } while (0)
#define KVPS__KEY_LIST(j) cur[j]
#define KVPS__KEY_MAG(j) kvps_el_mag(x[j])
        if (cur) KVPS__HIST(KVPS__KEY_LIST); /* two loops, so that each is a tight one */
        else KVPS__HIST(KVPS__KEY_MAG);
#undef KVPS__HIST
#undef KVPS__KEY_LIST
#undef KVPS__KEY_MAG
        for (uint32_t b = 0; b < w; b++) hist[b] = (size_t)h4[0][b] + h4[1][b] + h4[2][b] + h4[3][b];
        size_t above = 0;
        uint32_t b = w - 1;
        for (;; b--) {
            if (above + hist[b] >= k || b == 0) break;
            above += hist[b];
        }
        k -= above;
        above_all += above;
        prefix |= b << sv;
        pmask |= wm << sv;
        if (!cur || !tmp) continue;
        size_t m = 0;
        for (size_t j = 0; j < cn; j++)
            if ((cur[j] & pmask) == prefix) tmp[m++] = cur[j];
        cur = tmp;
        cn = m;
    }
    if (above_out) *above_out = above_all;
    return prefix;
}

/* The exact trim: of the cnt candidates (index cand[j], key keys[j]; both NULL: every index of
   acc, key |acc[j]|), the k of largest key, ties to the lower index, into idx / val in index
   order; with r, the residual of each one taken becomes 0. T is the k-th largest key among
   them and `above` how many keys are larger than T. */
static void kvps__topk_take(const float *acc, float *r, const uint32_t *cand, const uint32_t *keys, size_t cnt,
                            size_t k, uint32_t T, size_t above, uint32_t *idx, float *val) {
    size_t ties = k - above, o = 0;
    for (size_t j = 0; j < cnt && o < k; j++) {
        uint32_t key = keys ? keys[j] : kvps_el_mag(acc[j]);
        if (key < T || (key == T && ties == 0)) continue;
        if (key == T) ties--;
        uint32_t i = cand ? cand[j] : (uint32_t)j;
        idx[o] = i;
        val[o] = acc[i];
        if (r) r[i] = 0.0f;
        o++;
    }
    KVPS_ASSERT(o == k);
}

/* Candidates a filter pass may keep beyond 2k before the threshold is raised. The fuzz target
   sets it small, so that short inputs reach every path of the search (fuzz/fuzz_codec.c). */
#ifndef KVPS__TOPK_SLACK
#define KVPS__TOPK_SLACK 65536
#endif

/* Top-k of x (+ r, accumulated into r when r is given). idx ascending; val = the selected
   values of x + r. With r, the selected entries' residual becomes 0. */
static kvps_result kvps__topk_ef(const float *x, float *r, size_t n, size_t k, uint32_t *idx, float *val) {
    if ((!x && n) || (k && (!idx || !val)) || k > n || n > UINT32_MAX) return KVPS_ERR_INVALID_ARG;
    if (k == 0 || k == n) {
        for (size_t i = 0; i < n; i++) {
            float v = r ? x[i] + r[i] : x[i]; /* not x + 0.0f: that turns -0 into +0 */
            if (r) r[i] = k ? 0.0f : v;
            if (k) { idx[i] = (uint32_t)i; val[i] = v; }
        }
        return KVPS_OK;
    }
    /* about n/16 samples, 256 to 8192: enough to place the threshold, cheap for small tensors */
    size_t m = n / 16 < 256 ? (n < 256 ? n : 256) : n / 16 > 8192 ? 8192 : n / 16;
    uint32_t *samp = (uint32_t *)malloc(m * sizeof *samp);
    if (!samp) return KVPS_ERR_NOMEM;
    for (size_t j = 0; j < m; j++) {
        size_t p = (size_t)((uint64_t)j * n / m);
        samp[j] = kvps_el_mag(r ? x[p] + r[p] : x[p]);
    }
    qsort(samp, m, sizeof *samp, kvps__cmp_u32);
    /* the threshold at sample position p: samp[p], and position 0 takes everything; it does not
       fall as p rises. First guess: the expected sample count above the k-th largest, plus 4
       standard deviations, aiming at about 2k candidates. */
#define KVPS__THR(p) ((p) <= 0 ? 0u : samp[p])
    double mu = (double)k / (double)n * (double)m, want = mu + 4.0 * sqrt(mu) + 8.0;
    long pos = (long)m - (long)want;
    /* lo: the highest position known to keep more than cap; hi: the lowest known to keep fewer
       than k. Positions strictly between them are the ones left to try. */
    long lo = -1, hi = (long)m;
    size_t cap = n < 2 * k + KVPS__TOPK_SLACK ? n : 2 * k + KVPS__TOPK_SLACK;
    /* candidates: indices, their keys, and room for the radix select */
    uint32_t *cand = (uint32_t *)malloc(cap * 3 * sizeof *cand);
    kvps_result rc = cand ? KVPS_OK : KVPS_ERR_NOMEM;
    size_t cnt = 0;
    const float *src = x; /* the first pass accumulates r += x; later passes read r */
    float *rr = r;
    int found = 0;
    while (rc == KVPS_OK && lo + 1 < hi) {
        pos = pos <= lo ? lo + 1 : pos >= hi ? hi - 1 : pos;
        uint32_t t = KVPS__THR(pos);
        cnt = kvps__filter(src, rr, n, t, cand, cand + cap, cap);
        if (rr) { src = r; rr = NULL; }
        if (cnt <= cap && cnt >= k) { found = 1; break; }
        if (cnt > cap) { /* too many: every position with this threshold keeps as many */
            for (lo = pos; lo + 1 < (long)m && KVPS__THR(lo + 1) == t; lo++) {}
            pos = lo + (hi - lo) / 2;
        } else { /* too few: likewise; below, step down twice as far as from the top until
                    a position that keeps too many is known, then bisect */
            for (hi = pos; hi > 0 && KVPS__THR(hi - 1) == t; hi--) {}
            pos = lo < 0 ? hi - ((long)m - hi) - 1 : lo + (hi - lo) / 2;
        }
    }
    uint32_t t_lo = lo >= 0 ? KVPS__THR(lo) : 0; /* at least cap >= k keys are >= t_lo */
#undef KVPS__THR
    if (rc == KVPS_OK) {
        const float *acc = r ? r : x;
        size_t above = 0;
        if (found) { /* the exact trim among the candidates */
            uint32_t *kk = cand + cap, T = kvps__kth_largest(kk, NULL, cnt, k, cand + 2 * cap, &above);
            kvps__topk_take(acc, r, cand, kk, cnt, k, T, above, idx, val);
        } else { /* no sampled threshold fits: select over the whole (accumulated) input. When
                    fewer than k keys are above t_lo (the usual reason: a sparse gradient's zeros,
                    or a plateau most of the input shares), t_lo is the k-th largest itself */
            for (size_t i = 0; i < n; i++) above += kvps_el_mag(acc[i]) > t_lo;
            uint32_t T = t_lo;
            if (above >= k) T = kvps__kth_largest(NULL, acc, n, k, NULL, &above);
            kvps__topk_take(acc, r, NULL, NULL, n, k, T, above, idx, val);
        }
    }
    free(samp);
    free(cand);
    return rc;
}

KVPS_API kvps_result kvps_topk(const float *x, size_t n, size_t k, uint32_t *idx, float *val) {
    return kvps__topk_ef(x, NULL, n, k, idx, val);
}

// >>sign
/* Sum of |v| in a fixed order (8 interleaved partial sums, combined pairwise), so that the
   portable and vector paths give the same scale bit for bit. */
static float kvps__canon_nan(float x) { /* which NaN a sum ends on depends on operand order */
    if (x != x) { uint32_t q = 0x7fc00000u; memcpy(&x, &q, sizeof x); }
    return x;
}

static float kvps__abs_sum(const float *v, size_t n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += fabsf(v[i + j]);
    for (int j = 0; i < n; i++, j++) s[j] += fabsf(v[i]);
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* One chunk: acc = x (+ r), scale = mean |acc|, sign bits, and r = acc - decoded. */
static void kvps__sign_chunk(const float *x, float *r, size_t n, float *scale, uint8_t *bits, size_t bit0) {
    float tmp[256], *acc = tmp;
    if (r) {
        for (size_t i = 0; i < n; i++) r[i] += x[i];
        acc = r;
    } else if (n <= 256) {
        memcpy(tmp, x, n * sizeof *x);
    } else {
        acc = (float *)(uintptr_t)x;
    }
    float sc = n ? kvps__canon_nan(kvps__abs_sum(acc, n) / (float)n) : 0.0f;
    *scale = sc;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &acc[i], sizeof u);
        size_t b = bit0 + i;
        if (u >> 31) bits[b >> 3] |= (uint8_t)(1u << (b & 7));
        else bits[b >> 3] &= (uint8_t) ~(1u << (b & 7));
        if (r) r[i] = acc[i] - ((u >> 31) ? -sc : sc);
    }
}

#ifdef KVPS__X86
/* Same arithmetic as kvps__abs_sum / kvps__sign_chunk in the same order: bit-identical. n is a
   multiple of 8 and bit0 too (whole bytes of sign bits). */
KVPS__TARGET_AVX2 static void kvps__sign_chunk_avx2(const float *x, float *r, size_t n, float *scale, uint8_t *bits,
                                                    size_t bit0) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 s = _mm256_setzero_ps();
    const float *acc = x;
    if (r) {
        for (size_t i = 0; i < n; i += 8) {
            __m256 v = _mm256_add_ps(_mm256_loadu_ps(r + i), _mm256_loadu_ps(x + i));
            _mm256_storeu_ps(r + i, v);
            s = _mm256_add_ps(s, _mm256_and_ps(v, absm));
        }
        acc = r;
    } else {
        for (size_t i = 0; i < n; i += 8) s = _mm256_add_ps(s, _mm256_and_ps(_mm256_loadu_ps(x + i), absm));
    }
    float l[8];
    _mm256_storeu_ps(l, s);
    float sc = kvps__canon_nan((((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))) / (float)n);
    *scale = sc;
    const __m256 scv = _mm256_set1_ps(sc), sgn = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    for (size_t i = 0; i < n; i += 8) {
        __m256 v = _mm256_loadu_ps(acc + i);
        bits[(bit0 + i) >> 3] = (uint8_t)_mm256_movemask_ps(v);
        if (r) _mm256_storeu_ps(r + i, _mm256_sub_ps(v, _mm256_or_ps(_mm256_and_ps(v, sgn), scv)));
    }
}
KVPS__TARGET_AVX2 static void kvps__sign_decode_avx2(const uint8_t *bits, size_t bit0, float sc, float *dst, size_t n,
                                                     int accumulate) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 scv = _mm256_set1_ps(sc);
    for (size_t i = 0; i < n; i += 8) {
        __m256i b = _mm256_set1_epi32(bits[(bit0 + i) >> 3]);
        __m256i sbit = _mm256_slli_epi32(_mm256_srlv_epi32(b, lane), 31);
        __m256 v = _mm256_xor_ps(scv, _mm256_castsi256_ps(sbit));
        if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(dst + i), v);
        _mm256_storeu_ps(dst + i, v);
    }
}
#endif

// >>codecs
static void kvps__put32(unsigned char *p, uint32_t v) { memcpy(p, &v, sizeof v); }

/* The largest blob of each built-in codec for n values (KVPS_CODEC_TABLE's last column). */
static size_t kvps__max_f32(const kvps_codec *c, size_t n) { (void)c; return KVPS_CODEC_HEADER + n * 4; }
static size_t kvps__max_half(const kvps_codec *c, size_t n) { (void)c; return KVPS_CODEC_HEADER + n * 2; }
static size_t kvps__max_topk(const kvps_codec *c, size_t n) {
    return KVPS_CODEC_HEADER + 4 + kvps_el_topk_k(c, n) * (c->topk_fp16_values ? 6 : 8);
}
static uint32_t kvps__sign_chunk_len(const kvps_codec *c) { return c->sign_chunk ? c->sign_chunk : KVPS_DEFAULT_SIGN_CHUNK; }
static size_t kvps__max_sign(const kvps_codec *c, size_t n) {
    size_t ch = kvps__sign_chunk_len(c);
    return KVPS_CODEC_HEADER + 4 + (n + ch - 1) / ch * 4 + (n + 7) / 8;
}

/* What a decode does with the values: dst = them, dst += them, or nothing (the blob is only
   checked, whole: the server's check of a push before it changes anything). The public decode
   takes 0 or 1 (its accumulate); KVPS__DEC_CHECK is kvps's own. */
typedef enum kvps__dec_mode { KVPS__DEC_SET = 0, KVPS__DEC_ADD = 1, KVPS__DEC_CHECK = 2 } kvps__dec_mode;

/* Each built-in codec's encode and decode, found by name from KVPS_CODEC_TABLE. An encode writes
   the payload at p (after the header, which kvps__codec_encode_builtin wrote) from x + r, leaves
   in r what was not sent, and may lower *need (top-k: the bytes it wrote). A decode gets the
   blob p, its verdict already KVPS_OK, and its payload q. */
static kvps_result kvps__enc_NONE(const kvps_codec *c, const float *x, size_t n, float *r, unsigned char *p, size_t *need) {
    (void)c; (void)need;
    for (size_t i = 0; i < n; i++) {
        float v = r ? x[i] + r[i] : x[i];
        memcpy(p + i * 4, &v, 4);
        if (r) r[i] = 0.0f;
    }
    return KVPS_OK;
}
static kvps_result kvps__dec_NONE(const unsigned char *p, const unsigned char *q, float *dst, size_t n, kvps__dec_mode mode) {
    (void)p;
    for (size_t i = 0; i < n; i++) { float v; memcpy(&v, q + i * 4, 4); dst[i] = mode == KVPS__DEC_ADD ? dst[i] + v : v; }
    return KVPS_OK;
}

/* FP16 and BF16: n x u16, straight into (out of) the blob where it is aligned for it. */
static void kvps__enc_half(const float *x, size_t n, float *r, unsigned char *p, int f16) {
    if (((uintptr_t)p & 1) == 0) {
        uint16_t *h = (uint16_t *)(void *)p;
        if (r) kvps__half_ef(x, r, h, n, f16);
        else if (f16) kvps_f32_to_f16_n(h, x, n);
        else kvps_f32_to_bf16_n(h, x, n);
        return;
    }
    enum { B = 2048 };
    uint16_t h[B];
    for (size_t b = 0; b < n; b += B) {
        size_t m = n - b < (size_t)B ? n - b : (size_t)B;
        if (r) kvps__half_ef(x + b, r + b, h, m, f16);
        else if (f16) kvps_f32_to_f16_n(h, x + b, m);
        else kvps_f32_to_bf16_n(h, x + b, m);
        memcpy(p + b * 2, h, m * 2);
    }
}
static void kvps__dec_half(const unsigned char *q, float *dst, size_t n, kvps__dec_mode mode, int f16) {
    if (mode == KVPS__DEC_SET && ((uintptr_t)q & 1) == 0) {
        if (f16) kvps_f16_to_f32_n(dst, (const uint16_t *)(const void *)q, n);
        else kvps_bf16_to_f32_n(dst, (const uint16_t *)(const void *)q, n);
        return;
    }
    enum { B = 2048 };
    uint16_t h[B];
    float tmp[B];
    for (size_t b = 0; b < n; b += B) {
        size_t m = n - b < (size_t)B ? n - b : (size_t)B;
        memcpy(h, q + b * 2, m * 2);
        float *o = mode == KVPS__DEC_ADD ? tmp : dst + b;
        if (f16) kvps_f16_to_f32_n(o, h, m); else kvps_bf16_to_f32_n(o, h, m);
        if (mode == KVPS__DEC_ADD) kvps__add(dst + b, tmp, m);
    }
}
static kvps_result kvps__enc_FP16(const kvps_codec *c, const float *x, size_t n, float *r, unsigned char *p, size_t *need) {
    (void)c; (void)need;
    kvps__enc_half(x, n, r, p, 1);
    return KVPS_OK;
}
static kvps_result kvps__enc_BF16(const kvps_codec *c, const float *x, size_t n, float *r, unsigned char *p, size_t *need) {
    (void)c; (void)need;
    kvps__enc_half(x, n, r, p, 0);
    return KVPS_OK;
}
static kvps_result kvps__dec_FP16(const unsigned char *p, const unsigned char *q, float *dst, size_t n, kvps__dec_mode mode) {
    (void)p;
    kvps__dec_half(q, dst, n, mode, 1);
    return KVPS_OK;
}
static kvps_result kvps__dec_BF16(const unsigned char *p, const unsigned char *q, float *dst, size_t n, kvps__dec_mode mode) {
    (void)p;
    kvps__dec_half(q, dst, n, mode, 0);
    return KVPS_OK;
}

/* TOPK: u32 k; k indices; k values (f32, or fp16 with KVPS_CODEC_FLAG_FP16_VALUES). */
static kvps_result kvps__enc_TOPK(const kvps_codec *c, const float *x, size_t n, float *r, unsigned char *p, size_t *need) {
    size_t k = kvps_el_topk_k(c, n);
    /* select straight into the output when it is aligned for it */
    int direct = ((uintptr_t)(p + 4) & 3) == 0 && !c->topk_fp16_values;
    uint32_t *idx = direct ? (uint32_t *)(void *)(p + 4) : (uint32_t *)malloc((k ? k : 1) * sizeof *idx);
    float *val = direct ? (float *)(void *)(p + 4 + k * 4) : (float *)malloc((k ? k : 1) * sizeof *val);
    kvps_result rc = idx && val ? kvps__topk_ef(x, r, n, k, idx, val) : KVPS_ERR_NOMEM;
    if (rc == KVPS_OK) {
        kvps__put32(p, (uint32_t)k);
        if (!direct) memcpy(p + 4, idx, k * 4);
        if (direct) {
            /* already in place */
        } else if (c->topk_fp16_values) {
            uint16_t *hv = (uint16_t *)malloc((k ? k : 1) * sizeof *hv);
            if (!hv) rc = KVPS_ERR_NOMEM;
            else {
                kvps_f32_to_f16_n(hv, val, k);
                memcpy(p + 4 + k * 4, hv, k * 2);
                if (r) /* what fp16 rounding lost stays in the residual too */
                    for (size_t j = 0; j < k; j++) r[idx[j]] = val[j] - kvps_el_f16_to_f32(hv[j]);
                free(hv);
            }
        } else {
            memcpy(p + 4 + k * 4, val, k * 4);
        }
    }
    if (!direct) { free(idx); free(val); }
    if (rc == KVPS_OK) *need = KVPS_CODEC_HEADER + 4 + k * (c->topk_fp16_values ? 6 : 8);
    return rc;
}
static kvps_result kvps__dec_TOPK(const unsigned char *p, const unsigned char *q, float *dst, size_t n, kvps__dec_mode mode) {
    size_t k = kvps_el_get32(q), vs = (p[1] & KVPS_CODEC_FLAG_FP16_VALUES) ? 2 : 4;
    const unsigned char *ix = q + 4, *vv = q + 4 + k * 4;
    for (size_t j = 0; j < k; j++) { /* check all before writing anything */
        uint32_t i = kvps_el_get32(ix + j * 4);
        if (i >= n || (j && i <= kvps_el_get32(ix + (j - 1) * 4))) return KVPS_ERR_MALFORMED;
    }
    if (mode == KVPS__DEC_CHECK) return KVPS_OK;
    if (mode == KVPS__DEC_SET) memset(dst, 0, n * sizeof *dst);
    for (size_t j = 0; j < k; j++) {
        uint32_t i = kvps_el_get32(ix + j * 4);
        float v;
        if (vs == 2) { uint16_t h; memcpy(&h, vv + j * 2, 2); v = kvps_el_f16_to_f32(h); }
        else memcpy(&v, vv + j * 4, 4);
        dst[i] += v;
    }
    return KVPS_OK;
}

/* SIGN: u32 chunk; a scale per chunk; the sign bits. */
static kvps_result kvps__enc_SIGN(const kvps_codec *c, const float *x, size_t n, float *r, unsigned char *p, size_t *need) {
    (void)need;
    uint32_t ch = kvps__sign_chunk_len(c);
    size_t nc = (n + ch - 1) / ch;
    kvps__put32(p, ch);
    unsigned char *scales = p + 4, *bits = p + 4 + nc * 4;
    memset(bits, 0, (n + 7) / 8);
    for (size_t b = 0, j = 0; b < n; b += ch, j++) {
        size_t m = n - b < ch ? n - b : ch;
        float sc;
#ifdef KVPS__X86
        if (m % 8 == 0 && b % 8 == 0 && kvps__isa() >= KVPS_ISA_AVX2) /* whole bytes of sign bits */ kvps__sign_chunk_avx2(x + b, r ? r + b : NULL, m, &sc, bits, b);
        else
#endif
        kvps__sign_chunk(x + b, r ? r + b : NULL, m, &sc, bits, b);
        memcpy(scales + j * 4, &sc, 4);
    }
    return KVPS_OK;
}
static kvps_result kvps__dec_SIGN(const unsigned char *p, const unsigned char *q, float *dst, size_t n, kvps__dec_mode mode) {
    (void)p;
    uint32_t ch = kvps_el_get32(q);
    size_t nc = (n + ch - 1) / ch;
    const unsigned char *scales = q + 4, *bits = q + 4 + nc * 4;
    for (size_t b = 0, j = 0; b < n; b += ch, j++) {
        float sc;
        memcpy(&sc, scales + j * 4, 4);
        size_t e = n - b < ch ? n : b + ch;
#ifdef KVPS__X86
        if ((e - b) % 8 == 0 && b % 8 == 0 && kvps__isa() >= KVPS_ISA_AVX2) {
            kvps__sign_decode_avx2(bits, b, sc, dst + b, e - b, mode == KVPS__DEC_ADD);
            continue;
        }
#endif
        for (size_t i = b; i < e; i++) {
            float v = (bits[i >> 3] >> (i & 7) & 1) ? -sc : sc;
            dst[i] = mode == KVPS__DEC_ADD ? dst[i] + v : v;
        }
    }
    return KVPS_OK;
}

/* A built-in codec's row of KVPS_CODEC_TABLE with its functions; NULL for any other id. */
typedef struct kvps__codec_row {
    int id;
    const char *name;
    int dense, flags;
    size_t (*max_bytes)(const kvps_codec *c, size_t n);
    kvps_result (*enc)(const kvps_codec *c, const float *x, size_t n, float *r, unsigned char *p, size_t *need);
    kvps_result (*dec)(const unsigned char *p, const unsigned char *q, float *dst, size_t n, kvps__dec_mode mode);
} kvps__codec_row;
static const kvps__codec_row *kvps__codec_info(int id) {
    static const kvps__codec_row rows[] = {
#define KVPS__ROW(cid, num, name, dense, fl, size_fn, max_fn) {num, name, dense, fl, max_fn, kvps__enc_##cid, kvps__dec_##cid},
        KVPS_CODEC_TABLE(KVPS__ROW)
#undef KVPS__ROW
    };
    return id >= 0 && id < KVPS_CODEC_COUNT ? &rows[id] : NULL;
}

static size_t kvps__codec_max_builtin(const kvps_codec *c, size_t n) {
    const kvps__codec_row *row = kvps__codec_info(c->id);
    return row ? row->max_bytes(c, n) : 0;
}

static kvps_result kvps__codec_encode_builtin(const kvps_codec *c, const float *x, size_t n, float *r, void *out,
                                              size_t cap, size_t *out_bytes) {
    size_t need = kvps__codec_max_builtin(c, n);
    const kvps__codec_row *row = kvps__codec_info(c->id);
    if ((!x && n) || !out || !out_bytes || n > UINT32_MAX) return KVPS_ERR_INVALID_ARG;
    if (!row) return KVPS_ERR_CODEC;
    if (cap < need) return KVPS_ERR_TOO_LARGE;
    unsigned char *o = (unsigned char *)out;
    o[0] = (uint8_t)c->id;
    o[1] = (uint8_t)(c->topk_fp16_values ? row->flags & KVPS_CODEC_FLAG_FP16_VALUES : 0);
    o[2] = o[3] = 0;
    kvps__put32(o + 4, (uint32_t)n);
    kvps_result rc = row->enc(c, x, n, r, o + KVPS_CODEC_HEADER, &need);
    if (rc == KVPS_OK) *out_bytes = need;
    return rc;
}

/* accumulate: 0 sets, KVPS__DEC_CHECK only checks, any other value adds (as the public decode). */
static kvps_result kvps__codec_decode_builtin(const kvps_codec *c, const void *in, size_t bytes, float *dst, size_t n,
                                              int accumulate) {
    const unsigned char *p = (const unsigned char *)in;
    kvps__dec_mode mode = accumulate == KVPS__DEC_CHECK ? KVPS__DEC_CHECK : accumulate ? KVPS__DEC_ADD : KVPS__DEC_SET;
    if (!in || (!dst && n && mode != KVPS__DEC_CHECK)) return KVPS_ERR_INVALID_ARG;
    int verdict = kvps_el_blob_verdict(p, bytes, c->id, n);
    if (verdict != KVPS_OK) return (kvps_result)verdict;
    const kvps__codec_row *row = kvps__codec_info(c->id); /* (the verdict knew the id) */
    if (mode == KVPS__DEC_CHECK && row->dense) return KVPS_OK; /* a sparse codec's indices: its decode checks them */
    return row->dec(p, p + KVPS_CODEC_HEADER, dst, n, mode);
}

KVPS_API kvps_codec kvps_codec_get(kvps_codec_id id) {
    kvps_codec c;
    memset(&c, 0, sizeof c);
    c.id = kvps__codec_info(id) ? (int)id : KVPS_CODEC_NONE;
    c.name = kvps__codec_info(c.id)->name;
    c.max_bytes = kvps__codec_max_builtin;
    c.encode = kvps__codec_encode_builtin;
    c.decode = kvps__codec_decode_builtin;
    return c;
}

KVPS_API size_t kvps_codec_max_bytes(const kvps_codec *c, size_t n) {
    return c && c->max_bytes ? c->max_bytes(c, n) : 0;
}
KVPS_API kvps_result kvps_codec_encode(const kvps_codec *c, const float *x, size_t n, float *residual, void *out,
                                       size_t cap, size_t *out_bytes) {
    if (!c || !c->encode) return KVPS_ERR_INVALID_ARG;
    return c->encode(c, x, n, residual, out, cap, out_bytes);
}
KVPS_API kvps_result kvps_codec_decode(const kvps_codec *c, const void *in, size_t bytes, float *dst, size_t n,
                                       int accumulate) {
    if (!c || !c->decode) return KVPS_ERR_INVALID_ARG;
    return c->decode(c, in, bytes, dst, n, accumulate);
}

#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#endif /* KVPS_CODEC__IMPLEMENTED */
