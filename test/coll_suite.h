/* The per-rank collective suite shared by test_coll (store and tiderun-style
 * processes) and test_mpi (under mpirun). */
#ifndef TIDE_TEST_COLL_SUITE_H
#define TIDE_TEST_COLL_SUITE_H

#include <stddef.h>

#include "tide.h"

/* Runs every collective on comm (collective: every rank calls it) and
 * checks each result against a scalar reference; max_count > 0 skips the
 * counts above it (0: all, up to 300007); dtype >= 0 (a tide_dtype_t) runs
 * the per-dtype part for that dtype alone (-1: every dtype). Exits the
 * process non-zero on the first wrong result. */
void coll_suite_run(tide_comm_t *comm, size_t max_count, int dtype);

#endif
