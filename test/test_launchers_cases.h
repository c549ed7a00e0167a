/* The cases of test_launchers, one ctest entry each (test_launchers/NAME:
 * test/CMakeLists.txt reads the names of these lines). Only the Open MPI
 * case needs mpirun; it alone is skipped (77) without it. */
LAUNCHER_CASE(pmi)
LAUNCHER_CASE(slurm)
LAUNCHER_CASE(mpirun)
