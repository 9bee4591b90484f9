#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-bad-params.sh - every bad parameter stops nbdkit before it serves,
# with an error that names the parameter or the file; a parameter that
# is accepted but doubtful (an old name, idle= longer than max-delay=)
# is served with a warning that says why; a file opened read-only says
# so with -v.
#
# For each case "nbdkit -U SOCK plug ... --run" must exit non-zero
# without running the --run command, and stderr must match the given
# pattern.  Never "-U -": nbdkit makes its /tmp/nbdkitXXXXXX socket
# directory before the configuration fails and leaves it behind; no
# call of this test may leave such a directory (checked around each).
#
# The unreadable file (chmod 000) case runs nbdkit as nobody when the
# test runs as root (root reads such a file anyway).
source ./functions.sh
set -e
set -x

requires nbdkit --version
plug_tmpdir

truncate -s 1M "$tmp/good.img" "$tmp/good2.img"
truncate -s 512K "$tmp/half.img"
truncate -s 100000 "$tmp/odd.img"
: > "$tmp/empty.img"
mkdir "$tmp/dir"
ln -s "$tmp/nonexistent" "$tmp/dangling"
good=$tmp/good.img

# nbdkit's temporary socket directories left behind, one a line: what
# "-U -" leaves when the configuration fails is an empty directory.
# Other tests running at the same time (make -j2) have such directories
# too, but never empty for long: a live server's holds its socket, and
# the eval plugin's holds its scripts.
nbdkit_tmpdirs ()
{
  local d
  for d in /tmp/nbdkit??????; do
    if [ -d "$d" ] && [ -z "$(ls -A "$d" 2>/dev/null)" ]; then
      echo "$d"
    fi
  done | sort
}

# no_leftovers BEFORE WHAT: no nbdkit temporary directory appeared since
# the listing BEFORE was taken.  (Another test running at the same time
# may make one of its own: only an empty directory that is still there
# and was not there before counts, and the test says which.)
no_leftovers ()
{
  local new
  new=$(comm -13 <(echo "$1") <(nbdkit_tmpdirs))
  if [ -n "$new" ]; then
    # A server starting or stopping beside us has its directory empty
    # for a moment: look again.
    sleep 1
    new=$(comm -13 <(echo "$1") <(nbdkit_tmpdirs))
  fi
  if [ -n "$new" ]; then
    echo "$0: $2 left nbdkit temporary directories behind: $new"
    exit 1
  fi
}

# bad PATTERN ARGS...: nbdkit plug ARGS must fail and say PATTERN.
bad ()
{
  local pattern=$1 rc=0 before
  shift
  rm -f "$tmp/ran" "$tmp/sock"
  before=$(nbdkit_tmpdirs)
  nbdkit -U "$tmp/sock" "$PLUGIN" "$@" --run ": > $tmp/ran" 2> "$tmp/err" ||
    rc=$?
  cat "$tmp/err"
  no_leftovers "$before" "nbdkit plug $*"
  if [ $rc -eq 0 ] || [ -e "$tmp/ran" ]; then
    echo "$0: nbdkit plug $* did not fail"
    exit 1
  fi
  if ! grep -qE -- "$pattern" "$tmp/err"; then
    echo "$0: nbdkit plug $*: error does not match '$pattern'"
    exit 1
  fi
}

# warns PATTERN ARGS...: nbdkit plug ARGS must serve (the --run command
# runs, exit status 0) and say PATTERN (with "", anything or nothing).
warns ()
{
  local pattern=$1 before
  shift
  rm -f "$tmp/ran" "$tmp/sock"
  before=$(nbdkit_tmpdirs)
  nbdkit -U "$tmp/sock" "$PLUGIN" "$@" --run ": > $tmp/ran" 2> "$tmp/err" ||
    fail "nbdkit plug $* did not serve: $(cat "$tmp/err")"
  cat "$tmp/err"
  no_leftovers "$before" "nbdkit plug $*"
  [ -e "$tmp/ran" ] || fail "nbdkit plug $*: the --run command did not run"
  [ -z "$pattern" ] || grep -qE -- "$pattern" "$tmp/err" ||
    fail "nbdkit plug $*: stderr does not match '$pattern'"
}

