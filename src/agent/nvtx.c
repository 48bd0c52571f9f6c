/*
 * gpuprof's NVTX injection library.
 *
 * NVTX v3 is header-only: at the first NVTX call of each NVTX instance in a
 * process, the header code dlopens the library named by
 * NVTX_INJECTION64_PATH and calls its InitializeInjectionNvtx2 with a
 * function that returns export tables; through them this library fills the
 * instance's function-pointer slots with its own handlers. gpuprof names
 * this library there (unless the job already names one, e.g. under Nsight).
 *
 * Handlers write fixed-layout records into a ring of their own thread: a
 * file in GPUPROF_NVTX_DIR, mapped shared, that gpuprof's reader drains
 * (single producer, single consumer; the reader never writes the producer's
 * side). The hot path takes no lock, makes no system call and never waits:
 * a full ring (gpuprof slow or gone) drops the record and counts it.
 *
 * Lifetimes, as the reader sees them:
 *   - one instance file per process image ("i-PID-NONCE.inst"), opened
 *     O_CLOEXEC and flock'ed shared: when the process exits, is killed or
 *     execs, the lock goes and the reader knows the instance is over;
 *   - one ring file per thread ("r-PID-NONCE-TID.ring"), created at the
 *     thread's first NVTX call; a thread-exit record and a closed state
 *     when the thread ends;
 *   - after fork, the child drops the parent's files (it would otherwise
 *     write into the parent's rings) and creates its own at its first NVTX
 *     call, naming the parent's instance so that inherited domain ids
 *     resolve.
 * Files are fully allocated when created (fallocate), so a full tmpfs
 * makes the creation fail (NVTX stays off in that thread) instead of
 * raising SIGBUS in the job later.
 *
 * The NVTX types below are defined here from the published ABI, with size
 * checks, so that building gpuprof needs no NVTX headers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- NVTX ABI (nvToolsExt.h / nvtxDetail/nvtxTypes.h, version 3) ---- */

enum {
    NVTX_VERSION = 3,
    NVTX_ETID_CALLBACKS = 1,
    NVTX_ETID_VERSIONINFO = 3,
    NVTX_CB_MODULE_CORE = 1,
    NVTX_CB_MODULE_CORE2 = 5,
};

enum {
    CBID_CORE_MarkEx = 1,
    CBID_CORE_MarkA = 2,
    CBID_CORE_MarkW = 3,
    CBID_CORE_RangeStartEx = 4,
    CBID_CORE_RangeStartA = 5,
    CBID_CORE_RangeStartW = 6,
    CBID_CORE_RangeEnd = 7,
    CBID_CORE_RangePushEx = 8,
    CBID_CORE_RangePushA = 9,
    CBID_CORE_RangePushW = 10,
    CBID_CORE_RangePop = 11,
    CBID_CORE_NameCategoryA = 12,
    CBID_CORE_NameCategoryW = 13,
    CBID_CORE_NameOsThreadA = 14,
    CBID_CORE_NameOsThreadW = 15,
};

enum {
    CBID_CORE2_DomainMarkEx = 1,
    CBID_CORE2_DomainRangeStartEx = 2,
    CBID_CORE2_DomainRangeEnd = 3,
    CBID_CORE2_DomainRangePushEx = 4,
    CBID_CORE2_DomainRangePop = 5,
    CBID_CORE2_DomainNameCategoryA = 8,
    CBID_CORE2_DomainNameCategoryW = 9,
    CBID_CORE2_DomainRegisterStringA = 10,
    CBID_CORE2_DomainRegisterStringW = 11,
    CBID_CORE2_DomainCreateA = 12,
    CBID_CORE2_DomainCreateW = 13,
    CBID_CORE2_DomainDestroy = 14,
    CBID_CORE2_Initialize = 15,
};

enum {
    NVTX_MESSAGE_TYPE_ASCII = 1,
    NVTX_MESSAGE_TYPE_UNICODE = 2,
    NVTX_MESSAGE_TYPE_REGISTERED = 3,
};

enum {
    NVTX_PAYLOAD_TYPE_UNSIGNED_INT64 = 1,
    NVTX_PAYLOAD_TYPE_INT64 = 2,
    NVTX_PAYLOAD_TYPE_DOUBLE = 3,
    NVTX_PAYLOAD_TYPE_UNSIGNED_INT32 = 4,
    NVTX_PAYLOAD_TYPE_INT32 = 5,
    NVTX_PAYLOAD_TYPE_FLOAT = 6,
};

