//! The `gpu` and `gpus` sections of `report.json`.

use super::common::rn;
use super::report_schema as t;
use crate::analysis::gpu::{Gauge, GpuDeviceAnalysis};
use crate::analysis::Analysis;
use crate::event::GpuContext;

/// Driver facts, the idle threshold, attribution and the GPU notes.
pub fn summary(a: &Analysis) -> t::GpuSummary {
    let g = &a.gpu;
    t::GpuSummary {
        available: g.available,
        driver_version: g.driver_version.clone(),
        cuda_driver_version: g
            .cuda_driver_version
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10)),
        devices: g.devices.len() as u64,
        idle_threshold_pct: rn(g.idle_threshold_pct, 2),
        attribution: if g.attribution_unavailable {
            "unavailable"
        } else {
            "by_pid"
        }
        .into(),
        notes: g.notes.clone(),
    }
}

/// The job's processes on GPU `d`.
fn job_processes(a: &Analysis, d: &GpuDeviceAnalysis) -> Vec<t::GpuProcessEntry> {
    d.processes
        .iter()
        .filter(|p| p.in_job)
        .map(|p| {
            let proc_ = a.processes.get(&p.pid);
            t::GpuProcessEntry {
                pid: p.pid.0,
                role: proc_.map(|x| t::name_of(&x.role)),
                rank: proc_.and_then(|x| x.rank),
                label: proc_.map(|x| x.label()),
                command: proc_.map(|x| x.cmdline.clone()),
                context: match p.ctx {
                    GpuContext::Compute => "compute",
                    GpuContext::Graphics => "graphics",
                }
                .into(),
                memory_max_bytes: p.mem_max,
                sm_pct_mean: p.sm_mean.map(|v| rn(v, 2)),
                // Its own idle time, from its utilization samples the same way.
                idle_s: p
                    .sm_mean
                    .filter(|_| p.sm_s > 0.0)
                    .map(|m| rn(p.sm_s * (1.0 - m / 100.0), 3)),
                sampled_s: (p.sm_s > 0.0).then(|| rn(p.sm_s, 3)),
                gpu_instance_id: p.gi,
                compute_instance_id: p.ci,
                first_seen_s: rn(a.rel_s(p.first_seen).max(0.0), 3),
            }
        })
        .collect()
}

/// GPU `d`'s utilization figures (null without samples).
fn utilization(d: &GpuDeviceAnalysis, period_s: f64) -> Option<t::GpuUtilization> {
    (d.util_samples != 0).then(|| t::GpuUtilization {
        mean_pct: d.util_mean.map(|v| rn(v, 2)),
        p50_pct: d.util_p50.map(|v| rn(v, 2)),
        p95_pct: d.util_p95.map(|v| rn(v, 2)),
        samples: d.util_samples,
        sample_period_s: rn(period_s, 4),
        source: d.util_source.as_str().into(),
        driver_busy_fraction: d.driver_busy_fraction.map(|v| rn(v, 4)),
        sm_active_mean_pct: (!d.sm_active.is_empty()).then(|| rn(d.sm_active.mean(), 2)),
        sampled_from_monotonic_ns: d.sampled.map(|s| s.0 .0),
        sampled_to_monotonic_ns: d.sampled.map(|s| s.1 .0),
    })
}

