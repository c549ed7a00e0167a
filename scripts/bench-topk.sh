#!/usr/bin/env bash
# Top-k selection benchmark: tide's selectors against std::nth_element and
# torch.topk (CPU) on the same data, in one run. For each d, topk_bench
# writes its data (the same generator and seed it then times) to a temporary
# file that the two baselines read; the runs for one d follow each other so
# that they see the same machine. Every JSON line goes to
# BUILD_DIR/bench-topk.jsonl; a markdown table is printed from it.
#
#   scripts/bench-topk.sh [BUILD_DIR]        (default: build)
#
# Environment (all optional):
#   DS="1M 4M 16M 25.5M 64M"     tensor sizes (K/M suffixes)
#   DENSITIES=0.001,0.01,0.1
#   DIST=normal                  normal, laplace or mixed (see bench/topk_bench.c)
#   KINDS=exact,mstopk,sampled   tide's selectors
#   REPEATS=9 WARMUP=2           tide and nth_element timed runs (median reported)
#   TORCH_REPEATS=3              torch.topk is slow: fewer runs
#   THREADS=2                    TIDE_NUM_THREADS and torch.set_num_threads
#   PYTHON=/usr/bin/python3      the interpreter with torch
#   OUT=BUILD_DIR/bench-topk.jsonl
# A baseline whose binary or module is missing is skipped with a note.
set -uo pipefail

build=${1:-build}
if [ ! -x "$build/bench/topk_bench" ]; then
  echo "bench-topk: no $build/bench/topk_bench (build first: cmake --build $build)" >&2
  exit 2
fi
build=$(cd "$build" && pwd)
here=$(cd "$(dirname "$0")/.." && pwd)
ds=${DS:-1M 4M 16M 25.5M 64M}
densities=${DENSITIES:-0.001,0.01,0.1}
dist=${DIST:-normal}
kinds=${KINDS:-exact,mstopk,sampled}
repeats=${REPEATS:-9}
warmup=${WARMUP:-2}
torch_repeats=${TORCH_REPEATS:-3}
threads=${THREADS:-2}
python=${PYTHON:-/usr/bin/python3}
out=${OUT:-$build/bench-topk.jsonl}

nth=$build/bench/nth_element_bench
[ -x "$nth" ] || { echo "bench-topk: no $nth (no C++ compiler?): std::nth_element skipped" >&2; nth=; }
torch_ok=1
"$python" -c "import torch, numpy" 2>/dev/null ||
  { echo "bench-topk: $python cannot import torch and numpy: torch.topk skipped" >&2; torch_ok=0; }

tmpdir=$(mktemp -d "${TMPDIR:-/tmp}/bench-topk.XXXXXX")
trap 'rm -rf "$tmpdir"' EXIT INT TERM
: >"$out"
export TIDE_NUM_THREADS=$threads

for d in $ds; do
  data=$tmpdir/x.f32
  echo "bench-topk: d=$d: writing the data" >&2
  "$build/bench/topk_bench" --d "$d" --dist "$dist" --write-data "$data" || exit 1
  echo "bench-topk: d=$d: tide ($kinds)" >&2
  "$build/bench/topk_bench" --d "$d" --dist "$dist" --density "$densities" --kinds "$kinds" \
    --repeats "$repeats" --warmup "$warmup" >>"$out" || exit 1
  if [ -n "$nth" ]; then
    echo "bench-topk: d=$d: std::nth_element" >&2
    "$nth" --file "$data" --density "$densities" --repeats "$repeats" --warmup 1 >>"$out" || exit 1
  fi
  if [ "$torch_ok" = 1 ]; then
    echo "bench-topk: d=$d: torch.topk" >&2
    "$python" "$here/bench/topk_torch.py" --file "$data" --density "$densities" \
      --threads "$threads" --repeats "$torch_repeats" --warmup 1 >>"$out" || exit 1
  fi
  rm -f "$data"
done

awk -v table=topk -f "$here/scripts/bench-tables.awk" "$out"
