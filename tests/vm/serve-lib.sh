# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# tests/vm/serve-lib.sh - start and stop nbdkit with the plugin under test on
# the host.  Sourced by tests/test-qemu-img.sh and tests/test-vm-*.sh after
# ./functions.sh.  Bash.
#
# The tests speak the plug plugin's parameters (file=A file=B stripe= mode=
# stats-file= ...).  For negative controls (proving a test can fail), PLUGIN
# may instead name a stock nbdkit plugin that does not keep data: "null"
# (discards writes) or "memory" (keeps them only in RAM, so nothing reaches
# the backing files).  Their parameters are translated to
# size=<total size of the file= arguments>.  Example:
#   cd tests && PLUGIN=null ./test-qemu-img.sh        # must FAIL
#
# Extra knobs (word-split, both host and guest side):
#   TEST_NBDKIT_OPTS    nbdkit options put before the plugin, e.g. "-v" or
#                       "--filter=fua" (filters are copied into the guest too)
#   TEST_NBDKIT_PARAMS  parameters appended after the plugin's, e.g.
#                       "fuamode=discard" (with --filter=fua: FLUSH/FUA are
#                       dropped, which test-vm-crash.sh must detect)
#
# plug_resolve           set PLUGIN_SO (path of the .so) and PLUGIN_KIND
#                        (plug | null | memory) from $PLUGIN; FAIL if missing
# serve SOCK ARGS...     start "nbdkit -f -U SOCK PLUGIN ARGS..." in the
#                        background, wait until it serves; sets SERVE_PID.
#                        SOCK must be $tmp/NAME.sock: this is start_server
#                        NAME (functions.sh), whose log is $tmp/NAME.log
# serve_stop PID         stop_server for the server SERVE_PID was: SIGTERM,
#                        wait (at most 60 s), FAIL unless it exited 0
#                        without a sanitizer report
# fail MSG...            print "FAIL: MSG" and exit 1 (functions.sh)

# Log with the seconds since the test started.
_t0=$SECONDS
say ()
{
  printf '[%3ds] %s\n' "$((SECONDS - _t0))" "$*"
}

plug_resolve ()
{
  local plugindir
  case $PLUGIN in
    */*) PLUGIN_SO=$PLUGIN ;;
    *)
      plugindir=$(nbdkit --dump-config | sed -n 's/^plugindir=//p')
      PLUGIN_SO=$plugindir/nbdkit-$PLUGIN-plugin.so
      ;;
  esac
  [ -r "$PLUGIN_SO" ] ||
    fail "plugin $PLUGIN_SO not found (not built yet? run make first)"
  PLUGIN_SO=$(readlink -f "$PLUGIN_SO")
  case ${PLUGIN_SO##*/} in
    nbdkit-null-plugin.so) PLUGIN_KIND=null ;;
    nbdkit-memory-plugin.so) PLUGIN_KIND=memory ;;
    *) PLUGIN_KIND=plug ;;
  esac
  export PLUGIN_SO PLUGIN_KIND
}

# plug_argv ARGS...: set the array PLUG_ARGV to what the plugin under test
# takes for the plug parameters ARGS.
plug_argv ()
{
  local a total=0
  if [ "$PLUGIN_KIND" = plug ]; then
    PLUG_ARGV=("$@")
  else
    for a; do
      case $a in
        file=*) total=$((total + $(stat -c %s "${a#file=}"))) ;;
      esac
    done
    PLUG_ARGV=("size=$total")
  fi
  # shellcheck disable=SC2206
  PLUG_ARGV+=(${TEST_NBDKIT_PARAMS:-})
}

declare -A _serve_name=()       # nbdkit pid -> start_server name

serve ()
{
  local sock=$1 name
  shift
  [ "$(dirname "$sock")" = "$tmp" ] && [[ $sock == *.sock ]] ||
    fail "serve: the socket must be \$tmp/NAME.sock, not $sock"
  name=$(basename "$sock" .sock)
  plug_argv "$@"
  # shellcheck disable=SC2086
  start_server "$name" ${TEST_NBDKIT_OPTS:-} "$PLUGIN_SO" "${PLUG_ARGV[@]}"
  SERVE_PID=$SERVER_PID
  _serve_name[$SERVE_PID]=$name
}

serve_stop ()
{
  local name=${_serve_name[$1]:-}
  [ -n "$name" ] || fail "serve_stop: $1 is not a server started by serve"
  unset "_serve_name[$1]"
  stop_server "$name"
}
