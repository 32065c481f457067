#!/usr/bin/env bash
# tests/slurm_check.sh - the examples under a real srun, as the README shows them: rank from
# SLURM_PROCID, size from SLURM_NTASKS, ranks 0..n-1 serve, the variables passed by `export`.
#
# usage: tests/slurm_check.sh [BUILD_DIR]       (`make slurm-check`; BUILD_DIR defaults to build)
#
# A one-node Slurm cluster made for this run: munged, slurmctld and slurmd started in the
# foreground (no systemd), every file (munge key and socket, slurm.conf, state, spool, logs)
# in a temporary directory, non-default ports; /etc/munge and /etc/slurm are not used. Checks:
#   1. the cluster comes up: sinfo shows the node idle;
#   2. srun -n 3 ring_allreduce with KVPS_RING_PEERS: every rank holds the exact sum;
#   3. srun -n 5 hello_ps with KVPS_SERVERS (2) and KVPS_NUM_WORKERS=3, and 4. srun -n 3
#      hello_ring with KVPS_RING_PEERS: the known weights on every worker, and the job ends by
#      itself (tests/clean_finish.sh): exit 0 within 30 s (a hang check; the wall time and the
#      time from the last result line to srun's exit are printed), both servers back from
#      kvps_server_run by themselves, no process saying "lost";
#   4b. the same two with only MASTER_ADDR and MASTER_PORT (and KVPS_NUM_SERVERS=2 for hello_ps):
#      the processes meet at rank 0's address (kvps_launch.h);
#   5. srun -n 4 fmnist --mode bsp with KVPS_SERVERS (2) and KVPS_NUM_WORKERS=2: one epoch of
#      softmax regression learns (test accuracy > 0.75) on 2 servers and 2 workers;
#   6. srun -n 2 fmnist --mode allreduce with KVPS_RING_PEERS (2 ranks, no server).
# 5 and 6 are skipped without Debian's dataset-fashion-mnist. Daemons and files are removed on
# exit, on failure and on Ctrl-C. Ends with "N passed, N failed"; exits 77 (skipped) where
# Slurm is missing and cannot be installed here (installs it with apt-get when root).
set -u
cd "$(dirname "$0")/.." || exit 1
B=${1:-build}
PKGS="slurmctld slurmd slurm-client munge"
pass=0 fail=0 skipped=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
skip_all() { echo "skipped: $1"; echo "0 passed, 0 failed, 1 skipped"; exit 77; }
. tests/clean_finish.sh # timed, check_finish
result() {
    if [ "$skipped" -gt 0 ]; then echo "$pass passed, $fail failed, $skipped skipped"; else echo "$pass passed, $fail failed"; fi
    [ "$fail" -eq 0 ]
}

# ---- Slurm and munge, installed when missing --------------------------------------------------
have_slurm() {
    for c in munged mungekey slurmctld slurmd srun sinfo scontrol scancel; do
        command -v $c >/dev/null 2>&1 || [ -x /usr/sbin/$c ] || return 1
    done
}
export PATH="$PATH:/usr/sbin:/sbin"
if ! have_slurm; then
    line="apt-get install -y --no-install-recommends $PKGS"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing Slurm: $line"
        export DEBIAN_FRONTEND=noninteractive
        # the packages' scripts may try to start the services: none of that is used here
        timeout 600 $line >/dev/null 2>&1 ||
            { timeout 300 apt-get update >/dev/null 2>&1 && timeout 600 $line >/dev/null 2>&1; }
    fi
    have_slurm || { echo "Slurm is not installed; as root: $line" >&2; skip_all "no Slurm"; }
fi
for b in ring_allreduce fmnist hello_ps hello_ring; do
    [ -x "$B/$b" ] || { echo "build $B/$b first (make $B/$b)" >&2; exit 1; }
done
have_data=0
[ -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ] && have_data=1

