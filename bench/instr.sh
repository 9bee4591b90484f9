#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# shellcheck disable=SC2059 # printf formats are shared variables.
# bench/instr.sh: user-space instructions per request of the server
# process, the plug against `nbdkit file`, counted by valgrind's
# callgrind.  Where bench/cpu.sh times the server on a machine whose
# noise moves a ratio by 10-20% from one run to the next, an
# instruction count repeats to within a fraction of a percent: it
# resolves a change of a few dozen instructions per request.  It sees
# only user space (nbdkit, libc, the plugin), not the kernel's work
# (system calls, context switches), which cpu.sh measures.
#
# One count: nbdkit -f under `valgrind --tool=callgrind`, a fresh
# backing file in $BENCH_TMPDIR (/dev/shm), fio --ioengine=nbd with
# --number_ios=N at QD $BENCH_QD, then SIGTERM.  Each server and
# pattern is counted at N = $INSTR_IOS and at 2N; (count(2N) -
# count(N)) / N is the cost of one request, free of the start and the
# exit (loading libnbd, the handshake), which a single count would
# spread over the requests.
#
# Environment: INSTR_IOS (10000), BENCH_QD (16), BENCH_TMPDIR
# (/dev/shm), INSTR_PATTERNS (fio --rw values, "write randwrite"),
# BENCH_PLUG_ARGS (more plugin parameters), PLUGIN.  valgrind and fio
# are needed.  About 3 minutes on 2 cores.

set -euo pipefail
BENCH_TMPDIR=${BENCH_TMPDIR:-/dev/shm}
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
for cmd in valgrind callgrind_annotate fio; do
  command -v "$cmd" >/dev/null || die "$cmd not found"
done

n=${INSTR_IOS:-10000}
patterns=${INSTR_PATTERNS:-write randwrite}
read -r -a plug_args <<<"${BENCH_PLUG_ARGS:-}"

# count KIND RW IOS: the server's user-space instructions over a run of
# IOS 4 KiB requests (callgrind's program total).
count ()
{
  local kind=$1 rw=$2 ios=$3 sock=$tmp/sock pidfile=$tmp/pid
  local out=$tmp/callgrind.out vp i rc=0
  local -a server

  rm -f "$tmp/disk" "$sock" "$pidfile" "$out"
  truncate -s 256M "$tmp/disk"
  case $kind in
    file) server=(file "$tmp/disk") ;;
    plug) server=("$PLUGIN" "$tmp/disk" "${plug_args[@]}") ;;
  esac
  valgrind -q --tool=callgrind --callgrind-out-file="$out" \
    nbdkit -f -U "$sock" -P "$pidfile" "${server[@]}" \
    >>"$tmp/server.log" 2>&1 &
  vp=$!
  for ((i = 0; i < 1200; i++)); do
    [ -S "$sock" ] && [ -s "$pidfile" ] && break
    kill -0 "$vp" 2>/dev/null || die "$kind server exited at start"
    sleep 0.05
  done
  [ -s "$pidfile" ] || die "$kind server did not start"
  fio --name=instr --ioengine=nbd --uri="nbd+unix:///?socket=$sock" \
      --rw="$rw" --bs=4k --iodepth="$BENCH_QD" --size=256M \
      --number_ios="$ios" --output-format=terse >>"$tmp/fio.log" 2>&1 ||
    die "fio failed against the $kind server"
  kill -TERM "$(cat "$pidfile")"
  wait "$vp" || rc=$?
  [ "$rc" = 0 ] || die "$kind server exited with status $rc"
  callgrind_annotate "$out" 2>/dev/null |
    awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }'
}

# per_request KIND RW: instructions per request (see the top).
per_request ()
{
  local a b
  a=$(count "$1" "$2" "$n")
  b=$(count "$1" "$2" $((2 * n)))
  awk -v a="$a" -v b="$b" -v n="$n" 'BEGIN { printf "%.0f", (b - a) / n }'
}

echo "# nbdplug bench/instr.sh  $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# $(nbdkit --version), $(valgrind --version), git $plugin_id${BENCH_PLUG_ARGS:+, plug: $BENCH_PLUG_ARGS}"
echo "# user-space instructions of the server per 4 KiB request, QD $BENCH_QD," \
     "counted over $n requests (runs of $n and $((2 * n)))"
hdr="%-12s %10s %10s %7s\n"
printf "$hdr" pattern file plug ratio
for rw in $patterns; do
  f=$(per_request file "$rw")
  p=$(per_request plug "$rw")
  printf "$hdr" "$rw" "$f" "$p" "$(ratio "$p" "$f")"
done
