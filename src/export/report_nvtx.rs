//! The NVTX part of report.json and of the summary.

use crate::analysis::nvtx::RangeGroup;
use crate::analysis::Analysis;

use super::common::rn;
use super::report_schema::{self as t, json_of};

/// Range names listed in report.json at most (most total time first).
pub const REPORT_MAX_GROUPS: usize = 200;

fn group_json(g: &RangeGroup) -> t::NvtxGroup {
    t::NvtxGroup {
        domain: g.domain.clone(),
        name: g.name.clone(),
        distinct_names: g.distinct_names as u64,
        count: g.count,
        total_s: rn(g.total_s, 6),
        mean_s: rn(g.mean_s, 6),
        p50_s: g.p50_s.map(|v| rn(v, 6)),
        p95_s: g.p95_s.map(|v| rn(v, 6)),
        max_s: rn(g.max_s, 6),
        quantiles_from: g.quantiles_from,
        gpu_busy_share: g.gpu_busy_share.map(|v| rn(v, 4)),
        level: json_of(&g.level),
        processes: g.processes as u64,
        threads: g.threads as u64,
        open: g.open,
    }
}

/// `nvtx` in report.json.
pub fn nvtx(a: &Analysis) -> t::Nvtx {
    let n = &a.nvtx;
    let threads: std::collections::BTreeSet<_> = n.ranges.iter().map(|r| (r.pid, r.tid)).collect();
    t::Nvtx {
        captured: n.captured(),
        detail: n.coverage.as_ref().map(|c| c.detail.clone()),
        processes: n.processes.len() as u64,
        threads: threads.len() as u64,
        ranges: n.ranges.len() as u64,
        marks: n.marks.len() as u64,
        domains: n
            .domains
            .iter()
            .filter(|d| !d.is_empty())
            .cloned()
            .collect(),
        ranges_by_name: n
            .groups
            .iter()
            .take(REPORT_MAX_GROUPS)
            .map(group_json)
            .collect(),
        names_left_out: n.groups.len().saturating_sub(REPORT_MAX_GROUPS) as u64,
        recording: t::NvtxRecording {
            lost_in_job: n.stats.lost_in_job,
            over_budget: n.stats.over_budget,
            unmatched: n.stats.unmatched,
            bad_rings: n.stats.bad_rings,
            not_kept_in_analysis: n.not_kept_in_analysis,
        },
    }
}

