#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# scripts/add-licence-headers.sh [FILE...]: give every source file that
# lacks it the short licence header (SPDX identifier and copyright line,
# see LICENSE).  Without FILEs: git's tracked files and the untracked
# ones that are not ignored.  Idempotent: a file with an
# SPDX-License-Identifier in its first 10 lines is left alone, so it can
# be rerun after a merge.
#
# Comment style by name: .c .h /* */; .pod =begin comment; .am .ac
# .mk .sh .in .syms (ld version scripts take #) and any other file
# starting with #! (after that line) #.  Other files (Markdown, debian/control, ...) are skipped.
set -euo pipefail

cd "$(git rev-parse --show-toplevel)"
spdx="SPDX-License-Identifier: BSD-3-Clause"
copyright="Copyright the nbdplug authors (see LICENSE)."

style ()
{
  case $1 in
    *.h.in|*.c|*.h) echo c ;;
    *.pod) echo pod ;;
    *.am|*.ac|*.mk|*.sh|*.in|*.syms) echo hash ;;
    *)
      if [ "$(head -c 2 "$1")" = '#!' ]; then echo hash; else echo none; fi
      ;;
  esac
}

add ()
{
  local f=$1 st tmp
  [ -f "$f" ] && [ ! -L "$f" ] || return 0
  st=$(style "$f")
  [ "$st" != none ] || return 0
  if head -n 10 "$f" | grep -q 'SPDX-License-Identifier:'; then
    return 0
  fi
  tmp=$(mktemp "$f.XXXXXX")
  case $st in
    c)
      { printf '/* %s\n * %s\n */\n\n' "$spdx" "$copyright"; cat "$f"; } \
        > "$tmp" ;;
    pod)
      { printf '=begin comment\n\n%s\n%s\n\n=end comment\n\n' \
          "$spdx" "$copyright"; cat "$f"; } > "$tmp" ;;
    hash)
      if [ "$(head -c 2 "$f")" = '#!' ]; then
        { head -n 1 "$f"; printf '# %s\n# %s\n\n' "$spdx" "$copyright";
          tail -n +2 "$f"; } > "$tmp"
      else
        { printf '# %s\n# %s\n\n' "$spdx" "$copyright"; cat "$f"; } \
          > "$tmp"
      fi ;;
  esac
  chmod --reference="$f" "$tmp"
  mv "$tmp" "$f"
  echo "header added: $f"
}

if [ $# -gt 0 ]; then
  for f in "$@"; do add "$f"; done
else
  git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do add "$f"; done
fi
