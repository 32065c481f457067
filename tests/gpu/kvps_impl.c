/* The kvps.h and kvps_ring.h implementation as a C object, linked into the C++ bench_gpu (its
   own file, so kvps.h's implementation is compiled as the C it is written in). */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "kvps_ring.h"
