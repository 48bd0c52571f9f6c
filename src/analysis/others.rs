//! CPU that other programs took from the job (see
//! [`crate::collect::others`]): per process outside the job's tree, how
//! much of the job's runnable time it took.
//!
//! The estimate, per one-second interval: the job's threads waited `W`
//! on run queues, and another process used `C` of CPU; it took at most
//! `min(C, W)` from the job (CPU it used while the job had nothing waiting
//! took nothing; CPU beyond the job's wait took nothing more). Its share is
//! the sum of those over the intervals it was busy in, divided by the job's
//! runnable time (run + wait) in the same intervals. It is an upper bound
//! per process: when several processes ran while the job waited, each is
//! given up to the whole wait, and the wait may also be the job's own
//! threads queueing behind each other (oversubscription), which the
//! figures of one interval cannot tell apart.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::event::{Event, MonoNs, OtherProc, Pid};

/// One interval of [`Event::OtherCpu`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Interval {
    pub from: MonoNs,
    pub to: MonoNs,
    pub run_ns: u64,
    pub wait_ns: u64,
    /// (process, CPU ns) of the others listed.
    pub others: Vec<(Pid, u64)>,
}

/// One process outside the job (report.json `other_programs.processes`).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct OtherProgram {
    pub pid: Pid,
    pub comm: String,
    pub user: String,
    /// Its command line (empty when unreadable, or a kernel thread).
    pub command: String,
    /// CPU it used while listed, in seconds.
    pub cpu_s: f64,
    /// Of the job's runnable time, what it took at most (see the module).
    pub took_s: f64,
    /// The job's runnable time (run + wait) in the intervals it was listed.
    pub job_runnable_s: f64,
    /// `took_s / job_runnable_s`.
    pub share_of_runnable: f64,
    /// Seconds from the start of the recording: first and last listed.
    pub from_s: f64,
    pub to_s: f64,
}

/// report.json `other_programs`.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct OtherPrograms {
    /// Whether the figures were recorded (recordings before they existed,
    /// `gpuprof attach` … have none).
    pub measured: bool,
    /// The job's threads over the recording: CPU time, and time runnable
    /// but waiting for a CPU.
    pub job_run_s: f64,
    pub job_wait_s: f64,
    /// Processes that took CPU from the job, most first.
    pub processes: Vec<OtherProgram>,
    #[serde(skip)]
    pub intervals: Vec<Interval>,
}

/// Collects the [`Event::OtherCpu`] events of a recording.
#[derive(Default)]
pub struct Builder {
    intervals: Vec<Interval>,
    names: BTreeMap<Pid, OtherProc>,
}

impl Builder {
    pub fn add(&mut self, ev: &Event) {
        let Event::OtherCpu {
            t,
            interval_ns,
            job_run_ns,
            job_wait_ns,
            procs,
        } = ev
        else {
            return;
        };
        for p in procs {
            let e = self.names.entry(p.pid).or_insert_with(|| p.clone());
            if e.cmdline.is_empty() {
                e.cmdline = p.cmdline.clone();
            }
            e.comm = p.comm.clone();
        }
        self.intervals.push(Interval {
            from: MonoNs(t.0.saturating_sub(*interval_ns)),
            to: *t,
            run_ns: *job_run_ns,
            wait_ns: *job_wait_ns,
            others: procs.iter().map(|p| (p.pid, p.cpu_ns)).collect(),
        });
    }

