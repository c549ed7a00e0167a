/* tiderun: starts the ranks of a tide job on this host, one process each,
 * with their identity in TIDE_* variables, and hosts the rendezvous store on
 * node 0. It forwards signals, can prefix output lines with the rank, and
 * when one rank fails gives the others a grace period before stopping them.
 *
 * Threads: everything runs on the main thread except the store server, which
 * runs its own. Signals are blocked in every thread (the server thread
 * inherits the mask) and read from a signalfd, so the main loop is a single
 * poll() over the signalfd and the ranks' output pipes.
 *
 * Each rank runs in its own process group, so a Ctrl-C at the terminal
 * reaches tiderun only (and is forwarded once), and a signal sent to a rank
 * also reaches the processes it started (a shell's children, say). When a
 * rank exits, whatever it left running in its group is killed.
 *
 * Placement: before exec, each rank is bound to its share of the CPUs
 * tiderun may run on (--bind, src/core/place.c), computed once at start-up
 * from hwloc's topology. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tide.h"

extern char **environ;

#define MAX_NPROC 4096
#define MAX_NNODES 65536
#define LINE_CAP 65536           /* longer lines are split */
#define KILL_AFTER_TERM_MS 1000  /* SIGTERM -> SIGKILL */
#define DRAIN_MS 1000            /* output read after the last rank exited */
#define NODE_LINGER_MS 30000     /* node 0 keeps the store up for the other nodes */
#define NODES_STARTED_KEY "tiderun/nodes_started"
#define NODES_DONE_KEY "tiderun/nodes_done"
#define EXIT_USAGE 2
#define EXIT_TIMEOUT 124
#define ELASTIC_POLL_MS 100

static const char usage_text[] =
    "usage: tiderun [options] [--] PROG [ARGS...]\n"
    "\n"
    "Starts the ranks of a tide job on this host, one process per rank.\n"
    "\n"
    "  -np N, --nproc-per-node N  ranks on this host (default 1)\n"
    "  --nnodes K                 hosts in the job, one tiderun on each (default 1); with\n"
    "                             --elastic also MIN:MAX: nodes 0..MIN-1 start the job, a\n"
    "                             node started later with --node-rank MIN..MAX-1 adds its\n"
    "                             workers to the running job\n"
    "  --node-rank I              this host's index, 0 <= I < K (default 0)\n"
    "  --rdzv HOST:PORT           the rendezvous store: node 0 listens on PORT, the other\n"
    "                             nodes connect to it (required when K > 1; default: a\n"
    "                             free port on 127.0.0.1)\n"
    "  -l, --prefix               prefix every output line with \"[RANK] \"\n"
    "  --grace-ms MS              after a rank fails, how long the others may take to exit\n"
    "                             before they get SIGTERM, then SIGKILL (default 3000)\n"
    "  --timeout SEC              stop every rank and fail after SEC seconds (default: none)\n"
    "  --bind core|numa|none      core: each rank gets a contiguous share of the cores tiderun\n"
    "                             may run on (cores / N, at least one, wrapping when ranks\n"
    "                             outnumber cores), within one NUMA node when it fits; numa:\n"
    "                             the NUMA nodes of that share; none: no binding (default:\n"
    "                             TIDE_BIND, else core)\n"
    "  --elastic                  an elastic job (docs/elastic.md): a failed rank does not stop\n"
    "                             the others; it is replaced by a new worker that joins the\n"
    "                             running job (up to --max-restarts times); workers are added\n"
    "                             or released as `tide ctl resize N` asks (node 0 starts\n"
    "                             the added ones); with --nnodes, -np is per node and\n"
    "                             --min-np/--max-np count the whole job\n"
    "  --min-np N                 elastic: the job fails when fewer than N workers remain\n"
    "                             (default 1)\n"
    "  --max-np M                 elastic: at most M workers (default: -np); -np is how many\n"
    "                             start (default M)\n"
    "  --max-restarts R           elastic: failed workers replaced at most R times (default 3);\n"
    "                             after that the job goes on with fewer, down to --min-np\n"
    "  --background               a background job (docs/elastic.md, \"Multiplexing\"): its\n"
    "                             ranks run at the lowest CPU priority (SCHED_IDLE, else\n"
    "                             nice 19) and block instead of spinning while they wait\n"
    "                             (sets TIDE_BACKGROUND=1)\n"
    "  --foreground HOST:PORT     with --background: the foreground job's store; the\n"
    "                             trainer pauses at step boundaries while the foreground's\n"
    "                             recent step time exceeds TIDE_GUARD_PERCENT (110) of its\n"
    "                             solo step time (needs TIDE_FOREGROUND_TOKEN, the\n"
    "                             foreground's job token)\n"
    "  --hosts-background         a foreground job that hosts background jobs: its trainer\n"
    "                             publishes its step times, its waits block instead of\n"
    "                             spinning (sets TIDE_HOSTS_BACKGROUND=1)\n"
    "  -h, --help                 print this help\n"
    "\n"
    "One host:   tiderun -np 4 ./train\n"
    "Two hosts:  export TIDE_JOB_TOKEN=$(head -c16 /dev/urandom | xxd -p)  # the same on both\n"
    "  host A:   tiderun --nnodes 2 --node-rank 0 --nproc-per-node 2 --rdzv A:29500 ./train\n"
    "  host B:   tiderun --nnodes 2 --node-rank 1 --nproc-per-node 2 --rdzv A:29500 ./train\n"
    "\n"
    "Each rank gets TIDE_RANK (node_rank * N + local rank), TIDE_SIZE, TIDE_LOCAL_RANK,\n"
    "TIDE_LOCAL_SIZE, TIDE_NODE_RANK, TIDE_NNODES, TIDE_RDZV, TIDE_JOB_TOKEN, TIDE_JOB_ID,\n"
    "TIDE_BIND (the binding applied) and TIDE_CPUS (its CPUs, or \"unbound\");\n"
    "its stdin is /dev/null. TIDE_JOB_TOKEN is taken from the environment when set (required\n"
    "when K > 1), otherwise generated.\n"
    "\n"
    "Exit status: 0 when every rank exits 0; otherwise the exit code of the first rank that\n"
    "failed (1 if it was killed by a signal), 124 after --timeout, 128+N after signal N,\n"
    "2 for a usage error.\n";

typedef struct {
  int nproc; /* ranks on this host */
  int nnodes;      /* hosts at most (--nnodes K or MIN:MAX) */
  int nnodes_min;  /* hosts that start the job; later ones join it (elastic) */
  int node_rank;
  const char *rdzv; /* NULL: a private store on 127.0.0.1 */
  char rdzv_host[256];
  int rdzv_port;
  int prefix;
  int grace_ms;
  int timeout_s; /* 0: none */
  int bind;      /* a tide_bind_t; -1 until set */
  char **argv;   /* the program and its arguments */
  int elastic, min_np, max_np, max_restarts, np_given;
  int background, hosts_background;
  const char *foreground; /* --foreground HOST:PORT, or NULL */
} options_t;

/* One output stream of a rank in --prefix mode: the read end of its pipe and
 * the partial line read so far. */
typedef struct {
  int fd;     /* -1 once closed */
  int out_fd; /* where its lines go: 1 or 2 */
  char *buf;  /* LINE_CAP bytes */
  size_t len;
} stream_t;

