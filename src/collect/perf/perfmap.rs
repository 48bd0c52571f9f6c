//! JIT code named in `/tmp/perf-<pid>.map`, and the unwind rule of
//! CPython's perf trampolines.
//!
//! With `PYTHONPERFSUPPORT=1` or `-X perf` (Python 3.12+), CPython calls
//! every Python function through a trampoline of its own: a copy of one
//! small template (`Python/asm_trampoline.S`) in anonymous executable
//! memory, which has no unwind information. CPython appends one line per
//! trampoline to `/tmp/perf-<pid>.map` — `ADDR SIZE py::qualname:filename` —
//! and flushes it before the trampoline first runs. The map is read
//! incrementally as samples land in code it does not name yet, so names are
//! taken while the process (and its file) still exist. A forked child keeps
//! its parent's trampolines (the frames that were running at the fork) and
//! writes a map of its own for new ones: its lookup chain is its own map,
//! then its parent's, and so on.
//!
//! The map is appended to, never truncated: a file left by an earlier
//! process with the same pid is skipped when it was last written before
//! this process started, and later lines win over earlier ones for the same
//! address.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::event::{MonoNs, Pid};

/// At most this many entries are kept per map (~100 bytes each): a job
/// that compiles code without end (exec in a loop) cannot grow the
/// profiler's memory without bound. Later entries are not named.
pub const MAX_ENTRIES: usize = 500_000;
/// Bytes read from a map in one refresh.
const MAX_READ: u64 = 4 << 20;
/// A missing map file is looked for again after this long.
const MISSING_RETRY_NS: u64 = 100_000_000;

/// One entry: code at `[start, start + size)` named `name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JitEntry {
    pub start: u64,
    pub size: u64,
    pub name: Arc<str>,
}

impl JitEntry {
    /// A CPython perf trampoline (its name starts with `py::`).
    pub fn is_python_trampoline(&self) -> bool {
        self.name.starts_with("py::")
    }
}

/// The path of a process's perf map.
pub fn map_path(pid: Pid) -> String {
    format!("/tmp/perf-{}.map", pid.0)
}

/// The entries of one process's perf map read so far.
#[derive(Debug)]
pub struct PerfMap {
    pub path: String,
    /// Bytes of the file consumed (whole lines only).
    read: u64,
    /// start → (end, name)
    entries: BTreeMap<u64, (u64, Arc<str>)>,
    /// The process started at this wall-clock time: a file last written
    /// before it belongs to an earlier process with the same pid.
    started: Option<SystemTime>,
    /// The start check was done (on the first successful open).
    checked_start: bool,
    /// Sample generation of the last refresh (at most one per sample).
    refreshed_gen: u64,
    /// When the file was last found missing (sample time).
    missing_at: Option<MonoNs>,
    /// Entries not kept because of [`MAX_ENTRIES`].
    pub dropped: u64,
}

/// A shared handle: a forked child holds its ancestors' maps.
pub type SharedMap = Rc<RefCell<PerfMap>>;

impl PerfMap {
    pub fn new(path: String, started: Option<SystemTime>) -> PerfMap {
        PerfMap {
            path,
            read: 0,
            entries: BTreeMap::new(),
            started,
            checked_start: false,
            refreshed_gen: u64::MAX,
            missing_at: None,
            dropped: 0,
        }
    }

    pub fn shared(path: String, started: Option<SystemTime>) -> SharedMap {
        Rc::new(RefCell::new(PerfMap::new(path, started)))
    }

    /// The entry holding `addr`.
    pub fn lookup(&self, addr: u64) -> Option<JitEntry> {
        let (start, (end, name)) = self.entries.range(..=addr).next_back()?;
        (addr < *end).then(|| JitEntry {
            start: *start,
            size: end - start,
            name: name.clone(),
        })
    }