typedef struct nvtx_event_attributes {
    uint16_t version;
    uint16_t size;
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type;
    int32_t reserved0;
    union {
        uint64_t u64;
        int64_t i64;
        double d;
        uint32_t u32;
        int32_t i32;
        float f;
    } payload;
    int32_t message_type;
    union {
        const char *ascii;
        const wchar_t *unicode;
        const void *registered;
    } message;
} nvtx_event_attributes;

_Static_assert(sizeof(nvtx_event_attributes) == 48, "nvtxEventAttributes_v2 is 48 bytes");
_Static_assert(offsetof(nvtx_event_attributes, payload) == 24, "payload offset");
_Static_assert(offsetof(nvtx_event_attributes, message_type) == 32, "messageType offset");
_Static_assert(offsetof(nvtx_event_attributes, message) == 40, "message offset");

typedef void (*nvtx_fn)(void);
typedef const void *(*get_export_table_fn)(uint32_t id);

typedef struct {
    size_t struct_size;
    int (*get_module_function_table)(int module, nvtx_fn ***out_table, unsigned int *out_size);
} export_table_callbacks;

typedef struct {
    size_t struct_size;
    uint32_t version;
    uint32_t reserved0;
    void (*set_injection_nvtx_version)(uint32_t version);
} export_table_version_info;

_Static_assert(sizeof(export_table_callbacks) == 16, "NvtxExportTableCallbacks layout");
_Static_assert(sizeof(export_table_version_info) == 24, "NvtxExportTableVersionInfo layout");

/* ---- The files shared with gpuprof (src/collect/nvtx.rs reads them) ---- */

#define INST_MAGIC 0x31494e5458564e47ull /* "GNVXTNI1" little-endian */
#define RING_MAGIC 0x31524e5458564e47ull /* "GNVXTNR1" */
#define FORMAT_VERSION 1u
#define RING_HEADER 4096u
#define RING_DATA (256u * 1024u)
#define MAX_MESSAGE 1024u

typedef struct {
    uint64_t magic;
    uint32_t version;
    int32_t pid;
    uint64_t nonce;
    uint64_t parent_nonce; /* 0: not forked from an instrumented process */
    int32_t parent_pid;
    uint32_t reserved;
    uint64_t created_ns;
} inst_header;

typedef struct {
    uint64_t magic;
    uint32_t version;
    int32_t pid;
    uint64_t nonce;
    int32_t tid;
    uint32_t data_size;
    uint64_t created_ns;
    uint8_t pad0[64 - 40];
    _Atomic uint64_t head; /* bytes written, by the job's thread */
    uint8_t pad1[56];
    _Atomic uint64_t tail; /* bytes consumed, by gpuprof */
    uint8_t pad2[56];
    _Atomic uint64_t lost; /* records dropped: ring full or re-entered */
    _Atomic uint32_t state; /* 1 live, 2 closed (thread ended) */
    uint32_t reserved;
} ring_header;

_Static_assert(offsetof(ring_header, head) == 64, "ring head offset");
_Static_assert(offsetof(ring_header, tail) == 128, "ring tail offset");
_Static_assert(offsetof(ring_header, lost) == 192, "ring lost offset");
_Static_assert(offsetof(ring_header, state) == 200, "ring state offset");
_Static_assert(sizeof(ring_header) <= RING_HEADER, "ring header fits its page");

/* Record kinds. Every record starts with rec_header and is padded to a
 * multiple of 8 bytes; `size` includes everything. */
enum {
    REC_PAD = 0, /* skip to the end of the data area */
    REC_PUSH = 1,
    REC_POP = 2,
    REC_START = 3,
    REC_END = 4,
    REC_MARK = 5,
    REC_DOMAIN = 6,
    REC_CATEGORY = 7,
    REC_THREAD_NAME = 8,
    REC_THREAD_EXIT = 9,
};

/* flags: bits 0-3 payload type (NVTX's numbering, 0 none) */
typedef struct {
    uint8_t kind;
    uint8_t flags;
    uint16_t size;
    uint32_t domain;
    uint64_t t;
} rec_header;

/* PUSH, START, MARK: followed by the message bytes (no terminator). */
typedef struct {
    rec_header h;
    uint64_t id;       /* PUSH: depth; START: range id; MARK: 0 */
    uint32_t category;
    uint32_t msg_len;
    uint64_t payload;  /* raw bits, meaningful when flags has a type */
} rec_event;

/* POP (id = depth of the range ended), END (id = range id), DOMAIN (id =
 * domain id, name follows), CATEGORY (id = category, name follows; h.domain
 * its domain), THREAD_NAME (id = OS thread id, name follows), THREAD_EXIT. */
