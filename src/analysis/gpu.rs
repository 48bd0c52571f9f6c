//! GPU analysis: pure functions over the recorded GPU events, computed in
//! one streaming pass with bounded memory (counters are bounded `Series`,
//! idle gaps and clock-event runs are capped), so a day-long run on eight
//! GPUs costs the same memory as a short one.
//!
//! - Utilization samples (NVML's µs Unix timestamps) are mapped onto the
//!   monotonic axis with the header's anchor pair. Each sample covers the
//!   driver's sample period before its timestamp; the period (the median
//!   spacing of the first samples) is the stated resolution of everything
//!   below.
//! - **Idle time is the utilization deficit**: a sample of u% says no
//!   kernel ran for (1 − u/100) of its period, so the GPU's idle seconds
//!   are Σ (1 − u/100) × period. This is exact over any span of whole
//!   samples, whatever the length of the job's steps: at the real driver
//!   period (1/6 s) a job with 30 ms steps and 40 ms waits never produces
//!   a fully idle sample, yet every sample shows its 57% deficit. Within a
//!   sample the idle share is spread evenly ([`GpuDeviceAnalysis::idle`]),
//!   which is what attributing idle time to shorter spans (the diagnosis'
//!   bins, a CPU stack sample's instant) assumes.
//! - An idle gap is a run of consecutive samples at or below the threshold
//!   (default 5%): the second view, for long stalls (start-up, checkpoints,
//!   evaluation). Its edges are placed inside the neighbouring, partly busy
//!   samples by their utilization — exact when such a sample holds one
//!   busy/idle transition, off by less than one period otherwise. A run
//!   with no fully idle sample is shorter than the resolution and is not
//!   claimed as a gap (its idle time is still counted by the deficit).
//! - NVML PIDs are matched against every process of the job's tree. If
//!   processes hold GPU memory but none of them is the job's, attribution is
//!   reported unavailable (PID namespace?) rather than guessed.

use std::collections::{BTreeMap, BTreeSet};

use super::series::Series;
use crate::event::{Event, GpuContext, GpuIndex, GpuProc, GpuState, Header, MonoNs, Pid};

/// Default idle threshold: a sample at or below this utilization is idle.
pub const DEFAULT_IDLE_THRESHOLD_PCT: f64 = 5.0;

/// Assumed sample period when a GPU reported fewer than two samples
/// (the common driver period, 1/6 s).
const DEFAULT_PERIOD_NS: u64 = 166_666_667;

/// Clock-event ("throttle") reason bits of nvml.h, by name.
pub const THROTTLE_REASONS: &[(u64, &str)] = &[
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

/// The reason bits of `names` (names of [`THROTTLE_REASONS`]).
pub fn throttle_mask(names: &[&str]) -> u64 {
    THROTTLE_REASONS
        .iter()
        .filter(|(_, n)| names.contains(n))
        .fold(0, |m, (bit, _)| m | bit)
}

/// Names of the reason bits set in `bits` (unknown bits as hex).
pub fn throttle_names(bits: u64) -> Vec<String> {
    let mut out = Vec::new();
    let mut known = 0;
    for &(bit, name) in THROTTLE_REASONS {
        known |= bit;
        if bits & bit != 0 {
            out.push(name.to_string());
        }
    }
    if bits & !known != 0 {
        out.push(format!("0x{:x}", bits & !known));
    }
    out
}

/// At most this many idle gaps (and clock-event runs per reason) are kept
/// per GPU as intervals; the statistics count every one.
pub const MAX_INTERVALS: usize = 100_000;

/// Points kept of a GPU's idle-share series: finer than the diagnosis'
/// bins (at most 20 000 per run) on any run length — 2^16 driver samples
/// are 3 h at 1/6 s before neighbours are merged. 1.5 MB per GPU.
pub const IDLE_SERIES_CAP: usize = 1 << 16;

/// Samples buffered to estimate the driver's sample period before the
/// rest are processed as they come.
const PERIOD_PROBE: usize = 32;

/// One utilization sample (or GPM window) as a window on the monotonic
/// axis: the percent of it during which a kernel ran.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UtilWindow {
    pub start: MonoNs,
    pub end: MonoNs,
    pub pct: f64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct GapStats {
    pub count: usize,
    pub total_s: f64,
    pub median_s: f64,
    pub max_s: f64,
}

/// A process seen on a GPU.
#[derive(Clone, Debug)]
pub struct GpuProcUse {
    pub pid: Pid,
    /// A process of the job's tree.
    pub in_job: bool,
    pub ctx: GpuContext,
    pub first_seen: MonoNs,
    /// When it left the GPU (missing from a process list), or the end of
    /// the recording if it never did.
    pub last_seen: MonoNs,
    pub mem_max: Option<u64>,
    /// GPU memory (bytes) over time, from the process lists.
    pub mem: Series,
    /// Per-process SM utilization (%) over time, from the driver's samples
    /// (each value holds until the next).
    pub sm: Series,
    /// Time-weighted mean SM utilization until the process was last seen.
    pub sm_mean: Option<f64>,
    /// Seconds covered by the per-process samples (their first to the
    /// process's last sighting): the span `sm_mean` is over.
    pub sm_s: f64,
    /// MIG GPU / compute instance the process ran in.
    pub gi: Option<u32>,
    pub ci: Option<u32>,
    present: bool,
    last_mem: Option<(MonoNs, u64)>,
    last_sm: Option<(MonoNs, u32)>,
    sm_sum: f64,
    sm_ns: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ThrottleUse {
    pub reason: String,
    pub seconds: f64,
    /// When the reason was first seen active (within the recording).
    pub first: MonoNs,
    /// When it was active (merged runs, at most `MAX_INTERVALS`).
    pub runs: Vec<(MonoNs, MonoNs)>,
}

/// A GPU state figure over time and its extremes.
#[derive(Clone, Debug, Default)]
pub struct Gauge {
    pub series: Series,
    pub min: Option<u64>,
    pub max: Option<u64>,
}

impl Gauge {
    fn hold(&mut self, v: Option<u64>, from: MonoNs, to: MonoNs) {
        if let Some(v) = v {
            self.series.push(from, to, v as f64);
        }
    }
    fn see(&mut self, v: Option<u64>) {
        if let Some(v) = v {
            self.min = Some(self.min.map_or(v, |m| m.min(v)));
            self.max = Some(self.max.map_or(v, |m| m.max(v)));
        }
    }
}

/// Where a GPU's utilization, idle time and gaps come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UtilSource {
    /// The driver's utilization samples (`nvmlDeviceGetSamples`), at its
    /// fixed period (1/6 s on most GPUs).
    #[default]
    DriverSamples,
    /// NVML GPM graphics activity between gpuprof's polls (Hopper and
    /// newer): the same measure at the poll interval.
    Gpm,
}

impl UtilSource {
    pub fn as_str(self) -> &'static str {
        match self {
            UtilSource::DriverSamples => "driver_samples",
            UtilSource::Gpm => "gpm",
        }
    }

    /// "driver samples of 167 ms" / "GPM windows of 100 ms".
    pub fn describe(self, resolution_ns: u64) -> String {
        let ms = resolution_ns as f64 / 1e6;
        match self {
            UtilSource::DriverSamples => format!("{ms:.0} ms driver utilization samples"),
            UtilSource::Gpm => format!("{ms:.0} ms GPM activity windows"),
        }
    }
}

