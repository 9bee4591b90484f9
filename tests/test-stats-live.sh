#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Live statistics: with one connection kept open, stats-file= is
# rewritten every stats-interval= (not only at close and exit), and its
# counters rise as that connection writes.  Reports are waited for by
# polling the file for the figure expected (no duration is asserted;
# the 120 s bound is only for a report that never comes).
# Shown able to fail: with the stats timer never started
# (stats_rearm_locked's want forced false), "no report with ... within
# 120 s; the last one: null" (the file never appears while the
# connection is open); with the open connections left out of the live
# totals (write_statsfile_locked not merging open_sum), the same, with
# the last report counting no write.
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

cat > "$tmp/client.py" <<'EOF2'
import nbd, plugtest, sys
uri, statsfile = sys.argv[1:3]
K = 4096
bad = []

def writes_done(n):
    # The write latency is counted once the write was answered, before
    # the snapshot of the same report.
    return lambda st: (st.get("written_at") == "interval" and
                       st["totals"]["latency_us"]["write"]["count"] >= n)

h = nbd.NBD()
h.connect_uri(uri)
for i in range(8):
    h.pwrite(bytes([65 + i]) * K, i * K)
s1 = plugtest.stats_until(statsfile, "8 writes answered", writes_done(8))
for i in range(8, 24):
    h.pwrite(bytes([65 + i]) * K, i * K)
s2 = plugtest.stats_until(statsfile, "24 writes answered", writes_done(24))
h.flush()
s3 = plugtest.stats_until(
    statsfile, "the FLUSH answered",
    lambda st: st["totals"]["latency_us"]["flush"]["count"] >= 1)

for n, st, w in ((1, s1, 8), (2, s2, 24)):
    t = st["totals"]
    plugtest.check(bad, "report %d: open connections" % n,
                   st["open_connections"], 1)
    plugtest.check(bad, "report %d: closed connections" % n,
                   st["connections"], 0)
    plugtest.check(bad, "report %d: totals.client.write.ops" % n,
                   t["client"]["write"]["ops"], w)
    plugtest.check(bad, "report %d: totals.client.write.bytes" % n,
                   t["client"]["write"]["bytes"], w * K)
    plugtest.check(bad, "report %d: per_connection entries" % n,
                   len(st["per_connection"]), 1)
    c = st["per_connection"][0]["client"]["write"]["ops"]
    plugtest.check(bad, "report %d: the connection's write.ops" % n, c, w)
if s2["uptime_s"] <= s1["uptime_s"]:
    bad.append("the second report is not newer (uptime %r then %r)"
               % (s1["uptime_s"], s2["uptime_s"]))
t3 = s3["totals"]
plugtest.check(bad, "after the FLUSH: totals.client.flush.ops",
               t3["client"]["flush"]["ops"], 1)
if t3["backend"]["write"]["ops"] < 1:
    bad.append("after the FLUSH: nothing reached the file")
plugtest.check(bad, "after the FLUSH: the file's runs",
               s3["files"][0]["runs"], t3["backend"]["write"]["ops"])
h.shutdown()
plugtest.verdict(bad, "live statistics rose while the connection stayed "
                 "open")
EOF2

truncate -s 1M "$tmp/disk.img"
start_plug live file="$tmp/disk.img" stats-file="$tmp/stats.json" \
           stats-interval=100ms idle=10s max-delay=60s direct=never
run_client live 300 "$tmp/client.py" "$tmp/stats.json"
end_client live
