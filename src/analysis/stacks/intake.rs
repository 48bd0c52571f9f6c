//! Sample intake: the stack events of a recording collected in one pass
//! ([`StackData`]), thinned to a bounded number of samples, sorted by
//! thread; and the process table completed with what perf saw.

use super::*;

#[derive(Clone, Debug)]
pub(super) enum Frame {
    Native {
        file: u32,
        offset: u64,
    },
    Python {
        name: String,
        file: String,
        entry: bool,
        /// The line at the sample's instant (agent samples; 0: could not be
        /// decoded; None: not recorded).
        line: Option<u32>,
    },
    /// Why a stack's Python frames are missing or cut (`[python: …]`).
    Marker(String),
}

/// A look of the wall-clock sampler at a blocked thread, and whether it
/// was inside the framework's compiler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompileLook {
    pub pid: Pid,
    pub tid: Tid,
    pub t: MonoNs,
    pub weight: u32,
    pub compiling: bool,
}

/// A frame of a wall-clock sample (see [`StackData::wall_frames`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WallFrame<'a> {
    /// A native function (`None`: not named) in a file.
    Native {
        name: Option<&'a str>,
        file: &'a str,
    },
    Python {
        name: &'a str,
        file: &'a str,
    },
    Marker(&'a str),
}

#[derive(Clone, Copy, Debug)]
pub(super) struct RawSample {
    pub(super) t: MonoNs,
    pub(super) pid: Pid,
    pub(super) tid: Tid,
    pub(super) stack: u32,
    /// How many recorded samples this one stands for (1 until the
    /// analysis thins, at most [`MAX_WEIGHT`]), with [`INCOMPLETE`] set when
    /// the unwinder stopped before the end of the stack (framehop's
    /// verdict) and [`AGENT`] when the in-process agent took it (its stack
    /// holds the Python frames of the same instant). Packed: a day-long
    /// recording holds millions of these.
    pub(super) weight_flags: u32,
}

/// Flags in [`RawSample::weight_flags`]: the unwinding stopped early; taken
/// by the in-process agent.
pub(super) const INCOMPLETE: u32 = 1 << 31;
pub(super) const AGENT: u32 = 1 << 30;
pub(super) const MAX_WEIGHT: u32 = AGENT - 1;

impl RawSample {
    pub(super) fn weight(&self) -> u32 {
        self.weight_flags & MAX_WEIGHT
    }
    pub(super) fn complete(&self) -> bool {
        self.weight_flags & INCOMPLETE == 0
    }
    pub(super) fn agent(&self) -> bool {
        self.weight_flags & AGENT != 0
    }
    pub(super) fn with_weight(mut self, w: u32) -> RawSample {
        self.weight_flags = (self.weight_flags & !MAX_WEIGHT) | w.min(MAX_WEIGHT);
        self
    }
}

/// Samples kept in memory by the analysis: at most [`ANALYSIS_MAX_SAMPLES`].
/// Past that, time is cut into buckets of `bucket_ns` (doubled as often as
/// needed) and each thread keeps one sample per bucket, chosen at random
/// (deterministically: outputs must be reproducible) among the samples
/// that fell in it, and weighted by their number. So a day-long recording
/// is analysed in the same memory as a 20-minute one, and:
/// - counts (flamegraph widths, CPU-seconds, top functions) stay exact in
///   expectation: every recorded sample is counted through a weight;
/// - a thread on-CPU throughout still has a sample in every bucket, so the
///   trace shows it running throughout, at the bucket's resolution.
#[derive(Default)]
pub(super) struct Thinned {
    pub(super) kept: Vec<RawSample>,
    /// 0 until the first thinning.
    pub(super) bucket_ns: u64,
    /// Index in `kept` of each thread's newest sample (while thinning).
    pub(super) newest: HashMap<(Pid, Tid), usize>,
    pub(super) seen: u64,
}

/// Bound on native (and, separately, Python) samples held by the analysis:
/// ~24 bytes each here and again once merged, so ~100 MB at the bound.
pub const ANALYSIS_MAX_SAMPLES: usize = 2_000_000;

/// The bucket never grows past this (about 13 days): a bound on the
/// thinning loop whatever the input.
pub(super) const MAX_BUCKET_NS: u64 = 1 << 50;

