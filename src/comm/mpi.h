/* The MPI side of a communicator as coll's MPI collectives (src/coll/mpi.c)
 * use it: the private MPI_Comm, the agreement before a blocking collective,
 * waits with the deadline and failure reports. Include only where
 * TIDE_HAVE_MPI is defined (it includes <mpi.h>).
 *
 * Threads: the thread executing on the communicator (comm.h). */
#ifndef TIDE_COMM_MPI_H
#define TIDE_COMM_MPI_H

#include <mpi.h>

#include "comm/comm.h"

/* The communicator's duplicate of the user's MPI communicator. */
MPI_Comm tide__mpi_comm_handle(const tide_comm_t *comm);

/* A dissemination barrier on tag: when it returns 0 on any rank, every rank
 * has entered it. Deadline and failure reports as everywhere; what names the
 * call in messages. */
int tide__mpi_comm_agree(tide_comm_t *comm, int tag, const char *what);

/* Waits for n requests with the communicator's deadline, testing for
 * failure reports. On failure the requests are left to the caller (still
 * active where they did not complete). */
int tide__mpi_comm_wait(tide_comm_t *comm, MPI_Request *reqs, int n, const char *what);

/* Keeps a collective request that could not finish (MPI cannot cancel it)
 * and the arrays it reads until destroy, which frees them once it is done.
 * Takes ownership of arrays. */
void tide__mpi_comm_keep(tide_comm_t *comm, MPI_Request req, void *arrays);

/* Fails comm with TIDE_EIO, naming what failed and MPI's text for err. */
int tide__mpi_comm_fail_mpi(tide_comm_t *comm, int err, const char *what);

#endif
