//! Stack slices in the trace, and what links the GPU's idle gaps to them.
//!
//! Each sampled thread's stacks become nested slices on the thread's own
//! track (see `trace_slices::walk_slices`): main and worker threads in the
//! second priority class of the size budget, other processes' threads in
//! the last.
//!
//! **Gap causes.** For a significant idle gap (see `trace_gpu`), the CPU
//! samples taken inside it tell what the job did while the GPU waited: the
//! gap slice's args list the top stacks, and the threads with the largest
//! shares of those samples get a *cause* slice under the gap, named by
//! their dominant function (the deepest frame on the stack in at least
//! half of their samples in the gap) and linked by a flow arrow to that
//! function's slice on the thread's track.
//!
//! Flows use Perfetto's v2 binding — `bind_id` on the two X slices
//! themselves, `flow_out` on the one that starts first, `flow_in` on the
//! other — because it binds to exactly those slices. The v1 `s`/`f` events
//! bind to whatever slice is on top of the thread's stack when they are
//! read, which in Perfetto's importer can be a slice that has already
//! ended (the stack is only unwound when a new slice begins): not a
//! reliable target. The importer pairs a flow's ends in time order, so the
//! two slices never start at the same time (the cause slice is moved by
//! 0.1 µs if needed), and a slice carries one `bind_id`, so a slice is the
//! target of at most one flow.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{self, Write};

use serde_json::{json, Value};

use super::trace_budget::{Class, Part};
use super::trace_gaps::{spans, Span, GAPS_PART, MAX_CAUSE_SPANS};
use super::trace_slices::{thread_slices, walk_slices, TraceSlice, TRACE_MAX_DEPTH};
use super::trace_writer::{json_str, FlowEnd, TraceWriter};
use crate::analysis::gpu::GpuDeviceAnalysis;
use crate::analysis::stacks::{Sample, Stacks, View};
use crate::analysis::{Analysis, Role};
use crate::event::{MonoNs, Pid, Tid};

pub const MAIN_STACKS_PART: &str = "stack slices (main, worker)";
pub const OTHER_STACKS_PART: &str = "stack slices (other)";

/// A thread gets a cause slice when it has at least this share of the
/// gap's samples (16 equally busy threads have 6% each); at most
/// [`MAX_CAUSES`] per gap, the busiest.
const CAUSE_MIN_SHARE: f64 = 0.05;
pub const MAX_CAUSES: usize = 3;
/// Top stacks listed in a gap's args, and frames shown of each.
const TOP_STACKS: usize = 5;
const TOP_STACK_FRAMES: usize = 8;
const HOUR_NS: u64 = 3_600_000_000_000;
/// Bytes a flow adds to the stack slice it binds (`,"bind_id":N,"flow_in":true`).
const FLOW_BYTES: u64 = 40;

/// What the CPU did during one idle span of a GPU.
#[derive(Clone, Debug, Default)]
pub struct GapCauses {
    /// Weighted samples inside the span's idle intervals.
    pub samples: u64,
    /// Stacks, heaviest first: (stack, weight, threads it was seen on, one
    /// of them).
    pub top: Vec<(u32, u64, usize, (Pid, Tid))>,
    /// Threads with the largest shares: (pid, tid, weight, dominant path).
    pub threads: Vec<(Pid, Tid, u64, Vec<u32>)>,
}

/// A cause slice's link, decided when the final levels are known.
#[derive(Clone, Debug)]
pub struct CauseLink {
    pub start: MonoNs,
    /// None when no slice of the thread could take the flow (its stack
    /// slices were left out, or every candidate already has a flow).
    pub flow: Option<FlowEnd>,
    pub target: Value,
}

#[derive(Default)]
struct FlowPlan {
    /// Stack slice (pid, tid, start, depth) → its flow end.
    marks: HashMap<(Pid, Tid, MonoNs, u32), FlowEnd>,
    /// (GPU index, span start, cause index) → the cause slice's link.
    causes: HashMap<(u32, MonoNs, usize), CauseLink>,
    count: u64,
}

