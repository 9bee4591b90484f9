#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# A stats-file= that cannot be written does not flood the log, and does
# not disturb serving.
#
# With one connection open and stats-interval=100ms, stats-file='s
# directory is renamed away.  Every report then fails; each failure is
# one line of the log (nbdkit -v): an error for the first, a debug line
# for each one after it, rate-limited (one error line a minute, with the
# count).  Once at least 10 reports have failed (counted in the log, not
# timed), at most 3 error lines name stats-file=.  The directory comes
# back: a report is written again, and one line says how many were not.
# The data the client wrote reads back, and nbdkit exits with status 0
# after writing its exit report.
#
# Then nbdplug-stat --once on files that are not reports (not JSON,
# empty, JSON of another shape, a directory) exits with status 1 and
# one line naming the file and what is wrong, never a traceback.
#
# Shown able to fail: with the rate limit of stats_file_failed_locked
# removed (every failure an error line), "10 error lines about
# stats-file= after 10 failed reports (at most 3 expected)"; with the
# failures not counted (the recovery line says 0), "the recovery line
# does not count the failed reports".
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

cat > "$tmp/client.py" <<'EOF2'
import nbd, os, plugtest, re, sys, time
uri, sd, gone, log = sys.argv[1:5]
statsfile = os.path.join(sd, "stats.json")
K = 4096
bad = []

def log_lines():
    with open(log, errors="replace") as f:
        return [l for l in f if "stats-file=" + sd in l]

def errors(lines):
    return [l for l in lines if "error:" in l]

h = nbd.NBD()
h.connect_uri(uri)
h.pwrite(b"A" * K, 0)
plugtest.stats_until(statsfile, "an interval report",
                     lambda st: st.get("written_at") == "interval")
os.rename(sd, gone)

# Keep serving while reports fail: until 10 failures are in the log
# (120 s only bounds a server that never tries).
i, end = 1, time.monotonic() + 120
while len(log_lines()) < 10:
    if time.monotonic() > end:
        sys.exit("fewer than 10 failed reports logged within 120 s: %r"
                 % log_lines())
    h.pwrite(bytes([65 + i % 26]) * K, (i % 256) * K)
    i += 1
    time.sleep(0.01)
lines = log_lines()
print("".join(lines[:5]), end="")
n = len(errors(lines))
if n > 3:
    bad.append("%d error lines about stats-file= after %d failed reports "
               "(at most 3 expected)" % (n, len(lines)))
failed = len(lines)

# The directory comes back: reports are written again.
os.rename(gone, sd)
plugtest.stats_until(statsfile, "an interval report after the failures",
                     lambda st: st.get("written_at") == "interval")
end = time.monotonic() + 120
again = []
while not again and time.monotonic() < end:
    again = [l for l in log_lines() if "written again" in l]
    time.sleep(0.01)
if not again:
    bad.append("no 'written again' line within 120 s")
else:
    print(again[0], end="")
    m = re.search(r"after (\d+) reports? that could not be written",
                  again[0])
    if not m or int(m.group(1)) < failed:
        bad.append("the recovery line does not count the failed reports "
                   "(at least %d): %r" % (failed, again[0]))

# Every block holds what was written last.
h.flush()
want = {0: b"A" * K}
for j in range(1, i):
    want[(j % 256) * K] = bytes([65 + j % 26]) * K
for off, data in sorted(want.items()):
    if h.pread(K, off) != data:
        bad.append("block at %d does not hold what was written" % off)
h.shutdown()
plugtest.verdict(bad, "failed reports logged rate-limited, serving went on")
EOF2

mkdir "$tmp/sd"
truncate -s 1M "$tmp/disk.img"
start_plug errs -v -- file="$tmp/disk.img" stats-file="$tmp/sd/stats.json" \
           stats-interval=100ms direct=never
run_client errs 600 "$tmp/client.py" "$tmp/sd" "$tmp/gone" \
           "$(server_log errs)"
end_client errs
grep -q '"written_at": "exit"' "$tmp/sd/stats.json" ||
  fail "the last report is not the exit's"
n=$(grep -c "error:.*stats-file=$tmp/sd" "$(server_log errs)" || :)
[ "$n" -le 3 ] || fail "$n error lines about stats-file= in all (at most 3)"

# nbdplug-stat --once on what is not a report.
stat_bad ()
{
  local file=$1 pattern=$2 rc=0
  /usr/bin/python3 "$abs_top_srcdir/tools/nbdplug-stat" --once "$file" \
    > "$tmp/out" 2> "$tmp/err" || rc=$?
  cat "$tmp/out" "$tmp/err"
  [ "$rc" -eq 1 ] || fail "nbdplug-stat --once $file: status $rc, not 1"
  ! grep -q Traceback "$tmp/err" ||
    fail "nbdplug-stat --once $file: a traceback"
  [ "$(wc -l < "$tmp/err")" -eq 1 ] ||
    fail "nbdplug-stat --once $file: not one line of error"
  grep -qE -- "^nbdplug-stat: $file: $pattern" "$tmp/err" ||
    fail "nbdplug-stat --once $file: error does not match '$pattern'"
}
echo 'not { json' > "$tmp/garbage"
stat_bad "$tmp/garbage" "not JSON"
: > "$tmp/empty"
stat_bad "$tmp/empty" "not JSON"
echo '[1, 2, 3]' > "$tmp/list.json"
stat_bad "$tmp/list.json" "not a stats-file= report"
echo '{"a": 1}' > "$tmp/other.json"
stat_bad "$tmp/other.json" "not a stats-file= report"
printf '\x00\xff\xfe{\x80' > "$tmp/binary"
stat_bad "$tmp/binary" "not JSON"
stat_bad "$tmp/sd" "Is a directory"
