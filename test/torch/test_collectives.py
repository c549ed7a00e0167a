"""tide.torch's collectives against torch's own arithmetic at 1-4 ranks,
and its clear errors for tensors it cannot take."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def adasum_pair(a, b):
    dot = (a * b).sum()
    na, nb = (a * a).sum(), (b * b).sum()
    ca = 1 - dot / (2 * na) if na >= 1.5e-154 else 1.0
    cb = 1 - dot / (2 * nb) if nb >= 1.5e-154 else 1.0
    return ca * a + cb * b


def adasum_ref(xs, cpus):
    """docs/algorithms.md: pairs (2i, 2i+1) for i < n - p first, then one
    level per distance d = 1, 2, ..., p/2, except that over shared memory the
    distances at which every pair of ranks runs on the same CPUs come first
    (cpus[r]: rank r's affinity mask, None when it may run anywhere)."""
    n = len(xs)
    p = 1
    while p * 2 <= n:
        p *= 2
    extra = n - p

    def real(v):
        return 2 * v + 1 if v < extra else v + extra

    def shared(d):
        return all(cpus[real(v)] is not None and cpus[real(v)] == cpus[real(v ^ d)] for v in range(p))
    dists = [1 << k for k in range(p.bit_length() - 1)]
    dists = [d for d in dists if shared(d)] + [d for d in dists if not shared(d)]
    cur = {v: adasum_pair(xs[2 * v], xs[2 * v + 1]) if v < extra else xs[v + extra] for v in range(p)}
    for d in dists:
        for v in sorted(cur):
            if v in cur and not v & d:
                cur[v] = adasum_pair(cur[v], cur.pop(v ^ d))
    return cur[0]


def worker():
    import torch
    import tide.torch as tt
    tt.init()
    r, n = tt.rank(), tt.size()
    assert tt.local_rank() == r and tt.local_size() == n

    def inputs(dtype, count=1000):
        g = torch.Generator().manual_seed(7)
        # integer values: every sum order is exact, so sums must match bit for bit
        return [torch.randint(-50, 50, (count,), generator=g).to(dtype) for _ in range(n)]

    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.bfloat16):
        xs = inputs(dtype)
        total = torch.stack([x.double() for x in xs]).sum(0)
        got = tt.allreduce(xs[r], op=tt.Sum)
        assert torch.equal(got.double(), total), ("sum", dtype)
        if dtype.is_floating_point:
            avg = tt.allreduce(xs[r])
            tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
            assert torch.allclose(avg.double(), total / n, rtol=tol, atol=tol), ("avg", dtype)
        if dtype not in (torch.float16, torch.bfloat16):
            st = torch.stack(xs)
            assert torch.equal(tt.allreduce(xs[r], op=tt.Min), st.min(0).values), ("min", dtype)
            assert torch.equal(tt.allreduce(xs[r], op=tt.Max), st.max(0).values), ("max", dtype)
        for root in range(n):
            assert torch.equal(tt.broadcast(xs[r], root), xs[root]), ("broadcast", dtype, root)
        y = xs[r].clone()
        tt.allreduce_(y, op=tt.Sum)
        assert torch.equal(y.double(), total)

    # nonblocking: several in flight, waited for in reverse order
    xs = inputs(torch.float64, 5000)
    hs = [tt.allreduce_async(xs[r] * (k + 1), op=tt.Sum) for k in range(4)]
    for k in reversed(range(4)):
        assert torch.equal(tt.synchronize(hs[k]), sum(xs) * (k + 1))
    # a shaped tensor keeps its shape
    m = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (r + 1)
    assert torch.equal(tt.allreduce(m, op=tt.Sum), torch.arange(12.).reshape(3, 4) * (n * (n + 1) // 2))

    # allgather: ranks differ in the first dimension
    mine = torch.full((r + 1, 3), float(r))
    want = torch.cat([torch.full((k + 1, 3), float(k)) for k in range(n)])
    assert torch.equal(tt.allgather(mine), want)
    assert torch.equal(tt.allgather(torch.tensor(r)), torch.arange(n))

    # Adasum against the formula, in float64
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(257, dtype=torch.float64, generator=g) for _ in range(n)]
    got = tt.allreduce(xs[r], op=tt.Adasum)
    mask = sum(1 << c for c in os.sched_getaffinity(0))
    masks = tt.allgather(torch.tensor([mask], dtype=torch.int64)).tolist()
    cpus = [m if bin(m).count("1") < os.cpu_count() else None for m in masks]
    assert torch.allclose(got, adasum_ref(xs, cpus), rtol=1e-9, atol=1e-12), "adasum"
    # identical vectors give themselves
    assert torch.allclose(tt.allreduce(xs[0], op=tt.Adasum), xs[0], rtol=1e-12)

    # broadcast_object / parameters
    obj = tt.broadcast_object({"rank": r, "t": torch.ones(2) * r}, root_rank=n - 1)
    assert obj["rank"] == n - 1 and torch.equal(obj["t"], torch.ones(2) * (n - 1))

    # what tide cannot take is a clear TIDE_EINVAL, and the communicator stays usable
    bad = [(torch.arange(10.)[::2], "not contiguous"), (torch.zeros(3, device="meta"), "CPU and CUDA tensors"),
           (torch.zeros(3, dtype=torch.complex64), "dtype")]  # bool and uint8 travel as int32 (test_names.py)
    for t, words in bad:
        try:
            tt.allreduce(t)
        except tt.InvalidArgumentError as e:
            assert words in str(e) and e.name == "TIDE_EINVAL", str(e)
        else:
            raise AssertionError("allreduce accepted %s" % words)
    try:
        tt.allreduce(torch.zeros(3, dtype=torch.int32), op=tt.Adasum)
    except tt.InvalidArgumentError as e:
        assert "Adasum" in str(e)
    try:
        tt.allreduce(torch.zeros(3), op=7)
    except tt.InvalidArgumentError as e:
        assert "op must be" in str(e)
    assert torch.equal(tt.allreduce(torch.ones(3), op=tt.Sum), torch.full((3,), float(n)))
    print("rank %d of %d: collectives OK" % (r, n))


def main():
    harness.skip_without_torch()
    script = os.path.abspath(__file__)
    for np in (1, 2, 3, 4):
        _, out = harness.launch(script, np)
        if len(harness.lines(out, "collectives OK")) != np:
            print("FAIL: %d ranks did not all pass" % np)
            return 1
    print("test_collectives: np 1-4 passed")
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker()
    else:
        sys.exit(main())
