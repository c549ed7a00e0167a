/* tide-train: data-parallel training of a small model on Fashion-MNIST,
 * started under tiderun. The library's trainer (tide_trainer_*, src/train)
 * owns the step: which samples each rank takes, the gradient exchange, the
 * monitor and the policies (--adapt), and the optimizer. This program
 * loads the data, runs the model's forward/backward, evaluates and logs.
 * Rank 0 shows progress and writes runs/<name>/. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tide_nn.h"
#include "tide.h"
#include "tide-train-plan.h"

typedef struct {
  const char *model, *optim, *schedule, *grad, *name, *data, *runs, *adapt, *selector, *kfac;
  const char *cache_dir, *on_bad_sample; /* the data loader (--data DIR|URL|fashion-mnist) */
  int epochs, batch, max_batch, threads, subset, warmup_epochs, sparse_warmup_epochs, eval_every, save_params;
  int pto; /* --pto */
  int elastic; /* --elastic: survive failures and resizes (docs/elastic.md) */
  long base_batch;        /* 0: workers x batch */
  double lr, momentum, weight_decay, final_lr; /* momentum < 0: the optimizer's default */
  double target_accuracy; /* 0 = none */
  int stop_at_target;
  double gns_decay;
  tide_exchange_t exchange;
  double density; /* of the sparse exchanges */
  uint64_t seed;
  const char *plan; /* --plan FILE: burst-parallel (tide-train-plan.c) */
} options_t;

