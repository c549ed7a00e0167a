/* The trainer in an elastic job (docs/elastic.md): at step boundaries it
 * acts on the job's requests (a worker count asked for, workers waiting to
 * join, a straggler to remove); after a failure it rebuilds the
 * communicator over the survivors. Either way the members of the new epoch
 * take the training state (tide_trainer_state_get/set) and the parameters
 * from the member that completed the most steps, so nothing committed is
 * lost and no replica diverges; the data of the rest of the epoch is dealt
 * over the new members (positions are global). */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "train/train.h"

/* Resource Elasticity's straggler rule: a rank whose EWMA of (median
 * compute time / its compute time) falls below this is a straggler. */
#define STRAGGLER_ALPHA 0.1
#define STRAGGLER_THRESHOLD 0.8

/* In the order of TIDE_STRAGGLER's names (TIDE__PARAM_ENUMS, core/core.h). */
enum { STRAGGLER_OFF, STRAGGLER_REPORT, STRAGGLER_REMOVE };

struct tide__elastic_trainer {
  int detached;   /* this rank left the job */
  int stateless;  /* joined, and no hand-over has reached it yet: it has no state to offer */
  int finished;   /* told the job training is over */
  int requested;  /* a policy's world_size (0: none) */
  int straggler;  /* rank flagged, -1 none */
  int mode;       /* STRAGGLER_* */
  long watch_from; /* first step of the current membership's straggler window */
  double *ewma;   /* by rank */
  int changes;
  double last_change_s; /* the last change, from the decision to the state in place */
  void *pto_state;      /* config.pto: the whole state, gathered before a planned change */
  size_t pto_state_len;
};

static int reset_ranks(tide_trainer_t *tr) {
  struct tide__elastic_trainer *e = tr->elastic;
  tide__free(e->ewma);
  e->ewma = tide__malloc((size_t)tr->ranks * sizeof *e->ewma);
  if (e->ewma == NULL) return TIDE_ENOMEM;
  for (int r = 0; r < tr->ranks; r++) e->ewma[r] = 1;
  e->straggler = -1;
  e->watch_from = tr->step + 1; /* the first step of a membership measures connection set-up */
  return 0;
}

void tide__trainer_elastic_fini(tide_trainer_t *tr) {
  if (tr->elastic == NULL) return;
  tide__free(tr->elastic->ewma);
  tide__free(tr->elastic->pto_state);
  tide__free(tr->elastic);
  tr->elastic = NULL;
  tide_comm_destroy(tr->comm);
  tr->comm = NULL;
}

/* A policy's world_size: kept as the cap of the next boundaries, and
 * published by rank 0 as the job's request, so that tiderun --elastic starts
 * the workers a growth needs (and does not replace the ones a shrink lets go). */
void tide__trainer_elastic_request(tide_trainer_t *tr, int world_size) {
  struct tide__elastic_trainer *e = tr->elastic;
  if (world_size == e->requested) return;
  e->requested = world_size;
  int rc = tr->rank == 0 ? tide_comm_elastic_request(tr->comm, world_size) : 0;
  if (rc != 0)
    TIDE_WARN("elastic: a policy asked for %d workers, but the request could not be written to the job's store: %s",
              world_size, tide_strerror(rc));
}

void tide__trainer_elastic_done(tide_trainer_t *tr) {
  /* Every member says so before it exits: a launcher that sees a worker
   * exit 0 then knows the job is done, not that this worker was released. */
  if (tr->comm != NULL && !tr->elastic->finished) tr->elastic->finished = tide_comm_elastic_finish(tr->comm) == 0;
}

/* The member with the most completed steps (the lowest rank among equals;
 * a worker that just joined has none) sends its state and parameters to
 * every member; the others restore them. Collective over the new comm. */
