//! Every second of GPU idle time accounted for. After the findings, the
//! steady-state idle time of each scope's GPUs (the whole job, or one rank)
//! is split into what the findings explain — the idle time in the bins of
//! their causes — and the rest. When the findings explain less than
//! [`th::EXPLAINED_IDLE_SHARE`] of it and the rest is worth reporting, a
//! `gpu-idle-unexplained` finding says how much is left and what each
//! role's CPU did meanwhile, so that a GPU left idle is never met with
//! silence.

use std::collections::BTreeSet;

use crate::analysis::{Analysis, Role};
use crate::event::Pid;
use crate::units::pct;

use super::causes::{functions_in, functions_text};
use super::measure::{idle_measure_text, measured_devices, Scope};
use super::rule::CauseRule;
use super::thresholds as th;
use super::timeline::{Cause, Timeline};
use super::{Basis, Finding, FindingKind, GpuTime, Severity};

/// The findings that explain the idle time in the bins of a cause.
fn kinds_of(c: Cause) -> &'static [FindingKind] {
    match c {
        Cause::MemoryPressure => &[FindingKind::HostMemoryPressure],
        Cause::CpuLimited => &[FindingKind::CpuLimit],
        Cause::WorkerRestart => &[FindingKind::WorkerRestarts],
        Cause::Io => &[FindingKind::IoBound],
        Cause::WriteStall => &[FindingKind::WriteStall],
        Cause::MainPreprocessing => &[FindingKind::MainProcessPreprocessing],
        Cause::Oversubscribed => &[FindingKind::CpuOversubscribed],
        Cause::PipelineSaturated => &[FindingKind::TooFewWorkers, FindingKind::InputPipelineBound],
        Cause::TrainingLoop => &[FindingKind::TrainingLoop],
        Cause::Compiling => &[FindingKind::Compilation],
    }
}

/// Per bin, the weighted mean of `v` (NaN skipped) with `w` as weights.
fn weighted_mean(v: &[f32], w: &[f32]) -> Option<f64> {
    let (mut sum, mut tot) = (0.0, 0.0);
    for (x, w) in v.iter().zip(w) {
        if !x.is_nan() && *w > 0.0 {
            sum += *x as f64 * *w as f64;
            tot += *w as f64;
        }
    }
    (tot > 0.0).then(|| sum / tot)
}

/// Evidence lines of what the CPU side did during the unexplained idle
/// time (`left`: its seconds per bin), each bin weighted by the idle time
/// it holds: the main thread's and the workers' states, the machine's
/// CPUs, and the functions the main process and the workers ran.
fn during_unexplained(a: &Analysis, tl: &Timeline, left: &[f32], ev: &mut Vec<String>) {
    let mut during = Vec::new();
    if let (Some(r), Some(c)) = (
        weighted_mean(&tl.main_r, left),
        weighted_mean(&tl.main_cpu, left),
    ) {
        let d = weighted_mean(&tl.main_d, left).unwrap_or(0.0);
        during.push(format!(
            "the main thread was running or waiting for a CPU {} of the time and blocked on IO {} (using {} of a core)",
            pct(r),
            pct(d),
            pct(c)
        ));
    }
    if !tl.workers.is_empty() {
        if let Some(r) = weighted_mean(&tl.workers_r, left) {
            let d = weighted_mean(&tl.input_d, left).unwrap_or(0.0);
            during.push(format!(
                "the input workers were running {} and blocked on IO {} of the time",
                pct(r),
                pct(d)
            ));
        }
    }
    if let Some(b) = weighted_mean(&tl.sys_busy, left) {
        during.push(format!("the machine's CPUs were {} busy", pct(b)));
    }
    if !during.is_empty() {
        ev.push(format!(
            "During the unexplained idle time {}.",
            during.join("; ")
        ));
    }
    let in_left = |i: usize| left[i] > 0.0;
    let mains: BTreeSet<Pid> = tl.mains.iter().map(|t| t.pid).collect();
    let workers: BTreeSet<Pid> = tl.workers.iter().map(|t| t.pid).collect();
    for (role, pids) in [(Role::Main, &mains), (Role::Worker, &workers)] {
        let fs = functions_in(a, tl, pids, in_left, 3);
        if !fs.is_empty() {
            ev.push(format!(
                "The {} ran then (stack samples weighted by how idle the GPU was): {}.",
                if role == Role::Main {
                    "main process"
                } else {
                    "workers"
                },
                functions_text(&fs)
            ));
        }
    }
}

