#!/usr/bin/python3
"""tide's GPU top-k selectors against torch.topk on the same GPU and the
same tensors (scripts/gpu-check.sh runs it; docs/performance.md).

For each size and density, on float32 gradient-like data (normal, and
Student-t with 3 degrees of freedom for heavy tails), times:
  read          x.sum(): one read of the tensor from GPU memory
  torch.topk    torch.topk(|x|, k, sorted=False) on a precomputed |x|
  torch.topk+abs  the same with the |x| in the timing
  tide exact | sampled | mstopk   tide_gpu_topk_select (values and int64
                indices on the device; the call ends with its stream
                synchronised)
Each is the median of --repeats calls after --warmup, wall-clock per call
with a stream synchronisation after each (the same for torch and tide);
the GPU-side time by CUDA events is reported too. The calls interleave:
each repeat times torch.topk, then each of tide's selectors, so that
every one of them meets the same state of the machine (clocks, the host's
load). tide replays a repeated selection as a CUDA graph from its second
call on unless TIDE_GPU_GRAPHS=0 (reported as "graphs"). "mass" is the sum of
|selected| over the sum of the exact top k's. One JSON line per
measurement (--json), else a table.

    topk_gpu.py [--sizes 1000000,25500000,100000000] [--density 0.0001,0.001,0.01]
"""
import argparse
import ctypes
import json
import os
import statistics
import time

import torch

import tide.torch as tt
from tide import _lib
from tide._lib import lib


