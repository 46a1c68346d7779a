# Writes cuwarden.1 and cuwardend.1 with help2man. cuwarden's page carries each subcommand's
# --help as a section; both pages' ENVIRONMENT section is the list of variables that
# `cuwarden run --help` prints (made from the options table, common/include/cuw/options.hpp).
# Called from packaging/CMakeLists.txt with HELP2MAN, CLI, DAEMON, OUT_DIR, SEE_ALSO.
file(MAKE_DIRECTORY "${OUT_DIR}")
set(_include "${OUT_DIR}/cuwarden-subcommands.h2m")
set(_daemon_include "${OUT_DIR}/cuwardend.h2m")
file(READ "${SEE_ALSO}" _common)
set(_text "[SUBCOMMANDS]\n")
foreach(sub run fit top events snapshot summary oom limit)
  execute_process(COMMAND "${CLI}" ${sub} --help OUTPUT_VARIABLE _help RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${CLI} ${sub} --help exited ${_rc}")
  endif()
  if(sub STREQUAL "run")
    # "  CUWARDEN_X (--flag): values; default D" then "      doc line", for each variable.
    string(REGEX MATCH "\n  CUWARDEN_.*" _env "${_help}")
    if(NOT _env)
      message(FATAL_ERROR "${CLI} run --help lists no CUWARDEN_ variables")
    endif()
    # roff: backslashes are escapes, "\-" is a minus; each variable a tagged paragraph.
    string(REPLACE "\\" "\\e" _env "${_env}")
    string(REPLACE "-" "\\-" _env "${_env}")
    string(REGEX REPLACE "\n  (CUWARDEN_[A-Z_]+)([^\n]*)\n      ([^\n]*)" "\n.TP\n\\\\fB\\1\\\\fR\\2\n\\\\&\\3"
           _env "${_env}")
    set(_environment "[ENVIRONMENT]\nRead by the preloaded library at the program's first CUDA call; ")
    string(APPEND _environment "\\fBcuwarden run\\fR sets\nthose that have a flag:${_env}\n\n")
  endif()
  # roff: a leading dot or quote would be a request; backslashes are escapes.
  string(REPLACE "\\" "\\e" _help "${_help}")
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" _help "${_help}")
  string(APPEND _text ".SS \"cuwarden ${sub}\"\n.nf\n${_help}.fi\n")
endforeach()
file(WRITE "${_include}" "${_text}\n${_environment}${_common}")
file(WRITE "${_daemon_include}" "${_environment}${_common}")

foreach(page cuwarden cuwardend)
  if(page STREQUAL "cuwarden")
    set(_exe "${CLI}")
    set(_name "GPU memory caps and accounting for processes you did not build")
    set(_extra --include "${_include}")
  else()
    set(_exe "${DAEMON}")
    set(_name "the cuwarden daemon: collects what interposed processes do")
    set(_extra --include "${_daemon_include}")
  endif()
  execute_process(
    COMMAND "${HELP2MAN}" --no-info --no-discard-stderr --section=1 "--name=${_name}"
            ${_extra} "--output=${OUT_DIR}/${page}.1.tmp" "${_exe}"
    RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "help2man ${page} exited ${_rc}")
  endif()
  # help2man writes the path it ran (build/bin/...) into the usage lines: the page names the command.
  file(READ "${OUT_DIR}/${page}.1.tmp" _man)
  string(REPLACE "${_exe}" "${page}" _man "${_man}")
  string(REPLACE "\\fI\\,${_exe}\\/\\fR" "\\fB${page}\\fR" _man "${_man}")
  file(WRITE "${OUT_DIR}/${page}.1" "${_man}")
  file(REMOVE "${OUT_DIR}/${page}.1.tmp")
endforeach()
