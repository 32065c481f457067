#!/usr/bin/env bash
# test_ring_netns - the hierarchical ring across real network namespaces (kvps_ring.h section
# 10): 2 hosts x 2 ranks, hosts being two network namespaces joined by a veth pair, addressed
# 198.18.77.1 and 198.18.77.2 (198.18.0.0/15, for tests). Ranks on one host talk through shared
# memory, the hosts over TCP, the ring finds the hosts by itself; build/ring_hier_rank checks the
# transports, the algorithm AUTO picks, and exact sums. Needs root and ip(8): elsewhere it says
# "skipped". Everything it makes is removed on exit.
set -u
dir=$(cd "$(dirname "$0")" && pwd)
rank_bin=$dir/ring_hier_rank
tag=kvt$$
skip() { echo "skip test_ring_netns: $*"; echo "0 passed, 0 failed, 1 skipped"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root (ip netns)"
command -v ip >/dev/null 2>&1 || skip "no ip(8) (iproute2)"
[ -x "$rank_bin" ] || { echo "FAIL test_ring_netns: $rank_bin missing"; echo "0 passed, 1 failed"; exit 1; }
cleanup() {
    for ns in ${tag}a ${tag}b; do
        for p in $(ip netns pids $ns 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
        ip netns del $ns 2>/dev/null
    done
    rm -rf "/tmp/$tag"
}
trap cleanup EXIT INT TERM
ip netns add ${tag}a && ip netns add ${tag}b &&
ip link add ${tag}x netns ${tag}a type veth peer name ${tag}y netns ${tag}b &&
ip -n ${tag}a addr add 198.18.77.1/24 dev ${tag}x && ip -n ${tag}b addr add 198.18.77.2/24 dev ${tag}y &&
ip -n ${tag}a link set ${tag}x up && ip -n ${tag}b link set ${tag}y up &&
ip -n ${tag}a link set lo up && ip -n ${tag}b link set lo up || skip "cannot make network namespaces here"
mkdir -p "/tmp/$tag"
peers=tcp://198.18.77.1:29500,tcp://198.18.77.1:29501,tcp://198.18.77.2:29502,tcp://198.18.77.2:29503
pids=()
for r in 0 1 2 3; do
    ns=${tag}a; [ $r -ge 2 ] && ns=${tag}b
    ip netns exec $ns env KVPS_RANK=$r KVPS_SIZE=4 KVPS_RING_PEERS=$peers timeout 120 "$rank_bin" >"/tmp/$tag/$r.log" 2>&1 &
    pids+=($!)
done
fail=0
for r in 0 1 2 3; do
    wait "${pids[$r]}" || fail=1
done
cat /tmp/$tag/*.log
left=$(ls /dev/shm 2>/dev/null | grep -c "^kvps-ring-" || true)
if [ $fail -eq 0 ] && [ "$(cat /tmp/$tag/*.log | grep -c ': ok$')" = 4 ]; then
    echo "ok test_ring_netns (2 namespaces x 2 ranks: shared memory inside, TCP between, HIER chosen, sums exact)"
    echo "1 passed, 0 failed"
else
    echo "FAIL test_ring_netns"
    echo "0 passed, 1 failed"
    exit 1
fi
