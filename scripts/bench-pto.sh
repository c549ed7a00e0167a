#!/usr/bin/env bash
# PTO (the parallel tensor operation: sharded optimizer step + parameter
# all-gather) against the replicated optimizer step, side by side in one run
# (bench/pto_bench.c: the two modes alternate round by round): LAMB and Adam
# on a 25M-parameter flat synthetic model, 4 ranks. Prints per mode the
# exchange, optimizer and whole-step seconds (medians, slowest rank) and the
# optimizer state each rank keeps, then replicated/PTO ratios. The JSON
# lines go to BUILD_DIR/bench-pto.jsonl. docs/performance.md has results.
#
#   scripts/bench-pto.sh [BUILD_DIR (build)] [-- pto_bench options]
#
# Environment: NP=4; pto_bench options, e.g. -- --params 25e6 --tensors 1
# --optims lamb,adam --steps 10 --warmup 2 --rounds 3 (the defaults).
set -uo pipefail
build=${1:-build}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
if [ ! -x "$build/bench/pto_bench" ] || [ ! -x "$build/tools/tiderun" ]; then
  echo "bench-pto: no $build/bench/pto_bench or $build/tools/tiderun (build first: cmake --build $build)" >&2
  exit 2
fi
out="$build/bench-pto.jsonl"
"$build/tools/tiderun" -np "${NP:-4}" "$build/bench/pto_bench" "$@" >"$build/bench-pto.log" 2>&1 ||
  { tail "$build/bench-pto.log" >&2; exit 1; }
grep '^{' "$build/bench-pto.log" >"$out"
grep -v '^{' "$build/bench-pto.log"
echo "(JSON lines: $out)"
