# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# tests/vm/guest-nbd-multi.sh - guest scenario of
# tests/test-vm-nbd-multiconn.sh (sourced by guest-init.sh).  The plug in
# its default mode (writeback, no mode= given) serves two files in the
# guest's tmpfs; the kernel nbd driver attaches /dev/nbd0 with
# "nbd-client -C 4" (four connections, one per blk-mq hardware queue,
# which the driver refuses unless the server advertises multi-conn);
# mkfs.ext4, a tree of files, and on each of the 4 CPUs (taskset) an
# O_DIRECT file, so that every hardware queue, hence every connection,
# carries writes; sync, umount, disconnect.  A reconnect with -C 4 finds
# a clean fs (e2fsck -fn) with the same checksums; after nbdkit stops
# (exit 0 on SIGTERM), the two backing files joined are that same clean
# fs.  The statsfile and the plug's per-connection statistics
# (-D plug.stats=1, in nbdkit's log) go to the console for the host.
#
# Needs $CPUS (the guest's vCPUs, at least $CONNS) and $CONNS.
a=/tmp/a.img
b=/tmp/b.img
sock=/tmp/multi.sock
truncate -s "$SIZE_A" $a
truncate -s "$SIZE_B" $b

ncpu=$(nproc)
say "guest has $ncpu CPUs"
[ "$ncpu" -ge "$CONNS" ] ||
  fail "$ncpu CPUs: blk-mq would leave hardware queues without a CPU"

# Not start_plug: nbdkit's log (verbose, for the per-connection
# statistics) goes to a file, not to the console.
rm -f $sock
nbdkit -f -v -D plug.stats=1 -D nbdkit.backend.datapath=0 $TEST_NBDKIT_OPTS \
  -U $sock "$PLUGIN" $(plug_args file=$a file=$b stats-file=/tmp/stats.json) \
  2> /tmp/nbdkit.log &
NBDKIT_PID=$!
i=0
while [ ! -S $sock ]; do
  kill -0 $NBDKIT_PID 2>/dev/null || { cat /tmp/nbdkit.log; fail "nbdkit exited at start"; }
  i=$((i + 1))
  [ $i -lt 300 ] || fail "nbdkit did not start"
  sleep 0.1
done
say "nbdkit (pid $NBDKIT_PID) serving: ${PLUGIN##*/} $(plug_args file=$a file=$b)"

# wait_closed N: the stats-file= (written at each close) counts N
# connections: all of them closed, their data written.
wait_closed ()
{
  [ "$PLUGIN_KIND" = plug ] || return 0     # No stats-file= (negative controls).
  i=0
  while :; do
    n=$(sed -n 's/^  "connections": *\([0-9]*\).*/\1/p' /tmp/stats.json 2>/dev/null)
    [ "$n" = "$1" ] && return 0
    i=$((i + 1))
    [ $i -lt 600 ] || { echo "stats-file= counts '$n' connections, want $1"; return 1; }
    sleep 0.1
  done
}

# recv_workers DEV: "N R", the kernel threads that run DEV's receive
# work (one per connection, each looping on its socket until the
# connection ends), and how many of them are the workqueue's rescuer.
recv_workers ()
{
  n=0
  r=0
  # Shell built-ins only: a fork per process would make each look take
  # seconds on a loaded TCG guest.
  for t in /proc/[0-9]*; do
    { read -r comm < $t/comm; } 2>/dev/null || continue
    case "$comm" in
      *"${1#/dev/}-recv"*) ;;
      *) continue ;;
    esac
    st=
    { while read -r line; do st="$st $line"; done < $t/stack; } 2>/dev/null
    case "$st" in *recv_work*) ;; *) continue ;; esac
    n=$((n + 1))
    case "$st" in *rescuer_thread*) r=$((r + 1)) ;; esac
  done
  echo "$n $r"
}

