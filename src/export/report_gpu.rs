//! The `gpu` and `gpus` sections of `report.json`.

use serde_json::{json, Value};

use super::common::r;
use crate::analysis::gpu::{Gauge, GpuDeviceAnalysis};
use crate::analysis::Analysis;
use crate::event::GpuContext;

/// Driver facts, the idle threshold, attribution and the GPU notes.
pub fn summary(a: &Analysis) -> Value {
    let g = &a.gpu;
    json!({
        "available": g.available,
        "driver_version": g.driver_version,
        "cuda_driver_version": g.cuda_driver_version.map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10)),
        "devices": g.devices.len(),
        "idle_threshold_pct": r(g.idle_threshold_pct, 2),
        "attribution": if g.attribution_unavailable { "unavailable" } else { "by_pid" },
        "notes": g.notes,
    })
}

/// The job's processes on GPU `d`.
fn job_processes(a: &Analysis, d: &GpuDeviceAnalysis) -> Vec<Value> {
    d
        .processes
        .iter()
        .filter(|p| p.in_job)
        .map(|p| {
            let proc_ = a.processes.get(&p.pid);
            json!({
                "pid": p.pid.0,
                "role": proc_.map(|x| x.role),
                "rank": proc_.and_then(|x| x.rank),
                "label": proc_.map(|x| x.label()),
                "command": proc_.map(|x| x.cmdline.clone()),
                "context": match p.ctx { GpuContext::Compute => "compute", GpuContext::Graphics => "graphics" },
                "memory_max_bytes": p.mem_max,
                "sm_pct_mean": p.sm_mean.map(|v| r(v, 2)),
                // Its own idle time, from its utilization samples the same way.
                "idle_s": p.sm_mean.filter(|_| p.sm_s > 0.0).map(|m| r(p.sm_s * (1.0 - m / 100.0), 3)),
                "sampled_s": (p.sm_s > 0.0).then(|| r(p.sm_s, 3)),
                "gpu_instance_id": p.gi,
                "compute_instance_id": p.ci,
                "first_seen_s": r(a.rel_s(p.first_seen).max(0.0), 3),
            })
        })
        .collect()
}

/// GPU `d`'s utilization figures (null without samples).
fn utilization(d: &GpuDeviceAnalysis, period_s: f64) -> Value {
    if d.util_samples == 0 {
        Value::Null
    } else {
        json!({
            "mean_pct": d.util_mean.map(|v| r(v, 2)),
            "p50_pct": d.util_p50.map(|v| r(v, 2)),
            "p95_pct": d.util_p95.map(|v| r(v, 2)),
            "samples": d.util_samples,
            "sample_period_s": r(period_s, 4),
            "source": d.util_source.as_str(),
            "driver_busy_fraction": d.driver_busy_fraction.map(|v| r(v, 4)),
            "sm_active_mean_pct": (!d.sm_active.is_empty()).then(|| r(d.sm_active.mean(), 2)),
            "sampled_from_monotonic_ns": d.sampled.map(|s| s.0 .0),
            "sampled_to_monotonic_ns": d.sampled.map(|s| s.1 .0),
        })
    }
}

fn device(a: &Analysis, d: &GpuDeviceAnalysis) -> Value {
    let dur = a.duration_s().max(1e-9);
    let period_s = d.resolution_ns as f64 / 1e9;
    let sampled_s = d.sampled.map_or(0.0, |(a, b)| b.secs_since(a));
    let utilization = utilization(d, period_s);
    let idle = if d.util_samples == 0 {
        Value::Null
    } else {
        let split = d.idle_split(a.start, a.end);
        json!({
            "total_s": r(split.total_s, 3),
            "share_of_sampled_time": r(split.total_s / sampled_s.max(1e-9), 4),
            "startup_s": r(split.startup_s, 3),
            "steady_s": r(split.steady_s, 3),
            "shutdown_s": r(split.shutdown_s, 3),
            "resolution_s": r(period_s, 4),
            "source": d.util_source.as_str(),
            "method": format!(
                "utilization deficit: each of the {} counts (1 - utilization) of its window as idle",
                d.util_source.describe(d.resolution_ns)
            ),
        })
    };
    let gaps = &d.gap_stats;
    let idle_gaps = if d.util_samples == 0 {
        Value::Null
    } else {
        json!({
            "count": gaps.count,
            "total_s": r(gaps.total_s, 3),
            "median_s": r(gaps.median_s, 4),
            "max_s": r(gaps.max_s, 4),
            "share_of_sampled_time": r(gaps.total_s / sampled_s.max(1e-9), 4),
            "threshold_pct": r(a.gpu.idle_threshold_pct, 2),
            "resolution_s": r(period_s, 4),
        })
    };
    let throttle: Vec<Value> = d
        .throttle
        .iter()
        .map(|t| {
            json!({
                "reason": t.reason,
                "seconds": r(t.seconds, 3),
                "first_active_s": r(a.rel_s(t.first).max(0.0), 3),
                "share_of_run": r(t.seconds / dur, 4),
            })
        })
        .collect();
    let pcie_rate = |g: &Gauge| {
        if g.max.is_none() {
            return Value::Null;
        }
        json!({
            "mean": if g.series.is_empty() { Value::Null } else { r(g.series.mean() / 1000.0, 1) },
            "max": g.max.map(|m| r(m as f64 / 1000.0, 1)),
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
    let processes = job_processes(a, d);
    let others: Vec<&crate::analysis::gpu::GpuProcUse> =
        d.processes.iter().filter(|p| !p.in_job).collect();
    json!({
        "index": d.index,
        "name": d.name,
        "uuid": d.uuid,
        "pci_bus_id": d.pci_bus_id,
        "driver_version": a.gpu.driver_version,
        "mig_enabled": d.mig_enabled,
        "utilization": utilization,
        "busy_fraction": d.busy_fraction.map(|v| r(v, 4)),
        "idle": idle,
        "idle_gaps": idle_gaps,
        "memory": {
            "total_bytes": d.mem_total,
            "used_max_bytes": d.mem_used.max,
            "used_max_share": match (d.mem_used.max, d.mem_total) {
                (Some(u), Some(t)) if t > 0 => r(u as f64 / t as f64, 4),
                _ => Value::Null,
            },
        },
        "temperature_max_c": d.temp_c.max,
        "clocks": {
            "sm_mhz_min": d.sm_mhz.min,
            "sm_mhz_max": d.sm_mhz.max,
            "sm_max_mhz": d.max_sm_mhz,
            "memory_max_mhz": d.max_mem_mhz,
        },
        "power": {
            "max_w": d.power_mw.max.map(|p| r(p as f64 / 1000.0, 1)),
            "limit_w": d.power_limit_mw.max.map(|p| r(p as f64 / 1000.0, 1)),
        },
        "throttle_reasons": throttle,
        "pcie": {
            "gen_current_min": d.pcie_gen.min,
            "gen_max": d.pcie_max_gen,
            "width_current_min": d.pcie_width.min,
            "width_max": d.pcie_max_width,
            "degraded": degraded,
            "tx_mb_per_s": pcie_rate(&d.pcie_tx),
            "rx_mb_per_s": pcie_rate(&d.pcie_rx),
        },
        "processes": processes,
        "other_processes": {
            "count": others.len(),
            "memory_max_bytes": others.iter().filter_map(|p| p.mem_max).sum::<u64>(),
        },
        "unsupported": d.unsupported,
    })
}

/// One entry per GPU.
pub fn devices(a: &Analysis) -> Value {
    Value::Array(a.gpu.devices.iter().map(|d| device(a, d)).collect())
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
