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

/// What kept the GPU from being fed in a bin. Exclusive: a bin has one
/// cause, in this order of precedence (the order of the variants): what
/// starves the whole job — memory stalls, the cgroup's CPU limit — before
/// what it shows as (threads blocked, workers saturated); workers
/// restarting before the IO and CPU their start-up causes; a thread blocked
/// on IO cannot be computing; a pipeline starved of CPU by
/// oversubscription looks saturated without being short of workers; the
/// training loop's own work only when the input keeps up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cause {
    /// Tasks stalled on memory (PSI memory): reclaim, swapping, a page
    /// cache too small for the dataset.
    MemoryPressure,
    /// The job's cgroup used up its CPU quota and waited for the next
    /// period.
    CpuLimited,
    /// Between one generation of input workers and the next being ready
    /// (workers restarted, e.g. every epoch).
    WorkerRestart,
    /// Input threads mostly blocked in D state, reading.
    Io,
    /// The main thread (or the input threads) blocked in D state while
    /// writing: checkpoints, logs.
    WriteStall,
    /// No workers; the main thread computing.
    MainPreprocessing,
    /// The job's runnable threads far exceed the cores.
    Oversubscribed,
    /// The workers all want a whole core.
    PipelineSaturated,
    /// The workers keep up (not saturated) while the main thread computes:
    /// the training loop's own host work between steps.
    TrainingLoop,
    /// The main thread compiling the model (torch.compile), see
    /// [`super::compile`].
    Compiling,
}

impl Cause {
    pub const ALL: [Cause; 10] = [
        Cause::MemoryPressure,
        Cause::CpuLimited,
        Cause::WorkerRestart,
        Cause::Io,
        Cause::WriteStall,
        Cause::MainPreprocessing,
        Cause::Oversubscribed,
        Cause::PipelineSaturated,
        Cause::TrainingLoop,
        Cause::Compiling,
    ];
}

/// A restart of the input workers: the previous generation began to exit
/// at `down`, the new one started at `up` (and is `size` workers).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Restart {
    pub down: MonoNs,
    pub up: MonoNs,
    /// When the new generation had its first batch out, as far as the
    /// recording tells: see [`restarts`].
    pub ready: MonoNs,
    pub size: usize,
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
    /// Mean cores used by the main threads alive in the bin, and their mean
    /// share in R (running or waiting for a CPU) and in D.
    pub main_cpu: Vec<f32>,
    pub main_r: Vec<f32>,
    pub main_d: Vec<f32>,
    /// Bytes/s written and read by the main processes, and by the input
    /// processes (workers, else the main processes), summed over the bin
    /// and the [`th::WRITE_LOOKBACK_S`] before it (for comparing writes
    /// with reads, not as rates).
    pub main_write_bps: Vec<f32>,
    pub main_read_bps: Vec<f32>,
    pub input_write_bps: Vec<f32>,
    pub input_read_bps: Vec<f32>,
    /// Share of the job's cgroup's periods throttled by its CPU limit, and
    /// PSI memory "some" (0..=1; NaN when not measured).
    pub cg_throttled: Vec<f32>,
    /// The job's cgroup CPU quota in cores, when it binds: below the
    /// machine's cores and throttling at least [`th::CPU_THROTTLED_SHARE`]
    /// of the periods over the whole recording.
    pub binding_quota: Option<f64>,
    pub psi_mem: Vec<f32>,
    /// Restarts of the input workers, and the bins inside a restart.
    pub restarts: Vec<Restart>,
    pub restarting: Vec<bool>,
    /// Mean share in D of the input threads alive (workers, or the main
    /// threads when there are no workers).
    pub input_d: Vec<f32>,
    /// Mean share in R of the workers alive (NaN: none alive).
    pub workers_r: Vec<f32>,
    /// Mean cores used by the workers' input threads alive (NaN: none
    /// alive): what tells an R reading of a working thread from one taken
    /// at the instant a sleeping thread woke.
    pub workers_cpu: Vec<f32>,
    /// Threads of the job in R, summed.
    pub job_runnable: Vec<f32>,
    /// Machine CPU busy (0..=1 of all cores), PSI cpu "some" (0..=1, NaN
    /// when not measured).
    pub sys_busy: Vec<f32>,
    pub psi_cpu: Vec<f32>,
    pub cause: Vec<Option<Cause>>,
    /// The first bin of the training loop: that of the first step's start
    /// when steps were found and the recording saw the job start (else
    /// what comes before the first step is not start-up), else the end of
    /// the imports told by the stacks ([`super::edges`]), else 0. The
    /// estimates of GPU time from the
    /// CPU side ([`Timeline::weighted_s`]) start there: before its first
    /// step a job imports, builds its model and starts its workers, and a
    /// GPU has nothing to run yet (a measured GPU's idle time before its
    /// first work is left out the same way).
    pub loop_from: usize,
    /// What `loop_from` is: the first step, the end of the imports, or
    /// neither (0).
    pub loop_from_by: LoopFrom,
    /// The first bin after the start-up's imports and the instant in it
    /// at which they ended, when they ran on into it and the loop had not
    /// begun before it: the samples of that bin taken before the instant
    /// are the start-up's, not the bin's cause's
    /// ([`Timeline::cause_bin_of`]). A bin is 100 ms: up to ten samples of
    /// a thread, enough to make a short run's loop look like it imported
    /// 5% of the time.
    pub imports_tail: Option<(usize, MonoNs)>,
    /// The last bin before the shutdown and the instant in it at which the
    /// job's exit began (its interpreter running no Python code any
    /// more): the samples of that bin from then on are the shutdown's.
    pub exit_head: Option<(usize, MonoNs)>,
    /// First bin of the job's shutdown (the interpreter running no
    /// Python code any more, see [`super::edges`]), else `n`. Bins from
    /// here on, like the start-up's imports before `loop_from` (with
    /// steps found or not), have no cause: no finding counts them.
    pub shutdown_from: usize,
}

