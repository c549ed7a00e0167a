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
#include "tide.h"

#define MAX_REQUEST (4 << 20)
#define TICK_MS 100
#define CHANGE_TICK_MS 10
#define CLIENT_TIMEOUT_MS 5000

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

int tide_sched_submit(const char *dir, const char *name, int min_np, int max_np, int np, const char *cwd, int argc,
                        char *const *argv, char *const *envp, char *id, size_t cap) {
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
  f[k++] = "submit";
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

/* The keeper (child of fork, in its own session): starts tiderun, forwards
 * SIGTERM/SIGINT/SIGHUP to it, writes its exit status to jobs/ID/exit.
 * Never returns. */
static void __attribute__((noreturn)) keeper_main(const char *tiderun, const char *job_dir, spec_t *s, int np,
                                                  const job_t *j, const sigset_t *mask) {
  setsid();
  char path[4400];
  snprintf(path, sizeof path, "%s/log", job_dir);
  int log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (log_fd >= 0) dup2(log_fd, 1), dup2(log_fd, 2);
  if (null_fd >= 0) dup2(null_fd, 0);
  for (int fd = 3; fd < 1024; fd++) close(fd);
  char rdzv[64], min_np[16], max_np[16], nps[16];
  snprintf(rdzv, sizeof rdzv, "127.0.0.1:%d", j->port);
  snprintf(min_np, sizeof min_np, "%d", j->min_np);
  snprintf(max_np, sizeof max_np, "%d", j->max_np);
  snprintf(nps, sizeof nps, "%d", np);
  int argc = 0;
  while (s->argv[argc] != NULL) argc++;
  const char *fixed[] = {tiderun, "--elastic", "--rdzv", rdzv, "--min-np", min_np, "--max-np", max_np, "-np",
                         nps, "--bind", "none", "--"};
  int nfixed = (int)(sizeof fixed / sizeof fixed[0]);
  char **args = tide__calloc((size_t)(nfixed + argc + 1), sizeof *args);
  int nenv = 0;
  while (s->envp[nenv] != NULL) nenv++;
  char **env = tide__calloc((size_t)nenv + 3, sizeof *env);
  if (args == NULL || env == NULL) _exit(1);
  for (int i = 0; i < nfixed; i++) args[i] = (char *)fixed[i];
  for (int i = 0; i < argc; i++) args[nfixed + i] = s->argv[i];
  int k = 0;
  for (int i = 0; i < nenv; i++)
    if (strncmp(s->envp[i], "TIDE_JOB_TOKEN=", 15) != 0 && strncmp(s->envp[i], "TIDE_SCHED_JOB=", 15) != 0)
      env[k++] = s->envp[i];
  char token_env[64], id_env[64];
  snprintf(token_env, sizeof token_env, "TIDE_JOB_TOKEN=%s", j->token);
  snprintf(id_env, sizeof id_env, "TIDE_SCHED_JOB=%llu", (unsigned long long)j->id);
  env[k++] = token_env;
  env[k++] = id_env;
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
  j->port = free_port();
  if (j->port < 0 || random_token(j->token, sizeof j->token) != 0) {
    free_spec(&s);
    TIDE_ERROR("tide sched: job %llu: no free port or random token", (unsigned long long)j->id);
    return TIDE_EIO;
  }
  snprintf(path, sizeof path, "%s/token", job_dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || write_all(fd, j->token, strlen(j->token)) != 0) {
    if (fd >= 0) close(fd);
    free_spec(&s);
    TIDE_ERROR("tide sched: cannot write %s: %s", path, strerror(errno));
    return TIDE_EIO;
  }
  close(fd);
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

static void allocate(daemon_t *d) {
  int n = 0;
  for (int i = 0; i < d->njobs; i++) n += active(&d->jobs[i]);
  if (n == 0) return;
  tide_sched_job_t *sj = tide__calloc((size_t)n, sizeof *sj);
  int *cur = tide__calloc((size_t)n, sizeof *cur), *next = tide__calloc((size_t)n, sizeof *next);
  job_t **map = tide__calloc((size_t)n, sizeof *map);
  if (sj == NULL || cur == NULL || next == NULL || map == NULL) goto out;
  double now = wall_s();
  int k = 0;
  for (int i = 0; i < d->njobs; i++) {
    job_t *j = &d->jobs[i];
    if (!active(j)) continue;
    if (j->state == JOB_RUNNING && job_connect(j) == 0) job_read_hints(j);
    map[k] = j;
    sj[k] = (tide_sched_job_t){.id = j->id, .submit_time = j->submit, .min_slots = j->min_np,
                               .max_slots = j->max_np, .requested = j->np, .attained = j->attained,
                               .resize_cost = j->last_latency > 0 ? j->last_latency : d->o->resize_cost,
                               .resizes = j->resizes, .remaining = 1,
                               .speedup = j->speedup ? tide_speedup_cb : NULL, .speedup_arg = j->speedup};
    cur[k] = j->state == JOB_RUNNING ? j->alloc : 0;
    k++;
  }
  if (tide_sched_allocate(d->sched, now, sj, n, cur, next) != 0) {
    TIDE_WARN("tide sched: the allocation round failed; allocations unchanged");
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

/* Admits pending jobs at their minimum, in submission order, while they fit
 * (a newly submitted job starts at once). FIFO waits for its round. */
static void admit(daemon_t *d) {
  if (d->o->sched.policy == TIDE_SCHED_FIFO || d->o->sched.policy == TIDE_SCHED_TIRESIAS) return;
  for (int i = 0; i < d->njobs; i++) {
    job_t *j = &d->jobs[i];
    if (j->state != JOB_PENDING) continue;
    if (j->min_np > d->total - used_slots(d)) break;
    start_job(d, j, j->min_np);
  }
}

/* Keepers that ended, memberships that took a decision, slot-seconds. */
static void tick(daemon_t *d) {
  double now = mono_s();
  double dt = d->last_tick > 0 ? now - d->last_tick : 0;
  d->last_tick = now;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  for (int i = 0; i < d->njobs; i++) {
    job_t *j = &d->jobs[i];
    if (j->state != JOB_RUNNING && j->state != JOB_CANCELLING) continue;
    j->attained += dt * j->alloc;
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

static void jobs_table(daemon_t *d, text_t *t) {
  double now = wall_s();
  text_add(t, "%-4s %-16s %-10s %5s %7s %7s %9s %11s %7s %7s %8s %5s\n", "ID", "NAME", "STATE", "SLOTS", "WORKERS",
           "BATCH", "GOODPUT", "SPEEDUP", "RESIZES", "LAT_S", "TIME_S", "EXIT");
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
    char slots[16], workers[16];
    snprintf(slots, sizeof slots, "%d", j->state == JOB_RUNNING || j->state == JOB_CANCELLING ? j->alloc : 0);
    snprintf(workers, sizeof workers, "%d", j->state == JOB_RUNNING ? j->members : 0);
    text_add(t, "%-4llu %-16.16s %-10s %5s %7s %7s %9s %11s %7d %7s %8.1f %5s\n", (unsigned long long)j->id,
             j->name, state_names[j->state], slots, workers, batch, goodput, speedup, j->resizes, lat, time_s,
             exit_code);
  }
}

static int handle_submit(daemon_t *d, char **f, int nf, text_t *t) {
  if (nf < 8) {
    text_add(t, "a malformed submission");
    return -1;
  }
  int min_np = atoi(f[2]), max_np = atoi(f[3]), np = atoi(f[4]), argc = atoi(f[6]);
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
    fprintf(stderr, "tide sched: job %llu (%s) submitted: %d..%d worker(s)\n", (unsigned long long)j->id, j->name,
            min_np, max_np);
  admit(d);
  return 0;
}

static int handle(daemon_t *d, char **f, int nf, text_t *t) {
  if (nf >= 1 && strcmp(f[0], "submit") == 0) return handle_submit(d, f, nf, t);
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

static int check_options(const tide_sched_daemon_options_t *o) {
  if (o->dir == NULL || o->dir[0] == 0) {
    TIDE_ERROR("tide sched: no state directory (--dir)");
    return TIDE_EINVAL;
  }
  if (o->nodes < 1 || o->slots == NULL) {
    TIDE_ERROR("tide sched: the pool needs at least one host with slots (--slots N or --hostfile F)");
    return TIDE_EINVAL;
  }
  if (o->nodes > 1) {
    TIDE_ERROR("tide sched: the pool has %d hosts, but this tide sched runs jobs on the local host only (one "
               "host in the hostfile); several hosts need a per-node agent, not built yet",
               o->nodes);
    return TIDE_EINVAL;
  }
  char self[256] = "";
  gethostname(self, sizeof self - 1);
  if (o->hosts != NULL && o->hosts[0] != NULL && strcmp(o->hosts[0], "localhost") != 0 &&
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
  if (o->tiderun == NULL || access(o->tiderun, X_OK) != 0) {
    TIDE_ERROR("tide sched: the launcher %s is not an executable (tiderun)", o->tiderun ? o->tiderun : "(none)");
    return TIDE_EINVAL;
  }
  return 0;
}

int tide_sched_serve(const tide_sched_daemon_options_t *opts) {
  if (opts == NULL) return TIDE_EINVAL;
  int rc = check_options(opts);
  if (rc != 0) return rc;
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
  d.next_id = 1;
  load_jobs(&d);
  sigemptyset(&d.mask);
  sigaddset(&d.mask, SIGCHLD);
  sigaddset(&d.mask, SIGINT);
  sigaddset(&d.mask, SIGTERM);
  sigaddset(&d.mask, SIGHUP);
  sigset_t old_mask;
  sigprocmask(SIG_BLOCK, &d.mask, &old_mask);
  d.signal_fd = signalfd(-1, &d.mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (d.signal_fd < 0) {
    TIDE_ERROR("tide sched: signalfd: %s", strerror(errno));
    rc = TIDE_EIO;
    sigprocmask(SIG_SETMASK, &old_mask, NULL);
    goto out;
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
    if (mono_s() >= next_round) {
      allocate(&d);
      admit(&d);
      next_round = mono_s() + opts->interval;
    }
  }
  if (!opts->quiet) fprintf(stderr, "tide sched: stopping; running jobs go on and a new tide sched takes them over\n");
  sigprocmask(SIG_SETMASK, &old_mask, NULL);
  rc = 0;
out:
  for (int i = 0; i < d.njobs; i++) {
    job_disconnect(&d.jobs[i]);
    tide_speedup_destroy(d.jobs[i].speedup);
  }
  tide__free(d.jobs);
  tide_sched_destroy(d.sched);
  if (d.signal_fd >= 0) close(d.signal_fd);
  if (d.listen_fd >= 0) {
    close(d.listen_fd);
    unlink(addr.sun_path);
  }
  close(lock_fd);
  return rc;
}
