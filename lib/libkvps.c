/* libkvps.so: the headers' implementation and the flat C ABI (kvps_abi.h), one shared library.
   `make` compiles it -fPIC -shared -fvisibility=hidden with KVPS_API marked visible, so only
   the public kvps_* functions are exported (kvps_abi.h, 5.). */
#define KVPS_IMPLEMENTATION
#include "kvps_abi.h"
#include "kvps_fuse.h"
