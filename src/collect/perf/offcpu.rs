//! Stacks of blocked threads, read without stopping them: the wall-clock
//! sampler.
//!
//! perf's cpu-clock events and the in-process agent see a thread only while
//! it runs. A training loop spends much of its time blocked (waiting for a
//! batch, a collective, the GPU, the GIL), so each tick of this sampler
//! looks at the job's threads wherever they are:
//!
//! - `/proc/PID/task/TID/syscall` says `running`, or gives the system call
//!   the thread is blocked in, its arguments, and its user stack pointer and
//!   program counter (DESIGN.md §9);
//! - the stack of a blocked thread does not change while it stays blocked:
//!   it is copied with `process_vm_readv` and unwound like a perf sample;
//! - its Python frames are read in the same window, from outside with
//!   `process_vm_readv`: with the frame layout the in-process agent
//!   publishes in its ring ([`super::pyread`]), and with py-spy
//!   (non-blocking mode) where there is no agent (`gpuprof attach`) or that
//!   read fails;
//! - the thread's CPU time (`schedstat`) and its `syscall` line are read
//!   before and after: a thread that ran in between (woke up, maybe blocked
//!   again) gave a read that may mix two moments, and it is dropped, never
//!   half used. A thread whose CPU time and `syscall` line have not changed
//!   since its previous blocked sample has not run since: its stack is the
//!   same and is not read again (a thread blocked for a second costs one
//!   copy, not a hundred).
//! - a thread that ran since, but is blocked again in the same system call
//!   at the same stack pointer and program counter (a loop that blocks at
//!   the same place every step), is checked against what the reader's
//!   unwinding of an earlier read of that place used: the few stack words
//!   it read. When they are all unchanged, the unwinding would give the
//!   same frames, and they are reused instead of copying and unwinding the
//!   stack again ([`KnownStack`]). Its Python frames are read again all the
//!   same: from CPython 3.11 a Python call adds no C frame, so the Python
//!   stack can differ at the same native stack pointer.
//! - the `syscall` and `schedstat` files of each thread stay open and are
//!   read with `pread`: opening a `/proc` file costs more than reading it.
//!
//! The main thread of the job's own process and of each rank's main
//! process (the training loop) is looked at every tick, at the stack
//! frequency; other threads, and other processes' (DataLoader workers),
//! take turns: each every [`OTHERS_EVERY`] ticks, at most
//! [`MAX_OTHER_LOOKS`] of the loop processes' a tick, and the other
//! processes' threads one look every [`WORKER_TICKS_PER_LOOK`] ticks
//! between them, without Python frames.

use rustc_hash::FxHashMap as HashMap;
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use py_spy::config::{LineNo, LockingStrategy};
use py_spy::{Config, PythonSpy};

use super::pyread::{PyReader, ReadError};
use super::sample::Sample;
pub use super::syscall::{
    copy_memory, gil_marker, parse_syscall, syscall_marker, SyscallLine, GIL_MARKER_PREFIX,
};
use super::syscall::{on_regular_file, words_unchanged, ThreadFiles};
use crate::event::{MonoNs, Pid, Tid};

/// Threads other than a loop's main thread are looked at once every this
/// many ticks (fewer when there are many: see [`MAX_OTHER_LOOKS`] and
/// [`WORKER_TICKS_PER_LOOK`]).
pub const OTHERS_EVERY: usize = 10;
/// At most this many of the loop processes' other threads are looked at in
/// one tick (a framework's thread pool can be dozens of threads).
const MAX_OTHER_LOOKS: usize = 2;
/// The threads of the other processes (DataLoader workers, helpers) share
/// one look every this many ticks: their waits feed only the trace and the
/// flame graphs, while a loader of 15 workers gave them two looks a tick,
/// two thirds of the sampler's reads (docs/performance.md).
const WORKER_TICKS_PER_LOOK: usize = 4;
/// The job's threads are listed again this often.
const LIST_EVERY: Duration = Duration::from_secs(1);
/// A thread's Python frames, outermost first: (name, file, entry).
type PyFrames = Vec<(String, String, bool)>;

/// How often a loop process's agent layout is looked for until found.
const FIND_EVERY: Duration = Duration::from_millis(100);
/// Attempts to attach py-spy to a process (one per listing).
const ATTACH_ATTEMPTS: u32 = 5;
/// Places (system call, stack pointer, program counter) remembered per
/// thread: a loop blocks in a few (the next batch, the GPU, a collective).
const KNOWN_PER_THREAD: usize = 4;
/// A blocked stack is copied this far beyond the deepest word an unwinding
/// of the thread's earlier stacks read (up to the stack size): deeper
/// stacks are rare, and one is copied again whole ([`WallSampler::recopy`]).
const REACH_SLACK: usize = 4096;

/// What one look at a thread found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WallRecord {
    /// On a CPU (perf and the agent sample it there).
    Running {
        pid: Pid,
        tid: Tid,
        t: MonoNs,
    },
    /// Blocked, and not run since its previous blocked sample: the same
    /// stack.
    Repeat {
        pid: Pid,
        tid: Tid,
        t: MonoNs,
    },
    /// Blocked when first looked at, but it ran while it was being read:
    /// the read is dropped.
    Raced {
        pid: Pid,
        tid: Tid,
        t: MonoNs,
    },
    Blocked(Box<Blocked>),
}

impl WallRecord {
    pub fn time(&self) -> MonoNs {
        match self {
            WallRecord::Running { t, .. }
            | WallRecord::Repeat { t, .. }
            | WallRecord::Raced { t, .. } => *t,
            WallRecord::Blocked(b) => b.sample.t,
        }
    }
}

/// A consistent read of a blocked thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// Registers and stack copy, as a perf sample has them.
    pub sample: Sample,
    /// `[syscall: NAME]` (with `, regular file` when its file descriptor is
    /// one), or `[blocked: not in a system call]`.
    pub marker: &'static str,
    /// Python frames, outermost first: (name, file, entry); `None` when
    /// the process is not read with py-spy or its frames were unreadable.
    pub py: Option<Vec<(String, String, bool)>>,
    /// `[gil held by thread TID in FUNCTION (FILE)]`: another thread of the
    /// process held the interpreter lock while this one was blocked.
    pub gil_holder: Option<&'static str>,
    /// Where it blocked: (system call or -1, stack pointer, program
    /// counter).
    pub place: (i64, u64, u64),
    /// The native frames of an earlier read of the same place, whose stack
    /// words the unwinding read are unchanged: `sample.stack` is then empty.
    pub known: Option<Arc<NativeFrames>>,
    /// The stack copy stopped where this thread's earlier stacks were
    /// unwound to ([`WallSampler::copy_len`]), not at the stack size or
    /// the end of the stack's mapping.
    pub sized_copy: bool,
    /// The thread's `syscall` line and CPU time when it was read: a copy
    /// found too short is taken again only while they are unchanged.
    pub read_as: (String, u64),
}

