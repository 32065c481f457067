#!/usr/bin/env bash
# tests/ssh_check.sh - the --host-file paths over real ssh: kvps-run and bench/ethernet.sh.
#
# usage: tests/ssh_check.sh        (root; `make ssh-check`)
#
# Emulated machines: five network namespaces joined by veth pairs to a bridge, addresses
# 198.19.7.1.. (198.18.0.0/15, the benchmarking range), each link shaped with tbf to 1 Gbit/s
# both ways, and an OpenSSH server in each namespace with a host key and an authorized client
# key made for this run (nothing under ~/.ssh or /etc/ssh is read or changed). The client runs
# here, through a wrapper that gives ssh this run's config. Checks:
#   1. kvps-run --host-file starts ring_allreduce on the hosts over ssh: every rank exact;
#   2. kvps-run --host-file runs fmnist's parameter-server mode (servers and workers on different
#      hosts) when the dataset is installed;
#   3. bench/ethernet.sh --host-file runs claims 1 (m = 1, 2, 4) and 3 (rings of 2 and 4) across
#      the hosts, every claim judged, and measures the shaped link (raw TCP goodput between 0.85
#      and 1.0 Gbit/s; the PASS/MISS verdicts themselves are the benchmark's business);
#   4. a failing remote program makes kvps-run fail with its exit code.
# Everything is removed on exit, on failure and on Ctrl-C. Ends with "N passed, N failed";
# exits 77 (skipped) where it cannot run: not root, no sshd (apt-get install openssh-server), or
# no bridge can be made (a container without CAP_NET_ADMIN).
set -u
cd "$(dirname "$0")/.." || exit 1
NHOSTS=5 # ethernet.sh: a server host + 4 workers for claim 1, rings of 2 and 4 for claim 3
tag=kvs$$
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
skip() { echo "skipped: $1"; echo "0 passed, 0 failed, 1 skipped"; exit 77; }

