"""ctr_embeddings.py - a click-through-rate model in PyTorch whose embedding tables live on kvps servers.

    scripts/kvps-run -s 2 -w 2 -- /usr/bin/python3 examples/python/ctr_embeddings.py
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 KVPS_NUM_SERVERS=2 \\
        /usr/bin/python3 -m torch.distributed.run --redirects 1 --tee 1 --nproc_per_node 4 \\
        examples/python/ctr_embeddings.py
    (PYTHONPATH=python and a built build/libkvps.so, or `pip install ./python`; Debian's torch 1.13
    on Python 3.11 needs torchrun's --redirects 1 --tee 1.)

Every process runs this file: kvps.env() says whether it is a server (kvps.Server().run(), until
every worker has finished) or a worker. The model: F categorical fields (user, ad, site, ...)
whose values, Zipf-distributed over vocabularies of 10 to 10^4, are hashed with their field
into one id space (the hashing trick) and looked up in a kvps.torch.EmbeddingBag (a sparse table
on the servers, Adagrad per row: only the batch's rows are pulled and pushed); a multi-valued
"tags" field (0 to 4 tags per example) is a bag of another table, averaged (mode "mean"). The
embeddings, concatenated, go through a small MLP to a logit; the loss is the log loss. The MLP's
weights are on the servers too (kvps.torch.ServerOptimizer, AdamW, BSP: every step is a round
of all workers' gradients). The clicks come from a known generator (a true logistic model over
the same fields with random weights), so the result can be judged: each worker prints the log
loss of its own examples (each scored before it is trained on) per window, and worker 0 the
held-out log loss next to the true model's (the floor a learner approaches) and that of always
predicting the mean click rate (what a model that learned nothing gets). Exit 3 if the held-out
loss did not fall below the latter.

Options (every process must get the same): --steps N (300) --batch B (256) --dim D (8)
--bits B (18: 2^B hashed ids) --fields F (6) --lr LR (0.05, the tables' Adagrad) --seed S.
"""
import argparse
import math
import sys
import time

import numpy as np
import torch

import kvps
import kvps.torch


def zipf_values(rng, vocab, n):
    """n values in [0, vocab), Zipf-like (rank r with probability ~ 1 / (r + 1))."""
    p = 1.0 / np.arange(1, vocab + 1)
    return rng.choice(vocab, size=n, p=p / p.sum())


class Synthetic:
    """Examples from a known model: a weight per (field, value) and per tag; click ~ sigmoid(sum + bias)."""

    def __init__(self, fields, seed):
        rng = np.random.default_rng(seed)
        self.vocab = [int(v) for v in np.geomspace(10, 10000, fields).round()]
        self.w = [rng.normal(0, 1.0, v).astype(np.float32) for v in self.vocab]
        self.ntags = 500
        self.wt = rng.normal(0, 1.0, self.ntags).astype(np.float32)
        self.bias = -1.0

    def batch(self, rng, n):
        vals = np.stack([zipf_values(rng, v, n) for v in self.vocab], axis=1)  # n x F
        ntag = rng.integers(0, 5, n)
        tags = zipf_values(rng, self.ntags, int(ntag.sum()))
        logit = self.bias + sum(self.w[f][vals[:, f]] for f in range(len(self.vocab)))
        bag = np.repeat(np.arange(n), ntag)
        tag_sum = np.bincount(bag, weights=self.wt[tags], minlength=n)
        logit = logit + tag_sum / np.maximum(ntag, 1)
        p = 1.0 / (1.0 + np.exp(-logit))
        y = (rng.random(n) < p).astype(np.float32)
        return vals, tags, ntag, y, p


def hashed(vals, bits):
    """Each (field, value) to an id in [0, 2^bits): a multiplicative hash of field * 2^32 + value."""
    f = np.arange(vals.shape[1], dtype=np.uint64)[None, :]
    x = (f << np.uint64(32)) | vals.astype(np.uint64)
    x = (x * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - bits)
    return torch.from_numpy(x.astype(np.int64))


