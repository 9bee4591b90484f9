#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# What NBD servers advertise, honoured, as their own logs show:
#  - server A (blocksize-policy: minimum 4K, maximum 64K, violations are
#    errors): the export's minimum block size is 4K; a 1 MiB write and a
#    merged run reach A as 64K writes, reads as 64K reads; a request that
#    is not a multiple of 4K is refused with EINVAL, the error naming A;
#  - server B (fua filter in its default fuamode=none, nozero filter): a FUA write
#    reaches B as a write and then a FLUSH; a zero reaches it as a write
#    of zeroes; a fast zero is refused with ENOTSUP and never sent;
#  - on A (which has FUA), a FUA write carries the flag and no FLUSH.
source ./functions.sh
set -e

requires /usr/bin/python3 -c 'import nbd'
test -f "$PLUGIN"

plug_tmpdir
source "$srcdir/remote-lib.sh"

srv_start A unix --filter=log --filter=blocksize-policy memory 4M \
          blocksize-minimum=4096 blocksize-maximum=64K \
          blocksize-error-policy=error logfile="$tmp/A.txt"
srv_start B tcp --filter=log --filter=fua --filter=nozero memory 4M \
          logfile="$tmp/B.txt"
# idle=10s max-delay=60s: only FLUSH, FUA and max-requests unplug.
srv_start plug unix "$PLUGIN" "file=${srv_uri[A]}" "file=${srv_uri[B]}" \
          idle=10s max-delay=60s max-requests=32

cat > "$tmp/client.py" <<'EOF2'
import errno, nbd, os, sys
uri = sys.argv[1]
K, M = 1024, 1024 * 1024
h = nbd.NBD()
h.connect_uri(uri)
mn = h.get_block_size(nbd.SIZE_MINIMUM)
assert mn == 4096, "export minimum block size %d, expected 4096" % mn

# Server A: one 1 MiB write, then 32 adjacent 4K writes (one run).
data = os.urandom(M)
h.pwrite(data, 0)
small = os.urandom(128 * K)
for i in range(32):
    h.pwrite(small[i * 4 * K:(i + 1) * 4 * K], M + i * 4 * K)
h.flush()
assert h.pread(M, 0) == data, "1 MiB read back differs"
assert h.pread(128 * K, M) == small, "merged run read back differs"
# FUA on A: the flag is sent.
h.pwrite(b"F" * 4096, 2 * M, nbd.CMD_FLAG_FUA)

# Misaligned: refused by the plug, not sent (libnbd would refuse them
# itself, knowing the export's minimum: let them through).
h.set_strict_mode(0)
for what, fn in (("write", lambda: h.pwrite(b"x" * 512, 512)),
                 ("read", lambda: h.pread(512, 4096 + 512)),
                 ("zero", lambda: h.zero(1000, 8192))):
    try:
        fn()
        sys.exit("misaligned %s succeeded" % what)
    except nbd.Error as e:
        assert e.errnum == errno.EINVAL, "%s: %s" % (what, e)

# Server B (export offset 4M): FUA emulated, zero written.
B = 4 * M
h.pwrite(b"U" * 8192, B, nbd.CMD_FLAG_FUA)
h.pwrite(b"Z" * 65536, B + M)
h.flush()
h.zero(65536, B + M)
assert h.pread(65536, B + M) == bytes(65536), "zero did not zero"
try:
    h.zero(65536, B + 2 * M, nbd.CMD_FLAG_FAST_ZERO)
    sys.exit("fast zero to a server without zero succeeded")
except nbd.Error as e:
    assert e.errnum == errno.ENOTSUP, "fast zero: %s" % e
h.flush()
h.shutdown()
print("client: ok")
EOF2
/usr/bin/python3 "$tmp/client.py" "${srv_uri[plug]}"
srv_stop plug
srv_stop A
srv_stop B

cat > "$tmp/check.py" <<'EOF2'
import re, sys
K, M = 1024, 1024 * 1024

