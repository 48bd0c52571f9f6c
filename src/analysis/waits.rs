//! Where threads wait: the wall-clock sampler's looks at each thread
//! (`collect::perf::offcpu`), each one on a CPU or blocked with a stack,
//! and each blocked one put in a wait class from its stack.
//!
//! The sampler looks at a thread at regular ticks whatever it is doing;
//! each look stands for the time until the next one, so the time of the
//! looks that fall in a class estimates the wall time spent there (from a
//! count of samples: ± about `sqrt(n)/N` of the time counted).

use std::collections::BTreeMap;

use serde::Serialize;

use super::stacks::{StackData, WallFrame};
use crate::event::{MonoNs, Pid, Tid};

/// Why a blocked thread was blocked, from its stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitClass {
    /// Waiting for the GIL (`take_gil`, `PyEval_RestoreThread`).
    Gil,
    /// Inside a collective: gloo, NCCL, `torch.distributed` (c10d), DDP's
    /// reducer waiting for the gradient all-reduce inside `backward`.
    Collective,
    /// Waiting for the GPU: CUDA synchronization, a copy to the host,
    /// `.item()`.
    GpuSync,
    /// Waiting for the next batch: the DataLoader's queue, a `queue.Queue`
    /// or a `multiprocessing` pipe.
    NextBatch,
    /// Reading, writing, syncing or opening a regular file.
    FileIo,
    /// Inside a thread pool's runtime (OpenMP, TBB, OpenBLAS, PyTorch's
    /// `c10::ThreadPool`): a thread that started an operator's parallel
    /// region waiting at its barrier for the pool's other threads, or a
    /// pool thread idle between regions. Compute on other threads, not an
    /// idle wait of the loop.
    ThreadPool,
    /// Sleeping (`time.sleep`, `nanosleep`).
    Sleep,
    /// Blocked elsewhere (its top frames are listed).
    Other,
}

impl WaitClass {
    pub const ALL: [WaitClass; 8] = [
        WaitClass::Gil,
        WaitClass::Collective,
        WaitClass::GpuSync,
        WaitClass::NextBatch,
        WaitClass::FileIo,
        WaitClass::ThreadPool,
        WaitClass::Sleep,
        WaitClass::Other,
    ];

    /// "waited 0.4 s …": what the time was spent doing.
    pub fn phrase(&self) -> &'static str {
        match self {
            WaitClass::Gil => "for the GIL",
            WaitClass::Collective => "in collectives (for the other ranks)",
            WaitClass::GpuSync => "for the GPU (synchronization)",
            WaitClass::NextBatch => "for its next batch",
            WaitClass::FileIo => "on file IO",
            WaitClass::ThreadPool => {
                "for a thread pool's other threads (an operator's parallel work)"
            }
            WaitClass::Sleep => "sleeping",
            WaitClass::Other => "blocked elsewhere",
        }
    }

    pub fn label(&self) -> &'static str {
        match self {
            WaitClass::Gil => "GIL",
            WaitClass::Collective => "collective",
            WaitClass::GpuSync => "GPU synchronization",
            WaitClass::NextBatch => "next batch",
            WaitClass::FileIo => "file IO",
            WaitClass::ThreadPool => "thread pool",
            WaitClass::Sleep => "sleep",
            WaitClass::Other => "other",
        }
    }
}

const GIL: &[&str] = &[
    "take_gil",
    "PyEval_RestoreThread",
    "PyEval_AcquireThread",
    "PyGILState_Ensure",
];
const COLLECTIVE_NATIVE: &[&str] = &[
    "gloo::",
    "c10d::",
    "nccl",
    "ProcessGroupGloo",
    "ProcessGroupNCCL",
];
/// Background threads of communication libraries, idle between requests.
const IDLE_LOOPS: &[&str] = &["runLoop", "Daemon", "Loop::run", "::Loop::", "StoreDaemon"];
const GPU_NATIVE: &[&str] = &[
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaDeviceSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "cuCtxSynchronize",
    "cudaMemcpy",
    "cuMemcpyDtoH",
    "_local_scalar_dense",
];
const GPU_LIBS: &[&str] = &["libcuda.so", "libcudart.so"];
/// Python functions (name, file fragment) that wait for the GPU.
const GPU_PY: &[(&str, &str)] = &[
    ("synchronize", "torch/cuda/"),
    ("synchronize", "cupy/cuda/"),
];
/// Python functions (name, file fragment) that wait for the next batch.
const BATCH_PY: &[(&str, &str)] = &[
    ("_next_data", "torch/utils/data/"),
    ("_get_data", "torch/utils/data/"),
    ("_try_get_data", "torch/utils/data/"),
    ("get", "/queue.py"),
    ("get", "multiprocessing/queues.py"),
    ("recv", "multiprocessing/connection.py"),
    ("recv_bytes", "multiprocessing/connection.py"),
    ("poll", "multiprocessing/connection.py"),
];

