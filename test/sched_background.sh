#!/bin/bash
# Background jobs under the live scheduler (issue 27, item 4; docs/scheduling.md,
# "Background jobs"), on one host: tide sched --slots 2, trace-replay jobs.
# Checks:
#   - bad combinations of tide submit --background are refused by name;
#   - a background job starts at once, takes no slot (SLOTS "bg"), runs at
#     SCHED_IDLE (or nice 19), and tide jobs shows its guard's state and
#     progress;
#   - its guard follows the foreground set: foreground a (1..2 workers) comes
#     and the background pauses while a measures its solo step, then resumes;
#   - a grows to 2 workers (a size it never ran at): the background pauses
#     again until a's solo step at 2 is known (not compared with the
#     1-worker one); then foreground b comes, a shrinks back to 1 worker and
#     the guard takes a's 1-worker solo step from a's store ("known", the
#     value it measured at 1, not the 2-worker one);
#   - a second background job cancelled while it runs is taken out of the
#     foregrounds' counts of background jobs (tide jobs: backgrounds=N);
#   - neither job loses or repeats a step; the background finishes after the
#     foregrounds (a cancelled, b done; nothing to watch: it runs; on cores that other tests keep
#     busy, where SCHED_IDLE may starve it, it is cancelled 60 s after them);
#     nothing of any job outlives it.
# Usage: sched_background.sh BUILD_DIR SOURCE_DIR
set -u
. "$(dirname "$0")/sched_lib.sh" "$1" "$2" sched-bg
submit() { "$tools/tide" submit --dir "$dir" "$@"; }
replay() { # NAME WORK: the arguments of a cifar10 replay job, one line per step
  echo "$tools/tide-replay" --app cifar10 --traces "$traces" --speed 4 --work "$2" --grad-floats 16384 --log-every 1 \
    --name "$mark$1"
}
steps_ok() { # LOG: every step once, in order, from 1
  awk 'BEGIN { n = 1 } /^tide-replay/ { s = $4; if (s != n) { print "step " s ", expected " n; bad = 1; exit } n++ }
       END { if (n == 1) { print "no steps"; bad = 1 } exit bad }' "$1"
}
guard() { grep "multiplexing:" "$dir/jobs/$bg/log"; } # the background's guard's lines
guard_says() { guard | grep -q -- "$1"; }

"$tools/tide" sched --slots 2 --interval 3 --dir "$dir" >> "$tmp/sched.log" 2>&1 &
daemon=$!
wait_for 10 "$tools/tide" jobs --dir "$dir" > /dev/null 2>&1 || { fail "tide sched did not come up"; cat "$tmp/sched.log"; exit 1; }

# Bad combinations, refused by name.
refused() { # EXPECTED_RC MESSAGE ARGS...
  local want=$1 msg=$2; shift 2
  submit "$@" -- true 2> "$tmp/err"; local rc=$?
  [ $rc -eq "$want" ] && grep -q -- "$msg" "$tmp/err" || fail "submit $*: rc $rc, $(cat "$tmp/err")"
}
refused 2 "--background takes no --min-np or --max-np" --background --np 1 --max-np 2
refused 2 "--background needs --np K" --background
refused 2 "a background job runs at most as many workers as the pool has slots (2)" --background --np 3
[ -z "$(ls "$dir/jobs")" ] || fail "a refused submission left a job: $(ls "$dir/jobs")"

# The background job: at once, no slot, lowest priority.
# TIDE_GUARD_PERCENT=100000: no pause for a slow step (a loaded machine
# makes them), only those the foreground set's changes call for.
bg=$(TIDE_GUARD_PERCENT=100000 TIDE_LOG_LEVEL=info submit --background --np 1 --name bg -- $(replay bg 0.015)) || fail "submit bg"
wait_for 20 grep -q "^tide-replay" "$dir/jobs/$bg/log" || fail "bg took no step alone: $(tail -5 "$dir/jobs/$bg/log")"
jobs
[ "$(field "$bg" 3)" = running ] && [ "$(field "$bg" 4)" = bg ] && [ "$(field "$bg" 5)" = 1 ] ||
  fail "tide jobs does not show bg as a running background job on 1 worker: $(cat "$dir/jobs.txt")"
policy=none
for p in $(pgrep -f -- "$mark"bg); do
  [ "$(cat /proc/"$p"/comm 2> /dev/null)" = tide-replay ] && policy=$(cut -d' ' -f19,41 /proc/"$p"/stat)
done
[ "$policy" = "0 5" ] || [ "$policy" = "19 0" ] || fail "bg's worker runs at nice/policy '$policy', not SCHED_IDLE"

# Foreground c holds one slot, so that foreground a starts on the other and
# stays on 1 worker until c is cancelled.
c=$(submit --min-np 1 --max-np 1 --name c -- $(replay c 1)) || fail "submit c"
a=$(submit --min-np 1 --max-np 2 --name a -- $(replay a 0.03)) || fail "submit a"
at="127.0.0.1:$(sed -n 's/^port //p' "$dir/jobs/$a/state")" # a's store, as the guard names it
solo_of() { guard | sed -n "s/.*foreground at $at: solo step \([0-9.]*\) s on $1 worker(s).*/\1/p" | head -1; }
has_solo() { [ -n "$(solo_of "$1")" ]; }
wait_for 30 guard_says "watching the foreground at $at" || fail "the guard never watched a ($at)"
wait_for 40 has_solo 1 || fail "a's 1-worker solo step never reached the guard: $(guard | tail -5)"
solo1=$(solo_of 1)
"$tools/tide" cancel --dir "$dir" c > /dev/null || fail "cancel c"
wait_for 30 grep -q "job $a (a) runs on 2 worker(s)" "$tmp/sched.log" || fail "a never grew to 2 workers"
# A new size: the guard waits for a's solo step there.
wait_for 30 guard_says "at $at runs on 2 worker(s) now (was 1); its solo step there: to be measured" ||
  fail "the guard did not wait for a's 2-worker solo step: $(guard | tail -5)"
