//! The run cut into short bins (one sampling interval each, at most
//! [`MAX_BINS`]), with what the job's input threads did in each, and the
//! cause of GPU waiting that each bin points to. Findings add up bins: with
//! GPU data the GPU's idle gaps inside them (measured), without it the bins
//! themselves weighted as each finding states (estimated).

use std::collections::BTreeSet;

use crate::analysis::{Analysis, Process, Role, Series, Thread};
use crate::event::{MonoNs, Pid, Tid};

use super::thresholds as th;

/// Bins per run at most: bounds memory and time on day-long recordings.
pub const MAX_BINS: usize = 20_000;

/// What kept the input side from feeding the GPU in a bin. Exclusive: a
/// bin has one cause, in this order of precedence (a thread blocked on IO
/// cannot be computing, and a pipeline starved of CPU by oversubscription
/// looks saturated without being short of workers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cause {
    /// Input threads mostly blocked in D state.
    Io,
    /// No workers; the main thread computing.
    MainPreprocessing,
    /// The job's runnable threads far exceed the cores.
    Oversubscribed,
    /// The workers all want a whole core.
    PipelineSaturated,
}

/// One thread feeding the GPU: a worker's busiest thread, or the main
/// process's busiest thread. Per-bin figures are only kept in aggregate
/// (see [`Timeline`]), so memory does not grow with the number of workers.
#[derive(Clone, Debug)]
pub struct InputThread {
    pub pid: Pid,
    pub tid: Tid,
    pub role: Role,
    pub name: String,
    pub cpu_s: f64,
    pub life_s: f64,
    /// Seconds observed in each scheduler state.
    pub state_ns: std::collections::BTreeMap<char, u64>,
}

impl InputThread {
    /// Share of its observed life the thread spent in `state`.
    pub fn state_share(&self, state: char) -> f64 {
        let total: u64 = self.state_ns.values().sum();
        if total == 0 {
            return 0.0;
        }
        self.state_ns.get(&state).copied().unwrap_or(0) as f64 / total as f64
    }
    /// Mean cores used while alive.
    pub fn cpu_share(&self) -> f64 {
        if self.life_s > 0.0 {
            self.cpu_s / self.life_s
        } else {
            0.0
        }
    }
}

#[derive(Clone, Debug)]
pub struct Timeline {
    pub start: MonoNs,
    pub end: MonoNs,
    pub bin_ns: u64,
    pub n: usize,
    pub cores: f64,
    pub workers: Vec<InputThread>,
    pub mains: Vec<InputThread>,
    /// Worker processes alive in the bin (fractional at their edges).
    pub workers_alive: Vec<f32>,
    /// Mean cores used by the main threads alive in the bin.
    pub main_cpu: Vec<f32>,
    /// Mean share in D of the input threads alive (workers, or the main
    /// threads when there are no workers).
    pub input_d: Vec<f32>,
    /// Mean share in R of the workers alive (NaN: none alive).
    pub workers_r: Vec<f32>,
    /// Threads of the job in R, summed.
    pub job_runnable: Vec<f32>,
    /// Machine CPU busy (0..=1 of all cores), PSI cpu "some" (0..=1, NaN
    /// when not measured).
    pub sys_busy: Vec<f32>,
    pub psi_cpu: Vec<f32>,
    pub cause: Vec<Option<Cause>>,
}

fn bin_span(start: MonoNs, bin_ns: u64, i: usize) -> (MonoNs, MonoNs) {
    (
        MonoNs(start.0 + bin_ns * i as u64),
        MonoNs(start.0 + bin_ns * (i as u64 + 1)),
    )
}

/// Add `weight` × overlap/bin of [t0, t1) to the bins it covers.
fn spread(out: &mut [f32], start: MonoNs, bin_ns: u64, t0: MonoNs, t1: MonoNs, weight: f64) {
    if t1 <= t0 || out.is_empty() {
        return;
    }
    let a = t0.0.max(start.0) - start.0;
    let b = t1.0.saturating_sub(start.0);
    if b <= a {
        return;
    }
    let first = (a / bin_ns) as usize;
    let last = (((b - 1) / bin_ns) as usize).min(out.len() - 1);
    for (i, slot) in out.iter_mut().enumerate().take(last + 1).skip(first) {
        let lo = (i as u64 * bin_ns).max(a);
        let hi = ((i as u64 + 1) * bin_ns).min(b);
        if hi > lo {
            *slot += (weight * (hi - lo) as f64 / bin_ns as f64) as f32;
        }
    }
}

