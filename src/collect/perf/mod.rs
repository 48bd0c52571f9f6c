//! Native stack sampling of the whole job with perf events.
//!
//! [`open`] is called between fork and exec of the job (see
//! [`crate::launch`]): one disabled `cpu-clock` event per CPU on the job's
//! pid, inherited by everything it forks, enabled by the kernel at exec.
//! [`PerfSampler::start`] then runs a reader thread that drains the rings,
//! orders records by time across CPUs, unwinds each sample with framehop,
//! interns the stacks and sends compact events to the recording.
//! Every new frame is named by blazesym on a thread of its own within a
//! fraction of a second (see [`symbolize`]) and the names go into the recording,
//! so `gpuprof report` needs nothing else, even when gpuprof was killed.
//! [`PerfSampler::stop`] (after the job ended) drains what is left and names
//! the last frames.

mod agent;
mod dump;
pub mod offcpu;
mod options;
mod perfmap;
pub mod pyagent;
pub mod pylines;
mod pyread;
mod ring;
mod sample;
mod symbolize;
mod syscall;
mod unwind;
pub mod verdicts;

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use dump::dump;
pub use options::{PerfOptions, PythonFrames, SamplerChoice};
pub use ring::{
    online_cpus, parse_cpu_list, perf_event_paranoid, refusal_advice_then, ring_bytes_for,
    OpenError,
};
pub use verdicts::AgentVerdicts;

use nix::sys::eventfd::{EfdFlags, EventFd};

use agent::Agent;

use crate::collect::intern::Interner;
use crate::collect::TreeNews;
use crate::event::{Coverage, Event, MonoNs, Pid, SampleSource, StackKind, StackStats, Tid};
use crate::record::Sink;
use crate::vocab::coverage;
use crate::vocab::stacks::{
    agent_covers, MARKER_NOT_UNWOUND, MARKER_ON_CPU, MARKER_RACED, MARKER_TRUNCATED,
    MARKER_UNREADABLE, SAMPLER_PERF, SAMPLER_TIMER,
};
use pyagent::{AgentRecord, AgentRings, Note, PyStatus};
use ring::{Record, Rings};
use unwind::{Files, ProcessMaps, UnwindCache};

/// Default and limits of the sampling settings.
pub const DEFAULT_FREQUENCY: u64 = 99;
pub const MAX_FREQUENCY: u64 = 1000;
pub const DEFAULT_STACK_SIZE: u32 = 32 * 1024;

/// Records younger than this are held back so that records of other CPUs
/// with earlier times can still arrive and be ordered before them.
const REORDER_WINDOW_NS: u64 = 10_000_000;
/// The reader's pace when nothing asks for more: the kernel also wakes it
/// when half a ring's worth of records was written (`wakeup_watermark`),
/// so a busy ring is drained sooner. Each wake-up costs the reader ~35 µs
/// on a VM (a fifth of its work on a loader job at 24 wake-ups a second).
const POLL_TIMEOUT_MS: i32 = 100;
/// With agents writing rings (which cannot wake the reader), drain more
/// often while they are busy or new (`AgentRings::eager`) ...
const AGENT_POLL_TIMEOUT_MS: i32 = 20;
/// ... and otherwise at perf's own pace.
const AGENT_SLOW_POLL_MS: i32 = POLL_TIMEOUT_MS;

/// The in-process agent's side of a recording: where its rings are.
#[derive(Clone, Debug)]
pub struct AgentLink {
    pub ring_dir: PathBuf,
    /// What the agent said of each process, for the py-spy sampler.
    pub verdicts: Arc<AgentVerdicts>,
}

/// Events opened on the (not yet exec'd) job, or on a running tree.
pub struct Opened {
    rings: Rings,
    job: Pid,
    opts: PerfOptions,
    attached: Option<Attached>,
    /// The events stay off until the recording window opens (`--delay`).
    off: bool,
    /// No perf events: the agents' CPU-time timers sample the job (see
    /// [`timer_only`]); why.
    timer: Option<String>,
}

/// Sampling a tree that already ran when the events were opened.
struct Attached {
    cpus: Vec<usize>,
    ring_opts: ring::OpenOptions,
    /// Threads that carry an event of their own (inherited ones do not).
    covered: std::collections::HashSet<Tid>,
    /// Threads the kernel reported as created by a thread with an event:
    /// they inherited it.
    forked: std::collections::HashSet<Tid>,
    opened_at: Instant,
    catch_ups: u32,
}

/// Every thread of `root` and of the processes below it, main threads first.
pub fn tree_threads(root: Pid) -> Vec<Tid> {
    let mut pids = vec![root.0];
    pids.extend(crate::collect::python::descendants(root.0));
    let mut out = Vec::new();
    for pid in pids {
        out.push(Tid(pid));
        if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            let mut tids: Vec<i32> = rd
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .filter(|&t| t != pid)
                .collect();
            tids.sort_unstable();
            out.extend(tids.into_iter().map(Tid));
        }
    }
    out
}

