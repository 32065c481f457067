#!/usr/bin/env bash
# bench/ethernet.sh - the design notes' claims about synchronisation, measured over Ethernet.
#
# usage: bench/ethernet.sh [--rate 1gbit|10gbit|RATE] [--hosts N] [--host-file F] [--quick]
#                          [--bytes B] [--tensors K] [--steps N] [--only 1,2,...] [--out DIR]
#                          [--max-slice F] [--failover-ms MS]
#                          [--remote-dir D]
#
# Emulated (default; root): one network namespace per host, each joined to a bridge by a veth
# pair, addresses 198.18.0.1.., and on both ends of every veth
#     tc qdisc add dev IFACE root tbf rate RATE burst max(128kb, RATE x 2 ms) latency 50ms
# (netem is not available here). Everything is removed on exit, on failure and on Ctrl-C.
# With --host-file F it runs the same peers over ssh on real machines instead: one host a line,
# "SSH_TARGET [DATA_ADDRESS]" ('#' starts a comment), the repository built at --remote-dir (default:
# this directory) on every host, passwordless ssh; --rate is then the nominal link speed the
# criteria are judged against, and no shaping is done.
#
# Peers: build/ps_peer (one kvps server or worker, BSP push+pull of a model of B bytes) and
# build/ring_peer (kvps_ring all-reduce); `ps_peer --link-*` measures the raw TCP goodput B_link
# of one link first. T = S / B_link is one model's transfer over one link; every prediction is
# a multiple of T. Each figure is the median over --steps timed steps (after warm-up steps) of
# the slowest worker's step; min..max are shown beside it.
#
# Claims (the design notes, ../shared/seeds), each a table with PASS/MISS:
#   1. one server (a host of its own), m = 1, 2, 4, 8 workers: sync time grows linearly with m
#      (linear fit R^2 >= 0.98 and time/m flat within 1.25x; ideal 2 m T).
#   2. n = m sharded servers, a server and a worker on each of 2, 4, 8 hosts: sync time flat
#      within 1.25x (also judged against the ideal 2 (n-1)/n T, see the output).
#   3. ring all-reduce over 2, 4, 8 ranks: time flat within 1.25x, busbw >= 90% of the link.
#   4. the notes' single-GPU / CPU / split aggregation thought experiment (60 / 80 / 15 ms) with
#      hosts for GPUs and the measured link for PCIe.
#   5. FP16 and top-k 1% cut sync time in proportion to bytes (1 server, 4 workers).
#   6. (issue 18; not in the default run: --only 6) replicated shards: claim 2's layout on 4 hosts
#      (4 shards, a server and a worker on each host) with r = 1 and r = 2 replicas per shard, the
#      backup of shard i on host i+1 mod 4, and r = 2 with the workers' .read_local (r2l: each reads
#      its host's backup): r = 2 within 1.15x of r = 1; then r2l with shard 0's primary SIGKILLed in
#      the middle of the timed steps: the time from the kill to training resuming (workers move to
#      the backup after ps_peer --failover-ms, default 1000).
# Results: DIR/ethernet_<rate>_claimN.csv, _steps.csv (every timed step), _ring_steps.csv,
# _summary.txt (what was printed), _claim6_stamps.csv (claim 6: every timed step with its end on the
# worker's wall clock, and the kill's time). bench/plot.sh turns claims 1-5 into PNGs.
#
# Model size: --bytes, default 16 MiB x RATE / 1 Gbit/s (between 1 and 64 MiB, a multiple of
# 64 KiB), so that T is about 140 ms whatever the rate. Claims 1, 4 and 5 push and pull the model
# as one tensor: all of a step's pushes, then all its pulls, as the notes reason. Claim 2 (and a
# second half of claim 4) also cut it into --tensors K (default 16, as a model has layers), all
# in flight at once, so that one tensor's pull overlaps the next one's push: with one tensor,
# sharded servers on full-duplex links fall into taking turns on each link direction. Steps: 7 timed after 2 warm-up (--quick:
# 3 after 1, at most 4 hosts). The default run takes 2-4 minutes.
# --max-slice F (floats, passed to ps_peer's workers) defaults to 268435456 here: a tensor is cut
# into at most one slice per server, so that a step is the notes' "all pushes, then all pulls".
# kvps's own default (262144 = 1 MiB) cuts a 16 MiB model into 1 MiB slices that go out one
# message each, so one slice's pull overlaps the next one's push and a one-server step takes
# about 1.3 T instead of 2 T: faster than the notes' arithmetic, which the claims then miss.
# Pass --max-slice 262144 to measure that.
set -u
cd "$(dirname "$0")/.." || exit 2

usage() {
    sed -n '4,6p' "$0" | sed 's/^# //' >&2
    exit 2
}

rate=1gbit hosts=8 host_file="" quick=0 bytes="" steps="" tensors=16 only="1,2,3,4,5" outdir=bench/results remote_dir=$PWD
max_slice=268435456 failover_ms=1000
while [ $# -gt 0 ]; do
    case "$1" in
        --rate) rate=${2:?}; shift 2;;
        --hosts) hosts=${2:?}; shift 2;;
        --host-file) host_file=${2:?}; shift 2;;
        --quick) quick=1; shift;;
        --bytes) bytes=${2:?}; shift 2;;
        --tensors) tensors=${2:?}; shift 2;;
        --max-slice) max_slice=${2:?}; shift 2;;
        --failover-ms) failover_ms=${2:?}; shift 2;;
        --steps) steps=${2:?}; shift 2;;
        --only) only=${2:?}; shift 2;;
        --out) outdir=${2:?}; shift 2;;
        --remote-dir) remote_dir=${2:?}; shift 2;;
        -h|--help) usage;;
        *) echo "ethernet: unknown option '$1'" >&2; usage;;
    esac
done

die() { echo "ethernet: $*" >&2; exit 2; }

# tc's units: bit kbit mbit gbit tbit (SI), bps kbps mbps gbps (bytes per second).
rate_bps=$(awk -v r="$rate" 'BEGIN {
    n = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u)
    m["bit"] = 1; m[""] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
    m["bps"] = 8; m["kbps"] = 8e3; m["mbps"] = 8e6; m["gbps"] = 8e9
    if (!(u in m) || n <= 0) { print "bad"; exit }
    printf "%.0f\n", n * m[u] }')
