"""bench/embedding_bag.py - kvps.torch.EmbeddingBag (its table on kvps servers over loopback) next to
torch.nn.EmbeddingBag in this process, in the same run: rows/s of forward + backward + update.

    PYTHONPATH=python /usr/bin/python3 bench/embedding_bag.py [--servers 1|2] [--repeats 5]
        [--steps 20] [--batch 2048] [--bag 20] [--dim 64] [--rows 1000000] [--mode sum]

One worker (this process) and --servers server processes (kvps.Server on tcp://127.0.0.1:*,
BSP; tables are applied on arrival anyway). A step is one batch of --batch bags of --bag ids
(Zipf-distributed over --rows, so batches repeat popular ids as real click logs do): forward,
a loss, backward, the update. kvps: forward pulls the batch's distinct rows from the servers,
backward pushes their gradients, SGD runs on the servers. torch: nn.EmbeddingBag(sparse=True)
with torch.optim.SGD (a sparse gradient: the update touches only the batch's rows, as kvps's
does). The two alternate within each repeat (kvps first in even repeats), on the same batches.
Printed: each repeat's rows/s (ids looked up per second, and distinct rows per second), then the
range over the repeats and the range of the per-repeat ratio kvps / torch. Everything printed is
measured in this run.
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np
import torch

import kvps
import kvps.torch

SERVER = ("import sys, kvps\n"
          "s = kvps.Server('tcp://127.0.0.1:*', rank=int(sys.argv[1]), num_workers=1)\n"
          "print(s.endpoint, flush=True)\n"
          "s.run()\n")


def batches(rng, a, n):
    p = 1.0 / np.arange(1, a.rows + 1) ** 1.05
    p /= p.sum()
    out = []
    for _ in range(n):
        ids = torch.from_numpy(rng.choice(a.rows, size=a.batch * a.bag, p=p).astype(np.int64))
        offsets = torch.arange(0, a.batch * a.bag, a.bag, dtype=torch.int64)
        out.append((ids, offsets, int(ids.unique().numel())))
    return out


def run(model, opt, data, head):
    t0 = time.perf_counter()
    for ids, offsets, _ in data:
        out = model(ids, offsets)
        loss = (out @ head).square().mean()
        if opt is not None:
            opt.zero_grad()
        loss.backward()
        if opt is not None:
            opt.step()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--bag", type=int, default=20)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--rows", type=int, default=1000000)
    ap.add_argument("--mode", default="sum")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in this process (1: like the servers)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    env = dict(os.environ)
    srv = [subprocess.Popen([sys.executable, "-c", SERVER, str(i)], env=env, stdout=subprocess.PIPE, text=True)
           for i in range(a.servers)]
    try:
        eps = [p.stdout.readline().strip() for p in srv]
        with kvps.Worker(",".join(eps), 0, 1) as w:
            lr = 0.01
            emb = kvps.torch.EmbeddingBag(a.rows, a.dim, w, mode=a.mode, name="bench", rule="sgd", lr=lr, init_scale=0.01)
            local = torch.nn.EmbeddingBag(a.rows, a.dim, mode=a.mode, sparse=True)
            opt = torch.optim.SGD(local.parameters(), lr=lr)
            head = torch.randn(a.dim)
            rng = np.random.default_rng(1)
            warm = batches(rng, a, 2)
            run(emb, None, warm, head)  # first touch creates the rows on the servers
            run(local, opt, warm, head)
            print("embedding_bag: %d server(s) on loopback, 1 worker; %d steps x %d bags x %d ids, dim %d, %d rows, mode %s, "
                  "torch %s, %d thread(s)" % (a.servers, a.steps, a.batch, a.bag, a.dim, a.rows, a.mode, torch.__version__,
                                              a.threads), flush=True)
            ks, ts, ratios = [], [], []
            for r in range(a.repeats):
                data = batches(rng, a, a.steps)
                ids_n = sum(x[0].numel() for x in data)
                uniq_n = sum(x[2] for x in data)
                if r % 2 == 0:
                    tk = run(emb, None, data, head)
                    tt = run(local, opt, data, head)
                else:
                    tt = run(local, opt, data, head)
                    tk = run(emb, None, data, head)
                ks.append(ids_n / tk)
                ts.append(ids_n / tt)
                ratios.append(tt / tk)
                print("  repeat %d: kvps %.3g ids/s (%.3g distinct rows/s), torch %.3g ids/s (%.3g distinct rows/s), "
                      "kvps/torch %.3f" % (r, ids_n / tk, uniq_n / tk, ids_n / tt, uniq_n / tt, tt / tk), flush=True)
            print("kvps.torch.EmbeddingBag  %.3g - %.3g ids/s" % (min(ks), max(ks)))
            print("torch.nn.EmbeddingBag    %.3g - %.3g ids/s" % (min(ts), max(ts)))
            print("ratio kvps / torch       %.3f - %.3f (median %.3f) over %d repeats" %
                  (min(ratios), max(ratios), float(np.median(ratios)), a.repeats))
    finally:
        for p in srv:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