# says_not PATTERN: the last case's stderr does not match PATTERN.
says_not ()
{
  if grep -E -- "$1" "$tmp/err"; then
    fail "the message above should not say '$1'"
  fi
}

all_before=$(nbdkit_tmpdirs)

# Control: the good file serves (so the failures below are the
# parameters', not the harness's), and the server exits cleanly.
start_plug good "$good"
nbdsh_sys -u "$(server_uri good)" -c 'assert h.get_size() == 1024 * 1024'
stop_server good
# A requeue-timeout equal to requeue-delay is allowed (the retry cases below
# refuse only a smaller one).
start_plug good-retry "$good" requeue-delay=5ms requeue-timeout=5ms
stop_server good-retry

# Files.
bad "$tmp/nonexistent" "$tmp/nonexistent"
bad "$tmp/nonexistent" file="$tmp/nonexistent"
bad "dangling: No such file" "$tmp/dangling"
bad "file=$tmp/dir.*directory" "$tmp/dir"
bad "file=$tmp/empty.img: backing file is empty \(size 0\)$" \
    "$good" "$tmp/empty.img"
says_not "stripe="                      # None was asked for.
bad "file=$tmp/empty.img: backing file is empty \(size 0, stripe=65536\)" \
    stripe=64k "$tmp/empty.img"
# A scheme libnbd does not serve: not a path ("realpath: No such file").
bad "file=nbdx://host/: unknown URI scheme 'nbdx': expected one of nbd://, nbds://, nbd\+unix://.*write \./nbdx://host/" \
    file=nbdx://host/
says_not "realpath|No such file"
bad "file=NBD://host/: unknown URI scheme 'NBD'" NBD://host/
bad "no backing file given"
bad "no backing file given" mode=hold
# Unreadable file.  Root reads a chmod 000 file anyway, so as root run
# nbdkit as nobody (setpriv), with its own copy of the plugin, after
# checking that nobody serves a readable file from the same directory
# (so that the refusal below is the file's own).
# The socket goes in a directory nobody may write to.
as_nobody "$tmp/pub"
mkdir "$tmp/pub/run"
chmod 777 "$tmp/pub/run"
truncate -s 1M "$tmp/pub/readable.img" "$tmp/pub/unreadable.img"
chmod 666 "$tmp/pub/readable.img"
chmod 000 "$tmp/pub/unreadable.img"
before=$(nbdkit_tmpdirs)
rm -f "$tmp/pub/run/sock"
"${AS_NOBODY[@]}" nbdkit -U "$tmp/pub/run/sock" "$NOBODY_PLUGIN" \
                  "$tmp/pub/readable.img" --run 'exit 0' ||
  fail "${AS_NOBODY[*]:-this user} cannot serve $tmp/pub/readable.img"
no_leftovers "$before" "nbdkit serving readable.img"
rc=0
before=$(nbdkit_tmpdirs)
rm -f "$tmp/pub/run/sock"
"${AS_NOBODY[@]}" nbdkit -U "$tmp/pub/run/sock" "$NOBODY_PLUGIN" \
                  "$tmp/pub/unreadable.img" --run 'exit 0' 2> "$tmp/err" ||
  rc=$?
cat "$tmp/err"
no_leftovers "$before" "nbdkit plug unreadable.img"
test $rc -ne 0
grep "file=$tmp/pub/unreadable.img: open: Permission denied" "$tmp/err"
# A file that can be opened only read-only is served read-only, and -v
# says why (one such file makes the whole export read-only).
cp "$tmp/pub/readable.img" "$tmp/pub/ro.img"
chmod 444 "$tmp/pub/ro.img"
before=$(nbdkit_tmpdirs)
rm -f "$tmp/pub/run/sock"
"${AS_NOBODY[@]}" nbdkit -v -U "$tmp/pub/run/sock" "$NOBODY_PLUGIN" \
                  "$tmp/pub/ro.img" --run 'exit 0' 2> "$tmp/err" ||
  fail "nbdkit plug ro.img did not serve: $(tail "$tmp/err")"
