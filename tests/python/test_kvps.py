"""The Python package (python/kvps) against independent oracles, with real processes on loopback.

    python3 tests/python/test_kvps.py            (tests/test_python.sh runs it: `make test`)

Each check prints "ok NAME" or "FAIL NAME: why"; the last line is "N passed, N failed".
Jobs are this file run again as child processes (--child KIND) with the launcher's variables
(RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=a free port; KVPS_NUM_SERVERS for a
parameter-server job); every child prints its own "ok" / "FAIL" lines, and a check passes when
every rank of its job said ok and every process ended by itself within the job's bound (a hang
fails, it is not waited for). Oracles: numpy on the same inputs (exact integer and small-integer
float sums), a sequential replay of the parameter server's documented float32 rules; the 16-bit
wires against the exact sum within kvps_ring.h's bound, top-k against a numpy replay.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from kt import results, say, skip, check, free_port, clean_env  # noqa: E402  (tests/python/kt.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BOUND_S = 120  # a job that has not ended by then hangs: killed, and its checks fail

# ---- the child side: one rank of a job ------------------------------------------------------


def rank_data(rank, n, dtype, salt=0):
    """Rank rank's input: small integers, so that float sums are exact in any order."""
    return ((np.arange(n, dtype=np.int64) * (rank + 3 + salt) + 7 * rank) % 23 - 11).astype(dtype)


def child_ring():
    import kvps
    with kvps.Ring(timeout_ms=60000) as ring:
        r, n = ring.rank, ring.size
        say(n == int(os.environ["WORLD_SIZE"]) and r == int(os.environ["RANK"]), "ring from the environment (rank and size)")
        lr = kvps.local_rank()
        say(lr == (r, n), "local rank and size from the rendezvous (one host)", str(lr))
        for dtype, op, ref in ((np.float32, "sum", lambda xs: np.sum(xs, axis=0)),
                               (np.int64, "sum", lambda xs: np.sum(xs, axis=0)),
                               (np.int32, "max", lambda xs: np.max(xs, axis=0)),
                               (np.float64, "min", lambda xs: np.min(xs, axis=0)),
                               (np.float16, "sum", lambda xs: np.sum(xs, axis=0))):
            for count in (1, 1000, 70001):
                xs = [rank_data(i, count, dtype) for i in range(n)]
                a = xs[r].copy()
                ring.allreduce(a, op=op)  # in place
                want = ref(np.stack(xs)).astype(dtype)
                say(a.dtype == dtype and np.array_equal(a, want), "allreduce %s %s x%d in place" % (np.dtype(dtype), op, count),
                    "differs at %s" % np.flatnonzero(a != want)[:5])
        xs = [rank_data(i, 513, np.float32, 1) for i in range(n)]
        out = np.full(513, -99, np.float32)
        ret = ring.allreduce(xs[r], out, op="sum")
        say(ret is out and np.array_equal(out, np.sum(xs, axis=0)) and np.array_equal(xs[r], rank_data(r, 513, np.float32, 1)),
            "allreduce out of place (send untouched)", "out %s" % out[:5])
        g = ring.allgather(np.full(7, r, np.int32))
        say(np.array_equal(g, np.repeat(np.arange(n, dtype=np.int32), 7)), "allgather int32", str(g))
        for root in range(n):
            b = rank_data(root, 300, np.float64, 5) if r == root else np.zeros(300, np.float64)
            ring.broadcast(b, root=root)
            say(np.array_equal(b, rank_data(root, 300, np.float64, 5)), "broadcast float64 from root %d" % root)
        xs = [rank_data(i, 4 * n, np.int64, 2) for i in range(n)]
        rs = ring.reduce_scatter(xs[r])
        say(np.array_equal(rs, np.sum(xs, axis=0)[4 * r:4 * r + 4]), "reduce_scatter int64")
        red = ring.reduce(xs[r].copy(), op="max", root=1)
        say((red is None) if r != 1 else np.array_equal(red, np.max(xs, axis=0)), "reduce max to root 1")
        gat = ring.gather(np.full(3, r + 10, np.float32), root=2)
        say((gat is None) if r != 2 else np.array_equal(gat, np.repeat(np.arange(n, dtype=np.float32) + 10, 3)), "gather to root 2")
        sc = np.zeros(5, np.int32)
        ring.scatter(np.arange(5 * n, dtype=np.int32) if r == 0 else None, sc, root=0)
        say(np.array_equal(sc, np.arange(5 * r, 5 * r + 5, dtype=np.int32)), "scatter from root 0")
        a2a = ring.alltoall(np.array([100 * r + j for j in range(n)], np.int64))
        say(np.array_equal(a2a, np.array([100 * i + r for i in range(n)], np.int64)), "alltoall int64", str(a2a))
        ring.barrier()
        nxt, prv = (r + 1) % n, (r - 1) % n
        got = np.zeros(4, np.float64)
        if r % 2 == 0:
            ring.send(np.full(4, r, np.float64), nxt, tag=7)
            ring.recv(got, prv, tag=7)
        else:
            ring.recv(got, prv, tag=7)
            ring.send(np.full(4, r, np.float64), nxt, tag=7)
        say(np.array_equal(got, np.full(4, prv, np.float64)), "send / recv around the ring")
        sub = ring.split(r % 2, key=-r)  # evens and odds, ranked in reverse
        members = [i for i in range(n) if i % 2 == r % 2]
        v = np.array([r], np.int64)
        sub.allreduce(v)
        say(sub.size == len(members) and sub.rank == sorted(members, reverse=True).index(r) and v[0] == sum(members),
            "split by parity (sub-ring size, rank and sum)", "size %d rank %d sum %d" % (sub.size, sub.rank, v[0]))


