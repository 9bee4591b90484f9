#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# The unflushed window of the live statistics is exact: with
# idle=10s max-delay=60s direct=never nothing leaves the plug on its
# own, and "unflushed" counts exactly the bytes and requests the client
# wrote since its last FLUSH (three writes of different sizes), drops
# to 0 once a FLUSH is answered, counts the writes after it (one write,
# then another connection's zero: a FLUSH covers every connection's
# writes, so they count together), and does not count a FUA write,
# which is answered only once synced.  A second FLUSH, on the other
# connection, empties it again.  Then nbdplug-stat --once prints the
# report with the fields expected.  Reports are waited for by polling
# (no duration asserted).
# Shown able to fail: with note_acked (src/engine-durable.c) not counting the
# write acknowledged at submit, "unflushed.bytes 0, expected 12800";
# with a successful FLUSH not emptying the windows it covers
# (stats_unflushed_flush_end's ok branch made a no-op), "after the FLUSH:
# unflushed.bytes 12800, expected 0"; with nbdplug-stat printing no
# unflushed line under that name, "nbdplug-stat --once: no line
# 'unflushed: bytes=0 requests=0'".
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

cat > "$tmp/client.py" <<'EOF2'
import nbd, plugtest, sys
uri, statsfile = sys.argv[1:3]
bad = []

def answered(writes, flushes):
    # Latencies are counted once the request was answered, and a report
    # copies the counters before the engine's figures: a report that
    # counts these answers has the window they left.
    def cond(st):
        lat = st["totals"]["latency_us"]
        return (st.get("written_at") == "interval" and
                lat["write"]["count"] >= writes and
                lat["flush"]["count"] >= flushes)
    return cond

def expect(what, st, nbytes, nreqs):
    u = st["unflushed"]
    plugtest.check(bad, "%s: unflushed.bytes" % what, u["bytes"], nbytes)
    plugtest.check(bad, "%s: unflushed.requests" % what, u["requests"],
                   nreqs)
    if (u["oldest_age_s"] > 0) != (nreqs > 0):
        bad.append("%s: unflushed.oldest_age_s %r with %d requests"
                   % (what, u["oldest_age_s"], nreqs))

a = plugtest.connect(uri)
b = plugtest.connect(uri)
a.pwrite(b"a" * 4096, 0)
a.pwrite(b"b" * 8192, 65536)
a.pwrite(b"c" * 512, 131072)
st = plugtest.stats_until(statsfile, "3 writes", answered(3, 0))
expect("3 writes, no FLUSH", st, 12800, 3)
plugtest.check(bad, "3 writes: held in the plug", st["queue"]["held"], 3)

a.flush()
st = plugtest.stats_until(statsfile, "the FLUSH", answered(3, 1))
expect("after the FLUSH", st, 0, 0)

a.pwrite(b"d" * 1024, 4096)
b.zero(2048, 262144)
a.pwrite(b"F" * 4096, 524288, nbd.CMD_FLAG_FUA)
st = plugtest.stats_until(statsfile, "5 writes", answered(5, 1))
expect("a write, a zero on the other connection, a FUA write", st,
       1024 + 2048, 2)

b.flush()
st = plugtest.stats_until(statsfile, "the second FLUSH", answered(5, 2))
expect("after the other connection's FLUSH", st, 0, 0)

a.pwrite(b"e" * 4096, 8192)
st = plugtest.stats_until(statsfile, "6 writes", answered(6, 2))
expect("one more write", st, 4096, 1)
a.shutdown()
b.shutdown()
plugtest.verdict(bad, "the unflushed window counted exactly")
EOF2

truncate -s 1M "$tmp/disk.img"
start_plug unfl file="$tmp/disk.img" stats-file="$tmp/stats.json" \
           stats-interval=100ms idle=10s max-delay=60s direct=never
run_client unfl 300 "$tmp/client.py" "$tmp/stats.json"
end_client unfl

# The report written at the exit: its sync covered the last write.
/usr/bin/python3 "$abs_top_srcdir/tools/nbdplug-stat" --once \
  "$tmp/stats.json" > "$tmp/once.out"
out=$(cat "$tmp/once.out")
echo "$out"
grep -q '"written_at": "exit"' "$tmp/stats.json" ||
  fail "the last report is not the exit's"
for want in "conns" "merge" "unflMB" "unflage" "w_p99" "f_p99" "be_p99" \
            "unflushed: bytes=0 requests=0" "[local] running"; do
  grep -qF -- "$want" <<<"$out" ||
    fail "nbdplug-stat --once: no line '$want'"
done
# Its values: one line of 18 columns under the header, the merge
# factor as the report says it.
/usr/bin/python3 - "$tmp/stats.json" "$tmp/once.out" <<'EOF2' ||
import json, sys
lines = open(sys.argv[2]).read().splitlines()
st = json.load(open(sys.argv[1]))
head, row = lines[0].split(), lines[1].split()
assert len(head) == len(row) == 18, (head, row)
v = dict(zip(head, row))
t = st["totals"]
assert v["merge"] == "%.2f" % (t["client"]["write"]["ops"] /
                               t["backend"]["write"]["ops"]), v
assert v["unflreq"] == "0", v
print("nbdplug-stat --once: %r" % v)
EOF2
  fail "nbdplug-stat --once: its values differ from the report's"