typedef struct {
    rec_header h;
    uint64_t id;
    uint32_t msg_len;
    uint32_t reserved;
} rec_small;

_Static_assert(sizeof(rec_header) == 16, "record header");
_Static_assert(sizeof(rec_event) == 40, "event record");
_Static_assert(sizeof(rec_small) == 32, "small record");

/* ---- Process state ---- */

#define MAX_DEPTH_DOMAINS 64

typedef struct domain {
    uint32_t magic;
    uint32_t id;
    char name[];
} domain;

typedef struct registered_string {
    uint32_t magic;
    uint32_t len;
    char text[];
} registered_string;

#define DOMAIN_MAGIC 0x4e4d4f44u
#define STRING_MAGIC 0x474e5453u

typedef struct {
    uint64_t gen;
    ring_header *ring;
    uint8_t *data;
    /* The reader's tail as last read: reloaded (a cache line the reader
     * writes) only when the ring looks full with it. */
    uint64_t tail_cache;
    int32_t tid;
    int failed;         /* no ring for this thread in this generation */
    int busy;           /* a handler is running on this thread */
    int32_t depth[MAX_DEPTH_DOMAINS];
} thread_state;

static char g_dir[512];
static int g_enabled;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_key_t g_key;
/* Bumped in a forked child: every thread state of an older generation
 * belongs to the parent's files. */
static _Atomic uint64_t g_gen = 1;
static uint64_t g_nonce;
static uint64_t g_parent_nonce;
static int32_t g_parent_pid;
static int g_inst_fd = -1;
static int g_inst_failed;
static _Atomic uint64_t g_next_range = 1;
static _Atomic uint32_t g_next_domain = 1;
static _Atomic uint64_t g_string_bytes;

static __thread thread_state t_state;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t make_nonce(void) {
    uint64_t x = now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&t_state;
    /* splitmix64 */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return (x ^ (x >> 31)) | 1;
}

static int full_write(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Create `final` atomically: written under a temporary name, then renamed,
 * so the reader never maps a half-initialized file. Returns an fd (O_CLOEXEC)
 * or -1. */
static int create_file(const char *final, const void *header, size_t header_len, size_t total,
                       int lock) {
    char tmp[640];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", final) >= (int)sizeof tmp)
        return -1;
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -1;
    /* The lock is taken before the file is visible: the reader must never
     * see an unlocked instance file of a live process. */
    if ((lock && flock(fd, LOCK_SH | LOCK_NB) != 0) || posix_fallocate(fd, 0, (off_t)total) != 0 ||
        full_write(fd, header, header_len) != 0 || rename(tmp, final) != 0) {
        close(fd);
        unlink(tmp);
        return -1;
    }
    return fd;
}

/* The instance file of this process image, created at its first NVTX event
 * (never in a forked child that only execs). Called with g_lock held. */
static int ensure_instance(void) {
    if (g_inst_fd >= 0)
        return 0;
    if (g_inst_failed)
        return -1;
    inst_header h;
    memset(&h, 0, sizeof h);
    h.magic = INST_MAGIC;
    h.version = FORMAT_VERSION;
    h.pid = (int32_t)getpid();
    h.nonce = g_nonce;
    h.parent_nonce = g_parent_nonce;
    h.parent_pid = g_parent_pid;
    h.created_ns = now_ns();
    char path[600];
    if (snprintf(path, sizeof path, "%s/i-%d-%016llx.inst", g_dir, (int)h.pid,
                 (unsigned long long)g_nonce) >= (int)sizeof path) {
        g_inst_failed = 1;
        return -1;
    }
    int fd = create_file(path, &h, sizeof h, sizeof h, 1);
    if (fd < 0) {
        g_inst_failed = 1;
        return -1;
    }
    g_inst_fd = fd;
    return 0;
}

static void thread_exit(void *arg);

/* Give the calling thread a ring. Slow path: once per thread (and once
 * after a fork). */
static int attach_thread(thread_state *ts) {
    uint64_t gen = atomic_load_explicit(&g_gen, memory_order_acquire);
    if (ts->gen == gen)
        return ts->ring ? 0 : -1;
    ts->gen = gen;
    ts->ring = NULL;
    ts->data = NULL;
    ts->failed = 1;
    ts->tid = (int32_t)syscall(SYS_gettid);
    if (!g_enabled)
        return -1;
    pthread_mutex_lock(&g_lock);
    int ok = ensure_instance() == 0;
    uint64_t nonce = g_nonce;
    pthread_mutex_unlock(&g_lock);
    if (!ok)
        return -1;
    ring_header h;
    memset(&h, 0, sizeof h);
    h.magic = RING_MAGIC;
    h.version = FORMAT_VERSION;
    h.pid = (int32_t)getpid();
    h.nonce = nonce;
    h.tid = ts->tid;
    h.data_size = RING_DATA;
    h.created_ns = now_ns();
    atomic_init(&h.state, 1);
    char path[600];
    if (snprintf(path, sizeof path, "%s/r-%d-%016llx-%d.ring", g_dir, (int)h.pid,
                 (unsigned long long)nonce, (int)ts->tid) >= (int)sizeof path)
        return -1;
    size_t total = RING_HEADER + RING_DATA;
    int fd = create_file(path, &h, sizeof h, total, 0);
    if (fd < 0)
        return -1;
    void *m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        unlink(path);
        return -1;
    }
    ts->ring = (ring_header *)m;
    ts->data = (uint8_t *)m + RING_HEADER;
    ts->tail_cache = 0;
    ts->failed = 0;
    /* Any non-NULL value makes the destructor run at thread exit. */
    pthread_setspecific(g_key, ts);
    return 0;
}