def child_ring_explicit():
    """Ring(rank, size, peers) with the endpoints the driver chose (no rendezvous)."""
    import kvps
    peers = os.environ["TEST_PEERS"].split(",")
    with kvps.Ring(int(os.environ["TEST_RANK"]), len(peers), peers, timeout_ms=60000) as ring:
        xs = [rank_data(i, 2049, np.float64, 3) for i in range(ring.size)]
        out = ring.allreduce(xs[ring.rank], np.empty(2049, np.float64), op="max")
        say(np.array_equal(out, np.max(xs, axis=0)), "explicit peers (allreduce float64 max)")
        got = ring.broadcast(np.full(3, ring.rank, np.int32), root=ring.size - 1)
        say(np.array_equal(got, np.full(3, ring.size - 1)), "explicit peers (broadcast from the last rank)")


def child_ring_dead():
    """Rank 2 kills itself (SIGKILL) after a first all-reduce; the others must raise, not hang."""
    import kvps
    ring = kvps.Ring(timeout_ms=5000)
    a = np.ones(1000, np.float32)
    ring.allreduce(a)
    if ring.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        for _ in range(1000):
            ring.allreduce(a)
        say(False, "a dead peer raises", "1000 all-reduces succeeded without rank 2")
    except kvps.Error as e:
        say(isinstance(e, (kvps.PeerError, kvps.Timeout)) and "rank 2" in e.message,
            "a dead peer raises kvps.PeerError or kvps.Timeout naming rank 2", "%s: %s" % (type(e).__name__, e))
    ring.close()


def child_rendezvous_timeout():
    """WORLD_SIZE=3 but only ranks 0 and 1 start: each must raise, naming rank 2."""
    import kvps
    try:
        kvps.Ring()
        say(False, "a rendezvous without rank 2 raises", "a ring formed")
    except kvps.Error as e:
        say(e.code in (-203, -101) and "2" in e.message and "rendezvous" in e.message.lower(),
            "a rendezvous without rank 2 raises kvps.Error naming it", "%s (%d): %s" % (e.name, e.code, e.message))


# The parameter-server job: 2 servers, 3 workers, BSP; worker 0 sets the rules.
PS_STEPS, PS_LEN, PS_LR = 6, 2500, 0.25
EMB_DIM, EMB_LR = 4, 0.5


