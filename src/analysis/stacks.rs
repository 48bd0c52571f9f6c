//! Stack analysis: pure functions over the recorded stack events.
//!
//! Inputs are the events of the perf sampler (native stacks as (file,
//! offset) frames, symbol names written at the end of recording), of the
//! in-process agent (native stacks that also carry the Python frames of the
//! same instant) and of the py-spy sampler (Python-only stacks). This module
//! - puts each native sample's Python frames in place of its interpreter
//!   frames when they are of the same instant, and never matches stacks
//!   taken at different times (`docs/stacks.md`),
//! - folds stacks per role under a "name (pid)" root frame,
//! - measures unwinding coverage (samples whose outermost native frame is a
//!   thread root: `_start`, `clone`, `clone3`),
//! - lists top functions per role, and
//! - turns each thread's samples into nested slices for the trace.
//!
//! Everything is deterministic: sorted maps, stable sorts, no hashing order
//! leaks into outputs.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

mod pools;

use super::fold::{self, FoldFrame, FoldNotes, FrameClass, Launcher, ViewFrame};
use super::Role;
use crate::event::{Event, MonoNs, Pid, SampleBatch, SampleSource, StackKind, StackStats, Tid};

/// Outermost frames that mean "the unwinder reached the thread's root".
pub const ROOT_FRAMES: &[&str] = &["_start", "clone", "clone3", "__clone", "__clone3"];
/// Native frames of the CPython interpreter loop: each one runs one or more
/// Python frames (3.11+: a run starting at an "entry" frame).
pub const EVAL_FRAMES: &[&str] = &["_PyEval_EvalFrameDefault", "PyEval_EvalFrameEx"];
/// The frame that runs one run of Python frames (GCC may split off a
/// `.cold` part, named with this prefix).
const EVAL_LOOP: &str = "_PyEval_EvalFrameDefault";
/// Same-instant Python frames that do not fit the native stack.
pub const UNMATCHED: &str = "[python: unmatched]";
pub use super::fold::NATIVE_UNKNOWN;
/// Deepest stack drawn in the trace (Perfetto keeps slices up to depth
/// 512): deeper stacks keep their innermost frames under a marker frame.
pub const TRACE_MAX_DEPTH: usize = 500;
/// Name id of the marker frame standing for the outer frames of a stack
/// deeper than [`TRACE_MAX_DEPTH`].
pub const OUTER_FRAMES_CUT: u32 = u32::MAX;
/// The coarsest trace level: a cell of 2^40 sampling periods.
pub const MAX_TRACE_LEVEL: u32 = 40;
/// Top functions listed per role.
pub const TOP_FUNCTIONS: usize = 15;

/// Process name and role, as the process-tree analysis determined them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcMeta {
    pub name: String,
    pub role: Role,
}

#[derive(Clone, Debug)]
enum Frame {
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
struct RawSample {
    t: MonoNs,
    pid: Pid,
    tid: Tid,
    stack: u32,
    /// How many recorded samples this one stands for (1 until the
    /// analysis thins, at most [`MAX_WEIGHT`]), with [`INCOMPLETE`] set when
    /// the unwinder stopped before the end of the stack (framehop's
    /// verdict) and [`AGENT`] when the in-process agent took it (its stack
    /// holds the Python frames of the same instant). Packed: a day-long
    /// recording holds millions of these.
    weight_flags: u32,
}

/// Flags in [`RawSample::weight_flags`]: the unwinding stopped early; taken
/// by the in-process agent.
const INCOMPLETE: u32 = 1 << 31;
const AGENT: u32 = 1 << 30;
const MAX_WEIGHT: u32 = AGENT - 1;

impl RawSample {
    fn weight(&self) -> u32 {
        self.weight_flags & MAX_WEIGHT
    }
    fn complete(&self) -> bool {
        self.weight_flags & INCOMPLETE == 0
    }
    fn agent(&self) -> bool {
        self.weight_flags & AGENT != 0
    }
    fn with_weight(mut self, w: u32) -> RawSample {
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
struct Thinned {
    kept: Vec<RawSample>,
    /// 0 until the first thinning.
    bucket_ns: u64,
    /// Index in `kept` of each thread's newest sample (while thinning).
    newest: HashMap<(Pid, Tid), usize>,
    seen: u64,
}

/// Bound on native (and, separately, Python) samples held by the analysis:
/// ~24 bytes each here and again once merged, so ~100 MB at the bound.
pub const ANALYSIS_MAX_SAMPLES: usize = 2_000_000;

/// The bucket never grows past this (about 13 days): a bound on the
/// thinning loop whatever the input.
const MAX_BUCKET_NS: u64 = 1 << 50;

impl Thinned {
    /// Add one thread's samples (in time order).
    #[cfg(test)]
    fn push_thread(&mut self, pid: Pid, tid: Tid, samples: impl Iterator<Item = RawSample>) {
        let v: Vec<RawSample> = samples.collect();
        self.push_slice(pid, tid, &v);
    }

    /// Add one thread's samples (in time order). Once thinning, the samples
    /// of one bucket are taken as a run: the kept sample is drawn once for
    /// the run (the same draw as one sample at a time: the run's samples
    /// are equally likely, and the kept one stays with probability
    /// weight / (weight + run)).
    fn push_slice(&mut self, pid: Pid, tid: Tid, samples: &[RawSample]) {
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
    fn coarsen(&mut self) {
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
fn sort_by_thread(v: &mut [RawSample]) {
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
fn thread_runs(v: &[RawSample]) -> impl Iterator<Item = ((Pid, Tid), usize, usize)> + '_ {
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

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The stack events of a recording, collected in one pass.
#[derive(Default)]
pub struct StackData {
    /// Python frames by line, `name (file.py:LINE)` (`--lines`), where the
    /// recording has lines; else by function.
    pub lines: bool,
    files: HashMap<u32, String>,
    native_frames: HashMap<u32, Frame>,
    py_frames: HashMap<u32, Frame>,
    symbols: HashMap<u32, String>,
    /// Native frames looked up that have no name.
    unnamed: std::collections::HashSet<u32>,
    native_nodes: HashMap<u32, (Option<u32>, u32)>,
    py_nodes: HashMap<u32, (Option<u32>, u32)>,
    native: Thinned,
    python: Thinned,
    /// The wall-clock sampler's looks at threads (native stack space).
    wall: Thinned,
    /// Samples of one batch, reused.
    scratch: Vec<RawSample>,
    stats: Vec<StackStats>,
    /// How each Python process's frames were obtained (the agent's word
    /// wins).
    py_procs: BTreeMap<Pid, PyProcInfo>,
    agent_stats: BTreeMap<Pid, AgentStats>,
    /// From perf task records: (time, comm, exec) per pid, and parents.
    comms: BTreeMap<Pid, Vec<(MonoNs, String, bool)>>,
    parents: BTreeMap<Pid, Pid>,
    forks: BTreeMap<Pid, MonoNs>,
    exits: BTreeMap<Pid, MonoNs>,
    first_exec: Option<(MonoNs, Pid)>,
}

#[derive(Clone, Debug, Default)]
struct PyProcInfo {
    version: String,
    same_instant: bool,
    timer: bool,
    detail: String,
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
    fn add_samples(&mut self, b: &SampleBatch) {
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
    fn add_agent_stats(&mut self, ev: &Event) {
        let Event::PyAgentStats {
            pid,
            samples,
            partial,
            dropped,
            late_signals,
            unknown_code,
            handler_chained,
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
    }

    /// The native stacks that are one `[perf: not unwound, …]` frame: the
    /// perf samples the reader left to the agent.
    fn not_unwound_stacks(&self) -> BTreeSet<u32> {
        let marker: BTreeSet<u32> = self
            .native_frames
            .iter()
            .filter(|(_, f)| {
                matches!(f, Frame::Marker(m) if m == crate::collect::perf::MARKER_NOT_UNWOUND)
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
                let mut id = Some(s.stack);
                // Leaf first: the innermost matching frame.
                for _ in 0..4096 {
                    let Some(&(parent, frame)) = id.and_then(|i| self.py_nodes.get(&i)) else {
                        break;
                    };
                    if let Some(Frame::Python { name, file, .. }) = self.py_frames.get(&frame) {
                        if pick(name, file) {
                            let n = match names.iter().position(|x| x == name) {
                                Some(i) => i,
                                None => {
                                    names.push(name.clone());
                                    names.len() - 1
                                }
                            };
                            return Some(n as u32);
                        }
                    }
                    id = parent;
                }
                None
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

    /// The frames of a native-space stack, leaf first.
    pub fn wall_frames(&self, stack: u32) -> Vec<WallFrame<'_>> {
        let mut out = Vec::new();
        let mut id = Some(stack);
        while let Some(&(parent, frame)) = id.and_then(|i| self.native_nodes.get(&i)) {
            if out.len() >= 4096 {
                break;
            }
            out.push(match self.native_frames.get(&frame) {
                Some(Frame::Native { file, .. }) => WallFrame::Native {
                    name: self.symbols.get(&frame).map(|s| s.as_str()),
                    file: self.files.get(file).map_or("", |f| f.as_str()),
                },
                Some(Frame::Python { name, file, .. }) => WallFrame::Python { name, file },
                Some(Frame::Marker(m)) => WallFrame::Marker(m),
                None => WallFrame::Marker("[unknown frame]"),
            });
            id = parent;
        }
        out
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

/// How a native sample got (or did not get) its Python frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Attribution {
    /// No interpreter frame on the native stack: native code only.
    #[default]
    NativeOnly,
    /// Python frames of the same instant, in place of each interpreter
    /// frame (from the in-process agent, or CPython's perf trampolines).
    SameInstant,
    /// Same instant, but one side was cut (a native stack deeper than the
    /// stack copy, or more Python frames than the agent keeps): the
    /// innermost frames are placed, the cut is marked.
    SameInstantPartial,
    /// Python frames of the same instant, but the native stack ends before
    /// any interpreter frame (unwinding stopped early: JIT-generated
    /// kernels, hand-written assembly without unwind information): the
    /// Python frames stay, a `[native frames unknown]` frame stands for the
    /// native frames between them and the native frames that were unwound.
    NativeUnknown,
    /// A native thread of a framework pool (OpenMP, TBB, OpenBLAS,
    /// `c10::ThreadPool`), shown in the Python view under the Python frames
    /// of the thread that started its work, at that thread's sample nearest
    /// in time (an estimate: see [`pools`]).
    PoolThread,
    /// Python code ran, but its frames are not known for this instant.
    Unattributed(Unattributed),
}

/// Why a native sample of Python code has no Python frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Unattributed {
    /// The process is not sampled by the in-process agent (py-spy's
    /// separate Python-only stacks are never matched in time).
    NoAgent,
    /// The process is, but this thread's samples came from perf (it had
    /// SIGTRAP blocked, or the agent's ring overflowed).
    AgentMissedThread,
    /// The agent could not read the frame chain at that instant (it was
    /// being changed), or the code object's name was lost.
    Unreadable,
    /// The frames were read but do not fit the native stack's interpreter
    /// frames (a frame being entered or left).
    Unmatched,
}

impl Unattributed {
    pub fn as_str(&self) -> &'static str {
        match self {
            Unattributed::NoAgent => "no same-instant sampler in the process",
            Unattributed::AgentMissedThread => "thread not sampled by the agent",
            Unattributed::Unreadable => "frames unreadable at that instant",
            Unattributed::Unmatched => "frames do not match the native stack",
        }
    }
}

/// A sample of the merged view: `stack` (every frame) and `py_stack` (its
/// Python view) index [`Stacks::stack`].
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub t: MonoNs,
    pub pid: Pid,
    pub tid: Tid,
    pub stack: u32,
    pub py_stack: u32,
    /// `stack` and `py_stack` with each Python frame at its line, where
    /// the recording has lines: ids of [`Stacks::lined_stack_ids`].
    pub lined_stack: u32,
    pub lined_py_stack: u32,
    pub attribution: Attribution,
    /// Recorded samples this one stands for: 1, or more when the analysis
    /// thinned a long recording (see [`ANALYSIS_MAX_SAMPLES`]). Every count
    /// sums weights.
    pub weight: u32,
}

/// Counts of how native samples got their Python frames.
#[derive(Clone, Debug, Serialize, PartialEq, Default)]
pub struct AttributionCounts {
    /// Python frames of the same instant.
    pub same_instant: u64,
    /// Same instant, innermost frames only (one side was cut).
    pub same_instant_partial: u64,
    /// Same-instant Python frames over native frames whose callers were
    /// not unwound (the stack stopped before the interpreter): shown as
    /// `Python frames;[native frames unknown];native frames unwound`.
    pub native_unknown: u64,
    /// Samples of framework pool threads (no Python of their own) that the
    /// Python view shows under the frames of the thread that started
    /// their work, at its sample nearest in time: an estimate, under a
    /// `[pool thread of …]` frame.
    pub pool_thread: u64,
    /// Python code ran but its frames are unknown for that instant: the
    /// native leaf stays under a `[python: …]` frame.
    pub unattributed: u64,
    /// No interpreter frame: native code only.
    pub native_only: u64,
    /// `unattributed`, by reason.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub unattributed_by_reason: BTreeMap<String, u64>,
}

impl AttributionCounts {
    pub fn add(&mut self, a: Attribution) {
        self.add_n(a, 1);
    }

    /// Count `n` samples (one analysed sample standing for `n` recorded).
    pub fn add_n(&mut self, a: Attribution, n: u64) {
        match a {
            Attribution::NativeOnly => self.native_only += n,
            Attribution::SameInstant => self.same_instant += n,
            Attribution::SameInstantPartial => self.same_instant_partial += n,
            Attribution::NativeUnknown => self.native_unknown += n,
            Attribution::PoolThread => self.pool_thread += n,
            Attribution::Unattributed(r) => {
                self.unattributed += n;
                *self
                    .unattributed_by_reason
                    .entry(r.as_str().to_string())
                    .or_default() += n;
            }
        }
    }

    fn merge(&mut self, o: &AttributionCounts) {
        self.same_instant += o.same_instant;
        self.same_instant_partial += o.same_instant_partial;
        self.native_unknown += o.native_unknown;
        self.pool_thread += o.pool_thread;
        self.unattributed += o.unattributed;
        self.native_only += o.native_only;
        for (r, n) in &o.unattributed_by_reason {
            *self.unattributed_by_reason.entry(r.clone()).or_default() += n;
        }
    }

    /// Samples that ran Python code (all but native-only).
    pub fn python(&self) -> u64 {
        self.same_instant + self.same_instant_partial + self.native_unknown + self.unattributed
    }
}

/// One Python process in `stacks.python.processes`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PyProcessReport {
    pub pid: Pid,
    pub name: String,
    /// CPython's version when known ("3.11.7").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// "same-instant" (the in-process agent), or "python-only" (py-spy's
    /// separate stacks; native samples stay unattributed).
    pub sampler: &'static str,
    /// Who took its native stacks: "perf-events" (gpuprof's perf events,
    /// or the agent's own perf event), "in-process-timer" (the agent's
    /// per-thread CPU-time timers); absent when it has no native samples.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub native_sampler: Option<&'static str>,
    /// Why the agent does not sample it, when it does not.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
    #[serde(flatten)]
    pub counts: AttributionCounts,
    /// py-spy's Python-only stacks of it.
    pub python_only_stacks: u64,
    /// Of `unattributed`: samples that the Python view shows under their
    /// thread's py-spy stack, read the same just before and after them (an
    /// estimate, under a `[python: py-spy, same stack before and after]`
    /// frame).
    pub py_spy_estimate: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentStats>,
}

/// The `stacks.python` section of report.json.
#[derive(Clone, Debug, Serialize, PartialEq, Default)]
pub struct PythonReport {
    #[serde(flatten)]
    pub counts: AttributionCounts,
    /// py-spy's Python-only stacks (processes the agent does not sample).
    pub python_only_stacks: u64,
    /// Of `unattributed`: samples shown under their thread's py-spy stack
    /// (an estimate; see [`PyProcessReport::py_spy_estimate`]).
    pub py_spy_estimate: u64,
    /// By CPython version ("3.11", or "unknown").
    pub by_version: BTreeMap<String, AttributionCounts>,
    pub processes: Vec<PyProcessReport>,
}

/// Which frames a flamegraph, a folded file or the trace shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum View {
    /// Python processes as the program reads: the interpreter's own frames,
    /// process start and launcher plumbing folded away (see
    /// [`super::fold`]); other processes as sampled.
    #[default]
    Python,
    /// Every frame as sampled.
    Native,
}

impl View {
    pub fn as_str(self) -> &'static str {
        match self {
            View::Python => "python",
            View::Native => "native",
        }
    }
}

impl std::str::FromStr for View {
    type Err = String;
    fn from_str(s: &str) -> Result<View, String> {
        match s {
            "python" => Ok(View::Python),
            "native" => Ok(View::Native),
            _ => Err(format!(
                "unknown flamegraph view `{s}`: use `python` (interpreter frames folded, the default) or `native` (every frame)"
            )),
        }
    }
}

/// How folded stacks are rooted and which frames they show.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FoldOptions {
    pub view: View,
    /// Worker processes of the same name share one root frame,
    /// `name (N processes)`, instead of one `name (pid)` each.
    pub merge_workers: bool,
}

/// One frame of a merged stack.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FrameInfo {
    /// As shown: `name (file.py)` for Python, the symbol (or
    /// `[library+0xoffset]`) for native code.
    pub label: String,
    pub class: FrameClass,
    /// Python: the function's qualified name; native: the symbol (empty
    /// when the file does not name the code).
    pub name: String,
    /// Python: the source file; native: the library or executable.
    pub file: String,
    /// A frame of the interpreter loop (runs Python frames).
    pub eval: bool,
    /// Python frames of the agent's samples: the line at the sample's
    /// instant (`Some(0)`: not decoded); None otherwise, and in the tables
    /// that are by function (see [`Stacks::lined`]).
    pub line: Option<u32>,
}

/// What the Python view folded in some samples, for a flamegraph's
/// subtitle.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FoldSummary {
    /// Basenames of the interpreter files whose frames were folded.
    pub interpreter_files: Vec<String>,
    pub start: bool,
    pub launchers: Vec<&'static str>,
    /// Samples of Python processes (the ones the view folds).
    pub python_samples: u64,
    /// All samples summarized.
    pub samples: u64,
}

/// One function's share of a role's samples.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TopFunction {
    pub function: String,
    /// % of samples where it is the leaf.
    pub self_pct: f64,
    /// % of samples where it is anywhere on the stack.
    pub total_pct: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RoleStacks {
    pub samples: u64,
    pub processes: u64,
    pub top_functions: Vec<TopFunction>,
}

/// The `stacks` section of report.json.
#[derive(Clone, Debug, Serialize, PartialEq, Default)]
pub struct StacksReport {
    /// Which sampler took the native stacks: "perf-events", or
    /// "in-process-timer" (perf_event_open refused, or `--sampler timer`);
    /// "python-only" when only py-spy's Python stacks exist, "none" when
    /// nothing was sampled.
    pub sampler: String,
    /// Why, in a line (the native sampler's own description).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub sampler_detail: String,
    /// The recording named its native sampler (older recordings and
    /// hand-built ones do not): the flamegraph subtitles name it.
    #[serde(skip)]
    pub sampler_named: bool,
    /// Native samples recorded (all roles).
    pub samples: u64,
    pub samples_per_role: BTreeMap<String, u64>,
    /// Records the kernel dropped (ring buffers full).
    pub lost_records: u64,
    /// Share of native samples whose stack reaches the thread's root: the
    /// outermost frame is `_start`, `clone` or `clone3`, or the unwinder
    /// found the end of the stack (CFI: return address undefined).
    pub unwind_coverage: f64,
    /// Samples where the unwinder stopped early (its own count).
    pub unwind_truncated: u64,
    pub frequency_hz: f64,
    /// py-spy's Python stacks recorded.
    pub python_stacks: u64,
    pub python_errors: u64,
    /// How native samples got their Python frames, per process and version.
    pub python: PythonReport,
    /// Native samples whose Python frames came with the native stack itself:
    /// CPython's perf trampolines (`-X perf`), named from `/tmp/perf-PID.map`
    /// (counted as `python.same_instant` too).
    pub python_from_perf_map: u64,
    /// Perf samples the reader left to the agent (not unwound) of threads
    /// the analysis gave to perf, each replaced by an agent sample of the
    /// same thread nearest in time (see `stand_in_for_covered`).
    pub not_unwound_stood_in: u64,
    /// Those with no agent sample near them, shown as `[perf: not unwound,
    /// the agent sampled this thread]`.
    pub not_unwound: u64,
    /// CPU time of the samplers (perf reader + py-spy), in seconds.
    pub sampler_cpu_s: f64,
    /// 1 normally; about k when the recording held more native samples than
    /// the analysis keeps in memory and each thread kept one sample per
    /// `analysis_bucket_ms` standing for the k recorded in it (see
    /// [`ANALYSIS_MAX_SAMPLES`]). Counts here are of recorded samples.
    pub analysis_stride: u64,
    /// The bucket of that thinning (0 when every sample was analysed).
    pub analysis_bucket_ms: f64,
    pub roles: BTreeMap<String, RoleStacks>,
}

/// The merged stacks of a recording.
#[derive(Clone, Default)]
pub struct Stacks {
    frames: Vec<FrameInfo>,
    /// Per frame id of named native code: the lowest file offset sampled in
    /// it (frames are merged by function, not by instruction); see
    /// [`Stacks::frame_offset`].
    frame_offsets: Vec<Option<u64>>,
    stacks: Vec<Vec<u32>>,
    /// What the Python view folded, per stack id of the full view.
    fold_notes: HashMap<u32, FoldNotes>,
    /// Processes that ran Python (the ones the Python view folds).
    python_pids: std::collections::BTreeSet<Pid>,
    /// Samples sorted by (pid, tid, t).
    pub samples: Vec<Sample>,
    /// py-spy's Python-only stacks of processes whose native samples have
    /// no same-instant Python frames (`stack` indexes [`Stacks::stack`]).
    pub python_only: Vec<Sample>,
    pub procs: BTreeMap<Pid, ProcMeta>,
    /// Native sampling period in ns (0 when unknown).
    pub period_ns: u64,
    /// Each thread has at most one sample per bucket of this width (ns)
    /// when the analysis thinned the recording; 0 otherwise.
    pub bucket_ns: u64,
    pub report: StacksReport,
    /// The tables with each Python frame at its line, when the ones above
    /// are by function (no `--lines`) and the recording has lines; None
    /// when the tables above are those already.
    lined: Option<Box<Lined>>,
}

/// Frames and stacks with Python frames by line (see
/// [`Stacks::collapse_lines`]).
#[derive(Clone, Default)]
struct Lined {
    frames: Vec<FrameInfo>,
    frame_offsets: Vec<Option<u64>>,
    stacks: Vec<Vec<u32>>,
}

impl std::fmt::Debug for Stacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stacks")
            .field("samples", &self.samples.len())
            .field("stacks", &self.stacks.len())
            .field("report", &self.report)
            .finish()
    }
}

/// A recorded frame of a native stack, for merging: native code, a Python
/// frame of the same instant (`true`: an entry frame), or a marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Native,
    Python(bool),
    Marker,
}

