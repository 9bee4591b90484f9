#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# A remote that dies with writes it answered and no FLUSH covered: the
# server may come back from its last synced state, without them, and a
# FLUSH to the new connection would succeed.  The plug records them as
# failed writes instead.  The server here is killed (SIGKILL) and
# restarted from a copy of its file taken when it was synced: a server
# that lost its cache in a crash.
#  - lost: a write the server answered (a read through the plug waits
#    for it) and no FLUSH covered; the server dies and comes back
#    without it: the next FLUSH fails with EIO, and so does the one
#    after it; once the range is written again, a FLUSH succeeds and the
#    data is there.
#  - widened: 100 writes 4 KiB apart, more ranges than a connection
#    keeps (64): they are kept as one range, their hull, which the loss
#    line names ("widened"); the FLUSHes fail until the whole hull is
#    written again.
#  - flushed: the same as "lost", but a FLUSH covered the write before the server
#    died: the FLUSH after the restart succeeds (no false failure), and
#    so do later writes and FLUSHes.
#  - fua: a write sent with FUA to a server with FUA is durable once
#    answered: no failure either.
#  - inflight: the FLUSH that would cover the write is at the server
#    (an nbdkit eval server whose flush waits) when the server dies:
#    the plug would send it again to the new server, where it covers
#    nothing of the old one; it fails with EIO, and so does the next
#    FLUSH (here the engine's answer to it came before the loss).
# One connection to the server (remote-connections=1), so that the
# "connection lost" line, logged after the record, says the record is
# made before the client's next FLUSH.
source ./functions.sh
set -e

requires /usr/bin/python3 -c 'import nbd'
requires nbdkit file --version
requires nbdkit eval --version
test -f "$PLUGIN"

plug_tmpdir
source "$srcdir/remote-lib.sh"

cat > "$tmp/client.py" <<'EOF2'
import errno, nbd, os, sys, time
case, uri, d = sys.argv[1:4]
K = 1024

def mark(name):
    open(os.path.join(d, name), "w").close()

def wait_mark(name):
    for _ in range(1200):
        if os.path.exists(os.path.join(d, name)):
            return
        time.sleep(0.05)
    sys.exit("client: no %s after 60 s" % name)

def expect_eio(what, fn):
    try:
        fn()
    except nbd.Error as e:
        assert e.errnum == errno.EIO, "%s: %s" % (what, e)
        print("client: ok: %s failed with EIO" % what)
        return
    sys.exit("client: FAIL: %s succeeded: the data it covers is gone" % what)

def wait_cmd(h, cookie):
    while not h.aio_command_completed(cookie):   # Raises if it failed.
        h.poll(-1)

def written(h, byte, off, n):
    assert h.pread(n, off) == byte * n, "%r at %d: not what was written" % (
        byte, off)

h = nbd.NBD()
h.connect_uri(uri)
if case in ("lost", "inflight"):
    h.pwrite(b"B" * (64 * K), 0)
    # Held (direct=never, idle=10s): the read unplugs it and waits until
    # the server answered it.
    written(h, b"B", 0, 64 * K)
elif case == "widened":
    for i in range(100):
        h.pwrite(b"B" * (4 * K), i * 8 * K)
    got = h.pread(800 * K, 0)   # Waits for all of them.
    for i in range(100):
        assert got[i * 8 * K:i * 8 * K + 4 * K] == b"B" * (4 * K)
elif case == "flushed":
    h.pwrite(b"B" * (64 * K), 0)
    written(h, b"B", 0, 64 * K)
    h.flush()
elif case == "fua":
    h.pwrite(b"B" * (64 * K), 0, nbd.CMD_FLAG_FUA)
mark("answered")

if case == "inflight":
    fl = h.aio_flush()

wait_mark("back")
if case in ("lost", "widened", "inflight"):
    if case != "inflight":
        expect_eio("FLUSH after the restart", h.flush)
    else:
        expect_eio("FLUSH at the server when it died",
                   lambda: wait_cmd(h, fl))
    # Every FLUSH fails until the range is written again.  (For "lost"
    # and "widened", this needs engine_record_lost's lasting record:
    # with the one-shot deferred error of its interim body, this FLUSH
    # succeeds.)
    expect_eio("second FLUSH", h.flush)
    n = 800 * K if case == "widened" else 64 * K
    h.pwrite(b"C" * n, 0)
    h.flush()
    written(h, b"C", 0, n)
    print("client: ok: the range written again, a FLUSH succeeds")
else:
    h.flush()
    written(h, b"B", 0, 64 * K)
    h.pwrite(b"C" * (64 * K), 128 * K)
    h.flush()
    written(h, b"C", 128 * K, 64 * K)
    print("client: ok: every FLUSH succeeded")
