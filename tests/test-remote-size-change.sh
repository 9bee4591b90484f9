#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# An NBD server that comes back with an export of another size is not
# used, and that is treated as lasting: over 3 s the plug logs fewer
# than 10 lines about it and connects to the server fewer than 10
# times (its --filter=log log), with remote-connections=4 and the
# default requeue-max-delay=100ms that would allow ~40 attempts a second.
# A read waiting for it fails with EIO after requeue-timeout=; once the
# server is back with the right size the plug uses it again, and a
# write acknowledged meanwhile is written by the next FLUSH.
source ./functions.sh
set -e

requires nbdkit file --version
test -f "$PLUGIN"

plug_tmpdir
source "$srcdir/remote-lib.sh"

truncate -s 4M "$tmp/disk.img"
truncate -s 8M "$tmp/big.img"

srv_start r unix file "$tmp/disk.img"
# -v: "reconnected" is a debug message.
srv_start plug unix -v "$PLUGIN" "file=${srv_uri[r]}" requeue-timeout=1s \
          remote-connections=4 idle=10s max-delay=60s direct=never
nbdsh_sys -u "${srv_uri[plug]}" -c 'h.pwrite(b"A" * 4096, 0); h.flush()'

srv_kill r
srv_start r unix --filter=log file "$tmp/big.img" logfile="$tmp/big.txt"
sleep 3
lines=$(grep -c 'came back with an export' "$tmp/plug.log" || :)
conns=$(grep -c 'connection=[0-9]* Connect ' "$tmp/big.txt" || :)
echo "in 3 s: $lines log lines, $conns connections to the server"
grep 'came back with' "$tmp/plug.log" | head -3
[ "$lines" -lt 10 ] || fail "$lines log lines in 3 s"
[ "$conns" -lt 10 ] || fail "$conns connections in 3 s"
grep -q 'came back with an export that differs (size 8388608, not 4194304)' \
     "$tmp/plug.log" || fail "no log line naming the size"

# Still refused: a write is held and, once requeue-timeout= passed, the
# FLUSH reports its failure; a read fails after requeue-timeout= too.
nbdsh_sys -u "${srv_uri[plug]}" -c '
import errno
h.pwrite(b"B" * 4096, 4096)
for what, fn in (("flush", h.flush), ("read", lambda: h.pread(4096, 0))):
    try:
        fn()
        raise SystemExit("%s succeeded with the server refused" % what)
    except nbd.Error as e:
        assert e.errnum == errno.EIO, e
        print("%s: EIO as expected" % what)
'
srv_stop r
! grep -q ' Write ' "$tmp/big.txt" || fail "the plug wrote to the other export"

srv_start r unix file "$tmp/disk.img"
wait_plug_log 'reconnected' || fail "no reconnect to the right export"
# The acknowledged write of "B" was lost: every FLUSH says so until it
# is written again (the record of lost data is the truth, not a message
# delivered once).
nbdsh_sys -u "${srv_uri[plug]}" -c '
import errno
h.pwrite(b"C" * 4096, 8192)
try:
    h.flush()
    raise SystemExit("flush succeeded with the lost write not written again")
except nbd.Error as e:
    assert e.errnum == errno.EIO, e
    print("back: flush still fails: B is lost")
assert h.pread(4096, 0) == b"A" * 4096
assert h.pread(4096, 8192) == b"C" * 4096
h.pwrite(b"B" * 4096, 4096)
h.flush()
print("back: B written again, flushed")
'
srv_stop plug
srv_stop r
/usr/bin/python3 -c 'import sys
d = open(sys.argv[1], "rb").read(3 * 4096)
assert d == b"A" * 4096 + b"B" * 4096 + b"C" * 4096, "disk.img differs"
' "$tmp/disk.img"
