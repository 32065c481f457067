/* emu_ops.h - host memory standing in for the device under the hierarchical step's host side
   (kvps_gpu__hier_create_ops): test_gpu_host and hier_procs --host run the pipeline without a
   GPU. Include after kvps_gpu.h with KVPS_GPU_INTERNAL defined. */
#ifndef KVPS_TESTS_EMU_OPS_H
#define KVPS_TESTS_EMU_OPS_H
#include <stdlib.h>
#include <string.h>

typedef struct emu_event { int countdown; } emu_event;
static kvps_result emu_ready(void) { return KVPS_OK; }
static kvps_result emu_alloc(void **p, size_t b) { *p = malloc(b ? b : 1); return *p ? KVPS_OK : KVPS_ERR_NOMEM; }
static void emu_free(void *p) { free(p); }
static kvps_result emu_copy(void *d, const void *s, size_t b, kvps_gpu_stream st) { (void)st; memmove(d, s, b); return KVPS_OK; }
static kvps_result emu_zero(void *d, size_t b, kvps_gpu_stream st) { (void)st; memset(d, 0, b); return KVPS_OK; }
static kvps_result emu_scale(float *d, const float *s, float f, size_t n, kvps_gpu_stream st) {
    (void)st;
    for (size_t i = 0; i < n; i++) d[i] = s[i] * f;
    return KVPS_OK;
}
static kvps_result emu_event_create(void **e) { *e = calloc(1, sizeof(emu_event)); return *e ? KVPS_OK : KVPS_ERR_NOMEM; }
static void emu_event_destroy(void *e) { free(e); }
/* an event is "done" on its third query: the pipeline must poll, not assume */
static kvps_result emu_event_record(void *e, kvps_gpu_stream st) { (void)st; ((emu_event *)e)->countdown = 2; return KVPS_OK; }
static kvps_result emu_event_query(void *e, int *done) {
    emu_event *v = (emu_event *)e;
    *done = v->countdown == 0;
    if (v->countdown) v->countdown--;
    return KVPS_OK;
}
static kvps_result emu_event_wait(void *e, kvps_gpu_stream st) { (void)e; (void)st; return KVPS_OK; }
static const kvps_gpu__ops emu_ops = {emu_ready, emu_alloc, emu_free, emu_alloc, emu_free, emu_copy, emu_zero, emu_scale,
                                      emu_event_create, emu_event_destroy, emu_event_record, emu_event_query,
                                      emu_event_wait};
#endif
