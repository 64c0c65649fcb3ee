# Run by ctest (a directory's TEST_INCLUDE_FILES), not by the build: lists a GoogleTest binary's test
# suites and adds one ctest test per suite, `binary --gtest_filter=Suite.*`.
#
# One process per suite rather than per test (gtest_discover_tests' way): every process that links
# LibTorch spends about 0.4 s starting (0.2 s of it registering the CUDA kernels even where no GPU
# is), and a test binary builds its shared fixtures once per process, so per-test processes made
# that overhead a third of the suite. ctest still runs suites in parallel, and a failure's output
# names the failing test. The list is cached beside the binary and read again only when the binary
# changes.
#
# colossal_gtest_suites(BINARY LIST_FILE LABEL PROCESSORS WORKDIR ENVIRONMENT)
function(colossal_gtest_suites binary list_file label processors workdir environment)
  if(NOT EXISTS "${binary}")
    add_test(${label}_tests_not_built "${binary}")   # fails, naming the missing binary
    return()
  endif()
  if(NOT EXISTS "${list_file}" OR "${binary}" IS_NEWER_THAN "${list_file}")
    execute_process(COMMAND "${binary}" --gtest_list_tests WORKING_DIRECTORY "${workdir}"
                    OUTPUT_VARIABLE listing RESULT_VARIABLE rc TIMEOUT 120)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${binary} --gtest_list_tests failed (${rc}): ${listing}")
    endif()
    set(script "")
    string(REPLACE "\n" ";" lines "${listing}")
    foreach(line IN LISTS lines)
      # Suite lines start in column 0 and end in '.' (a typed suite adds "  # TypeParam = ...").
      if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
        set(suite "${CMAKE_MATCH_1}")
        string(APPEND script "add_test([==[${suite}]==] [==[${binary}]==] [==[--gtest_filter=${suite}.*]==])\n")
        string(APPEND script "set_tests_properties([==[${suite}]==] PROPERTIES LABELS ${label} PROCESSORS ${processors}"
                             " SKIP_RETURN_CODE 77 WORKING_DIRECTORY [==[${workdir}]==]")
        # Suites named for the GPU (Cuda*, *OnGpu) see it; every other suite checks the CPU's behaviour
        # and exactness, so on a GPU machine it runs as on a CPU one: "auto" devices resolve to the CPU.
        set(suite_environment "${environment}")
        if(NOT suite MATCHES "^Cuda|OnGpu$")
          list(APPEND suite_environment "CUDA_VISIBLE_DEVICES=")
        endif()
        string(APPEND script " ENVIRONMENT [==[${suite_environment}]==]")
        string(APPEND script ")\n")
      endif()
    endforeach()
    file(WRITE "${list_file}" "${script}")
  endif()
  include("${list_file}")
endfunction()
