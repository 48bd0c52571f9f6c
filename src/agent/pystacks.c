/* gpuprof's same-instant Python stack sampler, preloaded into the job's
 * processes (LD_PRELOAD) by `gpuprof record`.
 *
 * In a CPython 3.9–3.13 process it opens a perf event on itself (software
 * cpu-clock, one sample per period of the thread's CPU time) with
 * `sigtrap`: the kernel raises a synchronous SIGTRAP in the very thread whose
 * counter overflowed, on its return to user mode. The handler below then
 * records, for that instant, both
 *   - the thread's Python frame chain (code object pointers, read from its
 *     own PyThreadState), and
 *   - the interrupted user registers and a copy of the top of its stack,
 *     which gpuprof unwinds with the DWARF unwinder it uses for perf samples,
 * into a shared-memory ring (ring.h) that gpuprof drains. Both halves come
 * from the same stopped thread, so the Python frames are those of the
 * native stack's instant by construction, not by a match in time.
 *
 * Rules it keeps inside the job:
 *   - nothing unless GPUPROF_PYSTACKS_DIR is set and this is a CPython whose
 *     symbols are visible and whose layout is known; a debug or
 *     free-threaded build is refused;
 *   - only async-signal-safe work in the handler: raw syscalls, no locks, no
 *     allocation; every read of interpreter memory goes through
 *     process_vm_readv on ourselves, so a stale pointer read mid-update gives
 *     an error, never a fault;
 *   - one write into the interpreter: PyCode_Type's deallocator is wrapped
 *     (two atomic increments, then the original), so that a code object
 *     read once can be trusted without reading it again until any code
 *     object goes; done through process_vm_writev, so a type object in
 *     read-only memory only turns that off;
 *   - the job's signals are untouched: SA_RESTART; the event excludes the
 *     kernel, so the signal comes on a return to user mode and never
 *     interrupts a blocking system call (no EINTR); a SIGTRAP that is not
 *     ours goes to the disposition the job set, which sigaction()/signal()
 *     below report and record instead of replacing our handler;
 *   - threads inherit the event (inherit_thread), forked children do not:
 *     after fork() the child opens its own event and ring (pthread_atfork),
 *     and vfork/posix_spawn children, which reset signal handlers before
 *     exec, never carry it. exec removes it (remove_on_exec).
 * Outside gpuprof's recording window (before `--delay` elapsed: the
 * handler returns at once; after it closed: the event is stopped) nothing
 * is read or written. If gpuprof is gone the ring fills up, records are
 * dropped and counted, and the job runs on. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "ring.h"

#define EXPORT __attribute__((visibility("default")))

/* Environment set by gpuprof (src/collect/perf/pyagent.rs). */
#define ENV_DIR "GPUPROF_PYSTACKS_DIR"
#define ENV_PERIOD "GPUPROF_PYSTACKS_PERIOD_NS"
#define ENV_STACK "GPUPROF_PYSTACKS_STACK_BYTES"
#define ENV_RING "GPUPROF_PYSTACKS_RING_BYTES"
/* "timer": sample with per-thread CPU-time timers, never a perf event
 * (perf_event_open is refused to gpuprof: a container, paranoid 3/4). */
#define ENV_SAMPLER "GPUPROF_PYSTACKS_SAMPLER"

/* si_perf_data of our events: anything else is not ours. */
#define SIG_MAGIC 0x7079737461636b73ULL /* "pystacks" */
#define TRAP_PERF_CODE 6
#define TRAP_PERF_FLAG_ASYNC_BIT 1u
/* A POSIX timer's signal (si_code SI_TIMER) whose value is SIG_MAGIC. */
#define TIMER_CODE (-2)

/* Record types (ring.h: 1 is padding). */
#define REC_HELLO 2u
#define REC_SAMPLE 3u
#define REC_CODE 4u
#define REC_NOTE 5u

/* HELLO status. */
#define HELLO_SAMPLING 0u
#define HELLO_UNSUPPORTED 1u
#define HELLO_PERF_REFUSED 2u
#define HELLO_FAILED 3u
#define HELLO_SAMPLING_TIMER 4u /* sampling with the in-process CPU-time timers */
#define HELLO_NATIVE_TIMER 5u   /* not a Python: native stacks only, timers */
/* sampling with the perf event, whose periods in the kernel are sampled too
 * (the job may: root, CAP_PERFMON or perf_event_paranoid <= 1) */
#define HELLO_SAMPLING_KERNEL 6u

/* SAMPLE status. */
#define ST_OK 0u          /* Python frames read (possibly none) */
#define ST_NO_TSTATE 1u   /* not a Python thread (or not yet / no longer) */
#define ST_UNREADABLE 2u  /* a read failed: the chain was being changed */
#define ST_TRUNCATED 3u   /* more frames than MAX_FRAMES: innermost kept */
#define ST_INCONSISTENT 4u /* entry frames out of stack order */

/* NOTE kinds. */
#define NOTE_HANDLER_CHAINED 1u /* the job set its own SIGTRAP disposition */
#define NOTE_ASYNC 2u           /* delivered late: the thread had SIGTRAP blocked */

/* Frame flags. */
#define FR_ENTRY 1u /* the oldest frame of its run (one C call of the eval loop) */
#define FR_BADCODE 2u /* the code pointer is not a code object */
#define FR_LIVE 0x80000000u /* in the handler only: key known, no read */

#define MAX_FRAMES 256
#define NAME_BYTES 1024
#define FILE_BYTES 2048
#define CODE_TABLE 16384
/* Distinct code objects read per process_vm_readv (a recursive stack of 30
 * frames has two or three; a loader's, 15-25). */
#define CODE_BATCH 16

struct layout {
    int minor;
    int ts_frame;   /* tstate -> innermost frame (3.9/3.10, 3.13), or -1 */
    int ts_cframe;  /* tstate -> _PyCFrame* (3.11/3.12), or -1 */
    int cf_current; /* _PyCFrame.current_frame */
    int fr_back;
    int fr_code;
    int fr_owner;    /* -1: none (3.9/3.10) */
    int fr_is_entry; /* 3.11 only, else -1 */
    int fr_read;
    int owner_cstack; /* 3.12+: shim frames of the C stack, else -1 */
    int co_name;      /* co_qualname where it exists, else co_name */
    int co_file;
    int co_firstlineno;
    int co_read;
    int str_ascii; /* sizeof(PyASCIIObject) */
    int str_compact; /* sizeof(PyCompactUnicodeObject) */
};

/* Offsets per minor version (LP64: x86_64, aarch64), checked against each
 * version's headers by tests/pystacks.rs and, on 3.13, against the
 * interpreter's own _Py_DebugOffsets at start. */
static const struct layout LAYOUTS[] = {
    {9, 24, -1, 0, 24, 32, -1, -1, 40, -1, 112, 104, 40, 120, 48, 72},
    {10, 24, -1, 0, 24, 32, -1, -1, 40, -1, 112, 104, 40, 120, 48, 72},
    {11, -1, 56, 8, 48, 32, 69, 68, 72, -1, 128, 112, 72, 136, 48, 72},
    {12, -1, 56, 0, 8, 0, 70, -1, 72, 3, 128, 112, 68, 136, 40, 56},
    {13, 72, -1, 0, 8, 0, 70, -1, 72, 3, 128, 112, 68, 136, 40, 56},
};

/* Where the instruction a frame is executing and a code object's line
 * table are, per minor version (checked against each version's headers by
 * tests/timer_sampler.rs, and on 3.13 against _Py_DebugOffsets):
 * {minor, frame's instruction field, its kind, co_lnotab/co_linetable,
 * co_code_adaptive}. Kinds: 0 f_lasti, a byte offset (3.9); 1 f_lasti, an
 * instruction index (3.10); 2 a pointer to the instruction being executed
 * (3.11-3.12 prev_instr, 3.13 instr_ptr). */
struct line_layout {
    int minor;
    int fr_instr;
    int instr_kind;
    int co_lines;
    int co_code;
};

static const struct line_layout LINE_LAYOUTS[] = {
    {9, 104, 0, 120, -1},
    {10, 96, 1, 120, -1},
    {11, 56, 2, 136, 184},
    {12, 56, 2, 136, 192},
    {13, 56, 2, 136, 200},
};

/* What a reader outside the process needs to find every thread's frame
 * chain and the GIL's holder, per minor version (LP64; checked against
 * each version's headers by tests/pystacks.rs, and on 3.13 against
 * _Py_DebugOffsets): {minor, _PyRuntime -> interpreters.head,
 * interpreter -> its first thread state, thread state -> next, -> thread_id
 * (pthread_self), -> native_thread_id (3.11+, else -1), where the GIL's
 * state is (0: in _PyRuntime, 1: a pointer in the interpreter), its
 * offset there}. The GIL's state itself starts {interval, last_holder,
 * locked} in every version. */
struct thread_layout {
    int minor;
    int rt_interp_head;
    int interp_tstate_head;
    int ts_next;
    int ts_thread_id;
    int ts_native_tid;
    int gil_in_interp;
    int gil_off;
};

static const struct thread_layout THREAD_LAYOUTS[] = {
    {9, 32, 8, 8, 176, -1, 0, 352},
    {10, 32, 8, 8, 176, -1, 0, 352},
    {11, 40, 16, 8, 152, 160, 0, 360},
    {12, 40, 72, 8, 136, 144, 1, 384},
    {13, 632, 7344, 8, 152, 160, 1, 16},
};

/* The reader's block: published in the ring's header page at
 * READER_OFFSET when the ring is made, for gpuprof's wall-clock sampler
 * (src/collect/perf/pyread.rs), which reads the frame chains of blocked
 * threads with process_vm_readv instead of py-spy. Everything in it is
 * known at start: the interpreter's addresses, the layouts above, where
 * the code-object generation counter is (see g_code_gen: a reader's cache
 * of code objects by address stays valid while it has not moved), and a
 * cookie whose address and value tell the reader that the process still
 * runs this image (an exec leaves the old ring behind). Magic last. */
