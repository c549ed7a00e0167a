#!/usr/bin/python3
"""Brute-force gradient noise scale of tide-train's MLP, for the bar in
docs/adaptation.md and test/gns_reference.sh.

    gns_torch_ref.py RUN_DIR EPOCH[,EPOCH...] [DATA_DIR]

Loads RUN_DIR/params-epochEPOCH.bin (tide-train --save-params) into the same
MLP, computes every training example's gradient of its cross-entropy at
those parameters (float32 products, float64 sums: within 1e-5 of a float64
run, 1.6x faster), and prints one JSON line per epoch:
  trace_sigma = sum over parameters of the per-example variance (unbiased),
  grad_sq     = |mean gradient|^2 - trace_sigma / N (unbiased),
  noise_scale = trace_sigma / grad_sq,
and tide's noise_scale from RUN_DIR/metrics.jsonl at the last step of that
epoch. With the epoch's last steps saved too (tide-train --save-params=K:
params-epochE-stepS.bin), the reference is tail_noise_scale, the mean
trace_sigma over the mean grad_sq of all those K points and the end: the
single point's |G|^2 swings by 2x or more from one step to the next (SGD's
iterate oscillates across the valley, nearly with period 2), which no
estimator built from past gradients can follow, and every third point
alone aliases that swing (16% low at nesterov's end of epoch 2);
tide_over_reference is against the tail when there is one. Per-example squared norms come from the dense layers' factorisation
|delta a^T|^2 = |delta|^2 |a|^2, so no per-example gradient is stored.
Exit 3 when torch cannot be imported.
"""
import gzip
import json
import os
import sys

try:
    import numpy as np
    import torch
except ImportError as e:
    print("gns_torch_ref.py: %s" % e, file=sys.stderr)
    sys.exit(3)


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)




def point(p, x, y):
    """Brute-force (trace_sigma, grad_sq) at parameters p over examples x, y."""
    n = x.shape[0]
    # forward and per-example backward by hand (dense + relu)
    a0 = x
    z1 = a0 @ p["fc1.weight"].T + p["fc1.bias"]
    a1 = z1.clamp(min=0)
    z2 = a1 @ p["fc2.weight"].T + p["fc2.bias"]
    a2 = z2.clamp(min=0)
    z3 = a2 @ p["fc3.weight"].T + p["fc3.bias"]
    d3 = torch.softmax(z3, dim=1)
    d3[torch.arange(n), y] -= 1.0                 # d loss_i / d z3 for each example
    d2 = (d3 @ p["fc3.weight"]) * (z2 > 0)
    d1 = (d2 @ p["fc2.weight"]) * (z1 > 0)
    sq = torch.zeros(n, dtype=torch.float64)      # |g_i|^2
    mean_sq = 0.0                                 # |mean g|^2
    for d, a in ((d1, a0), (d2, a1), (d3, a2)):
        # weight |d|^2|a|^2 plus bias |d|^2
        sq += (d * d).sum(1, dtype=torch.float64) * ((a * a).sum(1, dtype=torch.float64) + 1.0)
        mean_w = (d.T @ a).double() / n
        mean_b = d.sum(0, dtype=torch.float64) / n
        mean_sq += float((mean_w * mean_w).sum() + (mean_b * mean_b).sum())
    trace = n / (n - 1) * (float(sq.mean()) - mean_sq)
    return trace, mean_sq - trace / n


def main():
    run, epochs = sys.argv[1], [int(e) for e in sys.argv[2].split(",")]
    data = sys.argv[3] if len(sys.argv) > 3 else "/usr/share/datasets/fashion-mnist"
    meta = json.load(open(os.path.join(run, "tensors.json")))
    if meta["arch"] != "flatten,dense:256,relu,dense:128,relu,dense:10":
        sys.exit("gns_torch_ref.py: only tide-train's mlp is supported, got %s" % meta["arch"])
    summary = json.load(open(os.path.join(run, "summary.json")))
    n = summary["train_images"]
    x = idx(os.path.join(data, "train-images-idx3-ubyte.gz"))[:n].reshape(n, 784).astype(np.float64)
    x = torch.from_numpy(((x / 255.0 - 0.2860) / 0.3530).astype(np.float32))
    y = torch.from_numpy(idx(os.path.join(data, "train-labels-idx1-ubyte.gz"))[:n].astype(np.int64))
    steps = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if '"type":"step"' in l]

    def load(name):
        flat = np.fromfile(os.path.join(run, name), dtype=np.float32)
        return {t["name"]: torch.from_numpy(flat[t["offset"]:t["offset"] + t["count"]].reshape(t["shape"]).copy())
                for t in meta["tensors"]}

    for epoch in epochs:
        trace, grad_sq = point(load("params-epoch%d.bin" % epoch), x, y)
        # the epoch's last steps (tide-train --save-params=K), and its end
        tail = sorted((f for f in os.listdir(run) if f.startswith("params-epoch%d-step" % epoch)),
                      key=lambda f: -int(f.split("step")[1].split(".")[0]))
        traces, grads = [trace], [grad_sq]
        for f in tail:
            t, g = point(load(f), x, y)
            traces.append(t)
            grads.append(g)
        tail_ns = sum(traces) / sum(grads)
        ends = [s for s in steps if s["epoch"] == epoch - 1]
        tide_ns = ends[-1]["noise_scale"] if ends else None
        ref = tail_ns if tail else trace / grad_sq
        print(json.dumps({"epoch": epoch, "examples": n, "trace_sigma": trace, "grad_sq": grad_sq,
                          "noise_scale": trace / grad_sq, "tail_points": len(traces),
                          "tail_noise_scale": tail_ns, "tide_noise_scale": tide_ns,
                          "tide_over_reference": None if tide_ns is None else tide_ns / ref}))


if __name__ == "__main__":
    main()
