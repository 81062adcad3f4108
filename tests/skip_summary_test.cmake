# cmake -DSCRIPT=skip_summary.cmake -DLOG=skip_summary_sample.log -P skip_summary_test.cmake
# The summary of a sample CTest log: every kind of skip found, one line per
# reason with its count, the passed test left out, brackets and ';' intact.
cmake_minimum_required(VERSION 3.25)
execute_process(COMMAND ${CMAKE_COMMAND} -DLOG=${LOG} -P ${SCRIPT}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(got "${out}${err}")
set(want "Why tests were skipped (one line per reason; the full output is in ${LOG}):
  skipped 2 tests: no CUDA driver found: libcuda.so.1: cannot open shared object file; see [docs] (e.g. Cuda/AllocatorSuite.Grows/cuda)
  skipped 1 test: no ptxas in the CUDA toolkit (e.g. test_kernels_ptx_valid_for_sm_60)
  skipped 1 test: python3 not found (e.g. python_cpu)
")
if(NOT rc EQUAL 0 OR NOT got STREQUAL want)
  message(FATAL_ERROR "exit ${rc}; got:\n${got}\nwant:\n${want}")
endif()
message(STATUS "the summary is right")
