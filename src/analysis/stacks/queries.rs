//! Queries over the merged stacks: frames and names, role samples, fold
//! summaries and folded text, top functions, the trace's time grid.

use super::names::{basename, clean};
use super::*;

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

    pub(super) fn role_of(&self, pid: Pid) -> Role {
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
    pub(super) fn roots(&self, merge: bool) -> HashMap<Pid, String> {
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
    pub(super) fn fold_view(&self, stack: u32) -> (Vec<ViewFrame>, FoldNotes) {
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
    pub(super) fn collapse_lines(&mut self, phases: &[usize], by_function: bool) {
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
