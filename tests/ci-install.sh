#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# tests/ci-install.sh [LOGDIR] - CI: nbdplug installed the ways a user
# installs it, and served by its short name.
#
#   make-install  a clone: ./configure && make && make install with the
#                 default prefix; the plugin is in nbdkit's plugindir
#                 (no .la); "nbdkit plug FILE" serves it; man finds the
#                 page; make uninstall leaves nothing behind (/usr/local
#                 and the plugindir as they were).
#   deb           a clone: dpkg-buildpackage -us -uc -b builds
#                 nbdkit-plugin-plug_<version>_<arch>.deb (the version of
#                 debian/changelog is configure.ac's); lintian reports no
#                 error; dpkg -i; "nbdkit plug FILE" serves the packaged
#                 plugin; man -w finds the page; dpkg -r leaves nothing.
#
# For CI on a throwaway machine, as root: it installs packages, writes
# to /usr and /usr/local and the dpkg database.  It refuses to run if
# the plugin is installed already.  Each check prints an automake-style
# "PASS: ci-install NAME" or "FAIL: ci-install NAME" line, and at the
# end "# TOTAL:", "# PASS:" and "# FAIL:" lines that .ci/run adds to its
# totals.  The checks' own output goes to LOGDIR/NAME.log (default: a
# temporary directory); a failure also prints its tail, indented.
# Exit status: 0 all passed, 1 a check failed, 2 could not run.
set -uo pipefail

cd "$(dirname "$0")/.."
top=$(pwd)
export DEBIAN_FRONTEND=noninteractive LC_ALL=C

# What the checks need beyond quickstart.sh's packages (the build
# dependencies themselves come from debian/control).
PKGS="build-essential debhelper dpkg-dev lintian man-db libnbd-bin nbdkit
  git"

