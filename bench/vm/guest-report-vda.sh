# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# bench/vm/guest-report-vda.sh - guest scenario of bench/vm-report.sh for
# qemu as the NBD client (sourced by tests/vm/guest-init.sh).  Each disk in
# $DISKS is a virtio disk that qemu serves through its own NBD client from
# a front on the host; the host counts what reached the front and its
# remote.  The workload is guest-report.sh's: mkfs.ext4, mount, unpack a
# source tree, sync, $FSYNC_LOOPS small writes each fsync'ed, umount.
for disk in $DISKS; do
  dev=/dev/$disk
  say "=== $dev"
  wait_dev $dev || fail "$disk: no $dev"
  mkfs.ext4 -q -F $dev || fail "$disk: mkfs.ext4"
  mount -t ext4 $dev /mnt || fail "$disk: mount"
  tar xzf /opt/bench/tree.tar.gz -C /mnt || fail "$disk: unpacking the tree"
  sync
  i=0
  while [ $i -lt "$FSYNC_LOOPS" ]; do
    dd if=/dev/urandom of=/mnt/db bs=512 count=1 seek=$((i % 64)) \
       conv=notrunc,fsync 2>/dev/null || fail "$disk: fsync loop"
    i=$((i + 1))
  done
  umount /mnt || fail "$disk: umount"
  say "$disk: done"
done
