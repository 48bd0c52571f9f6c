//! Stack analysis: pure functions over the recorded stack events.
//!
//! Inputs are the events of the perf sampler (native stacks as (file,
//! offset) frames, symbol names written at the end of recording) and of the
//! py-spy sampler (Python stacks). This module
//! - merges each native sample with the nearest Python stack of the same
//!   thread (see `docs/stacks.md`),
//! - folds stacks per role under a "name (pid)" root frame,
//! - measures unwinding coverage (samples whose outermost native frame is a
//!   thread root: `_start`, `clone`, `clone3`),
//! - lists top functions per role, and
//! - turns each thread's samples into nested slices for the trace.
//!
//! Everything is deterministic: sorted maps, stable sorts, no hashing order
//! leaks into outputs.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::fold::{self, FoldFrame, FoldNotes, FrameClass, Launcher, ViewFrame};
use super::Role;
use crate::event::{Event, MonoNs, Pid, StackKind, StackStats, Tid};

/// Outermost frames that mean "the unwinder reached the thread's root".
pub const ROOT_FRAMES: &[&str] = &["_start", "clone", "clone3", "__clone", "__clone3"];
/// Native frames of the CPython interpreter loop: each one runs one or more
/// Python frames (3.11+: a run starting at an "entry" frame).
pub const EVAL_FRAMES: &[&str] = &["_PyEval_EvalFrameDefault", "PyEval_EvalFrameEx"];
/// Deepest frame kept in trace slices.
pub const TRACE_MAX_DEPTH: usize = 64;
/// Most stack slices put into the trace (about 100 bytes each: ~40 MB).
pub const TRACE_MAX_SLICES: usize = 400_000;
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
    },
}

#[derive(Clone, Copy, Debug)]
struct RawSample {
    t: MonoNs,
    pid: Pid,
    tid: Tid,
    stack: u32,
    /// The unwinder reached the end of the stack (framehop's verdict).
    complete: bool,
}

/// Samples kept in memory by the analysis: at most [`ANALYSIS_MAX_SAMPLES`].
/// Past that half of the kept samples are dropped and only one new sample in
/// `stride` is kept, so a day-long recording is analysed in the same memory
/// as a 20-minute one; shares (flamegraph widths, top functions) stay
/// unbiased, absolute counts are divided by `stride` (reported).
#[derive(Default)]
struct Thinned {
    kept: Vec<RawSample>,
    stride: u64,
    seen: u64,
}

/// Bound on native (and, separately, Python) samples held by the analysis:
/// ~24 bytes each here and again once merged, so ~100 MB at the bound.
pub const ANALYSIS_MAX_SAMPLES: usize = 2_000_000;