struct Resolver<'a> {
    d: &'a StackData,
    native_cache: HashMap<u32, Vec<(u32, Kind)>>,
    py_cache: HashMap<u32, Vec<(u32, bool)>>,
    frames: Vec<FrameInfo>,
    frame_ids: HashMap<FrameInfo, u32>,
    native_name: HashMap<u32, u32>,
    py_name: HashMap<u32, u32>,
}

/// `/tmp/perf-<pid>.map`: JIT code named by the process (CPython's perf
/// trampolines name Python functions `py::qualname:filename`).
fn is_perf_map(path: &str) -> bool {
    path.strip_prefix("/tmp/perf-")
        .and_then(|r| r.strip_suffix(".map"))
        .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The file part of a Python frame's label: the file's name, with its
/// folder where the name alone says nothing — every package has an
/// `__init__.py`, so `<module> (__init__.py)` does not say which import ran
/// (`<module> (torch/__init__.py)` does).
pub(crate) fn py_file_label(path: &str) -> &str {
    let base = basename(path);
    if !matches!(base, "__init__.py" | "__main__.py") {
        return base;
    }
    let dir = path[..path.len() - base.len()].trim_end_matches('/');
    let parent = basename(dir);
    if parent.is_empty() {
        base
    } else {
        &path[dir.len() - parent.len()..]
    }
}

impl<'a> Resolver<'a> {
    fn intern(&mut self, f: FrameInfo) -> u32 {
        if let Some(id) = self.frame_ids.get(&f) {
            return *id;
        }
        let id = self.frames.len() as u32;
        self.frames.push(f.clone());
        self.frame_ids.insert(f, id);
        id
    }

    fn intern_python(&mut self, name: &str, file: &str) -> u32 {
        self.intern_python_at(name, file, None)
    }

    /// A Python frame, `name (file.py)`, or with `--lines`
    /// `name (file.py:LINE)` (`file.py:?` when its line could not be
    /// decoded) where the recording has its line.
    fn intern_python_at(&mut self, name: &str, file: &str, line: Option<u32>) -> u32 {
        let file_label = clean(py_file_label(file));
        let label = match line.filter(|_| self.d.lines) {
            Some(0) => format!("{} ({file_label}:?)", clean(name)),
            Some(l) => format!("{} ({file_label}:{l})", clean(name)),
            None => format!("{} ({file_label})", clean(name)),
        };
        // Interned by line even when labelled by function: the profiles
        // keep the lines (see `Stacks::collapse_lines`).
        self.intern(FrameInfo {
            label,
            class: FrameClass::Python,
            name: name.to_string(),
            file: file.to_string(),
            eval: false,
            line,
        })
    }

    fn native_frame_name(&mut self, frame: u32) -> u32 {
        if let Some(n) = self.native_name.get(&frame) {
            return *n;
        }
        let loc = match self.d.native_frames.get(&frame) {
            Some(Frame::Native { file, offset }) => {
                Some((self.d.files.get(file).map_or("?", |p| p.as_str()), *offset))
            }
            Some(Frame::Python {
                name, file, line, ..
            }) => {
                let (name, file, line) = (name.clone(), file.clone(), *line);
                let id = self.intern_python_at(&name, &file, line);
                self.native_name.insert(frame, id);
                return id;
            }
            Some(Frame::Marker(m)) => {
                let m = m.clone();
                let id = self.intern(FrameInfo {
                    label: clean(&m),
                    class: FrameClass::Marker,
                    name: m,
                    file: String::new(),
                    eval: false,
                    line: None,
                });
                self.native_name.insert(frame, id);
                return id;
            }
            None => None,
        };
        let sym = self.d.symbols.get(&frame);
        let id = match (sym, loc) {
            // A CPython perf trampoline: the Python function itself.
            (Some(sym), Some((path, _))) if is_perf_map(path) && sym.starts_with("py::") => {
                let rest = &sym["py::".len()..];
                let (name, file) = rest.split_once(':').unwrap_or((rest, ""));
                self.intern_python(name, file)
            }
            (Some(sym), loc) => {
                let file = loc.map_or(String::new(), |l| l.0.to_string());
                let eval = EVAL_FRAMES.contains(&sym.as_str());
                // Long C++ names shortened in the label, whole in `name`.
                self.intern(FrameInfo {
                    label: clean(&super::symbols::short_label(sym)),
                    class: FrameClass::Native,
                    name: sym.clone(),
                    file,
                    eval,
                    line: None,
                })
            }
            (None, Some((path, offset))) => {
                let label = format!("[{}+{:#x}]", clean(basename(path)), offset);
                self.intern(FrameInfo {
                    name: String::new(),
                    label,
                    class: FrameClass::Native,
                    file: path.to_string(),
                    eval: false,
                    line: None,
                })
            }
            (None, None) => self.intern(FrameInfo {
                label: "[unknown]".into(),
                class: FrameClass::Marker,
                name: "[unknown]".into(),
                file: String::new(),
                eval: false,
                line: None,
            }),
        };
        self.native_name.insert(frame, id);
        id
    }

    fn py_frame_name(&mut self, frame: u32) -> (u32, bool) {
        let entry = matches!(
            self.d.py_frames.get(&frame),
            Some(Frame::Python { entry: true, .. })
        );
        if let Some(n) = self.py_name.get(&frame) {
            return (*n, entry);
        }
        let id = match self.d.py_frames.get(&frame) {
            Some(Frame::Python { name, file, .. }) => {
                let (name, file) = (name.clone(), file.clone());
                self.intern_python(&name, &file)
            }
            _ => self.intern(FrameInfo {
                label: "[unknown python]".into(),
                class: FrameClass::Marker,
                name: "[unknown python]".into(),
                file: String::new(),
                eval: false,
                line: None,
            }),
        };
        self.py_name.insert(frame, id);
        (id, entry)
    }

    /// Frames of a recorded native stack, outermost first, with their kind.
    fn native(&mut self, stack: u32) -> Vec<(u32, Kind)> {
        if let Some(v) = self.native_cache.get(&stack) {
            return v.clone();
        }
        let mut frames = Vec::new();
        let mut cur = Some(stack);
        while let Some(id) = cur {
            let Some(&(parent, frame)) = self.d.native_nodes.get(&id) else {
                break;
            };
            frames.push(frame);
            cur = parent;
            if frames.len() > 4096 {
                break;
            }
        }
        frames.reverse();
        let v: Vec<(u32, Kind)> = frames
            .into_iter()
            .map(|f| {
                let kind = match self.d.native_frames.get(&f) {
                    Some(Frame::Python { entry, .. }) => Kind::Python(*entry),
                    Some(Frame::Marker(_)) => Kind::Marker,
                    _ => Kind::Native,
                };
                (self.native_frame_name(f), kind)
            })
            .collect();
        self.native_cache.insert(stack, v.clone());
        v
    }

    /// A native frame of the interpreter loop that runs one run of Python
    /// frames.
    fn is_eval_loop(&self, id: u32) -> bool {
        let f = &self.frames[id as usize];
        f.class != FrameClass::Python && f.name.starts_with(EVAL_LOOP)
    }

    /// Python (frame, entry) frames, outermost first.
    fn python(&mut self, stack: u32) -> Vec<(u32, bool)> {
        if let Some(v) = self.py_cache.get(&stack) {
            return v.clone();
        }
        let mut frames = Vec::new();
        let mut cur = Some(stack);
        while let Some(id) = cur {
            let Some(&(parent, frame)) = self.d.py_nodes.get(&id) else {
                break;
            };
            frames.push(frame);
            cur = parent;
            if frames.len() > 4096 {
                break;
            }
        }
        frames.reverse();
        let v: Vec<(u32, bool)> = frames.into_iter().map(|f| self.py_frame_name(f)).collect();
        self.py_cache.insert(stack, v.clone());
        v
    }
}

/// Make a name safe for the folded format (`;` separates frames, the last
/// space separates the count).
pub(crate) fn clean(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            ';' => ':',
            '\n' | '\r' | '\t' => ' ',
            c => c,
        })
        .collect()
}

