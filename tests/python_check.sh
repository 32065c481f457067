#!/bin/sh
# tests/python_check.sh - the torch layer (python/kvps/torch) against PyTorch itself: every
# tests/python/test_torch_*.py, each with real processes on loopback (what each checks is said at
# its top). `make python-check`; optional like `make slurm-check`: Debian's python3-torch is
# large, so it is installed here only as root (else the apt-get line is printed and the check
# skipped, exit 77). Ends with "N passed, N failed".
B=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
PY=/usr/bin/python3 # Debian's python3-torch is for Debian's python3
if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-torch python3-numpy >&2 || true
    else
        echo "python-check needs PyTorch: apt-get install -y --no-install-recommends python3-torch python3-numpy" >&2
    fi
    "$PY" -c 'import torch, numpy' 2>/dev/null || { echo "skipped: no python3-torch"; echo "0 passed, 0 failed, 1 skipped"; exit 77; }
fi
[ -f "$root/$B/libkvps.so" ] || { echo "python-check: no $B/libkvps.so (make $B/libkvps.so)"; exit 1; }
pass=0 fail=0
for t in "$root"/tests/python/test_torch_*.py; do
    [ -f "$t" ] || continue
    echo "== $(basename "$t")"
    out=$(cd "$root" && KVPS_LIB="$root/$B/libkvps.so" PYTHONPATH="$root/python" timeout 900 "$PY" "$t" 2>&1); rc=$?
    printf '%s\n' "$out" | tail -n 40
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    p=$(echo "$line" | awk '{print $1}'); f=$(echo "$line" | awk '{print $3}' | tr -d ,)
    [ -n "$p" ] || { p=0; f=1; echo "$(basename "$t"): no result line (exit $rc)"; }
    [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && f=1
    pass=$((pass + p)); fail=$((fail + f))
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