def ps_grad(rank, step, n, salt=0):
    """Worker rank's gradient at a step: float32 with fractions (SGD's rounding is replayed exactly)."""
    rng = np.random.default_rng(1000 * rank + step + 77 * salt)
    return (rng.standard_normal(n) * (rank + 1)).astype(np.float32)


def ps_ids(rank, step):
    return np.array([(rank * 5 + step) % 9, 3, (rank + step) % 9, 3], np.uint64)  # duplicates: merged on the worker


def ps_oracle(nworkers):
    """Sequential replay of the servers' float32 rules, in rank order (kvps.h: BSP sums in rank order)."""
    acc = np.zeros(10, np.float32)
    w = np.zeros(PS_LEN, np.float32)
    emb = np.zeros((9, EMB_DIM), np.float32)
    accs, ws = [], []
    for step in range(PS_STEPS):
        s = np.zeros(10, np.float32)
        for k in range(nworkers):
            s = s + np.arange(10, dtype=np.float32) * (k + 1) + step  # small integers: exact
        acc = acc + s
        accs.append(acc.copy())
        g = np.zeros(PS_LEN, np.float32)
        for k in range(nworkers):
            g = g + ps_grad(k, step, PS_LEN)
        w = w - np.float32(PS_LR) * (g / np.float32(nworkers))  # value -= lr * (sum / count)
        ws.append(w.copy())
        for k in range(nworkers):  # rows: w -= lr * g, g small integers (merged duplicates): exact in any order
            for i in ps_ids(k, step):
                emb[int(i)] -= np.float32(EMB_LR) * np.float32(k + 1)
    return accs, ws, emb


def child_ps():
    import kvps
    e = kvps.env()
    if e.role == "server":
        with kvps.Server(update="mean") as s:
            s.run()  # returns once every worker has finished
        say(True, "server %d ends by itself once every worker has finished" % e.rank)
        return
    accs, ws, emb_want = ps_oracle(e.num_workers)
    with kvps.Worker(timeout_ms=30000) as w:
        k = e.rank
        w.tensor("acc", 10)
        w.tensor("w", PS_LEN)
        if k == 0:
            w.tensor("acc", 10, rule="accumulate")
            w.tensor("w", PS_LEN, rule="sgd", lr=PS_LR)
        emb = w.table("emb", EMB_DIM, rule="sgd", lr=EMB_LR)
        w.barrier()
        acc_ok = w_ok = True
        out = np.zeros(10, np.float32)
        wv = np.zeros(PS_LEN, np.float32)
        for step in range(PS_STEPS):
            w.pushpull("acc", np.arange(10, dtype=np.float32) * (k + 1) + step, out)
            acc_ok &= np.array_equal(out, accs[step])
            w.pushpull("w", ps_grad(k, step, PS_LEN), wv)
            w_ok &= np.array_equal(wv, ws[step])
            ids = ps_ids(k, step)
            emb.push(ids, np.full((len(ids), EMB_DIM), k + 1, np.float32))
        say(acc_ok, "ACCUMULATE of small integers equals the numpy sums, every round")
        say(w_ok, "SGD (lr %g) equals the sequential float32 replay bit for bit, every round" % PS_LR,
            "max diff %g" % np.max(np.abs(wv - ws[-1])))
        w.barrier()
        rows = emb.pull(np.arange(9, dtype=np.uint64))
        say(np.array_equal(rows, emb_want), "sparse table rows (SGD, duplicate ids merged) equal the replay",
            "max diff %g" % np.max(np.abs(rows - emb_want)))


