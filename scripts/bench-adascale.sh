#!/usr/bin/env bash
# AdaScale without retuning: the MLP with the learning rate and schedule of
# 1 worker x 64, then 4 and 16 workers x 64 with --adapt adascale (base
# batch 64: the same lr and schedule, progress counted in 64-sample steps),
# and 16 workers with plain linear scaling (lr x 16, the schedule over the
# same epochs). Prints a markdown table: final test accuracy, steps, data
# epochs. docs/adaptation.md has results. Accuracy and step counts do not
# depend on the machine's speed, so this runs anywhere.
set -uo pipefail
usage() { echo "usage: scripts/bench-adascale.sh --build DIR [--runs DIR] [--epochs N] [--lr X] [--optim NAME] [--seed N]"; }
build="" runs=runs/adascale epochs=5 lr=0.05 optim=momentum seed=1
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;; --runs) runs=$2; shift 2 ;; --epochs) epochs=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;; --optim) optim=$2; shift 2 ;; --seed) seed=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench-adascale: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ -x "$build/tools/tide-train" ] || { echo "bench-adascale: --build DIR must hold tools/tide-train" >&2; exit 2; }
mkdir -p "$runs"
train() { # NAME NP ARGS...
  local name=$1 np=$2
  shift 2
  OMP_NUM_THREADS=1 "$build/tools/tiderun" -np "$np" "$build/tools/tide-train" --model mlp --epochs "$epochs" \
    --batch 64 --optim "$optim" --seed "$seed" --threads 1 --name "$name" --runs "$runs" "$@" >"$runs/$name.log" 2>&1 ||
    { tail -20 "$runs/$name.log" >&2; echo "bench-adascale: $name failed (its log: $runs/$name.log)" >&2; }
}
train w1 1 --lr "$lr"
train w4-adascale 4 --lr "$lr" --base-batch 64 --adapt adascale
train w16-adascale 16 --lr "$lr" --base-batch 64 --adapt adascale
train w4-linear 4 --lr "$(awk -v l="$lr" 'BEGIN { print 4 * l }')"
train w16-linear 16 --lr "$(awk -v l="$lr" 'BEGIN { print 16 * l }')"
/usr/bin/python3 - "$runs" <<'PY'
import json, os, re, sys
runs = sys.argv[1]
print("| run | workers x batch | lr | final test accuracy | steps | data epochs | vs 1 worker |")
print("|---|---|---|---|---|---|---|")
base = None
for name in ("w1", "w4-adascale", "w16-adascale", "w4-linear", "w16-linear"):
    p = os.path.join(runs, name, "summary.json")
    if not os.path.exists(p):
        log = open(os.path.join(runs, name + ".log")).read()
        m = re.search(r"step (\d+): the loss is [-a-z]*nan", log)
        why = "diverged: the loss is NaN at step %s" % m.group(1) if m else "failed (see %s.log)" % name
        print("| %s | | | %s | | | |" % (name, why)); continue
    s = json.load(open(p))
    acc = s["final_test_accuracy"]
    if base is None: base = acc
    print("| %s | %d x %d | %g%s | %.2f%% | %d | %.2f | %+.2f points |" % (name, s["workers"], s["batch_per_worker"],
          s["lr"], " (AdaScale gain)" if "adascale" in s["adapt"] else "", 100 * acc, s["steps"], s["data_epochs"],
          100 * (acc - base)))
PY