typedef struct {
  int rank;
  pid_t pid; /* also its process group */
  int running;
  cpu_set_t cpus; /* its share, when opts->bind binds */
  char cpus_text[256]; /* the same as a list ("0-3") */
  stream_t streams[2];
} rank_t;

typedef struct {
  const options_t *opts;
  rank_t *ranks;
  int nranks;
  int running;
  int exit_code;        /* what tiderun returns; the first failure sets it */
  int stopping;         /* the ranks were signalled: their deaths are expected */
  int term_sent;        /* stop_ranks ran */
  int interrupts;       /* SIGINTs received */
  int64_t grace_end;    /* then SIGTERM */
  int64_t kill_at;      /* then SIGKILL */
  int64_t timeout_at;   /* --timeout */
  int64_t drain_end;    /* stop reading output */
  /* --elastic: slots for workers started later, what they need to start,
   * and the store client that reads the job's requests. */
  int capacity;
  int failures, first_failure;
  int finished; /* the workers said training is over (elastic/done) */
  int replaced; /* --nnodes > 1: failed workers this node replaced */
  int grown_for; /* --nnodes > 1, node 0: the request it last started workers for */
  int64_t next_poll;
  tide_store_t *store;
  const char *rdzv, *token, *job_id;
  const sigset_t *old_mask;
  const struct sigaction *old_sigpipe;
} job_t;

static void usage(FILE *out) { fputs(usage_text, out); }

/* ---- arguments ---------------------------------------------------------------- */

static int parse_int(const char *option, const char *text, long min, long max, int *out) {
  char *end;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') {
    fprintf(stderr, "tiderun: %s expects an integer, got \"%s\"\n", option, text);
    return -1;
  }
  if (v < min || v > max) {
    fprintf(stderr, "tiderun: %s must be between %ld and %ld, got %ld\n", option, min, max, v);
    return -1;
  }
  *out = (int)v;
  return 0;
}

enum { OPT_NPROC, OPT_NNODES, OPT_NODE_RANK, OPT_RDZV, OPT_PREFIX, OPT_GRACE, OPT_TIMEOUT, OPT_BIND, OPT_HELP,
       OPT_ELASTIC, OPT_MIN_NP, OPT_MAX_NP, OPT_MAX_RESTARTS, OPT_BACKGROUND, OPT_FOREGROUND,
       OPT_HOSTS_BACKGROUND };

static const struct {
  const char *name;
  int id;
  int has_value;
} option_table[] = {
    {"-np", OPT_NPROC, 1},         {"--nproc-per-node", OPT_NPROC, 1},
    {"--nnodes", OPT_NNODES, 1},   {"--node-rank", OPT_NODE_RANK, 1},
    {"--rdzv", OPT_RDZV, 1},       {"-l", OPT_PREFIX, 0},
    {"--prefix", OPT_PREFIX, 0},   {"--grace-ms", OPT_GRACE, 1},
    {"--timeout", OPT_TIMEOUT, 1}, {"--bind", OPT_BIND, 1},
    {"-h", OPT_HELP, 0},
    {"--help", OPT_HELP, 0},
    {"--elastic", OPT_ELASTIC, 0}, {"--min-np", OPT_MIN_NP, 1},
    {"--max-np", OPT_MAX_NP, 1},   {"--max-restarts", OPT_MAX_RESTARTS, 1},
    {"--background", OPT_BACKGROUND, 0}, {"--foreground", OPT_FOREGROUND, 1},
    {"--hosts-background", OPT_HOSTS_BACKGROUND, 0},
};

/* Fills opts from argv. Returns 0 to run, 1 when help was printed, -1 after
 * printing what is wrong. Options end at "--" or at the first argument that
 * does not start with '-': that is the program. */
