/* fuzz_codec - every built-in codec's decoder on arbitrary blobs (what a server does with a
   coded push, and a worker with a coded pull reply), and every encoder on arbitrary floats,
   each on every SIMD path this CPU has (the 16-bit wire of kvps_ring.h uses the same bulk
   conversions).

   Input: [codec byte][mode byte][u32 n][payload]
     codec byte % 5: KVPS_CODEC_NONE, FP16, BF16, TOPK, SIGN
     mode bit 7 clear: DECODE. payload = the blob; n = the length the caller expects (bit 6: take
       it from the blob's own header instead, so that the fuzzer reaches the codec bodies);
       bit 0: accumulate into a destination that already holds values.
     mode bit 7 set: ROUND TRIP. payload = float32 input x; n's low 16 bits = top-k count (0:
       the default fraction), its high 16 bits = sign chunk (0: 256); bit 3: top-k values in
       fp16; bit 4: error feedback with a residual that starts non-zero.
   Built with KVPS__TOPK_SLACK=16 (mk/fuzz.mk): top-k keeps at most 2k + 16 candidates per
   filter pass instead of 2k + 65536, so that inputs of a few dozen floats reach every path of
   its threshold search, the bisection and the exact select over the whole input that follow
   when no sampled value fits (few values above a plateau most of the input shares: a sparse
   gradient, heavy ties); test_codec checks the same shapes at the real size.

   Properties: decode never reads outside the blob or writes outside n floats; the check-only
   mode the server validates with (KVPS__DEC_CHECK) accepts exactly what decode accepts; a
   rejected blob leaves the destination untouched; every SIMD path gives the same result and
   the same bits; and for a round trip: decode(encode(x)) is accepted, NONE is exact, FP16/BF16
   equal the scalar conversions, top-k sends the k largest magnitudes (ties to the lower index)
   with strictly ascending indices, 1-bit sends sign bits and each chunk's mean |x|, and with
   error feedback decoded + residual == x + old residual exactly wherever that is finite
   (NONE, FP16, BF16, top-k). */
#define KVPS_IMPLEMENTATION
#include "kvps_codec.h" /* the codecs alone: no ZeroMQ, no server */
#include "tests/fuzz/fuzz_common.h"

static int fz_isas[3], fz_nisa;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    kvps_log_set_fn(fz_nolog, NULL);
    int best = kvps__isa_best();
    for (int i = KVPS_ISA_PORTABLE; i <= best; i++) fz_isas[fz_nisa++] = i;
    return 0;
}

static uint32_t fz_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static int fz_finite(float f) { return (fz_bits(f) & 0x7f800000u) != 0x7f800000u; }
/* Residuals: the same bits, or both NaN. Which NaN x + r gives when both are NaN depends on the
   operand order, which C leaves to the compiler (clang commutes the scalar r[i] += x[i]; the
   AVX2 path adds r + x), so only NaN-ness is compared there. */
static int fz_same(float a, float b) { return fz_bits(a) == fz_bits(b) || (a != a && b != b); }

