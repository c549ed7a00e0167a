/* All-to-all of byte blocks whose sizes both sides know in advance (the data
 * loader's per-step sample exchange: every rank computes every rank's plan
 * from the shared sample order, so no sizes travel). One send and one
 * receive per peer with something to move, all driven at once. */
#include <string.h>

#include "coll/coll.h"

int tide__alltoallv_bytes(tide_comm_t *comm, const void *sendbuf, const size_t *send_bytes,
                          const size_t *send_displs, void *recvbuf, const size_t *recv_bytes,
                          const size_t *recv_displs) {
  int size = comm->size, rank = comm->rank;
  tide__p2p_t *ops = tide__malloc(2 * (size_t)size * sizeof *ops);
  if (ops == NULL) return TIDE_ENOMEM;
  tide__task_drain(comm);
  pthread_mutex_lock(&comm->exec_lock);
  comm->seq++;
  int rc = tide__comm_check(comm, comm->seq), n = 0;
  if (rc == 0) {
    if (send_bytes[rank] != recv_bytes[rank]) {
      rc = tide__comm_fail(comm, TIDE_EINVAL, 0, "rank %d: alltoallv sends itself %zu bytes but expects %zu", rank,
                           send_bytes[rank], recv_bytes[rank]);
    } else if (send_bytes[rank] > 0) {
      memcpy((char *)recvbuf + recv_displs[rank], (const char *)sendbuf + send_displs[rank], send_bytes[rank]);
    }
    for (int k = 1; rc == 0 && k < size; k++) {
      int to = (rank + k) % size, from = (rank - k + size) % size;
      if (send_bytes[to] > 0)
        tide__p2p_set(&ops[n++], TIDE__P2P_SEND, to, (const char *)sendbuf + send_displs[to], NULL, send_bytes[to],
                      TIDE_I32, TIDE_SUM);
      if (recv_bytes[from] > 0)
        tide__p2p_set(&ops[n++], TIDE__P2P_RECV, from, NULL, (char *)recvbuf + recv_displs[from], recv_bytes[from],
                      TIDE_I32, TIDE_SUM);
    }
    if (rc == 0 && n > 0) rc = tide__comm_run(comm, ops, n, "alltoallv");
  }
  pthread_mutex_unlock(&comm->exec_lock);
  tide__free(ops);
  return rc;
}
