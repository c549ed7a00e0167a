/* Elastic jobs (docs/elastic.md): a rank killed mid-epoch and training
 * completes with 3; 2 -> 4 -> 3 workers mid-epoch; a hung rank left out
 * and refused as stale when it comes back; a joiner with a wrong token
 * refused. After each run: every sample of every data epoch used exactly
 * once (the samples of a step that failed, once in the step redone),
 * identical parameters on every member, nothing left in /dev/shm.
 *
 * Workers record what they compute ("C membership-epoch step data-epoch
 * indices...") and what completed ("S membership-epoch step") in one file
 * each; the parent checks coverage from them. */
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/core.h"
#include "harness.h"

#define N 600    /* samples */
#define D 8      /* parameters */
#define EPOCHS 3
#define MAX_STEPS 4096

typedef struct {
  const char *name;
  int kill_rank, kill_step; /* a rank that dies (SIGKILL) when handed this step; -1 none */
  int kill_mask;            /* more ranks (bit r: rank r) that die with it: a host lost */
  int connect_kill;         /* a rank that dies while epoch 1's communicator connects (0: none) */
  int handover_kill;        /* a rank that dies while epoch 1 takes the state over (0: none); the
                               joiners wait 0.5 s before their trainer, the old members for them */
  int initial;              /* first members; harness ranks >= initial join later */
  int join_step;            /* joiners start when rank 0 reaches this step */
  int join_to;              /* rank 0 slows down from join_step until this many members (0: no wait) */
  int shrink_step, shrink_to; /* rank 0 asks for shrink_to workers at this step */
  int hang_rank, hang_step;   /* a rank that stops for a while (then is stale) */
  int bad_token_rank;         /* a joiner with the wrong job token */
  int grow_step, grow_to;     /* rank 0 asks for grow_to workers at this step */
  int tiderun;                /* started by tiderun --elastic: it starts the joiners */
  int slow_rank, slow_step;   /* a rank that computes 20x slower from this step (0: none) */
  int momentum, pto;          /* momentum-SGD (0.5) instead of SGD; config.pto */
  int proposer_dies;          /* kill_rank arrives first at the next epoch (its proposer), then dies */
  char dir[256];
} scenario_t;

static void features(uint64_t i, float *x, float *y) {
  unsigned s = (unsigned)i * 2654435761u + 12345u;
  float dot = 0;
  for (int k = 0; k < D; k++) {
    x[k] = (float)((int)(harness_rand(&s) % 2001) - 1000) / 1000.0f;
    dot += x[k] * (float)(k + 1) * 0.25f;
  }
  *y = dot;
}

/* Mean gradient and loss of 0.5 (w.x - y)^2 over the batch. */
static double grad(const float *w, const uint64_t *idx, size_t n, float *g) {
  memset(g, 0, D * sizeof *g);
  double loss = 0;
  for (size_t j = 0; j < n; j++) {
    float x[D], y, p = 0;
    features(idx[j], x, &y);
    for (int k = 0; k < D; k++) p += w[k] * x[k];
    float r = p - y;
    loss += 0.5 * (double)r * r;
    for (int k = 0; k < D; k++) g[k] += r * x[k] / (float)n;
  }
  return n ? loss / (double)n : 0;
}

static tide_store_t *connect_store(const char *token) {
  char host[256];
  int port;
  CHECK_OK(tide__parse_host_port(getenv("TIDE_RDZV"), host, sizeof host, &port));
  tide_store_t *store;
  CHECK_OK(tide_store_connect(host, port, token, 20000, &store));
  return store;
}

/* Kills its process (SIGKILL) delay_ms after key appears in the store. */
typedef struct {
  char key[64];
  int delay_ms;
} killer_t;

static void *killer_main(void *arg) {
  killer_t *k = arg;
  tide_store_t *store = connect_store(getenv("TIDE_JOB_TOKEN"));
  void *v;
  size_t len;
  if (tide_store_get(store, k->key, 60000, &v, &len) != 0) return NULL;
  usleep((useconds_t)k->delay_ms * 1000);
  raise(SIGKILL);
  return NULL;
}

/* What the library's arrival at the next epoch does (comm/elastic.c: its
 * here key, the proposer counter, e<N>/by/1), then death before the epoch
 * is sealed: the survivors must see the proposer lost and one of them
 * propose in its place. */
