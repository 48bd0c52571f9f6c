//! Start-up and shutdown of the job, read from the stack samples of its
//! input side: the main processes' main threads and the workers' input
//! threads (a worker started with `spawn` imports the program again, and
//! PyTorch with it, before its first batch).
//!
//! Without measured steps and without a measured GPU, nothing else tells
//! where a run's training loop begins (the shutdown is taken from here
//! with steps too: after its last step a job can still spend a second
//! exiting): a job that spends seconds importing
//! PyTorch from a cold page cache looks, from /proc alone, like a main
//! thread busy preparing batches and blocked on storage reads. The stacks
//! tell: while a Python program imports, its frames run inside
//! `importlib._bootstrap` (`_find_and_load`); before its first Python code
//! and after its last (finalizing modules, C++ static destructors at
//! `exit`) the interpreter runs no Python frame at all. Only these two
//! signs count — never a function name of the program — so a program whose
//! start is its own code (listing a dataset, building a model) gets no
//! start-up here, and a stack that cannot be read either way is left out.

use std::collections::{BTreeSet, HashMap};

use crate::analysis::fold::FrameClass;
use crate::analysis::stacks::{FrameInfo, Sample, Stacks};
use crate::analysis::Analysis;
use crate::event::{MonoNs, Pid, Tid};

use super::timeline::{Cause, LoopFrom, Timeline};

/// What a main or input thread was doing in one sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Inside an import (a frame of `importlib._bootstrap`).
    Import,
    /// The interpreter running no Python code (no Python or interpreter
    /// loop frame): before the program's first line or after its last.
    NoPython,
    /// Running Python code.
    Running,
}

/// Start-up and shutdown bins of a timeline.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Edges {
    /// First bin after start-up: in every sampled bin before it, the main
    /// and input threads imported (or had not begun Python code) in most
    /// of their samples, and they imported in at least one; or, when later, the end
    /// of the imports of the slowest input worker of those that began
    /// before any was ready.
    pub startup_end: Option<usize>,
    /// `startup_end`'s bin and the instant in it at which the main and
    /// input threads' imports ended, when that bin began with them (None
    /// when the start-up's end is a worker's).
    pub startup_end_t: Option<(usize, MonoNs)>,
    /// First bin of shutdown: in every sampled bin from it on, the main
    /// and input threads ran no Python code in most of their samples.
    pub shutdown_from: Option<usize>,
    /// The last sampled bin before `shutdown_from` and the instant in it
    /// at which the main and input threads stopped running Python code,
    /// when that bin ended with the exit.
    pub shutdown_from_t: Option<(usize, MonoNs)>,
    /// Bins before the shutdown in which every input worker alive had begun
    /// its own exit (its interpreter finalizing, after its last batch).
    pub workers_exiting: BTreeSet<usize>,
}

/// The phase of a merged stack; None when it cannot be told (a stack made
/// up by the analysis, such as a perf sample left for the agent).
fn phase_of(st: &Stacks, stack: u32) -> Option<Phase> {
    phase_of_frames(st.stack_frames(stack))
}

/// The phase of a stack's frames. Python frames that are not known for the
/// instant (`[python: not sampled]` over an interpreter frame, or the outer
/// frames cut off, `[python: truncated]`) could be an import's as well as
/// the program's: such a sample tells neither, unless the frames that are
/// known show an import.
fn phase_of_frames<'a>(frames: impl Iterator<Item = &'a FrameInfo>) -> Option<Phase> {
    let (mut python, mut eval, mut import, mut marker, mut truncated) =
        (false, false, false, false, false);
    for f in frames {
        match f.class {
            FrameClass::Python => {
                python = true;
                import |= f.imports();
            }
            FrameClass::Marker => {
                marker = true;
                truncated |= f.label == crate::vocab::stacks::MARKER_TRUNCATED;
            }
            _ => {}
        }
        eval |= f.eval;
    }
    if import {
        Some(Phase::Import)
    } else if (python && !truncated) || (eval && !python && !marker) {
        Some(Phase::Running)
    } else if marker || python {
        None
    } else {
        Some(Phase::NoPython)
    }
}

