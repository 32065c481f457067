# bench/netns_host.sh - sourced by the emulated-Ethernet scripts (ethernet_ring.sh,
# ethernet_hier.sh): netns_host TAG BRIDGE I [RATE] makes host I, a network namespace TAGhI joined
# to BRIDGE by the veth pair TAGvI (bridge side) / TAGpI (inside), addressed 198.18.0.I/24 (in
# 198.18.0.0/15, for tests), lo up; RATE (e.g. 1gbit; empty: unshaped) shapes both ends with tc
# tbf. The caller removes what it made (ip netns del TAGhI; ip link del TAGvI).
netns_host() {
  local tag=$1 br=$2 i=$3 rate=${4:-} ns=$1h$3
  ip netns add "$ns" &&
  ip link add "${tag}v$i" type veth peer name "${tag}p$i" &&
  ip link set "${tag}p$i" netns "$ns" &&
  ip link set "${tag}v$i" master "$br" up &&
  ip -n "$ns" addr add "198.18.0.$i/24" dev "${tag}p$i" &&
  ip -n "$ns" link set "${tag}p$i" up &&
  ip -n "$ns" link set lo up || return 1
  [ -z "$rate" ] && return 0
  tc qdisc add dev "${tag}v$i" root tbf rate "$rate" burst 256kb latency 50ms &&
  ip netns exec "$ns" tc qdisc add dev "${tag}p$i" root tbf rate "$rate" burst 256kb latency 50ms
}
