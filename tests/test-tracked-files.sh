#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-tracked-files.sh - the repository holds sources, not build
# products: no tracked file is one that .gitignore names, and none is
# an ELF object or executable.  A test binary committed by mistake is
# relinked in a clean clone only because its objects are missing; it
# would run stale wherever they are not.
#
# Needs a git checkout whose top is the source tree (skipped in a
# release tarball, where git has nothing to say).
source ./functions.sh
set -e

requires git --version
requires git -C "$abs_top_srcdir" rev-parse --show-toplevel
# A tarball unpacked inside some other checkout (make distcheck's) is
# not that checkout's top: git would list none of its files.
top=$(git -C "$abs_top_srcdir" rev-parse --show-toplevel)
requires test "$(realpath "$top")" = "$(realpath "$abs_top_srcdir")"
cd "$abs_top_srcdir"

bad=0
ignored=$(git ls-files -ci --exclude-standard)
if [ -n "$ignored" ]; then
  echo "tracked, but .gitignore names them:"
  echo "$ignored"
  bad=1
fi

elf=()
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  LC_ALL=C read -r -n 4 magic <"$f" || :
  [ "$magic" = $'\x7fELF' ] && elf+=("$f")
done < <(git ls-files -z)
if [ ${#elf[@]} -gt 0 ]; then
  echo "tracked ELF files (build products):"
  printf '%s\n' "${elf[@]}"
  bad=1
fi

nr=$(git ls-files | wc -l)
echo "$nr tracked files: ${#elf[@]} ELF, $(printf '%s' "$ignored" | grep -c . || :) ignored"
[ "$bad" = 0 ] || fail "build products are tracked"
