"""Horovod's name matching on tide.torch, at 3 ranks (python/tide/torch/_controller.py):
named collectives started in different orders on different ranks; a name
already in flight refused on its rank (ValueError) while the job goes on;
allreduce and broadcast of (2, 6) against (3, 4) and a name no other rank
uses fail on every rank with MismatchError naming both (20 times over), then
correct results; join (zeros from the joined rank, the last joiner returned
everywhere); process sets (collectives and barrier on a subset, the other
rank not held up); Product and the dtypes libtide lacks (uint8, int8,
int16, bool); SyncBatchNorm against BatchNorm1d on the global batch."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def expect_mismatch(tt, fn, *words):
    try:
        fn()
    except tt.MismatchError as e:
        assert all(w in e.message for w in words), (words, e.message)
        return
    raise AssertionError("no MismatchError (expected one naming %s)" % (words,))


def check_order(tt, torch, r, n):
    names = ["a", "b", "c", "d"]
    order = names[r:] + names[:r]  # every rank starts them in a different order
    handles = {nm: tt.allreduce_async(torch.full((3,), float(10 * names.index(nm) + r)), name=nm, op=tt.Sum)
               for nm in order}
    for nm in reversed(order):
        want = float(n * 10 * names.index(nm) + n * (n - 1) // 2)
        assert torch.equal(tt.synchronize(handles[nm]), torch.full((3,), want)), nm
    # 30 requests in one round: the list overflows the 1 KiB frame (the second exchange)
    # and they are fused: one flat allreduce of the 30 (tensor fusion)
    from tide.torch import _horovod
    reduce, sizes = _horovod._reduce, []
    _horovod._reduce = lambda w, op, call: (sizes.append(w.numel()), reduce(w, op, call))[1]
    ts = [torch.full((2,), float(r + k)) for k in range(30)]
    try:
        got = tt.grouped_allreduce(ts, name="a-group-with-a-name-long-enough-to-overflow-the-frame", op=tt.Sum)
    finally:
        _horovod._reduce = reduce
    assert sizes == [60], sizes
    assert all(torch.equal(g, torch.full((2,), float(n * (n - 1) // 2 + n * k))) for k, g in enumerate(got))
    # one async allgather and broadcast in between, unnamed, matched by kind and order
    h1 = tt.allgather_async(torch.tensor([r]))
    h2 = tt.broadcast_async(torch.tensor([r * 5]), root_rank=n - 1)
    tt.poll(h2)  # starts a round; done once every rank has joined it
    assert torch.equal(tt.synchronize(h2), torch.tensor([(n - 1) * 5]))
    assert tt.poll(h1) and torch.equal(tt.synchronize(h1), torch.arange(n))
    # A loop of polls makes progress with no wait at all (Horovod's background thread would).
    hs = [tt.allreduce_async(torch.full((4,), float(r + k)), op=tt.Sum) for k in range(3)]
    while not all(tt.poll(h) for h in hs):
        pass
    for k, h in enumerate(hs):
        assert torch.equal(tt.synchronize(h), torch.full((4,), float(n * (n - 1) // 2 + n * k))), k
    # One rank polls while the others wait: the rounds line up.
    h = tt.allreduce_async(torch.full((2,), float(r)), name="polled", op=tt.Sum)
    while r == 0 and not tt.poll(h):
        time.sleep(0.001)
    assert torch.equal(tt.synchronize(h), torch.full((2,), float(n * (n - 1) // 2)))


def check_duplicate(tt, torch, r, n):
    t = torch.full((4,), float(r))
    if r == 0:
        first = tt.allreduce_async(t, name="dup", op=tt.Sum)
        try:
            tt.allreduce_async(t, name="dup", op=tt.Sum)
            raise AssertionError("a second 'dup' in flight was accepted")
        except ValueError as e:
            assert "already in flight" in str(e), e
    tt.barrier()
    if r > 0:
        first = tt.allreduce_async(t, name="dup", op=tt.Sum)
    tt.barrier()
    assert torch.equal(tt.synchronize(first), torch.full((4,), float(n * (n - 1) // 2)))


def check_mismatch(tt, torch, r, n):
    last = r == n - 1
    for _ in range(20):
        expect_mismatch(tt, lambda: tt.allreduce(torch.zeros((3, 4) if last else (2, 6)), name="shape"),
                        "(2, 6)", "(3, 4)")
        expect_mismatch(tt, lambda: tt.broadcast(torch.zeros((3, 4) if last else (2, 6)), 0, name="shape"),
                        "(2, 6)", "(3, 4)")
        expect_mismatch(tt, lambda: tt.allreduce(torch.zeros(3), name="solo%d" % r), "solo0", "solo%d" % (n - 1))
        expect_mismatch(tt, lambda: tt.allreduce(torch.zeros(3, dtype=torch.int32 if last else torch.float32)),
                        "torch.int32", "torch.float32")
    assert torch.equal(tt.allreduce(torch.full((2, 6), float(r)), op=tt.Sum, name="shape"),
                       torch.full((2, 6), float(n * (n - 1) // 2)))
    assert torch.equal(tt.broadcast(torch.full((3, 4), float(r)), 1), torch.full((3, 4), 1.0))


def check_join(tt, torch, r, n):
    first = n - 1
    x = torch.arange(6, dtype=torch.float64) + r
    if r == first:
        ret = tt.join()
    else:
        a = tt.allreduce(x, name="j.a", op=tt.Sum)
        b = tt.allreduce(x * 2, name="j.b", op=tt.Average)
        others = [p for p in range(n) if p != first]
        assert torch.equal(a, sum(torch.arange(6, dtype=torch.float64) + p for p in others))
        assert torch.allclose(b, sum((torch.arange(6, dtype=torch.float64) + p) * 2 for p in others) / n)
        try:
            tt.allgather(x)  # unnamed: the joined ranks count none, so the number is given back
            raise AssertionError("allgather ran while a rank had joined")
        except tt.MismatchError as e:
            assert "joined" in e.message, e.message
        ret = tt.join()
    assert ret != first and tt.allgather_object(ret) == [ret] * n, ret


def check_process_sets(tt, torch, r, n):
    evens = tt.add_process_set([p for p in range(n) if p % 2 == 0])
    assert evens.size() == (n + 1) // 2 and evens.included() == (r % 2 == 0)
    assert tt.global_process_set.size() == n
    if r % 2 == 0:
        got = tt.allreduce(torch.tensor([float(r)]), op=tt.Sum, process_set=evens)
        assert got.item() == sum(p for p in range(n) if p % 2 == 0)
        got = tt.allgather(torch.tensor([r]), process_set=evens)
        assert got.tolist() == [p for p in range(n) if p % 2 == 0]
        got = tt.broadcast(torch.tensor([r]), root_rank=max(p for p in range(n) if p % 2 == 0), process_set=evens)
        tt.barrier(process_set=evens)
    else:
        try:
            tt.allreduce(torch.zeros(1), process_set=evens)
            raise AssertionError("a non-member's collective on the set was accepted")
        except tt.InvalidArgumentError:
            pass
    assert tt.allreduce(torch.tensor([1.0]), op=tt.Sum).item() == n
    assert tt.remove_process_set(evens) and not tt.remove_process_set(evens)


def check_dtypes(tt, torch, r, n):
    x = torch.tensor([r + 1, 2, -3], dtype=torch.int64)
    assert torch.equal(tt.allreduce(x, op=tt.Product), torch.tensor([1, 2 ** n, (-3) ** n]) *
                       torch.tensor([int(torch.arange(1, n + 1).prod()), 1, 1]))
    for dtype in (torch.uint8, torch.int8, torch.int16):
        t = torch.tensor([r, 1, 2], dtype=dtype)
        s = tt.allreduce(t, op=tt.Sum)
        assert s.dtype == dtype and s.tolist() == [n * (n - 1) // 2, n, 2 * n], (dtype, s)
        assert tt.allreduce(t, op=tt.Max).tolist() == [n - 1, 1, 2]
        g = tt.allgather(t)
        assert g.dtype == dtype and g.tolist() == sum(([p, 1, 2] for p in range(n)), [])
        b = tt.broadcast(t, root_rank=1)
        assert b.dtype == dtype and b.tolist() == [1, 1, 2]
        a = tt.alltoall(torch.tensor([r] * n, dtype=dtype))
        assert a.dtype == dtype and a.tolist() == list(range(n))
    flags = tt.allgather(torch.tensor([r % 2 == 0]))
    assert flags.dtype == torch.bool and flags.tolist() == [p % 2 == 0 for p in range(n)]


def check_sync_batch_norm(tt, torch, r, n):
    """SyncBatchNorm on ranks holding 2 + r samples against BatchNorm1d on
    all of them in one process: outputs, running statistics, and the
    gradients of the sum of the ranks' losses."""
    def data(p):
        g = torch.Generator().manual_seed(7 + p)
        return torch.randn(2 + p, 4, 3, generator=g, dtype=torch.float64) * (p + 1) + p

    def weights(p):
        return torch.randn(2 + p, 4, 3, generator=torch.Generator().manual_seed(70 + p), dtype=torch.float64)
    sbn = tt.SyncBatchNorm(4).double()
    bn = torch.nn.BatchNorm1d(4).double()
    for _ in range(2):  # twice: the running statistics move on
        x = data(r).requires_grad_()
        y = sbn(x)
        (y * weights(r)).sum().backward()
        xs = [data(p).requires_grad_() for p in range(n)]
        ref = bn(torch.cat(xs))
        lo = sum(2 + p for p in range(r))
        assert torch.allclose(y, ref[lo:lo + 2 + r]), "SyncBatchNorm output"
        sum((ref[sum(2 + q for q in range(p)):][:2 + p] * weights(p)).sum() for p in range(n)).backward()
        assert torch.allclose(x.grad, xs[r].grad), ("SyncBatchNorm input gradient", x.grad, xs[r].grad)
    assert torch.allclose(sbn.running_mean, bn.running_mean) and torch.allclose(sbn.running_var, bn.running_var)
    assert torch.allclose(tt.allreduce(sbn.weight.grad, op=tt.Sum), bn.weight.grad)
    assert torch.allclose(tt.allreduce(sbn.bias.grad, op=tt.Sum), bn.bias.grad)


def worker(case):
    import torch
    import tide.torch as tt
    tt.init()
    r, n = tt.rank(), tt.size()
    check_order(tt, torch, r, n)
    check_duplicate(tt, torch, r, n)
    check_mismatch(tt, torch, r, n)
    check_join(tt, torch, r, n)
    check_process_sets(tt, torch, r, n)
    check_dtypes(tt, torch, r, n)
    check_sync_batch_norm(tt, torch, r, n)
    check_order(tt, torch, r, n)  # still usable after all of the above
    tt.shutdown()
    print("rank %d passed" % r, flush=True)


def main():
    return harness.ranks_pass(__file__, 3, "test_names")


if __name__ == "__main__":
    harness.dispatch(main, worker)