/// A blocked thread's native stack, as the reader unwound it.
#[derive(Debug, PartialEq, Eq)]
pub struct NativeFrames {
    /// (file id, file offset), innermost first.
    pub frames: Vec<(u32, u64)>,
    pub complete: bool,
    /// The process's code mappings it was unwound with
    /// (`unwind::ProcessMaps::version`).
    pub maps: u64,
}

/// What one unwinding of a blocked thread's stack depended on: the
/// registers (the `syscall` line's stack pointer and program counter, the
/// system call), and the stack words it read. Unwinding is a function of
/// the registers, the words read and the code mappings, so the same
/// registers and words give the same frames. Reads past the end of the
/// copy (which failed) fail again: at the same stack pointer the copy ends
/// at the same place.
struct KnownStack {
    nr: i64,
    sp: u64,
    pc: u64,
    /// (offset from `sp`, value), by offset.
    words: Vec<(u32, u64)>,
    frames: Arc<NativeFrames>,
}

/// Counters of the wall-clock sampler.
#[derive(Default, Clone, Debug)]
pub struct WallStats {
    pub looks: u64,
    pub running: u64,
    pub blocked: u64,
    pub repeated: u64,
    pub raced: u64,
    /// Stack copies and their bytes, and the sized copies the unwinding
    /// ran off, copied again whole.
    pub copies: u64,
    pub copied_bytes: u64,
    pub recopied: u64,
    /// Blocked samples whose native frames were reused (the stack words
    /// their unwinding read were unchanged).
    pub reused: u64,
    /// Blocked samples without Python frames in a process py-spy reads.
    pub py_missing: u64,
    /// Reads of a process's Python frames (one per process and tick with a
    /// blocked thread) served from the agent's layout, and the thread CPU
    /// time they took.
    pub py_agent: u64,
    pub py_agent_ns: u64,
    /// Reads from the agent's layout that failed (py-spy read those).
    pub py_agent_failed: u64,
    /// Reads by py-spy, and their thread CPU time.
    pub py_spy: u64,
    pub py_spy_ns: u64,
    /// `GPUPROF_WALL_PY=check`: threads whose frames both readers gave,
    /// and how many of those differed.
    pub py_checked: u64,
    pub py_differed: u64,
    /// Thread CPU time of the whole sampler (its ticks).
    pub cpu_ns: u64,
}

impl WallStats {
    /// What read the blocked threads' Python frames and what it cost, for
    /// the stack coverage's detail.
    pub fn python_reads(&self) -> String {
        let mean = |ns: u64, n: u64| {
            if n == 0 {
                0.0
            } else {
                ns as f64 / n as f64 / 1e3
            }
        };
        let mut s = format!(
            "; Python frames of blocked threads: {} reads with the agent's frame layout ({:.1} µs of CPU each), {} failed; {} reads by py-spy ({:.1} µs each)",
            self.py_agent,
            mean(self.py_agent_ns, self.py_agent),
            self.py_agent_failed,
            self.py_spy,
            mean(self.py_spy_ns, self.py_spy),
        );
        if self.py_checked > 0 {
            s.push_str(&format!(
                "; checked against py-spy: {} threads, {} differed",
                self.py_checked, self.py_differed
            ));
        }
        s
    }
}

/// Which reader gives blocked threads' Python frames
/// (`GPUPROF_WALL_PY`: `spy` for py-spy only, to measure it against the
/// agent's layout; `check` to read both and count where they differ).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PySource {
    Agent,
    Spy,
    Check,
}

impl PySource {
    fn from_env() -> PySource {
        match std::env::var("GPUPROF_WALL_PY").as_deref() {
            Ok("spy") => PySource::Spy,
            Ok("check") => PySource::Check,
            _ => PySource::Agent,
        }
    }
}

/// The self-cost component the sampler's CPU goes to (carved out of the
/// perf reader's thread, which runs it).
pub const SELFCOST_PART: &str = "wall-clock sampler (in the perf reader)";

enum Spy {
    Ready(Box<PythonSpy>),
    /// Not attached yet: attempts made.
    Trying(u32),
    /// Not read: not Python, a DataLoader worker, or attaching failed.
    No,
}

/// A thread looked at this tick, between its two reads.
struct Look {
    tid: Tid,
    t: MonoNs,
    before: String,
    runtime: u64,
    line: SyscallLine,
    sized_copy: bool,
    stack: Vec<u8>,
    known: Option<Arc<NativeFrames>>,
    marker: &'static str,
}

pub struct WallSampler {
    job: Pid,
    interval: Duration,
    next: Instant,
    tick: u64,
    /// Seed of the ticks' jitter.
    seed: u64,
    stack_size: usize,
    threads: Vec<(Pid, Vec<Tid>)>,
    listed: Option<Instant>,
    /// Per thread: (CPU time, syscall line) of its last blocked sample.
    last: HashMap<Tid, (u64, String)>,
    files: HashMap<Tid, ThreadFiles>,
    /// Per thread, the places it was read blocked at, most recent last.
    known: HashMap<Tid, Vec<KnownStack>>,
    /// Per thread, how deep into its blocked stacks (bytes from the stack
    /// pointer) the unwinding has read: copies are sized by it.
    reach: HashMap<Tid, usize>,
    /// Scratch for the first and the second `syscall` read.
    before: String,
    after: String,
    spies: HashMap<Pid, Spy>,
    /// The agent's ring folder, where its processes publish their frame
    /// layout; `None` without the agent.
    ring_dir: Option<std::path::PathBuf>,
    verdicts: Option<Arc<super::AgentVerdicts>>,
    /// Readers of Python frames with the agent's layout, by process.
    readers: HashMap<Pid, PyReader>,
    /// `GPUPROF_WALL_PY=check`: py-spy's frames of this look.
    spy_check: Option<HashMap<Tid, PyFrames>>,
    /// When each loop process without a reader was last looked for one.
    reader_sought: HashMap<Pid, Instant>,
    py_source: PySource,
    /// Processes that run a training loop (the job's own, ranks' mains),
    /// once known.
    loops: HashMap<Pid, bool>,
    config: Config,
    pub stats: WallStats,
    /// Where its CPU time is shown in `report.json`.
    cost: &'static std::sync::atomic::AtomicU64,
    hang: Option<HangWatch>,
    /// Turns of the loop processes' other threads, and of the other
    /// processes' threads.
    helper_turns: Turns,
    worker_turns: Turns,
    /// The loop processes' other threads, and the other processes'.
    helpers: Vec<Tid>,
    workers: Vec<Tid>,
    /// Per process, its `/proc/PID/fd`, kept open.
    fd_dirs: HashMap<Pid, Option<File>>,
}

