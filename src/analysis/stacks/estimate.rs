//! The Python view, and its estimate from py-spy's stacks where a
//! thread has no Python frames of the same instant.

use super::names::{basename, clean};
use super::*;

/// A thread's py-spy stacks stand in for its missing Python frames only
/// when this share of its consecutive reads are the same stack …
pub(super) const ESTIMATE_MIN_AGREEMENT: f64 = 0.8;
/// … over at least this many pairs of reads.
pub(super) const ESTIMATE_MIN_PAIRS: usize = 3;

impl Stacks {
    /// Compute every sample's Python view (see [`crate::analysis::fold`]): for
    /// processes that ran Python (a Python or interpreter frame in any of
    /// their samples); others keep every frame.
    pub(super) fn build_python_view(&mut self) {
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
    pub(super) fn estimate_python_frames(&mut self) {
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
}
