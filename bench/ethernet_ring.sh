#!/usr/bin/env bash
# Emulated Ethernet: N hosts as network namespaces on a bridge, addresses 198.18.0.1..N, every
# host link shaped with tc tbf on both veth ends (netem is not available here). Runs
# build/ring_peer on every host and prints rank 0's figures. Removes everything on exit.
# usage: bench/ethernet_ring.sh [-n HOSTS] [-r RATE(1gbit)] [-- ring_peer options]   (root)
set -eu
n=2; rate=1gbit
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n=$2; shift 2;; -r) rate=$2; shift 2;; --) shift; break;;
    *) echo "usage: $0 [-n HOSTS] [-r RATE] [-- ring_peer options]" >&2; exit 2;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "ethernet_ring: needs root (ip netns, tc)" >&2; exit 2; }
bin=$(pwd)/build/ring_peer
[ -x "$bin" ] || { echo "ethernet_ring: build $bin first (make)" >&2; exit 2; }
tag=kv$$; br=${tag}br
cleanup() {
  for i in $(seq 1 "$n"); do ip netns del ${tag}h$i 2>/dev/null || true; ip link del ${tag}v$i 2>/dev/null || true; done
  ip link del "$br" 2>/dev/null || true
}
trap cleanup EXIT INT TERM
ip link add "$br" type bridge && ip link set "$br" up
peers=""
. "$(dirname "$0")/netns_host.sh"
for i in $(seq 1 "$n"); do
  netns_host "$tag" "$br" "$i" "$rate"
  peers="$peers${peers:+,}tcp://198.18.0.$i:6000"
done
echo "# $n hosts, links shaped to $rate (tbf on both ends), peers $peers"
pids=()
for i in $(seq 1 "$n"); do
  KVPS_RANK=$((i-1)) KVPS_SIZE=$n KVPS_RING_PEERS=$peers ip netns exec ${tag}h$i "$bin" "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
