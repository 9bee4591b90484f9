#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-man-versions.sh - the nbdkit and libnbd versions the man page
# says the plugin needs (its VERSION section) are the ones configure.ac
# requires (PKG_CHECK_MODULES), and so is debian/control's build
# dependency on nbdkit (checked where debian/ is there: a git checkout,
# not the release tarball).  Reads the source tree only.
# Shown able to fail: with the man page's "nbdkit E<ge> 1.26" (and no
# libnbd) and debian/control's 1.26, against configure's nbdkit 1.30
# and libnbd 1.10, it failed on all three.
source ./functions.sh
set -e

cd "$abs_top_srcdir"

/usr/bin/python3 - <<'PYEOF'
import os, re, sys

conf = open("configure.ac").read()
need = dict(re.findall(r"PKG_CHECK_MODULES\(\[[A-Z]+\], \[(nbdkit|libnbd) >= ([0-9.]+)\]",
                       conf))
if set(need) != {"nbdkit", "libnbd"}:
    sys.exit("configure.ac: no PKG_CHECK_MODULES of nbdkit and libnbd "
             "found (%r)" % need)

pod = open("man/nbdkit-plug-plugin.pod").read()
sect = re.search(r"^=head1 VERSION\n(.*?)^=head1", pod, re.S | re.M).group(1)
says = dict(re.findall(r"\b(nbdkit|libnbd) E<ge> ([0-9]+(?:\.[0-9]+)*)", sect))
bad = []
for what, v in sorted(need.items()):
    if says.get(what) != v:
        bad.append("man page: %s >= %s, configure.ac: >= %s"
                   % (what, says.get(what, "(not said)"), v))

if os.path.exists("debian/control"):
    m = re.search(r"nbdkit-plugin-dev \(>= ([0-9.]+)\)",
                  open("debian/control").read())
    if not m or m.group(1) != need["nbdkit"]:
        bad.append("debian/control: nbdkit-plugin-dev >= %s, configure.ac: "
                   ">= %s" % (m.group(1) if m else "(not said)",
                              need["nbdkit"]))

print("configure.ac needs %s" % ", ".join("%s >= %s" % kv
                                          for kv in sorted(need.items())))
if bad:
    sys.exit("\n".join(bad))
PYEOF
