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
//! - lists top functions per role (the trace exporter turns each thread's
//!   samples into nested slices, `export::trace_slices`).
//!
//! Files: `intake` (the events collected, thinned, sorted), `names`
//! (symbol naming), `merge` (perf and agent samples merged, same-instant
//! Python frames), `estimate` (the Python view and py-spy estimates),
//! `summary` (report figures), `queries` (folds, top functions, time
//! grid), `pools` (pool threads' work under the thread that started it).
//!
//! Everything is deterministic: sorted maps, stable sorts, no hashing order
//! leaks into outputs.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

mod estimate;
mod intake;
mod merge;
mod names;
pub mod pools;
mod queries;
mod summary;

use intake::sort_by_thread;
pub use intake::{
    merge_perf_processes, AgentStats, CompileLook, PerfProcess, StackData, WallFrame,
    ANALYSIS_MAX_SAMPLES,
};
use merge::{keep_one_sampler, lowest_offsets, Merged, Merger};
use names::Resolver;
pub(crate) use names::{clean, py_file_label};
pub use pools::pool_label;
use summary::{python_report, sampler_figures};

use super::fold::{self, FoldFrame, FoldNotes, FrameClass, Launcher, ViewFrame};
use super::Role;
use crate::event::{Event, MonoNs, Pid, SampleBatch, SampleSource, StackKind, StackStats, Tid};
use crate::vocab::hash::splitmix64;
use crate::vocab::stacks::agent_covers;

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

/// Name id of the marker frame standing for the outer frames of a stack
/// deeper than the trace draws
/// ([`TRACE_MAX_DEPTH`](crate::export::trace_slices::TRACE_MAX_DEPTH)).
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

impl FrameInfo {
    /// A frame of Python's import machinery: the sample is inside an
    /// import (see [`crate::vocab::stacks::is_import_file`]).
    pub fn imports(&self) -> bool {
        self.class == FrameClass::Python && crate::vocab::stacks::is_import_file(&self.file)
    }

    /// A frame of the framework's compiler ([`crate::vocab::stacks::is_compile_frame`]).
    pub fn compiles(&self) -> bool {
        self.class == FrameClass::Python
            && crate::vocab::stacks::is_compile_frame(&self.name, &self.file)
    }
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
    /// Threads whose native samples are the in-process agent's; the others'
    /// are gpuprof's own perf events' (native programs, threads the agent
    /// did not sample), which never sample the kernel.
    #[serde(skip)]
    pub agent_threads: BTreeSet<(Pid, Tid)>,
    /// Threads with any sample of the agent's, its own or not: the
    /// agent's count of periods it could not sample in the kernel covers
    /// them.
    #[serde(skip)]
    pub agent_seen_threads: BTreeSet<(Pid, Tid)>,
    /// With perf events as the sampler, the system time over the recording
    /// (from `/proc`) of the job's threads the agent did not sample, seconds
    /// per process: the time in the kernel their samples leave out (a
    /// thread that ran only in the kernel has no sample at all).
    #[serde(skip)]
    pub perf_kernel_s: BTreeMap<Pid, f64>,
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

/// Native frames get their class from their file: the interpreter (files
/// that hold an interpreter loop frame, libpython, `python*` executables),
/// the C runtime, or other native code.
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

#[cfg(test)]
mod tests;
