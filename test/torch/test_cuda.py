"""tide.torch with CUDA tensors (77 without torch, CUDA or tide's GPU path):

- tide.torch.topk on the GPU against torch.topk and tide's CPU selector on
  the same tensors: exact and sampled give the CPU's set (torch.topk's
  magnitudes), MSTopK exactly k distinct pairs and its mass; float16 and
  bfloat16 inputs; NaN refused;
- the collectives on CUDA tensors from 2 processes sharing one GPU, staged
  in small pieces (TIDE_TORCH_PIECE_BYTES=4096) so that the pipeline runs:
  allreduce (every op and dtype, in place, nonblocking with poll),
  broadcast, allgather, Adasum (equal to Adasum on the CPU copies);
- DistributedOptimizer on CUDA parameters (none, topk, hitopk; the last two
  select on the GPU) against the same run on CPU parameters: the same
  parameters within float tolerance, replicas identical.
scripts/gpu-check.sh runs it on a GPU machine."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def skip_without_gpu():
    harness.skip_without_torch()
    import torch
    if not torch.cuda.is_available():
        print("skipped: torch sees no CUDA device")
        sys.exit(77)
    import tide.torch as tt
    ok, why = tt.gpu_available()
    if not ok:
        print("skipped: tide cannot use the GPU: %s" % why)
        sys.exit(77)


def check_topk():
    import torch
    import tide.torch as tt
    g = torch.Generator(device="cuda").manual_seed(7)
    cases = 0
    for d in (1000, 65537, 1 << 20, 4_000_003):
        for dist in ("normal", "ties", "sparse"):
            x = torch.randn(d, device="cuda", generator=g)
            if dist == "ties":
                x = torch.round(x * 2) / 2
            elif dist == "sparse":
                x = x * (torch.rand(d, device="cuda", generator=g) < 0.05)
            for density in (0.0001, 0.001, 0.01, 0.1):
                k = max(1, int(round(density * d)))
                ref_v, ref_i = torch.topk(x.abs(), k, sorted=True)
                cpu_v, cpu_i = tt.topk(x.cpu(), k, selector="exact")
                for sel in ("exact", "sampled"):
                    v, i = tt.topk(x, k, selector=sel)
                    assert v.shape == (k,) and i.dtype == torch.int64
                    assert torch.equal(x[i], v), (sel, d, dist, density, "values are x at the indices")
                    assert torch.equal(torch.sort(i).values.cpu(), cpu_i), (sel, d, dist, density, "set")
                    assert torch.equal(torch.sort(v.abs(), descending=True).values, ref_v), (sel, d, dist, "mags")
                    cases += 1
                v, i = tt.topk(x, k, selector="mstopk", seed=int(density * 1e4))
                assert torch.unique(i).numel() == k and torch.equal(x[i], v), ("mstopk", d, dist, density)
                mass = (v.abs().sum() / ref_v.sum()).item() if ref_v.sum() > 0 else 1.0
                assert mass >= (0.9 if dist == "normal" else 0.5), ("mstopk mass", d, dist, density, mass)
                cases += 1
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(1 << 20, device="cuda", generator=g).to(dtype)
        k = 1000
        v, i = tt.topk(x, k, selector="sampled")
        _, cpu_i = tt.topk(x.float().cpu(), k, selector="exact")
        assert v.dtype == dtype and torch.equal(torch.sort(i).values.cpu(), cpu_i), dtype
        cases += 1
    x = torch.randn(100000, device="cuda")
    x[777] = float("nan")
    for sel in ("exact", "sampled", "mstopk"):
        try:
            tt.topk(x, 10, selector=sel)
        except tt.InvalidArgumentError as e:
            assert e.name == "TIDE_EINVAL" and "NaN" in str(e), str(e)
        else:
            raise AssertionError("%s accepted a NaN" % sel)
    print("topk: %d cases against torch.topk and the CPU selector OK" % cases)


def worker():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import tide.torch as tt
    tt.init()
    r, n = tt.rank(), tt.size()
    torch.set_num_threads(1)
    dev = torch.device("cuda", 0)  # two processes share one GPU

    # ---- collectives ----
    for dtype in (torch.float32, torch.float64, torch.float16, torch.int32):
        xs = [(torch.arange(10007, dtype=torch.float64) * (k + 1) % 13).to(dtype) for k in range(n)]
        total = sum(t.double() for t in xs)
        got = tt.allreduce(xs[r].to(dev), op=tt.Sum)
        assert got.is_cuda and torch.equal(got.double().cpu(), total), ("sum", dtype)
        if dtype != torch.float16:
            st = torch.stack(xs)
            assert torch.equal(tt.allreduce(xs[r].to(dev), op=tt.Min).cpu(), st.min(0).values), ("min", dtype)
            assert torch.equal(tt.allreduce(xs[r].to(dev), op=tt.Max).cpu(), st.max(0).values), ("max", dtype)
        if dtype.is_floating_point:
            avg = tt.allreduce(xs[r].to(dev))
            tol = 1e-2 if dtype == torch.float16 else 1e-6
            assert torch.allclose(avg.double().cpu(), total / n, rtol=tol, atol=tol), ("avg", dtype)
        y = xs[r].to(dev)
        tt.allreduce_(y, op=tt.Sum)
        assert torch.equal(y.double().cpu(), total), ("in place", dtype)
        for root in range(n):
            assert torch.equal(tt.broadcast(xs[r].to(dev), root).cpu(), xs[root]), ("broadcast", dtype, root)
    hs = [tt.allreduce_async(torch.full((50000,), float(r + k), device=dev), op=tt.Sum) for k in range(3)]
    while not all(tt.poll(h) for h in hs):
        pass
    for k, h in enumerate(hs):
        assert torch.equal(tt.synchronize(h).cpu(), torch.full((50000,), float(sum(q + k for q in range(n)))))
    mine = torch.full((r + 1, 3), float(r), device=dev)
    want = torch.cat([torch.full((q + 1, 3), float(q)) for q in range(n)])
    assert torch.equal(tt.allgather(mine).cpu(), want)
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(5000, dtype=torch.float64, generator=gen) for _ in range(n)]
    a_gpu = tt.allreduce(xs[r].to(dev), op=tt.Adasum).cpu()
    a_cpu = tt.allreduce(xs[r], op=tt.Adasum)
    assert torch.equal(a_gpu, a_cpu), "adasum on CUDA tensors equals adasum on their CPU copies"
    print("rank %d: CUDA collectives OK" % r)

    # ---- training: CUDA parameters against CPU parameters ----
    def run(device, compression):
        torch.manual_seed(5)
        m = nn.Sequential(nn.Linear(40, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 5)).to(device)
        tt.broadcast_parameters(m.state_dict(), root_rank=0)
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        opt = tt.DistributedOptimizer(opt, named_parameters=m.named_parameters(), compression=compression,
                                      bucket_bytes=16384)
        gen = torch.Generator().manual_seed(11)
        losses = []
        for step in range(30):
            x = torch.randn(n * 16, 40, generator=gen)
            y = (x[:, :5].argmax(1))
            xb, yb = x[r * 16:(r + 1) * 16].to(device), y[r * 16:(r + 1) * 16].to(device)
            opt.zero_grad()
            loss = F.cross_entropy(m(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        flat = torch.cat([p.detach().reshape(-1).cpu() for p in m.parameters()])
        return flat, losses

    for name, comp in (("none", tt.Compression.none), ("topk", tt.Compression.topk(0.01, selector="exact")),
                       ("hitopk", tt.Compression.hitopk(0.01, selector="sampled"))):
        pc, lc = run(torch.device("cpu"), comp)
        pg, lg = run(dev, comp)
        rows = tt.allgather(pg.unsqueeze(0))
        assert all(torch.equal(rows[q], rows[0]) for q in range(n)), (name, "replicas differ")
        diff = (pc - pg).abs().max().item()
        assert diff < 1e-4, (name, "CUDA and CPU parameters differ by %g" % diff)
        assert lg[-1] < lg[0], (name, "loss did not fall", lg[0], lg[-1])
        print("rank %d: training %s: CUDA matches CPU (max |diff| %.2e), loss %.3f -> %.3f" %
              (r, name, diff, lg[0], lg[-1]))
    print("rank %d: CUDA training OK" % r)


def main():
    skip_without_gpu()
    check_topk()
    script = os.path.abspath(__file__)
    _, out = harness.launch(script, 2, env={"TIDE_TORCH_PIECE_BYTES": "4096"})
    if len(harness.lines(out, "CUDA training OK")) != 2:
        print("FAIL: the 2 ranks did not both pass")
        return 1
    print("test_cuda: passed")
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker()
    else:
        sys.exit(main())
