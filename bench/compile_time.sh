#!/bin/sh
# Compile time of the examples, this tree against another commit, in the same run (issue 28).
#   bench/compile_time.sh [BASE] [ROUNDS]      BASE: a commit (default HEAD~1), ROUNDS: 3
# Compiles examples/hello_ring.c and examples/hello_ps.c to an object, with the Makefile's flags
# at -O2 and at -O0, alternating base and this tree ROUNDS times; prints each program's times
# (min-max seconds), preprocessed lines, and this tree's time / the base's. The base is checked
# out into a temporary git worktree, removed at the end.
set -eu
BASE=${1:-HEAD~1}
ROUNDS=${2:-3}
CC=${CC:-cc}
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'git -C "$here" worktree remove --force "$tmp/base" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT INT TERM
git -C "$here" worktree add --detach "$tmp/base" "$BASE" >/dev/null 2>&1
FLAGS="-std=c99 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Wshadow -ffp-contract=off $(pkg-config --cflags libzmq 2>/dev/null)"
echo "compile time: this tree ($(git -C "$here" rev-parse --short HEAD)$(git -C "$here" diff --quiet || echo '+changes')) against $BASE ($(git -C "$tmp/base" rev-parse --short HEAD)); $ROUNDS rounds, alternating; $($CC --version | head -1)"

# seconds to compile $2 in tree $1 with $3
one() {
    t0=$(date +%s%N)
    (cd "$1" && $CC $FLAGS $3 -I. -c "$2" -o "$tmp/o.o")
    t1=$(date +%s%N)
    echo $(( (t1 - t0) / 1000000 ))
}
printf '%-22s %-5s %16s %16s %8s %10s %10s\n' program opt "base s" "this s" "ratio" "base lines" "this lines"
for prog in examples/hello_ring.c examples/hello_ps.c; do
    for opt in -O2 -O0; do
        b=""; t=""
        r=0
        while [ $r -lt "$ROUNDS" ]; do
            b="$b $(one "$tmp/base" $prog "$opt")"
            t="$t $(one "$here" $prog "$opt")"
            r=$((r + 1))
        done
        bl=$(cd "$tmp/base" && $CC $FLAGS -I. -E $prog | wc -l)
        tl=$(cd "$here" && $CC $FLAGS -I. -E $prog | wc -l)
        echo "$prog $opt $b / $t $bl $tl" | awk '{
            n = (NF - 5) / 2; bmin = 1e18; bmax = 0; tmin = 1e18; tmax = 0
            for (i = 3; i < 3 + n; i++) { if ($i < bmin) bmin = $i; if ($i > bmax) bmax = $i }
            for (i = 4 + n; i < 4 + 2 * n; i++) { if ($i < tmin) tmin = $i; if ($i > tmax) tmax = $i }
            printf "%-22s %-5s %7.2f-%-7.2f  %7.2f-%-7.2f %7.2fx %10d %10d\n", $1, $2, bmin / 1000, bmax / 1000,
                   tmin / 1000, tmax / 1000, tmin / bmin, $(NF - 1), $NF }'
    done
done
echo "ratio: this tree's fastest / the base's fastest (< 1: this tree compiles faster)"
