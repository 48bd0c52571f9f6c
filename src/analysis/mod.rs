//! Analysis: pure functions over a recording's events. No I/O to /proc,
//! NVML or perf happens here, so every figure can be rebuilt by
//! `gpuprof report` and unit-tested on hand-built event lists.

pub mod collectives;
pub mod environment;
pub mod fold;
pub mod gpu;
pub mod nvtx;
pub mod others;
pub mod roles;
pub mod series;
pub mod stacks;
pub mod steps;
pub mod symbols;
pub mod waits;

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::event::{Coverage, CpuTimes, Event, Footer, Header, JobStatus, MonoNs, Pid, Tid};
use crate::vocab::ranks::RankIds;
pub use roles::Role;
pub use series::Series;

/// One thread of a job process.
#[derive(Debug, Clone)]
pub struct Thread {
    pub tid: Tid,
    pub comm: String,
    pub user_ns: u64,
    pub sys_ns: u64,
    /// CPU use in cores (1.0 = one core busy).
    pub cpu: Series,
    /// Time observed in each scheduler state (R, S, D, ...), in ns.
    pub state_ns: BTreeMap<char, u64>,
    /// Runs of R (running/runnable) and D (uninterruptible, usually IO)
    /// state in time order; at most [`MAX_STATE_RUNS`] per thread, merged
    /// with their neighbours beyond that.
    pub state_runs: Vec<StateRun>,
    /// `state_runs` hit [`MAX_STATE_RUNS`] and neighbours were merged.
    pub state_runs_merged: bool,
    base: Option<(u64, u64)>,
    last: Option<(MonoNs, u64, char)>,
}

/// Bound on the state runs kept per thread: past it neighbouring runs are
/// merged pairwise (each merged run keeps the time it holds in R and in D),
/// so memory stays bounded on long runs; totals in `state_ns` stay exact.
pub const MAX_STATE_RUNS: usize = 8192;

/// A run of R (running or runnable) or D (uninterruptible) state, or
/// several neighbouring runs merged (on long recordings): from `from` to
/// `to` the thread spent `r_ns` in R and `d_ns` in D.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateRun {
    pub from: MonoNs,
    pub to: MonoNs,
    pub r_ns: u64,
    pub d_ns: u64,
}

impl StateRun {
    pub fn new(from: MonoNs, to: MonoNs, state: char) -> StateRun {
        let ns = to.0.saturating_sub(from.0);
        let (r_ns, d_ns) = if state == 'D' { (0, ns) } else { (ns, 0) };
        StateRun {
            from,
            to,
            r_ns,
            d_ns,
        }
    }
    pub fn len_ns(&self) -> u64 {
        self.to.0.saturating_sub(self.from.0)
    }
    /// The state the run spent most of its time in.
    pub fn state(&self) -> char {
        if self.d_ns > self.r_ns {
            'D'
        } else {
            'R'
        }
    }
    /// Share (0..=1) of the run's span spent in `state`.
    pub fn share(&self, state: char) -> f64 {
        let ns = match state {
            'R' => self.r_ns,
            'D' => self.d_ns,
            _ => 0,
        };
        ns as f64 / self.len_ns().max(1) as f64
    }
    /// One unmerged run: a single state throughout.
    pub fn is_exact(&self) -> bool {
        self.r_ns.max(self.d_ns) == self.len_ns() && self.r_ns.min(self.d_ns) == 0
    }
    pub fn merge(&self, next: &StateRun) -> StateRun {
        StateRun {
            from: self.from,
            to: next.to,
            r_ns: self.r_ns + next.r_ns,
            d_ns: self.d_ns + next.d_ns,
        }
    }
}

/// Merge neighbouring runs pairwise (time order is kept).
pub fn halve_runs(runs: &[StateRun]) -> Vec<StateRun> {
    runs.chunks(2)
        .map(|c| {
            if c.len() == 2 {
                c[0].merge(&c[1])
            } else {
                c[0]
            }
        })
        .collect()
}

/// One process of the job's tree.
#[derive(Debug, Clone)]
pub struct Process {
    pub pid: Pid,
    pub ppid: Pid,
    pub comm: String,
    pub cmdline: Vec<String>,
    pub exe: Option<String>,
    pub first_seen: MonoNs,
    pub exited: Option<MonoNs>,
    pub status: Option<JobStatus>,
    pub role: Role,
    /// The launcher's rank variables of its own environment, as recorded
    /// (None: not read).
    pub rank_env: Option<crate::event::RankEnv>,
    /// Its rank (its own, or its nearest ancestor's; None for launchers and
    /// jobs without ranks), with its node and world; see [`roles`].
    pub rank: Option<u32>,
    pub rank_ids: RankIds,
    pub is_job: bool,
    /// Known only from its samples: its `process` record was lost with a
    /// damaged block of the recording (command line and parent unknown).
    pub recovered: bool,
    /// When it started (ns since boot, as /proc gives it; 0: unknown): tells
    /// a process from a later one that got its PID.
    pub start_boot_ns: u64,
    pub user_ns: u64,
    pub sys_ns: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub rchar: u64,
    pub wchar: u64,
    pub max_rss: u64,
    pub threads: BTreeMap<Tid, Thread>,
    /// CPU in cores, disk read and write in bytes/s, RSS in bytes.
    pub cpu: Series,
    pub read_bps: Series,
    pub write_bps: Series,
    pub rss: Series,
    base: Option<[u64; 6]>,
    last: Option<(MonoNs, [u64; 6])>,
}

/// Processes whose PID was reused kept whole in [`Analysis::reused`] at
/// most (the rest are counted): a job that starts a short process every
/// second wraps a pid_max of 32768 in nine hours.
pub const MAX_REUSED: usize = 1000;

/// The name of a process known only from its samples until its threads or
/// perf name it.
pub const UNKNOWN_COMM: &str = "unknown";

