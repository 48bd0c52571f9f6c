//! What the rules need from the GPU and stack analyses: small, stable views
//! so that the rules do not depend on how those analyses are organised.
//!
//! Hook points: [`gpu_from_analysis`] and [`stacks_from_analysis`] build
//! them from the [`Analysis`]. A recording holds GPU data only when the
//! NVML collector ran, and stacks only when perf sampling ran; until then
//! (and on machines without a GPU or with perf refused) they return `None`
//! and the diagnosis says what was not measured.

use crate::analysis::gpu::{phases_of, GpuDeviceAnalysis, IdleSplit, Phases};
use crate::analysis::{Analysis, Series};
use crate::event::MonoNs;

/// Time a group of clock-event ("throttle") reasons was active.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ThrottleEvidence {
    /// Seconds any reason of the group was active.
    pub active_s: f64,
    /// Seconds the group was active while the GPU was busy (a throttled
    /// idle GPU costs nothing).
    pub active_busy_s: f64,
    /// Mean SM clock / max SM clock while active, when clocks were read.
    pub clock_ratio: Option<f64>,
    /// The reasons seen, by NVML name, with their seconds.
    pub reasons: Vec<(String, f64)>,
}

/// One GPU, as far as the diagnosis needs it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuDeviceEvidence {
    pub index: u32,
    pub name: String,
    /// Share of the run the GPU was busy (None when utilization is not
    /// supported, e.g. MIG).
    pub busy_fraction: Option<f64>,
    /// Share of each utilization sample window during which no kernel ran
    /// (1 − utilization): idle time is measured from it.
    pub idle: Series,
    /// Fully idle gaps (start, end) at the driver's sample resolution: the
    /// second view (start-up, checkpoints, evaluation).
    pub idle_gaps: Vec<(MonoNs, MonoNs)>,
    /// The utilization sample period: the resolution of `idle`.
    pub resolution_s: f64,
    /// Where utilization came from, in words ("167 ms driver utilization
    /// samples").
    pub source: String,
    /// Start of the first and end of the last utilization sample window
    /// (NVML opens a little after the recording starts).
    pub sampled: Option<(MonoNs, MonoNs)>,
    /// Processes of the job seen on this GPU.
    pub job_processes: usize,
    /// Their PIDs.
    pub job_pids: Vec<crate::event::Pid>,
    /// Thermal reasons (HW/SW thermal slowdown, HW slowdown).
    pub thermal: ThrottleEvidence,
    /// Power reasons (SW power cap, HW power brake).
    pub power: ThrottleEvidence,
    pub mem_total: Option<u64>,
    pub mem_used_max: Option<u64>,
    /// Best PCIe link (gen, width) seen during the run, and the maximum.
    pub pcie_best: Option<(u32, u32)>,
    pub pcie_max: Option<(u32, u32)>,
}

impl GpuDeviceEvidence {
    /// Start-up, steady state and shutdown of a recording spanning
    /// [start, end) (see [`phases_of`]).
    pub fn phases(&self, start: MonoNs, end: MonoNs) -> Phases {
        phases_of(
            &self.idle_gaps,
            self.sampled,
            (self.resolution_s * 1e9) as u64,
            start,
            end,
        )
    }

    /// Idle seconds (utilization deficit) per phase.
    pub fn idle_split(&self, start: MonoNs, end: MonoNs) -> IdleSplit {
        self.phases(start, end).idle_split(&self.idle)
    }
}

/// The GPU side of a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuEvidence {
    pub devices: Vec<GpuDeviceEvidence>,
    pub driver_version: Option<String>,
    /// CUDA version the driver supports, (major, minor).
    pub driver_cuda: Option<(u32, u32)>,
    /// False when GPU memory was in use but no PID of the job ever
    /// matched the driver's (PID namespace): per-process facts unknown.
    pub attribution_available: bool,
}

impl GpuEvidence {
    /// The GPUs that processes in `pids` used (one rank's view). None when
    /// the driver's PIDs cannot be matched to the job's (then no GPU can be
    /// said to be a rank's) or none of them was on a GPU.
    pub fn for_pids(
        &self,
        pids: &std::collections::BTreeSet<crate::event::Pid>,
    ) -> Option<GpuEvidence> {
        if !self.attribution_available {
            return None;
        }
        let devices: Vec<GpuDeviceEvidence> = self
            .devices
            .iter()
            .filter(|d| d.job_pids.iter().any(|p| pids.contains(p)))
            .cloned()
            .collect();
        (!devices.is_empty()).then(|| GpuEvidence {
            devices,
            ..self.clone()
        })
    }

    /// GPUs the job ran on; all of them when attribution is unavailable.
    pub fn job_devices(&self) -> Vec<&GpuDeviceEvidence> {
        let used: Vec<&GpuDeviceEvidence> = self
            .devices
            .iter()
            .filter(|d| d.job_processes > 0)
            .collect();
        if used.is_empty() && !self.attribution_available {
            self.devices.iter().collect()
        } else {
            used
        }
    }
}

