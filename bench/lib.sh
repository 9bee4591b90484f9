# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# shellcheck shell=bash
# bench/lib.sh: shared by run.sh and tune.sh.  Sourced, not run.
#
# One measurement = one captive nbdkit (nbdkit -U - ... --run CLIENT)
# with a fresh backing file, so no state carries from one to the next.

export PATH=/usr/bin:$PATH      # pyenv's python3 shadows the system one.
export LC_ALL=C

bench_srcdir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top_builddir=${top_builddir:-$(cd "$bench_srcdir/.." && pwd)}
PLUGIN=${PLUGIN:-$top_builddir/plugin/.libs/nbdkit-plug-plugin.so}
NBD_BENCH=${NBD_BENCH:-}

BENCH_SECONDS=${BENCH_SECONDS:-2}      # length of one measurement
BENCH_REPS=${BENCH_REPS:-3}            # repetitions; the median is shown
BENCH_SIZE=${BENCH_SIZE:-256M}         # backing file size = range used
BENCH_DELAY_MS=${BENCH_DELAY_MS:-1}    # per-op price of "slow" scenarios
BENCH_QD=${BENCH_QD:-16}
BENCH_FLUSH_EVERY=${BENCH_FLUSH_EVERY:-32}
BENCH_STRACE=${BENCH_STRACE:-0}        # 1: one extra run each under strace
BENCH_TMPDIR=${BENCH_TMPDIR:-${TMPDIR:-/tmp}}

die ()
{
  echo "$0: $*" >&2
  exit 1
}

for cmd in nbdkit jq; do
  command -v "$cmd" >/dev/null || die "$cmd not found"
done
[ -f "$PLUGIN" ] || die "plugin not built: $PLUGIN (run make first)"

# All backing files of a run live in one temporary directory: the same
# filesystem for the baseline and the plug.
tmp=$(mktemp -d "$BENCH_TMPDIR/nbdplug-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

# Measure one binary: others may rebuild the plugin while we run.
plugin_id="$(git -C "$bench_srcdir" describe --always --dirty 2>/dev/null || echo '?')"
plugin_id+=", plugin built $(date -u -r "$PLUGIN" '+%Y-%m-%d %H:%M UTC')"
cp "$PLUGIN" "$tmp/nbdkit-plug-plugin.so"
PLUGIN=$tmp/nbdkit-plug-plugin.so

# The client: the build tree's, else build it, else compile it here.
find_client ()
{
  if [ -z "$NBD_BENCH" ]; then
    NBD_BENCH=$top_builddir/bench/nbd-bench
    if [ ! -x "$NBD_BENCH" ] && [ -f "$top_builddir/bench/Makefile" ]; then
      make -C "$top_builddir/bench" nbd-bench >&2 || true
    fi
    if [ ! -x "$NBD_BENCH" ]; then
      NBD_BENCH=$tmp/nbd-bench
      # shellcheck disable=SC2046
      ${CC:-cc} -O2 -Wall -o "$NBD_BENCH" "$bench_srcdir/nbd-bench.c" \
        $(pkg-config --cflags --libs libnbd) ||
        die "cannot build nbd-bench (need libnbd development files)"
    fi
  fi
  [ -x "$NBD_BENCH" ] || die "$NBD_BENCH: not executable"
}
find_client

# A file full of random data for the read scenarios (reads of a hole
# would measure nothing).  Made once, shared: reads do not change it.
read_file=$tmp/read.img
make_read_file ()
{
  if [ ! -f "$read_file" ]; then
    head -c "$(numfmt --from=iec "$BENCH_SIZE")" /dev/urandom \
      > "$read_file.tmp"
    mv "$read_file.tmp" "$read_file"
  fi
}

# measure KIND DELAY_MS PLUG_PARAMS CLIENT_ARGS...
#   KIND: base (nbdkit file), wb (plug writeback), hold (plug hold)
#   DELAY_MS: 0, or the price of each backend write/zero/trim
#   PLUG_PARAMS: extra plug parameters (one word each, space separated)
# Prints the client's key=value line, plus for the plug:
#   cops=client write/zero/trim ops  bops=backend write/zero/trim ops
# and with STRACE=1 pwrites=number of pwrite*/pwritev* syscalls.
measure ()
{
  local kind=$1 delay=$2 params=$3
  shift 3
  local file=$tmp/disk-$kind stats=$tmp/stats-$kind.json out
  local -a server pre=()

  case " $* " in
    *" --op read "*|*" --op randread "*)
      make_read_file
      file=$read_file ;;
    *)
      rm -f "$file"
      truncate -s "$BENCH_SIZE" "$file" ;;
  esac
  rm -f "$stats"
  case $kind in
    base)
      if [ "$delay" != 0 ]; then
        server=(--filter=delay file "$file" "wdelay=${delay}ms")
      else
        server=(file "$file")
      fi ;;
    wb|hold)
      [ "$delay" != 0 ] &&
        pre=(-D "plug.backend_delay_us=$((delay * 1000))")
      local mode=writeback
      [ "$kind" = hold ] && mode=hold
      # shellcheck disable=SC2206
      server=("$PLUGIN" "$file" "mode=$mode" "stats-file=$stats" $params) ;;
    *) die "measure: bad kind $kind" ;;
  esac
  if [ "${STRACE:-0}" = 1 ]; then
    pre=(strace -f -qq -c -e "trace=pwrite64,pwritev,pwritev2"
         -o "$tmp/strace.out" nbdkit "${pre[@]}")
  else
    pre=(nbdkit "${pre[@]}")
  fi
  out=$("${pre[@]}" -U - "${server[@]}" \
          --run "$NBD_BENCH --uri \"\$uri\" $*") ||
    die "failed: ${pre[*]} -U - ${server[*]} --run nbd-bench $*"
  out=$(tail -n1 <<<"$out")
  if [ "$kind" != base ]; then
    [ -s "$stats" ] || die "no statsfile from $kind run"
    out+=$(jq -r '" cops=\(.client.write.ops + .client.zero.ops +
                          .client.trim.ops)" +
                  " bops=\(.backend.write.ops + .backend.zero.ops +
                          .backend.trim.ops)"' "$stats")
  fi
  if [ "${STRACE:-0}" = 1 ]; then
    out+=" pwrites=$(awk '$NF ~ /^pwrite/ { n += $4 } END { print n + 0 }' \
                       "$tmp/strace.out")"
  fi
  [ "$file" != "$read_file" ] && rm -f "$file"
  echo "$out"
}

# field KEY LINE: the value of KEY=... in a key=value line.
field ()
{
  local kv
  for kv in $2; do
    [ "${kv%%=*}" = "$1" ] && { echo "${kv#*=}"; return; }
  done
  echo ""
}

# median VALUES...: the median (mean of the middle two if even).
median ()
{
  printf '%s\n' "$@" | sort -g |
    awk '{ v[NR] = $1 }
         END { if (NR == 0) print "";
               else if (NR % 2) print v[(NR + 1) / 2];
               else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# ratio A B: A/B with 2 decimals.
ratio ()
{
  awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b;
                                   else printf "-" }'
}
