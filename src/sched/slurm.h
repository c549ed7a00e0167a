/* tide sched inside a Slurm allocation (src/sched/slurm.c): the pool from
 * Slurm's environment, the daemon's address as the other hosts reach it,
 * and the srun step of the per-node agents. */
#ifndef TIDE_SCHED_SLURM_H
#define TIDE_SCHED_SLURM_H

#include <signal.h>
#include <sys/types.h>

#include "core/core.h"

enum { TIDE__SCHED_MAX_NODES = 64, TIDE__SCHED_HOST_MAX = 256 };

/* The hosts of a pool and their slots. */
typedef struct {
  int nodes;
  int slots[TIDE__SCHED_MAX_NODES];
  char host[TIDE__SCHED_MAX_NODES][TIDE__SCHED_HOST_MAX];
  const char *names[TIDE__SCHED_MAX_NODES]; /* names[i] == host[i] */
} tide__sched_pool_t;

/* Slurm's CPU counts per node ("4(x2),2": 4, 4, 2) into slots[0..nodes):
 * TIDE_EINVAL, naming `what` (the variable), for bad syntax, a count < 1,
 * or a list that does not cover exactly `nodes` nodes. */
int tide__slurm_cpus_per_node(const char *what, const char *text, int nodes, int *slots);
/* The pool of an allocation: nodelist (SLURM_JOB_NODELIST's syntax) in
 * order, slots_per_node slots each when > 0, else each node's count from
 * cpus_per_node (SLURM_JOB_CPUS_PER_NODE's). TIDE_EINVAL naming the
 * variable for a malformed one, or more than TIDE__SCHED_MAX_NODES nodes. */
int tide__sched_slurm_pool(const char *nodelist, const char *cpus_per_node, int slots_per_node,
                           tide__sched_pool_t *pool);
/* This host's address as the other hosts of a pool reach it: the local
 * address of the route to the first host that is not this one by name and
 * does not resolve to this machine; "127.0.0.1" when every host is this
 * machine. TIDE_EINVAL, naming the host and saying to give --address, when
 * a host does not resolve or has no route. `whence` names the host list in
 * messages. */
int tide__sched_address(const char *const *hosts, int nodes, const char *whence, char *addr, size_t cap);
/* Starts `srun --nodes=N --ntasks=N --ntasks-per-node=1 --overlap tide
 * sched --agent --dir dir` in its own process group with signal mask
 * `mask` and stdin from /dev/null; *pid gets srun's pid. */
int tide__sched_agents_start(const char *tide, const char *dir, int nodes, const sigset_t *mask, pid_t *pid);
/* Waits up to grace_s for that step to end (the daemon has told the
 * agents to quit: they stop their workers and exit 0, then srun does),
 * then SIGTERM to srun (srun SIGKILLs the tasks; Slurm's process tracking
 * takes their workers), then SIGKILL to srun after 10 s. pid <= 0: nothing. */
void tide__sched_agents_stop(pid_t pid, double grace_s);

#endif
