/* A shared-memory ring of variable-size records, written by the threads of
 * one process (any of them, from signal handlers too) and read by gpuprof.
 *
 * Lock-free, async-signal-safe, bounded and never blocking: a writer that
 * finds the ring full drops its record and counts it. If gpuprof is gone
 * the ring fills up and the job runs on unharmed. The file lives on tmpfs
 * and is fully allocated when it is created (fallocate), so a write into
 * the mapping can never fault for lack of space (SIGBUS).
 *
 * Layout (the Rust side, src/collect/perf/pyagent.rs, reads the same):
 *   [0, 4096)          struct gp_ring_header
 *   [4096, 4096+cap)   records, each 8-byte aligned, never wrapping
 * A record starts with a 64-bit word: size (bytes, low 32 bits, header
 * included) | type << 32 | flags << 48. 0 means "not written yet". Writers
 * reserve space by moving `head` forward (CAS), mark the reservation
 * pending, fill it and publish the final word with a release store. The
 * reader consumes committed records in order, zeroes what it consumed and
 * moves `tail` forward (release), which is what lets writers reuse it.
 * A record that would cross the end is preceded by a PAD record. */
#ifndef GPUPROF_AGENT_RING_H
#define GPUPROF_AGENT_RING_H

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define GP_RING_MAGIC 0x31474e5246525047ULL /* "GPRFRNG1" */
#define GP_RING_VERSION 1u
#define GP_RING_HEADER_BYTES 4096u

#define GP_REC_PAD 1u
/* Reserved and being written; word0 carries the reserved size. */
#define GP_REC_PENDING 0xffffu

struct gp_ring_header {
    uint64_t magic;
    uint32_t version;
    uint32_t header_bytes;
    uint64_t capacity; /* data bytes, a power of two */
    uint32_t pid;      /* the process that created the ring */
    uint32_t reserved0;
    uint8_t pad0[32];
    _Atomic uint64_t head; /* next byte to reserve (writers) */
    uint8_t pad1[56];
    _Atomic uint64_t tail; /* next byte to read (reader) */
    uint8_t pad2[56];
    _Atomic uint64_t dropped_records;
    _Atomic uint64_t dropped_bytes;
};

_Static_assert(sizeof(struct gp_ring_header) <= GP_RING_HEADER_BYTES, "ring header fits its page");

struct gp_ring {
    struct gp_ring_header *hdr;
    uint8_t *data;
    uint64_t mask;
};

/* Map the ring file `fd` of `capacity` data bytes (a power of two). The
 * caller creates the file; this allocates it fully and initialises it.
 * Returns 0, or an errno value.
 *
 * The kernel's calls, not posix_fallocate() and mmap(): the agent makes
 * a process's ring in its signal handler, at the first sample (made
 * earlier, every process and forked child would pay for a ring it may
 * never fill: ~3.5 ms each on a VM, 200 short forks 2.5 times slower),
 * where only async-signal-safe work may be done. Neither function is on
 * POSIX's list; glibc's posix_fallocate writes the file itself where the
 * call is refused, and its mmap is the bare system call, so calling the
 * kernel directly keeps the C library out of the handler altogether. */
static inline int gp_ring_create(struct gp_ring *r, int fd, uint64_t capacity, uint32_t pid)
{
    uint64_t total = GP_RING_HEADER_BYTES + capacity;
    if (syscall(SYS_fallocate, fd, 0, (off_t)0, (off_t)total))
        return errno;
    /* Populated now, once: else the first write to each page of the ring
     * faults, inside the sampling signal handler, for the ring's whole
     * first pass (the pages are allocated but not yet mapped). */
    long m = syscall(SYS_mmap, NULL, (size_t)total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                     (off_t)0);
    if (m == -1)
        return errno;
    r->hdr = (struct gp_ring_header *)(uintptr_t)m;
    r->data = (uint8_t *)(uintptr_t)m + GP_RING_HEADER_BYTES;
    r->mask = capacity - 1;
    r->hdr->version = GP_RING_VERSION;
    r->hdr->header_bytes = GP_RING_HEADER_BYTES;
    r->hdr->capacity = capacity;
    r->hdr->pid = pid;
    atomic_store_explicit(&r->hdr->head, 0, memory_order_relaxed);
    atomic_store_explicit(&r->hdr->tail, 0, memory_order_relaxed);
    /* The magic last: the reader ignores a ring until it is set. */
    atomic_thread_fence(memory_order_release);
    *(volatile uint64_t *)&r->hdr->magic = GP_RING_MAGIC;
    return 0;
}

static inline _Atomic uint64_t *gp_ring_word(const struct gp_ring *r, uint64_t pos)
{
    return (_Atomic uint64_t *)(r->data + (pos & r->mask));
}

static inline uint64_t gp_word(uint32_t size, uint32_t type, uint32_t flags)
{
    return (uint64_t)size | ((uint64_t)(type & 0xffff) << 32) | ((uint64_t)(flags & 0xffff) << 48);
}

/* Reserve `size` bytes (a multiple of 8, at least 16). Returns the record's
 * position, or UINT64_MAX when the ring is full (counted as dropped). */
static inline uint64_t gp_ring_reserve(struct gp_ring *r, uint32_t size)
{
    struct gp_ring_header *h = r->hdr;
    uint64_t cap = r->mask + 1;
    if (size > cap / 2) {
        atomic_fetch_add_explicit(&h->dropped_records, 1, memory_order_relaxed);
        return UINT64_MAX;
    }
    uint64_t head = atomic_load_explicit(&h->head, memory_order_relaxed);
    for (;;) {
        uint64_t tail = atomic_load_explicit(&h->tail, memory_order_acquire);
        uint64_t idx = head & r->mask;
        uint64_t pad = idx + size > cap ? cap - idx : 0;
        if (head + pad + size - tail > cap) {
            atomic_fetch_add_explicit(&h->dropped_records, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&h->dropped_bytes, size, memory_order_relaxed);
            return UINT64_MAX;
        }
        if (atomic_compare_exchange_weak_explicit(&h->head, &head, head + pad + size,
                                                  memory_order_acq_rel, memory_order_relaxed)) {
            if (pad)
                atomic_store_explicit(gp_ring_word(r, head), gp_word((uint32_t)pad, GP_REC_PAD, 0),
                                      memory_order_release);
            uint64_t pos = head + pad;
            atomic_store_explicit(gp_ring_word(r, pos), gp_word(size, GP_REC_PENDING, 0),
                                  memory_order_relaxed);
            return pos;
        }
    }
}

static inline void *gp_ring_at(const struct gp_ring *r, uint64_t pos)
{
    return r->data + (pos & r->mask);
}

/* Publish the record reserved at `pos` with `reserved` bytes, of which the
 * first `used` (a multiple of 8, at least 16) hold it. The rest goes back
 * to the ring when no one reserved after it, else it becomes padding: a
 * writer that used it as scratch must zero it again first (0 is "not
 * written yet" to the reader). */
static inline void gp_ring_commit(struct gp_ring *r, uint64_t pos, uint32_t reserved, uint32_t used,
                                  uint32_t type, uint32_t flags)
{
    if (used < reserved) {
        uint64_t end = pos + reserved;
        if (!atomic_compare_exchange_strong_explicit(&r->hdr->head, &end, pos + used,
                                                     memory_order_acq_rel, memory_order_relaxed))
            atomic_store_explicit(gp_ring_word(r, pos + used),
                                  gp_word(reserved - used, GP_REC_PAD, 0), memory_order_release);
    }
    atomic_store_explicit(gp_ring_word(r, pos), gp_word(used, type, flags), memory_order_release);
}

#endif
