# Included by every Makefile.am.
NULL =
AM_CPPFLAGS = -I$(top_builddir) -I$(top_srcdir)/src