fn device(a: &Analysis, d: &GpuDeviceAnalysis) -> t::GpuDevice {
    let dur = a.duration_s().max(1e-9);
    let period_s = d.resolution_ns as f64 / 1e9;
    let sampled_s = d.sampled.map_or(0.0, |(a, b)| b.secs_since(a));
    let utilization = utilization(d, period_s);
    let idle = (d.util_samples != 0).then(|| {
        let split = d.idle_split(a.start, a.end);
        t::GpuIdle {
            total_s: rn(split.total_s, 3),
            share_of_sampled_time: rn(split.total_s / sampled_s.max(1e-9), 4),
            startup_s: rn(split.startup_s, 3),
            steady_s: rn(split.steady_s, 3),
            shutdown_s: rn(split.shutdown_s, 3),
            resolution_s: rn(period_s, 4),
            source: d.util_source.as_str().into(),
            method: format!(
                "utilization deficit: each of the {} counts (1 - utilization) of its window as idle",
                d.util_source.describe(d.resolution_ns)
            ),
        }
    });
    let gaps = &d.gap_stats;
    let idle_gaps = (d.util_samples != 0).then(|| t::GpuIdleGaps {
        count: gaps.count as u64,
        total_s: rn(gaps.total_s, 3),
        median_s: rn(gaps.median_s, 4),
        max_s: rn(gaps.max_s, 4),
        share_of_sampled_time: rn(gaps.total_s / sampled_s.max(1e-9), 4),
        threshold_pct: rn(a.gpu.idle_threshold_pct, 2),
        resolution_s: rn(period_s, 4),
    });
    let throttle = d
        .throttle
        .iter()
        .map(|th| t::Throttle {
            reason: th.reason.clone(),
            seconds: rn(th.seconds, 3),
            first_active_s: rn(a.rel_s(th.first).max(0.0), 3),
            share_of_run: rn(th.seconds / dur, 4),
        })
        .collect();
    let pcie_rate = |g: &Gauge| {
        g.max.is_some().then(|| t::PcieRate {
            mean: (!g.series.is_empty()).then(|| rn(g.series.mean() / 1000.0, 1)),
            max: g.max.map(|m| rn(m as f64 / 1000.0, 1)),
        })
    };
    let degraded = match (
        d.pcie_gen.min,
        d.pcie_max_gen,
        d.pcie_width.min,
        d.pcie_max_width,
    ) {
        (Some(g), Some(mg), Some(w), Some(mw)) => Some(g < mg as u64 || w < mw as u64),
        _ => None,
    };
    let others: Vec<&crate::analysis::gpu::GpuProcUse> =
        d.processes.iter().filter(|p| !p.in_job).collect();
    t::GpuDevice {
        index: d.index,
        name: d.name.clone(),
        uuid: d.uuid.clone(),
        pci_bus_id: d.pci_bus_id.clone(),
        driver_version: a.gpu.driver_version.clone(),
        mig_enabled: d.mig_enabled,
        utilization,
        busy_fraction: d.busy_fraction.map(|v| rn(v, 4)),
        idle,
        idle_gaps,
        memory: t::GpuMemory {
            total_bytes: d.mem_total,
            used_max_bytes: d.mem_used.max,
            used_max_share: match (d.mem_used.max, d.mem_total) {
                (Some(u), Some(t)) if t > 0 => Some(rn(u as f64 / t as f64, 4)),
                _ => None,
            },
        },
        temperature_max_c: d.temp_c.max,
        clocks: t::GpuClocks {
            sm_mhz_min: d.sm_mhz.min,
            sm_mhz_max: d.sm_mhz.max,
            sm_max_mhz: d.max_sm_mhz,
            memory_max_mhz: d.max_mem_mhz,
        },
        power: t::GpuPower {
            max_w: d.power_mw.max.map(|p| rn(p as f64 / 1000.0, 1)),
            limit_w: d.power_limit_mw.max.map(|p| rn(p as f64 / 1000.0, 1)),
        },
        throttle_reasons: throttle,
        throttle_reasons_omitted: None,
        pcie: t::Pcie {
            gen_current_min: d.pcie_gen.min,
            gen_max: d.pcie_max_gen,
            width_current_min: d.pcie_width.min,
            width_max: d.pcie_max_width,
            degraded,
            tx_mb_per_s: pcie_rate(&d.pcie_tx),
            rx_mb_per_s: pcie_rate(&d.pcie_rx),
        },
        processes: job_processes(a, d),
        processes_omitted: None,
        other_processes: t::OtherGpuProcesses {
            count: others.len() as u64,
            memory_max_bytes: others.iter().filter_map(|p| p.mem_max).sum::<u64>(),
        },
        unsupported: d.unsupported.clone(),
    }
}

/// One entry per GPU.
pub fn devices(a: &Analysis) -> Vec<t::GpuDevice> {
    a.gpu.devices.iter().map(|d| device(a, d)).collect()
}

/// One line per GPU for the summary.
pub fn summary_lines(a: &Analysis) -> Vec<String> {
    let g = &a.gpu;
    let mut out = Vec::new();
    if !g.available {
        if let Some(c) = a.coverage.get("gpu") {
            out.push(format!("No GPU metrics: {}.", c.detail));
        }
        return out;
    }
    for d in &g.devices {
        let used_by: Vec<String> = d
            .processes
            .iter()
            .filter(|p| p.in_job)
            .map(|p| {
                let mut what: Vec<String> = Vec::new();
                if let Some(r) = a.processes.get(&p.pid).and_then(|x| x.rank) {
                    what.push(format!("rank {r}"));
                }
                if let Some(m) = p.mem_max {
                    what.push(crate::units::bytes(m as f64));
                }
                if what.is_empty() {
                    p.pid.to_string()
                } else {
                    format!("{} ({})", p.pid, what.join(", "))
                }
            })
            .collect();
        let who = if used_by.is_empty() {
            "no job process on it".to_string()
        } else {
            format!("used by {}", used_by.join(", "))
        };
        let busy = match d.busy_fraction {
            Some(b) => {
                let split = d.idle_split(a.start, a.end);
                let sampled_s = d.sampled.map_or(0.0, |(x, y)| y.secs_since(x));
                format!(
                    "busy {:.0}% of the sampled {:.1} s; idle {:.1} s (utilization deficit of {}: start-up {:.1} s, steady state {:.1} s, shutdown {:.1} s); {} fully idle {} totalling {:.1} s (median {:.0} ms, longest {:.0} ms)",
                    b * 100.0,
                    sampled_s,
                    split.total_s,
                    d.util_source.describe(d.resolution_ns),
                    split.startup_s,
                    split.steady_s,
                    split.shutdown_s,
                    d.gap_stats.count,
                    if d.gap_stats.count == 1 { "gap" } else { "gaps" },
                    d.gap_stats.total_s,
                    d.gap_stats.median_s * 1e3,
                    d.gap_stats.max_s * 1e3,
                )
            }
            None => "utilization not available".into(),
        };
        let mut line = format!("{}: {busy}; {who}", super::trace_gpu::gpu_label(d));
        let throttled: Vec<String> = d
            .throttle
            .iter()
            .filter(|t| t.reason != "gpu_idle" && t.reason != "applications_clocks_setting")
            .map(|t| format!("{} {:.1} s", t.reason, t.seconds))
            .collect();
        if !throttled.is_empty() {
            line.push_str(&format!("; clocks limited: {}", throttled.join(", ")));
        }
        out.push(format!("{line}."));
    }
    out.extend(
        g.notes
            .iter()
            .filter(|n| n.contains("attribution"))
            .cloned(),
    );
    out
}
