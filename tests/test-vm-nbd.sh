#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-vm-nbd.sh - the Linux kernel NBD client against the plug, in a guest.
#
# One guest boot (TCG qemu, see vm/vm-lib.sh) runs nbdkit with the plug
# INSIDE the guest on two backing files (24M+40M, concatenated) in tmpfs, for
# mode=writeback and then mode=hold (vm/guest-nbd.sh).  It proves that:
#  * nbd-client (netlink) + mkfs.ext4 + mount + a tree of files (16M, 1M,
#    odd-sized and small ones) + sync + umount + disconnect works;
#  * a second connection (nbd-client -nonetlink, the ioctl path) sees a
#    clean fs (e2fsck -fn) with the same checksums;
#  * nbdkit exits 0 on SIGTERM and the two backing files, joined, hold the
#    same clean fs (e2fsck, debugfs rdump, checksums);
#  * every thread the plug started (plug-timer, 16 plug-io) is an I/O
#    flusher, nbdkit's main thread is not (PR_SET_IO_FLUSHER, root in the
#    guest has CAP_SYS_RESOURCE);
#  * the plug merges: its statsfile shows client write ops > backend write
#    ops, in both modes (checked on the host), with direct-size=1M (the
#    default in front of an NBD server; on local files the default, 64k,
#    writes the kernel's larger requests directly, and they do not merge:
#    "stats check: no merging: client write ops 248 <= backend write ops
#    248" in hold mode without it).
#
# Negative controls (this test can fail), each run once:
#  * nbdkit's null plugin ("cd tests && PLUGIN=null ./test-vm-nbd.sh"):
#    "VMTEST-ERROR: writeback: mount" (the fs just made is gone);
#  * a stand-in plugin that accepts the plug parameters but does not merge:
#    "stats check: no merging: client write ops 242 <= backend write ops 243".
source ./functions.sh
set -euo pipefail
source "${srcdir:-.}/vm/serve-lib.sh"
source "${srcdir:-.}/vm/vm-lib.sh"

vm_requires
plug_resolve
plug_tmpdir
vm_fetch

modes="writeback hold"
vm_initramfs "$tmp/initrd" "${srcdir:-.}/vm/guest-nbd.sh" \
  "MODES=$modes" SIZE_A=24M SIZE_B=40M
vm_run nbd || fail "guest test failed (see the console above)"

for mode in $modes; do
  vm_section "$tmp/nbd.log" "stats-$mode" > "$tmp/stats-$mode.json"
  /usr/bin/python3 - "$tmp/stats-$mode.json" "$mode" <<'PY' ||
import json, sys
path, mode = sys.argv[1], sys.argv[2]
s = json.load(open(path))
cw, bw = s["client"]["write"]["ops"], s["backend"]["write"]["ops"]
print("%s: connections=%s client write ops=%d bytes=%d, backend write ops=%d bytes=%d, flushes=%d"
      % (mode, s.get("connections"), cw, s["client"]["write"]["bytes"], bw,
         s["backend"]["write"]["bytes"], s["client"]["flush"]["ops"]))
errors = []
if s.get("mode") != mode:
    errors.append("statsfile says mode %r" % s.get("mode"))
if s.get("connections") != 2:
    errors.append("connections = %r, want 2" % s.get("connections"))
if cw == 0:
    errors.append("no client writes counted")
if not cw > bw:
    errors.append("no merging: client write ops %d <= backend write ops %d" % (cw, bw))
for e in errors:
    print("stats check: " + e)
sys.exit(1 if errors else 0)
PY
    fail "$mode: statistics check failed"
  # In front of a local /dev/nbd, as root: every thread the plug started
  # is an I/O flusher (PF_MEMALLOC_NOIO | PF_LOCAL_THROTTLE), nbdkit's
  # main thread is not (tests/test-io-flusher.sh on a host that allows
  # PR_SET_IO_FLUSHER).
  [ "${PLUGIN_KIND:-plug}" = plug ] || continue
  vm_section "$tmp/nbd.log" "threads-$mode" > "$tmp/threads-$mode"
  /usr/bin/python3 - "$tmp/threads-$mode" <<'PY' ||
import collections, sys
BITS = 0x00080000 | 0x00100000
n, flushers, main = collections.Counter(), collections.Counter(), None
lines = open(sys.argv[1]).read().split("\n")
tids = [l.split() for l in lines if l.strip()]
first = min(int(t[0]) for t in tids)
for tid, comm, flags in tids:
    have = int(flags) & BITS == BITS
    if int(tid) == first:
        main = have
    elif comm.startswith("plug-"):
        n[comm] += 1
        flushers[comm] += have
print("threads: %s; flushers: %s; main thread flusher: %s"
      % (dict(n), dict(flushers), main))
ok = (n["plug-timer"] == 1 and n["plug-io"] == 16 and n == flushers
      and main is False)
sys.exit(0 if ok else 1)
PY
    fail "$mode: not every plug thread is an I/O flusher"
done
say "PASS"