def child_ring_codec():
    """The 16-bit wires (against the exact sum within kvps_ring.h's bound) and top-k (against a numpy replay)."""
    import kvps
    with kvps.Ring(timeout_ms=60000) as ring:
        r, n = ring.rank, ring.size
        xs = [np.random.RandomState(q + 1).standard_normal(70001).astype(np.float32) for q in range(n)]
        exact = np.sum(np.stack(xs).astype(np.float64), axis=0)
        mag = np.sum(np.abs(np.stack(xs).astype(np.float64)), axis=0)
        for wire, eps in (("fp16", 2.0 ** -10), ("bf16", 2.0 ** -7)):
            a = ring.allreduce_wire(xs[r].copy(), wire=wire)
            far = np.abs(a - exact) > (n + 1) * eps * mag + n * 2.0 ** -24
            same = ring.allgather(a.view(np.int32)).reshape(n, -1)
            say(not far.any() and all(np.array_equal(same[0], same[q]) for q in range(n)) and not np.array_equal(a, exact.astype(np.float32)),
                "allreduce_wire %s: within (n+1) eps sum|x| of the sum, the same bits on every rank" % wire,
                "%d elements too far" % int(far.sum()))
        k, cnt = 40, 4000
        res = [np.zeros(cnt, np.float32) for _ in range(n)]
        mine = np.zeros(cnt, np.float32)
        for step in range(2):
            gs = [np.random.RandomState(10 * q + step).standard_normal(cnt).astype(np.float32) for q in range(n)]
            want = np.zeros(cnt, np.float32)
            for q in range(n):
                v = gs[q] + res[q]
                keep = np.argsort(-np.abs(v), kind="stable")[:k]
                want[keep] += v[keep]
                res[q] = v.copy()
                res[q][keep] = 0
            b = gs[r].copy()
            ring.allreduce_topk(b, k, mine)
            say(np.array_equal(b, want) and np.array_equal(mine, res[r]),
                "allreduce_topk step %d: the numpy replay's sum and residual" % (step + 1),
                "%d elements differ" % int(np.count_nonzero(b != want)))
        for fn, words, name in ((lambda: ring.allreduce_wire(np.zeros(3, np.float64)), "dtype float64", "allreduce_wire of float64"),
                                (lambda: ring.allreduce_wire(np.zeros(3, np.float32), wire="int8"), "wire 'int8'", "allreduce_wire wire int8"),
                                (lambda: ring.allreduce_topk(np.zeros(3, np.float32), 4), "k 4 of 3", "allreduce_topk k > len")):
            try:
                fn()
                say(False, name + " raises", "no error")
            except kvps.InvalidArgument as e:
                say(words in str(e), name + " raises kvps.InvalidArgument", str(e))


CHILDREN = {"ring_codec": child_ring_codec, "ring": child_ring, "ring_explicit": child_ring_explicit, "ring_dead": child_ring_dead, "rendezvous_timeout": child_rendezvous_timeout, "ps": child_ps}

# ---- the driver -----------------------------------------------------------------------------

