//! `report.json`: every figure of the run, machine-readable. Keys are
//! sorted and numbers rounded so the file is deterministic for a given
//! recording. Bump [`SCHEMA_VERSION`] on incompatible changes.

use serde_json::{json, Map, Value};

use crate::analysis::{Analysis, Process, Role, Series};
use crate::diagnose::{Diagnosis, Finding};

pub const SCHEMA_VERSION: u32 = 1;

/// Round to `d` decimals (NaN/inf become null).
pub fn r(v: f64, d: i32) -> Value {
    if !v.is_finite() {
        return Value::Null;
    }
    let m = 10f64.powi(d);
    // `+ 0.0` turns -0.0 into 0.0.
    json!((v * m).round() / m + 0.0)
}

fn series_stats(s: &Series, scale: f64) -> Value {
    if s.is_empty() {
        return Value::Null;
    }
    json!({
        "mean": r(s.mean() * scale, 2),
        "p50": r(s.quantile(0.5) * scale, 2),
        "p95": r(s.quantile(0.95) * scale, 2),
        "max": r(s.max() * scale, 2),
    })
}

fn process_json(a: &Analysis, p: &Process) -> Value {
    let (from, to) = p.lifetime(a.end);
    let threads: Vec<Value> = p
        .threads
        .values()
        .map(|t| {
            let states: Map<String, Value> = t
                .state_ns
                .iter()
                .map(|(k, v)| (k.to_string(), r(*v as f64 / 1e9, 3)))
                .collect();
            json!({
                "tid": t.tid.0,
                "name": t.comm,
                "cpu_s": r((t.user_ns + t.sys_ns) as f64 / 1e9, 3),
                "cpu_user_s": r(t.user_ns as f64 / 1e9, 3),
                "cpu_sys_s": r(t.sys_ns as f64 / 1e9, 3),
                "cpu_pct": series_stats(&t.cpu, 100.0),
                "state_s": states,
            })
        })
        .collect();
    json!({
        "pid": p.pid.0,
        "ppid": p.ppid.0,
        "role": p.role,
        "label": p.label(),
        "rank": p.rank,
        "local_rank": p.rank_ids.local_rank,
        "node_rank": p.rank_ids.node_rank,
        "world_size": p.rank_ids.world_size,
        "rank_env": p.rank_env,
        "is_job": p.is_job,
        "comm": p.comm,
        "command": p.cmdline,
        "exe": p.exe,
        "start_s": r(a.rel_s(from).max(0.0), 3),
        "end_s": r(a.rel_s(to).max(0.0), 3),
        "exited": p.exited.is_some(),
        "exit_code": p.status.and_then(|s| s.exit_code()),
        "cpu_user_s": r(p.user_ns as f64 / 1e9, 3),
        "cpu_sys_s": r(p.sys_ns as f64 / 1e9, 3),
        "cpu_s": r(p.cpu_s(), 3),
        "cpu_pct": series_stats(&p.cpu, 100.0),
        "read_bytes": p.read_bytes,
        "write_bytes": p.write_bytes,
        "rchar": p.rchar,
        "wchar": p.wchar,
        "max_rss_bytes": p.max_rss,
        "threads": threads,
    })
}

