#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# bench/report.sh: the benchmark report.  Every front (the plug and its
# peers) on the same backends, in one interleaved session, with fio's
# nbd engine; writes bench/results/report.md and PNG plots, and the
# "Latest results" section of bench/README.md.
#
# Parts:
#  (a) IOPS against the remote's write latency, per workload and front,
#      with nbdkit null as the ceiling (timed, medians and min-max);
#  (b) counts per request on a tmpfs file: context switches, futex
#      calls, file write calls (perf stat over the server's whole life,
#      all threads and children), user-space instructions (callgrind);
#  (c) backend operations per client operation, counted at the remote
#      by bench/delay-us.c (same runs as (a));
#  (d) REPORT_VM=1: real clients in a guest (the kernel nbd driver with
#      ext4), counted per front: bench/vm-report.sh.  Without it, the
#      counts of an earlier run (results/raw/vm.tsv) stay in the report.
#  (e) REPORT_JOBS=1 (default but in QUICK mode): whole jobs a user would
#      time (qemu-img bench, nbdcopy, qemu-img convert of an ext4 image
#      with files) through each front to the 1 ms remote, wall time
#      including the job's own final FLUSH, and the operations the client
#      sent (counted at the front by the same filter) and those that
#      reached the remote.
#
# Environment: see README.md ("bench/report.sh").  REPORT_QUICK=1 is a
# smaller run (about 5 minutes on 2 cores, without (e)).

set -euo pipefail
export PATH=/usr/bin:/usr/sbin:/sbin:$PATH   # pyenv's python3 shadows the system one.
export LC_ALL=C

bench=$(cd "$(dirname "$0")" && pwd)
top_builddir=${top_builddir:-$(cd "$bench/.." && pwd)}
PLUGIN=${PLUGIN:-$top_builddir/plugin/.libs/nbdkit-plug-plugin.so}

if [ "${REPORT_QUICK:-0}" = 1 ]; then
  : "${REPORT_REPS:=1}" "${REPORT_SECONDS:=1}" "${REPORT_DELAYS:=0 1}"
  : "${REPORT_COUNT_IOS:=10000}" "${REPORT_INSTR_IOS:=2000}"
  : "${REPORT_INSTR_FRONTS:=file plug}"
  : "${REPORT_JOBS:=0}" "${REPORT_JOB_BENCH_COUNT:=20000}"
else
  : "${REPORT_REPS:=3}" "${REPORT_SECONDS:=2}" "${REPORT_DELAYS:=0 0.1 0.5 1 5 10}"
  : "${REPORT_COUNT_IOS:=30000}" "${REPORT_INSTR_IOS:=5000}"
  : "${REPORT_INSTR_FRONTS:=file plug plug-hold null qemu-nbd}"
  : "${REPORT_JOBS:=1}" "${REPORT_JOB_BENCH_COUNT:=100000}"
fi
# Empty is a value here (REPORT_WORKLOADS= runs no timed fio point).
: "${REPORT_WORKLOADS=seq4k rand4k seq64k flush64}"
: "${REPORT_REMOTE_FRONTS:=proxy cache plug plug-hold qemu-nbd}"
: "${REPORT_LOCAL_FRONTS:=file cache plug plug-hold qemu-nbd nbd-server}"
: "${REPORT_COUNT_WORKLOADS=seq4k rand4k}"
: "${REPORT_JOB_LIST:=qemu-bench nbdcopy-4k nbdcopy qemu-convert}"
: "${REPORT_JOB_FRONTS:=proxy cache plug null}"
: "${REPORT_JOB_DELAY:=1}" "${REPORT_JOB_REPS:=$REPORT_REPS}"
: "${REPORT_JOB_TREE:=/usr/include}"
: "${REPORT_JOB_IMAGE_SIZE:=512M}"
: "${REPORT_OUT:=$bench/results}"
: "${REPORT_TMPDIR:=/dev/shm}"
: "${REPORT_VM:=0}"
: "${REPORT_README:=1}"
SIZE=256M
NULL_SIZE=1G   # >= SIZE and REPORT_JOB_IMAGE_SIZE

