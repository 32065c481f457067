#!/usr/bin/env python3
"""adamw_torch.py FILE - replays the mean gradients tests/test_rules.c wrote to FILE through
torch.optim.AdamW (the single-tensor path, foreach=False) and compares its weights with the ones
the kvps servers computed (KVPS_RULE_ADAMW). Prints the largest difference in float32 ulps; exits
1 when it is over MAX_ULPS, 0 otherwise, and 0 with one "skipped" line when torch is absent.

FILE (little-endian): u32 steps, u32 n, u32 0; f32 lr, beta1, beta2, eps, weight_decay;
f32 initial weights[n]; f32 mean gradients[steps][n]; f32 kvps's weights[n]."""
import struct
import sys

MAX_ULPS = 8  # "equal within float rounding"; the manual's formula is meant to give 0


def ordered(x):
    """A float32's bits as an integer that orders like the float (for ulp distances)."""
    i = struct.unpack("<I", struct.pack("<f", x))[0]
    mag = i & 0x7FFFFFFF
    return -mag if i >> 31 else mag


def main():
    try:
        import torch
    except ImportError:
        print("  adamw_torch: skipped: python3 cannot import torch")
        return 0
    data = open(sys.argv[1], "rb").read()
    steps, n, _ = struct.unpack_from("<3I", data, 0)
    off = 12
    lr, b1, b2, eps, wd = struct.unpack_from("<5f", data, off)
    off += 20
    init = struct.unpack_from("<%df" % n, data, off)
    off += 4 * n
    grads = struct.unpack_from("<%df" % (steps * n), data, off)
    off += 4 * steps * n
    got = struct.unpack_from("<%df" % n, data, off)
    p = torch.nn.Parameter(torch.tensor(init, dtype=torch.float32))
    try:
        opt = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, foreach=False)
    except TypeError:  # a torch without foreach: single-tensor anyway
        opt = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    for t in range(steps):
        p.grad = torch.tensor(grads[t * n:(t + 1) * n], dtype=torch.float32)
        opt.step()
    want = p.detach().tolist()
    worst, at = 0, 0
    for i in range(n):
        d = abs(ordered(got[i]) - ordered(want[i]))
        if d > worst:
            worst, at = d, i
    rel = abs(got[at] - want[at]) / max(abs(want[at]), 1e-30)
    print("  adamw_torch: torch %s, %d steps x %d weights: largest difference %d ulp (element %d: kvps %.9g, torch %.9g, "
          "relative %.3g)" % (torch.__version__, steps, n, worst, at, got[at], want[at], rel))
    return 0 if worst <= MAX_ULPS else 1


if __name__ == "__main__":
    sys.exit(main())
