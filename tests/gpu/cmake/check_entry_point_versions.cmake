# cmake -DSOURCE=vmm/src/cuda_driver.cpp -DINCLUDE=<CUDA include dir>
#       -P check_entry_point_versions.cmake
#
# CudaDriver asks cuGetProcAddress for each entry point as of CUDA_VERSION and
# calls it through the type of the unversioned <cuda.h> declaration. That is
# only right while the two agree. They disagree when a CUDA release registers
# a new ABI under the old name but keeps the old declaration, as CUDA 13.0 did
# with cuCtxSynchronize (PFN_cuCtxSynchronize_v13000 takes a CUcontext). Such
# entry points must be asked for at an older version in requested_version().
# This fails when an entry point in GVM_CUDA_ENTRY_POINTS has a typedef newer
# than 12.0 in cudaTypedefs.h, <cuda.h> does not #define its name to a
# versioned symbol (the way cuMemAlloc becomes cuMemAlloc_v2), and
# requested_version() does not name it: a header upgrade or a new entry point
# cannot slip past unnoticed.
cmake_minimum_required(VERSION 3.25)
if(NOT EXISTS "${INCLUDE}/cudaTypedefs.h" OR NOT EXISTS "${INCLUDE}/cuda.h")
  message("GVM_SKIP: no cuda.h and cudaTypedefs.h in '${INCLUDE}'")
  return()
endif()
file(READ "${SOURCE}" source)
file(READ "${INCLUDE}/cudaTypedefs.h" typedefs)
file(READ "${INCLUDE}/cuda.h" cuda_h)

string(REGEX MATCH "#define GVM_CUDA_ENTRY_POINTS\\(X\\)[^\n]*\n(([^\n]*\\\\\n)*[^\n]*)" block "${source}")
string(REGEX MATCHALL "X\\((cu[A-Za-z0-9_]+)\\)" entries "${block}")
list(LENGTH entries count)
if(count LESS 10)
  message(FATAL_ERROR "found only ${count} entry points in GVM_CUDA_ENTRY_POINTS of ${SOURCE}")
endif()
string(REGEX MATCHALL "name == \"(cu[A-Za-z0-9_]+)\"" handled "${source}")

set(problems "")
foreach(entry IN LISTS entries)
  string(REGEX REPLACE "X\\((cu[A-Za-z0-9_]+)\\)" "\\1" name "${entry}")
  string(REGEX MATCHALL "PFN_${name}_v([0-9]+)\\)" versions "${typedefs}")
  if(NOT versions)
    string(APPEND problems "\n  ${name}: no PFN_${name}_v* typedef in cudaTypedefs.h")
    continue()
  endif()
  set(newest 0)
  foreach(v IN LISTS versions)
    string(REGEX REPLACE ".*_v([0-9]+)\\)" "\\1" n "${v}")
    if(n GREATER newest)
      set(newest ${n})
    endif()
  endforeach()
  string(REGEX MATCH "#define[ \t]+${name}[ \t]" mapped "${cuda_h}")
  if(newest GREATER 12000 AND NOT mapped AND NOT "name == \"${name}\"" IN_LIST handled)
    string(APPEND problems "\n  ${name}: cudaTypedefs.h has version ${newest} but <cuda.h> "
                           "declares it unversioned: ask for the declared ABI in requested_version()")
  endif()
endforeach()
if(problems)
  message(FATAL_ERROR "entry points whose ABI may not match their declaration:${problems}")
endif()
message(STATUS "${count} entry points checked against cudaTypedefs.h")