/* Reserve `size` bytes (a multiple of 8) in the thread's ring; NULL when it
 * is full. The record becomes visible to the reader at commit(). */
static uint8_t *reserve(thread_state *ts, uint32_t size, uint64_t *new_head) {
    ring_header *r = ts->ring;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint64_t off = head & (RING_DATA - 1);
    uint64_t need = size;
    if (off + size > RING_DATA)
        need += RING_DATA - off; /* pad to the end, start over at 0 */
    if (head + need - ts->tail_cache > RING_DATA) {
        ts->tail_cache = atomic_load_explicit(&r->tail, memory_order_acquire);
        if (head + need - ts->tail_cache > RING_DATA) {
            atomic_fetch_add_explicit(&r->lost, 1, memory_order_relaxed);
            return NULL;
        }
    }
    if (off + size > RING_DATA) {
        /* The reader wraps at a PAD kind byte, or by itself when fewer
         * bytes than a record header are left. */
        ts->data[off] = REC_PAD;
        off = 0;
    }
    *new_head = head + need;
    return ts->data + off;
}

static void commit(thread_state *ts, uint64_t new_head) {
    atomic_store_explicit(&ts->ring->head, new_head, memory_order_release);
}

/* Enter a handler: the thread's state when it can record, NULL otherwise
 * (no ring, or a signal handler re-entered NVTX while this thread was in
 * the middle of writing a record). */
static inline thread_state *enter(void) {
    thread_state *ts = &t_state;
    if (__builtin_expect(ts->gen != atomic_load_explicit(&g_gen, memory_order_relaxed), 0)) {
        if (ts->busy)
            return NULL;
        ts->busy = 1;
        attach_thread(ts);
        ts->busy = 0;
    }
    if (__builtin_expect(ts->ring == NULL, 0))
        return NULL;
    if (__builtin_expect(ts->busy, 0)) {
        atomic_fetch_add_explicit(&ts->ring->lost, 1, memory_order_relaxed);
        return NULL;
    }
    ts->busy = 1;
    return ts;
}

static inline void leave(thread_state *ts) {
    ts->busy = 0;
}

/* UTF-32 (Linux wchar_t) to UTF-8, at most `cap` bytes, whole characters. */
static uint32_t wide_to_utf8(const wchar_t *w, char *out, uint32_t cap) {
    uint32_t n = 0;
    for (; w && *w; w++) {
        uint32_t c = (uint32_t)*w;
        char b[4];
        uint32_t k;
        if (c < 0x80) {
            b[0] = (char)c;
            k = 1;
        } else if (c < 0x800) {
            b[0] = (char)(0xc0 | (c >> 6));
            b[1] = (char)(0x80 | (c & 0x3f));
            k = 2;
        } else if (c < 0x10000) {
            if (c >= 0xd800 && c < 0xe000)
                c = 0xfffd;
            b[0] = (char)(0xe0 | (c >> 12));
            b[1] = (char)(0x80 | ((c >> 6) & 0x3f));
            b[2] = (char)(0x80 | (c & 0x3f));
            k = 3;
        } else if (c < 0x110000) {
            b[0] = (char)(0xf0 | (c >> 18));
            b[1] = (char)(0x80 | ((c >> 12) & 0x3f));
            b[2] = (char)(0x80 | ((c >> 6) & 0x3f));
            b[3] = (char)(0x80 | (c & 0x3f));
            k = 4;
        } else {
            b[0] = (char)0xef;
            b[1] = (char)0xbf;
            b[2] = (char)0xbd;
            k = 3;
        }
        if (n + k > cap)
            break;
        memcpy(out + n, b, k);
        n += k;
    }
    return n;
}

