//! Time the training loop spent compiling (torch.compile): the intervals
//! in which the main threads' stack samples, and the wall-clock sampler's
//! looks at them while they were blocked (waiting for the C++ compiler or
//! the compile workers), were mostly inside the framework's compiler
//! ([`crate::vocab::stacks::is_compile_frame`]). Those intervals get their
//! own cause: a main thread tracing and compiling is neither the loop's
//! host work nor batch preparation, the input workers have nothing to do
//! with it, and the fix is another (caches, fewer recompilations).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::analysis::{Analysis, Role};
use crate::event::{MonoNs, Pid, Tid};
use crate::units::{pct, plural};

use super::causes::{functions_in, functions_text, pids_of};
use super::evidence::GpuEvidence;
use super::measure::{
    gpu_gap_lines, gpu_time, idle_measure_text, idle_of, measured, measured_devices,
};
use super::rule::CauseRule;
use super::thresholds as th;
use super::timeline::{Cause, LoopFrom, Timeline};
use super::{Finding, FindingKind, GpuTime};

/// Least share of an interval's observations of the main threads inside
/// the compiler for the interval to be compiling.
const COMPILING_SHARE: f64 = 0.5;

/// Least observations (recorded samples and looks) of the main threads in
/// an interval for it to be told compiling: one stray sample is not.
const MIN_OBSERVATIONS: u64 = 2;

/// Compiling intervals less than this apart are one stretch: the forward
/// graph's compile, its first run, the backward graph's compile.
const STRETCH_GAP_S: f64 = 1.0;

/// Per bin, the main threads' observations and those inside the compiler.
fn observations(a: &Analysis, tl: &Timeline) -> (Vec<u64>, Vec<u64>) {
    let mains: BTreeSet<(Pid, Tid)> = tl.mains.iter().map(|t| (t.pid, t.tid)).collect();
    let (mut all, mut comp) = (vec![0u64; tl.n], vec![0u64; tl.n]);
    let st = &a.stacks;
    let mut by_stack: HashMap<u32, bool> = HashMap::new();
    for s in st.samples.iter().chain(&st.python_only) {
        if !mains.contains(&(s.pid, s.tid)) {
            continue;
        }
        let Some(i) = tl.bin_of(s.t) else { continue };
        let c = *by_stack
            .entry(s.stack)
            .or_insert_with(|| st.stack_frames(s.stack).any(|f| f.compiles()));
        all[i] += s.weight as u64;
        if c {
            comp[i] += s.weight as u64;
        }
    }
    for l in &a.compile_looks {
        if !mains.contains(&(l.pid, l.tid)) {
            continue;
        }
        let Some(i) = tl.bin_of(l.t) else { continue };
        all[i] += l.weight as u64;
        if l.compiling {
            comp[i] += l.weight as u64;
        }
    }
    (all, comp)
}

/// Give the compiling intervals their cause, whatever the CPU-side
/// figures said of them (before the shutdown; the start-up's imports are
/// not compiling).
pub fn mark(a: &Analysis, tl: &mut Timeline) {
    let (all, comp) = observations(a, tl);
    let mut first = None;
    for i in 0..tl.shutdown_from.min(tl.n) {
        if comp[i] >= MIN_OBSERVATIONS && comp[i] as f64 >= COMPILING_SHARE * all[i] as f64 {
            tl.cause[i] = Some(Cause::Compiling);
            first.get_or_insert(i);
        }
    }
    // The loop has begun by its first compile: the compiler's own lazy
    // imports made a start-up told by imports alone run on into it.
    if let Some(f) = first {
        if tl.loop_from_by == LoopFrom::Imports && f < tl.loop_from {
            tl.loop_from = f;
            tl.imports_tail = None;
        }
    }
}

/// Stretches of compiling: (start, end, seconds of compiling bins).
fn stretches(tl: &Timeline) -> Vec<(MonoNs, MonoNs, f64)> {
    let gap_ns = (STRETCH_GAP_S * 1e9) as u64;
    let mut out: Vec<(MonoNs, MonoNs, f64)> = Vec::new();
    for (a, b) in tl.spans(Cause::Compiling) {
        let s = b.secs_since(a);
        match out.last_mut() {
            Some(last) if a.0 <= last.1 .0 + gap_ns => {
                last.1 = b;
                last.2 += s;
            }
            _ => out.push((a, b, s)),
        }
    }
    out
}

/// Processes other than the main ones that the job started while it
/// compiled (the C++ compiler, the assembler, load probes): "cc1plus ×14,
/// python ×3 (9.8 CPU-s)".
fn helpers_text(a: &Analysis, tl: &Timeline, spans: &[(MonoNs, MonoNs, f64)]) -> Option<String> {
    let mains = pids_of(&tl.mains);
    let mut by_comm: BTreeMap<&str, (usize, f64)> = BTreeMap::new();
    for p in a.processes.values() {
        if mains.contains(&p.pid) || p.role == Role::Launcher {
            continue;
        }
        if !spans
            .iter()
            .any(|(s, e, _)| p.first_seen >= *s && p.first_seen <= *e)
        {
            continue;
        }
        let e = by_comm.entry(p.comm.as_str()).or_default();
        e.0 += 1;
        e.1 += p.cpu_s();
    }
    if by_comm.is_empty() {
        return None;
    }
    let cpu: f64 = by_comm.values().map(|v| v.1).sum();
    let n: usize = by_comm.values().map(|v| v.0).sum();
    let mut v: Vec<(&str, (usize, f64))> = by_comm.into_iter().collect();
    v.sort_by(|x, y| y.1 .1.total_cmp(&x.1 .1).then(y.1 .0.cmp(&x.1 .0)));
    let names: Vec<String> = v
        .iter()
        .take(4)
        .map(|(c, (k, _))| format!("`{c}` ×{k}"))
        .collect();
    Some(format!(
        "Meanwhile the job started {} ({}{}), which used {cpu:.1} CPU-s.",
        plural(n, "other process"),
        names.join(", "),
        if v.len() > 4 { ", …" } else { "" }
    ))
}