# ---- the cluster ------------------------------------------------------------------------------
work=$(mktemp -d /tmp/kvps-slurm.XXXXXX) || exit 1
chmod 700 "$work"
pids=() srun_pid=""
ours() { # the pids of processes whose environment names this run's slurm.conf (job steps)
    local f
    for f in /proc/[0-9]*/environ; do
        tr '\0' '\n' 2>/dev/null <"$f" | grep -qxF "SLURM_CONF=$work/slurm.conf" && { f=${f#/proc/}; echo "${f%/environ}"; }
    done
}
cleanup() {
    # a running srun and the jobs first (their steps run in slurmstepd processes of their own),
    # then the daemons we started, then any step slurmd left behind
    [ -n "$srun_pid" ] && kill -TERM "$srun_pid" 2>/dev/null
    if [ -f "$work/slurm.conf" ] && [ ${#pids[@]} -gt 0 ]; then
        export SLURM_CONF="$work/slurm.conf"
        timeout 10 scancel --quiet --user="$(id -un)" 2>/dev/null
        for _ in $(seq 30); do
            [ -z "$(timeout 5 squeue -h 2>/dev/null)" ] && break
            sleep 0.5
        done
    fi
    for f in "$work"/slurmd.pid "$work"/slurmctld.pid "$work"/munge/munged.pid; do
        [ -s "$f" ] && pids+=("$(cat "$f")")
    done
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null; done
    for _ in $(seq 50); do
        alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break
        sleep 0.1
    done
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
    for p in $(ours); do [ "$p" != $$ ] && kill -KILL "$p" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick_ports() { # N free local ports from 20000-32767 (nothing listening there now)
    local n=$1 p=$((20000 + RANDOM % 12000)) out=""
    while [ "$n" -gt 0 ]; do
        p=$((p >= 32767 ? 20000 : p + 1))
        port_free $p || continue
        out="$out $p"
        n=$((n - 1))
    done
    echo $out
}
endpoints() { local e=""; for p in "$@"; do e="$e${e:+,}tcp://127.0.0.1:$p"; done; echo "$e"; }
logs() { # the daemons' logs, for a failure
    for f in munged.log slurmctld.log slurmd.log; do
        [ -s "$work/$f" ] && { echo "  --- $f (last lines) ---"; tail -n 15 "$work/$f" | sed 's/^/  /'; }
    done
}

node=$(hostname -s 2>/dev/null || hostname)
user=$(id -un)
read -r ctld_port slurmd_port <<<"$(pick_ports 2)"
mkdir -p "$work/munge" "$work/state" "$work/spool"
chmod 700 "$work/munge"
# the node claims 8 CPUs whatever it has (config_overrides): srun -n 5 on a 2-core machine, as
# the README runs it, without oversubscription flags
cat >"$work/slurm.conf" <<EOF
ClusterName=kvpscheck
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$work/munge/munge.socket
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
# no log files: in the foreground (-D) the daemons log to stderr, into $work/*.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/linear
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
InactiveLimit=0
NodeName=$node NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=check Nodes=$node Default=YES MaxTime=10 State=UP
EOF
export SLURM_CONF="$work/slurm.conf"

up=1
if ! timeout 20 mungekey --create --keyfile="$work/munge/munge.key" >/dev/null 2>&1 ||
   ! chmod 600 "$work/munge/munge.key"; then
    echo "  mungekey could not make a key"; up=0
fi
if [ $up = 1 ]; then
    # each daemon in a session of its own: a Ctrl-C here reaches this script, which stops them
    setsid munged --foreground --force --key-file="$work/munge/munge.key" --socket="$work/munge/munge.socket" \
        --pid-file="$work/munge/munged.pid" --seed-file="$work/munge/munge.seed" --log-file="$work/munged.log" \
        >>"$work/munged.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do [ -S "$work/munge/munge.socket" ] && break; sleep 0.1; done
    [ -S "$work/munge/munge.socket" ] || { echo "  munged did not start"; up=0; }
fi
if [ $up = 1 ]; then
    setsid slurmctld -D -i -f "$SLURM_CONF" >>"$work/slurmctld.log" 2>&1 &
    pids+=($!)
    setsid slurmd -D -N "$node" -f "$SLURM_CONF" >>"$work/slurmd.log" 2>&1 &
    pids+=($!)
    state=""
    for _ in $(seq 120); do # up to 60 s
        state=$(timeout 5 sinfo -h -N -n "$node" -o %t 2>/dev/null | head -n 1)
        [ "$state" = idle ] && break
        sleep 0.5
    done
    [ "$state" = idle ] || { echo "  node state '${state:-none}' after 60 s, not idle"; up=0; }
fi
if [ $up = 1 ]; then
    ok "slurm cluster up (node $node idle, ports $ctld_port/$slurmd_port)"
else
    bad "slurm cluster up"; logs; result; exit
fi

# ---- srun ------------------------------------------------------------------------------------
# srun_wait: waits for the srun just started in the background (so that a Ctrl-C runs this
# script's trap at once, instead of going to srun), puts its output in $out, returns its status
srun_wait() {
    srun_pid=$!
    wait $srun_pid
    local rc=$?
    srun_pid=""
    out=$(cat "$work/srun.out")
    return $rc
}

# ring_allreduce: rank r binds entry r of KVPS_RING_PEERS
(export KVPS_RING_PEERS=$(endpoints $(pick_ports 3)) && exec timeout 120 srun -n 3 "$B/ring_allreduce") \
    </dev/null >"$work/srun.out" 2>&1 &
srun_wait
rc=$?
missing=""
for r in 0 1 2; do
    grep -qxF "rank $r of 3: all-reduce of 1000000 floats: ok (x[0] = 6, x[999999] = 48; expected 6 and 48)" <<<"$out" ||
        missing="$missing $r"
done
if [ $rc = 0 ] && [ -z "$missing" ]; then
    ok "srun -n 3 ring_allreduce: every rank holds the exact sum"
else
    bad "srun -n 3 ring_allreduce: exit $rc, no exact-sum line from rank(s)${missing:- none}"
    echo "$out" | tail -n 30 | sed 's/^/  /'; logs
fi

# ---- the starting points: each job ends by itself (srun passes its environment on) ----------
timed 30 env KVPS_SERVERS="$(endpoints $(pick_ports 2))" KVPS_NUM_WORKERS=3 srun -n 5 "$B/hello_ps"
check_finish "srun -n 5 hello_ps (2 servers, 3 workers)" 3 2
[ "$rc" = 0 ] || logs
timed 30 env KVPS_RING_PEERS="$(endpoints $(pick_ports 3))" srun -n 3 "$B/hello_ring"
check_finish "srun -n 3 hello_ring" 3 0
[ "$rc" = 0 ] || logs
# one rendezvous address, no list of endpoints (kvps_launch.h)
timed 30 env MASTER_ADDR=127.0.0.1 MASTER_PORT=$(pick_ports 1) srun -n 4 "$B/hello_ring"
check_finish "srun -n 4 hello_ring with MASTER_ADDR/MASTER_PORT alone" 4 0
[ "$rc" = 0 ] || logs
timed 30 env MASTER_ADDR=127.0.0.1 MASTER_PORT=$(pick_ports 1) KVPS_NUM_SERVERS=2 srun -n 5 "$B/hello_ps"
check_finish "srun -n 5 hello_ps with MASTER_ADDR/MASTER_PORT and KVPS_NUM_SERVERS=2" 3 2
[ "$rc" = 0 ] || logs

# ---- fmnist: the epoch line "    1  loss train_acc test_acc samples/s net_MB push_KB time_s" ----
check_fmnist() { # NAME RC OUT MODE HEADER
    local name=$1 rc=$2 out=$3 mode=$4 header=$5 acc
    acc=$(awk '/^    1 / && NF == 8 { print $4; exit }' <<<"$out")
    if [ "$rc" = 0 ] && [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a > 0.75) }' &&
       grep -qF "$header" <<<"$out" && grep -q "^  softmax .* $mode " <<<"$out"; then
        ok "$name: test accuracy $acc after one epoch"
    else
        bad "$name: exit $rc, test accuracy '${acc:-none}' (want > 0.75), header '$header' $(grep -qF "$header" <<<"$out" || echo missing)"
        echo "$out" | tail -n 30 | sed 's/^/  /'; logs
    fi
}

if [ $have_data = 1 ]; then
    # ranks 0 and 1 serve, 2 and 3 work
    (export KVPS_SERVERS=$(endpoints $(pick_ports 2)) KVPS_NUM_WORKERS=2 &&
     exec timeout 150 srun -n 4 "$B/fmnist" --model softmax --epochs 1 --mode bsp --timeout 120) \
        </dev/null >"$work/srun.out" 2>&1 &
    srun_wait
    check_fmnist "srun -n 4 fmnist --mode bsp (2 servers, 2 workers)" $? "$out" bsp "bsp, 2 servers, 2 workers"

    (export KVPS_RING_PEERS=$(endpoints $(pick_ports 2)) &&
     exec timeout 150 srun -n 2 "$B/fmnist" --model softmax --epochs 1 --mode allreduce --timeout 120) \
        </dev/null >"$work/srun.out" 2>&1 &
    srun_wait
    check_fmnist "srun -n 2 fmnist --mode allreduce (2 ranks)" $? "$out" allreduce "allreduce (ring, no server), 2 workers"
else
    echo "skip fmnist under srun: no dataset-fashion-mnist"
    skipped=$((skipped + 2))
fi

result
