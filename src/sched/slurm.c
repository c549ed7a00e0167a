/* tide sched inside a Slurm allocation (docs/scheduling.md, "Slurm"): the
 * pool from SLURM_JOB_NODELIST (expanded by the launcher's hostlist parser,
 * src/comm/launcher.c) and SLURM_JOB_CPUS_PER_NODE, the address the other
 * hosts reach the daemon at, and the srun step that runs one agent per
 * node. Called by tide_sched_serve on its thread. */
#include "sched/slurm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"

/* ---- the allocation's nodes and CPUs ------------------------------------------------- */

/* A decimal count of at most 9 digits at *p; advances *p past it. */
static int parse_count(const char **p, long *out) {
  const char *s = *p;
  long v = 0;
  int digits = 0;
  while (*s >= '0' && *s <= '9') {
    if (++digits > 9) return -1;
    v = v * 10 + (*s++ - '0');
  }
  if (digits == 0) return -1;
  *p = s;
  *out = v;
  return 0;
}

int tide__slurm_cpus_per_node(const char *what, const char *text, int nodes, int *slots) {
  int got[TIDE__SCHED_MAX_NODES], filled = 0;
  if (nodes < 1 || nodes > TIDE__SCHED_MAX_NODES) {
    TIDE_ERROR("%s: %d nodes: between 1 and %d are handled", what, nodes, TIDE__SCHED_MAX_NODES);
    return TIDE_EINVAL;
  }
  if (text == NULL || text[0] == '\0') {
    TIDE_ERROR("%s is empty: no CPU count per node; give --slots-per-node N", what);
    return TIDE_EINVAL;
  }
  const char *p = text;
  for (;;) {
    long count, times = 1;
    const char *item = p;
    if (parse_count(&p, &count) != 0) goto bad;
    if (*p == '(') {
      if (p[1] != 'x') goto bad;
      p += 2;
      if (parse_count(&p, &times) != 0 || *p != ')') goto bad;
      p++;
    }
    if (count < 1 || times < 1) {
      TIDE_ERROR("%s=\"%s\": \"%.*s\" gives a node %s: every node needs at least 1 CPU; give --slots-per-node N",
                 what, text, (int)(p - item), item, count < 1 ? "no CPU" : "0 times");
      return TIDE_EINVAL;
    }
    if (times > nodes - filled) {
      TIDE_ERROR("%s=\"%s\" gives CPU counts for more than the %d node(s) of SLURM_JOB_NODELIST; give "
                 "--slots-per-node N",
                 what, text, nodes);
      return TIDE_EINVAL;
    }
    for (long k = 0; k < times; k++) got[filled++] = (int)count;
    if (*p == '\0') break;
    if (*p != ',') goto bad;
    p++;
  }
  if (filled != nodes) {
    TIDE_ERROR("%s=\"%s\" gives CPU counts for %d node(s), SLURM_JOB_NODELIST names %d; give --slots-per-node N",
               what, text, filled, nodes);
    return TIDE_EINVAL;
  }
  memcpy(slots, got, (size_t)nodes * sizeof *slots);
  return 0;
bad:
  TIDE_ERROR("%s=\"%s\": cannot read it %s%s%s (Slurm's form: counts a node, \"4(x2)\" for 2 nodes of 4, "
             "comma-separated, e.g. 4(x2),2); give --slots-per-node N",
             what, text, *p ? "at \"" : "to its end", p, *p ? "\"" : "");
  return TIDE_EINVAL;
}

int tide__sched_slurm_pool(const char *nodelist, const char *cpus_per_node, int slots_per_node,
                           tide__sched_pool_t *pool) {
  int count = 0;
  TIDE_CHECK(tide__hostlist_nth("SLURM_JOB_NODELIST", nodelist, 0, pool->host[0], sizeof pool->host[0], &count));
  if (count > TIDE__SCHED_MAX_NODES) {
    TIDE_ERROR("SLURM_JOB_NODELIST names %d nodes; tide sched handles at most %d: use a smaller allocation",
               count, TIDE__SCHED_MAX_NODES);
    return TIDE_EINVAL;
  }
  for (int i = 1; i < count; i++)
    TIDE_CHECK(tide__hostlist_nth("SLURM_JOB_NODELIST", nodelist, i, pool->host[i], sizeof pool->host[i], NULL));
  if (slots_per_node > 0) {
    for (int i = 0; i < count; i++) pool->slots[i] = slots_per_node;
  } else if (cpus_per_node == NULL || cpus_per_node[0] == '\0') {
    TIDE_ERROR("SLURM_JOB_CPUS_PER_NODE is not set: give --slots-per-node N (the slots of each node)");
    return TIDE_EINVAL;
  } else {
    TIDE_CHECK(tide__slurm_cpus_per_node("SLURM_JOB_CPUS_PER_NODE", cpus_per_node, count, pool->slots));
  }
  for (int i = 0; i < count; i++) pool->names[i] = pool->host[i];
  pool->nodes = count;
  return 0;
}

