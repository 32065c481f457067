#!/usr/bin/env bash
# perf_fusion.sh - where a ring step of bench_fusion spends its CPU: perf record (cpu-clock, 1000
# samples a second per CPU, call graphs) over the whole machine while bench_fusion runs one ring
# measure alone, once with LO and once with HI iterations; the difference divided by HI - LO is
# one step, so start-up, the model's allocation and the warm-up step drop out. Each sample is 1 ms
# of one CPU; the kvps ranks' samples (their own threads and ZeroMQ's) are sorted by what they
# were doing: the kernel's send and receive paths (sendto/recvfrom with TCP and loopback under
# them), memcpy, the reduction, waits (poll/epoll/futex), yields, page faults, the rest. idle is
# the machine's idle samples (both CPUs).
#   usage: bench/perf_fusion.sh [--bench PATH] [--measure fused|concatenated|one_by_one] [--lo N] [--hi N]
# Needs perf and the right to record the whole machine (root, or perf_event_paranoid <= 0).
set -euo pipefail
bench=build/bench_fusion; measure=fused; lo=2; hi=12
while [ $# -gt 0 ]; do
  case $1 in
    --bench) bench=$2; shift 2 ;; --measure) measure=$2; shift 2 ;;
    --lo) lo=$2; shift 2 ;; --hi) hi=$2; shift 2 ;;
    *) echo "usage: $0 [--bench PATH] [--measure fused|concatenated|one_by_one] [--lo N] [--hi N]" >&2; exit 2 ;;
  esac
done
command -v perf >/dev/null || { echo "perf_fusion: perf is not installed" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
comm=$(basename "$bench" | cut -c1-15)
sort_samples() { # perf script -> "category samples" lines
  perf script -i "$1" -F comm,ip,sym 2>/dev/null | awk -v re="^($comm|ZMQbg)" '
    /^[^ \t]/ { if (n) flush(); comm = $1; n = 1; first = ""; stack = ""; next }
    /^[ \t]/  { if (first == "") first = $2; stack = stack " " $2; next }
    function flush() {
      if (comm ~ re) {
        c = "other"
        if (stack ~ /sched_yield/) c = "yield"
        else if (stack ~ /page_fault/) c = "pagefault"
        else if (stack ~ /sys_sendto|sys_sendmsg|do_writev|ksys_write /) c = "send"
        else if (stack ~ /sys_recvfrom|sys_recvmsg|do_readv|ksys_read /) c = "recv"
        else if (stack ~ /sys_poll|sys_ppoll|sys_epoll_wait|sys_futex/) c = "wait"
        else if (first ~ /memmove|memcpy/) c = "memcpy"
        else if (first ~ /kvps__add|kvps_reduce_into|kvps_ring__recv_reduce/) c = "reduce"
        t[c]++
      } else if (comm ~ /swapper/) t["idle"]++
      n = 0
    }
    END { if (n) flush(); for (c in t) print c, t[c] }' | sort
}
for it in $lo $hi; do
  perf record -q -F 1000 -a -g -o "$tmp/$it.data" -- "$bench" --no-ps --no-mpi --repeat 1 --only "$measure" --iters "$it" \
    > "$tmp/$it.out" 2>/dev/null
  sort_samples "$tmp/$it.data" > "$tmp/$it.cat"
done
echo "# perf_fusion: $bench --only $measure, CPU ms a step (samples in $hi iterations - in $lo, / $((hi - lo)))"
join -a 2 -e 0 -o 0,1.2,2.2 "$tmp/$lo.cat" "$tmp/$hi.cat" |
  awk -v d=$((hi - lo)) '{ v = ($3 - $2) / d; if ($1 != "idle") s += v; printf "%-10s %7.1f\n", $1, v } END { printf "%-10s %7.1f\n", "total", s }'
grep -E "^repeat" "$tmp/$hi.out" || true