[ "$rate_bps" != bad ] || die "--rate '$rate': want a tc rate such as 1gbit, 200mbit, 10gbit"
case "$hosts" in ''|*[!0-9]*) die "--hosts wants a number";; esac
[ "$hosts" -ge 2 ] || die "--hosts must be at least 2"
[ "$quick" = 1 ] && [ "$hosts" -gt 4 ] && hosts=4
if [ -z "$steps" ]; then if [ "$quick" = 1 ]; then steps=3; else steps=7; fi; fi
warmup=2; [ "$quick" = 1 ] && warmup=1
if [ -z "$bytes" ]; then
    bytes=$(awk -v b="$rate_bps" 'BEGIN { s = 16777216 * b / 1e9; if (s < 1048576) s = 1048576;
        if (s > 67108864) s = 67108864; printf "%d\n", int(s / 65536 + 0.5) * 65536 }')
fi
case "$bytes" in ''|*[!0-9]*) die "--bytes wants a number";; esac
case "$tensors" in ''|*[!0-9]*) die "--tensors wants a number";; esac
case "$failover_ms" in ''|*[!0-9]*) die "--failover-ms wants a number";; esac
[ "$tensors" -ge 1 ] && [ "$tensors" -le 64 ] || die "--tensors: 1 to 64"

ps_bin=build/ps_peer ring_bin=build/ring_peer
for b in "$ps_bin" "$ring_bin"; do [ -x "$b" ] || die "build $b first: make $b"; done

# ---- hosts ---------------------------------------------------------------------------------
tag=kvb$$           # names of everything this run creates
PIDS=()             # every process this run started (local pids: ip netns exec / ssh)
SSH=() ADDR=()
if [ -n "$host_file" ]; then
    [ -r "$host_file" ] || die "cannot read host file $host_file"
    while read -r target addr _; do
        case "$target" in ''|'#'*) continue;; esac
        SSH+=("$target")
        if [ -z "${addr:-}" ]; then
            addr=${target#*@}
            addr=$(getent ahostsv4 "$addr" | awk 'NR == 1 { print $1 }')
            [ -n "$addr" ] || die "cannot resolve ${target#*@}: give its data address as a second column"
        fi
        ADDR+=("$addr")
    done <"$host_file"
    nh=${#SSH[@]}
    [ "$nh" -ge 2 ] || die "the host file names fewer than 2 hosts"
    hosts=$(( nh - 1 < hosts ? nh - 1 : hosts )); [ "$hosts" -ge 2 ] || hosts=2
    rtag=real-$rate
else
    [ "$(id -u)" = 0 ] || die "needs root (ip netns, tc); or use --host-file"
    nh=$(( hosts + 1 > 5 ? hosts + 1 : 5 ))  # claim 1: a server host + m workers; claim 4: 5 hosts
    for i in $(seq 0 $((nh - 1))); do ADDR+=("198.18.0.$((i + 1))"); done
    rtag=$rate
fi

cleanup() {
    local p
    [ -n "${work:-}" ] && rm -rf "$work"
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    if [ -n "$host_file" ]; then
        for i in "${!SSH[@]}"; do
            ssh -n -o BatchMode=yes -o ConnectTimeout=5 "${SSH[i]}" \
                "for f in /tmp/kvpsbench.$tag.*.pid; do [ -f \"\$f\" ] && kill \$(cat \"\$f\") 2>/dev/null; rm -f \"\$f\"; done" \
                </dev/null >/dev/null 2>&1 &
        done
        wait
        return
    fi
    sleep 0.3
    for i in $(seq 0 $((nh - 1))); do
        # anything still in our namespaces was started by this run
        for p in $(ip netns pids ${tag}h$i 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
        ip netns del ${tag}h$i 2>/dev/null
        ip link del ${tag}v$i 2>/dev/null
    done
    ip link del ${tag}br 2>/dev/null
    true
}
trap cleanup EXIT
trap 'echo "ethernet: interrupted" >&2; exit 130' INT
trap 'exit 143' TERM

burst=$(awk -v b="$rate_bps" 'BEGIN { k = int(b * 0.002 / 8 / 1024); if (k < 128) k = 128; printf "%dkb\n", k }')
if [ -z "$host_file" ]; then
    ip link add ${tag}br type bridge && ip link set ${tag}br up || die "cannot create a bridge"
    for i in $(seq 0 $((nh - 1))); do
        ns=${tag}h$i
        ip netns add $ns &&
        ip link add ${tag}v$i type veth peer name ${tag}p$i &&
        ip link set ${tag}p$i netns $ns &&
        ip link set ${tag}v$i master ${tag}br up &&
        ip -n $ns addr add ${ADDR[i]}/24 dev ${tag}p$i &&
        ip -n $ns link set ${tag}p$i up &&
        ip -n $ns link set lo up &&
        tc qdisc add dev ${tag}v$i root tbf rate $rate burst $burst latency 50ms &&
        ip netns exec $ns tc qdisc add dev ${tag}p$i root tbf rate $rate burst $burst latency 50ms ||
        die "cannot set up host $i"
    done
fi

mkdir -p "$outdir" || die "cannot create $outdir"
work=$(mktemp -d /tmp/kvps-ethernet.XXXXXX) || die "mktemp"
pre="$outdir/ethernet_$rtag"
summary=${pre}_summary.txt steps_csv=${pre}_steps.csv ring_csv=${pre}_ring_steps.csv stamps_csv=${pre}_claim6_stamps.csv
: >"$summary"
echo "tag,rank,step,sync_us,push_wire_bytes,pull_wire_bytes,push_raw_bytes,pull_raw_bytes" >"$steps_csv"
echo "tag,ranks,bytes,iter,time_us" >"$ring_csv"
case ",$only," in *,6,*) echo "tag,rank,step,sync_us,push_wire_bytes,pull_wire_bytes,push_raw_bytes,pull_raw_bytes,end_unix_us,kill_unix_us" >"$stamps_csv";; esac
say() { printf "$@" | tee -a "$summary"; }

# start_on HOST OUT ERR CMD...: runs CMD on HOST in the background (at most 300 s).
start_on() {
    local h=$1 o=$2 e=$3; shift 3
    if [ -z "$host_file" ]; then
        ip netns exec ${tag}h$h timeout 300 "$@" >"$o" 2>"$e" &
    else
        NREMOTE=$(( ${NREMOTE:-0} + 1 ))
        ssh -n -o BatchMode=yes "${SSH[h]}" "cd $(printf %q "$remote_dir") && echo \$\$ >/tmp/kvpsbench.$tag.$NREMOTE.pid && exec timeout 300 $(printf '%q ' "$@")" >"$o" 2>"$e" &
    fi
    LAST_PID=$!
    PIDS+=("$!")
}

# reap SECONDS PID...: gives each process until the deadline, then stops it.
reap() {
    local end=$((SECONDS + $1)) p; shift
    for p in "$@"; do
        while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.1; done
        kill -TERM "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
}

cpu_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9; exit }' /proc/stat; }
# cpu_mark; ...; cpu_busy: "OURS/ALL": percent of all CPUs used by the processes this run started
# and waited for (bash's times: user + sys of reaped children), and busy in all (/proc/stat).
# Over ssh: "-" (the hosts are other machines).
cpu_mark() {
    times >"$work/times"
    CM_CH=$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] } print t }' "$work/times")
    CM_T=$(cpu_ticks) CM_W=$(date +%s.%N)
}
cpu_busy() {
    [ -n "$host_file" ] && { echo "-"; return; }
    local ch0=$CM_CH t0=$CM_T w0=$CM_W
    cpu_mark
    set -- $t0 $CM_T
    awk -v b0="$1" -v t0="$2" -v b1="$3" -v t1="$4" -v c0="$ch0" -v c1="$CM_CH" -v w0="$w0" -v w1="$CM_W" -v n="$(nproc)" \
        'BEGIN { printf "%.0f/%.0f\n", (w1 > w0 ? 100 * (c1 - c0) / ((w1 - w0) * n) : 0), (t1 > t0 ? 100 * (b1 - b0) / (t1 - t0) : 0) }'
}

