#!/usr/bin/env bash
# Runs every test binary in DIR and sums their "N passed, N failed" lines.
# A binary may add ", N skipped" (device tests on a machine without the device).
# KVPS_TEST_WRAP (e.g. valgrind ...) prefixes each run.
# KVPS_TEST_TCP: test names run again with KVPS_RING_SHM=0 (the ring over its own TCP
# connections; the first run uses shared memory between its ranks, kvps_ring.h section 10; thread
# teams on loopback TCP instead of inproc: KVPS_TEST_TEAM_TCP=1), shown as "name [tcp]"; KVPS_TEST_ZMQ: again with KVPS_RING_SHM=0 KVPS_RING_TCP=0 (over ZeroMQ alone),
# "name [zmq]": make test names a cross-section, make test-all every ring test.
set -u
dir=${1:-build}
pass=0; fail=0; skip=0
# KVPS_TEST_BG: tests that mostly sleep (test_slow's minute-long pause): started first, in the
# background, beside the others; their output is shown and counted at the end, as if run last.
bgdir=$(mktemp -d /tmp/kvps-run.XXXXXX)
trap 'rm -rf "$bgdir"' EXIT
for name in ${KVPS_TEST_BG:-}; do
  [ -x "$dir/$name" ] || continue
  ( t0=$(date +%s.%N); env timeout 600 ${KVPS_TEST_WRAP:-} "$dir/$name" >"$bgdir/$name.out" 2>&1; echo $? >"$bgdir/$name.rc"
    awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }' >"$bgdir/$name.s" ) &
done
run_one() { # run_one PATH NAME [VAR=VALUE...]   (BG_OUT / BG_RC / BG_S: a background run's, to show)
  local t=$1 name=$2; shift 2
  case " ${KVPS_TEST_BG:-} " in *" $name "*) [ -z "${BG_OUT:-}" ] && return ;; esac
  echo "== $name"
  t0=$(date +%s.%N)
  if [ -n "${BG_OUT:-}" ]; then out=$(cat "$BG_OUT"); rc=$(cat "$BG_RC"); t0=$(awk -v n="$(date +%s.%N)" -v s="$(cat "$BG_S")" 'BEGIN { printf "%.3f", n - s }')
  else out=$(env "$@" timeout 600 ${KVPS_TEST_WRAP:-} "$t" 2>&1); rc=$?; fi
  # every failure with what it said (it may be far from the end), then the end of the output
  printf '%s\n' "$out" | grep -A 6 '^FAIL' | head -n 80
  printf '%s\n' "$out" | grep -v '^ok ' | tail -n 30
  echo "   ($name: $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s)"
  line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
  p=$(echo "$line" | awk '{print $1}'); f=$(echo "$line" | awk '{print $3}' | tr -d ,)
  k=$(echo "$line" | awk '$6 == "skipped" {print $5}'); skip=$((skip + ${k:-0}))
  [ -n "$p" ] || { p=0; f=1; echo "$name: no result line (exit $rc)"; }
  [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && { f=1; echo "$name: exit code $rc"; }
  pass=$((pass + p)); fail=$((fail + f))
}
for t in "$dir"/test_*; do
  [ -x "$t" ] || continue
  run_one "$t" "$(basename "$t")"
done
for name in ${KVPS_TEST_TCP:-}; do
  [ -x "$dir/$name" ] || continue
  run_one "$dir/$name" "$name [tcp]" KVPS_RING_SHM=0 KVPS_TEST_TEAM_TCP=1
done
for name in ${KVPS_TEST_ZMQ:-}; do
  [ -x "$dir/$name" ] || continue
  run_one "$dir/$name" "$name [zmq]" KVPS_RING_SHM=0 KVPS_RING_TCP=0
done
wait
for name in ${KVPS_TEST_BG:-}; do
  [ -f "$bgdir/$name.rc" ] || continue
  BG_OUT="$bgdir/$name.out" BG_RC="$bgdir/$name.rc" BG_S="$bgdir/$name.s" run_one "$dir/$name" "$name (beside the others)"
done
if [ "$skip" -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"; else echo "$pass passed, $fail failed"; fi
[ "$fail" -eq 0 ]
