#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Writeback mode keeps the data of random concurrent operations: reads
# during the run, a full read at the end and the backing files after the
# server exited all match model-test's reference.
source ./functions.sh
set -e

source "$srcdir/model-lib.sh"

# One file: the usual export, whose requests are never split.
model_run wb-one concat:16M writeback -- \
          --qd 32 --ops 1500 --seed 5
# Concat of odd-sized files: file boundaries at 3M and 8M.
model_run wb-concat concat:3M,5M,8M writeback -- \
          --qd 32 --ops 1500 --seed 1
# RAID-0, 64K stripes: every connection crosses stripe edges.
model_run wb-stripe stripe:64K:3:4M writeback direct=never -- \
          --qd 64 --ops 1500 --seed 2
# Small limits: many max-requests/max-bytes unplugs and short merges;
# direct=never: every request goes through the plug (the other runs mix
# plugged requests with the direct path for those that cannot merge).
model_run wb-tight concat:3M,5M,8M writeback \
          max-requests=4 max-bytes=64k max-merge=32k direct=never -- \
          --qd 16 --ops 1000 --seed 3 --fua-all
# Files whose sizes are not multiples of 512.
model_run wb-unaligned concat:1049088,2093056,1000000 writeback -- \
          --qd 32 --ops 1000 --seed 4 --chunk 68K
