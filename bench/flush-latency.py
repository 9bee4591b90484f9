#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

"""bench/flush-latency.py: FLUSH latency under a sustained writer.

    flush-latency.py URI [--seconds S] [--qd N] [--bs BYTES]
                     [--flush-at T[,T...]] [--random-flushes N --seed N]
                     [--pattern seq|rand]

One libnbd handle keeps --qd writes of --bs bytes in flight for
--seconds (sequential from 0, wrapping at the end of the export, or
random aligned with --pattern rand).  At each time of --flush-at
(seconds from the start; or N random times in [0.3 s, S - 0.5 s] with
--random-flushes) one FLUSH is sent beside the writes, which go on.
The FLUSH's latency is the time from aio_flush to its completion
callback.  At the end the writer stops issuing and waits for what is in
flight (no final FLUSH).

Output: one line per FLUSH, then a summary line, key=value:

    flush at=0.500 latency=0.0123 writes_before=N writes_during=N
    summary writes=N seconds=S mbps=X flushes=N lat_max=S errors=N
"""

import argparse
import random
import sys
import time

import nbd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("uri")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--qd", type=int, default=16)
    ap.add_argument("--bs", type=int, default=65536)
    ap.add_argument("--flush-at", default="0.5")
    ap.add_argument("--random-flushes", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pattern", choices=["seq", "rand"], default="seq")
    a = ap.parse_args()

    rng = random.Random(a.seed)
    if a.random_flushes > 0:
        times = sorted(rng.uniform(0.3, a.seconds - 0.5)
                       for _ in range(a.random_flushes))
    else:
        times = sorted(float(t) for t in a.flush_at.split(","))

    h = nbd.NBD()
    h.connect_uri(a.uri)
    size = h.get_size()
    nblocks = size // a.bs
    buf = nbd.Buffer.from_bytearray(bytearray(rng.randbytes(a.bs)))

    state = {"inflight": 0, "done": 0, "errors": 0}
    flushes = []        # dicts: at, issued, completed, writes_before
    t0 = time.monotonic()

    def write_done(err):
        state["inflight"] -= 1
        state["done"] += 1
        if err.value != 0:
            state["errors"] += 1
        return 1

    def make_flush_done(f):
        def flush_done(err):
            f["completed"] = time.monotonic()
            f["writes_done_at_completion"] = state["done"]
            if err.value != 0:
                f["error"] = err.value
                state["errors"] += 1
            return 1
        return flush_done

    issued = 0
    next_flush = 0
    end = t0 + a.seconds
    while True:
        now = time.monotonic()
        if now >= end:
            break
        while next_flush < len(times) and now >= t0 + times[next_flush]:
            f = {"at": times[next_flush], "issued": now,
                 "writes_before": state["done"], "completed": None}
            h.aio_flush(completion=make_flush_done(f))
            flushes.append(f)
            next_flush += 1
        while state["inflight"] < a.qd:
            if a.pattern == "seq":
                blk = issued % nblocks
            else:
                blk = rng.randrange(nblocks)
            h.aio_pwrite(buf, blk * a.bs, completion=write_done)
            state["inflight"] += 1
            issued += 1
        # Wake up for the next FLUSH on time.
        wait = end - now
        if next_flush < len(times):
            wait = min(wait, t0 + times[next_flush] - now)
        h.poll(max(0, int(wait * 1000)) if wait > 0 else 0)
    while h.aio_in_flight() > 0:
        h.poll(-1)
    t1 = time.monotonic()
    h.shutdown()

    lats = []
    for f in flushes:
        lat = f["completed"] - f["issued"]
        lats.append(lat)
        print("flush at=%.3f latency=%.4f writes_before=%d writes_during=%d%s"
              % (f["at"], lat, f["writes_before"],
                 f["writes_done_at_completion"] - f["writes_before"],
                 " error=%d" % f["error"] if "error" in f else ""))
    print("summary writes=%d seconds=%.3f mbps=%.2f flushes=%d lat_max=%.4f "
          "errors=%d"
          % (state["done"], t1 - t0, state["done"] * a.bs / 1e6 / (t1 - t0),
             len(flushes), max(lats) if lats else 0, state["errors"]))
    return 1 if state["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
