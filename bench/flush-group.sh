#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# shellcheck disable=SC2059 # printf formats are shared variables.
# bench/flush-group.sh: a FLUSH-heavy workload (group commit):
# FG_CONNS (4) connections at once, each writing 4 KiB then sending a
# FLUSH and waiting for it, FG_OPS (250) times, each in its own range of
# the file (nbd-bench --op write --qd 1 --flush-every 1, whose last
# FLUSH is its final one; one process per connection).  Servers:
#   file  nbdkit file FILE
#   old   the plug built from OLD_PLUGIN (default: the plugin of commit
#         OLD_COMMIT, 65665af, where each FLUSH synced for itself, built
#         by this script from `git archive` into
#         /var/tmp/nbdplug-bench-OLD_COMMIT and kept there)
#   new   the plug of this tree (FLUSHes waiting share the next sync)
# both plugs with their defaults (writeback).  Reported per server:
# FLUSHes per second (all connections' FLUSHes / the wall time of the
# whole client run, connections included) and fdatasync calls per
# FLUSH: the plug's statsfile backend.sync.ops in every timed run;
# with FG_STRACE=1 (default) also one untimed run per server under
# strace -f -c (fdatasync and fsync), the only count for nbdkit file.
# Repetitions interleaved (file, old, new, then reversed), medians and
# lowest..highest; the ratios old/file and new/file, new/old are
# taken within one repetition.
#
# FG_SYNC_US=N runs every server under tests/shim-fdatasync.so with
# SHIM_DELAY_US=N: each fdatasync of the file costs N microseconds more,
# one at a time, as on a disk that flushes its cache slowly, one flush
# after the other.  (A file on ext4 batches concurrent fdatasync calls
# in one journal commit itself, and on a virtual disk with a write
# cache a sync takes a fraction of a millisecond.)
#
# Environment: BENCH_REPS (5), BENCH_TMPDIR (/tmp; its filesystem is
# printed: tmpfs makes fdatasync nearly free), BENCH_SIZE (64M),
# FG_CONNS (4), FG_OPS (250), FG_STRACE (1), FG_SYNC_US (0),
# OLD_PLUGIN, OLD_COMMIT (65665af), PLUGIN.

set -euo pipefail
BENCH_REPS=${BENCH_REPS:-5}
BENCH_SIZE=${BENCH_SIZE:-64M}
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

FG_CONNS=${FG_CONNS:-4}
FG_OPS=${FG_OPS:-250}
FG_STRACE=${FG_STRACE:-1}
FG_SYNC_US=${FG_SYNC_US:-0}
shim=$top_builddir/tests/.libs/shim-fdatasync.so
if [ "$FG_SYNC_US" != 0 ] && [ ! -f "$shim" ]; then
  make -C "$top_builddir/tests" shim-fdatasync.la >&2 || true
  [ -f "$shim" ] || die "FG_SYNC_US needs $shim (make -C tests shim-fdatasync.la)"
fi
OLD_COMMIT=${OLD_COMMIT:-65665af}

# The plugin of OLD_COMMIT, built once from the source tree's history.
build_old ()
{
  local dir=/var/tmp/nbdplug-bench-$OLD_COMMIT

  if [ ! -f "$dir/plugin/.libs/nbdkit-plug-plugin.so" ]; then
    echo "# building the plugin of $OLD_COMMIT in $dir" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    git -C "$bench_srcdir/.." archive "$OLD_COMMIT" | tar -x -C "$dir" ||
      die "cannot extract commit $OLD_COMMIT (set OLD_PLUGIN instead)"
    (cd "$dir" && autoreconf -fi && ./configure && make -C src &&
       make -C plugin) >"$dir.log" 2>&1 ||
      die "building $OLD_COMMIT failed: see $dir.log"
  fi
  echo "$dir/plugin/.libs/nbdkit-plug-plugin.so"
}
[ -n "${OLD_PLUGIN:-}" ] || OLD_PLUGIN=$(build_old)
[ -f "$OLD_PLUGIN" ] || die "OLD_PLUGIN not built: $OLD_PLUGIN"
old_id="$(git -C "$(dirname "$OLD_PLUGIN")/../.." describe --always --dirty 2>/dev/null || echo "$OLD_COMMIT")"
cp "$OLD_PLUGIN" "$tmp/old-plug-plugin.so"
OLD_PLUGIN=$tmp/old-plug-plugin.so
size_bytes=$(numfmt --from=iec "$BENCH_SIZE")
part=$((size_bytes / FG_CONNS))

# The client run inside the captive nbdkit: FG_CONNS nbd-bench at once,
# then the wall time of all of them.
cat > "$tmp/clients.sh" <<EOF
#!/usr/bin/env bash
set -e
uri=\$1
start=\$(date +%s%N)
pids=()
for ((i = 0; i < $FG_CONNS; i++)); do
  "$NBD_BENCH" --uri "\$uri" --op write --bs 4096 --qd 1 --flush-every 1 \\
    --ops $FG_OPS --offset \$((i * $part)) --size $part \\
    > "$tmp/client.\$i" &
  pids+=(\$!)
done
for p in "\${pids[@]}"; do wait \$p; done
end=\$(date +%s%N)
flushes=\$(cat "$tmp"/client.* | tr ' ' '\\n' | sed -n 's/^flushes=//p' |
          awk '{ n += \$1 } END { print n + 0 }')
echo "flushes=\$flushes ns=\$((end - start))"
EOF
chmod +x "$tmp/clients.sh"