impl Thinned {
    /// Add one thread's samples (in time order).
    #[cfg(test)]
    pub(super) fn push_thread(
        &mut self,
        pid: Pid,
        tid: Tid,
        samples: impl Iterator<Item = RawSample>,
    ) {
        let v: Vec<RawSample> = samples.collect();
        self.push_slice(pid, tid, &v);
    }

    /// Add one thread's samples (in time order). Once thinning, the samples
    /// of one bucket are taken as a run: the kept sample is drawn once for
    /// the run (the same draw as one sample at a time: the run's samples
    /// are equally likely, and the kept one stays with probability
    /// weight / (weight + run)).
    pub(super) fn push_slice(&mut self, pid: Pid, tid: Tid, samples: &[RawSample]) {
        let mut newest = if self.bucket_ns > 0 {
            self.newest.get(&(pid, tid)).copied()
        } else {
            None
        };
        let mut i = 0;
        while i < samples.len() {
            if self.bucket_ns == 0 {
                self.seen += 1;
                self.kept.push(samples[i].with_weight(1));
                newest = Some(self.kept.len() - 1);
                i += 1;
                if self.kept.len() >= ANALYSIS_MAX_SAMPLES {
                    self.coarsen();
                    newest = self.newest.get(&(pid, tid)).copied();
                }
                continue;
            }
            let bucket = samples[i].t.0 / self.bucket_ns;
            let end = (bucket + 1).saturating_mul(self.bucket_ns);
            let mut j = i + 1;
            while j < samples.len() && samples[j].t.0 < end {
                j += 1;
            }
            let run = (j - i) as u64;
            self.seen += run;
            let draw = splitmix64(self.seen);
            match newest {
                Some(k) if self.kept[k].t.0 / self.bucket_ns == bucket => {
                    let w = self.kept[k].weight() as u64;
                    let total = (w + run).min(MAX_WEIGHT as u64) as u32;
                    let r = draw % (w + run);
                    self.kept[k] = if r >= w {
                        samples[i + (r - w) as usize]
                    } else {
                        self.kept[k]
                    }
                    .with_weight(total);
                }
                _ => {
                    let pick = samples[i + (draw % run) as usize];
                    self.kept
                        .push(pick.with_weight(run.min(MAX_WEIGHT as u64) as u32));
                    newest = Some(self.kept.len() - 1);
                    if self.kept.len() >= ANALYSIS_MAX_SAMPLES {
                        self.coarsen();
                        newest = self.newest.get(&(pid, tid)).copied();
                    }
                }
            }
            i = j;
        }
        if let (Some(i), true) = (newest, self.bucket_ns > 0) {
            self.newest.insert((pid, tid), i);
        }
    }

    /// Double the bucket (the first time: twice the usual sampling period)
    /// until at most 3/4 of the bound is kept.
    pub(super) fn coarsen(&mut self) {
        sort_by_thread(&mut self.kept);
        if self.bucket_ns == 0 {
            let mut gaps: Vec<u64> = self
                .kept
                .windows(2)
                .filter(|w| (w[0].pid, w[0].tid) == (w[1].pid, w[1].tid))
                .map(|w| w[1].t.0 - w[0].t.0)
                .filter(|g| *g > 0)
                .collect();
            gaps.sort_unstable();
            let period = gaps.get(gaps.len() / 2).copied().unwrap_or(1_000_000);
            self.bucket_ns = period.clamp(1_000, MAX_BUCKET_NS / 2);
        }
        while self.bucket_ns < MAX_BUCKET_NS {
            self.bucket_ns *= 2;
            let b = self.bucket_ns;
            let mut out: Vec<RawSample> = Vec::with_capacity(self.kept.len() / 2 + 1);
            for s in self.kept.drain(..) {
                match out.last_mut() {
                    Some(k) if (k.pid, k.tid) == (s.pid, s.tid) && k.t.0 / b == s.t.0 / b => {
                        // Keep either with probability proportional to its
                        // weight; the survivor stands for both.
                        let (wk, ws) = (k.weight() as u64, s.weight() as u64);
                        let total = (wk + ws).min(MAX_WEIGHT as u64) as u32;
                        let pick = splitmix64(k.t.0 ^ s.t.0.rotate_left(17) ^ s.tid.0 as u64)
                            % (wk + ws).max(1);
                        *k = if pick < ws { s } else { *k }.with_weight(total);
                    }
                    _ => out.push(s),
                }
            }
            self.kept = out;
            if self.kept.len() <= ANALYSIS_MAX_SAMPLES / 4 * 3 {
                break;
            }
        }
        self.newest.clear();
        for (i, s) in self.kept.iter().enumerate() {
            self.newest.insert((s.pid, s.tid), i);
        }
    }
}

