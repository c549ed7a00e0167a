#!/usr/bin/env bash
# K-FAC against momentum-SGD, 4 workers at the same batch (64 per worker),
# learning rate and cosine schedule, on the Fashion-MNIST CNN (target 90%)
# or the MLP (--model mlp, target 88%): per seed, one momentum-SGD run and
# one K-FAC run, one after the other, each stopped at the evaluation (every
# --eval-every steps) that reaches --target. Prints each run's epochs, steps
# and wall time to the target and its median step, then the medians over
# the seeds and K-FAC's ratios to momentum-SGD (issue 29's bars: wall time
# <= 0.85x, epochs <= 0.75x, step <= 1.5x on the CNN; wall time <= 1x on
# the MLP). Runs on a quiet machine only: the wall times are the result.
# docs/adaptation.md has the figures.
#
#   scripts/bench-kfac.sh --build build                      # CNN, seeds 1 2 3
#   scripts/bench-kfac.sh --build build --model mlp --sgd-epochs 5 --kfac-epochs 2
set -uo pipefail
usage() {
  echo "usage: scripts/bench-kfac.sh --build DIR [--model cnn|mlp] [--seeds \"1 2 3\"] [--runs DIR]"
  echo "       [--sgd-epochs N] [--kfac-epochs N] [--lr X] [--kfac OPTS] [--eval-every N] [--target X] [--np N]"
  echo "  --sgd-epochs, --kfac-epochs: each method's cosine horizon (default 5 both)"
}
build="" model=cnn seeds="1 2 3" runs=runs/bench-kfac sgd_epochs=5 kfac_epochs=5 lr=0.05 kfac="" eval_every=47
target="" np=4
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;; --model) model=$2; shift 2 ;; --seeds) seeds=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;; --sgd-epochs) sgd_epochs=$2; shift 2 ;; --kfac-epochs) kfac_epochs=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;; --kfac) kfac=$2; shift 2 ;; --eval-every) eval_every=$2; shift 2 ;;
    --target) target=$2; shift 2 ;; --np) np=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench-kfac: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ -x "$build/tools/tide-train" ] || { echo "bench-kfac: --build DIR must hold tools/tide-train" >&2; exit 2; }
case $model in
  cnn) target=${target:-0.90} ;;
  mlp) target=${target:-0.88} ;;
  *) echo "bench-kfac: --model must be cnn or mlp, got $model" >&2; exit 2 ;;
esac
mkdir -p "$runs"
train() { # NAME SEED EPOCHS ARGS...
  local name=$1 seed=$2 e=$3
  shift 3
  rm -rf "${runs:?}/$name"
  OMP_NUM_THREADS=1 "$build/tools/tiderun" -np "$np" "$build/tools/tide-train" --model "$model" --epochs "$e" \
    --batch 64 --lr "$lr" --schedule cosine --seed "$seed" --threads 1 --eval-every "$eval_every" \
    --target-accuracy "$target" --stop-at-target --name "$name" --runs "$runs" "$@" >"$runs/$name.log" 2>&1 ||
    { tail -20 "$runs/$name.log" >&2; echo "bench-kfac: $name failed (its log: $runs/$name.log)" >&2; }
}
kfac_opts=()
[ -n "$kfac" ] && kfac_opts=(--kfac "$kfac")
names=""
for seed in $seeds; do
  train "$model-sgd-s$seed" "$seed" "$sgd_epochs" --optim momentum
  train "$model-kfac-s$seed" "$seed" "$kfac_epochs" --optim kfac "${kfac_opts[@]}"
  names="$names $seed"
done
/usr/bin/python3 - "$runs" "$model" "$target" $names <<'PY'
import json, os, statistics as st, sys
runs, model, target, seeds = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
def load(name):
    try:
        s = json.load(open(os.path.join(runs, name, "summary.json")))
        steps = [json.loads(l) for l in open(os.path.join(runs, name, "metrics.jsonl")) if '"type":"step"' in l]
    except OSError:
        return None
    return s, steps
print("| %s, target %.0f%% | seed | epochs to target | steps | wall s to target | median step s | median K-FAC stage s |"
      % (model, 100 * target))
print("|---|---|---|---|---|---|---|")
got = {"sgd": [], "kfac": []}
for seed in seeds:
    for method in ("sgd", "kfac"):
        name = "%s-%s-s%s" % (model, method, seed)
        r = load(name)
        if r is None or r[0]["time_to_target_s"] is None:
            print("| %s | %s | %s |||||" % (method, seed, "failed (%s.log)" % name if r is None else "not reached"))
            continue
        s, steps = r
        step = st.median(x["step_s"] for x in steps)
        kf = st.median((x.get("kfac_s") or 0) for x in steps)
        got[method].append((s["epoch_to_target"], s["time_to_target_s"], step))
        print("| %s | %s | %.2f | %d | %.1f | %.4f | %s |" % (method, seed, s["epoch_to_target"], s["step_to_target"],
              s["time_to_target_s"], step, "%.4f" % kf if method == "kfac" else "-"))
if got["sgd"] and got["kfac"]:
    med = {m: [st.median(r[i] for r in got[m]) for i in range(3)] for m in got}
    print("\nmedians over %d+%d seeds: momentum-SGD %.2f epochs, %.1f s, step %.4f s; K-FAC %.2f epochs, %.1f s, "
          "step %.4f s" % (len(got["sgd"]), len(got["kfac"]), *med["sgd"], *med["kfac"]))
    print("K-FAC / momentum-SGD: wall time to target %.2fx, epochs %.2fx, step %.2fx" %
          (med["kfac"][1] / med["sgd"][1], med["kfac"][0] / med["sgd"][0], med["kfac"][2] / med["sgd"][2]))
    if len(got["kfac"]) < len(seeds) or len(got["sgd"]) < len(seeds):
        print("(some runs did not reach the target: the medians are over those that did)")
PY