static void arrive_and_die(int rank, long next) {
  tide_store_t *store = connect_store(getenv("TIDE_JOB_TOKEN"));
  char key[64], id[16];
  snprintf(id, sizeof id, "r%d", rank);
  snprintf(key, sizeof key, "elastic/e%ld/here/%s", next, id);
  CHECK_OK(tide_store_set(store, key, "1", 1));
  int64_t order;
  snprintf(key, sizeof key, "elastic/e%ld/proposer", next);
  CHECK_OK(tide_store_add(store, key, 1, &order));
  CHECK(order == 1);
  snprintf(key, sizeof key, "elastic/e%ld/by/1", next);
  CHECK_OK(tide_store_set(store, key, id, strlen(id)));
  raise(SIGKILL);
}

static int kills(const scenario_t *sc, int rank) {
  return rank == sc->kill_rank || (rank >= 0 && rank < 31 && (sc->kill_mask >> rank & 1));
}

static int worker(int rank, int size, void *arg) {
  (void)size;
  scenario_t *sc = arg;
  setenv("TIDE_ELASTIC", "1", 1);
  const char *join_env = getenv("TIDE_ELASTIC_JOIN");
  int joiner = sc->tiderun ? join_env != NULL && strcmp(join_env, "1") == 0 : rank >= sc->initial;
  if (joiner && !sc->tiderun) {
    /* The parameters are read once, at the first tide call. */
    setenv("TIDE_ELASTIC_JOIN", "1", 1);
    char token[128];
    snprintf(token, sizeof token, "%s", getenv("TIDE_JOB_TOKEN"));
    if (rank == sc->bad_token_rank) setenv("TIDE_JOB_TOKEN", "not-the-job-token", 1);
    /* Wait for rank 0 to reach join_step. */
    tide_store_t *store = connect_store(token);
    void *v;
    size_t len;
    CHECK_OK(tide_store_get(store, "test/join", 60000, &v, &len));
    tide_free(v);
    tide_store_close(store);
    if (rank == sc->bad_token_rank) {
      tide_comm_t *comm = NULL;
      int rc = tide_comm_init(&comm);
      fprintf(stderr, "wrong-token joiner: %s\n", tide_err_name(rc));
      CHECK_RC(rc, TIDE_EAUTH);
      return 0;
    }
  } else if (!sc->tiderun) {
    char text[16];
    snprintf(text, sizeof text, "%d", sc->initial);
    setenv("TIDE_SIZE", text, 1);
  }
  char path[512];
  snprintf(path, sizeof path, "%s/rec.%d", sc->dir, (int)getpid());
  FILE *rec = fopen(path, "w");
  CHECK(rec != NULL);
  static killer_t kill_at;
  pthread_t killer;
  if (sc->connect_kill > 0 && rank == sc->connect_kill && !joiner) {
    /* Once it has published its address for epoch 1 (an old member keeps
     * its rank): inside the connect, before its peers can finish theirs. */
    snprintf(kill_at.key, sizeof kill_at.key, "x1/peer/%d", rank);
    CHECK(pthread_create(&killer, NULL, killer_main, &kill_at) == 0);
  }
  if (sc->handover_kill > 0 && rank == sc->handover_kill && !joiner) {
    /* 0.2 s after epoch 1 connected (the first joiner, rank 2, is ready),
     * while the old members wait for the joiners in the hand-over. */
    snprintf(kill_at.key, sizeof kill_at.key, "x1/ready/2");
    kill_at.delay_ms = 200;
    CHECK(pthread_create(&killer, NULL, killer_main, &kill_at) == 0);
  }
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  tide_trainer_config_t c;
  tide_trainer_config_default(&c);
  c.dataset_size = N;
  c.seed = 7;
  c.batch = 8;
  c.base_batch = 32;
  c.epochs = EPOCHS;
  tide_optim_config_default(sc->momentum ? TIDE_OPTIM_MOMENTUM : TIDE_OPTIM_SGD, &c.optim);
  if (sc->momentum) c.optim.momentum = 0.5f;
  c.schedule.base_lr = sc->momentum ? 0.5f : 1.0f;
  c.pto = sc->pto;
  float w[D] = {0}, g[D];
  tide_trainer_t *tr;
  if (sc->handover_kill > 0 && joiner) usleep(500000);
  CHECK_OK(tide_trainer_create(comm, &c, w, g, D, NULL, 0, &tr));
  CHECK_OK(tide_trainer_elastic(tr));
  int member0 = tide_comm_rank(tide_trainer_comm(tr)) == 0 && !joiner;
  tide_store_t *store = member0 ? connect_store(getenv("TIDE_JOB_TOKEN")) : NULL;
  int recoveries = 0, grown = 0, joined = 0, replaced = 0, most = 0, shrunk = sc->shrink_step < 0;
  for (;;) {
    tide_batch_t b;
    tide_step_stats_t st;
    int rc = tide_trainer_next(tr, &b);
    if (rc == 0 && b.done) break;
    if (rc == 0) {
      long epoch = tide_comm_epoch(tide_trainer_comm(tr));
      if (b.micro == 0) {
        if (member0 && b.step == sc->join_step) CHECK_OK(tide_store_set(store, "test/join", "1", 1));
        int members = tide_comm_size(tide_trainer_comm(tr));
        if (member0 && b.step == sc->grow_step) CHECK_OK(tide_elastic_request(store, sc->grow_to));
        /* Steps this small end the job before the launcher's workers join:
         * slow down until they have. */
        if (member0 && sc->grow_to > 0 && b.step >= sc->grow_step && !grown) {
          if (members < sc->grow_to)
            usleep(20000);
          else
            grown = 1;
        }
        /* Likewise for the harness's joiners (a loaded machine starts them late:
         * the job ended first and a late joiner was refused, TIDE_ESTATE). */
        if (member0 && sc->join_to > 0 && b.step >= sc->join_step && !joined) {
          if (members < sc->join_to)
            usleep(20000);
          else
            joined = 1;
        }
        /* Likewise after a kill under tiderun: slow down until its
         * replacement has joined (slow sanitizer builds start it late). */
        if (members > most) most = members;
        if (member0 && sc->tiderun && sc->kill_rank >= 0 && b.step > sc->kill_step && !replaced) {
          if (members < most)
            usleep(20000);
          else
            replaced = 1;
        }
        if (member0 && !shrunk && b.step >= sc->shrink_step && (sc->grow_to == 0 || grown) && (sc->join_to == 0 || joined)) {
          CHECK_OK(tide_elastic_request(store, sc->shrink_to));
          shrunk = 1;
        }
      }
      fprintf(rec, "C %ld %ld %llu", epoch, b.step, (unsigned long long)b.epoch);
      for (size_t j = 0; j < b.count; j++) fprintf(rec, " %llu", (unsigned long long)b.indices[j]);
      fprintf(rec, "\n");
      fflush(rec);
      if (kills(sc, rank) && !joiner && b.step == sc->kill_step) {
        if (sc->proposer_dies) arrive_and_die(rank, epoch + 1);
        raise(SIGKILL);
      }
      if (rank == sc->hang_rank && b.step == sc->hang_step && !joiner) sleep(3);
      if (sc->slow_rank > 0) {
        /* Everyone "computes" 5 ms, the straggler 60 ms from slow_step on.
         * Sleeping, not spinning: four spinning ranks on a 2-core machine
         * take turns on the cores, and a rank descheduled for a few
         * milliseconds looked like a straggler before the slowdown began. */
        usleep(rank == sc->slow_rank && b.step >= sc->slow_step ? 60000 : 5000);
      }
      double loss = grad(w, b.indices, b.count, g);
      rc = tide_trainer_step(tr, loss, &st);
      if (rc == 0 && st.stepped) {
        fprintf(rec, "S %ld %ld\n", epoch, st.step - 1);
        if (sc->momentum) { /* the parameters after each step */
          fprintf(rec, "W %ld", st.step - 1);
          for (int k = 0; k < D; k++) fprintf(rec, " %.9g", w[k]);
          fprintf(rec, "\n");
        }
        fflush(rec);
      }
    }
    if (rc != 0) {
      recoveries++;
      rc = tide_trainer_recover(tr, rc);
      if (rank == sc->hang_rank && rc == TIDE_ESTATE) {
        /* Left out while it hung: the job went on without it. */
        fprintf(stderr, "rank %d: stale, refused: %s\n", rank, tide_trainer_last_error(tr));
        fprintf(rec, "STALE\n");
        fclose(rec);
        tide_trainer_destroy(tr);
        return 0;
      }
      CHECK_OK(rc);
      CHECK(recoveries < 5);
    }
  }
  if (tide_trainer_detached(tr)) {
    fprintf(rec, "DETACHED %ld\n", tide_trainer_stats(tr)->step);
    if (sc->slow_rank > 0) {
      long late = tide_trainer_stats(tr)->step - sc->slow_step;
      fprintf(stderr, "rank %d: slowed at step %d, removed as a straggler %ld steps later\n", rank, sc->slow_step, late);
      CHECK(rank == sc->slow_rank && late <= 20);
    }
  } else {
    /* Identical parameters on every member. */
    tide_comm_t *now = tide_trainer_comm(tr);
    float lo[D], hi[D];
    CHECK_OK(tide_allreduce(now, w, lo, D, TIDE_F32, TIDE_MIN));
    CHECK_OK(tide_allreduce(now, w, hi, D, TIDE_F32, TIDE_MAX));
    CHECK(memcmp(lo, hi, sizeof lo) == 0);
    double err = 0;
    for (int k = 0; k < D; k++) err += fabs(w[k] - (k + 1) * 0.25);
    fprintf(rec, "END %d %d %g\n", tide_comm_rank(now), tide_comm_size(now), err);
    if (err >= 0.01) fprintf(stderr, "rank %d: |w - w*|_1 = %g: it did not converge\n", rank, err);
    CHECK(err < 0.01);
  }
  fclose(rec);
  tide_store_close(store);
  tide_trainer_destroy(tr);
  return 0;
}

