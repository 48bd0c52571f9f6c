//! What the rules share: a rule's scope, the measured GPUs, and the GPU
//! time and gap lines of a cause. Below `rules`, `causes`, `accounting`
//! and `support`, which all take these.

use crate::analysis::Analysis;
use crate::units::pct;

use super::evidence::{GpuDeviceEvidence, GpuEvidence};
use super::timeline::{Cause, Timeline};
use super::{Basis, GpuTime};

/// What the input-side rules look at: the whole job, or one rank of it.
/// A job with several ranks is diagnosed rank by rank, so that one rank's
/// saturated workers are never reported as the whole job's.
pub struct Scope {
    /// None: the whole job (it has fewer than two ranks).
    pub rank: Option<u32>,
    pub tl: Timeline,
    /// The GPUs this scope's processes used.
    pub gpu: Option<GpuEvidence>,
}

/// The GPU devices whose idle gaps count, when GPU time was measured.
pub(super) fn measured_devices(gpu: Option<&GpuEvidence>) -> Vec<&GpuDeviceEvidence> {
    gpu.map(|g| {
        g.job_devices()
            .into_iter()
            .filter(|d| d.busy_fraction.is_some())
            .collect()
    })
    .unwrap_or_default()
}

/// Steady-state idle seconds (utilization deficit; start-up and shutdown
/// left out) of one measured GPU, by the cause of the bins they fell in.
pub(super) fn device_idle_by_cause(
    a: &Analysis,
    tl: &Timeline,
    d: &GpuDeviceEvidence,
) -> Vec<(Option<Cause>, f64)> {
    match d.phases(a.start, a.end).steady {
        Some(w) => tl.idle_by_cause(&d.idle, w),
        None => Vec::new(),
    }
}

pub(super) fn idle_of(by_cause: &[(Option<Cause>, f64)], cause: Option<Cause>) -> f64 {
    by_cause
        .iter()
        .filter(|(c, _)| *c == cause)
        .map(|(_, s)| s)
        .sum()
}

/// "utilization deficit: each of the 167 ms driver utilization samples
/// counts (1 − utilization) of its window as idle".
pub(super) fn idle_measure_text(d: &GpuDeviceEvidence) -> String {
    let source = if d.source.is_empty() {
        format!("{:.0} ms driver utilization samples", d.resolution_s * 1e3)
    } else {
        d.source.clone()
    };
    format!(
        "utilization deficit: each of the {source} counts (1 − utilization) of its window as idle"
    )
}

/// GPU time explained by the bins of `cause`: the measured GPUs' idle
/// time (utilization deficit) inside them, else `estimate` seconds
/// described by `method`.
pub(super) fn gpu_time(
    a: &Analysis,
    tl: &Timeline,
    gpu: Option<&GpuEvidence>,
    cause: Cause,
    estimate: f64,
    method: &str,
) -> GpuTime {
    let dur = a.duration_s().max(1e-9);
    let devs = measured_devices(gpu);
    if devs.is_empty() {
        let method = format!("{method}{}", tl.edges_left_out());
        return GpuTime {
            seconds: estimate,
            share: (estimate / dur).min(1.0),
            basis: Basis::Estimated,
            method,
        };
    }
    let secs: f64 = devs
        .iter()
        .map(|d| idle_of(&device_idle_by_cause(a, tl, d), Some(cause)))
        .sum();
    measured(
        a,
        &devs,
        secs,
        format!(
            "GPU idle time while this cause was active ({}; start-up and shutdown left out)",
            idle_measure_text(devs[0])
        ),
    )
}

/// `secs` of measured idle time over `devs` as a finding's GPU time.
pub(super) fn measured(
    a: &Analysis,
    devs: &[&GpuDeviceEvidence],
    secs: f64,
    method: String,
) -> GpuTime {
    let dur = a.duration_s().max(1e-9);
    GpuTime {
        seconds: secs,
        share: (secs / (dur * devs.len().max(1) as f64)).min(1.0),
        basis: Basis::Measured,
        method,
    }
}

/// "GPU 0 idle 68% of its sampled time (4.1 s …); 3.9 s of that idle time fell while …".
pub(super) fn gpu_gap_lines(
    a: &Analysis,
    tl: &Timeline,
    gpu: Option<&GpuEvidence>,
    cause: Cause,
    while_: &str,
) -> Vec<String> {
    let mut out = Vec::new();
    for d in measured_devices(gpu) {
        let split = d.idle_split(a.start, a.end);
        let in_cause = idle_of(&device_idle_by_cause(a, tl, d), Some(cause));
        let gaps: f64 = d.idle_gaps.iter().map(|(x, y)| y.secs_since(*x)).sum();
        out.push(format!(
            "GPU {} idle {} of its sampled time: {:.1} s ({}), {:.1} s of it in {} fully idle {}; {:.1} s of the steady-state idle time fell while {while_}.",
            d.index,
            pct(1.0 - d.busy_fraction.unwrap_or(0.0)),
            split.total_s,
            idle_measure_text(d),
            gaps,
            d.idle_gaps.len(),
            if d.idle_gaps.len() == 1 { "gap" } else { "gaps" },
            in_cause
        ));
    }
    out
}

/// Most worker processes alive at once (workers restarted per epoch are
/// not counted twice).
pub(super) fn concurrent_workers(tl: &Timeline) -> usize {
    (0..tl.n)
        .map(|i| tl.workers_alive[i])
        .fold(0.0f32, f32::max)
        .round()
        .max(if tl.workers.is_empty() { 0.0 } else { 1.0 }) as usize
}
