#!/bin/bash
# Live scheduling measurement (docs/scheduling.md, "The live scheduler"):
# trace-replay jobs submitted over time to a local `tide sched --slots N`
# under each policy; prints each run's average JCT (from the jobs' state
# files: finish - submit), the reallocations and the longest time from a
# decision to the membership that has it.
# Usage: [SPEED=10] [WORK_SCALE=1] [INTERVAL=2] scripts/sched-live-bench.sh BUILD_DIR [POLICIES (default
#        pollux,fifo)] [RUNS (default 1)] [SLOTS (default 8)]
set -eu
build=${1:?usage: sched-live-bench.sh BUILD_DIR [POLICIES] [RUNS] [SLOTS]}
policies=${2:-pollux,fifo}
runs=${3:-1}
slots=${4:-8}
tools=$(cd "$build/tools" && pwd)
traces=$(cd "$(dirname "$0")/../../shared/data/pollux-osdi21/traces" && pwd)
speed=${SPEED:-10}           # the replay jobs' --speed
work_scale=${WORK_SCALE:-1}  # their --work times this
# name arrival_s app work requested_np (the fixed size FIFO runs it at)
jobs_list="j1 0 cifar10 0.04 4
j2 5 bert 0.02 2
j3 10 deepspeech2 0.01 4
j4 15 cifar10 0.06 8
j5 20 bert 0.015 2
j6 25 deepspeech2 0.015 4"

run_one() { # POLICY RUN
  local policy=$1 dir daemon t0
  dir=$(mktemp -d /tmp/tide-sched-bench.XXXXXX)
  "$tools/tide" sched --slots "$slots" --interval "${INTERVAL:-2}" --policy "$policy" --dir "$dir/d" \
    > "$dir/sched.log" 2>&1 &
  daemon=$!
  for _ in $(seq 100); do "$tools/tide" jobs --dir "$dir/d" > /dev/null 2>&1 && break; sleep 0.1; done
  t0=$(date +%s.%N)
  while read -r name at app work np; do
    while [ "$(echo "$(date +%s.%N) - $t0 < $at" | bc)" = 1 ]; do sleep 0.1; done
    "$tools/tide" submit --dir "$dir/d" --min-np 1 --max-np "$slots" --np "$np" --name "$name" -- \
      "$tools/tide-replay" --app "$app" --traces "$traces" --speed "$speed" --work "$(echo "$work * $work_scale" | bc -l)" --grad-floats 65536 \
      --log-every 50 --name "bench-$name" > /dev/null
  done <<< "$jobs_list"
  local n
  n=$(echo "$jobs_list" | wc -l)
  while [ "$(grep -l '^state \(done\|failed\|cancelled\)' "$dir"/d/jobs/*/state 2> /dev/null | wc -l)" -lt "$n" ]; do sleep 0.5; done
  kill "$daemon"
  wait "$daemon" || true
  awk -v policy="$policy" -v run="$2" '
    function flush() { if (st != "done") bad++; jct += f - s; n++ }
    FNR == 1 && NR > 1 { flush() }
    /^state / { st = $2 } /^submit / { s = $2 } /^finish / { f = $2 } /^resizes / { r += $2 }
    /^max_latency / { if ($2 > lat) lat = $2 }
    END { flush(); printf "{\"policy\": \"%s\", \"run\": %d, \"jobs\": %d, \"not_done\": %d, \"avg_jct_s\": %.1f, \"resizes\": %d, \"max_realloc_latency_s\": %.3f}\n",
                 policy, run, n, bad, jct / n, r, lat }' "$dir"/d/jobs/*/state
  cp "$dir/sched.log" "/tmp/tide-sched-bench-$policy-$2.log"
  rm -rf "$dir"
}

for ((r = 1; r <= runs; r++)); do
  for policy in ${policies//,/ }; do run_one "$policy" "$r"; done
done