/* ---- the checker ------------------------------------------------------------------- */

/* The parameters after step shrink_step + 3 in the last checked run
 * (scenarios with momentum record them). */
static double probe_w[D];

typedef struct {
  int epoch;     /* membership epoch it completed in, -1 not yet */
  int data_epoch;
} step_t;

/* The record files of a run, "rec.*" in sc->dir. */
static int record_files(const scenario_t *sc, char names[][64], int cap) {
  DIR *d = opendir(sc->dir);
  CHECK(d != NULL);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && n < cap)
    if (strncmp(e->d_name, "rec.", 4) == 0) snprintf(names[n++], 64, "%.60s", e->d_name);
  closedir(d);
  return n;
}

static int check_records(const scenario_t *sc, int want_end_size) {
  static char files[64][64];
  int np = record_files(sc, files, 64);
  static step_t steps[MAX_STEPS];
  for (int s = 0; s < MAX_STEPS; s++) steps[s] = (step_t){-1, -1};
  static char line[1 << 16];
  int ends = 0, end_size = -1;
  /* Pass 1: where each step completed. */
  for (int r = 0; r < np; r++) {
    char path[512];
    snprintf(path, sizeof path, "%.256s/%.60s", sc->dir, files[r]);
    FILE *f = fopen(path, "r");
    if (f == NULL) continue;
    while (fgets(line, sizeof line, f)) {
      long e, s;
      if (sscanf(line, "S %ld %ld", &e, &s) == 2) {
        CHECK(s >= 0 && s < MAX_STEPS);
        if (steps[s].epoch >= 0 && steps[s].epoch != e) {
          fprintf(stderr, "%s: step %ld completed in membership epochs %d and %ld\n", sc->name, s, steps[s].epoch, e);
          return 1;
        }
        steps[s].epoch = (int)e;
      }
      int rk, sz;
      double err;
      if (strncmp(line, "W ", 2) == 0) {
        char *p = line + 1;
        if (strtol(p, &p, 10) == sc->shrink_step + 3)
          for (int k = 0; k < D; k++) probe_w[k] = strtod(p, &p);
      }
      if (sscanf(line, "END %d %d %lg", &rk, &sz, &err) == 3) {
        ends++;
        end_size = sz;
      }
    }
    fclose(f);
  }
  /* Pass 2: the samples of each completed step's attempt. */
  static unsigned char used[EPOCHS + 1][N];
  memset(used, 0, sizeof used);
  for (int r = 0; r < np; r++) {
    char path[512];
    snprintf(path, sizeof path, "%.256s/%.60s", sc->dir, files[r]);
    FILE *f = fopen(path, "r");
    if (f == NULL) continue;
    while (fgets(line, sizeof line, f)) {
      if (line[0] != 'C') continue;
      char *p = line + 2, *end;
      long e = strtol(p, &end, 10);
      long s = strtol(end, &end, 10);
      long de = strtol(end, &end, 10);
      CHECK(s >= 0 && s < MAX_STEPS && de >= 0 && de <= EPOCHS);
      if (steps[s].epoch != e) continue; /* an attempt that did not complete */
      for (;;) {
        p = end;
        unsigned long long idx = strtoull(p, &end, 10);
        if (end == p) break;
        CHECK(idx < N);
        if (used[de][idx]++) {
          fprintf(stderr, "%s: sample %llu used twice in data epoch %ld (step %ld)\n", sc->name, idx, de, s);
          return 1;
        }
      }
    }
    fclose(f);
  }
  for (int de = 0; de < EPOCHS; de++)
    for (int i = 0; i < N; i++)
      if (used[de][i] != 1) {
        fprintf(stderr, "%s: sample %d used %d times in data epoch %d\n", sc->name, i, used[de][i], de);
        return 1;
      }
  if (ends != want_end_size || end_size != want_end_size) {
    fprintf(stderr, "%s: %d ranks finished in a job of %d; wanted %d\n", sc->name, ends, end_size, want_end_size);
    return 1;
  }
  fprintf(stderr, "%s: every sample used once per epoch, %d members at the end, identical parameters\n", sc->name,
          end_size);
  return 0;
}

