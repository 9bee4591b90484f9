#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# The protocol fuzzer (fuzz/fuzz-protocol.py), a short run: 25
# connections of garbage, mutated handshakes and mutated request streams
# to the plug in writeback mode (idle= and max-delay= long,
# direct=never: the clean client's unflushed writes stay held in the
# plug through the fuzzed connections) and in hold mode, over two files
# striped at 64 KiB.  After each connection nbdkit must still run and a
# clean client must read back what it saw acknowledged, flushed or not;
# at the end nbdkit must exit cleanly (stop_server: status, sanitizer
# reports).
#
# Rude closes (the CI stage: FUZZ_PROTOCOL_GENTLE= empty): nbdkit
# 1.32.4 to 1.33.9 can abort when a connection closes while its replies
# are still being sent (raw_send_socket: Assertion 'sock >= 0', fixed
# by nbdkit commit 9d82aa4f; see test-rude-client.sh).  On those
# versions, and without --gentle only, nbdkit exiting with status 134
# and exactly that assertion is counted; then every write the clean
# client had seen acknowledged, flushed or not, must be in the files
# (the plug's rescue wrote it out), and a new nbdkit goes on from the
# next connection.  Any other exit, signal or assertion fails, and so
# does any abort with other nbdkit versions or with --gentle, the make
# check default (no connection there closes that way).
#
# Fixed seeds: a failure names the seed and iteration that replay it.
# CI runs it longer (.ci/run, by time).  FUZZ_PROTOCOL_ITERATIONS
# overrides the count; FUZZ_PROTOCOL_SECONDS=S bounds each mode's run by
# time as well (restarts included); FUZZ_PROTOCOL_SEED=N: the first
# mode's seed (the next one N + 1).
source ./functions.sh
set -e

requires_python_nbd

plug_tmpdir
n=${FUZZ_PROTOCOL_ITERATIONS:-25}
size=$((16 * 1024 * 1024))
gentle=${FUZZ_PROTOCOL_GENTLE---gentle}
secs=${FUZZ_PROTOCOL_SECONDS:-0}
fuzz=$srcdir/fuzz/fuzz-protocol.py
GONE=75                         # fuzz-protocol.py: nbdkit went away.

# nbdkit's versions with the race (the assertion came with daef505e in
# 1.32.4; 9d82aa4f fixed it in 1.33.10).
ver=$(nbdkit --version | awk '{print $2}')
racy=false
if printf '%s\n' 1.32.4 "$ver" | sort -C -V &&
   ! printf '%s\n' 1.33.10 "$ver" | sort -C -V; then
  racy=true
fi

# nbdkit NAME is gone (reaped, status in SERVER_RC) while the fuzzer
# ran: only nbdkit's known abort, alone, on a version that has it,
# without --gentle.
known_abort () {
  local name=$1 log
  log=$(server_log "$name")
  if [ "$SERVER_RC" -eq 134 ] && $racy && [ -z "$gentle" ] &&
     grep -q "raw_send_socket: Assertion .sock >= 0' failed" "$log" &&
     [ "$(grep -c 'Assertion' "$log")" -eq 1 ]; then
    return 0
  fi
  _show_server_log "$name"
  fail "$name: nbdkit $ver exited with status $SERVER_RC while fuzzed" \
       "(racy=$racy gentle='$gentle')"
}

total_aborts=0
seed=${FUZZ_PROTOCOL_SEED:-1}
for mode in writeback hold; do
  a=$tmp/$mode-a.img b=$tmp/$mode-b.img state=$tmp/$mode.state
  params=(file="$a" file="$b" stripe=64K mode=$mode)
  [ $mode = writeback ] && params+=(direct=never idle=60s max-delay=60s)
  truncate -s $((size / 2)) "$a" "$b"
  aborts=0
  while :; do
    start_plug $mode "${params[@]}"
    run_client $mode $((600 + secs)) "$fuzz" "$(server_pid $mode)" $size \
               --seed $seed --iterations "$n" --seconds "$secs" \
               --save "$tmp" --state "$state" $gentle
    [ "$CLIENT_RC" -eq $GONE ] || break
    # The fuzzer saw nbdkit exit: reap it, judge how, check the files.
    server_alive $mode && fail "$mode: the fuzzer says nbdkit exited, it runs"
    reap_exited $mode
    known_abort $mode
    aborts=$((aborts + 1))
    echo "fuzz-protocol: $mode: nbdkit $ver aborted (its known race)," \
         "abort $aborts; the plug's rescue:"
    grep -E "aborting|abort:" "$(server_log $mode)" || :
    /usr/bin/python3 "$fuzz" "$(server_sock $mode)" 0 $size \
                     --state "$state" --stripe 65536 --verify "$a" "$b" ||
      fail "$mode: acknowledged data lost in nbdkit's abort"
    mv "$(server_log $mode)" "$tmp/$mode.abort$aborts.log"
  done
  # Keep the failing connection's bytes where the log points.
  if [ "$CLIENT_RC" -ne 0 ]; then
    cp "$tmp"/protocol-*.bin . 2>/dev/null || :
  fi
  end_client $mode
  echo "fuzz-protocol: $mode: $aborts aborts of nbdkit's own, each" \
       "followed by a restart"
  total_aborts=$((total_aborts + aborts))
  seed=$((seed + 1))
done
echo "fuzz-protocol: nbdkit $ver: $total_aborts aborts of nbdkit's own in both modes"
