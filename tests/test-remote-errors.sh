#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# A server's "not now" and its real errors.
#  - ENOMEM on 10% of the server's writes and reads (nbdkit error
#    filter): the engine retries the writes (statistics: "eagain"
#    counted, no error, nothing given up), the plug's remote loop the
#    reads; fio's verify pass reads back everything it wrote, and no
#    error reaches the client.
#  - EIO on every write while $tmp/inject exists: in writeback mode the
#    writes are acknowledged and the next FLUSH fails with EIO; in hold
#    mode the write itself fails with EIO.  The server stays up: once
#    the file is gone, writes and FLUSHes succeed again and read back.
source ./functions.sh
set -e

requires fio --enghelp=nbd
requires jq --version
requires /usr/bin/python3 -c 'import nbd'
test -f "$PLUGIN"

plug_tmpdir
source "$srcdir/remote-lib.sh"

# ---- ENOMEM: retried, invisible to the client ----
srv_start enomem unix --filter=error memory 64M \
          error=ENOMEM error-pwrite-rate=10% error-pread-rate=10%
srv_start plug1 unix "$PLUGIN" "file=${srv_uri[enomem]}" \
          stats-file="$tmp/enomem.json"
for rw in randwrite write; do
  fio --name=$rw --ioengine=nbd --uri="${srv_uri[plug1]}" \
      --rw=$rw --bs=4k --iodepth=16 --size=16M \
      --verify=crc32c --verify_state_save=0 \
      --output-format=terse > "$tmp/$rw.fio"
done
srv_stop plug1
srv_stop enomem
injected=$(grep -c "injecting ENOMEM error into pwrite" "$tmp/enomem.log" || :)
reads=$(grep -c "injecting ENOMEM error into pread" "$tmp/enomem.log" || :)
jq -c .retry "$tmp/enomem.json"
echo "server injected ENOMEM into $injected writes and $reads reads"
[ "$injected" -gt 0 ]
[ "$reads" -gt 0 ]
[ "$(jq .retry.eagain "$tmp/enomem.json")" -ge "$injected" ]
[ "$(jq .retry.errors "$tmp/enomem.json")" -eq 0 ]
[ "$(jq .retry.gave_up "$tmp/enomem.json")" -eq 0 ]

# ---- EIO: a real error, reported; the server stays up ----
srv_start eio tcp --filter=error memory 8M \
          error=EIO error-pwrite-rate=100% error-pwrite-file="$tmp/inject"
# Writeback, nothing leaves the plug by itself (idle=10s), every
# request through the plug (direct=never): the error can only come
# with the FLUSH.
srv_start wb unix "$PLUGIN" "file=${srv_uri[eio]}" idle=10s max-delay=60s \
          direct=never
srv_start hold unix "$PLUGIN" "file=${srv_uri[eio]}" mode=hold

cat > "$tmp/client.py" <<'EOF2'
import errno, nbd, os, sys
wb_uri, hold_uri, inject = sys.argv[1:4]
K, M = 1024, 1024 * 1024

def expect_eio(what, fn):
    try:
        fn()
    except nbd.Error as e:
        assert e.errnum == errno.EIO, "%s: %s" % (what, e)
        print("ok: %s failed with EIO" % what)
        return
    sys.exit("%s succeeded while the server fails every write" % what)

wb = nbd.NBD()
wb.connect_uri(wb_uri)
good = os.urandom(64 * K)
wb.pwrite(good, 0)
wb.flush()

open(inject, "w").close()
for i in range(16):
    wb.pwrite(b"E" * 4096, M + i * 4096)     # acknowledged: held
print("ok: 16 writes acknowledged while the server fails writes")
expect_eio("writeback FLUSH", wb.flush)
assert wb.pread(64 * K, 0) == good, "earlier flushed data changed"

hold = nbd.NBD()
hold.connect_uri(hold_uri)
expect_eio("hold-mode write", lambda: hold.pwrite(b"H" * 4096, 2 * M))

os.unlink(inject)
fresh = os.urandom(64 * K)
wb.pwrite(fresh, M)
wb.flush()
hold.pwrite(b"h" * 4096, 2 * M)
hold.flush()
assert wb.pread(64 * K, M) == fresh, "rewritten data differs"
assert hold.pread(4096, 2 * M) == b"h" * 4096, "hold write differs"
print("ok: the server healed: writes and FLUSHes succeed again")
wb.shutdown()
hold.shutdown()
EOF2
/usr/bin/python3 "$tmp/client.py" "${srv_uri[wb]}" "${srv_uri[hold]}" \
                 "$tmp/inject"
srv_stop wb
srv_stop hold
srv_stop eio
# The plug logged the failure with the server's answer.
grep -q "Input/output error" "$tmp/wb.log"
