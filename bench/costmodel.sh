#!/usr/bin/env bash
# bench/costmodel.sh - the measurements behind bench/costmodel.c (issue 19, "which algorithm, at
# what scale"): all-reduce per algorithm and parameter-server push+pull, on loopback and on the
# emulated 1 Gbit/s link, gathered into one CSV that `build/costmodel --measured` reads.
#
# usage: bench/costmodel.sh [--parts gamma,lo-ring,lo-hier,lo-ps,eth-ring,eth-ps] [--out DIR] [--quick]
#
#   gamma     build/costmodel --gamma: kvps_reduce_into float32 sum, 1 MiB pieces (cache-hot, as
#             the ring reduces them) and 64 MiB
#   lo-ring   build/bench_ring --no-mpi --csv --coll allreduce --ranks 2,4,8 --algo ring,biring,rd,rhd
#             --sizes 4K:64M:4 --time 0.3 (processes on tcp://127.0.0.1, 2 vCPUs: 4 and 8 ranks
#             are oversubscribed)
#   lo-hier   the same with --ranks 4,8 --groups 2 --algo hier
#   lo-ps     build/ps_peer on 127.0.0.1 (processes): one server and m = 1, 2, 4 workers, and
#             n = m = 2, 4 servers, BSP push+pull of one tensor of 4 KiB, 1 MiB and 16 MiB
#             (--max-slice 268435456: one slice per server)
#   eth-ring  bench/ethernet_ring.sh -n 2,4,8 -r 1gbit -- --algo ring|biring|rd|rhd --sizes
#             4096,65536,1048576,16777216 --iters 10 --csv TAG (namespaces on a bridge, tbf 1gbit)
#   eth-ps    bench/ethernet.sh --rate 1gbit --hosts 8 --only 1,2 --out DIR/eth-ps (its claims 1
#             and 2: one server and m = 1..8 workers; n = m = 2, 4, 8, a server and a worker a host)
# Raw outputs go to DIR (default bench/results/costmodel), the gathered table to
# DIR/measured.csv: net,kind,algo,ranks,servers,groups,bytes,time_us,lo_us,hi_us[,cpu_us]
# (kind allreduce: ranks = ranks; kind ps: ranks = workers, servers = n, groups = 1 when servers
# and workers share hosts, tensors in algo: "ps1" one tensor, "ps16" 16 tensors).
# Needs root for the eth parts (ip netns, tc). Whole run: about 5 minutes here.
set -u
cd "$(dirname "$0")/.." || exit 2
parts=gamma,lo-ring,lo-hier,lo-ps,eth-ring,eth-ps out=bench/results/costmodel quick=0
while [ $# -gt 0 ]; do
    case "$1" in
        --parts) parts=${2:?}; shift 2;;
        --out) out=${2:?}; shift 2;;
        --quick) quick=1; shift;;
        *) sed -n '6p' "$0" | sed 's/^# //' >&2; exit 2;;
    esac
done
want() { case ",$parts," in *",$1,"*) return 0;; esac; return 1; }
mkdir -p "$out"
for b in bench_ring ring_peer ps_peer $(want gamma && echo costmodel); do
    [ -x build/$b ] || { echo "costmodel.sh: build build/$b first (make build/$b)" >&2; exit 2; }
done
say() { echo "# $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg): $*" >&2; }
t_ring=0.3 sizes=4K:64M:4
[ $quick = 1 ] && t_ring=0.15 sizes=4K:16M:4

if want gamma; then
    say "gamma"; build/costmodel --gamma >"$out/gamma.txt" || exit 1
fi
if want lo-ring; then
    say "lo-ring"
    build/bench_ring --no-mpi --csv --coll allreduce --ranks 2,4,8 --algo ring,biring,rd,rhd --sizes $sizes \
        --time $t_ring >"$out/lo_ring.csv" || exit 1