fn series_bins(s: &Series, start: MonoNs, bin_ns: u64, n: usize, scale: f64) -> Vec<f32> {
    let mut out = vec![0.0f32; n];
    for p in s.points() {
        spread(&mut out, start, bin_ns, p.t0, p.t1, p.v * scale);
    }
    out
}

/// Bins covered by a series at all (to tell "0" from "not measured").
fn coverage_bins(s: &Series, start: MonoNs, bin_ns: u64, n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n];
    for p in s.points() {
        spread(&mut out, start, bin_ns, p.t0, p.t1, 1.0);
    }
    out
}

fn busiest_thread(p: &Process) -> Option<&Thread> {
    p.threads
        .values()
        .max_by_key(|t| (t.user_ns + t.sys_ns, std::cmp::Reverse(t.tid)))
}

/// Per-bin sums over a group of threads: alive, R, D, cores used.
struct Sums {
    alive: Vec<f32>,
    r: Vec<f32>,
    d: Vec<f32>,
    cpu: Vec<f32>,
}

impl Sums {
    fn new(n: usize) -> Sums {
        Sums {
            alive: vec![0.0; n],
            r: vec![0.0; n],
            d: vec![0.0; n],
            cpu: vec![0.0; n],
        }
    }

    /// Add one thread; returns its summary.
    fn add(
        &mut self,
        p: &Process,
        t: &Thread,
        start: MonoNs,
        end: MonoNs,
        bin_ns: u64,
    ) -> InputThread {
        let (from, to) = p.lifetime(end);
        spread(&mut self.alive, start, bin_ns, from, to, 1.0);
        for run in &t.state_runs {
            // A merged run (long recordings) holds both states in part.
            if run.r_ns > 0 {
                spread(&mut self.r, start, bin_ns, run.from, run.to, run.share('R'));
            }
            if run.d_ns > 0 {
                spread(&mut self.d, start, bin_ns, run.from, run.to, run.share('D'));
            }
        }
        for pt in t.cpu.points() {
            spread(&mut self.cpu, start, bin_ns, pt.t0, pt.t1, pt.v);
        }
        InputThread {
            pid: p.pid,
            tid: t.tid,
            role: p.role,
            name: t.comm.clone(),
            cpu_s: (t.user_ns + t.sys_ns) as f64 / 1e9,
            life_s: to.secs_since(from.max(start)),
            state_ns: t.state_ns.clone(),
        }
    }

    /// Per bin: `v` divided by the threads alive (NaN when none is).
    fn mean(&self, v: &[f32]) -> Vec<f32> {
        v.iter()
            .zip(&self.alive)
            .map(|(x, a)| if *a <= 0.01 { f32::NAN } else { x / a })
            .collect()
    }
}

impl Timeline {
    /// The whole job's timeline.
    pub fn build(a: &Analysis) -> Timeline {
        Timeline::build_scoped(a, None)
    }

