/* tsan_zmq.c - tells ThreadSanitizer that a ZeroMQ message hands memory from its sender to its
   receiver (linked into the tests by `make tsan-test`, never into kvps itself).

   libzmq is not built with -fsanitize=thread, so TSan does not see the atomics of its lock-free
   pipes: a worker thread that fills a message and a server thread that reads it after zmq_msg_recv
   look unordered to it, and every such pair is reported as a race with both stacks in kvps (the
   memcpy into the frame, the read of the meta frame), where no suppression of libzmq's frames
   can reach. So each send releases, and each receive acquires, one synchronisation token. A
   single token over-approximates (a send orders every later receive, on any socket), which can
   hide a race only between two threads that also exchange ZeroMQ messages around it; what
   travels through ZeroMQ really is ordered like this. kvps' own synchronisation (atomics,
   mutexes, the stop pipe) stays fully checked.

   The wrappers interpose the application's calls by name and forward to libzmq (RTLD_NEXT). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <zmq.h>
#include <sanitizer/tsan_interface.h>

static char tsan_zmq_token;

typedef int (*tsan_zmq_msg_fn)(zmq_msg_t *, void *, int);
typedef int (*tsan_zmq_send_fn)(void *, const void *, size_t, int);
typedef int (*tsan_zmq_recv_fn)(void *, void *, size_t, int);
static tsan_zmq_msg_fn real_msg_send, real_msg_recv;
static tsan_zmq_send_fn real_send;
static tsan_zmq_recv_fn real_recv;
typedef int (*tsan_zmq_init_data_fn)(zmq_msg_t *, void *, size_t, zmq_free_fn *, void *);
static tsan_zmq_init_data_fn real_init_data;

/* before main, so that no two threads race to fill the pointers */
__attribute__((constructor)) static void tsan_zmq_init(void) {
    *(void **)&real_msg_send = dlsym(RTLD_NEXT, "zmq_msg_send");
    *(void **)&real_msg_recv = dlsym(RTLD_NEXT, "zmq_msg_recv");
    *(void **)&real_send = dlsym(RTLD_NEXT, "zmq_send");
    *(void **)&real_recv = dlsym(RTLD_NEXT, "zmq_recv");
    *(void **)&real_init_data = dlsym(RTLD_NEXT, "zmq_msg_init_data");
}

int zmq_msg_send(zmq_msg_t *msg, void *s, int flags) {
    __tsan_release(&tsan_zmq_token);
    return real_msg_send(msg, s, flags);
}

int zmq_msg_recv(zmq_msg_t *msg, void *s, int flags) {
    int rc = real_msg_recv(msg, s, flags);
    if (rc >= 0) __tsan_acquire(&tsan_zmq_token);
    return rc;
}

int zmq_send(void *s, const void *buf, size_t len, int flags) {
    __tsan_release(&tsan_zmq_token);
    return real_send(s, buf, len, flags);
}

int zmq_recv(void *s, void *buf, size_t len, int flags) {
    int rc = real_recv(s, buf, len, flags);
    if (rc >= 0) __tsan_acquire(&tsan_zmq_token);
    return rc;
}

/* A zero-copy message's free callback runs on whichever thread lets go of the message last,
   usually ZeroMQ's I/O thread after it wrote the bytes to the socket: that thread got the buffer
   (and the callback's hint) through ZeroMQ too, so the callback acquires the token that the
   send released. The callback and hint are wrapped in a small block the trampoline frees. */
typedef struct tsan_zmq_cb { zmq_free_fn *ffn; void *hint; } tsan_zmq_cb;

static void tsan_zmq_free(void *data, void *hint) {
    __tsan_acquire(&tsan_zmq_token);
    tsan_zmq_cb cb = *(tsan_zmq_cb *)hint;
    free(hint);
    cb.ffn(data, cb.hint);
}

int zmq_msg_init_data(zmq_msg_t *msg, void *data, size_t size, zmq_free_fn *ffn, void *hint) {
    if (!ffn) return real_init_data(msg, data, size, ffn, hint);
    tsan_zmq_cb *cb = (tsan_zmq_cb *)malloc(sizeof *cb);
    if (!cb) return -1;
    cb->ffn = ffn;
    cb->hint = hint;
    int rc = real_init_data(msg, data, size, tsan_zmq_free, cb);
    if (rc != 0) free(cb);
    return rc;
}
