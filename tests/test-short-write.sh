#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# A short write is not an error, and it loses nothing: the plugin goes
# on writing the rest of the buffer (or of the iovec, from the middle of
# one of its elements) at the right offset.  tests/shim-pwritev.so with
# SHIM_SHORT=1531 (LD_PRELOAD into nbdkit only) makes every pwrite and
# pwritev of the backing file write at most its first 1531 bytes: an
# odd number, so that a call ends in the middle of a request's data.
# Both modes (writeback with idle=10s max-delay=60s, so that the plug
# fills; hold mode with the default idle, for the last writes of a burst
# wait in it for idle), direct=auto (the default direct-size):
#  1. 300 adjacent writes of random sizes (1 to 12000 bytes) and random
#     data at queue depth 16: merged in the plug into pwritev runs;
#  2. 8 writes of 65536 to 300000 bytes, one at a time, scattered: the
#     direct path (one buffer, pwrite);
#  3. a FLUSH.
# Every write succeeds, the whole export reads back as the reference,
# and after the server has exited the backing file equals the reference
# byte for byte.  The statistics show both paths taken (direct writes,
# and fewer backend writes than plugged ones), and the shim counts the
# calls it shortened.
# Shown able to fail: with write_iov (plugin/file.c) not advancing
# the offset after a short write, "the export does not read back as the
# reference"; with it returning after the first call as if the short
# write were complete, the same; with the iovec element written in part
# not moved past what was written (only shortened), the same.
source ./functions.sh
set -e
set -x

requires_python_nbd
# SHIM_PWRITEV: see functions.sh
test -f "$SHIM_PWRITEV" || fail "$SHIM_PWRITEV not built"

plug_tmpdir

size=$((4 << 20))

# client.py URI SEED REF: the workload; the reference image to REF.
cat > "$tmp/client.py" <<'EOF'
import nbd, random, sys
uri, seed, ref_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rng = random.Random(seed)
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
ref = bytearray(size)
errs = []

def done(err):
    if err.value:
        errs.append(err.value)
    return 1

# 1. Adjacent writes of random sizes from 0, queue depth 16.
off = 0
for i in range(300):
    while h.aio_in_flight() >= 16:
        h.poll(-1)
    data = bytearray(rng.randbytes(rng.randrange(1, 12001)))
    ref[off:off + len(data)] = data
    h.aio_pwrite(nbd.Buffer.from_bytearray(data), off, completion=done)
    off += len(data)
while h.aio_in_flight() > 0:
    h.poll(-1)
print("1: 300 adjacent writes, %d bytes" % off)
if errs:
    sys.exit("1: %d writes failed (first errno %d)" % (len(errs), errs[0]))

# 2. Large scattered writes, one at a time, above what phase 1 wrote.
lo = 2 << 20
slot = (size - lo) // 8
for i in range(8):
    data = rng.randbytes(rng.randrange(65536, 300001))
    o = lo + i * slot + rng.randrange(0, slot - len(data))
    ref[o:o + len(data)] = data
    h.pwrite(data, o)
print("2: 8 large writes")

# 3. A FLUSH, then the whole export.
h.flush()
if h.pread(size, 0) != ref:
    sys.exit("the export does not read back as the reference")
open(ref_path, "wb").write(ref)
h.shutdown()
EOF

for mode in writeback hold; do
  params=()
  [ $mode = writeback ] && params=(idle=10s max-delay=60s)
  img=$tmp/$mode.img
  truncate -s $size "$img"
  rm -f "$tmp/shim-count"
  SERVER_WRAP="env LD_PRELOAD=$SHIM_PWRITEV SHIM_PATH=$img SHIM_SHORT=1531 SHIM_COUNT=$tmp/shim-count" \
    start_plug $mode file="$img" mode=$mode stats-file="$tmp/$mode.json" \
               "${params[@]}"
  timeout 120 /usr/bin/python3 "$tmp/client.py" "$(server_uri $mode)" 7 \
          "$tmp/$mode.ref"
  stop_server $mode
  shortened=$(cat "$tmp/shim-count" 2>/dev/null || echo 0)
  echo "$mode: the shim shortened $shortened calls"
  test "$shortened" -gt 0 || fail "$mode: no write was shortened"
  cmp "$img" "$tmp/$mode.ref" ||
    fail "$mode: the backing file differs from the reference"
  /usr/bin/python3 - "$tmp/$mode.json" <<'EOF'
import json, sys
st = json.load(open(sys.argv[1]))
cw, bw, d = st["client"]["write"], st["backend"]["write"], st["direct"]
print("client.write %r backend.write %r direct %d" % (cw, bw, d))
bad = []
if d < 8:
    bad.append("%d writes took the direct path, expected at least 8" % d)
if bw["ops"] >= cw["ops"]:
    bad.append("no write merged: %d backend writes for %d client writes"
               % (bw["ops"], cw["ops"]))
if bad:
    sys.exit("; ".join(bad))
EOF
done
