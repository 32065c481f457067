"""kvps.torch.ps against PyTorch itself, with real processes on loopback (make python-check).

    /usr/bin/python3 tests/python/test_torch_ps.py      (PYTHONPATH=python, KVPS_LIB=build/libkvps.so)

Servers are python processes (kvps.Server on "tcp://127.0.0.1:*", each printing its endpoint);
workers are this file run again (--child KIND ...). Each check prints "ok NAME" or "FAIL NAME:
why", measurements "measured NAME: ..."; the last line is "N passed, N failed".

Oracles, computed in each worker from the same seeded gradients:
  ServerOptimizer   torch.optim.SGD / Adam / AdamW on a local copy of the parameters, stepped
                    with the mean gradient ((g_0 + g_1 + ...) / M in float32, rank order, which is
                    what a BSP round computes), 1 worker (exactness) and 3 workers on 2 servers;
                    and SSP (staleness 2): after the last step and a barrier every round is in,
                    so the pulled weights equal the same oracle. torch gets kvps's float32
                    hyper-parameters (float(np.float32(0.01))): AdamW's bias corrections use
                    them in double, and 0.01 as a double gives other bits. Bounds: "adamw" 0
                    ulps against torch.optim.AdamW and (weight_decay 0) torch.optim.Adam; "sgd"
                    and "adam" within ULP_SGD / ULP_ADAM (kvps's formulas round otherwise:
                    ps.py says how).
  README            the From Python block that uses kvps.torch, run as it is (its loss must halve)
  EmbeddingBag      a local torch.nn.EmbeddingBag starting from the table's rows, under
                    torch.optim.SGD / Adagrad (dense gradients: untouched rows do not move):
                    outputs and every row of the table after each step within ULP_EMB ulps of
                    the largest; sum and mean; bags with the same id twice and ids shared
                    between bags. The forward on the table's current rows is torch's
                    embedding_bag bit for bit; the rows drift from torch's by ulps because
                    SGD's update is unfused (above) and torch's backward sums a repeated id's
                    gradients (and scales mean bags) in another order of roundings.
Measured here (Debian's torch 1.13, x86-64, 30 steps x 471 weights; 1 worker / 3 workers on 2
servers): adamw against AdamW and adamw (weight_decay 0) against Adam 0 ulps both ways; sgd 2 / 1
ulps of the largest weight; adam 2 / 3; the embedding bag's outputs 1-3 and rows 1-3 ulps of the
largest (up to 184 element-wise, at rows near 0), its forward on the same rows 0.
Ulps are counted two ways: element by element, and in units of the last place of the tensor's
largest magnitude (a weight near zero after a cancellation has tiny ulps, where an error of one
rounding of its neighbours counts thousands); the bounds apply to the second, 0 to both.
"""
import math
import os
import subprocess
import sys
import time
from kt import results, say, check  # noqa: E402  (tests/python/kt.py)

HERE = os.path.dirname(os.path.abspath(__file__))
BOUND_S = 240  # a job not ended by then hangs: killed, and its checks fail
STEPS = 30
# bounds in ulps (see the module docstring; the measured figures are printed as "measured")
ULP_SGD = 4
ULP_ADAM = 8
ULP_EMB = 4

# ---- the child side -------------------------------------------------------------------------


def ulps(a, b):
    """(max distance in float32 ulps between a and b element by element, the same in units of the
    last place of b's largest magnitude: a difference at a weight near 0 counts at the tensor's scale)."""
    import torch

    def ordered(x):
        i = x.detach().contiguous().view(torch.int32).to(torch.int64)
        return torch.where(i < 0, -(i & 0x7FFFFFFF), i)
    if not a.numel():
        return 0, 0.0
    d = (ordered(a) - ordered(b)).abs().max().item()
    big = b.detach().abs().max().item()
    unit = 2.0 ** (math.frexp(big)[1] - 24) if big > 0 else 2.0 ** -149
    return d, (a.detach().double() - b.detach().double()).abs().max().item() / unit


