#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Out of memory while a connection closes, or while the server exits,
# loses nothing and stops nothing: close and exit allocate no memory
# (their requests were allocated when the connection opened and when
# the plugin started).  tests/shim-malloc.so (LD_PRELOAD into nbdkit
# only) fails malloc of one size, that of a request without pieces
# (192 bytes: header_size (0) in plugin/request.c, which a FLUSH, a
# close and an exit take), once the test has created the file `armed`.
# idle=10s max-delay=60s direct=never: the writes stay held.
#  1. close: connections A and C open; A writes 4 blocks of 4 KiB
#     (acknowledged, held); the test arms two failures; A disconnects
#     without FLUSH.  The 4 blocks must reach the file (the close
#     writes them out) with the server alive; then C's FLUSH is the one
#     refused (ENOMEM), which shows the close took no allocation of
#     that size and the shim was armed; a new connection is refused
#     (the second failure: no memory for its close request, which the
#     log says); C's second FLUSH works.  After SIGTERM nbdkit exits
#     with status 0 and the file holds the 4 blocks.
#  2. exit: connection A writes 4 blocks (held) and stays connected,
#     reading every 10 ms (nbdkit 1.32 does not exit on SIGTERM while a
#     client is idle); the test arms one failure and sends SIGTERM.
#     nbdkit exits with status 0, the file holds the 4 blocks, and the
#     failure is still unused (the exit allocated nothing of that
#     size: the shim counts no failure).
# Shown able to fail: with the close request allocated in conn_close
# (plugin/conn.c), as it was, case 1 fails (nbdkit aborts in
# engine_conn_free, 0 of 4 blocks in the file); with the exit's
# allocated in conns_shutdown, case 2 fails (the shim counts the
# failure, the log says the exit could not write out held data;
# when nbdkit's .cleanup overtakes the connection's .close, 0 of 4
# blocks are in the file too, and nbdkit still exits with status 0).
source ./functions.sh
set -e
set -x

requires_python_nbd
# Under a sanitizer its runtime serves malloc, not the shim.
if [ -n "${PLUG_SANITIZER:-}" ] && [ "$PLUG_SANITIZER" != no ]; then
  echo "$0: the $PLUG_SANITIZER sanitizer's malloc hides the shim's: test skipped"
  exit 77
fi
# SHIM_MALLOC: see functions.sh
test -f "$SHIM_MALLOC" || fail "$SHIM_MALLOC not built"

plug_tmpdir

# The size of a request without pieces (plugin/request.c), printed by
# tests/request-size.
request_size=$("$abs_top_builddir/tests/request-size")
[ "$request_size" -gt 0 ] || fail "request-size printed '$request_size'"

# client.py CASE URI IMG ARMED READY
cat > "$tmp/client.py" <<'EOF'
import nbd, os, sys, time
case, uri, img, armed, ready = sys.argv[1:6]
K = 4096
BLOCKS = [bytes([0x61 + i]) * K for i in range(4)]


def conn():
    h = nbd.NBD()
    h.connect_uri(uri)
    return h


def in_file():
    with open(img, "rb") as f:
        d = f.read(8 * 64 * K)
    return sum(1 for i, b in enumerate(BLOCKS)
               if d[i * 64 * K:i * 64 * K + K] == b)


a = conn()
c = conn() if case == "close" else None
for i, b in enumerate(BLOCKS):
    a.pwrite(b, i * 64 * K)     # Acknowledged and held (idle=10s).

if case == "close":
    open(armed, "w").close()
    a.shutdown()                # Disconnect, no FLUSH: the close writes.
    # Wait for the close to have written them (or the test's timeout,
    # which fails; the test then shows whether the server is alive).
    while in_file() < 4:
        time.sleep(0.05)
    print("the close wrote the 4 held blocks")
    try:
        c.flush()
        sys.exit("C's FLUSH worked: the shim's first failure was taken "
                 "before it (by the close?), or the size of a request "
                 "without pieces is not %s" % sys.argv[6])
    except nbd.Error as ex:
        print("C's FLUSH refused:", ex)
        if ex.errno != "ENOMEM":
            sys.exit("refused with %s, expected ENOMEM" % ex.errno)
    try:
        conn()
        sys.exit("a connection opened without memory for its close")
    except nbd.Error as ex:
        print("a new connection refused:", ex)
    c.flush()
    c.shutdown()
else:
    open(armed, "w").close()
    open(ready, "w").close()
    try:
        while True:
            a.pread(K, 64 * 64 * K)
            time.sleep(0.01)
    except nbd.Error:
        print("the server went away")
EOF

check_file ()
{
  /usr/bin/python3 - "$1" <<'EOF'
import sys
K = 4096
d = open(sys.argv[1], "rb").read()
lost = [i for i in range(4)
        if d[i * 64 * K:i * 64 * K + K] != bytes([0x61 + i]) * K]
if lost:
    sys.exit("%d of 4 acknowledged blocks are not in the file (%r)"
             % (len(lost), lost))
print("the file holds the 4 acknowledged blocks")
EOF
}

shim_count () { cat "$tmp/$1.count" 2>/dev/null || echo 0; }

# serve NAME TIMES
serve ()
{
  local name=$1
  truncate -s 1M "$tmp/$name.img"
  rm -f "$tmp/$name.armed" "$tmp/$name.count"
  SERVER_WRAP="env LD_PRELOAD=$SHIM_MALLOC SHIM_MALLOC_SIZE=$request_size SHIM_MALLOC_TIMES=$2 SHIM_MALLOC_TRIGGER=$tmp/$name.armed SHIM_COUNT=$tmp/$name.count" \
    start_plug $name -v -- file="$tmp/$name.img" idle=10s max-delay=60s \
               direct=never
}

# 1. Out of memory at close.
serve close 2
timeout 60 /usr/bin/python3 "$tmp/client.py" close "$(server_uri close)" \
        "$tmp/close.img" "$tmp/close.armed" "$tmp/close.ready" \
        $request_size || {
  server_running close
  fail "close: the client failed"
}
stop_server close
check_file "$tmp/close.img" || fail "close: the file"
test "$(shim_count close)" = 2 ||
  fail "close: the shim failed $(shim_count close) allocations, expected 2"
grep -q 'no memory for its close request' "$(server_log close)" ||
  fail "close: the refused connection's error is not in the log"

# 2. Out of memory at exit.
serve exit 1
timeout 60 /usr/bin/python3 "$tmp/client.py" exit "$(server_uri exit)" \
        "$tmp/exit.img" "$tmp/exit.armed" "$tmp/exit.ready" > "$tmp/exit.out" 2>&1 &
cpid=$!
cleanup_fn kill -KILL $cpid
wait_for_file "$tmp/exit.ready" 60 || {
  cat "$tmp/exit.out"
  server_running exit
  fail "exit: the client did not get going"
}
stop_server exit
wait $cpid || { cat "$tmp/exit.out"; fail "exit: the client failed"; }
cat "$tmp/exit.out"
check_file "$tmp/exit.img" || fail "exit: the file"
if [ "$(shim_count exit)" != 0 ]; then
  grep 'error:' "$(server_log exit)" || :
  fail "exit: the shim failed $(shim_count exit) allocations of a" \
       "request's size at exit, expected none"
fi
