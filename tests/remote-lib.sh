# shellcheck shell=bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Shared logic of the remote tests (tests/test-remote-*.sh): NBD servers
# that the plug uses as backing files, started and stopped with
# functions.sh's start_server / stop_server, so that each one's exit
# status and log (sanitizer reports) are checked like the plug's.
# Source it after functions.sh:
#
#   srv_start NAME unix|tcp NBDKIT-ARGS...
#       start_server NAME NBDKIT-ARGS..., on the unix socket $tmp/NAME.sock
#       or on 127.0.0.1 at a free port (the same port again when NAME is
#       restarted).  Sets srv_uri[NAME].
#   srv_stop NAME
#       stop_server NAME.  (Stop the plug before the servers it is
#       connected to: nbdkit 1.32 does not exit on SIGTERM while an idle
#       client is connected.)
#   srv_kill NAME
#       kill_server NAME (a crash on purpose: the status is not checked).
#
# A server still running at exit is killed, and the test fails.

requires nbdkit --version
requires test -x /usr/bin/python3

declare -A srv_uri

srv_start ()
{
  local name=$1 how=$2
  shift 2
  case $how in
    unix) ;;
    tcp) [ -n "${_srv_port[$name]:-}" ] || server_on_tcp "$name" ;;
    *) fail "srv_start: $how: expected unix or tcp" ;;
  esac
  start_server "$name" "$@"
  srv_uri[$name]=$(server_uri "$name")
}

srv_stop () { stop_server "$1"; }
srv_kill () { kill_server "$1"; }
# model_run_remote NAME LAYOUT MODE KINDS [PLUG-PARAMS...] [-- MODEL-ARGS...]
#
# model_run (model-lib.sh, which must be sourced first) with some of the
# backing files served by NBD servers.  KINDS has one word per backing
# file, comma-separated: "local" (a file), or "unix" / "tcp" (an nbdkit
# memory server of the file's size on a unix socket / on 127.0.0.1,
# filled with the file's initial contents by nbdcopy, and read back by
# nbdcopy once the plug stopped).  The plug runs in the background like
# the servers, and every server's exit status is checked.
model_run_remote ()
{
  local name=$1 layout=$2 mode=$3 kinds=$4
  shift 4
  local params=() margs=() files=() bounds=() sizes=() kind_of=()
  local dir=$tmp/$name conns=4 i rc=0 start end
  local remotes=()

  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    params+=("$1")
    shift
  done
  [ $# -gt 0 ] && shift
  margs=("$@")
  for ((i = 0; i < ${#margs[@]}; ++i)); do
    [ "${margs[i]}" = "--connections" ] && conns=${margs[i+1]}
  done

  IFS=, read -r -a kind_of <<< "$kinds"
  model_layout "$name" "$layout"
  layout=$ml_layout
  sizes=("${ml_sizes[@]}")
  files=("${ml_files[@]}")
  bounds=("${ml_bounds[@]}")
  params+=("${ml_stripe[@]}")
  if [ ${#kind_of[@]} -ne ${#sizes[@]} ]; then
    echo "model_run_remote: ${#kind_of[@]} kinds for ${#sizes[@]} files"
    return 1
  fi

  for ((i = 0; i < ${#sizes[@]}; ++i)); do
    case ${kind_of[i]} in
      local)
        params+=("file=$dir/f$i")
        ;;
      unix|tcp)
        srv_start "$name-r$i" "${kind_of[i]}" memory "${sizes[i]}" || return 1
        nbdcopy "$dir/f$i" "${srv_uri[$name-r$i]}" || return 1
        params+=("file=${srv_uri[$name-r$i]}")
        remotes+=("$i")
        ;;
      *)
        echo "model_run_remote: ${kind_of[i]}: expected local, unix or tcp"
        return 1
        ;;
    esac
  done

  echo "== $name: nbdkit plug ${params[*]} mode=$mode"
  echo "   model-test ${margs[*]}"
  start=$(date +%s%N)
  srv_start "$name-plug" unix "$PLUGIN" "${params[@]}" mode="$mode" \
            stats-file="$dir/stats.json" || return 1
  timeout "$MODEL_TIMEOUT" \
    "$MODEL" --connections "$conns" "${bounds[@]}" \
             --init "$dir/init" --dump "$dir/dump" --mask "$dir/mask" \
             "${margs[@]}" --uri "${srv_uri[$name-plug]}" \
             > "$dir/out" 2>&1 || rc=$?
  end=$(date +%s%N)
  cat "$dir/out"
  srv_stop "$name-plug" || return 1
  if [ $rc -eq 124 ]; then
    echo "$name: FAIL: timed out after ${MODEL_TIMEOUT}s (deadlock?)"
    return 1
  fi
  if [ $rc -ne 0 ]; then
    echo "$name: FAIL: model-test exited with $rc"
    return 1
  fi
  # What the servers hold now, the plug gone: the backing "files".
  for i in "${remotes[@]}"; do
    rm -f "$dir/f$i"
    nbdcopy "${srv_uri[$name-r$i]}" "$dir/f$i" || return 1
    srv_stop "$name-r$i" || return 1
  done
  model_check compare "$layout" "$dir/dump" "$dir/mask" "${files[@]}" || {
    echo "$name: FAIL: backing data differs from the reference"
    return 1
  }
  model_check stats "$dir/stats.json" "$mode" "$conns" "$dir/out" || {
    echo "$name: FAIL: statistics"
    return 1
  }
  echo "== $name: ok in $(( (end - start) / 1000000 )) ms"
}

# wait_plug_log TEXT [TENTHS]: wait up to TENTHS tenths of a second
# (default 300) for a line containing TEXT in the plug's log; 1 if none.
wait_plug_log ()
{
  local i
  for ((i = 0; i < ${2:-300}; ++i)); do
    grep -qF -- "$1" "$tmp/plug.log" && return 0
    sleep 0.1
  done
  return 1
}
