#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Hold mode: a FLUSH or a FUA write on one connection does not wait for
# another connection's unreplied writes, and above all does not make new
# clients wait for them.  In hold mode a reply already means "written",
# so a FLUSH covers nothing another connection has not been answered
# for: syncing the files is all it needs.
#
# -D plug.backend_delay_us=1000000 (every backend write takes 1 s more).
# Connection X sends 4 writes (hold: no reply until they are written);
# connection Y then sends a FLUSH (case flush) or a FUA write (case fua);
# then a third client Z connects.  One python process drives the three
# handles with libnbd's aio calls and one select loop, and records the
# order in which it sees: Z's handshake done, Y's request answered, X's
# writes answered.  Z's handshake must come before X's writes are
# answered, and (case flush) so must Y's FLUSH.  (Case fua is weaker:
# Y's own FUA write takes the backend's 1 s too, so the order it checks
# holds whether or not the FUA then waits for X.)  Order only, no clock
# (the 1 s backend only makes "before" unmistakable); short sleeps only
# make it likely that the server has X's writes before Y's request, and
# Y's request before Z connects.
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

cat > "$tmp/client.py" <<'EOF'
import nbd, select, sys, time
uri, case = sys.argv[1], sys.argv[2]
K = 65536
events = []

def note(what):
    def cb(err):
        events.append((what, err.value))
        return 1
    return cb

x = nbd.NBD()
x.connect_uri(uri)
y = nbd.NBD()
y.connect_uri(uri)
for i in range(4):
    x.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(b"X" * 4096)), i * K,
                 completion=note("X write %d" % i))
while x.aio_get_direction() & nbd.AIO_DIRECTION_WRITE:
    x.poll(-1)                  # Until all 4 are sent.
time.sleep(0.1)                 # Let the server take them (held 1 s).
if case == "flush":
    y.aio_flush(completion=note("Y flush"))
else:
    y.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(b"Y" * 4096)), 8 * K,
                 completion=note("Y FUA write"), flags=nbd.CMD_FLAG_FUA)
y.poll(0)
time.sleep(0.1)                 # Let the server take Y's request first.
z = nbd.NBD()
z.aio_connect_uri(uri)
z_ready = False

def pump(handles):
    rl, wl = [], []
    for h in handles:
        d = h.aio_get_direction()
        if d & nbd.AIO_DIRECTION_READ:
            rl.append(h.aio_get_fd())
        if d & nbd.AIO_DIRECTION_WRITE:
            wl.append(h.aio_get_fd())
    r, w, _ = select.select(rl, wl, [])
    for h in handles:
        fd = h.aio_get_fd()
        if fd in r:
            h.aio_notify_read()
        if fd in w:
            h.aio_notify_write()

while x.aio_in_flight() > 0 or y.aio_in_flight() > 0 or not z_ready:
    handles = [h for h in (x, y) if h.aio_in_flight() > 0]
    if not z_ready:
        handles.append(z)
    pump(handles)
    if not z_ready and z.aio_is_ready():
        z_ready = True
        events.append(("Z handshake", 0))
    if not z_ready and z.aio_is_dead():
        sys.exit("Z: the connection died: %s" % nbd.get_error())

for what, err in events:
    print("%-12s %s" % (what, "ok" if err == 0 else "error %d" % err))
errs = [w for w, e in events if e]
if errs:
    sys.exit("%s: failed: %s" % (case, ", ".join(errs)))
order = [w for w, e in events]
first_x = min(i for i, w in enumerate(order) if w.startswith("X"))
bad = []
if order.index("Z handshake") > first_x:
    bad.append("a new client's handshake waited for another connection's "
               "held writes (behind the %s)" % case)
if case == "flush" and order.index("Y flush") > first_x:
    bad.append("the FLUSH waited for another connection's unreplied writes")
z.shutdown()
x.shutdown()
y.shutdown()
if bad:
    sys.exit("%s: %s" % (case, "; ".join(bad)))
EOF

failed=()
for case in flush fua; do
  truncate -s 1M "$tmp/$case.img"
  start_plug $case -D plug.backend_delay_us=1000000 -- file="$tmp/$case.img" \
             mode=hold
  timeout 60 /usr/bin/python3 "$tmp/client.py" "$(server_uri $case)" $case ||
    failed+=($case)
  stop_server $case
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "$0: failed: ${failed[*]}"
  exit 1
fi
