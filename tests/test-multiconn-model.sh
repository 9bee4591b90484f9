#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# The model test across connections (multi-conn): 4 and 8 connections,
# writeback and hold, concat and stripe layouts, with --cross-reads (half
# of the reads target other connections' chunks, checked whenever the
# owner had no mutation in flight there during the read, so a read on
# one connection is checked against writes acknowledged on others).
# Zero mismatches, and checked cross reads > 0.
#
# Then FLUSH on one connection followed by kill -9 of the server
# (model-test --flush-one-then-wait): everything acknowledged on any
# connection before that one FLUSH is in the backing files.  In
# writeback mode with idle=10s max-delay=10s direct=never, so that the
# plugs still hold what the FLUSH must write; the same run without the
# FLUSH (--no-final-flush) must lose data, which shows that it did.
#
# Unlike model-lib.sh's model_run this starts nbdkit itself (no --run),
# so that the server's own exit status is checked; it shares model-lib's
# helper for the initial contents, the comparison with the backing files
# and the statistics.
source ./functions.sh
set -e

source "${srcdir:-.}/model-lib.sh"
requires test -x /usr/bin/python3

quiet_kill ()
{
  kill -KILL "$@" 2>/dev/null || :
}

# mc_layout NAME LAYOUT: model_layout (model-lib.sh) with the names
# this test uses: mc_dir, mc_layout, mc_files, mc_bounds, and mc_params
# (stripe= and file=).
mc_layout ()
{
  local f

  model_layout "$1" "$2"
  mc_dir=$ml_dir
  mc_layout=$ml_layout
  mc_files=("${ml_files[@]}")
  mc_bounds=("${ml_bounds[@]}")
  mc_params=("${ml_stripe[@]}")
  for f in "${mc_files[@]}"; do
    mc_params+=("file=$f")
  done
}

# mc_serve PARAMS...: nbdkit -f with the plug on $mc_dir/sock; sets
# mc_pid.  Options (starting with "-") go before the plugin.
mc_serve ()
{
  local opts=() params=()
  for a; do
    case $a in
      -*) opts+=("$a") ;;
      *) params+=("$a") ;;
    esac
  done
  nbdkit -f "${opts[@]}" -U "$mc_dir/sock" -P "$mc_dir/pid" "$PLUGIN" \
         "${mc_params[@]}" "${params[@]}" stats-file="$mc_dir/stats.json" \
         2> "$mc_dir/server.log" &
  mc_pid=$!
  cleanup_fn quiet_kill $mc_pid
  wait_for_file "$mc_dir/pid" && wait_for_file "$mc_dir/sock" || {
    cat "$mc_dir/server.log"
    echo "$0: nbdkit did not start"
    exit 1
  }
}

# mc_stop: SIGTERM the server; sets mc_status to its exit status (fails
# if it is still running 60 s later: a hung server must not hang us).
mc_stop ()
{
  local i
  mc_status=0
  kill -TERM $mc_pid
  for ((i = 0; i < 600; ++i)); do
    kill -0 $mc_pid 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 $mc_pid 2>/dev/null; then
    quiet_kill $mc_pid
    echo "$0: FAIL: nbdkit still running 60 s after SIGTERM"
    exit 1
  fi
  wait $mc_pid || mc_status=$?
}

# mc_server_log NAME: fail on sanitizer reports and errors in the log.
mc_server_log ()
{
  if grep -E 'Sanitizer|runtime error:|error:' "$mc_dir/server.log"; then
    echo "$1: FAIL: errors in the server's log"
    return 1
  fi
}

# mc_cross NAME: the run's cross reads: print them, fail unless some
# were checked.
mc_cross ()
{
  local n
  n=$(sed -n 's/^model-test: cross reads: checked=\([0-9]*\) .*/\1/p' \
          "$mc_dir/out")
  if [ -z "$n" ] || [ "$n" -eq 0 ]; then
    echo "$1: FAIL: no cross read was checked"
    return 1
  fi
  echo "$1: $n cross reads checked"
}

