/* Internal to src/plan: the profile checks the planner relies on. */
#ifndef TIDE_PLAN_PLAN_H
#define TIDE_PLAN_PLAN_H

#include "tide.h"

/* 0 when every layer of p has a time at every profiled batch; else
 * TIDE_EINVAL with a message from `who`. */
int tide__profile_check(const tide_profile_t *p, const char *who);

/* Checks that layers[0..n) form a graph the planner handles: one sink (the
 * last layer), every other output used, and each join (a layer with >= 2
 * inputs) fed by chains from one fork. member (may be NULL, n ints) gets,
 * per layer, the join whose branch it is in, or -1 for the main chain.
 * TIDE_EINVAL with a message naming the layer. */
int tide__plan_graph_check(const tide_profile_layer_t *layers, int n, int *member);

#endif
