#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# NBD servers that go away (test-remote-unreachable: not there at start).
#  - Killed (SIGKILL) while a write is in flight at it, and restarted on
#    the same data (nbdkit file) after a while: the plug reconnects; what
#    was acknowledged and flushed before the kill is in the file; the
#    write that died in flight is written again after the reconnect (the
#    new server's log shows it); a write acknowledged during the outage
#    is written by the next FLUSH; a read during the outage waits for the
#    reconnect and sees the right data.
# Over a unix socket and over TCP 127.0.0.1 (the same port again).
#  - An outage longer than requeue-timeout=1s: a FLUSH of writes held in
#    writeback mode and a read both fail with EIO, and a hold-mode write
#    too; the plug stays up, and once the server is back the same
#    requests succeed.
#  - Every connection to a server (four: nbdkit file has multi-conn) at
#    end-of-file at once, with reads in flight on each: the plug is
#    stopped (SIGSTOP) while the server is killed and restarted, then
#    resumed.  A read sent again on a connection whose end the plug has
#    not read yet fails there (the socket is closed) and marks it
#    broken; the reads go to the new server and return the right data.
#    With pick_conn() taking a broken connection too, the loop thread
#    sends the same read to that connection again and again and never
#    answers: "FAIL: 64 reads still unanswered 60 s after the server
#    came back".
source ./functions.sh
set -e

requires /usr/bin/python3 -c 'import nbd'
requires nbdkit file --version
test -f "$PLUGIN"

plug_tmpdir
source "$srcdir/remote-lib.sh"

cat > "$tmp/client.py" <<'EOF2'
import nbd, os, sys, time
uri, tmp = sys.argv[1], sys.argv[2]
K, M = 1024, 1024 * 1024

def mark(name):
    open(os.path.join(tmp, name), "w").close()

def wait_mark(name):
    for _ in range(600):
        if os.path.exists(os.path.join(tmp, name)):
            return
        time.sleep(0.05)
    sys.exit("client: no %s after 30 s" % name)

def run_until(h, cookie):
    while not h.aio_command_completed(cookie):
        h.poll(-1)

h = nbd.NBD()
h.connect_uri(uri)
h.pwrite(b"F" * M, 0)
h.flush()
mark("flushed")

# Held, then sent by a FLUSH: the server delays it; the test kills the
# server while it waits.
for i in range(4):
    h.pwrite(b"H" * (64 * K), M + i * 64 * K)
fl = h.aio_flush()
mark("flushing")
wait_mark("killed")

# The outage: a write is acknowledged (held), a read waits.
h.pwrite(b"O" * (64 * K), 2 * M)
buf = nbd.Buffer(4096)
rd = h.aio_pread(buf, 4096)
mark("outage")
wait_mark("restarted")

run_until(h, fl)                # Raises if the FLUSH failed.
run_until(h, rd)
assert buf.to_bytearray() == b"F" * 4096, "read during the outage differs"
h.flush()
assert h.pread(256 * K, M) == b"H" * (256 * K), "died write missing"
assert h.pread(64 * K, 2 * M) == b"O" * (64 * K), "outage write missing"
h.shutdown()
print("client: ok")
EOF2

kill_quiet ()
{
  kill -KILL "$@" 2>/dev/null || :
}

wait_marker ()
{
  local i
  for ((i = 0; i < 600; ++i)); do
    [ -e "$tmp/$1" ] && return 0
    sleep 0.05
  done
  echo "no marker $1 after 30 s"
  return 1
}