/// Open sampling events on the running process `root` and everything below
/// it (`gpuprof attach`): per thread and CPU, enabled at once, inherited by
/// what those threads create from now on. Threads created while the events
/// were being opened are caught up by the reader.
pub fn open_attached(root: Pid, opts: &PerfOptions) -> Result<Opened, OpenError> {
    opts.validate().map_err(|m| OpenError {
        message: m,
        errno: None,
    })?;
    let cpus = online_cpus();
    let ring_opts = ring::OpenOptions {
        frequency: opts.frequency,
        stack_size: opts.stack_size,
        ring_bytes: ring_bytes_for(opts.frequency, opts.stack_size),
    };
    let tids = tree_threads(root);
    let (rings, covered) = ring::open_on_threads(&tids, &cpus, &ring_opts)?;
    Ok(Opened {
        rings,
        job: root,
        opts: opts.clone(),
        attached: Some(Attached {
            cpus,
            ring_opts,
            covered: covered.into_iter().collect(),
            forked: Default::default(),
            opened_at: Instant::now(),
            catch_ups: 0,
        }),
        off: false,
        timer: None,
    })
}

/// Open the sampling events on `job`, which must be forked but not yet
/// exec'd: turned on by its exec, or (`!at_exec`) once the reader is told
/// that the recording window opened. On refusal the error's message is one
/// line with the fix.
pub fn open(job: Pid, opts: &PerfOptions, at_exec: bool) -> Result<Opened, OpenError> {
    opts.validate().map_err(|m| OpenError {
        message: m,
        errno: None,
    })?;
    let cpus = online_cpus();
    let ring_bytes = ring_bytes_for(opts.frequency, opts.stack_size);
    let rings = ring::open(
        job,
        &cpus,
        &ring::OpenOptions {
            frequency: opts.frequency,
            stack_size: opts.stack_size,
            ring_bytes,
        },
        at_exec,
    )?;
    Ok(Opened {
        rings,
        job,
        opts: opts.clone(),
        attached: None,
        off: !at_exec,
        timer: None,
    })
}

/// No perf events on `job`: its threads sample themselves, each on its own
/// CPU-time clock, in the agent preloaded into it (the agent's timer
/// sampler), and the reader drains the agents' rings alone. `why`: what the
/// coverage entry says of the choice (perf refused, or `--sampler timer`).
pub fn timer_only(job: Pid, opts: &PerfOptions, why: String) -> Opened {
    Opened {
        rings: Rings {
            samplers: Vec::new(),
            ring_bytes: 0,
            followers: Vec::new(),
        },
        job,
        opts: opts.clone(),
        attached: None,
        off: false,
        timer: Some(why),
    }
}

/// Why this process may not open a sampling perf event on itself, if it
/// may not.
pub fn self_sampling_refusal() -> Option<std::io::Error> {
    let mut b = perf_event::Builder::new(perf_event::events::Software::CPU_CLOCK);
    b.observe_self()
        .any_cpu()
        .enabled(false)
        .exclude_kernel(true)
        .exclude_hv(true)
        .sample_period(10_000_000);
    b.build().err()
}

/// Whether this process may open a sampling perf event on itself (what the
/// in-process agent will do in the job's processes).
pub fn self_sampling_allowed() -> bool {
    self_sampling_refusal().is_none()
}

/// The coverage entry for a refused or failed `open`.
pub fn refused_coverage(err: &OpenError) -> Coverage {
    Coverage {
        source: coverage::NATIVE_STACKS.into(),
        available: false,
        detail: err.message.clone(),
    }
}

/// The running reader thread.
pub struct PerfSampler {
    stop: Arc<AtomicBool>,
    /// In the reader's poll set: stopping wakes it at once rather than at
    /// its next poll timeout (the end of a short run waits for it).
    wake: Arc<EventFd>,
    thread: std::thread::JoinHandle<StackStats>,
}

impl PerfSampler {
    /// Start reading the rings. Call before releasing the job.
    /// `news` is bumped on every new process, exec and executable mapping.
    /// `active`: the recording window is open; events opened off are
    /// turned on once it is.
    pub fn start(
        opened: Opened,
        sink: Sink,
        news: Arc<TreeNews>,
        agent: Option<AgentLink>,
        active: Arc<AtomicBool>,
    ) -> std::io::Result<PerfSampler> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let wake = Arc::new(
            EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .map_err(std::io::Error::from)?,
        );
        let wake2 = wake.clone();
        let thread = std::thread::Builder::new()
            .name("gpuprof-perf".into())
            .spawn(move || {
                let _cost = crate::selfcost::Charge::new("perf reader");
                let off = opened.off;
                let mut r = Reader::new(opened, sink, news, agent);
                if off && !r.wait_for_window(&active, &stop2) {
                    return r.finish();
                }
                r.run(&stop2, &wake2);
                r.finish()
            })?;
        Ok(PerfSampler { stop, wake, thread })
    }

    /// Tell the reader to finish without waiting for it (see
    /// [`PerfSampler::stop`]), so that it drains while other collectors
    /// stop too.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.wake.write(1);
        self.thread.thread().unpark();
    }

    /// The job ended: drain the rings, symbolize, write the names and the
    /// counters into the recording, and return the counters.
    pub fn stop(self) -> StackStats {
        self.request_stop();
        self.thread.join().unwrap_or_else(|_| StackStats {
            kind: Some(StackKind::Native),
            detail: "the perf reader thread panicked; native stacks are incomplete".into(),
            ..Default::default()
        })
    }
}

