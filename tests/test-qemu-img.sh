#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-qemu-img.sh - qemu's NBD client (qemu-img, qemu-io) against the plug.
#
# For mode=writeback and mode=hold, on a concatenation of three files with the
# boundaries at odd places (3M+5M+8M) and on a stripe=64k export of two equal
# files (8M+8M), this proves that:
#  * qemu-img info sees the size of all backing files together;
#  * qemu-io pattern writes read back correctly, including requests that
#    cross one or two backing-file boundaries, unaligned ones, overlapping
#    writes, bursts of concurrent aio writes (which the plug may merge),
#    write-zeroes and trim followed by writes;
#  * after qemu-img convert -n (it ends with FLUSH) the backing files hold
#    the random image while the server still runs (flush made it durable),
#    qemu-img compare agrees both ways, and after the server stops the
#    backing files (concatenated / de-striped) still equal the image, at
#    their original sizes.
#
# Negative control (this test can fail): with nbdkit's null plugin, which
# discards writes ("cd tests && PLUGIN=null ./test-qemu-img.sh"), it fails
# with "Pattern verification failed" in the qemu-io output.
source ./functions.sh
set -euo pipefail
source "${srcdir:-.}/vm/serve-lib.sh"

requires qemu-img --version
requires qemu-io --version
requires nbdkit --version

plug_resolve
plug_tmpdir

K=1024
M=$((1024 * 1024))

# run_qemu_io URI CMD...: run qemu-io with one -c per CMD; FAIL on any error,
# pattern mismatch, or if not every read/write reported completion.
run_qemu_io ()
{
  local uri=$1 c want=0 got rc=0 out
  shift
  local args=()
  for c; do
    args+=(-c "$c")
    case $c in write*|read*|aio_write*) want=$((want + 1)) ;; esac
  done
  out=$(timeout 120 qemu-io -f raw "${args[@]}" "$uri" 2>&1) || rc=$?
  got=$(grep -cE '^(wrote|read) ' <<<"$out" || :)
  if [ "$rc" -ne 0 ] || grep -qiE 'fail|error|verif|mismatch' <<<"$out" ||
     [ "$got" -ne "$want" ]; then
    printf '%s\n' "$out"
    fail "qemu-io (status $rc, $got/$want requests completed): $*"
  fi
}

