/* tide-train: data-parallel training of a small model on Fashion-MNIST,
 * started under tiderun. Every rank computes the gradient of its shard of
 * the batch; one allreduce sums gradients, sample counts and losses; every
 * rank applies the same optimizer step, so replicas stay identical (checked
 * at the end). Rank 0 shows progress and writes runs/<name>/. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nn/nn.h"
#include "tide.h"

typedef struct {
  const char *model, *optim, *schedule, *grad, *name, *data, *runs;
  int epochs, batch, threads, subset, warmup_epochs, sparse_warmup_epochs;
  double lr, momentum, weight_decay, final_lr; /* momentum < 0: the optimizer's default */
  int eval_every;         /* steps between test evaluations; 0 = at epoch ends only */
  double target_accuracy; /* 0 = none */
  int sparse;     /* 0 dense, 1 topk (TopK-AllGather), 2 hitopk (HiTopKComm) */
  double density; /* of the sparse modes */
  const char *selector;
  uint64_t seed;
} options_t;

static void usage(FILE *out) {
  fprintf(out,
          "usage: tiderun -np N tide-train [options]\n"
          "  --model mlp|cnn          model (default mlp)\n"
          "  --epochs N               epochs (default 5)\n"
          "  --batch B                batch per worker (default 64)\n"
          "  --optim NAME             sgd, momentum, nesterov, adam, adamw, lars, lamb (default momentum)\n"
          "  --lr X                   base learning rate (default 0.05; scaled by nothing: give the\n"
          "                           rate for the global batch)\n"
          "  --momentum X             momentum of momentum, nesterov and lars (default: the\n"
          "                           optimizer's, 0.9)\n"
          "  --weight-decay X         weight decay (default 0.0005)\n"
          "  --schedule NAME          constant, step, cosine, poly (default cosine)\n"
          "  --warmup-epochs N        linear warm-up epochs (default 0)\n"
          "  --grad MODE              gradient exchange: dense (allreduce, the default), topk:RHO\n"
          "                           (TopK-AllGather of the top RHO of the gradient, with error\n"
          "                           feedback) or hitopk:RHO (hierarchical top-k, HiTopKComm)\n"
          "  --selector NAME          top-k selector: sampled (default), mstopk, exact, randomk\n"
          "  --sparse-warmup-epochs N density warm-up (DGC): epoch e < N uses RHO^((e+1)/(N+1))\n"
          "                           (default 1)\n"
          "  --eval-every N           also evaluate the test set every N steps, not only at epoch ends\n"
          "                           (default 0: epoch ends only); each evaluation is a line in\n"
          "                           metrics.jsonl, its time_s counted from the start of training\n"
          "  --target-accuracy X      record in summary.json the time at which test accuracy first\n"
          "                           reached X (a fraction, e.g. 0.85), at any evaluation\n"
          "  --seed N                 seed for initialisation and shuffling (default 1)\n"
          "  --name NAME              run name: writes runs/NAME/ (default: model-np-time)\n"
          "  --runs DIR               where runs go (default runs)\n"
          "  --data DIR               Fashion-MNIST directory (default /usr/share/datasets/fashion-mnist)\n"
          "  --subset N               train on the first N training images only (tests)\n"
          "  --threads T              compute threads per worker (default: cores / local workers)\n");
}

static int parse_int(const char *opt, const char *text, int min, int *out) {
  char *end;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || *end || end == text || v < min || v > 1 << 30) {
    fprintf(stderr, "tide-train: %s must be an integer >= %d, got \"%s\"\n", opt, min, text);
    return -1;
  }
  *out = (int)v;
  return 0;
}

static int parse_double(const char *opt, const char *text, double *out) {
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (errno || *end || end == text || !isfinite(v) || v < 0) {
    fprintf(stderr, "tide-train: %s must be a non-negative number, got \"%s\"\n", opt, text);
    return -1;
  }
  *out = v;
  return 0;
}

