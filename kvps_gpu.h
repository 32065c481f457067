/* kvps_gpu.h - v0.0 - CUDA kernels, NCCL ring reducer and hierarchical GPU + server step - MIT

   STATUS: API plan only. Nothing here is implemented yet (issue 8 fills it); including this
   header declares nothing and costs nothing.

   PLANNED API (see issue 8)
   CUDA kernels for compression (fp16/bf16, top-k, 1-bit) and reduction; an NCCL communicator
   bootstrapped over ZeroMQ (the unique id travels through a kvps server or a ring peer);
   the hierarchical step: reduce on the GPUs of one machine with NCCL, push/pull the result
   through the kvps servers across machines, broadcast back. Device pointers start with d_.
   Without a CUDA device the device calls return KVPS_ERR_NO_DEVICE.
*/
#ifndef KVPS_GPU_H
#define KVPS_GPU_H
#include "kvps.h"
#endif
