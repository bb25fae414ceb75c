# Run by CTest before testing (a TEST_INCLUDE_FILES entry): lists one GoogleTest executable's
# cases and adds one CTest test per test suite, run as --gtest_filter=<suite>.*.
#
# Why not gtest_discover_tests' one process per case: every process loads LibTorch and its
# static initialisers (~0.6 s on this machine's two cores), which across ~850 cases, most of
# them serial, was a third of each suite's CTest time.
#
# Expects PIPETRAIN_TEST_EXE, PIPETRAIN_TEST_PREFIX, PIPETRAIN_TEST_TIMEOUT (seconds for one
# case), PIPETRAIN_TEST_SERIAL and PIPETRAIN_TEST_ENV (a ;-list of NAME=value).
if(NOT EXISTS "${PIPETRAIN_TEST_EXE}")
  add_test("${PIPETRAIN_TEST_PREFIX}NOT_BUILT" "${CMAKE_COMMAND}" -E echo "${PIPETRAIN_TEST_EXE} was not built")
  set_tests_properties("${PIPETRAIN_TEST_PREFIX}NOT_BUILT" PROPERTIES WILL_FAIL TRUE)
  return()
endif()
execute_process(COMMAND "${PIPETRAIN_TEST_EXE}" --gtest_list_tests
  OUTPUT_VARIABLE listing ERROR_VARIABLE listing_err RESULT_VARIABLE rc TIMEOUT 60)
if(NOT rc EQUAL 0)
  # A listing that fails is a failing test, not a silently empty layer.
  add_test("${PIPETRAIN_TEST_PREFIX}LIST_TESTS" "${PIPETRAIN_TEST_EXE}" --gtest_list_tests)
  return()
endif()
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(suite "")
set(suites "")
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ #][^ ]*)\\.( |$)")
    set(suite "${CMAKE_MATCH_1}")
    if(NOT suite MATCHES "^DISABLED_|/DISABLED_")
      list(APPEND suites "${suite}")
      set(cases_${suite} 0)
    else()
      set(suite "")
    endif()
  elseif(suite AND line MATCHES "^  ([^ #]+)")
    if(NOT CMAKE_MATCH_1 MATCHES "^DISABLED_")
      math(EXPR cases_${suite} "${cases_${suite}} + 1")
    endif()
  endif()
endforeach()
foreach(suite IN LISTS suites)
  if(cases_${suite} EQUAL 0)
    continue()
  endif()
  # One case's limit for the first, a third of it for each further one: the cases of a suite are
  # variations of one another, and a hang still ends within minutes.
  math(EXPR timeout "${PIPETRAIN_TEST_TIMEOUT} + (${cases_${suite}} - 1) * ${PIPETRAIN_TEST_TIMEOUT} / 3")
  if(timeout GREATER 1500)
    set(timeout 1500)
  endif()
  set(name "${PIPETRAIN_TEST_PREFIX}${suite}")
  add_test("${name}" "${PIPETRAIN_TEST_EXE}" "--gtest_filter=${suite}.*" --gtest_color=no)
  set_tests_properties("${name}" PROPERTIES TIMEOUT ${timeout} RUN_SERIAL ${PIPETRAIN_TEST_SERIAL}
                       ENVIRONMENT "${PIPETRAIN_TEST_ENV}" LABELS "${PIPETRAIN_TEST_PREFIX}")
endforeach()
