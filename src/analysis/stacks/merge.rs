//! Merging perf's and the agent's samples: one sampler per thread, the
//! Python frames of the same instant put in place of the interpreter's
//! native frames, and merged stacks interned.

use super::intake::{Frame, RawSample, StackData};
use super::names::{Kind, Resolver};
use super::*;

/// The markers `merge_same_instant` places.
pub(super) struct Markers {
    pub(super) unmatched: u32,
    pub(super) truncated: u32,
    pub(super) native_unknown: u32,
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
pub(super) fn merge_same_instant(
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

/// Per merged frame id, the lowest file offset of the native frames named
/// by it (None for Python frames, markers and frames made later).
pub(super) fn lowest_offsets(
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
pub(super) const STAND_IN_MAX_NS: u64 = 1_000_000_000;

/// Each thread's samples come from one sampler: the agent's where it
/// sampled the thread, perf's otherwise (never both: no double counting).
/// Keeps those in `native` (sorted by (pid, tid, t), as it comes); returns
/// the processes the agent sampled, and counts in `rep` the perf samples
/// the reader left to the agent of a thread that ended on perf's side.
pub(super) fn keep_one_sampler(
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
    rep.agent_threads = use_agent
        .iter()
        .filter(|(_, &agent)| agent)
        .map(|(k, _)| *k)
        .collect();
    rep.agent_seen_threads = per_thread
        .iter()
        .filter(|(_, c)| c.0 > 0)
        .map(|(k, _)| *k)
        .collect();
    let agent_pids: BTreeSet<Pid> = rep
        .agent_seen_threads
        .iter()
        .map(|k| k.0)
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
pub(super) fn stand_in_for_covered(
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
pub(super) type MergeKey = (u32, bool, bool, Unattributed);

/// A native sample's merged stack and how its Python frames were found.
#[derive(Clone, Copy)]
pub(super) struct Merged {
    pub(super) id: u32,
    pub(super) attribution: Attribution,
    /// The outermost native frame is a thread root.
    pub(super) root: bool,
    /// The Python frames came from a perf map (CPython's trampolines).
    pub(super) perf_map: bool,
}

/// Merges samples into the stacks of the analysis, each distinct case once.
pub(super) struct Merger<'a> {
    pub(super) r: Resolver<'a>,
    pub(super) markers: Markers,
    pub(super) stacks: Vec<Vec<u32>>,
    pub(super) stack_ids: HashMap<Vec<u32>, u32>,
    pub(super) cache: HashMap<MergeKey, Merged>,
}

impl<'a> Merger<'a> {
    pub(super) fn new(d: &'a StackData) -> Merger<'a> {
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
            truncated: marker(crate::vocab::stacks::MARKER_TRUNCATED),
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

    pub(super) fn merged(&mut self, s: &RawSample, why: Unattributed) -> Merged {
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
    pub(super) fn python_only(
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