/// Where the training loop was taken to begin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoopFrom {
    /// The recording's start: no step found, no start-up told apart (or the
    /// recording did not see the job start).
    Start,
    /// The first step.
    FirstStep,
    /// The end of the job's imports (main and input threads) (no step found).
    Imports,
}

/// A per-bin share at or above `t` (a bin without data never is).
fn ge(v: f32, t: f64) -> bool {
    !v.is_nan() && v as f64 >= t
}

/// Per bin: whether it lies mostly inside one of the workers' restarts.
fn restarting_bins(restarts: &[Restart], start: MonoNs, bin_ns: u64, n: usize) -> Vec<bool> {
    let mut restarting = vec![false; n];
    for r in restarts {
        let mut w = vec![0.0f32; n];
        spread(&mut w, start, bin_ns, r.down, r.ready, 1.0);
        for (slot, v) in restarting.iter_mut().zip(&w) {
            if *v >= 0.5 {
                *slot = true;
            }
        }
    }
    restarting
}

/// Per bin: the job's threads in R (running or waiting for a CPU), summed.
fn job_runnable(a: &Analysis, start: MonoNs, bin_ns: u64, n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n];
    for p in a.processes.values() {
        for t in p.threads.values() {
            for run in t.state_runs.iter().filter(|r| r.r_ns > 0) {
                spread(&mut out, start, bin_ns, run.from, run.to, run.share('R'));
            }
        }
    }
    out
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

/// Per bin, the time-weighted mean of a series where it has points (NaN
/// where it has none), × `scale`.
fn mean_bins(s: &Series, start: MonoNs, bin_ns: u64, n: usize, scale: f64) -> Vec<f32> {
    let v = series_bins(s, start, bin_ns, n, scale);
    let c = coverage_bins(s, start, bin_ns, n);
    v.iter()
        .zip(&c)
        .map(|(v, c)| if *c > 0.01 { v / c } else { f32::NAN })
        .collect()
}

