//! Framework thread pools under the Python frames that asked for their
//! work.
//!
//! PyTorch, oneDNN, MKL and NumPy's BLAS run an operator's loops on
//! intra-op pool threads (OpenMP's libgomp or libiomp5, TBB, OpenBLAS,
//! PyTorch's own `c10::ThreadPool`). Those threads never run Python: on
//! their own, their samples are a root without any Python frame (`[libgomp]`
//! → `…_omp_fn.0` → kernel), cut off from the `Conv2d.forward` that asked
//! for them. The thread that starts a parallel region takes part in it, so
//! while a pool thread works, its starter is inside the same pool's code
//! (`GOMP_parallel`) under the Python frames of that operator.
//!
//! How a pool sample is placed (an estimate by time, said so in its frame
//! and counted apart): its process's *starter* is the Python thread with
//! the most samples inside the pool's library (ties: the lowest tid); the
//! pool sample goes under that thread's sample nearest in time that has
//! Python frames of its own instant, within three sampling intervals (the
//! period, or the starter's median interval between samples if longer),
//! preferring one inside the pool's library (the same parallel region) or
//! one whose native frames are unknown (it may be inside it too).
//! The starter's frames are kept down to the operator's call into the pool
//! (or to its innermost Python frame when it was elsewhere: a pool thread
//! spinning after a region ended), then `[pool thread of …]`, then the
//! pool thread's own frames. The native view keeps every frame as sampled;
//! a pool sample with no starter sample near it keeps its own root.

use std::collections::{BTreeMap, HashMap};

use super::{Attribution, FrameClass, FrameInfo, Sample, Stacks};
use crate::event::{Pid, Tid};

/// Library files of thread-pool runtimes (basename prefixes): OpenMP
/// (GNU, Intel, LLVM; PyTorch wheels bundle `libgomp-<hash>.so.1`), TBB,
/// OpenBLAS (NumPy's and SciPy's copies).
const POOL_FILES: &[&str] = &[
    "libgomp",
    "libiomp",
    "libomp",
    "libtbb",
    "libopenblas",
    "libscipy_openblas",
];

/// Worker loops of pools that live inside bigger libraries: PyTorch's
/// own pool (`c10::ThreadPool`, the intra-op pool of builds without
/// OpenMP), OpenBLAS's server threads in a statically linked copy.
const POOL_FUNCTIONS: &[&str] = &["c10::ThreadPool::main_loop", "blas_thread_server"];

/// A pool sample is placed under a starter sample at most this many
/// sampling intervals away: the period, or the starter's own typical
/// interval between consecutive samples when that is longer (samples
/// come once a period of *CPU* time: on a loaded machine an on-CPU thread
/// waits between them). Farther than that and the starter was off the
/// CPU, so its frames are unknown.
const WINDOW_PERIODS: u64 = 3;
/// Gaps longer than this between a thread's samples are time off the CPU
/// (blocked), not the sampling interval.
const MAX_INTERVAL_NS: u64 = 1_000_000_000;
/// The window when the period is unknown (an old recording): 3 × 99 Hz.
const DEFAULT_WINDOW_NS: u64 = 30_000_000;

/// A pool sample and the starter sample it is placed under (indexes into
/// [`Stacks::samples`]), and the pool's library.
pub(super) struct Link {
    pub sample: usize,
    pub starter: usize,
    pub file: String,
}

/// The file of the pool a stack runs in, if any.
fn pool_file(stack: &[u32], frames: &[FrameInfo]) -> Option<String> {
    stack.iter().find_map(|&f| {
        let fi = &frames[f as usize];
        if fi.class == FrameClass::Python || fi.file.is_empty() {
            return None;
        }
        is_pool_frame(&fi.name, &fi.file).then(|| fi.file.clone())
    })
}

/// A native frame of a thread-pool runtime: in one of its libraries, or
/// one of the pools' loops inside a bigger library.
pub fn is_pool_frame(name: &str, file: &str) -> bool {
    let base = file.rsplit('/').next().unwrap_or(file);
    POOL_FILES.iter().any(|p| base.starts_with(p))
        || POOL_FUNCTIONS.iter().any(|p| name.starts_with(p))
}

