#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# SIGTERM with requests held in the plug: the server exits within 1 s
# (idle=10s max-delay=60s, so the timers would not get them out) and
# the data a FLUSH acknowledged is in the backing file.  Writeback mode
# (a held write already acknowledged) and hold mode (a write waiting in
# the plug for its reply), with the client still connected.  nbdkit's
# file plugin under the same client shows what nbdkit itself takes.
source ./functions.sh
set -e
set -x

requires test -x /usr/bin/python3
requires /usr/bin/python3 -c 'import nbd'
requires nbdkit --version
requires nbdkit file --version
test -f "$PLUGIN"

plug_tmpdir

# The client: write + flush 1 MiB of "F", then write 64K of "H" that
# stays held (writeback: acknowledged; hold: in flight, no reply), say
# so, and stay connected, reading elsewhere every 10 ms.  (nbdkit 1.32
# does not exit on SIGTERM while an idle client stays connected: its
# workers sit in read(2) on the socket.  With requests coming it
# answers them with ESHUTDOWN and closes.)
cat > "$tmp/client.py" <<'EOF'
import nbd, sys, time
sock, mode, ready = sys.argv[1], sys.argv[2], sys.argv[3]
M = 1 << 20
h = nbd.NBD()
h.connect_unix(sock)
h.pwrite(b"F" * M, 0)
h.flush()
if mode == "hold":
    h.aio_pwrite(nbd.Buffer.from_bytearray(b"H" * 65536), M)
else:
    h.pwrite(b"H" * 65536, M)
open(ready, "w").close()
try:
    while True:
        h.pread(4096, 2 * M)
        time.sleep(0.01)
except nbd.Error:
    pass                        # The server went away.
EOF

cat > "$tmp/check.py" <<'EOF'
import sys
d = open(sys.argv[1], "rb").read()
M = 1 << 20
if d[:M] != b"F" * M:
    bad = next(i for i in range(M) if d[i] != ord("F"))
    sys.exit("%s: flushed data missing from the file at offset %d"
             % (sys.argv[2], bad))
held = d[M:M + 65536] == b"H" * 65536
print("%s: the held (unflushed) write %s the file"
      % (sys.argv[2], "reached" if held else "did not reach"))
EOF

# run NAME NBDKIT-ARGS...: serve $tmp/NAME/img, run the client, SIGTERM,
# time the exit, check the file.
run ()
{
  local name=$1 d=$tmp/$1 pid cpid dog start end ms rc=0
  shift
  mkdir "$d"
  /usr/bin/python3 -c 'import sys
open(sys.argv[1], "wb").write(b"A" * (4 << 20))' "$d/img"

  nbdkit -f -U "$d/sock" -P "$d/pid" "$@" &
  pid=$!
  cleanup_fn kill -KILL $pid
  wait_for_file "$d/pid"
  wait_for_file "$d/sock"

  /usr/bin/python3 "$tmp/client.py" "$d/sock" $name "$d/ready" &
  cpid=$!
  cleanup_fn kill -KILL $cpid
  wait_for_file "$d/ready"
  sleep 0.2                     # Let the held write settle in the plug.
  kill -0 $pid                  # Still serving.

  # A watchdog, so that a hung server fails the test instead of hanging.
  ( sleep 20; kill -KILL $pid ) 2>/dev/null &
  dog=$!
  start=$(date +%s%N)
  kill -TERM $pid
  wait $pid || rc=$?
  end=$(date +%s%N)
  kill $dog 2>/dev/null || :
  kill -KILL $cpid 2>/dev/null || :
  ms=$(( (end - start) / 1000000 ))
  echo "$name: nbdkit exited with status $rc $ms ms after SIGTERM"

  /usr/bin/python3 "$tmp/check.py" "$d/img" $name
  if [ $ms -ge 1000 ]; then
    echo "$0: $name: exit took $ms ms (limit 1 s)"
    exit 1
  fi
}

run base file "$tmp/base/img"
for mode in writeback hold; do
  # direct=never: the requests must wait in the plug (with the default,
  # a request that cannot merge would be written at once instead).
  run $mode "$PLUGIN" file="$tmp/$mode/img" mode=$mode \
      idle=10s max-delay=60s direct=never
done
