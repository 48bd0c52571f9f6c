//! Live figures while recording: one aggregator fed from the event stream
//! by the recording writer (`record::start_writer`'s tap), read by the
//! progress line and early warnings ([`progress`]) and by the Prometheus
//! endpoint ([`metrics`]). It measures nothing itself: every figure comes
//! from the events the collectors already emit, so what the live views show
//! is what the recording holds.
//!
//! Cost and memory: each event is matched once and updates a few counters;
//! stack samples and symbols are ignored. History is kept only for the
//! longest window a view asks about (the early-warning window, at least a
//! minute): one entry per `/proc` interval and per GPU utilization sample,
//! capped. Per-process state is dropped a while after the process exits.

pub mod metrics;
pub mod progress;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::analysis::gpu::throttle_mask;
use crate::analysis::roles::{self, RoleFacts, TORCH_WORKER_NAME};
use crate::analysis::Role;
use crate::diagnose::thresholds as th;
use crate::diagnose::{FindingKind, POWER_REASONS, THERMAL_REASONS};
use crate::event::{CpuTimes, Event, GpuIndex, GpuProc, GpuState, MonoNs, Pid, Tid};
use crate::vocab::ranks::RankIds;

/// Entries kept in one history, whatever the window and rates.
const MAX_HISTORY: usize = 200_000;
/// Exited processes kept (for their children's roles) before the oldest
/// are forgotten.
const MAX_EXITED: usize = 4096;
/// Threads tracked for their scheduler state.
const MAX_THREADS: usize = 100_000;
/// NVTX names kept (for labels) and names given their own series; ranges
/// of other names are counted under "(other)".
const MAX_NVTX_NAMES: usize = 10_000;
const MAX_NVTX_SERIES: usize = 100;
/// Driver sample period assumed before two samples were seen (1/6 s).
const DEFAULT_GPU_PERIOD_NS: u64 = 166_666_667;

/// Roles, in the order of per-role arrays.
pub const ROLES: [Role; 4] = Role::ALL;

/// Index of a role in per-role arrays.
fn ri(r: Role) -> usize {
    ROLES
        .iter()
        .position(|x| *x == r)
        .unwrap_or(ROLES.len() - 1)
}

/// Cumulative figures of one role; a process's usage is counted under the
/// role it had when it was used.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RoleTotals {
    pub cpu_ns: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

#[derive(Debug)]
struct LiveProc {
    ppid: Pid,
    comm: String,
    exe: Option<String>,
    cmdline: Vec<String>,
    worker_thread: bool,
    gpu_user: bool,
    role: Role,
    /// Last cumulative (cpu ns, read bytes, write bytes), baseline included.
    last: Option<[u64; 3]>,
    /// The launcher's rank variables were read: the rank they give (None:
    /// no rank). None when the environment could not be read.
    own_rank: Option<Option<u32>>,
    /// It started ranks other than its own: torchrun's agent, mpirun.
    launcher: bool,
    first_seen: MonoNs,
    exited: Option<MonoNs>,
    rss: u64,
}

/// One `/proc` interval of the whole job, for windowed figures.
#[derive(Clone, Copy, Debug)]
struct Tick {
    t: MonoNs,
    cpu_ns: [u64; 4],
    read_bytes: u64,
    /// Idle cores machine-wide over the interval before `t`.
    idle_cores: f64,
    /// Threads of the job in state D at `t`.
    d_threads: u32,
    /// Worker processes alive, and those with a thread in state R.
    workers: u32,
    workers_running: u32,
}

/// One driver utilization sample on the monotonic axis.
#[derive(Clone, Copy, Debug)]
struct UtilSample {
    end: MonoNs,
    period_ns: u64,
    pct: u32,
}

/// Live state of one GPU.
#[derive(Debug, Default)]
pub struct LiveGpu {
    pub name: String,
    pub uuid: String,
    pub mem_total: Option<u64>,
    pub mem_used: Option<u64>,
    /// Since when its memory has been at least the diagnosis' pressure
    /// share full, without a sample below it.
    pub mem_full_since: Option<MonoNs>,
    pub temp_c: Option<u32>,
    pub power_mw: Option<u32>,
    pub sm_mhz: Option<u32>,
    pub max_sm_mhz: Option<u32>,
    /// Seconds a kernel ran (utilization × period, summed), and seconds of
    /// samples: idle = sampled − busy.
    pub busy_s: f64,
    pub sampled_s: f64,
    /// Seconds of samples at or below the idle threshold (fully idle).
    pub idle_sample_s: f64,
    /// Seconds each clock-event reason bit was active (until the last
    /// state change; `throttle_s` adds the open run).
    throttle_acc: BTreeMap<u64, f64>,
    throttle_now: Option<(MonoNs, u64)>,
    /// Throttle state changes in the history window: (t, bits).
    throttle_hist: VecDeque<(MonoNs, u64)>,
    /// Processes on the GPU now: (pid, memory bytes).
    pub procs: Vec<(Pid, Option<u64>)>,
    pub ever_had_process: bool,
    pub processes_supported: bool,
    /// First sample above the idle threshold: the GPU has started working.
    pub first_busy: Option<MonoNs>,
    pub first_sample: Option<MonoNs>,
    last_ts_us: u64,
    period_ns: u64,
    util: VecDeque<UtilSample>,
}

impl LiveGpu {
    /// Busy share (0..=1) of the samples that ended in `(from, to]`, and
    /// the seconds they cover.
    pub fn busy_share(&self, from: MonoNs, to: MonoNs) -> Option<(f64, f64)> {
        let (mut busy, mut len) = (0.0, 0.0);
        for s in self.util.iter().rev() {
            if s.end <= from {
                break;
            }
            if s.end > to {
                continue;
            }
            let p = s.period_ns as f64 / 1e9;
            busy += p * s.pct.min(100) as f64 / 100.0;
            len += p;
        }
        (len > 0.0).then(|| (busy / len, len))
    }

