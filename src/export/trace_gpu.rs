//! The GPU part of the Chrome trace.
//!
//! One trace process per GPU ("GPU 0: NVIDIA H100 … (…6b51)") with counter
//! tracks for utilization, memory, clocks, temperature, power and limit,
//! PCIe link and throughput; idle gaps as slices on their own "GPU idle"
//! thread (gaps never overlap, so they nest trivially and never interleave
//! with anything else); clock-event reasons as slices on one thread per
//! reason. Each job process on a GPU gets "GPU SM %" and "GPU memory MB"
//! counters on its own trace process (its real PID), lined up with its
//! threads' CPU tracks.

use std::io::{self, Write};

use serde_json::json;

use crate::analysis::gpu::{GpuDeviceAnalysis, THROTTLE_REASONS};
use crate::analysis::Analysis;
use crate::event::{GpuState, MonoNs};

use super::trace::TraceWriter;

/// Synthetic trace PIDs of GPUs: above the kernel's PID_MAX_LIMIT and apart
/// from the system process.
pub const GPU_PID_BASE: i64 = 0x7100_0000;
const IDLE_TID: i64 = 1;
const THROTTLE_TID_BASE: i64 = 100;

/// "GPU 0: NVIDIA H100 80GB HBM3 (…6b51)".
pub fn gpu_label(d: &GpuDeviceAnalysis) -> String {
    let tail: String = d
        .uuid
        .chars()
        .rev()
        .take(4)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    if tail.is_empty() {
        format!("GPU {}: {}", d.index, d.name)
    } else {
        format!("GPU {}: {} (…{})", d.index, d.name, tail)
    }
}

/// A counter from step values (each holds until the next), repeated values
/// skipped, ended at `end`.
fn step_counter<W: Write>(
    tw: &mut TraceWriter<W>,
    pid: i64,
    name: &str,
    points: impl Iterator<Item = (MonoNs, Option<f64>)>,
    end: MonoNs,
) -> io::Result<()> {
    let mut last: Option<f64> = None;
    for (t, v) in points {
        let Some(v) = v else { continue };
        if last != Some(v) {
            tw.counter_value(pid, name, t, v)?;
            last = Some(v);
        }
    }
    if let Some(v) = last {
        tw.counter_value(pid, name, end, v)?;
    }
    Ok(())
}

fn state_counter<W: Write>(
    tw: &mut TraceWriter<W>,
    pid: i64,
    name: &str,
    d: &GpuDeviceAnalysis,
    start: MonoNs,
    end: MonoNs,
    f: impl Fn(&GpuState) -> Option<f64>,
) -> io::Result<()> {
    step_counter(
        tw,
        pid,
        name,
        d.states.iter().map(|(t, s)| ((*t).max(start), f(s))),
        end,
    )
}

