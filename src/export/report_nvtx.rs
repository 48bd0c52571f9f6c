//! The NVTX part of report.json and of the summary.

use serde_json::{json, Value};

use crate::analysis::nvtx::RangeGroup;
use crate::analysis::Analysis;

use super::report::r;

/// Range names listed in report.json at most (most total time first).
pub const REPORT_MAX_GROUPS: usize = 200;

fn group_json(g: &RangeGroup) -> Value {
    json!({
        "domain": g.domain,
        "name": g.name,
        "distinct_names": g.distinct_names,
        "count": g.count,
        "total_s": r(g.total_s, 6),
        "mean_s": r(g.mean_s, 6),
        "p50_s": g.p50_s.map(|v| r(v, 6)),
        "p95_s": g.p95_s.map(|v| r(v, 6)),
        "max_s": r(g.max_s, 6),
        "quantiles_from": g.quantiles_from,
        "gpu_busy_share": g.gpu_busy_share.map(|v| r(v, 4)),
        "level": g.level,
        "processes": g.processes,
        "threads": g.threads,
        "open": g.open,
    })
}

/// `nvtx` in report.json.
pub fn nvtx(a: &Analysis) -> Value {
    let n = &a.nvtx;
    let threads: std::collections::BTreeSet<_> = n.ranges.iter().map(|r| (r.pid, r.tid)).collect();
    json!({
        "captured": n.captured(),
        "detail": n.coverage.as_ref().map(|c| c.detail.clone()),
        "processes": n.processes.len(),
        "threads": threads.len(),
        "ranges": n.ranges.len(),
        "marks": n.marks.len(),
        "domains": n.domains.iter().filter(|d| !d.is_empty()).collect::<Vec<_>>(),
        "ranges_by_name": n.groups.iter().take(REPORT_MAX_GROUPS).map(group_json).collect::<Vec<_>>(),
        "names_left_out": n.groups.len().saturating_sub(REPORT_MAX_GROUPS),
        "recording": {
            "lost_in_job": n.stats.lost_in_job,
            "over_budget": n.stats.over_budget,
            "unmatched": n.stats.unmatched,
            "bad_rings": n.stats.bad_rings,
            "not_kept_in_analysis": n.not_kept_in_analysis,
        },
    })
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
