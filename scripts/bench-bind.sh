#!/usr/bin/env bash
# Placement bars (issue 17), each measured side by side in one run:
#
#   scripts/bench-bind.sh latency [BUILD_DIR]   LAUNCHES launches of a 2-rank
#       4 KiB f32-sum allreduce (tide bench: warm-up, then the median over
#       ~0.3 s of calls): tiderun --bind core, tiderun --bind none and Open
#       MPI's mpirun (its default binding), in turn within each launch round.
#       One line per launch: the three medians in µs and the ratios to Open MPI.
#   scripts/bench-bind.sh train [BUILD_DIR]     RUNS runs each of the 4-worker
#       MLP (tiderun -np 4 tide-train --model mlp --epochs 8 --batch 64 --lr 0.1)
#       and of `make demo`'s CNN job (--model cnn --epochs 5 --batch 64
#       --lr 0.05), --bind core and --bind none alternating; wall seconds and
#       final test accuracy per run, then the medians.
#
# Environment: LAUNCHES=10, RUNS=3, MODELS="mlp cnn".
set -euo pipefail
what=${1:-latency}
build=${2:-build}
launches=${LAUNCHES:-10}
runs=${RUNS:-3}
models=${MODELS:-mlp cnn}
tiderun=$build/tools/tiderun
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

p50_us() { sed -n 's/.*"p50_s":\([0-9.e+-]*\).*/\1/p' | awk '{ printf "%.2f", $1 * 1e6 }'; }

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

case $what in
  latency)
    bench=(bench --op allreduce --min-bytes 4K --max-bytes 4K)
    echo "| launch | tide --bind core (µs) | tide --bind none (µs) | Open MPI (µs) | core / Open MPI | none / Open MPI |"
    echo "|---:|---:|---:|---:|---:|---:|"
    for i in $(seq 1 "$launches"); do
      core=$(timeout -k 5 60 "$tiderun" --bind core -np 2 "$build/tools/tide" "${bench[@]}" | p50_us)
      none=$(timeout -k 5 60 "$tiderun" --bind none -np 2 "$build/tools/tide" "${bench[@]}" | p50_us)
      mpi=$(timeout -k 5 60 mpirun -np 2 "$build/bench/mpi_bench" --op allreduce --min-bytes 4K --max-bytes 4K \
            2>/dev/null | p50_us)
      awk -v i="$i" -v c="$core" -v n="$none" -v m="$mpi" \
        'BEGIN { printf "| %d | %.2f | %.2f | %.2f | %.2fx | %.2fx |\n", i, c, n, m, c / m, n / m }'
    done
    ;;
  train)
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    for model in $models; do
      if [ "$model" = mlp ]; then args=(--model mlp --epochs 8 --batch 64 --lr 0.1)
      else args=(--model cnn --epochs 5 --batch 64 --lr 0.05); fi
      echo "== tiderun -np 4 --bind MODE tide-train ${args[*]}"
      for i in $(seq 1 "$runs"); do
        for mode in core none; do
          start=$(date +%s.%N)
          "$tiderun" --bind "$mode" -np 4 "$build/tools/tide-train" "${args[@]}" --runs "$work" \
            --name "$model-$mode-$i" >/dev/null
          end=$(date +%s.%N)
          acc=$(sed -n 's/.*"final_test_accuracy":\([0-9.]*\).*/\1/p' "$work/$model-$mode-$i/summary.json")
          secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
          echo "$model $mode run $i: ${secs} s, test accuracy $acc"
          echo "$secs" >>"$work/$model-$mode.times"
        done
      done
      c=$(median <"$work/$model-core.times")
      n=$(median <"$work/$model-none.times")
      awk -v m="$model" -v c="$c" -v n="$n" \
        'BEGIN { printf "%s median: bound %.1f s, unbound %.1f s, bound/unbound %.3f\n", m, c, n, c / n }'
    done
    ;;
  *)
    echo "usage: scripts/bench-bind.sh latency|train [BUILD_DIR]" >&2
    exit 2
    ;;
esac
