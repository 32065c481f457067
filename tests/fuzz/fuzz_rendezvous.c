/* fuzz_rendezvous - what a rendezvous reads (kvps_launch.h, >>wire): rank 0 reads registrations
   from anyone who reaches its port, the other ranks read rank 0's table or error. The input is
   one message as it arrives, fed to kvps__rdv_parse, the one decoder of both sides.

   Properties: a message the decoder accepts is made again, byte for byte, by the writer from what
   was decoded (so every field was read and nothing was left over: header, token, shape and the
   register's entry; every entry of a table, walked with kvps__rdv_next, exactly `size` of them
   ending at the last byte; the error's text); the strings it gives are within their limits and
   hold no NUL before their end; a refusal is one of the documented codes. No crash, leak or
   out-of-bounds access. */
#define KVPS_IMPLEMENTATION
#include "kvps_ring.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    kvps_log_set_fn(fz_nolog, NULL);
    return 0;
}

static void put_entry(kvps__rdv_buf *b, const kvps__rdv_entry *e) {
    kvps__rdv_put_str(b, e->endpoint, KVPS__RDV_STR_MAX);
    kvps__rdv_put_str(b, e->host, KVPS__RDV_STR_MAX);
    kvps__rdv_put_str(b, e->name, KVPS__RDV_STR_MAX);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kvps__rdv_msg m;
    kvps_result rc = kvps__rdv_parse(data, size, &m);
    if (rc != KVPS_OK) {
        FZ_CHECK(rc == KVPS_ERR_MALFORMED || rc == KVPS_ERR_MAGIC || rc == KVPS_ERR_VERSION || rc == KVPS_ERR_OP,
                 "refused with %s", kvps_result_str(rc));
        return 0;
    }
    FZ_CHECK(m.size >= 1 && m.size <= (1u << 24) && m.rank < m.size, "rank %u of %u", m.rank, m.size);
    kvps__rdv_buf b = {NULL, 0, 0, 1};
    kvps__rdv_put_hdr(&b, m.type, m.rank, m.size);
    if (m.type == KVPS__RDV_REGISTER) {
        FZ_CHECK(strlen(m.shape) <= KVPS__RDV_SHAPE_MAX && strlen(m.e.endpoint) <= KVPS__RDV_STR_MAX &&
                 strlen(m.e.host) <= KVPS__RDV_STR_MAX && strlen(m.e.name) <= KVPS__RDV_STR_MAX, "a string over its limit");
        kvps__rdv_put(&b, &m.token, 8);
        kvps__rdv_put_str(&b, m.shape, KVPS__RDV_SHAPE_MAX);
        put_entry(&b, &m.e);
    } else if (m.type == KVPS__RDV_TABLE) {
        size_t off = 0;
        kvps__rdv_entry e;
        for (uint32_t i = 0; i < m.size; i++) {
            FZ_CHECK(kvps__rdv_next(m.body, m.blen, &off, &e), "entry %u of %u does not read back", i, m.size);
            put_entry(&b, &e);
        }
        FZ_CHECK(off == m.blen, "the table's entries end at %zu of %zu", off, m.blen);
    } else if (m.type == KVPS__RDV_ERROR) {
        FZ_CHECK(strlen(m.text) <= KVPS__RDV_ERR_MAX, "error text of %zu", strlen(m.text));
        kvps__rdv_put_str(&b, m.text, KVPS__RDV_ERR_MAX);
    } else {
        FZ_CHECK(m.type == KVPS__RDV_ACK, "type %u accepted", m.type);
    }
    FZ_CHECK(b.ok && b.n == size && memcmp(b.p, data, size) == 0, "accepted %zu bytes are not what the writer makes (%zu)", size, b.n);
    free(b.p);
    return 0;
}