/// Unwinding stopped before the thread's start: the outermost frame is an
/// address outside every mapping, unknown, or in anonymous memory (code
/// made at run time, as oneDNN's JIT convolution kernels are, has no
/// unwind tables to go on with).
fn cut_off(stack: &[u32], frames: &[FrameInfo]) -> bool {
    stack.first().is_some_and(|&f| {
        let fi = &frames[f as usize];
        fi.file == "[unknown]"
            || fi.file.starts_with("[anon")
            || fi.file.starts_with("//anon")
            || (fi.class == FrameClass::Marker && fi.name == "[unknown]")
    })
}

fn has_python(a: Attribution) -> bool {
    matches!(
        a,
        Attribution::SameInstant | Attribution::SameInstantPartial | Attribution::NativeUnknown
    )
}

/// Per thread: (pid, tid) → the range of its samples (sorted by thread).
fn thread_ranges(samples: &[Sample]) -> BTreeMap<(Pid, Tid), (usize, usize)> {
    let mut out = BTreeMap::new();
    let mut i = 0;
    while i < samples.len() {
        let key = (samples[i].pid, samples[i].tid);
        let from = i;
        while i < samples.len() && (samples[i].pid, samples[i].tid) == key {
            i += 1;
        }
        out.insert(key, (from, i));
    }
    out
}

/// Find each pool sample's starter sample. `samples` are sorted by (pid,
/// tid, t); `period_ns` and `bucket_ns` set the window.
pub(super) fn link(
    samples: &[Sample],
    frames: &[FrameInfo],
    stacks: &[Vec<u32>],
    period_ns: u64,
    bucket_ns: u64,
) -> Vec<Link> {
    let window = if period_ns > 0 {
        (WINDOW_PERIODS * period_ns).max(2 * bucket_ns)
    } else {
        DEFAULT_WINDOW_NS.max(2 * bucket_ns)
    };
    let threads = thread_ranges(samples);
    let mut pool_of: HashMap<u32, Option<String>> = HashMap::new();
    let mut pool = |stack: u32| -> Option<String> {
        pool_of
            .entry(stack)
            .or_insert_with(|| pool_file(&stacks[stack as usize], frames))
            .clone()
    };
    // Python threads (any sample with Python frames) and, per process and
    // pool file, how many of their samples are inside that pool.
    let mut python_threads: BTreeMap<Pid, Vec<Tid>> = BTreeMap::new();
    let mut in_pool: BTreeMap<(Pid, String, Tid), u64> = BTreeMap::new();
    let mut pool_samples: Vec<(usize, String)> = Vec::new();
    for (&(pid, tid), &(from, to)) in &threads {
        let thread = &samples[from..to];
        let python = thread.iter().any(|s| has_python(s.attribution));
        if python {
            python_threads.entry(pid).or_default().push(tid);
        }
        // A thread without Python whose samples that reach their root are
        // mostly in one pool is that pool's thread: its samples whose
        // unwinding stopped early (a kernel without unwind tables under
        // `[[unknown]]`) are that pool's work too.
        let mut own: BTreeMap<String, u64> = BTreeMap::new();
        let mut elsewhere = 0u64;
        let mut cut_short: Vec<usize> = Vec::new();
        for (i, s) in thread.iter().enumerate() {
            let Some(file) = pool(s.stack) else {
                if python || s.attribution != Attribution::NativeOnly {
                    continue;
                }
                if cut_off(&stacks[s.stack as usize], frames) {
                    cut_short.push(from + i);
                } else {
                    elsewhere += s.weight as u64;
                }
                continue;
            };
            if python {
                *in_pool.entry((pid, file, tid)).or_default() += s.weight as u64;
            } else if s.attribution == Attribution::NativeOnly {
                *own.entry(file.clone()).or_default() += s.weight as u64;
                pool_samples.push((from + i, file));
            }
        }
        let main_pool = own
            .into_iter()
            .max_by_key(|(f, n)| (*n, std::cmp::Reverse(f.clone())));
        if let Some((file, n)) = main_pool {
            if n >= elsewhere {
                pool_samples.extend(cut_short.into_iter().map(|i| (i, file.clone())));
            }
        }
    }
    pool_samples.sort_unstable();
    let mut starters: HashMap<(Pid, String), Option<Tid>> = HashMap::new();
    let mut windows: HashMap<(Pid, Tid), u64> = HashMap::new();
    let mut links = Vec::new();
    for (i, file) in pool_samples {
        let s = &samples[i];
        let starter = *starters.entry((s.pid, file.clone())).or_insert_with(|| {
            let tids = python_threads.get(&s.pid)?;
            // Most samples inside the pool; then the lowest tid (the
            // main thread, when it is a candidate).
            tids.iter().copied().max_by_key(|t| {
                let n = in_pool.get(&(s.pid, file.clone(), *t)).copied();
                (n.unwrap_or(0), std::cmp::Reverse(*t))
            })
        });
        let Some(tid) = starter else { continue };
        let (from, to) = threads[&(s.pid, tid)];
        let window = *windows
            .entry((s.pid, tid))
            .or_insert_with(|| window.max(WINDOW_PERIODS * typical_interval(&samples[from..to])));
        // A starter sample whose native frames are unknown (unwinding
        // stopped in a kernel without unwind tables, as MKL's and ATen's
        // vectorised loops often do) may well be inside the same region:
        // it competes by time with those seen inside the pool, never loses
        // to a farther one for want of frames.
        if let Some(j) = nearest(&samples[from..to], s.t.0, window, &mut |x| {
            x.attribution == Attribution::NativeUnknown
                || cut_off(&stacks[x.stack as usize], frames)
                || pool(x.stack).as_deref() == Some(file.as_str())
        }) {
            links.push(Link {
                sample: i,
                starter: from + j,
                file,
            });
        }
    }
    links
}

