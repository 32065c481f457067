#!/usr/bin/env bash
# Runs libFuzzer targets for a bounded time each; exits non-zero if any found a crash, leak,
# timeout or broken property. usage: tests/fuzz/run.sh SECONDS BIN...
#   Each target starts from tests/fuzz/corpus/<target>/ (read only) plus what earlier runs found
#   (build-fuzz/corpus/<target>/, where new inputs go); artifacts go to build-fuzz/artifacts/.
#   FUZZ_TIMEOUT: seconds one input may take (default 10). FUZZ_ARGS: more libFuzzer flags.
# Sanitizer settings: allocations that cannot be had return NULL (kvps then answers
# KVPS_ERR_NOMEM, as on a machine without overcommit) instead of aborting, and libFuzzer's
# malloc limit is off: a request for a huge block is kvps' design decision (calloc'd table slabs,
# lazily backed), what must stay bounded is the memory actually used (-rss_limit_mb).
set -u
secs=${1:?usage: run.sh SECONDS BIN...}
shift
fail=0
mkdir -p build-fuzz/artifacts
for bin in "$@"; do
  t=$(basename "$bin")
  work=build-fuzz/corpus/$t
  mkdir -p "$work"
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  log=build-fuzz/$t.log
  ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1:abort_on_error=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    timeout $((secs + 300)) "$bin" -max_total_time="$secs" -timeout="${FUZZ_TIMEOUT:-10}" -rss_limit_mb=2560 \
      -malloc_limit_mb=1048576 -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$t-" "${dict[@]}" \
      ${FUZZ_ARGS:-} "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  cov=$(grep -aoE '(DONE|pulse|INITED|NEW|REDUCE) +cov: [0-9]+ ft: [0-9]+' "$log" | tail -n 1 | sed -E 's/^[A-Z]+ +//')
  if [ "$rc" -eq 0 ]; then
    echo "fuzz: $t: ok, ${execs:-?} inputs in ${secs} s (${rate:-?}/s), ${cov:-cov ?}"
  else
    fail=1
    echo "fuzz: $t: FAILED (exit $rc), ${execs:-?} inputs; log $log:"
    grep -av -E '^#[0-9]+ +(NEW|REDUCE|pulse)|Uses: [0-9]+$' "$log" | tail -n 60
  fi
done
exit $fail
