#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# direct=auto's rule per backing file.  One client writes 8 requests of
# 4 KiB, 1 MiB apart (each near none of the others: none can merge),
# one at a time, then FLUSHes; the statsfile counts those that took the
# direct path:
#  * an NBD server (nbdkit memory) as the backing file, writeback,
#    direct=auto: none (each is acknowledged from the plug, and written
#    with the server's parallelism);
#  * the same with direct=always: all 8;
#  * the same in hold mode (the client waits either way): all 8;
#  * a local file, direct=auto: all 8.
# What was written must be on the server / in the file, and every
# server must exit 0.
source ./functions.sh
set -e

requires test -x /usr/bin/python3
requires jq --version
test -f "$PLUGIN"

plug_tmpdir
source "$srcdir/remote-lib.sh"

# write_far URI: 8 writes of 4 KiB at i MiB, then a FLUSH.
write_far ()
{
  nbdsh_sys -u "$1" -c "
for i in range(8):
    h.pwrite(b'%c' % (65 + i) * 4096, i << 20)
h.flush()
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

# verify URI: the 8 blocks read back through URI.
verify ()
{
  nbdsh_sys -u "$1" -c "
for i in range(8):
    assert h.pread(4096, i << 20) == b'%c' % (65 + i) * 4096, i
"
}

srv_start remote unix memory 16M
for run in "wb-auto 0" "wb-always 8 direct=always" "hold-auto 8 mode=hold"; do
  read -r name want params <<< "$run"
  # shellcheck disable=SC2086 # params: zero or one word.
  start_plug "$name" "file=${srv_uri[remote]}" stats-file="$tmp/$name.json" \
             $params
  write_far "$(server_uri "$name")"
  stop_server "$name"
  check "$name" "$want"
  verify "${srv_uri[remote]}"
  nbdsh_sys -u "${srv_uri[remote]}" -c "h.zero(16 << 20, 0)"
done
srv_stop remote

truncate -s 16M "$tmp/disk"
start_plug local "$tmp/disk" stats-file="$tmp/local.json"
write_far "$(server_uri local)"
verify "$(server_uri local)"
stop_server local
check local 8
echo "PASS"
