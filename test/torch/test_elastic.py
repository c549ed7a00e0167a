"""tide.torch.elastic (Horovod Elastic's run/TorchState) under tiderun --elastic:
- kill: 3 ranks, a commit every 2 steps; rank 2 SIGKILLs itself in the
  middle of step 5 (after its backward started the gradient exchange). The
  survivors restore their last commit (step 4: step 4's update is undone and
  redone; or step 6 when a survivor's allreduce of step 5 completed with
  rank 2's contribution before it died, that survivor committed step 6 and,
  being rank 0, hands it to the other), go on at 2 and finish with identical parameters, equal to a
  single-process run over the same global batches (no step lost or applied
  twice), the optimizer's momentum included.
- grow: 2 ranks; rank 0 asks for 3 (`tide ctl resize 3`) at step 4; tiderun
  starts a joiner, the members raise HostsUpdatedInterrupt at the same
  commit, the joiner is admitted and receives the state (step, model,
  momentum), and all 3 finish with the reference's parameters.
- replace: the kill with tiderun's default --max-restarts: its replacement
  joins at the first commit after the recovery (rank 0 waits for it to ask)
  and all 3 finish with the reference's parameters.
- shrink: 3 ranks; rank 0 asks for 2 (tide.torch.elastic.request) at step
  4; rank 2 is released at that commit and exits 0, the others go on at 2
  (no sync: nobody new) and finish with the reference's parameters.
All keep an ElasticSampler in the state (one sample per rank per step
recorded): at the end every rank's count is that of the steps at the sizes
the members had, and the members' shares are the rest of the epoch's order.
And plain (one process, not elastic): commit/restore, run() re-raising a
peer's death, bad arguments refused by name.
Each rank's slice of a step's global batch is rows rank::size of it, so the
averaged gradient is the global batch's whatever the size."""
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

STEPS, GLOBAL_BATCH, KILL_AT, GROW_AT, SAMPLES = 12, 12, 5, 4, 50


def problem(torch):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(STEPS * GLOBAL_BATCH, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(STEPS * GLOBAL_BATCH, 1, generator=g)
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return x, y, model, opt


def batch(x, y, step, rank, size):
    rows = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
    return x[rows][rank::size], y[rows][rank::size]


def reference():
    import torch
    x, y, model, opt = problem(torch)
    for step in range(STEPS):
        opt.zero_grad()
        xb, yb = batch(x, y, step, 0, 1)
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def plain():
    """One process, no tiderun --elastic: commit() only saves, restore()
    returns to it, run() re-raises a peer's death, bad arguments are named."""
    import torch
    import tide.torch as hvd
    hvd.init()
    model = torch.nn.Linear(2, 1)
    state = hvd.elastic.TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), step=0)
    ok = not hvd.elastic.is_elastic() and hvd.elastic.epoch() == -1
    with torch.no_grad():
        model.weight.fill_(1.0)
    state.step = 3
    state.commit()
    with torch.no_grad():
        model.weight.fill_(2.0)
    state.step = 4
    state.restore()
    ok = ok and state.step == 3 and bool((model.weight == 1.0).all())
    for bad, word in ((lambda: hvd.elastic.request(2), "not elastic"), (lambda: hvd.elastic.request(-1), "size"),
                      (lambda: hvd.elastic.run(lambda s: 0)(object()), "first argument"),
                      (lambda: state.register_reset_callbacks([1]), "callables")):
        try:
            bad()
            ok = False
            print("FAIL: no error for the call that should say '%s'" % word)
        except hvd.InvalidArgumentError as e:
            ok = ok and word in str(e)
            print("refused: %s" % e)

    @hvd.elastic.run
    def dies(state):
        raise hvd.PeerError(-1, "TIDE_EPEER", "planted")
    try:
        dies(state)
        ok = False
    except hvd.PeerError:
        pass
    hvd.shutdown()
    print("plain: %s" % ("passed" if ok else "FAILED"))
    return 0 if ok else 1


def wait_for_joiner(hvd):
    for _ in range(1200):  # the joiner's python and torch start: until it waits to be admitted
        if hvd.elastic.pending()[1] > 0:
            return
        time.sleep(0.1)


