#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

"""fuzz-protocol: random bytes to the plug through a real nbdkit.

    fuzz-protocol.py SOCKET PID SIZE [--seed N] [--first I]
                     [--iterations N] [--seconds S] [--rude PCT]
                     [--save DIR] [--gentle] [--state FILE]
    fuzz-protocol.py SOCKET PID SIZE --state FILE [--stripe N]
                     --verify FILE...

SOCKET is the Unix socket (or an nbd+unix:// URI of it) of an nbdkit serving the plug over an export
of SIZE bytes, PID nbdkit's pid.  Each iteration opens one connection
whose choices come from random.Random(SEED * 1000003 + ITERATION), so
that `--seed N --first I --iterations 1` replays iteration I alone:

  - garbage from the first byte, or a handshake with mutated options
    (bogus option numbers, lengths longer or shorter than the data,
    names that do not exist), or a valid fixed-newstyle handshake
    (NBD_OPT_GO, sometimes NBD_OPT_STRUCTURED_REPLY first);
  - then a stream of requests: valid ones (read, write, zero, trim,
    flush, block status, FUA, fast zero, no-hole) and mutated ones
    (bogus types and flags, lengths of 0 or up to 4 GiB - 1, offsets at
    or past the end, a write's payload cut short, a header cut in the
    middle, bytes of garbage), in writeback mode most of them left
    unflushed; replies are read (and dropped) while sending, so that a
    request is cut only on purpose;
  - then a way to leave: NBD_CMD_DISC, or closing the socket after
    reading every reply, or (PCT percent of the connections, --rude,
    default 10) closing it without reading them, with a reset.

--gentle leaves out whatever makes nbdkit close a connection while it
may still answer requests of it (no rude closes, no header cut or
garbage after a request, no short payload, no write too large to
skip; every connection that reached transmission ends with
NBD_CMD_DISC and reads until nbdkit closes it, 10 s at most): nbdkit
1.32.4 and 1.32.5 can abort then, in raw_send_socket (`sock >= 0`), a
race of their own (man page, "Clients that close without
reading").  Bytes before the first request (garbage, mutated options)
and mutated fields of whole requests stay.

The last MiB of the export is the clean client's: no request of the
fuzzed connections writes there (their offsets stay below it or start
at or past the end).  The clean client (libnbd) keeps one connection
open throughout.  After every fuzzed connection nbdkit must still run,
and the clean client must read back exactly what it saw acknowledged
there (leaving out what it wrote since its last flush, which the plug
may still hold: a read would make it write that out); then it writes
a new pattern over part of it, unflushed, and every 4th time flushes
and reads back the whole region.  Stops at the first
failure with exit status 1, naming the seed and the iteration; with
--save DIR the bytes that connection sent are written to
DIR/protocol-SEED-ITERATION.bin.  Stops after --iterations, or after
--seconds (whichever comes first; 0: no bound).  Prints the number of
connections and requests sent.

--state FILE: if nbdkit exits (a fuzzed connection or the clean
client's is cut or refused, and the process is gone within 30 s), the
clean client's acknowledged region, the write it had sent but not seen
acknowledged, the counts and where to go on are written to FILE, and
the exit status is 75: the test judges how nbdkit died.  `--state FILE
--verify FILE...` then checks that every 4 KiB block of the clean
region in the backing files (striped in --stripe bytes, or
concatenated) holds what was acknowledged (or the unacknowledged
write); exit status 1 if not.  Run again with the same --state FILE on
a new nbdkit, the fuzzer goes on from the next iteration, within the
same --iterations and --seconds.
"""

import argparse
import base64
import json
import os
import random
import select
import socket
import struct
import sys
import time

import nbd

NBDMAGIC = b"NBDMAGIC"
IHAVEOPT = b"IHAVEOPT"
REQ_MAGIC = 0x25609513
OPT_REPLY_MAGIC = 0x3E889045565A9
OPT_GO = 7
OPT_STRUCTURED_REPLY = 8
REP_ACK = 1

CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_TRIM = 0, 1, 2, 3, 4
CMD_CACHE, CMD_WRITE_ZEROES, CMD_BLOCK_STATUS = 5, 6, 7
F_FUA, F_NO_HOLE, F_DF, F_REQ_ONE, F_FAST_ZERO = 1, 2, 4, 8, 16

CLEAN = 1 << 20                 # The clean client's region at the end.
STALL = 10                      # Seconds without progress: give up a send.
FLUSH_EVERY = 4                 # The clean client flushes every 4th check.
GONE = 75                       # Exit status: nbdkit went away (--state).