def grad_of(rank, step, shape):
    import torch
    g = torch.Generator().manual_seed(1000003 * (rank + 1) + 7919 * step + len(shape))
    return torch.randn(shape, generator=g, dtype=torch.float32) * (0.5 + 0.1 * rank)


SHAPES = [("layer.weight", (17, 9)), ("layer.bias", (17,)), ("head", (300,)), ("scalar", (1,))]


def initial(shape, salt):
    import torch
    return torch.randn(shape, generator=torch.Generator().manual_seed(77 + salt + len(shape)), dtype=torch.float32)


def child_opt(servers, rank, nworkers, rule, kvps_kw, torch_name, torch_kw, bound, label):
    import torch
    import kvps
    import kvps.torch.ps as ps
    torch.set_num_threads(1)
    with kvps.Worker(servers, rank, nworkers) as w:
        # every rank starts from its own weights: the servers must hand out rank 0's
        params = [(n, torch.nn.Parameter(initial(s, 100 * rank))) for n, s in SHAPES]
        opt = ps.ServerOptimizer(params, w, rule=rule, prefix=label + ".", **kvps_kw)
        local = [torch.nn.Parameter(initial(s, 0)) for _, s in SHAPES]
        start_ok = all(torch.equal(p.data, q.data) for (_, p), q in zip(params, local))
        say(start_ok, "%s: every worker starts from rank 0's weights" % label, "max difference %g" % max(
            (p.data - q.data).abs().max().item() for (_, p), q in zip(params, local)))
        ref = getattr(torch.optim, torch_name)(local, **torch_kw)
        worst, worst_rel = 0, 0.0
        for step in range(STEPS):
            for (n, p), q, (_, s) in zip(params, local, SHAPES):
                p.grad = grad_of(rank, step, s)
                gs = [grad_of(r, step, s) for r in range(nworkers)]
                acc = gs[0].clone()
                for g in gs[1:]:
                    acc = acc + g
                q.grad = acc / float(nworkers)
            opt.step()
            ref.step()
            opt.zero_grad()
            for (_, p), q in zip(params, local):
                d, scaled = ulps(p.data, q.data)
                worst, worst_rel = max(worst, d), max(worst_rel, scaled)
        print("measured %s: %smax %d ulps element-wise, %.2f ulps of each tensor's largest weight, over %d steps x %d weights"
              % (label, "stale pulls during training, not checked: " if "ssp" in label else "", worst, worst_rel, STEPS,
                 sum(p.numel() for _, p in params)), flush=True)
        if "ssp" not in label:  # under SSP a pull may miss the newest rounds: only the end is checked
            ok = worst == 0 if bound == 0 else worst_rel <= bound
            say(ok, "%s: against torch.optim.%s within %s" % (label, torch_name, "0 ulps" if bound == 0 else
                                                               "%d ulps of the largest weight" % bound),
                "%d ulps element-wise, %.2f of the largest weight" % (worst, worst_rel))
        if nworkers > 1:
            w.barrier()  # SSP: every round is in once every worker got here
            opt.pull()
            d, scaled = max(ulps(p.data, q.data) for (_, p), q in zip(params, local))
            say(d == 0 if bound == 0 else scaled <= bound, "%s: weights pulled after the last round against the oracle"
                % label, "%d ulps (%.2f of the largest weight)" % (d, scaled))