#define READER_OFFSET 2048u
#define READER_MAGIC 0x3130445259505047ULL /* "GPPYRD01" */
#define READER_VERSION 1u
enum {
    RD_RT_INTERP_HEAD,
    RD_INTERP_TSTATE_HEAD,
    RD_TS_NEXT,
    RD_TS_THREAD_ID,
    RD_TS_NATIVE_TID,
    RD_GIL_IN_INTERP,
    RD_GIL_OFF,
    RD_PTHREAD_TID, /* offset of the kernel's tid in glibc's struct pthread, or -1 */
    RD_TS_FRAME,
    RD_TS_CFRAME,
    RD_CF_CURRENT,
    RD_FR_BACK,
    RD_FR_CODE,
    RD_FR_OWNER,
    RD_FR_IS_ENTRY,
    RD_OWNER_CSTACK,
    RD_FR_READ,
    RD_CO_NAME,
    RD_CO_FILE,
    RD_CO_READ,
    RD_STR_ASCII,
    RD_STR_COMPACT,
    RD_COUNT
};
struct reader_block {
    uint64_t magic;
    uint32_t version;
    uint32_t minor;
    uint64_t runtime;   /* &_PyRuntime */
    uint64_t code_type; /* &PyCode_Type */
    uint64_t code_gen;  /* &g_code_gen (its value 0: never trust a cache) */
    uint64_t cookie_addr;
    uint64_t cookie;
    int32_t off[32];
};
_Static_assert(RD_COUNT <= 32, "reader offsets fit");
_Static_assert(sizeof(struct reader_block) == 184, "reader block layout (pyread.rs)");
_Static_assert(READER_OFFSET >= sizeof(struct gp_ring_header) &&
                   READER_OFFSET + sizeof(struct reader_block) <= GP_RING_HEADER_BYTES,
               "the reader block lies in the header page, after the ring's fields");

/* A frame's instruction in its flags: the index of the instruction (in
 * code units) + 2, so -1 (not started) is 1 and 0 is unknown; bits 8-30. */
#define FR_INSTR_SHIFT 8
#define FR_INSTR_MAX 0x7fffffu

/* Most bytes of a line table sent with a code object's name. */
#define LINES_BYTES 4096
/* rec_code.flags: the line table was longer than LINES_BYTES. */
#define CODE_LINES_CUT 1u
/* rec_code.flags: the line table could not be read. */
#define CODE_LINES_NONE 2u

struct code_slot {
    _Atomic uint64_t code;
    _Atomic uint32_t key;
    _Atomic uint32_t ready;
};

struct frame_out {
    uint64_t code;
    uint32_t key;
    uint32_t flags;
};

struct rec_head {
    uint64_t word; /* ring.h record word */
    uint32_t pid;
    uint32_t tid;
};

struct rec_hello {
    struct rec_head h;
    uint64_t time;
    uint32_t status;
    int32_t err;
    uint32_t py_hex; /* major << 24 | minor << 16 | micro << 8 */
    uint32_t forked;
    uint32_t ppid;
    uint32_t stack_bytes;
    uint64_t period_ns;
    char version[48];
    char detail[192];
};

struct rec_sample {
    struct rec_head h;
    uint64_t time;
    uint64_t regs[4];
    uint32_t status;
    uint32_t nframes;
    uint32_t stack_len;
    uint32_t overrun; /* timer: expirations merged into this signal */
    uint64_t cpu_ns;  /* the thread's CPU time (user and kernel) at this signal */
    /* nframes × struct frame_out, then stack_len bytes, padded to 8 */
};

struct rec_code {
    struct rec_head h;
    uint64_t code;
    uint32_t key;
    int32_t firstlineno;
    uint8_t name_kind; /* bytes per character: 1, 2, 4; 0 unknown */
    uint8_t file_kind;
    uint16_t flags;    /* CODE_LINES_* */
    uint32_t name_bytes;
    uint32_t file_bytes;
    uint32_t lines_bytes; /* the line table (co_lnotab / co_linetable) */
    /* name bytes, file bytes, line table bytes, padded to 8 */
};

struct rec_note {
    struct rec_head h;
    uint64_t time;
    uint32_t what;
    uint32_t value;
};

_Static_assert(sizeof(struct rec_hello) == 296, "HELLO layout (pyagent.rs)");
_Static_assert(sizeof(struct rec_sample) == 80, "SAMPLE layout (pyagent.rs)");
_Static_assert(sizeof(struct frame_out) == 16, "frame layout (pyagent.rs)");
_Static_assert(sizeof(struct rec_code) == 48, "CODE layout (pyagent.rs)");
_Static_assert(sizeof(struct rec_note) == 32, "NOTE layout (pyagent.rs)");

typedef void *(*tstate_fn)(void);
typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
typedef sighandler_t (*signal_fn)(int, sighandler_t);
typedef int (*sigmask_fn)(int, const sigset_t *, sigset_t *);

static const struct layout *L;
static const struct line_layout *LL;
/* Bytes read of a frame and of a code object: the layout's, or up to the
 * instruction and line table fields. */
static int g_fr_read;
static int g_co_read;
static tstate_fn get_tstate;
static uintptr_t code_type;
static struct gp_ring g_ring_storage[1];
static _Atomic(struct gp_ring *) g_ring;
static struct code_slot *g_codes;
/* Code objects this thread's handler found alive, by address: while no
 * code object has been deallocated since (g_code_gen unchanged), the object
 * at that address is still the same one, so its key needs no read. Reading
 * a code object costs a page of process_vm_readv (~1.7 us on a VM; a
 * worker of samples/train_sim.py has 12 per stack): two fifths of the
 * handler, timed inside it.
 * Per thread (the handler is the only user, and is not reentered for
 * SIGTRAP), so no entry is ever seen half written. */
struct live_code {
    uint64_t code;
    uint32_t key;
    uint32_t gen;
};
#define LIVE_SLOTS 512
static __thread struct live_code g_live[LIVE_SLOTS] __attribute__((tls_model("initial-exec")));
static __thread uint32_t g_live_tid __attribute__((tls_model("initial-exec")));
/* Bumped around every code object deallocation (PyCode_Type.tp_dealloc
 * wrapped at start); 0: not wrapped, no entry is ever trusted. */
static _Atomic uint32_t g_code_gen;
typedef void (*dealloc_fn)(void *);
static dealloc_fn g_code_dealloc;
/* The reader's block, filled at start, copied into each ring this process
 * makes (READER_OFFSET); magic 0: none (not a Python we read). */
static struct reader_block g_reader;
/* Changes with every image the agent starts in (see reader_block). */
static volatile uint64_t g_cookie;
static uint32_t g_stack_bytes = 32768;
static uint64_t g_period_ns = 10101010;
static uint64_t g_ring_bytes = 2u << 20;
static uint32_t g_py_hex;
static char g_version[48];
static char g_dir[512];
/* The ring is made at the process's first sample (a program that runs less
 * than one sampling period of CPU never makes one): 0 none, 1 being made,
 * 2 ready, 3 failed. */
static _Atomic int g_lazy_ring;
static uint32_t g_forked; /* this process is a forked child */
static uint32_t g_parent_pid; /* a forked child's parent, read at the fork */
static int g_event_fd = -1;
/* The in-process timer sampler, where perf events are refused (gpuprof
 * asks for it with ENV_SAMPLER, or the agent's own event failed): every
 * thread has a POSIX timer on its own CPU-time clock that sends SIGTRAP to
 * that very thread (SIGEV_THREAD_ID) with SIG_MAGIC as its value, so the
 * handler, the chaining and the masks below serve both samplers alike.
 * Timers are per process and not inherited: the thread that creates a
 * thread (pthread_create below) or forks (after_fork_child) makes the new
 * one's, exec deletes them, a thread's exit deletes its own (a key
 * destructor: a timer outlives its thread, and counts against the
 * process's pending-signal limit). */
static _Atomic int g_timer_on;
static int g_timer_wanted;
/* The recording is over or gpuprof is gone: no new timers, and each thread
 * disarms its own at its next signal. */
static _Atomic int g_timer_stopped;
static pthread_key_t g_timer_key;
static int g_timer_key_ok;
/* This thread's timer id + 1 (0: none). */
static __thread int g_timer_id1 __attribute__((tls_model("initial-exec")));
/* A CPython (1), or a native program sampled by its timers alone (0). */
static int g_python = 1;
/* Which sampler and why, for the hello. */
static char g_sampler_why[192];
/* The perf event samples the thread's periods in the kernel too. */
static int g_kernel;
/* getpid() is a system call (glibc caches nothing since 2.25), and every
 * read below names the process: the pid of the process whose event raised
 * the signal, set before that event is opened (at start, and in a forked
 * child before it opens its own). */
static pid_t g_pid;
static _Atomic int g_installed;
/* Samples dropped in a row for a full ring: gpuprof has stopped reading. */
static _Atomic uint32_t g_drops_in_a_row;
#define GIVE_UP_DROPS 1000u
/* The recording window, a file in the rings' folder that gpuprof writes
 * (src/collect/perf/pyagent.rs): its first word says whether gpuprof is
 * recording. Before `--delay` has elapsed the handler returns at once;
 * once recording is over (`--duration`, or gpuprof stopped) it stops the
 * event for good. Mapped read-only; NULL (no file): always recording. */
#define WINDOW_FILE "window"
#define WINDOW_PAUSED 0u
#define WINDOW_OPEN 1u
#define WINDOW_OVER 2u
static const _Atomic uint32_t *g_window;
/* The job's SIGTRAP disposition, read by the handler (chain()) while the
 * sigaction()/signal() wrappers may be rewriting it on another thread, or
 * on this one, interrupted by the very signal: a torn copy would call a
 * garbage handler. So it lives in slots, each written whole and only
 * then published by swapping the index of the current one; a writer owns
 * the slot it fills and, after the swap, the one it replaced (a slot is
 * claimed only when free, never while current). A reader that copied a
 * slot checks the slot's sequence number did not move meanwhile, else
 * copies the current one again: only a writer on another thread can make
 * it retry, since one interrupted on this thread writes a slot that is not
 * current, and so no reader ever waits on its own thread. Eight slots:
 * every writer in progress holds one, the current one another; a ninth
 * concurrent writer waits for one to be freed (yielding). */
#define CHAIN_SLOTS 8
#define CHAIN_WORDS (sizeof(struct sigaction) / 8)
_Static_assert(sizeof(struct sigaction) % 8 == 0, "struct sigaction in whole words");
struct chain_slot {
    _Atomic uint32_t seq;  /* odd while being written */
    _Atomic uint32_t busy; /* current, or held by a writer */
    _Atomic uint64_t words[CHAIN_WORDS];
};
static struct chain_slot g_chain[CHAIN_SLOTS];
static _Atomic uint32_t g_chain_cur;
/* How many times the job set it (a note in the ring the first time). */
static _Atomic int g_chain_sets;
static sigaction_fn real_sigaction;
static signal_fn real_signal;
static sigmask_fn real_pthread_sigmask;
static sigmask_fn real_sigprocmask;
/* Whether this thread's job code asked for SIGTRAP to be blocked. Our
 * signals are never really blocked (see pthread_sigmask below): a blocked
 * one would stay pending, and a job waiting with sigtimedwait() or reading
 * sigpending() would see it. */
