#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Build the engine's fuzz target (fuzz-engine.c) with libFuzzer, ASan
# and UBSan, and run it for a bounded time from a copy of the corpus.
#
#   tests/fuzz/run-engine-fuzzer.sh [SECONDS [OUTDIR]]
#
# SECONDS: -max_total_time (default 120).  OUTDIR (default
# ./fuzz-engine-out): the binary, the working corpus, and any crash
# input (crash-*), which fuzz-engine CRASH or tests/unit/test-fuzz-engine
# CRASH replays.  Needs clang with libclang-rt (Debian:
# libclang-rt-14-dev) and a configured tree (config.h): run from the
# top of the build tree.  CC overrides clang.  Prints the executions
# and the outcome; exits 1 if the target crashed, 2 if it could not be
# built or run.
set -uo pipefail

secs=${1:-120}
out=${2:-fuzz-engine-out}
src=$(cd "$(dirname "$0")/../.." && pwd)
cc=${CC_FUZZ:-clang}

if [ ! -f config.h ]; then
  echo "run-engine-fuzzer: no config.h here: run from a configured tree" >&2
  exit 2
fi
mkdir -p "$out/corpus" || exit 2
cp "$src"/tests/fuzz/corpus/engine/* "$out/corpus/" 2>/dev/null
# The core is compiled in with the target (not libplugcore.la), so
# that libFuzzer's coverage sees inside the engine.
if ! $cc -g -O1 -fsanitize=fuzzer,address,undefined \
     -fno-sanitize-recover=undefined \
     -I. -I"$src/src" -I"$src/tests/unit" -I"$src/tests/fuzz" \
     "$src/tests/fuzz/fuzz-engine.c" "$src/tests/unit/engine-model.c" \
     "$src/tests/unit/engine-harness.c" "$src"/src/engine*.c \
     "$src"/src/itree.c "$src"/src/plug.c "$src"/src/retry.c \
     "$src"/src/stats.c -o "$out/fuzz-engine"; then
  echo "run-engine-fuzzer: could not build the fuzz target with $cc" >&2
  exit 2
fi

rm -f "$out"/crash-* "$out"/leak-* "$out"/timeout-* "$out"/oom-*
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
"$out/fuzz-engine" -max_total_time="$secs" -max_len=8192 -timeout=60 \
  -print_final_stats=1 -artifact_prefix="$out/" "$out/corpus" \
  >"$out/fuzz.log" 2>&1
rc=$?
execs=$(awk '/stat::number_of_executed_units:/ { print $2 }' "$out/fuzz.log")
grep -E '^#[0-9]+ *(INITED|DONE)' "$out/fuzz.log"
found=$(ls "$out"/crash-* "$out"/leak-* "$out"/timeout-* "$out"/oom-* \
        2>/dev/null)
echo "fuzz-engine: ${execs:-?} executions in ${secs} s, exit status $rc," \
     "corpus $(ls "$out/corpus" | wc -l) inputs"
if [ $rc -ne 0 ] || [ -n "$found" ]; then
  grep -E 'fuzz-engine: the model failed|ERROR: |SUMMARY: |runtime error' \
    "$out/fuzz.log" | head -n 20
  echo "fuzz-engine: FAILED; input saved: ${found:-none} (log: $out/fuzz.log)"
  exit 1
fi
echo "fuzz-engine: no failure"
