//! Small deterministic hashing, shared by the samplers (jitter) and the
//! analysis (sample picks).

/// A well-mixed 64-bit hash of `x`: deterministic draws (sample picks,
/// sampler jitter) without a random-number crate.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
