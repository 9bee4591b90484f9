#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# bench/churn.sh: memory under connection churn.  CHURN_ROUNDS (3)
# rounds of CHURN_CLIENTS (300) connections at once, each writing
# CHURN_MIB (4) MiB in CHURN_BS (256 KiB) writes, 16 in flight, then
# FLUSH, read back and verify (tests/churn-client.py), then disconnect.
# For the plug in writeback mode and for nbdkit-file-plugin on the same
# clients it prints nbdkit's RSS before the first client, its peak
# (VmHWM) and its RSS once every connection of a round has closed
# (CHURN_SETTLE seconds after the clients exited; default 3).
#
#   bench/churn.sh                 # 300 x 3
#   CHURN_CLIENTS=32 bench/churn.sh
#   CHURN_LOAD=nbd-bench bench/churn.sh
#
# CHURN_LOAD=nbd-bench: one nbd-bench process per connection instead
# (write and FLUSH, no read back): a C client per connection keeps 16
# requests in flight where the Python threads share one interpreter, so
# it shows the peak under a heavier load.
#
# The files live in BENCH_TMPDIR (default /tmp; not a tmpfs, or its
# pages count as memory): CHURN_CLIENTS * CHURN_MIB MiB each.

export PATH=/usr/bin:$PATH      # the python3 that has the nbd module
export LC_ALL=C
set -e

bench_srcdir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top_builddir=${top_builddir:-$(cd "$bench_srcdir/.." && pwd)}
PLUGIN=${PLUGIN:-$top_builddir/plugin/.libs/nbdkit-plug-plugin.so}
CLIENT=$bench_srcdir/../tests/churn-client.py
CHURN_CLIENTS=${CHURN_CLIENTS:-300}
CHURN_ROUNDS=${CHURN_ROUNDS:-3}
CHURN_MIB=${CHURN_MIB:-4}
CHURN_BS=${CHURN_BS:-262144}
CHURN_SETTLE=${CHURN_SETTLE:-3}
BENCH_TMPDIR=${BENCH_TMPDIR:-${TMPDIR:-/tmp}}

[ -f "$PLUGIN" ] || { echo "$0: plugin not built: $PLUGIN" >&2; exit 1; }
tmp=$(mktemp -d "$BENCH_TMPDIR/nbdplug-churn.XXXXXX")
server=
cleanup () {
  [ -z "$server" ] || kill -KILL "$server" 2>/dev/null || :
  rm -rf "$tmp"
}
trap cleanup EXIT
# One binary for the whole run: others may rebuild the plugin.
cp "$PLUGIN" "$tmp/plug.so"

kb () { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }
mb () { echo "$(( ($1 + 512) / 1024 ))"; }

CHURN_LOAD=${CHURN_LOAD:-verify}
NBD_BENCH=${NBD_BENCH:-$top_builddir/bench/nbd-bench}
if [ "$CHURN_LOAD" = nbd-bench ] && [ ! -x "$NBD_BENCH" ]; then
  echo "$0: $NBD_BENCH not built (make -C bench nbd-bench)" >&2
  exit 1
fi

# load ROUND: the clients of one round, all at once.
load () {
  local c pids=() rc=0
  if [ "$CHURN_LOAD" != nbd-bench ]; then
    /usr/bin/python3 "$CLIENT" "nbd+unix:///?socket=$tmp/s.sock" \
      "$CHURN_CLIENTS" "$CHURN_MIB" "$CHURN_BS" "$1"
    return
  fi
  for ((c = 0; c < CHURN_CLIENTS; ++c)); do
    "$NBD_BENCH" --uri "nbd+unix:///?socket=$tmp/s.sock" --op write \
      --bs "$CHURN_BS" --qd 16 --ops $((CHURN_MIB * 1048576 / CHURN_BS)) \
      --offset $((c * CHURN_MIB))M --size "${CHURN_MIB}M" >/dev/null &
    pids+=($!)
  done
  for c in "${pids[@]}"; do wait "$c" || rc=1; done
  return $rc
}

# run NAME NBDKIT-ARGS...: one server, every round; prints one line.
run () {
  local name=$1 img=$tmp/churn.img line r
  shift
  rm -f "$img" "$tmp/s.sock" "$tmp/s.pid"
  truncate -s $((CHURN_CLIENTS * CHURN_MIB))M "$img"
  nbdkit -f -U "$tmp/s.sock" -P "$tmp/s.pid" "$@" file="$img" \
         >"$tmp/$name.log" 2>&1 &
  server=$!
  while [ ! -s "$tmp/s.pid" ]; do sleep 0.1; done
  line="$name: start $(mb "$(kb $server VmRSS)") MB"
  for ((r = 1; r <= CHURN_ROUNDS; ++r)); do
    load "$r" || { echo "$0: $name: round $r: a client failed" >&2; exit 1; }
    sleep "$CHURN_SETTLE"
    line+=", round $r: peak $(mb "$(kb $server VmHWM)") MB,"
    line+=" after $(mb "$(kb $server VmRSS)") MB"
  done
  echo "$line"
  kill -TERM $server
  wait $server || { echo "$0: $name: nbdkit exited with $?" >&2; exit 1; }
  server=
}

echo "churn ($CHURN_LOAD): $CHURN_ROUNDS rounds x $CHURN_CLIENTS connections," \
     "$CHURN_MIB MiB each in $CHURN_BS-byte writes, 16 in flight;" \
     "$(nbdkit --version);" \
     "plug $(git -C "$bench_srcdir" describe --always --dirty 2>/dev/null)"
run file file
run plug "$tmp/plug.so" mode=writeback