static __thread int g_trap_blocked __attribute__((tls_model("initial-exec")));
/* What identifies our event's descriptor: the perf anon inode and the
 * event's id. A number alone is not enough: the job may close it
 * (closerange) and get the same number for a file of its own. */
static dev_t g_event_dev;
static ino_t g_event_ino;
static uint64_t g_event_id;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint32_t my_tid(void)
{
    return (uint32_t)syscall(SYS_gettid);
}

/* Read our own memory; a bad address is an error, never a fault. */
static int rd(void *dst, uintptr_t src, size_t n)
{
    struct iovec l = {dst, n};
    struct iovec r = {(void *)src, n};
    return process_vm_readv(g_pid, &l, 1, &r, 1, 0) == (ssize_t)n ? 0 : -1;
}

static uint64_t rd_ptr(const uint8_t *buf, int off)
{
    uint64_t v;
    memcpy(&v, buf + off, 8);
    return v;
}

static uint32_t key_of(uint64_t name, uint64_t file, int32_t line)
{
    uint64_t z = name * 0x9e3779b97f4a7c15ull ^ (file + 0x632be59bd9b4e019ull) ^ ((uint64_t)(uint32_t)line << 17);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    uint32_t k = (uint32_t)z ^ (uint32_t)(z >> 32);
    return k ? k : 1;
}

static struct gp_ring *ring(void)
{
    return atomic_load_explicit(&g_ring, memory_order_acquire);
}

static void head_init(struct rec_head *h, uint32_t tid)
{
    h->pid = (uint32_t)g_pid;
    h->tid = tid;
}

static void note(uint32_t what, uint32_t value)
{
    struct gp_ring *r = ring();
    if (!r)
        return;
    uint64_t pos = gp_ring_reserve(r, sizeof(struct rec_note));
    if (pos == UINT64_MAX)
        return;
    struct rec_note *n = gp_ring_at(r, pos);
    head_init(&n->h, my_tid());
    n->time = now_ns();
    n->what = what;
    n->value = value;
    gp_ring_commit(r, pos, sizeof *n, sizeof *n, REC_NOTE, 0);
}

/* A Python str: (bytes per char, bytes copied) into dst, or 0 when it
 * cannot be read (not compact, or a failed read). */
static uint32_t read_str(uintptr_t obj, uint8_t *dst, uint32_t cap, uint8_t *kind_out)
{
    uint8_t head[72];
    *kind_out = 0;
    if (!obj || rd(head, obj, (size_t)L->str_compact))
        return 0;
    int64_t length;
    uint32_t state;
    memcpy(&length, head + 16, 8);
    memcpy(&state, head + 32, 4);
    uint32_t kind = (state >> 2) & 7, compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
    if (!compact || (kind != 1 && kind != 2 && kind != 4) || length < 0)
        return 0;
    uint64_t bytes = (uint64_t)length * kind;
    if (bytes > cap)
        bytes = cap - cap % kind;
    uintptr_t data = obj + (uintptr_t)(ascii ? L->str_ascii : L->str_compact);
    if (bytes && rd(dst, data, bytes))
        return 0;
    *kind_out = (uint8_t)kind;
    return (uint32_t)bytes;
}

/* A code object's line table (a bytes object: its size at 16, its bytes
 * at 32) into dst, at most LINES_BYTES; flags say when it was cut or could
 * not be read. */
static uint32_t read_lines(uintptr_t obj, uint8_t *dst, uint16_t *flags)
{
    int64_t size;
    if (!obj || rd(&size, obj + 16, 8) || size < 0) {
        *flags |= CODE_LINES_NONE;
        return 0;
    }
    uint64_t n = (uint64_t)size;
    if (n > LINES_BYTES) {
        n = LINES_BYTES;
        *flags |= CODE_LINES_CUT;
    }
    if (n && rd(dst, obj + 32, n)) {
        *flags |= CODE_LINES_NONE;
        return 0;
    }
    return (uint32_t)n;
}

/* Name a code object in the ring: (code, key) → qualname, filename. */
static int emit_code(uint64_t code, uint32_t key, const uint8_t *hdr, uint32_t tid)
{
    struct gp_ring *r = ring();
    uint32_t reserve = sizeof(struct rec_code) + NAME_BYTES + FILE_BYTES + LINES_BYTES;
    uint64_t pos = gp_ring_reserve(r, reserve);
    if (pos == UINT64_MAX)
        return -1;
    struct rec_code *c = gp_ring_at(r, pos);
    head_init(&c->h, tid);
    c->code = code;
    c->key = key;
    memcpy(&c->firstlineno, hdr + L->co_firstlineno, 4);
    uint8_t *out = (uint8_t *)(c + 1);
    c->name_bytes = read_str(rd_ptr(hdr, L->co_name), out, NAME_BYTES, &c->name_kind);
    c->file_bytes = read_str(rd_ptr(hdr, L->co_file), out + c->name_bytes, FILE_BYTES, &c->file_kind);
    c->flags = 0;
    c->lines_bytes = read_lines(rd_ptr(hdr, LL->co_lines), out + c->name_bytes + c->file_bytes, &c->flags);
    uint32_t used = sizeof *c + ((c->name_bytes + c->file_bytes + c->lines_bytes + 7) & ~7u);
    gp_ring_commit(r, pos, reserve, used, REC_CODE, 0);
    return 0;
}

/* Claim or find (code, key) in the table of named code objects. Returns 1
 * when it was already named, 0 when the caller must name it (and then mark
 * the slot ready), -1 when the table is full (name it anyway). */
static int code_seen(uint64_t code, uint32_t key, struct code_slot **slot_out)
{
    *slot_out = NULL;
    if (!g_codes)
        return -1;
    uint32_t h = (uint32_t)((code >> 4) * 0x9e3779b1u) ^ key;
    for (int i = 0; i < 32; i++) {
        struct code_slot *s = &g_codes[(h + (uint32_t)i) & (CODE_TABLE - 1)];
        uint64_t c = atomic_load_explicit(&s->code, memory_order_acquire);
        if (c == 0) {
            uint64_t zero = 0;
            if (atomic_compare_exchange_strong(&s->code, &zero, code)) {
                atomic_store_explicit(&s->key, key, memory_order_release);
                *slot_out = s;
                return 0;
            }
            c = zero;
        }
        if (c == code && atomic_load_explicit(&s->key, memory_order_acquire) == key) {
            if (atomic_load_explicit(&s->ready, memory_order_acquire))
                return 1;
            return 0; /* being named by another thread: name it too */
        }
    }
    return -1;
}

/* Validate a distinct code object read into `hdr`: its key into `fo`, and
 * its name into the ring when it is new. */
static int check_code(struct frame_out *fo, const uint8_t *hdr, uint32_t tid)
{
    if (rd_ptr(hdr, 8) != code_type) {
        fo->flags |= FR_BADCODE;
        fo->key = 0;
        return 0;
    }
    int32_t line;
    memcpy(&line, hdr + L->co_firstlineno, 4);
    /* The line table too: a function compiled anew from other source, with
     * its name, file and first line, has another one. */
    fo->key = key_of(rd_ptr(hdr, L->co_name), rd_ptr(hdr, L->co_file) ^ (rd_ptr(hdr, LL->co_lines) * 0x94d049bb133111ebull),
                     line);
    struct code_slot *slot;
    int seen = code_seen(fo->code, fo->key, &slot);
    /* Marked ready only once its name is in the ring: a name dropped with
     * a full ring is sent again next time. */
    if (seen == 1)
        return 1;
    if (emit_code(fo->code, fo->key, hdr, tid) != 0)
        return 0;
    if (slot)
        atomic_store_explicit(&slot->ready, 1, memory_order_release);
    return 1;
}

static struct live_code *live_slot(uint64_t code)
{
    return &g_live[(uint32_t)((code >> 4) * 0x9e3779b1u) >> 23];
}

/* The key of a code object known alive, or 0. */
static uint32_t live_key(uint64_t code, uint32_t gen)
{
    const struct live_code *l = live_slot(code);
    return gen && l->code == code && l->gen == gen ? l->key : 0;
}

/* Wraps PyCode_Type.tp_dealloc: the generation moves on before the object
 * goes (a handler that interrupts the deallocation on this thread reads
 * the object afresh) and after (an entry made meanwhile is not trusted). */
static void code_dealloc_hook(void *op)
{
    atomic_fetch_add(&g_code_gen, 1);
    g_code_dealloc(op);
    atomic_fetch_add(&g_code_gen, 1);
}

/* Wrap PyCode_Type.tp_dealloc (offset 48 in every CPython 3.x type
 * object). Written through process_vm_writev: a type object in read-only
 * memory is an error, never a fault; then nothing is cached. */
static void hook_code_dealloc(void)
{
    uintptr_t slot = code_type + 48;
    dealloc_fn orig = NULL, mine = code_dealloc_hook;
    if (rd(&orig, slot, sizeof orig) || !orig)
        return;
    g_code_dealloc = orig;
    atomic_store(&g_code_gen, 2);
    struct iovec l = {&mine, sizeof mine}, r = {(void *)slot, sizeof mine};
    if (process_vm_writev(g_pid, &l, 1, &r, 1, 0) != (ssize_t)sizeof mine)
        atomic_store(&g_code_gen, 0);
}

/* Validate the code objects of `f[0..n)`, set their keys and name the new
 * ones: those known alive (g_live) without a read, the others reading each
 * distinct one once per sample, CODE_BATCH to a system call. `tail` (the stack copy, or NULL) is read in the same call as the
 * last batch, after the code objects: `*tail_got` is what was read of it,
 * -1 when it was not read. Returns -1 when a code object could not be
 * read. */
