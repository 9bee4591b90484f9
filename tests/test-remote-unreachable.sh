#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# An NBD server that cannot be reached at start, on a unix socket and on
# TCP 127.0.0.1 (a port nobody listens on): nbdkit exits non-zero before
# it serves, and the error names the URI and gives libnbd's reason.
source ./functions.sh
set -e

test -f "$PLUGIN"
plug_tmpdir

# ---- unreachable at start ----
for uri in "nbd+unix:///?socket=$tmp/nothing.sock" \
           "nbd://127.0.0.1:$(free_port)/"; do
  rc=0
  nbdkit -U "$tmp/refused.sock" "$PLUGIN" "file=$uri" --run true \
         2> "$tmp/start.err" || rc=$?
  cat "$tmp/start.err"
  [ $rc -ne 0 ]
  grep -q "file=$uri: cannot connect to the NBD server: .*connect" \
       "$tmp/start.err"
done

echo "both refused at start with the URI and libnbd's reason"