/// A thread's py-spy stacks stand in for its missing Python frames only
/// when this share of its consecutive reads are the same stack …
const ESTIMATE_MIN_AGREEMENT: f64 = 0.8;
/// … over at least this many pairs of reads.
const ESTIMATE_MIN_PAIRS: usize = 3;

/// The markers `merge_same_instant` places.
struct Markers {
    unmatched: u32,
    truncated: u32,
    native_unknown: u32,
}

/// An agent sample: its native frames and its Python frames of the same
/// instant, each outermost first, and maybe a marker (told apart by kind,
/// not position: the recorder puts the Python frames first, earlier
/// recordings have them after the native leaf). Each interpreter frame
/// is followed by the run of Python frames it executed (runs start at entry
/// frames), matched from the innermost outwards, so that every native frame
/// stays (the native view) and the Python view folds the interpreter's. All must match when both
/// sides are complete; when one side is cut, the innermost pairs are placed
/// and the cut is marked. Otherwise nothing is placed, and a marker after
/// the outermost interpreter frame says why (the native frames stay).
fn merge_same_instant(
    frames: &[(u32, Kind)],
    complete: bool,
    is_eval: &dyn Fn(u32) -> bool,
    is_perf_map_python: &dyn Fn(u32) -> bool,
    m: &Markers,
) -> (Vec<u32>, Attribution) {
    // Python frames of perf trampolines, if the job set them too, are the
    // same functions the agent read: the agent's are used.
    let names: Vec<u32> = frames
        .iter()
        .filter(|f| f.1 == Kind::Native && !is_perf_map_python(f.0))
        .map(|f| f.0)
        .collect();
    let python: Vec<(u32, bool)> = frames
        .iter()
        .filter_map(|f| match f.1 {
            Kind::Python(e) => Some((f.0, e)),
            _ => None,
        })
        .collect();
    let marker = frames.iter().find(|f| f.1 == Kind::Marker).map(|f| f.0);
    let truncated = marker == Some(m.truncated);
    let evals: Vec<usize> = (0..names.len()).filter(|&i| is_eval(names[i])).collect();
    let unattributed = |why: Unattributed, mark: u32| match evals.first() {
        Some(&first) => {
            let mut out = names.clone();
            out.insert(first + 1, mark);
            (out, Attribution::Unattributed(why))
        }
        None => (names.clone(), Attribution::NativeOnly),
    };
    if let Some(mk) = marker.filter(|&mk| mk != m.truncated) {
        return unattributed(Unattributed::Unreadable, mk);
    }
    if python.is_empty() {
        // Not running Python code; or a thread without a thread state whose
        // stack still shows the loop (being set up or torn down).
        return unattributed(Unattributed::Unmatched, m.unmatched);
    }
    // Runs, outermost first; each starts at an entry frame (the first may
    // not, when the outer frames were cut).
    let mut runs: Vec<&[(u32, bool)]> = Vec::new();
    let mut start = 0;
    for i in 1..python.len() {
        if python[i].1 {
            runs.push(&python[start..i]);
            start = i;
        }
    }
    runs.push(&python[start..]);
    let k = runs.len().min(evals.len());
    let outer_runs = runs.len() - k;
    let outer_evals = evals.len() - k;
    // Unpaired outer runs need a cut native stack; unpaired outer
    // interpreter frames need cut Python frames.
    if evals.is_empty() {
        // Python frames, and yet no interpreter frame on the native stack:
        // the unwinder stopped before reaching it (code without unwind
        // information; it may even take a garbage return address for the
        // end of the stack, so `complete` is no proof). The Python frames
        // are the outer part of the same instant; what lies between is
        // said to be unknown.
        let mut out: Vec<u32> = python.iter().map(|f| f.0).collect();
        if truncated {
            out.insert(0, m.truncated);
        }
        out.push(m.native_unknown);
        out.extend_from_slice(&names);
        return (out, Attribution::NativeUnknown);
    }
    if (outer_runs > 0 && complete) || (outer_evals > 0 && !truncated) || k == 0 {
        return unattributed(Unattributed::Unmatched, m.unmatched);
    }
    let mut out = Vec::with_capacity(names.len() + python.len() + 1);
    for run in &runs[..outer_runs] {
        out.extend(run.iter().map(|f| f.0));
    }
    let first_pair = evals[outer_evals];
    // Above the first pair: native frames (the interpreter frames there ran
    // Python frames the agent did not keep).
    out.extend_from_slice(&names[..first_pair]);
    if truncated {
        out.push(m.truncated);
    }
    for (j, run) in runs[outer_runs..].iter().enumerate() {
        let e = evals[outer_evals + j];
        out.push(names[e]);
        out.extend(run.iter().map(|f| f.0));
        let next = evals
            .get(outer_evals + j + 1)
            .copied()
            .unwrap_or(names.len());
        out.extend_from_slice(&names[e + 1..next]);
    }
    let exact = outer_runs == 0 && outer_evals == 0 && !truncated;
    let how = if exact {
        Attribution::SameInstant
    } else {
        Attribution::SameInstantPartial
    };
    (out, how)
}

/// The agent's samples of a thread are used unless they are far fewer than
/// perf's. Both sample the thread's CPU time at the same rate, but with
/// timers of their own: on a loaded machine their counts differ by up to
/// ~10% (measured). Far fewer means the agent missed the thread (it blocked
/// SIGTRAP, or the agent's ring overflowed), and perf's samples are used.
pub fn agent_covers(agent: u64, perf: u64) -> bool {
    agent > 0 && 2 * agent + 5 >= perf
}

/// Merge and summarize. `meta` gives each process's name and role (the
/// process-tree analysis; fall back to [`StackData::fallback_meta`]).
/// Only native samples inside `window` (the recorded window) are used.
/// The native samples are moved out of `d` (memory: a long recording holds
/// millions of them).
pub fn analyze(
    d: &mut StackData,
    window: (MonoNs, MonoNs),
    meta: &dyn Fn(Pid) -> ProcMeta,
) -> Stacks {
    let bucket_ns = d.native.bucket_ns;
    let mut native = std::mem::take(&mut d.native.kept);
    native.retain(|s| s.t >= window.0 && s.t <= window.1);
    sort_by_thread(&mut native);
    let d: &StackData = d;
    let mut rep = StacksReport::default();
    let agent_pids = keep_one_sampler(&mut native, d, &mut rep);

    let mut m = Merger::new(d);
    let mut samples = Vec::with_capacity(native.len());
    let mut rooted = 0u64;
    let mut weights = 0u64;
    let mut per_proc: BTreeMap<Pid, AttributionCounts> = BTreeMap::new();
    for s in &native {
        let why = if agent_pids.contains(&s.pid) {
            Unattributed::AgentMissedThread
        } else {
            Unattributed::NoAgent
        };
        let Merged {
            id,
            attribution,
            root,
            perf_map,
        } = m.merged(s, why);
        // Reaching the root: the outermost frame is named as a thread root,
        // or the unwinder found the end of the stack there (the CFI of
        // `_start` and `clone3` marks the return address undefined; this
        // also covers roots that a stripped libc leaves unnamed).
        let w = s.weight() as u64;
        weights += w;
        if root || s.complete() {
            rooted += w;
        }
        if perf_map {
            rep.python_from_perf_map += w;
        }
        samples.push(Sample {
            t: s.t,
            pid: s.pid,
            tid: s.tid,
            stack: id,
            py_stack: id,
            lined_stack: id,
            lined_py_stack: id,
            attribution,
            weight: s.weight(),
        });
    }
    drop(native);

    let (python_only, py_only_per_proc) = m.python_only(window, &agent_pids);
    let Merger {
        r: Resolver {
            mut frames,
            native_name,
            ..
        },
        stacks,
        ..
    } = m;
    classify_native_frames(&mut frames);
    let frame_offsets = lowest_offsets(d, &native_name, &frames);
    let period_ns = sampler_figures(&mut rep, d, &samples, bucket_ns);
    let pool_links = pools::link(&samples, &frames, &stacks, period_ns, bucket_ns);
    for l in &pool_links {
        samples[l.sample].attribution = Attribution::PoolThread;
    }
    for s in &samples {
        per_proc
            .entry(s.pid)
            .or_default()
            .add_n(s.attribution, s.weight as u64);
    }

    let mut procs = BTreeMap::new();
    for s in samples.iter().chain(&python_only) {
        procs.entry(s.pid).or_insert_with(|| meta(s.pid));
    }
    rep.python = python_report(d, &procs, &per_proc, &py_only_per_proc, &agent_pids);
    rep.samples = weights;
    rep.unwind_coverage = if weights == 0 {
        0.0
    } else {
        round4(rooted as f64 / weights as f64)
    };

    let mut st = Stacks {
        frames,
        frame_offsets,
        stacks,
        fold_notes: HashMap::new(),
        python_pids: Default::default(),
        samples,
        python_only,
        procs,
        period_ns,
        bucket_ns,
        report: rep,
        lined: None,
    };
    st.report.analysis_stride = if bucket_ns > 0 && period_ns > 0 {
        (bucket_ns as f64 / period_ns as f64).round().max(1.0) as u64
    } else {
        1
    };
    st.report.analysis_bucket_ms = round4(bucket_ns as f64 / 1e6);
    // Each step below interns the stacks it makes on its own: where each
    // began, so that collapsing the lines keeps them apart as they were.
    let mut phases = vec![st.stacks.len()];
    st.build_python_view();
    phases.push(st.stacks.len());
    st.place_pool_samples(&pool_links);
    phases.push(st.stacks.len());
    st.estimate_python_frames();
    st.collapse_lines(&phases, !d.lines);
    st.summarize_roles();
    st
}

/// Per merged frame id, the lowest file offset of the native frames named
/// by it (None for Python frames, markers and frames made later).
fn lowest_offsets(
    d: &StackData,
    native_name: &HashMap<u32, u32>,
    frames: &[FrameInfo],
) -> Vec<Option<u64>> {
    let mut out = vec![None; frames.len()];
    for (raw, id) in native_name {
        let Some(Frame::Native { offset, .. }) = d.native_frames.get(raw) else {
            continue;
        };
        if frames[*id as usize].class == FrameClass::Python {
            // A CPython perf trampoline named as its Python function.
            continue;
        }
        let e: &mut Option<u64> = &mut out[*id as usize];
        *e = Some(e.map_or(*offset, |o| o.min(*offset)));
    }
    out
}

/// How far (ns) an agent sample of a thread may lie from a perf sample the
/// reader left to it, to stand in for it (see [`stand_in_for_covered`]).
/// Both sample the thread's CPU time at the same rate, so while the agent
/// keeps up its nearest sample is about a period away; a second is far
/// past that, and still close enough that the stack is of that moment's
/// work, not of another phase of the job.
const STAND_IN_MAX_NS: u64 = 1_000_000_000;

/// Each thread's samples come from one sampler: the agent's where it
/// sampled the thread, perf's otherwise (never both: no double counting).
/// Keeps those in `native` (sorted by (pid, tid, t), as it comes); returns
/// the processes the agent sampled, and counts in `rep` the perf samples
/// the reader left to the agent of a thread that ended on perf's side.
fn keep_one_sampler(
    native: &mut Vec<RawSample>,
    d: &StackData,
    rep: &mut StacksReport,
) -> BTreeSet<Pid> {
    let mut per_thread: BTreeMap<(Pid, Tid), (u64, u64)> = BTreeMap::new();
    for s in native.iter() {
        let c = per_thread.entry((s.pid, s.tid)).or_default();
        if s.agent() {
            c.0 += s.weight() as u64;
        } else {
            c.1 += s.weight() as u64;
        }
    }
    let use_agent: BTreeMap<(Pid, Tid), bool> = per_thread
        .iter()
        .map(|(k, &(a, p))| (*k, agent_covers(a, p)))
        .collect();
    let agent_pids: BTreeSet<Pid> = per_thread
        .iter()
        .filter(|(_, c)| c.0 > 0)
        .map(|(k, _)| k.0)
        .chain(
            d.py_procs
                .iter()
                .filter(|(_, p)| p.same_instant)
                .map(|(pid, _)| *pid),
        )
        .collect();
    // The agent's samples of threads that go to perf, which may stand in
    // for the perf samples the reader did not unwind.
    let not_unwound = d.not_unwound_stacks();
    let spare: Vec<RawSample> = if not_unwound.is_empty() {
        Vec::new()
    } else {
        native
            .iter()
            .filter(|s| s.agent() && !use_agent[&(s.pid, s.tid)])
            .copied()
            .collect()
    };
    native.retain(|s| s.agent() == use_agent[&(s.pid, s.tid)]);
    if !not_unwound.is_empty() {
        let (stood_in, left) = stand_in_for_covered(native, &spare, &not_unwound);
        rep.not_unwound_stood_in = stood_in;
        rep.not_unwound = left;
    }
    agent_pids
}

/// The perf reader decides per sample, on the counts so far, that the agent
/// keeps up with a thread, and then does not unwind perf's sample of it
/// (`[perf: not unwound, …]`); the analysis decides per thread, on the
/// totals. A thread can end on perf's side after the reader relied on the
/// agent for some of its samples (a thread with few samples, near the
/// line). Each such sample is replaced by the thread's agent sample nearest
/// in time (within [`STAND_IN_MAX_NS`], each used once): a real sample of
/// the same thread with its same-instant stack, at its own time, keeping
/// the perf sample's weight, so the thread's CPU time stays perf's count.
/// Samples with no agent sample left near them keep the marker. `native`
/// holds the kept samples sorted by (pid, tid, t), `spare` the agent
/// samples of threads that went to perf, in the same order. Returns the
/// samples stood in for and those left marked (weighted).
fn stand_in_for_covered(
    native: &mut [RawSample],
    spare: &[RawSample],
    not_unwound: &BTreeSet<u32>,
) -> (u64, u64) {
    let (mut stood_in, mut left) = (0u64, 0u64);
    let mut moved = false;
    let mut spare_at = 0;
    let mut i = 0;
    while i < native.len() {
        let key = (native[i].pid, native[i].tid);
        let mut j = i;
        while j < native.len() && (native[j].pid, native[j].tid) == key {
            j += 1;
        }
        while spare_at < spare.len() && (spare[spare_at].pid, spare[spare_at].tid) < key {
            spare_at += 1;
        }
        let from = spare_at;
        while spare_at < spare.len() && (spare[spare_at].pid, spare[spare_at].tid) == key {
            spare_at += 1;
        }
        // Unused agent samples of this thread by (time, index).
        let mut unused: BTreeSet<(u64, usize)> = spare[from..spare_at]
            .iter()
            .enumerate()
            .map(|(k, s)| (s.t.0, k))
            .collect();
        for s in native[i..j].iter_mut() {
            if !not_unwound.contains(&s.stack) {
                continue;
            }
            let t = s.t.0;
            let before = unused.range(..(t, usize::MAX)).next_back().copied();
            let after = unused.range((t, 0)..).next().copied();
            let nearest = match (before, after) {
                (Some(b), Some(a)) => Some(if t - b.0 <= a.0 - t { b } else { a }),
                (b, a) => b.or(a),
            };
            let w = s.weight() as u64;
            match nearest.filter(|n| n.0.abs_diff(t) <= STAND_IN_MAX_NS) {
                Some(n) => {
                    unused.remove(&n);
                    *s = spare[from + n.1].with_weight(s.weight());
                    stood_in += w;
                    moved = true;
                }
                None => left += w,
            }
        }
        i = j;
    }
    if moved {
        native.sort_by_key(|s| (s.pid, s.tid, s.t));
    }
    (stood_in, left)
}