/// The class of a blocked stack (frames leaf first), and for a collective
/// the function it waits in (a Python collective's name, or the native
/// waiter's).
pub fn classify(frames: &[WallFrame]) -> (WaitClass, Option<String>) {
    let native = |pats: &[&str]| {
        frames.iter().find_map(|f| match f {
            WallFrame::Native { name: Some(n), .. } if pats.iter().any(|p| n.contains(p)) => {
                Some(*n)
            }
            _ => None,
        })
    };
    let py = |pats: &[(&str, &str)]| {
        frames.iter().find_map(|f| match f {
            WallFrame::Python { name, file }
                if pats
                    .iter()
                    .any(|(n, p)| short_name(name) == *n && file.contains(p)) =>
            {
                Some(*name)
            }
            _ => None,
        })
    };
    if native(GIL).is_some() {
        return (WaitClass::Gil, None);
    }
    let py_collective = frames.iter().find_map(|f| match f {
        WallFrame::Python { name, file }
            if crate::vocab::collectives::is_collective_frame(short_name(name), file) =>
        {
            Some(short_name(name).to_string())
        }
        _ => None,
    });
    if let Some(n) = py_collective {
        return (WaitClass::Collective, Some(n));
    }
    // A communication library's own event loop or store server waits for
    // work, not for a collective.
    if native(IDLE_LOOPS).is_some() {
        return (WaitClass::Other, None);
    }
    if let Some(n) = native(COLLECTIVE_NATIVE) {
        let label = if n.contains("Reducer") {
            "DDP gradient all-reduce (c10d::Reducer, inside backward)".to_string()
        } else {
            short_native(n)
        };
        return (WaitClass::Collective, Some(label));
    }
    let gpu_lib = frames.iter().any(|f| {
        matches!(f, WallFrame::Native { file, .. } if GPU_LIBS.iter().any(|l| file.contains(l)))
    });
    if native(GPU_NATIVE).is_some() || gpu_lib || py(GPU_PY).is_some() {
        return (WaitClass::GpuSync, None);
    }
    if py(BATCH_PY).is_some() {
        return (WaitClass::NextBatch, None);
    }
    let marker = frames.iter().find_map(|f| match f {
        WallFrame::Marker(m) if m.starts_with("[syscall:") => Some(*m),
        _ => None,
    });
    if marker.is_some_and(|m| m.contains("regular file")) {
        return (WaitClass::FileIo, None);
    }
    let pool = frames.iter().any(|f| {
        matches!(f, WallFrame::Native { name, file }
            if crate::analysis::stacks::pools::is_pool_frame(name.unwrap_or(""), file))
    });
    if pool {
        return (WaitClass::ThreadPool, None);
    }
    if marker.is_some_and(|m| m.contains("nanosleep")) {
        return (WaitClass::Sleep, None);
    }
    (WaitClass::Other, None)
}

/// A function's name without its class (py-spy gives qualified names from
/// 3.11 on: `Queue.get`).
fn short_name(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

/// `c10d::ProcessGroupGloo::AsyncWork::wait()` → `c10d::ProcessGroupGloo::AsyncWork::wait`.
fn short_native(n: &str) -> String {
    let n = n.split('(').next().unwrap_or(n);
    n.chars().take(80).collect()
}

/// One class's time in a thread.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ClassTime {
    pub samples: u64,
    pub share: f64,
    pub seconds: f64,
}