static int parse_args(int argc, char **argv, options_t *opts) {
  memset(opts, 0, sizeof *opts);
  opts->nproc = 1;
  opts->nnodes = opts->nnodes_min = 1;
  opts->grace_ms = 3000;
  opts->bind = -1;
  opts->max_restarts = 3;
  int i = 1;
  while (i < argc) {
    const char *arg = argv[i];
    if (strcmp(arg, "--") == 0) {
      i++;
      break;
    }
    if (arg[0] != '-' || arg[1] == '\0') break;
    /* "--name=value" as well as "--name value" */
    size_t name_len = strlen(arg);
    const char *inline_value = NULL;
    const char *eq = strchr(arg, '=');
    if (arg[1] == '-' && eq != NULL) {
      name_len = (size_t)(eq - arg);
      inline_value = eq + 1;
    }
    int found = -1;
    for (size_t k = 0; k < sizeof option_table / sizeof option_table[0]; k++)
      if (strlen(option_table[k].name) == name_len &&
          strncmp(option_table[k].name, arg, name_len) == 0)
        found = (int)k;
    if (found < 0) {
      fprintf(stderr, "tiderun: unknown option \"%s\"\n\n", arg);
      usage(stderr);
      return -1;
    }
    const char *name = option_table[found].name;
    const char *value = NULL;
    if (option_table[found].has_value) {
      if (inline_value != NULL) {
        value = inline_value;
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        fprintf(stderr, "tiderun: %s needs a value (see tiderun --help)\n", name);
        return -1;
      }
    } else if (inline_value != NULL) {
      fprintf(stderr, "tiderun: %s takes no value\n", name);
      return -1;
    }
    i++;
    int rc = 0;
    switch (option_table[found].id) {
      case OPT_NPROC: rc = parse_int(name, value, 1, MAX_NPROC, &opts->nproc); opts->np_given = 1; break;
      case OPT_ELASTIC: opts->elastic = 1; break;
      case OPT_MIN_NP: rc = parse_int(name, value, 1, MAX_NPROC, &opts->min_np); break;
      case OPT_MAX_NP: rc = parse_int(name, value, 1, MAX_NPROC, &opts->max_np); break;
      case OPT_MAX_RESTARTS: rc = parse_int(name, value, 0, 1000000, &opts->max_restarts); break;
      case OPT_NNODES: {
        const char *colon = strchr(value, ':');
        if (colon == NULL) {
          rc = parse_int(name, value, 1, MAX_NNODES, &opts->nnodes);
          opts->nnodes_min = opts->nnodes;
          break;
        }
        char low[32];
        size_t n = (size_t)(colon - value);
        if (n == 0 || n >= sizeof low) {
          fprintf(stderr, "tiderun: --nnodes expects K or MIN:MAX, got \"%s\"\n", value);
          rc = -1;
          break;
        }
        memcpy(low, value, n);
        low[n] = '\0';
        if ((rc = parse_int(name, low, 1, MAX_NNODES, &opts->nnodes_min)) == 0 &&
            (rc = parse_int(name, colon + 1, 1, MAX_NNODES, &opts->nnodes)) == 0 && opts->nnodes_min > opts->nnodes) {
          fprintf(stderr, "tiderun: --nnodes MIN:MAX needs MIN <= MAX, got \"%s\"\n", value);
          rc = -1;
        }
        break;
      }
      case OPT_NODE_RANK: rc = parse_int(name, value, 0, MAX_NNODES - 1, &opts->node_rank); break;
      case OPT_RDZV: opts->rdzv = value; break;
      case OPT_PREFIX: opts->prefix = 1; break;
      case OPT_GRACE: rc = parse_int(name, value, 0, 24 * 3600 * 1000, &opts->grace_ms); break;
      case OPT_TIMEOUT: rc = parse_int(name, value, 0, 365 * 24 * 3600, &opts->timeout_s); break;
      case OPT_BIND:
      {
        tide_bind_t bind;
        if ((rc = tide_bind_parse(value, TIDE_BIND_CORE, &bind)) != 0)
          fprintf(stderr, "tiderun: --bind must be core, numa or none, got \"%s\"\n", value);
        else
          opts->bind = (int)bind;
        break;
      }
      case OPT_BACKGROUND: opts->background = 1; break;
      case OPT_FOREGROUND: opts->foreground = value; break;
      case OPT_HOSTS_BACKGROUND: opts->hosts_background = 1; break;
      case OPT_HELP: usage(stdout); return 1;
    }
    if (rc != 0) return -1;
  }
  if (i >= argc) {
    fprintf(stderr, "tiderun: no program given: tiderun [options] [--] PROG [ARGS...]\n");
    return -1;
  }
  opts->argv = argv + i;
  if (opts->node_rank >= opts->nnodes) {
    fprintf(stderr, "tiderun: --node-rank must be between 0 and %d (--nnodes %d), got %d\n",
            opts->nnodes - 1, opts->nnodes, opts->node_rank);
    return -1;
  }
  if (opts->foreground != NULL) {
    char host[256];
    int port;
    if (!opts->background) {
      fprintf(stderr, "tiderun: --foreground needs --background (it names the foreground of a background job)\n");
      return -1;
    }
    if (tide_host_port_parse(opts->foreground, host, sizeof host, &port) != 0) {
      fprintf(stderr, "tiderun: --foreground expects HOST:PORT with PORT in 1..65535, got \"%s\"\n",
              opts->foreground);
      return -1;
    }
    const char *token = getenv("TIDE_FOREGROUND_TOKEN");
    if (token == NULL || token[0] == '\0') {
      fprintf(stderr, "tiderun: --foreground needs TIDE_FOREGROUND_TOKEN in the environment: the foreground "
                      "job's TIDE_JOB_TOKEN, which its store asks for\n");
      return -1;
    }
  }
  if (opts->background && opts->hosts_background) {
    fprintf(stderr, "tiderun: --background and --hosts-background exclude each other\n");
    return -1;
  }
  if (!opts->elastic && (opts->min_np || opts->max_np)) {
    fprintf(stderr, "tiderun: --min-np and --max-np need --elastic\n");
    return -1;
  }
  if (!opts->elastic && opts->nnodes_min != opts->nnodes) {
    fprintf(stderr, "tiderun: --nnodes MIN:MAX needs --elastic (a fixed job has --nnodes K)\n");
    return -1;
  }
  if (opts->elastic && opts->nnodes > 1) {
    /* -np is this node's; --min-np and --max-np count the whole job. */
    int first = opts->nnodes_min * opts->nproc;
    if (opts->max_np == 0) opts->max_np = opts->nnodes * opts->nproc;
    if (opts->min_np == 0) opts->min_np = 1;
    /* A node that joins later checks only the bounds (the first nodes check the start). */
    if (opts->node_rank >= opts->nnodes_min) first = opts->min_np;
    if (opts->min_np > first || first > opts->max_np) {
      fprintf(stderr, "tiderun: --elastic needs --min-np (%d) <= the first nodes' workers (%d x %d) <= --max-np (%d)\n",
              opts->min_np, opts->nnodes_min, opts->nproc, opts->max_np);
      return -1;
    }
  } else if (opts->elastic) {
    if (opts->max_np == 0) opts->max_np = opts->np_given ? opts->nproc : 1;
    if (!opts->np_given) opts->nproc = opts->max_np;
    if (opts->min_np == 0) opts->min_np = 1;
    if (opts->min_np > opts->nproc || opts->nproc > opts->max_np) {
      fprintf(stderr, "tiderun: --elastic needs --min-np (%d) <= -np (%d) <= --max-np (%d)\n", opts->min_np,
              opts->nproc, opts->max_np);
      return -1;
    }
  }
  if ((long)opts->nproc * opts->nnodes > 1048576) {
    fprintf(stderr, "tiderun: %d nodes x %d ranks is more than 1048576 ranks\n", opts->nnodes,
            opts->nproc);
    return -1;
  }
  if (opts->nnodes > 1 && opts->rdzv == NULL) {
    fprintf(stderr, "tiderun: --nnodes %d needs --rdzv HOST:PORT, the address of node 0 "
                    "(the same on every node)\n", opts->nnodes);
    return -1;
  }
  if (opts->rdzv != NULL &&
      tide_host_port_parse(opts->rdzv, opts->rdzv_host, sizeof opts->rdzv_host,
                            &opts->rdzv_port) != 0) {
    fprintf(stderr, "tiderun: --rdzv expects HOST:PORT with PORT in 1..65535, got \"%s\"\n",
            opts->rdzv);
    return -1;
  }
  return 0;
}

/* ---- job token and id ------------------------------------------------------------ */

/* The job token: TIDE_JOB_TOKEN when set, required with several nodes (they
 * must all prove the same one), otherwise 32 random bytes in hex. token_buf
 * holds at least 65 bytes. */
static const char *job_token(const options_t *opts, char *token_buf) {
  const char *env = getenv("TIDE_JOB_TOKEN");
  if (env != NULL && env[0] != '\0') return env;
  if (opts->nnodes > 1) {
    fprintf(stderr,
            "tiderun: --nnodes %d needs TIDE_JOB_TOKEN in the environment, the same on every "
            "node; for example run\n"
            "  export TIDE_JOB_TOKEN=$(head -c16 /dev/urandom | xxd -p)\n"
            "and copy that value to the other nodes before starting tiderun there\n",
            opts->nnodes);
    return NULL;
  }
  if (tide_job_token_create(token_buf, 65) != 0) {
    fprintf(stderr, "tiderun: cannot make the job token (the log line above says why)\n");
    return NULL;
  }
  return token_buf;
}

/* The job id: random for one node; with several, derived from the token so
 * every node computes the same one without talking. id_buf holds 17 bytes. */
static int job_id(const options_t *opts, const char *token, char *id_buf) {
  if (tide_job_id(opts->nnodes > 1 ? token : NULL, id_buf, 17) != 0) {
    fprintf(stderr, "tiderun: cannot make the job id (the log line above says why)\n");
    return -1;
  }
  return 0;
}

/* ---- rendezvous store ---------------------------------------------------------- */

static int is_loopback(const char *host) {
  return strcmp(host, "localhost") == 0 || strncmp(host, "127.", 4) == 0;
}

static void print_store_error(const char *what, const char *rdzv, int rc) {
  if (rc == TIDE_EAUTH)
    fprintf(stderr, "tiderun: the store at %s refused our job token: export the same "
                    "TIDE_JOB_TOKEN on every node\n", rdzv);
  else
    fprintf(stderr, "tiderun: %s %s: %s\n", what, rdzv, tide_strerror(rc));
}

/* Non-zero nodes, before starting their ranks: fails early, with a clear
 * message, when node 0's store cannot be reached or refuses the token
 * (waiting up to TIDE_TIMEOUT_MS for node 0 to start), and counts this node
 * in NODES_STARTED_KEY so node 0 knows to wait for it at the end. */
