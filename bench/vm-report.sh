#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# bench/vm-report.sh OUT.tsv: part (d) of bench/report.sh, real clients
# counted rather than timed.  One guest boot (tests/vm/vm-lib.sh: TCG
# qemu, Debian cloud kernel, busybox initramfs) runs
# bench/vm/guest-report.sh: for each front, the kernel nbd driver with
# ext4 (mkfs, unpacking a source tree, a loop of small fsync'ed writes)
# against a remote of VMREPORT_DELAY_US per write, all inside the guest.
# Writes one line per front to OUT.tsv: what the kernel sent (writes,
# FUA writes, FLUSHes, zeroes, trims) and what reached the remote.
#
# Environment: PLUGIN (.so), VMREPORT_FRONTS (proxy cache plug
# plug-hold), VMREPORT_DELAY_US (1000), VMREPORT_FSYNC_LOOPS (200),
# VM_TIMEOUT (900), NBDPLUG_VM_CACHE.

set -euo pipefail
export PATH=/usr/bin:/usr/sbin:/sbin:$PATH
bench=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$bench/.." && pwd)
out=$1
: "${VMREPORT_FRONTS:=proxy cache plug plug-hold}"
: "${VMREPORT_DELAY_US:=1000}"
: "${VMREPORT_FSYNC_LOOPS:=200}"
: "${VM_TIMEOUT:=900}"

say () { echo "vm-report: $*" >&2; }
fail () { echo "vm-report: $*" >&2; exit 1; }
tmp=$(mktemp -d /var/tmp/nbdplug-vm-report.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

PLUGIN_SO=${PLUGIN:-$top/plugin/.libs/nbdkit-plug-plugin.so}
PLUGIN_KIND=plug
# shellcheck source=../tests/vm/vm-lib.sh
. "$top/tests/vm/vm-lib.sh"
vm_requires
vm_fetch

cc -O2 -Wall -fPIC -shared -o "$tmp/delay-us.so" "$bench/delay-us.c"
# The source tree to unpack: this project's, and the kernel's UAPI headers
# (some 800 small files).
git -C "$top" archive --format=tar --prefix=nbdplug/ HEAD >"$tmp/tree.tar"
tar -rf "$tmp/tree.tar" -C /usr/include linux
gzip -1 "$tmp/tree.tar"
plugindir=$(nbdkit --dump-config | sed -n 's/^plugindir=//p')
filterdir=$(nbdkit --dump-config | sed -n 's/^filterdir=//p')
VM_EXTRA_FILES="$tmp/delay-us.so=/opt/bench/delay-us.so"
VM_EXTRA_FILES+=" $tmp/tree.tar.gz=/opt/bench/tree.tar.gz"
VM_EXTRA_FILES+=" $plugindir/nbdkit-memory-plugin.so $plugindir/nbdkit-nbd-plugin.so"
VM_EXTRA_FILES+=" $filterdir/nbdkit-cache-filter.so"
vm_initramfs "$tmp/initrd" "$bench/vm/guest-report.sh" \
  "FRONTS=$VMREPORT_FRONTS" "DELAY_US=$VMREPORT_DELAY_US" \
  "FSYNC_LOOPS=$VMREPORT_FSYNC_LOOPS"
vm_run report >&2 || fail "the guest failed (see its console above)"

{
  printf 'front\tcwrites\tcfua\tcflushes\tczeroes\tctrims\tbwrites\tbfua\tbflushes\tbzeroes\tbtrims\tseconds\n'
  tr -d '\r' <"$tmp/report.log" |
    awk '$1 == "VMREPORT" {
           # VMREPORT F client writes N fua N flushes N zeroes N trims N
           #            remote writes N fua N flushes N zeroes N trims N seconds S
           printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", $2,
             $5, $7, $9, $11, $13, $16, $18, $20, $22, $24, $26 }'
} >"$out"
say "$(($(wc -l <"$out") - 1)) fronts counted: $out"
