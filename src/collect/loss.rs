//! gpuprof's own resource failures while collecting: a read that failed
//! because gpuprof ran out of file descriptors or memory lost data that was
//! there to be read. Collectors note such errors here (a process that
//! exited meanwhile is not a loss and is not noted); the session turns the
//! counts into one coverage entry, and the analysis marks the profile
//! incomplete with it, so that a figure missing for this reason is never
//! read as "the process did nothing".

use std::sync::atomic::{AtomicU64, Ordering};

use crate::event::Coverage;

static DESCRIPTORS: AtomicU64 = AtomicU64::new(0);
static MEMORY: AtomicU64 = AtomicU64::new(0);
static FIRST: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Note `e` if it is gpuprof's own lack of descriptors or memory; `what`
/// names the read that failed. Returns whether it was.
pub fn note(e: &std::io::Error, what: &str) -> bool {
    let counter = match e.raw_os_error() {
        Some(libc::EMFILE) | Some(libc::ENFILE) => &DESCRIPTORS,
        Some(libc::ENOMEM) => &MEMORY,
        _ => return false,
    };
    if counter.fetch_add(1, Ordering::Relaxed) == 0 {
        let mut first = FIRST.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(format!("{what}: {e}"));
        }
    }
    true
}

/// [`note`] for an error that may wrap an `io::Error` (procfs, py-spy).
pub fn note_any(e: &(dyn std::error::Error + 'static), what: &str) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return note(io, what);
        }
        cur = c.source();
    }
    false
}

/// The losses so far as a coverage entry, or None when there were none.
pub fn coverage() -> Option<Coverage> {
    let fds = DESCRIPTORS.load(Ordering::Relaxed);
    let mem = MEMORY.load(Ordering::Relaxed);
    let limited = crate::collect::memory::losses();
    if fds == 0 && mem == 0 && limited.is_empty() {
        return None;
    }
    let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or("unknown".to_string(), |(soft, _)| soft.to_string());
    let mut parts = Vec::new();
    if fds > 0 {
        parts.push(format!(
            "{fds} read(s) failed for lack of file descriptors (gpuprof's limit: {limit}; raise it with `ulimit -n`)"
        ));
    }
    if mem > 0 {
        parts.push(format!("{mem} read(s) failed for lack of memory"));
    }
    parts.extend(limited);
    let first = FIRST
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .map(|f| format!("; first failed read: {f}"))
        .unwrap_or_default();
    Some(Coverage {
        source: crate::vocab::coverage::RESOURCES.into(),
        available: false,
        detail: format!(
            "gpuprof lost data it was there to read: {}{first}. Figures of some processes or threads are missing for part of the run, so a low or zero figure may be a loss, not the job's",
            parts.join("; ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_gpuprofs_own_shortage_counts() {
        let gone = std::io::Error::from_raw_os_error(libc::ESRCH);
        assert!(!note(&gone, "a process that exited"));
        let wrapped = anyhow::Error::new(std::io::Error::from_raw_os_error(libc::ENOENT));
        assert!(!note_any(wrapped.as_ref(), "a file that is gone"));
        let fds = std::io::Error::from_raw_os_error(libc::EMFILE);
        assert!(note(&fds, "/proc/1/stat"));
        let c = coverage().expect("a loss");
        assert!(!c.available);
        assert!(c.detail.contains("file descriptors"), "{}", c.detail);
        assert!(c.detail.contains("/proc/1/stat"), "{}", c.detail);
    }
}