    /// Seconds each clock-event reason was active up to `now`.
    pub fn throttle_s(&self, now: MonoNs) -> BTreeMap<u64, f64> {
        let mut out = self.throttle_acc.clone();
        if let Some((t, bits)) = self.throttle_now {
            add_bits(&mut out, bits, now.secs_since(t));
        }
        out
    }

    /// Seconds within `(from, now]` during which any bit of `mask` was set.
    fn throttled_in(&self, mask: u64, from: MonoNs, now: MonoNs) -> f64 {
        let mut total = 0.0;
        let mut state: Option<(MonoNs, u64)> = None;
        for &(t, bits) in &self.throttle_hist {
            if let Some((pt, pb)) = state {
                if pb & mask != 0 {
                    total += overlap(pt, t, from, now);
                }
            }
            state = Some((t, bits));
        }
        if let Some((pt, pb)) = state {
            if pb & mask != 0 {
                total += overlap(pt, now, from, now);
            }
        }
        total
    }
}

fn overlap(a: MonoNs, b: MonoNs, from: MonoNs, to: MonoNs) -> f64 {
    let s = a.max(from);
    let e = b.min(to);
    if e > s {
        e.secs_since(s)
    } else {
        0.0
    }
}

fn add_bits(acc: &mut BTreeMap<u64, f64>, bits: u64, secs: f64) {
    if secs <= 0.0 {
        return;
    }
    for i in 0..64 {
        let bit = 1u64 << i;
        if bits & bit != 0 {
            *acc.entry(bit).or_default() += secs;
        }
    }
}

/// Live state of one disk.
#[derive(Debug, Default, Clone)]
pub struct LiveDisk {
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub io_ms: u64,
    base: Option<(u64, u64, u64)>,
    raw: (u64, u64, u64),
    /// (t, cumulative io_ms since the start of the recording).
    hist: VecDeque<(MonoNs, u64)>,
}

impl LiveDisk {
    /// The disk has served IO since boot (unused loop devices have not).
    pub fn seen_io(&self) -> bool {
        self.raw != (0, 0, 0)
    }

    /// Busy share (time with IO in flight) over `(from, to]`, from the
    /// entries bracketing that span.
    fn busy_share(&self, from: MonoNs, to: MonoNs) -> Option<f64> {
        let first = self.hist.iter().find(|(t, _)| *t >= from)?;
        let last = self.hist.iter().rev().find(|(t, _)| *t <= to)?;
        let dt = last.0.secs_since(first.0);
        (dt > 0.0).then(|| (last.1.saturating_sub(first.1) as f64 / 1e3 / dt).min(1.0))
    }
}

/// Everything the live views read.
#[derive(Debug)]
pub struct LiveState {
    pub start: MonoNs,
    pub window_start: Option<MonoNs>,
    delayed: bool,
    /// Newest event time: "now" as far as the recording knows.
    pub now: MonoNs,
    pub interval_ns: u64,
    pub cpus: u32,
    pub rank: Option<String>,
    pub job: Pid,
    pub idle_threshold_pct: f64,
    anchor_realtime_ns: u64,
    anchor_monotonic_ns: u64,
    /// Longest history kept, in ns.
    keep_ns: u64,
    procs: HashMap<Pid, LiveProc>,
    exited: VecDeque<Pid>,
    threads: HashMap<(Pid, Tid), char>,
    pub roles: [RoleTotals; 4],
    /// CPU ns per (rank, role), counted like `roles`.
    rank_cpu: BTreeMap<(u32, Role), u64>,
    ticks: VecDeque<Tick>,
    last_cpu: Option<(MonoNs, CpuTimes)>,
    pub gpu_driver: bool,
    pub gpus: BTreeMap<GpuIndex, LiveGpu>,
    pub disks: BTreeMap<String, LiveDisk>,
    /// (t, PSI memory "some" stall µs, cumulative), from each Pressure
    /// event.
    psi_mem: VecDeque<(MonoNs, u64)>,
    /// The job's cgroup CPU limit: (t, periods, throttled periods,
    /// cumulative; the limit in cores), from each Cgroup event (sent
    /// when a figure changed, so the last one before a time holds then).
    cg_cpu: VecDeque<(MonoNs, u64, u64, f64)>,
    pub events: u64,
    nvtx_names: HashMap<u32, String>,
    /// Completed NVTX ranges recorded in detail, per name: (count, seconds).
    nvtx_kept: BTreeMap<String, (u64, f64)>,
    /// Ranges over the recorder's detail budget, per name, from its latest
    /// cumulative totals.
    nvtx_totals: BTreeMap<String, (u64, f64)>,
}

impl LiveState {
    fn new(keep_ns: u64) -> LiveState {
        LiveState {
            start: MonoNs(0),
            window_start: None,
            delayed: false,
            now: MonoNs(0),
            interval_ns: 100_000_000,
            cpus: 1,
            rank: None,
            job: Pid(0),
            idle_threshold_pct: crate::analysis::gpu::DEFAULT_IDLE_THRESHOLD_PCT,
            anchor_realtime_ns: 0,
            anchor_monotonic_ns: 0,
            keep_ns: keep_ns.max(60_000_000_000),
            procs: HashMap::new(),
            exited: VecDeque::new(),
            threads: HashMap::new(),
            roles: [RoleTotals::default(); 4],
            rank_cpu: BTreeMap::new(),
            ticks: VecDeque::new(),
            last_cpu: None,
            gpu_driver: false,
            gpus: BTreeMap::new(),
            disks: BTreeMap::new(),
            psi_mem: VecDeque::new(),
            cg_cpu: VecDeque::new(),
            events: 0,
            nvtx_names: HashMap::new(),
            nvtx_kept: BTreeMap::new(),
            nvtx_totals: BTreeMap::new(),
        }
    }

    /// Seconds recorded so far (from the window's start).
    pub fn elapsed_s(&self) -> f64 {
        self.now.secs_since(self.window_start.unwrap_or(self.start))
    }