static int check_codes(struct frame_out *f, uint32_t n, uint32_t tid, const struct iovec *tail,
                       ssize_t *tail_got)
{
    uint8_t buf[CODE_BATCH][152];
    uint64_t uniq[CODE_BATCH];
    uint8_t deep[CODE_BATCH];
    struct frame_out first[CODE_BATCH];
    struct iovec local[CODE_BATCH + 1], remote[CODE_BATCH + 1];
    *tail_got = -1;
    int rc = 0;
    /* Even: a deallocation in progress on this thread leaves nothing
     * trusted or cached. */
    uint32_t gen = atomic_load_explicit(&g_code_gen, memory_order_acquire);
    if (gen & 1)
        gen = 0;
    if (g_live_tid != tid) {
        memset(g_live, 0, sizeof g_live);
        g_live_tid = tid;
    }
    for (uint32_t i = 0; i < n; i++) {
        f[i].key = live_key(f[i].code, gen);
        if (f[i].key)
            f[i].flags |= FR_LIVE;
    }
    for (uint32_t start = 0; start < n;) {
        /* The next frames whose code objects fit in one batch. */
        uint32_t m = 0, end = start;
        for (; end < n; end++) {
            if (f[end].flags & FR_LIVE)
                continue;
            uint32_t j = 0;
            while (j < m && uniq[j] != f[end].code)
                j++;
            if (j == m) {
                if (m == CODE_BATCH)
                    break;
                deep[m] = 0;
                uniq[m++] = f[end].code;
            }
            deep[j] |= end > 0;
        }
        if (m == 0)
            break;
        for (uint32_t j = 0; j < m; j++) {
            local[j].iov_base = buf[j];
            local[j].iov_len = (size_t)g_co_read;
            remote[j].iov_base = (void *)(uintptr_t)uniq[j];
            remote[j].iov_len = (size_t)g_co_read;
        }
        ssize_t want = (ssize_t)m * g_co_read;
        uint32_t k = m;
        if (end == n && tail) {
            local[k] = tail[0];
            remote[k] = tail[1];
            k++;
        }
        /* Remote pieces are read in order and a failed one ends the
         * call: a short count within the code objects is a failed one. */
        ssize_t got = process_vm_readv(g_pid, local, k, remote, k, 0);
        if (got < want) {
            rc = -1;
            break;
        }
        if (k > m)
            *tail_got = got - want;
        for (uint32_t j = 0; j < m; j++) {
            first[j].code = uniq[j];
            first[j].flags = 0;
            /* Only the innermost frame can be in the middle of being
             * pushed or cleared (3.11 clears a frame, and may free its
             * code object, before popping it): a code object is cached
             * only when an older frame, whose own is alive while it is,
             * runs it. */
            if (check_code(&first[j], buf[j], tid) && gen && deep[j]) {
                struct live_code *l = live_slot(uniq[j]);
                l->code = uniq[j];
                l->key = first[j].key;
                l->gen = gen;
            }
        }
        for (uint32_t i = start; i < end; i++) {
            if (f[i].flags & FR_LIVE)
                continue;
            uint32_t j = 0;
            while (uniq[j] != f[i].code)
                j++;
            f[i].key = first[j].key;
            f[i].flags |= first[j].flags;
        }
        start = end;
    }
    for (uint32_t i = 0; i < n; i++)
        f[i].flags &= ~FR_LIVE;
    return rc;
}

/* The instruction a frame is executing, as frame flags (FR_INSTR_SHIFT). */
static uint32_t instr_flags(const uint8_t *fr, uint64_t code)
{
    int64_t index;
    if (LL->instr_kind == 2) {
        uint64_t p = rd_ptr(fr, LL->fr_instr);
        uint64_t start = code + (uint64_t)LL->co_code;
        /* Before the first instruction: CPython's own answer is the
         * function's first line, as for -1 below. */
        if (p + 2 == start)
            index = -1;
        else if (p < start || (p - start) / 2 > FR_INSTR_MAX - 2)
            return 0;
        else
            index = (int64_t)((p - start) / 2);
    } else {
        int32_t lasti;
        memcpy(&lasti, fr + LL->fr_instr, 4);
        if (lasti < -1)
            return 0;
        index = LL->instr_kind == 0 && lasti >= 0 ? lasti / 2 : lasti;
        if (index > (int64_t)FR_INSTR_MAX - 2)
            return 0;
    }
    return (uint32_t)(index + 2) << FR_INSTR_SHIFT;
}

/* Most bytes read at once below a frame of a data stack (3.11+), see
 * walk(): the rest of a page. */
#define WALK_WINDOW_MAX 4096

/* Walk the thread's frame chain, innermost first, into `out`, reading
 * frames through `win` (`cap` bytes of scratch, of which the first `*dirty`
 * are written). */
static uint32_t walk(void *tstate, uintptr_t sp, struct frame_out *out, uint32_t *nout, uint8_t *win,
                     size_t cap, size_t *dirty)
{
    uintptr_t f = 0;
    *nout = 0;
    *dirty = 0;
    if (L->ts_cframe >= 0) {
        uintptr_t cf;
        if (rd(&cf, (uintptr_t)tstate + (uintptr_t)L->ts_cframe, 8) || !cf)
            return ST_UNREADABLE;
        if (rd(&f, cf + (uintptr_t)L->cf_current, 8))
            return ST_UNREADABLE;
    } else if (rd(&f, (uintptr_t)tstate + (uintptr_t)L->ts_frame, 8)) {
        return ST_UNREADABLE;
    }
    uint32_t n = 0;
    uintptr_t last_shim = 0;
    /* From 3.11 the frames of a thread are pushed on its data stack, each
     * older one just below the newer: one read of the memory below a frame
     * (within its page, which is mapped if the frame is) usually holds the
     * next ones, instead of a system call per frame. Each piece of memory
     * read costs about as much as the call itself (~0.4 us on a VM), so
     * this is one piece, not also the pages below. 3.9-3.10 frames are
     * heap objects: one each. */
    int below = L->fr_is_entry >= 0 || L->owner_cstack >= 0;
    uintptr_t room = below && cap > (size_t)g_fr_read ? cap - (size_t)g_fr_read : 0;
    uintptr_t win_lo = 0, win_hi = 0;
    while (f) {
        const uint8_t *fr;
        if (f >= win_lo && f <= win_hi && win_hi - f >= (uintptr_t)g_fr_read) {
            fr = win + (f - win_lo);
        } else {
            uintptr_t lo = f - ((f & 4095) < room ? (f & 4095) : room);
            size_t len = (size_t)(f - lo) + (size_t)g_fr_read;
            if (rd(win, lo, len))
                return *nout = n, ST_UNREADABLE;
            if (len > *dirty)
                *dirty = len;
            win_lo = lo;
            win_hi = lo + len;
            fr = win + (f - lo);
        }
        uintptr_t back = rd_ptr(fr, L->fr_back);
        if (L->owner_cstack >= 0 && fr[L->fr_owner] == L->owner_cstack) {
            /* A shim frame on the C stack of one eval-loop call: the frame
             * just inside it is the oldest of that call's run. Shims are
             * live locals, so they lie above the interrupted stack pointer
             * and each older one above the newer. */
            if (f < sp || f <= last_shim)
                return *nout = n, ST_INCONSISTENT;
            last_shim = f;
            if (n)
                out[n - 1].flags |= FR_ENTRY;
            f = back;
            continue;
        }
        if (n == MAX_FRAMES)
            return *nout = n, ST_TRUNCATED;
        out[n].code = rd_ptr(fr, L->fr_code);
        out[n].key = 0;
        out[n].flags = instr_flags(fr, out[n].code);
        if (L->fr_is_entry >= 0 ? fr[L->fr_is_entry] != 0 : L->owner_cstack < 0)
            out[n].flags |= FR_ENTRY;
        n++;
        f = back;
    }
    *nout = n;
    return ST_OK;
}

static struct gp_ring *lazy_ring(void);
static int our_event(int fd);
static void hello(uint32_t status, int err, uint32_t forked, const char *detail);

/* This thread's sampling timer: SIGTRAP after every period of its CPU
 * time. Returns 0 or an errno. Not in the handler (pthread_setspecific). */
static int thread_timer_start(void)
{
    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = SIGTRAP;
    sev.sigev_value.sival_ptr = (void *)(uintptr_t)SIG_MAGIC;
    sev._sigev_un._tid = (pid_t)my_tid();
    int id = -1;
    /* The kernel's calls, not librt's: glibc before 2.34 keeps timer_create
     * in librt, which the job may not load. */
    if (syscall(SYS_timer_create, CLOCK_THREAD_CPUTIME_ID, &sev, &id))
        return errno;
    struct itimerspec its;
    its.it_interval.tv_sec = (time_t)(g_period_ns / 1000000000u);
    its.it_interval.tv_nsec = (long)(g_period_ns % 1000000000u);
    its.it_value = its.it_interval;
    if (syscall(SYS_timer_settime, id, 0, &its, NULL)) {
        int e = errno;
        syscall(SYS_timer_delete, id);
        return e;
    }
    g_timer_id1 = id + 1;
    if (g_timer_key_ok)
        pthread_setspecific(g_timer_key, (void *)(intptr_t)(id + 1));
    return 0;
}

/* Disarm this thread's timer (async-signal-safe). */
static void thread_timer_stop(void)
{
    struct itimerspec z;
    memset(&z, 0, sizeof z);
    if (g_timer_id1 > 0)
        syscall(SYS_timer_settime, g_timer_id1 - 1, 0, &z, NULL);
}

/* A thread exits: its timer goes with it. */
static void thread_timer_gone(void *v)
{
    int id1 = (int)(intptr_t)v;
    if (id1 > 0 && id1 == g_timer_id1) {
        syscall(SYS_timer_delete, id1 - 1);
        g_timer_id1 = 0;
    }
}

/* Stop sampling in this process for good (window over, gpuprof gone):
 * the perf event at once; the timers each at its thread's next signal. */
static void stop_signals(int by_timer)
{
    if (by_timer) {
        atomic_store(&g_timer_stopped, 1);
        thread_timer_stop();
    } else if (our_event(g_event_fd)) {
        ioctl(g_event_fd, PERF_EVENT_IOC_DISABLE, 0);
    }
}

/* A copy of the job's disposition (async-signal-safe, see g_chain). */
static void chain_read(struct sigaction *out)
{
    uint64_t w[CHAIN_WORDS];
    for (;;) {
        struct chain_slot *c = &g_chain[atomic_load_explicit(&g_chain_cur, memory_order_acquire)];
        uint32_t q = atomic_load_explicit(&c->seq, memory_order_acquire);
        if (q & 1)
            continue; /* freed and being refilled: the current one is another */
        for (size_t k = 0; k < CHAIN_WORDS; k++)
            w[k] = atomic_load_explicit(&c->words[k], memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&c->seq, memory_order_relaxed) == q)
            break;
    }
    memcpy(out, w, sizeof w);
}

