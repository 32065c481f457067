"""kvps.torch.ps: parameter servers for PyTorch trainers (servers hold the weights and run the optimizer).

    ServerOptimizer(params, worker, rule="sgd", lr=0.01, ...)
        an optimizer whose step() pushes each parameter's gradient to the servers and pulls the
        weights they computed, written into the parameters in place
    EmbeddingBag(num_embeddings, dim, worker, mode="sum", rule="sgd", lr=0.01, ...)
        torch.nn.EmbeddingBag whose table is a kvps sparse table on the servers: forward pulls
        only the batch's rows, backward pushes their gradients, the table's rule updates them

ServerOptimizer keeps one kvps tensor per parameter, named prefix + the parameter's name (given
model.named_parameters()) or prefix + "p<index>" (given model.parameters()); every worker must
pass the same parameters in the same order. At construction worker rank 0 sets each tensor's
rule on the servers and its value from its own parameters (kvps_worker_init), then every worker
meets at a barrier and pulls those values into its parameters: all workers start from rank 0's
weights, whatever their own initialisation. step() is one round per parameter: a pushpull of
the gradient into the parameter's own storage (no copy), all of them in flight at once, then
waited for. Under the servers' BSP it returns the weights after this round (every worker's
gradient, summed in rank order and divided by the number of workers: the mean gradient); under
SSP with staleness k a worker gets weights that include at least the rounds up to its own minus k.
A parameter whose .grad is None pushes zeros (a BSP round needs every worker's push).

The rules are kvps's (kvps.h, CONSISTENCY AND UPDATE RULES), computed on the servers in float32:
"sgd", "momentum", "nesterov", "adagrad", "adam", "adamw" (hyper-parameters as kvps_optim; 0 is
kvps's default). Against torch.optim (tests/python/test_torch_ps.py measures it): "adamw" is
torch.optim.AdamW's own order of float operations (with weight_decay=0 that is torch.optim.Adam's
too), bit for bit when torch is given the same float32 hyper-parameters (kvps_optim's are float:
torch.optim.AdamW(lr=float(numpy.float32(0.01))), as AdamW's bias corrections use lr in double); "adam" keeps beta^t as a float running product where torch uses pow in double,
(and computes m = b1 * m + (1 - b1) * g with two roundings where torch's add_(g, alpha) fuses
them, and divides by the corrections in another order), so it drifts from torch.optim.Adam by a
few ulps; "sgd" rounds lr * g before the subtraction where torch's add_(g, alpha=-lr) fuses it
(one rounding). Measured over 30 steps: sgd 1-2, adam 2-3 ulps of each tensor's largest weight
(element-wise more at weights near 0); adamw 0.

EmbeddingBag's rows are ids in [0, num_embeddings) (None: any id below 2**63, for hashed features)
of a kvps table (kvps.h, SPARSE TABLES): created on the servers at first touch, uniform in
[-init_scale, init_scale) from (seed, id) or zeros, sharded by id over the servers. Pushes are
applied on arrival whatever the servers' consistency, each row with the table's rule (per-row
state: "sgd", "adagrad", "momentum", "adam"; tables refuse "adamw"). With "sgd" and "adagrad"
a row that is not in a batch does not move, as with torch's dense optimizers on a gradient of
zeros, so a local torch.nn.EmbeddingBag under torch.optim.SGD / Adagrad is its oracle.
"""
import numpy as np
import torch

import kvps

__all__ = ["ServerOptimizer", "EmbeddingBag"]


def _view(t, what, writable):
    """A numpy view of tensor t's storage (no copy): t must be a contiguous float32 CPU tensor."""
    if not isinstance(t, torch.Tensor):
        raise kvps.InvalidArgument(-1, "%s: a torch.Tensor is needed, not %s" % (what, type(t).__name__))
    if t.device.type != "cpu":
        raise kvps.InvalidArgument(-1, "%s: the tensor is on %s; kvps.torch.ps uses CPU tensors (their data pointers)"
                                   % (what, t.device))
    if t.dtype != torch.float32:
        raise kvps.InvalidArgument(-1, "%s: dtype %s; kvps's servers hold float32" % (what, t.dtype))
    if t.is_sparse or not t.is_contiguous():
        raise kvps.InvalidArgument(-1, "%s: the tensor is not contiguous (kvps writes where it lies; "
                                   ".contiguous() before handing it over)" % what)
    return t.detach().numpy().reshape(-1)


