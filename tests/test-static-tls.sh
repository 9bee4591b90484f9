#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-static-tls.sh - the plugin's thread-local variables live in the
# static TLS block (tls_model initial-exec, PLUG_THREAD_LOCAL in
# plugin.h), never in dynamic TLS.
#
# Dynamic TLS of a dlopen'd object is allocated on a thread's first
# access, through __tls_get_addr, by ld.so's malloc: one call per access
# on the hot path, and under ThreadSanitizer a race report between that
# malloc and the freeing of a finished thread's TLS inside glibc, or a
# SEGV in TSan's own __tls_get_addr hook (both seen in test-churn).  So
# the plugin must not import __tls_get_addr nor carry a module-ID
# relocation (DTPMOD64; TLSDESC on other architectures).
source ./functions.sh
set -e
set -x

requires readelf --version
test -f "$PLUGIN"

plug_tmpdir

readelf -W --dyn-syms "$PLUGIN" > "$tmp/syms"
readelf -W --relocs "$PLUGIN" > "$tmp/relocs"
readelf -W --dynamic "$PLUGIN" > "$tmp/dynamic"
if grep -w '__tls_get_addr' "$tmp/syms"; then
  fail "the plugin calls __tls_get_addr: a thread-local variable without PLUG_THREAD_LOCAL"
fi
if grep -E 'DTPMOD|TLSDESC' "$tmp/relocs"; then
  fail "the plugin has dynamic TLS relocations (above)"
fi
# It does have thread-local variables, in the static block: ld marks
# such an object STATIC_TLS.  (Without any, this test would check
# nothing.)
grep -E 'FLAGS.*STATIC_TLS' "$tmp/dynamic" ||
  fail "the plugin's dynamic section has no STATIC_TLS flag"
echo "no dynamic TLS: no __tls_get_addr, no DTPMOD/TLSDESC relocation, STATIC_TLS set"