die ()
{
  echo "$0: $*" >&2
  exit 1
}

"$bench/install.sh" || die "cannot install what the report needs"
[ -f "$PLUGIN" ] || die "plugin not built: $PLUGIN (run make first)"

tmp=$(mktemp -d "$REPORT_TMPDIR/nbdplug-report.XXXXXX")
front_pid=
remote_pid=
cleanup ()
{
  local p
  [ -z "${server_pid:-}" ] || kill -TERM "$server_pid" 2>/dev/null || :
  for p in $front_pid $remote_pid; do
    kill -TERM "$p" 2>/dev/null || :
    wait "$p" 2>/dev/null || :
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Measure one binary: others may rebuild the plugin while this runs.
plugin_id="$(git -C "$bench" describe --always --dirty 2>/dev/null || echo '?')"
cp "$PLUGIN" "$tmp/nbdkit-plug-plugin.so"
PLUGIN=$tmp/nbdkit-plug-plugin.so
# The statistics parameter's name (renamed once).
if nbdkit "$PLUGIN" --help 2>&1 | grep -q '^stats-file='; then
  plug_stats=stats-file
else
  plug_stats=statsfile
fi

# nbdkit 1.32's delay filter takes whole milliseconds: the remote's
# latency comes from bench/delay-us.c instead.
cc -O2 -Wall -fPIC -shared -o "$tmp/delay-us.so" "$bench/delay-us.c" ||
  die "cannot build bench/delay-us.c"

raw=$REPORT_OUT/raw
mkdir -p "$raw"
timed_tsv=$raw/timed.tsv
counts_tsv=$raw/counts.tsv
instr_tsv=$raw/instr.tsv
printf 'rep\tbackend\tworkload\tfront\tiops\tcwrites\tcflushes\tbwrites\tbflushes\tbfua\tstatus\n' >"$timed_tsv"
printf 'rep\tworkload\tfront\tios\tcs\tfutex\tpwrite\twrite\tstatus\n' >"$counts_tsv"
printf 'workload\tfront\tinstr\n' >"$instr_tsv"
jobs_tsv=$raw/jobs.tsv

# fio arguments of each workload (all writes, QD16 but flush64).
workload_args ()
{
  case $1 in
    seq4k)   echo "--rw=write --bs=4k --iodepth=16" ;;
    rand4k)  echo "--rw=randwrite --bs=4k --iodepth=16" ;;
    seq64k)  echo "--rw=write --bs=64k --iodepth=16" ;;
    flush64) echo "--rw=write --bs=4k --iodepth=1 --fsync=64" ;;
    *) die "unknown workload $1" ;;
  esac
}

# listening SOCKET: the socket accepts connections (probed without
# connecting: nbd-server -d serves one connection only).
listening ()
{
  awk -v p="$1" '$NF == p && $4 == "00010000" { f = 1 } END { exit !f }' \
    /proc/net/unix
}

wait_listening ()
{
  local sock=$1 pid=$2 i
  for ((i = 0; i < 400; i++)); do
    listening "$sock" && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.025
  done
  return 1
}

# start_remote DELAY_MS: nbdkit memory behind the write delay, which
# also counts what the front sends (bench/delay-us.c).
start_remote ()
{
  local us
  us=$(awk -v d="$1" 'BEGIN { printf "%d", d * 1000 }')
  rm -f "$tmp/remote.sock" "$tmp/remote.counts"
  nbdkit -f -U "$tmp/remote.sock" --filter="$tmp/delay-us.so" \
    memory 1G "write-us=$us" counts="$tmp/remote.counts" \
    >>"$tmp/remote.log" 2>&1 &
  remote_pid=$!
  wait_listening "$tmp/remote.sock" "$remote_pid" ||
    die "remote did not start: $(tail -n3 "$tmp/remote.log")"
}

