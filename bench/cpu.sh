#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# shellcheck disable=SC2059 # printf formats are shared variables.
# bench/cpu.sh: server CPU per request and throughput, the plug against
# `nbdkit file`, in one run, on tmpfs, with fio's nbd engine.
#
# One measurement: a fresh sparse backing file in $BENCH_TMPDIR
# (/dev/shm), a background server (nbdkit -f -U SOCK -P PIDFILE ...),
# user+sys CPU of the server process from /proc/PID/stat before and
# after one fio run (--ioengine=nbd, QD $BENCH_QD, $BENCH_SECONDS s,
# --end_fsync=1 for writes: the final FLUSH is inside fio's runtime and
# inside the CPU interval), then SIGTERM.  cpu_us_per_req = (after -
# before) / fio's total_ios.  cs = the server's context switches over
# its life (getrusage of the waited-for server, all threads) / fio's
# total_ios: the thread regime a run fell into, which moves its CPU per
# request.
#
# Servers: base = nbdkit file FILE; wb = nbdkit PLUGIN FILE (writeback,
# defaults); hold = the same with mode=hold (4k sequential only);
# null = nbdkit null of the same size, which does no work at all (rows
# "-null"): what nbdkit itself costs on this machine in this run, with
# no plugin work (its ratio still moves with nbdkit's thread regime, so
# a plugin can measure below it: see "Why BENCH_RATE").
# Repetitions interleaved (base, wb[, hold], null, then the reverse order,
# ...), medians shown; ratios are taken within each repetition.
#
# Environment: BENCH_REPS (5), BENCH_SECONDS (2), BENCH_SIZE (256M),
# BENCH_QD (16), BENCH_TMPDIR (/dev/shm), BENCH_HOG (0; 1: run
# `stress-ng --cpu 1` beside the benchmark), BENCH_SCENARIOS (subset of
# the names below), BENCH_PLUG_ARGS (more plugin parameters, e.g.
# "max-inflight=1"; nbdkit options such as -D plug.FLAG=1 as one word
# go before the plugin), BENCH_RATE (fio --rate_iops: every server at
# the same request rate, below the slowest one's capacity; default none),
# PLUGIN.  Raw lines on stderr, the table on stdout.
#
# Why BENCH_RATE: unthrottled, the CPU per request of two servers on two
# CPUs depends on which regime each falls into as much as on its work.
# A server that answers faster than fio sends drains the socket, and
# nbdkit's worker threads then sleep in read() and on the connection's
# read lock, one futex sleep and wake-up after another: nbdkit null, the
# fastest server there is, makes several times the voluntary context
# switches per 4 KiB write that nbdkit file makes (the cs column).  At a
# rate both servers sustain, both wait for the client alike and the
# difference is the work per request.

set -euo pipefail
BENCH_REPS=${BENCH_REPS:-5}
BENCH_TMPDIR=${BENCH_TMPDIR:-/dev/shm}
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=server-lib.sh
. "$(dirname "$0")/server-lib.sh"
command -v fio >/dev/null || die "fio not found"

qd=$BENCH_QD
rate_args=()
[ -n "${BENCH_RATE:-}" ] && rate_args=(--rate_iops="$BENCH_RATE")
plug_opts=() plug_args=()
for a in ${BENCH_PLUG_ARGS:-}; do
  case $a in -*) plug_opts+=("$a") ;; *) plug_args+=("$a") ;; esac
done

# name | fio --rw | --bs | servers
scenarios=(
  "rand4k-write|randwrite|4k|base wb null"
  "seq4k-write|write|4k|base wb hold null"
  "seq64k-write|write|64k|base wb null"
  "rand64k-write|randwrite|64k|base wb null"
  "rand4k-read|randread|4k|base wb null"
)

selected ()
{
  [ -z "${BENCH_SCENARIOS:-}" ] && return 0
  case " $BENCH_SCENARIOS " in *" $1 "*) return 0 ;; esac
  return 1
}

# measure KIND RW BS: prints "iops=N ios=N ticks=N cpu_us=X" and, for
# the plug, "cops=N bops=N conns=N" (client / backend write ops, from
# the statsfile).
measure ()
{
  local kind=$1 rw=$2 bs=$3 file=$tmp/disk stats=$tmp/stats.json
  local -a server fioargs=()

  case $rw in
    read|randread) make_read_file; file=$read_file ;;
    *) rm -f "$file"; truncate -s "$BENCH_SIZE" "$file"
       fioargs=(--end_fsync=1) ;;
  esac
  rm -f "$stats" "$tmp/fio.json"
  case $kind in
    base) server=(file "$file") ;;
    null) server=(null "$BENCH_SIZE") ;;
    wb)   server=("${plug_opts[@]}" "$PLUGIN" "$file" "stats-file=$stats"
                  "${plug_args[@]}") ;;
    hold) server=("${plug_opts[@]}" "$PLUGIN" "$file" mode=hold
                  "stats-file=$stats" "${plug_args[@]}") ;;
  esac
  start_server "${server[@]}"
  fio_measure "$kind" "$stats" --rw="$rw" --bs="$bs" \
              --iodepth="$qd" --size="$BENCH_SIZE" "${rate_args[@]}" \
              "${fioargs[@]}"
  [ "$file" != "$read_file" ] && rm -f "$file"
  echo "$fio_result"
}