/* Length of an ASCII/UTF-8 message, cut at MAX_MESSAGE. */
static inline uint32_t msg_len(const char *s) {
    if (!s)
        return 0;
    size_t n = strnlen(s, MAX_MESSAGE);
    return (uint32_t)n;
}

static inline uint32_t pad8(uint32_t n) {
    return (n + 7u) & ~7u;
}

/* A message as NVTX passes it: kind + pointer. */
typedef struct {
    int type;
    const void *p;
} message;

/* Write a PUSH / START / MARK record. */
static void write_event(thread_state *ts, uint8_t kind, uint32_t dom, uint64_t id, uint32_t category,
                        int payload_type, uint64_t payload, message m, uint64_t t) {
    const char *ascii = NULL;
    uint32_t len = 0;
    int wide = 0;
    if (m.type == NVTX_MESSAGE_TYPE_ASCII) {
        ascii = (const char *)m.p;
        len = msg_len(ascii);
    } else if (m.type == NVTX_MESSAGE_TYPE_REGISTERED) {
        const registered_string *s = (const registered_string *)m.p;
        if (s && s->magic == STRING_MAGIC) {
            ascii = s->text;
            len = s->len;
        }
    } else if (m.type == NVTX_MESSAGE_TYPE_UNICODE && m.p) {
        wide = 1;
        len = MAX_MESSAGE; /* upper bound; the real length is set below */
    }
    uint32_t size = (uint32_t)sizeof(rec_event) + pad8(len);
    uint64_t head;
    rec_event *r = (rec_event *)reserve(ts, size, &head);
    if (!r)
        return;
    char *text = (char *)(r + 1);
    if (wide) {
        len = wide_to_utf8((const wchar_t *)m.p, text, MAX_MESSAGE);
        /* Give back the unused part of the reservation. */
        uint32_t used = (uint32_t)sizeof(rec_event) + pad8(len);
        head -= size - used;
        size = used;
    } else if (len) {
        memcpy(text, ascii, len);
    }
    r->h.kind = kind;
    r->h.flags = (uint8_t)(payload_type > 0 && payload_type <= 6 ? payload_type : 0);
    r->h.size = (uint16_t)size;
    r->h.domain = dom;
    r->h.t = t;
    r->id = id;
    r->category = category;
    r->msg_len = len;
    r->payload = payload;
    commit(ts, head);
}

static void write_small(thread_state *ts, uint8_t kind, uint32_t dom, uint64_t id, const char *text,
                        uint32_t len, uint64_t t) {
    uint32_t size = (uint32_t)sizeof(rec_small) + pad8(len);
    uint64_t head;
    rec_small *r = (rec_small *)reserve(ts, size, &head);
    if (!r)
        return;
    if (len)
        memcpy(r + 1, text, len);
    r->h.kind = kind;
    r->h.flags = 0;
    r->h.size = (uint16_t)size;
    r->h.domain = dom;
    r->h.t = t;
    r->id = id;
    r->msg_len = len;
    r->reserved = 0;
    commit(ts, head);
}

static void thread_exit(void *arg) {
    thread_state *ts = (thread_state *)arg;
    if (ts != &t_state || ts->ring == NULL)
        return;
    if (ts->gen == atomic_load_explicit(&g_gen, memory_order_acquire)) {
        write_small(ts, REC_THREAD_EXIT, 0, 0, NULL, 0, now_ns());
        atomic_store_explicit(&ts->ring->state, 2, memory_order_release);
        munmap(ts->ring, RING_HEADER + RING_DATA);
    }
    ts->ring = NULL;
    ts->data = NULL;
}

/* ---- Domains, attributes, messages ---- */

static inline uint32_t domain_id(const void *d) {
    const domain *dom = (const domain *)d;
    if (!dom || dom->magic != DOMAIN_MAGIC)
        return 0;
    return dom->id;
}

static inline int32_t *depth_slot(thread_state *ts, uint32_t dom) {
    return dom < MAX_DEPTH_DOMAINS ? &ts->depth[dom] : NULL;
}

static inline message attr_message(const nvtx_event_attributes *a) {
    message m = {0, NULL};
    if (a && a->size >= offsetof(nvtx_event_attributes, message) + sizeof(a->message)) {
        m.type = a->message_type;
        m.p = a->message.ascii;
    }
    return m;
}

static inline uint32_t attr_category(const nvtx_event_attributes *a) {
    return a && a->size >= offsetof(nvtx_event_attributes, color_type) ? a->category : 0;
}

