//! NVTX ranges of the job, captured without code changes: gpuprof names its
//! injection library (`src/agent/nvtx.c`) in the job's environment through
//! `NVTX_INJECTION64_PATH`; NVTX loads it at the job's first NVTX call, in
//! every process. Each of the job's threads writes its records into a ring
//! file of its own (shared memory, no lock, no system call, never waits);
//! this reader drains the rings, pairs push/pop and start/end into ranges
//! and streams them into the recording, within a detail budget.
//!
//! File layouts are defined in the agent; the constants here mirror them.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent::AgentDir;
use crate::event::{
    Coverage, Event, MonoNs, NvtxBatch, NvtxRangeRec, NvtxStats, NvtxTotal, Pid, Tid,
};
use crate::record::Sink;
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

/// The variable NVTX v3 reads in a 64-bit process.
pub const INJECTION_VAR: &str = "NVTX_INJECTION64_PATH";
/// Where the agent writes its ring files.
pub const DIR_VAR: &str = "GPUPROF_NVTX_DIR";

const INST_MAGIC: u64 = 0x3149_4e54_5856_4e47;
const RING_MAGIC: u64 = 0x3152_4e54_5856_4e47;
const FORMAT_VERSION: u32 = 1;
const RING_HEADER: usize = 4096;
const OFF_HEAD: usize = 64;
const OFF_TAIL: usize = 128;
const OFF_LOST: usize = 192;
const OFF_STATE: usize = 200;
const REC_HEADER: usize = 16;

const REC_PAD: u8 = 0;
const REC_PUSH: u8 = 1;
const REC_POP: u8 = 2;
const REC_START: u8 = 3;
const REC_END: u8 = 4;
const REC_MARK: u8 = 5;
const REC_DOMAIN: u8 = 6;
const REC_CATEGORY: u8 = 7;
const REC_THREAD_NAME: u8 = 8;
const REC_THREAD_EXIT: u8 = 9;

/// How often the rings are drained. A ring holds 256 KiB: ~4000 push/pop
/// pairs, so a thread can make ~100k NVTX calls per second before this
/// reader's lag costs records.
const POLL: Duration = Duration::from_millis(20);
/// How often the folder is listed for new rings (a thread's first NVTX
/// call creates one, and its records wait there until it is found) and
/// instances are checked for having ended. With inotify, new files wake
/// the reader at once, and the folder is listed this often only while
/// rings are open (threads and instances end without a file event).
const SCAN: Duration = Duration::from_millis(50);
/// With inotify and no ring open, the reader wakes this often (pending
/// ranges, counters, and a listing in case an event was missed) instead
/// of listing the folder every `SCAN`: most jobs never call NVTX, and each
/// wake-up is CPU taken from the job on a busy machine.
const IDLE_WAKE: Duration = Duration::from_secs(1);
/// Completed ranges wait at most this long before they are written.
const FLUSH: Duration = Duration::from_secs(1);
/// Counters are written this often (cumulative), so that a killed gpuprof
/// still leaves them.
const STATS_EVERY: Duration = Duration::from_secs(10);

/// Detail budget (token buckets, ranges per second and burst). Outermost
/// ranges (the steps, epochs and phases users look at) have a bucket of
/// their own so that a flood of inner ranges cannot crowd them out. Beyond
/// the budget, ranges are counted per name (count, total, max) but not
/// kept one by one: at ~7 bytes per range in the compressed recording the
/// worst case stays near 15 MB per hour.
pub const DETAIL_OUTER_PER_S: f64 = 100.0;
pub const DETAIL_OUTER_BURST: f64 = 20_000.0;
pub const DETAIL_INNER_PER_S: f64 = 500.0;
pub const DETAIL_INNER_BURST: f64 = 50_000.0;
/// Distinct messages interned as they are; past this, names are interned
/// with their numbers replaced (`step 12` → `step N`), which bounds a job
/// that puts a counter in every message.
const MAX_NAMES: usize = 100_000;
/// Start/end ranges whose end has not been seen yet, and ends seen before
/// their start (another thread's ring read first), per reader.
const MAX_OPEN_START_END: usize = 100_000;
/// Open push/pop ranges kept per thread and domain.
const MAX_STACK: usize = 1024;

/// What the session needs to start the job with NVTX capture.
pub struct NvtxPlan {
    /// Variables for the job's environment (empty when not capturing).
    pub env: Vec<(OsString, OsString)>,
    /// The folder the rings go into (removed on drop).
    ring_dir: Option<RingDir>,
    /// Why NVTX is not captured, when it is not.
    pub not_captured: Option<String>,
}

