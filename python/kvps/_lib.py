"""Loading libkvps.so and declaring its flat ABI (kvps_abi.h) to ctypes.

The library is looked for, in order: $KVPS_LIB (a path; if set, only there), beside this
package (kvps/libkvps.so: what `pip install ./python` puts there), the source tree's build/
(python/kvps/../../build/libkvps.so: `make` then PYTHONPATH=python), then the loader's path
(LD_LIBRARY_PATH, ldconfig: `make install`). Nothing is compiled at import.
"""
import ctypes
import os

ABI_VERSION = 1  # kvps_abi.h's KVPS_ABI_VERSION that this package speaks

_HERE = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    env = os.environ.get("KVPS_LIB")
    if env:
        return [(env, "$KVPS_LIB")]
    return [
        (os.path.join(_HERE, "libkvps.so"), "beside the package"),
        (os.path.normpath(os.path.join(_HERE, "..", "..", "build", "libkvps.so")), "the source tree's build/"),
        ("libkvps.so", "the loader's path"),
    ]


def _load():
    tried = []
    for path, how in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append("%s (%s): no such file" % (path, how))
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s): %s" % (path, how, e))
    raise ImportError("kvps: cannot load libkvps.so; build it with `make` in the kvps source tree, then "
                      "`pip install ./python`, or set KVPS_LIB to its path. Tried:\n  " + "\n  ".join(tried))


lib, path = _load()

_i, _u32, _u64, _sz, _f = ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_float
_p, _s = ctypes.c_void_p, ctypes.c_char_p
_pp, _pi, _pu64 = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint64)

# name: (restype, argtypes), one row per function of kvps_abi.h and the flat kvps_* ones used
_PROTOS = {
    "kvps_abi_version": (_i, []),
    "kvps_abi_last_error": (_s, []),
    "kvps_abi_result_name": (_s, [_i]),
    "kvps_result_str": (_s, [_i]),
    "kvps_abi_log_level": (None, [_i]),
    "kvps_abi_env_read": (_i, [_pi, _pi, _pi, _pi]),
    "kvps_abi_local_rank": (_i, [_pi, _pi]),
    "kvps_abi_ring_from_env": (_i, [_i, _pp]),
    "kvps_abi_ring_create": (_i, [_i, _i, _s, _i, _pp]),
    "kvps_abi_ring_destroy": (None, [_pp]),
    "kvps_abi_ring_split": (_i, [_p, _i, _i, _pp]),
    "kvps_ring_rank": (_i, [_p]),
    "kvps_ring_size": (_i, [_p]),
    "kvps_ring_endpoint": (_s, [_p]),
    "kvps_abi_ring_allreduce": (_i, [_p, _p, _p, _sz, _i, _i]),
    "kvps_abi_ring_reduce": (_i, [_p, _p, _p, _sz, _i, _i, _i]),
    "kvps_abi_ring_broadcast": (_i, [_p, _p, _p, _sz, _i, _i]),
    "kvps_abi_ring_allgather": (_i, [_p, _p, _p, _sz, _i]),
    "kvps_abi_ring_reduce_scatter": (_i, [_p, _p, _p, _sz, _i, _i]),
    "kvps_abi_ring_gather": (_i, [_p, _p, _p, _sz, _i, _i]),
    "kvps_abi_ring_scatter": (_i, [_p, _p, _p, _sz, _i, _i]),
    "kvps_abi_ring_alltoall": (_i, [_p, _p, _p, _sz, _i]),
    "kvps_abi_ring_barrier": (_i, [_p]),
    "kvps_abi_ring_allreduce_wire": (_i, [_p, _p, _p, _sz, _i, _i]),
    "kvps_abi_ring_allreduce_topk": (_i, [_p, _p, _sz, _sz, _p]),
    "kvps_abi_ring_send": (_i, [_p, _p, _sz, _i, _i, _u32]),
    "kvps_abi_ring_recv": (_i, [_p, _p, _sz, _i, _i, _u32]),
    "kvps_abi_worker_from_env": (_i, [_i, _pp]),
    "kvps_abi_worker_create": (_i, [_s, _i, _i, _i, _pp]),
    "kvps_abi_worker_handle": (_p, [_p]),
    "kvps_abi_worker_tensor": (_i, [_p, _s, _sz, _pi]),
    "kvps_abi_worker_tensor_optim": (_i, [_p, _i, _i, _f, _f, _f, _f, _f, _pu64]),
    "kvps_abi_worker_tensor_optim_wd": (_i, [_p, _i, _i, _f, _f, _f, _f, _f, _f, _pu64]),
    "kvps_abi_worker_push": (_i, [_p, _i, _p, _sz, _pu64]),
    "kvps_abi_worker_pull": (_i, [_p, _i, _p, _sz, _pu64]),
    "kvps_abi_worker_pushpull": (_i, [_p, _i, _p, _p, _sz, _pu64]),
    "kvps_abi_worker_init": (_i, [_p, _i, _p, _sz, _pu64]),
    "kvps_abi_worker_barrier": (_i, [_p, _pu64]),
    "kvps_abi_worker_wait": (_i, [_p, _u64, _i]),
    "kvps_abi_worker_table": (_i, [_p, _s, _u32, _i, _f, _f, _f, _f, _f, _f, _u64, _pi, _pu64]),
    "kvps_abi_worker_push_rows": (_i, [_p, _i, _p, _sz, _p, _sz, _pu64]),
    "kvps_abi_worker_pull_rows": (_i, [_p, _i, _p, _sz, _p, _sz, _pu64]),
    "kvps_abi_worker_finish": (_i, [_p, _i]),
    "kvps_abi_worker_destroy": (None, [_pp]),
    "kvps_abi_server_from_env": (_i, [_i, _i, _f, _i, _pp]),
    "kvps_abi_server_create": (_i, [_s, _i, _i, _i, _i, _f, _i, _pp]),
    "kvps_abi_server_run": (_i, [_p]),
    "kvps_abi_server_start": (_i, [_p]),
    "kvps_abi_server_wait": (_i, [_p, _i]),
    "kvps_abi_server_stop": (None, [_p]),
    "kvps_abi_server_destroy": (None, [_pp]),
    "kvps_server_endpoint": (_s, [_p]),
}

for _name, (_res, _args) in _PROTOS.items():
    try:
        _fn = getattr(lib, _name)
    except AttributeError:
        raise ImportError("kvps: %s (%s) has no %s: a library of another version" % (path, "libkvps.so", _name))
    _fn.restype = _res
    _fn.argtypes = _args

if lib.kvps_abi_version() != ABI_VERSION:
    raise ImportError("kvps: %s speaks ABI %d, this package %d: rebuild one of them" % (path, lib.kvps_abi_version(), ABI_VERSION))
