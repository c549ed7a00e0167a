/* The live cluster scheduler (tide sched): a daemon that shares a pool of
 * slots among elastic jobs and reallocates them in place.
 *
 * Each job runs under a keeper: a process forked by the daemon in its own
 * session, which starts `tiderun --elastic` (node 0, so the job's store
 * lives in that tiderun on the scheduler's host, not on a worker a
 * reallocation may take away), forwards a cancel to it, and writes the
 * exit status to the job's directory. A keeper does not depend on the
 * daemon: when the daemon dies the job goes on at its size, and a new
 * daemon on the same directory reads the jobs' state files and takes them
 * over. Every round the daemon runs tide_sched_allocate over the jobs,
 * reading each job's hints (TIDE_SCHED_HINTS_KEY) from its store, and
 * applies a change with tide_elastic_request: the members resize at their
 * next step boundary and tiderun starts or releases workers.
 *
 * State directory: lock (flock: one daemon), sock (the clients' Unix
 * socket), jobs/ID/{state,spec,token,log,exit}.
 *
 * Threads: tide_sched_serve runs on one thread and forks; the client
 * calls may be called from any thread. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "sched/slurm.h"
#include "store/store.h"
#include "tide.h"

#define MAX_REQUEST (4 << 20)
#define TICK_MS 100
#define CHANGE_TICK_MS 10
#define CLIENT_TIMEOUT_MS 5000
#define MAX_NODES 64
#define AGENT_LOST_S 3.0
#define AGENT_START_S 30.0 /* an agent that has not beaten yet (srun starting it, say) */
#define CHANGE_GIVE_UP_S 30.0 /* a change whose workers never came (their host was lost, say) */
#define MULTIPLEX_ACTIVE_KEY "multiplex/active" /* a foreground's count of background jobs beside it */

typedef enum { JOB_PENDING, JOB_RUNNING, JOB_CANCELLING, JOB_DONE, JOB_FAILED, JOB_CANCELLED } job_state_t;
static const char *const state_names[] = {"pending", "running", "cancelling", "done", "failed", "cancelled"};

typedef struct {
  uint64_t id;
  char name[64];
  int min_np, max_np, np;
  double submit, start, finish; /* wall clock, s */
  job_state_t state;
  int exit_code;
  int alloc;  /* slots it has (one node) */
  int np0;    /* workers it started with (epoch 0's members) */
  pid_t keeper;
  unsigned long long keeper_start; /* its start time (/proc), against pid reuse */
  int port;
  char token[40];
  int resizes;
  double attained;              /* slot-seconds */
  int members;                  /* workers in its current membership (census) */
  double change_at;             /* monotonic s of the last decision not yet in effect; 0: none */
  int change_to;
  double last_latency, max_latency; /* s from a decision to the membership that has it */
  tide_store_t *store;
  char hints_text[TIDE_SCHED_HINTS_MAX];
  tide_sched_hints_t hints;
  int has_hints;
  tide_speedup_t *speedup;
  /* Several hosts (the daemon's pool has more than one): */
  int on[MAX_NODES];            /* workers per node as decided */
  int real[MAX_NODES];          /* workers per node in the current membership */
  int pend_leave[MAX_NODES];    /* a move's second half: members to take off once the grow is in */
  int started;                  /* workers the agents were asked to start */
  int started_on[MAX_NODES];    /* of which on each node */
  /* A background job (tide submit --background): no slots; see backgrounds_tick. */
  int background;
  uint64_t fg_list_hash;        /* the foreground list last written to its store (0: none) */
  char progress[64];            /* its guard's "STEP running|paused PAUSES" */
  int64_t backgrounds;          /* a foreground: background jobs running beside it (multiplex/active) */
} job_t;

typedef struct {
  const tide_sched_daemon_options_t *o;
  int total;                    /* slots in the pool */
  job_t *jobs;
  int njobs, cap;
  uint64_t next_id;
  tide_sched_t *sched;
  char jobs_dir[4096];
  sigset_t mask;
  int listen_fd, signal_fd;
  double last_tick;
  int multi;                    /* several hosts: agents start the workers */
  const char *address;          /* this host as agents and workers reach it */
  tide_store_server_t *ctl_server; /* the agents' control store */
  tide_store_t *ctl;
  int dead[MAX_NODES];          /* hosts whose agent stopped beating */
  int64_t beat[MAX_NODES];      /* each agent's last beat count */
  double beat_at[MAX_NODES];    /* and when it changed (monotonic s) */
  double last_beat_check;
  int live[MAX_NODES], nlive;   /* the hosts d->sched allocates over (all but the lost ones) */
  pid_t agents;                 /* a Slurm pool: the agents' srun step; 0: none */
  int agents_status;            /* its wait status once it ended (agents then < 0) */
} daemon_t;

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double mono_s(void) { return (double)tide__now_ns() * 1e-9; }

void tide_sched_daemon_options_init(tide_sched_daemon_options_t *opts) {
  if (opts == NULL) return;
  memset(opts, 0, sizeof *opts);
  opts->nodes = 1;
  opts->interval = 60;
  opts->resize_cost = 0.1;
  tide_sched_options_init(&opts->sched);
}

int tide_sched_default_dir(char *buf, size_t cap) {
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  const char *user = getenv("USER");
  int n;
  if (xdg != NULL && *xdg == '/')
    n = snprintf(buf, cap, "%s/tide-sched", xdg);
  else
    n = snprintf(buf, cap, "/tmp/tide-sched-%s", user != NULL && *user ? user : "user");
  return n > 0 && (size_t)n < cap ? 0 : TIDE_EINVAL;
}

/* ---- the client's side ---------------------------------------------------------- */

static int sock_path(const char *dir, struct sockaddr_un *addr) {
  memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  int n = snprintf(addr->sun_path, sizeof addr->sun_path, "%s/sock", dir);
  if (n < 0 || (size_t)n >= sizeof addr->sun_path) {
    TIDE_ERROR("tide sched: the state directory %s is too long for a Unix socket path (at most %zu "
               "bytes with /sock): choose a shorter --dir",
               dir, sizeof addr->sun_path - 6);
    return TIDE_EINVAL;
  }
  return 0;
}