failed() { # what, files...: shows why a run failed
    local what=$1 f; shift
    say "  !! %s failed; its processes said:\n" "$what"
    for f in "$@"; do [ -s "$f" ] && sed 's/^/     /' "$f" | tail -5 | tee -a "$summary"; done
    FAILS=$(( ${FAILS:-0} + 1 ))
}

# run_ps TAG "SERVER HOSTS" "WORKER HOSTS" [ps_peer options]: one BSP job; sets MED LO HI (ms of
# the slowest worker per step: median, min, max), WIRE RAW (one worker's bytes per step), CPU.
declare -A R_MED R_LO R_HI R_WIRE R_RAW R_CPU
run_ps() {
    local t=$1 sh=($2) wh=($3) servers="" k spids=() wpids=() rc=0 c0 errs=(); shift 3
    for k in "${sh[@]}"; do servers+="${servers:+,}tcp://${ADDR[k]}:5555"; done
    local args=(--bytes "$bytes" --tensors 1 --steps "$steps" --warmup "$warmup" --max-slice "$max_slice" --tag "$t" "$@")
    cpu_mark
    for k in "${!sh[@]}"; do
        start_on "${sh[k]}" "$work/$t.s$k.out" "$work/$t.s$k.err" env KVPS_ROLE=server KVPS_RANK=$k \
            KVPS_SERVERS="$servers" KVPS_NUM_WORKERS=${#wh[@]} "$ps_bin" "${args[@]}"
        spids+=("$LAST_PID"); errs+=("$work/$t.s$k.err")
    done
    for k in "${!wh[@]}"; do
        start_on "${wh[k]}" "$work/$t.w$k.out" "$work/$t.w$k.err" env KVPS_ROLE=worker KVPS_RANK=$k \
            KVPS_SERVERS="$servers" KVPS_NUM_WORKERS=${#wh[@]} "$ps_bin" "${args[@]}"
        wpids+=("$LAST_PID"); errs+=("$work/$t.w$k.err")
    done
    for k in "${wpids[@]}"; do wait "$k" || rc=1; done
    reap 15 "${spids[@]}"   # servers leave by themselves a second after the last pull
    cpu_busy >"$work/cpu"; R_CPU[$t]=$(cat "$work/cpu")
    cat "$work/$t".w*.out >>"$steps_csv"
    [ $rc = 0 ] || { failed "$t" "${errs[@]}"; R_MED[$t]=nan; return 1; }
    read -r R_MED[$t] R_LO[$t] R_HI[$t] R_WIRE[$t] R_RAW[$t] < <(step_stats "$t")
}

# step_stats TAG: "MED LO HI WIRE RAW" of TAG's lines in the steps CSV (ms of the slowest worker per
# step: median, min, max; worker 0's bytes in its first step)
step_stats() {
    awk -F, -v t="$1" '
        $1 == t { s = $3; if (!(s in mx) || $4 + 0 > mx[s]) mx[s] = $4 + 0
                  if ($2 == 0 && $3 == 0) { wire = $5 + $6; raw = $7 + $8 } }
        END { n = 0; for (s in mx) v[++n] = mx[s] / 1000
              for (i = 2; i <= n; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
              med = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
              printf "%.1f %.1f %.1f %d %d\n", med, v[1], v[n], wire, raw }' "$steps_csv"
}

# run_rep TAG N R KILL [ps_peer options]: claim 6's job: N shards and N workers on hosts 0..N-1,
# each shard a chain of R servers, replica j of shard i on host (i + j) mod N (port 5555 + j).
# KILL = 1: once worker 0 has finished half the timed steps, SIGKILL shard 0's primary (sets
# KILL_US, the kill on the wall clock in microseconds). Workers print --stamps 1 (the step's end);
# the steps CSV gets the usual 8 columns, $stamps_csv every column. Sets R_* as run_ps does.
run_rep() {
    local t=$1 n=$2 r=$3 kill=$4 servers="" i j e k spids=() wpids=() rc=0 errs=() victim="" vremote="" half; shift 4
    for i in $(seq 0 $((n - 1))); do
        e=""
        for j in $(seq 0 $((r - 1))); do e+="${e:+|}tcp://${ADDR[(i + j) % n]}:$((5555 + j))"; done
        servers+="${servers:+,}$e"
    done
    local args=(--bytes "$bytes" --tensors 1 --steps "$steps" --warmup "$warmup" --max-slice "$max_slice" --tag "$t" --stamps 1 "$@")
    KILL_US=""
    cpu_mark
    for i in $(seq 0 $((n - 1))); do
        for j in $(seq 0 $((r - 1))); do
            start_on "$(( (i + j) % n ))" "$work/$t.s$i.$j.out" "$work/$t.s$i.$j.err" env KVPS_ROLE=server KVPS_RANK=$i \
                KVPS_REPLICA=$j KVPS_SERVERS="$servers" KVPS_NUM_WORKERS=$n "$ps_bin" "${args[@]}"
            spids+=("$LAST_PID"); errs+=("$work/$t.s$i.$j.err")
            [ "$i$j" = 00 ] && victim=$LAST_PID vremote=${NREMOTE:-}
        done
    done
    for k in $(seq 0 $((n - 1))); do
        start_on "$k" "$work/$t.w$k.out" "$work/$t.w$k.err" env KVPS_ROLE=worker KVPS_RANK=$k \
            KVPS_SERVERS="$servers" KVPS_NUM_WORKERS=$n KVPS_READ_LOCAL="${REP_READ_LOCAL:-0}" "$ps_bin" "${args[@]}"
        wpids+=("$LAST_PID"); errs+=("$work/$t.w$k.err")
    done
    if [ "$kill" = 1 ]; then
        half=$(( steps / 2 > 0 ? steps / 2 : 1 ))
        local end=$((SECONDS + 200))
        while [ "$(wc -l <"$work/$t.w0.out")" -lt "$half" ] && kill -0 "${wpids[0]}" 2>/dev/null && [ $SECONDS -lt $end ]; do
            sleep 0.01
        done
        disown "$victim"  # (no note from bash that it was killed; reap still waits for it)
        if [ -z "$host_file" ]; then
            # the ps_peer under `ip netns exec ... timeout` (whose pid start_on gave)
            KILL_US=$(( $(date +%s%N) / 1000 ))
            pkill -KILL -P "$victim"
        else
            KILL_US=$(ssh -n -o BatchMode=yes "${SSH[0]}" \
                "t=\$(date +%s%N); pkill -KILL -P \$(cat /tmp/kvpsbench.$tag.$vremote.pid) && echo \$((t / 1000))" </dev/null)
        fi
        [ -n "$KILL_US" ] && say "  # %s: SIGKILL to shard 0's primary (host 0) after %s timed steps of worker 0\n" "$t" "$half"
    fi
    for k in "${wpids[@]}"; do wait "$k" || rc=1; done
    reap 15 "${spids[@]}"
    cpu_busy >"$work/cpu"; R_CPU[$t]=$(cat "$work/cpu")
    cat "$work/$t".w*.out | cut -d, -f1-8 >>"$steps_csv"
    cat "$work/$t".w*.out | awk -F, -v k="${KILL_US:-}" '{ print $0 "," k }' >>"$stamps_csv"
    [ $rc = 0 ] || { failed "$t" "${errs[@]}"; R_MED[$t]=nan; return 1; }
    read -r R_MED[$t] R_LO[$t] R_HI[$t] R_WIRE[$t] R_RAW[$t] < <(step_stats "$t")
}

# run_ring TAG N: ring all-reduce of $bytes over hosts 0..N-1; sets the same R_* (ms, rank 0).
run_ring() {
    local t=$1 n=$2 k peers="" pids=() rc=0 c0 errs=()
    for k in $(seq 0 $((n - 1))); do peers+="${peers:+,}tcp://${ADDR[k]}:6000"; done
    cpu_mark
    for k in $(seq 0 $((n - 1))); do
        start_on "$k" "$work/$t.r$k.out" "$work/$t.r$k.err" env KVPS_RANK=$k KVPS_SIZE=$n KVPS_RING_PEERS="$peers" \
            "$ring_bin" --sizes "$bytes" --iters "$steps" --csv "$t" --timeout 120000
        pids+=("$LAST_PID"); errs+=("$work/$t.r$k.err")
    done
    for k in "${pids[@]}"; do wait "$k" || rc=1; done
    cpu_busy >"$work/cpu"; R_CPU[$t]=$(cat "$work/cpu")
    cat "$work/$t".r0.out >>"$ring_csv"
    [ $rc = 0 ] || { failed "$t" "${errs[@]}"; R_MED[$t]=nan; return 1; }
    read -r R_MED[$t] R_LO[$t] R_HI[$t] < <(awk -F, -v t="$t" '
        $1 == t { v[++n] = $5 / 1000 }
        END { for (i = 2; i <= n; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
              med = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
              printf "%.1f %.1f %.1f\n", med, v[1], v[n] }' "$ring_csv")
}

# The link: raw TCP goodput host 0 -> host 1, median of 3 transfers of half a second each.
measure_link() {
    local lb r g=() p
    lb=$(awk -v b="$rate_bps" 'BEGIN { s = b * 0.5 / 8; if (s < 4194304) s = 4194304; printf "%d\n", s }')
    for r in 1 2 3; do
        start_on 1 "$work/link$r.out" "$work/link$r.err" "$ps_bin" --link-recv 7000 --bytes "$lb"; p=$LAST_PID
        start_on 0 /dev/null "$work/link$r.serr" "$ps_bin" --link-send "${ADDR[1]}:7000" --bytes "$lb"
        wait "$LAST_PID"; wait "$p"
        g+=("$(awk '{ print $6 }' "$work/link$r.out")")
    done
    printf "%s\n" "${g[@]}" | sort -g | awk 'NF { v[++n] = $1 } END { if (n) print v[int((n + 1) / 2)]; else print "" }'
}

want() { case ",$only," in *",$1,"*) return 0;; esac; return 1; }
upto() { local lim=$1 x; shift; for x in "$@"; do [ "$x" -le "$lim" ] && printf "%s " "$x"; done; }
pf() { awk "BEGIN { printf $1 }"; }  # pf '"%.2f", 1/3'
verdict() { if [ "$1" = 1 ]; then echo PASS; else echo MISS; fi; }
judge() { # VALUE <=|>= LIMIT: PASS or MISS ("n/a" without a value)
    case "$1" in ''|nan) echo "n/a (not measured)"; return;; esac
    awk -v x="$1" -v op="$2" -v y="$3" 'BEGIN { ok = (op == "<=") ? (x <= y) : (x >= y); print (ok ? "PASS" : "MISS") }'
}

# ---- run -----------------------------------------------------------------------------------
T0=$SECONDS
mode="emulated: $nh network namespaces on a bridge, tbf $rate burst $burst latency 50ms on both ends of every veth"
[ -n "$host_file" ] && mode="real hosts from $host_file over ssh (no shaping; nominal link $rate)"
say "# bench/ethernet.sh --rate %s --hosts %s%s%s\n# %s\n" "$rate" "$hosts" "${host_file:+ --host-file $host_file}" \
    "$( [ $quick = 1 ] && echo ' --quick')" "$mode"
say "# model S = %s bytes (%.2f MiB) float32, %s timed steps after %s warm-up; max_slice %s floats; %s vCPUs here\n" \
    "$bytes" "$(pf "\"%.2f\", $bytes / 1048576")" "$steps" "$warmup" "$max_slice" "$(nproc)"
say "# cpu%% = OURS/ALL: share of the %s CPUs used by this run's processes / busy with anything (other work too)\n" "$(nproc)"

link=$(measure_link)
[ -n "$link" ] || die "the link test failed: $(cat "$work"/link*.err 2>/dev/null | head -3)"
T=$(pf "\"%.1f\", $bytes * 8 / ($link * 1e9) * 1000")
rate_g=$(pf "\"%.3f\", $rate_bps / 1e9")
say "# link: raw TCP goodput B = %s Gbit/s (one connection, one way; %.0f%% of the nominal %s Gbit/s)\n" \
    "$link" "$(pf "\"%f\", 100 * $link / $rate_g")" "$rate_g"
say "# T = S / B = %s ms: one model over one link. Times are medians over steps of the slowest worker [min..max].\n" "$T"
cpu_note() { # OURS/ALL -> a hint when the CPUs, not the link, may have been the limit
    case "$1" in */*) ;; *) return;; esac
    local ours=${1%/*} all=${1#*/}
    [ "$all" -ge 85 ] || return 0
    if [ "$ours" -ge 55 ]; then printf " (CPUs %s%% busy, %s%% ours: CPU-bound)" "$all" "$ours"
    else printf " (CPUs %s%% busy, mostly with other work)" "$all"; fi
}