/// The compilation finding: the training loop compiling instead of
/// running, first compile and later ones.
pub(super) fn compilation(
    a: &Analysis,
    tl: &Timeline,
    gpu: Option<&GpuEvidence>,
) -> Option<Finding> {
    let dur = a.duration_s();
    let comp_s = tl.cause_s(Cause::Compiling);
    if dur <= 0.0 || comp_s < th::MIN_SHARE * dur {
        return None;
    }
    let main = tl.mains.iter().max_by(|x, y| x.cpu_s.total_cmp(&y.cpu_s))?;
    let spans = stretches(tl);
    let at = |t: MonoNs| t.secs_since(a.start);
    let mut ev = vec![format!(
        "For {comp_s:.1} s ({} of the run) the main thread `{}` (pid {}) was compiling: most of its stack samples, and of the wall-clock looks at it while it was blocked, were inside torch.compile's compiler (TorchDynamo's `convert_frame`, Inductor's `compile_fx`).",
        pct(comp_s / dur),
        main.name,
        main.pid
    )];
    let later_s: f64 = spans.iter().skip(1).map(|s| s.2).sum();
    if let Some(first) = spans.first() {
        ev.push(if spans.len() == 1 {
            format!(
                "In one stretch, from {:.1} s to {:.1} s into the run (compiling intervals less than 1 s apart make one stretch, which can hold several compiles: the forward and backward graphs, an evaluation function's); none came after it.",
                at(first.0),
                at(first.1)
            )
        } else {
            format!(
                "In {} stretches: the first {:.1} s, from {:.1} s into the run; {} more {later_s:.1} s in all, the last from {:.1} s — recompilations (a guard failed: a new input shape, a changed Python value, train/eval mode) or first compiles of other code.",
                spans.len(),
                first.2,
                at(first.0),
                plural(spans.len() - 1, "later one"),
                at(spans[spans.len() - 1].0)
            )
        });
    }
    ev.extend(helpers_text(a, tl, &spans));
    let fs = functions_in(
        a,
        tl,
        &pids_of(&tl.mains),
        |i| tl.cause[i] == Some(Cause::Compiling),
        3,
    );
    if !fs.is_empty() {
        ev.push(format!(
            "What the main process ran then (stack samples): {}.",
            functions_text(&fs)
        ));
    }
    ev.extend(gpu_gap_lines(
        a,
        tl,
        gpu,
        Cause::Compiling,
        "the loop was compiling",
    ));
    let gt = compile_gpu_time(a, tl, gpu, comp_s);
    if gt.share < th::MIN_SHARE {
        return None;
    }
    let recompiles = spans.len() > 1 && later_s >= 0.25 * comp_s;
    let title = format!(
        "The training loop spent {} of the run compiling the model (torch.compile): {comp_s:.1} s{}",
        pct(comp_s / dur),
        if spans.len() > 1 {
            format!(
                ", {later_s:.1} s of it after the first compile ({})",
                plural(spans.len() - 1, "later stretch")
            )
        } else {
            String::new()
        }
    );
    let caches = "The first compile is paid at each start of the process unless its caches survive: Inductor keeps them in `TORCHINDUCTOR_CACHE_DIR` (by default under /tmp, lost with a fresh container): point it at a persistent disk, or carry them with `torch.compiler.save_cache_artifacts()` / `load_cache_artifacts()`; `mode=\"max-autotune\"` compiles far longer than the default mode. While iterating on short runs, `TORCH_COMPILE_DISABLE=1` runs the model eagerly.";
    let fix = if recompiles {
        format!("Find what recompiles: run with `TORCH_LOGS=recompiles` (each recompile prints the guard that failed). A varying dimension: mark it dynamic (`torch._dynamo.mark_dynamic(x, 0)`) or compile with `dynamic=True`; varying batch sizes: `drop_last=True` or pad to a few fixed sizes; a Python number that changes (a learning rate, a step counter) passed into the compiled function: pass it as a tensor. {caches}")
    } else {
        caches.to_string()
    };
    Some(CauseRule::costing(FindingKind::Compilation, gt, title, ev, fix).finding())
}

/// The GPU time of the compiling intervals: every one counts, the first
/// compile before the first step (and before a GPU's first work) too —
/// the loop runs nothing while it compiles, whereas the other causes'
/// measured idle time leaves out the GPU's start-up.
fn compile_gpu_time(
    a: &Analysis,
    tl: &Timeline,
    gpu: Option<&GpuEvidence>,
    comp_s: f64,
) -> GpuTime {
    let devs = measured_devices(gpu);
    if devs.is_empty() {
        return gpu_time(
            a,
            tl,
            gpu,
            Cause::Compiling,
            comp_s,
            "the time the main thread was compiling: the training loop runs no step meanwhile",
        );
    }
    let secs: f64 = devs
        .iter()
        .map(|d| {
            idle_of(
                &tl.idle_by_cause(&d.idle, (a.start, a.end)),
                Some(Cause::Compiling),
            )
        })
        .sum();
    measured(
        a,
        &devs,
        secs,
        format!(
            "GPU idle time while the loop was compiling ({}; the first compile included, before the GPU's first work too)",
            idle_measure_text(devs[0])
        ),
    )
}
