#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-filter-keys.sh - the plug's parameter names stack with nbdkit's
# filters.
#
# nbdkit offers every key=value to the filters first (outermost first)
# and a filter keeps the keys it knows: a plug key that a filter also
# takes never reaches the plug when that filter is loaded.
#
#  1. No key the plug lists in --help is a key of any filter installed
#     in nbdkit's filterdir, by two checks:
#     a. the filters' keys read from their man pages (the PARAMETERS
#        section's items, and "the C<KEY> parameter"): at least the
#        known keys of the filters stacked below must be found, so a
#        parser that finds nothing fails rather than passes;
#     b. every filter loaded in front of the plug, one at a time, with
#        every plug key given: nbdkit -v logs "NAME: config key=K" at
#        each layer a key passes, so a key the plug's line is missing
#        for was taken by the filter (man pages may be incomplete).
#  2. One server stacks the log, stats, retry, retry-request, cache and
#     blocksize filters on the plug, each with its own keys, and the
#     plug with its own: nbdkit -v shows each filter key stopping at
#     its filter and each plug key reaching the plug; the log filter's
#     file and the stats filter's file are written, and so is the
#     plug's stats-file; the plug's writes show cache=writethrough
#     (writes reach the plug without a FLUSH) and maxdata=16k (a 256 KiB
#     write arrives in at least 16 pieces).  The same stack with
#     requeue-timeout below requeue-delay is refused by the plug,
#     naming the values given: the plug took them, not a filter.
# Shown able to fail: with statsfile= restored as the plug's name of
# stats-file= (in .config and --help), 1a, 1b and 2 each fail.
source ./functions.sh
set -e
set -x

requires nbdkit --version
requires nbdsh_sys --version
[ -f "$PLUGIN" ] || fail "$PLUGIN: not built"
plug_tmpdir

