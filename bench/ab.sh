#!/usr/bin/env bash
# bench/ab.sh REV [RUNS] - the library before (git revision REV) and after (this working tree),
# alternating in one run so that both see the same machine: this tree's bench_pushpull --quick
# and bench_ring (2 and 4 ranks, every collective, 4 KB to 16 MB), built once against REV's
# headers (kvps.h, kvps_ring.h, kvps_gpu.h) and once against this tree's, so that only the
# library differs (the raw ZeroMQ peer is the same code in both). Where this tree's benches do
# not compile against REV's headers, REV's own benches are used (and said). RUNS pairs (default
# 3); the CSVs stay in a temporary folder, whose name is printed; bench/ab_summary.py summarises.
# Where valgrind is, it also counts the instructions of bench/ab_requests (a fixed load of
# requests through a server, and of ring broadcasts) before and after: a figure the noise of
# this machine does not move.
# Used for issue 16 (a restructuring that must not slow anything down): see BENCHMARKS.md.
set -eu
rev=${1:?usage: bench/ab.sh REV [RUNS] (RUNS 0: the instruction counts only)}
runs=${2:-3}
cd "$(dirname "$0")/.."
dir=$(mktemp -d /tmp/kvps-ab.XXXXXX)
mkdir -p "$dir/old/src" "$dir/old/rev"
git ls-files -co --exclude-standard | tar -cf - -T - | tar -x -C "$dir/old/src"
for h in kvps.h kvps_ring.h kvps_gpu.h; do git show "$rev:$h" > "$dir/old/src/$h"; done
what="this tree's benches against $rev's headers"
if ! make -s -C "$dir/old/src" B="$dir/old" "$dir/old/bench_pushpull" "$dir/old/bench_ring" "$dir/old/ab_requests" >/dev/null 2>&1; then
  git archive "$rev" | tar -x -C "$dir/old/rev"
  make -s -C "$dir/old/rev" B="$dir/old" "$dir/old/bench_pushpull" "$dir/old/bench_ring" >/dev/null
  what="$rev's own benches (this tree's do not compile against its headers)"
fi
make -s B="$dir/new" "$dir/new/bench_pushpull" "$dir/new/bench_ring" "$dir/new/ab_requests" >/dev/null
if command -v valgrind >/dev/null && [ -x "$dir/old/ab_requests" ]; then
  for load in server ring; do
    for v in old new; do
      valgrind --tool=callgrind --callgrind-out-file="$dir/cg_${load}_$v" "$dir/$v/ab_requests" "$load" \
        > "$dir/cg_${load}_$v.n" 2> "$dir/cg_${load}_$v.err"
    done
    n=$(cat "$dir/cg_${load}_new.n")
    o=$(sed -n 's/.*Collected : //p' "$dir/cg_${load}_old.err"); w=$(sed -n 's/.*Collected : //p' "$dir/cg_${load}_new.err")
    echo "callgrind, ab_requests $load ($n requests or collectives): instructions before $o, after $w," \
         "$(( (w - o) / n )) per request, after / before $(awk -v a="$w" -v b="$o" 'BEGIN { printf "%.4f", a / b }')"
  done
fi
echo "bench/ab.sh: before = $what; after = this tree; $runs alternating pairs; CSVs in $dir"
for i in $(seq "$runs"); do
  for v in old new; do
    "$dir/$v/bench_pushpull" --quick --reps 3 --csv > "$dir/pp_${v}_$i.csv" 2>/dev/null
    "$dir/$v/bench_ring" --ranks 2,4 --sizes 4K:16M:16 --coll all --no-mpi --csv > "$dir/ring_${v}_$i.csv" 2>/dev/null
  done
done
[ "$runs" -gt 0 ] && python3 bench/ab_summary.py "$dir"
