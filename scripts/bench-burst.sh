#!/usr/bin/env bash
# Bars of issue 27 items 3 and 5 (docs/burst-parallel.md):
#  1. the cluster simulation on DeepPool's VGG-16 A100 profile, W = 8..64,
#     global batch 256, amplification 2.0, a background VGG job;
#  2. tide's CNN on 4 ranks of this machine: the planner's predicted step time
#     (this machine's profile, shared-memory constants, --cores = its CPUs)
#     against the measured `tide-train --plan` step, and the same for the
#     data-parallel plan (every layer on 4 ranks), run back to back.
# usage: scripts/bench-burst.sh BUILD_DIR [DEEPPOOL_DATA_DIR] [BANDWIDTH LATENCY]
set -euo pipefail
build=${1:?usage: bench-burst.sh BUILD_DIR [DEEPPOOL_DATA_DIR] [BANDWIDTH LATENCY]}
data=${2:-../shared/data/deeppool-a100}
bw=${3:-1.4e9}
lat=${4:-5e-6}
tools=$(cd "$build/tools" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -r "$data/vggLayerGpuProfileA100.txt" ]; then
  echo "== cluster simulation: VGG-16 (DeepPool A100), global batch 256, amplification 2.0, background VGG-16"
  for W in 8 16 32 64; do
    "$tools/tide" plan --profile "$data/vggLayerGpuProfileA100.txt" --workers $W --global-batch 256 \
      --amplification 2.0 --out "$work/vgg$W.json" --no-plot --quiet --simulate | grep '^{'
  done
  echo "== the same, the background also in communication spans (--comm-idle)"
  for W in 8 16 32 64; do
    "$tools/tide" plan --profile "$data/vggLayerGpuProfileA100.txt" --workers $W --global-batch 256 \
      --amplification 2.0 --out "$work/vgg$W.json" --no-plot --quiet --simulate --comm-idle | grep '^{'
  done
fi
echo "== tide's CNN on 4 ranks of this machine ($(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg))"
"$tools/tide" profile --model cnn --batches 16,32,64,128,256 --clock cpu --out "$work/cnn.prof" >/dev/null
"$tools/tide" plan --profile "$work/cnn.prof" --workers 4 --cores "$(nproc)" --global-batch 256 \
  --bandwidth "$bw" --latency "$lat" --out "$work/cnn4.json" --no-plot | grep -E "^ +[0-9]|iteration|worker"
sed 's/"width": [0-9]*/"width": 4/' "$work/cnn4.json" > "$work/dp4.json"
for p in cnn4 dp4; do
  pred=$("$tools/tide" plan --profile "$work/cnn.prof" --workers 4 --cores "$(nproc)" --global-batch 256 \
    --bandwidth "$bw" --latency "$lat" --check "$work/$p.json" | sed -n 's/iteration time: plan \([0-9.]*\) ms.*/\1/p')
  # worker-time with a core per worker: the CPU-seconds the plan needs, whatever else loads the machine
  work_pred=$("$tools/tide" plan --profile "$work/cnn.prof" --workers 4 --global-batch 256 \
    --bandwidth "$bw" --latency "$lat" --check "$work/$p.json" | sed -n 's/worker-time: *plan \([0-9.]*\) worker-ms.*/\1/p')
  line=$("$tools/tiderun" -np 4 "$tools/tide-train" --model cnn --plan "$work/$p.json" --batch 64 --subset 7680 \
    --epochs 1 | grep '^{')
  meas=$(echo "$line" | sed -n 's/.*"step_time_median_s":\([0-9.]*\).*/\1/p')
  cpu=$(echo "$line" | sed -n 's/.*"cpu_s_per_step":\([0-9.]*\).*/\1/p')
  awk -v p="$p" -v a="$pred" -v b="$meas" -v w="$work_pred" -v c="$cpu" 'BEGIN {
    printf "%s: step predicted %.1f ms, measured %.1f ms (median of 28), measured/predicted %.2f; ", p, a, b * 1e3, b * 1e3 / a
    printf "worker-time predicted %.1f worker-ms, measured %.1f CPU-ms per step over the ranks, measured/predicted %.2f\n", w, c * 1e3, c * 1e3 / w }'
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