def parse(path):
    ops = []
    for line in open(path):
        m = re.search(r"connection=\d+ (\w+) id=(\d+)(.*)", line)
        if not m or m.group(1) == "Disconnect":
            continue
        kw = dict(re.findall(r"(\w+)=(\S+)", m.group(3)))
        ops.append((m.group(1), kw))
    return ops

a = parse(sys.argv[1])
b = parse(sys.argv[2])
aw = [(int(k["offset"], 16), int(k["count"], 16), k["fua"])
      for op, k in a if op == "Write"]
ar = [(int(k["offset"], 16), int(k["count"], 16))
      for op, k in a if op == "Read"]
print("A: %d writes, %d reads, largest write %d" %
      (len(aw), len(ar), max(c for _, c, _ in aw)))
assert all(c <= 64 * K and o % 4096 == 0 and c % 4096 == 0
           for o, c, _ in aw), "A got a write over 64K or misaligned"
assert all(c <= 64 * K for _, c in ar), "A got a read over 64K"
first = sorted((o, c) for o, c, _ in aw if o < M + 128 * K)
assert sum(c for _, c in first) == M + 128 * K, "A: bytes written %r" % first
# 1 MiB in 16 writes, the 32 merged 4K writes in 2: never 32.
assert len(first) == 18, "A: %d writes for the first 1152K" % len(first)
fua = [w for w in aw if w[2] == "1"]
assert fua == [(2 * M, 4096, "1")], "A: FUA writes %r" % fua
assert not any(k.get("offset") == hex(512) for _, k in a), "misaligned sent"

# B: the FUA write is a plain write followed by a FLUSH; zero as write.
names = [op for op, _ in b]
assert "Zero" not in names, "B got a Zero although it has none"
bw = [(int(k["offset"], 16), int(k["count"], 16), k["fua"], i)
      for i, (op, k) in enumerate(b) if op == "Write"]
assert all(f == "0" for _, _, f, _ in bw), "B got a FUA flag"
u = [w for w in bw if w[0] == 0]
assert len(u) == 1 and u[0][1] == 8192, "B: the FUA write %r" % u
assert "Flush" in names[u[0][3] + 1:], "B: no FLUSH after the FUA write"
z = [w for w in bw if w[0] == M]
assert len(z) == 2, "B: writes at 1M %r (data, then zeroes)" % z
assert not any(w[0] == 2 * M for w in bw), "B: the fast zero was sent"
print("B: %d writes, %d flushes" % (len(bw), names.count("Flush")))
# A FLUSH reaches a server only if it answered a mutation since its last
# FLUSH without FUA (always the first time).  A: the client's first
# FLUSH only (its FUA write is durable once answered: the later FLUSHes
# and the one at exit find it clean).  B: the first FLUSH, one for the
# FUA write it could not flag, the client's second (the write at 1M) and
# third (the zero); not at exit.
af = [op for op, _ in a].count("Flush")
bf = names.count("Flush")
assert (af, bf) == (1, 4), "flushes: A %d, B %d (expected 1, 4)" % (af, bf)
EOF2
/usr/bin/python3 "$tmp/check.py" "$tmp/A.txt" "$tmp/B.txt"
# A layout where aligned requests would reach A misaligned: A starting
# at 6000 bytes into the export.  Refused at start, naming A.
truncate -s 6000 "$tmp/odd.img"
srv_start A2 unix --filter=blocksize-policy memory 1M blocksize-minimum=4096
rc=0
nbdkit -U "$tmp/refused.sock" "$PLUGIN" "file=$tmp/odd.img" \
       "file=${srv_uri[A2]}" --run true \
       2> "$tmp/odd.err" || rc=$?
cat "$tmp/odd.err"
[ $rc -ne 0 ]
grep -q "file=${srv_uri[A2]}: its offset in the export 6000 is not a multiple of the minimum block size 4096" \
     "$tmp/odd.err"
srv_stop A2

# The refusals named the server.
grep -q "file=${srv_uri[A]}: write of 512 bytes at offset 512 is not aligned" \
     "$tmp/plug.log"