fn dur(s: f64) -> String {
    if s >= 10.0 {
        format!("{s:.1} s")
    } else if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

/// Summary lines: the ranges with the most time.
pub fn summary_lines(a: &Analysis) -> Vec<String> {
    let n = &a.nvtx;
    let mut out = Vec::new();
    if n.ranges.is_empty() && n.stats.over_budget == 0 {
        return out;
    }
    for g in n.groups.iter().take(6) {
        let label = if g.domain.is_empty() {
            format!("`{}`", g.name)
        } else {
            format!("`{}: {}`", g.domain, g.name)
        };
        let q = match (g.p50_s, g.p95_s) {
            (Some(p50), Some(p95)) => format!(
                " (p50 {}, p95 {}, max {})",
                dur(p50),
                dur(p95),
                dur(g.max_s)
            ),
            _ => format!(" (max {})", dur(g.max_s)),
        };
        let busy = g
            .gpu_busy_share
            .map(|b| format!("; GPU busy {:.0}% inside", b * 100.0))
            .unwrap_or_default();
        out.push(format!(
            "{label}: {} × mean {}{q}, {} in total{busy}.",
            g.count,
            dur(g.mean_s),
            dur(g.total_s)
        ));
    }
    if n.groups.len() > 6 {
        out.push(format!(
            "{} more range names in report.json (`nvtx.ranges_by_name`).",
            n.groups.len() - 6
        ));
    }
    if n.stats.lost_in_job > 0 {
        out.push(format!(
            "{} NVTX records were dropped in the job because gpuprof's reader fell behind (figures above miss them).",
            n.stats.lost_in_job
        ));
    }
    if n.stats.over_budget > 0 {
        out.push(format!(
            "{} ranges were kept as per-name totals only (over the recording's detail budget): counts and totals include them, p50/p95 do not.",
            n.stats.over_budget
        ));
    }
    out
}

/// `steps` in report.json.
pub fn steps(a: &Analysis) -> t::Steps {
    let s = &a.steps;
    let dist = |d: &Option<crate::analysis::steps::Dist>| {
        d.as_ref().map(|d| t::StepDist {
            mean_s: rn(d.mean_s, 6),
            p50_s: rn(d.p50_s, 6),
            p90_s: rn(d.p90_s, 6),
            p95_s: rn(d.p95_s, 6),
            p99_s: rn(d.p99_s, 6),
            min_s: rn(d.min_s, 6),
            max_s: rn(d.max_s, 6),
        })
    };
    t::Steps {
        method: s.method.clone(),
        how: s.how.clone(),
        name: s.name.clone(),
        pid: s.pid,
        tid: s.tid,
        count: s.count as u64,
        steps_per_s: s.steps_per_s.map(|v| rn(v, 4)),
        time: dist(&s.time),
        range_time: dist(&s.range_time),
        slow_threshold_s: s.slow_threshold_s.map(|v| rn(v, 6)),
        slow_count: s.slow_count as u64,
        slow_pattern: s.slow_pattern.clone(),
        slow_causes: s.slow_causes.clone(),
        slow: s
            .slow
            .iter()
            .map(|x| t::SlowStep {
                index: x.index as u64,
                start_s: rn(x.start_s, 3),
                duration_s: rn(x.duration_s, 6),
                vs_median: rn(x.vs_median, 2),
                causes: x
                    .causes
                    .iter()
                    .map(|c| t::SlowCause {
                        kind: json_of(&c.kind),
                        text: c.text.clone(),
                        excess_s: c.excess_s.map(|v| rn(v, 3)),
                    })
                    .collect(),
            })
            .collect(),
        waits: s
            .waits
            .iter()
            .map(|w| t::StepWaitShare {
                class: json_of(&w.class),
                p50_s: rn(w.p50_s, 6),
                p90_s: rn(w.p90_s, 6),
                share: rn(w.share, 3),
            })
            .collect(),
        notes: s.notes.clone(),
        hint: hint(a),
    }
}

/// Without NVTX ranges in the job: how to add a step range (one line).
pub fn hint(a: &Analysis) -> Option<String> {
    if !a.nvtx.captured() || !a.nvtx.ranges.is_empty() {
        return None;
    }
    let python = a.processes.values().any(|p| {
        p.cmdline
            .first()
            .is_some_and(|c| c.rsplit('/').next().unwrap_or(c).starts_with("python"))
            || p.comm.starts_with("python")
    });
    Some(if python {
        "For exact per-step times, mark the training step in the loop — `torch.cuda.nvtx.range_push(\"step\")` at its start and `torch.cuda.nvtx.range_pop()` at its end (no GPU needed; gpuprof captures NVTX by itself).".to_string()
    } else {
        "For exact per-step times, mark the training step with NVTX — `nvtxRangePushA(\"step\")` at its start and `nvtxRangePop()` at its end (gpuprof captures NVTX by itself).".to_string()
    })
}

/// Summary lines about steps.
pub fn steps_lines(a: &Analysis) -> Vec<String> {
    let s = &a.steps;
    let mut out = Vec::new();
    if s.found() {
        let rate = s
            .steps_per_s
            .map(|v| format!("{v:.2} steps/s"))
            .unwrap_or_else(|| "steps/s unknown".into());
        let what = match s.method.as_str() {
            "nvtx-range" => format!(
                "steps from NVTX range `{}`",
                s.name.as_deref().unwrap_or("?")
            ),
            "nvtx-range-auto" => format!(
                "steps from NVTX range `{}` (chosen automatically; --step-range NAME to choose)",
                s.name.as_deref().unwrap_or("?")
            ),
            "gpu-idle-gaps" => "estimated from the GPU's recurring idle gaps".to_string(),
            _ => format!(
                "estimated from the main thread's stacks (`{}` recurs)",
                s.name.as_deref().unwrap_or("?")
            ),
        };
        out.push(format!("{} steps, {rate}; {what}.", s.count));
        if let Some(d) = &s.time {
            out.push(format!(
                "Step time: mean {}, p50 {}, p90 {}, p99 {}, max {}.",
                dur(d.mean_s),
                dur(d.p50_s),
                dur(d.p90_s),
                dur(d.p99_s),
                dur(d.max_s)
            ));
        }
        let waits: Vec<String> = s
            .waits
            .iter()
            .filter(|w| w.share >= 0.01)
            .map(|w| {
                let d = |x: f64| if x > 0.0 { dur(x) } else { "0 s".into() };
                format!(
                    "{} {:.0}% of step time (per step: median {}, p90 {})",
                    w.class.label(),
                    w.share * 100.0,
                    d(w.p50_s),
                    d(w.p90_s)
                )
            })
            .collect();
        if !waits.is_empty() {
            out.push(format!(
                "Where the loop thread waited within its steps: {}.",
                waits.join("; ")
            ));
        }
        if s.slow_count > 0 {
            let thr = s.slow_threshold_s.unwrap_or(0.0);
            let pat = s
                .slow_pattern
                .as_deref()
                .map(|p| format!(", {p}"))
                .unwrap_or_default();
            out.push(format!(
                "Slow steps (≥ {} = {:.1}× the median): {} of {}{pat}.",
                dur(thr),
                crate::analysis::steps::SLOW_FACTOR,
                s.slow_count,
                s.count
            ));
            for c in &s.slow_causes {
                out.push(format!("In slow steps: {c}."));
            }
            if let Some(w) = s.slow.first() {
                out.push(format!(
                    "Slowest: step {} at {:.1} s, {} ({:.1}× the median): {}.",
                    w.index,
                    w.start_s,
                    dur(w.duration_s),
                    w.vs_median,
                    w.causes
                        .iter()
                        .map(|c| c.text.as_str())
                        .collect::<Vec<_>>()
                        .join("; ")
                ));
            }
        } else if s.count >= 5 {
            out.push("No slow steps: every step took less than 1.5× the median.".into());
        }
    } else if a.nvtx.captured() && !a.nvtx.ranges.is_empty() {
        out.push(format!("No training steps identified ({}).", s.how));
    }
    out.extend(s.notes.iter().cloned());
    if let Some(h) = hint(a) {
        out.push(h);
    }
    out
}
