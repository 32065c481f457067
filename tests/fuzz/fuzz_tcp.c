/* fuzz_tcp - what the ring reads from its own TCP connections (kvps_ring.h, >>tcp): the
   preamble a connection to the data port must start with (kvps_ring__tcp_auth_check, the first
   bytes a stranger can send), then the frames of an accepted connection as they come, cut
   anywhere by the kernel (kvps_ring__frame_take, the decoder shared with shared memory).

   Input: [flags][size][me][preamble 32 bytes][tokens 16 x (size % 8 + 2) bytes... taken from
   the input, zero where it ends][cuts 8 bytes][stream...]. The ring has size % 8 + 2 ranks and
   this rank is me % that. flags bit 0: the preamble's token is overwritten with the true token
   of the rank it names (when it names one), so the accepting path is reached too.

   Properties: the preamble is accepted exactly when an independent check says so (magic,
   version, ring size, a peer rank other than this one, its token byte for byte), and then names
   that rank; the stream, fed in pieces whose lengths the cut bytes give, yields exactly the
   messages a plain parse of the whole stream finds (lengths and payload bytes), stops at the
   same malformed prefix, and never allocates more than the limit (a small
   KVPS_RING__SHM_MSG_MAX, as in fuzz_shm.c). No crash, leak or out-of-bounds access. */
#define KVPS_RING__SHM_MSG_MAX ((uint64_t)1 << 20)
#define KVPS_IMPLEMENTATION
#include "kvps_ring.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    kvps_log_set_fn(fz_nolog, NULL);
    return 0;
}

/* The oracle: the next message of a whole stream at *pos: 1 (its length and payload's start),
   0 the stream ends inside it, -1 malformed. */
static int plain_next(const uint8_t *s, size_t n, size_t *pos, uint64_t *len, const uint8_t **pl) {
    if (n - *pos < 48) return 0;
    uint64_t l;
    uint32_t m;
    memcpy(&l, s + *pos, 8);
    memcpy(&m, s + *pos + 8, 4);
    if (m != KVPS_RING__MAGIC || l > KVPS_RING__SHM_MSG_MAX) return -1;
    if (n - *pos - 48 < l) return 0;
    *len = l;
    *pl = s + *pos + 48;
    *pos += 48 + (size_t)l;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3 + KVPS_RING__TCP_AUTH) return 0;
    int flags = data[0], k = data[1] % 8 + 2, me = data[2] % k;
    unsigned char pre[KVPS_RING__TCP_AUTH], tokens[16 * 9];
    memcpy(pre, data + 3, sizeof pre);
    size_t at = 3 + sizeof pre;
    memset(tokens, 0, sizeof tokens);
    for (size_t i = 0; i < 16 * (size_t)k && at < size; i++) tokens[i] = data[at++];
    uint16_t named;
    memcpy(&named, pre + 6, 2);
    if ((flags & 1) && named < k) memcpy(pre + 16, tokens + 16 * named, 16);

    /* the preamble against the independent check */
    uint32_t m, sz;
    uint16_t v;
    memcpy(&m, pre, 4);
    memcpy(&v, pre + 4, 2);
    memcpy(&sz, pre + 8, 4);
    int want = m == KVPS_RING__TCP_MAGIC && v == KVPS_RING__TCP_VERSION && sz == (uint32_t)k && named < k && named != me &&
               memcmp(pre + 16, tokens + 16 * (size_t)named, 16) == 0;
    int src = -1;
    const char *why = NULL;
    int got = kvps_ring__tcp_auth_check(pre, k, me, tokens, &src, &why) == 0;
    FZ_CHECK(got == want, "preamble accepted %d, the independent check says %d", got, want);
    FZ_CHECK(!got || src == named, "accepted as rank %d, it names %d", src, named);
    FZ_CHECK(got || why != NULL, "refused without a reason");

    /* the stream, in pieces, against a plain parse of the whole */
    uint8_t cuts[8] = {1, 7, 48, 3, 200, 64, 13, 255};
    for (int i = 0; i < 8 && at < size; i++) cuts[i] = data[at++];
    const uint8_t *s = data + at;
    size_t n = size - at, pos = 0, fed = 0;
    kvps_ring__frame_rd st;
    memset(&st, 0, sizeof st);
    int c = 0, stop = 0;
    while (fed < n && !stop) {
        size_t piece = (size_t)cuts[c++ % 8] + 1;
        if (piece > n - fed) piece = n - fed;
        size_t off = 0;
        while (off < piece) {
            size_t used = 0;
            const char *w = NULL;
            int r = kvps_ring__frame_take(&st, s + fed + off, piece - off, &used, KVPS_RING__MAGIC, KVPS_RING__SHM_MSG_MAX, &w);
            FZ_CHECK(used <= piece - off, "took more than it was given");
            off += used;
            if (r == 1) {
                uint64_t len = 0;
                const uint8_t *pl = NULL;
                int o = plain_next(s, n, &pos, &len, &pl);
                FZ_CHECK(o == 1, "a message the plain parse does not find (%d)", o);
                FZ_CHECK(zmq_msg_size(&st.m) == len && st.len == len, "a message of the wrong length");
                FZ_CHECK(len == 0 || memcmp(zmq_msg_data(&st.m), pl, (size_t)len) == 0, "a message with other bytes");
                FZ_CHECK(fed + off == pos, "the message ends at %zu, the plain parse says %zu", fed + off, pos);
                zmq_msg_close(&st.m);
                continue;
            }
            if (r < 0) {
                FZ_CHECK(r == -2 || w != NULL, "malformed without a reason");
                if (r == -1) {
                    uint64_t len;
                    const uint8_t *pl;
                    FZ_CHECK(plain_next(s, n, &pos, &len, &pl) == -1, "called malformed where the plain parse is not");
                }
                if (st.on) zmq_msg_close(&st.m);
                st.on = 0;
                stop = 1;
                break;
            }
            FZ_CHECK(off == piece, "wants more without taking all it was given");
        }
        fed += piece;
    }
    if (!stop) {
        uint64_t len;
        const uint8_t *pl;
        FZ_CHECK(plain_next(s, n, &pos, &len, &pl) == 0, "the plain parse finds a whole message the pieces did not");
    }
    if (st.on) zmq_msg_close(&st.m);
    return 0;
}