fi
if want lo-hier; then
    say "lo-hier"
    build/bench_ring --no-mpi --csv --coll allreduce --ranks 4,8 --groups 2 --algo hier --sizes $sizes \
        --time $t_ring >"$out/lo_hier.csv" || exit 1
fi

# lo_ps TAG N M BYTES [ps_peer options]: one BSP job of N servers and M workers on 127.0.0.1
lo_ps() {
    local t=$1 n=$2 m=$3 b=$4 servers="" k pids=() rc=0 base; shift 4
    # n free ports in a row (none listening nor in use); a server that cannot bind fails its job
    while :; do
        base=$(( 20000 + RANDOM % 20000 ))
        ss -Htan 2>/dev/null | awk -v lo=$base -v hi=$((base + n)) '{ p = $4; sub(/.*:/, "", p); if (p + 0 >= lo && p + 0 < hi) f = 1 }
            END { exit f }' && break
    done
    for k in $(seq 0 $((n - 1))); do servers+="${servers:+,}tcp://127.0.0.1:$((base + k))"; done
    local steps=30; [ "$b" -ge 16777216 ] && steps=7
    local args=(--bytes "$b" --steps $steps --warmup 2 --max-slice 268435456 --timeout 30000 --tag "$t" "$@")
    local spids=()
    for k in $(seq 0 $((n - 1))); do
        KVPS_ROLE=server KVPS_RANK=$k KVPS_SERVERS=$servers KVPS_NUM_WORKERS=$m build/ps_peer "${args[@]}" \
            >/dev/null 2>>"$out/lo_ps.err" &
        spids+=($!)
    done
    for k in $(seq 0 $((m - 1))); do
        KVPS_ROLE=worker KVPS_RANK=$k KVPS_SERVERS=$servers KVPS_NUM_WORKERS=$m build/ps_peer "${args[@]}" \
            >>"$out/lo_ps.csv" 2>>"$out/lo_ps.err" &
        pids+=($!)
    done
    for k in "${pids[@]}"; do wait "$k" || rc=1; done
    # servers leave by themselves once every worker has finished; one that is still there 5 s
    # later is told to stop (seen: 2 of 12 runs of 4 servers x 4 workers at 4 KiB, notes-cost.md)
    for k in "${spids[@]}"; do
        for i in $(seq 50); do kill -0 "$k" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$k" 2>/dev/null; then
            echo "costmodel.sh: lo-ps job $t: a server (pid $k) still there 5 s after its workers: stopped" >&2
            kill "$k" 2>/dev/null
        fi
        wait "$k" 2>/dev/null
    done
    [ $rc = 0 ] || echo "costmodel.sh: lo-ps job $t failed (see $out/lo_ps.err)" >&2
}
if want lo-ps; then
    say "lo-ps"; : >"$out/lo_ps.csv"; : >"$out/lo_ps.err"
    for b in 4096 1048576 16777216; do
        for m in 1 2 4; do lo_ps "lo_n1_m${m}_b$b" 1 $m $b; done
        for m in 2 4; do lo_ps "lo_n${m}_m${m}_b$b" $m $m $b; done
    done
fi
if want eth-ring; then
    say "eth-ring"; : >"$out/eth_ring.csv"
    [ "$(id -u)" = 0 ] || { echo "costmodel.sh: eth-ring needs root" >&2; exit 2; }
    for n in 2 4 8; do
        for a in ring biring rd rhd; do
            [ $n = 2 ] && [ $a = biring ] && continue   # with 2 ranks BIRING is RING
            bench/ethernet_ring.sh -n $n -r 1gbit -- --algo $a --sizes 4096,65536,1048576,16777216 --iters 10 \
                --csv "eth_${a}" >>"$out/eth_ring.csv" || echo "costmodel.sh: eth-ring $n $a failed" >&2
        done
    done
fi
if want eth-ps; then
    say "eth-ps"
    [ "$(id -u)" = 0 ] || { echo "costmodel.sh: eth-ps needs root" >&2; exit 2; }
    bench/ethernet.sh --rate 1gbit --hosts 8 --only 1,2 --out "$out/eth-ps" >"$out/eth_ps.txt" 2>&1 ||
        echo "costmodel.sh: ethernet.sh failed (see $out/eth_ps.txt)" >&2