/// The stack side of a run: whether it was sampled, and how completely.
/// What the threads ran in the time of each cause is read from the
/// analysis's samples by the rules themselves (`causes::functions_in`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StackEvidence {
    /// Records the kernel dropped, and samples taken.
    pub lost_records: u64,
    pub total_samples: u64,
}

/// Clock-event ("throttle") reasons that mean "too hot", by NVML name.
pub const THERMAL_REASONS: &[&str] = &["hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown"];
/// Reasons that mean "at the power limit".
pub const POWER_REASONS: &[&str] = &["sw_power_cap", "hw_power_brake_slowdown"];

/// The GPU evidence held by an analysis: None when NVML was not opened or
/// saw no GPU (the diagnosis then says the GPU side was not measured).
pub fn gpu_from_analysis(a: &Analysis) -> Option<GpuEvidence> {
    let g = &a.gpu;
    if !g.available || g.devices.is_empty() {
        return None;
    }
    Some(GpuEvidence {
        devices: g.devices.iter().map(device).collect(),
        driver_version: g.driver_version.clone(),
        driver_cuda: g
            .cuda_driver_version
            .filter(|v| *v > 0)
            .map(|v| ((v / 1000) as u32, ((v % 1000) / 10) as u32)),
        attribution_available: !g.attribution_unavailable,
    })
}

/// Union of sorted-by-start intervals.
fn union(mut v: Vec<(MonoNs, MonoNs)>) -> Vec<(MonoNs, MonoNs)> {
    v.sort();
    let mut out: Vec<(MonoNs, MonoNs)> = Vec::with_capacity(v.len());
    for (a, b) in v {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

fn throttle(d: &GpuDeviceAnalysis, names: &[&str]) -> ThrottleEvidence {
    let uses: Vec<_> = d
        .throttle
        .iter()
        .filter(|t| names.contains(&t.reason.as_str()))
        .collect();
    let runs = union(uses.iter().flat_map(|t| t.runs.iter().copied()).collect());
    let mut ev = ThrottleEvidence {
        reasons: uses.iter().map(|t| (t.reason.clone(), t.seconds)).collect(),
        ..Default::default()
    };
    let (mut clock_sum, mut clock_s) = (0.0, 0.0);
    for (a, b) in &runs {
        let dur = b.secs_since(*a);
        ev.active_s += dur;
        // Busy time inside the run: mean utilization × duration (all of it
        // when utilization is not reported).
        ev.active_busy_s += match d.util.mean_in(*a, *b) {
            Some(u) => dur * u / 100.0,
            None => dur,
        };
        if let Some(mhz) = d.sm_mhz.series.mean_in(*a, *b) {
            clock_sum += mhz * dur;
            clock_s += dur;
        }
    }
    if let Some(max) = d.max_sm_mhz.filter(|m| *m > 0) {
        if clock_s > 0.0 {
            ev.clock_ratio = Some((clock_sum / clock_s / max as f64).min(1.0));
        }
    }
    ev
}

fn device(d: &GpuDeviceAnalysis) -> GpuDeviceEvidence {
    GpuDeviceEvidence {
        index: d.index,
        name: d.name.clone(),
        busy_fraction: d.busy_fraction,
        idle: d.idle.clone(),
        idle_gaps: d.idle_gaps.clone(),
        resolution_s: d.resolution_ns as f64 / 1e9,
        source: d.util_source.describe(d.resolution_ns),
        sampled: d.sampled,
        job_processes: d.processes.iter().filter(|p| p.in_job).count(),
        job_pids: d
            .processes
            .iter()
            .filter(|p| p.in_job)
            .map(|p| p.pid)
            .collect(),
        thermal: throttle(d, THERMAL_REASONS),
        power: throttle(d, POWER_REASONS),
        mem_total: d.mem_total,
        mem_used_max: d.mem_used.max,
        pcie_best: d
            .pcie_gen
            .max
            .zip(d.pcie_width.max)
            .map(|(g, w)| (g as u32, w as u32)),
        pcie_max: d.pcie_max_gen.zip(d.pcie_max_width),
    }
}

/// Is a merged frame name a Python function (`name (file.py)`)?
pub(super) fn is_python_frame(name: &str) -> bool {
    name.ends_with(".py)") || name.ends_with(".pyx)")
}

/// The stack evidence held by an analysis: None when no stack was sampled.
pub fn stacks_from_analysis(a: &Analysis) -> Option<StackEvidence> {
    let s = &a.stacks;
    (!s.samples.is_empty()).then_some(StackEvidence {
        lost_records: s.report.lost_records,
        total_samples: s.report.samples,
    })
}
