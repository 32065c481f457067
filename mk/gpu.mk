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
GPU_HEADERS := kvps_core.h kvps_codec.h kvps_launch.h kvps.h kvps_ring.h kvps_gpu.h
GPU_O     := $(GPU_B)/obj
GPU_TEST_DEPS := $(GPU_HEADERS) tests/kvps_test.h $(wildcard tests/gpu/*.h)
GPU_BINS  := $(GPU_B)/test_gpu $(GPU_B)/test_gpu_host $(GPU_B)/bench_gpu $(GPU_B)/c_api $(GPU_B)/hier_procs

.PHONY: gpu gpu-build gpu-bench
gpu: deps
	@if ! command -v $(NVCC) >/dev/null 2>&1; then \
	  echo "make gpu: nvcc not found ($(NVCC)); set CUDA_HOME or NVCC. Nothing built."; exit 0; fi; \
	$(MAKE) --no-print-directory gpu-build && $(GPU_B)/c_api && $(GPU_B)/hier_procs && tests/run.sh $(GPU_B)

gpu-build: $(GPU_B)/kvps_gpu.o $(GPU_BINS)

gpu-bench: gpu-build
	$(GPU_B)/bench_gpu

# the objects are kept (make would delete them as intermediates of the pattern rules)
.PRECIOUS: $(GPU_O)/%.o

$(GPU_B) $(GPU_O):
	@mkdir -p $@

$(GPU_B)/kvps_gpu.o: kvps_gpu.cu $(GPU_HEADERS) | $(GPU_B)
	$(NVCC) $(NVCCFLAGS) -I. $(GPU_ARCH) -c $< -o $@

# Objects, compiled once and linked twice: here against the toolkit's libraries (build/gpu) and
# into the device kit (mk/gpukit.mk). The kvps.h + kvps_ring.h implementation is a C object of
# its own for the C++ bench.
$(GPU_O)/kvps_impl.o: tests/gpu/kvps_impl.c $(GPU_HEADERS) | $(GPU_O) deps
	$(CC) $(KVPS_CFLAGS) $(CFLAGS) $(PKG_CFLAGS) -c $< -o $@
$(GPU_O)/%.o: tests/gpu/%.c $(GPU_TEST_DEPS) | $(GPU_O) deps
	$(CC) $(KVPS_CFLAGS) $(CFLAGS) $(PKG_CFLAGS) -I$(CUDA_HOME)/include -c $< -o $@
# The host API from plain C99, -pedantic -Werror.
$(GPU_O)/c_api.o: tests/gpu/c_api.c $(GPU_HEADERS) | $(GPU_O) deps
	$(CC) -std=c99 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -pedantic -Werror -I. $(PKG_CFLAGS) -c $< -o $@
$(GPU_O)/bench_gpu.o: bench/bench_gpu.cu $(GPU_HEADERS) | $(GPU_O) deps
	$(NVCC) $(NVCCFLAGS) -I. $(PKG_CFLAGS) -c $< -o $@

# (static pattern rules: the Makefile's build/%: tests/%.c would otherwise compile them whole)
GPU_C_BINS := $(GPU_B)/test_gpu $(GPU_B)/test_gpu_host $(GPU_B)/c_api $(GPU_B)/hier_procs
$(GPU_C_BINS): $(GPU_B)/%: $(GPU_O)/%.o $(GPU_B)/kvps_gpu.o
	$(CC) $^ -o $@ $(GPU_LIBS)
$(GPU_B)/bench_gpu: $(GPU_O)/bench_gpu.o $(GPU_B)/kvps_gpu.o $(GPU_O)/kvps_impl.o
	$(NVCC) $^ -o $@ -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -Xlinker -rpath,$(CUDA_HOME)/lib64 \
	  -Xlinker -rpath,$(CUDA_HOME)/lib -lnccl $(PKG_LIBS) -lz -lm -lpthread
