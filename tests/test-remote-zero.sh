#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# A zero reaches an NBD server with the client's NO_HOLE flag: a zero
# with NBD_CMD_FLAG_NO_HOLE arrives as a Zero with trim=0 in the
# server's log (--filter=log), one without it as a Zero with trim=1 (may
# punch a hole).  In writeback and in hold mode, each both as a merged
# run (direct=never: four adjacent 4K zeros reach the server as one 16K
# Zero) and on the direct path (a lone 64K zero, with direct=always in
# writeback mode, where direct=auto plugs what goes to an NBD server;
# the statistics count it as direct).
# The server is nbdkit eval over a file: it holds its reads and writes
# while a marker file exists.  In hold mode four concurrent zeros are
# held until max-requests=4 only if the connection's worker threads
# outnumber them (else the parked trigger sends each alone): before
# them eight reads wait at the server on eight of its threads (a read
# notes its thread while another connection's write is unfinished:
# that write is held at the server meanwhile).
# With the NO_HOLE condition in remote.c inverted, every Zero arrives
# with the other flag: "FAIL: the server got these zeros ..." listing
# trim=1 for the NO_HOLE zeros and trim=0 for the others.
source ./functions.sh
set -e

requires test -x /usr/bin/python3
requires /usr/bin/python3 -c 'import nbd'
requires nbdkit eval --version
requires jq --version
test -f "$PLUGIN"

plug_tmpdir
source "$srcdir/remote-lib.sh"

truncate -s 16M "$tmp/R.img"
# A read (write) waits while R.hold-r (R.hold-w) exists, 30 s at most;
# its zero is native (without one, nbdkit would log zeros as writes).
srv_start R unix --filter=log eval logfile="$tmp/R.txt" \
  thread_model='echo parallel' get_size='echo 16777216' \
  pread="for i in \$(seq 600); do [ -e $tmp/R.hold-r ] || break; sleep 0.05; done
dd if=$tmp/R.img skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none" \
  pwrite="for i in \$(seq 600); do [ -e $tmp/R.hold-w ] || break; sleep 0.05; done
dd of=$tmp/R.img seek=\$4 conv=notrunc oflag=seek_bytes status=none" \
  zero="dd if=/dev/zero of=$tmp/R.img seek=\$4 count=\$3 iflag=count_bytes oflag=seek_bytes conv=notrunc status=none"

cat > "$tmp/client.py" <<'EOF2'
import os, re, sys, time
import nbd

uri, what, log, tmp = sys.argv[1:5]
K = 1024
NO_HOLE = nbd.CMD_FLAG_NO_HOLE

def logged(pattern):
    return sum(1 for line in open(log) if re.search(pattern, line))

def wait_logged(pattern, n, handles):
    for _ in range(600):
        if logged(pattern) >= n:
            return
        for h in handles:
            h.poll(0)
        time.sleep(0.05)
    sys.exit("FAIL: %s: %d of %r in the server's log after 30 s"
             % (what, logged(pattern), pattern))

def wait_all(h, cookies):
    for c in cookies:
        while not h.aio_command_completed(c):
            h.poll(-1)

h = nbd.NBD()
h.connect_uri(uri)
if what == "writeback-merged":
    for flags, base in ((NO_HOLE, 0x100000), (0, 0x200000)):
        for i in range(4):
            h.zero(4 * K, base + i * 4 * K, flags)
    h.flush()
elif what == "hold-merged":
    # Eight of this connection's worker threads noted: eight reads wait
    # at the server while another connection's write is held there.
    hold_r = os.path.join(tmp, "R.hold-r")
    hold_w = os.path.join(tmp, "R.hold-w")
    open(hold_r, "w").close()
    open(hold_w, "w").close()
    other = nbd.NBD()
    other.connect_uri(uri)
    w = other.aio_pwrite(b"o" * (4 * K), 0xF00000)
    wait_logged(r" Write id=\d+ offset=0xf00000 ", 1, [other])
    bufs = [nbd.Buffer(4 * K) for i in range(8)]
    reads = [h.aio_pread(b, 0xE00000 + i * 64 * K)
             for i, b in enumerate(bufs)]
    wait_logged(r" Read id=\d+ offset=0xe", 8, [h, other])
    os.unlink(hold_r)
    wait_all(h, reads)
    os.unlink(hold_w)
    wait_all(other, [w])
    other.shutdown()
    for flags, base in ((NO_HOLE, 0x600000), (0, 0x700000)):
        wait_all(h, [h.aio_zero(4 * K, base + i * 4 * K, flags=flags)
                     for i in range(4)])
else:
    # A lone 64K zero near nothing the connection did: the direct path.
    base = 0x300000 if what == "writeback-direct" else 0x800000
    h.zero(64 * K, base, NO_HOLE)
    h.zero(64 * K, base + 0x200000)
    h.flush()
h.shutdown()
EOF2

# run NAME DIRECT PLUG-PARAMS...: start a plug, run the client's case
# NAME, stop it; the statistics must count DIRECT direct requests.
run ()
{
  local name=$1 direct=$2
  shift 2
  srv_start "$name" unix "$PLUGIN" "file=${srv_uri[R]}" \
            stats-file="$tmp/$name.json" "$@"
  /usr/bin/python3 "$tmp/client.py" "${srv_uri[$name]}" "$name" \
                   "$tmp/R.txt" "$tmp"
  srv_stop "$name"
  jq -c '{direct, unplugs}' "$tmp/$name.json"
  [ "$(jq .direct "$tmp/$name.json")" -eq "$direct" ] ||
    fail "$name: $(jq .direct "$tmp/$name.json") direct requests, expected $direct"
}

held="direct=never idle=10s max-delay=60s"
# shellcheck disable=SC2086
run writeback-merged 0 mode=writeback $held
run writeback-direct 2 mode=writeback direct=always
# shellcheck disable=SC2086
run hold-merged 0 mode=hold $held max-requests=4
[ "$(jq '.unplugs["max-requests"]' "$tmp/hold-merged.json")" -eq 2 ] ||
  fail "hold-merged: the zeros were not held until max-requests"
run hold-direct 2 mode=hold
srv_stop R

/usr/bin/python3 - "$tmp/R.txt" <<'EOF2'
import re, sys
got = []
for line in open(sys.argv[1]):
    m = re.search(r" Zero id=\d+ offset=(0x[0-9a-f]+) count=(0x[0-9a-f]+) "
                  r"trim=(\d) ", line)
    if m:
        got.append((int(m.group(1), 16), int(m.group(2), 16),
                    int(m.group(3))))
got.sort()
K = 1024
# (offset, count, trim): NO_HOLE first, then the may-trim zero.
want = [(0x100000, 16 * K, 0), (0x200000, 16 * K, 1),   # writeback, merged
        (0x300000, 64 * K, 0), (0x500000, 64 * K, 1),   # writeback, direct
        (0x600000, 16 * K, 0), (0x700000, 16 * K, 1),   # hold, merged
        (0x800000, 64 * K, 0), (0xa00000, 64 * K, 1)]   # hold, direct
for g in got:
    print("Zero offset=%#x count=%#x trim=%d" % g)
if got != want:
    sys.exit("FAIL: the server got these zeros %r, expected %r"
             % ([(hex(o), c, t) for o, c, t in got],
                [(hex(o), c, t) for o, c, t in want]))
EOF2
