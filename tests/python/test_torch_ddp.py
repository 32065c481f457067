"""kvps.torch's DDP hook (python/kvps/torch/ddp.py) against PyTorch's own DDP and numpy oracles.

    KVPS_LIB=build/libkvps.so PYTHONPATH=python /usr/bin/python3 tests/python/test_torch_ddp.py
    (make python-check runs it: tests/python_check.sh)

Jobs are this file run again as child processes (--child KIND) on 127.0.0.1 with RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT; each child makes a kvps.Ring from them and DDP's gloo group
through it (kvps.torch.init_process_group), prints "ok NAME" / "FAIL NAME: why" lines, and a
check passes when every rank said ok and every process exited 0 within the job's bound.
  - 2 ranks: an MLP of 79,510 parameters (784-100-10), the same seeds and data, 200 SGD steps
    with momentum, once with kvps.torch.allreduce_hook and once with DDP's own gloo all-reduce
    (no hook), several buckets (bucket_cap_mb 0.1): the final parameters bit-identical. Every
    rank's final parameters bit-identical to every other's.
  - 3 and 4 ranks: the same training; what holds there: every rank's parameters bit-identical
    to the others' (kvps's all-reduce gives every rank the same bits), and one bucket of random
    floats averaged within the float32 summation bound of the exact (float64) mean; the
    training ends within 1e-4 of gloo's (measured 1.9e-7: kvps and gloo add 3 or 4 terms in
    different orders; printed).
  - the 16-bit wires: a bucket averaged with wire "fp16" / "bf16" against the exact float64
    mean within the tolerance ddp.py documents, the same bits on every rank; a short training
    with the bf16 wire lowers the loss.
  - top-k: two steps against a numpy replay (each rank's top k of bucket + residual, summed in
    rank order, times 1/n; the residuals), bit for bit.
  - the process group "kvps" (init_process_group("kvps"), 2 and 3 ranks): all_reduce (sum, max,
    min, product on int64, exact; avg on float64), broadcast from every rank, all_gather, reduce,
    barrier against torch on the same inputs; a non-contiguous tensor and a collective it lacks
    raise; DDP's own reducer on it 200 steps bit-identical to DDP on a gloo group with 2 ranks,
    the same parameters on every rank with 3 (how far from gloo's printed).
  - examples/python/ddp_fmnist.py under torchrun, 2 ranks, 150 steps (dense and top-k): test
    accuracy above 0.78 and 0.70 (measured 0.83 and 0.77) (skipped without Debian's dataset-fashion-mnist).
  - errors: a non-contiguous, a non-CPU (meta), an integer bucket, a float64 bucket with a
    16-bit wire, a bad wire name, a state that is not a RingState: kvps.InvalidArgument naming it.
"""
import os
import signal
import subprocess
import sys
import time

import numpy as np
from kt import results, say, check, free_port, clean_env  # noqa: E402  (tests/python/kt.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BOUND_S = 300
STEPS = 200

# ---- the child side ---------------------------------------------------------------------------


def batch(rank, step, n=32):
    """Rank rank's batch at step: inputs from a seeded generator, labels from a fixed random teacher."""
    import torch
    g = torch.Generator().manual_seed(1000 * rank + step + 1)
    x = torch.randn(n, 784, generator=g)
    teacher = torch.Generator().manual_seed(7)
    w = torch.randn(784, 10, generator=teacher)
    y = (x @ w).argmax(1)
    return x, y


def train(rank, state=None, steps=STEPS, seed=0):
    import torch
    import torch.nn.functional as F
    import kvps.torch as kt
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(784, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.1)
    if state is not None:
        model.register_comm_hook(state, kt.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = batch(rank, step)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.detach().clone() for p in model.parameters()], losses


def flat(params):
    import torch
    return torch.cat([p.reshape(-1) for p in params]).numpy()


def same_on_every_rank(ring, a):
    """a's bits on every rank, compared through the ring (allgather of the bits as int32)."""
    bits = np.ascontiguousarray(a).view(np.int32)
    allb = ring.allgather(bits).reshape(ring.size, -1)
    return all(np.array_equal(allb[0], allb[q]) for q in range(1, ring.size))


