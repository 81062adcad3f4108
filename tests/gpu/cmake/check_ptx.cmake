# cmake -DPTXAS=<ptxas> -DPTX=<file.ptx> -DOUT=<scratch.cubin> -P check_ptx.cmake
#
# Proves the test kernels are valid PTX for the oldest GPU target, sm_60.
# ptxas checks every instruction against the file's own `.target`, so where
# the toolkit's ptxas can no longer generate code for sm_60 (CUDA 13 dropped
# it: "Value 'sm_60' is not defined for option 'gpu-name'"), assembling the
# file for the lowest target it has still rejects anything sm_60 lacks
# ("Instruction 'nanosleep' requires .target sm_70 or higher").
# Prints GVM_SKIP (CTest: skipped) when there is no ptxas.
cmake_minimum_required(VERSION 3.25)
if(NOT PTXAS OR NOT EXISTS "${PTXAS}")
  message("GVM_SKIP: ptxas not found (no CUDA toolkit bin directory)")
  return()
endif()

file(READ "${PTX}" text)
if(NOT text MATCHES "\n\\.version 6\\.0[ \t]*\n" OR NOT text MATCHES "\n\\.target sm_60[ \t]*\n")
  message(FATAL_ERROR "${PTX} must declare `.version 6.0` and `.target sm_60`")
endif()

execute_process(COMMAND "${PTXAS}" -arch=sm_60 "${PTX}" -o "${OUT}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(STATUS "ptxas -arch=sm_60: ok")
  return()
endif()
if(NOT err MATCHES "is not defined for option 'gpu-name'")
  message(FATAL_ERROR "ptxas -arch=sm_60 ${PTX} failed:\n${out}${err}")
endif()

# This ptxas cannot target sm_60: take the lowest sm_XY it lists.
execute_process(COMMAND "${PTXAS}" --help OUTPUT_VARIABLE help ERROR_VARIABLE help_err)
string(REGEX MATCHALL "'sm_[0-9]+'" targets "${help}")
set(lowest "")
foreach(t IN LISTS targets)
  string(REGEX REPLACE "'sm_([0-9]+)'" "\\1" n "${t}")
  if(lowest STREQUAL "" OR n LESS lowest)
    set(lowest ${n})
  endif()
endforeach()
if(lowest STREQUAL "")
  message(FATAL_ERROR "ptxas cannot target sm_60 and lists no sm_XY target:\n${err}")
endif()
execute_process(COMMAND "${PTXAS}" -arch=sm_${lowest} "${PTX}" -o "${OUT}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ptxas -arch=sm_${lowest} ${PTX} failed:\n${out}${err}")
endif()
message(STATUS "this ptxas cannot generate sm_60 code; the PTX assembles for sm_${lowest} "
               "with every instruction checked against its .target sm_60: ok")
