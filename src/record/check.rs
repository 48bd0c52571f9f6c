//! Value checks on read: no impossible figure reaches an output.
//!
//! A damaged or hand-edited recording can hold values no machine produces:
//! a timestamp of 0 or 2^64, a thread that used more CPU than time passed,
//! a counter sample older than the previous one (a swapped pair of lines),
//! an exit code of 999, a stack node that is its own ancestor. Each such
//! event is dropped and counted by reason (see
//! [`super::reader::Damage::warnings`]); records seen twice are recognised
//! by their time and ignored.
//!
//! The checks are physical bounds with room for the measurement's own
//! granularity (clock ticks of 10 ms, the time a /proc pass takes), never
//! tuned thresholds: a real recording passes them all.

use std::collections::HashMap;

use crate::event::{Event, GpuState, Header, JobStatus, MonoNs, Pid, SampleSource, StackKind, Tid};

/// Earliest and latest event time accepted, around the header's start.
const BEFORE_START_NS: u64 = 60_000_000_000;
const AFTER_START_NS: u64 = 400 * 86_400_000_000_000;
/// Fastest plausible byte rate of one disk or process (1 TB/s).
const MAX_BYTES_PER_S: f64 = 1e12;
/// Most CPUs, per-CPU entries and disks accepted in one event.
const MAX_CPUS: usize = 1 << 14;
const MAX_TRACKED: usize = 1 << 16;
const DEFAULT_INTERVAL_NS: u64 = 100_000_000;

/// Replace header values no recorder writes with defaults; say which.
pub fn repair_header(mut h: Header) -> (Header, Vec<String>) {
    let mut p = Vec::new();
    if !(1_000_000..=3_600_000_000_000).contains(&h.interval_ns) {
        p.push(format!(
            "the recording's sampling interval ({} ns) is impossible; 100 ms was assumed",
            h.interval_ns
        ));
        h.interval_ns = DEFAULT_INTERVAL_NS;
    }
    if h.cpus == 0 || h.cpus as usize > MAX_CPUS {
        p.push(format!(
            "the recording's CPU count ({}) is impossible; 1 was assumed",
            h.cpus
        ));
        h.cpus = 1;
    }
    if !h.page_size.is_power_of_two() || !(512..=1 << 30).contains(&h.page_size) {
        p.push(format!(
            "the recording's page size ({}) is impossible; 4096 was assumed",
            h.page_size
        ));
        h.page_size = 4096;
    }
    if !(1..=100_000).contains(&h.clock_ticks_per_s) {
        p.push(format!(
            "the recording's clock tick rate ({}/s) is impossible; 100 was assumed",
            h.clock_ticks_per_s
        ));
        h.clock_ticks_per_s = 100;
    }
    if h.gpu_idle_threshold_pct
        .is_some_and(|v| !(0.0..100.0).contains(&v))
    {
        p.push("the recording's GPU idle threshold is impossible; 5% was assumed".into());
        h.gpu_idle_threshold_pct = Some(5.0);
    }
    if h.start.0 > u64::MAX - AFTER_START_NS {
        p.push("the recording's start time is impossible".into());
        h.start = MonoNs(h.anchor_monotonic_ns.min(u64::MAX - AFTER_START_NS));
    }
    (h, p)
}

/// Cumulative counters of one source at its previous accepted sample.
#[derive(Clone, Copy)]
struct Last {
    t: MonoNs,
    cpu_ns: u64,
    a: u64,
    b: u64,
}

pub struct Checker {
    start: MonoNs,
    lo: u64,
    hi: u64,
    cpus: u64,
    /// Measurement granularity of CPU times: two clock ticks plus the time
    /// one /proc pass may take.
    slack_ns: u64,
    boottime_offset: u64,
    born: HashMap<Pid, MonoNs>,
    /// When each process was first seen.
    seen: HashMap<Pid, MonoNs>,
    procs: HashMap<Pid, (u64, u64)>,
    threads: HashMap<(Pid, Tid), Last>,
    proc_samples: HashMap<Pid, Last>,
    system: Option<MonoNs>,
    disks: HashMap<String, Last>,
    disks_t: Option<MonoNs>,
    pressure_t: Option<MonoNs>,
    memory: Option<MonoNs>,
    mem_total: u64,
    /// Per sampler and thread: batches of one sampler come in time order
    /// (the first and last sample of the latest).
    batches: HashMap<(StackKind, SampleSource, Pid, Tid), (MonoNs, MonoNs)>,
    gpu_t: HashMap<(u8, u32), MonoNs>,
    gpu_mem_total: HashMap<u32, u64>,
    max_t: Option<MonoNs>,
    footer: bool,
    pub invalid: std::collections::BTreeMap<String, u64>,
    pub duplicates: u64,
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

impl Checker {
    pub fn new(h: &Header) -> Checker {
        let tick = 1_000_000_000 / h.clock_ticks_per_s.max(1);
        Checker {
            start: h.start,
            lo: h.start.0.saturating_sub(BEFORE_START_NS),
            hi: h.start.0.saturating_add(AFTER_START_NS),
            cpus: h.cpus.max(1) as u64,
            slack_ns: 2 * tick + 20_000_000,
            boottime_offset: h.boottime_offset_ns,
            born: HashMap::new(),
            seen: HashMap::new(),
            procs: HashMap::new(),
            threads: HashMap::new(),
            proc_samples: HashMap::new(),
            system: None,
            disks: HashMap::new(),
            disks_t: None,
            pressure_t: None,
            memory: None,
            mem_total: 0,
            batches: HashMap::new(),
            gpu_t: HashMap::new(),
            gpu_mem_total: HashMap::new(),
            max_t: None,
            footer: false,
            invalid: Default::default(),
            duplicates: 0,
        }
    }

