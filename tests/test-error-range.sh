#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# An error belongs to the run that got it: one failing range of a file
# does not poison the rest of it, and failing writes keep memory and the
# log bounded.  tests/shim-pwritev.so (LD_PRELOAD into nbdkit only)
# makes pwrite/pwritev/fallocate of the backing file fail with ENOSPC
# where they touch [SHIM_FAIL_LO, SHIM_FAIL_HI), while its control file
# says "fail".  Writeback mode, direct=never (every write goes through
# the plug, acknowledged before it is written).
#  1. Isolation, failing range [0, 1 MiB) of a 16 MiB file:
#     a. a write at 0 (acknowledged), then a FLUSH: the FLUSH fails;
#     b. 240 writes of 64 KiB to the healthy rest of the file, queue
#        depth 16 (60 MiB, well past max-bytes=4M): every one succeeds;
#     c. a FLUSH (its outcome is printed, not checked: the failed range's
#        data may or may not count against it);
#     d. the range heals (control file "ok"), a new write at 0, and two
#        FLUSHes: the second one succeeds (the first may still report an
#        error from before the heal);
#     e. the backing file itself holds every healthy write that was
#        acknowledged and the new write at 0.
#  2. Bounds, every write of the file failing: 400 writes of 1 MiB at
#     queue depth 8 (they may fail or be acknowledged), then a FLUSH,
#     which fails.  nbdkit's peak RSS (VmHWM) stays under max-bytes per
#     connection plus a constant: at most 32 MiB above the same workload
#     against a healthy file (about 55 MiB here: nbdkit's request
#     buffers and malloc's per-thread arenas), and (without a
#     sanitizer's runtime) under 100 MiB; and the log has at most 50
#     error lines (rate-limited, not one or more per failed run).
source ./functions.sh
set -e
set -x

requires_python_nbd
# SHIM_PWRITEV: see functions.sh
test -f "$SHIM_PWRITEV" || fail "$SHIM_PWRITEV not built"

plug_tmpdir

