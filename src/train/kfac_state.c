/* The trainer's K-FAC stage, its part of the trainer's state
 * (tide_trainer_state_get/set, checkpoints): the factors and the
 * decompositions, gathered from their owners. */
#include <string.h>

#include "train/kfac.h"

/* Per layer, in layer order: A, G, then the decomposition the layer's
 * preconditioning uses: a 0/1 flag (decomposed yet), Q_A, d_A, Q_G, d_G
 * (of a low-rank factor only its kept rows of Q);
 * with config.staleness > 0 then the pending one the same way (flag 1: in
 * the background job, to be swapped in; get waits for the job). The
 * decompositions live on their owners; get gathers them, so the state
 * does not depend on the rank count and restores on any. */
static size_t factor_floats(const layer_t *l) {
  return a_floats(l) + (size_t)l->dim_g * l->dim_g;
}

size_t tide__kfac_state_floats(const tide__kfac_t *k) {
  size_t n = 0;
  for (size_t i = 0; k != NULL && i < k->nlayers; i++)
    n += factor_floats(&k->layers[i]) + sections(k) * eigen_floats(&k->layers[i]);
  return n;
}

static float *put(float *out, const float *src, size_t n) {
  memcpy(out, src, n * sizeof *out);
  return out + n;
}

/* The layer's decompositions (sections of them) from its owner. */
void tide__kfac_eigen_pack(const tide__kfac_t *k, const layer_t *l, float *out) {
  size_t na = (size_t)l->dim_a, ng = (size_t)l->dim_g;
  for (size_t s = 0; s < sections(k); s++) {
    int have = s == 0 ? l->decomposed : l->pending;
    float *const *q = s == 0 ? l->q : l->qn, *const *d = s == 0 ? l->d : l->dn;
    float *next = out + eigen_floats(l);
    *out++ = have ? 1.0f : 0.0f;
    if (!have) {
      memset(out, 0, (eigen_floats(l) - 1) * sizeof *out);
    } else {
      if (!l->diag) out = put(out, q[TIDE_KFAC_A], qa_floats(l));
      out = put(out, d[TIDE_KFAC_A], na);
      out = put(out, q[TIDE_KFAC_G], qg_floats(l));
      put(out, d[TIDE_KFAC_G], ng);
    }
    out = next;
  }
}

int tide__kfac_state_get(const tide_trainer_t *tr, void *out) {
  tide__kfac_t *k = tr->kfac;
  if (k == NULL) return 0;
  /* The pending decompositions go into the state done (the same bits as
   * when they are swapped in); a failed one fails the swap later too. */
  int rc = tide__kfac_finish_job(k);
  if (rc != 0) {
    TIDE_ERROR("tide_trainer_state_get: a background K-FAC eigendecomposition failed");
    return rc;
  }
  size_t total = tide__kfac_state_floats(k), own = 0, per = sections(k);
  for (size_t i = 0; i < k->nlayers; i++)
    if (mine(k, &k->layers[i])) own += per * eigen_floats(&k->layers[i]);
  int gather = k->config.distribute && k->ranks > 1;
  size_t *counts = gather ? tide__calloc((size_t)k->ranks, sizeof *counts) : NULL;
  float *state = tide__malloc(total * sizeof *state), *send = gather ? tide__malloc(own * sizeof *send) : NULL,
        *recv = gather ? tide__malloc((total ? total : 1) * sizeof *recv) : NULL;
  if (state == NULL || (gather && (counts == NULL || send == NULL || recv == NULL))) rc = TIDE_ENOMEM;
  if (rc == 0 && gather) {
    float *s = send;
    for (size_t i = 0; i < k->nlayers; i++) {
      const layer_t *l = &k->layers[i];
      counts[l->owner] += per * eigen_floats(l);
      if (l->owner != k->rank) continue;
      tide__kfac_eigen_pack(k, l, s);
      s += per * eigen_floats(l);
    }
    rc = tide_allgatherv(tr->comm, send, own, recv, counts, TIDE_F32);
    if (rc != 0)
      TIDE_ERROR("tide_trainer_state_get: gathering the K-FAC decompositions: %s", tide_comm_last_error(tr->comm));
  }
  if (rc == 0) {
    /* Each layer's place in the state, then its decomposition from recv
     * (owners in rank order) or from this rank. */
    size_t *at = tide__calloc(k->nlayers, sizeof *at);
    if (at == NULL) rc = TIDE_ENOMEM;
    float *p = state;
    for (size_t i = 0; rc == 0 && i < k->nlayers; i++) {
      const layer_t *l = &k->layers[i];
      p = put(p, l->a, a_floats(l));
      p = put(p, l->g, (size_t)l->dim_g * l->dim_g);
      at[i] = (size_t)(p - state);
      if (!gather) tide__kfac_eigen_pack(k, l, p);
      p += per * eigen_floats(l);
    }
    size_t offset = 0;
    for (int r = 0; rc == 0 && gather && r < k->ranks; r++)
      for (size_t i = 0; i < k->nlayers; i++) {
        const layer_t *l = &k->layers[i];
        if (l->owner != r) continue;
        memcpy(state + at[i], recv + offset, per * eigen_floats(l) * sizeof *state);
        offset += per * eigen_floats(l);
      }
    tide__free(at);
  }
  if (rc == 0) memcpy(out, state, total * sizeof *state);
  tide__free(counts);
  tide__free(state);
  tide__free(send);
  tide__free(recv);
  return rc;
}

