//! The GPU part of the Chrome trace: the first priority class of the size
//! budget, and the first tracks in the view.
//!
//! One trace process per GPU ("GPU 0: NVIDIA H100 … (…6b51)") with counter
//! tracks for utilization, idle share (100 − utilization: the share of
//! each driver sample during which no kernel ran — what idle time is
//! measured from), memory, clocks, temperature, power and limit, PCIe link
//! and throughput; fully idle gaps as slices on their own "GPU idle"
//! thread (gaps never overlap, so they nest trivially and never interleave
//! with anything else), significant ones with their CPU causes nested
//! under them and linked by flows to the stack slices they name (see
//! `trace_stacks`); clock-event reasons as slices on one thread per
//! reason. Each job process on a GPU gets "GPU SM %" and "GPU memory MB"
//! counters on its own trace process (its real PID), lined up with its
//! threads' CPU tracks.
//!
//! Reduction levels (only when everything of lower priority is at its
//! coarsest): counters merge neighbouring points; idle gaps closer than
//! the driver's sample period × 2^(level-1) merge into one slice that says
//! how many gaps it holds and their idle share; fewer gaps get causes.

use std::collections::HashMap;
use std::io::{self, Write};

use serde_json::json;

use super::trace_budget::{Class, Part};
use super::trace_gaps::{spans, GAPS_PART, MAX_CAUSE_SPANS};
use super::trace_ids::{GPU_PID_BASE, SORT_GPU};
use super::trace_stacks::{cause_spans, Context, GapCauses};
use super::trace_writer::{merge_gap, TraceWriter};
use crate::analysis::gpu::{GpuDeviceAnalysis, THROTTLE_REASONS};
use crate::analysis::Analysis;
use crate::event::MonoNs;

const IDLE_TID: i64 = 1;
const THROTTLE_TID_BASE: i64 = 100;

const COUNTER_MAX: u32 = 14;

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

fn pid_of(d: &GpuDeviceAnalysis) -> i64 {
    GPU_PID_BASE + d.index as i64
}

/// GPU processes, named and sorted before every process of the job.
pub fn write_names<W: Write>(a: &Analysis, tw: &mut TraceWriter<W>) -> io::Result<()> {
    for d in &a.gpu.devices {
        let pid = pid_of(d);
        tw.process_name(pid, &gpu_label(d), SORT_GPU + d.index as i64)?;
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
        for t in &d.throttle {
            let k = throttle_index(&t.reason);
            tw.thread_name(
                pid,
                THROTTLE_TID_BASE + k as i64,
                &format!("clocks: {}", t.reason),
                10 + k as i64,
            )?;
        }
    }
    Ok(())
}

fn throttle_index(reason: &str) -> usize {
    THROTTLE_REASONS
        .iter()
        .position(|r| r.1 == reason)
        .unwrap_or(THROTTLE_REASONS.len())
}

