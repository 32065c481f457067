/* repro_unread_replies - a client that sends pulls and never reads the replies grows the
   server's memory without bound: kvps sets ZMQ_SNDHWM = 0 on the server's ROUTER (so that it
   never drops a reply), and each unread reply (here a copied 16 KiB value) stays queued in the
   server. Not a test (it grows on purpose); run it by hand:
       cc -std=c99 -D_POSIX_C_SOURCE=200809L -I. -O1 tests/fuzz/repro_unread_replies.c -o /tmp/repro \
          $(pkg-config --cflags --libs libzmq) -lm -pthread && /tmp/repro
   Measured here: 5 MiB before, 460 MiB after 40,000 unread pulls (655 MB of replies). */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include "tests/kvps_test.h" /* KT_HDR */
#include <stdio.h>
#include <signal.h>
#include <time.h>
#include <sys/wait.h>
static long rss_kb(pid_t p) {
    char path[64], line[256]; long v = -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)p);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) if (sscanf(line, "VmRSS: %ld", &v) == 1) break;
    if (f) fclose(f);
    return v;
}
int main(void) {
    int ep[2]; if (pipe(ep)) return 1;
    pid_t pid = fork();
    if (pid == 0) {
        kvps_server *s;
        kvps_server_create(&(kvps_server_desc){.endpoint = "tcp://127.0.0.1:*", .num_workers = 1}, &s);
        const char *e = kvps_server_endpoint(s);
        if (write(ep[1], e, strlen(e) + 1) < 0) _exit(1);
        kvps_server_run(s);
        _exit(0);
    }
    char e[256] = ""; if (read(ep[0], e, sizeof e) <= 0) return 1;
    void *ctx = zmq_ctx_new(), *d = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0; zmq_setsockopt(d, ZMQ_SNDHWM, &zero, sizeof zero); zmq_setsockopt(d, ZMQ_RCVHWM, &zero, sizeof zero);
    int small = 4096; zmq_setsockopt(d, ZMQ_RCVBUF, &small, sizeof small);
    zmq_connect(d, e);
    enum { LEN = 4096 }; /* 16 KiB: below the zero-copy threshold, so each reply is a copy */
    kvps__hdr h = KT_HDR(.op = KVPS__OP_INIT, .nkeys = 1);
    unsigned char meta[48]; kvps__kent k = {7, LEN};
    memcpy(meta, &h, 32); memcpy(meta + 32, &k, 16);
    static float v[LEN];
    zmq_send(d, meta, 48, ZMQ_SNDMORE); zmq_send(d, v, sizeof v, 0);
    char buf[64]; zmq_recv(d, buf, sizeof buf, 0); /* init reply */
    h.op = KVPS__OP_PULL; memcpy(meta, &h, 32);
    printf("server RSS before: %ld KiB\n", rss_kb(pid));
    for (int i = 1; i <= 40000; i++) {
        zmq_send(d, meta, 48, 0);
        if (i % 10000 == 0) { nanosleep(&(struct timespec){0, 500000000}, NULL); printf("after %d unread pulls (%.0f MB of replies): server RSS %ld KiB\n", i, i * 16384 / 1e6, rss_kb(pid)); }
    }
    kill(pid, SIGKILL); waitpid(pid, NULL, 0);
    return 0;
}