class FakeBucket:
    """What DDP's GradBucket gives a hook (buffer, index), around any tensor."""

    def __init__(self, t, index=0):
        self.t, self.i = t, index

    def buffer(self):
        return self.t

    def index(self):
        return self.i


def rank_grads(rank, count, step=0):
    """Rank rank's gradient-like bucket: normal, scale 1e-2, some larger, some tiny."""
    rs = np.random.RandomState(100 * rank + step + 11)
    g = rs.standard_normal(count).astype(np.float32) * np.float32(1e-2)
    g[::97] *= np.float32(300)
    g[::89] *= np.float32(1e-4)
    return g


def child_ddp():
    import torch
    import kvps
    import kvps.torch as kt
    torch.set_num_threads(1)
    ring = kvps.Ring(timeout_ms=120000)
    store = kt.init_process_group(ring)
    n, r = ring.size, ring.rank

    # training: the hook against gloo, the same seeds and data
    pk, lk = train(r, kt.RingState(ring))
    pg, lg = train(r, None)
    fk, fg = flat(pk), flat(pg)
    say(fk.size == 79510, "the MLP has 79510 parameters", str(fk.size))
    say(same_on_every_rank(ring, fk), "%d ranks: the hook's final parameters bit-identical on every rank" % n)
    say(lk[-1] < lk[0] * 0.8, "%d ranks: the hook's training lowers the loss" % n, "%.4f -> %.4f" % (lk[0], lk[-1]))
    ident = np.array_equal(fk.view(np.int32), fg.view(np.int32))
    diff = float(np.max(np.abs(fk.astype(np.float64) - fg)))
    ndiff = int(np.count_nonzero(fk.view(np.int32) != fg.view(np.int32)))
    if n == 2:
        say(ident, "2 ranks: %d steps with the kvps hook bit-identical to DDP's gloo all-reduce" % STEPS,
            "%d of %d parameters differ, by up to %.3g" % (ndiff, fk.size, diff))
    else:
        print("info %d ranks: after %d steps the hook's parameters %s gloo's (%d of %d differ, by up to %.3g; "
              "losses %.6f and %.6f)" % (n, STEPS, "are bit-identical to" if ident else "differ from", ndiff, fk.size,
                                         diff, lk[-1], lg[-1]), flush=True)
        # measured 1.9e-7 with 3 and 4 ranks (the order of the sum); dividing by 3 instead of
        # multiplying by 1/3 as DDP's reducer does ended 0.021 away
        say(np.isfinite(fk).all() and diff < 1e-4, "%d ranks: the hook's parameters within 1e-4 of gloo's after %d steps"
            % (n, STEPS), "up to %.3g apart" % diff)

    # one dense bucket against the exact mean: the float32 summation bound
    cnt = 70001
    xs = [rank_grads(q, cnt) for q in range(n)]
    t = torch.from_numpy(xs[r].copy())
    ptr = t.data_ptr()
    out = kt.allreduce_hook(kt.RingState(ring), FakeBucket(t)).wait()
    exact = np.sum(np.stack(xs).astype(np.float64), axis=0) / n
    mag = np.sum(np.abs(np.stack(xs).astype(np.float64)), axis=0) / n
    err = np.abs(out.numpy().astype(np.float64) - exact)
    bound = (n + 1) * 2.0 ** -24 * mag
    say(out.data_ptr() == ptr, "the hook reduces the bucket where it lies (same data pointer) and returns it")
    say(bool(np.all(err <= bound)), "dense bucket within (n+1) 2^-24 mean|g| of the exact mean",
        "%d elements beyond" % int(np.count_nonzero(err > bound)))
    say(same_on_every_rank(ring, out.numpy()), "dense bucket: the same bits on every rank")

    # the 16-bit wires against the exact mean, within the documented tolerance
    for wire, eps in (("fp16", 2.0 ** -10), ("bf16", 2.0 ** -7)):
        t = torch.from_numpy(xs[r].copy())
        out = kt.allreduce_hook(kt.RingState(ring, wire=wire), FakeBucket(t)).wait()
        got = out.numpy().astype(np.float64)
        tol = (n + 1) * eps * mag + n * 2.0 ** -24
        bad = int(np.count_nonzero(np.abs(got - exact) > tol))
        say(bad == 0, "wire %s: within (n+1) eps mean|g| + n 2^-24 of the exact mean" % wire,
            "%d elements beyond; worst %.3g" % (bad, float(np.max(np.abs(got - exact) - tol))))
        say(same_on_every_rank(ring, out.numpy()), "wire %s: the same bits on every rank" % wire)
        far = float(np.max(np.abs(got - exact) / (mag + 1e-30)))
        say(far > 0, "wire %s: the result is not float32's (the wire rounds: worst relative %.2g)" % (wire, far))

    # top-k against a numpy replay, two steps (error feedback)
    cnt = 5000
    st = kt.RingState(ring, wire="topk", topk_ratio=0.01)
    k = max(1, int(0.01 * cnt))
    res = [np.zeros(cnt, np.float32) for _ in range(n)]
    for step in range(2):
        gs = [rank_grads(q, cnt, step + 1) for q in range(n)]
        want = np.zeros(cnt, np.float32)
        for q in range(n):
            v = gs[q] + res[q]
            keep = np.argsort(-np.abs(v), kind="stable")[:k]
            for i in np.sort(keep):
                want[i] = want[i] + v[i]
            res[q] = v.copy()
            res[q][keep] = 0
        want = want * np.float32(1.0 / n)  # the hook averages as DDP does: times 1/n in float32
        t = torch.from_numpy(gs[r].copy())
        out = kt.allreduce_hook(st, FakeBucket(t, 3)).wait().numpy()
        say(np.array_equal(out.view(np.int32), want.view(np.int32)),
            "top-k step %d: bit-identical to the numpy replay (k %d of %d per rank)" % (step + 1, k, cnt),
            "%d elements differ" % int(np.count_nonzero(out != want)))
        say(np.array_equal(st.residuals[3].numpy(), res[r]), "top-k step %d: this rank's residual as the replay's" % (step + 1))

    # the bf16 wire in training
    pb, lb = train(r, kt.RingState(ring, wire="bf16"), steps=60)
    say(lb[-1] < lb[0] * 0.8 and same_on_every_rank(ring, flat(pb)),
        "wire bf16: 60 DDP steps lower the loss, the same parameters on every rank", "%.4f -> %.4f" % (lb[0], lb[-1]))

    # errors, raised before anything is sent (every rank raises alike)
    def raises(fn, words, name):
        try:
            fn()
        except kvps.InvalidArgument as e:
            say(all(w in str(e) for w in words), name, "message: %s" % e)
            return
        except Exception as e:  # noqa: BLE001
            say(False, name, "raised %s: %s" % (type(e).__name__, e))
            return
        say(False, name, "no error")
    s = kt.RingState(ring)
    raises(lambda: kt.allreduce_hook(s, FakeBucket(torch.zeros(10, 10).t(), 2)), ["bucket 2", "not contiguous"],
           "a non-contiguous bucket raises kvps.InvalidArgument naming it")
    raises(lambda: kt.allreduce_hook(s, FakeBucket(torch.zeros(10, device="meta"), 1)), ["bucket 1", "device meta", "CPU"],
           "a bucket on another device raises kvps.InvalidArgument naming it")
    raises(lambda: kt.allreduce_hook(s, FakeBucket(torch.zeros(10, dtype=torch.int64))), ["bucket 0", "int64"],
           "an int64 bucket raises kvps.InvalidArgument naming its dtype")
    raises(lambda: kt.allreduce_hook(kt.RingState(ring, wire="fp16"), FakeBucket(torch.zeros(10, dtype=torch.float64))),
           ["float64", "float32"], "a float64 bucket with a 16-bit wire raises kvps.InvalidArgument")
    raises(lambda: kt.RingState(ring, wire="int8"), ["int8", "fp16"], "wire 'int8' raises kvps.InvalidArgument naming the choices")
    raises(lambda: kt.allreduce_hook(None, FakeBucket(torch.zeros(3))), ["RingState"], "a state that is not a RingState raises")
    raises(lambda: kt.RingState("ring"), ["kvps.Ring"], "RingState of something else than a kvps.Ring raises")
    ring.barrier()
    import torch.distributed as dist
    dist.destroy_process_group()
    ring.close()
    del store


