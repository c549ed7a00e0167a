/* tide sched, submit, jobs, cancel: the live cluster scheduler's commands
 * (linked into `tide`; the work is tide_sched_serve, _submit, _jobs, _cancel in src/sched/live.c). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tide.h"

extern char **environ;

#define EXIT_USAGE 2
#define MAX_HOSTS 4096

int tide_cli_sched(int argc, char **argv);
int tide_cli_submit(int argc, char **argv);
int tide_cli_jobs(int argc, char **argv);
int tide_cli_cancel(int argc, char **argv);

const char tide_cli_sched_usage[] =
    "usage: tide sched (--slots N | --hostfile F) [options]\n"
    "       tide sched [--slots-per-node N] [options]     (inside salloc or sbatch)\n"
    "       tide sched --agent [--dir DIR] [--node I]     (each host of a multi-host pool)\n"
    "\n"
    "A scheduler daemon that shares N slots among elastic jobs (tide submit) and every\n"
    "--interval seconds reallocates them in place (docs/scheduling.md, \"The live scheduler\").\n"
    "It runs until SIGINT or SIGTERM; the jobs go on without it and a new tide sched on the\n"
    "same --dir takes them over (in a Slurm allocation, the agents and their workers stop\n"
    "with it).\n"
    "\n"
    "  --slots N            the local host with N slots\n"
    "  --hostfile F         one host a line: NAME SLOTS; with several hosts, each runs\n"
    "                       `tide sched --agent --node I` (I: its line, from 0) and --dir\n"
    "                       must be shared by every host; the jobs' stores stay here\n"
    "  (neither)            inside a Slurm allocation (SLURM_JOB_NODELIST): the pool is its\n"
    "                       nodes, in order, with their CPUs as slots (SLURM_JOB_CPUS_PER_NODE),\n"
    "                       and tide sched starts their agents itself (one srun step)\n"
    "  --slots-per-node N   in a Slurm allocation: N slots on every node instead\n"
    "  --address HOST       several hosts: this host as the others reach it (default: the\n"
    "                       address of this host's route to another host of the pool)\n"
    "  --agent              run the per-host agent instead: starts and stops the workers\n"
    "                       the scheduler at --dir places on host --node I (default\n"
    "                       $SLURM_NODEID, else 0)\n"
    "  --dir DIR            state directory (default $XDG_RUNTIME_DIR/tide-sched, else\n"
    "                       /tmp/tide-sched-$USER); the clients find the daemon there\n"
    "  --interval S         seconds between allocation rounds (default 60)\n"
    "  --policy P           pollux (default), greedy, fifo, tiresias or optimus\n"
    "  --p X                Pollux's fairness exponent (default -1)\n"
    "  --resize-cost S      seconds a change costs a job, for the allocator, until its own\n"
    "                       change time is measured (default 0.1)\n"
    "  --seed N             the genetic search's seed (default 1)\n"
    "  --tiderun PATH       the launcher (default: tiderun beside this tide)\n"
    "  --quiet              no line per decision on stderr\n"
    "\n"
    "tide submit [--dir DIR] --min-np N --max-np M [--np K] [--name J] -- PROGRAM ARGS\n"
    "tide submit [--dir DIR] --background --np K [--name J] -- PROGRAM ARGS\n"
    "                       a background job: no slots; K workers at the lowest CPU priority,\n"
    "                       paused while a foreground job is slowed (docs/scheduling.md)\n"
    "tide jobs [--dir DIR]\n"
    "tide cancel [--dir DIR] [--no-wait] JOB      (its id or name)\n";

static void __attribute__((noreturn, format(printf, 2, 3))) fail_usage(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "tide %s: ", cmd);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, " (see tide help sched)\n");
  va_end(ap);
  exit(EXIT_USAGE);
}

static int to_int(const char *text, int min, int *out) {
  char *end;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || end == text || *end != '\0' || v < min || v > INT_MAX) return -1;
  *out = (int)v;
  return 0;
}

static int to_double(const char *text, double *out) {
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (errno || end == text || *end != '\0') return -1;
  *out = v;
  return 0;
}

static const char *default_dir(char *buf, size_t cap) {
  if (tide_sched_default_dir(buf, cap) != 0) fail_usage("sched", "no default --dir: give one");
  return buf;
}

/* Reads "NAME SLOTS" lines ('#' comments) into hosts and slots. */
static int read_hostfile(const char *path, char ***hosts, int **slots) {
  FILE *f = fopen(path, "r");
  if (f == NULL) fail_usage("sched", "--hostfile: cannot read %s: %s", path, strerror(errno));
  char line[512];
  int n = 0, lineno = 0;
  *hosts = calloc(MAX_HOSTS, sizeof **hosts);
  *slots = calloc(MAX_HOSTS, sizeof **slots);
  if (*hosts == NULL || *slots == NULL) fail_usage("sched", "out of memory");
  while (fgets(line, sizeof line, f) != NULL) {
    lineno++;
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    char name[256], extra[8];
    int k;
    int got = sscanf(line, "%255s %d %7s", name, &k, extra);
    if (got <= 0) continue;
    if (got != 2 || k < 1) fail_usage("sched", "--hostfile %s:%d: expected NAME SLOTS with SLOTS >= 1", path, lineno);
    if (n == MAX_HOSTS) fail_usage("sched", "--hostfile %s: more than %d hosts", path, MAX_HOSTS);
    (*hosts)[n] = strdup(name);
    (*slots)[n++] = k;
  }
  fclose(f);
  if (n == 0) fail_usage("sched", "--hostfile %s has no host", path);
  return n;
}

