#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Durability that a test can catch: a FLUSH, a FUA write, a FUA zero and
# a FUA trim make the plugin sync the backing file, after the data (the
# zeroes, the hole) reached it, before the reply.  Seen two ways, so
# that neither a sync that is only counted nor a counter that is only
# bumped passes:
#  - statsfile: backend.sync.ops grows with the connection that sent a
#    FLUSH, and with each one that sent a FUA write, zero or trim (one
#    connection per step; the statsfile is rewritten at each close);
#  - strace -ff -ttt -T -y: between the client sending the FLUSH (the FUA
#    request) and getting its reply, the server entered fdatasync or
#    fsync on the backing file's descriptor after the pwrite or
#    fallocate calls that changed the range there had returned.  (Order
#    through the one system clock strace and the client both read: no
#    duration is asserted.)
# Plain writes need no sync: their count is printed, not checked.
# Both modes; writeback with idle=10s max-delay=60s direct=never, so
# the data written before a FLUSH really waits in the plug for it.
# Shown able to fail: with backing_sync() returning 0 instead of calling
# fdatasync, "no fdatasync or fsync of the backing file"; with the
# sync not counted in the statistics, "backend.sync.ops did not grow";
# with submit_mutation (plugin/conn.c) noting the files to sync only
# for a FUA write, not for a FUA zero or trim, "backend.sync.ops did not
# grow with the FUA zero" (and "... FUA trim"), and "fua-zero: no
# fdatasync or fsync of the backing file between the request and its
# reply".
source ./functions.sh
set -e
set -x

requires_python_nbd
requires strace -ff -o /dev/null true

plug_tmpdir

cat > "$tmp/client.py" <<'EOF'
import json, nbd, plugtest, sys, time
uri, statsfile, out = sys.argv[1:4]
K = 65536
events = {}

def stats_after(n):
    return plugtest.stats_after(statsfile, n)

def session():
    h = nbd.NBD()
    h.connect_uri(uri)
    return h

# 1. A write, then a FLUSH.
h = session()
h.pwrite(b"B" * K, 0)
t1 = time.time()
h.flush()
t2 = time.time()
h.shutdown()
s1 = stats_after(1)
events["flush"] = {"start": t1, "end": t2, "off": 0, "len": K}

# 2. Plain writes only.
h = session()
t = time.time()
for i in range(4):
    h.pwrite(b"P" * K, 2 * K + i * K)
h.shutdown()
s2 = stats_after(2)
events["plain"] = {"start": t, "end": time.time()}

def fua_step(n, name, off, request):
    """Connection n sends one FUA request, request(h); its time from
    before the request to the reply goes in events[name].  Returns the
    statistics once the connection closed."""
    h = session()
    t0 = time.time()
    request(h)
    t1 = time.time()
    h.shutdown()
    events[name] = {"start": t0, "end": t1, "off": off, "len": K}
    return stats_after(n)

# 3. A FUA write.
s3 = fua_step(3, "fua", 8 * K,
              lambda h: h.pwrite(b"U" * K, 8 * K, nbd.CMD_FLAG_FUA))
# 4. A FUA zero over the FUA write's data (it may punch a hole).
s4 = fua_step(4, "fua-zero", 8 * K,
              lambda h: h.zero(K, 8 * K, nbd.CMD_FLAG_FUA))
# 5. A FUA trim of the flushed write's data.
s5 = fua_step(5, "fua-trim", 0, lambda h: h.trim(K, 0, nbd.CMD_FLAG_FUA))

sync = [s["backend"]["sync"]["ops"] for s in (s1, s2, s3, s4, s5)]
print("backend.sync.ops after each step: flush %d, plain %d, fua %d, "
      "fua zero %d, fua trim %d" % tuple(sync))
json.dump(events, open(out, "w"))
bad = []
if s1["client"]["flush"]["ops"] != 1:
    bad.append("client.flush.ops %d, expected 1" % s1["client"]["flush"]["ops"])
if sync[0] < 1:
    bad.append("backend.sync.ops did not grow with the FLUSH")
