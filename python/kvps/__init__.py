"""kvps from Python: rings (collectives), parameter-server workers and servers over libkvps.so.

    import numpy as np, kvps
    with kvps.Ring() as ring:                 # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        g = np.ones(1000, np.float32)
        ring.allreduce(g)                     # in place: the sum over every rank
        ring.allreduce(g, op="avg")

Arrays are used where they lie: each call passes the array's data pointer, element count and
dtype to the C library (kvps_abi.h), and nothing is copied. An array must be C-contiguous, of
a dtype kvps reduces (float32, float64, int32, int64, float16; a worker's tensors and tables:
float32), and writable where kvps writes into it; anything else raises kvps.InvalidArgument
naming the argument. Every error of kvps raises kvps.Error (or a subclass) carrying kvps's
result code (.code), its name (.name, "KVPS_ERR_TIMEOUT") and kvps's own words (.message).

Other array types (a torch tensor: kvps.torch) plug in with add_array_adapter.
"""
import collections
import ctypes
import threading

import numpy as np

from . import _lib
from ._lib import lib

__all__ = ["Error", "InvalidArgument", "Timeout", "PeerError", "Ring", "Worker", "Table", "Server", "Request",
           "env", "local_rank", "log_level", "add_array_adapter", "library_path"]

library_path = _lib.path

# ---- errors ---------------------------------------------------------------------------------


class Error(Exception):
    """A kvps error: .code (a kvps_result, negative), .name ("KVPS_ERR_..."), .message (kvps's words)."""

    def __init__(self, code, message):
        self.code = code
        self.name = lib.kvps_abi_result_name(code).decode()
        self.message = message
        super().__init__(message if self.name in message else "%s: %s" % (self.name, message))


class InvalidArgument(Error, ValueError):
    """KVPS_ERR_INVALID_ARG: an argument kvps refuses (also raised before the call, by this package)."""


class Timeout(Error, TimeoutError):
    """KVPS_ERR_TIMEOUT: a wait ran out (a rendezvous, a collective, a request)."""


class PeerError(Error, ConnectionError):
    """KVPS_ERR_PEER_LOST / KVPS_ERR_PEER: a peer died, was unreachable, or aborted the operation."""


_CLASSES = {-1: InvalidArgument, -203: Timeout, -204: PeerError, -205: PeerError}


def _check(rc):
    if rc != 0:
        raise _CLASSES.get(rc, Error)(rc, lib.kvps_abi_last_error().decode(errors="replace"))


def _invalid(msg):
    return InvalidArgument(-1, msg)


# ---- names ----------------------------------------------------------------------------------

_DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.int32): 2, np.dtype(np.int64): 3,
           np.dtype(np.float16): 4}
_OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}
_RULES = {"default": 0, "mean": 1, "sum": 2, "max": 3, "min": 4, "accumulate": 5, "sgd": 6, "momentum": 7,
          "nesterov": 8, "adagrad": 9, "adam": 10, "adamw": 11}
_UPDATES = {"mean": 0, "accumulate": 1, "sgd": 2}
_CONSISTENCY = {"bsp": 0, "async": 1, "ssp": 2}
_ROLES = {1: "server", 2: "worker"}


def _pick(table, value, what):
    try:
        return table[value.lower()]
    except (KeyError, AttributeError):
        raise _invalid("%s %r: one of %s" % (what, value, ", ".join(table))) from None


# ---- arrays ---------------------------------------------------------------------------------

_Buf = collections.namedtuple("_Buf", "ptr count dtype obj")
_adapters = []


def add_array_adapter(fn):
    """fn(x, what, writable) -> (ptr, count, kvps_dtype) for array types it knows, else None.
    kvps.torch registers one for contiguous CPU tensors (their data_ptr())."""
    _adapters.append(fn)