/// `--hang-after`: when each loop thread has been blocked since when
/// (with its CPU time then), and whether this hang was reported.
struct HangWatch {
    after: Duration,
    dir: std::path::PathBuf,
    since: HashMap<Tid, (Instant, u64)>,
    reported: bool,
    count: u32,
}

/// Threads taking turns to be looked at: each once every [`OTHERS_EVERY`]
/// ticks while that is within the pool's budget, `per` ticks for `max`
/// looks; beyond it, in turn within the budget.
#[derive(Default)]
struct Turns {
    /// Looks owed, in units of `OTHERS_EVERY * per` a look.
    credit: usize,
    next: usize,
}

impl Turns {
    fn take(&mut self, tids: &[Tid], per: usize, max: usize, turn: &mut Vec<Tid>) {
        if tids.is_empty() {
            self.credit = 0;
            return;
        }
        let cost = OTHERS_EVERY * per;
        // Each thread earns `per` units a tick (one look every OTHERS_EVERY
        // ticks), the pool at most `OTHERS_EVERY * max` (`max` looks every
        // `per` ticks).
        let gain = (tids.len() * per).min(OTHERS_EVERY * max);
        self.credit = (self.credit + gain).min(cost * max);
        let mut taken = 0;
        while self.credit >= cost && taken < tids.len() {
            self.credit -= cost;
            self.next %= tids.len();
            turn.push(tids[self.next]);
            self.next += 1;
            taken += 1;
        }
    }
}

impl WallSampler {
    pub fn new(job: Pid, frequency: u64, stack_size: u32) -> WallSampler {
        let interval = Duration::from_nanos(1_000_000_000 / frequency.max(1));
        WallSampler {
            job,
            interval,
            next: Instant::now(),
            tick: 0,
            seed: job.0 as u64 ^ (std::process::id() as u64) << 32,
            stack_size: stack_size as usize,
            threads: Vec::new(),
            listed: None,
            last: HashMap::default(),
            files: HashMap::default(),
            known: HashMap::default(),
            reach: HashMap::default(),
            before: String::new(),
            after: String::new(),
            spies: HashMap::default(),
            ring_dir: None,
            verdicts: None,
            readers: HashMap::default(),
            reader_sought: HashMap::default(),
            spy_check: None,
            py_source: PySource::from_env(),
            loops: HashMap::default(),
            config: Config {
                blocking: LockingStrategy::NonBlocking,
                native: false,
                collect_thread_names: false,
                lineno: LineNo::NoLine,
                ..Config::default()
            },
            stats: WallStats::default(),
            cost: crate::selfcost::part("perf reader", SELFCOST_PART),
            hang: None,
            helper_turns: Turns::default(),
            worker_turns: Turns::default(),
            helpers: Vec::new(),
            workers: Vec::new(),
            fd_dirs: HashMap::default(),
        }
    }

    /// Read Python frames with the layout the agent publishes in its rings
    /// in `dir` (py-spy then reads only what that cannot).
    /// `verdicts` learn which processes' loop threads are read so (the
    /// py-spy sampler leaves those ranks' main processes to the agent).
    pub fn read_agent_layouts(
        &mut self,
        dir: std::path::PathBuf,
        verdicts: Arc<super::AgentVerdicts>,
    ) {
        self.ring_dir = Some(dir);
        self.verdicts = Some(verdicts);
    }

    /// `pid`'s reader of Python frames with the agent's layout: found, or
    /// gone (`None`).
    fn set_reader(&mut self, pid: Pid, reader: Option<PyReader>) {
        let walled = reader.is_some() && self.py_source != PySource::Spy;
        match reader {
            Some(r) => self.readers.insert(pid, r),
            None => self.readers.remove(&pid),
        };
        if let Some(v) = &self.verdicts {
            v.set_walled(pid, walled);
        }
    }

    /// Write a hang report into `dir` when every loop thread has stayed
    /// blocked for `after`.
    pub fn watch_hangs(&mut self, after: Duration, dir: std::path::PathBuf) {
        self.hang = Some(HangWatch {
            after,
            dir,
            since: HashMap::default(),
            reported: false,
            count: 0,
        });
    }

    /// A loop thread was found blocked with CPU time `runtime` (None: it
    /// runs, or ran since).
    fn note(&mut self, pid: Pid, tid: Tid, runtime: Option<u64>) {
        if pid.0 != tid.0 || self.loops.get(&pid) != Some(&true) {
            return;
        }
        let Some(h) = self.hang.as_mut() else {
            return;
        };
        match runtime {
            Some(r) => {
                let e = h.since.entry(tid).or_insert((Instant::now(), r));
                if e.1 != r {
                    *e = (Instant::now(), r);
                }
            }
            None => {
                h.since.remove(&tid);
            }
        }
    }

