# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# bench/vm/guest-report.sh - guest scenario of bench/vm-report.sh (sourced
# by tests/vm/guest-init.sh).  For each front in $FRONTS, inside the
# guest: a remote (nbdkit memory behind /opt/bench/delay-us.so, writes
# costing $DELAY_US, its counts at unload), the front serving it, the
# kernel nbd driver on the front, then a real workload: mkfs.ext4, mount,
# unpack a source tree (/opt/bench/tree.tar.gz), sync, a loop of
# $FSYNC_LOOPS small writes each followed by fsync (dd conv=fsync, as a
# database commits), umount, disconnect.  delay-us.so also sits
# outermost on the front, so it counts what the kernel sent.  Output per
# front: "VMREPORT FRONT client WRITES FUA FLUSHES ZEROES TRIMS remote
# WRITES FUA FLUSHES ZEROES TRIMS seconds S".

counts () { cat "$1"; }   # "writes N fua N flushes N zeroes N trims N"

# wait_sock SOCK PID
wait_sock ()
{
  i=0
  while [ ! -S "$1" ]; do
    kill -0 "$2" 2>/dev/null || return 1
    i=$((i + 1))
    [ $i -lt 300 ] || return 1
    sleep 0.1
  done
}

# stop PID NAME: SIGTERM, the exit status must be 0.
stop ()
{
  kill "$1"
  wait "$1"
  rc=$?
  [ $rc -eq 0 ] || fail "$2 exited with status $rc"
}

D=/opt/bench/delay-us.so
n=0
for front in $FRONTS; do
  say "=== $front"
  rm -f /tmp/remote.sock /tmp/front.sock /tmp/remote.counts /tmp/client.counts
  nbdkit -f -U /tmp/remote.sock --filter=$D memory 512M \
    write-us=$DELAY_US counts=/tmp/remote.counts &
  rpid=$!
  wait_sock /tmp/remote.sock $rpid || fail "$front: remote did not start"
  uri="nbd+unix:///?socket=/tmp/remote.sock"
  case $front in
    proxy)     set -- nbd uri=$uri ;;
    cache)     set -- --filter=cache nbd uri=$uri cache=writeback ;;
    plug)      set -- "$PLUGIN" file=$uri ;;
    plug-hold) set -- "$PLUGIN" file=$uri mode=hold ;;
    *) fail "unknown front $front" ;;
  esac
  nbdkit -f -U /tmp/front.sock --filter=$D "$@" counts=/tmp/client.counts &
  fpid=$!
  wait_sock /tmp/front.sock $fpid || fail "$front: front did not start"
  dev=/dev/nbd$n
  n=$((n + 1))
  t0=$(up)
  nbd_connect /tmp/front.sock $dev || fail "$front: nbd-client"
  mkfs.ext4 -q -F $dev || fail "$front: mkfs.ext4"
  mount -t ext4 $dev /mnt || fail "$front: mount"
  tar xzf /opt/bench/tree.tar.gz -C /mnt || fail "$front: unpacking the tree"
  sync
  i=0
  while [ $i -lt "$FSYNC_LOOPS" ]; do
    dd if=/dev/urandom of=/mnt/db bs=512 count=1 seek=$((i % 64)) \
       conv=notrunc,fsync 2>/dev/null || fail "$front: fsync loop"
    i=$((i + 1))
  done
  umount /mnt || fail "$front: umount"
  nbd-client -d $dev || fail "$front: nbd-client -d"
  t1=$(up)
  stop $fpid "$front"
  stop $rpid "$front's remote"
  echo "VMREPORT $front client $(counts /tmp/client.counts) remote $(counts /tmp/remote.counts) seconds $(awk -v a=$t0 -v b=$t1 'BEGIN { printf "%.1f", b - a }')"
done
finish PASS