static void slot_copy(struct sigaction *out, const struct chain_slot *c)
{
    uint64_t w[CHAIN_WORDS];
    for (size_t k = 0; k < CHAIN_WORDS; k++)
        w[k] = atomic_load_explicit(&c->words[k], memory_order_relaxed);
    memcpy(out, w, sizeof w);
}

/* Make `act` the job's disposition; the one it replaces into `old`. */
static void chain_write(const struct sigaction *act, struct sigaction *old)
{
    uint64_t w[CHAIN_WORDS];
    memcpy(w, act, sizeof w);
    struct chain_slot *mine = NULL;
    while (!mine) {
        for (int i = 0; i < CHAIN_SLOTS && !mine; i++) {
            uint32_t free_ = 0;
            if (atomic_compare_exchange_strong(&g_chain[i].busy, &free_, 1))
                mine = &g_chain[i];
        }
        if (!mine)
            syscall(SYS_sched_yield);
    }
    atomic_fetch_add_explicit(&mine->seq, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    for (size_t k = 0; k < CHAIN_WORDS; k++)
        atomic_store_explicit(&mine->words[k], w[k], memory_order_relaxed);
    atomic_fetch_add_explicit(&mine->seq, 1, memory_order_release);
    uint32_t was = atomic_exchange_explicit(&g_chain_cur, (uint32_t)(mine - g_chain), memory_order_acq_rel);
    if (old)
        slot_copy(old, &g_chain[was]);
    atomic_store_explicit(&g_chain[was].busy, 0, memory_order_release);
}

/* The disposition found at install time, before any wrapper can run. */
static void chain_init(const struct sigaction *prev)
{
    uint64_t w[CHAIN_WORDS];
    memcpy(w, prev, sizeof w);
    for (size_t k = 0; k < CHAIN_WORDS; k++)
        atomic_store_explicit(&g_chain[0].words[k], w[k], memory_order_relaxed);
    atomic_store(&g_chain[0].busy, 1);
    atomic_store(&g_chain_cur, 0);
}

/* In a forked child only the forking thread is left: a slot another
 * thread of the parent was filling is free again, and whole. */
static void chain_after_fork(void)
{
    uint32_t cur = atomic_load(&g_chain_cur);
    for (uint32_t i = 0; i < CHAIN_SLOTS; i++) {
        if (i == cur)
            continue;
        uint32_t q = atomic_load(&g_chain[i].seq);
        if (q & 1)
            atomic_store(&g_chain[i].seq, q + 1);
        atomic_store(&g_chain[i].busy, 0);
    }
}

static void chain(int sig, siginfo_t *si, void *ucv)
{
    if (g_trap_blocked) {
        /* Not ours, and the job blocks SIGTRAP in this thread: what it
         * would see without us is the signal pending. Raise it again with
         * SIGTRAP blocked from the handler's return on (the mask is
         * restored from the context); pthread_sigmask below unblocks it
         * when the job does. */
        ucontext_t *uc = ucv;
        sigaddset(&uc->uc_sigmask, SIGTRAP);
        syscall(SYS_tgkill, getpid(), my_tid(), SIGTRAP);
        return;
    }
    void *uc = ucv;
    struct sigaction c;
    chain_read(&c);
    if (c.sa_handler == SIG_IGN)
        return;
    if (c.sa_handler != SIG_DFL) {
        /* Called as the kernel would call it: its sa_mask blocked while
         * it runs (SIGTRAP already is: this handler runs with it
         * blocked, SA_NODEFER or not), and SA_RESETHAND leaving SIG_DFL
         * behind, before the call as the kernel does it. rt_sigprocmask
         * and chain_write are async-signal-safe. */
        if (c.sa_flags & SA_RESETHAND) {
            struct sigaction dfl;
            memset(&dfl, 0, sizeof dfl);
            dfl.sa_handler = SIG_DFL;
            chain_write(&dfl, NULL);
        }
        sigset_t was;
        syscall(SYS_rt_sigprocmask, SIG_BLOCK, &c.sa_mask, &was, _NSIG / 8);
        if (c.sa_flags & SA_SIGINFO)
            c.sa_sigaction(sig, si, uc);
        else
            c.sa_handler(sig);
        syscall(SYS_rt_sigprocmask, SIG_SETMASK, &was, NULL, _NSIG / 8);
        return;
    }
    /* What the job would get without us: the default action. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    atomic_store(&g_installed, 0);
    real_sigaction(SIGTRAP, &dfl, NULL);
    syscall(SYS_tgkill, getpid(), my_tid(), SIGTRAP);
}

struct perf_siginfo {
    int si_signo, si_errno, si_code, pad;
    void *addr;
    unsigned long data;
    uint32_t type, flags;
};

/* glibc's initial stack pointer (argc, just above _start's frame); absent
 * from other C libraries. */
extern void *__libc_stack_end __attribute__((weak));

/* How much of the interrupted stack to copy: up to where the thread's stack
 * ends, when that is known and nearer than g_stack_bytes. The outermost
 * frame lies just below it: for the main thread, glibc's __libc_stack_end;
 * for a thread glibc created, its descriptor (pthread_self()), which glibc
 * places at the top of the thread's stack, above start_thread's frame.
 * A typical Python stack uses a few KiB; the copy used to run on to the end
 * of the stack's mapping (the environment above the main thread's stack),
 * 6.5-13.5 KiB per sample on average against 2.7 KiB now. An end
 * that is not a little above sp (a thread on a stack of its own making,
 * another C library) leaves the copy at g_stack_bytes, which the kernel
 * cuts at the end of the mapping. */
#define STACK_END_SLACK 128
/* This thread's pthread_self(), taken where the thread starts (the
 * constructor, pthread_create's trampoline below): pthread_self() is not
 * on the async-signal-safe list. 0 for a thread not started through the
 * wrapper: its copy is then g_stack_bytes long. */
static __thread uintptr_t g_thread_desc __attribute__((tls_model("initial-exec")));
static size_t stack_copy_len(uintptr_t sp)
{
    size_t len = g_stack_bytes;
    uintptr_t ends[2] = {g_thread_desc, 0};
    if (&__libc_stack_end)
        ends[1] = (uintptr_t)__libc_stack_end;
    for (int i = 0; i < 2; i++) {
        uintptr_t e = ends[i];
        if (e > sp && e - sp + STACK_END_SLACK < len)
            len = (e - sp + STACK_END_SLACK + 7) & ~(size_t)7;
    }
    return len;
}

/* Whether `fd` is still our sampling event (async-signal-safe). */
static int our_event(int fd)
{
    struct stat st;
    uint64_t id = 0;
    if (fd < 0 || fstat(fd, &st) || st.st_dev != g_event_dev || st.st_ino != g_event_ino)
        return 0;
    return ioctl(fd, PERF_EVENT_IOC_ID, &id) == 0 && id == g_event_id;
}

/* Everything the handler calls, directly or not, and why each may run in
 * a signal handler that interrupted any code of the job (malloc, a lock
 * held, the sigaction() wrapper on this very thread):
 *   - on POSIX's async-signal-safe list: clock_gettime, getpid, getppid,
 *     fstat, open, close, unlink, sigaction, sigaddset, timer_settime (as
 *     its system call), memcpy, memset, strnlen;
 *   - system calls through syscall(), which only sets errno (saved and
 *     restored): gettid, tgkill, process_vm_readv (every read of the
 *     interpreter's memory, so a stale pointer is an error, not a fault),
 *     ioctl on our perf event (its id; disable), and, once per process
 *     when its first sample makes the ring, fallocate and mmap (ring.h);
 *   - PyGILState_GetThisThreadState: the interpreter's thread-local
 *     lookup (pthread_getspecific, which reads this thread's own
 *     descriptor: no lock, no allocation); CPython's faulthandler calls it
 *     from its fatal-signal handler too;
 *   - lock-free atomics (asserted below), and TLS variables of the
 *     initial-exec model, allocated with the thread (never lazily);
 *   - the job's own SIGTRAP handler, for a SIGTRAP that is not ours, read
 *     whole from its slot (chain_read), called as the kernel would call
 *     it (its sa_mask set with rt_sigprocmask; SA_RESETHAND through
 *     chain_write, the lock-free slot write the sigaction wrapper uses).
 * Not called: pthread_self (cached at thread start, g_thread_desc), stdio,
 * malloc, posix_fallocate, anything that may take a lock. */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2 && ATOMIC_LONG_LOCK_FREE == 2, "lock-free atomics");
static void on_sigtrap(int sig, siginfo_t *si, void *ucv)
{
    const struct perf_siginfo *ps = (const struct perf_siginfo *)si;
    int by_timer = si && si->si_code == TIMER_CODE && si->si_value.sival_ptr == (void *)(uintptr_t)SIG_MAGIC;
    if (!by_timer && (!si || si->si_code != TRAP_PERF_CODE || ps->data != (unsigned long)SIG_MAGIC)) {
        chain(sig, si, ucv);
        return;
    }
    int saved_errno = errno;
    if (by_timer && atomic_load_explicit(&g_timer_stopped, memory_order_relaxed)) {
        thread_timer_stop();
        errno = saved_errno;
        return;
    }
    if (g_window) {
        uint32_t w = atomic_load_explicit(g_window, memory_order_relaxed);
        if (w != WINDOW_OPEN) {
            if (w == WINDOW_OVER)
                stop_signals(by_timer);
            errno = saved_errno;
            return;
        }
    }
    uint32_t tid = my_tid();
    if (!by_timer && (ps->flags & TRAP_PERF_FLAG_ASYNC_BIT)) {
        note(NOTE_ASYNC, tid);
        errno = saved_errno;
        return;
    }
    struct gp_ring *r = ring();
    if (!r) {
        if (!(r = lazy_ring())) {
            errno = saved_errno;
            return;
        }
        if (atomic_load(&g_timer_on))
            hello(g_python ? HELLO_SAMPLING_TIMER : HELLO_NATIVE_TIMER, 0, g_forked, g_sampler_why);
        else
            hello(g_kernel ? HELLO_SAMPLING_KERNEL : HELLO_SAMPLING, 0, g_forked,
                  g_kernel ? NULL : g_sampler_why);
        /* A disposition the job set before the first sample had no ring
         * to be noted in. */
        if (atomic_load(&g_chain_sets) > 0)
            note(NOTE_HANDLER_CHAINED, 0);
    }
    uint64_t t = now_ns();
    ucontext_t *uc = ucv;
    uint64_t regs[4];
#if defined(__x86_64__)
    regs[0] = (uint64_t)uc->uc_mcontext.gregs[REG_RBP];
    regs[1] = (uint64_t)uc->uc_mcontext.gregs[REG_RSP];
    regs[2] = (uint64_t)uc->uc_mcontext.gregs[REG_RIP];
    regs[3] = 0;
    uintptr_t sp = regs[1];
#elif defined(__aarch64__)
    regs[0] = uc->uc_mcontext.regs[29];
    regs[1] = uc->uc_mcontext.regs[30];
    regs[2] = uc->uc_mcontext.sp;
    regs[3] = uc->uc_mcontext.pc;
    uintptr_t sp = regs[2];
#else
    (void)uc;
    memset(regs, 0, sizeof regs);
    uintptr_t sp = 0;
#endif
    uint32_t reserve = sizeof(struct rec_sample) + MAX_FRAMES * sizeof(struct frame_out) + g_stack_bytes;
    size_t window = g_stack_bytes < WALK_WINDOW_MAX ? g_stack_bytes : WALK_WINDOW_MAX;
    uint64_t pos = gp_ring_reserve(r, reserve);
    if (pos == UINT64_MAX) {
        /* gpuprof is gone (nothing read for ~10 s of samples): stop the
         * signals for good, in this process. */
        if (atomic_fetch_add(&g_drops_in_a_row, 1) + 1 == GIVE_UP_DROPS)
            stop_signals(by_timer);
        errno = saved_errno;
        return;
    }
    atomic_store_explicit(&g_drops_in_a_row, 0, memory_order_relaxed);
    struct rec_sample *s = gp_ring_at(r, pos);
    head_init(&s->h, tid);
    s->time = t;
    memcpy(s->regs, regs, sizeof regs);
    /* A CPU-time timer is checked at the scheduler's tick while the thread
     * runs: periods that expired since the last check come as one signal
     * with this count (measured under load at a 4 ms period: 40 signals for
     * 100 periods), and the sample stands for all of them. */
    s->overrun = by_timer && si->si_overrun > 0 ? (uint32_t)si->si_overrun : 0;
    /* What gpuprof counts the periods this signal stands for by: several
     * that ended in one stretch in the kernel come as one signal, and with
     * the kernel's periods unsampled the next sample says how many were. */
    struct timespec cpu;
    s->cpu_ns = syscall(SYS_clock_gettime, CLOCK_THREAD_CPUTIME_ID, &cpu)
                    ? 0
                    : (uint64_t)cpu.tv_sec * 1000000000ull + (uint64_t)cpu.tv_nsec;
    struct frame_out *fo = (struct frame_out *)(s + 1);
    uint32_t n = 0;
    void *ts = g_python ? get_tstate() : NULL;
    if (!ts) {
        s->status = ST_NO_TSTATE;
    } else {
        /* Scratch for the walk: the end of the reservation, which the
         * frames (at most MAX_FRAMES) do not reach. Zeroed again after:
         * the reader takes a nonzero word past the last record for one
         * being written (ring.h), and the commit below may hand the end
         * of the reservation back to the ring. */
        uint8_t *scratch = (uint8_t *)s + reserve - window;
        size_t dirty;
        s->status = walk(ts, sp, fo, &n, scratch, window, &dirty);
        memset(scratch, 0, dirty);
    }
    s->nframes = n;
    /* The stack from the interrupted stack pointer up, read with the last
     * code objects: the copy stops at the end of the mapping, as the
     * kernel's does for perf samples. */
    uint8_t *stack = (uint8_t *)(fo + n);
    size_t want = stack_copy_len(sp);
    struct iovec tail[2] = {{stack, want}, {(void *)sp, want}};
    ssize_t got = -1;
    if (n && check_codes(fo, n, tid, tail, &got))
        s->status = ST_UNREADABLE;
    if (got <= 0) {
        /* Not read with the code objects (none, or one failed), or
         * nothing of it could be: alone, then, if the length crossed the
         * end, up to the end of the first page. */
        got = process_vm_readv(g_pid, &tail[0], 1, &tail[1], 1, 0);
        if (got < 0) {
            size_t to_page = 4096 - (sp & 4095);
            tail[0].iov_len = tail[1].iov_len = to_page;
            got = process_vm_readv(g_pid, &tail[0], 1, &tail[1], 1, 0);
            if (got < 0)
                got = 0;
        }
    }
    s->stack_len = (uint32_t)got;
    uint32_t used = (uint32_t)(sizeof *s + n * sizeof(struct frame_out) + (((uint32_t)got + 7) & ~7u));
    gp_ring_commit(r, pos, reserve, used, REC_SAMPLE, 0);
    errno = saved_errno;
}

/* The job's view of SIGTRAP: what it set (or the default), while our
 * handler stays installed and passes on every SIGTRAP that is not ours. */
EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (!real_sigaction)
        real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    if (!real_sigaction) {
        errno = ENOSYS;
        return -1;
    }
    if (sig == SIGTRAP && atomic_load(&g_installed)) {
        if (act) {
            /* act and old may be one struct. */
            struct sigaction a = *act;
            chain_write(&a, old);
            if (atomic_fetch_add(&g_chain_sets, 1) == 0)
                note(NOTE_HANDLER_CHAINED, 0);
        } else if (old) {
            chain_read(old);
        }
        return 0;
    }
    return real_sigaction(sig, act, old);
}

