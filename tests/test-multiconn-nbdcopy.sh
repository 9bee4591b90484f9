#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# nbdcopy with its default multi-conn: a 256 MiB random image
# copied into an export served by the plug and out again, byte-identical,
# in both modes; the statsfile shows that the copy in used 4 connections.
#
# nbdcopy opens --connections=N connections (default 4) when the server
# advertises multi-conn, but never more than --threads (default: the
# number of cores).  The connections are left at their default; the
# threads are set to 4 so that a machine with fewer cores still gets the
# default 4 connections (checked in nbdcopy's own --verbose output).
#
# The export is two 128 MiB files (concatenated) whose initial contents
# are not zeros, so a write that never arrives is caught.  After the copy
# in, once all 4 connections have closed (the statsfile says so: it is
# written at each close, after the connection's data is written), the
# backing files already hold the image; the copy out is compared with
# the image; the server exits 0 on SIGTERM.
source ./functions.sh
set -e

requires test -x /usr/bin/python3
requires nbdkit --version
requires nbdcopy --version
requires cmp --version
if [ ! -f "$PLUGIN" ]; then
  echo "$0: plugin $PLUGIN not built: test skipped"
  exit 77
fi

plug_tmpdir
# The images: 256 MiB each, in tmpfs when there is one.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
  img=$(mktemp -d /dev/shm/nbdplug-nbdcopy.XXXXXX)
else
  img=$(mktemp -d /tmp/nbdplug-nbdcopy.XXXXXX)
fi
cleanup_fn rm -rf "$img"

MiB=$((1024 * 1024))
SIZE=$((256 * MiB))
head -c $SIZE /dev/urandom > "$img/src"

quiet_kill ()
{
  kill -KILL "$@" 2>/dev/null || :
}

# stats_get FILE EXPR: print a value of the statsfile (a Python
# expression on st), or nothing if the file is not there yet.
stats_get ()
{
  /usr/bin/python3 -c 'import json, sys
try:
    st = json.load(open(sys.argv[1]))
except FileNotFoundError:
    sys.exit(0)
print(eval(sys.argv[2]))' "$1" "$2"
}

# wait_connections FILE N: wait (at most 60 s) until the statsfile counts
# N closed connections; fail if it ever counts more.
wait_connections ()
{
  local f=$1 n=$2 i c
  for ((i = 0; i < 600; ++i)); do
    c=$(stats_get "$f" 'st["connections"]')
    if [ -n "$c" ] && [ "$c" -gt "$n" ]; then
      echo "$0: statsfile counts $c connections, expected $n"
      return 1
    fi
    [ "$c" = "$n" ] && return 0
    sleep 0.1
  done
  echo "$0: statsfile counts ${c:-no} connections after 60 s, expected $n"
  return 1
}

# The statistics of the copy in: 4 connections (checked before), and
# the whole image written by the client (random data: nbdcopy's sparse
# detection finds no zero block).
cat > "$tmp/stats-in.py" <<'EOF'
import json, sys
st = json.load(open(sys.argv[1]))
size = int(sys.argv[2])
c, b = st["client"], st["backend"]
print("stats after the copy in: connections %d; client write %d ops %d MiB, "
      "zero %d, flush %d; backend write %d ops %d MiB; largest plug %s"
      % (st["connections"], c["write"]["ops"], c["write"]["bytes"] >> 20,
         c["zero"]["ops"], c["flush"]["ops"], b["write"]["ops"],
         b["write"]["bytes"] >> 20, st["largest_plug"]))
if c["write"]["bytes"] != size:
    sys.exit("client write bytes %d, expected %d" % (c["write"]["bytes"], size))
EOF

# run NAME MODE NBDCOPY-OPTIONS PARAMS...
run ()
{
  local name=$1 mode=$2 copts=$3 d=$tmp/$1 pid i rc=0 uri
  shift 3
  mkdir "$d"
  # Not zeros: 0xff everywhere.
  for f in a b; do
    head -c $((128 * MiB)) /dev/zero | tr '\0' '\377' > "$img/$name-$f"
  done

  echo "== $name: nbdkit plug mode=$mode $*; nbdcopy --threads=4 $copts"
  nbdkit -f -U "$d/sock" -P "$d/pid" "$PLUGIN" \
         file="$img/$name-a" file="$img/$name-b" mode="$mode" \
         stats-file="$d/stats.json" "$@" 2> "$d/server.log" &
  pid=$!
  cleanup_fn quiet_kill $pid
  wait_for_file "$d/pid" && wait_for_file "$d/sock" || {
    cat "$d/server.log"
    echo "$0: $name: nbdkit did not start"
    exit 1
  }
  uri="nbd+unix:///?socket=$d/sock"

  # Copy in: the only client so far.
  # shellcheck disable=SC2086
  nbdcopy --verbose --threads=4 $copts "$img/src" "$uri" > "$d/in.log" 2>&1 || {
    tail -20 "$d/in.log"
    echo "$0: $name: nbdcopy in failed"
    exit 1
  }
  grep '^nbdcopy: connections=' "$d/in.log"
  grep -q '^nbdcopy: connections=4 ' "$d/in.log" || {
    echo "$0: $name: nbdcopy did not use 4 connections"
    exit 1
  }
  wait_connections "$d/stats.json" 4
  /usr/bin/python3 "$tmp/stats-in.py" "$d/stats.json" $SIZE || {
    echo "$0: $name: statistics of the copy in"
    exit 1
  }
  # Every connection closed, so what it wrote is in the files.
  cat "$img/$name-a" "$img/$name-b" | cmp - "$img/src" || {
    echo "$0: $name: the backing files differ from the image after the copy in"
    exit 1
  }

  # Copy out.
  # shellcheck disable=SC2086
  nbdcopy --verbose --threads=4 $copts "$uri" "$img/out" > "$d/out.log" 2>&1 || {
    tail -20 "$d/out.log"
    echo "$0: $name: nbdcopy out failed"
    exit 1
  }
  grep '^nbdcopy: connections=' "$d/out.log"
  cmp "$img/out" "$img/src" || {
    echo "$0: $name: the copy out differs from the image"
    exit 1
  }
  rm -f "$img/out"
  wait_connections "$d/stats.json" 8

  kill -TERM $pid
  for ((i = 0; i < 600; ++i)); do
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 $pid 2>/dev/null; then
    echo "$0: $name: nbdkit still running 60 s after SIGTERM"
    exit 1
  fi
  wait $pid || rc=$?
  echo "$name: nbdkit exited with status $rc"
  if grep -E 'Sanitizer|runtime error:|error:' "$d/server.log"; then
    echo "$0: $name: errors in the server's log"
    exit 1
  fi
  [ $rc -eq 0 ] || { cat "$d/server.log"; exit 1; }
  [ "$(stats_get "$d/stats.json" 'st["connections"]')" = 8 ] || {
    echo "$0: $name: the final statsfile does not count 8 connections"
    exit 1
  }
  cat "$img/$name-a" "$img/$name-b" | cmp - "$img/src"
  rm -f "$img/$name-a" "$img/$name-b"
  echo "== $name: ok"
}

run writeback writeback ""
run hold hold ""
# Requests of 32K, smaller than direct-size=: they go through the plugs,
# and runs of different connections meet in the files' queues.
run writeback-32k writeback --request-size=32768