int tide_cli_sched(int argc, char **argv) {
  tide_sched_daemon_options_t o;
  tide_sched_daemon_options_init(&o);
  char dir[4096], tiderun[4096];
  o.dir = NULL;
  int slots = 0, slots_per_node = 0;
  const char *hostfile = NULL;
  char **hosts = NULL;
  int *host_slots = NULL;
  int agent = 0, node = -1;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(tide_cli_sched_usage, stdout);
      return 0;
    }
    if (strcmp(a, "--quiet") == 0) {
      o.quiet = 1;
      continue;
    }
    if (strcmp(a, "--agent") == 0) {
      agent = 1;
      continue;
    }
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL) fail_usage("sched", "%s needs a value", a);
    i++;
    double x;
    int k;
    if (strcmp(a, "--slots") == 0) {
      if (to_int(v, 1, &slots)) fail_usage("sched", "--slots: '%s' is not an integer >= 1", v);
    } else if (strcmp(a, "--hostfile") == 0) {
      hostfile = v;
    } else if (strcmp(a, "--slots-per-node") == 0) {
      if (to_int(v, 1, &slots_per_node)) fail_usage("sched", "--slots-per-node: '%s' is not an integer >= 1", v);
    } else if (strcmp(a, "--dir") == 0) {
      o.dir = v;
    } else if (strcmp(a, "--interval") == 0) {
      if (to_double(v, &x) || !(x > 0)) fail_usage("sched", "--interval: '%s' is not a number of seconds > 0", v);
      o.interval = x;
    } else if (strcmp(a, "--policy") == 0) {
      if (tide_sched_policy_parse(v, &o.sched.policy) != 0)
        fail_usage("sched", "--policy: '%s' is not pollux, greedy, fifo, tiresias or optimus", v);
    } else if (strcmp(a, "--p") == 0) {
      if (to_double(v, &x) || !(x <= 1)) fail_usage("sched", "--p: '%s' is not a number <= 1", v);
      o.sched.p = x;
    } else if (strcmp(a, "--resize-cost") == 0) {
      if (to_double(v, &x) || !(x >= 0)) fail_usage("sched", "--resize-cost: '%s' is not a number of seconds >= 0", v);
      o.resize_cost = x;
    } else if (strcmp(a, "--seed") == 0) {
      if (to_int(v, 0, &k)) fail_usage("sched", "--seed: '%s' is not an integer >= 0", v);
      o.sched.seed = (uint64_t)k;
    } else if (strcmp(a, "--node") == 0) {
      if (to_int(v, 0, &node)) fail_usage("sched", "--node: '%s' is not an integer >= 0", v);
    } else if (strcmp(a, "--address") == 0) {
      o.address = v;
    } else if (strcmp(a, "--tiderun") == 0) {
      o.tiderun = v;
    } else {
      fail_usage("sched", "unknown option '%s'", a);
    }
  }
  if (agent) {
    if (slots > 0 || hostfile != NULL || slots_per_node > 0)
      fail_usage("sched", "--agent takes no --slots, --hostfile or --slots-per-node (the scheduler has them)");
    const char *slurm_node = getenv("SLURM_NODEID");
    if (node < 0 && slurm_node != NULL && to_int(slurm_node, 0, &node))
      fail_usage("sched", "SLURM_NODEID '%s' is not an integer >= 0: give --node I", slurm_node);
    if (node < 0) node = 0;
    if (o.dir == NULL) o.dir = default_dir(dir, sizeof dir);
    int rc = tide_sched_agent(o.dir, node);
    return rc == TIDE_EINVAL ? EXIT_USAGE : rc != 0;
  }
  if (slots > 0 && hostfile != NULL) fail_usage("sched", "give one of --slots N or --hostfile F, not both");
  if (slots_per_node > 0 && (slots > 0 || hostfile != NULL))
    fail_usage("sched", "--slots-per-node is for a Slurm allocation's nodes: with --slots or --hostfile, give the "
                        "slots there");
  /* Neither: the library takes the Slurm allocation this runs in (o.slots NULL). */
  o.slots_per_node = slots_per_node;
  if (hostfile != NULL) {
    o.nodes = read_hostfile(hostfile, &hosts, &host_slots);
    o.slots = host_slots;
    o.hosts = (const char *const *)hosts;
  } else if (slots > 0) {
    o.nodes = 1;
    o.slots = &slots;
  }
  if (o.dir == NULL) o.dir = default_dir(dir, sizeof dir);
  char self[4096];
  ssize_t self_len = readlink("/proc/self/exe", self, sizeof self - 16);
  if (self_len > 0) {
    self[self_len] = 0;
    o.tide = self; /* what a Slurm pool's agents run */
  }
  if (o.tiderun == NULL) {
    if (self_len <= 0) fail_usage("sched", "cannot find this program's path: give --tiderun");
    strcpy(tiderun, self);
    char *slash = strrchr(tiderun, '/');
    strcpy(slash ? slash + 1 : tiderun, "tiderun");
    o.tiderun = tiderun;
  }
  int rc = tide_sched_serve(&o);
  if (hosts != NULL)
    for (int i = 0; i < o.nodes; i++) free(hosts[i]);
  free(hosts);
  free(host_slots);
  if (rc == TIDE_EINVAL) return EXIT_USAGE;
  return rc != 0;
}

