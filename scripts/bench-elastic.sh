#!/bin/bash
# The bars of docs/elastic.md, measured side by side in one run:
#   kill   a 4-worker MLP run; worker 3 is killed (SIGKILL) halfway through data epoch 2; the job
#          goes on with 3. Kill-to-next-step time and final accuracy vs the same run uninterrupted.
#   resize 2 -> 4 -> 3 workers (tide ctl resize) in place, time from the decision to the first
#          step on the new membership; vs a restart of the job (the torchrun/Horovod way): the time
#          from launching it to its first step (a lower bound: no checkpoint written or read).
#   emulated  the resize on scripts/emulate-cluster.sh's 2 hosts (root): 1 worker on each, then
#          `tide ctl resize 4` (node 0 starts the joiners) and `resize 3`, in place; the time from
#          each change's start to its first step, per change
#   straggler  a 3-worker CNN run with TIDE_STRAGGLER=remove; at step 20 worker 2 is put in a cgroup
#          that gives it 20% of one core (cpu.cfs_quota_us, root); the steps until it is flagged,
#          and the throughput after the last membership change against a healthy run of that size.
# usage: scripts/bench-elastic.sh BUILD_DIR [RUNS]     (EPOCHS=5, TIDE_SHM=0 for TCP only,
#        ONLY=kill-resize, ONLY=emulated or ONLY=straggler for one part)
set -u
B=$(cd "${1:-build}" && pwd)
RUNS=${2:-5}
EPOCHS=${EPOCHS:-5}
OUT=$(mktemp -d /tmp/tide-bench-elastic-XXXXXX)
CG=/sys/fs/cgroup/cpu/tide-straggler-$$
trap 'rm -rf "$OUT"; [ -d "$CG" ] && rmdir "$CG"' EXIT
export TIDE_JOB_TOKEN=bench-elastic-$$
TRAIN="$B/tools/tide-train --elastic --model mlp --epochs $EPOCHS --seed 1 --runs $OUT"
now() { date +%s.%N; }

# Waits until run $1's metrics show epochs_done >= $2 (or the run ended).
wait_progress() {
  local f="$OUT/$1/metrics.jsonl" pid=$3
  while kill -0 "$pid" 2>/dev/null; do
    if [ -f "$f" ] && tail -n 3 "$f" | grep -o '"epochs_done":[0-9.]*' | tail -1 |
        awk -F: -v want="$2" '{ exit !($2 >= want) }'; then return 0; fi
    sleep 0.02
  done
  return 1
}

# The pid of the worker with TIDE_RANK=$2 under tiderun $1.
worker_pid() {
  for p in $(pgrep -P "$1"); do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "TIDE_RANK=$2"; then echo "$p"; return; fi
  done
}

# The last step number in run $1's metrics.
last_step() { grep '"type":"step"' "$OUT/$1/metrics.jsonl" 2>/dev/null | tail -n 1 | grep -o '"step":[0-9]*' | cut -d: -f2; }

