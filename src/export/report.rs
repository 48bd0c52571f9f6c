//! `report.json`: every figure of the run, machine-readable. Keys are
//! sorted and numbers rounded so the file is deterministic for a given
//! recording. The exporter fills the types of [`super::report_schema`]
//! and serializes them; bump [`SCHEMA_VERSION`] on incompatible changes.

use std::collections::BTreeMap;

use crate::analysis::{Analysis, Process, Role, Series};
use crate::diagnose::{Diagnosis, Finding};

use super::common::rn;
use super::report_schema::{self as t, json_of, name_of};

pub use super::report_schema::SCHEMA_VERSION;

/// Processes listed one by one in `processes[]`; the others are summed in
/// `processes_omitted`. So report.json stays a few MB whatever the number
/// of processes (a job that spawns a shell per file can start 100 000s).
pub const MAX_PROCESSES: usize = 200;
/// Processes whose PID was reused, listed in full at most.
const MAX_REUSED_LISTED: usize = 50;
/// Threads listed per process, and in all; the others are summed in
/// `threads_omitted`.
pub const MAX_THREADS_PER_PROCESS: usize = 64;
pub const MAX_THREADS: usize = 4000;
/// Bytes of a command line kept in the report.
pub const MAX_COMMAND_BYTES: usize = 4096;
/// Entries kept in other per-process lists (frameworks, CUDA runtimes, ...).
pub const MAX_LIST: usize = 64;

pub(super) fn series_stats(s: &Series, scale: f64) -> Option<t::SeriesStats> {
    if s.is_empty() {
        return None;
    }
    Some(t::SeriesStats {
        mean: rn(s.mean() * scale, 2),
        p50: rn(s.quantile(0.5) * scale, 2),
        p95: rn(s.quantile(0.95) * scale, 2),
        max: rn(s.max() * scale, 2),
    })
}

/// A command line cut to [`MAX_COMMAND_BYTES`], saying how much was left out.
fn bounded_command(cmd: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut used = 0;
    for (i, arg) in cmd.iter().enumerate() {
        if used + arg.len() > MAX_COMMAND_BYTES {
            let room = MAX_COMMAND_BYTES.saturating_sub(used);
            let mut cut = room.min(arg.len());
            while !arg.is_char_boundary(cut) {
                cut -= 1;
            }
            let rest: usize = cmd[i..].iter().map(|a| a.len()).sum::<usize>() - cut;
            out.push(format!("{}… ({rest} more bytes)", &arg[..cut]));
            return out;
        }
        used += arg.len();
        out.push(arg.clone());
    }
    out
}

/// The processes listed one by one: the job, launchers, ranks and
/// processes that held a GPU, and the top ones by CPU time, IO bytes and
/// memory, at most [`MAX_PROCESSES`], in the report's order.
fn listed_processes(a: &Analysis) -> Vec<&Process> {
    let ordered = a.processes_in_order();
    if ordered.len() <= MAX_PROCESSES {
        return ordered;
    }
    let gpu: std::collections::BTreeSet<crate::event::Pid> = a.gpu.job_gpu_pids();
    let mut keep: std::collections::BTreeSet<crate::event::Pid> = ordered
        .iter()
        .filter(|p| {
            p.is_job || gpu.contains(&p.pid) || p.rank.is_some() || p.role == Role::Launcher
        })
        .map(|p| p.pid)
        .take(MAX_PROCESSES / 4)
        .collect();
    let all: Vec<&Process> = a.processes.values().collect();
    let rankings: [&dyn Fn(&Process) -> f64; 4] = [
        &|p| p.cpu_s(),
        &|p| (p.read_bytes + p.write_bytes) as f64,
        &|p| p.max_rss as f64,
        &|p| (p.role == Role::Main) as u8 as f64,
    ];
    let mut ranked: Vec<Vec<&Process>> = rankings
        .iter()
        .map(|f| {
            let mut v = all.clone();
            // Stable: ties keep pid order.
            v.sort_by(|x, y| f(y).total_cmp(&f(x)));
            v
        })
        .collect();
    // Round robin over the rankings until the budget is used.
    let mut idx = vec![0usize; ranked.len()];
    while keep.len() < MAX_PROCESSES && idx.iter().zip(&ranked).any(|(i, v)| *i < v.len()) {
        for (k, v) in ranked.iter_mut().enumerate() {
            if keep.len() >= MAX_PROCESSES {
                break;
            }
            while idx[k] < v.len() {
                let p = v[idx[k]];
                idx[k] += 1;
                if keep.insert(p.pid) {
                    break;
                }
            }
        }
    }
    ordered
        .into_iter()
        .filter(|p| keep.contains(&p.pid))
        .collect()
}