/* --dir DIR at argv[*i], for the client commands. */
static int client_dir(const char *cmd, int argc, char **argv, int *i, const char **dir) {
  if (strcmp(argv[*i], "--dir") != 0) return 0;
  if (*i + 1 >= argc) fail_usage(cmd, "--dir needs a value");
  *dir = argv[++*i];
  return 1;
}

int tide_cli_submit(int argc, char **argv) {
  char dir_buf[4096], cwd[4096], id[64];
  const char *dir = NULL, *name = "";
  int min_np = 0, max_np = 0, np = 0, background = 0, i;
  for (i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (client_dir("submit", argc, argv, &i, &dir)) continue;
    if (a[0] != '-') break;
    if (strcmp(a, "--background") == 0) {
      background = 1;
      continue;
    }
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL) fail_usage("submit", "%s needs a value", a);
    i++;
    if (strcmp(a, "--min-np") == 0) {
      if (to_int(v, 1, &min_np)) fail_usage("submit", "--min-np: '%s' is not an integer >= 1", v);
    } else if (strcmp(a, "--max-np") == 0) {
      if (to_int(v, 1, &max_np)) fail_usage("submit", "--max-np: '%s' is not an integer >= 1", v);
    } else if (strcmp(a, "--np") == 0) {
      if (to_int(v, 1, &np)) fail_usage("submit", "--np: '%s' is not an integer >= 1", v);
    } else if (strcmp(a, "--name") == 0) {
      name = v;
    } else {
      fail_usage("submit", "unknown option '%s'", a);
    }
  }
  if (background && (min_np != 0 || max_np != 0))
    fail_usage("submit", "--background takes no --min-np or --max-np: a background job takes no slots and is "
                         "never resized; give its workers with --np");
  if (background && np == 0) fail_usage("submit", "--background needs --np K, the background job's workers");
  if (!background && (min_np == 0 || max_np == 0)) fail_usage("submit", "--min-np and --max-np are required");
  if (max_np < min_np) fail_usage("submit", "--max-np (%d) is below --min-np (%d)", max_np, min_np);
  if (!background && np != 0 && (np < min_np || np > max_np))
    fail_usage("submit", "--np (%d) must be between --min-np (%d) and --max-np (%d)", np, min_np, max_np);
  if (i >= argc) fail_usage("submit", "no program given: tide submit ... -- PROGRAM ARGS");
  if (dir == NULL) dir = default_dir(dir_buf, sizeof dir_buf);
  if (getcwd(cwd, sizeof cwd) == NULL) fail_usage("submit", "cannot read the current directory");
  /* A relative program is found from here, as a shell would. */
  tide_sched_submit_options_t o;
  tide_sched_submit_options_init(&o);
  o.name = name, o.min_np = min_np, o.max_np = max_np, o.np = np, o.background = background;
  int rc = tide_sched_submit_job(dir, &o, cwd, argc - i, argv + i, environ, id, sizeof id);
  if (rc != 0) return rc == TIDE_EINVAL ? EXIT_USAGE : 1;
  printf("%s\n", id);
  return 0;
}

