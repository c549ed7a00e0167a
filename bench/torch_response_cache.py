"""What the negotiation costs per training step, with and without the
response cache (python/tide/torch/_controller.py): Horovod's way of
exchanging gradients, one named allreduce_async_ per parameter
("allreduce.<parameter name>", as horovod.torch's DistributedOptimizer
names them) and a synchronize of each, on a model of many small
parameters. Three ways alternate in one job, --repeat times:
  - cached: the negotiated calls with the response cache (the default);
  - uncached: the same calls with the cache off (every round sends the
    pickled request lists);
  - ordered: the same gradients through tide's ordered calls, one flat
    allreduce, no negotiation (the floor).
The gradients are fixed tensors (no forward/backward), so what is timed is
the exchange and its negotiation. One JSON line per way (rank 0): median
wall and CPU (process_time) microseconds per step over the runs, the
median time per step spent negotiating (negotiation_stats' negotiate_s:
the exchange of the request lists or cache bits, waiting for the other
ranks included, and the matching), the rounds and cache hits of the last
run. docs/torch.md, "Name matching".

  PYTHONPATH=python TIDE_LIBRARY=build/libtide.so \\
    build/tools/tiderun -np 2 /usr/bin/python3 bench/torch_response_cache.py
"""
import argparse
import json
import statistics
import time

import torch
import tide.torch as tt
from tide.torch import _comm, _controller


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=50, help="Linear layers (2 parameters each)")
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    tt.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
    grads = [(n, torch.randn_like(p)) for n, p in model.named_parameters()]
    flat = torch.cat([g.reshape(-1) for _, g in grads])

    def negotiated():
        handles = [tt.allreduce_async_(g, name="allreduce." + n, op=tt.Average) for n, g in grads]
        for h in handles:
            tt.synchronize(h)

    def ordered():
        _comm.allreduce_(flat, tt.Average)

    ways = [("cached", _controller.DEFAULT_CACHE_CAPACITY, negotiated), ("uncached", 0, negotiated),
            ("ordered", None, ordered)]
    wall = {w: [] for w, _, _ in ways}
    cpu = {w: [] for w, _, _ in ways}
    negotiate = {w: [] for w, _, _ in ways}
    stats = {}
    for _ in range(args.repeat):
        for way, capacity, fn in ways:
            if capacity is not None:
                _controller.set_cache_capacity(capacity)  # every rank, at the same point: clears the cache
            for _ in range(5):
                fn()
            tt.barrier()
            before = tt.negotiation_stats()
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                fn()
            wall[way].append((time.perf_counter() - t0) / args.steps)
            cpu[way].append((time.process_time() - c0) / args.steps)
            after = tt.negotiation_stats()
            negotiate[way].append((after["negotiate_s"] - before["negotiate_s"]) / args.steps)
            stats[way] = {k: after[k] - before[k] for k in ("rounds", "cached_rounds", "cache_hits",
                                                             "cache_misses")}
    if tt.rank() == 0:
        for way, _, _ in ways:
            line = {"bench": "torch_response_cache", "way": way, "ranks": tt.size(), "tensors": len(grads),
                    "elements": flat.numel(), "steps": args.steps,
                    "median_wall_us": round(statistics.median(wall[way]) * 1e6, 1),
                    "median_cpu_us": round(statistics.median(cpu[way]) * 1e6, 1),
                    "runs_wall_us": [round(t * 1e6, 1) for t in wall[way]]}
            if way != "ordered":
                line["median_negotiate_us"] = round(statistics.median(negotiate[way]) * 1e6, 1)
                line["last_run"] = stats[way]
            print(json.dumps(line), flush=True)
    tt.shutdown()


if __name__ == "__main__":
    main()
