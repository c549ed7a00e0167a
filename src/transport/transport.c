/* The transport table: the communicator asks it which transport carries a
 * channel, in this order (MPI when the communicator runs over MPI, else
 * shared memory on the same host when enabled, else TCP). */
#include "transport/transport.h"

const tide__transport_ops_t *const tide__transports[] = {&tide__mpi_ops, &tide__shm_ops, &tide__tcp_ops, NULL};

const tide__transport_ops_t *tide__transport_pick(const tide__link_t *link) {
  for (int i = 0; tide__transports[i] != NULL; i++)
    if (tide__transports[i]->can_connect(link)) return tide__transports[i];
  return NULL;
}