    fn map_us(&self, ts_us: u64) -> MonoNs {
        let v = self.anchor_monotonic_ns as i128 + ts_us as i128 * 1000
            - self.anchor_realtime_ns as i128;
        MonoNs(v.max(0) as u64)
    }

    fn reclassify(&mut self, pid: Pid) {
        let Some(p) = self.procs.get(&pid) else {
            return;
        };
        let parent = self.procs.get(&p.ppid).map(|pp| {
            let f = facts(pp, p.ppid);
            (f.is_python(), pp.cmdline.as_slice())
        });
        let role = if p.launcher && !p.gpu_user {
            Role::Launcher
        } else {
            roles::classify(&facts(p, pid), self.job, p.gpu_user, parent)
        };
        if let Some(p) = self.procs.get_mut(&pid) {
            p.role = role;
        }
    }

    /// As the analysis (`roles`): every ancestor of a process with a rank
    /// whose own environment gives another rank or none started ranks: it
    /// is a launcher.
    fn mark_launchers(&mut self, pid: Pid) {
        let Some(Some(Some(r))) = self.procs.get(&pid).map(|p| p.own_rank) else {
            return;
        };
        let mut cur = self.procs[&pid].ppid;
        let mut found = Vec::new();
        for _ in 0..64 {
            let Some(p) = self.procs.get(&cur) else {
                break;
            };
            if matches!(p.own_rank, Some(o) if o != Some(r)) && !p.gpu_user && !p.launcher {
                found.push(cur);
            }
            if p.ppid == cur {
                break;
            }
            cur = p.ppid;
        }
        for l in found {
            if let Some(p) = self.procs.get_mut(&l) {
                p.launcher = true;
            }
            self.reclassify(l);
        }
    }

    /// The rank of a process: its own, else its nearest ancestor's, not
    /// across a launcher.
    pub fn rank_of(&self, pid: Pid) -> Option<u32> {
        let mut cur = pid;
        for _ in 0..64 {
            let p = self.procs.get(&cur)?;
            if p.launcher {
                return None;
            }
            if let Some(r) = p.own_rank {
                return r;
            }
            if p.ppid == cur {
                return None;
            }
            cur = p.ppid;
        }
        None
    }

    /// Per rank: the GPUs its processes hold a context on and the GPU
    /// memory they hold.
    pub fn rank_cpu(&self) -> BTreeMap<(u32, Role), u64> {
        self.rank_cpu.clone()
    }

    pub fn rank_gpus(&self) -> BTreeMap<u32, (Vec<GpuIndex>, u64)> {
        let mut out: BTreeMap<u32, (Vec<GpuIndex>, u64)> = BTreeMap::new();
        for (i, g) in &self.gpus {
            for (pid, mem) in &g.procs {
                if let Some(r) = self.rank_of(*pid) {
                    let e = out.entry(r).or_default();
                    if !e.0.contains(i) {
                        e.0.push(*i);
                    }
                    e.1 += mem.unwrap_or(0);
                }
            }
        }
        out
    }

    /// Processes alive now, per role.
    pub fn alive(&self) -> [u32; 4] {
        let mut n = [0; 4];
        for p in self.procs.values().filter(|p| p.exited.is_none()) {
            n[ri(p.role)] += 1;
        }
        n
    }

    /// Threads of the job in each scheduler state now (R, S, D, ...).
    pub fn thread_states(&self) -> BTreeMap<char, u32> {
        let mut m = BTreeMap::new();
        for s in self.threads.values() {
            *m.entry(*s).or_default() += 1;
        }
        m
    }

    /// Resident memory of the processes alive, per role.
    pub fn rss(&self) -> [u64; 4] {
        let mut n = [0; 4];
        for p in self.procs.values().filter(|p| p.exited.is_none()) {
            n[ri(p.role)] += p.rss;
        }
        n
    }

    /// Ticks covering the last `secs` (the first is the baseline).
    fn window(&self, secs: f64) -> Option<(&Tick, &Tick)> {
        let last = self.ticks.back()?;
        let from = MonoNs(last.t.0.saturating_sub((secs * 1e9) as u64));
        let first = self.ticks.iter().find(|k| k.t >= from)?;
        (last.t > first.t).then_some((first, last))
    }

    /// CPU cores used per role over the last `secs`.
    pub fn role_cores(&self, secs: f64) -> Option<[f64; 4]> {
        let (a, b) = self.window(secs)?;
        let dt = b.t.secs_since(a.t) * 1e9;
        let mut out = [0.0; 4];
        for (i, o) in out.iter_mut().enumerate() {
            *o = b.cpu_ns[i].saturating_sub(a.cpu_ns[i]) as f64 / dt;
        }
        Some(out)
    }

    /// GPUs the job uses (a process of the job on them), or every GPU when
    /// none is known to be the job's.
    pub fn job_gpus(&self) -> Vec<GpuIndex> {
        let used: Vec<GpuIndex> = self
            .gpus
            .iter()
            .filter(|(_, g)| g.procs.iter().any(|(pid, _)| self.procs.contains_key(pid)))
            .map(|(i, _)| *i)
            .collect();
        if used.is_empty() {
            self.gpus.keys().copied().collect()
        } else {
            used
        }
    }

    /// Mean busy share of the job's GPUs over the last `secs`.
    pub fn gpu_busy(&self, secs: f64) -> Option<f64> {
        let to = self.now;
        let from = MonoNs(to.0.saturating_sub((secs * 1e9) as u64));
        let shares: Vec<f64> = self
            .job_gpus()
            .iter()
            .filter_map(|i| self.gpus.get(i)?.busy_share(from, to).map(|s| s.0))
            .collect();
        (!shares.is_empty()).then(|| shares.iter().sum::<f64>() / shares.len() as f64)
    }

    /// Completed NVTX ranges per name: (count, seconds), the detailed ones
    /// and those the recorder only counted.
    pub fn nvtx_ranges(&self) -> BTreeMap<String, (u64, f64)> {
        let mut out = self.nvtx_kept.clone();
        for (k, (n, s)) in &self.nvtx_totals {
            let e = out.entry(k.clone()).or_default();
            e.0 += n;
            e.1 += s;
        }
        out
    }