/// Sort samples by (pid, tid, t), stably: the order of
/// `sort_by_key(|s| (s.pid, s.tid, s.t))`, in time linear in the samples
/// when each thread's samples are in time order (as they are added, so as
/// they are at each thinning): a counting sort by thread, applied in place,
/// then a sort of only the threads out of time order. A comparison sort of
/// the millions of samples a long recording keeps took a fifth of its
/// analysis, done again at each thinning. Extra memory: 4 bytes a sample.
pub(super) fn sort_by_thread(v: &mut [RawSample]) {
    if u32::try_from(v.len()).is_err() {
        v.sort_by_key(|s| (s.pid, s.tid, s.t));
        return;
    }
    let mut counts: BTreeMap<(Pid, Tid), usize> = BTreeMap::new();
    for (key, from, to) in thread_runs(v) {
        *counts.entry(key).or_default() += to - from;
    }
    // Where each thread's next sample goes; `from[d]`: the sample that
    // goes to position d.
    let mut next: HashMap<(Pid, Tid), usize> = HashMap::with_capacity(counts.len());
    let mut at = 0;
    for (key, n) in &counts {
        next.insert(*key, at);
        at += n;
    }
    let mut from = vec![0u32; v.len()];
    for (key, start, end) in thread_runs(v) {
        let d = next.get_mut(&key).expect("counted");
        for (slot, src) in from[*d..*d + (end - start)].iter_mut().zip(start..) {
            *slot = src as u32;
        }
        *d += end - start;
    }
    // Apply the permutation cycle by cycle; a placed position points to
    // itself.
    for d in 0..v.len() {
        if from[d] as usize == d {
            continue;
        }
        let first = v[d];
        let mut cur = d;
        loop {
            let src = from[cur] as usize;
            from[cur] = cur as u32;
            if src == d {
                v[cur] = first;
                break;
            }
            v[cur] = v[src];
            cur = src;
        }
    }
    let mut at = 0;
    for n in counts.values() {
        let thread = &mut v[at..at + n];
        if !thread.windows(2).all(|w| w[0].t <= w[1].t) {
            thread.sort_by_key(|s| s.t);
        }
        at += n;
    }
}

/// Runs of one thread's samples: (thread, start, end).
pub(super) fn thread_runs(
    v: &[RawSample],
) -> impl Iterator<Item = ((Pid, Tid), usize, usize)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let key = (v.get(i)?.pid, v[i].tid);
        let from = i;
        while i < v.len() && (v[i].pid, v[i].tid) == key {
            i += 1;
        }
        Some((key, from, i))
    })
}

