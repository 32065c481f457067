# make gpu: the kernels object (nvcc), tests/gpu, bench_gpu and a plain-C program that links the
# object, then runs the tests (device tests print "skipped: no CUDA device" where there is none).
# Where nvcc is missing it says so and exits 0. Outputs under build/gpu/.
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
GPU_B     := build/gpu
gpu_comma := ,
# The toolkit's default architecture (what plain `nvcc -c` targets), read from its dry run.
GPU_DEFAULT_SM = $(shell $(NVCC) --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/.*-arch=sm_\([0-9]*\).*/\1/p' | head -n 1)
# sm_80 and sm_90 machine code, PTX of compute_90 for later GPUs, and the default's code + PTX.
GPU_ARCH  ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90] \
             $(foreach a,$(filter-out 80 90,$(GPU_DEFAULT_SM)),-gencode arch=compute_$(a)$(gpu_comma)code=[sm_$(a)$(gpu_comma)compute_$(a)])
# No --use_fast_math: the kernels must round like the CPU codecs (kvps_gpu.h refuses it).
NVCCFLAGS ?= -O2 -std=c++17 -Xcompiler -Wall,-Wextra
GPU_LIBS   = -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -Wl,-rpath,$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib \
             -lcudart -lnccl -lstdc++ $(LDLIBS)
GPU_HEADERS := kvps.h kvps_ring.h kvps_gpu.h
GPU_BINS  := $(GPU_B)/test_gpu $(GPU_B)/test_gpu_host $(GPU_B)/bench_gpu $(GPU_B)/c_api

.PHONY: gpu gpu-build gpu-bench
gpu: deps
	@if ! command -v $(NVCC) >/dev/null 2>&1; then \
	  echo "make gpu: nvcc not found ($(NVCC)); set CUDA_HOME or NVCC. Nothing built."; exit 0; fi; \
	$(MAKE) --no-print-directory gpu-build && $(GPU_B)/c_api && tests/run.sh $(GPU_B)

gpu-build: $(GPU_B)/kvps_gpu.o $(GPU_BINS)

gpu-bench: gpu-build
	$(GPU_B)/bench_gpu

$(GPU_B):
	@mkdir -p $(GPU_B)

$(GPU_B)/kvps_gpu.o: kvps_gpu.cu $(GPU_HEADERS) | $(GPU_B)
	$(NVCC) $(NVCCFLAGS) -I. $(GPU_ARCH) -c $< -o $@

# the kvps.h + kvps_ring.h implementation as a C object, for the C++ bench
$(GPU_B)/kvps_impl.o: tests/gpu/kvps_impl.c $(GPU_HEADERS) | $(GPU_B)
	$(CC) $(KVPS_CFLAGS) $(CFLAGS) $(PKG_CFLAGS) -c $< -o $@

$(GPU_B)/test_%: tests/gpu/test_%.c $(GPU_B)/kvps_gpu.o $(GPU_HEADERS) tests/kvps_test.h $(wildcard tests/gpu/*.h) | $(GPU_B)
	$(CC) $(KVPS_CFLAGS) $(CFLAGS) $(PKG_CFLAGS) -I$(CUDA_HOME)/include $< $(GPU_B)/kvps_gpu.o -o $@ $(GPU_LIBS)

# The host API from plain C99, -pedantic -Werror, linked with the kernels' object.
$(GPU_B)/c_api: tests/gpu/c_api.c $(GPU_B)/kvps_gpu.o $(GPU_HEADERS) | $(GPU_B)
	$(CC) -std=c99 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -pedantic -Werror -I. $(PKG_CFLAGS) $< \
	  $(GPU_B)/kvps_gpu.o -o $@ $(GPU_LIBS)

$(GPU_B)/bench_gpu: bench/bench_gpu.cu $(GPU_B)/kvps_gpu.o $(GPU_B)/kvps_impl.o $(GPU_HEADERS) | $(GPU_B)
	$(NVCC) $(NVCCFLAGS) -I. $(PKG_CFLAGS) $< $(GPU_B)/kvps_gpu.o $(GPU_B)/kvps_impl.o -o $@ \
	  -L$(CUDA_HOME)/lib -Xlinker -rpath,$(CUDA_HOME)/lib64 -Xlinker -rpath,$(CUDA_HOME)/lib -lnccl $(PKG_LIBS) -lz -lm -lpthread