    fn nvtx_series(&self, name: u32, map: &BTreeMap<String, (u64, f64)>) -> String {
        match self.nvtx_names.get(&name) {
            Some(n) if map.contains_key(n) || map.len() < MAX_NVTX_SERIES => n.clone(),
            _ => "(other)".to_string(),
        }
    }

    /// The role of a process of the job (None: not the job's).
    pub fn role_of(&self, pid: Pid) -> Option<Role> {
        self.procs.get(&pid).map(|p| p.role)
    }

    fn prune(&mut self) {
        let keep_from = MonoNs(self.now.0.saturating_sub(self.keep_ns));
        while self.ticks.len() > MAX_HISTORY || self.ticks.len() > 2 && self.ticks[1].t < keep_from
        {
            self.ticks.pop_front();
        }
        for g in self.gpus.values_mut() {
            while g.util.len() > MAX_HISTORY || g.util.front().is_some_and(|s| s.end < keep_from) {
                g.util.pop_front();
            }
            while g.throttle_hist.len() > MAX_HISTORY
                || g.throttle_hist.len() > 1 && g.throttle_hist[1].0 < keep_from
            {
                g.throttle_hist.pop_front();
            }
        }
        for d in self.disks.values_mut() {
            while d.hist.len() > MAX_HISTORY || d.hist.len() > 2 && d.hist[1].0 < keep_from {
                d.hist.pop_front();
            }
        }
        while self.psi_mem.len() > MAX_HISTORY
            || self.psi_mem.len() > 2 && self.psi_mem[1].0 < keep_from
        {
            self.psi_mem.pop_front();
        }
        while self.cg_cpu.len() > MAX_HISTORY
            || self.cg_cpu.len() > 2 && self.cg_cpu[1].0 < keep_from
        {
            self.cg_cpu.pop_front();
        }
    }

    /// Take one event of the recording into account.
    pub fn observe(&mut self, ev: &Event) {
        self.events += 1;
        if let Some(t) = ev.time() {
            if t > self.now {
                self.now = t;
            }
        }
        match ev {
            Event::Header(h) => {
                self.start = h.start;
                self.now = self.now.max(h.start);
                self.interval_ns = h.interval_ns.max(1);
                self.cpus = h.cpus.max(1);
                self.rank = h.rank.clone();
                self.job = h.job_pid;
                self.anchor_realtime_ns = h.anchor_realtime_ns;
                self.anchor_monotonic_ns = h.anchor_monotonic_ns;
                if let Some(th) = h.gpu_idle_threshold_pct {
                    self.idle_threshold_pct = th;
                }
            }
            Event::WindowStart { t } if self.window_start.is_none() => {
                self.delayed = t.0 > self.start.0 + self.interval_ns;
                self.window_start = Some(*t);
            }
            Event::Process { .. } => self.process(ev),
            Event::Thread { pid, tid, comm, .. } | Event::TaskComm { pid, tid, comm, .. } => {
                if comm == TORCH_WORKER_NAME {
                    if let Some(p) = self.procs.get_mut(pid) {
                        if !p.worker_thread {
                            p.worker_thread = true;
                            self.reclassify(*pid);
                        }
                    }
                }
                if pid.0 == tid.0 {
                    if let Some(p) = self.procs.get_mut(pid) {
                        if p.comm != *comm && matches!(ev, Event::TaskComm { .. }) {
                            p.comm = comm.clone();
                            self.reclassify(*pid);
                        }
                    }
                }
            }
            Event::TaskExit { pid, tid, .. } => {
                self.threads.remove(&(*pid, *tid));
            }
            Event::ProcessExit { t, pid, .. } => {
                if let Some(p) = self.procs.get_mut(pid) {
                    if p.exited.is_none() {
                        p.exited = Some(*t);
                        self.exited.push_back(*pid);
                    }
                }
                self.threads.retain(|(p, _), _| p != pid);
                while self.exited.len() > MAX_EXITED {
                    if let Some(old) = self.exited.pop_front() {
                        if self.procs.get(&old).is_some_and(|p| p.exited.is_some()) {
                            self.procs.remove(&old);
                        }
                    }
                }
            }
            Event::ThreadCpu {
                pid, tid, state, ..
            } if self.procs.contains_key(pid)
                && (self.threads.len() < MAX_THREADS
                    || self.threads.contains_key(&(*pid, *tid))) =>
            {
                self.threads.insert((*pid, *tid), *state);
            }
            Event::ProcessSample { .. } => self.process_sample(ev),
            Event::SystemCpu { t, total, .. } => self.system_cpu(*t, total),
            Event::Disks { t, disks } => {
                for d in disks {
                    let e = self.disks.entry(d.name.clone()).or_default();
                    let raw = (d.read_bytes, d.write_bytes, d.io_ms);
                    let base = *e.base.get_or_insert(raw);
                    e.raw = raw;
                    e.read_bytes = raw.0.saturating_sub(base.0);
                    e.write_bytes = raw.1.saturating_sub(base.1);
                    e.io_ms = raw.2.saturating_sub(base.2);
                    e.hist.push_back((*t, e.io_ms));
                }
            }
            Event::Pressure {
                t, memory: Some(m), ..
            } => self.psi_mem.push_back((*t, m.some_us)),
            Event::Cgroup {
                t, cpu: Some(c), ..
            } if c.period_us > 0 => self.cg_cpu.push_back((
                *t,
                c.nr_periods,
                c.nr_throttled,
                c.quota_us as f64 / c.period_us as f64,
            )),
            Event::NvtxName { id, name } if self.nvtx_names.len() < MAX_NVTX_NAMES => {
                self.nvtx_names.insert(*id, name.clone());
            }
            Event::NvtxRanges(b) => {
                for r in &b.ranges {
                    if let (Some(d), false) = (r.d, r.open) {
                        let key = self.nvtx_series(r.n, &self.nvtx_kept);
                        let e = self.nvtx_kept.entry(key).or_default();
                        e.0 += 1;
                        e.1 += d as f64 / 1e9;
                    }
                }
            }
            Event::NvtxStats(st) => {
                let mut totals: BTreeMap<String, (u64, f64)> = BTreeMap::new();
                for t in &st.totals {
                    let key = self.nvtx_series(t.name, &self.nvtx_kept);
                    let e = totals.entry(key).or_default();
                    e.0 += t.count;
                    e.1 += t.total_ns as f64 / 1e9;
                }
                self.nvtx_totals = totals;
            }
            Event::GpuDriver { .. } => self.gpu_driver = true,
            Event::GpuDevice {
                gpu,
                name,
                uuid,
                mem_total,
                max_sm_mhz,
                unsupported,
                ..
            } => {
                let g = self.gpus.entry(*gpu).or_default();
                g.name = name.clone();
                g.uuid = uuid.clone();
                g.mem_total = *mem_total;
                g.max_sm_mhz = *max_sm_mhz;
                g.processes_supported = !unsupported.iter().any(|u| u.contains("process"));
            }
            Event::GpuUtil { gpu, samples, .. } => self.gpu_util(*gpu, samples),
            Event::GpuState { t, gpu, state } => self.gpu_state(*t, *gpu, state),
            Event::GpuProcesses { gpu, procs, .. } => self.gpu_processes(*gpu, procs),
            _ => {}
        }
    }

