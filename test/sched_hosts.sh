#!/bin/bash
# tide sched over several hosts (docs/scheduling.md, "Several hosts"): 2
# emulated hosts x 2 slots (scripts/emulate-cluster.sh), one agent per host,
# the scheduler on host 0 with --hostfile, 2 small trace-replay jobs. Checks:
# a job grows across both hosts and shrinks back in place (its step counter
# goes on, no worker restarted from scratch), workers really run on host 1,
# then the agent and workers of the host of job a's rank 0 die (SIGKILL;
# KILL=newest: the other host, a's newest members): the scheduler sees the
# host lost and job a goes on and finishes on the other host; both jobs
# finish done, nothing of any job outlives it. Every wait polls the
# scheduler's log or the jobs' state files with a generous deadline, so a
# slow (sanitized, loaded) run waits longer instead of failing.
# Skips (77) without root / network namespaces, as the other emulated tests.
# Usage: [KILL=rank0|newest] sched_hosts.sh BUILD_DIR SOURCE_DIR
set -u
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
traces=$src/../shared/data/pollux-osdi21/traces
[ -d "$traces" ] || { echo "SKIP: no traces at $traces"; exit 77; }
kill_which=${KILL:-rank0}
case $kill_which in rank0|newest) ;; *) echo "KILL=$kill_which: expected rank0 or newest"; exit 2 ;; esac
tmp=$(mktemp -d /tmp/tide-sched-hosts.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
# The segments the killed host's workers had not yet unlinked would go with
# that host's /dev/shm; emulated hosts share this machine's, so the test
# removes them itself at the end (those created during the run, at most the
# victim's 2 slots).
touch "$tmp/start"
mark=sh$$x
printf '10.213.0.1 2\n10.213.0.2 2\n' > "$tmp/hosts"
# Runs on each emulated host (one rank per host): the agent everywhere, the
# scheduler and the submissions on host 0.
cat > "$tmp/driver.sh" <<'DRIVER'
#!/bin/bash
set -u
tools=$1 tmp=$2 traces=$3 mark=$4 kill_which=$5
dir=$tmp/d
node=$TIDE_NODE_RANK
unset TIDE_RANK TIDE_SIZE TIDE_LOCAL_RANK TIDE_LOCAL_SIZE TIDE_NNODES TIDE_RDZV TIDE_JOB_TOKEN TIDE_JOB_ID TIDE_NODE_RANK
if [ "$node" != 0 ]; then
  "$tools/tide" sched --agent --dir "$dir" --node "$node" 2> "$tmp/agent$node.log" &
  echo $! > "$tmp/agent$node.pid"
  wait
  exit 0
fi
mkdir -p "$dir"
"$tools/tide" sched --hostfile "$tmp/hosts" --interval 0.5 --dir "$dir" > "$tmp/sched.log" 2>&1 &
daemon=$!
"$tools/tide" sched --agent --dir "$dir" --node 0 2> "$tmp/agent0.log" &
agent=$!
echo $agent > "$tmp/agent0.pid"
for _ in $(seq 300); do "$tools/tide" jobs --dir "$dir" > /dev/null 2>&1 && break; sleep 0.1; done
replay() {
  "$tools/tide" submit --dir "$dir" --min-np 1 --max-np 4 --name "$1" -- "$tools/tide-replay" --app cifar10 \
    --traces "$traces" --speed 5 --work "$2" --grad-floats 65536 --log-every 5 --name "$mark$1"
}
# Polls up to $1 s; after a failure it only looks once (the run is failed, later waits need not wait).
wait_for() { local n=$(($1 * 10)); shift; [ $rc -ne 0 ] && n=1; for _ in $(seq "$n"); do "$@" && return 0; sleep 0.1; done; return 1; }
state_of() { sed -n 's/^state //p' "$dir/jobs/$1/state"; }
is_state() { [ "$(state_of "$1")" = "$2" ]; }
ended() { grep -q '^state \(done\|failed\|cancelled\)' "$dir/jobs/$1/state"; }
rc=0
a=$(replay a 0.035) || { echo "FAIL: submit a"; rc=1; }
# Generous deadlines: each wait ends as soon as its condition holds.
wait_for 120 grep -q "job $a (a) runs on 2 2 worker(s)" "$tmp/sched.log" || { echo "FAIL: a never ran on both hosts (2 2)"; rc=1; }
# b comes once a has stepped on 4 workers (slow runs would shrink it first).
wait_for 120 grep -q "workers 4 batch" "$dir/jobs/$a/log" || { echo "FAIL: a never stepped on 4 workers"; rc=1; }
b=$(replay b 0.01) || { echo "FAIL: submit b"; rc=1; }
wait_for 120 grep -Eq "job $a \(a\): 2 2 -> [0-9] [0-9]" "$tmp/sched.log" || { echo "FAIL: a was never shrunk for b"; rc=1; }
echo "$a $b" > "$tmp/ids"
wait_for 240 ended "$b" && is_state "$b" done || { echo "FAIL: b is $(state_of "$b")"; rc=1; }
# a gets both hosts back, then one of them dies under it. KILL=rank0: once a
# has stepped on all 4 workers again (its joiners have taken the training
# state over: a host lost before that takes every member that has a state
# with it when it is rank 0's, and the job cannot go on). KILL=newest: at
# once after the decision to grow back, while the joiners start, wait to be
# admitted or connect the new epoch.
if [ "$kill_which" = newest ]; then
  grown_again() { [ "$(grep -Ec "job $a \(a\): [0-9] [0-9] -> 2 2" "$tmp/sched.log")" -ge 2 ]; }
  wait_for 120 grown_again || { echo "FAIL: a was never grown back to 2 2"; rc=1; }
else
  both_again() { [ "$(grep -c "job $a (a) runs on 2 2 worker" "$tmp/sched.log")" -ge 2 ]; }
  wait_for 120 both_again || { echo "FAIL: a never got both hosts back"; rc=1; }
  n4=$(wc -l < "$dir/jobs/$a/log")
  stepped4() { tail -n +"$((n4 + 1))" "$dir/jobs/$a/log" | grep -q "workers 4 batch"; }
  wait_for 120 stepped4 || { echo "FAIL: a never stepped on 4 workers again"; rc=1; }
fi
# The host of a's rank 0: ranks go by seniority and a shrink takes the newest
# members off a host first, so rank 0 stays where it started until a change
# takes every member off its host; then it is on the other one.
host0=$(awk -v job="job $a (a)" 'index($0, job) {
    if ($0 ~ /starts on/) { h = ($(NF) > 0 && $(NF - 1) == 0) ? 1 : 0 }
    else if ($0 ~ / -> /) { split($0, p, " -> "); split(p[2], c, " "); if (c[h + 1] == 0) h = 1 - h }
  } END { print h }' "$tmp/sched.log")
victim=$host0
[ "$kill_which" = newest ] && victim=$((1 - host0))
echo "$host0 $victim" > "$tmp/victim"
survivor=$((1 - victim))
agent_v=$(cat "$tmp/agent$victim.pid" 2> /dev/null)
# That host's agent and its workers die. The scheduler itself stays up on host 0.
# (a's progress then, printed at the end: its work must leave it running up to here.)
grep '^tide-replay' "$dir/jobs/$a/log" | tail -1 > "$tmp/at_kill"
[ -n "$agent_v" ] && kill -STOP "$agent_v" && pkill -9 -P "$agent_v" && kill -9 "$agent_v" ||
  { echo "FAIL: no agent on host $victim"; rc=1; }
wait_for 60 grep -q "host $victim (10.213.0.$((victim + 1))) is lost" "$tmp/sched.log" ||
  { echo "FAIL: host $victim was not seen lost"; rc=1; }
on_survivor="runs on 0 [12] worker"
[ $survivor = 0 ] && on_survivor="runs on [12] 0 worker"
# (A function, not grep on <(...): a process substitution is read once, so
# every later poll would read an empty pipe and wait out the deadline.)
goes_on() { grep -A100 "is lost" "$tmp/sched.log" | grep -q "job $a (a) .*$on_survivor"; }
wait_for 120 goes_on ||
  is_state "$a" done || { echo "FAIL: a did not go on on host $survivor"; rc=1; }
wait_for 300 ended "$a" && is_state "$a" done || { echo "FAIL: a is $(state_of "$a")"; rc=1; }
"$tools/tide" jobs --dir "$dir" > "$tmp/jobs.txt" 2>&1
echo "$a $b" > "$tmp/ids"
# The agents wait for a new tide sched to take their jobs over: every job
# has ended, so the test stops them (the other host's driver waits on its own).
kill "$daemon"
for f in "$tmp"/agent*.pid; do kill "$(cat "$f")" 2> /dev/null; done
wait "$daemon" "$agent" 2> /dev/null
exit $rc
DRIVER
chmod +x "$tmp/driver.sh"
"$src/scripts/emulate-cluster.sh" --build "$build" --hosts 2 --ranks-per-host 1 --bandwidth 1gbit --latency 0.5ms \
  --no-prefix --timeout 540 -- /bin/bash "$tmp/driver.sh" "$build/tools" "$tmp" "$traces" "$mark" "$kill_which" \
  > "$tmp/emu.log" 2>&1
rc=$?
[ $rc -eq 77 ] && { cat "$tmp/emu.log"; echo "SKIP: no emulated hosts"; exit 77; }
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
left=$(find /dev/shm -maxdepth 1 -name 'tide-*-x*' -newer "$tmp/start" 2> /dev/null)
[ -n "$left" ] && echo "the killed host's segments, removed:" $left && rm -f $left
[ "$(echo "$left" | grep -c .)" -le 2 ] || fail "more segments left in /dev/shm than the killed host's 2 slots"
[ $rc -eq 0 ] || fail "the run exited $rc"
read -r a b < "$tmp/ids" 2> /dev/null || fail "no job ids"
dir=$tmp/d
if [ -n "${a:-}" ]; then
  # In place: a's steps go on across its sizes; it ran 4 and fewer workers.
  awk '/^tide-replay [^ ]*: step [0-9]+ workers/ { s = $4; if (s <= last) { print "step " s " after " last; bad = 1 } last = s }
       END { exit bad }' "$dir/jobs/$a/log" || fail "a's step counter did not go on across the resizes"
  grep -q "workers 4 batch" "$dir/jobs/$a/log" || fail "a's log has no step on 4 workers (2 hosts)"
  grep -Eq "workers [123] batch" "$dir/jobs/$a/log" || fail "a's log has no step on fewer workers"
  grep -q "runs on 2 2 worker" "$tmp/sched.log" || fail "a never ran on 2 + 2"
fi
gone() { ! pgrep -f -- "$mark" > /dev/null; }
for _ in $(seq 100); do gone && break; sleep 0.1; done
gone || fail "processes of the jobs outlived them: $(pgrep -af -- "$mark")"
if [ $fails -ne 0 ]; then
  echo "--- emulate"; tail -30 "$tmp/emu.log"; echo "--- scheduler"; cat "$tmp/sched.log"
  for f in "$tmp"/agent*.log; do echo "--- $f"; tail -5 "$f"; done
  [ -n "${a:-}" ] && { echo "--- a"; grep -v '^tide-replay' "$dir/jobs/$a/log" | tail -30; tail -3 "$dir/jobs/$a/log"; }
  exit 1
fi
cat "$tmp/sched.log"
echo "--- a's recovery (its workers' warnings)"
grep -E "tide (warn|error)" "$dir/jobs/$a/log" | grep -Ev "watcher|sampler" | cut -c1-300 | head -12
read -r host0 victim < "$tmp/victim"
echo "a at the kill: $(sed 's/^tide-replay [^ ]*: //' "$tmp/at_kill" 2> /dev/null)"
echo "sched_hosts: ok (a's rank 0 was on host $host0; host $victim was killed)"
