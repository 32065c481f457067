/* fuzz_shm - the one decoder of what a shared-memory segment holds (kvps_ring.h, >>shm:
   kvps_ring__shm_take): a queue written as a peer process would, or as a broken or hostile one
   might, read by its owner. The reader trusts nothing in the segment: the indices, the
   length prefix and the header's magic are checked before anything is read or allocated.

   Input: [cap byte][flags byte][u64 start][writes...]. The queue's capacity is 64 << (cap % 7)
   bytes; head and tail start at `start` (any value: the indices wrap at 2^64). Each write is
   [n byte][n % 128 + 1 bytes], appended as a writer does (as much as there is room for), after
   which the owner takes whatever it can. flags bit 0: a write whose first byte is 0xEE moves the
   tail by 2^20 (indices that claim more than the queue holds); bit 1: the same for the head.

   Properties: no crash, leak or out-of-bounds access; every message taken is exactly as long as
   its prefix said and starts with the ring's magic; the reader never moves head past tail; once
   the queue is called malformed nothing more is read from it. Built with a small
   KVPS_RING__SHM_MSG_MAX (1 MiB): the reader allocates a message's length before its bytes
   come, and the fuzzer's allocator refuses the real limit (2^40). */
#define KVPS_RING__SHM_MSG_MAX ((uint64_t)1 << 20)
#define KVPS_IMPLEMENTATION
#include "kvps_ring.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    kvps_log_set_fn(fz_nolog, NULL);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 10) return 0;
    const uint64_t cap = (uint64_t)64 << (data[0] % 7);
    int bad_tail = data[1] & 1, bad_head = data[1] & 2;
    uint64_t start;
    memcpy(&start, data + 2, 8);
    unsigned char *mem = (unsigned char *)calloc(1, KVPS_RING__SHM_PAGE + (size_t)cap);
    FZ_CHECK(mem != NULL, "calloc");
    kvps_ring__shm_ctl *c = (kvps_ring__shm_ctl *)(void *)mem;
    unsigned char *d = mem + KVPS_RING__SHM_PAGE;
    c->head = c->tail = start;
    kvps_ring__frame_rd st;
    memset(&st, 0, sizeof st);
    const uint8_t *p = data + 10;
    size_t left = size - 10;
    int broken = 0, corrupted = 0;
    while (left && !broken) {
        size_t n = (size_t)(p[0] % 128) + 1;
        p++, left--;
        if (n > left) n = left;
        uint64_t used = c->tail - c->head;
        size_t room = used > cap ? 0 : (size_t)(cap - used);
        if (n > room) n = room;
        if (n && p[0] == 0xEE && (bad_tail || bad_head)) {
            if (bad_tail) c->tail += (uint64_t)1 << 20;
            else c->head += (uint64_t)1 << 20;
            corrupted = 1;
        }
        kvps_ring__shm_put(d, cap, c->tail, p, n);
        c->tail += n;
        p += n;
        left -= n;
        for (;;) {
            const char *why = NULL;
            uint64_t head0 = c->head;
            int got = kvps_ring__shm_take(c, d, cap, KVPS_RING__MAGIC, &st, &why);
            if (!corrupted) FZ_CHECK(c->tail - c->head <= cap && c->head - head0 <= cap, "head moved past tail");
            if (got == 1) {
                uint32_t magic;
                memcpy(&magic, st.pre + 8, 4);
                FZ_CHECK(magic == KVPS_RING__MAGIC, "a message without the magic was taken");
                FZ_CHECK(zmq_msg_size(&st.m) == st.len && st.len <= KVPS_RING__SHM_MSG_MAX, "a message of the wrong length");
                zmq_msg_close(&st.m);
                continue;
            }
            if (got < 0) {
                FZ_CHECK(why != NULL || got == -2, "malformed without a reason");
                if (st.on) zmq_msg_close(&st.m);
                st.on = 0;
                broken = 1;
            }
            break;
        }
        FZ_CHECK(!corrupted || broken || c->tail - c->head <= cap, "inconsistent indices were not called malformed");
    }
    if (st.on) zmq_msg_close(&st.m);
    free(mem);
    return 0;
}