/// A private folder (mode 0700) for the ring files, on tmpfs when
/// possible: the rings are written through shared mappings, and on a disk
/// filesystem the kernel would write them back to the disk, which would
/// show as the job's own IO.
struct RingDir {
    path: PathBuf,
    _held: Option<crate::agent::Held>,
}

impl Drop for RingDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn is_tmpfs(p: &Path) -> bool {
    nix::sys::statfs::statfs(p)
        .map(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
        .unwrap_or(false)
}

/// The gpuprof PID in the name of an NVTX rings folder,
/// `gpuprof-nvtx-<pid>-<8 hex>`.
pub(crate) fn nvtx_dir_owner(name: &str) -> Option<i32> {
    let (pid, nonce) = name.strip_prefix("gpuprof-nvtx-")?.split_once('-')?;
    let hex = nonce.len() == 8 && nonce.bytes().all(|b| b.is_ascii_hexdigit());
    pid.parse().ok().filter(|_| hex)
}

fn make_ring_dir(agent: &AgentDir) -> std::io::Result<RingDir> {
    let name = format!(
        "gpuprof-nvtx-{}-{:08x}",
        std::process::id(),
        MonoNs::now().0 as u32
    );
    let mut bases: Vec<PathBuf> = Vec::new();
    if is_tmpfs(agent.path()) {
        bases.push(agent.path().to_path_buf());
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() && is_tmpfs(shm) {
        bases.push(shm.to_path_buf());
    }
    bases.push(agent.path().to_path_buf());
    let mut last = None;
    for b in bases {
        crate::agent::remove_stale(&b, nvtx_dir_owner);
        let p = b.join(&name);
        match std::fs::DirBuilder::new().mode(0o700).create(&p) {
            Ok(()) => {
                let held = crate::agent::hold(&p);
                return Ok(RingDir {
                    path: p,
                    _held: held,
                });
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no folder for the NVTX rings")))
}

impl NvtxPlan {
    /// Decide how the job's NVTX calls are captured. `job_env_value` is
    /// the job's current `NVTX_INJECTION64_PATH`, if any: another tool's
    /// injection (Nsight Systems sets it) is never replaced.
    pub fn new(agent: Option<&AgentDir>, job_env_value: Option<OsString>) -> NvtxPlan {
        let off = |why: String| NvtxPlan {
            env: Vec::new(),
            ring_dir: None,
            not_captured: Some(why),
        };
        if let Some(v) = job_env_value.filter(|v| !v.is_empty()) {
            return off(format!(
                "not captured: the job already sets {INJECTION_VAR}={} (another tool, e.g. Nsight Systems, receives the NVTX calls); gpuprof leaves it in place",
                v.to_string_lossy()
            ));
        }
        let Some(agent) = agent else {
            return off("not captured: no runtime folder for gpuprof's injection library".into());
        };
        let lib = match agent.install("nvtx") {
            Ok(p) => p,
            Err(e) => {
                return off(format!(
                    "not captured: cannot write the injection library: {e}"
                ))
            }
        };
        let dir = match make_ring_dir(agent) {
            Ok(d) => d,
            Err(e) => {
                return off(format!(
                    "not captured: cannot create a folder for the NVTX rings: {e}"
                ))
            }
        };
        NvtxPlan {
            env: vec![
                (INJECTION_VAR.into(), lib.into_os_string()),
                (DIR_VAR.into(), dir.path.clone().into_os_string()),
            ],
            ring_dir: Some(dir),
            not_captured: None,
        }
    }

    /// No capture, for the reason given.
    pub fn disabled(why: &str) -> NvtxPlan {
        NvtxPlan {
            env: Vec::new(),
            ring_dir: None,
            not_captured: Some(why.to_string()),
        }
    }

    pub fn capturing(&self) -> bool {
        self.ring_dir.is_some()
    }
}

/// The reader thread.
pub struct NvtxCollector {
    stop: Arc<AtomicBool>,
    /// Wakes the reader from its wait on the folder's events.
    wake: Option<Arc<EventFd>>,
    active: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Keeps the ring folder until the collector is dropped.
    _dir: Option<RingDir>,
}

impl NvtxCollector {
    /// Start reading (when `plan` captures) and record the coverage line.
    /// `active`: record from now on (false until a `--delay` elapses: the
    /// rings are drained meanwhile, but nothing is recorded).
    pub fn start(plan: NvtxPlan, sink: &Sink, active: bool) -> NvtxCollector {
        let NvtxPlan {
            ring_dir,
            not_captured,
            ..
        } = plan;
        let stop = Arc::new(AtomicBool::new(false));
        let active = Arc::new(AtomicBool::new(active));
        let Some(dir) = ring_dir else {
            sink.send_blocking(Event::Coverage(Coverage {
                source: crate::vocab::coverage::NVTX.into(),
                available: false,
                detail: not_captured.unwrap_or_else(|| "not captured".into()),
            }));
            return NvtxCollector {
                stop,
                wake: None,
                active,
                thread: None,
                _dir: None,
            };
        };
        sink.send_blocking(Event::Coverage(Coverage {
            source: crate::vocab::coverage::NVTX.into(),
            available: true,
            detail: format!(
                "NVTX ranges captured through {INJECTION_VAR} (the job needs no change); detail kept up to {DETAIL_OUTER_PER_S:.0} outermost + {DETAIL_INNER_PER_S:.0} inner ranges/s on average, the rest counted per name"
            ),
        }));
        let path = dir.path.clone();
        let (stop2, active2, sink2) = (stop.clone(), active.clone(), sink.clone());
        let wake = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .ok()
            .map(Arc::new);
        let wake2 = wake.clone();
        let thread = std::thread::Builder::new()
            .name("gpuprof-nvtx".into())
            .spawn(move || {
                let _cost = crate::selfcost::Charge::new("NVTX reader");
                let mut r = Reader::new(path, sink2);
                r.run(&stop2, &active2, wake2.as_deref());
            })
            .ok();
        if thread.is_none() {
            sink.send_blocking(Event::Coverage(Coverage {
                source: crate::vocab::coverage::NVTX.into(),
                available: false,
                detail: "not captured: cannot start the NVTX reader thread".into(),
            }));
        }
        NvtxCollector {
            stop,
            wake,
            active,
            thread,
            _dir: Some(dir),
        }
    }

    pub fn set_active(&self) {
        self.active.store(true, Ordering::Release);
    }

    /// Drain every ring one last time, close what is still open at this
    /// instant, write the counters, and end the thread. The ring folder
    /// stays until the collector is dropped (the job may still run).
    pub fn stop(&mut self) {
        self.request_stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Tell the reader to take its last pass, without waiting for it.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = &self.thread {
            if let Some(w) = &self.wake {
                let _ = w.write(1);
            }
            t.thread().unpark();
        }
    }
}

impl Drop for NvtxCollector {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A file mapped shared, read and written (the tail) by this reader.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by one reader thread at a time; concurrent
// access from the job goes through the atomics of the ring header.
unsafe impl Send for Mapping {}

impl Mapping {
    fn map(file: &File, len: usize) -> std::io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of a file we opened read-write.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p.cast(), len })
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(off + 8 <= self.len && off % 8 == 0);
        // SAFETY: in bounds and aligned (mmap is page aligned).
        unsafe { &*(self.ptr.add(off) as *const AtomicU64) }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(off + 4 <= self.len && off % 4 == 0);
        // SAFETY: as above.
        unsafe { &*(self.ptr.add(off) as *const AtomicU32) }
    }

    /// Copy bytes out of the mapping.
    fn read(&self, off: usize, out: &mut [u8]) {
        assert!(off + out.len() <= self.len);
        // SAFETY: in bounds; the producer does not write this range until
        // the tail moves past it.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), out.as_mut_ptr(), out.len()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping what `map` mapped.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// Wait up to `timeout` for a file event in the watched folder or the stop
/// signal; true when files were added (the events are consumed).
fn wait_for_files(watch: &Inotify, stop: &EventFd, timeout: Duration) -> bool {
    let mut fds = [
        libc::pollfd {
            fd: watch.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: stop.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: fds is a valid array of two pollfd.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout.as_millis() as libc::c_int) };
    let mut any = false;
    if rc > 0 && fds[0].revents != 0 {
        while let Ok(evs) = watch.read_events() {
            if evs.is_empty() {
                break;
            }
            any = true;
        }
    }
    any
}

fn le_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn le_u64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// An open range.
#[derive(Clone, Debug)]
struct Open {
    t: u64,
    name: u32,
    level: u64,
    cat: u32,
    payload: Option<f64>,
    dom: u32,
    tid: Tid,
}

struct Instance {
    inst: u32,
    pid: Pid,
    path: PathBuf,
    /// Our own descriptor: an exclusive lock succeeds once the process
    /// image that holds the shared lock is gone.
    lock: File,
    dead: bool,
}

struct Ring {
    path: PathBuf,
    map: Mapping,
    data_size: usize,
    nonce: u64,
    tid: Tid,
    /// Open push/pop ranges per domain.
    stacks: HashMap<u32, Vec<Open>>,
    lost_seen: u64,
    closed: bool,
}

/// Token bucket.
struct Bucket {
    tokens: f64,
    rate: f64,
    burst: f64,
    last: u64,
}

impl Bucket {
    fn new(rate: f64, burst: f64) -> Bucket {
        Bucket {
            tokens: burst,
            rate,
            burst,
            last: 0,
        }
    }
    fn take(&mut self, t: u64) -> bool {
        if t > self.last {
            self.tokens = (self.tokens + (t - self.last) as f64 / 1e9 * self.rate).min(self.burst);
            self.last = t;
        }
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

struct Reader {
    dir: PathBuf,
    sink: Sink,
    active: bool,
    instances: HashMap<u64, Instance>,
    next_inst: u32,
    rings: BTreeMap<String, Ring>,
    /// Ring files already refused (malformed), not retried.
    refused: std::collections::HashSet<String>,
    names: HashMap<String, u32>,
    /// Start/end ranges by (nonce, id), and ends that came first.
    started: HashMap<(u64, u64), Open>,
    early_ends: HashMap<(u64, u64), (u64, Tid)>,
    /// Completed ranges waiting to be written, per (inst, pid, tid).
    pending: BTreeMap<(u32, Pid, Tid), Vec<(u64, NvtxRangeRec)>>,
    pending_count: usize,
    outer: Bucket,
    inner: Bucket,
    stats: NvtxStats,
    totals: HashMap<(u32, u32, u32), NvtxTotal>,
    stats_dirty: bool,
    buf: Vec<u8>,
}

impl Reader {
    fn new(dir: PathBuf, sink: Sink) -> Reader {
        Reader {
            dir,
            sink,
            active: false,
            instances: HashMap::new(),
            next_inst: 1,
            rings: BTreeMap::new(),
            refused: Default::default(),
            names: HashMap::new(),
            started: HashMap::new(),
            early_ends: HashMap::new(),
            pending: BTreeMap::new(),
            pending_count: 0,
            outer: Bucket::new(DETAIL_OUTER_PER_S, DETAIL_OUTER_BURST),
            inner: Bucket::new(DETAIL_INNER_PER_S, DETAIL_INNER_BURST),
            stats: NvtxStats::default(),
            totals: HashMap::new(),
            stats_dirty: false,
            buf: Vec::with_capacity(2048),
        }
    }

    fn run(&mut self, stop: &AtomicBool, active: &AtomicBool, wake: Option<&EventFd>) {
        // New instance and ring files are renamed into the folder: watch
        // for that rather than list the folder 20 times a second. Without
        // inotify (or the stop signal), the folder is listed every SCAN.
        let watch = wake.and_then(|w| {
            let i = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).ok()?;
            i.add_watch(&self.dir, AddWatchFlags::IN_MOVED_TO).ok()?;
            Some((i, w))
        });
        let mut last_scan: Option<Instant> = None;
        let mut last_flush = Instant::now();
        let mut last_stats = Instant::now();
        let mut news = false;
        loop {
            let stopping = stop.load(Ordering::Acquire);
            self.active = active.load(Ordering::Acquire);
            let scan_every = if watch.is_none() || !self.rings.is_empty() {
                SCAN
            } else {
                IDLE_WAKE
            };
            if stopping || news || last_scan.map_or(true, |t| t.elapsed() >= scan_every) {
                self.scan();
                last_scan = Some(Instant::now());
            }
            let busy = self.drain_all();
            if stopping {
                break;
            }
            if last_flush.elapsed() >= FLUSH || self.pending_count >= 8192 {
                self.flush();
                last_flush = Instant::now();
            }
            if last_stats.elapsed() >= STATS_EVERY {
                self.write_stats();
                last_stats = Instant::now();
            }
            // Wake often only while the job is emitting: idle rings are
            // checked every 2.5 polls, and with no ring at all only the
            // folder is watched (or listed).
            let timeout = if !self.rings.is_empty() {
                if busy {
                    POLL
                } else {
                    POLL * 5 / 2
                }
            } else {
                scan_every
            };
            news = match &watch {
                Some((i, w)) => wait_for_files(i, w, timeout),
                None => {
                    std::thread::park_timeout(timeout);
                    false
                }
            };
        }
        // Whatever is still open ends with the recording.
        let now = MonoNs::now().0;
        let nonces: Vec<u64> = self.rings.values().map(|r| r.nonce).collect();
        for n in nonces {
            self.close_instance_ranges(n, now);
        }
        self.close_start_end(None, now);
        self.flush();
        self.stats_dirty = true;
        self.write_stats();
    }

    fn send(&self, ev: Event) {
        if self.active {
            self.sink.send(ev);
        }
    }

    /// List the folder: map new instances and rings; find instances that
    /// ended and rings whose thread ended, drain and remove them.
    fn scan(&mut self) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut ring_files = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".inst") {
                self.add_instance(&e.path());
            } else if name.ends_with(".ring")
                && !self.rings.contains_key(&name)
                && !self.refused.contains(&name)
            {
                ring_files.push((name, e.path()));
            }
        }
        for (name, path) in ring_files {
            match self.map_ring(&path) {
                Some(Ok(r)) => {
                    self.stats.threads += 1;
                    self.stats_dirty = true;
                    self.rings.insert(name, r);
                }
                Some(Err(())) => {
                    self.stats.bad_rings += 1;
                    self.refused.insert(name);
                }
                None => {} // its instance is not mapped yet: next scan
            }
        }
        // Ended instances: drain their rings, close what is open, remove.
        let mut ended = Vec::new();
        for (nonce, inst) in self.instances.iter_mut() {
            if inst.dead {
                continue;
            }
            // SAFETY: flock on our own descriptor.
            let got = unsafe { libc::flock(inst.lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if got == 0 {
                inst.dead = true;
                ended.push(*nonce);
            }
        }
        for nonce in ended {
            let keys: Vec<String> = self
                .rings
                .iter()
                .filter(|(_, r)| r.nonce == nonce)
                .map(|(k, _)| k.clone())
                .collect();
            for k in &keys {
                self.drain(k);
            }
            let now = MonoNs::now().0;
            self.close_instance_ranges(nonce, now);
            self.close_start_end(Some(nonce), now);
            for k in keys {
                if let Some(r) = self.rings.remove(&k) {
                    let _ = std::fs::remove_file(&r.path);
                }
            }
            if let Some(i) = self.instances.get(&nonce) {
                let _ = std::fs::remove_file(&i.path);
            }
        }
        // Rings of threads that ended.
        let closed: Vec<String> = self
            .rings
            .iter()
            .filter(|(_, r)| r.map.u32_at(OFF_STATE).load(Ordering::Acquire) == 2)
            .map(|(k, _)| k.clone())
            .collect();
        for k in closed {
            self.drain(&k);
            if let Some(r) = self.rings.get(&k) {
                if r.closed {
                    let r = self.rings.remove(&k).unwrap();
                    let _ = std::fs::remove_file(&r.path);
                }
            }
        }
    }

    fn add_instance(&mut self, path: &Path) {
        let Ok(mut f) = std::fs::OpenOptions::new().read(true).open(path) else {
            return;
        };
        let mut b = [0u8; 48];
        if std::io::Read::read_exact(&mut f, &mut b).is_err()
            || le_u64(&b, 0) != INST_MAGIC
            || le_u32(&b, 8) != FORMAT_VERSION
        {
            return;
        }
        let nonce = le_u64(&b, 16);
        if self.instances.contains_key(&nonce) {
            return;
        }
        let pid = Pid(le_u32(&b, 12) as i32);
        let parent_nonce = le_u64(&b, 24);
        let created = le_u64(&b, 40);
        let inst = self.next_inst;
        self.next_inst += 1;
        let parent = self
            .instances
            .get(&parent_nonce)
            .filter(|_| parent_nonce != 0)
            .map(|i| i.inst);
        self.instances.insert(
            nonce,
            Instance {
                inst,
                pid,
                path: path.to_path_buf(),
                lock: f,
                dead: false,
            },
        );
        self.stats.instances += 1;
        self.stats_dirty = true;
        self.send(Event::NvtxInstance {
            t: MonoNs(created),
            inst,
            pid,
            parent,
        });
    }

    /// `None`: the ring's instance is not known yet.
    fn map_ring(&mut self, path: &Path) -> Option<Result<Ring, ()>> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .ok()?;
        let len = f.metadata().ok()?.len() as usize;
        let mut b = [0u8; 48];
        if len < RING_HEADER + 4096 || std::io::Read::read_exact(&mut &f, &mut b).is_err() {
            return Some(Err(()));
        }
        if le_u64(&b, 0) != RING_MAGIC || le_u32(&b, 8) != FORMAT_VERSION {
            return Some(Err(()));
        }
        let nonce = le_u64(&b, 16);
        let tid = Tid(le_u32(&b, 24) as i32);
        let data_size = le_u32(&b, 28) as usize;
        if !data_size.is_power_of_two() || data_size + RING_HEADER != len {
            return Some(Err(()));
        }
        if !self.instances.contains_key(&nonce) {
            return None;
        }
        let Ok(map) = Mapping::map(&f, len) else {
            return Some(Err(()));
        };
        Some(Ok(Ring {
            path: path.to_path_buf(),
            map,
            data_size,
            nonce,
            tid,
            stacks: HashMap::new(),
            lost_seen: 0,
            closed: false,
        }))
    }

    /// Drain every ring; true when any had records.
    fn drain_all(&mut self) -> bool {
        let keys: Vec<String> = self.rings.keys().cloned().collect();
        let mut any = false;
        for k in keys {
            any |= self.drain(&k);
        }
        any
    }

    /// Read every complete record of one ring and release the space; true
    /// when there were records.
    fn drain(&mut self, key: &str) -> bool {
        let has_data = self.rings.get(key).is_some_and(|r| {
            r.map.u64_at(OFF_HEAD).load(Ordering::Acquire)
                != r.map.u64_at(OFF_TAIL).load(Ordering::Relaxed)
        });
        // Nothing new (the common case): leave the ring in place.
        let Some(mut ring) = has_data.then(|| self.rings.remove(key)).flatten() else {
            return false;
        };
        let head = ring.map.u64_at(OFF_HEAD).load(Ordering::Acquire);
        let mut tail = ring.map.u64_at(OFF_TAIL).load(Ordering::Relaxed);
        let size = ring.data_size as u64;
        let mut bad = head.wrapping_sub(tail) > size;
        while !bad && tail < head {
            let off = (tail % size) as usize;
            let left = ring.data_size - off;
            let mut kind = [0u8; 1];
            if left >= REC_HEADER {
                ring.map.read(RING_HEADER + off, &mut kind);
            }
            if left < REC_HEADER || kind[0] == REC_PAD {
                tail += left as u64;
                continue;
            }
            let mut hdr = [0u8; REC_HEADER];
            ring.map.read(RING_HEADER + off, &mut hdr);
            let rsize = u16::from_le_bytes([hdr[2], hdr[3]]) as usize;
            if rsize < 32 || rsize % 8 != 0 || rsize > left || tail + rsize as u64 > head {
                bad = true;
                break;
            }
            self.buf.resize(rsize, 0);
            let mut buf = std::mem::take(&mut self.buf);
            ring.map.read(RING_HEADER + off, &mut buf);
            if !self.record(&mut ring, &buf) {
                bad = true;
            }
            self.buf = buf;
            tail += rsize as u64;
        }
        if bad {
            // A ring the job corrupted: stop reading it, and never block
            // its writer (the tail jumps to the head).
            self.stats.bad_rings += 1;
            tail = head;
        }
        ring.map.u64_at(OFF_TAIL).store(tail, Ordering::Release);
        let lost = ring.map.u64_at(OFF_LOST).load(Ordering::Relaxed);
        if lost > ring.lost_seen {
            self.stats.lost_in_job += lost - ring.lost_seen;
            ring.lost_seen = lost;
            self.stats_dirty = true;
        }
        self.rings.insert(key.to_string(), ring);
        true
    }

    fn inst_of(&self, nonce: u64) -> (u32, Pid) {
        self.instances
            .get(&nonce)
            .map(|i| (i.inst, i.pid))
            .unwrap_or((0, Pid(0)))
    }

    fn intern(&mut self, text: &[u8]) -> u32 {
        let s = String::from_utf8_lossy(text);
        if let Some(id) = self.names.get(s.as_ref()) {
            return *id;
        }
        let s = if self.names.len() >= MAX_NAMES {
            let g = crate::vocab::nvtx::name_group(&s);
            if let Some(id) = self.names.get(&g) {
                return *id;
            }
            if self.names.len() >= MAX_NAMES + MAX_NAMES / 10 {
                "(more distinct names than gpuprof keeps)".to_string()
            } else {
                g
            }
        } else {
            s.into_owned()
        };
        if let Some(id) = self.names.get(&s) {
            return *id;
        }
        let id = self.names.len() as u32 + 1;
        self.names.insert(s.clone(), id);
        // Names are written whether or not the window is open: ranges
        // recorded later refer to them.
        self.sink.send_blocking(Event::NvtxName { id, name: s });
        id
    }

    /// Handle one record; false when it is malformed.
    fn record(&mut self, ring: &mut Ring, b: &[u8]) -> bool {
        let kind = b[0];
        let flags = b[1];
        let dom = le_u32(b, 4);
        let t = le_u64(b, 8);
        let id = le_u64(b, 16);
        let (inst, pid) = self.inst_of(ring.nonce);
        let text = |lo: usize, len: usize| -> Option<&[u8]> { b.get(lo..lo.checked_add(len)?) };
        match kind {
            REC_PUSH | REC_START | REC_MARK => {
                let cat = le_u32(b, 24);
                let len = le_u32(b, 28) as usize;
                let Some(msg) = text(40, len) else {
                    return false;
                };
                let name = self.intern(msg);
                let payload = payload(flags & 0x0f, le_u64(b, 32));
                let open = Open {
                    t,
                    name,
                    level: id,
                    cat,
                    payload,
                    dom,
                    tid: ring.tid,
                };
                match kind {
                    REC_PUSH => {
                        let st = ring.stacks.entry(dom).or_default();
                        if id != u64::MAX {
                            // Entries at this level or deeper were closed
                            // by pops that were lost.
                            let before = st.len();
                            st.retain(|o| o.level < id);
                            self.stats.unmatched += (before - st.len()) as u64;
                        }
                        if st.len() < MAX_STACK {
                            st.push(open);
                        }
                    }
                    REC_START => {
                        let key = (ring.nonce, id);
                        if let Some((te, etid)) = self.early_ends.remove(&key) {
                            self.complete(inst, pid, &open, te, true, Some(etid), false);
                        } else if self.started.len() < MAX_OPEN_START_END {
                            self.started.insert(key, open);
                        }
                    }
                    _ => self.mark(inst, pid, &open),
                }
            }
            REC_POP => {
                let st = ring.stacks.entry(dom).or_default();
                let found = if id == u64::MAX {
                    st.pop()
                } else {
                    let before = st.len();
                    st.retain(|o| o.level <= id);
                    self.stats.unmatched += (before - st.len()) as u64;
                    if st.last().is_some_and(|o| o.level == id) {
                        st.pop()
                    } else {
                        None
                    }
                };
                match found {
                    Some(o) => self.complete(inst, pid, &o, t, false, None, false),
                    None => self.stats.unmatched += 1,
                }
            }
            REC_END => {
                let key = (ring.nonce, id);
                match self.started.remove(&key) {
                    Some(o) => {
                        let etid = (o.tid != ring.tid).then_some(ring.tid);
                        self.complete(inst, pid, &o, t, true, etid, false);
                    }
                    None => {
                        if self.early_ends.len() < MAX_OPEN_START_END {
                            self.early_ends.insert(key, (t, ring.tid));
                        } else {
                            self.stats.unmatched += 1;
                        }
                    }
                }
            }
            REC_DOMAIN | REC_CATEGORY | REC_THREAD_NAME => {
                let len = le_u32(b, 24) as usize;
                let Some(msg) = text(32, len) else {
                    return false;
                };
                let name = String::from_utf8_lossy(msg).into_owned();
                let ev = match kind {
                    REC_DOMAIN => Event::NvtxDomain {
                        inst,
                        id: id as u32,
                        name,
                    },
                    REC_CATEGORY => Event::NvtxCategory {
                        inst,
                        dom,
                        id: id as u32,
                        name,
                    },
                    _ => Event::NvtxThreadName {
                        inst,
                        tid: Tid(id as i32),
                        name,
                    },
                };
                // Definitions are needed by ranges recorded later, even
                // when they come before the window opens.
                self.sink.send_blocking(ev);
            }
            REC_THREAD_EXIT => {
                let stacks = std::mem::take(&mut ring.stacks);
                for o in stacks.into_values().flatten() {
                    self.complete(inst, pid, &o, t, false, None, true);
                }
                ring.closed = true;
            }
            _ => return false,
        }
        true
    }

    /// Close the push/pop ranges still open in an instance's rings.
    fn close_instance_ranges(&mut self, nonce: u64, t: u64) {
        let (inst, pid) = self.inst_of(nonce);
        let mut open = Vec::new();
        for r in self.rings.values_mut().filter(|r| r.nonce == nonce) {
            open.extend(std::mem::take(&mut r.stacks).into_values().flatten());
        }
        for o in open {
            self.complete(inst, pid, &o, t, false, None, true);
        }
    }

    /// Close the start/end ranges still open (of one instance, or all).
    fn close_start_end(&mut self, nonce: Option<u64>, t: u64) {
        let keys: Vec<(u64, u64)> = self
            .started
            .keys()
            .filter(|k| nonce.map_or(true, |n| k.0 == n))
            .copied()
            .collect();
        for k in keys {
            if let Some(o) = self.started.remove(&k) {
                let (inst, pid) = self.inst_of(k.0);
                self.complete(inst, pid, &o, t, true, None, true);
            }
        }
        self.early_ends
            .retain(|k, _| nonce.is_some_and(|n| k.0 != n));
    }

    fn within_budget(&mut self, outermost: bool, t: u64) -> bool {
        if outermost && self.outer.take(t) {
            return true;
        }
        self.inner.take(t)
    }

    #[allow(clippy::too_many_arguments)]
    fn complete(
        &mut self,
        inst: u32,
        pid: Pid,
        o: &Open,
        end: u64,
        se: bool,
        etid: Option<Tid>,
        open: bool,
    ) {
        if !self.active {
            return;
        }
        let end = end.max(o.t);
        let d = end - o.t;
        let outermost = se || o.level == 0 || o.level == u64::MAX;
        if !self.within_budget(outermost, end) {
            self.over_budget(inst, o.dom, o.name, d);
            return;
        }
        let rec = NvtxRangeRec {
            s: 0,
            d: Some(d),
            n: o.name,
            dom: o.dom,
            lvl: if se || o.level == u64::MAX {
                0
            } else {
                o.level.min(u32::MAX as u64) as u32
            },
            cat: o.cat,
            se,
            etid,
            open,
            p: o.payload,
        };
        self.stats.kept += 1;
        self.pending
            .entry((inst, pid, o.tid))
            .or_default()
            .push((o.t, rec));
        self.pending_count += 1;
    }

    fn mark(&mut self, inst: u32, pid: Pid, o: &Open) {
        if !self.active {
            return;
        }
        if !self.within_budget(false, o.t) {
            self.over_budget(inst, o.dom, o.name, 0);
            return;
        }
        let rec = NvtxRangeRec {
            s: 0,
            d: None,
            n: o.name,
            dom: o.dom,
            cat: o.cat,
            p: o.payload,
            ..Default::default()
        };
        self.stats.kept += 1;
        self.pending
            .entry((inst, pid, o.tid))
            .or_default()
            .push((o.t, rec));
        self.pending_count += 1;
    }

    fn over_budget(&mut self, inst: u32, dom: u32, name: u32, d: u64) {
        self.stats.over_budget += 1;
        self.stats_dirty = true;
        let e = self.totals.entry((inst, dom, name)).or_insert(NvtxTotal {
            inst,
            dom,
            name,
            ..Default::default()
        });
        e.count += 1;
        e.total_ns += d;
        e.max_ns = e.max_ns.max(d);
    }

    fn flush(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        self.pending_count = 0;
        for ((inst, pid, tid), mut v) in pending {
            v.sort_by_key(|(t, r)| (*t, std::cmp::Reverse(r.d)));
            let t0 = v.first().map(|x| x.0).unwrap_or(0);
            let ranges = v
                .into_iter()
                .map(|(t, mut r)| {
                    r.s = t - t0;
                    r
                })
                .collect();
            self.sink.send(Event::NvtxRanges(NvtxBatch {
                inst,
                pid,
                tid,
                t0: MonoNs(t0),
                ranges,
            }));
        }
    }

    fn write_stats(&mut self) {
        if !self.stats_dirty {
            return;
        }
        self.stats_dirty = false;
        let mut s = self.stats.clone();
        s.totals = self.totals.values().cloned().collect();
        s.totals.sort_by_key(|t| (t.inst, t.dom, t.name));
        self.sink.send_blocking(Event::NvtxStats(s));
    }
}

/// An NVTX payload as a number (types numbered as NVTX numbers them).
fn payload(kind: u8, bits: u64) -> Option<f64> {
    let v = match kind {
        1 => bits as f64,
        2 => bits as i64 as f64,
        3 => f64::from_bits(bits),
        4 => bits as u32 as f64,
        5 => bits as u32 as i32 as f64,
        6 => f32::from_bits(bits as u32) as f64,
        _ => return None,
    };
    v.is_finite().then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_decode_as_nvtx_numbers_them() {
        assert_eq!(payload(1, 7), Some(7.0));
        assert_eq!(payload(2, (-3i64) as u64), Some(-3.0));
        assert_eq!(payload(3, 2.5f64.to_bits()), Some(2.5));
        assert_eq!(payload(5, (-2i32) as u32 as u64), Some(-2.0));
        assert_eq!(payload(6, 1.5f32.to_bits() as u64), Some(1.5));
        assert_eq!(payload(0, 1), None);
    }

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let mut b = Bucket::new(10.0, 5.0);
        let n = (0..100).filter(|_| b.take(1)).count();
        assert_eq!(n, 5);
        // One second later: 10 more, capped at the burst.
        let n = (0..100).filter(|_| b.take(1_000_000_001)).count();
        assert_eq!(n, 5);
    }
}
