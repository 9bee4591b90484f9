#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# The plug's limits, with idle=10s max-delay=60s so that no timer
# unplugs (writeback mode: a write's reply does not wait for an unplug):
#  - max-requests=8 unplugs at 8 held requests: the largest plug held
#    exactly 8;
#  - max-bytes=64k is the connection's memory bound, and the plug
#    unplugs at half of it (the man page: one batch is written while the
#    next fills): the largest plug held exactly 32 KiB.  The first plug
#    fills to that point whatever the backend's speed (nothing else is
#    held then), and no plug passes it in 4 KiB steps;
#  - max-merge=16k caps the merged backend I/O (statsfile, and the
#    largest pwritev strace saw, when strace is there: strace -ff, one
#    output file per thread, so that no call is split into
#    "unfinished" and "resumed" lines).
# 64 sequential 4 KiB writes at queue depth 16, then a flush.
# Shown able to fail: with the engine's plug limit at the whole of
# max-bytes instead of half of it (engine_new), "failed: lp["bytes"] ==
# 65536 // 2", and with it at a quarter, the same.
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

n=64
bs=4096

cat > "$tmp/client.py" <<'EOF'
import nbd, sys
uri, img, n, bs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
qd = 16
h = nbd.NBD()
h.connect_uri(uri)
errs = []
def done(err):
    if err.value:
        errs.append(err.value)
    return 1
i = 0
while i < n or h.aio_in_flight() > 0:
    while i < n and h.aio_in_flight() < qd:
        data = bytearray([i % 250 + 1]) * bs
        h.aio_pwrite(nbd.Buffer.from_bytearray(data), i * bs, completion=done)
        i += 1
    h.poll(-1)
h.flush()
if errs:
    sys.exit("write errors: %r" % errs[:10])
d = open(img, "rb").read(n * bs)
for i in range(n):
    if d[i * bs:(i + 1) * bs] != bytes([i % 250 + 1]) * bs:
        sys.exit("block %d is not in the file after flush" % i)
h.shutdown()
EOF

# run NAME PLUG-ARGS...; the statistics are in $tmp/NAME.json
run ()
{
  local name=$1 img=$tmp/$1.img
  shift
  truncate -s 1M "$img"
  # direct=never: the requests must wait in the plug (with the default,
  # a request that cannot merge would be written at once instead).
  SERVER_WRAP=$strace \
    start_plug $name file="$img" mode=writeback \
               idle=10s max-delay=60s direct=never stats-file="$tmp/$name.json" "$@"
  timeout 60 /usr/bin/python3 $tmp/client.py "$(server_uri $name)" $img $n $bs
  stop_server $name
  cat "$tmp/$name.json"
}

# check NAME PYTHON-EXPRESSION...: each must be true of st (the stats).
check ()
{
  /usr/bin/python3 - "$tmp/$1.json" "${@:2}" <<'EOF'
import json, sys
st = json.load(open(sys.argv[1]))
u = st["unplugs"]
lp = st["largest_plug"]
w = st["backend"]["write"]
bad = [e for e in sys.argv[2:] if not eval(e)]
print("unplugs %r largest_plug %r backend.write %r" % (u, lp, w))
if bad:
    sys.exit("failed: " + "; ".join(bad))
EOF
}

strace=
run max-requests max-requests=8
check max-requests 'u["max-requests"] > 0' 'lp["requests"] == 8' \
      'u["idle"] == 0 and u["max-delay"] == 0' \
      "w['bytes'] == $n * $bs"

run max-bytes max-bytes=64k
check max-bytes 'u["max-bytes"] > 0' 'lp["bytes"] == 65536 // 2' \
      'u["idle"] == 0 and u["max-delay"] == 0' \
      "w['bytes'] == $n * $bs"

if strace -ff -o "$tmp/probe" true >/dev/null 2>&1; then
  mkdir "$tmp/strace"
  strace="strace -ff -qq -e trace=pwritev,pwritev2,pwrite64 -o $tmp/strace/t"
fi
run max-merge max-merge=16k
# All 64 writes sit in one plug until the flush: 256K in runs of at most
# 16K is at least 16 backend writes, and sequential data merges to
# exactly that.
check max-merge 'u["flush"] == 1' 'lp["requests"] == 64' \
      "w['bytes'] == $n * $bs" "w['ops'] >= w['bytes'] // 16384" \
      "w['ops'] == w['bytes'] // 16384"
if [ -n "$strace" ]; then
  # Every line of a per-thread file is one whole call.  The backend
  # writes are the pwrite family calls (socket replies are sendmsg or
  # write); their return value is the byte count.
  cat "$tmp"/strace/t.* > "$tmp/strace.all"
  if grep -E 'unfinished|resumed' "$tmp/strace.all"; then
    echo "$0: strace -ff still split a call"
    exit 1
  fi
  calls=$(grep -cE '^pwrite(v|v2|64)\(' "$tmp/strace.all" || :)
  largest=$(sed -nE 's/^pwrite(v|v2|64)\(.*\) += ([0-9]+)$/\2/p' \
                "$tmp/strace.all" | sort -n | tail -1)
  total=$(sed -nE 's/^pwrite(v|v2|64)\(.*\) += ([0-9]+)$/\2/p' \
              "$tmp/strace.all" | awk '{ n += $1 } END { print n + 0 }')
  echo "backend writes seen by strace: $calls, $total bytes, largest $largest"
  test "$largest" -le 16384
  test "$largest" -gt 0
  test "$total" -eq $((n * bs))
fi
