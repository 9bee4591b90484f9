#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# NBD servers that never answer: the plug gives up on each attempt after
# connect-timeout= and stops with status 1 and an error that says so,
# instead of hanging in nbd_connect_uri.  No network needed:
#  - TCP: a socket on 127.0.0.1 listening with a backlog of 0 whose
#    accept queue is full (the helper fills it), so the kernel drops the
#    plug's SYN, as a black-holed address does; without a bound the
#    connect waits for the kernel's SYN retries (about two minutes).
#  - unix: a socket that is listened on and never accepted: the connect
#    succeeds and the NBD handshake never starts.  With connect-retry=
#    longer than connect-timeout=, the plug tries again, and its message
#    counts the attempts (as many as -v logged).
# nbdkit runs under timeout 60: a hang is status 124, not a pass.
source ./functions.sh
set -e

requires test -x /usr/bin/python3
test -f "$PLUGIN"
plug_tmpdir

# The helper prints "ready tcp PORT dropped|accepted" or "ready unix"
# once it listens, then sleeps until killed.
cat > "$tmp/blackhole.py" <<'EOF'
import socket, sys, time
kind = sys.argv[1]
if kind == "tcp":
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen(0)
    port = l.getsockname()[1]
    fill = socket.create_connection(("127.0.0.1", port))
    # Does the kernel now drop a SYN?  A probe that stays unconnected.
    probe = socket.socket()
    probe.setblocking(False)
    probe.connect_ex(("127.0.0.1", port))
    time.sleep(0.3)
    try:
        probe.getpeername()
        how = "accepted"
    except OSError:
        how = "dropped"
    print("ready tcp %d %s" % (port, how), flush=True)
else:
    l = socket.socket(socket.AF_UNIX)
    l.bind(sys.argv[2])
    l.listen(16)
    print("ready unix", flush=True)
time.sleep(3600)
EOF

# start_blackhole KIND [SOCKET]: the helper's line goes to $tmp/bh-KIND.out
# (one file per helper: the shell truncates it in the child, so a shared
# one could still show the previous helper's line to the wait below).
start_blackhole ()
{
  bh_out=$tmp/bh-$1.out
  rm -f "$bh_out"
  /usr/bin/python3 "$tmp/blackhole.py" "$@" > "$bh_out" &
  bh_pid=$!
  cleanup_fn kill "$bh_pid"
  for ((i = 0; i < 100; ++i)); do
    grep -qs '^ready' "$bh_out" && return 0
    sleep 0.1
  done
  fail "the black hole helper did not start"
}

# ---- TCP: the SYN is dropped; one attempt ----
start_blackhole tcp
read -r _ _ port how < "$bh_out"
echo "black hole on 127.0.0.1:$port: a further SYN is $how"
uri="nbd://127.0.0.1:$port/"
rc=0
timeout 60 nbdkit -U "$tmp/plug.sock" "$PLUGIN" "file=$uri" \
        connect-timeout=1s --run true 2> "$tmp/tcp.err" || rc=$?
cat "$tmp/tcp.err"
[ $rc -eq 1 ] || fail "TCP black hole: status $rc, not 1"
grep -q "file=$uri: cannot connect to the NBD server: timed out after connect-timeout=1s$" \
     "$tmp/tcp.err" || fail "TCP black hole: not the timeout message"
kill "$bh_pid"
wait "$bh_pid" || :

# ---- unix: never accepted; retried for connect-retry= ----
start_blackhole unix "$tmp/never.sock"
uri="nbd+unix:///?socket=$tmp/never.sock"
rc=0
timeout 60 nbdkit -v -U "$tmp/plug.sock" "$PLUGIN" "file=$uri" \
        connect-timeout=1s connect-retry=2500ms --run true \
        2> "$tmp/unix.err" || rc=$?
grep -v 'debug: .*config key' "$tmp/unix.err" | grep "file=$uri" || :
[ $rc -eq 1 ] || fail "unix black hole: status $rc, not 1"
msg=$(grep "error: file=$uri: cannot connect" "$tmp/unix.err") ||
  fail "unix black hole: no error"
[[ $msg =~ timed\ out\ after\ connect-timeout=1s\ \(gave\ up\ after\ ([0-9]+)\ attempts\ in\ [0-9.]+\ s,\ connect-retry=2500ms\)$ ]] ||
  fail "unix black hole: not the message expected: $msg"
attempts=${BASH_REMATCH[1]}
logged=$(grep -c "file=$uri: connection attempt [0-9]* failed: timed out after connect-timeout=1s; trying again" "$tmp/unix.err" || :)
[ "$attempts" -ge 2 ] || fail "unix black hole: $attempts attempts, not retried"
[ "$attempts" -eq $((logged + 1)) ] ||
  fail "unix black hole: $attempts attempts reported, $logged retries logged"
echo "unix black hole: gave up after $attempts attempts, each timed out"
