#!/usr/bin/env bash
# bench/ab.sh REV [RUNS] - the same benchmarks before (git revision REV) and after (this working
# tree), alternating in one run so that both see the same machine: bench_pushpull --quick and
# bench_ring over 2 and 4 ranks, every collective, 4 KB to 16 MB. RUNS pairs (default 3); the
# CSVs stay in a temporary folder, whose name is printed, and bench/ab_summary.py summarises them.
# Used for issue 16 (a restructuring that must not slow anything down): see BENCHMARKS.md.
set -eu
rev=${1:?usage: bench/ab.sh REV [RUNS]}
runs=${2:-3}
cd "$(dirname "$0")/.."
dir=$(mktemp -d /tmp/kvps-ab.XXXXXX)
mkdir -p "$dir/old/src"
git archive "$rev" | tar -x -C "$dir/old/src"
make -s -C "$dir/old/src" B="$dir/old" "$dir/old/bench_pushpull" "$dir/old/bench_ring" >/dev/null
make -s B="$dir/new" "$dir/new/bench_pushpull" "$dir/new/bench_ring" >/dev/null
echo "bench/ab.sh: $rev against the working tree, $runs alternating pairs, CSVs in $dir"
for i in $(seq "$runs"); do
  for v in old new; do
    "$dir/$v/bench_pushpull" --quick --reps 3 --csv > "$dir/pp_${v}_$i.csv" 2>/dev/null
    "$dir/$v/bench_ring" --ranks 2,4 --sizes 4K:16M:16 --coll all --no-mpi --csv > "$dir/ring_${v}_$i.csv" 2>/dev/null
  done
done
python3 bench/ab_summary.py "$dir"
