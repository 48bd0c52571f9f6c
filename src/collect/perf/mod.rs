//! Native stack sampling of the whole job with perf events.
//!
//! [`open`] is called between fork and exec of the job (see
//! [`crate::launch`]): one disabled `cpu-clock` event per CPU on the job's
//! pid, inherited by everything it forks, enabled by the kernel at exec.
//! [`PerfSampler::start`] then runs a reader thread that drains the rings,
//! orders records by time across CPUs, unwinds each sample with framehop,
//! interns the stacks and sends compact events to the recording.
//! [`PerfSampler::stop`] (after the job ended) drains what is left, names
//! every sampled frame with blazesym and writes the names into the
//! recording, so `gpuprof report` needs nothing else.

mod perfmap;
mod ring;
mod symbolize;
mod unwind;

use std::collections::{BTreeMap, HashMap};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use ring::{online_cpus, parse_cpu_list, perf_event_paranoid, ring_bytes_for, OpenError};

use crate::collect::intern::Interner;
use crate::event::{Coverage, Event, MonoNs, Pid, StackKind, StackStats, Tid};
use crate::record::Sink;
use ring::{Record, Rings};
use unwind::{Files, ProcessMaps, UnwindCache};

/// Coverage source name of native stacks.
pub const COVERAGE_SOURCE: &str = "native-stacks";

/// Default and limits of the sampling settings.
pub const DEFAULT_FREQUENCY: u64 = 99;
pub const MAX_FREQUENCY: u64 = 1000;
pub const DEFAULT_STACK_SIZE: u32 = 32 * 1024;

/// Records younger than this are held back so that records of other CPUs
/// with earlier times can still arrive and be ordered before them.
const REORDER_WINDOW_NS: u64 = 10_000_000;
const POLL_TIMEOUT_MS: i32 = 50;

#[derive(Clone, Debug)]
pub struct PerfOptions {
    /// Samples per second per thread (1..=1000).
    pub frequency: u64,
    /// Bytes of user stack copied per sample (8..=65528, a multiple of 8).
    pub stack_size: u32,
}

impl Default for PerfOptions {
    fn default() -> Self {
        PerfOptions {
            frequency: DEFAULT_FREQUENCY,
            stack_size: DEFAULT_STACK_SIZE,
        }
    }
}

impl PerfOptions {
    /// Check the settings; the message says what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        if self.frequency == 0 || self.frequency > MAX_FREQUENCY {
            return Err(format!(
                "--frequency {} is out of range: use 1 to {MAX_FREQUENCY} samples per second (default {DEFAULT_FREQUENCY})",
                self.frequency
            ));
        }
        if self.stack_size < 1024 || self.stack_size > 65528 || self.stack_size % 8 != 0 {
            return Err(format!(
                "--stack-size {} is out of range: use a multiple of 8 bytes from 1024 to 65528 (default {DEFAULT_STACK_SIZE})",
                self.stack_size
            ));
        }
        Ok(())
    }
}

/// Events opened on the (not yet exec'd) job, or on a running tree.
pub struct Opened {
    rings: Rings,
    job: Pid,
    opts: PerfOptions,
    attached: Option<Attached>,
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
    })
}

/// Open the sampling events on `job`, which must be forked but not yet
/// exec'd. On refusal the error's message is one line with the fix.
pub fn open(job: Pid, opts: &PerfOptions) -> Result<Opened, OpenError> {
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
    )?;
    Ok(Opened {
        rings,
        job,
        opts: opts.clone(),
        attached: None,
    })
}

/// The coverage entry for a refused or failed `open`.
pub fn refused_coverage(err: &OpenError) -> Coverage {
    Coverage {
        source: COVERAGE_SOURCE.into(),
        available: false,
        detail: err.message.clone(),
    }
}

/// The running reader thread.
pub struct PerfSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<StackStats>,
}

impl PerfSampler {
    /// Start reading the rings. Call before releasing the job.
    /// `tree_changes` is bumped on every new process and every exec.
    pub fn start(
        opened: Opened,
        sink: Sink,
        tree_changes: Arc<AtomicU64>,
    ) -> std::io::Result<PerfSampler> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("gpuprof-perf".into())
            .spawn(move || {
                let mut r = Reader::new(opened, sink, tree_changes);
                r.run(&stop2);
                r.finish()
            })?;
        Ok(PerfSampler { stop, thread })
    }

    /// The job ended: drain the rings, symbolize, write the names and the
    /// counters into the recording, and return the counters.
    pub fn stop(self) -> StackStats {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap_or_else(|_| StackStats {
            kind: Some(StackKind::Native),
            detail: "the perf reader thread panicked; native stacks are incomplete".into(),
            ..Default::default()
        })
    }
}

/// A process's own perf map, for a process started at `t` (None: unknown).
fn own_perf_map(pid: Pid, t: Option<MonoNs>) -> perfmap::SharedMap {
    perfmap::PerfMap::shared(perfmap::map_path(pid), t.map(perfmap::wall_time_of))
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
    interner: Interner<(u32, u64)>,
    unknown_file: u32,
    pending: Vec<Record>,
    stats: StackStats,
    busy: Duration,
    frames_buf: Vec<u32>,
    tree_changes: Arc<AtomicU64>,
    attached: Option<Attached>,
    /// Names of sampled JIT frames, from perf maps: (file, address) → name.
    jit_names: HashMap<(u32, u64), Arc<str>>,
    /// Counts samples: perf maps are read at most once per sample.
    sample_gen: u64,
}