static inline int attr_payload(const nvtx_event_attributes *a, uint64_t *bits) {
    if (!a || a->size < offsetof(nvtx_event_attributes, message_type))
        return 0;
    int t = a->payload_type;
    if (t < NVTX_PAYLOAD_TYPE_UNSIGNED_INT64 || t > NVTX_PAYLOAD_TYPE_FLOAT)
        return 0;
    *bits = a->payload.u64;
    return t;
}

static int push(uint32_t dom, const nvtx_event_attributes *a, message m) {
    uint64_t t = now_ns();
    thread_state *ts = enter();
    if (!ts)
        return 0;
    int32_t *d = depth_slot(ts, dom);
    int32_t level = d ? (*d)++ : 0;
    uint64_t payload = 0;
    int pt = attr_payload(a, &payload);
    write_event(ts, REC_PUSH, dom, d ? (uint64_t)level : UINT64_MAX, attr_category(a), pt, payload,
                m, t);
    leave(ts);
    return level;
}

static int pop(uint32_t dom) {
    uint64_t t = now_ns();
    thread_state *ts = enter();
    if (!ts)
        return 0;
    int32_t *d = depth_slot(ts, dom);
    int32_t level;
    if (d) {
        if (*d <= 0) {
            leave(ts);
            return -1; /* nothing open: NVTX's error value */
        }
        level = --(*d);
    } else {
        level = 0;
    }
    write_small(ts, REC_POP, dom, d ? (uint64_t)level : UINT64_MAX, NULL, 0, t);
    leave(ts);
    return level;
}

static uint64_t start(uint32_t dom, const nvtx_event_attributes *a, message m) {
    uint64_t t = now_ns();
    uint64_t id = atomic_fetch_add_explicit(&g_next_range, 1, memory_order_relaxed);
    thread_state *ts = enter();
    if (!ts)
        return id;
    uint64_t payload = 0;
    int pt = attr_payload(a, &payload);
    write_event(ts, REC_START, dom, id, attr_category(a), pt, payload, m, t);
    leave(ts);
    return id;
}

static void end(uint32_t dom, uint64_t id) {
    uint64_t t = now_ns();
    thread_state *ts = enter();
    if (!ts)
        return;
    write_small(ts, REC_END, dom, id, NULL, 0, t);
    leave(ts);
}

static void mark(uint32_t dom, const nvtx_event_attributes *a, message m) {
    uint64_t t = now_ns();
    thread_state *ts = enter();
    if (!ts)
        return;
    uint64_t payload = 0;
    int pt = attr_payload(a, &payload);
    write_event(ts, REC_MARK, dom, 0, attr_category(a), pt, payload, m, t);
    leave(ts);
}

static void name_small(uint8_t kind, uint32_t dom, uint64_t id, message m) {
    char buf[MAX_MESSAGE];
    uint32_t len = 0;
    if (m.type == NVTX_MESSAGE_TYPE_ASCII && m.p) {
        len = msg_len((const char *)m.p);
        memcpy(buf, m.p, len);
    } else if (m.type == NVTX_MESSAGE_TYPE_UNICODE && m.p) {
        len = wide_to_utf8((const wchar_t *)m.p, buf, MAX_MESSAGE);
    }
    thread_state *ts = enter();
    if (!ts)
        return;
    write_small(ts, kind, dom, id, buf, len, now_ns());
    leave(ts);
}

#define ASCII(s) ((message){NVTX_MESSAGE_TYPE_ASCII, (const void *)(s)})
#define WIDE(s) ((message){NVTX_MESSAGE_TYPE_UNICODE, (const void *)(s)})

/* ---- The handlers NVTX calls ---- */

static void h_mark_ex(const nvtx_event_attributes *a) { mark(0, a, attr_message(a)); }
static void h_mark_a(const char *s) { mark(0, NULL, ASCII(s)); }
static void h_mark_w(const wchar_t *s) { mark(0, NULL, WIDE(s)); }
static uint64_t h_start_ex(const nvtx_event_attributes *a) { return start(0, a, attr_message(a)); }
static uint64_t h_start_a(const char *s) { return start(0, NULL, ASCII(s)); }
static uint64_t h_start_w(const wchar_t *s) { return start(0, NULL, WIDE(s)); }
static void h_end(uint64_t id) { end(0, id); }
static int h_push_ex(const nvtx_event_attributes *a) { return push(0, a, attr_message(a)); }
static int h_push_a(const char *s) { return push(0, NULL, ASCII(s)); }
static int h_push_w(const wchar_t *s) { return push(0, NULL, WIDE(s)); }
static int h_pop(void) { return pop(0); }
static void h_name_category_a(uint32_t c, const char *s) { name_small(REC_CATEGORY, 0, c, ASCII(s)); }
static void h_name_category_w(uint32_t c, const wchar_t *s) { name_small(REC_CATEGORY, 0, c, WIDE(s)); }
static void h_name_thread_a(uint32_t tid, const char *s) { name_small(REC_THREAD_NAME, 0, tid, ASCII(s)); }
static void h_name_thread_w(uint32_t tid, const wchar_t *s) { name_small(REC_THREAD_NAME, 0, tid, WIDE(s)); }