    /// Read what was appended since the last call, at most once per sample
    /// generation `gen`. `now` is the sample's time (for retrying a missing
    /// file). Returns whether new entries were read.
    pub fn refresh(&mut self, gen: u64, now: MonoNs) -> bool {
        if self.refreshed_gen == gen {
            return false;
        }
        self.refreshed_gen = gen;
        if let Some(m) = self.missing_at {
            if now.0.saturating_sub(m.0) < MISSING_RETRY_NS {
                return false;
            }
        }
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            self.missing_at = Some(now);
            return false;
        };
        self.missing_at = None;
        let Ok(md) = f.metadata() else {
            return false;
        };
        if !self.checked_start {
            self.checked_start = true;
            if let (Some(started), Ok(mtime)) = (self.started, md.modified()) {
                if mtime < started {
                    // Left by an earlier process with this pid: what it
                    // wrote names nothing here.
                    self.read = md.len();
                }
            }
        }
        if md.len() <= self.read {
            return false;
        }
        if f.seek(SeekFrom::Start(self.read)).is_err() {
            return false;
        }
        let mut buf = Vec::new();
        if f.take(MAX_READ).read_to_end(&mut buf).is_err() {
            return false;
        }
        let Some(last_nl) = buf.iter().rposition(|b| *b == b'\n') else {
            return false;
        };
        self.read += last_nl as u64 + 1;
        let before = self.entries.len();
        for line in buf[..last_nl].split(|b| *b == b'\n') {
            if let Some((start, size, name)) = parse_line(line) {
                self.insert(start, size, name);
            }
        }
        self.entries.len() != before
    }

    fn insert(&mut self, start: u64, size: u64, name: &str) {
        let end = start.saturating_add(size.max(1));
        // A later entry replaces whatever it overlaps.
        let overlapping: Vec<u64> = self
            .entries
            .range(..end)
            .rev()
            .take_while(|(_, (e, _))| *e > start)
            .map(|(s, _)| *s)
            .collect();
        for s in overlapping {
            self.entries.remove(&s);
        }
        if self.entries.len() >= MAX_ENTRIES {
            self.dropped += 1;
            return;
        }
        self.entries.insert(start, (end, Arc::from(name)));
    }
}

/// `ADDR SIZE NAME` (hex address and size, the name to the end of line).
fn parse_line(line: &[u8]) -> Option<(u64, u64, &str)> {
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let (addr, rest) = line.split_once(' ')?;
    let (size, name) = rest.trim_start().split_once(' ')?;
    let addr = u64::from_str_radix(addr.trim_start_matches("0x"), 16).ok()?;
    let size = u64::from_str_radix(size.trim_start_matches("0x"), 16).ok()?;
    let name = name.trim();
    (!name.is_empty() && size > 0).then_some((addr, size, name))
}

/// The wall-clock time of a CLOCK_MONOTONIC instant in the past.
pub fn wall_time_of(t: MonoNs) -> SystemTime {
    let ago = MonoNs::now().0.saturating_sub(t.0);
    SystemTime::now() - Duration::from_nanos(ago)
}

