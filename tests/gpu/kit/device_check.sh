#!/usr/bin/env bash
# device_check.sh [OUTDIR] - kvps's GPU checks on a GPU box, in one command (see README beside
# it). OUTDIR defaults to $OUT, else ./gpu-kit-out; it gets summary.txt (a line per step, the
# figures, the verdict) and one log per step.
#   1. the device (bin/gpu_probe: static CUDA runtime, nothing else);
#   2. NCCL, from $KVPS_NCCL_DIR, the CUDA toolkit, the loader's cache or PyTorch's install
#      (python3's nvidia.nccl, then torch/lib), and the kit's closure on this box (closure.sh);
#   3. c_api; test_gpu (every kernel against the CPU codecs bit for bit, NCCL on this GPU, the
#      hierarchical step in one process); hier_procs (two processes on the GPU, servers and ring,
#      a peer killed mid-step); bench_gpu (codec GB/s next to a device-to-device copy, NCCL, the
#      hierarchical step); test_gpu_host last. Each under a limit, all within BUDGET_S (290 s).
# Exit 0: every step passed, or there is no CUDA device (it says so and claims no pass);
# 1: a step failed; 2: something the kit needs is missing here (named).
set -u
kit=$(cd "$(dirname "$0")" && pwd)
out=${1:-${OUT:-$PWD/gpu-kit-out}}
mkdir -p "$out" || { echo "device_check: cannot make $out"; exit 2; }
chmod +x "$kit"/bin/* "$kit"/*.sh 2>/dev/null # a copy that lost the execute bits
sum="$out/summary.txt"
: > "$sum"
budget=${BUDGET_S:-290}
start=$(date +%s)
say() { echo "device_check: $*"; echo "$*" >> "$sum"; }
say "$(head -n 1 "$kit/MANIFEST" 2>/dev/null || echo 'kvps GPU device kit (no MANIFEST)')"
say "box: $(uname -srm); $(getconf GNU_LIBC_VERSION 2>/dev/null || echo 'glibc ?'); $(date -u '+%Y-%m-%d %H:%M UTC')"

# 1. the device
probe=$("$kit/bin/gpu_probe" 2>&1); prc=$?
while IFS= read -r l; do say "$l"; done <<< "$probe"
if [ $prc -ne 0 ] && [ $prc -ne 3 ]; then say "verdict: FAIL (the device probe: exit $prc)"; exit 1; fi

# 2. NCCL and the kit's libraries on this box
looked=()
py_dir() { # py_dir WHAT PYTHON-EXPR: the folder the expression names in python3's install, if NCCL is there
  local py d
  for py in python3 /opt/torch/.venv/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    looked+=("$py's $1")
    d=$("$py" -c "import os; $2" 2>/dev/null) && [ -e "$d/libnccl.so.2" ] && { echo "$d"; return 0; }
  done
  return 1
}
nccl_dir() {
  local d
  for d in ${KVPS_NCCL_DIR:-} "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do
    looked+=("$d"); [ -e "$d/libnccl.so.2" ] && { echo "$d"; return 0; }
  done
  d=$(ldconfig -p 2>/dev/null | awk '$1 == "libnccl.so.2" {print $NF; exit}')
  looked+=("the loader's cache (ldconfig -p)"); [ -n "$d" ] && [ -e "$d" ] && { dirname "$d"; return 0; }
  py_dir "nvidia.nccl (pip nvidia-nccl-cu13)" \
    'import nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib"))' && return 0
  for d in /opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib /usr/local/lib/python3*/dist-packages/nvidia/nccl/lib \
           /usr/lib/python3/dist-packages/nvidia/nccl/lib; do
    [ -e "$d/libnccl.so.2" ] && { echo "$d"; return 0; }
  done
  looked+=("/opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib" "/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib")
  py_dir "torch/lib" 'import torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))'
}
nccl=$(nccl_dir)
if [ -z "$nccl" ]; then
  nccl_dir >/dev/null # again in this shell, for the list of places
  say "libnccl.so.2 not found; looked in: $(IFS=';'; echo "${looked[*]}")"
  say "verdict: MISSING NCCL (set KVPS_NCCL_DIR to the folder holding libnccl.so.2)"
  exit 2
fi
nccl_line=$("$kit/bin/gpu_probe" "$nccl/libnccl.so.2" 2>&1 | grep '^NCCL:')
say "${nccl_line:-NCCL: $nccl/libnccl.so.2 (its version: unknown without a device)}"
if ! "$kit/closure.sh" "$kit" "$nccl" > "$out/closure.log" 2>&1; then
  grep FAIL "$out/closure.log" | while IFS= read -r l; do say "$l"; done
  say "verdict: MISSING LIBRARIES (closure.log names them)"
  exit 2
fi
say "closure: every program's libraries resolve (kit lib/, box: $(grep -v '^#' "$kit/box_provides" | paste -sd' '))"
export LD_LIBRARY_PATH="$nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

if [ $prc -eq 3 ]; then
  capi=$("$kit/bin/c_api" 2>&1); crc=$?
  say "c_api here: $capi (exit $crc)"
  say "verdict: NO DEVICE: no CUDA device on this machine, so nothing ran on a GPU and no pass is claimed"
  [ $crc -eq 0 ] || exit 2
  exit 0
fi

# 3. the checks, each under its limit and within the budget
fails=0
step() { # step NAME LIMIT_S COMMAND...
  local name=$1 lim=$2; shift 2
  local left=$((budget - ($(date +%s) - start)))
  [ $left -lt $lim ] && lim=$left
  if [ $lim -lt 5 ]; then say "$name: NOT RUN (the ${budget} s budget is spent)"; fails=$((fails + 1)); return; fi
  local t0=$(date +%s)
  timeout -k 5 "$lim" "$@" > "$out/$name.log" 2>&1
  local rc=$? dt=$(( $(date +%s) - t0 ))
  local res=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$out/$name.log" | tail -n 1)
  if [ $rc -eq 0 ]; then say "$name: ok (${dt} s${res:+; $res})"
  else
    fails=$((fails + 1))
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && res="stopped at its ${lim} s limit${res:+; $res}"
    say "$name: FAIL (exit $rc, ${dt} s${res:+; $res})"
    grep -E 'FAIL|not ok|error|Error' "$out/$name.log" | head -n 8 | while IFS= read -r l; do say "  $l"; done
  fi
}
step c_api 30 "$kit/bin/c_api"
step test_gpu 200 "$kit/bin/test_gpu"
step hier_procs 90 "$kit/bin/hier_procs"
step bench_gpu 90 "$kit/bin/bench_gpu"
step test_gpu_host 60 "$kit/bin/test_gpu_host"
if [ -s "$out/bench_gpu.log" ]; then
  say "figures (bench_gpu):"
  grep -v '^$' "$out/bench_gpu.log" | while IFS= read -r l; do say "  $l"; done
fi
if [ $fails -eq 0 ]; then say "verdict: PASS: every step passed ($(( $(date +%s) - start )) s)"; exit 0; fi
say "verdict: FAIL: $fails step(s) failed ($(( $(date +%s) - start )) s); the logs are in $out"
exit 1