# Claim 1 -----------------------------------------------------------------------------------
if want 1; then
    ms=$(upto "$hosts" 1 2 4 8)
    f=${pre}_claim1.csv
    echo "m,sync_ms,min_ms,max_ms,ms_per_m,ideal_ms,T_ms,cpu_pct_ours_all" >"$f"
    say "\n## Claim 1: one server, m workers - sync time grows linearly with m\n"
    say "# server alone on host 0, workers on hosts 1..m; BSP push+pull of S per step. Ideal: the server's\n"
    say "# link carries m x S in (push) then m x S out (pull): 2 m T.\n"
    say "%4s %10s %19s %9s %10s %10s %7s\n" m sync_ms "[min..max]" ms/m ideal_ms meas/ideal cpu%
    for m in $ms; do
        run_ps "c1_m$m" "0" "$(seq -s' ' 1 "$m")" || continue
        t=${R_MED[c1_m$m]}
        ideal=$(pf "\"%.1f\", 2 * $m * $T")
        say "%4s %10s %19s %9s %10s %10s %7s%s\n" "$m" "$t" "[${R_LO[c1_m$m]}..${R_HI[c1_m$m]}]" "$(pf "\"%.1f\", $t / $m")" \
            "$ideal" "$(pf "\"%.2f\", $t / $ideal")" "${R_CPU[c1_m$m]}" "$(cpu_note "${R_CPU[c1_m$m]}")"
        echo "$m,$t,${R_LO[c1_m$m]},${R_HI[c1_m$m]},$(pf "\"%.1f\", $t / $m"),$ideal,$T,${R_CPU[c1_m$m]}" >>"$f"
    done
    read -r a b r2 flat < <(awk -F, 'NR > 1 { n++; x[n] = $1; y[n] = $2; sx += $1; sy += $2; r = $5
            if (n == 1 || r > hi) hi = r; if (n == 1 || r < lo) lo = r }
        END { if (n < 2) { print "nan nan nan nan"; exit }
              mx = sx / n; my = sy / n; for (i = 1; i <= n; i++) { sxy += (x[i] - mx) * (y[i] - my); sxx += (x[i] - mx) ^ 2; syy += (y[i] - my) ^ 2 }
              b = sxy / sxx; a = my - b * mx; for (i = 1; i <= n; i++) res += (y[i] - a - b * x[i]) ^ 2
              printf "%.1f %.1f %.4f %.2f\n", a, b, (syy > 0 ? 1 - res / syy : 0), hi / lo }' "$f")
    ok=$(awk -v r="$r2" -v f="$flat" 'BEGIN { print ((r >= 0.98 && f <= 1.25) ? 1 : 0) }')
    say "# fit: sync = %s ms + %s ms x m, R^2 = %s (ideal slope 2T = %s ms); time/m max/min = %sx\n" \
        "$a" "$b" "$r2" "$(pf "\"%.1f\", 2 * $T")" "$flat"
    [ "$r2" = nan ] && ok=nan
    say "claim 1: R^2 >= 0.98 and time/m within 1.25x: %s\n" "$(case $ok in nan) echo "n/a (not measured)";; *) verdict "$ok";; esac)"
