/* fmnist_data.h - what the Fashion-MNIST examples (fmnist.c, pipeline.c) share about their data:
   the gzip'd idx files of Debian's dataset-fashion-mnist package read and checked, and the
   splitmix64 stream that gives every process the same initial weights and the same shuffle.

   Include it after the C library headers; needs zlib. Every function is static inline, so a program
   takes what it uses. Messages start with FMNIST_DATA_PROG ("fmnist" unless defined first).

     datasets_load   the training set (60,000) and the test set (10,000), every label checked
     rng_next, rng_uniform, rng_normal   splitmix64 and what is drawn from it
     shuffle         a permutation of 0..n-1 from (seed, epoch), the same in every process */
#ifndef KVPS_EXAMPLES_FMNIST_DATA_H
#define KVPS_EXAMPLES_FMNIST_DATA_H

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#ifndef FMNIST_DATA_PROG
#define FMNIST_DATA_PROG "fmnist"
#endif

#define NPIX 784
#define NCLASS 10
#define NTRAIN 60000        /* Fashion-MNIST's sizes; fmnist's servers plan their exit with NTRAIN */
#define NTEST 10000
#define DATA_DIR "/usr/share/datasets/fashion-mnist"

/* ---------------------------------------------------------------------------------------------
   Data: idx files (big-endian header: magic, then one u32 per dimension), gzip'd */
typedef struct dataset {
    int n;
    uint8_t *x; /* n * 784 pixels, 0..255 */
    uint8_t *y; /* n labels, 0..9 */
} dataset;

static inline void missing_data_hint(void) {
    fprintf(stderr,
            FMNIST_DATA_PROG ": the Fashion-MNIST files come with Debian's dataset-fashion-mnist package:\n"
            "    sudo apt-get install dataset-fashion-mnist\n"
            "  (or pass --data DIR for a folder holding train-images-idx3-ubyte.gz and the rest)\n");
}

static inline int gz_read_all(gzFile f, void *buf, size_t n) {
    char *p = (char *)buf;
    while (n > 0) {
        unsigned chunk = n > (1u << 24) ? (1u << 24) : (unsigned)n;
        int got = gzread(f, p, chunk);
        if (got <= 0) return -1;
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

/* Reads an idx file whose header must be `magic` and `ndim` dimensions; dims[0] is the item
   count (at most max_items), dims[1..] must equal want[1..]. Returns 0 or prints and returns -1. */
static inline int idx_load(const char *dir, const char *file, uint32_t magic, int ndim, const uint32_t *want,
                    uint32_t max_items, uint32_t *count, uint8_t **out) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    gzFile f = gzopen(path, "rb");
    if (!f) {
        fprintf(stderr, FMNIST_DATA_PROG ": cannot open %s: %s\n", path, errno ? strerror(errno) : "out of memory");
        missing_data_hint();
        return -1;
    }
    unsigned char hdr[16];
    uint32_t h[4] = {0, 0, 0, 0};
    int rc = -1;
    const char *why = NULL;
    if (gz_read_all(f, hdr, 4 + 4 * (size_t)ndim) != 0) {
        why = "truncated header";
        goto done;
    }
    for (int i = 0; i <= ndim; i++)
        h[i] = (uint32_t)hdr[4 * i] << 24 | (uint32_t)hdr[4 * i + 1] << 16 | (uint32_t)hdr[4 * i + 2] << 8 |
               (uint32_t)hdr[4 * i + 3];
    char msg[128];
    if (h[0] != magic) {
        snprintf(msg, sizeof msg, "idx magic 0x%08x, expected 0x%08x", h[0], magic);
        why = msg;
        goto done;
    }
    if (h[1] == 0 || h[1] > max_items) { why = "implausible item count"; goto done; }
    for (int i = 1; i < ndim; i++) {
        if (h[i + 1] != want[i]) {
            snprintf(msg, sizeof msg, "images of %ux%u, expected 28x28", h[2], h[3]);
            why = msg;
            goto done;
        }
    }
    size_t per = 1;
    for (int i = 1; i < ndim; i++) per *= h[i + 1];
    size_t bytes = (size_t)h[1] * per; /* at most 1e6 * 784: no overflow */
    *out = (uint8_t *)malloc(bytes);
    if (!*out) { why = "out of memory"; goto done; }
    if (gz_read_all(f, *out, bytes) != 0) { why = "truncated data"; goto done; }
    char extra;
    if (gzread(f, &extra, 1) != 0) { why = "trailing bytes after the data"; goto done; }
    *count = h[1];
    rc = 0;
done:
    if (rc != 0) {
        int zerr = 0;
        const char *zmsg = gzerror(f, &zerr);
        fprintf(stderr, FMNIST_DATA_PROG ": %s: %s%s%s\n", path, why, zerr ? ": " : "", zerr ? zmsg : "");
        free(*out);
        *out = NULL;
    }
    gzclose(f);
    return rc;
}

static inline int dataset_load(const char *dir, const char *prefix, uint32_t want_n, dataset *d) {
    char fx[64], fy[64];
    snprintf(fx, sizeof fx, "%s-images-idx3-ubyte.gz", prefix);
    snprintf(fy, sizeof fy, "%s-labels-idx1-ubyte.gz", prefix);
    static const uint32_t img_dims[3] = {0, 28, 28};
    uint32_t nx = 0, ny = 0;
    d->x = d->y = NULL;
    if (idx_load(dir, fx, 0x00000803u, 3, img_dims, 1000000u, &nx, &d->x) != 0) return -1;
    if (idx_load(dir, fy, 0x00000801u, 1, img_dims, 1000000u, &ny, &d->y) != 0) return -1;
    if (nx != want_n || ny != want_n) {
        fprintf(stderr, FMNIST_DATA_PROG ": %s: %s holds %u images and %s %u labels; Fashion-MNIST has %u\n", dir, fx,
                nx, fy, ny, want_n);
        return -1;
    }
    for (uint32_t i = 0; i < ny; i++) {
        if (d->y[i] >= NCLASS) {
            fprintf(stderr, FMNIST_DATA_PROG ": %s/%s: label %u of item %u is not 0..9\n", dir, fy, d->y[i], i);
            return -1;
        }
    }
    d->n = (int)nx;
    return 0;
}

/* The training and the test set; 0 or -1. */
static inline int datasets_load(const char *dir, dataset *train, dataset *test) {
    return dataset_load(dir, "train", NTRAIN, train) != 0 || dataset_load(dir, "t10k", NTEST, test) != 0 ? -1 : 0;
}

/* ---------------------------------------------------------------------------------------------
   Random numbers */
/* splitmix64: one seed gives every process the same stream. */
static inline uint64_t rng_next(uint64_t *st) {
    uint64_t z = (*st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline double rng_uniform(uint64_t *st) { /* (0, 1] */
    return ((double)(rng_next(st) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

static inline double rng_normal(uint64_t *st) {
    double u = rng_uniform(st), v = rng_uniform(st);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* Same order on every worker: shuffled with (seed, epoch). */
static inline void shuffle(int *perm, int n, uint64_t seed, int epoch) {
    uint64_t st = seed * 0x9E3779B97F4A7C15ull + (uint64_t)epoch * 0xD1B54A32D192ED03ull + 7;
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(((rng_next(&st) >> 32) * (uint64_t)(i + 1)) >> 32);
        int tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
}


#endif
