# cmake -DBUILD=<build dir> -DWORK=<scratch dir> -DGENERATOR=<gen> -DCXX=<compiler>
#       [-DSANITIZE=<flags>] -DSOURCE=<consumer project> -P check_install.cmake
# The README's install path as a consumer meets it: cmake --install into a
# fresh prefix, the installed gvm-info starts from there (its run path), and a
# project of its own finds the package with CMAKE_PREFIX_PATH, builds against
# it and runs.
cmake_minimum_required(VERSION 3.25)

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}${err}")
  endif()
  set(last_out "${out}" PARENT_SCOPE)
endfunction()

set(prefix "${WORK}/prefix")
file(REMOVE_RECURSE "${WORK}")
run("cmake --install" ${CMAKE_COMMAND} --install "${BUILD}" --prefix "${prefix}")

# Started from the prefix, with nothing in LD_LIBRARY_PATH.
run("the installed gvm-info" ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
    "${prefix}/bin/gvm-info" --sim h200 --devices 2)
if(NOT last_out MATCHES "0 -> 1: per_allocation")
  message(FATAL_ERROR "the installed gvm-info printed:\n${last_out}")
endif()
message(STATUS "installed gvm-info runs from ${prefix}/bin")

set(flags "")
if(SANITIZE)
  set(flags "-DCMAKE_CXX_FLAGS=-fsanitize=${SANITIZE}" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE}")
endif()
run("configuring the consumer" ${CMAKE_COMMAND} -S "${SOURCE}" -B "${WORK}/consumer" -G "${GENERATOR}"
    "-DCMAKE_CXX_COMPILER=${CXX}" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix}" ${flags})
run("building the consumer" ${CMAKE_COMMAND} --build "${WORK}/consumer")
run("the consumer" "${WORK}/consumer/consumer")
if(NOT last_out MATCHES "consumer ok")
  message(FATAL_ERROR "the consumer printed:\n${last_out}")
endif()
message(STATUS "a consumer project found the package in ${prefix}, built and ran")