/// GPM covers the run when its windows span at least this share of what
/// the driver's samples span; otherwise the driver's samples are used
/// throughout (one source per GPU keeps every figure consistent).
pub const GPM_MIN_COVERAGE: f64 = 0.9;

/// Everything known about one GPU for the run.
#[derive(Clone, Debug, Default)]
pub struct GpuDeviceAnalysis {
    pub index: GpuIndex,
    pub name: String,
    pub uuid: String,
    pub pci_bus_id: Option<String>,
    pub mem_total: Option<u64>,
    pub max_sm_mhz: Option<u32>,
    pub max_mem_mhz: Option<u32>,
    pub pcie_max_gen: Option<u32>,
    pub pcie_max_width: Option<u32>,
    pub mig_enabled: Option<bool>,
    pub unsupported: Vec<String>,

    /// What the utilization figures below come from.
    pub util_source: UtilSource,
    /// With GPM as the source: the driver's own samples' busy share over
    /// their span, for comparison.
    pub driver_busy_fraction: Option<f64>,
    /// GPM SM activity (% of SMs busy) over the windows, when read.
    pub sm_active: Series,
    /// Device utilization (%) over the sampled windows.
    pub util: Series,
    pub util_samples: u64,
    /// Start of the first and end of the last sample window.
    pub sampled: Option<(MonoNs, MonoNs)>,
    /// Sample period: the resolution of utilization and idle gaps.
    pub resolution_ns: u64,
    pub util_mean: Option<f64>,
    pub util_p50: Option<f64>,
    pub util_p95: Option<f64>,
    /// Time-weighted mean utilization / 100: the share of the sampled time
    /// during which a kernel ran.
    pub busy_fraction: Option<f64>,
    /// Share of each sample window during which no kernel ran
    /// (1 − utilization/100), at up to [`IDLE_SERIES_CAP`] points: what
    /// idle time is measured from.
    pub idle: Series,
    /// Idle seconds over the sampled span: Σ (1 − u/100) × window.
    pub idle_s: f64,
    /// Idle gaps in time order (at most `MAX_INTERVALS`; `gap_stats`
    /// counts all).
    pub idle_gaps: Vec<(MonoNs, MonoNs)>,
    pub gap_stats: GapStats,

    pub mem_used: Gauge,
    pub sm_mhz: Gauge,
    pub mem_mhz: Gauge,
    pub temp_c: Gauge,
    pub power_mw: Gauge,
    pub power_limit_mw: Gauge,
    pub pcie_gen: Gauge,
    pub pcie_width: Gauge,
    /// PCIe throughput, KB/s.
    pub pcie_tx: Gauge,
    pub pcie_rx: Gauge,
    pub throttle: Vec<ThrottleUse>,
    pub processes: Vec<GpuProcUse>,
}

/// A GPU's sampled span (within the recording) cut into start-up — the
/// fully idle gap it begins with (imports, model build, DataLoader
/// start) —, the steady state, and shutdown — the gap it ends with. A gap
/// counts as start-up when it begins within one sample period of the
/// span's start, as shutdown when it ends within one period of its end.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Phases {
    pub startup: Option<(MonoNs, MonoNs)>,
    pub steady: Option<(MonoNs, MonoNs)>,
    pub shutdown: Option<(MonoNs, MonoNs)>,
}

/// A GPU's idle seconds (utilization deficit) per phase.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IdleSplit {
    pub total_s: f64,
    pub startup_s: f64,
    pub steady_s: f64,
    pub shutdown_s: f64,
}