impl Process {
    /// A process first seen at `first_seen`, with no figures yet.
    pub fn new(
        pid: Pid,
        ppid: Pid,
        comm: String,
        cmdline: Vec<String>,
        exe: Option<String>,
        first_seen: MonoNs,
    ) -> Process {
        Process {
            pid,
            ppid,
            comm,
            cmdline,
            exe,
            first_seen,
            exited: None,
            status: None,
            role: Role::Other,
            rank_env: None,
            rank: None,
            rank_ids: RankIds::default(),
            is_job: false,
            recovered: false,
            start_boot_ns: 0,
            user_ns: 0,
            sys_ns: 0,
            read_bytes: 0,
            write_bytes: 0,
            rchar: 0,
            wchar: 0,
            max_rss: 0,
            threads: BTreeMap::new(),
            cpu: Series::default(),
            read_bps: Series::default(),
            write_bps: Series::default(),
            rss: Series::default(),
            base: None,
            last: None,
        }
    }

    pub fn cpu_s(&self) -> f64 {
        (self.user_ns + self.sys_ns) as f64 / 1e9
    }
    pub fn lifetime(&self, end: MonoNs) -> (MonoNs, MonoNs) {
        (self.first_seen, self.exited.unwrap_or(end))
    }
    /// Its role with its rank: "rank 1", "worker of rank 1", "launcher",
    /// "other of rank 1"; the plain role when the job has no ranks.
    pub fn label(&self) -> String {
        match (self.role, self.rank) {
            (Role::Main, Some(r)) => format!("rank {r}"),
            (Role::Launcher, _) | (_, None) => self.role.as_str().to_string(),
            (role, Some(r)) => format!("{} of rank {r}", role.as_str()),
        }
    }
}

/// One block device.
#[derive(Debug, Clone, Default)]
pub struct Disk {
    pub name: String,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Busy % (time with IO in flight), read and write bytes/s.
    pub busy: Series,
    pub read_bps: Series,
    pub write_bps: Series,
    last: Option<(MonoNs, u64, u64, u64)>,
}

/// Pressure stall shares (% of time some / all tasks stalled).
#[derive(Debug, Clone, Default)]
pub struct PressureSeries {
    pub some: Series,
    pub full: Series,
    last: Option<(MonoNs, u64, Option<u64>)>,
}

#[derive(Debug, Clone, Default)]
pub struct System {
    pub cpus: u32,
    /// % of all CPUs busy, iowait and steal shares (% of all CPU time).
    pub busy: Series,
    pub iowait: Series,
    pub steal: Series,
    pub per_cpu_busy: Vec<Series>,
    pub runnable: Series,
    pub blocked: Series,
    pub disks: BTreeMap<String, Disk>,
    pub psi_cpu: PressureSeries,
    pub psi_io: PressureSeries,
    pub psi_memory: PressureSeries,
    pub mem_total: u64,
    pub mem_available: Series,
    pub swap_used: Series,
    /// Bytes/s swapped in and out.
    pub swap_in_bps: Series,
    pub swap_out_bps: Series,
    pub swap_in_bytes: u64,
    pub swap_out_bytes: u64,
    /// The limits of the cgroup the job ran in, when it had any.
    pub cgroup: CgroupLimits,
    last_cpu: Option<(MonoNs, CpuTimes)>,
    last_per_cpu: Vec<Option<(MonoNs, CpuTimes)>>,
    last_swap: Option<(MonoNs, u64, u64)>,
}

/// The CPU and memory limits of the job's cgroup, and what the CPU limit
/// cost (from the cgroup's own throttling counters).
#[derive(Debug, Clone, Default)]
pub struct CgroupLimits {
    /// The cgroup holding the CPU limit (`/proc/PID/cgroup` path), and
    /// whether it is cgroup v2.
    pub cpu_path: Option<String>,
    pub cpu_v2: bool,
    /// The quota in cores (quota / period); the tightest seen.
    pub cpu_quota_cores: Option<f64>,
    pub cpu_period_us: u64,
    /// Share of the cgroup's scheduling periods in which it was throttled
    /// (it used up its quota and waited for the next period), over time.
    pub throttled_share: Series,
    /// Over the recording: periods, throttled periods, seconds throttled.
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_s: f64,
    pub memory_path: Option<String>,
    pub memory_v2: bool,
    pub memory_limit_bytes: Option<u64>,
    /// Memory the cgroup used (page cache included), over time.
    pub memory_usage: Series,
    pub memory_usage_max: u64,
    last_cpu: Option<(MonoNs, crate::event::CgroupCpu)>,
    last_memory: Option<(MonoNs, u64)>,
}

impl CgroupLimits {
    /// Counters change only while the cgroup runs, and events come only on
    /// change: a change seen at `t` happened within the last `interval`.
    fn cpu(&mut self, t: MonoNs, c: &crate::event::CgroupCpu, interval: u64) {
        let cores = c.quota_us as f64 / c.period_us.max(1) as f64;
        self.cpu_quota_cores = Some(self.cpu_quota_cores.map_or(cores, |x| x.min(cores)));
        self.cpu_period_us = c.period_us;
        self.cpu_v2 = c.v2;
        match &self.last_cpu {
            // The same cgroup: counters continue.
            Some((pt, p)) if p.path == c.path => {
                let dp = c.nr_periods.saturating_sub(p.nr_periods);
                let dt = c.nr_throttled.saturating_sub(p.nr_throttled);
                self.periods += dp;
                self.throttled_periods += dt;
                self.throttled_s += c.throttled_ns.saturating_sub(p.throttled_ns) as f64 / 1e9;
                let share = if dp > 0 { dt as f64 / dp as f64 } else { 0.0 };
                let from = MonoNs(pt.0.max(t.0.saturating_sub(interval)));
                self.throttled_share.push(*pt, from, 0.0);
                self.throttled_share.push(from, t, share.min(1.0));
            }
            // First seen, or the job moved: a new baseline.
            _ => self.cpu_path = Some(c.path.clone()),
        }
        self.last_cpu = Some((t, c.clone()));
    }

    fn memory(&mut self, t: MonoNs, m: &crate::event::CgroupMemory) {
        self.memory_path = Some(m.path.clone());
        self.memory_v2 = m.v2;
        self.memory_limit_bytes = Some(
            self.memory_limit_bytes
                .map_or(m.limit_bytes, |x| x.min(m.limit_bytes)),
        );
        self.memory_usage_max = self.memory_usage_max.max(m.usage_bytes);
        if let Some((pt, v)) = self.last_memory {
            self.memory_usage.push(pt, t, v as f64);
        }
        self.last_memory = Some((t, m.usage_bytes));
    }
}

