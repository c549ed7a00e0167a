/* The cluster allocator: which slots of which nodes each job runs on.
 * Pollux's policy (Qiao et al., OSDI 2021) maximises the power mean of the
 * jobs' speedups with a penalty for reallocating, by a genetic search over
 * job x node slot matrices seeded with the current allocation and a greedy
 * one (so it is never worse than either); the baselines FIFO, Tiresias
 * (2D-LAS, two queues) and Optimus (marginal gain) share the interface.
 * Everything is deterministic for the options' seed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

struct tide_sched {
  tide_sched_options_t opts;
  int nodes, total, max_per_node;
  int *slots;
  uint64_t rng;
  /* Tiresias: per job id, its queue and its place in it. */
  struct lane {
    uint64_t id;
    int queue;
    uint64_t order;
  } *lanes;
  int nlanes, lanes_cap;
  uint64_t next_order;
};

static const char *const policy_names[] = {"pollux", "greedy", "fifo", "tiresias", "optimus"};

const char *tide_sched_policy_name(tide_sched_policy_t policy) {
  return (unsigned)policy < sizeof policy_names / sizeof *policy_names ? policy_names[policy] : "?";
}

int tide_sched_policy_parse(const char *name, tide_sched_policy_t *out) {
  for (unsigned i = 0; name != NULL && i < sizeof policy_names / sizeof *policy_names; i++)
    if (strcmp(name, policy_names[i]) == 0) {
      *out = (tide_sched_policy_t)i;
      return 0;
    }
  TIDE_ERROR("unknown scheduling policy '%s' (pollux, greedy, fifo, tiresias or optimus)", name ? name : "");
  return TIDE_EINVAL;
}

void tide_sched_options_init(tide_sched_options_t *opts) {
  *opts = (tide_sched_options_t){.policy = TIDE_SCHED_POLLUX, .p = -1, .seed = 1, .tiresias_threshold = 16 * 3600.0};
}

int tide_sched_create(const tide_sched_options_t *opts, int nodes, const int *slots, tide_sched_t **out) {
  if (opts == NULL || slots == NULL || out == NULL) return tide__null_arg("tide_sched_create", "opts, slots or out");
  if (nodes < 1) {
    TIDE_ERROR("sched: nodes %d must be >= 1", nodes);
    return TIDE_EINVAL;
  }
  if ((unsigned)opts->policy > TIDE_SCHED_OPTIMUS || !isfinite(opts->p) || opts->p > 1 || opts->population < 0 ||
      opts->generations < 0 || !(opts->tiresias_threshold > 0)) {
    TIDE_ERROR("sched: bad options (policy %d, p %g <= 1, population %d, generations %d, tiresias_threshold %g)",
               (int)opts->policy, opts->p, opts->population, opts->generations, opts->tiresias_threshold);
    return TIDE_EINVAL;
  }
  tide_sched_t *s = tide__calloc(1, sizeof *s);
  if (s == NULL) return TIDE_ENOMEM;
  s->slots = tide__malloc((size_t)nodes * sizeof *s->slots);
  if (s->slots == NULL) {
    tide__free(s);
    return TIDE_ENOMEM;
  }
  s->opts = *opts;
  s->nodes = nodes;
  for (int n = 0; n < nodes; n++) {
    if (slots[n] < 1) {
      TIDE_ERROR("sched: node %d has %d slots (must be >= 1)", n, slots[n]);
      tide_sched_destroy(s);
      return TIDE_EINVAL;
    }
    s->slots[n] = slots[n];
    s->total += slots[n];
    if (slots[n] > s->max_per_node) s->max_per_node = slots[n];
  }
  *out = s;
  return 0;
}

void tide_sched_destroy(tide_sched_t *s) {
  if (s == NULL) return;
  tide__free(s->slots);
  tide__free(s->lanes);
  tide__free(s);
}