def child_emb(servers, rule, mode, label):
    import torch
    import kvps
    import kvps.torch.ps as ps
    torch.set_num_threads(1)
    N, D = 40, 6
    lr = 0.05
    with kvps.Worker(servers, 0, 1) as w:
        kw = dict(lr=lr, eps=1e-10) if rule == "adagrad" else dict(lr=lr)
        emb = ps.EmbeddingBag(N, D, w, mode=mode, name=label, rule=rule, init_scale=0.5, seed=11, **kw)
        local = torch.nn.EmbeddingBag(N, D, mode=mode)
        with torch.no_grad():
            local.weight.copy_(emb.rows(torch.arange(N)))
        say(local.weight.abs().max().item() > 0 and local.weight.abs().max().item() <= 0.5,
            "%s: the table's initial rows are kvps's init_scale" % label)
        if rule == "sgd":
            ref = torch.optim.SGD(local.parameters(), lr=lr)
        else:
            ref = torch.optim.Adagrad(local.parameters(), lr=lr, eps=1e-10)
        head = torch.randn(D, generator=torch.Generator().manual_seed(3))
        gen = torch.Generator().manual_seed(5)
        worst_out, worst_w = (0, 0.0), (0, 0.0)
        dup_seen = False
        fwd_exact = True
        for step in range(STEPS):
            nb = 7
            lens = torch.randint(0, 6, (nb,), generator=gen)
            ids = torch.randint(0, N // 2 if step % 3 == 0 else N, (int(lens.sum()),), generator=gen)
            if ids.numel() >= 2:
                ids[1] = ids[0]  # a bag (or two) with the same id twice
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)[:-1]])
            dup_seen = dup_seen or ids.unique().numel() < ids.numel()
            target = torch.randn(nb, generator=gen)
            table_now = emb.rows(torch.arange(N))
            out = emb(ids, offsets)
            want = local(ids, offsets)
            same = torch.nn.functional.embedding_bag(ids, table_now, offsets, mode=mode)
            fwd_exact = fwd_exact and torch.equal(out.detach(), same)
            worst_out = max(worst_out, ulps(out.detach(), want.detach()), key=lambda x: x[1])
            loss = ((torch.tanh(out @ head) - target) ** 2).sum()
            loss_ref = ((torch.tanh(want @ head) - target) ** 2).sum()
            ref.zero_grad()
            loss.backward()
            loss_ref.backward()
            ref.step()
            worst_w = max(worst_w, ulps(emb.rows(torch.arange(N)), local.weight.detach()), key=lambda x: x[1])
        # the 2-D form (each row a bag) gives the same as offsets
        x = torch.randint(0, N, (5, 3), generator=gen)
        with torch.no_grad():
            a, b = emb(x), local(x)
        worst_out = max(worst_out, ulps(a, b), key=lambda x: x[1])
        print("measured %s: outputs %.2f ulps of the batch's largest output (%d element-wise), rows %.2f ulps of the "
              "table's largest weight (%d element-wise) over %d steps (%d rows pulled, %d pushed)" %
              (label, worst_out[1], worst_out[0], worst_w[1], worst_w[0], STEPS, emb.rows_pulled, emb.rows_pushed), flush=True)
        say(dup_seen, "%s: batches had duplicate ids" % label)
        say(fwd_exact, "%s: forward bit-identical to torch's embedding_bag on the table's current rows" % label)
        say(worst_out[1] <= ULP_EMB, "%s: outputs against torch.nn.EmbeddingBag within %d ulps of the largest" % (label, ULP_EMB),
            "%.2f ulps" % worst_out[1])
        say(worst_w[1] <= ULP_EMB, "%s: every row after each step against torch.optim.%s within %d ulps of the largest"
            % (label, "SGD" if rule == "sgd" else "Adagrad", ULP_EMB), "%.2f ulps" % worst_w[1])


def child_errors(servers):
    import torch
    import kvps
    import kvps.torch.ps as ps

    def raises(fn, words, name):
        try:
            fn()
        except kvps.InvalidArgument as e:
            say(all(x in str(e) for x in words), name, "message %r lacks %r" % (str(e), words))
            return
        except Exception as e:
            say(False, name, "raised %s: %s" % (type(e).__name__, e))
            return
        say(False, name, "no error")
    with kvps.Worker(servers, 0, 1) as w:
        raises(lambda: ps.ServerOptimizer([torch.zeros(4, 4).t()], w), ["'p0'", "not contiguous"],
               "a non-contiguous parameter is refused, naming it")
        raises(lambda: ps.ServerOptimizer([("fc.w", torch.zeros(3, dtype=torch.float64))], w), ["'fc.w'", "float64"],
               "a float64 parameter is refused, naming it")
        raises(lambda: ps.ServerOptimizer([], w), ["no parameters"], "no parameters is refused")
        raises(lambda: ps.ServerOptimizer([torch.zeros(2)], "w"), ["kvps.Worker"], "a worker that is not a kvps.Worker")
        e = ps.EmbeddingBag(10, 4, w, name="err")
        raises(lambda: e(torch.tensor([1, 10]), torch.tensor([0])), ["'err'", "out of range", "10"],
               "an id past num_embeddings is refused")
        raises(lambda: e(torch.tensor([1, 2])), ["offsets"], "1-D input without offsets is refused")
        raises(lambda: e(torch.tensor([1.0])), ["LongTensor"], "float ids are refused")
        raises(lambda: ps.EmbeddingBag(10, 4, w, mode="max"), ["mode", "max"], "mode max is refused")
        try:
            ps.EmbeddingBag(10, 4, w, name="aw", rule="adamw")
            say(False, "a table with rule adamw is refused by the servers", "no error")
        except kvps.Error as ex:
            say(True, "a table with rule adamw is refused by the servers")
            print("  (kvps said: %s)" % ex, flush=True)