run ()
{
  local how=$1 d=$tmp/$1 i
  mkdir "$d"
  /usr/bin/python3 -c 'import sys
open(sys.argv[1], "wb").write(b"A" * (4 << 20))' "$d/disk.img"

  # The first server delays every write by 2 s (the log filter in front
  # of it shows when one arrived).
  srv_start "$how-r" "$how" --filter=log --filter=delay file "$d/disk.img" \
            delay-write=2 logfile="$d/r1.txt"
  srv_start "$how-plug" unix "$PLUGIN" "file=${srv_uri[$how-r]}" \
            idle=10s max-delay=60s direct=never stats-file="$d/stats.json"
  /usr/bin/python3 "$tmp/client.py" "${srv_uri[$how-plug]}" "$d" &
  cpid=$!
  cleanup_fn kill_quiet $cpid

  wait_marker "$how/flushed"
  /usr/bin/python3 - "$d/disk.img" <<'EOF2'
import sys
d = open(sys.argv[1], "rb").read()
assert d[:1 << 20] == b"F" * (1 << 20), "flushed data not in the file"
EOF2
  wait_marker "$how/flushing"
  # Kill once the server has the held write in flight.
  for ((i = 0; i < 600; ++i)); do
    grep -q "Write id=.* offset=0x100000 " "$d/r1.txt" && break
    sleep 0.05
  done
  grep -q "Write id=.* offset=0x100000 " "$d/r1.txt"
  srv_kill "$how-r"
  touch "$d/killed"
  wait_marker "$how/outage"
  sleep 0.5                     # A real outage: several failed reconnects.
  srv_start "$how-r" "$how" --filter=log file "$d/disk.img" \
            logfile="$d/r2.txt"
  touch "$d/restarted"
  wait $cpid
  srv_stop "$how-plug"
  srv_stop "$how-r"

  /usr/bin/python3 - "$d/disk.img" <<'EOF2'
import sys
M = 1 << 20
d = open(sys.argv[1], "rb").read()
want = (b"F" * M + b"H" * (M // 4) + b"A" * (3 * M // 4) +
        b"O" * (M // 16) + b"A" * (2 * M - M // 16))
assert d == want, "disk.img differs at %d" % next(
    i for i in range(len(d)) if d[i] != want[i])
print("disk.img: ok")
EOF2
  # The died write reached the new server; the plug saw the outage.
  grep -q "Write id=.* offset=0x100000 " "$d/r2.txt"
  grep -q "connection lost" "$tmp/$how-plug.log"
  [ "$(jq .retry.eagain "$d/stats.json")" -gt 0 ]
  [ "$(jq .retry.errors "$d/stats.json")" -eq 0 ]
}

requires jq --version
run unix
run tcp

# ---- an outage longer than requeue-timeout ----
cat > "$tmp/timeout.py" <<'EOF2'
import errno, nbd, os, sys, time
wb_uri, hold_uri, tmp = sys.argv[1:4]
K = 1024

def expect_eio(what, fn):
    t = time.monotonic()
    try:
        fn()
    except nbd.Error as e:
        assert e.errnum == errno.EIO, "%s: %s" % (what, e)
        print("ok: %s failed with EIO after %.1f s"
              % (what, time.monotonic() - t))
        return
    sys.exit("%s succeeded with the server gone" % what)

wb = nbd.NBD()
wb.connect_uri(wb_uri)
hold = nbd.NBD()
hold.connect_uri(hold_uri)
wb.pwrite(b"1" * (64 * K), 0)
wb.flush()
open(os.path.join(tmp, "t-ready"), "w").close()
while not os.path.exists(os.path.join(tmp, "t-killed")):
    time.sleep(0.05)
wb.pwrite(b"2" * (64 * K), 64 * K)           # acknowledged: held
expect_eio("writeback FLUSH", wb.flush)
expect_eio("read", lambda: wb.pread(4096, 0))
expect_eio("hold-mode write", lambda: hold.pwrite(b"3" * 4096, 256 * K))
open(os.path.join(tmp, "t-failed"), "w").close()
while not os.path.exists(os.path.join(tmp, "t-back")):
    time.sleep(0.05)
wb.pwrite(b"4" * (64 * K), 64 * K)
wb.flush()
hold.pwrite(b"5" * 4096, 256 * K)
assert wb.pread(64 * K, 0) == b"1" * (64 * K), "flushed data changed"
assert wb.pread(64 * K, 64 * K) == b"4" * (64 * K), "rewrite missing"
assert wb.pread(4096, 256 * K) == b"5" * 4096, "hold write missing"
print("ok: all good again once the server is back")
wb.shutdown()
hold.shutdown()
EOF2
truncate -s 1M "$tmp/t.img"
srv_start t-r unix file "$tmp/t.img"
# -v: the plugs log "reconnected" (debug), which the test waits for.
srv_start t-wb unix -v "$PLUGIN" "file=${srv_uri[t-r]}" requeue-timeout=1s \
          idle=10s max-delay=60s direct=never
srv_start t-hold unix -v "$PLUGIN" "file=${srv_uri[t-r]}" requeue-timeout=1s \
          mode=hold
/usr/bin/python3 "$tmp/timeout.py" "${srv_uri[t-wb]}" "${srv_uri[t-hold]}" \
                 "$tmp" &
cpid=$!
cleanup_fn kill_quiet $cpid
wait_marker t-ready
srv_kill t-r
touch "$tmp/t-killed"
wait_marker t-failed
srv_start t-r unix file "$tmp/t.img"
for p in t-wb t-hold; do
  for ((i = 0; i < 600; ++i)); do
    grep -q "reconnected" "$tmp/$p.log" && break
    sleep 0.05
  done
  grep -q "reconnected" "$tmp/$p.log"
done
touch "$tmp/t-back"
wait $cpid
srv_stop t-wb
srv_stop t-hold
srv_stop t-r

# ---- every connection at end-of-file at once, reads in flight on each ----
/usr/bin/python3 -c 'import sys
open(sys.argv[1], "wb").write(bytes(range(256)) * (4 << 12))' "$tmp/d.img"
# The reads wait at the server until it is killed.
srv_start d-r unix --filter=log --filter=delay file "$tmp/d.img" \
          delay-read=60 logfile="$tmp/d-r1.txt"
# -t 64: every one of the 64 reads reaches the plug, 16 per connection.
srv_start d-plug unix -t 64 "$PLUGIN" "file=${srv_uri[d-r]}"
cat > "$tmp/dead.py" <<'EOF2'
import nbd, os, plugtest, sys, time
uri, log, tmp = sys.argv[1:4]
N = 64
h = nbd.NBD()
h.connect_uri(uri)
bufs, cookies, conns = plugtest.held_reads(h, log, N)
print("%d reads at the server, on its connections %s"
      % (len(conns), sorted(set(conns))))
assert len(conns) == N and len(set(conns)) == 4, "reads not on 4 connections"
open(os.path.join(tmp, "d-inflight"), "w").close()
while not os.path.exists(os.path.join(tmp, "d-back")):
    time.sleep(0.05)
# Generous: answered within requeue-timeout (10 s) whatever happens.
deadline = time.monotonic() + 60
for c in cookies:
    while not h.aio_command_completed(c):
        if time.monotonic() > deadline:
            left = sum(1 for c in cookies if not h.aio_command_completed(c))
            sys.exit("FAIL: %d reads still unanswered 60 s after the server "
                     "came back" % left)
        h.poll(1000)
plugtest.check_reads(bufs, os.path.join(tmp, "d.img"))
print("client: the %d reads answered with the right data" % N)
h.shutdown()
EOF2
/usr/bin/python3 "$tmp/dead.py" "${srv_uri[d-plug]}" "$tmp/d-r1.txt" "$tmp" &
cpid=$!
cleanup_fn kill_quiet $cpid
wait_marker d-inflight
# The plug sees every connection end at once when it resumes.
kill -STOP "$(server_pid d-plug)"
srv_kill d-r
srv_start d-r unix file "$tmp/d.img"
kill -CONT "$(server_pid d-plug)"
touch "$tmp/d-back"
wait $cpid
grep -q "connection lost" "$tmp/d-plug.log"
srv_stop d-plug
srv_stop d-r
