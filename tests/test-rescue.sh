#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# The rescue (plugin/rescue.h): whatever way SIGABRT comes, nbdkit dies
# of it (status 134) and every write it acknowledged is in the file.
# The client writes 20 blocks of 64 KiB, 1 MiB apart (no merging), in
# writeback mode with idle= and max-delay= long and direct=never: all
# 20 are acknowledged and held by the plug when SIGABRT comes.
#  1. kill: SIGABRT sent to nbdkit (kill -ABRT), not abort(3): nothing
#     raises it again after the handler, and nbdkit must not go on
#     serving with its engine shut down.
#  2. exit: abort(3) (tests/shim-abort.so, from a thread that is not
#     the plugin's, as nbdkit's own assertion) during .cleanup's
#     write-out, which the rescue must wait for.  Every backend write
#     takes 200 ms (-D plug.backend_delay_us, io-threads=1): the
#     write-out takes 4 s, inside the handler's 10 s.  The abort comes
#     once the log shows .cleanup and the file holds some but not all
#     of the writes (counted).
#  3. twice: abort(3) from two threads at once, the client connected:
#     the second abort must not cut the rescue short.
source ./functions.sh
set -e
set -x

requires_python_nbd
[ -f "$SHIM_ABORT" ] || fail "$SHIM_ABORT: not built"
ulimit -c 0                     # The aborts' cores are of no use here.

plug_tmpdir
N=20

# The client: write the N blocks, say so (ACKED), then read elsewhere
# every 10 ms until the server fails a request or goes away.  nbdkit
# 1.32 fails requests with ESHUTDOWN once it got SIGTERM, so the client
# leaves after the SIGTERM, and nbdkit then reaches .cleanup (with no
# .close for this connection) for the write-out.
cat > "$tmp/client.py" <<'PYEOF'
import nbd, sys, time
sock, n, acked = sys.argv[1], int(sys.argv[2]), sys.argv[3]
h = nbd.NBD()
h.connect_unix(sock)
for i in range(n):
    h.pwrite(bytes([65 + i]) * 65536, i << 20)
open(acked, "w").close()
try:
    while True:
        h.pread(4096, 63 << 20)
        time.sleep(0.01)
except nbd.Error as e:
    print("client: the server stopped answering:", e)
PYEOF

# present IMG N: how many of the N blocks are in the file.
cat > "$tmp/present.py" <<'PYEOF'
import sys
img, n = sys.argv[1], int(sys.argv[2])
with open(img, "rb") as f:
    d = f.read()
print(sum(d[i << 20:(i << 20) + 65536] == bytes([65 + i]) * 65536
          for i in range(n)))
PYEOF
present () { /usr/bin/python3 "$tmp/present.py" "$1" $N; }

kill_quietly () { kill -KILL "$@" 2>/dev/null || :; }

# serve NAME [ENV...]: nbdkit with the plug on $tmp/NAME.img, the
# client connected and its N writes acknowledged (client pid: $cpid).
serve ()
{
  local name=$1
  shift
  truncate -s 64M "$tmp/$name.img"
  SERVER_WRAP="env LD_PRELOAD=$SHIM_ABORT ABORT_TRIGGER=$tmp/$name.trigger $*" \
    start_plug $name -v -D plug.backend_delay_us=200000 -- \
               file="$tmp/$name.img" mode=writeback direct=never \
               idle=60s max-delay=60s io-threads=1
  timeout 120 /usr/bin/python3 "$tmp/client.py" "$(server_sock $name)" $N \
          "$tmp/$name.acked" &
  cpid=$!
  cleanup_fn kill_quietly $cpid
  wait_for_file "$tmp/$name.acked" 60 || {
    server_running $name
    fail "$name: the client's $N writes were not acknowledged within 60 s"
  }
}

# died_of_abort NAME: nbdkit NAME exits by itself (60 s at most, else
# it survived SIGABRT), of SIGABRT, with every acknowledged write in
# the file, written out by the rescue.
died_of_abort ()
{
  local name=$1 i n
  for ((i = 0; i < 600; ++i)); do
    server_alive $name || break
    sleep 0.1
  done
  if server_alive $name; then
    kill_server $name KILL
    _show_server_log $name
    fail "$name: nbdkit still running 60 s after SIGABRT"
  fi
  reap_exited $name
  wait $cpid || :
  [ "$SERVER_RC" -eq 134 ] || {
    _show_server_log $name
    fail "$name: nbdkit exited with status $SERVER_RC, expected 134 (SIGABRT)"
  }
  grep -q "the server is aborting" "$(server_log $name)" || {
    _show_server_log $name
    fail "$name: no rescue in the log"
  }
  n=$(present "$tmp/$name.img")
  echo "$name: $n of $N acknowledged writes in the file"
  [ "$n" -eq $N ] || {
    _show_server_log $name
    fail "$name: $((N - n)) of $N acknowledged writes lost in the abort"
  }
}

# 1. kill -ABRT.
serve kill
kill -ABRT "$(server_pid kill)"
died_of_abort kill

# 2. abort(3) during .cleanup's write-out.
serve exit
kill -TERM "$(server_pid exit)"
for ((i = 0; i < 600; ++i)); do
  grep -q "debug: plug: cleanup" "$(server_log exit)" &&
    [ "$(present "$tmp/exit.img")" -gt 0 ] && break
  server_running exit
  sleep 0.01
done
n=$(present "$tmp/exit.img")
touch "$tmp/exit.trigger"
echo "exit: abort with $n of $N writes written out by .cleanup"
[ "$n" -gt 0 ] && [ "$n" -lt $N ] ||
  fail "exit: the abort did not come during .cleanup's write-out ($n of $N written)"
died_of_abort exit
# The abort came after .cleanup began, so the rescue found the exit's
# write-out under way.
grep -n "debug: plug: cleanup\|the server is aborting" "$(server_log exit)"
[ "$(grep -o "debug: plug: cleanup\|the server is aborting" "$(server_log exit)" |
     head -1)" = "debug: plug: cleanup" ] ||
  fail "exit: the rescue began before .cleanup"

# 3. Two threads abort at once, the client connected.
serve twice ABORT_TWICE=1
touch "$tmp/twice.trigger"
died_of_abort twice