impl Thinned {
    fn push(&mut self, s: RawSample) {
        let stride = self.stride.max(1);
        self.seen += 1;
        // A pseudo-random (but deterministic: outputs must be reproducible)
        // choice of which samples to keep: taking every k-th would alias
        // with periodic work and bias the shares.
        if splitmix64(self.seen) % stride != 0 {
            return;
        }
        self.kept.push(s);
        if self.kept.len() >= ANALYSIS_MAX_SAMPLES {
            let salt = stride.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            self.kept
                .retain(|k| splitmix64(k.t.0 ^ salt ^ ((k.tid.0 as u64) << 40)) & 1 == 0);
            self.stride = stride * 2;
        }
    }
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
    files: HashMap<u32, String>,
    native_frames: HashMap<u32, Frame>,
    py_frames: HashMap<u32, Frame>,
    symbols: HashMap<u32, String>,
    native_nodes: HashMap<u32, (Option<u32>, u32)>,
    py_nodes: HashMap<u32, (Option<u32>, u32)>,
    native: Thinned,
    python: Thinned,
    stats: Vec<StackStats>,
    /// From perf task records: (time, comm, exec) per pid, and parents.
    comms: BTreeMap<Pid, Vec<(MonoNs, String, bool)>>,
    parents: BTreeMap<Pid, Pid>,
    forks: BTreeMap<Pid, MonoNs>,
    exits: BTreeMap<Pid, MonoNs>,
    first_exec: Option<(MonoNs, Pid)>,
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
            Event::Samples(b) => {
                let out = match b.kind {
                    StackKind::Native => &mut self.native,
                    StackKind::Python => &mut self.python,
                };
                let mut incomplete = b.incomplete.iter().peekable();
                for (i, (t, s)) in b.times().zip(&b.stacks).enumerate() {
                    let cut = incomplete.peek().is_some_and(|x| **x as usize == i);
                    if cut {
                        incomplete.next();
                    }
                    out.push(RawSample {
                        t,
                        pid: b.pid,
                        tid: b.tid,
                        stack: *s,
                        complete: !cut,
                    });
                }
            }
            Event::Symbols { names } => {
                for (id, name) in names {
                    self.symbols.insert(*id, name.clone());
                }
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

/// How a native sample was combined with Python frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MergeKind {
    /// Not a Python thread, or no interpreter frame in the native stack.
    NativeOnly,
    /// The Python stack's entry runs matched the interpreter frames one to
    /// one and were interleaved with the native frames between them.
    Exact,
    /// Counts differed: all Python frames replace the interpreter frames.
    Approximate,
    /// The native stack carries its own Python frames (perf trampolines).
    PerfMap,
    /// A Python thread with interpreter frames but no Python stack close
    /// enough in time.
    NoPython,
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
    pub python_stacks: u64,
    pub python_errors: u64,
    /// Native samples of Python threads, by how Python frames were attached.
    pub merged_exact: u64,
    pub merged_approximate: u64,
    pub merged_missing_python: u64,
    /// Native samples whose Python frames came with the native stack itself:
    /// CPython's perf trampolines (`-X perf`), named from `/tmp/perf-PID.map`.
    pub python_from_perf_map: u64,
    /// CPU time of the samplers (perf reader + py-spy), in seconds.
    pub sampler_cpu_s: f64,
    /// 1 normally; k when the recording held more native samples than the
    /// analysis keeps in memory and only every k-th was analysed
    /// (see [`ANALYSIS_MAX_SAMPLES`]). Counts here are of analysed samples.
    pub analysis_stride: u64,
    pub roles: BTreeMap<String, RoleStacks>,
}

/// The merged stacks of a recording.
#[derive(Clone, Default)]
pub struct Stacks {
    frames: Vec<FrameInfo>,
    stacks: Vec<Vec<u32>>,
    /// What the Python view folded, per stack id of the full view.
    fold_notes: HashMap<u32, FoldNotes>,
    /// Processes that ran Python (the ones the Python view folds).
    python_pids: std::collections::BTreeSet<Pid>,
    /// Samples sorted by (pid, tid, t).
    pub samples: Vec<Sample>,
    pub procs: BTreeMap<Pid, ProcMeta>,
    /// Native sampling period in ns (0 when unknown).
    pub period_ns: u64,
    pub report: StacksReport,
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

struct Resolver<'a> {
    d: &'a StackData,
    native_cache: HashMap<u32, Vec<u32>>,
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
        self.intern(FrameInfo {
            label: format!("{} ({})", clean(name), clean(basename(file))),
            class: FrameClass::Python,
            name: name.to_string(),
            file: file.to_string(),
            eval: false,
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
            _ => None,
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
                self.intern(FrameInfo {
                    label: clean(sym),
                    class: FrameClass::Native,
                    name: sym.clone(),
                    file,
                    eval,
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
                })
            }
            (None, None) => self.intern(FrameInfo {
                label: "[unknown]".into(),
                class: FrameClass::Marker,
                name: "[unknown]".into(),
                file: String::new(),
                eval: false,
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
            }),
        };
        self.py_name.insert(frame, id);
        (id, entry)
    }