/// The phases of a GPU sampled over `sampled`, with fully idle `gaps` at a
/// resolution of `resolution_ns`, within the recording [start, end).
pub fn phases_of(
    gaps: &[(MonoNs, MonoNs)],
    sampled: Option<(MonoNs, MonoNs)>,
    resolution_ns: u64,
    start: MonoNs,
    end: MonoNs,
) -> Phases {
    let Some((s0, s1)) = sampled else {
        return Phases::default();
    };
    let (start, end) = (start.max(s0), end.min(s1));
    if end <= start {
        return Phases::default();
    }
    let n = gaps.len();
    let mut p = Phases::default();
    for (i, &(a, b)) in gaps.iter().enumerate() {
        if i == 0 && a.0 <= start.0 + resolution_ns {
            p.startup = Some((a.max(start), b.min(end)));
        } else if i + 1 == n && b.0 + resolution_ns >= end.0 {
            p.shutdown = Some((a.max(start), b.min(end)));
        }
    }
    let from = p.startup.map_or(start, |g| g.1);
    let to = p.shutdown.map_or(end, |g| g.0);
    p.steady = (to > from).then_some((from, to));
    p
}

impl Phases {
    /// Idle seconds per phase from a GPU's idle-share series.
    pub fn idle_split(&self, idle: &Series) -> IdleSplit {
        let of = |span: Option<(MonoNs, MonoNs)>| span.map_or(0.0, |(a, b)| idle.integral_in(a, b));
        let (startup_s, steady_s, shutdown_s) =
            (of(self.startup), of(self.steady), of(self.shutdown));
        IdleSplit {
            total_s: startup_s + steady_s + shutdown_s,
            startup_s,
            steady_s,
            shutdown_s,
        }
    }
}

impl GpuDeviceAnalysis {
    /// The phases of the sampled span within the recording [start, end).
    pub fn phases(&self, start: MonoNs, end: MonoNs) -> Phases {
        phases_of(
            &self.idle_gaps,
            self.sampled,
            self.resolution_ns,
            start,
            end,
        )
    }

    /// Idle seconds (utilization deficit) in [from, to).
    pub fn idle_between(&self, from: MonoNs, to: MonoNs) -> f64 {
        self.idle.integral_in(from, to)
    }

    /// Idle seconds of the sampled span within [start, end), per phase.
    pub fn idle_split(&self, start: MonoNs, end: MonoNs) -> IdleSplit {
        self.phases(start, end).idle_split(&self.idle)
    }
}

#[derive(Clone, Debug, Default)]
pub struct GpuAnalysis {
    /// NVML was opened (a `GpuDriver` event was recorded).
    pub available: bool,
    pub driver_version: Option<String>,
    pub cuda_driver_version: Option<i32>,
    pub devices: Vec<GpuDeviceAnalysis>,
    /// The idle threshold used, in percent.
    pub idle_threshold_pct: f64,
    /// Processes hold GPU memory but none of them belongs to the job.
    pub attribution_unavailable: bool,
    /// Sentences for the report's coverage notes.
    pub notes: Vec<String>,
}

impl GpuAnalysis {
    /// PIDs of the job that held a GPU context: the job's main process(es).
    pub fn job_gpu_pids(&self) -> BTreeSet<Pid> {
        self.devices
            .iter()
            .flat_map(|d| d.processes.iter())
            .filter(|p| p.in_job)
            .map(|p| p.pid)
            .collect()
    }

    /// The GPUs the job used; all GPUs when attribution is unavailable or
    /// the job used none.
    pub fn job_devices(&self) -> Vec<&GpuDeviceAnalysis> {
        let used: Vec<&GpuDeviceAnalysis> = self
            .devices
            .iter()
            .filter(|d| d.processes.iter().any(|p| p.in_job))
            .collect();
        if used.is_empty() {
            self.devices.iter().collect()
        } else {
            used
        }
    }

    /// Fully idle gaps of the job's GPUs (see [`Self::job_devices`]),
    /// merged into their union — the times when at least one of them sat
    /// fully idle. Sorted, non-overlapping.
    pub fn idle_intervals(&self) -> Vec<(MonoNs, MonoNs)> {
        let mut all: Vec<(MonoNs, MonoNs)> = self
            .job_devices()
            .iter()
            .flat_map(|d| d.idle_gaps.iter().copied())
            .collect();
        all.sort();
        merge(all)
    }

    /// The first moment from `t` on (within `within`) when the job's GPUs
    /// were more busy than idle. A busy stretch at `t` no longer than one
    /// driver sample (the sample straddling `t`, still mostly busy with
    /// earlier work) does not end the wait when idle time follows it: then
    /// the first busy moment after that idle time. None without GPU data
    /// (or never busy again).
    /// `idle` is [`GpuAnalysis::idle_weights`], built once by the caller.
    pub fn busy_again_after(&self, idle: &IdleWeights, t: MonoNs, within: u64) -> Option<MonoNs> {
        let devs = self.job_devices();
        let step = devs
            .iter()
            .filter(|d| d.util_samples > 0)
            .map(|d| d.resolution_ns)
            .min()?
            .max(2_000_000)
            / 2;
        let (mut at, mut was_idle, mut first_busy) = (t, false, None);
        while at.0 <= t.0 + within {
            match idle.at(at) {
                Some(w) if w >= 0.5 => was_idle = true,
                Some(_) if was_idle => return Some(at),
                Some(_) => {
                    let since = *first_busy.get_or_insert(at);
                    if at.0 - since.0 > 2 * step {
                        // Busy for longer than one sample: work, not the
                        // tail of a straddling sample.
                        return Some(since);
                    }
                }
                None => {}
            }
            at = MonoNs(at.0 + step);
        }
        if was_idle {
            None
        } else {
            first_busy
        }
    }

