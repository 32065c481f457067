/* A program that includes only kvps_ring.h: tests/compile/layers.sh checks that it holds no
   parameter-server code (no kvps_server_* or kvps_worker_* symbol, nothing of the server's
   request path). */
#define KVPS_IMPLEMENTATION
#include "kvps_ring.h"
#include <stdio.h>

int main(void) {
    kvps_log_set_level(KVPS_LOG_NONE);
    if (kvps_ring_allreduce(NULL, NULL, NULL, 0, KVPS_FLOAT32, KVPS_SUM) != KVPS_ERR_INVALID_ARG) return 1;
    if (kvps_dtype_size(KVPS_FLOAT32) != 4) return 2;
    puts("compile-test: kvps_ring.h alone: ok");
    return 0;
}
