/* The trainer: one data-parallel step over the caller's flat buffers
 * (docs/adaptation.md, "The step"): deal the data, accumulate micro-batch
 * gradients, exchange them with the statistics, measure, ask the policies,
 * apply the optimizer. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/simd.h"
#include "train/train.h"

static const char *const exchange_names[TIDE_EXCHANGE_COUNT] = {"dense", "topk", "hitopk", "adasum"};

TIDE__NAMED_ENUM(exchange, tide_exchange_t, "gradient exchange", exchange_names, TIDE_EXCHANGE_COUNT)

int tide__trainer_fail(tide_trainer_t *tr, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tr->last_error, sizeof tr->last_error, fmt, ap);
  va_end(ap);
  TIDE_ERROR("trainer: %s", tr->last_error);
  return rc;
}

const char *tide_trainer_last_error(const tide_trainer_t *tr) { return tr != NULL ? tr->last_error : ""; }

void tide_trainer_config_default(tide_trainer_config_t *out) {
  if (out == NULL) return;
  memset(out, 0, sizeof *out);
  out->batch = 64;
  out->max_accum = 16;
  out->epochs = 1;
  tide_optim_config_default(TIDE_OPTIM_MOMENTUM, &out->optim);
  out->schedule.kind = TIDE_LR_CONSTANT;
  out->schedule.base_lr = 0.05f;
  out->exchange = TIDE_EXCHANGE_DENSE;
  out->density = 0.01;
  out->selector = TIDE_TOPK_SAMPLED;
  out->gns_decay = 0.95;
}

static int config_check(const tide_trainer_config_t *c) {
  const char *field = NULL, *why = NULL;
  if (c->dataset_size == 0)
    field = "dataset_size", why = "must be > 0";
  else if (c->batch < 1)
    field = "batch", why = "must be >= 1";
  else if (c->max_batch != 0 && c->max_batch < c->batch)
    field = "max_batch", why = "must be 0 (= batch) or >= batch";
  else if (c->max_accum < 1)
    field = "max_accum", why = "must be >= 1";
  else if (c->base_batch < 0)
    field = "base_batch", why = "must be 0 (batch x ranks) or > 0";
  else if (!(c->epochs > 0 && isfinite(c->epochs)))
    field = "epochs", why = "must be finite and > 0";
  else if ((unsigned)c->exchange >= TIDE_EXCHANGE_COUNT)
    field = "exchange", why = "must be a TIDE_EXCHANGE_* value";
  else if (!(c->density > 0 && c->density <= 1))
    field = "density", why = "must be in (0, 1]";
  else if ((unsigned)c->selector >= TIDE_TOPK_KIND_COUNT)
    field = "selector", why = "must be a TIDE_TOPK_* value";
  else if (!(c->sparse_warmup_epochs >= 0 && isfinite(c->sparse_warmup_epochs)))
    field = "sparse_warmup_epochs", why = "must be finite and >= 0";
  else if (!(c->gns_decay > 0 && c->gns_decay < 1))
    field = "gns_decay", why = "must be in (0, 1)";
  else if (c->tensor_stats != 0 && c->tensor_stats != 1)
    field = "tensor_stats", why = "must be 0 or 1";
  else if (c->pto != 0 && c->pto != 1)
    field = "pto", why = "must be 0 or 1";
  else if (c->pto && !tide__pto_supports(c->exchange))
    field = "pto", why = "works with the dense, topk and hitopk exchanges only";
  if (field != NULL) {
    TIDE_ERROR("tide_trainer_create: config.%s %s", field, why);
    return TIDE_EINVAL;
  }
  TIDE_CHECK(tide_optim_config_check(&c->optim));
  return tide_lr_check(&c->schedule);
}

/* The full-step plan for a global batch: micro-batches of at most
 * max_batch, at most max_accum of them per rank. */