    /// The latest event time accepted so far.
    pub fn last_time(&self) -> Option<MonoNs> {
        self.max_t
    }

    fn bad<T>(&mut self, why: &str) -> Option<T> {
        *self.invalid.entry(why.to_string()).or_default() += 1;
        None
    }

    fn dup<T>(&mut self) -> Option<T> {
        self.duplicates += 1;
        None
    }

    fn time_ok(&self, t: MonoNs) -> bool {
        (self.lo..=self.hi).contains(&t.0)
    }

    /// Most CPU time `n_cpus` can use in `dt`, with the measurement slack.
    fn cpu_bound(&self, dt: u64, n_cpus: u64) -> u64 {
        dt.saturating_add(self.slack_ns + dt / 20)
            .saturating_mul(n_cpus)
    }

    fn status_ok(s: &JobStatus) -> bool {
        match *s {
            JobStatus::Exited(c) => (0..=255).contains(&c),
            JobStatus::Signaled(s) => (1..=64).contains(&s),
            JobStatus::StillRunning | JobStatus::EndedUnknown => true,
        }
    }

    /// The event as it may be used, or None (dropped and counted).
    pub fn check(&mut self, mut ev: Event) -> Option<Event> {
        if let Some(t) = ev.time() {
            if !self.time_ok(t) {
                return self.bad("with a time outside the recording");
            }
        }
        if self.footer && !matches!(ev, Event::Footer(_)) {
            // Nothing follows the footer in a recording; a repeated block
            // can put events after it.
            if let Some(t) = ev.time() {
                if self.max_t.is_some_and(|m| t <= m) {
                    return self.dup();
                }
            }
        }
        // Each family of events has its checks in a method of its own.
        let ok = match ev {
            Event::Header(_) => return self.dup(),
            Event::Footer(_)
            | Event::Process { .. }
            | Event::ProcessExit { .. }
            | Event::ThreadCpu { .. } => self.check_processes(&mut ev)?,
            Event::ProcessSample { .. } | Event::SystemCpu { .. } | Event::Disks { .. } => {
                self.check_resources(&mut ev)?
            }
            Event::Pressure { .. }
            | Event::Memory { .. }
            | Event::Samples(_)
            | Event::StackNode { .. }
            | Event::GpuDevice { .. }
            | Event::GpuUtil { .. }
            | Event::GpuProcUtil { .. }
            | Event::GpuState { .. }
            | Event::GpuPcie { .. } => self.check_samples_and_gpus(&mut ev)?,
            _ => true,
        };
        if !ok {
            return None;
        }
        if let Some(t) = ev.time() {
            if self.max_t.map_or(true, |m| t > m) {
                self.max_t = Some(t);
            }
        }
        Some(ev)
    }

