/* bench_pipe.h - strings over pipes between a benchmark and the processes it forks (endpoints
   up, peer lists down). Included by the benchmarks that fork; POSIX. */
#ifndef KVPS_BENCH_PIPE_H
#define KVPS_BENCH_PIPE_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 0, or -1 at end of input or on an error */
static int read_full(int fd, void *buf, size_t len) {
    char *p = (char *)buf;
    while (len) {
        ssize_t g = read(fd, p, len);
        if (g < 0 && errno == EINTR) continue;
        if (g <= 0) return -1;
        p += g;
        len -= (size_t)g;
    }
    return 0;
}

/* [u32 length][bytes]; 0, or -1 on an error */
static int write_str(int fd, const char *str) {
    uint32_t len = (uint32_t)strlen(str);
    return write(fd, &len, sizeof len) == (ssize_t)sizeof len && write(fd, str, len) == (ssize_t)len ? 0 : -1;
}

static char *read_str(int fd) { /* malloc'ed, NULL at end of input */
    uint32_t len;
    char *str = NULL;
    if (read_full(fd, &len, sizeof len) != 0 || len > (1u << 20) || !(str = (char *)malloc(len + 1)) ||
        read_full(fd, str, len) != 0) {
        free(str);
        return NULL;
    }
    str[len] = 0;
    return str;
}

#endif