# measure KIND [strace]: "flushes=N ns=N [syncs=N] [straced=N]"
measure ()
{
  local kind=$1 trace=${2:-} file=$tmp/disk stats=$tmp/stats.json out
  local -a server pre=(nbdkit)

  rm -f "$file" "$stats" "$tmp/strace.out"
  truncate -s "$BENCH_SIZE" "$file"
  case $kind in
    file) server=(file "$file") ;;
    # 65665af's plug knows only the old name statsfile=.
    old)  server=("$OLD_PLUGIN" "$file" "statsfile=$stats") ;;
    new)  server=("$PLUGIN" "$file" "stats-file=$stats") ;;
    *) die "measure: bad kind $kind" ;;
  esac
  [ "$FG_SYNC_US" != 0 ] &&
    pre=(env "LD_PRELOAD=$shim" "SHIM_PATH=$file" "SHIM_DELAY_US=$FG_SYNC_US"
         nbdkit)
  [ -n "$trace" ] &&
    pre=(strace -f -qq -c -e trace=fdatasync,fsync -o "$tmp/strace.out"
         "${pre[@]}")
  out=$("${pre[@]}" -U - "${server[@]}" --run "$tmp/clients.sh \"\$uri\"") ||
    die "failed: ${pre[*]} -U - ${server[*]}"
  out=$(tail -n1 <<<"$out")
  if [ "$kind" != file ]; then
    [ -s "$stats" ] || die "no statsfile from the $kind run"
    out+=" syncs=$(jq -r .backend.sync.ops "$stats")"
  fi
  if [ -n "$trace" ]; then
    out+=" straced=$(awk '$NF == "fdatasync" || $NF == "fsync" { n += $4 }
                          END { print n + 0 }' "$tmp/strace.out")"
  fi
  rm -f "$file"
  echo "$out"
}

range ()
{
  printf '%s\n' "$@" | sort -g |
    awk 'NR == 1 { lo = $1 } { hi = $1 } END { print lo ".." hi }'
}

fstype=$(df -T "$BENCH_TMPDIR" | awk 'NR == 2 { print $2 }')
echo "# nbdplug bench/flush-group.sh  $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# $(uname -srm), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)," \
     "$(nbdkit --version)"
echo "# new: git $plugin_id; old: $old_id"
sync_note="the real fdatasync"
[ "$FG_SYNC_US" != 0 ] &&
  sync_note="each fdatasync $FG_SYNC_US us slower (shim-fdatasync.so)"
echo "# file in $BENCH_TMPDIR ($fstype), $sync_note, size $BENCH_SIZE; $FG_CONNS" \
     "connections at once, each $FG_OPS x (4 KiB write, FLUSH, wait), QD 1," \
     "own range; $BENCH_REPS reps interleaved (reversed on even reps)"
echo "# flush/s = all FLUSHes / wall time of the client run;" \
     "sync/flush = statsfile backend.sync.ops / FLUSHes (plug only);" \
     "median (lowest..highest)"

declare -A rate=() spf=() vs=()
kinds=(file old new)
for ((rep = 1; rep <= BENCH_REPS; rep++)); do
  declare -A this=()
  seq=("${kinds[@]}")
  ((rep % 2 == 0)) && seq=(new old file)
  for kind in "${seq[@]}"; do
    line=$(measure "$kind")
    echo "$kind $rep: $line" >&2
    fl=$(field flushes "$line") ns=$(field ns "$line")
    this[$kind]=$(awk -v f="$fl" -v n="$ns" 'BEGIN { printf "%.1f", f / (n / 1e9) }')
    rate[$kind]+=" ${this[$kind]}"
    [ "$kind" != file ] && spf[$kind]+=" $(awk -v s="$(field syncs "$line")" \
      -v f="$fl" 'BEGIN { printf "%.3f", s / f }')"
  done
  vs[old]+=" $(ratio "${this[old]}" "${this[file]}")"
  vs[new]+=" $(ratio "${this[new]}" "${this[file]}")"
  vs[newold]+=" $(ratio "${this[new]}" "${this[old]}")"
  unset this
done

hdr="%-5s %10s %18s %10s %14s %12s\n"
printf "$hdr" server flush/s "flush/s range" sync/flush "sync/flush rng" "vs file"
for kind in "${kinds[@]}"; do
  s=- sr=- v=1.00
  # shellcheck disable=SC2086
  if [ "$kind" != file ]; then
    s=$(median ${spf[$kind]}) sr=$(range ${spf[$kind]})
    v="$(median ${vs[$kind]})"
  fi
  # shellcheck disable=SC2086
  printf "$hdr" "$kind" "$(median ${rate[$kind]})" "$(range ${rate[$kind]})" \
         "$s" "$sr" "$v"
done
# shellcheck disable=SC2086
echo "# new / old flush/s: $(median ${vs[newold]}) ($(range ${vs[newold]}));" \
     "new / file: $(range ${vs[new]}); old / file: $(range ${vs[old]})"

if [ "$FG_STRACE" = 1 ]; then
  echo "# one untimed run each under strace -f -c: fdatasync+fsync calls" \
       "per FLUSH"
  for kind in "${kinds[@]}"; do
    line=$(measure "$kind" strace)
    echo "$kind strace: $line" >&2
    fl=$(field flushes "$line")
    printf "#   %-5s %s calls / %s FLUSHes = %s\n" "$kind" \
           "$(field straced "$line")" "$fl" \
           "$(awk -v s="$(field straced "$line")" -v f="$fl" \
                'BEGIN { printf "%.3f", s / f }')"
  done
fi
exit 0