static int register_node(const options_t *opts, const char *token) {
  int64_t timeout_param = 0;
  tide_param_get("TIDE_TIMEOUT_MS", NULL, &timeout_param);
  int timeout_ms = (int)timeout_param;
  tide_log_info("tiderun: connecting to the store at %s (up to %d ms)", opts->rdzv, timeout_ms);
  tide_store_t *store;
  int rc = tide_store_connect(opts->rdzv_host, opts->rdzv_port, token, timeout_ms, &store);
  if (rc == 0) {
    int64_t started;
    rc = tide_store_add(store, NODES_STARTED_KEY, 1, &started);
    tide_store_close(store);
  }
  if (rc != 0) {
    print_store_error("cannot reach the store of node 0 at", opts->rdzv, rc);
    return -1;
  }
  return 0;
}

/* Non-zero nodes, after their ranks ended: node 0 may stop the store now. */
static void report_node_done(const options_t *opts, const char *token) {
  tide_store_t *store;
  if (tide_store_connect(opts->rdzv_host, opts->rdzv_port, token, 2000, &store) != 0) return;
  int64_t done;
  tide_store_add(store, NODES_DONE_KEY, 1, &done);
  tide_store_close(store);
}

/* Node 0, after its own ranks succeeded: the other nodes' ranks may still be
 * using the store, so keep it up until every node that registered reported
 * done, for at most NODE_LINGER_MS or until a signal arrives. (Every node
 * registered before node 0's ranks could finish: a job completes only when
 * all its ranks joined.) */
static void wait_for_other_nodes(const char *host, int port, const char *token, int signal_fd) {
  tide_store_t *store;
  if (tide_store_connect(host, port, token, 2000, &store) != 0) return;
  int64_t deadline = tide_deadline_after_ms(NODE_LINGER_MS);
  for (;;) {
    int64_t started = 0, done = 0;
    if (tide_store_add(store, NODES_STARTED_KEY, 0, &started) != 0 ||
        tide_store_add(store, NODES_DONE_KEY, 0, &done) != 0 || done >= started)
      break;
    if (tide_now_ns() >= deadline) {
      fprintf(stderr, "tiderun: %d other node(s) did not finish within %d s; stopping the store\n",
              (int)(started - done), NODE_LINGER_MS / 1000);
      break;
    }
    struct pollfd pfd = {.fd = signal_fd, .events = POLLIN};
    if (poll(&pfd, 1, 100) > 0) {
      struct signalfd_siginfo si;
      if (read(signal_fd, &si, sizeof si) == (ssize_t)sizeof si && si.ssi_signo != SIGCHLD) break;
    }
  }
  tide_store_close(store);
}

/* ---- output ------------------------------------------------------------------------ */

/* Writes all of buf to fd, waiting when fd is nonblocking; gives up silently
 * when the reader went away. */
static void write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        poll(&pfd, 1, 1000);
        continue;
      }
      return;
    }
    buf += n;
    len -= (size_t)n;
  }
}

/* Writes the complete lines in s->buf, each with the rank prefix, and keeps
 * the partial rest; with final, also the rest, ending it with a newline.
 * Lines go out in as few writes as possible so that lines of different ranks
 * do not interleave. */
static void stream_flush(stream_t *s, int rank, int final) {
  static char out[LINE_CAP + 32];
  size_t out_len = 0;
  size_t start = 0;
  while (start < s->len) {
    char *nl = memchr(s->buf + start, '\n', s->len - start);
    if (nl == NULL && !final) break;
    size_t line_len = nl != NULL ? (size_t)(nl - (s->buf + start)) : s->len - start;
    char prefix[24];
    int prefix_len = snprintf(prefix, sizeof prefix, "[%d] ", rank);
    if (out_len + (size_t)prefix_len + line_len + 1 > sizeof out) {
      write_all(s->out_fd, out, out_len);
      out_len = 0;
    }
    memcpy(out + out_len, prefix, (size_t)prefix_len);
    memcpy(out + out_len + prefix_len, s->buf + start, line_len);
    out_len += (size_t)prefix_len + line_len;
    out[out_len++] = '\n';
    start += line_len + (nl != NULL ? 1 : 0);
  }
  write_all(s->out_fd, out, out_len);
  memmove(s->buf, s->buf + start, s->len - start);
  s->len -= start;
}

static void stream_close(stream_t *s, int rank) {
  if (s->fd < 0) return;
  stream_flush(s, rank, 1);
  close(s->fd);
  s->fd = -1;
}

/* Reads what the rank wrote (one read per wake-up, so that a rank that
 * writes fast does not starve the others); at end of file writes the partial
 * line and closes the stream. */
static void stream_read(stream_t *s, int rank) {
  ssize_t n = read(s->fd, s->buf + s->len, LINE_CAP - s->len);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    stream_close(s, rank);
    return;
  }
  s->len += (size_t)n;
  stream_flush(s, rank, s->len == LINE_CAP); /* a full buffer is one (long) line */
}

/* ---- ranks ------------------------------------------------------------------------- */

static const char *const rank_vars[] = {"TIDE_RANK",      "TIDE_SIZE",      "TIDE_LOCAL_RANK",
                                        "TIDE_LOCAL_SIZE", "TIDE_NODE_RANK", "TIDE_NNODES",
                                        "TIDE_RDZV",      "TIDE_JOB_TOKEN", "TIDE_JOB_ID",
                                        "TIDE_BIND",      "TIDE_CPUS"};
#define NVARS (sizeof rank_vars / sizeof rank_vars[0])

static int is_rank_var(const char *entry) {
  for (size_t k = 0; k < NVARS; k++) {
    size_t n = strlen(rank_vars[k]);
    if (strncmp(entry, rank_vars[k], n) == 0 && entry[n] == '=') return 1;
  }
  return 0;
}

/* tiderun's environment without the rank variables, then values[] for them.
 * Returns a NULL-terminated array to free with free_env. */
static char **rank_env(const char *const values[NVARS]) {
  size_t count = 0;
  while (environ[count] != NULL) count++;
  char **env = calloc(count + NVARS + 1, sizeof *env);
  if (env == NULL) return NULL;
  size_t n = 0;
  for (size_t i = 0; i < count; i++)
    if (!is_rank_var(environ[i])) env[n++] = environ[i];
  for (size_t k = 0; k < NVARS; k++) {
    if (asprintf(&env[n], "%s=%s", rank_vars[k], values[k]) < 0) {
      env[n] = NULL;
      for (size_t j = n - k; j < n; j++) free(env[j]);
      free(env);
      return NULL;
    }
    n++;
  }
  return env;
}

static void free_env(char **env) {
  if (env == NULL) return;
  size_t n = 0;
  while (env[n] != NULL) n++;
  for (size_t j = n - NVARS; j < n; j++) free(env[j]);
  free(env);
}

/* ---- descriptors ---------------------------------------------------------- */

/* The store on node 0 holds a descriptor for every connection (two per
 * rank, and strangers' until it refuses them), so tiderun raises its soft
 * RLIMIT_NOFILE to the hard limit where that is higher. The ranks get the
 * limit tiderun started with back: programs that use select() break above
 * 1024 descriptors. */
static struct rlimit nofile_at_start;
static int nofile_raised;

static void raise_fd_limit(void) {
  struct rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  nofile_at_start = lim;
  rlim_t want = lim.rlim_max == RLIM_INFINITY ? (rlim_t)1 << 20 : lim.rlim_max;
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur >= want) return;
  lim.rlim_cur = want;
  if (setrlimit(RLIMIT_NOFILE, &lim) == 0) nofile_raised = 1;
}

/* In a rank's child before exec (async-signal-safe). */
static void restore_fd_limit(void) {
  if (nofile_raised) setrlimit(RLIMIT_NOFILE, &nofile_at_start);
}