/// A thread's wall time, by where it was.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ThreadWall {
    pub pid: Pid,
    pub tid: Tid,
    /// Looks at the thread counted, and the seconds they span.
    pub samples: u64,
    pub span_s: f64,
    /// Counted over its loop's steady state (see [`steady_span`]), else
    /// over its whole life.
    pub steady: bool,
    /// Looks that found it on a CPU.
    pub on_cpu: ClassTime,
    /// Looks whose read was dropped (it woke while read): unknown.
    pub unknown: ClassTime,
    /// Blocked looks by class (classes it never waited in are absent).
    pub waits: BTreeMap<WaitClass, ClassTime>,
    /// For `other`: its most frequent top frames, with their looks.
    pub other_top: Vec<(String, u64)>,
    /// While it waited for the GIL: which thread held it, in which Python
    /// function ("thread TID in FUNCTION (FILE)", or "not read"), with
    /// seconds, most first.
    pub gil_holders: Vec<(String, f64)>,
    /// The span counted: from its first look to the end of its last.
    #[serde(skip)]
    pub window: (MonoNs, MonoNs),
    /// Its blocked time as folded paths (without the process's root frame,
    /// outermost first, `[waiting: CLASS]` above the native frames it
    /// waited in) → ns, in the Python view and in the native view: the
    /// off-CPU half of `flame-loop-wall.svg`. A loop thread blocks in a few
    /// places, so these stay small.
    #[serde(skip)]
    pub off_cpu: [BTreeMap<String, u64>; 2],
    /// Its blocked stretches over its whole life, in time order: the wait
    /// track of the trace.
    #[serde(skip)]
    pub runs: Vec<WaitRun>,
    /// Its stretches of looks that did not find it on a CPU (blocked in
    /// any class, or woke while read), over its whole life, in time order;
    /// the first and last of its looks; their median spacing (ns). See
    /// [`ThreadWall::stayed_runnable`].
    #[serde(skip)]
    pub not_running: Vec<(MonoNs, MonoNs)>,
    #[serde(skip)]
    pub looked: (MonoNs, MonoNs),
    #[serde(skip)]
    pub look_every_ns: u64,
}

impl ThreadWall {
    /// Whether its looks say it stayed runnable (on a CPU, or waiting for
    /// one: `/proc/PID/task/TID/syscall` reads `running` for both) from
    /// `a` to `b`: looked at in between (the stretch lies inside its looks
    /// and spans at least two of their spacings) and never found blocked
    /// there. A thread sampled every period of its CPU time whose samples
    /// come far apart on a busy machine was preempted, not blocked: it
    /// did not leave what it was running to wait for something.
    pub fn stayed_runnable(&self, a: MonoNs, b: MonoNs) -> bool {
        if self.look_every_ns == 0
            || a < self.looked.0
            || b > self.looked.1
            || b.0.saturating_sub(a.0) < 2 * self.look_every_ns
        {
            return false;
        }
        let i = self.not_running.partition_point(|r| r.1 <= a);
        self.not_running.get(i).map_or(true, |r| r.0 >= b)
    }
}

/// Consecutive looks that found a thread blocked in one class: from the
/// first look to the end of the last (each look standing for the time to
/// the next, capped as the shares are).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WaitRun {
    pub from: MonoNs,
    pub to: MonoNs,
    pub class: WaitClass,
}

/// Every sampled thread's wall time.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Waits {
    pub threads: Vec<ThreadWall>,
}

impl Waits {
    pub fn thread(&self, pid: Pid, tid: Tid) -> Option<&ThreadWall> {
        self.threads.iter().find(|t| t.pid == pid && t.tid == tid)
    }
}

/// Looks fewer than this make no figures (a thread seen a handful of times).
pub const MIN_LOOKS: u64 = 10;

pub fn analyze(d: &StackData, window: (MonoNs, MonoNs)) -> Waits {
    let mut out = Waits::default();
    for ((pid, tid), samples) in d.wall_samples(window) {
        if let Some(w) = thread_wall(d, pid, tid, &samples, None) {
            out.threads.push(w);
        }
    }
    out
}

/// Count the loop thread `pt`'s waits again over `span`, its steps (from
/// the first step's start to the last one's end), where they were found:
/// that is its loop's steady state whether or not it waited in the loop.
/// Without them [`steady_span`] guesses from the waits alone, and a loop
/// that never blocks (the model computed on the CPU) leaves the guess to
/// its start-up's few waits. Nothing changes when the span holds fewer
/// than [`MIN_LOOKS`] looks.
pub fn recut(
    waits: &mut Waits,
    d: &StackData,
    window: (MonoNs, MonoNs),
    pt: (Pid, Tid),
    span: (MonoNs, MonoNs),
) {
    let Some(at) = waits.threads.iter().position(|t| (t.pid, t.tid) == pt) else {
        return;
    };
    let samples = d.wall_samples_of(window, pt);
    if let Some(w) = thread_wall(d, pt.0, pt.1, &samples, Some(span)) {
        waits.threads[at] = w;
    }
}