/// Ancestors whose perf maps a process first seen by a sample takes (a
/// DataLoader worker's parent is the job's main process; deeper chains are
/// workers of workers).
const MAX_ANCESTOR_MAPS: usize = 8;

/// A process's own perf map, for a process started at `t` (None: unknown).
fn own_perf_map(pid: Pid, t: Option<MonoNs>) -> perfmap::SharedMap {
    perfmap::PerfMap::shared(perfmap::map_path(pid), t.map(perfmap::wall_time_of))
}

/// A frame of a native stack: an instruction (file, offset), a Python
/// function of a same-instant sample (name id of the agent rings, entry),
/// or a marker saying why Python frames are missing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum FrameKey {
    Native(u32, u64),
    /// (name id, entry frame, line: 0 when it could not be decoded).
    Py(u32, bool, u32),
    /// A Python function read with py-spy for a blocked thread (index into
    /// the reader's `py_names`, entry).
    PyNamed(u32, bool),
    Marker(&'static str),
}

struct Reader {
    rings: Rings,
    job: Pid,
    opts: PerfOptions,
    sink: Sink,
    procs: HashMap<Pid, ProcessMaps>,
    files: Files,
    paths: Vec<String>,
    cache: UnwindCache,
    interner: Interner<FrameKey>,
    agent: Option<Agent>,
    unknown_file: u32,
    pending: Vec<Record>,
    stats: StackStats,
    busy: Duration,
    keys_buf: Vec<FrameKey>,
    /// The one-frame stack of a `covered_sample`, once interned.
    not_unwound: Option<u32>,
    news: Arc<TreeNews>,
    attached: Option<Attached>,
    /// Names of sampled JIT frames, from perf maps: (file, address) → name.
    jit_names: HashMap<(u32, u64), Arc<str>>,
    /// Counts samples: perf maps are read at most once per sample.
    sample_gen: u64,
    symbols: symbolize::Streamer,
    wall: Option<offcpu::WallSampler>,
    /// Per thread, the stack of its last blocked wall-clock sample.
    wall_last: HashMap<Tid, (u32, bool)>,
    /// Scratch: the stack words read unwinding a wall-clock sample.
    wall_reads: Vec<u32>,
    /// Python functions of blocked threads: (name, file), and their index.
    py_names: Vec<(String, String)>,
    py_name_ids: HashMap<(String, String), u32>,
    /// The agents' timers sample the job, no perf events (why).
    timer: Option<String>,
    /// Timer sampler: when each process's /proc maps were last read. No
    /// MMAP2 records tell of libraries loaded later, so a sample that
    /// leaves a known mapping has them read again, at most this often.
    maps_read: HashMap<Pid, Instant>,
    /// Timer sampler: processes found gone at the last sweep (their maps
    /// go at the next one, when no sample of theirs can still be pending).
    gone: Vec<Pid>,
    last_sweep: Instant,
    /// Timer sampler: periods that came merged into another's signal.
    stats_overruns: u64,
}

/// Most periods one timer sample stands for (a thread stopped for a long
/// time, then resumed, is not charged for more).
const MAX_OVERRUN: u32 = 1000;

/// How often a process's /proc maps may be read again (timer sampler).
const MAPS_REREAD: Duration = Duration::from_millis(200);

/// After attaching, the tree is listed again this long after the events
/// were opened (and twice as long, and so on), to give threads that were
/// created meanwhile by a thread without an event one of their own.
const CATCH_UP_AFTER: Duration = Duration::from_millis(100);
const CATCH_UP_PASSES: u32 = 3;

/// Have a newly interned native frame named: from its perf map (JIT code)
/// or by the symbolizer thread.
fn queue_name(
    symbols: &symbolize::Streamer,
    paths: &[String],
    jit: &HashMap<(u32, u64), Arc<str>>,
    id: u32,
    file: u32,
    offset: u64,
) {
    if let Some(name) = jit.get(&(file, offset)) {
        symbols.add_named(id, name);
    } else if let Some(path) = paths.get(file as usize) {
        symbols.add(id, path, offset);
    }
}

fn frame_event(
    id: u32,
    key: &FrameKey,
    rings: Option<&AgentRings>,
    py_names: &[(String, String)],
) -> Event {
    match *key {
        FrameKey::PyNamed(i, entry) => {
            let (name, file) = &py_names[i as usize];
            Event::InlinePyFrame {
                id,
                name: name.clone(),
                file: file.clone(),
                entry,
                // py-spy's read of a blocked thread: by function only.
                line: None,
            }
        }
        FrameKey::Native(file, offset) => Event::NativeFrame { id, file, offset },
        FrameKey::Py(name, entry, line) => {
            let (name, file) = rings.expect("agent frames come with the agent").name(name);
            Event::InlinePyFrame {
                id,
                name: name.to_string(),
                file: file.to_string(),
                entry,
                line: Some(line),
            }
        }
        FrameKey::Marker(m) => Event::StackMarker {
            id,
            marker: m.to_string(),
        },
    }
}

