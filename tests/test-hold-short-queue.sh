#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Hold mode, a client with fewer requests in flight than nbdkit has
# threads (queue depth 4 of 16): the parked trigger can never fire, and
# a connection that kept holding would wait for idle= at every batch.
# Seen twice with nothing of the connection in flight, idle= stops
# pacing it: requests are issued when nothing is in flight and what
# arrives meanwhile is batched (unplug reason "quiet", see the man
# page's "The two modes").
# The timer that unplugs is idle= or, where idle= is the longer,
# max-delay= (default 10ms): both runs, idle=5ms and idle=20ms.
# Asserted on counts in the statistics, not on time: 400 writes in
# batches of 4 give about 100 timer unplugs (idle + max-delay) without
# pacing, at most a few with it.  Every write is then read back from
# the backing file itself, and the server must exit with status 0.
# Shown able to fail: against the plugin built before PACE_BUSY, and
# with max-delay's unplugs left out of the pacing (idle=20ms only),
# "timer unplugs 99, expected at most 10".
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

for idle in 5ms 20ms; do
rm -f "$tmp/img" "$tmp/stats.json"
truncate -s 8M "$tmp/img"
start_plug srv --threads=16 -- file="$tmp/img" mode=hold idle=$idle \
           stats-file="$tmp/stats.json"

timeout 120 /usr/bin/python3 - "$(server_uri srv)" <<'PY'
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
N, QD, K = 400, 4, 4096
state = {"next": 0, "out": 0, "done": 0}

def block(i):
    return bytes([i % 251 + 1]) * K

def send():
    i = state["next"]
    state["next"] += 1
    state["out"] += 1
    h.aio_pwrite(block(i), i * K, completion=done)

def done(err):
    if err.value != 0:
        sys.exit("write failed: errno %d" % err.value)
    state["out"] -= 1
    state["done"] += 1
    return 1

while state["next"] < QD:
    send()
while state["done"] < N:
    h.poll(-1)
    while state["out"] < QD and state["next"] < N:
        send()
print("%d writes answered at queue depth %d" % (state["done"], QD))
h.shutdown()
PY

# No client left: the server exits at once and writes statsfile.
stop_server srv
cat "$tmp/stats.json"
/usr/bin/python3 - "$tmp/stats.json" "$tmp/img" <<'PY'
import json, sys
st = json.load(open(sys.argv[1]))
u = st["unplugs"]
w = st["backend"]["write"]["ops"]
timer = u["idle"] + u["max-delay"]
print("unplugs idle %d, max-delay %d, quiet %d, parked %d; backend writes %d"
      % (u["idle"], u["max-delay"], u.get("quiet", 0), u["parked"], w))
if timer > 10:
    sys.exit("timer unplugs %d, expected at most 10" % timer)
if u.get("quiet", 0) < 1:
    sys.exit("no quiet unplug: the connection never stopped waiting")
if not 0 < w <= 400:
    sys.exit("backend writes %d, expected 1..400" % w)
K = 4096
data = open(sys.argv[2], "rb").read()
bad = [i for i in range(400) if data[i * K:(i + 1) * K] != bytes([i % 251 + 1]) * K]
if bad:
    sys.exit("%d blocks wrong in the file, first %d" % (len(bad), bad[0]))
print("all 400 blocks in the file")
PY
done
