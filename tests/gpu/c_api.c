/* Proves that kvps_gpu.h's host API is plain C: this file is compiled as C99 -pedantic -Werror
   and linked with the kernels' object (nvcc). It asks for the devices and makes a few calls. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "kvps_ring.h"
#include "kvps_gpu.h"
#include <stdio.h>

int main(void) {
    int n = 0;
    kvps_result r = kvps_gpu_device_count(&n);
    if (r == KVPS_ERR_NO_DEVICE) {
        printf("c_api: kvps_gpu.h from C99 links and runs; no CUDA device (%s)\n", kvps_gpu_last_error());
        return 0;
    }
    if (r != KVPS_OK) { printf("c_api: %s\n", kvps_result_str(r)); return 1; }
    /* calls that need no device memory: enough to show the C API links and answers */
    kvps_codec c = kvps_codec_get(KVPS_CODEC_FP16);
    size_t bytes = kvps_gpu_codec_bytes(&c, 1000);
    if (bytes != kvps_codec_max_bytes(&c, 1000)) { printf("c_api: codec bytes differ\n"); return 1; }
    if (kvps_gpu_pack(NULL, NULL, NULL, 1, KVPS_FLOAT16, NULL) != KVPS_ERR_INVALID_ARG) return 1;
    printf("c_api: kvps_gpu.h from C99 links and runs; %d CUDA device(s)\n", n);
    return 0;
}
