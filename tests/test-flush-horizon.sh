#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# A FLUSH covers the writes replied to before it, nothing more: it must
# not wait for writes that arrived after it.  Against a slow backend
# (-D plug.backend_delay_us=100000: every backend write takes 0.1 s more)
# a writer keeps 16 x 64 KiB writes in flight on one connection without
# a pause; after a warm-up it sends one FLUSH and goes on, and it stops
# sending only once N writes sent after the FLUSH have completed.
#
# Structural, no clock: as long as the writer runs, 16 of its writes are
# in flight and the plug and the queues are never empty, so a FLUSH that
# waits for them to drain (for the writer to stop) is answered only after
# the writer's last write.  The FLUSH must be answered while the writer
# is still sending: before the N-th write after it completes.  A FLUSH
# that waits for its horizon only (what was acknowledged before it, at
# most max-bytes=4M held plus what is in flight) needs a few hundred
# writes at the very most; N = 1000.  Both modes.
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

cat > "$tmp/writer.py" <<'EOF'
import nbd, random, sys
uri, mode = sys.argv[1], sys.argv[2]
N = 1000                        # Writes after the FLUSH before stopping.
WARMUP = 64
QD = 16
K = 65536
slots = (32 << 20) // K
h = nbd.NBD()
h.connect_uri(uri)
rng = random.Random(1)
buf = nbd.Buffer.from_bytearray(bytearray(b"W" * K))
done = 0
errs = []
flush = {"sent_at": None, "done_at": None, "err": None}

def write_done(err):
    global done
    if err.value:
        errs.append(err.value)
    done += 1
    return 1

def flush_done(err):
    flush["done_at"] = done
    flush["err"] = err.value
    return 1

sent = 0
while True:
    if flush["sent_at"] is None and done >= WARMUP:
        flush["sent_at"] = done
        h.aio_flush(completion=flush_done)
    if flush["sent_at"] is not None and done >= flush["sent_at"] + N:
        break                   # The writer stops sending here.
    while h.aio_in_flight() < QD + (1 if flush["done_at"] is None and
                                    flush["sent_at"] is not None else 0):
        h.aio_pwrite(buf, rng.randrange(slots) * K, completion=write_done)
        sent += 1
    h.poll(-1)
writer_end = done
while h.aio_in_flight() > 0:
    h.poll(-1)
h.shutdown()
print("%s: %d writes; FLUSH sent after %d had completed, answered after %d "
      "(%d later), writer stopped sending after %d"
      % (mode, sent, flush["sent_at"], flush["done_at"],
         flush["done_at"] - flush["sent_at"], writer_end))
if errs:
    sys.exit("%s: write errors %r" % (mode, errs[:5]))
if flush["err"]:
    sys.exit("%s: the FLUSH failed with %d" % (mode, flush["err"]))
if flush["done_at"] >= writer_end:
    sys.exit("%s: the FLUSH was answered only after %d writes sent after it "
             "had completed, when the writer stopped: it waited for writes "
             "that arrived after it" % (mode, flush["done_at"] - flush["sent_at"]))
EOF

failed=()
for mode in writeback hold; do
  truncate -s 32M "$tmp/$mode.img"
  start_plug $mode -D plug.backend_delay_us=100000 -- \
             file="$tmp/$mode.img" mode=$mode
  timeout 120 /usr/bin/python3 "$tmp/writer.py" "$(server_uri $mode)" $mode ||
    failed+=($mode)
  stop_server $mode
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "$0: a FLUSH waited for the writer to stop in: ${failed[*]}"
  exit 1
fi
