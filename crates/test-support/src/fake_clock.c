/*
 * The fake wall clock of a test server (`RedisServer::start_at`, see
 * fake_clock.rs): an LD_PRELOAD library that shifts the process's
 * wall-clock readings (clock_gettime of CLOCK_REALTIME, CLOCK_REALTIME_COARSE
 * and CLOCK_TAI; gettimeofday; time) so that the clock reads
 * TRT_FAKE_CLOCK_START_NS (ns since the Unix epoch, maybe negative) at its
 * first wall-clock reading (when redis-server starts), and runs on at the
 * real pace from there. Every other clock
 * (CLOCK_MONOTONIC: Redis's timers, jemalloc's decay) is the real one.
 *
 * Why not libfaketime (Debian's `faketime`): its initialisation calls
 * dlsym, which allocates, and jemalloc (Redis's allocator, linked into every
 * redis-server) reads the clock while it holds its own lock: redis-server
 * under libfaketime 0.9.10 deadlocks before it listens (libfaketime issue
 * #130, open). This library calls neither dlsym nor malloc: the real clock
 * is the clock_gettime system call itself, and the start is read with
 * getenv (which does not allocate). It needs only `getenv` and `syscall`
 * from the C library (GLIBC_2.2.5), so the copy built here runs in any
 * glibc image, such as the official redis:7.0.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define START_VAR "TRT_FAKE_CLOCK_START_NS"
#define NS_PER_S 1000000000LL

/* Set once, at the first wall-clock reading: fake minus real, in ns. */
static long long offset_ns;
/* 0: not set yet; 1: being set (by another thread); 2: set. */
static int state;

static int real_clock(clockid_t clock, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, clock, ts);
}

static long long ns_of(const struct timespec *ts) {
    return (long long)ts->tv_sec * NS_PER_S + ts->tv_nsec;
}

static void set_ns(struct timespec *ts, long long ns) {
    /* Floor division: before the epoch too, tv_nsec is in [0, 1 s). */
    ts->tv_sec = (time_t)(ns / NS_PER_S - (ns % NS_PER_S < 0));
    ts->tv_nsec = (long)(ns - (long long)ts->tv_sec * NS_PER_S);
}

/* The start, or `real_ns` when the variable is unset or not an integer (an
 * offset of 0, which RedisServer::start_at sees and reports). */
static long long start_ns(long long real_ns) {
    const char *s = getenv(START_VAR);
    long long value = 0;
    int negative = 0;
    if (s != NULL && *s == '-') {
        negative = 1;
        s++;
    }
    if (s == NULL || *s == '\0') {
        return real_ns;
    }
    for (; *s != '\0'; s++) {
        if (*s < '0' || *s > '9' || value > (LLONG_MAX - 9) / 10) {
            return real_ns;
        }
        value = value * 10 + (*s - '0');
    }
    return negative ? -value : value;
}

/* Fake minus real, set by the first call. */
static long long offset(void) {
    int expected = 0;
    if (__atomic_load_n(&state, __ATOMIC_ACQUIRE) == 2) {
        return offset_ns;
    }
    if (__atomic_compare_exchange_n(&state, &expected, 1, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        struct timespec now;
        long long real_ns = real_clock(CLOCK_REALTIME, &now) == 0 ? ns_of(&now) : 0;
        offset_ns = start_ns(real_ns) - real_ns;
        __atomic_store_n(&state, 2, __ATOMIC_RELEASE);
    } else {
        while (__atomic_load_n(&state, __ATOMIC_ACQUIRE) != 2) {
        }
    }
    return offset_ns;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    if (real_clock(clock, ts) != 0) {
        return -1;
    }
    if (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE ||
        clock == CLOCK_TAI) {
        set_ns(ts, ns_of(ts) + offset());
    }
    return 0;
}

/* Declared under another name: the C libraries' headers disagree on the
 * type of its second argument (struct timezone * or void *). */
struct trt_timeval {
    long tv_sec;
    long tv_usec;
};

int trt_gettimeofday(struct trt_timeval *tv, void *tz) __asm__("gettimeofday");

int trt_gettimeofday(struct trt_timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return -1;
    }
    if (tv != NULL) {
        tv->tv_sec = (long)ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return (time_t)-1;
    }
    if (out != NULL) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
