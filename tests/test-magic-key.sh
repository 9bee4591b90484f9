#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-magic-key.sh - a bare path is file=, and relative paths work.
#
# nbdkit changes directory to / when it forks into the background, so
# the plugin must resolve relative paths at configuration time.  From a
# temporary working directory, nbdkit runs in the background (-U sock
# -P pidfile, forking) with a bare relative path, a file= relative path
# in a subdirectory and a relative statsfile=.  A client writes across
# the boundary between the two files; the files then hold the data, and
# the statistics appear in the working directory.
source ./functions.sh
set -e
set -x

requires nbdkit --version
requires nbdsh --version
requires python3 --version
plug_tmpdir

# The simplest form: nbdkit plug disk.img (captive, absolute).
truncate -s 1M "$tmp/disk.img"
nbdkit -U - "$PLUGIN" "$tmp/disk.img" \
       --run 'nbdsh -u "$uri" -c "assert h.get_size() == 1024 * 1024"'

mkdir "$tmp/cwd" "$tmp/cwd/sub"
cd "$tmp/cwd"
truncate -s 64K a.img
truncate -s 64K sub/b.img

nbdkit -U "$tmp/sock" -P "$tmp/pid" "$PLUGIN" \
       a.img file=sub/b.img statsfile=stats.json
# Without -f nbdkit has forked: the pid file is there when it serves.
wait_for_file "$tmp/pid"
pid=$(cat "$tmp/pid")
cleanup_fn kill "$pid"

nbdsh -u "nbd+unix:///?socket=$tmp/sock" -c '
assert h.get_size() == 128 * 1024
h.pwrite(b"\x11" * 1000 + b"\x22" * 1000, 64 * 1024 - 1000)
h.flush()
'
kill "$pid"
for ((i = 0; i < 100; ++i)); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
! kill -0 "$pid" 2>/dev/null

python3 - <<'EOF'
a = open("a.img", "rb").read()
b = open("sub/b.img", "rb").read()
assert len(a) == len(b) == 64 * 1024
assert a[-1000:] == b"\x11" * 1000 and a[:-1000] == bytes(64 * 1024 - 1000)
assert b[:1000] == b"\x22" * 1000 and b[1000:] == bytes(64 * 1024 - 1000)
EOF
# The relative statsfile= landed here, not in /.
grep '"connections": 1' stats.json
grep '"write": { "ops": 1, "bytes": 2000 }' stats.json
