#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-quickstart.sh - the quick start's serve command, started in the
# background on a fresh copy of the source tree, serves the image from
# one process at the addresses it prints.
#
# The copy is what a clone would have: git's tracked files (as they are
# in the work tree), or, outside git, the distributed tree.  The first
# run builds it.  For each of --port=N (TCP only, the default's form on
# a free port), --unix and --both: every printed address answers with
# the image's size; only one process has work/disk.img open (fuser and
# /proc/*/fd agree), and it is the plug server; with --both a flushed
# write through the socket reads back through TCP and the other way.
# SIGTERM to quickstart.sh stops its servers: it exits 0 (the plug
# server's status), and leaves no process, socket or pid file.  Before
# the first run the copy is configured as "quickstart.sh check" does it
# (warnings as errors): serve configures it again without -Werror and
# compiles every object again.
source ./functions.sh
set -e
set -x

requires nbdkit --version
requires nbdinfo --version
requires fuser --version
requires setsid --version
requires test -x /usr/bin/python3
requires /usr/bin/python3 -c 'import nbd'
requires nbdkit nbd --version
plug_tmpdir

src=$abs_top_srcdir
copy=$tmp/nbdplug
mkdir "$copy"
top=$(git -C "$src" rev-parse --show-toplevel 2>/dev/null) || top=
if [ -n "$top" ] && [ "$top" = "$(cd "$src" && pwd -P)" ]; then
  # Tracked files deleted in the work tree are skipped.
  git -C "$src" ls-files -z |
    (cd "$src" && tar --null -T - --ignore-failed-read -cf -) |
    tar -C "$copy" -xf -
else
  cp -a "$src/." "$copy"
  chmod -R u+w "$copy"
  if [ -f "$copy/config.status" ]; then
    make -C "$copy" distclean >/dev/null
  fi
fi
test -x "$copy/quickstart.sh"

# A free TCP port on 127.0.0.1.
port=$(/usr/bin/python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
img=$copy/work/disk.img

# run OPTIONS...: start "quickstart.sh OPTIONS" in its own session, wait
# for its banner, check the addresses and the owner of the image, stop it.
run ()
{
  local qs out i pids owners uris u size server rc=0 dog

  # A new file each run: the wait below must not see the last banner.
  runs=$((runs + 1))
  out=$tmp/qs-$runs.out
  setsid "$copy/quickstart.sh" "$@" > "$out" 2>&1 &
  qs=$!
  cleanup_fn kill -KILL -- -$qs
  # The first run builds the copy (autoreconf, configure, make).
  for ((i = 0; i < 1800; ++i)); do
    grep -q '^Stop with Ctrl-C' "$out" && break
    kill -0 $qs 2>/dev/null || break
    sleep 0.1
  done
  cat "$out"
  grep -q '^Stop with Ctrl-C' "$out" || {
    echo "$0: quickstart.sh $* did not start serving"
    exit 1
  }

  # Every printed address serves the image.
  uris=$(sed -n 's|^  \(nbd[+a-z]*://[^ ]*\)$|\1|p' "$out")
  test -n "$uris"
  for u in $uris; do
    size=$(nbdinfo --size "$u")
    test "$size" -eq 1073741824
  done

  # One process has the image open: the plug server.
  owners=$(fuser "$img" 2>/dev/null | tr -s ' ' '\n' | sed '/^$/d' | sort)
  pids=$(for f in /proc/[0-9]*/fd/*; do
           [ "$(readlink "$f" 2>/dev/null)" = "$img" ] &&
             { p=${f#/proc/}; echo "${p%%/*}"; }
         done | sort -u)
  echo "fuser: $owners; /proc/*/fd: $pids"
  test "$owners" = "$pids"
  test "$(echo "$pids" | wc -w)" -eq 1
  server=$pids
  tr '\0' ' ' < /proc/$server/cmdline | grep 'nbdkit.*nbdkit-plug-plugin.so'
  grep "^(nbdkit process $server; it alone has the image open)" "$out"

  # --both: the socket is the same cache as TCP.
  if [ "$1" = --both ]; then
    /usr/bin/python3 - "$copy/work/nbd.sock" "$port" <<'EOF'
import nbd, sys
a = nbd.NBD()
a.connect_unix(sys.argv[1])
b = nbd.NBD()
b.connect_tcp("127.0.0.1", sys.argv[2])
a.pwrite(b"Q" * 4096, 65536)
a.flush()                       # Each connection has its own plug.
assert b.pread(4096, 65536) == b"Q" * 4096, "TCP does not see the write"
b.pwrite(b"R" * 4096, 65536)
b.flush()
assert a.pread(4096, 65536) == b"R" * 4096, "the socket does not see it"
a.shutdown()
b.shutdown()
EOF
  fi

  ( sleep 30; kill -KILL -- -$qs ) 2>/dev/null &
  dog=$!
  kill -TERM $qs
  wait $qs || rc=$?
  kill $dog 2>/dev/null || :
  wait $dog 2>/dev/null || :
  if [ $rc -ne 0 ]; then
    echo "$0: quickstart.sh $* exited with status $rc after SIGTERM"
    exit 1
  fi
  if pgrep -s $qs; then
    echo "$0: quickstart.sh $* left processes behind"
    exit 1
  fi
  test ! -e "$copy/work/nbd.sock"
  test ! -e "$copy/work/nbdkit.pid"
  test ! -e "$copy/work/proxy.pid"
}

# The copy as "./quickstart.sh check" leaves it: configured with
# warnings as errors, the core built.  serve must configure it without
# -Werror (a newer compiler's new warning must not stop a user who only
# serves) and compile every object again: make alone would keep the
# objects built with the old flags.
( cd "$copy" && autoreconf -fi && ./configure --enable-gcc-warnings &&
  make -C src ) > "$tmp/check-build.log" 2>&1 || {
  tail -n 40 "$tmp/check-build.log"
  fail "could not build the copy as quickstart.sh check does"
}
grep '^WARNINGS_CFLAGS = .*-Werror' "$copy/Makefile"
test -n "$(find "$copy/src" -name '*.o')"
touch "$tmp/before-serve"

runs=0
run --port=$port

test "$(cd "$copy" && ./config.status --config)" = ""
grep '^WARNINGS_CFLAGS = ' "$copy/Makefile"
if grep -- '-Werror' "$copy/Makefile"; then
  fail "quickstart.sh serve built with -Werror"
fi
stale=$(find "$copy/src" "$copy/plugin" -name '*.o' ! -newer "$tmp/before-serve")
if [ -n "$stale" ]; then
  fail "quickstart.sh serve kept objects built with -Werror: $stale"
fi
run --unix
run --both --port=$port
# The image is the one the first run made, and it kept the data.
test "$(stat -c %s "$img")" -eq 1073741824
/usr/bin/python3 -c '
import sys
f = open(sys.argv[1], "rb")
f.seek(65536)
assert f.read(4096) == b"R" * 4096' "$img"