# stop_remote: sets remote_counts to "WRITES FLUSHES FUA" counted at
# the remote (FUA: writes and zeroes with the flag).  Not in a $(...): the remote is this shell's child.
stop_remote ()
{
  local rc=0 w fua f
  kill -TERM "$remote_pid"
  wait "$remote_pid" || rc=$?
  remote_pid=
  [ "$rc" = 0 ] || die "remote exited with status $rc: $(tail -n3 "$tmp/remote.log")"
  read -r _ w _ fua _ f _ <"$tmp/remote.counts" ||
    die "no counts from the remote"
  remote_counts="$w $f $fua"
}

# front_cmd FRONT BACKEND: the server command, in the array cmd.
# BACKEND is "remote" (the socket of start_remote) or "tmpfs" (a fresh
# file).  Every front listens on $tmp/front.sock; nbdkit and qemu-nbd
# write their PID to $tmp/front.pid.
front_cmd ()
{
  local front=$1 backend=$2 target uri
  local -a nbdkit_=(nbdkit -f -U "$tmp/front.sock" -P "$tmp/front.pid")
  # count_client=1: the counting filter outermost, at no delay, counts
  # what the client sends (nbdkit fronts only).
  [ "${count_client:-0}" = 1 ] && nbdkit_+=(--filter="$tmp/delay-us.so")
  uri="nbd+unix:///?socket=$tmp/remote.sock"
  if [ "$backend" = tmpfs ]; then
    target=$tmp/disk.img
    rm -f "$target"
    truncate -s "$SIZE" "$target"
  else
    target=$uri
  fi
  case $front/$backend in
    proxy/remote) cmd=("${nbdkit_[@]}" nbd "uri=$uri") ;;
    cache/remote) cmd=("${nbdkit_[@]}" --filter=cache nbd "uri=$uri" cache=writeback) ;;
    file/tmpfs)   cmd=("${nbdkit_[@]}" file "$target") ;;
    cache/tmpfs)  cmd=("${nbdkit_[@]}" --filter=cache file "$target" cache=writeback) ;;
    plug/*)       cmd=("${nbdkit_[@]}" "$PLUGIN" "file=$target" "$plug_stats=$tmp/plug.json"
                       ${REPORT_PLUG_ARGS:-}) ;;
    plug-hold/*)  cmd=("${nbdkit_[@]}" "$PLUGIN" "file=$target" mode=hold "$plug_stats=$tmp/plug.json") ;;
    null/*)       cmd=("${nbdkit_[@]}" null "$NULL_SIZE") ;;
    qemu-nbd/*)   cmd=(qemu-nbd -t -k "$tmp/front.sock" --pid-file="$tmp/front.pid"
                       -f raw --cache=writeback "$target") ;;
    nbd-server/tmpfs)
      # A daemon (its -d serves one connection, and fio makes two).
      printf '[generic]\nunixsock = %s\n[disk]\nexportname = %s\nflush = true\nfua = true\n' \
        "$tmp/front.sock" "$target" >"$tmp/nbd-server.conf"
      cmd=(nbd-server -C "$tmp/nbd-server.conf" -p "$tmp/front.pid") ;;
    *) die "front $front cannot serve a $backend backend" ;;
  esac
  if [ "${count_client:-0}" = 1 ]; then
    [ "${cmd[0]}" = nbdkit ] || die "count_client=1: $front is not nbdkit"
    cmd+=(write-us=0 counts="$tmp/client.counts")
  fi
}

front_uri ()
{
  case $1 in
    nbd-server) echo "nbd+unix:///disk?socket=$tmp/front.sock" ;;
    *) echo "nbd+unix:///?socket=$tmp/front.sock" ;;
  esac
}

# start_front FRONT BACKEND [WRAPPER...]: run the server (under WRAPPER,
# e.g. valgrind) in the background until its socket listens.  Sets
# front_pid to the process to wait for and server_pid to the server's
# own (nbd-server daemonizes: then front_pid is empty).
start_front ()
{
  local front=$1 backend=$2 i
  shift 2
  front_cmd "$front" "$backend"
  rm -f "$tmp/front.sock" "$tmp/front.pid" "$tmp/plug.json"
  "$@" "${cmd[@]}" >>"$tmp/front.log" 2>&1 &
  front_pid=$!
  if [ "$front" = nbd-server ]; then
    wait "$front_pid" || die "nbd-server did not start: $(tail -n3 "$tmp/front.log")"
    front_pid=
  fi
  # The PID file is written after the fork (nbdkit -P, qemu-nbd).
  for ((i = 0; i < 400; i++)); do
    [ -s "$tmp/front.pid" ] && listening "$tmp/front.sock" && break
    [ -z "$front_pid" ] || kill -0 "$front_pid" 2>/dev/null ||
      die "$front exited at start: ${cmd[*]}: $(tail -n3 "$tmp/front.log")"
    sleep 0.025
  done
  [ -s "$tmp/front.pid" ] && listening "$tmp/front.sock" ||
    die "$front did not start: ${cmd[*]}"
  server_pid=$(cat "$tmp/front.pid")
}

# stop_front FRONT: SIGTERM, wait; sets front_rc to the exit status,
# which the tables report ("-" for the nbd-server daemon, which is not
# this shell's child).  Not in a $(...): the front is this shell's child.
stop_front ()
{
  local front=$1 rc=0 i
  # A front that died during its run (its status tells how) is
  # reported with that status, not taken for a failure of the report.
  kill -TERM "$server_pid" 2>/dev/null ||
    echo "WARNING: $front ($server_pid) had exited before its stop" >&2
  if [ -n "$front_pid" ]; then
    wait "$front_pid" || rc=$?
    front_pid=
  else
    for ((i = 0; i < 400; i++)); do
      kill -0 "$server_pid" 2>/dev/null || break
      sleep 0.025
    done
    kill -0 "$server_pid" 2>/dev/null && die "$front ($server_pid) did not exit"
    rc=-
  fi
  server_pid=
  [ "$rc" = 0 ] || [ "$rc" = - ] ||
    echo "WARNING: $front exited with status $rc: $(tail -n3 "$tmp/front.log")" >&2
  front_rc=$rc
}

# run_fio FRONT WORKLOAD FIO-ARGS...: fio against the front; prints
# "IOPS WRITES FLUSHES" (flushes include fio's final one, end_fsync).
run_fio ()
{
  local front=$1 workload=$2 a
  shift 2
  read -r -a a <<<"$(workload_args "$workload")"
  fio --name=report --ioengine=nbd --uri="$(front_uri "$front")" \
      --size="$SIZE" --norandommap --end_fsync=1 "${a[@]}" "$@" \
      --output-format=json --output="$tmp/fio.json" >>"$tmp/fio.log" 2>&1 ||
    die "fio failed against $front: $(tail -n3 "$tmp/fio.log")"
  jq -r '"\([.jobs[].write.iops] | add | floor)" +
         " \([.jobs[].write.total_ios] | add)" +
         " \(([.jobs[].sync.total_ios] | add) + 1)"' "$tmp/fio.json"
}

# plug_backend: "WRITES SYNCS" from the plug's statistics.
plug_backend ()
{
  jq -r '"\(.backend.write.ops) \(.backend.sync.ops)"' "$tmp/plug.json"
}

# timed_point REP BACKEND WORKLOAD FRONT: one timed measurement, one
# line of timed.tsv.  BACKEND is a delay in ms, "tmpfs" or "none".
timed_point ()
{
  local rep=$1 backend=$2 workload=$3 front=$4 kind=remote
  local iops cw cf bw=- bf=- bfua=- rc
  case $backend in tmpfs) kind=tmpfs ;; none) kind=none ;; esac
  [ "$kind" = remote ] && start_remote "$backend"
  start_front "$front" "$kind"
  read -r iops cw cf < <(run_fio "$front" "$workload" \
                          --time_based --runtime="$REPORT_SECONDS")
  stop_front "$front"
  rc=$front_rc
  if [ "$kind" = remote ]; then
    stop_remote
    read -r bw bf bfua <<<"$remote_counts"
  elif [ "$front" = plug ] || [ "$front" = plug-hold ]; then
    read -r bw bf < <(plug_backend)
  elif [ "$front" = file ]; then
    bw=$cw       # nbdkit file: one pwrite per write, one fdatasync per FLUSH
    bf=$cf
    bfua=0
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$rep" "$backend" \
    "$workload" "$front" "$iops" "$cw" "$cf" "$bw" "$bf" "$bfua" "$rc" >>"$timed_tsv"
  echo "rep $rep  $backend  $workload  $front: $iops IOPS, backend $bw writes $bf flushes for $cw, $cf" >&2
}

# rotate N WORDS...: WORDS rotated left by N, so that no front always
# runs first in a round.
rotate ()
{
  local n=$1
  shift
  local -a w=("$@")
  n=$((n % ${#w[@]}))
  echo "${w[@]:n}" "${w[@]:0:n}"
}

perf_events=context-switches,syscalls:sys_enter_futex,syscalls:sys_enter_pwrite64
perf_events+=,syscalls:sys_enter_pwritev,syscalls:sys_enter_pwritev2,syscalls:sys_enter_write

# count_point REP WORKLOAD FRONT: REPORT_COUNT_IOS requests on tmpfs,
# the server's threads and children counted by perf stat from when it
# listens to its exit.
count_point ()
{
  local rep=$1 workload=$2 front=$3 rc ios perf_pid
  start_front "$front" tmpfs
  perf stat -x, -o "$tmp/perf.txt" -e "$perf_events" -p "$server_pid" \
    >>"$tmp/perf.log" 2>&1 &
  perf_pid=$!
  sleep 0.2     # perf attaches
  read -r _ ios _ < <(run_fio "$front" "$workload" --number_ios="$REPORT_COUNT_IOS")
  stop_front "$front"
  rc=$front_rc
  kill -INT "$perf_pid" 2>/dev/null || :
  wait "$perf_pid" || :
  awk -F, -v rep="$rep" -v w="$workload" -v f="$front" -v ios="$ios" -v rc="$rc" '
    { v[$3] = $1 }
    END { p = v["syscalls:sys_enter_pwrite64"] + v["syscalls:sys_enter_pwritev"]
          p += v["syscalls:sys_enter_pwritev2"]
          printf "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", rep, w, f, ios,
            v["context-switches"], v["syscalls:sys_enter_futex"], p,
            v["syscalls:sys_enter_write"], rc }' \
    "$tmp/perf.txt" >>"$counts_tsv"
  echo "rep $rep  counts  $workload  $front: $(tail -n1 "$counts_tsv")" >&2
}

# instr_count FRONT WORKLOAD IOS: the server's user-space instructions
# over IOS requests (callgrind's program total, all threads).
instr_count ()
{
  local front=$1 workload=$2 ios=$3
  start_front "$front" tmpfs valgrind -q --tool=callgrind \
    --callgrind-out-file="$tmp/callgrind.out" --trace-children=no
  run_fio "$front" "$workload" --number_ios="$ios" >/dev/null
  stop_front "$front"
  [ "$front_rc" = 0 ] || die "$front exited with status $front_rc under callgrind"
  callgrind_annotate "$tmp/callgrind.out" 2>/dev/null |
    awk '/PROGRAM TOTALS/ && !n++ { gsub(",", "", $1); print $1 }'
}

# instr_point FRONT WORKLOAD: instructions per request, (count(2N) -
# count(N)) / N, free of start and exit (as bench/instr.sh).
instr_point ()
{
  local front=$1 workload=$2 n=$REPORT_INSTR_IOS a b
  a=$(instr_count "$front" "$workload" "$n")
  b=$(instr_count "$front" "$workload" $((2 * n)))
  printf '%s\t%s\t%s\n' "$workload" "$front" \
    "$(awk -v a="$a" -v b="$b" -v n="$n" 'BEGIN { printf "%.0f", (b - a) / n }')" \
    >>"$instr_tsv"
  echo "instructions $workload $front: $(tail -n1 "$instr_tsv")" >&2
}

# make_job_image: an ext4 image of REPORT_JOB_IMAGE_SIZE holding
# REPORT_JOB_TREE (mke2fs -d: no mount, no root needed), the source of
# the copy jobs; made once per run.
make_job_image ()
{
  job_image=$tmp/job-src.img
  [ -f "$job_image" ] && return 0
  mke2fs -q -F -t ext4 -d "$REPORT_JOB_TREE" "$job_image" "$REPORT_JOB_IMAGE_SIZE" \
    >>"$tmp/mke2fs.log" 2>&1 ||
    die "cannot make the job image from $REPORT_JOB_TREE: $(tail -n3 "$tmp/mke2fs.log")"
}

# job_cmd JOB URI: the client command of JOB, in the array cmd.
job_cmd ()
{
  local job=$1 uri=$2
  case $job in
    qemu-bench)   cmd=(qemu-img bench -w -t none -s 4k -d 16 -f raw
                       -c "$REPORT_JOB_BENCH_COUNT" "$uri") ;;
    nbdcopy-4k)   cmd=(nbdcopy --flush --request-size=4096 --connections=1
                       "$job_image" "$uri") ;;
    nbdcopy)      cmd=(nbdcopy --flush "$job_image" "$uri") ;;
    qemu-convert) cmd=(qemu-img convert -n -f raw -O raw "$job_image" "$uri") ;;
    *) die "unknown job $job" ;;
  esac
}

# counts_of FILE: "WRITES ZEROES FLUSHES FUA TRIMS" from a counts= file
# of bench/delay-us.c.
counts_of ()
{
  local w z f fua t
  read -r _ w _ fua _ f _ z _ t <"$1" || die "no counts in $1"
  echo "$w $z $f $fua $t"
}

# plug_job_stats: the plug's statistics that say where a job's requests
# went (printed to the log, for diagnosis).
plug_job_stats ()
{
  jq -c '{direct, bytes_copied, client_bytes: .client.write.bytes,
          bwrites: .backend.write.ops, bzeroes: .backend.zero.ops,
          bsyncs: .backend.sync.ops, unplugs, largest_plug}' \
    "$tmp/plug.json" 2>/dev/null || echo '{}'
}

# job_point REP JOB FRONT: one timed job through FRONT to the remote of
# REPORT_JOB_DELAY ms, one line of jobs.tsv.  The front counts what the
# client sends (count_client), the remote what reaches it.
job_point ()
{
  local rep=$1 job=$2 front=$3 t0 t1 secs rc jrc=0 c b="- - - - -"
  start_remote "$REPORT_JOB_DELAY"
  rm -f "$tmp/client.counts"
  count_client=1 start_front "$front" remote
  job_cmd "$job" "$(front_uri "$front")"
  t0=$(date +%s.%N)
  "${cmd[@]}" >>"$tmp/job.log" 2>&1 || jrc=$?
  t1=$(date +%s.%N)
  stop_front "$front"
  rc=$front_rc
  [ "$jrc" = 0 ] || rc="job:$jrc"
  stop_remote
  c=$(counts_of "$tmp/client.counts")
  [ "$front" = null ] || b=$(counts_of "$tmp/remote.counts")
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$rep" "$job" "$front" "$secs" \
    "${c// /$'\t'}" "${b// /$'\t'}" "$rc" >>"$jobs_tsv"
  echo "rep $rep  job $job  $front: $secs s, client $c, remote $b (w z f fua t)" \
       "$([ "$front" = plug ] && plug_job_stats)" >&2
}

# main: the run.  A function, so that bash has read all of it before it
# starts: editing or checking out this file during a run cannot change
# what the run does.
main ()
{
  started=$(date -u '+%Y-%m-%d %H:%M UTC')
  t0=$SECONDS
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  read -r -a delays <<<"$REPORT_DELAYS"
  read -r -a workloads <<<"$REPORT_WORKLOADS"
  read -r -a rfronts <<<"$REPORT_REMOTE_FRONTS"
  read -r -a lfronts <<<"$REPORT_LOCAL_FRONTS"
  read -r -a cworkloads <<<"$REPORT_COUNT_WORKLOADS"

  # (a), (c): rounds over every front; each repetition visits every point
  # once, so drift on the machine spreads over all fronts.
  for ((rep = 1; rep <= REPORT_REPS; rep++)); do
    for w in "${workloads[@]}"; do
      timed_point "$rep" none "$w" null
      for d in "${delays[@]}"; do
        for f in $(rotate "$rep" "${rfronts[@]}"); do
          timed_point "$rep" "$d" "$w" "$f"
        done
      done
      for f in $(rotate "$rep" "${lfronts[@]}"); do
        timed_point "$rep" tmpfs "$w" "$f"
      done
    done
    # (b): counts, interleaved with the timed rounds.
    for w in "${cworkloads[@]}"; do
      for f in $(rotate "$rep" "${lfronts[@]}" null); do
        count_point "$rep" "$w" "$f"
      done
    done
  done

  # (b): instructions, deterministic: once.
  for w in "${cworkloads[@]}"; do
    for f in $REPORT_INSTR_FRONTS; do
      instr_point "$f" "$w"
    done
  done

  # (e): whole jobs, interleaved rounds over the fronts.
  if [ "$REPORT_JOBS" = 1 ]; then
    read -r -a jobs <<<"$REPORT_JOB_LIST"
    read -r -a jfronts <<<"$REPORT_JOB_FRONTS"
    make_job_image
    printf 'rep\tjob\tfront\tseconds\tcwrites\tczeroes\tcflushes\tcfua\tctrims\tbwrites\tbzeroes\tbflushes\tbfua\tbtrims\tstatus\n' >"$jobs_tsv"
    for ((rep = 1; rep <= REPORT_JOB_REPS; rep++)); do
      for j in "${jobs[@]}"; do
        for f in $(rotate "$rep" "${jfronts[@]}"); do
          job_point "$rep" "$j" "$f"
        done
      done
    done
  fi

  # (d): real clients in a guest, counted; once, after the timed parts.
  if [ "$REPORT_VM" = 1 ]; then
    PLUGIN=$PLUGIN "$bench/vm-report.sh" "$raw/vm.tsv" ||
      die "part (d) failed: bench/vm-report.sh"
  fi

  elapsed=$((SECONDS - t0))
  {
    echo "started='$started'"
    echo "elapsed=$elapsed"
    echo "plugin_id='$plugin_id'"
    echo "nbdkit='$(nbdkit --version)'"
    echo "qemu='$(qemu-nbd --version | head -n1)'"
    echo "nbd_server='$(nbd-server -V 2>&1 | sed -n 's/.*version /nbd-server /p' | head -n1)'"
    echo "fio='$(fio --version)'"
    echo "cpus=$(nproc)"
    echo "load_start='$load0'"
    echo "load_end='$(cut -d' ' -f1-3 /proc/loadavg)'"
    echo "reps=$REPORT_REPS"
    echo "seconds=$REPORT_SECONDS"
    echo "count_ios=$REPORT_COUNT_IOS"
    echo "instr_ios=$REPORT_INSTR_IOS"
    echo "quick=${REPORT_QUICK:-0}"
    echo "jobs=$REPORT_JOBS"
    echo "job_delay=$REPORT_JOB_DELAY"
    echo "jobs_reps=$REPORT_JOB_REPS"
    echo "job_bench_count=$REPORT_JOB_BENCH_COUNT"
    echo "job_tree='$REPORT_JOB_TREE'"
    echo "job_image_size=$REPORT_JOB_IMAGE_SIZE"
    echo "job_image_used='$( [ "$REPORT_JOBS" = 1 ] && du -h "$job_image" | cut -f1)'"
    echo "plug_args='${REPORT_PLUG_ARGS:-}'"
  } >"$raw/meta.env"

  /usr/bin/python3 "$bench/report.py" "$REPORT_OUT" || die "report.py failed"
  if [ "$REPORT_README" = 1 ]; then
    /usr/bin/python3 "$bench/report.py" --readme "$REPORT_OUT" "$bench/README.md" ||
      die "cannot update README.md"
  fi
  echo "$0: done in ${elapsed}s: $REPORT_OUT/report.md" >&2
}

main "$@"
exit