impl Reader {
    fn new(opened: Opened, sink: Sink, news: Arc<TreeNews>, agent: Option<AgentLink>) -> Reader {
        let mut files = Files::default();
        let unknown_file = files.id_of("[unknown]");
        let mut wall =
            offcpu::WallSampler::new(opened.job, opened.opts.frequency, opened.opts.stack_size);
        if let (Some(after), Some(dir)) = (opened.opts.hang_after, &opened.opts.hang_dir) {
            wall.watch_hangs(after, dir.clone());
        }
        if let Some(a) = &agent {
            wall.read_agent_layouts(a.ring_dir.clone(), a.verdicts.clone());
        }
        let wall = Some(wall);
        let mut r = Reader {
            rings: opened.rings,
            job: opened.job,
            opts: opened.opts,
            procs: HashMap::default(),
            files,
            paths: Vec::new(),
            cache: UnwindCache::default(),
            interner: Interner::new(StackKind::Native),
            agent: agent.map(|a| Agent {
                rings: AgentRings::new(a.ring_dir),
                verdicts: a.verdicts,
                counts: HashMap::default(),
                procs: BTreeMap::new(),
                buf: Vec::new(),
                last_reap: Instant::now(),
            }),
            unknown_file,
            pending: Vec::new(),
            stats: StackStats {
                kind: Some(StackKind::Native),
                ..Default::default()
            },
            busy: Duration::ZERO,
            keys_buf: Vec::with_capacity(64),
            not_unwound: None,
            news,
            attached: opened.attached,
            jit_names: HashMap::default(),
            sample_gen: 0,
            symbols: symbolize::Streamer::start(sink.clone()),
            wall,
            wall_last: HashMap::default(),
            wall_reads: Vec::new(),
            py_names: Vec::new(),
            py_name_ids: HashMap::default(),
            sink,
            timer: opened.timer,
            maps_read: HashMap::default(),
            gone: Vec::new(),
            last_sweep: Instant::now(),
            stats_overruns: 0,
        };
        r.announce_files();
        r
    }

    fn announce_files(&mut self) {
        for (id, path) in self.files.new.drain(..) {
            debug_assert_eq!(id as usize, self.paths.len());
            self.paths.push(path.clone());
            self.sink.send_blocking(Event::StackFile { id, path });
        }
    }

