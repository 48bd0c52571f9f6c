//! The reading side of the in-process Python stack agent
//! (`src/agent/pystacks.c`, preloaded into the job): its environment, and
//! the shared-memory rings (`src/agent/ring.h`) in which each Python process
//! writes same-instant samples — native registers and stack copy plus the
//! Python frame chain of that instant — and the names of the code objects
//! they refer to.
//!
//! The perf reader thread owns an [`AgentRings`]: it finds new ring files,
//! drains them alongside the perf rings, and unwinds the samples with the
//! same per-process unwinder as perf's own samples.

use rustc_hash::FxHashMap as HashMap;
use std::ffi::OsString;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::pylines::{self, LineTable};
use crate::event::{MonoNs, Pid, Tid};

/// Name of the agent (`src/agent/pystacks.c`).
pub const AGENT: &str = "pystacks";

const ENV_DIR: &str = "GPUPROF_PYSTACKS_DIR";
const ENV_PERIOD: &str = "GPUPROF_PYSTACKS_PERIOD_NS";
const ENV_STACK: &str = "GPUPROF_PYSTACKS_STACK_BYTES";
const ENV_RING: &str = "GPUPROF_PYSTACKS_RING_BYTES";
const ENV_SAMPLER: &str = "GPUPROF_PYSTACKS_SAMPLER";

const MAGIC: u64 = 0x3147_4e52_4652_5047;
const HEADER_BYTES: usize = 4096;
const OFF_CAPACITY: usize = 16;
const OFF_HEAD: usize = 64;
const OFF_TAIL: usize = 128;
const OFF_DROPPED: usize = 192;

const REC_PAD: u16 = 1;
const REC_HELLO: u16 = 2;
/// HELLO statuses that mean sampling (pystacks.c): with the perf event,
/// with the timers, and a native program with the timers.
const HELLO_SAMPLING: u32 = 0;
const HELLO_SAMPLING_TIMER: u32 = 4;
const HELLO_NATIVE_TIMER: u32 = 5;
const HELLO_SAMPLING_KERNEL: u32 = 6;
const REC_SAMPLE: u16 = 3;
const REC_CODE: u16 = 4;
const REC_NOTE: u16 = 5;
const REC_PENDING: u16 = 0xffff;

/// A reservation whose writer is gone (killed in the middle of a record)
/// is skipped after this long.
const STALE_PENDING: Duration = Duration::from_secs(2);

/// Status of an agent sample, as the handler found the thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PyStatus {
    /// The frame chain was read (it may be empty).
    Ok,
    /// Not a Python thread (no thread state).
    NoThreadState,
    /// A read failed: the chain changed under the reader.
    Unreadable,
    /// Deeper than the agent's limit: the innermost frames are kept.
    Truncated,
    /// Entry frames out of stack order.
    Inconsistent,
}

impl PyStatus {
    fn from_u32(v: u32) -> PyStatus {
        match v {
            0 => PyStatus::Ok,
            1 => PyStatus::NoThreadState,
            3 => PyStatus::Truncated,
            4 => PyStatus::Inconsistent,
            _ => PyStatus::Unreadable,
        }
    }
}

/// The folder of the agents' rings: shared memory (tmpfs), so that the
/// pages the job writes are never written back to a disk. It is the agent
/// folder when that is on tmpfs, else a private folder in `/dev/shm`;
/// removed on drop.
#[derive(Debug)]
pub struct RingDir {
    path: PathBuf,
    own: bool,
    _held: Option<crate::agent::Held>,
}

