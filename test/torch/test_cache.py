"""The response cache of tide.torch's name matching (python/tide/torch/_controller.py),
at 3 ranks: a set of named allreduces repeated step after step (started in a
different order on each rank) runs from the cache (negotiation_stats counts a
cached round per step and a hit per request) with the right sums, fused as
before; after caching, a changed shape or dtype on one rank, a name no other
rank uses, and a rank that skips a cached name still raise MismatchError
naming both calls on every rank (10 times each), and the next steps run
cached again; a shape changed on every rank runs and refreshes the entry; a
small cache evicts its least recently used names and stays correct;
unnamed calls are not cached; process sets have their own cache; caches
of different sizes on the ranks are a MismatchError naming
TIDE_TORCH_CACHE_CAPACITY; with the cache off nothing is cached and the
results are the same. The driver checks that a bad TIDE_TORCH_CACHE_CAPACITY
is refused at import, naming the variable."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_names import expect_mismatch  # noqa: E402

NAMES = ["layer%d.%s" % (i, w) for i in range(6) for w in ("weight", "bias")]


def shape_of(k):
    return (3, 2) if k % 2 == 0 else (3,)


def step(tt, torch, r, n, ps=None, names=NAMES, override=None):
    """One step of Horovod-style gradient allreduces: every name started
    (in an order of this rank's own), then waited for; checks the sums."""
    kw = {} if ps is None else {"process_set": ps}
    members = list(range(n)) if ps is None else ps.ranks
    order = names[r % len(names):] + names[:r % len(names)]
    handles = {}
    for nm in order:
        k = names.index(nm)
        t = torch.full(shape_of(k), float(100 * k + r))
        if override is not None and nm in override:
            t = override[nm]
        handles[nm] = tt.allreduce_async_(t, name="allreduce." + nm, op=tt.Sum, **kw)
    for nm in reversed(order):
        got = tt.synchronize(handles[nm])
        if override is None or nm not in override:
            k = names.index(nm)
            want = torch.full(shape_of(k), float(len(members) * 100 * k + sum(members)))
            assert torch.equal(got, want), (nm, got, want)


def counters(tt, ps=None):
    return tt.negotiation_stats(ps)


def check_hits(tt, torch, r, n):
    from tide.torch import _horovod
    s0 = counters(tt)
    step(tt, torch, r, n)  # first time: negotiated in full, then cached
    s1 = counters(tt)
    assert s1["cached_rounds"] == s0["cached_rounds"] and s1["cache_misses"] - s0["cache_misses"] == len(NAMES), \
        (s0, s1)
    assert s1["cache_entries"] >= len(NAMES), s1
    reduce, sizes = _horovod._reduce, []
    _horovod._reduce = lambda w, op, call: (sizes.append(w.numel()), reduce(w, op, call))[1]
    try:
        for _ in range(5):
            step(tt, torch, r, n)
    finally:
        _horovod._reduce = reduce
    s2 = counters(tt)
    assert s2["rounds"] - s1["rounds"] == 5 and s2["cached_rounds"] - s1["cached_rounds"] == 5, (s1, s2)
    assert s2["cache_hits"] - s1["cache_hits"] == 5 * len(NAMES) and s2["cache_misses"] == s1["cache_misses"], \
        (s1, s2)
    assert sizes == [sum(3 * (2 if k % 2 == 0 else 1) for k in range(len(NAMES)))] * 5, sizes  # fused, as before


def check_mismatches_after_caching(tt, torch, r, n):
    last = r == n - 1
    for _ in range(10):
        step(tt, torch, r, n)  # cached
        before = counters(tt)["cached_rounds"]
        # one rank's shape changes: that name fails everywhere, naming both; the others run
        bad = {"layer2.weight": torch.zeros((2, 3) if last else (3, 2))}
        expect_mismatch(tt, lambda: step(tt, torch, r, n, override=bad), "(3, 2)", "(2, 3)", "layer2.weight")
        # one rank's dtype changes
        bad = {"layer1.bias": torch.zeros(3, dtype=torch.float64 if last else torch.float32)}
        expect_mismatch(tt, lambda: step(tt, torch, r, n, override=bad), "torch.float64", "torch.float32")
        # one rank submits a name no other rank uses, instead of a cached one
        names = NAMES[:-1] + (["other"] if last else NAMES[-1:])
        expect_mismatch(tt, lambda: step(tt, torch, r, n, names=names), "other", NAMES[-1])
        assert counters(tt)["cached_rounds"] == before, "a mismatched step ran from the cache"
    step(tt, torch, r, n)
    step(tt, torch, r, n)
    s = counters(tt)
    step(tt, torch, r, n)
    assert counters(tt)["cached_rounds"] == s["cached_rounds"] + 1, "the cache did not recover"
    # every rank changes the shape alike: no error, the entry is refreshed, and cached next time
    new = {"layer0.weight": torch.full((4, 4), float(r))}
    for _ in range(3):
        step(tt, torch, r, n, override=new)
        assert torch.equal(new["layer0.weight"], torch.full((4, 4), float(sum(range(n)))))
        new["layer0.weight"].fill_(float(r))
    s = counters(tt)
    step(tt, torch, r, n, override=new)
    assert counters(tt)["cached_rounds"] == s["cached_rounds"] + 1


def check_small_cache(tt, torch, r, n):
    from tide.torch import _controller
    _controller.set_cache_capacity(4)
    for _ in range(3):
        step(tt, torch, r, n)  # 12 names through 4 entries: evictions, right sums
        assert counters(tt)["cache_entries"] == 4
    few = NAMES[:3]
    step(tt, torch, r, n, names=few)
    s = counters(tt)
    for _ in range(3):
        step(tt, torch, r, n, names=few)
    assert counters(tt)["cached_rounds"] == s["cached_rounds"] + 3
    # unnamed calls are never cached
    for _ in range(3):
        assert tt.allreduce(torch.ones(2), op=tt.Sum).tolist() == [n, n]
    assert all(".noname." not in name for name in _controller.global_process_set._state.cache.entries)


def check_off(tt, torch, r, n):
    from tide.torch import _controller
    _controller.set_cache_capacity(0)
    s = counters(tt)
    for _ in range(3):
        step(tt, torch, r, n)
    s2 = counters(tt)
    assert s2["cached_rounds"] == s["cached_rounds"] and s2["cache_entries"] == 0, s2
    assert s2["cache_hits"] == s["cache_hits"] and s2["cache_misses"] - s["cache_misses"] == 3 * len(NAMES), s2
    # sizes differ across ranks: every rank refuses, naming the variable
    _controller.set_cache_capacity(8 if r == 0 else 0)
    expect_mismatch(tt, lambda: step(tt, torch, r, n), "TIDE_TORCH_CACHE_CAPACITY", "rank 0 has 8", "rank 1 has 0")
    _controller.set_cache_capacity(_controller.DEFAULT_CACHE_CAPACITY)
    step(tt, torch, r, n)
    step(tt, torch, r, n)
    assert counters(tt)["cached_rounds"] > s2["cached_rounds"]


def check_process_set(tt, torch, r, n):
    evens = tt.add_process_set([p for p in range(n) if p % 2 == 0])
    if r % 2 == 0:
        for _ in range(4):
            step(tt, torch, r, n, ps=evens)
        s = counters(tt, evens)
        assert s["rounds"] == 4 and s["cached_rounds"] == 3, s
    assert tt.remove_process_set(evens)


def worker(case):
    import torch
    import tide.torch as tt
    tt.init()
    r, n = tt.rank(), tt.size()
    check_hits(tt, torch, r, n)
    check_mismatches_after_caching(tt, torch, r, n)
    check_small_cache(tt, torch, r, n)
    check_off(tt, torch, r, n)
    check_process_set(tt, torch, r, n)
    step(tt, torch, r, n)
    tt.shutdown()
    print("rank %d passed" % r, flush=True)


def main():
    harness.skip_without_torch()
    env = dict(os.environ, TIDE_TORCH_CACHE_CAPACITY="many")
    p = subprocess.run([sys.executable, "-c", "import tide.torch"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if p.returncode == 0 or "TIDE_TORCH_CACHE_CAPACITY" not in p.stdout or "'many'" not in p.stdout:
        print("FAIL: TIDE_TORCH_CACHE_CAPACITY=many was not refused naming the variable:\n%s" % p.stdout)
        return 1
    return harness.ranks_pass(__file__, 3, "test_cache")


if __name__ == "__main__":
    harness.dispatch(main, worker)