    /// A process record: its figures, and the roles it changes.
    fn process(&mut self, ev: &Event) {
        let Event::Process {
            t,
            pid,
            ppid,
            comm,
            cmdline,
            exe,
            rank_env,
            ..
        } = ev
        else {
            return;
        };
        // A record after an exit: the PID went to a new process (the
        // recorder says when it was reused); its counters start afresh.
        if self.procs.get(pid).is_some_and(|p| p.exited.is_some()) {
            self.procs.remove(pid);
        }
        let p = self.procs.entry(*pid).or_insert_with(|| LiveProc {
            ppid: *ppid,
            comm: String::new(),
            exe: None,
            cmdline: Vec::new(),
            worker_thread: false,
            gpu_user: false,
            role: Role::Other,
            last: None,
            first_seen: *t,
            exited: None,
            rss: 0,
            own_rank: None,
            launcher: false,
        });
        if let Some(env) = rank_env {
            p.own_rank = Some(RankIds::from_env(env).rank);
        }
        p.ppid = *ppid;
        p.comm = comm.clone();
        if !cmdline.is_empty() {
            p.cmdline = cmdline.clone();
        }
        if exe.is_some() {
            p.exe = exe.clone();
        }
        p.exited = None;
        self.reclassify(*pid);
        self.mark_launchers(*pid);
    }

    /// A process's counters: CPU and IO per role (and rank) since its last sample.
    fn process_sample(&mut self, ev: &Event) {
        let Event::ProcessSample {
            pid,
            user_ns,
            sys_ns,
            rss_bytes,
            read_bytes,
            write_bytes,
            ..
        } = ev
        else {
            return;
        };
        let window_start = self.window_start.unwrap_or(self.start);
        let delayed = self.delayed;
        let interval = self.interval_ns;
        let Some(p) = self.procs.get_mut(pid) else {
            return;
        };
        p.rss = *rss_bytes;
        let now = [user_ns + sys_ns, *read_bytes, *write_bytes];
        // As the analysis: counters of a process that existed before
        // a delayed window count from its first sample in it.
        let prev = p.last.unwrap_or(
            if delayed && p.first_seen.0 < window_start.0 + interval * 3 / 2 {
                now
            } else {
                [0; 3]
            },
        );
        p.last = Some(now);
        let role = p.role;
        let cpu = now[0].saturating_sub(prev[0]);
        let r = &mut self.roles[ri(role)];
        r.cpu_ns += cpu;
        r.read_bytes += now[1].saturating_sub(prev[1]);
        r.write_bytes += now[2].saturating_sub(prev[2]);
        if cpu > 0 {
            if let Some(rank) = self.rank_of(*pid) {
                *self.rank_cpu.entry((rank, role)).or_default() += cpu;
            }
        }
    }

    /// A system CPU sample: idle cores since the last one, and a tick.
    fn system_cpu(&mut self, t: MonoNs, total: &CpuTimes) {
        let idle_cores = match self.last_cpu {
            Some((_, prev)) => {
                let dt = total.total().saturating_sub(prev.total()) as f64;
                if dt > 0.0 {
                    let idle =
                        (total.idle + total.iowait).saturating_sub(prev.idle + prev.iowait) as f64;
                    idle / dt * self.cpus as f64
                } else {
                    0.0
                }
            }
            None => 0.0,
        };
        self.last_cpu = Some((t, *total));
        self.tick(t, idle_cores);
    }

    /// Driver utilization samples of a GPU, each counted once.
    fn gpu_util(&mut self, gpu: GpuIndex, samples: &[(u64, u32)]) {
        let threshold = self.idle_threshold_pct;
        let mapped: Vec<(u64, MonoNs, u32)> = samples
            .iter()
            .map(|(ts, pct)| (*ts, self.map_us(*ts), *pct))
            .collect();
        let g = self.gpus.entry(gpu).or_default();
        for (ts, end, pct) in mapped {
            if ts <= g.last_ts_us {
                continue;
            }
            if g.last_ts_us > 0 {
                let gap = (ts - g.last_ts_us) * 1000;
                // A missing sample or two must not stretch one sample.
                if gap < 2 * g.period_ns.max(1) || g.period_ns == 0 {
                    g.period_ns = gap;
                }
            }
            g.last_ts_us = ts;
            let period = if g.period_ns > 0 {
                g.period_ns
            } else {
                DEFAULT_GPU_PERIOD_NS
            };
            let secs = period as f64 / 1e9;
            g.sampled_s += secs;
            g.busy_s += secs * pct.min(100) as f64 / 100.0;
            if pct as f64 <= threshold {
                g.idle_sample_s += secs;
            } else if g.first_busy.is_none() {
                g.first_busy = Some(end);
            }
            g.first_sample.get_or_insert(end);
            g.util.push_back(UtilSample {
                end,
                period_ns: period,
                pct,
            });
        }
    }

