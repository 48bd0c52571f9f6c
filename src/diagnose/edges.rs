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
use crate::analysis::stacks::{FrameInfo, Stacks};
use crate::analysis::Analysis;
use crate::event::{Pid, Tid};

use super::timeline::{LoopFrom, Timeline};

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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Edges {
    /// First bin after start-up: in every sampled bin before it, the main
    /// and input threads imported (or had not begun Python code) in most
    /// of their samples, or the input workers imported in most of theirs;
    /// and they imported in at least one.
    pub startup_end: Option<usize>,
    /// First bin of shutdown: in every sampled bin from it on, the main
    /// and input threads ran no Python code in most of their samples.
    pub shutdown_from: Option<usize>,
}

/// Is this the file of the import machinery (`<frozen
/// importlib._bootstrap>`, or its source when not frozen)?
fn is_import_file(file: &str) -> bool {
    let f = file.trim_start_matches("<frozen ").trim_end_matches('>');
    f == "importlib._bootstrap"
        || f == "importlib._bootstrap_external"
        || f.ends_with("importlib/_bootstrap.py")
        || f.ends_with("importlib/_bootstrap_external.py")
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
                import |= is_import_file(&f.file);
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

/// Sample weight per bin and phase: [import, no Python, running].
type Weights = Vec<[f64; 3]>;

/// The weights of the main and input threads together, and of the input
/// workers' threads alone.
fn weights(a: &Analysis, tl: &Timeline) -> (Weights, Weights) {
    let threads: BTreeSet<(Pid, Tid)> = tl
        .mains
        .iter()
        .chain(&tl.workers)
        .map(|t| (t.pid, t.tid))
        .collect();
    let workers: BTreeSet<(Pid, Tid)> = tl.workers.iter().map(|t| (t.pid, t.tid)).collect();
    let st = &a.stacks;
    // One look at each distinct stack, however many samples share it.
    let mut phases: HashMap<u32, Option<Phase>> = HashMap::new();
    let mut phase = |id: u32| *phases.entry(id).or_insert_with(|| phase_of(st, id));
    let mut w = vec![[0.0; 3]; tl.n];
    let mut ww = vec![[0.0; 3]; tl.n];
    // Samples are sorted by (pid, tid, t): one run per thread.
    for run in st.samples.chunk_by(|x, y| (x.pid, x.tid) == (y.pid, y.tid)) {
        if !threads.contains(&(run[0].pid, run[0].tid)) {
            continue;
        }
        // A thread that never ran Python code (a shell's, a launcher's in
        // C) has no interpreter to start or stop.
        if run
            .iter()
            .all(|s| matches!(phase(s.stack), None | Some(Phase::NoPython)))
        {
            continue;
        }
        let worker = workers.contains(&(run[0].pid, run[0].tid));
        for s in run {
            if let (Some(i), Some(p)) = (tl.bin_of(s.t), phase(s.stack)) {
                w[i][p as usize] += s.weight as f64;
                if worker {
                    ww[i][p as usize] += s.weight as f64;
                }
            }
        }
    }
    (w, ww)
}

/// The start-up and shutdown of the timeline's main and input threads.
pub fn find(a: &Analysis, tl: &Timeline) -> Edges {
    if tl.mains.is_empty() || a.stacks.samples.is_empty() {
        return Edges::default();
    }
    let (w, workers) = weights(a, tl);
    let sampled = |b: &[f64; 3]| b.iter().sum::<f64>() > 0.0;
    // Shutdown first: the interpreter running no Python code at the end is
    // shutdown even when the run was all start-up before it.
    let mut shutdown_from = None;
    for (i, b) in w.iter().enumerate().rev().filter(|(_, b)| sampled(b)) {
        if b[1] <= b[0] + b[2] {
            break;
        }
        shutdown_from = Some(i);
    }
    let (mut last_startup, mut imported) = (None, false);
    for (i, b) in w
        .iter()
        .enumerate()
        .take(shutdown_from.unwrap_or(w.len()))
        .filter(|(_, b)| sampled(b))
    {
        // Start-up lasts while the threads mostly import, or while the
        // input workers still do: the first worker ready makes batches and
        // the loop runs on them while a slower one (on a busy machine, a
        // spawned worker importing PyTorch takes seconds longer) is still
        // importing, and the loop's wait for that one is its start-up.
        let wk = &workers[i];
        if b[0] + b[1] <= b[2] && wk[0] <= wk[2] {
            break;
        }
        imported |= b[0] > 0.0;
        last_startup = Some(i);
    }
    let startup_end = last_startup.filter(|_| imported).map(|i| i + 1);
    Edges {
        startup_end,
        shutdown_from,
    }
}

/// Where the loop begins and the shutdown starts: the first step when
/// steps were found and the recording saw the job start (else what
/// comes before the first step is not start-up), else the end of the
/// imports of the main and input threads. Bins of those imports and of
/// the shutdown (found with or without steps) get no cause.
pub fn set_edges(a: &Analysis, tl: &mut Timeline) {
    let edges = find(a, tl);
    let first_step = a
        .steps
        .intervals
        .first()
        .filter(|_| a.saw_job_start())
        .and_then(|s| tl.bin_of(s.0));
    if let Some(b) = first_step {
        tl.loop_from = b;
        tl.loop_from_by = LoopFrom::FirstStep;
    } else if let Some(b) = edges.startup_end.filter(|_| a.saw_job_start()) {
        tl.loop_from = b.min(tl.n);
        tl.loop_from_by = LoopFrom::Imports;
        for c in &mut tl.cause[..tl.loop_from] {
            *c = None;
        }
    }
    if let Some(b) = edges.shutdown_from {
        tl.shutdown_from = b.max(tl.loop_from).min(tl.n);
        for c in &mut tl.cause[tl.shutdown_from..] {
            *c = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_files_are_the_import_machinery_only() {
        assert!(is_import_file("<frozen importlib._bootstrap>"));
        assert!(is_import_file("<frozen importlib._bootstrap_external>"));
        assert!(is_import_file("/usr/lib/python3.9/importlib/_bootstrap.py"));
        assert!(!is_import_file("/usr/lib/python3.11/importlib/__init__.py"));
        assert!(!is_import_file("torch/__init__.py"));
        assert!(!is_import_file("my_bootstrap.py"));
    }

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
