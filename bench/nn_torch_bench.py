#!/usr/bin/python3
"""PyTorch baseline for bench/nn_bench.c: the same models, batch, thread count
and work per step (forward, softmax cross-entropy, backward, plain SGD step on
random batches); the median images/s of --repeats timed runs after a warm-up,
as one JSON line.

    nn_torch_bench.py [--model mlp|cnn] [--batch N] [--threads T] [--seconds S] [--repeats R]
"""
import argparse
import json
import statistics
import time

import torch
from torch import nn


def build(model):
    if model == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                             nn.Linear(128, 10))
    if model == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    raise SystemExit("nn_torch_bench.py: --model must be mlp or cnn")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    net = build(a.model)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    batches = 8
    xs = torch.rand(batches, a.batch, 1, 28, 28) * 2 - 1
    ys = (torch.arange(batches * a.batch) * 7 % 10).view(batches, a.batch)
    step = 0

    def one_step():
        nonlocal step
        b = step % batches
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(xs[b]), ys[b])
        loss.backward()
        opt.step()
        step += 1

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < a.seconds / 5:
        one_step()
    rates = []
    # CPU time of every thread of the process, as nn_bench reports it.
    cpu0, wall0, timed = time.process_time(), time.perf_counter(), 0
    for _ in range(a.repeats):
        steps = 0
        t0 = time.perf_counter()
        while True:
            one_step()
            steps += 1
            t = time.perf_counter() - t0
            if t >= a.seconds / a.repeats:
                break
        rates.append(steps * a.batch / t)
        timed += steps
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    rates.sort()
    print(json.dumps({"lib": "torch", "model": a.model, "batch": a.batch, "threads": a.threads,
                      "images_per_s": round(statistics.median(rates), 1), "min": round(rates[0], 1),
                      "max": round(rates[-1], 1), "repeats": a.repeats,
                      "images_per_cpu_s": round(timed * a.batch / cpu, 1), "cpu_per_wall": round(cpu / wall, 2),
                      "torch": torch.__version__,
                      "mkldnn": torch.backends.mkldnn.is_available()}))


if __name__ == "__main__":
    main()