    /// A GPU's state: its figures now, and how long it was throttled.
    fn gpu_state(&mut self, t: MonoNs, gpu: GpuIndex, state: &GpuState) {
        let g = self.gpus.entry(gpu).or_default();
        g.mem_used = state.mem_used;
        let full = match (state.mem_used, g.mem_total) {
            (Some(u), Some(total)) if total > 0 => {
                u as f64 >= th::GPU_MEMORY_PRESSURE * total as f64
            }
            _ => false,
        };
        g.mem_full_since = if full {
            g.mem_full_since.or(Some(t))
        } else {
            None
        };
        g.temp_c = state.temp_c;
        g.power_mw = state.power_mw;
        g.sm_mhz = state.sm_mhz;
        if let Some((pt, pb)) = g.throttle_now.take() {
            add_bits(&mut g.throttle_acc, pb, t.secs_since(pt));
        }
        if let Some(bits) = state.throttle {
            g.throttle_now = Some((t, bits));
            g.throttle_hist.push_back((t, bits));
        } else {
            g.throttle_hist.push_back((t, 0));
        }
    }

    /// A GPU's processes: the job's processes among them use the GPU.
    fn gpu_processes(&mut self, gpu: GpuIndex, procs: &[GpuProc]) {
        let mut users = Vec::new();
        {
            let g = self.gpus.entry(gpu).or_default();
            g.procs = procs.iter().map(|p| (p.pid, p.mem)).collect();
            g.ever_had_process |= !procs.is_empty();
        }
        for p in procs {
            if let Some(lp) = self.procs.get_mut(&p.pid) {
                if !lp.gpu_user {
                    lp.gpu_user = true;
                    users.push(p.pid);
                }
            }
        }
        for pid in users {
            self.reclassify(pid);
        }
    }

    fn tick(&mut self, t: MonoNs, idle_cores: f64) {
        let mut workers = 0;
        let mut running = 0;
        let mut running_pids: Vec<Pid> = self
            .threads
            .iter()
            .filter(|(_, s)| **s == 'R')
            .map(|((p, _), _)| *p)
            .collect();
        running_pids.sort();
        running_pids.dedup();
        for (pid, p) in &self.procs {
            if p.exited.is_none() && p.role == Role::Worker {
                workers += 1;
                if running_pids.binary_search(pid).is_ok() {
                    running += 1;
                }
            }
        }
        let d_threads = self.threads.values().filter(|s| **s == 'D').count() as u32;
        let read_bytes = self.roles.iter().map(|r| r.read_bytes).sum();
        self.ticks.push_back(Tick {
            t,
            cpu_ns: self.roles.map(|r| r.cpu_ns),
            read_bytes,
            idle_cores,
            d_threads,
            workers,
            workers_running: running,
        });
        self.prune();
    }
}

fn facts(p: &LiveProc, pid: Pid) -> RoleFacts<'_> {
    RoleFacts {
        pid,
        ppid: p.ppid,
        comm: &p.comm,
        exe: p.exe.as_deref(),
        cmdline: &p.cmdline,
        worker_thread: p.worker_thread,
    }
}

/// The shared live state: the recording writer feeds it, the views read it.
#[derive(Clone)]
pub struct Live {
    inner: Arc<Mutex<LiveState>>,
}