def _buf(x, what, writable=False, dtype=None):
    """The array x as (data pointer, element count, kvps dtype), checked; no copy."""
    for fn in _adapters:
        got = fn(x, what, writable)
        if got is not None:
            b = _Buf(got[0], got[1], got[2], x)
            break
    else:
        if not isinstance(x, np.ndarray):
            raise _invalid("%s: a numpy array is needed, not %s" % (what, type(x).__name__))
        if not x.flags.c_contiguous:
            raise _invalid("%s: the array is not C-contiguous (kvps uses arrays where they lie; "
                           "np.ascontiguousarray makes a contiguous copy)" % what)
        if writable and not x.flags.writeable:
            raise _invalid("%s: the array is read-only, and kvps writes into it" % what)
        dt = _DTYPES.get(x.dtype)
        if dt is None:
            raise _invalid("%s: dtype %s is not one kvps handles (float32, float64, int32, int64, float16)" % (what, x.dtype))
        b = _Buf(x.ctypes.data, x.size, dt, x)
    if dtype is not None and b.dtype != dtype:
        raise _invalid("%s: dtype %s, but %s is needed" % (what, _dtype_name(b.dtype), _dtype_name(dtype)))
    return b


def _dtype_name(dt):
    for k, v in _DTYPES.items():
        if v == dt:
            return str(k)
    return "kvps dtype %d" % dt


def _same(a, b, what):
    if a.dtype != b.dtype:
        raise _invalid("%s: dtype %s, the send array's %s" % (what, _dtype_name(b.dtype), _dtype_name(a.dtype)))


def _size_is(b, n, what):
    if b.count != n:
        raise _invalid("%s: %d elements, %d needed" % (what, b.count, n))


def _new_like(b, n):
    """A new numpy array of n elements of b's dtype (the output of an out-of-place collective)."""
    for k, v in _DTYPES.items():
        if v == b.dtype:
            return np.empty(n, k)
    raise _invalid("no numpy dtype for kvps dtype %d: pass recv" % b.dtype)


def _ptr(b):
    return ctypes.c_void_p(b.ptr) if b is not None else ctypes.c_void_p(None)


# ---- the environment ------------------------------------------------------------------------

Env = collections.namedtuple("Env", "role rank num_servers num_workers")


def env():
    """This process's place in a parameter-server job (kvps_env_read: KVPS_* variables, or
    RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT with KVPS_NUM_SERVERS): role "server" or
    "worker", rank, num_servers, num_workers. Read once per process (a rendezvous happens once)."""
    v = [ctypes.c_int() for _ in range(4)]
    _check(lib.kvps_abi_env_read(*[ctypes.byref(x) for x in v]))
    return Env(_ROLES.get(v[0].value, "none"), v[1].value, v[2].value, v[3].value)


def local_rank():
    """(local rank, local size) from the launcher or the rendezvous; -1 where none says."""
    a, b = ctypes.c_int(), ctypes.c_int()
    _check(lib.kvps_abi_local_rank(ctypes.byref(a), ctypes.byref(b)))
    return a.value, b.value


def log_level(level):
    """kvps's log level: "none", "error", "warn" (default), "info", "debug"; None: $KVPS_LOG again."""
    levels = {"none": 0, "error": 1, "warn": 2, "info": 3, "debug": 4}
    lib.kvps_abi_log_level(-1 if level is None else _pick(levels, level, "log level"))


# ---- ring -----------------------------------------------------------------------------------