class ServerOptimizer:
    """step() = push every gradient, pull the weights the servers computed (in place).

    params: model.parameters() or model.named_parameters() (or a list of either); worker: a
    kvps.Worker; rule and its hyper-parameters: kvps's (module docstring); prefix: put before
    every tensor name (two optimizers on one job: different prefixes). betas=(beta1, beta2) is
    accepted as torch.optim.Adam spells it. Not a torch.optim.Optimizer: no param_groups (an LR
    scheduler cannot drive it) and no state_dict (the state is on the servers: kvps's checkpoints).
    """

    def __init__(self, params, worker, rule="sgd", lr=0.01, momentum=0.0, betas=None, beta1=0.9, beta2=0.999,
                 eps=1e-8, weight_decay=0.0, prefix=""):
        if not isinstance(worker, kvps.Worker):
            raise kvps.InvalidArgument(-1, "ServerOptimizer: worker must be a kvps.Worker, not %s" % type(worker).__name__)
        if betas is not None:
            beta1, beta2 = betas
        items = list(params)
        if not items:
            raise kvps.InvalidArgument(-1, "ServerOptimizer: no parameters")
        self.names, self.params = [], []
        for i, it in enumerate(items):
            if isinstance(it, tuple) and len(it) == 2 and isinstance(it[0], str):
                name, p = it
            else:
                name, p = "p%d" % i, it
            name = prefix + name
            _view(p, "ServerOptimizer parameter %r" % name, True)
            if name in self.names:
                raise kvps.InvalidArgument(-1, "ServerOptimizer: parameter name %r twice" % name)
            self.names.append(name)
            self.params.append(p)
        self.worker = worker
        self.rule = rule
        self.steps = 0
        self._zeros = {}
        opt = dict(rule=rule, lr=lr, momentum=momentum, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
        if worker.rank == 0:
            for name, p in zip(self.names, self.params):
                worker.tensor(name, p.numel(), **opt)
                worker.init(name, _view(p, name, False))
        else:
            for name, p in zip(self.names, self.params):
                worker.tensor(name, p.numel())
        worker.barrier()
        self.pull()

    def pull(self):
        """The servers' current weights into the parameters (in place)."""
        reqs = [self.worker.pull(n, _view(p, n, True), wait=False) for n, p in zip(self.names, self.params)]
        for r in reqs:
            r.wait()

    def zero_grad(self, set_to_none=False):
        for p in self.params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_()
                    p.grad.zero_()

    def _grad(self, name, p):
        g = p.grad
        if g is None:
            z = self._zeros.get(name)
            if z is None:
                z = self._zeros[name] = np.zeros(p.numel(), np.float32)
            return z
        if g.is_sparse:
            raise kvps.InvalidArgument(-1, "ServerOptimizer: parameter %r has a sparse gradient (kvps.torch.EmbeddingBag "
                                       "keeps sparse tables on the servers)" % name)
        if g.device.type != "cpu" or g.dtype != torch.float32:
            raise kvps.InvalidArgument(-1, "ServerOptimizer: parameter %r's gradient is %s on %s; float32 on the CPU is "
                                       "needed" % (name, g.dtype, g.device))
        return _view(g.contiguous(), "gradient of %r" % name, False)

    @torch.no_grad()
    def step(self, closure=None):
        """Pushes every gradient and pulls the round's weights into the parameters; returns closure()'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        reqs = []
        for name, p in zip(self.names, self.params):
            g = self._grad(name, p)
            reqs.append(self.worker.pushpull(name, g, _view(p, name, True), wait=False))
        for r in reqs:
            r.wait()
        self.steps += 1
        return loss


def _ids_of(t, num_embeddings, what):
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int64, torch.int32):
        raise kvps.InvalidArgument(-1, "%s: a LongTensor (or IntTensor) of ids is needed" % what)
    if t.numel() and int(t.min()) < 0:
        raise kvps.InvalidArgument(-1, "%s: id %d is negative" % (what, int(t.min())))
    if num_embeddings is not None and t.numel() and int(t.max()) >= num_embeddings:
        raise kvps.InvalidArgument(-1, "%s: id %d is out of range (num_embeddings %d)" % (what, int(t.max()), num_embeddings))
    return t.to(torch.int64)


class EmbeddingBag(torch.nn.Module):
    """torch.nn.EmbeddingBag over a kvps sparse table: forward(input, offsets=None).

    input and offsets as torch's: a 1-D LongTensor of ids with offsets (the start of each bag),
    or a 2-D (bags x ids) one without. mode "sum" or "mean" (an empty bag: zeros). The table
    (name, rule, lr, momentum, beta1, beta2, eps, init_scale, seed) is configured on the servers
    by every worker with the same arguments (kvps_worker_table). forward pulls the batch's
    distinct ids once each; in training (autograd on), backward pushes one gradient row per
    distinct id: the sum of its occurrences' gradients, as torch's own backward gives them.
    Not there (torch's have them): mode "max", per_sample_weights, padding_idx, max_norm,
    scale_grad_by_freq, include_last_offset. The push waits for the servers' acknowledgement
    inside backward; counters rows_pulled / rows_pushed count distinct rows.
    """

    def __init__(self, num_embeddings, embedding_dim, worker, mode="sum", name="emb", rule="sgd", lr=0.01,
                 momentum=0.0, beta1=0.0, beta2=0.0, eps=0.0, init_scale=0.0, seed=0):
        super().__init__()
        if not isinstance(worker, kvps.Worker):
            raise kvps.InvalidArgument(-1, "EmbeddingBag: worker must be a kvps.Worker, not %s" % type(worker).__name__)
        if mode not in ("sum", "mean"):
            raise kvps.InvalidArgument(-1, "EmbeddingBag %r: mode %r: \"sum\" or \"mean\"" % (name, mode))
        if num_embeddings is not None and int(num_embeddings) <= 0:
            raise kvps.InvalidArgument(-1, "EmbeddingBag %r: num_embeddings %r must be positive (or None)" % (name, num_embeddings))
        if int(embedding_dim) <= 0:
            raise kvps.InvalidArgument(-1, "EmbeddingBag %r: embedding_dim %r must be positive" % (name, embedding_dim))
        self.num_embeddings = None if num_embeddings is None else int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        self.mode = mode
        self.name = name
        self.table = worker.table(name, self.embedding_dim, rule=rule, lr=lr, momentum=momentum, beta1=beta1,
                                  beta2=beta2, eps=eps, init_scale=init_scale, seed=seed)
        self.rows_pulled = 0
        self.rows_pushed = 0

    def extra_repr(self):
        return "%s, %d, mode=%r, table=%r" % (self.num_embeddings, self.embedding_dim, self.mode, self.name)

    def rows(self, ids):
        """The table's current rows of ids (a LongTensor or list), as a (len(ids) x dim) float32 tensor."""
        ids = _ids_of(torch.as_tensor(ids, dtype=torch.int64).reshape(-1), self.num_embeddings, "EmbeddingBag %r rows" % self.name)
        out = torch.empty(ids.numel(), self.embedding_dim, dtype=torch.float32)
        if ids.numel():
            self.table.pull(ids.numpy().astype(np.uint64), out.numpy())
        return out

    def _push(self, uid, grad):
        g = grad.detach().to(torch.float32).contiguous()
        self.table.push(uid, g.numpy())
        self.rows_pushed += uid.size

    def forward(self, input, offsets=None):
        what = "EmbeddingBag %r input" % self.name
        if not isinstance(input, torch.Tensor):
            raise kvps.InvalidArgument(-1, "%s: a LongTensor is needed, not %s" % (what, type(input).__name__))
        if input.dtype not in (torch.int64, torch.int32):
            raise kvps.InvalidArgument(-1, "%s: a LongTensor (or IntTensor) of ids is needed, not %s" % (what, input.dtype))
        if input.dim() == 2:
            if offsets is not None:
                raise kvps.InvalidArgument(-1, "%s: 2-D input takes no offsets (each row is a bag)" % what)
            nbags, per = input.shape
            ids = input.reshape(-1)
            bag = torch.arange(nbags, dtype=torch.int64).repeat_interleave(per)
        elif input.dim() == 1:
            if offsets is None:
                raise kvps.InvalidArgument(-1, "%s: 1-D input needs offsets (the start of each bag)" % what)
            if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1 or offsets.dtype not in (torch.int64, torch.int32):
                raise kvps.InvalidArgument(-1, "EmbeddingBag %r offsets: a 1-D LongTensor is needed" % self.name)
            offsets = offsets.to(torch.int64)
            ids = input
            nbags = offsets.numel()
            if nbags and (int(offsets[0]) != 0 or bool((offsets[1:] < offsets[:-1]).any()) or int(offsets[-1]) > ids.numel()):
                raise kvps.InvalidArgument(-1, "EmbeddingBag %r offsets: must start at 0, not decrease, and stay within "
                                           "the %d ids" % (self.name, ids.numel()))
            lens = torch.diff(offsets, append=torch.tensor([ids.numel()], dtype=torch.int64))
            bag = torch.arange(nbags, dtype=torch.int64).repeat_interleave(lens)
        else:
            raise kvps.InvalidArgument(-1, "%s: 1-D (with offsets) or 2-D, not %d-D" % (what, input.dim()))
        ids = _ids_of(ids, self.num_embeddings, what)
        dim = self.embedding_dim
        if ids.numel() == 0:
            return torch.zeros(nbags, dim, dtype=torch.float32)
        uniq, inverse = torch.unique(ids, sorted=True, return_inverse=True)
        uid = uniq.numpy().astype(np.uint64)
        rows = torch.empty(uid.size, dim, dtype=torch.float32)
        self.table.pull(uid, rows.numpy())
        self.rows_pulled += uid.size
        if torch.is_grad_enabled():
            rows.requires_grad_(True)
            rows.register_hook(lambda g, uid=uid: self._push(uid, g))
        per_id = rows.index_select(0, inverse)
        out = torch.zeros(nbags, dim, dtype=torch.float32).index_add(0, bag, per_id)
        if self.mode == "mean":
            cnt = torch.bincount(bag, minlength=nbags).clamp_(min=1).to(torch.float32)
            out = out / cnt.unsqueeze(1)
        return out
