# kvps - build, test, bench, demo.  `make test` and `make demo` install what is missing (as root)
# or print the exact apt-get line.
CC      ?= cc
PKGS    := libzmq
CFLAGS  ?= -O2 -g
# -ffp-contract=off: BSP results must be bit-identical to the sequential oracle in the tests
KVPS_CFLAGS := -std=c99 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Wshadow -ffp-contract=off -I.
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null)
LDLIBS  = $(PKG_LIBS) -lz -lm -pthread
B       ?= build

TESTS    := $(patsubst tests/%.c,$(B)/%,$(wildcard tests/test_*.c))
BENCHES  := $(patsubst bench/%.c,$(B)/%,$(filter-out bench/mpi_%.c,$(wildcard bench/*.c)))
EXAMPLES := $(patsubst examples/%.c,$(B)/%,$(wildcard examples/*.c))
HEADERS  := kvps_core.h kvps_codec.h kvps_launch.h kvps.h kvps_ring.h kvps_gpu.h kvps_fuse.h kvps_abi.h tests/kvps_test.h tests/kt_coll.h

.PHONY: all deps deps-demo test test-all asan-test valgrind-test bench demo compile-test clean
# The OpenMPI peers of bench_ring and bench_fusion, built where mpicc is (the benches run without
# them and say so).
MPICC   ?= mpicc
MPI_PEERS := $(if $(shell command -v $(MPICC) 2>/dev/null),$(B)/mpi_allreduce $(B)/mpi_fusion)

all: deps $(TESTS) $(BENCHES) $(EXAMPLES) $(MPI_PEERS) $(B)/libkvps.so

# libkvps.so: the headers' implementation and the flat C ABI (kvps_abi.h) for foreign callers
# (python/kvps). Hidden by default, so that only what KVPS_API marks (the public kvps_* API) is
# exported, none of the kvps__ internals.
LIB_CFLAGS := -fPIC -fvisibility=hidden '-DKVPS_API=extern __attribute__((visibility("default")))'
$(B)/libkvps.so: lib/libkvps.c $(HEADERS) | $(B) deps
	$(CC) $(KVPS_CFLAGS) $(CFLAGS) $(LIB_CFLAGS) $(PKG_CFLAGS) -shared -Wl,-soname,libkvps.so $< -o $@ $(LDLIBS)

$(B)/mpi_allreduce: bench/mpi_allreduce.c bench/bench_cpu.h examples/clock.h | $(B) deps
	$(MPICC) -O2 -Wall -Wextra $< -o $@
$(B)/mpi_fusion: bench/mpi_fusion.c bench/resnet50.h | $(B) deps
	$(MPICC) -O2 -Wall -Wextra $< -o $@

# The placement simulation of issue 18, with kvps.h's own hashes and RESHARD planners.
# `make placement-sim` runs it (~50 s) and writes bench/results/placement.csv; `make
# placement-check` checks its model of a worker's placement (mod n, slicing, virtual shards)
# against a real kvps worker's, and that each change of both rules replays from its record.
.PHONY: placement-sim placement-check
placement-sim: $(B)/placement_sim
	@mkdir -p bench/results
	$(B)/placement_sim --csv bench/results/placement.csv
placement-check: $(B)/placement_sim
	$(B)/placement_sim --check-kvps

deps:
	@scripts/deps.sh build
deps-demo: deps # the build's packages first, then the data
	@scripts/deps.sh demo

# Every compile waits for `deps` (order-only): under make -j on a fresh machine the packages
# must be installed before the first compiler looks for zmq.h. PKG_CFLAGS is read when a recipe
# runs, so after the install.
$(B)/%: tests/%.c $(HEADERS) | $(B) deps
	$(CC) $(KVPS_CFLAGS) $(TEST_CFLAGS) $(PKG_CFLAGS) $< -o $@ $(LDLIBS)
$(B)/%: bench/%.c $(HEADERS) $(wildcard bench/*.h) $(wildcard examples/*.h) | $(B) deps
	$(CC) $(KVPS_CFLAGS) $(CFLAGS) $(PKG_CFLAGS) $< -o $@ $(LDLIBS)
$(B)/%: examples/%.c $(HEADERS) $(wildcard examples/*.h) | $(B) deps
	$(CC) $(KVPS_CFLAGS) $(CFLAGS) $(PKG_CFLAGS) $< -o $@ $(LDLIBS)
$(B):
	@mkdir -p $(B)

# Every header as C99 -pedantic (with and without a POSIX feature macro: the headers declare
# what they use), as C++, and linked from two files; then each header alone with each switch,
# kvps_codec.h without ZeroMQ, kvps_ring.h without the parameter server (tests/compile/layers.sh).
compile-test: deps | $(B)
	$(CC) -std=c99 -Wall -Wextra -pedantic -Werror -I. $(PKG_CFLAGS) -c tests/compile/impl.c -o $(B)/ct_impl_plain.o
	$(CC) -std=c99 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -pedantic -Werror -I. $(PKG_CFLAGS) \
	  -c tests/compile/impl.c -o $(B)/ct_impl.o
	$(CC) -std=c99 -Wall -Wextra -pedantic -Werror -I. $(PKG_CFLAGS) -c tests/compile/use.c -o $(B)/ct_use.o
	$(CC) $(B)/ct_impl.o $(B)/ct_use.o -o $(B)/compile_test $(LDLIBS)
	$(B)/compile_test
	@if command -v c++ >/dev/null; then \
	  c++ -x c++ -std=c++11 -Wall -Wextra -I. $(PKG_CFLAGS) tests/compile/impl.c -c -o $(B)/ct_cxx.o && \
	  echo "compile-test: C++ ok"; fi
	@CC="$(CC)" tests/compile/layers.sh $(B) "$(PKG_CFLAGS)" "$(LDLIBS)"

# The ring's tests run over shared memory (their ranks share a host); these run again over the
# ring's own TCP connections (KVPS_RING_SHM=0) and over ZeroMQ alone (and KVPS_RING_TCP=0): a
# cross-section in make test, every ring test in make test-all.
TCP_TESTS     := test_ring_coll test_ring_faults test_ring_p2p test_ring_close test_fuse
ZMQ_TESTS     := test_ring_coll test_ring_faults
ZMQ_TESTS_ALL := $(filter-out test_ring_shm test_ring_tcp,$(patsubst tests/%.c,%,$(wildcard tests/test_ring_*.c))) test_fuse test_timeline
# the hierarchical ring across two network namespaces (a script, among the tests: root only)
test test-all: $(B)/test_ring_netns $(B)/ring_hier_rank
$(B)/test_ring_netns: tests/test_ring_netns.sh | $(B)
	cp $< $@ && chmod +x $@
# the Python package's tests (tests/python/test_kvps.py) over the libkvps.so beside them
test test-all: $(B)/test_python $(B)/libkvps.so
$(B)/test_python: tests/test_python.sh | $(B)
	cp $< $@ && chmod +x $@
# make test builds what the tests run: the tests at -O1 (they check results, not speed; 0.6x the
# compile time of -O2, which is most of make test's build), the examples and libkvps.so as `all`
# does, and checks that every bench compiles (at -O0 into $(B)/bench-check/, a quarter of the
# time); `make all` and `make bench` build the benches at -O2 to measure with.
TEST_CFLAGS ?= $(patsubst -O2,-O1,$(CFLAGS))
BENCH_CHECK := $(patsubst $(B)/%,$(B)/bench-check/%,$(BENCHES))
$(B)/bench-check/%: bench/%.c $(HEADERS) $(wildcard bench/*.h) $(wildcard examples/*.h) | $(B) deps
	@mkdir -p $(@D)
	$(CC) $(KVPS_CFLAGS) -O0 $(PKG_CFLAGS) $< -o $@ $(LDLIBS)
test: deps $(TESTS) $(EXAMPLES) $(MPI_PEERS) $(B)/libkvps.so $(BENCH_CHECK) compile-test
	@KVPS_TEST_BG=test_slow KVPS_TEST_TCP="$(TCP_TESTS)" KVPS_TEST_ZMQ="$(ZMQ_TESTS)" tests/run.sh $(B)
test-all: all compile-test
	@KVPS_TEST_BG=test_slow KVPS_TEST_TCP="$(ZMQ_TESTS_ALL)" KVPS_TEST_ZMQ="$(ZMQ_TESTS_ALL)" tests/run.sh $(B)

# Every test but test_examples, which runs the examples of the normal build (make test runs it):
# under a sanitizer it would only run the same unsanitized programs again (a minute of CI each).
SAN_TESTS := $(filter-out $(B)/test_examples,$(TESTS))
asan-test: deps
	$(MAKE) B=build-asan CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  $(patsubst $(B)/%,build-asan/%,$(SAN_TESTS))
	@rm -f build-asan/test_examples
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 KVPS_TEST_QUICK=1 KVPS_TEST_BG=test_slow tests/run.sh build-asan

valgrind-test: all
	@KVPS_TEST_QUICK=1 KVPS_TEST_WRAP="valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect" \
	  tests/run.sh $(B)

bench: all
	$(B)/bench_pushpull
	$(B)/bench_ring
	$(B)/bench_compress
	$(B)/bench_keys

demo: deps-demo all
	@scripts/demo.sh $(B)

clean:
	rm -rf build build-asan

# Further targets, one fragment per concern (gpu, install, fuzz, ...).
-include $(wildcard mk/*.mk)
