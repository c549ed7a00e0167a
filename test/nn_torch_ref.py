#!/usr/bin/python3
"""PyTorch reference for test/test_nn.c.

    nn_torch_ref.py DIR [DIR ...]

Each DIR holds what the test wrote: meta.json (the layer list, batch, and the
parameter tensors with their offsets and shapes), params.bin (float32),
x.bin (float32 [batch, 1, 28, 28]) and labels.bin (int32). This builds the
same network from torch.nn.functional in float64, with those weights, and
writes ref.bin: float64 loss, then the logits [batch, 10], then the
gradient of the mean cross-entropy for every parameter in the same flat
layout. Exit 3 when torch cannot be imported.
"""
import json
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the C test turns this into "skipped"
    print("nn_torch_ref.py: %s" % e, file=sys.stderr)
    sys.exit(3)


def check(d):
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    batch = meta["batch"]
    flat = np.fromfile(os.path.join(d, "params.bin"), dtype=np.float32)
    x = torch.from_numpy(np.fromfile(os.path.join(d, "x.bin"), dtype=np.float32).astype(np.float64))
    x = x.view(batch, 1, 28, 28)
    labels = torch.from_numpy(np.fromfile(os.path.join(d, "labels.bin"), dtype=np.int32).astype(np.int64))
    params = {}
    for t in meta["tensors"]:
        v = flat[t["offset"]:t["offset"] + t["count"]].astype(np.float64).reshape(t["shape"])
        params[t["name"]] = torch.tensor(v, requires_grad=True)

    h = x
    convs = denses = 0
    for layer in meta["layers"].split(","):
        parts = layer.split(":")
        if parts[0] == "conv":
            convs += 1
            n = "conv%d" % convs
            h = F.conv2d(h, params[n + ".weight"], params[n + ".bias"], stride=1, padding=int(parts[3]))
        elif parts[0] == "relu":
            h = F.relu(h)
        elif parts[0] == "pool":
            h = F.max_pool2d(h, 2, 2)
        elif parts[0] == "flatten":
            h = torch.flatten(h, 1)
        elif parts[0] == "dense":
            denses += 1
            n = "fc%d" % denses
            h = F.linear(h, params[n + ".weight"], params[n + ".bias"])
        else:
            raise SystemExit("nn_torch_ref.py: unknown layer %r" % layer)
    loss = F.cross_entropy(h, labels)
    loss.backward()

    grads = np.zeros(len(flat), dtype=np.float64)
    for t in meta["tensors"]:
        grads[t["offset"]:t["offset"] + t["count"]] = params[t["name"]].grad.numpy().reshape(-1)
    out = np.concatenate([[loss.item()], h.detach().numpy().reshape(-1), grads])
    out.astype(np.float64).tofile(os.path.join(d, "ref.bin"))


def main():
    # One process for every model: importing torch is the slow part.
    for d in sys.argv[1:]:
        check(d)


if __name__ == "__main__":
    main()