fi

# Claim 2 -----------------------------------------------------------------------------------
if want 2; then
    f=${pre}_claim2.csv
    echo "n,sync_ms,min_ms,max_ms,ideal_ms,meas_over_ideal,T_ms,cpu_pct_ours_all,one_tensor_ms,one_min_ms,one_max_ms,one_over_ideal" >"$f"
    say "\n## Claim 2: n = m sharded servers - sync time per step stays flat\n"
    say "# a server and a worker on each of hosts 0..n-1, every tensor cut into n slices. Ideal: each link\n"
    say "# carries (n-1)/n S each way to push, the same to pull: 2 (n-1)/n T (T at n = 2, 1.75 T at 8).\n"
    say "# Left: the model as %s tensors (judged); right: the same bytes as one tensor.\n" "$tensors"
    say "%4s %10s %19s %10s %10s %7s | %12s %19s %10s\n" n sync_ms "[min..max]" ideal_ms meas/ideal cpu% 1tensor_ms "[min..max]" meas/ideal
    for n in $(upto "$hosts" 2 4 8); do
        hs=$(seq -s' ' 0 $((n - 1)))
        run_ps "c2_n$n" "$hs" "$hs" --tensors "$tensors" || continue
        run_ps "c2_one_n$n" "$hs" "$hs" || R_MED[c2_one_n$n]=nan R_LO[c2_one_n$n]=nan R_HI[c2_one_n$n]=nan
        t=${R_MED[c2_n$n]} o=${R_MED[c2_one_n$n]}
        ideal=$(pf "\"%.1f\", 2 * ($n - 1) / $n * $T")
        say "%4s %10s %19s %10s %10s %7s | %12s %19s %10s%s\n" "$n" "$t" "[${R_LO[c2_n$n]}..${R_HI[c2_n$n]}]" "$ideal" \
            "$(pf "\"%.2f\", $t / $ideal")" "${R_CPU[c2_n$n]}" "$o" "[${R_LO[c2_one_n$n]}..${R_HI[c2_one_n$n]}]" \
            "$(pf "\"%.2f\", $o / $ideal")" "$(cpu_note "${R_CPU[c2_n$n]}")"
        echo "$n,$t,${R_LO[c2_n$n]},${R_HI[c2_n$n]},$ideal,$(pf "\"%.3f\", $t / $ideal"),$T,${R_CPU[c2_n$n]},$o,${R_LO[c2_one_n$n]},${R_HI[c2_one_n$n]},$(pf "\"%.3f\", $o / $ideal")" >>"$f"
    done
    read -r lit norm < <(awk -F, 'NR > 1 { n++; if (n == 1 || $2 > h) h = $2; if (n == 1 || $2 < l) l = $2
            if (n == 1 || $6 > H) H = $6; if (n == 1 || $6 < L) L = $6 }
        END { if (n < 2) print "nan nan"; else printf "%.2f %.2f\n", h / l, H / L }' "$f")
    say "claim 2 as worded: sync time max/min = %sx <= 1.25x: %s\n" "$lit" "$(judge "$lit" "<=" 1.25)"
    say "claim 2 against the ideal: (sync / 2(n-1)/n T) max/min = %sx <= 1.25x: %s\n" "$norm" \
        "$(judge "$norm" "<=" 1.25)"
    say "# Even a perfect implementation moves 2(n-1)/n S per link, so time from 2 to 8 hosts grows 1.75x: the\n"
    say "# notes' 'flat' means bounded by 2T, not growing with n (one server: 2 n T). The second line tests that.\n"
    say "# One tensor: a server can reply only when every worker's slice is in, so push and pull cannot overlap;\n"
    say "# with a server and a worker per host the hosts drift into taking turns on each link direction (slower,\n"
    say "# and step times spread). Several tensors in flight keep both directions busy.\n"
