/* A program that includes only kvps_codec.h: built with no ZeroMQ on the include path (nozmq/zmq.h
   errors) and linked without -lzmq (tests/compile/layers.sh). It round-trips one codec. */
#define KVPS_CODEC_IMPLEMENTATION
#include "kvps_codec.h"
#include <stdio.h>

int main(void) {
    float x[5] = {1.0f, -2.5f, 0.0f, 65504.0f, 0.333333f}, y[5];
    unsigned char buf[64];
    size_t bytes = 0;
    kvps_codec c = kvps_codec_get(KVPS_CODEC_FP16);
    if (kvps_codec_encode(&c, x, 5, NULL, buf, sizeof buf, &bytes) != KVPS_OK) return 1;
    if (kvps_codec_decode(&c, buf, bytes, y, 5, 0) != KVPS_OK) return 2;
    for (int i = 0; i < 5; i++)
        if (y[i] != kvps_f16_to_f32(kvps_f32_to_f16(x[i]))) return 3;
    if (kvps_codec_decode(&c, buf, bytes - 1, y, 5, 0) != KVPS_ERR_TRUNCATED) return 4;
    puts("compile-test: kvps_codec.h alone, without ZeroMQ: ok");
    return 0;
}