[ "$(id -u)" = 0 ] || skip "needs root (ip netns, tc, sshd)"
SSHD=$(command -v sshd || echo /usr/sbin/sshd)
[ -x "$SSHD" ] || skip "no sshd: apt-get install -y openssh-server"
command -v ssh >/dev/null || skip "no ssh: apt-get install -y openssh-client"
for b in build/ring_allreduce build/fmnist build/ps_peer build/ring_peer; do
    [ -x "$b" ] || { echo "build $b first (make all)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/kvps-ssh.XXXXXX) || exit 1
chmod 755 "$work"
cleanup() {
    for i in $(seq 0 $((NHOSTS - 1))); do
        [ -f "$work/sshd$i.pid" ] && kill "$(cat "$work/sshd$i.pid")" 2>/dev/null
        for p in $(ip netns pids ${tag}h$i 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
        ip netns del ${tag}h$i 2>/dev/null
        ip link del ${tag}v$i 2>/dev/null
    done
    ip link del ${tag}br 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- hosts: namespaces on a bridge, 1 Gbit/s links ------------------------------------------
ip link add ${tag}br type bridge 2>/dev/null || skip "cannot create a bridge here (no CAP_NET_ADMIN?)"
ip addr add 198.19.7.254/24 dev ${tag}br && ip link set ${tag}br up || { echo "cannot set up the bridge" >&2; exit 1; }
ADDR=()
for i in $(seq 0 $((NHOSTS - 1))); do
    ns=${tag}h$i a=198.19.7.$((i + 1))
    ADDR+=("$a")
    ip netns add $ns &&
    ip link add ${tag}v$i type veth peer name ${tag}p$i &&
    ip link set ${tag}p$i netns $ns &&
    ip link set ${tag}v$i master ${tag}br up &&
    ip -n $ns addr add $a/24 dev ${tag}p$i &&
    ip -n $ns link set ${tag}p$i up &&
    ip -n $ns link set lo up &&
    tc qdisc add dev ${tag}v$i root tbf rate 1gbit burst 256kb latency 50ms &&
    ip netns exec $ns tc qdisc add dev ${tag}p$i root tbf rate 1gbit burst 256kb latency 50ms ||
        { echo "cannot set up host $i" >&2; exit 1; }
done

# ---- ssh: keys, a server per namespace, a client wrapper ------------------------------------
ssh-keygen -q -t ed25519 -N '' -f "$work/host_key" && ssh-keygen -q -t ed25519 -N '' -f "$work/client_key" ||
    { echo "ssh-keygen failed" >&2; exit 1; }
cp "$work/client_key.pub" "$work/authorized_keys"
mkdir -p /run/sshd 2>/dev/null # privilege separation directory sshd insists on
for i in $(seq 0 $((NHOSTS - 1))); do
    ip netns exec ${tag}h$i "$SSHD" -f /dev/null -o ListenAddress="${ADDR[i]}" -o Port=22 \
        -o HostKey="$work/host_key" -o AuthorizedKeysFile="$work/authorized_keys" -o PidFile="$work/sshd$i.pid" \
        -o PermitRootLogin=prohibit-password -o PasswordAuthentication=no -o KbdInteractiveAuthentication=no \
        -o UsePAM=no -o StrictModes=no -o MaxStartups=100 -o MaxSessions=100 -o AcceptEnv='KVPS_*' \
        -E "$work/sshd$i.log" || { echo "sshd did not start in host $i" >&2; exit 1; }
done
cat >"$work/ssh_config" <<EOF
Host 198.19.7.*
    User root
    IdentityFile $work/client_key
    IdentitiesOnly yes
    UserKnownHostsFile /dev/null
    StrictHostKeyChecking no
    LogLevel ERROR
    ConnectTimeout 5
EOF
mkdir -p "$work/bin"
printf '#!/bin/sh\nexec %s -F %s "$@"\n' "$(command -v ssh)" "$work/ssh_config" >"$work/bin/ssh"
chmod 755 "$work/bin/ssh"
export PATH="$work/bin:$PATH"
for i in $(seq 0 $((NHOSTS - 1))); do # sshd is up when a command runs through it
    for _ in $(seq 50); do
        ssh -n -o BatchMode=yes "${ADDR[i]}" true 2>/dev/null && break
        sleep 0.1
    done
done
if ssh -n -o BatchMode=yes "${ADDR[0]}" "ip -4 -o addr show | grep -q ${ADDR[0]}"; then
    ok "ssh reaches host 0, and its commands run in host 0's namespace"
else
    bad "ssh to ${ADDR[0]}"; cat "$work"/sshd0.log; exit 1
fi

# ---- 1. kvps-run --host-file: ring_allreduce over ssh ------------------------------------------
printf '# emulated machines\n%s\n%s\n%s\n' "${ADDR[0]}" "${ADDR[1]}" "${ADDR[2]}" >"$work/run_hosts"
out=$(timeout 120 scripts/kvps-run -s 0 -w 3 --timeout 60 --host-file "$work/run_hosts" -- "$PWD/build/ring_allreduce" 2>&1)
rc=$?
n=$(printf '%s\n' "$out" | grep -c "all-reduce of 1000000 floats: ok")
if [ $rc -eq 0 ] && [ "$n" -eq 3 ]; then
    ok "kvps-run --host-file: ring_allreduce on 3 hosts over ssh, every rank exact"
else
    bad "kvps-run --host-file ring_allreduce: exit $rc, $n of 3 ranks ok"; printf '%s\n' "$out" | tail -20
fi

# ---- 2. kvps-run --host-file: fmnist with servers and workers on different hosts --------------
if [ -r /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ]; then
    out=$(timeout 200 scripts/kvps-run -s 1 -w 2 --timeout 150 --host-file "$work/run_hosts" -- \
        "$PWD/build/fmnist" --model softmax --epochs 1 --mode bsp 2>&1)
    rc=$?
    # the epoch line: epoch, loss, train accuracy, test accuracy, ...
    acc=$(printf '%s\n' "$out" | awk '/^\[worker 0\] +1 / { sub(/^\[worker 0\] +/, ""); print $4 }' | tail -1)
    if [ $rc -eq 0 ] && [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a >= 0.75) }'; then
        ok "kvps-run --host-file: fmnist bsp, 1 server + 2 workers over ssh, test accuracy $acc"
    else
        bad "kvps-run --host-file fmnist: exit $rc, accuracy '${acc}'"; printf '%s\n' "$out" | tail -20
    fi
else
    echo "skipped: fmnist over ssh (no dataset-fashion-mnist)"
fi

# ---- 3. bench/ethernet.sh --host-file: claims 1 and 3 across the hosts -------------------------
printf '# SSH_TARGET DATA_ADDRESS\n' >"$work/eth_hosts"
for a in "${ADDR[@]}"; do printf '%s %s\n' "$a" "$a" >>"$work/eth_hosts"; done
out=$(timeout 400 bench/ethernet.sh --host-file "$work/eth_hosts" --rate 1gbit --quick --only 1,3 --bytes 4194304 \
    --out "$work/eth" 2>&1)
rc=$?
printf '%s\n' "$out" | grep -E "^# link|^claim" | sed 's/^/    /'
goodput=$(printf '%s\n' "$out" | sed -n 's/^# link: raw TCP goodput B = \([0-9.]*\) Gbit.*/\1/p')
c1=$(printf '%s\n' "$out" | grep -c "^claim 1:")
c3=$(printf '%s\n' "$out" | grep "^claim 3" | grep -vc "n/a")
if [ $rc -eq 0 ] && [ "$c1" -ge 1 ] && [ "$c3" -eq 3 ] && [ -n "$goodput" ] &&
    awk -v g="$goodput" 'BEGIN { exit !(g >= 0.85 && g <= 1.0) }' && [ -s "$work/eth/ethernet_real-1gbit_claim1.csv" ]; then
    ok "ethernet.sh --host-file: claims 1 and 3 measured over ssh, link goodput $goodput Gbit/s"
else
    bad "ethernet.sh --host-file: exit $rc, goodput '${goodput}'"; printf '%s\n' "$out" | tail -30
fi
left=0
for i in $(seq 0 $((NHOSTS - 1))); do # nothing of the bench left behind on the hosts
    for p in $(ip netns pids ${tag}h$i); do
        case "$(cat /proc/$p/comm 2>/dev/null)" in ps_peer|ring_peer|timeout) left=$((left + 1));; esac
    done
done
[ $left -eq 0 ] && ok "ethernet.sh left no process on the hosts" || bad "ethernet.sh left $left processes on the hosts"

# ---- 4. a failing remote program fails the job ----------------------------------------------
out=$(timeout 60 scripts/kvps-run -s 0 -w 2 --host-file "$work/run_hosts" -- sh -c 'exit $((3 + KVPS_RANK))' 2>&1)
rc=$?
[ $rc -eq 3 ] || [ $rc -eq 4 ] && ok "kvps-run --host-file: a remote exit code comes back ($rc)" ||
    { bad "remote failure: exit $rc, want 3 or 4"; printf '%s\n' "$out" | tail -10; }

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
