#!/usr/bin/env bash
# cmake --install into a fresh prefix, then use what it laid out as a user would: the
# installed `cuwarden run` finds the installed library and caps a program; the daemon starts
# on the example policy (as shipped, and with every example uncommented); the unit passes
# `systemd-analyze verify`; tmpfiles creates the run directory 1777 root; the man pages
# render without warnings; bash completion completes. A moved prefix still works.
#
#   check_install.sh BUILD_DIR ALLOC_LOOP FAKECUDA_DIR
set -euo pipefail
BUILD=$1 ALLOC_LOOP=$2 FAKECUDA=$3

T=$(mktemp -d "${TMPDIR:-/tmp}/cuwt-install.XXXXXX")
DAEMON_PID=""
cleanup() {
  [[ -n $DAEMON_PID ]] && kill "$DAEMON_PID" 2>/dev/null && wait "$DAEMON_PID" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

P=$T/prefix
cmake --install "$BUILD" --prefix "$P" >"$T/install.log" || { cat "$T/install.log"; fail "cmake --install"; }

lib=$(find "$P/lib" -name libcuwarden.so -path '*/cuwarden/*')
[[ -n $lib ]] || fail "no lib/<triplet>/cuwarden/libcuwarden.so in $P"
for f in bin/cuwarden bin/cuwardend lib/systemd/system/cuwardend.service lib/tmpfiles.d/cuwarden.conf \
         etc/cuwarden/cuwarden.toml share/doc/cuwarden/examples/cuwarden.toml \
         share/man/man1/cuwarden.1 share/man/man1/cuwardend.1 \
         share/bash-completion/completions/cuwarden share/bash-completion/completions/cuwardend \
         share/cuwarden/web/index.html share/cuwarden/web/uPlot.iife.min.js share/cuwarden/web/LICENSE \
         share/cuwarden/web/app.js share/cuwarden/web/flame.js share/cuwarden/web/d3.min.js \
         share/cuwarden/web/d3-flamegraph.min.js share/cuwarden/web/d3.LICENSE share/cuwarden/web/d3-flame-graph.LICENSE \
         share/cuwarden/grafana/cuwarden.json share/cuwarden/prometheus/prometheus.yml \
         share/cuwarden/prometheus/cuwarden.rules.yml; do
  [[ -e $P/$f ]] || fail "not installed: $f"
done
[[ $(stat -c %a "$lib") == 644 ]] || fail "library mode $(stat -c %a "$lib"), want 644"
grep -qx "ExecStart=\"$P/bin/cuwardend\" --config \"$P/etc/cuwarden/cuwarden.toml\" --http 127.0.0.1:9477" "$P/lib/systemd/system/cuwardend.service" \
  || fail "unit's ExecStart does not name this prefix: $(grep ExecStart "$P/lib/systemd/system/cuwardend.service")"
grep -qx 'RuntimeDirectory=cuwarden' "$P/lib/systemd/system/cuwardend.service" \
  || fail "the unit does not make the socket's directory /run/cuwarden (RuntimeDirectory=cuwarden)"
for bad in PrivateDevices DynamicUser ProtectProc; do
  ! grep -q "^$bad=" "$P/lib/systemd/system/cuwardend.service" || fail "unit sets $bad="
done
echo "ok: layout ($lib)"

if command -v systemd-analyze >/dev/null; then
  MANPATH=$P/share/man systemd-analyze verify "$P/lib/systemd/system/cuwardend.service" 2>"$T/verify.log" \
    || { cat "$T/verify.log"; fail "systemd-analyze verify"; }
  [[ ! -s $T/verify.log ]] || { cat "$T/verify.log"; fail "systemd-analyze verify warned"; }
  echo "ok: systemd-analyze verify"
  # The sandbox's exposure, as systemd scores it: at most 3.0 ("OK").
  systemd-analyze security --offline=yes --threshold=30 "$P/lib/systemd/system/cuwardend.service" >"$T/security.log" 2>&1 \
    || { cat "$T/security.log"; fail "systemd-analyze security scores the unit over 3.0"; }
  echo "ok: systemd-analyze security: $(grep -o 'exposure level.*' "$T/security.log")"
else
  echo "skip: systemd-analyze not installed"
fi
# An edited policy survives a second install.
echo '# edited' >>"$P/etc/cuwarden/cuwarden.toml"
cmake --install "$BUILD" --prefix "$P" >/dev/null
grep -q '^# edited' "$P/etc/cuwarden/cuwarden.toml" || fail "a second install replaced the edited policy"
echo "ok: an edited policy is kept"

# Move the prefix: nothing in it may point at the build tree or the old prefix.
mv "$P" "$T/moved"
P=$T/moved
export CUWARDEN_RUN_DIR=$T/run
unset CUWARDEN_LIB CUWARDEN_LIMIT
preload=$("$P/bin/cuwarden" run -- sh -c 'echo "$LD_PRELOAD"')
[[ $preload == "$P"/lib/*/cuwarden/libcuwarden.so ]] || fail "cuwarden run preloads '$preload', not the installed library"
out=$(printf 'alloc 48\nalloc 32\nalloc 8\n' |
      LD_LIBRARY_PATH=$FAKECUDA CUWARDEN_FAKE_DEVICES=1 CUWARDEN_FAKE_MEMORY=1G \
      "$P/bin/cuwarden" run --limit 64M -- "$ALLOC_LOOP" | tr '\n' ' ')
[[ $out == "ready "*" ok refused ok " ]] || fail "under --limit 64M: '$out' (want: ok refused ok)"
echo "ok: installed cuwarden run --limit 64M caps the program ($out)"

start_daemon() {  # policy file
  "$P/bin/cuwardend" --config "$1" --run-dir "$T/run" --no-nvml >>"$T/d.log" 2>&1 &
  DAEMON_PID=$!
  for _ in $(seq 1 600); do
    [[ -S $T/run/daemon/cuwardend.sock ]] && return 0
    kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$T/d.log"; fail "cuwardend exited on $1"; }
    sleep 0.05
  done
  fail "cuwardend did not listen"
}
stop_daemon() { kill "$DAEMON_PID"; wait "$DAEMON_PID" || true; DAEMON_PID=""; }
start_daemon "$P/etc/cuwarden/cuwarden.toml"; stop_daemon
# The moved prefix's daemon serves its own web page (share/cuwarden/web beside bin/).
"$P/bin/cuwardend" --run-dir "$T/run-http" --no-nvml --http 127.0.0.1:0 >"$T/http.log" 2>&1 &
HTTP_PID=$!
port=""
for _ in $(seq 1 600); do
  port=$(sed -n 's/.*serving HTTP on .* (port \([0-9]*\)).*/\1/p' "$T/http.log")
  [[ -n $port ]] && break
  sleep 0.05
done
[[ -n $port ]] || { cat "$T/http.log"; fail "cuwardend --http did not listen"; }
page=$(python3 -c "import sys, urllib.request as u; print(u.urlopen('http://127.0.0.1:$port/').read().decode())") || page=""
js=$(python3 -c "import urllib.request as u; print(len(u.urlopen('http://127.0.0.1:$port/uPlot.iife.min.js').read()))") || js=0
kill "$HTTP_PID"; wait "$HTTP_PID" || true
[[ $page == *uPlot.iife.min.js* && $js -gt 10000 ]] || fail "the installed daemon's / and /uPlot.iife.min.js (page: ${page:0:80}, js: $js bytes)"
echo "ok: the installed daemon serves the web page and uPlot from share/cuwarden/web"
sed -E 's/^# (\[|[a-z_]+ = )/\1/' "$P/share/doc/cuwarden/examples/cuwarden.toml" >"$T/all.toml"
grep -q '^max_limit = ' "$T/all.toml" || fail "uncommenting the example found no key"
start_daemon "$T/all.toml"
stop_daemon
! grep -qi 'error' "$T/d.log" || { cat "$T/d.log"; fail "the uncommented example policy logs an error"; }
echo "ok: cuwardend starts on the example policy, as shipped and uncommented"

if command -v systemd-tmpfiles >/dev/null; then
  systemd-tmpfiles --create --root="$T/root" "$P/lib/tmpfiles.d/cuwarden.conf"
  want="1777 root"
  [[ $(id -u) == 0 ]] || want="1777 $(id -un)"  # only root can give it to root
  [[ $(stat -c '%a %U' "$T/root/dev/shm/cuwarden") == "$want" ]] \
    || fail "tmpfiles made $(stat -c '%a %U' "$T/root/dev/shm/cuwarden"), want $want"
  echo "ok: tmpfiles creates /dev/shm/cuwarden ($want)"
else
  echo "skip: systemd-tmpfiles not installed"
fi

if command -v man >/dev/null; then
  for page in cuwarden cuwardend; do
    warn=$(LC_ALL=C.UTF-8 MANROFFSEQ='' MANWIDTH=80 man --warnings -E UTF-8 -l -Tutf8 -Z "$P/share/man/man1/$page.1" 2>&1 >/dev/null)
    [[ -z $warn ]] || fail "man $page: $warn"
    text=$(MANWIDTH=100 man -l "$P/share/man/man1/$page.1" 2>/dev/null)
    [[ $text == *"$page "* && $text == *--help* ]] || fail "man $page does not show --help's options"
  done
  MANWIDTH=100 man -l "$P/share/man/man1/cuwarden.1" | grep -q -- '--job-limit' || fail "man cuwarden lacks run's options"
  echo "ok: man pages"
fi

if [[ -r /usr/share/bash-completion/bash_completion ]]; then
  # The completion asks the installed cuwarden for its fields and flags.
  got=$(PATH="$P/bin:$PATH" bash -c '
    source /usr/share/bash-completion/bash_completion
    source "$1"
    compopt() { :; }
    c() { COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}; read -ra COMP_WORDS <<<"$1"
          [[ $1 == *" " ]] && COMP_WORDS+=(""); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); COMPREPLY=()
          $2; echo "${COMPREPLY[*]}"; }
    c "cuwarden r" _cuwarden
    c "cuwarden run --pool " _cuwarden
    c "cuwarden --query-compute-apps=pid,peak" _cuwarden
    c "cuwarden run --cap" _cuwarden
    c "cuwarden fit --pl" _cuwarden
    c "cuwarden top --o" _cuwarden
    c "cuwarden --query-compute-apps=pool_w" _cuwarden
    c "cuwardend --log-level w" _cuwardend' _ "$P/share/bash-completion/completions/cuwarden")
  want=$'run\noff cache vmm\npid,peak_memory\n--cap-scope\n--plot\n--once\npool_waits\nwarn'
  [[ $got == "$want" ]] || fail "completion: got [$got], want [$want]"
  echo "ok: bash completion"
fi
echo PASS
