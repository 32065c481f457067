#!/usr/bin/env bash
# The `make demo` run: a one-hidden-layer MLP learns Fashion-MNIST with 4 worker processes
# pushing gradients to 2 kvps servers that hold the weights (BSP, TCP on 127.0.0.1). build/fmnist
# forks the whole cluster itself; --target makes the run fail below 0.87 test accuracy.
# usage: scripts/demo.sh [BUILD_DIR] [extra fmnist options...]
set -u
dir=${1:-build}
[ $# -gt 0 ] && shift
bin="$dir/fmnist"
if [ ! -x "$bin" ]; then
  echo "demo: $bin is missing: run 'make demo' (or 'make $bin')" >&2
  exit 1
fi
args=(--model mlp --servers 2 --workers 4 --target 0.87 "$@")
echo "== kvps demo: Fashion-MNIST, MLP 784-128-10, plain SGD on the servers, BSP"
echo "== 2 server + 4 worker processes on 127.0.0.1; defaults: 15 epochs, global batch 128, lr 0.3 (cosine decay)"
echo "== $bin ${args[*]}"
exec "$bin" "${args[@]}"
