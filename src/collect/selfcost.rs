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

use std::collections::BTreeMap;
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
            start_ns: super::thread_cpu_ns().unwrap_or(0),
        }
    }

    /// Put the thread's CPU time so far in the table (call on the thread
    /// that made the charge).
    pub fn update(&self) {
        let Some(now) = super::thread_cpu_ns() else {
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

/// CPU ns per component, every thread of it summed.
pub fn by_component() -> BTreeMap<String, u64> {
    let t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for ((c, _), ns) in t.iter() {
        *out.entry((*c).to_string()).or_default() += ns;
    }
    out
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