/// How to step out of a frame whose instruction lies in a CPython perf
/// trampoline: the return address is at `sp + ra_offset`, the caller's
/// stack pointer is just above it, and no other register changes.
///
/// x86-64 template (3.12, 3.13 and later):
/// `[endbr64] sub $8,%rsp; call *%rcx; add $8,%rsp; ret` (11 bytes, 15 with
/// `endbr64`). Inside the call (every frame but a leaf) the return address
/// is at `sp + 8`. A sample that lands on the trampoline's own first
/// instructions (before the `sub` took effect) or on its `ret` finds it at
/// `sp`.
///
/// On aarch64 the template saves a frame record (`stp x29, x30, [sp,
/// -16]!; mov x29, sp`), which the unwinder's frame-pointer fallback already
/// follows.
#[cfg(target_arch = "x86_64")]
pub fn trampoline_ra_offset(offset_in_trampoline: u64, size: u64, leaf: bool) -> u64 {
    const TEMPLATE: u64 = 11;
    if !leaf {
        return 8;
    }
    // Bytes of `endbr64` (or other prefix) before the `sub`.
    let prefix = size.saturating_sub(TEMPLATE);
    if offset_in_trampoline < prefix + 4 || offset_in_trampoline + 1 >= size {
        0
    } else {
        8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp_map(name: &str, text: &str) -> String {
        let p = std::env::temp_dir().join(format!("gpuprof-perfmap-{}-{name}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    }

    #[test]
    fn reads_whole_lines_incrementally() {
        let path = tmp_map(
            "incr",
            "7f00 b py::f:/x/a.py\n7f0b b py::Outer.g:/x/a.py\n7f16 b py::h:/x",
        );
        let mut m = PerfMap::new(path.clone(), None);
        assert!(m.refresh(1, MonoNs(0)));
        assert_eq!(&*m.lookup(0x7f05).unwrap().name, "py::f:/x/a.py");
        let g = m.lookup(0x7f0b).unwrap();
        assert_eq!((g.start, g.size), (0x7f0b, 11));
        // The last line is not finished yet.
        assert!(m.lookup(0x7f16).is_none());
        // Once per generation.
        std::fs::write(
            &path,
            "7f00 b py::f:/x/a.py\n7f0b b py::Outer.g:/x/a.py\n7f16 b py::h:/x/b.py\n",
        )
        .unwrap();
        assert!(!m.refresh(1, MonoNs(0)));
        assert!(m.refresh(2, MonoNs(0)));
        assert_eq!(&*m.lookup(0x7f20).unwrap().name, "py::h:/x/b.py");
        assert!(m.lookup(0x7f21).is_none());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn later_entries_win_and_stale_files_are_skipped() {
        let path = tmp_map("stale", "1000 10 py::old:/x.py\n1000 b py::new:/x.py\n");
        let mut m = PerfMap::new(path.clone(), None);
        m.refresh(1, MonoNs(0));
        assert_eq!(&*m.lookup(0x1005).unwrap().name, "py::new:/x.py");
        assert!(m.lookup(0x100c).is_none());
        // A process that started after the file was last written.
        let later = SystemTime::now() + Duration::from_secs(5);
        let mut m = PerfMap::new(path.clone(), Some(later));
        m.refresh(1, MonoNs(0));
        assert!(m.lookup(0x1005).is_none());
        std::fs::write(
            &path,
            "1000 10 py::old:/x.py\n1000 b py::new:/x.py\n2000 b py::mine:/y.py\n",
        )
        .unwrap();
        m.refresh(2, MonoNs(0));
        assert_eq!(&*m.lookup(0x2000).unwrap().name, "py::mine:/y.py");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn missing_files_are_retried_later() {
        let mut m = PerfMap::new("/nonexistent/perf-1.map".into(), None);
        assert!(!m.refresh(1, MonoNs(0)));
        assert_eq!(m.missing_at, Some(MonoNs(0)));
        m.refresh(2, MonoNs(50_000_000));
        assert_eq!(m.missing_at, Some(MonoNs(0)), "not retried within 100 ms");
        m.refresh(3, MonoNs(200_000_000));
        assert_eq!(m.missing_at, Some(MonoNs(200_000_000)));
    }

    #[test]
    fn malformed_lines_are_ignored() {
        assert_eq!(parse_line(b"zz 1 f"), None);
        assert_eq!(parse_line(b"10 0 f"), None);
        assert_eq!(parse_line(b"10 4"), None);
        assert_eq!(
            parse_line(b"0x10 4 name with spaces"),
            Some((0x10, 4, "name with spaces"))
        );
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn trampoline_rule_follows_the_template() {
        // Inside the call: always sp + 8.
        assert_eq!(trampoline_ra_offset(5, 11, false), 8);
        // A leaf on `sub` (offset 0), `call` (4), `add` (6), `ret` (10).
        assert_eq!(trampoline_ra_offset(0, 11, true), 0);
        assert_eq!(trampoline_ra_offset(4, 11, true), 8);
        assert_eq!(trampoline_ra_offset(6, 11, true), 8);
        assert_eq!(trampoline_ra_offset(10, 11, true), 0);
        // With endbr64 in front: `sub` at 4, `call` at 8, `ret` at 14.
        assert_eq!(trampoline_ra_offset(4, 15, true), 0);
        assert_eq!(trampoline_ra_offset(8, 15, true), 8);
        assert_eq!(trampoline_ra_offset(14, 15, true), 0);
    }
}
