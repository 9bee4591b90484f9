#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# An NBD server that starts after the plug (connect-retry=): the plug is
# started first and keeps trying; until the server is up it does not
# listen (nbdkit binds its socket after .get_ready).  Once the server
# (nbdkit memory, multi-conn) is up, the plug serves: data written
# through it round-trips and is on the server.
#  - The server's handshakes are slow (the delay filter's delay-open=1):
#    the plug's other three connections to it are opened together, so
#    the server sees all three opens begin before any of them ends.
#    Opened one after another: "FAIL: 1 of 3 connections opened
#    together".
#  - Without connect-retry= (one attempt), the same late server stops
#    the plug with the error of test-remote-unreachable.sh.
source ./functions.sh
set -e

requires /usr/bin/python3 -c 'import nbd'
requires nbdkit memory --version
requires nbdkit --filter=delay null --version
test -f "$PLUGIN"

plug_tmpdir
source "$srcdir/remote-lib.sh"

mem_uri="nbd+unix:///?socket=$tmp/mem.sock"

# ---- the plug first, keeping on trying ----
launch_server plug -v "$PLUGIN" "file=$mem_uri" connect-retry=60s \
              connect-timeout=5s
# Order, not time: it has tried and failed twice before the server runs.
for ((i = 0; i < 600; ++i)); do
  grep -q "connection attempt 2 failed" "$(server_log plug)" && break
  server_running plug
  sleep 0.1
done
grep "connection attempt 2 failed" "$(server_log plug)" ||
  fail "the plug did not retry within 60 s"
# Meanwhile nbdkit does not listen: a client finds no socket.
[ ! -S "$tmp/plug.sock" ] || fail "the plug listens before its server is up"

srv_start mem unix -v --filter=delay memory 1M delay-open=1
wait_listening plug
grep "file=$mem_uri: connected at attempt [0-9]*" "$(server_log plug)"
grep "file=$mem_uri: size 1048576, 4 connections" "$(server_log plug)"

# Connections 2 to 4 of the plug (the server's [2] to [4]): how many
# opens began before the first of them returned.
together=$(awk '
  /memory\[[2-9]\]: debug: delay: open returned/ { exit }
  /memory\[[2-9]\]: debug: delay: open readonly/ { n++ }
  END { print n + 0 }' "$(server_log mem)")
[ "$together" -eq 3 ] ||
  fail "$together of 3 connections opened together (see $(server_log mem))"
echo "3 of 3 connections opened together"

# ---- data round-trips, and is on the server ----
nbdsh_sys -u "$(server_uri plug)" -c '
h.pwrite(b"late" * 1024, 4096)
h.flush()
assert h.pread(4096, 4096) == b"late" * 1024
'
nbdsh_sys -u "$mem_uri" -c '
assert h.pread(4096, 4096) == b"late" * 1024
assert h.pread(4096, 0) == bytes(4096)
'
echo "data round-trips through the plug to a server that started later"
stop_server plug
srv_stop mem

# ---- one attempt (the default): the same start order fails ----
rc=0
nbdkit -U "$tmp/once.sock" "$PLUGIN" "file=$mem_uri" --run true \
       2> "$tmp/once.err" || rc=$?
cat "$tmp/once.err"
[ $rc -eq 1 ] || fail "without connect-retry=: status $rc, not 1"
grep -q "file=$mem_uri: cannot connect to the NBD server: .*connect" \
     "$tmp/once.err"
if grep -q "attempt" "$tmp/once.err"; then
  fail "one attempt reported as retried"
fi
echo "without connect-retry= a late server stops the plug at once"
