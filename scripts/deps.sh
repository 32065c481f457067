#!/usr/bin/env bash
# Installs what kvps needs on Debian (as root), or prints the exact install line and fails.
# usage: scripts/deps.sh [build|demo|mpi|clang|ssh|python]   (clang: for make fuzz and make tsan-test;
#                                                  ssh: for make ssh-check; python: numpy and venv for test_python)
set -u
want="build"; [ $# -gt 0 ] && want="$1"
missing=()
have_pc() { pkg-config --exists "$1" 2>/dev/null; }
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
have_pc libzmq || missing+=(libzmq3-dev)
have_pc libczmq || missing+=(libczmq-dev)
have_pc zlib || missing+=(zlib1g-dev)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v python3 >/dev/null 2>&1 || missing+=(python3) # test_timeline reads the JSON back; kvps-timeline
if [ "$want" = demo ]; then
  [ -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ] || missing+=(dataset-fashion-mnist)
fi
if [ "$want" = mpi ]; then
  command -v mpicc >/dev/null 2>&1 || missing+=(openmpi-bin libopenmpi-dev)
fi
if [ "$want" = clang ]; then
  command -v clang >/dev/null 2>&1 || missing+=(clang)
  # libFuzzer and the sanitizer runtimes
  clang -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null | grep -q / &&
    [ -f "$(clang -print-resource-dir 2>/dev/null)/lib/linux/libclang_rt.fuzzer-x86_64.a" ] || missing+=(libclang-rt-dev)
fi
if [ "$want" = ssh ]; then
  [ -x /usr/sbin/sshd ] || command -v sshd >/dev/null 2>&1 || missing+=(openssh-server)
  command -v ssh >/dev/null 2>&1 || missing+=(openssh-client)
fi
if [ "$want" = python ]; then # Debian's python3 (test_python prefers it): numpy, and venv for its pip install check
  /usr/bin/python3 -c 'import numpy' >/dev/null 2>&1 || missing+=(python3-numpy)
  /usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
fi
[ ${#missing[@]} -eq 0 ] && exit 0
line="apt-get install -y ${missing[*]}"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  # make -j may start several of us at once (deps, deps-demo, fuzz-cc): one apt-get at a time
  if command -v flock >/dev/null 2>&1; then exec 9>"${TMPDIR:-/tmp}/kvps-deps.lock" && flock 9; fi
  echo "kvps: installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null 2>&1 || true
  if apt-get install -y -qq "${missing[@]}" >/tmp/kvps-apt.log 2>&1; then exit 0; fi
  echo "kvps: '$line' failed; see /tmp/kvps-apt.log" >&2
  exit 1
fi
echo "kvps: missing packages. Run as root:" >&2
echo "    sudo $line" >&2
exit 1
