#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# An unplug that runs out of memory (-D plug.inject_unplug_nomem=2:
# every 2nd unplug fails as if it could not allocate its runs) loses
# nothing and reorders nothing.  Connections A and B each hold an
# acknowledged 4 KiB write (idle=10s max-delay=60s), at 0 and at 4 KiB.
# Connection C then writes 8 KiB at 0, over both: its arrival unplugs A
# (the 1st unplug, which works) and B (the 2nd, which fails).  C's write
# must be refused (ENOMEM) before it is acknowledged: taken in beside
# B's older data, it could be written first.  A's unplugged run must be
# written all the same, B's plug goes out at requeue-delay, both FLUSHes
# are answered, C's second try is taken, and after the server's exit
# (status 0) the file holds C's data.
#
# Twice: with direct=never (the write is copied and submitted in one
# step) and with the direct path on (the direct path refuses C's write,
# which holds data over held data, and it is copied and submitted in a
# second step).  A and B then plug their writes by writing near them
# first.
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

cat > "$tmp/client.py" <<'EOF'
import nbd, sys
uri, near = sys.argv[1], sys.argv[2] == "near"
K = 4096


def conn():
    h = nbd.NBD()
    h.connect_uri(uri)
    return h


def answered(h, cookie, what):
    # A FLUSH that is never answered fails the test (timeout 60 s).
    while not h.aio_command_completed(cookie):
        h.poll(-1)
    print(what, "answered")


a, b, c = conn(), conn(), conn()
if near:
    # Writes far from all go direct; a write near one of them is held.
    a.pwrite(b"a" * K, 16 * K)
    b.pwrite(b"b" * K, 17 * K)
a.pwrite(b"A" * K, 0)
b.pwrite(b"B" * K, K)
try:
    c.pwrite(b"C" * 2 * K, 0)
    sys.exit("C's write over both plugs was acknowledged: "
             "its unplug of B cannot have worked")
except nbd.Error as ex:
    print("C's write refused:", ex)
    if ex.errno != "ENOMEM":
        sys.exit("refused with %s, expected ENOMEM" % ex.errno)
answered(a, a.aio_flush(), "A's FLUSH")
answered(b, b.aio_flush(), "B's FLUSH")
if a.pread(2 * K, 0) != b"A" * K + b"B" * K:
    sys.exit("A's and B's acknowledged writes are not there")
c.pwrite(b"C" * 2 * K, 0)
answered(c, c.aio_flush(), "C's FLUSH")
for h in (a, b, c):
    h.shutdown()
EOF

check_file ()
{
  /usr/bin/python3 - "$1" <<'EOF'
import sys
with open(sys.argv[1], "rb") as f:
    got = f.read(8192)
if got != b"C" * 8192:
    sys.exit("the file's first 8 KiB are not C's write: %r..." % got[:16])
print("the file holds C's write")
EOF
}

failed=()
for mode in never near; do
  img=$tmp/$mode.img
  truncate -s 1M "$img"
  params=(file="$img" idle=10s max-delay=60s)
  [ $mode = never ] && params+=(direct=never)
  start_plug $mode -v -D plug.inject_unplug_nomem=2 -D plug.unplug=1 -- \
             "${params[@]}"
  timeout 60 /usr/bin/python3 "$tmp/client.py" "$(server_uri $mode)" $mode ||
    { server_running $mode; failed+=("$mode: client"); }
  stop_server $mode
  grep -q 'out of memory, retrying' "$(server_log $mode)" ||
    failed+=("$mode: no unplug ran out of memory")
  check_file "$img" || failed+=("$mode: file")
done

[ ${#failed[@]} = 0 ] || fail "${failed[*]}"
