"""Fashion-MNIST with torch DDP, each gradient bucket all-reduced by kvps (kvps.torch.allreduce_hook).

    make build/libkvps.so; export PYTHONPATH=python KVPS_LIB=build/libkvps.so
    python3 -m torch.distributed.run --redirects 1 --tee 1 --nproc_per_node 2 examples/python/ddp_fmnist.py
    scripts/kvps-run -s 0 -w 2 python3 examples/python/ddp_fmnist.py
    mpirun -n 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 -x PYTHONPATH -x KVPS_LIB python3 examples/python/ddp_fmnist.py

(Debian's torch 1.13 under Python 3.11 needs torchrun's --redirects 1 --tee 1: tests/torchrun_check.sh.)
The kvps ring comes from the launcher's variables (kvps.Ring(): RANK / WORLD_SIZE with MASTER_ADDR /
MASTER_PORT, KVPS_RANK / KVPS_SIZE / KVPS_RING_PEERS from kvps-run, OMPI_COMM_WORLD_* with
MASTER_ADDR / MASTER_PORT or KVPS_RENDEZVOUS under mpirun). DDP's gloo group (its broadcast of the
parameters at the start) is then made through the ring (kvps.torch.init_process_group): rank 0
starts torch's store at a port the kernel picks and tells the others over the ring, so it never
competes with kvps's rendezvous for MASTER_PORT (kvps meets at MASTER_PORT, or at MASTER_PORT + 1
under torchrun, whose agent serves its store at MASTER_PORT: kvps_launch.h, 2.).

A 784-128-10 MLP, SGD with momentum; each rank trains on its own shard of the 60,000 training
images, every rank evaluates its share of the 10,000 test images and the counts are summed over
the ring. Prints, on rank 0, each epoch's mean training loss and test accuracy.
Options: --epochs N (1), --max-steps N (stop an epoch after N steps; 0: the whole epoch),
--batch N (64 per rank), --lr X (0.05), --wire none|fp16|bf16|topk, --data DIR
(/usr/share/datasets/fashion-mnist: Debian's dataset-fashion-mnist).
"""
import argparse
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import kvps
import kvps.torch as kt

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def idx_load(path, magic, ndim):
    """An idx file (gzip'd; big-endian magic, then one u32 per dimension, then uint8 data)."""
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        sys.exit("ddp_fmnist: no %s. The Fashion-MNIST files come with Debian's dataset-fashion-mnist package:\n"
                 "    sudo apt-get install dataset-fashion-mnist\n  (or pass --data DIR)" % path)
    head = struct.unpack(">%dI" % (1 + ndim), raw[:4 + 4 * ndim])
    if head[0] != magic:
        sys.exit("ddp_fmnist: %s: idx magic 0x%08x, expected 0x%08x" % (path, head[0], magic))
    dims = head[1:]
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        sys.exit("ddp_fmnist: %s: %d bytes of data, the header says %s" % (path, data.size, dims))
    return data.reshape(dims)


def load(d, prefix):
    x = idx_load(os.path.join(d, "%s-images-idx3-ubyte.gz" % prefix), 0x00000803, 3)
    y = idx_load(os.path.join(d, "%s-labels-idx1-ubyte.gz" % prefix), 0x00000801, 1)
    x = torch.from_numpy(x.reshape(len(x), -1).astype(np.float32) / 255.0)
    return (x - 0.2860) / 0.3530, torch.from_numpy(y.astype(np.int64))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--wire", default="none", choices=["none", "fp16", "bf16", "topk"])
    ap.add_argument("--data", default=DATA_DIR)
    a = ap.parse_args()

    ring = kvps.Ring(timeout_ms=120000)
    store = kt.init_process_group(ring)  # DDP's gloo group, met through the ring
    rank, size = ring.rank, ring.size
    xtr, ytr = load(a.data, "train")
    xte, yte = load(a.data, "t10k")

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    model = torch.nn.parallel.DistributedDataParallel(net)  # broadcasts rank 0's parameters (gloo)
    state = kt.RingState(ring, wire=None if a.wire == "none" else a.wire)
    model.register_comm_hook(state, kt.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    if rank == 0:
        print("ddp_fmnist: %d ranks, %d parameters, batch %d per rank, wire %s" %
              (size, sum(p.numel() for p in net.parameters()), a.batch, a.wire), flush=True)

    for epoch in range(a.epochs):
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(1000 + epoch)  # the same permutation on every rank
        mine = torch.randperm(len(xtr), generator=g)[rank::size]
        steps = len(mine) // a.batch
        if a.max_steps:
            steps = min(steps, a.max_steps)
        model.train()
        tot = np.zeros(2, np.float64)  # loss sum, batches
        for s in range(steps):
            ix = mine[s * a.batch:(s + 1) * a.batch]
            loss = F.cross_entropy(model(xtr[ix]), ytr[ix])
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += (loss.item(), 1)
        model.eval()
        with torch.no_grad():
            te = torch.arange(rank, len(xte), size)
            correct = (net(xte[te]).argmax(1) == yte[te]).sum().item()
        m = np.array([tot[0], tot[1], correct, len(te)], np.float64)
        ring.allreduce(m)  # over every rank
        if rank == 0:
            print("epoch %d: %d steps per rank, train loss %.4f, test accuracy %.4f (%d / %d), %.1f s" %
                  (epoch + 1, steps, m[0] / m[1], m[2] / m[3], m[2], m[3], time.perf_counter() - t0), flush=True)
    torch.distributed.destroy_process_group()
    ring.close()
    del store


if __name__ == "__main__":
    main()
