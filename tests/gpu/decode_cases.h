/* decode_cases.h - malformed codec blobs as test_gpu.c (the device decoder) and test_gpu_host.c
   (its verdicts on the host) both feed them: a table of named mutations of a good blob, and the
   function that applies one. The good blobs are made by each test: codec 0 fp16, 1 top-k with
   k = 10, 2 sign with chunk 100, 3 top-k with k = 7 and fp16 values (host only), of N = 1000.
   Include after kvps.h. */
#ifndef KVPS_TEST_DECODE_CASES_H
#define KVPS_TEST_DECODE_CASES_H
#include <stdint.h>
#include <string.h>

typedef struct decode_case {
    const char *name;
    int c;         /* which good blob */
    int off;       /* >= 0: byte off becomes val; -1: none; -2: idx[1] = idx[0]; -3: chunk = 0 */
    int val;
    int dbytes;    /* bytes passed: the good blob's size plus this */
    size_t n;      /* the count the decoder is told */
    int host_only; /* not run on the device (test_gpu has codecs 0..2 only) */
} decode_case;

enum { DECODE_N = 1000 };
static const decode_case decode_cases[] = {
    {"fp16 ok", 0, -1, 0, 0, DECODE_N, 0},
    {"fp16 3 bytes", 0, -1, 0, -(int)(8 + DECODE_N * 2 - 3), DECODE_N, 0},
    {"fp16 short by one", 0, -1, 0, -1, DECODE_N, 0},
    {"fp16 one extra", 0, -1, 0, 1, DECODE_N, 0},
    {"fp16 wrong id", 0, 0, KVPS_CODEC_BF16, 0, DECODE_N, 0},
    {"fp16 flags 1", 0, 1, 1, 0, DECODE_N, 0},
    {"fp16 reserved byte", 0, 3, 7, 0, DECODE_N, 0},
    {"fp16 n differs", 0, -1, 0, 0, DECODE_N - 1, 0},
    {"topk ok", 1, -1, 0, 0, DECODE_N, 0},
    {"topk flags 2", 1, 1, 2, 0, DECODE_N, 0},
    {"topk k > n", 1, 8 + 1, 0x10, 0, DECODE_N, 0},           /* k = 4106 */
    {"topk k one more", 1, 8, 11, 0, DECODE_N, 0},            /* body now short */
    {"topk index >= n", 1, 12 + 4 * 9 + 1, 0x7f, 0, DECODE_N, 0},
    {"topk indices equal", 1, -2, 0, 0, DECODE_N, 0},
    {"topk body short", 1, -1, 0, -4, DECODE_N, 0},
    {"topk body long", 1, -1, 0, 4, DECODE_N, 0},
    {"topk header only", 1, -1, 0, -(int)(4 + 10 * 8), DECODE_N, 0},
    {"topk fp16 values ok", 3, -1, 0, 0, DECODE_N, 1},
    {"topk fp16 values, flag cleared", 3, 1, 0, 0, DECODE_N, 1},
    {"sign ok", 2, -1, 0, 0, DECODE_N, 0},
    {"sign chunk 0", 2, -3, 0, 0, DECODE_N, 0},
    {"sign chunk 99", 2, 8, 99, 0, DECODE_N, 0},
    {"sign short", 2, -1, 0, -1, DECODE_N, 0},
    {"sign n 0", 2, -1, 0, 0, 0, 1},
};

static inline void decode_put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }

/* Writes case t's blob into blob (cap bytes, zeroed past the good one's end); returns the number
   of bytes to pass. */
static inline size_t decode_case_blob(const decode_case *t, unsigned char *blob, size_t cap, const unsigned char *good,
                                      size_t gbytes) {
    memset(blob, 0, cap);
    memcpy(blob, good, gbytes);
    if (t->off >= 0) blob[t->off] = (unsigned char)t->val;
    if (t->off == -2) { uint32_t i0; memcpy(&i0, blob + 12, 4); decode_put32(blob + 16, i0); }
    if (t->off == -3) decode_put32(blob + 8, 0);
    return (size_t)((long)gbytes + t->dbytes);
}
#endif
