#!/usr/bin/env bash
# test_ring_netns - the hierarchical ring across real network namespaces (kvps_ring.h section
# 10): 2 hosts x 2 ranks, hosts being two network namespaces joined by a veth pair, addressed
# 198.18.77.1 and 198.18.77.2 (198.18.0.0/15, for tests). Ranks on one host talk through shared
# memory, the hosts over TCP, the ring finds the hosts by itself; build/ring_hier_rank checks the
# transports, the algorithm AUTO picks, and exact sums. Needs root and ip(8): elsewhere it says
# "skipped". Everything it makes is removed on exit. The same job formed again from one rendezvous
# address with KVPS_IFNAME choosing the veth (kvps_launch.h), and refused when rank 3 advertises
# a loopback address.
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
# run_job NAME VARS...: the 4 ranks (0, 1 in namespace a; 2, 3 in b), each with "KVPS_RANK=r
# VARS"; rank 3 also with $R3 (extra variables); logs in /tmp/$tag/NAME-r.log; returns how many
# ranks failed.
run_job() {
    local name=$1; shift
    local pids=() bad=0
    for r in 0 1 2 3; do
        ns=${tag}a; [ $r -ge 2 ] && ns=${tag}b
        extra=""; [ $r = 3 ] && extra=${R3:-}
        ip netns exec $ns env KVPS_RANK=$r KVPS_SIZE=4 KVPS_RENDEZVOUS_TIMEOUT=30 "$@" $extra timeout 120 "$rank_bin" \
            >"/tmp/$tag/$name-$r.log" 2>&1 &
        pids+=($!)
    done
    for r in 0 1 2 3; do wait "${pids[$r]}" || bad=$((bad + 1)); done
    return $bad
}
pass=0 fail=0
# 1. the peers listed by hand
if run_job peers KVPS_RING_PEERS=$peers && [ "$(cat /tmp/$tag/peers-*.log | grep -c ': ok$')" = 4 ]; then
    echo "ok test_ring_netns (2 namespaces x 2 ranks: shared memory inside, TCP between, HIER chosen, sums exact)"; pass=$((pass + 1))
else
    cat /tmp/$tag/peers-*.log; echo "FAIL test_ring_netns (peers listed)"; fail=$((fail + 1))
fi
# 2. one rendezvous address (rank 0's, on the veth), KVPS_IFNAME choosing the veth on both hosts
if run_job rdv MASTER_ADDR=198.18.77.1 MASTER_PORT=29600 KVPS_IFNAME=$tag &&
   [ "$(cat /tmp/$tag/rdv-*.log | grep -c ': ok$')" = 4 ]; then
    echo "ok test_ring_netns rendezvous (MASTER_ADDR/MASTER_PORT alone, KVPS_IFNAME=$tag: the same job, sums exact)"; pass=$((pass + 1))
else
    cat /tmp/$tag/rdv-*.log; echo "FAIL test_ring_netns rendezvous"; fail=$((fail + 1))
fi
# 3. rank 3 advertises loopback (KVPS_IFNAME=lo) in a job across two hosts: every rank refuses,
#    naming rank 3's host and address
R3=KVPS_IFNAME==lo run_job lo MASTER_ADDR=198.18.77.1 MASTER_PORT=29601 KVPS_IFNAME=$tag
bad=$?
named=$(grep -l "rank 3 on host $(hostname) advertises tcp://127.0.0.1:[0-9]*, a loopback address" /tmp/$tag/lo-*.log | wc -l)
if [ $bad = 4 ] && [ "$named" = 4 ]; then
    echo "ok test_ring_netns loopback refused (every rank: 'rank 3 on host $(hostname) advertises tcp://127.0.0.1:...')"; pass=$((pass + 1))
else
    cat /tmp/$tag/lo-*.log; echo "FAIL test_ring_netns loopback: $bad ranks failed, $named named it"; fail=$((fail + 1))
fi
echo "$pass passed, $fail failed"
[ $fail = 0 ]
