# shellcheck shell=bash
# Shared logic of the remote tests (tests/test-remote-*.sh): NBD servers
# in the background, each with its exit status checked.  Source it after
# functions.sh and plug_tmpdir:
#
#   srv_start NAME unix|tcp NBDKIT-ARGS...
#       nbdkit -f -P $tmp/NAME.pid NBDKIT-ARGS... in the background, on a
#       unix socket $tmp/NAME.sock or on 127.0.0.1 at a free port (the
#       same port again when NAME is restarted); stderr in $tmp/NAME.log.
#       Sets srv_uri[NAME].  Fails if the server does not come up.
#   srv_stop NAME
#       SIGTERM, wait, and fail unless the server exited with status 0.
#       (Stop the plug before the servers it is connected to: nbdkit
#       1.32 does not exit on SIGTERM while an idle client is connected.)
#   srv_kill NAME
#       SIGKILL and reap (a crash on purpose: the status is not checked).
#   srv_running NAME
#       Is it still alive?
#
# At exit, servers still running are killed (the test failed already).

requires nbdkit --version
requires test -x /usr/bin/python3

declare -A srv_pid srv_uri srv_port

free_port ()
{
  /usr/bin/python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

srv_start ()
{
  local name=$1 how=$2 pidfile=$tmp/$1.pid i
  shift 2
  rm -f "$pidfile"
  case $how in
    unix)
      rm -f "$tmp/$name.sock"
      nbdkit -f -P "$pidfile" -U "$tmp/$name.sock" "$@" \
             2>>"$tmp/$name.log" &
      srv_uri[$name]="nbd+unix:///?socket=$tmp/$name.sock"
      ;;
    tcp)
      [ -n "${srv_port[$name]:-}" ] || srv_port[$name]=$(free_port)
      nbdkit -f -P "$pidfile" -i 127.0.0.1 -p "${srv_port[$name]}" "$@" \
             2>>"$tmp/$name.log" &
      srv_uri[$name]="nbd://127.0.0.1:${srv_port[$name]}/"
      ;;
    *)
      echo "srv_start: $how: expected unix or tcp"
      return 1
      ;;
  esac
  srv_pid[$name]=$!
  # nbdkit writes the pidfile once it listens.
  for ((i = 0; i < 200; ++i)); do
    [ -s "$pidfile" ] && return 0
    if ! kill -0 "${srv_pid[$name]}" 2>/dev/null; then
      echo "srv_start $name: nbdkit exited at start:"
      cat "$tmp/$name.log"
      return 1
    fi
    sleep 0.05
  done
  echo "srv_start $name: no pidfile after 10 s"
  return 1
}

srv_running ()
{
  [ -n "${srv_pid[$1]:-}" ] && kill -0 "${srv_pid[$1]}" 2>/dev/null
}

srv_stop ()
{
  local name=$1 pid=${srv_pid[$1]:-} rc=0
  [ -n "$pid" ] || { echo "srv_stop $name: not started"; return 1; }
  kill -TERM "$pid" 2>/dev/null || :
  wait "$pid" || rc=$?
  unset "srv_pid[$name]"
  if [ $rc -ne 0 ]; then
    echo "srv_stop $name: nbdkit exited with status $rc; its log:"
    cat "$tmp/$name.log"
    return 1
  fi
}

srv_kill ()
{
  local pid=${srv_pid[$1]:-}
  [ -n "$pid" ] || return 0
  kill -KILL "$pid" 2>/dev/null || :
  wait "$pid" 2>/dev/null || :
  unset "srv_pid[$1]"
}

_srv_cleanup ()
{
  local name
  for name in "${!srv_pid[@]}"; do
    kill -KILL "${srv_pid[$name]}" 2>/dev/null || :
  done
}
cleanup_fn _srv_cleanup

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
  local dir=$tmp/$name conns=4 i n off stripe size rest kind rc=0 start end
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

  mkdir "$dir"
  IFS=, read -r -a kind_of <<< "$kinds"
  kind=${layout%%:*}
  rest=${layout#*:}
  if [ "$kind" = concat ]; then
    IFS=, read -r -a sizes <<< "$rest"
    off=0
    for ((i = 0; i < ${#sizes[@]}; ++i)); do
      sizes[i]=$(model_size "${sizes[i]}")
      off=$((off + sizes[i]))
      [ $i -lt $((${#sizes[@]} - 1)) ] && bounds+=(--boundary "$off")
    done
    layout=concat:$(IFS=,; echo "${sizes[*]}")
  else
    IFS=: read -r stripe n size <<< "$rest"
    stripe=$(model_size "$stripe")
    size=$(model_size "$size")
    for ((i = 0; i < n; ++i)); do sizes+=("$size"); done
    bounds+=(--boundary-step "$stripe")
    params+=("stripe=$stripe")
    layout=stripe:$stripe:$n:$size
  fi
  if [ ${#kind_of[@]} -ne ${#sizes[@]} ]; then
    echo "model_run_remote: ${#kind_of[@]} kinds for ${#sizes[@]} files"
    return 1
  fi
  for ((i = 0; i < ${#sizes[@]}; ++i)); do
    files+=("$dir/f$i")
  done
  model_check make "$layout" "$(cksum <<< "$name" | cut -d' ' -f1)" \
              "${files[@]}"
  model_check image "$layout" "${files[@]}" > "$dir/init"

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
            statsfile="$dir/stats.json" || return 1
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