EXPORT sighandler_t signal(int sig, sighandler_t handler)
{
    if (sig == SIGTRAP && atomic_load(&g_installed)) {
        struct sigaction act, old;
        memset(&act, 0, sizeof act);
        act.sa_handler = handler;
        act.sa_flags = SA_RESTART;
        sigemptyset(&act.sa_mask);
        if (sigaction(sig, &act, &old))
            return SIG_ERR;
        return (old.sa_flags & SA_SIGINFO) ? (sighandler_t)(void *)old.sa_sigaction : old.sa_handler;
    }
    if (!real_signal)
        real_signal = (signal_fn)dlsym(RTLD_NEXT, "signal");
    if (!real_signal) {
        errno = ENOSYS;
        return SIG_ERR;
    }
    return real_signal(sig, handler);
}

/* The job's signal mask, less SIGTRAP while we sample: the job's wish for
 * SIGTRAP is kept per thread and reported back, so what it reads is what it
 * set. */
static int mask_call(sigmask_fn real, int how, const sigset_t *set, sigset_t *old)
{
    if (!atomic_load(&g_installed) || !set) {
        int rc = real(how, set, old);
        if (rc == 0 && old && g_trap_blocked && atomic_load(&g_installed))
            sigaddset(old, SIGTRAP);
        return rc;
    }
    int want = g_trap_blocked;
    int has = sigismember(set, SIGTRAP) == 1;
    if (how == SIG_BLOCK && has)
        want = 1;
    else if (how == SIG_UNBLOCK && has)
        want = 0;
    else if (how == SIG_SETMASK)
        want = has;
    sigset_t s = *set;
    if (how != SIG_UNBLOCK)
        sigdelset(&s, SIGTRAP);
    else if (!want)
        sigaddset(&s, SIGTRAP); /* a foreign one held back by chain() */
    int was = g_trap_blocked;
    int rc = real(how, &s, old);
    if (rc == 0) {
        if (old) {
            if (was)
                sigaddset(old, SIGTRAP);
            else
                sigdelset(old, SIGTRAP);
        }
        g_trap_blocked = want;
        if (!want && how != SIG_UNBLOCK) {
            /* Release a foreign SIGTRAP that chain() held back. */
            sigset_t t;
            sigemptyset(&t);
            sigaddset(&t, SIGTRAP);
            real(SIG_UNBLOCK, &t, NULL);
        }
    }
    return rc;
}

EXPORT int pthread_sigmask(int how, const sigset_t *set, sigset_t *old)
{
    if (!real_pthread_sigmask)
        real_pthread_sigmask = (sigmask_fn)dlsym(RTLD_NEXT, "pthread_sigmask");
    if (!real_pthread_sigmask)
        return ENOSYS;
    return mask_call(real_pthread_sigmask, how, set, old);
}

EXPORT int sigprocmask(int how, const sigset_t *set, sigset_t *old)
{
    if (!real_sigprocmask)
        real_sigprocmask = (sigmask_fn)dlsym(RTLD_NEXT, "sigprocmask");
    if (!real_sigprocmask) {
        errno = ENOSYS;
        return -1;
    }
    return mask_call(real_sigprocmask, how, set, old);
}

static uint64_t env_u64(const char *name, uint64_t dflt, uint64_t lo, uint64_t hi)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || x < lo || x > hi)
        return dflt;
    return x;
}

/* "<dir>/<pid>-<hex>.ring" without stdio: this also runs in the signal
 * handler (the first sample of a forked child). */
static void ring_path(char *out, size_t cap, uint32_t pid, uint64_t nonce)
{
    size_t n = strnlen(g_dir, sizeof g_dir - 1);
    if (n + 40 > cap)
        n = cap - 40;
    memcpy(out, g_dir, n);
    out[n++] = '/';
    char tmp[24];
    int k = 0;
    do {
        tmp[k++] = (char)('0' + pid % 10);
        pid /= 10;
    } while (pid);
    while (k)
        out[n++] = tmp[--k];
    out[n++] = '-';
    do {
        tmp[k++] = "0123456789abcdef"[nonce & 15];
        nonce >>= 4;
    } while (nonce);
    while (k)
        out[n++] = tmp[--k];
    memcpy(out + n, ".ring", 6);
}

/* Copy the reader's block into a new ring's header page (a plain copy of
 * memory prepared at start: async-signal-safe), magic last. */
static void publish_reader(struct gp_ring *r)
{
    if (g_reader.magic != READER_MAGIC)
        return;
    struct reader_block *b = (struct reader_block *)((uint8_t *)r->hdr + READER_OFFSET);
    struct reader_block tmp = g_reader;
    tmp.magic = 0;
    memcpy(b, &tmp, sizeof tmp);
    atomic_thread_fence(memory_order_release);
    *(volatile uint64_t *)&b->magic = READER_MAGIC;
}

/* Create this process's ring in the gpuprof folder. Async-signal-safe:
 * open, close, unlink, getpid and clock_gettime are on POSIX's list, the
 * rest are system calls (gp_ring_create). */