    /// [`Checker::check`] of the footer, processes and threads. `None`: the event
    /// is dropped (counted as a duplicate or an invalid event).
    fn check_processes(&mut self, ev: &mut Event) -> Option<bool> {
        let ok = match ev {
            Event::Footer(f) => {
                if self.footer {
                    return self.dup();
                }
                if !Self::status_ok(&f.status) {
                    return self.bad("end records with an impossible exit status");
                }
                // The footer is written after everything else.
                if let Some(m) = self.max_t {
                    f.t = f.t.max(m);
                }
                let run = f.t.0.saturating_sub(self.start.0);
                if f.profiler_cpu_ns > self.cpu_bound(run, self.cpus) {
                    f.profiler_cpu_ns = 0;
                    *self
                        .invalid
                        .entry("impossible profiler CPU times (shown as 0)".into())
                        .or_default() += 1;
                }
                self.footer = true;
                true
            }
            Event::Process {
                t,
                pid,
                start_boot_ns,
                comm,
                cmdline,
                ..
            } => {
                let key = (*start_boot_ns, identity(comm, cmdline));
                if self.procs.get(pid) == Some(&key) {
                    return self.dup();
                }
                if self.procs.get(pid).is_some_and(|k| k.0 != key.0) {
                    // A reused PID: a new process, new counters.
                    self.proc_samples.remove(pid);
                    self.threads.retain(|k, _| k.0 != *pid);
                }
                if self.procs.len() < MAX_TRACKED * 16 || self.procs.contains_key(pid) {
                    self.procs.insert(*pid, key);
                }
                let first = self.seen.entry(*pid).or_insert(*t);
                *first = (*first).min(*t);
                // Birth from /proc's start time, when it is plausible.
                let birth = start_boot_ns.saturating_sub(self.boottime_offset);
                if *start_boot_ns > 0 && birth <= t.0 {
                    self.born.insert(*pid, MonoNs(birth));
                } else {
                    self.born.remove(pid);
                }
                true
            }
            Event::ProcessExit { t, pid, status } => {
                if self.seen.get(pid).is_some_and(|s| *t < *s) {
                    return self.bad("process exits before the process was seen");
                }
                if status.as_ref().is_some_and(|s| !Self::status_ok(s)) {
                    *status = None;
                    *self
                        .invalid
                        .entry("impossible exit statuses (shown as unknown)".into())
                        .or_default() += 1;
                }
                true
            }
            Event::ThreadCpu {
                t,
                pid,
                tid,
                user_ns,
                sys_ns,
                ..
            } => {
                let total = user_ns.saturating_add(*sys_ns);
                let (t, key) = (*t, (*pid, *tid));
                match self.threads.get(&key).copied() {
                    Some(l) if t <= l.t => return self.dup(),
                    Some(l) => {
                        if total.saturating_sub(l.cpu_ns) > self.cpu_bound(t.0 - l.t.0, 1) {
                            return self.bad("thread CPU samples using more CPU than time passed");
                        }
                    }
                    None => {
                        if !self.first_cpu_ok(*pid, t, total, 1) {
                            return self.bad("thread CPU samples using more CPU than time passed");
                        }
                    }
                }
                if self.threads.len() < MAX_TRACKED * 16 || self.threads.contains_key(&key) {
                    self.threads.insert(
                        key,
                        Last {
                            t,
                            cpu_ns: total,
                            a: 0,
                            b: 0,
                        },
                    );
                }
                true
            }
            _ => true,
        };
        Some(ok)
    }

    /// [`Checker::check`] of process, CPU and disk samples. `None`: the event
    /// is dropped (counted as a duplicate or an invalid event).
    fn check_resources(&mut self, ev: &mut Event) -> Option<bool> {
        let ok = match ev {
            Event::ProcessSample {
                t,
                pid,
                user_ns,
                sys_ns,
                rss_bytes,
                read_bytes,
                write_bytes,
                ..
            } => {
                let total = user_ns.saturating_add(*sys_ns);
                let t = *t;
                if self.mem_total > 0 && *rss_bytes > self.mem_total.saturating_mul(2) {
                    return self
                        .bad("process samples with more resident memory than the machine has");
                }
                match self.proc_samples.get(pid).copied() {
                    Some(l) if t <= l.t => return self.dup(),
                    Some(l) => {
                        let dt = t.0 - l.t.0;
                        if total.saturating_sub(l.cpu_ns) > self.cpu_bound(dt, self.cpus) {
                            return self.bad("process samples using more CPU than the machine has");
                        }
                        let max_bytes = (MAX_BYTES_PER_S * secs(dt + self.slack_ns)) as u64;
                        if read_bytes.saturating_sub(l.a) > max_bytes
                            || write_bytes.saturating_sub(l.b) > max_bytes
                        {
                            return self.bad("process samples with an impossible IO rate");
                        }
                    }
                    None => {
                        if !self.first_cpu_ok(*pid, t, total, self.cpus) {
                            return self.bad("process samples using more CPU than the machine has");
                        }
                    }
                }
                if self.proc_samples.len() < MAX_TRACKED * 16 || self.proc_samples.contains_key(pid)
                {
                    self.proc_samples.insert(
                        *pid,
                        Last {
                            t,
                            cpu_ns: total,
                            a: *read_bytes,
                            b: *write_bytes,
                        },
                    );
                }
                true
            }
            Event::SystemCpu { t, per_cpu, .. } => {
                if per_cpu.len() > MAX_CPUS {
                    return self.bad("system samples with an impossible CPU count");
                }
                if self.system.is_some_and(|l| *t <= l) {
                    return self.dup();
                }
                self.system = Some(*t);
                true
            }
            Event::Disks { t, disks } => {
                let t = *t;
                if self.disks_t.is_some_and(|l| t <= l) {
                    return self.dup();
                }
                if disks.len() > MAX_CPUS {
                    return self.bad("disk samples listing an impossible number of disks");
                }
                for d in disks.iter() {
                    if let Some(l) = self.disks.get(&d.name) {
                        let dt = t.0.saturating_sub(l.t.0);
                        let max_bytes = (MAX_BYTES_PER_S * secs(dt + self.slack_ns)) as u64;
                        let busy_ms = d.io_ms.saturating_sub(l.cpu_ns);
                        if busy_ms.saturating_mul(1_000_000) > self.cpu_bound(dt, 1)
                            || d.read_bytes.saturating_sub(l.a) > max_bytes
                            || d.write_bytes.saturating_sub(l.b) > max_bytes
                        {
                            return self.bad("disk samples busier than time passed");
                        }
                    }
                }
                self.disks_t = Some(t);
                for d in disks.iter() {
                    if self.disks.len() < MAX_TRACKED || self.disks.contains_key(&d.name) {
                        self.disks.insert(
                            d.name.clone(),
                            Last {
                                t,
                                cpu_ns: d.io_ms,
                                a: d.read_bytes,
                                b: d.write_bytes,
                            },
                        );
                    }
                }
                true
            }
            _ => true,
        };
        Some(ok)
    }

