#!/usr/bin/env bash
# tide under a real Slurm 22.05 (Debian's slurmctld, slurmd, munge) on 2
# emulated hosts x 2 CPUs, brought up by scripts/emulate-cluster.sh --slurm;
# each host's /etc/hosts maps its own name to 127.0.1.1 as Debian does, and
# no TIDE_* variable is set:
#   1. srun -N 2 -n 4 tide-train trains to the end (rendezvous derived from
#      SLURM_STEP_NODELIST and the job and step ids); the derived-token
#      warning is printed once;
#   2. an sbatch job of 2 nodes x 2 tasks completes (Slurm records COMPLETED);
#      a batch script running tide-train itself, without srun, fails at once
#      saying to use srun;
#   3. two jobs at once with the same first node both train;
#   4. TIDE_RDZV=emu0:PORT given by hand: rank 0's host resolves emu0 to
#      127.0.1.1, yet it publishes an address the other host reaches;
#   5. TIDE_SOCKET_IFNAME naming no interface: every rank fails at once with
#      a message naming it (not a wait of TIDE_TIMEOUT_MS);
#   6. a launcher that does not say the job spans hosts (Slurm's node counts
#      removed): rank 0's loopback address is caught by every rank at once;
#   7. an elastic job (TIDE_ELASTIC=1, TIDE_ALGO=ring) of 2 nodes x 2 tasks shrunk to one node
#      with `scontrol update NumNodes=1` goes on with 2 workers, trains to the
#      end, and Slurm records it COMPLETED (the batch script exits with rank
#      0's status: srun's is 137 for the killed tasks).
# Exit 77 (skipped) where the hosts or Slurm cannot be made: not root, no
# namespaces, Slurm or munge not installed (scripts/install-deps.sh).
# usage: test/slurm_cluster.sh BUILD_DIR
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [ "${1:-}" != --inside ]; then
  build=$(cd "${1:?usage: slurm_cluster.sh BUILD_DIR}" && pwd)
  [ -x "$build/tools/tide-train" ] || { echo "slurm_cluster: no $build/tools/tide-train: skipped" >&2; exit 77; }
  # No TIDE_* from the caller: the point is that none is needed.
  for v in $(env | sed -n 's/^\(TIDE_[A-Z0-9_]*\)=.*/\1/p'); do unset "$v"; done
  exec bash "$here/../scripts/emulate-cluster.sh" --slurm --hosts 2 --ranks-per-host 2 --bandwidth none --latency 0 \
    --build "$build" -- bash "$here/slurm_cluster.sh" --inside
fi

# --- on the head host, with SLURM_CONF set ---------------------------------------
train=$TIDE_EMU_BUILD/tools/tide-train
work=$TIDE_EMU_SLURM_DIR/work
mkdir -p "$work" && cd "$work" || exit 1
args=(--model mlp --epochs 1 --batch 32 --subset 1500 --runs "$work/runs")
fail() { echo "slurm_cluster: FAILED: $*" >&2; exit 1; }
. "$here/slurm_lib.sh" # slurm_wait
# Each srun is bounded: a rendezvous that hangs fails the test, not ctest's timeout.
srun_() { timeout 120 srun --time=2 "$@"; }

echo "-- 1. srun -N 2 -n 4 tide-train, no TIDE_* set"
srun_ -N 2 -n 4 "$train" "${args[@]}" >out1 2>&1
rc=$?
cat out1
[ "$rc" = 0 ] || fail "srun -N 2 -n 4 tide-train exited $rc"
grep -q "replicas identical: yes" out1 || fail "tide-train did not train to the end"
grep -q "4 workers" out1 || fail "tide-train did not see 4 workers"
n=$(grep -c "TIDE_JOB_TOKEN is not set" out1)
[ "$n" = 1 ] || fail "the derived-token warning was printed $n times, not once"

echo "-- 2. sbatch: 2 nodes x 2 tasks"
cat >job.sh <<EOF
#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
#SBATCH -o $work/out2
srun $train ${args[*]}
EOF
jobid=$(sbatch --parsable job.sh) || fail "sbatch job.sh"
state=$(slurm_wait "$jobid" 150)
cat out2
grep -q "replicas identical: yes" out2 || fail "the sbatch job did not train to the end"
echo "job $jobid: $state"
[ "$state" = COMPLETED ] || fail "Slurm recorded job $jobid as $state, not COMPLETED"

echo "-- 2b. sbatch running tide-train itself, without srun: a clear error at once, not a wait"
jobid=$(sbatch --parsable -N 2 --ntasks-per-node=2 -o "$work/out2b" --wrap "$train ${args[*]}") || fail "sbatch --wrap"
state=$(slurm_wait "$jobid" 150)
cat out2b
echo "job $jobid: $state"
[ "$state" = FAILED ] || fail "tide-train run by the batch script itself with SLURM_NTASKS=4 should fail (job $jobid: $state)"
grep -q "start the program with srun" out2b || fail "the error does not say to start the program with srun"

