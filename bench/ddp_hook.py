"""DDP step time with kvps's all-reduce hook next to DDP's own Gloo all-reduce, in the same run.

    make build/libkvps.so
    KVPS_LIB=build/libkvps.so PYTHONPATH=python /usr/bin/python3 bench/ddp_hook.py
        [--ranks 2,4] [--models mlp,resnet50] [--steps 20] [--repeats 4] [--warmup 3] [--wire none]

For each rank count a job of that many processes on 127.0.0.1 (RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT; the kvps ring from them, DDP's gloo group through the ring:
kvps.torch.init_process_group). Each process builds every model twice, the same seed: one DDP
with kvps.torch.allreduce_hook registered, one DDP as it is (its C++ reducer's gloo all-reduce),
and times them alternately, kvps then gloo, --repeats times: each timed run is --steps steps
(forward, backward with the buckets' all-reduce, SGD step) between two barriers, after
--warmup untimed steps of each. Rank 0 prints each run's mean step time, then per config the
range (min-max) of the runs for each, and the kvps/gloo ratio of the medians and its range over
the paired runs. Every figure printed is measured in this run; nothing else is printed as one.
  mlp       784-100-10 (79,510 parameters), batch 32 of random inputs: small buckets, latency
  resnet50  ResNet-50's 161 parameter tensors (25,557,032 floats, bench/resnet50.h's list: each
            convolution's weight, its batch norm's weight and bias, the fc last) as
            nn.Parameters of a module whose forward touches each once (sum(p * c)): the
            gradients are constants, so the step is DDP's bucketing and all-reduce of 102 MB,
            not ResNet-50's arithmetic (that compute would be the same for both)
Threads: each process runs torch with 1 thread (OMP_NUM_THREADS=1), as torchrun sets it.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))


def resnet50_sizes():
    """bench/resnet50.h's resnet50_sizes, in Python: 161 tensors, 25,557,032 floats."""
    blocks, planes = (3, 4, 6, 3), (64, 128, 256, 512)
    out, cin = [64 * 3 * 7 * 7, 64, 64], 64
    for l in range(4):
        for b in range(blocks[l]):
            p = planes[l]
            o = 4 * p
            out += [cin * p, p, p, p * p * 9, p, p, p * o, o, o]
            if b == 0:
                out += [cin * o, o, o]
            cin = o
    out += [2048 * 1000, 1000]
    assert len(out) == 161 and sum(out) == 25557032
    return out


def make_model(name):
    import torch
    if name == "mlp":
        net = torch.nn.Sequential(torch.nn.Linear(784, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
        x = torch.randn(32, 784)
        y = torch.randint(0, 10, (32,))

        def loss_fn(model):
            return torch.nn.functional.cross_entropy(model(x), y)
        return net, loss_fn

    class ParamList(torch.nn.Module):
        """ResNet-50's parameter tensors; forward touches each once."""

        def __init__(self, sizes):
            super().__init__()
            self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(n) * 0.01) for n in sizes])

        def forward(self, c):
            return sum((p * c).sum() for p in self.ps)
    net = ParamList(resnet50_sizes())
    c = torch.tensor(1e-3)

    def loss_fn(model):
        return model(c)
    return net, loss_fn


def child(a):
    import torch
    import kvps
    import kvps.torch as kt
    torch.set_num_threads(1)
    ring = kvps.Ring(timeout_ms=300000)
    store = kt.init_process_group(ring)
    rank, size = ring.rank, ring.size
    for name in a.models.split(","):
        models = {}
        for kind in ("kvps", "gloo"):
            torch.manual_seed(0)
            net, loss_fn = make_model(name)
            ddp = torch.nn.parallel.DistributedDataParallel(net)
            if kind == "kvps":
                ddp.register_comm_hook(kt.RingState(ring, wire=None if a.wire == "none" else a.wire), kt.allreduce_hook)
            opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
            models[kind] = (ddp, loss_fn, opt)

        def steps(kind, k):
            ddp, loss_fn, opt = models[kind]
            for _ in range(k):
                opt.zero_grad()
                loss_fn(ddp).backward()
                opt.step()
        for kind in ("kvps", "gloo"):
            steps(kind, a.warmup)
        times = {"kvps": [], "gloo": []}
        for rep in range(a.repeats):
            for kind in ("kvps", "gloo"):
                ring.barrier()
                t0 = time.perf_counter()
                steps(kind, a.steps)
                ring.barrier()
                times[kind].append((time.perf_counter() - t0) / a.steps)
                if rank == 0:
                    print("run %d %-4s ranks %d %-8s %.3f ms/step" % (rep + 1, kind, size, name, 1e3 * times[kind][-1]),
                          flush=True)
        if rank == 0:
            nparams = sum(p.numel() for p in models["kvps"][0].parameters())
            k, g = times["kvps"], times["gloo"]
            ratios = [x / y for x, y in zip(k, g)]
            print("RESULT ranks %d %s (%d parameters, %d steps x %d runs each, alternated): kvps hook %.3f-%.3f ms/step, "
                  "gloo %.3f-%.3f ms/step, kvps/gloo %.2f (median of runs; paired runs %.2f-%.2f)" %
                  (size, name, nparams, a.steps, a.repeats, 1e3 * min(k), 1e3 * max(k), 1e3 * min(g), 1e3 * max(g),
                   statistics.median(k) / statistics.median(g), min(ratios), max(ratios)), flush=True)
        del models
    torch.distributed.destroy_process_group()
    ring.close()
    del store


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--models", default="mlp,resnet50")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--wire", default="none", choices=["none", "fp16", "bf16", "topk"])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    for m in a.models.split(","):
        if m not in ("mlp", "resnet50"):
            ap.error("--models: %r is not mlp or resnet50" % m)
    if a.steps < 1 or a.repeats < 1 or a.warmup < 0:
        ap.error("--steps and --repeats at least 1, --warmup at least 0")
    if a.child:
        child(a)
        return 0
    sys.path.insert(0, os.path.join(ROOT, "python"))
    rc = 0
    for size in [int(x) for x in a.ranks.split(",")]:
        port = free_port()
        procs = []
        for r in range(size):
            env = dict(os.environ)
            env.update({"RANK": str(r), "WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                        "OMP_NUM_THREADS": "1", "PYTHONPATH": os.path.join(ROOT, "python")})
            for v in ("KVPS_RING_PEERS", "KVPS_RANK", "KVPS_SIZE", "KVPS_RENDEZVOUS", "TORCHELASTIC_USE_AGENT_STORE"):
                env.pop(v, None)
            args = [sys.executable, os.path.abspath(__file__), "--child", "--models", a.models, "--steps", str(a.steps),
                    "--repeats", str(a.repeats), "--warmup", str(a.warmup), "--wire", a.wire]
            procs.append(subprocess.Popen(args, env=env, stdout=None if r == 0 else subprocess.DEVNULL))
        for p in procs:
            rc |= p.wait()
    return 1 if rc else 0


if __name__ == "__main__":
    sys.exit(main())
