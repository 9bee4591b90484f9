#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# A failed write is reported by every FLUSH (THE RECORD), not by the
# first one only: NBD's FLUSH promises that every write answered before
# it is on stable storage, and an acknowledged write that failed never
# will be, until it is written again.
# tests/shim-pwritev.so makes writes to [0, 4096) of the backing file
# fail with EIO while its control file says "fail"; writeback mode, the
# write held (direct=never idle=10s max-delay=60s):
#  1. connection 1 writes 4 KiB of "A" at 0 (acknowledged), then sends
#     two FLUSHes at once (pipelined): both fail with EIO;
#  2. connection 2, opened afterwards, sends a FLUSH: it fails with EIO;
#  3. the range heals (control "ok"); connection 2 writes 4 KiB of "Z"
#     at 0 (succeeds), and its next FLUSH succeeds, and so does one on
#     connection 1; the file holds "Z" at 0 (read directly) and the
#     connections read it back;
#  4. the server exits with status 0 on SIGTERM.
# Able to fail: the plugin of commit 65665af (one deferred error) fails
# only the first of the two pipelined FLUSHes.
source ./functions.sh
set -e
set -x

requires_python_nbd
test -f "$SHIM_PWRITEV" || fail "$SHIM_PWRITEV not built"

plug_tmpdir

cat > "$tmp/client.py" <<'EOF'
import nbd, plugtest, sys
from plugtest import answer, check, check_flush, in_file
uri, img, control = sys.argv[1:4]
K = 1024
bad = []

h1 = nbd.NBD()
h1.connect_uri(uri)
h1.pwrite(b"A" * (4 * K), 0)              # Acknowledged, held.

# 1. Two pipelined FLUSHes.
cookies = [h1.aio_flush(), h1.aio_flush()]
for i, c in enumerate(cookies, 1):
    check(bad, "connection 1, pipelined FLUSH %d" % i, answer(h1, c), "EIO",
          "the write it covers failed")

# 2. A connection opened afterwards.
h2 = nbd.NBD()
h2.connect_uri(uri)
check_flush(h2, "connection 2 (opened after the failure), FLUSH", "EIO",
            bad)

# 3. Heal, write again, FLUSH.
open(control, "w").write("ok\n")
h2.pwrite(b"Z" * (4 * K), 0)
check_flush(h2, "connection 2, FLUSH after the range was written again", "ok",
            bad)
check_flush(h1, "connection 1, FLUSH after the range was written again", "ok",
            bad)
if in_file(img, 0, 4 * K) != b"Z" * (4 * K):
    bad.append("the file does not hold the rewrite at 0")
for i, h in ((1, h1), (2, h2)):
    if h.pread(4 * K, 0) != b"Z" * (4 * K):
        bad.append("connection %d does not read the rewrite at 0" % i)
h1.shutdown()
h2.shutdown()
plugtest.verdict(bad, "every FLUSH told the truth")
EOF

img=$tmp/disk.img
truncate -s 4M "$img"
echo fail > "$tmp/ctl"
wrap="env LD_PRELOAD=$SHIM_PWRITEV SHIM_PATH=$img SHIM_CONTROL=$tmp/ctl"
wrap+=" SHIM_FAIL_LO=0 SHIM_FAIL_HI=4096 SHIM_ERRNO=5" # EIO
wrap+=" SHIM_COUNT=$tmp/shim-count"
SERVER_WRAP=$wrap start_plug record file="$img" direct=never idle=10s max-delay=60s
run_client record 60 "$tmp/client.py" "$img" "$tmp/ctl"
end_client record
echo "shim failures: $(cat "$tmp/shim-count" 2>/dev/null || echo 0)"
cat "$(server_log record)"
