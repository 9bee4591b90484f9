# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

"""plugtest: what the shell tests' Python clients share.

functions.sh puts this directory on PYTHONPATH, so a client written to
$tmp by a test says "import plugtest".
"""

import errno
import glob
import json
import os
import re
import sys
import time

import nbd


def stats_after(statsfile, n):
    """The plug's statistics once n connections have closed (it
    rewrites its statsfile at each close)."""
    while True:
        try:
            st = json.load(open(statsfile))
            if st["connections"] >= n:
                return st
        except (OSError, ValueError):
            pass
        time.sleep(0.01)


def stats_until(statsfile, what, cond, timeout=120):
    """The first report in statsfile (rewritten every stats-interval=)
    for which cond(report) is true; exits naming what after timeout
    seconds (a bound far above any interval: only a report that never
    comes reaches it)."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            st = json.load(open(statsfile))
            last = st
            if cond(st):
                return st
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    sys.exit("%s: no report with %s within %d s; the last one: %s"
             % (statsfile, what, timeout, json.dumps(last)[:2000]))


# One line of strace -ttt -T -y: start time, call, fd, the fd's path,
# the other arguments, the result, an errno name, the duration.
_STRACE_LINE = re.compile(r"^(\d+\.\d+) (\w+)\((\d+)<([^>]*)>(.*)\) = "
                          r"(-?\d+)(?: \w+ \([^)]*\))? <(\d+\.\d+)>$")


def backing_calls(tdir, img):
    """The calls on file img in the output of `strace -ff -ttt -T -y -o
    TDIR/t`: (writes, syncs, trims).  writes: (when the call returned,
    offset, length) of each pwrite* and fallocate that succeeded, in
    that order; syncs: when each fdatasync or fsync that succeeded
    started, in order; trims: when each fallocate that punched a hole
    started.  Exits with a message on a call strace split in two or an
    argument it cannot parse."""
    img = os.path.realpath(img)
    writes, syncs, trims = [], [], []
    for f in glob.glob(os.path.join(tdir, "t.*")):
        for line in open(f):
            line = line.rstrip("\n")
            if "unfinished" in line or "resumed" in line:
                sys.exit("strace -ff split a call: %r" % line)
            m = _STRACE_LINE.match(line)
            if not m or os.path.realpath(m.group(4)) != img:
                continue
            ts, name, rest = float(m.group(1)), m.group(2), m.group(5)
            ret, end = int(m.group(6)), float(m.group(1)) + float(m.group(7))
            if name in ("fdatasync", "fsync"):
                if ret == 0:
                    syncs.append(ts)
            elif name.startswith("pwrite") and ret > 0:
                # pwrite64(fd, buf, n, OFF), pwritev(fd, iov, n, OFF),
                # pwritev2(fd, iov, n, OFF, FLAGS)
                off = rest.rsplit(", ", 2 if name == "pwritev2" else 1)[1]
                if not off.isdigit():
                    sys.exit("cannot parse the offset of %r" % line)
                writes.append((end, int(off), ret))
            elif name == "fallocate" and ret == 0:
                # fallocate(fd, MODE, OFF, LEN): zeroes or a hole
                mode, off, n = rest.rsplit(", ", 2)
                if not off.isdigit() or not n.isdigit():
                    sys.exit("cannot parse the range of %r" % line)
                writes.append((end, int(off), int(n)))
                if "PUNCH_HOLE" in mode:
                    trims.append(ts)
    writes.sort()
    syncs.sort()
    return writes, syncs, trims


# held_reads' reads: 4 KiB at i * 64 KiB + 512.
def _read_offset(i):
    return i * 65536 + 512


def held_reads(h, log, n):
    """Send n reads on handle h that the server holds, and wait (30 s at
    most) until its log (--filter=log) shows them all: returns (bufs,
    cookies, conns), conns the server connection of each read logged
    (fewer than n if they did not all arrive)."""
    bufs = [nbd.Buffer(4096) for _ in range(n)]
    cookies = [h.aio_pread(b, _read_offset(i)) for i, b in enumerate(bufs)]
    for _ in range(600):
        conns = [m.group(1) for m in (re.search(r"connection=(\d+) Read id=",
                                                line) for line in open(log))
                 if m]
        if len(conns) >= n:
            break
        h.poll(0)
        time.sleep(0.05)
    return bufs, cookies, conns


def check_reads(bufs, img):
    """Assert that held_reads' buffers hold file img's data."""
    data = open(img, "rb").read()
    for i, b in enumerate(bufs):
        off = _read_offset(i)
        assert b.to_bytearray() == data[off:off + 4096], "read %d differs" % i


def connect(uri):
    """A new connection (an nbd.NBD handle) to uri."""
    h = nbd.NBD()
    h.connect_uri(uri)
    return h


def in_file(img, off, n):
    """n bytes at off of file img, read directly (not through NBD)."""
    with open(img, "rb") as f:
        f.seek(off)
        return f.read(n)


def number(path):
    """The number in a shim's count file; 0 while there is none (or it
    is being rewritten)."""
    try:
        return int(open(path).read() or 0)
    except (OSError, ValueError):
        return 0


def set_control(control, word):
    """Replace a shim's control file at once: a file read while it is
    rewritten in place would read as empty, which means "ok"."""
    with open(control + ".tmp", "w") as f:
        f.write(word + "\n")
    os.rename(control + ".tmp", control)


def wait_until(what, cond, handles):
    """Wait until cond() is true, polling the handles meanwhile; exit
    with a message after 30 s (a hang, not a duration)."""
    for _ in range(3000):
        if cond():
            return
        for h in handles:
            h.poll(0)
        time.sleep(0.01)
    sys.exit("timed out waiting until %s" % what)


# Ample time for a plug with idle=10ms to unplug what it was sent and
# for its file (or server) to take it, or for a FLUSH to start its round
# of syncs: tests order their steps by it, and assert on answers and
# counts, never on how long anything took.
SETTLE = 0.3


def pwrite_settled(h, data, off):
    """Write data at off on h (acknowledged), then let the plug write
    it out (SETTLE)."""
    h.pwrite(data, off)
    time.sleep(SETTLE)


def held_flush(h, control):
    """Hold the file's syncs (shim-fdatasync "hold"), then send a FLUSH
    on h that starts a round of syncs (SETTLE), held: its cookie."""
    set_control(control, "hold")
    cookie = h.aio_flush()
    time.sleep(SETTLE)
    return cookie


def outcome(f):
    """f(), an NBD command: "ok", "EIO", or the repr of another
    nbd.Error."""
    try:
        f()
        return "ok"
    except nbd.Error as e:
        return "EIO" if e.errnum == errno.EIO else repr(e)


def answer(h, cookie):
    """The outcome of the asynchronous command cookie on h, once h has
    no command in flight."""
    while h.aio_in_flight() > 0:
        h.poll(-1)
    return outcome(lambda: h.aio_command_completed(cookie))


def check(bad, what, got, expect, why=None):
    """Print what got, an outcome; append to the list bad if it is not
    expect, saying why expect (if given)."""
    print("%s: %s" % (what, got))
    if got != expect:
        bad.append("%s: %s, expected %s%s"
                   % (what, got, expect, " (%s)" % why if why else ""))


def check_flush(h, what, expect, bad, why=None):
    """FLUSH on h, expecting outcome expect ("ok" or "EIO"): check,
    saying why expect (if given)."""
    check(bad, what, outcome(h.flush), expect, why)


def verdict(bad, success):
    """Exit with the list bad's messages, one a line, if there are any;
    else print success."""
    if bad:
        sys.exit("\n".join(bad))
    print(success)
