# cuwarden tests: every ctest test runs through tests/deadline.sh, which prints the stacks of
# a test that hangs (gdb, `thread apply all bt`, for the test and every process it started)
# 15 s before ctest's TIMEOUT would kill it silently. CMake 3.25 has neither TEST_LAUNCHER
# nor a timeout signal, so tests are added through these two functions instead of add_test
# and catch_discover_tests; tests.launcher (tests/scripts/check_launcher.py) fails for any
# test that does not start with the launcher or whose launcher has another timeout.
#
#   cuw_add_test(NAME name COMMAND cmd [arg...] [WORKING_DIRECTORY dir] [CONFIGURATIONS c...])
#       as add_test(NAME ...); an executable target as `cmd` is its file. The test's TIMEOUT,
#       set anywhere in the same directory, reaches the launcher as CUW_TEST_TIMEOUT.
#   cuw_catch_discover_tests(target [catch_discover_tests args...])
#       as catch_discover_tests; a TIMEOUT among its PROPERTIES reaches the launcher as
#       --timeout=N (the default timeout when there is none).
set(CUW_TEST_LAUNCHER ${CMAKE_CURRENT_LIST_DIR}/deadline.sh)

# ctest's timeout for a test without TIMEOUT (include(CTest) makes it a cache variable).
function(_cuw_default_timeout out)
  if(DART_TESTING_TIMEOUT)
    set(${out} ${DART_TESTING_TIMEOUT} PARENT_SCOPE)
  else()
    set(${out} 1500 PARENT_SCOPE)
  endif()
endfunction()

# Deferred to the end of the test's directory, after its set_tests_properties.
function(_cuw_test_timeout_env name)
  get_test_property(${name} TIMEOUT t)
  if(NOT t)
    _cuw_default_timeout(t)
  endif()
  set_property(TEST ${name} APPEND PROPERTY ENVIRONMENT "CUW_TEST_TIMEOUT=${t}")
endfunction()

function(cuw_add_test)
  # Arguments one by one (ARGV<n>), not through a list: an empty argument or one holding a
  # semicolon reaches add_test as it was written.
  set(code "add_test(")
  set(name "")
  set(next_is_name 0)
  set(next_is_command 0)
  math(EXPR last "${ARGC} - 1")
  foreach(n RANGE 0 ${last})
    set(arg "${ARGV${n}}")
    if(next_is_name)
      set(name "${arg}")
      set(next_is_name 0)
    elseif(next_is_command)
      set(next_is_command 0)
      if(TARGET "${arg}")
        get_target_property(type "${arg}" TYPE)
        if(type STREQUAL "EXECUTABLE")
          set(arg "$<TARGET_FILE:${arg}>")
        endif()
      endif()
      string(APPEND code " [==[${CUW_TEST_LAUNCHER}]==]")
    elseif(arg STREQUAL "NAME")
      set(next_is_name 1)
    elseif(arg STREQUAL "COMMAND")
      set(next_is_command 1)
    endif()
    string(APPEND code " [==[${arg}]==]")
  endforeach()
  string(APPEND code ")")
  if(name STREQUAL "")
    message(FATAL_ERROR "cuw_add_test: NAME is required")
  endif()
  cmake_language(EVAL CODE "${code}")
  # A deferred call's arguments are read when it runs: the name goes in as a literal.
  cmake_language(EVAL CODE "cmake_language(DEFER CALL _cuw_test_timeout_env [==[${name}]==])")
endfunction()

function(cuw_catch_discover_tests target)
  cmake_parse_arguments(C "" "" "PROPERTIES" ${ARGN})
  list(FIND C_PROPERTIES TIMEOUT at)
  if(at GREATER_EQUAL 0)
    math(EXPR at "${at} + 1")
    list(GET C_PROPERTIES ${at} t)
  else()
    _cuw_default_timeout(t)
  endif()
  set_property(TARGET ${target} PROPERTY CROSSCOMPILING_EMULATOR "${CUW_TEST_LAUNCHER};--timeout=${t}")
  catch_discover_tests(${target} ${ARGN})
endfunction()
