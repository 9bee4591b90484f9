#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Hold mode keeps the data of random concurrent operations: reads during
# the run, a full read at the end and the backing files after the server
# exited all match model-test's reference.
source ./functions.sh
set -e

source "$srcdir/model-lib.sh"

# Concat of odd-sized files: file boundaries at 3M and 8M.
# One file: the usual export, whose requests are never split.
model_run hold-one concat:16M hold -- \
          --qd 32 --ops 1000 --seed 15
model_run hold-concat concat:3M,5M,8M hold -- \
          --qd 32 --ops 1500 --seed 11
# RAID-0, 64K stripes: every connection crosses stripe edges; every
# request through the plug (direct=never).
model_run hold-stripe stripe:64K:3:4M hold direct=never -- \
          --qd 64 --ops 1500 --seed 12
# One nbdkit thread per connection: a held request must be dispatched
# without waiting for a next request that can never arrive.
model_run hold-t1 concat:3M,5M,8M hold --threads=1 -- \
          --qd 16 --ops 500 --seed 13