class CTR(torch.nn.Module):
    def __init__(self, worker, fields, dim, bits, lr):
        super().__init__()
        self.fields, self.dim = fields, dim
        self.emb = kvps.torch.EmbeddingBag(1 << bits, dim, worker, mode="sum", name="fields", rule="adagrad", lr=lr,
                                           init_scale=0.05, seed=1)
        self.tags = kvps.torch.EmbeddingBag(None, dim, worker, mode="mean", name="tags", rule="adagrad", lr=lr,
                                            init_scale=0.05, seed=2)
        torch.manual_seed(0)  # rank 0's MLP is the servers' start anyway
        self.mlp = torch.nn.Sequential(torch.nn.Linear((fields + 1) * dim, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def forward(self, ids, tags, offsets):
        e = self.emb(ids.reshape(-1, 1)).reshape(ids.shape[0], self.fields * self.dim)  # one bag per (example, field)
        t = self.tags(tags, offsets)
        return self.mlp(torch.cat([e, t], dim=1)).squeeze(1)


def logloss(p, y):
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--bits", type=int, default=18)
    ap.add_argument("--fields", type=int, default=6)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(1)
    me = kvps.env()
    if me.role == "server":
        with kvps.Server(consistency="bsp") as s:
            s.run()
        return 0
    data = Synthetic(a.fields, a.seed)
    with kvps.Worker() as w:
        model = CTR(w, a.fields, a.dim, a.bits, a.lr)
        opt = kvps.torch.ServerOptimizer(model.mlp.named_parameters(), w, rule="adamw", lr=0.003, weight_decay=0.0,
                                         prefix="mlp.")
        rng = np.random.default_rng(1000 + me.rank)  # each worker its own examples
        window, losses, t0 = max(1, a.steps // 6), [], time.time()
        for step in range(a.steps):
            vals, tags, ntag, y, _ = data.batch(rng, a.batch)
            offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(ntag)[:-1]]).astype(np.int64))
            logit = model(hashed(vals, a.bits), torch.from_numpy(tags.astype(np.int64)), offsets)
            yt = torch.from_numpy(y)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, yt)
            losses.append(loss.item())
            opt.zero_grad()
            loss.backward()  # pushes the tables' rows' gradients (their Adagrad runs on the servers)
            opt.step()       # the MLP's gradients: a BSP round of every worker's, AdamW on the servers
            if (step + 1) % window == 0:
                print("worker %d step %4d  log loss (last %d batches, before training on them) %.4f" %
                      (me.rank, step + 1, window, np.mean(losses[-window:])), flush=True)
        rc = 0
        if me.rank == 0:
            test = np.random.default_rng(99)
            vals, tags, ntag, y, p = data.batch(test, 20000)
            offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(ntag)[:-1]]).astype(np.int64))
            with torch.no_grad():
                q = torch.sigmoid(model(hashed(vals, a.bits), torch.from_numpy(tags.astype(np.int64)), offsets)).numpy()
            base = logloss(np.full_like(y, y.mean()), y)
            got = logloss(q, y)
            print("worker 0: held-out log loss %.4f; the true model's %.4f; the mean click rate's %.4f "
                  "(%d workers, %d servers, %d steps of %d, %.1f s; rows pulled %d, pushed %d by this worker)" %
                  (got, logloss(p, y), base, me.num_workers, me.num_servers, a.steps, a.batch, time.time() - t0,
                   model.emb.rows_pulled + model.tags.rows_pulled, model.emb.rows_pushed + model.tags.rows_pushed),
                  flush=True)
            if not got < base:
                print("worker 0: the model learned nothing (held-out loss not below the mean click rate's)", flush=True)
                rc = 3
        w.barrier()  # every worker's last round is in before any finishes
    return rc


if __name__ == "__main__":
    sys.exit(main())
