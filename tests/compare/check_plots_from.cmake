# bench/compare/run --plots-from DIR (cmake -P script, used by tests/compare): draws the plots of an
# earlier run from DIR/results.csv. With matplotlib for PYTHON: exit status 0 and one PNG per
# collective and rank count of the sample; without it: exit status 2 and the install hint.
#   -DPYTHON=<python3> -DDRIVER=<bench/compare/run> -DSAMPLE=<results.csv> -DDIR=<scratch folder>
cmake_minimum_required(VERSION 3.20)
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
file(COPY_FILE "${SAMPLE}" "${DIR}/results.csv")
execute_process(COMMAND "${PYTHON}" -c "import matplotlib" RESULT_VARIABLE no_mpl OUTPUT_QUIET ERROR_QUIET)
execute_process(COMMAND "${PYTHON}" "${DRIVER}" --plots-from "${DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
message("${out}${err}")
if(no_mpl)
  if(NOT rc EQUAL 2 OR NOT "${out}${err}" MATCHES "matplotlib is not installed")
    message(FATAL_ERROR "without matplotlib: exit status ${rc}, expected 2 and the install hint")
  endif()
  return()
endif()
if(NOT rc EQUAL 0 OR NOT "${out}${err}" MATCHES "wrote 2 plot\\(s\\)")
  message(FATAL_ERROR "exit status ${rc}, expected 0 and 'wrote 2 plot(s)'")
endif()
foreach(png all_reduce-2ranks.png all_gather-2ranks.png)
  file(SIZE "${DIR}/${png}" bytes)
  if(bytes LESS 10000)
    message(FATAL_ERROR "${png}: ${bytes} bytes, not a plot")
  endif()
endforeach()