/// Shared state of the trace's stack and GPU parts.
pub struct Context<'a> {
    pub a: &'a Analysis,
    pub st: &'a Stacks,
    /// What the stack slices show (`--flame`).
    view: View,
    /// Each thread's range in `st.samples`, with its first and last time.
    threads: Vec<(Pid, Tid, std::ops::Range<usize>, MonoNs, MonoNs)>,
    /// Threads alive in each hour of the recording (indexes into `threads`).
    by_hour: HashMap<u64, Vec<usize>>,
    /// Frame names as JSON strings, by name id.
    names_json: Vec<String>,
    /// Causes per (GPU, first gap, gaps) of a span: computed once.
    cause_cache: RefCell<HashMap<(u32, usize, usize), GapCauses>>,
    flows: RefCell<Option<FlowPlan>>,
    slices_meta: RefCell<BTreeMap<String, Value>>,
    flow_count: Cell<u64>,
}

impl<'a> Context<'a> {
    pub fn new(a: &'a Analysis, view: View) -> Context<'a> {
        let st = &a.stacks;
        let mut threads = Vec::new();
        let mut i = 0;
        for t in st.threads() {
            let (first, last) = (t[0], t[t.len() - 1]);
            threads.push((first.pid, first.tid, i..i + t.len(), first.t, last.t));
            i += t.len();
        }
        let mut by_hour: HashMap<u64, Vec<usize>> = HashMap::new();
        for (i, t) in threads.iter().enumerate() {
            for h in t.3 .0 / HOUR_NS..=t.4 .0 / HOUR_NS {
                by_hour.entry(h).or_default().push(i);
            }
        }
        let names_json = (0..st.name_count() as u32)
            .map(|i| json_str(st.name(i)))
            .collect();
        Context {
            a,
            st,
            view,
            threads,
            by_hour,
            names_json,
            cause_cache: RefCell::new(HashMap::new()),
            flows: RefCell::new(None),
            slices_meta: RefCell::new(BTreeMap::new()),
            flow_count: Cell::new(0),
        }
    }

    fn is_main(&self, pid: Pid) -> bool {
        self.st
            .procs
            .get(&pid)
            .is_some_and(|m| matches!(m.role, Role::Main | Role::Worker))
    }

    pub fn flow_count(&self) -> u64 {
        self.flow_count.get()
    }

    pub fn slices_meta(&self) -> Value {
        let mut m = self.slices_meta.borrow().clone();
        m.insert("max_depth".into(), json!(TRACE_MAX_DEPTH));
        m.insert("view".into(), json!(self.view.as_str()));
        json!(m)
    }

    fn thread_name(&self, pid: Pid, tid: Tid) -> String {
        let comm = self
            .a
            .processes
            .get(&pid)
            .and_then(|p| p.threads.get(&tid))
            .map(|t| t.comm.as_str())
            .filter(|c| !c.is_empty());
        match comm {
            Some(c) => format!("{c} {tid}"),
            None => format!("thread {tid}"),
        }
    }

    /// Names of processes and threads that only perf saw (too short-lived
    /// for /proc): every track of stack slices is named.
    pub fn write_names(&self, tw: &mut TraceWriter<&mut dyn Write>) -> io::Result<()> {
        let mut named = BTreeSet::new();
        for (pid, tid, _, _, _) in &self.threads {
            let p = self.a.processes.get(pid);
            if p.is_none() && named.insert(*pid) {
                tw.process_name(
                    pid.0 as i64,
                    &self.st.root_frame(*pid),
                    super::trace_ids::SORT_PERF_ONLY + pid.0 as i64,
                )?;
            }
            if !p.is_some_and(|p| p.threads.contains_key(tid)) {
                let label = p.map(|p| p.comm.as_str()).filter(|c| !c.is_empty());
                // After the threads /proc saw (4 tracks each).
                let sort = p.map_or(0, |p| p.threads.len() * 4) as i64 + 4;
                tw.thread_name(pid.0 as i64, tid.0 as i64, label.unwrap_or("thread"), sort)?;
            }
        }
        Ok(())
    }

    /// The two stack parts: main and worker threads, other threads.
    pub fn stack_parts(&'a self) -> Vec<Part<'a>> {
        if self.st.samples.is_empty() {
            return Vec::new();
        }
        let run = self.a.end.0.saturating_sub(self.a.start.0);
        let max = self.st.max_level();
        let floor = (0..max)
            .find(|l| self.st.cell_ns(*l) >= run / 4096)
            .unwrap_or(max);
        let mut out = Vec::new();
        for (class, name, main) in [
            (Class::MainStacks, MAIN_STACKS_PART, true),
            (Class::Detail, OTHER_STACKS_PART, false),
        ] {
            if !self.threads.iter().any(|t| self.is_main(t.0) == main) {
                continue;
            }
            out.push(Part {
                class,
                name: name.into(),
                max_level: max,
                floor_level: floor,
                write: Box::new(move |level, tw| self.write_stacks(main, name, level, tw)),
            });
        }
        out
    }

    fn name_json(&self, id: u32) -> std::borrow::Cow<'_, str> {
        match self.names_json.get(id as usize) {
            Some(s) => std::borrow::Cow::Borrowed(s.as_str()),
            None => std::borrow::Cow::Owned(json_str(self.st.name(id))),
        }
    }

    fn write_stacks(
        &self,
        main: bool,
        name: &str,
        level: u32,
        tw: &mut TraceWriter<&mut dyn Write>,
    ) -> io::Result<Option<String>> {
        let flows = self.flows.borrow();
        let mut n = 0u64;
        for (pid, tid, range, _, _) in &self.threads {
            if self.is_main(*pid) != main {
                continue;
            }
            let (p, t) = (pid.0 as i64, tid.0 as i64);
            let samples = &self.st.samples[range.clone()];
            match flows.as_ref() {
                // Measuring: the order of slices does not matter.
                None => walk_slices(self.st, samples, self.view, level, &mut |sl| {
                    n += 1;
                    // Errors of io::sink cannot happen.
                    let name = self.name_json(sl.name);
                    let _ = tw.slice_json(p, t, &name, sl.start, sl.end, None, None);
                }),
                Some(plan) => {
                    for sl in thread_slices(self.st, samples, self.view, level) {
                        n += 1;
                        let flow = plan.marks.get(&(*pid, *tid, sl.start, sl.depth)).copied();
                        let name = self.name_json(sl.name);
                        tw.slice_json(p, t, &name, sl.start, sl.end, None, flow)?;
                    }
                }
            }
        }
        let cell = self.st.cell_ns(level);
        if flows.is_some() {
            self.slices_meta.borrow_mut().insert(
                name.to_string(),
                json!({"slices": n, "level": level, "cell_ms": (cell as f64 / 1e4).round() / 100.0}),
            );
        }
        Ok((level > 0).then(|| {
            format!(
                "one stack per {:.1} ms per thread ({}x the {} resolution), chosen by weight \
                 among the samples of each cell",
                cell as f64 / 1e6,
                1u64 << level,
                if self.st.bucket_ns > 0 {
                    "analysis bucket's"
                } else {
                    "sampling period's"
                }
            )
        }))
    }

    /// The causes of the span of `d.idle_gaps[first..first + gaps]` of GPU
    /// `gpu` (computed once).
    pub fn causes_of(
        &self,
        gpu: u32,
        idle: &[(MonoNs, MonoNs)],
        first: usize,
        gaps: usize,
    ) -> GapCauses {
        let key = (gpu, first, gaps);
        if let Some(c) = self.cause_cache.borrow().get(&key) {
            return c.clone();
        }
        let c = self.causes(&idle[first..first + gaps]);
        self.cause_cache.borrow_mut().insert(key, c.clone());
        c
    }

    /// The CPU samples inside `idle` (sorted, non-overlapping intervals).
    pub fn causes(&self, idle: &[(MonoNs, MonoNs)]) -> GapCauses {
        let (Some(lo), Some(hi)) = (idle.first().map(|i| i.0), idle.last().map(|i| i.1)) else {
            return GapCauses::default();
        };
        // Per stack: weight, threads, first thread.
        let mut by_stack: HashMap<u32, (u64, BTreeSet<(Pid, Tid)>)> = HashMap::new();
        let mut by_thread: Vec<(Pid, Tid, u64, Vec<&Sample>)> = Vec::new();
        let mut cands: Vec<usize> = (lo.0 / HOUR_NS..=hi.0 / HOUR_NS)
            .flat_map(|h| self.by_hour.get(&h).into_iter().flatten().copied())
            .collect();
        cands.sort_unstable();
        cands.dedup();
        for i in cands {
            let (pid, tid, range, first, last) = &self.threads[i];
            if *last < lo || *first >= hi {
                continue;
            }
            let samples = &self.st.samples[range.clone()];
            let mut inside: Vec<&Sample> = Vec::new();
            for (a, b) in idle {
                let i = samples.partition_point(|s| s.t < *a);
                inside.extend(samples[i..].iter().take_while(|s| s.t < *b));
            }
            if inside.is_empty() {
                continue;
            }
            let mut w = 0;
            for s in &inside {
                w += s.weight as u64;
                let e = by_stack
                    .entry(self.st.view_stack(s, self.view))
                    .or_default();
                e.0 += s.weight as u64;
                e.1.insert((*pid, *tid));
            }
            by_thread.push((*pid, *tid, w, inside));
        }
        let samples: u64 = by_thread.iter().map(|t| t.2).sum();
        let mut top: Vec<(u32, u64, usize, (Pid, Tid))> = by_stack
            .into_iter()
            .map(|(s, (w, th))| (s, w, th.len(), th.first().copied().unwrap_or_default()))
            .collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        top.truncate(TOP_STACKS);
        by_thread.sort_by(|a, b| b.2.cmp(&a.2).then((a.0, a.1).cmp(&(b.0, b.1))));
        let threads = by_thread
            .into_iter()
            .filter(|t| t.2 as f64 >= CAUSE_MIN_SHARE * samples as f64)
            .take(MAX_CAUSES)
            .map(|(p, t, w, inside)| (p, t, w, self.dominant_path(&inside)))
            .collect();
        GapCauses {
            samples,
            top,
            threads,
        }
    }

    /// The frames on the stack in at least half of `samples` (by weight),
    /// outermost first: the heaviest frame at each depth while it holds
    /// half.
    fn dominant_path(&self, samples: &[&Sample]) -> Vec<u32> {
        let total: u64 = samples.iter().map(|s| s.weight as u64).sum();
        let mut path = Vec::new();
        let mut cur: Vec<&Sample> = samples.to_vec();
        for depth in 0.. {
            let mut w: BTreeMap<u32, u64> = BTreeMap::new();
            for s in &cur {
                if let Some(f) = self
                    .st
                    .stack_ids(self.st.view_stack(s, self.view))
                    .get(depth)
                {
                    *w.entry(*f).or_default() += s.weight as u64;
                }
            }
            let Some((&f, &fw)) = w.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))) else {
                break;
            };
            if fw * 2 < total {
                break;
            }
            path.push(f);
            cur.retain(|s| {
                self.st
                    .stack_ids(self.st.view_stack(s, self.view))
                    .get(depth)
                    == Some(&f)
            });
        }
        path
    }

    /// Text of a stack for a gap's args: leaf first, a few frames.
    pub fn stack_text(&self, stack: u32) -> String {
        let frames = self.st.stack_ids(stack);
        let mut parts: Vec<&str> = frames
            .iter()
            .rev()
            .take(TOP_STACK_FRAMES)
            .map(|f| self.st.name(*f))
            .collect();
        if frames.len() > TOP_STACK_FRAMES {
            parts.push("…");
        }
        parts.join(" ← ")
    }

    /// The gap slice's args about the CPU, and each cause's slice (name,
    /// args) — the same whether measuring or writing.
    pub fn gap_args(&self, c: &GapCauses) -> Value {
        let period_s = self.st.period_ns as f64 / 1e9;
        let top: Vec<Value> = c
            .top
            .iter()
            .map(|(stack, w, threads, (pid, tid))| {
                json!({
                    "pct": pct(*w, c.samples),
                    "threads": threads,
                    "thread": self.thread_name(*pid, *tid),
                    "process": self.st.root_frame(*pid),
                    "stack": self.stack_text(*stack),
                })
            })
            .collect();
        json!({
            "cpu_samples": c.samples,
            "cpu_s": (c.samples as f64 * period_s * 1000.0).round() / 1000.0,
            "top_stacks": top,
        })
    }

    pub fn cause_slice(&self, c: &GapCauses, i: usize) -> (String, Value) {
        let (pid, tid, w, path) = &c.threads[i];
        let what = path
            .last()
            .map(|f| self.st.name(*f).to_string())
            .unwrap_or_else(|| self.thread_name(*pid, *tid));
        let period_s = self.st.period_ns as f64 / 1e9;
        (
            format!("cause: {what}"),
            json!({
                "thread": self.thread_name(*pid, *tid),
                "process": self.st.root_frame(*pid),
                "pct_of_cpu_samples_in_gap": pct(*w, c.samples),
                "cpu_s_in_gap": (*w as f64 * period_s * 1000.0).round() / 1000.0,
                "dominant_path": path.iter().map(|f| self.st.name(*f)).collect::<Vec<_>>().join(" → "),
            }),
        )
    }

    /// The start of cause slice `i` under a span starting at `start`.
    pub fn cause_start(start: MonoNs, i: usize) -> MonoNs {
        MonoNs(start.0 + 100 * (i as u64 + 1))
    }

    /// Planning: a cause's link adds its target's fields to the cause
    /// slice and a `bind_id` to the stack slice.
    pub fn reserve_link(&self, tw: &mut TraceWriter<&mut dyn Write>) {
        tw.reserve(FLOW_BYTES + 120);
    }

    /// The link of a cause slice, once flows are prepared.
    pub fn link(&self, gpu: u32, span_start: MonoNs, i: usize) -> Option<CauseLink> {
        self.flows
            .borrow()
            .as_ref()
            .and_then(|f| f.causes.get(&(gpu, span_start, i)).cloned())
    }

    pub fn preparing(&self) -> bool {
        self.flows.borrow().is_none()
    }

    /// Decide every flow for the final levels: for each cause, the slice of
    /// its dominant function on the thread's track (the deepest frame of
    /// the dominant path that has a free slice overlapping the gap), and
    /// which end goes first.
    pub fn prepare_flows(&self, parts: &[Part], levels: &[Option<u32>]) {
        let level_of = |name: &str| {
            parts
                .iter()
                .position(|p| p.name == name)
                .and_then(|i| levels[i])
        };
        let gap_level = level_of(GAPS_PART);
        let (main_level, other_level) = (level_of(MAIN_STACKS_PART), level_of(OTHER_STACKS_PART));
        let mut plan = FlowPlan::default();
        let Some(gap_level) = gap_level else {
            *self.flows.borrow_mut() = Some(plan);
            return;
        };
        // Every cause, grouped by thread so that each thread's slices are
        // built once.
        struct Want {
            gpu: u32,
            span: (MonoNs, MonoNs),
            idx: usize,
            path: Vec<u32>,
        }
        let mut by_thread: BTreeMap<(Pid, Tid), Vec<Want>> = BTreeMap::new();
        for d in &self.a.gpu.devices {
            for (span, causes) in cause_spans(self, d, gap_level) {
                for (i, (pid, tid, _, path)) in causes.threads.iter().enumerate() {
                    by_thread.entry((*pid, *tid)).or_default().push(Want {
                        gpu: d.index,
                        span: (span.start, span.end),
                        idx: i,
                        path: path.clone(),
                    });
                }
            }
        }
        let mut used: HashSet<(Pid, Tid, MonoNs, u32)> = HashSet::new();
        let mut links: Vec<Link> = Vec::new();
        for ((pid, tid), wants) in by_thread {
            let level = if self.is_main(pid) {
                main_level
            } else {
                other_level
            };
            let range = self
                .threads
                .iter()
                .find(|t| (t.0, t.1) == (pid, tid))
                .map(|t| t.2.clone());
            let (Some(level), Some(range)) = (level, range) else {
                for w in wants {
                    links.push(((w.gpu, w.span.0, w.idx), None));
                }
                continue;
            };
            let slices = thread_slices(self.st, &self.st.samples[range], self.view, level);
            // Per name: its slices by start, and the longest of them.
            let mut by_name: HashMap<u32, (Vec<usize>, u64)> = HashMap::new();
            for (i, sl) in slices.iter().enumerate() {
                let e = by_name.entry(sl.name).or_default();
                e.0.push(i);
                e.1 = e.1.max(sl.end.0 - sl.start.0);
            }
            for w in wants {
                let (s, e) = w.span;
                let overlap = |sl: &TraceSlice| sl.end.min(e).0.saturating_sub(sl.start.max(s).0);
                let mut found = None;
                for f in w.path.iter().rev() {
                    let Some((idx, longest)) = by_name.get(f) else {
                        continue;
                    };
                    // Slices of this name starting before the span's end,
                    // back to the earliest that can still reach into it.
                    let end = idx.partition_point(|i| slices[*i].start < e);
                    let from = s.0.saturating_sub(*longest);
                    found = idx[..end]
                        .iter()
                        .rev()
                        .map(|i| &slices[*i])
                        .take_while(|sl| sl.start.0 >= from)
                        .filter(|sl| overlap(sl) > 0)
                        .filter(|sl| !used.contains(&(pid, tid, sl.start, sl.depth)))
                        .max_by_key(|sl| (overlap(sl), std::cmp::Reverse(sl.start)));
                    if found.is_some() {
                        break;
                    }
                }
                let target = found.map(|sl| {
                    used.insert((pid, tid, sl.start, sl.depth));
                    (sl.clone(), self.st.name(sl.name).to_string())
                });
                links.push(((w.gpu, s, w.idx), target));
            }
        }
        place_causes(self.a.start, links, &mut plan);
        self.flow_count.set(plan.count);
        *self.flows.borrow_mut() = Some(plan);
    }
}

