#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Memory that comes back: 3 rounds of 32 connections at once in
# writeback mode, each writing 4 MiB in 256 KiB writes (16 in flight),
# FLUSHing, and reading it back (churn-client.py verifies).  After each
# round, once every connection has closed (the statsfile counts them),
# nbdkit's VmRSS must be within 8 MiB of its RSS before the first
# client, and within 4 MiB of its RSS after the first round: no growth
# from round to round.  (Without the trim at the last close, glibc's
# arenas keep what nbdkit's 512 worker threads and the plug freed: RSS
# grew 10 -> 20 -> 23 MiB over the rounds here.)
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

ROUNDS=3 CLIENTS=32 MIB=4 BS=262144
START_SLACK_KB=$((8 * 1024)) ROUND_SLACK_KB=$((4 * 1024))

img=$tmp/churn.img
truncate -s $((CLIENTS * MIB))M "$img"
start_plug churn file="$img" mode=writeback stats-file="$tmp/stats.json"

rss_kb () { awk '/^VmRSS:/ { print $2 }' "/proc/$(server_pid churn)/status"; }

start=$(rss_kb)
echo "RSS before any client: $start kB"
first=
for ((r = 1; r <= ROUNDS; ++r)); do
  rc=0
  timeout 300 /usr/bin/python3 "$abs_top_srcdir/tests/churn-client.py" \
          "$(server_uri churn)" $CLIENTS $MIB $BS $r || rc=$?
  [ $rc -eq 0 ] || { server_running churn; fail "round $r: a client failed"; }
  wait_closes "$tmp/stats.json" $((r * CLIENTS))
  rss=$(rss_kb)
  echo "RSS after round $r: $rss kB (peak so far" \
       "$(awk '/^VmHWM:/ { print $2 }' "/proc/$(server_pid churn)/status") kB)"
  [ -n "$first" ] || first=$rss
  [ "$rss" -le $((start + START_SLACK_KB)) ] ||
    fail "round $r: RSS $rss kB, more than $START_SLACK_KB kB above the" \
         "$start kB before any client"
  [ "$rss" -le $((first + ROUND_SLACK_KB)) ] ||
    fail "round $r: RSS $rss kB, more than $ROUND_SLACK_KB kB above the" \
         "$first kB after round 1 (it grows)"
done
stop_server churn