/// Keep the first [`MAX_LIST`] entries of each array `keys` of `obj`; the
/// count left out goes into `<key>_omitted`.
fn cap_lists(obj: &mut serde_json::Value, keys: &[&str]) {
    let Some(o) = obj.as_object_mut() else {
        return;
    };
    for k in keys {
        if let Some(serde_json::Value::Array(v)) = o.get_mut(*k) {
            if v.len() > MAX_LIST {
                let n = v.len() - MAX_LIST;
                v.truncate(MAX_LIST);
                o.insert(format!("{k}_omitted"), n.into());
            }
        }
    }
}

/// [`cap_lists`] of a typed list: the count left out, if any.
fn cap_list<T>(v: &mut Vec<T>) -> Option<u64> {
    (v.len() > MAX_LIST).then(|| {
        let n = v.len() - MAX_LIST;
        v.truncate(MAX_LIST);
        n as u64
    })
}

/// What `processes_omitted` / `threads_omitted` say about left-out entries.
fn omitted_processes(ps: &[&Process]) -> t::ProcessesOmitted {
    let mut by_role = BTreeMap::new();
    for role in Role::ALL {
        let n = ps.iter().filter(|p| p.role == role).count();
        if n > 0 {
            by_role.insert(role.as_str().into(), n as u64);
        }
    }
    t::ProcessesOmitted {
        count: ps.len() as u64,
        threads: ps.iter().map(|p| p.threads.len()).sum::<usize>() as u64,
        cpu_s: rn(ps.iter().map(|p| p.cpu_s()).sum::<f64>(), 3),
        read_bytes: ps.iter().map(|p| p.read_bytes).sum::<u64>(),
        write_bytes: ps.iter().map(|p| p.write_bytes).sum::<u64>(),
        max_rss_bytes: ps.iter().map(|p| p.max_rss).max().unwrap_or(0),
        exited: ps.iter().filter(|p| p.exited.is_some()).count() as u64,
        by_role,
    }
}

/// The job's cgroup limits (null when it had none).
fn cgroup_json(c: &crate::analysis::CgroupLimits) -> Option<t::Cgroup> {
    let cpu = c.cpu_quota_cores.map(|q| t::CgroupCpu {
        path: c.cpu_path.clone(),
        cgroup_v2: c.cpu_v2,
        quota_cores: rn(q, 3),
        period_us: c.cpu_period_us,
        periods: c.periods,
        throttled_periods: c.throttled_periods,
        throttled_s: rn(c.throttled_s, 3),
    });
    let memory = c.memory_limit_bytes.map(|l| t::CgroupMemory {
        path: c.memory_path.clone(),
        cgroup_v2: c.memory_v2,
        limit_bytes: l,
        usage_max_bytes: c.memory_usage_max,
    });
    if cpu.is_none() && memory.is_none() {
        return None;
    }
    Some(t::Cgroup { cpu, memory })
}