/// What decides a native sample's merged stack: (stack, taken by the
/// agent, unwound to the end, why it would be unattributed).
type MergeKey = (u32, bool, bool, Unattributed);

/// A native sample's merged stack and how its Python frames were found.
#[derive(Clone, Copy)]
struct Merged {
    id: u32,
    attribution: Attribution,
    /// The outermost native frame is a thread root.
    root: bool,
    /// The Python frames came from a perf map (CPython's trampolines).
    perf_map: bool,
}

/// Merges samples into the stacks of the analysis, each distinct case once.
struct Merger<'a> {
    r: Resolver<'a>,
    markers: Markers,
    stacks: Vec<Vec<u32>>,
    stack_ids: HashMap<Vec<u32>, u32>,
    cache: HashMap<MergeKey, Merged>,
}

impl<'a> Merger<'a> {
    fn new(d: &'a StackData) -> Merger<'a> {
        let mut r = Resolver {
            d,
            native_cache: HashMap::new(),
            py_cache: HashMap::new(),
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            native_name: HashMap::new(),
            py_name: HashMap::new(),
        };
        let mut marker = |m: &str| {
            r.intern(FrameInfo {
                label: m.to_string(),
                class: FrameClass::Marker,
                name: m.to_string(),
                file: String::new(),
                eval: false,
                line: None,
            })
        };
        let markers = Markers {
            unmatched: marker(UNMATCHED),
            truncated: marker(crate::collect::perf::MARKER_TRUNCATED),
            native_unknown: marker(NATIVE_UNKNOWN),
        };
        Merger {
            r,
            markers,
            stacks: Vec::new(),
            stack_ids: HashMap::new(),
            cache: HashMap::new(),
        }
    }

    fn merged(&mut self, s: &RawSample, why: Unattributed) -> Merged {
        let key = (s.stack, s.agent(), s.complete(), why);
        if let Some(c) = self.cache.get(&key) {
            return *c;
        }
        let r = &mut self.r;
        let nat = r.native(s.stack);
        // The outermost native frame (an agent sample's Python frames
        // come first).
        let root = nat.iter().find(|f| f.1 == Kind::Native).is_some_and(|f| {
            let f = &r.frames[f.0 as usize];
            f.class != FrameClass::Python && ROOT_FRAMES.contains(&f.name.as_str())
        });
        // Python frames among the recorded native frames: CPython's perf
        // trampolines, named from /tmp/perf-PID.map.
        let has_python = |r: &Resolver| {
            nat.iter()
                .any(|f| f.1 == Kind::Native && r.frames[f.0 as usize].class == FrameClass::Python)
        };
        // Trampoline frames are of the sampled instant, but a stack the
        // unwinder cut lacks the outer ones: partial, as for the agent.
        let perf_map_how = if s.complete() {
            Attribution::SameInstant
        } else {
            Attribution::SameInstantPartial
        };
        let (m, how, perf_map) = if s.agent() && has_python(r) {
            // The job runs with CPython's perf trampolines too: their
            // frames are this instant's Python frames already.
            (
                nat.iter()
                    .filter(|f| matches!(f.1, Kind::Native))
                    .map(|f| f.0)
                    .collect(),
                perf_map_how,
                true,
            )
        } else if s.agent() {
            let is_eval = |n: u32| r.is_eval_loop(n);
            let is_pm = |n: u32| r.frames[n as usize].class == FrameClass::Python;
            let (m, how) = merge_same_instant(&nat, s.complete(), &is_eval, &is_pm, &self.markers);
            (m, how, false)
        } else if has_python(r) {
            // CPython's perf trampolines: the native stack carries its
            // own Python frames, of the same instant.
            (nat.iter().map(|f| f.0).collect(), perf_map_how, true)
        } else {
            let runs_python = nat.iter().any(|f| r.frames[f.0 as usize].eval);
            let how = if runs_python {
                Attribution::Unattributed(why)
            } else {
                Attribution::NativeOnly
            };
            // Every frame as sampled; the Python view shows the
            // interpreter's part as `[python: not sampled]`.
            (nat.iter().map(|f| f.0).collect(), how, false)
        };
        let id = intern_stack(&mut self.stacks, &mut self.stack_ids, m);
        let merged = Merged {
            id,
            attribution: how,
            root,
            perf_map,
        };
        self.cache.insert(key, merged);
        merged
    }

    /// py-spy's stacks: the Python-only view of the processes the agent
    /// does not sample (of the others, the merged stacks hold the same
    /// frames), and their weight per process.
    fn python_only(
        &mut self,
        window: (MonoNs, MonoNs),
        agent_pids: &BTreeSet<Pid>,
    ) -> (Vec<Sample>, BTreeMap<Pid, u64>) {
        let mut python_only = Vec::new();
        let mut per_proc: BTreeMap<Pid, u64> = BTreeMap::new();
        for s in &self.r.d.python.kept {
            if s.t < window.0 || s.t > window.1 || agent_pids.contains(&s.pid) {
                continue;
            }
            let frames: Vec<u32> = self.r.python(s.stack).into_iter().map(|f| f.0).collect();
            let id = intern_stack(&mut self.stacks, &mut self.stack_ids, frames);
            *per_proc.entry(s.pid).or_default() += s.weight() as u64;
            python_only.push(Sample {
                t: s.t,
                pid: s.pid,
                tid: s.tid,
                stack: id,
                py_stack: id,
                lined_stack: id,
                lined_py_stack: id,
                attribution: Attribution::NativeOnly,
                weight: s.weight(),
            });
        }
        python_only.sort_by_key(|s| (s.pid, s.tid, s.t));
        (python_only, per_proc)
    }
}

/// The samplers' own figures into `rep` (lost records, truncations,
/// Python errors, their CPU, the frequency); returns the sampling period
/// (inferred from the samples for older or partial recordings).
fn sampler_figures(
    rep: &mut StacksReport,
    d: &StackData,
    samples: &[Sample],
    bucket_ns: u64,
) -> u64 {
    let mut period_ns = 0;
    for st in &d.stats {
        match st.kind {
            Some(StackKind::Native) => {
                rep.sampler_named = !st.sampler.is_empty();
                rep.sampler = if st.sampler.is_empty() {
                    crate::collect::perf::SAMPLER_PERF.to_string()
                } else {
                    st.sampler.clone()
                };
                rep.sampler_detail = st.detail.clone();
                rep.lost_records += st.lost_records;
                rep.unwind_truncated += st.truncated;
                if st.interval_ns > 0 {
                    period_ns = st.interval_ns;
                }
            }
            Some(StackKind::Python) => {
                rep.python_stacks += st.samples;
                rep.python_errors += st.errors;
            }
            None => {}
        }
        rep.sampler_cpu_s += st.busy_ns as f64 / 1e9;
    }
    if !d.stats.iter().any(|s| s.kind == Some(StackKind::Python)) {
        // The Python sampler's counters were not written (gpuprof was
        // killed): count the stacks in the recording.
        rep.python_stacks = d.python.seen;
    }
    if rep.sampler.is_empty() {
        rep.sampler = if !samples.is_empty() {
            // Native counters not written (gpuprof killed): the samples'
            // own sources say which.
            if d.py_procs.values().any(|p| p.timer) {
                crate::collect::perf::SAMPLER_TIMER
            } else {
                crate::collect::perf::SAMPLER_PERF
            }
        } else if rep.python_stacks > 0 {
            "python-only"
        } else {
            "none"
        }
        .to_string();
    }
    rep.sampler_cpu_s = round4(rep.sampler_cpu_s);
    rep.frequency_hz = if period_ns > 0 {
        round4(1e9 / period_ns as f64)
    } else {
        0.0
    };
    if period_ns == 0 && bucket_ns == 0 {
        // Older or partial recordings: infer from the samples.
        let mut gaps: Vec<u64> = samples
            .windows(2)
            .filter(|w| w[0].tid == w[1].tid && w[0].pid == w[1].pid)
            .map(|w| w[1].t.0.saturating_sub(w[0].t.0))
            .filter(|g| *g > 0)
            .collect();
        gaps.sort_unstable();
        period_ns = gaps.get(gaps.len() / 2).copied().unwrap_or(0);
    }
    period_ns
}

impl Stacks {
    /// `report.samples_per_role` and `report.roles`.
    fn summarize_roles(&mut self) {
        let mut roles = BTreeMap::new();
        for role in Role::ALL {
            let n = self.role_weight(Some(role));
            self.report.samples_per_role.insert(role.to_string(), n);
            if n == 0 {
                continue;
            }
            let processes = self.procs.values().filter(|m| m.role == role).count() as u64;
            roles.insert(
                role.to_string(),
                RoleStacks {
                    samples: n,
                    processes,
                    top_functions: self.top_functions(Some(role), TOP_FUNCTIONS),
                },
            );
        }
        self.report.roles = roles;
    }
}

/// `stacks.python`: per process (those that ran Python code, or that the
/// agent or py-spy saw) and per CPython version.
fn python_report(
    d: &StackData,
    procs: &BTreeMap<Pid, ProcMeta>,
    per_proc: &BTreeMap<Pid, AttributionCounts>,
    py_only: &BTreeMap<Pid, u64>,
    agent_pids: &std::collections::BTreeSet<Pid>,
) -> PythonReport {
    let mut rep = PythonReport::default();
    let pids: std::collections::BTreeSet<Pid> = per_proc
        .iter()
        .filter(|(_, c)| c.python() > 0)
        .map(|(p, _)| *p)
        .chain(py_only.keys().copied())
        .chain(d.py_procs.keys().copied())
        .collect();
    for pid in pids {
        let counts = per_proc.get(&pid).cloned().unwrap_or_default();
        let info = d.py_procs.get(&pid);
        let version = info.map(|i| i.version.clone()).filter(|v| !v.is_empty());
        let minor = version
            .as_deref()
            .map(|v| v.splitn(3, '.').take(2).collect::<Vec<_>>().join("."))
            .unwrap_or_else(|| "unknown".into());
        let same_instant = agent_pids.contains(&pid);
        rep.by_version.entry(minor).or_default().merge(&counts);
        rep.counts.merge(&counts);
        let n_py_only = py_only.get(&pid).copied().unwrap_or(0);
        rep.python_only_stacks += n_py_only;
        rep.processes.push(PyProcessReport {
            pid,
            name: procs
                .get(&pid)
                .map(|m| m.name.clone())
                .unwrap_or_else(|| d.fallback_meta(pid).name),
            version,
            sampler: if same_instant {
                "same-instant"
            } else {
                "python-only"
            },
            native_sampler: if info.is_some_and(|i| i.timer) {
                Some(crate::collect::perf::SAMPLER_TIMER)
            } else if per_proc.contains_key(&pid) {
                Some(crate::collect::perf::SAMPLER_PERF)
            } else {
                None
            },
            detail: info.map(|i| i.detail.clone()).unwrap_or_default(),
            counts,
            python_only_stacks: n_py_only,
            py_spy_estimate: 0,
            agent: d.agent_stats.get(&pid).cloned(),
        });
    }
    rep
}

/// Native frames get their class from their file: the interpreter (files
/// that hold an interpreter loop frame, libpython, `python*` executables),
/// the C runtime, or other native code.
/// The id of `frames` in `stacks`, appended when new (`ids` indexes them).
fn intern_stack(
    stacks: &mut Vec<Vec<u32>>,
    ids: &mut HashMap<Vec<u32>, u32>,
    frames: Vec<u32>,
) -> u32 {
    if let Some(id) = ids.get(&frames) {
        return *id;
    }
    let id = stacks.len() as u32;
    ids.insert(frames.clone(), id);
    stacks.push(frames);
    id
}

fn classify_native_frames(frames: &mut [FrameInfo]) {
    let interp: std::collections::HashSet<String> = frames
        .iter()
        .filter(|f| f.eval)
        .map(|f| f.file.clone())
        .collect();
    for f in frames.iter_mut() {
        if f.class == FrameClass::Native && !f.file.is_empty() {
            f.class = fold::native_class(&f.file, interp.contains(&f.file));
        }
    }
}

fn round4(x: f64) -> f64 {
    (x * 10000.0).round() / 10000.0
}

impl Stacks {
    /// Frame labels of a merged stack, outermost first.
    pub fn stack(&self, id: u32) -> impl Iterator<Item = &str> {
        self.stacks[id as usize]
            .iter()
            .map(|n| self.frames[*n as usize].label.as_str())
    }

    /// The frames of a merged stack, outermost first.
    pub fn stack_frames(&self, id: u32) -> impl Iterator<Item = &FrameInfo> {
        self.stacks[id as usize]
            .iter()
            .map(|n| &self.frames[*n as usize])
    }

    /// The stack a sample shows in `view`.
    pub fn view_stack(&self, s: &Sample, view: View) -> u32 {
        match view {
            View::Python => s.py_stack,
            View::Native => s.stack,
        }
    }

    fn role_of(&self, pid: Pid) -> Role {
        self.procs.get(&pid).map_or(Role::Other, |m| m.role)
    }

    /// Samples of processes with `role` (None: every process).
    pub fn role_samples(&self, role: Option<Role>) -> impl Iterator<Item = &Sample> + '_ {
        // Samples come grouped by process: look each process up once.
        let mut last: Option<(Pid, bool)> = None;
        self.samples.iter().filter(move |s| {
            let Some(r) = role else { return true };
            match last {
                Some((pid, keep)) if pid == s.pid => keep,
                _ => {
                    let keep = self.role_of(s.pid) == r;
                    last = Some((s.pid, keep));
                    keep
                }
            }
        })
    }

    /// Recorded samples of processes with `role` (None: every process):
    /// the sum of the analysed samples' weights.
    pub fn role_weight(&self, role: Option<Role>) -> u64 {
        self.role_samples(role).map(|s| s.weight as u64).sum()
    }

