/* Prints the size and field offsets of the structs python/tide/_lib.py
 * mirrors with ctypes, one "struct field offset" line each ("struct - size"
 * for the size); test_abi.py compares them with ctypes'. */
#include <stddef.h>
#include <stdio.h>

#include "tide.h"

#define SIZE(s) printf(#s " - %zu\n", sizeof(s))
#define FIELD(s, f) printf(#s " " #f " %zu\n", offsetof(s, f))

int main(void) {
  SIZE(tide_data_summary_t);
  FIELD(tide_data_summary_t, classes); FIELD(tide_data_summary_t, shards); FIELD(tide_data_summary_t, bytes);
  SIZE(tide_data_cache_stats_t);
  FIELD(tide_data_cache_stats_t, bytes); FIELD(tide_data_cache_stats_t, hits); FIELD(tide_data_cache_stats_t, evicted);
  FIELD(tide_data_cache_stats_t, bytes_fetched);
  SIZE(tide_topk_opts_t);
  FIELD(tide_topk_opts_t, mstopk_rounds); FIELD(tide_topk_opts_t, num_threads);
  SIZE(tide_topk_stats_t);
  FIELD(tide_topk_stats_t, t2); FIELD(tide_topk_stats_t, full_passes); FIELD(tide_topk_stats_t, candidates);
  FIELD(tide_topk_stats_t, fallback); FIELD(tide_topk_stats_t, threads);
  SIZE(tide_tensor_t);
  FIELD(tide_tensor_t, offset); FIELD(tide_tensor_t, count); FIELD(tide_tensor_t, ndim); FIELD(tide_tensor_t, shape);
  SIZE(tide_optim_config_t);
  FIELD(tide_optim_config_t, weight_decay); FIELD(tide_optim_config_t, exclude_1d);
  SIZE(tide_lr_schedule_t);
  FIELD(tide_lr_schedule_t, warmup_steps); FIELD(tide_lr_schedule_t, total_steps); FIELD(tide_lr_schedule_t, final_lr);
  SIZE(tide_trainer_config_t);
  FIELD(tide_trainer_config_t, epochs); FIELD(tide_trainer_config_t, optim); FIELD(tide_trainer_config_t, schedule);
  FIELD(tide_trainer_config_t, exchange); FIELD(tide_trainer_config_t, density);
  FIELD(tide_trainer_config_t, selector); FIELD(tide_trainer_config_t, gns_decay);
  FIELD(tide_trainer_config_t, tensor_stats);
  SIZE(tide_batch_t);
  FIELD(tide_batch_t, count); FIELD(tide_batch_t, epoch); FIELD(tide_batch_t, done);
  SIZE(tide_step_stats_t);
  FIELD(tide_step_stats_t, global_batch); FIELD(tide_step_stats_t, exchange); FIELD(tide_step_stats_t, loss);
  FIELD(tide_step_stats_t, noise_scale); FIELD(tide_step_stats_t, gain_ratio);
  FIELD(tide_step_stats_t, compute_max_s); FIELD(tide_step_stats_t, slowest_rank);
  FIELD(tide_step_stats_t, comm_share); FIELD(tide_step_stats_t, throughput);
  FIELD(tide_step_stats_t, paused_s); FIELD(tide_step_stats_t, background_jobs);
  return 0;
}