def worker(mode):
    import torch
    import tide.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    joined = os.environ.get("TIDE_ELASTIC_JOIN") == "1"
    first_rank = int(os.environ["TIDE_RANK"])
    x, y, model, opt = problem(torch)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(list(range(SAMPLES)), seed=5)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, step=0)
    sizes = []
    state.register_reset_callbacks([lambda: sizes.append(hvd.size())])
    asked, entries, entered = [], [], []

    @hvd.elastic.run
    def train(state):
        if joined and not asked:
            asked.append(1)
            print("joiner admitted at step %d (size %d)" % (state.step, hvd.size()), flush=True)
        print("rank %d of %d enters at step %d" % (hvd.rank(), hvd.size(), state.step), flush=True)
        entered.append((state.step, hvd.size()))
        if mode == "replace" and hvd.rank() == 0 and hvd.size() == 2:
            wait_for_joiner(hvd)  # tiderun's replacement for the killed rank; admitted at the next commit
        # the sampler deals what is left of the epoch over the members of now
        entries.append(sampler.num_replicas == hvd.size() and sampler.rank == hvd.rank() and
                       len(sampler) == -(-(SAMPLES - sampler.processed_num) // hvd.size()))
        while state.step < STEPS:
            opt.zero_grad()
            xb, yb = batch(x, y, state.step, hvd.rank(), hvd.size())
            torch.nn.functional.mse_loss(state.model(xb), yb).backward()
            if mode in ("kill", "replace") and first_rank == 2 and not joined and state.step == KILL_AT:
                os.kill(os.getpid(), signal.SIGKILL)
            opt.step()
            sampler.record_batch(state.step, 1)
            state.step += 1
            if mode == "shrink" and hvd.rank() == 0 and state.step == GROW_AT and not asked:
                asked.append(1)
                hvd.elastic.request(2)
            if mode == "grow" and hvd.rank() == 0 and state.step == GROW_AT and not asked:
                asked.append(1)
                subprocess.run([os.path.join(os.environ["TIDE_TOOLS_DIR"], "tide"), "ctl", "--rdzv",
                                os.environ["TIDE_RDZV"], "resize", "3"], check=True)
                wait_for_joiner(hvd)
            if state.step % 2 == 0:
                state.commit()

    train(state)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = hvd.allgather(flat.reshape(1, -1))
    same = all(torch.equal(every[0], every[r]) for r in range(hvd.size()))
    ref = reference()
    err = (flat - ref).abs().max().item()
    # The sampler: every member counts the samples of the committed steps at
    # their sizes, and the members' shares are the rest of the epoch's order.
    # Each step counts at the size of the members' last entry before it (rank
    # 0's entries: a joiner has seen only the last).
    entries0 = hvd.allgather_object(entered)[0]
    processed = sum([n for e, n in entries0 if e <= s][-1] for s in range(STEPS))
    sampler.reset()
    shares = hvd.allgather_object(list(iter(sampler)))
    order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(5)).tolist()
    dealt = (sampler.processed_num == processed and all(entries) and
             all(len(x) == len(sampler) for x in shares) and
             sorted(set(i for x in shares for i in x)) == sorted(order[processed:]))
    ok = same and err < 1e-4 and state.step == STEPS and dealt
    print("rank %d of %d: step %d, resets %s, replicas identical %s, max |param - reference| %.2e, sampler "
          "processed %d (%s): %s" % (hvd.rank(), hvd.size(), state.step, sizes, same, err, sampler.processed_num,
                                     "dealt right" if dealt else "dealt WRONG", "passed" if ok else "FAILED"),
          flush=True)
    hvd.shutdown()
    sys.exit(0 if ok else 1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(mode, np, max_np, extra):
    cmd = [harness.tiderun(), "--rdzv", "127.0.0.1:%d" % free_port(), "--elastic", "--min-np", "2", "--max-np",
           str(max_np), "-np", str(np)] + extra + ["-l", "--timeout", "240", sys.executable,
                                                   os.path.abspath(__file__), "--worker", mode]
    env = dict(os.environ, TIDE_JOB_TOKEN=os.urandom(8).hex(), TIDE_LOG_LEVEL="warn")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    print(p.stdout, end="")
    return p.returncode, p.stdout


def main():
    harness.skip_without_torch()
    failed = plain()
    rc, out = run("kill", 3, 3, ["--max-restarts", "0"])
    ok = (rc == 0 and harness.expect_lines(out, "of 2: step %d, resets [2]" % STEPS, 2) and
          harness.expect_lines(out, "passed", 2) and harness.expect_lines(out, "restoring the last commit", 2) and
          (len(harness.lines(out, "of 2 enters at step %d" % (KILL_AT - 1))) == 2 or
           harness.expect_lines(out, "of 2 enters at step %d" % (KILL_AT + 1), 2)))
    if not ok:
        failed += 1
    print("kill: %s (tiderun exited %d)" % ("passed" if ok else "FAILED", rc))
    rc, out = run("grow", 2, 3, [])
    ok = (rc == 0 and harness.expect_lines(out, "of 3: step %d" % STEPS, 3) and
          harness.expect_lines(out, "passed", 3) and harness.expect_lines(out, "resets [3]", 2) and
          harness.expect_lines(out, "joiner admitted at step %d (size 3)" % GROW_AT, 1))
    if not ok:
        failed += 1
    print("grow: %s (tiderun exited %d)" % ("passed" if ok else "FAILED", rc))
    rc, out = run("replace", 3, 3, [])
    ok = (rc == 0 and harness.expect_lines(out, "of 3: step %d" % STEPS, 3) and
          harness.expect_lines(out, "passed", 3) and harness.expect_lines(out, "restoring the last commit", 2) and
          harness.expect_lines(out, "joiner admitted at step", 1) and harness.expect_lines(out, "resets [2, 3]", 2))
    if not ok:
        failed += 1
    print("replace: %s (tiderun exited %d)" % ("passed" if ok else "FAILED", rc))
    rc, out = run("shrink", 3, 3, [])
    ok = (rc == 0 and harness.expect_lines(out, "of 2: step %d, resets [2]" % STEPS, 2) and
          harness.expect_lines(out, "passed", 2) and harness.expect_lines(out, "released by a shrink", 1) and
          harness.expect_lines(out, "of 2 enters at step %d" % GROW_AT, 2))
    if not ok:
        failed += 1
    print("shrink: %s (tiderun exited %d)" % ("passed" if ok else "FAILED", rc))
    print("torch_elastic: %s" % ("passed" if not failed else "FAILED"))
    return 1 if failed else 0


if __name__ == "__main__":
    harness.dispatch(main, worker)