fn process_json(a: &Analysis, p: &Process, max_threads: usize) -> t::ProcessEntry {
    let (from, to) = p.lifetime(a.end);
    let mut listed: Vec<&crate::analysis::Thread> = p.threads.values().collect();
    let mut omitted = None;
    if listed.len() > max_threads {
        // The busiest threads, in tid order.
        listed.sort_by_key(|t| std::cmp::Reverse(t.user_ns + t.sys_ns));
        let rest = listed.split_off(max_threads);
        listed.sort_by_key(|t| t.tid);
        omitted = Some(t::ThreadsOmitted {
            count: rest.len() as u64,
            cpu_s: rn(
                rest.iter()
                    .map(|t| (t.user_ns + t.sys_ns) as f64 / 1e9)
                    .sum::<f64>(),
                3,
            ),
        });
    }
    let threads: Vec<t::ThreadEntry> = listed
        .into_iter()
        .map(|th| t::ThreadEntry {
            tid: th.tid.0,
            name: th.comm.clone(),
            cpu_s: rn((th.user_ns + th.sys_ns) as f64 / 1e9, 3),
            cpu_user_s: rn(th.user_ns as f64 / 1e9, 3),
            cpu_sys_s: rn(th.sys_ns as f64 / 1e9, 3),
            cpu_pct: series_stats(&th.cpu, 100.0),
            state_s: th
                .state_ns
                .iter()
                .map(|(k, v)| (k.to_string(), rn(*v as f64 / 1e9, 3)))
                .collect(),
        })
        .collect();
    t::ProcessEntry {
        pid: p.pid.0,
        ppid: p.ppid.0,
        role: name_of(&p.role),
        label: p.label(),
        rank: p.rank,
        local_rank: p.rank_ids.local_rank,
        node_rank: p.rank_ids.node_rank,
        world_size: p.rank_ids.world_size,
        rank_env: p.rank_env.clone(),
        is_job: p.is_job,
        recovered: p.recovered,
        comm: p.comm.clone(),
        command: bounded_command(&p.cmdline),
        exe: p.exe.clone(),
        start_s: rn(a.rel_s(from).max(0.0), 3),
        end_s: rn(a.rel_s(to).max(0.0), 3),
        exited: p.exited.is_some(),
        exit_code: p.status.and_then(|s| s.exit_code()),
        cpu_user_s: rn(p.user_ns as f64 / 1e9, 3),
        cpu_sys_s: rn(p.sys_ns as f64 / 1e9, 3),
        cpu_s: rn(p.cpu_s(), 3),
        cpu_pct: series_stats(&p.cpu, 100.0),
        read_bytes: p.read_bytes,
        write_bytes: p.write_bytes,
        rchar: p.rchar,
        wchar: p.wchar,
        max_rss_bytes: p.max_rss,
        threads,
        threads_omitted: omitted,
    }
}

/// `profiler`: gpuprof's own CPU time, memory and dropped events.
fn profiler(a: &Analysis) -> Option<t::Profiler> {
    let dur = a.duration_s();
    a.footer.as_ref().map(|f| {
        let mut by: BTreeMap<String, f64> = f
            .profiler_cpu_ns_by_component
            .iter()
            .map(|(k, ns)| (k.clone(), rn(*ns as f64 / 1e9, 3)))
            .collect();
        if !by.is_empty() {
            let parts: u64 = f.profiler_cpu_ns_by_component.values().sum();
            by.insert(
                "main thread (signals, live views, start and end)".into(),
                rn(f.profiler_cpu_ns.saturating_sub(parts) as f64 / 1e9, 3),
            );
        }
        t::Profiler {
            cpu_s: rn(f.profiler_cpu_ns as f64 / 1e9, 3),
            cpu_s_by_component: by,
            cpu_pct_of_one_core: rn(
                if dur > 0.0 {
                    f.profiler_cpu_ns as f64 / 1e9 / dur * 100.0
                } else {
                    0.0
                },
                2,
            ),
            max_rss_bytes: f.profiler_max_rss_bytes,
            dropped_events: f.dropped_events,
            recording_bytes: None,
        }
    })
}