/* Elastic epochs' communicators name their segments tide-<job>-x<epoch>-<rank>;
 * nobody else's do. A machine may hold some from before this test (another
 * suite's killed host: its /dev/shm would have gone with it), so the test
 * counts only the names that were not there when it started. */
enum { SHM_SEEN_MAX = 256 };
static char shm_seen[SHM_SEEN_MAX][NAME_MAX + 1];
static int shm_nseen;

static int is_epoch_segment(const char *name) { return strncmp(name, "tide-", 5) == 0 && strstr(name, "-x") != NULL; }

static void shm_snapshot(void) {
  DIR *d = opendir("/dev/shm");
  if (d == NULL) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && shm_nseen < SHM_SEEN_MAX)
    if (is_epoch_segment(e->d_name)) snprintf(shm_seen[shm_nseen++], sizeof shm_seen[0], "%s", e->d_name);
  closedir(d);
}

static int shm_leftovers(void) {
  DIR *d = opendir("/dev/shm");
  if (d == NULL) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!is_epoch_segment(e->d_name)) continue;
    int seen = 0;
    for (int i = 0; i < shm_nseen && !seen; i++) seen = strcmp(shm_seen[i], e->d_name) == 0;
    if (!seen) {
      fprintf(stderr, "left in /dev/shm: %s\n", e->d_name);
      n++;
    }
  }
  closedir(d);
  return n;
}

