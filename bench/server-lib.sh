# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# shellcheck shell=bash disable=SC2154,SC2034 # $tmp is lib.sh's; server_uri is for the scripts.
# bench/server-lib.sh: background nbdkit servers for cpu.sh,
# flush-latency.sh and multiconn.sh.  Sourced after lib.sh (which makes
# $tmp, copies the plugin to $PLUGIN and provides median/ratio/field).
#
# Unlike lib.sh's captive servers (nbdkit --run), these run in the
# background with a pidfile, so that the script can read the server's
# CPU time from /proc/PID/stat around the client run and check the
# server's own exit status after SIGTERM.

CLK_TCK=$(getconf CLK_TCK)
server_pid=
server_wrap=
server_cs=
server_sock=
hog_pid=

# bench_cleanup: stop what this script started (by PID), remove $tmp.
bench_cleanup ()
{
  if [ -n "$server_pid" ]; then
    kill -TERM "$server_pid" 2>/dev/null || :
    wait "$server_wrap" 2>/dev/null || :
  fi
  if [ -n "$hog_pid" ]; then
    kill -TERM "$hog_pid" 2>/dev/null || :
    wait "$hog_pid" 2>/dev/null || :
  fi
  rm -rf "$tmp"
}
trap bench_cleanup EXIT

# die (lib.sh's, plus): stop this (sub)shell's server first, so that a
# failure inside $(measure ...) leaves no server behind.
die ()
{
  echo "$0: $*" >&2
  if [ -n "${server_pid:-}" ]; then
    kill -TERM "$server_pid" 2>/dev/null || :
    wait "$server_wrap" 2>/dev/null || :
  fi
  exit 1
}

# The server runs under a small parent (rusage_py) that waits for it
# and writes the context switches of its whole life, all threads
# counted, exited ones too (getrusage of a waited-for child: ru_nvcsw,
# ru_nivcsw), then exits with its status.  /proc/PID/task/*/status
# cannot give that sum: nbdkit's connection threads have exited by the
# time the client is done.  Context switches per request tell which
# thread regime a run fell into, which moves CPU per request more than a
# plugin's work.
rusage_py='
import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, ru = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    print(ru.ru_nvcsw, ru.ru_nivcsw, file=f)
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
'

# start_server NBDKIT_ARGS...: nbdkit -f -U SOCKET -P PIDFILE ARGS in
# the background, under rusage_py; returns when the socket accepts
# connections.  Sets server_pid (nbdkit's), server_wrap (its parent's),
# server_sock and server_uri.
start_server ()
{
  local pidfile=$tmp/server.pid i
  server_sock=$tmp/server.sock
  rm -f "$server_sock" "$pidfile" "$tmp/server.rusage"
  /usr/bin/python3 -c "$rusage_py" "$tmp/server.rusage" \
    nbdkit -f -U "$server_sock" -P "$pidfile" "$@" >>"$tmp/server.log" 2>&1 &
  server_wrap=$!
  for ((i = 0; i < 200; i++)); do
    [ -S "$server_sock" ] && [ -s "$pidfile" ] && break
    kill -0 "$server_wrap" 2>/dev/null ||
      die "server exited at start: nbdkit $* ($(tail -n3 "$tmp/server.log"))"
    sleep 0.025
  done
  [ -s "$pidfile" ] || die "server did not start: nbdkit $*"
  server_pid=$(cat "$pidfile")
  [ "$(sed 's/.*) //' "/proc/$server_pid/stat" | cut -d' ' -f2)" = "$server_wrap" ] ||
    die "pidfile $server_pid is not the child of $server_wrap"
  server_uri="nbd+unix:///?socket=$server_sock"
}

