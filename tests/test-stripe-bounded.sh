#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-stripe-bounded.sh - on a striped export, what one request costs
# is bounded by the number of backing files, not by its length divided
# by the stripe; and striped data is right whatever the mode.
#
# Bounded: two sparse 2 GiB files, stripe=4k (the smallest accepted),
# writeback with idle=10s max-delay=60s so that a 4 KiB write stays
# held and makes the barriers of reads and block status go through the
# engine.  While one connection reads 4 KiB again and again, another
# sends one zero of 4 GiB - 4 KiB (the largest NBD count that is a
# multiple of the stripe: 2^20 - 1 stripe units), a block status over
# the same range, a trim over it and a read of 4 MiB (1024 units).  The statistics
# (statsfile "pieces") must say that no request was made of more than
# 2 pieces (one per file) and that the pieces add up to at most 2 per
# request; the zero must have zeroed; and nbdkit's peak RSS (VmHWM)
# must have grown by less than 64 MiB over its value after start, and
# stay under 200 MB in all (before one piece per file, these requests
# took it from 7 MB to 226 MB).  Under a sanitizer, whose runtime keeps
# freed memory (ASan's quarantine) and maps shadow memory for what is
# touched, the growth may be 256 MiB and the total is not bounded.
#
# Data: three 1 MiB files striped in 4 KiB units, both modes.  Writes
# (plain and FUA), zeroes and trims that span two units, a whole stripe
# row, several rows (each file's bytes scattered over the request: the
# plug gathers them file by file), from unaligned offsets, read back at
# once, again after FLUSH, again on a new connection; after the server
# exited each file holds exactly its units of the expected image.
source ./functions.sh
set -e
set -x

requires_python_nbd
plug_tmpdir

# ---- bounded work per request ----
truncate -s 2G "$tmp/big0" "$tmp/big1"
start_plug big -- stripe=4k "$tmp/big0" "$tmp/big1" idle=10s max-delay=60s \
           stats-file="$tmp/big.json"
pid=$(server_pid big)
hwm_start=$(awk '/^VmHWM:/ { print $2 }' /proc/$pid/status)

cat > "$tmp/big.py" <<'EOF'
import nbd, sys, threading
uri = sys.argv[1]
N = 4 * 1024**3 - 4096
held = nbd.NBD(); held.connect_uri(uri)
reader = nbd.NBD(); reader.connect_uri(uri)
big = nbd.NBD(); big.add_meta_context("base:allocation"); big.connect_uri(uri)
stop = threading.Event()
reads = [0]
errors = []
def read_loop():
    try:
        while not stop.is_set():
            if reader.pread(4096, 123 * 4096) != bytes(4096):
                errors.append("reader saw data where nothing was written")
            reads[0] += 1
            stop.wait(0.002)            # pacing only: nothing is timed
    except Exception as e:
        errors.append("reader: %r" % e)
t = threading.Thread(target=read_loop)
t.start()
held.pwrite(b"\xaa" * 4096, 8192)       # held: idle=10s
big.zero(N, 0)
if big.pread(4096, 8192) != bytes(4096):
    errors.append("the 4 GiB zero did not zero the held write under it")
held.pwrite(b"\xbb" * 4096, 3 * 4096)   # held again
extents = []
big.block_status(N, 0, lambda meta, off, e, err: extents.extend(e))
if not extents or sum(extents[0::2]) == 0:
    errors.append("block status answered nothing: %r" % extents[:10])
held.pwrite(b"\xcc" * 4096, 5 * 4096)   # held again
big.trim(N, 0)
held.pwrite(b"\xdd" * 4096, 7 * 4096)   # held again
if big.pread(4 << 20, 0)[7 * 4096:8 * 4096] != b"\xdd" * 4096:
    errors.append("the 4 MiB read missed the held write")
stop.set()
t.join()
print("reads while the big requests ran: %d" % reads[0])
for h in (held, reader, big):
    h.shutdown()
if errors:
    sys.exit("; ".join(errors))
EOF
run_client big 300 "$tmp/big.py"
[ "$CLIENT_RC" -eq 0 ] || { end_client big; fail "big requests client"; }
wait_closes "$tmp/big.json" 3
hwm_end=$(awk '/^VmHWM:/ { print $2 }' /proc/$pid/status)
end_client big
echo "nbdkit VmHWM: ${hwm_start} kB after start, ${hwm_end} kB at the end"

/usr/bin/python3 - "$tmp/big.json" 2 <<'EOF'
import json, sys
st = json.load(open(sys.argv[1]))
files = int(sys.argv[2])
p = st["pieces"]
c = st["client"]
# Every request that makes pieces: mutations, and the barriers of reads
# and block status (at most one each).
requests = sum(c[k]["ops"] for k in ("write", "zero", "trim", "read",
                                     "extents"))