/// The stack events of a recording, collected in one pass.
#[derive(Default)]
pub struct StackData {
    /// Python frames by line, `name (file.py:LINE)` (`--lines`), where the
    /// recording has lines; else by function.
    pub lines: bool,
    pub(super) files: HashMap<u32, String>,
    pub(super) native_frames: HashMap<u32, Frame>,
    pub(super) py_frames: HashMap<u32, Frame>,
    pub(super) symbols: HashMap<u32, String>,
    /// Native frames looked up that have no name.
    pub(super) unnamed: std::collections::HashSet<u32>,
    pub(super) native_nodes: HashMap<u32, (Option<u32>, u32)>,
    pub(super) py_nodes: HashMap<u32, (Option<u32>, u32)>,
    pub(super) native: Thinned,
    pub(super) python: Thinned,
    /// The wall-clock sampler's looks at threads (native stack space).
    pub(super) wall: Thinned,
    /// Samples of one batch, reused.
    pub(super) scratch: Vec<RawSample>,
    pub(super) stats: Vec<StackStats>,
    /// How each Python process's frames were obtained (the agent's word
    /// wins).
    pub(super) py_procs: BTreeMap<Pid, PyProcInfo>,
    pub(super) agent_stats: BTreeMap<Pid, AgentStats>,
    /// From perf task records: (time, comm, exec) per pid, and parents.
    pub(super) comms: BTreeMap<Pid, Vec<(MonoNs, String, bool)>>,
    pub(super) parents: BTreeMap<Pid, Pid>,
    pub(super) forks: BTreeMap<Pid, MonoNs>,
    pub(super) exits: BTreeMap<Pid, MonoNs>,
    pub(super) first_exec: Option<(MonoNs, Pid)>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct PyProcInfo {
    pub(super) version: String,
    pub(super) same_instant: bool,
    pub(super) timer: bool,
    pub(super) detail: String,
}

/// The agent's own counters for one process (see `Event::PyAgentStats`).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct AgentStats {
    pub samples: u64,
    pub partial: BTreeMap<String, u64>,
    pub dropped: u64,
    pub late_signals: u64,
    pub unknown_code: u64,
    pub handler_chained: bool,
    /// Its perf event sampled the threads' time in the kernel (None: timers,
    /// which count it anyway, or not said).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_sampled: Option<bool>,
    /// Periods counted with a sample whose signal came for several (a
    /// stretch in the kernel).
    pub merged_periods: u64,
    /// Periods that took no sample: they ended in the kernel, which the
    /// event did not sample.
    pub unsampled_periods: u64,
}

/// A process as perf's task records saw it: exact fork and exit times,
/// also for processes too short-lived for /proc polling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerfProcess {
    pub pid: Pid,
    pub ppid: Option<Pid>,
    pub forked: Option<MonoNs>,
    pub exited: Option<MonoNs>,
    pub comm: Option<String>,
    /// It exec'd a program of its own (otherwise it runs its parent's).
    pub execd: bool,
}

impl StackData {
    pub fn new() -> StackData {
        StackData::default()
    }

    /// Take what this module needs from one event.
    pub fn add(&mut self, ev: &Event) {
        match ev {
            Event::StackFile { id, path } => {
                self.files.insert(*id, path.clone());
            }
            Event::NativeFrame { id, file, offset } => {
                self.native_frames.insert(
                    *id,
                    Frame::Native {
                        file: *file,
                        offset: *offset,
                    },
                );
            }
            Event::InlinePyFrame {
                id,
                name,
                file,
                entry,
                line,
            } => {
                self.native_frames.insert(
                    *id,
                    Frame::Python {
                        name: name.clone(),
                        file: file.clone(),
                        entry: *entry,
                        line: *line,
                    },
                );
            }
            Event::StackMarker { id, marker } => {
                self.native_frames
                    .insert(*id, Frame::Marker(marker.clone()));
            }
            Event::PyProcess {
                pid,
                version,
                same_instant,
                timer,
                detail,
                ..
            } => {
                // The agent's word wins over py-spy's (which may attach for
                // a moment before the agent's hello is read).
                let p = self.py_procs.entry(*pid).or_default();
                if *same_instant || !p.same_instant {
                    *p = PyProcInfo {
                        version: version.clone(),
                        same_instant: *same_instant,
                        timer: *timer,
                        detail: detail.clone(),
                    };
                }
            }
            ev @ Event::PyAgentStats { .. } => self.add_agent_stats(ev),
            Event::PyFrame {
                id,
                name,
                file,
                entry,
            } => {
                self.py_frames.insert(
                    *id,
                    Frame::Python {
                        name: name.clone(),
                        file: file.clone(),
                        entry: *entry,
                        line: None,
                    },
                );
            }
            Event::StackNode {
                kind,
                id,
                parent,
                frame,
            } => {
                let nodes = match kind {
                    StackKind::Native => &mut self.native_nodes,
                    StackKind::Python => &mut self.py_nodes,
                };
                nodes.insert(*id, (*parent, *frame));
            }
            Event::Samples(b) => self.add_samples(b),
            Event::Symbols { names, unnamed } => {
                for (id, name) in names {
                    self.symbols.insert(*id, name.clone());
                }
                self.unnamed.extend(unnamed.iter().copied());
            }
            Event::StackStats(s) => self.stats.push(s.clone()),
            Event::TaskComm {
                t,
                pid,
                comm,
                exec,
                tid,
            } if pid.0 == tid.0 => {
                self.comms
                    .entry(*pid)
                    .or_default()
                    .push((*t, comm.clone(), *exec));
                if *exec && self.first_exec.map_or(true, |(ft, _)| *t < ft) {
                    self.first_exec = Some((*t, *pid));
                }
            }
            Event::TaskFork {
                t, pid, tid, ppid, ..
            } if pid.0 == tid.0 && pid != ppid => {
                self.parents.insert(*pid, *ppid);
                self.forks.insert(*pid, *t);
            }
            Event::TaskExit { t, pid, tid } if pid.0 == tid.0 => {
                self.exits.insert(*pid, *t);
            }
            _ => {}
        }
    }

