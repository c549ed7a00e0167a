"""What name matching costs: a small allreduce through tide.torch's
negotiated Horovod-shaped call (tt.allreduce) against the same allreduce
through the ordered call under it (tide.torch._comm.allreduce), alternating,
in one job. One JSON line per measurement (median of --repeat runs of
--calls calls each, after 20 warm-up calls). docs/torch.md, "Name matching".

  PYTHONPATH=python TIDE_LIBRARY=build/libtide.so \\
    build/tools/tiderun -np 2 /usr/bin/python3 bench/torch_negotiation.py
"""
import argparse
import json
import statistics
import time

import torch
import tide.torch as tt
from tide.torch import _comm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    tt.init()
    x = torch.ones(args.elements)
    calls = {"ordered": lambda: _comm.allreduce(x, tt.Sum),
             "negotiated": lambda: tt.allreduce(x, op=tt.Sum)}
    times = {k: [] for k in calls}
    for _ in range(args.repeat):
        for label, fn in calls.items():
            for _ in range(20):
                fn()
            tt.barrier()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            times[label].append((time.perf_counter() - t0) / args.calls)
    if tt.rank() == 0:
        for label, ts in times.items():
            print(json.dumps({"bench": "torch_negotiation", "call": label, "ranks": tt.size(),
                              "elements": args.elements, "median_us": round(statistics.median(ts) * 1e6, 1),
                              "runs_us": [round(t * 1e6, 1) for t in ts]}), flush=True)
    tt.shutdown()


if __name__ == "__main__":
    main()
