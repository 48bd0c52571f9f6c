//! The GPU part of the Chrome trace.
//!
//! One trace process per GPU ("GPU 0: NVIDIA H100 … (…6b51)") with counter
//! tracks for utilization, idle share (100 − utilization: the share of
//! each driver sample during which no kernel ran — what idle time is
//! measured from), memory, clocks, temperature, power and limit, PCIe link
//! and throughput; fully idle gaps as slices on their own "GPU idle"
//! thread (gaps never overlap, so they nest trivially and never interleave
//! with anything else); clock-event reasons as slices on one thread per
//! reason. Each job process on a GPU gets "GPU SM %" and "GPU memory MB"
//! counters on its own trace process (its real PID), lined up with its
//! threads' CPU tracks.

use std::io::{self, Write};

use serde_json::json;

use crate::analysis::gpu::{GpuDeviceAnalysis, THROTTLE_REASONS};
use crate::analysis::Analysis;

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

pub fn write_gpus<W: Write>(a: &Analysis, tw: &mut TraceWriter<W>) -> io::Result<()> {
    for d in &a.gpu.devices {
        let pid = GPU_PID_BASE + d.index as i64;
        tw.process_name(pid, &gpu_label(d), 4000 + d.index as i64)?;

        // Counters; each is bounded (neighbouring points merged on long runs).
        tw.counter(pid, "utilization %", &d.util, 1.0)?;
        let mut idle = crate::analysis::Series::with_cap(d.util.points().len().max(2));
        for p in d.util.points() {
            idle.push(p.t0, p.t1, 100.0 - p.v);
        }
        tw.counter(pid, "idle %", &idle, 1.0)?;
        tw.counter(pid, "memory used GB", &d.mem_used.series, 1e-9)?;
        tw.counter(pid, "SM clock MHz", &d.sm_mhz.series, 1.0)?;
        tw.counter(pid, "memory clock MHz", &d.mem_mhz.series, 1.0)?;
        tw.counter(pid, "temperature °C", &d.temp_c.series, 1.0)?;
        tw.counter(pid, "power W", &d.power_mw.series, 1e-3)?;
        tw.counter(pid, "power limit W", &d.power_limit_mw.series, 1e-3)?;
        tw.counter(pid, "PCIe link gen", &d.pcie_gen.series, 1.0)?;
        tw.counter(pid, "PCIe link width", &d.pcie_width.series, 1.0)?;
        tw.counter(pid, "PCIe tx MB/s", &d.pcie_tx.series, 1e-3)?;
        tw.counter(pid, "PCIe rx MB/s", &d.pcie_rx.series, 1e-3)?;

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
        for t in &d.throttle {
            let k = THROTTLE_REASONS
                .iter()
                .position(|r| r.1 == t.reason)
                .unwrap_or(THROTTLE_REASONS.len());
            let tid = THROTTLE_TID_BASE + k as i64;
            tw.thread_name(pid, tid, &format!("clocks: {}", t.reason), 10 + k as i64)?;
            for &(s, e) in &t.runs {
                tw.slice(pid, tid, &t.reason, s, e, None)?;
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
            tw.counter(ppid, &format!("GPU SM %{suffix}"), &p.sm, 1.0)?;
            tw.counter(ppid, &format!("GPU memory MB{suffix}"), &p.mem, 1e-6)?;
        }
    }
    Ok(())
}