fi

# Claim 3 -----------------------------------------------------------------------------------
if want 3; then
    f=${pre}_claim3.csv
    echo "n,time_ms,min_ms,max_ms,busbw_gbps,busbw_over_rate,ideal_ms,T_ms,cpu_pct_ours_all" >"$f"
    say "\n## Claim 3: ring all-reduce - time flat as ranks grow, busbw >= 90%% of the link\n"
    say "# one rank per host on hosts 0..n-1, kvps_ring_allreduce of S (float32 sum); busbw = S/t x 2(n-1)/n.\n"
    say "%4s %10s %19s %11s %12s %10s %10s %7s\n" n time_ms "[min..max]" busbw_Gbps busbw/rate ideal_ms meas/ideal cpu%
    for n in $(upto "$hosts" 2 4 8); do
        run_ring "c3_n$n" "$n" || continue
        t=${R_MED[c3_n$n]}
        bus=$(pf "\"%.3f\", $bytes * 8 / ($t / 1000) * 2 * ($n - 1) / $n / 1e9")
        ideal=$(pf "\"%.1f\", 2 * ($n - 1) / $n * $T")
        say "%4s %10s %19s %11s %12s %10s %10s %7s%s\n" "$n" "$t" "[${R_LO[c3_n$n]}..${R_HI[c3_n$n]}]" "$bus" \
            "$(pf "\"%.3f\", $bus / $rate_g")" "$ideal" "$(pf "\"%.2f\", $t / $ideal")" "${R_CPU[c3_n$n]}" "$(cpu_note "${R_CPU[c3_n$n]}")"
        echo "$n,$t,${R_LO[c3_n$n]},${R_HI[c3_n$n]},$bus,$(pf "\"%.3f\", $bus / $rate_g"),$ideal,$T,${R_CPU[c3_n$n]}" >>"$f"
    done
    read -r lit bflat bmin < <(awk -F, 'NR > 1 { n++; if (n == 1 || $2 > h) h = $2; if (n == 1 || $2 < l) l = $2
            if (n == 1 || $5 > H) H = $5; if (n == 1 || $5 < L) L = $5; if (n == 1 || $6 < m) m = $6 }
        END { if (n < 2) print "nan nan nan"; else printf "%.2f %.2f %.3f\n", h / l, H / L, m }' "$f")
    say "claim 3 as worded: time max/min = %sx <= 1.25x: %s\n" "$lit" "$(judge "$lit" "<=" 1.25)"
    say "claim 3 busbw (time against the ideal 2(n-1)/n T) max/min = %sx <= 1.25x: %s\n" "$bflat" \
        "$(judge "$bflat" "<=" 1.25)"
    say "claim 3 busbw >= 0.90 x %s Gbit/s at every n (lowest %s): %s\n" "$rate_g" "$bmin" \
        "$(judge "$bmin" ">=" 0.9)"
    say "# As for claim 2, a bandwidth-optimal ring takes 2(n-1)/n T: 1.75x more at 8 ranks than at 2, bounded by 2T.\n"
fi

# Claim 4 -----------------------------------------------------------------------------------
if want 4 && [ "$nh" -lt 5 ]; then
    say "\n## Claim 4: skipped: it needs 5 hosts, the host file names %s\n" "$nh"