# shim_wrap IMG CONTROL [LO HI]: SERVER_WRAP for the shim on IMG.
shim_wrap ()
{
  local w="env LD_PRELOAD=$SHIM_PWRITEV SHIM_PATH=$1 SHIM_CONTROL=$2"
  [ $# -ge 4 ] && w="$w SHIM_FAIL_LO=$3 SHIM_FAIL_HI=$4"
  echo "$w SHIM_COUNT=$tmp/shim-count"
}

cat > "$tmp/isolation.py" <<'EOF'
import nbd, random, sys
uri, img, control = sys.argv[1:4]
K = 1024
M = 1024 * K
B = 64 * K
h = nbd.NBD()
h.connect_uri(uri)
bad = []

def flush(what):
    try:
        h.flush()
        print("%s: FLUSH succeeded" % what)
        return True
    except nbd.Error as e:
        print("%s: FLUSH failed: %s" % (what, e))
        return False

# a. A write into the failing range, then a FLUSH.
h.pwrite(b"X" * B, 0)
if flush("a (after a write into the failing range)"):
    bad.append("a: the FLUSH after a write into the failing range succeeded")

# b. The healthy rest of the file: each 64 KiB slot once, shuffled.
slots = list(range(M // B, (16 * M) // B))
random.Random(5).shuffle(slots)
errs = []
def done(slot):
    def cb(err):
        if err.value:
            errs.append((slot, err.value))
        return 1
    return cb
for s in slots:
    while h.aio_in_flight() >= 16:
        h.poll(-1)
    data = bytearray((b"%06d" % s) * (B // 6) + b"\n" * (B % 6))
    h.aio_pwrite(nbd.Buffer.from_bytearray(data), s * B, completion=done(s))
while h.aio_in_flight() > 0:
    h.poll(-1)
print("b: %d healthy writes, %d failed" % (len(slots), len(errs)))
if errs:
    bad.append("b: %d of %d writes to the healthy range failed (first: "
               "offset %d, errno %d)" % (len(errs), len(slots),
                                         errs[0][0] * B, errs[0][1]))

# c. Printed only.
flush("c (range still failing)")

# d. Heal, rewrite the range, FLUSH twice.
open(control, "w").write("ok\n")
try:
    h.pwrite(b"Z" * B, 0)
except nbd.Error as e:
    bad.append("d: the write at 0 after the range healed failed: %s" % e)
flush("d (first after the heal)")
if not flush("d (second after the heal)"):
    bad.append("d: the second FLUSH after the range healed failed")

# e. The file itself.
d = open(img, "rb").read()
refused = {s for s, e in errs}
acked = [s for s in slots if s not in refused]
missing = [s for s in acked
           if d[s * B:(s + 1) * B] != (b"%06d" % s) * (B // 6) + b"\n" * (B % 6)]
if missing:
    bad.append("e: %d of %d acknowledged healthy writes are not in the file "
               "(first at offset %d)" % (len(missing), len(acked), missing[0] * B))
if d[:B] != b"Z" * B:
    bad.append("e: the write at 0 after the heal is not in the file")
h.shutdown()
if bad:
    sys.exit("\n".join(bad))
print("isolation: ok")
EOF

cat > "$tmp/bounds.py" <<'EOF'
import nbd, random, sys
uri, pid, expect = sys.argv[1], int(sys.argv[2]), sys.argv[3]
M = 1 << 20
h = nbd.NBD()
h.connect_uri(uri)
buf = nbd.Buffer.from_bytearray(bytearray(b"R" * M))
rng = random.Random(2)
failed = 0
def done(err):
    global failed
    if err.value:
        failed += 1
    return 1
for i in range(400):
    while h.aio_in_flight() >= 8:
        h.poll(-1)
    h.aio_pwrite(buf, rng.randrange(64) * M, completion=done)
while h.aio_in_flight() > 0:
    h.poll(-1)
try:
    h.flush()
    flushed = True
except nbd.Error as e:
    flushed = False
    print("FLUSH failed: %s" % e)
h.shutdown()
hwm = next(int(l.split()[1]) for l in open("/proc/%d/status" % pid)
           if l.startswith("VmHWM:"))
print("%s: 400 writes of 1 MiB, %d failed; FLUSH %s; nbdkit VmHWM %d kB"
      % (expect, failed, "succeeded" if flushed else "failed", hwm))
print("VmHWM_kB=%d" % hwm)
if expect == "healthy" and (failed or not flushed):
    sys.exit("the healthy baseline failed")
if expect == "failing" and flushed:
    sys.exit("the FLUSH succeeded although every write of the file failed")
EOF

failed=()

# 1. Isolation.
img=$tmp/iso.img
truncate -s 16M "$img"
echo fail > "$tmp/iso.ctl"
SERVER_WRAP=$(shim_wrap "$img" "$tmp/iso.ctl" 0 $((1 << 20))) \
  start_plug iso file="$img" direct=never
timeout 120 /usr/bin/python3 "$tmp/isolation.py" "$(server_uri iso)" "$img" \
        "$tmp/iso.ctl" || failed+=(isolation)
stop_server iso
echo "shim failures: $(cat "$tmp/shim-count" 2>/dev/null || echo 0)"
grep -c 'error' "$(server_log iso)" || :

# 2. Bounds: the healthy baseline, then every write failing.
for run in healthy failing; do
  img=$tmp/$run.img
  truncate -s 64M "$img"
  if [ $run = failing ]; then
    echo fail > "$tmp/$run.ctl"
    wrap=$(shim_wrap "$img" "$tmp/$run.ctl")
  else
    wrap=
  fi
  rm -f "$tmp/shim-count"
  SERVER_WRAP=$wrap start_plug $run file="$img" direct=never requeue-timeout=1s
  timeout 300 /usr/bin/python3 "$tmp/bounds.py" "$(server_uri $run)" \
          "$(server_pid $run)" $run > "$tmp/$run.out" || failed+=($run)
  cat "$tmp/$run.out"
  stop_server $run
  echo "shim failures: $(cat "$tmp/shim-count" 2>/dev/null || echo 0)"
done
hwm_ok=$(sed -n 's/^VmHWM_kB=//p' "$tmp/healthy.out")
hwm_fail=$(sed -n 's/^VmHWM_kB=//p' "$tmp/failing.out")
errors=$(grep -ci 'error' "$(server_log failing)" || :)
echo "VmHWM: healthy $hwm_ok kB, every write failing $hwm_fail kB;" \
     "error lines in the log: $errors"
grep -i 'error' "$(server_log failing)" | head -5 || :
# Under AddressSanitizer freed blocks wait in its quarantine (256 MiB)
# before they are reused, and the two runs free differently (up to 111
# MiB apart in 10 runs); 200 MiB still fails a plug that keeps its
# failed writes (311 MiB apart).
rel_mib=32
case ${PLUG_SANITIZER:-no} in address*) rel_mib=200 ;; esac
if [ -n "$hwm_ok" ] && [ -n "$hwm_fail" ]; then
  if [ "$hwm_fail" -gt $((hwm_ok + rel_mib * 1024)) ]; then
    echo "$0: failing writes took nbdkit to $hwm_fail kB, $(( (hwm_fail - hwm_ok) / 1024 )) MiB above the healthy run (bound: $rel_mib MiB)"
    failed+=(rss-relative)
  fi
  if [ -z "${PLUG_SANITIZER:-}" ] || [ "${PLUG_SANITIZER}" = no ]; then
    if [ "$hwm_fail" -gt $((100 * 1024)) ]; then
      echo "$0: failing writes took nbdkit to $hwm_fail kB (bound: 100 MiB)"
      failed+=(rss)
    fi
  fi
fi
if [ "$errors" -gt 50 ]; then
  echo "$0: $errors error lines in the log for one failing file (bound: 50)"
  failed+=(log)
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "$0: failed: ${failed[*]}"
  exit 1
fi