/* ---- the daemon's address ----------------------------------------------------------- */

/* host names this host (its name, its short name, localhost). */
static int is_self(const char *host) {
  char self[256] = "";
  if (strcmp(host, "localhost") == 0) return 1;
  if (gethostname(self, sizeof self - 1) != 0) return 0;
  size_t a = strcspn(host, "."), b = strcspn(self, ".");
  return strcmp(host, self) == 0 || (a == b && strncmp(host, self, a) == 0);
}

int tide__sched_address(const char *const *hosts, int nodes, const char *whence, char *addr, size_t cap) {
  for (int i = 0; i < nodes; i++) {
    if (hosts == NULL || hosts[i] == NULL || is_self(hosts[i])) continue;
    char via[64];
    int rc = tide__route_addr(hosts[i], via, sizeof via);
    if (rc != 0) {
      TIDE_ERROR("tide sched: cannot tell this host's address as the other hosts reach it: host %d of %s, %s, %s; "
                 "give --address ADDR (this host's address on the network the hosts share)",
                 i, whence, hosts[i], rc == TIDE_EINVAL ? "does not resolve here" : "has no route from here");
      return TIDE_EINVAL;
    }
    if (tide__addr_is_loopback(via)) continue; /* a name of this machine */
    snprintf(addr, cap, "%s", via);
    TIDE_INFO("tide sched: the hosts reach this one at %s (the route to %s)", addr, hosts[i]);
    return 0;
  }
  snprintf(addr, cap, "127.0.0.1"); /* every host is this machine */
  return 0;
}

/* ---- the agents' srun step ------------------------------------------------------------ */

int tide__sched_agents_start(const char *tide, const char *dir, int nodes, const sigset_t *mask, pid_t *pid) {
  char n_nodes[32], n_tasks[32];
  snprintf(n_nodes, sizeof n_nodes, "--nodes=%d", nodes);
  snprintf(n_tasks, sizeof n_tasks, "--ntasks=%d", nodes);
  /* --overlap: the step shares the nodes with whatever else the
   * allocation runs; --cpu-bind=none: the agents' workers use every CPU. */
  char *const args[] = {(char *)"srun", n_nodes, n_tasks, (char *)"--ntasks-per-node=1", (char *)"--overlap",
                        (char *)"--cpu-bind=none", (char *)"--job-name=tide-sched-agents", (char *)tide,
                        (char *)"sched", (char *)"--agent", (char *)"--dir", (char *)dir, NULL};
  pid_t child = fork();
  if (child < 0) {
    TIDE_ERROR("tide sched: fork (for the agents' srun): %s", strerror(errno));
    return TIDE_EIO;
  }
  if (child == 0) {
    setpgid(0, 0); /* a Ctrl-C reaches the daemon, which stops the step in order */
    sigprocmask(SIG_SETMASK, mask, NULL);
    int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, 0);
    execvp("srun", args);
    fprintf(stderr, "tide sched: cannot run srun to start the nodes' agents: %s (Slurm's srun on PATH?)\n",
            strerror(errno));
    _exit(127);
  }
  *pid = child;
  return 0;
}

/* Waits up to s seconds for pid to end: 1 when it did. */
static int ended_within(pid_t pid, double s) {
  for (int i = 0; i <= (int)(s * 20); i++) {
    pid_t got = waitpid(pid, NULL, WNOHANG);
    if (got == pid || (got < 0 && errno == ECHILD)) return 1;
    usleep(50 * 1000);
  }
  return 0;
}

void tide__sched_agents_stop(pid_t pid, double grace_s) {
  if (pid <= 0 || ended_within(pid, grace_s)) return;
  TIDE_WARN("tide sched: the agents' srun step (pid %d) did not end %.0f s after they were told to quit: "
            "SIGTERM to srun (Slurm kills the agents and their workers)",
            (int)pid, grace_s);
  kill(pid, SIGTERM);
  if (ended_within(pid, 10.0)) return;
  TIDE_WARN("tide sched: srun (pid %d) did not end 10 s after SIGTERM: killing it", (int)pid);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}
