# cmake -DLIBRARY=<lib> -DREADELF=<readelf> -DNM=<nm> -DLDD=<ldd> -P check_no_libcuda.cmake
#
# gvmalloc loads the CUDA driver at run time and must never link it: a linked
# libcuda would make the library fail to load on a machine without a GPU,
# instead of saying "no CUDA driver found". Fails when
#   - a NEEDED entry names libcuda,
#   - a cu* driver function is an undefined dynamic symbol (a direct call that
#     would only fail at load time: shared libraries link with undefined
#     symbols by default),
#   - ldd shows any libcuda among the resolved dependencies.
# Prints GVM_SKIP (CTest: skipped) when readelf is missing.
cmake_minimum_required(VERSION 3.25)
if(NOT READELF OR NOT EXISTS "${READELF}")
  message("GVM_SKIP: readelf not found, cannot read the NEEDED entries")
  return()
endif()
if(NOT EXISTS "${LIBRARY}")
  message(FATAL_ERROR "no such library: ${LIBRARY}")
endif()

execute_process(COMMAND "${READELF}" -d "${LIBRARY}" OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "readelf -d ${LIBRARY} failed (${rc})")
endif()
string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*" needed "${dynamic}")
if(NOT needed)
  # Every C++ shared library needs at least libc: no NEEDED lines means the
  # output was not understood, and passing would prove nothing.
  message(FATAL_ERROR "no NEEDED entries found in readelf -d output:\n${dynamic}")
endif()
foreach(entry IN LISTS needed)
  message(STATUS "${entry}")
  if(entry MATCHES "libcuda")
    message(FATAL_ERROR "${LIBRARY} links the CUDA driver: ${entry}")
  endif()
endforeach()

if(NM AND EXISTS "${NM}")
  execute_process(COMMAND "${NM}" -D --undefined-only "${LIBRARY}"
                  OUTPUT_VARIABLE undefined RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "nm -D --undefined-only ${LIBRARY} failed (${rc})")
  endif()
  string(REGEX MATCHALL "[ \t]cu[A-Z][A-Za-z0-9_]*" direct "${undefined}")
  if(direct)
    message(FATAL_ERROR "${LIBRARY} calls CUDA driver functions directly:${direct}")
  endif()
endif()

if(LDD AND EXISTS "${LDD}")
  execute_process(COMMAND "${LDD}" "${LIBRARY}" OUTPUT_VARIABLE resolved RESULT_VARIABLE rc)
  if(rc EQUAL 0 AND resolved MATCHES "libcuda")
    message(FATAL_ERROR "ldd shows libcuda among the dependencies of ${LIBRARY}:\n${resolved}")
  endif()
endif()
message(STATUS "${LIBRARY} does not link libcuda")