/// One thread's wall time from its looks, counted over `span` where given,
/// else over its steady state (see [`steady_span`]) or, without one, its
/// whole life. None under [`MIN_LOOKS`] looks.
fn thread_wall(
    d: &StackData,
    pid: Pid,
    tid: Tid,
    samples: &[(MonoNs, u32, u32)],
    span: Option<(MonoNs, MonoNs)>,
) -> Option<ThreadWall> {
    let mut cache: BTreeMap<u32, Slot> = BTreeMap::new();
    let slots: Vec<(MonoNs, u64, Slot)> = samples
        .iter()
        .map(|&(t, weight, stack)| {
            let slot = cache
                .entry(stack)
                .or_insert_with(|| slot_of(d, stack))
                .clone();
            (t, weight as u64, slot)
        })
        .collect();
    let within = span.map(|(from, to)| {
        (
            slots.partition_point(|s| s.0 < from),
            slots.partition_point(|s| s.0 <= to),
        )
    });
    let (lo, hi, steady) = match within.or_else(|| steady_span(&slots)) {
        Some((lo, hi)) => (lo, hi, true),
        None => (0, slots.len(), false),
    };
    let all = &slots[..];
    let slots = &slots[lo..hi];
    let total: u64 = slots.iter().map(|s| s.1).sum();
    if total < MIN_LOOKS {
        return None;
    }
    // Each look stands for the time until the next one (capped at
    // twice the median gap, so a pause of the sampler is not counted):
    // a tick delayed by an expensive read (a blocked thread's stack
    // and Python frames) does not shift time towards the cheap looks.
    let mut gaps: Vec<u64> = slots.windows(2).map(|p| p[1].0 .0 - p[0].0 .0).collect();
    gaps.sort_unstable();
    let median = gaps.get(gaps.len() / 2).copied().unwrap_or(0);
    let cap = (2 * median).max(1_000_000);
    let weight_of = |i: usize| -> u64 {
        slots
            .get(i + 1)
            .map_or(median.min(cap), |n| (n.0 .0 - slots[i].0 .0).min(cap))
    };
    let total_ns: u64 = (0..slots.len()).map(weight_of).sum::<u64>().max(1);
    let span_s = match (slots.first(), slots.last()) {
        (Some(a), Some(b)) => (b.0 .0 - a.0 .0) as f64 / 1e9,
        _ => 0.0,
    };
    let mut w = ThreadWall {
        pid,
        tid,
        samples: total,
        span_s,
        steady,
        ..Default::default()
    };
    if let (Some(a), Some(b)) = (slots.first(), slots.last()) {
        w.window = (a.0, MonoNs(b.0 .0 + weight_of(slots.len() - 1)));
    }
    w.runs = wait_runs(all, median.min(cap), cap);
    w.not_running = not_running(all, median.min(cap), cap);
    if let (Some(a), Some(b)) = (all.first(), all.last()) {
        w.looked = (a.0, b.0);
    }
    w.look_every_ns = median;
    let mut other: BTreeMap<String, u64> = BTreeMap::new();
    let mut holders: BTreeMap<String, f64> = BTreeMap::new();
    let mut paths: BTreeMap<u32, [String; 2]> = BTreeMap::new();
    for (i, (_, n, slot)) in slots.iter().enumerate() {
        let (_, _, stack) = samples[lo + i];
        let off = match slot {
            Slot::OnCpu => None,
            Slot::Unknown => Some([UNKNOWN_LOOK.to_string(), UNKNOWN_LOOK.to_string()]),
            Slot::Blocked(class, ..) => Some(
                paths
                    .entry(stack)
                    .or_insert_with(|| wall_paths(&d.wall_frames(stack), *class))
                    .clone(),
            ),
        };
        if let Some(p) = off {
            for (k, p) in p.into_iter().enumerate() {
                *w.off_cpu[k].entry(p).or_default() += weight_of(i);
            }
        }
        let c = match slot {
            Slot::OnCpu => &mut w.on_cpu,
            Slot::Unknown => &mut w.unknown,
            Slot::Blocked(class, top, holder, _) => {
                if *class == WaitClass::Other {
                    *other.entry(top.clone()).or_default() += n;
                }
                if *class == WaitClass::Gil {
                    let h = holder.clone().unwrap_or_else(|| "not read".into());
                    *holders.entry(h).or_default() += weight_of(i) as f64 / 1e9;
                }
                w.waits.entry(*class).or_default()
            }
        };
        c.samples += n;
        c.seconds += weight_of(i) as f64 / 1e9;
    }
    let fill = |c: &mut ClassTime| {
        c.share = c.seconds * 1e9 / total_ns as f64;
    };
    fill(&mut w.on_cpu);
    fill(&mut w.unknown);
    w.waits.values_mut().for_each(fill);
    let mut top: Vec<(String, u64)> = other.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    top.truncate(5);
    w.other_top = top;
    let mut holders: Vec<(String, f64)> = holders.into_iter().collect();
    holders.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    holders.truncate(5);
    w.gil_holders = holders;
    Some(w)
}

