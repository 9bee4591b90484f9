#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-dump-plugin.sh - nbdkit plug --dump-plugin and --help work
# without any file, and say what the plugin is and takes.
#
# --dump-plugin: exit 0, name=plug, thread_model=parallel (nbdkit's
# line: the plugin's model is not serialised), magic_config_key=file, and
# a plug_<parameter>_default line for every tunable.  --help: exit 0 and
# every parameter the plugin accepts is listed.
source ./functions.sh
set -e
set -x

requires nbdkit --version
plug_tmpdir

nbdkit "$PLUGIN" --dump-plugin > "$tmp/dump"
cat "$tmp/dump"
grep '^name=plug$' "$tmp/dump"
grep '^thread_model=parallel$' "$tmp/dump"
grep '^magic_config_key=file$' "$tmp/dump"
grep '^errno_is_preserved=1$' "$tmp/dump"
# Values fixed by design, not by measurement.
grep '^plug_mode_default=writeback$' "$tmp/dump"
grep '^plug_max_requests_default=256$' "$tmp/dump"
grep '^plug_requeue_delay_default=3ms$' "$tmp/dump"
grep '^plug_connect_retry_default=0$' "$tmp/dump"
# Measured or tunable ones: present, with a value.
for d in idle max_delay max_bytes max_merge max_inflight io_threads \
         requeue_max_delay requeue_timeout remote_connections \
         remote_queue_depth connect_timeout; do
  grep "^plug_${d}_default=[0-9]" "$tmp/dump"
done
grep '^plug_libev=[0-9]' "$tmp/dump"
grep '^plug_libnbd=[0-9]' "$tmp/dump"
grep '^plug_remote_tls=\(yes\|no\)$' "$tmp/dump"

nbdkit "$PLUGIN" --help > "$tmp/help"
cat "$tmp/help"
for p in file stripe mode idle max-delay max-requests max-bytes max-merge \
         max-inflight io-threads requeue-delay requeue-max-delay requeue-timeout \
         stats-file lock remote-connections remote-queue-depth connect-timeout \
         connect-retry; do
  grep "^$p=" "$tmp/help"
done