/// Sample weight per phase: [import, no Python, running].
type W = [f64; 3];

/// One input thread's sample weights, in the bins it was sampled in
/// (ascending): sparse, so that a day-long recording of many workers
/// costs what its samples cost, not threads × bins.
struct ThreadWeights {
    id: (Pid, Tid),
    worker: bool,
    bins: Vec<(usize, W)>,
}

/// The weights of the main and input threads that ran Python code.
fn weights(a: &Analysis, tl: &Timeline) -> Vec<ThreadWeights> {
    let mains: BTreeSet<(Pid, Tid)> = tl.mains.iter().map(|t| (t.pid, t.tid)).collect();
    let workers: BTreeSet<(Pid, Tid)> = tl.workers.iter().map(|t| (t.pid, t.tid)).collect();
    let st = &a.stacks;
    // One look at each distinct stack, however many samples share it.
    let mut phases: HashMap<u32, Option<Phase>> = HashMap::new();
    let mut phase = |id: u32| *phases.entry(id).or_insert_with(|| phase_of(st, id));
    let mut out = Vec::new();
    // Samples are sorted by (pid, tid, t): one run per thread.
    let same_thread = |x: &Sample, y: &Sample| (x.pid, x.tid) == (y.pid, y.tid);
    // A thread whose native samples carry no Python frames (without the
    // in-process agent: `--python-frames py-spy`, or an interpreter it does
    // not read) has py-spy's stacks, which do: its imports and its Python
    // code are read from those, and from its native samples only that the
    // interpreter ran no Python code. Without them, every native sample in
    // the interpreter loop read as the program's code, and a start that was
    // all imports as work.
    let py_spy: HashMap<(Pid, Tid), &[Sample]> = st
        .python_only
        .chunk_by(same_thread)
        .map(|run| ((run[0].pid, run[0].tid), run))
        .collect();
    let native: HashMap<(Pid, Tid), &[Sample]> = st
        .samples
        .chunk_by(same_thread)
        .map(|run| ((run[0].pid, run[0].tid), run))
        .collect();
    let ids: BTreeSet<(Pid, Tid)> = native.keys().chain(py_spy.keys()).copied().collect();
    for id in ids {
        let worker = workers.contains(&id);
        if !worker && !mains.contains(&id) {
            continue;
        }
        let own: &[Sample] = native.get(&id).copied().unwrap_or_default();
        let spied: &[Sample] = py_spy.get(&id).copied().unwrap_or_default();
        let phased = thread_phases(own, spied, !spied.is_empty(), &mut phase);
        // A thread that never ran Python code (a shell's, a launcher's in
        // C) has no interpreter to start or stop.
        if phased.iter().all(|x| x.2 == Phase::NoPython) {
            continue;
        }
        let mut bins: Vec<(usize, W)> = Vec::new();
        for (t, weight, p) in phased {
            if let Some(i) = tl.bin_of(t) {
                match bins.last_mut() {
                    Some((j, w)) if *j == i => w[p as usize] += weight as f64,
                    _ => {
                        let mut w = [0.0; 3];
                        w[p as usize] = weight as f64;
                        bins.push((i, w));
                    }
                }
            }
        }
        out.push(ThreadWeights { id, worker, bins });
    }
    out
}