    /// The figures of the recorded window; `job` says which pids are the
    /// job's own (a pid the tree learnt of late is never blamed).
    pub fn finish(self, window: (MonoNs, MonoNs), job: &dyn Fn(Pid) -> bool) -> OtherPrograms {
        let s = |ns: u64| ns as f64 / 1e9;
        let intervals: Vec<Interval> = self
            .intervals
            .into_iter()
            .filter(|i| i.to > window.0 && i.from < window.1)
            .collect();
        let mut out = OtherPrograms {
            measured: !intervals.is_empty(),
            job_run_s: s(intervals.iter().map(|i| i.run_ns).sum()),
            job_wait_s: s(intervals.iter().map(|i| i.wait_ns).sum()),
            ..Default::default()
        };
        let mut per: BTreeMap<Pid, OtherProgram> = BTreeMap::new();
        for i in &intervals {
            for &(pid, cpu) in &i.others {
                if job(pid) {
                    continue;
                }
                let p = per.entry(pid).or_insert_with(|| {
                    let n = self.names.get(&pid).cloned().unwrap_or(OtherProc {
                        pid,
                        comm: String::new(),
                        user: String::new(),
                        cmdline: String::new(),
                        cpu_ns: 0,
                    });
                    OtherProgram {
                        pid,
                        comm: n.comm,
                        user: n.user,
                        command: n.cmdline,
                        from_s: i.from.secs_since(window.0).max(0.0),
                        ..Default::default()
                    }
                });
                p.cpu_s += s(cpu);
                p.took_s += s(cpu.min(i.wait_ns));
                p.job_runnable_s += s(i.run_ns + i.wait_ns);
                p.to_s = i.to.secs_since(window.0).max(0.0);
            }
        }
        let mut v: Vec<OtherProgram> = per
            .into_values()
            .filter(|p| p.took_s > 0.0)
            .map(|mut p| {
                p.share_of_runnable = if p.job_runnable_s > 0.0 {
                    round4(p.took_s / p.job_runnable_s)
                } else {
                    0.0
                };
                p.cpu_s = round4(p.cpu_s);
                p.took_s = round4(p.took_s);
                p.job_runnable_s = round4(p.job_runnable_s);
                p.from_s = round4(p.from_s);
                p.to_s = round4(p.to_s);
                p
            })
            .collect();
        v.sort_by(|a, b| b.took_s.total_cmp(&a.took_s).then(a.pid.cmp(&b.pid)));
        out.job_run_s = round4(out.job_run_s);
        out.job_wait_s = round4(out.job_wait_s);
        out.processes = v;
        out.intervals = intervals;
        out
    }
}

impl OtherPrograms {
    /// What `pid` took from the job between `from` and `to` (seconds):
    /// each interval's `min(CPU, wait)`, by the part of it inside.
    pub fn took_between(&self, pid: Pid, from: MonoNs, to: MonoNs) -> f64 {
        self.intervals
            .iter()
            .filter(|i| i.to > from && i.from < to)
            .map(|i| {
                let len = i.to.0.saturating_sub(i.from.0).max(1) as f64;
                let inside = i.to.0.min(to.0).saturating_sub(i.from.0.max(from.0)) as f64;
                let cpu = i.others.iter().find(|o| o.0 == pid).map_or(0, |o| o.1);
                cpu.min(i.wait_ns) as f64 / 1e9 * inside / len
            })
            .sum()
    }

    /// A process's label for findings: "`stress-ng --cpu 1` (pid 4242,
    /// user alice)".
    pub fn label(p: &OtherProgram) -> String {
        let cmd = if p.command.is_empty() {
            p.comm.as_str()
        } else {
            p.command.as_str()
        };
        let cmd = match cmd.char_indices().nth(LABEL_MAX) {
            Some((i, _)) => format!("{}…", &cmd[..i]),
            None => cmd.to_string(),
        };
        format!("`{cmd}` (pid {}, user {})", p.pid.0, p.user)
    }
}

/// A process that took at least this share of a slow step's time from the
/// job is named among the step's causes.
pub const STEP_MIN_SHARE: f64 = 0.10;