    /// Native frames, outermost first.
    fn native(&mut self, stack: u32) -> Vec<u32> {
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
        let v: Vec<u32> = frames
            .into_iter()
            .map(|f| self.native_frame_name(f))
            .collect();
        self.native_cache.insert(stack, v.clone());
        v
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

/// (native stack, Python candidates) → (merged stack, how, reaches root).
type MergeKey = (u32, Vec<(u32, bool)>);

/// Largest gap between two Python stacks of a thread across which a native
/// sample may take one of them.
const MAX_INTERPOLATION_GAP_NS: u64 = 1_000_000_000;

/// Candidate Python stacks (of one thread, sorted by time) for a native
/// sample at `t`, best first, each with whether it may be used even when it
/// does not fit the native stack structurally:
/// - between two Python stacks at most [`MAX_INTERPOLATION_GAP_NS`] apart:
///   the nearer, then the other (the thread ran one of them, or passed
///   from one to the other);
/// - before the first or after the last one: that one, within half the
///   usual gap (plus 10 ms) only.
///
/// The nearer candidate may be used unconditionally if it is within half
/// the usual gap plus 10 ms.
fn python_candidates(v: &[(MonoNs, u32)], t: MonoNs, median_gap: u64) -> Vec<(u32, bool)> {
    let close = median_gap / 2 + 10_000_000;
    let i = v.partition_point(|x| x.0 < t);
    match (i.checked_sub(1).and_then(|j| v.get(j)), v.get(i)) {
        (Some(a), Some(b)) => {
            if b.0 .0 - a.0 .0 > MAX_INTERPOLATION_GAP_NS {
                let near = if t.0 - a.0 .0 <= b.0 .0 - t.0 { a } else { b };
                return if near.0 .0.abs_diff(t.0) <= close {
                    vec![(near.1, true)]
                } else {
                    Vec::new()
                };
            }
            let (near, far) = if t.0 - a.0 .0 <= b.0 .0 - t.0 {
                (a, b)
            } else {
                (b, a)
            };
            vec![(near.1, near.0 .0.abs_diff(t.0) <= close), (far.1, false)]
        }
        (Some(x), None) | (None, Some(x)) if x.0 .0.abs_diff(t.0) <= close => vec![(x.1, true)],
        _ => Vec::new(),
    }
}

/// Combine a native stack with a Python stack (both outermost first).
fn merge(
    native: &[u32],
    python: &[(u32, bool)],
    is_eval: impl Fn(u32) -> bool,
) -> (Vec<u32>, MergeKind) {
    let evals: Vec<usize> = native
        .iter()
        .enumerate()
        .filter(|(_, n)| is_eval(**n))
        .map(|(i, _)| i)
        .collect();
    if evals.is_empty() {
        return (native.to_vec(), MergeKind::NativeOnly);
    }
    if python.is_empty() {
        return (native.to_vec(), MergeKind::NoPython);
    }
    // Split the Python frames into runs, each starting at an entry frame.
    let mut runs: Vec<&[(u32, bool)]> = Vec::new();
    let mut start = 0;
    for i in 1..python.len() {
        if python[i].1 {
            runs.push(&python[start..i]);
            start = i;
        }
    }
    runs.push(&python[start..]);
    let mut out = Vec::with_capacity(native.len() + python.len());
    out.extend_from_slice(&native[..evals[0]]);
    if runs.len() == evals.len() {
        for (k, run) in runs.iter().enumerate() {
            out.extend(run.iter().map(|f| f.0));
            let next = evals.get(k + 1).copied().unwrap_or(native.len());
            out.extend_from_slice(&native[evals[k] + 1..next]);
        }
        (out, MergeKind::Exact)
    } else {
        out.extend(python.iter().map(|f| f.0));
        out.extend_from_slice(&native[evals[evals.len() - 1] + 1..]);
        (out, MergeKind::Approximate)
    }
}

/// Make a name safe for the folded format (`;` separates frames, the last
/// space separates the count).
fn clean(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            ';' => ':',
            '\n' | '\r' | '\t' => ' ',
            c => c,
        })
        .collect()
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
    let stride = d.native.stride.max(1);
    let mut native = std::mem::take(&mut d.native.kept);
    native.retain(|s| s.t >= window.0 && s.t <= window.1);
    native.sort_by_key(|s| (s.pid, s.tid, s.t));
    let d: &StackData = d;
    let mut r = Resolver {
        d,
        native_cache: HashMap::new(),
        py_cache: HashMap::new(),
        frames: Vec::new(),
        frame_ids: HashMap::new(),
        native_name: HashMap::new(),
        py_name: HashMap::new(),
    };

