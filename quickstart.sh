#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# quickstart.sh: install what is missing, build, and serve or test.
#
#   ./quickstart.sh [serve] [--port=N | --unix | --both] [PARAM=VALUE...]
#       build, then serve a 1 GiB sparse disk image (work/disk.img) with
#       the plug plugin in the foreground, from one nbdkit process:
#         (default)  TCP on this machine only: nbd://127.0.0.1:10809
#         --port=N   TCP port N instead of 10809
#         --unix     the Unix socket work/nbd.sock instead of TCP
#         --both     TCP, and the socket through a second nbdkit that
#                    proxies the first (nbdkit nbd: it never opens the
#                    image, so the image still has one owner and one cache)
#       PARAM=VALUE are passed to the plugin (e.g. mode=hold idle=3ms).
#       It prints how to reach the export; stop it with Ctrl-C.
#   ./quickstart.sh check
#       build with warnings as errors (-Werror), run make check
# serve builds without -Werror; either command cleans and configures
# again a tree that was configured for the other.
#
# Debian 12 only; installs packages with apt-get when run as root.
set -euo pipefail

cd "$(dirname "$0")"
top=$(pwd)
# sbin for the tools the guest tests use.  PATH is otherwise the caller's:
# a locally built nbdkit first in PATH is the one "check" tests (the
# tests run python and nbdsh with /usr/bin/python3 themselves).
export PATH=$PATH:/usr/sbin:/sbin

# Build and runtime needs.
BUILD_PKGS="gcc make autoconf automake libtool pkg-config perl
  nbdkit nbdkit-plugin-dev libnbd-dev libev-dev"
# What the tests drive the plugin with: nbdsh, qemu (host client and the
# guest used for the kernel nbd driver), nbd-client, e2fsprogs, strace,
# valgrind, gdb (tells a sanitizer build's known hang in a library
# destructor at exit from a real one), fuser (psmisc), fio (its nbd
# engine drives the remote tests).  The guest kernel
# and busybox are downloaded by the tests themselves (apt-get download,
# never installed).
TEST_PKGS="libnbd-bin python3-libnbd qemu-utils qemu-system-x86 nbd-client
  e2fsprogs strace valgrind gdb ca-certificates jq psmisc fio"

install_missing ()
{
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
      missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ]; then
    echo "quickstart: missing packages: ${missing[*]}" >&2
    echo "quickstart: run as root, or: apt-get install ${missing[*]}" >&2
    exit 1
  fi
  echo "quickstart: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# build serve|check: configure for the command, then make.  check builds
# with warnings as errors (--enable-gcc-warnings: -Werror), serve
# without them: a newer compiler's new warning must not stop someone who
# only wants to serve.  A tree configured with other options (the other
# command's, or by hand) is cleaned first: make does not recompile an
# object when only the compiler's flags changed.  check configures again
# in any case.
build ()
{
  local cmd=$1 opts=() configured=none
  [ "$cmd" = check ] && opts=(--enable-gcc-warnings)
  if [ ! -x configure ] || [ configure.ac -nt configure ]; then
    autoreconf -fi
  fi
  if [ -f Makefile ] && [ -x config.status ]; then
    configured=other
    [ "$(./config.status --config)" = "${opts[*]}" ] && configured=same
  fi
  if [ $configured = other ]; then
    echo "quickstart: configured as '$(./config.status --config)'," \
         "$cmd builds with '${opts[*]}': make clean, configure again"
    make clean >/dev/null
  fi
  if [ $configured != same ] || [ "$cmd" = check ]; then
    ./configure "${opts[@]}"
  fi
  make -j"$(nproc)"
}

usage ()
{
  echo "usage: $0 [serve] [--port=N | --unix | --both] [PARAM=VALUE...]" >&2
  echo "       $0 check" >&2
  exit 2
}

# start PIDFILE ARGS...: "nbdkit -f -P PIDFILE ARGS..." in the background;
# returns once it serves (nbdkit writes the pid file when it is ready),
# or exits with nbdkit's status if it fails to start.  Sets $started.
start ()
{
  local pidfile=$1 i rc=0
  shift
  nbdkit -f -P "$pidfile" "$@" &
  started=$!
  pids+=("$started")
  for ((i = 0; i < 600; ++i)); do
    [ -s "$pidfile" ] && return 0
    if ! kill -0 "$started" 2>/dev/null; then
      wait "$started" || rc=$?
      echo "quickstart: nbdkit $* failed to start (status $rc)" >&2
      exit $(( rc ? rc : 1 ))
    fi
    sleep 0.1
  done
  echo "quickstart: nbdkit $* did not start within 60 s" >&2
  exit 1
}