# mc_run NAME LAYOUT MODE CONNS [NBDKIT-ARGS...] -- MODEL-TEST-ARGS...
# model-test --cross-reads --verify-all --dump against the plug; then
# SIGTERM, exit status 0, backing files == the reference, statistics.
mc_run ()
{
  local name=$1 layout=$2 mode=$3 conns=$4 args=() rc=0 src=0
  shift 4
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  mc_layout "$name" "$layout"
  echo "== $name: plug ${mc_params[*]//$mc_dir\//} mode=$mode ${args[*]}"
  echo "   model-test --connections $conns --cross-reads $*"
  mc_serve "${args[@]}" mode="$mode"
  timeout "$MODEL_TIMEOUT" "$MODEL" --uri "nbd+unix:///?socket=$mc_dir/sock" \
          --connections "$conns" "${mc_bounds[@]}" --cross-reads \
          --init "$mc_dir/init" --dump "$mc_dir/dump" --mask "$mc_dir/mask" \
          "$@" > "$mc_dir/out" 2>&1 || rc=$?
  cat "$mc_dir/out"
  mc_stop
  src=$mc_status
  echo "$name: nbdkit exited with status $src"
  mc_server_log "$name"
  if [ $src -ne 0 ]; then
    cat "$mc_dir/server.log"
    echo "$name: FAIL: nbdkit exited with status $src"
    return 1
  fi
  if [ $rc -ne 0 ]; then
    echo "$name: FAIL: model-test exited with $rc"
    return 1
  fi
  mc_cross "$name"
  model_check compare "$mc_layout" "$mc_dir/dump" "$mc_dir/mask" \
              "${mc_files[@]}" || {
    echo "$name: FAIL: backing files differ from the reference"
    return 1
  }
  model_check stats "$mc_dir/stats.json" "$mode" "$conns" "$mc_dir/out" || {
    echo "$name: FAIL: statistics"
    return 1
  }
  rm -f "${mc_files[@]}" "$mc_dir/init" "$mc_dir/dump" "$mc_dir/mask"
  echo "== $name: ok"
}

# mc_kill NAME LAYOUT MODE CONNS EXPECT [NBDKIT-ARGS...] -- MODEL-TEST-ARGS...
# model-test --flush-one-then-wait: once it has its one FLUSH answer and
# has written the dump, kill -9 the server and compare the backing files
# with the dump.  EXPECT is "same" (they must match) or "differ" (the
# negative control: they must not).
mc_kill ()
{
  local name=$1 layout=$2 mode=$3 conns=$4 expect=$5 args=() mpid rc=0 src=0
  local same=yes
  shift 5
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  mc_layout "$name" "$layout"
  echo "== $name: plug ${mc_params[*]//$mc_dir\//} mode=$mode ${args[*]}; kill -9"
  echo "   model-test --connections $conns --cross-reads $*"
  mc_serve "${args[@]}" mode="$mode"
  timeout "$MODEL_TIMEOUT" "$MODEL" --uri "nbd+unix:///?socket=$mc_dir/sock" \
          --connections "$conns" "${mc_bounds[@]}" --cross-reads \
          --init "$mc_dir/init" --dump "$mc_dir/dump" --mask "$mc_dir/mask" \
          --flush-one-then-wait "$mc_dir/flushed" \
          "$@" > "$mc_dir/out" 2>&1 &
  mpid=$!
  cleanup_fn quiet_kill $mpid
  while [ ! -e "$mc_dir/flushed" ] && kill -0 $mpid 2>/dev/null; do
    sleep 0.1
  done
  if [ ! -e "$mc_dir/flushed" ]; then
    wait $mpid || rc=$?
    cat "$mc_dir/out"
    quiet_kill $mc_pid
    echo "$name: FAIL: model-test exited with $rc before its one FLUSH"
    return 1
  fi
  # The server must still be serving (not dead of its own accord).
  kill -0 $mc_pid || {
    echo "$name: FAIL: nbdkit died before kill -9"
    return 1
  }
  kill -KILL $mc_pid
  wait $mc_pid || src=$?
  kill -TERM $mpid
  wait $mpid || rc=$?
  cat "$mc_dir/out"
  echo "$name: nbdkit exited with status $src after kill -9, model-test $rc"
  mc_server_log "$name"
  if [ $src -ne 137 ]; then
    echo "$name: FAIL: nbdkit status $src, expected 137 (SIGKILL)"
    return 1
  fi
  grep -q '; mismatches=0 (0 bytes) .*: PASS$' "$mc_dir/out" || {
    echo "$name: FAIL: model-test"
    return 1
  }
  mc_cross "$name"
  model_check compare "$mc_layout" "$mc_dir/dump" "$mc_dir/mask" \
              "${mc_files[@]}" > "$mc_dir/compare" 2>&1 || same=no
  cat "$mc_dir/compare"
  if [ "$expect" = same ] && [ $same = no ]; then
    echo "$name: FAIL: data acknowledged before the one FLUSH is missing"
    return 1
  fi
  if [ "$expect" = differ ] && [ $same = yes ]; then
    echo "$name: FAIL: without the FLUSH nothing was lost: nothing was" \
         "held when the FLUSH came, so the run proves nothing"
    return 1
  fi
  rm -f "${mc_files[@]}" "$mc_dir/init" "$mc_dir/dump" "$mc_dir/mask"
  echo "== $name: ok ($expect)"
}