static int hand_over(tide_trainer_t *tr, long planned) {
  int joined = tr->elastic->stateless;
  double step = joined ? -1.0 : (double)tr->step;
  TIDE_CHECK(tide_allreduce(tr->comm, &step, &step, 1, TIDE_F64, TIDE_MAX));
  double source = !joined && (double)tr->step == step ? (double)tr->rank : (double)INT_MAX;
  TIDE_CHECK(tide_allreduce(tr->comm, &source, &source, 1, TIDE_F64, TIDE_MIN));
  if (source >= (double)tr->ranks) return tide__trainer_fail(tr, TIDE_ESTATE, "no member of the job has a state to hand over");
  int root = (int)source;
  /* Under PTO a member holds only its shard of the optimizer state: the
   * whole state was gathered before the change (gather_pto_state), and every
   * member, the source too, restores it into its new shard. */
  struct tide__elastic_trainer *e = tr->elastic;
  int pto = tr->config.pto && !joined;
  if (pto && e->pto_state == NULL)
    return tide__trainer_fail(tr, TIDE_ESTATE, "elastic: config.pto: no gathered state to hand over");
  int64_t header[2] = {(int64_t)(pto ? e->pto_state_len : tide_trainer_state_size(tr)), planned};
  TIDE_CHECK(tide_broadcast(tr->comm, header, 2, TIDE_I64, root));
  size_t words = ((size_t)header[0] + 3) / 4;
  int32_t *buf = tide__calloc(words ? words : 1, sizeof *buf);
  if (buf == NULL) return TIDE_ENOMEM;
  int rc = 0;
  if (tr->rank == root) {
    if (pto) memcpy(buf, e->pto_state, e->pto_state_len);
    else rc = tide_trainer_state_get(tr, buf, words * 4);
  }
  if (rc == 0) rc = tide_broadcast(tr->comm, buf, words, TIDE_I32, root);
  if (rc == 0) rc = tide_broadcast(tr->comm, tr->params, tr->nparams, TIDE_F32, root);
  if (rc == 0 && (tr->rank != root || tr->config.pto)) rc = tide_trainer_state_set(tr, buf, (size_t)header[0]);
  tide__free(buf);
  tide__free(e->pto_state);
  e->pto_state = NULL;
  if (rc != 0) return tide__trainer_fail(tr, rc, "handing the training state over to the new members failed: %s",
                                         tide_comm_last_error(tr->comm));
  e->stateless = 0;
  /* The residual is rank-specific error feedback: the source's is not ours.
   * Every member restarts error feedback from zero (docs/elastic.md). */
  tide__trainer_drop_residual(tr);
  tide__trainer_replan(tr, (long)header[1]);
  TIDE_INFO("elastic: step %ld, data epoch %llu position %llu: state from rank %d, %d member(s), global batch %ld",
            tr->step, (unsigned long long)tr->epoch, (unsigned long long)tr->position, root, tr->ranks,
            tr->stats.planned_batch);
  return 0;
}

/* config.pto, before a planned change: every member of the old epoch (all
 * at this boundary) gathers the whole optimizer state from the shards. */
static int gather_pto_state(tide_trainer_t *tr) {
  struct tide__elastic_trainer *e = tr->elastic;
  tide__free(e->pto_state);
  e->pto_state_len = tide_trainer_state_size(tr);
  e->pto_state = tide__malloc(e->pto_state_len ? e->pto_state_len : 1);
  if (e->pto_state == NULL) return TIDE_ENOMEM;
  int rc = tide_trainer_state_get(tr, e->pto_state, e->pto_state_len);
  if (rc != 0) return tide__trainer_fail(tr, rc, "elastic: gathering the PTO shards of the optimizer state failed");
  return 0;
}

static int recoverable(int rc) { return rc == TIDE_EPEER || rc == TIDE_ETIMEDOUT || rc == TIDE_EABORTED; }

/* Membership changes in a row that a member's failure may interrupt (each
 * one leaves the dead out) before the trainer gives up. */
#define CHANGE_ATTEMPTS 8

/* Starts the next membership epoch: size and exclude as tide_comm_resize;
 * failed: after a peer failure (tide_trainer_recover), not a planned change.
 * A member that dies while the new members take the state over (a host
 * lost during a change) starts another epoch over the survivors. */