/// Everything derived from a recording.
#[derive(Debug, Clone)]
pub struct Analysis {
    pub header: Header,
    pub footer: Option<Footer>,
    /// Problems with the recording itself (truncated, damaged, dropped
    /// events, a full disk) and with writing the outputs.
    pub warnings: Vec<String>,
    /// The recording covers the whole window: it has its end record and
    /// nothing in it was lost (see `warnings` otherwise).
    pub complete: bool,
    /// What was measured and what was not, by source (sorted).
    pub coverage: BTreeMap<String, Coverage>,
    /// The recorded window.
    pub start: MonoNs,
    pub end: MonoNs,
    pub processes: BTreeMap<Pid, Process>,
    /// Processes whose PID a later process of the job took (the kernel
    /// reuses PIDs once they wrap at pid_max): kept here whole, with the
    /// figures they had at their exit, at most [`MAX_REUSED`]; the rest
    /// only counted in `reused_omitted` (count, CPU seconds).
    pub reused: Vec<Process>,
    pub reused_omitted: (u64, f64),
    pub system: System,
    /// GPUs, their idle gaps and the job's processes on them.
    pub gpu: gpu::GpuAnalysis,
    /// CPU stack samples, merged with Python frames (see `stacks`).
    pub stacks: stacks::Stacks,
    /// Libraries mapped, files held open, mounts.
    pub env: environment::Environment,
    /// NVTX ranges and marks of the job.
    pub nvtx: nvtx::NvtxAnalysis,
    /// Per Python thread, the time spent inside collective calls
    /// (all-reduce, barrier, ...), from the Python stack samples.
    pub collectives: collectives::Collectives,
    /// Per thread the wall-clock sampler looked at: its wall time on a CPU
    /// and blocked, by wait class.
    pub waits: waits::Waits,
    /// The wall-clock sampler's looks at blocked threads, each with
    /// whether the framework was compiling (torch.compile): a main thread
    /// waiting for its compiler's subprocesses is compiling too.
    pub compile_looks: Vec<stacks::CompileLook>,
    /// Training steps and the slow ones.
    pub steps: steps::Steps,
    /// CPU that processes outside the job took from it.
    pub others: others::OtherPrograms,
}

/// Choices that change the analysis of a recording, and what the caller
/// knows beyond it.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The NVTX range that marks a step (else the one given at record
    /// time, else chosen automatically).
    pub step_range: Option<String>,
    /// The session's end record, used when the recording has none (it
    /// could not be written: a full disk).
    pub footer: Option<Footer>,
    /// A session is still writing the recording.
    pub live: bool,
    /// Python frames by line (`--lines`), where the recording has lines.
    pub python_lines: bool,
}

impl Analysis {
    pub fn duration_s(&self) -> f64 {
        self.end.secs_since(self.start)
    }
    /// Whether the recording saw the job start: launched by gpuprof (not
    /// attached) and recorded from then on (not after `--delay`).
    pub fn saw_job_start(&self) -> bool {
        self.header.attached.is_none()
            && self.start.0.saturating_sub(self.header.start.0) < 2 * self.header.interval_ns.max(1)
    }
    /// Seconds from the start of the recording (the trace's time origin).
    pub fn rel_s(&self, t: MonoNs) -> f64 {
        t.0 as f64 / 1e9 - self.start.0 as f64 / 1e9
    }
    pub fn job_status(&self) -> Option<JobStatus> {
        self.footer.as_ref().map(|f| f.status)
    }
    pub fn processes_with_role(&self, role: Role) -> impl Iterator<Item = &Process> {
        self.processes.values().filter(move |p| p.role == role)
    }
    /// The ranks of the job: every rank some main process carries (sorted).
    /// Empty when the job was not started by a launcher that sets ranks.
    pub fn ranks(&self) -> Vec<u32> {
        let set: std::collections::BTreeSet<u32> = self
            .processes
            .values()
            .filter(|p| p.role == Role::Main)
            .filter_map(|p| p.rank)
            .collect();
        set.into_iter().collect()
    }
    /// Processes in display order: launchers, then each rank (its main
    /// processes, its workers, the rest), then processes without a rank by
    /// role; by start time within each group.
    pub fn processes_in_order(&self) -> Vec<&Process> {
        let mut v: Vec<&Process> = self.processes.values().collect();
        let role_order = |r: Role| match r {
            Role::Launcher => 0,
            Role::Main => 1,
            Role::Worker => 2,
            Role::Other => 3,
        };
        v.sort_by_key(|p| {
            let group = match (p.role, p.rank) {
                (Role::Launcher, _) => 0,
                (_, Some(_)) => 1,
                (_, None) => 2,
            };
            (group, p.rank, role_order(p.role), p.first_seen, p.pid)
        });
        v
    }
    /// Whether findings are made per rank: two ranks or more.
    pub fn multi_rank(&self) -> bool {
        self.ranks().len() >= 2
    }
}

/// Distribute a counter increase observed at `t` over the interval in which
/// it happened. Collectors emit cumulative counters only when they change,
/// so an increase seen at `t` happened within the last sampling interval;
/// the time before that since `prev` was idle.
fn push_delta(
    series: &mut Series,
    prev: MonoNs,
    t: MonoNs,
    interval: u64,
    amount: f64,
    scale: f64,
) {
    push_delta_capped(series, prev, t, interval, amount, scale, f64::INFINITY)
}

/// [`push_delta`] for a counter that grows by at most `max_rate` per
/// second (CPU seconds: one per core): an increase too large for one
/// interval happened over the time it needs at that rate (a sample that
/// came late, a thread first seen after it had been running a while).
fn push_delta_capped(
    series: &mut Series,
    prev: MonoNs,
    t: MonoNs,
    interval: u64,
    amount: f64,
    scale: f64,
    max_rate: f64,
) {
    if t <= prev {
        return;
    }
    let needed = if max_rate.is_finite() && max_rate > 0.0 {
        (amount / max_rate * 1e9).min(u64::MAX as f64 / 2.0) as u64
    } else {
        0
    };
    let span = interval.max(needed);
    let from = MonoNs(prev.0.max(t.0.saturating_sub(span)));
    if from > prev {
        series.push(prev, from, 0.0);
    }
    let dt = (t.0 - from.0) as f64 / 1e9;
    if dt > 0.0 {
        // Above the cap only by the counters' granularity (clock ticks,
        // milliseconds) when samples are closer than the interval.
        series.push(from, t, (amount / dt).min(max_rate) * scale);
    }
}