echo "-- 3. two jobs at once, both with first node emu0"
srun_ -N 2 --ntasks-per-node=1 -w emu0,emu1 "$train" "${args[@]}" --runs "$work/runs-a" >out3a 2>&1 &
a=$!
srun_ -N 2 --ntasks-per-node=1 -w emu0,emu1 "$train" "${args[@]}" --runs "$work/runs-b" >out3b 2>&1 &
b=$!
wait "$a"; ra=$?
wait "$b"; rb=$?
cat out3a out3b
[ "$ra" = 0 ] && [ "$rb" = 0 ] || fail "two jobs at once: exit statuses $ra and $rb"
grep -q "replicas identical: yes" out3a && grep -q "replicas identical: yes" out3b || fail "a job of the two did not finish"

echo "-- 4. TIDE_RDZV=emu0:PORT by hand (emu0 is 127.0.1.1 on emu0)"
TIDE_RDZV=emu0:29555 TIDE_TIMEOUT_MS=30000 srun_ -N 2 -n 4 "$train" "${args[@]}" >out4 2>&1
rc=$?
cat out4
[ "$rc" = 0 ] || fail "with TIDE_RDZV=emu0:29555, srun exited $rc"

echo "-- 5. TIDE_SOCKET_IFNAME=nosuch0: every rank fails at once, naming it"
TIDE_SOCKET_IFNAME=nosuch0 srun_ -N 2 -n 2 "$train" "${args[@]}" >out5 2>&1
rc=$?
cat out5
[ "$rc" != 0 ] || fail "TIDE_SOCKET_IFNAME=nosuch0 should fail"
n=$(grep -c "TIDE_SOCKET_IFNAME=nosuch0: no IPv4 address" out5)
[ "$n" = 2 ] || fail "$n rank(s) of 2 named TIDE_SOCKET_IFNAME in their error (the others waited)"
echo "-- 6. a launcher that does not say the job spans hosts: a loopback address is caught at once"
# Without Slurm's node counts tide cannot tell that rank 0's loopback route
# is wrong; the address table then shows it, and every rank fails naming
# TIDE_SOCKET_IFNAME instead of waiting TIDE_TIMEOUT_MS.
TIDE_RDZV=emu0:29556 srun_ -N 2 -n 2 env -u SLURM_STEP_NUM_NODES -u SLURM_JOB_NUM_NODES -u SLURM_NNODES \
  -u SLURM_LAUNCH_NODE_IPADDR "$train" "${args[@]}" >out7 2>&1
rc=$?
cat out7
[ "$rc" != 0 ] || fail "a loopback address published for a 2-host job should fail"
n=$(grep -c "published the loopback address .*TIDE_SOCKET_IFNAME" out7)
[ "$n" = 2 ] || fail "$n rank(s) of 2 failed naming TIDE_SOCKET_IFNAME (the others waited)"

# The hierarchical allreduce (tide-train's choice on 2 hosts x 2): its local
# group must learn of the whole-job communicator's failure (docs/slurm.md);
# TEST_SLURM_ELASTIC_ALGO=ring runs the flat ring instead.
algo=${TEST_SLURM_ELASTIC_ALGO:-hier}
echo "-- 7. an elastic job (2 nodes x 2 tasks, TIDE_ALGO=$algo) shrunk to 1 node with scontrol: recorded COMPLETED"
# The recipe of docs/slurm.md: the batch script exits with rank 0's status,
# since srun's is 137 for the tasks Slurm killed.
# 2 epochs: the shrink, ordered at epoch 1's end, took effect 5 steps later (about 1 s under ASan),
# with an epoch (469 steps) to go; 4 epochs trained 2 more for nothing.
cat >elastic.sh <<JOB
#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
#SBATCH -o $work/out7e
export TIDE_ELASTIC=1 TIDE_ALGO=$algo
srun bash -c '$train --model mlp --epochs 2 --batch 32 --subset 60000 --runs $work/runs; rc=\$?; [ "\$SLURM_PROCID" = 0 ] && echo \$rc >$work/rank0.\$SLURM_JOB_ID; exit \$rc'
echo "srun exited \$?"
exit \$(cat $work/rank0.\$SLURM_JOB_ID 2>/dev/null || echo 1)
JOB
jobid=$(sbatch --parsable elastic.sh) || fail "sbatch elastic.sh"
for ((i = 0; i < 600; i++)); do grep -q "^epoch 1 (progress" out7e 2>/dev/null && break; sleep 0.1; done
scontrol update JobId="$jobid" NumNodes=1 || fail "scontrol update JobId=$jobid NumNodes=1"
state=$(slurm_wait "$jobid" 120)
grep -v "^epoch [0-9]\.[0-9]\|straggler" out7e
echo "job $jobid: $state"
grep -q "2 worker(s) go on" out7e || fail "the elastic job did not go on with 2 workers after the shrink"
grep -q "replicas identical: yes" out7e || fail "the shrunk elastic job did not train to the end"
[ "$state" = COMPLETED ] || { scancel "$jobid"; fail "Slurm recorded the shrunk elastic job $jobid as $state, not COMPLETED"; }

echo "slurm_cluster: ok"
