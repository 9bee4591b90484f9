#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-vm-qemu-drive.sh - qemu's NBD block driver against the plug, as a
# guest disk.
#
# nbdkit with the plug runs on the HOST, twice: mode=writeback and mode=hold,
# each on two backing files (24M+40M, concatenated).  One guest boot (TCG
# qemu, see vm/vm-lib.sh) gets both exports as virtio disks through
# -drive file=nbd+unix:///?socket=...,format=raw,if=virtio (/dev/vda,
# /dev/vdb).  The guest (vm/guest-vda.sh) formats each disk, writes a tree of
# files, and checks fsck and checksums after dropping its caches.  This
# proves that, after the guest powers off and nbdkit exits 0 on SIGTERM, the
# backing files of each export, joined, are a clean ext4 (e2fsck -fn on the
# host) whose files (debugfs rdump) have the checksums the guest printed:
# qemu's writes, zeroes, trims and flushes reached the files.
#
# Negative controls (this test can fail), each run once:
#  * nbdkit's memory plugin ("cd tests && PLUGIN=memory
#    ./test-vm-qemu-drive.sh"): the guest passes (the data lives in RAM),
#    the host check fails: "writeback: e2fsck of the backing files";
#  * nbdkit's null plugin (PLUGIN=null): "VMTEST-ERROR: vda: mount".
source ./functions.sh
set -euo pipefail
source "${srcdir:-.}/vm/serve-lib.sh"
source "${srcdir:-.}/vm/vm-lib.sh"

vm_requires
plug_resolve
plug_tmpdir
vm_fetch

modes="writeback hold"
disks="vda vdb"
drives=()
pids=()
for mode in $modes; do
  truncate -s 24M "$tmp/$mode-a.img"
  truncate -s 40M "$tmp/$mode-b.img"
  serve "$tmp/$mode.sock" "file=$tmp/$mode-a.img" "file=$tmp/$mode-b.img" \
    "mode=$mode" "stats-file=$tmp/stats-$mode.json"
  pids+=("$SERVE_PID")
  drives+=(-drive "file=nbd+unix:///?socket=$tmp/$mode.sock,format=raw,if=virtio")
done

vm_initramfs "$tmp/initrd" "${srcdir:-.}/vm/guest-vda.sh" "DISKS=$disks"
vm_run vda "${drives[@]}" || fail "guest test failed (see the console above)"

set -- $disks
i=0
for mode in $modes; do
  disk=$1
  shift
  serve_stop "${pids[i]}"
  i=$((i + 1))
  [ ! -e "$tmp/stats-$mode.json" ] || say "$mode: stats: $(tr -d ' \n' < "$tmp/stats-$mode.json")"
  cat "$tmp/$mode-a.img" "$tmp/$mode-b.img" > "$tmp/whole.img"
  [ "$(stat -c %s "$tmp/$mode-a.img")" -eq $((24 << 20)) ] &&
  [ "$(stat -c %s "$tmp/$mode-b.img")" -eq $((40 << 20)) ] ||
    fail "$mode: a backing file changed size"
  e2fsck -fn "$tmp/whole.img" > "$tmp/fsck.log" 2>&1 || {
    cat "$tmp/fsck.log"
    fail "$mode: e2fsck of the backing files"
  }
  vm_section "$tmp/vda.log" "sums-$disk" > "$tmp/sums"
  [ "$(wc -l < "$tmp/sums")" -ge 40 ] || fail "$mode: the guest printed no checksums"
  rm -rf "$tmp/out"
  mkdir "$tmp/out"
  debugfs -R "rdump /t $tmp/out" "$tmp/whole.img" > /dev/null 2>&1
  (cd "$tmp/out" && sha256sum --quiet -c "$tmp/sums") ||
    fail "$mode: files in the backing files differ from the guest's checksums"
  say "$mode ($disk): backing files hold a clean fs with the guest's files"
  rm -rf "$tmp/out" "$tmp/whole.img"
done
say "PASS"