# attach DEV: nbd-client -C $CONNS, then wait until every connection has
# a thread reading its replies.  The 6.1 driver queues one receive work
# per connection on a WQ_MEM_RECLAIM workqueue; when the guest cannot
# start a kworker in time (TCG on a loaded host), the workqueue's
# rescuer takes every pending work and runs them one after another, and
# the first never returns while its connection lives: the replies of
# the others are never read, their first request times out after 30 s
# and the kernel declares those connections dead.  That is the guest
# kernel's doing, not the server's (nbdkit has answered and waits for the
# next request), so such an attach is detached and made again, at most
# 3 times; the count goes to the host, which expects their connections
# in the statistics.
ATTACHES=0
attach ()
{
  tries=0
  while :; do
    ATTACHES=$((ATTACHES + 1))
    nbd_connect $sock $1 "-C $CONNS" || fail "nbd-client -C $CONNS"
    i=0
    while :; do
      read -r nrecv nrescued <<EOF2
$(recv_workers $1)
EOF2
      [ "$nrecv" -eq "$CONNS" ] && return 0
      i=$((i + 1))
      # Given time to start kworkers for the works the rescuer did not
      # take; those it took wait behind a work that never returns.
      [ "$nrescued" -gt 0 ] && [ $i -ge 50 ] && break
      [ $i -lt 300 ] ||
        fail "$1: $nrecv of $CONNS connections have a receive thread"
      sleep 0.1
    done
    tries=$((tries + 1))
    say "$1: the workqueue rescuer runs the receive work and only $nrecv of $CONNS connections are read: detaching, attaching again"
    [ $tries -lt 3 ] || fail "$1: the rescuer starved the receive works $tries times"
    nbd-client -d $1 || fail "nbd-client -d $1 (rescued attach)"
    wait_closed $((ATTACHES * CONNS)) ||
      fail "the connections of the rescued attach did not close"
  done
}

attach /dev/nbd0
FIRST_ATTACH=$ATTACHES
hwq=$(ls /sys/block/nbd0/mq | wc -l)
say "/dev/nbd0: $hwq hardware queues"
[ "$hwq" -eq "$CONNS" ] || fail "/dev/nbd0 has $hwq hardware queues, want $CONNS"
sectors=$(cat /sys/block/nbd0/size)
want=$(( ($(stat -c %s $a) + $(stat -c %s $b)) / 512 ))
[ "$sectors" -eq "$want" ] || fail "/dev/nbd0 has $sectors sectors, want $want"
mkfs.ext4 -q -F /dev/nbd0 || fail "mkfs.ext4"
mount -t ext4 /dev/nbd0 /mnt || fail "mount"
make_tree /mnt /tmp/sums || fail "writing files"
# One O_DIRECT file per CPU: its writes are submitted on that CPU, so
# they go to that CPU's hardware queue, which is one connection.
cpu=0
while [ $cpu -lt "$CONNS" ]; do
  taskset -c $cpu dd if=/dev/urandom of=/mnt/t/cpu$cpu.bin bs=4k count=256 \
    oflag=direct 2>/dev/null || fail "O_DIRECT writes on CPU $cpu"
  (cd /mnt && sha256sum t/cpu$cpu.bin) >> /tmp/sums
  cpu=$((cpu + 1))
done
sync
umount /mnt || fail "umount"
nbd-client -d /dev/nbd0 || fail "nbd-client -d"
wait_closed $((ATTACHES * CONNS)) || fail "the $CONNS connections did not close"
say "written, disconnected"

attach /dev/nbd1
hwq=$(ls /sys/block/nbd1/mq | wc -l)
[ "$hwq" -eq "$CONNS" ] || fail "/dev/nbd1 has $hwq hardware queues, want $CONNS"
fsck_clean /dev/nbd1 || fail "e2fsck over nbd"
mount -t ext4 -o ro /dev/nbd1 /mnt || fail "mount ro"
check_sums /mnt /tmp/sums || fail "checksums over nbd"
umount /mnt
nbd-client -d /dev/nbd1 || fail "nbd-client -d (2)"
wait_closed $((ATTACHES * CONNS)) || fail "the second $CONNS connections did not close"
say "reconnected with -C $CONNS: e2fsck clean, checksums match"

stop_plug
print_section stats /tmp/stats.json
echo "$ATTACHES $FIRST_ATTACH" > /tmp/attaches
print_section attaches /tmp/attaches
grep -o 'connection [0-9]*: client writes+zeros+trims=[0-9]* backend=[0-9]*' \
  /tmp/nbdkit.log > /tmp/conn-stats
print_section conn-stats /tmp/conn-stats

# The data really is in the backing files.
cat $a $b > /tmp/whole.img
rm -f $a $b
fsck_clean /tmp/whole.img || fail "e2fsck of the backing files"
rm -rf /tmp/out
mkdir /tmp/out
debugfs -R "rdump /t /tmp/out" /tmp/whole.img 2>/dev/null
check_sums /tmp/out /tmp/sums || fail "checksums in the backing files"
rm -rf /tmp/out /tmp/whole.img
say "backing files hold the same clean fs"
