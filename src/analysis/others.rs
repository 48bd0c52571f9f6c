//! CPU that other programs took from the job (see
//! [`crate::collect::others`]): per process outside the job's tree, how
//! much of the job's runnable time it took.
//!
//! The estimate, per interval (a second while the job waits for a CPU, up
//! to five otherwise): the job's threads waited `W` on run queues; another
//! process used `C` of CPU, a share `f` of it on CPUs the job's threads
//! may run on (its CPU looked at at every sampling tick). It took `C·f` from the job, scaled down, for all of them alike,
//! when together they used more than `W` there. Its share is the sum over
//! the intervals it was busy in, divided by the job's runnable time (run +
//! wait) in the same intervals. An estimate: `f` is sampled ten times a
//! second, and CPU used on the job's CPUs while the job had nothing
//! waiting (between its bursts within the second) is counted as taken.

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
    /// (process, CPU ns, share of its time on the job's CPUs) of the
    /// others listed.
    pub others: Vec<(Pid, u64, f64)>,
    /// What each of them took from the job (ns), once the job's own
    /// processes are known (see [`Interval::takes`]).
    pub took: Vec<(Pid, f64)>,
    /// Share of the job cgroup's CPU periods in which its own quota
    /// throttled it: that much of the job's wait was the quota's, not any
    /// other program's.
    pub quota_share: f64,
}

impl Interval {
    /// What each other process took from the job in this interval (ns): its
    /// CPU time on the job's CPUs, scaled down when together they used
    /// more there than the job waited (see the module).
    pub fn takes<'a>(
        &'a self,
        job: &'a dyn Fn(Pid) -> bool,
    ) -> impl Iterator<Item = (Pid, f64)> + 'a {
        let on = |o: &(Pid, u64, f64)| o.1 as f64 * o.2.clamp(0.0, 1.0);
        let sum: f64 = self.others.iter().filter(|o| !job(o.0)).map(on).sum();
        let wait = self.wait_ns as f64 * (1.0 - self.quota_share.clamp(0.0, 1.0));
        let scale = if sum > wait { wait / sum.max(1.0) } else { 1.0 };
        self.others
            .iter()
            .filter(move |o| !job(o.0))
            .map(move |o| (o.0, on(o) * scale))
    }
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
    /// Of the job's runnable time, what it took (an estimate: see the
    /// module).
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
            others: procs
                .iter()
                .map(|p| (p.pid, p.cpu_ns, p.on_job_cpus as f64))
                .collect(),
            took: Vec::new(),
            quota_share: 0.0,
        });
    }

    /// The figures of the recorded window; `job` says which pids are the
    /// job's own (a pid the tree learnt of late is never blamed);
    /// `throttled` the share of the job cgroup's CPU periods throttled by
    /// its quota between two instants (0 without a quota).
    pub fn finish(
        self,
        window: (MonoNs, MonoNs),
        job: &dyn Fn(Pid) -> bool,
        throttled: &dyn Fn(MonoNs, MonoNs) -> f64,
    ) -> OtherPrograms {
        let s = |ns: u64| ns as f64 / 1e9;
        let mut intervals: Vec<Interval> = self
            .intervals
            .into_iter()
            .filter(|i| i.to > window.0 && i.from < window.1)
            .collect();
        for i in &mut intervals {
            i.quota_share = throttled(i.from, i.to);
            i.took = i.takes(job).collect();
        }
        let mut out = OtherPrograms {
            measured: !intervals.is_empty(),
            job_run_s: s(intervals.iter().map(|i| i.run_ns).sum()),
            job_wait_s: s(intervals.iter().map(|i| i.wait_ns).sum()),
            ..Default::default()
        };
        let mut per: BTreeMap<Pid, OtherProgram> = BTreeMap::new();
        for i in &intervals {
            for &(pid, took) in &i.took {
                let cpu = i.others.iter().find(|o| o.0 == pid).map_or(0, |o| o.1);
                let p = per.entry(pid).or_insert_with(|| {
                    let n = self.names.get(&pid).cloned().unwrap_or(OtherProc {
                        pid,
                        comm: String::new(),
                        user: String::new(),
                        cmdline: String::new(),
                        cpu_ns: 0,
                        on_job_cpus: 1.0,
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
                p.took_s += took / 1e9;
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
                let took = i.took.iter().find(|o| o.0 == pid).map_or(0.0, |o| o.1);
                took / 1e9 * inside / len
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
                        "another program, {}, took ~{took:.2} s of the job's CPU time in this step",
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
                    on_job_cpus: if pid == 6 { 0.0 } else { 1.0 },
                })
                .collect(),
        }
    }

    /// A job held back by its own cgroup's CPU quota waits for its next
    /// period, not for the programs that run meanwhile.
    #[test]
    fn the_quota_s_share_of_the_wait_is_nobody_s_taking() {
        let run = |share: f64| {
            let mut b = Builder::default();
            b.add(&ev(1, 400, 600, &[(9, 900)]));
            b.finish((MonoNs(0), MonoNs(2_000_000_000)), &|_| false, &|_, _| {
                share
            })
        };
        assert_eq!(run(0.0).processes[0].took_s, 0.6);
        assert_eq!(run(0.5).processes[0].took_s, 0.3);
        assert!(run(1.0).processes.is_empty());
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
        // Two on the job's CPUs using twice what the job waited: half each;
        // one on other CPUs only (pid 6): nothing.
        b.add(&ev(5, 400, 600, &[(9, 600), (5, 600), (6, 900)]));
        let o = b.finish(
            (MonoNs(0), MonoNs(6_000_000_000)),
            &|p| p.0 == 8,
            &|_, _| 0.0,
        );
        assert!(o.measured);
        assert_eq!(o.processes.len(), 2, "{:?}", o.processes);
        let p = &o.processes[0];
        assert_eq!((p.pid, p.cpu_s, p.took_s), (Pid(9), 2.6, 1.3));
        assert_eq!(p.job_runnable_s, 4.0);
        assert_eq!(p.share_of_runnable, 0.325);
        assert_eq!((o.processes[1].pid, o.processes[1].took_s), (Pid(5), 0.3));
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