static int open_ring(struct gp_ring *out)
{
    char path[600];
    int fd = -1;
    for (int attempt = 0; attempt < 8 && fd < 0; attempt++) {
        ring_path(path, sizeof path, (uint32_t)getpid(), now_ns() + (uint64_t)attempt);
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0 && errno != EEXIST)
            return errno;
    }
    if (fd < 0)
        return EEXIST;
    int err = gp_ring_create(out, fd, g_ring_bytes, (uint32_t)getpid());
    close(fd);
    if (err)
        unlink(path);
    else
        publish_reader(out);
    return err;
}

static void hello(uint32_t status, int err, uint32_t forked, const char *detail)
{
    struct gp_ring *r = ring();
    if (!r)
        return;
    uint64_t pos = gp_ring_reserve(r, sizeof(struct rec_hello));
    if (pos == UINT64_MAX)
        return;
    struct rec_hello *h = gp_ring_at(r, pos);
    head_init(&h->h, my_tid());
    h->time = now_ns();
    h->status = status;
    h->err = err;
    h->py_hex = g_py_hex;
    h->forked = forked;
    h->ppid = forked ? g_parent_pid : (uint32_t)getppid();
    h->stack_bytes = g_stack_bytes;
    h->period_ns = g_period_ns;
    memset(h->version, 0, sizeof h->version);
    memcpy(h->version, g_version, strnlen(g_version, sizeof h->version - 1));
    memset(h->detail, 0, sizeof h->detail);
    if (detail)
        memcpy(h->detail, detail, strnlen(detail, sizeof h->detail - 1));
    gp_ring_commit(r, pos, sizeof *h, sizeof *h, REC_HELLO, 0);
}

/* Where the sampling event's descriptor goes (see open_event). */
#define HIGH_FD 1000

/* The sampling event on this thread, inherited by the threads it creates. */
/* Does this kernel send a perf event's SIGTRAP from the return path to user
 * mode (task_work), as Linux 6.11 and later do? */
static int kernel_sends_trap_on_return(void)
{
    struct utsname u;
    if (uname(&u))
        return 0;
    int major = 0, minor = 0;
    if (sscanf(u.release, "%d.%d", &major, &minor) != 2)
        return 0;
    return major > 6 || (major == 6 && minor >= 11);
}

static int open_event(int kernel)
{
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_CPU_CLOCK;
    a.sample_period = g_period_ns;
    a.inherit = 1;
    a.inherit_thread = 1;
    a.exclude_kernel = !kernel;
    a.exclude_hv = 1;
    a.remove_on_exec = 1;
    a.sigtrap = 1;
    a.sig_data = SIG_MAGIC;
    int fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0)
        return -errno;
    /* Out of the way of the numbers the job opens next (the lowest free):
     * a job that closed everything and opens a file expects its number.
     * Not far out of the way: the kernel sizes a process's descriptor
     * table to its highest number, and fork copies that table, so 7/8 of a
     * container's usual 1048576 would cost every process ~7 MB and every
     * fork (each DataLoader worker) the copy. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur > 64) {
        rlim_t target = rl.rlim_cur - rl.rlim_cur / 8;
        if (target > HIGH_FD)
            target = HIGH_FD;
        int high = fcntl(fd, F_DUPFD_CLOEXEC, (int)target);
        if (high >= 0) {
            close(fd);
            fd = high;
        }
    }
    struct stat st;
    uint64_t id = 0;
    if (fstat(fd, &st) || ioctl(fd, PERF_EVENT_IOC_ID, &id)) {
        int e = errno;
        close(fd);
        return -e;
    }
    g_event_dev = st.st_dev;
    g_event_ino = st.st_ino;
    g_event_id = id;
    return fd;
}

/* The ring, made when it is first needed. Returns NULL until it is ready. */
static struct gp_ring *lazy_ring(void)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&g_lazy_ring, &expected, 1))
        return NULL;
    struct gp_ring *cur = &g_ring_storage[0];
    if (open_ring(cur)) {
        atomic_store(&g_lazy_ring, 3);
        return NULL;
    }
    atomic_store_explicit(&g_ring, cur, memory_order_release);
    atomic_store(&g_lazy_ring, 2);
    return cur;
}

/* Open the event, or (asked for, or the event refused) this thread's
 * timer; on success the ring and the hello come with the first sample (see
 * on_sigtrap), else a ring is made now to say why. */
static void start_sampling(void)
{
    int perf_err = 0;
    g_kernel = 0;
    if (!g_timer_wanted) {
        /* The thread's periods in the kernel (system calls, page faults)
         * sampled too where the kernel allows it: else the hrtimer that ends
         * a period in kernel mode takes no sample, and a thread that spends
         * most of its CPU time in system calls shows a fraction of it. Only
         * from Linux 6.11, which sends the SIGTRAP from the return path to
         * user mode: before, it was raised at once, and a system call the
         * period ended in could then return EINTR to the job. */
        int fd = -EACCES;
        if (kernel_sends_trap_on_return()) {
            fd = open_event(1);
            if (fd < 0)
                snprintf(g_sampler_why, sizeof g_sampler_why,
                         "time in the kernel not sampled: perf_event_open refused it (%s; root, CAP_PERFMON or "
                         "perf_event_paranoid <= 1 allow it)",
                         strerror(-fd));
        } else {
            snprintf(g_sampler_why, sizeof g_sampler_why,
                     "time in the kernel not sampled: this kernel raises the sample signal inside system calls "
                     "(Linux 6.11 and later do not)");
        }
        if (fd >= 0) {
            g_kernel = 1;
        } else {
            fd = open_event(0);
        }
        if (fd >= 0) {
            g_event_fd = fd;
            return;
        }
        perf_err = -fd;
    }
    int terr = thread_timer_start();
    if (terr == 0) {
        if (perf_err)
            snprintf(g_sampler_why, sizeof g_sampler_why,
                     "in-process CPU-time timers: perf_event_open with sigtrap on itself failed (%s)",
                     strerror(perf_err));
        else
            snprintf(g_sampler_why, sizeof g_sampler_why,
                     "in-process CPU-time timers: perf events are refused to gpuprof, or --sampler timer");
        atomic_store(&g_timer_on, 1);
        return;
    }
    if (!g_python || lazy_ring() == NULL)
        return;
    char d[192];
    if (perf_err)
        snprintf(d, sizeof d, "perf_event_open with sigtrap on itself failed: %s; a CPU-time timer too: %s",
                 strerror(perf_err), strerror(terr));
    else
        snprintf(d, sizeof d, "a per-thread CPU-time timer could not be made: %s", strerror(terr));
    hello(HELLO_PERF_REFUSED, perf_err ? perf_err : terr, g_forked, d);
}

typedef int (*pcreate_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
static pcreate_fn real_pthread_create;

struct start_args {
    void *(*fn)(void *);
    void *arg;
};

/* A new thread's first steps: where its stack ends, its own timer, then
 * the job's function. */
static void *thread_start(void *p)
{
    struct start_args t = *(struct start_args *)p;
    free(p);
    g_thread_desc = (uintptr_t)pthread_self();
    if (atomic_load(&g_timer_on) && !atomic_load(&g_timer_stopped) &&
        !(g_window && atomic_load_explicit(g_window, memory_order_relaxed) == WINDOW_OVER))
        thread_timer_start();
    return t.fn(t.arg);
}

/* Threads get their timer from their first instruction on (a perf event
 * is inherited; a timer is not), and say where their stack ends. */
EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    if (!real_pthread_create)
        real_pthread_create = (pcreate_fn)dlsym(RTLD_NEXT, "pthread_create");
    if (!real_pthread_create)
        return ENOSYS;
    struct start_args *t = NULL;
    if (atomic_load(&g_installed))
        t = malloc(sizeof *t);
    if (!t)
        return real_pthread_create(th, attr, fn, arg);
    t->fn = fn;
    t->arg = arg;
    int rc = real_pthread_create(th, attr, thread_start, t);
    if (rc)
        free(t);
    return rc;
}

static void after_fork_child(void)
{
    if (!atomic_load(&g_installed))
        return;
    g_pid = getpid();
    chain_after_fork();
    /* The parent's event is not inherited (inherit_thread), its fd is; and
     * the parent's ring is the parent's. The number is closed only if it
     * still is that event: the job may have closed it and reused it. */
    if (our_event(g_event_fd))
        close(g_event_fd);
    g_event_fd = -1;
    /* The parent's timers are not the child's: forget this thread's. */
    g_timer_id1 = 0;
    if (g_timer_key_ok)
        pthread_setspecific(g_timer_key, NULL);
    atomic_store(&g_timer_on, 0);
    g_parent_pid = (uint32_t)getppid();
    g_forked = 1;
    /* The parent's ring stays mapped in the child otherwise: 2 MiB of
     * address space and page tables per worker, for nothing. The child
     * runs alone here, outside any handler. */
    struct gp_ring *inherited = atomic_load_explicit(&g_ring, memory_order_acquire);
    if (inherited && inherited->hdr)
        munmap(inherited->hdr, GP_RING_HEADER_BYTES + inherited->hdr->capacity);
    atomic_store_explicit(&g_ring, NULL, memory_order_release);
    atomic_store(&g_lazy_ring, 0);
    start_sampling();
}

static int parse_version(const char *v, int *maj, int *min, int *mic)
{
    return sscanf(v, "%d.%d.%d", maj, min, mic) == 3 ? 0 : -1;
}

/* 3.13 publishes its own layout: check ours against it and refuse
 * free-threaded builds, whose objects have another header. */
static const char *check_debug_offsets(void)
{
    const uint8_t *rt = dlsym(RTLD_DEFAULT, "_PyRuntime");
    if (!rt)
        return "no _PyRuntime symbol";
    if (memcmp(rt, "xdebugpy", 8))
        return "no debug offsets in _PyRuntime";
    uint64_t v[48];
    memcpy(v, rt + 8, sizeof v);
    /* version, free_threaded, runtime_state{3}, interpreter_state{13},
     * thread_state{size, prev, next, interp, current_frame, ...} */
    if (v[1] != 0)
        return "a free-threaded build";
    uint64_t *ts = &v[2 + 3 + 13];
    if (ts[4] != (uint64_t)L->ts_frame)
        return "PyThreadState.current_frame is not where expected";
    uint64_t *fr = &ts[9];
    if (fr[1] != (uint64_t)L->fr_back || fr[2] != (uint64_t)L->fr_code || fr[5] != (uint64_t)L->fr_owner)
        return "_PyInterpreterFrame is not laid out as expected";
    uint64_t *co = &fr[6];
    if (co[1] != (uint64_t)L->co_file || co[3] != (uint64_t)L->co_name || co[5] != (uint64_t)L->co_firstlineno)
        return "PyCodeObject is not laid out as expected";
    /* interpreter_frame.instr_ptr; code_object.linetable, co_code_adaptive */
    if (fr[3] != (uint64_t)LL->fr_instr || co[4] != (uint64_t)LL->co_lines || co[9] != (uint64_t)LL->co_code)
        return "the instruction pointer or line table is not where expected";
    /* runtime_state.interpreters_head; interpreter_state.threads_head,
     * ceval_gil; thread_state.next, thread_id, native_thread_id: what the
     * reader's block (prepare_reader) publishes. */
    const struct thread_layout *T = &THREAD_LAYOUTS[4];
    uint64_t *is = &v[2 + 3];
    if (T->minor != 13 || v[4] != (uint64_t)T->rt_interp_head || is[3] != (uint64_t)T->interp_tstate_head ||
        is[8] != (uint64_t)T->gil_off || ts[2] != (uint64_t)T->ts_next || ts[5] != (uint64_t)T->ts_thread_id ||
        ts[6] != (uint64_t)T->ts_native_tid)
        return "the interpreter's thread list or GIL is not where expected";
    return NULL;
}

