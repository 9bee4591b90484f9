#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-vm-crash.sh - crash consistency of mode=writeback through a real
# client: the Linux kernel NBD driver and ext4, in a guest.
#
# One guest boot (TCG qemu, see vm/vm-lib.sh; scenario vm/guest-crash.sh):
# nbdkit with the plug in mode=writeback idle=10s max-delay=60s on two
# backing files (24M+40M) in the guest's tmpfs; nbd-client, mkfs.ext4,
# mount, a tree of files, sync (FLUSH), checksums; then one O_DIRECT write
# that is acknowledged but not flushed, and kill -9 nbdkit.  This proves:
#  * the unflushed write really sat in the plug (it is not in the backing
#    files after the kill), so the test exercises lost write-back data;
#  * everything acknowledged before the FLUSH survives: after restarting
#    nbdkit on the same files and reconnecting (nbd-client -nonetlink), ext4
#    replays its journal, every file written before the sync has its
#    checksum, and e2fsck -fn is clean.
#
# Negative controls (this test can fail), each run once:
#  * nbdkit's null plugin ("cd tests && PLUGIN=null ./test-vm-crash.sh"):
#    "VMTEST-ERROR: mount" (the fs just made is gone);
#  * the plug with FLUSH/FUA dropped in front of it ("TEST_NBDKIT_OPTS=
#    --filter=fua TEST_NBDKIT_PARAMS=fuamode=discard ./test-vm-crash.sh"):
#    "VMTEST-ERROR: synced data missing: block 6164 of t/one.bin is not in
#    /tmp/b.img at offset 81920 (FLUSH did not make it durable)";
#  * a stand-in plugin with no plug (writes go straight to the files):
#    "VMTEST-ERROR: the unflushed write reached /tmp/b.img before the kill:
#    it did not sit in the plug".
source ./functions.sh
set -euo pipefail
source "${srcdir:-.}/vm/serve-lib.sh"
source "${srcdir:-.}/vm/vm-lib.sh"

vm_requires
plug_resolve
plug_tmpdir
vm_fetch

# direct=never: the requests must wait in the plug (with the default,
# a request that cannot merge would be written at once instead).
vm_initramfs "$tmp/initrd" "${srcdir:-.}/vm/guest-crash.sh" \
  SIZE_A=24M SIZE_B=40M "PLUG_PARAMS=idle=10s max-delay=60s direct=never"
vm_run crash || fail "guest test failed (see the console above)"
say "PASS"
