# Fuzzing (libFuzzer) and ThreadSanitizer: make fuzz, fuzz-smoke, fuzz-crashes, fuzz-corpus, tsan-test.
#
#   make fuzz                  replays tests/fuzz/crashes/, then every target for FUZZ_SECONDS (30)
#                              each; fails on any crash, leak, timeout or broken property
#   make fuzz-smoke            the same for 10 s each (.ci/run)
#   make fuzz FUZZ_TARGETS=fuzz_server FUZZ_SECONDS=600    one target, longer
#   make fuzz FUZZ_REPLAY=0 FUZZ_EXTRA=-DFZ_AVOID_KNOWN   fuzz past the bugs reported and still
#                              open (tests/fuzz/crashes/README.md); rebuild without it afterwards
#   make fuzz-crashes          replays tests/fuzz/crashes/<target>-* (inputs that once failed)
#   make fuzz-corpus           regenerates the seeds in tests/fuzz/corpus/ (gen_corpus)
#   make tsan-test             the tests under ThreadSanitizer (KVPS_TEST_QUICK=1)
#   make fuzz-clean            removes build-fuzz/ and build-tsan/
#
# Targets (tests/fuzz/fuzz_*.c; each file's top comment says what it feeds and checks):
#   fuzz_server  a server's request path (kvps__handle) with its replies
#   fuzz_codec   every built-in codec's decoder and encoder, on every SIMD path
#   fuzz_env     kvps_env_read, kvps_ring_env_read, endpoint lists, KVPS_LOG
#   fuzz_reply   a worker's reply path (kvps__on_reply) for each kind of request
#   fuzz_ring    a ring rank's receive path for each collective
#   fuzz_ckpt    kvps_server_restore on arbitrary files, then the restored server at work
#   fuzz_repl    a backup replica: snapshots, the primary's copies of requests, lost workers, take-over
#   fuzz_shm     the reader of a shared-memory queue (kvps_ring.h) on indices and bytes a peer wrote
#   fuzz_tcp     the ring's TCP data port: a connection's preamble (who may join), then its frames cut anywhere
#   fuzz_rendezvous  what a rendezvous reads (kvps_launch.h): registrations from anyone, rank 0's table or error
# Clang's libFuzzer, ASan and UBSan; -O1 keeps the SIMD paths and the stacks readable.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 30
FUZZ_TIMEOUT ?= 10
FUZZ_ALL     := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_TARGETS ?= $(FUZZ_ALL)
# KVPS__TOPK_SLACK: see fuzz_codec.c (short inputs reach every path of top-k's threshold search)
FUZZ_CFLAGS  := -std=c99 -D_POSIX_C_SOURCE=200809L -DKVPS__TOPK_SLACK=16 -ffp-contract=off -I. -g -O1 -fno-omit-frame-pointer \
                -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Wall -Wextra -Wno-unused-function
FUZZ_HEADERS := kvps_core.h kvps_codec.h kvps_launch.h kvps.h kvps_ring.h tests/kvps_test.h tests/fuzz/fuzz_common.h tests/fuzz/fuzz_ring_ops.h

.PHONY: fuzz fuzz-build fuzz-smoke fuzz-crashes fuzz-corpus fuzz-clean fuzz-cc tsan-test

fuzz-cc:
	@scripts/deps.sh clang
	@command -v $(FUZZ_CC) >/dev/null && command -v $(TSAN_CC) >/dev/null || { echo "make fuzz / tsan-test need clang: apt-get install -y clang libclang-rt-dev"; exit 1; }
fuzz-build: deps fuzz-cc $(addprefix build-fuzz/,$(FUZZ_TARGETS))

build-fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_HEADERS) | deps fuzz-cc
	@mkdir -p build-fuzz
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_EXTRA) $(PKG_CFLAGS) $< -o $@ $(LDLIBS)

# The inputs that once failed are replayed first (FUZZ_REPLAY=0 skips that: to fuzz on while a
# known bug is still open).
FUZZ_REPLAY ?= 1
fuzz: fuzz-build
	@if [ "$(FUZZ_REPLAY)" != 0 ]; then $(MAKE) --no-print-directory fuzz-crashes; fi
	@FUZZ_TIMEOUT=$(FUZZ_TIMEOUT) tests/fuzz/run.sh $(FUZZ_SECONDS) $(addprefix build-fuzz/,$(FUZZ_TARGETS))

