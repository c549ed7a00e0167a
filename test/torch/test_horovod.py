"""horovod.torch's behaviour on tide.torch, at 3 ranks: a mismatch and a
bad argument leave the job usable (100 times over, then correct results);
allreduce/allgather/broadcast are differentiable with Horovod's gradients,
checked against torch.autograd on all ranks' inputs rebuilt in one process;
allreduce's full signature and forms, grouped_allreduce, Compression.fp16,
DistributedOptimizer(gradient_predivide_factor=), broadcast_optimizer_state
(model=) and the *_built queries."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def inputs(p):
    import torch
    return torch.arange(12, dtype=torch.float64).reshape(4, 3) * (p + 1) + p


def weights(p, shape):
    import torch
    g = torch.Generator().manual_seed(100 + p)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def check_recovery(tt, torch, r, n):
    for i in range(100):
        try:
            tt.allreduce(torch.zeros(10 if r == 0 else 12), op=tt.Sum)
            raise AssertionError("mismatch %d raised nothing" % i)
        except tt.MismatchError as e:
            assert "(10,)" in e.message and "(12,)" in e.message, e.message
    for i in range(100):
        try:
            tt.allreduce(torch.zeros(4, dtype=torch.float16), op=tt.Adasum)  # refused on every rank
            raise AssertionError("f16 Adasum %d raised nothing" % i)
        except tt.InvalidArgumentError as e:
            assert "Adasum needs float32 or float64 tensors" in e.message, e.message
    try:  # a group is one device's (Horovod: CPU and GPU tensors in one group fail)
        tt.grouped_allreduce([torch.zeros(2), torch.zeros(2, device="meta")])
        raise AssertionError("a group on two devices raised nothing")
    except tt.InvalidArgumentError as e:
        assert "must be on one device, got tensors on cpu and meta" in e.message, e.message
    assert torch.equal(tt.allreduce(torch.full((5,), float(r)), op=tt.Sum), torch.full((5,), float(n * (n - 1) // 2)))
    assert torch.equal(tt.allgather(torch.tensor([r])), torch.arange(n))
    assert torch.equal(tt.broadcast(torch.tensor([r]), 1), torch.tensor([1]))


def check_autograd(tt, torch, r, n):
    xs = [inputs(p).requires_grad_() for p in range(n)]
    # allreduce: the gradient of the sum of the ranks' losses
    for op, pre, post in ((tt.Sum, 1.0, 1.0), (tt.Average, 1.0, 1.0), (tt.Sum, 0.5, 3.0)):
        x = inputs(r).requires_grad_()
        y = tt.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post)
        assert y.grad_fn is not None
        (y * weights(r, y.shape)).sum().backward()
        ref = sum(xi * pre for xi in xs) * post / (n if op == tt.Average else 1)
        want, = torch.autograd.grad(sum((ref * weights(p, ref.shape)).sum() for p in range(n)), xs[r])
        assert torch.allclose(x.grad, want), ("allreduce grad", op, pre, post, x.grad, want)
    # allgather and broadcast: the gradient of the mean of the ranks' losses
    x = inputs(r)[: r + 1].clone().requires_grad_()  # ranks gather different row counts
    y = tt.allgather(x)
    assert y.grad_fn is not None and y.shape[0] == n * (n + 1) // 2
    (y * weights(r, y.shape)).sum().backward()
    parts = [xs[p][: p + 1] for p in range(n)]
    ref = torch.cat(parts)
    want, = torch.autograd.grad(sum((ref * weights(p, ref.shape)).sum() for p in range(n)) / n, xs[r])
    assert torch.allclose(x.grad, want[: r + 1]), ("allgather grad", x.grad, want)
    for root in range(n):
        x = inputs(r).requires_grad_()
        y = tt.broadcast(x, root)
        assert torch.equal(y, inputs(root))
        (y * weights(r, y.shape)).sum().backward()
        want, = torch.autograd.grad(sum((xs[root] * weights(p, (4, 3))).sum() for p in range(n)) / n, xs[r],
                                    allow_unused=True)
        want = torch.zeros_like(x) if want is None else want
        assert torch.allclose(x.grad, want), ("broadcast grad", root, x.grad, want)
        if r != root:
            assert torch.equal(x.grad, torch.zeros_like(x))  # was 1 before issue 25

    # reducescatter: Horovod's gradient is size times that of the sum of the ranks' losses
    for op, pre, post in ((tt.Sum, 1.0, 1.0), (tt.Average, 1.0, 1.0), (tt.Sum, 2.0, 0.5)):
        x = inputs(r).requires_grad_()  # 4 rows over 3 ranks: blocks of 2, 1, 1
        y = tt.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post)
        full = sum(xi * pre for xi in xs) * post / (n if op == tt.Average else 1)
        lo = [0, 2, 3, 4]
        assert torch.allclose(y, full[lo[r]:lo[r + 1]]), ("reducescatter", op, y, full)
        (y * weights(r, y.shape)).sum().backward()
        loss = sum((full[lo[p]:lo[p + 1]] * weights(p, (lo[p + 1] - lo[p], 3))).sum() for p in range(n))
        want, = torch.autograd.grad(loss * n, xs[r])
        assert torch.allclose(x.grad, want), ("reducescatter grad", op, x.grad, want)
    # alltoall: rank q sends (q + p) % n + 1 rows to rank p; the gradient of the sum of the ranks' losses
    def split(q):
        return [(q + p) % n + 1 for p in range(n)]
    big = [torch.arange(sum(split(q)) * 2, dtype=torch.float64).reshape(-1, 2) + 100 * q for q in range(n)]
    bigs = [b.clone().requires_grad_() for b in big]
    outs = []
    for p in range(n):  # the reference: what rank p receives
        parts = []
        for q in range(n):
            lo = sum(split(q)[:p])
            parts.append(bigs[q][lo:lo + split(q)[p]])
        outs.append(torch.cat(parts))
    x = big[r].clone().requires_grad_()
    y, received = tt.alltoall(x, splits=torch.tensor(split(r), dtype=torch.int32))
    assert torch.equal(y, outs[r].detach()) and received.tolist() == [split(q)[r] for q in range(n)]
    (y * weights(r, y.shape)).sum().backward()
    want, = torch.autograd.grad(sum((outs[p] * weights(p, outs[p].shape)).sum() for p in range(n)), bigs[r])
    assert torch.allclose(x.grad, want), ("alltoall grad", x.grad, want)
    even = tt.alltoall(torch.arange(n * 2.) + 10 * r)
    assert torch.equal(even, torch.cat([torch.arange(2.) + 2 * r + 10 * q for q in range(n)])), even
    try:
        tt.reducescatter(inputs(r), op=tt.Max)
        raise AssertionError("reducescatter Max accepted")
    except tt.InvalidArgumentError:
        pass
    try:  # shapes (4, 3) against (3, 4) on the last rank: a mismatch on every rank, not a silent success
        tt.reducescatter(inputs(r) if r != n - 1 else inputs(r).reshape(3, 4), op=tt.Sum)
        raise AssertionError("reducescatter of different shapes succeeded")
    except tt.MismatchError:
        pass


def check_signature(tt, torch, r, n):
    x = torch.full((4,), float(r + 1))
    total = float(n * (n + 1) // 2)
    assert torch.equal(tt.allreduce(x, average=False), torch.full((4,), total))
    assert torch.allclose(tt.allreduce(x, average=True), torch.full((4,), total / n))
    assert torch.allclose(tt.allreduce(x), torch.full((4,), total / n))
    assert torch.allclose(tt.allreduce(x, op=tt.Sum, prescale_factor=2.0, postscale_factor=0.25),
                          torch.full((4,), total * 0.5))
    for bad in (dict(average=True, op=tt.Sum), dict(average=tt.Sum), dict(prescale_factor="2")):
        try:
            tt.allreduce(x, **bad)
            raise AssertionError("%r accepted" % bad)
        except tt.InvalidArgumentError:
            pass
    h = tt.allreduce_async(x, op=tt.Sum, name="a")
    assert torch.equal(tt.synchronize(h), torch.full((4,), total)) and torch.equal(x, torch.full((4,), r + 1.0))
    y = x.clone()
    h = tt.allreduce_async_(y, op=tt.Sum, postscale_factor=2.0)
    assert tt.synchronize(h) is y and torch.equal(y, torch.full((4,), 2 * total))
    y = x.clone()
    assert tt.allreduce_(y, op=tt.Max) is y and torch.equal(y, torch.full((4,), float(n)))
    # Compression.fp16: sent as float16, returned in the tensor's dtype
    z = torch.full((3,), (r + 1) / 3.0)
    got = tt.allreduce(z, op=tt.Sum, compression=tt.Compression.fp16)
    assert got.dtype == torch.float32 and torch.allclose(got, torch.full((3,), total / 3.0), rtol=1e-3)
    z2 = z.clone()
    assert tt.synchronize(tt.allreduce_async_(z2, op=tt.Sum, compression=tt.Compression.fp16)) is z2
    assert torch.allclose(z2, got)
    # grouped_allreduce: every form
    ts = [torch.full((k + 1,), float(r + k)) for k in range(3)]
    want = [torch.full((k + 1,), float(n * (n - 1) // 2 + n * k)) for k in range(3)]
    got = tt.grouped_allreduce(ts, op=tt.Sum)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    got = tt.synchronize(tt.grouped_allreduce_async(ts, average=False))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    cp = [t.clone() for t in ts]
    assert all(a is b for a, b in zip(tt.grouped_allreduce_(cp, op=tt.Sum), cp))
    assert all(torch.equal(a, b) for a, b in zip(cp, want))
    cp = [t.clone() for t in ts]
    tt.synchronize(tt.grouped_allreduce_async_(cp, op=tt.Sum))
    assert all(torch.equal(a, b) for a, b in zip(cp, want))
    g = [t.clone().requires_grad_() for t in ts]
    sum(o.sum() for o in tt.grouped_allreduce(g, op=tt.Sum)).backward()
    assert all(torch.equal(t.grad, torch.full_like(t, float(n))) for t in g)
    objs = tt.allgather_object({"rank": r, "words": "x" * (r * 5)})
    assert objs == [{"rank": p, "words": "x" * (p * 5)} for p in range(n)], objs
    h = tt.broadcast_async(torch.tensor([r]), 2)
    assert torch.equal(tt.synchronize(h), torch.tensor([2]))
    # the *_built queries: nothing tide lacks answers yes; mpi_built agrees with libmpi being loaded
    assert tt.nccl_built() == 0 and not tt.gloo_built() and not tt.ccl_built() and not tt.ddl_built()
    assert not tt.cuda_built() and not tt.rocm_built()
    with open("/proc/self/maps") as f:
        has_mpi = "libmpi" in f.read()
    assert tt.mpi_built() == has_mpi, (tt.mpi_built(), has_mpi)


def check_optimizer(tt, torch, r, n):
    def grads(compression, factor):
        torch.manual_seed(0)
        m = torch.nn.Linear(5, 3)
        ref = torch.nn.Linear(5, 3)
        ref.load_state_dict(m.state_dict())
        opt = tt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                                      compression=compression, gradient_predivide_factor=factor)
        tt.broadcast_optimizer_state(opt, root_rank=0, model=m)
        data = torch.randn(4, 5, generator=torch.Generator().manual_seed(r))
        m(data).pow(2).sum().backward()
        opt.synchronize()
        ref(data).pow(2).sum().backward()
        for (name, p), q in zip(m.named_parameters(), ref.parameters()):
            want = tt.allreduce(q.grad, op=tt.Average)
            tol = 2e-3 if compression is tt.Compression.fp16 else 1e-5
            assert torch.allclose(p.grad, want, rtol=tol, atol=tol), (name, compression, factor, p.grad, want)
        before = [p.detach().clone() for p in m.parameters()]
        with opt.skip_synchronize():
            opt.step()
        for p, b in zip(m.parameters(), before):
            assert torch.allclose(p.detach(), b - 0.1 * p.grad)  # one SGD step on the combined gradient
    grads(tt.Compression.none, 1.0)
    grads(tt.Compression.none, 4.0)
    grads(tt.Compression.fp16, 1.0)
    grads(tt.Compression.fp16, 2.0)
    m = torch.nn.Linear(2, 2)
    for kwargs in (dict(op=tt.Sum, gradient_predivide_factor=2.0), dict(gradient_predivide_factor=0)):
        try:
            tt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), **kwargs)
            raise AssertionError("%r accepted" % kwargs)
        except tt.InvalidArgumentError:
            pass


def worker(case):
    import torch
    import tide.torch as tt
    tt.init()
    r, n = tt.rank(), tt.size()
    check_recovery(tt, torch, r, n)
    check_autograd(tt, torch, r, n)
    check_signature(tt, torch, r, n)
    check_optimizer(tt, torch, r, n)
    check_recovery(tt, torch, r, n)  # still usable after all of the above
    print("rank %d passed" % r, flush=True)


def main():
    return harness.ranks_pass(__file__, 3, "test_horovod")


if __name__ == "__main__":
    harness.dispatch(main, worker)
