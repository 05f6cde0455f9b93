# Included by ctest (TEST_INCLUDE_FILES; see gpurun_add_test's PER_CASE in tests/CMakeLists.txt):
# registers one ctest test per doctest TEST_CASE of GPURUN_CASES_EXE, so that ctest -j balances
# the process-spawning cases. <target>/<k> runs the k-th case in file order (doctest
# --order-by=file --first=k --last=k); a failing one prints its case's name.
# In: GPURUN_CASES_TARGET, GPURUN_CASES_EXE, GPURUN_CASES_PROPERTIES (set_tests_properties').
if(NOT EXISTS "${GPURUN_CASES_EXE}")
  # Not built yet: one test that fails, naming it (with the suite's labels, so -L shows it).
  add_test(${GPURUN_CASES_TARGET}/not_built "${GPURUN_CASES_EXE}")
  set_tests_properties(${GPURUN_CASES_TARGET}/not_built PROPERTIES ${GPURUN_CASES_PROPERTIES})
  return()
endif()
execute_process(COMMAND "${GPURUN_CASES_EXE}" --count OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "passing the current filters: ([0-9]+)")
  add_test(${GPURUN_CASES_TARGET}/cannot_list "${GPURUN_CASES_EXE}" --count)
  set_tests_properties(${GPURUN_CASES_TARGET}/cannot_list PROPERTIES ${GPURUN_CASES_PROPERTIES})
  return()
endif()
set(n ${CMAKE_MATCH_1})
if(n EQUAL 0)
  return()
endif()
foreach(k RANGE 1 ${n})
  add_test(${GPURUN_CASES_TARGET}/${k} "${GPURUN_CASES_EXE}" --order-by=file --first=${k}
           --last=${k})
  set_tests_properties(${GPURUN_CASES_TARGET}/${k} PROPERTIES ${GPURUN_CASES_PROPERTIES})
endforeach()
