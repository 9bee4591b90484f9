# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).
#
# churn-client.py URI CLIENTS MIB BS ROUND
#
# One round of connection churn: CLIENTS connections at once (a thread
# each), every one writes MIB MiB to its own region in BS-byte writes
# with 16 in flight, FLUSHes, reads it all back (16 in flight) and
# verifies it, then disconnects.  Exit status 1 if any data did not
# read back or a connection failed.  Used by tests/test-churn-memory.sh
# and bench/churn.sh.
import nbd, sys, threading

uri, clients, mib, bs, rnd = (sys.argv[1], int(sys.argv[2]),
                              int(sys.argv[3]), int(sys.argv[4]),
                              int(sys.argv[5]))
QD = 16
region = mib << 20
failures = []


def pattern(client, i):
    tag = b"r%03d c%05d w%07d|" % (rnd, client, i)
    return (tag * (bs // len(tag) + 1))[:bs]


def one(client):
    try:
        h = nbd.NBD()
        h.connect_uri(uri)
        base = client * region
        n = region // bs
        wbufs = []
        for i in range(n):
            while h.aio_in_flight() >= QD:
                h.poll(-1)
            wbufs.append(nbd.Buffer.from_bytearray(bytearray(pattern(client, i))))
            h.aio_pwrite(wbufs[-1], base + i * bs)
        while h.aio_in_flight() > 0:
            h.poll(-1)
        h.flush()
        bufs = []
        for i in range(n):
            while h.aio_in_flight() >= QD:
                h.poll(-1)
            b = nbd.Buffer(bs)
            bufs.append(b)
            h.aio_pread(b, base + i * bs)
        while h.aio_in_flight() > 0:
            h.poll(-1)
        for i, b in enumerate(bufs):
            if b.to_bytearray() != pattern(client, i):
                failures.append("client %d: write %d does not read back"
                                % (client, i))
                break
        h.shutdown()
    except nbd.Error as e:
        failures.append("client %d: %s" % (client, e))


threads = [threading.Thread(target=one, args=(c,)) for c in range(clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for f in failures[:10]:
    print(f)
sys.exit(1 if failures else 0)
