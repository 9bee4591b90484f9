#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# The protocol fuzzer (fuzz/fuzz-protocol.py), a short run: 25
# connections of garbage, mutated handshakes and mutated request streams
# to the plug in writeback and in hold mode, over two files striped at
# 64 KiB.
# After each connection nbdkit must still run and a clean client must
# read back what it flushed before; at the end nbdkit must exit cleanly
# (stop_server: status, sanitizer reports).  --gentle: nbdkit 1.32
# itself can abort when a connection closes while its replies are
# still being sent (raw_send_socket: Assertion `sock >= 0', issue 33);
# until the plug no longer triggers it, make check leaves out the
# connections that close that way (FUZZ_PROTOCOL_GENTLE= empty puts them
# back; the CI stage runs without --gentle).  Fixed seeds: a failure
# names the seed and iteration that replay it.  CI runs it longer
# (.ci/run, by time).  FUZZ_PROTOCOL_ITERATIONS overrides the count;
# FUZZ_PROTOCOL_SECONDS=S bounds each mode's run by time as well;
# FUZZ_PROTOCOL_SEED=N: the first mode's seed (the next one N + 1).
source ./functions.sh
set -e

requires_python_nbd

plug_tmpdir
n=${FUZZ_PROTOCOL_ITERATIONS:-25}
size=$((16 * 1024 * 1024))
gentle=${FUZZ_PROTOCOL_GENTLE---gentle}
secs=${FUZZ_PROTOCOL_SECONDS:-0}

seed=${FUZZ_PROTOCOL_SEED:-1}
for mode in writeback hold; do
  truncate -s $((size / 2)) "$tmp/$mode-a.img" "$tmp/$mode-b.img"
  start_plug $mode file="$tmp/$mode-a.img" file="$tmp/$mode-b.img" \
             stripe=64K mode=$mode
  run_client $mode $((600 + secs)) "$srcdir/fuzz/fuzz-protocol.py" \
             "$(server_pid $mode)" $size \
             --seed $seed --iterations "$n" --seconds "$secs" --save "$tmp" $gentle
  # Keep the failing connection's bytes where the log points.
  if [ "$CLIENT_RC" -ne 0 ]; then
    cp "$tmp"/protocol-*.bin . 2>/dev/null || :
  fi
  end_client $mode
  seed=$((seed + 1))
done
