#!/bin/bash
# The live scheduler end to end (docs/scheduling.md, "The live scheduler"):
# tide sched --slots 4 with a short interval, trace-replay jobs submitted to
# it. Checks: a new job starts on its minimum at once; jobs are resized in
# place (the same tiderun, the step counter goes on across the change);
# tide jobs lists them; a failing job is reported failed with its exit code,
# not restarted forever; a restarted scheduler finds its running job and
# resizes it; tide cancel ends a job and nothing of it outlives it; a job
# whose worker is killed goes on and finishes; bad input and an absent
# scheduler give clear errors.
# Usage: sched_live.sh BUILD_DIR SOURCE_DIR
set -u
. "$(dirname "$0")/sched_lib.sh" "$1" "$2" sched-live
slots_are() { jobs && [ "$(field "$1" 3)" = running ] && [ "$(field "$1" 4)" = "$2" ] && [ "$(field "$1" 5)" = "$2" ]; }
start_daemon() {
  "$tools/tide" sched --slots 4 --interval 0.5 --dir "$dir" >> "$tmp/sched.log" 2>&1 &
  daemon=$!
  for _ in $(seq 100); do [ -S "$dir/sock" ] && "$tools/tide" jobs --dir "$dir" > /dev/null 2>&1 && return 0; sleep 0.1; done
  fail "tide sched did not come up"; cat "$tmp/sched.log"; return 1
}
replay() { # NAME WORK: submits a trace-replay job of cifar10 at 5x
  "$tools/tide" submit --dir "$dir" --min-np 1 --max-np 4 --name "$1" -- "$tools/tide-replay" --app cifar10 \
    --traces "$traces" --speed 5 --work "$2" --grad-floats 65536 --log-every 5 --name "$mark$1"
}

# Bad input and no scheduler.
"$tools/tide" submit --dir "$dir" --max-np 2 -- true 2> "$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q -- "--min-np and --max-np are required" "$tmp/err" || fail "submit without --min-np: rc $rc, $(cat "$tmp/err")"
"$tools/tide" jobs --dir "$dir" 2> "$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "no tide sched serves $dir" "$tmp/err" || fail "jobs without a scheduler: rc $rc, $(cat "$tmp/err")"
"$tools/tide" sched --slots 0 --dir "$dir" 2> "$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q -- "--slots: '0'" "$tmp/err" || fail "sched --slots 0: rc $rc, $(cat "$tmp/err")"
"$tools/tide" sched --agent --slots 2 --dir "$dir" 2> "$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q -- "--agent takes no --slots" "$tmp/err" || fail "sched --agent --slots: rc $rc, $(cat "$tmp/err")"
printf 'node9.invalid 2\n' > "$tmp/hosts"
"$tools/tide" sched --hostfile "$tmp/hosts" --dir "$dir" 2> "$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "is not this host" "$tmp/err" || fail "sched with another host: rc $rc, $(cat "$tmp/err")"
printf 'localhost zero\n' > "$tmp/hosts"
"$tools/tide" sched --hostfile "$tmp/hosts" --dir "$dir" 2> "$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "hosts:1: expected NAME SLOTS" "$tmp/err" || fail "a bad hostfile: rc $rc, $(cat "$tmp/err")"

start_daemon || exit 1
"$tools/tide" submit --dir "$dir" --min-np 1 --max-np 5 -- true 2> "$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "more than the 4 slots" "$tmp/err" || fail "submit --max-np 5 on 4 slots: rc $rc, $(cat "$tmp/err")"

# Job a alone: its minimum at once, then the whole pool.
a=$(replay a 0.08) || fail "submit a"
jobs
[ "$(field "$a" 3)" = running ] && [ "$(field "$a" 4)" = 1 ] || fail "a did not start at once on 1 slot: $(cat "$dir/jobs.txt")"
wait_for 30 grep -q "job $a (a) runs on 4 worker(s)" "$tmp/sched.log" || fail "a never grew to 4 workers"
keeper_a=$(keeper_of "$a")

