# cmake -DLOG=<build>/Testing/Temporary/LastTest.log -P tests/skip_summary.cmake
#
# Why the tests of the last CTest run were skipped, one line per reason:
#
#   skipped 127 tests: no CUDA driver found: libcuda.so.1: cannot open ... (e.g. Cuda/...)
#
# CTest itself prints only "***Skipped" (and hides a skipped test's output
# even with --output-on-failure); the reasons are in its log, each in the
# output of a test that CTest marked skipped. Every test of the project skips
# through SKIP_REGULAR_EXPRESSION, which the log marks "Skip regular expression
# found in output" (CTest 3.25 logs a SKIP_RETURN_CODE skip as "Test Passed.",
# so such a test would not be counted). A reason is, in the test's output:
#   - the line after GoogleTest's "<file>:<line>: Skipped" (GTEST_SKIP() << why),
#   - else the text after "GVM_SKIP: " (the CMake-script tests),
#   - else the text after "SKIPPED: " at the start of a line (python_cpu).
# Run by the workflow presets after their test step (CMakePresets.json), and by
# hand: cmake --build build --target gvm-skip-summary.
cmake_minimum_required(VERSION 3.25)

if(NOT EXISTS "${LOG}")
  message("No test log at ${LOG}: run the tests first (ctest --test-dir <build>).")
  return()
endif()
file(READ "${LOG}" text)
# Make the text safe to split into a list: CMake gives ';' and square brackets
# a meaning in lists.
string(REPLACE ";" "<semicolon>" text "${text}")
string(REPLACE "[" "<lb>" text "${text}")
string(REPLACE "]" "<rb>" text "${text}")
string(REPLACE "\n" ";" lines "${text}")

set(reasons "")  # distinct reasons, in order of first appearance
set(test "")
set(reason "")
set(previous "")
foreach(line IN LISTS lines)
  if(line MATCHES "^[0-9]+/[0-9]+ Testing: (.*)$")
    set(test "${CMAKE_MATCH_1}")
    set(reason "")
  elseif(line MATCHES "^Skip regular expression found in output")
    if(test)
      if(reason STREQUAL "")
        set(reason "(the test printed no reason)")
      endif()
      string(MD5 key "${reason}")
      if(NOT DEFINED count_${key})
        set(count_${key} 0)
        set(example_${key} "${test}")
        set(text_${key} "${reason}")
        list(APPEND reasons ${key})
      endif()
      math(EXPR count_${key} "${count_${key}} + 1")
      set(test "")
    endif()
  elseif(reason STREQUAL "")
    if(previous MATCHES ": Skipped$")
      set(reason "${line}")
    elseif(line MATCHES "GVM_SKIP: (.*)$")
      set(reason "${CMAKE_MATCH_1}")
    elseif(line MATCHES "^SKIPPED: (.*)$")
      set(reason "${CMAKE_MATCH_1}")
    endif()
  endif()
  set(previous "${line}")
endforeach()

if(reasons STREQUAL "")
  message("No test was skipped.")
  return()
endif()
message("Why tests were skipped (one line per reason; the full output is in ${LOG}):")
foreach(key IN LISTS reasons)
  set(n ${count_${key}})
  set(noun "tests")
  if(n EQUAL 1)
    set(noun "test")
  endif()
  set(line "  skipped ${n} ${noun}: ${text_${key}} (e.g. ${example_${key}})")
  string(REPLACE "<semicolon>" ";" line "${line}")
  string(REPLACE "<lb>" "[" line "${line}")
  string(REPLACE "<rb>" "]" line "${line}")
  message("${line}")
endforeach()