/// After attaching, the tree is listed again this long after the events
/// were opened (and twice as long, and so on), to give threads that were
/// created meanwhile by a thread without an event one of their own.
const CATCH_UP_AFTER: Duration = Duration::from_millis(100);
const CATCH_UP_PASSES: u32 = 3;

impl Reader {
    fn new(opened: Opened, sink: Sink, tree_changes: Arc<AtomicU64>) -> Reader {
        let mut files = Files::default();
        let unknown_file = files.id_of("[unknown]");
        let mut r = Reader {
            rings: opened.rings,
            job: opened.job,
            opts: opened.opts,
            sink,
            procs: HashMap::new(),
            files,
            paths: Vec::new(),
            cache: UnwindCache::default(),
            interner: Interner::new(StackKind::Native),
            unknown_file,
            pending: Vec::new(),
            stats: StackStats {
                kind: Some(StackKind::Native),
                ..Default::default()
            },
            busy: Duration::ZERO,
            frames_buf: Vec::with_capacity(64),
            tree_changes,
            attached: opened.attached,
            jit_names: HashMap::new(),
            sample_gen: 0,
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

    fn run(&mut self, stop: &AtomicBool) {
        let n = self.rings.samplers.len();
        let mut hung_up = vec![false; n];
        loop {
            let stopping = stop.load(Ordering::Acquire);
            let drain_start = MonoNs::now();
            let work = Instant::now();
            self.drain();
            let horizon = if stopping {
                MonoNs(u64::MAX)
            } else {
                MonoNs(drain_start.0.saturating_sub(REORDER_WINDOW_NS))
            };
            self.process_until(horizon);
            if !stopping {
                self.catch_up();
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
            let mut fds: Vec<libc::pollfd> = Vec::with_capacity(n);
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
            if fds.is_empty() {
                std::thread::sleep(Duration::from_millis(POLL_TIMEOUT_MS as u64));
                continue;
            }
            // SAFETY: fds is a valid array of pollfd of the given length.
            let rc =
                unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, POLL_TIMEOUT_MS) };
            if rc > 0 {
                for (f, i) in fds.iter().zip(&idx) {
                    if f.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                        hung_up[*i] = true;
                    }
                }
            }
        }
    }

    /// Move every available record out of the rings.
    fn drain(&mut self) {
        let nregs = ring::REGS_MASK.count_ones() as usize;
        for s in self.rings.samplers.iter_mut() {
            while let Some(rec) = s.next_record() {
                let body = rec.to_contiguous();
                if let Some(r) = ring::parse(rec.ty(), rec.misc(), &body, nregs) {
                    self.pending.push(r);
                }
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
            Record::Mmap2(m) => {
                let pm = self.procs.entry(m.pid).or_default();
                pm.add(&mut self.files, &m);
                self.announce_files();
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
                    self.tree_changes.fetch_add(1, Ordering::Release);
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
                    self.tree_changes.fetch_add(1, Ordering::Release);
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
                if pid.0 == tid.0 {
                    self.procs.remove(&pid);
                }
                self.sink.send_blocking(Event::TaskExit { t, pid, tid });
            }
            Record::Lost { lost, .. } => {
                self.stats.lost_records += lost;
            }
        }
    }

    fn sample(&mut self, s: ring::Sample) {
        self.stats.samples += 1;
        self.sample_gen += 1;
        let pm = self.procs.entry(s.pid).or_default();
        if pm.is_empty() && !pm.seeded {
            // Mappings made before the events were enabled (or records
            // lost): read them from /proc while the process lives.
            pm.seeded = true;
            for m in unwind::proc_maps(s.pid) {
                pm.add(&mut self.files, &m);
            }
        }
        if pm.jit.is_empty() {
            // Started before we saw it: any map it wrote is its own.
            pm.jit.push(own_perf_map(s.pid, None));
        }
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
        self.frames_buf.clear();
        for key in u.frames.iter().rev() {
            let id =
                self.interner
                    .frame(key, &self.sink, |id, &(file, offset)| Event::NativeFrame {
                        id,
                        file,
                        offset,
                    });
            self.frames_buf.push(id);
        }
        if let Some(stack) = self.interner.stack(&self.frames_buf, &self.sink) {
            self.interner
                .sample(s.pid, s.tid, s.t, stack, u.complete, &self.sink);
        }
    }

    fn finish(mut self) -> StackStats {
        let work = Instant::now();
        // Group the sampled frames by file and name them.
        let mut by_file: BTreeMap<String, Vec<(u32, u64)>> = BTreeMap::new();
        let mut names = Vec::new();
        for (&(file, offset), id) in self.interner.frames() {
            if let Some(name) = self.jit_names.get(&(file, offset)) {
                names.push((id, name.to_string()));
            } else if let Some(path) = self.paths.get(file as usize) {
                by_file.entry(path.clone()).or_default().push((id, offset));
            }
        }
        names.extend(symbolize::symbolize(&by_file));
        names.sort();
        for chunk in names.chunks(2048) {
            self.sink.send_blocking(Event::Symbols {
                names: chunk.to_vec(),
            });
        }
        self.busy += work.elapsed();
        let s = &mut self.stats;
        s.busy_ns = self.busy.as_nanos() as u64;
        s.interval_ns = 1_000_000_000 / self.opts.frequency.max(1);
        s.detail = format!(
            "perf cpu-clock at {} Hz on {} CPUs, {} KiB user stack copies, {} KiB ring per CPU, job pid {}",
            self.opts.frequency,
            self.rings.samplers.len(),
            self.opts.stack_size / 1024,
            self.rings.ring_bytes / 1024,
            self.job
        );
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
            source: COVERAGE_SOURCE.into(),
            available: true,
            detail: cov_detail,
        }));
        self.stats
    }
}
