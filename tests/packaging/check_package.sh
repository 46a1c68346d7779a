#!/usr/bin/env bash
# scripts/package.sh builds the .deb (lintian: no error, no warning left unexplained); its
# contents and control data are what a system needs. With CUWARDEN_TEST_DPKG=1 (CI, as root,
# cuwarden not installed) it is installed, used, removed and purged for real.
#
#   check_package.sh REPO BUILD_DIR ALLOC_LOOP FAKECUDA_DIR
set -euo pipefail
REPO=$1 BUILD=$2 ALLOC_LOOP=$3 FAKECUDA=$4
fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in dpkg-deb dpkg-shlibdeps lintian; do
  command -v $tool >/dev/null || { echo "skip: $tool not installed (scripts/setup.sh)"; exit 77; }
done

T=$(mktemp -d "${TMPDIR:-/tmp}/cuwt-package.XXXXXX")
trap 'rm -rf "$T"' EXIT
deb=$(BUILD_DIR=$BUILD OUT_DIR=$T "$REPO/scripts/package.sh" 2>"$T/lintian.log") \
  || { cat "$T/lintian.log"; fail "scripts/package.sh"; }
grep -E '^[EW]: ' "$T/lintian.log" && fail "lintian reported the errors or warnings above"
echo "ok: $(basename "$deb"), lintian: no error or warning"


dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|; s|/$||' >"$T/files"
for f in /usr/bin/cuwarden /usr/bin/cuwardend '/usr/lib/[^/]+/cuwarden/libcuwarden.so' \
         '/usr/lib/[^/]+/cuwarden/cuwarden_spank.so' /usr/share/cuwarden/slurm/cuwarden-taskprolog.sh \
         /etc/cuwarden/cuwarden.toml /usr/share/doc/cuwarden/copyright /usr/share/doc/cuwarden/changelog.Debian.gz \
         /usr/share/doc/cuwarden/examples/cuwarden.toml /usr/share/man/man1/cuwarden.1.gz /usr/share/man/man1/cuwardend.1.gz \
         /usr/share/bash-completion/completions/cuwarden /usr/lib/tmpfiles.d/cuwarden.conf '(/usr)?/lib/systemd/system/cuwardend.service' \
         /usr/share/cuwarden/web/index.html /usr/share/cuwarden/web/uPlot.iife.min.js \
         /usr/share/cuwarden/web/d3.min.js /usr/share/cuwarden/web/d3-flamegraph.min.js /usr/share/cuwarden/web/flame.js \
         /usr/share/cuwarden/grafana/cuwarden.json /usr/share/cuwarden/prometheus/cuwarden.rules.yml; do
  grep -Eqx -- "$f" "$T/files" || fail "not in the package: $f"
done
! grep -q '^/dev' "$T/files" || fail "the package ships files under /dev"
unit=$(grep 'systemd/system/cuwardend.service$' "$T/files")
dpkg-deb --fsys-tarfile "$deb" | tar -xO ".$unit" | grep -qx 'ExecStart="/usr/bin/cuwardend" --config "/etc/cuwarden/cuwarden.toml" --http 127.0.0.1:9477' \
  || fail "the unit's ExecStart is not /usr/bin/cuwardend"
[[ $(dpkg-deb -f "$deb" Package) == cuwarden ]] || fail "Package field"
[[ $(dpkg-deb -f "$deb" Depends) == *libc6* ]] || fail "Depends lacks libc6: $(dpkg-deb -f "$deb" Depends)"
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | grep -qx /etc/cuwarden/cuwarden.toml || fail "conffiles"
# Listed once into a file: `grep -q` on the pipe would exit at its first match and, under
# pipefail, fail the pipeline through tar's SIGPIPE.
dpkg-deb --ctrl-tarfile "$deb" | tar -t >"$T/control"
for s in postinst prerm postrm md5sums; do
  grep -qx "./$s" "$T/control" || fail "no $s in the control archive"
done
# Stripped: no debug sections in what is installed on every node.
dpkg-deb -x "$deb" "$T/root"
for elf in "$T"/root/usr/bin/* "$T"/root/usr/lib/*/cuwarden/libcuwarden.so; do
  ! readelf -S "$elf" | grep -q '\.debug_' || fail "$elf is not stripped"