    /// py-spy's Python-only stacks of processes with `role` (None: every
    /// process).
    pub fn python_only_role(&self, role: Option<Role>) -> impl Iterator<Item = &Sample> + '_ {
        self.python_only
            .iter()
            .filter(move |s| role.map_or(true, |r| self.role_of(s.pid) == r))
    }

    /// The root frame of a process: "name (pid)".
    pub fn root_frame(&self, pid: Pid) -> String {
        let name = self.procs.get(&pid).map_or("?", |m| m.name.as_str());
        format!("{} ({})", clean(name), pid)
    }

    /// Worker processes that share a name, with more than one process:
    /// (name, processes), sorted by name.
    pub fn worker_groups(&self) -> Vec<(String, usize)> {
        let mut n: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.procs.values().filter(|m| m.role == Role::Worker) {
            *n.entry(m.name.as_str()).or_default() += 1;
        }
        n.into_iter()
            .filter(|(_, k)| *k > 1)
            .map(|(name, k)| (name.to_string(), k))
            .collect()
    }

    /// Root frames per process: "name (pid)", or "name (N processes)" for
    /// worker processes that share their name with others when `merge`.
    fn roots(&self, merge: bool) -> HashMap<Pid, String> {
        let groups: HashMap<String, usize> = if merge {
            self.worker_groups().into_iter().collect()
        } else {
            HashMap::new()
        };
        self.procs
            .iter()
            .map(|(pid, m)| {
                let root = match groups.get(&m.name) {
                    Some(n) if m.role == Role::Worker => {
                        format!("{} ({n} processes)", clean(&m.name))
                    }
                    _ => self.root_frame(*pid),
                };
                (*pid, root)
            })
            .collect()
    }

    /// [`fold::python_view`] of a stack: what its frames fold into.
    fn fold_view(&self, stack: u32) -> (Vec<ViewFrame>, FoldNotes) {
        let ff: Vec<FoldFrame> = self.stacks[stack as usize]
            .iter()
            .map(|f| {
                let fi = &self.frames[*f as usize];
                FoldFrame {
                    class: fi.class,
                    name: &fi.name,
                    file: &fi.file,
                    eval: fi.eval,
                }
            })
            .collect();
        fold::python_view(&ff)
    }

    /// Compute every sample's Python view (see [`super::fold`]): for
    /// processes that ran Python (a Python or interpreter frame in any of
    /// their samples); others keep every frame.
    fn build_python_view(&mut self) {
        use std::collections::BTreeSet;
        let mut python_pids: BTreeSet<Pid> = BTreeSet::new();
        let mut pythonish: HashMap<u32, bool> = HashMap::new();
        for s in &self.samples {
            if python_pids.contains(&s.pid) {
                continue;
            }
            let py = *pythonish.entry(s.stack).or_insert_with(|| {
                self.stacks[s.stack as usize].iter().any(|f| {
                    matches!(
                        self.frames[*f as usize].class,
                        FrameClass::Python | FrameClass::Interpreter
                    )
                })
            });
            if py {
                python_pids.insert(s.pid);
            }
        }
        let mut view_ids: HashMap<Vec<u32>, u32> = HashMap::new();
        let mut memo: HashMap<u32, u32> = HashMap::new();
        let mut made: HashMap<&'static str, u32> = HashMap::new();
        let mut libs: HashMap<String, u32> = HashMap::new();
        for i in 0..self.samples.len() {
            let s = self.samples[i];
            if !python_pids.contains(&s.pid) {
                continue;
            }
            if let Some(v) = memo.get(&s.stack) {
                self.samples[i].py_stack = *v;
                continue;
            }
            let (view, notes) = self.fold_view(s.stack);
            let full = self.stacks[s.stack as usize].clone();
            let mut out = Vec::with_capacity(view.len());
            for v in view {
                out.push(match v {
                    ViewFrame::Input(k) => full[k],
                    ViewFrame::Library(k) => {
                        let f = &self.frames[full[k] as usize];
                        let file = f.file.clone();
                        let class = f.class;
                        *libs.entry(file.clone()).or_insert_with(|| {
                            let label = format!("[{}]", clean(basename(&file)));
                            self.frames.push(FrameInfo {
                                label,
                                class,
                                name: String::new(),
                                file,
                                eval: false,
                                line: None,
                            });
                            self.frames.len() as u32 - 1
                        })
                    }
                    ViewFrame::Made(label) => *made.entry(label).or_insert_with(|| {
                        self.frames.push(FrameInfo {
                            label: label.to_string(),
                            class: FrameClass::Marker,
                            name: label.to_string(),
                            file: String::new(),
                            eval: false,
                            line: None,
                        });
                        self.frames.len() as u32 - 1
                    }),
                });
            }
            let id = if out == full {
                s.stack
            } else {
                intern_stack(&mut self.stacks, &mut view_ids, out)
            };
            self.fold_notes.insert(s.stack, notes);
            memo.insert(s.stack, id);
            self.samples[i].py_stack = id;
        }
        self.python_pids = python_pids;
    }

    /// The best honest fallback for Python processes without same-instant
    /// frames (`gpuprof attach`, `--python-frames py-spy`, interpreters the
    /// agent cannot read): in the Python view, a native sample that ran
    /// Python code shows its thread's py-spy stack when py-spy read the
    /// same stack just before and just after it (the two reads at most two
    /// read intervals apart), under a `[python: py-spy, same stack before
    /// and after]` frame — so the role flamegraphs name the Python function
    /// that ran, and say that it is an estimate. A thread whose consecutive
    /// reads differ often (it switches functions faster than py-spy reads
    /// it) gets no estimate at all: between two equal reads it may still
    /// have been elsewhere. The samples stay `unattributed`; the native
    /// view keeps every frame as taken.
    fn estimate_python_frames(&mut self) {
        let Some(not_sampled) = self
            .frames
            .iter()
            .position(|f| f.class == FrameClass::Marker && f.label == fold::NOT_SAMPLED)
        else {
            return;
        };
        let not_sampled = not_sampled as u32;
        // Per thread: its py-spy reads, how far apart they are (median), and
        // whether its consecutive reads agree often enough.
        let mut runs: HashMap<(Pid, Tid), (usize, usize, u64)> = HashMap::new();
        let mut i = 0;
        while i < self.python_only.len() {
            let (pid, tid) = (self.python_only[i].pid, self.python_only[i].tid);
            let mut j = i;
            while j < self.python_only.len()
                && (self.python_only[j].pid, self.python_only[j].tid) == (pid, tid)
            {
                j += 1;
            }
            let run = &self.python_only[i..j];
            let mut gaps: Vec<u64> = run
                .windows(2)
                .map(|w| w[1].t.0.saturating_sub(w[0].t.0))
                .collect();
            gaps.sort_unstable();
            let floor = self.period_ns.max(1_000_000);
            let spacing = gaps
                .get(gaps.len() / 2)
                .copied()
                .unwrap_or(floor)
                .clamp(floor, 100_000_000);
            let pairs: Vec<bool> = run
                .windows(2)
                .filter(|w| w[1].t.0.saturating_sub(w[0].t.0) <= 2 * spacing)
                .map(|w| w[0].stack == w[1].stack)
                .collect();
            let agree = pairs.iter().filter(|a| **a).count();
            if pairs.len() >= ESTIMATE_MIN_PAIRS
                && agree as f64 >= ESTIMATE_MIN_AGREEMENT * pairs.len() as f64
            {
                runs.insert((pid, tid), (i, j, spacing));
            }
            i = j;
        }
        if runs.is_empty() {
            return;
        }
        let marker = self.frames.len() as u32;
        self.frames.push(FrameInfo {
            label: fold::PYSPY_BRACKETED.to_string(),
            class: FrameClass::Marker,
            name: fold::PYSPY_BRACKETED.to_string(),
            file: String::new(),
            eval: false,
            line: None,
        });
        let mut py_views: HashMap<u32, Vec<u32>> = HashMap::new();
        let mut made: HashMap<(u32, u32), u32> = HashMap::new();
        let mut view_ids: HashMap<Vec<u32>, u32> = HashMap::new();
        let mut per_pid: BTreeMap<Pid, u64> = BTreeMap::new();
        for k in 0..self.samples.len() {
            let s = self.samples[k];
            if self.stacks[s.py_stack as usize].first() != Some(&not_sampled) {
                continue;
            }
            let Some(&(a, b, spacing)) = runs.get(&(s.pid, s.tid)) else {
                continue;
            };
            let run = &self.python_only[a..b];
            let at = run.partition_point(|p| p.t <= s.t);
            let (Some(before), Some(after)) = (at.checked_sub(1).map(|n| &run[n]), run.get(at))
            else {
                continue;
            };
            if before.stack != after.stack || after.t.0 - before.t.0 > 2 * spacing {
                continue;
            }
            let py = before.stack;
            let id = match made.get(&(s.py_stack, py)) {
                Some(id) => *id,
                None => {
                    let view = py_views.entry(py).or_insert_with(|| {
                        let full = &self.stacks[py as usize];
                        self.fold_view(py)
                            .0
                            .into_iter()
                            .filter_map(|v| match v {
                                ViewFrame::Input(i) | ViewFrame::Library(i) => Some(full[i]),
                                ViewFrame::Made(_) => None,
                            })
                            .collect()
                    });
                    let mut out = Vec::with_capacity(view.len() + 4);
                    out.push(marker);
                    out.extend_from_slice(view);
                    out.extend_from_slice(&self.stacks[s.py_stack as usize][1..]);
                    let id = intern_stack(&mut self.stacks, &mut view_ids, out);
                    made.insert((s.py_stack, py), id);
                    id
                }
            };
            self.samples[k].py_stack = id;
            *per_pid.entry(s.pid).or_default() += 1;
        }
        for p in &mut self.report.python.processes {
            p.py_spy_estimate = per_pid.get(&p.pid).copied().unwrap_or(0);
        }
        self.report.python.py_spy_estimate = per_pid.values().sum();
    }

    /// The Python view shows this sample under its thread's py-spy stack
    /// (see `estimate_python_frames`).
    pub fn py_spy_estimate(&self, s: &Sample) -> bool {
        self.stacks[s.py_stack as usize]
            .first()
            .is_some_and(|f| self.frames[*f as usize].label == fold::PYSPY_BRACKETED)
    }

    /// What the Python view folded in `samples`.
    pub fn fold_summary<'a>(&self, samples: impl Iterator<Item = &'a Sample>) -> FoldSummary {
        use std::collections::BTreeSet;
        let mut seen: std::collections::HashSet<u32> = std::collections::HashSet::new();
        let mut files: BTreeSet<String> = BTreeSet::new();
        let mut launchers: BTreeSet<Launcher> = BTreeSet::new();
        let mut sum = FoldSummary::default();
        for s in samples {
            sum.samples += s.weight as u64;
            if !self.python_pids.contains(&s.pid) {
                continue;
            }
            let Some(n) = self.fold_notes.get(&s.stack) else {
                continue;
            };
            sum.python_samples += s.weight as u64;
            if !seen.insert(s.stack) {
                continue;
            }
            sum.start |= n.start;
            if let Some(l) = n.launcher {
                launchers.insert(l);
            }
            if n.interpreter {
                for f in self.stack_frames(s.stack) {
                    if f.class == FrameClass::Interpreter {
                        files.insert(basename(&f.file).to_string());
                    }
                }
            }
        }
        sum.interpreter_files = files.into_iter().collect();
        sum.launchers = launchers.into_iter().map(|l| l.as_str()).collect();
        sum
    }

    /// Folded stacks ("root;f1;f2 count" lines, sorted) of `samples`.
    pub fn folded<'a>(
        &self,
        samples: impl Iterator<Item = &'a Sample>,
        opts: FoldOptions,
    ) -> String {
        let roots = self.roots(opts.merge_workers);
        let mut counts: BTreeMap<(&str, u32), u64> = BTreeMap::new();
        for s in samples {
            let root = roots.get(&s.pid).map_or("?", |r| r.as_str());
            *counts
                .entry((root, self.view_stack(s, opts.view)))
                .or_default() += s.weight as u64;
        }
        let mut lines: BTreeMap<String, u64> = BTreeMap::new();
        for ((root, stack), n) in counts {
            let mut line = root.to_string();
            for f in self.stack(stack) {
                line.push(';');
                line.push_str(f);
            }
            *lines.entry(line).or_default() += n;
        }
        let mut out = String::new();
        for (l, n) in lines {
            out.push_str(&l);
            out.push(' ');
            out.push_str(&n.to_string());
            out.push('\n');
        }
        out
    }

    /// Folded stacks of `samples` with each counted by its weight × `scale`
    /// (counts rounded to whole units per line, lines of 0 left out): e.g.
    /// each sample weighted by how idle the GPU was when it was taken.
    pub fn folded_weighted<'a>(
        &self,
        samples: impl Iterator<Item = (&'a Sample, f64)>,
        opts: FoldOptions,
        scale: f64,
    ) -> String {
        let roots = self.roots(opts.merge_workers);
        let mut sums: BTreeMap<(&str, u32), f64> = BTreeMap::new();
        for (s, w) in samples {
            if w > 0.0 {
                let root = roots.get(&s.pid).map_or("?", |r| r.as_str());
                *sums
                    .entry((root, self.view_stack(s, opts.view)))
                    .or_default() += w;
            }
        }
        let mut lines: BTreeMap<String, f64> = BTreeMap::new();
        for ((root, stack), w) in sums {
            let mut line = root.to_string();
            for f in self.stack(stack) {
                line.push(';');
                line.push_str(f);
            }
            *lines.entry(line).or_default() += w;
        }
        let mut out = String::new();
        for (l, w) in lines {
            let n = (w * scale).round() as u64;
            if n > 0 {
                out.push_str(&l);
                out.push(' ');
                out.push_str(&n.to_string());
                out.push('\n');
            }
        }
        out
    }

    /// Folded stacks of one role (None: all processes).
    pub fn folded_role(&self, role: Option<Role>, opts: FoldOptions) -> String {
        self.folded(self.role_samples(role), opts)
    }

    /// The samples taken inside any of `intervals` (e.g. the GPU's idle
    /// intervals), all processes.
    pub fn samples_during<'a>(
        &'a self,
        intervals: &[(MonoNs, MonoNs)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        let mut sorted: Vec<(MonoNs, MonoNs)> =
            intervals.iter().copied().filter(|i| i.1 > i.0).collect();
        sorted.sort();
        // Merge overlaps so that one binary search answers "inside?".
        let mut iv: Vec<(MonoNs, MonoNs)> = Vec::with_capacity(sorted.len());
        for i in sorted {
            match iv.last_mut() {
                Some(last) if i.0 <= last.1 => last.1 = last.1.max(i.1),
                _ => iv.push(i),
            }
        }
        self.samples.iter().filter(move |s| {
            let i = iv.partition_point(|x| x.0 <= s.t);
            i > 0 && s.t < iv[i - 1].1
        })
    }

    /// Folded stacks of the samples taken inside any of `intervals`.
    pub fn folded_during(&self, intervals: &[(MonoNs, MonoNs)], opts: FoldOptions) -> String {
        self.folded(self.samples_during(intervals), opts)
    }

    /// The `n` functions with the most samples (total) in a role (None:
    /// all), in the Python view (what the flamegraphs show by default).
    pub fn top_functions(&self, role: Option<Role>, n: usize) -> Vec<TopFunction> {
        self.top_functions_of(self.role_samples(role), n)
    }

    /// The `n` functions with the most samples (total) among `samples`, in
    /// the Python view.
    pub fn top_functions_of<'a>(
        &'a self,
        samples: impl Iterator<Item = &'a Sample>,
        n: usize,
    ) -> Vec<TopFunction> {
        let mut self_n: HashMap<u32, u64> = HashMap::new();
        let mut total_n: HashMap<u32, u64> = HashMap::new();
        let mut count = 0u64;
        let mut seen: Vec<u32> = Vec::new();
        // Weights per stack first: far fewer stacks than samples.
        let mut per_stack = vec![0u64; self.stacks.len()];
        for s in samples {
            per_stack[s.py_stack as usize] += s.weight as u64;
        }
        for (stack, &w) in per_stack.iter().enumerate() {
            if w == 0 {
                continue;
            }
            count += w;
            let frames = &self.stacks[stack];
            if let Some(leaf) = frames.last() {
                *self_n.entry(*leaf).or_default() += w;
            }
            seen.clear();
            for f in frames {
                if !seen.contains(f) {
                    seen.push(*f);
                    *total_n.entry(*f).or_default() += w;
                }
            }
        }
        if count == 0 {
            return Vec::new();
        }
        // Frames with the same label (one function in two files) add up.
        let mut by_label: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for (f, t) in &total_n {
            let e = by_label
                .entry(self.frames[*f as usize].label.as_str())
                .or_default();
            e.0 += t;
            e.1 += self_n.get(f).copied().unwrap_or(0);
        }
        let mut v: Vec<(u64, u64, &str)> = by_label
            .into_iter()
            .map(|(name, (t, s))| (t.min(count), s, name))
            .collect();
        // Most self time first (the hot spots), then most total, then name.
        v.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)).then(a.2.cmp(b.2)));
        v.into_iter()
            .take(n)
            .map(|(t, s, name)| TopFunction {
                function: name.to_string(),
                self_pct: round4(100.0 * s as f64 / count as f64),
                total_pct: round4(100.0 * t as f64 / count as f64),
            })
            .collect()
    }

    /// Width of the trace's time cells at reduction `level`: each thread
    /// shows at most one stack per cell. Level 0 is the sampling period (or
    /// the analysis bucket when the recording was thinned); each level
    /// doubles it.
    pub fn cell_ns(&self, level: u32) -> u64 {
        let base = self.bucket_ns.max(self.period_ns).max(1);
        base.saturating_mul(1u64 << level.min(MAX_TRACE_LEVEL))
    }

    /// The coarsest level worth drawing: one cell spans every sample.
    pub fn max_level(&self) -> u32 {
        let span = match (
            self.samples.iter().map(|s| s.t).min(),
            self.samples.iter().map(|s| s.t).max(),
        ) {
            (Some(a), Some(b)) => b.0 - a.0,
            _ => 0,
        };
        (0..MAX_TRACE_LEVEL)
            .find(|l| self.cell_ns(*l) > span)
            .unwrap_or(MAX_TRACE_LEVEL)
    }

    /// Each sampled thread with its samples (in time order).
    pub fn threads(&self) -> impl Iterator<Item = &[Sample]> + '_ {
        let mut i = 0;
        std::iter::from_fn(move || {
            let first = self.samples.get(i)?;
            let n = self.samples[i..]
                .iter()
                .take_while(|s| (s.pid, s.tid) == (first.pid, first.tid))
                .count();
            let out = &self.samples[i..i + n];
            i += n;
            Some(out)
        })
    }

    /// The nested slices of one thread's samples at reduction `level`,
    /// handed to `f` as they close (children before parents).
    ///
    /// Sample times are put on a grid of [`Stacks::cell_ns`]: the
    /// frequency-driven kernel sometimes samples twice within a period, and
    /// a slice shorter than a period would claim a precision sampling does
    /// not have. Of several samples in one cell one is drawn, chosen at
    /// random (deterministically) by weight. A thread with no sample in two
    /// cells in a row did not run (or was not sampled): everything ends one
    /// cell after its last sample rather than bridging the gap. Stacks
    /// deeper than [`TRACE_MAX_DEPTH`] keep their innermost frames under a
    /// marker frame ([`OUTER_FRAMES_CUT`]).
    pub fn walk_slices(
        &self,
        thread: &[Sample],
        view: View,
        level: u32,
        f: &mut dyn FnMut(TraceSlice),
    ) {
        let Some(first) = thread.first() else {
            return;
        };
        let (pid, tid) = (first.pid, first.tid);
        let cell = self.cell_ns(level);
        let at = |slot: u64| MonoNs(slot.saturating_mul(cell));
        let mut open: Vec<(u32, MonoNs)> = Vec::new();
        let close = |open: &mut Vec<(u32, MonoNs)>,
                     keep: usize,
                     end: MonoNs,
                     f: &mut dyn FnMut(TraceSlice)| {
            while open.len() > keep {
                let (name, start) = open.pop().expect("non-empty");
                f(TraceSlice {
                    pid,
                    tid,
                    depth: open.len() as u32,
                    name,
                    start,
                    end,
                });
            }
        };
        let mut prev_slot: Option<u64> = None;
        let mut frames: Vec<u32> = Vec::new();
        let mut i = 0;
        while i < thread.len() {
            // The samples of one cell, one of them drawn by weight.
            let slot = thread[i].t.0 / cell;
            let n = thread[i..]
                .iter()
                .take_while(|s| s.t.0 / cell == slot)
                .count();
            let cell_samples = &thread[i..i + n];
            i += n;
            let chosen = if n == 1 {
                cell_samples[0]
            } else {
                let total: u64 = cell_samples.iter().map(|s| s.weight.max(1) as u64).sum();
                let mut pick = splitmix64(slot ^ ((tid.0 as u64) << 32) ^ pid.0 as u64) % total;
                *cell_samples
                    .iter()
                    .find(|s| {
                        let w = s.weight.max(1) as u64;
                        if pick < w {
                            true
                        } else {
                            pick -= w;
                            false
                        }
                    })
                    .unwrap_or(&cell_samples[n - 1])
            };
            if let Some(p) = prev_slot {
                if slot > p + 2 {
                    close(&mut open, 0, at(p + 1), f);
                }
            }
            let stack = &self.stacks[self.view_stack(&chosen, view) as usize];
            frames.clear();
            if stack.len() > TRACE_MAX_DEPTH {
                frames.push(OUTER_FRAMES_CUT);
                frames.extend_from_slice(&stack[stack.len() - (TRACE_MAX_DEPTH - 1)..]);
            } else {
                frames.extend_from_slice(stack);
            }
            let common = open
                .iter()
                .zip(&frames)
                .take_while(|(o, f)| o.0 == **f)
                .count();
            close(&mut open, common, at(slot), f);
            for fr in &frames[common..] {
                open.push((*fr, at(slot)));
            }
            prev_slot = Some(slot);
        }
        if let Some(p) = prev_slot {
            close(&mut open, 0, at(p + 1), f);
        }
    }

    /// One thread's slices at `level`, sorted by (start, depth): parents
    /// before their children, as trace readers expect at equal times.
    pub fn thread_slices(&self, thread: &[Sample], view: View, level: u32) -> Vec<TraceSlice> {
        let mut out = Vec::new();
        self.walk_slices(thread, view, level, &mut |s| out.push(s));
        out.sort_by_key(|s| (s.start, s.depth));
        out
    }

    /// Frame ids of a merged stack, outermost first (see
    /// [`Stacks::name`]).
    pub fn stack_ids(&self, id: u32) -> &[u32] {
        &self.stacks[id as usize]
    }

    /// The stack a sample shows in `view` with each Python frame at its
    /// line where the recording has it (what the profiles for other tools
    /// hold, whatever `--lines` says): an id of [`Stacks::lined_stack_ids`].
    pub fn lined_view_stack(&self, s: &Sample, view: View) -> u32 {
        match view {
            View::Python => s.lined_py_stack,
            View::Native => s.lined_stack,
        }
    }

    /// Frame ids of a stack of [`Stacks::lined_view_stack`], outermost
    /// first: ids of [`Stacks::lined_frame`].
    pub fn lined_stack_ids(&self, id: u32) -> &[u32] {
        match &self.lined {
            Some(l) => &l.stacks[id as usize],
            None => &self.stacks[id as usize],
        }
    }

    /// A frame of [`Stacks::lined_stack_ids`]: Python frames carry their
    /// line (`FrameInfo::line`).
    pub fn lined_frame(&self, id: u32) -> &FrameInfo {
        match &self.lined {
            Some(l) => &l.frames[id as usize],
            None => &self.frames[id as usize],
        }
    }

    /// [`Stacks::frame_offset`] of a frame of [`Stacks::lined_stack_ids`].
    pub fn lined_frame_offset(&self, id: u32) -> Option<u64> {
        let offsets = match &self.lined {
            Some(l) => &l.frame_offsets,
            None => &self.frame_offsets,
        };
        offsets.get(id as usize).copied().flatten()
    }

    /// The samples' stacks so far are by line: keep them as such, and,
    /// when `by_function` (no `--lines`), make the tables by function from
    /// the ones by line, keeping those for the profiles. Python
    /// frames were interned by (function, line) with their function's
    /// label; here each function becomes one frame again and each stack
    /// one stack, interned within the step that made it (`phases`: where
    /// each step's stacks begin), so the tables are the ones an analysis
    /// by function builds, in the same order.
    fn collapse_lines(&mut self, phases: &[usize], by_function: bool) {
        for s in self.samples.iter_mut().chain(self.python_only.iter_mut()) {
            s.lined_stack = s.stack;
            s.lined_py_stack = s.py_stack;
        }
        if !by_function || !self.frames.iter().any(|f| f.line.is_some()) {
            return;
        }
        let mut frames: Vec<FrameInfo> = Vec::with_capacity(self.frames.len());
        let mut frame_offsets: Vec<Option<u64>> = Vec::with_capacity(self.frames.len());
        let mut python: HashMap<FrameInfo, u32> = HashMap::new();
        let mut fmap: Vec<u32> = Vec::with_capacity(self.frames.len());
        for (i, f) in self.frames.iter().enumerate() {
            let g = FrameInfo {
                line: None,
                ..f.clone()
            };
            // Only the resolver makes Python frames, interned; the other
            // steps push frames of their own, which stay apart.
            let known = (f.class == FrameClass::Python)
                .then(|| python.get(&g).copied())
                .flatten();
            let id = match known {
                Some(id) => id,
                None => {
                    let id = frames.len() as u32;
                    if f.class == FrameClass::Python {
                        python.insert(g.clone(), id);
                    }
                    frames.push(g);
                    frame_offsets.push(self.frame_offsets.get(i).copied().flatten());
                    id
                }
            };
            fmap.push(id);
        }
        let mut stacks: Vec<Vec<u32>> = Vec::with_capacity(self.stacks.len());
        let mut ids: HashMap<(usize, Vec<u32>), u32> = HashMap::new();
        let smap: Vec<u32> = self
            .stacks
            .iter()
            .enumerate()
            .map(|(i, st)| {
                let phase = phases.partition_point(|&b| b <= i);
                let by_function: Vec<u32> = st.iter().map(|f| fmap[*f as usize]).collect();
                *ids.entry((phase, by_function.clone())).or_insert_with(|| {
                    stacks.push(by_function);
                    stacks.len() as u32 - 1
                })
            })
            .collect();
        for s in self.samples.iter_mut().chain(self.python_only.iter_mut()) {
            s.stack = smap[s.lined_stack as usize];
            s.py_stack = smap[s.lined_py_stack as usize];
        }
        self.fold_notes = std::mem::take(&mut self.fold_notes)
            .into_iter()
            .map(|(k, v)| (smap[k as usize], v))
            .collect();
        self.lined = Some(Box::new(Lined {
            frames: std::mem::replace(&mut self.frames, frames),
            frame_offsets: std::mem::replace(&mut self.frame_offsets, frame_offsets),
            stacks: std::mem::replace(&mut self.stacks, stacks),
        }));
    }

    /// Number of frames (ids are 0..name_count, and [`OUTER_FRAMES_CUT`]).
    pub fn name_count(&self) -> usize {
        self.frames.len()
    }

    /// A frame by id (ids of [`Stacks::stack_ids`]).
    pub fn frame(&self, id: u32) -> &FrameInfo {
        &self.frames[id as usize]
    }

    /// Where a named native frame lies in its file: the lowest file offset
    /// sampled in it (the analysis counts samples per function, not per
    /// instruction; an unnamed frame is one offset, also in its label).
    /// None for Python frames, markers and the Python view's `[library]`
    /// frames.
    pub fn frame_offset(&self, id: u32) -> Option<u64> {
        self.frame_offsets.get(id as usize).copied().flatten()
    }

    /// Label of a frame (a slice's name).
    pub fn name(&self, id: u32) -> &str {
        if id == OUTER_FRAMES_CUT {
            return "[outer frames not shown]";
        }
        &self.frames[id as usize].label
    }
}

