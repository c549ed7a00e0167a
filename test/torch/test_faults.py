"""tide's failures reach Python as exceptions carrying tide's message: a
mismatched collective raises MismatchError on every rank, a killed rank
raises PeerError (TIDE_EPEER) in the others, also from inside backward's
hooks; TIDE_ETIMEDOUT is TideTimeoutError (a TimeoutError)."""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def worker(case):
    import torch
    import tide.torch as tt
    tt.init()
    r, n = tt.rank(), tt.size()
    tt.barrier()
    t0 = time.monotonic()
    try:
        if case == "mismatch":
            tt.allreduce(torch.zeros(10 if r == 0 else 12))
        elif case == "killed":
            if r == n - 1:
                os.kill(os.getpid(), signal.SIGKILL)
            for _ in range(1000):
                tt.allreduce(torch.zeros(1000))
        elif case == "killed-backward":
            m = torch.nn.Linear(50, 50)
            opt = tt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1))
            if r == n - 1:
                os.kill(os.getpid(), signal.SIGKILL)
            for _ in range(1000):
                opt.zero_grad()
                m(torch.randn(4, 50)).sum().backward()
                opt.step()
    except tt.TideError as e:
        print("rank %d raised %s %s after %.2f s: %s" % (r, type(e).__name__, e.name, time.monotonic() - t0,
                                                         e.message), flush=True)
        sys.exit(0)
    print("rank %d raised nothing" % r, flush=True)
    sys.exit(1)


def expect(out, n, cls, name, words=""):
    got = harness.lines(out, "raised %s %s" % (cls, name))
    if len(got) != n or any(words not in l for l in got):
        print("FAIL: expected %d ranks to raise %s %s%s" % (n, cls, name, " naming " + words if words else ""))
        sys.exit(1)


def main():
    harness.skip_without_torch()
    script = os.path.abspath(__file__)
    _, out = harness.launch(script, 3, "mismatch")
    expect(out, 3, "MismatchError", "TIDE_EMISMATCH", "(12,)")
    _, out = harness.launch(script, 3, "killed", check=False)
    expect(out, 2, "PeerError", "TIDE_EPEER")
    _, out = harness.launch(script, 3, "killed-backward", check=False)
    expect(out, 2, "PeerError", "TIDE_EPEER")
    # a deadline passing is TIDE_ETIMEDOUT (not provoked here: TIDE_TIMEOUT_MS also bounds joining,
    # and starting torch on a loaded machine can take longer than a short deadline)
    from tide import _lib
    import errno
    e = _lib.error(-errno.ETIMEDOUT, "rank 1 waited 1000 ms for rank 0")
    assert isinstance(e, TimeoutError) and e.name == "TIDE_ETIMEDOUT" and "rank 1 waited" in str(e)
    print("test_faults: passed")
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker(sys.argv[sys.argv.index("--worker") + 1])
    else:
        sys.exit(main())
