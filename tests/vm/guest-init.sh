#!/bb/busybox sh
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# tests/vm/guest-init.sh - /init of the test guest (busybox ash, PID 1).
# Copied into the initramfs by vm_initramfs (vm-lib.sh).  Sets up the guest,
# loads the virtio and nbd modules, defines helpers, then sources the
# scenario (/vmtest/scenario.sh, one of tests/vm/guest-*.sh).  Results go
# to the serial console; the last line is "VMTEST-RESULT PASS|FAIL".
/bb/busybox --install -s /bb
export PATH=/usr/sbin:/usr/bin:/bb
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
. /etc/vmtest.conf

up () { cut -d' ' -f1 /proc/uptime; }
say () { echo "[guest $(up)s] $*"; }
finish ()
{
  echo "VMTEST-RESULT $1"
  sync
  poweroff -f
  sleep 10
}
fail ()
{
  echo "VMTEST-ERROR: $*"
  finish FAIL
}

# Guest watchdog: report instead of letting the host's timeout kill us.
( sleep "$GUEST_TIMEOUT"; echo "VMTEST-ERROR: guest watchdog fired"; finish FAIL ) &

say "boot done"
for m in $MODULES; do
  insmod "/modules/$m.ko" || fail "insmod $m"
done

# plug_args ARGS...: the plug parameters ARGS as the plugin under test takes
# them (see serve-lib.sh: the null and memory plugins get size=TOTAL).
plug_args ()
{
  if [ "$PLUGIN_KIND" = plug ]; then
    echo "$@" $TEST_NBDKIT_PARAMS
  else
    total=0
    for a; do
      case $a in
        file=*) total=$((total + $(stat -c %s "${a#file=}"))) ;;
      esac
    done
    echo "size=$total" $TEST_NBDKIT_PARAMS
  fi
}

# start_plug SOCK ARGS...: nbdkit serving the plugin on SOCK; sets NBDKIT_PID.
start_plug ()
{
  sock=$1
  shift
  rm -f "$sock"
  nbdkit -f $TEST_NBDKIT_OPTS -U "$sock" "$PLUGIN" $(plug_args "$@") &
  NBDKIT_PID=$!
  i=0
  while [ ! -S "$sock" ]; do
    kill -0 "$NBDKIT_PID" 2>/dev/null || return 1
    i=$((i + 1))
    [ $i -lt 300 ] || return 1
    sleep 0.1
  done
  say "nbdkit (pid $NBDKIT_PID) serving on $sock: $TEST_NBDKIT_OPTS ${PLUGIN##*/} $(plug_args "$@")"
}

# stop_plug: SIGTERM nbdkit and check it exits 0 within 60 s.
stop_plug ()
{
  kill "$NBDKIT_PID"
  i=0
  while kill -0 "$NBDKIT_PID" 2>/dev/null && [ $i -lt 600 ]; do
    i=$((i + 1))
    sleep 0.1
  done
  kill -0 "$NBDKIT_PID" 2>/dev/null && fail "nbdkit still running 60 s after SIGTERM"
  wait "$NBDKIT_PID"
  rc=$?
  [ $rc -eq 0 ] || fail "nbdkit exited with status $rc after SIGTERM"
}

# make_tree DIR SUMS: write a tree under DIR/t (a 16M file, a 1M one, an odd
# sized one, 40 small ones) and its checksums (relative to DIR) to SUMS.
make_tree ()
{
  mkdir -p "$1/t/sub/deep" || return 1
  dd if=/dev/urandom of="$1/t/big.bin" bs=1M count=16 2>/dev/null || return 1
  dd if=/dev/urandom of="$1/t/one.bin" bs=64k count=16 2>/dev/null || return 1
  head -c 12345 /dev/urandom > "$1/t/sub/deep/odd.bin" || return 1
  i=0
  while [ $i -lt 40 ]; do
    echo "file $i written at $(up)" > "$1/t/sub/f$i" || return 1
    i=$((i + 1))
  done
  (cd "$1" && find t -type f | sort | xargs sha256sum) > "$2" || return 1
}

# check_sums DIR SUMS: every file listed in SUMS matches under DIR.
check_sums ()
{
  out=$(cd "$1" && sha256sum -c "$2" 2>&1)
  rc=$?
  [ $rc -eq 0 ] && return 0
  echo "$out" | grep -v ': OK$'
  return 1
}

# nbd_connect SOCK DEV [nbd-client options]: connect DEV to the server on
# SOCK with 4k blocks and wait until the kernel has set its size (with
# -nonetlink, nbd-client returns before its child has done NBD_DO_IT).
nbd_connect ()
{
  nbd-client -unix "$1" "$2" -b 4096 $3 || return 1
  i=0
  while [ "$(cat /sys/block/${2#/dev/}/size)" = 0 ]; do
    i=$((i + 1))
    [ $i -lt 100 ] || { echo "$2 still has size 0"; return 1; }
    sleep 0.1
  done
}

# wait_dev DEV: wait up to 10 s for the block device to appear.
wait_dev ()
{
  i=0
  while [ ! -b "$1" ] && [ $i -lt 100 ]; do
    i=$((i + 1))
    sleep 0.1
  done
  [ -b "$1" ]
}

# fsck_clean DEV-OR-IMAGE: e2fsck -fn finds nothing.
fsck_clean ()
{
  e2fsck -fn "$1" > /tmp/fsck.log 2>&1 && return 0
  cat /tmp/fsck.log
  return 1
}

# print_section TAG FILE: FILE on the console between markers, with kernel
# messages held back so they do not interleave.
print_section ()
{
  read -r printk < /proc/sys/kernel/printk
  echo 1 > /proc/sys/kernel/printk
  echo "VMTEST-BEGIN $1"
  cat "$2"
  echo "VMTEST-END $1"
  echo "$printk" > /proc/sys/kernel/printk
}

. /vmtest/scenario.sh
finish PASS
