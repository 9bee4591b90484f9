#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# bench/wakeups.sh: wake-ups per request on tmpfs, and the remote
# write targets, the plug against its peers in one interleaved run.
#
# Part 1 (tmpfs): nbdkit file and the plug (writeback, defaults) on a
# fresh sparse file in /dev/shm, fio --ioengine=nbd QD16, 4 KiB random
# and sequential writes, a fixed number of requests (WAKE_IOS) and a
# final FLUSH.  Counted by the kernel over the server's whole life,
# every thread: `perf stat -e context-switches,syscalls:sys_enter_futex`
# runs the server (perf counts inherited threads, exited ones too).
# Per request = count / fio's requests.  Counts, not times: the machine
# may be shared.
#
# Part 2 (remote): the remote is nbdkit memory 1G with the delay filter
# (delay-write=1ms, 16 threads, memory faulted in at its start as in
# bench/remote.sh); the fronts are nbdkit's nbd plugin (the proxy) and
# the plug (file=nbd+unix://, stats-file=), 4 KiB random writes and 64
# KiB sequential writes at QD16 for WAKE_SECONDS each.  Printed: IOPS,
# plug/proxy in the same repetition, and from the plug's statistics
# the client writes per remote write and bytes copied per client byte.
#
# Every server's exit status is checked.  Medians over WAKE_REPS
# repetitions, with the range (min..max) in brackets.
#
# Environment: WAKE_REPS [5], WAKE_IOS [30000], WAKE_SECONDS [4],
# WAKE_PARTS ["tmpfs remote"], PLUGIN, BENCH_PLUG_ARGS (more parameters
# for the plug, both parts).  Raw lines on stderr, tables on stdout.

set -euo pipefail
export PATH=/usr/bin:$PATH LC_ALL=C
bench_dir=$(cd "$(dirname "$0")" && pwd)
PLUGIN=${PLUGIN:-$bench_dir/../plugin/.libs/nbdkit-plug-plugin.so}
WAKE_REPS=${WAKE_REPS:-5}
WAKE_IOS=${WAKE_IOS:-30000}
WAKE_SECONDS=${WAKE_SECONDS:-4}
WAKE_PARTS=${WAKE_PARTS:-"tmpfs remote"}
read -r -a plug_args <<< "${BENCH_PLUG_ARGS:-}"

die () { echo "$0: $*" >&2; exit 1; }
for cmd in nbdkit fio jq perf; do
  command -v "$cmd" >/dev/null || die "$cmd not found"
done
[ -f "$PLUGIN" ] || die "plugin not built: $PLUGIN"

tmp=$(mktemp -d /dev/shm/nbdplug-wake.XXXXXX)
declare -A pid=()
cleanup ()
{
  local n
  for n in "${!pid[@]}"; do
    kill -TERM "${pid[$n]}" 2>/dev/null || :
    wait "${pid[$n]}" 2>/dev/null || :
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cp "$PLUGIN" "$tmp/plug.so"
id="$(git -C "$bench_dir" describe --always --dirty 2>/dev/null || echo '?')"

# start NAME WRAPPER... -- NBDKIT-ARGS: nbdkit -f on $tmp/NAME.sock in the
# background (pid[NAME] is the wrapper's, or nbdkit's), $tmp/NAME.pid.
start ()
{
  local name=$1 i wrap=()
  shift
  while [ "$1" != -- ]; do wrap+=("$1"); shift; done
  shift
  rm -f "$tmp/$name.sock" "$tmp/$name.pid"
  "${wrap[@]}" nbdkit -f -P "$tmp/$name.pid" -U "$tmp/$name.sock" "$@" \
    2>>"$tmp/$name.log" &
  pid[$name]=$!
  for ((i = 0; i < 400; ++i)); do
    [ -s "$tmp/$name.pid" ] && [ -S "$tmp/$name.sock" ] && return 0
    kill -0 "${pid[$name]}" 2>/dev/null ||
      die "$name: nbdkit $* exited: $(tail -n3 "$tmp/$name.log")"
    sleep 0.025
  done
  die "$name: no pidfile"
}

# stop NAME: SIGTERM to nbdkit, its (or its wrapper's) status must be 0.
stop ()
{
  local rc=0
  kill -TERM "$(cat "$tmp/$1.pid")"
  wait "${pid[$1]}" || rc=$?
  unset "pid[$1]"
  [ $rc -eq 0 ] || die "$1: exited with $rc: $(tail -n3 "$tmp/$1.log")"
}

uri () { echo "nbd+unix:///?socket=$tmp/$1.sock"; }

# fio_run NAME FIO-ARGS...: prints "ios iops".
fio_run ()
{
  local name=$1
  shift
  fio --name=w --ioengine=nbd --uri="$(uri "$name")" --norandommap \
      --output-format=json --output="$tmp/fio.json" "$@" >/dev/null ||
    die "fio against $name: $(cat "$tmp/fio.json")"
  jq -r '"\(.jobs[0].write.total_ios) \(.jobs[0].write.iops | floor)"' \
     "$tmp/fio.json"
}

# perf_counts FILE IOS: "cs futex" per request from perf stat -x, output.
perf_counts ()
{
  awk -F, -v n="$2" '
    $3 == "context-switches" { cs = $1 }
    $3 == "syscalls:sys_enter_futex" { fx = $1 }
    END { printf "%.3f %.3f", cs / n, fx / n }' "$1"
}

# summary [FORMAT]: the numbers on stdin as "median (min..max)".
summary ()
{
  sort -g | awk -v f="${1:-%.3g}" '{ v[NR] = $1 } END {
    if (NR == 0) { print "-"; exit }
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf f " (" f ".." f ")", m, v[1], v[NR] }'
}

