#!/usr/bin/env bash
# bench/ethernet_hier.sh - all-reduce (float32 sum) on 2 hosts x 2 ranks (-p 1: x 1 rank): kvps_ring
# against OpenMPI.
#
# usage: bench/ethernet_hier.sh [-r RATE] [-n ROUNDS(3)] [-t SECONDS(0.5)] [-s SIZES(4K,64K,1M,16M,64M)]
#                               [-y 0|1] [-p 1|2] [-- ring_peer options]   (root; OpenMPI's mpirun)
#
# Hosts: two network namespaces, 198.18.0.1 and 198.18.0.2, each joined by a veth pair to a bridge
# that has 198.18.0.254 (so that OpenMPI's daemons, inside the namespaces, reach mpirun, outside).
# -r RATE shapes both ends of each veth with tc tbf, as bench/ethernet_ring.sh does (default:
# unshaped). Everything made here (namespaces, links, processes, temporary files, shared memory
# segments left by killed ranks) is removed on exit, on failure and on Ctrl-C.
#
#   kvps:    4 build/ring_peer, ranks 0,1 in host 1 and 2,3 in host 2 (`ip netns exec`; -p 1: ranks 0
#            and 1, one per host). kvps_ring tells hosts apart by network namespace: inside a host
#            shared memory, between hosts its own TCP connections over the veth; with no .groups the ring gets one group per host, so AUTO
#            runs RD up to 512 KiB and HIER above (kvps_ring.h section 3). Checked here: which
#            ranks' shared memory segments each rank has mapped (/proc/PID/maps).
#   OpenMPI: build/mpi_allreduce, mpirun --host 198.18.0.1:2,198.18.0.2:2 with an rsh agent that
#            runs each daemon in its host's namespace, and in a UTS namespace of its own with a
#            hostname of its own (both namespaces share /dev/shm, and vader names its segments by
#            hostname and local rank: with one hostname the two hosts' rank-0 segments collide and
#            the ranks crash). pml ob1, btl self,vader,tcp, btl_tcp_if_include 198.18.0.0/24
#            (inside a namespace that is only its veth). Checked here: a short run with
#            btl_base_verbose, whose "bml: Using X btl for send to RANK" lines are summarised.
#            mpi_yield_when_idle 1 (-y 0: off): 4 ranks share this machine's CPUs, but each
#            "host" says it has them all, so OpenMPI does not see the oversubscription and would
#            spin (on 2 CPUs, a 4 KiB all-reduce then takes tens of ms instead of ~0.1 ms).
#
# Method: a calibration run of ring_peer (its default iterations, all sizes, not in the table)
# sets kvps's --iters per size so that each size takes about -t seconds, as mpi_allreduce's --time
# does. Then ROUNDS rounds, each kvps then OpenMPI. kvps: one ring_peer launch per size (fresh
# ports), 2 warm-ups and a barrier, then the mean time per all-reduce on rank 0. OpenMPI: one
# mpirun per round, all sizes, --time -t: per size a warm-up (result checked), then 5 blocks, each
# the per-call time averaged over ranks; the median block. The ratio column is MPI / kvps over
# every pair of rounds (min-max; > 1: kvps faster).
set -eu
cd "$(dirname "$0")/.." || exit 2

usage() { sed -n '4,5p' "$0" | sed 's/^# //' >&2; exit 2; }
rate="" rounds=3 mtime=0.5 sizes="4K,64K,1M,16M,64M" yield=1 per=2
while [ $# -gt 0 ]; do
  case "$1" in
    -r) rate=${2:?}; shift 2;;
    -n) rounds=${2:?}; shift 2;;
    -t) mtime=${2:?}; shift 2;;
    -s) sizes=${2:?}; shift 2;;
    -y) yield=${2:?}; shift 2;;
    -p) per=${2:?}; [ "$per" = 1 ] || [ "$per" = 2 ] || usage; shift 2;;
    --) shift; break;;
    *) usage;;
  esac
done
extra=("$@")
np=$((2 * per))
[ "$(id -u)" = 0 ] || { echo "ethernet_hier: needs root (ip netns, tc)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "ethernet_hier: no mpirun (OpenMPI)" >&2; exit 2; }
kvbin=$PWD/build/ring_peer mpibin=$PWD/build/mpi_allreduce
[ -x "$kvbin" ] || { echo "ethernet_hier: build $kvbin first (make build/ring_peer)" >&2; exit 2; }
[ -x "$mpibin" ] || { echo "ethernet_hier: build $mpibin first (mpicc -O2 bench/mpi_allreduce.c -o build/mpi_allreduce)" >&2; exit 2; }

to_bytes() { # 4K -> 4096
  local v=${1%[KkMmGg]} m=1
  case "$1" in *[Kk]) m=1024;; *[Mm]) m=1048576;; *[Gg]) m=1073741824;; esac
  echo $((v * m))
}
labels=() bytes=()
IFS=, read -r -a labels <<<"$sizes"
for l in "${labels[@]}"; do bytes+=("$(to_bytes "$l")"); done

