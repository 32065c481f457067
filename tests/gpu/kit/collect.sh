#!/usr/bin/env bash
# collect.sh KIT - completes the device kit after make has linked KIT/bin: its scripts, every
# shared library the programs need that a GPU box lacks (ldd's closure less box_provides) copied
# into KIT/lib, a MANIFEST (when, where, which commit and toolchain, what each part is), and the
# checks: the closure (closure.sh) and the size (at most 48 MiB). Called by `make gpu-kit`.
set -eu
kit=${1:?usage: collect.sh KIT}
src=$(cd "$(dirname "$0")" && pwd)
limit_mib=48
cp "$src/device_check.sh" "$src/closure.sh" "$src/box_provides" "$src/README" "$kit/"
chmod +x "$kit/device_check.sh" "$kit/closure.sh"
rm -rf "$kit/lib"; mkdir -p "$kit/lib"
provided=" $(grep -v '^#' "$src/box_provides" | tr '\n' ' ') "
for b in "$kit"/bin/*; do
  ldd "$b" | while read -r lib arrow path _; do
    [ "$arrow" = "=>" ] || continue
    [[ "$provided" == *" $lib "* ]] && continue
    [ "$path" = "not" ] && { echo "collect: bin/$(basename "$b") needs $lib, which is not found here" >&2; exit 1; }
    [ -e "$kit/lib/$lib" ] || cp -L "$path" "$kit/lib/$lib"
  done
done
chmod 644 "$kit"/lib/*
nccl_h=$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "${CUDA_HOME:-/usr/local/cuda}/include/nccl.h" | paste -sd.)
glibc=$(for f in "$kit"/bin/* "$kit"/lib/*; do objdump -T "$f" 2>/dev/null; done | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)
glibcxx=$(for f in "$kit"/bin/* "$kit"/lib/*; do objdump -T "$f" 2>/dev/null; done | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -n 1)
commit=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$src" diff --quiet HEAD 2>/dev/null || commit="$commit + uncommitted changes"
{
  echo "kvps GPU device kit, built $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n) from commit $commit"
  echo "toolchain: $("${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}" --version | grep -o 'release [0-9.]*, V[0-9.]*' || echo 'nvcc ?'); NCCL headers $nccl_h; $(cc --version | head -n 1)"
  echo "machine code: sm_80, sm_90 (+ PTX compute_90) and the toolkit's default; CUDA runtime linked statically"
  echo "needs from the box: $(grep -v '^#' "$src/box_provides" | paste -sd' '); newest symbol versions used: $glibc, $glibcxx"
  echo "programs (bin/):"; (cd "$kit/bin" && ls -l | awk 'NR > 1 {printf "  %-16s %9d bytes\n", $9, $5}')
  echo "libraries copied from this machine (lib/):"; (cd "$kit/lib" && ls -l | awk 'NR > 1 {printf "  %-24s %9d bytes\n", $9, $5}')
} > "$kit/MANIFEST"
bytes=$(du -sb "$kit" | awk '{print $1}')
echo "kit size: $bytes bytes (limit $limit_mib MiB)" >> "$kit/MANIFEST"
if [ "$bytes" -gt $((limit_mib * 1024 * 1024)) ]; then
  echo "collect: $kit is $bytes bytes, over its $limit_mib MiB" >&2; rm -f "$kit/MANIFEST"; exit 1
fi
if ! "$kit/closure.sh" "$kit" > "$kit/closure.txt"; then
  cat "$kit/closure.txt" >&2; rm -f "$kit/MANIFEST"; exit 1
fi
rm -f "$kit/closure.txt"
echo "make gpu-kit: $kit ready ($((bytes / 1024)) KiB: $(ls "$kit/bin" | wc -l) programs, $(ls "$kit/lib" | wc -l) libraries); on a GPU box: $kit/device_check.sh OUTDIR"
