/* resnet50.h - the parameter tensors of ResNet-50 (He et al. 2015, torchvision's resnet50), in
   the order a framework lists them: each convolution's weight, then its batch norm's weight and
   bias; the fully connected layer last. 161 tensors, 25 557 032 floats. For the fusion benchmark
   and its test: a model of many small tensors, sizes from the published architecture. */
#ifndef KVPS_RESNET50_H
#define KVPS_RESNET50_H
#include <stddef.h>

enum { RESNET50_TENSORS = 161 };

/* Fills out[0..160] with the element counts; returns 161. */
static inline size_t resnet50_sizes(size_t *out) {
    static const int blocks[4] = {3, 4, 6, 3}, planes[4] = {64, 128, 256, 512};
    size_t n = 0, in = 64;
    out[n++] = 64 * 3 * 7 * 7; out[n++] = 64; out[n++] = 64; /* conv1 7x7, bn1 */
    for (int l = 0; l < 4; l++)
        for (int b = 0; b < blocks[l]; b++) {
            size_t p = (size_t)planes[l], o = 4 * p;
            out[n++] = in * p; out[n++] = p; out[n++] = p;    /* 1x1 reduce */
            out[n++] = p * p * 9; out[n++] = p; out[n++] = p; /* 3x3 */
            out[n++] = p * o; out[n++] = o; out[n++] = o;     /* 1x1 expand */
            if (b == 0) { out[n++] = in * o; out[n++] = o; out[n++] = o; } /* downsample */
            in = o;
        }
    out[n++] = 2048 * 1000; out[n++] = 1000; /* fc */
    return n;
}
#endif
