#!/usr/bin/env bash
# Adaptive against fixed training on the emulated cluster (2 hosts x 2 ranks,
# scripts/emulate-cluster.sh): for each seed, tide-train with a fixed batch
# (64 per worker) and with --adapt (default gns,adascale), same model,
# optimizer, learning rate, schedule and epochs of progress; then a markdown
# table of time to 85% and 88% test accuracy and final accuracy, and the
# medians. docs/adaptation.md has results. Needs root; exits 77 when the
# hosts cannot be made.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage() {
  cat <<'USAGE'
usage: scripts/bench-adapt.sh --build DIR [--seeds "1 2 3"] [--adapt LIST] [--runs DIR]
                              [--bandwidth RATE] [--epochs N] [--table-only] [-- TIDE_TRAIN_ARGS...]
USAGE
}
build="" seeds="1 2 3" adapt="gns,adascale" runs=runs/adapt bandwidth=1gbit epochs=5 table_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --adapt) adapt=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --bandwidth) bandwidth=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --table-only) table_only=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "bench-adapt: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
extra=("$@")
[ -x "$build/tools/tide-train" ] || { echo "bench-adapt: --build DIR must hold tools/tide-train" >&2; exit 2; }
build=$(cd "$build" && pwd)
mkdir -p "$runs" && runs=$(cd "$runs" && pwd)

train() { # NAME SEED ARGS...
  local name=$1 seed=$2
  shift 2
  "$here/emulate-cluster.sh" --hosts 2 --ranks-per-host 2 --bandwidth "$bandwidth" --build "$build" -- \
    "$build/tools/tide-train" --model mlp --epochs "$epochs" --batch 64 --optim nesterov --lr 0.1 --seed "$seed" \
    --threads 1 --eval-every 20 --name "$name" --runs "$runs" "$@" "${extra[@]}" >"$runs/$name.log" 2>&1
  local rc=$?
  [ $rc = 77 ] && { grep emulate-cluster "$runs/$name.log" >&2; exit 77; }
  [ $rc = 0 ] || { tail -20 "$runs/$name.log" >&2; echo "bench-adapt: $name failed" >&2; exit 1; }
}
if [ $table_only = 0 ]; then
  for seed in $seeds; do
    train "fixed-s$seed" "$seed"
    train "adapt-s$seed" "$seed" --adapt "$adapt"
  done
fi
/usr/bin/python3 - "$runs" "$seeds" "$adapt" <<'PY'
import json, os, statistics, sys
runs, seeds, adapt = sys.argv[1], sys.argv[2].split(), sys.argv[3]
def stats(name):
    evals = [json.loads(l) for l in open(os.path.join(runs, name, "metrics.jsonl")) if '"type":"step"' not in l]
    steps = [json.loads(l) for l in open(os.path.join(runs, name, "metrics.jsonl")) if '"type":"step"' in l]
    s = json.load(open(os.path.join(runs, name, "summary.json")))
    first = lambda t: next((e["time_s"] for e in evals if e["test_accuracy"] >= t), None)
    return first(0.85), first(0.88), s["final_test_accuracy"], s["wall_s"], s["steps"], steps[-1]["global_batch"]
fmt = lambda v: "not reached" if v is None else "%.2f s" % v
print("| run | time to 85% | time to 88% | final accuracy | wall | steps | last global batch |")
print("|---|---|---|---|---|---|---|")
table = {"fixed": [], "adapt": []}
for seed in seeds:
    for kind in ("fixed", "adapt"):
        r = stats("%s-s%s" % (kind, seed))
        table[kind].append(r)
        print("| %s seed %s | %s | %s | %.2f%% | %.2f s | %d | %d |" % (kind if kind == "fixed" else "adapt " + adapt,
              seed, fmt(r[0]), fmt(r[1]), 100 * r[2], r[3], r[4], r[5]))
def med(kind, i):
    v = [r[i] if r[i] is not None else float("inf") for r in table[kind]]
    return statistics.median(v)
for kind in ("fixed", "adapt"):
    print("| median, %s | %s | %s | %.2f%% | %.2f s | | |" % (kind, fmt(med(kind, 0)), fmt(med(kind, 1)),
          100 * med(kind, 2), med(kind, 3)))
print()
print("time to 88%%: fixed / adaptive = %.2fx; time to 85%%: %.2fx; final accuracy adaptive - fixed = %+.2f points (medians)"
      % (med("fixed", 1) / med("adapt", 1), med("fixed", 0) / med("adapt", 0), 100 * (med("adapt", 2) - med("fixed", 2))))
PY
