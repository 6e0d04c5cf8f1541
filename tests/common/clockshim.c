/*
 * A clock-offset shim for redis-server, LD_PRELOADed by the test harness (tests/common/netns.rs,
 * `ClockShim`). It shifts the wall clock -- clock_gettime(CLOCK_REALTIME*), gettimeofday and
 * time -- by a signed number of milliseconds read from the file named by FLK_CLOCK_OFFSET_FILE
 * (one integer, e.g. "-5000"), re-read at most every 50 ms so the offset can change while the
 * server runs. Monotonic and CPU clocks are left alone (Redis times its timers with them).
 *
 * It calls the kernel directly (syscall), never the libc clock functions, so it cannot recurse
 * into itself the way libfaketime does inside redis-server; it needs no dlsym and no malloc.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static _Atomic long long offset_ns;
static _Atomic long long next_check_ns;

static long real_clock(clockid_t clock, struct timespec *ts) {
    return syscall(SYS_clock_gettime, clock, ts);
}

static void refresh(void) {
    struct timespec now;
    if (real_clock(CLOCK_MONOTONIC, &now) != 0) return;
    long long now_ns = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
    long long due = atomic_load(&next_check_ns);
    if (now_ns < due) return;
    if (!atomic_compare_exchange_strong(&next_check_ns, &due, now_ns + 50000000LL)) return;
    const char *path = getenv("FLK_CLOCK_OFFSET_FILE");
    if (!path) return;
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    char buf[32];
    long n = syscall(SYS_read, fd, buf, sizeof buf - 1);
    syscall(SYS_close, fd);
    if (n <= 0) return;
    buf[n] = 0;
    char *end;
    long long ms = strtoll(buf, &end, 10);
    if (end != buf) atomic_store(&offset_ns, ms * 1000000LL);
}

static int is_realtime(clockid_t clock) {
    return clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    long r = real_clock(clock, ts);
    if (r != 0 || !is_realtime(clock)) return (int)r;
    refresh();
    long long t = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + atomic_load(&offset_ns);
    ts->tv_sec = t / 1000000000LL;
    ts->tv_nsec = t % 1000000000LL;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000LL;
        ts->tv_sec -= 1;
    }
    return 0;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
