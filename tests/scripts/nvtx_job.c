/* A small job that uses the NVTX v3 C API the way applications do, for
 * tests/nvtx.rs (built there with gcc against the NVTX headers of the
 * `nvidia-nvtx` Python package).
 *
 *   nvtx_job            ranges, nesting, domains, registered strings,
 *                       categories, payloads, marks, threads, a start/end
 *                       range ended on another thread, a forked child
 *   nvtx_job bench N [GAP_US]
 *                       N push/pop pairs GAP_US apart; prints the median
 *                       cost of a pair
 */
#include <nvtx3/nvToolsExt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void spin_ms(double ms) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    volatile unsigned long x = 0;
    for (;;) {
        for (int i = 0; i < 1000; i++)
            x += (unsigned long)i;
        clock_gettime(CLOCK_MONOTONIC, &b);
        if ((b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6 >= ms)
            break;
    }
}

static nvtxRangeId_t g_cross;

static void *worker(void *arg) {
    (void)arg;
    nvtxNameOsThreadA((uint32_t)syscall(SYS_gettid), "loader thread");
    for (int i = 0; i < 2; i++) {
        nvtxRangePushA("thread work");
        spin_ms(15);
        nvtxRangePop();
    }
    /* Ends a range that the main thread started. */
    nvtxRangeEnd(g_cross);
    return NULL;
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Cost of one push/pop pair: each pair is timed on its own, between two
 * clock reads, with `gap_us` of work between pairs (a realistic call rate
 * that the reader keeps up with); the median is robust to preemption on a
 * loaded machine. The cost of the two clock reads alone is measured the
 * same way and subtracted. */
static int bench(long n, double gap_us) {
    uint64_t *pair = malloc(sizeof(uint64_t) * (size_t)n);
    uint64_t *empty = malloc(sizeof(uint64_t) * (size_t)n);
    nvtxRangePushA("warm-up");
    nvtxRangePop();
    for (long i = 0; i < n; i++) {
        uint64_t a = now_ns();
        uint64_t b = now_ns();
        empty[i] = b - a;
        a = now_ns();
        nvtxRangePushA("bench");
        nvtxRangePop();
        b = now_ns();
        pair[i] = b - a;
        if (gap_us > 0)
            spin_ms(gap_us / 1000.0);
    }
    qsort(pair, (size_t)n, sizeof *pair, cmp_u64);
    qsort(empty, (size_t)n, sizeof *empty, cmp_u64);
    double med = (double)pair[n / 2] - (double)empty[n / 2];
    double p90 = (double)pair[n * 9 / 10] - (double)empty[n / 2];
    printf("push/pop pair: median %.1f ns, p90 %.1f ns (clock pair %llu ns, %ld pairs)\n", med, p90,
           (unsigned long long)empty[n / 2], n);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "bench") == 0)
        return bench(atol(argv[2]), argc >= 4 ? atof(argv[3]) : 20.0);

    for (int step = 0; step < 3; step++) {
        char name[32];
        snprintf(name, sizeof name, "step %d", step);
        nvtxRangePushA(name);
        nvtxRangePushA("forward");
        spin_ms(20);
        nvtxRangePop();
        nvtxRangePushW(L"backward \u2713");
        spin_ms(10);
        nvtxRangePop();
        nvtxRangePop();
    }
    nvtxMarkA("checkpoint saved");

    nvtxDomainHandle_t dom = nvtxDomainCreateA("my library");
    nvtxDomainNameCategoryA(dom, 7, "io");
    nvtxStringHandle_t reg = nvtxDomainRegisterStringA(dom, "registered load");
    nvtxEventAttributes_t attr;
    memset(&attr, 0, sizeof attr);
    attr.version = NVTX_VERSION;
    attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attr.category = 7;
    attr.payloadType = NVTX_PAYLOAD_TYPE_INT64;
    attr.payload.llValue = 42;
    attr.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    attr.message.registered = reg;
    nvtxDomainRangePushEx(dom, &attr);
    spin_ms(10);
    nvtxDomainRangePop(dom);

    g_cross = nvtxRangeStartA("handed over");
    pthread_t th;
    pthread_create(&th, NULL, worker, NULL);
    pthread_join(th, NULL);

    pid_t child = fork();
    if (child == 0) {
        nvtxRangePushA("child work");
        spin_ms(15);
        /* A domain handle created before the fork. */
        nvtxDomainRangePushEx(dom, &attr);
        spin_ms(5);
        nvtxDomainRangePop(dom);
        nvtxRangePop();
        _exit(0);
    }
    int st;
    waitpid(child, &st, 0);
    /* Still open when the process ends. */
    nvtxRangePushA("left open");
    spin_ms(5);
    return 0;
}