raw=$tmp/raw
: >"$raw"

tmpfs_part ()
{
  local rep kind rw line ios
  for ((rep = 1; rep <= WAKE_REPS; ++rep)); do
    for rw in randwrite write; do
      for kind in file plug; do
        rm -f "$tmp/disk"
        truncate -s 256M "$tmp/disk"
        if [ $kind = file ]; then set -- file "$tmp/disk"
        else set -- "$tmp/plug.so" "$tmp/disk" "${plug_args[@]}"; fi
        start srv perf stat -x, -o "$tmp/perf.txt" \
              -e context-switches,syscalls:sys_enter_futex -- "$@"
        read -r ios _ < <(fio_run srv --rw=$rw --bs=4k --iodepth=16 \
                            --size=256M --number_ios="$WAKE_IOS" \
                            --end_fsync=1)
        stop srv
        line="tmpfs $rw $kind $rep: ios=$ios $(perf_counts "$tmp/perf.txt" "$ios")"
        echo "$line" >&2
        echo "$line" >>"$raw"
      done
    done
  done
  echo "# tmpfs, fio QD16 4 KiB, $WAKE_IOS requests x $WAKE_REPS;" \
       "per request, whole server life: median (min..max)"
  printf "%-10s %-5s %-24s %-24s\n" pattern front "context switches" "futex calls"
  for rw in randwrite write; do
    for kind in file plug; do
      printf "%-10s %-5s %-24s %-24s\n" $rw $kind \
        "$(awk -v p="$rw $kind" 'index($0, "tmpfs " p " ") == 1 { print $(NF-1) }' "$raw" | summary)" \
        "$(awk -v p="$rw $kind" 'index($0, "tmpfs " p " ") == 1 { print $NF }' "$raw" | summary)"
    done
  done
}

remote_part ()
{
  local rep s front ios iops line extra p_iops x_iops
  for ((rep = 1; rep <= WAKE_REPS; ++rep)); do
    for s in rand4k seq64k; do
      case $s in
        rand4k) set -- --rw=randwrite --bs=4k ;;
        seq64k) set -- --rw=write --bs=64k ;;
      esac
      for front in proxy plug; do
        start remote -- --filter=delay --filter=stats memory 1G \
              allocator=malloc,mlock=true delay-write=1ms \
              statsfile="$tmp/rstats.txt"
        rm -f "$tmp/pstats.json"
        if [ $front = proxy ]; then
          start front -- nbd uri="$(uri remote)"
        else
          start front -- "$tmp/plug.so" "file=$(uri remote)" \
                stats-file="$tmp/pstats.json" "${plug_args[@]}"
        fi
        read -r ios iops < <(fio_run front "$@" --iodepth=16 --size=1G \
                               --time_based --runtime="$WAKE_SECONDS" \
                               --end_fsync=1)
        stop front
        stop remote
        extra=
        if [ $front = plug ]; then
          extra=$(jq -r '"cr=\(.client.write.ops / ([.backend.write.ops, 1] | max) * 100 | floor / 100)" +
                         " copied=\((.bytes_copied // -1) / ([.client.write.bytes, 1] | max) * 1000 | floor / 1000)"' \
                     "$tmp/pstats.json")
        fi
        line="remote $s $front $rep: ios=$ios iops=$iops $extra"
        echo "$line" >&2
        echo "$line" >>"$raw"
      done
      p_iops=$(awk -v s="$s" -v r="$rep" '$2 == s && $3 == "plug" && $4 == r":" { sub("iops=", "", $6); print $6 }' "$raw")
      x_iops=$(awk -v s="$s" -v r="$rep" '$2 == s && $3 == "proxy" && $4 == r":" { sub("iops=", "", $6); print $6 }' "$raw")
      echo "ratio $s $rep: $(awk -v a="$p_iops" -v b="$x_iops" 'BEGIN { printf "%.3f", a / b }')" >>"$raw"
    done
  done
  echo "# remote nbdkit memory, delay-write=1ms; fio QD16, ${WAKE_SECONDS}s x $WAKE_REPS:" \
       "median (min..max)"
  printf "%-7s %-24s %-24s %-20s %-12s %-12s\n" pattern "proxy IOPS" "plug IOPS" \
         "plug/proxy" "c/r" "copied/byte"
  for s in rand4k seq64k; do
    printf "%-7s %-24s %-24s %-20s %-12s %-12s\n" $s \
      "$(awk -v s=$s '$1 == "remote" && $2 == s && $3 == "proxy" { sub("iops=", "", $6); print $6 }' "$raw" | summary %.0f)" \
      "$(awk -v s=$s '$1 == "remote" && $2 == s && $3 == "plug" { sub("iops=", "", $6); print $6 }' "$raw" | summary %.0f)" \
      "$(awk -v s=$s '$1 == "ratio" && $2 == s { print $4 }' "$raw" | summary)" \
      "$(awk -v s=$s '$1 == "remote" && $2 == s && $3 == "plug" { sub("cr=", "", $7); print $7 }' "$raw" | summary)" \
      "$(awk -v s=$s '$1 == "remote" && $2 == s && $3 == "plug" { sub("copied=", "", $8); print $8 }' "$raw" | summary)"
  done
}

echo "# bench/wakeups.sh: tree $id; plugin $PLUGIN built" \
     "$(date -u -r "$PLUGIN" '+%Y-%m-%d %H:%M UTC'); $(nproc) CPUs;" \
     "load $(cut -d' ' -f1-3 /proc/loadavg)"
for part in $WAKE_PARTS; do
  "${part}_part"
done