static int run(scenario_t *sc, int np, int transport, int want_end_size) {
  static const char *const hosts[] = {"hostA", "hostA", "hostB", "hostB", "hostB"};
  snprintf(sc->dir, sizeof sc->dir, "/tmp/tide-elastic-XXXXXX");
  CHECK(mkdtemp(sc->dir) != NULL);
  /* A unique token per run names the shared-memory segments. */
  char token[64];
  snprintf(token, sizeof token, "elastic-%d-%s", (int)getpid(), sc->name);
  harness_opts_t opts = {np, transport == 2 ? hosts : NULL, transport == 1, 120, token};
  const char *names[] = {"shm", "tcp", "2 emulated hosts"};
  fprintf(stderr, "== %s over %s\n", sc->name, names[transport]);
  harness_run(&opts, worker, sc);
  int rc = 0;
  for (int r = 0; r < np; r++) {
    int st = harness_status[r];
    int killed = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
    int dies = kills(sc, r) || (sc->connect_kill > 0 && r == sc->connect_kill) ||
               (sc->handover_kill > 0 && r == sc->handover_kill);
    if (dies ? !killed : !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      fprintf(stderr, "%s: rank %d ended with status 0x%x\n", sc->name, r, st);
      rc = 1;
    }
  }
  if (rc == 0) rc = check_records(sc, want_end_size);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", sc->dir);
  if (system(cmd) != 0) rc = 1;
  return rc;
}

