#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# shellcheck disable=SC2059 # printf formats are shared variables.
# bench/multiconn.sh: 4 connections against 1 at the same total queue
# depth, plug writeback and nbdkit file, on tmpfs, with fio.
#
#   1 conn: fio --numjobs=1 --iodepth=16 over the whole BENCH_SIZE
#   4 conn: fio --numjobs=4 --iodepth=4, job i on its own 1/4 of the
#           file (--size=SIZE/4 --offset_increment=SIZE/4): disjoint
#           ranges; fio's nbd engine opens one connection per job.
# 4 KiB random writes (MC_RW=write for sequential), --end_fsync=1 (each
# job's final FLUSH inside its runtime).  Server CPU per request as in
# cpu.sh.  Interleaved (base/1, base/4, wb/1, wb/4, then reversed),
# medians shown.
#
# Environment: BENCH_REPS (5), BENCH_SECONDS (3), BENCH_SIZE (256M),
# BENCH_QD (16: total), MC_CONNS (4), MC_RW (randwrite), MC_BS (4k),
# BENCH_TMPDIR (/dev/shm), BENCH_HOG (0), PLUGIN.

set -euo pipefail
BENCH_REPS=${BENCH_REPS:-5}
BENCH_SECONDS=${BENCH_SECONDS:-3}
BENCH_TMPDIR=${BENCH_TMPDIR:-/dev/shm}
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=server-lib.sh
. "$(dirname "$0")/server-lib.sh"
command -v fio >/dev/null || die "fio not found"

MC_CONNS=${MC_CONNS:-4}
MC_RW=${MC_RW:-randwrite}
MC_BS=${MC_BS:-4k}
qd=$BENCH_QD
[ $((qd % MC_CONNS)) = 0 ] || die "BENCH_QD=$qd is not a multiple of MC_CONNS=$MC_CONNS"
size_bytes=$(numfmt --from=iec "$BENCH_SIZE")
part=$((size_bytes / MC_CONNS))

# measure KIND CONNS: "iops=N ios=N ticks=N cpu_us=X [cops= bops= conns=]"
measure ()
{
  local kind=$1 conns=$2 file=$tmp/disk stats=$tmp/stats.json
  local -a server jobargs

  rm -f "$file" "$stats" "$tmp/fio.json"
  truncate -s "$BENCH_SIZE" "$file"
  case $kind in
    base) server=(file "$file") ;;
    wb)   server=("$PLUGIN" "$file" "stats-file=$stats") ;;
    *) die "bad kind $kind" ;;
  esac
  if [ "$conns" = 1 ]; then
    jobargs=(--numjobs=1 --iodepth="$qd" --size="$size_bytes")
  else
    jobargs=(--numjobs="$conns" --iodepth=$((qd / conns)) --size="$part"
             --offset_increment="$part")
  fi
  start_server "${server[@]}"
  fio_measure "$kind" "$stats" --rw="$MC_RW" --bs="$MC_BS" \
              "${jobargs[@]}" --group_reporting --end_fsync=1
  rm -f "$file"
  echo "$fio_result"
}

start_hog
hog="no"
[ -n "$hog_pid" ] && hog="yes (stress-ng --cpu 1)"

echo "# nbdplug bench/multiconn.sh  $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# $(uname -srm), $(nproc) CPUs, load $(load_avg), $(nbdkit --version)," \
     "$(fio --version), git $plugin_id"
echo "# files in $BENCH_TMPDIR, size $BENCH_SIZE, $MC_RW bs=$MC_BS," \
     "total QD $qd: 1 conn x QD $qd vs $MC_CONNS conns x QD $((qd / MC_CONNS))" \
     "on disjoint ranges; ${BENCH_SECONDS}s x $BENCH_REPS (median); CPU hog: $hog"
echo "# iops from fio (group total, final FLUSHes inside the runtime);" \
     "us/req = server user+sys CPU / fio total_ios"
echo "# scale = ${MC_CONNS}-conn / 1-conn and wb/base: medians over reps of" \
     "the ratio within one rep (adjacent runs), range = lowest..highest;" \
     "order reversed on even reps"
hdr="%-6s %10s %10s %6s %11s %8s %8s %8s\n"
printf "$hdr" server iops:1c "iops:${MC_CONNS}c" scale "scale range" us:1c \
       "us:${MC_CONNS}c" "o/b:${MC_CONNS}c"

declare -A iops=() cpu=() opsbk=() scale=() vs=()
kinds="base wb"
order=()
for kind in $kinds; do
  order+=("$kind/1" "$kind/$MC_CONNS")
done
for ((rep = 1; rep <= BENCH_REPS; rep++)); do
  declare -A this=()
  seq=("${order[@]}")
  if ((rep % 2 == 0)); then
    seq=()
    for ((i = ${#order[@]} - 1; i >= 0; i--)); do seq+=("${order[i]}"); done
  fi
  for kc in "${seq[@]}"; do
    kind=${kc%/*} conns=${kc#*/}
    line=$(measure "$kind" "$conns")
    echo "$kind ${conns}c $rep: $line load=$(load_avg)" >&2
    this[$kc]=$(field iops "$line")
    iops[$kc]+=" ${this[$kc]}"
    cpu[$kc]+=" $(field cpu_us "$line")"
    is_plug "$kind" &&
      opsbk[$kc]+=" $(ratio "$(field cops "$line")" "$(field bops "$line")")"
  done
  for kind in $kinds; do
    scale[$kind]+=" $(ratio "${this[$kind/$MC_CONNS]}" "${this[$kind/1]}")"
  done
  vs[1]+=" $(ratio "${this[wb/1]}" "${this[base/1]}")"
  vs[$MC_CONNS]+=" $(ratio "${this[wb/$MC_CONNS]}" "${this[base/$MC_CONNS]}")"
  unset this
done
range ()
{
  printf '%s\n' "$@" | sort -g |
    awk 'NR == 1 { lo = $1 } { hi = $1 } END { print lo ".." hi }'
}
for kind in $kinds; do
  o="-"
  # shellcheck disable=SC2086
  is_plug "$kind" && o=$(median ${opsbk[$kind/$MC_CONNS]})
  # shellcheck disable=SC2086
  printf "$hdr" "$kind" "$(median ${iops[$kind/1]})" \
         "$(median ${iops[$kind/$MC_CONNS]})" "$(median ${scale[$kind]})" \
         "$(range ${scale[$kind]})" \
         "$(median ${cpu[$kind/1]})" "$(median ${cpu[$kind/$MC_CONNS]})" "$o"
done
# shellcheck disable=SC2086
echo "# wb / base: 1 conn $(median ${vs[1]}) ($(range ${vs[1]}))," \
     "$MC_CONNS conns $(median ${vs[$MC_CONNS]}) ($(range ${vs[$MC_CONNS]}));" \
     "target: wb scale >= 1.5"
echo "# load at end: $(load_avg)"
exit 0