    /// Events opened off: wait for the recording window, then turn them
    /// on. False when told to stop first (or they cannot be turned on,
    /// which is said as coverage).
    fn wait_for_window(&mut self, active: &AtomicBool, stop: &AtomicBool) -> bool {
        while !active.load(Ordering::Acquire) {
            if stop.load(Ordering::Acquire) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(POLL_TIMEOUT_MS as u64 / 2));
        }
        if let Err(e) = self.rings.enable() {
            self.sink.send_blocking(Event::Coverage(Coverage {
                source: coverage::NATIVE_STACKS.into(),
                available: false,
                detail: format!("cannot turn the perf events on when the recording window opened: {e}; no native stacks"),
            }));
            return false;
        }
        true
    }

    fn run(&mut self, stop: &AtomicBool, wake: &EventFd) {
        let n = self.rings.samplers.len();
        let mut hung_up = vec![false; n];
        loop {
            let stopping = stop.load(Ordering::Acquire);
            let drain_start = MonoNs::now();
            let work = Instant::now();
            self.drain(stopping);
            if !stopping {
                if let Some(w) = self.wall.as_mut() {
                    let mut looks = Vec::new();
                    w.tick(&mut looks);
                    self.pending.extend(looks.into_iter().map(Record::Wall));
                }
            }
            let horizon = if stopping {
                MonoNs(u64::MAX)
            } else {
                MonoNs(drain_start.0.saturating_sub(REORDER_WINDOW_NS))
            };
            self.process_until(horizon);
            if !stopping {
                self.catch_up();
                self.sweep_gone();
            }
            self.interner
                .flush(if stopping { None } else { Some(drain_start) }, &self.sink);
            self.busy += work.elapsed();
            if stopping {
                break;
            }
            // Wait for data on the rings that can still get some. A ring
            // whose task has exited signals POLLHUP forever: leave it out of
            // the poll set (it is still drained), or this would spin.
            let mut fds: Vec<libc::pollfd> = Vec::with_capacity(n + 1);
            let mut idx = Vec::with_capacity(n);
            for (i, s) in self.rings.samplers.iter().enumerate() {
                if !hung_up[i] {
                    fds.push(libc::pollfd {
                        fd: s.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    });
                    idx.push(i);
                }
            }
            let timeout = match &self.agent {
                Some(a) if a.rings.eager() => AGENT_POLL_TIMEOUT_MS,
                Some(_) => AGENT_SLOW_POLL_MS,
                None => POLL_TIMEOUT_MS,
            };
            // Wake for the wall-clock sampler's next tick.
            let timeout = match &self.wall {
                Some(w) => timeout.min(w.due_in().as_millis() as i32 + 1),
                None => timeout,
            };
            // Last: the ring indices above stay those of `idx`.
            fds.push(libc::pollfd {
                fd: wake.as_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            // SAFETY: fds is a valid array of pollfd of the given length.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if rc > 0 {
                for (f, i) in fds.iter().zip(&idx) {
                    if f.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                        hung_up[*i] = true;
                    }
                }
            }
        }
    }

    /// Move every available record out of the rings (the agents' too).
    /// A perf sample of a thread the agent keeps up with is decided here,
    /// before its stack (up to `--stack-size` bytes) is copied: the copy
    /// would be CPU taken from the job for nothing.
    fn drain(&mut self, last: bool) {
        let nregs = ring::REGS_MASK.count_ones() as usize;
        let Reader {
            rings,
            agent,
            pending,
            wall,
            ..
        } = self;
        for s in rings.samplers.iter_mut() {
            while let Some(rec) = s.next_record() {
                let body = rec.to_contiguous();
                if let (Some(a), Some((pid, tid, t))) =
                    (agent.as_mut(), ring::sample_head(rec.ty(), &body))
                {
                    if a.keeps_up(pid, tid) {
                        pending.push(Record::Covered { pid, tid, t });
                        continue;
                    }
                }
                if let Some(r) = ring::parse(rec.ty(), rec.misc(), &body, nregs) {
                    if let Record::Comm {
                        pid, exec: true, ..
                    } = &r
                    {
                        // A new program: the agent's verdict on the old one
                        // no longer holds for the samples read after this,
                        // nor the wall-clock sampler's on whether it runs a
                        // training loop.
                        if let Some(a) = agent.as_ref() {
                            a.verdicts.forget(*pid);
                        }
                        if let Some(w) = wall.as_mut() {
                            w.exec(*pid);
                        }
                    }
                    pending.push(r);
                }
            }
        }
        if let Some(a) = agent.as_mut() {
            a.rings.drain(&mut a.buf, last);
            if a.last_reap.elapsed() >= Duration::from_secs(1) {
                a.rings.reap(&mut a.buf);
                a.last_reap = Instant::now();
            }
            for (ring, rec) in a.buf.drain(..) {
                if let AgentRecord::Sample(smp) = &rec {
                    let key = (smp.native.pid, smp.native.tid);
                    a.counts.entry(key).or_default().agent += 1;
                }
                pending.push(Record::Agent { ring, rec });
            }
        }
    }

    /// Attach mode: give threads that appeared while the events were being
    /// opened, and did not inherit one (no FORK record from a thread with an
    /// event), their own events.
    fn catch_up(&mut self) {
        let job = self.job;
        let Some(a) = self.attached.as_mut() else {
            return;
        };
        if a.catch_ups >= CATCH_UP_PASSES
            || a.opened_at.elapsed() < CATCH_UP_AFTER * (1 << a.catch_ups)
        {
            return;
        }
        a.catch_ups += 1;
        for r in &self.pending {
            if let Record::Fork { tid, .. } = r {
                a.forked.insert(*tid);
            }
        }
        let missed: Vec<Tid> = tree_threads(job)
            .into_iter()
            .filter(|t| !a.covered.contains(t) && !a.forked.contains(t))
            .collect();
        if !missed.is_empty() {
            let added = ring::add_threads(&mut self.rings, &missed, &a.cpus, &a.ring_opts);
            a.covered.extend(added);
        }
    }

    fn process_until(&mut self, horizon: MonoNs) {
        if self.pending.is_empty() {
            return;
        }
        // Stable: records of one ring keep their order at equal times.
        self.pending.sort_by_key(|r| r.time());
        let cut = self.pending.partition_point(|r| r.time() < horizon);
        let ready: Vec<Record> = self.pending.drain(..cut).collect();
        for r in ready {
            self.process(r);
        }
    }

    fn process(&mut self, r: Record) {
        match r {
            Record::Sample(s) => self.sample(s),
            Record::Wall(w) => self.wall_record(w),
            Record::Covered { pid, tid, t } => self.covered_sample(pid, tid, t),
            Record::Mmap2(m) => {
                let pm = self.procs.entry(m.pid).or_default();
                pm.add(&mut self.files, &m);
                self.announce_files();
                self.news.mappings.fetch_add(1, Ordering::Release);
            }
            Record::Comm {
                pid,
                tid,
                t,
                comm,
                exec,
            } => {
                if exec {
                    // A new program: its mappings follow this record.
                    let mut pm = ProcessMaps::default();
                    pm.jit.push(own_perf_map(pid, Some(t)));
                    self.procs.insert(pid, pm);
                    if let Some(a) = self.agent.as_mut() {
                        a.verdicts.forget(pid);
                        a.rings.expect();
                    }
                    self.news.new_process();
                }
                self.sink.send_blocking(Event::TaskComm {
                    t,
                    pid,
                    tid,
                    comm,
                    exec,
                });
            }
            Record::Fork {
                pid,
                ppid,
                tid,
                ptid,
                t,
            } => {
                if let Some(a) = self.attached.as_mut() {
                    a.forked.insert(tid);
                }
                if pid.0 == tid.0 && pid != ppid {
                    self.news.new_process();
                    if let Some(a) = self.agent.as_mut() {
                        a.rings.expect();
                    }
                    if let Some(parent) = self.procs.get(&ppid) {
                        // The child runs its parent's code, JIT code too,
                        // and names new JIT code in a map of its own.
                        let mut copy = parent.clone();
                        copy.jit.insert(0, own_perf_map(pid, Some(t)));
                        self.procs.insert(pid, copy);
                    }
                }
                self.sink.send_blocking(Event::TaskFork {
                    t,
                    pid,
                    tid,
                    ppid,
                    ptid,
                });
            }
            Record::Exit { pid, tid, t } => {
                if let Some(a) = self.agent.as_mut() {
                    a.counts.remove(&(pid, tid));
                }
                if pid.0 == tid.0 {
                    self.procs.remove(&pid);
                    if let Some(a) = &self.agent {
                        a.verdicts.forget(pid);
                    }
                }
                self.sink.send_blocking(Event::TaskExit { t, pid, tid });
            }
            Record::Lost { lost, .. } => {
                self.stats.lost_records += lost;
            }
            Record::Agent { ring, rec } => self.agent_record(ring, rec),
        }
    }

    /// The maps of `pid`, before one of its samples is unwound. A process
    /// the records have not introduced (forked before the events were on,
    /// as under `gpuprof attach`, or its FORK record lost) is read from
    /// /proc: its mappings, its own perf map, and those of the processes it
    /// was forked from. A forked child runs JIT code that its parent made
    /// before the fork (CPython's perf trampolines), named only in the
    /// parent's map: without it, the child's every stack stopped at the
    /// first trampoline (unwind coverage 0.34 attached to a job with two
    /// forked workers).
    fn prepare_maps(&mut self, pid: Pid) {
        let pm = self.procs.entry(pid).or_default();
        if pm.is_empty() && !pm.seeded {
            pm.seeded = true;
            for m in unwind::proc_maps(pid) {
                pm.add(&mut self.files, &m);
            }
        }
        if !pm.jit.is_empty() {
            return;
        }
        pm.jit.push(own_perf_map(pid, None));
        let inherited = self.ancestors_maps(pid);
        if let Some(pm) = self.procs.get_mut(&pid) {
            pm.jit.extend(inherited);
        }
    }

    /// The perf maps of the processes `pid` was forked from, nearest first:
    /// a parent the reader knows brings its own list (itself and its
    /// ancestors); otherwise each ancestor's map file, while there is one.
    /// Its own entries come first, so an address it named itself is never
    /// named from a parent's map.
    fn ancestors_maps(&self, pid: Pid) -> Vec<perfmap::SharedMap> {
        use crate::collect::procfs::{start_mono, TaskStat};
        let mut out = Vec::new();
        let mut st = TaskStat::read(pid.0);
        for _ in 0..MAX_ANCESTOR_MAPS {
            let Some(ppid) = st.as_ref().map(|s| s.ppid).filter(|p| *p > 1).map(Pid) else {
                break;
            };
            if let Some(p) = self.procs.get(&ppid).filter(|p| !p.jit.is_empty()) {
                out.extend(p.jit.iter().cloned());
                break;
            }
            if !std::path::Path::new(&perfmap::map_path(ppid)).exists() {
                break;
            }
            // Its start tells its map from one left by an earlier process
            // with its pid; its parent is the next step up.
            st = TaskStat::read(ppid.0);
            out.push(own_perf_map(
                ppid,
                st.as_ref().map(|s| start_mono(s.starttime)),
            ));
        }
        out
    }

    /// Timer sampler: no EXIT records say when a process is gone, so every
    /// few seconds the maps of processes gone since the sweep before are
    /// dropped (a job that starts thousands of short processes would keep
    /// them all).
    fn sweep_gone(&mut self) {
        const EVERY: Duration = Duration::from_secs(5);
        if self.timer.is_none() || self.last_sweep.elapsed() < EVERY {
            return;
        }
        self.last_sweep = Instant::now();
        for pid in std::mem::take(&mut self.gone) {
            self.procs.remove(&pid);
            self.maps_read.remove(&pid);
        }
        self.gone = self
            .procs
            .keys()
            .filter(|p| !std::path::Path::new(&format!("/proc/{}", p.0)).exists())
            .copied()
            .collect();
    }

    /// Timer sampler: read `pid`'s mappings from /proc again (a library
    /// loaded since), unless that was done less than [`MAPS_REREAD`] ago.
    fn reread_maps(&mut self, pid: Pid) -> bool {
        let now = Instant::now();
        if self
            .maps_read
            .get(&pid)
            .is_some_and(|t| now.duration_since(*t) < MAPS_REREAD)
        {
            return false;
        }
        self.maps_read.insert(pid, now);
        let pm = self.procs.entry(pid).or_default();
        for m in unwind::proc_maps(pid) {
            pm.add(&mut self.files, &m);
        }
        pm.seeded = true;
        true
    }

    fn sample(&mut self, s: sample::Sample) {
        self.stats.samples += 1;
        if let Some(a) = self.agent.as_mut() {
            if a.verdicts.get(s.pid).is_none() {
                // Running, and not heard from: its agent makes its ring at
                // its first sample, so look for it at the quicker pace.
                a.rings.look_soon();
            }
        }
        self.sample_gen += 1;
        self.prepare_maps(s.pid);
        let pm = self.procs.get_mut(&s.pid).expect("prepared");
        let files = &mut self.files;
        let Some(u) = unwind::unwind(
            pm,
            &mut self.cache,
            &s,
            self.unknown_file,
            self.sample_gen,
            &mut |path| files.id_of_text(path),
        ) else {
            self.stats.no_user_regs += 1;
            return;
        };
        for (i, _, e) in &u.jit {
            self.jit_names
                .entry(u.frames[*i])
                .or_insert_with(|| e.name.clone());
        }
        self.announce_files();
        if !u.complete {
            self.stats.truncated += 1;
        }
        self.keys_buf.clear();
        self.keys_buf.extend(
            u.frames
                .iter()
                .rev()
                .map(|&(file, offset)| FrameKey::Native(file, offset)),
        );
        let (symbols, paths, jit) = (&self.symbols, &self.paths, &self.jit_names);
        let stack = self
            .interner
            .stack_of(s.tid, &self.keys_buf, &self.sink, |id, k| {
                let FrameKey::Native(file, offset) = *k else {
                    unreachable!("perf samples have native frames only")
                };
                queue_name(symbols, paths, jit, id, file, offset);
                Event::NativeFrame { id, file, offset }
            });
        if let Some(stack) = stack {
            self.interner
                .sample(s.pid, s.tid, s.t, stack, u.complete, &self.sink);
        }
    }

    /// A wall-clock look at a thread, as a sample of the `Wall` source:
    /// the blocked thread's Python frames, its native stack and a marker
    /// naming its system call; a one-marker stack when it was on a CPU or
    /// its read was dropped.
    fn wall_record(&mut self, w: offcpu::WallRecord) {
        use offcpu::WallRecord as W;
        let (pid, tid, t, marker) = match &w {
            W::Running { pid, tid, t } => (*pid, *tid, *t, MARKER_ON_CPU),
            W::Raced { pid, tid, t } => (*pid, *tid, *t, MARKER_RACED),
            W::Repeat { pid, tid, t } => match self.wall_last.get(tid) {
                Some(&(stack, complete)) => {
                    self.interner.sample_from(
                        SampleSource::Wall,
                        *pid,
                        *tid,
                        *t,
                        stack,
                        complete,
                        &self.sink,
                    );
                    return;
                }
                None => (*pid, *tid, *t, MARKER_RACED),
            },
            W::Blocked(_) => (Pid(0), Tid(0), MonoNs(0), ""),
        };
        let W::Blocked(mut b) = w else {
            self.wall_marker(pid, tid, t, marker);
            return;
        };
        let (pid, tid, t) = (b.sample.pid, b.sample.tid, b.sample.t);
        self.sample_gen += 1;
        self.prepare_maps(pid);
        let pm = self.procs.get_mut(&pid).expect("prepared");
        let native = match b.known {
            Some(k) if k.maps == pm.version() => k,
            Some(_) => {
                // Mapped code changed since those frames were found, and
                // this read has no stack copy to unwind: it is dropped.
                if let Some(w) = self.wall.as_mut() {
                    w.forget(tid);
                }
                self.wall_marker(pid, tid, t, MARKER_RACED);
                return;
            }
            None => {
                let mut recopied = false;
                let u = loop {
                    let files = &mut self.files;
                    self.wall_reads.clear();
                    let Some(u) = unwind::unwind_noting(
                        pm,
                        &mut self.cache,
                        &b.sample,
                        self.unknown_file,
                        self.sample_gen,
                        &mut |path| files.id_of_text(path),
                        Some(&mut self.wall_reads),
                    ) else {
                        return;
                    };
                    // The copy was sized by how deep this thread's stacks
                    // were so far; this one is deeper: it is copied again
                    // whole (still as it was read) and unwound from that.
                    let Some(w) = self.wall.as_mut().filter(|w| {
                        !recopied
                            && b.sized_copy
                            && u.wanted_past_copy.is_some_and(|end| end <= w.stack_size())
                    }) else {
                        break u;
                    };
                    let Some(whole) = w.recopy(pid, tid, b.place.1, &b.read_as) else {
                        self.wall_marker(pid, tid, t, MARKER_RACED);
                        return;
                    };
                    b.sample.stack = whole;
                    recopied = true;
                };
                for (i, _, e) in &u.jit {
                    self.jit_names
                        .entry(u.frames[*i])
                        .or_insert_with(|| e.name.clone());
                }
                let native = std::sync::Arc::new(offcpu::NativeFrames {
                    frames: u.frames,
                    complete: u.complete,
                    maps: pm.version(),
                });
                // Frames of JIT code are named from perf maps that change
                // over time: such stacks are unwound every time.
                if let (Some(w), true) = (self.wall.as_mut(), u.plain) {
                    w.learn(
                        tid,
                        b.place,
                        &b.sample.stack,
                        &mut self.wall_reads,
                        native.clone(),
                    );
                }
                self.announce_files();
                native
            }
        };
        self.keys_buf.clear();
        for (name, file, entry) in b.py.into_iter().flatten() {
            let key = (name, file);
            let next = self.py_names.len() as u32;
            let i = *self.py_name_ids.entry(key.clone()).or_insert(next);
            if i == next {
                self.py_names.push(key);
            }
            self.keys_buf.push(FrameKey::PyNamed(i, entry));
        }
        self.keys_buf.extend(
            native
                .frames
                .iter()
                .rev()
                .map(|&(f, o)| FrameKey::Native(f, o))
                .chain(std::iter::once(FrameKey::Marker(b.marker)))
                .chain(b.gil_holder.map(FrameKey::Marker)),
        );
        let rings = self.agent.as_ref().map(|a| &a.rings);
        let (symbols, paths, jit) = (&self.symbols, &self.paths, &self.jit_names);
        let py_names = &self.py_names;
        let stack = self
            .interner
            .stack_of(tid, &self.keys_buf, &self.sink, |id, k| {
                if let FrameKey::Native(file, offset) = *k {
                    queue_name(symbols, paths, jit, id, file, offset);
                }
                frame_event(id, k, rings, py_names)
            });
        if let Some(stack) = stack {
            self.wall_last.insert(tid, (stack, native.complete));
            self.interner.sample_from(
                SampleSource::Wall,
                pid,
                tid,
                t,
                stack,
                native.complete,
                &self.sink,
            );
        }
    }

    /// A one-marker wall-clock sample.
    fn wall_marker(&mut self, pid: Pid, tid: Tid, t: MonoNs, marker: &'static str) {
        let id = self
            .interner
            .frame(&FrameKey::Marker(marker), &self.sink, |id, _| {
                Event::StackMarker {
                    id,
                    marker: marker.to_string(),
                }
            });
        if let Some(stack) = self.interner.stack(&[id], &self.sink) {
            self.interner
                .sample_from(SampleSource::Wall, pid, tid, t, stack, true, &self.sink);
        }
    }

    fn finish(mut self) -> StackStats {
        // Name the frames still queued; the symbolizer thread's CPU time is
        // the sampler's too.
        let naming = self.symbols.finish();
        let s = &mut self.stats;
        s.busy_ns = crate::selfcost::thread_cpu_ns().unwrap_or(self.busy.as_nanos() as u64)
            + naming.as_nanos() as u64;
        s.interval_ns = 1_000_000_000 / self.opts.frequency.max(1);
        if let Some(why) = &self.timer {
            s.sampler = SAMPLER_TIMER.into();
            s.detail = format!(
                "in-process timer sampler: each thread of the job samples itself on its own CPU-time clock at {} Hz, {} KiB user stack copies, job pid {}; {} periods came merged into a later signal (the kernel checks the timers at its tick) and are counted with it ({why})",
                self.opts.frequency,
                self.opts.stack_size / 1024,
                self.job,
                self.stats_overruns
            );
        } else {
            s.sampler = SAMPLER_PERF.into();
            s.detail = format!(
                "perf cpu-clock at {} Hz on {} CPUs, {} KiB user stack copies, {} KiB ring per CPU, job pid {}",
                self.opts.frequency,
                self.rings.samplers.len(),
                self.opts.stack_size / 1024,
                self.rings.ring_bytes / 1024,
                self.job
            );
        }
        if let Some(w) = &self.wall {
            let w = &w.stats;
            s.detail.push_str(&format!(
                "; wall-clock sampler: {} looks at threads, {} on a CPU, {} blocked ({} read, of which {} reused the native frames of an unchanged stack; {} unchanged since their previous read), {} reads dropped (the thread woke while read), {} blocked samples without Python frames",
                w.looks, w.running, w.blocked + w.repeated, w.blocked, w.reused, w.repeated, w.raced, w.py_missing
            ));
            if w.copies > 0 {
                s.detail.push_str(&format!(
                    "; {} stack copies of {:.1} KiB on average (sized by how deep the thread's earlier stacks were unwound), {} of them taken again whole",
                    w.copies,
                    w.copied_bytes as f64 / w.copies as f64 / 1024.0,
                    w.recopied
                ));
            }
            s.detail.push_str(&w.python_reads());
        }
        if let Some(a) = self.agent.take() {
            let dropped = a.rings.dropped();
            for (pid, p) in a.procs {
                self.sink.send_blocking(Event::PyAgentStats {
                    pid,
                    samples: p.samples,
                    partial: p.partial,
                    dropped: dropped.get(&pid).copied().unwrap_or(0),
                    late_signals: p.late,
                    unknown_code: p.unknown_code,
                    handler_chained: p.chained,
                    kernel_sampled: p.kernel,
                    merged_periods: p.merged,
                    unsampled_periods: p.unsampled,
                });
            }
            if a.rings.malformed > 0 {
                s.detail.push_str(&format!(
                    "; {} records of the Python agent could not be decoded",
                    a.rings.malformed
                ));
            }
        }
        let cov_detail = if s.lost_records > 0 {
            format!(
                "{}; the kernel dropped {} records (rings full): lower --frequency or --stack-size",
                s.detail, s.lost_records
            )
        } else {
            s.detail.clone()
        };
        self.sink
            .send_blocking(Event::StackStats(self.stats.clone()));
        self.sink.send_blocking(Event::Coverage(Coverage {
            source: coverage::NATIVE_STACKS.into(),
            available: true,
            detail: cov_detail,
        }));
        self.stats
    }
}
