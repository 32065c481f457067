# make gpu-kit: build/gpu-kit/, what the GPU checks need on a bare GPU box (CUDA's driver and
# toolkit, PyTorch's pip NCCL, no Debian -dev packages, no network): the device tests, bench_gpu,
# the C API check, the two-process hierarchical check and a device probe, linked from build/gpu's
# objects with the CUDA runtime static and an $ORIGIN rpath (DT_RPATH: it serves the libraries'
# own needs too) to the kit's lib/, where tests/gpu/kit/collect.sh copies every shared library
# they need that such a box lacks (libzmq and what it links; ldd) and checks the closure and the
# size. NCCL and libcuda come from the box: device_check.sh finds NCCL. make test checks the kit
# (tests/test_gpu_kit.sh). Where nvcc is missing it says so and builds nothing.
KIT       := build/gpu-kit
KIT_BINS  := $(addprefix $(KIT)/bin/,gpu_probe c_api test_gpu hier_procs bench_gpu test_gpu_host)
KIT_RPATH := -Wl,--disable-new-dtags -Wl,-rpath,'$$ORIGIN/../lib'
KIT_LIBS   = -L$(CUDA_HOME)/lib64 -lcudart_static -lnccl -ldl -lrt -lstdc++ $(LDLIBS)
KIT_FILES := $(addprefix tests/gpu/kit/,device_check.sh closure.sh collect.sh box_provides README)

.PHONY: gpu-kit
gpu-kit: deps
	@if ! command -v $(NVCC) >/dev/null 2>&1; then \
	  echo "make gpu-kit: nvcc not found ($(NVCC)); set CUDA_HOME or NVCC. No kit built."; exit 0; fi; \
	$(MAKE) --no-print-directory $(KIT)/MANIFEST

$(KIT)/bin:
	@mkdir -p $@
$(addprefix $(KIT)/bin/,c_api test_gpu hier_procs test_gpu_host): $(KIT)/bin/%: build/gpu/obj/%.o build/gpu/kvps_gpu.o | $(KIT)/bin
	$(CC) $^ -o $@ $(KIT_RPATH) $(KIT_LIBS)
$(KIT)/bin/bench_gpu: build/gpu/obj/bench_gpu.o build/gpu/kvps_gpu.o build/gpu/obj/kvps_impl.o | $(KIT)/bin
	$(NVCC) $^ -o $@ -cudart static -Xlinker --disable-new-dtags -Xlinker -rpath,'$$ORIGIN/../lib' \
	  -L$(CUDA_HOME)/lib64 -lnccl $(PKG_LIBS) -lz -lm -lpthread
# the probe: the CUDA runtime and the C library only, so it runs before anything is resolved
$(KIT)/bin/gpu_probe: tests/gpu/kit/gpu_probe.c | $(KIT)/bin
	$(CC) -std=c99 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -O2 -I$(CUDA_HOME)/include $< -o $@ \
	  -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread
$(KIT)/MANIFEST: $(KIT_BINS) $(KIT_FILES)
	NVCC=$(NVCC) tests/gpu/kit/collect.sh $(KIT)

# make test runs the kit's check (build/test_gpu_kit, a script, among the tests)
test: $(B)/test_gpu_kit
$(B)/test_gpu_kit: tests/test_gpu_kit.sh gpu-kit | $(B)
	cp $< $@ && chmod +x $@