static void h_dmark_ex(const void *d, const nvtx_event_attributes *a) { mark(domain_id(d), a, attr_message(a)); }
static uint64_t h_dstart_ex(const void *d, const nvtx_event_attributes *a) {
    return start(domain_id(d), a, attr_message(a));
}
static void h_dend(const void *d, uint64_t id) { end(domain_id(d), id); }
static int h_dpush_ex(const void *d, const nvtx_event_attributes *a) { return push(domain_id(d), a, attr_message(a)); }
static int h_dpop(const void *d) { return pop(domain_id(d)); }
static void h_dname_category_a(const void *d, uint32_t c, const char *s) {
    name_small(REC_CATEGORY, domain_id(d), c, ASCII(s));
}
static void h_dname_category_w(const void *d, uint32_t c, const wchar_t *s) {
    name_small(REC_CATEGORY, domain_id(d), c, WIDE(s));
}

/* Registered strings live as long as the process (NVTX has no call to
 * release one); bounded so that a job registering strings in a loop cannot
 * grow without limit. */
#define MAX_STRING_BYTES (64u << 20)

static const void *register_string(const char *text, uint32_t len) {
    if (atomic_fetch_add_explicit(&g_string_bytes, len + 16u, memory_order_relaxed) > MAX_STRING_BYTES)
        return NULL;
    registered_string *s = malloc(sizeof *s + len + 1);
    if (!s)
        return NULL;
    s->magic = STRING_MAGIC;
    s->len = len;
    memcpy(s->text, text, len);
    s->text[len] = 0;
    return s;
}

static const void *h_dregister_a(const void *d, const char *s) {
    (void)d;
    return register_string(s ? s : "", msg_len(s));
}

static const void *h_dregister_w(const void *d, const wchar_t *s) {
    (void)d;
    char buf[MAX_MESSAGE];
    uint32_t len = wide_to_utf8(s, buf, MAX_MESSAGE);
    return register_string(buf, len);
}

static const void *create_domain(const char *name, uint32_t len) {
    domain *dom = malloc(sizeof *dom + len + 1);
    if (!dom)
        return NULL;
    dom->magic = DOMAIN_MAGIC;
    dom->id = atomic_fetch_add_explicit(&g_next_domain, 1, memory_order_relaxed);
    memcpy(dom->name, name, len);
    dom->name[len] = 0;
    thread_state *ts = enter();
    if (ts) {
        write_small(ts, REC_DOMAIN, dom->id, dom->id, name, len, now_ns());
        leave(ts);
    }
    return dom;
}

static const void *h_domain_create_a(const char *s) { return create_domain(s ? s : "", msg_len(s)); }

static const void *h_domain_create_w(const wchar_t *s) {
    char buf[MAX_MESSAGE];
    uint32_t len = wide_to_utf8(s, buf, MAX_MESSAGE);
    return create_domain(buf, len);
}

/* Handles may still be held by the job (or by NVTX's C++ wrappers in static
 * storage), so a destroyed domain is kept. */
static void h_domain_destroy(const void *d) { (void)d; }
static void h_initialize(const void *reserved) { (void)reserved; }

/* ---- Set-up ---- */

static void atfork_prepare(void) { pthread_mutex_lock(&g_lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&g_lock); }

static void atfork_child(void) {
    /* The child has one thread and copies of the parent's mappings: drop
     * the parent's instance lock and start a new generation, so that no
     * thread of the child writes into the parent's rings. Only
     * async-signal-safe calls here. */
    if (g_inst_fd >= 0) {
        close(g_inst_fd);
        g_inst_fd = -1;
        g_parent_nonce = g_nonce;
        g_parent_pid = (int32_t)getppid();
    }
    g_inst_failed = 0;
    g_nonce = make_nonce();
    if (t_state.ring)
        munmap(t_state.ring, RING_HEADER + RING_DATA);
    t_state.ring = NULL;
    t_state.data = NULL;
    atomic_fetch_add_explicit(&g_gen, 1, memory_order_release);
    pthread_mutex_unlock(&g_lock);
}

