/* What a training program around the trainer needs besides the step, so
 * tide-train, the Python binding and an application share one definition:
 * the default base batch (elastic jobs included) and the replica checksum.
 *
 * Threads: like the communicator they take, one thread at a time per comm. */
#include <errno.h>
#include <stdlib.h>

#include "core/core.h"

int tide_trainer_base_batch(const tide_comm_t *comm, int batch, long *out) {
  static const char fn[] = "tide_trainer_base_batch";
  if (comm == NULL || out == NULL) return tide__null_arg(fn, comm == NULL ? "comm" : "out");
  if (batch <= 0) {
    TIDE_ERROR("%s: batch %d must be > 0", fn, batch);
    return TIDE_EINVAL;
  }
  long workers = tide_comm_size(comm);
  /* Elastic: the launcher's first worker count, which a worker that joins
   * later sees too; its own communicator's size would differ from the
   * members' and tide_trainer_create's agreement check would refuse it. */
  const char *first = getenv("TIDE_SIZE");
  if (tide_comm_epoch(comm) >= 0 && first != NULL && *first != '\0') {
    char *end;
    errno = 0;
    long n = strtol(first, &end, 10);
    if (errno != 0 || *end != '\0' || n <= 0) {
      TIDE_ERROR("%s: TIDE_SIZE=\"%s\" must be the job's first worker count (> 0); tiderun sets it", fn, first);
      return TIDE_EINVAL;
    }
    workers = n;
  }
  *out = (long)batch * workers;
  return 0;
}

int tide_replica_checksum(tide_comm_t *comm, const void *data, size_t bytes, uint64_t *checksum, int *differing) {
  static const char fn[] = "tide_replica_checksum";
  if (comm == NULL || (data == NULL && bytes > 0) || checksum == NULL || differing == NULL)
    return tide__null_arg(fn, comm == NULL ? "comm" : checksum == NULL ? "checksum" : differing == NULL ? "differing" : "data");
  int size = tide_comm_size(comm);
  uint64_t mine = tide__fnv1a(data, bytes);
  uint64_t *sums = tide__calloc((size_t)size, sizeof *sums);
  if (sums == NULL) return TIDE_ENOMEM;
  int rc = tide_allgather(comm, &mine, sums, 1, TIDE_I64);
  if (rc == 0) {
    int first = -1;
    for (int r = 1; r < size && first < 0; r++)
      if (sums[r] != sums[0]) first = r;
    *checksum = sums[0];
    *differing = first;
  }
  tide__free(sums);
  return rc;
}