work=$(mktemp -d /tmp/nbdplug-ci-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
logdir=${1:-$work/logs}
mkdir -p "$logdir"

if [ "$(id -u)" != 0 ]; then
  echo "ci-install: must run as root (it installs into /usr)" >&2
  exit 2
fi

missing=()
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
    missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "ci-install: installing ${missing[*]}"
  { apt-get update -qq &&
    apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
    >"$logdir/apt.log" 2>&1 || {
    echo "ci-install: apt-get install failed (see $logdir/apt.log)" >&2
    exit 2
  }
fi

plugindir=$(pkg-config --variable=plugindir nbdkit)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
if [ -z "$plugindir" ]; then
  echo "ci-install: pkg-config does not know nbdkit's plugindir" >&2
  exit 2
fi
if [ -e "$plugindir/nbdkit-plug-plugin.so" ] ||
   dpkg-query -W -f='${Status}' nbdkit-plugin-plug 2>/dev/null |
     grep -q 'ok installed'; then
  echo "ci-install: the plugin is already installed; not touching it" >&2
  exit 2
fi

# The places an install may touch, as they are now.
snapshot ()
{
  find /usr/local "$plugindir" /usr/share/man/man1 \
       -path /usr/local/src -prune -o -print 2>/dev/null | sort
}

# serve_by_name WANT_PATH: "nbdkit plug FILE" loads WANT_PATH and serves
# FILE, both with --run and as a server that must exit 0 on SIGTERM.
serve_by_name ()
{
  local want=$1 img=$work/disk.img d=$work/serve pid rc=0 i size
  rm -rf "$d"
  mkdir "$d"
  truncate -s 64M "$img"
  nbdkit plug --dump-plugin > "$d/dump"
  grep "^path=$want\$" "$d/dump"
  size=$(timeout 60 nbdkit -U "$d/run.sock" plug "$img" \
           --run 'nbdinfo --size "$uri"')
  test "$size" -eq 67108864
  nbdkit -f -U "$d/sock" -P "$d/pid" plug "$img" &
  pid=$!
  cleanups+=("kill -KILL $pid")
  for ((i = 0; i < 300; ++i)); do
    [ -s "$d/pid" ] && break
    sleep 0.1
  done
  size=$(timeout 60 nbdinfo --size "nbd+unix:///?socket=$d/sock")
  test "$size" -eq 67108864
  kill -TERM $pid
  wait $pid || rc=$?
  echo "nbdkit plug exited with status $rc after SIGTERM"
  test $rc -eq 0
  rm -f "$img"
}

check_make_install ()
{
  local man
  git clone -q "$top" "$work/inst"
  cd "$work/inst"
  snapshot > "$work/before"
  autoreconf -fi
  ./configure
  make -j"$(nproc)"
  cleanups+=("make -C '$work/inst' uninstall")
  make install
  test -f "$plugindir/nbdkit-plug-plugin.so"
  test ! -e "$plugindir/nbdkit-plug-plugin.la"
  test -f /usr/local/share/man/man1/nbdkit-plug-plugin.1
  serve_by_name "$plugindir/nbdkit-plug-plugin.so"
  man=$(man -w nbdkit-plug-plugin)
  echo "man -w: $man"
  test "$(readlink -f "$man")" = /usr/local/share/man/man1/nbdkit-plug-plugin.1
  make uninstall
  snapshot > "$work/after"
  diff "$work/before" "$work/after" || {
    echo "make uninstall left the lines marked > behind (< removed)"
    return 1
  }
}

check_deb ()
{
  local version acver arch deb changes man so
  git clone -q "$top" "$work/deb/src"
  cd "$work/deb/src"
  version=$(dpkg-parsechangelog -S Version)
  acver=$(sed -n 's/^AC_INIT(\[nbdplug\], \[\([^]]*\)\].*/\1/p' configure.ac)
  echo "debian/changelog: $version; configure.ac: $acver"
  test "$version" = "$acver"
  arch=$(dpkg --print-architecture)
  dpkg-checkbuilddeps || apt-get build-dep -y -qq ./
  dpkg-buildpackage -us -uc -b
  deb=$work/deb/nbdkit-plugin-plug_${version}_${arch}.deb
  changes=$work/deb/nbdplug_${version}_${arch}.changes
  test -f "$deb"
  dpkg -c "$deb"
  dpkg -I "$deb"
  lintian --fail-on error "$changes"
  snapshot > "$work/before"
  cleanups+=("dpkg -r nbdkit-plugin-plug")
  dpkg -i "$deb"
  so=/usr/lib/$multiarch/nbdkit/plugins/nbdkit-plug-plugin.so
  dpkg -S "$so" | grep '^nbdkit-plugin-plug:'
  serve_by_name "$so"
  man=$(man -w nbdkit-plug-plugin)
  echo "man -w: $man"
  test "$man" = /usr/share/man/man1/nbdkit-plug-plugin.1.gz
  dpkg -r nbdkit-plugin-plug
  if dpkg-query -W -f='${Status}' nbdkit-plugin-plug 2>/dev/null |
     grep 'ok installed'; then
    return 1
  fi
  test ! -e "$so"
  snapshot > "$work/after"
  diff "$work/before" "$work/after" || {
    echo "dpkg -r left the lines marked > behind (< removed)"
    return 1
  }
}

# run NAME FUNCTION: one check, in a subshell with its own cleanups
# (uninstall, kill), run in reverse order when it leaves.  Not on the
# left of || : that would turn set -e off inside it.
pass=0
fail=0
run ()
{
  local name=$1 fn=$2 rc
  (
    cleanups=()
    trap 'for ((i = ${#cleanups[@]} - 1; i >= 0; --i)); do
            eval "${cleanups[i]}" >/dev/null 2>&1 || :
          done' EXIT
    set -ex
    $fn
  ) >"$logdir/$name.log" 2>&1 </dev/null
  rc=$?
  if [ $rc -eq 0 ]; then
    echo "PASS: ci-install $name"
    pass=$((pass + 1))
  else
    echo "FAIL: ci-install $name (status $rc, see $logdir/$name.log)"
    tail -n 40 "$logdir/$name.log" | sed 's/^/  | /'
    fail=$((fail + 1))
  fi
}

run make-install check_make_install
run deb check_deb

echo "============================================================"
echo "ci-install summary"
echo "# TOTAL: $((pass + fail))"
echo "# PASS:  $pass"
echo "# FAIL:  $fail"
echo "============================================================"
[ $fail -eq 0 ]
