#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# shellcheck disable=SC2059 # printf formats are shared variables.
# bench/tune.sh: are the plug's defaults the best values?
#
# One parameter at a time around the defaults (idle=1ms, max-delay=10ms,
# max-requests=256 writeback / 15 hold, max-bytes=4M, max-merge=1M):
#   idle=          0 100us 1ms 3ms
#   max-requests=  16 64 256 1024
#   max-bytes=     1M 4M 16M
# on 4K sequential and random writes, local file and slow backend
# (BENCH_DELAY_MS per backend write), writeback and hold.  Every
# configuration, the defaults ("default", no parameter) and the
# baseline (nbdkit file) are measured BENCH_REPS times, interleaved;
# medians are shown.  A swept value equal to a default is measured
# separately from "default", which shows the noise.
#
# Environment as for run.sh; BENCH_SECONDS defaults to 1 here, and
# TUNE_SCENARIOS / TUNE_MODES (wb hold) select a subset.

set -euo pipefail
BENCH_SECONDS=${BENCH_SECONDS:-1}
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

sec="--seconds $BENCH_SECONDS --qd $BENCH_QD"
d=$BENCH_DELAY_MS
declare -A scen_delay scen_args
scen_names=()
add_scenario ()
{
  scen_names+=("$1")
  scen_delay[$1]=$2
  scen_args[$1]=$3
}
add_scenario seq4k-local 0 "--op write --bs 4k $sec"
add_scenario seq4k-slow "$d" "--op write --bs 4k $sec"
add_scenario rand4k-write-local 0 "--op randwrite --bs 4k $sec"
add_scenario rand4k-write-slow "$d" "--op randwrite --bs 4k $sec"
if [ -n "${TUNE_SCENARIOS:-}" ]; then
  # shellcheck disable=SC2206
  scen_names=($TUNE_SCENARIOS)
fi
# shellcheck disable=SC2206
modes=(${TUNE_MODES:-wb hold})

configs=(default
         idle=0 idle=100us idle=1ms idle=3ms
         max-requests=16 max-requests=64 max-requests=256 max-requests=1024
         max-bytes=1M max-bytes=4M max-bytes=16M)

echo "# nbdplug bench/tune.sh  $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# $(uname -srm), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)," \
     "$(nbdkit --version), git $plugin_id"
echo "# ${BENCH_SECONDS}s x $BENCH_REPS (median), QD $BENCH_QD, size $BENCH_SIZE," \
     "slow = ${d} ms per backend write, files in $BENCH_TMPDIR"

declare -A mb lat ob
for ((rep = 1; rep <= BENCH_REPS; rep++)); do
  for s in "${scen_names[@]}"; do
    # shellcheck disable=SC2086
    line=$(measure base "${scen_delay[$s]}" "" ${scen_args[$s]})
    echo "$s base - $rep: $line" >&2
    mb[$s|base|-]+=" $(field mbps "$line")"
    for m in "${modes[@]}"; do
      for cfg in "${configs[@]}"; do
        p=$cfg
        [ "$cfg" = default ] && p=
        # shellcheck disable=SC2086
        line=$(measure "$m" "${scen_delay[$s]}" "$p" ${scen_args[$s]})
        echo "$s $m $cfg $rep: $line" >&2
        k="$s|$m|$cfg"
        mb[$k]+=" $(field mbps "$line")"
        lat[$k]+=" $(field lat_p50_us "$line")"
        ob[$k]+=" $(ratio "$(field cops "$line")" "$(field bops "$line")")"
      done
    done
  done
done

# Report: per scenario and mode, every value of every parameter, then the
# best value of each parameter (highest median MB/s).
fmt="%-20s %-4s %-18s %9s %7s %7s %8s %8s\n"
printf "$fmt" scenario mode config MB/s vs-def vs-base ops/bop p50-us
for s in "${scen_names[@]}"; do
  # shellcheck disable=SC2086
  base=$(median ${mb[$s|base|-]})
  printf "$fmt" "$s" base "(nbdkit file)" "$base" "" "" "" ""
  for m in "${modes[@]}"; do
    # shellcheck disable=SC2086
    def=$(median ${mb[$s|$m|default]})
    declare -A best=() bestv=()
    for cfg in "${configs[@]}"; do
      k="$s|$m|$cfg"
      # shellcheck disable=SC2086
      v=$(median ${mb[$k]})
      # shellcheck disable=SC2086
      printf "$fmt" "$s" "$m" "$cfg" "$v" "$(ratio "$v" "$def")" \
             "$(ratio "$v" "$base")" "$(median ${ob[$k]})" \
             "$(median ${lat[$k]})"
      [ "$cfg" = default ] && continue
      param=${cfg%%=*}
      if [ -z "${best[$param]:-}" ] ||
           awk -v a="$v" -v b="${best[$param]}" 'BEGIN { exit !(a > b) }'; then
        best[$param]=$v
        bestv[$param]=${cfg#*=}
      fi
    done
    for param in idle max-requests max-bytes; do
      [ -n "${best[$param]:-}" ] || continue
      echo "  best $s $m $param=${bestv[$param]}" \
           "($(ratio "${best[$param]}" "$def") x default)"
    done
    unset best bestv
  done
done