pub fn build(a: &Analysis) -> Value {
    let h = &a.header;
    let processes: Vec<Value> = a
        .processes_in_order()
        .into_iter()
        .map(|p| process_json(a, p))
        .collect();
    let mut roles = Map::new();
    for role in Role::ALL {
        let ps: Vec<&Process> = a.processes_with_role(role).collect();
        roles.insert(
            role.as_str().into(),
            json!({
                "processes": ps.len(),
                "cpu_s": r(ps.iter().map(|p| p.cpu_s()).sum::<f64>(), 3),
                "read_bytes": ps.iter().map(|p| p.read_bytes).sum::<u64>(),
                "write_bytes": ps.iter().map(|p| p.write_bytes).sum::<u64>(),
            }),
        );
    }
    let s = &a.system;
    let disks: Vec<Value> = s
        .disks
        .values()
        .filter(|d| d.read_bytes > 0 || d.write_bytes > 0 || d.busy.max() > 0.0)
        .map(|d| {
            json!({
                "name": d.name,
                "read_bytes": d.read_bytes,
                "write_bytes": d.write_bytes,
                "busy_pct": series_stats(&d.busy, 1.0),
                "read_mb_per_s": series_stats(&d.read_bps, 1e-6),
                "write_mb_per_s": series_stats(&d.write_bps, 1e-6),
            })
        })
        .collect();
    let psi = |ps: &crate::analysis::PressureSeries| {
        if ps.some.is_empty() {
            Value::Null
        } else {
            json!({"some_pct": series_stats(&ps.some, 1.0), "full_pct": series_stats(&ps.full, 1.0)})
        }
    };
    let system = json!({
        "cpus": s.cpus,
        "cpu_busy_pct": series_stats(&s.busy, 1.0),
        "iowait_pct": series_stats(&s.iowait, 1.0),
        "steal_pct": series_stats(&s.steal, 1.0),
        "runnable_tasks": series_stats(&s.runnable, 1.0),
        "blocked_tasks": series_stats(&s.blocked, 1.0),
        "disks": disks,
        "pressure": {"cpu": psi(&s.psi_cpu), "io": psi(&s.psi_io), "memory": psi(&s.psi_memory)},
        "memory": {
            "total_bytes": s.mem_total,
            "available_min_bytes": if s.mem_available.is_empty() { Value::Null } else { json!(s.mem_available.quantile(0.0) as u64) },
            "swap_in_bytes": s.swap_in_bytes,
            "swap_out_bytes": s.swap_out_bytes,
        },
    });
    let coverage: Vec<Value> = a
        .coverage
        .values()
        .map(|c| json!({"source": c.source, "available": c.available, "detail": c.detail}))
        .collect();
    let footer = a.footer.as_ref();
    let dur = a.duration_s();
    let profiler = footer.map(|f| {
        json!({
            "cpu_s": r(f.profiler_cpu_ns as f64 / 1e9, 3),
            "cpu_pct_of_one_core": r(if dur > 0.0 { f.profiler_cpu_ns as f64 / 1e9 / dur * 100.0 } else { 0.0 }, 2),
            "max_rss_bytes": f.profiler_max_rss_bytes,
            "dropped_events": f.dropped_events,
        })
    });
    let start_wall = chrono::DateTime::from_timestamp(
        ((h.anchor_realtime_ns as i128 + a.start.0 as i128 - h.anchor_monotonic_ns as i128)
            / 1_000_000_000) as i64,
        0,
    )
    .map(|d| d.to_rfc3339());
    json!({
        "schema_version": SCHEMA_VERSION,
        "gpuprof_version": h.gpuprof_version,
        "command": h.command,
        "host": h.host,
        "rank": h.rank,
        "rank_env": h.rank_env,
        "clock": {
            "anchor_monotonic_ns": h.anchor_monotonic_ns,
            "anchor_realtime_ns": h.anchor_realtime_ns,
            "anchor_error_ns": h.anchor_error_ns,
            "sync": h.clock,
            "end_anchor": footer.and_then(|f| f.end_anchor),
        },
        "start_time": start_wall,
        "duration_s": r(dur, 3),
        "interval_s": r(h.interval_ns as f64 / 1e9, 3),
        "exit_code": a.job_status().and_then(|s| s.exit_code()),
        "job_status": a.job_status(),
        "stop_reason": footer.map(|f| f.reason.clone()),
        "attached": h.attached.as_ref().map(|at| json!({
            "pid": h.job_pid,
            "at": start_wall,
            "job_running_before_s": r(a.header.start.secs_since(at.process_start), 3),
            "processes_at_attach": at.processes,
            "threads_at_attach": at.threads,
        })),
        "complete": a.complete,
        "processes": processes,
        "roles": roles,
        "system": system,
        "coverage": coverage,
        "gpu": super::report_gpu::summary(a),
        "gpus": super::report_gpu::devices(a),
        "stacks": a.stacks.report,
        "nvtx": super::report_nvtx::nvtx(a),
        "steps": super::report_nvtx::steps(a),
        "profiler": profiler,
        "warnings": a.warnings,
    })
}

pub fn finding_json(f: &Finding) -> Value {
    let gt = f.gpu_time.as_ref();
    json!({
        "id": f.kind.id(),
        "rank": f.rank,
        "severity": f.severity,
        "title": f.title,
        "gpu_time_s": gt.map_or(Value::Null, |g| r(g.seconds, 3)),
        "gpu_time_share": gt.map_or(Value::Null, |g| r(g.share, 4)),
        "gpu_time_basis": gt.map(|g| g.basis),
        "gpu_time_method": gt.map(|g| g.method.clone()),
        "evidence": f.evidence,
        "fix": f.fix,
        "docs": f.kind.docs(),
    })
}

/// The diagnosis part of report.json: `findings` (ranked, most GPU time
/// explained first) and `diagnosis` (what it rests on).
pub fn add_diagnosis(report: &mut Value, d: &Diagnosis) {
    if let Some(obj) = report.as_object_mut() {
        obj.insert(
            "findings".into(),
            Value::Array(d.findings.iter().map(finding_json).collect()),
        );
        obj.insert(
            "diagnosis".into(),
            json!({
                "gpu_measured": d.gpu_measured,
                "stacks_measured": d.stacks_measured,
                "notes": d.notes,
            }),
        );
        obj.insert(
            "ranks".into(),
            serde_json::to_value(&d.ranks).unwrap_or(Value::Null),
        );
        obj.insert(
            "environment".into(),
            serde_json::to_value(&d.environment).unwrap_or(Value::Null),
        );
    }
}
