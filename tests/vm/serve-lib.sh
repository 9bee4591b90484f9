# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# tests/vm/serve-lib.sh - start and stop nbdkit with the plugin under test on
# the host.  Sourced by tests/test-qemu-img.sh and tests/test-vm-*.sh after
# ./functions.sh.  Bash.
#
# The tests speak the plug plugin's parameters (file=A file=B stripe= mode=
# statsfile= ...).  For negative controls (proving a test can fail), PLUGIN
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
#                        background, wait until it serves; sets SERVE_PID
# serve_stop PID         SIGTERM, wait (at most 60 s), FAIL unless exit 0
# fail MSG...            print "FAIL: MSG" and exit 1

fail ()
{
  echo "$0: FAIL: $*" >&2
  exit 1
}

# Log with the seconds since the test started.
_t0=$SECONDS
say ()
{
  printf '[%3ds] %s\n' "$((SECONDS - _t0))" "$*"
}

_kill_quietly ()
{
  kill -9 "$@" 2>/dev/null || :
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

serve ()
{
  local sock=$1 i
  shift
  plug_argv "$@"
  rm -f "$sock"
  # shellcheck disable=SC2086
  nbdkit -f ${TEST_NBDKIT_OPTS:-} -U "$sock" "$PLUGIN_SO" "${PLUG_ARGV[@]}" &
  SERVE_PID=$!
  cleanup_fn _kill_quietly "$SERVE_PID"
  for ((i = 0; i < 300; ++i)); do
    [ -S "$sock" ] && return 0
    kill -0 "$SERVE_PID" 2>/dev/null ||
      fail "nbdkit exited at start: nbdkit $PLUGIN_SO ${PLUG_ARGV[*]}"
    sleep 0.1
  done
  fail "nbdkit did not create $sock within 30 s"
}

serve_stop ()
{
  local pid=$1 rc=0 i
  kill -TERM "$pid" 2>/dev/null || :
  for ((i = 0; i < 600; ++i)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid"
    fail "nbdkit (pid $pid) still running 60 s after SIGTERM"
  fi
  wait "$pid" || rc=$?
  [ "$rc" -eq 0 ] || fail "nbdkit (pid $pid) exited with status $rc after SIGTERM"
}