/// One thread's samples that tell a phase, in time order: its native
/// samples, or, for a thread that py-spy sampled (`spied_thread`),
/// py-spy's stacks for its Python code and the native samples only for
/// the interpreter running none.
fn thread_phases(
    own: &[Sample],
    spied: &[Sample],
    spied_thread: bool,
    phase: &mut impl FnMut(u32) -> Option<Phase>,
) -> Vec<(MonoNs, u32, Phase)> {
    let mut phased: Vec<(MonoNs, u32, Phase)> = Vec::with_capacity(own.len() + spied.len());
    for s in own {
        match phase(s.stack) {
            Some(p) if !spied_thread || p == Phase::NoPython => phased.push((s.t, s.weight, p)),
            _ => {}
        }
    }
    for s in spied {
        if let Some(p) = phase(s.stack).filter(|p| *p != Phase::NoPython) {
            phased.push((s.t, s.weight, p));
        }
    }
    if !spied.is_empty() {
        phased.sort_by_key(|x| x.0);
    }
    phased
}

/// The samples of the main and input threads in `bin` that tell a phase,
/// in time order.
fn bin_phases(
    a: &Analysis,
    tl: &Timeline,
    threads: &[ThreadWeights],
    bin: usize,
) -> Vec<(MonoNs, u32, Phase)> {
    let (from, to) = tl.bin_span(bin);
    let st = &a.stacks;
    let mut phase = |id: u32| phase_of(st, id);
    // Samples are sorted by (pid, tid, t): a thread's run, then its bin.
    let window = |v: &'_ [Sample], pid: Pid, tid: Tid, from, to| -> std::ops::Range<usize> {
        let lo = v.partition_point(|s| (s.pid, s.tid, s.t) < (pid, tid, from));
        let hi = v.partition_point(|s| (s.pid, s.tid, s.t) < (pid, tid, to));
        lo..hi
    };
    let mut phased = Vec::new();
    for t in threads.iter().filter(|t| t.bins.iter().any(|b| b.0 == bin)) {
        let (pid, tid) = t.id;
        let own = &st.samples[window(&st.samples, pid, tid, from, to)];
        let spied = &st.python_only[window(&st.python_only, pid, tid, from, to)];
        let whole = window(&st.python_only, pid, tid, MonoNs(0), MonoNs(u64::MAX));
        phased.extend(thread_phases(own, spied, !whole.is_empty(), &mut phase));
    }
    phased.sort_by_key(|x| x.0);
    phased
}

/// The first sample of the suffix of `phased` (in time order) in which the
/// interpreter running no Python code outweighs running it (or importing)
/// the most: where the job's exit began inside the last bin before its
/// shutdown. None when no such suffix leads.
fn exit_suffix_start(phased: &[(MonoNs, u32, Phase)]) -> Option<MonoNs> {
    let (mut score, mut best, mut start) = (0.0, 0.0, None);
    for &(t, weight, p) in phased.iter().rev() {
        score += match p {
            Phase::NoPython => weight as f64,
            Phase::Import | Phase::Running => -(weight as f64),
        };
        if score > best {
            (best, start) = (score, Some(t));
        }
    }
    start
}

/// Just after the prefix of `phased` (in time order) in which importing
/// outweighs running Python code the most; None when no import leads.
/// An import later on, after more of the program's code (a library that
/// the first step imports lazily), does not move it.
fn import_prefix_end(phased: &[(MonoNs, u32, Phase)]) -> Option<MonoNs> {
    let (mut score, mut best, mut end) = (0.0, 0.0, None);
    for &(t, weight, p) in phased {
        score += match p {
            Phase::Import => weight as f64,
            Phase::Running => -(weight as f64),
            Phase::NoPython => 0.0,
        };
        if score > best {
            (best, end) = (score, Some(MonoNs(t.0 + 1)));
        }
    }
    end
}

