#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-vm-nbd-multiconn.sh - the Linux kernel NBD client with 4
# connections per device ("nbd-client -C 4") against the plug in its
# default mode (writeback), in a guest.
#
# One guest boot (TCG qemu, see vm/vm-lib.sh) with 4 vCPUs (blk-mq maps
# each CPU to one hardware queue and nbd each hardware queue to one
# connection: with fewer CPUs than connections some would carry
# nothing) runs nbdkit with the plug INSIDE the guest on two backing
# files (24M+40M, concatenated) in tmpfs (vm/guest-nbd-multi.sh).  It
# proves that:
#  * the kernel accepts -C 4 (it refuses a server without multi-conn),
#    and /dev/nbd0 has 4 hardware queues;
#  * mkfs.ext4 + mount + a tree of files + one O_DIRECT file written on
#    each CPU + sync + umount + disconnect works;
#  * a reconnect with -C 4 sees a clean fs (e2fsck -fn) with the same
#    checksums;
#  * nbdkit exits 0 on SIGTERM and the two backing files, joined, hold
#    the same clean fs (e2fsck, debugfs rdump, checksums);
#  * (checked here, on the host) the statsfile says mode writeback and
#    8 connections, and shows merging: client write ops > backend write
#    ops; the plug's per-connection statistics show that each of the 4
#    connections of the first attach carried writes.  (An attach whose
#    receive works the guest kernel's workqueue rescuer starved, which a
#    loaded host provokes, is detached and made again by the guest; its
#    4 connections are then expected too: see vm/guest-nbd-multi.sh.)
#
# Negative control: nbdkit's memory plugin advertises multi-conn and
# keeps the data, but only in RAM ("cd tests && PLUGIN=memory
# ./test-vm-nbd-multiconn.sh"): "VMTEST-ERROR: e2fsck of the backing
# files".
source ./functions.sh
set -euo pipefail
source "${srcdir:-.}/vm/serve-lib.sh"
source "${srcdir:-.}/vm/vm-lib.sh"

vm_requires
plug_resolve
plug_tmpdir
vm_fetch

CONNS=4
vm_initramfs "$tmp/initrd" "${srcdir:-.}/vm/guest-nbd-multi.sh" \
  SIZE_A=24M SIZE_B=40M CONNS=$CONNS
# A later -smp overrides vm_run's "-smp 2".
vm_run nbd-multi -smp $CONNS || fail "guest test failed (see the console above)"

vm_section "$tmp/nbd-multi.log" stats > "$tmp/stats.json"
vm_section "$tmp/nbd-multi.log" conn-stats > "$tmp/conn-stats"
vm_section "$tmp/nbd-multi.log" attaches > "$tmp/attaches"
/usr/bin/python3 - "$tmp/stats.json" "$tmp/conn-stats" "$CONNS" \
  "$tmp/attaches" <<'PY' ||
import json, re, sys
path, conn_path, conns = sys.argv[1], sys.argv[2], int(sys.argv[3])
# Attaches the guest made (an attach whose receive works the guest
# kernel's workqueue rescuer starved is detached and made again), and
# which of them is the first one that was used.
attaches, first = (int(x) for x in open(sys.argv[4]).read().split())
if attaches > 2:
    print("the guest attached %d times (%d starved by its kernel)"
          % (attaches, attaches - 2))
s = json.load(open(path))
cw, bw = s["client"]["write"]["ops"], s["backend"]["write"]["ops"]
print("connections=%s client write ops=%d bytes=%d, backend write ops=%d "
      "bytes=%d, flushes=%d, unplugs %s"
      % (s.get("connections"), cw, s["client"]["write"]["bytes"], bw,
         s["backend"]["write"]["bytes"], s["client"]["flush"]["ops"],
         {k: v for k, v in s["unplugs"].items() if v}))
per = []
for line in open(conn_path):
    m = re.match(r"connection (\d+): client writes\+zeros\+trims=(\d+) "
                 r"backend=(\d+)", line)
    if m:
        per.append(tuple(int(x) for x in m.groups()))
for cid, cm, bm in per:
    print("  connection %d: client writes+zeros+trims %d, backend %d"
          % (cid, cm, bm))
errors = []
if s.get("mode") != "writeback":
    errors.append("statsfile says mode %r, want writeback (the default)"
                  % s.get("mode"))
if s.get("connections") != attaches * conns:
    errors.append("connections = %r, want %d" % (s.get("connections"),
                                                 attaches * conns))
if cw == 0:
    errors.append("no client writes counted")
if not cw > bw:
    errors.append("no merging: client write ops %d <= backend write ops %d"
                  % (cw, bw))
# The guest waited for each attach's connections to close before it
# attached again, so they are logged attach by attach.
if len(per) != attaches * conns:
    errors.append("%d per-connection statistics lines, want %d"
                  % (len(per), attaches * conns))
else:
    used = per[(first - 1) * conns:first * conns]
    idle = [cid for cid, cm, _ in used if cm == 0]
    if idle:
        errors.append("connections %s of the first attach carried no "
                      "writes" % idle)
for e in errors:
    print("stats check: " + e)
sys.exit(1 if errors else 0)
PY
  fail "statistics check failed"
say "PASS"