# check_backing LAYOUT IMAGE FILES...: the backing files, joined as the
# layout says, equal IMAGE, and have kept their sizes.
check_backing ()
{
  local layout=$1 image=$2 k j n
  shift 2
  local files=("$@")
  n=${#files[@]}
  case $layout in
    concat)
      cat "${files[@]}" | cmp - "$image" ||
        fail "$layout: backing files differ from $image"
      ;;
    stripe)
      rm -rf "$tmp/chunks"
      mkdir "$tmp/chunks"
      split -a 6 -d -b 64k "$image" "$tmp/chunks/c"
      local chunks=("$tmp"/chunks/c*)
      for ((k = 0; k < n; ++k)); do
        local mine=()
        for ((j = k; j < ${#chunks[@]}; j += n)); do mine+=("${chunks[j]}"); done
        cat "${mine[@]}" | cmp - "${files[k]}" ||
          fail "$layout: backing file ${files[k]} is not stripe $k of $image"
      done
      rm -rf "$tmp/chunks"
      ;;
  esac
}

run_one ()
{
  local layout=$1 mode=$2 sizes f i size=0 sock uri b1 b2 info
  local files=() params=()
  case $layout in
    concat) sizes="3 5 8" ;;
    stripe) sizes="8 8"; params+=(stripe=64k) ;;   # stripe, then the files
  esac
  say "--- layout=$layout mode=$mode (files: ${sizes// /M+}M)"
  i=0
  for s in $sizes; do
    f=$tmp/$layout-$mode-$i.img
    truncate -s "${s}M" "$f"
    files+=("$f")
    params+=("file=$f")           # in order: the plug concatenates in order
    size=$((size + s * M))
    i=$((i + 1))
  done
  params+=("mode=$mode")

  sock=$tmp/$layout-$mode.sock
  uri="nbd+unix:///?socket=$sock"
  serve "$sock" "${params[@]}"

  info=$(timeout 60 qemu-img info -f raw --output=json "$uri") ||
    fail "qemu-img info failed"
  grep -q "\"virtual-size\": $size," <<<"$info" || {
    printf '%s\n' "$info"
    fail "qemu-img info: virtual size is not $size"
  }

  # Boundaries: concat 3M and 8M (file edges); stripe: both are also
  # stripe-chunk edges (every 64k).
  b1=$((3 * M)) b2=$((8 * M))

  # Phase 1: bursts of concurrent 4k aio writes (the plug may merge them):
  # one contiguous across b2, one with gaps inside file 2.  Then single
  # writes, each with its own pattern: across b1, unaligned across b2 (over
  # the burst), overlapping ones, and the last 4k of the export.
  local cmds=()
  for ((i = 0; i < 16; ++i)); do
    cmds+=("aio_write -P 0x77 $((b2 - 32 * K + i * 4 * K)) 4k")
  done
  for ((i = 0; i < 16; ++i)); do
    cmds+=("aio_write -P $((0x80 + i)) $((5 * M + i * 8 * K)) 4k")
  done
  cmds+=(
    "aio_flush"
    "write -P 0x11 0 64k"
    "write -P 0x22 $((b1 - 4 * K)) 8k"
    "write -P 0x33 $((b2 - 512)) 1536"
    "write -P 0x44 $((1 * M)) 64k"
    "write -P 0x55 $((1 * M + 16 * K)) 16k"
    "write -P 0x66 $((size - 4 * K)) 4k"
    "read -P 0x11 0 64k"
    "read -P 0x22 $((b1 - 4 * K)) 8k"
    "read -P 0x77 $((b2 - 32 * K)) $((32 * K - 512))"
    "read -P 0x33 $((b2 - 512)) 1536"
    "read -P 0x77 $((b2 + 1024)) $((32 * K - 1024))"
    "read -P 0 $((b2 + 32 * K)) 4k"
    "read -P 0x44 $((1 * M)) 16k"
    "read -P 0x55 $((1 * M + 16 * K)) 16k"
    "read -P 0x44 $((1 * M + 32 * K)) 32k"
    "read -P 0x66 $((size - 4 * K)) 4k"
  )
  for ((i = 0; i < 16; ++i)); do
    cmds+=("read -P $((0x80 + i)) $((5 * M + i * 8 * K)) 4k"
           "read -P 0 $((5 * M + i * 8 * K + 4 * K)) 4k")
  done
  cmds+=("flush")
  run_qemu_io "$uri" "${cmds[@]}"

  # Phase 2: one write spanning all of file 2 (both boundaries), zeroes and
  # trim across boundaries, without a flush in between.
  run_qemu_io "$uri" \
    "write -P 0x99 $((b1 - 64 * K)) $((b2 - b1 + 128 * K))" \
    "read -P 0x99 $((b1 - 64 * K)) $((b2 - b1 + 128 * K))" \
    "write -z $((b1 - 8 * K)) 16k" \
    "read -P 0x99 $((b1 - 64 * K)) 56k" \
    "read -P 0 $((b1 - 8 * K)) 16k" \
    "read -P 0x99 $((b1 + 8 * K)) 56k" \
    "write -z $((b2 - 100 * K)) $((200 * K))" \
    "read -P 0 $((b2 - 100 * K)) $((200 * K))" \
    "discard $((b2 - 64 * K)) 128k" \
    "write -P 0xaa $((b2 - 64 * K)) 128k" \
    "read -P 0xaa $((b2 - 64 * K)) 128k" \
    "read -P 0x99 $((b2 - 164 * K)) 64k" \
    "read -P 0 $((b2 - 100 * K)) 36k" \
    "read -P 0 $((b2 + 64 * K)) 36k" \
    "flush"

  # Phase 3: a random image with zero runs across both boundaries (qemu-img
  # sends those as write-zeroes), copied out of order (-W).
  head -c "$size" /dev/urandom > "$tmp/rand.img"
  dd if=/dev/zero of="$tmp/rand.img" conv=notrunc bs=64k status=none \
     seek=$(( (b1 - 512 * K) / (64 * K) )) count=16
  dd if=/dev/zero of="$tmp/rand.img" conv=notrunc bs=64k status=none \
     seek=$(( (b2 - 192 * K) / (64 * K) )) count=4
  timeout 120 qemu-img convert -n -W -f raw -O raw "$tmp/rand.img" "$uri" ||
    fail "qemu-img convert failed"
  # convert ends with FLUSH: the data must be in the files now.
  check_backing "$layout" "$tmp/rand.img" "${files[@]}"
  timeout 120 qemu-img compare -f raw -F raw "$tmp/rand.img" "$uri" ||
    fail "qemu-img compare image export"
  timeout 120 qemu-img compare -f raw -F raw "$uri" "$tmp/rand.img" ||
    fail "qemu-img compare export image"

  serve_stop "$SERVE_PID"
  check_backing "$layout" "$tmp/rand.img" "${files[@]}"
  i=0
  for s in $sizes; do
    [ "$(stat -c %s "${files[i]}")" -eq $((s * M)) ] ||
      fail "backing file ${files[i]} changed size"
    i=$((i + 1))
  done
  rm -f "${files[@]}"
  say "ok: layout=$layout mode=$mode"
}

for layout in concat stripe; do
  for mode in writeback hold; do
    run_one "$layout" "$mode"
  done
done
say "PASS"
