# cmake -DTOOL=<program> -DDOC=<page.md> -DNAME=<block> [-DWRITE=ON] -P tools/doc_block.cmake
#
# A generated block of a documentation page: what TOOL prints stands between
# "<!-- NAME:begin -->" and "<!-- NAME:end -->" in DOC. Without WRITE: fails,
# showing both, when the page holds anything else (so figures in the docs are
# the ones a run gives now). With WRITE=ON: puts TOOL's output there.
cmake_minimum_required(VERSION 3.25)
execute_process(COMMAND "${TOOL}" RESULT_VARIABLE rc OUTPUT_VARIABLE generated ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${TOOL} failed (${rc}):\n${err}")
endif()
file(READ "${DOC}" page)
set(begin "<!-- ${NAME}:begin -->\n")
set(end "<!-- ${NAME}:end -->")
string(FIND "${page}" "${begin}" b)
string(FIND "${page}" "${end}" e)
if(b EQUAL -1 OR e EQUAL -1 OR e LESS b)
  message(FATAL_ERROR "${DOC} has no block ${begin}...${end}")
endif()
string(LENGTH "${begin}" begin_length)
math(EXPR start "${b} + ${begin_length}")
math(EXPR length "${e} - ${start}")
string(SUBSTRING "${page}" ${start} ${length} held)
if(WRITE)
  string(SUBSTRING "${page}" 0 ${start} head)
  string(SUBSTRING "${page}" ${e} -1 tail)
  file(WRITE "${DOC}" "${head}${generated}${tail}")
  message(STATUS "${DOC}: block ${NAME} written")
elseif(NOT held STREQUAL generated)
  message(FATAL_ERROR "${DOC}, block ${NAME}, is not what ${TOOL} prints now.\n"
                      "The page holds:\n${held}\nA run gives:\n${generated}\n"
                      "Regenerate it: cmake --build <build> --target gvm-docs-figures")
else()
  message(STATUS "${DOC}: block ${NAME} is current")
endif()
