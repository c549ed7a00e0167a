#!/bin/bash
# Live scheduling measurement (docs/scheduling.md, "The live scheduler"):
# trace-replay jobs submitted over time to a local `tide sched --slots N`
# under each policy; prints each run's average JCT (from the jobs' state
# files: finish - submit), the reallocations and the longest time from a
# decision to the membership that has it.
# Usage: [SPEED=10] [WORK_SCALE=1] [INTERVAL=2] scripts/sched-live-bench.sh BUILD_DIR [POLICIES (default
#        pollux,fifo)] [RUNS (default 1)] [SLOTS (default 8)]
# With HOSTS=H: H emulated hosts (scripts/emulate-cluster.sh, 1 Gbit/s, 0.5 ms; needs root) x SLOTS
# slots each, one agent per host, the scheduler on host 0 (--hostfile), and 8 jobs submitted 20 s apart.
# With HOSTS=H SLURM=1: the same under a real Slurm (emulate-cluster.sh --slurm: H nodes x SLOTS CPUs),
# started from one `sbatch --exclusive -N H` whose script runs `tide sched` with no pool (it reads the
# allocation and starts the agents itself with srun) and submits the jobs.
# Each run's summary line: average JCT, jobs, jobs not done, reallocations, the longest decision to
# membership, and "outlived": processes of the jobs (pgrep for their command lines) still alive 1 s
# after the last job ended (0 is right).
# Under the pollux policy the jobs run the Pollux agent (tide-replay --adapt pollux, or ADAPT=LIST;
# ADAPT=none: no agent), which publishes their scheduling hints every TIDE_SCHED_HINTS_INTERVAL seconds
# (here 2 by default: the jobs are short) and at its first fit; the other policies run them at a fixed batch.
set -eu
build=${1:?usage: sched-live-bench.sh BUILD_DIR [POLICIES] [RUNS] [SLOTS]}
build=$(cd "$build" && pwd)
policies=${2:-pollux,fifo}
runs=${3:-1}
slots=${4:-8}
tools=$(cd "$build/tools" && pwd)
hosts=${HOSTS:-}
slurm=${SLURM:-}
[ -z "$slurm" ] || [ -n "$hosts" ] || { echo "sched-live-bench.sh: SLURM=1 needs HOSTS=H (the Slurm nodes)" >&2; exit 2; }
here=${BENCH_SCRIPTS:-$(cd "$(dirname "$0")" && pwd)} # sbatch runs a copy of its script: pass the folder on
export BENCH_SCRIPTS=$here
traces=$(cd "$here/../../shared/data/pollux-osdi21/traces" && pwd)
speed=${SPEED:-10}           # the replay jobs' --speed
work_scale=${WORK_SCALE:-1}  # their --work times this
export TIDE_SCHED_HINTS_INTERVAL=${TIDE_SCHED_HINTS_INTERVAL:-2}
# name arrival_s app work requested_np (the fixed size FIFO runs it at)
jobs_list="j1 0 cifar10 0.04 4
j2 5 bert 0.02 2
j3 10 deepspeech2 0.01 4
j4 15 cifar10 0.06 8
j5 20 bert 0.015 2
j6 25 deepspeech2 0.015 4"
if [ -n "$hosts" ]; then
  jobs_list="j1 0 cifar10 0.04 4
j2 20 bert 0.02 2
j3 40 deepspeech2 0.01 4
j4 60 cifar10 0.06 8
j5 80 bert 0.015 2
j6 100 deepspeech2 0.015 4
j7 120 cifar10 0.04 4
j8 140 bert 0.02 4"
fi
total=$((slots * ${hosts:-1}))