/// The end of an input worker's own start (the bin after it), before
/// `limit`: the end of the prefix of its samples in which importing (and,
/// before its first Python code, the interpreter starting) outweighs
/// running Python code the most. Summed rather than bin by bin: on a busy
/// machine a worker gets a few samples a bin or none, and one bin whose
/// only sample is the program's own code between two imports does not end
/// an import that goes on after it. None when it imported nothing.
fn worker_start_end(bins: &[(usize, W)], limit: usize) -> Option<usize> {
    let first_python = bins
        .iter()
        .find(|(_, b)| b[Phase::Import as usize] + b[Phase::Running as usize] > 0.0)
        .map(|(i, _)| *i);
    let (mut score, mut best, mut end) = (0.0, 0.0, None);
    let (mut imported, mut imported_by_best) = (0.0, 0.0);
    for (i, b) in bins.iter().take_while(|(i, _)| *i < limit) {
        let starting = first_python.map_or(true, |f| *i <= f);
        let no_python = if starting {
            b[Phase::NoPython as usize]
        } else {
            0.0
        };
        score += b[Phase::Import as usize] + no_python - b[Phase::Running as usize];
        imported += b[Phase::Import as usize];
        if score > best {
            (best, end, imported_by_best) = (score, Some(i + 1), imported);
        }
    }
    end.filter(|_| imported_by_best > 0.0)
}

/// The first bin of an input worker's own exit: the start of the suffix of
/// its samples in which the interpreter running no Python code (finalizing
/// modules, collecting garbage) outweighs Python code the most. None when
/// its samples end in Python code.
fn worker_exit_from(bins: &[(usize, W)]) -> Option<usize> {
    let (mut score, mut best, mut from) = (0.0, 0.0, None);
    for (i, b) in bins.iter().rev() {
        score +=
            b[Phase::NoPython as usize] - b[Phase::Import as usize] - b[Phase::Running as usize];
        if score > best {
            (best, from) = (score, Some(*i));
        }
    }
    from
}

/// The end of the input workers' start: of the slowest of those that
/// began before any worker was ready (a later generation — workers
/// restarted every epoch, a validation loader's — does not make its own
/// start the job's).
fn workers_start_end<'a>(
    workers: impl Iterator<Item = &'a [(usize, W)]>,
    limit: usize,
) -> Option<usize> {
    let starts: Vec<(usize, Option<usize>)> = workers
        .filter(|bins| !bins.is_empty())
        .map(|bins| {
            let exit = worker_exit_from(bins).unwrap_or(usize::MAX);
            (bins[0].0, worker_start_end(bins, limit.min(exit)))
        })
        .collect();
    let first_ready = starts
        .iter()
        .map(|(first, end)| end.unwrap_or(*first))
        .min()?;
    starts
        .iter()
        .filter(|(first, _)| *first < first_ready)
        .filter_map(|(_, end)| *end)
        .max()
}