    /// A batch of one thread's samples, into the kept samples of its kind.
    pub(super) fn add_samples(&mut self, b: &SampleBatch) {
        let out = match b.kind {
            StackKind::Native if b.source == SampleSource::Wall => &mut self.wall,
            StackKind::Native => &mut self.native,
            StackKind::Python => &mut self.python,
        };
        // A plain loop: this runs for every sample of the recording.
        let scratch = &mut self.scratch;
        scratch.clear();
        let n = b.stacks.len().min(b.dt_us.len());
        let mut us = b.t0.0 / 1000;
        for i in 0..n {
            us += b.dt_us[i] as u64;
            scratch.push(RawSample {
                t: MonoNs(us * 1000),
                pid: b.pid,
                tid: b.tid,
                stack: b.stacks[i],
                weight_flags: if b.source == SampleSource::Agent {
                    AGENT | 1
                } else {
                    1
                },
            });
        }
        for x in &b.incomplete {
            if let Some(s) = scratch.get_mut(*x as usize) {
                s.weight_flags |= INCOMPLETE;
            }
        }
        out.push_slice(b.pid, b.tid, scratch);
    }

    /// The agent's counters of one process, added up.
    pub(super) fn add_agent_stats(&mut self, ev: &Event) {
        let Event::PyAgentStats {
            pid,
            samples,
            partial,
            dropped,
            late_signals,
            unknown_code,
            handler_chained,
            kernel_sampled,
            merged_periods,
            unsampled_periods,
        } = ev
        else {
            return;
        };
        let a = self.agent_stats.entry(*pid).or_default();
        a.samples += samples;
        for (k, v) in partial {
            *a.partial.entry(k.clone()).or_default() += v;
        }
        a.dropped += dropped;
        a.late_signals += late_signals;
        a.unknown_code += unknown_code;
        a.handler_chained |= handler_chained;
        a.kernel_sampled = kernel_sampled.or(a.kernel_sampled);
        a.merged_periods += merged_periods;
        a.unsampled_periods += unsampled_periods;
    }