no_leftovers "$before" "nbdkit plug ro.img"
grep "file=$tmp/pub/ro.img: cannot open it read-write (Permission denied): opened read-only, so the whole export is read-only" \
     "$tmp/err"

# Unknown parameter.
bad "unknown parameter 'foo'" "$good" foo=bar

# The names of the previous release: served, with a warning naming the
# new name; the values go where the new names' go.
rm -f "$tmp/old-stats.json"
warns "warning: statsfile=$tmp/old-stats.json: statsfile= is deprecated \(it is nbdkit-stats-filter's key\), use stats-file= instead" \
      "$good" statsfile="$tmp/old-stats.json"
start_plug old-stats "$good" statsfile="$tmp/old-stats.json"
nbdsh_sys -u "$(server_uri old-stats)" -c 'h.flush()'
stop_server old-stats
grep '"connections": 1' "$tmp/old-stats.json"
bad "requeue-timeout=4ms: must be at least requeue-delay=5ms" \
    "$good" retry-delay=5ms retry-timeout=4ms
grep -F "warning: retry-delay=5ms: retry-delay= is deprecated (it is nbdkit-retry-filter's key), use requeue-delay= instead" "$tmp/err"
grep -F "warning: retry-timeout=4ms: retry-timeout= is deprecated (renamed with retry-delay=), use requeue-timeout= instead" "$tmp/err"
bad "requeue-max-delay=abc: expected a duration" "$good" retry-max-delay=abc
grep -F "retry-max-delay= is deprecated (renamed with retry-delay=), use requeue-max-delay= instead" "$tmp/err"
warns "warning: shared=yes: shared= is deprecated, use lock=no" \
      "$good" shared=yes
bad "lock=sometimes: expected a boolean" "$good" lock=sometimes
# Both names of one parameter: refused in either order (which won would
# depend on the order).
bad "lock= and shared= both given: shared= is the deprecated name of lock=; give only lock=" \
    "$good" lock=yes shared=yes
bad "requeue-timeout= and retry-timeout= both given" \
    "$good" requeue-timeout=10s retry-timeout=1s
bad "requeue-timeout= and retry-timeout= both given" \
    "$good" retry-timeout=1s requeue-timeout=10s
bad "stats-file= and statsfile= both given" \
    "$good" stats-file="$tmp/a.json" statsfile="$tmp/b.json"
bad "requeue-delay= and retry-delay= both given" \
    "$good" retry-delay=5ms requeue-delay=5ms
bad "requeue-max-delay= and retry-max-delay= both given" \
    "$good" requeue-max-delay=50ms retry-max-delay=50ms

# Sizes.
bad "stripe=1MB" "$good" stripe=1MB
bad "max-bytes=abc" "$good" max-bytes=abc
bad "max-merge=1x" "$good" max-merge=1x
bad "stripe=5000: must be a multiple of 512" "$good" stripe=5000
bad "stripe=100: 100 bytes is too small: the smallest stripe is 4096" \
    "$good" stripe=100
bad "stripe=512: 512 bytes is too small: the smallest stripe is 4096" \
    "$good" stripe=512
bad "stripe=3584: 3584 bytes is too small" "$good" stripe=3584
bad "stripe=0: must be between 1 and" "$good" stripe=0

# Stripe layouts.
bad "file=$tmp/odd.img: .*not a multiple of the stripe" \
    stripe=64k "$tmp/odd.img" "$good"
bad "file=$tmp/half.img: .*stripe" stripe=64k "$good" "$tmp/half.img"

