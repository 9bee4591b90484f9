#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-unplug-reasons.sh - every unplug reason of the statistics can
# move, and the man page documents exactly those:
#  - each enumerator of enum plug_reason (src/plug.h) is passed by some
#    source file (its name in src/plug.c's table does not count): a
#    reason nothing passes is a statsfile key that is always 0;
#  - PLUG_NR_REASONS is the number of enumerators, and src/plug.c names
#    each of them;
#  - the man page has an item under "Unplug triggers" for each name
#    and no other, and its sample statsfile's "unplugs" lists the same
#    names.
# Reads the source tree only.
# Shown able to fail: with the "fast-zero" reason (which nothing passed)
# it failed: "PLUG_UNPLUG_FAST_ZERO: passed by no source file".
source ./functions.sh
set -e

cd "$abs_top_srcdir"

/usr/bin/python3 - <<'EOF'
import glob, re, sys

bad = []
plug_h = open("src/plug.h").read()
body = re.search(r"enum plug_reason \{(.*?)\};", plug_h, re.S).group(1)
body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
enums = re.findall(r"\b(PLUG_UNPLUG_[A-Z_]+)\b", body)
nr = int(re.search(r"#define PLUG_NR_REASONS (\d+)", plug_h).group(1))
if nr != len(enums):
    bad.append("PLUG_NR_REASONS is %d, enum plug_reason has %d"
               % (nr, len(enums)))

# src/plug.c passes some itself (max-requests, max-bytes); its table
# of names does not count.
name_entry = r'\[PLUG_UNPLUG_[A-Z_]+\] = "[a-z-]+",'
text = {f: re.sub(name_entry, "", open(f).read())
        for f in glob.glob("src/*.c") + glob.glob("plugin/*.c")}
for e in enums:
    if not any(re.search(r"\b%s\b" % e, t) for t in text.values()):
        bad.append("%s: passed by no source file (its statistic can "
                   "never move)" % e)

names = dict(re.findall(r"\[(PLUG_UNPLUG_[A-Z_]+)\] = \"([a-z-]+)\"",
                        open("src/plug.c").read()))
for e in enums:
    if e not in names:
        bad.append("%s: no name in src/plug.c" % e)
want = set(names.values())

pod = open("man/nbdkit-plug-plugin.pod").read()
sect = re.search(r"=head2 Unplug triggers\n(.*?)\n=back", pod, re.S).group(1)
items = set(re.findall(r"^=item B<([a-z-]+)>", sect, re.M))
if items != want:
    bad.append("man page, Unplug triggers: items %s missing, %s extra"
               % (sorted(want - items), sorted(items - want)))
sample = re.search(r'"unplugs": \{(.*?)\}', pod, re.S).group(1)
keys = set(re.findall(r'"([a-z-]+)":', sample))
if keys != want:
    bad.append("man page, sample statsfile: unplugs %s missing, %s extra"
               % (sorted(want - keys), sorted(keys - want)))

print("%d unplug reasons: %s" % (len(enums), ", ".join(sorted(want))))
if bad:
    sys.exit("\n".join(bad))
EOF
