#!/usr/bin/env bash
# scripts/quiet_services.sh on a system image of its own (a temporary root with the four
# units installed and enabled, as their packages leave them): afterwards each one reads
# `disabled` to systemctl, and no enablement link is left. The machine's own units are not
# touched.
#
#   check_quiet_services.sh REPO
set -euo pipefail
REPO=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
units=(prometheus slurmctld slurmd munge)
mkdir -p "$T/lib/systemd/system" "$T/etc/systemd/system/multi-user.target.wants"
for u in "${units[@]}"; do
  printf '[Unit]\nDescription=%s\n[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n' "$u" \
    >"$T/lib/systemd/system/$u.service"
  ln -s "/lib/systemd/system/$u.service" "$T/etc/systemd/system/multi-user.target.wants/$u.service"
done
if command -v systemctl >/dev/null; then
  for u in "${units[@]}"; do
    [[ $(systemctl --root="$T" is-enabled "$u" 2>&1) == enabled ]] || fail "$u: not enabled to begin with"
  done
fi
"$REPO/scripts/quiet_services.sh" --root "$T"
for u in "${units[@]}"; do
  if command -v systemctl >/dev/null; then
    state=$(systemctl --root="$T" is-enabled "$u" 2>&1 || true)
    [[ $state == disabled ]] || fail "$u: systemctl is-enabled reads '$state'"
  fi
  [[ -z $(find "$T/etc/systemd/system" -name "$u.service") ]] || fail "$u: an enablement link is left"
  echo "ok: $u disabled, no link left"
done
# Run again on a quiet system: nothing to do, no error.
"$REPO/scripts/quiet_services.sh" --root "$T" >/dev/null
echo PASS
