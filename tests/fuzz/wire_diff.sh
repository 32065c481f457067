#!/usr/bin/env bash
# tests/fuzz/wire_diff.sh REV [MUTATIONS] - are the server's replies byte for byte what REV's
# server answers? Builds the fuzz_server harness (-DFZ_WIRE_DUMP: a plain driver that prints
# every reply's bytes) twice, against REV's kvps.h and this tree's, feeds both the fuzz_server
# seeds and MUTATIONS variants of each (default 8000, the same fixed-seed sequence for both),
# and compares. For changes that must not change the protocol (issue 16's restructuring).
set -eu
rev=${1:?usage: tests/fuzz/wire_diff.sh REV [MUTATIONS]}
export FZ_MUTATIONS=${2:-8000}
cd "$(dirname "$0")/../.."
dir=$(mktemp -d /tmp/kvps-wire.XXXXXX)
mkdir -p "$dir/rev/tests/fuzz"
git show "$rev:kvps.h" > "$dir/rev/kvps.h"
cp tests/fuzz/fuzz_common.h "$dir/rev/tests/fuzz/"
flags="-std=c99 -D_POSIX_C_SOURCE=200809L -DFZ_WIRE_DUMP -O1 -g -ffp-contract=off -w"
libs="$(pkg-config --cflags --libs libzmq) -lm -pthread"
# shellcheck disable=SC2086
cc $flags -I"$dir/rev" tests/fuzz/fuzz_server.c -o "$dir/before" $libs
# shellcheck disable=SC2086
cc $flags -I. tests/fuzz/fuzz_server.c -o "$dir/after" $libs
seeds=(tests/fuzz/corpus/fuzz_server/*)
"$dir/before" "${seeds[@]}" > "$dir/before.txt"
"$dir/after" "${seeds[@]}" > "$dir/after.txt"
inputs=$(grep -c '^\(==\|--\)' "$dir/after.txt")
replies=$(grep -c '^R' "$dir/after.txt")
if cmp -s "$dir/before.txt" "$dir/after.txt"; then
  echo "wire_diff: $inputs inputs, $replies replies: byte-identical to $rev"
  rm -rf "$dir"
else
  echo "wire_diff: $inputs inputs: the replies differ from $rev's ($(diff "$dir/before.txt" "$dir/after.txt" | grep -c '^>') lines); see $dir/before.txt and after.txt"
  exit 1
fi