def run_job(kind, size, ranks=None, extra=None, per_rank=None):
    """Starts ranks (default all of size) of a job of kind; returns {rank: (exit code, output)}."""
    port = free_port()
    procs = {}
    for r in (range(size) if ranks is None else ranks):
        env = clean_env()
        env.update({"RANK": str(r), "WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        env.update(extra or {})
        env.update(per_rank(r) if per_rank else {})
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


def tally(job, out, expect_killed=()):
    """One check per name every rank reported: ok when all said ok; plus each process's exit."""
    names = {}
    for r, (rc, text) in out.items():
        for line in text.splitlines():
            if line.startswith("ok "):
                names.setdefault(line[3:], []).append((r, True, ""))
            elif line.startswith("FAIL "):
                name, _, why = line[5:].partition(": ")
                names.setdefault(name, []).append((r, False, why))
    for name, got in names.items():
        bad = [(r, why) for r, ok, why in got if not ok]
        check(not bad, "%s: %s" % (job, name), "; ".join("rank %d: %s" % b for b in bad))
    for r, (rc, text) in out.items():
        want = -signal.SIGKILL if r in expect_killed else 0
        ok = rc == want
        check(ok, "%s: rank %d %s" % (job, r, "ends by itself (exit 0)" if want == 0 else "was killed (SIGKILL)"),
              "output:\n    " + "\n    ".join(text.splitlines()[-15:]))


def python_env(with_lib=True):
    env = clean_env()
    env["PYTHONPATH"] = os.path.join(ROOT, "python")
    if not with_lib:
        env.pop("KVPS_LIB", None)
    return env


def test_in_process_errors():
    """kvps's messages, carried by kvps.Error: one process, a 1-rank ring, a server on a thread."""
    import kvps
    kvps.log_level("none")
    ring = kvps.Ring(0, 1, ["tcp://127.0.0.1:%d" % free_port()], timeout_ms=5000)

    def raises(fn, cls, words, name):
        try:
            fn()
            check(False, name, "no exception")
        except kvps.Error as e:
            check(isinstance(e, cls) and all(w in str(e) for w in words), name, "%s: %s" % (type(e).__name__, e))

    raises(lambda: ring.allreduce(np.zeros(3, np.complex128)), kvps.InvalidArgument, ["complex128", "allreduce send"],
           "a dtype kvps does not reduce: kvps.InvalidArgument naming it")
    raises(lambda: ring.allreduce(np.zeros((4, 4), np.float32)[:, 1]), kvps.InvalidArgument, ["C-contiguous"],
           "a strided array: kvps.InvalidArgument, not a copy")
    raises(lambda: ring.allreduce(np.zeros(4, np.float32), np.zeros(5, np.float32)), kvps.InvalidArgument,
           ["5 elements, 4 needed"], "recv of the wrong length: refused")
    raises(lambda: ring.allreduce(np.zeros(4, np.float32), np.zeros(4, np.float64)), kvps.InvalidArgument,
           ["float64", "float32"], "recv of another dtype: refused")
    raises(lambda: ring.broadcast(np.zeros(4, np.float32), root=5), kvps.InvalidArgument,
           ["KVPS_ERR_INVALID_ARG", "root 5 is not a rank of this ring of 1"], "a root out of range: kvps's words")
    raises(lambda: ring.allreduce(np.zeros(4, np.float32), op="mean"), kvps.InvalidArgument, ["op 'mean'"],
           "an unknown op: named")
    a = np.arange(6, dtype=np.int32)
    ring.allreduce(a)
    check(np.array_equal(a, np.arange(6)), "a 1-rank ring's all-reduce is the identity")
    ring.close()
    ring.close()
    raises(lambda: kvps.Ring(3, 2, ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]), kvps.Error, ["kvps_ring_create"],
           "a rank not below the size: kvps.Error from kvps_ring_create")

    srv = kvps.Server("tcp://127.0.0.1:*", num_workers=1, update="accumulate").start()
    with kvps.Worker(srv.endpoint, 0, 1, timeout_ms=10000) as w:
        w.push("t", np.ones(4, np.float32))
        raises(lambda: w.push("t", np.ones(5, np.float32)), kvps.Error, ["KVPS_ERR_TENSOR", "'t'", "4 floats", "5"],
               "a tensor used with two lengths: KVPS_ERR_TENSOR naming both")
        raises(lambda: w.push("t", np.ones(4, np.float64)), kvps.InvalidArgument, ["float64", "float32"],
               "a float64 gradient: refused, naming the dtypes")
        raises(lambda: w.pull("t", np.ones(4, np.float32)[::-1]), kvps.InvalidArgument, ["C-contiguous"],
               "a strided pull target: refused")
        raises(lambda: w.tensor("u", 3, rule="rmsprop"), kvps.InvalidArgument, ["rule 'rmsprop'"], "an unknown rule: named")
        raises(lambda: w.tensor("u", 3, rule="sgd", lr=-1.0), kvps.Error, ["KVPS_ERR_HYPERPARAM"],
               "a negative learning rate: KVPS_ERR_HYPERPARAM from the server")
        raises(lambda: w.tensor("u", 3, rule="sgd", weight_decay=0.1), kvps.Error, ["weight_decay"],
               "weight_decay with SGD (kvps_abi_worker_tensor_optim_wd): refused naming weight_decay")
        w.tensor("aw", 3, rule="adamw", lr=0.5, weight_decay=0.5)
        aw = np.full(3, 2.0, np.float32)
        w.init("aw", aw)
        w.pushpull("aw", np.zeros(3, np.float32), aw)  # a zero gradient: only the decay, w * f(1 - 0.5 * 0.5)
        check(np.array_equal(aw, np.full(3, 1.5, np.float32)), "adamw's weight_decay reaches the server", str(aw))
        t = w.table("emb", 3, rule="sgd", lr=1.0)
        raises(lambda: t.push(np.array([1, 2], np.uint64), np.ones((3, 3), np.float32)), kvps.InvalidArgument,
               ["table 'emb'", "2 rows of dim 3", "9 floats"], "table rows and gradients that disagree: named")
        out = np.zeros(4, np.float32)
        w.pull("t", out)
        check(np.array_equal(out, np.ones(4)), "the server kept the one good push (ACCUMULATE)", str(out))
        q = w.pushpull("t", np.full(4, 2, np.float32), out, wait=False)
        check(isinstance(q, kvps.Request), "wait=False returns a request")
        q.wait()
        q.wait()
        check(np.array_equal(out, np.full(4, 3)), "a request's result is in place once wait returns (twice is harmless)", str(out))
    srv.wait(20000)
    srv.close()
    check(True, "a worker's context manager finishes it, and the server then ends by itself")


def test_import_errors():
    env = python_env()
    env["KVPS_LIB"] = "/nonexistent/libkvps.so"
    p = subprocess.run([sys.executable, "-c", "import kvps"], env=env, capture_output=True, text=True, timeout=60)
    check(p.returncode != 0 and "ImportError" in p.stderr and "/nonexistent/libkvps.so ($KVPS_LIB)" in p.stderr,
          "KVPS_LIB naming no library: ImportError saying what was tried", p.stderr[-400:])
    lib = os.environ.get("KVPS_LIB", "")
    if os.path.abspath(lib) == os.path.join(ROOT, "build", "libkvps.so"):
        p = subprocess.run([sys.executable, "-c", "import kvps; print(kvps.library_path)"], env=python_env(False),
                           capture_output=True, text=True, timeout=60, cwd=tempfile.gettempdir())
        check(p.returncode == 0 and p.stdout.strip() == os.path.join(ROOT, "build", "libkvps.so"),
              "PYTHONPATH=python without KVPS_LIB finds the source tree's build/libkvps.so", p.stdout + p.stderr[-400:])


def test_library_surface():
    """libkvps.so exports the public kvps_* API and no kvps__ internals; the package declares every
    function kvps_abi.h has (a function added to the ABI and forgotten here fails)."""
    import re
    import kvps
    from kvps import _lib
    import shutil
    p = subprocess.run(["nm", "-D", "--defined-only", kvps.library_path], capture_output=True, text=True) \
        if shutil.which("nm") else subprocess.CompletedProcess([], 1, "", "no nm (binutils)")
    if p.returncode != 0:
        skip("the symbol check", "nm -D failed (%s)" % p.stderr.strip()[-200:])
    else:
        syms = [line.split()[-1] for line in p.stdout.splitlines() if line.split()[1:2] in (["T"], ["D"], ["B"], ["R"])]
        bad = [x for x in syms if not x.startswith("kvps_") or x.startswith("kvps__")]
        check(not bad and len(syms) > 100, "libkvps.so exports only the public kvps_* API (%d symbols)" % len(syms),
              "also exported: %s" % bad[:10])
    with open(os.path.join(ROOT, "kvps_abi.h")) as f:
        declared = set(re.findall(r"^KVPS_API [^(]*?\b(kvps_abi_\w+)\(", f.read(), re.M))
    missing = sorted(declared - set(_lib._PROTOS))
    check(len(declared) > 30 and not missing, "python/kvps declares every function of kvps_abi.h (%d)" % len(declared),
          "not declared: %s" % missing)


def test_readme_examples():
    """The first two Python blocks of README's "From Python" (numpy's), run as they are: 3 ring ranks, then 2 servers + 3 workers."""
    import re
    with open(os.path.join(ROOT, "README.md")) as f:
        md = f.read()
    sec = md[md.index("## From Python"):]
    sec = sec[:sec.index("\n## ", 5)]
    blocks = re.findall(r"```python\n(.*?)```", sec, re.S)
    if len(blocks) < 2:  # the first two are numpy's; kvps.torch's come after them
        check(False, "README's From Python has two Python blocks first", "found %d" % len(blocks))
        return
    with tempfile.TemporaryDirectory() as tmp:
        for i, (size, extra, want) in enumerate(((3, {}, "[6. 6. 6. 6.] [0 1 2]"),
                                                 (5, {"KVPS_NUM_SERVERS": "2"}, "[-1.5 -1.5 -1.5 -1.5]"))):
            path = os.path.join(tmp, "example%d.py" % i)
            with open(path, "w") as f:
                f.write(blocks[i])
            port = free_port()
            procs = []
            for r in range(size):
                env = python_env()
                env.update({"RANK": str(r), "WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
                env.update(extra)
                procs.append(subprocess.Popen([sys.executable, path], env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True))
            outs = []
            for p in procs:
                try:
                    outs.append((p.communicate(timeout=BOUND_S)[0], p.returncode))
                except subprocess.TimeoutExpired:
                    p.kill()
                    outs.append((p.communicate()[0], "hung"))
            printed = sum(o.count(want) for o, _ in outs)
            check(all(rc == 0 for _, rc in outs) and printed == 3, "README's Python example %d prints %s on 3 ranks" % (i + 1, want),
                  " | ".join("%s %s" % (rc, o.strip()[-200:]) for o, rc in outs))


def test_pip_install():
    """pip install ./python into a fresh virtual environment (offline), then a 1-rank ring from there."""
    with tempfile.TemporaryDirectory() as tmp:
        venv = os.path.join(tmp, "venv")
        p = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], capture_output=True, text=True,
                           timeout=120)
        if p.returncode != 0:
            skip("pip install ./python", "no venv module (%s)" % p.stderr.strip()[-200:])
            return
        py = os.path.join(venv, "bin", "python")
        env = clean_env()  # with KVPS_LIB: the library this run tests goes into the package
        env.pop("PYTHONPATH", None)
        p = subprocess.run([py, "-m", "pip", "install", "--no-index", "-q", os.path.join(ROOT, "python")],
                           env=env, capture_output=True, text=True, timeout=300, cwd=tmp)
        check(p.returncode == 0, "pip install ./python (offline, into a venv)", (p.stdout + p.stderr)[-800:])
        code = ("import kvps, numpy as np; r = kvps.Ring(0, 1, ['tcp://127.0.0.1:%d']); a = np.ones(3, np.float32); "
                "r.allreduce(a); print(kvps.library_path, a.sum())" % free_port())
        env.pop("KVPS_LIB", None)  # the installed package finds its own copy
        p = subprocess.run([py, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=tmp)
        check(p.returncode == 0 and p.stdout.startswith(venv) and p.stdout.split()[-1] == "3.0",
              "the installed package loads its own libkvps.so and runs", (p.stdout + p.stderr)[-600:])


def main():
    sys.path.insert(0, os.path.join(ROOT, "python"))
    os.environ.setdefault("PYTHONPATH", os.path.join(ROOT, "python"))
    if "--child" in sys.argv:
        CHILDREN[sys.argv[sys.argv.index("--child") + 1]]()
        return 0
    test_import_errors()
    test_library_surface()
    test_in_process_errors()
    tally("ring (3 ranks)", run_job("ring", 3))
    tally("ring codecs (3 ranks)", run_job("ring_codec", 3))
    peers = ",".join("tcp://127.0.0.1:%d" % free_port() for _ in range(3))
    tally("ring (3 ranks, explicit peers)", run_job("ring_explicit", 3, per_rank=lambda r: {"TEST_PEERS": peers, "TEST_RANK": str(r)}))
    tally("ps (2 servers, 3 workers)", run_job("ps", 5, extra={"KVPS_NUM_SERVERS": "2"}))
    tally("dead peer (rank 2 SIGKILLed)", run_job("ring_dead", 3), expect_killed=(2,))
    tally("rendezvous timeout", run_job("rendezvous_timeout", 3, ranks=(0, 1), extra={"KVPS_RENDEZVOUS_TIMEOUT": "1"}))
    test_readme_examples()
    test_pip_install()
    print("%d passed, %d failed%s" % (results["pass"], results["fail"],
                                      ", %d skipped" % results["skip"] if results["skip"] else ""))
    return 1 if results["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
