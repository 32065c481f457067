/* ring_peer - one rank of a kvps_ring all-reduce benchmark, configured from the environment
   (KVPS_RANK, KVPS_SIZE, KVPS_RING_PEERS), so that ranks can run on different hosts or in
   network namespaces (bench/ethernet_ring.sh). Rank 0 prints one line per size:
       bytes: N  time_us: T  algbw_GBps: A  busbw_GBps: B  busbw_Gbps: G
   With --csv TAG it prints instead one line per timed all-reduce (bench/ethernet.sh takes the
   median), each all-reduce timed on its own:  TAG,ranks,bytes,iter,time_us
   usage: ring_peer [--sizes 4096,1048576,...] [--iters N] [--algo auto|ring|biring|rd|rhd|hier|oneshot]
                    [--chunk BYTES] [--timeout MS] [--csv TAG] */
#define KVPS_IMPLEMENTATION
#include "kvps_ring.h"
#include "bench/bench_cpu.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    const char *sizes = "65536,1048576,16777216,67108864", *algo_s = "auto", *csv = NULL;
    int iters = 0, timeout = 60000;
    size_t chunk = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sizes") && i + 1 < argc) sizes = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--algo") && i + 1 < argc) algo_s = argv[++i];
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) chunk = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) timeout = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--sizes B,B,...] [--iters N] [--algo auto|ring|biring|rd|rhd|hier|oneshot] [--chunk BYTES] [--timeout MS] [--csv TAG]\n", argv[0]);
            return 2;
        }
    }
    kvps_ring_algo algo = !strcmp(algo_s, "ring") ? KVPS_ALGO_RING : !strcmp(algo_s, "biring") ? KVPS_ALGO_BIRING
                        : !strcmp(algo_s, "rd") ? KVPS_ALGO_RD : !strcmp(algo_s, "rhd") ? KVPS_ALGO_RHD
                        : !strcmp(algo_s, "hier") ? KVPS_ALGO_HIER : !strcmp(algo_s, "oneshot") ? KVPS_ALGO_ONESHOT
                        : KVPS_ALGO_AUTO;
    int rank, size;
    const char *peers;
    if (kvps_ring_env_read(&rank, &size, &peers) != KVPS_OK) return 2;
    kvps_ring *r = NULL;
    kvps_result rc = kvps_ring_create(&(kvps_ring_desc){.rank = rank, .size = size, .peers = peers, .algo = algo,
                                                        .chunk_bytes = chunk, .timeout_ms = timeout}, &r);
    if (rc != KVPS_OK) { fprintf(stderr, "ring_peer %d: %s\n", rank, kvps_result_str(rc)); return 1; }
    size_t maxb = 0;
    for (const char *p = sizes; *p;) { size_t b = (size_t)strtoull(p, (char **)&p, 10); if (b > maxb) maxb = b; if (*p == ',') p++; else break; }
    float *buf = (float *)malloc(maxb ? maxb : 4);
    memset(buf, 0, maxb); /* touch once: fresh pages are expensive */
    int status = 0;
    if (rank == 0 && !csv) printf("# ring_peer: %d ranks, algo %s, float32 sum; busbw = algbw * 2(n-1)/n\n", size, algo_s);
    for (const char *p = sizes; *p && !status;) {
        size_t bytes = (size_t)strtoull(p, (char **)&p, 10);
        if (*p == ',') p++;
        size_t n = bytes / 4;
        int it = iters ? iters : bytes >= (32u << 20) ? 5 : bytes >= (4u << 20) ? 20 : 100;
        for (int w = 0; w < 2 && !status; w++) status = kvps_ring_allreduce(r, buf, buf, n, KVPS_FLOAT32, KVPS_SUM) != KVPS_OK;
        status = status || kvps_ring_barrier(r) != KVPS_OK;
        double t0 = now_s();
        for (int i = 0; i < it && !status; i++) {
            double ti = now_s();
            status = kvps_ring_allreduce(r, buf, buf, n, KVPS_FLOAT32, KVPS_SUM) != KVPS_OK;
            if (csv && rank == 0 && !status) printf("%s,%d,%zu,%d,%.0f\n", csv, size, bytes, i, (now_s() - ti) * 1e6);
        }
        double t = (now_s() - t0) / it;
        if (status) { fprintf(stderr, "ring_peer %d: %s\n", rank, kvps_ring_last_error(r)); break; }
        double alg = (double)bytes / t / 1e9, bus = alg * 2.0 * (size - 1) / size;
        if (rank == 0 && !csv)
            printf("bytes: %zu  time_us: %.1f  algbw_GBps: %.3f  busbw_GBps: %.3f  busbw_Gbps: %.3f\n", bytes, t * 1e6, alg, bus, bus * 8);
        fflush(stdout);
    }
    free(buf);
    kvps_ring_destroy(&r);
    return status;
}