/// The GPU parts of the trace (all in the first priority class).
pub fn parts<'a>(a: &'a Analysis, ctx: &'a Context<'a>) -> Vec<Part<'a>> {
    if a.gpu.devices.is_empty() {
        return Vec::new();
    }
    let counters = Part {
        class: Class::Gpu,
        name: "GPU counters".into(),
        max_level: COUNTER_MAX,
        floor_level: 0,
        write: Box::new(move |level, tw| {
            for d in &a.gpu.devices {
                write_counters(a, d, level, tw)?;
            }
            Ok((level > 0).then(|| {
                format!(
                    "groups of {} neighbouring points merged into their time-weighted mean",
                    1u64 << level
                )
            }))
        }),
    };
    let run = a.end.0.saturating_sub(a.start.0);
    let res = a
        .gpu
        .devices
        .iter()
        .map(|d| d.resolution_ns.max(1))
        .min()
        .unwrap_or(1);
    let gap_max = (0..62).find(|l| merge_gap(res, *l) > run).unwrap_or(62);
    let gaps = Part {
        class: Class::Gpu,
        name: GAPS_PART.into(),
        max_level: gap_max.max(12),
        floor_level: 0,
        write: Box::new(move |level, tw| {
            let mut merged = 0usize;
            let mut with_causes = 0usize;
            for d in &a.gpu.devices {
                let (m, c) = write_gaps(ctx, d, level, tw)?;
                merged += m;
                with_causes += c;
            }
            Ok((level > 0).then(|| {
                format!(
                    "gaps less than {:.0} ms apart merged ({merged} merged slices, each with its \
                     gap count and idle share); causes for the {} longest gaps per GPU ({with_causes} in all)",
                    merge_gap(res, level) as f64 / 1e6,
                    MAX_CAUSE_SPANS >> level.min(20)
                )
            }))
        }),
    };
    let clocks = Part {
        class: Class::Gpu,
        name: "GPU clock-event reasons".into(),
        max_level: gap_max,
        floor_level: 0,
        write: Box::new(move |level, tw| {
            for d in &a.gpu.devices {
                let gap = merge_gap(d.resolution_ns.max(1), level);
                for t in &d.throttle {
                    let tid = THROTTLE_TID_BASE + throttle_index(&t.reason) as i64;
                    let mut cur: Option<(MonoNs, MonoNs, u64, usize)> = None;
                    for &(s, e) in &t.runs {
                        let len = e.0.saturating_sub(s.0);
                        cur = match cur {
                            Some((a0, a1, ns, n)) if gap > 0 && s.0.saturating_sub(a1.0) < gap => {
                                Some((a0, a1.max(e), ns + len, n + 1))
                            }
                            Some(run) => {
                                write_run(tw, pid_of(d), tid, &t.reason, run)?;
                                Some((s, e, len, 1))
                            }
                            None => Some((s, e, len, 1)),
                        };
                    }
                    if let Some(run) = cur {
                        write_run(tw, pid_of(d), tid, &t.reason, run)?;
                    }
                }
            }
            Ok((level > 0).then(|| "neighbouring runs of a reason merged".to_string()))
        }),
    };
    vec![counters, gaps, clocks]
}

fn write_run(
    tw: &mut TraceWriter<&mut dyn Write>,
    pid: i64,
    tid: i64,
    reason: &str,
    (s, e, ns, n): (MonoNs, MonoNs, u64, usize),
) -> io::Result<()> {
    if n == 1 {
        return tw.slice(pid, tid, reason, s, e, None);
    }
    let span = e.0.saturating_sub(s.0).max(1);
    let args = json!({"runs": n, "active_pct": (ns as f64 / span as f64 * 1000.0).round() / 10.0});
    tw.slice_flow(
        pid,
        tid,
        &format!("{reason} (merged)"),
        s,
        e,
        Some(&args),
        None,
    )
}