/// Gauge values hold until the next event.
fn push_gauge(series: &mut Series, prev: MonoNs, t: MonoNs, value: f64) {
    series.push(prev, t, value);
}

struct Builder {
    a: Analysis,
    interval: u64,
    window_started: Option<MonoNs>,
    window_stopped: bool,
    delayed: bool,
    last_t: MonoNs,
    last_mem: Option<(MonoNs, f64, f64)>,
    gpu: Option<gpu::GpuBuilder>,
    stack_data: stacks::StackData,
    nvtx: nvtx::NvtxBuilder,
    others: others::Builder,
}

impl Builder {
    fn new(header: Header) -> Builder {
        let interval = header.interval_ns.max(1);
        let start = header.start;
        let cpus = header.cpus;
        Builder {
            a: Analysis {
                header,
                footer: None,
                warnings: Vec::new(),
                complete: true,
                coverage: BTreeMap::new(),
                start,
                end: start,
                processes: BTreeMap::new(),
                reused: Vec::new(),
                reused_omitted: (0, 0.0),
                system: System {
                    cpus,
                    ..Default::default()
                },
                gpu: gpu::GpuAnalysis::default(),
                stacks: stacks::Stacks::default(),
                env: Default::default(),
                nvtx: Default::default(),
                collectives: Default::default(),
                waits: Default::default(),
                compile_looks: Vec::new(),
                steps: Default::default(),
                others: Default::default(),
            },
            interval,
            window_started: None,
            window_stopped: false,
            delayed: false,
            last_t: start,
            last_mem: None,
            gpu: None,
            stack_data: stacks::StackData::new(),
            nvtx: nvtx::NvtxBuilder::default(),
            others: others::Builder::default(),
        }
    }

    /// Keep a process whose PID a later process took, within [`MAX_REUSED`].
    fn archive_reused(&mut self, p: Process) {
        if self.a.reused.len() < MAX_REUSED {
            self.a.reused.push(p);
        } else {
            self.a.reused_omitted.0 += 1;
            self.a.reused_omitted.1 += p.cpu_s();
        }
    }

    /// Figures of a process with no `process` record: it was lost with a
    /// damaged block of the recording (the writer sends it before any
    /// figure of the process). Rather than drop the process, and with it
    /// the job itself when that block was the first, keep it under what is
    /// still known; its counters run from its start, so its totals hold.
    fn recover(&mut self, pid: Pid, t: MonoNs) {
        if self.a.processes.contains_key(&pid) {
            return;
        }
        let mut p = Process::new(pid, Pid(0), UNKNOWN_COMM.into(), Vec::new(), None, t);
        p.is_job = pid == self.a.header.job_pid;
        p.recovered = true;
        self.a.processes.insert(pid, p);
    }

    /// Roles of the processes whose PID was reused (from their own facts
    /// and their parent's, when the parent's PID still names it), and a
    /// warning that says where they are.
    fn reused_roles_and_warning(&mut self) {
        let job = self.a.header.job_pid;
        let procs = &self.a.processes;
        for p in &mut self.a.reused {
            let parent = procs
                .get(&p.ppid)
                .filter(|pp| pp.first_seen <= p.first_seen)
                .map(|pp| (roles::is_python(pp), pp.cmdline.as_slice()));
            p.role = roles::classify(&roles::RoleFacts::of(p), job, false, parent);
        }
        let n = self.a.reused.len() as u64 + self.a.reused_omitted.0;
        if n > 0 {
            let cpu =
                self.a.reused.iter().map(|p| p.cpu_s()).sum::<f64>() + self.a.reused_omitted.1;
            self.a.warnings.push(format!(
                "{n} process(es) of the job exited and their PID was later taken by another process of the job (the kernel reuses PIDs once they reach pid_max): each is kept apart with its own figures ({cpu:.2} s of CPU in all) in report.json processes_reused (and in the role totals), not in the per-process list; the trace track and the stack samples of a reused PID mix the processes that had it"
            ));
        }
    }

    /// The process a figure of `pid` at `t` belongs to (recovered when its
    /// record was lost), and whether its counters count from this first
    /// figure ([`Builder::baseline_from_first_sample`]).
    fn sampled_process(&mut self, pid: Pid, t: MonoNs) -> Option<(&mut Process, bool)> {
        self.recover(pid, t);
        let first_seen = self.a.processes.get(&pid)?.first_seen;
        let base_first = self.baseline_from_first_sample(first_seen);
        self.a.processes.get_mut(&pid).map(|p| (p, base_first))
    }

    /// Counters of processes that existed before a delayed window started
    /// are measured from their first sample in the window.
    fn baseline_from_first_sample(&self, first_seen: MonoNs) -> bool {
        match self.window_started {
            Some(ws) if self.delayed => first_seen.0 < ws.0 + self.interval * 3 / 2,
            _ => false,
        }
    }

    /// A `process` record: a process new to the job, or one that exec'd (or
    /// a PID reused after an exit).
    fn process(&mut self, ev: Event) {
        let Event::Process {
            t,
            pid,
            ppid,
            comm,
            cmdline,
            exe,
            rank_env,
            start_boot_ns,
            ..
        } = ev
        else {
            return;
        };
        let is_job = pid == self.a.header.job_pid;
        // A record of another start time under a known PID (a process's
        // start time survives exec): the kernel gave the PID to a new
        // process, maybe between two passes of the /proc sampler, so that
        // no exit was seen. The old one is kept apart, whole, ended here at
        // the latest; merged, its totals were replaced by the new one's
        // counters.
        if let Some(old) = self.a.processes.get(&pid) {
            if old.start_boot_ns != 0 && start_boot_ns != 0 && old.start_boot_ns != start_boot_ns {
                if let Some(mut old) = self.a.processes.remove(&pid) {
                    if old.exited.is_none() {
                        old.exited = Some(t);
                        for th in old.threads.values_mut() {
                            close_thread(th, t);
                        }
                    }
                    self.archive_reused(old);
                }
            }
        }
        let p = self.a.processes.entry(pid).or_insert_with(|| {
            let mut p = Process::new(pid, ppid, comm.clone(), cmdline.clone(), exe.clone(), t);
            p.is_job = is_job;
            p
        });
        // Seen again: exec (new command), or the record of one recovered
        // from its samples.
        p.recovered = false;
        // A late record of a process that exited leaves it exited; without
        // start times (older recordings) an exited PID seen again is taken
        // to be reused, in place.
        let same = start_boot_ns != 0 && p.start_boot_ns == start_boot_ns;
        if start_boot_ns != 0 {
            p.start_boot_ns = start_boot_ns;
        }
        p.ppid = ppid;
        p.comm = comm;
        if !cmdline.is_empty() {
            p.cmdline = cmdline;
        }
        if exe.is_some() {
            p.exe = exe;
        }
        if rank_env.is_some() {
            p.rank_env = rank_env;
        }
        if p.exited.is_some() && !same {
            p.exited = None;
        }
        if t < p.first_seen {
            p.first_seen = t;
        }
    }