    /// Every rank's loop thread (the job's own when there is no rank)
    /// blocked for `after`: report once per hang, on a thread of its own
    /// (reading every process takes a while; the sampler goes on).
    fn check_hang(&mut self) {
        let job = self.job;
        let stack_size = self.stack_size as u32;
        let ranks: Vec<Pid> = self
            .loops
            .iter()
            .filter(|(p, l)| **l && **p != job)
            .map(|(p, _)| *p)
            .collect();
        let watched = if ranks.is_empty() { vec![job] } else { ranks };
        let Some(h) = self.hang.as_mut() else {
            return;
        };
        let stuck = watched.iter().all(|p| {
            h.since
                .get(&Tid(p.0))
                .is_some_and(|s| s.0.elapsed() >= h.after)
        });
        if !stuck {
            h.reported = false;
            return;
        }
        if h.reported {
            return;
        }
        h.reported = true;
        h.count += 1;
        let path = h.dir.join(format!("hang-{}.txt", h.count));
        let after = h.after;
        let _ = std::thread::Builder::new()
            .name("gpuprof-hang".into())
            .spawn(move || report_hang(job, stack_size, after, &path));
    }

    /// Time until the next tick is due.
    /// `pid` exec'd: whether it runs a training loop is decided again at
    /// the next listing. A rank forked by its launcher (torchrun's
    /// `Popen`) and listed before its exec had the launcher's environment,
    /// without `RANK`, and was taken for a helper for the whole run: its
    /// loop looked at once in many ticks, its waits in collectives unseen.
    pub fn exec(&mut self, pid: Pid) {
        if self.loops.remove(&pid).is_some() {
            self.spies.remove(&pid);
            self.reader_sought.remove(&pid);
            self.listed = None;
        }
    }

    pub fn due_in(&self) -> Duration {
        self.next.saturating_duration_since(Instant::now())
    }