    /// The timeline of one rank's input side (its main processes and its
    /// workers; `None`: every process). What the whole machine and job do
    /// (runnable threads, CPU busy, pressure) stays machine-wide, so every
    /// scope classifies a moment of CPU contention the same way.
    pub fn build_scoped(a: &Analysis, rank: Option<u32>) -> Timeline {
        let in_scope = |p: &&Process| rank.is_none() || p.rank == rank;
        let (start, end) = (a.start, a.end.max(a.start));
        let dur = end.0 - start.0;
        let bin_ns = a
            .header
            .interval_ns
            .max(1)
            .max(dur.div_ceil(MAX_BINS as u64));
        let n = (dur.div_ceil(bin_ns) as usize).max(1);
        let cores = a.system.cpus.max(1) as f64;

        let mut wsum = Sums::new(n);
        let workers: Vec<InputThread> = a
            .processes_with_role(Role::Worker)
            .filter(in_scope)
            .filter_map(|p| busiest_thread(p).map(|t| wsum.add(p, t, start, end, bin_ns)))
            .collect();
        // Main processes that did real work: a wrapper shell or launcher
        // with next to no CPU does not dilute the main thread's figures.
        let main_cpu_max = a
            .processes_with_role(Role::Main)
            .filter(in_scope)
            .map(|p| p.cpu_s())
            .fold(0.0, f64::max);
        let mut msum = Sums::new(n);
        let mut mains: Vec<InputThread> = a
            .processes_with_role(Role::Main)
            .filter(in_scope)
            .filter(|p| p.cpu_s() >= 0.1 * main_cpu_max)
            .filter_map(|p| busiest_thread(p).map(|t| msum.add(p, t, start, end, bin_ns)))
            .collect();
        if mains.is_empty() && rank.is_none() {
            if let Some(p) = a.processes.values().find(|p| p.is_job) {
                if let Some(t) = busiest_thread(p) {
                    mains.push(msum.add(p, t, start, end, bin_ns));
                }
            }
        }
        let main_cpu = msum.mean(&msum.cpu);
        let input_d = if workers.is_empty() {
            msum.mean(&msum.d)
        } else {
            wsum.mean(&wsum.d)
        };
        let workers_r = wsum.mean(&wsum.r);
        let workers_alive = wsum.alive;

        let mut job_runnable = vec![0.0f32; n];
        for p in a.processes.values() {
            for t in p.threads.values() {
                for run in t.state_runs.iter().filter(|r| r.r_ns > 0) {
                    spread(
                        &mut job_runnable,
                        start,
                        bin_ns,
                        run.from,
                        run.to,
                        run.share('R'),
                    );
                }
            }
        }
        let sys_busy = series_bins(&a.system.busy, start, bin_ns, n, 0.01);
        let psi_cpu = {
            let v = series_bins(&a.system.psi_cpu.some, start, bin_ns, n, 0.01);
            let c = coverage_bins(&a.system.psi_cpu.some, start, bin_ns, n);
            v.iter()
                .zip(&c)
                .map(|(v, c)| if *c > 0.01 { v / c } else { f32::NAN })
                .collect()
        };

        let mut tl = Timeline {
            start,
            end,
            bin_ns,
            n,
            cores,
            workers,
            mains,
            workers_alive,
            main_cpu,
            input_d,
            workers_r,
            job_runnable,
            sys_busy,
            psi_cpu,
            cause: vec![None; n],
        };
        tl.cause = (0..n).map(|i| tl.classify(i)).collect();
        tl
    }

    fn classify(&self, i: usize) -> Option<Cause> {
        let ge = |v: f32, t: f64| !v.is_nan() && v as f64 >= t;
        if ge(self.input_d[i], th::IO_D_SHARE) {
            return Some(Cause::Io);
        }
        if self.workers.is_empty() && ge(self.main_cpu[i], th::MAIN_BUSY_CORES) {
            return Some(Cause::MainPreprocessing);
        }
        let runnable = self.job_runnable[i] as f64;
        let psi = self.psi_cpu[i];
        if runnable >= th::OVERSUBSCRIBED_RUNNABLE_PER_CORE * self.cores
            && (psi.is_nan() || psi as f64 >= th::OVERSUBSCRIBED_PSI_CPU)
        {
            return Some(Cause::Oversubscribed);
        }
        if !self.workers.is_empty() && ge(self.workers_r[i], th::SATURATED_WORKERS_SHARE) {
            return Some(Cause::PipelineSaturated);
        }
        None
    }

    pub fn bin_s(&self, i: usize) -> f64 {
        let (a, b) = bin_span(self.start, self.bin_ns, i);
        b.min(self.end).secs_since(a)
    }

