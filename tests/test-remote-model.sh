#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# The model test on exports made of two NBD servers (nbdkit memory, one
# on a unix socket, one on TCP 127.0.0.1) and one local file,
# concatenated and striped, in both modes, with several connections:
# every read during the run, the full read at the end, and what the
# servers and the file hold after the plug exited match the reference.
source ./functions.sh
set -e

requires nbdcopy --version
source "$srcdir/model-lib.sh"
source "$srcdir/remote-lib.sh"

# Concat: remote, local, remote, with boundaries at 3M and 5M.
model_run_remote rm-wb-concat concat:3M,2M,3M writeback unix,local,tcp -- \
                 --qd 32 --ops 1200 --seed 21
model_run_remote rm-hold-concat concat:3M,2M,3M hold unix,local,tcp -- \
                 --qd 32 --ops 800 --seed 22
# RAID-0, 64K stripes, every request through the plug.
model_run_remote rm-wb-stripe stripe:64K:3:2M writeback tcp,unix,local \
                 direct=never -- --qd 64 --ops 1200 --seed 23
model_run_remote rm-hold-stripe stripe:64K:3:2M hold tcp,unix,local \
                 direct=never -- --qd 32 --ops 800 --seed 24
# Tight limits: many small runs, and runs split at a small remote queue
# depth (most runs wait in the engine's queue for a slot).
model_run_remote rm-wb-tight concat:3M,2M,3M writeback unix,local,tcp \
                 max-requests=4 max-bytes=64k max-merge=32k direct=never \
                 remote-queue-depth=2 remote-connections=1 -- \
                 --qd 16 --ops 800 --seed 25 --fua-all
