/* ring_hier_rank - one rank of tests/test_ring_netns.sh's job: 2 hosts (network namespaces) x 2
   ranks, rank r on host r / 2, from the launcher's variables (KVPS_RANK, KVPS_SIZE,
   KVPS_RING_PEERS). Checks that its peer on the same host is reached through shared memory and
   the others over ZeroMQ, that the ring found the two hosts by itself (AUTO runs HIER past
   .small_bytes), and that all-reduces of every algorithm give the exact sums of a naive oracle.
   Prints "rank R: ok" or what failed; exits 0 or 1. */
#define KVPS_IMPLEMENTATION
#include "kvps_ring.h"
#include <stdio.h>
#include <stdlib.h>

static int32_t val(int r, size_t i) { return (int32_t)((r + 1) * 1000 + (int)(i % 991)); }

int main(void) {
    int rank, size, bad = 0;
    const char *peers;
    if (kvps_ring_env_read(&rank, &size, &peers) != KVPS_OK) return 2;
    kvps_ring *r = NULL;
    kvps_result rc = kvps_ring_create(&(kvps_ring_desc){.rank = rank, .size = size, .peers = peers, .timeout_ms = 30000}, &r);
    if (rc != KVPS_OK) { printf("rank %d: create: %s\n", rank, kvps_result_str(rc)); return 1; }
    rc = kvps_ring_barrier(r);
    for (int j = 0; rc == KVPS_OK && j < size; j++) {
        const char *want = j == rank ? "self" : j / 2 == rank / 2 ? "shm" : "tcp";
        if (strcmp(kvps_ring_transport(r, j), want) != 0) {
            printf("rank %d: reaches rank %d by %s, want %s\n", rank, j, kvps_ring_transport(r, j), want);
            bad = 1;
        }
    }
    if (rc == KVPS_OK && kvps_ring__allreduce_algo(r, KVPS_ALGO_AUTO, 4 << 20, 0) != KVPS_ALGO_HIER) {
        printf("rank %d: AUTO does not run HIER for 4 MB across the two hosts\n", rank);
        bad = 1;
    }
    static const size_t sizes[] = {1, 1000, 200000, 3000000};
    static const kvps_ring_algo algos[] = {KVPS_ALGO_AUTO, KVPS_ALGO_HIER, KVPS_ALGO_RD, KVPS_ALGO_RING};
    int32_t *b = (int32_t *)malloc(3000000 * sizeof *b);
    for (int s = 0; rc == KVPS_OK && s < 4; s++)
        for (int a = 0; rc == KVPS_OK && a < 4; a++) {
            size_t n = sizes[s];
            for (size_t i = 0; i < n; i++) b[i] = val(rank, i);
            kvps_ring_op op = {.coll = KVPS_COLL_ALLREDUCE, .recv = b, .count = n, .dtype = KVPS_INT32, .op = KVPS_SUM, .algo = algos[a]};
            rc = kvps_ring_run(r, &op);
            for (size_t i = 0; rc == KVPS_OK && i < n; i++) {
                int32_t want = 0;
                for (int k = 0; k < size; k++) want += val(k, i);
                if (b[i] != want) {
                    printf("rank %d: all-reduce of %zu (%s): element %zu is %d, want %d\n", rank, n, kvps_algo_name(algos[a]), i, b[i], want);
                    bad = 1;
                    break;
                }
            }
        }
    if (rc != KVPS_OK) { printf("rank %d: %s [%s]\n", rank, kvps_result_str(rc), kvps_ring_last_error(r)); bad = 1; }
    free(b);
    kvps_ring_destroy(&r);
    if (!bad) printf("rank %d: ok\n", rank);
    return bad;
}