    /// A thread's cumulative CPU and scheduler state.
    fn thread_cpu(&mut self, ev: Event) {
        let Event::ThreadCpu {
            t,
            pid,
            tid,
            user_ns,
            sys_ns,
            state,
            ..
        } = ev
        else {
            return;
        };
        let interval = self.interval;
        let Some((p, base_first)) = self.sampled_process(pid, t) else {
            return;
        };
        let th = p.threads.entry(tid).or_insert_with(|| new_thread(tid, t));
        let total = user_ns + sys_ns;
        if th.base.is_none() {
            th.base = Some(if base_first {
                (user_ns, sys_ns)
            } else {
                (0, 0)
            });
        }
        let (bu, bs) = th.base.unwrap_or_default();
        th.user_ns = user_ns.saturating_sub(bu);
        th.sys_ns = sys_ns.saturating_sub(bs);
        match th.last {
            Some((pt, ptotal, pstate)) => {
                push_delta_capped(
                    &mut th.cpu,
                    pt,
                    t,
                    interval,
                    total.saturating_sub(ptotal) as f64 / 1e9,
                    1.0,
                    1.0,
                );
                account_state(th, pt, t, pstate);
            }
            None => {
                if !base_first {
                    // Born during the recording: its CPU so far happened
                    // in the last interval (or, if more, over the time
                    // it needed at one core).
                    let cpu_s = total as f64 / 1e9;
                    push_delta_capped(
                        &mut th.cpu,
                        MonoNs(t.0.saturating_sub(interval.max((cpu_s * 1e9) as u64))),
                        t,
                        interval,
                        cpu_s,
                        1.0,
                        1.0,
                    );
                }
            }
        }
        th.last = Some((t, total, state));
    }

    /// A process's cumulative CPU and IO counters and its RSS.
    fn process_sample(&mut self, ev: Event) {
        let Event::ProcessSample {
            t,
            pid,
            user_ns,
            sys_ns,
            rss_bytes,
            read_bytes,
            write_bytes,
            rchar,
            wchar,
            ..
        } = ev
        else {
            return;
        };
        let interval = self.interval;
        let cores = self.a.header.cpus.max(1) as f64;
        let Some((p, base_first)) = self.sampled_process(pid, t) else {
            return;
        };
        let vals = [user_ns, sys_ns, read_bytes, write_bytes, rchar, wchar];
        if p.base.is_none() {
            p.base = Some(if base_first { vals } else { [0; 6] });
        }
        let base = p.base.unwrap_or_default();
        let d = |i: usize| vals[i].saturating_sub(base[i]);
        p.user_ns = d(0);
        p.sys_ns = d(1);
        p.read_bytes = d(2);
        p.write_bytes = d(3);
        p.rchar = d(4);
        p.wchar = d(5);
        p.max_rss = p.max_rss.max(rss_bytes);
        let prev = p.last.unwrap_or((
            MonoNs(t.0.saturating_sub(interval)),
            if base_first { vals } else { [0; 6] },
        ));
        let (pt, pv) = prev;
        let dcpu = (vals[0].saturating_add(vals[1])).saturating_sub(pv[0].saturating_add(pv[1]))
            as f64
            / 1e9;
        let pt = if p.last.is_none() {
            // First sample: over the time it needed at most.
            MonoNs(pt.0.min(t.0.saturating_sub((dcpu / cores * 1e9) as u64)))
        } else {
            pt
        };
        push_delta_capped(&mut p.cpu, pt, t, interval, dcpu, 1.0, cores);
        push_delta(
            &mut p.read_bps,
            pt,
            t,
            interval,
            vals[2].saturating_sub(pv[2]) as f64,
            1.0,
        );
        push_delta(
            &mut p.write_bps,
            pt,
            t,
            interval,
            vals[3].saturating_sub(pv[3]) as f64,
            1.0,
        );
        if let Some(last) = p.rss.points().last().map(|x| x.t1) {
            push_gauge(&mut p.rss, last, t, rss_bytes as f64);
        } else {
            push_gauge(
                &mut p.rss,
                MonoNs(t.0.saturating_sub(interval)),
                t,
                rss_bytes as f64,
            );
        }
        p.last = Some((t, vals));
    }