done
echo "ok: contents and control data"

if [[ ${CUWARDEN_TEST_DPKG:-0} != 1 ]]; then
  echo "skip: dpkg -i (set CUWARDEN_TEST_DPKG=1 as root on a throwaway machine; CI does)"
  echo PASS
  exit 0
fi
[[ $(id -u) == 0 ]] || fail "CUWARDEN_TEST_DPKG=1 needs root"
! dpkg-query -W cuwarden >/dev/null 2>&1 || fail "cuwarden is already installed here; not touching it"
# The run directory as on a machine that never had it (the postinst makes it), put back after.
aside=""
if [[ -e /dev/shm/cuwarden ]]; then
  aside=/dev/shm/cuwarden.aside.$$
  mv /dev/shm/cuwarden "$aside"
fi
restore() {
  dpkg -P cuwarden >/dev/null 2>&1 || true
  if [[ -n $aside ]]; then rm -rf /dev/shm/cuwarden; mv "$aside" /dev/shm/cuwarden; fi
  rm -rf "$T"
}
trap restore EXIT
dpkg -i "$deb" >"$T/dpkg.log" 2>&1 || { cat "$T/dpkg.log"; fail "dpkg -i"; }
[[ -d /dev/shm/cuwarden && ! -L /dev/shm/cuwarden && $(stat -c '%a %U' /dev/shm/cuwarden) == "1777 root" ]] \
  || fail "postinst did not create /dev/shm/cuwarden 1777 root"
out=$(printf 'alloc 48\nalloc 32\n' | env -u CUWARDEN_LIB LD_LIBRARY_PATH="$FAKECUDA" CUWARDEN_FAKE_DEVICES=1 \
      CUWARDEN_FAKE_MEMORY=1G CUWARDEN_RUN_DIR="$T/run" cuwarden run --limit 64M -- "$ALLOC_LOOP" | tr '\n' ' ')
[[ $out == "ready "*" ok refused " ]] || fail "installed package: '$out'"
[[ $(command -v cuwarden) == /usr/bin/cuwarden ]] || fail "cuwarden is $(command -v cuwarden)"
man -w cuwarden >/dev/null 2>&1 || ! command -v man >/dev/null || fail "man cuwarden not found"
echo "ok: installed; /usr/bin/cuwarden run --limit 64M caps"
# A policy the daemon would refuse: the postinst names the line, says what to change, and
# does not restart the daemon.
cp /etc/cuwarden/cuwarden.toml "$T/policy.keep"
printf '[default]\nlimit = 5\n' >/etc/cuwarden/cuwarden.toml
out=$(/var/lib/dpkg/info/cuwarden.postinst configure 0.1.0-1 2>&1) || fail "postinst failed on a bad policy: $out"
[[ $out == *'cuwarden.toml:2:9: limit = 5 is 5 bytes'* && $out == *'was not (re)started'* ]] \
  || fail "postinst on a bad policy: $out"
cp "$T/policy.keep" /etc/cuwarden/cuwarden.toml
/usr/bin/cuwardend --check-config --config /etc/cuwarden/cuwarden.toml >/dev/null || fail "the shipped policy fails its check"
echo "ok: the postinst checks the policy before restarting the daemon"
echo '# edited' >>/etc/cuwarden/cuwarden.toml
dpkg -r cuwarden >"$T/dpkg.log" 2>&1 || { cat "$T/dpkg.log"; fail "dpkg -r"; }
[[ ! -e /usr/bin/cuwarden && ! -e /usr/bin/cuwardend ]] || fail "binaries left after dpkg -r"
grep -q '^# edited' /etc/cuwarden/cuwarden.toml || fail "dpkg -r removed the edited conffile"
[[ -d /dev/shm/cuwarden ]] || fail "dpkg -r removed the run directory (running programs use it)"
dpkg -P cuwarden >"$T/dpkg.log" 2>&1 || { cat "$T/dpkg.log"; fail "dpkg -P"; }
[[ ! -e /etc/cuwarden/cuwarden.toml ]] || fail "dpkg -P left /etc/cuwarden/cuwarden.toml"
dpkg-query -W cuwarden >/dev/null 2>&1 && fail "still known to dpkg after purge"
echo "ok: removed (conffile and run directory kept), purged"
echo PASS
