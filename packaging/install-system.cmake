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
# Written to a directory of this install's own (not the build tree, which a root install
# would leave root-owned for the next one).
string(RANDOM LENGTH 8 _tag)
set(_tmp "$ENV{TMPDIR}")
if(NOT _tmp)
  set(_tmp "/tmp")
endif()
set(_unit_dir "${_tmp}/cuwarden-install-${_tag}")
configure_file("${CUW_SOURCE_DIR}/systemd/cuwardend.service.in" "${_unit_dir}/cuwardend.service" @ONLY)
file(INSTALL "${_unit_dir}/cuwardend.service" DESTINATION "${_unitdir}"
     FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
file(REMOVE_RECURSE "${_unit_dir}")
file(INSTALL "${CUW_SOURCE_DIR}/tmpfiles/cuwarden.conf" DESTINATION "${_tmpfilesdir}"
     FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
# An administrator's edited policy is kept: the example goes in only where there is none.
if(EXISTS "$ENV{DESTDIR}${_sysconfdir}/cuwarden/cuwarden.toml")
  message(STATUS "Keeping: $ENV{DESTDIR}${_sysconfdir}/cuwarden/cuwarden.toml")
else()
  file(INSTALL "${CUW_SOURCE_DIR}/examples/cuwarden.toml" DESTINATION "${_sysconfdir}/cuwarden"
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
endif()
