#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# SIGTERM with requests held in the plug: the exit itself unplugs them
# (idle=10s max-delay=60s: statsfile counts no unplug by either timer,
# and in writeback mode one by the exit, "close"), the server exits
# with status 0, the data a FLUSH acknowledged is in the backing file,
# and so is the held write once it was replied to:
#  - writeback mode: the held write was acknowledged before the SIGTERM
#    (a reply means "we have it"), so the graceful exit must write it out;
#  - hold mode: the write waits in the plug for its reply; if the reply
#    came and said success (the client records it), it is in the file;
#    failing it (ESHUTDOWN) or never replying is allowed, dropping a
#    success is not.
# The client stays connected throughout.  nbdkit's file plugin under the
# same client shows what nbdkit itself takes.
source ./functions.sh
set -e
set -x

requires_python_nbd
requires nbdkit file --version

plug_tmpdir

# The client: write + flush 1 MiB of "F", then write 64K of "H" that
# stays held (writeback: acknowledged; hold: in flight, no reply), say
# so, and stay connected, reading elsewhere every 10 ms.  (nbdkit 1.32
# does not exit on SIGTERM while an idle client stays connected: its
# workers sit in read(2) on the socket.  With requests coming it
# answers them with ESHUTDOWN and closes.)  The held write's outcome
# goes to the file ACKED: "ok" (a successful reply), or the error.
cat > "$tmp/client.py" <<'PYEOF'
import nbd, sys, time
sock, mode, ready, acked = sys.argv[1:5]
M = 1 << 20
h = nbd.NBD()
h.connect_unix(sock)
h.pwrite(b"F" * M, 0)
h.flush()

def record(err):
    with open(acked, "w") as f:
        f.write("ok\n" if err.value == 0 else "error %d\n" % err.value)
    return 1

if mode == "hold":
    h.aio_pwrite(nbd.Buffer.from_bytearray(b"H" * 65536), M,
                 completion=record)
else:
    h.pwrite(b"H" * 65536, M)
    open(acked, "w").write("ok\n")
open(ready, "w").close()
# A reply to the held write that comes while the client still reads is
# recorded (libnbd handles every reply it reads); the client does not
# wait for it after the server stopped answering (a client that only
# waits is an idle one, see above).
try:
    while True:
        h.pread(4096, 2 * M)
        time.sleep(0.01)
except nbd.Error:
    pass                        # The server went away.
PYEOF

cat > "$tmp/check.py" <<'PYEOF'
import os, sys
img, name, acked = sys.argv[1:4]
d = open(img, "rb").read()
M = 1 << 20
if d[:M] != b"F" * M:
    bad = next(i for i in range(M) if d[i] != ord("F"))
    sys.exit("%s: flushed data missing from the file at offset %d"
             % (name, bad))
held = d[M:M + 65536] == b"H" * 65536
outcome = open(acked).read().strip() if os.path.exists(acked) else "no reply"
print("%s: the held (unflushed) write %s the file; its reply: %s"
      % (name, "reached" if held else "did not reach", outcome))
if outcome == "ok" and not held:
    sys.exit("%s: the held write was acknowledged, and it is not in the file "
             "after a graceful SIGTERM" % name)
if d[M:M + 65536] not in (b"H" * 65536, b"A" * 65536):
    sys.exit("%s: the held write's range is torn" % name)
PYEOF

kill_quietly () { kill -KILL "$@" 2>/dev/null || :; }

# run NAME NBDKIT-ARGS...: serve $tmp/NAME/img, run the client, SIGTERM,
# time the exit, check the file.
run ()
{
  local name=$1 d=$tmp/$1 cpid start end ms
  shift
  mkdir "$d"
  /usr/bin/python3 -c 'import sys
open(sys.argv[1], "wb").write(b"A" * (4 << 20))' "$d/img"

  start_server $name "$@"

  timeout 60 /usr/bin/python3 "$tmp/client.py" "$(server_sock $name)" $name \
          "$d/ready" "$d/acked" &
  cpid=$!
  cleanup_fn kill_quietly $cpid
  wait_for_file "$d/ready" 30
  sleep 0.2                     # Let the held write settle in the plug.
  kill -0 "$(server_pid $name)" # Still serving.

  start=$(date +%s%N)
  SERVER_STOP_TIMEOUT=20 stop_server $name
  end=$(date +%s%N)
  wait $cpid || :
  ms=$(( (end - start) / 1000000 ))
  echo "$name: nbdkit exited $ms ms after SIGTERM"

  /usr/bin/python3 "$tmp/check.py" "$d/img" $name "$d/acked"
  [ $name = base ] && return
  cat "$d/stats.json"
  /usr/bin/python3 - "$d/stats.json" $name <<'EOF2'
import json, sys
u = {k: v for k, v in json.load(open(sys.argv[1]))["unplugs"].items() if v}
print("unplugs:", u)
if "idle" in u or "max-delay" in u:
    sys.exit("unplugs %r: a timer unplugged, not the exit" % u)
# Hold mode: the client's one worker parks in the plug, which unplugs
# it at once ("parked"); writeback: the held write waits for the exit.
if sys.argv[2] == "writeback" and u.get("close", 0) < 1:
    sys.exit("unplugs %r: the exit did not unplug (close)" % u)
EOF2
}

run base file "$tmp/base/img"
for mode in writeback hold; do
  # direct=never: the requests must wait in the plug (with the default,
  # a request that cannot merge would be written at once instead).
  run $mode "$PLUGIN" file="$tmp/$mode/img" mode=$mode \
      idle=10s max-delay=60s direct=never stats-file="$tmp/$mode/stats.json"
done
