#!/usr/bin/python3
"""torch's DataLoader over torchvision's ImageFolder (the baseline of
bench/loader_vs_torch.sh): the same PNG folder, grayscale, ToTensor, shuffled,
num_workers workers; one JSON line per epoch with images/s delivered to the
loop. Debian python3-torch and python3-torchvision."""
import argparse, json, time
import torch
from torchvision import datasets, transforms

p = argparse.ArgumentParser()
p.add_argument("--data", required=True)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--epochs", type=int, default=3)
a = p.parse_args()
torch.set_num_threads(1)
ds = datasets.ImageFolder(a.data, transform=transforms.Compose(
    [transforms.Grayscale(1), transforms.ToTensor()]))
dl = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers,
                                 persistent_workers=a.workers > 0)
for e in range(a.epochs):
    t0 = time.perf_counter()
    n = 0
    s = 0.0
    for x, y in dl:
        n += x.shape[0]
        s += float(x[-1, 0, -1, -1])
    t = time.perf_counter() - t0
    print(json.dumps({"lib": "torch", "epoch": e + 1, "workers": a.workers, "images": n, "seconds": round(t, 4),
                      "images_per_s": round(n / t, 1)}), flush=True)