static void plan(tide_trainer_t *tr, long global_batch) {
  long ranks = tr->ranks, max_batch = tr->config.max_batch, max_accum = tr->config.max_accum;
  long local = (global_batch + ranks - 1) / ranks;
  if (local < 1) local = 1;
  if (local > max_batch * max_accum) local = max_batch * max_accum;
  long accum = (local + max_batch - 1) / max_batch;
  /* One rank above the base batch keeps two micro-batches, so that the
   * noise scale still has two gradients to compare (AdaptDL). */
  if (ranks == 1 && global_batch > tr->config.base_batch && accum < 2 && max_accum >= 2 && local >= 2) accum = 2;
  tr->accum = (int)accum;
  tr->batch = (int)((local + accum - 1) / accum);
}

long tide__trainer_planned_batch(const tide_trainer_t *tr) { return (long)tr->ranks * tr->batch * tr->accum; }

void tide_trainer_destroy(tide_trainer_t *tr) {
  if (tr == NULL) return;
  tide__multiplex_close(tr);
  tide__trainer_elastic_fini(tr);
  for (size_t i = 0; i < tr->npolicies; i++)
    if (tr->policies[i].ops.destroy != NULL) tr->policies[i].ops.destroy(tr->policies[i].state);
  tide__free(tr->policies);
  tide__exchange_close_all(tr);
  if (tr->tensors != NULL)
    for (size_t t = 0; t < tr->ntensors; t++) tide__free((char *)tr->tensors[t].name);
  tide__free(tr->tensors);
  tide__kfac_destroy(tr->kfac);
  tide_optim_destroy(tr->optim);
  tide_sampler_destroy(tr->sampler);
  tide__free(tr->exchange_mem);
  tide__step_monitor_fini(&tr->monitor);
  tide__free(tr->pending_residual);
  tide__pto_close(tr);
  tide__free(tr);
}

/* (Re)allocates the exchange buffer for nparams + monitor.nslots floats
 * on a 64-byte boundary, keeping its first `kept` floats. */
