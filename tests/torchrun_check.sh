#!/usr/bin/env bash
# tests/torchrun_check.sh - the starting points under PyTorch's own launcher, torchrun
# (python3 -m torch.distributed.run --no_python), with no kvps variable but KVPS_NUM_SERVERS:
# ranks from RANK / WORLD_SIZE, the processes meeting at MASTER_ADDR / MASTER_PORT (kvps_launch.h).
#   1. torchrun --nproc_per_node 4 hello_ring (its default static rendezvous: torchrun's own
#      store holds MASTER_PORT, kvps meets at the port after it);
#   2. the same with --standalone (the c10d rendezvous: MASTER_PORT is free for kvps);
#   3. KVPS_NUM_SERVERS=2 torchrun --nproc_per_node 5 hello_ps (2 servers, 3 workers).
# Each: the known weights on every rank, exit 0 within 60 s (a hang check; torchrun itself checks
# its workers every 5 s, so it exits about 5 s after they do), the servers back
# from kvps_server_run by themselves, nothing "lost" (tests/clean_finish.sh).
# Debian's python3-torch 1.13 under Python 3.11 cannot parse torchrun's default --redirects 0 /
# --tee 0 (IntFlag iteration changed in 3.11: 'NoneType' object has no attribute 'get'); the
# check passes --redirects 1 --tee 1 (stdout to a log file and the console).
#
# usage: tests/torchrun_check.sh [BUILD_DIR]   (`make torchrun-check`; installs python3-torch
# when root, else prints the apt-get line). Ends with "N passed, N failed"; exits 77 (skipped)
# where torch is missing and cannot be installed.
set -u
cd "$(dirname "$0")/.." || exit 1
B=${1:-build}
PY=/usr/bin/python3 # Debian's python3-torch is for Debian's python3
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
skip_all() { echo "skipped: $1"; echo "0 passed, 0 failed, 1 skipped"; exit 77; }
. tests/clean_finish.sh

if ! "$PY" -c 'import torch.distributed.run' 2>/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-torch >&2 || true
    else
        echo "torchrun-check needs PyTorch: apt-get install -y --no-install-recommends python3-torch" >&2
    fi
    "$PY" -c 'import torch.distributed.run' 2>/dev/null || skip_all "no python3-torch"
fi
for b in hello_ps hello_ring; do
    [ -x "$B/$b" ] || { echo "build $B/$b first (make $B/$b)" >&2; exit 1; }
done
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() { # a free port p with p + 1 free too, from 20000-32766
    local p=$((20000 + RANDOM % 12000))
    while ! port_free $p || ! port_free $((p + 1)); do p=$((p >= 32766 ? 20000 : p + 1)); done
    echo $p
}
logs=$(mktemp -d /tmp/kvps-torchrun.XXXXXX)
trap 'rm -rf "$logs"' EXIT
torchrun=("$PY" -m torch.distributed.run --redirects 1 --tee 1 --log_dir "$logs")

timed 60 "${torchrun[@]}" --nproc_per_node 4 --master_addr 127.0.0.1 --master_port "$(free_port)" --no_python "$B/hello_ring"
check_finish "torchrun --nproc_per_node 4 hello_ring (static rendezvous: beside torchrun's store)" 4 0
timed 60 "${torchrun[@]}" --standalone --nproc_per_node 4 --no_python "$B/hello_ring"
check_finish "torchrun --standalone --nproc_per_node 4 hello_ring (c10d rendezvous)" 4 0
timed 60 env KVPS_NUM_SERVERS=2 "${torchrun[@]}" --nproc_per_node 5 --master_addr 127.0.0.1 --master_port "$(free_port)" \
    --no_python "$B/hello_ps"
check_finish "KVPS_NUM_SERVERS=2 torchrun --nproc_per_node 5 hello_ps (2 servers, 3 workers)" 3 2

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
