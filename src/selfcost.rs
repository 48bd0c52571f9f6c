//! gpuprof's own CPU time per component (the perf reader, the Python
//! sampler, the /proc sampler, the GPU poller, the recording writer, ...),
//! for `report.json` → `profiler.cpu_s_by_component`: the whole process's
//! figure says that gpuprof cost something, this says which part, so a
//! regression in one collector is seen.
//!
//! Each component's thread holds a [`Charge`] from its start: its CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`) is put in the table when the charge is
//! dropped, or earlier with [`Charge::update`] for a thread that outlives
//! the moment the figures are read (the writer).
//!
//! Below the collectors and the recording writer (both charge to it), and
//! below `session` and `live`, which read the whole process's usage.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// (component, thread id) → CPU ns of that thread so far.
static TABLE: Mutex<BTreeMap<(&'static str, i32), u64>> = Mutex::new(BTreeMap::new());

/// The calling thread's CPU time is charged to `component`.
pub struct Charge {
    component: &'static str,
    tid: i32,
    start_ns: u64,
}

impl Charge {
    pub fn new(component: &'static str) -> Charge {
        Charge {
            component,
            tid: nix::unistd::gettid().as_raw(),
            start_ns: thread_cpu_ns().unwrap_or(0),
        }
    }

    /// Put the thread's CPU time so far in the table (call on the thread
    /// that made the charge).
    pub fn update(&self) {
        let Some(now) = thread_cpu_ns() else {
            return;
        };
        let mut t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
        t.insert(
            (self.component, self.tid),
            now.saturating_sub(self.start_ns),
        );
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.update();
    }
}

/// (component, part, CPU ns of the part so far): work done on a
/// component's thread that is shown on its own (the wall-clock sampler on
/// the perf reader's thread). One counter per part, for the life of the
/// process.
type Part = (&'static str, &'static str, &'static AtomicU64);
static PARTS: Mutex<Vec<Part>> = Mutex::new(Vec::new());

/// The counter of `part` of `component`'s threads: its owner stores the
/// CPU it has used so far (timed with `CLOCK_THREAD_CPUTIME_ID`) in it, an
/// atomic store at each update (the wall-clock sampler updates it at
/// every tick); [`by_component`] shows it on its own and takes it out of
/// `component`'s figure.
pub fn part(component: &'static str, part: &'static str) -> &'static AtomicU64 {
    let mut p = PARTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, _, n)) = p.iter().find(|(c, q, _)| *c == component && *q == part) {
        return n;
    }
    let n: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
    p.push((component, part, n));
    n
}

/// CPU ns per component, every thread of it summed, parts on their own.
pub fn by_component() -> BTreeMap<String, u64> {
    let t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for ((c, _), ns) in t.iter() {
        *out.entry((*c).to_string()).or_default() += ns;
    }
    let parts = PARTS.lock().unwrap_or_else(|e| e.into_inner());
    for (c, part, ns) in parts.iter() {
        // Only where the component's own figure is in: else the part is
        // all there is of it.
        if let Some(whole) = out.get_mut(*c) {
            let ns = ns.load(Ordering::Relaxed).min(*whole);
            *whole -= ns;
            *out.entry((*part).to_string()).or_default() += ns;
        }
    }
    out
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

/// gpuprof's own CPU time and peak RSS so far, to report its overhead.
pub fn self_usage() -> (u64, u64) {
    match nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let tv = |t: nix::sys::time::TimeVal| {
                t.tv_sec() as u64 * 1_000_000_000 + t.tv_usec() as u64 * 1000
            };
            (
                tv(u.user_time()) + tv(u.system_time()),
                u.max_rss() as u64 * 1024,
            )
        }
        Err(_) => (0, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threads_cpu_is_charged_to_its_component() {
        std::thread::spawn(|| {
            let _c = Charge::new("test burner");
            let start = std::time::Instant::now();
            let mut x = 0u64;
            while start.elapsed() < std::time::Duration::from_millis(30) {
                x = x.wrapping_mul(31).wrapping_add(7);
            }
            std::hint::black_box(x);
        })
        .join()
        .unwrap();
        let ns = by_component()["test burner"];
        // Busy for 30 ms of wall time: some CPU, and never more than that
        // plus scheduling slack.
        assert!(ns > 0 && ns < 1_000_000_000, "{ns}");
    }
}