/// The listed processes (within the thread budget) and what is left out.
fn processes(a: &Analysis) -> (Vec<t::ProcessEntry>, Option<t::ProcessesOmitted>) {
    let listed = listed_processes(a);
    let mut thread_budget = MAX_THREADS;
    let processes: Vec<t::ProcessEntry> = listed
        .iter()
        .map(|p| {
            let n = MAX_THREADS_PER_PROCESS.min(thread_budget);
            thread_budget -= n.min(p.threads.len());
            process_json(a, p, n)
        })
        .collect();
    let omitted = (listed.len() < a.processes.len()).then(|| {
        let keep: std::collections::BTreeSet<crate::event::Pid> =
            listed.iter().map(|p| p.pid).collect();
        let rest: Vec<&Process> = a
            .processes
            .values()
            .filter(|p| !keep.contains(&p.pid))
            .collect();
        omitted_processes(&rest)
    });
    (processes, omitted)
}

/// The report without the diagnosis (see [`add_diagnosis`]).
pub fn build(a: &Analysis) -> t::Report {
    let h = &a.header;
    let (processes, processes_omitted) = processes(a);
    let coverage = a
        .coverage
        .values()
        .map(|c| t::Coverage {
            source: c.source.clone(),
            available: c.available,
            detail: c.detail.clone(),
        })
        .collect();
    let footer = a.footer.as_ref();
    let start_wall = chrono::DateTime::from_timestamp(
        ((h.anchor_realtime_ns as i128 + a.start.0 as i128 - h.anchor_monotonic_ns as i128)
            / 1_000_000_000) as i64,
        0,
    )
    .map(|d| d.to_rfc3339());
    let mut gpus = super::report_gpu::devices(a);
    for d in &mut gpus {
        d.processes_omitted = cap_list(&mut d.processes);
        d.throttle_reasons_omitted = cap_list(&mut d.throttle_reasons);
    }
    t::Report {
        schema_version: SCHEMA_VERSION,
        gpuprof_version: h.gpuprof_version.clone(),
        command: h.command.clone(),
        host: h.host.clone(),
        rank: h.rank.clone(),
        rank_env: h.rank_env.clone(),
        clock: t::Clock {
            anchor_monotonic_ns: h.anchor_monotonic_ns,
            anchor_realtime_ns: h.anchor_realtime_ns,
            anchor_error_ns: h.anchor_error_ns,
            sync: h.clock.as_ref().map(json_of),
            end_anchor: footer.and_then(|f| f.end_anchor.as_ref()).map(json_of),
        },
        start_time: start_wall.clone(),
        duration_s: rn(a.duration_s(), 3),
        interval_s: rn(h.interval_ns as f64 / 1e9, 3),
        exit_code: a.job_status().and_then(|s| s.exit_code()),
        job_status: a.job_status().as_ref().map(json_of),
        stop_reason: footer.map(|f| f.reason.clone()),
        attached: h.attached.as_ref().map(|at| t::Attached {
            pid: h.job_pid.0,
            at: start_wall,
            job_running_before_s: rn(a.header.start.secs_since(at.process_start), 3),
            processes_at_attach: at.processes,
            threads_at_attach: at.threads,
        }),
        complete: a.complete,
        processes,
        processes_omitted,
        processes_reused: processes_reused(a),
        roles: roles_json(a),
        system: system_json(a),
        coverage,
        gpu: super::report_gpu::summary(a),
        gpus,
        stacks: json_of(&a.stacks.report),
        nvtx: Some(super::report_nvtx::nvtx(a)),
        steps: Some(super::report_nvtx::steps(a)),
        other_programs: json_of(&a.others),
        waits: waits(a),
        profiler: profiler(a),
        warnings: a.warnings.clone(),
        findings: Vec::new(),
        diagnosis: t::DiagnosisInfo::default(),
        ranks: serde_json::Value::Null,
        environment: serde_json::Value::Null,
        outputs_missing: Vec::new(),
        trace: serde_json::Value::Null,
    }
}

