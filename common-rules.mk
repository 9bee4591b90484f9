# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Included by every Makefile.am.
NULL =
AM_CPPFLAGS = -I$(top_builddir) -I$(top_srcdir)/src
