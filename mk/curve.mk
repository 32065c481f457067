# CURVE certificates: `make certs` writes certs/server.cert(_secret) and certs/worker.cert(_secret)
# with kvps-keygen (CZMQ's zcert format). test_curve also links CZMQ to check that format both ways.
.PHONY: certs
all test test-all: $(B)/kvps-keygen  # (test_curve runs it)
$(B)/kvps-keygen: tools/kvps_keygen.c | $(B) deps
	$(CC) $(KVPS_CFLAGS) $(CFLAGS) $(PKG_CFLAGS) $< -o $@ $(LDLIBS)
CZMQ_LIBS = $(shell pkg-config --libs libczmq 2>/dev/null)
$(B)/test_curve: tests/test_curve.c $(HEADERS) | $(B) deps
	$(CC) $(KVPS_CFLAGS) $(CFLAGS) $(PKG_CFLAGS) $< -o $@ $(LDLIBS) $(CZMQ_LIBS)
certs: $(B)/kvps-keygen
	@mkdir -p certs
	$(B)/kvps-keygen certs/server certs/worker