/* Map gpuprof's recording-window word (see WINDOW_FILE). */
static void map_window(void)
{
    char path[sizeof g_dir + sizeof WINDOW_FILE + 1];
    snprintf(path, sizeof path, "%s/%s", g_dir, WINDOW_FILE);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    void *p = mmap(NULL, sizeof(uint32_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED)
        g_window = p;
}

static void install_and_start(void);

/* Where glibc keeps the kernel's thread id in its thread descriptor
 * (struct pthread, which pthread_self() points at): found by looking for
 * this thread's id in it. A reader of Python 3.9/3.10, whose thread states
 * name their thread by pthread_self() only, reads it there. -1: not
 * found. */
static int pthread_tid_offset(void)
{
    uint32_t buf[512];
    uint32_t tid = my_tid();
    if (rd(buf, (uintptr_t)pthread_self(), sizeof buf))
        return -1;
    for (int i = 0; i < 512; i++)
        if (buf[i] == tid)
            return i * 4;
    return -1;
}

/* Fill the reader's block (see reader_block). */
static void prepare_reader(int minor)
{
    const struct thread_layout *T = NULL;
    for (size_t i = 0; i < sizeof THREAD_LAYOUTS / sizeof THREAD_LAYOUTS[0]; i++)
        if (THREAD_LAYOUTS[i].minor == minor)
            T = &THREAD_LAYOUTS[i];
    void *rt = dlsym(RTLD_DEFAULT, "_PyRuntime");
    if (!T || !rt || !L)
        return;
    g_cookie = now_ns() ^ ((uint64_t)(uint32_t)g_pid << 32) ^ 0x9e3779b97f4a7c15ull;
    struct reader_block *b = &g_reader;
    memset(b, 0, sizeof *b);
    b->version = READER_VERSION;
    b->minor = (uint32_t)minor;
    b->runtime = (uint64_t)(uintptr_t)rt;
    b->code_type = (uint64_t)code_type;
    b->code_gen = (uint64_t)(uintptr_t)&g_code_gen;
    b->cookie_addr = (uint64_t)(uintptr_t)&g_cookie;
    b->cookie = g_cookie;
    int32_t *o = b->off;
    o[RD_RT_INTERP_HEAD] = T->rt_interp_head;
    o[RD_INTERP_TSTATE_HEAD] = T->interp_tstate_head;
    o[RD_TS_NEXT] = T->ts_next;
    o[RD_TS_THREAD_ID] = T->ts_thread_id;
    o[RD_TS_NATIVE_TID] = T->ts_native_tid;
    o[RD_GIL_IN_INTERP] = T->gil_in_interp;
    o[RD_GIL_OFF] = T->gil_off;
    o[RD_PTHREAD_TID] = T->ts_native_tid < 0 ? pthread_tid_offset() : -1;
    o[RD_TS_FRAME] = L->ts_frame;
    o[RD_TS_CFRAME] = L->ts_cframe;
    o[RD_CF_CURRENT] = L->cf_current;
    o[RD_FR_BACK] = L->fr_back;
    o[RD_FR_CODE] = L->fr_code;
    o[RD_FR_OWNER] = L->fr_owner;
    o[RD_FR_IS_ENTRY] = L->fr_is_entry;
    o[RD_OWNER_CSTACK] = L->owner_cstack;
    o[RD_FR_READ] = L->fr_read;
    o[RD_CO_NAME] = L->co_name;
    o[RD_CO_FILE] = L->co_file;
    o[RD_CO_READ] = L->co_read;
    o[RD_STR_ASCII] = L->str_ascii;
    o[RD_STR_COMPACT] = L->str_compact;
    b->magic = READER_MAGIC;
}

__attribute__((constructor)) static void pystacks_init(void)
{
    if (!real_sigaction)
        real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    if (!real_signal)
        real_signal = (signal_fn)dlsym(RTLD_NEXT, "signal");
    if (!real_pthread_sigmask)
        real_pthread_sigmask = (sigmask_fn)dlsym(RTLD_NEXT, "pthread_sigmask");
    if (!real_sigprocmask)
        real_sigprocmask = (sigmask_fn)dlsym(RTLD_NEXT, "sigprocmask");
    const char *dir = getenv(ENV_DIR);
    if (!dir || !*dir || strlen(dir) >= sizeof g_dir)
        return;
    g_pid = getpid();
#if !defined(__x86_64__) && !defined(__aarch64__)
    return; /* registers and layouts are known for x86_64 and aarch64 only */
#endif
    const char *sampler = getenv(ENV_SAMPLER);
    g_timer_wanted = sampler && !strcmp(sampler, "timer");
    get_tstate = (tstate_fn)dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
    const char *(*version)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "Py_GetVersion");
    void *ct = dlsym(RTLD_DEFAULT, "PyCode_Type");
    /* Not a CPython whose symbols we can see: with perf refused, the
     * timers are its only native sampler; else perf samples it. */
    g_python = get_tstate && version && ct;
    if (!g_python && !g_timer_wanted)
        return;
    code_type = (uintptr_t)ct;
    strcpy(g_dir, dir);
    map_window();
    g_period_ns = env_u64(ENV_PERIOD, g_period_ns, 1000000, 1000000000);
    g_stack_bytes = (uint32_t)env_u64(ENV_STACK, g_stack_bytes, 1024, 65528) & ~7u;
    uint64_t rb = env_u64(ENV_RING, g_ring_bytes, 256u << 10, 64u << 20);
    g_ring_bytes = 1;
    while (g_ring_bytes < rb)
        g_ring_bytes <<= 1;
    if (!g_python) {
        uint64_t probe = 0x1234, back = 0;
        if (rd(&back, (uintptr_t)&probe, 8) || back != probe)
            return; /* the stack copy would fail: nothing to say of it */
        install_and_start();
        return;
    }

    const char *v = version();
    size_t vl = strcspn(v, " ");
    if (vl >= sizeof g_version)
        vl = sizeof g_version - 1;
    memcpy(g_version, v, vl);
    g_version[vl] = 0;
    int maj = 0, min = 0, mic = 0;
    parse_version(g_version, &maj, &min, &mic);
    g_py_hex = (uint32_t)maj << 24 | (uint32_t)min << 16 | (uint32_t)mic << 8;

    const char *refuse = NULL;
    char why[192];
    for (size_t i = 0; i < sizeof LAYOUTS / sizeof LAYOUTS[0]; i++)
        if (maj == 3 && LAYOUTS[i].minor == min) {
            L = &LAYOUTS[i];
            LL = &LINE_LAYOUTS[i];
            g_fr_read = L->fr_read;
            int instr_end = LL->fr_instr + (LL->instr_kind == 2 ? 8 : 4);
            if (instr_end > g_fr_read)
                g_fr_read = instr_end;
            g_co_read = L->co_read > LL->co_lines + 8 ? L->co_read : LL->co_lines + 8;
        }
    if (!L) {
        snprintf(why, sizeof why, "Python %s: same-instant frames support CPython 3.9 to 3.13", g_version);
        refuse = why;
    } else if (dlsym(RTLD_DEFAULT, "_Py_NegativeRefcount") || dlsym(RTLD_DEFAULT, "_Py_RefTotal")) {
        refuse = "a debug build of CPython (another object layout)";
    } else if (min == 13) {
        refuse = check_debug_offsets();
    }
    if (!refuse) {
        /* process_vm_readv on ourselves may be refused (seccomp). */
        uint64_t probe = 0x1234, back = 0;
        if (rd(&back, (uintptr_t)&probe, 8) || back != probe) {
            snprintf(why, sizeof why, "process_vm_readv on itself failed (%s): a seccomp filter?", strerror(errno));
            refuse = why;
        }
    }
    if (refuse) {
        /* A ring only to say why. */
        if (lazy_ring())
            hello(HELLO_UNSUPPORTED, 0, 0, refuse);
        return;
    }
    g_codes = mmap(NULL, CODE_TABLE * sizeof(struct code_slot), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g_codes == MAP_FAILED)
        g_codes = NULL;
    hook_code_dealloc();
    prepare_reader(min);
    install_and_start();
}

/* Install the SIGTRAP handler and start sampling this process. */
static void install_and_start(void)
{
    struct sigaction sa, prev;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigtrap;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (!real_sigaction || real_sigaction(SIGTRAP, &sa, &prev)) {
        if (g_python && lazy_ring())
            hello(HELLO_FAILED, errno, 0, "cannot install the SIGTRAP handler");
        return;
    }
    chain_init(&prev);
    g_thread_desc = (uintptr_t)pthread_self();
    /* A mask inherited from the parent with SIGTRAP blocked is the job's:
     * keep it as its wish, and take SIGTRAP out of the real one. */
    sigset_t cur;
    if (real_pthread_sigmask && real_pthread_sigmask(SIG_SETMASK, NULL, &cur) == 0 &&
        sigismember(&cur, SIGTRAP) == 1) {
        sigset_t t;
        sigemptyset(&t);
        sigaddset(&t, SIGTRAP);
        g_trap_blocked = 1;
        real_pthread_sigmask(SIG_UNBLOCK, &t, NULL);
    }
    atomic_store(&g_installed, 1);
    g_timer_key_ok = pthread_key_create(&g_timer_key, thread_timer_gone) == 0;
    pthread_atfork(NULL, NULL, after_fork_child);
    start_sampling();
}
