#!/usr/bin/env bash
# K-FAC against momentum-SGD on the Fashion-MNIST CNN, 4 workers at the same
# batch (64 per worker), learning rate and cosine schedule: test accuracy
# every --eval-every steps, the epochs and wall time to --target (90%), and
# the step time K-FAC adds with its inverse work distributed (KAISA, the
# default) and replicated (--kfac distribute=0). The replicated run does the
# same arithmetic (test_kfac checks the bits), so it only times steps: it
# runs --replicated-epochs. Prints a markdown table; docs/performance.md and
# docs/adaptation.md have results. Shared machines disturb the times: the
# three runs go one after another and the step-time figures are medians.
set -uo pipefail
usage() {
  echo "usage: scripts/bench-kfac.sh --build DIR [--runs DIR] [--epochs N] [--lr X] [--kfac OPTS]"
  echo "       [--replicated-epochs N] [--eval-every N] [--target X] [--seed N] [--np N]"
}
build="" runs=runs/bench-kfac epochs=5 lr=0.05 kfac="" rep_epochs=1 eval_every=47 target=0.90 seed=1 np=4
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;; --runs) runs=$2; shift 2 ;; --epochs) epochs=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;; --kfac) kfac=$2; shift 2 ;; --replicated-epochs) rep_epochs=$2; shift 2 ;;
    --eval-every) eval_every=$2; shift 2 ;; --target) target=$2; shift 2 ;; --seed) seed=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench-kfac: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ -x "$build/tools/tide-train" ] || { echo "bench-kfac: --build DIR must hold tools/tide-train" >&2; exit 2; }
mkdir -p "$runs"
train() { # NAME EPOCHS ARGS...
  local name=$1 e=$2
  shift 2
  OMP_NUM_THREADS=1 "$build/tools/tiderun" -np "$np" "$build/tools/tide-train" --model cnn --epochs "$e" --batch 64 \
    --lr "$lr" --schedule cosine --seed "$seed" --threads 1 --eval-every "$eval_every" --target-accuracy "$target" \
    --name "$name" --runs "$runs" "$@" >"$runs/$name.log" 2>&1 ||
    { tail -20 "$runs/$name.log" >&2; echo "bench-kfac: $name failed (its log: $runs/$name.log)" >&2; }
}
kfac_opts=() rep_opts=(--kfac distribute=0)
[ -n "$kfac" ] && kfac_opts=(--kfac "$kfac") rep_opts=(--kfac "$kfac,distribute=0")
train sgd "$epochs" --optim momentum
train kfac "$epochs" --optim kfac "${kfac_opts[@]}"
train kfac-replicated "$rep_epochs" --optim kfac "${rep_opts[@]}"
/usr/bin/python3 - "$runs" <<'PY'
import json, os, statistics as st, sys
runs = sys.argv[1]
def load(name):
    s = json.load(open(os.path.join(runs, name, "summary.json")))
    steps = [json.loads(l) for l in open(os.path.join(runs, name, "metrics.jsonl")) if '"type":"step"' in l]
    return s, steps
# Figures per run from rank 0's steps (medians: evaluations and the eigendecomposition steps are
# outliers). compute_s is the same forward/backward in every run: it shows the machine's load.
print("| run | epochs to target | steps to it | wall s to it | final accuracy | median step s | median compute s "
      "| median K-FAC stage s | K-FAC share of the step | K-FAC s on inverse steps |")
print("|---|---|---|---|---|---|---|---|---|---|")
got = {}
for name in ("sgd", "kfac", "kfac-replicated"):
    try:
        s, steps = load(name)
    except OSError:
        print("| %s | failed (see %s.log) |||||||||" % (name, name)); continue
    got[name] = (s, steps)
    med = lambda k: st.median((x.get(k) or 0) for x in steps)
    share = st.median((x.get("kfac_s") or 0) / x["step_s"] for x in steps)
    inverse = [x.get("kfac_s") or 0 for x in steps if x.get("kfac_s") and x["step"] % 100 == 0]
    reach = "%.2f" % s["epoch_to_target"] if s["epoch_to_target"] is not None else "not reached"
    nsteps = str(s["step_to_target"]) if s["step_to_target"] is not None else "-"
    wall = "%.1f" % s["time_to_target_s"] if s["time_to_target_s"] is not None else "-"
    if name == "kfac-replicated": reach, nsteps, wall = "(timing run, %g epoch%s)" % (s["epochs"], "s"[:s["epochs"] != 1]), "-", "-"
    print("| %s | %s | %s | %s | %.2f%% | %.4f | %.4f | %.4f | %s | %s |" % (name, reach, nsteps, wall,
          100 * s["final_test_accuracy"], med("step_s"), med("compute_s"), med("kfac_s"),
          "%.0f%%" % (100 * share) if name != "sgd" else "-",
          "median %.1f, max %.1f" % (st.median(inverse), max(inverse)) if inverse else "-"))
if "sgd" in got and "kfac" in got:
    sgd, kf = got["sgd"][0], got["kfac"][0]
    if sgd["epoch_to_target"] and kf["epoch_to_target"]:
        print("\nK-FAC / SGD to target: epochs %.2fx, steps %.2fx, wall time %.2fx (as measured, each under the "
              "load of its own minutes)" % (kf["epoch_to_target"] / sgd["epoch_to_target"],
              kf["step_to_target"] / sgd["step_to_target"], kf["time_to_target_s"] / sgd["time_to_target_s"]))
        # At the K-FAC run's load: an SGD step costs what the K-FAC run's steps cost without the stage.
        steps = got["kfac"][1]
        kfac_wall = sum(x["step_s"] for x in steps if x["step"] < kf["step_to_target"])
        plain = sum(x["step_s"] - (x.get("kfac_s") or 0) for x in steps if x["step"] < kf["step_to_target"])
        per_step = plain / kf["step_to_target"]
        print("At the K-FAC run's load (its step time minus its K-FAC stage standing in for an SGD step): "
              "K-FAC %.0f s of steps to target, SGD %d steps x %.3f s = %.0f s: %.2fx" % (kfac_wall,
              sgd["step_to_target"], per_step, sgd["step_to_target"] * per_step,
              kfac_wall / (sgd["step_to_target"] * per_step)))
PY