def timed(fns, warmup, repeats):
    """[(median wall s, median event s)] of each fn() with a synchronisation
    after each call; the functions take turns in every repeat."""
    wall, ev = [[] for _ in fns], [[] for _ in fns]
    for i in range(warmup + repeats):
        for j, fn in enumerate(fns):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            if i >= warmup:
                wall[j].append(t1 - t0)
                ev[j].append(a.elapsed_time(b) * 1e-3)
    return [(statistics.median(w), statistics.median(e)) for w, e in zip(wall, ev)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000000,25500000,100000000")
    ap.add_argument("--density", default="0.0001,0.001,0.01")
    ap.add_argument("--dists", default="normal,t3")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds of calls before the first measurement (the process's and the GPU's start-up)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="print each kernel's GPU time (torch.profiler) for one call per selector, size, density")
    a = ap.parse_args()
    ok, why = tt.gpu_available()
    if not ok:
        raise SystemExit("topk_gpu: tide cannot use the GPU: %s" % why)
    name = torch.cuda.get_device_name(0)
    g = torch.Generator(device="cuda").manual_seed(1)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    if a.settle > 0:  # both libraries' first calls and the clocks' ramp, out of the measurements
        x = torch.randn(25500000, device="cuda", generator=g)
        values, indices = torch.empty(25500, device="cuda"), torch.empty(25500, dtype=torch.int64, device="cuda")
        kind = ctypes.c_int()
        lib.tide_topk_parse(b"sampled", ctypes.byref(kind))
        t_end = time.perf_counter() + a.settle
        while time.perf_counter() < t_end:
            torch.topk(x.abs(), 25500, sorted=False)
            lib.tide_gpu_topk_select(kind.value, None, ctypes.c_void_p(x.data_ptr()), _lib.F32, x.numel(), 25500, b"x",
                                     ctypes.c_void_p(values.data_ptr()), ctypes.c_void_p(indices.data_ptr()), _lib.I64,
                                     stream, None)
            torch.cuda.synchronize()
        del x, values, indices
    rows = []
    for d in (int(s) for s in a.sizes.split(",")):
        for dist in a.dists.split(","):
            x = torch.randn(d, device="cuda", generator=g)
            if dist == "t3":  # heavy tails: normal / sqrt(chi2_3 / 3)
                chi = (torch.randn(3, d, device="cuda", generator=g) ** 2).sum(0) / 3
                x = x / chi.sqrt()
            ax = x.abs()
            (read_w, read_e), = timed([lambda: x.sum()], a.warmup, a.repeats)
            for density in (float(s) for s in a.density.split(",")):
                k = max(1, int(round(density * d)))
                ref_v, _ = torch.topk(ax, k, sorted=False)
                exact_mass = ref_v.double().sum().item()
                res = {"device": name, "d": d, "dist": dist, "density": density, "k": k,
                       "graphs": os.environ.get("TIDE_GPU_GRAPHS", "1"),
                       "read_ms": round(read_w * 1e3, 4), "read_gpu_ms": round(read_e * 1e3, 4)}
                sels = ("exact", "sampled", "mstopk")
                out = {s: (torch.empty(k, device="cuda"), torch.empty(k, dtype=torch.int64, device="cuda"))
                       for s in sels}
                calls, stats = [], {}
                for sel in sels:
                    kind = ctypes.c_int()
                    lib.tide_topk_parse(sel.encode(), ctypes.byref(kind))
                    opts = _lib.TopkOpts(seed=1, mstopk_rounds=0, num_threads=0)
                    st = stats[sel] = _lib.TopkStats()
                    values, indices = out[sel]
                    args = (kind.value, ctypes.byref(opts), ctypes.c_void_p(x.data_ptr()), _lib.F32, d, k, b"x",
                            ctypes.c_void_p(values.data_ptr()), ctypes.c_void_p(indices.data_ptr()), _lib.I64,
                            stream, ctypes.byref(st))

                    def call(args=args):
                        rc = lib.tide_gpu_topk_select(*args)
                        if rc < 0:
                            raise RuntimeError("tide_gpu_topk_select: %s" % lib.tide_strerror(rc).decode())
                    calls.append(call)
                times = timed([lambda: torch.topk(ax, k, sorted=False), lambda: torch.topk(x.abs(), k, sorted=False)]
                              + calls, a.warmup, a.repeats)
                res["torch_ms"], res["torch_gpu_ms"] = round(times[0][0] * 1e3, 4), round(times[0][1] * 1e3, 4)
                res["torch_abs_ms"] = round(times[1][0] * 1e3, 4)
                for sel, call, (w, e) in zip(sels, calls, times[2:]):
                    values, indices = out[sel]
                    st = stats[sel]
                    if a.profile:
                        from torch.profiler import profile, ProfilerActivity
                        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                            call()
                            torch.cuda.synchronize()
                        evs = [(ev.name, ev.device_time_total) for ev in prof.events()
                               if ev.device_time_total > 0 and ev.name.startswith(("tide_", "Memcpy", "Memset"))]
                        print("profile %s d=%d %s density=%g: %s" % (sel, d, dist, density,
                              ", ".join("%s %.1f" % (n.replace("tide_gpu_", ""), t) for n, t in evs)), flush=True)
                    mass = values.abs().double().sum().item() / exact_mass if exact_mass > 0 else 1.0
                    res[sel + "_ms"], res[sel + "_gpu_ms"] = round(w * 1e3, 4), round(e * 1e3, 4)
                    res[sel + "_mass"] = round(mass, 6)
                    res[sel + "_passes"] = st.full_passes
                    res[sel + "_fallback"] = st.fallback
                fastest = min(("exact", "sampled"), key=lambda s: res[s + "_ms"])
                res["fastest_exact_k"] = fastest
                res["speedup_vs_torch"] = round(res["torch_ms"] / res[fastest + "_ms"], 2)
                res["times_read"] = round(res[fastest + "_ms"] / res["read_ms"], 2)
                rows.append(res)
                if a.json:
                    print(json.dumps(res), flush=True)
    if not a.json:
        print("%-10s %-6s %-8s %8s %9s %9s %9s %9s %9s %8s %8s %7s" %
              ("d", "dist", "density", "read ms", "torch ms", "exact ms", "sampl ms", "msk ms", "msk mass",
               "speedup", "x read", "passes"))
        for r in rows:
            print("%-10d %-6s %-8g %8.3f %9.3f %9.3f %9.3f %9.3f %9.4f %7.1fx %7.1fx %3d/%d/%d" %
                  (r["d"], r["dist"], r["density"], r["read_ms"], r["torch_ms"], r["exact_ms"], r["sampled_ms"],
                   r["mstopk_ms"], r["mstopk_mass"], r["speedup_vs_torch"], r["times_read"], r["exact_passes"],
                   r["sampled_passes"], r["mstopk_passes"]))


if __name__ == "__main__":
    main()
