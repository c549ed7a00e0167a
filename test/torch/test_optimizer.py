"""DistributedOptimizer keeps the replicas bit-identical and matches one
process training on the same global batch; backward_passes_per_step,
Adasum, topk/hitopk (density 1 equals dense), broadcast_optimizer_state,
and the Trainer over tide's step API with gns,adascale."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

PER_RANK = 8
STEPS = 5


def worker():
    import copy
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import tide.torch as tt
    from tide import _lib
    tt.init()
    r, n = tt.rank(), tt.size()
    torch.set_num_threads(1)

    def model_for(seed):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 5))

    g = torch.Generator().manual_seed(11)
    gx = torch.randn(STEPS, n * PER_RANK, 20, generator=g)
    gy = torch.randint(0, 5, (STEPS, n * PER_RANK), generator=g)

    def flat(m):
        return torch.cat([p.detach().reshape(-1) for p in m.parameters()])

    def identical(m, what):
        rows = tt.allgather(flat(m).unsqueeze(0))
        for k in range(1, n):
            assert torch.equal(rows[k], rows[0]), "%s: rank %d's parameters differ from rank 0's" % (what, k)

    def train(compression=tt.Compression.none, op=tt.Average, passes=1, bucket_bytes=1024):
        m = model_for(100 + r)  # different on every rank until broadcast
        tt.broadcast_parameters(m.state_dict(), root_rank=0)
        start = copy.deepcopy(m)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        opt = tt.DistributedOptimizer(opt, named_parameters=m.named_parameters(), compression=compression, op=op,
                                      backward_passes_per_step=passes, bucket_bytes=bucket_bytes)
        assert isinstance(opt, torch.optim.SGD)
        for s in range(STEPS):
            x = gx[s, r * PER_RANK:(r + 1) * PER_RANK]
            y = gy[s, r * PER_RANK:(r + 1) * PER_RANK]
            opt.zero_grad()
            for part in range(passes):
                sl = slice(part * PER_RANK // passes, (part + 1) * PER_RANK // passes)
                (F.cross_entropy(m(x[sl]), y[sl]) / passes).backward()
            if compression.name == "none":  # the hooks started every bucket during backward
                assert all(b.handle is not None for b in opt._buckets), "a bucket was not started in backward"
            opt.step()
        return start, m, opt

    def single(start):
        m = copy.deepcopy(start)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        for s in range(STEPS):
            opt.zero_grad()
            F.cross_entropy(m(gx[s]), gy[s]).backward()
            opt.step()
        return m

    start, m, opt = train()
    assert len(opt._buckets) > 1, "expected several buckets"
    identical(m, "dense")
    ref = single(start)
    assert torch.allclose(flat(m), flat(ref), rtol=1e-5, atol=1e-6), \
        "dense: max diff %g from one process" % (flat(m) - flat(ref)).abs().max()
    # two backward passes per step, half the batch each: the same result
    _, m2, _ = train(passes=2)
    identical(m2, "backward_passes_per_step=2")
    assert torch.allclose(flat(m2), flat(ref), rtol=1e-5, atol=1e-6), "backward_passes_per_step=2"
    # Sum is n times the average gradient: not the same model, but identical replicas
    _, m3, _ = train(op=tt.Sum, bucket_bytes=1 << 20)
    identical(m3, "Sum")
    # density 1: top-k and HiTopKComm send everything, so they equal dense
    for c in (tt.Compression.topk(1.0), tt.Compression.hitopk(1.0)):
        _, mc, _ = train(compression=c)
        identical(mc, repr(c))
        assert torch.allclose(flat(mc), flat(ref), rtol=1e-5, atol=1e-6), repr(c)
    for c in (tt.Compression.topk(0.05), tt.Compression.hitopk(0.05)):
        _, mc, oc = train(compression=c)
        identical(mc, repr(c))
        assert torch.isfinite(flat(mc)).all()
        assert not torch.equal(flat(mc), flat(start)), "%r did not train" % c
    # density warm-up: the compressor follows density ** ((t + 1) / (W + 1)), falling step by step
    c = tt.Compression.topk(0.05, warmup_steps=2 * STEPS)
    assert c.density_at(0) > c.density_at(STEPS - 1) > c.density_at(2 * STEPS) == 0.05
    _, mw, ow = train(compression=c)
    identical(mw, repr(c))
    assert ow._density == c.density_at(STEPS - 1), "the last step's density is %g" % ow._density
    k_first, k_last = ow._values.numel(), _lib.lib.tide_compressor_k(ow._compressor)
    assert k_last < k_first, "k did not fall during the warm-up (%d -> %d)" % (k_first, k_last)
    _, ma, _ = train(op=tt.Adasum)
    identical(ma, "Adasum")
    assert torch.isfinite(flat(ma)).all() and not torch.equal(flat(ma), flat(start))

    # broadcast_optimizer_state: rank 0's momentum everywhere
    for p in opt.param_groups[0]["params"]:
        opt.state[p]["momentum_buffer"].add_(float(r))
    tt.broadcast_optimizer_state(opt, root_rank=0)
    bufs = torch.cat([opt.state[p]["momentum_buffer"].reshape(-1) for p in opt.param_groups[0]["params"]])
    rows = tt.allgather(bufs.unsqueeze(0))
    assert all(torch.equal(rows[k], rows[0]) for k in range(n)), "broadcast_optimizer_state"

    # bad arguments name themselves
    for kw, words in (({"op": tt.Min}, "op must be"), ({"backward_passes_per_step": 0}, "backward_passes_per_step"),
                      ({"compression": tt.Compression.topk(0.1), "op": tt.Adasum}, "Adasum")):
        try:
            tt.DistributedOptimizer(torch.optim.SGD(model_for(1).parameters(), lr=0.1), **kw)
        except tt.InvalidArgumentError as e:
            assert words in str(e), str(e)
        else:
            raise AssertionError("accepted %r" % kw)
    for bad, words in ((lambda: tt.Compression.hitopk(0.0), "density"),
                       (lambda: tt.Compression.topk(0.1, warmup_steps=-1), "warmup_steps"),
                       (lambda: tt.Compression.hitopk(0.1, warmup_steps=2.5), "warmup_steps")):
        try:
            bad()
        except tt.InvalidArgumentError as e:
            assert words in str(e), str(e)
        else:
            raise AssertionError("accepted a bad %s" % words)

    # the step API: gns,adascale drive the loop, the monitor's figures are readable
    m = model_for(5)
    data_x = torch.randn(512, 20, generator=torch.Generator().manual_seed(5))
    data_y = (data_x[:, 0] > 0).long()
    tr = tt.Trainer(m, dataset_size=512, batch=8, epochs=2, lr=0.05, adapt="gns,adascale", max_batch=64)
    steps = 0
    for b in tr:
        loss = 0.0
        if b.count:
            loss = F.cross_entropy(m(data_x[b.indices]), data_y[b.indices])
            loss.backward()
        s = tr.step(loss)
        steps += s.stepped
    s = tr.stats
    assert s.done and steps == s.step and s.step > 0
    assert s.gain_ratio >= 1.0 and s.noise_scale == s.noise_scale, s  # not NaN once measured
    assert s.global_batch >= 8 * n and s.exchange == "dense"
    identical(m, "Trainer")
    tr.close()
    g2, s2 = tt.gns_estimate(8, 64, 2.0, 1.5)
    assert abs(tt.adascale_gain(1.0, 1.0, 4.0) - 2.0 / 1.25) < 1e-12
    print("rank %d of %d: optimizer OK (noise scale %.1f, gain ratio %.2f, final batch %d)" %
          (r, n, s.noise_scale, s.gain_ratio, s.global_batch))


def main():
    harness.skip_without_torch()
    script = os.path.abspath(__file__)
    _, out = harness.launch(script, 4)
    if len(harness.lines(out, "optimizer OK")) != 4:
        print("FAIL: not every rank passed")
        return 1
    print("test_optimizer: passed at 4 ranks")
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker()
    else:
        sys.exit(main())