# Mode, durations, counts.
bad "mode=bogus" "$good" mode=bogus
bad "idle=5 parsecs: expected a duration such as 3ms, 500us or 0.5s$" \
    "$good" idle="5 parsecs"
says_not "Invalid argument"
bad "max-delay=99999999999s: too long" "$good" max-delay=99999999999s
says_not "Numerical result"
# idle= longer than max-delay= never fires: served, with a warning
# (equal is fine: both fire together).
warns "warning: idle=20ms is longer than max-delay=10ms, so it has no effect" \
      "$good" idle=20ms
warns "warning: idle=2s is longer than max-delay=1s" \
      "$good" max-delay=1s idle=2s
warns "" "$good" idle=10ms
says_not "warning"
bad "max-delay=0" "$good" max-delay=0
bad "requeue-delay=0" "$good" requeue-delay=0
bad "requeue-timeout=-1" "$good" requeue-timeout=-1
# A timeout below the delay gives up before the first retry: refused,
# naming both values, whichever of the two keys comes first.
bad "requeue-timeout=0: .*requeue-delay=3ms" "$good" requeue-timeout=0
bad "requeue-timeout=1ms: .*requeue-delay=5ms" "$good" requeue-timeout=1ms \
    requeue-delay=5ms
bad "requeue-timeout=4999us: .*requeue-delay=5ms" "$good" requeue-delay=5ms \
    requeue-timeout=4999us
bad "max-requests=0" "$good" max-requests=0
bad "max-requests=many: expected a whole number between 1 and 1048576" \
    "$good" max-requests=many
bad "io-threads=abc: expected a whole number between 1 and 1024" \
    "$good" io-threads=abc
says_not "empty string"
bad "io-threads=-1: expected a whole number" "$good" io-threads=-1
bad "io-threads=99999999999999999999: must be between 1 and 1024" \
    "$good" io-threads=99999999999999999999
bad "max-inflight=0" "$good" max-inflight=0
bad "io-threads=0" "$good" io-threads=0
bad "remote-connections=0" "$good" remote-connections=0
bad "remote-connections=17" "$good" remote-connections=17
bad "remote-queue-depth=0" "$good" remote-queue-depth=0
bad "connect-timeout=0: must be greater than 0" "$good" connect-timeout=0
bad "connect-timeout=soon" "$good" connect-timeout=soon
bad "connect-retry=-1" "$good" connect-retry=-1
bad "direct=sometimes" "$good" direct=sometimes
# Below 100ms the timer thread, which also unplugs, would spend its time
# rewriting stats-file=; 0 (only at close and exit) and 100ms serve.
bad "stats-interval=1ms: must be 0 \(reports only at close and exit\) or at least 100ms" \
    "$good" stats-file="$tmp/si.json" stats-interval=1ms
bad "stats-interval=1ns: must be 0 .* or at least 100ms" \
    "$good" stats-interval=1ns
bad "stats-interval=99999us: .* at least 100ms" "$good" stats-interval=99999us
warns "" "$good" stats-file="$tmp/si.json" stats-interval=0
warns "" "$good" stats-file="$tmp/si.json" stats-interval=100ms

# stats-file=: a directory can never be replaced by a report; neither
# should a device or a FIFO be.
bad "stats-file=$tmp/dir: is a directory: name a file, such as $tmp/dir/plug-stats.json" \
    "$good" stats-file="$tmp/dir"
says_not "cannot create"
ln -s "$tmp/dir" "$tmp/dirlink"
bad "stats-file=$tmp/dirlink: is a directory" "$good" stats-file="$tmp/dirlink"
mkfifo "$tmp/fifo"
bad "stats-file=$tmp/fifo: exists and is not a regular file" \
    "$good" stats-file="$tmp/fifo"
bad "stats-file=$tmp/nodir/s.json: cannot create $tmp/nodir/s.json.tmp: No such file or directory" \
    "$good" stats-file="$tmp/nodir/s.json"

# And over the whole test.
no_leftovers "$all_before" "$0"