/// The median interval between a thread's consecutive samples, leaving
/// out gaps in which it was blocked (0 for fewer than two samples).
fn typical_interval(thread: &[Sample]) -> u64 {
    let mut gaps: Vec<u64> = thread
        .windows(2)
        .map(|w| w[1].t.0.saturating_sub(w[0].t.0))
        .filter(|&g| g > 0 && g < MAX_INTERVAL_NS)
        .collect();
    if gaps.is_empty() {
        return 0;
    }
    let mid = gaps.len() / 2;
    *gaps.select_nth_unstable(mid).1
}

/// The sample of `thread` with Python frames nearest to `t` within
/// `window`, one for which `preferred` holds if there is any.
fn nearest(
    thread: &[Sample],
    t: u64,
    window: u64,
    preferred: &mut dyn FnMut(&Sample) -> bool,
) -> Option<usize> {
    let lo = thread.partition_point(|x| x.t.0 + window < t);
    let hi = thread.partition_point(|x| x.t.0 <= t.saturating_add(window));
    let mut best: Option<(bool, u64, usize)> = None;
    for (j, x) in thread.iter().enumerate().take(hi).skip(lo) {
        if !has_python(x.attribution) {
            continue;
        }
        let key = (!preferred(x), x.t.0.abs_diff(t), j);
        if best.map_or(true, |b| key < b) {
            best = Some(key);
        }
    }
    best.map(|b| b.2)
}

/// The frame a pool thread's sample is placed under, naming the thread
/// that started its work: `[pool thread of the main thread]`,
/// `[pool thread of thread 4321]`.
pub fn pool_label(pid: Pid, tid: Tid) -> String {
    if tid.0 == pid.0 {
        "[pool thread of the main thread]".to_string()
    } else {
        format!("[pool thread of thread {}]", tid.0)
    }
}