run_one() { # POLICY RUN
  local policy=$1 dir daemon t0 agent= mark=tsb$$x$1x$2x
  dir=${BENCH_DIR:-$(mktemp -d /tmp/tide-sched-bench.XXXXXX)}
  if [ -n "${BENCH_SLURM_INSIDE:-}" ]; then # the pool: this Slurm allocation; the agents: its srun
    "$tools/tide" sched --interval "${INTERVAL:-2}" --policy "$policy" --dir "$dir/d" > "$dir/sched.log" 2>&1 &
    daemon=$!
  elif [ -n "$hosts" ]; then
    for ((h = 0; h < hosts; h++)); do echo "10.213.0.$((h + 1)) $slots"; done > "$dir/hosts"
    "$tools/tide" sched --hostfile "$dir/hosts" --interval "${INTERVAL:-2}" --policy "$policy" --dir "$dir/d" \
      > "$dir/sched.log" 2>&1 &
    daemon=$!
    "$tools/tide" sched --agent --dir "$dir/d" --node 0 2> "$dir/agent0.log" &
    agent=$!
  else
    "$tools/tide" sched --slots "$slots" --interval "${INTERVAL:-2}" --policy "$policy" --dir "$dir/d" \
      > "$dir/sched.log" 2>&1 &
    daemon=$!
  fi
  for _ in $(seq 100); do "$tools/tide" jobs --dir "$dir/d" > /dev/null 2>&1 && break; sleep 0.1; done
  local adapt=()
  case "${ADAPT:-}" in
    none) ;;
    "") [ "$policy" = pollux ] && adapt=(--adapt pollux) ;;
    *) adapt=(--adapt "$ADAPT") ;;
  esac
  t0=$(date +%s.%N)
  while read -r name at app work np; do
    while [ "$(echo "$(date +%s.%N) - $t0 < $at" | bc)" = 1 ]; do sleep 0.1; done
    "$tools/tide" submit --dir "$dir/d" --min-np 1 --max-np "$total" --np "$np" --name "$name" -- \
      "$tools/tide-replay" --app "$app" --traces "$traces" --speed "$speed" --work "$(echo "$work * $work_scale" | bc -l)" --grad-floats 65536 \
      "${adapt[@]}" --log-every 50 --name "$mark$name" > /dev/null
  done <<< "$jobs_list"
  local n
  n=$(echo "$jobs_list" | wc -l)
  while [ "$(grep -l '^state \(done\|failed\|cancelled\)' "$dir"/d/jobs/*/state 2> /dev/null | wc -l)" -lt "$n" ]; do sleep 0.5; done
  # Nothing of any job outlives it: its workers (and tiderun, on one host) carry $mark.
  sleep 1
  local outlived
  outlived=$(pgrep -f -- "$mark" | wc -l)
  [ "$outlived" = 0 ] || pgrep -af -- "$mark" > "$dir/outlived"
  kill "$daemon" $agent
  wait "$daemon" || true
  awk -v policy="$policy" -v run="$2" -v outlived="$outlived" -v slurm="${BENCH_SLURM_INSIDE:+ (slurm)}" '
    function flush() { if (st != "done") bad++; jct += f - s; n++ }
    FNR == 1 && NR > 1 { flush() }
    /^state / { st = $2 } /^submit / { s = $2 } /^finish / { f = $2 } /^resizes / { r += $2 }
    /^max_latency / { if ($2 > lat) lat = $2 }
    END { flush(); printf "{\"policy\": \"%s%s\", \"run\": %d, \"jobs\": %d, \"not_done\": %d, \"avg_jct_s\": %.1f, \"resizes\": %d, \"max_realloc_latency_s\": %.3f, \"outlived\": %d}\n",
                 policy, slurm, run, n, bad, jct / n, r, lat, outlived }' "$dir"/d/jobs/*/state
  cp "$dir/sched.log" "/tmp/tide-sched-bench-$policy-$2.log"
  [ "$outlived" = 0 ] || cp "$dir/outlived" "/tmp/tide-sched-bench-$policy-$2.outlived"
  [ -n "${BENCH_DIR:-}" ] || rm -rf "$dir"
}

# Inside the emulated cluster (one rank per host): host 0 runs the measurement, the others an agent.
if [ -n "${BENCH_INSIDE:-}" ]; then
  node=$TIDE_NODE_RANK
  unset TIDE_RANK TIDE_SIZE TIDE_LOCAL_RANK TIDE_LOCAL_SIZE TIDE_NNODES TIDE_RDZV TIDE_JOB_TOKEN TIDE_JOB_ID TIDE_NODE_RANK
  if [ "$node" != 0 ]; then
    for _ in $(seq 100); do [ -f "$BENCH_DIR/d/control" ] && break; sleep 0.1; done
    "$tools/tide" sched --agent --dir "$BENCH_DIR/d" --node "$node" 2> "$BENCH_DIR/agent$node.log" || true
    exit 0
  fi
  run_one "$BENCH_INSIDE" "$BENCH_RUN" > "$BENCH_DIR/result"
  exit 0
fi
# Inside the Slurm batch script (on the allocation's first node).
if [ -n "${BENCH_SLURM_INSIDE:-}" ]; then
  run_one "$BENCH_POLICY" "$BENCH_RUN" > "$BENCH_DIR/result"
  exit 0
fi
# Emulated hosts: one cluster per run; host 0 (or the Slurm batch script) writes the result.
emulated_run() { # POLICY RUN DIR
  if [ -n "$slurm" ]; then
    BENCH_SLURM_INSIDE=1 BENCH_POLICY=$1 BENCH_RUN=$2 BENCH_DIR=$3 "$here/emulate-cluster.sh" --slurm \
      --build "$build" --hosts "$hosts" --ranks-per-host "$slots" --bandwidth 1gbit --latency 0.5ms -- \
      sbatch --wait -N "$hosts" --exclusive -J tide-sched-bench -o "$3/batch.out" \
      --wrap "exec /bin/bash $here/sched-live-bench.sh $build $1 1 $slots"
  else
    BENCH_INSIDE=$1 BENCH_RUN=$2 BENCH_DIR=$3 "$here/emulate-cluster.sh" --build "$build" \
      --hosts "$hosts" --ranks-per-host 1 --bandwidth 1gbit --latency 0.5ms --no-prefix -- \
      /bin/bash "$here/sched-live-bench.sh" "$build" "$1" 1 "$slots"
  fi
}
if [ -n "$hosts" ]; then
  for ((r = 1; r <= runs; r++)); do
    for policy in ${policies//,/ }; do
      d=$(mktemp -d /tmp/tide-sched-bench.XXXXXX)
      chmod 755 "$d"
      emulated_run "$policy" "$r" "$d" > "$d/emu.log" 2>&1 ||
        { echo "run failed: $d/emu.log"; tail -5 "$d/emu.log"; tail -5 "$d/batch.out" 2> /dev/null; }
      cat "$d/result" 2> /dev/null
      if grep -q '"not_done": 0,.*"outlived": 0}' "$d/result" 2> /dev/null; then rm -rf "$d"; else echo "kept $d"; fi
    done
  done
  exit 0
fi

for ((r = 1; r <= runs; r++)); do
  for policy in ${policies//,/ }; do run_one "$policy" "$r"; done
done
