#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-lock.sh - one process may serve a backing file for writing.
#
# While one nbdkit plug serves a file, a second one on the same file is
# refused before it serves: non-zero exit status, the --run command never
# runs, and its error names the file and lock=no.  With lock=no the
# second one serves (and with shared=yes, its deprecated name, which
# warns).  A file named twice in one process is refused too.
# The lock stays across nbdkit's fork into the background, and the file
# is free again once the server has gone.  A file opened read-only takes
# no lock.  Every server started in the background must exit 0 on
# SIGTERM.
source ./functions.sh
set -e
set -x

requires nbdkit --version
requires nbdinfo --version
test -f "$PLUGIN"
plug_tmpdir

# The parameter is listed, with its default.
nbdkit "$PLUGIN" --dump-plugin > "$tmp/dump"
grep '^plug_lock_default=yes$' "$tmp/dump"
nbdkit "$PLUGIN" --help > "$tmp/help"
grep '^lock=' "$tmp/help"

img=$tmp/disk.img
truncate -s 1M "$img"
img=$(realpath "$img")

# serve NAME ARGS...: "nbdkit -f -U $tmp/NAME.sock" in the background;
# waits until it serves and sets $pid.
serve ()
{
  local name=$1
  shift
  rm -f "$tmp/$name.sock" "$tmp/$name.pid"   # nbdkit leaves them.
  nbdkit -f -U "$tmp/$name.sock" -P "$tmp/$name.pid" "$@" &
  pid=$!
  cleanup_fn kill -KILL $pid
  wait_for_file "$tmp/$name.pid" 30 || {
    echo "$0: nbdkit $* did not start"
    exit 1
  }
  nbdinfo --size "nbd+unix:///?socket=$tmp/$name.sock" > "$tmp/size"
  test "$(cat "$tmp/size")" -eq 1048576
}

# stop PID: SIGTERM; nbdkit must exit 0 within 30 s.
stop ()
{
  local p=$1 rc=0 dog
  ( sleep 30; kill -KILL $p ) 2>/dev/null &
  dog=$!
  kill -TERM $p
  wait $p || rc=$?
  kill $dog 2>/dev/null || :
  wait $dog 2>/dev/null || :
  if [ $rc -ne 0 ]; then
    echo "$0: nbdkit (pid $p) exited with status $rc"
    exit 1
  fi
}

# refused ARGS...: "nbdkit plug ARGS" must fail before it serves, with
# an error that names the file and the way out.
refused ()
{
  local rc=0
  rm -f "$tmp/ran" "$tmp/refused.sock"
  nbdkit -U "$tmp/refused.sock" "$PLUGIN" "$@" --run ": > $tmp/ran" \
         2> "$tmp/err" || rc=$?
  cat "$tmp/err"
  if [ $rc -eq 0 ] || [ -e "$tmp/ran" ]; then
    echo "$0: nbdkit plug $* was not refused"
    exit 1
  fi
  grep -F "file=$img: already in use" "$tmp/err"
  grep -F "add lock=no" "$tmp/err"
}

# accepted SIZE ARGS...: "nbdkit plug ARGS" serves (the --run command
# runs and sees an export of SIZE bytes).
accepted ()
{
  local size=$1
  shift
  rm -f "$tmp/ran" "$tmp/accepted.sock"
  nbdkit -U "$tmp/accepted.sock" "$PLUGIN" "$@" \
         --run "nbdinfo --size \"\$uri\" > $tmp/ran"
  test "$(cat "$tmp/ran")" -eq $size
}

# A writer in the foreground (-f).
for mode in writeback hold; do
  serve first "$PLUGIN" "$img" mode=$mode
  first=$pid
  refused "$img"
  refused file="$img" mode=hold
  refused "$img" lock=yes
  refused "$img" shared=no
  accepted 1048576 "$img" lock=no
  accepted 1048576 "$img" lock=false mode=$mode
  accepted 1048576 "$img" shared=true mode=$mode 2> "$tmp/err"
  cat "$tmp/err"
  grep -F "warning: shared=true: shared= is deprecated, use lock=no" "$tmp/err"
  stop $first
done

# The same file twice in one process.
refused "$img" "$img"
accepted 2097152 "$img" "$img" lock=no

# After the server has gone, the file is free.
accepted 1048576 "$img"

# Bad value.
rc=0
nbdkit -U "$tmp/refused.sock" "$PLUGIN" "$img" lock=perhaps \
       --run 'exit 0' 2> "$tmp/err" || rc=$?
cat "$tmp/err"
test $rc -ne 0
grep -F "lock=perhaps: expected a boolean" "$tmp/err"

# nbdkit forks into the background after opening the files: the lock
# must go with it.  A daemon is not our child, so its exit status cannot
# be collected; it must go away on SIGTERM.
# nbdkit returns at its fork; the child writes the pid file later (seen
# missing at once): wait until it holds the pid.
nbdkit -U "$tmp/daemon.sock" -P "$tmp/daemon.pid" "$PLUGIN" "$img"
for ((i = 0; i < 300; ++i)); do
  [ -s "$tmp/daemon.pid" ] && break
  sleep 0.1
done
dpid=$(cat "$tmp/daemon.pid")
test -n "$dpid"
cleanup_fn kill -KILL "$dpid"
refused "$img"
kill -TERM "$dpid"
for ((i = 0; i < 300; ++i)); do
  kill -0 "$dpid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$dpid" 2>/dev/null; then
  echo "$0: the daemon did not exit on SIGTERM"
  exit 1
fi
accepted 1048576 "$img"

# A file that can only be opened read-only takes no lock, so two
# servers may read it at once.  Root opens any file read-write: run
# nbdkit as nobody then, with its own copy of the plugin.
as_nobody "$tmp/pub"
chmod 777 "$tmp/pub"
truncate -s 1M "$tmp/pub/ro.img"
chmod 444 "$tmp/pub/ro.img"
img=$(realpath "$tmp/pub/ro.img")
"${AS_NOBODY[@]}" nbdkit -f -U "$tmp/pub/ro.sock" -P "$tmp/pub/ro.pid" \
                  "$NOBODY_PLUGIN" "$img" &
pid=$!
cleanup_fn kill -KILL $pid
wait_for_file "$tmp/pub/ro.pid" 30
"${AS_NOBODY[@]}" nbdkit -U "$tmp/pub/ro2.sock" "$NOBODY_PLUGIN" "$img" \
                  --run "nbdinfo --can write \"\$uri\" || echo read-only" \
                  > "$tmp/ro.out"
cat "$tmp/ro.out"
grep '^read-only$' "$tmp/ro.out"
stop $pid
