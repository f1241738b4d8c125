/* Slow flushes for a benchmark: every fsync and fdatasync of the process waits
 * SLOW_FSYNC_US microseconds (default 5000) before it runs, as on a disk or a network
 * volume whose flush is slow. Build: cc -shared -fPIC -O2 -o slow_fsync.so slow_fsync.c -ldl
 * Use: LD_PRELOAD=$PWD/slow_fsync.so cargo bench --bench broker -- --sqlite ... */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

static useconds_t delay(void) {
    const char *v = getenv("SLOW_FSYNC_US");
    return v ? (useconds_t)atoi(v) : 5000;
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    usleep(delay());
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    usleep(delay());
    return real(fd);
}