elif want 4; then
    f=${pre}_claim4.csv
    echo "strategy,tensors,notes_ms,notes_T,pred_T,pred_ms,sync_ms,min_ms,max_ms,meas_over_pred,T_ms,cpu_pct_ours_all" >"$f"
    say "\n## Claim 4: the notes' thought experiment - aggregate on one GPU / on the CPU / split\n"
    say "# Mapping: the notes' 4 GPUs behind a PCIe switch are hosts 0-3 behind the bridge; a GPU's 16 GB/s link\n"
    say "# is a host's link, B = %s Gbit/s; their 160 MB gradient is S; their 10 ms per transfer (160 MB / 16 GB/s)\n" "$link"
    say "# is T = %s ms. Each strategy is a kvps job (BSP, the model as one tensor: all pushes, then all pulls,\n" "$T"
    say "# as the notes reason), so predicted = notes' ms x T / 10 ms:\n"
    say "#   one GPU: server on host 0 beside worker 0 (whose gradient stays local), workers 1-3 push through host\n"
    say "#            0's link (3T) and pull back (3T) = 6T            [notes: 30 + 30 = 60 ms]\n"
    say "#   CPU:     server on host 4, which has no worker: 4T in + 4T out = 8T  [notes: 40 + 40 = 80 ms]\n"
    say "#   split:   4 servers, one per host, each aggregating 1/4: (3/4)T + (3/4)T = 1.5T  [notes: 7.5 + 7.5 = 15 ms]\n"
    say "# Below the line, the model as %s tensors in flight: a link carries pushes one way while it carries pulls\n" "$tensors"
    say "# the other, so one GPU and CPU drop to 3T and 4T; split stays 1.5T (each direction already full).\n"
    say "%-9s %7s %9s %9s %9s %10s %19s %11s %7s\n" strategy tensors notes_ms pred_T pred_ms sync_ms "[min..max]" meas/pred cpu%
    for s in gpu cpu split line gpu cpu split; do
        [ $s = line ] && { say "%s\n" "- - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - -"; k=$tensors; continue; }
        [ -n "${k:-}" ] || k=1
        case $s in
            gpu) nms=60 sh="0" pt=$([ $k = 1 ] && echo 6 || echo 3);;
            cpu) nms=80 sh="4" pt=$([ $k = 1 ] && echo 8 || echo 4);;
            split) nms=15 sh="0 1 2 3" pt=1.5;;
        esac
        tg=c4_${s}_k$k
        run_ps "$tg" "$sh" "0 1 2 3" --tensors "$k" || continue
        t=${R_MED[$tg]}
        pred=$(pf "\"%.1f\", $pt * $T")
        say "%-9s %7s %9s %9s %9s %10s %19s %11s %7s%s\n" "$s" "$k" "$nms" "$pt" "$pred" "$t" \
            "[${R_LO[$tg]}..${R_HI[$tg]}]" "$(pf "\"%.2f\", $t / $pred")" "${R_CPU[$tg]}" "$(cpu_note "${R_CPU[$tg]}")"
        echo "$s,$k,$nms,$(pf "\"%.1f\", $nms / 10"),$pt,$pred,$t,${R_LO[$tg]},${R_HI[$tg]},$(pf "\"%.3f\", $t / $pred"),$T,${R_CPU[$tg]}" >>"$f"
    done
    unset k
    read -r worst order rg rc rs < <(awk -F, 'NR > 1 && $2 == 1 { r = $10; d = r > 1 ? r : 1 / r; if (d > w) w = d; t[$1] = $7 }
        END { ok = ("gpu" in t) && ("cpu" in t) && ("split" in t) && t["split"] < t["gpu"] && t["gpu"] < t["cpu"]
              if (!ok) { print "nan 0 nan nan nan"; exit }
              printf "%.2f %d %.2f %.2f %.2f\n", w, ok, t["gpu"] / t["split"], t["cpu"] / t["split"], 1 }' "$f")
    say "# measured ratios (one tensor) one GPU : CPU : split = %s : %s : %s   (notes 60 : 80 : 15 = 4.00 : 5.33 : 1)\n" "$rg" "$rc" "$rs"
    say "claim 4: every strategy (one tensor) within 1.25x of its prediction (worst %sx) and split < one GPU < CPU: %s\n" \
        "$worst" "$(case $worst in nan) echo "n/a (not measured)";; *) verdict "$(awk -v w="$worst" -v o="$order" 'BEGIN { print ((w <= 1.25 && o) ? 1 : 0) }')";; esac)"
fi

# Claim 5 -----------------------------------------------------------------------------------
if want 5; then
    f=${pre}_claim5.csv
    nw=$(( hosts < 4 ? hosts : 4 ))
    echo "codec,wire_bytes,raw_bytes,bytes_ratio,sync_ms,min_ms,max_ms,time_ratio,time_over_bytes,cpu_pct_ours_all" >"$f"
    say "\n## Claim 5: FP16 and top-k cut sync time in proportion to bytes\n"
    say "# one server on host 0, %s workers on hosts 1..%s (the server's link is the bottleneck); bytes = one worker's\n" "$nw" "$nw"
    say "# push + pull payload per step. fp16: both ways; topk: top 1%% of |g| pushed as (u32 index, f32 value) with\n"
    say "# error feedback, pulled in float32; topk+fp16: pulled in fp16.\n"
    say "%-10s %12s %11s %10s %19s %10s %10s %7s\n" codec wire_bytes bytes_ratio sync_ms "[min..max]" time_ratio time/bytes cpu%
    base_t="" base_b=""
    for c in none fp16 topk topk+fp16; do
        tg=c5_${c/+/_}
        run_ps "$tg" "0" "$(seq -s' ' 1 "$nw")" --codec "$c" --topk 0.01 || continue
        t=${R_MED[$tg]} wb=${R_WIRE[$tg]} rb=${R_RAW[$tg]}
        [ "$c" = none ] && base_t=$t base_b=$wb
        [ -n "$base_t" ] || continue
        br=$(pf "\"%.3f\", $wb / $base_b") tr=$(pf "\"%.3f\", $t / $base_t")
        say "%-10s %12s %11s %10s %19s %10s %10s %7s%s\n" "$c" "$wb" "$br" "$t" "[${R_LO[$tg]}..${R_HI[$tg]}]" "$tr" \
            "$(pf "\"%.2f\", $tr / $br")" "${R_CPU[$tg]}" "$(cpu_note "${R_CPU[$tg]}")"
        echo "$c,$wb,$rb,$br,$t,${R_LO[$tg]},${R_HI[$tg]},$tr,$(pf "\"%.3f\", $tr / $br"),${R_CPU[$tg]}" >>"$f"
    done
    worst=$(awk -F, 'NR > 2 { r = $9; d = r > 1 ? r : 1 / r; if (d > w) w = d } END { printf "%.2f\n", (w ? w : 99) }' "$f")
    say "claim 5: every codec's time ratio within 1.25x of its bytes ratio (worst %sx): %s\n" "$worst" \
        "$(judge "$worst" "<=" 1.25)"
fi

# Claim 6 -----------------------------------------------------------------------------------
if want 6 && [ "$nh" -lt 4 ]; then
    say "\n## Claim 6: skipped: it needs 4 hosts, the host file names %s\n" "$nh"