pub fn write_gpus<W: Write>(a: &Analysis, tw: &mut TraceWriter<W>) -> io::Result<()> {
    let (start, end) = (a.start, a.end);
    for d in &a.gpu.devices {
        let pid = GPU_PID_BASE + d.index as i64;
        tw.process_name(pid, &gpu_label(d), 4000 + d.index as i64)?;

        // Utilization: each sample's value over its window.
        let mut prev_end: Option<MonoNs> = None;
        let mut last: Option<u32> = None;
        for w in &d.util {
            if prev_end.is_some_and(|e| w.start.0 > e.0 + d.resolution_ns / 2) {
                // A hole in the driver's history: show it as unknown (0)
                // rather than stretching the previous value.
                tw.counter_value(pid, "utilization %", prev_end.unwrap_or(w.start), 0.0)?;
                last = None;
            }
            if last != Some(w.pct) {
                tw.counter_value(pid, "utilization %", w.start, w.pct as f64)?;
                last = Some(w.pct);
            }
            prev_end = Some(w.end);
        }
        if let (Some(e), Some(v)) = (prev_end, last) {
            tw.counter_value(pid, "utilization %", e, v as f64)?;
        }

        state_counter(tw, pid, "memory used GB", d, start, end, |s| {
            s.mem_used
                .map(|b| (b as f64 / 1e9 * 1000.0).round() / 1000.0)
        })?;
        state_counter(tw, pid, "SM clock MHz", d, start, end, |s| {
            s.sm_mhz.map(f64::from)
        })?;
        state_counter(tw, pid, "memory clock MHz", d, start, end, |s| {
            s.mem_mhz.map(f64::from)
        })?;
        state_counter(tw, pid, "temperature °C", d, start, end, |s| {
            s.temp_c.map(f64::from)
        })?;
        state_counter(tw, pid, "power W", d, start, end, |s| {
            s.power_mw.map(|p| p as f64 / 1000.0)
        })?;
        state_counter(tw, pid, "power limit W", d, start, end, |s| {
            s.power_limit_mw.map(|p| p as f64 / 1000.0)
        })?;
        state_counter(tw, pid, "PCIe link gen", d, start, end, |s| {
            s.pcie_gen.map(f64::from)
        })?;
        state_counter(tw, pid, "PCIe link width", d, start, end, |s| {
            s.pcie_width.map(f64::from)
        })?;
        step_counter(
            tw,
            pid,
            "PCIe tx MB/s",
            d.pcie.iter().map(|p| (p.0, Some(p.1 as f64 / 1000.0))),
            end,
        )?;
        step_counter(
            tw,
            pid,
            "PCIe rx MB/s",
            d.pcie.iter().map(|p| (p.0, Some(p.2 as f64 / 1000.0))),
            end,
        )?;

        // Idle gaps on their own thread.
        tw.thread_name(
            pid,
            IDLE_TID,
            &format!(
                "GPU idle (≤{}%, resolution {:.0} ms)",
                a.gpu.idle_threshold_pct,
                d.resolution_ns as f64 / 1e6
            ),
            0,
        )?;
        for &(s, e) in &d.idle_gaps {
            tw.slice(
                pid,
                IDLE_TID,
                "GPU idle",
                s,
                e,
                Some(json!({
                    "duration_ms": ((e.0 - s.0) as f64 / 1e5).round() / 10.0,
                    "resolution_ms": (d.resolution_ns as f64 / 1e5).round() / 10.0,
                })),
            )?;
        }

        // Clock-event reasons: one thread per reason, a slice while active.
        for (k, &(bit, name)) in THROTTLE_REASONS.iter().enumerate() {
            let mut open: Option<MonoNs> = None;
            let mut runs: Vec<(MonoNs, MonoNs)> = Vec::new();
            for (t, s) in &d.states {
                let t = (*t).clamp(start, end);
                let on = s.throttle.is_some_and(|b| b & bit != 0);
                match (on, open) {
                    (true, None) => open = Some(t),
                    (false, Some(o)) => {
                        runs.push((o, t));
                        open = None;
                    }
                    _ => {}
                }
            }
            if let Some(o) = open {
                runs.push((o, end));
            }
            if runs.is_empty() {
                continue;
            }
            let tid = THROTTLE_TID_BASE + k as i64;
            tw.thread_name(pid, tid, &format!("clocks: {name}"), 10 + k as i64)?;
            for (s, e) in runs {
                tw.slice(pid, tid, name, s, e, None)?;
            }
        }

        // Per job process: SM % and memory on the process's own track.
        let on_gpus = |p: crate::event::Pid| {
            a.gpu
                .devices
                .iter()
                .filter(|d| d.processes.iter().any(|x| x.pid == p && x.in_job))
                .count()
        };
        for p in d.processes.iter().filter(|p| p.in_job) {
            let ppid = p.pid.0 as i64;
            let suffix = if on_gpus(p.pid) > 1 {
                format!(" (GPU {})", d.index)
            } else {
                String::new()
            };
            step_counter(
                tw,
                ppid,
                &format!("GPU SM %{suffix}"),
                p.sm.iter().map(|s| (s.0, Some(s.1 as f64))),
                p.last_seen.max(p.sm.last().map(|s| s.0).unwrap_or(start)),
            )?;
            step_counter(
                tw,
                ppid,
                &format!("GPU memory MB{suffix}"),
                p.mem
                    .iter()
                    .map(|m| (m.0.max(start), Some((m.1 as f64 / 1e6).round()))),
                end,
            )?;
        }
    }
    Ok(())
}