# Job b: a shrinks in place to make room.
b=$(replay b 0.5) || fail "submit b"
wait_for 30 slots_are "$b" 2 || fail "b never ran on 2 workers: $(cat "$dir/jobs.txt")"
wait_for 30 grep -q "job $a (a) runs on 2 worker(s)" "$tmp/sched.log" || fail "a never shrank to 2 workers"
wait_for 20 grep -q "workers 2 batch" "$dir/jobs/$a/log" || fail "a's log has no step on 2 workers"
jobs
[ "$(field "$a" 3)" = running ] && [ "$(field "$b" 3)" = running ] || fail "tide jobs: $(cat "$dir/jobs.txt")"
[ "$(field "$a" 4)" = 2 ] && [ "$(field "$b" 4)" = 2 ] || fail "tide jobs slots: $(cat "$dir/jobs.txt")"
# In place: one tiderun for a's whole life, and its steps go on across the sizes.
[ "$(grep -c '^tiderun: starting worker' "$dir/jobs/$a/log")" -ge 3 ] || fail "a's tiderun did not start its joiners"
awk '/^tide-replay/ { s = $4; if (s <= last) { print "step " s " after " last; bad = 1 } last = s }
     END { exit bad }' "$dir/jobs/$a/log" || fail "a's step counter did not go on across the resizes"
grep -q "workers 4 batch" "$dir/jobs/$a/log" || fail "a's log has no step on 4 workers"

# A failing job is reported failed with its exit code.
c=$("$tools/tide" submit --dir "$dir" --min-np 1 --max-np 1 --name bad -- sh -c "exit 3") || fail "submit bad"
wait_for 30 is_state "$c" failed || fail "the failing job is $(state_of "$c")"
jobs
[ "$(field "$c" 12)" = 3 ] || fail "the failing job's exit code: $(cat "$dir/jobs.txt")"

# The scheduler dies: a and b go on; a new one finds them and reallocates.
kill -9 "$daemon"; wait "$daemon" 2> /dev/null; daemon=
sleep 1
[ "$(state_of "$a")" = running ] && kill -0 "$keeper_a" 2> /dev/null && alive "${mark}a" || fail "a did not survive its scheduler"
"$tools/tide" cancel --dir "$dir" b 2> "$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "no tide sched serves" "$tmp/err" || fail "cancel without a scheduler: rc $rc, $(cat "$tmp/err")"
lines=$(wc -l < "$tmp/sched.log")
start_daemon || exit 1
jobs
[ "$(field "$a" 3)" = running ] && [ "$(field "$b" 3)" = running ] || fail "the new scheduler lost its jobs: $(cat "$dir/jobs.txt")"

# Cancel b: nothing of it outlives it; a gets the slots back.
keeper_b=$(keeper_of "$b")
"$tools/tide" cancel --dir "$dir" b > "$tmp/out" || fail "cancel b"
grep -q "cancelled" "$tmp/out" || fail "cancel b: $(cat "$tmp/out")"
wait_for 10 gone "${mark}b" "$keeper_b" || fail "b's processes outlived it"
wait_for 30 grep -q "job $a (a) runs on 4 worker(s), .* after the decision" <(tail -n +$((lines + 1)) "$tmp/sched.log") ||
  fail "the restarted scheduler did not give a the slots back"
[ "$(keeper_of "$a")" = "$keeper_a" ] || fail "a was restarted (keeper $keeper_a, now $(keeper_of "$a"))"

# a's work outlasts the checks above on a slow machine; it is cancelled, not waited for.
"$tools/tide" cancel --dir "$dir" a > /dev/null || fail "cancel a"
wait_for 10 gone "${mark}a" "$keeper_a" || fail "a's processes outlived it"

# A worker of d dies: the others go on (tiderun's elastic recovery) and d finishes. d is short
# (about 390 steps) and loses its worker as soon as it runs on 4.
d=$(replay d 0.01) || fail "submit d"
wait_for 30 grep -q "job $d (d) runs on 4 worker(s)" "$tmp/sched.log" || fail "d never grew to 4 workers"
keeper_d=$(keeper_of "$d")
victim=$(pgrep -f -- "[t]ide-replay .*--name ${mark}d" | tail -1)
[ -n "$victim" ] && kill -9 "$victim" || fail "no worker of d to kill"
wait_for 60 is_state "$d" done || fail "d did not finish: $(state_of "$d"); $(tail -3 "$dir/jobs/$d/log")"
grep -q "was killed by signal SIGKILL; the others go on" "$dir/jobs/$d/log" ||
  fail "d's tiderun did not see its worker killed: $(grep -v '^tide-replay' "$dir/jobs/$d/log" | tail -3)"
wait_for 10 gone "$mark" "$keeper_d" || fail "processes of the jobs outlived them"
"$tools/tide" cancel --dir "$dir" d 2> "$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "has already ended" "$tmp/err" || fail "cancel a finished job: rc $rc, $(cat "$tmp/err")"

if [ $fails -ne 0 ]; then
  echo "--- scheduler"; cat "$tmp/sched.log"; echo "--- a"; tail -20 "$dir/jobs/$a/log"
  [ -n "${d:-}" ] && { echo "--- d"; tail -20 "$dir/jobs/$d/log"; }
  exit 1
fi
echo "sched_live: ok"