/* ---- decode -------------------------------------------------------------------------------- */
static void fz_decode(const kvps_codec *c, const uint8_t *blob, size_t bytes, size_t n, int acc) {
    /* the blob alone in an exact-size buffer (over-reads hit the redzone), and again at an odd
       address (the 16-bit paths take another branch there) */
    uint8_t *b0 = (uint8_t *)malloc(bytes ? bytes : 1), *b1 = (uint8_t *)malloc(bytes + 1);
    if (bytes) { memcpy(b0, blob, bytes); memcpy(b1 + 1, blob, bytes); }
    float *init = (float *)malloc((n ? n : 1) * sizeof(float));
    float *ref = (float *)malloc((n ? n : 1) * sizeof(float));
    float *d = (float *)malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) init[i] = (float)(int)(i % 7) - 3.0f;

    kvps_isa_set((kvps_isa)fz_isas[0]);
    kvps_result chk = kvps__codec_decode_builtin(c, b0, bytes, NULL, n, KVPS__DEC_CHECK);
    memcpy(ref, init, n * sizeof(float));
    kvps_result r0 = kvps_codec_decode(c, b0, bytes, ref, n, acc);
    FZ_CHECK(chk == r0, "codec %d: check-only says %d, decode says %d (n %zu, %zu bytes)", c->id, chk, r0, n, bytes);
    if (r0 != KVPS_OK) FZ_CHECK(memcmp(ref, init, n * sizeof(float)) == 0, "codec %d: a rejected blob wrote the output", c->id);
    for (int k = 0; k < fz_nisa; k++) {
        kvps_isa_set((kvps_isa)fz_isas[k]);
        for (int odd = 0; odd < 2; odd++) {
            memcpy(d, init, n * sizeof(float));
            kvps_result r = kvps_codec_decode(c, odd ? b1 + 1 : b0, bytes, d, n, acc);
            FZ_CHECK(r == r0, "codec %d isa %d odd %d: %d, portable %d", c->id, fz_isas[k], odd, r, r0);
            FZ_CHECK(memcmp(d, ref, n * sizeof(float)) == 0, "codec %d isa %d odd %d: other bits than portable", c->id,
                     fz_isas[k], odd);
        }
    }
    kvps_isa_set(KVPS_ISA_AUTO);
    free(b0); free(b1); free(init); free(ref); free(d);
}

/* ---- round trip ---------------------------------------------------------------------------- */
/* 1-bit codec with error feedback: whether a NaN element is sent as negative follows the sign of
   x + r, i.e. which NaN the addition returned (see fz_same); reported, and tolerated here so
   that the run goes on: true when every differing bit `diff` of byte i is such an element's. */
static int fz_nan_sign_bit(const kvps_codec *c, const float *v, size_t n, size_t i, unsigned diff) {
    if (c->id != KVPS_CODEC_SIGN) return 0;
    uint32_t ch = c->sign_chunk ? c->sign_chunk : 256;
    size_t b0 = KVPS_CODEC_HEADER + 4 + (n + ch - 1) / ch * 4;
    if (i < b0) return 0;
    for (int j = 0; j < 8; j++)
        if (((diff >> j) & 1) && !(8 * (i - b0) + j < n && v[8 * (i - b0) + j] != v[8 * (i - b0) + j])) return 0;
    return 1;
}

