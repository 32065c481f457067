"""kvps.torch.ddp: PyTorch DDP's gradient all-reduce through a kvps ring (a communication hook).

    import torch, kvps, kvps.torch
    ring = kvps.Ring()                                     # RANK, WORLD_SIZE, MASTER_ADDR, ...
    kvps.torch.init_process_group(ring)                    # DDP's own gloo group, met through the ring
    model = torch.nn.parallel.DistributedDataParallel(net)
    model.register_comm_hook(kvps.torch.RingState(ring), kvps.torch.allreduce_hook)
    ...train as usual; ring.close() at the end

allreduce_hook(state, bucket) all-reduces each gradient bucket through the kvps ring in place, on
the bucket's own flat buffer (its data pointer: no copy), averaged as DDP's own all-reduce
averages, and returns an already completed torch.futures.Future holding the buffer. The
average is taken before the all-reduce, by multiplying the bucket by 1/n (n the world size, 1/n
rounded to float32): torch 1.13's reducer, with no hook, copies each gradient times 1/n into
its bucket and all-reduces the sum. (Torch's Python default_hooks.allreduce_hook divides by n
instead: the same bits for n = 2 or 4, where 1/n is exact, not for n = 3; measured with 3 ranks,
200 steps of the test's MLP: dividing ended up to 0.021 away from DDP's gloo training,
multiplying 1.9e-7, the rest being the order of the sum.) The all-reduce runs inside the hook, in
autograd's thread, so it does not overlap the rest of the backward pass as an asynchronous
process group's would (the bench, bench/ddp_hook.py, measures what that costs or saves).

RingState(ring, wire=None) chooses what goes on the wire:
    None        float32 (or the bucket's dtype: float64, float16) as it is. With 2 ranks the
                result is bit-identical to DDP's gloo all-reduce (a/2 + b/2 either way:
                tests/python/test_torch_ddp.py trains 200 steps both ways and compares every
                parameter bit for bit). With 3 or more ranks kvps and gloo add the ranks'
                terms in different orders, so the bits may differ from gloo's by float32
                rounding (3 and 4 ranks, 200 steps: up to 1.9e-7 apart); what holds is that
                every rank ends each all-reduce with the same bits (the replicas never drift
                apart) and each element is within the float32 summation bound of the exact
                mean (the test checks both, and prints how far the training ends from gloo's).
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
                sum them in rank order; then the times 1/n of the average. Every rank ends with
                the same bits; it is *not* the dense average (that is its point), and the
                residuals live in the state (one per bucket index; a bucket whose size changes,
                as DDP's buckets may after the first iteration, starts a fresh residual).

A bucket that is not a contiguous CPU tensor of a dtype kvps reduces raises kvps.InvalidArgument
naming the bucket (DDP's own buckets are contiguous; a CUDA model needs a GPU ring, not this hook).

A process group registered as "kvps" (ProcessGroupKvps): importing kvps.torch registers it, and
torch.distributed.init_process_group("kvps") (env:// or any init_method) makes a kvps ring whose
endpoints the ranks exchange through c10d's store; DDP then runs its own reducer over it, with no
hook and no gloo. It is honest in torch 1.13 because a Python subclass of
torch._C._distributed_c10d.ProcessGroup is called from C++ (pybind's trampoline: DDP's reducer,
its parameter broadcast and shape check, and dist.* all reach the Python methods), and
torch._C._distributed_c10d._create_work_from_future turns a completed future into the Work
c10d expects. Both are torch 1.13's internals: tested with Debian's 1.13 only (torch 2.x
reorganised process groups into Backend objects; not tried). Limits: one contiguous CPU tensor
per call, float32 / float64 / int32 / int64 / float16; allreduce (sum, product, min, max, avg),
broadcast, allgather, reduce (non-root ranks' tensors may be clobbered: kvps's in-place reduce)
and barrier, each run in the calling thread and returned complete (so the all-reduce does not
overlap the backward pass); every other collective raises c10d's "ProcessGroup kvps does not
support ...". Each rank's ring port is one the kernel picked a moment before the ring binds it:
another process taking it in between fails the group's creation with kvps's "Address already in
use". The hook with DDP's gloo group (init_process_group(ring) above) needs none of that.
"""
import datetime
import os

import numpy as np
import torch
import torch.distributed as dist

import kvps

__all__ = ["RingState", "allreduce_hook", "init_process_group", "ProcessGroupKvps"]

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
            t.mul_(1.0 / n)  # before the all-reduce, as DDP's own reducer does (see the docstring)
        ring.allreduce(a)
    elif state.wire in ("float16", "bfloat16"):
        if state.average:
            t.mul_(1.0 / n)  # before: the wire's range (float16's 65504) holds the mean, not the sum
        ring.allreduce_wire(a, wire=state.wire)
    else:  # top-k
        res = state.residuals.get(index)
        if res is None or res.numel() != t.numel():
            res = torch.zeros(t.numel(), dtype=torch.float32)
            state.residuals[index] = res
        k = max(1, int(state.topk_ratio * t.numel())) if t.numel() else 0
        ring.allreduce_topk(a, k, res.numpy())
        if state.average:
            t.mul_(1.0 / n)
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


