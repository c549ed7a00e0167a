/* The parallel tensor operation (PTO) against the replicated optimizer
 * step, through the step API, on a synthetic flat model: each rank's
 * gradient is a fixed buffer (no forward/backward), so a step is the
 * exchange, the statistics and the optimizer. Run under tiderun; the two
 * modes alternate round by round in the same run (the machine's noise hits
 * both). Per step the trainer's stats give exchange_s (PTO: reduce-scatter
 * and parameter all-gather; replicated: the allreduce), optim_s (averaging,
 * statistics and the optimizer: PTO on this rank's shard) and step_s; each
 * is the median over the timed steps, the slowest rank's, then the median
 * over rounds. Rank 0 prints one JSON line per round and mode, then a table.
 *
 *   tiderun -np 4 bench/pto_bench [--params N (25e6)] [--tensors T (1)]
 *       [--optims lamb,adam] [--steps S (10)] [--warmup W (2)] [--rounds R (3)] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tide.h"

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define CHECK(call, what)                                                                                 \
  do {                                                                                                    \
    int rc_ = (call);                                                                                     \
    if (rc_ != 0) {                                                                                       \
      fprintf(stderr, "pto_bench: %s: %s %s\n", what, tide_strerror(rc_), tide_comm_last_error(comm));   \
      exit(1);                                                                                            \
    }                                                                                                     \
  } while (0)

typedef struct {
  size_t nparams, ntensors;
  int steps, warmup, rounds;
  char optims[128];
} options_t;

static void usage(void) {
  fprintf(stderr, "usage: tiderun -np N pto_bench [--params N] [--tensors T] [--optims a,b] [--steps S] "
                  "[--warmup W] [--rounds R]\n");
  exit(2);
}

static void parse(int argc, char **argv, options_t *o) {
  *o = (options_t){25000000, 1, 10, 2, 3, "lamb,adam"};
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc) usage();
    const char *k = argv[i], *v = argv[++i];
    if (strcmp(k, "--params") == 0) o->nparams = (size_t)atof(v);
    else if (strcmp(k, "--tensors") == 0) o->ntensors = (size_t)atol(v);
    else if (strcmp(k, "--optims") == 0) snprintf(o->optims, sizeof o->optims, "%s", v);
    else if (strcmp(k, "--steps") == 0) o->steps = atoi(v);
    else if (strcmp(k, "--warmup") == 0) o->warmup = atoi(v);
    else if (strcmp(k, "--rounds") == 0) o->rounds = atoi(v);
    else usage();
  }
  if (o->nparams < 1 || o->nparams >= ((size_t)1 << 31) || o->ntensors < 1 || o->ntensors > o->nparams ||
      o->steps < 1 || o->warmup < 0 || o->rounds < 1)
    usage();
}

/* One mode for one round: exchange, optimizer and step seconds (median
 * over the steps, slowest rank) and this rank's optimizer state bytes. */
static void measure(tide_comm_t *comm, const options_t *o, tide_optim_kind_t kind, int pto, float *params,
                    float *grads, const tide_tensor_t *tensors, double out[3], size_t *state_bytes) {
  int ranks = tide_comm_size(comm);
  for (size_t i = 0; i < o->nparams; i++) params[i] = (float)((int)(i % 17) - 8) * 0.01f;
  tide_trainer_config_t c;
  tide_trainer_config_default(&c);
  c.dataset_size = (uint64_t)ranks * 1000000;
  c.batch = 1;
  c.epochs = 1;
  c.pto = pto;
  tide_optim_config_default(kind, &c.optim);
  c.schedule.base_lr = 0.001f;
  tide_trainer_t *tr;
  CHECK(tide_trainer_create(comm, &c, params, grads, o->nparams, tensors, o->ntensors, &tr), "trainer");
  *state_bytes = tide_trainer_optim_bytes(tr);
  int n = o->steps;
  double *ex = malloc((size_t)n * 3 * sizeof *ex), *op = ex + n, *st = op + n;
  for (int step = 0; step < o->warmup + n; step++) {
    tide_batch_t b;
    tide_step_stats_t s;
    CHECK(tide_trainer_next(tr, &b), "next");
    CHECK(tide_trainer_step(tr, 1.0, &s), "step");
    if (step >= o->warmup) {
      ex[step - o->warmup] = s.exchange_s;
      op[step - o->warmup] = s.optim_s;
      st[step - o->warmup] = s.step_s;
    }
  }
  out[0] = median(ex, n);
  out[1] = median(op, n);
  out[2] = median(st, n);
  CHECK(tide_allreduce(comm, out, out, 3, TIDE_F64, TIDE_MAX), "allreduce of the timings");
  free(ex);
  tide_trainer_destroy(tr);
}

