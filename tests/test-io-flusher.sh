#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Every thread the plugin starts is an I/O flusher (PR_SET_IO_FLUSHER,
# for the reclaim deadlock in front of a local /dev/nbd): the timer
# thread ("plug-timer"), the I/O pool ("plug-io", io-threads=3 of them)
# and the loop of an NBD server ("plug-remote"), found by name in
# /proc/PID/task/*/comm after a connection wrote through the plug.  The
# kernel sets PF_MEMALLOC_NOIO (0x00080000) | PF_LOCAL_THROTTLE
# (0x00100000) in the task's flags (kernel/sys.c PR_IO_FLUSHER), field
# 9 of /proc/PID/task/TID/stat.  nbdkit's main thread has neither: the
# flag is per thread, so the check can fail for any one thread kind.
# Every plugin thread asks, and says under -v what the kernel answered,
# one line per thread naming it: the lines are counted per name against
# the threads in /proc, so a thread kind that never asks fails the test
# wherever it runs.  Without CAP_SYS_RESOURCE the plug serves as before
# and its threads are not flushers: checked as nobody, or as this user
# where even root lacks the capability (a container).  Where the
# capability and PR_SET_IO_FLUSHER (Linux 5.6) exist, the flags
# themselves are checked too (and always as root in a guest:
# tests/test-vm-nbd.sh).
source ./functions.sh
set -e

requires /usr/bin/python3 -c 'import nbd'
requires nbdkit memory --version
requires setpriv --version
test -f "$PLUGIN"
# CAP_SYS_RESOURCE is bit 24 of the effective set.
have_cap=false
caps=$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status)
[ $(( (16#$caps >> 24) & 1 )) -eq 1 ] && have_cap=true
# PR_GET_IO_FLUSHER (58): -1 with EINVAL before Linux 5.6.
have_prctl=false
! $have_cap || ! /usr/bin/python3 -c 'import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
sys.exit(0 if libc.prctl(58, 0, 0, 0, 0) >= 0 else 1)' || have_prctl=true

plug_tmpdir
source "$srcdir/remote-lib.sh"

# Prints "NAME COUNT FLUSHERS" per thread name of process PID, and
# "main FLAGS-HAVE-BITS" for its main thread.
cat > "$tmp/threads.py" <<'EOF'
import collections, os, sys
pid = sys.argv[1]
BITS = 0x00080000 | 0x00100000
count = collections.Counter()
flushers = collections.Counter()
for tid in os.listdir("/proc/%s/task" % pid):
    d = "/proc/%s/task/%s" % (pid, tid)
    comm = open(d + "/comm").read().strip()
    stat = open(d + "/stat").read()
    flags = int(stat[stat.rindex(")") + 2:].split()[6])
    have = flags & BITS == BITS
    if tid == pid:
        print("main", int(have))
        continue
    count[comm] += 1
    flushers[comm] += have
for comm in sorted(count):
    print(comm, count[comm], flushers[comm])
EOF

# asked NAME TEXT: every plugin thread of server NAME (by the names in
# $tmp/threads) logged "thread COMM: TEXT", one line each.
asked ()
{
  local comm n lines
  for comm in plug-timer plug-io plug-remote; do
    n=$(awk -v c="$comm" '$1 == c { print $2 }' "$tmp/threads")
    n=${n:-0}
    [ "$comm" = plug-remote ] || [ "$n" -gt 0 ] || fail "no $comm thread"
    lines=$(grep -cF "debug: thread $comm: $2" "$(server_log "$1")" || true)
    [ "$lines" -eq "$n" ] ||
      fail "$comm: $n threads, $lines lines 'thread $comm: $2' in the log"
    echo "$comm: $n threads, $n lines '$2'"
  done
}

# ---- with the capability: every plugin thread is a flusher ----
if $have_prctl; then
  truncate -s 1M "$tmp/disk.img"
  srv_start mem unix memory 1M
  start_plug plug -v -- "$tmp/disk.img" "file=${srv_uri[mem]}" io-threads=3
  nbdsh_sys -u "$(server_uri plug)" -c '
h.pwrite(b"x" * 4096, 0)
h.pwrite(b"y" * 4096, 1048576)
h.flush()
'
  /usr/bin/python3 "$tmp/threads.py" "$(server_pid plug)" > "$tmp/threads"
  cat "$tmp/threads"
  asked plug "an I/O flusher (PR_SET_IO_FLUSHER)"
  for want in "plug-timer 1 1" "plug-io 3 3" "plug-remote 1 1" "main 0"; do
    grep -qx "$want" "$tmp/threads" ||
      fail "expected '$want' (name, threads, flushers) in: $(tr '\n' ';' < "$tmp/threads")"
  done
  echo "all 5 plugin threads are I/O flushers; nbdkit's main thread is not"
  stop_server plug
  srv_stop mem
fi

# ---- without CAP_SYS_RESOURCE: serves, and says why not ----
name=plug
wrap=
plugin=$PLUGIN
disk=$tmp/disk2.img
if $have_cap; then
  # setpriv drops the capabilities with the uid.
  as_nobody "$tmp/nobody"
  name=nobody
  wrap="${AS_NOBODY[*]}"
  plugin=$NOBODY_PLUGIN
  disk=$tmp/nobody/disk.img
  # nobody's nbdkit writes its socket and pid file in $tmp, like /tmp.
  chmod 1777 "$tmp"
fi
truncate -s 1M "$disk"
$have_cap && chown 65534:65534 "$disk"
# As this user (no capability at all), an NBD server's loop thread is
# counted too; nobody could not reach root's unix socket.
remote=
if ! $have_cap; then
  srv_start mem2 unix memory 1M
  remote=file=${srv_uri[mem2]}
fi
SERVER_WRAP="$wrap" start_server "$name" -v "$plugin" "$disk" $remote io-threads=2
nbdsh_sys -u "$(server_uri "$name")" -c '
h.pwrite(b"z" * 4096, 0)
h.flush()
assert h.pread(4096, 0) == b"z" * 4096
'
/usr/bin/python3 "$tmp/threads.py" "$(server_pid "$name")" > "$tmp/threads"
cat "$tmp/threads"
asked "$name" "not an I/O flusher: PR_SET_IO_FLUSHER needs CAP_SYS_RESOURCE"
grep -qx "plug-io 2 0" "$tmp/threads" ||
  fail "expected 2 plug-io threads, not flushers, in: $(tr '\n' ';' < "$tmp/threads")"
$have_cap || grep -qx "plug-remote 1 0" "$tmp/threads" ||
  fail "expected 1 plug-remote thread, not a flusher, in: $(tr '\n' ';' < "$tmp/threads")"
stop_server "$name"
$have_cap || srv_stop mem2
echo "without CAP_SYS_RESOURCE: served, not flushers, and each thread said why"
$have_prctl ||
  echo "note: the flags themselves need CAP_SYS_RESOURCE: checked in a guest by test-vm-nbd.sh"
