/* The cases of test_tools, one ctest entry each (test_tools/NAME:
 * test/CMakeLists.txt reads the names of these lines). */
TOOL_CASE(ctl)
TOOL_CASE(report)
TOOL_CASE(metrics)
TOOL_CASE(calls)
TOOL_CASE(bench)