/// The blocked stretches of a thread's looks (see [`WaitRun`]); a look
/// on a CPU or dropped ends a stretch.
fn wait_runs(slots: &[(MonoNs, u64, Slot)], last: u64, cap: u64) -> Vec<WaitRun> {
    stretches(slots, last, cap, |slot| match slot {
        Slot::Blocked(class, ..) => Some(*class),
        _ => None,
    })
    .into_iter()
    .map(|(from, to, class)| WaitRun { from, to, class })
    .collect()
}

/// The stretches of a thread's looks that did not find it on a CPU (see
/// [`ThreadWall::not_running`]).
fn not_running(slots: &[(MonoNs, u64, Slot)], last: u64, cap: u64) -> Vec<(MonoNs, MonoNs)> {
    stretches(slots, last, cap, |slot| {
        (!matches!(slot, Slot::OnCpu)).then_some(())
    })
    .into_iter()
    .map(|(from, to, ())| (from, to))
    .collect()
}

/// Runs of consecutive looks with the same `key` (looks keyed `None`
/// end a run), each look standing for the time to the next (capped at
/// `cap`; the last one for `last`).
fn stretches<K: PartialEq + Copy>(
    slots: &[(MonoNs, u64, Slot)],
    last: u64,
    cap: u64,
    key: impl Fn(&Slot) -> Option<K>,
) -> Vec<(MonoNs, MonoNs, K)> {
    let mut out: Vec<(MonoNs, MonoNs, K)> = Vec::new();
    let mut open = false;
    for (i, (t, _, slot)) in slots.iter().enumerate() {
        let Some(k) = key(slot) else {
            open = false;
            continue;
        };
        let end = MonoNs(t.0 + slots.get(i + 1).map_or(last, |n| (n.0 .0 - t.0).min(cap)));
        match out.last_mut() {
            Some(r) if open && r.2 == k && r.1 >= *t => r.1 = end,
            _ => out.push((*t, end, k)),
        }
        open = true;
    }
    out
}

/// A look whose read was dropped, in the wall-clock flamegraph.
pub const UNKNOWN_LOOK: &str = "[blocked: woke while read, stack unknown]";
/// Native frames kept under the innermost Python frame of a blocked stack
/// in the Python view: the call that blocked and what it waits in.
const WALL_NATIVE_LEAVES: usize = 8;

/// A blocked stack (frames leaf first) as folded paths, outermost first,
/// in the Python view and the native view. The Python view keeps the
/// Python frames, `[waiting: CLASS]`, the native frames below the
/// interpreter's last frame (at most [`WALL_NATIVE_LEAVES`]) and the
/// system call; the native view every native frame, then the same marker
/// and system call.
fn wall_paths(f: &[WallFrame], class: WaitClass) -> [String; 2] {
    use super::fold::native_class;
    use super::stacks::{clean, py_file_label};
    let waiting = format!("[waiting: {}]", class.label());
    let native_label = |name: Option<&str>, file: &str| match name {
        Some(n) => clean(&super::symbols::short_label(n)),
        None => format!("[{}]", clean(file.rsplit('/').next().unwrap_or(file))),
    };
    // Root first.
    let mut python: Vec<String> = Vec::new();
    let mut native: Vec<(String, bool)> = Vec::new();
    let mut syscall: Option<&str> = None;
    for x in f.iter().rev() {
        match x {
            WallFrame::Python { name, file } => {
                python.push(format!("{} ({})", clean(name), clean(py_file_label(file))))
            }
            WallFrame::Native { name, file } => native.push((
                native_label(*name, file),
                native_class(file, false) == super::fold::FrameClass::Interpreter,
            )),
            WallFrame::Marker(m) if m.starts_with("[syscall:") || m.starts_with("[blocked:") => {
                syscall = Some(m)
            }
            WallFrame::Marker(_) => {}
        }
    }
    let dedup = |v: Vec<String>| {
        // One library's unnamed frames in a row are one frame.
        let mut out: Vec<String> = Vec::with_capacity(v.len());
        for s in v {
            if !(s.starts_with('[') && out.last() == Some(&s)) {
                out.push(s);
            }
        }
        out
    };
    let below = native
        .iter()
        .rposition(|n| n.1)
        .map_or(0, |i| i + 1)
        .max(native.len().saturating_sub(WALL_NATIVE_LEAVES));
    let mut py_view = python;
    py_view.push(waiting.clone());
    py_view.extend(dedup(native[below..].iter().map(|n| n.0.clone()).collect()));
    let mut native_view = dedup(native.into_iter().map(|n| n.0).collect());
    native_view.push(waiting);
    if let Some(m) = syscall {
        py_view.push(m.to_string());
        native_view.push(m.to_string());
    }
    [py_view.join(";"), native_view.join(";")]
}