# ---- the driver -----------------------------------------------------------------------------


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(HERE, "..", "..", "python") + os.pathsep + e.get("PYTHONPATH", "")
    e["OMP_NUM_THREADS"] = "1"
    return e


SERVER = ("import sys, kvps\n"
          "s = kvps.Server('tcp://127.0.0.1:*', rank=int(sys.argv[1]), num_workers=int(sys.argv[2]),"
          " consistency=sys.argv[3], staleness=int(sys.argv[4]))\n"
          "print(s.endpoint, flush=True)\n"
          "s.run()\n")


def job(label, nservers, nworkers, kind, args, consistency="bsp", staleness=0):
    """Starts nservers servers and nworkers workers (this file, --child kind args); tallies their lines."""
    srv = [subprocess.Popen([sys.executable, "-c", SERVER, str(i), str(nworkers), consistency, str(staleness)],
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(nservers)]
    eps = [p.stdout.readline().strip() for p in srv]
    if not all(e.startswith("tcp://") for e in eps):
        for p in srv:
            p.kill()
        check(False, "%s: servers start" % label, repr(eps))
        return
    wk = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", kind, ",".join(eps), str(r), str(nworkers)]
                           + list(args), env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
          for r in range(nworkers)]
    end = time.monotonic() + BOUND_S
    outs = []
    for p in wk + srv:
        try:
            text, _ = p.communicate(timeout=max(1, end - time.monotonic()))
            outs.append((p.returncode, text))
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
            outs.append(("hung (killed after %d s)" % BOUND_S, text))
    names = {}
    for i, (rc, text) in enumerate(outs):
        who = ("worker %d" % i) if i < nworkers else ("server %d" % (i - nworkers))
        for line in text.splitlines():
            if line.startswith("ok "):
                names.setdefault(line[3:], []).append((who, True, ""))
            elif line.startswith("FAIL "):
                n, _, why = line[5:].partition(": ")
                names.setdefault(n, []).append((who, False, why))
            elif line.startswith("measured ") or line.startswith("  ("):
                print("%s %s" % (who, line), flush=True)
        if rc != 0:
            check(False, "%s: %s ends by itself (exit 0)" % (label, who), "exit %s:\n    %s" % (rc, "\n    ".join(text.splitlines()[-15:])))
    if not names:
        check(False, "%s: the workers reported" % label, "no lines")
    for n, got in names.items():
        bad = [(who, why) for who, ok, why in got if not ok]
        check(not bad, n, "; ".join("%s: %s" % b for b in bad))


