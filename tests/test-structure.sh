#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-structure.sh - the plugin's rooms keep to themselves.
# Reads the source tree only.  Four rules:
#  1. a backend (plugin/backing*, plugin/remote*, plugin/backend*,
#     plugin/file.*)
#     includes none of glue.h, conn.h, plugin.h: it gets its parameters
#     at open and reports completions through the run's callback;
#  2. plugin/iopool.c names no glue_ or conn_ function: the pool runs
#     what it is given;
#  3. only the entry room (plugin/plugin.c, plugin/config.c) reads the
#     configuration global (cfg): every other room gets what it needs
#     as arguments at start;
#  4. no source file under src/ or plugin/ passes 900 lines.
# Every violation is printed, one a line ("RULE: FILE:LINE: what").
#
# Any violation fails the test.
# Shown able to fail: on the tree before the rooms were built it
# reported 24 violations (each of the four rules); and on a copy (PLUG_STRUCTURE_ROOT) with one more violation of each made
# on purpose (a plugin/backend-null.c including conn.h, iopool.c
# calling conn_leave, conn.c reading cfg.mode, conn.c padded to 993
# lines) it reported exactly those four more.
source ./functions.sh
set -e


# PLUG_STRUCTURE_ROOT: check another tree (a copy with a violation made
# on purpose) instead of this one.
cd "${PLUG_STRUCTURE_ROOT:-$abs_top_srcdir}"

rc=0
/usr/bin/python3 - <<'PYEOF' || rc=$?
import glob, os, re, sys

MAX_LINES = 900
BACKEND_GLOBS = ["plugin/backing*", "plugin/remote*", "plugin/backend*",
                 "plugin/file.*"]
BACKEND_FORBIDDEN = {"glue.h", "conn.h", "plugin.h"}
ENTRY_ROOM = {"plugin/plugin.c", "plugin/config.c"}

def code_lines(path):
    """The file's lines with comments and string literals blanked (line
    numbers kept), so that a rule sees only code."""
    text = open(path, encoding="utf-8", errors="replace").read()
    out, i, n = [], 0, len(text)
    state = None
    while i < n:
        c = text[i]
        if state is None:
            if text.startswith("/*", i):
                state = "block"; i += 2; continue
            if text.startswith("//", i):
                state = "line"; i += 2; continue
            if c == '"':
                state = "str"; out.append(c); i += 1; continue
            if c == "'":
                state = "chr"; out.append(c); i += 1; continue
            out.append(c)
        elif state == "block":
            if text.startswith("*/", i):
                state = None; i += 2; continue
            if c == "\n":
                out.append(c)
        elif state == "line":
            if c == "\n":
                state = None; out.append(c)
        else:
            quote = '"' if state == "str" else "'"
            if c == "\\":
                i += 2; continue
            if c == quote:
                state = None; out.append(c)
            elif c == "\n":
                out.append(c)
        i += 1
    return "".join(out).split("\n")

violations = []

def report(rule, path, line, what):
    violations.append("%s: %s:%d: %s" % (rule, path, line, what))

# 1. Backends include nothing of glue, conn or the entry.
backends = sorted({p for g in BACKEND_GLOBS for p in glob.glob(g)
                   if p.endswith((".c", ".h"))})
for path in backends:
    for no, line in enumerate(open(path, errors="replace"), 1):
        m = re.match(r'\s*#\s*include\s*"([^"]+)"', line)
        if m and os.path.basename(m.group(1)) in BACKEND_FORBIDDEN:
            report("backend-includes", path, no,
                   "includes %s" % m.group(1))

# 2. The pool names no glue_ or conn_ function.
if os.path.exists("plugin/iopool.c"):
    for no, line in enumerate(code_lines("plugin/iopool.c"), 1):
        for m in re.finditer(r"\b((?:glue|conn)_\w+)\s*\(", line):
            report("iopool-names", "plugin/iopool.c", no,
                   "names %s" % m.group(1))

# 3. Only the entry room reads the configuration global.
for path in sorted(glob.glob("plugin/*.[ch]")):
    if path in ENTRY_ROOM:
        continue
    for no, line in enumerate(code_lines(path), 1):
        for m in re.finditer(r"(?<![\w.>])cfg\s*\.\s*(\w+)", line):
            report("config-global", path, no,
                   "reads the configuration global (cfg.%s)" % m.group(1))

# 4. No source file passes MAX_LINES.
for path in sorted(glob.glob("src/*.[ch]") + glob.glob("plugin/*.[ch]")):
    n = sum(1 for _ in open(path, errors="replace"))
    if n > MAX_LINES:
        report("too-long", path, n, "%d lines (at most %d)" % (n, MAX_LINES))

for v in violations:
    print(v)
print("%d violation%s" % (len(violations), "" if len(violations) == 1 else "s"))
sys.exit(1 if violations else 0)
PYEOF

case $rc in
  0) exit 0 ;;
  1) echo "$0: FAIL: the violations above"
     exit 1 ;;
  *) echo "$0: the check itself failed ($rc)"
     exit 1 ;;
esac