tag=kh$$ br=kh$$br
tmp=$(mktemp -d /tmp/ethernet_hier.XXXXXX)
kv_pids=() kv_all=() mpi_pid=""
cleanup() {
  set +e
  for p in "${kv_pids[@]}" $mpi_pid; do kill "$p" 2>/dev/null; done
  sleep 0.2
  for i in 1 2; do
    for p in $(ip netns pids ${tag}h$i 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  done
  for p in "${kv_pids[@]}" $mpi_pid; do kill -9 "$p" 2>/dev/null; done
  for i in 1 2; do ip netns del ${tag}h$i 2>/dev/null; ip link del ${tag}v$i 2>/dev/null; done
  ip link del "$br" 2>/dev/null
  for p in "${kv_all[@]}"; do rm -f /dev/shm/kvps-ring-"$p"-*; done
  rm -f /dev/shm/vader_segment.${tag}h[12].*
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the two hosts ---
ip link add "$br" type bridge
ip link set "$br" up
ip addr add 198.18.0.254/24 dev "$br"
. "$(dirname "$0")/netns_host.sh"
for i in 1 2; do
  netns_host "$tag" "$br" $i "$rate"
done

# mpirun's rsh agent: "AGENT HOST COMMAND..." -> COMMAND in HOST's namespace, with its own hostname
cat >"$tmp/agent" <<EOF
#!/bin/sh
host=\$1; shift
case "\$host" in
  198.18.0.1) ns=${tag}h1 hn=${tag}h1;;
  198.18.0.2) ns=${tag}h2 hn=${tag}h2;;
  *) echo "ethernet_hier agent: unknown host \$host" >&2; exit 1;;
esac
exec ip netns exec "\$ns" unshare --uts /bin/sh -c 'hostname "\$0" && exec /bin/sh -c "\$1"' "\$hn" "\$*"
EOF
chmod +x "$tmp/agent"
mkdir "$tmp/ompi"
mpi_opts=(--allow-run-as-root --host 198.18.0.1:$per,198.18.0.2:$per -np $np --bind-to none
          --mca plm_rsh_agent "$tmp/agent" --mca orte_tmpdir_base "$tmp/ompi"
          --mca oob_tcp_if_include 198.18.0.0/24
          --mca pml ob1 --mca btl self,vader,tcp --mca btl_tcp_if_include 198.18.0.0/24
          --mca mpi_yield_when_idle "$yield")

# --- runners ---
launch=0
# run_kvps SIZES_BYTES OUT [ring_peer options]: rank 0's output in OUT; with $verify set, the
# shared memory segments each rank maps go to $tmp/kvps_maps
run_kvps() {
  local szs=$1 out=$2 r peers="" rc=0 p
  shift 2
  launch=$((launch + 1))
  for r in $(seq 0 $((np - 1))); do peers="$peers${peers:+,}tcp://198.18.0.$((r / per + 1)):$((6000 + 4 * launch + r))"; done
  kv_pids=()
  for r in $(seq 0 $((np - 1))); do
    KVPS_RANK=$r KVPS_SIZE=$np KVPS_RING_PEERS=$peers ip netns exec ${tag}h$((r / per + 1)) \
      "$kvbin" --sizes "$szs" --timeout 60000 "$@" ${extra[@]+"${extra[@]}"} >"$tmp/kv.$launch.$r" 2>&1 &
    kv_pids+=($!)
  done
  kv_all+=("${kv_pids[@]}")
  if [ -n "${verify:-}" ]; then
    # every rank's maps, once each rank has mapped 2 segments (its own and a peer's) or after 5 s
    local t=0 n
    while [ $t -lt 50 ]; do
      n=0
      for p in "${kv_pids[@]}"; do
        c=$(grep -c '/dev/shm/kvps-ring-' /proc/$p/maps 2>/dev/null) || true
        [ "${c:-0}" -ge "$per" ] && n=$((n + 1))
      done
      [ $n -eq $np ] && break
      sleep 0.1; t=$((t + 1))
    done
    sleep 0.2
    : >"$tmp/kvps_maps"
    for r in $(seq 0 $((np - 1))); do
      echo "rank $r pid ${kv_pids[$r]}: $(grep -o '/dev/shm/kvps-ring-[0-9]*' /proc/${kv_pids[$r]}/maps 2>/dev/null | sort -u | sed 's|.*-||' | tr '\n' ' ')" >>"$tmp/kvps_maps"
    done
  fi
  for p in "${kv_pids[@]}"; do wait "$p" || rc=$?; done
  kv_pids=()
  if [ $rc -ne 0 ]; then
    echo "ethernet_hier: ring_peer failed (exit $rc); its output:" >&2
    for r in $(seq 0 $((np - 1))); do sed "s/^/  rank $r: /" "$tmp/kv.$launch.$r" >&2; done
    exit 1
  fi
  cat "$tmp/kv.$launch.0" >"$out"
}
run_mpi() { # run_mpi OUT [mpirun options before the binary] -- [mpi_allreduce options]
  local out=$1 rc=0 opts=()
  shift
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  timeout -k 5 300 mpirun "${mpi_opts[@]}" ${opts[@]+"${opts[@]}"} "$mpibin" "$@" >"$out" 2>&1 &
  mpi_pid=$!
  wait $mpi_pid || rc=$?
  mpi_pid=""
  if [ $rc -ne 0 ]; then
    echo "ethernet_hier: mpirun failed (exit $rc); its output:" >&2
    tail -40 "$out" >&2
    exit 1
  fi
}

