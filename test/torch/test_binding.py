"""tide.torch's own bugs, one check each (issue 24, item 6), on 2 ranks:
  - a subclass of DistributedOptimizer's class constructs and steps
    (super(self.__class__, self) recursed in __init__ and step);
  - a second thread issuing a collective while another thread is inside one
    is refused with InvalidArgumentError naming both, and the job goes on;
    one other thread alone may issue them;
  - a nonblocking call still in flight at shutdown() completes before the
    communicator goes: its handle then returns the right sum (the handle
    used to skip its wait after shutdown, leaking the request, and a wait
    after shutdown ran on a freed communicator)."""
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def subclassing(tt, torch):
    m = torch.nn.Linear(4, 3)
    tt.broadcast_parameters(m.state_dict(), root_rank=0)
    opt = tt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters())
    steps = []

    class Counting(type(opt)):
        def step(self, closure=None):
            steps.append(1)
            return super().step(closure)

    opt.__class__ = Counting  # the optimizer a user's subclass would make
    before = m.weight.detach().clone()
    torch.manual_seed(1)
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
    assert steps == [1] and not torch.equal(before, m.weight), "the subclass's step did not step"
    again = Counting(opt.param_groups, m.named_parameters(), tt.Compression.none, tt.Average, 1, 1024, False)
    assert isinstance(again, torch.optim.SGD)
    try:
        tt.DistributedOptimizer(opt, named_parameters=m.named_parameters())
        raise AssertionError("wrapping a DistributedOptimizer again was not refused")
    except tt.InvalidArgumentError as e:
        assert "already a DistributedOptimizer" in str(e), str(e)
    print("rank %d: subclass ok" % tt.rank())


def two_threads(tt, torch, flag):
    """Rank 0's thread 'inside' waits in a barrier that rank 1 joins only
    after rank 0's main thread has tried its allreduce (a file says so)."""
    r = tt.rank()
    if r == 0:
        from tide.torch import _comm
        inside = threading.Thread(target=tt.barrier, name="inside", daemon=True)
        inside.start()
        for _ in range(3000):  # until the barrier holds the communicator (30 s at most)
            if getattr(_comm, "_busy_call", [None])[0] == "inside":
                break
            time.sleep(0.01)
        try:
            tt.allreduce(torch.ones(5), op=tt.Sum)
            refused = None
        except tt.InvalidArgumentError as e:
            refused = str(e)
        open(flag, "w").close()
        inside.join(60)
        assert refused is not None, "a second thread's allreduce ran while the first was in a barrier"
        assert "one thread at a time" in refused and "inside" in refused, refused
    else:
        for _ in range(6000):  # rank 0 tried (60 s at most: a failure there must not hang this)
            if os.path.exists(flag):
                break
            time.sleep(0.01)
        tt.barrier()
    # the job goes on, and one other thread alone may issue collectives
    out = []
    t = threading.Thread(target=lambda: out.append(tt.allreduce(torch.ones(5), op=tt.Sum)), name="alone")
    t.start()
    t.join()
    assert out and torch.equal(out[0], torch.full((5,), 2.0)), "the other thread's allreduce: %s" % out
    print("rank %d: threads ok" % r)


def in_flight_at_shutdown(tt, torch):
    """Rank 1 starts its allreduce a second late, so that rank 0 reaches
    shutdown() with its own still in flight (the check holds whatever the
    timing; the delay only makes the old failure show)."""
    r = tt.rank()
    t = torch.full((1 << 20,), float(r + 1))
    if r == 1:
        time.sleep(1)
    h = tt.allreduce_async(t, op=tt.Sum)
    dropped = tt.allreduce_async_(torch.full((1000,), 1.0), op=tt.Sum)
    del dropped  # waited for in __del__
    tt.shutdown()
    # shutdown ran the named requests still pending (the dropped one too) before leaving
    assert tt.poll(h), "the allreduce in flight was not run by shutdown()"
    out = tt.synchronize(h)
    assert torch.equal(out, torch.full((1 << 20,), 3.0)), "the allreduce in flight at shutdown gave %s" % out[:4]
    print("rank %d: in flight at shutdown ok" % r)


def worker(flag):
    import torch
    import tide.torch as tt
    torch.set_num_threads(1)
    tt.init()
    subclassing(tt, torch)
    two_threads(tt, torch, flag)
    in_flight_at_shutdown(tt, torch)  # last: it leaves the job


def main():
    harness.skip_without_torch()
    with tempfile.TemporaryDirectory() as tmp:
        _, out = harness.launch(os.path.abspath(__file__), 2, os.path.join(tmp, "tried"))
    if not all(harness.expect_lines(out, what, 2) for what in ("subclass ok", "threads ok",
                                                                 "in flight at shutdown ok")):
        return 1
    print("test_binding: passed")
    return 0


if __name__ == "__main__":
    harness.dispatch(main, worker)