/// Restarts of the input workers: a generation is the workers that
/// started within [`th::WORKER_GENERATION_S`] of its first, before any of
/// them exited; each
/// generation after the first is a restart. The previous generation began
/// to exit at `down` (its first exit at most [`th::RESTART_WINDOW_S`]
/// before the new start, else the new start). The new generation is ready
/// when the GPU works again (`gpu_busy_after`: the first moment from the
/// new start on when the job's GPUs were more busy than idle); without GPU
/// data, at the end of its workers' first run of computing (start-up and
/// first batches, an upper bound) — at most [`th::RESTART_WINDOW_S`] after
/// the new start.
pub fn restarts(
    workers: &[&Process],
    end: MonoNs,
    gpu_busy_after: impl Fn(MonoNs) -> Option<MonoNs>,
) -> Vec<Restart> {
    let mut ws: Vec<&&Process> = workers.iter().collect();
    ws.sort_by_key(|p| (p.first_seen, p.pid));
    let gen_ns = (th::WORKER_GENERATION_S * 1e9) as u64;
    let window_ns = (th::RESTART_WINDOW_S * 1e9) as u64;
    let mut gens: Vec<Vec<&Process>> = Vec::new();
    for p in ws {
        // One generation starts together and lives together: a worker that
        // starts after one of the current generation exited is the next
        // generation, however short the epoch was.
        match gens.last_mut() {
            Some(g)
                if p.first_seen.0 <= g[0].first_seen.0 + gen_ns
                    && !g
                        .iter()
                        .any(|q| q.exited.is_some_and(|e| e <= p.first_seen)) =>
            {
                g.push(p)
            }
            _ => gens.push(vec![p]),
        }
    }
    let mut out = Vec::new();
    for k in 1..gens.len() {
        let up = gens[k][0].first_seen;
        let down = gens[k - 1]
            .iter()
            .filter_map(|p| p.exited)
            .filter(|e| e.0 + window_ns >= up.0 && e.0 <= up.0 + gen_ns)
            .min()
            .unwrap_or(up)
            .min(up);
        let ready = match gpu_busy_after(up) {
            Some(t) => t.0,
            None => {
                // The first run of R of each new worker's busiest thread.
                let mut firsts: Vec<u64> = gens[k]
                    .iter()
                    .filter_map(|p| busiest_thread(p))
                    .filter_map(|t| {
                        t.state_runs
                            .iter()
                            .find(|r| r.state() == 'R' && r.to > up)
                            .map(|r| r.to.0)
                    })
                    .collect();
                firsts.sort_unstable();
                firsts.get(firsts.len() / 2).copied().unwrap_or(up.0)
            }
        }
        .clamp(up.0, up.0 + window_ns)
        .min(end.0);
        out.push(Restart {
            down,
            up,
            ready: MonoNs(ready),
            size: gens[k].len(),
        });
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
        // Clipped to the process's life, so that the shares divided by the
        // threads alive stay shares: a state read last before the exit
        // holds until the next reading, after it.
        let life = |t0: MonoNs, t1: MonoNs| (t0.max(from), t1.min(to));
        for run in &t.state_runs {
            let (t0, t1) = life(run.from, run.to);
            // A merged run (long recordings) holds both states in part.
            if run.r_ns > 0 {
                spread(&mut self.r, start, bin_ns, t0, t1, run.share('R'));
            }
            if run.d_ns > 0 {
                spread(&mut self.d, start, bin_ns, t0, t1, run.share('D'));
            }
        }
        for pt in t.cpu.points() {
            // The CPU time of a reading was all used while alive.
            let (t0, t1) = life(pt.t0, pt.t1);
            if t1 > t0 {
                let v = pt.v * (pt.t1.0 - pt.t0.0) as f64 / (t1.0 - t0.0) as f64;
                spread(&mut self.cpu, start, bin_ns, t0, t1, v);
            }
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
    /// The bins of [`Timeline::build_scoped`] and each bin's cause, before
    /// the loop's edges and the stacks' grounding (see `diagnose/mod.rs`).
    pub(super) fn binned(a: &Analysis, rank: Option<u32>) -> Timeline {
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
            .filter(|p| p.cpu_s() >= th::MAIN_PROCESS_MIN_CPU_SHARE * main_cpu_max)
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
        let main_r = msum.mean(&msum.r);
        let main_d = msum.mean(&msum.d);
        let input_d = if workers.is_empty() {
            msum.mean(&msum.d)
        } else {
            wsum.mean(&wsum.d)
        };
        // IO rates of the main and the input processes.
        let rates = |pids: &BTreeSet<Pid>, write: bool| {
            let mut out = vec![0.0f32; n];
            for p in a.processes.values().filter(|p| pids.contains(&p.pid)) {
                let s = if write { &p.write_bps } else { &p.read_bps };
                for pt in s.points() {
                    spread(&mut out, start, bin_ns, pt.t0, pt.t1, pt.v);
                }
            }
            out
        };
        let main_pids: BTreeSet<Pid> = mains.iter().map(|t| t.pid).collect();
        let input_pids: BTreeSet<Pid> = if workers.is_empty() {
            main_pids.clone()
        } else {
            workers.iter().map(|t| t.pid).collect()
        };
        // Summed over the bin and the [`th::WRITE_LOOKBACK_S`] before it: a
        // buffered write is counted when the pages are dirtied, the wait
        // comes later, when they are flushed (fsync, close, dirty limits).
        let k = ((th::WRITE_LOOKBACK_S * 1e9) as u64 / bin_ns) as usize;
        let lookback = |v: Vec<f32>| -> Vec<f32> {
            let mut out = vec![0.0f32; v.len()];
            let mut acc = 0.0f64;
            for i in 0..v.len() {
                acc += v[i] as f64;
                if i > k {
                    acc -= v[i - k - 1] as f64;
                }
                out[i] = acc.max(0.0) as f32;
            }
            out
        };
        let main_write_bps = lookback(rates(&main_pids, true));
        let main_read_bps = lookback(rates(&main_pids, false));
        let input_write_bps = lookback(rates(&input_pids, true));
        let input_read_bps = lookback(rates(&input_pids, false));
        let cg_throttled = mean_bins(&a.system.cgroup.throttled_share, start, bin_ns, n, 1.0);
        let cg = &a.system.cgroup;
        let binding_quota = cg.cpu_quota_cores.filter(|q| {
            *q < cores
                && cg.periods > 0
                && cg.throttled_periods as f64 >= th::CPU_THROTTLED_SHARE * cg.periods as f64
        });
        let psi_mem = mean_bins(&a.system.psi_memory.some, start, bin_ns, n, 0.01);
        let worker_procs: Vec<&Process> = a
            .processes_with_role(Role::Worker)
            .filter(in_scope)
            .collect();
        let window_ns = (th::RESTART_WINDOW_S * 1e9) as u64;
        let idle = a.gpu.idle_weights();
        let restarts = restarts(&worker_procs, end, |t| {
            a.gpu.busy_again_after(&idle, t, window_ns)
        });
        let restarting = restarting_bins(&restarts, start, bin_ns, n);
        let workers_r = wsum.mean(&wsum.r);
        let workers_cpu = wsum.mean(&wsum.cpu);
        let workers_alive = wsum.alive;
        let job_runnable = job_runnable(a, start, bin_ns, n);
        let sys_busy = series_bins(&a.system.busy, start, bin_ns, n, 0.01);
        let psi_cpu = mean_bins(&a.system.psi_cpu.some, start, bin_ns, n, 0.01);

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
            main_r,
            main_d,
            main_write_bps,
            main_read_bps,
            input_write_bps,
            input_read_bps,
            cg_throttled,
            binding_quota,
            psi_mem,
            restarts,
            restarting,
            input_d,
            workers_r,
            workers_cpu,
            job_runnable,
            sys_busy,
            psi_cpu,
            cause: vec![None; n],
            loop_from: 0,
            loop_from_by: LoopFrom::Start,
            imports_tail: None,
            exit_head: None,
            shutdown_from: n,
        };
        tl.cause = (0..n).map(|i| tl.classify(i)).collect();
        tl
    }

    fn classify(&self, i: usize) -> Option<Cause> {
        if ge(self.psi_mem[i], th::MEMORY_PSI_SHARE) {
            return Some(Cause::MemoryPressure);
        }
        if ge(self.cg_throttled[i], th::CPU_THROTTLED_SHARE) {
            return Some(Cause::CpuLimited);
        }
        // A quota that binds over the run caps every interval in which the
        // job wants more CPU than it allows, whatever one interval's
        // throttling counters say: with one 100 ms period per sampling
        // interval they read 0 or 1, and a late sample smears them. Its
        // throttled threads stay runnable (R), so without this they would
        // pass for an oversubscribed machine or saturated workers.
        if let Some(q) = self.binding_quota {
            if self.job_runnable[i] as f64 >= q.max(1.0) {
                return Some(Cause::CpuLimited);
            }
        }
        if self.restarting[i] {
            return Some(Cause::WorkerRestart);
        }
        if ge(self.input_d[i], th::IO_D_SHARE) {
            // Blocked while writing more than reading: checkpoints, logs.
            return Some(if self.input_write_bps[i] > self.input_read_bps[i] {
                Cause::WriteStall
            } else {
                Cause::Io
            });
        }
        if !self.workers.is_empty()
            && ge(self.main_d[i], th::IO_D_SHARE)
            && self.main_write_bps[i] > self.main_read_bps[i]
        {
            return Some(Cause::WriteStall);
        }
        let main_busy = self.main_busy(i);
        if self.workers.is_empty() && main_busy {
            return Some(Cause::MainPreprocessing);
        }
        let runnable = self.job_runnable[i] as f64;
        let psi = self.psi_cpu[i];
        if runnable >= th::OVERSUBSCRIBED_RUNNABLE_PER_CORE * self.cores
            && (psi.is_nan() || psi as f64 >= th::OVERSUBSCRIBED_PSI_CPU)
        {
            return Some(Cause::Oversubscribed);
        }
        if !self.workers.is_empty() && self.workers_saturated(i) {
            return Some(Cause::PipelineSaturated);
        }
        if self.workers_alive[i] > th::WORKERS_ALIVE_MIN && main_busy {
            return Some(Cause::TrainingLoop);
        }
        None
    }

    /// Whether the main thread computed (or waited for a core to compute)
    /// for most of bin `i`: see [`th::MAIN_BUSY_MIN_CPU`].
    fn main_busy(&self, i: usize) -> bool {
        if ge(self.main_cpu[i], th::MAIN_BUSY_SHARE) {
            return true;
        }
        if !ge(self.main_r[i], th::MAIN_BUSY_SHARE) {
            return false;
        }
        ge(self.main_cpu[i], th::MAIN_BUSY_MIN_CPU) || self.waiting_for_a_core(i)
    }

    /// Whether a runnable thread in bin `i` may have been waiting for a
    /// core rather than using one: less than [`th::MAIN_BUSY_FREE_CORES`]
    /// idle on the machine, or CPU pressure (PSI) saying tasks waited.
    fn waiting_for_a_core(&self, i: usize) -> bool {
        let busy = self.sys_busy[i];
        let no_free_core =
            !busy.is_nan() && self.cores * (1.0 - busy as f64) < th::MAIN_BUSY_FREE_CORES;
        no_free_core || ge(self.psi_cpu[i], th::OVERSUBSCRIBED_PSI_CPU)
    }

    /// Whether the workers were saturated in bin `i`: most of them read in
    /// state R ([`th::SATURATED_WORKERS_SHARE`]) and those readings
    /// confirmed by what they did in the bin — they used at least
    /// [`th::SATURATED_MIN_CPU`] of a core each, or no core was free for
    /// them (then runnable with little CPU is the wait for a core). States
    /// are read once per interval: workers that sleep on their queue most
    /// of the time are read R together at the instant a batch is asked
    /// for, and one such reading is not a saturated interval.
    pub fn workers_saturated(&self, i: usize) -> bool {
        ge(self.workers_r[i], th::SATURATED_WORKERS_SHARE)
            && (ge(self.workers_cpu[i], th::SATURATED_MIN_CPU) || self.waiting_for_a_core(i))
    }

    /// Seconds before the training loop's first bin.
    pub fn before_loop_s(&self) -> f64 {
        (0..self.loop_from).map(|i| self.bin_s(i)).sum()
    }

    /// Seconds of the job's shutdown ([`Timeline::shutdown_from`]).
    pub fn shutdown_s(&self) -> f64 {
        (self.shutdown_from..self.n).map(|i| self.bin_s(i)).sum()
    }

    /// The start-up told apart by imports and the shutdown, in words, for
    /// the diagnosis's notes: None when neither was found.
    pub fn edges_note(&self) -> Option<String> {
        let dur = self.end.secs_since(self.start).max(1e-9);
        // A start-up ending at the first step is the steps' to tell.
        let before = if self.loop_from_by == LoopFrom::Imports {
            self.before_loop_s()
        } else {
            0.0
        };
        let after = self.shutdown_s();
        let share = |s: f64| format!("{:.0}%", 100.0 * s / dur);
        let mut parts = Vec::new();
        if before > 0.0 {
            parts.push(format!(
                "start-up (the job importing modules) took {before:.1} s ({} of the run)",
                share(before)
            ));
        }
        if after > 0.0 {
            parts.push(format!(
                "shutdown (the interpreter exiting) {after:.1} s ({})",
                share(after)
            ));
        }
        if parts.is_empty() || before + after < th::EDGE_NOTE_SHARE * dur {
            return None;
        }
        let mut text = parts.join(" and ");
        if let Some(c) = text.get(..1) {
            text = c.to_uppercase() + &text[1..];
        }
        let nothing_between = self.loop_from >= self.shutdown_from;
        Some(format!(
            "{text}; the findings leave {}{}.",
            if parts.len() > 1 { "both" } else { "it" },
            if nothing_between {
                " out, and nothing ran between them to diagnose"
            } else {
                " out"
            }
        ))
    }

    /// What the CPU-side estimates leave out at the run's edges, as a
    /// method's tail ("; the 4.0 s before the first step (start-up) left
    /// out"), empty when nothing.
    pub fn edges_left_out(&self) -> String {
        let before = self.before_loop_s();
        let startup = match self.loop_from_by {
            LoopFrom::FirstStep if before > 0.0 => Some(format!(
                "the {before:.1} s before the first step (start-up)"
            )),
            LoopFrom::Imports if before > 0.0 => {
                Some(format!("the {before:.1} s of start-up (imports)"))
            }
            _ => None,
        };
        let after = self.shutdown_s();
        let shutdown = (after > 0.0)
            .then(|| format!("the {after:.1} s of shutdown (the interpreter exiting)"));
        match (startup, shutdown) {
            (Some(s), Some(e)) => format!("; {s} and {e} left out"),
            (Some(x), None) | (None, Some(x)) => format!("; {x} left out"),
            (None, None) => String::new(),
        }
    }

    /// Where bin `i` begins and ends (the last one at the timeline's end).
    pub fn bin_span(&self, i: usize) -> (MonoNs, MonoNs) {
        let (a, b) = bin_span(self.start, self.bin_ns, i);
        (a, b.min(self.end))
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

    /// Σ over bins with this cause of bin length × `weight(bin)`, from
    /// the training loop's first bin ([`Timeline::loop_from`]).
    pub fn weighted_s(&self, cause: Cause, weight: impl Fn(usize) -> f64) -> f64 {
        self.bins_of(cause)
            .filter(|&i| i >= self.loop_from)
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

    /// Idle seconds per bin of a GPU's idle-share series within `window`:
    /// a sample window spanning several bins gives each the part of its
    /// idle time that overlaps it (its idle share spread evenly, see
    /// `analysis::gpu`).
    pub fn idle_per_bin(&self, idle: &Series, window: (MonoNs, MonoNs)) -> Vec<f32> {
        let mut out = vec![0.0f32; self.n];
        let (w0, w1) = (window.0.max(self.start), window.1.min(self.end));
        let first_pt = idle.points().partition_point(|p| p.t1 <= w0);
        for p in &idle.points()[first_pt..] {
            if p.t0 >= w1 {
                break;
            }
            let (g0, g1) = (p.t0.max(w0), p.t1.min(w1));
            if g1 > g0 && p.v > 0.0 {
                // spread() adds weight × overlap / bin: weight = v × bin s.
                spread(
                    &mut out,
                    self.start,
                    self.bin_ns,
                    g0,
                    g1,
                    p.v * self.bin_ns as f64 / 1e9,
                );
            }
        }
        out
    }

    /// Idle seconds of a GPU's idle-share series within `window`, by the
    /// cause of the bins they fell in (None: no cause).
    pub fn idle_by_cause(
        &self,
        idle: &Series,
        window: (MonoNs, MonoNs),
    ) -> Vec<(Option<Cause>, f64)> {
        let mut acc: Vec<(Option<Cause>, f64)> = Vec::new();
        for (i, v) in self.idle_per_bin(idle, window).into_iter().enumerate() {
            if v <= 0.0 {
                continue;
            }
            let c = self.cause[i];
            match acc.iter_mut().find(|x| x.0 == c) {
                Some(x) => x.1 += v as f64,
                None => acc.push((c, v as f64)),
            }
        }
        acc
    }

    /// The bin holding `t`, if inside the timeline.
    pub fn bin_of(&self, t: MonoNs) -> Option<usize> {
        (t >= self.start && t < self.end)
            .then(|| (((t.0 - self.start.0) / self.bin_ns) as usize).min(self.n - 1))
    }

    /// The bin whose cause a sample taken at `t` shares: [`Timeline::bin_of`],
    /// except for the start-up's last samples inside the bin after it
    /// ([`Timeline::imports_tail`]) and the shutdown's first ones inside
    /// the bin before it ([`Timeline::exit_head`]), which share none.
    pub fn cause_bin_of(&self, t: MonoNs) -> Option<usize> {
        let start_up = |i| self.imports_tail.is_some_and(|(b, end)| i == b && t < end);
        let exit = |i| self.exit_head.is_some_and(|(b, from)| i == b && t >= from);
        self.bin_of(t).filter(|&i| !start_up(i) && !exit(i))
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