/// The start-up and shutdown of the timeline's main and input threads.
pub fn find(a: &Analysis, tl: &Timeline) -> Edges {
    if tl.mains.is_empty() || a.stacks.samples.is_empty() {
        return Edges::default();
    }
    let threads = weights(a, tl);
    // All the main and input threads together.
    let mut all = vec![[0.0; 3]; tl.n];
    for t in &threads {
        for (i, b) in &t.bins {
            for p in 0..3 {
                all[*i][p] += b[p];
            }
        }
    }
    let sampled = |b: &W| b.iter().sum::<f64>() > 0.0;
    // Shutdown first: the interpreter running no Python code at the end is
    // shutdown even when the run was all start-up before it.
    let mut shutdown_from = None;
    for (i, b) in all.iter().enumerate().rev().filter(|(_, b)| sampled(b)) {
        if b[1] <= b[0] + b[2] {
            break;
        }
        shutdown_from = Some(i);
    }
    let limit = shutdown_from.unwrap_or(tl.n);
    // Start-up lasts while the threads mostly import (or have not begun
    // Python code), up to the first of two sampled bins in a row in which
    // they mostly ran the program's code: one such bin alone can be a
    // couple of samples of the program's own lines between two imports
    // (py-spy's stacks, a few a bin, once ended a 2 s import in its first
    // 100 ms so)...
    let sampled_bins: Vec<usize> = (0..limit).filter(|&i| sampled(&all[i])).collect();
    let program = |i: usize| all[i][0] + all[i][1] <= all[i][2];
    let (mut threads_end, mut imported) = (None, false);
    for (k, &i) in sampled_bins.iter().enumerate() {
        if program(i) && sampled_bins.get(k + 1).map_or(true, |&j| program(j)) {
            break;
        }
        imported |= all[i][0] > 0.0;
        threads_end = Some(i + 1);
    }
    // ...and while an input worker still starts: the first worker ready
    // makes batches and the loop runs on them while a slower one (on a
    // busy machine, a spawned worker importing PyTorch takes seconds
    // longer) is still importing, and the loop's wait for that one is its
    // start-up. Read per worker, from all its samples: bin by bin, on a
    // busy machine, one stray sample ends it.
    let workers_end = workers_start_end(
        threads.iter().filter(|t| t.worker).map(|t| &t.bins[..]),
        limit,
    );
    let startup_end = threads_end.filter(|_| imported).max(workers_end);
    // The instants inside the bins on either side of the loop at which
    // the imports ended and the exit began: a bin is 100 ms, ten samples
    // of a thread.
    let startup_end_t = startup_end
        .filter(|&b| threads_end == Some(b) && b < limit)
        .and_then(|b| Some((b, import_prefix_end(&bin_phases(a, tl, &threads, b))?)));
    let last_before_exit = shutdown_from.and_then(|s| {
        all[..s]
            .iter()
            .rposition(sampled)
            .filter(|&b| startup_end.map_or(true, |e| b >= e))
    });
    let shutdown_from_t = last_before_exit
        .and_then(|b| Some((b, exit_suffix_start(&bin_phases(a, tl, &threads, b))?)));
    // Bins in which every input worker alive was exiting: they were not
    // making batches.
    let mut workers_exiting = BTreeSet::new();
    let spans: Vec<(usize, usize, Option<usize>)> = threads
        .iter()
        .filter(|t| t.worker && !t.bins.is_empty())
        .map(|t| {
            (
                t.bins[0].0,
                t.bins[t.bins.len() - 1].0,
                worker_exit_from(&t.bins),
            )
        })
        .collect();
    for (_, last, exit) in &spans {
        for i in exit
            .iter()
            .flat_map(|&e| e..=(*last).min(limit.saturating_sub(1)))
        {
            let all_exiting = spans
                .iter()
                .filter(|(f, l, _)| (*f..=*l).contains(&i))
                .all(|(_, _, e)| e.is_some_and(|e| e <= i));
            if all_exiting {
                workers_exiting.insert(i);
            }
        }
    }
    Edges {
        startup_end,
        startup_end_t,
        shutdown_from,
        shutdown_from_t,
        workers_exiting,
    }
}