class Ring:
    """A ring of ranks for collectives (kvps_ring.h).

    Ring()                             from the environment: RANK / WORLD_SIZE (or KVPS_RANK,
                                       OMPI_*, PMI_*, SLURM_*) and KVPS_RING_PEERS or
                                       MASTER_ADDR / MASTER_PORT (a rendezvous)
    Ring(rank, size, peers)            explicit: peers is every rank's endpoint in rank order
                                       (a list, or "tcp://a:1,tcp://b:2")
    timeout_ms: how long any operation may wait for a peer (0: kvps's default).

    Collectives follow kvps_ring.h (its manual, section 2): the count is per rank where data is
    cut by rank. Where the result has the input's shape (allreduce, reduce, broadcast), recv
    None means in place; elsewhere recv None allocates the result. Every rank calls the same
    collectives in the same order. After an error the ring is broken: close it.
    """

    def __init__(self, rank=None, size=None, peers=None, timeout_ms=0, _handle=None, _parent=None):
        self._children = []
        self._parent = _parent
        if _handle is not None:
            self._h = _handle
        else:
            h = ctypes.c_void_p()
            if rank is None and size is None and peers is None:
                _check(lib.kvps_abi_ring_from_env(int(timeout_ms), ctypes.byref(h)))
            else:
                if rank is None or size is None or peers is None:
                    raise _invalid("Ring: give rank, size and peers together, or none (from the environment)")
                if not isinstance(peers, str):
                    peers = ",".join(peers)
                _check(lib.kvps_abi_ring_create(int(rank), int(size), peers.encode(), int(timeout_ms), ctypes.byref(h)))
            self._h = h
        self.rank = lib.kvps_ring_rank(self._h)
        self.size = lib.kvps_ring_size(self._h)

    @property
    def endpoint(self):
        e = lib.kvps_ring_endpoint(self._handle())
        return e.decode() if e else None

    @property
    def handle(self):
        """The kvps_ring * (an int) for C code that shares this ring (kvps_fuse, a torch extension)."""
        return self._handle().value

    def _handle(self):
        if not self._h:
            raise Error(-6, "the ring is closed")
        return self._h

    def close(self):
        """Destroys the ring (its sub-rings first). Harmless twice."""
        for c in self._children:
            c.close()
        self._children = []
        if getattr(self, "_h", None):
            lib.kvps_abi_ring_destroy(ctypes.byref(self._h))
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if self._parent is None:
                self.close()
        except Exception:
            pass

    # -- collectives --
    def allreduce(self, send, recv=None, op="sum"):
        s = _buf(send, "allreduce send", writable=recv is None)
        r = s if recv is None else _buf(recv, "allreduce recv", writable=True)
        _same(s, r, "allreduce recv")
        _size_is(r, s.count, "allreduce recv")
        _check(lib.kvps_abi_ring_allreduce(self._handle(), _ptr(s), _ptr(r), s.count, s.dtype, _pick(_OPS, op, "op")))
        return r.obj

    def allreduce_wire(self, send, recv=None, op="sum", wire="float16"):
        """A float32 all-reduce with 16-bit floats on the wire (wire "float16" or "bfloat16"): half
        the bytes; sums formed in float32, each partial sum rounded to the wire format before it
        is sent (kvps_ring_allreduce_wire), so every rank ends with the same bits."""
        wires = {"float16": 4, "fp16": 4, "half": 4, "bfloat16": 5, "bf16": 5}
        w = _pick(wires, wire, "wire")
        s = _buf(send, "allreduce_wire send", writable=recv is None, dtype=0)
        r = s if recv is None else _buf(recv, "allreduce_wire recv", writable=True, dtype=0)
        _size_is(r, s.count, "allreduce_wire recv")
        _check(lib.kvps_abi_ring_allreduce_wire(self._handle(), _ptr(s), _ptr(r), s.count, _pick(_OPS, op, "op"), w))
        return r.obj

    def allreduce_topk(self, buf, k, residual=None):
        """In place, float32: each rank keeps its k largest |buf + residual| entries (the rest
        added to residual: error feedback; residual None: dropped), and buf becomes the sum of
        every rank's kept entries, added in rank order (kvps_ring_allreduce_topk). k: the same
        on every rank, 0 <= k <= len(buf)."""
        b = _buf(buf, "allreduce_topk buf", writable=True, dtype=0)
        res = None if residual is None else _buf(residual, "allreduce_topk residual", writable=True, dtype=0)
        if res is not None:
            _size_is(res, b.count, "allreduce_topk residual")
        if not 0 <= int(k) <= b.count:
            raise _invalid("allreduce_topk: k %d of %d elements (0 <= k <= len(buf))" % (int(k), b.count))
        _check(lib.kvps_abi_ring_allreduce_topk(self._handle(), _ptr(b), b.count, int(k), _ptr(res)))
        return buf

    def reduce(self, send, recv=None, op="sum", root=0):
        s = _buf(send, "reduce send", writable=recv is None and self.rank == root)
        r = s if recv is None else _buf(recv, "reduce recv", writable=True)
        _same(s, r, "reduce recv")
        _size_is(r, s.count, "reduce recv")
        _check(lib.kvps_abi_ring_reduce(self._handle(), _ptr(s), _ptr(r), s.count, s.dtype, _pick(_OPS, op, "op"), int(root)))
        return r.obj if self.rank == root else None

    def broadcast(self, buf, root=0):
        """In place: root's buf goes to every rank's buf."""
        b = _buf(buf, "broadcast buf", writable=True)
        _check(lib.kvps_abi_ring_broadcast(self._handle(), None, _ptr(b), b.count, b.dtype, int(root)))
        return buf

    def allgather(self, send, recv=None):
        s = _buf(send, "allgather send")
        r = _buf(_new_like(s, s.count * self.size) if recv is None else recv, "allgather recv", writable=True)
        _same(s, r, "allgather recv")
        _size_is(r, s.count * self.size, "allgather recv")
        _check(lib.kvps_abi_ring_allgather(self._handle(), _ptr(s), _ptr(r), s.count, s.dtype))
        return r.obj

    def reduce_scatter(self, send, recv=None, op="sum"):
        s = _buf(send, "reduce_scatter send")
        if s.count % self.size:
            raise _invalid("reduce_scatter send: %d elements, not a multiple of the ring's %d ranks" % (s.count, self.size))
        n = s.count // self.size
        r = _buf(_new_like(s, n) if recv is None else recv, "reduce_scatter recv", writable=True)
        _same(s, r, "reduce_scatter recv")
        _size_is(r, n, "reduce_scatter recv")
        _check(lib.kvps_abi_ring_reduce_scatter(self._handle(), _ptr(s), _ptr(r), n, s.dtype, _pick(_OPS, op, "op")))
        return r.obj

    def gather(self, send, recv=None, root=0):
        """root's recv (allocated when None) gets every rank's send in rank order; None elsewhere."""
        s = _buf(send, "gather send")
        r = None
        if self.rank == root:
            r = _buf(_new_like(s, s.count * self.size) if recv is None else recv, "gather recv", writable=True)
            _same(s, r, "gather recv")
            _size_is(r, s.count * self.size, "gather recv")
        _check(lib.kvps_abi_ring_gather(self._handle(), _ptr(s), _ptr(r), s.count, s.dtype, int(root)))
        return r.obj if r is not None else None

    def scatter(self, send, recv, root=0):
        """Block i of root's send (size x len(recv) elements) to rank i's recv; send is ignored elsewhere."""
        r = _buf(recv, "scatter recv", writable=True)
        s = None
        if self.rank == root:
            s = _buf(send, "scatter send")
            _same(s, r, "scatter recv")
            _size_is(s, r.count * self.size, "scatter send")
        _check(lib.kvps_abi_ring_scatter(self._handle(), _ptr(s), _ptr(r), r.count, r.dtype, int(root)))
        return recv

    def alltoall(self, send, recv=None):
        s = _buf(send, "alltoall send")
        if s.count % self.size:
            raise _invalid("alltoall send: %d elements, not a multiple of the ring's %d ranks" % (s.count, self.size))
        r = _buf(_new_like(s, s.count) if recv is None else recv, "alltoall recv", writable=True)
        _same(s, r, "alltoall recv")
        _size_is(r, s.count, "alltoall recv")
        _check(lib.kvps_abi_ring_alltoall(self._handle(), _ptr(s), _ptr(r), s.count // self.size, s.dtype))
        return r.obj

    def barrier(self):
        _check(lib.kvps_abi_ring_barrier(self._handle()))

    def send(self, buf, dst, tag=0):
        b = _buf(buf, "send buf")
        _check(lib.kvps_abi_ring_send(self._handle(), _ptr(b), b.count, b.dtype, int(dst), int(tag)))

    def recv(self, buf, src, tag=0):
        """Into buf, which names the count and dtype the sender sent."""
        b = _buf(buf, "recv buf", writable=True)
        _check(lib.kvps_abi_ring_recv(self._handle(), _ptr(b), b.count, b.dtype, int(src), int(tag)))
        return buf

    def split(self, colour, key=0):
        """Collective: the ranks with the same colour (>= 0) form a sub-ring, ranked by key; None
        for a negative colour. A sub-ring is closed with (and before) this ring."""
        h = ctypes.c_void_p()
        _check(lib.kvps_abi_ring_split(self._handle(), int(colour), int(key), ctypes.byref(h)))
        if not h:
            return None
        child = Ring(_handle=h, _parent=self)
        self._children.append(child)
        return child


# ---- parameter server: worker ---------------------------------------------------------------


class Request:
    """A worker request in flight; its arrays are kept alive until wait() returns."""

    def __init__(self, worker, req, arrays):
        self._w, self._req, self._arrays = worker, req, arrays

    def wait(self, timeout_ms=-1):
        """Waits for it (-1: the worker's timeout). Timeout / PeerError leave it valid: wait again."""
        if self._req is None:
            return
        _check(lib.kvps_abi_worker_wait(self._w._handle(), self._req, int(timeout_ms)))
        self._req, self._arrays = None, None


def _optim(rule, lr, momentum, beta1, beta2, eps):
    return (_pick(_RULES, rule, "rule"), float(lr), float(momentum), float(beta1), float(beta2), float(eps))


class Worker:
    """A parameter-server worker (kvps.h): named float32 tensors, push / pull / pushpull, sparse tables.

    Worker()                                   from the environment (kvps.env() says it is a worker)
    Worker(servers, rank, num_workers)         explicit: servers is a list or "tcp://a:1,tcp://b:2"
    .rank, .num_workers: this worker's place (num_workers 0: the servers' count)
    timeout_ms: a request's default wait (0: kvps's).

    A tensor is named; its first use (or tensor()) registers it with the array's length, and a
    later use with another length raises kvps.Error (KVPS_ERR_TENSOR). The calls wait for their
    request unless wait=False, which returns a Request (its arrays are borrowed until its wait).
    As a context manager it finishes on a clean exit (servers stop once every worker has), and
    is destroyed either way.
    """

    def __init__(self, servers=None, rank=None, num_workers=0, timeout_ms=0):
        h = ctypes.c_void_p()
        if servers is None:
            _check(lib.kvps_abi_worker_from_env(int(timeout_ms), ctypes.byref(h)))
        else:
            if not isinstance(servers, str):
                servers = ",".join(servers)
            _check(lib.kvps_abi_worker_create(servers.encode(), int(rank or 0), int(num_workers), int(timeout_ms),
                                              ctypes.byref(h)))
        self._h = h
        if servers is None:
            e = env()  # what the worker was created from (read once per process)
            self.rank, self.num_workers = e.rank, e.num_workers
        else:
            self.rank, self.num_workers = int(rank or 0), int(num_workers)
        self._finished = False

    def _handle(self):
        if not self._h:
            raise Error(-6, "the worker is closed")
        return self._h

    @property
    def handle(self):
        """The kvps_worker * (an int) inside, for C code."""
        return lib.kvps_abi_worker_handle(self._handle())

    def _req(self, rc_fn, arrays, wait):
        q = ctypes.c_uint64()
        _check(rc_fn(ctypes.byref(q)))
        r = Request(self, q.value, arrays)
        if wait:
            r.wait()
            return None
        return r

    def tensor(self, name, length, rule=None, lr=0.0, momentum=0.0, beta1=0.0, beta2=0.0, eps=0.0, weight_decay=0.0):
        """Registers tensor name of length floats (again: the same length, or kvps.Error); with rule
        ("sgd", "adam", "adamw", ... kvps_rule's names), sets its update rule on the servers and
        waits (hyper-parameters 0: kvps's defaults; weight_decay: adamw's only; a change resets
        the optimizer state)."""
        t = ctypes.c_int()
        _check(lib.kvps_abi_worker_tensor(self._handle(), name.encode(), int(length), ctypes.byref(t)))
        if rule is not None:
            o = _optim(rule, lr, momentum, beta1, beta2, eps) + (float(weight_decay),)
            self._req(lambda q: lib.kvps_abi_worker_tensor_optim_wd(self._h, t.value, *o, q), [], True)
        return t.value

    def _t(self, name, b):
        return self.tensor(name, b.count)

    def push(self, name, grad, wait=True):
        g = _buf(grad, "push %r grad" % name, dtype=0)
        t = self._t(name, g)
        return self._req(lambda q: lib.kvps_abi_worker_push(self._h, t, _ptr(g), g.count, q), [grad], wait)

    def pull(self, name, out, wait=True):
        o = _buf(out, "pull %r out" % name, writable=True, dtype=0)
        t = self._t(name, o)
        r = self._req(lambda q: lib.kvps_abi_worker_pull(self._h, t, _ptr(o), o.count, q), [out], wait)
        return out if wait else r

    def pushpull(self, name, grad, out, wait=True):
        """Pushes grad, then pulls the value after that round into out (out may be grad)."""
        g = _buf(grad, "pushpull %r grad" % name, dtype=0)
        o = _buf(out, "pushpull %r out" % name, writable=True, dtype=0)
        _size_is(o, g.count, "pushpull %r out" % name)
        t = self._t(name, g)
        r = self._req(lambda q: lib.kvps_abi_worker_pushpull(self._h, t, _ptr(g), _ptr(o), g.count, q), [grad, out], wait)
        return out if wait else r

    def init(self, name, vals, wait=True):
        """Sets the tensor's value on the servers (typically one worker, before training)."""
        v = _buf(vals, "init %r vals" % name, dtype=0)
        t = self._t(name, v)
        return self._req(lambda q: lib.kvps_abi_worker_init(self._h, t, _ptr(v), v.count, q), [vals], wait)

    def barrier(self, wait=True):
        return self._req(lambda q: lib.kvps_abi_worker_barrier(self._handle(), q), [], wait)

    def table(self, name, dim, rule="sgd", lr=0.0, momentum=0.0, beta1=0.0, beta2=0.0, eps=0.0, init_scale=0.0, seed=0):
        """A sparse table of rows of dim floats under uint64 ids (kvps.h, SPARSE TABLES): configured
        on every server (the same call on every worker); rows are created on first touch."""
        o = _optim(rule, lr, momentum, beta1, beta2, eps)
        t = ctypes.c_int()
        q = ctypes.c_uint64()
        _check(lib.kvps_abi_worker_table(self._handle(), name.encode(), int(dim), *o, float(init_scale), int(seed),
                                         ctypes.byref(t), ctypes.byref(q)))
        Request(self, q.value, []).wait()
        return Table(self, t.value, name, int(dim))

    def finish(self, timeout_ms=-1):
        """Tells every server this worker is done and waits for them (kvps_worker_finish)."""
        _check(lib.kvps_abi_worker_finish(self._handle(), int(timeout_ms)))
        self._finished = True

    def close(self):
        """Destroys the worker (finishing, for at most 1 s, if finish() was not called). Harmless twice."""
        if getattr(self, "_h", None):
            lib.kvps_abi_worker_destroy(ctypes.byref(self._h))
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        try:
            if exc_type is None and not self._finished:
                self.finish()
        finally:
            self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _ids(ids, what):
    if not isinstance(ids, np.ndarray) or ids.dtype != np.uint64:
        raise _invalid("%s: ids must be a numpy array of uint64 (np.asarray(ids, np.uint64))" % what)
    if not ids.flags.c_contiguous:
        raise _invalid("%s: ids are not C-contiguous" % what)
    return ids


class Table:
    """A sparse table of a Worker: pull(ids) -> rows, push(ids, grads)."""

    def __init__(self, worker, handle, name, dim):
        self._w, self._t, self.name, self.dim = worker, handle, name, dim

    def pull(self, ids, out=None, wait=True):
        """The rows of ids (a uint64 array) into out (len(ids) x dim float32; allocated when None)."""
        ids = _ids(ids, "pull %r" % self.name)
        if out is None:
            out = np.empty((ids.size, self.dim), np.float32)
        o = _buf(out, "pull %r out" % self.name, writable=True, dtype=0)
        r = self._w._req(lambda q: lib.kvps_abi_worker_pull_rows(self._w._handle(), self._t, ids.ctypes.data, ids.size,
                                                                 _ptr(o), o.count, q), [ids, out], wait)
        return out if wait else r

    def push(self, ids, grads, wait=True):
        """Gradients for the rows of ids (len(ids) x dim float32), applied with the table's rule."""
        ids = _ids(ids, "push %r" % self.name)
        g = _buf(grads, "push %r grads" % self.name, dtype=0)
        return self._w._req(lambda q: lib.kvps_abi_worker_push_rows(self._w._handle(), self._t, ids.ctypes.data, ids.size,
                                                                    _ptr(g), g.count, q), [ids, grads], wait)


# ---- parameter server: server ---------------------------------------------------------------


class Server:
    """A parameter server (kvps.h).

    Server()                                       from the environment (kvps.env() says it is a server)
    Server(endpoint, rank=0, num_workers=N)        explicit ("tcp://127.0.0.1:*": a port the kernel picks,
                                                   read back from .endpoint)
    consistency "bsp" | "async" | "ssp" (staleness k); update "mean" | "accumulate" | "sgd" (lr): the
    rule of every tensor without one of its own.

    run() serves in the calling thread until every worker has finished (kvps.PeerError when the
    job ended with workers lost); start() serves on a thread of kvps's own, wait() waits for it
    to end by itself, stop() ends it. As a context manager it is stopped and destroyed at exit.
    """

    def __init__(self, endpoint=None, rank=0, num_workers=None, consistency="bsp", update="mean", lr=0.0, staleness=0):
        h = ctypes.c_void_p()
        c, u = _pick(_CONSISTENCY, consistency, "consistency"), _pick(_UPDATES, update, "update")
        if endpoint is None:
            _check(lib.kvps_abi_server_from_env(c, u, float(lr), int(staleness), ctypes.byref(h)))
        else:
            if num_workers is None:
                raise _invalid("Server: num_workers is needed with an endpoint")
            _check(lib.kvps_abi_server_create(endpoint.encode(), int(rank), int(num_workers), c, u, float(lr),
                                              int(staleness), ctypes.byref(h)))
        self._h = h

    def _handle(self):
        if not self._h:
            raise Error(-6, "the server is closed")
        return self._h

    @property
    def endpoint(self):
        e = lib.kvps_server_endpoint(self._handle())
        return e.decode() if e else None

    def run(self):
        _check(lib.kvps_abi_server_run(self._handle()))

    def start(self):
        _check(lib.kvps_abi_server_start(self._handle()))
        return self

    def wait(self, timeout_ms=-1):
        _check(lib.kvps_abi_server_wait(self._handle(), int(timeout_ms)))

    def stop(self):
        if self._h:
            lib.kvps_abi_server_stop(self._h)

    def close(self):
        if getattr(self, "_h", None):
            lib.kvps_abi_server_destroy(ctypes.byref(self._h))
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
