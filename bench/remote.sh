#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# bench/remote.sh: the plug in front of an NBD server (file=nbd+unix://)
# against nbdkit's own nbd plugin proxying the same server (the "proxy"),
# and nbdkit's cache filter (cache=writeback) over that proxy, measured
# in the same run with fio's nbd engine.  Every server runs in the
# background with its exit status checked; the remote counts what
# reaches it with --filter=stats.
#
# Scenarios (REMOTE_SCENARIOS selects, space separated):
#   slow-seq-qd16   remote nbdkit memory --filter=delay delay-write=1ms
#                   (16 threads): 4 KiB sequential writes at QD16
#   serial-qd1-fsync  remote nbdkit -t 1 memory, delay-write=1ms: 4 KiB
#                   sequential writes at QD1 with a FLUSH every 64
#                   (fio --fsync=64); also the cache filter, and the plug
#                   with remote-connections=1 (the -t 1 server allows
#                   multi-conn, so by default the plug opens 4)
#   fast-randwrite, fast-randread, fast-seq   remote nbdkit memory, no
#                   delay: 4 KiB at QD16
#   null (in the first two) is nbdkit's null plugin, no server behind
#                   it: the ceiling of any nbdkit front on this machine
#   tune-randwrite-qd64  the defaults of remote-queue-depth= and
#                   remote-connections=: 4 KiB random writes at QD64,
#                   all plugged (direct=never), to the 1 ms remote
#
# The remote's memory is allocated and faulted in at its start
# (REMOTE_MEMORY, default "allocator=malloc,mlock=true"): it stands for
# a server on another machine, whose page faults are not the front's
# CPU.  With nbdkit memory's default sparse allocator each first write
# faults its pages in, and on a 2-CPU machine that took as much CPU per
# client write as the front itself (23 us against 20 us, slow-seq-qd16),
# capping the plug by the remote's CPU.  REMOTE_MEMORY= (empty) measures
# with the sparse allocator.
#
# Environment: REMOTE_SECONDS [5] per measurement, BENCH_REPS [3]
# (median shown), BENCH_TMPDIR, PLUGIN.  Raw lines go to stderr, the
# table to stdout.

bench_dir=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$bench_dir/lib.sh"

REMOTE_SECONDS=${REMOTE_SECONDS:-5}
REMOTE_MEMORY=${REMOTE_MEMORY-allocator=malloc,mlock=true}
REMOTE_SCENARIOS=${REMOTE_SCENARIOS:-"slow-seq-qd16 serial-qd1-fsync fast-randwrite fast-randread fast-seq tune-randwrite-qd64"}
command -v fio >/dev/null || die "fio not found"
fio --enghelp=nbd >/dev/null 2>&1 || die "fio has no nbd engine"

# start NAME NBDKIT-ARGS...: nbdkit -f on $tmp/NAME.sock in the background.
declare -A pid
start ()
{
  local name=$1 i
  shift
  rm -f "$tmp/$name.sock" "$tmp/$name.pid"
  nbdkit -f -P "$tmp/$name.pid" -U "$tmp/$name.sock" "$@" \
         2>>"$tmp/$name.log" &
  pid[$name]=$!
  for ((i = 0; i < 200; ++i)); do
    [ -s "$tmp/$name.pid" ] && return 0
    kill -0 "${pid[$name]}" 2>/dev/null ||
      die "$name: nbdkit $* exited: $(cat "$tmp/$name.log")"
    sleep 0.05
  done
  die "$name: no pidfile"
}

# stop NAME: SIGTERM, and the exit status must be 0.
stop ()
{
  local rc=0
  kill -TERM "${pid[$1]}"
  wait "${pid[$1]}" || rc=$?
  [ $rc -eq 0 ] || die "$1: nbdkit exited with $rc: $(cat "$tmp/$1.log")"
}

uri_of ()
{
  echo "nbd+unix:///?socket=$tmp/$1.sock"
}

