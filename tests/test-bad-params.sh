#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-bad-params.sh - every bad parameter stops nbdkit before it serves,
# with an error that names the parameter or the file.
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

all_before=$(nbdkit_tmpdirs)

# Control: the good file serves (so the failures below are the
# parameters', not the harness's), and the server exits cleanly.
start_plug good "$good"
nbdsh_sys -u "$(server_uri good)" -c 'assert h.get_size() == 1024 * 1024'
stop_server good
# A retry-timeout equal to retry-delay is allowed (the retry cases below
# refuse only a smaller one).
start_plug good-retry "$good" retry-delay=5ms retry-timeout=5ms
stop_server good-retry

# Files.
bad "$tmp/nonexistent" "$tmp/nonexistent"
bad "$tmp/nonexistent" file="$tmp/nonexistent"
bad "dangling: No such file" "$tmp/dangling"
bad "file=$tmp/dir.*directory" "$tmp/dir"
bad "file=$tmp/empty.img: .*empty" "$good" "$tmp/empty.img"
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

# Unknown parameter.
bad "unknown parameter 'foo'" "$good" foo=bar

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
bad "idle=5 parsecs" "$good" idle="5 parsecs"
bad "max-delay=0" "$good" max-delay=0
bad "retry-delay=0" "$good" retry-delay=0
bad "retry-timeout=-1" "$good" retry-timeout=-1
# A timeout below the delay gives up before the first retry: refused,
# naming both values, whichever of the two keys comes first.
bad "retry-timeout=0: .*retry-delay=3ms" "$good" retry-timeout=0
bad "retry-timeout=1ms: .*retry-delay=5ms" "$good" retry-timeout=1ms \
    retry-delay=5ms
bad "retry-timeout=4999us: .*retry-delay=5ms" "$good" retry-delay=5ms \
    retry-timeout=4999us
bad "max-requests=0" "$good" max-requests=0
bad "max-requests" "$good" max-requests=many
bad "max-inflight=0" "$good" max-inflight=0
bad "io-threads=0" "$good" io-threads=0
bad "remote-connections=0" "$good" remote-connections=0
bad "remote-connections=17" "$good" remote-connections=17
bad "remote-queue-depth=0" "$good" remote-queue-depth=0
bad "connect-timeout=0: must be greater than 0" "$good" connect-timeout=0
bad "connect-timeout=soon" "$good" connect-timeout=soon
bad "connect-retry=-1" "$good" connect-retry=-1
bad "direct=sometimes" "$good" direct=sometimes

# And over the whole test.
no_leftovers "$all_before" "$0"
