#!/usr/bin/env bash
# Benchmarks tide's allreduce against Open MPI and Gloo in one run on this
# machine, then reduce_scatter and allgather against Open MPI. Every line of
# every library goes to BUILD_DIR/bench-allreduce.jsonl; two markdown tables
# are printed from it.
#
#   scripts/bench-allreduce.sh [BUILD_DIR]        (default: build; `make bench`)
#
# Environment (all optional):
#   NP=2                 ranks
#   MIN_BYTES=4K MAX_BYTES=256M
#   ITERS=               fixed iterations per size (default: each tool's adaptive
#                        count, ~0.3 s per size, 5..1000)
#   MPIRUN_ARGS=         extra mpirun arguments (default MCA settings otherwise)
#   MPI_VARIANTS="default nommap"   Open MPI runs: as installed, and with glibc's
#                        mmap off (Open MPI mallocs its temporary buffers on
#                        every call; large ones are mmapped, so each call maps
#                        fresh pages and page faults dominate, in VMs above
#                        all); the table shows the better run
#   GLOO_ALGOS="ring ring_legacy"   Gloo allreduce variants; the table shows the
#                        better of them at each size
#   OUT=BUILD_DIR/bench-allreduce.jsonl
#   RUN_TIMEOUT=300      seconds before one library's run is stopped
# A baseline that was not built (no MPI or no libgloo-dev found) is skipped.
set -uo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
if [ ! -d "$build" ]; then
  echo "bench-allreduce: no build directory '$build' (build first: make build)" >&2
  exit 2
fi
build=$(cd "$build" && pwd)
np=${NP:-2}
min_bytes=${MIN_BYTES:-4K}
max_bytes=${MAX_BYTES:-256M}
out=${OUT:-$build/bench-allreduce.jsonl}
run_timeout=${RUN_TIMEOUT:-300}
gloo_algos=${GLOO_ALGOS:-ring ring_legacy}
mpi_variants=${MPI_VARIANTS:-default nommap}
common=(--dtype f32 --reduce sum --min-bytes "$min_bytes" --max-bytes "$max_bytes" --check)
[ -n "${ITERS:-}" ] && common+=(--iters "$ITERS")

: >"$out"
failed=()
start=$(date +%s)

# run LABEL VARIANT CMD...: appends the JSON lines CMD prints to $out, with
# "variant":VARIANT added when VARIANT is not empty; stderr passes through.
# CMD may be a shell function.
run() {
  local label=$1 variant=$2
  shift 2
  echo "bench-allreduce: $label: $*" >&2
  local tmp rc
  tmp=$(mktemp)
  "$@" >"$tmp"
  rc=$?
  if [ -n "$variant" ]; then
    grep '^{' "$tmp" | sed "s/}\$/,\"variant\":\"$variant\"}/" >>"$out"
  else
    grep '^{' "$tmp" >>"$out"
  fi
  rm -f "$tmp"
  if [ $rc -ne 0 ]; then
    echo "bench-allreduce: $label failed (exit $rc)" >&2
    failed+=("$label")
  fi
}

# ---- tide ------------------------------------------------------------------
if [ -x "$build/tools/tide" ] && [ -x "$build/tools/tiderun" ]; then
  for ops in allreduce reduce_scatter,allgather; do
    run "tide $ops" "" timeout -k 10 "$run_timeout" \
      "$build/tools/tiderun" -np "$np" "$build/tools/tide" bench --op "$ops" "${common[@]}"
  done
else
  echo "bench-allreduce: $build/tools/tide or tiderun missing: tide skipped" >&2
  failed+=("tide (not built)")
fi

# ---- Open MPI ---------------------------------------------------------------
if [ -x "$build/bench/mpi_bench" ] && command -v mpirun >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
  for variant in $mpi_variants; do
    env_args=()
    case $variant in
      default) ;;
      nommap) env_args=(-x MALLOC_MMAP_MAX_=0 -x MALLOC_TRIM_THRESHOLD_=4294967296) ;;
      *) echo "bench-allreduce: unknown MPI_VARIANTS entry '$variant' (default, nommap)" >&2
         exit 2 ;;
    esac
    for ops in allreduce reduce_scatter,allgather; do
      # shellcheck disable=SC2086  # MPIRUN_ARGS is a list of words
      run "openmpi $ops ($variant)" "$variant" timeout -k 10 "$run_timeout" \
        mpirun --oversubscribe -np "$np" ${MPIRUN_ARGS:-} "${env_args[@]}" \
        "$build/bench/mpi_bench" --op "$ops" "${common[@]}"
    done
  done
else
  echo "bench-allreduce: Open MPI baseline not built (no MPI found): skipped" >&2
fi

# ---- Gloo -------------------------------------------------------------------
# Ranks 1..NP-1 in the background, rank 0 in the foreground (it prints).
# shellcheck disable=SC2317  # called through run
gloo_run() {
  local algo=$1 store pids=() rc=0
  store=$(mktemp -d)
  for ((r = 1; r < np; r++)); do
    timeout -k 10 "$run_timeout" "$build/bench/gloo_bench" --rank "$r" --size "$np" \
      --store "$store" --op allreduce --algo "$algo" "${common[@]}" >/dev/null &
    pids+=($!)
  done
  timeout -k 10 "$run_timeout" "$build/bench/gloo_bench" --rank 0 --size "$np" \
    --store "$store" --op allreduce --algo "$algo" "${common[@]}" || rc=$?
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  rm -rf "$store"
  return "$rc"
}
if [ -x "$build/bench/gloo_bench" ]; then
  for algo in $gloo_algos; do
    run "gloo allreduce ($algo)" "" gloo_run "$algo"
  done
else
  echo "bench-allreduce: Gloo baseline not built (libgloo-dev not found): skipped" >&2
fi

elapsed=$(($(date +%s) - start))

# ---- tables -----------------------------------------------------------------
awk -v table=allreduce -v np="$np" -v elapsed="$elapsed" -v host="$(uname -n)" -v cpus="$(nproc)" \
  -v cpu="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)" -v kernel="$(uname -r)" \
  -f "$here/scripts/bench-tables.awk" "$out"
status=$?

if [ ${#failed[@]} -gt 0 ]; then
  printf 'bench-allreduce: incomplete: %s\n' "${failed[@]}" >&2
  exit 1
fi
exit $status