print("pieces %r over %d requests, client %r" % (p, requests, c))
bad = []
if c["zero"]["ops"] != 1 or c["zero"]["bytes"] != 4 * 1024**3 - 4096:
    bad.append("the 4 GiB zero was not counted: %r" % c["zero"])
if p["max_per_request"] > files:
    bad.append("a request made %d pieces (files: %d)"
               % (p["max_per_request"], files))
if p["max_per_request"] < files:
    bad.append("no request spanned both files (max %d): pieces not counted?"
               % p["max_per_request"])
if p["total"] > files * requests:
    bad.append("%d pieces for %d requests" % (p["total"], requests))
if bad:
    sys.exit("; ".join(bad))
EOF

growth_max=$((64 * 1024))
if [ "${PLUG_SANITIZER:-no}" != no ]; then
  growth_max=$((256 * 1024))
fi
if [ $((hwm_end - hwm_start)) -ge $growth_max ]; then
  fail "peak RSS grew by $(((hwm_end - hwm_start) / 1024)) MiB" \
       "(from $hwm_start kB to $hwm_end kB): not bounded by the files"
fi
if [ "${PLUG_SANITIZER:-no}" = no ] && [ "$hwm_end" -ge $((200 * 1024)) ]; then
  fail "peak RSS $hwm_end kB >= 200 MB"
fi

# ---- striped data, both modes ----
cat > "$tmp/data.py" <<'EOF'
import nbd, os, random, sys
uri, expected = sys.argv[1], sys.argv[2]
U = 4096
F = 3
size = F * 1024 * 1024
rng = random.Random(33)

def connect():
    h = nbd.NBD()
    h.connect_uri(uri)
    assert h.get_size() == size
    return h

h = connect()
img = bytearray(size)

# A period of 251 bytes (prime): no two stripe units alike.
PERIOD = bytes((i * 13 + 5) & 0xff for i in range(251)) * (70 * U // 251 + 2)

def pattern(n, tag):
    start = tag % 251
    return PERIOD[start:start + n]

def write(off, n, fua=False):
    buf = pattern(n, off & 0xff)
    h.pwrite(buf, off, nbd.CMD_FLAG_FUA if fua else 0)
    img[off:off + n] = buf

def zero(off, n):
    h.zero(n, off)
    img[off:off + n] = bytes(n)

def check(h, what):
    got = h.pread(size, 0)
    if got != img:
        bad = next(i for i in range(size) if got[i] != img[i])
        sys.exit("%s: wrong byte at export offset %d (stripe unit %d, "
                 "file %d)" % (what, bad, bad // U, bad // U % F))

write(U - 500, 1000)                    # units 0|1: two files
write(2 * U - 7, 3 * U)                 # a whole row and a bit: 3 files
write(10 * U + 1, 7 * U + 3)            # several rows: scattered per file
write(0, 64 * U, fua=True)              # 64 units, FUA, from unit 0
write(100 * U - 100, 30 * U, fua=True)  # FUA, unaligned, scattered
write(size - 5 * U - 1, 5 * U + 1)      # up to the end of the export
zero(3 * U + 11, 9 * U)                 # zero over several rows
h.trim(200 * U, 6 * U)                  # trim: the data is unspecified,
img[6 * U:206 * U] = h.pread(200 * U, 6 * U)    # but reads agree after it
for k in range(40):                     # random sizes, offsets
    n = rng.randrange(1, 40 * U)
    off = rng.randrange(0, size - n)
    if k % 5 == 4:
        zero(off, n)
    else:
        write(off, n, fua=(k % 3 == 0))
    if h.pread(n, off) != img[off:off + n]:
        sys.exit("write %d [%d, +%d): read back wrong" % (k, off, n))
check(h, "before flush")
h.flush()
check(h, "after flush")
h.shutdown()
h = connect()
check(h, "after reconnecting")
h.shutdown()
with open(expected, "wb") as f:
    f.write(img)
EOF

for mode in writeback hold; do
  files=()
  for i in 0 1 2; do
    truncate -s 1M "$tmp/$mode-$i"
    files+=("$tmp/$mode-$i")
  done
  start_plug $mode -- stripe=4k "${files[@]}" mode=$mode
  run_client $mode 300 "$tmp/data.py" "$tmp/expected-$mode"
  end_client $mode
  # The server has exited: file k holds units k, k+3, k+6, ...
  /usr/bin/python3 - "$tmp/expected-$mode" "${files[@]}" <<'EOF'
import sys
U = 4096
img = open(sys.argv[1], "rb").read()
files = sys.argv[2:]
n = len(files)
for k, name in enumerate(files):
    want = b"".join(img[u * U:(u + 1) * U] for u in range(k, len(img) // U, n))
    got = open(name, "rb").read()
    if got != want:
        bad = next(i for i in range(len(got)) if got[i] != want[i])
        sys.exit("%s: wrong data at file offset %d (stripe unit %d)"
                 % (name, bad, bad // U * n + k))
EOF
done
