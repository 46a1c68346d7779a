#!/usr/bin/env bash
# cuwarden: disable and stop the services that scripts/setup.sh's test packages bring
# (prometheus, slurmctld, slurmd, munge). The tests run their own instances on private
# configurations; a workstation should not start them at boot, nor keep them running, because
# the test suite needed their programs. Where systemd runs: `systemctl disable --now`.
# Elsewhere (a container, a chroot): their enablement links are removed (`systemctl --root`
# works offline; without systemctl, the .wants/ links are deleted by hand).
#
#   scripts/quiet_services.sh [--root DIR]    (DIR: act on the system image under DIR)
set -euo pipefail

UNITS=(prometheus slurmctld slurmd munge)
root=/
if [[ ${1:-} == --root ]]; then
  root=$2
fi

unit_file() {  # the unit's file under $root, if the package is installed
  local d
  for d in etc/systemd/system lib/systemd/system usr/lib/systemd/system; do
    [[ -e $root/$d/$1.service ]] && { echo "$root/$d/$1.service"; return 0; }
  done
  return 1
}

present=()
for u in "${UNITS[@]}"; do
  unit_file "$u" >/dev/null && present+=("$u")
done
[[ ${#present[@]} -gt 0 ]] || exit 0

if [[ $root == / && -d /run/systemd/system ]]; then
  echo "quiet_services: systemctl disable --now ${present[*]}"
  systemctl disable --now "${present[@]}"
elif command -v systemctl >/dev/null; then
  echo "quiet_services: no systemd running here; removing the enablement links of ${present[*]}"
  SYSTEMD_OFFLINE=1 systemctl --root="$root" --quiet disable "${present[@]}"
  # Their SysV scripts' links too, for an init that reads them (offline systemctl leaves them).
  if [[ $root == / ]] && command -v update-rc.d >/dev/null; then
    for u in "${present[@]}"; do
      [[ -e /etc/init.d/$u ]] && update-rc.d "$u" disable >/dev/null 2>&1 || true
    done
  fi
else
  echo "quiet_services: no systemctl; removing the .wants/ links of ${present[*]}"
  for u in "${present[@]}"; do
    rm -f "$root"/etc/systemd/system/*.wants/"$u".service
  done
fi
