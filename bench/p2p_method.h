/* p2p_method.h - how bench_p2p measures point-to-point latency and bandwidth, shared by its
   kvps and raw ZeroMQ sides (bench_p2p.c) and its OpenMPI side (mpi_p2p.c), so the three run
   the very same loops. A side supplies p2p_ops (blocking send / recv, posted isend / irecv and
   waitall, counts in int32 elements); p2p_run does the rest; rank 0 writes "lat BYTES US" and
   "bw BYTES MBPS" lines. Method: bench_p2p.c's top comment. */
#ifndef KVPS_P2P_METHOD_H
#define KVPS_P2P_METHOD_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_cpu.h" /* now_s (beside this file: mpicc runs without -I.) */

enum { P2P_MAXW = 8, P2P_MAXSIZES = 16, P2P_BLOCKS = 5 };
#define P2P_WINDOW_BYTES ((size_t)64 << 20) /* a bandwidth window holds at most this much */

typedef struct p2p_cfg {
    size_t lat[P2P_MAXSIZES], bw[P2P_MAXSIZES]; /* bytes */
    int nlat, nbw, quick;
    double time_s; /* per size, all blocks */
} p2p_cfg;

typedef struct p2p_ops {
    void *c;
    void (*send)(void *c, const void *buf, size_t n, int peer);
    void (*recv)(void *c, void *buf, size_t n, int peer);
    void (*isend)(void *c, const void *buf, size_t n, int peer);
    void (*irecv)(void *c, void *buf, size_t n, int peer);
    void (*waitall)(void *c);
} p2p_ops;

static inline void p2p_cfg_default(p2p_cfg *c) {
    static const size_t lat[] = {8, 64, 512, 4096, 16384, 65536}, bw[] = {1 << 20, 4 << 20, 16 << 20, 64 << 20};
    memset(c, 0, sizeof *c);
    c->nlat = 6;
    c->nbw = 4;
    memcpy(c->lat, lat, sizeof lat);
    memcpy(c->bw, bw, sizeof bw);
    c->time_s = 0.2;
}

static inline void p2p_cfg_quick(p2p_cfg *c) {
    c->nlat = 2;
    c->lat[1] = 4096;
    c->nbw = 1;
    c->time_s = 0.05;
    c->quick = 1;
}

static inline int32_t p2p_pattern(size_t i, size_t bytes) { return (int32_t)(uint32_t)(i * 2654435761u + bytes); }

static inline void p2p_check(const int32_t *b, size_t n, size_t bytes, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (b[i] != p2p_pattern(i, bytes)) {
            fprintf(stderr, "p2p bench: %s of %zu bytes: element %zu wrong\n", what, bytes, i);
            exit(1);
        }
}

static inline double p2p_median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Rank 0 decides an iteration count; rank 1 learns it. */
static inline int p2p_agree(const p2p_ops *o, int rank, int it) {
    int32_t v = it;
    if (rank == 0) o->send(o->c, &v, 1, 1);
    else o->recv(o->c, &v, 1, 0);
    return v;
}

static inline void p2p_pingpong(const p2p_ops *o, int rank, int32_t *s, int32_t *r, size_t n, int it) {
    for (int i = 0; i < it; i++) {
        if (rank == 0) { o->send(o->c, s, n, 1); o->recv(o->c, r, n, 1); }
        else { o->recv(o->c, r, n, 0); o->send(o->c, s, n, 0); }
    }
}

/* One window: rank 1 posts w receives, rank 0 w sends; then rank 1 answers one element. */
static inline void p2p_window(const p2p_ops *o, int rank, int32_t *s, int32_t *r, size_t n, int w) {
    int32_t ack = 0;
    if (rank == 0) {
        for (int i = 0; i < w; i++) o->isend(o->c, s, n, 1);
        o->waitall(o->c);
        o->recv(o->c, &ack, 1, 1);
    } else {
        for (int i = 0; i < w; i++) o->irecv(o->c, r + (size_t)i * n, n, 0);
        o->waitall(o->c);
        o->send(o->c, &ack, 1, 0);
    }
}

static inline void p2p_run(const p2p_ops *o, int rank, const p2p_cfg *cfg, FILE *out) {
    size_t maxb = 0;
    for (int i = 0; i < cfg->nlat; i++) if (cfg->lat[i] > maxb) maxb = cfg->lat[i];
    for (int i = 0; i < cfg->nbw; i++) if (cfg->bw[i] > maxb) maxb = cfg->bw[i];
    size_t rcap = maxb > P2P_WINDOW_BYTES ? maxb : P2P_WINDOW_BYTES;
    int32_t *s = (int32_t *)malloc(maxb), *r = (int32_t *)malloc(rcap);
    if (!s || !r) { fprintf(stderr, "p2p bench: out of memory\n"); exit(1); }
    memset(r, 0, rcap); /* touched before any timing */
    double blk[P2P_BLOCKS];
    for (int k = 0; k < cfg->nlat; k++) {
        size_t bytes = cfg->lat[k], n = bytes / 4;
        for (size_t i = 0; i < n; i++) s[i] = p2p_pattern(i, bytes);
        memset(r, 0, bytes);
        p2p_pingpong(o, rank, s, r, n, 20); /* warm-up, checked */
        p2p_check(r, n, bytes, "ping-pong");
        double t0 = now_s();
        p2p_pingpong(o, rank, s, r, n, 20);
        double per = (now_s() - t0) / 20;
        int it = p2p_agree(o, rank, (int)(cfg->time_s / P2P_BLOCKS / per) + 10);
        for (int b = 0; b < P2P_BLOCKS; b++) {
            t0 = now_s();
            p2p_pingpong(o, rank, s, r, n, it);
            blk[b] = (now_s() - t0) / it / 2 * 1e6;
        }
        if (out) { fprintf(out, "lat %zu %.3f\n", bytes, p2p_median(blk, P2P_BLOCKS)); fflush(out); }
    }
    for (int k = 0; k < cfg->nbw; k++) {
        size_t bytes = cfg->bw[k], n = bytes / 4;
        int w = (int)(P2P_WINDOW_BYTES / bytes);
        w = w < 1 ? 1 : w > P2P_MAXW ? P2P_MAXW : w;
        for (size_t i = 0; i < n; i++) s[i] = p2p_pattern(i, bytes);
        memset(r, 0, bytes * (size_t)w);
        p2p_window(o, rank, s, r, n, w); /* warm-up, checked */
        if (rank == 1) for (int i = 0; i < w; i++) p2p_check(r + (size_t)i * n, n, bytes, "window");
        double t0 = now_s();
        p2p_window(o, rank, s, r, n, w);
        double per = now_s() - t0;
        int it = p2p_agree(o, rank, (int)(cfg->time_s / P2P_BLOCKS / per) + 2);
        for (int b = 0; b < P2P_BLOCKS; b++) {
            t0 = now_s();
            for (int i = 0; i < it; i++) p2p_window(o, rank, s, r, n, w);
            blk[b] = (double)bytes * w * it / (now_s() - t0) / 1e6;
        }
        if (out) { fprintf(out, "bw %zu %.1f\n", bytes, p2p_median(blk, P2P_BLOCKS)); fflush(out); }
    }
    free(s);
    free(r);
}
#endif