/// (GPU, span start, cause) → the target slice and its name.
type Link = ((u32, MonoNs, usize), Option<(TraceSlice, String)>);

/// Place each cause slice and its flow: cause slices nest under their gap,
/// each 0.1 µs after the one above it, and never start at the same 0.1 µs
/// as their target.
fn place_causes(start: MonoNs, mut links: Vec<Link>, plan: &mut FlowPlan) {
    let tenths = |t: MonoNs| t.0.saturating_sub(start.0) / 100;
    links.sort_by_key(|l| l.0);
    let mut next_id = 1u64;
    let mut prev: Option<((u32, MonoNs), MonoNs)> = None;
    for ((gpu, span_start, idx), target) in links {
        let mut c = Context::cause_start(span_start, idx);
        if let Some((key, last)) = prev {
            if key == (gpu, span_start) && c <= last {
                c = MonoNs(last.0 + 100);
            }
        }
        let Some((sl, name)) = target else {
            prev = Some(((gpu, span_start), c));
            plan.causes.insert(
                (gpu, span_start, idx),
                CauseLink {
                    start: c,
                    flow: None,
                    target: Value::Null,
                },
            );
            continue;
        };
        if tenths(c) == tenths(sl.start) {
            c = MonoNs(c.0 + 100);
        }
        prev = Some(((gpu, span_start), c));
        let id = next_id;
        next_id += 1;
        let cause_first = tenths(c) < tenths(sl.start);
        plan.marks.insert(
            (sl.pid, sl.tid, sl.start, sl.depth),
            FlowEnd {
                id,
                out: !cause_first,
            },
        );
        plan.causes.insert(
            (gpu, span_start, idx),
            CauseLink {
                start: c,
                flow: Some(FlowEnd {
                    id,
                    out: cause_first,
                }),
                target: json!({
                    "pid": sl.pid.0,
                    "tid": sl.tid.0,
                    "name": name,
                    "ts": tenths(sl.start) as f64 / 10.0,
                    "depth": sl.depth,
                }),
            },
        );
        plan.count += 1;
    }
}

fn pct(w: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        (w as f64 / total as f64 * 1000.0).round() / 10.0
    }
}
/// The significant spans of a GPU at `level`, with their causes: spans
/// long enough for a few stack samples per busy thread (4 sampling
/// periods), the longest [`MAX_CAUSE_SPANS`](super::trace_gaps::MAX_CAUSE_SPANS) >> level, those with CPU
/// samples inside.
pub fn cause_spans(ctx: &Context, d: &GpuDeviceAnalysis, level: u32) -> Vec<(Span, GapCauses)> {
    if ctx.st.samples.is_empty() {
        return Vec::new();
    }
    let min = ctx.st.period_ns.max(1_000_000).saturating_mul(4);
    let mut cands: Vec<Span> = spans(d, level)
        .into_iter()
        .filter(|s| s.idle_ns >= min)
        .collect();
    cands.sort_by_key(|s| (std::cmp::Reverse(s.idle_ns), s.start));
    cands.truncate(MAX_CAUSE_SPANS >> level.min(20));
    cands.sort_by_key(|s| s.start);
    cands
        .into_iter()
        .map(|s| (s, ctx.causes_of(d.index, &d.idle_gaps, s.first, s.gaps)))
        .filter(|(_, c)| c.samples > 0)
        .collect()
}