# Median images/s of run $1's steps from step $2 on (to step $3).
median_rate() {
  grep '"type":"step"' "$OUT/$1/metrics.jsonl" | awk -v from="$2" -v to="${3:-1000000000}" '{
    match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7) + 0
    match($0, /"images_per_s":[0-9.]+/); if (s >= from && s <= to) print substr($0, RSTART + 15, RLENGTH - 15) + 0
  }' | sort -n | awk '{ v[NR] = $1 } END { if (!NR) print "null"; else print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# Waits for run $1's first completed step (or job $2's end), stops the job and sets restart_s to the
# seconds since $3: a restart's launch-to-first-step time.
restart_s=null
first_step() {
  until grep -qs '"type":"step"' "$OUT/$1/metrics.jsonl" || ! kill -0 "$2" 2>/dev/null; do sleep 0.005; done
  restart_s=$(echo "$(now) - $3" | bc -l)
  kill -TERM "$2"
  wait "$2" 2>/dev/null
}

acc() { grep -o '"final_test_accuracy":[0-9.]*' "$OUT/$1/summary.json" | cut -d: -f2; }

ONLY=${ONLY:-all}
for i in $(seq 1 "$RUNS"); do
  [ "$ONLY" = straggler ] || [ "$ONLY" = emulated ] && break
  # kill: the same run, uninterrupted and with a kill
  "$B/tools/tiderun" --elastic --min-np 3 --max-np 4 -np 4 $TRAIN --name base$i > /dev/null 2>&1
  "$B/tools/tiderun" --elastic --min-np 3 --max-np 4 -np 4 --max-restarts 0 $TRAIN --name kill$i \
    > "$OUT/kill$i.out" 2> "$OUT/kill$i.err" &
  job=$!
  wait_progress kill$i 1.5 $job
  victim=$(worker_pid $job 3)
  t_kill=$(now)
  kill -9 "$victim"
  wait $job
  rc=$?
  t_step=$(grep -o 'the first on 3 worker(s), completed at [0-9.]*' "$OUT/kill$i.err" | head -1 | awk '{print $NF}')
  echo "{\"bench\":\"kill\",\"run\":$i,\"rc\":$rc,\"kill_to_next_step_s\":$(echo "$t_step - $t_kill" | bc -l),"\
"\"accuracy_uninterrupted\":$(acc base$i),\"accuracy_killed\":$(acc kill$i)}"

  # resize: 2 -> 4 -> 3 in place
  port=$((20000 + RANDOM % 12000)) # below the ephemeral ports (32768 on)
  "$B/tools/tiderun" --rdzv 127.0.0.1:$port --elastic --min-np 2 --max-np 4 -np 2 $TRAIN --name resize$i \
    > "$OUT/resize$i.out" 2> "$OUT/resize$i.err" &
  job=$!
  wait_progress resize$i 0.5 $job
  "$B/tools/tide" ctl --rdzv 127.0.0.1:$port resize 4 > /dev/null
  # The new workers load the data first; the change happens once they wait to join.
  while kill -0 $job 2>/dev/null && ! grep -q 'the first on 4 worker' "$OUT/resize$i.err"; do sleep 0.02; done
  p=$(tail -n 1 "$OUT/resize$i/metrics.jsonl" | grep -o '"epochs_done":[0-9.]*' | cut -d: -f2)
  wait_progress resize$i "$(echo "${p:-0} + 0.3" | bc -l)" $job
  "$B/tools/tide" ctl --rdzv 127.0.0.1:$port resize 3 > /dev/null
  wait $job
  rc=$?
  grow=$(grep -o 'the first on 4 worker(s).*after the change began' "$OUT/resize$i.err" | tail -1 | grep -o '[0-9.]* s after' | cut -d' ' -f1)
  shrink=$(grep -o 'the first on 3 worker(s).*after the change began' "$OUT/resize$i.err" | tail -1 | grep -o '[0-9.]* s after' | cut -d' ' -f1)

  # restart: launch to the first completed step of the 3-worker job
  t0=$(now)
  "$B/tools/tiderun" -np 3 ${TRAIN/--elastic/} --name restart$i > /dev/null 2>&1 &
  first_step restart$i $! "$t0"
  echo "{\"bench\":\"resize\",\"run\":$i,\"rc\":$rc,\"grow_2_to_4_s\":${grow:-null},\"shrink_4_to_3_s\":${shrink:-null},"\
"\"restart_to_first_step_s\":$restart_s}"
done

# straggler: the CNN on 19,200 images (100 steps an epoch at 3 x 64), 2 epochs
STRAIN="$B/tools/tide-train --elastic --model cnn --subset 19200 --epochs 2 --seed 1 --runs $OUT"
# emulated: 2 -> 4 -> 3 across 2 emulated hosts (1 Gbit/s, 0.5 ms), tiderun --elastic --nnodes 2
if [ "$ONLY" = all ] || [ "$ONLY" = emulated ]; then
  for i in $(seq 1 "$RUNS"); do
    log=$OUT/emulated$i.log
    bash "$(dirname "$0")/emulate-cluster.sh" --hosts 2 --ranks-per-host 1 --build "$B" --no-prefix \
      --tiderun-arg --elastic --tiderun-arg --max-np=4 -- $TRAIN --name emulated$i > "$log" 2>&1 &
    job=$!
    wait_progress emulated$i 0.5 $job
    ns=$(ip netns list | grep -o "tide-emu-[0-9]*-h0" | head -1)
    ip netns exec "$ns" "$B/tools/tide" ctl --rdzv 10.213.0.1:29500 resize 4 > /dev/null
    while kill -0 $job 2>/dev/null && ! grep -q 'the first on 4 worker' "$log"; do sleep 0.02; done
    p=$(tail -n 1 "$OUT/emulated$i/metrics.jsonl" | grep -o '"epochs_done":[0-9.]*' | cut -d: -f2)
    wait_progress emulated$i "$(echo "${p:-0} + 0.3" | bc -l)" $job
    ip netns exec "$ns" "$B/tools/tide" ctl --rdzv 10.213.0.1:29500 resize 3 > /dev/null
    wait $job
    rc=$?
    changes=$(grep -o 'the first on [0-9]* worker(s), completed at [0-9.]*: [0-9.]* s after' "$log" |
      awk '{ printf "%s{\"to\":%s,\"s\":%s}", n++ ? "," : "", $4, $(NF-2) }')
    # restart: the same cluster started afresh with 4 workers (2 per host), the way a job grows when
    # it restarts; from the moment the hosts exist (emulate-cluster's "host(s) x" line) to the first step
    log=$OUT/restart-emulated$i.log
    bash "$(dirname "$0")/emulate-cluster.sh" --hosts 2 --ranks-per-host 2 --build "$B" --no-prefix \
      -- ${TRAIN/--elastic/} --name restart-emulated$i > "$log" 2>&1 &
    job=$!
    until grep -q 'host(s) x' "$log" 2>/dev/null || ! kill -0 $job 2>/dev/null; do sleep 0.005; done
    first_step restart-emulated$i $job "$(now)"
    echo "{\"bench\":\"emulated\",\"run\":$i,\"rc\":$rc,\"changes\":[$changes],\"restart_to_first_step_s\":$restart_s}"
  done
fi

if [ "$ONLY" = kill-resize ] || [ "$ONLY" = emulated ]; then
  :
elif mkdir "$CG" 2>/dev/null && echo 20000 > "$CG/cpu.cfs_quota_us"; then
  for i in $(seq 1 "$RUNS"); do
    for n in 2 3; do
      "$B/tools/tiderun" --elastic --min-np 2 --max-np $n -np $n $STRAIN --name healthy$n-$i > /dev/null 2>&1
    done
    TIDE_STRAGGLER=remove "$B/tools/tiderun" --elastic --min-np 2 --max-np 3 -np 3 --max-restarts 0 $STRAIN \
      --name straggler$i > "$OUT/straggler$i.out" 2> "$OUT/straggler$i.err" &
    job=$!
    until [ "$(last_step straggler$i)" -ge 20 ] 2>/dev/null || ! kill -0 $job 2>/dev/null; do sleep 0.01; done
    slow=$(worker_pid $job 2)
    echo "$slow" > "$CG/cgroup.procs"
    from=$(last_step straggler$i)
    wait $job
    rc=$?
    flagged=$(grep -o 'rank 2 is a straggler at step [0-9]*' "$OUT/straggler$i.err" | head -1 | awk '{print $NF}')
    change=$(grep -o 'step [0-9]*, the first on [0-9]* worker(s)' "$OUT/straggler$i.err" | tail -1)
    cstep=$(echo "$change" | awk '{print $2}' | tr -d ,)
    size=$(echo "$change" | awk '{print $6}')
    after=$(median_rate straggler$i $(( ${cstep:-0} + 5 )))
    healthy=$(median_rate healthy${size:-3}-$i 5)
    slowed=$(median_rate straggler$i $(( ${from:-0} + 1 )) ${flagged:-0})
    echo "{\"bench\":\"straggler\",\"run\":$i,\"rc\":$rc,\"slowed_at_step\":${from:-null},\"flagged_at_step\":${flagged:-null},"\
"\"steps_to_flag\":$(( ${flagged:-0} - ${from:-0} )),\"images_per_s_slowed\":$slowed,\"size_after\":${size:-null},\"images_per_s_after\":$after,"\
"\"images_per_s_healthy_same_size\":$healthy,\"ratio\":$(echo "$after / $healthy" | bc -l 2>/dev/null || echo null)}"
  done
else
  echo "bench-elastic: straggler: cannot make the cgroup $CG (needs root and the cgroup v1 cpu controller); skipped" >&2
fi

# Nothing of the jobs outlives them: processes, shared-memory files, listening ports.
procs=$(pgrep -fc "$B/tools/tide-train" || true)
shm=$(ls /dev/shm | grep -c '^tide' || true)
ports=$(ss -ltnp 2>/dev/null | grep -c 'tide-train\|tiderun' || true)
echo "{\"bench\":\"leftovers\",\"processes\":$procs,\"shm_files\":$shm,\"listening_ports\":$ports}"