    // Python stacks per thread, sorted by time.
    let mut py: BTreeMap<(Pid, Tid), Vec<(MonoNs, u32)>> = BTreeMap::new();
    for s in &d.python.kept {
        py.entry((s.pid, s.tid)).or_default().push((s.t, s.stack));
    }
    let mut py_gap: BTreeMap<(Pid, Tid), u64> = BTreeMap::new();
    for (k, v) in py.iter_mut() {
        v.sort_by_key(|x| x.0);
        let mut gaps: Vec<u64> = v.windows(2).map(|w| w[1].0 .0 - w[0].0 .0).collect();
        gaps.sort_unstable();
        py_gap.insert(*k, gaps.get(gaps.len() / 2).copied().unwrap_or(100_000_000));
    }

    let mut stack_ids: HashMap<Vec<u32>, u32> = HashMap::new();
    let mut stacks: Vec<Vec<u32>> = Vec::new();
    let mut samples = Vec::with_capacity(native.len());
    let mut rep = StacksReport::default();
    let mut merged_cache: HashMap<MergeKey, (u32, MergeKind, bool)> = HashMap::new();
    let mut rooted = 0u64;
    for s in &native {
        let cands = py
            .get(&(s.pid, s.tid))
            .map(|v| python_candidates(v, s.t, py_gap[&(s.pid, s.tid)]))
            .unwrap_or_default();
        let key = (s.stack, cands.clone());
        let (id, kind, root) = if let Some(c) = merged_cache.get(&key) {
            *c
        } else {
            let nat = r.native(s.stack);
            let root = nat.first().is_some_and(|f| {
                let f = &r.frames[*f as usize];
                f.class != FrameClass::Python && ROOT_FRAMES.contains(&f.name.as_str())
            });
            let evals: Vec<u32> = nat
                .iter()
                .copied()
                .filter(|f| r.frames[*f as usize].eval)
                .collect();
            let is_eval = |n: u32| evals.contains(&n);
            // Python frames in the native stack itself (perf trampolines)
            // are the same instant's: nothing to merge. Else the first
            // candidate that fits exactly; else the nearest one if it is
            // close enough in time; else native frames only.
            let mut chosen = None;
            if nat
                .iter()
                .any(|f| r.frames[*f as usize].class == FrameClass::Python)
            {
                chosen = Some((nat.clone(), MergeKind::PerfMap));
            }
            for (p, _) in cands.iter().filter(|_| chosen.is_none()) {
                let pyf = r.python(*p);
                let (m, kind) = merge(&nat, &pyf, is_eval);
                if kind == MergeKind::Exact || kind == MergeKind::NativeOnly {
                    chosen = Some((m, kind));
                    break;
                }
            }
            if chosen.is_none() {
                if let Some((p, true)) = cands.first() {
                    let pyf = r.python(*p);
                    chosen = Some(merge(&nat, &pyf, is_eval));
                }
            }
            let (m, kind) = chosen.unwrap_or_else(|| merge(&nat, &[], is_eval));
            let next = stacks.len() as u32;
            let id = *stack_ids.entry(m.clone()).or_insert_with(|| {
                stacks.push(m);
                next
            });
            merged_cache.insert(key, (id, kind, root));
            (id, kind, root)
        };
        // Reaching the root: the outermost frame is named as a thread root,
        // or the unwinder found the end of the stack there (the CFI of
        // `_start` and `clone3` marks the return address undefined; this
        // also covers roots that a stripped libc leaves unnamed).
        if root || s.complete {
            rooted += 1;
        }
        match kind {
            MergeKind::Exact => rep.merged_exact += 1,
            MergeKind::Approximate => rep.merged_approximate += 1,
            MergeKind::NoPython => rep.merged_missing_python += 1,
            MergeKind::PerfMap => rep.python_from_perf_map += 1,
            MergeKind::NativeOnly => {}
        }
        samples.push(Sample {
            t: s.t,
            pid: s.pid,
            tid: s.tid,
            stack: id,
            py_stack: id,
        });
    }
    let mut frames = r.frames;
    classify_native_frames(&mut frames);

