/* gpu_probe - the device kit's first question: is there a CUDA device, and what is it? Linked
   with the CUDA runtime statically and nothing of kvps (no libzmq, no NCCL), so it runs before
   anything else of the kit has been resolved.
   usage: gpu_probe [path of libnccl.so.2]   (also says which NCCL that library is)
   Prints one line per device, the driver's and the runtime's CUDA versions and whether the kit's
   machine code (sm_80, sm_90; PTX of compute_90) covers each device.
   Exit: 0 devices found (and the NCCL given loads), 3 no CUDA device (or no driver), 4 the NCCL
   given does not load or has no ncclGetVersion, 1 another CUDA failure. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>

/* the kit's machine code: sm_80 (runs on 8.x), sm_90 and the toolkit's default (sm_75 for CUDA
   13); PTX of compute_90, compiled by the driver for later devices */
static int covered(int major, int minor) { return major >= 8 || (major == 7 && minor >= 5); }

int main(int argc, char **argv) {
    int n = 0, drv = 0, rt = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    if (e != cudaSuccess || n == 0) {
        printf("no CUDA device: %s (%s); driver CUDA %d.%d, runtime %d.%d\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none",
               e != cudaSuccess ? cudaGetErrorName(e) : "0 devices", drv / 1000, drv % 1000 / 10, rt / 1000,
               rt % 1000 / 10);
        return e == cudaSuccess || e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
                       e == cudaErrorStubLibrary || e == cudaErrorSystemDriverMismatch || e == cudaErrorDevicesUnavailable
                   ? 3 : 1;
    }
    printf("CUDA: %d device(s); driver CUDA %d.%d, runtime %d.%d (static in the kit)\n", n, drv / 1000, drv % 1000 / 10,
           rt / 1000, rt % 1000 / 10);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        struct cudaDeviceProp p;
        if ((e = cudaGetDeviceProperties(&p, i)) != cudaSuccess) {
            printf("device %d: cudaGetDeviceProperties: %s\n", i, cudaGetErrorString(e));
            return 1;
        }
        int ok = covered(p.major, p.minor);
        bad += !ok;
        printf("device %d: %s, compute %d.%d, %d SMs, %.1f GiB%s\n", i, p.name, p.major, p.minor, p.multiProcessorCount,
               (double)p.totalGlobalMem / (1024.0 * 1024 * 1024), ok ? "" : " (the kit has no code for it: rebuild with its sm_)");
    }
    if (argc > 1) {
        void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        if (!h) { printf("NCCL: %s does not load: %s\n", argv[1], dlerror()); return 4; }
        int (*ver)(int *) = (int (*)(int *))dlsym(h, "ncclGetVersion");
        int v = 0;
        if (!ver || ver(&v) != 0) { printf("NCCL: %s has no working ncclGetVersion\n", argv[1]); return 4; }
        printf("NCCL: %s is version %d.%d.%d\n", argv[1], v / 10000, v / 100 % 100, v % 100);
    }
    return bad ? 1 : 0;
}
