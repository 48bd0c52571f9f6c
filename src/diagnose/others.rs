//! `cpu-taken-by-other-programs`: processes outside the job that took CPU
//! the job's threads were waiting for (see [`crate::analysis::others`]).

use crate::analysis::others::{OtherProgram, OtherPrograms, STEP_MIN_SHARE};
use crate::analysis::Analysis;
use crate::units::pct;

use super::rule::CauseRule;
use super::thresholds as th;
use super::{Basis, Finding, FindingKind, GpuTime, Severity};

/// At most this many processes are named.
const MAX_NAMED: usize = 3;

fn named(p: &OtherProgram) -> bool {
    p.share_of_runnable >= th::OTHER_PROGRAM_MIN_SHARE_OF_RUNNABLE
        && p.took_s >= th::OTHER_PROGRAM_MIN_TOOK_S
}

/// Whether the finding names at least one process.
pub(super) fn names_any(a: &Analysis) -> bool {
    a.others.processes.iter().any(named)
}

pub(super) fn other_programs(a: &Analysis) -> Option<Finding> {
    let o = &a.others;
    let hogs: Vec<&OtherProgram> = o
        .processes
        .iter()
        .filter(|p| named(p))
        .take(MAX_NAMED)
        .collect();
    let top = *hogs.first()?;
    let dur = a.duration_s();
    let mut ev = Vec::new();
    for p in &hogs {
        ev.push(format!(
            "{} used {:.1} CPU-s between {:.0} s and {:.0} s into the run; in those seconds the job's threads waited {} of their runnable time for a CPU, and it took about {:.1} s of it: {} of the job's runnable time ({:.1} s).",
            OtherPrograms::label(p),
            p.cpu_s,
            p.from_s,
            p.to_s,
            pct(wait_share(a, p)),
            p.took_s,
            pct(p.share_of_runnable),
            p.job_runnable_s
        ));
    }
    ev.push(format!(
        "Over the run the job's threads ran {:.1} CPU-s and waited {:.1} s runnable (/proc/PID/task/TID/schedstat). Estimated each second: a process's CPU time on the CPUs the job may use (where it ran, looked at ten times a second), scaled down when the others together used more there than the job waited.",
        o.job_run_s, o.job_wait_s
    ));
    if let Some(line) = steps_line(a, &hogs) {
        ev.push(line);
    }
    // The job's wall time lost: what was taken, spread over the job's
    // runnable threads (a one-thread job loses all of it).
    let runnable_threads = if dur > 0.0 {
        ((o.job_run_s + o.job_wait_s) / dur).max(1.0)
    } else {
        1.0
    };
    let idle = super::causes::idle_weighted(a).then(|| a.gpu.idle_weights());
    let lost: f64 = hogs
        .iter()
        .map(|p| taken_while_gpu_idle(a, p, idle.as_ref()))
        .sum::<f64>()
        // Together they cannot take more than the job waited.
        .min(o.job_wait_s)
        / runnable_threads;
    let share = if dur > 0.0 {
        (lost / dur).min(1.0)
    } else {
        0.0
    };
    Some(CauseRule {
        kind: FindingKind::OtherProgramsCpu,
        severity: Severity::from_share(share),
        title: format!(
            "Another program took CPU the job was waiting for: {} took ~{} of the job's runnable time",
            OtherPrograms::label(top),
            pct(top.share_of_runnable)
        ),
        gpu_time: Some(GpuTime {
            seconds: lost,
            share,
            basis: Basis::Estimated,
            method: format!(
                "CPU time taken from the job while its threads waited for a CPU, over the {runnable_threads:.1} threads it had runnable on average{}",
                if idle.is_some() {
                    ", each second weighted by how idle the job's GPUs were"
                } else {
                    ""
                }
            ),
        }),
        evidence: ev,
        fix: format!(
            "Stop or move {}, or keep it off the job's CPUs: pin the job and the other program to different cores (`taskset -c`, cgroup `cpuset`), lower the other program's priority (`renice 19 -p {}`), or ask the scheduler (Slurm, Kubernetes) for exclusive CPUs.",
            OtherPrograms::label(top),
            top.pid.0
        ),
    }.finding())
}

/// What `p` took from the job (seconds); with GPU data, each interval
/// weighted by how idle the job's GPUs were in it (CPU taken from a job
/// whose GPU stays busy costs it no GPU time).
fn taken_while_gpu_idle(
    a: &Analysis,
    p: &OtherProgram,
    idle: Option<&crate::analysis::gpu::IdleWeights>,
) -> f64 {
    let Some(idle) = idle else {
        return p.took_s;
    };
    const POINTS: u64 = 10;
    let mut sum = 0.0;
    for i in &a.others.intervals {
        let Some(&(_, took)) = i.took.iter().find(|o| o.0 == p.pid) else {
            continue;
        };
        let len = i.to.0.saturating_sub(i.from.0);
        let idle: f64 = (0..POINTS)
            .map(|k| {
                let t = crate::event::MonoNs(i.from.0 + len * (2 * k + 1) / (2 * POINTS));
                idle.at(t).unwrap_or(0.0)
            })
            .sum::<f64>()
            / POINTS as f64;
        sum += took / 1e9 * idle;
    }
    sum
}

/// The share of the job's runnable time it spent waiting, in the seconds
/// `p` was busy.
fn wait_share(a: &Analysis, p: &OtherProgram) -> f64 {
    let (mut run, mut wait) = (0u64, 0u64);
    for i in &a.others.intervals {
        if i.others.iter().any(|o| o.0 == p.pid) {
            run += i.run_ns;
            wait += i.wait_ns;
        }
    }
    wait as f64 / (run + wait).max(1) as f64
}

/// Which steps the named processes slowed: the slow steps in which one of
/// them took at least [`STEP_MIN_SHARE`] of the step's time.
fn steps_line(a: &Analysis, hogs: &[&OtherProgram]) -> Option<String> {
    let s = &a.steps;
    if !s.found() {
        return None;
    }
    let slowed: Vec<String> = s
        .slow
        .iter()
        .filter(|st| {
            st.causes.iter().any(|c| {
                c.kind == "other-program"
                    && hogs
                        .iter()
                        .any(|h| c.text.contains(&format!("(pid {},", h.pid.0)))
            })
        })
        .map(|st| {
            format!(
                "{} ({:.2} s, {:.1}× the median)",
                st.index, st.duration_s, st.vs_median
            )
        })
        .collect();
    if slowed.is_empty() {
        return Some(format!(
            "No slow step had {} or more of its time taken ({} of {} steps were slow).",
            pct(STEP_MIN_SHARE),
            s.slow.len(),
            s.count
        ));
    }
    let shown = slowed.len().min(10);
    Some(format!(
        "Slow steps it took at least {} of: {}{} ({} of {} steps were slow).",
        pct(STEP_MIN_SHARE),
        slowed[..shown].join(", "),
        if slowed.len() > shown { ", …" } else { "" },
        s.slow.len(),
        s.count
    ))
}