    drop(native);
    let mut procs = BTreeMap::new();
    for s in &samples {
        procs.entry(s.pid).or_insert_with(|| meta(s.pid));
    }

    rep.samples = samples.len() as u64;
    rep.analysis_stride = stride;
    rep.unwind_coverage = if samples.is_empty() {
        0.0
    } else {
        round4(rooted as f64 / samples.len() as f64)
    };
    let mut period_ns = 0;
    for st in &d.stats {
        match st.kind {
            Some(StackKind::Native) => {
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
    rep.sampler_cpu_s = round4(rep.sampler_cpu_s);
    rep.frequency_hz = if period_ns > 0 {
        round4(1e9 / period_ns as f64)
    } else {
        0.0
    };
    if period_ns == 0 {
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

    let mut st = Stacks {
        frames,
        stacks,
        fold_notes: HashMap::new(),
        python_pids: Default::default(),
        samples,
        procs,
        period_ns,
        report: rep,
    };
    st.build_python_view();
    let mut roles = BTreeMap::new();
    for role in Role::ALL {
        let n = st.role_samples(Some(role)).count() as u64;
        st.report.samples_per_role.insert(role.to_string(), n);
        if n == 0 {
            continue;
        }
        let processes = st.procs.values().filter(|m| m.role == role).count() as u64;
        roles.insert(
            role.to_string(),
            RoleStacks {
                samples: n,
                processes,
                top_functions: st.top_functions(Some(role), TOP_FUNCTIONS),
            },
        );
    }
    st.report.roles = roles;
    st
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
        self.samples
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
            let full = &self.stacks[s.stack as usize];
            let ff: Vec<FoldFrame> = full
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
            let (view, notes) = fold::python_view(&ff);
            drop(ff);
            let full = full.clone();
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
                        });
                        self.frames.len() as u32 - 1
                    }),
                });
            }
            let id = if out == full {
                s.stack
            } else {
                let next = self.stacks.len() as u32;
                *view_ids.entry(out.clone()).or_insert_with(|| {
                    self.stacks.push(out);
                    next
                })
            };
            self.fold_notes.insert(s.stack, notes);
            memo.insert(s.stack, id);
            self.samples[i].py_stack = id;
        }
        self.python_pids = python_pids;
    }

    /// What the Python view folded in `samples`.
    pub fn fold_summary<'a>(&self, samples: impl Iterator<Item = &'a Sample>) -> FoldSummary {
        use std::collections::BTreeSet;
        let mut seen: std::collections::HashSet<u32> = std::collections::HashSet::new();
        let mut files: BTreeSet<String> = BTreeSet::new();
        let mut launchers: BTreeSet<Launcher> = BTreeSet::new();
        let mut sum = FoldSummary::default();
        for s in samples {
            sum.samples += 1;
            if !self.python_pids.contains(&s.pid) {
                continue;
            }
            let Some(n) = self.fold_notes.get(&s.stack) else {
                continue;
            };
            sum.python_samples += 1;
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
                .or_default() += 1;
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
        for s in samples {
            count += 1;
            let frames = &self.stacks[s.py_stack as usize];
            if let Some(leaf) = frames.last() {
                *self_n.entry(*leaf).or_default() += 1;
            }
            seen.clear();
            for f in frames {
                if !seen.contains(f) {
                    seen.push(*f);
                    *total_n.entry(*f).or_default() += 1;
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

    /// Nested slices per thread for the trace, within [`TRACE_MAX_SLICES`]:
    /// when the full-resolution slices would exceed it, every k-th sample of
    /// each thread is kept (k returned) and each counts for k periods.
    pub fn trace_slices(&self, view: View) -> (Vec<TraceSlice>, u64) {
        let mut k = 1u64;
        loop {
            let (slices, complete) = self.slices_with_stride(k, TRACE_MAX_SLICES, view);
            if complete {
                return (slices, k);
            }
            k *= 2;
        }
    }

    fn slices_with_stride(&self, k: u64, limit: usize, view: View) -> (Vec<TraceSlice>, bool) {
        let period = self.period_ns.max(1) * k;
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.samples.len() {
            let (pid, tid) = (self.samples[i].pid, self.samples[i].tid);
            let mut j = i;
            while j < self.samples.len() && self.samples[j].pid == pid && self.samples[j].tid == tid
            {
                j += 1;
            }
            let thread: Vec<&Sample> = self.samples[i..j].iter().step_by(k as usize).collect();
            // Sample times are put on a grid of one period from the thread's
            // first sample: the frequency-driven kernel sometimes samples
            // twice within a period, and a slice shorter than a period would
            // claim a precision sampling does not have. A second sample in
            // the same grid cell is skipped.
            let base = thread.first().map_or(0, |s| s.t.0);
            let at = |slot: u64| MonoNs(base + slot * period);
            // Open slices: (name id, start).
            let mut open: Vec<(u32, MonoNs)> = Vec::new();
            let mut prev_slot: Option<u64> = None;
            let close = |open: &mut Vec<(u32, MonoNs)>,
                         keep: usize,
                         end: MonoNs,
                         out: &mut Vec<TraceSlice>| {
                while open.len() > keep {
                    let (name, start) = open.pop().expect("non-empty");
                    out.push(TraceSlice {
                        pid,
                        tid,
                        depth: open.len() as u32,
                        name,
                        start,
                        end,
                    });
                }
            };
            for s in thread {
                let slot = (s.t.0 - base) / period;
                if let Some(p) = prev_slot {
                    if slot == p {
                        continue;
                    }
                    if slot > p + 2 {
                        // The thread did not run (or was not sampled) in
                        // between: end everything one period after the
                        // last sample rather than bridging the gap.
                        close(&mut open, 0, at(p + 1), &mut out);
                    }
                }
                let frames: Vec<u32> = self.stacks[self.view_stack(s, view) as usize]
                    .iter()
                    .take(TRACE_MAX_DEPTH)
                    .copied()
                    .collect();
                let common = open
                    .iter()
                    .zip(&frames)
                    .take_while(|(o, f)| o.0 == **f)
                    .count();
                close(&mut open, common, at(slot), &mut out);
                for f in &frames[common..] {
                    open.push((*f, at(slot)));
                }
                prev_slot = Some(slot);
                if out.len() > limit {
                    return (out, false);
                }
            }
            if let Some(p) = prev_slot {
                close(&mut open, 0, at(p + 1), &mut out);
            }
            i = j;
        }
        if out.len() > limit {
            return (out, false);
        }
        out.sort_by_key(|s| (s.pid, s.tid, s.start, s.depth));
        (out, true)
    }

    /// Label of a frame (a slice's name).
    pub fn name(&self, id: u32) -> &str {
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
            if let Some(x) = pp.exited {
                p.exited = Some(x);
            }
            if let Some(f) = pp.forked {
                if f < p.first_seen {
                    p.first_seen = f;
                }
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
        processes.insert(
            pp.pid,
            super::Process {
                pid: pp.pid,
                ppid: pp.ppid.unwrap_or_default(),
                comm,
                cmdline,
                exe,
                first_seen: forked,
                exited: pp.exited,
                status: None,
                role: super::Role::Other,
                // Unknown: it takes its parent's rank (see `roles`).
                rank_env: None,
                rank: None,
                rank_ids: Default::default(),
                is_job: false,
                user_ns: 0,
                sys_ns: 0,
                read_bytes: 0,
                write_bytes: 0,
                rchar: 0,
                wchar: 0,
                max_rss: 0,
                threads: BTreeMap::new(),
                cpu: Default::default(),
                read_bps: Default::default(),
                write_bps: Default::default(),
                rss: Default::default(),
                base: None,
                last: None,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::SampleBatch;

    fn node(kind: StackKind, id: u32, parent: Option<u32>, frame: u32) -> Event {
        Event::StackNode {
            kind,
            id,
            parent,
            frame,
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
    #[test]
    fn analysis_keeps_a_bounded_unbiased_share_of_samples() {
        let mut t = Thinned::default();
        let n = ANALYSIS_MAX_SAMPLES as u64 * 5;
        for i in 0..n {
            t.push(RawSample {
                t: MonoNs(i),
                pid: Pid(1),
                tid: Tid(1),
                // Two stacks, one in four samples on stack 1.
                stack: (i % 4 == 0) as u32,
                complete: true,
            });
        }
        assert!(t.kept.len() < ANALYSIS_MAX_SAMPLES);
        assert!(
            t.kept.len() > ANALYSIS_MAX_SAMPLES / 4,
            "kept {}",
            t.kept.len()
        );
        assert!(t.stride >= 4);
        let ones = t.kept.iter().filter(|s| s.stack == 1).count() as f64;
        let share = ones / t.kept.len() as f64;
        assert!((share - 0.25).abs() < 0.01, "share {share}");
        assert!(t.kept.windows(2).all(|w| w[0].t < w[1].t));
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
            }),
            Event::Samples(SampleBatch {
                kind: StackKind::Python,
                pid: Pid(10),
                tid: Tid(10),
                t0: MonoNs(1_005_000_000),
                dt_us: vec![0],
                stacks: vec![1],
                incomplete: vec![],
            }),
        ];
        for e in &evs {
            d.add(e);
        }
        d
    }

    #[test]
    fn python_frames_sit_between_interpreter_and_native_leaf() {
        let mut d = data();
        let st = analyze_all(&mut d);
        let native = FoldOptions {
            view: View::Native,
            merge_workers: false,
        };
        let folded = st.folded_role(Some(Role::Main), native);
        assert!(
            folded.contains("python3 (10);_start;main;<module> (job.py);augment (job.py);zlib_compress;[libz.so.1+0x50] 2"),
            "{folded}"
        );
        // The Python view: the interpreter (here /usr/bin/python3, which
        // also holds zlib_compress) folded, the unnamed libz code named by
        // its library, the sample without Python frames said so.
        let py = st.folded_role(Some(Role::Main), FoldOptions::default());
        assert_eq!(
            py,
            "python3 (10);<module> (job.py);augment (job.py) 1\n\
             python3 (10);<module> (job.py);augment (job.py);[libz.so.1] 2\n\
             python3 (10);[python: not sampled];[libz.so.1] 1\n"
        );
        assert_eq!(st.report.merged_exact, 3);
        // The last sample is 75 ms away from the only Python stack.
        assert_eq!(st.report.merged_missing_python, 1);
        assert_eq!(st.report.unwind_coverage, 1.0);
        let top = &st.report.roles["main"].top_functions[0];
        assert_eq!(top.function, "[libz.so.1]");
        assert_eq!(top.self_pct, 75.0);
    }

    /// A native stack that carries its own Python frames (CPython perf
    /// trampolines named from /tmp/perf-PID.map) is not merged with a
    /// py-spy stack, even a close one.
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
            },
            // _start → main → trampoline → eval → zlib_compress
            node(StackKind::Native, 10, Some(1), 5),
            node(StackKind::Native, 11, Some(10), 2),
            node(StackKind::Native, 12, Some(11), 3),
            Event::Samples(SampleBatch {
                kind: StackKind::Native,
                pid: Pid(10),
                tid: Tid(10),
                t0: MonoNs(1_005_000_000),
                dt_us: vec![0],
                stacks: vec![12],
                incomplete: vec![],
            }),
        ] {
            d.add(&e);
        }
        let st = analyze_all(&mut d);
        assert_eq!(st.report.python_from_perf_map, 1);
        let native = st.folded_role(
            Some(Role::Main),
            FoldOptions {
                view: View::Native,
                merge_workers: false,
            },
        );
        assert!(
            native.contains(
                "python3 (10);_start;main;Loader.augment (job.py);_PyEval_EvalFrameDefault;zlib_compress 1"
            ),
            "{native}"
        );
        let py = st.folded_role(Some(Role::Main), FoldOptions::default());
        assert!(
            py.contains("python3 (10);Loader.augment (job.py) 1"),
            "{py}"
        );
    }

    #[test]
    fn mismatched_runs_are_approximate() {
        let n = [1, 9, 2, 3, 9, 4];
        let py = [(7, true), (8, false)];
        let (m, k) = merge(&n, &py, |x| x == 9);
        assert_eq!(k, MergeKind::Approximate);
        assert_eq!(m, vec![1, 7, 8, 4]);
        let py2 = [(7, true), (8, true)];
        let (m, k) = merge(&n, &py2, |x| x == 9);
        assert_eq!(k, MergeKind::Exact);
        assert_eq!(m, vec![1, 7, 2, 3, 8, 4]);
    }

    #[test]
    fn slices_nest_and_do_not_bridge_gaps() {
        let mut d = data();
        let mut st = analyze_all(&mut d);
        st.period_ns = 10_000_000;
        let (slices, k) = st.trace_slices(View::Native);
        assert_eq!(k, 1);
        // Samples at 0, 10, 20 ms (deep, deep, shallow) then at 70 ms.
        let root: Vec<_> = slices.iter().filter(|s| s.depth == 0).collect();
        assert_eq!(root.len(), 2, "{slices:?}");
        assert_eq!(root[0].start, MonoNs(1_000_000_000));
        assert_eq!(root[0].end, MonoNs(1_030_000_000));
        assert_eq!(root[1].start, MonoNs(1_070_000_000));
        assert_eq!(root[1].end, MonoNs(1_080_000_000));
        // No slice is shorter than one period.
        assert!(slices.iter().all(|s| s.end.0 - s.start.0 >= 10_000_000));
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
            format: "gpuprof-recording".into(),
            version: 1,
            gpuprof_version: "test".into(),
            command: vec!["python3".into()],
            host: "h".into(),
            start: MonoNs(1_000 * ms),
            anchor_realtime_ns: 0,
            anchor_monotonic_ns: 1_000 * ms,
            interval_ns: 100 * ms,
            cpus: 2,
            page_size: 4096,
            clock_ticks_per_s: 100,
            rank: None,
            job_pid: Pid(10),
            boottime_offset_ns: 0,
            gpu_idle_threshold_pct: None,
            step_range: None,
            attached: None,
            rank_env: Default::default(),
            clock: None,
            boot_id: None,
            anchor_error_ns: 0,
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
                end_anchor: None,
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