/* splitmix64 */
static uint64_t next_random(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static int below(uint64_t *state, int n) { return n <= 1 ? 0 : (int)(next_random(state) % (uint64_t)n); }
static double uniform(uint64_t *state) { return (double)(next_random(state) >> 11) / 9007199254740992.0; }

/* Everything one round needs, built once. */
typedef struct {
  tide_sched_t *s;
  const tide_sched_job_t *jobs;
  int njobs, nodes;
  const int *current;
  int *order;      /* jobs by priority: least attained service, then earliest */
  int *cap;        /* most slots per job */
  double *base;    /* speedup at the fair share */
  double *penalty; /* factor on a job's speedup when its allocation changes */
  double scale, p;
} round_t;

static double speedup_of(const tide_sched_job_t *j, int nodes, int slots) {
  if (slots < 1) return 0;
  return j->speedup != NULL ? j->speedup(j->speedup_arg, nodes, slots) : slots;
}

static void row_shape(const int *row, int nodes, int *used_nodes, int *slots) {
  int u = 0, k = 0;
  for (int n = 0; n < nodes; n++)
    if (row[n] > 0) u++, k += row[n];
  *used_nodes = u;
  *slots = k;
}

static int row_changed(const round_t *r, int j, const int *row) {
  if (r->current == NULL) {
    for (int n = 0; n < r->nodes; n++)
      if (row[n] != 0) return 1;
    return 0;
  }
  return memcmp(row, r->current + (size_t)j * r->nodes, (size_t)r->nodes * sizeof *row) != 0;
}

/* The power-mean term of one job with `slots` on `used` nodes. */
static double term(const round_t *r, int j, int used, int slots, int changed) {
  double x = slots > 0 ? speedup_of(&r->jobs[j], used, slots) / r->base[j] * r->scale : 0;
  if (changed) x *= r->penalty[j];
  x += 1e-3;
  return r->p == 0 ? log(x) : pow(x, r->p);
}

static double mean_of(const round_t *r, double sum) {
  sum /= r->njobs;
  return r->p == 0 ? exp(sum) : pow(sum, 1 / r->p);
}

static double fitness(const round_t *r, const int *state) {
  double sum = 0;
  for (int j = 0; j < r->njobs; j++) {
    const int *row = state + (size_t)j * r->nodes;
    int used, slots;
    row_shape(row, r->nodes, &used, &slots);
    sum += term(r, j, used, slots, row_changed(r, j, row));
  }
  return mean_of(r, sum);
}

static int by_priority(const tide_sched_job_t *jobs, int a, int b) {
  if (jobs[a].attained != jobs[b].attained) return jobs[a].attained < jobs[b].attained ? -1 : 1;
  if (jobs[a].submit_time != jobs[b].submit_time) return jobs[a].submit_time < jobs[b].submit_time ? -1 : 1;
  return jobs[a].id < jobs[b].id ? -1 : jobs[a].id > jobs[b].id;
}

static int by_submission(const tide_sched_job_t *jobs, int a, int b) {
  if (jobs[a].submit_time != jobs[b].submit_time) return jobs[a].submit_time < jobs[b].submit_time ? -1 : 1;
  return jobs[a].id < jobs[b].id ? -1 : jobs[a].id > jobs[b].id;
}

/* Insertion sort of idx[0..n) (n is at most a few hundred jobs). */
static void sort_jobs(int *idx, int n, const tide_sched_job_t *jobs,
                      int (*cmp)(const tide_sched_job_t *, int, int)) {
  for (int i = 1; i < n; i++) {
    int v = idx[i], k = i;
    while (k > 0 && cmp(jobs, idx[k - 1], v) > 0) idx[k] = idx[k - 1], k--;
    idx[k] = v;
  }
}

static void round_fini(round_t *r) {
  tide__free(r->order);
  tide__free(r->cap);
  tide__free(r->base);
  tide__free(r->penalty);
}

static int round_init(round_t *r, tide_sched_t *s, double now, const tide_sched_job_t *jobs, int njobs,
                      const int *current) {
  *r = (round_t){.s = s, .jobs = jobs, .njobs = njobs, .nodes = s->nodes, .current = current, .p = s->opts.p};
  size_t nj = njobs > 0 ? (size_t)njobs : 1;
  r->order = tide__malloc(nj * sizeof *r->order);
  r->cap = tide__malloc(nj * sizeof *r->cap);
  r->base = tide__malloc(nj * sizeof *r->base);
  r->penalty = tide__malloc(nj * sizeof *r->penalty);
  if (r->order == NULL || r->cap == NULL || r->base == NULL || r->penalty == NULL) {
    round_fini(r);
    return TIDE_ENOMEM;
  }
  /* Pollux's scaling: a job's speedup relative to its fair share of the
   * cluster, times the share one node is. */
  int fair = njobs > 0 ? (s->total + njobs - 1) / njobs : 1;
  r->scale = (double)s->nodes / s->total;
  for (int j = 0; j < njobs; j++) {
    const tide_sched_job_t *job = &jobs[j];
    r->order[j] = j;
    int cap = job->max_slots > 0 && job->max_slots < s->total ? job->max_slots : s->total;
    r->cap[j] = cap;
    int f = fair < cap ? fair : cap;
    double b = speedup_of(job, 1, f);
    r->base[j] = b > 0 ? b : 1;
    double age = now - job->submit_time;
    if (age < 0) age = 0;
    double cost = job->resize_cost;
    double keep = age - job->resizes * cost;
    r->penalty[j] = cost > 0 ? (keep > 0 ? keep : 0) / (age + cost) : 1;
  }
  sort_jobs(r->order, njobs, jobs, by_priority);
  return 0;
}

/* Makes state valid: each job within its cap (slots dropped from the nodes
 * it has fewest on), one multi-node job per node (the first by priority
 * keeps it), node capacity (jobs by priority), and each job's minimum or
 * nothing. */
static void repair(const round_t *r, int *state, int *used) {
  int N = r->nodes;
  for (int j = 0; j < r->njobs; j++) {
    int *row = state + (size_t)j * N, nodes, slots;
    for (int n = 0; n < N; n++)
      if (row[n] < 0) row[n] = 0;
    row_shape(row, N, &nodes, &slots);
    while (slots > r->cap[j]) {
      int at = -1;
      for (int n = 0; n < N; n++)
        if (row[n] > 0 && (at < 0 || row[n] < row[at])) at = n;
      int drop = slots - r->cap[j] < row[at] ? slots - r->cap[j] : row[at];
      row[at] -= drop;
      slots -= drop;
    }
  }
  /* used[n]: slots taken on node n; used[N + n]: 1 when a multi-node job
   * holds node n. */
  memset(used, 0, (size_t)2 * N * sizeof *used);
  for (int i = 0; i < r->njobs; i++) {
    int j = r->order[i], *row = state + (size_t)j * N, nodes, slots;
    row_shape(row, N, &nodes, &slots);
    int multi = nodes > 1 && !r->s->opts.allow_interference;
    for (int n = 0; n < N; n++) {
      if (row[n] == 0) continue;
      if (multi && used[N + n]) row[n] = 0;
      int room = r->s->slots[n] - used[n];
      if (row[n] > room) row[n] = room;
    }
    row_shape(row, N, &nodes, &slots);
    int min = r->jobs[j].min_slots > 0 ? r->jobs[j].min_slots : 1;
    if (slots < min) {
      memset(row, 0, (size_t)N * sizeof *row);
      continue;
    }
    for (int n = 0; n < N; n++) {
      used[n] += row[n];
      if (nodes > 1 && row[n] > 0) used[N + n] = 1;
    }
  }
}

/* Places sizes[j] slots per job into state (zeroed here): a job whose size
 * is unchanged keeps its current placement when it still fits; the others,
 * largest first, go to one node that fits best, or else over the nodes with
 * the most free slots (whole nodes first). With avoid, a multi-node job
 * takes only nodes no other multi-node job holds. A job that does not fit
 * gets what does, or nothing below its minimum. */
static void place(const round_t *r, const int *sizes, int avoid, int *state, int *used) {
  int N = r->nodes, J = r->njobs;
  memset(state, 0, (size_t)J * N * sizeof *state);
  memset(used, 0, (size_t)2 * N * sizeof *used);
  const int *idx = r->order;
  int *todo = tide__malloc((size_t)(J > 0 ? J : 1) * sizeof *todo);
  if (todo == NULL) return;
  int ntodo = 0;
  for (int i = 0; i < J; i++) {
    int j = idx[i], k = sizes[j];
    if (k <= 0) continue;
    if (r->current != NULL) {
      const int *cur = r->current + (size_t)j * N;
      int nodes, slots, fits = 1;
      row_shape(cur, N, &nodes, &slots);
      for (int n = 0; slots == k && n < N; n++)
        if (cur[n] > 0 && (r->s->slots[n] - used[n] < cur[n] || (avoid && nodes > 1 && used[N + n]))) fits = 0;
      if (slots == k && fits) {
        for (int n = 0; n < N; n++) {
          state[(size_t)j * N + n] = cur[n];
          used[n] += cur[n];
          if (nodes > 1 && cur[n] > 0) used[N + n] = 1;
        }
        continue;
      }
    }
    todo[ntodo++] = j;
  }
  /* largest first */
  for (int i = 1; i < ntodo; i++) {
    int v = todo[i], k = i;
    while (k > 0 && sizes[todo[k - 1]] < sizes[v]) todo[k] = todo[k - 1], k--;
    todo[k] = v;
  }
  for (int i = 0; i < ntodo; i++) {
    int j = todo[i], want = sizes[j], *row = state + (size_t)j * N, best = -1;
    for (int n = 0; n < N; n++) {
      int room = r->s->slots[n] - used[n];
      if (room >= want && (best < 0 || room < r->s->slots[best] - used[best])) best = n;
    }
    if (best >= 0) {
      row[best] = want;
      used[best] += want;
      continue;
    }
    int got = 0;
    while (got < want) {
      int at = -1;
      for (int n = 0; n < N; n++) {
        int room = r->s->slots[n] - used[n];
        if (row[n] > 0 || room <= 0 || (avoid && used[N + n])) continue;
        if (at < 0 || room > r->s->slots[at] - used[at]) at = n;
      }
      if (at < 0) break;
      int room = r->s->slots[at] - used[at], take = want - got < room ? want - got : room;
      row[at] = take;
      got += take;
    }
    int min = r->jobs[j].min_slots > 0 ? r->jobs[j].min_slots : 1;
    if (got < min) {
      /* The nodes left to multi-node jobs are full: the most this job
       * gets on one node, where a single-node job may share. */
      memset(row, 0, (size_t)N * sizeof *row);
      int at = 0;
      for (int n = 1; n < N; n++)
        if (r->s->slots[n] - used[n] > r->s->slots[at] - used[at]) at = n;
      if (r->s->slots[at] - used[at] < min) continue;
      row[at] = r->s->slots[at] - used[at];
    }
    int nodes, slots;
    row_shape(row, N, &nodes, &slots);
    for (int n = 0; n < N; n++) {
      used[n] += row[n];
      if (nodes > 1 && row[n] > 0) used[N + n] = 1;
    }
  }
  tide__free(todo);
}

static int nodes_for(const round_t *r, int slots) { return (slots + r->s->max_per_node - 1) / r->s->max_per_node; }

/* The greedy allocation: each job its minimum (at least 1) by priority
 * while slots last, then one slot at a time to the job whose power-mean
 * term gains most, then placed. */
static void greedy(const round_t *r, int *sizes, int *state, int *used) {
  int J = r->njobs, left = r->s->total;
  for (int j = 0; j < J; j++) sizes[j] = 0;
  for (int i = 0; i < J; i++) {
    int j = r->order[i], min = r->jobs[j].min_slots > 0 ? r->jobs[j].min_slots : 1;
    if (min <= left && min <= r->cap[j]) sizes[j] = min, left -= min;
  }
  while (left > 0) {
    int pick = -1;
    double gain = 0;
    for (int j = 0; j < J; j++) {
      int k = sizes[j];
      if (k == 0 || k >= r->cap[j]) continue;
      double now = term(r, j, nodes_for(r, k), k, 0), next = term(r, j, nodes_for(r, k + 1), k + 1, 0);
      double g = r->p < 0 ? now - next : next - now; /* p < 0: the sum of terms falls */
      if (g > gain) gain = g, pick = j;
    }
    if (pick < 0) break;
    sizes[pick]++;
    left--;
  }
  place(r, sizes, !r->s->opts.allow_interference, state, used);
  repair(r, state, used);
}

/* ---- Pollux: genetic search ---- */

typedef struct {
  int *state;
  double fitness;
} individual_t;

static void mutate(const round_t *r, uint64_t *rng, int *state, int *used) {
  int N = r->nodes, J = r->njobs;
  for (int j = 0; j < J; j++) {
    int *row = state + (size_t)j * N;
    double u = uniform(rng);
    if (u < 0.05) {
      if (r->current != NULL) memcpy(row, r->current + (size_t)j * N, (size_t)N * sizeof *row);
      else memset(row, 0, (size_t)N * sizeof *row);
    } else if (u < 0.10) {
      int n = below(rng, N);
      for (int k = 0; k < N && row[n] == 0; k++) n = (n + 1) % N;
      if (row[n] > 0) row[n]--;
    } else if (u < 0.12) {
      memset(row, 0, (size_t)N * sizeof *row);
    }
  }
  /* Grow: free slots to random jobs, on nodes they use half the time. */
  memset(used, 0, (size_t)N * sizeof *used);
  for (int j = 0; j < J; j++)
    for (int n = 0; n < N; n++) used[n] += state[(size_t)j * N + n];
  int moves = 1 + J / 8;
  for (int m = 0; m < moves; m++) {
    int j = below(rng, J), *row = state + (size_t)j * N, n = -1;
    if (uniform(rng) < 0.5) {
      int start = below(rng, N);
      for (int k = 0; k < N; k++) {
        int c = (start + k) % N;
        if (row[c] > 0 && used[c] < r->s->slots[c]) {
          n = c;
          break;
        }
      }
    }
    if (n < 0) {
      int start = below(rng, N);
      for (int k = 0; k < N; k++) {
        int c = (start + k) % N;
        if (used[c] < r->s->slots[c]) {
          n = c;
          break;
        }
      }
    }
    if (n < 0) break;
    int add = 1 + below(rng, r->s->slots[n] - used[n]);
    row[n] += add;
    used[n] += add;
  }
}

static int by_fitness(const void *a, const void *b) {
  const individual_t *x = a, *y = b;
  return x->fitness < y->fitness ? 1 : x->fitness > y->fitness ? -1 : 0;
}

static int genetic(const round_t *r, int *next) {
  int N = r->nodes, J = r->njobs, rc = 0;
  size_t cells = (size_t)J * N;
  int P = r->s->opts.population > 0 ? r->s->opts.population : 100;
  int G = r->s->opts.generations > 0 ? r->s->opts.generations : 100;
  /* Large inputs: keep population x generations x cells near 2e8. */
  double work = (double)P * G * cells;
  if (r->s->opts.population == 0 && r->s->opts.generations == 0 && work > 2e8) {
    double f = sqrt(work / 2e8);
    P = (int)(P / f);
    G = (int)(G / f);
    if (P < 16) P = 16;
    if (G < 10) G = 10;
  }
  individual_t *pop = tide__calloc((size_t)2 * P, sizeof *pop);
  int *cells_all = tide__malloc((size_t)2 * P * cells * sizeof *cells_all);
  int *used = tide__malloc((size_t)2 * N * sizeof *used), *sizes = tide__malloc((size_t)J * sizeof *sizes);
  if (pop == NULL || cells_all == NULL || used == NULL || sizes == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  for (int i = 0; i < 2 * P; i++) pop[i].state = cells_all + (size_t)i * cells;
  uint64_t rng = r->s->opts.seed ^ (0x5851f42d4c957f2dull * (r->s->rng + 1));
  /* Seeds: the current allocation, the greedy one; the rest mutants. */
  if (r->current != NULL) memcpy(pop[0].state, r->current, cells * sizeof(int));
  else memset(pop[0].state, 0, cells * sizeof(int));
  repair(r, pop[0].state, used);
  greedy(r, sizes, pop[1].state, used);
  for (int i = 2; i < P; i++) {
    memcpy(pop[i].state, pop[i % 2].state, cells * sizeof(int));
    mutate(r, &rng, pop[i].state, used);
    repair(r, pop[i].state, used);
  }
  for (int i = 0; i < P; i++) pop[i].fitness = fitness(r, pop[i].state);
  for (int g = 0; g < G; g++) {
    for (int c = 0; c < P; c++) {
      individual_t *child = &pop[P + c];
      int a = below(&rng, P), b = below(&rng, P), d = below(&rng, P), e = below(&rng, P);
      const individual_t *pa = pop[a].fitness >= pop[b].fitness ? &pop[a] : &pop[b];
      const individual_t *pb = pop[d].fitness >= pop[e].fitness ? &pop[d] : &pop[e];
      /* Uniform crossover over jobs: each job's row from either parent. */
      for (int j = 0; j < J; j++) {
        const individual_t *from = uniform(&rng) < 0.5 ? pa : pb;
        memcpy(child->state + (size_t)j * N, from->state + (size_t)j * N, (size_t)N * sizeof(int));
      }
      mutate(r, &rng, child->state, used);
      repair(r, child->state, used);
      child->fitness = fitness(r, child->state);
    }
    /* (P + P) selection: the headers are sorted, the states stay put. */
    qsort(pop, (size_t)2 * P, sizeof *pop, by_fitness);
  }
  qsort(pop, (size_t)P, sizeof *pop, by_fitness);
  memcpy(next, pop[0].state, cells * sizeof(int));
out:
  tide__free(pop);
  tide__free(cells_all);
  tide__free(used);
  tide__free(sizes);
  return rc;
}

/* ---- baselines ---- */

static int fixed_size(const round_t *r, int j) {
  int k = r->jobs[j].requested > 0 ? r->jobs[j].requested : 1;
  return k < r->cap[j] ? k : r->cap[j];
}

static int current_slots(const round_t *r, int j) {
  if (r->current == NULL) return 0;
  int nodes, slots;
  row_shape(r->current + (size_t)j * r->nodes, r->nodes, &nodes, &slots);
  return slots;
}

/* FIFO: running jobs keep their slots; queued ones start in submission
 * order while the next one fits (no backfilling). */
static void fifo(const round_t *r, int *sizes, int *idx) {
  int left = r->s->total, blocked = 0;
  for (int j = 0; j < r->njobs; j++) {
    idx[j] = j;
    sizes[j] = current_slots(r, j);
    if (sizes[j] > r->cap[j]) sizes[j] = r->cap[j];
    left -= sizes[j];
  }
  sort_jobs(idx, r->njobs, r->jobs, by_submission);
  for (int i = 0; i < r->njobs && !blocked; i++) {
    int j = idx[i];
    if (sizes[j] > 0) continue;
    int k = fixed_size(r, j);
    if (k <= left) sizes[j] = k, left -= k;
    else blocked = 1;
  }
}

/* The index of job id's lane, made in queue 0 if new; -1 without memory. */
static int lane_of(tide_sched_t *s, uint64_t id) {
  for (int i = 0; i < s->nlanes; i++)
    if (s->lanes[i].id == id) return i;
  if (s->nlanes == s->lanes_cap) {
    int cap = s->lanes_cap ? 2 * s->lanes_cap : 64;
    struct lane *l = tide__realloc(s->lanes, (size_t)cap * sizeof *l);
    if (l == NULL) return -1;
    s->lanes = l;
    s->lanes_cap = cap;
  }
  s->lanes[s->nlanes] = (struct lane){.id = id, .queue = 0, .order = s->next_order++};
  return s->nlanes++;
}

/* Tiresias: queue 0 until a job has attained the threshold (slot-seconds
 * at its requested size), then queue 1; each queue first come first
 * served by the time the job entered it; jobs run by that priority while
 * their size fits (later smaller ones may fill the gaps), the others wait
 * (preempted if they ran). */
static int tiresias(const round_t *r, int *sizes, int *idx) {
  tide_sched_t *s = r->s;
  int *at = tide__malloc((size_t)(r->njobs > 0 ? r->njobs : 1) * sizeof *at);
  if (at == NULL) return TIDE_ENOMEM;
  for (int j = 0; j < r->njobs; j++) {
    at[j] = lane_of(s, r->jobs[j].id);
    if (at[j] < 0) {
      tide__free(at);
      return TIDE_ENOMEM;
    }
  }
  struct lane **of = (struct lane **)tide__malloc((size_t)(r->njobs > 0 ? r->njobs : 1) * sizeof *of);
  if (of == NULL) {
    tide__free(at);
    return TIDE_ENOMEM;
  }
  for (int j = 0; j < r->njobs; j++) {
    struct lane *l = of[j] = &s->lanes[at[j]];
    if (l->queue == 0 && r->jobs[j].attained >= s->opts.tiresias_threshold) {
      l->queue = 1;
      l->order = s->next_order++;
    }
    idx[j] = j;
  }
  tide__free(at);
  for (int i = 1; i < r->njobs; i++) {
    int v = idx[i], k = i;
    while (k > 0 && (of[idx[k - 1]]->queue > of[v]->queue ||
                     (of[idx[k - 1]]->queue == of[v]->queue && of[idx[k - 1]]->order > of[v]->order)))
      idx[k] = idx[k - 1], k--;
    idx[k] = v;
  }
  int left = s->total;
  for (int i = 0; i < r->njobs; i++) {
    int j = idx[i], k = fixed_size(r, j);
    sizes[j] = k <= left ? k : 0;
    left -= sizes[j];
  }
  /* Forget jobs that are gone. */
  int keep = 0;
  for (int i = 0; i < s->nlanes; i++) {
    int live = 0;
    for (int j = 0; j < r->njobs && !live; j++) live = r->jobs[j].id == s->lanes[i].id;
    if (live) s->lanes[keep++] = s->lanes[i];
  }
  s->nlanes = keep;
  tide__free(of);
  return 0;
}

/* Optimus: each job one slot in submission order, then one slot at a time
 * to the job whose remaining time falls most. */
static void optimus(const round_t *r, int *sizes, int *idx) {
  int left = r->s->total;
  for (int j = 0; j < r->njobs; j++) idx[j] = j, sizes[j] = 0;
  sort_jobs(idx, r->njobs, r->jobs, by_submission);
  for (int i = 0; i < r->njobs && left > 0; i++) {
    int j = idx[i], min = r->jobs[j].min_slots > 0 ? r->jobs[j].min_slots : 1;
    if (min <= left) sizes[idx[i]] = min, left -= min;
  }
  while (left > 0) {
    int pick = -1;
    double gain = 0;
    for (int j = 0; j < r->njobs; j++) {
      int k = sizes[j];
      if (k == 0 || k >= r->cap[j]) continue;
      const tide_sched_job_t *job = &r->jobs[j];
      double now = speedup_of(job, nodes_for(r, k), k), next = speedup_of(job, nodes_for(r, k + 1), k + 1);
      if (!(now > 0 && next > 0)) continue;
      double g = job->remaining * (1 / now - 1 / next);
      if (g > gain) gain = g, pick = j;
    }
    if (pick < 0) break;
    sizes[pick]++;
    left--;
  }
}

static int check_jobs(const tide_sched_t *s, const tide_sched_job_t *jobs, int njobs, const int *current) {
  if (njobs < 0 || (njobs > 0 && jobs == NULL)) {
    TIDE_ERROR("sched: %d jobs at %p", njobs, (const void *)jobs);
    return TIDE_EINVAL;
  }
  for (int j = 0; j < njobs; j++) {
    const tide_sched_job_t *job = &jobs[j];
    if (job->min_slots < 0 || job->max_slots < 0 || (job->max_slots > 0 && job->min_slots > job->max_slots) ||
        job->requested < 0 || !(job->resize_cost >= 0) || job->resizes < 0 || !isfinite(job->submit_time)) {
      TIDE_ERROR("sched: job %d (id %llu): min_slots %d, max_slots %d, requested %d, resize_cost %g, resizes %d "
                 "out of range",
                 j, (unsigned long long)job->id, job->min_slots, job->max_slots, job->requested, job->resize_cost,
                 job->resizes);
      return TIDE_EINVAL;
    }
  }
  if (current != NULL) {
    for (int n = 0; n < s->nodes; n++) {
      int sum = 0;
      for (int j = 0; j < njobs; j++) {
        int v = current[(size_t)j * s->nodes + n];
        if (v < 0) {
          TIDE_ERROR("sched: current allocation of job %d on node %d is %d", j, n, v);
          return TIDE_EINVAL;
        }
        sum += v;
      }
      if (sum > s->slots[n]) {
        TIDE_ERROR("sched: the current allocation puts %d slots on node %d, which has %d", sum, n, s->slots[n]);
        return TIDE_EINVAL;
      }
    }
  }
  return 0;
}

int tide_sched_allocate(tide_sched_t *s, double now, const tide_sched_job_t *jobs, int njobs, const int *current,
                        int *next) {
  if (s == NULL || next == NULL) return tide__null_arg("tide_sched_allocate", "s or next");
  TIDE_CHECK(check_jobs(s, jobs, njobs, current));
  if (njobs == 0) return 0;
  round_t r;
  TIDE_CHECK(round_init(&r, s, now, jobs, njobs, current));
  int rc = 0, N = s->nodes;
  int *sizes = tide__malloc((size_t)njobs * sizeof *sizes), *idx = tide__malloc((size_t)njobs * sizeof *idx);
  int *used = tide__malloc((size_t)2 * N * sizeof *used);
  if (sizes == NULL || idx == NULL || used == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  switch (s->opts.policy) {
  case TIDE_SCHED_POLLUX:
    rc = genetic(&r, next);
    break;
  case TIDE_SCHED_GREEDY:
    greedy(&r, sizes, next, used);
    break;
  case TIDE_SCHED_FIFO:
    fifo(&r, sizes, idx);
    place(&r, sizes, 0, next, used);
    break;
  case TIDE_SCHED_TIRESIAS:
    rc = tiresias(&r, sizes, idx);
    if (rc == 0) place(&r, sizes, 0, next, used);
    break;
  case TIDE_SCHED_OPTIMUS:
    optimus(&r, sizes, idx);
    place(&r, sizes, 0, next, used);
    break;
  }
  s->rng++;
out:
  tide__free(sizes);
  tide__free(idx);
  tide__free(used);
  round_fini(&r);
  return rc;
}

double tide_sched_fitness(tide_sched_t *s, double now, const tide_sched_job_t *jobs, int njobs, const int *current,
                          const int *alloc) {
  if (s == NULL || alloc == NULL || njobs < 1 || check_jobs(s, jobs, njobs, current) != 0) return NAN;
  round_t r;
  if (round_init(&r, s, now, jobs, njobs, current) != 0) return NAN;
  double f = fitness(&r, alloc);
  round_fini(&r);
  return f;
}