seed=10
for conns in 4 8; do
  for mode in writeback hold; do
    # File boundaries at 3M and 8M.
    mc_run mc$conns-$mode-concat concat:3M,5M,8M $mode $conns -- \
           --qd 16 --ops 1200 --seed $((++seed))
    # RAID-0, 64K stripes; direct=never: every request goes through the
    # plug.
    mc_run mc$conns-$mode-stripe stripe:64K:3:4M $mode $conns \
           direct=never -- --qd 16 --ops 1200 --seed $((++seed))
  done
done
# Small limits: many unplugs, short merges, and FUA everywhere.
mc_run mc8-wb-tight concat:3M,5M,8M writeback 8 \
       max-requests=4 max-bytes=64k max-merge=32k direct=never -- \
       --qd 16 --ops 800 --seed 91 --fua-all

# The one FLUSH, then kill -9.  Long timers: what is held stays held
# until something (the FLUSH) writes it.
long="idle=10s max-delay=10s direct=never"
# shellcheck disable=SC2086
mc_kill kill-wb-concat concat:3M,5M,8M writeback 4 same $long -- \
        --qd 16 --ops 1200 --seed 101
# shellcheck disable=SC2086
mc_kill kill-wb-stripe stripe:64K:3:4M writeback 8 same $long -- \
        --qd 16 --ops 800 --seed 102
# Hold mode answers a write once it is written, so a lone write would
# wait for idle=10s: the default timers.
mc_kill kill-hold-concat concat:3M,5M,8M hold 8 same -- \
        --qd 16 --ops 800 --seed 103
# The negative control: no FLUSH at all, and data is lost.
# shellcheck disable=SC2086
mc_kill kill-wb-noflush concat:3M,5M,8M writeback 4 differ $long -- \
        --qd 16 --ops 1200 --seed 101 --no-final-flush

# --self-test with --cross-reads corrupts one checked cross read's
# expectation: the cross check is live against the plug too.
mc_layout selftest concat:3M,5M,8M
mc_serve
rc=0
timeout "$MODEL_TIMEOUT" "$MODEL" --uri "nbd+unix:///?socket=$mc_dir/sock" \
        --connections 4 --cross-reads --self-test --init "$mc_dir/init" \
        --ops 600 --seed 7 > "$mc_dir/out" 2>&1 || rc=$?
mc_stop
src=$mc_status
mc_server_log selftest
[ $src -eq 0 ] || { echo "selftest: FAIL: nbdkit status $src"; exit 1; }
if [ $rc -eq 0 ]; then
  cat "$mc_dir/out"
  echo "selftest: FAIL: model-test --cross-reads --self-test passed"
  exit 1
fi
grep '^MISMATCH: conn 0 op #[0-9]* cross read' "$mc_dir/out"
grep -c '^MISMATCH' "$mc_dir/out" | grep -qx 1 || {
  cat "$mc_dir/out"
  echo "selftest: FAIL: expected exactly one mismatch"
  exit 1
}
echo "== selftest: ok"
