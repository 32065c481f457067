/* fuzz_ckpt - kvps_server_restore on arbitrary files, then the restored server at work: every
   restored key pushed by every rank (so BSP rounds apply and each key's rule runs on its restored
   optimizer state), pulled, and every restored table's rows pushed and pulled, through
   kvps__handle as in fuzz_server. A checkpoint is a file anyone with write access to the path
   can replace, and CRC-32 is no protection against a crafted one.

   Input: [mode byte][file]. Mode bit 0: the file is everything before the checksum: the harness
   appends CRC-32 and "KEND" as the writer does, so that the fuzzer gets past the checksum into
   the records. The server: rank 0, 1 worker, BSP, max_value_len 1 << 16 (what the seeds from
   gen_corpus were written by).

   Properties: no crash, leak or hang, during the restore or after it; a refused file leaves the
   server empty (no keys, no tables, no placement); a restore only ever answers OK or KVPS_ERR_CHECKPOINT. */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/kvps_test.h" /* KT_HDR */
#include <unistd.h>

static void *fz_ctx;
static int fz_seq;
static char fz_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    fz_ctx = zmq_ctx_new();
    kvps_log_set_fn(fz_nolog, NULL);
    kvps_log_set_level(KVPS_LOG_DEBUG);
    snprintf(fz_path, sizeof fz_path, "/tmp/kvps-fuzz-ckpt-%d", (int)getpid());
    return 0;
}

/* The checkpoint's CRC-32 (reflected, polynomial 0xEDB88320), written out here on purpose. */
static uint32_t fz_crc32(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int j = 0; j < 8; j++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
    }
    return ~c;
}

/* One request [id][meta][values?] handed to the server as kvps_server_run would. */
static void fz_send(kvps_server *s, const void *meta, size_t msz, const void *vals, size_t vsz) {
    zmq_msg_t fr[3];
    zmq_msg_init_size(&fr[0], 4);
    memcpy(zmq_msg_data(&fr[0]), "fzck", 4);
    zmq_msg_init_size(&fr[1], msz);
    memcpy(zmq_msg_data(&fr[1]), meta, msz);
    int n = 2;
    if (vals) {
        zmq_msg_init_size(&fr[2], vsz);
        if (vsz) memcpy(zmq_msg_data(&fr[2]), vals, vsz);
        n = 3;
    }
    kvps__handle(s, fr, n);
    for (int i = 0; i < n; i++) zmq_msg_close(&fr[i]);
}

static void fz_exercise(kvps_server *s) {
    uint64_t id = 1000;
    uint32_t nk = s->nkeys < 64 ? s->nkeys : 64;
    for (uint32_t i = 0; i < nk; i++) {
        kvps__key *k = s->keys[i];
        if (k->len > 4096) continue;
        uint8_t meta[KVPS__HDR + KVPS__KENT];
        kvps__kent e = {k->key, k->len};
        float *g = (float *)calloc((size_t)k->len, sizeof(float));
        for (uint64_t j = 0; j < k->len; j++) g[j] = (float)(j % 3) - 1.0f;
        for (uint32_t r = 0; r < (uint32_t)s->m; r++) {
            kvps__hdr h = KT_HDR(.op = KVPS__OP_PUSHPULL, .rank = r, .nkeys = 1, .req_id = id++);
            memcpy(meta, &h, sizeof h);
            memcpy(meta + KVPS__HDR, &e, sizeof e);
            fz_send(s, meta, sizeof meta, g, (size_t)k->len * sizeof(float));
        }
        free(g);
    }
    int nt = 0;
    for (kvps__table *t = s->tables; t && nt < 8; t = t->next, nt++) {
        if (t->dim > 4096) continue;
        uint64_t ids[3] = {1, 77, t->nrows ? 5 : 9};
        uint8_t meta[KVPS__HDR + 16 + 3 * 8];
        kvps__hdr h;
        memset(meta, 0, sizeof meta);
        memcpy(meta + KVPS__HDR, &t->id, 8);
        memcpy(meta + KVPS__HDR + 8, &t->dim, 4);
        memcpy(meta + KVPS__HDR + 16, ids, sizeof ids);
        float *g = (float *)calloc((size_t)3 * t->dim, sizeof(float));
        for (size_t j = 0; j < (size_t)3 * t->dim; j++) g[j] = 0.5f;
        h = KT_HDR(.op = KVPS__OP_PUSH_ROWS, .rank = 0, .nkeys = 3, .req_id = id++);
        memcpy(meta, &h, sizeof h);
        fz_send(s, meta, sizeof meta, g, (size_t)3 * t->dim * sizeof(float));
        h = KT_HDR(.op = KVPS__OP_PULL_ROWS, .rank = 1, .nkeys = 3, .req_id = id++);
        memcpy(meta, &h, sizeof h);
        fz_send(s, meta, sizeof meta, NULL, 0);
        free(g);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    FILE *f = fopen(fz_path, "wb");
    FZ_CHECK(f != NULL, "cannot write %s", fz_path);
    fwrite(data + 1, 1, size - 1, f);
    if (data[0] & 1) {
        uint32_t crc = fz_crc32(data + 1, size - 1);
        fwrite(&crc, 4, 1, f);
        fwrite("KEND", 1, 4, f);
    }
    fclose(f);
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://fuzz-ckpt-%d", fz_seq++);
    kvps_server *s = NULL;
    FZ_CHECK(kvps_server_create(&(kvps_server_desc){.endpoint = ep, .num_workers = 1, .max_value_len = 1 << 16,
                                                     .zmq_ctx = fz_ctx, .no_malloc_tuning = 1,
                                                     .user_rules = fz_user_rules, .num_user_rules = 1},
                                &s) == KVPS_OK,
             "server");
    kvps_result r = kvps_server_restore(s, fz_path);
    unlink(fz_path);
    FZ_CHECK(r == KVPS_OK || r == KVPS_ERR_CHECKPOINT, "restore: %s", kvps_result_str(r));
    if (r != KVPS_OK)
        FZ_CHECK(s->nkeys == 0 && !s->tables && !s->place.count, "a refused checkpoint left %u keys / tables / a placement behind",
                 s->nkeys);
    else fz_exercise(s);
    kvps_server_destroy(&s);
    if (fz_seq % 64 == 0) { /* see fuzz_server.c */
        zmq_ctx_term(fz_ctx);
        fz_ctx = zmq_ctx_new();
    }
    return 0;
}
