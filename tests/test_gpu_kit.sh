#!/usr/bin/env bash
# test_gpu_kit - the GPU device kit (make gpu-kit, mk/gpukit.mk) checked without a GPU:
#   - it is there and at most 48 MiB; every program's libraries resolve in its lib/ or on its
#     box_provides list (closure.sh), and a kit missing libzmq.so.5 fails that check, naming it,
#     and device_check.sh on it stops with exit 2 naming it;
#   - a bare box, emulated in a mount namespace of our own (root): every library the kit carries
#     hidden on the system (bound over by /dev/null) and the toolkit's lib folder (NCCL) hidden
#     (an empty tmpfs); NCCL only in a pip-style nvidia/nccl/lib on PYTHONPATH. There
#     device_check.sh finds that NCCL, its closure holds, c_api runs, it says NO DEVICE, exits 0
#     and claims no pass; without the pip folder it stops with exit 2 naming libnccl.so.2 and the
#     places it looked; and hier_procs --host (two processes, kvps servers and ring over the
#     kit's own libzmq, peers killed) passes.
# Without a kit (no nvcc): one skip line. Ends with "N passed, N failed".
set -u
here=$(cd "$(dirname "$0")" && pwd)
kit="$here/gpu-kit"
pass=0; fail=0
check() { # check NAME CONDITION-EXIT-CODE [DETAIL]
  if [ "$2" -eq 0 ]; then echo "ok $1"; pass=$((pass + 1)); else echo "FAIL $1${3:+: $3}"; fail=$((fail + 1)); fi
}
if [ ! -f "$kit/MANIFEST" ]; then
  nvcc=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
  if ! command -v "$nvcc" >/dev/null 2>&1; then
    echo "skipped: no device kit ($nvcc not found: make gpu-kit builds nothing)"
    echo "0 passed, 0 failed, 1 skipped"; exit 0
  fi
  echo "FAIL no kit at $kit although nvcc is there (make gpu-kit)"; echo "0 passed, 1 failed"; exit 1
fi
tmp=$(mktemp -d /tmp/kvps-kit-test-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cudalib=$(readlink -f "${CUDA_HOME:-/usr/local/cuda}/lib64")

bytes=$(du -sb "$kit" | awk '{print $1}')
[ "$bytes" -le $((48 * 1024 * 1024)) ]; check "kit size $bytes bytes <= 48 MiB" $?
out=$("$kit/closure.sh" "$kit" 2>&1); rc=$?
check "closure: every program's libraries in the kit or on box_provides" $rc "$out"

# a kit without libzmq.so.5: the closure check and device_check.sh must say so
cp -a "$kit" "$tmp/broken"; rm "$tmp/broken/lib/libzmq.so.5"
out=$("$tmp/broken/closure.sh" "$tmp/broken" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q 'FAIL bin/c_api:.*libzmq.so.5' <<< "$out"; check "closure fails on a kit without libzmq.so.5, naming it" $? "$out"
out=$(KVPS_NCCL_DIR=$cudalib "$tmp/broken/device_check.sh" "$tmp/out-broken" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q 'libzmq.so.5' <<< "$out" && grep -q 'MISSING LIBRARIES' <<< "$out"
check "device_check.sh on it: exit 2 naming libzmq.so.5" $? "exit $rc: $out"

# device_check.sh on this machine as it is: no device, exit 0, nothing claimed
out=$("$kit/device_check.sh" "$tmp/out-here" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q 'verdict: NO DEVICE' "$tmp/out-here/summary.txt" && ! grep -q 'PASS' "$tmp/out-here/summary.txt"
check "device_check.sh here: exit 0, NO DEVICE, no pass claimed" $? "exit $rc: $out"

# a bare box in a mount namespace of our own
if [ "$(id -u)" -ne 0 ] || ! unshare -m --propagation private true 2>/dev/null; then
  echo "skipped: the bare-box emulation needs root and unshare -m; hier_procs --host runs without it"
  out=$("$kit/bin/hier_procs" --host --count 100003 --piece 10000 2>&1); rc=$?
  check "hier_procs --host through the kit" $rc "$out"
else
  mkdir -p "$tmp/site/nvidia/nccl/lib"
  : > "$tmp/site/nvidia/nccl/__init__.py"
  : > "$tmp/site/nvidia/nccl/lib/libnccl.so.2"
  cat > "$tmp/bare.sh" <<EOS
set -e
mount --bind "$(readlink -f "$cudalib/libnccl.so.2")" "$tmp/site/nvidia/nccl/lib/libnccl.so.2"
for l in "$kit"/lib/*; do
  for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /usr/local/lib; do
    [ -e "\$d/\$(basename "\$l")" ] && mount --bind /dev/null "\$(readlink -f "\$d/\$(basename "\$l")")"
  done
done
mount -t tmpfs none "$cudalib"
set +e
echo "== hidden: \$(ls "$kit/lib" | wc -l) system libraries, $cudalib"
# a kit program now loads only the kit's copies: the system's would fail to load
PYTHONPATH="$tmp/site" "$kit/device_check.sh" "$tmp/out-bare"; echo "== device_check rc=\$?"
"$kit/device_check.sh" "$tmp/out-nonccl"; echo "== no-nccl rc=\$?"
LD_LIBRARY_PATH="$tmp/site/nvidia/nccl/lib" "$kit/bin/hier_procs" --host --count 100003 --piece 10000; echo "== hier_procs rc=\$?"
EOS
  out=$(unshare -m --propagation private bash "$tmp/bare.sh" 2>&1)
  echo "$out" | sed 's/^/   | /'
  grep -q '^== device_check rc=0' <<< "$out" && grep -q 'verdict: NO DEVICE' "$tmp/out-bare/summary.txt" &&
    ! grep -q 'PASS' "$tmp/out-bare/summary.txt" && grep -q "NCCL: $tmp/site/nvidia/nccl/lib" "$tmp/out-bare/summary.txt" &&
    grep -q 'closure: every program' "$tmp/out-bare/summary.txt" && grep -q 'c_api here: c_api: kvps_gpu.h from C99 links and runs' "$tmp/out-bare/summary.txt"
  check "bare box: device_check.sh finds pip's NCCL, the kit resolves, c_api runs, NO DEVICE, exit 0, no pass claimed" $?
  grep -q '^== no-nccl rc=2' <<< "$out" && grep -q 'libnccl.so.2 not found; looked in:.*nvidia.nccl' "$tmp/out-nonccl/summary.txt"
  check "bare box without NCCL: exit 2 naming libnccl.so.2 and where it looked" $?
  grep -q '^== hier_procs rc=0' <<< "$out" && grep -q '^6 passed, 0 failed' <<< "$out"
  check "bare box: hier_procs --host (2 processes, servers and ring over the kit's libzmq, peers killed)" $?
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