fn write_counters(
    a: &Analysis,
    d: &GpuDeviceAnalysis,
    level: u32,
    tw: &mut TraceWriter<&mut dyn Write>,
) -> io::Result<()> {
    let pid = pid_of(d);
    let mut c = |name: &str, s: &crate::analysis::Series, scale: f64| {
        tw.counter_at(pid, name, s, scale, level, None)
    };
    c("utilization %", &d.util, 1.0)?;
    let mut idle = crate::analysis::Series::with_cap(d.util.points().len().max(2));
    for p in d.util.points() {
        idle.push(p.t0, p.t1, 100.0 - p.v);
    }
    c("idle %", &idle, 1.0)?;
    c("memory used GB", &d.mem_used.series, 1e-9)?;
    c("SM clock MHz", &d.sm_mhz.series, 1.0)?;
    c("memory clock MHz", &d.mem_mhz.series, 1.0)?;
    c("temperature °C", &d.temp_c.series, 1.0)?;
    c("power W", &d.power_mw.series, 1e-3)?;
    c("power limit W", &d.power_limit_mw.series, 1e-3)?;
    c("PCIe link gen", &d.pcie_gen.series, 1.0)?;
    c("PCIe link width", &d.pcie_width.series, 1.0)?;
    c("PCIe tx MB/s", &d.pcie_tx.series, 1e-3)?;
    c("PCIe rx MB/s", &d.pcie_rx.series, 1e-3)?;

    // Per job process: SM % and memory on the process's own track, ending
    // when the process left the GPU.
    let on_gpus = |p: crate::event::Pid| {
        a.gpu
            .devices
            .iter()
            .filter(|d| d.processes.iter().any(|x| x.pid == p && x.in_job))
            .count()
    };
    for p in d.processes.iter().filter(|p| p.in_job) {
        let ppid = p.pid.0 as i64;
        let prefix = if on_gpus(p.pid) > 1 {
            format!("GPU {} ", d.index)
        } else {
            "GPU ".to_string()
        };
        let left = (p.last_seen < a.end).then_some(p.last_seen);
        tw.counter_at(ppid, &format!("{prefix}SM %"), &p.sm, 1.0, level, left)?;
        tw.counter_at(
            ppid,
            &format!("{prefix}memory MB"),
            &p.mem,
            1e-6,
            level,
            left,
        )?;
    }
    Ok(())
}

/// Idle gaps (merged at `level`), significant ones with their causes.
/// Returns (merged slices, gaps with causes).
fn write_gaps(
    ctx: &Context,
    d: &GpuDeviceAnalysis,
    level: u32,
    tw: &mut TraceWriter<&mut dyn Write>,
) -> io::Result<(usize, usize)> {
    let pid = pid_of(d);
    let res_ms = (d.resolution_ns as f64 / 1e5).round() / 10.0;
    let causes: HashMap<MonoNs, GapCauses> = cause_spans(ctx, d, level)
        .into_iter()
        .map(|(s, c)| (s.start, c))
        .collect();
    let mut merged = 0;
    for sp in spans(d, level) {
        let len = sp.end.0.saturating_sub(sp.start.0);
        let mut args = json!({
            "idle_ms": (sp.idle_ns as f64 / 1e5).round() / 10.0,
            "resolution_ms": res_ms,
        });
        let name = if sp.gaps > 1 {
            merged += 1;
            args["gaps"] = json!(sp.gaps);
            args["span_ms"] = json!((len as f64 / 1e5).round() / 10.0);
            args["idle_pct"] =
                json!((sp.idle_ns as f64 / len.max(1) as f64 * 1000.0).round() / 10.0);
            "GPU idle (merged)"
        } else {
            "GPU idle"
        };
        if let Some(w) = super::trace_waits::during(ctx.a, sp.start, sp.end) {
            args["loop_waiting"] = w;
        }
        let c = causes.get(&sp.start);
        if let Some(c) = c {
            if let (Some(o), Some(extra)) = (args.as_object_mut(), ctx.gap_args(c).as_object()) {
                o.extend(extra.clone());
            }
        }
        tw.slice_flow(pid, IDLE_TID, name, sp.start, sp.end, Some(&args), None)?;
        let Some(c) = c else { continue };
        for i in 0..c.threads.len() {
            let (cname, mut cargs) = ctx.cause_slice(c, i);
            let link = ctx.link(d.index, sp.start, i);
            let start = link
                .as_ref()
                .map_or(Context::cause_start(sp.start, i), |l| l.start);
            let flow = link.as_ref().and_then(|l| l.flow);
            if let Some(l) = &link {
                if !l.target.is_null() {
                    cargs["linked_slice"] = l.target.clone();
                }
            }
            if ctx.preparing() {
                ctx.reserve_link(tw);
            }
            tw.slice_flow(pid, IDLE_TID, &cname, start, sp.end, Some(&cargs), flow)?;
        }
    }
    Ok((merged, causes.len()))
}
