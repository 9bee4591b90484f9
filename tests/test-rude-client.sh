#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# The rude client: 20 clients in a row, each does the handshake, sends
# 64 writes of 64 KiB and closes its socket without reading a reply,
# while a second client stays connected.  Before each rude client the
# second one writes, FLUSHes and reads back (verifies) one slot, then
# writes another slot and leaves it acknowledged and unflushed (in
# writeback mode with idle= and max-delay= long and direct=never, the
# plug still holds it while the rude client runs).  Both modes.
#
# nbdkit 1.32.4 to 1.33.9 abort (raw_send_socket: Assertion 'sock >= 0'
# failed) when two replies of a closing client race (conn.h,
# conn_leave; fixed by nbdkit commit 9d82aa4f, in 1.33.10 and 1.34.0).
# With those, an abort is allowed only as that very assertion, and the
# plug's rescue (rescue.h) must have written out what it held: every
# write the second client had acknowledged, flushed or not, is in the
# file; the server is started again for the rude clients left.  With
# --threads=1 (the workaround for those versions, in the man page) and
# with every other nbdkit, the server stays up through all 20 and exits
# with status 0 (stop_server).
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

cat > "$tmp/rude.py" <<'PYEOF'
import socket, struct, sys
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
def recvn(k):
    b = b""
    while len(b) < k:
        c = s.recv(k - len(b))
        if not c:
            sys.exit("rude client: the server closed during the handshake")
        b += c
    return b
recvn(18)                                       # NBDMAGIC IHAVEOPT flags
s.sendall(struct.pack(">I", 3))                 # FIXED_NEWSTYLE|NO_ZEROES
# NBD_OPT_GO, default export, no info requests.
s.sendall(struct.pack(">QII", 0x49484156454F5054, 7, 6) +
          struct.pack(">IH", 0, 0))
while True:
    _, _, rtype, ln = struct.unpack(">QIII", recvn(20))
    recvn(ln)
    if rtype == 1:                              # NBD_REP_ACK
        break
    if rtype & 0x80000000:
        sys.exit("rude client: NBD_OPT_GO refused (%#x)" % rtype)
n, size = 64, 65536
data = b"r" * size
for i in range(n):
    # NBD_CMD_WRITE into the first 4 MiB, never read back.
    s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 1, i,
                          (i * size) % (4 << 20), size) + data)
s.close()                                       # No reply read.
PYEOF

