#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-magic-key.sh - a bare path is file=, and relative paths work.
#
# nbdkit changes directory to / when it forks into the background, so
# the plugin must resolve relative paths at configuration time.  From a
# temporary working directory, nbdkit runs in the background (-U sock
# -P pidfile, forking) with a bare relative path, a file= relative path
# in a subdirectory and a relative stats-file=.  A client writes across
# the boundary between the two files; the files then hold the data, and
# the statistics appear in the working directory.  The forked server is
# not our child: a python "subreaper" (prctl PR_SET_CHILD_SUBREAPER)
# starts it and inherits it when its parent exits, so that the server's
# own exit status after SIGTERM is checked all the same.
source ./functions.sh
set -e
set -x

requires nbdkit --version
requires nbdsh_sys --version
plug_tmpdir

# The simplest form: nbdkit plug disk.img (absolute path).
truncate -s 1M "$tmp/disk.img"
start_plug simple "$tmp/disk.img"
nbdsh_sys -u "$(server_uri simple)" -c "assert h.get_size() == 1024 * 1024"
stop_server simple

mkdir "$tmp/cwd" "$tmp/cwd/sub"
cd "$tmp/cwd"
truncate -s 64K a.img
truncate -s 64K sub/b.img

# reaper.py CMD...: run CMD as a subreaper; exit with the status of the
# last descendant to exit (the forked server), 128+N for signal N.
cat > "$tmp/reaper.py" <<'EOF'
import ctypes, os, sys
PR_SET_CHILD_SUBREAPER = 36
if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1) != 0:
    sys.exit("prctl(PR_SET_CHILD_SUBREAPER): %s" % os.strerror(ctypes.get_errno()))
first = os.fork()
if first == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
status = 0
while True:
    try:
        pid, st = os.wait()
    except ChildProcessError:
        break
    code = os.waitstatus_to_exitcode(st)
    code = 128 - code if code < 0 else code
    print("reaper: pid %d%s exited with %d" %
          (pid, " (the nbdkit started)" if pid == first else "", code),
          file=sys.stderr)
    if pid == first and code != 0:
        sys.exit(code)          # nbdkit failed before it forked.
    status = code
sys.exit(status)
EOF

/usr/bin/python3 "$tmp/reaper.py" nbdkit -U "$tmp/sock" -P "$tmp/pid" \
       "$PLUGIN" a.img file=sub/b.img stats-file=stats.json &
reaper=$!
cleanup_fn kill -KILL $reaper
# Without -f nbdkit has forked: the pid file is there when it serves.
wait_for_file "$tmp/pid" 60
pid=$(cat "$tmp/pid")
cleanup_fn kill -KILL "$pid"

nbdsh_sys -u "nbd+unix:///?socket=$tmp/sock" -c '
assert h.get_size() == 128 * 1024
h.pwrite(b"\x11" * 1000 + b"\x22" * 1000, 64 * 1024 - 1000)
h.flush()
'
kill "$pid"
for ((i = 0; i < 600; ++i)); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
  echo "$0: the forked nbdkit still runs 60 s after SIGTERM"
  exit 1
fi
rc=0
wait $reaper || rc=$?
if [ $rc -ne 0 ]; then
  echo "$0: the forked nbdkit exited with status $rc after SIGTERM"
  exit 1
fi

/usr/bin/python3 - <<'EOF'
a = open("a.img", "rb").read()
b = open("sub/b.img", "rb").read()
assert len(a) == len(b) == 64 * 1024
assert a[-1000:] == b"\x11" * 1000 and a[:-1000] == bytes(64 * 1024 - 1000)
assert b[:1000] == b"\x22" * 1000 and b[1000:] == bytes(64 * 1024 - 1000)
EOF
# The relative stats-file= landed here, not in /.
grep '"connections": 1' stats.json
grep '"write": { "ops": 1, "bytes": 2000 }' stats.json
