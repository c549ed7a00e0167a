#!/usr/bin/env python3
"""K-FAC reference for test_kfac: recomputes in PyTorch (float64) one step's
preconditioned gradient of the C model engine's layers as kfac-pytorch
defines it (per-sample Fisher factors, KFC patches for conv, eigenbasis
damping, KL clipping),
and compares it with what tide's trainer applied. Exit 77 without torch.

Each input line is a case: arch, lr, damping, kl_clip, decay, the batch
(images, labels), the parameters before the step and tide's preconditioned
gradient (params0 - params1) / lr of a plain-SGD step."""
import json
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit(77)

torch.set_default_dtype(torch.float64)


def build(arch, params):
    """The engine's layer list as torch modules with its flat parameters."""
    layers, c, h, flat, at = [], 1, 28, False, 0
    for item in arch.split(","):
        kind = item.split(":")
        if kind[0] == "conv":
            out, k, pad = map(int, kind[1:])
            layers.append(torch.nn.Conv2d(c, out, k, padding=pad))
            c, h = out, h + 2 * pad - k + 1
        elif kind[0] == "relu":
            layers.append(torch.nn.ReLU())
        elif kind[0] == "pool":
            layers.append(torch.nn.MaxPool2d(2))
            h //= 2
        elif kind[0] == "flatten":
            layers.append(torch.nn.Flatten())
            c, flat = c * h * h, True
        elif kind[0] == "dense":
            layers.append(torch.nn.Linear(c, int(kind[1])))
            c = int(kind[1])
    for layer in layers:
        for p in (getattr(layer, "weight", None), getattr(layer, "bias", None)):
            if p is None:
                continue
            n = p.numel()
            p.data = torch.tensor(params[at:at + n]).reshape(p.shape)
            at += n
    assert at == len(params)
    return torch.nn.Sequential(*layers)


def factors(layer, x, gy):
    """A and G of one layer from its input and output grad: the per-sample
    Fisher's (kfac-pytorch's batch_averaged convention; conv: KFC, every
    output position a row of A, G summed over positions)."""
    batch = x.shape[0]
    if isinstance(layer, torch.nn.Linear):
        a = torch.cat([x, torch.ones(x.shape[0], 1)], 1)
        g = gy
    else:
        k, pad = layer.kernel_size[0], layer.padding[0]
        patches = F.unfold(x, k, padding=pad)              # [N, C*k*k, L]
        a = patches.transpose(1, 2).reshape(-1, patches.shape[1])
        a = torch.cat([a, torch.ones(a.shape[0], 1)], 1)
        g = gy.permute(0, 2, 3, 1).reshape(-1, gy.shape[1])
    A = a.t() @ a / a.shape[0]
    g = g * batch                                          # per-sample gradients of the mean loss
    G = g.t() @ g / batch
    return (A + A.t()) / 2, (G + G.t()) / 2


def main(path):
    worst = 0.0
    with open(path) as f:
        cases = [json.loads(line) for line in f if line.strip()]
    for case in cases:
        model = build(case["arch"], case["params"])
        x = torch.tensor(case["images"]).reshape(case["batch"], 1, 28, 28)
        y = torch.tensor(case["labels"])
        saved = {}
        kfac_layers = [m for m in model if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
        for m in kfac_layers:
            m.register_forward_hook(lambda mod, inp, out: saved.__setitem__((mod, "x"), inp[0].detach()))
            m.register_full_backward_hook(lambda mod, gin, gout: saved.__setitem__((mod, "g"), gout[0].detach()))
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        decay, damping, lr, clip = case["decay"], case["damping"], case["lr"], case["kl_clip"]
        results, vg = [], 0.0
        for m in kfac_layers:
            A, G = factors(m, saved[(m, "x")], saved[(m, "g")])
            A = decay * torch.eye(A.shape[0]) + (1 - decay) * A
            G = decay * torch.eye(G.shape[0]) + (1 - decay) * G
            da, qa = torch.linalg.eigh(A)
            dg, qg = torch.linalg.eigh(G)
            da, dg = da.clamp(min=0), dg.clamp(min=0)
            grad = torch.cat([m.weight.grad.reshape(m.weight.shape[0], -1), m.bias.grad[:, None]], 1)
            v = qg.t() @ grad @ qa
            v = v / (dg[:, None] * da[None, :] + damping)
            p = qg @ v @ qa.t()
            vg += float((p * grad).sum()) * lr * lr
            results.append(p)
        nu = min(1.0, (clip / abs(vg)) ** 0.5) if clip > 0 else 1.0
        want = []
        for m, p in zip(kfac_layers, results):
            p = p * nu
            want.append(p[:, :-1].reshape(-1))
            want.append(p[:, -1])
        want = torch.cat(want)
        got = torch.tensor(case["precond"])
        err = float((got - want).abs().max() / want.abs().max())
        print(f"kfac_torch_ref: kl_clip {clip} decay {decay}: nu {nu:.4g}, max |tide - torch| / max |torch| = {err:.3g}")
        worst = max(worst, err)
    # float32 eigendecompositions and products against float64: damping
    # bounds the amplification of rounding to 1/damping.
    if worst > 2e-3:
        print("kfac_torch_ref: FAILED")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
