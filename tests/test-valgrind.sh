#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# The plugin and the core run clean under valgrind memcheck: the unit
# tests of src/, then nbdkit with the plugin in both modes under a random
# model workload (reads, writes, zeros, trims, flushes, FUA, several
# connections), with EAGAIN injection so that the requeue and retry
# paths run too.  Any invalid access, use of uninitialised memory or
# definite leak fails the test: the server runs in the background under
# valgrind (start_server with SERVER_WRAP), so its exit status after
# SIGTERM is valgrind's --error-exitcode when valgrind found errors,
# and valgrind's log is checked as well.
# Shown able to fail: with request_free() not freeing the data copy,
# "valgrind found errors with mode=writeback".
source ./functions.sh
set -e
set -x

requires valgrind --version
requires nbdkit --version

vg="valgrind -q --error-exitcode=119 --leak-check=full
    --errors-for-leak-kinds=definite --show-leak-kinds=definite"

# 1. Unit tests (built by make check before this directory's tests).
units=("$abs_top_builddir"/tests/unit/test-layout
       "$abs_top_builddir"/tests/unit/test-parse
       "$abs_top_builddir"/tests/unit/test-plug
       "$abs_top_builddir"/tests/unit/test-retry
       "$abs_top_builddir"/tests/unit/test-stats)
for t in "${units[@]}"; do
  test -x "$t"
  $abs_top_builddir/libtool --mode=execute $vg "$t" >/dev/null
done

# 2. The plugin inside nbdkit.
plug_tmpdir
for args in "mode=writeback" "mode=hold" "mode=writeback stripe=64k"; do
  # model-test expects an export of zeroes at the start.
  rm -f "$tmp/a" "$tmp/b"
  if [[ $args == *stripe* ]]; then
    truncate -s 4M "$tmp/a" "$tmp/b"
  else
    truncate -s 3M "$tmp/a"
    truncate -s 5M "$tmp/b"
  fi
  rm -f "$tmp"/vg.*.log
  name=vg-${args//[ =]/-}
  # shellcheck disable=SC2086
  SERVER_WRAP="$vg --log-file=$tmp/vg.%p.log" \
    start_plug $name -D plug.inject_eagain=5 -- \
               "$tmp/a" "$tmp/b" $args stats-file="$tmp/stats.json"
  timeout 300 "$MODEL" --uri "$(server_uri $name)" --connections 2 --qd 16 \
          --ops 300 --seed 7 --verify-all
  SERVER_STOP_TIMEOUT=120 stop_server $name
  grep '"eagain": [1-9]' "$tmp/stats.json"
  cat "$tmp"/vg.*.log
  if grep -qE 'definitely lost|indirectly lost|Invalid (read|write|free)|uninitialised|Mismatched free|Syscall param|ERROR SUMMARY: [1-9]' \
       "$tmp"/vg.*.log; then
    echo "$0: valgrind found errors with $args"
    exit 1
  fi
done
