#!/bin/bash
# Trace-replay jobs under tide sched publish their Pollux hints
# (docs/scheduling.md, "The live scheduler"): a tide-replay job with
# --adapt pollux reports its fitted model through its store, so `tide jobs`
# shows its goodput and a modelled speedup; the same job without the agent
# keeps the linear speedup (the control: hints come from the agent only).
# Usage: sched_hints.sh BUILD_DIR SOURCE_DIR
set -u
. "$(dirname "$0")/sched_lib.sh" "$1" "$2" sched-hints
"$tools/tide" sched --slots 3 --interval 0.5 --dir "$dir" > "$tmp/sched.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do "$tools/tide" jobs --dir "$dir" > /dev/null 2>&1 && break; sleep 0.1; done
submit() { # NAME MAX_NP ADAPT...: a cifar10 replay job, long enough to be listed running
  local name=$1 max=$2; shift 2
  TIDE_SCHED_HINTS_INTERVAL=1 "$tools/tide" submit --dir "$dir" --min-np 1 --max-np "$max" --name "$name" -- \
    "$tools/tide-replay" --app cifar10 --traces "$traces" --speed 5 --work 0.5 --grad-floats 4096 --log-every 0 "$@"
}
# The agent fits its throughput model once it has seen two shapes: its job grows from 1 to 2 workers.
p=$(submit agent 2 --adapt pollux) || fail "submit the job with the agent"
n=$(submit plain 1) || fail "submit the job without it"
row() { "$tools/tide" jobs --dir "$dir" 2> /dev/null | awk -v j="$1" '$1 == j'; }
# ID NAME STATE SLOTS WORKERS BATCH GOODPUT SPEEDUP ...: a goodput and a speedup not marked linear
hinted() { row "$1" | awk '$3 == "running" && $7 != "-" && $7 + 0 > 0 && $8 !~ /linear/ { ok = 1 } END { exit !ok }'; }
wait_for 30 hinted "$p" || fail "the agent's hints never reached the scheduler: $(row "$p")"
row "$n" | awk '$3 == "running" && $7 == "-" && $8 ~ /linear/ { ok = 1 } END { exit !ok }' ||
  fail "the job without the agent shows hints: $(row "$n")"
"$tools/tide" jobs --dir "$dir"
if [ $fails -ne 0 ]; then
  echo "--- scheduler"; cat "$tmp/sched.log"; for l in "$dir"/jobs/*/log; do echo "--- $l"; tail -5 "$l"; done
  exit 1
fi
echo "sched_hints: ok"