    /// The native stacks that are one `[perf: not unwound, …]` frame: the
    /// perf samples the reader left to the agent.
    pub(super) fn not_unwound_stacks(&self) -> BTreeSet<u32> {
        let marker: BTreeSet<u32> = self
            .native_frames
            .iter()
            .filter(|(_, f)| {
                matches!(f, Frame::Marker(m) if m == crate::vocab::stacks::MARKER_NOT_UNWOUND)
            })
            .map(|(id, _)| *id)
            .collect();
        if marker.is_empty() {
            return marker;
        }
        self.native_nodes
            .iter()
            .filter(|(_, (parent, frame))| parent.is_none() && marker.contains(frame))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Every process perf saw start, exec or exit (sorted by pid). A reused
    /// pid shows as one process (its latest fork and exit).
    pub fn perf_processes(&self) -> Vec<PerfProcess> {
        let mut pids: Vec<Pid> = self
            .forks
            .keys()
            .chain(self.exits.keys())
            .chain(self.comms.keys())
            .copied()
            .collect();
        pids.sort();
        pids.dedup();
        pids.into_iter()
            .map(|pid| {
                let comms = self.comms.get(&pid);
                PerfProcess {
                    pid,
                    ppid: self.parents.get(&pid).copied(),
                    forked: self.forks.get(&pid).copied(),
                    exited: self.exits.get(&pid).copied(),
                    comm: comms.and_then(|c| c.last()).map(|c| c.1.clone()),
                    execd: comms.is_some_and(|c| c.iter().any(|c| c.2)),
                }
            })
            .collect()
    }

    /// Every thread's Python samples inside `window`, time-sorted, each with
    /// the innermost Python frame that `pick(name, file)` selects (an index
    /// into the returned names), if any. Python samples include threads
    /// that were blocked, which native (on-CPU) samples never show.
    #[allow(clippy::type_complexity)]
    pub fn python_marks(
        &self,
        window: (MonoNs, MonoNs),
        pick: &dyn Fn(&str, &str) -> bool,
    ) -> (
        Vec<String>,
        BTreeMap<(Pid, Tid), Vec<(MonoNs, Option<u32>)>>,
    ) {
        let mut names: Vec<String> = Vec::new();
        let mut by_stack: HashMap<u32, Option<u32>> = HashMap::new();
        let mut out: BTreeMap<(Pid, Tid), Vec<(MonoNs, Option<u32>)>> = BTreeMap::new();
        for s in &self.python.kept {
            if s.t < window.0 || s.t > window.1 {
                continue;
            }
            let mark = *by_stack.entry(s.stack).or_insert_with(|| {
                // Leaf first: the innermost matching frame.
                let name = leaf_first(&self.py_nodes, s.stack).find_map(|frame| {
                    match self.py_frames.get(&frame) {
                        Some(Frame::Python { name, file, .. }) if pick(name, file) => Some(name),
                        _ => None,
                    }
                })?;
                let n = match names.iter().position(|x| x == name) {
                    Some(i) => i,
                    None => {
                        names.push(name.clone());
                        names.len() - 1
                    }
                };
                Some(n as u32)
            });
            out.entry((s.pid, s.tid)).or_default().push((s.t, mark));
        }
        for v in out.values_mut() {
            v.sort_by_key(|x| x.0);
        }
        (names, out)
    }

    /// Every thread's wall-clock samples inside `window`, time-sorted:
    /// (time, weight, stack id in the native space).
    #[allow(clippy::type_complexity)]
    pub fn wall_samples(
        &self,
        window: (MonoNs, MonoNs),
    ) -> BTreeMap<(Pid, Tid), Vec<(MonoNs, u32, u32)>> {
        let mut out: BTreeMap<(Pid, Tid), Vec<(MonoNs, u32, u32)>> = BTreeMap::new();
        for s in &self.wall.kept {
            if s.t >= window.0 && s.t <= window.1 {
                out.entry((s.pid, s.tid))
                    .or_default()
                    .push((s.t, s.weight(), s.stack));
            }
        }
        for v in out.values_mut() {
            v.sort_by_key(|x| x.0);
        }
        out
    }

    /// One thread's looks in `window`, in time order (as
    /// [`Self::wall_samples`] gives each thread's).
    pub fn wall_samples_of(
        &self,
        window: (MonoNs, MonoNs),
        pt: (Pid, Tid),
    ) -> Vec<(MonoNs, u32, u32)> {
        let mut v: Vec<(MonoNs, u32, u32)> = self
            .wall
            .kept
            .iter()
            .filter(|s| (s.pid, s.tid) == pt && s.t >= window.0 && s.t <= window.1)
            .map(|s| (s.t, s.weight(), s.stack))
            .collect();
        v.sort_by_key(|x| x.0);
        v
    }

    /// The looks in `window` at blocked threads (a look on a CPU is one
    /// marker, and the thread's CPU samples tell what it ran), each with
    /// whether the framework was compiling then
    /// ([`crate::vocab::stacks::is_compile_frame`]).
    pub fn blocked_compile_looks(&self, window: (MonoNs, MonoNs)) -> Vec<CompileLook> {
        let mut by_stack: HashMap<u32, Option<bool>> = HashMap::new();
        let mut out = Vec::new();
        for s in &self.wall.kept {
            if s.t < window.0 || s.t > window.1 {
                continue;
            }
            let compiling = *by_stack.entry(s.stack).or_insert_with(|| {
                let f = self.wall_frames(s.stack);
                (f.len() > 1).then(|| {
                    f.iter().any(|f| {
                        matches!(f, WallFrame::Python { name, file } if crate::vocab::stacks::is_compile_frame(name, file))
                    })
                })
            });
            if let Some(compiling) = compiling {
                out.push(CompileLook {
                    pid: s.pid,
                    tid: s.tid,
                    t: s.t,
                    weight: s.weight(),
                    compiling,
                });
            }
        }
        out
    }

    /// The frames of a native-space stack, leaf first.
    pub fn wall_frames(&self, stack: u32) -> Vec<WallFrame<'_>> {
        leaf_first(&self.native_nodes, stack)
            .map(|frame| match self.native_frames.get(&frame) {
                Some(Frame::Native { file, .. }) => WallFrame::Native {
                    name: self.symbols.get(&frame).map(|s| s.as_str()),
                    file: self.files.get(file).map_or("", |f| f.as_str()),
                },
                Some(Frame::Python { name, file, .. }) => WallFrame::Python { name, file },
                Some(Frame::Marker(m)) => WallFrame::Marker(m),
                None => WallFrame::Marker("[unknown frame]"),
            })
            .collect()
    }