static void init_once(void) {
    const char *dir = getenv("GPUPROF_NVTX_DIR");
    if (!dir || !*dir || strlen(dir) >= sizeof g_dir)
        return;
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || access(dir, W_OK) != 0)
        return;
    strcpy(g_dir, dir);
    if (pthread_key_create(&g_key, thread_exit) != 0)
        return;
    if (pthread_atfork(atfork_prepare, atfork_parent, atfork_child) != 0)
        return;
    g_nonce = make_nonce();
    g_enabled = 1;
}

static void set(nvtx_fn **table, unsigned int size, unsigned int id, nvtx_fn fn) {
    if (id < size && table[id])
        *table[id] = fn;
}

#define F(f) ((nvtx_fn)(void (*)(void))(f))

/* Called by every NVTX instance of the process (each shared object that
 * includes the NVTX headers has its own) at its first NVTX call. Returns 0
 * (NVTX then turns itself into no-ops) when gpuprof is not recording. */
EXPORT int InitializeInjectionNvtx2(get_export_table_fn get_export_table) {
    pthread_once(&g_once, init_once);
    if (!g_enabled || !get_export_table)
        return 0;
    const export_table_callbacks *cb = get_export_table(NVTX_ETID_CALLBACKS);
    if (!cb || cb->struct_size < sizeof *cb || !cb->get_module_function_table)
        return 0;
    nvtx_fn **core = NULL, **core2 = NULL;
    unsigned int n_core = 0, n_core2 = 0;
    if (!cb->get_module_function_table(NVTX_CB_MODULE_CORE, &core, &n_core) || !core)
        return 0;
    set(core, n_core, CBID_CORE_MarkEx, F(h_mark_ex));
    set(core, n_core, CBID_CORE_MarkA, F(h_mark_a));
    set(core, n_core, CBID_CORE_MarkW, F(h_mark_w));
    set(core, n_core, CBID_CORE_RangeStartEx, F(h_start_ex));
    set(core, n_core, CBID_CORE_RangeStartA, F(h_start_a));
    set(core, n_core, CBID_CORE_RangeStartW, F(h_start_w));
    set(core, n_core, CBID_CORE_RangeEnd, F(h_end));
    set(core, n_core, CBID_CORE_RangePushEx, F(h_push_ex));
    set(core, n_core, CBID_CORE_RangePushA, F(h_push_a));
    set(core, n_core, CBID_CORE_RangePushW, F(h_push_w));
    set(core, n_core, CBID_CORE_RangePop, F(h_pop));
    set(core, n_core, CBID_CORE_NameCategoryA, F(h_name_category_a));
    set(core, n_core, CBID_CORE_NameCategoryW, F(h_name_category_w));
    set(core, n_core, CBID_CORE_NameOsThreadA, F(h_name_thread_a));
    set(core, n_core, CBID_CORE_NameOsThreadW, F(h_name_thread_w));
    if (cb->get_module_function_table(NVTX_CB_MODULE_CORE2, &core2, &n_core2) && core2) {
        set(core2, n_core2, CBID_CORE2_DomainMarkEx, F(h_dmark_ex));
        set(core2, n_core2, CBID_CORE2_DomainRangeStartEx, F(h_dstart_ex));
        set(core2, n_core2, CBID_CORE2_DomainRangeEnd, F(h_dend));
        set(core2, n_core2, CBID_CORE2_DomainRangePushEx, F(h_dpush_ex));
        set(core2, n_core2, CBID_CORE2_DomainRangePop, F(h_dpop));
        set(core2, n_core2, CBID_CORE2_DomainNameCategoryA, F(h_dname_category_a));
        set(core2, n_core2, CBID_CORE2_DomainNameCategoryW, F(h_dname_category_w));
        set(core2, n_core2, CBID_CORE2_DomainRegisterStringA, F(h_dregister_a));
        set(core2, n_core2, CBID_CORE2_DomainRegisterStringW, F(h_dregister_w));
        set(core2, n_core2, CBID_CORE2_DomainCreateA, F(h_domain_create_a));
        set(core2, n_core2, CBID_CORE2_DomainCreateW, F(h_domain_create_w));
        set(core2, n_core2, CBID_CORE2_DomainDestroy, F(h_domain_destroy));
        set(core2, n_core2, CBID_CORE2_Initialize, F(h_initialize));
    }
    const export_table_version_info *vi = get_export_table(NVTX_ETID_VERSIONINFO);
    if (vi && vi->struct_size >= sizeof *vi && vi->set_injection_nvtx_version)
        vi->set_injection_nvtx_version(NVTX_VERSION);
    return 1;
}