def readme_block():
    """README's From Python block that uses kvps.torch, run as it is: a worker with kvps-run's
    variables (KVPS_ROLE, KVPS_RANK, KVPS_SERVERS, KVPS_NUM_WORKERS) and 2 server processes."""
    import re
    md = open(os.path.join(HERE, "..", "..", "README.md")).read()
    sec = md[md.index("## From Python"):]
    sec = sec[:sec.index("\n## ", 5)]
    blocks = [b for b in re.findall(r"```python\n(.*?)```", sec, re.S) if "kvps.torch" in b]
    if len(blocks) != 1:
        check(False, "README's From Python has one kvps.torch block", "found %d" % len(blocks))
        return
    srv = [subprocess.Popen([sys.executable, "-c", SERVER, str(i), "1", "bsp", "0"], env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for i in range(2)]
    eps = [p.stdout.readline().strip() for p in srv]
    e = env()
    e.update({"KVPS_ROLE": "worker", "KVPS_RANK": "0", "KVPS_NUM_WORKERS": "1", "KVPS_NUM_SERVERS": "2",
              "KVPS_SERVERS": ",".join(eps)})
    try:
        p = subprocess.run([sys.executable, "-c", blocks[0]], env=e, capture_output=True, text=True, timeout=BOUND_S)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired:
        out, rc = "", "hung"
    for q in srv:
        try:
            q.wait(timeout=30)
        except subprocess.TimeoutExpired:
            q.kill()
    losses = [float(x.split()[1]) for x in out.splitlines() if len(x.split()) == 2 and x.split()[0].isdigit()]
    check(rc == 0 and len(losses) == 20 and losses[-1] < losses[0] / 2,
          "README's kvps.torch block runs as it is (2 servers) and its loss falls by half",
          "exit %s, losses %s:\n    %s" % (rc, losses, "\n    ".join(out.splitlines()[-10:])))
    if losses:
        print("measured README block: loss %.4f -> %.4f over %d steps" % (losses[0], losses[-1], len(losses)), flush=True)


def main():
    import json
    import numpy as np
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        kind, servers, rank, nworkers = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        rest = sys.argv[6:]
        if kind == "opt":
            rule, kkw, tname, tkw, bound, label = rest[0], json.loads(rest[1]), rest[2], json.loads(rest[3]), int(rest[4]), rest[5]
            child_opt(servers, rank, nworkers, rule, kkw, tname, tkw, bound, label)
        elif kind == "emb":
            child_emb(servers, rest[0], rest[1], rest[2])
        elif kind == "errors":
            child_errors(servers)
        return
    only = sys.argv[1:]  # labels to run (default: all)

    def opt(label, nservers, nworkers, rule, kkw, tname, tkw, bound, consistency="bsp", staleness=0):
        if only and not any(o in label for o in only):
            return
        job(label, nservers, nworkers, "opt", [rule, json.dumps(kkw), tname, json.dumps(tkw), str(bound), label],
            consistency, staleness)

    # torch gets the float32 values kvps's servers hold (kvps_optim is float; torch.optim's are
    # Python doubles, which AdamW's bias corrections use in double)
    f = lambda x: float(np.float32(x))  # noqa: E731
    adam = dict(lr=f(0.01), betas=(f(0.9), f(0.999)), eps=f(1e-8))
    adamk = dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8)
    for nw, ns in ((1, 1), (3, 2)):
        tag = "%dw%ds" % (nw, ns)
        opt("sgd-%s" % tag, ns, nw, "sgd", dict(lr=0.1), "SGD", dict(lr=f(0.1)), ULP_SGD)
        opt("adamw-%s" % tag, ns, nw, "adamw", dict(adamk, weight_decay=0.01), "AdamW", dict(adam, weight_decay=f(0.01)), 0)
        opt("adamw0-as-adam-%s" % tag, ns, nw, "adamw", adamk, "Adam", adam, 0)
        opt("adam-%s" % tag, ns, nw, "adam", adamk, "Adam", adam, ULP_ADAM)
    opt("adamw-3w2s-ssp2", 2, 3, "adamw", dict(adamk, weight_decay=0.01), "AdamW", dict(adam, weight_decay=f(0.01)), 0,
        consistency="ssp", staleness=2)
    for rule in ("sgd", "adagrad"):
        for mode in ("sum", "mean"):
            label = "emb-%s-%s" % (rule, mode)
            if not only or any(o in label for o in only):
                job(label, 2, 1, "emb", [rule, mode, label])
    if not only or "errors" in only:
        job("errors", 1, 1, "errors", [])
    if not only or "readme" in only:
        readme_block()
    print("%d passed, %d failed" % (results["pass"], results["fail"]), flush=True)
    sys.exit(1 if results["fail"] else 0)


if __name__ == "__main__":
    main()
