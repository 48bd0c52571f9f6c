//! The perf records that the ring reader decodes and the unwinder, the
//! agent reader and the wall-clock sampler all take: kept apart from the
//! ring so that those files need not import the reader that imports them.

use crate::event::{MonoNs, Pid, Tid};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub pid: Pid,
    pub tid: Tid,
    pub t: MonoNs,
    /// The user registers of [`REGS_MASK`](super::ring::REGS_MASK) in index order ([bp, sp, ip] on
    /// x86_64); `None` when the sample has none (ABI "none").
    pub regs: Option<[u64; 4]>,
    pub ip: u64,
    pub stack: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mmap2 {
    pub pid: Pid,
    pub tid: Tid,
    pub t: MonoNs,
    pub addr: u64,
    pub len: u64,
    pub pgoff: u64,
    pub prot: u32,
    pub path: String,
}
