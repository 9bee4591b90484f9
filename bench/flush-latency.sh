#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# shellcheck disable=SC2059 # printf formats are shared variables.
# bench/flush-latency.sh: FLUSH latency with a sustained writer,
# the plug against nbdkit file + delay filter, in one run.
#
# Client (flush-latency.py, python3 + libnbd): 16 x 64 KiB sequential
# writes kept in flight for FLUSH_SECONDS (5), one FLUSH sent at 0.5 s
# beside them; the FLUSH's latency is issue to completion.  Variant
# "random": FLUSH_RANDOM (6) FLUSHes at random times in the same run.
#
# Servers (every backend write costs FLUSH_DELAY_MS, 100):
#   base   nbdkit file FILE --filter=delay wdelay=100ms
#   wb     nbdkit PLUGIN FILE -D plug.backend_delay_us=100000
#   wb-ds0 the same with direct-size=0: 64 KiB writes are plugged and
#          merged instead of taking the direct path (direct-size=64k by
#          default), so the FLUSH has held data to wait for.
# Runs interleaved (base, wb, wb-ds0, base, ...), medians shown.
#
# Environment: BENCH_REPS (5: single-FLUSH runs), FLUSH_RANDOM_REPS (2),
# FLUSH_RANDOM (6), FLUSH_SECONDS (5), FLUSH_DELAY_MS (100), FLUSH_BS
# (65536), FLUSH_QD (16), FLUSH_PATTERN (seq|rand), FLUSH_KINDS ("base
# wb wb-ds0"), BENCH_SIZE (256M), BENCH_TMPDIR (/dev/shm), BENCH_HOG.

set -euo pipefail
BENCH_REPS=${BENCH_REPS:-5}
BENCH_TMPDIR=${BENCH_TMPDIR:-/dev/shm}
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=server-lib.sh
. "$(dirname "$0")/server-lib.sh"

FLUSH_RANDOM_REPS=${FLUSH_RANDOM_REPS:-2}
FLUSH_RANDOM=${FLUSH_RANDOM:-6}
FLUSH_SECONDS=${FLUSH_SECONDS:-5}
FLUSH_DELAY_MS=${FLUSH_DELAY_MS:-100}
FLUSH_BS=${FLUSH_BS:-65536}
FLUSH_QD=${FLUSH_QD:-16}
FLUSH_PATTERN=${FLUSH_PATTERN:-seq}
FLUSH_KINDS=${FLUSH_KINDS:-base wb wb-ds0}
client=$bench_srcdir/flush-latency.py
python=/usr/bin/python3
"$python" -c 'import nbd' || die "$python: no nbd module (python3-libnbd)"

# measure KIND CLIENT_ARGS...: the client's output (flush lines, summary)
# plus, for the plug, "stats cops=N bops=N syncs=N".
measure ()
{
  local kind=$1 file=$tmp/disk stats=$tmp/stats.json out
  shift
  local -a server
  rm -f "$file" "$stats"
  truncate -s "$BENCH_SIZE" "$file"
  case $kind in
    base)   server=(file "$file" --filter=delay "wdelay=${FLUSH_DELAY_MS}ms") ;;
    wb)     server=(-D "plug.backend_delay_us=$((FLUSH_DELAY_MS * 1000))"
                    "$PLUGIN" "$file" "stats-file=$stats") ;;
    wb-ds0) server=(-D "plug.backend_delay_us=$((FLUSH_DELAY_MS * 1000))"
                    "$PLUGIN" "$file" "stats-file=$stats" direct-size=0) ;;
    *) die "bad kind $kind" ;;
  esac
  start_server "${server[@]}"
  out=$("$python" "$client" "$server_uri" --seconds "$FLUSH_SECONDS" \
          --qd "$FLUSH_QD" --bs "$FLUSH_BS" --pattern "$FLUSH_PATTERN" "$@") ||
    die "client failed against ${server[*]}: $out"
  stop_server
  if [ "$kind" != base ]; then
    [ -s "$stats" ] || die "no statsfile from the $kind run"
    out+=$'\n'$(jq -r '"stats cops=\(.client.write.ops)" +
                       " bops=\(.backend.write.ops)" +
                       " syncs=\(.backend.sync.ops)"' "$stats")
  fi
  rm -f "$file"
  echo "$out"
}