filterdir=$(nbdkit --dump-config | sed -n 's/^filterdir=//p')
mandir=$(nbdkit --dump-config | sed -n 's/^mandir=//p')
[ -d "$filterdir" ] || fail "no filterdir in nbdkit --dump-config"
filters=()
for so in "$filterdir"/nbdkit-*-filter.so; do
  f=${so##*/nbdkit-}
  filters+=("${f%-filter.so}")
done
[ ${#filters[@]} -gt 0 ] || fail "no filters in $filterdir"

# The plug's keys, from its own --help.
nbdkit "$PLUGIN" --help > "$tmp/help"
mapfile -t plug_keys < <(grep -oE '^[a-z][a-z0-9-]*=' "$tmp/help" | tr -d =)
printf 'plug key: %s\n' "${plug_keys[@]}"
for k in file stats-file requeue-delay requeue-timeout lock; do
  printf '%s\n' "${plug_keys[@]}" | grep -qx -- "$k" ||
    fail "--help does not list $k=: the key list is not what it should be"
done

# ---- 1a. The filters' man pages ---------------------------------------

# filter_man_keys FILTER: print its keys from its man page, one a line.
filter_man_keys ()
{
  local page=$mandir/man1/nbdkit-$1-filter.1.gz
  [ -f "$page" ] || page=$(man -w "nbdkit-$1-filter" 2>/dev/null) || return 1
  [ -f "$page" ] || return 1
  zcat -f "$page" |
    awk '/^\.SH "PARAMETERS"/ { p = 1; next } /^\.SH/ { p = 0 } p' |
    sed 's/\\-/-/g' > "$tmp/params.roff"
  # ".IX Item" entries ("key=VALUE", or "key1, key2, key3.").
  sed -n 's/^\.IX Item "\(.*\)"$/\1/p' "$tmp/params.roff" | tr ',' '\n' |
    sed 's/^ *//' | grep -oE '^[a-z][a-z0-9_-]*(=|\.?$)' | tr -d '=.'
  # "The C<key> parameter" in the prose (the ddrescue filter).
  grep -oE '\\\*\(C`[a-z][a-z0-9_-]*\\\*\(C'"'"'\\fR parameter' \
       "$tmp/params.roff" | sed 's/^\\\*(C`//; s/\\\*(C.*//'
}

: > "$tmp/man-keys"
nopage=()
for f in "${filters[@]}"; do
  if filter_man_keys "$f" > "$tmp/keys.$f"; then
    sed "s/\$/ $f/" "$tmp/keys.$f" >> "$tmp/man-keys"
  else
    nopage+=("$f")
  fi
done
# Without any man page (a system that strips documentation) there is
# nothing to read: only 1b can run then.
if [ ${#nopage[@]} -eq ${#filters[@]} ]; then
  echo "$0: no filter man pages under $mandir: 1a not run"
  man_checked=no
else
  [ ${#nopage[@]} -eq 0 ] ||
    fail "filters without a man page, so not checked: ${nopage[*]}"
  sort -u "$tmp/man-keys" -o "$tmp/man-keys"
  cat "$tmp/man-keys"
  # The parser finds what these filters are known to take.
  for kf in "statsfile stats" "retry-delay retry" "retries retry" \
            "retry-request-retries retry-request" "cache cache" \
            "minblock blocksize" "maxdata blocksize" "logfile log" \
            "error-pread-rate error" "ddrescue-mapfile ddrescue"; do
    grep -qx -- "$kf" "$tmp/man-keys" ||
      fail "man page parser did not find '$kf' (key filter)"
  done
  collisions=$(for k in "${plug_keys[@]}"; do
                 grep -E "^$k " "$tmp/man-keys" || :
               done)
  [ -z "$collisions" ] ||
    fail "plug keys that filters take (key filter):" $collisions
  man_checked=yes
fi

# ---- 1b. Every filter in front of the plug ----------------------------

# A valid value for each plug key: the plug stops at a value it
# refuses, and the keys after it would look taken.
truncate -s 4M "$tmp/img"
declare -A value=(
  [file]="$tmp/img" [stripe]=4096 [mode]=writeback [idle]=1ms
  [max-delay]=10ms [max-requests]=256 [max-bytes]=4M [max-merge]=1M
  [max-inflight]=64 [io-threads]=2 [remote-connections]=4
  [remote-queue-depth]=64 [direct]=auto [direct-size]=64k
  [requeue-delay]=3ms [requeue-max-delay]=100ms [requeue-timeout]=10s
  [lock]=yes [stats-file]="$tmp/probe.json" [stats-interval]=2s
  [connect-timeout]=10s [connect-retry]=0
)
args=()
for k in "${plug_keys[@]}"; do
  [ -n "${value[$k]:-}" ] ||
    fail "no probe value for the plug's $k=: add one to value[] here"
  args+=("$k=${value[$k]}")
done

taken=()
for f in "${filters[@]}"; do
  rm -f "$tmp/probe.sock"
  # Filters that need parameters of their own (ext2, luks, tar...) stop
  # nbdkit after the keys were offered: the status does not matter here.
  timeout 60 nbdkit -v -U "$tmp/probe.sock" --filter="$f" "$PLUGIN" \
          "${args[@]}" --run true > "$tmp/probe.$f" 2>&1 || :
  # The name it logs under is its own (the error filter's is
  # error-inject).
  name=$(sed -n "s|.*registered filter .*/nbdkit-$f-filter.so (name \(.*\))\$|\1|p" \
             "$tmp/probe.$f")
  grep -q "debug: ${name:-$f}: config key=file," "$tmp/probe.$f" ||
    fail "filter $f: nbdkit never offered it a key (did it load?):" \
         "$(tail -5 "$tmp/probe.$f")"
  for k in "${plug_keys[@]}"; do
    grep -q "debug: plug: config key=$k," "$tmp/probe.$f" ||
      taken+=("$k=($f)")
  done
done
[ ${#taken[@]} -eq 0 ] ||
  fail "plug keys that a filter took before the plug: ${taken[*]}"
echo "1b: ${#plug_keys[@]} plug keys reach the plug past each of" \
     "${#filters[@]} filters"

# ---- 2. Six filters stacked on the plug -------------------------------

stack=(--filter=log --filter=stats --filter=retry --filter=retry-request
       --filter=cache --filter=blocksize)
# KEY=VALUE FILTER: each filter's own keys.
filter_args=("logfile=$tmp/log.txt log" "statsfile=$tmp/fstats.txt stats"
             "retry-delay=1 retry" "retries=2 retry"
             "retry-request-retries=1 retry-request"
             "cache=writethrough cache" "minblock=512 blocksize"
             "maxdata=16k blocksize")
plug_args=("file=$tmp/img" "stats-file=$tmp/plug.json"
           "requeue-delay=7ms" "requeue-timeout=7ms")
args=()
for a in "${filter_args[@]}"; do args+=("${a% *}"); done

start_server stack -v "${stack[@]}" "$PLUGIN" "${plug_args[@]}" "${args[@]}"
# One 256 KiB write and no FLUSH.
nbdsh_sys -u "$(server_uri stack)" -c 'h.pwrite(b"s" * 262144, 0)'
stop_server stack
log=$(server_log stack)

# last_layer KEY: the innermost layer nbdkit offered KEY to (the one
# that took it).
last_layer ()
{
  grep -oE "debug: [a-z-]+: config key=$1," "$log" | tail -1 |
    sed 's/^debug: //; s/: config.*//'
}
for a in "${filter_args[@]}"; do
  kv=${a% *} f=${a##* }
  got=$(last_layer "${kv%%=*}")
  [ "$got" = "$f" ] ||
    fail "stacked: ${kv%%=*}= went to '$got', expected the $f filter"
done
for kv in "${plug_args[@]}"; do
  grep -qF "debug: plug: config key=${kv%%=*}, value=${kv#*=}" "$log" ||
    fail "stacked: the plug did not get $kv"
done

# What each got it for.
grep -q 'Write id=' "$tmp/log.txt" ||
  fail "the log filter's logfile= has no write: $(cat "$tmp/log.txt")"
grep -q '^write:' "$tmp/fstats.txt" ||
  fail "the stats filter's statsfile= has no write line:" \
       "$(cat "$tmp/fstats.txt")"
[ -s "$tmp/plug.json" ] || fail "the plug's stats-file= was not written"
cat "$tmp/plug.json"
/usr/bin/python3 - "$tmp/plug.json" <<'EOF'
import json, sys
st = json.load(open(sys.argv[1]))
w, fl = st["client"]["write"], st["client"]["flush"]["ops"]
# cache=writethrough: the writes reached the plug without a FLUSH
# (writeback, the cache filter's default, keeps them); maxdata=16k:
# the 256 KiB write arrived in at least 16 pieces.
if fl != 0 or w["ops"] < 16 or w["bytes"] < 262144:
    sys.exit("plug's stats-file: %d writes, %d bytes, %d flushes; "
             "expected >= 16 writes of 256 KiB in all and no flush"
             % (w["ops"], w["bytes"], fl))
print("plug: %d writes, %d bytes" % (w["ops"], w["bytes"]))
EOF

# The plug took its requeue-delay= and requeue-timeout= values: below
# the delay, the timeout is refused, naming both as given.
rc=0
rm -f "$tmp/ran" "$tmp/bad.sock"
nbdkit -U "$tmp/bad.sock" "${stack[@]}" "$PLUGIN" "file=$tmp/img" \
       requeue-delay=7ms requeue-timeout=5ms "${args[@]}" \
       --run ": > $tmp/ran" 2> "$tmp/bad.err" || rc=$?
cat "$tmp/bad.err"
[ $rc -ne 0 ] && [ ! -e "$tmp/ran" ] ||
  fail "stacked: requeue-timeout=5ms below requeue-delay=7ms was served"
grep -qF "requeue-timeout=5ms: must be at least requeue-delay=7ms" \
     "$tmp/bad.err" ||
  fail "stacked: the refusal does not name the plug's values"

echo "$0: man pages checked: $man_checked; ${#filters[@]} filters probed"
