/* Writes records into a ring of src/agent/ring.h from several threads at
 * once, as the agent's signal handlers do, for tests/pystacks.rs to check
 * with gpuprof's reader: every record arrives whole and in each thread's
 * order, or is counted as dropped.
 *
 *   ring_stress DIR THREADS RECORDS RING_BYTES
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ring.h"

/* struct rec_sample in src/agent/pystacks.c (pyagent.rs reads it). */
#define HDR 80

static struct gp_ring ring;
static int records;

static void *writer(void *arg)
{
    uint64_t t = (uint64_t)(uintptr_t)arg;
    uint32_t seed = (uint32_t)t * 2654435761u + 1;
    for (int seq = 0; seq < records; seq++) {
        seed = seed * 1103515245u + 12345u;
        uint32_t len = (seed >> 8) % 4096;
        uint32_t reserve = HDR + 4096;
        uint64_t pos = gp_ring_reserve(&ring, reserve);
        if (pos == UINT64_MAX) {
            if (seq % 64 == 0) {
                struct timespec ts = {0, 200000};
                nanosleep(&ts, NULL);
            }
            continue;
        }
        uint8_t *r = gp_ring_at(&ring, pos);
        uint32_t pid = (uint32_t)getpid(), tid = (uint32_t)t;
        memcpy(r + 8, &pid, 4);
        memcpy(r + 12, &tid, 4);
        uint64_t v[5] = {(uint64_t)seq, t, (uint64_t)seq, 0, 0};
        memcpy(r + 16, v, sizeof v);
        uint32_t tail[4] = {0, 0, len, 0};
        memcpy(r + 56, tail, sizeof tail);
        uint64_t cpu_ns = 0;
        memcpy(r + 72, &cpu_ns, 8);
        for (uint32_t i = 0; i < len; i++)
            r[HDR + i] = (uint8_t)(t * 31 + (uint64_t)seq + i);
        gp_ring_commit(&ring, pos, reserve, HDR + ((len + 7) & ~7u), 3, 0);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5)
        return 2;
    int threads = atoi(argv[2]);
    records = atoi(argv[3]);
    char path[512];
    snprintf(path, sizeof path, "%s/%d-1.ring", argv[1], (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || gp_ring_create(&ring, fd, strtoull(argv[4], NULL, 10), (uint32_t)getpid()))
        return 3;
    pthread_t th[64];
    for (int i = 0; i < threads && i < 64; i++)
        pthread_create(&th[i], NULL, writer, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < threads && i < 64; i++)
        pthread_join(th[i], NULL);
    printf("%llu\n", (unsigned long long)atomic_load(&ring.hdr->dropped_records));
    return 0;
}
