#!/bin/bash
# tide sched under a real Slurm 22.05 on 2 emulated hosts x 2 CPUs
# (scripts/emulate-cluster.sh --slurm), started from one sbatch: the batch
# script makes the hostfile from SLURM_JOB_NODELIST, runs tide sched on the
# first node and one agent per node with srun, submits two trace-replay jobs
# and waits for them. Checks: both jobs done, one ran on both nodes.
# Skips (77) where the cluster cannot be made. Usage: sched_slurm.sh BUILD_DIR SOURCE_DIR
set -u
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
traces=$src/../shared/data/pollux-osdi21/traces
[ -d "$traces" ] || { echo "SKIP: no traces at $traces"; exit 77; }
tmp=$(mktemp -d /tmp/tide-sched-slurm.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
cat > "$tmp/job.sh" <<EOF2
#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node=1
#SBATCH -o $tmp/batch.out
tools=$build/tools
dir=$tmp/d
mkdir -p \$dir
scontrol show hostnames "\$SLURM_JOB_NODELIST" | awk '{ print \$1, 2 }' > $tmp/hosts
addr=\$(hostname -I | awk '{ print \$1 }')
\$tools/tide sched --hostfile $tmp/hosts --address \$addr --interval 0.5 --dir \$dir > $tmp/sched.log 2>&1 &
daemon=\$!
srun --ntasks-per-node=1 bash -c "\$tools/tide sched --agent --dir \$dir 2> $tmp/agent.\\\$SLURM_NODEID.log" &
agents=\$!
for _ in \$(seq 100); do \$tools/tide jobs --dir \$dir > /dev/null 2>&1 && break; sleep 0.1; done
export TIDE_ALGO=ring
for j in a:0.05 b:0.02; do
  \$tools/tide submit --dir \$dir --min-np 1 --max-np 4 --name \${j%:*} -- \$tools/tide-replay --app cifar10 \\
    --traces $traces --speed 5 --work \${j#*:} --grad-floats 65536 --log-every 5 --name sl\${j%:*}
  sleep 3
done
for _ in \$(seq 900); do
  [ \$(grep -l '^state \\(done\\|failed\\|cancelled\\)' \$dir/jobs/*/state 2> /dev/null | wc -l) -ge 2 ] && break
  sleep 0.2
done
\$tools/tide jobs --dir \$dir > $tmp/jobs.txt 2>&1
kill \$daemon; scancel --signal=TERM "\$SLURM_JOB_ID.0" 2> /dev/null; sleep 1
grep -c '^state done' \$dir/jobs/*/state | grep -c ':1\$' > $tmp/done
EOF2
"$src/scripts/emulate-cluster.sh" --slurm --build "$build" --hosts 2 --ranks-per-host 2 -- \
  sbatch --wait "$tmp/job.sh" > "$tmp/emu.log" 2>&1
rc=$?
[ $rc -eq 77 ] && { cat "$tmp/emu.log"; echo "SKIP: no emulated Slurm"; exit 77; }
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
[ "$(cat "$tmp/done" 2> /dev/null)" = 2 ] || fail "not both jobs done: $(cat "$tmp/jobs.txt" 2> /dev/null)"
grep -Eq "runs on [1-9] [1-9] worker" "$tmp/sched.log" || fail "no job ran on both nodes"
if [ $fails -ne 0 ]; then
  echo "--- emulate (rc $rc)"; tail -20 "$tmp/emu.log"; echo "--- batch"; tail -20 "$tmp/batch.out"
  echo "--- scheduler"; cat "$tmp/sched.log"; for f in "$tmp"/agent.*.log; do echo "--- $f"; tail -5 "$f"; done
  exit 1
fi
cat "$tmp/sched.log"
echo "sched_slurm: ok"
