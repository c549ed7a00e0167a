#!/bin/bash
# tide sched over several hosts (docs/scheduling.md, "Several hosts"): 2
# emulated hosts x 2 slots (scripts/emulate-cluster.sh), one agent per host,
# the scheduler on host 0 with --hostfile, 2 small trace-replay jobs. Checks:
# a job grows across both hosts and shrinks back in place (its step counter
# goes on, no worker restarted from scratch), workers really run on host 1,
# then host 0's agent and workers die (SIGKILL): the scheduler sees the host
# lost and job a goes on and finishes on host 1; both jobs finish done,
# nothing of any job outlives it.
# Skips (77) without root / network namespaces, as the other emulated tests.
# Usage: sched_hosts.sh BUILD_DIR SOURCE_DIR
set -u
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
traces=$src/../shared/data/pollux-osdi21/traces
[ -d "$traces" ] || { echo "SKIP: no traces at $traces"; exit 77; }
tmp=$(mktemp -d /tmp/tide-sched-hosts.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
mark=sh$$x
printf '10.213.0.1 2\n10.213.0.2 2\n' > "$tmp/hosts"
# Runs on each emulated host (one rank per host): the agent everywhere, the
# scheduler and the submissions on host 0.
cat > "$tmp/driver.sh" <<'DRIVER'
#!/bin/bash
set -u
tools=$1 tmp=$2 traces=$3 mark=$4
dir=$tmp/d
node=$TIDE_NODE_RANK
unset TIDE_RANK TIDE_SIZE TIDE_LOCAL_RANK TIDE_LOCAL_SIZE TIDE_NNODES TIDE_RDZV TIDE_JOB_TOKEN TIDE_JOB_ID TIDE_NODE_RANK
if [ "$node" != 0 ]; then
  "$tools/tide" sched --agent --dir "$dir" --node "$node" 2> "$tmp/agent$node.log"
  exit 0
fi
mkdir -p "$dir"
"$tools/tide" sched --hostfile "$tmp/hosts" --interval 0.5 --dir "$dir" > "$tmp/sched.log" 2>&1 &
daemon=$!
"$tools/tide" sched --agent --dir "$dir" --node 0 2> "$tmp/agent0.log" &
agent=$!
for _ in $(seq 100); do "$tools/tide" jobs --dir "$dir" > /dev/null 2>&1 && break; sleep 0.1; done
# The flat ring: with the hierarchical allreduce (the default on 2 hosts x 2) the survivors of host 1's
# death hung in 1 of 3 runs (docs/scheduling.md, "Several hosts").
export TIDE_ALGO=ring
replay() {
  "$tools/tide" submit --dir "$dir" --min-np 1 --max-np 4 --name "$1" -- "$tools/tide-replay" --app cifar10 \
    --traces "$traces" --speed 5 --work "$2" --grad-floats 65536 --log-every 5 --name "$mark$1"
}
wait_for() { local n=$(($1 * 10)); shift; for _ in $(seq "$n"); do "$@" && return 0; sleep 0.1; done; return 1; }
state_of() { sed -n 's/^state //p' "$dir/jobs/$1/state"; }
is_state() { [ "$(state_of "$1")" = "$2" ]; }
ended() { grep -q '^state \(done\|failed\|cancelled\)' "$dir/jobs/$1/state"; }
rc=0
a=$(replay a 0.1) || { echo "FAIL: submit a"; rc=1; }
wait_for 60 grep -q "job $a (a) runs on 2 2 worker(s)" "$tmp/sched.log" || { echo "FAIL: a never ran on both hosts (2 2)"; rc=1; }
b=$(replay b 0.03) || { echo "FAIL: submit b"; rc=1; }
wait_for 60 grep -Eq "job $a \(a\): 2 2 -> [0-9] [0-9]" "$tmp/sched.log" || { echo "FAIL: a was never shrunk for b"; rc=1; }
echo "$a $b" > "$tmp/ids"
wait_for 120 ended "$b" && is_state "$b" done || { echo "FAIL: b is $(state_of "$b")"; rc=1; }
# a gets host 0 back, then host 1 dies under it.
both_again() { [ "$(grep -c "job $a (a) runs on 2 2 worker" "$tmp/sched.log")" -ge 2 ]; }
wait_for 30 both_again || { echo "FAIL: a never got both hosts back"; rc=1; }
# Kill only once a has stepped on all 4 workers again: a host lost while the
# new membership is still connecting is not recovered yet (the retry meets the
# failed attempt's shared-memory segments; docs/scheduling.md, Limits).
n4=$(wc -l < "$dir/jobs/$a/log")
stepped4() { tail -n +"$((n4 + 1))" "$dir/jobs/$a/log" | grep -q "workers 4 batch"; }
wait_for 30 stepped4 || { echo "FAIL: a never stepped on 4 workers again"; rc=1; }
# Host 0's agent and its workers die (a's newest members; its rank 0 is on host 1: losing the host of
# rank 0 is not reliable yet, see docs/scheduling.md). The scheduler itself stays up on host 0.
kill -STOP "$agent" && pkill -9 -P "$agent" && kill -9 "$agent" || { echo "FAIL: no agent on host 0"; rc=1; }
wait_for 20 grep -q "host 0 (10.213.0.1) is lost" "$tmp/sched.log" || { echo "FAIL: host 0 was not seen lost"; rc=1; }
wait_for 40 grep -q "job $a (a) .*runs on 0 [12] worker" <(grep -A100 "is lost" "$tmp/sched.log") ||
  is_state "$a" done || { echo "FAIL: a did not go on on host 1"; rc=1; }
wait_for 120 ended "$a" && is_state "$a" done || { echo "FAIL: a is $(state_of "$a")"; rc=1; }
"$tools/tide" jobs --dir "$dir" > "$tmp/jobs.txt" 2>&1
echo "$a $b" > "$tmp/ids"
kill "$daemon"; wait "$daemon" "$agent" 2> /dev/null
exit $rc
DRIVER
chmod +x "$tmp/driver.sh"
"$src/scripts/emulate-cluster.sh" --build "$build" --hosts 2 --ranks-per-host 1 --bandwidth 1gbit --latency 0.5ms \
  --no-prefix --timeout 170 -- /bin/bash "$tmp/driver.sh" "$build/tools" "$tmp" "$traces" "$mark" > "$tmp/emu.log" 2>&1
rc=$?
[ $rc -eq 77 ] && { cat "$tmp/emu.log"; echo "SKIP: no emulated hosts"; exit 77; }
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
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
sleep 1
pgrep -f -- "$mark" > /dev/null && fail "processes of the jobs outlived them: $(pgrep -af -- "$mark")"
if [ $fails -ne 0 ]; then
  echo "--- emulate"; tail -30 "$tmp/emu.log"; echo "--- scheduler"; cat "$tmp/sched.log"
  for f in "$tmp"/agent*.log; do echo "--- $f"; tail -5 "$f"; done
  [ -n "${a:-}" ] && { echo "--- a"; grep -v '^tide-replay' "$dir/jobs/$a/log" | tail -30; tail -3 "$dir/jobs/$a/log"; }
  exit 1
fi
cat "$tmp/sched.log"
echo "sched_hosts: ok"