h.shutdown()
EOF2

kill_quiet ()
{
  kill -KILL "$@" 2>/dev/null || :
}

wait_marker ()
{
  local i
  for ((i = 0; i < 1200; ++i)); do
    [ -e "$1" ] && return 0
    sleep 0.05
  done
  echo "no $1 after 60 s"
  return 1
}

# wait_file FILE TEXT: up to 60 s for TEXT (a fixed string) in FILE.
wait_file ()
{
  local i
  for ((i = 0; i < 1200; ++i)); do
    grep -qF -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "no \"$2\" in $1 after 60 s"
  return 1
}

# srv_start NAME unix ARGS..., without the sanitizer runtime that a
# sanitizer build preloads into every nbdkit (functions.sh): the eval
# plugin's scripts inherit it, and /bin/sh crashes under it (TSan).  The
# servers here are not what is tested.
srv_start_plain ()
{
  local name=$1
  shift
  if [ -n "${_plug_wrapdir:-}" ]; then
    SERVER_WRAP="env PATH=${PATH//"$_plug_wrapdir:"/}" srv_start "$name" unix "$@"
  else
    srv_start "$name" unix "$@"
  fi
}

run ()
{
  local case=$1 d=$tmp/$1 srv=$1-r plug=$1-plug server=()
  mkdir "$d"
  /usr/bin/python3 -c 'import sys
open(sys.argv[1], "wb").write(b"A" * (1 << 20))' "$d/disk.img"
  server=(file "$d/disk.img")
  if [ "$case" = inflight ]; then
    # A server that holds a FLUSH until the test killed it.
    server=(eval get_size='echo 1048576'
            pread="dd if=$d/disk.img skip=\$4 count=\$3 status=none iflag=skip_bytes,count_bytes"
            pwrite="dd of=$d/disk.img seek=\$4 status=none conv=notrunc oflag=seek_bytes"
            can_write='exit 0' can_flush='exit 0'
            flush="touch $d/flush-arrived; while [ ! -e $d/killed ]; do sleep 0.05; done")
  fi

  echo "== $case"
  srv_start_plain "$srv" "${server[@]}"
  srv_start "$plug" unix "$PLUGIN" "file=${srv_uri[$srv]}" \
            remote-connections=1 idle=10s max-delay=60s direct=never
  /usr/bin/python3 "$tmp/client.py" "$case" "${srv_uri[$plug]}" "$d" &
  cpid=$!
  cleanup_fn kill_quiet $cpid

  wait_marker "$d/answered"
  # What the server has synced: the client's FLUSH (flushed) or FUA
  # (fua) made the write durable; otherwise the file as it was.
  case $case in
    flushed|fua) cp "$d/disk.img" "$d/synced.img" ;;
    *) /usr/bin/python3 -c 'import sys
open(sys.argv[1], "wb").write(b"A" * (1 << 20))' "$d/synced.img" ;;
  esac
  if [ "$case" = inflight ]; then
    wait_marker "$d/flush-arrived"
  fi
  srv_kill "$srv"
  touch "$d/killed"
  wait_file "$tmp/$plug.log" "connection lost"
  if [ "$case" = widened ]; then
    # The hull of the 100 ranges: [0, 99 * 8 KiB + 4 KiB).
    grep "1 range in \[0, 815104) (more than 64 ranges: widened" \
         "$tmp/$plug.log"
  fi
  cp "$d/synced.img" "$d/disk.img"
  # The same server (a FLUSH no longer waits: "killed" is there).
  srv_start_plain "$srv" "${server[@]}"
  touch "$d/back"
  wait $cpid
  srv_stop "$plug"
  srv_stop "$srv"

  # What the client read is what the server has now.
  /usr/bin/python3 - "$case" "$d/disk.img" <<'EOF2'
import sys
case, path = sys.argv[1:3]
K = 1024
d = open(path, "rb").read()
if case in ("lost", "inflight"):
    want = b"C" * (64 * K) + b"A" * (1024 * K - 64 * K)
elif case == "widened":
    want = b"C" * (800 * K) + b"A" * (1024 * K - 800 * K)
else:
    want = (b"B" * (64 * K) + b"A" * (64 * K) + b"C" * (64 * K) +
            b"A" * (1024 * K - 192 * K))
assert d == want, "%s: disk.img differs at %d" % (case, next(
    i for i in range(len(d)) if d[i] != want[i]))
print("%s: disk.img: ok" % case)
EOF2
}

run lost
run widened
run flushed
run fua
run inflight