# --- checks: which transports each side uses ---
allb=$(IFS=,; echo "${bytes[*]}")
t_start=$(date +%s)
verify=1 run_kvps "$allb" "$tmp/kv.cal"
run_mpi "$tmp/mpi.verbose" --mca btl_base_verbose 100 --mca pml_base_verbose 10 -- --sizes 4K,1M --time 0.05 --csv

# kvps: for each rank, the other ranks whose segment it maps
kv_check=$(awk -v pids="$(sed 's/.*pid \([0-9]*\):.*/\1/' "$tmp/kvps_maps" | tr '\n' ' ')" '
  BEGIN { n = split(pids, P, " "); for (i = 1; i <= n; i++) R[P[i]] = i - 1 }
  { r = $2; s = ""; for (i = 5; i <= NF; i++) if ($i in R && R[$i] != r) s = s (s ? "," : "") R[$i]
    printf "%srank %d maps the segment of rank(s) %s", (NR > 1 ? "; " : ""), r, (s == "" ? "none" : s) }' "$tmp/kvps_maps")
# OpenMPI: "[HOST:PID] mca: bml: Using BTL btl for send to [[JOB,1],RANK] on node N"; a rank's
# own rank is the one it reaches through self
mpi_check=$(awk -v np="$np" '
  /mca: bml: Using/ { split($1, a, ":"); pid = a[2]; sub(/]$/, "", pid); host = substr(a[1], 2)
                      btl = $5; dst = $10; gsub(/.*,|]/, "", dst)
                      if (btl == "self") { me[pid] = dst; hn[pid] = host }
                      else if (!seen[pid, dst]++) use[pid] = use[pid] " " dst ":" btl }
  END { for (p in me) line[me[p]] = sprintf("rank %d (%s) ->%s", me[p], hn[p], use[p])
        for (r = 0; r < np; r++) printf "%s%s", (r ? "; " : ""), (r in line ? line[r] : "rank " r ": no line") }' "$tmp/mpi.verbose")
tcp_if=$(grep -o 'btl: tcp: Found match: [^)]*)' "$tmp/mpi.verbose" | sed 's/btl: tcp: Found match: //' | sort -u | tr '\n' ' ')
if [ "$per" = 1 ]; then
  grep -q 'mca: bml: Using tcp' "$tmp/mpi.verbose" && ! grep -q 'mca: bml: Using vader' "$tmp/mpi.verbose" \
    && mpi_verdict="TCP between the two hosts" || mpi_verdict="NOT the expected tcp: see the lines"
else
  grep -q 'mca: bml: Using vader' "$tmp/mpi.verbose" && grep -q 'mca: bml: Using tcp' "$tmp/mpi.verbose" \
    && mpi_verdict="shared memory (vader) inside a namespace, TCP between them" \
    || mpi_verdict="NOT the expected vader + tcp: see the lines"
fi
pml=$(grep -o 'selected [a-z0-9]* best priority' "$tmp/mpi.verbose" | head -1 | awk '{print $2}')
han=$(ompi_info --param coll han --level 9 2>/dev/null | sed -n 's/.*"coll_han_priority" (current value: "\([0-9]*\)".*/\1/p')

