"""kvps.torch.ddp: PyTorch DDP's gradient all-reduce through a kvps ring (a communication hook).

    import torch, kvps, kvps.torch
    ring = kvps.Ring()                                     # RANK, WORLD_SIZE, MASTER_ADDR, ...
    kvps.torch.init_process_group(ring)                    # DDP's own gloo group, met through the ring
    model = torch.nn.parallel.DistributedDataParallel(net)
    model.register_comm_hook(kvps.torch.RingState(ring), kvps.torch.allreduce_hook)
    ...train as usual; ring.close() at the end

allreduce_hook(state, bucket) all-reduces each gradient bucket through the kvps ring in place, on
the bucket's own flat buffer (its data pointer: no copy), averaged as DDP's default hook
averages (torch 1.13's default_hooks.allreduce_hook divides the bucket by the world size
*before* the all-reduce, and so does this hook: the same bits), and returns an already
completed torch.futures.Future holding the buffer. The all-reduce runs inside the hook, in
autograd's thread, so it does not overlap the rest of the backward pass as an asynchronous
process group's would (the bench, bench/ddp_hook.py, measures what that costs or saves).

RingState(ring, wire=None) chooses what goes on the wire:
    None        float32 (or the bucket's dtype: float64, float16) as it is. With 2 ranks the
                result is bit-identical to DDP's gloo all-reduce (a/2 + b/2 either way:
                tests/python/test_torch_ddp.py trains 200 steps both ways and compares every
                parameter bit for bit). With 3 or more ranks kvps and gloo add the ranks'
                terms in different orders, so the bits may differ from gloo's by float32
                rounding; what holds is that every rank ends each all-reduce with the same
                bits (the replicas never drift apart) and each element is within the float32
                summation bound of the exact mean (the test checks both, and reports how far
                the 3-rank training ends from gloo's).
    "fp16", "bf16"   float32 buckets go as float16 / bfloat16 on the wire
                (kvps_ring_allreduce_wire: half the bytes; sums formed in float32, each partial
                sum rounded to the wire format before it is sent; every rank ends with the same
                bits). Documented tolerance, per element, for n ranks: |result - exact mean| <=
                (n + 1) * eps * mean(|g_i|) + n * 2^-24, eps 2^-10 (fp16) or 2^-7 (bf16), the
                second term for float16's subnormals (gradients below 6e-5); bfloat16 keeps
                float32's range. Values beyond float16's range (65504, after the division by n)
                become inf: use bf16 where gradients can be that large.
    "topk"      kvps_ring_allreduce_topk, the ring's sparse all-reduce: each rank keeps the
                k = max(1, ratio * bucket size) largest |g + residual| entries of its bucket
                (topk_ratio, default 0.01), the rest stays in a per-bucket residual that is added
                next step (error feedback), the ranks all-gather their (index, value) pairs and
                sum them in rank order; then the division by the world size. Every rank ends with
                the same bits; it is *not* the dense average (that is its point), and the
                residuals live in the state (one per bucket index; a bucket whose size changes,
                as DDP's buckets may after the first iteration, starts a fresh residual).

A bucket that is not a contiguous CPU tensor of a dtype kvps reduces raises kvps.InvalidArgument
naming the bucket (DDP's own buckets are contiguous; a CUDA model needs a GPU ring, not this hook).

A process group registered as "kvps": not shipped. Torch 1.13 does let a Python class stand in
for a c10d ProcessGroup (a subclass of torch._C._distributed_c10d.ProcessGroup whose allreduce /
broadcast / allgather return torch._C._distributed_c10d._create_work_from_future(fut) is called
from DDP's C++ reducer and from dist.all_reduce, and Backend.register_backend accepts its
constructor: tried with a 1-rank group under Debian's torch 1.13). But those are private
names (_create_work_from_future, the pybind trampoline) that torch has changed since (2.x
reworked ProcessGroup into Backend objects), a group must implement or refuse every collective
and option (async work, reduce ops, coalesced and uneven variants, timeouts) to be a process
group and not a stub, and the hook gives DDP everything a group would for training: so the hook
it is, with DDP's own gloo group for the rest (parameter broadcast at construction, the
bucket-shape check, any dist.* call of the user's). init_process_group(ring) makes that gloo
group from the ring's own environment.
"""
import datetime
import os

import numpy as np
import torch
import torch.distributed as dist

import kvps

__all__ = ["RingState", "allreduce_hook", "init_process_group"]

_WIRES = {None: None, "none": None, "float32": None, "fp32": None,
          "fp16": "float16", "float16": "float16", "half": "float16",
          "bf16": "bfloat16", "bfloat16": "bfloat16", "topk": "topk"}

# torch dtypes the plain (dense) path reduces, as numpy sees them (numpy has no bfloat16)
_DENSE = (torch.float32, torch.float64, torch.float16)


def _invalid(msg):
    return kvps.InvalidArgument(-1, msg)


