//! GPU analysis: pure functions over the recorded GPU events.
//!
//! - Utilization samples (NVML's µs Unix timestamps) are mapped onto the
//!   monotonic axis with the header's anchor pair. Each sample covers the
//!   driver's sample period before its timestamp; the period (the median
//!   spacing of the samples) is the stated resolution of everything below.
//! - An idle gap is a run of consecutive samples at or below the threshold
//!   (default 5%). Its edges are placed inside the neighbouring, partly busy
//!   samples by their utilization — exact when such a sample holds one
//!   busy/idle transition, off by less than one period otherwise. A run
//!   with no fully idle sample is shorter than the resolution and is not
//!   claimed.
//! - NVML PIDs are matched against every process of the job's tree. If
//!   processes hold GPU memory but none of them is the job's, attribution is
//!   reported unavailable (PID namespace?) rather than guessed.

use std::collections::{BTreeMap, BTreeSet};

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

/// One utilization sample as a window on the monotonic axis.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UtilWindow {
    pub start: MonoNs,
    pub end: MonoNs,
    pub pct: u32,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct GapStats {
    pub count: usize,
    pub total_s: f64,
    pub median_s: f64,
    pub max_s: f64,
}

/// A process seen on a GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuProcUse {
    pub pid: Pid,
    /// A process of the job's tree.
    pub in_job: bool,
    pub ctx: GpuContext,
    pub first_seen: MonoNs,
    pub last_seen: MonoNs,
    pub mem_max: Option<u64>,
    /// GPU memory over time, from the process lists.
    pub mem: Vec<(MonoNs, u64)>,
    /// Per-process SM utilization (the driver's own timestamps; recorded
    /// when it changed, each value holds until the next).
    pub sm: Vec<(MonoNs, u32)>,
    /// Time-weighted mean of `sm` until the process was last seen.
    pub sm_mean: Option<f64>,
    /// MIG GPU / compute instance the process ran in.
    pub gi: Option<u32>,
    pub ci: Option<u32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ThrottleUse {
    pub reason: String,
    pub seconds: f64,
    /// When the reason was first seen active (within the recording).
    pub first: MonoNs,
}

/// Everything known about one GPU for the run.
#[derive(Clone, Debug, Default, PartialEq)]
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

    pub util: Vec<UtilWindow>,
    /// Sample period: the resolution of utilization and idle gaps.
    pub resolution_ns: u64,
    pub util_mean: Option<f64>,
    pub util_p50: Option<f64>,
    pub util_p95: Option<f64>,
    /// Time-weighted mean utilization / 100: the share of the sampled time
    /// during which a kernel ran.
    pub busy_fraction: Option<f64>,
    pub idle_gaps: Vec<(MonoNs, MonoNs)>,
    pub gap_stats: GapStats,

    pub states: Vec<(MonoNs, GpuState)>,
    pub pcie: Vec<(MonoNs, u32, u32)>,
    pub mem_used_max: Option<u64>,
    pub temp_max: Option<u32>,
    pub sm_mhz_min: Option<u32>,
    pub sm_mhz_max: Option<u32>,
    pub power_max_mw: Option<u32>,
    pub power_limit_mw: Option<u32>,
    pub throttle: Vec<ThrottleUse>,
    /// Lowest link generation and width seen.
    pub pcie_gen_min: Option<u32>,
    pub pcie_width_min: Option<u32>,
    pub processes: Vec<GpuProcUse>,
}

