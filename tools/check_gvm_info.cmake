# cmake -DGVM_INFO=<gvm-info> -P check_gvm_info.cmake
# gvm-info on the real driver: exit 0 with a device list, or exit 1 with the
# loader's one-line message and the hint to --sim. Anything else (a crash, an
# abort, silence) fails.
cmake_minimum_required(VERSION 3.25)
execute_process(COMMAND "${GVM_INFO}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "exit ${rc}\n${out}${err}")
if(rc EQUAL 0)
  if(NOT out MATCHES "device 0: ")
    message(FATAL_ERROR "gvm-info exited 0 without listing device 0")
  endif()
elseif(rc EQUAL 1)
  if(NOT err MATCHES "^gvm-info: (no CUDA driver found: |CUDA driver found but |CUDA driver too old)")
    message(FATAL_ERROR "gvm-info exited 1 without the loader's message")
  endif()
  # Without a driver it points to what does work here.
  if(NOT err MATCHES "gvm-info --sim h200")
    message(FATAL_ERROR "gvm-info exited 1 without suggesting --sim")
  endif()
else()
  message(FATAL_ERROR "gvm-info ended with '${rc}'")
endif()
