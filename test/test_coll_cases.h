/* The collective conformance cases of test_coll, one ctest entry each
 * (test_coll/NAME, its own process and timeout: test/CMakeLists.txt reads
 * the names of this file's lines), as libuv's test-list.h. A new case is
 * one line here: name, ranks, TCP only (1) or shared memory where it can
 * (0), host id per rank (NULL: all ranks on one host). */
COLL_CASE(np1_shm, 1, 0, NULL)
COLL_CASE(np1_tcp, 1, 1, NULL)
COLL_CASE(np2_shm, 2, 0, NULL)
COLL_CASE(np2_tcp, 2, 1, NULL)
COLL_CASE(np3_shm, 3, 0, NULL)
COLL_CASE(np3_tcp, 3, 1, NULL)
COLL_CASE(np4_shm, 4, 0, NULL)
COLL_CASE(np4_tcp, 4, 1, NULL)
COLL_CASE(np5_shm, 5, 0, NULL)
COLL_CASE(np5_tcp, 5, 1, NULL)
COLL_CASE(np4_2hosts, 4, 0, hosts_2x2)
COLL_CASE(np5_2hosts_uneven, 5, 0, hosts_3_2)
/* Checks the test process runs itself, without ranks: */
COLL_CHECK(shm_names)
