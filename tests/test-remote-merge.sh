#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Merging proven at the NBD server, outside the plugin: fio writes 8 MiB
# in 4 KiB sequential requests at queue depth 16 through the plug to an
# nbdkit memory server; the server's own log (--filter=log) shows at
# least 8x fewer, larger writes that cover every byte exactly once, and
# fio's verify pass reads back what it wrote.  Once with the server on a
# unix socket, once on TCP 127.0.0.1.
source ./functions.sh
set -e

requires fio --enghelp=nbd
requires test -x /usr/bin/python3
test -f "$PLUGIN"

plug_tmpdir
source "$srcdir/remote-lib.sh"

cat > "$tmp/count.py" <<'EOF2'
import re, sys
log, client_ops, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
writes = []
for line in open(log):
    m = re.search(r" Write id=\d+ offset=(0x[0-9a-f]+) count=(0x[0-9a-f]+)",
                  line)
    if m:
        writes.append((int(m.group(1), 16), int(m.group(2), 16)))
covered = bytearray(size)
for off, count in writes:
    for i in range(off // 4096, (off + count) // 4096):
        covered[i] += 1
pages = covered[:size // 4096]
print("server writes: %d for %d client writes (%.1fx), largest %d bytes"
      % (len(writes), client_ops, client_ops / max(len(writes), 1),
         max(c for _, c in writes)))
if any(c != 1 for c in pages):
    sys.exit("server writes do not cover each 4K page exactly once")
if len(writes) * 8 > client_ops:
    sys.exit("FAIL: fewer than 8x fewer writes at the server")
EOF2

run ()
{
  local how=$1 size=$((8 << 20))
  : > "$tmp/$how.log.txt"
  srv_start "r-$how" "$how" --filter=log memory 16M \
            logfile="$tmp/$how.log.txt"
  srv_start "plug-$how" unix "$PLUGIN" "file=${srv_uri[r-$how]}" \
            stats-file="$tmp/$how.json"
  fio --name=seq --ioengine=nbd --uri="${srv_uri[plug-$how]}" \
      --rw=write --bs=4k --iodepth=16 --size=$size \
      --verify=crc32c --verify_state_save=0 --output-format=terse > "$tmp/$how.fio"
  srv_stop "plug-$how"
  srv_stop "r-$how"
  /usr/bin/python3 "$tmp/count.py" "$tmp/$how.log.txt" \
                   "$(jq .client.write.ops "$tmp/$how.json")" $size
  # The plug counts the same runs as the server saw writes.
  [ "$(jq .backend.write.ops "$tmp/$how.json")" -eq \
    "$(grep -c ' Write id=' "$tmp/$how.log.txt")" ]
  [ "$(jq .retry.errors "$tmp/$how.json")" -eq 0 ]
}

requires jq --version
run unix
run tcp
