#!/usr/bin/env bash
# The burst-parallel planner's bars (docs/burst-parallel.md): its speed on
# one core, and VGG-16 on DeepPool's A100 profile at global batch 256 for
# W = 8..64 against plain data parallelism.
#   scripts/bench-plan.sh [BUILD_DIR] [DATA_DIR]
set -euo pipefail
build=${1:-build}
data=${2:-../shared/data/deeppool-a100}
tide=$build/tools/tide
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
vgg=$data/vggLayerGpuProfileA100.txt
resnet=$data/resnetLayerGpuProfileA100V2.txt

echo "== VGG-16 (DeepPool A100 profile), global batch 256, amplification 2.0"
printf "%4s %12s %12s %8s %14s %14s %10s\n" W plan_ms dp_ms speedup plan_worker_ms dp_worker_ms less
for w in 8 16 32 64; do
  "$tide" plan --profile "$vgg" --workers "$w" --global-batch 256 --amplification 2.0 \
    --out "$out/vgg$w.json" --no-plot --quiet > "$out/vgg$w.txt"
  awk -v w="$w" '/^iteration time/ {pt=$4; dt=$8} /^worker-time/ {pw=$3; dw=$7}
    END {printf "%4d %12.3f %12.3f %8.3f %14.1f %14.1f %9.1f%%\n", w, pt, dt, dt/pt, pw, dw, 100*(1-pw/dw)}' "$out/vgg$w.txt"
done

# A ResNet-like profile of 298 layers (a downsample branch every 6 layers),
# in tide's format: the size the issue names for ResNet-152 with its
# batch-norm and ReLU layers.
python3 - "$out/synthetic298.prof" <<'PY'
import sys
n, lines, times = 298, ["tide-profile 1", "model synthetic298"], []
i = 0
while i < n:
    if i % 6 == 1 and i + 4 < n:   # fork at i-1: chain i..i+2, downsample i+3, join i+4
        f = i - 1
        for k, inp in enumerate([f, i, i + 1, f]):
            lines.append(f"layer {i+k} conv{i+k} inputs={inp} params={4*256*256*9} act={4*256*14*14}")
        lines.append(f"layer {i+4} join{i+4} inputs={i+2},{i+3} params=0 act={4*256*14*14}")
        i += 5
    else:
        lines.append(f"layer {i} conv{i} inputs={i-1} params={4*256*256*9} act={4*256*14*14}")
        i += 1
for l in range(n):
    for b in [1, 2, 4, 8, 16, 32, 64, 128]:
        t = 1e-4 + 2e-5 * b * (1 + (l % 7) / 7)
        times.append(f"time {l} {b} {t/3:.9g} {2*t/3:.9g}")
open(sys.argv[1], "w").write("\n".join(lines + times) + "\n")
PY

echo "== planner speed on one core (taskset -c 0), W = 64, global batch 256; median of 5"
for spec in "vgg16:$vgg:" "resnet152:$resnet:RESNET152" "synthetic298:$out/synthetic298.prof:"; do
  IFS=: read -r name file section <<< "$spec"
  args=(--profile "$file" --workers 64 --global-batch 256 --out "$out/$name.json" --no-plot)
  [ -n "$section" ] && args+=(--section "$section")
  for r in 1 2 3 4 5; do
    s=$(date +%s.%N)
    taskset -c 0 "$tide" plan "${args[@]}" > "$out/$name.txt"
    e=$(date +%s.%N)
    echo "$(grep -o 'planned [0-9]* layers in [0-9.]* s' "$out/$name.txt" | awk '{print $2, $5}') $(echo "$e - $s" | bc)"
  done | sort -k2 -n | awk -v name="$name" 'NR==3 {printf "%-13s %4d layers: planner %.6f s, whole command %.3f s\n", name, $1, $2, $3}'
done
