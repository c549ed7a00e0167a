#!/usr/bin/python3
"""Reference for test_optim: applies torch.optim steps to the cases in a text file.

usage: optim_torch_ref.py IN OUT
IN holds whitespace-separated tokens:
  ncases, then per case:
    kind momentum beta1 beta2 eps weight_decay nparams ntensors nsteps
    ntensors x (offset count decay)      decay 0 puts the tensor in a no-decay param group
    nparams initial parameters
    nsteps x (lr, nparams gradients)
kind is sgd, momentum, nesterov, adam or adamw. OUT receives, per case and step,
the nparams parameters after that step, one line per step (%.9g).
Exit status 3 when torch cannot be imported, so the test can report a skip.
"""
import sys

try:
    import torch
except Exception as exc:  # any import failure means "no torch here"
    print("optim_torch_ref: cannot import torch: %s" % exc, file=sys.stderr)
    sys.exit(3)


def make_optimizer(kind, groups, momentum, beta1, beta2, eps):
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=0.0, foreach=False)
    if kind in ("momentum", "nesterov"):
        return torch.optim.SGD(groups, lr=0.0, momentum=momentum, dampening=0.0,
                               nesterov=(kind == "nesterov"), foreach=False)
    if kind == "adam":
        return torch.optim.Adam(groups, lr=0.0, betas=(beta1, beta2), eps=eps, foreach=False)
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=0.0, betas=(beta1, beta2), eps=eps, foreach=False)
    raise ValueError("unknown optimizer kind %r" % kind)


def run_case(tokens, out):
    kind = next(tokens)
    momentum, beta1, beta2, eps, weight_decay = (float(next(tokens)) for _ in range(5))
    nparams, ntensors, nsteps = (int(next(tokens)) for _ in range(3))
    layout = [tuple(int(next(tokens)) for _ in range(3)) for _ in range(ntensors)]
    flat = torch.tensor([float(next(tokens)) for _ in range(nparams)], dtype=torch.float32)
    params = [torch.nn.Parameter(flat[off:off + cnt].clone()) for off, cnt, _ in layout]
    groups = [
        {"params": [p for p, (_, _, d) in zip(params, layout) if d], "weight_decay": weight_decay},
        {"params": [p for p, (_, _, d) in zip(params, layout) if not d], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    opt = make_optimizer(kind, groups, momentum, beta1, beta2, eps)
    for _ in range(nsteps):
        lr = float(next(tokens))
        grads = torch.tensor([float(next(tokens)) for _ in range(nparams)], dtype=torch.float32)
        for p, (off, cnt, _) in zip(params, layout):
            p.grad = grads[off:off + cnt].clone()
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        result = torch.zeros(nparams, dtype=torch.float32)
        with torch.no_grad():
            for p, (off, cnt, _) in zip(params, layout):
                result[off:off + cnt] = p
        out.write(" ".join("%.9g" % x for x in result.tolist()) + "\n")


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        tokens = iter(f.read().split())
    ncases = int(next(tokens))
    with open(sys.argv[2], "w") as out:
        for _ in range(ncases):
            run_case(tokens, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
