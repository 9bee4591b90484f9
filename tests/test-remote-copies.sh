#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# One copy per byte in front of an NBD server: the statsfile's
# bytes_copied counts every copy of client data the plug makes (the
# writeback copy, and the gathering of a merged run into one buffer for
# libnbd, which takes one buffer per command).  fio writes through the
# plug to an nbdkit memory server, at queue depth 16, and verifies what
# it wrote:
#  * 8 MiB of 64 KiB sequential writes: merged (at least 2 client writes
#    per write the server got) and copied once: the copies of a stream
#    are placed by offset (src/arena.h), so a merged run is one buffer;
#  * 4 MiB of 4 KiB random writes over 256 MiB (acknowledged from the
#    plug, see test-direct-remote.sh): copied once (where random writes
#    are dense enough to merge into runs of more than REMOTE_RUN_SEGS
#    pieces of memory, those runs are gathered: not here);
#  * hold mode, the same stream: at most once (the client waits and the
#    plug borrows nbdkit's buffers, which a merged run gathers).
# With the arena off, the stream is copied twice ("bytes_copied ... per
# client byte 2.00").  Every server must exit 0.
source ./functions.sh
set -e

requires fio --enghelp=nbd
requires jq --version
test -f "$PLUGIN"

plug_tmpdir
source "$srcdir/remote-lib.sh"

# run NAME WANT FIO-ARGS -- PLUG-PARAMS: WANT "=1", one copy per client
# byte, or "<=1", at most one.
run ()
{
  local name=$1 want=$2 fio_args=() cops bops bytes copied
  shift 2
  while [ "$1" != -- ]; do fio_args+=("$1"); shift; done
  shift
  srv_start "r-$name" unix memory 256M
  srv_start "$name" unix "$PLUGIN" "file=${srv_uri[r-$name]}" \
            stats-file="$tmp/$name.json" "$@"
  fio --name="$name" --ioengine=nbd --uri="${srv_uri[$name]}" \
      --iodepth=16 --verify=crc32c --verify_state_save=0 \
      --output-format=terse "${fio_args[@]}" > "$tmp/$name.fio"
  srv_stop "$name"
  srv_stop "r-$name"
  cops=$(jq .client.write.ops "$tmp/$name.json")
  bops=$(jq .backend.write.ops "$tmp/$name.json")
  bytes=$(jq .client.write.bytes "$tmp/$name.json")
  copied=$(jq .bytes_copied "$tmp/$name.json")
  echo "$name: $cops client writes, $bops backend writes, bytes_copied" \
       "$copied per client byte $(jq -n "$copied / $bytes * 100 | floor / 100")"
  case $want in
    =1) [ "$copied" -eq "$bytes" ] ;;
    "<=1") [ "$copied" -le "$bytes" ] ;;
  esac ||
    fail "$name: $copied bytes copied for $bytes client bytes, want $want per byte"
  [ "$(jq .retry.errors "$tmp/$name.json")" -eq 0 ]
}

run seq64k =1 --rw=write --bs=64k --size=8M --
[ $(($(jq .backend.write.ops "$tmp/seq64k.json") * 2)) -le \
  "$(jq .client.write.ops "$tmp/seq64k.json")" ] ||
  fail "seq64k: the stream did not merge"
run rand4k =1 --rw=randwrite --bs=4k --size=256M --io_size=4M --
run hold64k "<=1" --rw=write --bs=64k --size=8M -- mode=hold
echo "PASS"
