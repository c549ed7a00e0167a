"""One learning-rate schedule (issue 24): tide-train and the Python binding
give the same rate at every step for every schedule.

For each of constant, step, cosine and poly (with a warm-up epoch) it runs
tide-train (one process, 640 Fashion-MNIST images, 4 epochs at batch 64: 40
steps) and reads the rate it applied at each step from metrics.jsonl; then
  - tide.lr_schedule / tide.lr_at, the calls the Python Trainer builds its
    schedule with, must give that rate at each step (no torch needed);
  - with torch, tide.torch.Trainer over the same dataset size, batch and
    epochs must report that rate (stats.lr) at each step.
Skipped (77) without the Fashion-MNIST files tide-train reads."""
import json
import math
import os
import subprocess
import sys
import tempfile

import tide

SCHEDULES = ("constant", "step", "cosine", "poly")
N, BATCH, EPOCHS, WARMUP, LR = 640, 64, 4, 1, 0.1


def tide_train_rates(tools, runs, schedule):
    cmd = [os.path.join(tools, "tide-train"), "--subset", str(N), "--batch", str(BATCH), "--epochs", str(EPOCHS),
           "--warmup-epochs", str(WARMUP), "--schedule", schedule, "--lr", str(LR), "--runs", runs,
           "--name", schedule]
    env = dict(os.environ, TIDE_COMPUTE_THREADS="1")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if p.returncode != 0:
        print(p.stdout)
        raise AssertionError("%s exited %d" % (" ".join(cmd), p.returncode))
    rates = {}
    with open(os.path.join(runs, schedule, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("type") == "step":
                rates[rec["step"]] = rec["lr"]
    return [rates[k] for k in sorted(rates)]


def close(a, b):
    return abs(a - b) <= 1e-5 * max(abs(a), abs(b)) + 1e-12  # tide-train prints %.6g


def trainer_rates(schedule, steps):
    """stats.lr at each step of a Python Trainer like tide-train's run."""
    import torch
    import tide.torch as tt
    tt.init()
    model = torch.nn.Linear(4, 2)
    tr = tt.Trainer(model, dataset_size=N, batch=BATCH, epochs=EPOCHS, lr=LR, schedule=schedule,
                    warmup_epochs=WARMUP)
    rates = []
    for b in tr:
        if b.count:
            model(torch.zeros(b.count, 4)).sum().backward()
        s = tr.step(0.0)
        if s.stepped:
            rates.append(s.lr)
        if len(rates) == steps:
            break
    tr.close()
    tt.shutdown()
    return rates


def main():
    if not os.path.exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"):
        print("skipped: tide-train's Fashion-MNIST files are not installed (scripts/install-deps.sh)")
        return 77
    tools = os.environ.get("TIDE_TOOLS_DIR", "build/tools")
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
        print("torch not installed: checking the Trainer's schedule calls, not a Trainer run")
    with tempfile.TemporaryDirectory() as runs:
        for schedule in SCHEDULES:
            want = tide_train_rates(tools, runs, schedule)
            assert len(want) == EPOCHS * N // BATCH, (schedule, len(want))
            s = tide.lr_schedule(schedule, LR, EPOCHS, N, BATCH, WARMUP)
            got = [tide.lr_at(s, k) for k in range(len(want))]
            bad = [(k, w, g) for k, (w, g) in enumerate(zip(want, got)) if not close(w, g)]
            assert not bad, "%s: tide-train vs tide.lr_at (step, tide-train, python): %s" % (schedule, bad[:5])
            assert len(set(want)) > 1 or schedule == "constant", (schedule, want)
            if have_torch:
                got = trainer_rates(schedule, len(want))
                bad = [(k, w, g) for k, (w, g) in enumerate(zip(want, got)) if not close(w, g)]
                assert len(got) == len(want) and not bad, \
                    "%s: tide-train vs Trainer (step, tide-train, Trainer): %s" % (schedule, bad[:5])
            print("%s: %d steps, the same rate at each (%.4g .. %.4g)" % (schedule, len(want), min(want), max(want)))
    # bad arguments are refused, and tide's log line (stderr) names them
    for args, words in (((("cosine", LR, 1, N, BATCH, 1)), "warmup_epochs (1) must be less than epochs"),
                        (("poly", LR, 0, N, BATCH), "epochs 0 must be"), (("step", LR, 2, N, 0), "base_batch (0)"),
                        (("sawtooth", LR, 2, N, BATCH), "sawtooth")):
        with tempfile.TemporaryFile(mode="w+") as err:
            saved = os.dup(2)
            os.dup2(err.fileno(), 2)
            try:
                tide.lr_schedule(*args)
            except tide.InvalidArgumentError:
                refused = True
            else:
                refused = False
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            err.seek(0)
            said = err.read()
        assert refused, "accepted %r" % (args,)
        assert words in said, (words, said)
    assert math.isnan(tide.lr_at(tide.lr_schedule("poly", LR, 2, N, BATCH), -1))
    print("schedule OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