class Failure(Exception):
    pass


class DataLoss(Failure):
    """The clean client read back something else than acknowledged."""


def server_alive(pid):
    """nbdkit is running (not gone, not a zombie)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


class Conn:
    """One fuzzed connection: what it sent is kept for --save."""

    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(5)
        self.s.connect(path)
        self.sent = bytearray()
        self.requests = 0
        self.stalls = 0

    def send(self, data):
        """Send all of data, reading (and dropping) the server's replies
        meanwhile: a client that only writes fills both directions'
        buffers (nbdkit blocks sending replies, then stops reading), and
        a send given up half-way would leave nbdkit waiting for the rest
        of a request.  False: the server closed, or made no progress
        either way for STALL seconds (both allowed here; the clean
        client then tells whether nbdkit still serves)."""
        self.sent += data
        view = memoryview(data)
        last = time.monotonic()
        self.s.setblocking(False)
        try:
            while view:
                if time.monotonic() - last > STALL:
                    self.stalls += 1
                    return False
                r, w, _ = select.select([self.s], [self.s], [], 1.0)
                try:
                    if r:
                        if not self.s.recv(1 << 20):
                            return False
                        last = time.monotonic()
                    if w:
                        view = view[self.s.send(view[:1 << 20]):]
                        last = time.monotonic()
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    return False    # The server closed: that is allowed.
        finally:
            self.s.settimeout(5)
        return True

    def recv_exact(self, n):
        buf = b""
        while len(buf) < n:
            try:
                b = self.s.recv(n - len(buf))
            except OSError:
                return None
            if not b:
                return None
            buf += b
        return buf

    def drain(self, secs):
        """Read whatever the server sends for up to secs seconds, or
        until it closes."""
        end = time.monotonic() + secs
        try:
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    return
                self.s.settimeout(left)
                try:
                    if not self.s.recv(65536):
                        return
                except socket.timeout:
                    return
                except OSError:
                    return
        finally:
            self.s.settimeout(5)    # Not left at a drain's last few ms.

    def close(self, reset):
        if reset:
            self.s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                              struct.pack("ii", 1, 0))
        self.s.close()


def option(rng, opt, data):
    return IHAVEOPT + struct.pack(">II", opt, len(data)) + data


def handshake(c, rng):
    """Returns True when the connection reached transmission (the
    server answered NBD_OPT_GO with ACK), False otherwise."""
    hello = c.recv_exact(18)
    if hello is None or hello[:16] != NBDMAGIC + IHAVEOPT:
        raise Failure("no newstyle greeting: %r" % hello)
    style = rng.randrange(10)
    if style == 0:              # Garbage from the first byte.
        c.send(rng.randbytes(rng.randrange(1, 200)))
        return False
    c.send(struct.pack(">I", 1 | 2))    # FIXED_NEWSTYLE | NO_ZEROES
    if style == 1:              # Mutated options.
        for _ in range(rng.randrange(1, 6)):
            data = rng.randbytes(rng.randrange(0, 40))
            length = rng.choice([len(data), rng.randrange(0, 1 << 32),
                                 len(data) + rng.randrange(1, 9)])
            c.send(IHAVEOPT + struct.pack(">II", rng.randrange(0, 16),
                                          length) + data)
        c.drain(0.05)
        return False
    if rng.randrange(3) == 0:
        c.send(option(rng, OPT_STRUCTURED_REPLY, b""))
        if not read_option_replies(c):
            return False
    name = b"" if rng.randrange(8) else rng.randbytes(rng.randrange(1, 9))
    infos = [rng.randrange(0, 5) for _ in range(rng.randrange(0, 3))]
    c.send(option(rng, OPT_GO, struct.pack(">I", len(name)) + name +
                  struct.pack(">H", len(infos)) +
                  b"".join(struct.pack(">H", i) for i in infos)))
    return read_option_replies(c)


def read_option_replies(c):
    """Read option replies up to the final one: True on ACK."""
    while True:
        hdr = c.recv_exact(20)
        if hdr is None:
            return False
        magic, _, rep, length = struct.unpack(">QIII", hdr)
        if magic != OPT_REPLY_MAGIC:
            raise Failure("bad option reply magic %x" % magic)
        if length and c.recv_exact(length) is None:
            return False
        if rep == REP_ACK:
            return True
        if rep & 0x80000000:
            return False


def pick_range(rng, size):
    """An offset and a length: most inside the fuzzed area (below the
    clean region), some at or past the end of the export."""
    area = size - CLEAN
    k = rng.randrange(10)
    if k < 7:
        n = rng.choice([0, 1, 511, 512, 4096, rng.randrange(1, 65537),
                        rng.randrange(1, 1 << 20)])
        n = min(n, area)
        return rng.randrange(0, area - n + 1), n
    if k < 9:                   # Starts at or past the end.
        off = rng.choice([size, size + rng.randrange(1, 1 << 20),
                          (1 << 63) - 1, (1 << 64) - 1,
                          rng.randrange(size, 1 << 64)])
        return off, rng.randrange(0, 1 << 32)
    # Crosses the end from below the clean region: never fits.
    off = rng.randrange(0, area)
    return off, min(size - off + rng.randrange(1, 1 << 20), (1 << 32) - 1)


def request(c, rng, size, handle, gentle):
    """Send one request, valid or mutated.  Returns False when the
    connection should stop (the server closed, or a header was cut)."""
    k = rng.randrange(100)
    off, n = pick_range(rng, size)
    flags = 0
    if k < 30:
        cmd = CMD_WRITE
        flags = F_FUA if rng.randrange(6) == 0 else 0
    elif k < 45:
        cmd = CMD_READ
    elif k < 55:
        cmd = CMD_WRITE_ZEROES
        flags = rng.choice([0, F_FUA, F_NO_HOLE, F_FAST_ZERO,
                            F_FAST_ZERO | F_NO_HOLE])
    elif k < 62:
        cmd = CMD_TRIM
    elif k < 70:
        cmd, off, n = CMD_FLUSH, 0, 0
    elif k < 76:
        cmd = CMD_BLOCK_STATUS
        flags = rng.choice([0, F_REQ_ONE])
    elif k < 78:
        cmd = CMD_CACHE
    else:                       # Mutated: any type, any flags.
        cmd = rng.choice([rng.randrange(0, 12), rng.randrange(0, 1 << 16)])
        flags = rng.randrange(0, 1 << 16)
        if cmd in (CMD_WRITE, CMD_WRITE_ZEROES, CMD_TRIM) and \
           off < size and off + n > size - CLEAN:
            off, n = size, n    # Mutations stay out of the clean region.
    if cmd == CMD_DISC:
        cmd = CMD_READ          # A disconnect ends the stream on purpose only.
    n &= 0xFFFFFFFF
    if gentle and cmd == CMD_WRITE and n > (4 << 20):
        off, n = size, 0        # nbdkit would close at once.
    hdr = struct.pack(">IHHQQI", REQ_MAGIC, flags, cmd, handle, off, n)
    if gentle:                  # Nothing that makes nbdkit close.
        pass
    elif rng.randrange(50) == 0:        # A header cut in the middle.
        c.send(hdr[:rng.randrange(1, len(hdr))])
        return False
    elif rng.randrange(40) == 0:        # Garbage instead of a header.
        c.send(rng.randbytes(rng.randrange(1, 64)))
        return False
    if not c.send(hdr):
        return False
    c.requests += 1
    if cmd == CMD_WRITE:
        if n > (4 << 20):       # nbdkit refuses it unread and closes.
            return c.send(rng.randbytes(rng.randrange(0, 4096)))
        if not gentle and rng.randrange(30) == 0:   # A payload cut short.
            c.send(rng.randbytes(rng.randrange(0, n + 1) // 2))
            return False
        return c.send(bytes([rng.randrange(256)]) * n)
    return True


def fuzz_one(path, size, rng, rude_pct, gentle, keep):
    c = Conn(path)
    keep.append(c)
    try:
        transmission = handshake(c, rng)
        if transmission:
            for h in range(rng.randrange(0, 64)):
                if not request(c, rng, size, h, gentle):
                    break
                if rng.randrange(8) == 0:
                    c.drain(0.001)
            leave = rng.randrange(100)
            if leave < rude_pct:
                c.close(reset=rng.randrange(2) == 0)
                return c
            if leave < 60 or gentle:
                c.send(struct.pack(">IHHQQI", REQ_MAGIC, 0, CMD_DISC,
                                   1 << 40, 0, 0))
        c.drain(10.0 if gentle and transmission else 1.0)
        c.close(reset=False)
    except Failure:
        c.close(reset=False)
        raise
    return c


class Clean:
    """The well-behaved client, one connection kept open: what it saw
    acknowledged must stay, flushed or not.  want is the clean region
    as acknowledged; pending the one write sent and not (yet) seen
    acknowledged, (offset in the region, bytes) or None: when nbdkit
    dies its blocks may hold either."""

    def __init__(self, path, size, state=None):
        self.path, self.size = path, size
        self.base = size - CLEAN
        self.h = None
        self.pending = None
        self.dirty = []             # Written since the last flush.
        self.checks = 0
        if state:
            self.want = bytearray(base64.b64decode(state["want"]))
            self.round = state["round"]
            self.connect()
        else:
            self.want = bytearray(CLEAN)
            self.round = 0
            self.connect()
            self.write(0, CLEAN)
            self.h.flush()

    def connect(self):
        self.h = nbd.NBD()
        self.h.connect_unix(self.path)

    def write(self, off, n):
        self.round += 1
        pat = ((b"clean %08d " % self.round) * (n // 15 + 1))[:n]
        self.pending = (off, pat)
        self.h.pwrite(pat, self.base + off)
        self.want[off:off + n] = pat
        self.pending = None

    def compare(self, off, n):
        got = self.h.pread(n, self.base + off)
        if got != self.want[off:off + n]:
            i = next(i for i in range(n) if got[i] != self.want[off + i])
            raise DataLoss("the clean client's acknowledged data differs "
                           "at offset %d" % (self.base + off + i))

    def check(self, rng):
        """Read back what it wrote, write one range and leave it
        unflushed: in writeback mode with long idle= and max-delay= the
        plug holds it through the next fuzzed connections.  A read of a
        held range makes the plug write it out first, and so does a
        flush: the ranges written since the last flush are left out of
        the reads, and every FLUSH_EVERY-th check flushes and reads back
        the whole region."""
        self.checks += 1
        held = sorted(self.dirty)
        pos = 0
        for off, n in held + [(CLEAN, 0)]:
            if off > pos:
                self.compare(pos, off - pos)
            pos = max(pos, off + n)
        n = rng.randrange(1, 64) * 4096
        off = rng.randrange(0, CLEAN - n + 1) // 512 * 512
        self.write(off, n)
        self.dirty.append((off, n))
        if self.checks % FLUSH_EVERY == 0:
            self.h.flush()
            self.dirty = []
            self.compare(0, CLEAN)

    def state(self):
        return {"want": base64.b64encode(bytes(self.want)).decode(),
                "round": self.round,
                "pending": None if self.pending is None else
                [self.pending[0],
                 base64.b64encode(self.pending[1]).decode()]}

    def close(self):
        self.compare(0, CLEAN)
        self.h.shutdown()


def read_export(files, stripe, off, n):
    """n bytes at export offset off, read from the backing files
    directly: stripe unit k in file k % nr at (k // nr) * stripe, or
    the files concatenated (stripe 0)."""
    out = bytearray()
    fds = [open(f, "rb") for f in files]
    try:
        while n > 0:
            if stripe:
                k, within = divmod(off, stripe)
                f = fds[k % len(fds)]
                f.seek((k // len(fds)) * stripe + within)
                step = min(n, stripe - within)
            else:
                for f in fds:
                    size = os.fstat(f.fileno()).st_size
                    if off < size:
                        break
                    off -= size
                f.seek(off)
                step = min(n, size - off)
            out += f.read(step)
            off += step
            n -= step
    finally:
        for f in fds:
            f.close()
    return bytes(out)


def verify_files(state, files, stripe, size):
    """After nbdkit died: every block the clean client saw acknowledged
    is in the files (or the pending write's, sent but not acknowledged).
    Returns the number of 4 KiB blocks that differ."""
    want = base64.b64decode(state["want"])
    alt = bytearray(want)
    if state["pending"]:
        off, data = state["pending"][0], base64.b64decode(state["pending"][1])
        alt[off:off + len(data)] = data
    got = read_export(files, stripe, size - CLEAN, CLEAN)
    bad = 0
    for b in range(0, CLEAN, 4096):
        g = got[b:b + 4096]
        if g != want[b:b + 4096] and g != alt[b:b + 4096]:
            if bad == 0:
                i = b + next(i for i in range(4096) if g[i] != want[b + i])
                print("fuzz-protocol: acknowledged data lost at offset %d "
                      "(want %r, have %r)" % (size - CLEAN + i,
                                              want[i:i + 15],
                                              got[i:i + 15]))
            bad += 1
    return bad


def wait_gone(pid, secs):
    """True once nbdkit pid has exited (its abort's rescue may take a
    while), False if it still runs after secs seconds."""
    end = time.monotonic() + secs
    while server_alive(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("socket")
    ap.add_argument("pid", type=int)
    ap.add_argument("size", type=int)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--iterations", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=0)
    ap.add_argument("--rude", type=int, default=10)
    ap.add_argument("--save", default=None)
    ap.add_argument("--gentle", action="store_true")
    ap.add_argument("--state", default=None)
    ap.add_argument("--verify", nargs="+", metavar="FILE")
    ap.add_argument("--stripe", type=int, default=0)
    a = ap.parse_args()
    # An nbd+unix URI (the tests' run_client passes one) or a path.
    if a.socket.startswith("nbd+unix:"):
        a.socket = a.socket.split("socket=", 1)[1].split("&")[0]
    if a.verify:
        with open(a.state) as f:
            bad = verify_files(json.load(f), a.verify, a.stripe, a.size)
        print("fuzz-protocol: after nbdkit's abort: %d blocks of 4 KiB of "
              "acknowledged data missing" % bad)
        return 1 if bad else 0
    if a.iterations == 0 and a.seconds == 0:
        ap.error("give --iterations or --seconds")

    # --state FILE: a run that nbdkit's death interrupted goes on from
    # there (the same bounds, counts and clean region).
    saved = None
    if a.state and os.path.exists(a.state):
        with open(a.state) as f:
            saved = json.load(f)
    if saved:
        first, it = saved["first"], saved["next"]
        conns, reqs, stalls = saved["conns"], saved["reqs"], saved["stalls"]
        spent = saved["seconds"]
    else:
        first, it, conns, reqs, stalls, spent = a.first, a.first, 0, 0, 0, 0
    start = time.monotonic() - spent
    clean = None

    def gone(why):
        """nbdkit died: with --state, leave what the next run needs and
        exit GONE (the test judges the death and checks the files)."""
        if not a.state or not wait_gone(a.pid, 30):
            return None
        with open(a.state, "w") as f:
            json.dump(dict(clean.state(), first=first, next=it + 1,
                           conns=conns, reqs=reqs, stalls=stalls,
                           seconds=time.monotonic() - start), f)
        print("fuzz-protocol: nbdkit (pid %d) went away at seed %d "
              "iteration %d (%s): %d connections so far"
              % (a.pid, a.seed, it, why, conns))
        return GONE

    try:
        clean = Clean(a.socket, a.size, saved)
    except nbd.Error as ex:
        if saved is None:
            # Nothing acknowledged yet: no state to go on from.
            print("fuzz-protocol: FAILED: the clean client: %s" % ex)
            return 1
        if server_alive(a.pid):
            print("fuzz-protocol: FAILED: the clean client: %s" % ex)
            return 1
        it -= 1
        return gone("the clean client: %s" % ex)
    while True:
        if a.iterations and it >= first + a.iterations:
            break
        if a.seconds and time.monotonic() - start >= a.seconds:
            break
        rng = random.Random(a.seed * 1000003 + it)
        keep = []
        try:
            c = fuzz_one(a.socket, a.size, rng,
                         0 if a.gentle else a.rude, a.gentle, keep)
            conns += 1
            reqs += c.requests
            stalls += c.stalls
            if not server_alive(a.pid):
                r = gone("after its connection")
                if r is not None:
                    return r
                raise Failure("nbdkit (pid %d) is gone" % a.pid)
            clean.check(rng)
        except (Failure, nbd.Error, OSError) as ex:
            # A connection cut or refused may be nbdkit dying: the test
            # judges how it died.  Data read back wrong never is.
            r = None if isinstance(ex, DataLoss) else gone(str(ex))
            if r is not None:
                return r
            print("fuzz-protocol: FAILED at seed %d iteration %d: %s"
                  % (a.seed, it, ex))
            print("fuzz-protocol: replay: --seed %d --first %d "
                  "--iterations 1" % (a.seed, it))
            if a.save and keep:
                name = os.path.join(a.save, "protocol-%d-%d.bin"
                                    % (a.seed, it))
                with open(name, "wb") as f:
                    f.write(keep[0].sent)
                print("fuzz-protocol: its bytes: %s" % name)
            print("fuzz-protocol: %d connections, %d requests before it"
                  % (conns, reqs))
            return 1
        it += 1
    clean.close()
    print("fuzz-protocol: %d connections, %d requests, %d sends stalled, "
          "seed %d, iterations %d..%d, %.0f s: no failure"
          % (conns, reqs, stalls, a.seed, first, it - 1,
             time.monotonic() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