# stop_server: SIGTERM, wait, complain (stderr) about a non-zero exit.
# Sets server_cs to the server's context switches over its life
# (voluntary + involuntary).
stop_server ()
{
  local rc=0 vol invol
  kill -TERM "$server_pid"
  wait "$server_wrap" || rc=$?
  [ "$rc" = 0 ] ||
    echo "WARNING: server exited with status $rc: $(tail -n3 "$tmp/server.log")" >&2
  read -r vol invol <"$tmp/server.rusage" || die "no rusage of the server"
  server_cs=$((vol + invol))
  server_pid=
  server_wrap=
  return 0
}

# cpu_ticks PID: user + system time of the whole process (all its
# threads, live and exited), in clock ticks: fields 14 and 15 of
# /proc/PID/stat, counted after the ")" that ends the command name.
cpu_ticks ()
{
  sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'
}

# start_hog: with BENCH_HOG=1, keep one core busy with stress-ng.
start_hog ()
{
  [ "${BENCH_HOG:-0}" = 1 ] || return 0
  if ! command -v stress-ng >/dev/null; then
    echo "installing stress-ng" >&2
    { apt-get install -y stress-ng || { apt-get update && apt-get install -y stress-ng; }; } >&2 ||
      die "cannot install stress-ng"
  fi
  stress-ng --cpu 1 --timeout 3600 --quiet &
  hog_pid=$!
  sleep 0.5
}

# sum_fio_ios FILE: read + write + trim total_ios of all jobs of a fio
# JSON file (syncs are not counted).
fio_ios ()
{
  jq '[.jobs[] | .read.total_ios + .write.total_ios + .trim.total_ios] | add' "$1"
}

# fio_iops FILE: read + write + trim iops (group_reporting: of the group).
fio_iops ()
{
  jq '[.jobs[] | .read.iops + .write.iops + .trim.iops] | add | floor' "$1"
}

# us_per_req TICKS OPS: CPU microseconds per request.
us_per_req ()
{
  awk -v t="$1" -v n="$2" -v hz="$CLK_TCK" \
    'BEGIN { if (n > 0) printf "%.2f", t * 1e6 / hz / n; else print "-" }'
}

# is_plug KIND: the server of KIND is the plug, with a statsfile (wb,
# hold); base (nbdkit file) and null (nbdkit null) are not.
is_plug ()
{
  case $1 in wb|hold) return 0 ;; esac
  return 1
}

# fio_measure KIND STATS FIO-ARGS...: one fio --ioengine=nbd run of
# $BENCH_SECONDS against the server start_server started, which is then
# stopped.  Sets fio_result to "iops=N ios=N ticks=N cpu_us=X cs=X"
# (the server's CPU over the run, its context switches per request over
# its life) and, if KIND is the plug (is_plug), "cops=N
# bops=N conns=N" (client and backend write ops, connections) from its
# statsfile STATS.  Not in a $(...): the server is this shell's child.
fio_measure ()
{
  local kind=$1 stats=$2 t0 t1 ios out
  shift 2

  t0=$(cpu_ticks "$server_pid")
  fio --name=bench --ioengine=nbd --uri="$server_uri" \
      --norandommap --time_based --runtime="$BENCH_SECONDS" "$@" \
      --output-format=json --output="$tmp/fio.json" >>"$tmp/fio.log" 2>&1 ||
    die "fio failed against the $kind server: $(tail -n3 "$tmp/fio.log")"
  t1=$(cpu_ticks "$server_pid")
  stop_server
  ios=$(fio_ios "$tmp/fio.json")
  out="iops=$(fio_iops "$tmp/fio.json") ios=$ios ticks=$((t1 - t0))"
  out+=" cpu_us=$(us_per_req $((t1 - t0)) "$ios")"
  out+=" cs=$(ratio "$server_cs" "$ios")"
  if is_plug "$kind"; then
    [ -s "$stats" ] || die "no statsfile from the $kind run"
    out+=$(jq -r '" cops=\(.client.write.ops) bops=\(.backend.write.ops)" +
                  " conns=\(.connections)"' "$stats")
  fi
  fio_result=$out
}

load_avg ()
{
  cut -d' ' -f1-3 /proc/loadavg
}