int main(int argc, char **argv) {
  options_t o;
  parse(argc, argv, &o);
  tide_comm_t *comm;
  int rc = tide_comm_init(&comm);
  if (rc != 0) {
    fprintf(stderr, "pto_bench: tide_comm_init: %s (run under tiderun)\n", tide_strerror(rc));
    return 1;
  }
  int rank = tide_comm_rank(comm), ranks = tide_comm_size(comm);
  float *params = malloc(o.nparams * sizeof *params), *grads = malloc(o.nparams * sizeof *grads);
  tide_tensor_t *tensors = calloc(o.ntensors, sizeof *tensors);
  char(*names)[32] = calloc(o.ntensors, sizeof *names);
  if (params == NULL || grads == NULL || tensors == NULL || names == NULL) {
    fprintf(stderr, "pto_bench: out of memory for %zu parameters\n", o.nparams);
    return 1;
  }
  /* 2-D tensors (1 x count): LARS and LAMB give each a trust ratio. */
  for (size_t t = 0, at = 0; t < o.ntensors; t++) {
    size_t count = o.nparams / o.ntensors + (t < o.nparams % o.ntensors);
    snprintf(names[t], sizeof names[t], "layer%zu.weight", t);
    tensors[t] = (tide_tensor_t){names[t], at, count, 2, {1, (int)count}};
    at += count;
  }
  unsigned seed = 12345u + 7919u * (unsigned)rank;
  for (size_t i = 0; i < o.nparams; i++) {
    seed = seed * 1664525u + 1013904223u;
    grads[i] = (float)((int)(seed >> 20) - 2048) * 1e-5f;
  }
  double results[8][2][3];
  size_t bytes[8][2];
  const char *names_k[8];
  int nk = 0;
  char list[128];
  snprintf(list, sizeof list, "%s", o.optims);
  for (char *save = NULL, *name = strtok_r(list, ",", &save); name != NULL && nk < 8;
       name = strtok_r(NULL, ",", &save)) {
    tide_optim_kind_t kind;
    if (tide_optim_parse(name, &kind) != 0) {
      fprintf(stderr, "pto_bench: unknown optimizer %s\n", name);
      return 2;
    }
    names_k[nk] = tide_optim_name(kind);
    double *per[2][3];
    for (int m = 0; m < 2; m++)
      for (int f = 0; f < 3; f++) per[m][f] = malloc((size_t)o.rounds * sizeof(double));
    for (int r = 0; r < o.rounds; r++) {
      for (int i = 0; i < 2; i++) {
        int pto = (r % 2) ^ i; /* alternate which mode goes first */
        double t[3];
        size_t sb;
        measure(comm, &o, kind, pto, params, grads, tensors, t, &sb);
        for (int f = 0; f < 3; f++) per[pto][f][r] = t[f];
        bytes[nk][pto] = sb;
        if (rank == 0)
          printf("{\"bench\":\"pto\",\"optim\":\"%s\",\"mode\":\"%s\",\"round\":%d,\"ranks\":%d,\"params\":%zu,"
                 "\"tensors\":%zu,\"exchange_s\":%.6f,\"optim_s\":%.6f,\"step_s\":%.6f,\"state_bytes_per_rank\":%zu}\n",
                 names_k[nk], pto ? "pto" : "replicated", r, ranks, o.nparams, o.ntensors, t[0], t[1], t[2], sb);
      }
    }
    for (int m = 0; m < 2; m++)
      for (int f = 0; f < 3; f++) {
        results[nk][m][f] = median(per[m][f], o.rounds);
        free(per[m][f]);
      }
    nk++;
  }
  if (rank == 0) {
    printf("\n%d ranks, %zu parameters in %zu tensor(s); seconds per step, medians (slowest rank):\n\n", ranks,
           o.nparams, o.ntensors);
    printf("| optimizer | mode | exchange s | optimizer s | step s | optimizer state per rank (MB) |\n");
    printf("|---|---|---|---|---|---|\n");
    for (int k = 0; k < nk; k++) {
      for (int m = 0; m < 2; m++)
        printf("| %s | %s | %.4f | %.4f | %.4f | %.1f |\n", names_k[k], m ? "PTO" : "replicated",
               results[k][m][0], results[k][m][1], results[k][m][2], (double)bytes[k][m] / 1e6);
      printf("| %s | replicated / PTO | %.2fx | **%.2fx** | **%.2fx** | %.2fx |\n", names_k[k],
             results[k][0][0] / results[k][1][0], results[k][0][1] / results[k][1][1],
             results[k][0][2] / results[k][1][2], (double)bytes[k][0] / (double)bytes[k][1]);
    }
  }
  free(params);
  free(grads);
  free(tensors);
  free(names);
  tide_comm_destroy(comm);
  return 0;
}
