#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# model-test itself: passes against nbdkit's memory plugin, and reports
# mismatches against the null plugin (which discards writes) and when
# --self-test corrupts its reference.  Needs no plug plugin.
source ./functions.sh
set -e
set -x

requires nbdkit --version
requires nbdkit memory --version
requires nbdkit null --version
requires test -x "$MODEL"
plug_tmpdir

start_server memory memory 16M
timeout 120 "$MODEL" --uri "$(server_uri memory)" --connections 4 --qd 32 \
        --ops 1000 --seed 1 --boundary 3M --boundary 8M --verify-all
stop_server memory

# null discards writes: reads return zeros, model-test must fail.
start_server null null 16M
if timeout 120 "$MODEL" --uri "$(server_uri null)" --connections 2 \
           --ops 200 --seed 1 > "$tmp/null.out" 2>&1; then
  cat "$tmp/null.out"
  echo "$0: model-test passed against the null plugin"
  exit 1
fi
grep '^MISMATCH: .* expected .* got 0x00' "$tmp/null.out"
grep 'the data read is zeros' "$tmp/null.out"
grep 'FAIL$' "$tmp/null.out"
stop_server null

# --self-test flips one reference byte under an in-flight read.
start_server self memory 16M
if timeout 120 "$MODEL" --uri "$(server_uri self)" --ops 400 --seed 5 \
           --self-test > "$tmp/self.out" 2>&1; then
  cat "$tmp/self.out"
  echo "$0: model-test --self-test passed"
  exit 1
fi
cat "$tmp/self.out"
grep '^MISMATCH: conn 0 op #[0-9]* read' "$tmp/self.out"
stop_server self