fuzz-smoke:
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=10

# Each file in tests/fuzz/crashes/ is named <target without fuzz_>-<what>; run 3 times, so that
# a leak is seen (libFuzzer looks for leaks when an input is run again), each run within
# FUZZ_TIMEOUT seconds (a hang fails); only those of the targets in FUZZ_TARGETS.
fuzz-crashes: fuzz-build
	@mkdir -p build-fuzz; fail=0; for f in tests/fuzz/crashes/*-*; do \
	  t=fuzz_$$(basename $$f | cut -d- -f1); \
	  case " $(FUZZ_TARGETS) " in *" $$t "*) ;; *) continue ;; esac; \
	  if ASAN_OPTIONS=allocator_may_return_null=1 build-fuzz/$$t -runs=3 -timeout=$(FUZZ_TIMEOUT) $$f >build-fuzz/replay.log 2>&1; \
	  then echo "fuzz-crashes: $$f: passes"; else echo "fuzz-crashes: $$f: FAILS"; \
	    grep -aE 'ERROR|FUZZ CHECK|SUMMARY|^    #[0-4] ' build-fuzz/replay.log | head -n 12; fail=1; fi; \
	done; exit $$fail

fuzz-clean:
	rm -rf build-fuzz build-tsan

fuzz-corpus: deps
	@mkdir -p build-fuzz
	$(CC) $(KVPS_CFLAGS) -O1 -g -Wno-unused-function $(PKG_CFLAGS) tests/fuzz/gen_corpus.c -o build-fuzz/gen_corpus $(LDLIBS)
	KVPS_LOG=none build-fuzz/gen_corpus tests/fuzz/corpus

# ThreadSanitizer. libzmq is not instrumented: TSan cannot see a message (or a zero-copy buffer)
# being handed from one thread to another through ZeroMQ's lock-free pipes. tests/fuzz/tsan_zmq.c,
# linked into the tests, makes each send / receive a release / acquire; tests/tsan.supp ignores
# the calls libzmq itself makes to intercepted functions (see both files for why that is sound).
# Forking tests (test_pushpull's test_processes): die_after_fork=0 lets a child of a threaded
# parent start threads. A child that has to report a race after the parent has already reported
# one shares the parent's symbolizer process and can hang (run.sh's timeout ends it): with no
# false reports left, that does not happen.
TSAN_CC    ?= clang
# (not test_examples: see SAN_TESTS in the Makefile; not test_codec: one thread, nothing to race)
TSAN_TESTS ?= $(filter-out test_examples test_codec,$(patsubst tests/%.c,%,$(wildcard tests/test_*.c)))
TSAN_FLAGS := -O1 -g -fsanitize=thread -fno-omit-frame-pointer
build-tsan/tsan_zmq.o: tests/fuzz/tsan_zmq.c | deps fuzz-cc
	@mkdir -p build-tsan
	$(TSAN_CC) $(TSAN_FLAGS) -Wall -Wextra $(PKG_CFLAGS) -c $< -o $@
$(addprefix build-tsan/,$(TSAN_TESTS)): build-tsan/tsan_zmq.o
tsan-test: deps fuzz-cc build-tsan/tsan_zmq.o
	$(MAKE) --no-print-directory B=build-tsan CC=$(TSAN_CC) CFLAGS="$(TSAN_FLAGS)" \
	  LDLIBS="$(CURDIR)/build-tsan/tsan_zmq.o $(LDLIBS) -ldl" $(addprefix build-tsan/,$(TSAN_TESTS))
	@rm -f $(filter-out $(addprefix build-tsan/,$(TSAN_TESTS)),$(wildcard build-tsan/test_*))
	@TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp halt_on_error=0 exitcode=66 die_after_fork=0 $(TSAN_EXTRA)" \
	  KVPS_TEST_QUICK=1 KVPS_TEST_BG=test_slow tests/run.sh build-tsan