/* Under tiderun --elastic: argv = --worker DIR KILL_RANK KILL_STEP GROW_STEP GROW_TO SHRINK_STEP SHRINK_TO. */
static int tiderun_worker(char **argv) {
  scenario_t sc = {.name = "tiderun", .tiderun = 1, .join_step = -1, .hang_rank = -1, .bad_token_rank = -1};
  snprintf(sc.dir, sizeof sc.dir, "%s", argv[2]);
  sc.kill_rank = atoi(argv[3]);
  sc.kill_step = atoi(argv[4]);
  sc.grow_step = atoi(argv[5]);
  sc.grow_to = atoi(argv[6]);
  sc.shrink_step = atoi(argv[7]);
  sc.shrink_to = atoi(argv[8]);
  return worker(atoi(getenv("TIDE_RANK")), 0, &sc);
}

/* Runs the scenario under tiderun --elastic with `launch`'s options; with
 * nodes = 2, two tiderun processes (--nnodes 2, node ranks 0 and 1, hosts
 * told apart by TIDE_HOST_ID) make one job across two emulated hosts; with
 * nodes = -2 the same with --nnodes 1:2 (node 1 joins the running job). */
static int run_tiderun(const char *self, const char *name, const char *launch, int nodes, const char *scenario,
                       int want_end_size) {
  scenario_t sc = {.name = name};
  snprintf(sc.dir, sizeof sc.dir, "/tmp/tide-elastic-XXXXXX");
  CHECK(mkdtemp(sc.dir) != NULL);
  const char *tools = getenv("TIDE_TOOLS_DIR");
  char cmd[4096];
  if (nodes == 1) {
    snprintf(cmd, sizeof cmd, "%s/tiderun --bind none --timeout 120 %s %s --worker %s %s", tools ? tools : "tools",
             launch, self, sc.dir, scenario);
  } else {
    int port = harness_free_port();
    char node[2][1024];
    for (int k = 0; k < 2; k++)
      snprintf(node[k], sizeof node[k],
               "TIDE_HOST_ID=elastic-host%d %s/tiderun --bind none --timeout 120 --nnodes %s --node-rank %d "
               "--rdzv 127.0.0.1:%d %s %s --worker %s %s",
               k, tools ? tools : "tools", nodes < 0 ? "1:2" : "2", k, port, launch, self, sc.dir, scenario);
    snprintf(cmd, sizeof cmd, "export TIDE_JOB_TOKEN=test-elastic-nodes-%d; (%s) & a=$!; %s; b=$?; wait $a; "
             "a=$?; exit $((a | b))", (int)getpid(), node[0], node[1]);
  }
  fprintf(stderr, "== %s: %s\n", name, cmd);
  int st = system(cmd);
  int rc = 0;
  if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
    fprintf(stderr, "%s: tiderun ended with status 0x%x\n", name, st);
    rc = 1;
  }
  if (rc == 0) rc = check_records(&sc, want_end_size);
  snprintf(cmd, sizeof cmd, "rm -rf %s", sc.dir);
  if (system(cmd) != 0) rc = 1;
  return rc;
}

/* `test_elastic faults` (ctest test_elastic_faults): the host of rank 0
 * lost, a member lost while the next epoch's communicator connects, and
 * while it takes the training state over. */
