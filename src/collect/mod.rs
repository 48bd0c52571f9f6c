//! Collectors: each turns one OS source into timestamped [`Event`]s sent
//! to a [`Sink`]. None of them knows about exporters.
//!
//! [`Event`]: crate::event::Event
//! [`Sink`]: crate::record::Sink

pub mod cgroup;
pub mod clock;
pub mod files;
pub mod gpu;
pub mod intern;
pub mod nvtx;
pub mod perf;
pub mod procfs;
pub mod python;
pub mod stacks;
pub mod system;

/// CPU time the calling thread has used, in ns (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write into.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}
