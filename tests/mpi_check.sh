#!/usr/bin/env bash
# tests/mpi_check.sh - the starting points under a real Open MPI mpirun, as the README runs them:
# ranks from OMPI_COMM_WORLD_RANK (kvps_env_read: ranks 0..N-1 serve, the rest work), the
# variables passed with -x, processes on loopback. Checks (tests/clean_finish.sh):
#   1. mpirun -n 5 hello_ps with KVPS_SERVERS (2) and KVPS_NUM_WORKERS=3: every worker holds the
#      known weights, both servers return from kvps_server_run by themselves, mpirun exits 0
#      within 20 s (a hang check: nothing is killed), no process says "lost";
#   2. the same with 2 shards x 2 replicas ('|' chains, mpirun -n 7: 4 servers, every one of them,
#      backups too, returning by itself);
#   3. mpirun -n 3 hello_ring with KVPS_RING_PEERS: every rank holds the known weights, exit 0,
#      within 20 s, nothing "lost";
#   4. and 5. hello_ring (4 ranks) and hello_ps (2 servers, 3 workers) with only MASTER_ADDR and
#      MASTER_PORT (and KVPS_NUM_SERVERS): the processes meet at rank 0's address (kvps_launch.h).
# Each check prints the job's wall time and the time from the last result line to mpirun's exit.
#
# usage: tests/mpi_check.sh [BUILD_DIR]     (`make mpi-check`; make test runs it from
#                                            test_examples; BUILD_DIR defaults to build)
# Ends with "N passed, N failed"; exits 77 (skipped) where mpirun is missing and cannot be
# installed here (scripts/deps.sh mpi installs Open MPI when root, else prints the apt-get line),
# or is not Open MPI's.
set -u
cd "$(dirname "$0")/.." || exit 1
B=${1:-build}
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
skip_all() { echo "skipped: $1"; echo "0 passed, 0 failed, 1 skipped"; exit 77; }
. tests/clean_finish.sh

if ! command -v mpirun >/dev/null 2>&1; then
    scripts/deps.sh mpi >&2 # installs Open MPI as root, else prints the exact apt-get line
    command -v mpirun >/dev/null 2>&1 || skip_all "no mpirun"
fi
mpirun --version 2>&1 | grep -qE 'Open MPI|OpenRTE' || skip_all "mpirun is not Open MPI's (this check uses its -x and --oversubscribe)"
for b in hello_ps hello_ring; do
    [ -x "$B/$b" ] || { echo "build $B/$b first (make $B/$b)" >&2; exit 1; }
done
# root needs --allow-run-as-root, more ranks than cores --oversubscribe; only the self and tcp
# transports (no shared-memory or fabric probing in a container)
mpirun=(mpirun --oversubscribe --mca btl self,tcp)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
endpoints() { # N loopback endpoints on ports free now, from 20000-32767
    local n=$1 p=$((20000 + RANDOM % 12000)) e=""
    while [ "$n" -gt 0 ]; do
        p=$((p >= 32767 ? 20000 : p + 1))
        port_free $p || continue
        e="$e${e:+,}tcp://127.0.0.1:$p"
        n=$((n - 1))
    done
    echo "$e"
}

export KVPS_SERVERS KVPS_NUM_WORKERS=3
KVPS_SERVERS=$(endpoints 2)
timed 20 "${mpirun[@]}" -n 5 -x KVPS_SERVERS -x KVPS_NUM_WORKERS "$B/hello_ps"
check_finish "mpirun -n 5 hello_ps (2 servers, 3 workers)" 3 2
unset KVPS_SERVERS KVPS_NUM_WORKERS

# 2 shards x 2 replicas: ranks 0-3 serve (process p is shard p % 2, replica p / 2), 4-6 work
export KVPS_SERVERS KVPS_NUM_WORKERS=3
eps=$(endpoints 4)
IFS=, read -r e0 e1 e2 e3 <<<"$eps"
KVPS_SERVERS="$e0|$e2,$e1|$e3"
timed 20 "${mpirun[@]}" -n 7 -x KVPS_SERVERS -x KVPS_NUM_WORKERS "$B/hello_ps"
check_finish "mpirun -n 7 hello_ps (2 shards x 2 replicas, 3 workers)" 3 4
unset KVPS_SERVERS KVPS_NUM_WORKERS

timed 20 "${mpirun[@]}" -n 3 -x KVPS_RING_PEERS="$(endpoints 3)" "$B/hello_ring"
check_finish "mpirun -n 3 hello_ring" 3 0

# one rendezvous address, no list of endpoints (kvps_launch.h): ranks from OMPI_COMM_WORLD_RANK
rdv=$(endpoints 1); rdv=${rdv##*:}
timed 20 "${mpirun[@]}" -n 4 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$rdv "$B/hello_ring"
check_finish "mpirun -n 4 hello_ring with MASTER_ADDR/MASTER_PORT alone" 4 0
rdv=$(endpoints 1); rdv=${rdv##*:}
timed 20 "${mpirun[@]}" -n 5 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$rdv -x KVPS_NUM_SERVERS=2 "$B/hello_ps"
check_finish "mpirun -n 5 hello_ps with MASTER_ADDR/MASTER_PORT and KVPS_NUM_SERVERS=2" 3 2

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
