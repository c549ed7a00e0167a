#!/usr/bin/env bash
# tide-train --plan end to end (docs/burst-parallel.md): 4 ranks train the
# MLP under a mixed-width plan and under the all-width-4 (data-parallel)
# plan; the same global batches give the same loss up to float order. Bad
# plans are refused with a message naming the problem.
set -euo pipefail
build=$1
tools=$build/tools
[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || { echo "no Fashion-MNIST"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# flatten0, dense1 784->256, dense2 256->128, dense3 128->10
plan() { # FILE MODEL WORKERS WIDTH...
  local f=$1 model=$2 workers=$3 i=0; shift 3
  { printf '{\n"model": "%s",\n"workers": %d,\n"global_batch": 128,\n"layers": [\n' "$model" "$workers"
    for w in "$@"; do printf '{"index": %d, "name": "l%d", "width": %d}\n' $i $i "$w"; i=$((i + 1)); done
    printf ']\n}\n'; } > "$f"
}
plan "$work/mixed.json" mlp 4 1 4 2 1
plan "$work/dp.json" mlp 4 4 4 4 4
train() { # PLAN OUT [options]
  local p=$1 out=$2; shift 2
  "$tools/tiderun" -np 4 "$tools/tide-train" --model mlp --plan "$p" --batch 32 --subset 1280 --epochs 2 \
    --lr 0.05 "$@" >"$out" 2>&1
}
train "$work/mixed.json" "$work/mixed" || { cat "$work/mixed"; exit 1; }
train "$work/dp.json" "$work/dp" || { cat "$work/dp"; exit 1; }
cat "$work/mixed" "$work/dp"
loss() { sed -n 's/.*"loss":\([0-9.]*\).*/\1/p' "$1"; }
lm=$(loss "$work/mixed"); ld=$(loss "$work/dp")
grep -q '"steps":20,' "$work/mixed"
awk -v a="$lm" -v b="$ld" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-4 && a < 2.0) }' \
  || { echo "mixed plan loss $lm vs data-parallel plan loss $ld"; exit 1; }
refused() { # PLAN WANT [options]
  local p=$1 want=$2; shift 2
  if train "$p" "$work/bad" "$@"; then echo "plan $p was not refused"; cat "$work/bad"; exit 1; fi
  grep -q -- "$want" "$work/bad" || { echo "wanted \"$want\":"; cat "$work/bad"; exit 1; }
}
plan "$work/three.json" mlp 4 1 3 2 1
refused "$work/three.json" '"width" = 3 must be a power of two in \[1, 4 workers\]'
plan "$work/eight.json" mlp 8 1 8 2 1
refused "$work/eight.json" '"workers" = 8 but the job has 4 workers'
plan "$work/cnn.json" cnn 4 1 4 2 1
refused "$work/cnn.json" '"model" is "cnn" but the profile is of "mlp"'
plan "$work/short.json" mlp 4 1 4 2
refused "$work/short.json" '3 layers, but the profile of mlp has 4'
refused "$work/missing.json" 'cannot open'
refused "$work/mixed.json" '--plan runs without --adapt' --adapt gns
# the planner and the cluster simulation from the command line, on a CPU-time profile of the MLP
"$tools/tide" profile --model mlp --batches 8,32 --reps 1 --warmup 0 --clock cpu --out "$work/mlp.prof" >/dev/null
"$tools/tide" plan --profile "$work/mlp.prof" --workers 4 --cores 2 --global-batch 32 --simulate --no-plot \
  --out "$work/p.json" > "$work/sim"
grep -q '^{"workers":4,.*"gain":' "$work/sim" || { cat "$work/sim"; exit 1; }
grep -q '"cores": 2,' "$work/p.json"
if "$tools/tide" plan --profile "$work/mlp.prof" --workers 4 --global-batch 32 --background-batch 8 \
    > "$work/bad" 2>&1; then echo "--background-batch without --simulate was accepted"; exit 1; fi
grep -q -- "go with --simulate" "$work/bad"
echo "burst_train: ok"
