/* The job's own SIGTRAP disposition rewritten in a tight loop on two
 * threads while other threads raise SIGTRAPs of their own (at themselves,
 * and at a writer, interrupting its sigaction calls) and the profiler
 * samples them all (tests/pystacks.rs, tests/timer_sampler.rs). Built as a
 * shared library and driven by sigtrap_race.py through ctypes, so that it
 * runs inside a CPython process, which is what the agent samples.
 *
 * Every SIGTRAP a thread raises at itself must reach one of the job's two
 * handlers exactly once, each called the way it was installed (h1 with a
 * siginfo, h2 without), and every disposition sigaction() hands back must
 * be one the writer installed, whole. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define RAISERS 2
#define WRITERS 2

static _Atomic long handled_self, handled_writer, raised_self, sent_writer, bad, swaps;
static _Atomic int stop;
static _Atomic pid_t writer_tid;
static __thread int i_am_writer;

static void count(int sig)
{
    if (sig != SIGTRAP)
        atomic_fetch_add(&bad, 1);
    else if (i_am_writer)
        atomic_fetch_add(&handled_writer, 1);
    else
        atomic_fetch_add(&handled_self, 1);
}

static void h1(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    if (!si || si->si_signo != SIGTRAP || si->si_code != SI_TKILL)
        atomic_fetch_add(&bad, 1);
    count(sig);
}

static void h2(int sig)
{
    count(sig);
}

static pid_t gettid_(void)
{
    return (pid_t)syscall(SYS_gettid);
}

static struct sigaction a1, a2;

static void dispositions(void)
{
    memset(&a1, 0, sizeof a1);
    memset(&a2, 0, sizeof a2);
    a1.sa_sigaction = h1;
    a1.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&a1.sa_mask);
    a2.sa_handler = h2;
    a2.sa_flags = SA_RESTART;
    sigfillset(&a2.sa_mask);
    sigdelset(&a2.sa_mask, SIGTRAP);
}

/* One of the two, whole, compared by the fields the job set: the kernel
 * adds flags of its own (SA_RESTORER) and keeps 64 signals of a mask. */
static int whole(const struct sigaction *o)
{
    int info = (o->sa_flags & SA_SIGINFO) != 0;
    int m1 = sigismember(&o->sa_mask, SIGUSR1), m2 = sigismember(&o->sa_mask, SIGSYS);
    if (o->sa_sigaction == h1)
        return info && m1 == 0 && m2 == 0;
    if (o->sa_handler == h2)
        return !info && m1 == 1 && m2 == 1;
    return 0;
}

static void *writer(void *arg)
{
    if (arg) {
        i_am_writer = 1;
        atomic_store(&writer_tid, gettid_());
    }
    struct sigaction old;
    while (!atomic_load(&stop)) {
        sigaction(SIGTRAP, &a1, &old);
        if (!whole(&old))
            atomic_fetch_add(&bad, 1);
        sigaction(SIGTRAP, &a2, &old);
        if (!whole(&old))
            atomic_fetch_add(&bad, 1);
        atomic_fetch_add(&swaps, 1);
    }
    return NULL;
}

static void *raiser(void *arg)
{
    (void)arg;
    pid_t me = gettid_();
    volatile unsigned long x = 0;
    unsigned long n = 0;
    while (!atomic_load(&stop)) {
        for (int i = 0; i < 20000; i++)
            x = x * 31 + (unsigned long)i;
        /* Delivered before tgkill returns: a thread's signal to itself is
         * never merged with another. */
        atomic_fetch_add(&raised_self, 1);
        syscall(SYS_tgkill, getpid(), me, SIGTRAP);
        pid_t w = atomic_load(&writer_tid);
        if (w && (++n & 3) == 0) {
            atomic_fetch_add(&sent_writer, 1);
            syscall(SYS_tgkill, getpid(), w, SIGTRAP);
        }
    }
    return NULL;
}

/* Race for `ms` milliseconds; the counts into out[0..7]: raised at
 * themselves, handled there, sent to the writer, handled there, bad,
 * disposition swaps. Returns 0, or -1 when a thread could not start. */
int race(int ms, long *out)
{
    dispositions();
    sigaction(SIGTRAP, &a2, NULL);
    pthread_t w[WRITERS], r[RAISERS];
    for (int i = 0; i < WRITERS; i++)
        if (pthread_create(&w[i], NULL, writer, i == 0 ? (void *)1 : NULL))
            return -1;
    for (int i = 0; i < RAISERS; i++)
        if (pthread_create(&r[i], NULL, raiser, NULL))
            return -1;
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts))
        ;
    atomic_store(&stop, 1);
    for (int i = 0; i < WRITERS; i++)
        pthread_join(w[i], NULL);
    for (int i = 0; i < RAISERS; i++)
        pthread_join(r[i], NULL);
    out[0] = raised_self;
    out[1] = handled_self;
    out[2] = sent_writer;
    out[3] = handled_writer;
    out[4] = bad;
    out[5] = swaps;
    return 0;
}

/* A handler installed as a job may install it: SA_RESETHAND (one
 * delivery, then the default action), a sa_mask (SIGUSR1 blocked while it
 * runs). Returns a bit set of what went wrong (0: as the kernel does it):
 * 1 the handler ran other than once, 2 SIGUSR1 not blocked in it, 4
 * SIGUSR1 still blocked after it, 8 the disposition not reset to SIG_DFL,
 * 16 SIGTRAP not blocked in it. */
static _Atomic int once_runs, once_usr1, once_trap;

static void once(int sig)
{
    (void)sig;
    sigset_t now;
    pthread_sigmask(SIG_BLOCK, NULL, &now);
    atomic_fetch_add(&once_runs, 1);
    atomic_store(&once_usr1, sigismember(&now, SIGUSR1));
    atomic_store(&once_trap, sigismember(&now, SIGTRAP));
}

int flags(void)
{
    struct sigaction a, o;
    memset(&a, 0, sizeof a);
    a.sa_handler = once;
    a.sa_flags = SA_RESETHAND;
    sigemptyset(&a.sa_mask);
    sigaddset(&a.sa_mask, SIGUSR1);
    if (sigaction(SIGTRAP, &a, NULL))
        return 64;
    syscall(SYS_tgkill, getpid(), gettid_(), SIGTRAP);
    int bad_ = 0;
    if (atomic_load(&once_runs) != 1)
        bad_ |= 1;
    if (atomic_load(&once_usr1) != 1)
        bad_ |= 2;
    sigset_t now;
    pthread_sigmask(SIG_BLOCK, NULL, &now);
    if (sigismember(&now, SIGUSR1))
        bad_ |= 4;
    if (sigaction(SIGTRAP, NULL, &o) || o.sa_handler != SIG_DFL)
        bad_ |= 8;
    if (atomic_load(&once_trap) != 1)
        bad_ |= 16;
    return bad_;
}