#[derive(Clone, Debug, Default, PartialEq)]
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

    /// Idle intervals of every GPU the job used (all GPUs when attribution
    /// is unavailable or the job used none), merged: what
    /// `flame-gpu-idle.svg` and the diagnosis look at.
    pub fn idle_intervals(&self) -> Vec<(MonoNs, MonoNs)> {
        let used: Vec<&GpuDeviceAnalysis> = self
            .devices
            .iter()
            .filter(|d| d.processes.iter().any(|p| p.in_job))
            .collect();
        let devs: Vec<&GpuDeviceAnalysis> = if used.is_empty() {
            self.devices.iter().collect()
        } else {
            used
        };
        let mut all: Vec<(MonoNs, MonoNs)> = devs
            .iter()
            .flat_map(|d| d.idle_gaps.iter().copied())
            .collect();
        all.sort();
        merge(all)
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

#[derive(Default)]
struct DevAcc {
    info: Option<Event>,
    util: Vec<(u64, u32)>,
    states: Vec<(MonoNs, GpuState)>,
    pcie: Vec<(MonoNs, u32, u32)>,
    procs: Vec<(MonoNs, Vec<GpuProc>)>,
    proc_util: BTreeMap<Pid, Vec<(u64, u32)>>,
}

/// Collects the GPU events of a recording in one pass; `finish` analyses.
#[derive(Default)]
pub struct GpuBuilder {
    available: bool,
    driver_version: Option<String>,
    cuda_driver_version: Option<i32>,
    devs: BTreeMap<GpuIndex, DevAcc>,
}

/// What the GPU analysis needs from the rest of the recording.
pub struct GpuInputs<'a> {
    pub header: &'a Header,
    /// Every process of the job's tree ever seen.
    pub job_pids: &'a BTreeSet<Pid>,
    /// The recorded window (samples outside it are dropped).
    pub start: MonoNs,
    pub end: MonoNs,
    pub idle_threshold_pct: f64,
}

impl GpuBuilder {
    pub fn push(&mut self, ev: &Event) {
        match ev {
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
                self.devs
                    .entry(*gpu)
                    .or_default()
                    .util
                    .extend_from_slice(samples);
            }
            Event::GpuState { t, gpu, state } => {
                self.devs
                    .entry(*gpu)
                    .or_default()
                    .states
                    .push((*t, state.clone()));
            }
            Event::GpuPcie {
                t,
                gpu,
                tx_kbps,
                rx_kbps,
            } => {
                self.devs
                    .entry(*gpu)
                    .or_default()
                    .pcie
                    .push((*t, *tx_kbps, *rx_kbps));
            }
            Event::GpuProcesses { t, gpu, procs } => {
                self.devs
                    .entry(*gpu)
                    .or_default()
                    .procs
                    .push((*t, procs.clone()));
            }
            Event::GpuProcUtil { gpu, samples, .. } => {
                let d = self.devs.entry(*gpu).or_default();
                for s in samples {
                    d.proc_util.entry(s.pid).or_default().push((s.ts_us, s.sm));
                }
            }
            _ => {}
        }
    }

    pub fn finish(self, inp: &GpuInputs) -> GpuAnalysis {
        let map = |ts_us: u64| -> MonoNs {
            let v = inp.header.anchor_monotonic_ns as i128 + ts_us as i128 * 1000
                - inp.header.anchor_realtime_ns as i128;
            MonoNs(v.max(0) as u64)
        };
        let mut out = GpuAnalysis {
            available: self.available,
            driver_version: self.driver_version,
            cuda_driver_version: self.cuda_driver_version,
            idle_threshold_pct: inp.idle_threshold_pct,
            ..Default::default()
        };
        for (index, acc) in self.devs {
            out.devices.push(device(index, acc, inp, &map));
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
            if d.resolution_ns > 0 && !d.util.is_empty() {
                out.notes.push(format!(
                    "GPU {}: utilization is sampled by the driver every {:.0} ms; idle gaps \
                     shorter than that cannot be seen",
                    d.index,
                    d.resolution_ns as f64 / 1e6
                ));
            }
            if d.mig_enabled == Some(true) {
                out.notes.push(format!(
                    "GPU {}: MIG is enabled; the driver reports no utilization in MIG mode",
                    d.index
                ));
            }
        }
        out
    }
}

fn percentile(sorted: &[u32], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    Some(sorted[i.min(sorted.len() - 1)] as f64)
}