/// Where one look found a thread.
#[derive(Clone, Debug, PartialEq)]
enum Slot {
    OnCpu,
    /// Its read was dropped (it woke while read).
    Unknown,
    /// Blocked: its class, its top frames, the thread that held the GIL
    /// meanwhile (its marker), if another did, and whether it was inside
    /// an import (start-up, not the loop).
    Blocked(WaitClass, String, Option<String>, bool),
}

/// Entries into one wait class that make a loop.
pub const MIN_STEADY_ENTRIES: usize = 3;

/// A loop's steady state: from the first to the last look in the wait
/// class the thread entered most often (a loop waits for its batch, its
/// collective or its GPU once per step), leaving out start-up (imports,
/// set-up) and shutdown. Looks inside an import count for no class: a
/// start-up's module loads read a file again and again, and a loop that
/// never blocks would otherwise get them as its steady state. None when
/// no class was entered [`MIN_STEADY_ENTRIES`] times. The steps, where
/// found, replace this guess ([`recut`]).
fn steady_span(slots: &[(MonoNs, u64, Slot)]) -> Option<(usize, usize)> {
    let class = |s: &Slot| match s {
        Slot::Blocked(c, _, _, false) if !matches!(c, WaitClass::Other | WaitClass::ThreadPool) => {
            Some(*c)
        }
        _ => None,
    };
    let mut entries: BTreeMap<WaitClass, (usize, usize, usize)> = BTreeMap::new();
    let mut prev = None;
    for (i, s) in slots.iter().enumerate() {
        let c = class(&s.2);
        if let Some(c) = c {
            let e = entries.entry(c).or_insert((0, i, i));
            if prev != Some(c) {
                e.0 += 1;
            }
            e.2 = i;
        }
        prev = c;
    }
    let (_, (n, first, last)) = entries
        .into_iter()
        .max_by_key(|(c, e)| (e.0, std::cmp::Reverse(*c)))?;
    (n >= MIN_STEADY_ENTRIES).then_some((first, last + 1))
}

fn slot_of(d: &StackData, stack: u32) -> Slot {
    let f = d.wall_frames(stack);
    match class_of(&f) {
        Some((c, top, holder)) => {
            let import = f.iter().any(|f| {
                matches!(f, WallFrame::Python { file, .. } if crate::vocab::stacks::is_import_file(file))
            });
            Slot::Blocked(c, top, holder, import)
        }
        None if matches!(f.first(), Some(WallFrame::Marker(m)) if *m == crate::vocab::stacks::MARKER_ON_CPU) => {
            Slot::OnCpu
        }
        None => Slot::Unknown,
    }
}

/// The class of a wall-clock stack, or None for a one-marker stack (on a
/// CPU, or a dropped read); with its top frames for `other`.
fn class_of(f: &[WallFrame]) -> Option<(WaitClass, String, Option<String>)> {
    if f.len() <= 1 && matches!(f.first(), Some(WallFrame::Marker(_)) | None) {
        return None;
    }
    let (c, _) = classify(f);
    let holder = f.iter().find_map(|x| match x {
        WallFrame::Marker(m) => m
            .strip_prefix(crate::collect::perf::offcpu::GIL_MARKER_PREFIX)
            .map(|h| format!("thread {}", h.trim_end_matches(']'))),
        _ => None,
    });
    Some((c, top_frames(f), holder))
}