    fn event(&mut self, ev: Event) {
        if let Some(t) = ev.time() {
            if t > self.last_t {
                self.last_t = t;
            }
        }
        let interval = self.interval;
        self.gpu
            .get_or_insert_with(|| gpu::GpuBuilder::new(&self.a.header))
            .push(&ev);
        match ev {
            Event::Header(_) => {}
            Event::GpuDriver { .. }
            | Event::GpuDevice { .. }
            | Event::GpuUtil { .. }
            | Event::GpuState { .. }
            | Event::GpuPcie { .. }
            | Event::GpuProcesses { .. }
            | Event::GpuProcUtil { .. }
            | Event::GpuActivity { .. } => {}
            ev @ (Event::StackFile { .. }
            | Event::NativeFrame { .. }
            | Event::PyFrame { .. }
            | Event::InlinePyFrame { .. }
            | Event::StackMarker { .. }
            | Event::PyProcess { .. }
            | Event::PyAgentStats { .. }
            | Event::StackNode { .. }
            | Event::Samples(_)
            | Event::Symbols { .. }
            | Event::StackStats(_)
            | Event::TaskFork { .. }
            | Event::TaskExit { .. }
            | Event::TaskComm { .. }) => self.stack_data.add(&ev),
            Event::Footer(f) => {
                if !self.window_stopped {
                    self.a.end = f.t;
                }
                if let Some(e) = &f.recording_error {
                    self.a.warnings.push(e.clone());
                    self.a.complete = false;
                }
                self.a.footer = Some(f);
            }
            Event::Coverage(c) => {
                if c.source == crate::vocab::coverage::NVTX {
                    self.nvtx.coverage(&c);
                }
                if c.source == crate::vocab::coverage::RESOURCES && !c.available {
                    self.a.warnings.push(c.detail.clone());
                    self.a.complete = false;
                }
                self.a.coverage.insert(c.source.clone(), c);
            }
            ev @ (Event::NvtxInstance { .. }
            | Event::NvtxName { .. }
            | Event::NvtxDomain { .. }
            | Event::NvtxCategory { .. }
            | Event::NvtxThreadName { .. }
            | Event::NvtxRanges(_)
            | Event::NvtxStats(_)) => self.nvtx.add(&ev),
            Event::Mounts { .. } | Event::Libraries { .. } | Event::OpenFiles { .. } => {
                self.a.env.event(&ev)
            }
            Event::WindowStart { t } => {
                if self.window_started.is_none() {
                    // Attached to a running job, or a delayed window: the
                    // processes already there are measured from their
                    // first sample, not from their start.
                    self.delayed =
                        t.0 > self.a.header.start.0 + interval || self.a.header.attached.is_some();
                    self.window_started = Some(t);
                    self.a.start = t;
                }
            }
            Event::WindowStop { t } => {
                self.a.end = t;
                self.window_stopped = true;
            }
            ev @ Event::Process { .. } => self.process(ev),
            Event::ProcessExit { t, pid, status } => {
                if let Some(p) = self.a.processes.get_mut(&pid) {
                    if p.exited.is_none() || status.is_some() {
                        p.exited = Some(p.exited.map_or(t, |e| e.min(t)));
                    }
                    if status.is_some() {
                        p.status = status;
                    }
                    for th in p.threads.values_mut() {
                        close_thread(th, t);
                    }
                }
            }
            Event::Thread { t, pid, tid, comm } => {
                self.recover(pid, t);
                if let Some(p) = self.a.processes.get_mut(&pid) {
                    if p.recovered && tid.0 == pid.0 {
                        p.comm = comm.clone();
                    }
                    let th = p.threads.entry(tid).or_insert_with(|| new_thread(tid, t));
                    th.comm = comm;
                }
            }
            ev @ Event::ThreadCpu { .. } => self.thread_cpu(ev),
            ev @ Event::ProcessSample { .. } => self.process_sample(ev),
            ev @ Event::SystemCpu { .. } => self.system_cpu(ev),
            ev @ Event::OtherCpu { .. } => self.others.add(&ev),
            ev @ Event::Disks { .. } => self.disks(ev),
            ev @ Event::Cgroup { .. } => self.cgroup(ev),
            ev @ Event::Pressure { .. } => self.pressure(ev),
            ev @ Event::Memory { .. } => self.memory(ev),
        }
    }

    /// `/proc/stat`: the system's busy, iowait and steal shares, runnable and
    /// blocked tasks, and each CPU's busy share.
    fn system_cpu(&mut self, ev: Event) {
        let Event::SystemCpu {
            t,
            total,
            per_cpu,
            procs_running,
            procs_blocked,
        } = ev
        else {
            return;
        };
        let s = &mut self.a.system;
        if let Some((pt, prev)) = s.last_cpu {
            let dt_all = total.total().saturating_sub(prev.total()) as f64;
            if dt_all > 0.0 {
                let pct = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt_all * 100.0;
                s.busy.push(pt, t, pct(total.busy(), prev.busy()));
                s.iowait.push(pt, t, pct(total.iowait, prev.iowait));
                s.steal.push(pt, t, pct(total.steal, prev.steal));
            }
            s.runnable.push(pt, t, procs_running as f64);
            s.blocked.push(pt, t, procs_blocked as f64);
        }
        s.last_cpu = Some((t, total));
        if !per_cpu.is_empty() {
            if s.per_cpu_busy.len() < per_cpu.len() {
                s.per_cpu_busy.resize_with(per_cpu.len(), Series::default);
                s.last_per_cpu.resize(per_cpu.len(), None);
            }
            for (i, c) in per_cpu.iter().enumerate() {
                if let Some((pt, prev)) = s.last_per_cpu[i] {
                    let d = c.total().saturating_sub(prev.total()) as f64;
                    if d > 0.0 {
                        s.per_cpu_busy[i].push(
                            pt,
                            t,
                            c.busy().saturating_sub(prev.busy()) as f64 / d * 100.0,
                        );
                    }
                }
                s.last_per_cpu[i] = Some((t, *c));
            }
        }
    }

    /// `/proc/diskstats`: bytes read and written, and busy time, per disk.
    fn disks(&mut self, ev: Event) {
        let Event::Disks { t, disks } = ev else {
            return;
        };
        let interval = self.interval;
        for d in disks {
            let disk = self
                .a
                .system
                .disks
                .entry(d.name.clone())
                .or_insert_with(|| Disk {
                    name: d.name.clone(),
                    ..Default::default()
                });
            if let Some((pt, r, w, io)) = disk.last {
                let (dr, dw) = (
                    d.read_bytes.saturating_sub(r),
                    d.write_bytes.saturating_sub(w),
                );
                disk.read_bytes += dr;
                disk.write_bytes += dw;
                push_delta(&mut disk.read_bps, pt, t, interval, dr as f64, 1.0);
                push_delta(&mut disk.write_bps, pt, t, interval, dw as f64, 1.0);
                // Time with IO in flight: at most all of the time.
                push_delta_capped(
                    &mut disk.busy,
                    pt,
                    t,
                    interval,
                    d.io_ms.saturating_sub(io) as f64 / 1e3,
                    100.0,
                    1.0,
                );
            }
            disk.last = Some((t, d.read_bytes, d.write_bytes, d.io_ms));
        }
    }