static int faults(void) {
  shm_snapshot();
  int failed = 0;
  setenv("TIDE_ELASTIC_MAX", "4", 1);
  /* Rank 0 alone (shm, TCP), then rank 0's whole host (ranks 0 and 1 of
   * hosts A A B B, hierarchical all-reduce, and again with the ring). */
  setenv("TIDE_ELASTIC_MIN", "3", 1);
  scenario_t rank0 = {.name = "kill rank 0 of 4", .kill_rank = 0, .kill_step = 25, .initial = 4, .join_step = -1,
                      .shrink_step = -1, .hang_rank = -1, .bad_token_rank = -1};
  failed |= run(&rank0, 4, 0, 3);
  failed |= run(&rank0, 4, 1, 3);
  setenv("TIDE_ELASTIC_MIN", "2", 1);
  scenario_t host0 = {.name = "rank 0's host lost (ranks 0, 1 of 4)", .kill_rank = 0, .kill_mask = 1 << 1,
                      .kill_step = 25, .initial = 4, .join_step = -1, .shrink_step = -1, .hang_rank = -1,
                      .bad_token_rank = -1};
  failed |= run(&host0, 4, 2, 2);
  setenv("TIDE_ALGO", "ring", 1);
  host0.name = "rank 0's host lost (ranks 0, 1 of 4), ring";
  failed |= run(&host0, 4, 2, 2);
  unsetenv("TIDE_ALGO");
  /* Grow 2 -> 4 over 2 hosts; rank 1 dies while the grown epoch connects:
   * the survivors form the next epoch without it (3 members). */
  scenario_t connecting = {.name = "a member lost while the grown epoch connects", .kill_rank = -1,
                           .connect_kill = 1, .initial = 2, .join_step = 5, .join_to = 3, .shrink_step = -1,
                           .hang_rank = -1, .bad_token_rank = -1};
  failed |= run(&connecting, 4, 2, 3);
  failed |= run(&connecting, 4, 0, 3);
  /* The same, rank 1 dying while the grown epoch takes the state over: the
   * old member and the joiners (whose trainer meets it there) start another
   * epoch without it. */
  scenario_t handover = connecting;
  handover.name = "a member lost during the hand-over to joiners";
  handover.connect_kill = 0;
  handover.handover_kill = 1;
  failed |= run(&handover, 4, 2, 3);
  int left = shm_leftovers();
  if (left) fprintf(stderr, "%d shared-memory files of this test remain in /dev/shm\n", left);
  return failed || left;
}

