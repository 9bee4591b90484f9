#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-backend-rooms.sh - the backends live in rooms of their own
# (plugin/backend.h): a backend's sources (the local file, the NBD
# export, the fault injector, the libev loop helper they share) include
# nothing of the plumbing around the engine (glue.h, conn.h, plugin.h);
# the I/O pool names no glue or conn function (it runs job->fn); and
# none of those files passes 900 lines.
#
# Shown able to fail: with #include "glue.h" added to plugin/file.c,
# with glue_perform named in plugin/iopool.c, and with the undivided
# remote.c of before (2,422 lines, including glue.h and plugin.h) in
# place of plugin/remote-cmd.c.
source ./functions.sh
set -e

cd "$abs_top_srcdir/plugin"
backends=(backend.h backend-inject.c backend-inject.h evloop.c evloop.h
          file.c file.h remote.c remote.h remote-int.h remote-cmd.c
          remote-conn.c remote-loop.c)
bad=0

for f in "${backends[@]}"; do
  test -f "$f" || fail "plugin/$f: missing (update this list)"
  if grep -nE '^#include "(glue|conn|plugin)\.h"' "$f"; then
    echo "plugin/$f: a backend includes the plumbing"
    bad=1
  fi
done

if grep -nE '\b(glue|conn)_[a-z_]+ *\(' iopool.c iopool.h; then
  echo "plugin/iopool.[ch]: the pool names a glue or conn function"
  bad=1
fi

for f in "${backends[@]}" iopool.c iopool.h backing.c backing.h; do
  n=$(wc -l <"$f")
  if [ "$n" -gt 900 ]; then
    echo "plugin/$f: $n lines (more than 900)"
    bad=1
  fi
done

[ "$bad" = 0 ] || fail "a backend room reaches into the plumbing"
echo "PASS: ${#backends[@]} backend files checked"