class RingState:
    """The state of allreduce_hook: the kvps.Ring, the wire format, top-k's ratio and residuals.

    RingState(ring, wire=None | "fp16" | "bf16" | "topk", topk_ratio=0.01, average=True)
    average False sums instead of averaging (for a loss already divided by the world size).
    Counters: .calls (buckets reduced), .elements (their elements), for tests and logs.
    """

    def __init__(self, ring, wire=None, topk_ratio=0.01, average=True):
        if not isinstance(ring, kvps.Ring):
            raise _invalid("RingState: ring must be a kvps.Ring, not %s" % type(ring).__name__)
        key = wire.lower() if isinstance(wire, str) else wire
        if key not in _WIRES:
            raise _invalid("RingState: wire %r: one of None, 'fp16', 'bf16', 'topk'" % (wire,))
        self.wire = _WIRES[key]
        if not 0.0 < float(topk_ratio) <= 1.0:
            raise _invalid("RingState: topk_ratio %r: in (0, 1]" % (topk_ratio,))
        self.ring = ring
        self.topk_ratio = float(topk_ratio)
        self.average = bool(average)
        self.residuals = {}  # bucket index -> float32 tensor (top-k's error feedback)
        self.calls = 0
        self.elements = 0


def _check_bucket(t, what, wire):
    if not isinstance(t, torch.Tensor):
        raise _invalid("%s: a torch tensor is needed, not %s" % (what, type(t).__name__))
    if t.device.type != "cpu":
        raise _invalid("%s is on device %s: the kvps hook reduces CPU tensors (their memory, where they lie)"
                       % (what, t.device))
    if not t.is_contiguous():
        raise _invalid("%s is not contiguous (strides %s): the kvps hook reduces a bucket in place, where it lies"
                       % (what, tuple(t.stride())))
    if wire is not None and t.dtype != torch.float32:
        raise _invalid("%s: dtype %s, but wire %r needs float32" % (what, t.dtype, wire))
    if t.dtype not in _DENSE:
        raise _invalid("%s: dtype %s is not one the kvps hook reduces (float32, float64, float16)" % (what, t.dtype))


def _reduce(state, t, index):
    """All-reduces the flat CPU tensor t in place as state says, then divides as DDP's default."""
    ring = state.ring
    n = ring.size
    a = t.numpy()  # a view of t's memory: no copy
    if state.wire is None:
        if state.average:
            t.div_(n)  # before the all-reduce, as torch 1.13's default allreduce_hook does
        ring.allreduce(a)
    elif state.wire in ("float16", "bfloat16"):
        if state.average:
            t.div_(n)  # before: the wire's range (float16's 65504) holds the mean, not the sum
        ring.allreduce_wire(a, wire=state.wire)
    else:  # top-k
        res = state.residuals.get(index)
        if res is None or res.numel() != t.numel():
            res = torch.zeros(t.numel(), dtype=torch.float32)
            state.residuals[index] = res
        k = max(1, int(state.topk_ratio * t.numel())) if t.numel() else 0
        ring.allreduce_topk(a, k, res.numpy())
        if state.average:
            t.div_(n)
    state.calls += 1
    state.elements += t.numel()
    return t


def allreduce_hook(state, bucket):
    """A DDP communication hook: register with model.register_comm_hook(RingState(ring), allreduce_hook).

    All-reduces bucket.buffer() through state.ring in place (averaged, as DDP's default hook) and
    returns a completed torch.futures.Future whose value is that buffer. kvps errors (a peer
    lost, a timeout) raise here, inside DDP's backward, with kvps's words."""
    if not isinstance(state, RingState):
        raise _invalid("allreduce_hook: state must be a kvps.torch.RingState, not %s" % type(state).__name__)
    buf = bucket.buffer()
    index = bucket.index() if hasattr(bucket, "index") else 0
    _check_bucket(buf, "DDP gradient bucket %d" % index, state.wire)
    _reduce(state, buf, index)
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


# ---- DDP's own group, met through the ring ----------------------------------------------------


def _ring_host(ring):
    ep = ring.endpoint or ""
    if ep.startswith("tcp://"):
        host = ep[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
        if host and host != "*":
            return host
    host = os.environ.get("MASTER_ADDR")
    if host:
        return host
    raise _invalid("init_process_group: rank 0's ring endpoint %r names no TCP host, and MASTER_ADDR is unset" % ep)


def init_process_group(ring, backend="gloo", timeout_s=300):
    """torch.distributed's default group (gloo) for the ranks of ring, met through the ring itself.

    Rank 0 starts a TCPStore on its ring address at a port the kernel picks, and broadcasts the
    address and port over the ring; every rank then joins torch.distributed.init_process_group
    with that store, with the ring's rank and size. So whatever made the ring (torchrun, kvps-run,
    mpirun with MASTER_ADDR / MASTER_PORT, explicit peers) makes DDP's group too, and the two
    never compete for a port (under plain MASTER_ADDR / MASTER_PORT kvps's rendezvous has taken
    MASTER_PORT; under torchrun's agent store kvps met at MASTER_PORT + 1: kvps_launch.h, 2.).
    Returns the store (keep it alive as long as the group)."""
    rank, size = ring.rank, ring.size
    buf = np.zeros(256, np.int32)  # [port, len, host bytes...]
    store = None
    to = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        host = _ring_host(ring)
        store = dist.TCPStore(host, 0, size, True, to, False)
        hb = host.encode()[:250]
        buf[0], buf[1] = store.port, len(hb)
        buf[2:2 + len(hb)] = np.frombuffer(hb, np.uint8)
    ring.broadcast(buf, root=0)
    if rank != 0:
        host = bytes(buf[2:2 + buf[1]].astype(np.uint8)).decode()
        store = dist.TCPStore(host, int(buf[0]), size, False, to)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=to)
    return store