def train_on(rank, group, steps=STEPS, seed=0):
    """train() on a given process group, DDP's own reducer (no hook)."""
    import torch
    import torch.nn.functional as F
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(784, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.1, process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        x, y = batch(rank, step)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def child_pg():
    """The process group "kvps": init_process_group("kvps") from the launcher's variables."""
    import datetime
    import torch
    import torch.distributed as dist
    import kvps
    import kvps.torch as kt
    torch.set_num_threads(1)
    dist.init_process_group("kvps", timeout=datetime.timedelta(seconds=120))
    n, r = dist.get_world_size(), dist.get_rank()
    say(dist.get_backend() == "kvps" and isinstance(dist.distributed_c10d._get_default_group(), kt.ProcessGroupKvps),
        "init_process_group('kvps') makes a kvps.torch.ProcessGroupKvps", dist.get_backend())
    xs = [torch.from_numpy(rank_data_i(q, 1001)) for q in range(n)]
    for op, ref in ((dist.ReduceOp.SUM, lambda s: s.sum(0)), (dist.ReduceOp.MAX, lambda s: s.max(0).values),
                    (dist.ReduceOp.MIN, lambda s: s.min(0).values), (dist.ReduceOp.PRODUCT, lambda s: s.prod(0))):
        t = xs[r].clone()
        dist.all_reduce(t, op=op)
        say(torch.equal(t, ref(torch.stack(xs))), "dist.all_reduce %s (int64, exact)" % op)
    t = xs[r].double().clone()
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    say(torch.allclose(t, torch.stack(xs).double().mean(0), rtol=0, atol=1e-12), "dist.all_reduce AVG (float64)")
    for root in range(n):
        t = xs[r].float().clone()
        dist.broadcast(t, src=root)
        say(torch.equal(t, xs[root].float()), "dist.broadcast from %d" % root)
    outs = [torch.zeros(1001, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(outs, xs[r])
    say(all(torch.equal(outs[q], xs[q]) for q in range(n)), "dist.all_gather")
    t = xs[r].clone()
    dist.reduce(t, dst=n - 1)
    say(r != n - 1 or torch.equal(t, torch.stack(xs).sum(0)), "dist.reduce to the last rank")
    dist.barrier()
    say(True, "dist.barrier")
    try:
        dist.all_reduce(torch.zeros(10, 10).t())
        say(False, "a non-contiguous tensor raises", "no error")
    except Exception as e:  # noqa: BLE001 (pybind turns the kvps error into RuntimeError)
        say("contiguous" in str(e), "a non-contiguous tensor raises, naming why", str(e)[:200])
    try:
        dist.all_to_all_single(torch.zeros(n), torch.zeros(n))
        say(False, "a collective the kvps group lacks raises", "no error")
    except RuntimeError as e:
        say("kvps does not support" in str(e), "a collective the kvps group lacks raises, naming it", str(e)[:200])
    # DDP on the kvps group against DDP on a gloo group, the same reducer
    gloo = dist.new_group(backend="gloo")
    pk, pg = flat(train_on(r, None)), flat(train_on(r, gloo))
    ring = dist.distributed_c10d._get_default_group().ring
    say(same_on_every_rank(ring, pk), "%d ranks: DDP on the kvps group: the same parameters on every rank" % n)
    ident = np.array_equal(pk.view(np.int32), pg.view(np.int32))
    if n == 2:
        say(ident, "2 ranks: %d DDP steps on the kvps group bit-identical to DDP on a gloo group" % STEPS,
            "%d parameters differ" % int(np.count_nonzero(pk != pg)))
    else:
        print("info %d ranks: DDP on the kvps group %s DDP on gloo after %d steps (%d of %d differ, by up to %.3g)"
              % (n, "is bit-identical to" if ident else "differs from", STEPS, int(np.count_nonzero(pk != pg)), pk.size,
                 float(np.max(np.abs(pk.astype(np.float64) - pg)))), flush=True)
    dist.destroy_process_group()
    ring.close()


def rank_data_i(rank, n):
    """Small integers (int64): sums, products and extremes exact."""
    return ((np.arange(n, dtype=np.int64) * (rank + 3) + 7 * rank) % 5 - 2).astype(np.int64)


CHILDREN = {"ddp": child_ddp, "pg": child_pg}

# ---- the driver -------------------------------------------------------------------------------

def run_job(kind, size):
    port = free_port()
    procs = {}
    for r in range(size):
        env = clean_env()
        env.update({"RANK": str(r), "WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                    "OMP_NUM_THREADS": "1"})
        procs[r] = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", kind], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = {}
    end = time.monotonic() + BOUND_S
    for r, p in procs.items():
        try:
            text, _ = p.communicate(timeout=max(1, end - time.monotonic()))
            out[r] = (p.returncode, text)
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
            out[r] = ("hung (killed after %d s)" % BOUND_S, text)
    return out


def tally(job, out):
    names = {}
    for r, (rc, text) in out.items():
        for line in text.splitlines():
            if line.startswith("ok "):
                names.setdefault(line[3:], []).append((r, True, ""))
            elif line.startswith("FAIL "):
                name, _, why = line[5:].partition(": ")
                names.setdefault(name, []).append((r, False, why))
            elif line.startswith("info ") and r == 0:
                print("%s: %s" % (job, line), flush=True)
    for name, got in names.items():
        bad = [(r, why) for r, ok, why in got if not ok]
        check(not bad, "%s: %s" % (job, name), "; ".join("rank %d: %s" % b for b in bad))
    for r, (rc, text) in out.items():
        check(rc == 0, "%s: rank %d ends by itself (exit 0)" % (job, r),
              "exit %s, output:\n    " % rc + "\n    ".join(text.splitlines()[-15:]))


def test_example():
    """examples/python/ddp_fmnist.py under torchrun, 2 ranks, 150 steps: a sane test accuracy."""
    import re
    name = "examples/python/ddp_fmnist.py under torchrun (2 ranks, 150 steps, wire %s): test accuracy above %.2f"
    if not os.path.exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"):
        print("skip %s: no Debian dataset-fashion-mnist" % (name % ("none", 0.78)), flush=True)
        results["skip"] = results.get("skip", 0) + 1
        return
    for wire, least in (("none", 0.78), ("topk", 0.70)):  # measured: 0.83 and 0.77
        env = clean_env()
        env.update({"PYTHONPATH": os.path.join(ROOT, "python"), "OMP_NUM_THREADS": "1"})
        cmd = [sys.executable, "-m", "torch.distributed.run", "--redirects", "1", "--tee", "1", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               os.path.join(ROOT, "examples", "python", "ddp_fmnist.py"), "--max-steps", "150", "--wire", wire]
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=BOUND_S)
            out, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out, rc = str(e.stdout or ""), "hung"
        m = re.search(r"test accuracy ([0-9.]+)", out)
        acc = float(m.group(1)) if m else -1
        check(rc == 0 and acc > least, name % (wire, least), "exit %s, accuracy %s:\n    %s" % (rc, acc, "\n    ".join(out.splitlines()[-10:])))
        if m:
            print("info example, wire %s: %s" % (wire, out[m.start() - 60:m.end() + 20].splitlines()[-1]), flush=True)


def main():
    sys.path.insert(0, os.path.join(ROOT, "python"))
    if "--child" in sys.argv:
        CHILDREN[sys.argv[sys.argv.index("--child") + 1]]()
        return 0
    for size in (2, 3, 4):
        tally("ddp (%d ranks)" % size, run_job("ddp", size))
    for size in (2, 3):
        tally("process group kvps (%d ranks)" % size, run_job("pg", size))
    test_example()
    print("%d passed, %d failed%s" % (results["pass"], results["fail"],
                                      ", %d skipped" % results["skip"] if results.get("skip") else ""))
    return 1 if results["fail"] else 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
