#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Multi-conn coherence without FLUSH, two connections at a time:
# connection A's write is acknowledged, and connection B's
# read of the same range, sent at once, sees A's data.  And a client
# that writes and disconnects without FLUSH: a new connection that reads
# the range at once sees the data.
#
# Each loop iteration: the writer writes a random 4 KiB pattern at a
# random offset (4K-, 512- or unaligned; some across the boundary of the
# two backing files) and waits for the acknowledgement; the other
# connection then reads exactly that range, and a wider range around it
# (checked against a reference of the whole export: the file's random
# initial contents plus every write).  Every fourth iteration the writer
# first writes a second pattern that half overlaps the first, so the
# read must see the newer bytes where they overlap.  A and B swap roles
# every iteration.  In the disconnect loop the new connection is made
# after the disconnect, or (every other time) just before it, so that
# its read follows the disconnect at once.
#
# Variants (both modes):
#   wb-held    writeback, direct=never idle=10s max-delay=10s: A's write
#              is acknowledged while it waits in A's plug; B's read must
#              find it there (the statistics show reads unplugging).
#   wb-default writeback with the default parameters.
#   hold-default, hold-held (--threads=1, so that the one worker waiting
#              for its answer unplugs at once: "parked").
# The server's exit status after SIGTERM, its log, and the connection
# count of its statsfile are checked.
source ./functions.sh
set -e

requires_python_nbd

plug_tmpdir

# Iterations of the A/B loop and of the disconnect loop.
: "${RAW_LOOPS:=300}"
: "${RAW_DISC_LOOPS:=60}"
SIZE_A=$((1024 * 1024))
SIZE_B=$((3 * 1024 * 1024))

cat > "$tmp/client.py" <<'EOF'
import nbd, random, sys

sock, init, loops, disc_loops, seed, bound = sys.argv[1:7]
loops, disc_loops, seed, bound = int(loops), int(disc_loops), int(seed), int(bound)
rng = random.Random(seed)
ref = bytearray(open(init, "rb").read())
size = len(ref)
N = 4096

def connect():
    h = nbd.NBD()
    h.connect_unix(sock)
    return h