static int resize(tide_trainer_t *tr, int size, int exclude, int failed) {
  struct tide__elastic_trainer *e = tr->elastic;
  int64_t t0 = tide__now_ns();
  if (tr->config.pto && failed)
    return tide__trainer_fail(tr, TIDE_EPEER, "elastic: config.pto: a failed worker's shard of the optimizer state "
                              "is lost with it, so the job cannot go on (PTO jobs survive planned resizes, not "
                              "failures: restart from a checkpoint, or turn PTO off)");
  tide__trainer_abandon_step(tr); /* its samples are dealt again */
  if (tr->config.pto) TIDE_CHECK(gather_pto_state(tr));
  long planned = (long)tr->ranks * tr->batch * tr->accum;
  for (int attempt = 1;; attempt++) {
    tide_comm_t *next = NULL;
    int rc = tide_comm_resize(tr->comm, size, exclude, &next);
    if (rc != 0)
      return tide__trainer_fail(tr, rc, "the job could not go on with a new membership: %s", tide_strerror(rc));
    tide_comm_destroy(tr->comm);
    if (next == NULL) {
      tr->comm = NULL;
      e->detached = 1;
      return 0;
    }
    TIDE_CHECK(tide__trainer_bind(tr, next)); /* the counts, and what is sized by them */
    TIDE_CHECK(reset_ranks(tr));
    if (tr->config.pto) TIDE_CHECK(tide__pto_reshard(tr));
    rc = tide__trainer_agree(tr);
    if (rc == 0) rc = hand_over(tr, planned);
    if (rc == 0) break;
    if (!recoverable(rc) || tr->config.pto || attempt == CHANGE_ATTEMPTS) return rc;
    int target = 0, waiting = 0;
    if (tide_comm_elastic_status(tr->comm, &target, &waiting) != 0) target = 0;
    TIDE_WARN("elastic: a member failed while epoch %ld took the training state over (%s: %s); the survivors "
              "start another",
              tide_comm_epoch(tr->comm), tide_err_name(rc), tide_comm_last_error(tr->comm));
    size = target;
    exclude = -1;
  }
  e->changes++;
  e->last_change_s = (double)(tide__now_ns() - t0) * 1e-9;
  TIDE_INFO("elastic: membership epoch %ld in place after %.1f ms", tide_comm_epoch(tr->comm), e->last_change_s * 1e3);
  return 0;
}

/* Updates the straggler averages from the last step's compute times (the
 * same on every rank: they were all-reduced) and returns the rank flagged. */
static int watch_stragglers(tide_trainer_t *tr) {
  struct tide__elastic_trainer *e = tr->elastic;
  if (e->mode == STRAGGLER_OFF || tr->ranks < 3 || tr->step <= e->watch_from) return -1;
  double median = tr->stats.compute_median_s;
  if (!(median > 0)) return -1;
  int worst = tide__straggler_update(e->ewma, tr->monitor.times, tr->ranks, median, STRAGGLER_ALPHA,
                                     STRAGGLER_THRESHOLD);
  if (worst >= 0 && e->straggler != worst) {
    e->straggler = worst;
    TIDE_WARN("elastic: rank %d is a straggler at step %ld: its compute runs at %.2f of the median rank's speed "
              "(moving average)%s",
              worst, tr->step, e->ewma[worst], e->mode == STRAGGLER_REMOVE ? "; it is taken out of the job" : "");
  }
  return e->straggler;
}

/* One look at the requests; *changed = 1 after a membership change. */
static int boundary_once(tide_trainer_t *tr, int *changed) {
  struct tide__elastic_trainer *e = tr->elastic;
  *changed = 0;
  if (e->detached || tr->comm == NULL) return 0;
  int straggler = watch_stragglers(tr);
  int64_t wire[2] = {tr->ranks, -1};
  if (tr->rank == 0) {
    int target = 0, waiting = 0;
    int rc = tide_comm_elastic_status(tr->comm, &target, &waiting);
    if (rc != 0) return tide__trainer_fail(tr, rc, "reading the job's requests from the store failed");
    int max = (int)tide__param_int(TIDE__PARAM_ELASTIC_MAX), min = (int)tide__param_int(TIDE__PARAM_ELASTIC_MIN);
    int cap = target > 0 ? target : e->requested > 0 ? e->requested : max;
    if (cap > max) cap = max;
    if (cap < min) cap = min;
    if (cap < tr->ranks)
      wire[0] = cap;
    else if (waiting > 0 && tr->ranks < cap)
      wire[0] = tr->ranks + waiting < cap ? tr->ranks + waiting : cap;
    if (straggler >= 0 && e->mode == STRAGGLER_REMOVE && tr->ranks - 1 >= min) wire[1] = straggler;
  }
  if (tr->ranks > 1) {
    int rc = tide_broadcast(tr->comm, wire, 2, TIDE_I64, 0);
    if (rc != 0) return tide__trainer_fail(tr, rc, "elastic: agreeing on the membership failed: %s",
                                           tide_comm_last_error(tr->comm));
  }
  if (wire[0] == tr->ranks && wire[1] < 0) return 0;
  TIDE_INFO("elastic: step %ld: %d -> %lld worker(s)%s", tr->step, tr->ranks, (long long)wire[0],
            wire[1] >= 0 ? " (removing the straggler)" : "");
  *changed = 1;
  return resize(tr, (int)wire[0], (int)wire[1], 0);
}