impl Live {
    /// `keep`: the longest window a view will ask about.
    pub fn new(keep: std::time::Duration) -> Live {
        Live {
            inner: Arc::new(Mutex::new(LiveState::new(keep.as_nanos() as u64))),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, LiveState> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The tap for `record::start_writer`: every event, once.
    pub fn tap(&self) -> crate::record::Tap {
        let live = self.clone();
        Box::new(move |ev: &Event| live.lock().observe(ev))
    }
}

/// The live views of one recording: the progress line and early warnings,
/// and the `/metrics` server when `--metrics-addr` was given (its listener
/// bound before the job started: [`metrics::bind`]). Runs on the tokio
/// runtime of the recording session.
pub struct Views {
    progress: progress::Progress,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl Views {
    pub fn start(
        live: &Live,
        out: &std::path::Path,
        cfg: &crate::config::RecordConfig,
        metrics: Option<std::net::TcpListener>,
    ) -> Views {
        let recording_file = out
            .join(crate::record::RECORDING_DIR)
            .join(crate::record::EVENTS_FILE);
        let progress = progress::Progress::new(
            live.clone(),
            cfg.quiet,
            cfg.warn_after,
            recording_file.clone(),
        );
        let server = metrics.map(|l| {
            tokio::spawn(metrics::serve(
                l,
                live.clone(),
                metrics::Context {
                    recording_file,
                    warn_window: cfg.warn_after,
                },
            ))
        });
        Views { progress, server }
    }

    /// Call every few hundred ms while recording, when [`Views::ticks`].
    pub fn tick(&mut self) {
        self.progress.tick();
    }

    /// Whether [`Views::tick`] does anything: not with `-q` (the `/metrics`
    /// server answers requests on its own). A timed wake-up costs ~50 us
    /// of CPU on a VM; five a second for nothing are not free.
    pub fn ticks(&self) -> bool {
        self.progress.ticks()
    }

    /// Recording stops: erase the progress line, stop serving.
    pub fn finish(&mut self) {
        self.progress.finish();
        if let Some(s) = self.server.take() {
            s.abort();
        }
    }
}

/// The `--metrics-addr` listener, bound now (before the job or output
/// folder), or None without the option.
pub fn bind_metrics(
    cfg: &crate::config::RecordConfig,
) -> anyhow::Result<Option<std::net::TcpListener>> {
    match cfg.metrics_addr.as_deref() {
        Some(a) => Ok(Some(metrics::bind(a).map_err(anyhow::Error::msg)?)),
        None => Ok(None),
    }
}

/// A condition that has held for the early-warning window, with the
/// finding it points at.
#[derive(Clone, Debug, PartialEq)]
pub struct Alert {
    /// Stable key (one alert per key per run), e.g. `gpu-idle:0`.
    pub key: String,
    /// The finding this condition is evidence of, when one fits.
    pub finding: Option<FindingKind>,
    pub message: String,
}

impl LiveState {
    /// Conditions that have held over the last `window` (the early
    /// warnings). Each needs a full window of data: the GPU conditions count
    /// from the GPU's first busy sample (start-up, when the GPU has not
    /// started working yet, is not a finding), the others from the start.
    pub fn alerts(&self, window: std::time::Duration) -> Vec<Alert> {
        let w = window.as_secs_f64();
        let mut out = Vec::new();
        if w <= 0.0 {
            return out;
        }
        let from = MonoNs(self.now.0.saturating_sub(window.as_nanos() as u64));
        let mins = fmt_window(w);
        self.throttle_alerts(w, from, &mins, &mut out);
        self.memory_alerts(w, &mins, &mut out);
        self.unused_alert(w, &mins, &mut out);
        self.idle_alerts(w, from, &mins, &mut out);
        self.disk_alerts(w, &mins, &mut out);
        self.host_alerts(w, &mins, &mut out);
        out
    }

    /// Tasks stalled on host memory, and the job held back by its
    /// cgroup's CPU limit, over the window (the diagnosis' thresholds).
    fn host_alerts(&self, w: f64, mins: &str, out: &mut Vec<Alert>) {
        if self.elapsed_s() < w {
            return;
        }
        let from = MonoNs(self.now.0.saturating_sub((w * 1e9) as u64));
        // PSI is read every interval: the first reading in the window and
        // the last, covering most of it.
        if let (Some(a), Some(b)) = (
            self.psi_mem.iter().find(|x| x.0 >= from),
            self.psi_mem.back(),
        ) {
            let span = b.0.secs_since(a.0);
            if span >= th::WARN_WINDOW_COVERED * w {
                let share = b.1.saturating_sub(a.1) as f64 / 1e6 / span;
                if share >= th::MEMORY_PSI_SHARE {
                    out.push(Alert {
                        key: "host-memory".into(),
                        finding: Some(FindingKind::HostMemoryPressure),
                        message: format!(
                            "tasks stalled on host memory {:.0}% of the last {mins} (PSI memory \"some\": reclaim, swapping, a page cache too small for the data)",
                            share * 100.0
                        ),
                    });
                }
            }
        }
        // The limit's counters as they stood when the window opened: the
        // last event before it (events come only when a figure changes).
        let before = self.cg_cpu.iter().rev().find(|x| x.0 <= from);
        if let (Some(a), Some(b)) = (before, self.cg_cpu.back()) {
            let periods = b.1.saturating_sub(a.1);
            let throttled = b.2.saturating_sub(a.2);
            // At least a second's worth of 100 ms periods.
            if periods >= th::WARN_MIN_CPU_PERIODS
                && throttled as f64 >= th::CPU_THROTTLED_SHARE * periods as f64
            {
                out.push(Alert {
                    key: "cpu-limit".into(),
                    finding: Some(FindingKind::CpuLimit),
                    message: format!(
                        "the job's cgroup CPU limit ({:.1} cores) throttled it in {:.0}% of its scheduling periods over the last {mins}",
                        b.3,
                        throttled as f64 / periods as f64 * 100.0
                    ),
                });
            }
        }
    }

    /// Thermal throttling and power capping held over most of the window.
    fn throttle_alerts(&self, w: f64, from: MonoNs, mins: &str, out: &mut Vec<Alert>) {
        let now = self.now;
        for (i, g) in &self.gpus {
            if g.first_sample.map_or(true, |f| now.secs_since(f) < w) {
                continue;
            }
            let clock = match (g.sm_mhz, g.max_sm_mhz) {
                (Some(c), Some(m)) if m > 0 => format!("SM clock {c} of {m} MHz, "),
                _ => String::new(),
            };
            let temp = g.temp_c.map_or("?".into(), |t| t.to_string());
            let power = g
                .power_mw
                .map_or("?".into(), |p| format!("{:.0}", p as f64 / 1000.0));
            for (reasons, share, key, finding, what, detail) in [
                (
                    THERMAL_REASONS,
                    th::WARN_THERMAL_SHARE,
                    "thermal",
                    FindingKind::ThermalThrottling,
                    "thermally throttled",
                    format!("{clock}{temp}°C"),
                ),
                (
                    POWER_REASONS,
                    th::WARN_POWER_SHARE,
                    "power",
                    FindingKind::PowerCapped,
                    "held by its power cap",
                    format!("{clock}drawing {power} W"),
                ),
            ] {
                let s = g.throttled_in(throttle_mask(reasons), from, now);
                if s >= share * w {
                    out.push(Alert {
                        key: format!("{key}:{i}"),
                        finding: Some(finding),
                        message: format!(
                            "GPU {i} {what} for {:.0}% of the last {mins} ({detail})",
                            s / w * 100.0
                        ),
                    });
                }
            }
        }
    }

    /// GPU memory nearly full in every sample of the window.
    fn memory_alerts(&self, w: f64, mins: &str, out: &mut Vec<Alert>) {
        let now = self.now;
        for (i, g) in &self.gpus {
            let (Some(since), Some(used), Some(total)) =
                (g.mem_full_since, g.mem_used, g.mem_total)
            else {
                continue;
            };
            if now.secs_since(since) >= w {
                out.push(Alert {
                    key: format!("gpu-memory:{i}"),
                    finding: Some(FindingKind::GpuMemoryPressure),
                    message: format!(
                        "GPU {i} memory was at least {:.0}% full for the whole last {mins} ({:.0} of {:.0} MiB used now)",
                        th::GPU_MEMORY_PRESSURE * 100.0,
                        used as f64 / 1048576.0,
                        total as f64 / 1048576.0
                    ),
                });
            }
        }
    }

    /// No process on any GPU for the first window.
    fn unused_alert(&self, w: f64, mins: &str, out: &mut Vec<Alert>) {
        let recorded = self.elapsed_s();
        if recorded >= w
            && !self.gpus.is_empty()
            && self
                .gpus
                .values()
                .all(|g| g.processes_supported && !g.ever_had_process)
            && self.gpus.values().all(|g| g.first_busy.is_none())
        {
            out.push(Alert {
                key: "gpu-not-used".into(),
                finding: Some(FindingKind::GpuNotUsed),
                message: format!(
                    "no process has used a GPU in the first {mins} ({} GPU{} idle)",
                    self.gpus.len(),
                    if self.gpus.len() == 1 { "" } else { "s" }
                ),
            });
        }
    }

    /// A GPU of the job mostly idle over the window, after it started working, with what the CPU side did meanwhile.
    fn idle_alerts(&self, w: f64, from: MonoNs, mins: &str, out: &mut Vec<Alert>) {
        let now = self.now;
        let hint = self.idle_hint(w);
        for i in self.job_gpus() {
            let Some(g) = self.gpus.get(&i) else { continue };
            let Some(fb) = g.first_busy else { continue };
            if now.secs_since(fb) < w {
                continue;
            }
            let Some((share, covered)) = g.busy_share(from, now) else {
                continue;
            };
            if covered < th::WARN_WINDOW_COVERED * w || share >= th::WARN_GPU_BUSY_BELOW {
                continue;
            }
            let (finding, why) = match &hint {
                Some((f, why)) => (Some(*f), format!("; meanwhile {why}")),
                None => (None, String::new()),
            };
            out.push(Alert {
                key: format!("gpu-idle:{i}"),
                finding,
                message: format!(
                    "GPU {i} was busy only {:.0}% of the last {mins}{why}",
                    share * 100.0
                ),
            });
        }
    }

    /// A saturated disk while the job waits on IO.
    fn disk_alerts(&self, w: f64, mins: &str, out: &mut Vec<Alert>) {
        let recorded = self.elapsed_s();
        if let Some((a, b)) = self.window(w) {
            if b.t.secs_since(a.t) >= th::WARN_WINDOW_COVERED * w && recorded >= w {
                let ds: Vec<&Tick> = self.ticks.iter().filter(|k| k.t > a.t).collect();
                let d_mean =
                    ds.iter().map(|k| k.d_threads as f64).sum::<f64>() / ds.len().max(1) as f64;
                if d_mean >= th::WARN_D_THREADS {
                    for (name, d) in &self.disks {
                        if let Some(busy) = d.busy_share(a.t, b.t) {
                            if busy >= th::WARN_DISK_BUSY {
                                let mbps = b.read_bytes.saturating_sub(a.read_bytes) as f64
                                    / 1e6
                                    / b.t.secs_since(a.t);
                                out.push(Alert {
                                    key: format!("disk:{name}"),
                                    finding: Some(FindingKind::IoBound),
                                    message: format!(
                                        "disk {name} was {:.0}% busy over the last {mins} while {d_mean:.1} of the job's threads waited on IO (state D) on average; the job read {mbps:.1} MB/s",
                                        busy * 100.0
                                    ),
                                });
                            }
                        }
                    }
                }
            }
        }
    }

    /// What the CPU side did over the window, when it matches a finding's
    /// evidence (the same thresholds as the diagnosis); None otherwise —
    /// the diagnosis at the end says more.
    fn idle_hint(&self, w: f64) -> Option<(FindingKind, String)> {
        let (a, b) = self.window(w)?;
        let ticks: Vec<&Tick> = self.ticks.iter().filter(|k| k.t > a.t).collect();
        let n = ticks.len().max(1) as f64;
        let d_mean = ticks.iter().map(|k| k.d_threads as f64).sum::<f64>() / n;
        if d_mean >= th::IO_D_SHARE {
            return Some((
                FindingKind::IoBound,
                format!("{d_mean:.1} of the job's threads waited on IO (state D) on average"),
            ));
        }
        let workers = ticks.iter().map(|k| k.workers as f64).sum::<f64>() / n;
        let cores = self.role_cores(b.t.secs_since(a.t))?;
        if workers < th::WARN_NO_WORKERS {
            if cores[ri(Role::Main)] >= th::MAIN_BUSY_CORES {
                return Some((
                    FindingKind::MainProcessPreprocessing,
                    format!(
                        "no worker processes, and the main process used {:.2} cores",
                        cores[ri(Role::Main)]
                    ),
                ));
            }
            return None;
        }
        let sat = ticks
            .iter()
            .filter(|k| k.workers > 0)
            .map(|k| k.workers_running as f64 / k.workers as f64)
            .sum::<f64>()
            / n;
        let idle = ticks.iter().map(|k| k.idle_cores).sum::<f64>() / n;
        // As in the diagnosis: R readings are saturation only when the
        // workers used the CPU to show for it, or no core was free.
        let confirmed = cores[ri(Role::Worker)] / workers >= th::SATURATED_MIN_CPU
            || idle < th::MAIN_BUSY_FREE_CORES;
        if sat >= th::SATURATED_WORKERS_SHARE && confirmed {
            let id = if idle >= th::IDLE_CORES_FOR_MORE_WORKERS {
                FindingKind::TooFewWorkers
            } else {
                FindingKind::InputPipelineBound
            };
            return Some((
                id,
                format!(
                    "{workers:.0} workers were running {:.0}% of the time ({:.2} cores) with {idle:.2} cores idle",
                    sat * 100.0,
                    cores[ri(Role::Worker)]
                ),
            ));
        }
        None
    }
}

fn fmt_window(secs: f64) -> String {
    if secs >= 120.0 && (secs / 60.0).fract() < 1e-9 {
        format!("{:.0} min", secs / 60.0)
    } else if secs >= 60.0 {
        format!("{:.1} min", secs / 60.0)
    } else {
        format!("{secs:.0} s")
    }
}

#[cfg(test)]
mod tests;