elif want 6; then
    f=${pre}_claim6.csv n=4
    echo "run,replicas,sync_ms,min_ms,max_ms,ideal_ms,meas_over_ideal,T_ms,cpu_pct_ours_all,failover_ms,longest_step_ms,kill_to_resume_ms" >"$f"
    say "\n## Claim 6 (issue 18): replicated shards - r = 2 within 1.15x of r = 1, and a primary's kill\n"
    say "# claim 2's layout: a server and a worker on each of hosts 0..%s, %s shards, the model as %s tensors;\n" $((n - 1)) "$n" "$tensors"
    say "# r = 2: shard i's backup on host i+1 mod %s (port 5556), which the primary sends each round's sum\n" "$n"
    say "# to before it answers (BSP). Ideal (every link direction full): r = 1 carries 2(n-1)/n S each way\n"
    say "# per host = %s T; r = 2 adds each shard's S/n, one sum a round, to its backup: (2n-1)/n T = %s T.\n" \
        "$(pf "\"%.2f\", 2 * ($n - 1) / $n")" "$(pf "\"%.2f\", (2 * $n - 1) / $n")"
    say "# r2l: r = 2 with the workers' .read_local (KVPS_READ_LOCAL=1): worker i reads shard i-1's result from\n"
    say "# its backup on host i, which the sum reached already; no link carries more than r = 1's: %s T.\n" \
        "$(pf "\"%.2f\", 2 * ($n - 1) / $n")"
    say "%-5s %4s %10s %19s %10s %10s %7s\n" run r sync_ms "[min..max]" ideal_ms meas/ideal cpu%
    for rr in 1 2 2l; do
        tg=c6_r$rr r=${rr%l}
        REP_READ_LOCAL=$([ "$rr" = 2l ] && echo 1 || echo 0) run_rep "$tg" "$n" "$r" 0 --tensors "$tensors" \
            --failover-ms "$failover_ms" || continue
        t=${R_MED[$tg]}
        ideal=$(pf "\"%.1f\", ($r == 1 || \"$rr\" == \"2l\" ? 2 * ($n - 1) / $n : (2 * $n - 1) / $n) * $T")
        say "%-5s %4s %10s %19s %10s %10s %7s%s\n" "r$rr" "$r" "$t" "[${R_LO[$tg]}..${R_HI[$tg]}]" "$ideal" \
            "$(pf "\"%.2f\", $t / $ideal")" "${R_CPU[$tg]}" "$(cpu_note "${R_CPU[$tg]}")"
        echo "r$rr,$r,$t,${R_LO[$tg]},${R_HI[$tg]},$ideal,$(pf "\"%.3f\", $t / $ideal"),$T,${R_CPU[$tg]},$failover_ms,," >>"$f"
    done
    ratio=nan ratiol=nan
    case "${R_MED[c6_r1]:-nan}/${R_MED[c6_r2]:-nan}" in *nan*) ;; *) ratio=$(pf "\"%.2f\", ${R_MED[c6_r2]} / ${R_MED[c6_r1]}");; esac
    case "${R_MED[c6_r1]:-nan}/${R_MED[c6_r2l]:-nan}" in *nan*) ;; *) ratiol=$(pf "\"%.2f\", ${R_MED[c6_r2l]} / ${R_MED[c6_r1]}");; esac
    say "claim 6: sync time r = 2 / r = 1 = %sx (link arithmetic: %sx); with .read_local %sx <= 1.15x: %s\n" "$ratio" \
        "$(pf "\"%.2f\", (2 * $n - 1) / (2 * ($n - 1))")" "$ratiol" "$(judge "$ratiol" "<=" 1.15)"
    # the kill: r = 2, shard 0's primary SIGKILLed halfway through; workers move to its backup
    tg=c6_kill
    say "# kill run: r = 2 with .read_local, SIGKILL to shard 0's primary once worker 0 has finished half the timed steps;\n"
    say "# workers move to the backup after --failover-ms %s. kill->resume: from the kill to the end of the\n" "$failover_ms"
    say "# first step that every worker ended after the kill, by its last worker (this machine's wall clock%s).\n" \
        "$([ -n "$host_file" ] && echo '; over ssh: host 0'"'"'s clock against the workers'"'"', as synchronised as they are')"
    if REP_READ_LOCAL=1 run_rep "$tg" "$n" 2 1 --tensors "$tensors" --failover-ms "$failover_ms" && [ -n "$KILL_US" ]; then
        # rs: the first step that every worker ended after the kill; resume: its last end - the kill
        read -r resume rs longest lstep < <(awk -F, -v t="$tg" -v k="$KILL_US" '
            $1 == t { s = $3 + 0; if (!(s in mx) || $4 + 0 > mx[s]) mx[s] = $4 + 0
                      if (!(s in lo) || $9 + 0 < lo[s]) lo[s] = $9 + 0; if (!(s in hi) || $9 + 0 > hi[s]) hi[s] = $9 + 0 }
            END { rs = -1; for (s in lo) if (lo[s] >= k && (rs < 0 || s < rs)) rs = s
                  for (s in mx) if (mx[s] > L) { L = mx[s]; ls = s }
                  printf "%s %s %.1f %d\n", (rs >= 0 ? sprintf("%.1f", (hi[rs] - k) / 1000) : "nan"), rs, L / 1000, ls }' "$stamps_csv")
        t=${R_MED[$tg]}
        say "%-5s %4s %10s %19s %10s %10s %7s%s\n" kill 2 "$t" "[${R_LO[$tg]}..${R_HI[$tg]}]" "-" "-" "${R_CPU[$tg]}" \
            "$(cpu_note "${R_CPU[$tg]}")"
        say "claim 6 kill: kill -> resume (timed step %s done by all) = %s ms; longest step %s ms (timed step %s),\n" \
            "$rs" "$resume" "$longest" "$lstep"
        say "# %s ms more than the r2l median (%s ms); failover_ms = %s\n" \
            "$(pf "\"%.1f\", $longest - ${R_MED[c6_r2l]:-0}")" "${R_MED[c6_r2l]:-nan}" "$failover_ms"
        echo "kill,2,$t,${R_LO[$tg]},${R_HI[$tg]},,,$T,${R_CPU[$tg]},$failover_ms,$longest,$resume" >>"$f"
    else
        [ -n "${KILL_US:-}" ] || say "  !! %s: the kill did not happen (no worker progress, or pkill found nothing)\n" "$tg"
    fi
fi

say "\n# %s s; results in %s_*.csv; charts: bench/plot.sh\n" "$((SECONDS - T0))" "$pre"
rm -rf "$work"
[ "${FAILS:-0}" = 0 ] || { echo "ethernet: ${FAILS} run(s) failed (above)" >&2; exit 1; }
exit 0