    /// The job's cgroup: CPU throttling and memory against its limits.
    fn cgroup(&mut self, ev: Event) {
        let Event::Cgroup { t, cpu, memory } = ev else {
            return;
        };
        let interval = self.interval;
        let cg = &mut self.a.system.cgroup;
        if let Some(c) = &cpu {
            cg.cpu(t, c, interval);
        }
        if let Some(m) = &memory {
            cg.memory(t, m);
        }
    }

    /// `/proc/pressure/*`: the share of time tasks stalled (some, full).
    fn pressure(&mut self, ev: Event) {
        let Event::Pressure { t, cpu, io, memory } = ev else {
            return;
        };
        let s = &mut self.a.system;
        for (ps, v) in [
            (&mut s.psi_cpu, cpu),
            (&mut s.psi_io, io),
            (&mut s.psi_memory, memory),
        ] {
            let Some(v) = v else { continue };
            if let Some((pt, some, full)) = ps.last {
                let dt_us = (t.0.saturating_sub(pt.0)) as f64 / 1e3;
                if dt_us > 0.0 {
                    ps.some.push(
                        pt,
                        t,
                        (v.some_us.saturating_sub(some) as f64 / dt_us * 100.0).min(100.0),
                    );
                    if let (Some(f), Some(pf)) = (v.full_us, full) {
                        ps.full.push(
                            pt,
                            t,
                            (f.saturating_sub(pf) as f64 / dt_us * 100.0).min(100.0),
                        );
                    }
                }
            }
            ps.last = Some((t, v.some_us, v.full_us));
        }
    }

    /// `/proc/meminfo` and `/proc/vmstat`: available memory, swap used and
    /// swapped bytes.
    fn memory(&mut self, ev: Event) {
        let Event::Memory {
            t,
            total_bytes,
            available_bytes,
            swap_total_bytes,
            swap_free_bytes,
            pswpin,
            pswpout,
        } = ev
        else {
            return;
        };
        let interval = self.interval;
        let page = self.a.header.page_size as f64;
        let s = &mut self.a.system;
        s.mem_total = total_bytes;
        let swap_used = swap_total_bytes.saturating_sub(swap_free_bytes) as f64;
        if let Some((pt, avail, used)) = self.last_mem {
            s.mem_available.push(pt, t, avail);
            s.swap_used.push(pt, t, used);
        }
        self.last_mem = Some((t, available_bytes as f64, swap_used));
        if let Some((pt, pin, pout)) = s.last_swap {
            let (di, dout) = (pswpin.saturating_sub(pin), pswpout.saturating_sub(pout));
            s.swap_in_bytes += di * page as u64;
            s.swap_out_bytes += dout * page as u64;
            push_delta(&mut s.swap_in_bps, pt, t, interval, di as f64 * page, 1.0);
            push_delta(
                &mut s.swap_out_bps,
                pt,
                t,
                interval,
                dout as f64 * page,
                1.0,
            );
        }
        s.last_swap = Some((t, pswpin, pswpout));
    }

    fn finish(mut self, truncated: Option<String>, opts: &Options) -> Analysis {
        if self.a.footer.is_none() {
            self.a.end = self.last_t;
            self.a.complete = false;
            if opts.live {
                self.a.warnings.push(
                    "the recording is still being written: these outputs are a snapshot up to now; the session replaces them when it ends".into(),
                );
            } else if let Some(f) = &opts.footer {
                // The session knows how the job ended even though the
                // recording could not hold it.
                let mut f = f.clone();
                if let Some(e) = &f.recording_error {
                    self.a.warnings.push(e.clone());
                }
                f.t = self.last_t;
                self.a.footer = Some(f);
                if let Some(t) = truncated {
                    self.a.warnings.push(t);
                }
            } else {
                self.a.warnings.push(truncated.clone().unwrap_or_else(|| {
                    "the recording has no end marker (gpuprof was killed?): outputs cover the part that was written".into()
                }));
            }
        } else if let Some(t) = truncated {
            self.a.warnings.push(t);
            self.a.complete = false;
        }
        if let Some(f) = &self.a.footer {
            if f.dropped_events > 0 {
                self.a.warnings.push(format!(
                    "{} events were dropped because the disk could not keep up with the recording",
                    f.dropped_events
                ));
            }
        }
        let end = self.a.end;
        for p in self.a.processes.values_mut() {
            let pe = p.exited.unwrap_or(end);
            for th in p.threads.values_mut() {
                close_thread(th, pe);
            }
        }
        if let Some(w) = self.stack_data.unnamed_frames_warning() {
            self.a.warnings.push(w);
            self.a.complete = false;
        }
        stacks::merge_perf_processes(&self.stack_data, &mut self.a.processes, end);
        let recovered: Vec<String> = (self.a.processes.values())
            .filter(|p| p.recovered)
            .map(|p| format!("{} ({})", p.pid.0, p.comm))
            .collect();
        if !recovered.is_empty() {
            let n = recovered.len();
            let shown = recovered
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            let more = if n > 5 {
                format!(" and {} more", n - 5)
            } else {
                String::new()
            };
            self.a.warnings.push(format!(
                "{n} process(es) known only from their samples, their start records lost with the damaged part of the recording: {shown}{more}; their command lines are unknown and their roles guessed (report.json: processes[].recovered)"
            ));
        }
        let job_pids: std::collections::BTreeSet<Pid> = self.a.processes.keys().copied().collect();
        let gpu = self
            .gpu
            .take()
            .unwrap_or_else(|| gpu::GpuBuilder::new(&self.a.header))
            .finish(&gpu::GpuInputs {
                job_pids: &job_pids,
                end: self.a.end,
            });
        // Processes that held a GPU context drive the work: role main.
        roles::assign_with_gpu(
            &mut self.a.processes,
            self.a.header.job_pid,
            &gpu.job_gpu_pids(),
        );
        self.reused_roles_and_warning();
        self.a.gpu = gpu;
        let procs = &self.a.processes;
        let fallback: BTreeMap<Pid, stacks::ProcMeta> = self
            .stack_data
            .sampled_pids()
            .into_iter()
            .filter(|p| !procs.contains_key(p))
            .map(|p| (p, self.stack_data.fallback_meta(p)))
            .collect();
        let meta = |pid: Pid| match procs.get(&pid) {
            // Root frames say which rank: "rank 1: python3 (4242)".
            Some(p) if p.rank.is_some() => stacks::ProcMeta {
                name: format!("{}: {}", p.label(), p.comm),
                role: p.role,
            },
            Some(p) => stacks::ProcMeta {
                name: p.comm.clone(),
                role: p.role,
            },
            None => fallback.get(&pid).cloned().unwrap_or(stacks::ProcMeta {
                name: "?".into(),
                role: Role::Other,
            }),
        };
        let window = (self.a.start, self.a.end);
        self.stack_data.lines = opts.python_lines;
        self.a.stacks = stacks::analyze(&mut self.stack_data, window, &meta);
        let rep = &mut self.a.stacks.report;
        rep.perf_kernel_s = perf_kernel_s(&self.a.processes, rep);
        let procs = &self.a.processes;
        let exits = |pid: Pid| procs.get(&pid).and_then(|p| p.exited);
        self.a.nvtx = std::mem::take(&mut self.nvtx).finish(window, &exits, &self.a.gpu);
        self.a.collectives = collectives::analyze(&self.stack_data, window);
        self.a.waits = waits::analyze(&self.stack_data, window);
        self.a.compile_looks = self.stack_data.blocked_compile_looks(window);
        let step_range = opts
            .step_range
            .clone()
            .or_else(|| self.a.header.step_range.clone());
        let procs = &self.a.processes;
        let throttled = &self.a.system.cgroup.throttled_share;
        self.a.others = std::mem::take(&mut self.others).finish(
            window,
            &|p| procs.contains_key(&p),
            &|from, to| throttled.mean_in(from, to).unwrap_or(0.0),
        );
        self.a.steps = steps::analyze(&self.a, step_range.as_deref());
        let iv = &self.a.steps.intervals;
        if let (Some(pt), Some(first), Some(last)) =
            (self.a.steps.loop_thread, iv.first(), iv.last())
        {
            let span = (first.0, last.1);
            waits::recut(&mut self.a.waits, &self.stack_data, window, pt, span);
        }
        others::annotate_slow_steps(&mut self.a.steps, &self.a.others);
        self.a
    }
}

