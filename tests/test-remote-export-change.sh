#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# An NBD server that comes back (same size) without what the plug
# relied on at start is refused like one of another size, with a log
# line naming what changed: read-only, no multi-conn (4 connections in
# use), no zero, no cache, a larger minimum or smaller maximum block
# size.  While it is refused a read fails with EIO after requeue-timeout=
# and does not reach it (its --filter=log log).  Once the server is back
# as it was, the plug uses it again.
source ./functions.sh
set -e

requires nbdkit file --version
requires nbdkit --filter=multi-conn null --version
requires nbdkit --filter=nozero null --version
requires nbdkit --filter=nocache null --version
requires nbdkit --filter=blocksize-policy null --version
test -f "$PLUGIN"

plug_tmpdir
source "$srcdir/remote-lib.sh"

truncate -s 8M "$tmp/disk.img"

srv_start r unix file "$tmp/disk.img"
# -v: "reconnected" is a debug message.
srv_start plug unix -v "$PLUGIN" "file=${srv_uri[r]}" requeue-timeout=1s \
          remote-connections=4
nbdsh_sys -u "${srv_uri[plug]}" -c 'h.pwrite(b"A" * 4096, 0); h.flush()'
srv_kill r

# wait_line TEXT: the plug logs that the export differs, naming TEXT.
wait_line ()
{
  wait_plug_log "$1" 150 && return 0
  grep 'came back with' "$tmp/plug.log" | tail -3
  fail "no log line naming: $1"
}

# variant NAME WHAT FILTER-OPTIONS -- FILTER-PARAMS
variant ()
{
  local name=$1 what=$2 opts=() params=()
  shift 2
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  params=("$@")
  srv_start r unix --filter=log "${opts[@]}" file "$tmp/disk.img" \
            logfile="$tmp/$name.txt" "${params[@]}"
  wait_line "came back with an export that differs ($what"
  echo "$name: refused"
}

variant ro "read-only" -r --
nbdsh_sys -u "${srv_uri[plug]}" -c '
import errno
try:
    h.pread(4096, 0)
    raise SystemExit("read succeeded from the read-only export")
except nbd.Error as e:
    assert e.errnum == errno.EIO, e
    print("read: EIO as expected")
'
srv_stop r
! grep -q ' Read ' "$tmp/ro.txt" || fail "the plug read from the refused export"

variant mc "no multi-conn" --filter=multi-conn -- multi-conn-mode=disable
srv_stop r
variant nz "no zero" --filter=nozero -- zeromode=none
srv_stop r
variant nc "no cache" --filter=nocache -- cachemode=none
srv_stop r
variant bs "minimum block size 4096, not 1, maximum block size 65536, not" \
        --filter=blocksize-policy -- \
        blocksize-minimum=4096 blocksize-maximum=65536
srv_stop r

srv_start r unix --filter=log file "$tmp/disk.img" logfile="$tmp/back.txt"
wait_plug_log 'reconnected' || fail "no reconnect to the export"
nbdsh_sys -u "${srv_uri[plug]}" -c '
h.pwrite(b"C" * 4096, 4096)
h.flush()
assert h.pread(4096, 0) == b"A" * 4096
assert h.pread(4096, 4096) == b"C" * 4096
print("back: written and flushed")
'
srv_stop plug
srv_stop r
grep -q ' Write ' "$tmp/back.txt"
grep -o "came back with .*" "$tmp/plug.log"