const char *tide__kfac_state_check(const tide__kfac_t *k, const void *in, size_t floats) {
  if (floats == 0) return NULL; /* a state without K-FAC: the factors start from I */
  if (k == NULL) return "the state has K-FAC factors and this trainer has no K-FAC (tide_trainer_kfac first)";
  if (floats != tide__kfac_state_floats(k)) return "the state's K-FAC layers are not this trainer's";
  const char *p = in;
  for (size_t i = 0; i < k->nlayers; i++) {
    const layer_t *l = &k->layers[i];
    p += factor_floats(l) * sizeof(float);
    for (size_t s = 0; s < sections(k); s++) {
      float flag;
      memcpy(&flag, p, sizeof flag);
      if (flag != 0.0f && flag != 1.0f) return "the state's K-FAC part is damaged";
      p += eigen_floats(l) * sizeof(float);
    }
  }
  return NULL;
}

static const char *take(float *dst, const char *src, size_t n) {
  memcpy(dst, src, n * sizeof *dst);
  return src + n * sizeof *dst;
}

const char *tide__kfac_eigen_unpack(const layer_t *l, float *const *q, float *const *d, const char *p) {
  if (!l->diag) p = take(q[TIDE_KFAC_A], p, qa_floats(l));
  p = take(d[TIDE_KFAC_A], p, (size_t)l->dim_a);
  p = take(q[TIDE_KFAC_G], p, qg_floats(l));
  return take(d[TIDE_KFAC_G], p, (size_t)l->dim_g);
}

void tide__kfac_state_set(tide__kfac_t *k, const void *in, size_t floats) {
  if (k == NULL || floats == 0) return;
  (void)tide__kfac_finish_job(k); /* its results are replaced */
  k->job_rc = 0;
  k->swap_step = -1; /* derived from the restored step at the next stage */
  const char *p = in;
  for (size_t i = 0; i < k->nlayers; i++) {
    layer_t *l = &k->layers[i];
    size_t ng = (size_t)l->dim_g;
    p = take(l->a, p, a_floats(l));
    p = take(l->g, p, ng * ng);
    for (size_t s = 0; s < sections(k); s++) {
      float flag, **q = s == 0 ? l->q : l->qn, **d = s == 0 ? l->d : l->dn;
      const char *next = p + eigen_floats(l) * sizeof(float);
      memcpy(&flag, p, sizeof flag);
      if (s == 1) l->pending = (mine(k, l) || l->spread) && flag == 1.0f;
      if (mine(k, l) || (l->spread && s == 0)) {
        if (s == 0) l->decomposed = flag == 1.0f;
        tide__kfac_eigen_unpack(l, q, d, p + sizeof flag);
      }
      p = next;
    }
  }
}
