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
pub mod loss;
pub mod memory;
pub mod nvtx;
pub mod others;
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
/// One thread may [`listen`](TreeNews::listen) for process news: it is
/// unparked on each, so it can sleep long without news instead of polling
/// the counter (each wake-up is CPU taken from the job on a busy machine).
#[derive(Debug, Default)]
pub struct TreeNews {
    processes: std::sync::atomic::AtomicU64,
    pub mappings: std::sync::atomic::AtomicU64,
    listener: std::sync::Mutex<Option<std::thread::Thread>>,
}

impl TreeNews {
    /// A process was created or exec'd: count it and wake the listener.
    pub fn new_process(&self) {
        self.processes
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        self.wake_listener();
    }

    /// Wake the listener without news of a process: something it waits
    /// for happened (the in-process agent spoke of a process).
    pub fn wake_listener(&self) {
        if let Some(t) = self
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            t.unpark();
        }
    }

    /// Be unparked on every later [`new_process`](TreeNews::new_process).
    pub fn listen(&self) {
        *self.listener.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current());
    }

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

#[cfg(test)]
mod tests {
    use super::{NewsMark, TreeNews};

    #[test]
    fn process_news_wakes_the_listener() {
        use std::sync::Arc;
        use std::time::{Duration, Instant};
        let news = Arc::new(TreeNews::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let n2 = news.clone();
        let t = std::thread::spawn(move || {
            n2.listen();
            tx.send(()).unwrap();
            let t0 = Instant::now();
            while n2.processes() == 0 && t0.elapsed() < Duration::from_secs(30) {
                std::thread::park_timeout(Duration::from_secs(30));
            }
            t0.elapsed()
        });
        rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        news.new_process();
        let waited = t.join().unwrap();
        assert_eq!(news.processes(), 1);
        assert!(waited < Duration::from_secs(10), "not woken: {waited:?}");
    }
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

thread_local! {
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run code of another crate that may panic on what it reads of another
/// process (py-spy misjudging an interpreter's state mid-change): a panic
/// is `None`, and its message is not printed. The job's stderr is
/// gpuprof's, and a caught panic is no error of the job's: "attempt to add
/// with overflow" with a backtrace once reached a job's stderr from a
/// py-spy attach that failed harmlessly.
pub(crate) fn quietly<R>(f: impl FnOnce() -> R) -> Option<R> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(|q| q.get()) {
                prev(info)
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    r.ok()
}

#[cfg(test)]
mod quiet_tests {
    /// A panic is None and the thread goes on; a later panic outside is
    /// not quiet (the flag is restored).
    #[test]
    fn a_panic_run_quietly_is_none() {
        assert_eq!(super::quietly(|| 1), Some(1));
        assert_eq!(super::quietly(|| -> i32 { panic!("py-spy misread") }), None);
        assert!(!super::QUIET.with(|q| q.get()));
    }
}