if s3["client"]["fua"]["ops"] != 1:
    bad.append("client.fua.ops %d, expected 1" % s3["client"]["fua"]["ops"])
if sync[2] - sync[1] < 1:
    bad.append("backend.sync.ops did not grow with the FUA write")
for st, what, n in ((s4, "zero", 2), (s5, "trim", 3)):
    if st["client"][what]["ops"] != 1:
        bad.append("client.%s.ops %d, expected 1"
                   % (what, st["client"][what]["ops"]))
    if st["client"]["fua"]["ops"] != n:
        bad.append("client.fua.ops %d after the FUA %s, expected %d"
                   % (st["client"]["fua"]["ops"], what, n))
if sync[3] - sync[2] < 1:
    bad.append("backend.sync.ops did not grow with the FUA zero")
if sync[4] - sync[3] < 1:
    bad.append("backend.sync.ops did not grow with the FUA trim")
print("plain writes: %d syncs counted (none needed)" % (sync[1] - sync[0]))
if bad:
    sys.exit("; ".join(bad))
EOF

# check.py STRACE-DIR IMG EVENTS: the order of the system calls.
cat > "$tmp/check.py" <<'EOF'
import json, plugtest, sys
tdir, img, events = sys.argv[1:4]
ev = json.load(open(events))
writes, syncs, trims = plugtest.backing_calls(tdir, img)
print("backing file %s: %d pwrite and fallocate calls (%d punching), "
      "%d syncs" % (img, len(writes), len(trims), len(syncs)))

def covered_by(t, off, n):
    """Is [off, off+n) written by calls that returned before time t?"""
    need = [(off, off + n)]
    for end, o, c in writes:
        if end >= t:
            break
        nxt = []
        for a, b in need:
            if o + c <= a or b <= o:
                nxt.append((a, b))
                continue
            if a < o:
                nxt.append((a, o))
            if o + c < b:
                nxt.append((o + c, b))
        need = nxt
    return not need

bad = []
for what in ("flush", "fua", "fua-zero", "fua-trim"):
    e = ev[what]
    inside = [t for t in syncs if e["start"] <= t <= e["end"]]
    good = [t for t in inside if covered_by(t, e["off"], e["len"])]
    # A trim is advisory: where the file cannot punch holes, it is
    # answered without touching the file, and there is nothing for the
    # sync to come after.
    if (what == "fua-trim" and
            not [t for t in trims if e["start"] <= t <= e["end"]]):
        print("fua-trim: no hole punched (printed, not checked)")
        good = inside
    print("%s: %d syncs of the backing file while it was answered, "
          "%d after its data was written" % (what, len(inside), len(good)))
    if not inside:
        bad.append("%s: no fdatasync or fsync of the backing file between "
                   "the request and its reply" % what)
    elif not good:
        bad.append("%s: the backing file was synced before its data was "
                   "written" % what)
e = ev["plain"]
print("plain writes: %d syncs (none needed)"
      % len([t for t in syncs if e["start"] <= t <= e["end"]]))
if bad:
    sys.exit("; ".join(bad))
EOF

calls=fdatasync,fsync,pwrite64,pwritev,pwritev2,fallocate
for mode in writeback hold; do
  params=()
  [ $mode = writeback ] && params=(idle=10s max-delay=60s direct=never)
  img=$tmp/$mode.img
  truncate -s 1M "$img"
  mkdir "$tmp/st-$mode"
  SERVER_WRAP="strace -ff -qq -ttt -T -y -s 0 -o $tmp/st-$mode/t -e trace=$calls" \
    start_plug $mode file="$img" mode=$mode stats-file="$tmp/$mode.json" \
               "${params[@]}"
  timeout 60 /usr/bin/python3 "$tmp/client.py" "$(server_uri $mode)" \
          "$tmp/$mode.json" "$tmp/$mode.events"
  stop_server $mode
  cat "$tmp"/st-$mode/t.* | grep -v "^$" | head -40
  /usr/bin/python3 "$tmp/check.py" "$tmp/st-$mode" "$img" "$tmp/$mode.events"
done
