#!/usr/bin/env bash
# `make demo`: the main job. 4 workers on this host train the CNN on
# Fashion-MNIST with dense allreduce, then the report is drawn.
set -euo pipefail
build=${1:-build}
name=demo-cnn-np4
echo "== tiderun -np 4 tide-train --model cnn --epochs 5 --batch 64 --lr 0.05 --name $name"
"$build/tools/tiderun" -np 4 "$build/tools/tide-train" --model cnn --epochs 5 --batch 64 --lr 0.05 \
  --name "$name"
"$build/tools/tide" report "runs/$name"
accuracy=$(sed -n 's/.*"final_test_accuracy":\([0-9.]*\).*/\1/p' "runs/$name/summary.json")
echo
echo "final test accuracy: $(awk -v a="$accuracy" 'BEGIN { printf "%.2f%%", 100 * a }')"
echo "metrics, summary and plots: runs/$name/ (loss_time.png, accuracy.png, throughput.png, comm_share.png)"
