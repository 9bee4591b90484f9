#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# bench/vm-report.sh OUT.tsv: part (d) of bench/report.sh, real clients
# counted rather than timed.  One guest boot (tests/vm/vm-lib.sh: TCG
# qemu, Debian cloud kernel, busybox initramfs) runs
# bench/vm/guest-report.sh: for each front, the kernel nbd driver with
# ext4 (mkfs, unpacking a source tree, a loop of small fsync'ed writes)
# against a remote of VMREPORT_DELAY_US per write, all inside the guest.
# A second boot does the same with qemu's own NBD client as the client
# (one virtio disk per front, the fronts and remotes on the host).
# Writes one line per client and front to OUT.tsv: what the client sent
# (writes, FUA writes, FLUSHes, zeroes, trims) and what reached the
# remote.
#
# Environment: PLUGIN (.so), VMREPORT_FRONTS (proxy cache plug
# plug-hold), VMREPORT_DELAY_US (1000), VMREPORT_FSYNC_LOOPS (200),
# VMREPORT_CLIENTS (both; kernel or qemu for one),
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
: "${VMREPORT_CLIENTS:=both}"

say () { echo "vm-report: $*" >&2; }
fail () { echo "vm-report: $*" >&2; exit 1; }
tmp=$(mktemp -d /var/tmp/nbdplug-vm-report.XXXXXX)
pids=()
cleanup ()
{
  local p
  for p in "${pids[@]}"; do
    kill -TERM "$p" 2>/dev/null || :
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

PLUGIN_SO=${PLUGIN:-$top/plugin/.libs/nbdkit-plug-plugin.so}
# shellcheck disable=SC2034 # read by vm-lib.sh
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
printf 'client\tfront\tcwrites\tcfua\tcflushes\tczeroes\tctrims\tbwrites\tbfua\tbflushes\tbzeroes\tbtrims\n' >"$out"

# The kernel's nbd driver: fronts and remotes inside the guest.
if [ "$VMREPORT_CLIENTS" != qemu ]; then
  vm_initramfs "$tmp/initrd" "$bench/vm/guest-report.sh" \
    "FRONTS=$VMREPORT_FRONTS" "DELAY_US=$VMREPORT_DELAY_US" \
    "FSYNC_LOOPS=$VMREPORT_FSYNC_LOOPS"
  vm_run report >&2 || fail "the guest failed (see its console above)"
  tr -d '\r' <"$tmp/report.log" |
    awk '$1 == "VMREPORT" {
           # VMREPORT F client writes N fua N flushes N zeroes N trims N
           #            remote writes N fua N flushes N zeroes N trims N seconds S
           printf "kernel\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", $2,
             $5, $7, $9, $11, $13, $16, $18, $20, $22, $24 }' >>"$out"
fi
[ "$VMREPORT_CLIENTS" != kernel ] || exit 0

# qemu's NBD client: one virtio disk per front, the fronts and their
# remotes on the host, counted there.
# serve NAME ARGS...: nbdkit on $tmp/NAME.sock in the background.
serve ()
{
  local name=$1 i
  shift
  nbdkit -f -U "$tmp/$name.sock" -P "$tmp/$name.pid" "$@" >>"$tmp/host.log" 2>&1 &
  pids+=($!)
  for ((i = 0; i < 400; i++)); do
    [ -S "$tmp/$name.sock" ] && [ -s "$tmp/$name.pid" ] && return 0
    sleep 0.025
  done
  fail "$name did not start: $(tail -n3 "$tmp/host.log")"
}
drives=()
disks=
letters=(a b c d e f g h)
i=0
for front in $VMREPORT_FRONTS; do
  serve "r-$front" --filter="$tmp/delay-us.so" memory 512M \
    "write-us=$VMREPORT_DELAY_US" "counts=$tmp/r-$front.counts"
  uri="nbd+unix:///?socket=$tmp/r-$front.sock"
  case $front in
    proxy)     args=(nbd "uri=$uri") ;;
    cache)     args=(--filter=cache nbd "uri=$uri" cache=writeback) ;;
    plug)      args=("$PLUGIN_SO" "file=$uri") ;;
    plug-hold) args=("$PLUGIN_SO" "file=$uri" mode=hold) ;;
    *) fail "unknown front $front" ;;
  esac
  serve "f-$front" --filter="$tmp/delay-us.so" "${args[@]}" "counts=$tmp/f-$front.counts"
  drives+=(-drive "file=nbd+unix:///?socket=$tmp/f-$front.sock,format=raw,if=virtio")
  disks+="vd${letters[i]} "
  i=$((i + 1))
done
vm_initramfs "$tmp/initrd-vda" "$bench/vm/guest-report-vda.sh" \
  "DISKS=$disks" "FSYNC_LOOPS=$VMREPORT_FSYNC_LOOPS"
vm_run report-vda "${drives[@]}" >&2 || fail "the qemu-client guest failed (see its console above)"
# Fronts first (they write back to their remotes as they close), each
# must exit 0.
for front in $VMREPORT_FRONTS; do
  kill -TERM "$(cat "$tmp/f-$front.pid")"
done
for front in $VMREPORT_FRONTS; do
  kill -TERM "$(cat "$tmp/r-$front.pid")"
done
for p in "${pids[@]}"; do
  wait "$p" || fail "a host nbdkit exited with status $?: $(tail -n3 "$tmp/host.log")"
done
for front in $VMREPORT_FRONTS; do
  read -r _ cw _ cfua _ cfl _ cz _ ct <"$tmp/f-$front.counts"
  read -r _ bw _ bfua _ bfl _ bz _ bt <"$tmp/r-$front.counts"
  printf 'qemu\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$front" \
    "$cw" "$cfua" "$cfl" "$cz" "$ct" "$bw" "$bfua" "$bfl" "$bz" "$bt" >>"$out"
done
say "$(($(wc -l <"$out") - 1)) client/front pairs counted: $out"