int main(int argc, char **argv) {
  if (argc == 9 && strcmp(argv[1], "--worker") == 0) return tiderun_worker(argv);
  setenv("TIDE_TIMEOUT_MS", "20000", 1);
  setenv("TIDE_ELASTIC_TIMEOUT_MS", "5000", 1);
  if (argc == 2 && strcmp(argv[1], "faults") == 0) return faults();
  shm_snapshot();
  int failed = 0;
  /* A peer hello of another epoch's communicator is refused. */
  tide__peer_hello_t hello = {TIDE__PEER_HELLO_MAGIC, tide__fnv1a_str("x1"), 2, 0};
  CHECK_RC(tide__peer_hello_check(&hello, tide__fnv1a_str("x2"), 0, 4), TIDE_EPROTO);
  CHECK_OK(tide__peer_hello_check(&hello, tide__fnv1a_str("x1"), 0, 4));

  for (int t = 0; t < 3; t++) {
    setenv("TIDE_ELASTIC_MIN", "3", 1);
    setenv("TIDE_ELASTIC_MAX", "4", 1);
    scenario_t kill = {.name = "kill 1 of 4", .kill_rank = 3, .kill_step = 25, .initial = 4, .join_step = -1,
                       .shrink_step = -1, .hang_rank = -1, .bad_token_rank = -1};
    failed |= run(&kill, 4, t, 3);
    if (t == 0) {
      kill.name = "kill 1 of 4, the next epoch's proposer, before it seals the epoch";
      kill.proposer_dies = 1;
      failed |= run(&kill, 4, t, 3);
    }
    if (t == 1) continue;
    setenv("TIDE_ELASTIC_MIN", "2", 1);
    scenario_t grow = {.name = "grow 2 to 4, shrink to 3", .kill_rank = -1, .initial = 2, .join_step = 5,
                       .join_to = 4, .shrink_step = 35, .shrink_to = 3, .hang_rank = -1, .bad_token_rank = 4};
    failed |= run(&grow, 5, t, 3);
  }
  /* PTO: the optimizer's shards are gathered before each change and re-cut
   * for the new members. Grow and shrink; then a shrink at a fixed step
   * (deterministic) with momentum, replicated and under PTO: the same
   * parameters 3 steps after it, so the sharded momentum came through. */
  setenv("TIDE_ELASTIC_MIN", "2", 1);
  setenv("TIDE_ELASTIC_MAX", "4", 1);
  scenario_t grow_pto = {.name = "grow 2 to 4, shrink to 3, PTO", .kill_rank = -1, .initial = 2, .join_step = 5,
                         .join_to = 4, .shrink_step = 35, .shrink_to = 3, .hang_rank = -1, .bad_token_rank = -1, .momentum = 1,
                         .pto = 1};
  failed |= run(&grow_pto, 4, 0, 3);
  scenario_t shrink = {.name = "shrink 4 to 3, momentum", .kill_rank = -1, .initial = 4, .join_step = -1,
                       .shrink_step = 10, .shrink_to = 3, .hang_rank = -1, .bad_token_rank = -1, .momentum = 1};
  failed |= run(&shrink, 4, 0, 3);
  double replicated[D];
  memcpy(replicated, probe_w, sizeof replicated);
  shrink.name = "shrink 4 to 3, momentum, PTO";
  shrink.pto = 1;
  failed |= run(&shrink, 4, 0, 3);
  for (int k = 0; k < D; k++)
    if (!(fabs(probe_w[k] - replicated[k]) <= 1e-5 * (fabs(replicated[k]) + 1e-3))) {
      fprintf(stderr, "PTO through a shrink: w[%d] = %.9g after step %d, replicated %.9g\n", k, probe_w[k],
              shrink.shrink_step + 3, replicated[k]);
      failed = 1;
    }
  /* A straggler is found and taken out of the job. */
  setenv("TIDE_ELASTIC_MIN", "3", 1);
  setenv("TIDE_STRAGGLER", "remove", 1);
  scenario_t slow = {.name = "straggler removed", .kill_rank = -1, .initial = 4, .join_step = -1, .shrink_step = -1,
                     .hang_rank = -1, .bad_token_rank = -1, .slow_rank = 2, .slow_step = 10};
  failed |= run(&slow, 4, 0, 3);
  setenv("TIDE_STRAGGLER", "report", 1);

  /* tiderun replaces a killed worker; grows 2 -> 4 and shrinks to 3 on request. */
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  CHECK(n > 0);
  self[n] = 0;
  failed |= run_tiderun(self, "tiderun: a killed worker replaced", "--elastic --min-np 3 --max-np 4 -np 4", 1,
                        "3 25 -1 0 -1 0", 4);
  failed |= run_tiderun(self, "tiderun: 2 -> 4 -> 3", "--elastic --min-np 2 --max-np 4 -np 2", 1, "-1 -1 5 4 35 3",
                        3);
  /* Two tiderun processes, one per emulated host: 2 -> 4 (node 0 starts the
   * joiners) -> 3, and a killed worker replaced by its node. */
  failed |= run_tiderun(self, "tiderun --nnodes 2: 2 -> 4 -> 3", "--elastic --min-np 2 --max-np 4 -np 1", 2,
                        "-1 -1 5 4 35 3", 3);
  failed |= run_tiderun(self, "tiderun --nnodes 2: a killed worker replaced", "--elastic --min-np 3 --max-np 4 -np 2",
                        2, "3 25 -1 0 -1 0", 4);
  /* --nnodes 1:2: node 0 starts the job with 2 workers, node 1's 2 join it
   * (grow_to 4 with no request: rank 0 slows down until they have joined,
   * or the job could end before a slow sanitizer build's joiners arrive). */
  failed |= run_tiderun(self, "tiderun --nnodes 1:2: a second host joins", "--elastic --min-np 2 --max-np 4 -np 2",
                        -2, "-1 -1 -1 4 -1 0", 4);

  setenv("TIDE_ELASTIC_MIN", "2", 1);
  setenv("TIDE_TIMEOUT_MS", "1500", 1);
  setenv("TIDE_ELASTIC_TIMEOUT_MS", "1000", 1);
  scenario_t hang = {.name = "hung rank left out, stale", .kill_rank = -1, .initial = 3, .join_step = -1,
                     .shrink_step = -1, .hang_rank = 2, .hang_step = 10, .bad_token_rank = -1};
  failed |= run(&hang, 3, 0, 2);
  int left = shm_leftovers();
  if (left) fprintf(stderr, "%d shared-memory files of this test remain in /dev/shm\n", left);
  return failed || left;
}
