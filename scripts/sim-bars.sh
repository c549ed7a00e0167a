#!/usr/bin/env bash
# The simulator bars of docs/scheduling.md: each configuration's `tide sim`
# over the 8 workloads of the Pollux paper; prints the mean over workloads of
# the average JCT per run. Two runs at a time (JOBS=2).
#   scripts/sim-bars.sh [BUILD_DIR] [OUT_DIR]      (default build, sim-bars)
set -euo pipefail
build=${1:-build}
out=${2:-sim-bars}
data=${TIDE_POLLUX_DATA:-../shared/data/pollux-osdi21}
jobs=${JOBS:-2}
[ -d "$data/traces" ] || { echo "sim-bars: no traces in $data (set TIDE_POLLUX_DATA)" >&2; exit 77; }
mkdir -p "$out"
cp "$build/tools/tide" "$out/tide"   # rebuilds during the sweep do not touch it
run() {  # NAME LOAD ARGS...
  local name=$1 load=$2; shift 2
  local dir=$data/workloads${load:+-$load}
  nice "$out/tide" sim --quiet --traces "$data/traces" --out "$out/$name" "$@" "$dir"/workload-*.csv \
    > "$out/$name.log" 2>&1 || echo "sim-bars: $name failed (see $out/$name.log)" >&2
}
configs=(
  "baselines-1.0||--policy tiresias,optimus,fifo"
  "baselines-0.5|0.5|--policy tiresias,optimus,fifo"
  "baselines-1.5|1.5|--policy tiresias,optimus,fifo"
  "pollux-1.0||--policy pollux"
  "pollux-0.5|0.5|--policy pollux"
  "pollux-1.5|1.5|--policy pollux"
  "pollux-tide-resize||--policy pollux --resize-cost 0.08"
  "pollux-interval-30||--policy pollux --interval 30"
  "pollux-interval-480||--policy pollux --interval 480"
  "pollux-noavoid-25||--policy pollux --no-avoid --interference 0.25"
  "pollux-noavoid-50||--policy pollux --no-avoid --interference 0.5"
)
running=0
for c in "${configs[@]}"; do
  IFS='|' read -r name load args <<< "$c"
  [ -n "${ONLY:-}" ] && [[ ! $name =~ $ONLY ]] && continue
  # shellcheck disable=SC2086
  run "$name" "$load" $args &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait
for c in "${configs[@]}"; do
  IFS='|' read -r name _ _ <<< "$c"
  [ -f "$out/$name.log" ] && grep "^mean over" "$out/$name.log" | sed "s/^/$name: /"
done
