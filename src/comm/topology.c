/* Host grouping, shared by the two ways of joining: the store bootstrap
 * (src/comm/comm.c: host ids published by every rank) and the MPI one
 * (src/comm/mpi_boot.c: MPI_COMM_TYPE_SHARED leaders or TIDE_HOST_ID). */
#include <string.h>

#include "comm/comm.h"

int tide__comm_set_hosts(tide_comm_t *comm, const char *const *host_of, const uint64_t *key_of) {
  int n = comm->size, nodes = 0;
  int *count = tide__calloc((size_t)n, sizeof *count);
  const char **names = tide__calloc((size_t)n, sizeof *names);
  int *node_of = tide__calloc((size_t)n, sizeof *node_of);
  int *local_rank_of = tide__calloc((size_t)n, sizeof *local_rank_of);
  int *cpus_of = key_of != NULL ? tide__calloc((size_t)n, sizeof *cpus_of) : NULL;
  if (!count || !names || !node_of || !local_rank_of || (key_of != NULL && !cpus_of)) {
    tide__free(count);
    tide__free(names);
    tide__free(node_of);
    tide__free(local_rank_of);
    tide__free(cpus_of);
    return TIDE_ENOMEM;
  }
  /* Nodes are numbered in order of their lowest rank. */
  for (int r = 0; r < n; r++) {
    int node = -1;
    for (int k = 0; k < nodes && node < 0; k++)
      if (strcmp(names[k], host_of[r]) == 0) node = k;
    if (node < 0) {
      node = nodes++;
      names[node] = host_of[r];
    }
    node_of[r] = node;
    local_rank_of[r] = count[node]++;
  }
  for (int r = 0; cpus_of != NULL && r < n; r++) {
    cpus_of[r] = -1;
    for (int q = 0; key_of[r] != 0 && cpus_of[r] < 0; q++)
      if (node_of[q] == node_of[r] && key_of[q] == key_of[r]) cpus_of[r] = q;
  }
  tide__free(comm->cpus_of);
  comm->cpus_of = cpus_of;
  tide__free(comm->node_of);
  tide__free(comm->local_rank_of);
  comm->node_of = node_of;
  comm->local_rank_of = local_rank_of;
  comm->node = node_of[comm->rank];
  comm->node_count = nodes;
  comm->local_rank = local_rank_of[comm->rank];
  comm->local_size = count[comm->node];
  comm->uniform_nodes = 1;
  for (int k = 0; k < nodes; k++)
    if (count[k] != comm->local_size) comm->uniform_nodes = 0;
  tide__free(count);
  tide__free(names);
  return 0;
}