int tide_cli_jobs(int argc, char **argv) {
  char dir_buf[4096];
  const char *dir = NULL;
  for (int i = 0; i < argc; i++)
    if (!client_dir("jobs", argc, argv, &i, &dir)) fail_usage("jobs", "unknown argument '%s'", argv[i]);
  if (dir == NULL) dir = default_dir(dir_buf, sizeof dir_buf);
  char *text;
  if (tide_sched_jobs(dir, &text) != 0) return 1;
  fputs(text, stdout);
  tide_free(text);
  return 0;
}

int tide_cli_cancel(int argc, char **argv) {
  char dir_buf[4096];
  const char *dir = NULL, *job = NULL;
  int wait = 1;
  for (int i = 0; i < argc; i++) {
    if (client_dir("cancel", argc, argv, &i, &dir)) continue;
    if (strcmp(argv[i], "--no-wait") == 0) wait = 0;
    else if (job == NULL && argv[i][0] != '-') job = argv[i];
    else fail_usage("cancel", "unexpected argument '%s'", argv[i]);
  }
  if (job == NULL) fail_usage("cancel", "which job? tide cancel JOB (an id or name from tide jobs)");
  if (dir == NULL) dir = default_dir(dir_buf, sizeof dir_buf);
  int rc = tide_sched_cancel(dir, job);
  if (rc != 0) return rc == TIDE_EINVAL ? EXIT_USAGE : 1;
  /* Until its processes are gone (the keeper gives tiderun's grace). */
  char state[32] = "cancelling";
  for (int k = 0; wait && k < 300 && strcmp(state, "cancelling") == 0; k++) {
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    if (tide_sched_job_state(dir, job, state, sizeof state) != 0) return 1;
  }
  printf("job %s: %s\n", job, wait ? state : "cancelling");
  return 0;
}