/// Sample windows from raw (µs timestamp, %) samples: sorted, deduplicated,
/// clipped to the recording, each covering one period before its stamp.
pub fn util_windows(
    samples: &[(u64, u32)],
    map: impl Fn(u64) -> MonoNs,
    from: MonoNs,
    to: MonoNs,
) -> (Vec<UtilWindow>, u64) {
    let mut s: Vec<(u64, u32)> = samples.to_vec();
    s.sort_unstable();
    s.dedup_by_key(|x| x.0);
    let mut diffs: Vec<u64> = s.windows(2).map(|w| w[1].0 - w[0].0).collect();
    diffs.sort_unstable();
    let period_ns = if diffs.is_empty() {
        DEFAULT_PERIOD_NS
    } else {
        diffs[diffs.len() / 2] * 1000
    };
    let mut out = Vec::with_capacity(s.len());
    for (ts, pct) in s {
        let end = map(ts);
        let start = MonoNs(end.0.saturating_sub(period_ns));
        if start < from || end > to {
            continue;
        }
        out.push(UtilWindow {
            start,
            end,
            pct: pct.min(100),
        });
    }
    (out, period_ns)
}

/// Idle gaps from sample windows; see the module doc.
pub fn idle_gaps(w: &[UtilWindow], period_ns: u64, threshold_pct: f64) -> Vec<(MonoNs, MonoNs)> {
    let idle = |x: &UtilWindow| x.pct as f64 <= threshold_pct;
    // Adjacent: no sample missing in between.
    let adjacent = |a: &UtilWindow, b: &UtilWindow| b.start.0 <= a.end.0 + period_ns / 2;
    let mut gaps = Vec::new();
    let mut i = 0;
    while i < w.len() {
        if !idle(&w[i]) {
            i += 1;
            continue;
        }
        let first = i;
        while i + 1 < w.len() && idle(&w[i + 1]) && adjacent(&w[i], &w[i + 1]) {
            i += 1;
        }
        let last = i;
        let mut start = w[first].start.0;
        let mut end = w[last].end.0;
        if first > 0 && adjacent(&w[first - 1], &w[first]) {
            let p = &w[first - 1];
            let len = p.end.0 - p.start.0;
            start -= (len as f64 * (100 - p.pct) as f64 / 100.0) as u64;
        }
        if last + 1 < w.len() && adjacent(&w[last], &w[last + 1]) {
            let n = &w[last + 1];
            let len = n.end.0 - n.start.0;
            end += (len as f64 * (100 - n.pct) as f64 / 100.0) as u64;
        }
        if end - start >= period_ns {
            gaps.push((MonoNs(start), MonoNs(end)));
        }
        i += 1;
    }
    gaps
}

/// Mean of a step series (each value holds until the next point, the last
/// until `end`); the plain mean when no time elapses.
pub fn time_weighted_mean(points: &[(MonoNs, u32)], end: MonoNs) -> Option<f64> {
    if points.is_empty() {
        return None;
    }
    let (mut sum, mut total) = (0.0, 0.0);
    for (k, &(t, v)) in points.iter().enumerate() {
        let until = points.get(k + 1).map_or(end, |n| n.0).max(t);
        let dt = (until.0 - t.0) as f64;
        sum += v as f64 * dt;
        total += dt;
    }
    Some(if total > 0.0 {
        sum / total
    } else {
        points.iter().map(|p| p.1 as f64).sum::<f64>() / points.len() as f64
    })
}

pub fn gap_stats(gaps: &[(MonoNs, MonoNs)]) -> GapStats {
    let mut lens: Vec<f64> = gaps.iter().map(|g| g.1.secs_since(g.0)).collect();
    lens.sort_by(f64::total_cmp);
    GapStats {
        count: lens.len(),
        total_s: lens.iter().sum(),
        median_s: if lens.is_empty() {
            0.0
        } else {
            lens[lens.len() / 2]
        },
        max_s: lens.last().copied().unwrap_or(0.0),
    }
}

