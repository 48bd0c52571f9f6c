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

/// What the perf reader learns as it happens, for the collectors that would
/// otherwise poll /proc for it: counters bumped on every new process or
/// exec (`processes`) and every new executable mapping, i.e. a library
/// loaded (`mappings`). A collector re-reads when a counter moved, and
/// still now and then without news (a process perf does not follow).
#[derive(Debug, Default)]
pub struct TreeNews {
    pub processes: std::sync::atomic::AtomicU64,
    pub mappings: std::sync::atomic::AtomicU64,
}

impl TreeNews {
    pub fn processes(&self) -> u64 {
        self.processes.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn mappings(&self) -> u64 {
        self.mappings.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// When a collector last re-read what [`TreeNews`] counts, and the count
/// then.
#[derive(Clone, Copy, Debug, Default)]
pub struct NewsMark(Option<(std::time::Instant, u64)>);

impl NewsMark {
    /// Whether to read again: `count` moved since the mark, `every` has
    /// passed, or there is no news to go by (no count, or never read).
    pub fn due(
        &self,
        count: Option<u64>,
        now: std::time::Instant,
        every: std::time::Duration,
    ) -> bool {
        match (count, self.0) {
            (Some(c), Some((at, c0))) => c != c0 || now.duration_since(at) >= every,
            _ => true,
        }
    }

    /// Read at `now`, with `count` read before.
    pub fn set(&mut self, count: Option<u64>, now: std::time::Instant) {
        self.0 = count.map(|c| (now, c));
    }
}

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

#[cfg(test)]
mod tests {
    use super::NewsMark;
    use std::time::{Duration, Instant};

    #[test]
    fn news_mark_is_due_on_news_after_a_while_or_without_news() {
        let (t0, every) = (Instant::now(), Duration::from_secs(1));
        let mut m = NewsMark::default();
        assert!(m.due(Some(3), t0, every), "never read");
        m.set(Some(3), t0);
        assert!(!m.due(Some(3), t0 + every / 2, every));
        assert!(m.due(Some(4), t0 + every / 2, every), "news");
        assert!(m.due(Some(3), t0 + every, every), "safety net");
        assert!(m.due(None, t0, every), "no news to go by");
    }
}