static void child_write(const char *text) {
  ssize_t rc = write(2, text, strlen(text));
  (void)rc;
}

/* --background: says once, before the ranks start, when the kernel refuses
 * SCHED_IDLE (they then run at nice 19), by trying it in a throwaway child. */
static void warn_if_no_idle(void) {
  pid_t pid = fork();
  if (pid == 0) {
    struct sched_param idle = {.sched_priority = 0};
    _exit(sched_setscheduler(0, SCHED_IDLE, &idle) == 0 ? 0 : 1);
  }
  int status = 0;
  if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  fprintf(stderr, "tiderun: warning: the kernel refused SCHED_IDLE; the background ranks run at nice 19\n");
}

/* In the child after fork: only async-signal-safe calls (the store server
 * thread may hold locks that the child's copy will never release). */
static void exec_rank(const options_t *opts, const cpu_set_t *cpus, char **env, const int out_pipe[2],
                      const int err_pipe[2], const sigset_t *old_mask,
                      const struct sigaction *old_sigpipe, pid_t parent) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGTERM); /* tiderun killed with SIGKILL: do not outlive it */
  if (getppid() != parent) _exit(127);
  if (cpus != NULL && sched_setaffinity(0, sizeof *cpus, cpus) != 0)
    child_write("tiderun: warning: cannot bind a rank to its CPUs; it runs unbound\n");
  if (opts->background) {
    /* Inherited through exec by every thread the program starts. */
    struct sched_param idle = {.sched_priority = 0};
    if (sched_setscheduler(0, SCHED_IDLE, &idle) != 0) setpriority(PRIO_PROCESS, 0, 19);
  }
  int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd >= 0 && null_fd != 0) {
    dup2(null_fd, 0);
    close(null_fd);
  }
  if (opts->prefix) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
  }
  sigaction(SIGPIPE, old_sigpipe, NULL);
  sigprocmask(SIG_SETMASK, old_mask, NULL);
  restore_fd_limit();
  execvpe(opts->argv[0], opts->argv, env);
  int err = errno;
  /* One write, so that the lines of two ranks that fail at once do not
   * interleave (concatenated by hand: snprintf is not async-signal-safe). */
  char line[1024];
  size_t at = 0;
  const char *parts[] = {"tiderun: cannot run ", opts->argv[0], ": ", strerror(err), "\n"};
  for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
    for (const char *c = parts[i]; *c && at < sizeof line - 1; c++) line[at++] = *c;
  line[at] = 0;
  child_write(line);
  _exit(127);
}

/* Signals each running rank's process group (the rank itself if the group
 * is gone). */
static void signal_ranks(job_t *job, int sig) {
  for (int i = 0; i < job->nranks; i++) {
    rank_t *r = &job->ranks[i];
    if (!r->running) continue;
    if (kill(-r->pid, sig) != 0) kill(r->pid, sig);
  }
}

/* SIGTERM now, SIGKILL after KILL_AFTER_TERM_MS. */
static void stop_ranks(job_t *job) {
  if (job->term_sent || job->running == 0) return;
  job->term_sent = 1;
  job->stopping = 1;
  job->grace_end = INT64_MAX;
  signal_ranks(job, SIGTERM);
  job->kill_at = tide_deadline_after_ms(KILL_AFTER_TERM_MS);
}

static const char *signal_name(int sig, char *buf, size_t cap) {
  const char *abbrev = sigabbrev_np(sig);
  if (abbrev != NULL)
    snprintf(buf, cap, "SIG%s", abbrev);
  else
    snprintf(buf, cap, "%d", sig);
  return buf;
}

static int elastic_want(job_t *job, int target);
static void job_status(tide_store_t *store, tide_elastic_status_t *st);

/* An elastic worker exited 0: training is over (torchrun's rule), unless it
 * left because the job was asked to shrink (as many still run as wanted).
 * So a program that does not say elastic/done itself still ends the job. */
static void elastic_worker_done(job_t *job, const rank_t *r) {
  if (job->finished || job->store == NULL || job->opts->nnodes > 1) return;
  tide_elastic_status_t st;
  job_status(job->store, &st);
  if (st.done) {
    job->finished = 1;
    return;
  }
  int target = st.target > 0 ? st.target : 0;
  if (job->running >= elastic_want(job, target)) return; /* released by a shrink */
  job->finished = 1;
  fprintf(stderr, "tiderun: worker %d exited with status 0: training is over; no new workers are started\n",
          r->rank);
}

/* A rank ended: report a failure unless tiderun or the user stopped it, and
 * start the grace period at the first one. */
static void rank_ended(job_t *job, rank_t *r, int status) {
  r->running = 0;
  job->running--;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    if (job->opts->elastic && !job->stopping) elastic_worker_done(job, r);
    return;
  }
  if (job->stopping) return;
  char name[32];
  if (job->opts->elastic) {
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (job->first_failure == 0) job->first_failure = code;
    job->failures++;
    /* One write: the workers' output shares the stream, and a line split
     * over two writes can have one of theirs in its middle. */
    char how[64];
    if (WIFEXITED(status))
      snprintf(how, sizeof how, "exited with status %d", code);
    else
      snprintf(how, sizeof how, "was killed by signal %s", signal_name(WTERMSIG(status), name, sizeof name));
    fprintf(stderr, "tiderun: worker %d (pid %d) %s; the others go on%s\n", r->rank, (int)r->pid, how,
            job->failures <= job->opts->max_restarts ? " and a new worker replaces it" : " without a replacement (--max-restarts)");
    return;
  }
  if (WIFEXITED(status))
    fprintf(stderr, "tiderun: rank %d (pid %d) exited with status %d\n", r->rank, (int)r->pid,
            WEXITSTATUS(status));
  else
    fprintf(stderr, "tiderun: rank %d (pid %d) was killed by signal %s\n", r->rank, (int)r->pid,
            signal_name(WTERMSIG(status), name, sizeof name));
  if (job->exit_code != 0) return;
  job->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  if (job->running == 0) return;
  if (job->opts->grace_ms == 0) {
    stop_ranks(job);
    return;
  }
  fprintf(stderr, "tiderun: the other %d rank(s) get %d ms to exit before SIGTERM\n",
          job->running, job->opts->grace_ms);
  job->grace_end = tide_deadline_after_ms(job->opts->grace_ms);
}

/* Reaps the ranks that ended. Before reaping one, kills what it left behind
 * in its process group (a shell's background child, say): such a process
 * would hold the job's output open after tiderun exits. The unreaped rank
 * keeps its pid, and with it the group id, from being reused. */
static void reap(job_t *job) {
  for (;;) {
    siginfo_t si = {0};
    if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid == 0) return;
    pid_t pid = si.si_pid;
    rank_t *r = NULL;
    for (int i = 0; i < job->nranks; i++)
      if (job->ranks[i].pid == pid && job->ranks[i].running) r = &job->ranks[i];
    if (r != NULL) kill(-pid, SIGKILL);
    int status;
    if (waitpid(pid, &status, 0) != pid) return;
    if (r != NULL) rank_ended(job, r, status);
  }
}