/// Where the loop begins and the shutdown starts: the first step when
/// steps were found and the recording saw the job start (else what
/// comes before the first step is not start-up), else the end of the
/// imports of the main and input threads. Bins of those imports (up to
/// the first step) and of the shutdown (found with or without steps) get
/// no cause; nor does a
/// bin in which the workers were saturated only by their own exit.
pub fn set_edges(a: &Analysis, tl: &mut Timeline) {
    let edges = find(a, tl);
    let first_step = a
        .steps
        .intervals
        .first()
        .filter(|_| a.saw_job_start())
        .and_then(|s| tl.bin_of(s.0));
    let imports_end = edges
        .startup_end
        .filter(|_| a.saw_job_start())
        .map(|b| b.min(tl.n));
    if let Some(b) = first_step {
        tl.loop_from = b;
        tl.loop_from_by = LoopFrom::FirstStep;
    } else if let Some(b) = imports_end {
        tl.loop_from = b;
        tl.loop_from_by = LoopFrom::Imports;
    }
    // The imports have no cause with steps found too: the estimates
    // leave out what comes before the first step, and the findings'
    // evidence (how long the loop was busy, its samples) must not count
    // them either (a 10 s MNIST run's training loop read "55% of its
    // samples in the model" with 36% of them its start-up's imports).
    if let Some(b) = imports_end {
        for c in &mut tl.cause[..b.min(tl.loop_from)] {
            *c = None;
        }
        // Nor do their last samples, in the bin after them.
        if b <= tl.loop_from {
            tl.imports_tail = edges.startup_end_t;
        }
    }
    if let Some(b) = edges.shutdown_from {
        tl.shutdown_from = b.max(tl.loop_from).min(tl.n);
        for c in &mut tl.cause[tl.shutdown_from..] {
            *c = None;
        }
        // Nor do its first samples, in the bin before it.
        tl.exit_head = edges
            .shutdown_from_t
            .filter(|(bin, _)| *bin >= tl.loop_from && *bin < tl.shutdown_from);
    }
    for &i in &edges.workers_exiting {
        if tl.cause[i] == Some(Cause::PipelineSaturated) {
            tl.cause[i] = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(class: FrameClass, label: &str, file: &str, eval: bool) -> FrameInfo {
        FrameInfo {
            label: label.into(),
            class,
            name: label.into(),
            file: file.into(),
            eval,
            line: None,
        }
    }

    #[test]
    fn a_workers_start_outlasts_bins_without_its_imports() {
        // [import, no Python, running] per sampled bin. A busy machine: the
        // interpreter starts, imports, a bin without samples (11), one
        // whose only sample is the program's code between two imports (12),
        // more imports, then batches.
        let bins = [
            (10, [0.0, 2.0, 0.0]),
            (11, [3.0, 0.0, 0.0]),
            (12, [0.0, 0.0, 1.0]),
            (14, [2.0, 0.0, 0.0]),
            (15, [3.0, 0.0, 1.0]),
            (16, [0.0, 0.0, 2.0]),
            (17, [0.0, 0.0, 3.0]),
        ];
        assert_eq!(worker_start_end(&bins, usize::MAX), Some(16));
        assert_eq!(worker_start_end(&bins, 13), Some(12));
        // A worker that imports nothing (forked) has no start of its own,
        // nor does one whose interpreter only ever starts.
        let forked = [(3, [0.0, 0.0, 2.0]), (4, [0.0, 0.0, 1.0])];
        assert_eq!(worker_start_end(&forked, usize::MAX), None);
        assert_eq!(worker_start_end(&[(1, [0.0, 3.0, 0.0])], usize::MAX), None);
        // Its interpreter exiting at the end is no start, however long.
        let exits = [
            (1, [2.0, 0.0, 0.0]),
            (2, [0.0, 0.0, 1.0]),
            (9, [0.0, 9.0, 0.0]),
        ];
        assert_eq!(worker_start_end(&exits, usize::MAX), Some(2));
    }

    #[test]
    fn only_the_first_generation_of_workers_starts_the_job() {
        let imports = |from: usize, to: usize| -> Vec<(usize, W)> {
            let mut v: Vec<(usize, W)> = (from..to).map(|i| (i, [3.0, 0.0, 0.0])).collect();
            v.extend((to..to + 5).map(|i| (i, [0.0, 0.0, 2.0])));
            v
        };
        // Two spawned workers, one ready at bin 30, the other at 42.
        let (a, b) = (imports(10, 30), imports(11, 42));
        let gen1 = [&a[..], &b[..]];
        assert_eq!(
            workers_start_end(gen1.iter().copied(), usize::MAX),
            Some(42)
        );
        // Restarted at bin 200: the next generation's imports are no start.
        let c = imports(200, 230);
        let both = [&a[..], &b[..], &c[..]];
        assert_eq!(
            workers_start_end(both.iter().copied(), usize::MAX),
            Some(42)
        );
        // Forked workers, ready at once, and one importing later on.
        let forked: Vec<(usize, W)> = (5..50).map(|i| (i, [0.0, 0.0, 1.0])).collect();
        let late = imports(60, 70);
        let fl = [&forked[..], &late[..]];
        assert_eq!(workers_start_end(fl.iter().copied(), usize::MAX), None);
    }

    #[test]
    fn the_loops_edges_inside_a_bin_are_where_imports_stop_and_the_exit_starts() {
        use Phase::{Import, NoPython, Running};
        let at = |ms: u64, p: Phase| (MonoNs(ms * 1_000_000), 1, p);
        // A bin that starts with the last imports (a stray sample of the
        // program's code among them), then the loop, then a lazy import
        // at its first backward pass.
        let bin = [
            at(1, Import),
            at(2, Running),
            at(3, Import),
            at(4, Import),
            at(5, NoPython),
            at(6, Running),
            at(7, Running),
            at(8, Import),
            at(9, Running),
        ];
        assert_eq!(import_prefix_end(&bin), Some(MonoNs(4_000_001)));
        // A bin that begins with the loop: the start-up ended before it.
        assert_eq!(import_prefix_end(&bin[5..]), None);
        assert_eq!(import_prefix_end(&[]), None);
        // The last bin before the shutdown: the loop, a garbage collection
        // (no Python frame) inside it, then the interpreter exiting.
        let last = [
            at(1, Running),
            at(2, NoPython),
            at(3, Running),
            at(4, Running),
            at(5, NoPython),
            at(6, Running),
            at(7, NoPython),
            at(8, NoPython),
        ];
        assert_eq!(exit_suffix_start(&last), Some(MonoNs(7_000_000)));
        assert_eq!(exit_suffix_start(&last[..7]), Some(MonoNs(7_000_000)));
        assert_eq!(exit_suffix_start(&last[..6]), None);
    }

    #[test]
    fn a_workers_exit_is_its_trailing_interpreter_time() {
        let bins = [
            (1, [4.0, 0.0, 0.0]),
            (5, [0.0, 0.0, 2.0]),
            (6, [0.0, 1.0, 1.0]),
            (7, [0.0, 3.0, 0.0]),
            // An object's `__del__` running Python code while it exits.
            (8, [0.0, 2.0, 1.0]),
            (9, [0.0, 3.0, 0.0]),
        ];
        assert_eq!(worker_exit_from(&bins), Some(7));
        assert_eq!(worker_exit_from(&bins[..2]), None);
    }

    #[test]
    fn unknown_python_frames_tell_no_phase() {
        use crate::analysis::fold::NOT_SAMPLED;
        use crate::vocab::stacks::MARKER_TRUNCATED;
        let start = frame(FrameClass::Runtime, "_start", "python3", false);
        let eval = frame(
            FrameClass::Interpreter,
            "_PyEval_EvalFrameDefault",
            "libpython3.11.so",
            true,
        );
        let main = frame(FrameClass::Python, "main (train.py)", "train.py", false);
        let load = frame(
            FrameClass::Python,
            "_find_and_load (<frozen importlib._bootstrap>)",
            "<frozen importlib._bootstrap>",
            false,
        );
        let cut = frame(FrameClass::Marker, MARKER_TRUNCATED, "", false);
        let unknown = frame(FrameClass::Marker, NOT_SAMPLED, "", false);
        let phase = |fs: &[&FrameInfo]| phase_of_frames(fs.iter().copied());
        assert_eq!(phase(&[&start]), Some(Phase::NoPython));
        assert_eq!(phase(&[&start, &eval, &main]), Some(Phase::Running));
        assert_eq!(phase(&[&start, &eval, &main, &load]), Some(Phase::Import));
        // Frames not known for the instant: an import as likely as not.
        assert_eq!(phase(&[&start, &eval, &unknown]), None);
        assert_eq!(phase(&[&start, &cut, &eval, &main]), None);
        // Known frames inside the import machinery still tell.
        assert_eq!(phase(&[&start, &cut, &eval, &load]), Some(Phase::Import));
        assert_eq!(phase(&[&unknown]), None);
    }
}