serve ()
{
  local port=10809 a params=() img plugin tcp unix server proxy rc

  listen=tcp                    # Global: the EXIT trap reads it.

  for a in "$@"; do
    case $a in
      --port=*) port=${a#--port=} ;;
      --unix) listen=unix ;;
      --both) listen=both ;;
      *=*) params+=("$a") ;;
      *) usage ;;
    esac
  done

  # shellcheck disable=SC2086
  install_missing $BUILD_PKGS
  build serve
  mkdir -p work
  img=$top/work/disk.img
  [ -e "$img" ] || truncate -s 1G "$img"
  plugin=$top/plugin/.libs/nbdkit-plug-plugin.so
  sock=$top/work/nbd.sock
  tcp=nbd://127.0.0.1:$port
  unix="nbd+unix:///?socket=$sock"

  # Ctrl-C or SIGTERM: stop the servers (nbdkit writes out what the
  # plug holds), then exit with the plug server's status.  nbdkit does
  # not remove its socket or pid file.
  pids=()
  trap 'interrupted=1; kill -TERM "${pids[@]}" 2>/dev/null || :' INT TERM
  trap 'kill -TERM "${pids[@]}" 2>/dev/null || :
        rm -f "$top/work/nbdkit.pid" "$top/work/proxy.pid"
        [ "$listen" = tcp ] || rm -f "$sock"' EXIT
  rm -f "$top/work/nbdkit.pid" "$top/work/proxy.pid"

  # One process owns the image (a second "nbdkit plug" on it is refused,
  # see shared= in the man page); --both proxies it.
  if [ "$listen" = unix ]; then
    rm -f "$sock"
    start "$top/work/nbdkit.pid" -U "$sock" \
          "$plugin" file="$img" "${params[@]}"
  else
    start "$top/work/nbdkit.pid" -i 127.0.0.1 -p "$port" \
          "$plugin" file="$img" "${params[@]}"
  fi
  server=$started
  if [ "$listen" = both ]; then
    rm -f "$sock"
    start "$top/work/proxy.pid" -U "$sock" \
          nbd hostname=127.0.0.1 port="$port"
    proxy=$started
  fi

  echo "Serving $img (1 GiB, sparse) with the plug plugin"
  echo "(nbdkit process $server; it alone has the image open), at:"
  [ "$listen" = unix ] || echo "  $tcp"
  case $listen in
    unix) echo "  $unix" ;;
    both) echo "  $unix"
          echo "(the socket is nbdkit process $proxy, proxying $tcp)" ;;
  esac
  echo "Attach it:"
  if [ "$listen" != unix ]; then
    echo "  nbd-client 127.0.0.1 $port /dev/nbd0          # kernel (modprobe nbd)"
    echo "  qemu-img info $tcp"
  fi
  if [ "$listen" != tcp ]; then
    echo "  nbd-client -unix $sock /dev/nbd0"
    echo "  qemu-system-x86_64 ... -drive file=$unix,format=raw,if=virtio"
  fi
  echo "Extra arguments are passed to the plugin (e.g. mode=hold idle=3ms)."
  echo "Stop with Ctrl-C."

  # Until the server exits.  A signal interrupts the wait (status > 128)
  # after the trap has stopped the server: wait again for its status.
  while :; do
    interrupted=0
    rc=0
    wait "$server" || rc=$?
    [ $rc -gt 128 ] && [ $interrupted = 1 ] || break
  done
  if [ "$listen" = both ]; then
    kill -TERM "$proxy" 2>/dev/null || :
    wait "$proxy" || :
  fi
  return $rc
}

mode=serve
case ${1:-} in
  serve) shift ;;
  check) mode=check; shift ;;
esac
case "$mode" in
serve)
  serve "$@"
  ;;
check)
  [ $# -eq 0 ] || usage
  # shellcheck disable=SC2086
  install_missing $BUILD_PKGS $TEST_PKGS
  build check
  make check
  ;;
esac