    /// Whether `pid` exec'd a new program in (from, to].
    pub fn execd_between(&self, pid: Pid, from: MonoNs, to: MonoNs) -> bool {
        self.comms
            .get(&pid)
            .is_some_and(|c| c.iter().any(|c| c.2 && c.0 > from && c.0 <= to))
    }

    /// The name perf last saw `pid` take at or before `t`.
    pub fn comm_at(&self, pid: Pid, t: MonoNs) -> Option<String> {
        self.comms
            .get(&pid)?
            .iter()
            .rev()
            .find(|c| c.0 <= t)
            .map(|c| c.1.clone())
    }

    /// Processes with native samples.
    pub fn sampled_pids(&self) -> std::collections::BTreeSet<Pid> {
        self.native.kept.iter().map(|s| s.pid).collect()
    }

    /// When the perf sampler did not finish (gpuprof was killed), what it
    /// had not yet named: "N of M sampled native frames have no name ...,
    /// in FILE (n), ...". None when every frame was looked up.
    pub fn unnamed_frames_warning(&self) -> Option<String> {
        if self.stats.iter().any(|s| s.kind == Some(StackKind::Native)) {
            return None;
        }
        let mut by_file: BTreeMap<&str, u64> = BTreeMap::new();
        let mut n = 0u64;
        for (id, f) in &self.native_frames {
            if self.symbols.contains_key(id) || self.unnamed.contains(id) {
                continue;
            }
            if let Frame::Native { file, .. } = f {
                n += 1;
                let path = self.files.get(file).map_or("?", |p| p.as_str());
                *by_file.entry(path).or_default() += 1;
            }
        }
        if n == 0 {
            return None;
        }
        let mut files: Vec<(&str, u64)> = by_file.into_iter().collect();
        files.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let list: Vec<String> = files
            .iter()
            .take(8)
            .map(|(p, k)| format!("{} ({k})", p.rsplit('/').next().unwrap_or(p)))
            .collect();
        let more = if files.len() > 8 {
            format!(" and {} more files", files.len() - 8)
        } else {
            String::new()
        };
        Some(format!(
            "{n} of {} sampled native frames were never named (gpuprof stopped before looking them up): they show as [file+0xoffset], and Python frames cannot be attached below them; in {}{more}",
            self.native_frames.len(),
            list.join(", ")
        ))
    }

    /// Whether the recording holds any stack sample.
    pub fn is_empty(&self) -> bool {
        self.native.kept.is_empty() && self.python.kept.is_empty()
    }

