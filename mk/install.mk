# make install / uninstall: the headers into $(PREFIX)/include, kvps-run, kvps-timeline and kvps-keygen into $(PREFIX)/bin,
# libkvps.so (the headers' implementation and the flat ABI of kvps_abi.h) into $(PREFIX)/lib and
# kvps.pc (made from kvps.pc.in) into $(PREFIX)/lib/pkgconfig. DESTDIR is prepended to every
# path (staged installs); the paths written into kvps.pc leave it out, and name the include
# directory from ${prefix} so `pkg-config --define-variable=prefix=DIR` relocates it.
#   make install PREFIX=/usr/local
#   cc prog.c $(pkg-config --cflags --libs kvps)          (prog.c defines KVPS_IMPLEMENTATION)
#   cc prog.c $(pkg-config --cflags --libs kvps) -lkvps   (or links libkvps.so instead; run ldconfig
#                                                          after installing into a system directory)
PREFIX       ?= /usr/local
INCLUDEDIR   ?= $(PREFIX)/include
BINDIR       ?= $(PREFIX)/bin
LIBDIR       ?= $(PREFIX)/lib
PKGCONFIGDIR ?= $(PREFIX)/lib/pkgconfig
INSTALL      ?= install
KVPS_HEADERS := kvps_core.h kvps_codec.h kvps_launch.h kvps.h kvps_ring.h kvps_fuse.h kvps_gpu.h kvps_abi.h
# the version on kvps.h's identity line: "kvps.h - v0.1 - ..."
KVPS_VERSION := $(shell sed -n '1s/^.* - v\([0-9][0-9.]*\) - .*$$/\1/p' kvps.h)

.PHONY: install uninstall

$(B)/kvps.pc: kvps.pc.in kvps.h | $(B)
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@INCLUDEDIR@|$(patsubst $(PREFIX)/%,$${prefix}/%,$(INCLUDEDIR))|' \
	  -e 's|@LIBDIR@|$(patsubst $(PREFIX)/%,$${prefix}/%,$(LIBDIR))|' -e 's|@VERSION@|$(KVPS_VERSION)|' $< > $@

install: $(B)/kvps.pc $(B)/kvps-keygen $(B)/libkvps.so
	$(INSTALL) -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PKGCONFIGDIR)
	$(INSTALL) -m 644 $(KVPS_HEADERS) $(DESTDIR)$(INCLUDEDIR)/
	$(INSTALL) -m 755 scripts/kvps-run $(DESTDIR)$(BINDIR)/kvps-run
	$(INSTALL) -m 755 scripts/kvps-timeline $(DESTDIR)$(BINDIR)/kvps-timeline
	$(INSTALL) -m 755 $(B)/kvps-keygen $(DESTDIR)$(BINDIR)/kvps-keygen
	$(INSTALL) -m 755 $(B)/libkvps.so $(DESTDIR)$(LIBDIR)/libkvps.so
	$(INSTALL) -m 644 $(B)/kvps.pc $(DESTDIR)$(PKGCONFIGDIR)/kvps.pc

uninstall:
	rm -f $(addprefix $(DESTDIR)$(INCLUDEDIR)/,$(KVPS_HEADERS)) $(DESTDIR)$(BINDIR)/kvps-run $(DESTDIR)$(BINDIR)/kvps-timeline \
	  $(DESTDIR)$(BINDIR)/kvps-keygen $(DESTDIR)$(LIBDIR)/libkvps.so \
	  $(DESTDIR)$(PKGCONFIGDIR)/kvps.pc