# median4 VALUES...: the median, 4 decimals.
median4 ()
{
  printf '%s\n' "$@" | sort -g |
    awk '{ v[NR] = $1 }
         END { if (NR == 0) print "-";
               else if (NR % 2) printf "%.4f\n", v[(NR + 1) / 2];
               else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# latencies OUTPUT: the latency= values of the flush lines.
latencies ()
{
  awk '$1 == "flush" { for (i = 2; i <= NF; i++)
                         if ($i ~ /^latency=/) print substr($i, 9) }' <<<"$1"
}

start_hog
hog="no"
[ -n "$hog_pid" ] && hog="yes (stress-ng --cpu 1)"

echo "# nbdplug bench/flush-latency.sh  $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# $(uname -srm), $(nproc) CPUs, load $(load_avg), $(nbdkit --version)," \
     "git $plugin_id"
echo "# files in $BENCH_TMPDIR, size $BENCH_SIZE; writer: $FLUSH_QD x $FLUSH_BS B" \
     "$FLUSH_PATTERN writes in flight for ${FLUSH_SECONDS}s;" \
     "every backend write costs ${FLUSH_DELAY_MS} ms; CPU hog: $hog"
echo "# single: one FLUSH at 0.5 s, $BENCH_REPS runs;" \
     "random: $FLUSH_RANDOM FLUSHes at random times per run, $FLUSH_RANDOM_REPS runs"
echo "# latency in seconds (issue to reply); ratio = kind / base (medians);" \
     "MB/s = the writer's throughput; o/b = client writes per backend write"
hdr="%-8s %-7s %7s %9s %6s %9s %8s %7s\n"
printf "$hdr" variant kind samples lat:med ratio lat:max MB/s o/b

declare -A lat=() mbps=() opsbk=()
run_variant ()
{
  local variant=$1 reps=$2 rep kind out s
  shift 2
  for kind in $FLUSH_KINDS; do
    lat[$kind]=""; mbps[$kind]=""; opsbk[$kind]=""
  done
  for ((rep = 1; rep <= reps; rep++)); do
    for kind in $FLUSH_KINDS; do
      if [ "$variant" = random ]; then
        out=$(measure "$kind" --random-flushes "$FLUSH_RANDOM" --seed "$rep")
      else
        out=$(measure "$kind" "$@")
      fi
      # shellcheck disable=SC2001
      sed "s/^/$variant $kind $rep: /" <<<"$out" >&2
      lat[$kind]+=" $(latencies "$out" | tr '\n' ' ')"
      s=$(grep '^summary ' <<<"$out")
      mbps[$kind]+=" $(field mbps "$s")"
      if [ "$kind" != base ]; then
        s=$(grep '^stats ' <<<"$out")
        opsbk[$kind]+=" $(ratio "$(field cops "$s")" "$(field bops "$s")")"
      fi
    done
  done
  local b m n mx o
  # shellcheck disable=SC2086
  b=$(median4 ${lat[base]:-})
  for kind in $FLUSH_KINDS; do
    # shellcheck disable=SC2086
    m=$(median4 ${lat[$kind]})
    # shellcheck disable=SC2086
    n=$(wc -w <<<"${lat[$kind]}")
    # shellcheck disable=SC2086
    mx=$(printf '%s\n' ${lat[$kind]} | sort -g | tail -n1)
    o="-"
    # shellcheck disable=SC2086
    [ "$kind" != base ] && o=$(median ${opsbk[$kind]})
    # shellcheck disable=SC2086
    printf "$hdr" "$variant" "$kind" "$n" "$m" \
           "$(ratio "$m" "$b")" "$mx" \
           "$(median ${mbps[$kind]})" "$o"
  done
}

run_variant single "$BENCH_REPS" --flush-at 0.5
[ "$FLUSH_RANDOM_REPS" -gt 0 ] && run_variant random "$FLUSH_RANDOM_REPS"
echo "# target: plug FLUSH latency <= max(2 x base," \
     "one backend write + one sync = ~${FLUSH_DELAY_MS} ms)"
echo "# load at end: $(load_avg)"
exit 0