/// A stack frame that was on a thread's stack from `start` to `end`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceSlice {
    pub pid: Pid,
    pub tid: Tid,
    pub depth: u32,
    pub name: u32,
    pub start: MonoNs,
    pub end: MonoNs,
}

/// Complete the process table with what perf saw: exact exit times, fork
/// times earlier than the first /proc sighting, and processes that lived
/// too briefly for /proc polling (a forked child inherits its parent's
/// command line; one that exec'd keeps only its name).
pub fn merge_perf_processes(
    d: &StackData,
    processes: &mut BTreeMap<Pid, super::Process>,
    end: MonoNs,
) {
    for pp in d.perf_processes() {
        if let Some(p) = processes.get_mut(&pp.pid) {
            // One recovered from its samples (its record was lost): perf's
            // name and parent for it, when perf saw them.
            if p.recovered {
                if p.comm == super::UNKNOWN_COMM {
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
        let mut p = super::Process::new(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn node(kind: StackKind, id: u32, parent: Option<u32>, frame: u32) -> Event {
        Event::StackNode {
            kind,
            id,
            parent,
            frame,
        }
    }

    #[test]
    fn a_package_body_is_named_with_its_package() {
        for (path, label) in [
            (
                "/venv/lib/python3.11/site-packages/torch/_tensor.py",
                "_tensor.py",
            ),
            ("/venv/site-packages/torch/__init__.py", "torch/__init__.py"),
            (
                "/venv/site-packages/torch/autograd/__init__.py",
                "autograd/__init__.py",
            ),
            ("/usr/lib/python3.11/json/__main__.py", "json/__main__.py"),
            ("pkg//__init__.py", "pkg//__init__.py"),
            ("__init__.py", "__init__.py"),
            ("/__init__.py", "__init__.py"),
            (
                "<frozen importlib._bootstrap>",
                "<frozen importlib._bootstrap>",
            ),
        ] {
            assert_eq!(py_file_label(path), label, "{path}");
        }
    }

    fn analyze_all(d: &mut StackData) -> Stacks {
        let metas: BTreeMap<Pid, ProcMeta> = d
            .sampled_pids()
            .into_iter()
            .map(|p| (p, d.fallback_meta(p)))
            .collect();
        analyze(d, (MonoNs(0), MonoNs(u64::MAX)), &|p| metas[&p].clone())
    }

    /// A hand-built recording: one Python thread whose native stack is
    /// _start → main → _PyEval_EvalFrameDefault → zlib_compress → deflate,
    /// and whose Python stack is <module> → augment.
    /// The counting sort by thread gives the order of the stable
    /// comparison sort, threads out of time order and equal times included.
    #[test]
    fn samples_sort_by_thread_as_by_comparison() {
        let v: Vec<RawSample> = (0..5000u64)
            .map(|i| {
                let r = splitmix64(i);
                // Thread 3's samples come out of time order.
                let tid = (r % 4) as i32;
                let t = if tid == 3 { r % 97 } else { i / 3 };
                RawSample {
                    t: MonoNs(t),
                    pid: Pid(tid / 2),
                    tid: Tid(tid),
                    stack: i as u32,
                    weight_flags: 1,
                }
            })
            .collect();
        let mut a = v.clone();
        a.sort_by_key(|s| (s.pid, s.tid, s.t));
        let mut b = v;
        sort_by_thread(&mut b);
        let key = |s: &RawSample| (s.pid, s.tid, s.t, s.stack);
        assert_eq!(
            a.iter().map(key).collect::<Vec<_>>(),
            b.iter().map(key).collect::<Vec<_>>()
        );
    }

    #[test]
    fn analysis_keeps_a_bounded_unbiased_share_of_samples() {
        let mut t = Thinned::default();
        // Two threads sampled every 10 ms, 5x the bound in all; stack 1 in
        // one sample of four. Thread 2 stops for 10 s in the middle.
        let n = ANALYSIS_MAX_SAMPLES as u64 * 5 / 2;
        let period = 10_000_000;
        for tid in [1, 2] {
            let samples = (0..n)
                .filter(|i| tid == 1 || !(n / 2..n / 2 + 1000).contains(i))
                .map(|i| RawSample {
                    t: MonoNs(i * period),
                    pid: Pid(1),
                    tid: Tid(tid),
                    stack: (i % 4 == 0) as u32,
                    weight_flags: 1,
                });
            t.push_thread(Pid(1), Tid(tid), samples);
        }
        assert!(t.kept.len() < ANALYSIS_MAX_SAMPLES);
        assert!(
            t.kept.len() > ANALYSIS_MAX_SAMPLES / 4,
            "kept {}",
            t.kept.len()
        );
        assert!(t.bucket_ns >= 4 * period, "bucket {}", t.bucket_ns);
        // Weights: every recorded sample is counted.
        let total: u64 = t.kept.iter().map(|s| s.weight() as u64).sum();
        assert_eq!(total, 2 * n - 1000);
        let ones: u64 = t
            .kept
            .iter()
            .filter(|s| s.stack == 1)
            .map(|s| s.weight() as u64)
            .sum();
        let share = ones as f64 / total as f64;
        assert!((share - 0.25).abs() < 0.01, "share {share}");
        // Thread 1 ran throughout: one sample in every bucket.
        let mut buckets: Vec<u64> = t
            .kept
            .iter()
            .filter(|s| s.tid == Tid(1))
            .map(|s| s.t.0 / t.bucket_ns)
            .collect();
        buckets.sort_unstable();
        let (lo, hi) = (buckets[0], *buckets.last().unwrap());
        assert_eq!(
            buckets.len() as u64,
            hi - lo + 1,
            "a bucket without a sample"
        );
        // Thread 2's 10 s stop left empty buckets.
        let t2 = t.kept.iter().filter(|s| s.tid == Tid(2)).count() as u64;
        assert!(t2 < hi - lo + 1 - 10_000_000_000 / t.bucket_ns + 2);
    }

    #[test]
    fn a_thread_on_cpu_throughout_is_one_slice_per_frame_after_thinning() {
        let mut d = data();
        // Replace the samples: one thread on the deep stack (node 4) every
        // 10 ms for 10 hours, thinned by the analysis.
        d.native = Thinned::default();
        d.python = Thinned::default();
        let n = 3_600_000u64;
        d.native.push_thread(
            Pid(10),
            Tid(10),
            (0..n).map(|i| RawSample {
                t: MonoNs(1_000_000_000 + i * 10_000_000),
                pid: Pid(10),
                tid: Tid(10),
                stack: 4,
                weight_flags: 1,
            }),
        );
        let mut st = analyze_all(&mut d);
        st.period_ns = 10_000_000;
        assert!(st.bucket_ns > 0);
        assert_eq!(st.report.samples, n, "weights count every sample");
        assert!(st.report.analysis_bucket_ms >= 20.0);
        let thread = st.threads().next().unwrap();
        for level in [0, 1, 5] {
            let slices = st.thread_slices(thread, View::Native, level);
            let roots: Vec<_> = slices.iter().filter(|s| s.depth == 0).collect();
            assert_eq!(roots.len(), 1, "level {level}: {} root slices", roots.len());
            let covered = roots[0].end.0 - roots[0].start.0;
            assert!(covered as f64 >= 0.999 * (n * 10_000_000) as f64);
            // One slice per frame of the stack.
            assert_eq!(slices.len(), 5);
        }
    }

    fn data() -> StackData {
        let mut d = StackData::new();
        let evs = vec![
            Event::StackFile {
                id: 0,
                path: "/usr/bin/python3".into(),
            },
            Event::StackFile {
                id: 1,
                path: "/lib/libz.so.1".into(),
            },
            Event::NativeFrame {
                id: 0,
                file: 0,
                offset: 0x10,
            },
            Event::NativeFrame {
                id: 1,
                file: 0,
                offset: 0x20,
            },
            Event::NativeFrame {
                id: 2,
                file: 0,
                offset: 0x30,
            },
            Event::NativeFrame {
                id: 3,
                file: 0,
                offset: 0x40,
            },
            Event::NativeFrame {
                id: 4,
                file: 1,
                offset: 0x50,
            },
            Event::Symbols {
                unnamed: Vec::new(),
                names: vec![
                    (0, "_start".into()),
                    (1, "main".into()),
                    (2, "_PyEval_EvalFrameDefault".into()),
                    (3, "zlib_compress".into()),
                ],
            },
            node(StackKind::Native, 0, None, 0),
            node(StackKind::Native, 1, Some(0), 1),
            node(StackKind::Native, 2, Some(1), 2),
            node(StackKind::Native, 3, Some(2), 3),
            node(StackKind::Native, 4, Some(3), 4),
            Event::PyFrame {
                id: 0,
                name: "<module>".into(),
                file: "/x/job.py".into(),
                entry: true,
            },
            Event::PyFrame {
                id: 1,
                name: "augment".into(),
                file: "/x/job.py".into(),
                entry: false,
            },
            node(StackKind::Python, 0, None, 0),
            node(StackKind::Python, 1, Some(0), 1),
            Event::TaskComm {
                t: MonoNs(0),
                pid: Pid(10),
                tid: Tid(10),
                comm: "python3".into(),
                exec: true,
            },
            Event::Samples(SampleBatch {
                kind: StackKind::Native,
                pid: Pid(10),
                tid: Tid(10),
                t0: MonoNs(1_000_000_000),
                dt_us: vec![0, 10_000, 10_000, 50_000],
                stacks: vec![4, 4, 2, 4],
                incomplete: vec![],
                source: SampleSource::Perf,
            }),
            Event::Samples(SampleBatch {
                kind: StackKind::Python,
                pid: Pid(10),
                tid: Tid(10),
                t0: MonoNs(1_005_000_000),
                dt_us: vec![0],
                stacks: vec![1],
                incomplete: vec![],
                source: SampleSource::Perf,
            }),
        ];
        for e in &evs {
            d.add(e);
        }
        d
    }

    #[test]
    fn perf_samples_of_python_code_are_never_matched_in_time() {
        let mut d = data();
        let st = analyze_all(&mut d);
        let native = FoldOptions {
            view: View::Native,
            merge_workers: false,
        };
        // A py-spy stack 5 ms from the first samples does not make them
        // Python-attributed: every frame as sampled, and in the Python view
        // the interpreter's part is an explicit [python: not sampled].
        let folded = st.folded_role(Some(Role::Main), native);
        assert!(
            folded.contains(
                "python3 (10);_start;main;_PyEval_EvalFrameDefault;zlib_compress;[libz.so.1+0x50] 3"
            ),
            "{folded}"
        );
        let py = st.folded_role(Some(Role::Main), FoldOptions::default());
        assert!(!py.contains("augment"), "{py}");
        assert!(py.contains("[python: not sampled]"), "{py}");
        let p = &st.report.python;
        let c = &p.counts;
        assert_eq!((c.same_instant, c.unattributed, c.native_only), (0, 4, 0));
        assert_eq!(c.unattributed_by_reason[Unattributed::NoAgent.as_str()], 4);
        // py-spy's stack is the Python-only view of that process.
        assert_eq!(p.python_only_stacks, 1);
        assert_eq!(st.python_only.len(), 1);
        assert_eq!(
            st.stack(st.python_only[0].stack).collect::<Vec<_>>(),
            vec!["<module> (job.py)", "augment (job.py)"]
        );
        assert_eq!(st.report.unwind_coverage, 1.0);
    }

    /// A native stack that carries its own Python frames (CPython perf
    /// trampolines named from /tmp/perf-PID.map) is the same instant's:
    /// nothing is matched to it.
    #[test]
    fn trampoline_frames_are_the_python_frames() {
        let mut d = data();
        for e in [
            Event::StackFile {
                id: 2,
                path: "/tmp/perf-10.map".into(),
            },
            Event::NativeFrame {
                id: 5,
                file: 2,
                offset: 0x7f00_0000_1000,
            },
            Event::Symbols {
                names: vec![(5, "py::Loader.augment:/x/job.py".into())],
                unnamed: Vec::new(),
            },
            // _start → main → trampoline → eval → zlib_compress
            node(StackKind::Native, 10, Some(1), 5),
            node(StackKind::Native, 11, Some(10), 2),
            node(StackKind::Native, 12, Some(11), 3),
            // The second sample's unwind was cut (the same frames; its
            // outer ones unknown): its Python frames are partial.
            Event::Samples(SampleBatch {
                kind: StackKind::Native,
                pid: Pid(10),
                tid: Tid(10),
                t0: MonoNs(1_005_000_000),
                dt_us: vec![0, 10_000],
                stacks: vec![12, 12],
                incomplete: vec![1],
                source: SampleSource::Perf,
            }),
        ] {
            d.add(&e);
        }
        let st = analyze_all(&mut d);
        assert_eq!(st.report.python_from_perf_map, 2);
        let c = &st.report.python.counts;
        assert_eq!((c.same_instant, c.same_instant_partial), (1, 1));
        let native = st.folded_role(
            Some(Role::Main),
            FoldOptions {
                view: View::Native,
                merge_workers: false,
            },
        );
        assert!(
            native.contains(
                "python3 (10);_start;main;Loader.augment (job.py);_PyEval_EvalFrameDefault;zlib_compress 2"
            ),
            "{native}"
        );
        let py = st.folded_role(Some(Role::Main), FoldOptions::default());
        assert!(
            py.contains("python3 (10);Loader.augment (job.py) 2"),
            "{py}"
        );
    }

    /// (frame id, kind) for a merge, from a spec: `N` native, `E` eval
    /// loop (ids from 100), `P` Python (`P*` an entry), `M` a marker.
    fn kinds(spec: &str) -> Vec<(u32, Kind)> {
        spec.split_whitespace()
            .enumerate()
            .map(|(i, w)| {
                let kind = match w.as_bytes()[0] {
                    b'P' => Kind::Python(w.ends_with('*')),
                    b'M' => Kind::Marker,
                    _ => Kind::Native,
                };
                (i as u32 + 100 * (w.as_bytes()[0] == b'E') as u32, kind)
            })
            .collect()
    }

    #[test]
    fn same_instant_runs_replace_their_interpreter_frames() {
        let m = Markers {
            unmatched: 900,
            truncated: 901,
            native_unknown: 902,
        };
        let is_eval = |n: u32| (100..200).contains(&n);
        let no_pm = |_: u32| false;
        let merge =
            |f: &[(u32, Kind)], complete| merge_same_instant(f, complete, &is_eval, &no_pm, &m);
        // _start, eval, C call back into Python, eval, zlib leaf; Python:
        // <module>* main, worker* compress.
        let f = kinds("N E N E N P* P P* P");
        let (out, how) = merge(&f, true);
        assert_eq!(how, Attribution::SameInstant);
        assert_eq!(out, vec![0, 101, 5, 6, 2, 103, 7, 8, 4]);
        // The same sample recorded with its Python frames first.
        let python_first: Vec<(u32, Kind)> = f[5..].iter().chain(&f[..5]).copied().collect();
        assert_eq!(merge(&python_first, true), (out, how));
        // One run too many with both sides complete: nothing is placed; the
        // native frames stay, the marker follows the outer interpreter frame.
        let f = kinds("N E N N P* P P* P");
        let (out, how) = merge(&f, true);
        assert_eq!(how, Attribution::Unattributed(Unattributed::Unmatched));
        assert_eq!(out, vec![0, 101, 900, 2, 3]);
        // The same with the native stack cut above: the outer run is the
        // outer part of the same instant.
        let (out, how) = merge(&f, false);
        assert_eq!(how, Attribution::SameInstantPartial);
        assert_eq!(out, vec![4, 5, 0, 101, 6, 7, 2, 3]);
        // Python frames over a native stack that stops before any
        // interpreter frame, whether or not the unwinder took its last
        // address for the end of the stack: the Python frames stay, above
        // `[native frames unknown]` and the native frames unwound.
        for complete in [true, false] {
            let (out, how) = merge(&kinds("N N P* P P* P"), complete);
            assert_eq!(how, Attribution::NativeUnknown);
            assert_eq!(out, vec![2, 3, 4, 5, 902, 0, 1]);
        }
        // Python frames cut (the outer run lost): the inner run is placed
        // under the truncation marker.
        let mut f = kinds("N E N E N P* P M");
        f[7].0 = 901;
        let (out, how) = merge(&f, true);
        assert_eq!(how, Attribution::SameInstantPartial);
        assert_eq!(out, vec![0, 101, 2, 901, 103, 5, 6, 4]);
        // An unreadable chain: its marker after the interpreter frame.
        let (out, how) = merge(&kinds("N E N M"), true);
        assert_eq!(how, Attribution::Unattributed(Unattributed::Unreadable));
        assert_eq!(out, vec![0, 101, 3, 2]);
        // No interpreter frame, no Python frame: native code.
        assert_eq!(merge(&kinds("N N"), true).1, Attribution::NativeOnly);
    }

    /// An agent sample and a perf sample of the same thread: the agent's is
    /// used, the perf one is not counted again. Its Python frames may come
    /// after its native leaf (earlier recordings) or before its native root
    /// (the recorder now): same stacks, and the root is found either way
    /// (the samples are marked incomplete: only a named root makes them
    /// count as reaching it).
    #[test]
    fn agent_samples_replace_perf_samples_of_their_thread() {
        let python_last = vec![
            node(StackKind::Native, 5, Some(4), 5),
            node(StackKind::Native, 6, Some(5), 6),
        ];
        let python_first = vec![
            node(StackKind::Native, 7, None, 5),
            node(StackKind::Native, 8, Some(7), 6),
            node(StackKind::Native, 9, Some(8), 0),
            node(StackKind::Native, 10, Some(9), 1),
            node(StackKind::Native, 11, Some(10), 2),
            node(StackKind::Native, 12, Some(11), 3),
            node(StackKind::Native, 13, Some(12), 4),
        ];
        for (nodes, leaf) in [(python_last, 6), (python_first, 13)] {
            agent_samples_replace_perf_samples(nodes, leaf);
        }
    }

    /// Process 10 is sampled by the agent (Python 3.12), and its frames 5
    /// and 6 are `<module>` → `augment`.
    fn same_instant_python() -> Vec<Event> {
        vec![
            Event::InlinePyFrame {
                id: 5,
                name: "<module>".into(),
                file: "/x/job.py".into(),
                entry: true,
                line: None,
            },
            Event::InlinePyFrame {
                id: 6,
                name: "augment".into(),
                file: "/x/job.py".into(),
                entry: false,
                line: None,
            },
            Event::PyProcess {
                t: MonoNs(0),
                pid: Pid(10),
                version: "3.12.1".into(),
                same_instant: true,
                timer: false,
                detail: String::new(),
            },
        ]
    }

    fn agent_samples_replace_perf_samples(nodes: Vec<Event>, leaf: u32) {
        let mut d = data();
        let mut evs = nodes;
        evs.extend(same_instant_python());
        evs.extend(vec![Event::Samples(SampleBatch {
            kind: StackKind::Native,
            pid: Pid(10),
            tid: Tid(10),
            t0: MonoNs(1_003_000_000),
            dt_us: vec![0, 10_000, 10_000, 10_000],
            stacks: vec![leaf; 4],
            incomplete: vec![0, 1, 2, 3],
            source: SampleSource::Agent,
        })]);
        for e in &evs {
            d.add(e);
        }
        let st = analyze_all(&mut d);
        let native = FoldOptions {
            view: View::Native,
            merge_workers: false,
        };
        assert_eq!(
            st.folded_role(Some(Role::Main), native),
            "python3 (10);_start;main;_PyEval_EvalFrameDefault;<module> (job.py);augment (job.py);zlib_compress;[libz.so.1+0x50] 4\n"
        );
        let p = &st.report.python;
        assert_eq!((p.counts.same_instant, p.counts.unattributed), (4, 0));
        assert_eq!(p.by_version["3.12"].same_instant, 4);
        assert_eq!(p.processes[0].sampler, "same-instant");
        // py-spy's stacks of a process the agent samples are no view of
        // their own.
        assert!(st.python_only.is_empty());
        assert_eq!(st.report.unwind_coverage, 1.0, "leaf {leaf}");
    }

    /// Frames recorded with their lines: by function unless `lines`, then
    /// `name (file:LINE)`, and `file:?` for a line that could not be
    /// decoded (recorded as 0).
    #[test]
    fn python_frames_by_line_only_when_asked() {
        for lines in [false, true] {
            let mut d = data();
            d.lines = lines;
            let mut evs = vec![
                node(StackKind::Native, 7, None, 5),
                node(StackKind::Native, 8, Some(7), 6),
                node(StackKind::Native, 9, Some(8), 0),
                node(StackKind::Native, 10, Some(9), 1),
                node(StackKind::Native, 11, Some(10), 2),
                node(StackKind::Native, 12, Some(11), 3),
                node(StackKind::Native, 13, Some(12), 4),
            ];
            for e in same_instant_python() {
                evs.push(match e {
                    Event::InlinePyFrame {
                        id,
                        name,
                        file,
                        entry,
                        ..
                    } => Event::InlinePyFrame {
                        id,
                        name,
                        file,
                        entry,
                        line: Some(if id == 5 { 12 } else { 0 }),
                    },
                    other => other,
                });
            }
            evs.push(Event::Samples(SampleBatch {
                kind: StackKind::Native,
                pid: Pid(10),
                tid: Tid(10),
                t0: MonoNs(1_003_000_000),
                dt_us: vec![0, 10_000],
                stacks: vec![13; 2],
                incomplete: vec![],
                source: SampleSource::Agent,
            }));
            for e in &evs {
                d.add(e);
            }
            let st = analyze_all(&mut d);
            let folded = st.folded_role(
                Some(Role::Main),
                FoldOptions {
                    view: View::Native,
                    merge_workers: false,
                },
            );
            let want = if lines {
                "<module> (job.py:12);augment (job.py:?);"
            } else {
                "<module> (job.py);augment (job.py);"
            };
            assert!(folded.contains(want), "{folded}");
        }
    }

    /// Without `--lines` the tables are by function, exactly as an analysis
    /// of the same recording without lines builds them, while the stacks
    /// by line (what the profiles hold) keep each Python frame's line; with
    /// `--lines` both are the same tables.
    #[test]
    fn stacks_by_line_are_kept_beside_the_tables_by_function() {
        // `augment` sampled on line 30, then 31 (frame 16), then 30 again.
        let build = |lines: bool, recorded: bool| {
            let mut d = data();
            d.lines = lines;
            let mut evs = Vec::new();
            for (base, augment) in [(7, 6), (20, 16)] {
                evs.push(node(StackKind::Native, base, None, 5));
                evs.push(node(StackKind::Native, base + 1, Some(base), augment));
                for k in 0..5 {
                    evs.push(node(StackKind::Native, base + 2 + k, Some(base + 1 + k), k));
                }
            }
            for (id, name, entry, line) in [
                (5, "<module>", true, 12),
                (6, "augment", false, 30),
                (16, "augment", false, 31),
            ] {
                evs.push(Event::InlinePyFrame {
                    id,
                    name: name.into(),
                    file: "/x/job.py".into(),
                    entry,
                    line: recorded.then_some(line),
                });
            }
            evs.extend(same_instant_python().into_iter().skip(2));
            evs.push(Event::Samples(SampleBatch {
                kind: StackKind::Native,
                pid: Pid(10),
                tid: Tid(10),
                t0: MonoNs(1_003_000_000),
                dt_us: vec![0, 10_000, 10_000],
                stacks: vec![13, 26, 13],
                incomplete: vec![],
                source: SampleSource::Agent,
            }));
            for e in &evs {
                d.add(e);
            }
            analyze_all(&mut d)
        };
        let plain = build(false, false);
        let st = build(false, true);
        assert_eq!(st.frames, plain.frames);
        assert_eq!(st.stacks, plain.stacks);
        let ids = |st: &Stacks| -> Vec<(u32, u32)> {
            st.samples.iter().map(|s| (s.stack, s.py_stack)).collect()
        };
        assert_eq!(ids(&st), ids(&plain));
        assert_eq!(st.samples[0].py_stack, st.samples[1].py_stack);
        // (name, line) of each sample's Python frames, in both views.
        let lines = |st: &Stacks, view: View| -> Vec<Vec<(String, Option<u32>)>> {
            st.samples
                .iter()
                .map(|s| {
                    st.lined_stack_ids(st.lined_view_stack(s, view))
                        .iter()
                        .map(|f| st.lined_frame(*f))
                        .filter(|f| f.class == FrameClass::Python)
                        .map(|f| (f.name.clone(), f.line))
                        .collect()
                })
                .collect()
        };
        let at = |l: u32| {
            vec![
                ("<module>".to_string(), Some(12)),
                ("augment".to_string(), Some(l)),
            ]
        };
        let want = vec![at(30), at(31), at(30)];
        for view in [View::Python, View::Native] {
            assert_eq!(lines(&st, view), want, "{view:?}");
            assert_eq!(lines(&build(true, true), view), want, "--lines, {view:?}");
        }
        assert_eq!(st.samples[0].lined_py_stack, st.samples[2].lined_py_stack);
        // Python frames without a recorded line have none.
        assert!(lines(&plain, View::Python)
            .iter()
            .flatten()
            .all(|f| f.1.is_none()));
        // With --lines the tables are by line already.
        let by_line = build(true, true);
        assert!(by_line.lined.is_none());
        assert_eq!(by_line.samples.len(), 3);
        assert_ne!(by_line.samples[0].py_stack, by_line.samples[1].py_stack);
    }

    /// A thread the perf reader left to the agent for some samples but the
    /// analysis gives to perf (3 agent samples against 16 of perf's): each
    /// sample not unwound takes the nearest unused agent sample within a
    /// second, and keeps the marker when there is none.
    #[test]
    fn agent_samples_stand_in_for_perf_samples_not_unwound() {
        let mut d = data();
        let ms = 1_000_000u64;
        let evs = vec![
            node(StackKind::Native, 5, Some(4), 5),
            node(StackKind::Native, 6, Some(5), 6),
            Event::StackMarker {
                id: 20,
                marker: crate::collect::perf::MARKER_NOT_UNWOUND.into(),
            },
            node(StackKind::Native, 20, None, 20),
            // Perf at 2.00 s, every 10 ms: not unwound at 2.00, 2.01 and
            // 2.06–2.09 s.
            Event::Samples(SampleBatch {
                kind: StackKind::Native,
                pid: Pid(10),
                tid: Tid(10),
                t0: MonoNs(2_000 * ms),
                dt_us: vec![
                    0, 10_000, 10_000, 10_000, 10_000, 10_000, 10_000, 10_000, 10_000, 10_000,
                    10_000, 10_000,
                ],
                stacks: vec![20, 20, 4, 4, 4, 4, 20, 20, 20, 20, 4, 4],
                incomplete: vec![],
                source: SampleSource::Perf,
            }),
            // The agent at 1.999 and 2.002 s (both nearest to 2.00 s: the
            // second goes to 2.01 s), and 7 s later.
            Event::Samples(SampleBatch {
                kind: StackKind::Native,
                pid: Pid(10),
                tid: Tid(10),
                t0: MonoNs(1_999 * ms),
                dt_us: vec![0, 3_000, 7_000_000],
                stacks: vec![6; 3],
                incomplete: vec![],
                source: SampleSource::Agent,
            }),
        ];
        for e in same_instant_python().iter().chain(&evs) {
            d.add(e);
        }
        let st = analyze_all(&mut d);
        assert_eq!(st.report.samples, 16, "perf's count stays");
        assert_eq!(
            (st.report.not_unwound_stood_in, st.report.not_unwound),
            (2, 4)
        );
        let folded = st.folded_role(
            Some(Role::Main),
            FoldOptions {
                view: View::Native,
                merge_workers: false,
            },
        );
        let count = |needle: &str| -> u64 {
            folded
                .lines()
                .filter(|l| l.contains(needle))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
                .sum()
        };
        assert_eq!(count("augment (job.py)"), 2, "{folded}");
        assert_eq!(count("[perf: not unwound"), 4, "{folded}");
        // The stand-ins keep the agent's times (1.999 and 2.002 s).
        let mut times: Vec<u64> = st
            .samples
            .iter()
            .filter(|s| s.attribution == Attribution::SameInstant)
            .map(|s| s.t.0 / ms)
            .collect();
        times.sort_unstable();
        assert_eq!(times, vec![1_999, 2_002]);
        assert!(st
            .samples
            .windows(2)
            .all(|w| (w[0].pid, w[0].tid, w[0].t) <= (w[1].pid, w[1].tid, w[1].t)));
    }

    #[test]
    fn slices_nest_and_do_not_bridge_gaps() {
        let mut d = data();
        let mut st = analyze_all(&mut d);
        st.period_ns = 10_000_000;
        let thread = st.threads().next().unwrap();
        let slices = st.thread_slices(thread, View::Native, 0);
        // Samples at 0, 10, 20 ms (deep, deep, shallow) then at 70 ms.
        let root: Vec<_> = slices.iter().filter(|s| s.depth == 0).collect();
        assert_eq!(root.len(), 2, "{slices:?}");
        assert_eq!(root[0].start, MonoNs(1_000_000_000));
        assert_eq!(root[0].end, MonoNs(1_030_000_000));
        assert_eq!(root[1].start, MonoNs(1_070_000_000));
        assert_eq!(root[1].end, MonoNs(1_080_000_000));
        // No slice is shorter than one period.
        assert!(slices.iter().all(|s| s.end.0 - s.start.0 >= 10_000_000));
        // Sorted by start, parents first.
        assert!(slices
            .windows(2)
            .all(|w| (w[0].start, w[0].depth) <= (w[1].start, w[1].depth)));
        // One level up, cells of 20 ms: the 40 ms pause is one empty cell
        // in a row at most, so it is bridged.
        let coarse = st.thread_slices(thread, View::Native, 1);
        assert_eq!(coarse.iter().filter(|s| s.depth == 0).count(), 1);
    }

    #[test]
    fn levels_are_bounded_whatever_the_period() {
        let mut d = data();
        let mut st = analyze_all(&mut d);
        for period in [0, 1, u64::MAX / 3] {
            st.period_ns = period;
            // No overflow, no division by zero, however coarse.
            for level in [0, 1, MAX_TRACE_LEVEL, u32::MAX] {
                let cell = st.cell_ns(level);
                assert!(cell >= 1);
                let thread = st.threads().next().unwrap();
                let slices = st.thread_slices(thread, View::Native, level);
                assert!(!slices.is_empty());
            }
            assert!(st.max_level() <= MAX_TRACE_LEVEL);
        }
    }

    #[test]
    fn deep_stacks_keep_their_innermost_frames() {
        let mut d = data();
        let mut st = analyze_all(&mut d);
        st.period_ns = 10_000_000;
        let deep: Vec<u32> = (0..TRACE_MAX_DEPTH as u32 + 100).map(|i| i % 3).collect();
        st.stacks[st.samples[0].stack as usize] = deep.clone();
        let thread = st.threads().next().unwrap();
        let slices = st.thread_slices(thread, View::Native, 0);
        let first: Vec<_> = slices
            .iter()
            .filter(|s| s.start == MonoNs(1_000_000_000))
            .collect();
        assert_eq!(first.len(), TRACE_MAX_DEPTH);
        assert_eq!(first[0].name, OUTER_FRAMES_CUT);
        assert_eq!(st.name(first[0].name), "[outer frames not shown]");
        assert_eq!(first.last().unwrap().name, *deep.last().unwrap());
    }

    #[test]
    fn gpu_idle_filter_selects_samples_inside_intervals() {
        let mut d = data();
        let st = analyze_all(&mut d);
        let o = FoldOptions::default();
        let f = st.folded_during(&[(MonoNs(1_015_000_000), MonoNs(1_025_000_000))], o);
        assert_eq!(f.lines().count(), 1, "{f}");
        assert!(f.ends_with(" 1\n"));
        assert!(st.folded_during(&[], o).is_empty());
    }

    #[test]
    fn perf_completes_the_process_table() {
        let ms = 1_000_000;
        let h = crate::event::Header {
            cpus: 2,
            ..crate::event::Header::for_tests(MonoNs(1_000 * ms), Pid(10))
        };
        let comm = |t: u64, pid: i32, c: &str| Event::TaskComm {
            t: MonoNs(t * ms),
            pid: Pid(pid),
            tid: Tid(pid),
            comm: c.into(),
            exec: true,
        };
        let fork = |t: u64, pid: i32, ppid: i32| Event::TaskFork {
            t: MonoNs(t * ms),
            pid: Pid(pid),
            tid: Tid(pid),
            ppid: Pid(ppid),
            ptid: Tid(ppid),
        };
        let evs = vec![
            Event::WindowStart {
                t: MonoNs(1_000 * ms),
            },
            comm(1_001, 10, "bash"),
            // Forked while the job was still a shell wrapper.
            fork(1_002, 11, 10),
            comm(1_003, 10, "python3"),
            Event::Process {
                t: MonoNs(1_100 * ms),
                pid: Pid(10),
                ppid: Pid(1),
                start_boot_ns: 0,
                comm: "python3".into(),
                cmdline: vec!["python3".into(), "train.py".into()],
                exe: None,
                rank_env: None,
            },
            // A worker forked by python that lives 150 ms, unseen by /proc.
            fork(1_200, 12, 10),
            Event::TaskExit {
                t: MonoNs(1_350 * ms),
                pid: Pid(12),
                tid: Tid(12),
            },
            Event::Footer(crate::event::Footer {
                t: MonoNs(2_000 * ms),
                status: crate::event::JobStatus::Exited(0),
                reason: "job exited".into(),
                dropped_events: 0,
                profiler_cpu_ns: 0,
                profiler_max_rss_bytes: 0,
                profiler_cpu_ns_by_component: Default::default(),
                end_anchor: None,
                recording_error: None,
            }),
        ];
        let a = super::super::analyze_events(h, evs.into_iter());
        let w = &a.processes[&Pid(12)];
        assert_eq!(w.cmdline, vec!["python3", "train.py"]);
        assert_eq!(
            (w.first_seen, w.exited),
            (MonoNs(1_200 * ms), Some(MonoNs(1_350 * ms)))
        );
        assert_eq!(w.role, super::super::Role::Worker);
        let shell = &a.processes[&Pid(11)];
        assert_eq!(shell.comm, "bash");
        assert!(shell.cmdline.is_empty());
        assert_eq!(shell.role, super::super::Role::Other);
    }
}
