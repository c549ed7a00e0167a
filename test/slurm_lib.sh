# Sourced by the tests that run jobs under the emulated Slurm (slurm_cluster.sh, sched_slurm.sh).
#
# slurm_wait JOBID SECONDS: polls the job's state every 0.1 s until it has ended or SECONDS have
# passed; prints the state (COMPLETED, FAILED, CANCELLED, ...; when it has not ended, the last seen).
# Instead of `sbatch --wait`, which looks at the job after 2, 10, 42, 74 ... s (it sleeps 2 s, then
# 8, then 32 under the emulated cluster's MinJobAge=600): a batch job that ran 12 s was seen ended
# 42 s after its submission.
slurm_wait() {
  local state="" i
  for ((i = 0; i < $2 * 10; i++)); do
    state=$(scontrol show job "$1" 2> /dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    case $state in PENDING | RUNNING | CONFIGURING | COMPLETING | "") sleep 0.1 ;; *) break ;; esac
  done
  echo "$state"
}