def pick_offset(n):
    r = rng.randrange(100)
    if r < 10:
        # Across the file boundary.
        return bound - rng.randrange(1, n)
    if r < 55:
        return rng.randrange(0, (size - n) // 4096 + 1) * 4096
    if r < 80:
        return rng.randrange(0, (size - n) // 512 + 1) * 512
    return rng.randrange(0, size - n + 1)

failures = 0
def check(what, i, off, got):
    """got is what was read at off; compare with the reference."""
    global failures
    want = ref[off:off + len(got)]
    if got == want:
        return True
    j = next(k for k in range(len(got)) if got[k] != want[k])
    failures += 1
    if failures <= 10:
        print("MISMATCH: iteration %d: %s %d+%d: first difference at "
              "offset %d: expected 0x%02x got 0x%02x" %
              (i, what, off, len(got), off + j, want[j], got[j]))
    return False

def write(h, off, data):
    h.pwrite(data, off)             # Returns once acknowledged.
    ref[off:off + len(data)] = data

# A and B: acknowledged on one, read on the other at once.
A, B = connect(), connect()
assert A.can_multi_conn() and B.can_multi_conn(), "no multi-conn"
ok = 0
for i in range(loops):
    w, r = (A, B) if i % 2 == 0 else (B, A)
    off = pick_offset(N)
    good = True
    if i % 4 == 3:
        # An older pattern half under the new one.
        off0 = min(max(off - N // 2, 0), size - N)
        write(w, off0, rng.randbytes(N))
    write(w, off, rng.randbytes(N))
    good &= check("read of the range just written", i, off, r.pread(N, off))
    lo, hi = max(off - 4096, 0), min(off + N + 8192, size)
    good &= check("read around it", i, lo, r.pread(hi - lo, lo))
    ok += good
print("A/B iterations ok: %d/%d" % (ok, loops))

# Write, disconnect without FLUSH, read at once on a new connection:
# made after the disconnect (even iterations), or made just before it
# and used for nothing else, so that its read follows the disconnect as
# closely as can be (odd ones).
disc_ok = 0
for i in range(disc_loops):
    off = pick_offset(N)
    h = connect()
    write(h, off, rng.randbytes(N))
    if i % 2:
        n = connect()
    h.shutdown()                    # NBD_CMD_DISC: no FLUSH before it.
    del h
    if i % 2 == 0:
        n = connect()
    disc_ok += check("new connection's read after a disconnect", i, off,
                     n.pread(N, off))
    n.shutdown()
    del n
print("disconnect iterations ok: %d/%d" % (disc_ok, disc_loops))

# Both stay open until now; a final full read on A sees everything.
ok_all = check("final full read", -1, 0, A.pread(size, 0))
A.shutdown()
B.shutdown()
open(sys.argv[7], "wb").write(ref)
sys.exit(0 if ok == loops and disc_ok == disc_loops and ok_all else 1)
EOF

cat > "$tmp/stats.py" <<'EOF'
import json, sys
st = json.load(open(sys.argv[1]))
conns, held = int(sys.argv[2]), sys.argv[3] == "held-wb"
c, b, u = st["client"], st["backend"], st["unplugs"]
print("stats: connections %d; client write %d read %d flush %d; backend "
      "write %d; direct %d; unplugs %s" %
      (st["connections"], c["write"]["ops"], c["read"]["ops"],
       c["flush"]["ops"], b["write"]["ops"], st["direct"],
       {k: v for k, v in u.items() if v}))
errors = []
if st["connections"] != conns:
    errors.append("connections %d, expected %d" % (st["connections"], conns))
if c["flush"]["ops"] != 0:
    errors.append("%d flushes: the client sent none" % c["flush"]["ops"])
if held:
    # The writes waited in the plug and the other connection's read
    # got them out: "read" unplugs, nothing written directly.
    if u["read"] == 0:
        errors.append("no read unplugged another connection's plug")
    if st["direct"] != 0:
        errors.append("direct=never, but %d direct writes" % st["direct"])
if errors:
    sys.exit("statsfile: " + "; ".join(errors))
EOF

quiet_kill ()
{
  kill -KILL "$@" 2>/dev/null || :
}

# stop_server PID: SIGTERM; fail unless it exits with status 0 within
# 60 s (a hung server fails the test instead of hanging it).
stop_server ()
{
  local pid=$1 i rc=0
  kill -TERM "$pid"
  for ((i = 0; i < 600; ++i)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid"
    echo "$0: nbdkit (pid $pid) still running 60 s after SIGTERM"
    return 1
  fi
  wait "$pid" || rc=$?
  echo "nbdkit exited with status $rc"
  return $rc
}

# run NAME KIND NBDKIT-OPTION PARAMS...: one variant on two backing files
# (1 MiB + 3 MiB of random data).  KIND is held-wb or other.
run ()
{
  local name=$1 kind=$2 opt=$3 d=$tmp/$1 pid rc=0
  shift 3
  mkdir "$d"
  /usr/bin/python3 -c 'import random, sys
r = random.Random(sys.argv[1])
for f, n in zip(sys.argv[2::2], sys.argv[3::2]):
    open(f, "wb").write(r.randbytes(int(n)))' "$name" \
    "$d/a" $SIZE_A "$d/b" $SIZE_B
  cat "$d/a" "$d/b" > "$d/init"

  echo "== $name: nbdkit $opt plug $* (loops $RAW_LOOPS + $RAW_DISC_LOOPS)"
  # shellcheck disable=SC2086
  nbdkit -f $opt -U "$d/sock" -P "$d/pid" "$PLUGIN" \
         file="$d/a" file="$d/b" stats-file="$d/stats.json" "$@" \
         2> "$d/server.log" &
  pid=$!
  cleanup_fn quiet_kill $pid
  wait_for_file "$d/pid" || { cat "$d/server.log"; exit 1; }
  wait_for_file "$d/sock" || { cat "$d/server.log"; exit 1; }

  timeout 120 /usr/bin/python3 "$tmp/client.py" "$d/sock" "$d/init" \
          $RAW_LOOPS $RAW_DISC_LOOPS "$(cksum <<< "$name" | cut -d' ' -f1)" \
          $SIZE_A "$d/expected" > "$d/out" 2>&1 || rc=$?
  cat "$d/out"

  local src=0
  stop_server $pid || src=$?
  if grep -E 'Sanitizer|runtime error:|error:' "$d/server.log"; then
    echo "$0: $name: errors in the server's log"
    exit 1
  fi
  if [ $src -ne 0 ]; then
    cat "$d/server.log"
    echo "$0: $name: nbdkit failed (status $src)"
    exit 1
  fi
  if [ $rc -ne 0 ]; then
    echo "$0: $name: client failed (status $rc)"
    exit 1
  fi
  grep -qx "A/B iterations ok: $RAW_LOOPS/$RAW_LOOPS" "$d/out" &&
    grep -qx "disconnect iterations ok: $RAW_DISC_LOOPS/$RAW_DISC_LOOPS" \
         "$d/out" || {
      echo "$0: $name: not every iteration succeeded"
      exit 1
    }
  # Every acknowledged write is in the files once the server is gone.
  cat "$d/a" "$d/b" | cmp - "$d/expected" || {
    echo "$0: $name: backing files differ from the client's reference"
    exit 1
  }
  # A, B, and two per disconnect iteration.
  /usr/bin/python3 "$tmp/stats.py" "$d/stats.json" \
                   $((2 + 2 * RAW_DISC_LOOPS)) $kind
  echo "== $name: ok"
}

held="direct=never idle=10s max-delay=10s"
# shellcheck disable=SC2086
run wb-held held-wb "" mode=writeback $held
run wb-default other "" mode=writeback
run hold-default other "" mode=hold
# shellcheck disable=SC2086
run hold-held other --threads=1 mode=hold $held
