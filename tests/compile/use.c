#include "kvps.h"
#include "kvps_ring.h"
#include "kvps_gpu.h"
#include "kvps_fuse.h"
#include "kvps_abi.h"
#include <stdio.h>
#include <string.h>

int main(void) {
    /* every result code has its own message */
    if (strstr(kvps_result_str(KVPS_ERR_TIMEOUT), "timed out") == NULL) return 1;
    kvps_server *s = NULL;
    kvps_log_set_level(KVPS_LOG_NONE);
    if (kvps_server_create(&(kvps_server_desc){.endpoint = NULL}, &s) != KVPS_ERR_CONFIG || s) return 2;
    if (kvps_ring_allreduce_many(NULL, NULL, NULL, 0, KVPS_FLOAT32, KVPS_SUM, 0) != KVPS_ERR_INVALID_ARG) return 3;
    if (KVPS_UPDATE_SUM != KVPS_UPDATE_ACCUMULATE) return 4; /* the old name of the update rule still works */
    puts("compile-test: C99 two-file link ok");
    return 0;
}