fn new_thread(tid: Tid, _t: MonoNs) -> Thread {
    Thread {
        tid,
        comm: String::new(),
        user_ns: 0,
        sys_ns: 0,
        cpu: Series::default(),
        state_ns: BTreeMap::new(),
        state_runs: Vec::new(),
        state_runs_merged: false,
        base: None,
        last: None,
    }
}

fn account_state(th: &mut Thread, from: MonoNs, to: MonoNs, state: char) {
    if to <= from {
        return;
    }
    *th.state_ns.entry(state).or_default() += to.0 - from.0;
    if state == 'R' || state == 'D' {
        match th.state_runs.last_mut() {
            Some(last) if last.is_exact() && last.state() == state && last.to == from => {
                *last = last.merge(&StateRun::new(from, to, state))
            }
            _ => {
                th.state_runs.push(StateRun::new(from, to, state));
                if th.state_runs.len() > MAX_STATE_RUNS {
                    th.state_runs = halve_runs(&th.state_runs);
                    th.state_runs_merged = true;
                }
            }
        }
    }
}

fn close_thread(th: &mut Thread, t: MonoNs) {
    if let Some((pt, total, state)) = th.last {
        if t > pt {
            account_state(th, pt, t, state);
            th.last = Some((t, total, state));
        }
    }
}

/// Build the analysis from a sequence of events (the first must be the
/// header).
pub fn analyze_events(header: Header, events: impl Iterator<Item = Event>) -> Analysis {
    let mut b = Builder::new(header);
    for ev in events {
        b.event(ev);
    }
    b.finish(None, &Options::default())
}

/// Read and analyze a recording folder.
pub fn analyze_dir(dir: &std::path::Path) -> Result<Analysis, crate::record::OpenError> {
    analyze_dir_with(dir, &Options::default())
}

/// Read and analyze a recording folder with `opts`.
pub fn analyze_dir_with(
    dir: &std::path::Path,
    opts: &Options,
) -> Result<Analysis, crate::record::OpenError> {
    let mut reader = crate::record::RecordingReader::open(dir)?;
    let mut b = Builder::new(reader.header.clone());
    for ev in reader.by_ref() {
        b.event(ev);
    }
    let damage = reader.warnings();
    if !damage.is_empty() {
        b.a.complete = false;
        b.a.warnings.extend(damage);
    }
    let truncated = reader.truncated.take();
    Ok(b.finish(truncated, opts))
}

/// A compact, serializable view used in the report for thread listings.
#[derive(Debug, Serialize)]
pub struct ThreadSummary {
    pub tid: i32,
    pub name: String,
    pub cpu_s: f64,
}

/// With perf events as the sampler, the system time over the recording
/// of the job's threads whose samples are not the agent's, per process
/// (see [`stacks::StacksReport::perf_kernel_s`]).
fn perf_kernel_s(
    processes: &BTreeMap<Pid, Process>,
    rep: &stacks::StacksReport,
) -> BTreeMap<Pid, f64> {
    let mut out = BTreeMap::new();
    if rep.sampler != crate::vocab::stacks::SAMPLER_PERF {
        return out;
    }
    // Processes whose agent counts the periods it could not sample in the
    // kernel: a thread of theirs that it sampled at all is in that count,
    // even where its samples are perf's.
    let counted: BTreeSet<Pid> = rep
        .python
        .processes
        .iter()
        .filter(|p| {
            p.agent
                .as_ref()
                .is_some_and(|a| a.kernel_sampled == Some(false))
        })
        .map(|p| p.pid)
        .collect();
    for (pid, p) in processes {
        let sys_ns: u64 = p
            .threads
            .values()
            .filter(|th| !rep.agent_threads.contains(&(*pid, th.tid)))
            .filter(|th| {
                !(counted.contains(pid) && rep.agent_seen_threads.contains(&(*pid, th.tid)))
            })
            .map(|th| th.sys_ns)
            .sum();
        if sys_ns > 0 {
            out.insert(*pid, sys_ns as f64 / 1e9);
        }
    }
    out
}

#[cfg(test)]
mod tests;
