#!/usr/bin/env bash
# quickstart.sh: install what is missing, build, and serve or test.
#
#   ./quickstart.sh          build, then serve a 1 GiB sparse disk image
#                            (work/disk.img) with the plug plugin in the
#                            foreground on nbd://localhost:10809 and on
#                            the Unix socket work/nbd.sock
#   ./quickstart.sh check    build (with warnings as errors), run make check
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
# destructor at exit from a real one).  The guest kernel and busybox are
# downloaded by the tests themselves (apt-get download, never installed).
TEST_PKGS="libnbd-bin python3-libnbd qemu-utils qemu-system-x86 nbd-client
  e2fsprogs strace valgrind gdb ca-certificates jq"

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

build ()
{
  if [ ! -x configure ] || [ configure.ac -nt configure ]; then
    autoreconf -fi
  fi
  if [ ! -f Makefile ] || [ "${1:-}" = reconfigure ]; then
    ./configure --enable-gcc-warnings
  fi
  make -j"$(nproc)"
}

mode=${1:-serve}
[ $# -gt 0 ] && shift
case "$mode" in
serve)
  # shellcheck disable=SC2086
  install_missing $BUILD_PKGS
  build
  mkdir -p work
  [ -e work/disk.img ] || truncate -s 1G work/disk.img
  plugin=$top/plugin/.libs/nbdkit-plug-plugin.so
  sock=$top/work/nbd.sock
  rm -f "$sock"
  # Two nbdkit processes, one per address (nbdkit listens on one kind
  # of socket at a time).  Each connection has its own plug: attach
  # one client at a time, or use mode=hold for several.
  nbdkit -f -U "$sock" "$plugin" file=work/disk.img "$@" &
  unix_pid=$!
  trap 'kill $unix_pid 2>/dev/null || :' EXIT
  cat <<EOM
Serving $top/work/disk.img (1 GiB, sparse) with the plug plugin:
  nbd://localhost:10809
  nbd+unix:///?socket=$sock
Attach it:
  nbd-client localhost 10809 /dev/nbd0          # kernel (modprobe nbd)
  nbd-client -unix $sock /dev/nbd0
  qemu-img info nbd://localhost:10809
  qemu-system-x86_64 ... -drive file=nbd+unix:///?socket=$sock,format=raw,if=virtio
Extra arguments are passed to the plugin (e.g. mode=hold idle=3ms).
Stop with Ctrl-C.
EOM
  nbdkit -f -p 10809 "$plugin" file=work/disk.img "$@"
  ;;
check)
  # shellcheck disable=SC2086
  install_missing $BUILD_PKGS $TEST_PKGS
  build reconfigure
  make check
  ;;
*)
  echo "usage: $0 [check]" >&2
  exit 2
  ;;
esac