impl Stacks {
    /// The Python view of each linked pool sample: its starter's frames
    /// down to the call into the pool (or its innermost Python frame), a
    /// `[pool thread of …]` frame, then the pool thread's own (folded)
    /// frames. Runs after [`Stacks::build_python_view`].
    pub(super) fn place_pool_samples(&mut self, links: &[Link]) {
        let mut labels: HashMap<(Pid, Tid), u32> = HashMap::new();
        let mut ids: HashMap<Vec<u32>, u32> = HashMap::new();
        for l in links {
            let starter = self.samples[l.starter];
            let own = self.samples[l.sample].py_stack;
            let label = *labels.entry((starter.pid, starter.tid)).or_insert_with(|| {
                let label = pool_label(starter.pid, starter.tid);
                self.frames.push(FrameInfo {
                    label: label.clone(),
                    class: FrameClass::Marker,
                    name: label,
                    file: String::new(),
                    eval: false,
                    line: None,
                });
                self.frames.len() as u32 - 1
            });
            let theirs = &self.stacks[starter.py_stack as usize];
            let into_pool = theirs
                .iter()
                .position(|&f| self.frames[f as usize].file == l.file);
            let innermost_python = theirs
                .iter()
                .rposition(|&f| self.frames[f as usize].class == FrameClass::Python);
            let cut = match (into_pool, innermost_python) {
                (Some(p), _) => p,
                (None, Some(p)) => p + 1,
                (None, None) => theirs.len(),
            };
            let mut out: Vec<u32> = theirs[..cut].to_vec();
            out.push(label);
            out.extend_from_slice(&self.stacks[own as usize]);
            let id = super::intern_stack(&mut self.stacks, &mut ids, out);
            self.samples[l.sample].py_stack = id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::MonoNs;

    fn frame(name: &str, file: &str, class: FrameClass) -> FrameInfo {
        FrameInfo {
            label: name.to_string(),
            class,
            name: name.to_string(),
            file: file.to_string(),
            eval: false,
            line: None,
        }
    }

    fn sample(tid: i32, ms: u64, stack: u32, attribution: Attribution) -> Sample {
        Sample {
            t: MonoNs(ms * 1_000_000),
            pid: Pid(1),
            tid: Tid(tid),
            stack,
            py_stack: stack,
            lined_stack: stack,
            lined_py_stack: stack,
            attribution,
            weight: 1,
        }
    }

    /// The main thread (tid 1) is seen inside the pool at 0 ms and with
    /// unknown native frames (inside a kernel) at 20 ms; the pool thread
    /// (tid 2) has a sample at 19 ms inside libgomp and one at 21 ms that
    /// starts in JIT code (`[anon]`). Both pool samples go under the
    /// nearer main-thread sample, the one whose native frames are unknown,
    /// not the farther one seen inside the pool; the `[anon]` one counts
    /// as the pool's work.
    #[test]
    fn pool_samples_go_to_the_nearest_starter_sample_that_may_be_in_the_region() {
        let frames = vec![
            frame("f", "a.py", FrameClass::Python),
            frame("GOMP_parallel", "/x/libgomp.so.1", FrameClass::Native),
            frame("[unknown]", "[unknown]", FrameClass::Native),
            frame("[anon]", "[anon]", FrameClass::Native),
            frame("kernel", "/x/libtorch_cpu.so", FrameClass::Native),
        ];
        let stacks = vec![
            vec![0, 1],    // 0: main, inside the pool
            vec![0, 2, 4], // 1: main, native frames unknown
            vec![1, 4],    // 2: pool thread in libgomp
            vec![3],       // 3: pool thread in JIT code
        ];
        let samples = vec![
            sample(1, 0, 0, Attribution::SameInstant),
            sample(1, 20, 1, Attribution::NativeUnknown),
            sample(2, 19, 2, Attribution::NativeOnly),
            sample(2, 21, 3, Attribution::NativeOnly),
        ];
        let links = link(&samples, &frames, &stacks, 10_000_000, 0);
        let got: Vec<(usize, usize)> = links.iter().map(|l| (l.sample, l.starter)).collect();
        assert_eq!(got, vec![(2, 1), (3, 1)]);
        assert!(links.iter().all(|l| l.file == "/x/libgomp.so.1"));
    }
}