static int write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Reads until EOF (at most MAX_REQUEST bytes, up to timeout_ms), NUL-terminated. */
static int read_all(int fd, char **out, size_t *len, int timeout_ms) {
  size_t cap = 4096, n = 0;
  char *buf = tide__malloc(cap);
  if (buf == NULL) return TIDE_ENOMEM;
  int64_t deadline = tide__deadline_after_ms(timeout_ms);
  for (;;) {
    if (n + 1 >= cap) {
      if (cap >= MAX_REQUEST) {
        tide__free(buf);
        return TIDE_EPROTO;
      }
      char *b = tide__realloc(buf, cap * 2);
      if (b == NULL) {
        tide__free(buf);
        return TIDE_ENOMEM;
      }
      buf = b, cap *= 2;
    }
    int left = tide__ms_left(deadline);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (left <= 0 || poll(&pfd, 1, left) == 0) {
      tide__free(buf);
      return TIDE_ETIMEDOUT;
    }
    ssize_t r = read(fd, buf + n, cap - n - 1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      tide__free(buf);
      return TIDE_EIO;
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  buf[n] = '\0';
  *out = buf;
  *len = n;
  return 0;
}

/* Sends fields[0..n) (each NUL-terminated) and returns the reply's text in
 * *reply (tide_free); 0 when the daemon accepted the request. */
static int request(const char *dir, const char *const *fields, int n, char **reply) {
  struct sockaddr_un addr;
  int rc = sock_path(dir, &addr);
  if (rc != 0) return rc;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return TIDE_EIO;
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    int e = errno;
    close(fd);
    TIDE_ERROR("no tide sched serves %s (%s): start one with `tide sched --slots N --dir %s`", dir, strerror(e), dir);
    return TIDE_ENOENT;
  }
  for (int i = 0; i < n; i++)
    if (write_all(fd, fields[i], strlen(fields[i]) + 1) != 0) {
      close(fd);
      TIDE_ERROR("tide sched at %s: the request could not be sent", dir);
      return TIDE_EIO;
    }
  shutdown(fd, SHUT_WR);
  char *text;
  size_t len;
  rc = read_all(fd, &text, &len, 30000);
  close(fd);
  if (rc != 0 || len == 0) {
    if (rc == 0) tide__free(text);
    TIDE_ERROR("tide sched at %s did not answer (%s)", dir, rc ? tide_strerror(rc) : "closed");
    return rc ? rc : TIDE_EIO;
  }
  int ok = text[0] == '0';
  memmove(text, text + 1, len);
  if (!ok) {
    TIDE_ERROR("tide sched: %s", text);
    tide__free(text);
    return TIDE_EINVAL;
  }
  *reply = text;
  return 0;
}

void tide_sched_submit_options_init(tide_sched_submit_options_t *opts) {
  if (opts != NULL) memset(opts, 0, sizeof *opts);
}

int tide_sched_submit(const char *dir, const char *name, int min_np, int max_np, int np, const char *cwd, int argc,
                        char *const *argv, char *const *envp, char *id, size_t cap) {
  tide_sched_submit_options_t o = {.name = name, .min_np = min_np, .max_np = max_np, .np = np};
  return tide_sched_submit_job(dir, &o, cwd, argc, argv, envp, id, cap);
}

int tide_sched_submit_job(const char *dir, const tide_sched_submit_options_t *opts, const char *cwd, int argc,
                          char *const *argv, char *const *envp, char *id, size_t cap) {
  if (opts == NULL) {
    TIDE_ERROR("tide_sched_submit_job: opts must be given (tide_sched_submit_options_init)");
    return TIDE_EINVAL;
  }
  const char *name = opts->name;
  int min_np = opts->min_np, max_np = opts->max_np, np = opts->np;
  if (dir == NULL || cwd == NULL || argc < 1 || argv == NULL || id == NULL || cap == 0) {
    TIDE_ERROR("tide_sched_submit: dir, cwd, a program (argc >= 1) and id must be given");
    return TIDE_EINVAL;
  }
  int nenv = 0;
  while (envp != NULL && envp[nenv] != NULL) nenv++;
  int n = 8 + argc + nenv;
  const char **f = tide__calloc((size_t)n, sizeof *f);
  if (f == NULL) return TIDE_ENOMEM;
  char nums[4][32];
  snprintf(nums[0], sizeof nums[0], "%d", min_np);
  snprintf(nums[1], sizeof nums[1], "%d", max_np);
  snprintf(nums[2], sizeof nums[2], "%d", np);
  snprintf(nums[3], sizeof nums[3], "%d", argc);
  int k = 0;
  f[k++] = opts->background ? "submit-background" : "submit";
  f[k++] = name != NULL ? name : "";
  f[k++] = nums[0];
  f[k++] = nums[1];
  f[k++] = nums[2];
  f[k++] = cwd;
  f[k++] = nums[3];
  for (int i = 0; i < argc; i++) f[k++] = argv[i];
  for (int i = 0; i < nenv; i++) f[k++] = envp[i];
  char *reply;
  int rc = request(dir, f, k, &reply);
  tide__free(f);
  if (rc != 0) return rc;
  snprintf(id, cap, "%s", reply);
  tide__free(reply);
  return 0;
}

int tide_sched_jobs(const char *dir, char **text) {
  if (dir == NULL || text == NULL) return TIDE_EINVAL;
  const char *f[] = {"jobs"};
  return request(dir, f, 1, text);
}

int tide_sched_cancel(const char *dir, const char *job) {
  if (dir == NULL || job == NULL) return TIDE_EINVAL;
  const char *f[] = {"cancel", job};
  char *reply;
  int rc = request(dir, f, 2, &reply);
  if (rc == 0) tide__free(reply);
  return rc;
}

int tide_sched_job_state(const char *dir, const char *job, char *buf, size_t cap) {
  if (dir == NULL || job == NULL || buf == NULL || cap == 0) return TIDE_EINVAL;
  const char *f[] = {"state", job};
  char *reply;
  int rc = request(dir, f, 2, &reply);
  if (rc != 0) return rc;
  snprintf(buf, cap, "%s", reply);
  tide__free(reply);
  return 0;
}

/* ---- jobs' files -------------------------------------------------------------- */

static void job_path(const daemon_t *d, const job_t *j, const char *file, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/%llu/%s", d->jobs_dir, (unsigned long long)j->id, file);
}

static int save_job(const daemon_t *d, const job_t *j) {
  char path[4200], tmp[4300];
  job_path(d, j, "state", path, sizeof path);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (f == NULL) {
    TIDE_ERROR("tide sched: cannot write %s: %s", tmp, strerror(errno));
    return TIDE_EIO;
  }
  fprintf(f, "name %s\nmin %d\nmax %d\nnp %d\nsubmit %.6f\nstart %.6f\nfinish %.6f\nstate %s\nexit %d\n"
             "alloc %d\nnp0 %d\nkeeper %d\nkeeper_start %llu\nport %d\nresizes %d\nattained %.3f\nlatency %.6f\nmax_latency %.6f\n",
          j->name, j->min_np, j->max_np, j->np, j->submit, j->start, j->finish, state_names[j->state], j->exit_code,
          j->alloc, j->np0, (int)j->keeper, j->keeper_start, j->port, j->resizes, j->attained, j->last_latency, j->max_latency);
  if (d->multi) {
    fprintf(f, "started %d\non", j->started);
    for (int n = 0; n < d->o->nodes; n++) fprintf(f, "%c%d", n ? ',' : ' ', j->on[n]);
    fprintf(f, "\nstarted_on");
    for (int n = 0; n < d->o->nodes; n++) fprintf(f, "%c%d", n ? ',' : ' ', j->started_on[n]);
    fprintf(f, "\n");
  }
  if (j->background) fprintf(f, "background 1\n");
  if (fclose(f) != 0 || rename(tmp, path) != 0) {
    TIDE_ERROR("tide sched: cannot write %s: %s", path, strerror(errno));
    return TIDE_EIO;
  }
  return 0;
}

static int load_job(const daemon_t *d, job_t *j) {
  char path[4200], key[32], value[256];
  job_path(d, j, "state", path, sizeof path);
  FILE *f = fopen(path, "r");
  if (f == NULL) return TIDE_ENOENT;
  int got = 0;
  while (fscanf(f, "%31s %255[^\n]", key, value) == 2) {
    got++;
    if (strcmp(key, "name") == 0) snprintf(j->name, sizeof j->name, "%.63s", value);
    else if (strcmp(key, "min") == 0) j->min_np = atoi(value);
    else if (strcmp(key, "max") == 0) j->max_np = atoi(value);
    else if (strcmp(key, "np") == 0) j->np = atoi(value);
    else if (strcmp(key, "submit") == 0) j->submit = atof(value);
    else if (strcmp(key, "start") == 0) j->start = atof(value);
    else if (strcmp(key, "finish") == 0) j->finish = atof(value);
    else if (strcmp(key, "exit") == 0) j->exit_code = atoi(value);
    else if (strcmp(key, "alloc") == 0) j->alloc = atoi(value);
    else if (strcmp(key, "np0") == 0) j->np0 = atoi(value);
    else if (strcmp(key, "keeper") == 0) j->keeper = (pid_t)atoi(value);
    else if (strcmp(key, "port") == 0) j->port = atoi(value);
    else if (strcmp(key, "keeper_start") == 0) j->keeper_start = strtoull(value, NULL, 10);
    else if (strcmp(key, "resizes") == 0) j->resizes = atoi(value);
    else if (strcmp(key, "attained") == 0) j->attained = atof(value);
    else if (strcmp(key, "latency") == 0) j->last_latency = atof(value);
    else if (strcmp(key, "max_latency") == 0) j->max_latency = atof(value);
    else if (strcmp(key, "started") == 0) j->started = atoi(value);
    else if (strcmp(key, "background") == 0) j->background = atoi(value);
    else if (strcmp(key, "on") == 0 || strcmp(key, "started_on") == 0) {
      int *v = key[0] == 'o' ? j->on : j->started_on;
      char *p = value;
      for (int n = 0; n < MAX_NODES && *p; n++) {
        v[n] = (int)strtol(p, &p, 10);
        if (*p == ',') p++;
      }
    }
    else if (strcmp(key, "state") == 0) {
      for (int s = 0; s <= JOB_CANCELLED; s++)
        if (strcmp(value, state_names[s]) == 0) j->state = (job_state_t)s;
    }
  }
  fclose(f);
  if (got < 8) {
    TIDE_WARN("tide sched: %s is incomplete; job %llu is skipped", path, (unsigned long long)j->id);
    return TIDE_EINVAL;
  }
  job_path(d, j, "token", path, sizeof path);
  f = fopen(path, "r");
  if (f != NULL) {
    if (fscanf(f, "%39s", j->token) != 1) j->token[0] = 0;
    fclose(f);
  }
  return 0;
}

/* A file's integer content; -1 with *ok 0 when absent. */
static int read_int_file(const char *path, int *ok) {
  FILE *f = fopen(path, "r");
  int v = -1;
  *ok = f != NULL && fscanf(f, "%d", &v) == 1;
  if (f != NULL) fclose(f);
  return v;
}

static job_t *add_job(daemon_t *d) {
  if (d->njobs == d->cap) {
    int cap = d->cap ? d->cap * 2 : 16;
    job_t *jobs = tide__realloc(d->jobs, (size_t)cap * sizeof *jobs);
    if (jobs == NULL) return NULL;
    d->jobs = jobs, d->cap = cap;
  }
  job_t *j = &d->jobs[d->njobs++];
  memset(j, 0, sizeof *j);
  j->keeper = -1;
  return j;
}

static int by_id(const void *a, const void *b) {
  const job_t *x = a, *y = b;
  return x->id < y->id ? -1 : x->id > y->id;
}

static int load_jobs(daemon_t *d) {
  DIR *dir = opendir(d->jobs_dir);
  if (dir == NULL) return 0;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    char *end;
    unsigned long long id = strtoull(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    job_t *j = add_job(d);
    if (j == NULL) break;
    j->id = id;
    if (load_job(d, j) != 0) {
      d->njobs--;
      continue;
    }
    if (id >= d->next_id) d->next_id = id + 1;
    if (j->state == JOB_RUNNING || j->state == JOB_CANCELLING)
      TIDE_INFO("tide sched: found job %llu (%s), %s on %d slot(s), keeper %d", id, j->name, state_names[j->state],
                j->alloc, (int)j->keeper);
  }
  closedir(dir);
  if (d->njobs > 1) qsort(d->jobs, (size_t)d->njobs, sizeof *d->jobs, by_id);
  return 0;
}

/* ---- a job's store -------------------------------------------------------------- */

static void job_disconnect(job_t *j) {
  tide_store_close(j->store);
  j->store = NULL;
}

static int job_connect(job_t *j) {
  if (j->store != NULL) return 0;
  if (j->port <= 0 || j->token[0] == 0) return TIDE_ESTATE;
  return tide_store_connect("127.0.0.1", j->port, j->token, 20, &j->store);
}

/* Workers in the job's current membership (epoch 0: the first ones). */
static int job_census(job_t *j, int *members) {
  int64_t epoch = 0;
  int rc = tide_store_add(j->store, "elastic/epoch", 0, &epoch);
  if (rc != 0) return rc;
  if (epoch == 0) {
    *members = j->np0;
    return 0;
  }
  char key[64];
  snprintf(key, sizeof key, "elastic/e%lld/members", (long long)epoch);
  void *value;
  size_t len;
  if (tide_store_get(j->store, key, 0, &value, &len) != 0) return 0; /* being sealed: unchanged */
  const char *ids = value;
  int n = 0;
  for (size_t i = 0; i < len && ids[0] != '!'; i++)
    if (ids[i] != ' ' && (i == 0 || ids[i - 1] == ' ')) n++;
  tide_free(value);
  *members = n;
  return 0;
}

/* Reads the job's hints; rebuilds its speedup function when they changed. */
static void job_read_hints(job_t *j) {
  void *value;
  size_t len;
  if (tide_store_get(j->store, TIDE_SCHED_HINTS_KEY, 0, &value, &len) != 0) return;
  char text[TIDE_SCHED_HINTS_MAX];
  size_t n = len < sizeof text - 1 ? len : sizeof text - 1;
  memcpy(text, value, n);
  text[n] = '\0';
  tide_free(value);
  if (strcmp(text, j->hints_text) == 0) return;
  tide_sched_hints_t h;
  tide_speedup_t *sp;
  if (tide_sched_hints_decode(text, &h) != 0 || tide_speedup_create(&h, &sp) != 0) {
    TIDE_WARN_RATELIMITED(NULL, "tide sched: job %llu published hints it cannot use: %s", (unsigned long long)j->id,
                          text);
    snprintf(j->hints_text, sizeof j->hints_text, "%s", text);
    return;
  }
  tide_speedup_destroy(j->speedup);
  j->speedup = sp;
  j->hints = h;
  j->has_hints = 1;
  snprintf(j->hints_text, sizeof j->hints_text, "%s", text);
}

/* A process's start time (clock ticks after boot, /proc/PID/stat field 22)
 * and whether it is a zombie; 0 when it does not exist or there is no /proc. */
static unsigned long long proc_start(pid_t pid, int *zombie) {
  char path[64], text[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  *zombie = 0;
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  char *p = strrchr(text, ')'); /* after the command name, which may hold spaces */
  if (p == NULL) return 0;
  char state;
  unsigned long long start = 0;
  if (sscanf(p + 1, " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu", &state,
             &start) != 2)
    return 0;
  *zombie = state == 'Z';
  return start;
}

/* The job's keeper is still the process it was (a pid reused by another
 * process does not count, nor a zombie: it wrote its exit status first). */
static int keeper_alive(const job_t *j) {
  if (j->keeper <= 0 || (kill(j->keeper, 0) != 0 && errno == ESRCH)) return 0;
  int zombie;
  unsigned long long start = proc_start(j->keeper, &zombie);
  if (j->keeper_start == 0) return !zombie; /* no /proc when it started */
  return start == j->keeper_start && !zombie;
}

/* ---- keepers ---------------------------------------------------------------------- */

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

static int random_token(char *out, size_t cap) {
  unsigned char bytes[16];
  int rc = tide__random_bytes(bytes, sizeof bytes);
  if (rc != 0) return rc;
  for (size_t i = 0; i < sizeof bytes && 2 * i + 2 < cap; i++) snprintf(out + 2 * i, 3, "%02x", bytes[i]);
  return 0;
}

/* The submission as saved in jobs/ID/spec: cwd, argc, argv..., env... */
typedef struct {
  char *buf;
  const char *cwd;
  char **argv, **envp;
} spec_t;

static int read_spec(const char *path, spec_t *s) {
  memset(s, 0, sizeof *s);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return TIDE_ENOENT;
  size_t len;
  int rc = read_all(fd, &s->buf, &len, 5000);
  close(fd);
  if (rc != 0) return rc;
  int nf = 0;
  for (size_t i = 0; i < len; i++) nf += s->buf[i] == '\0';
  char **f = tide__calloc((size_t)nf + 2, sizeof *f);
  if (f == NULL) return TIDE_ENOMEM;
  size_t at = 0;
  for (int i = 0; i < nf; i++) {
    f[i] = s->buf + at;
    at += strlen(s->buf + at) + 1;
  }
  int argc = nf >= 2 ? atoi(f[1]) : 0;
  if (argc < 1 || argc + 2 > nf) {
    tide__free(f);
    tide__free(s->buf);
    return TIDE_EINVAL;
  }
  /* f: cwd argc argv[0..argc) env... ; NULL-terminate argv by moving env up one. */
  s->cwd = f[0];
  char **all = tide__calloc((size_t)nf + 2, sizeof *all);
  if (all == NULL) {
    tide__free(f);
    return TIDE_ENOMEM;
  }
  int k = 0;
  for (int i = 0; i < argc; i++) all[k++] = f[2 + i];
  all[k++] = NULL;
  for (int i = 2 + argc; i < nf; i++) all[k++] = f[i];
  all[k] = NULL;
  s->argv = all;
  s->envp = all + argc + 1;
  tide__free(f);
  return 0;
}

static void free_spec(spec_t *s) {
  tide__free(s->argv);
  tide__free(s->buf);
}

/* A keeper's start (its own session, output to the job's log, no
 * inherited descriptors) and end (its status to the job's exit file). */
static void keeper_io(const char *job_dir) {
  setsid();
  char path[4400];
  snprintf(path, sizeof path, "%s/log", job_dir);
  int log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (log_fd >= 0) dup2(log_fd, 1), dup2(log_fd, 2);
  if (null_fd >= 0) dup2(null_fd, 0);
  for (int fd = 3; fd < 1024; fd++) close(fd);
}

static void __attribute__((noreturn)) keeper_exit(const char *job_dir, int code) {
  char path[4400];
  char tmp[4500];
  snprintf(path, sizeof path, "%s/exit", job_dir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (f != NULL) {
    fprintf(f, "%d\n", code);
    fclose(f);
    rename(tmp, path);
  }
  _exit(0);
}

/* The variables of multiplexing, which tide sched sets itself: a foreground
 * publishes its step times, a background follows tide sched's list. */
static int multiplex_env(const char *e) {
  static const char *const names[] = {"TIDE_FOREGROUND=", "TIDE_FOREGROUND_TOKEN=", "TIDE_FOREGROUND_LIST=",
                                      "TIDE_HOSTS_BACKGROUND="};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strncmp(e, names[i], strlen(names[i])) == 0) return 1;
  return 0;
}

/* The keeper (child of fork, in its own session): starts tiderun, forwards
 * SIGTERM/SIGINT/SIGHUP to it, writes its exit status to jobs/ID/exit.
 * Never returns. */
static void __attribute__((noreturn)) keeper_main(const char *tiderun, const char *job_dir, spec_t *s, int np,
                                                  const job_t *j, const sigset_t *mask) {
  keeper_io(job_dir);
  char rdzv[64], min_np[16], max_np[16], nps[16];
  snprintf(rdzv, sizeof rdzv, "127.0.0.1:%d", j->port);
  snprintf(min_np, sizeof min_np, "%d", j->min_np);
  snprintf(max_np, sizeof max_np, "%d", j->max_np);
  snprintf(nps, sizeof nps, "%d", np);
  int argc = 0;
  while (s->argv[argc] != NULL) argc++;
  const char *fixed[] = {tiderun, "--elastic", "--rdzv", rdzv, "--min-np", min_np, "--max-np", max_np, "-np",
                         nps, "--bind", "none", "--"};
  const char *background[] = {tiderun, "--background", "--rdzv", rdzv, "-np", nps, "--bind", "none", "--"};
  int nfixed = (int)(sizeof fixed / sizeof fixed[0]);
  if (j->background) nfixed = (int)(sizeof background / sizeof background[0]);
  char **args = tide__calloc((size_t)(nfixed + argc + 1), sizeof *args);
  int nenv = 0;
  while (s->envp[nenv] != NULL) nenv++;
  char **env = tide__calloc((size_t)nenv + 4, sizeof *env);
  if (args == NULL || env == NULL) _exit(1);
  for (int i = 0; i < nfixed; i++) args[i] = (char *)(j->background ? background[i] : fixed[i]);
  for (int i = 0; i < argc; i++) args[nfixed + i] = s->argv[i];
  int k = 0;
  for (int i = 0; i < nenv; i++)
    if (strncmp(s->envp[i], "TIDE_JOB_TOKEN=", 15) != 0 && strncmp(s->envp[i], "TIDE_SCHED_JOB=", 15) != 0 &&
        !multiplex_env(s->envp[i]))
      env[k++] = s->envp[i];
  char token_env[64], id_env[64];
  snprintf(token_env, sizeof token_env, "TIDE_JOB_TOKEN=%s", j->token);
  snprintf(id_env, sizeof id_env, "TIDE_SCHED_JOB=%llu", (unsigned long long)j->id);
  env[k++] = token_env;
  env[k++] = id_env;
  env[k++] = j->background ? "TIDE_FOREGROUND_LIST=1" : "TIDE_HOSTS_BACKGROUND=1"; /* backgrounds_tick */
  env[k] = NULL;
  pid_t child = fork();
  if (child == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (chdir(s->cwd) != 0) {
      fprintf(stderr, "tide sched: cannot enter the job's directory %s: %s\n", s->cwd, strerror(errno));
      _exit(127);
    }
    execve(tiderun, args, env);
    fprintf(stderr, "tide sched: cannot run %s: %s\n", tiderun, strerror(errno));
    _exit(127);
  }
  int code = 1;
  if (child > 0) {
    for (;;) {
      siginfo_t si;
      int sig = sigwaitinfo(mask, &si);
      if (sig < 0) continue;
      if (sig != SIGCHLD) {
        kill(child, SIGTERM);
        continue;
      }
      int status;
      pid_t got = waitpid(child, &status, WNOHANG);
      if (got != child) continue;
      code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
  }
  tide__free(args);
  tide__free(env);
  free_spec(s);
  keeper_exit(job_dir, code);
}

/* A starting job's store port and token (saved in its directory's token file). */
static int job_credentials(job_t *j, const char *job_dir) {
  char path[4300];
  j->port = free_port();
  if (j->port < 0 || random_token(j->token, sizeof j->token) != 0) {
    TIDE_ERROR("tide sched: job %llu: no free port or random token", (unsigned long long)j->id);
    return TIDE_EIO;
  }
  snprintf(path, sizeof path, "%s/token", job_dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || write_all(fd, j->token, strlen(j->token)) != 0) {
    if (fd >= 0) close(fd);
    TIDE_ERROR("tide sched: cannot write %s: %s", path, strerror(errno));
    return TIDE_EIO;
  }
  close(fd);
  return 0;
}

static int start_job(daemon_t *d, job_t *j, int slots) {
  char job_dir[4200], path[4300];
  snprintf(job_dir, sizeof job_dir, "%s/%llu", d->jobs_dir, (unsigned long long)j->id);
  snprintf(path, sizeof path, "%s/spec", job_dir);
  spec_t s;
  int rc = read_spec(path, &s);
  if (rc != 0) {
    TIDE_ERROR("tide sched: job %llu: cannot read %s: %s", (unsigned long long)j->id, path, tide_strerror(rc));
    j->state = JOB_FAILED;
    j->exit_code = -1;
    j->finish = wall_s();
    save_job(d, j);
    return rc;
  }
  if ((rc = job_credentials(j, job_dir)) != 0) {
    free_spec(&s);
    return rc;
  }
  j->np0 = slots;
  j->alloc = slots;
  j->members = slots;
  j->start = wall_s();
  j->state = JOB_RUNNING;
  pid_t pid = fork();
  if (pid == 0) keeper_main(d->o->tiderun, job_dir, &s, slots, j, &d->mask);
  free_spec(&s);
  if (pid < 0) {
    TIDE_ERROR("tide sched: fork: %s", strerror(errno));
    j->state = JOB_PENDING;
    return TIDE_EIO;
  }
  j->keeper = pid;
  int zombie;
  j->keeper_start = proc_start(pid, &zombie);
  if (!d->o->quiet)
    fprintf(stderr, "tide sched: job %llu (%s) starts on %d slot(s)\n", (unsigned long long)j->id, j->name, slots);
  return save_job(d, j);
}

/* ---- rounds ---------------------------------------------------------------------- */

static int active(const job_t *j) { return j->state == JOB_PENDING || j->state == JOB_RUNNING; }

/* Jobs the allocator divides the slots among: background jobs take none. */
static int allocated(const job_t *j) { return active(j) && !j->background; }

static int used_slots(const daemon_t *d) {
  int used = 0;
  for (int i = 0; i < d->njobs; i++)
    if (d->jobs[i].state == JOB_RUNNING || d->jobs[i].state == JOB_CANCELLING) used += d->jobs[i].alloc;
  return used;
}

static void resize_job(daemon_t *d, job_t *j, int slots) {
  if (slots == j->alloc) return;
  if (job_connect(j) != 0 || tide_elastic_request(j->store, slots) != 0) {
    job_disconnect(j);
    TIDE_WARN("tide sched: job %llu: cannot reach its store to resize it; it stays on %d slot(s)",
              (unsigned long long)j->id, j->alloc);
    return;
  }
  if (!d->o->quiet)
    fprintf(stderr, "tide sched: job %llu (%s): %d -> %d slot(s)\n", (unsigned long long)j->id, j->name, j->alloc,
            slots);
  j->alloc = slots;
  j->resizes++;
  j->change_at = mono_s();
  j->change_to = slots;
  save_job(d, j);
}

static void allocate_apply_multi(daemon_t *d, job_t **map, int n, const int *next);

static void allocate(daemon_t *d) {
  int n = 0;
  for (int i = 0; i < d->njobs; i++) n += allocated(&d->jobs[i]);
  if (n == 0) return;
  if (d->multi && d->nlive == 0) return;
  int nodes = d->multi ? d->nlive : 1;
  tide_sched_job_t *sj = tide__calloc((size_t)n, sizeof *sj);
  int *cur = tide__calloc((size_t)n * nodes, sizeof *cur), *next = tide__calloc((size_t)n * nodes, sizeof *next);
  job_t **map = tide__calloc((size_t)n, sizeof *map);
  if (sj == NULL || cur == NULL || next == NULL || map == NULL) goto out;
  double now = wall_s();
  int k = 0;
  for (int i = 0; i < d->njobs; i++) {
    job_t *j = &d->jobs[i];
    if (!allocated(j)) continue;
    if (j->state == JOB_RUNNING && job_connect(j) == 0) job_read_hints(j);
    map[k] = j;
    sj[k] = (tide_sched_job_t){.id = j->id, .submit_time = j->submit, .min_slots = j->min_np,
                               .max_slots = j->max_np, .requested = j->np, .attained = j->attained,
                               .resize_cost = j->last_latency > 0 ? j->last_latency : d->o->resize_cost,
                               .resizes = j->resizes, .remaining = 1,
                               .speedup = j->speedup ? tide_speedup_cb : NULL, .speedup_arg = j->speedup};
    if (d->multi)
      for (int m = 0; m < nodes; m++) cur[k * nodes + m] = j->state == JOB_RUNNING ? j->on[d->live[m]] : 0;
    else
      cur[k] = j->state == JOB_RUNNING ? j->alloc : 0;
    k++;
  }
  if (tide_sched_allocate(d->sched, now, sj, n, cur, next) != 0) {
    TIDE_WARN("tide sched: the allocation round failed; allocations unchanged");
    goto out;
  }
  if (d->multi) { /* rows over every host, the lost ones 0 */
    int *full = tide__calloc((size_t)n * d->o->nodes, sizeof *full);
    if (full == NULL) goto out;
    for (int i = 0; i < n; i++)
      for (int m = 0; m < nodes; m++) full[(size_t)i * d->o->nodes + d->live[m]] = next[(size_t)i * nodes + m];
    allocate_apply_multi(d, map, n, full);
    tide__free(full);
    goto out;
  }
  /* A running job cannot be suspended: it keeps at least its minimum. */
  for (int i = 0; i < n; i++)
    if (map[i]->state == JOB_RUNNING && next[i] < map[i]->min_np) next[i] = map[i]->min_np;
  /* Shrinks first, then grows and starts while they fit. */
  for (int i = 0; i < n; i++)
    if (map[i]->state == JOB_RUNNING && next[i] < cur[i]) resize_job(d, map[i], next[i]);
  for (int i = 0; i < n; i++) {
    int free_slots = d->total - used_slots(d);
    job_t *j = map[i];
    if (j->state == JOB_RUNNING && next[i] > cur[i]) {
      int want = next[i] - cur[i] <= free_slots ? next[i] : cur[i] + free_slots;
      if (want > cur[i]) resize_job(d, j, want);
    } else if (j->state == JOB_PENDING && next[i] >= j->min_np && next[i] > 0 && next[i] <= free_slots) {
      start_job(d, j, next[i]);
    }
  }
out:
  tide__free(sj);
  tide__free(cur);
  tide__free(next);
  tide__free(map);
}

/* ---- several hosts: agents ------------------------------------------------------ */

/* Sends a command line to node's agent (agent/N/cmd/SEQ in the control store). */
static int agent_cmd(daemon_t *d, int node, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int agent_cmd(daemon_t *d, int node, const char *fmt, ...) {
  char key[64], text[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  int64_t seq;
  snprintf(key, sizeof key, "agent/%d/next", node);
  int rc = tide_store_add(d->ctl, key, 1, &seq);
  if (rc == 0) {
    snprintf(key, sizeof key, "agent/%d/cmd/%lld", node, (long long)seq);
    rc = tide_store_set(d->ctl, key, text, strlen(text));
  }
  if (rc != 0) TIDE_WARN("tide sched: cannot reach the control store to tell host %d: %s", node, text);
  return rc;
}

static int sum_nodes(const daemon_t *d, const int *v) {
  int t = 0;
  for (int n = 0; n < d->o->nodes; n++) t += v[n];
  return t;
}

/* Asks node's agent for k workers of job j: joiners, or ranks first..first+k-1
 * of a starting job of size `size`. */
static void place_workers(daemon_t *d, job_t *j, int node, int k, int first, int size) {
  for (int i = 0; i < k; i++) {
    if (agent_cmd(d, node, "start %llu %s:%d %d %d %d %d", (unsigned long long)j->id, d->address, j->port,
                  first < 0 ? -1 : first + i, size, j->min_np, j->max_np) == 0)
      j->started++, j->started_on[node]++;
  }
}

/* The keeper of a multi-host job: hosts the job's store (so that it stays
 * with the scheduler, whatever hosts the workers leave) until SIGTERM. */
static void __attribute__((noreturn)) keeper_store_main(const char *job_dir, const job_t *j, const sigset_t *mask) {
  keeper_io(job_dir);
  tide_store_server_t *server = NULL;
  int code = tide_store_server_start(NULL, j->port, j->token, &server) == 0 ? 0 : 1;
  if (code != 0) fprintf(stderr, "tide sched: job %llu: cannot serve its store on port %d\n", (unsigned long long)j->id, j->port);
  for (; code == 0;) {
    siginfo_t si;
    int sig = sigwaitinfo(mask, &si);
    if (sig > 0 && sig != SIGCHLD) break;
  }
  tide_store_server_stop(server);
  keeper_exit(job_dir, code);
}

/* Starts job j with per_node[n] workers on node n: its keeper (the store),
 * the initial ranks' hosts in the store, then the agents start the ranks. */
static int start_job_multi(daemon_t *d, job_t *j, const int *per_node) {
  char job_dir[4200];
  snprintf(job_dir, sizeof job_dir, "%s/%llu", d->jobs_dir, (unsigned long long)j->id);
  int size = sum_nodes(d, per_node);
  int rc = job_credentials(j, job_dir);
  if (rc != 0) return rc;
  pid_t pid = fork();
  if (pid == 0) keeper_store_main(job_dir, j, &d->mask);
  if (pid < 0) {
    TIDE_ERROR("tide sched: fork: %s", strerror(errno));
    return TIDE_EIO;
  }
  j->keeper = pid;
  int zombie;
  j->keeper_start = proc_start(pid, &zombie);
  job_disconnect(j);
  rc = tide_store_connect("127.0.0.1", j->port, j->token, 5000, &j->store);
  char key[64], value[16];
  for (int n = 0, r = 0; rc == 0 && n < d->o->nodes; n++)
    for (int i = 0; rc == 0 && i < per_node[n]; i++, r++) {
      snprintf(key, sizeof key, "elastic/node/r%d", r);
      snprintf(value, sizeof value, "%d", n);
      rc = tide_store_set(j->store, key, value, strlen(value));
    }
  if (rc != 0) {
    TIDE_ERROR("tide sched: job %llu: its keeper's store did not come up: %s", (unsigned long long)j->id,
               tide_strerror(rc));
    kill(pid, SIGTERM);
    j->keeper = -1;
    return rc;
  }
  j->np0 = j->alloc = j->members = size;
  j->start = wall_s();
  j->state = JOB_RUNNING;
  j->started = 0;
  memset(j->started_on, 0, sizeof j->started_on);
  for (int n = 0, r = 0; n < d->o->nodes; n++) {
    j->on[n] = j->real[n] = per_node[n];
    place_workers(d, j, n, per_node[n], r, size);
    r += per_node[n];
  }
  if (!d->o->quiet) {
    fprintf(stderr, "tide sched: job %llu (%s) starts on %d slot(s):", (unsigned long long)j->id, j->name, size);
    for (int n = 0; n < d->o->nodes; n++) fprintf(stderr, " %d", per_node[n]);
    fprintf(stderr, "\n");
  }
  return save_job(d, j);
}

/* The members of the job's current epoch per node (elastic/node/ID), and
 * their ids, newest last, in ids (cap bytes, space-separated). */
static int census_nodes(daemon_t *d, job_t *j, int *real, char *ids, size_t cap) {
  int64_t epoch = 0;
  int rc = tide_store_add(j->store, "elastic/epoch", 0, &epoch);
  if (rc != 0) return rc;
  ids[0] = 0;
  if (epoch == 0) {
    size_t at = 0;
    for (int r = 0; r < j->np0 && at + 16 < cap; r++) at += (size_t)snprintf(ids + at, cap - at, "%sr%d", r ? " " : "", r);
  } else {
    char key[64];
    snprintf(key, sizeof key, "elastic/e%lld/members", (long long)epoch);
    void *value;
    size_t len;
    if (tide_store_get(j->store, key, 0, &value, &len) != 0) return 1; /* being sealed: try at the next tick */
    size_t n = len < cap - 1 ? len : cap - 1;
    memcpy(ids, value, n);
    ids[n] = 0;
    tide_free(value);
    if (ids[0] == '!') ids[0] = 0;
  }
  memset(real, 0, sizeof(int) * (size_t)d->o->nodes);
  char copy[4096];
  snprintf(copy, sizeof copy, "%s", ids);
  for (char *save = NULL, *id = strtok_r(copy, " ", &save); id != NULL; id = strtok_r(NULL, " ", &save)) {
    char key[96];
    void *value;
    size_t len;
    snprintf(key, sizeof key, "elastic/node/%s", id);
    if (tide_store_get(j->store, key, 0, &value, &len) != 0) continue;
    char text[16];
    size_t k = len < sizeof text - 1 ? len : sizeof text - 1;
    memcpy(text, value, k);
    text[k] = 0;
    tide_free(value);
    int node = atoi(text);
    if (node >= 0 && node < d->o->nodes) real[node]++;
  }
  return 0;
}

/* Marks `count` members on `node` (the newest first) to leave at the next change. */
static int mark_leaves(daemon_t *d, job_t *j, int node, int count) {
  char ids[4096], copy[4096];
  int real[MAX_NODES];
  if (count <= 0) return 0;
  int rc = census_nodes(d, j, real, ids, sizeof ids);
  if (rc != 0) return rc;
  char *list[1024];
  int n = 0;
  snprintf(copy, sizeof copy, "%s", ids);
  for (char *save = NULL, *id = strtok_r(copy, " ", &save); id != NULL && n < 1024; id = strtok_r(NULL, " ", &save))
    list[n++] = id;
  for (int i = n - 1; i >= 0 && count > 0; i--) {
    char key[96];
    void *value;
    size_t len;
    snprintf(key, sizeof key, "elastic/node/%s", list[i]);
    if (tide_store_get(j->store, key, 0, &value, &len) != 0) continue;
    /* The value is not NUL-terminated (atoi read past it: ASan). */
    int on = len > 0 && len < 10 ? 0 : -1;
    for (size_t k = 0; on >= 0 && k < len; k++) {
      char digit = ((const char *)value)[k];
      on = digit >= '0' && digit <= '9' ? on * 10 + (digit - '0') : -1;
    }
    tide_free(value);
    if (on != node) continue;
    snprintf(key, sizeof key, "elastic/leave/%s", list[i]);
    if ((rc = tide_store_set(j->store, key, "1", 1)) != 0) return rc;
    count--;
  }
  return 0;
}

/* Applies job j's next placement: members leave the nodes that lose
 * workers, agents start joiners on the nodes that gain; a move (same
 * size) grows first and takes the others off once the grow is in. */
static void resize_job_multi(daemon_t *d, job_t *j, const int *next) {
  int nodes = d->o->nodes, cur_total = sum_nodes(d, j->on), next_total = sum_nodes(d, next), grows = 0, changed = 0;
  for (int n = 0; n < nodes; n++) changed |= next[n] != j->on[n];
  if (!changed || job_connect(j) != 0) return;
  for (int n = 0; n < nodes; n++) grows += next[n] > j->on[n] ? next[n] - j->on[n] : 0;
  /* A move (the same size elsewhere), or a change that keeps none of the
   * job's members (0 2 -> 4 0): grow first, then shrink, so that a member
   * with the state is there to hand it over. */
  int stays = 0;
  for (int n = 0; n < nodes; n++) stays += next[n] < j->on[n] ? next[n] : j->on[n];
  int two_phase = next_total == cur_total || stays == 0;
  int target = two_phase ? cur_total + grows : next_total;
  for (int n = 0; n < nodes; n++) {
    if (next[n] < j->on[n]) {
      if (two_phase)
        j->pend_leave[n] = j->on[n] - next[n];
      else if (mark_leaves(d, j, n, j->on[n] - next[n]) != 0)
        return;
    }
    if (next[n] > j->on[n]) place_workers(d, j, n, next[n] - j->on[n], -1, 0);
  }
  if (tide_elastic_request(j->store, target) != 0) {
    job_disconnect(j);
    return;
  }
  if (!d->o->quiet) {
    fprintf(stderr, "tide sched: job %llu (%s):", (unsigned long long)j->id, j->name);
    for (int n = 0; n < nodes; n++) fprintf(stderr, " %d", j->on[n]);
    fprintf(stderr, " ->");
    for (int n = 0; n < nodes; n++) fprintf(stderr, " %d", next[n]);
    fprintf(stderr, "%s\n", two_phase ? " (a move: grow, then shrink)" : "");
  }
  memcpy(j->on, next, sizeof(int) * (size_t)nodes);
  j->alloc = next_total;
  j->resizes++;
  j->change_at = mono_s();
  j->change_to = target;
  save_job(d, j);
}

/* A move's second half, once its grow is in: the leaves, then the size. */
static void finish_move(daemon_t *d, job_t *j) {
  int leaves = 0;
  for (int n = 0; n < d->o->nodes; n++) leaves += j->pend_leave[n];
  if (leaves == 0) return;
  for (int n = 0; n < d->o->nodes; n++) {
    if (j->pend_leave[n] > 0 && mark_leaves(d, j, n, j->pend_leave[n]) != 0) return;
    j->pend_leave[n] = 0;
  }
  if (tide_elastic_request(j->store, j->alloc) != 0) return;
  j->change_at = mono_s();
  j->change_to = j->alloc;
}

/* Per-node capacity left, over the running jobs' placements. */
static void free_per_node(const daemon_t *d, int *free_slots) {
  for (int n = 0; n < d->o->nodes; n++) {
    free_slots[n] = d->dead[n] ? 0 : d->o->slots[n];
    for (int i = 0; i < d->njobs; i++)
      if (d->jobs[i].state == JOB_RUNNING || d->jobs[i].state == JOB_CANCELLING) free_slots[n] -= d->jobs[i].on[n];
  }
}

/* Agents that stopped beating for AGENT_LOST_S: their hosts leave the
 * pool (the allocator is rebuilt over the others); one that beats again
 * comes back. */
static void check_agents(daemon_t *d, double now) {
  if (now - d->last_beat_check < 0.5) return;
  d->last_beat_check = now;
  int changed = 0;
  for (int n = 0; n < d->o->nodes; n++) {
    char key[64];
    int64_t beat;
    snprintf(key, sizeof key, "agent/%d/beat", n);
    if (tide_store_add(d->ctl, key, 0, &beat) != 0) return;
    if (d->beat_at[n] == 0 || beat != d->beat[n]) {
      if (beat != d->beat[n] && d->dead[n]) {
        d->dead[n] = 0, changed = 1;
        if (!d->o->quiet) fprintf(stderr, "tide sched: host %d (%s) is back\n", n, d->o->hosts ? d->o->hosts[n] : "");
      }
      d->beat[n] = beat;
      d->beat_at[n] = now;
    } else if (!d->dead[n] && now - d->beat_at[n] > (d->beat[n] == 0 ? AGENT_START_S : AGENT_LOST_S)) {
      d->dead[n] = 1, changed = 1;
      for (int i = 0; i < d->njobs; i++) { /* its workers are gone: a change toward it will not come */
        job_t *j = &d->jobs[i];
        if (j->state != JOB_RUNNING || j->on[n] == 0) continue;
        j->on[n] = 0;
        j->pend_leave[n] = 0;
        j->alloc = sum_nodes(d, j->on);
        if (j->change_at > 0 && job_connect(j) == 0 && tide_elastic_request(j->store, j->alloc) == 0)
          j->change_to = j->alloc;
        save_job(d, j);
      }
      if (!d->o->quiet)
        fprintf(stderr, "tide sched: host %d (%s) is lost (its agent has not beaten for %.0f s); its workers are "
                        "gone and the jobs go on without them\n",
                n, d->o->hosts ? d->o->hosts[n] : "", now - d->beat_at[n]);
    }
  }
  if (!changed) return;
  int slots[MAX_NODES], k = 0;
  for (int n = 0; n < d->o->nodes; n++)
    if (!d->dead[n]) slots[k] = d->o->slots[n], d->live[k++] = n;
  tide_sched_t *s;
  if (k > 0 && tide_sched_create(&d->o->sched, k, slots, &s) == 0) {
    tide_sched_destroy(d->sched);
    d->sched = s;
  }
  d->nlive = k;
}

/* Multi-host ticks: a job ends when every worker the agents started has
 * exited (agents count them in job/ID/exited); the census per node. */
static void tick_multi(daemon_t *d, job_t *j, double now) {
  char key[64];
  int64_t failed = 0;
  int all_exited = j->started > 0;
  for (int n = 0; n < d->o->nodes; n++) { /* a lost host's workers are gone with it */
    int64_t exited = 0, f = 0;
    snprintf(key, sizeof key, "job/%llu/%d/exited", (unsigned long long)j->id, n);
    if (tide_store_add(d->ctl, key, 0, &exited) != 0) return;
    snprintf(key, sizeof key, "job/%llu/%d/failed", (unsigned long long)j->id, n);
    if (tide_store_add(d->ctl, key, 0, &f) != 0) return;
    if (!d->dead[n]) failed += f;
    if (!d->dead[n] && exited < j->started_on[n]) all_exited = 0;
  }
  int keeper_gone = !keeper_alive(j);
  if (all_exited || keeper_gone) {
    int finished = 0;
    char text[8];
    if (!keeper_gone && job_connect(j) == 0) {
      void *v;
      size_t len;
      if (tide_store_get(j->store, "elastic/done", 0, &v, &len) == 0) finished = 1, tide_free(v);
    }
    job_disconnect(j);
    if (!keeper_gone) kill(j->keeper, SIGTERM);
    (void)text;
    j->exit_code = finished || (failed == 0 && !keeper_gone) ? 0 : keeper_gone ? -1 : 1;
    j->state = j->state == JOB_CANCELLING ? JOB_CANCELLED : j->exit_code == 0 ? JOB_DONE : JOB_FAILED;
    j->finish = wall_s();
    j->alloc = 0;
    memset(j->on, 0, sizeof j->on);
    if (!d->o->quiet)
      fprintf(stderr, "tide sched: job %llu (%s) %s (exit %d), %.1f s after its submission\n",
              (unsigned long long)j->id, j->name, state_names[j->state], j->exit_code, j->finish - j->submit);
    save_job(d, j);
    return;
  }
  if (j->state != JOB_RUNNING || job_connect(j) != 0) return;
  char ids[4096];
  int real[MAX_NODES];
  int rc = census_nodes(d, j, real, ids, sizeof ids);
  if (rc == 1) return;
  if (rc != 0) {
    job_disconnect(j);
    return;
  }
  int members = sum_nodes(d, real);
  memcpy(j->real, real, sizeof(int) * (size_t)d->o->nodes);
  j->members = members;
  if (j->change_at > 0 && members == j->change_to) {
    j->last_latency = now - j->change_at;
    if (j->last_latency > j->max_latency) j->max_latency = j->last_latency;
    j->change_at = 0;
    if (!d->o->quiet) {
      fprintf(stderr, "tide sched: job %llu (%s) runs on", (unsigned long long)j->id, j->name);
      for (int n = 0; n < d->o->nodes; n++) fprintf(stderr, " %d", real[n]);
      fprintf(stderr, " worker(s), %.3f s after the decision\n", j->last_latency);
    }
    finish_move(d, j);
    save_job(d, j);
  } else if (j->change_at > 0 && now - j->change_at > CHANGE_GIVE_UP_S) {
    TIDE_WARN("tide sched: job %llu: its membership has not reached %d worker(s) %.0f s after the decision; it "
              "stays on %d",
              (unsigned long long)j->id, j->change_to, now - j->change_at, members);
    j->change_at = 0;
    memset(j->pend_leave, 0, sizeof j->pend_leave);
    if (members > 0 && tide_elastic_request(j->store, members) == 0) {
      memcpy(j->on, real, sizeof(int) * (size_t)d->o->nodes);
      j->alloc = members;
    }
    save_job(d, j);
  } else if (j->change_at == 0 && members > 0) {
    memcpy(j->on, real, sizeof(int) * (size_t)d->o->nodes); /* a host or worker lost: what is left */
    j->alloc = members;
  }
}

/* A round's matrix applied: running jobs keep at least their minimum (a
 * job whose row falls below it keeps its placement), shrinks first, then
 * grows and starts while every node has room. */
static void allocate_apply_multi(daemon_t *d, job_t **map, int n, const int *next) {
  int nodes = d->o->nodes;
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < n; i++) {
      job_t *j = map[i];
      const int *row = next + (size_t)i * nodes;
      int total = sum_nodes(d, row), shrinks = 0;
      if (j->state != JOB_RUNNING || j->change_at > 0 || total < j->min_np) continue;
      for (int m = 0; m < nodes; m++) shrinks |= row[m] < j->on[m];
      if ((pass == 0) != (shrinks && total <= j->alloc)) continue;
      int free_slots[MAX_NODES], fits = 1;
      free_per_node(d, free_slots);
      for (int m = 0; m < nodes; m++) fits &= row[m] - j->on[m] <= free_slots[m];
      if (fits) resize_job_multi(d, j, row);
    }
  for (int i = 0; i < n; i++) {
    job_t *j = map[i];
    const int *row = next + (size_t)i * nodes;
    if (j->state != JOB_PENDING || sum_nodes(d, row) < j->min_np || sum_nodes(d, row) == 0) continue;
    int free_slots[MAX_NODES], fits = 1;
    free_per_node(d, free_slots);
    for (int m = 0; m < nodes; m++) fits &= row[m] <= free_slots[m];
    if (fits) start_job_multi(d, j, row);
  }
}

/* ---- background jobs (tide submit --background) ------------------------------- */

/* Starts the pending background jobs at once: they take no slots. */
static void start_backgrounds(daemon_t *d) {
  for (int i = 0; i < d->njobs; i++) {
    job_t *j = &d->jobs[i];
    if (j->state != JOB_PENDING || !j->background || d->multi) continue;
    if (start_job(d, j, j->np) != 0 || j->state != JOB_RUNNING) continue;
    j->alloc = 0;
    save_job(d, j);
  }
}

static uint64_t fnv1a(const char *text) {
  uint64_t h = 1469598103934665603ULL;
  for (; *text; text++) h = (h ^ (unsigned char)*text) * 1099511628211ULL;
  return h | 1; /* never 0: "not written" */
}

/* A background job that ended without its trainer's end (cancelled,
 * killed) while its guard said running is still counted by the
 * foregrounds it watched (multiplex/active): take it out, never below 0
 * (a foreground that came in its last 0.1 s may not have counted it). */
static void background_ended(daemon_t *d, job_t *j) {
  long step, pauses;
  char guard[16];
  if (!j->background || j->state == JOB_DONE || sscanf(j->progress, "%ld %15s %ld", &step, guard, &pauses) != 3 ||
      strcmp(guard, "running") != 0)
    return;
  int fixed = 0;
  for (int i = 0; i < d->njobs; i++) {
    job_t *f = &d->jobs[i];
    int64_t n = 0;
    if (f->background || f->state != JOB_RUNNING || job_connect(f) != 0) continue;
    if (tide_store_add(f->store, MULTIPLEX_ACTIVE_KEY, 0, &n) == 0 && n > 0 &&
        tide_store_add(f->store, MULTIPLEX_ACTIVE_KEY, -1, &n) == 0)
      fixed++;
  }
  if (!d->o->quiet && fixed > 0)
    fprintf(stderr, "tide sched: job %llu (%s) ended while running beside %d foreground(s): taken out of their "
                    "counts of background jobs\n", (unsigned long long)j->id, j->name, fixed);
}

/* Each running background job's store gets the running foregrounds
 * (TIDE_MULTIPLEX_FOREGROUNDS_KEY) whenever the set changed; its guard's
 * progress comes back for tide jobs. */
static void backgrounds_tick(daemon_t *d) {
  int any = 0;
  for (int i = 0; i < d->njobs; i++) any |= d->jobs[i].background;
  if (!any || d->multi) return; /* nothing to tell, nor any foreground's count to show */
  char list[4096];
  size_t at = 0;
  list[0] = '\0';
  for (int i = 0; i < d->njobs; i++) {
    const job_t *f = &d->jobs[i];
    if (f->background || f->state != JOB_RUNNING || f->port <= 0 || f->token[0] == '\0') continue;
    int n = snprintf(list + at, sizeof list - at, "127.0.0.1:%d %s\n", f->port, f->token);
    if (n < 0 || (size_t)n >= sizeof list - at) break;
    at += (size_t)n;
  }
  uint64_t hash = fnv1a(list);
  for (int i = 0; i < d->njobs; i++) {
    job_t *j = &d->jobs[i];
    if (!j->background && j->state == JOB_RUNNING && j->store != NULL &&
        tide_store_add(j->store, MULTIPLEX_ACTIVE_KEY, 0, &j->backgrounds) != 0)
      job_disconnect(j);
    if (!j->background || j->state != JOB_RUNNING || job_connect(j) != 0) continue;
    if (j->fg_list_hash != hash) {
      if (tide_store_set(j->store, TIDE_MULTIPLEX_FOREGROUNDS_KEY, list, at) != 0) {
        job_disconnect(j);
        continue;
      }
      j->fg_list_hash = hash;
    }
    char progress[sizeof j->progress];
    if (tide__store_get_string(j->store, TIDE_MULTIPLEX_PROGRESS_KEY, 0, progress, sizeof progress) == 0)
      memcpy(j->progress, progress, sizeof progress);
  }
}

/* Admits pending jobs at their minimum on the nodes with the most room. */
static void admit_multi(daemon_t *d) {
  for (int i = 0; i < d->njobs; i++) {
    job_t *j = &d->jobs[i];
    if (j->state != JOB_PENDING) continue;
    int free_slots[MAX_NODES], per[MAX_NODES] = {0}, left = j->min_np;
    free_per_node(d, free_slots);
    while (left > 0) {
      int best = -1;
      for (int n = 0; n < d->o->nodes; n++)
        if (free_slots[n] > 0 && (best < 0 || free_slots[n] > free_slots[best])) best = n;
      if (best < 0) break;
      int k = free_slots[best] < left ? free_slots[best] : left;
      per[best] += k, free_slots[best] -= k, left -= k;
    }
    if (left > 0) break;
    start_job_multi(d, j, per);
  }
}

/* Admits pending jobs at their minimum, in submission order, while they fit
 * (a newly submitted job starts at once). FIFO waits for its round. */
static void admit(daemon_t *d) {
  start_backgrounds(d);
  if (d->o->sched.policy == TIDE_SCHED_FIFO || d->o->sched.policy == TIDE_SCHED_TIRESIAS) return;
  if (d->multi) {
    admit_multi(d);
    return;
  }
  for (int i = 0; i < d->njobs; i++) {
    job_t *j = &d->jobs[i];
    if (j->state != JOB_PENDING || j->background) continue;
    if (j->min_np > d->total - used_slots(d)) break;
    start_job(d, j, j->min_np);
  }
}

/* Keepers that ended, memberships that took a decision, slot-seconds. */
static void tick(daemon_t *d) {
  double now = mono_s();
  double dt = d->last_tick > 0 ? now - d->last_tick : 0;
  d->last_tick = now;
  pid_t pid;
  int status;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
    if (pid == d->agents) d->agents = -1, d->agents_status = status;
  if (d->multi) check_agents(d, now);
  for (int i = 0; i < d->njobs; i++) {
    job_t *j = &d->jobs[i];
    if (j->state != JOB_RUNNING && j->state != JOB_CANCELLING) continue;
    j->attained += dt * j->alloc;
    if (d->multi) {
      tick_multi(d, j, now);
      continue;
    }
    char path[4200];
    job_path(d, j, "exit", path, sizeof path);
    int ok, code = read_int_file(path, &ok);
    int gone = !ok && !keeper_alive(j);
    if (gone) { /* the keeper may have written it just before it exited */
      code = read_int_file(path, &ok);
      gone = !ok;
    }
    if (ok || gone) {
      job_disconnect(j);
      j->exit_code = ok ? code : -1;
      j->state = j->state == JOB_CANCELLING ? JOB_CANCELLED : (ok && code == 0 ? JOB_DONE : JOB_FAILED);
      j->finish = wall_s();
      j->alloc = 0;
      if (!d->o->quiet)
        fprintf(stderr, "tide sched: job %llu (%s) %s (exit %d), %.1f s after its submission\n",
                (unsigned long long)j->id, j->name, state_names[j->state], j->exit_code, j->finish - j->submit);
      save_job(d, j);
      background_ended(d, j);
      continue;
    }
    if (j->state != JOB_RUNNING || job_connect(j) != 0) continue;
    int members = j->members;
    if (job_census(j, &members) != 0) {
      job_disconnect(j);
      continue;
    }
    j->members = members;
    if (j->change_at > 0 && members == j->change_to) {
      j->last_latency = now - j->change_at;
      if (j->last_latency > j->max_latency) j->max_latency = j->last_latency;
      j->change_at = 0;
      if (!d->o->quiet)
        fprintf(stderr, "tide sched: job %llu (%s) runs on %d worker(s), %.3f s after the decision\n",
                (unsigned long long)j->id, j->name, members, j->last_latency);
      save_job(d, j);
    }
  }
  backgrounds_tick(d);
}

/* ---- requests ----------------------------------------------------------------------- */

static job_t *find_job(daemon_t *d, const char *key) {
  char *end;
  unsigned long long id = strtoull(key, &end, 10);
  int numeric = end != key && *end == '\0';
  job_t *found = NULL;
  for (int i = d->njobs - 1; i >= 0; i--) {
    job_t *j = &d->jobs[i];
    if (numeric && j->id == id) return j;
    if (strcmp(j->name, key) == 0 && (found == NULL || (!active(found) && active(j)))) found = j;
  }
  return found;
}

typedef struct {
  char *buf;
  size_t len, cap;
  int failed;
} text_t;

static void __attribute__((format(printf, 2, 3))) text_add(text_t *t, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (t->buf != NULL && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = (t->cap ? t->cap * 2 : 1024) + (size_t)n;
    char *b = tide__realloc(t->buf, cap);
    if (b == NULL) {
      t->failed = 1;
      return;
    }
    t->buf = b, t->cap = cap;
  }
}

/* A background job's row in tide jobs: SLOTS "bg", its guard's state
 * (running or paused) while it runs, and PROGRESS "step=S,pauses=P". */
static void background_row(const job_t *j, char *slots, size_t slots_cap, const char **state, char *progress,
                           size_t progress_cap) {
  static const char *const guard_states[] = {"running", "paused"};
  snprintf(slots, slots_cap, "bg");
  long step, pauses;
  char guard[16];
  if (sscanf(j->progress, "%ld %15s %ld", &step, guard, &pauses) != 3) return;
  snprintf(progress, progress_cap, "step=%ld,pauses=%ld", step, pauses);
  if (j->state == JOB_RUNNING) *state = guard_states[strcmp(guard, "paused") == 0];
}

static void jobs_table(daemon_t *d, text_t *t) {
  double now = wall_s();
  text_add(t, "%-4s %-16s %-10s %5s %7s %7s %9s %11s %7s %7s %8s %5s %s\n", "ID", "NAME", "STATE", "SLOTS", "WORKERS",
           "BATCH", "GOODPUT", "SPEEDUP", "RESIZES", "LAT_S", "TIME_S", "EXIT", "PROGRESS");
  for (int i = 0; i < d->njobs; i++) {
    job_t *j = &d->jobs[i];
    char batch[32] = "-", goodput[32] = "-", speedup[32] = "-", exit_code[16] = "-", lat[32] = "-";
    if (j->state == JOB_RUNNING && j->alloc > 0) {
      if (j->has_hints && j->hints.fitted) {
        tide_pollux_choice_t c;
        double phi = j->hints.grad_sqr > 0 ? j->hints.limits.base_batch * j->hints.grad_var / j->hints.grad_sqr : 1e9;
        if (tide_pollux_optimize(&j->hints.model, &j->hints.limits, 1, j->alloc, phi, &c) == 0) {
          snprintf(batch, sizeof batch, "%.0f", c.batch);
          snprintf(goodput, sizeof goodput, "%.1f", c.goodput);
        }
      }
      if (j->speedup != NULL)
        snprintf(speedup, sizeof speedup, "%.2f", tide_speedup_eval(j->speedup, 1, j->alloc));
      else
        snprintf(speedup, sizeof speedup, "%d(linear)", j->alloc);
    }
    if (j->state >= JOB_DONE) snprintf(exit_code, sizeof exit_code, "%d", j->exit_code);
    if (j->max_latency > 0) snprintf(lat, sizeof lat, "%.3f", j->max_latency);
    double time_s = (j->state >= JOB_DONE ? j->finish : now) - j->submit;
    char slots[64], workers[16];
    snprintf(slots, sizeof slots, "%d", j->state == JOB_RUNNING || j->state == JOB_CANCELLING ? j->alloc : 0);
    if (d->multi && j->state == JOB_RUNNING) /* per host: 2+0+1 */
      for (int n = 0, at = 0; n < d->o->nodes && at < (int)sizeof slots - 4; n++)
        at += snprintf(slots + at, sizeof slots - (size_t)at, "%s%d", n ? "+" : "", j->on[n]);
    snprintf(workers, sizeof workers, "%d", j->state == JOB_RUNNING ? j->members : 0);
    const char *state = state_names[j->state];
    char progress[96] = "-";
    if (j->background) background_row(j, slots, sizeof slots, &state, progress, sizeof progress);
    else if (j->state == JOB_RUNNING && j->backgrounds > 0)
      snprintf(progress, sizeof progress, "backgrounds=%lld", (long long)j->backgrounds);
    text_add(t, "%-4llu %-16.16s %-10s %5s %7s %7s %9s %11s %7d %7s %8.1f %5s %s\n", (unsigned long long)j->id,
             j->name, state, slots, workers, batch, goodput, speedup, j->resizes, lat, time_s, exit_code, progress);
  }
}

/* A background submission's refusals (1, with the message in t). */
static int background_refused(daemon_t *d, int min_np, int max_np, int np, text_t *t) {
  if (d->multi) {
    text_add(t, "--background: background jobs run on a one-host pool only (this tide sched has %d hosts)",
             d->o->nodes);
    return 1;
  }
  if (min_np != 0 || max_np != 0) {
    text_add(t, "--background takes no --min-np or --max-np: a background job takes no slots and is never "
                "resized; give its workers with --np");
    return 1;
  }
  if (np < 1) {
    text_add(t, "--background needs --np K, the number of workers of the background job");
    return 1;
  }
  if (np > d->total) {
    text_add(t, "--np %d: a background job runs at most as many workers as the pool has slots (%d), on the "
                "foregrounds' host", np, d->total);
    return 1;
  }
  return 0;
}

static int handle_submit(daemon_t *d, char **f, int nf, text_t *t) {
  if (nf < 8) {
    text_add(t, "a malformed submission");
    return -1;
  }
  int min_np = atoi(f[2]), max_np = atoi(f[3]), np = atoi(f[4]), argc = atoi(f[6]);
  int background = strcmp(f[0], "submit-background") == 0;
  if (background && background_refused(d, min_np, max_np, np, t)) return -1;
  if (background) min_np = max_np = np; /* its size, fixed */
  if (min_np < 1 || max_np < min_np) {
    text_add(t, "--min-np (%d) must be >= 1 and <= --max-np (%d)", min_np, max_np);
    return -1;
  }
  if (max_np > d->total) {
    text_add(t, "--max-np %d is more than the %d slots this scheduler has", max_np, d->total);
    return -1;
  }
  if (np == 0) np = max_np;
  if (np < min_np || np > max_np) {
    text_add(t, "--np %d must be between --min-np %d and --max-np %d", np, min_np, max_np);
    return -1;
  }
  if (argc < 1 || 7 + argc > nf) {
    text_add(t, "no program given");
    return -1;
  }
  if (strlen(f[1]) >= 64 || strchr(f[1], ' ') || strchr(f[1], '\n')) {
    text_add(t, "--name must be at most 63 characters, without spaces");
    return -1;
  }
  job_t *j = add_job(d);
  if (j == NULL) {
    text_add(t, "out of memory");
    return -1;
  }
  j->id = d->next_id++;
  snprintf(j->name, sizeof j->name, "%s", f[1][0] ? f[1] : "job");
  if (f[1][0] == 0) snprintf(j->name, sizeof j->name, "job%llu", (unsigned long long)j->id);
  j->min_np = min_np, j->max_np = max_np, j->np = np;
  j->background = background;
  j->submit = wall_s();
  j->state = JOB_PENDING;
  char path[4300];
  snprintf(path, sizeof path, "%s/%llu", d->jobs_dir, (unsigned long long)j->id);
  int ok = mkdir(path, 0700) == 0;
  snprintf(path, sizeof path, "%s/%llu/spec", d->jobs_dir, (unsigned long long)j->id);
  int fd = ok ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
  for (int i = 5; fd >= 0 && i < nf; i++) /* cwd, argc, argv..., env... */
    if (write_all(fd, f[i], strlen(f[i]) + 1) != 0) ok = 0;
  if (fd < 0 || close(fd) != 0 || !ok || save_job(d, j) != 0) {
    text_add(t, "cannot write the job's files under %s", d->jobs_dir);
    d->njobs--;
    return -1;
  }
  text_add(t, "%llu", (unsigned long long)j->id);
  if (!d->o->quiet)
    fprintf(stderr, "tide sched: job %llu (%s) submitted: %d..%d worker(s)%s\n", (unsigned long long)j->id, j->name,
            min_np, max_np, background ? ", background" : "");
  admit(d);
  return 0;
}

static int handle(daemon_t *d, char **f, int nf, text_t *t) {
  if (nf >= 1 && (strcmp(f[0], "submit") == 0 || strcmp(f[0], "submit-background") == 0))
    return handle_submit(d, f, nf, t);
  if (nf >= 1 && strcmp(f[0], "jobs") == 0) {
    jobs_table(d, t);
    return 0;
  }
  if (nf == 2 && (strcmp(f[0], "cancel") == 0 || strcmp(f[0], "state") == 0)) {
    job_t *j = find_job(d, f[1]);
    if (j == NULL) {
      text_add(t, "no job %s (see tide jobs)", f[1]);
      return -1;
    }
    if (strcmp(f[0], "state") == 0) {
      text_add(t, "%s", state_names[j->state]);
      return 0;
    }
    if (j->state == JOB_PENDING) {
      j->state = JOB_CANCELLED;
      j->finish = wall_s();
    } else if (j->state == JOB_RUNNING && d->multi) {
      for (int n = 0; n < d->o->nodes; n++) agent_cmd(d, n, "kill %llu", (unsigned long long)j->id);
      j->state = JOB_CANCELLING;
    } else if (j->state == JOB_RUNNING) {
      if (j->keeper > 0) kill(j->keeper, SIGTERM);
      j->state = JOB_CANCELLING;
    } else if (j->state != JOB_CANCELLING) {
      text_add(t, "job %s has already ended (%s)", f[1], state_names[j->state]);
      return -1;
    }
    save_job(d, j);
    text_add(t, "%llu", (unsigned long long)j->id);
    return 0;
  }
  text_add(t, "unknown request");
  return -1;
}

static void serve_client(daemon_t *d) {
  int fd = accept4(d->listen_fd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0) return;
  char *buf;
  size_t len;
  if (read_all(fd, &buf, &len, CLIENT_TIMEOUT_MS) != 0) {
    close(fd);
    return;
  }
  int nf = 0;
  for (size_t i = 0; i < len; i++) nf += buf[i] == '\0';
  char **f = tide__calloc((size_t)nf + 1, sizeof *f);
  text_t t = {0};
  int rc = -1;
  if (f != NULL) {
    size_t at = 0;
    for (int i = 0; i < nf; i++) {
      f[i] = buf + at;
      at += strlen(buf + at) + 1;
    }
    rc = handle(d, f, nf, &t);
  }
  const char *status = rc == 0 && !t.failed ? "0" : "1";
  write_all(fd, status, 1);
  if (t.buf != NULL) write_all(fd, t.buf, t.len);
  close(fd);
  tide__free(t.buf);
  tide__free(f);
  tide__free(buf);
}

/* ---- the daemon ------------------------------------------------------------------- */

static int check_options(const tide_sched_daemon_options_t *o, int multi) {
  if (o->dir == NULL || o->dir[0] == 0) {
    TIDE_ERROR("tide sched: no state directory (--dir)");
    return TIDE_EINVAL;
  }
  if (o->nodes < 1 || o->slots == NULL) {
    TIDE_ERROR("tide sched: the pool needs at least one host with slots (--slots N or --hostfile F, or run "
               "inside a Slurm allocation)");
    return TIDE_EINVAL;
  }
  if (o->nodes > MAX_NODES) {
    TIDE_ERROR("tide sched: the pool has %d hosts, more than the %d this tide sched handles", o->nodes, MAX_NODES);
    return TIDE_EINVAL;
  }
  if (o->nodes > 1 && (o->hosts == NULL || o->hosts[0] == NULL) && o->address == NULL) {
    TIDE_ERROR("tide sched: %d hosts but no host names (--hostfile) and no --address for the agents", o->nodes);
    return TIDE_EINVAL;
  }
  char self[256] = "";
  gethostname(self, sizeof self - 1);
  if (!multi && o->hosts != NULL && o->hosts[0] != NULL && strcmp(o->hosts[0], "localhost") != 0 &&
      strncmp(o->hosts[0], "127.", 4) != 0 && strcmp(o->hosts[0], self) != 0) {
    TIDE_ERROR("tide sched: host %s is not this host (%s): the jobs run where tide sched runs; name it "
               "localhost or %s in the hostfile",
               o->hosts[0], self, self);
    return TIDE_EINVAL;
  }
  for (int n = 0; n < o->nodes; n++)
    if (o->slots[n] < 1) {
      TIDE_ERROR("tide sched: host %d has %d slots: every host needs at least 1", n, o->slots[n]);
      return TIDE_EINVAL;
    }
  if (!(o->interval > 0)) {
    TIDE_ERROR("tide sched: --interval must be > 0 seconds");
    return TIDE_EINVAL;
  }
  if (!(o->resize_cost >= 0)) {
    TIDE_ERROR("tide sched: the resize cost must be >= 0 seconds");
    return TIDE_EINVAL;
  }
  if (!multi && (o->tiderun == NULL || access(o->tiderun, X_OK) != 0)) {
    TIDE_ERROR("tide sched: the launcher %s is not an executable (tiderun)", o->tiderun ? o->tiderun : "(none)");
    return TIDE_EINVAL;
  }
  return 0;
}

/* Several hosts: the agents' control store, advertised in dir/control as
 * "ADDRESS PORT TOKEN" (mode 0600). */
static int control_start(daemon_t *d) {
  char token[40] = "", path[4200], tmp[4300];
  int rc = random_token(token, sizeof token);
  if (rc == 0) rc = tide_store_server_start(NULL, 0, token, &d->ctl_server);
  if (rc != 0) {
    TIDE_ERROR("tide sched: cannot start the agents' control store: %s", tide_strerror(rc));
    return rc;
  }
  int port = tide_store_server_port(d->ctl_server);
  if ((rc = tide_store_connect("127.0.0.1", port, token, 5000, &d->ctl)) != 0) return rc;
  snprintf(path, sizeof path, "%s/control", d->o->dir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  char text[512];
  int n = snprintf(text, sizeof text, "%s %d %s\n", d->address, port, token);
  if (fd < 0 || write_all(fd, text, (size_t)n) != 0 || close(fd) != 0 || rename(tmp, path) != 0) {
    TIDE_ERROR("tide sched: cannot write %s: %s", path, strerror(errno));
    return TIDE_EIO;
  }
  if (!d->o->quiet)
    fprintf(stderr, "tide sched: %d hosts; agents (tide sched --agent --dir %s --node I) reach it at %s:%d\n",
            d->o->nodes, d->o->dir, d->address, port);
  return 0;
}

/* The pool of the Slurm allocation this runs in (no slots given): o's
 * nodes, slots and hosts point into pool; tide gets the agents' program. */
static int slurm_pool(tide_sched_daemon_options_t *o, tide__sched_pool_t *pool, char *tide, size_t cap) {
  const char *job = getenv("SLURM_JOB_ID"), *nodelist = getenv("SLURM_JOB_NODELIST");
  if (job == NULL || job[0] == '\0' || nodelist == NULL || nodelist[0] == '\0') {
    TIDE_ERROR("tide sched: no pool: give --slots N (this host's) or --hostfile F, or run tide sched inside a "
               "Slurm allocation (salloc or sbatch: SLURM_JOB_ID and SLURM_JOB_NODELIST set)");
    return TIDE_EINVAL;
  }
  TIDE_CHECK(tide__sched_slurm_pool(nodelist, getenv("SLURM_JOB_CPUS_PER_NODE"), o->slots_per_node, pool));
  o->nodes = pool->nodes;
  o->slots = pool->slots;
  o->hosts = pool->names;
  int n = 0;
  if (o->tide != NULL) {
    n = snprintf(tide, cap, "%s", o->tide);
  } else if (o->tiderun != NULL) {
    const char *slash = strrchr(o->tiderun, '/');
    n = slash != NULL ? snprintf(tide, cap, "%.*s/tide", (int)(slash - o->tiderun), o->tiderun)
                      : snprintf(tide, cap, "tide");
  }
  if (n <= 0 || (size_t)n >= cap) {
    TIDE_ERROR("tide sched: which tide should the nodes' agents run? (the options' tide; default: the tide "
               "beside tiderun)");
    return TIDE_EINVAL;
  }
  if (strchr(tide, '/') != NULL && access(tide, X_OK) != 0) {
    TIDE_ERROR("tide sched: %s is not an executable: the nodes' agents run `tide sched --agent`", tide);
    return TIDE_EINVAL;
  }
  return 0;
}

int tide_sched_serve(const tide_sched_daemon_options_t *user_opts) {
  if (user_opts == NULL) return TIDE_EINVAL;
  tide_sched_daemon_options_t eff = *user_opts; /* with a Slurm pool filled in */
  const tide_sched_daemon_options_t *opts = &eff;
  tide__sched_pool_t pool;
  char tide[4096], address[64];
  int slurm = user_opts->slots == NULL, rc;
  if (user_opts->slots_per_node < 0 || (user_opts->slots_per_node > 0 && !slurm)) {
    TIDE_ERROR("tide sched: --slots-per-node %d: it gives the slots of a Slurm allocation's nodes (a number "
               ">= 1, with neither --slots nor --hostfile)",
               user_opts->slots_per_node);
    return TIDE_EINVAL;
  }
  if (slurm && (rc = slurm_pool(&eff, &pool, tide, sizeof tide)) != 0) return rc;
  int multi = eff.nodes > 1 || slurm; /* under Slurm the agents start the workers, one node or more */
  if ((rc = check_options(opts, multi)) != 0) return rc;
  if (multi && eff.address == NULL) {
    TIDE_CHECK(tide__sched_address(eff.hosts, eff.nodes, slurm ? "SLURM_JOB_NODELIST" : "the hostfile", address,
                                   sizeof address));
    eff.address = address;
  }
  daemon_t d = {.o = opts, .listen_fd = -1, .signal_fd = -1};
  for (int n = 0; n < opts->nodes; n++) d.total += opts->slots[n];
  if (mkdir(opts->dir, 0700) != 0 && errno != EEXIST) {
    TIDE_ERROR("tide sched: cannot create %s: %s", opts->dir, strerror(errno));
    return TIDE_EIO;
  }
  snprintf(d.jobs_dir, sizeof d.jobs_dir, "%s/jobs", opts->dir);
  if (mkdir(d.jobs_dir, 0700) != 0 && errno != EEXIST) {
    TIDE_ERROR("tide sched: cannot create %s: %s", d.jobs_dir, strerror(errno));
    return TIDE_EIO;
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/lock", opts->dir);
  int lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) {
    TIDE_ERROR("tide sched: cannot open %s: %s", path, strerror(errno));
    return TIDE_EIO;
  }
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    TIDE_ERROR("tide sched: another tide sched serves %s (it holds %s): stop it first, or use another --dir",
               opts->dir, path);
    close(lock_fd);
    return TIDE_ESTATE;
  }
  struct sockaddr_un addr;
  if ((rc = sock_path(opts->dir, &addr)) != 0) goto out;
  unlink(addr.sun_path);
  d.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (d.listen_fd < 0 || bind(d.listen_fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
      listen(d.listen_fd, 64) != 0) {
    TIDE_ERROR("tide sched: cannot listen on %s: %s", addr.sun_path, strerror(errno));
    rc = TIDE_EIO;
    goto out;
  }
  chmod(addr.sun_path, 0600);
  if ((rc = tide_sched_create(&opts->sched, opts->nodes, opts->slots, &d.sched)) != 0) goto out;
  d.multi = multi;
  for (int n = 0; n < opts->nodes && n < MAX_NODES; n++) d.live[n] = n;
  d.nlive = opts->nodes;
  d.address = opts->address != NULL ? opts->address : "127.0.0.1";
  sigemptyset(&d.mask);
  sigaddset(&d.mask, SIGCHLD);
  sigaddset(&d.mask, SIGINT);
  sigaddset(&d.mask, SIGTERM);
  sigaddset(&d.mask, SIGHUP);
  sigset_t old_mask;
  /* Before the control store's thread starts: a SIGTERM it took would kill
   * the daemon at once (no orderly stop, the agents left behind). */
  sigprocmask(SIG_BLOCK, &d.mask, &old_mask);
  if (d.multi && (rc = control_start(&d)) != 0) {
    sigprocmask(SIG_SETMASK, &old_mask, NULL);
    goto out;
  }
  d.next_id = 1;
  load_jobs(&d);
  d.signal_fd = signalfd(-1, &d.mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (d.signal_fd < 0) {
    TIDE_ERROR("tide sched: signalfd: %s", strerror(errno));
    rc = TIDE_EIO;
    sigprocmask(SIG_SETMASK, &old_mask, NULL);
    goto out;
  }
  if (slurm) {
    if ((rc = tide__sched_agents_start(tide, opts->dir, opts->nodes, &old_mask, &d.agents)) != 0) {
      sigprocmask(SIG_SETMASK, &old_mask, NULL);
      goto out;
    }
    if (!opts->quiet) {
      fprintf(stderr, "tide sched: Slurm job %s, %d node(s):", getenv("SLURM_JOB_ID"), opts->nodes);
      for (int n = 0; n < opts->nodes; n++) fprintf(stderr, " %s (%d)", opts->hosts[n], opts->slots[n]);
      fprintf(stderr, "; their agents started by srun (pid %d)\n", (int)d.agents);
    }
  }
  if (!opts->quiet)
    fprintf(stderr, "tide sched: %d slot(s), policy %s, every %g s, state in %s (pid %d)\n", d.total,
            tide_sched_policy_name(opts->sched.policy), opts->interval, opts->dir, (int)getpid());
  tick(&d);
  admit(&d);
  double next_round = mono_s() + opts->interval;
  int stop = 0;
  while (!stop) {
    int pending_change = 0;
    for (int i = 0; i < d.njobs; i++) pending_change |= d.jobs[i].change_at > 0;
    struct pollfd pfd[2] = {{.fd = d.listen_fd, .events = POLLIN}, {.fd = d.signal_fd, .events = POLLIN}};
    int n = poll(pfd, 2, pending_change ? CHANGE_TICK_MS : TICK_MS);
    if (n > 0 && (pfd[1].revents & POLLIN)) {
      struct signalfd_siginfo si;
      while (read(d.signal_fd, &si, sizeof si) == (ssize_t)sizeof si)
        if (si.ssi_signo != SIGCHLD) stop = 1;
    }
    if (n > 0 && (pfd[0].revents & POLLIN)) serve_client(&d);
    tick(&d);
    if (d.agents < 0) {
      int st = d.agents_status;
      TIDE_ERROR("tide sched: the nodes' agents (their srun step) ended, %s %d: no host can run workers; stopping "
                 "(srun's own message is above)",
                 WIFEXITED(st) ? "exit status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      break;
    }
    if (mono_s() >= next_round) {
      allocate(&d);
      admit(&d);
      next_round = mono_s() + opts->interval;
    }
  }
  if (!opts->quiet)
    fprintf(stderr, "tide sched: stopping; %s\n",
            slurm ? "the nodes' agents stop and with them the jobs' workers"
                  : "running jobs go on and a new tide sched takes them over");
  sigprocmask(SIG_SETMASK, &old_mask, NULL);
  rc = d.agents < 0 ? TIDE_EIO : 0;
out:
  /* A Slurm pool's agents: told to quit (they stop their workers and exit
   * 0, and so does srun); SIGTERM to srun would SIGKILL them. */
  for (int n = 0; d.agents > 0 && d.ctl != NULL && n < opts->nodes; n++) agent_cmd(&d, n, "quit");
  tide__sched_agents_stop(d.agents, 10.0);
  for (int i = 0; i < d.njobs; i++) {
    job_disconnect(&d.jobs[i]);
    tide_speedup_destroy(d.jobs[i].speedup);
  }
  tide__free(d.jobs);
  tide_sched_destroy(d.sched);
  tide_store_close(d.ctl);
  tide_store_server_stop(d.ctl_server);
  if (d.signal_fd >= 0) close(d.signal_fd);
  if (d.listen_fd >= 0) {
    close(d.listen_fd);
    unlink(addr.sun_path);
  }
  close(lock_fd);
  return rc;
}

/* ---- the per-host agent ------------------------------------------------------------- */

typedef struct {
  pid_t pid;
  unsigned long long job;
} agent_worker_t;

static int env_taken(const char *e) {
  static const char *const names[] = {"TIDE_RANK=", "TIDE_SIZE=", "TIDE_LOCAL_RANK=", "TIDE_LOCAL_SIZE=",
                                      "TIDE_NODE_RANK=", "TIDE_NNODES=", "TIDE_RDZV=", "TIDE_JOB_TOKEN=",
                                      "TIDE_JOB_ID=", "TIDE_ELASTIC", "TIDE_SCHED_JOB=", "TIDE_BIND=", "TIDE_CPUS=",
                                      "SLURM_" /* a worker is not a task of the submitter's Slurm step */};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strncmp(e, names[i], strlen(names[i])) == 0) return 1;
  return 0;
}

/* "start JOB HOST:PORT RANK SIZE MIN MAX": one worker (RANK -1: a joiner). */
static pid_t agent_start(const char *dir, int node, const char *cmd, const sigset_t *old_mask) {
  unsigned long long id;
  char rdzv[300];
  int rank, size, min_np, max_np;
  if (sscanf(cmd, "start %llu %299s %d %d %d %d", &id, rdzv, &rank, &size, &min_np, &max_np) != 6) return -1;
  char path[4300], token[64] = "";
  snprintf(path, sizeof path, "%s/jobs/%llu/token", dir, id);
  FILE *f = fopen(path, "r");
  if (f == NULL || fscanf(f, "%63s", token) != 1) {
    if (f != NULL) fclose(f);
    TIDE_ERROR("tide sched agent: cannot read %s (is %s shared by every host?)", path, dir);
    return -1;
  }
  fclose(f);
  spec_t s;
  snprintf(path, sizeof path, "%s/jobs/%llu/spec", dir, id);
  if (read_spec(path, &s) != 0) {
    TIDE_ERROR("tide sched agent: cannot read %s (is %s shared by every host?)", path, dir);
    return -1;
  }
  int nenv = 0;
  while (s.envp[nenv] != NULL) nenv++;
  char **env = tide__calloc((size_t)nenv + 16, sizeof *env);
  char vars[12][320];
  if (env == NULL) {
    free_spec(&s);
    return -1;
  }
  int k = 0, v = 0;
  for (int i = 0; i < nenv; i++)
    if (!env_taken(s.envp[i])) env[k++] = s.envp[i];
  snprintf(vars[v++], sizeof vars[0], "TIDE_RDZV=%s", rdzv);
  snprintf(vars[v++], sizeof vars[0], "TIDE_JOB_TOKEN=%s", token);
  snprintf(vars[v++], sizeof vars[0], "TIDE_JOB_ID=sched-%llu", id);
  snprintf(vars[v++], sizeof vars[0], "TIDE_SCHED_JOB=%llu", id);
  snprintf(vars[v++], sizeof vars[0], "TIDE_ELASTIC=1");
  snprintf(vars[v++], sizeof vars[0], "TIDE_ELASTIC_MIN=%d", min_np);
  snprintf(vars[v++], sizeof vars[0], "TIDE_ELASTIC_MAX=%d", max_np);
  snprintf(vars[v++], sizeof vars[0], "TIDE_NODE_RANK=%d", node);
  snprintf(vars[v++], sizeof vars[0], "TIDE_BIND=none");
  if (rank >= 0) {
    snprintf(vars[v++], sizeof vars[0], "TIDE_RANK=%d", rank);
    snprintf(vars[v++], sizeof vars[0], "TIDE_SIZE=%d", size);
  } else {
    snprintf(vars[v++], sizeof vars[0], "TIDE_ELASTIC_JOIN=1");
  }
  for (int i = 0; i < v; i++) env[k++] = vars[i];
  env[k] = NULL;
  snprintf(path, sizeof path, "%s/jobs/%llu/log", dir, id);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    sigprocmask(SIG_SETMASK, old_mask, NULL);
    int log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (log_fd >= 0) dup2(log_fd, 1), dup2(log_fd, 2);
    if (null_fd >= 0) dup2(null_fd, 0);
    if (chdir(s.cwd) != 0) {
      fprintf(stderr, "tide sched agent: cannot enter the job's directory %s: %s\n", s.cwd, strerror(errno));
      _exit(127);
    }
    execve(s.argv[0], s.argv, env);
    fprintf(stderr, "tide sched agent: cannot run %s: %s\n", s.argv[0], strerror(errno));
    _exit(127);
  }
  tide__free(env);
  free_spec(&s);
  return pid;
}

int tide_sched_agent(const char *dir, int node) {
  if (dir == NULL || node < 0 || node >= MAX_NODES) {
    TIDE_ERROR("tide sched --agent: a state directory (--dir) and a node index 0..%d (--node) are needed", MAX_NODES - 1);
    return TIDE_EINVAL;
  }
  char path[4200], host[256] = "", token[64] = "";
  int port = 0;
  snprintf(path, sizeof path, "%s/control", dir);
  for (int tries = 0; tries < 300; tries++) { /* the daemon may be starting */
    FILE *f = fopen(path, "r");
    int got = f != NULL && fscanf(f, "%255s %d %63s", host, &port, token) == 3;
    if (f != NULL) fclose(f);
    if (got) break;
    port = 0;
    usleep(100000);
  }
  if (port <= 0) {
    TIDE_ERROR("tide sched --agent: no %s after 30 s: start `tide sched --hostfile F --dir %s` first (the "
               "directory must be shared by every host)",
               path, dir);
    return TIDE_ENOENT;
  }
  tide_store_t *ctl = NULL;
  int rc = tide_store_connect(host, port, token, 30000, &ctl);
  if (rc != 0) {
    TIDE_ERROR("tide sched --agent: cannot reach the scheduler's control store at %s:%d: %s", host, port,
               tide_strerror(rc));
    return rc;
  }
  sigset_t mask, old_mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGHUP);
  sigprocmask(SIG_BLOCK, &mask, &old_mask);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  char key[96];
  int64_t taken = 0, beat;
  snprintf(key, sizeof key, "agent/%d/taken", node);
  tide_store_add(ctl, key, 0, &taken);
  agent_worker_t *workers = NULL;
  int nworkers = 0, cap = 0, stop = 0;
  double next_beat = 0;
  TIDE_INFO("tide sched agent: host %d, control store %s:%d", node, host, port);
  while (!stop && rc == 0) {
    snprintf(key, sizeof key, "agent/%d/cmd/%lld", node, (long long)taken + 1);
    void *value;
    size_t len;
    int got = tide_store_get(ctl, key, 100, &value, &len);
    if (got == 0) {
      char cmd[512];
      size_t n = len < sizeof cmd - 1 ? len : sizeof cmd - 1;
      memcpy(cmd, value, n);
      cmd[n] = 0;
      tide_free(value);
      unsigned long long id;
      if (strncmp(cmd, "start ", 6) == 0) {
        pid_t pid = agent_start(dir, node, cmd, &old_mask);
        if (pid > 0 && nworkers == cap) {
          cap = cap ? 2 * cap : 16;
          agent_worker_t *w = tide__realloc(workers, (size_t)cap * sizeof *w);
          if (w == NULL) break;
          workers = w;
        }
        if (pid > 0 && sscanf(cmd, "start %llu", &id) == 1) workers[nworkers++] = (agent_worker_t){pid, id};
        if (pid <= 0 && sscanf(cmd, "start %llu", &id) == 1) { /* counts as a failed worker */
          snprintf(key, sizeof key, "job/%llu/%d/failed", id, node);
          tide_store_add(ctl, key, 1, &beat);
          snprintf(key, sizeof key, "job/%llu/%d/exited", id, node);
          tide_store_add(ctl, key, 1, &beat);
        }
      } else if (sscanf(cmd, "kill %llu", &id) == 1) {
        for (int i = 0; i < nworkers; i++)
          if (workers[i].job == id) kill(-workers[i].pid, SIGTERM);
      } else if (strcmp(cmd, "quit") == 0) { /* the daemon stops (a Slurm pool's) */
        stop = 1;
      }
      snprintf(key, sizeof key, "agent/%d/taken", node);
      rc = tide_store_add(ctl, key, 1, &taken);
    } else if (got != TIDE_ETIMEDOUT) {
      rc = got;
    }
    struct signalfd_siginfo si;
    while (sfd >= 0 && read(sfd, &si, sizeof si) == (ssize_t)sizeof si)
      if (si.ssi_signo != SIGCHLD) stop = 1;
    for (int i = 0; i < nworkers;) {
      int status;
      if (waitpid(workers[i].pid, &status, WNOHANG) != workers[i].pid) {
        i++;
        continue;
      }
      kill(-workers[i].pid, SIGKILL); /* what it left in its group */
      int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (code != 0) {
        snprintf(key, sizeof key, "job/%llu/%d/failed", workers[i].job, node);
        tide_store_add(ctl, key, 1, &beat);
      }
      snprintf(key, sizeof key, "job/%llu/%d/exited", workers[i].job, node);
      tide_store_add(ctl, key, 1, &beat);
      workers[i] = workers[--nworkers];
    }
    if (mono_s() >= next_beat) {
      snprintf(key, sizeof key, "agent/%d/beat", node);
      if (tide_store_add(ctl, key, 1, &beat) != 0) rc = TIDE_EIO;
      next_beat = mono_s() + 0.5;
    }
  }
  if (rc != 0) TIDE_ERROR("tide sched agent: host %d lost the scheduler's control store: %s", node, tide_strerror(rc));
  for (int i = 0; i < nworkers; i++) kill(-workers[i].pid, SIGTERM);
  for (int t = 0; t < 30 && nworkers > 0; t++) {
    usleep(100000);
    for (int i = 0; i < nworkers;)
      if (waitpid(workers[i].pid, NULL, WNOHANG) == workers[i].pid)
        workers[i] = workers[--nworkers];
      else
        i++;
  }
  for (int i = 0; i < nworkers; i++) kill(-workers[i].pid, SIGKILL), waitpid(workers[i].pid, NULL, 0);
  tide__free(workers);
  if (sfd >= 0) close(sfd);
  sigprocmask(SIG_SETMASK, &old_mask, NULL);
  tide_store_close(ctl);
  return stop ? 0 : rc;
}
