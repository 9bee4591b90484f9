# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# tests/vm/guest-nbd.sh - guest scenario of tests/test-vm-nbd.sh (sourced by
# guest-init.sh).  For each mode in $MODES: the plug serves two files in the
# guest's tmpfs; the kernel nbd driver (nbd-client, netlink) gets ext4 and a
# tree of files; after a disconnect a second connection (ioctl path,
# -nonetlink) finds a clean fs with the same checksums; after nbdkit stops,
# the two backing files joined are that same clean fs.  The statistics and
# the flags of nbdkit's threads go to the console for the host to check.
n=0
for mode in $MODES; do
  say "=== mode=$mode"
  a=/tmp/$mode-a.img
  b=/tmp/$mode-b.img
  truncate -s "$SIZE_A" "$a"
  truncate -s "$SIZE_B" "$b"
  dev1=/dev/nbd$n
  dev2=/dev/nbd$((n + 1))
  n=$((n + 2))
  # direct-size=1M, the default in front of an NBD server: the files
  # stand for a backend that charges per operation, so that the kernel's
  # 64-128 KiB requests merge too (on local files they are written
  # directly by default, which the host's merge check would not see).
  start_plug /tmp/$mode.sock file=$a file=$b mode=$mode direct-size=1M \
    stats-file=/tmp/stats-$mode.json || fail "$mode: nbdkit did not start"

  nbd_connect /tmp/$mode.sock $dev1 || fail "$mode: nbd-client"
  sectors=$(cat /sys/block/${dev1#/dev/}/size)
  want=$(( ($(stat -c %s $a) + $(stat -c %s $b)) / 512 ))
  [ "$sectors" -eq "$want" ] || fail "$mode: $dev1 has $sectors sectors, want $want"
  mkfs.ext4 -q -F $dev1 || fail "$mode: mkfs.ext4"
  # Each thread of nbdkit: TID, name, flags (field 9 of its stat), for
  # the host's I/O flusher check.
  for t in /proc/$NBDKIT_PID/task/*; do
    echo "${t##*/} $(cat $t/comm) $(sed 's/.*) //' $t/stat | cut -d' ' -f7)"
  done > /tmp/threads-$mode
  print_section "threads-$mode" /tmp/threads-$mode
  mount -t ext4 $dev1 /mnt || fail "$mode: mount"
  make_tree /mnt /tmp/sums-$mode || fail "$mode: writing files"
  sync
  umount /mnt || fail "$mode: umount"
  nbd-client -d $dev1 || fail "$mode: nbd-client -d"
  say "$mode: written, disconnected"

  nbd_connect /tmp/$mode.sock $dev2 -nonetlink ||
    fail "$mode: reconnect (-nonetlink)"
  fsck_clean $dev2 || fail "$mode: e2fsck over nbd"
  mount -t ext4 -o ro $dev2 /mnt || fail "$mode: mount ro"
  check_sums /mnt /tmp/sums-$mode || fail "$mode: checksums over nbd"
  umount /mnt
  nbd-client -d $dev2 || fail "$mode: nbd-client -d (2)"
  say "$mode: e2fsck clean, checksums match"

  stop_plug
  print_section "stats-$mode" /tmp/stats-$mode.json

  # The data really is in the backing files.
  cat $a $b > /tmp/whole.img
  rm -f $a $b
  fsck_clean /tmp/whole.img || fail "$mode: e2fsck of the backing files"
  rm -rf /tmp/out
  mkdir /tmp/out
  debugfs -R "rdump /t /tmp/out" /tmp/whole.img 2>/dev/null
  check_sums /tmp/out /tmp/sums-$mode || fail "$mode: checksums in the backing files"
  rm -rf /tmp/out /tmp/whole.img
  say "$mode: backing files hold the same clean fs"
done