    /// [`Checker::check`] of pressure and memory samples, stack samples and nodes, GPU samples. `None`: the event
    /// is dropped (counted as a duplicate or an invalid event).
    fn check_samples_and_gpus(&mut self, ev: &mut Event) -> Option<bool> {
        let ok = match ev {
            Event::Pressure { t, cpu, io, memory } => {
                let t = *t;
                if self.pressure_t.is_some_and(|l| t <= l) {
                    return self.dup();
                }
                // Stall shares are capped at 100% in the analysis.
                let _ = (cpu, io, memory);
                self.pressure_t = Some(t);
                true
            }
            Event::Memory {
                t,
                total_bytes,
                available_bytes,
                swap_total_bytes,
                swap_free_bytes,
                ..
            } => {
                if self.memory.is_some_and(|l| *t <= l) {
                    return self.dup();
                }
                if available_bytes > total_bytes || swap_free_bytes > swap_total_bytes {
                    return self.bad("memory samples with more free than total memory");
                }
                self.memory = Some(*t);
                self.mem_total = *total_bytes;
                true
            }
            Event::Samples(b) => {
                let n = b.stacks.len();
                if b.dt_us.len() != n
                    || b.incomplete.windows(2).any(|w| w[0] >= w[1])
                    || b.incomplete.last().is_some_and(|i| *i as usize >= n)
                {
                    return self.bad("malformed sample batches");
                }
                let span_us: u64 = b.dt_us.iter().map(|d| *d as u64).sum();
                let end = MonoNs((b.t0.0 / 1000).saturating_add(span_us).saturating_mul(1000));
                if !self.time_ok(end) {
                    return self.bad("with a time outside the recording");
                }
                let key = (b.kind, b.source, b.pid, b.tid);
                // A batch starts at its first sample, which may share the
                // instant of the previous batch's last one: the in-process
                // timers give each period merged into one signal a sample
                // at that signal's time, and a flush can fall between
                // them. Such a batch once went as a duplicate, a second of
                // samples with it. A repeat starts where the one before did.
                if self
                    .batches
                    .get(&key)
                    .is_some_and(|&(first, last)| b.t0 < last || b.t0 == first)
                {
                    return self.dup();
                }
                if self.batches.len() < MAX_TRACKED * 16 || self.batches.contains_key(&key) {
                    self.batches.insert(key, (b.t0, end));
                }
                true
            }
            Event::StackNode { id, parent, .. } => {
                // Nodes are interned in order: a parent always comes first.
                if parent.is_some_and(|p| p >= *id) {
                    return self.bad("stack nodes out of order");
                }
                true
            }
            Event::GpuDevice { gpu, mem_total, .. } => {
                if let Some(m) = mem_total {
                    self.gpu_mem_total.insert(*gpu, *m);
                }
                true
            }
            Event::GpuUtil { t, gpu, samples } => {
                let (t, gpu) = (*t, *gpu);
                if samples.iter().any(|s| s.1 > 100) {
                    return self.bad("GPU samples above 100%");
                }
                self.gpu_seq(0, gpu, t)?;
                true
            }
            Event::GpuProcUtil { t, gpu, samples } => {
                let (t, gpu) = (*t, *gpu);
                if samples.iter().any(|s| s.sm > 100 || s.mem > 100) {
                    return self.bad("GPU samples above 100%");
                }
                self.gpu_seq(1, gpu, t)?;
                true
            }
            Event::GpuState { t, gpu, state } => {
                let (t, gpu) = (*t, *gpu);
                self.gpu_seq(2, gpu, t)?;
                let mem_total = self.gpu_mem_total.get(&gpu).copied();
                if !gpu_state_ok(state, mem_total) {
                    return self.bad("GPU state samples with impossible values");
                }
                true
            }
            Event::GpuPcie { t, gpu, .. } => {
                let (t, gpu) = (*t, *gpu);
                self.gpu_seq(3, gpu, t)?;
                true
            }
            _ => true,
        };
        Some(ok)
    }

