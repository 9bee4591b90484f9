#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# shellcheck disable=SC2059 # printf formats are shared variables.
# bench/run.sh: the plug against a plain nbdkit file plugin, in one run.
#
# Every scenario is measured against three captive servers:
#   base  nbdkit file FILE            (+ --filter=delay wdelay=Nms if slow)
#   wb    nbdkit plug FILE            (+ -D plug.backend_delay_us=N000)
#   hold  nbdkit plug FILE mode=hold  (+ the same)
# BENCH_REPS times each, interleaved (base, wb, hold, base, ...), and the
# table shows medians and ratios to the baseline of the same run.
#
# "Slow" scenarios put the same per-operation price on each write: the
# delay filter on each client write of the baseline (nbdkit's 16 worker
# threads pay it in parallel), the plug's debug flag on each backend
# write it makes (its loop thread dispatches a connection's runs one at
# a time).
#
# Environment: BENCH_SECONDS (2), BENCH_REPS (3), BENCH_SIZE (256M),
# BENCH_DELAY_MS (1), BENCH_QD (16), BENCH_FLUSH_EVERY (32),
# BENCH_STRACE (0; 1 adds an untimed run per server under strace -c to
# count pwrite/pwritev syscalls), BENCH_TMPDIR ($TMPDIR or /tmp),
# BENCH_SCENARIOS (space separated names to run a subset), PLUGIN,
# NBD_BENCH.  Raw client lines go to stderr.

set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

qd=$BENCH_QD
d=$BENCH_DELAY_MS
sec="--seconds $BENCH_SECONDS --qd $qd"

# name | delay ms | client arguments
scenarios=(
  "seq4k-local|0|--op write --bs 4k $sec"
  "seq4k-slow|$d|--op write --bs 4k $sec"
  "rand4k-write-local|0|--op randwrite --bs 4k $sec"
  "rand4k-write-slow|$d|--op randwrite --bs 4k $sec"
  "rand4k-read-local|0|--op randread --bs 4k $sec"
  "seq64k-local|0|--op write --bs 64k $sec"
  "small-seq-slow|$d|--op write --bs 512-4k $sec"
  "small-mixed-slow|$d|--op mixed --read-pct 30 --bs 512-4k $sec"
  "seq4k-flush$BENCH_FLUSH_EVERY-local|0|--op write --bs 4k --flush-every $BENCH_FLUSH_EVERY $sec"
)

selected ()
{
  [ -z "${BENCH_SCENARIOS:-}" ] && return 0
  case " $BENCH_SCENARIOS " in *" $1 "*) return 0 ;; esac
  return 1
}

kinds=(base wb hold)

echo "# nbdplug bench/run.sh  $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# $(uname -srm), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)," \
     "$(nbdkit --version)," \
     "git $plugin_id"
echo "# files in $BENCH_TMPDIR ($(df -PT "$tmp" | awk 'NR == 2 { print $2 }'))," \
     "size $BENCH_SIZE, QD $qd, ${BENCH_SECONDS}s x $BENCH_REPS (median)," \
     "slow = ${d} ms per backend write"
echo "# MB/s = 10^6 bytes/s including a final FLUSH;" \
     "ratio = plug / base;" \
     "o/b = client writes per backend write (merging)"
hdr="%-22s %9s %9s %6s %9s %6s %8s %8s"
printf "$hdr" scenario base wb ratio hold ratio wb:o/b hold:o/b
[ "$BENCH_STRACE" = 1 ] && printf " %8s %8s %8s" base:pw wb:pw hold:pw
printf "\n"

for s in "${scenarios[@]}"; do
  IFS='|' read -r name delay args <<<"$s"
  selected "$name" || continue
  declare -A mbps=() opsper=() pw=()
  for kind in "${kinds[@]}"; do
    mbps[$kind]=""
    opsper[$kind]=""
  done
  for ((rep = 1; rep <= BENCH_REPS; rep++)); do
    for kind in "${kinds[@]}"; do
      # shellcheck disable=SC2086
      line=$(measure "$kind" "$delay" "" $args)
      echo "$name $kind $rep: $line" >&2
      mbps[$kind]+=" $(field mbps "$line")"
      if [ "$kind" != base ]; then
        opsper[$kind]+=" $(ratio "$(field cops "$line")" \
                                 "$(field bops "$line")")"
      fi
    done
  done
  if [ "$BENCH_STRACE" = 1 ]; then
    for kind in "${kinds[@]}"; do
      # shellcheck disable=SC2086
      line=$(STRACE=1 measure "$kind" "$delay" "" $args)
      echo "$name $kind strace: $line" >&2
      # pwrite syscalls per client write: per 1000 client ops.
      pw[$kind]=$(ratio "$(field pwrites "$line")" "$(field ops "$line")")
    done
  fi

  # shellcheck disable=SC2086
  b=$(median ${mbps[base]})
  # shellcheck disable=SC2086
  w=$(median ${mbps[wb]})
  # shellcheck disable=SC2086
  h=$(median ${mbps[hold]})
  # shellcheck disable=SC2086
  printf "$hdr" "$name" "$b" "$w" "$(ratio "$w" "$b")" \
         "$h" "$(ratio "$h" "$b")" \
         "$(median ${opsper[wb]})" "$(median ${opsper[hold]})"
  [ "$BENCH_STRACE" = 1 ] &&
    printf " %8s %8s %8s" "${pw[base]}" "${pw[wb]}" "${pw[hold]}"
  printf "\n"
  unset mbps opsper pw
done
[ "$BENCH_STRACE" = 1 ] &&
  echo "# base:pw etc.: pwrite/pwritev syscalls per client op (one untimed run under strace -f -c)"
exit 0