wait_for 40 has_solo 2 || fail "a's 2-worker solo step never reached the guard: $(guard | tail -5)"
solo2=$(solo_of 2)
jobs
[ "$(field "$bg" 4)" = bg ] && [ "$(field "$a" 4)" = 2 ] || fail "slots: $(cat "$dir/jobs.txt")"
grep -q "^$bg .*step=[0-9]*,pauses=[1-9]" "$dir/jobs.txt" || fail "tide jobs shows no progress for bg: $(cat "$dir/jobs.txt")"

# Foreground b: a shrinks back to 1 worker, whose solo step its store kept.
b=$(submit --min-np 1 --max-np 1 --name b -- $(replay b 0.003)) || fail "submit b"
wait_for 30 grep -q "job $a (a) runs on 1 worker(s)" "$tmp/sched.log" || fail "a never shrank to 1 worker"
wait_for 30 guard_says "at $at runs on 1 worker(s) now (was 2); its solo step there: known" ||
  fail "the guard did not take a's 1-worker solo step back: $(guard | tail -5)"
back=$(guard | sed -n "s/.*at $at runs on 1 worker(s) now (was 2); its solo step there: known, \([0-9.]*\) s.*/\1/p" | head -1)
echo "a's solo step: $solo1 s on 1 worker, $solo2 s on 2, $back s on 1 again"
# (Its value in the store is its latest 1-worker estimate: near the first,
# and nearer it than the 2-worker one, which the load may bring close.)
awk -v s1="$solo1" -v s2="$solo2" -v b="$back" 'function abs(x) { return x < 0 ? -x : x }
  BEGIN { exit !(b > 0 && b > 0.8 * s1 && b < 1.25 * s1 && abs(b - s1) <= abs(b - s2)) }' ||
  fail "a's solo step back on 1 worker ($back s) is not its 1-worker one ($solo1 s; 2 workers: $solo2 s)"

# A second background job, cancelled while it runs: a no longer counts it.
bg2=$(TIDE_GUARD_PERCENT=100000 submit --background --np 1 --name bg2 -- $(replay bg2 1)) || fail "submit bg2"
a_counts() { jobs && [ "$(field "$a" 13)" = "backgrounds=$1" ]; }
wait_for 30 a_counts 2 || fail "a never counted both background jobs: $(cat "$dir/jobs.txt")"
"$tools/tide" cancel --dir "$dir" "$bg2" > /dev/null || fail "cancel bg2"
wait_for 20 grep -q "job $bg2 (bg2) ended while running beside [12] foreground(s)" "$tmp/sched.log" ||
  fail "bg2 was not taken out of the foregrounds' counts"
wait_for 20 a_counts 1 || fail "a still counts bg2: $(cat "$dir/jobs.txt")"

# Everything ends; the background last, every step once. a's work outlasts
# the checks above on a slow machine: it is cancelled, not waited for.
bg_at=$(grep '^tide-replay' "$dir/jobs/$bg/log" | tail -1 | sed 's/^tide-replay [^ ]*: //') # printed at the end
"$tools/tide" cancel --dir "$dir" "$a" > /dev/null || fail "cancel a"
wait_for 30 is_state "$a" cancelled || fail "a is $(state_of "$a"), not cancelled"
wait_for 30 is_state "$b" done || fail "b did not finish: $(state_of "$b")"
is_state "$c" cancelled || fail "c is $(state_of "$c"), not cancelled"
# Under SCHED_IDLE on cores other tests keep busy (ctest -j) the background
# may crawl: past 60 s it is cancelled, and its steps up to then are checked.
if ! wait_for 60 is_state "$bg" done; then
  echo "bg still runs 60 s after the foregrounds ended (SCHED_IDLE on busy cores?): cancelled"
  "$tools/tide" cancel --dir "$dir" "$bg" > /dev/null || fail "cancel bg"
fi
for j in "$bg" "$bg2" "$a" "$b" "$c"; do steps_ok "$dir/jobs/$j/log" || fail "job $j's steps are not each once in order"; done
pauses=$(guard | grep -c "multiplexing: pausing")
resumes=$(guard | grep -c "multiplexing: running")
[ "$pauses" -ge 2 ] && [ "$resumes" -ge 2 ] || fail "bg paused $pauses and resumed $resumes time(s): $(guard)"
guard_says "no longer watched" || fail "the guard did not let the ended foregrounds go"
jobs
grep -Eq "^$bg .* (done|cancelled) .*step=[0-9]+,pauses=[1-9]" "$dir/jobs.txt" || fail "tide jobs at the end: $(cat "$dir/jobs.txt")"
none_left() { ! pgrep -f -- "$mark" > /dev/null; }
wait_for 10 none_left || fail "processes of the jobs outlived them: $(pgrep -af -- "$mark")"
for j in "$bg" "$bg2" "$a" "$b" "$c"; do ! kill -0 "$(keeper_of "$j")" 2> /dev/null || fail "job $j's keeper outlived it"; done

if [ $fails -ne 0 ]; then
  echo "--- scheduler"; cat "$tmp/sched.log"; echo "--- bg"; tail -40 "$dir/jobs/$bg/log"
  echo "--- a"; grep -v "^tide-replay" "$dir/jobs/$a/log" | tail -20
  exit 1
fi
echo "bg when a was cancelled: $bg_at"
echo "sched_background: ok ($pauses pauses, $resumes resumes)"
