/* A thread that blocks first near the top of its stack, then ~21 KiB
   below it (tests/stacks.rs): the wall-clock sampler sizes its stack
   copies by how deep the earlier ones were unwound, and must copy the
   deep stack again whole rather than cut it short. */
#include <poll.h>
#include <stdio.h>
#include <string.h>

__attribute__((noinline)) static void block_for(int ms) { poll(NULL, 0, ms); }

/* 21 frames of ~1 KiB each: n, n-1, ..., 0. */
__attribute__((noinline)) static int deep_frame(int n, int ms) {
    volatile char pad[1024];
    memset((char *)pad, n, sizeof pad);
    if (n == 0) {
        block_for(ms);
        return pad[5];
    }
    return deep_frame(n - 1, ms) + pad[7];
}

__attribute__((noinline)) static void shallow_phase(void) {
    for (int i = 0; i < 100; i++) block_for(10);
}

__attribute__((noinline)) static void deep_phase(void) {
    for (int i = 0; i < 100; i++) deep_frame(20, 10);
}

int main(void) {
    shallow_phase();
    deep_phase();
    puts("done");
    return 0;
}