start_hog
hog="no"
[ -n "$hog_pid" ] && hog="yes (stress-ng --cpu 1, pid $hog_pid)"

echo "# nbdplug bench/cpu.sh  $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# $(uname -srm), $(nproc) CPUs, load $(load_avg), $(nbdkit --version)," \
     "$(fio --version), git $plugin_id${BENCH_PLUG_ARGS:+, plug: $BENCH_PLUG_ARGS}"
echo "# files in $BENCH_TMPDIR ($(df -PT "$tmp" | awk 'NR == 2 { print $2 }'))," \
     "size $BENCH_SIZE, QD $qd, ${BENCH_SECONDS}s x $BENCH_REPS (median)," \
     "CPU hog: $hog${BENCH_RATE:+, rate $BENCH_RATE IOPS}"
echo "# iops from fio (writes: final FLUSH inside the runtime);" \
     "us/req = server user+sys CPU / fio total_ios (medians over reps)"
echo "# ratio = plug / base: median over reps of the ratio within one rep" \
     "(adjacent runs, order reversed on even reps); us range = lowest..highest per-rep CPU ratio;" \
     "cs = the server's context switches (all threads, its whole life) per request, median;" \
     "ops/bk = fio ops / plug backend writes (statsfile), median"
hdr="%-18s %9s %9s %6s %8s %8s %6s %11s %7s %7s %9s %7s\n"
printf "$hdr" scenario base:iops plug:iops ratio base:us plug:us ratio \
       "us range" base:cs plug:cs fio-ops ops/bk

for s in "${scenarios[@]}"; do
  IFS='|' read -r name rw bs kinds <<<"$s"
  selected "$name" || continue
  declare -A iops=() cpu=() ios=() ri=() rc=() ob=() cs=()
  for ((rep = 1; rep <= BENCH_REPS; rep++)); do
    declare -A this=()
    seq=$kinds
    ((rep % 2 == 0)) && seq=$(tr ' ' '\n' <<<"$kinds" | tac | tr '\n' ' ')
    for kind in $seq; do
      line=$(measure "$kind" "$rw" "$bs")
      echo "$name $kind $rep: $line load=$(load_avg)" >&2
      this[$kind]=$line
      iops[$kind]+=" $(field iops "$line")"
      cpu[$kind]+=" $(field cpu_us "$line")"
      cs[$kind]+=" $(field cs "$line")"
      ios[$kind]+=" $(field ios "$line")"
    done
    for kind in $kinds; do
      [ "$kind" = base ] && continue
      ri[$kind]+=" $(ratio "$(field iops "${this[$kind]}")" \
                          "$(field iops "${this[base]}")")"
      rc[$kind]+=" $(ratio "$(field cpu_us "${this[$kind]}")" \
                          "$(field cpu_us "${this[base]}")")"
      is_plug "$kind" &&
        ob[$kind]+=" $(ratio "$(field ios "${this[$kind]}")" \
                            "$(field bops "${this[$kind]}")")"
    done
    unset this
  done
  for kind in $kinds; do
    [ "$kind" = base ] && continue
    row=$name
    [ "$kind" = hold ] && row="$name-hold"
    [ "$kind" = null ] && row="$name-null"
    opsbk="-"
    # shellcheck disable=SC2086
    is_plug "$kind" &&
      case $rw in *write) opsbk=$(median ${ob[$kind]}) ;; esac
    # shellcheck disable=SC2086
    range=$(printf '%s\n' ${rc[$kind]} | sort -g |
            awk 'NR == 1 { lo = $1 } { hi = $1 } END { print lo ".." hi }')
    # shellcheck disable=SC2086
    printf "$hdr" "$row" "$(median ${iops[base]})" "$(median ${iops[$kind]})" \
           "$(median ${ri[$kind]})" \
           "$(median ${cpu[base]})" "$(median ${cpu[$kind]})" \
           "$(median ${rc[$kind]})" "$range" \
           "$(median ${cs[base]})" "$(median ${cs[$kind]})" \
           "$(median ${ios[$kind]})" "$opsbk"
  done
  unset iops cpu ios ri rc ob cs
done
echo "# load at end: $(load_avg)"
exit 0
