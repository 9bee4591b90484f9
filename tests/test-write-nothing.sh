#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# A write call that writes nothing (pwrite or pwritev returning 0 for a
# count above 0, as a device driver may at its end) is an error
# (ENOSPC), not a short write to go on with forever.
# tests/shim-pwritev.so with SHIM_ZERO=1 (LD_PRELOAD into nbdkit only)
# makes every pwrite and pwritev of the backing file that touches
# [0, 1 MiB) write nothing and return 0.
#  1. hold mode: two adjacent 4 KiB writes at 0, in flight together
#     (one merged pwritev, or two pwrites): each fails with ENOSPC;
#  2. writeback mode, idle=10s max-delay=60s direct=never: two adjacent
#     4 KiB writes at 0 (acknowledged, held), then a FLUSH, which fails
#     with ENOSPC;
# then in both a write at 2 MiB and a FLUSH succeed, nbdkit exits with
# status 0 after SIGTERM, and the shim counted the calls it answered
# with 0.  Each client runs under timeout: a server that spins on the
# 0 never answers, and the client then fails on its own (its error is
# what is asserted, not a duration).
# Shown able to fail: with write_iov (plugin/file.c) taking a 0 as
# progress, as it did, the client times out (the pool thread spins).
source ./functions.sh
set -e
set -x

requires_python_nbd
# SHIM_PWRITEV: see functions.sh
test -f "$SHIM_PWRITEV" || fail "$SHIM_PWRITEV not built"

plug_tmpdir

# client.py MODE URI
cat > "$tmp/client.py" <<'EOF'
import nbd, sys
mode, uri = sys.argv[1:3]
K = 4096
M = 1 << 20
h = nbd.NBD()
h.connect_uri(uri)
errs = []


def record(err):
    errs.append(err.value)
    return 1


def expect_enospc(what, f):
    try:
        f()
    except nbd.Error as ex:
        print("%s failed: %s" % (what, ex))
        if ex.errno != "ENOSPC":
            sys.exit("%s failed with %s, expected ENOSPC" % (what, ex.errno))
        return
    sys.exit("%s succeeded: nothing was written" % what)


if mode == "hold":
    for i in range(2):
        h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(b"x" * K)), i * K,
                     completion=record)
    while h.aio_in_flight() > 0:
        h.poll(-1)
    print("the two writes answered with errno %r" % errs)
    if len(errs) != 2 or any(e != 28 for e in errs):    # 28: ENOSPC
        sys.exit("expected both writes to fail with ENOSPC (28)")
else:
    h.pwrite(b"x" * K, 0)
    h.pwrite(b"y" * K, K)
    expect_enospc("the FLUSH", h.flush)

h.pwrite(b"z" * K, 2 * M)
if mode == "hold":
    h.flush()
else:
    # The lost writes stand until written again: every FLUSH says so.
    expect_enospc("the next FLUSH", h.flush)
h.shutdown()
EOF

for mode in hold writeback; do
  img=$tmp/$mode.img
  truncate -s 4M "$img"
  rm -f "$tmp/$mode.count"
  params=(mode=$mode)
  [ $mode = writeback ] && params+=(idle=10s max-delay=60s direct=never)
  SERVER_WRAP="env LD_PRELOAD=$SHIM_PWRITEV SHIM_PATH=$img SHIM_ZERO=1 SHIM_FAIL_LO=0 SHIM_FAIL_HI=$((1 << 20)) SHIM_COUNT=$tmp/$mode.count" \
    start_plug $mode file="$img" "${params[@]}"
  timeout 60 /usr/bin/python3 "$tmp/client.py" $mode "$(server_uri $mode)" || {
    server_running $mode
    fail "$mode: the client failed"
  }
  stop_server $mode
  n=$(cat "$tmp/$mode.count" 2>/dev/null || echo 0)
  echo "$mode: the shim answered $n calls with 0"
  test "$n" -gt 0 || fail "$mode: the shim answered no call with 0"
done