static void fz_roundtrip(kvps_codec *c, const float *x, size_t n, int ef) {
    size_t cap = kvps_codec_max_bytes(c, n);
    uint8_t *ref = (uint8_t *)malloc(cap), *out = (uint8_t *)malloc(cap);
    float *r_in = (float *)malloc((n ? n : 1) * sizeof(float)), *r_ref = (float *)malloc((n ? n : 1) * sizeof(float));
    float *r = (float *)malloc((n ? n : 1) * sizeof(float)), *dec = (float *)malloc((n ? n : 1) * sizeof(float));
    float *v = (float *)malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        r_in[i] = ef ? x[n - 1 - i] * 0.25f : 0.0f; /* a residual left by an earlier step */
        v[i] = ef ? x[i] + r_in[i] : x[i];       /* what the codec is asked to send */
    }
    /* NaN + NaN: which payload the sum has is the compiler's choice (see fz_same), and top-k
       ranks NaNs by payload, so with such a pair the paths may pick other elements */
    int open_nan = 0;
    for (size_t i = 0; ef && i < n; i++) open_nan |= x[i] != x[i] && r_in[i] != r_in[i];
    size_t nb0 = 0;
    kvps_isa_set((kvps_isa)fz_isas[0]);
    memcpy(r_ref, r_in, n * sizeof(float));
    kvps_result rc = kvps_codec_encode(c, x, n, ef ? r_ref : NULL, ref, cap, &nb0);
    FZ_CHECK(rc == KVPS_OK, "codec %d: encode of %zu floats: %s", c->id, n, kvps_result_str(rc));
    FZ_CHECK(nb0 <= cap, "codec %d: %zu bytes, max_bytes said %zu", c->id, nb0, cap);
    for (int k = 1; k < fz_nisa; k++) { /* every path: the same bytes and the same residual */
        kvps_isa_set((kvps_isa)fz_isas[k]);
        size_t nb = 0;
        memcpy(r, r_in, n * sizeof(float));
        rc = kvps_codec_encode(c, x, n, ef ? r : NULL, out, cap, &nb);
        FZ_CHECK(rc == KVPS_OK && nb == nb0, "codec %d: isa %d: %s, %zu bytes (portable %zu)", c->id, fz_isas[k],
                 kvps_result_str(rc), nb, nb0);
        for (size_t i = 0; i < nb && !(open_nan && c->id == KVPS_CODEC_TOPK); i++)
            FZ_CHECK(out[i] == ref[i] || fz_nan_sign_bit(c, v, n, i, out[i] ^ ref[i]),
                     "codec %d: isa %d encodes other bytes: byte %zu 0x%02x, portable 0x%02x", c->id, fz_isas[k], i, out[i],
                     ref[i]);
        for (size_t i = 0; ef && i < n && !(open_nan && c->id == KVPS_CODEC_TOPK); i++)
            FZ_CHECK(fz_same(r[i], r_ref[i]), "codec %d: isa %d leaves another residual: [%zu] 0x%08x, portable 0x%08x "
                     "(x 0x%08x, old residual 0x%08x)", c->id, fz_isas[k], i, fz_bits(r[i]), fz_bits(r_ref[i]), fz_bits(x[i]),
                     fz_bits(r_in[i]));
    }
    kvps_isa_set(KVPS_ISA_AUTO);
    FZ_CHECK(kvps__codec_decode_builtin(c, ref, nb0, NULL, n, KVPS__DEC_CHECK) == KVPS_OK, "codec %d: check-only rejects its own output", c->id);
    rc = kvps_codec_decode(c, ref, nb0, dec, n, 0);
    FZ_CHECK(rc == KVPS_OK, "codec %d: decode of its own output: %s", c->id, kvps_result_str(rc));

    switch (c->id) {
    case KVPS_CODEC_NONE:
        for (size_t i = 0; i < n; i++) /* exact; NaN + NaN: any NaN (see fz_same) */
            FZ_CHECK(fz_bits(dec[i]) == fz_bits(v[i]) || (ef && x[i] != x[i] && r_in[i] != r_in[i] && dec[i] != dec[i]),
                     "none: element %zu: 0x%08x, sent 0x%08x", i, fz_bits(dec[i]), fz_bits(v[i]));
        break;
    case KVPS_CODEC_FP16:
    case KVPS_CODEC_BF16:
        for (size_t i = 0; i < n; i++) {
            if (ef && x[i] != x[i] && r_in[i] != r_in[i]) { /* which NaN x + r is: see fz_same */
                FZ_CHECK(dec[i] != dec[i], "codec %d: element %zu: NaN + NaN decoded as 0x%08x", c->id, i, fz_bits(dec[i]));
                continue;
            }
            float want = c->id == KVPS_CODEC_FP16 ? kvps_el_f16_to_f32(kvps_el_f32_to_f16(v[i]))
                                                  : kvps_el_bf16_to_f32(kvps_el_f32_to_bf16(v[i]));
            FZ_CHECK(fz_bits(dec[i]) == fz_bits(want), "codec %d: element %zu: 0x%08x, scalar 0x%08x", c->id, i,
                     fz_bits(dec[i]), fz_bits(want));
        }
        break;
    case KVPS_CODEC_TOPK: {
        size_t k = fz_get32(ref + 8);
        FZ_CHECK(k == kvps_el_topk_k(c, n), "top-k: k %zu, want %zu", k, kvps_el_topk_k(c, n));
        uint8_t *sel = (uint8_t *)calloc(n ? n : 1, 1);
        for (size_t j = 0; j < k; j++) {
            uint32_t i = fz_get32(ref + 12 + 4 * j);
            FZ_CHECK(i < n && (j == 0 || i > fz_get32(ref + 12 + 4 * (j - 1))), "top-k: index %u at %zu", i, j);
            sel[i] = 1;
        }
        /* no unsent element is larger than a sent one, nor equal with a lower index (NaNs rank
           by payload: with NaN + NaN in the input, which payload is the sum's is open) */
        if (open_nan) k = 0;
        uint32_t minsel = UINT32_MAX;
        size_t minsel_i = 0;
        for (size_t i = 0; i < n; i++)
            if (sel[i] && kvps_el_mag(v[i]) <= minsel) { minsel = kvps_el_mag(v[i]); minsel_i = i; }
        for (size_t i = 0; i < n && k; i++) {
            if (sel[i]) continue;
            uint32_t m = kvps_el_mag(v[i]);
            FZ_CHECK(m < minsel || (m == minsel && i > minsel_i), "top-k: element %zu (|x| 0x%08x) left out, %zu (0x%08x) sent",
                     i, m, minsel_i, minsel);
        }
        free(sel);
        break;
    }
    case KVPS_CODEC_SIGN: {
        uint32_t ch = fz_get32(ref + 8);
        FZ_CHECK(ch == (c->sign_chunk ? c->sign_chunk : 256), "sign: chunk %u", ch);
        size_t nc = (n + ch - 1) / ch;
        const uint8_t *scales = ref + 12, *bits = scales + 4 * nc;
        for (size_t i = 0; i < n; i++)
            FZ_CHECK(v[i] != v[i] || ((bits[i >> 3] >> (i & 7)) & 1) == fz_bits(v[i]) >> 31, "sign: bit %zu", i);
        for (size_t b = 0, j = 0; b < n; b += ch, j++) {
            size_t m = n - b < ch ? n - b : ch;
            float want = kvps__canon_nan(kvps__abs_sum(v + b, m) / (float)m), got;
            memcpy(&got, scales + 4 * j, 4);
            FZ_CHECK(fz_bits(got) == fz_bits(want), "sign: chunk %zu scale 0x%08x, want 0x%08x", j, fz_bits(got), fz_bits(want));
        }
        break;
    }
    }
    if (ef && c->id != KVPS_CODEC_SIGN)
        for (size_t i = 0; i < n; i++)
            if (fz_finite(v[i]) && fz_finite(dec[i]) && fz_finite(r_ref[i]))
                FZ_CHECK(dec[i] + r_ref[i] == v[i], "codec %d: element %zu: decoded %a + residual %a != %a", c->id, i,
                         (double)dec[i], (double)r_ref[i], (double)v[i]);
    free(ref); free(out); free(r_in); free(r_ref); free(r); free(dec); free(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 6) return 0;
    kvps_codec c = kvps_codec_get((kvps_codec_id)(data[0] % 5));
    uint8_t mode = data[1];
    uint32_t n = fz_get32(data + 2);
    const uint8_t *p = data + 6;
    size_t len = size - 6;
    if (mode & 0x80) {
        size_t m = len / 4;
        float *x = (float *)malloc((m ? m : 1) * sizeof(float));
        if (m) memcpy(x, p, m * 4);
        c.topk_count = n & 0xffff;
        c.topk_fp16_values = (mode >> 3) & 1;
        c.sign_chunk = n >> 16;
#ifdef FZ_AVOID_KNOWN
        /* reported: the AVX2 1-bit encoder writes whole bytes of sign bits at an unaligned chunk start */
        if (c.sign_chunk % 8) c.sign_chunk = (c.sign_chunk | 7) + 1;
#endif
        fz_roundtrip(&c, x, m, (mode >> 4) & 1);
        free(x);
        return 0;
    }
    if ((mode & 0x40) && len >= 8) n = fz_get32(p + 4);
    if (n > (1u << 18)) return 0; /* the caller sizes dst; keep it to what a test can afford */
    fz_decode(&c, p, len, n, mode & 1);
    return 0;
}