    pub fn bins_of(&self, cause: Cause) -> impl Iterator<Item = usize> + '_ {
        (0..self.n).filter(move |i| self.cause[*i] == Some(cause))
    }

    /// Seconds of bins with this cause.
    pub fn cause_s(&self, cause: Cause) -> f64 {
        self.bins_of(cause).map(|i| self.bin_s(i)).sum()
    }

    /// Σ over bins with this cause of bin length × `weight(bin)`.
    pub fn weighted_s(&self, cause: Cause, weight: impl Fn(usize) -> f64) -> f64 {
        self.bins_of(cause)
            .map(|i| self.bin_s(i) * weight(i).clamp(0.0, 1.0))
            .sum()
    }

    /// Merged time spans of the bins with this cause.
    pub fn spans(&self, cause: Cause) -> Vec<(MonoNs, MonoNs)> {
        let mut out: Vec<(MonoNs, MonoNs)> = Vec::new();
        for i in self.bins_of(cause) {
            let (a, b) = bin_span(self.start, self.bin_ns, i);
            let b = b.min(self.end);
            match out.last_mut() {
                Some(last) if last.1 == a => last.1 = b,
                _ => out.push((a, b)),
            }
        }
        out
    }

    /// Time-weighted mean of a series over spans.
    pub fn mean_over(s: &Series, spans: &[(MonoNs, MonoNs)]) -> Option<f64> {
        let (mut sum, mut dur) = (0.0, 0.0);
        for (a, b) in spans {
            if let Some(m) = s.mean_in(*a, *b) {
                let d = b.secs_since(*a);
                sum += m * d;
                dur += d;
            }
        }
        (dur > 0.0).then(|| sum / dur)
    }

    /// Mean over the bins with this cause of a per-bin figure (NaN skipped).
    pub fn mean_of(&self, cause: Cause, v: &[f32]) -> Option<f64> {
        let (mut sum, mut dur) = (0.0, 0.0);
        for i in self.bins_of(cause) {
            if !v[i].is_nan() {
                sum += v[i] as f64 * self.bin_s(i);
                dur += self.bin_s(i);
            }
        }
        (dur > 0.0).then(|| sum / dur)
    }

    /// Idle seconds of a GPU's idle-share series within `window`, by the
    /// cause of the bins they fell in (None: no cause). A sample window
    /// spanning several bins gives each the part of its idle time that
    /// overlaps it (its idle share spread evenly, see `analysis::gpu`).
    pub fn idle_by_cause(
        &self,
        idle: &Series,
        window: (MonoNs, MonoNs),
    ) -> Vec<(Option<Cause>, f64)> {
        let mut acc: Vec<(Option<Cause>, f64)> = Vec::new();
        let mut add = |c: Option<Cause>, s: f64| match acc.iter_mut().find(|x| x.0 == c) {
            Some(x) => x.1 += s,
            None => acc.push((c, s)),
        };
        let (w0, w1) = (window.0.max(self.start), window.1.min(self.end));
        let first_pt = idle.points().partition_point(|p| p.t1 <= w0);
        for p in &idle.points()[first_pt..] {
            if p.t0 >= w1 {
                break;
            }
            let (g0, g1) = (p.t0.max(w0), p.t1.min(w1));
            if g1 <= g0 || p.v <= 0.0 {
                continue;
            }
            let first = ((g0.0 - self.start.0) / self.bin_ns) as usize;
            let last = (((g1.0 - self.start.0).saturating_sub(1)) / self.bin_ns) as usize;
            for i in first..=last.min(self.n - 1) {
                let (a, b) = bin_span(self.start, self.bin_ns, i);
                let lo = a.max(g0);
                let hi = b.min(g1);
                if hi > lo {
                    add(self.cause[i], p.v * hi.secs_since(lo));
                }
            }
        }
        acc
    }

    /// PIDs of the input processes (workers, else the main processes).
    pub fn input_pids(&self) -> BTreeSet<Pid> {
        let src = if self.workers.is_empty() {
            &self.mains
        } else {
            &self.workers
        };
        src.iter().map(|t| t.pid).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_splits_across_bins() {
        let mut v = vec![0.0f32; 4];
        spread(&mut v, MonoNs(100), 10, MonoNs(105), MonoNs(125), 1.0);
        assert_eq!(v, vec![0.5, 1.0, 0.5, 0.0]);
        // Before the start and past the end are clipped.
        let mut v = vec![0.0f32; 2];
        spread(&mut v, MonoNs(100), 10, MonoNs(50), MonoNs(500), 2.0);
        assert_eq!(v, vec![2.0, 2.0]);
    }
}
