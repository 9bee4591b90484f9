#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# An NBD server that requires TLS (nbdkit --tls=require with a PSK):
# file=nbds+unix://USER@/?socket=...&tls-psk-file=... works (libnbd
# parses the URI and reads the key file), data reaches the server; the
# same server as plain nbd+unix:// is refused at start with libnbd's
# reason.
source ./functions.sh
set -e

requires /usr/bin/python3 -c 'import nbd'
test -f "$PLUGIN"
nbdkit --dump-config | grep -q '^tls=yes$' || {
  echo "$0: nbdkit without TLS: test skipped"; exit 77; }
nbdkit "$PLUGIN" --dump-plugin | grep -q '^plug_remote_tls=yes$' || {
  echo "$0: libnbd without TLS: test skipped"; exit 77; }

plug_tmpdir
source "$srcdir/remote-lib.sh"

/usr/bin/python3 -c 'import os
print("alice:" + os.urandom(32).hex())' > "$tmp/keys.psk"
chmod 600 "$tmp/keys.psk"
srv_start tls unix --tls=require --tls-psk="$tmp/keys.psk" memory 8M
uri="nbds+unix://alice@/?socket=$tmp/tls.sock&tls-psk-file=$tmp/keys.psk"

srv_start plug unix "$PLUGIN" "file=$uri"
/usr/bin/python3 - "${srv_uri[plug]}" <<'EOF2'
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"T" * 65536, 0)
h.flush()
assert h.pread(65536, 0) == b"T" * 65536
h.shutdown()
EOF2
srv_stop plug

# What the server holds, read over TLS directly.
/usr/bin/python3 - "$uri" <<'EOF2'
import nbd, sys
h = nbd.NBD()
h.set_uri_allow_local_file(True)
h.connect_uri(sys.argv[1])
assert h.pread(65536, 0) == b"T" * 65536, "data not on the TLS server"
h.shutdown()
EOF2

rc=0
nbdkit -U "$tmp/refused.sock" "$PLUGIN" "file=${srv_uri[tls]}" --run true \
       2> "$tmp/plain.err" ||
  rc=$?
cat "$tmp/plain.err"
[ $rc -ne 0 ]
grep -q "file=${srv_uri[tls]}: cannot connect to the NBD server: .*TLS" \
     "$tmp/plain.err"
srv_stop tls
