/* What a perf event on a thread costs each context switch of that thread
 * (scripts/bench-switch-cost.sh). Two threads pinned to one CPU pass a byte
 * back and forth over pipes, so each round trip is two context switches;
 * the run alternates, every 100 ms, between phases with no event on either
 * thread and with one or two events on each (opened by the thread itself,
 * as gpuprof's inherited per-CPU event and the agent's event are there),
 * and reports per phase the median round trip and, paired phase by phase
 * with the bare phase of the same cycle, the extra time per switch. Pairing
 * phases 100 ms apart cancels a host whose speed drifts from run to run.
 *
 *   switch-cost [CYCLES] [KIND]
 * KIND: sampling (cpu-clock every 10 ms, as gpuprof and the agent sample;
 * default), task (task-clock), count (cpu-clock counting, no sampling),
 * dummy (the dummy event: records only). */
#define _GNU_SOURCE
#include <linux/perf_event.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int ab[2], ba[2];
static const char *kind = "sampling";
static atomic_int want;

static int open_event(void)
{
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_CPU_CLOCK;
    a.sample_period = 10000000;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    if (!strcmp(kind, "task"))
        a.config = PERF_COUNT_SW_TASK_CLOCK;
    else if (!strcmp(kind, "count"))
        a.sample_period = 0;
    else if (!strcmp(kind, "dummy"))
        a.config = PERF_COUNT_SW_DUMMY;
    int fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
    if (fd < 0) {
        perror("perf_event_open");
        exit(2);
    }
    return fd;
}

/* Close this thread's events and open `n` new ones. */
static void set_events(int *fds, int n)
{
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0) {
            close(fds[i]);
            fds[i] = -1;
        }
    for (int i = 0; i < n; i++)
        fds[i] = open_event();
}

static int xfer(int fd, char *c, int wr)
{
    return (int)(wr ? write(fd, c, 1) : read(fd, c, 1));
}

static void *partner(void *arg)
{
    (void)arg;
    int fds[2] = {-1, -1};
    char c;
    while (xfer(ab[0], &c, 0) == 1 && c != 'q') {
        if (c == 'e')
            set_events(fds, atomic_load(&want));
        if (xfer(ba[1], &c, 1) != 1)
            break;
    }
    return NULL;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int cycles = argc > 1 ? atoi(argv[1]) : 40;
    if (argc > 2)
        kind = argv[2];
    if (cycles < 4 || cycles > 10000) {
        fprintf(stderr, "usage: switch-cost [CYCLES 4..10000] [sampling|task|count|dummy]\n");
        return 2;
    }
    if (pipe(ab) || pipe(ba)) {
        perror("pipe");
        return 2;
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    if (sched_setaffinity(0, sizeof set, &set)) {
        perror("sched_setaffinity");
        return 2;
    }
    pthread_t t;
    pthread_create(&t, NULL, partner, NULL);
    double *rt = calloc((size_t)cycles * 3, sizeof *rt);
    double *tmp = calloc((size_t)cycles, sizeof *tmp);
    int fds[2] = {-1, -1};
    char c;
    for (int cy = 0; cy < cycles; cy++) {
        for (int k = 0; k < 3; k++) {
            int n = cy % 2 ? 2 - k : k; /* alternate the order */
            set_events(fds, n);
            atomic_store(&want, n);
            c = 'e';
            xfer(ab[1], &c, 1);
            xfer(ba[0], &c, 0);
            c = 'x';
            long trips = 0;
            double t0 = now(), dt;
            while ((dt = now() - t0) < 0.1) {
                for (int j = 0; j < 100; j++) {
                    xfer(ab[1], &c, 1);
                    xfer(ba[0], &c, 0);
                }
                trips += 100;
            }
            rt[cy * 3 + n] = dt / (double)trips * 1e9;
        }
    }
    c = 'q';
    xfer(ab[1], &c, 1);
    pthread_join(t, NULL);
    printf("kind %s, %d cycles of 3 phases of 100 ms\n", kind, cycles);
    for (int n = 0; n < 3; n++) {
        for (int cy = 0; cy < cycles; cy++)
            tmp[cy] = rt[cy * 3 + n];
        qsort(tmp, (size_t)cycles, sizeof *tmp, cmp);
        printf("  %d event(s) per thread: round trip %6.0f ns (median)", n, tmp[cycles / 2]);
        if (n > 0) {
            for (int cy = 0; cy < cycles; cy++)
                tmp[cy] = (rt[cy * 3 + n] - rt[cy * 3]) / 2;
            qsort(tmp, (size_t)cycles, sizeof *tmp, cmp);
            printf("; per switch, paired with the bare phase: +%.0f ns [10%%: %.0f, 90%%: %.0f]",
                   tmp[cycles / 2], tmp[cycles / 10], tmp[cycles * 9 / 10]);
        }
        printf("\n");
    }
    return 0;
}