    /// Process names and roles from perf's task records alone, for
    /// processes the process-tree analysis did not see (or when it is not
    /// available): the first program exec'd is the main process; a process
    /// named `pt_data_worker`, or forked (without exec) from the main
    /// process, is a worker; anything else is "other".
    pub fn fallback_meta(&self, pid: Pid) -> ProcMeta {
        let comms = self.comms.get(&pid);
        let name = comms
            .and_then(|c| c.last())
            .map(|c| c.1.clone())
            .or_else(|| {
                // A forked child keeps its parent's name until it renames.
                let mut p = pid;
                for _ in 0..64 {
                    p = *self.parents.get(&p)?;
                    if let Some(c) = self.comms.get(&p).and_then(|c| c.last()) {
                        return Some(c.1.clone());
                    }
                }
                None
            })
            .unwrap_or_else(|| "?".to_string());
        let main = self.first_exec.map(|f| f.1);
        let execd = comms.is_some_and(|c| c.iter().any(|c| c.2));
        let role = if Some(pid) == main {
            Role::Main
        } else if name == "pt_data_worker"
            || (!execd && main.is_some() && self.parents.get(&pid) == main.as_ref())
        {
            Role::Worker
        } else {
            Role::Other
        };
        ProcMeta { name, role }
    }
}

/// Complete the process table with what perf saw: exact exit times, fork
/// times earlier than the first /proc sighting, and processes that lived
/// too briefly for /proc polling (a forked child inherits its parent's
/// command line; one that exec'd keeps only its name).
pub fn merge_perf_processes(
    d: &StackData,
    processes: &mut BTreeMap<Pid, crate::analysis::Process>,
    end: MonoNs,
) {
    for pp in d.perf_processes() {
        if let Some(p) = processes.get_mut(&pp.pid) {
            // One recovered from its samples (its record was lost): perf's
            // name and parent for it, when perf saw them.
            if p.recovered {
                if p.comm == crate::analysis::UNKNOWN_COMM {
                    if let Some(c) = pp.comm.clone() {
                        p.comm = c;
                    }
                }
                if let (0, Some(ppid)) = (p.ppid.0, pp.ppid) {
                    p.ppid = ppid;
                }
            }
            if let Some(f) = pp.forked {
                if f < p.first_seen {
                    p.first_seen = f;
                }
            }
            // An exit before the process was seen is an earlier process
            // of the same (reused) pid, or its fork record was lost.
            if let Some(x) = pp.exited.filter(|x| *x >= p.first_seen) {
                p.exited = Some(x);
            }
            continue;
        }
        let Some(forked) = pp.forked else {
            // The job itself (forked before perf was enabled) is always in
            // the table; anything else without a fork record is not ours.
            continue;
        };
        if forked > end {
            continue;
        }
        // A child forked without exec runs its parent's program as it was
        // at the fork: inherit the command line only if the parent did not
        // exec another program since (a shell wrapper that execs python).
        let parent = pp.ppid.and_then(|pp| processes.get(&pp));
        let parent_same = pp
            .ppid
            .is_some_and(|ppid| !d.execd_between(ppid, forked, end));
        let (cmdline, exe) = match parent {
            Some(par) if !pp.execd && parent_same => (par.cmdline.clone(), par.exe.clone()),
            _ => (Vec::new(), None),
        };
        let parent_comm = pp
            .ppid
            .and_then(|ppid| d.comm_at(ppid, forked))
            .or_else(|| parent.map(|p| p.comm.clone()));
        let comm = pp
            .comm
            .clone()
            .or(parent_comm)
            .unwrap_or_else(|| d.fallback_meta(pp.pid).name);
        let mut p = crate::analysis::Process::new(
            pp.pid,
            pp.ppid.unwrap_or_default(),
            comm,
            cmdline,
            exe,
            forked,
        );
        // Unknown rank environment: it takes its parent's rank (see `roles`).
        p.exited = pp.exited;
        processes.insert(pp.pid, p);
    }
}

/// Deepest a stack is walked: a guard against a cycle in a damaged
/// recording's nodes, far beyond any real stack.
const MAX_DEPTH: usize = 4096;

/// The frames of a recorded stack (a node of `nodes`: id → (parent,
/// frame)), leaf first.
pub(super) fn leaf_first(
    nodes: &HashMap<u32, (Option<u32>, u32)>,
    stack: u32,
) -> impl Iterator<Item = u32> + '_ {
    let mut id = Some(stack);
    std::iter::from_fn(move || {
        let &(parent, frame) = nodes.get(&id?)?;
        id = parent;
        Some(frame)
    })
    .take(MAX_DEPTH)
}