static void on_signal(job_t *job, int sig) {
  char name[32];
  signal_name(sig, name, sizeof name);
  if (sig == SIGCHLD) {
    reap(job);
    return;
  }
  if (job->exit_code == 0) job->exit_code = 128 + sig;
  job->stopping = 1;
  if (sig == SIGINT && ++job->interrupts >= 2) {
    fprintf(stderr, "tiderun: second SIGINT, killing %d rank(s)\n", job->running);
    signal_ranks(job, SIGKILL);
    return;
  }
  fprintf(stderr, "tiderun: received %s, forwarding it to %d rank(s)%s\n", name, job->running,
          sig == SIGINT ? " (press Ctrl-C again to kill them)" : "");
  signal_ranks(job, sig);
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static void elastic_poll(job_t *job);

/* Runs until every rank was reaped and its output read (or DRAIN_MS passed). */
static void run_loop(job_t *job, int signal_fd) {
  int nfds_max = 1 + 2 * job->nranks;
  struct pollfd *pfds = calloc((size_t)nfds_max, sizeof *pfds);
  stream_t **owners = calloc((size_t)nfds_max, sizeof *owners);
  int *owner_rank = calloc((size_t)nfds_max, sizeof *owner_rank);
  if (pfds == NULL || owners == NULL || owner_rank == NULL) {
    fprintf(stderr, "tiderun: out of memory\n");
    abort();
  }
  for (;;) {
    int nfds = 0;
    pfds[nfds++] = (struct pollfd){.fd = signal_fd, .events = POLLIN};
    for (int i = 0; i < job->nranks; i++)
      for (int k = 0; k < 2; k++) {
        stream_t *s = &job->ranks[i].streams[k];
        if (s->fd < 0) continue;
        owners[nfds] = s;
        owner_rank[nfds] = job->ranks[i].rank;
        pfds[nfds++] = (struct pollfd){.fd = s->fd, .events = POLLIN};
      }
    if (job->running == 0 && nfds == 1) break;
    if (job->running == 0 && job->drain_end == INT64_MAX)
      job->drain_end = tide_deadline_after_ms(DRAIN_MS);

    int64_t next = min64(min64(job->grace_end, job->kill_at), min64(job->timeout_at, job->drain_end));
    if (job->opts->elastic && !job->stopping) next = min64(next, job->next_poll);
    int timeout_ms = -1;
    if (next != INT64_MAX) {
      int64_t left_ns = next - tide_now_ns();
      timeout_ms = left_ns <= 0 ? 0 : (int)min64((left_ns + 999999) / 1000000, 1 << 30);
    }
    int n = poll(pfds, (nfds_t)nfds, timeout_ms);
    if (n < 0 && errno != EINTR) {
      fprintf(stderr, "tiderun: poll: %s\n", strerror(errno));
      abort();
    }
    if (n > 0) {
      if (pfds[0].revents & POLLIN) {
        struct signalfd_siginfo si;
        while (read(signal_fd, &si, sizeof si) == (ssize_t)sizeof si)
          on_signal(job, (int)si.ssi_signo);
      }
      for (int i = 1; i < nfds; i++)
        if (pfds[i].revents != 0 && owners[i]->fd >= 0) stream_read(owners[i], owner_rank[i]);
    }
    reap(job); /* SIGCHLD coalesces; reaping is cheap */
    if (job->opts->elastic && !job->stopping && tide_now_ns() >= job->next_poll) {
      elastic_poll(job);
      job->next_poll = tide_deadline_after_ms(ELASTIC_POLL_MS);
      /* The pfds array holds two streams per worker: workers may have been added. */
      if (1 + 2 * job->nranks > nfds_max) {
        nfds_max = 1 + 2 * job->capacity;
        pfds = realloc(pfds, (size_t)nfds_max * sizeof *pfds);
        owners = realloc(owners, (size_t)nfds_max * sizeof *owners);
        owner_rank = realloc(owner_rank, (size_t)nfds_max * sizeof *owner_rank);
        if (pfds == NULL || owners == NULL || owner_rank == NULL) {
          fprintf(stderr, "tiderun: out of memory\n");
          abort();
        }
      }
    }

    int64_t now = tide_now_ns();
    if (now >= job->timeout_at) {
      job->timeout_at = INT64_MAX;
      if (job->running > 0) {
        fprintf(stderr, "tiderun: --timeout %d s reached, stopping %d rank(s)\n",
                job->opts->timeout_s, job->running);
        if (job->exit_code == 0) job->exit_code = EXIT_TIMEOUT;
        stop_ranks(job);
      }
    }
    if (now >= job->grace_end) {
      job->grace_end = INT64_MAX;
      if (job->running > 0) {
        fprintf(stderr, "tiderun: sending SIGTERM to the %d remaining rank(s)\n", job->running);
        stop_ranks(job);
      }
    }
    if (now >= job->kill_at) {
      job->kill_at = INT64_MAX;
      if (job->running > 0) {
        fprintf(stderr, "tiderun: sending SIGKILL to the %d remaining rank(s)\n", job->running);
        signal_ranks(job, SIGKILL);
      }
    }
    if (now >= job->drain_end) {
      for (int i = 0; i < job->nranks; i++)
        for (int k = 0; k < 2; k++) stream_close(&job->ranks[i].streams[k], job->ranks[i].rank);
    }
  }
  free(pfds);
  free(owners);
  free(owner_rank);
}

/* Each rank's share of the CPUs tiderun may run on, into ranks[].cpus.
 * Returns -1, after a warning, when the topology cannot be read: the ranks
 * then run unbound. */
static int place_ranks(const options_t *opts, rank_t *ranks) {
  if (opts->bind == TIDE_BIND_NONE) return 0;
  size_t cap = (size_t)opts->nproc * CPU_SETSIZE;
  int *cpus = calloc(cap, sizeof *cpus);
  size_t *first = calloc((size_t)opts->nproc + 1, sizeof *first);
  int rc = cpus != NULL && first != NULL ? tide_bind_plan((tide_bind_t)opts->bind, opts->nproc, cpus, cap, first)
                                         : TIDE_ENOMEM;
  if (rc != 0) {
    fprintf(stderr, "tiderun: warning: cannot place the ranks (%s): they run unbound\n", tide_strerror(rc));
  } else {
    for (int i = 0; i < opts->nproc; i++) {
      CPU_ZERO(&ranks[i].cpus);
      for (size_t k = first[i]; k < first[i + 1]; k++) CPU_SET(cpus[k], &ranks[i].cpus);
      tide_cpus_format(cpus + first[i], first[i + 1] - first[i], ranks[i].cpus_text, sizeof ranks[i].cpus_text);
    }
  }
  free(cpus);
  free(first);
  return rc != 0 ? -1 : 0;
}

/* Creates the rank's pipes (with --prefix) and forks it. Returns 0, or -1
 * after printing why. */
static int start_rank(job_t *job, rank_t *r, char **env, const sigset_t *old_mask,
                      const struct sigaction *old_sigpipe) {
  const options_t *opts = job->opts;
  int pipes[2][2] = {{-1, -1}, {-1, -1}};
  if (opts->prefix) {
    for (int k = 0; k < 2; k++) {
      if (pipe2(pipes[k], O_CLOEXEC) != 0) {
        fprintf(stderr, "tiderun: pipe: %s\n", strerror(errno));
        for (int j = 0; j < k; j++) {
          close(pipes[j][0]);
          close(pipes[j][1]);
        }
        return -1;
      }
    }
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  const cpu_set_t *cpus = opts->bind != TIDE_BIND_NONE ? &r->cpus : NULL;
  if (pid == 0) exec_rank(opts, cpus, env, pipes[0], pipes[1], old_mask, old_sigpipe, parent);
  int fork_errno = errno;
  if (opts->prefix) {
    close(pipes[0][1]);
    close(pipes[1][1]);
  }
  if (pid < 0) {
    fprintf(stderr, "tiderun: cannot start rank %d: fork: %s\n", r->rank, strerror(fork_errno));
    if (opts->prefix) {
      close(pipes[0][0]);
      close(pipes[1][0]);
    }
    return -1;
  }
  setpgid(pid, pid); /* also in the child: whichever runs first */
  r->pid = pid;
  r->running = 1;
  job->running++;
  if (opts->prefix)
    for (int k = 0; k < 2; k++) {
      r->streams[k].fd = pipes[k][0];
      fcntl(pipes[k][0], F_SETFL, fcntl(pipes[k][0], F_GETFL) | O_NONBLOCK);
    }
  const char *text = r->cpus_text;
  if (cpus != NULL)
    tide_log_info("tiderun: rank %d is pid %d, bound to cpus %s (--bind %s)", r->rank, (int)pid, text,
              tide_bind_name((tide_bind_t)opts->bind));
  else
    tide_log_info("tiderun: rank %d is pid %d, unbound (--bind none)", r->rank, (int)pid);
  return 0;
}

/* Starts worker slot i (a joiner of the running job when joiner is set).
 * Returns 0, or -1 after printing why. */
static int launch(job_t *job, int i, int joiner) {
  const options_t *opts = job->opts;
  char rank_text[16], size_text[16], local_text[16], local_size_text[16], node_text[16], nnodes_text[16],
      cpus_text[256] = "unbound";
  snprintf(rank_text, sizeof rank_text, "%d", job->ranks[i].rank);
  snprintf(size_text, sizeof size_text, "%d", opts->nnodes_min * opts->nproc);
  snprintf(local_text, sizeof local_text, "%d", i);
  snprintf(local_size_text, sizeof local_size_text, "%d", opts->nproc);
  snprintf(node_text, sizeof node_text, "%d", opts->node_rank);
  snprintf(nnodes_text, sizeof nnodes_text, "%d", opts->nnodes);
  if (opts->bind != TIDE_BIND_NONE) snprintf(cpus_text, sizeof cpus_text, "%s", job->ranks[i].cpus_text);
  const char *values[NVARS] = {rank_text, size_text, local_text, local_size_text, node_text, nnodes_text,
                               job->rdzv, job->token, job->job_id, tide_bind_name((tide_bind_t)opts->bind), cpus_text};
  /* rank_env copies tiderun's environment: a joiner's mark is set around it. */
  if (joiner) setenv("TIDE_ELASTIC_JOIN", "1", 1);
  char **env = rank_env(values);
  int rc = env != NULL ? start_rank(job, &job->ranks[i], env, job->old_mask, job->old_sigpipe) : -1;
  if (env == NULL) fprintf(stderr, "tiderun: out of memory\n");
  free_env(env);
  if (joiner) unsetenv("TIDE_ELASTIC_JOIN");
  if (rc == 0 && i >= job->nranks) job->nranks = i + 1;
  return rc;
}

/* The job's elastic state (tide_elastic_status); when the store cannot be
 * read, as if nothing were asked: no request, no joiner, not done. */
static void job_status(tide_store_t *store, tide_elastic_status_t *st) {
  if (tide_elastic_status(store, st) != 0)
    *st = (tide_elastic_status_t){.epoch = -1, .members = -1, .target = -1};
}

/* A multi-node elastic job (--nnodes > 1): each node replaces its own failed
 * workers (up to --max-restarts) while the job has fewer than it asked for;
 * node 0 starts the workers a larger request needs, once per request. A
 * released worker (exit 0) is not replaced. */
static void elastic_poll_nodes(job_t *job, const tide_elastic_status_t *st, int target) {
  const options_t *opts = job->opts;
  /* epoch 0's members, the first ones, are not listed in the store */
  int members = st->members >= 0 ? st->members : opts->nnodes_min * opts->nproc;
  int waiting = st->waiting;
  int want = target > 0 ? target : opts->max_np;
  int replaceable = (job->failures < opts->max_restarts ? job->failures : opts->max_restarts) - job->replaced;
  for (; replaceable > 0 && members + waiting < want && job->nranks < job->capacity; replaceable--) {
    fprintf(stderr, "tiderun: starting a worker to replace a failed one (%d members, %d waiting)\n", members, waiting);
    job->replaced++;
    waiting++;
    if (launch(job, job->nranks, 1) != 0) job->nranks++; /* the slot is spent */
  }
  if (opts->node_rank != 0 || target <= 0 || target == job->grown_for) return;
  job->grown_for = target;
  if (target > opts->max_np) target = opts->max_np;
  for (; members + waiting < target && job->nranks < job->capacity; waiting++) {
    fprintf(stderr, "tiderun: starting a worker to join the elastic job (%d members, %d waiting, %d asked for)\n",
            members, waiting, target);
    if (launch(job, job->nranks, 1) != 0) job->nranks++;
  }
}

/* The workers a single-node elastic job should run: the request (tide ctl
 * resize), else -np less the failures beyond --max-restarts. */
static int elastic_want(job_t *job, int target) {
  const options_t *opts = job->opts;
  int unreplaced = job->failures > opts->max_restarts ? job->failures - opts->max_restarts : 0;
  int want = target > 0 ? target : opts->nproc - unreplaced;
  if (want > opts->max_np) want = opts->max_np;
  if (want < opts->min_np) want = opts->min_np;
  return want;
}

/* An elastic job's requests: starts workers while fewer run than asked for
 * (tide ctl resize, else -np), replacing failed or released ones, until the
 * workers say training is over. */
static void elastic_poll(job_t *job) {
  const options_t *opts = job->opts;
  if (job->store == NULL || job->finished) return;
  tide_elastic_status_t st;
  job_status(job->store, &st);
  if (st.done) {
    job->finished = 1;
    return;
  }
  if (job->stopping) return;
  int target = st.target > 0 ? st.target : 0;
  if (opts->nnodes > 1) {
    elastic_poll_nodes(job, &st, target);
    return;
  }
  /* Every worker failed: no member is left to admit new ones. */
  if (job->running == 0 && job->failures > 0) return;
  int want = elastic_want(job, target);
  while (job->running < want && job->nranks < job->capacity) {
    int i = job->nranks;
    fprintf(stderr, "tiderun: starting worker %d to join the elastic job (%d running, %d wanted)\n", i,
            job->running, want);
    if (launch(job, i, 1) != 0) {
      job->nranks = i + 1; /* the slot is spent */
      break;
    }
  }
}

int main(int argc, char **argv) {
  options_t opts;
  int rc = parse_args(argc, argv, &opts);
  if (rc != 0) return rc > 0 ? 0 : EXIT_USAGE;
  if (tide_params_load() != 0) {
    fprintf(stderr, "tiderun: fix the TIDE_* variable named above\n");
    return EXIT_USAGE;
  }
  if (opts.bind < 0) {
    const char *bind_param = NULL;
    tide_bind_t bind = TIDE_BIND_CORE;
    tide_param_get("TIDE_BIND", &bind_param, NULL);
    tide_bind_parse(bind_param, TIDE_BIND_CORE, &bind);
    opts.bind = (int)bind;
  }
  char token_buf[65], id_buf[17];
  const char *token = job_token(&opts, token_buf);
  if (token == NULL) return EXIT_USAGE;
  if (job_id(&opts, token, id_buf) != 0) return 1;
  raise_fd_limit();
  /* With signals still at their defaults, so Ctrl-C ends the wait. */
  if (opts.node_rank != 0 && register_node(&opts, token) != 0) return 1;

  /* Block the signals before any thread starts, so every thread inherits the
   * mask and they all arrive at the signalfd. */
  sigset_t handled, old_mask;
  sigemptyset(&handled);
  sigaddset(&handled, SIGCHLD);
  /* A signal ignored when tiderun started (nohup, a background job of a
   * script) stays ignored, by tiderun and by the ranks alike. */
  const int forwarded[] = {SIGINT, SIGTERM, SIGHUP};
  for (int i = 0; i < 3; i++) {
    struct sigaction current;
    sigaction(forwarded[i], NULL, &current);
    if (current.sa_handler != SIG_IGN) sigaddset(&handled, forwarded[i]);
  }
  pthread_sigmask(SIG_BLOCK, &handled, &old_mask);
  int signal_fd = signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd < 0) {
    fprintf(stderr, "tiderun: signalfd: %s\n", strerror(errno));
    return 1;
  }
  /* A closed stdout must not kill tiderun before it reaped the ranks. */
  struct sigaction ignore = {.sa_handler = SIG_IGN}, old_sigpipe;
  sigaction(SIGPIPE, &ignore, &old_sigpipe);

  tide_store_server_t *server = NULL;
  const char *server_host = "127.0.0.1"; /* where node 0 itself reaches the store */
  int server_port = 0;
  char rdzv[300];
  if (opts.node_rank == 0) {
    const char *bind_host = "127.0.0.1";
    if (opts.rdzv != NULL) {
      bind_host = is_loopback(opts.rdzv_host) ? opts.rdzv_host : NULL; /* NULL: all interfaces */
      server_port = opts.rdzv_port;
      if (bind_host != NULL) server_host = bind_host;
    }
    rc = tide_store_server_start(bind_host, server_port, token, &server);
    if (rc != 0) {
      fprintf(stderr, "tiderun: cannot start the store server on %s:%d: %s (see the error "
                      "above; with --rdzv, is the port already in use?)\n",
              bind_host ? bind_host : "*", server_port, tide_strerror(rc));
      close(signal_fd);
      return 1;
    }
    server_port = tide_store_server_port(server);
    tide_log_info("tiderun: store server listening on %s:%d", bind_host ? bind_host : "*",
              server_port);
  }
  /* The ranks of every node use the same address, so that node 0's ranks
   * advertise the address other nodes can reach. */
  if (opts.rdzv != NULL)
    snprintf(rdzv, sizeof rdzv, "%s", opts.rdzv);
  else
    snprintf(rdzv, sizeof rdzv, "127.0.0.1:%d", server_port);

  job_t job = {.opts = &opts, .nranks = opts.nproc, .grace_end = INT64_MAX,
               .kill_at = INT64_MAX, .timeout_at = INT64_MAX, .drain_end = INT64_MAX};
  if (opts.timeout_s > 0) job.timeout_at = tide_deadline_after_ms((int64_t)opts.timeout_s * 1000);
  /* Elastic: room for replacements and added workers. */
  job.capacity = opts.elastic ? opts.max_np + opts.max_restarts + 4 * opts.max_np + 16 : opts.nproc;
  job.ranks = calloc((size_t)job.capacity, sizeof *job.ranks);
  if (job.ranks == NULL) {
    fprintf(stderr, "tiderun: out of memory\n");
    return 1;
  }
  for (int i = 0; i < job.capacity; i++) {
    rank_t *r = &job.ranks[i];
    r->rank = opts.node_rank * opts.nproc + i;
    for (int k = 0; k < 2; k++) {
      r->streams[k].fd = -1;
      r->streams[k].out_fd = k + 1;
      if (opts.prefix && (r->streams[k].buf = malloc(LINE_CAP)) == NULL) {
        fprintf(stderr, "tiderun: out of memory\n");
        return 1;
      }
    }
  }

  if (place_ranks(&opts, job.ranks) != 0) opts.bind = TIDE_BIND_NONE;
  /* A worker started later takes the CPUs of the initial one it may replace. */
  for (int i = opts.nproc; i < job.capacity; i++) job.ranks[i].cpus = job.ranks[i % opts.nproc].cpus;

  job.rdzv = rdzv;
  job.token = token;
  job.job_id = id_buf;
  job.old_mask = &old_mask;
  job.old_sigpipe = &old_sigpipe;
  if (opts.background) {
    setenv("TIDE_BACKGROUND", "1", 1);
    warn_if_no_idle();
  }
  if (opts.foreground != NULL) setenv("TIDE_FOREGROUND", opts.foreground, 1);
  if (opts.hosts_background) setenv("TIDE_HOSTS_BACKGROUND", "1", 1);
  if (opts.elastic) {
    /* The workers learn the job is elastic from the environment they inherit. */
    char text[32];
    setenv("TIDE_ELASTIC", "1", 1);
    snprintf(text, sizeof text, "%d", opts.min_np);
    setenv("TIDE_ELASTIC_MIN", text, 1);
    snprintf(text, sizeof text, "%d", opts.max_np);
    setenv("TIDE_ELASTIC_MAX", text, 1);
    unsetenv("TIDE_ELASTIC_JOIN");
    rc = opts.node_rank == 0 ? tide_store_connect(server_host, server_port, token, 10000, &job.store)
                             : tide_store_connect(opts.rdzv_host, opts.rdzv_port, token, 10000, &job.store);
    if (rc != 0) {
      fprintf(stderr, "tiderun: cannot read the elastic job's requests from its store: %s\n", tide_strerror(rc));
      job.exit_code = 1;
    }
    job.next_poll = tide_deadline_after_ms(ELASTIC_POLL_MS);
  }
  /* A node beyond the first --nnodes MIN adds its workers to the running job. */
  int late = opts.elastic && opts.node_rank >= opts.nnodes_min;
  for (int i = 0; i < opts.nproc && job.exit_code == 0; i++) {
    if (launch(&job, i, late) != 0) {
      job.exit_code = 1;
      stop_ranks(&job);
    }
  }

  run_loop(&job, signal_fd);

  if (opts.elastic) {
    /* Done when the workers said so; otherwise the first failure. (Read
     * before telling node 0 this node is done: it may then stop the store.) */
    elastic_poll(&job);
    int released = !job.finished && job.first_failure == 0 && opts.nnodes > 1;
    if (released)
      fprintf(stderr, "tiderun: this node's workers were released; the job goes on without them\n");
    else if (job.exit_code == 0 && !job.finished)
      job.exit_code = job.first_failure ? job.first_failure : 1;
    if (!job.finished && job.first_failure == 0 && !released)
      fprintf(stderr, "tiderun: every worker exited but none said training is over\n");
    tide_store_close(job.store);
  }
  if (opts.nnodes > 1 && opts.node_rank != 0) report_node_done(&opts, token);
  if (opts.nnodes > 1 && opts.node_rank == 0 && job.exit_code == 0)
    wait_for_other_nodes(server_host, server_port, token, signal_fd);
  if (server != NULL) tide_store_server_stop(server);
  close(signal_fd);
  for (int i = 0; i < job.capacity; i++)
    for (int k = 0; k < 2; k++) free(job.ranks[i].streams[k].buf);
  free(job.ranks);
  return job.exit_code;
}
