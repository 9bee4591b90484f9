#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Who issues an unplug's runs (glue_perform, backing_one_writer): the
# thread that unplugs issues every run of the unplug to one local
# regular file itself, one after another (the kernel's inode lock lets
# one write of a file proceed at a time), and hands runs of other files
# to the I/O pool.  A client holds N 4K writes per file in the plug,
# each with a gap after it (N runs per file), then sends a FLUSH, whose
# worker unplugs; statsfile "pooled" counts the runs the pool got:
#   one file:              32 runs, 0 pooled
#   three files:           3 x 8 runs, 16 pooled (the first file's 8 are
#                          the worker's, the other files' the pool's)
#   one file, -D plug.backend_delay_us=1000 (a backend whose operations
#   overlap):              32 runs, 31 pooled
# Every case also reads the files back.
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

cat > "$tmp/client.py" <<'EOF2'
import nbd, sys
uri, per, files = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
F = 1024 * 1024                 # Size of each file.
bs = 4096
h = nbd.NBD()
h.connect_uri(uri)
def data(f, j):
    return bytes([0x41 + f]) * (bs - 1) + bytes([j])
for j in range(per):
    for f in range(len(files)):
        h.pwrite(data(f, j), f * F + 2 * j * bs)
h.flush()
for f, name in enumerate(files):
    d = open(name, "rb").read()
    for j in range(per):
        if d[2 * j * bs:(2 * j + 1) * bs] != data(f, j):
            sys.exit("%s: block %d wrong after flush" % (name, 2 * j))
        if d[(2 * j + 1) * bs:(2 * j + 2) * bs] != b"\0" * bs:
            sys.exit("%s: gap %d written" % (name, 2 * j + 1))
h.shutdown()
print("data ok")
EOF2

# check CASE NFILES PER WANT_RUNS WANT_POOLED [nbdkit options]
check ()
{
  local name=$1 nfiles=$2 per=$3 want_runs=$4 want_pooled=$5 i
  shift 5
  local files=() params=()
  for ((i = 0; i < nfiles; ++i)); do
    truncate -s 1M "$tmp/$name$i"
    files+=("$tmp/$name$i")
    params+=(file="$tmp/$name$i")
  done
  # direct=never, idle=10s, max-delay=60s: every write waits in the
  # plug until the FLUSH.
  start_plug "$name" "$@" -- "${params[@]}" mode=writeback \
             direct=never idle=10s max-delay=60s \
             stats-file="$tmp/$name.json"
  timeout 60 /usr/bin/python3 "$tmp/client.py" "$(server_uri "$name")" \
          "$per" "${files[@]}"
  stop_server "$name"
  cat "$tmp/$name.json"
  /usr/bin/python3 - "$tmp/$name.json" "$want_runs" "$want_pooled" <<'EOF2'
import json, sys
st = json.load(open(sys.argv[1]))
want_runs, want_pooled = int(sys.argv[2]), int(sys.argv[3])
runs, pooled = st["backend"]["write"]["ops"], st["pooled"]
u = {k: v for k, v in st["unplugs"].items() if v}
print("runs %d pooled %d unplugs %r" % (runs, pooled, u))
if u != {"flush": 1}:
    sys.exit("unplugs %r: expected only the FLUSH's" % u)
if runs != want_runs:
    sys.exit("backend writes %d, expected %d" % (runs, want_runs))
if pooled != want_pooled:
    sys.exit("pooled %d, expected %d" % (pooled, want_pooled))
EOF2
}

check one 1 32 32 0
check three 3 8 24 16
check delay 1 32 32 31 -D plug.backend_delay_us=1000