/// Where the threads the wall-clock sampler looked at spent their wall
/// time: on a CPU, blocked by wait class, or unknown (reads dropped).
/// Null when no thread was looked at (no perf, or an older recording):
/// not measured, which is not 0%.
fn waits(a: &Analysis) -> Option<t::Waits> {
    if a.waits.threads.is_empty() {
        return None;
    }
    let share = |c: &crate::analysis::waits::ClassTime| t::ClassShare {
        share: rn(c.share, 3),
        seconds: rn(c.seconds, 3),
        samples: c.samples,
    };
    let threads = a
        .waits
        .threads
        .iter()
        .take(MAX_THREADS)
        .map(|th| t::WaitThread {
            pid: th.pid.0,
            tid: th.tid.0,
            process: a.processes.get(&th.pid).map(|p| p.label()),
            main_thread: th.pid.0 == th.tid.0,
            samples: th.samples,
            span_s: rn(th.span_s, 3),
            counted_over: if th.steady {
                "steady_state"
            } else {
                "thread_life"
            }
            .into(),
            on_cpu: share(&th.on_cpu),
            unknown: share(&th.unknown),
            blocked: th
                .waits
                .iter()
                .map(|(k, v)| {
                    let key = json_of(k).as_str().map(String::from).unwrap_or_default();
                    (key, share(v))
                })
                .collect(),
            other_top: th
                .other_top
                .iter()
                .map(|(f, n)| t::FramesCount {
                    frames: json_of(f),
                    samples: *n,
                })
                .collect(),
            gil_holders: th
                .gil_holders
                .iter()
                .map(|(h, s)| t::GilHolder {
                    holder: json_of(h),
                    seconds: rn(*s, 3),
                })
                .collect(),
        })
        .collect();
    Some(t::Waits {
        method: "wall-clock sampler: each tick reads a thread's /proc syscall file; a blocked thread's stack is copied and unwound (or its native frames reused when every stack word the last unwinding read is unchanged), its Python frames read with the layout the in-process agent publishes where the agent runs (else with py-spy), and the read dropped if the thread ran meanwhile; each look stands for the time to the thread's next look (at most twice the median gap): shares are estimates, ± about sqrt(n)/N for n of N looks".into(),
        threads,
    })
}

/// Processes whose PID a later one took: their own figures, the busiest
/// first, within the list's bounds.
fn processes_reused(a: &Analysis) -> Option<t::ProcessesReused> {
    if a.reused.is_empty() {
        return None;
    }
    let mut ps: Vec<&Process> = a.reused.iter().collect();
    ps.sort_by(|x, y| y.cpu_s().total_cmp(&x.cpu_s()).then(x.pid.cmp(&y.pid)));
    let count = ps.len() as u64 + a.reused_omitted.0;
    let cpu = ps.iter().map(|p| p.cpu_s()).sum::<f64>() + a.reused_omitted.1;
    Some(t::ProcessesReused {
        count,
        cpu_s: rn(cpu, 3),
        listed: ps
            .iter()
            .take(MAX_REUSED_LISTED)
            .map(|p| process_json(a, p, MAX_THREADS_PER_PROCESS.min(8)))
            .collect(),
    })
}

/// Per role: its processes (those whose PID was reused too) and their
/// CPU and IO totals.
fn roles_json(a: &Analysis) -> BTreeMap<String, t::RoleTotals> {
    let mut roles = BTreeMap::new();
    for role in Role::ALL {
        // Every process that had the role, those whose PID was reused too.
        let ps: Vec<&Process> = a
            .processes_with_role(role)
            .chain(a.reused.iter().filter(|p| p.role == role))
            .collect();
        roles.insert(
            role.as_str().into(),
            t::RoleTotals {
                processes: ps.len() as u64,
                cpu_s: rn(ps.iter().map(|p| p.cpu_s()).sum::<f64>(), 3),
                read_bytes: ps.iter().map(|p| p.read_bytes).sum::<u64>(),
                write_bytes: ps.iter().map(|p| p.write_bytes).sum::<u64>(),
            },
        );
    }
    roles
}

