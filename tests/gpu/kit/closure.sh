#!/usr/bin/env bash
# closure.sh KIT [NCCL_DIR] - does every program of the device kit find its shared libraries?
# Each one in KIT/lib (copied there by collect.sh) or on KIT/box_provides, the short list a GPU box
# provides; with NCCL_DIR, NCCL must be found there. ldd is asked for each program in KIT/bin (it
# lists the whole closure as that program loads it: the kit's $ORIGIN rpath also serves the
# libraries' own needs). Prints one line per program and a verdict; exit 0 only when all resolve.
set -u
kit=${1:?usage: closure.sh KIT [NCCL_DIR]}
nccl=${2:-}
[ -d "$kit/bin" ] && [ -f "$kit/box_provides" ] || { echo "closure: $kit is not a device kit (no bin/ or box_provides)"; exit 2; }
kitlib=$(cd "$kit/lib" 2>/dev/null && pwd -P) || kitlib=/nonexistent
provided=" $(grep -v '^#' "$kit/box_provides" | tr '\n' ' ') "
bad=0
for b in "$kit"/bin/*; do
  [ -x "$b" ] || continue
  name=$(basename "$b")
  out=$(LD_LIBRARY_PATH="$nccl" ldd "$b" 2>&1); rc=$?
  if [ $rc -ne 0 ] && ! printf '%s\n' "$out" | grep -q '=>'; then
    echo "closure: FAIL bin/$name: ldd failed: $out"; bad=1; continue
  fi
  problems=""; inkit=0; frombox=""
  while IFS= read -r line; do
    case "$line" in
      *"version \`"*"not found"*|*"version '"*"not found"*) problems+=" [${line#"${line%%[![:space:]]*}"}]"; continue ;;
    esac
    lib=$(printf '%s\n' "$line" | awk '{print $1}')
    case "$line" in
      *"=> not found"*)
        if [[ "$provided" != *" $lib "* ]]; then problems+=" [$lib: not found, not in the kit]"
        elif [ "$lib" = libnccl.so.2 ] && [ -n "$nccl" ]; then problems+=" [libnccl.so.2: not in $nccl]"
        else frombox+=" $lib"; fi ;;
      *"=> "*)
        path=$(printf '%s\n' "$line" | sed -n 's/.*=> \(.*\) (0x.*/\1/p')
        real=$(cd "$(dirname "$path")" 2>/dev/null && pwd -P)
        if [ "$real" = "$kitlib" ]; then inkit=$((inkit + 1))
        elif [[ "$provided" == *" $lib "* ]]; then frombox+=" $lib"
        else problems+=" [$lib: from $path, outside the kit]"; fi ;;
    esac
  done <<< "$out"
  if [ -n "$problems" ]; then echo "closure: FAIL bin/$name:$problems"; bad=1
  else echo "closure: ok bin/$name: $inkit from the kit's lib/; from the box:$frombox"; fi
done
if [ $bad -eq 0 ]; then echo "closure: every program resolves in the kit or on box_provides"; fi
exit $bad
