#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# No deadlock when the client has more requests in flight than nbdkit
# has worker threads: with -t 1, 2 and 4, bursts of 64 in-flight writes
# (then reads and a flush) complete, in hold mode (every worker waits in
# the plug for its reply) and in writeback mode.  With -t 1 the test is
# also run with idle= and max-delay= far beyond the time limit, so only
# the plug's own trigger (every worker parked) can get the plug going.
# (With -t 2 or 4 and such timers, hold mode's last request of a burst
# can wait for idle=: a worker blocked reading the socket is invisible
# to the plugin.  Bounded by idle=, so not run here.)
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

cat > "$tmp/burst.py" <<'EOF'
import nbd, random, sys
uri = sys.argv[1]
size = 1 << 20
bs = 4096
burst = 64
rounds = 4
h = nbd.NBD()
h.connect_uri(uri)
errs = []
def done(err):
    if err.value:
        errs.append(err.value)
    return 1
ref = bytearray(size)
rng = random.Random(1)
for r in range(rounds):
    # 64 writes to distinct random blocks, all in flight at once.
    blocks = rng.sample(range(size // bs), burst)
    for b in blocks:
        data = bytearray([(r * 64 + b) % 255 + 1]) * bs
        ref[b * bs:(b + 1) * bs] = data
        h.aio_pwrite(nbd.Buffer.from_bytearray(data), b * bs,
                     completion=done)
    while h.aio_in_flight() > 0:
        h.poll(-1)
    # 64 reads of the same blocks, all in flight at once.
    bufs = []
    for b in blocks:
        buf = nbd.Buffer(bs)
        bufs.append((b, buf))
        h.aio_pread(buf, b * bs, completion=done)
    while h.aio_in_flight() > 0:
        h.poll(-1)
    for b, buf in bufs:
        if buf.to_bytearray() != ref[b * bs:(b + 1) * bs]:
            sys.exit("round %d: block %d reads back wrong" % (r, b))
    if errs:
        sys.exit("round %d: errors %r" % (r, errs[:10]))
h.flush()
h.shutdown()
open(sys.argv[2], "wb").write(ref)
EOF

# run MODE THREADS LIMIT-SECONDS [PLUG-ARGS...]
run ()
{
  local mode=$1 t=$2 limit=$3 img start end ms rc=0 name
  shift 3
  name=$mode-$t-$#
  img=$tmp/$name.img
  truncate -s 1M "$img"
  start_plug $name -t $t -- file="$img" mode=$mode "$@"
  start=$(date +%s%N)
  timeout 60 \
    /usr/bin/python3 $tmp/burst.py "$(server_uri $name)" $img.ref || rc=$?
  end=$(date +%s%N)
  ms=$(( (end - start) / 1000000 ))
  if [ $rc -eq 124 ]; then
    echo "$0: mode=$mode -t $t $*: deadlock (timed out after 60 s)"
    exit 1
  fi
  test $rc -eq 0
  stop_server $name
  cmp "$img" "$img.ref"
  echo "mode=$mode -t $t $*: ok in $ms ms"
  if [ $ms -gt $((limit * 1000)) ]; then
    echo "$0: mode=$mode -t $t $*: took $ms ms, limit $limit s"
    exit 1
  fi
}

for mode in hold writeback; do
  for t in 1 2 4; do
    run $mode $t 30
  done
  # One worker, timers that never fire during the test.
  run $mode 1 20 idle=60s max-delay=60s
done
