/* Internal side of the policies: the built-in ones, made from a
 * "name:key=value" spec for a trainer. */
#ifndef TIDE_POLICY_H
#define TIDE_POLICY_H

#include "core/core.h"
#include "monitor/monitor.h"

/* Writes text under key in the job's store (rank 0 of the trainer only;
 * other ranks do nothing): 0 or a negative TIDE_E*. */
typedef int (*tide__policy_publish_cb)(void *ctx, const char *key, const char *text);

/* What a built-in policy needs to know of the trainer it serves. publish
 * (NULL: the job has no store) outlives the policy. */
typedef struct {
  long base_batch;
  int ranks, nodes, batch, max_batch, max_accum;
  tide_optim_kind_t optim;
  uint64_t dataset_size;
  tide__policy_publish_cb publish;
  void *publish_ctx;
} tide__policy_env_t;

/* Makes the policy `spec` names (docs/adaptation.md): *ops and a state the
 * caller hands to tide_trainer_add_policy. TIDE_EINVAL names a bad policy,
 * key or value. */
int tide__policy_builtin(const char *spec, const tide__policy_env_t *env, tide_policy_ops_t *ops, void **state);

/* A key=value of a spec; parse helpers log "policy NAME: key ..." on error. */
int tide__policy_number(const char *policy, const char *key, const char *text, double min, double max,
                        double *out);

/* Pollux (pollux.c). */
int tide__pollux_create(const char *const *keys, const char *const *values, int n, const tide__policy_env_t *env,
                        tide_policy_ops_t *ops, void **state);
/* The hints a Pollux policy's state (from tide__pollux_create) would report
 * now, with the monitor's figures in s. */
int tide__pollux_hints(const void *state, const tide_step_stats_t *s, tide_sched_hints_t *out);

#endif
