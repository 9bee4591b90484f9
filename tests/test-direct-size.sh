#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# direct-size=: its default follows the backing files.  One client
# writes 8 sequential requests, one at a time, and the statsfile counts
# those that took the direct path (written at once, no copy) and the
# backend writes:
#  * local file, default (64k): 64 KiB requests all go direct (8 of 8,
#    8 backend writes); 32 KiB requests are below it, so only the
#    first (near nothing) goes direct and the other 7 are plugged;
#  * local file, direct-size=1M given: 64 KiB requests are plugged too;
#  * an NBD server (nbdkit memory) as the backing file, default (1M):
#    64 KiB requests are plugged, the first one too (direct=auto takes
#    only direct-size= requests to an NBD server in writeback mode; see
#    test-direct-remote.sh).
# Every server must exit 0.
source ./functions.sh
set -e

requires test -x /usr/bin/python3
requires jq --version
test -f "$PLUGIN"

plug_tmpdir
source "$srcdir/remote-lib.sh"

# write_seq URI BS: 8 sequential writes of BS bytes from offset 0, each
# answered before the next is sent.
write_seq ()
{
  nbdsh_sys -u "$1" -c "
for i in range(8):
    h.pwrite(b'%c' % (65 + i) * $2, i * $2)
"
}

# check NAME WANT-DIRECT: the statsfile of server NAME (stopped).
check ()
{
  local direct ops
  direct=$(jq .direct "$tmp/$1.json")
  ops=$(jq .client.write.ops "$tmp/$1.json")
  echo "$1: $direct of $ops writes took the direct path," \
       "$(jq .backend.write.ops "$tmp/$1.json") backend writes"
  [ "$ops" -eq 8 ] || fail "$1: $ops client writes counted, want 8"
  [ "$direct" -eq "$2" ] || fail "$1: $direct direct writes, want $2"
}

truncate -s 16M "$tmp/disk"

start_plug local64 "$tmp/disk" stats-file="$tmp/local64.json"
write_seq "$(server_uri local64)" 65536
stop_server local64
check local64 8

start_plug local32 "$tmp/disk" stats-file="$tmp/local32.json"
write_seq "$(server_uri local32)" 32768
stop_server local32
check local32 1

start_plug local1m "$tmp/disk" direct-size=1M stats-file="$tmp/local1m.json"
write_seq "$(server_uri local1m)" 65536
stop_server local1m
check local1m 1

srv_start remote unix memory 16M
start_plug remote64 "file=${srv_uri[remote]}" stats-file="$tmp/remote64.json"
write_seq "$(server_uri remote64)" 65536
stop_server remote64
srv_stop remote
check remote64 0

# What was written is in the file.
/usr/bin/python3 - "$tmp/disk" <<'EOF'
import sys
d = open(sys.argv[1], "rb").read(8 * 65536)
for i in range(8):
    if d[i * 65536:(i + 1) * 65536] != bytes([65 + i]) * 65536:
        sys.exit("block %d of the file is wrong" % i)
EOF
echo "PASS"
