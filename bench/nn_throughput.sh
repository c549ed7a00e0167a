#!/usr/bin/env bash
# Training throughput (images/s) of the src/nn engine against PyTorch on the
# same models, batches, thread count and work per step (forward, loss,
# backward, plain SGD step), measured side by side in one run: for each
# configuration tide runs, then torch, each for SECONDS_EACH (median of
# REPEATS timed slices after a warm-up). Prints the JSON lines of both and a
# table.
#
#   bench/nn_throughput.sh [BUILD_DIR]      (default: build; needs target nn_bench)
#   MODELS="mlp cnn" BATCHES="64 128" THREADS="2" SECONDS_EACH=5 REPEATS=5 ROUNDS=1
#   TORCH_OMP_WAIT_POLICY=PASSIVE (see below)
#
# ROUNDS > 1 repeats the whole sweep (tide and torch alternate every time) and
# the table takes the median over rounds: on a shared machine the neighbours
# move both figures. The table also gives images per CPU-second (all threads
# of the process), which a busy machine moves much less.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${1:-$here/../build}"
bench="$build/bench/nn_bench"
if [[ ! -x "$bench" ]]; then
  echo "nn_throughput.sh: $bench not found: cmake --build $build --target nn_bench" >&2
  exit 1
fi
models="${MODELS:-mlp cnn}"
batches="${BATCHES:-64 128}"
threads_list="${THREADS:-2}"
seconds="${SECONDS_EACH:-5}"
repeats="${REPEATS:-5}"
rounds="${ROUNDS:-1}"
# PyTorch's OpenMP threads spin while they wait by default; with two of them
# beside OpenBLAS's on two cores (and more so on a shared machine) that made
# torch up to 10x slower at 2 threads than at 1. PASSIVE is its better
# setting here, so the baseline is not a straw man; TORCH_OMP_WAIT_POLICY=ACTIVE
# gives the default behaviour.
torch_wait="${TORCH_OMP_WAIT_POLICY:-PASSIVE}"
python=/usr/bin/python3
have_torch=1
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "nn_throughput.sh: skipped torch: $python cannot import torch (apt-get install python3-torch)" >&2
  have_torch=0
fi

echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg) (on $(nproc) cores)"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for ((round = 1; round <= rounds; round++)); do
  for t in $threads_list; do
    for model in $models; do
      for batch in $batches; do
        # One thread count for every pool either library might start.
        OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t \
          "$bench" --model "$model" --batch "$batch" --threads "$t" --seconds "$seconds" --repeats "$repeats" |
          tee -a "$out"
        if ((have_torch)); then
          OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t OMP_WAIT_POLICY="$torch_wait" \
            "$python" "$here/nn_torch_bench.py" --model "$model" --batch "$batch" --threads "$t" \
            --seconds "$seconds" --repeats "$repeats" | tee -a "$out"
        fi
      done
    done
  done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) (on $(nproc) cores)"

"$python" - "$out" <<'PY'
import json, sys

rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    libs = rows.setdefault((r["model"], r["batch"], r["threads"]), {})
    libs.setdefault(r["lib"], []).append((r["images_per_s"], r.get("images_per_cpu_s")))


def median(values):
    values = sorted(v for v in values if v)
    return values[len(values) // 2] if values else None


def fmt(v):
    return "%.0f" % v if v else "-"


def ratio(a, b):
    return "%.2fx" % (a / b) if a and b else "-"


print()
print("| model | batch | threads | tide images/s | torch images/s | tide / torch "
      "| tide images/cpu-s | torch images/cpu-s | tide / torch |")
print("|---|---|---|---|---|---|---|---|---|")
for (model, batch, threads), libs in sorted(rows.items()):
    # Across rounds: the median of the per-round medians.
    wall = {k: median([w for w, _ in v]) for k, v in libs.items()}
    cpu = {k: median([c for _, c in v]) for k, v in libs.items()}
    print("| %s | %d | %d | %s | %s | %s | %s | %s | %s |" % (
        model, batch, threads, fmt(wall.get("tide")), fmt(wall.get("torch")),
        ratio(wall.get("tide"), wall.get("torch")), fmt(cpu.get("tide")), fmt(cpu.get("torch")),
        ratio(cpu.get("tide"), cpu.get("torch"))))
PY