# kvps --iters per size from the calibration: about -t seconds each
declare -A kv_iters
while read -r _ b _ t _; do
  kv_iters[$b]=$(awk -v t="$t" -v s="$mtime" 'BEGIN { n = int(s * 1e6 / t); print (n < 5 ? 5 : n > 20000 ? 20000 : n) }')
done < <(grep '^bytes:' "$tmp/kv.cal")

echo "# ethernet_hier: all-reduce, float32 sum, 2 hosts x $per rank(s); $(nproc) CPUs for all $np ranks"
echo "# hosts: network namespaces ${tag}h1 (198.18.0.1, ranks $(seq -s, 0 $((per - 1)))) and ${tag}h2 (198.18.0.2, ranks $(seq -s, $per $((np - 1)))), veth pairs on bridge $br (198.18.0.254 for mpirun);" \
     "links $([ -n "$rate" ] && echo "shaped to $rate (tc tbf on both ends of each veth)" || echo "unshaped")"
echo "# kvps:    build/ring_peer, algo auto (RD up to 512 KiB, HIER above)${extra[*]:+, options: ${extra[*]}}; mean per call on rank 0 after 2 warm-ups;" \
     "iters per size from a calibration run (~${mtime} s each): $(for b in "${bytes[@]}"; do printf '%s:%s ' "$b" "${kv_iters[$b]:-?}"; done)"
echo "# kvps transports (/proc/PID/maps, calibration run): $kv_check"
echo "#   -> shared memory with the other rank of the same namespace only (-p 2); the other namespace's ranks over TCP"
echo "# MPI:     $(mpirun --version 2>/dev/null | head -1), pml ${pml:-?}, btl self,vader,tcp, btl_tcp_if_include 198.18.0.0/24, mpi_yield_when_idle $yield," \
     "coll han priority ${han:-?} (so coll tuned decides); --time $mtime; median of 5 blocks, averaged over ranks"
echo "# MPI transports (btl_base_verbose 100 run, 'bml: Using X btl for send to' per peer contacted): $mpi_check"
echo "#   tcp interfaces chosen: ${tcp_if:-?}-> $mpi_verdict"

# --- the rounds ---
: >"$tmp/results"
for round in $(seq 1 "$rounds"); do
  for i in "${!bytes[@]}"; do
    b=${bytes[$i]}
    run_kvps "$b" "$tmp/kv.r$round.$b" --iters "${kv_iters[$b]:-20}"
    t=$(awk '/^bytes:/ { print $4 }' "$tmp/kv.r$round.$b")
    echo "kvps $round $b $t" >>"$tmp/results"
  done
  run_mpi "$tmp/mpi.r$round" -- --sizes "$sizes" --time "$mtime" --csv
  awk -F, -v r="$round" '$1 == "mpi" { if ($11 != 1) bad = 1; print "mpi", r, $3, $6 } END { exit bad }' "$tmp/mpi.r$round" >>"$tmp/results" \
    || { echo "ethernet_hier: MPI result check failed (round $round)" >&2; cat "$tmp/mpi.r$round" >&2; exit 1; }
  echo "# round $round done ($(($(date +%s) - t_start)) s)"
done

echo "#"
echo "# time per all-reduce, us (one column per round); MPI/kvps: min-max over every pair of rounds, > 1: kvps faster"
awk -v labels="$(IFS=,; echo "${labels[*]}")" -v sizes="$allb" -v rounds="$rounds" '
  { T[$1, $2, $3] = $4 }
  END {
    n = split(labels, L, ","); split(sizes, B, ",")
    hk = ""; hm = ""
    for (r = 1; r <= rounds; r++) { hk = hk sprintf(" %9s", "kvps" r); hm = hm sprintf(" %9s", "mpi" r) }
    printf "%6s %10s%s |%s | %s\n", "size", "bytes", hk, hm, "MPI/kvps"
    for (i = 1; i <= n; i++) {
      b = B[i]; lk = ""; lm = ""; lo = 1e30; hi = 0
      for (r = 1; r <= rounds; r++) {
        k = T["kvps", r, b]; m = T["mpi", r, b]
        lk = lk sprintf(" %9.1f", k); lm = lm sprintf(" %9.1f", m)
        for (q = 1; q <= rounds; q++) {
          x = T["mpi", r, b] / T["kvps", q, b]
          if (x < lo) lo = x; if (x > hi) hi = x
        }
      }
      printf "%6s %10d%s |%s | %.2f-%.2f\n", L[i], b, lk, lm, lo, hi
    }
  }' "$tmp/results"
echo "# total $(($(date +%s) - t_start)) s"
