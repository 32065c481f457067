/* Holds the implementation; use.c includes the headers without it. Linked together they prove
   the headers coexist and that declarations and definitions agree (C99 -pedantic and C++). */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "kvps_ring.h"
#include "kvps_gpu.h"
#include "kvps_fuse.h"
#include "kvps_abi.h"
#include "kvps.h" /* a second include is harmless */