fi

# ---- gather ---------------------------------------------------------------------------------
say "gather -> $out/measured.csv"
{
    echo "net,kind,algo,ranks,servers,groups,bytes,time_us,lo_us,hi_us,cpu_us"
    for f in "$out/lo_ring.csv" "$out/lo_hier.csv"; do
        [ -f "$f" ] || continue
        g=0; [ "$f" = "$out/lo_hier.csv" ] && g=2
        awk -F, -v g=$g '$1 == "kvps" && $2 == "allreduce" { printf "lo,allreduce,%s,%s,0,%d,%s,%s,%s,%s,%s\n", $3, $5, g, $6, $10, $10, $11, $12 }' "$f"
    done
    # per-iteration lines of ring_peer: TAG,ranks,bytes,iter,time_us -> median, min, max
    [ -f "$out/eth_ring.csv" ] && awk -F, 'NF == 5 && $1 ~ /^eth_/ { k = $1 "," $2 "," $3; n[k]++; v[k, n[k]] = $5 + 0 }
        END { for (k in n) { c = n[k]; for (i = 1; i <= c; i++) a[i] = v[k, i]
                for (i = 2; i <= c; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
                med = c % 2 ? a[(c + 1) / 2] : (a[c / 2] + a[c / 2 + 1]) / 2
                split(k, f, ","); sub(/^eth_/, "", f[1])
                printf "eth,allreduce,%s,%s,0,0,%s,%.1f,%.1f,%.1f\n", f[1], f[2], f[3], med, a[1], a[c] } }' "$out/eth_ring.csv" | sort -t, -k3,3 -k4n -k7n
    # ps_peer steps: tag,rank,step,sync_us,...: the slowest worker per step, then median, min, max
    [ -f "$out/lo_ps.csv" ] && awk -F, '$1 ~ /^lo_n/ { k = $1 SUBSEP $3; if (!(k in mx) || $4 + 0 > mx[k]) mx[k] = $4 + 0; t[$1] = 1 }
        END { for (tag in t) { c = 0; for (k in mx) { split(k, p, SUBSEP); if (p[1] == tag) a[++c] = mx[k] }
                for (i = 2; i <= c; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
                med = c % 2 ? a[(c + 1) / 2] : (a[c / 2] + a[c / 2 + 1]) / 2
                split(tag, f, "_"); n = substr(f[2], 2); m = substr(f[3], 2); b = substr(f[4], 2)
                printf "lo,ps,ps1,%d,%d,0,%d,%.1f,%.1f,%.1f\n", m, n, b, med, a[1], a[c] } }' "$out/lo_ps.csv" | sort -t, -k7n -k5n -k4n
    # ethernet.sh claims: 1 one server (own host), m workers; 2 n = m, a server and a worker a host
    c1=$out/eth-ps/ethernet_1gbit_claim1.csv c2=$out/eth-ps/ethernet_1gbit_claim2.csv
    b=16777216
    [ -f "$c1" ] && awk -F, -v b=$b 'NR > 1 { printf "eth,ps,ps1,%d,1,0,%d,%.1f,%.1f,%.1f\n", $1, b, $2 * 1000, $3 * 1000, $4 * 1000 }' "$c1"
    [ -f "$c2" ] && awk -F, -v b=$b 'NR > 1 { printf "eth,ps,ps16,%d,%d,1,%d,%.1f,%.1f,%.1f\n", $1, $1, b, $2 * 1000, $3 * 1000, $4 * 1000
        if ($9 != "nan") printf "eth,ps,ps1,%d,%d,1,%d,%.1f,%.1f,%.1f\n", $1, $1, b, $9 * 1000, $10 * 1000, $11 * 1000 }' "$c2"
} >"$out/measured.csv"
say "done"