# measure REMOTE-OPTS REMOTE-PARAMS FRONT FIO-ARGS...
#   REMOTE-OPTS: nbdkit options and filters for the remote (one string),
#   REMOTE-PARAMS: their parameters (after the plugin)
#   FRONT: proxy, cache, plug, plug:PARAM,PARAM, or null
# Prints "iops=N cops=N rops=N": client IOPS, client writes, and
# writes the remote received.
measure ()
{
  local ropts=$1 rparams=$2 front=$3 out=$tmp/fio.json iops cops rops rw
  shift 3
  # shellcheck disable=SC2086
  start remote $ropts --filter=stats memory 1G $REMOTE_MEMORY $rparams \
        statsfile="$tmp/rstats.txt"
  case $front in
    proxy) start front nbd uri="$(uri_of remote)" ;;
    cache) start front --filter=cache nbd uri="$(uri_of remote)" \
                 cache=writeback ;;
    plug) start front "$PLUGIN" "file=$(uri_of remote)" ;;
    # No backend at all: what any nbdkit front reaches on this machine.
    null) start front null 1G ;;
    plug:*)
      local params
      IFS=, read -r -a params <<< "${front#plug:}"
      start front "$PLUGIN" "file=$(uri_of remote)" "${params[@]}" ;;
    *) die "measure: $front" ;;
  esac
  fio --name=b --ioengine=nbd --uri="$(uri_of front)" --bs=4k \
      --size=1G --time_based --runtime="$REMOTE_SECONDS" \
      --output-format=json --output="$out" "$@" >/dev/null ||
    die "fio failed: $(cat "$out")"
  stop front
  stop remote
  case " $* " in
    *read*) rw=read ;;
    *) rw=write ;;
  esac
  iops=$(jq ".jobs[0].$rw.iops | floor" "$out")
  cops=$(jq ".jobs[0].write.total_ios" "$out")
  rops=$(awk '/^write:/ { print $2 }' "$tmp/rstats.txt")
  echo "iops=$iops cops=$cops rops=${rops:-0}"
}

declare -A scen_ropts scen_rparams scen_fronts scen_fio
scen_ropts[slow-seq-qd16]="--filter=delay"
scen_rparams[slow-seq-qd16]="delay-write=1ms"
scen_fronts[slow-seq-qd16]="proxy plug null"
scen_fio[slow-seq-qd16]="--rw=write --iodepth=16"
scen_ropts[serial-qd1-fsync]="-t 1 --filter=delay"
scen_rparams[serial-qd1-fsync]="delay-write=1ms"
scen_fronts[serial-qd1-fsync]="proxy cache plug plug:remote-connections=1 null"
scen_fio[serial-qd1-fsync]="--rw=write --iodepth=1 --fsync=64"
scen_fronts[fast-randwrite]="proxy plug"
scen_fio[fast-randwrite]="--rw=randwrite --iodepth=16"
scen_fronts[fast-randread]="proxy plug"
scen_fio[fast-randread]="--rw=randread --iodepth=16"
scen_fronts[fast-seq]="proxy plug"
scen_fio[fast-seq]="--rw=write --iodepth=16"
scen_ropts[tune-randwrite-qd64]="--filter=delay"
scen_rparams[tune-randwrite-qd64]="delay-write=1ms"
scen_fronts[tune-randwrite-qd64]="proxy plug:direct=never plug:direct=never,remote-queue-depth=16 plug:direct=never,remote-connections=1"
scen_fio[tune-randwrite-qd64]="--rw=randwrite --iodepth=64"

echo "# bench/remote.sh: $plugin_id; $(nproc) CPUs;" \
     "${REMOTE_SECONDS}s x $BENCH_REPS (median);" \
     "remote: nbdkit memory 1G ${REMOTE_MEMORY:-(sparse)}"
echo "# IOPS of fio --ioengine=nbd --bs=4k; ratio = front / proxy;" \
     "c/r = client writes per write the remote received"
printf "%-18s %-28s %9s %6s %8s\n" scenario front IOPS ratio c/r
for s in $REMOTE_SCENARIOS; do
  [ -n "${scen_fio[$s]:-}" ] || die "unknown scenario $s"
  declare -A iops=() cr=()
  for ((rep = 1; rep <= BENCH_REPS; rep++)); do
    for f in ${scen_fronts[$s]}; do
      # shellcheck disable=SC2086
      line=$(measure "${scen_ropts[$s]:-}" "${scen_rparams[$s]:-}" "$f" \
                     ${scen_fio[$s]}) || exit 1
      echo "$s $f $rep: $line" >&2
      iops[$f]+=" $(field iops "$line")"
      cr[$f]+=" $(ratio "$(field cops "$line")" "$(field rops "$line")")"
    done
  done
  # shellcheck disable=SC2086
  base=$(median ${iops[proxy]})
  for f in ${scen_fronts[$s]}; do
    # shellcheck disable=SC2086
    v=$(median ${iops[$f]})
    # shellcheck disable=SC2086
    printf "%-18s %-28s %9s %6s %8s\n" "$s" "$f" "$v" \
           "$(ratio "$v" "$base")" "$(median ${cr[$f]})"
  done
  unset iops cr
done