/// The unexplained-idle finding of one scope, given every finding made so
/// far (the scope's own and the whole job's).
pub(super) fn unexplained(a: &Analysis, sc: &Scope, findings: &[Finding]) -> Option<Finding> {
    let tl: &Timeline = &sc.tl;
    let devs = measured_devices(sc.gpu.as_ref());
    let dur = a.duration_s();
    if devs.is_empty() || dur <= 0.0 {
        return None;
    }
    let reported: BTreeSet<FindingKind> = findings
        .iter()
        .filter(|f| f.rank.is_none() || f.rank == sc.rank)
        .map(|f| f.kind)
        .collect();
    let explained_cause =
        |c: Option<Cause>| c.is_some_and(|c| kinds_of(c).iter().any(|k| reported.contains(k)));
    // Idle seconds per bin that no reported finding explains, over the
    // scope's GPUs; and the totals.
    let mut left = vec![0.0f32; tl.n];
    let (mut total, mut explained) = (0.0, 0.0);
    let mut by_kind: Vec<(FindingKind, f64)> = Vec::new();
    let mut lines = Vec::new();
    let mut busy = Vec::new();
    for d in &devs {
        let Some(w) = d.phases(a.start, a.end).steady else {
            continue;
        };
        let per_bin = tl.idle_per_bin(&d.idle, w);
        let (mut dt, mut de) = (0.0, 0.0);
        for (i, v) in per_bin.iter().enumerate() {
            let v = *v as f64;
            dt += v;
            if explained_cause(tl.cause[i]) {
                de += v;
                let k = kinds_of(tl.cause[i].expect("explained bins have a cause"))
                    .iter()
                    .find(|k| reported.contains(k))
                    .copied()
                    .expect("an explained cause has a reported kind");
                match by_kind.iter_mut().find(|x| x.0 == k) {
                    Some(x) => x.1 += v,
                    None => by_kind.push((k, v)),
                }
            } else {
                left[i] += v as f32;
            }
        }
        total += dt;
        explained += de;
        busy.extend(d.busy_fraction);
        let sampled = w.1.secs_since(w.0);
        lines.push(format!(
            "GPU {} was idle {dt:.1} s between its first and last work ({} of that time; {}); the findings account for {de:.1} s of it ({}).",
            d.index,
            pct(dt / sampled.max(1e-9)),
            idle_measure_text(d),
            pct(de / dt.max(1e-9))
        ));
    }
    let rest = total - explained;
    if total < th::MIN_SHARE * dur
        || explained >= th::EXPLAINED_IDLE_SHARE * total
        || rest < th::MIN_SHARE * dur
    {
        return None;
    }
    let mut ev = lines;
    if !by_kind.is_empty() {
        by_kind.sort_by(|x, y| y.1.total_cmp(&x.1));
        ev.push(format!(
            "Explained: {}.",
            by_kind
                .iter()
                .map(|(k, s)| format!("{k} {s:.1} s"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    during_unexplained(a, tl, &left, &mut ev);
    if findings
        .iter()
        .any(|f| f.kind == FindingKind::StragglerRank && f.rank != sc.rank)
    {
        ev.push("Another rank is a straggler (see straggler-rank): this rank's GPU may have waited for it.".into());
    }
    let n = devs.len().max(1) as f64;
    let share = (rest / (dur * n)).min(1.0);
    let mean_busy = busy.iter().sum::<f64>() / busy.len().max(1) as f64;
    // A GPU busy most of the time is the bottleneck: its remaining idle time
    // (per-step launch and synchronisation overhead) is worth a note.
    let severity = if mean_busy >= th::GPU_BOUND_BUSY_SHARE {
        Severity::Info
    } else {
        Severity::from_share(share)
    };
    Some(CauseRule {
        kind: FindingKind::GpuIdleUnexplained,
        severity,
        title: format!(
            "{rest:.1} s of GPU idle time ({} of the run) has no cause gpuprof recognises",
            pct(share)
        ),
        gpu_time: Some(GpuTime {
            seconds: rest,
            share,
            basis: Basis::Measured,
            method: "steady-state GPU idle time (utilization deficit) outside the bins of every reported finding's cause".into(),
        }),
        evidence: ev,
        fix: "Look at what ran while the GPU waited: flame-gpu-idle.svg, and the trace's `idle %` track beside the threads. Causes gpuprof does not detect: synchronisation inside the loop (`.item()`, `.cpu()`, `torch.cuda.synchronize()`) while the CPU has little to do, many small kernels (launch-bound: `torch.compile`, CUDA graphs, larger batches), host-to-device copies from pageable memory (`pin_memory=True` with `non_blocking=True`), waits for other ranks, evaluation or logging phases between epochs.".into(),
    }.finding_of(sc.rank))
}
