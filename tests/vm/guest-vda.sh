# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# tests/vm/guest-vda.sh - guest scenario of tests/test-vm-qemu-drive.sh
# (sourced by guest-init.sh).  For each disk in $DISKS (virtio disks that
# qemu serves from the host's nbdkit through its NBD client): mkfs.ext4,
# mount, write a tree of files, sync, umount, drop caches, e2fsck -fn, mount
# read-only and verify the checksums; then print the checksums for the host,
# which checks the backing files after the guest is gone.
for disk in $DISKS; do
  dev=/dev/$disk
  say "=== $dev"
  wait_dev $dev || fail "$disk: no $dev"
  say "$disk: $(cat /sys/block/$disk/size) sectors"
  mkfs.ext4 -q -F $dev || fail "$disk: mkfs.ext4"
  mount -t ext4 $dev /mnt || fail "$disk: mount"
  make_tree /mnt /tmp/sums-$disk || fail "$disk: writing files"
  sync
  umount /mnt || fail "$disk: umount"
  echo 3 > /proc/sys/vm/drop_caches
  fsck_clean $dev || fail "$disk: e2fsck"
  mount -t ext4 -o ro $dev /mnt || fail "$disk: mount ro"
  check_sums /mnt /tmp/sums-$disk || fail "$disk: checksums"
  umount /mnt
  say "$disk: e2fsck clean, checksums match"
  print_section "sums-$disk" /tmp/sums-$disk
done