/// The innermost Python function, then the native leaf function and the
/// system call: "get_item (dataset.py) ← read ← [syscall: read]".
pub fn top_frames(f: &[WallFrame]) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(m) = f.iter().find_map(|x| match x {
        WallFrame::Marker(m) if !m.starts_with("[gil held") => Some(m),
        _ => None,
    }) {
        parts.push(m.to_string());
    }
    if let Some(n) = f.iter().find_map(|x| match x {
        WallFrame::Native { name: Some(n), .. } => Some(short_native(n)),
        _ => None,
    }) {
        parts.push(n);
    }
    if let Some(p) = f.iter().find_map(|x| match x {
        WallFrame::Python { name, file } => Some(format!(
            "{name} ({})",
            file.rsplit('/').next().unwrap_or(file)
        )),
        _ => None,
    }) {
        parts.push(p);
    }
    parts.reverse();
    parts.join(" ← ")
}

/// Per thread, its looks marked with the collective it was in (an index
/// into the returned names), for `analysis::collectives`; and marked with
/// whether it was in distributed code at all.
#[allow(clippy::type_complexity)]
pub fn collective_marks(
    d: &StackData,
    window: (MonoNs, MonoNs),
) -> (
    Vec<String>,
    BTreeMap<(Pid, Tid), Vec<(MonoNs, Option<u32>)>>,
    BTreeMap<(Pid, Tid), Vec<(MonoNs, Option<u32>)>>,
) {
    let mut names: Vec<String> = Vec::new();
    let mut marks = BTreeMap::new();
    let mut dist = BTreeMap::new();
    let mut cache: BTreeMap<u32, (Option<u32>, bool)> = BTreeMap::new();
    for (key, samples) in d.wall_samples(window) {
        let mut m = Vec::with_capacity(samples.len());
        let mut dm = Vec::with_capacity(samples.len());
        for &(t, _, stack) in &samples {
            let (mark, distributed) = *cache.entry(stack).or_insert_with(|| {
                let f = d.wall_frames(stack);
                let distributed = f.iter().any(|x| match x {
                    WallFrame::Python { name, file } => {
                        crate::vocab::collectives::is_distributed_frame(name, file)
                    }
                    WallFrame::Native { name: Some(n), .. } => {
                        COLLECTIVE_NATIVE.iter().any(|p| n.contains(p))
                    }
                    _ => false,
                });
                match classify(&f) {
                    (WaitClass::Collective, Some(n)) => {
                        let i = names.iter().position(|x| *x == n).unwrap_or_else(|| {
                            names.push(n);
                            names.len() - 1
                        });
                        (Some(i as u32), true)
                    }
                    _ => (None, distributed),
                }
            });
            // A thinned look's weight is in its gap to the next one
            // (collectives weigh looks by time).
            m.push((t, mark));
            dm.push((t, distributed.then_some(0)));
        }
        marks.insert(key, m);
        dist.insert(key, dm);
    }
    (names, marks, dist)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(name: &'static str) -> WallFrame<'static> {
        WallFrame::Native {
            name: Some(name),
            file: "/lib/libx.so",
        }
    }

    /// A start-up whose imports read files four times, then a loop that
    /// never blocks: no steady state (its life is counted). The same
    /// reads outside an import (a loop reading each batch's file) make one.
    #[test]
    fn an_imports_file_reads_are_not_a_loops_steady_state() {
        let slots = |import: bool| -> Vec<(MonoNs, u64, Slot)> {
            let mut v = Vec::new();
            for _ in 0..4 {
                v.push(Slot::Blocked(
                    WaitClass::FileIo,
                    String::new(),
                    None,
                    import,
                ));
                v.push(Slot::OnCpu);
            }
            v.extend((0..100).map(|_| Slot::OnCpu));
            v.into_iter()
                .enumerate()
                .map(|(i, s)| (MonoNs(i as u64 * 10_000_000), 1, s))
                .collect()
        };
        assert_eq!(steady_span(&slots(true)), None);
        assert_eq!(steady_span(&slots(false)), Some((0, 7)));
    }

    /// Looks every 10 ms: on a CPU (runnable) for 50 ms, blocked for 20,
    /// a read dropped (woke while read), on a CPU again. Only a stretch
    /// with looks and none of them off a CPU stayed runnable.
    #[test]
    fn a_thread_stayed_runnable_only_where_every_look_found_it_so() {
        const MS: u64 = 1_000_000;
        let blocked = || Slot::Blocked(WaitClass::Other, String::new(), None, false);
        let kinds = [
            Slot::OnCpu,
            Slot::OnCpu,
            Slot::OnCpu,
            Slot::OnCpu,
            Slot::OnCpu,
            blocked(),
            blocked(),
            Slot::OnCpu,
            Slot::OnCpu,
            Slot::Unknown,
            Slot::OnCpu,
            Slot::OnCpu,
            Slot::OnCpu,
        ];
        let slots: Vec<(MonoNs, u64, Slot)> = kinds
            .into_iter()
            .enumerate()
            .map(|(i, k)| (MonoNs(1_000 * MS + i as u64 * 10 * MS), 1, k))
            .collect();
        let w = ThreadWall {
            not_running: not_running(&slots, 10 * MS, 20 * MS),
            looked: (slots[0].0, slots[12].0),
            look_every_ns: 10 * MS,
            ..Default::default()
        };
        assert_eq!(
            w.not_running,
            vec![
                (MonoNs(1_050 * MS), MonoNs(1_070 * MS)),
                (MonoNs(1_090 * MS), MonoNs(1_100 * MS))
            ]
        );
        let at = |ms: u64| MonoNs(ms * MS);
        assert!(w.stayed_runnable(at(1_001), at(1_045)));
        assert!(
            !w.stayed_runnable(at(1_001), at(1_012)),
            "too short to tell"
        );
        assert!(
            !w.stayed_runnable(at(1_030), at(1_060)),
            "blocked in between"
        );
        assert!(!w.stayed_runnable(at(1_072), at(1_095)), "woke while read");
        assert!(w.stayed_runnable(at(1_100), at(1_120)));
        assert!(!w.stayed_runnable(at(990), at(1_030)), "before its looks");
    }

    #[test]
    fn stacks_are_classified() {
        let futex = WallFrame::Marker("[syscall: futex]");
        let ddp = [
            futex,
            n("__futex_abstimed_wait_common"),
            n("c10d::Reducer::finalize_backward()"),
            n("torch::autograd::Engine::execute"),
        ];
        let (c, f) = classify(&ddp);
        assert_eq!(c, WaitClass::Collective);
        assert!(f.unwrap().contains("Reducer"));
        let gil = [
            futex,
            n("pthread_cond_timedwait"),
            n("take_gil"),
            n("c10d::x"),
        ];
        assert_eq!(classify(&gil).0, WaitClass::Gil, "the GIL wins");
        let batch = [
            futex,
            n("sem_clock_wait"),
            WallFrame::Python {
                name: "Queue.get",
                file: "/usr/lib/python3.11/queue.py",
            },
        ];
        assert_eq!(classify(&batch).0, WaitClass::NextBatch);
        let sync = [
            WallFrame::Marker("[syscall: clock_nanosleep]"),
            WallFrame::Python {
                name: "synchronize",
                file: "/x/torch/cuda/__init__.py",
            },
        ];
        assert_eq!(classify(&sync).0, WaitClass::GpuSync);
        let io = [
            WallFrame::Marker("[syscall: fsync, regular file]"),
            n("fsync"),
        ];
        assert_eq!(classify(&io).0, WaitClass::FileIo);
        let sleep = [
            WallFrame::Marker("[syscall: clock_nanosleep]"),
            n("clock_nanosleep"),
        ];
        assert_eq!(classify(&sleep).0, WaitClass::Sleep);
        // oneDNN's reorder at the end of an OpenMP region (libgomp's own
        // frames are not named): compute on the pool's other threads.
        let barrier = [
            futex,
            WallFrame::Native {
                name: None,
                file: "/x/torch/lib/libgomp-a34b3233.so.1",
            },
            n("dnnl::impl::cpu::x64::jit_blk_reorder_t::execute"),
            WallFrame::Python {
                name: "Conv2d._conv_forward",
                file: "/x/torch/nn/modules/conv.py",
            },
        ];
        assert_eq!(classify(&barrier).0, WaitClass::ThreadPool);
        let own_pool = [futex, n("c10::ThreadPool::main_loop(unsigned long)")];
        assert_eq!(classify(&own_pool).0, WaitClass::ThreadPool);
        let idle = [futex, n("c10d::ProcessGroupGloo::runLoop(int)")];
        assert_eq!(classify(&idle).0, WaitClass::Other, "gloo's idle worker");
        let pipe = [WallFrame::Marker("[syscall: read]"), n("read")];
        assert_eq!(classify(&pipe).0, WaitClass::Other);
        assert_eq!(top_frames(&pipe), "read ← [syscall: read]");
    }
}
