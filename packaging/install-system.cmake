# Installs the files whose place or content depends on the prefix given at install time
# (`cmake --install build --prefix P`): the unit (its ExecStart names P/bin/cuwardend), the
# tmpfiles entry, /etc/cuwarden/cuwarden.toml. Prefix /usr: the system's directories (/etc,
# systemd's own); any other prefix: P/etc, P/lib/systemd/system, P/lib/tmpfiles.d (systemd
# reads the last two under /usr/local too). Variables from packaging/CMakeLists.txt.
set(_prefix "${CMAKE_INSTALL_PREFIX}")
if(_prefix STREQUAL "/usr")
  set(_sysconfdir "/etc")
  set(_unitdir "${CUW_SYSTEMD_UNITDIR}")
  set(_tmpfilesdir "${CUW_TMPFILESDIR}")
  if(NOT _unitdir)
    set(_unitdir "/usr/lib/systemd/system")
  endif()
  if(NOT _tmpfilesdir)
    set(_tmpfilesdir "/usr/lib/tmpfiles.d")
  endif()
else()
  set(_sysconfdir "${_prefix}/etc")
  set(_unitdir "${_prefix}/lib/systemd/system")
  set(_tmpfilesdir "${_prefix}/lib/tmpfiles.d")
endif()

set(CUW_BINDIR "${_prefix}/${CUW_BINDIR_REL}")
set(CUW_SYSCONFDIR "${_sysconfdir}")
configure_file("${CUW_SOURCE_DIR}/systemd/cuwardend.service.in" "${CUW_BINARY_DIR}/cuwardend.service" @ONLY)

file(INSTALL "${CUW_BINARY_DIR}/cuwardend.service" DESTINATION "${_unitdir}"
     FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
file(INSTALL "${CUW_SOURCE_DIR}/tmpfiles/cuwarden.conf" DESTINATION "${_tmpfilesdir}"
     FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
# An administrator's edited policy is kept: the example goes in only where there is none.
if(EXISTS "$ENV{DESTDIR}${_sysconfdir}/cuwarden/cuwarden.toml")
  message(STATUS "Keeping: $ENV{DESTDIR}${_sysconfdir}/cuwarden/cuwarden.toml")
else()
  file(INSTALL "${CUW_SOURCE_DIR}/examples/cuwarden.toml" DESTINATION "${_sysconfdir}/cuwarden"
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
endif()
