#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# bench/install.sh: install what bench/report.sh needs and is missing,
# from Debian 12 packages only (apt-get, as root).  Does nothing when all
# the commands are there.

set -euo pipefail
export PATH=/usr/bin:/usr/sbin:/sbin:$PATH

# command:package
needs="nbdkit:nbdkit fio:fio gnuplot:gnuplot-nox nbd-server:nbd-server
qemu-nbd:qemu-utils perf:linux-perf valgrind:valgrind
callgrind_annotate:valgrind jq:jq python3:python3 cc:gcc
pkg-config:pkg-config"

missing=()
for pair in $needs; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
# The filter built by report.sh needs nbdkit's filter header.
[ -f /usr/include/nbdkit-filter.h ] || missing+=(nbdkit-plugin-dev)
[ ${#missing[@]} = 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "$0: missing, and not root to install them: ${missing[*]}" >&2
  exit 1
fi
echo "$0: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends "${missing[@]}" >&2 ||
  { apt-get update >&2 &&
    apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