fn device(
    index: GpuIndex,
    acc: DevAcc,
    inp: &GpuInputs,
    map: &impl Fn(u64) -> MonoNs,
) -> GpuDeviceAnalysis {
    let mut d = GpuDeviceAnalysis {
        index,
        name: format!("GPU {index}"),
        ..Default::default()
    };
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
    }) = acc.info
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

    let (util, period) = util_windows(&acc.util, map, inp.start, inp.end);
    d.resolution_ns = period;
    if !util.is_empty() {
        let mut pcts: Vec<u32> = util.iter().map(|w| w.pct).collect();
        pcts.sort_unstable();
        d.util_mean = Some(pcts.iter().map(|&p| p as f64).sum::<f64>() / pcts.len() as f64);
        d.util_p50 = percentile(&pcts, 0.5);
        d.util_p95 = percentile(&pcts, 0.95);
        let (busy, total) = util.iter().fold((0.0, 0.0), |(b, t), w| {
            let len = (w.end.0 - w.start.0) as f64;
            (b + len * w.pct as f64 / 100.0, t + len)
        });
        d.busy_fraction = (total > 0.0).then(|| busy / total);
        d.idle_gaps = idle_gaps(&util, period, inp.idle_threshold_pct);
        d.gap_stats = gap_stats(&d.idle_gaps);
    }
    d.util = util;

    // State: each value holds until the next state event.
    let mut throttle_ns: BTreeMap<u64, (u64, MonoNs)> = BTreeMap::new();
    for (k, (t, s)) in acc.states.iter().enumerate() {
        // Held until the next state, clipped to the recorded window.
        let until = acc.states.get(k + 1).map(|n| n.0).unwrap_or(inp.end);
        let held = until.min(inp.end).0.saturating_sub((*t).max(inp.start).0);
        if let Some(bits) = s.throttle {
            for &(bit, _) in THROTTLE_REASONS {
                if bits & bit != 0 && held > 0 {
                    throttle_ns.entry(bit).or_insert((0, (*t).max(inp.start))).0 += held;
                }
            }
        }
        let max = |a: Option<u32>, b: Option<u32>| match (a, b) {
            (Some(x), Some(y)) => Some(x.max(y)),
            (x, y) => x.or(y),
        };
        let min = |a: Option<u32>, b: Option<u32>| match (a, b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        d.mem_used_max = match (d.mem_used_max, s.mem_used) {
            (Some(x), Some(y)) => Some(x.max(y)),
            (x, y) => x.or(y),
        };
        d.temp_max = max(d.temp_max, s.temp_c);
        d.sm_mhz_min = min(d.sm_mhz_min, s.sm_mhz);
        d.sm_mhz_max = max(d.sm_mhz_max, s.sm_mhz);
        d.power_max_mw = max(d.power_max_mw, s.power_mw);
        d.power_limit_mw = s.power_limit_mw.or(d.power_limit_mw);
        d.pcie_gen_min = min(d.pcie_gen_min, s.pcie_gen);
        d.pcie_width_min = min(d.pcie_width_min, s.pcie_width);
    }
    d.throttle = THROTTLE_REASONS
        .iter()
        .filter_map(|&(bit, name)| {
            throttle_ns.get(&bit).map(|&(ns, first)| ThrottleUse {
                reason: name.to_string(),
                seconds: ns as f64 / 1e9,
                first,
            })
        })
        .collect();
    d.states = acc.states;
    d.pcie = acc.pcie;

    // Processes: memory from the lists, SM% from the per-process samples.
    let mut procs: BTreeMap<Pid, GpuProcUse> = BTreeMap::new();
    for (t, list) in &acc.procs {
        for p in list {
            let u = procs.entry(p.pid).or_insert_with(|| GpuProcUse {
                pid: p.pid,
                in_job: inp.job_pids.contains(&p.pid),
                ctx: p.ctx,
                first_seen: *t,
                last_seen: *t,
                mem_max: None,
                mem: Vec::new(),
                sm: Vec::new(),
                sm_mean: None,
                gi: p.gi,
                ci: p.ci,
            });
            u.last_seen = *t;
            if let Some(m) = p.mem {
                u.mem_max = Some(u.mem_max.unwrap_or(0).max(m));
                if u.mem.last().map(|x| x.1) != Some(m) {
                    u.mem.push((*t, m));
                }
            }
        }
        // A process missing from this list has left the GPU.
        for u in procs.values_mut() {
            if !list.iter().any(|p| p.pid == u.pid) && u.mem.last().is_some_and(|x| x.1 != 0) {
                u.mem.push((*t, 0));
            }
        }
    }
    for (pid, samples) in acc.proc_util {
        let Some(u) = procs.get_mut(&pid) else {
            continue;
        };
        let mut s: Vec<(MonoNs, u32)> = samples.iter().map(|&(ts, v)| (map(ts), v)).collect();
        s.sort_unstable();
        s.retain(|x| x.0 >= inp.start && x.0 <= inp.end);
        s.dedup_by_key(|x| x.0);
        u.sm_mean = time_weighted_mean(&s, u.last_seen.max(s.last().map_or(inp.start, |x| x.0)));
        u.sm = s;
    }
    d.processes = procs.into_values().collect();
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(start_ms: u64, pct: u32) -> UtilWindow {
        UtilWindow {
            start: MonoNs(start_ms * 1_000_000),
            end: MonoNs((start_ms + 10) * 1_000_000),
            pct,
        }
    }

    const P: u64 = 10_000_000;

    #[test]
    fn gap_edges_use_the_neighbours_utilization() {
        // Busy 0..10, then 30% busy (3 ms of kernel then idle), idle x2,
        // then 40% busy (idle 6 ms then kernel), busy.
        let ws = [
            w(0, 100),
            w(10, 30),
            w(20, 0),
            w(30, 0),
            w(40, 40),
            w(50, 100),
        ];
        let g = idle_gaps(&ws, P, 5.0);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].0, MonoNs(13_000_000));
        assert_eq!(g[0].1, MonoNs(46_000_000));
    }

    #[test]
    fn runs_without_a_fully_idle_sample_are_not_claimed() {
        let ws = [w(0, 100), w(10, 50), w(20, 50), w(30, 100)];
        assert!(idle_gaps(&ws, P, 5.0).is_empty());
        // The threshold counts "nearly idle" samples as idle.
        let ws = [w(0, 100), w(10, 5), w(20, 100)];
        assert_eq!(idle_gaps(&ws, P, 5.0).len(), 1);
        assert!(idle_gaps(&ws, P, 4.0).is_empty());
    }

    #[test]
    fn a_missing_sample_splits_a_gap() {
        let ws = [w(0, 0), w(10, 0), w(40, 0)];
        let g = idle_gaps(&ws, P, 5.0);
        assert_eq!(g.len(), 2);
        assert_eq!(g[0], (MonoNs(0), MonoNs(20_000_000)));
    }

    #[test]
    fn windows_are_mapped_clipped_and_use_the_median_period() {
        let samples = [
            (1_000_030, 10),
            (1_000_010, 0),
            (1_000_020, 50),
            (1_000_020, 50),
        ];
        let (ws, p) = util_windows(
            &samples,
            |ts| MonoNs(ts * 1000),
            MonoNs(0),
            MonoNs(u64::MAX),
        );
        assert_eq!(p, 10_000);
        assert_eq!(ws.len(), 3);
        assert_eq!(ws[0].start, MonoNs(1_000_000_000));
        let (ws, _) = util_windows(
            &samples,
            |ts| MonoNs(ts * 1000),
            MonoNs(1_000_005_000),
            MonoNs(u64::MAX),
        );
        assert_eq!(ws.len(), 2);
    }

    #[test]
    fn step_means_weigh_by_time() {
        let p = [(MonoNs(0), 100), (MonoNs(10), 0)];
        assert_eq!(time_weighted_mean(&p, MonoNs(40)), Some(25.0));
        assert_eq!(time_weighted_mean(&p[..1], MonoNs(0)), Some(100.0));
        assert_eq!(time_weighted_mean(&[], MonoNs(0)), None);
    }

    #[test]
    fn throttle_bits_have_names() {
        assert_eq!(
            throttle_names(0x44),
            vec!["sw_power_cap", "hw_thermal_slowdown"]
        );
        assert_eq!(throttle_names(0x1000), vec!["0x1000"]);
    }

    fn header() -> Header {
        Header {
            format: "gpuprof-recording".into(),
            version: 1,
            gpuprof_version: "0".into(),
            command: vec![],
            host: "h".into(),
            start: MonoNs(1_000_000_000),
            anchor_realtime_ns: 1_700_000_000_000_000_000,
            anchor_monotonic_ns: 1_000_000_000,
            interval_ns: 100_000_000,
            cpus: 2,
            page_size: 4096,
            clock_ticks_per_s: 100,
            rank: None,
            job_pid: Pid(41),
            boottime_offset_ns: 0,
            gpu_idle_threshold_pct: None,
        }
    }

    #[test]
    fn attribution_and_throttle_seconds() {
        let h = header();
        let wall = |mono_ms: u64| 1_700_000_000_000_000 + (mono_ms * 1000) - 1_000_000;
        let mut b = GpuBuilder::default();
        b.push(&Event::GpuDriver {
            t: MonoNs(1_000_000_000),
            driver_version: Some("550".into()),
            cuda_driver_version: Some(12040),
            devices: 2,
        });
        for gpu in 0..2 {
            b.push(&Event::GpuProcesses {
                t: MonoNs(1_100_000_000),
                gpu,
                procs: vec![GpuProc {
                    pid: Pid(if gpu == 0 { 42 } else { 4_000_000 }),
                    ctx: GpuContext::Compute,
                    mem: Some(1 << 30),
                    gi: None,
                    ci: None,
                }],
            });
        }
        let state = |throttle| GpuState {
            throttle: Some(throttle),
            ..Default::default()
        };
        b.push(&Event::GpuState {
            t: MonoNs(1_000_000_000),
            gpu: 0,
            state: state(0),
        });
        b.push(&Event::GpuState {
            t: MonoNs(2_000_000_000),
            gpu: 0,
            state: state(0x40),
        });
        b.push(&Event::GpuUtil {
            t: MonoNs(1_300_000_000),
            gpu: 0,
            samples: vec![
                (wall(1100), 90),
                (wall(1200), 0),
                (wall(1300), 0),
                (wall(1400), 90),
            ],
        });
        let job: BTreeSet<Pid> = [Pid(41), Pid(42)].into();
        let a = b.finish(&GpuInputs {
            header: &h,
            job_pids: &job,
            start: h.start,
            end: MonoNs(4_500_000_000),
            idle_threshold_pct: 5.0,
        });
        assert!(!a.attribution_unavailable);
        assert_eq!(a.job_gpu_pids(), [Pid(42)].into());
        assert!(!a.devices[1].processes[0].in_job);
        let t = &a.devices[0].throttle;
        assert_eq!(t[0].reason, "hw_thermal_slowdown");
        assert!((t[0].seconds - 2.5).abs() < 1e-9);
        assert_eq!(t[0].first, MonoNs(2_000_000_000));
        assert_eq!(a.devices[0].resolution_ns, 100_000_000);
        assert_eq!(a.devices[0].gap_stats.count, 1);
        assert!((a.devices[0].gap_stats.total_s - 0.22).abs() < 1e-6);

        let nobody: BTreeSet<Pid> = [Pid(7)].into();
        let mut b = GpuBuilder::default();
        b.push(&Event::GpuProcesses {
            t: MonoNs(1_100_000_000),
            gpu: 0,
            procs: vec![GpuProc {
                pid: Pid(4_000_000),
                ctx: GpuContext::Compute,
                mem: Some(1 << 30),
                gi: None,
                ci: None,
            }],
        });
        let a = b.finish(&GpuInputs {
            header: &h,
            job_pids: &nobody,
            start: h.start,
            end: MonoNs(2_000_000_000),
            idle_threshold_pct: 5.0,
        });
        assert!(a.attribution_unavailable);
        assert!(a.notes[0].contains("PID namespace"));
    }
}
