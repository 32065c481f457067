/* The kvps_gpu.h implementation: the one file compiled by nvcc (see kvps_gpu.h, BUILD). */
#define KVPS_GPU_IMPLEMENTATION
#include "kvps_gpu.h"
