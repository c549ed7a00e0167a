#!/usr/bin/env bash
# tide over MPI against MPI's own collectives, side by side under one mpirun
# setup: `tide bench` with TIDE_BACKEND=mpi (TIDE_ALGO=auto: MPI's own
# collective behind tide's checks; TIDE_ALGO=ring: tide's ring over the MPI
# transport) and bench/mpi_bench (the same sizes, iterations and JSON lines,
# calling MPI_Allreduce & co. directly). The three run in turn, REPEAT
# rounds, so a busy machine hurts them alike; the table takes each one's
# best median per size. Every line goes to OUT.
#
#   scripts/bench-mpi.sh [BUILD_DIR]            (default: build)
#
# Environment (all optional):
#   NP=2  OPS=allreduce (comma list: allreduce,reduce_scatter,allgather,broadcast)
#   MIN_BYTES=4K  MAX_BYTES=256M  REPEAT=3  ITERS= (fixed iterations per size)
#   MPIRUN="mpirun --oversubscribe"  MPIRUN_ARGS= (extra arguments, e.g. MCA settings)
#   OUT=BUILD_DIR/bench-mpi.jsonl  RUN_TIMEOUT=300 (seconds per run)
set -uo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
if [ ! -x "$build/tools/tide" ] || [ ! -x "$build/bench/mpi_bench" ]; then
  echo "bench-mpi: needs $build/tools/tide and $build/bench/mpi_bench (build with MPI found: make build)" >&2
  exit 2
fi
build=$(cd "$build" && pwd)
np=${NP:-2}
ops=${OPS:-allreduce}
repeat=${REPEAT:-3}
out=${OUT:-$build/bench-mpi.jsonl}
run_timeout=${RUN_TIMEOUT:-300}
read -r -a mpirun <<<"${MPIRUN:-mpirun --oversubscribe}"
read -r -a mpirun_args <<<"${MPIRUN_ARGS:-}"
common=(--op "$ops" --dtype f32 --reduce sum --min-bytes "${MIN_BYTES:-4K}" --max-bytes "${MAX_BYTES:-256M}" --check)
[ -n "${ITERS:-}" ] && common+=(--iters "$ITERS")
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

: >"$out"
failed=0
start=$(date +%s)
# run VARIANT ENV... -- CMD...: appends CMD's JSON lines, tagged with variant and round.
run() {
  local variant=$1 round=$2
  shift 2
  echo "bench-mpi: round $round: $variant: $*" >&2
  local tmp
  tmp=$(mktemp)
  if ! timeout -k 10 "$run_timeout" "$@" >"$tmp"; then
    echo "bench-mpi: $variant failed" >&2
    failed=1
  fi
  grep '^{' "$tmp" | sed "s/}\$/,\"variant\":\"$variant\",\"round\":$round}/" >>"$out"
  rm -f "$tmp"
}
for ((round = 1; round <= repeat; round++)); do
  for algo in auto ring; do
    run "tide-$algo" "$round" env TIDE_BACKEND=mpi TIDE_ALGO="$algo" \
      "${mpirun[@]}" -np "$np" "${mpirun_args[@]}" "$build/tools/tide" bench "${common[@]}"
  done
  run "mpi" "$round" "${mpirun[@]}" -np "$np" "${mpirun_args[@]}" "$build/bench/mpi_bench" "${common[@]}"
done
elapsed=$(($(date +%s) - start))

awk -v table=mpi -v np="$np" -v elapsed="$elapsed" -v repeat="$repeat" -v ops="$ops" -v host="$(uname -n)" \
  -v cpus="$(nproc)" -v kernel="$(uname -r)" -f "$here/scripts/bench-tables.awk" "$out"
status=$?
[ $failed -ne 0 ] && exit 1
exit $status