    /// How idle the job's GPUs were at `t`: the mean over them of the idle
    /// share of the driver sample covering `t` (the expected share of the
    /// job's GPU capacity that sat idle then). None when no GPU of the job
    /// was sampled at `t`. The reference [`IdleWeights`] is checked
    /// against: one search per GPU, too slow for millions of samples.
    #[cfg(test)]
    pub fn idle_weight_at(&self, t: MonoNs) -> Option<f64> {
        let (mut sum, mut n) = (0.0, 0usize);
        for d in self.job_devices() {
            if let Some(v) = d.idle.value_at(t) {
                sum += v;
                n += 1;
            }
        }
        (n > 0).then(|| sum / n as f64)
    }

    /// How idle the job's GPUs were, instant by instant: the mean over them
    /// of the idle share of the driver sample covering each instant (the
    /// expected share of the job's GPU capacity that sat idle then), None
    /// where no GPU of the job was sampled. What `flame-gpu-idle.svg`
    /// weights a CPU stack sample by. The GPUs' idle series are merged once
    /// into one step function, so that weighting each of millions of stack
    /// samples is one search, not one per GPU (and a scan of every GPU's
    /// processes).
    pub fn idle_weights(&self) -> IdleWeights {
        let devs = self.job_devices();
        let mut cuts: Vec<u64> = devs
            .iter()
            .flat_map(|d| d.idle.points().iter().flat_map(|p| [p.t0.0, p.t1.0]))
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut steps = Vec::with_capacity(cuts.len());
        for w in cuts.windows(2) {
            // Every series is constant (or undefined) between two cuts.
            let (mut sum, mut n) = (0.0, 0usize);
            for d in &devs {
                if let Some(v) = d.idle.value_at(MonoNs(w[0])) {
                    sum += v;
                    n += 1;
                }
            }
            if n > 0 {
                steps.push((w[0], w[1], sum / n as f64));
            }
        }
        IdleWeights { steps }
    }
}

/// The job's GPUs' mean idle share as one step function (see
/// [`GpuAnalysis::idle_weights`]).
pub struct IdleWeights {
    /// (start, end, mean idle share) in time order, not overlapping.
    steps: Vec<(u64, u64, f64)>,
}

impl IdleWeights {
    /// The job's GPUs' mean idle share at `t`.
    pub fn at(&self, t: MonoNs) -> Option<f64> {
        let i = self.steps.partition_point(|s| s.1 <= t.0);
        self.steps.get(i).filter(|s| s.0 <= t.0).map(|s| s.2)
    }
}

