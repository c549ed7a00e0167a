#!/bin/bash
# tide sched under a real Slurm 22.05 on 2 emulated hosts x 2 CPUs
# (scripts/emulate-cluster.sh --slurm), started from one sbatch whose script
# is `tide sched --dir DIR &` plus submits: tide sched reads the allocation
# (SLURM_JOB_NODELIST, SLURM_JOB_CPUS_PER_NODE), finds the address the other
# node reaches it at (not 127.0.1.1) and starts one agent per node with srun.
# Checks: the pool is emu0 (2) emu1 (2), the agents reach 10.213.0.1, both
# jobs done, one ran on both nodes, nothing of the jobs outlives them, the
# agents' srun step stops with the daemon, and a second daemon whose agents
# are killed stops (exit 1) saying so.
# Skips (77) where the cluster cannot be made. Usage: sched_slurm.sh BUILD_DIR SOURCE_DIR
set -u
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
traces=$src/../shared/data/pollux-osdi21/traces
[ -d "$traces" ] || { echo "SKIP: no traces at $traces"; exit 77; }
tmp=$(mktemp -d /tmp/tide-sched-slurm.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
mark=ss$$x
cat > "$tmp/job.sh" <<EOF2
#!/bin/bash
#SBATCH -N 2
#SBATCH --exclusive
#SBATCH -o $tmp/batch.out
tools=$build/tools
dir=$tmp/d
\$tools/tide sched --interval 0.5 --dir \$dir > $tmp/sched.log 2>&1 &
daemon=\$!
for _ in \$(seq 100); do \$tools/tide jobs --dir \$dir > /dev/null 2>&1 && break; sleep 0.1; done
export TIDE_ALGO=ring
# b comes once a runs on both nodes (a poll, not a fixed sleep), so that a shrinks for it.
for j in a:0.01 b:0.005; do
  \$tools/tide submit --dir \$dir --min-np 1 --max-np 4 --name \${j%:*} -- \$tools/tide-replay --app cifar10 \\
    --traces $traces --speed 5 --work \${j#*:} --grad-floats 65536 --log-every 5 --name $mark\${j%:*}
  for _ in \$(seq 300); do grep -Eq "runs on [1-9] [1-9] worker" $tmp/sched.log && break; sleep 0.1; done
done
for _ in \$(seq 900); do
  [ \$(grep -l '^state \\(done\\|failed\\|cancelled\\)' \$dir/jobs/*/state 2> /dev/null | wc -l) -ge 2 ] && break
  sleep 0.2
done
\$tools/tide jobs --dir \$dir > $tmp/jobs.txt 2>&1
sleep 1
pgrep -af -- $mark > $tmp/outlived
kill \$daemon; wait \$daemon; echo \$? > $tmp/daemon.rc
for _ in \$(seq 50); do pgrep -f -- "sched --agent --dir \$dir" > /dev/null || break; sleep 0.1; done
pgrep -af -- "sched --agent --dir \$dir" > $tmp/agents.left
grep -c '^state done' \$dir/jobs/*/state | grep -c ':1\$' > $tmp/done
# A daemon whose agents' srun step ends under it stops, exit 1, saying so.
dir2=$tmp/d2
\$tools/tide sched --dir \$dir2 > $tmp/sched2.log 2>&1 &
daemon2=\$!
# The 2 agents themselves (srun's own 2 processes name them too).
for _ in \$(seq 100); do [ \$(pgrep -f -- "^[^ ]*/tide sched --agent --dir \$dir2" | wc -l) = 2 ] && break; sleep 0.1; done
sleep 1
kill \$(pgrep -f -- "sched --agent --dir \$dir2")
for _ in \$(seq 100); do kill -0 \$daemon2 2> /dev/null || break; sleep 0.1; done
kill -9 \$daemon2 2> /dev/null
wait \$daemon2; echo \$? > $tmp/daemon2.rc
EOF2
# sbatch, then slurm_wait (test/slurm_lib.sh) until the job has ended: 1 unless it COMPLETED.
"$src/scripts/emulate-cluster.sh" --slurm --build "$build" --hosts 2 --ranks-per-host 2 -- \
  bash -c '. "$1"; id=$(sbatch --parsable "$2") || exit 1; s=$(slurm_wait "$id" 180); echo "job $id: $s"; [ "$s" = COMPLETED ]' \
  slurm_wait "$src/test/slurm_lib.sh" "$tmp/job.sh" > "$tmp/emu.log" 2>&1
rc=$?
[ $rc -eq 77 ] && { cat "$tmp/emu.log"; echo "SKIP: no emulated Slurm"; exit 77; }
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
[ $rc -eq 0 ] || fail "the batch job did not complete (exit $rc)"
# The daemon prints that line in pieces right after starting srun, whose own first line can land
# in the middle of it (seen once under ASan): srun's line taken out, the lines joined.
sed 's/srun: cluster configuration lacks support for cpu binding//' "$tmp/sched.log" | tr -d '\n' |
  grep -q "Slurm job [0-9]*, 2 node(s): emu0 (2) emu1 (2)" || fail "the pool is not the allocation's emu0 (2) emu1 (2)"
grep -q "reach it at 10.213.0.1:" "$tmp/sched.log" || fail "the agents do not reach the daemon at emu0's 10.213.0.1"
[ "$(cat "$tmp/done" 2> /dev/null)" = 2 ] || fail "not both jobs done: $(cat "$tmp/jobs.txt" 2> /dev/null)"
grep -Eq "runs on [1-9] [1-9] worker" "$tmp/sched.log" || fail "no job ran on both nodes"
[ -s "$tmp/outlived" ] && fail "processes of the jobs outlived them: $(cat "$tmp/outlived")"
[ "$(cat "$tmp/daemon.rc" 2> /dev/null)" = 0 ] || fail "tide sched exited $(cat "$tmp/daemon.rc" 2> /dev/null) on SIGTERM"
[ -s "$tmp/agents.left" ] && fail "agents outlived the daemon: $(cat "$tmp/agents.left")"
[ "$(cat "$tmp/daemon2.rc" 2> /dev/null)" = 1 ] && grep -q "the nodes' agents (their srun step) ended" "$tmp/sched2.log" ||
  fail "a daemon whose agents were killed exited $(cat "$tmp/daemon2.rc" 2> /dev/null): $(cat "$tmp/sched2.log")"
if [ $fails -ne 0 ]; then
  echo "--- emulate (rc $rc)"; tail -20 "$tmp/emu.log"; echo "--- batch"; tail -20 "$tmp/batch.out"
  echo "--- scheduler"; cat "$tmp/sched.log"
  exit 1
fi
cat "$tmp/sched.log"
echo "sched_slurm: ok"