# ---- a process group "kvps" ---------------------------------------------------------------------

_C10D = torch._C._distributed_c10d
_PG_OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX,
           "avg": dist.ReduceOp.AVG}


def _done(result):
    """A c10d Work that is already complete, holding result (torch 1.13: _create_work_from_future)."""
    f = torch.futures.Future()
    f.set_result(result)
    return _C10D._create_work_from_future(f)


def _arr(t, what):
    if not isinstance(t, torch.Tensor):
        raise _invalid("kvps process group %s: a torch tensor is needed, not %s" % (what, type(t).__name__))
    if t.device.type != "cpu" or not t.is_contiguous():
        raise _invalid("kvps process group %s: a contiguous CPU tensor is needed (device %s, contiguous %s)"
                       % (what, t.device, t.is_contiguous()))
    if t.dtype not in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16):
        raise _invalid("kvps process group %s: dtype %s is not one kvps reduces (float32, float64, int32, int64, float16)"
                       % (what, t.dtype))
    return t.numpy()


def _one(tensors, what):
    if len(tensors) != 1:
        raise _invalid("kvps process group %s: one tensor per call, not %d" % (what, len(tensors)))
    return tensors[0]


def _redop(opts, what):
    for name, op in _PG_OPS.items():
        if opts.reduceOp == op:
            return name
    raise _invalid("kvps process group %s: reduce op %s is not one kvps has (sum, product, min, max, avg)"
                   % (what, opts.reduceOp))


class ProcessGroupKvps(_C10D.ProcessGroup):
    """A torch.distributed process group over a kvps.Ring (a Python subclass of c10d's ProcessGroup).

    Implemented: allreduce (sum, product, min, max, avg), broadcast, allgather, reduce, barrier,
    each with one contiguous CPU tensor per call (float32, float64, int32, int64, float16), run
    in the calling thread and returned as completed work. Anything else raises (kvps's
    InvalidArgument naming it, or c10d's own "does not support" for the collectives not
    overridden here). Made by dist.init_process_group("kvps", ...) once kvps.torch is imported
    (register_backend), or directly: ProcessGroupKvps(ring)."""

    def __init__(self, ring):
        super().__init__(ring.rank, ring.size)
        self.ring = ring

    def getBackendName(self):
        return "kvps"

    def allreduce(self, tensors, opts=None):
        t = _one(tensors, "allreduce")
        self.ring.allreduce(_arr(t, "allreduce"), op=_redop(opts, "allreduce") if opts is not None else "sum")
        return _done(tensors)

    def broadcast(self, tensors, opts=None):
        t = _one(tensors, "broadcast")
        self.ring.broadcast(_arr(t, "broadcast"), root=opts.rootRank if opts is not None else 0)
        return _done(tensors)

    def reduce(self, tensors, opts=None):
        t = _one(tensors, "reduce")
        a = _arr(t, "reduce")
        self.ring.reduce(a, a, op=_redop(opts, "reduce"), root=opts.rootRank)
        return _done(tensors)

    def allgather(self, output_lists, input_tensors, opts=None):
        t = _one(input_tensors, "allgather input")
        outs = _one(output_lists, "allgather output list")
        if len(outs) != self.size():
            raise _invalid("kvps process group allgather: %d outputs for %d ranks" % (len(outs), self.size()))
        a = _arr(t, "allgather input")
        got = self.ring.allgather(a)
        for q, o in enumerate(outs):
            if o.numel() != t.numel() or o.dtype != t.dtype:
                raise _invalid("kvps process group allgather: output %d has %d x %s, the input %d x %s"
                               % (q, o.numel(), o.dtype, t.numel(), t.dtype))
            o.copy_(torch.from_numpy(got[q * a.size:(q + 1) * a.size]).view(o.shape))
        return _done(output_lists)

    def barrier(self, opts=None):
        self.ring.barrier()
        return _done([])


def _local_address(master):
    """The address of this host that reaches master (a UDP socket's choice; nothing is sent)."""
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((master, 9))
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        s.close()


def _create_kvps_group(store, rank, size, timeout):
    """register_backend's constructor: a ring whose endpoints the ranks exchange through c10d's store."""
    import socket
    host = _local_address(os.environ.get("MASTER_ADDR", "127.0.0.1"))
    s = socket.socket()
    s.bind((host, 0))  # a port the kernel picks, released just before the ring binds it
    port = s.getsockname()[1]
    s.close()
    store.set("kvps_ring/%d" % rank, "tcp://%s:%d" % (host, port))
    peers = [store.get("kvps_ring/%d" % q).decode() for q in range(size)]
    ms = int(timeout.total_seconds() * 1000) if timeout is not None else 0
    return ProcessGroupKvps(kvps.Ring(rank, size, peers, timeout_ms=ms))


if not hasattr(dist.Backend, "KVPS"):
    dist.Backend.register_backend("kvps", _create_kvps_group)
