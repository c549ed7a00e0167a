#!/usr/bin/env bash
# Adasum's convergence table (issue 13): Fashion-MNIST, the learning rate
# tuned for one worker x 64, then W workers x 64 with
#   avg     the gradients averaged (--grad dense), the same lr;
#   sum     the gradients averaged with lr x W (= summed with lr: linear scaling);
#   adasum  every worker steps its own optimizer, Adasum combines the changes
#           (--grad adasum), the same lr.
# Constant lr, momentum SGD, seed 1; test accuracy every quarter epoch; a
# run stops at the target or after --epochs. Prints a markdown table: the
# data epochs and wall time to the target, or "not reached" / "diverged".
# Epochs do not depend on the machine's speed; wall times do.
set -uo pipefail
usage() {
  echo "usage: scripts/bench-adasum-convergence.sh --build DIR [--runs DIR] [--model mlp|cnn] [--lr X]"
  echo "       [--target X] [--epochs N] [--workers \"4 8 16\"] [--modes \"avg sum adasum\"]"
}
build="" runs=runs/adasum-convergence model=mlp lr="" target="" epochs="" workers="4 8 16" modes="avg sum adasum"
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;; --runs) runs=$2; shift 2 ;; --model) model=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;; --target) target=$2; shift 2 ;; --epochs) epochs=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;; --modes) modes=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench-adasum-convergence: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ -x "$build/tools/tide-train" ] || { echo "bench-adasum-convergence: --build DIR must hold tools/tide-train" >&2; exit 2; }
case $model in
  mlp) : "${lr:=0.01}" "${target:=0.88}" "${epochs:=40}" ;;
  cnn) : "${lr:=0.02}" "${target:=0.90}" "${epochs:=20}" ;;
  *) echo "bench-adasum-convergence: --model must be mlp or cnn" >&2; exit 2 ;;
esac
mkdir -p "$runs"
field() { grep -o "\"$2\":[^,}]*" "$1" | head -1 | cut -d: -f2 | tr -d '"'; }
printf "| %s workers x 64 | mode | lr | data epochs to %s%% | wall to target (s) | best test accuracy |\n" \
  "$model" "$(awk -v t="$target" 'BEGIN { print 100 * t }')"
echo "|---|---|---|---|---|---|"
for w in $workers; do
  quarter=$(((60000 + 64 * w - 1) / (64 * w) / 4))
  [ "$quarter" -ge 1 ] || quarter=1
  for mode in $modes; do
    case $mode in
      avg) args=(--grad dense --lr "$lr") ;;
      sum) args=(--grad dense --lr "$(awk -v l="$lr" -v w="$w" 'BEGIN { print l * w }')") ;;
      adasum) args=(--grad adasum --lr "$lr") ;;
      *) echo "bench-adasum-convergence: unknown mode $mode" >&2; exit 2 ;;
    esac
    name=$model-w$w-$mode
    rm -rf "${runs:?}/$name"
    "$build/tools/tiderun" -np "$w" "$build/tools/tide-train" --model "$model" --batch 64 --optim momentum \
      --schedule constant --epochs "$epochs" --seed 1 --eval-every "$quarter" --target-accuracy "$target" \
      --stop-at-target --name "$name" --runs "$runs" "${args[@]}" >"$runs/$name.log" 2>&1
    rc=$?
    s=$runs/$name/summary.json m=$runs/$name/metrics.jsonl
    best=$(grep -o '"test_accuracy":[0-9.]*' "$m" 2>/dev/null | cut -d: -f2 | sort -g | tail -1)
    best=$(awk -v b="${best:-0}" 'BEGIN { printf "%.2f%%", 100 * b }')
    if grep -q "diverged" "$runs/$name.log"; then
      at=$(grep -o 'step [0-9]*: the loss' "$runs/$name.log" | head -1 | cut -d' ' -f2 | tr -d :)
      reached="diverged (step $at)" wall="-"
    elif [ $rc -ne 0 ] || [ ! -f "$s" ]; then
      tail -5 "$runs/$name.log" >&2
      reached="failed (exit $rc, $runs/$name.log)" wall="-"
    elif [ "$(field "$s" epoch_to_target)" = null ]; then
      reached="not reached in $epochs" wall="-"
    else
      reached=$(printf "%.2f" "$(field "$s" epoch_to_target)") wall=$(printf "%.1f" "$(field "$s" time_to_target_s)")
    fi
    printf "| %d | %s | %s | %s | %s | %s |\n" "$w" "$mode" "${args[3]}" "$reached" "$wall" "$best"
  done
done
