#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# THE RECORD end to end: model-test against one file whose writes, zeroes
# and trims fail (ENOSPC) wherever they touch 64 KiB of it
# (tests/shim-pwritev.so), with --bad-range so that it checks every
# FLUSH's answer as a client can know it: a FLUSH must fail while an
# acknowledged write to that range is lost and was not written again
# (not only the first FLUSH after the loss, and on every connection),
# and must succeed when every such write was written again (see
# check_flush_answer in model-test.c).  Reads of the rest must match, as
# in every model test.  Run with the direct path (whose writes fail to
# their client, who is told) and without it (every write acknowledged
# and lost).  Each run must have checked FLUSH answers, seen the shim
# fail calls, and counted lost writes, so that the test cannot pass on
# a run that met no failure.
# Shown able to fail: with the record reporting each loss to one FLUSH
# only (record_check forgetting what it reported), model-test prints
# "THE RECORD: ... FLUSH succeeded, but an acknowledged write to the bad
# range was lost" and the test fails.
source ./functions.sh
set -e

source "$srcdir/model-lib.sh"
test -f "$SHIM_PWRITEV" || fail "$SHIM_PWRITEV not built"

lo=$((3 << 20))
hi=$((lo + 65536))
for direct in auto never; do
  name=record-$direct
  SERVER_WRAP="env LD_PRELOAD=$SHIM_PWRITEV SHIM_PATH=$tmp/$name/f0 SHIM_FAIL_LO=$lo SHIM_FAIL_HI=$hi SHIM_COUNT=$tmp/$name.count" \
    model_run $name concat:8M writeback direct=$direct -- \
              --qd 16 --ops 1500 --seed 7 --bad-range $lo:$hi
  out=$tmp/$name/out
  checked=$(sed -n 's/^model-test: the record: \([0-9]*\) FLUSH answers checked (\([0-9]*\) had to fail, \([0-9]*\) had to succeed), \([0-9]*\) wrong$/\1 \2 \3 \4/p' "$out")
  [ -n "$checked" ] || fail "$name: no line about the record from model-test"
  read -r n must_fail must_succeed wrong <<< "$checked"
  shim=$(cat "$tmp/$name.count" 2>/dev/null || echo 0)
  lost=$(jq -r .retry.lost "$tmp/$name/stats.json")
  echo "$name: $n FLUSH answers checked ($must_fail had to fail, $must_succeed had to succeed), $wrong wrong; shim failed $shim calls; $lost writes lost"
  [ "$wrong" -eq 0 ] || fail "$name: $wrong FLUSH answers were not the truth"
  [ "$must_succeed" -gt 0 ] || fail "$name: no FLUSH had to succeed"
  [ "$shim" -gt 0 ] || fail "$name: the shim failed no call"
  if [ $direct = never ]; then
    [ "$lost" -gt 0 ] || fail "$name: no acknowledged write was lost"
    [ "$must_fail" -gt 0 ] || fail "$name: no FLUSH had to fail"
  fi
done