static int exchange_alloc(tide_trainer_t *tr, size_t kept) {
  char *mem = tide__malloc((tr->nparams + tr->monitor.nslots) * sizeof(float) + 63);
  if (mem == NULL) return TIDE_ENOMEM;
  float *exchange = (float *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
  if (tr->exchange != NULL) memcpy(exchange, tr->exchange, kept * sizeof *exchange);
  tide__free(tr->exchange_mem);
  tr->exchange_mem = mem;
  tr->exchange = exchange;
  return 0;
}

int tide_trainer_create(tide_comm_t *comm, const tide_trainer_config_t *config, float *params, float *grads,
                        size_t nparams, const tide_tensor_t *tensors, size_t ntensors, tide_trainer_t **out) {
  if (comm == NULL || config == NULL || params == NULL || grads == NULL || out == NULL) {
    TIDE_ERROR("tide_trainer_create: comm, config, params, grads and out must not be NULL");
    return TIDE_EINVAL;
  }
  if (nparams == 0 || nparams > ((size_t)1 << 32) - 1) {
    TIDE_ERROR("tide_trainer_create: nparams is %zu; it must be in [1, 2^32)", nparams);
    return TIDE_EINVAL;
  }
  if (ntensors > 0 && tensors == NULL) {
    TIDE_ERROR("tide_trainer_create: tensors is NULL but ntensors is %zu", ntensors);
    return TIDE_EINVAL;
  }
  TIDE_CHECK(config_check(config));
  tide_trainer_t *tr = tide__calloc(1, sizeof *tr);
  if (tr == NULL) return TIDE_ENOMEM;
  int rc = TIDE_ENOMEM;
  tr->config = *config;
  tr->params = params;
  tr->grads = grads;
  tr->nparams = nparams;
  TIDE_CHECK_GOTO(tide__trainer_bind(tr, comm), rc, fail);
  if (tr->config.max_batch == 0) tr->config.max_batch = tr->config.batch;
  if (tr->config.base_batch == 0) tr->config.base_batch = (long)tr->config.batch * tr->ranks;
  TIDE_CHECK_GOTO(tide__step_monitor_init(&tr->monitor, tr->ranks, ntensors ? ntensors : 1, config->tensor_stats),
                  rc, fail);
  /* The optimizer (a shard under PTO) checks the tiling and names a bad tensor. */
  TIDE_CHECK_GOTO(tide__pto_optim_create(tr, tensors, ntensors), rc, fail);
  tr->ntensors = ntensors ? ntensors : 1;
  tr->tensors = tide__calloc(tr->ntensors, sizeof *tr->tensors);
  if (tr->tensors == NULL) goto fail;
  if (ntensors == 0) {
    tr->tensors[0] = (tide_tensor_t){.name = tide__strdup("params"), .count = nparams, .ndim = 1,
                                     .shape = {(int)nparams}};
  } else {
    for (size_t t = 0; t < ntensors; t++) {
      tr->tensors[t] = tensors[t];
      tr->tensors[t].name = tide__strdup(tensors[t].name != NULL ? tensors[t].name : "tensor");
    }
  }
  for (size_t t = 0; t < tr->ntensors; t++)
    if (tr->tensors[t].name == NULL) goto fail;
  TIDE_CHECK_GOTO(tide_sampler_create(config->dataset_size, config->seed, 0, 1, &tr->sampler), rc, fail);
  if (exchange_alloc(tr, 0) != 0) goto fail;
  plan(tr, (long)config->batch * tr->ranks);
  tr->exchange_kind = config->exchange;
  tr->total_progress = config->epochs * (double)config->dataset_size / (double)tr->config.base_batch;
  tr->last_step_end_ns = tide__now_ns();
  tr->stats = (tide_step_stats_t){.noise_scale = NAN, .grad_sq = NAN, .trace_sigma = NAN, .gain_ratio = 1,
                                  .lr_factor = 1, .comm_share = NAN, .mean_step_s = NAN, .ranks = tr->ranks, .nodes = tr->nodes,
                                  .batch = tr->batch, .accum = tr->accum, .planned_batch = tide__trainer_planned_batch(tr),
                                  .exchange = tr->exchange_kind, .solo_step_s = NAN};
  /* A worker that joined an elastic job agrees in tide_trainer_elastic,
   * with the hand-over, where a member's death is recovered from. */
  if (!tide_comm_joined(comm) && (rc = tide__trainer_agree(tr)) != 0) goto fail;
  if ((rc = tide__multiplex_open(tr)) != 0) goto fail;
  *out = tr;
  return 0;
fail:
  tide_trainer_destroy(tr);
  return rc;
}

int tide__trainer_bind(tide_trainer_t *tr, tide_comm_t *comm) {
  tr->comm = comm;
  tr->rank = tide_comm_rank(comm);
  tr->ranks = tide_comm_size(comm);
  tr->nodes = tide_comm_node_count(comm);
  tr->stats.ranks = tr->ranks;
  tr->stats.nodes = tr->nodes;
  if (tr->exchange == NULL) return 0; /* tide_trainer_create sizes them next */
  size_t kept = tr->nparams + tr->monitor.nslots;
  TIDE_CHECK(tide__step_monitor_resize(&tr->monitor, tr->ranks));
  if (tr->monitor.nslots + tr->nparams < kept) kept = tr->nparams + tr->monitor.nslots;
  return exchange_alloc(tr, kept);
}

void tide__trainer_abandon_step(tide_trainer_t *tr) {
  tr->in_step = 0;
  tr->micro_handed = 0;
  tr->accumulated = 0;
  tide__kfac_abandon(tr->kfac);
  tide__exchange_close_all(tr);
}

int tide__trainer_agree(tide_trainer_t *tr) {
  /* Every rank must run the same plan: a mismatch here is a usage error
   * that would otherwise show up as a hang or silent divergence. */
  double mine[2] = {(double)tr->config.dataset_size, (double)tr->config.base_batch}, agreed[4];
  memcpy(agreed, mine, sizeof mine);
  memcpy(agreed + 2, mine, sizeof mine);
  TIDE_CHECK(tide_allreduce(tr->comm, agreed, agreed, 2, TIDE_F64, TIDE_MIN));
  TIDE_CHECK(tide_allreduce(tr->comm, agreed + 2, agreed + 2, 2, TIDE_F64, TIDE_MAX));
  if (agreed[0] != agreed[2] || agreed[1] != agreed[3]) {
    TIDE_ERROR("tide_trainer_create: ranks disagree on dataset_size (%g..%g) or base_batch (%g..%g): every rank "
               "must pass the same config",
               agreed[0], agreed[2], agreed[1], agreed[3]);
    return TIDE_EINVAL;
  }
  return 0;
}

void tide__trainer_replan(tide_trainer_t *tr, long global_batch) {
  plan(tr, global_batch);
  tr->stats.batch = tr->batch;
  tr->stats.accum = tr->accum;
  tr->stats.planned_batch = tide__trainer_planned_batch(tr);
}

/* Runs one hook of every policy. decide_every > 0 marks a policy that
 * decides locally: its before_step runs every decide_every steps on every
 * rank and rank 0's decision is broadcast. */
enum { HOOK_BEFORE_STEP, HOOK_BEFORE_UPDATE, HOOK_AFTER_EPOCH };

static int run_hooks(tide_trainer_t *tr, int hook, tide_decision_t *d) {
  for (size_t i = 0; i < tr->npolicies; i++) {
    tide__policy_slot_t *p = &tr->policies[i];
    int (*fn)(void *, const tide_step_stats_t *, tide_decision_t *) =
        hook == HOOK_BEFORE_STEP ? p->ops.before_step
        : hook == HOOK_BEFORE_UPDATE ? p->ops.before_update
                                     : p->ops.after_epoch;
    if (fn == NULL) continue;
    int local = p->ops.decide_every > 0 && hook == HOOK_BEFORE_STEP;
    if (local && tr->step % p->ops.decide_every != 0) continue;
    int rc = fn(p->state, &tr->stats, d);
    if (rc != 0) return tide__trainer_fail(tr, rc, "policy %s failed", p->ops.name ? p->ops.name : "?");
    if (local && tr->ranks > 1) {
      double wire[5] = {(double)d->global_batch, d->lr_factor, d->gain, d->exchange, d->world_size};
      if ((rc = tide_broadcast(tr->comm, wire, 5, TIDE_F64, 0)) != 0)
        return tide__trainer_fail(tr, rc, "broadcast of policy %s's decision: %s", p->ops.name,
                                  tide_comm_last_error(tr->comm));
      *d = (tide_decision_t){(long)wire[0], wire[1], wire[2], (int)wire[3], (int)wire[4]};
    }
  }
  return 0;
}

/* Applies the decisions that take effect from the next planned step. */
static int apply(tide_trainer_t *tr, const tide_decision_t *d) {
  if (d->global_batch > 0) {
    plan(tr, d->global_batch);
    tr->stats.batch = tr->batch;
    tr->stats.accum = tr->accum;
    tr->stats.planned_batch = tide__trainer_planned_batch(tr);
  }
  if (d->world_size > 0 && tr->elastic != NULL) tide__trainer_elastic_request(tr, d->world_size);
  if (d->exchange >= 0) {
    if (d->exchange >= TIDE_EXCHANGE_COUNT)
      return tide__trainer_fail(tr, TIDE_EINVAL, "a policy chose exchange %d, not a tide_exchange_t", d->exchange);
    if (tr->config.pto && !tide__pto_supports(d->exchange))
      return tide__trainer_fail(tr, TIDE_EINVAL, "a policy chose exchange %s, which PTO does not run (dense, topk "
                                "and hitopk do)", tide_exchange_name((tide_exchange_t)d->exchange));
    if (tr->kfac != NULL && tide__exchanges[d->exchange].precondition == NULL)
      return tide__trainer_fail(tr, TIDE_EINVAL, "a policy chose the adasum exchange, which K-FAC does not run "
                                "with (it preconditions the averaged gradient)");
    tr->exchange_kind = (tide_exchange_t)d->exchange;
    tr->stats.exchange = tr->exchange_kind;
  }
  return 0;
}

static tide_decision_t unchanged(void) { return (tide_decision_t){0, 0, 0, -1, 0}; }

int tide_trainer_next(tide_trainer_t *tr, tide_batch_t *batch) {
  if (tr == NULL || batch == NULL) {
    TIDE_ERROR("tide_trainer_next: trainer and batch must not be NULL");
    return TIDE_EINVAL;
  }
  if (tr->micro_handed) {
    return tide__trainer_fail(tr, TIDE_ESTATE,
                              "tide_trainer_next called twice: call tide_trainer_step after each micro-batch");
  }
  if (!tr->in_step) {
    if (tr->elastic != NULL && tr->progress < tr->total_progress) TIDE_CHECK(tide__trainer_elastic_boundary(tr));
    if (tr->progress >= tr->total_progress || tr->comm == NULL) {
      if (tr->elastic != NULL) tide__trainer_elastic_done(tr);
      *batch = (tide_batch_t){.done = 1, .step = tr->step, .epoch = tr->epoch};
      return 0;
    }
    if (tr->multiplex != NULL) TIDE_CHECK(tide__multiplex_boundary(tr));
    tide_decision_t d = unchanged();
    TIDE_CHECK(run_hooks(tr, HOOK_BEFORE_STEP, &d));
    TIDE_CHECK(apply(tr, &d));
    uint64_t left = tr->config.dataset_size - tr->position, full = (uint64_t)tide__trainer_planned_batch(tr);
    tr->step_first = tr->position;
    tr->step_count = left < full ? left : full;
    size_t offset, len;
    tide_block((size_t)tr->step_count, tr->ranks, tr->rank, &offset, &len);
    tr->my_first = tr->step_first + offset;
    tr->my_count = len;
    tr->micro = 0;
    tr->micro_count = tr->accum;
    tide__step_monitor_begin(&tr->monitor);
    tr->data_s = 0;
    tr->accumulated = 0;
    tr->in_step = 1;
  }
  size_t offset, len;
  tide_block((size_t)tr->my_count, tr->micro_count, tr->micro, &offset, &len);
  const uint64_t *order = tide_sampler_order(tr->sampler, NULL);
  tr->current_count = len;
  tr->micro_handed = 1;
  *batch = (tide_batch_t){.indices = order + tr->my_first + offset, .count = len, .micro = tr->micro,
                          .micro_count = tr->micro_count, .epoch = tr->epoch, .step = tr->step};
  tr->micro_start_ns = tide__now_ns();
  return 0;
}

/* Adds count * grads to the exchange buffer (or sets it, for the step's
 * first contribution) and returns |grads|^2; per-tensor squares added to
 * tensor_sq when asked. */
static double accumulate(tide_trainer_t *tr, float count, double *tensor_sq) {
  double total = 0;
  int add = tr->accumulated;
  for (size_t t = 0; t < tr->ntensors; t++) {
    size_t begin = tr->tensors[t].offset;
    double sq = tide__scale_into(tr->exchange + begin, tr->grads + begin, tr->tensors[t].count, count, add);
    if (tensor_sq != NULL) tensor_sq[t] += sq;
    total += sq;
  }
  tr->accumulated = 1;
  return total;
}

/* The micro-batch just computed: its gradient into the sum, its figures to
 * the monitor. */
static void add_micro(tide_trainer_t *tr, double loss) {
  tr->monitor.compute_s += (double)(tide__now_ns() - tr->micro_start_ns) * 1e-9;
  tr->micro_handed = 0;
  size_t c = tr->current_count;
  if (c > 0) {
    /* A non-finite loss is not fatal here: it travels in the loss slot, so
     * every rank sees it after the exchange and fails the same way. */
    int full = c == (size_t)tr->batch;
    double sq = accumulate(tr, (float)c, full && tr->config.tensor_stats ? tr->monitor.tensor_sq : NULL);
    tide__step_monitor_micro(&tr->monitor, (double)c, loss, sq, full);
  }
  tide__kfac_micro_end(tr, tr->kfac);
  tr->micro++;
}

/* The row's state, opened when the row first runs; a restored residual
 * goes to the first row with a compressor. */
static int row_state(tide_trainer_t *tr, int row, void **state) {
  if (tr->exchange_state[row] == NULL) {
    TIDE_CHECK(tide__exchanges[row].open(tr, &tr->exchange_state[row]));
    tide_compressor_t *c = tide__exchanges[row].compressor(tr->exchange_state[row]);
    if (c != NULL && tr->pending_residual != NULL) {
      int rc = tide_compressor_set_residual(c, tr->pending_residual, tr->pending_len);
      tide__free(tr->pending_residual);
      tr->pending_residual = NULL;
      if (rc != 0) return tide__trainer_fail(tr, rc, "the restored residual does not fit this exchange");
    }
  }
  *state = tr->exchange_state[row];
  return 0;
}

/* The exchange's sums, checked the same way on every rank. */
static int check_sums(tide_trainer_t *tr, const float *slots) {
  if (tr->multiplex != NULL) tide__multiplex_voted(tr, slots[TIDE__SLOT_GUARD]);
  double total = slots[TIDE__SLOT_COUNT];
  if (!(total > 0))
    return tide__trainer_fail(tr, TIDE_EPROTO, "step %ld carried %g samples over all ranks", tr->step, total);
  if (!isfinite(slots[TIDE__SLOT_LOSS]))
    return tide__trainer_fail(tr, TIDE_EINVAL, "step %ld: the loss is %g on some rank: the model diverged (lower the "
                              "learning rate)", tr->step, (double)slots[TIDE__SLOT_LOSS]);
  return 0;
}

/* After the update: progress, the step's times, the epoch's end. t1..t2
 * was the reduce, comm_s the communication inside the update (adasum's
 * combine, PTO's all-gather), both counted as exchange. */
static int finish(tide_trainer_t *tr, double total, int64_t t1, int64_t t2, double comm_s) {
  tide_step_stats_t *s = &tr->stats;
  tr->progress += s->gain;
  tr->step++;
  tr->position += tr->step_count;
  tr->in_step = 0;
  int64_t t3 = tide__now_ns();
  s->stepped = 1;
  s->step = tr->step;
  s->progress = tr->progress;
  s->epochs_done = tr->progress * (double)tr->config.base_batch / (double)tr->config.dataset_size;
  s->done = tr->progress >= tr->total_progress;
  s->epoch_end = tr->position >= tr->config.dataset_size;
  s->exchange_s = (double)(t2 - t1) * 1e-9 + comm_s;
  s->optim_s = (double)(t3 - t2) * 1e-9 - comm_s;
  s->step_s = (double)(t3 - tr->last_step_end_ns) * 1e-9;
  s->throughput = s->step_s > 0 ? total / s->step_s : NAN;
  tide__step_monitor_end(&tr->monitor, s->exchange_s, s->step_s);
  tr->last_step_end_ns = t3;
  if (tr->multiplex != NULL) tide__multiplex_step_end(tr);
  if (!s->epoch_end) return 0;
  tide_decision_t d = unchanged();
  TIDE_CHECK(run_hooks(tr, HOOK_AFTER_EPOCH, &d));
  TIDE_CHECK(apply(tr, &d));
  tr->epoch++;
  tr->position = 0;
  return tide_sampler_set_epoch(tr->sampler, tr->epoch);
}

/* One micro-batch; after the step's last, the exchange through one row of
 * the table (reduce, average, precondition, update), the statistics and the
 * policies. */
int tide_trainer_step(tide_trainer_t *tr, double loss, tide_step_stats_t *stats) {
  if (tr == NULL) {
    TIDE_ERROR("tide_trainer_step: trainer must not be NULL");
    return TIDE_EINVAL;
  }
  if (!tr->in_step || !tr->micro_handed)
    return tide__trainer_fail(tr, TIDE_ESTATE, "tide_trainer_step without a micro-batch: call tide_trainer_next first");
  add_micro(tr, loss);
  tide_step_stats_t *s = &tr->stats;
  if (tr->micro < tr->micro_count) {
    s->stepped = 0;
    if (stats != NULL) *stats = *s;
    return 0;
  }
  /* The exchange: gradient sum and statistics, summed over the ranks. */
  if (!tr->accumulated) memset(tr->exchange, 0, tr->nparams * sizeof *tr->exchange);
  float *slots = tr->exchange + tr->nparams;
  tide__step_monitor_pack(&tr->monitor, slots, tr->rank, tr->multiplex != NULL ? tide__multiplex_vote(tr) : 0);
  int row = tide__exchange_row(tr);
  const tide__exchange_ops_t *ops = &tide__exchanges[row];
  void *state = NULL;
  TIDE_CHECK(row_state(tr, row, &state));
  int64_t t1 = tide__now_ns();
  TIDE_CHECK(ops->reduce(tr, state));
  int64_t t2 = tide__now_ns();
  TIDE_CHECK(check_sums(tr, slots));
  double total = slots[TIDE__SLOT_COUNT], base = (double)tr->config.base_batch;
  tide__mean_t mean;
  TIDE_CHECK(ops->average(tr, state, total, &mean));
  tide__step_read_t read = {mean.sq, mean.own, tr->batch, tr->accum, base, tr->config.gns_decay};
  tide__step_monitor_read(&tr->monitor, slots, &read, s);
  s->epoch = tr->epoch;
  s->exchange = tr->exchange_kind;
  s->data_s = tr->data_s;
  s->exchange_s = (double)(t2 - t1) * 1e-9;
  /* Policies, then the update. */
  tide_decision_t d = unchanged();
  TIDE_CHECK(run_hooks(tr, HOOK_BEFORE_UPDATE, &d));
  TIDE_CHECK(apply(tr, &d));
  s->lr_factor = d.lr_factor > 0 ? d.lr_factor : 1.0;
  s->gain = d.gain > 0 ? d.gain : s->scale;
  s->lr = (double)tide_lr_at(&tr->config.schedule, (long)floor(tr->progress)) * s->lr_factor;
  tide__update_t done = {0, 0};
  if (tr->kfac != NULL) TIDE_CHECK(ops->precondition(tr, tr->kfac, &mean, (float)s->lr, &done));
  TIDE_CHECK(ops->update(tr, state, &mean, (float)s->lr, &done));
  s->kfac_s = done.kfac_s;
  TIDE_CHECK(finish(tr, total, t1, t2, done.comm_s));
  if (stats != NULL) *stats = *s;
  return 0;
}

int tide_trainer_data_wait(tide_trainer_t *tr, double seconds) {
  if (tr == NULL) return tide__null_arg("tide_trainer_data_wait", "trainer");
  if (!(seconds >= 0)) {
    TIDE_ERROR("tide_trainer_data_wait: seconds = %g must be >= 0", seconds);
    return TIDE_EINVAL;
  }
  tr->data_s += seconds;
  return 0;
}

const tide_step_stats_t *tide_trainer_stats(const tide_trainer_t *tr) { return tr != NULL ? &tr->stats : NULL; }

int tide_trainer_tensor_stats(const tide_trainer_t *tr, size_t tensor, double *grad_sq, double *trace_sigma) {
  if (tr == NULL) {
    TIDE_ERROR("tide_trainer_tensor_stats: trainer must not be NULL");
    return TIDE_EINVAL;
  }
  if (!tr->config.tensor_stats) {
    TIDE_ERROR("tide_trainer_tensor_stats: per-tensor statistics are off (set config.tensor_stats = 1)");
    return TIDE_ESTATE;
  }
  if (tensor >= tr->ntensors) {
    TIDE_ERROR("tide_trainer_tensor_stats: tensor %zu out of range (the trainer has %zu)", tensor, tr->ntensors);
    return TIDE_EINVAL;
  }
  if (grad_sq != NULL) *grad_sq = tide__gns_grad_sq(&tr->monitor.tensor_gns[tensor]);
  if (trace_sigma != NULL) *trace_sigma = tide__gns_trace_sigma(&tr->monitor.tensor_gns[tensor]);
  return 0;
}

int tide_trainer_add_policy(tide_trainer_t *tr, const tide_policy_ops_t *ops, void *state) {
  if (tr == NULL || ops == NULL) {
    TIDE_ERROR("tide_trainer_add_policy: trainer and ops must not be NULL");
    return TIDE_EINVAL;
  }
  if (ops->state_size > 0 && state == NULL) {
    TIDE_ERROR("tide_trainer_add_policy: policy %s has state_size %zu but no state", ops->name ? ops->name : "?",
               ops->state_size);
    return TIDE_EINVAL;
  }
  if (ops->decide_every < 0) {
    TIDE_ERROR("tide_trainer_add_policy: policy %s has decide_every %d; it must be >= 0",
               ops->name ? ops->name : "?", ops->decide_every);
    return TIDE_EINVAL;
  }
  tide__policy_slot_t *grown = tide__realloc(tr->policies, (tr->npolicies + 1) * sizeof *grown);
  if (grown == NULL) return TIDE_ENOMEM;
  tr->policies = grown;
  tr->policies[tr->npolicies++] = (tide__policy_slot_t){*ops, state};
  return 0;
}

/* A policy's report to the job's store (tide__policy_publish_cb): rank 0
 * only; nothing without a store. */
static int publish(void *ctx, const char *key, const char *text) {
  tide_trainer_t *tr = ctx;
  if (tr->rank != 0 || tr->comm == NULL) return 0;
  int rc = tide_comm_publish(tr->comm, key, text);
  return rc == TIDE_ESTATE ? 0 : rc;
}

int tide_trainer_adapt(tide_trainer_t *tr, const char *list) {
  if (tr == NULL || list == NULL) {
    TIDE_ERROR("tide_trainer_adapt: trainer and list must not be NULL");
    return TIDE_EINVAL;
  }
  tide__policy_env_t env = {.base_batch = tr->config.base_batch, .ranks = tr->ranks, .nodes = tr->nodes,
                            .max_batch = tr->config.max_batch, .max_accum = tr->config.max_accum,
                            .optim = tr->config.optim.kind, .dataset_size = tr->config.dataset_size,
                            .batch = tr->config.batch, .publish = publish, .publish_ctx = tr};
  if (*list == 0) {
    TIDE_ERROR("tide_trainer_adapt: the policy list is empty: give NAME[:key=value...] separated by commas");
    return TIDE_EINVAL;
  }
  char spec[256];
  for (const char *p = list; *p;) {
    size_t n = strcspn(p, ",");
    if (n == 0 || n >= sizeof spec) {
      TIDE_ERROR("tide_trainer_adapt: bad policy list \"%s\": give NAME[:key=value...] separated by commas", list);
      return TIDE_EINVAL;
    }
    memcpy(spec, p, n);
    spec[n] = 0;
    tide_policy_ops_t ops;
    void *state;
    TIDE_CHECK(tide__policy_builtin(spec, &env, &ops, &state));
    int rc = tide_trainer_add_policy(tr, &ops, state);
    if (rc != 0) {
      if (ops.destroy != NULL) ops.destroy(state);
      return rc;
    }
    p += n;
    if (*p == ',') p++;
  }
  return 0;
}
