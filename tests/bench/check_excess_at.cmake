# cmake -DEXCESS=<gvm-excess> -DDIR=<scratch dir> -P check_excess_at.cmake
# gvm-excess --at N reports the arena after event N instead of at the peak:
# the event's own figures (not the peak's), the growth it made, and clear
# errors for an event the trace does not have.
cmake_minimum_required(VERSION 3.25)
file(MAKE_DIRECTORY "${DIR}")
set(trace "${DIR}/at.trace")
# 8 MiB live, then 4 MiB freed and 6 MiB asked for: the peak is the last event.
file(WRITE "${trace}" "a 1 4194304 0\na 2 4194304 0\nf 1 0\na 3 6291456 0\n")

function(run_excess)
  execute_process(COMMAND "${EXCESS}" ${ARGN} "${trace}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(rc "${rc}" PARENT_SCOPE)
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

function(expect text haystack)
  string(FIND "${haystack}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "expected '${text}' in:\n${haystack}")
  endif()
endfunction()

run_excess(--at 2)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "gvm-excess --at 2 exited ${rc}: ${err}")
endif()
expect("At event 2 of 4 (allocate 4.0 MiB on stream 0): reserved " "${out}")
expect(", live 8.0 MiB. Peak reserved " "${out}")
expect("| at the event | MiB |" "${out}")
expect("The event: a request of 4.0 MiB grew reserved by" "${out}")
string(FIND "${out}" "| at the peak |" at)
if(NOT at EQUAL -1)
  message(FATAL_ERROR "--at reported the peak's table:\n${out}")
endif()

# Without --at: the peak's report, as before.
run_excess()
expect("after event 4 of 4 (allocate 6.0 MiB on stream 0); live then 10.0 MiB" "${out}")
expect("| at the peak | MiB |" "${out}")
# Block 1's chunk holds nothing when block 3 comes: the free chunk ends
# (bench/excess.hpp, ChunkEnds) count it whole, and no two chunks have free
# ends to pair.
expect("Free chunk ends before it: one chunk's free end and another's free start 0.0 MiB together (the largest end 0.0 MiB, start 0.0 MiB), chunks with nothing in use 4.0 MiB; the request made of those two chunks mapped again side by side would have needed 6.0 MiB of new memory." "${out}")

# Without VMM a segment cannot be mapped a second time: no free chunk ends.
run_excess(--conf no_vmm:true)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "gvm-excess --conf no_vmm:true exited ${rc}: ${err}")
endif()
expect("The growth that set the peak: a request of 6.0 MiB" "${out}")
string(FIND "${out}" "Free chunk ends" at)
if(NOT at EQUAL -1)
  message(FATAL_ERROR "free chunk ends reported without VMM:\n${out}")
endif()

foreach(bad 5 0 -1 x 2x)
  run_excess(--at ${bad})
  if(rc EQUAL 0)
    message(FATAL_ERROR "gvm-excess --at ${bad} exited 0:\n${out}")
  endif()
  if(bad STREQUAL "5")
    expect("--at 5: ${trace} has 4 events" "${err}")
  else()
    expect("--at: '${bad}' is not an event number (1 or more)" "${err}")
  endif()
endforeach()
message(STATUS "gvm-excess --at: all checks passed")
