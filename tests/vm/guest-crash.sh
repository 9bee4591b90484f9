# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# tests/vm/guest-crash.sh - guest scenario of tests/test-vm-crash.sh (sourced
# by guest-init.sh).  The plug (mode=writeback, long idle and max-delay so
# that acknowledged writes really sit in it) serves two files in tmpfs; ext4
# on the kernel nbd client gets a tree of files and a sync (FLUSH); then one
# more write that is not flushed (O_DIRECT, so it reaches the plug at once),
# and nbdkit is killed with SIGKILL.  After a restart on the same files and
# a new connection, the journal replays (mount), every file written before
# the sync has its checksum, and e2fsck -fn is clean.
a=/tmp/a.img
b=/tmp/b.img
truncate -s "$SIZE_A" $a
truncate -s "$SIZE_B" $b
args="file=$a file=$b mode=writeback $PLUG_PARAMS"
marker=NBDPLUG-UNFLUSHED-MARKER

start_plug /tmp/c1.sock $args || fail "nbdkit did not start"
nbd_connect /tmp/c1.sock /dev/nbd0 || fail "nbd-client"
# No lazy inode table / journal init: no background writes of ext4lazyinit
# (they could fill the plug and unplug it behind the test's back).
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 /dev/nbd0 ||
  fail "mkfs.ext4"
# commit=60: no journal commit (with its FLUSH) between the sync and the kill.
mount -t ext4 -o commit=60,noinit_itable /dev/nbd0 /mnt || fail "mount"
make_tree /mnt /tmp/sums || fail "writing files"
sync
say "files written and synced (FLUSH sent)"

# An acknowledged but unflushed write: overwrite the first 4k of t/one.bin
# in place with O_DIRECT (straight to the device, no flush).  The checksums
# above keep the old contents: this write must vanish.  Where the block lives
# in the backing files (ext4 block size 4k; a.img comes first):
blk=$(debugfs -R "bmap /t/one.bin 0" /dev/nbd0 2>/dev/null)
case $blk in ''|*[!0-9]*) fail "debugfs bmap: '$blk'" ;; esac
off=$((blk * 4096))
if [ $off -lt $(stat -c %s $a) ]; then
  bfile=$a
else
  bfile=$b
  off=$((off - $(stat -c %s $a)))
fi
head -c 4096 /mnt/t/one.bin > /tmp/old-block
yes $marker | head -c 4096 > /tmp/marker
dd if=/tmp/marker of=/mnt/t/one.bin bs=4096 count=1 conv=notrunc oflag=direct \
  2>/dev/null || fail "O_DIRECT write"
kill -9 "$NBDKIT_PID"
wait "$NBDKIT_PID"
say "nbdkit killed (SIGKILL)"
dd if=$bfile of=/tmp/now-block bs=4096 skip=$((off / 4096)) count=1 2>/dev/null
if cmp -s /tmp/now-block /tmp/marker; then
  fail "the unflushed write reached $bfile before the kill: it did not sit in the plug ($args)"
fi
cmp -s /tmp/now-block /tmp/old-block ||
  fail "synced data missing: block $blk of t/one.bin is not in $bfile at offset $off (FLUSH did not make it durable)"
say "the unflushed write (block $blk) was held in the plug and is lost"

# Forget the dead connection.
umount -l /mnt
nbd-client -d /dev/nbd0 > /dev/null 2>&1

start_plug /tmp/c2.sock $args || fail "nbdkit did not restart"
nbd_connect /tmp/c2.sock /dev/nbd1 -nonetlink || fail "reconnect"
mount -t ext4 /dev/nbd1 /mnt || fail "mount after the crash (journal replay)"
check_sums /mnt /tmp/sums || fail "files synced before the crash differ"
umount /mnt || fail "umount after the crash"
say "journal replayed, all synced files match"
fsck_clean /dev/nbd1 || fail "e2fsck after the crash"
say "e2fsck clean"
nbd-client -d /dev/nbd1 || fail "nbd-client -d"
stop_plug