/// `system`: CPU, disks, pressure, memory and the job's cgroup.
fn system_json(a: &Analysis) -> t::System {
    let s = &a.system;
    let disks = s
        .disks
        .values()
        .filter(|d| d.read_bytes > 0 || d.write_bytes > 0 || d.busy.max() > 0.0)
        .map(|d| t::Disk {
            name: d.name.clone(),
            read_bytes: d.read_bytes,
            write_bytes: d.write_bytes,
            busy_pct: series_stats(&d.busy, 1.0),
            read_mb_per_s: series_stats(&d.read_bps, 1e-6),
            write_mb_per_s: series_stats(&d.write_bps, 1e-6),
        })
        .collect();
    let psi = |ps: &crate::analysis::PressureSeries| {
        (!ps.some.is_empty()).then(|| t::PressureStats {
            some_pct: series_stats(&ps.some, 1.0),
            full_pct: series_stats(&ps.full, 1.0),
        })
    };
    t::System {
        cpus: s.cpus,
        cpu_busy_pct: series_stats(&s.busy, 1.0),
        iowait_pct: series_stats(&s.iowait, 1.0),
        steal_pct: series_stats(&s.steal, 1.0),
        runnable_tasks: series_stats(&s.runnable, 1.0),
        blocked_tasks: series_stats(&s.blocked, 1.0),
        disks,
        pressure: t::Pressure {
            cpu: psi(&s.psi_cpu),
            io: psi(&s.psi_io),
            memory: psi(&s.psi_memory),
        },
        memory: t::SystemMemory {
            total_bytes: s.mem_total,
            available_min_bytes: (!s.mem_available.is_empty())
                .then(|| s.mem_available.quantile(0.0) as u64),
            swap_in_bytes: s.swap_in_bytes,
            swap_out_bytes: s.swap_out_bytes,
        },
        cgroup: cgroup_json(&s.cgroup),
    }
}

pub fn finding_json(f: &Finding) -> t::Finding {
    let gt = f.gpu_time.as_ref();
    t::Finding {
        id: f.kind.id().to_string(),
        rank: f.rank,
        severity: name_of(&f.severity),
        title: f.title.clone(),
        gpu_time_s: gt.map(|g| rn(g.seconds, 3)),
        gpu_time_share: gt.map(|g| rn(g.share, 4)),
        gpu_time_basis: gt.map(|g| json_of(&g.basis)),
        gpu_time_method: gt.map(|g| g.method.clone()),
        evidence: f.evidence.clone(),
        fix: f.fix.clone(),
        docs: f.kind.docs().to_string(),
        established: f.established(),
        support: f.support.as_ref().map(json_of),
    }
}

/// The diagnosis part of report.json: `findings` (ranked, most GPU time
/// explained first) and `diagnosis` (what it rests on).
pub fn add_diagnosis(report: &mut t::Report, d: &Diagnosis) {
    report.findings = d.findings.iter().map(finding_json).collect();
    report.diagnosis = t::DiagnosisInfo {
        gpu_measured: d.gpu_measured,
        stacks_measured: d.stacks_measured,
        notes: d.notes.clone(),
        main_thread: d.main_thread.as_ref().map(json_of),
    };
    report.ranks = json_of(&d.ranks);
    let mut env = json_of(&d.environment);
    // One entry per process in these: bounded like processes[].
    cap_lists(
        &mut env,
        &["frameworks", "cuda_runtimes", "data_filesystems"],
    );
    report.environment = env;
}
