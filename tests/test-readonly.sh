#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-readonly.sh - with nbdkit -r the export refuses writes and serves
# reads.
#
# Two files with known data, concatenated, served with -r in both modes:
# the handle is read-only, write, zero and trim fail (also when sent
# by a non-strict libnbd handle: the server answers EPERM), a read across
# the boundary returns the data, and the files are unchanged.
source ./functions.sh
set -e
set -x

requires nbdkit --version
requires nbdsh_sys --version
plug_tmpdir

/usr/bin/python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256)) * 4096)' \
        > "$tmp/0.img"
/usr/bin/python3 -c 'import sys; sys.stdout.buffer.write(b"\x5a" * 65536)' \
        > "$tmp/1.img"
cat "$tmp/0.img" "$tmp/1.img" > "$tmp/expected"

for mode in writeback hold; do
  start_plug $mode -r -- "$tmp/0.img" "$tmp/1.img" mode=$mode
  nbdsh_sys -u "$(server_uri $mode)" -c - <<'EOF'
import errno
M = 1024 * 1024
assert h.is_read_only()
assert h.get_size() == M + 65536
# libnbd refuses writes to a read-only export itself; a second handle
# with strict mode off sends them, and the server must refuse (EPERM).
h2 = nbd.NBD()
h2.set_strict_mode(0)
h2.connect_uri(h.get_uri())
for hh in (h, h2):
    for what, fn in [("write", lambda: hh.pwrite(b"x" * 512, M - 256)),
                     ("zero", lambda: hh.zero(512, M - 256)),
                     ("trim", lambda: hh.trim(512, M - 256))]:
        try:
            fn()
        except nbd.Error as e:
            assert hh is h or e.errnum == errno.EPERM, e
        else:
            raise AssertionError("%s succeeded on a read-only export" % what)
assert h.pread(512, M - 256) == bytes(range(256)) + b"\x5a" * 256
h.flush()
EOF
  stop_server $mode
  cat "$tmp/0.img" "$tmp/1.img" | cmp - "$tmp/expected"
done