fn merge(sorted: Vec<(MonoNs, MonoNs)>) -> Vec<(MonoNs, MonoNs)> {
    let mut out: Vec<(MonoNs, MonoNs)> = Vec::with_capacity(sorted.len());
    for (s, e) in sorted {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Finds idle gaps in sample windows given in time order; see the module
/// doc for the rule.
#[derive(Clone, Debug)]
pub struct GapFinder {
    period_ns: u64,
    threshold_pct: f64,
    prev: Option<UtilWindow>,
    /// The open run of idle samples: (start incl. the previous sample's
    /// idle share, end).
    run: Option<(u64, u64)>,
    /// End of the last gap counted: a partly busy sample between two runs
    /// gives its idle share once, so gaps never overlap.
    last_end: u64,
    pub gaps: Vec<(MonoNs, MonoNs)>,
    lens: Vec<f64>,
    count: usize,
    total_s: f64,
    max_s: f64,
}

impl GapFinder {
    pub fn new(period_ns: u64, threshold_pct: f64) -> GapFinder {
        GapFinder {
            period_ns,
            threshold_pct,
            prev: None,
            run: None,
            last_end: 0,
            gaps: Vec::new(),
            lens: Vec::new(),
            count: 0,
            total_s: 0.0,
            max_s: 0.0,
        }
    }

    fn idle(&self, w: &UtilWindow) -> bool {
        w.pct <= self.threshold_pct
    }

    /// The idle part of a partly busy sample, in ns.
    fn idle_share(w: &UtilWindow) -> u64 {
        let len = w.end.0.saturating_sub(w.start.0);
        (len as f64 * (100.0 - w.pct.clamp(0.0, 100.0)) / 100.0) as u64
    }

    fn close(&mut self, extend_ns: u64) {
        if let Some((s, e)) = self.run.take() {
            let e = e + extend_ns;
            if e.saturating_sub(s) >= self.period_ns {
                self.last_end = e;
                let len = (e - s) as f64 / 1e9;
                self.count += 1;
                self.total_s += len;
                self.max_s = self.max_s.max(len);
                if self.gaps.len() < MAX_INTERVALS {
                    self.gaps.push((MonoNs(s), MonoNs(e)));
                    self.lens.push(len);
                }
            }
        }
    }

    pub fn push(&mut self, w: UtilWindow) {
        // Adjacent: no sample missing in between.
        let adjacent = self
            .prev
            .is_some_and(|p| w.start.0 <= p.end.0 + self.period_ns / 2);
        if self.idle(&w) {
            match self.run.as_mut() {
                Some(r) if adjacent => r.1 = w.end.0,
                _ => {
                    self.close(0);
                    let before = match self.prev {
                        Some(p) if adjacent => Self::idle_share(&p),
                        _ => 0,
                    };
                    let start = w.start.0.saturating_sub(before).max(self.last_end);
                    self.run = Some((start, w.end.0));
                }
            }
        } else if self.run.is_some() {
            self.close(if adjacent { Self::idle_share(&w) } else { 0 });
        }
        self.prev = Some(w);
    }

    pub fn finish(mut self) -> (Vec<(MonoNs, MonoNs)>, GapStats) {
        self.close(0);
        let mut lens = self.lens;
        lens.sort_by(f64::total_cmp);
        let stats = GapStats {
            count: self.count,
            total_s: self.total_s,
            median_s: lens.get(lens.len() / 2).copied().unwrap_or(0.0),
            max_s: self.max_s,
        };
        (self.gaps, stats)
    }
}

/// Idle gaps of sample windows in time order.
pub fn idle_gaps(w: &[UtilWindow], period_ns: u64, threshold_pct: f64) -> Vec<(MonoNs, MonoNs)> {
    let mut g = GapFinder::new(period_ns, threshold_pct);
    for x in w {
        g.push(*x);
    }
    g.finish().0
}

/// Utilization of one GPU, accumulated sample by sample.
#[derive(Debug)]
struct UtilAcc {
    period_ns: u64,
    gaps: GapFinder,
    series: Series,
    idle: Series,
    idle_ns: f64,
    hist: [u64; 101],
    busy: f64,
    covered: f64,
    first: Option<MonoNs>,
    last: Option<MonoNs>,
}

impl UtilAcc {
    fn new(period_ns: u64, threshold_pct: f64) -> UtilAcc {
        UtilAcc {
            period_ns,
            gaps: GapFinder::new(period_ns, threshold_pct),
            series: Series::default(),
            idle: Series::with_cap(IDLE_SERIES_CAP),
            idle_ns: 0.0,
            hist: [0; 101],
            busy: 0.0,
            covered: 0.0,
            first: None,
            last: None,
        }
    }

    fn push(&mut self, w: UtilWindow) {
        let len = (w.end.0 - w.start.0) as f64;
        let pct = w.pct.clamp(0.0, 100.0);
        self.busy += len * pct / 100.0;
        self.idle_ns += len * (1.0 - pct / 100.0);
        self.covered += len;
        self.idle.push(w.start, w.end, 1.0 - pct / 100.0);
        self.hist[pct.round() as usize] += 1;
        self.series.push(w.start, w.end, pct);
        self.first.get_or_insert(w.start);
        self.last = Some(w.end);
        self.gaps.push(w);
    }

    /// The q-quantile of the sample values (exact: values are whole %).
    fn quantile(&self, q: f64) -> Option<f64> {
        let n: u64 = self.hist.iter().sum();
        if n == 0 {
            return None;
        }
        let rank = ((n - 1) as f64 * q).round() as u64;
        let mut seen = 0;
        for (v, c) in self.hist.iter().enumerate() {
            seen += c;
            if seen > rank {
                return Some(v as f64);
            }
        }
        Some(100.0)
    }
}

#[derive(Debug, Default)]
struct ThrottleAcc {
    ns: u64,
    first: Option<MonoNs>,
    runs: Vec<(MonoNs, MonoNs)>,
}

#[derive(Default)]
struct DevAcc {
    info: Option<Event>,
    /// Samples waiting until the period is known.
    pending: Vec<(u64, u32)>,
    util: Option<UtilAcc>,
    /// GPM windows waiting until their interval is known, then their
    /// accumulator.
    gpm_pending: Vec<UtilWindow>,
    gpm: Option<UtilAcc>,
    sm_active: Series,
    last_ts: u64,
    last_state: Option<(MonoNs, GpuState)>,
    last_pcie: Option<(MonoNs, u32, u32)>,
    d: GpuDeviceAnalysis,
    throttle: BTreeMap<u64, ThrottleAcc>,
    procs: BTreeMap<Pid, GpuProcUse>,
    /// The latest utilization sample of a PID not listed on the GPU yet:
    /// the collector reads utilization before the process list in a tick,
    /// and records a value only when it changes, so a process at a steady
    /// SM% would otherwise never get one.
    pending_sm: BTreeMap<Pid, (MonoNs, u32)>,
}

/// Collects the GPU events of a recording in one pass; `finish` analyses.
pub struct GpuBuilder {
    available: bool,
    driver_version: Option<String>,
    cuda_driver_version: Option<i32>,
    anchor_monotonic_ns: u64,
    anchor_realtime_ns: u64,
    start: MonoNs,
    window_seen: bool,
    threshold_pct: f64,
    devs: BTreeMap<GpuIndex, DevAcc>,
}

/// What the GPU analysis needs at the end of the recording.
pub struct GpuInputs<'a> {
    /// Every process of the job's tree ever seen.
    pub job_pids: &'a BTreeSet<Pid>,
    /// End of the recorded window.
    pub end: MonoNs,
}

impl GpuBuilder {
    /// From the recording's header: the clock anchor, the start and the
    /// idle threshold it was recorded with.
    pub fn new(h: &Header) -> GpuBuilder {
        GpuBuilder {
            available: false,
            driver_version: None,
            cuda_driver_version: None,
            anchor_monotonic_ns: h.anchor_monotonic_ns,
            anchor_realtime_ns: h.anchor_realtime_ns,
            start: h.start,
            window_seen: false,
            threshold_pct: h
                .gpu_idle_threshold_pct
                .unwrap_or(DEFAULT_IDLE_THRESHOLD_PCT),
            devs: BTreeMap::new(),
        }
    }

    /// NVML's µs Unix timestamp on the monotonic axis.
    fn map(&self, ts_us: u64) -> MonoNs {
        let v = self.anchor_monotonic_ns as i128 + ts_us as i128 * 1000
            - self.anchor_realtime_ns as i128;
        MonoNs(v.max(0) as u64)
    }

    pub fn push(&mut self, ev: &Event) {
        match ev {
            // The first window start is the analysis' start (later than the
            // header's with --delay); samples before it are not the window's.
            Event::WindowStart { t } if !self.window_seen => {
                self.window_seen = true;
                self.start = *t;
            }
            Event::GpuDriver {
                driver_version,
                cuda_driver_version,
                ..
            } => {
                self.available = true;
                self.driver_version = driver_version.clone();
                self.cuda_driver_version = *cuda_driver_version;
            }
            Event::GpuDevice { gpu, .. } => {
                self.devs.entry(*gpu).or_default().info = Some(ev.clone());
            }
            Event::GpuUtil { gpu, samples, .. } => {
                let mut sorted = samples.clone();
                sorted.sort_unstable();
                let (start, threshold) = (self.start, self.threshold_pct);
                let anchor = (self.anchor_monotonic_ns, self.anchor_realtime_ns);
                let acc = self.devs.entry(*gpu).or_default();
                for (ts, v) in sorted {
                    if ts <= acc.last_ts {
                        continue;
                    }
                    acc.last_ts = ts;
                    acc.pending.push((ts, v));
                }
                if acc.util.is_none() && acc.pending.len() >= PERIOD_PROBE {
                    acc.start_util(threshold);
                }
                if acc.util.is_some() {
                    acc.drain_pending(anchor, start);
                }
            }
            Event::GpuActivity {
                t,
                gpu,
                from,
                busy_pct,
                sm_active_pct,
            } => {
                // A window that straddles the window's start counts from
                // there: dropped, the time between the start and its end
                // was missing from the idle total (a whole 100 ms window
                // when the first poll came just before the start).
                let from = (*from).max(self.start);
                if *t <= from {
                    return;
                }
                let threshold = self.threshold_pct;
                let acc = self.devs.entry(*gpu).or_default();
                if let Some(sm) = sm_active_pct {
                    acc.sm_active.push(from, *t, *sm);
                }
                let w = UtilWindow {
                    start: from,
                    end: *t,
                    pct: busy_pct.clamp(0.0, 100.0),
                };
                match acc.gpm.as_mut() {
                    Some(u) => u.push(w),
                    None => {
                        acc.gpm_pending.push(w);
                        if acc.gpm_pending.len() >= PERIOD_PROBE {
                            acc.start_gpm(threshold);
                        }
                    }
                }
            }
            Event::GpuState { t, gpu, state } => {
                let start = self.start;
                let acc = self.devs.entry(*gpu).or_default();
                if let Some((pt, ps)) = acc.last_state.take() {
                    acc.hold_state(&ps, pt.max(start), *t);
                }
                acc.see_state(state);
                acc.last_state = Some((*t, state.clone()));
            }
            Event::GpuPcie {
                t,
                gpu,
                tx_kbps,
                rx_kbps,
            } => {
                let acc = self.devs.entry(*gpu).or_default();
                if let Some((pt, _, _)) = acc.last_pcie {
                    // A reading is the rate over a short window at `t`:
                    // drawn from the previous reading on.
                    acc.d.pcie_tx.hold(Some(*tx_kbps as u64), pt, *t);
                    acc.d.pcie_rx.hold(Some(*rx_kbps as u64), pt, *t);
                }
                acc.d.pcie_tx.see(Some(*tx_kbps as u64));
                acc.d.pcie_rx.see(Some(*rx_kbps as u64));
                acc.last_pcie = Some((*t, *tx_kbps, *rx_kbps));
            }
            Event::GpuProcesses { t, gpu, procs } => {
                self.devs.entry(*gpu).or_default().processes(*t, procs);
            }
            Event::GpuProcUtil { gpu, samples, .. } => {
                let start = self.start;
                let mapped: Vec<(Pid, MonoNs, u32)> = samples
                    .iter()
                    .map(|s| (s.pid, self.map(s.ts_us), s.sm))
                    .filter(|s| s.1 >= start)
                    .collect();
                self.devs.entry(*gpu).or_default().proc_util(mapped);
            }
            _ => {}
        }
    }

    pub fn finish(self, inp: &GpuInputs) -> GpuAnalysis {
        let mut out = GpuAnalysis {
            available: self.available,
            driver_version: self.driver_version.clone(),
            cuda_driver_version: self.cuda_driver_version,
            idle_threshold_pct: self.threshold_pct,
            ..Default::default()
        };
        let anchor = (self.anchor_monotonic_ns, self.anchor_realtime_ns);
        for (index, acc) in self.devs {
            out.devices
                .push(acc.finish(index, anchor, self.start, inp, self.threshold_pct));
        }

        let any_job = out
            .devices
            .iter()
            .any(|d| d.processes.iter().any(|p| p.in_job));
        let foreign_mem = out
            .devices
            .iter()
            .flat_map(|d| d.processes.iter())
            .any(|p| p.mem_max.unwrap_or(1) > 0);
        if !any_job && foreign_mem {
            out.attribution_unavailable = true;
            out.notes.push(
                "per-process attribution unavailable (PID namespace?): processes hold GPU memory \
                 but none of their PIDs is a process of the job; in a container the driver \
                 reports host PIDs (run with --pid=host to attribute), or the job did not use \
                 the GPU"
                    .into(),
            );
        }
        for d in &out.devices {
            if d.util_samples > 0 {
                out.notes.push(match d.util_source {
                    UtilSource::DriverSamples => format!(
                        "GPU {}: utilization is sampled by the driver every {:.0} ms; idle time \
                         is counted from every sample (its utilization deficit), but idle gaps \
                         shorter than that cannot be placed",
                        d.index,
                        d.resolution_ns as f64 / 1e6
                    ),
                    UtilSource::Gpm => format!(
                        "GPU {}: activity measured by NVML GPM every {:.0} ms (the driver's own \
                         samples said {}% busy); idle gaps shorter than that cannot be placed",
                        d.index,
                        d.resolution_ns as f64 / 1e6,
                        d.driver_busy_fraction
                            .map_or("?".into(), |b| format!("{:.0}", b * 100.0))
                    ),
                });
            }
            if d.mig_enabled == Some(true) {
                out.notes.push(format!(
                    "GPU {}: MIG is enabled; the driver reports no utilization in MIG mode",
                    d.index
                ));
            }
            if d.gap_stats.count > d.idle_gaps.len() {
                out.notes.push(format!(
                    "GPU {}: {} idle gaps; the first {} are kept as intervals (trace, \
                     flamegraph), the statistics count all",
                    d.index,
                    d.gap_stats.count,
                    d.idle_gaps.len()
                ));
            }
        }
        out
    }
}

fn set_mem(u: &mut GpuProcUse, t: MonoNs, m: u64) {
    match u.last_mem {
        Some((_, v)) if v == m => {}
        Some((pt, v)) => {
            u.mem.push(pt, t, v as f64);
            u.last_mem = Some((t, m));
        }
        None if m > 0 => u.last_mem = Some((t, m)),
        None => {}
    }
}

impl DevAcc {
    /// The driver's list of the processes on this GPU at `t`; one missing
    /// from it has left the GPU.
    fn processes(&mut self, t: MonoNs, procs: &[GpuProc]) {
        let pending = &mut self.pending_sm;
        for p in procs {
            let u = self.procs.entry(p.pid).or_insert_with(|| GpuProcUse {
                pid: p.pid,
                in_job: false,
                ctx: p.ctx,
                first_seen: t,
                last_seen: t,
                mem_max: None,
                mem: Series::default(),
                sm: Series::default(),
                sm_mean: None,
                sm_s: 0.0,
                gi: p.gi,
                ci: p.ci,
                present: true,
                last_mem: None,
                last_sm: pending.remove(&p.pid),
                sm_sum: 0.0,
                sm_ns: 0.0,
            });
            u.present = true;
            u.last_seen = t;
            if let Some(m) = p.mem {
                u.mem_max = Some(u.mem_max.unwrap_or(0).max(m));
                set_mem(u, t, m);
            }
        }
        for u in self.procs.values_mut() {
            if u.present && !procs.iter().any(|p| p.pid == u.pid) {
                u.present = false;
                u.last_seen = t;
                set_mem(u, t, 0);
            }
        }
    }

    /// Per-process SM% samples (PID, time, %) in the window: each value
    /// holds until the next. A PID not listed on the GPU yet keeps its
    /// latest for when it is.
    fn proc_util(&mut self, samples: Vec<(Pid, MonoNs, u32)>) {
        for (pid, t, sm) in samples {
            let Some(u) = self.procs.get_mut(&pid) else {
                if self.pending_sm.get(&pid).map_or(true, |l| t > l.0) {
                    if self.pending_sm.len() >= 4096 {
                        self.pending_sm.clear();
                    }
                    self.pending_sm.insert(pid, (t, sm));
                }
                continue;
            };
            if u.last_sm.is_some_and(|l| t <= l.0) {
                continue;
            }
            if let Some((pt, pv)) = u.last_sm {
                u.sm.push(pt, t, pv as f64);
                let dt = (t.0 - pt.0) as f64;
                u.sm_sum += pv as f64 * dt;
                u.sm_ns += dt;
            }
            u.last_sm = Some((t, sm));
        }
    }

    /// Fix the period from the buffered samples (median spacing).
    fn start_util(&mut self, threshold: f64) {
        let mut diffs: Vec<u64> = self
            .pending
            .windows(2)
            .map(|w| w[1].0 - w[0].0)
            .filter(|&d| d > 0)
            .collect();
        diffs.sort_unstable();
        let period = diffs
            .get(diffs.len() / 2)
            .map_or(DEFAULT_PERIOD_NS, |d| d * 1000);
        self.util = Some(UtilAcc::new(period, threshold));
    }

    /// Fix the GPM interval (median window) and take the buffered windows.
    fn start_gpm(&mut self, threshold: f64) {
        let mut lens: Vec<u64> = self
            .gpm_pending
            .iter()
            .map(|w| w.end.0 - w.start.0)
            .collect();
        lens.sort_unstable();
        let period = lens
            .get(lens.len() / 2)
            .copied()
            .unwrap_or(DEFAULT_PERIOD_NS);
        let mut u = UtilAcc::new(period, threshold);
        for w in self.gpm_pending.drain(..) {
            u.push(w);
        }
        self.gpm = Some(u);
    }

    fn drain_pending(&mut self, anchor: (u64, u64), start: MonoNs) {
        let Some(u) = self.util.as_mut() else { return };
        for (ts, pct) in self.pending.drain(..) {
            let end =
                MonoNs((anchor.0 as i128 + ts as i128 * 1000 - anchor.1 as i128).max(0) as u64);
            // Clipped to the window's start, like GPM windows.
            let w = UtilWindow {
                start: MonoNs(end.0.saturating_sub(u.period_ns)).max(start),
                end,
                pct: pct.min(100) as f64,
            };
            if w.end > w.start {
                u.push(w);
            }
        }
    }

    fn see_state(&mut self, s: &GpuState) {
        let d = &mut self.d;
        d.mem_used.see(s.mem_used);
        d.sm_mhz.see(s.sm_mhz.map(u64::from));
        d.mem_mhz.see(s.mem_mhz.map(u64::from));
        d.temp_c.see(s.temp_c.map(u64::from));
        d.power_mw.see(s.power_mw.map(u64::from));
        d.power_limit_mw.see(s.power_limit_mw.map(u64::from));
        d.pcie_gen.see(s.pcie_gen.map(u64::from));
        d.pcie_width.see(s.pcie_width.map(u64::from));
    }

    /// State `s` held over [from, to).
    fn hold_state(&mut self, s: &GpuState, from: MonoNs, to: MonoNs) {
        if to <= from {
            return;
        }
        let d = &mut self.d;
        d.mem_used.hold(s.mem_used, from, to);
        d.sm_mhz.hold(s.sm_mhz.map(u64::from), from, to);
        d.mem_mhz.hold(s.mem_mhz.map(u64::from), from, to);
        d.temp_c.hold(s.temp_c.map(u64::from), from, to);
        d.power_mw.hold(s.power_mw.map(u64::from), from, to);
        d.power_limit_mw
            .hold(s.power_limit_mw.map(u64::from), from, to);
        d.pcie_gen.hold(s.pcie_gen.map(u64::from), from, to);
        d.pcie_width.hold(s.pcie_width.map(u64::from), from, to);
        if let Some(bits) = s.throttle {
            for &(bit, _) in THROTTLE_REASONS {
                if bits & bit == 0 {
                    continue;
                }
                let a = self.throttle.entry(bit).or_default();
                a.ns += to.0 - from.0;
                a.first.get_or_insert(from);
                let n = a.runs.len();
                match a.runs.last_mut() {
                    Some(r) if r.1 >= from => r.1 = r.1.max(to),
                    _ if n < MAX_INTERVALS => a.runs.push((from, to)),
                    _ => {}
                }
            }
        }
    }

    fn finish(
        mut self,
        index: GpuIndex,
        anchor: (u64, u64),
        start: MonoNs,
        inp: &GpuInputs,
        threshold: f64,
    ) -> GpuDeviceAnalysis {
        if self.util.is_none() && !self.pending.is_empty() {
            self.start_util(threshold);
        }
        if self.gpm.is_none() && !self.gpm_pending.is_empty() {
            self.start_gpm(threshold);
        }
        self.drain_pending(anchor, start);
        if let Some((t, s)) = self.last_state.take() {
            self.hold_state(&s, t.max(start), inp.end);
        }
        if let Some((t, tx, rx)) = self.last_pcie.take() {
            self.d.pcie_tx.hold(Some(tx as u64), t, inp.end);
            self.d.pcie_rx.hold(Some(rx as u64), t, inp.end);
        }
        let mut d = self.d;
        d.index = index;
        d.name = format!("GPU {index}");
        if let Some(Event::GpuDevice {
            name,
            uuid,
            pci_bus_id,
            mem_total,
            max_sm_mhz,
            max_mem_mhz,
            pcie_max_gen,
            pcie_max_width,
            mig_enabled,
            unsupported,
            ..
        }) = self.info
        {
            d.name = name;
            d.uuid = uuid;
            d.pci_bus_id = pci_bus_id;
            d.mem_total = mem_total;
            d.max_sm_mhz = max_sm_mhz;
            d.max_mem_mhz = max_mem_mhz;
            d.pcie_max_gen = pcie_max_gen;
            d.pcie_max_width = pcie_max_width;
            d.mig_enabled = mig_enabled;
            d.unsupported = unsupported;
        }
        d.sm_active = self.sm_active;
        let covered = |u: &Option<UtilAcc>| u.as_ref().map_or(0.0, |u| u.covered);
        let use_gpm = covered(&self.gpm) > 0.0
            && covered(&self.gpm) >= GPM_MIN_COVERAGE * covered(&self.util);
        let chosen = if use_gpm {
            d.util_source = UtilSource::Gpm;
            d.driver_busy_fraction = self
                .util
                .as_ref()
                .filter(|u| u.covered > 0.0)
                .map(|u| u.busy / u.covered);
            self.gpm
        } else {
            self.util
        };
        if let Some(u) = chosen {
            let n: u64 = u.hist.iter().sum();
            d.resolution_ns = u.period_ns;
            d.util_samples = n;
            if n > 0 {
                let sum: f64 = u
                    .hist
                    .iter()
                    .enumerate()
                    .map(|(v, c)| v as f64 * *c as f64)
                    .sum();
                d.util_mean = Some(sum / n as f64);
                d.util_p50 = u.quantile(0.5);
                d.util_p95 = u.quantile(0.95);
                d.busy_fraction = (u.covered > 0.0).then(|| u.busy / u.covered);
                d.sampled = u.first.zip(u.last);
            }
            d.util = u.series;
            d.idle = u.idle;
            d.idle_s = u.idle_ns / 1e9;
            let (gaps, stats) = u.gaps.finish();
            d.idle_gaps = gaps;
            d.gap_stats = stats;
        }
        d.throttle = THROTTLE_REASONS
            .iter()
            .filter_map(|&(bit, name)| {
                let a = self.throttle.remove(&bit)?;
                Some(ThrottleUse {
                    reason: name.to_string(),
                    seconds: a.ns as f64 / 1e9,
                    first: a.first?,
                    runs: a.runs,
                })
            })
            .collect();
        for mut u in self.procs.into_values() {
            u.in_job = inp.job_pids.contains(&u.pid);
            if u.present {
                u.last_seen = u.last_seen.max(inp.end);
            }
            if let Some((t, m)) = u.last_mem.take() {
                u.mem.push(t, inp.end.max(t), m as f64);
            }
            if let Some((t, v)) = u.last_sm.take() {
                let end = u.last_seen.max(t);
                u.sm.push(t, end, v as f64);
                u.sm_sum += v as f64 * (end.0 - t.0) as f64;
                u.sm_ns += (end.0 - t.0) as f64;
                u.sm_mean = Some(if u.sm_ns > 0.0 {
                    u.sm_sum / u.sm_ns
                } else {
                    v as f64
                });
                u.sm_s = u.sm_ns / 1e9;
            }
            d.processes.push(u);
        }
        d
    }
}

#[cfg(test)]
mod tests;