fn on_tmpfs(p: &Path) -> bool {
    nix::sys::statfs::statfs(p).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

impl RingDir {
    /// Under `agent_dir` (private, mode 0700) when it is on tmpfs, else in
    /// `/dev/shm`; falls back to `agent_dir` (rings then live in the page
    /// cache of that filesystem).
    pub fn create(agent_dir: &Path) -> std::io::Result<RingDir> {
        use std::os::unix::fs::DirBuilderExt;
        if !on_tmpfs(agent_dir) && on_tmpfs(Path::new("/dev/shm")) {
            crate::agent::remove_stale(Path::new("/dev/shm"), ring_dir_owner);
            for attempt in 0..16u32 {
                let path = PathBuf::from(format!(
                    "/dev/shm/gpuprof-{}-rings-{:08x}",
                    std::process::id(),
                    (std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.subsec_nanos())
                        .unwrap_or(0))
                        ^ attempt.wrapping_mul(0x9e37_79b9)
                ));
                match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                    Ok(()) => {
                        let held = crate::agent::hold(&path);
                        return Ok(RingDir {
                            path,
                            own: true,
                            _held: held,
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(_) => break,
                }
            }
        }
        let path = agent_dir.join("rings");
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(RingDir {
            path,
            own: false,
            _held: None,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Whether gpuprof records, as the agents read it from the first word of
/// `WINDOW_FILE` in the rings' folder (`src/agent/pystacks.c`): before
/// `--delay` has elapsed their handler returns at once, after the window
/// they stop their event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    Paused = 0,
    Open = 1,
    Over = 2,
}

const WINDOW_FILE: &str = "window";

/// Write the window word (the agents map the file shared, read-only). The
/// file is created before the job starts; an agent that finds none samples
/// throughout.
pub fn set_window(ring_dir: &Path, w: Window) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .mode(0o600)
        .open(ring_dir.join(WINDOW_FILE))?;
    // One aligned word: the agent never sees half of a change.
    f.write_all_at(&(w as u32).to_ne_bytes(), 0)
}

/// The gpuprof PID in the name of a rings folder in `/dev/shm`,
/// `gpuprof-<pid>-rings-<8 hex>`.
pub(crate) fn ring_dir_owner(name: &str) -> Option<i32> {
    let mut it = name.split('-');
    let (Some("gpuprof"), Some(pid), Some("rings"), Some(nonce), None) =
        (it.next(), it.next(), it.next(), it.next(), it.next())
    else {
        return None;
    };
    let hex = nonce.len() == 8 && nonce.bytes().all(|b| b.is_ascii_hexdigit());
    pid.parse().ok().filter(|_| hex)
}

impl Drop for RingDir {
    fn drop(&mut self) {
        if self.own {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The agent's sampling period at `frequency`: what it is told, and what
/// its samples' CPU times are counted in.
pub fn period_ns(frequency: u64) -> u64 {
    1_000_000_000 / frequency.max(1)
}

/// The agent's environment for the job: preload it (before any preload the
/// user had), and tell it where its rings go and how to sample.
pub fn job_env(
    agent_so: &Path,
    ring_dir: &Path,
    frequency: u64,
    stack_bytes: u32,
    timer: bool,
) -> Vec<(OsString, OsString)> {
    let mut preload = OsString::from(agent_so.as_os_str());
    if let Some(user) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(user);
    }
    let period = period_ns(frequency);
    let mut env = vec![
        ("LD_PRELOAD".into(), preload),
        (ENV_DIR.into(), ring_dir.as_os_str().to_owned()),
        (ENV_PERIOD.into(), period.to_string().into()),
        (ENV_STACK.into(), stack_bytes.to_string().into()),
        (
            ENV_RING.into(),
            ring_bytes_for(frequency, stack_bytes).to_string().into(),
        ),
    ];
    if timer {
        env.push((ENV_SAMPLER.into(), "timer".into()));
    }
    env
}

/// Ring size of one process: room for 50 ms of 8 busy threads, counting
/// each sample at its largest reservation; between 1 and 16 MiB (2 MiB at
/// 99 Hz). The reader drains every 20 ms while a ring is more than an
/// eighth full (or new rings are expected), every 50 ms otherwise.
pub fn ring_bytes_for(frequency: u64, stack_bytes: u32) -> usize {
    let per = stack_bytes as usize + 4096 + 128;
    let want = (frequency as usize).saturating_mul(per).saturating_mul(8) / 20;
    want.clamp(1 << 20, 16 << 20).next_power_of_two()
}

/// The agent said hello: what it does in this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub pid: Pid,
    pub t: MonoNs,
    /// The agent samples this process (else `detail` says why not).
    pub sampling: bool,
    /// It samples with per-thread CPU-time timers, not a perf event.
    pub timer: bool,
    /// The process is a CPython (else a native program the timers sample).
    pub python: bool,
    /// Its perf event samples the threads' periods in the kernel too (else
    /// a period that ends in the kernel takes no sample; `detail` says why).
    pub kernel: bool,
    pub version: String,
    /// A child forked by an agent-sampled process (its code objects are
    /// named in its parent's ring until it names new ones).
    pub forked: bool,
    pub ppid: Pid,
    pub detail: String,
}

/// One same-instant sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentSample {
    /// The native half, as a perf sample would carry it.
    pub native: super::sample::Sample,
    pub status: PyStatus,
    /// Python frames, innermost first: (code object, identity key, flags).
    pub frames: Vec<(u64, u32, u32)>,
    /// Timer sampler: further periods that expired before this signal came
    /// (the kernel checks CPU-time timers at its tick); the sample stands
    /// for them too.
    pub overrun: u32,
    /// The thread's CPU time at the signal, user and kernel (0: unknown).
    pub cpu_ns: u64,
}

/// Frame flag: the oldest frame of the run one eval-loop call executes.
pub const FRAME_ENTRY: u32 = 1;
/// Frame flag: the pointer was not a code object.
pub const FRAME_BAD_CODE: u32 = 2;

/// The instruction a frame was executing, from its flags: its index in
/// code units (-1: not started), or `None` when the agent could not tell.
pub fn frame_instruction(flags: u32) -> Option<i64> {
    let v = (flags >> 8) & 0x7f_ffff;
    (v != 0).then(|| v as i64 - 2)
}

/// A code object's names, as the agent read them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeName {
    pub pid: Pid,
    pub code: u64,
    pub key: u32,
    pub name: String,
    pub file: String,
    pub firstlineno: i32,
    /// Its line table (`co_lnotab` / `co_linetable`), at most the agent's
    /// 4 KiB.
    pub lines: Vec<u8>,
    /// The table was longer than what was sent.
    pub lines_cut: bool,
    /// The table could not be read.
    pub lines_missing: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Note {
    /// The job installed its own SIGTRAP disposition (it gets every
    /// SIGTRAP that is not the agent's).
    HandlerChained { pid: Pid, t: MonoNs },
    /// A sample signal arrived late: the thread had SIGTRAP blocked.
    Async { pid: Pid, tid: Tid, t: MonoNs },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentRecord {
    Hello(Hello),
    Sample(AgentSample),
    Code(CodeName),
    Note(Note),
}

impl AgentRecord {
    pub fn time(&self) -> MonoNs {
        match self {
            AgentRecord::Hello(h) => h.t,
            AgentRecord::Sample(s) => s.native.t,
            AgentRecord::Code(_) => MonoNs(0),
            AgentRecord::Note(Note::HandlerChained { t, .. })
            | AgentRecord::Note(Note::Async { t, .. }) => *t,
        }
    }
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// A Python str's characters, `kind` bytes each (CPython's compact
/// representation: Latin-1, UCS-2 or UCS-4).
pub(crate) fn decode_str(b: &[u8], kind: u8) -> Option<String> {
    match kind {
        1 => Some(b.iter().map(|&c| c as char).collect()),
        2 => Some(
            b.chunks_exact(2)
                .map(|c| u16::from_ne_bytes([c[0], c[1]]) as u32)
                .map(|c| char::from_u32(c).unwrap_or('\u{fffd}'))
                .collect(),
        ),
        4 => Some(
            b.chunks_exact(4)
                .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                .map(|c| char::from_u32(c).unwrap_or('\u{fffd}'))
                .collect(),
        ),
        _ => None,
    }
}

/// Decode one record (its bytes, header word included). Unknown types and
/// malformed records → `None`.
pub fn parse(rec: &[u8]) -> Option<AgentRecord> {
    let word = u64_at(rec, 0)?;
    let ty = (word >> 32) as u16;
    let pid = Pid(u32_at(rec, 8)? as i32);
    let tid = Tid(u32_at(rec, 12)? as i32);
    match ty {
        REC_HELLO => {
            let status = u32_at(rec, 24)?;
            Some(AgentRecord::Hello(Hello {
                pid,
                t: MonoNs(u64_at(rec, 16)?),
                sampling: matches!(
                    status,
                    HELLO_SAMPLING
                        | HELLO_SAMPLING_KERNEL
                        | HELLO_SAMPLING_TIMER
                        | HELLO_NATIVE_TIMER
                ),
                kernel: status == HELLO_SAMPLING_KERNEL,
                timer: matches!(status, HELLO_SAMPLING_TIMER | HELLO_NATIVE_TIMER),
                python: status != HELLO_NATIVE_TIMER,
                forked: u32_at(rec, 36)? != 0,
                ppid: Pid(u32_at(rec, 40)? as i32),
                version: cstr(rec.get(56..104)?),
                detail: cstr(rec.get(104..296)?),
            }))
        }
        REC_SAMPLE => {
            let t = MonoNs(u64_at(rec, 16)?);
            let mut regs = [0u64; 4];
            for (i, r) in regs.iter_mut().enumerate() {
                *r = u64_at(rec, 24 + 8 * i)?;
            }
            let status = PyStatus::from_u32(u32_at(rec, 56)?);
            let n = u32_at(rec, 60)? as usize;
            let stack_len = u32_at(rec, 64)? as usize;
            if n > 4096 {
                return None;
            }
            let mut frames = Vec::with_capacity(n);
            for i in 0..n {
                let o = 80 + 16 * i;
                frames.push((u64_at(rec, o)?, u32_at(rec, o + 8)?, u32_at(rec, o + 12)?));
            }
            let so = 80 + 16 * n;
            let stack = rec.get(so..so.checked_add(stack_len)?)?.to_vec();
            #[cfg(target_arch = "x86_64")]
            let ip = regs[2];
            #[cfg(target_arch = "aarch64")]
            let ip = regs[3];
            #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
            let ip = 0;
            Some(AgentRecord::Sample(AgentSample {
                native: super::sample::Sample {
                    pid,
                    tid,
                    t,
                    regs: Some(regs),
                    ip,
                    stack,
                },
                status,
                frames,
                overrun: u32_at(rec, 68)?,
                cpu_ns: u64_at(rec, 72)?,
            }))
        }
        REC_CODE => {
            let nk = *rec.get(32)?;
            let fk = *rec.get(33)?;
            let nb = u32_at(rec, 36)? as usize;
            let fb = u32_at(rec, 40)? as usize;
            let lb = u32_at(rec, 44)? as usize;
            let flags = u16::from_ne_bytes(rec.get(34..36)?.try_into().ok()?);
            let name = rec.get(48..48usize.checked_add(nb)?)?;
            let file = rec.get(48 + nb..(48 + nb).checked_add(fb)?)?;
            let lines = rec.get(48 + nb + fb..(48 + nb + fb).checked_add(lb)?)?;
            Some(AgentRecord::Code(CodeName {
                pid,
                code: u64_at(rec, 16)?,
                key: u32_at(rec, 24)?,
                firstlineno: u32_at(rec, 28)? as i32,
                name: decode_str(name, nk).unwrap_or_default(),
                file: decode_str(file, fk).unwrap_or_default(),
                lines: lines.to_vec(),
                lines_cut: flags & 1 != 0,
                lines_missing: flags & 2 != 0,
            }))
        }
        REC_NOTE => {
            let t = MonoNs(u64_at(rec, 16)?);
            match u32_at(rec, 24)? {
                1 => Some(AgentRecord::Note(Note::HandlerChained { pid, t })),
                2 => Some(AgentRecord::Note(Note::Async { pid, tid, t })),
                _ => None,
            }
        }
        _ => None,
    }
}

/// One process's ring, mapped.
struct MappedRing {
    map: memmap2::MmapMut,
    path: PathBuf,
    pid: Pid,
    capacity: u64,
    /// Our copy of `tail`.
    tail: u64,
    /// A pending record seen at this position since then.
    pending_since: Option<(u64, Instant)>,
    /// The layout was broken: stop reading (counted).
    broken: bool,
    /// The process was seen gone and its ring drained.
    done: bool,
    /// Code objects named in this ring: (code, key) → (name id, line
    /// table id).
    codes: HashMap<(u64, u32), (u32, u32)>,
    /// CPython's minor version of the process, from its hello.
    minor: u8,
    /// The ring of the process this one was forked from.
    parent: Option<usize>,
    /// Records dropped for a full ring, read when it was released.
    dropped_at_end: u64,
    /// Share of the ring in use when it was last drained.
    used: f64,
}

impl MappedRing {
    fn atomic(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is a multiple of 8 inside the mapping (header fields
        // or a record's first word, 8-byte aligned by the writers), and the
        // mapping lives as long as `self`.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU64) }
    }

    fn dropped(&self) -> u64 {
        if self.done {
            return self.dropped_at_end;
        }
        self.atomic(OFF_DROPPED).load(Ordering::Relaxed)
    }

    /// Move every committed record out. Returns how many were read.
    fn drain(&mut self, out: &mut Vec<AgentRecord>, malformed: &mut u64) -> usize {
        if self.broken {
            return 0;
        }
        let mask = self.capacity - 1;
        let head = self.atomic(OFF_HEAD).load(Ordering::Acquire);
        self.used = head.saturating_sub(self.tail) as f64 / self.capacity as f64;
        let mut n = 0;
        while self.tail < head {
            let idx = (self.tail & mask) as usize;
            let word = self.atomic(HEADER_BYTES + idx).load(Ordering::Acquire);
            if word == 0 {
                break;
            }
            let size = (word & 0xffff_ffff) as usize;
            let ty = (word >> 32) as u16;
            if size < 8 || size % 8 != 0 || idx + size > self.capacity as usize {
                self.broken = true;
                *malformed += 1;
                break;
            }
            if ty == REC_PENDING {
                if !self.stale(idx) {
                    break;
                }
            } else if ty != REC_PAD {
                let start = HEADER_BYTES + idx;
                if let Some(r) = parse(&self.map[start..start + size]) {
                    out.push(r);
                } else {
                    *malformed += 1;
                }
                n += 1;
            }
            let start = HEADER_BYTES + idx;
            self.map[start..start + size].fill(0);
            self.tail += size as u64;
            self.atomic(OFF_TAIL).store(self.tail, Ordering::Release);
            self.pending_since = None;
        }
        n
    }

    /// A reservation whose writer died (thread gone) for a while is skipped.
    fn stale(&mut self, idx: usize) -> bool {
        let now = Instant::now();
        match self.pending_since {
            Some((pos, since)) if pos == self.tail => {
                if now.duration_since(since) < STALE_PENDING {
                    return false;
                }
                let start = HEADER_BYTES + idx;
                let pid = u32_at(&self.map[start..start + 16], 8).unwrap_or(0);
                let tid = u32_at(&self.map[start..start + 16], 12).unwrap_or(0);
                !Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
            }
            _ => {
                self.pending_since = Some((self.tail, now));
                false
            }
        }
    }
}

/// Every ring in the agent's folder.
pub struct AgentRings {
    dir: PathBuf,
    rings: Vec<MappedRing>,
    known: HashMap<PathBuf, ()>,
    last_scan: Option<Instant>,
    /// Scan often until then: a new ring is expected.
    expect_until: Option<Instant>,
    /// A process whose agent has not spoken was sampled since the last
    /// scan: see [`SCAN_SOON_EVERY`].
    soon: bool,
    /// Records that could not be decoded (or a ring whose layout broke).
    pub malformed: u64,
    /// Python function names: id → (qualified name, file).
    names: Vec<(String, String)>,
    /// Line tables of the code objects named, by table id.
    tables: Vec<LineTable>,
    /// Lines decoded: (table id, instruction index) → line (0: none).
    line_cache: HashMap<(u32, i64), u32>,
    name_ids: HashMap<(String, String), u32>,
    scratch: Vec<AgentRecord>,
}

/// How often the folder is listed for new rings while one is expected (a
/// process was created or exec'd within `EXPECT_FOR`, or a ring was found
/// not yet initialised) ...
const SCAN_EVERY: Duration = Duration::from_millis(20);
const EXPECT_FOR: Duration = Duration::from_secs(2);
/// ... and otherwise, while perf samples a process whose agent has not
/// spoken (a process that stayed idle since it started makes its ring at
/// its first sample) ...
const SCAN_SOON_EVERY: Duration = Duration::from_millis(200);
/// ... and otherwise as a safety net. Listing the folder 50 times a second
/// was a tenth of the reader's work; 5 times a second, 5% on a loader job
/// whose agents had all spoken.
const SCAN_IDLE_EVERY: Duration = Duration::from_secs(1);
/// See [`AgentRings::eager`].
const BUSY_SHARE: f64 = 0.125;

impl AgentRings {
    pub fn new(dir: PathBuf) -> AgentRings {
        AgentRings {
            dir,
            rings: Vec::new(),
            known: HashMap::default(),
            last_scan: None,
            // The job itself is about to start.
            expect_until: Some(Instant::now() + EXPECT_FOR),
            soon: false,
            malformed: 0,
            names: Vec::new(),
            tables: Vec::new(),
            line_cache: HashMap::default(),
            name_ids: HashMap::default(),
            scratch: Vec::new(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A process was created or exec'd: its ring may appear soon.
    pub fn expect(&mut self) {
        self.expect_until = Some(Instant::now() + EXPECT_FOR);
    }

    /// A process that has not said hello is running: its ring may appear.
    pub fn look_soon(&mut self) {
        self.soon = true;
    }

    fn scan(&mut self) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in rd.flatten() {
            let path = e.path();
            if path.extension().map_or(true, |x| x != "ring") || self.known.contains_key(&path) {
                continue;
            }
            let Some(pid) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.split('-').next())
                .and_then(|p| p.parse::<i32>().ok())
            else {
                continue;
            };
            // Stacks are what gpuprof gives up first when short of memory.
            let size = e.metadata().map_or(0, |m| m.len());
            if !crate::collect::memory::may_map_stack_buffer(size) {
                self.known.insert(path.clone(), ());
                continue;
            }
            match map_ring(&path) {
                Some((map, capacity)) => {
                    self.known.insert(path.clone(), ());
                    self.rings.push(MappedRing {
                        map,
                        path,
                        pid: Pid(pid),
                        capacity,
                        tail: 0,
                        pending_since: None,
                        broken: false,
                        done: false,
                        codes: HashMap::default(),
                        minor: 0,
                        parent: None,
                        dropped_at_end: 0,
                        used: 0.0,
                    });
                }
                None => {
                    // Not initialised yet (the magic comes last): next scan.
                    self.expect();
                }
            }
        }
    }

    /// Drain every ring into `out` as (ring, record); code names are kept
    /// here (see [`AgentRings::resolve`]) rather than returned. Looks for new
    /// rings every few ms (every time with `force`).
    pub fn drain(&mut self, out: &mut Vec<(usize, AgentRecord)>, force: bool) {
        let every = if self.expect_until.is_some_and(|u| Instant::now() < u) {
            SCAN_EVERY
        } else if self.soon {
            SCAN_SOON_EVERY
        } else {
            SCAN_IDLE_EVERY
        };
        if force || self.last_scan.map_or(true, |l| l.elapsed() >= every) {
            self.scan();
            self.last_scan = Some(Instant::now());
            self.soon = false;
        }
        for i in 0..self.rings.len() {
            if !self.rings[i].done {
                self.drain_one(i, out);
            }
        }
    }

    /// Whether the rings should be drained at the quick pace: a new ring
    /// is expected (a process was just created or exec'd), or a ring was
    /// more than [`BUSY_SHARE`] full at its last drain. A ring holds 50 ms
    /// of 8 threads' samples at their largest ([`ring_bytes_for`]); a job
    /// with a busy thread or two per process fills about 1% of it in the
    /// 100 ms of the slow pace, and a ring under an eighth full at one
    /// drain overflows before the next only if its rate rises eightfold.
    /// (Waking 50 times a second for that, `poll` alone was 12% of the
    /// reader's samples in a profile of a loader job.)
    pub fn eager(&self) -> bool {
        self.expect_until.is_some_and(|u| Instant::now() < u)
            || self.rings.iter().any(|r| !r.done && r.used > BUSY_SHARE)
    }

    fn drain_one(&mut self, i: usize, out: &mut Vec<(usize, AgentRecord)>) {
        let mut recs = std::mem::take(&mut self.scratch);
        self.rings[i].drain(&mut recs, &mut self.malformed);
        for r in recs.drain(..) {
            match r {
                AgentRecord::Code(c) => {
                    let table = self.tables.len() as u32;
                    self.tables.push(LineTable {
                        minor: self.minor_of(i),
                        firstlineno: c.firstlineno,
                        bytes: c.lines,
                        cut: c.lines_cut || c.lines_missing,
                    });
                    let k = (c.name, c.file);
                    let id = match self.name_ids.get(&k) {
                        Some(id) => *id,
                        None => {
                            let id = self.names.len() as u32;
                            self.names.push(k.clone());
                            self.name_ids.insert(k, id);
                            id
                        }
                    };
                    self.rings[i].codes.insert((c.code, c.key), (id, table));
                }
                AgentRecord::Hello(h) => {
                    self.rings[i].minor = h
                        .version
                        .split('.')
                        .nth(1)
                        .and_then(|m| m.parse().ok())
                        .unwrap_or(0);
                    if h.forked && self.rings[i].parent.is_none() {
                        // The parent's ring at the fork: its latest one.
                        self.rings[i].parent = (0..self.rings.len())
                            .rev()
                            .find(|&j| j != i && self.rings[j].pid == h.ppid);
                    }
                    out.push((i, AgentRecord::Hello(h)));
                }
                other => out.push((i, other)),
            }
        }
        self.scratch = recs;
    }

    /// The name id of a code object seen in `ring`'s process: named there,
    /// or (a forked child) in the process it was forked from.
    pub fn resolve(&self, ring: usize, code: u64, key: u32) -> Option<(u32, u32)> {
        let mut r = Some(ring);
        for _ in 0..64 {
            let ring = self.rings.get(r?)?;
            if let Some(id) = ring.codes.get(&(code, key)) {
                return Some(*id);
            }
            r = ring.parent;
        }
        None
    }

    /// CPython's minor version in ring `i`'s process (0: not said yet).
    fn minor_of(&self, i: usize) -> u8 {
        self.rings.get(i).map_or(0, |r| r.minor)
    }

    /// The line a frame of line table `table` was on when executing
    /// instruction `index` (see [`frame_instruction`]): `Some(0)` when it
    /// cannot be decoded (cached per table and instruction).
    pub fn line(&mut self, table: u32, index: Option<i64>) -> u32 {
        let Some(index) = index else {
            return 0;
        };
        if let Some(l) = self.line_cache.get(&(table, index)) {
            return *l;
        }
        let l = self
            .tables
            .get(table as usize)
            .and_then(|t| pylines::line_of(t, index))
            .unwrap_or(0);
        self.line_cache.insert((table, index), l);
        l
    }

    /// (qualified name, file) of a name id.
    pub fn name(&self, id: u32) -> (&str, &str) {
        self.names
            .get(id as usize)
            .map_or(("?", "?"), |(n, f)| (n.as_str(), f.as_str()))
    }

    /// Release the rings of processes that are gone (after a last drain).
    /// Their code names stay: children may still refer to them.
    pub fn reap(&mut self, out: &mut Vec<(usize, AgentRecord)>) {
        for i in 0..self.rings.len() {
            let r = &self.rings[i];
            if r.done || Path::new(&format!("/proc/{}", r.pid.0)).exists() {
                continue;
            }
            self.drain_one(i, out);
            let r = &mut self.rings[i];
            r.dropped_at_end = r.dropped();
            r.done = true;
            let _ = std::fs::remove_file(&r.path);
            // Unmap it: the names stay, the 2 MiB go.
            if let Ok(anon) = memmap2::MmapMut::map_anon(HEADER_BYTES + 4096) {
                r.map = anon;
            }
        }
    }

    /// Records each process's agent dropped because its ring was full.
    pub fn dropped(&self) -> HashMap<Pid, u64> {
        let mut m = HashMap::default();
        for r in &self.rings {
            *m.entry(r.pid).or_default() += r.dropped();
        }
        m
    }

    /// Number of rings found so far.
    pub fn len(&self) -> usize {
        self.rings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rings.is_empty()
    }
}

fn map_ring(path: &Path) -> Option<(memmap2::MmapMut, u64)> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    let len = f.metadata().ok()?.len();
    if len < HEADER_BYTES as u64 + 4096 {
        return None;
    }
    // SAFETY: a file of our private folder, written concurrently by the
    // job's agent through the protocol of ring.h: fields are read with
    // atomics and records only once committed.
    // Populated at once: mapped page by page as the reader reached them,
    // the ring's first pass cost ~100 page faults a second on a loader job
    // (a tenth of the reader's time).
    let map = unsafe { memmap2::MmapOptions::new().populate().map_mut(&f) }.ok()?;
    // SAFETY: offset 0 of a mapping of at least 8 KiB, aligned.
    let magic = unsafe { &*(map.as_ptr() as *const AtomicU64) }.load(Ordering::Acquire);
    if magic != MAGIC {
        return None;
    }
    let cap = u64_at(&map, OFF_CAPACITY)?;
    if !cap.is_power_of_two() || HEADER_BYTES as u64 + cap > len {
        return None;
    }
    Some((map, cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(size: u32, ty: u16) -> [u8; 8] {
        ((size as u64) | ((ty as u64) << 32)).to_ne_bytes()
    }

    #[test]
    fn records_decode_and_truncations_are_rejected() {
        let mut rec = Vec::new();
        rec.extend(word(80 + 32 + 16, REC_SAMPLE));
        rec.extend(7u32.to_ne_bytes());
        rec.extend(8u32.to_ne_bytes());
        rec.extend(123u64.to_ne_bytes());
        for r in [0xb0u64, 0x5000, 0x401000, 0] {
            rec.extend(r.to_ne_bytes());
        }
        rec.extend(0u32.to_ne_bytes()); // ok
        rec.extend(2u32.to_ne_bytes()); // frames
        rec.extend(16u32.to_ne_bytes()); // stack
        rec.extend(0u32.to_ne_bytes());
        rec.extend(40_000_000u64.to_ne_bytes()); // thread CPU time
        rec.extend(0x1000u64.to_ne_bytes());
        rec.extend(5u32.to_ne_bytes());
        rec.extend(0u32.to_ne_bytes());
        rec.extend(0x2000u64.to_ne_bytes());
        rec.extend(6u32.to_ne_bytes());
        rec.extend(FRAME_ENTRY.to_ne_bytes());
        rec.extend([0xaa; 16]);
        let Some(AgentRecord::Sample(s)) = parse(&rec) else {
            panic!("not a sample")
        };
        assert_eq!((s.native.pid, s.native.tid), (Pid(7), Tid(8)));
        assert_eq!(s.frames, vec![(0x1000, 5, 0), (0x2000, 6, FRAME_ENTRY)]);
        assert_eq!(s.native.stack, vec![0xaa; 16]);
        assert_eq!(s.status, PyStatus::Ok);
        assert_eq!(s.cpu_ns, 40_000_000);
        for n in 0..rec.len() {
            let _ = parse(&rec[..n]);
        }
        assert!(parse(&rec[..rec.len() - 1]).is_none());

        let mut code = Vec::new();
        code.extend(word(48 + 8 + 8, REC_CODE));
        code.extend(7u32.to_ne_bytes());
        code.extend(8u32.to_ne_bytes());
        code.extend(0x1000u64.to_ne_bytes());
        code.extend(5u32.to_ne_bytes());
        code.extend(12i32.to_ne_bytes());
        code.extend([2u8, 1, 0, 0]);
        code.extend(4u32.to_ne_bytes()); // name bytes: two UCS-2 chars
        code.extend(3u32.to_ne_bytes()); // file bytes
        code.extend(0u32.to_ne_bytes());
        code.extend([b'f', 0, 0xe9, 0]);
        code.extend(b"a.py\0\0\0\0");
        let Some(AgentRecord::Code(c)) = parse(&code) else {
            panic!("not a code record")
        };
        assert_eq!((c.name.as_str(), c.file.as_str()), ("fé", "a.p"));
        assert_eq!((c.code, c.key, c.firstlineno), (0x1000, 5, 12));
    }

    #[test]
    fn ring_sizes_and_env() {
        assert_eq!(ring_bytes_for(99, 32 * 1024), 2 << 20);
        assert_eq!(ring_bytes_for(1000, 32 * 1024), 16 << 20);
        let env = job_env(
            Path::new("/x/libgpuprof_pystacks.so"),
            Path::new("/r"),
            99,
            32768,
            false,
        );
        let get = |k: &str| env.iter().find(|e| e.0 == k).map(|e| e.1.clone());
        assert!(get("LD_PRELOAD")
            .unwrap()
            .to_string_lossy()
            .starts_with("/x/libgpuprof_pystacks.so"));
        assert_eq!(get(ENV_PERIOD).unwrap(), "10101010");
        assert_eq!(get(ENV_SAMPLER), None);
        let env = job_env(Path::new("/a.so"), Path::new("/r"), 99, 32768, true);
        assert!(env.iter().any(|e| e.0 == ENV_SAMPLER && e.1 == "timer"));
    }
}