/* A number in (0, 1]: an accuracy, never a percentage. */
static int parse_fraction(const char *opt, const char *text, double *out) {
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (errno || *end || end == text || !(v > 0 && v <= 1)) {
    fprintf(stderr, "tide-train: %s must be a fraction in (0, 1], e.g. 0.85 for 85%%, got \"%s\"\n", opt, text);
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_options(int argc, char **argv, options_t *o) {
  *o = (options_t){"mlp", "momentum", "cosine", "dense", NULL, NULL, "runs", 5, 64, 0, 0, 0, 1,
                   0.05, -1.0, 5e-4, 0.0, 0, 0.0, 0, 1.0, "sampled", 1};
  static const struct option longs[] = {
      {"model", 1, 0, 'm'},   {"epochs", 1, 0, 'e'},   {"batch", 1, 0, 'b'},         {"optim", 1, 0, 'o'},
      {"lr", 1, 0, 'l'},      {"momentum", 1, 0, 'M'}, {"weight-decay", 1, 0, 'w'},  {"schedule", 1, 0, 's'},
      {"grad", 1, 0, 'g'},    {"seed", 1, 0, 'S'},     {"name", 1, 0, 'n'},          {"runs", 1, 0, 'r'},
      {"data", 1, 0, 'd'},    {"subset", 1, 0, 'u'},   {"threads", 1, 0, 't'},       {"warmup-epochs", 1, 0, 'W'},
      {"selector", 1, 0, 'K'}, {"sparse-warmup-epochs", 1, 0, 'P'}, {"eval-every", 1, 0, 'E'},
      {"target-accuracy", 1, 0, 'A'},
      {"help", 0, 0, 'h'},    {0, 0, 0, 0}};
  int c, seed;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
    switch (c) {
      case 'm': o->model = optarg; break;
      case 'e': if (parse_int("--epochs", optarg, 1, &o->epochs)) return -1; break;
      case 'b': if (parse_int("--batch", optarg, 1, &o->batch)) return -1; break;
      case 'o': o->optim = optarg; break;
      case 'l': if (parse_double("--lr", optarg, &o->lr)) return -1; break;
      case 'M': if (parse_double("--momentum", optarg, &o->momentum)) return -1; break;
      case 'w': if (parse_double("--weight-decay", optarg, &o->weight_decay)) return -1; break;
      case 's': o->schedule = optarg; break;
      case 'g': o->grad = optarg; break;
      case 'S': if (parse_int("--seed", optarg, 0, &seed)) return -1; o->seed = (uint64_t)seed; break;
      case 'n': o->name = optarg; break;
      case 'r': o->runs = optarg; break;
      case 'd': o->data = optarg; break;
      case 'u': if (parse_int("--subset", optarg, 1, &o->subset)) return -1; break;
      case 't': if (parse_int("--threads", optarg, 1, &o->threads)) return -1; break;
      case 'W': if (parse_int("--warmup-epochs", optarg, 0, &o->warmup_epochs)) return -1; break;
      case 'K': o->selector = optarg; break;
      case 'P': if (parse_int("--sparse-warmup-epochs", optarg, 0, &o->sparse_warmup_epochs)) return -1; break;
      case 'E': if (parse_int("--eval-every", optarg, 0, &o->eval_every)) return -1; break;
      case 'A': if (parse_fraction("--target-accuracy", optarg, &o->target_accuracy)) return -1; break;
      case 'h': usage(stdout); exit(0);
      default:
        fprintf(stderr, "tide-train: unknown or incomplete option \"%s\"\n", argv[optind - 1]);
        usage(stderr);
        return -1;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "tide-train: unexpected argument \"%s\"\n", argv[optind]);
    return -1;
  }
  if (strcmp(o->model, "mlp") != 0 && strcmp(o->model, "cnn") != 0) {
    fprintf(stderr, "tide-train: --model must be mlp or cnn, got \"%s\"\n", o->model);
    return -1;
  }
  if (strcmp(o->grad, "dense") != 0) {
    const char *colon = strchr(o->grad, ':');
    char *end = NULL;
    if (colon != NULL) o->density = strtod(colon + 1, &end);
    if (strncmp(o->grad, "topk:", 5) == 0)
      o->sparse = 1;
    else if (strncmp(o->grad, "hitopk:", 7) == 0)
      o->sparse = 2;
    if (o->sparse == 0 || end == NULL || *end != '\0' || !(o->density > 0 && o->density <= 1)) {
      fprintf(stderr, "tide-train: --grad must be dense, topk:RHO or hitopk:RHO with 0 < RHO <= 1, got \"%s\"\n",
              o->grad);
      return -1;
    }
  }
  tide_topk_kind_t kind;
  if (tide_topk_parse(o->selector, &kind) != 0) {
    fprintf(stderr, "tide-train: --selector must be sampled, mstopk, exact or randomk, got \"%s\"\n", o->selector);
    return -1;
  }
  if (o->warmup_epochs >= o->epochs && o->warmup_epochs > 0) {
    fprintf(stderr, "tide-train: --warmup-epochs (%d) must be less than --epochs (%d)\n", o->warmup_epochs,
            o->epochs);
    return -1;
  }
  return 0;
}

/* DGC's density warm-up: epoch e < N sends RHO^((e+1)/(N+1)) of the
 * gradient, falling to RHO. */
static double sparse_density(const options_t *o, int epoch) {
  if (epoch >= o->sparse_warmup_epochs) return o->density;
  return pow(o->density, (epoch + 1.0) / (o->sparse_warmup_epochs + 1.0));
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* 64-bit FNV-1a of the parameters' bytes: equal on every rank or the
 * replicas have drifted. */
static uint64_t checksum(const float *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n * sizeof *p; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static int mkdirs(const char *path) {
  char tmp[1024];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      mkdir(tmp, 0755);
      *p = '/';
    }
  return mkdir(tmp, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

#define FAIL(comm, rc, what)                                                                          \
  do {                                                                                              \
    fprintf(stderr, "tide-train: rank %d: %s failed: %s %s\n", rank, what, tide_strerror(rc),        \
            tide_comm_last_error(comm));                                                            \
    exit(1);                                                                                        \
  } while (0)

/* Test loss and accuracy of the current parameters: each rank evaluates its
 * stride of the test set and one allreduce sums the results, so every rank
 * gets the same figures. Collective: every rank calls it at the same step. */
static void evaluate(tide_comm_t *comm, nn_model_t *model, nn_dataset_t *test, double *loss_out,
                     double *accuracy_out) {
  int rc, rank = tide_comm_rank(comm), size = tide_comm_size(comm);
  size_t n_test = nn_dataset_count(test), per = (n_test + (size_t)size - 1) / (size_t)size;
  size_t from = (size_t)rank * per, to = from + per < n_test ? from + per : n_test;
  float loss = 0;
  int correct = 0;
  if (to > from &&
      (rc = nn_evaluate(model, nn_dataset_images(test) + from * 784, nn_dataset_labels(test) + from, (int)(to - from),
                        &loss, &correct)) != 0)
    FAIL(comm, rc, "evaluation");
  double sums[3] = {(double)loss * (double)(to > from ? to - from : 0), correct, (double)(to > from ? to - from : 0)};
  if ((rc = tide_allreduce(comm, sums, sums, 3, TIDE_F64, TIDE_SUM)) != 0) FAIL(comm, rc, "evaluation allreduce");
  *loss_out = sums[0] / sums[2];
  *accuracy_out = sums[1] / sums[2];
}

/* The first evaluation at which test accuracy reached --target-accuracy
 * (time_s < 0: not yet); eval_s is the part of time_s spent evaluating. */
typedef struct {
  double time_s, eval_s, epoch;
  long step;
} target_t;

static void check_target(const options_t *o, double accuracy, double time_s, double eval_s, long step, double epoch,
                         int rank, target_t *t) {
  if (o->target_accuracy <= 0 || t->time_s >= 0 || accuracy < o->target_accuracy) return;
  t->time_s = time_s;
  t->eval_s = eval_s;
  t->step = step;
  t->epoch = epoch;
  if (rank == 0) {
    printf("target: test accuracy %.2f%% >= %.2f%% after %.1f s (step %ld, epoch %.2f)\n", 100 * accuracy,
           100 * o->target_accuracy, time_s, step, epoch);
    fflush(stdout);
  }
}

int main(int argc, char **argv) {
  options_t o;
  if (parse_options(argc, argv, &o) != 0) return 2;
  tide_comm_t *comm;
  int rc = tide_comm_init(&comm);
  if (rc != 0) {
    fprintf(stderr, "tide-train: cannot join the job: %s\n", tide_strerror(rc));
    return 1;
  }
  int rank = tide_comm_rank(comm), size = tide_comm_size(comm);
  int threads = o.threads;
  if (threads == 0) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threads = (int)(cores / tide_comm_local_size(comm));
    if (threads < 1) threads = 1;
  }
  nn_set_threads(threads);

  nn_dataset_t *train, *test;
  if ((rc = nn_fashion_load(o.data, "train", &train)) != 0 || (rc = nn_fashion_load(o.data, "test", &test)) != 0) {
    fprintf(stderr, "tide-train: rank %d: cannot load Fashion-MNIST: %s\n", rank, tide_strerror(rc));
    tide_comm_destroy(comm);
    return 1;
  }
  size_t n_train = nn_dataset_count(train);
  if (o.subset > 0 && (size_t)o.subset < n_train) n_train = (size_t)o.subset;
  nn_model_t *model;
  if ((rc = nn_model_create(o.model, o.batch, o.seed, &model)) != 0) {
    fprintf(stderr, "tide-train: cannot build model %s: %s\n", o.model, tide_strerror(rc));
    return 1;
  }
  size_t nparams = nn_param_count(model);
  float *params = nn_params(model), *grads = nn_grads(model);
  /* Every rank starts from rank 0's weights. */
  if ((rc = tide_broadcast(comm, params, nparams, TIDE_F32, 0)) != 0) FAIL(comm, rc, "broadcast of the weights");

  tide_optim_config_t config;
  tide_optim_kind_t kind;
  if (tide_optim_parse(o.optim, &kind) != 0) {
    fprintf(stderr, "tide-train: --optim must be sgd, momentum, nesterov, adam, adamw, lars or lamb, got \"%s\"\n",
            o.optim);
    return 2;
  }
  tide_optim_config_default(kind, &config);
  if (o.momentum >= 0) config.momentum = (float)o.momentum; /* else the optimizer's own */
  config.weight_decay = (float)o.weight_decay;
  size_t ntensors;
  const tide_tensor_t *tensors = nn_tensors(model, &ntensors);
  tide_optim_t *optim;
  if ((rc = tide_optim_create(&config, tensors, ntensors, nparams, &optim)) != 0) {
    fprintf(stderr, "tide-train: bad optimizer settings: %s\n", tide_strerror(rc));
    return 2;
  }
  tide_sampler_t *sampler;
  if ((rc = tide_sampler_create(n_train, o.seed, rank, size, &sampler)) != 0) FAIL(comm, rc, "sampler");
  long steps_per_epoch = (long)((tide_sampler_max_count(sampler) + (size_t)o.batch - 1) / (size_t)o.batch);
  /* Sparse modes: a compressor with error feedback over the whole gradient
   * (topk) or over this rank's shard of the host's sum (hitopk). */
  tide_compressor_t *compressor = NULL;
  float *pair_values = NULL;
  uint32_t *pair_indices = NULL;
  if (o.sparse) {
    tide_topk_kind_t selector;
    tide_topk_parse(o.selector, &selector);
    size_t offset = 0, len = nparams;
    if (o.sparse == 2 && (rc = tide_hitopk_shard(comm, nparams, &offset, &len)) != 0) FAIL(comm, rc, "hitopk");
    if ((rc = tide_compressor_create(selector, sparse_density(&o, 0), TIDE_TOPK_GLOBAL, NULL, 0, len, NULL,
                                     &compressor)) != 0)
      FAIL(comm, rc, "compressor");
    pair_values = malloc(len * sizeof *pair_values);
    pair_indices = malloc(len * sizeof *pair_indices);
  }
  tide_lr_schedule_t schedule = {0};
  if (tide_lr_parse(o.schedule, &schedule.kind) != 0) {
    fprintf(stderr, "tide-train: --schedule must be constant, step, cosine or poly, got \"%s\"\n", o.schedule);
    return 2;
  }
  schedule.base_lr = (float)o.lr;
  schedule.warmup_steps = o.warmup_epochs * steps_per_epoch;
  schedule.total_steps = o.epochs * steps_per_epoch;
  schedule.step_size = steps_per_epoch * (o.epochs > 2 ? o.epochs / 3 : 1);
  schedule.gamma = 0.1f;
  schedule.power = 1.0f;
  schedule.final_lr = (float)o.final_lr;

  /* The run's folder and files (rank 0). */
  char name[256], dir[1024], path[1100];
  if (o.name != NULL)
    snprintf(name, sizeof name, "%s", o.name);
  else
    snprintf(name, sizeof name, "%s-np%d-%ld", o.model, size, (long)time(NULL));
  snprintf(dir, sizeof dir, "%s/%s", o.runs, name);
  FILE *metrics = NULL;
  if (rank == 0) {
    if (mkdirs(dir) != 0) {
      fprintf(stderr, "tide-train: cannot create %s: %s\n", dir, strerror(errno));
      return 1;
    }
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    metrics = fopen(path, "w");
    if (metrics == NULL) {
      fprintf(stderr, "tide-train: cannot write %s: %s\n", path, strerror(errno));
      return 1;
    }
    printf("tide-train: %s, %zu parameters, %d workers x batch %d = global batch %d, %s, lr %g (%s), %d epochs "
           "on %zu images\n",
           o.model, nparams, size, o.batch, size * o.batch, o.optim, o.lr, o.schedule, o.epochs, n_train);
    fflush(stdout);
  }
  int tty = rank == 0 && isatty(STDERR_FILENO);

  /* [gradient sum ..., sample count, loss sum]: one allreduce per step. */
  float *exchange = malloc((nparams + 2) * sizeof *exchange);
  float *images = malloc((size_t)o.batch * 784 * sizeof *images);
  int32_t *labels = malloc((size_t)o.batch * sizeof *labels);
  const float *all_images = nn_dataset_images(train);
  const int32_t *all_labels = nn_dataset_labels(train);
  double start = now_s(), compute_total = 0, comm_total = 0, eval_total = 0, last_print = 0;
  long step = 0;
  double test_acc = 0, test_loss = 0;
  target_t target = {-1, 0, 0, 0};
  for (int epoch = 0; epoch < o.epochs; epoch++) {
    tide_sampler_set_epoch(sampler, (uint64_t)epoch);
    if (compressor != NULL) tide_compressor_set_density(compressor, sparse_density(&o, epoch));
    size_t mine;
    const uint64_t *indices = tide_sampler_indices(sampler, &mine);
    for (long s = 0; s < steps_per_epoch; s++, step++) {
      double t0 = now_s();
      size_t first = (size_t)s * (size_t)o.batch;
      int count = first >= mine ? 0 : (int)(mine - first < (size_t)o.batch ? mine - first : (size_t)o.batch);
      for (int i = 0; i < count; i++) {
        uint64_t at = indices[first + (size_t)i];
        memcpy(images + (size_t)i * 784, all_images + at * 784, 784 * sizeof *images);
        labels[i] = all_labels[at];
      }
      float loss = 0;
      if (count > 0) {
        if ((rc = nn_forward_backward(model, images, labels, count, &loss)) != 0) FAIL(comm, rc, "forward/backward");
        for (size_t i = 0; i < nparams; i++) exchange[i] = grads[i] * (float)count;
      } else {
        memset(exchange, 0, nparams * sizeof *exchange);
      }
      exchange[nparams] = (float)count;
      exchange[nparams + 1] = loss * (float)count;
      double t1 = now_s();
      if (o.sparse == 0) {
        if ((rc = tide_allreduce(comm, exchange, exchange, nparams + 2, TIDE_F32, TIDE_SUM)) != 0)
          FAIL(comm, rc, "gradient allreduce");
      } else {
        /* Sample count and loss travel densely; the gradient sparsely, its
         * unsent part kept in the compressor's residual. */
        if ((rc = tide_allreduce(comm, exchange + nparams, exchange + nparams, 2, TIDE_F32, TIDE_SUM)) != 0)
          FAIL(comm, rc, "count allreduce");
        if (o.sparse == 1) {
          size_t k = 0;
          if ((rc = tide_compressor_compress(compressor, exchange, nparams, pair_values, pair_indices, &k)) != 0) {
            fprintf(stderr, "tide-train: rank %d: %s\n", rank, tide_compressor_last_error(compressor));
            FAIL(comm, rc, "top-k selection");
          }
          if ((rc = tide_sparse_allgather(comm, pair_values, pair_indices, k, exchange, nparams, TIDE_SUM)) != 0)
            FAIL(comm, rc, "TopK-AllGather");
        } else if ((rc = tide_hitopk_allreduce(comm, exchange, exchange, nparams, compressor, TIDE_SUM)) != 0) {
          FAIL(comm, rc, "HiTopKComm allreduce");
        }
      }
      double t2 = now_s();
      float total = exchange[nparams], inv = 1.0f / total;
      for (size_t i = 0; i < nparams; i++) exchange[i] *= inv;
      float lr = tide_lr_at(&schedule, step);
      if ((rc = tide_optim_step(optim, params, exchange, lr)) != 0) FAIL(comm, rc, "optimizer step");
      double t3 = now_s();
      compute_total += (t1 - t0) + (t3 - t2);
      comm_total += t2 - t1;
      double elapsed = t3 - start, step_loss = exchange[nparams + 1] / total;
      double ips = (double)total / (t3 - t0);
      if (rank == 0) {
        fprintf(metrics,
                "{\"type\":\"step\",\"step\":%ld,\"epoch\":%d,\"loss\":%.6f,\"lr\":%.6g,\"global_batch\":%d,"
                "\"images_per_s\":%.1f,\"compute_s\":%.6f,\"comm_s\":%.6f,\"time_s\":%.4f}\n",
                step, epoch, step_loss, lr, (int)total, ips, (t1 - t0) + (t3 - t2), t2 - t1, elapsed);
        if (elapsed - last_print > (tty ? 0.2 : 10.0) || s == steps_per_epoch - 1) {
          last_print = elapsed;
          double done = (double)(step + 1) / (double)(o.epochs * steps_per_epoch);
          double eta = elapsed / done - elapsed;
          if (tty) {
            int width = 24, filled = (int)(done * width);
            char bar[32];
            for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
            bar[width] = 0;
            fprintf(stderr, "\r[%s] epoch %d/%d step %ld/%ld loss %.4f %6.0f img/s ETA %3.0fs ", bar, epoch + 1,
                    o.epochs, s + 1, steps_per_epoch, step_loss, (double)step * size * o.batch / elapsed, eta);
          } else {
            fprintf(stderr, "epoch %d/%d step %ld/%ld loss %.4f %.0f img/s elapsed %.0fs ETA %.0fs\n", epoch + 1,
                    o.epochs, s + 1, steps_per_epoch, step_loss, (double)step * size * o.batch / elapsed, elapsed,
                    eta);
          }
        }
      }
      /* --eval-every: the epoch's last step is evaluated below, once. */
      if (o.eval_every > 0 && (step + 1) % o.eval_every == 0 && s < steps_per_epoch - 1) {
        double t4 = now_s();
        evaluate(comm, model, test, &test_loss, &test_acc);
        double t5 = now_s(), epochs_done = epoch + (double)(s + 1) / (double)steps_per_epoch;
        eval_total += t5 - t4;
        if (rank == 0) {
          fprintf(metrics,
                  "{\"type\":\"eval\",\"step\":%ld,\"epoch\":%.4f,\"test_loss\":%.6f,\"test_accuracy\":%.6f,"
                  "\"time_s\":%.4f,\"eval_s\":%.4f}\n",
                  step + 1, epochs_done, test_loss, test_acc, t5 - start, eval_total);
          fflush(metrics);
        }
        check_target(&o, test_acc, t5 - start, eval_total, step + 1, epochs_done, rank, &target);
      }
    }
    double t4 = now_s();
    evaluate(comm, model, test, &test_loss, &test_acc);
    double t5 = now_s();
    eval_total += t5 - t4;
    if (rank == 0) {
      if (tty) fprintf(stderr, "\n");
      printf("epoch %d: test loss %.4f, test accuracy %.2f%% (%.1f s)\n", epoch + 1, test_loss, 100 * test_acc,
             t5 - start);
      fflush(stdout);
      fprintf(metrics,
              "{\"type\":\"epoch\",\"epoch\":%d,\"step\":%ld,\"test_loss\":%.6f,\"test_accuracy\":%.6f,"
              "\"time_s\":%.4f,\"eval_s\":%.4f}\n",
              epoch, step, test_loss, test_acc, t5 - start, eval_total);
      fflush(metrics);
    }
    check_target(&o, test_acc, t5 - start, eval_total, step, epoch + 1.0, rank, &target);
  }
  double wall = now_s() - start;
  /* The replicas must be identical: compare every rank's checksum. */
  uint64_t mine_sum = checksum(params, nparams);
  uint64_t *sums = malloc((size_t)size * sizeof *sums);
  if ((rc = tide_allgather(comm, &mine_sum, sums, 1, TIDE_I64)) != 0) FAIL(comm, rc, "checksum allgather");
  int identical = 1;
  for (int r = 1; r < size; r++)
    if (sums[r] != sums[0]) {
      identical = 0;
      if (rank == 0)
        fprintf(stderr, "tide-train: rank %d's parameters differ from rank 0's (checksum %016llx vs %016llx)\n", r,
                (unsigned long long)sums[r], (unsigned long long)sums[0]);
    }
  if (rank == 0) {
    snprintf(path, sizeof path, "%s/summary.json", dir);
    FILE *summary = fopen(path, "w");
    if (summary != NULL) {
      /* JSON null where there is no target, or it was never reached. */
      char target_json[32] = "null", time_json[32] = "null", eval_json[32] = "null", step_json[32] = "null",
           epoch_json[32] = "null";
      if (o.target_accuracy > 0) snprintf(target_json, sizeof target_json, "%g", o.target_accuracy);
      if (target.time_s >= 0) {
        snprintf(time_json, sizeof time_json, "%.4f", target.time_s);
        snprintf(eval_json, sizeof eval_json, "%.4f", target.eval_s);
        snprintf(step_json, sizeof step_json, "%ld", target.step);
        snprintf(epoch_json, sizeof epoch_json, "%.4f", target.epoch);
      }
      fprintf(summary,
              "{\"name\":\"%s\",\"model\":\"%s\",\"workers\":%d,\"batch_per_worker\":%d,\"global_batch\":%d,"
              "\"optimizer\":\"%s\",\"lr\":%g,\"schedule\":\"%s\",\"epochs\":%d,\"train_images\":%zu,"
              "\"parameters\":%zu,\"grad\":\"%s\",\"selector\":\"%s\",\"sparse_warmup_epochs\":%d,\"seed\":%llu,"
              "\"eval_every\":%d,\"wall_s\":%.3f,\"compute_s\":%.3f,\"comm_s\":%.3f,\"eval_s\":%.3f,"
              "\"images_per_s\":%.1f,\"final_test_loss\":%.6f,\"final_test_accuracy\":%.6f,"
              "\"target_accuracy\":%s,\"time_to_target_s\":%s,\"eval_s_to_target\":%s,\"step_to_target\":%s,"
              "\"epoch_to_target\":%s,\"replicas_identical\":%s,\"checksum\":\"%016llx\"}\n",
              name, o.model, size, o.batch, size * o.batch, o.optim, o.lr, o.schedule, o.epochs, n_train, nparams,
              o.grad, o.selector, o.sparse_warmup_epochs, (unsigned long long)o.seed, o.eval_every, wall,
              compute_total, comm_total, eval_total, (double)n_train * o.epochs / wall, test_loss, test_acc,
              target_json, time_json, eval_json, step_json, epoch_json, identical ? "true" : "false",
              (unsigned long long)sums[0]);
      fclose(summary);
    }
    fclose(metrics);
    printf("final test accuracy %.2f%% after %d epochs in %.1f s; replicas identical: %s\nrun written to %s/\n",
           100 * test_acc, o.epochs, wall, identical ? "yes" : "NO", dir);
  }
  free(sums);
  free(exchange);
  free(images);
  free(labels);
  tide_sampler_destroy(sampler);
  tide_compressor_destroy(compressor);
  free(pair_values);
  free(pair_indices);
  tide_optim_destroy(optim);
  nn_model_destroy(model);
  nn_dataset_free(train);
  nn_dataset_free(test);
  tide_comm_destroy(comm);
  return identical ? 0 : 1;
}