# The second client.  Round i: wait for go.i; write slot 2i%16, FLUSH,
# read back every slot flushed so far; write slot (2i+1)%16 and leave it
# unflushed; write ready.i.  Every step is logged (sent, acked) before
# and after, so that the check knows what was acknowledged.
cat > "$tmp/steady.py" <<'PYEOF'
import json, nbd, os, sys, time
uri, tdir, first, last = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
SLOT, NSLOTS, BASE = 65536, 16, 32 << 20
def pat(slot, gen):
    return ((b"%08d:%08d;" % (slot, gen)) * (SLOT // 18 + 1))[:SLOT]
logfd = os.open(tdir + "/steady.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
def rec(*a):
    os.write(logfd, (json.dumps(a) + "\n").encode())
def wait_file(p):
    while not os.path.exists(p):
        time.sleep(0.01)
h = nbd.NBD()
h.connect_uri(uri)
flushed = {}
try:
    for i in range(first, last + 1):
        wait_file("%s/go.%d" % (tdir, i))
        for slot, flush in ((2 * i % NSLOTS, True), ((2 * i + 1) % NSLOTS, False)):
            gen = 1000 * i + slot
            rec("sent", slot, gen)
            h.pwrite(pat(slot, gen), BASE + slot * SLOT)
            rec("acked", slot, gen)
            if flush:
                h.flush()
                flushed[slot] = gen
                for s, g in flushed.items():
                    if h.pread(SLOT, BASE + s * SLOT) != pat(s, g):
                        sys.exit("round %d: slot %d does not read back write %d"
                                 % (i, s, g))
        open("%s/ready.%d" % (tdir, i), "w").close()
except nbd.Error as e:
    rec("gone", str(e))
    print("second client: the server went away in round %d: %s" % (i, e))
    sys.exit(3)
PYEOF

# Every block of every slot holds the last write to it that the second
# client saw acknowledged (or one sent after it, never acknowledged).
cat > "$tmp/check.py" <<'PYEOF'
import json, sys
img, log = sys.argv[1], sys.argv[2]
SLOT, BASE = 65536, 32 << 20
def pat(slot, gen):
    return ((b"%08d:%08d;" % (slot, gen)) * (SLOT // 18 + 1))[:SLOT]
acked, sent = {}, {}
for line in open(log):
    ev = json.loads(line)
    if ev[0] == "sent":
        sent[ev[1]] = ev[2]
    elif ev[0] == "acked":
        acked[ev[1]] = ev[2]
d = open(img, "rb").read()
bad = 0
for slot, gen in sorted(acked.items()):
    got = d[BASE + slot * SLOT:BASE + (slot + 1) * SLOT]
    ok = [pat(slot, gen), pat(slot, sent[slot])]
    for b in range(0, SLOT, 4096):
        if all(got[b:b + 4096] != o[b:b + 4096] for o in ok):
            print("slot %d: acknowledged write %d is missing at +%d: %r"
                  % (slot, gen, b, got[b:b + 18]))
            bad += 1
            break
print("%d slots acknowledged, %d missing" % (len(acked), bad))
sys.exit(1 if bad else 0)
PYEOF

# nbdkit's versions that have the race (the assertion came with
# daef505e in 1.32.4; 9d82aa4f fixed it in 1.33.10).
ver=$(nbdkit --version | awk '{print $2}')
racy=false
if printf '%s\n' 1.32.4 "$ver" | sort -C -V &&
   ! printf '%s\n' 1.33.10 "$ver" | sort -C -V; then
  racy=true
fi

ROUNDS=20
aborts=0

# nbdkit NAME exited by itself or after SIGTERM (reaped, status in
# SERVER_RC): only nbdkit's known abort, on a version that has it, with
# the default threads, and then the second client's acknowledged
# writes must be in the file (the rescue wrote them).
known_abort () {
  local name=$1 threads=$2 img=$3 when=$4
  [ "$SERVER_RC" -eq 0 ] && return 0
  grep -q "raw_send_socket: Assertion .sock >= 0' failed" "$(server_log $name)" &&
    [ "$SERVER_RC" -eq 134 ] && $racy && [ -z "$threads" ] || {
      cat "$(server_log $name)"
      fail "$name: nbdkit exited with status $SERVER_RC $when"
    }
  aborts=$((aborts + 1))
  echo "$name: nbdkit $ver aborted $when (its known race); rescue:"
  grep -E "aborting|abort:" "$(server_log $name)" || :
  /usr/bin/python3 "$tmp/check.py" "$img" "$tmp/steady.log" ||
    fail "$name: acknowledged data lost in nbdkit's abort $when"
}

# Wait (60 s at most) for nbdkit NAME to exit by itself, then reap it.
wait_exit () {
  local name=$1 n
  for ((n = 0; n < 600; ++n)); do
    server_alive $name || break
    sleep 0.1
  done
  server_alive $name && { stop_server $name; fail "$name: $2"; }
  reap_exited $name
}

run_mode () {
  local mode=$1 threads=$2 name=$1$2 i=1 steady src why
  local img=$tmp/$name.img hold_long=
  # Writeback: the unflushed write stays in the plug while the rude
  # client runs.  (Hold mode answers once written: a one-at-a-time
  # client would wait idle= for each write there.)
  [ $mode = writeback ] && hold_long="idle=60s max-delay=60s"
  rm -f "$tmp"/go.* "$tmp"/ready.* "$tmp/steady.log"
  truncate -s 64M "$img"
  while [ $i -le $ROUNDS ]; do
    start_plug $name ${threads:+--threads=$threads} -- file="$img" \
               mode=$mode direct=never $hold_long
    rm -f "$tmp/ready.$i"
    /usr/bin/python3 "$tmp/steady.py" "$(server_uri $name)" "$tmp" $i $ROUNDS &
    steady=$!
    cleanup_fn kill -KILL $steady
    why=done
    while [ $i -le $ROUNDS ]; do
      touch "$tmp/go.$i"
      while [ ! -e "$tmp/ready.$i" ] && kill -0 $steady 2>/dev/null; do
        sleep 0.02
      done
      [ -e "$tmp/ready.$i" ] || { why=steady; break; }
      # Refused or cut in the handshake: the server is dying.
      timeout 60 /usr/bin/python3 "$tmp/rude.py" "$(server_sock $name)" ||
        { why=rude; break; }
      i=$((i + 1))
    done
    src=0
    case $why in
      rude) kill -KILL $steady; wait $steady || :; src=1 ;;
      *) wait $steady || src=$? ;;
    esac
    if [ -n "$threads" ] || ! $racy; then
      # No abort allowed: up through every round, then exit 0.
      [ $src -eq 0 ] || { server_running $name; fail "$name: round $i: the second client or rude client failed ($why)"; }
      stop_server $name
    elif [ $i -gt $ROUNDS ]; then
      # The last rude client may still be closing: nbdkit's race can
      # end it now as well.
      kill -TERM "$(server_pid $name)" 2>/dev/null || :
      wait_exit $name "still running 60 s after SIGTERM"
      known_abort $name "$threads" "$img" "at exit"
    else
      # A client lost the server in round i: it is aborting (the rescue
      # may still be writing out).  Round i again, on a new server.
      wait_exit $name "round $i: a client failed ($why), the server up"
      known_abort $name "$threads" "$img" "in round $i"
    fi
  done
  /usr/bin/python3 "$tmp/check.py" "$img" "$tmp/steady.log" ||
    fail "$name: acknowledged data lost"
}

for mode in writeback hold; do
  run_mode $mode ""
  $racy && run_mode $mode 1
done
echo "nbdkit $ver: $aborts aborts of nbdkit's own in $ROUNDS rounds x 2 modes"