    /// Look at the threads due, if a tick is due, pushing what was found.
    pub fn tick(&mut self, out: &mut Vec<WallRecord>) {
        let now = Instant::now();
        if now < self.next {
            return;
        }
        let cpu0 = crate::selfcost::thread_cpu_ns();
        self.tick_now(now, out);
        if let (Some(a), Some(b)) = (cpu0, crate::selfcost::thread_cpu_ns()) {
            self.stats.cpu_ns += b.saturating_sub(a);
            self.cost
                .store(self.stats.cpu_ns, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn tick_now(&mut self, now: Instant, out: &mut Vec<WallRecord>) {
        // A late tick is not made up for: ticks stay about one interval
        // apart.
        self.next = (self.next + jittered(self.interval, self.seed ^ self.tick)).max(now);
        if self.listed.map_or(true, |l| l.elapsed() >= LIST_EVERY) {
            self.list();
        }
        self.tick += 1;
        self.check_hang();
        let turn = self.others_turn();
        for i in 0..self.threads.len() {
            let pid = self.threads[i].0;
            let is_loop = self.loops.get(&pid) == Some(&true);
            let tids: Vec<Tid> = self.threads[i]
                .1
                .iter()
                .copied()
                .filter(|t| (is_loop && t.0 == pid.0) || turn.contains(t))
                .collect();
            if !tids.is_empty() {
                self.look_at(pid, &tids, out);
            }
        }
    }

    /// The other threads (not a loop's main thread) to look at this tick.
    /// The loop processes' other threads take turns, each once every
    /// [`OTHERS_EVERY`] ticks while they are few, never more than
    /// [`MAX_OTHER_LOOKS`] in one tick; the other processes' threads take
    /// turns the same way within one look every [`WORKER_TICKS_PER_LOOK`]
    /// ticks. A job of many workers costs a bounded few reads per tick
    /// (each thread is then seen less often; the analysis weighs a look by
    /// the time to the next).
    fn others_turn(&mut self) -> Vec<Tid> {
        let mut turn = Vec::new();
        self.helper_turns
            .take(&self.helpers, 1, MAX_OTHER_LOOKS, &mut turn);
        self.worker_turns
            .take(&self.workers, WORKER_TICKS_PER_LOOK, 1, &mut turn);
        turn
    }

    /// The other threads by pool, from the thread list (at each listing,
    /// and once a process is known to run a training loop or not).
    fn sort_others(&mut self) {
        self.helpers.clear();
        self.workers.clear();
        for (pid, tids) in &self.threads {
            let is_loop = self.loops.get(pid) == Some(&true);
            for &t in tids {
                if !is_loop {
                    self.workers.push(t);
                } else if t.0 != pid.0 {
                    self.helpers.push(t);
                }
            }
        }
    }

    fn list(&mut self) {
        self.listed = Some(Instant::now());
        let mut pids = vec![self.job.0];
        pids.extend(crate::collect::python::descendants(self.job.0));
        let mut threads = Vec::with_capacity(pids.len());
        for pid in pids {
            let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            let mut tids: Vec<Tid> = rd
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .map(Tid)
                .collect();
            tids.sort_unstable();
            threads.push((Pid(pid), tids));
            // Decided once the process runs Python (not while it is still
            // gpuprof's child before its exec) and is not a DataLoader
            // worker (named at its start).
            // A training loop runs in the job's own process or in a rank's
            // main process; the others (DataLoader workers, helpers) are
            // looked at less often and without Python frames.
            let is_loop = match self.loops.get(&Pid(pid)) {
                Some(l) => Some(*l),
                None => {
                    let l = if pid == self.job.0 {
                        Some(true)
                    } else {
                        crate::collect::python::is_rank_main(Pid(pid))
                    };
                    if let Some(l) = l {
                        self.loops.insert(Pid(pid), l);
                    }
                    l
                }
            };
            if is_loop == Some(true) {
                self.find_reader(Pid(pid));
            }
            // py-spy is attached where the agent's layout cannot be read
            // (yet), or later if a read with it fails.
            let has_reader =
                self.readers.contains_key(&Pid(pid)) && self.py_source == PySource::Agent;
            let spy = self.spies.entry(Pid(pid)).or_insert(Spy::Trying(0));
            if let (Spy::Trying(n), false) = (&mut *spy, has_reader) {
                let exe = crate::collect::python::exe_of(pid);
                if is_loop == Some(false) {
                    *spy = Spy::No;
                } else if is_loop == Some(true)
                    && crate::collect::python::looks_like_python(Pid(pid), &exe)
                {
                    *spy = match attach_spy(pid, &self.config) {
                        Ok(s) => Spy::Ready(Box::new(s)),
                        Err(_) if *n + 1 >= ATTACH_ATTEMPTS => Spy::No,
                        Err(_) => Spy::Trying(*n + 1),
                    };
                }
            }
        }
        let alive: std::collections::HashSet<Pid> = threads.iter().map(|t| t.0).collect();
        self.spies.retain(|p, _| alive.contains(p));
        let gone: Vec<Pid> = self
            .readers
            .keys()
            .filter(|p| !alive.contains(p))
            .copied()
            .collect();
        for pid in gone {
            self.set_reader(pid, None);
        }
        self.reader_sought.retain(|p, _| alive.contains(p));
        self.loops.retain(|p, _| alive.contains(p));
        let tids: std::collections::HashSet<Tid> =
            threads.iter().flat_map(|t| t.1.iter().copied()).collect();
        self.last.retain(|t, _| tids.contains(t));
        self.fd_dirs.retain(|p, _| alive.contains(p));
        self.files.retain(|t, _| tids.contains(t));
        self.known.retain(|t, _| tids.contains(t));
        self.reach.retain(|t, _| tids.contains(t));
        for (pid, ts) in &threads {
            for tid in ts {
                if !self.files.contains_key(tid) {
                    if let Some(f) = ThreadFiles::open(*pid, *tid) {
                        self.files.insert(*tid, f);
                    }
                }
            }
        }
        self.threads = threads;
        self.sort_others();
    }

    /// Remember what the unwinding of a blocked read of `tid` used: the
    /// place (`nr`, `sp`, `pc`), the stack words read (offsets from `sp`
    /// into `stack`, the copy) and the frames found.
    pub fn learn(
        &mut self,
        tid: Tid,
        (nr, sp, pc): (i64, u64, u64),
        stack: &[u8],
        offsets: &mut Vec<u32>,
        frames: Arc<NativeFrames>,
    ) {
        offsets.sort_unstable();
        offsets.dedup();
        if let Some(&deepest) = offsets.last() {
            let r = self.reach.entry(tid).or_default();
            *r = (*r).max(deepest as usize + 8);
        }
        let mut words = Vec::with_capacity(offsets.len());
        for &o in offsets.iter() {
            let Some(b) = stack.get(o as usize..o as usize + 8) else {
                return;
            };
            words.push((o, u64::from_le_bytes(b.try_into().expect("8 bytes"))));
        }
        let known = self.known.entry(tid).or_default();
        known.retain(|k| (k.nr, k.sp, k.pc) != (nr, sp, pc));
        if known.len() >= KNOWN_PER_THREAD {
            known.remove(0);
        }
        known.push(KnownStack {
            nr,
            sp,
            pc,
            words,
            frames,
        });
    }

    /// Forget what was learned of a thread's stacks (the frames could not
    /// be reused: the process's code mappings changed).
    pub fn forget(&mut self, tid: Tid) {
        self.known.remove(&tid);
    }

    /// How many bytes of `tid`'s stack a look copies: what its unwinding
    /// reached so far and [`REACH_SLACK`] more, the whole stack size until
    /// a first unwinding has read it.
    fn copy_len(&self, tid: Tid) -> usize {
        match self.reach.get(&tid) {
            Some(&r) => (r + REACH_SLACK)
                .next_multiple_of(4096)
                .min(self.stack_size),
            None => self.stack_size,
        }
    }

    /// The stack size the unwinding may read (a copy shorter than this can
    /// be taken again whole).
    pub fn stack_size(&self) -> usize {
        self.stack_size
    }

    /// The whole stack of a blocked thread whose sized copy the unwinding
    /// ran off: copied again while the thread is still blocked as it was
    /// read (`read_as`), else `None` (it ran since: the look is dropped).
    /// Later copies of the thread are whole until an unwinding reads them.
    pub fn recopy(
        &mut self,
        pid: Pid,
        tid: Tid,
        sp: u64,
        read_as: &(String, u64),
    ) -> Option<Vec<u8>> {
        self.reach.remove(&tid);
        self.stats.recopied += 1;
        let stack = copy_memory(pid, sp, self.stack_size)?;
        self.stats.copies += 1;
        self.stats.copied_bytes += stack.len() as u64;
        let files = self.files.get(&tid)?;
        let same = files.syscall(&mut self.after)
            && self.after == read_as.0
            && files.runtime_ns() == Some(read_as.1);
        same.then_some(stack)
    }

    /// The frames of an earlier read of the same place whose stack words
    /// are unchanged.
    fn known_frames(&self, pid: Pid, tid: Tid, l: &SyscallLine) -> Option<Arc<NativeFrames>> {
        let k = self
            .known
            .get(&tid)?
            .iter()
            .find(|k| (k.nr, k.sp, k.pc) == (l.nr, l.sp, l.pc))?;
        words_unchanged(pid, k.sp, &k.words).then(|| k.frames.clone())
    }

    /// Look at some threads of one process: first read of each, stack
    /// copies, one Python read for the process, second read of each.
    fn look_at(&mut self, pid: Pid, tids: &[Tid], out: &mut Vec<WallRecord>) {
        let mut looks: Vec<Look> = Vec::new();
        for &tid in tids {
            self.stats.looks += 1;
            let t = MonoNs::now();
            let Some(files) = self.files.get(&tid) else {
                continue; // gone, or not opened yet
            };
            // Kept for the thread's record when it is blocked; a running
            // thread's (most looks at workers) goes back to the scratch.
            let mut before = std::mem::take(&mut self.before);
            if !files.syscall(&mut before) {
                self.before = before;
                self.files.remove(&tid);
                continue; // gone
            }
            let Some(line) = parse_syscall(&before) else {
                self.before = before;
                self.note(pid, tid, None);
                self.stats.running += 1;
                out.push(WallRecord::Running { pid, tid, t });
                continue;
            };
            let Some(runtime) = files.runtime_ns() else {
                self.files.remove(&tid);
                continue;
            };
            self.note(pid, tid, Some(runtime));
            if self
                .last
                .get(&tid)
                .is_some_and(|l| l.0 == runtime && l.1 == before)
            {
                self.before = before;
                self.stats.repeated += 1;
                out.push(WallRecord::Repeat { pid, tid, t });
                continue;
            }
            let known = self.known_frames(pid, tid, &line);
            let len = self.copy_len(tid);
            let stack = match known {
                Some(_) => Vec::new(),
                None => match copy_memory(pid, line.sp, len) {
                    Some(s) => {
                        self.stats.copies += 1;
                        self.stats.copied_bytes += s.len() as u64;
                        s
                    }
                    None => {
                        self.stats.raced += 1;
                        out.push(WallRecord::Raced { pid, tid, t });
                        continue;
                    }
                },
            };
            let fd_dir = self.fd_dirs.entry(pid).or_default();
            let marker = syscall_marker(line.nr, on_regular_file(pid, &line, fd_dir));
            looks.push(Look {
                tid,
                t,
                before,
                runtime,
                line,
                sized_copy: len < self.stack_size && stack.len() == len,
                stack,
                known,
                marker,
            });
        }
        if looks.is_empty() {
            return;
        }
        let blocked: Vec<Tid> = looks.iter().map(|l| l.tid).collect();
        self.spy_check = None;
        let (mut py, holder) = match self.python_frames(pid, &blocked) {
            Some((frames, holder)) => (Some(frames), holder),
            None => (None, None),
        };
        for look in looks {
            let (pid, tid, t) = (pid, look.tid, look.t);
            let same = self.files.get(&tid).is_some_and(|f| {
                f.syscall(&mut self.after)
                    && self.after == look.before
                    && f.runtime_ns() == Some(look.runtime)
            });
            if !same {
                self.stats.raced += 1;
                out.push(WallRecord::Raced { pid, tid, t });
                continue;
            }
            self.stats.blocked += 1;
            if look.known.is_some() {
                self.stats.reused += 1;
            }
            let read_as = (look.before.clone(), look.runtime);
            self.last.insert(tid, (look.runtime, look.before));
            let frames = py.as_mut().and_then(|m| m.remove(&tid));
            if self.py_source == PySource::Check {
                self.check_thread(tid, frames.as_ref());
            }
            if py.is_some() && frames.is_none() {
                self.stats.py_missing += 1;
            }
            let regs = regs_of(&look.line);
            out.push(WallRecord::Blocked(Box::new(Blocked {
                sample: Sample {
                    pid,
                    tid,
                    t,
                    regs: Some(regs),
                    ip: look.line.pc,
                    stack: look.stack,
                },
                marker: look.marker,
                py: frames,
                gil_holder: holder.filter(|h| h.0 != tid).map(|h| h.1),
                place: (look.line.nr, look.line.sp, look.line.pc),
                known: look.known,
                sized_copy: look.sized_copy,
                read_as,
            })));
        }
    }

    /// The Python frames (outermost first) of `tids` (py-spy: of every
    /// thread), by thread, when the process's frames can be read; and the
    /// thread holding the GIL, with its marker. With the agent's layout
    /// when the process has one, else (or when that read fails) py-spy.
    #[allow(clippy::type_complexity)]
    fn python_frames(
        &mut self,
        pid: Pid,
        tids: &[Tid],
    ) -> Option<(
        HashMap<Tid, Vec<(String, String, bool)>>,
        Option<(Tid, &'static str)>,
    )> {
        if self.py_source != PySource::Spy {
            self.find_reader(pid);
            if let Some(r) = self.readers.get_mut(&pid) {
                let t0 = crate::selfcost::thread_cpu_ns();
                let got = r.read(tids);
                if let (Some(a), Some(b)) = (t0, crate::selfcost::thread_cpu_ns()) {
                    self.stats.py_agent_ns += b.saturating_sub(a);
                }
                match got {
                    Ok(read) => {
                        self.stats.py_agent += 1;
                        let holder = read.holder.map(|(t, f)| {
                            let (name, file) = f
                                .as_ref()
                                .map_or(("?", "?"), |f| (f.0.as_str(), f.1.as_str()));
                            (t, gil_marker(t, name, file))
                        });
                        if self.py_source == PySource::Check {
                            self.check_against_spy(pid);
                        }
                        return Some((read.frames, holder));
                    }
                    Err(ReadError::Gone) => self.set_reader(pid, None),
                    Err(ReadError::Inconsistent) => self.stats.py_agent_failed += 1,
                }
                // py-spy reads this one: attached now if it was left for
                // the agent's reader.
                if let Some(Spy::Trying(n)) = self.spies.get_mut(&pid) {
                    *n += 1;
                    let attempt = *n;
                    let config = self.config.clone();
                    self.spies.insert(
                        pid,
                        match attach_spy(pid.0, &config) {
                            Ok(s) => Spy::Ready(Box::new(s)),
                            Err(_) if attempt >= ATTACH_ATTEMPTS => Spy::No,
                            Err(_) => Spy::Trying(attempt),
                        },
                    );
                }
            }
        }
        let t0 = crate::selfcost::thread_cpu_ns();
        let got = self.spy_frames(pid);
        if let (Some(a), Some(b)) = (t0, crate::selfcost::thread_cpu_ns()) {
            if got.is_some() {
                self.stats.py_spy += 1;
                self.stats.py_spy_ns += b.saturating_sub(a);
            }
        }
        got
    }

    /// Look for `pid`'s published layout when it has none yet, at most
    /// every [`FIND_EVERY`]: the agent makes its ring at the process's
    /// first sample, after the first listing of a new process.
    fn find_reader(&mut self, pid: Pid) {
        if self.readers.contains_key(&pid) || self.loops.get(&pid) != Some(&true) {
            return;
        }
        let Some(dir) = &self.ring_dir else {
            return;
        };
        let now = Instant::now();
        if self
            .reader_sought
            .get(&pid)
            .is_some_and(|t| now.duration_since(*t) < FIND_EVERY)
        {
            return;
        }
        self.reader_sought.insert(pid, now);
        if let Some(r) = PyReader::find(dir, pid) {
            self.set_reader(pid, Some(r));
        }
    }

    /// `GPUPROF_WALL_PY=check`: read py-spy's frames right after the
    /// agent-layout read, to be compared by [`check_thread`] for the
    /// threads that did not run in the meantime.
    ///
    /// [`check_thread`]: WallSampler::check_thread
    fn check_against_spy(&mut self, pid: Pid) {
        self.spy_check = self.spy_frames(pid).map(|(f, _)| f);
    }

    /// Compare the two readers' frames of a thread whose look held (it
    /// stayed blocked through both reads, so its frames did not move).
    fn check_thread(&mut self, tid: Tid, ours: Option<&PyFrames>) {
        let Some(theirs) = self.spy_check.as_ref().and_then(|m| m.get(&tid)) else {
            return;
        };
        self.stats.py_checked += 1;
        if ours != Some(theirs) {
            self.stats.py_differed += 1;
            if self.stats.py_differed <= 3 {
                eprintln!(
                    "gpuprof: thread {}: the agent-layout read gave {ours:?}, py-spy {theirs:?}",
                    tid.0
                );
            }
        }
    }

    /// Every thread's Python frames by py-spy, as [`python_frames`] gives
    /// them.
    ///
    /// [`python_frames`]: WallSampler::python_frames
    #[allow(clippy::type_complexity)]
    fn spy_frames(
        &mut self,
        pid: Pid,
    ) -> Option<(
        HashMap<Tid, Vec<(String, String, bool)>>,
        Option<(Tid, &'static str)>,
    )> {
        let Some(Spy::Ready(spy)) = self.spies.get_mut(&pid) else {
            return None;
        };
        // py-spy panics on some interpreter states (seen with torch's
        // 3.11 venv): that costs this process's py-spy reads, never the
        // perf reader thread and every stack after it.
        let Some(read) = crate::collect::quietly(|| spy.get_stack_traces()) else {
            self.spies.insert(pid, Spy::No);
            return None;
        };
        let traces = read.ok()?;
        let single = traces.len() == 1;
        let mut out = HashMap::default();
        let mut holder = None;
        for tr in traces {
            // Python ≥ 3.11 stores the OS thread id; before, a
            // single-threaded process is its main thread.
            let tid = match tr.os_thread_id {
                Some(id) => Tid(id as i32),
                None if single => Tid(pid.0),
                None => continue,
            };
            if tr.owns_gil {
                let f = tr.frames.first();
                holder = Some((
                    tid,
                    gil_marker(
                        tid,
                        f.map_or("?", |f| f.name.as_str()),
                        f.map_or("?", |f| f.filename.as_str()),
                    ),
                ));
            }
            let frames = tr
                .frames
                .iter()
                .rev()
                .map(|f| {
                    (
                        f.name.clone(),
                        f.filename.clone(),
                        f.is_entry || f.is_shim_entry,
                    )
                })
                .collect();
            out.insert(tid, frames);
        }
        Some((out, holder))
    }
}

/// The gap before the next tick: `interval` scaled by a draw in
/// [0.5, 1.5), so the mean stays `interval`. A training loop is periodic;
/// ticks at a fixed period that nearly divides the loop's would look at
/// the same few phases of every step and miss the rest (a 30 ms loop
/// looked at every 10.1 ms sweeps a third of its cycle in 2 s), biasing
/// every wait share. Each look still weighs the gap to the next one.
/// py-spy attached to `pid`; a panic inside py-spy (it reads another
/// process's interpreter state, which it may misjudge) is an attach that
/// failed, never the end of the sampler thread.
fn attach_spy(pid: i32, config: &Config) -> Result<PythonSpy, ()> {
    match crate::collect::quietly(|| PythonSpy::new(pid, config)) {
        Some(Ok(s)) => Ok(s),
        _ => Err(()),
    }
}

fn jittered(interval: Duration, draw: u64) -> Duration {
    let u = (crate::vocab::hash::splitmix64(draw) >> 11) as f64 / (1u64 << 53) as f64;
    interval.mul_f64(0.5 + u)
}

/// Write the hang report and say where each rank is stuck.
fn report_hang(job: Pid, stack_size: u32, after: Duration, path: &std::path::Path) {
    match super::dump::dump_with_summary(job, stack_size) {
        Ok((text, lines)) => {
            let head = format!(
                "gpuprof hang report: every loop thread blocked for at least {} s without running\n{}\n\n",
                after.as_secs(),
                lines.join("\n")
            );
            let written = std::fs::write(path, format!("{head}{text}"));
            eprintln!(
                "gpuprof: the job looks hung (every loop thread blocked {} s){}:",
                after.as_secs(),
                match written {
                    Ok(()) => format!("; stacks of every thread in {}", path.display()),
                    Err(e) => format!("; cannot write {}: {e}", path.display()),
                }
            );
            for l in lines {
                eprintln!("gpuprof:   {l}");
            }
        }
        Err(e) => eprintln!("gpuprof: the job looks hung, but its stacks could not be read: {e}"),
    }
}

/// The registers a perf sample would carry ([`super::ring::REGS_MASK`]
/// order). The frame pointer is not in the `syscall` file: the unwinder
/// starts from the stack pointer and program counter (DWARF rules recover
/// the frame pointer where a caller saved it).
fn regs_of(l: &SyscallLine) -> [u64; 4] {
    #[cfg(target_arch = "x86_64")]
    {
        [0, l.sp, l.pc, 0]
    }
    #[cfg(target_arch = "aarch64")]
    {
        // [fp, lr, sp, pc]: the link register is unknown.
        [0, 0, l.sp, l.pc]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop process (its main thread looked at every tick, never in
    /// the others' turns) with `h` other threads, and a worker process of
    /// `n` threads, over 400 ticks: with few, each other thread is looked
    /// at every OTHERS_EVERY ticks, as before the turns; with many, no tick
    /// looks at more than MAX_OTHER_LOOKS of the loop's and the workers'
    /// share one look every WORKER_TICKS_PER_LOOK ticks; every thread
    /// still gets its turns, evenly.
    #[test]
    fn other_threads_take_turns() {
        for (h, n) in [(1usize, 1usize), (5, 2), (20, 3), (60, 60), (0, 30)] {
            let mut w = WallSampler::new(Pid(1), 99, 4096);
            w.loops.insert(Pid(1), true);
            w.loops.insert(Pid(9), false);
            let mut loop_tids = vec![Tid(1)];
            loop_tids.extend((2..2 + h as i32).map(Tid));
            w.threads = vec![(Pid(1), loop_tids)];
            w.threads
                .push((Pid(9), (100..100 + n as i32).map(Tid).collect()));
            w.sort_others();
            let mut seen: HashMap<Tid, usize> = HashMap::default();
            let ticks = 400;
            for _ in 0..ticks {
                let turn = w.others_turn();
                let helpers = turn.iter().filter(|t| t.0 < 100).count();
                assert!(helpers <= MAX_OTHER_LOOKS, "{h}/{n}: {turn:?}");
                assert!(turn.len() - helpers <= 1, "{h}/{n}: {turn:?}");
                assert!(!turn.contains(&Tid(1)));
                for t in turn {
                    *seen.entry(t).or_default() += 1;
                }
            }
            let helper_each = (ticks * h / OTHERS_EVERY).min(ticks * MAX_OTHER_LOOKS) / h.max(1);
            let worker_each = (ticks * n / OTHERS_EVERY).min(ticks / WORKER_TICKS_PER_LOOK) / n;
            assert_eq!(seen.len(), h + n, "{h}/{n}: {seen:?}");
            for (t, k) in &seen {
                let per = if t.0 < 100 { helper_each } else { worker_each };
                assert!(k.abs_diff(per) <= 1, "{h}/{n}: {t:?} seen {k}, not ~{per}");
            }
        }
    }

    /// Ticks every ~10.1 ms on a loop whose period is three of them: each
    /// sixth of the loop's cycle gets its share of looks. Fixed ticks put
    /// every look in the same three phases, leaving half the bins empty.
    #[test]
    fn jittered_ticks_look_at_every_phase_of_a_periodic_loop() {
        let interval = Duration::from_nanos(10_101_010);
        let cycle = 3 * interval.as_nanos() as u64;
        for seed in [1u64, 0xdead_beef, 42 << 32] {
            let (mut t, mut bins) = (0u64, [0u32; 6]);
            for tick in 0..600u64 {
                t += jittered(interval, seed ^ tick).as_nanos() as u64;
                bins[(t % cycle * 6 / cycle) as usize] += 1;
            }
            assert!(bins.iter().all(|&n| (70..=130).contains(&n)), "{bins:?}");
            let mean = t as f64 / 600.0;
            assert!(
                (mean / interval.as_nanos() as f64 - 1.0).abs() < 0.05,
                "{mean}"
            );
        }
    }

    /// A thread of this process that blocks reading a pipe: its id, the
    /// pipe's read and write ends, and the thread (it returns what it read).
    fn reader_blocked_on_a_pipe() -> (Tid, i32, i32, std::thread::JoinHandle<isize>) {
        let mut fds = [0; 2];
        // SAFETY: fds is a valid array of two ints.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let (r, w) = (fds[0], fds[1]);
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            let mut b = [0u8; 1];
            // SAFETY: b is a valid one-byte buffer.
            unsafe { libc::read(r, b.as_mut_ptr().cast(), 1) }
        });
        (Tid(rx.recv().unwrap()), r, w, h)
    }

    #[test]
    fn a_blocked_thread_is_read_without_stopping_it() {
        let (tid, r, w, h) = reader_blocked_on_a_pipe();
        let pid = Pid(std::process::id() as i32);
        let files = ThreadFiles::open(pid, tid).expect("files open");
        let mut text = String::new();
        let mut line = None;
        // The same open files, read again and again.
        for _ in 0..500 {
            assert!(files.syscall(&mut text));
            line = parse_syscall(&text);
            if line.as_ref().is_some_and(|l| l.nr == libc::SYS_read) {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let line = line.expect("the thread blocks in read");
        assert_eq!(line.args[0], r as u64);
        assert!(
            !on_regular_file(pid, &line, &mut None),
            "a pipe is no regular file"
        );
        let runtime = files.runtime_ns().expect("schedstat");
        assert_eq!(files.runtime_ns(), Some(runtime), "it has not run");
        let stack = copy_memory(pid, line.sp, 4096).expect("stack readable");
        assert!(stack.len() >= 64);
        let word = |o: usize| u64::from_le_bytes(stack[o..o + 8].try_into().unwrap());
        // Adjacent and separate words, as an unwinding reads them.
        let words = [(0, word(0)), (8, word(8)), (48, word(48))];
        assert!(words_unchanged(pid, line.sp, &words));
        let changed = [(0, word(0)), (48, !word(48))];
        assert!(!words_unchanged(pid, line.sp, &changed));
        // SAFETY: w is the pipe's write end.
        unsafe { libc::write(w, b"x".as_ptr().cast(), 1) };
        assert_eq!(h.join().unwrap(), 1);
        // Gone: its open files fail to read.
        assert!(!files.syscall(&mut text));
        assert_eq!(files.runtime_ns(), None);
    }

    #[test]
    fn stack_copies_are_sized_by_the_unwinding_reach_and_taken_again_whole() {
        let (tid, _, wfd, h) = reader_blocked_on_a_pipe();
        let pid = Pid(std::process::id() as i32);
        let mut w = WallSampler::new(pid, 99, 32 * 1024);
        w.list();
        assert_eq!(
            w.copy_len(tid),
            32 * 1024,
            "whole until an unwinding read it"
        );
        // An unwinding that read 200 bytes deep: a page beyond, rounded.
        let mut offsets = vec![0, 8, 192];
        w.learn(
            tid,
            (0, 0, 0),
            &[0u8; 256],
            &mut offsets,
            Arc::new(NativeFrames {
                frames: Vec::new(),
                complete: true,
                maps: 0,
            }),
        );
        assert_eq!(w.copy_len(tid), 8192);
        let mut out = Vec::new();
        let blocked = (0..500).find_map(|_| {
            out.clear();
            w.last.clear();
            w.look_at(pid, &[tid], &mut out);
            match out.pop() {
                Some(WallRecord::Blocked(b)) if b.place.0 == libc::SYS_read => Some(b),
                _ => {
                    std::thread::sleep(Duration::from_millis(2));
                    None
                }
            }
        });
        let b = blocked.expect("the thread is read blocked in read");
        assert!(b.sample.stack.len() <= 8192 && b.sample.stack.len() >= 64);
        assert_eq!(b.sized_copy, b.sample.stack.len() == 8192);
        // Too short for a deeper stack: copied again whole while the thread
        // has not moved, and whole from then on.
        let whole = w
            .recopy(pid, tid, b.place.1, &b.read_as)
            .expect("still blocked");
        assert!(whole.len() >= b.sample.stack.len());
        assert_eq!(whole[..64], b.sample.stack[..64]);
        assert_eq!(w.copy_len(tid), 32 * 1024);
        assert_eq!(w.stats.recopied, 1);
        // Once it ran, a copy is refused: it would mix two moments.
        // SAFETY: wfd is the pipe's write end.
        unsafe { libc::write(wfd, b"x".as_ptr().cast(), 1) };
        assert_eq!(h.join().unwrap(), 1);
        assert_eq!(w.recopy(pid, tid, b.place.1, &b.read_as), None);
    }
}
