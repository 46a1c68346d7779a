# Read by ctest before any test runs (the tests directory's TEST_INCLUDE_FILES): a test sees
# only the cuwarden settings its own ENVIRONMENT gives it. A developer's shell may export them
# (scripts/env.sh sets CUWARDEN_FAKE_DEVICES, CUWARDEN_FAKE_MEMORY, CUWARDEN_FAKE_DIR and
# CUWARDEN_RUN_DIR; a user may set CUWARDEN_LIMIT or CUWARDEN_POOL), and a test that
# inherits them runs against another simulated GPU than it was written for.
# CUWARDEN_TEST_* are switches for the tests themselves (CUWARDEN_TEST_DPKG) and stay.
execute_process(COMMAND env OUTPUT_VARIABLE _cuw_env)
string(REGEX MATCHALL "(^|\n)CUWARDEN_[A-Z0-9_]*=" _cuw_names "${_cuw_env}")
foreach(_cuw_name IN LISTS _cuw_names)
  string(REGEX REPLACE "^\n?([A-Z0-9_]+)=$" "\\1" _cuw_name "${_cuw_name}")
  if(NOT _cuw_name MATCHES "^CUWARDEN_TEST_")
    unset(ENV{${_cuw_name}})
  endif()
endforeach()