static void usage(FILE *out) {
  fprintf(out,
          "usage: tiderun -np N tide-train [options]\n"
          "  --model mlp|cnn          model (default mlp)\n"
          "  --epochs N               training length in epochs of progress at the base batch\n"
          "                           (default 5; with --adapt adascale a step counts for its gain)\n"
          "  --batch B                batch per worker at the start (default 64)\n"
          "  --max-batch B            largest batch per worker in one forward/backward pass; larger\n"
          "                           shares of a step accumulate gradients (default: --batch, or\n"
          "                           256 when --adapt changes the batch)\n"
          "  --base-batch M           global batch the learning rate and schedule were tuned for\n"
          "                           (default: workers x --batch); AdaScale scales from it\n"
          "  --optim NAME             sgd, momentum, nesterov, adam, adamw, lars, lamb, or kfac: momentum\n"
          "                           on K-FAC-preconditioned gradients (default momentum)\n"
          "  --kfac OPTS              K-FAC options, key=value,...: factor_every (10), inverse_every (50),\n"
          "                           damping (0.001), factor_decay (0.95), kl_clip (0.001), distribute (1),\n"
          "                           spread (0), sample (0.25 of the factor rows), max_dim (0; N: wider layers\n"
          "                           are not preconditioned), diag_dim (0; N: a wider A is\n"
          "                           replaced by its diagonal), lowrank_dim (200; N: a wider factor keeps\n"
          "                           its top lowrank (64) eigenpairs), staleness (0; S: steps between an\n"
          "                           inverse step and the use of its decompositions, made meanwhile on a\n"
          "                           background thread; 0: in the step), bucket_kb (0; N: the factor\n"
          "                           allreduce starts per N-KiB bucket during the backward pass; 0: in the\n"
          "                           step), rebalance (1: layer owners reassigned by measured cost at inverse\n"
          "                           steps; 0: by the formula)\n"
          "  --lr X                   base learning rate, for the base batch (default 0.05)\n"
          "  --momentum X             momentum of momentum, nesterov and lars (default: the\n"
          "                           optimizer's, 0.9)\n"
          "  --weight-decay X         weight decay (default 0.0005)\n"
          "  --schedule NAME          constant, step, cosine, poly (default cosine), over progress\n"
          "  --warmup-epochs N        linear warm-up epochs (default 0)\n"
          "  --grad MODE              gradient exchange: dense (allreduce, the default), topk:RHO\n"
          "                           (TopK-AllGather of the top RHO of the gradient, with error\n"
          "                           feedback), hitopk:RHO (hierarchical top-k, HiTopKComm) or\n"
          "                           adasum (each rank steps its optimizer, Adasum combines the updates)\n"
          "  --pto                    parallel tensor operation: each worker updates 1/N of the\n"
          "                           parameters and keeps optimizer state for it, then the\n"
          "                           parameters are all-gathered (dense, topk, hitopk)\n"
          "  --selector NAME          top-k selector: sampled (default), mstopk, exact, randomk\n"
          "  --sparse-warmup-epochs N density warm-up (DGC): epoch e < N uses RHO^((e+1)/(N+1))\n"
          "                           (default 1)\n"
          "  --adapt LIST             adaptation policies, comma-separated, each NAME or\n"
          "                           NAME:key=value:...: adascale, gns, pollux, exchange, autoscale\n"
          "                           (docs/adaptation.md); e.g. --adapt gns,adascale\n"
          "  --gns-decay X            the noise-scale averages' factor per base-batch step (default 0.95)\n"
          "  --eval-every N           also evaluate the test set every N steps, not only at epoch ends\n"
          "                           (default 0: epoch ends only); each evaluation is a line in\n"
          "                           metrics.jsonl, its time_s counted from the start of training\n"
          "  --target-accuracy X      record in summary.json the time at which test accuracy first\n"
          "                           reached X (a fraction, e.g. 0.85), at any evaluation\n"
          "  --stop-at-target         end the run at the evaluation that reaches --target-accuracy\n"
          "  --elastic                an elastic job (tiderun --elastic): go on after a worker fails, take\n"
          "                           workers that join, leave when released (docs/elastic.md);\n"
          "                           implied by TIDE_ELASTIC=1, which tiderun --elastic sets\n"
          "  --save-params[=K]        at each data-epoch end write the parameters (float32) to\n"
          "                           runs/NAME/params-epochE.bin, their tensors to tensors.json;\n"
          "                           with K, also after each of the epoch's last K steps\n"
          "                           (params-epochE-stepS.bin; test/gns_torch_ref.py)\n"
          "  --seed N                 seed for initialisation and shuffling (default 1)\n"
          "  --name NAME              run name: writes runs/NAME/ (default: model-np-time)\n"
          "  --runs DIR               where runs go (default runs)\n"
          "  --data DIR|URL|fashion-mnist\n"
          "                           training data: a Fashion-MNIST idx directory (read whole, the\n"
          "                           default /usr/share/datasets/fashion-mnist); or, through tide's\n"
          "                           data loader (docs/data.md), an ImageFolder directory of 28x28\n"
          "                           images in 10 classes (tide data export fashion-mnist DIR), the\n"
          "                           same behind an http(s):// URL, or fashion-mnist (its idx files)\n"
          "  --cache-dir PATH         the loader's disk cache (default TIDE_DATA_CACHE; none: off)\n"
          "  --on-bad-sample fail|skip  a corrupt image stops training (default) or is skipped\n"
          "  --subset N               train on the first N training images only (tests)\n"
          "  --threads T              compute threads per worker (default: the worker's share of the\n"
          "                           cores, tide_compute_threads)\n"
          "  --plan FILE              burst-parallel: each layer on its width of ranks from a tide plan\n"
          "                           file (docs/burst-parallel.md); global batch = workers x --batch,\n"
          "                           constant --lr, Fashion-MNIST's idx files\n");
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
  *o = (options_t){.model = "mlp", .optim = "momentum", .schedule = "cosine", .grad = "dense", .runs = "runs",
                   .selector = "sampled", .epochs = 5, .batch = 64, .sparse_warmup_epochs = 1, .lr = 0.05,
                   .momentum = -1.0, .weight_decay = 5e-4, .gns_decay = 0.95, .density = 1.0, .seed = 1};
  static const struct option longs[] = {
      {"model", 1, 0, 'm'},    {"epochs", 1, 0, 'e'},   {"batch", 1, 0, 'b'},        {"optim", 1, 0, 'o'},
      {"lr", 1, 0, 'l'},       {"momentum", 1, 0, 'M'}, {"weight-decay", 1, 0, 'w'}, {"schedule", 1, 0, 's'},
      {"grad", 1, 0, 'g'},     {"seed", 1, 0, 'S'},     {"name", 1, 0, 'n'},         {"runs", 1, 0, 'r'},
      {"data", 1, 0, 'd'},     {"subset", 1, 0, 'u'},   {"threads", 1, 0, 't'},      {"warmup-epochs", 1, 0, 'W'},
      {"selector", 1, 0, 'K'}, {"sparse-warmup-epochs", 1, 0, 'P'}, {"eval-every", 1, 0, 'E'},
      {"target-accuracy", 1, 0, 'A'}, {"stop-at-target", 0, 0, 'T'}, {"adapt", 1, 0, 'a'}, {"max-batch", 1, 0, 'B'},
      {"base-batch", 1, 0, 'Z'}, {"gns-decay", 1, 0, 'G'}, {"save-params", 2, 0, 'V'}, {"pto", 0, 0, 'p'},
      {"kfac", 1, 0, 'F'},       {"help", 0, 0, 'h'},
      {"plan", 1, 0, 'Q'},
      {"cache-dir", 1, 0, 'C'}, {"on-bad-sample", 1, 0, 'X'}, {"elastic", 0, 0, 'L'},
      {0, 0, 0, 0}};
  int c, seed, base = 0;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
    switch (c) {
      case 'm': o->model = optarg; break;
      case 'e': if (parse_int("--epochs", optarg, 1, &o->epochs)) return -1; break;
      case 'b': if (parse_int("--batch", optarg, 1, &o->batch)) return -1; break;
      case 'B': if (parse_int("--max-batch", optarg, 1, &o->max_batch)) return -1; break;
      case 'Z': if (parse_int("--base-batch", optarg, 1, &base)) return -1; o->base_batch = base; break;
      case 'o': o->optim = optarg; break;
      case 'l': if (parse_double("--lr", optarg, &o->lr)) return -1; break;
      case 'M': if (parse_double("--momentum", optarg, &o->momentum)) return -1; break;
      case 'w': if (parse_double("--weight-decay", optarg, &o->weight_decay)) return -1; break;
      case 's': o->schedule = optarg; break;
      case 'g': o->grad = optarg; break;
      case 'L': o->elastic = 1; break;
      case 'S': if (parse_int("--seed", optarg, 0, &seed)) return -1; o->seed = (uint64_t)seed; break;
      case 'n': o->name = optarg; break;
      case 'r': o->runs = optarg; break;
      case 'd': o->data = optarg; break;
      case 'C': o->cache_dir = optarg; break;
      case 'X': o->on_bad_sample = optarg; break;
      case 'u': if (parse_int("--subset", optarg, 1, &o->subset)) return -1; break;
      case 't': if (parse_int("--threads", optarg, 1, &o->threads)) return -1; break;
      case 'W': if (parse_int("--warmup-epochs", optarg, 0, &o->warmup_epochs)) return -1; break;
      case 'K': o->selector = optarg; break;
      case 'P': if (parse_int("--sparse-warmup-epochs", optarg, 0, &o->sparse_warmup_epochs)) return -1; break;
      case 'E': if (parse_int("--eval-every", optarg, 0, &o->eval_every)) return -1; break;
      case 'T': o->stop_at_target = 1; break;
      case 'A': if (parse_fraction("--target-accuracy", optarg, &o->target_accuracy)) return -1; break;
      case 'a': o->adapt = optarg; break;
      case 'F': o->kfac = optarg; break;
      case 'V': if (optarg != NULL && parse_int("--save-params", optarg, 1, &o->save_params)) return -1;
                o->save_params = optarg != NULL ? o->save_params + 1 : 1; break;
      case 'p': o->pto = 1; break;
      case 'Q': o->plan = optarg; break;
      case 'G': if (parse_fraction("--gns-decay", optarg, &o->gns_decay) || o->gns_decay >= 1) {
                  fprintf(stderr, "tide-train: --gns-decay must be in (0, 1)\n");
                  return -1;
                }
                break;
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
  /* Started by tiderun --elastic (or srun with TIDE_ELASTIC=1): elastic
   * without being told twice. */
  const char *elastic_env = getenv("TIDE_ELASTIC");
  if (elastic_env != NULL && strcmp(elastic_env, "1") == 0) o->elastic = 1;
  if (strcmp(o->model, "mlp") != 0 && strcmp(o->model, "cnn") != 0) {
    fprintf(stderr, "tide-train: --model must be mlp or cnn, got \"%s\"\n", o->model);
    return -1;
  }
  if (strcmp(o->grad, "adasum") == 0) {
    o->exchange = TIDE_EXCHANGE_ADASUM;
  } else if (strcmp(o->grad, "dense") != 0) {
    const char *colon = strchr(o->grad, ':');
    char *end = NULL, kind[16] = "";
    if (colon != NULL && (size_t)(colon - o->grad) < sizeof kind) {
      memcpy(kind, o->grad, (size_t)(colon - o->grad));
      o->density = strtod(colon + 1, &end);
    }
    if (tide_exchange_parse(kind, &o->exchange) != 0 || o->exchange == TIDE_EXCHANGE_DENSE ||
        o->exchange == TIDE_EXCHANGE_ADASUM || end == NULL ||
        *end != '\0' || !(o->density > 0 && o->density <= 1)) {
      fprintf(stderr, "tide-train: --grad must be dense, adasum, topk:RHO or hitopk:RHO with 0 < RHO <= 1, got \"%s\"\n",
              o->grad);
      return -1;
    }
  }
  if (o->stop_at_target && o->target_accuracy == 0) {
    fprintf(stderr, "tide-train: --stop-at-target needs --target-accuracy X\n");
    return -1;
  }
  if (o->max_batch == 0) o->max_batch = o->adapt != NULL && o->batch < 256 ? 256 : o->batch;
  if (o->max_batch < o->batch) {
    fprintf(stderr, "tide-train: --max-batch (%d) must be at least --batch (%d)\n", o->max_batch, o->batch);
    return -1;
  }
  if (o->warmup_epochs >= o->epochs && o->warmup_epochs > 0) {
    fprintf(stderr, "tide-train: --warmup-epochs (%d) must be less than --epochs (%d)\n", o->warmup_epochs,
            o->epochs);
    return -1;
  }
  return 0;
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

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Everything one run holds; cleaned up by job_close whatever was made. */
typedef struct {
  options_t o;
  tide_comm_t *comm;
  int rank, size;
  nn_dataset_t *train, *test;
  size_t n_train;
  nn_model_t *model;
  tide_trainer_t *trainer;
  tide_loader_t *loader; /* --data DIR|URL|fashion-mnist: the data loader; NULL: job->train */
  int trainer_owns_comm; /* --elastic: job->comm is the trainer's current one */
  double recovered_at;   /* --elastic: wall clock of the last recovery, 0 after the next step */
  long epoch;            /* --elastic: membership epoch of comm */
  float *images;
  int32_t *labels;
  /* rank 0's output */
  char name[256], dir[1024];
  FILE *metrics;
  int tty;
  /* time to --target-accuracy: time_s < 0 until reached */
  double target_time_s, target_eval_s, target_epochs;
  long target_step;
  double start, eval_total, last_print, test_loss, test_acc;
  double flushed_at; /* elapsed seconds at the last flush of the step lines; < 0 before the first */
  double compute_total, comm_total, samples;
  uint64_t epoch_samples; /* --save-params=K: samples of the data epoch so far */
} job_t;

static int fail(job_t *job, int rc, const char *what) {
  const char *detail = job->trainer != NULL ? tide_trainer_last_error(job->trainer) : "";
  if (*detail == 0 && job->comm != NULL) detail = tide_comm_last_error(job->comm);
  fprintf(stderr, "tide-train: rank %d: %s failed: %s%s%s\n", job->rank, what, tide_strerror(rc), *detail ? ": " : "",
          detail);
  return 1;
}

static void job_close(job_t *job) {
  if (job->metrics != NULL) fclose(job->metrics);
  free(job->images);
  free(job->labels);
  tide_loader_close(job->loader);
  tide_trainer_destroy(job->trainer);
  nn_model_destroy(job->model);
  nn_dataset_free(job->train);
  nn_dataset_free(job->test);
  if (!job->trainer_owns_comm) tide_comm_destroy(job->comm);
}

/* The buffers of one forward/backward pass (--max-batch images). */
static int batch_buffers(job_t *job) {
  job->images = malloc((size_t)job->o.max_batch * NN_IMAGE_SIZE * sizeof *job->images);
  job->labels = malloc((size_t)job->o.max_batch * sizeof *job->labels);
  if (job->images == NULL || job->labels == NULL) {
    fprintf(stderr, "tide-train: rank %d: out of memory for a batch of %d images\n", job->rank, job->o.max_batch);
    return 1;
  }
  return 0;
}

/* --data names something only the loader reads: a URL, fashion-mnist, or
 * a directory without Fashion-MNIST's idx files. */
static int uses_loader(const options_t *o) {
  if (o->data == NULL) return 0;
  if (strcmp(o->data, "fashion-mnist") == 0 || strstr(o->data, "://") != NULL) return 1;
  char path[4096];
  snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", o->data);
  if (access(path, R_OK) == 0) return 0;
  snprintf(path, sizeof path, "%s/train-images-idx3-ubyte", o->data);
  return access(path, R_OK) != 0;
}

/* Loader mode: the training set comes from the loader (opened in build,
 * once the trainer's seed and batch are known); the test set is Fashion-
 * MNIST's, read whole. */
static int join_loader(job_t *job) {
  int rc;
  if (job->o.subset > 0) {
    fprintf(stderr, "tide-train: --subset works with Fashion-MNIST's idx directory only, not --data %s\n", job->o.data);
    return 1;
  }
  if ((rc = nn_fashion_load(NULL, "test", &job->test)) != 0) {
    fprintf(stderr, "tide-train: rank %d: cannot load Fashion-MNIST's test set: %s\n", job->rank, tide_strerror(rc));
    return 1;
  }
  tide_loader_config_t lc;
  tide_loader_config_default(&lc);
  lc.source = job->o.data;
  lc.cache_dir = job->o.cache_dir;
  lc.height = lc.width = NN_IMAGE_SIDE;
  lc.channels = 1;
  lc.batch = job->o.batch; /* a full step's share: batch <= max-batch, so one micro-batch */
  lc.seed = job->o.seed;
  if (job->o.on_bad_sample != NULL && strcmp(job->o.on_bad_sample, "skip") == 0)
    lc.on_bad_sample = TIDE_BAD_SAMPLE_SKIP;
  else if (job->o.on_bad_sample != NULL && strcmp(job->o.on_bad_sample, "fail") != 0) {
    fprintf(stderr, "tide-train: --on-bad-sample must be fail or skip, got \"%s\"\n", job->o.on_bad_sample);
    return 1;
  }
  if ((rc = tide_loader_open(job->comm, &lc, &job->loader)) != 0) {
    fprintf(stderr, "tide-train: rank %d: cannot open the data %s: %s (the log line above says why)\n", job->rank,
            job->o.data, tide_strerror(rc));
    return 1;
  }
  if (tide_loader_classes(job->loader) > NN_CLASSES) {
    fprintf(stderr, "tide-train: %s has %zu classes; the models have %d outputs\n", job->o.data,
            tide_loader_classes(job->loader), NN_CLASSES);
    return 1;
  }
  job->n_train = tide_loader_size(job->loader);
  return batch_buffers(job);
}

static int load_data(job_t *job) {
  int rc;
  if ((rc = nn_fashion_load(job->o.data, "train", &job->train)) != 0 ||
      (rc = nn_fashion_load(job->o.data, "test", &job->test)) != 0) {
    fprintf(stderr, "tide-train: rank %d: cannot load Fashion-MNIST: %s\n", job->rank, tide_strerror(rc));
    return 1;
  }
  return 0;
}

/* The loader's pixels of the trainer's micro-batch as the models' input
 * (normalised as nn_fashion_load does); a skipped bad sample is left out.
 * Returns the samples kept, or a negative TIDE_E*. */
static int loader_batch(job_t *job, const tide_batch_t *batch) {
  tide_loader_batch_t lb;
  int rc = tide_loader_get(job->loader, batch, &lb);
  if (rc != 0) return rc;
  if ((rc = tide_trainer_data_wait(job->trainer, lb.wait_s)) != 0) return rc;
  static float table[256];
  if (table[255] == 0)
    for (int p = 0; p < 256; p++) table[p] = ((float)p / 255.0f - 0.2860f) / 0.3530f;
  int kept = 0;
  for (size_t i = 0; i < lb.count; i++) {
    if (lb.labels[i] < 0) continue;
    const uint8_t *px = lb.pixels + i * lb.sample_bytes;
    float *dst = job->images + (size_t)kept * NN_IMAGE_SIZE;
    for (int p = 0; p < NN_IMAGE_SIZE; p++) dst[p] = table[px[p]];
    job->labels[kept++] = lb.labels[i];
  }
  return kept;
}

/* Joins the job and loads the data; the threads follow the host's share.
 * --elastic loads first: a worker joining a running job must not keep the
 * others waiting in the membership change while it reads the data. */
static int join(job_t *job) {
  if (job->o.elastic && uses_loader(&job->o)) {
    fprintf(stderr, "tide-train: --elastic reads Fashion-MNIST's idx files only: the data loader (--data %s) splits "
            "its store over a fixed membership\n", job->o.data);
    return 1;
  }
  if (job->o.elastic && load_data(job) != 0) return 1;
  int rc = tide_comm_init(&job->comm);
  if (rc == TIDE_ESTATE && job->o.elastic) {
    fprintf(stderr, "tide-train: the elastic job finished before this worker was admitted\n");
    return -1;
  }
  if (rc != 0) {
    fprintf(stderr, "tide-train: cannot join the job: %s\n", tide_strerror(rc));
    return 1;
  }
  job->rank = tide_comm_rank(job->comm);
  job->size = tide_comm_size(job->comm);
  int threads = job->o.threads;
  if (threads == 0 && (rc = tide_compute_threads(job->comm, &threads)) != 0) {
    fprintf(stderr, "tide-train: rank %d: %s\n", job->rank, tide_strerror(rc));
    return 1;
  }
  nn_set_threads(threads);
  if (uses_loader(&job->o)) return join_loader(job);
  if (!job->o.elastic && load_data(job) != 0) return 1;
  job->n_train = nn_dataset_count(job->train);
  if (job->o.subset > 0 && (size_t)job->o.subset < job->n_train) job->n_train = (size_t)job->o.subset;
  return batch_buffers(job);
}

static double wall_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --elastic: the trainer's communicator after a membership change; a
 * worker that became rank 0 takes over the run's metrics. */
static void elastic_sync(job_t *job) {
  if (!job->trainer_owns_comm) return;
  job->comm = tide_trainer_comm(job->trainer);
  if (job->comm == NULL) return;
  job->rank = tide_comm_rank(job->comm);
  job->size = tide_comm_size(job->comm);
  job->epoch = tide_comm_epoch(job->comm);
  if (job->rank == 0 && job->metrics == NULL && job->dir[0] != 0) {
    char path[1100];
    snprintf(path, sizeof path, "%s/metrics.jsonl", job->dir);
    if (mkdirs(job->dir) != 0 || (job->metrics = fopen(path, "a")) == NULL)
      fprintf(stderr, "tide-train: cannot append to %s: %s\n", path, strerror(errno));
  }
}

static void elastic_recovered(job_t *job) {
  elastic_sync(job);
  job->recovered_at = wall_clock();
  if (job->rank == 0)
    fprintf(stderr, "tide-train: elastic: %d worker(s) go on from step %ld (state in place at %.6f)\n", job->size,
          tide_trainer_stats(job->trainer)->step, job->recovered_at);
}

/* The model, every rank starting from rank 0's weights, and the trainer
 * that owns the step. */
static int build(job_t *job) {
  const options_t *o = &job->o;
  int rc;
  if ((rc = nn_model_create(o->model, o->max_batch, o->seed, &job->model)) != 0) {
    fprintf(stderr, "tide-train: cannot build model %s: %s\n", o->model, tide_strerror(rc));
    return 2;
  }
  size_t nparams = nn_param_count(job->model), ntensors;
  const tide_tensor_t *tensors = nn_tensors(job->model, &ntensors);
  /* A worker joining a running job gets the weights with the training state. */
  if (!tide_comm_joined(job->comm) && (rc = tide_broadcast(job->comm, nn_params(job->model), nparams, TIDE_F32, 0)) != 0)
    return fail(job, rc, "broadcast of the weights");

  tide_trainer_config_t c;
  tide_trainer_config_default(&c);
  c.dataset_size = job->n_train;
  c.seed = o->seed;
  c.batch = o->batch;
  c.max_batch = o->max_batch;
  c.base_batch = o->base_batch;
  c.epochs = o->epochs;
  c.exchange = o->exchange;
  c.density = o->density;
  c.sparse_warmup_epochs = o->sparse_warmup_epochs;
  c.gns_decay = o->gns_decay;
  c.pto = o->pto;
  if (tide_topk_parse(o->selector, &c.selector) != 0) {
    fprintf(stderr, "tide-train: --selector must be sampled, mstopk, exact or randomk, got \"%s\"\n", o->selector);
    return 2;
  }
  tide_optim_kind_t kind;
  int kfac = strcmp(o->optim, "kfac") == 0;
  if (kfac) kind = TIDE_OPTIM_MOMENTUM; /* on K-FAC's preconditioned gradients */
  if (!kfac && tide_optim_parse(o->optim, &kind) != 0) {
    fprintf(stderr, "tide-train: --optim must be sgd, momentum, nesterov, adam, adamw, lars, lamb or kfac, got \"%s\"\n",
            o->optim);
    return 2;
  }
  tide_optim_config_default(kind, &c.optim);
  if (o->momentum >= 0) c.optim.momentum = (float)o->momentum; /* else the optimizer's own */
  c.optim.weight_decay = (float)o->weight_decay;
  if (tide_lr_parse(o->schedule, &c.schedule.kind) != 0) {
    fprintf(stderr, "tide-train: --schedule must be constant, step, cosine or poly, got \"%s\"\n", o->schedule);
    return 2;
  }
  /* The schedule counts base-batch steps of progress. */
  long base = o->base_batch;
  if (base == 0 && tide_trainer_base_batch(job->comm, o->batch, &base) != 0) {
    fprintf(stderr, "tide-train: no default base batch (the log line above says why); give --base-batch\n");
    return 2;
  }
  c.base_batch = base;
  if (tide_lr_schedule_from_epochs(c.schedule.kind, (float)o->lr, (float)o->final_lr, o->epochs, o->warmup_epochs,
                                   job->n_train, base, &c.schedule) != 0) {
    fprintf(stderr, "tide-train: bad learning-rate schedule (the log line above names the field)\n");
    return 2;
  }
  if ((rc = tide_trainer_create(job->comm, &c, nn_params(job->model), nn_grads(job->model), nparams, tensors,
                                ntensors, &job->trainer)) != 0) {
    fprintf(stderr, "tide-train: bad training settings: %s (the log line above names the field)\n",
            tide_strerror(rc));
    return 2;
  }
  if (kfac || o->kfac != NULL) {
    tide_kfac_config_t kc;
    tide_kfac_layer_t layers[64];
    tide_kfac_config_default(&kc);
    if (!kfac || (o->kfac != NULL && tide_kfac_config_parse(o->kfac, &kc) != 0) ||
        nn_kfac_layer_count(job->model) > 64 || nn_kfac_layers(job->model, layers) != 0 ||
        (rc = tide_trainer_kfac(job->trainer, &kc, layers, nn_kfac_layer_count(job->model))) != 0) {
      fprintf(stderr, "tide-train: --kfac %s: %s\n", o->kfac ? o->kfac : "",
              kfac ? "bad K-FAC options (the log line above says why)" : "needs --optim kfac");
      return 2;
    }
  }
  if (o->adapt != NULL && (rc = tide_trainer_adapt(job->trainer, o->adapt)) != 0) {
    fprintf(stderr, "tide-train: --adapt %s: %s (the log line above says why)\n", o->adapt, tide_strerror(rc));
    return 2;
  }
  if (o->elastic) {
    if ((rc = tide_trainer_elastic(job->trainer)) != 0) return fail(job, rc, "joining the elastic job");
    job->trainer_owns_comm = 1;
    elastic_sync(job);
  }
  return 0;
}

/* runs/<name>/metrics.jsonl and the banner (rank 0). */
static int open_run(job_t *job) {
  const options_t *o = &job->o;
  if (o->name != NULL)
    snprintf(job->name, sizeof job->name, "%s", o->name);
  else
    snprintf(job->name, sizeof job->name, "%s-np%d-%ld", o->model, job->size, (long)time(NULL));
  snprintf(job->dir, sizeof job->dir, "%s/%s", o->runs, job->name);
  if (job->rank != 0) return 0;
  char path[1100];
  if (mkdirs(job->dir) != 0) {
    fprintf(stderr, "tide-train: cannot create %s: %s\n", job->dir, strerror(errno));
    return 1;
  }
  snprintf(path, sizeof path, "%s/metrics.jsonl", job->dir);
  if ((job->metrics = fopen(path, "w")) == NULL) {
    fprintf(stderr, "tide-train: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  job->tty = isatty(STDERR_FILENO);
  printf("tide-train: %s, %zu parameters, %d workers x batch %d = global batch %d, %s, lr %g (%s), %d epochs "
         "on %zu images%s%s\n",
         o->model, nn_param_count(job->model), job->size, o->batch, job->size * o->batch, o->optim, o->lr,
         o->schedule, o->epochs, job->n_train, o->adapt ? ", adapt " : "", o->adapt ? o->adapt : "");
  fflush(stdout);
  return 0;
}

/* Test loss and accuracy of the current parameters: each rank evaluates its
 * stride of the test set and one allreduce sums the results, so every rank
 * gets the same figures. Collective. */
static int evaluate(job_t *job, const char *type, const tide_step_stats_t *s) {
  double t0 = now_s();
  size_t n_test = nn_dataset_count(job->test), per = (n_test + (size_t)job->size - 1) / (size_t)job->size;
  size_t from = (size_t)job->rank * per, to = from + per < n_test ? from + per : n_test;
  float loss = 0;
  int correct = 0, rc;
  if (to > from && (rc = nn_evaluate(job->model, nn_dataset_images(job->test) + from * NN_IMAGE_SIZE,
                                     nn_dataset_labels(job->test) + from, (int)(to - from), &loss, &correct)) != 0)
    return fail(job, rc, "evaluation");
  double n = to > from ? (double)(to - from) : 0, sums[3] = {(double)loss * n, correct, n};
  /* test_train's hook: TIDE_TRAIN_TEST_KILL_EVAL=R:N makes rank R die
   * (SIGKILL) in its N-th evaluation, before the allreduce. */
  static int evaluations;
  const char *kill_at = getenv("TIDE_TRAIN_TEST_KILL_EVAL");
  int kill_rank, kill_eval;
  if (++evaluations && kill_at != NULL && sscanf(kill_at, "%d:%d", &kill_rank, &kill_eval) == 2 &&
      kill_rank == job->rank && kill_eval == evaluations)
    raise(SIGKILL);
  if ((rc = tide_allreduce(job->comm, sums, sums, 3, TIDE_F64, TIDE_SUM)) != 0) {
    /* A worker died during the evaluation: the survivors (who completed the
     * same step) agree on who is left and evaluate again over the new members. */
    if (!job->o.elastic || (rc = tide_trainer_recover(job->trainer, rc)) != 0)
      return fail(job, rc, "evaluation allreduce");
    elastic_recovered(job);
    if (job->rank == 0) fprintf(stderr, "tide-train: elastic: a worker failed during the evaluation; evaluating again\n");
    job->eval_total += now_s() - t0;
    return evaluate(job, type, s);
  }
  job->test_loss = sums[0] / sums[2];
  job->test_acc = sums[1] / sums[2];
  double t1 = now_s();
  job->eval_total += t1 - t0;
  const options_t *o = &job->o;
  int reached = o->target_accuracy > 0 && job->target_time_s < 0 && job->test_acc >= o->target_accuracy;
  if (reached) {
    job->target_time_s = t1 - job->start;
    job->target_eval_s = job->eval_total;
    job->target_step = s->step;
    job->target_epochs = s->epochs_done;
  }
  if (job->rank != 0) return 0;
  char line[1024];
  tide_metrics_line_t kind = strcmp(type, "eval") == 0    ? TIDE_METRICS_EVAL
                             : strcmp(type, "final") == 0 ? TIDE_METRICS_FINAL
                                                          : TIDE_METRICS_EPOCH;
  if (tide_metrics_eval_line(kind, s, job->test_loss, job->test_acc, t1 - job->start, job->eval_total, line,
                             sizeof line) > 0)
    fputs(line, job->metrics);
  fflush(job->metrics);
  if (strcmp(type, "eval") != 0) {
    if (job->tty) fprintf(stderr, "\n");
    printf("%s %llu (progress %.2f epochs): test loss %.4f, test accuracy %.2f%% (%.1f s)\n",
           strcmp(type, "final") == 0 ? "end, in data epoch" : "epoch", (unsigned long long)s->epoch + 1,
           s->epochs_done, job->test_loss, 100 * job->test_acc, t1 - job->start);
    fflush(stdout);
  }
  if (reached) {
    printf("target: test accuracy %.2f%% >= %.2f%% after %.1f s (step %ld, epoch %.2f)\n", 100 * job->test_acc,
           100 * o->target_accuracy, job->target_time_s, s->step, s->epochs_done);
    fflush(stdout);
  }
  return 0;
}

/* One metrics.jsonl line per step, and the progress line (rank 0). */
static void log_step(job_t *job, const tide_step_stats_t *s) {
  job->compute_total += s->compute_s + s->optim_s;
  job->comm_total += s->exchange_s;
  job->samples += (double)s->global_batch;
  if (job->rank != 0) return;
  double elapsed = now_s() - job->start;
  FILE *f = job->metrics;
  /* The wall clock, to line up two jobs that share hosts (scripts/bench-multiplex.sh).
   * The lines reach the file within 20 ms (the first and an epoch's last at once), so a
   * background job stopped with its foreground keeps its steps and a watcher sees progress,
   * without a write per step: one cost about 1% of a 0.8 ms MLP step. */
  struct timespec wall;
  clock_gettime(CLOCK_REALTIME, &wall);
  char line[1024];
  if (tide_metrics_step_line(s, elapsed, (double)wall.tv_sec + wall.tv_nsec * 1e-9, line, sizeof line) > 0)
    fputs(line, f);
  if (job->flushed_at < 0 || s->epoch_end || elapsed - job->flushed_at >= 0.02) {
    fflush(f);
    job->flushed_at = elapsed;
  }
  if (elapsed - job->last_print < (job->tty ? 0.2 : 10.0) && !s->epoch_end) return;
  job->last_print = elapsed;
  double done = s->epochs_done / job->o.epochs, eta = done > 0 ? elapsed / done - elapsed : 0;
  char bar[32] = "";
  if (job->tty) {
    int width = 24, filled = (int)(done * width);
    for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
    bar[width] = 0;
  }
  fprintf(stderr, "%s%s%sepoch %.2f/%d step %ld loss %.4f batch %ld %6.0f img/s ETA %3.0fs%s", job->tty ? "\r[" : "",
          bar, job->tty ? "] " : "", s->epochs_done, job->o.epochs, s->step, s->loss, s->global_batch, s->throughput,
          eta, job->tty ? " " : "\n");
}

/* --save-params: the parameters after data epoch `epoch` (rank 0), and
 * once the tensors they hold, for reference scripts
 * (test/gns_torch_ref.py). */
static int save_params(job_t *job, uint64_t epoch, long step) {
  if (job->rank != 0) return 0;
  char path[1100];
  size_t ntensors, nparams = nn_param_count(job->model);
  const tide_tensor_t *t = nn_tensors(job->model, &ntensors);
  snprintf(path, sizeof path, "%s/tensors.json", job->dir);
  FILE *f = fopen(path, "w");
  if (f == NULL) goto fail;
  fprintf(f, "{\"arch\":\"%s\",\"tensors\":[", nn_model_arch(job->model));
  for (size_t i = 0; i < ntensors; i++) {
    fprintf(f, "%s{\"name\":\"%s\",\"offset\":%zu,\"count\":%zu,\"shape\":[", i ? "," : "", t[i].name,
            t[i].offset, t[i].count);
    for (int d = 0; d < t[i].ndim; d++) fprintf(f, "%s%d", d ? "," : "", t[i].shape[d]);
    fprintf(f, "]}");
  }
  fprintf(f, "]}\n");
  if (fclose(f) != 0) goto fail;
  if (step < 0)
    snprintf(path, sizeof path, "%s/params-epoch%llu.bin", job->dir, (unsigned long long)epoch + 1);
  else
    snprintf(path, sizeof path, "%s/params-epoch%llu-step%ld.bin", job->dir, (unsigned long long)epoch + 1, step);
  if ((f = fopen(path, "wb")) == NULL) goto fail;
  size_t wrote = fwrite(nn_params(job->model), sizeof(float), nparams, f);
  if (fclose(f) != 0 || wrote != nparams) goto fail;
  return 0;
fail:
  fprintf(stderr, "tide-train: cannot write %s: %s\n", path, strerror(errno));
  return 1;
}

/* K-FAC: the model's hook hands each layer's factor data to the trainer. */
static int kfac_hook(void *trainer, size_t layer, tide_kfac_factor_t factor, const float *x, size_t rows, size_t ld,
                     int transposed, float weight) {
  return tide_trainer_kfac_add(trainer, layer, factor, x, rows, ld, transposed, weight);
}

/* The training loop: the trainer says which samples, this program runs the
 * model on them. */
static int train(job_t *job) {
  const float *all_images = job->train != NULL ? nn_dataset_images(job->train) : NULL;
  const int32_t *all_labels = job->train != NULL ? nn_dataset_labels(job->train) : NULL;
  tide_batch_t batch;
  tide_step_stats_t s = {0};
  int rc;
  job->start = now_s();
  for (;;) {
    rc = tide_trainer_next(job->trainer, &batch);
    if (job->o.elastic && tide_comm_epoch(tide_trainer_comm(job->trainer)) != job->epoch) elastic_recovered(job);
    if (rc != 0 && job->o.elastic && (rc = tide_trainer_recover(job->trainer, rc)) == 0) {
      elastic_recovered(job);
      continue;
    }
    if (rc != 0 || batch.done) break;
    float loss = 0;
    int count = (int)batch.count;
    if (job->loader != NULL) {
      if ((count = loader_batch(job, &batch)) < 0) return fail(job, count, "reading the data");
    } else {
      for (size_t i = 0; i < batch.count; i++) {
        memcpy(job->images + i * NN_IMAGE_SIZE, all_images + batch.indices[i] * NN_IMAGE_SIZE,
               NN_IMAGE_SIZE * sizeof *job->images);
        job->labels[i] = all_labels[batch.indices[i]];
      }
    }
    nn_set_kfac_hook(job->model, tide_trainer_kfac_wanted(job->trainer) ? kfac_hook : NULL, job->trainer);
    if (count > 0 && (rc = nn_forward_backward(job->model, job->images, job->labels, count, &loss)) != 0)
      return fail(job, rc, "forward/backward");
    if ((rc = tide_trainer_step(job->trainer, loss, &s)) != 0) {
      if (!job->o.elastic || (rc = tide_trainer_recover(job->trainer, rc)) != 0) break;
      elastic_recovered(job);
      continue;
    }
    if (!s.stepped) continue;
    if (job->recovered_at > 0) {
      double now = wall_clock(), change = tide_trainer_last_change_s(job->trainer);
      if (job->rank == 0)
        fprintf(stderr, "tide-train: elastic: step %ld, the first on %d worker(s), completed at %.6f: %.3f s after "
                "the change began (%.3f s to rebuild and hand over)\n", s.step, job->size, now,
                now - job->recovered_at + change, change);
      job->recovered_at = 0;
    }
    log_step(job, &s);
    if (s.epoch_end && job->o.save_params && save_params(job, s.epoch, -1) != 0) return 1;
    /* --save-params=K: also the epoch's last K steps (at the current batch) */
    job->epoch_samples = s.epoch_end ? 0 : job->epoch_samples + (uint64_t)s.global_batch;
    if (job->o.save_params > 1 && !s.epoch_end &&
        job->epoch_samples + (uint64_t)(job->o.save_params - 1) * (uint64_t)s.global_batch >= job->n_train &&
        save_params(job, s.epoch, s.step) != 0)
      return 1;
    if (s.epoch_end || s.done) {
      if (evaluate(job, s.epoch_end ? "epoch" : "final", &s) != 0) return 1;
    } else if (job->o.eval_every > 0 && s.step % job->o.eval_every == 0 && evaluate(job, "eval", &s) != 0) {
      return 1;
    }
    if (job->o.stop_at_target && job->target_time_s >= 0) break; /* every rank saw the same accuracy */
  }
  if (rc != 0) return fail(job, rc, "training step");
  return 0;
}

/* Every rank's parameters must be identical; rank 0 writes summary.json. */
static int finish(job_t *job) {
  const options_t *o = &job->o;
  const tide_step_stats_t *s = tide_trainer_stats(job->trainer);
  double wall = now_s() - job->start;
  size_t nparams = nn_param_count(job->model);
  /* Equal on every rank or the replicas have drifted. */
  uint64_t checksum0;
  int differing;
  int rc = tide_replica_checksum(job->comm, nn_params(job->model), nparams * sizeof(float), &checksum0, &differing);
  if (rc != 0) return fail(job, rc, "checksum allgather");
  int identical = differing < 0;
  if (!identical && job->rank == 0)
    fprintf(stderr, "tide-train: rank %d's parameters differ from rank 0's (checksum %016llx)\n", differing,
            (unsigned long long)checksum0);
  if (job->rank != 0) return identical ? 0 : 1;
  char path[1100];
  snprintf(path, sizeof path, "%s/summary.json", job->dir);
  FILE *f = fopen(path, "w");
  if (f == NULL) {
    fprintf(stderr, "tide-train: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  /* JSON null where there is no target, or it was never reached. */
  char target[32] = "null", time_to[32] = "null", eval_to[32] = "null", step_to[32] = "null", epoch_to[32] = "null";
  if (o->target_accuracy > 0) snprintf(target, sizeof target, "%g", o->target_accuracy);
  if (job->target_time_s >= 0) {
    snprintf(time_to, sizeof time_to, "%.4f", job->target_time_s);
    snprintf(eval_to, sizeof eval_to, "%.4f", job->target_eval_s);
    snprintf(step_to, sizeof step_to, "%ld", job->target_step);
    snprintf(epoch_to, sizeof epoch_to, "%.4f", job->target_epochs);
  }
  long base = o->base_batch > 0 ? o->base_batch : (long)o->batch * job->size;
  fprintf(f,
          "{\"name\":\"%s\",\"model\":\"%s\",\"workers\":%d,\"batch_per_worker\":%d,\"global_batch\":%d,"
          "\"base_batch\":%ld,\"final_global_batch\":%ld,\"adapt\":\"%s\",\"optimizer\":\"%s\",\"lr\":%g,"
          "\"schedule\":\"%s\",\"epochs\":%d,\"data_epochs\":%.4f,\"steps\":%ld,\"train_images\":%zu,"
          "\"parameters\":%zu,\"grad\":\"%s\",\"selector\":\"%s\",\"sparse_warmup_epochs\":%d,\"seed\":%llu,"
          "\"eval_every\":%d,\"wall_s\":%.3f,\"compute_s\":%.3f,\"comm_s\":%.3f,\"eval_s\":%.3f,"
          "\"images_per_s\":%.1f,\"final_test_loss\":%.6f,\"final_test_accuracy\":%.6f,"
          "\"target_accuracy\":%s,\"time_to_target_s\":%s,\"eval_s_to_target\":%s,\"step_to_target\":%s,"
          "\"epoch_to_target\":%s,\"replicas_identical\":%s,\"checksum\":\"%016llx\"}\n",
          job->name, o->model, job->size, o->batch, job->size * o->batch, base, s->planned_batch,
          o->adapt ? o->adapt : "", o->optim, o->lr, o->schedule, o->epochs,
          job->samples / (double)job->n_train, s->step, job->n_train, nparams, o->grad, o->selector, o->sparse_warmup_epochs,
          (unsigned long long)o->seed, o->eval_every, wall, job->compute_total, job->comm_total, job->eval_total,
          job->samples / wall, job->test_loss, job->test_acc, target, time_to, eval_to, step_to, epoch_to,
          identical ? "true" : "false", (unsigned long long)checksum0);
  fclose(f);
  printf("final test accuracy %.2f%% after %.2f epochs (%ld steps) in %.1f s; replicas identical: %s\nrun written to "
         "%s/\n",
         100 * job->test_acc, s->epochs_done, s->step, wall, identical ? "yes" : "NO", job->dir);
  return identical ? 0 : 1;
}

/* The first option --plan cannot run with, or NULL. */
static const char *plan_conflict(const options_t *o) {
  if (o->adapt != NULL) return "--adapt";
  if (strcmp(o->grad, "dense") != 0) return "--grad";
  if (o->pto) return "--pto";
  if (o->elastic) return "--elastic";
  if (o->kfac != NULL || strcmp(o->optim, "kfac") == 0) return "K-FAC";
  return NULL;
}

int main(int argc, char **argv) {
  job_t job = {.target_time_s = -1, .flushed_at = -1};
  if (parse_options(argc, argv, &job.o) != 0) return 2;
  int rc = join(&job);
  if (rc == 0 && job.o.plan != NULL) {
    rc = train_plan(job.comm, &(train_plan_args_t){.plan = job.o.plan, .model = job.o.model, .optim = job.o.optim,
                    .batch = job.o.batch, .epochs = job.o.epochs, .subset = job.o.subset, .lr = job.o.lr,
                    .momentum = job.o.momentum, .weight_decay = job.o.weight_decay, .seed = job.o.seed,
                    .conflict = plan_conflict(&job.o)}, job.train, job.test);
    job_close(&job);
    return rc;
  }
  if (rc == 0) rc = build(&job);
  if (rc == 0) rc = open_run(&job);
  if (rc == 0) rc = train(&job);
  if (rc == 0 && job.o.elastic && tide_trainer_detached(job.trainer))
    printf("tide-train: this worker was released from the elastic job\n");
  else if (rc == 0)
    rc = finish(&job);
  job_close(&job);
  return rc < 0 ? 0 : rc; /* < 0: an elastic job that finished before this worker joined */
}