int tide__trainer_elastic_boundary(tide_trainer_t *tr) {
  /* After a change, look again: the new members (a joiner starts with this
   * look) and any further request meet here. */
  for (int changed = 1; changed;) TIDE_CHECK(boundary_once(tr, &changed));
  return 0;
}

/* ---- public ---------------------------------------------------------------------- */

int tide_trainer_elastic(tide_trainer_t *tr) {
  if (tr == NULL) return tide__null_arg("tide_trainer_elastic", "tr");
  if (tr->elastic != NULL) return 0;
  if (tide_comm_epoch(tr->comm) < 0) {
    TIDE_ERROR("tide_trainer_elastic: the trainer's communicator is not elastic (start the job with tiderun "
               "--elastic, or set TIDE_ELASTIC=1 on every rank)");
    return TIDE_ESTATE;
  }
  if (tr->kfac != NULL)
    return tide__trainer_fail(tr, TIDE_EINVAL, "tide_trainer_elastic: K-FAC is not elastic yet (its layer owners "
                              "are fixed at creation): turn it off for an elastic job");
  TIDE_CHECK(tide_params_load()); /* a bad TIDE_STRAGGLER is refused here, naming the allowed values */
  int mode = tide__param_enum(TIDE__PARAM_STRAGGLER);
  tr->elastic = tide__calloc(1, sizeof *tr->elastic);
  if (tr->elastic == NULL) return TIDE_ENOMEM;
  tr->elastic->mode = mode;
  tr->elastic->stateless = tide_comm_joined(tr->comm);
  int rc = reset_ranks(tr);
  if (rc == 0 && tr->elastic->stateless) rc = tide__trainer_agree(tr); /* tide_trainer_create left it to here */
  if (rc == 0 && tr->elastic->stateless) rc = hand_over(tr, 0);
  if (rc != 0 && !recoverable(rc)) {
    tide__free(tr->elastic->ewma);
    tide__free(tr->elastic);
    tr->elastic = NULL;
    return rc;
  }
  /* A member died during the hand-over: this worker recovers with the
   * survivors, as they do from their training loop. The trainer owns the
   * communicator from here, whether that succeeds or not. */
  if (rc != 0) rc = tide_trainer_recover(tr, rc);
  return rc;
}

tide_comm_t *tide_trainer_comm(const tide_trainer_t *tr) { return tr != NULL ? tr->comm : NULL; }

int tide_trainer_detached(const tide_trainer_t *tr) { return tr != NULL && tr->elastic != NULL && tr->elastic->detached; }

int tide_trainer_straggler(const tide_trainer_t *tr) {
  return tr != NULL && tr->elastic != NULL ? tr->elastic->straggler : -1;
}

double tide_trainer_last_change_s(const tide_trainer_t *tr) {
  return tr != NULL && tr->elastic != NULL && tr->elastic->changes > 0 ? tr->elastic->last_change_s : NAN;
}

int tide_trainer_resize(tide_trainer_t *tr, int size, int exclude) {
  if (tr == NULL) return tide__null_arg("tide_trainer_resize", "tr");
  if (tr->elastic == NULL) {
    TIDE_ERROR("tide_trainer_resize: call tide_trainer_elastic first");
    return TIDE_ESTATE;
  }
  if (tr->elastic->detached) return 0;
  return resize(tr, size, exclude, 0);
}

int tide_trainer_recover(tide_trainer_t *tr, int rc) {
  if (tr == NULL) return tide__null_arg("tide_trainer_recover", "tr");
  if (rc == 0) return 0;
  if (tr->elastic == NULL || !recoverable(rc)) return rc;
  if (tr->elastic->detached) return 0;
  int target = 0, waiting = 0;
  if (tide_comm_elastic_status(tr->comm, &target, &waiting) != 0) target = 0;
  TIDE_WARN("elastic: step %ld failed (%s: %s); the survivors start a new membership", tr->step, tide_err_name(rc),
            tide_comm_last_error(tr->comm));
  return resize(tr, target, -1, 1);
}
