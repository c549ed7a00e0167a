/* The cases of test_adasum, one ctest entry each (test_adasum/NAME:
 * test/CMakeLists.txt reads the names of these lines). */
ADASUM_CASE(flat)           /* np 1-5 over shared memory, 3 and 4 over TCP */
ADASUM_CASE(flat_6_to_8)    /* np 6-8 over shared memory (more ranks than cores) */
ADASUM_CASE(bound)          /* ranks bound to 2 CPUs swap first (77 on one CPU) */
ADASUM_CASE(bad_arguments)
ADASUM_CASE(hierarchical)   /* emulated hosts; TIDE_ADASUM_HIER=0; a hierarchical/flat mismatch */
ADASUM_CASE(same_bits)      /* shm, shm with a 64 KiB ring and TCP give the same bits */