/// Name, among each slow step's causes, the other programs that took at
/// least [`STEP_MIN_SHARE`] of its time from the job, first; and say in
/// `slow_causes` in how many slow steps each did.
pub fn annotate_slow_steps(steps: &mut super::steps::Steps, others: &OtherPrograms) {
    let mut count: BTreeMap<Pid, usize> = BTreeMap::new();
    for slow in &mut steps.slow {
        let Some(&(from, to)) = steps.intervals.get(slow.index) else {
            continue;
        };
        let mut found = Vec::new();
        for p in &others.processes {
            let took = others.took_between(p.pid, from, to);
            if took >= STEP_MIN_SHARE * slow.duration_s && took > 0.0 {
                *count.entry(p.pid).or_default() += 1;
                found.push(super::steps::Cause {
                    kind: "other-program",
                    text: format!(
                        "another program, {}, took up to {took:.2} s of the job's CPU time in this step",
                        OtherPrograms::label(p)
                    ),
                    excess_s: Some(round4(took)),
                });
            }
        }
        found.append(&mut slow.causes);
        slow.causes = found;
    }
    let mut lines: Vec<String> = others
        .processes
        .iter()
        .filter_map(|p| {
            let n = *count.get(&p.pid)?;
            Some(format!(
                "other program: {} took CPU from the job in {n} of {} slow steps",
                OtherPrograms::label(p),
                steps.slow.len()
            ))
        })
        .collect();
    lines.append(&mut steps.slow_causes);
    steps.slow_causes = lines;
}

/// Characters of a command line in a finding's text.
const LABEL_MAX: usize = 80;

fn round4(x: f64) -> f64 {
    (x * 10000.0).round() / 10000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(t_s: u64, run_ms: u64, wait_ms: u64, procs: &[(i32, u64)]) -> Event {
        Event::OtherCpu {
            t: MonoNs(t_s * 1_000_000_000),
            interval_ns: 1_000_000_000,
            job_run_ns: run_ms * 1_000_000,
            job_wait_ns: wait_ms * 1_000_000,
            procs: procs
                .iter()
                .map(|&(pid, ms)| OtherProc {
                    pid: Pid(pid),
                    comm: format!("p{pid}"),
                    user: "root".into(),
                    cmdline: format!("prog {pid}"),
                    cpu_ns: ms * 1_000_000,
                })
                .collect(),
        }
    }

    #[test]
    fn a_process_takes_at_most_the_jobs_wait() {
        let mut b = Builder::default();
        // A hog sharing the job's CPU: half each. Then the hog alone on
        // another CPU (the job did not wait): nothing taken.
        b.add(&ev(1, 500, 500, &[(9, 500)]));
        b.add(&ev(2, 500, 500, &[(9, 500), (8, 900)]));
        b.add(&ev(3, 1000, 0, &[(9, 1000)]));
        b.add(&ev(4, 1000, 0, &[(7, 50)]));
        let o = b.finish((MonoNs(0), MonoNs(5_000_000_000)), &|p| p.0 == 8);
        assert!(o.measured);
        assert_eq!(o.processes.len(), 1, "{:?}", o.processes);
        let p = &o.processes[0];
        assert_eq!((p.pid, p.cpu_s, p.took_s), (Pid(9), 2.0, 1.0));
        assert_eq!(p.job_runnable_s, 3.0);
        assert_eq!(p.share_of_runnable, 0.3333);
        assert_eq!(OtherPrograms::label(p), "`prog 9` (pid 9, user root)");
        let half = o.took_between(Pid(9), MonoNs(500_000_000), MonoNs(1_000_000_000));
        assert!((half - 0.25).abs() < 1e-9, "{half}");

        // A slow step in the second the hog took 0.5 s is said to be its;
        // one in the second it took nothing is not.
        let sec = |x: u64| MonoNs(x * 1_000_000_000);
        let slow = |index: usize| super::super::steps::SlowStep {
            index,
            start_s: index as f64,
            duration_s: 1.0,
            vs_median: 2.0,
            causes: Vec::new(),
        };
        let mut steps = super::super::steps::Steps {
            count: 4,
            intervals: (0..4).map(|i| (sec(i), sec(i + 1))).collect(),
            slow: vec![slow(1), slow(3)],
            slow_causes: vec!["cpu: …".into()],
            ..Default::default()
        };
        annotate_slow_steps(&mut steps, &o);
        assert_eq!(steps.slow[0].causes.len(), 1, "{:?}", steps.slow);
        assert_eq!(steps.slow[0].causes[0].kind, "other-program");
        assert!(steps.slow[0].causes[0].text.contains("(pid 9, user root)"));
        assert!(steps.slow[1].causes.is_empty());
        assert_eq!(steps.slow_causes.len(), 2);
        assert!(steps.slow_causes[0].contains("in 1 of 2 slow steps"));
    }
}