    /// GPU events of one kind and GPU come in time order.
    fn gpu_seq(&mut self, kind: u8, gpu: u32, t: MonoNs) -> Option<()> {
        let key = (kind, gpu);
        if self.gpu_t.get(&key).is_some_and(|l| t <= *l) {
            self.duplicates += 1;
            return None;
        }
        if self.gpu_t.len() < MAX_TRACKED || self.gpu_t.contains_key(&key) {
            self.gpu_t.insert(key, t);
        }
        Some(())
    }

    /// The first CPU total of a thread or process (`n_cpus` at most) cannot
    /// exceed what it could have used since the process was born (its
    /// start time in /proc, when known).
    fn first_cpu_ok(&self, pid: Pid, t: MonoNs, total: u64, n_cpus: u64) -> bool {
        match self.born.get(&pid) {
            Some(born) => total <= self.cpu_bound(t.0.saturating_sub(born.0), n_cpus),
            None => true,
        }
    }
}

/// A hash of what a process runs, to recognise a repeated record.
fn identity(comm: &str, cmdline: &[String]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    comm.hash(&mut h);
    cmdline.hash(&mut h);
    h.finish()
}

fn gpu_state_ok(s: &GpuState, mem_total: Option<u64>) -> bool {
    s.temp_c.map_or(true, |v| v <= 250)
        && s.power_mw.map_or(true, |v| v <= 100_000_000)
        && s.power_limit_mw.map_or(true, |v| v <= 100_000_000)
        && s.sm_mhz.map_or(true, |v| v <= 100_000)
        && s.mem_mhz.map_or(true, |v| v <= 100_000)
        && s.pcie_gen.map_or(true, |v| v <= 64)
        && s.pcie_width.map_or(true, |v| v <= 1024)
        && match (s.mem_used, mem_total) {
            (Some(u), Some(t)) => u <= t,
            _ => true,
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::SampleBatch;

    const MS: u64 = 1_000_000;

    fn header() -> Header {
        Header::for_tests(MonoNs(1_000 * MS), Pid(10))
    }

    fn batch(source: SampleSource, t0_ms: u64) -> Event {
        Event::Samples(SampleBatch {
            kind: StackKind::Native,
            pid: Pid(10),
            tid: Tid(10),
            t0: MonoNs((1_000 + t0_ms) * MS),
            dt_us: vec![0, 10_000],
            stacks: vec![1, 1],
            incomplete: vec![],
            source,
        })
    }

    #[test]
    fn batches_of_two_samplers_on_one_thread_are_not_duplicates() {
        let mut c = Checker::new(&header());
        // perf and the in-process agent sample the same thread over the
        // same time: each sampler's batches are in order on their own.
        assert!(c.check(batch(SampleSource::Perf, 100)).is_some());
        assert!(c.check(batch(SampleSource::Agent, 50)).is_some());
        assert!(c.check(batch(SampleSource::Perf, 150)).is_some());
        assert!(c.check(batch(SampleSource::Agent, 120)).is_some());
        // A repeated batch of one sampler still is one.
        assert!(c.check(batch(SampleSource::Agent, 120)).is_none());
        assert_eq!(c.duplicates, 1);
        // The next batch may start at the instant the last one ended
        // (periods merged into one timer signal, split by a flush); one
        // that starts inside the last one overlaps it.
        assert!(c.check(batch(SampleSource::Agent, 130)).is_some());
        assert!(c.check(batch(SampleSource::Agent, 135)).is_none());
        assert_eq!(c.duplicates, 2);
    }
}
