#!/usr/bin/env bash
# cuwarden: build the Debian package from an existing build (no second build): stage it with
# `cmake --install --prefix /usr --strip`, let Debian's tools write the control data
# (dpkg-shlibdeps, dpkg-gencontrol), build it with dpkg-deb, check it with lintian.
#
#   scripts/package.sh                         # build/ (built first when it is missing)
#   BUILD_DIR=some/build OUT_DIR=dist scripts/package.sh
#
# Prints the path of the .deb. Exit 1 when lintian reports an error or a warning that
# packaging/debian/lintian-overrides does not explain. The maintainer written into the
# package: DEBFULLNAME and DEBEMAIL, as Debian's own tools read them.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
BUILD=${BUILD_DIR:-build}
OUT=${OUT_DIR:-$BUILD/package}
MAINTAINER="${DEBFULLNAME:-cuwarden developers} <${DEBEMAIL:-cuwarden-dev@example.org}>"

for tool in dpkg-deb dpkg-shlibdeps dpkg-gencontrol lintian; do
  command -v "$tool" >/dev/null || { echo "package: $tool not found (scripts/setup.sh installs it)" >&2; exit 1; }
done
if [[ ! -x $BUILD/bin/cuwarden ]]; then
  if [[ $BUILD == build ]]; then
    scripts/build.sh
  else
    echo "package: no build in $BUILD (scripts/build.sh makes build/)" >&2
    exit 1
  fi
fi
VERSION=$("$BUILD/bin/cuwarden" --version | awk '{print $2}')-1
ARCH=$(dpkg --print-architecture)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-package.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
ROOT=$WORK/cuwarden
DESTDIR=$ROOT cmake --install "$BUILD" --prefix /usr --strip >"$WORK/install.log" || {
  cat "$WORK/install.log" >&2; exit 1; }
[[ -e $ROOT/usr/share/man/man1/cuwarden.1 ]] || { echo "package: no man pages in the build (install help2man, reconfigure)" >&2; exit 1; }

# Debian's places for what cmake installs elsewhere, and the files every package carries.
DOC=$ROOT/usr/share/doc/cuwarden
install -d "$DOC" "$ROOT/usr/share/lintian/overrides" "$ROOT/DEBIAN"
gzip -9n "$ROOT"/usr/share/man/man1/*.1
install -m 644 packaging/debian/copyright "$DOC/copyright"
esc() { printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'; }  # for a sed replacement between |
sed -e "s/@VERSION@/$VERSION/" -e "s|@MAINTAINER@|$(esc "$MAINTAINER")|" \
    -e "s/@DATE@/$(date -R -d "@$(git log -1 --format=%ct 2>/dev/null || date +%s)")/" \
    packaging/debian/changelog.in | gzip -9n >"$DOC/changelog.Debian.gz"
install -m 644 packaging/debian/lintian-overrides "$ROOT/usr/share/lintian/overrides/cuwarden"
for s in postinst prerm postrm; do install -m 755 "packaging/debian/$s" "$ROOT/DEBIAN/$s"; done
(cd "$ROOT" && find etc -type f -printf '/%p\n' | sort) >"$ROOT/DEBIAN/conffiles"

# Control data, from a throwaway source tree for the dpkg tools.
SRC=$WORK/src
install -d "$SRC/debian"
sed "s|@MAINTAINER@|$(esc "$MAINTAINER")|" packaging/debian/control >"$SRC/debian/control"
zcat "$DOC/changelog.Debian.gz" >"$SRC/debian/changelog"
mapfile -t elves < <(cd "$ROOT" && find usr -type f \( -path 'usr/bin/*' -o -name '*.so' \) | sort)
(cd "$SRC" && dpkg-shlibdeps -T"$WORK/substvars" "${elves[@]/#/$ROOT/}")
(cd "$SRC" && dpkg-gencontrol -pcuwarden -T"$WORK/substvars" -P"$ROOT" -f"$WORK/files" -Vmisc:Depends=)
# md5sums: every file but the conffiles, which dpkg checks on its own (as dh_md5sums does).
(cd "$ROOT" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) \
  >"$ROOT/DEBIAN/md5sums"
chmod 644 "$ROOT/DEBIAN/md5sums" "$ROOT/DEBIAN/conffiles" "$ROOT/DEBIAN/control"

mkdir -p "$OUT"
DEB=$OUT/cuwarden_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group -Zxz --build "$ROOT" "$DEB" >/dev/null
lintian --fail-on error,warning "$DEB" >&2
echo "$DEB"
