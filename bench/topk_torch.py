#!/usr/bin/python3
"""torch.topk baseline for bench/topk_bench.c on the CPU: the k largest
magnitudes of the raw f32 file topk_bench --write-data wrote, returned as
(values, indices) with indices ascending like tide's selectors:
topk(|x|, k, sorted=False), sort the indices, gather x. The median of
--repeats timed runs after a warm-up, one JSON line per density; "topk_ms"
is the torch.topk call alone.

    topk_torch.py --file FILE [--density R,...] [--threads 2] [--repeats 3] [--warmup 1]
"""
import argparse
import json
import math
import statistics
import time

import numpy as np
import torch


def count_for(density, d):
    """tide_topk_count's rule: ceil(density * d), exact products kept."""
    p = density * d
    r = round(p)
    k = r if abs(p - r) <= 1e-9 * max(p, 1.0) else math.ceil(p)
    return int(min(max(k, 0), d))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True)
    ap.add_argument("--density", default="0.001,0.01,0.1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    x = torch.from_numpy(np.fromfile(a.file, dtype=np.float32))
    d = x.numel()
    for density in (float(s) for s in a.density.split(",")):
        k = count_for(density, d)
        if k == 0:
            continue
        total, topk_only = [], []
        for r in range(a.warmup + a.repeats):
            t0 = time.perf_counter()
            _, idx = torch.topk(x.abs(), k, sorted=False)
            t1 = time.perf_counter()
            idx, _ = torch.sort(idx)
            values = x[idx]
            t2 = time.perf_counter()
            if r >= a.warmup:
                total.append((t2 - t0) * 1e3)
                topk_only.append((t1 - t0) * 1e3)
        mass = float((values.double() ** 2).sum())
        print(json.dumps({"bench": "topk", "impl": "torch.topk", "d": d, "density": density, "k": k,
                          "threads": a.threads, "median_ms": round(statistics.median(total), 3),
                          "min_ms": round(min(total), 3),
                          "topk_ms": round(statistics.median(topk_only), 3), "mass": mass,
                          "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
