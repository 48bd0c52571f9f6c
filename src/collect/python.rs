//! Python-level stacks of the job's Python processes, read with the
//! `py-spy` crate used as a library, in non-blocking mode (the job is never
//! stopped: py-spy reads the interpreter's frame lists from
//! `/proc/PID/mem` while it runs).
//!
//! Reading one process costs a fraction of a millisecond to a few
//! milliseconds, so Python stacks are taken at a lower rate than perf's
//! native samples: the loop keeps its own CPU under [`CPU_BUDGET`] of one
//! core and never exceeds the native frequency.
//!
//! When the in-process agent samples a process (same-instant Python frames,
//! see `docs/stacks.md`), py-spy does not read it, unless it is the main
//! process of a rank whose loop thread the wall-clock sampler cannot read
//! with the agent's layout: the time a rank waits in collectives is
//! measured from stacks of its blocked threads (`analysis::collectives`),
//! the wall-clock sampler's where it reads them, else py-spy's. Nothing
//! else uses py-spy's stacks of a process the agent samples, and on a job
//! that keeps every core busy each read is taken from the job.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use py_spy::config::{LineNo, LockingStrategy};
use py_spy::{Config, PythonSpy};

use crate::collect::intern::Interner;
use crate::collect::perf::verdicts::AgentVerdicts;
use crate::collect::procfs::read_rank_env;
use crate::collect::TreeNews;
use crate::event::{Coverage, Event, MonoNs, Pid, StackKind, StackStats, Tid};
use crate::record::Sink;
use crate::vocab::coverage;
use crate::vocab::ranks::RankIds;

/// How long a rank's main process that has the agent loaded waits for the
/// wall-clock sampler to read its loop thread with the agent's layout
/// before py-spy reads it: the sampler looks for the layout at each
/// listing of the job's threads (once a second) and at each blocked look
/// at the loop (at most every 100 ms), so it finds it within about a
/// second of the agent's first sample.
const WALL_READER_LIMIT: Duration = Duration::from_secs(3);
/// Share of one core the Python sampler may use.
pub const CPU_BUDGET: f64 = 0.01;
/// How soon after perf reports a fork or exec the process list is read
/// (and how often without perf: four times this).
const DISCOVER_EVERY: Duration = Duration::from_millis(25);
/// Safety net: read the process list this often even without news.
const REDISCOVER_EVERY: Duration = Duration::from_secs(1);
/// Attaching a process that just forked can fail transiently.
const ATTACH_ATTEMPTS: u32 = 8;
/// A Python process that has the agent loaded is left unread until the
/// agent says whether it samples it: at once when it cannot, else at its
/// first sample, after one sampling period of a thread's CPU time (10 ms
/// at 99 Hz), read within ~30 ms. A process still silent after this long
/// is read, and left to the agent if it speaks up later — unless it has
/// been idle (see [`AGENT_SILENT_CPU_PERIODS`]).
const AGENT_SILENT_LIMIT: Duration = Duration::from_secs(2);
/// A silent process that used less CPU than this many sampling periods
/// since it was found is idle, not failed: the agent's first sample (and
/// its word) comes once a thread has run one period. It stays left to the
/// agent, and its CPU is looked at again at each reading of the process
/// list (once a second). py-spy reading an idle process at 99 Hz cost
/// ~0.2 ms a round — 2% of a core for `multiprocessing`'s resource
/// tracker, which a spawn-context DataLoader starts and which sleeps for
/// the whole run.
const AGENT_SILENT_CPU_PERIODS: u64 = 10;

pub struct PySampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<StackStats>,
}

impl PySampler {
    /// Start following the Python processes among gpuprof's descendants.
    /// `news.processes` is bumped by the perf reader on every new process and
    /// exec; without it the process list is polled.
    /// `root`: follow that running process and its descendants instead
    /// (`gpuprof attach`). Nothing is read until `active` (the recording
    /// window is open).
    pub fn start(
        frequency: u64,
        sink: Sink,
        news: Option<Arc<TreeNews>>,
        root: Option<Pid>,
        agent: Option<Arc<AgentVerdicts>>,
        active: Arc<AtomicBool>,
    ) -> std::io::Result<PySampler> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("gpuprof-python".into())
            .spawn(move || {
                let _cost = crate::selfcost::Charge::new("python sampler (py-spy)");
                let mut s = Sampler::new(frequency, sink, news);
                s.root = root;
                s.agent = agent;
                while !active.load(Ordering::Acquire) && !stop2.load(Ordering::Acquire) {
                    std::thread::park_timeout(Duration::from_millis(25));
                }
                s.run(&stop2);
                s.finish()
            })?;
        Ok(PySampler { stop, thread })
    }

    /// Tell the sampler to end, without waiting for it.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.thread.thread().unpark();
    }

    pub fn stop(self) -> StackStats {
        self.request_stop();
        self.thread.join().unwrap_or_else(|_| StackStats {
            kind: Some(StackKind::Python),
            detail: "the Python sampler thread panicked".into(),
            ..Default::default()
        })
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct PyKey {
    name: String,
    file: String,
    entry: bool,
}

struct Sampler {
    sink: Sink,
    frequency: u64,
    config: Config,
    spies: HashMap<Pid, PythonSpy>,
    /// Processes that are not Python (by executable) or could not be read.
    rejected: HashMap<Pid, (String, u32)>,
    unreadable: Vec<(Pid, String)>,
    attached: HashSet<Pid>,
    interner: Interner<PyKey>,
    stats: StackStats,
    busy: Duration,
    attach_time: Duration,
    first_error: Option<String>,
    news: Option<Arc<TreeNews>>,
    rounds: u64,
    frames_buf: Vec<u32>,
    root: Option<Pid>,
    announced: HashSet<Pid>,
    /// What the in-process agent said of each process (None: no agent).
    agent: Option<Arc<AgentVerdicts>>,
    /// Python processes left to the agent, by executable (an exec makes
    /// them new processes).
    left_to_agent: HashMap<Pid, String>,
    /// How many processes were left to the agent in all.
    left_total: u64,
    /// Python processes waiting for the agent's word: their executable,
    /// since when, and their CPU time then (ns).
    waiting: HashMap<Pid, Waiting>,
    /// Every process that ever waited for the agent's word, with its
    /// executable: those the agent never spoke for ran without it.
    ever_waited: std::collections::BTreeMap<Pid, String>,
    /// Processes found idle past the agent's silence limit, until read,
    /// left to the agent or spoken for: not worth reading the process list
    /// often for.
    idle_silent: HashSet<Pid>,
    /// Whether a process (running the executable) is the main process of
    /// a rank, which py-spy reads even when the agent samples it, unless
    /// the wall-clock sampler reads its loop thread with the agent's
    /// layout.
    rank_mains: HashMap<Pid, (String, bool)>,
}

/// A Python process waiting for the agent's word.
struct Waiting {
    exe: String,
    since: Instant,
    cpu_ns: Option<u64>,
}

/// A process's CPU time (all its threads, user and system), in ns.
fn process_cpu_ns(pid: Pid) -> Option<u64> {
    let st = crate::collect::procfs::TaskStat::read(pid.0)?;
    let tps = procfs::ticks_per_second().max(1);
    Some((st.utime + st.stime).saturating_mul(1_000_000_000) / tps)
}

/// What to do with a Python process when the agent is in the job.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    Read,
    LeaveToAgent,
    Wait,
}

impl Sampler {
    fn new(frequency: u64, sink: Sink, news: Option<Arc<TreeNews>>) -> Sampler {
        let config = Config {
            blocking: LockingStrategy::NonBlocking,
            native: false,
            collect_thread_names: false,
            lineno: LineNo::NoLine,
            ..Config::default()
        };
        Sampler {
            sink,
            frequency: frequency.max(1),
            config,
            spies: HashMap::new(),
            rejected: HashMap::new(),
            unreadable: Vec::new(),
            attached: HashSet::new(),
            interner: Interner::new(StackKind::Python),
            stats: StackStats {
                kind: Some(StackKind::Python),
                ..Default::default()
            },
            busy: Duration::ZERO,
            attach_time: Duration::ZERO,
            first_error: None,
            news,
            rounds: 0,
            frames_buf: Vec::new(),
            root: None,
            announced: HashSet::new(),
            agent: None,
            left_to_agent: HashMap::new(),
            left_total: 0,
            waiting: HashMap::new(),
            ever_waited: Default::default(),
            idle_silent: HashSet::new(),
            rank_mains: HashMap::new(),
        }
    }

    fn leave_to_agent(&mut self, pid: Pid, exe: String) {
        // A failed attach before the agent spoke up is not to be retried:
        // left in `rejected`, it kept the process list read every 25 ms
        // for the rest of the run (80 ms of CPU in a 6 s run).
        self.rejected.remove(&pid);
        self.ever_waited.remove(&pid);
        if self.left_to_agent.insert(pid, exe).is_none() {
            self.left_total += 1;
        }
    }

    /// Whether py-spy reads `pid` (a Python process running `exe`), leaves
    /// it to the agent, or waits for the agent's word.
    fn plan(&mut self, pid: Pid, exe: &str) -> Plan {
        let Some(verdicts) = &self.agent else {
            return Plan::Read;
        };
        let known = self
            .rank_mains
            .get(&pid)
            .filter(|r| r.0 == exe)
            .map(|r| r.1);
        match known.or_else(|| is_rank_main(pid)) {
            Some(true) => {
                self.rank_mains.insert(pid, (exe.to_string(), true));
                // Its waits in collectives come from the wall-clock
                // sampler's looks at its loop thread once that reads the
                // thread's Python frames with the agent's layout; until
                // then, or where it cannot, py-spy reads the process.
                if !verdicts.walled(pid) {
                    return match self.waiting.get(&pid).filter(|w| w.exe == exe) {
                        Some(w) if w.since.elapsed() >= WALL_READER_LIMIT => Plan::Read,
                        Some(_) => Plan::Wait,
                        None if verdicts.get(pid) == Some(false)
                            || !verdicts.loaded_in(pid) && !verdicts.preloaded_in(pid) =>
                        {
                            Plan::Read
                        }
                        None => self.wait(pid, exe),
                    };
                }
            }
            Some(false) => {
                self.rank_mains.insert(pid, (exe.to_string(), false));
            }
            // Its environment cannot be read yet (mid-exec): ask again.
            None => return Plan::Wait,
        }
        let said = verdicts.get(pid);
        if said.is_some() {
            // Spoken for: not one that ran without the agent (its word is
            // forgotten when it exits, before the closing count).
            self.ever_waited.remove(&pid);
        }
        match said {
            Some(true) => Plan::LeaveToAgent,
            Some(false) => Plan::Read,
            None => {
                let period_ns = 1_000_000_000 / self.frequency;
                if let Some(w) = self.waiting.get(&pid).filter(|w| w.exe == exe) {
                    if w.since.elapsed() < AGENT_SILENT_LIMIT {
                        return Plan::Wait;
                    }
                    let used = match (w.cpu_ns, process_cpu_ns(pid)) {
                        (Some(a), Some(b)) => b.saturating_sub(a),
                        _ => u64::MAX,
                    };
                    if used < AGENT_SILENT_CPU_PERIODS * period_ns {
                        self.idle_silent.insert(pid);
                        return Plan::Wait;
                    }
                    return Plan::Read;
                }
                // Without the agent loaded (a launcher that cleared
                // LD_PRELOAD, a static interpreter) no word will come; an
                // exec that preloads it has not mapped it yet.
                if !verdicts.loaded_in(pid) && !verdicts.preloaded_in(pid) {
                    return Plan::Read;
                }
                self.ever_waited.insert(pid, exe.to_string());
                self.wait(pid, exe)
            }
        }
    }

    /// `pid` (running `exe`) waits from now, with its CPU time now.
    fn wait(&mut self, pid: Pid, exe: &str) -> Plan {
        self.waiting.insert(
            pid,
            Waiting {
                exe: exe.to_string(),
                since: Instant::now(),
                cpu_ns: process_cpu_ns(pid),
            },
        );
        Plan::Wait
    }

    fn run(&mut self, stop: &AtomicBool) {
        let min_interval = Duration::from_secs_f64(1.0 / self.frequency as f64);
        let mut last_discover: Option<Instant> = None;
        let mut seen_changes = u64::MAX;
        let mut next_round = Instant::now();
        if let Some(n) = &self.news {
            n.listen();
        }
        while !stop.load(Ordering::Acquire) {
            // An idle process whose agent spoke up (woken by its word) is
            // no longer silent, whether or not it is still running at the
            // next reading of the process list.
            if let Some(v) = &self.agent {
                self.idle_silent.retain(|p| v.get(*p).is_none());
            }
            // Look for new Python processes when perf saw a fork or an exec
            // (or, without perf, periodically), so that a fresh worker gets
            // Python frames from its start without walking /proc all the time.
            let changes = self.news.as_ref().map(|n| n.processes());
            if self
                .next_discovery(last_discover, seen_changes)
                .map_or(true, |t| Instant::now() >= t)
            {
                let t = Instant::now();
                seen_changes = changes.unwrap_or(0);
                self.discover();
                self.attach_time += t.elapsed();
                last_discover = Some(Instant::now());
            }
            if !self.spies.is_empty() && Instant::now() >= next_round {
                let round = Instant::now();
                let cpu0 = crate::selfcost::thread_cpu_ns();
                self.sample_all();
                self.interner.flush(Some(MonoNs::now()), &self.sink);
                let wall = round.elapsed();
                // The budget is CPU: on a machine whose cores the job keeps
                // busy, a round's wall time is mostly waiting for a core,
                // and pacing on it would starve the sampler (one preempted
                // round of 10 ms meant a second without samples) exactly
                // when ranks' waits in collectives need them.
                let work = match (cpu0, crate::selfcost::thread_cpu_ns()) {
                    (Some(a), Some(b)) => Duration::from_nanos(b.saturating_sub(a)),
                    _ => wall,
                };
                self.busy += work;
                self.rounds += 1;
                // Keep sampling within the CPU budget (attaching, once per
                // process, is not part of it) and below --frequency.
                let budget_sleep = work.mul_f64((1.0 - CPU_BUDGET) / CPU_BUDGET);
                let sleep = budget_sleep
                    .max(min_interval.saturating_sub(work))
                    .min(Duration::from_secs(1));
                next_round = Instant::now() + sleep;
            }
            // Sleep until the next round or discovery. With every Python
            // process left to the agent there is no round, and the thread
            // sleeps until perf's news of a process (which unparks it) or
            // the safety net: polling the news every 25 ms cost ~40
            // wake-ups a second, each taken from the job on a busy machine.
            let now = Instant::now();
            let mut wake = self
                .next_discovery(last_discover, seen_changes)
                .unwrap_or(now);
            if !self.spies.is_empty() {
                wake = wake.min(next_round);
            }
            if wake > now {
                std::thread::park_timeout(wake - now);
            }
        }
        self.interner.flush(None, &self.sink);
    }

    /// When the process list is next read: soon after perf's news of a
    /// process (at most every `DISCOVER_EVERY`), soon while an attach is
    /// retried or a process waits for the agent's word, else at the safety
    /// net's period (without perf's news, every `4 × DISCOVER_EVERY`).
    /// `None`: at once (never read yet).
    fn next_discovery(&self, last: Option<Instant>, seen_changes: u64) -> Option<Instant> {
        let last = last?;
        let retry = self.rejected.values().any(|r| r.1 < ATTACH_ATTEMPTS)
            || self.waiting.keys().any(|p| !self.idle_silent.contains(p));
        Some(match self.news.as_ref().map(|n| n.processes()) {
            Some(c) if c != seen_changes || retry => last + DISCOVER_EVERY,
            Some(_) => last + REDISCOVER_EVERY,
            None => last + DISCOVER_EVERY * 4,
        })
    }

    fn discover(&mut self) {
        let mut live: HashSet<Pid> =
            descendants(self.root.map_or(std::process::id() as i32, |r| r.0))
                .into_iter()
                .map(Pid)
                .collect();
        if let Some(r) = self.root {
            if std::path::Path::new(&format!("/proc/{}", r.0)).exists() {
                live.insert(r);
            }
        }
        self.spies.retain(|p, _| live.contains(p));
        self.rejected.retain(|p, _| live.contains(p));
        self.left_to_agent.retain(|p, _| live.contains(p));
        self.waiting.retain(|p, _| live.contains(p));
        self.rank_mains.retain(|p, _| live.contains(p));
        for pid in live {
            if self.spies.contains_key(&pid) {
                continue;
            }
            let exe = exe_of(pid.0);
            if let Some((seen_exe, attempts)) = self.rejected.get(&pid) {
                // Retry only after an exec or for a transient failure.
                if *seen_exe == exe && *attempts >= ATTACH_ATTEMPTS {
                    continue;
                }
            }
            if self.left_to_agent.get(&pid).is_some_and(|e| *e == exe) {
                continue;
            }
            if !looks_like_python(pid, &exe) {
                self.rejected.insert(pid, (exe, ATTACH_ATTEMPTS));
                continue;
            }
            match self.plan(pid, &exe) {
                Plan::Read => {
                    self.waiting.remove(&pid);
                    self.idle_silent.remove(&pid);
                }
                Plan::Wait => continue,
                Plan::LeaveToAgent => {
                    self.waiting.remove(&pid);
                    self.idle_silent.remove(&pid);
                    self.leave_to_agent(pid, exe);
                    continue;
                }
            }
            // Attaching parses the interpreter's binary: the first thing
            // to give up when gpuprof is short of memory.
            if crate::collect::memory::under_pressure() {
                continue;
            }
            let attached = crate::collect::quietly(|| PythonSpy::new(pid.0, &self.config))
                .unwrap_or_else(|| Err(anyhow::anyhow!("py-spy failed (panicked) attaching")));
            match attached {
                Ok(spy) => {
                    if self.announced.insert(pid) {
                        self.sink.send_blocking(Event::PyProcess {
                            t: MonoNs::now(),
                            pid,
                            version: spy.version.to_string(),
                            same_instant: false,
                            timer: false,
                            detail: String::new(),
                        });
                    }
                    self.rejected.remove(&pid);
                    self.attached.insert(pid);
                    self.spies.insert(pid, spy);
                }
                Err(e) => {
                    crate::collect::loss::note_any(e.as_ref(), "attaching to a Python process");
                    let entry = self.rejected.entry(pid).or_insert((exe.clone(), 0));
                    if entry.0 != exe {
                        *entry = (exe, 0);
                    }
                    entry.1 += 1;
                    if entry.1 >= ATTACH_ATTEMPTS {
                        self.unreadable.push((pid, explain(&e)));
                    }
                }
            }
        }
    }

    fn sample_all(&mut self) {
        // A process attached before the agent spoke up (it was idle) is
        // left to the agent once it does.
        if let Some(v) = &self.agent {
            let taken: Vec<Pid> = self
                .spies
                .keys()
                .copied()
                .filter(|p| {
                    v.get(*p) == Some(true)
                        && self.rank_mains.get(p).is_some_and(|r| !r.1 || v.walled(*p))
                })
                .collect();
            for pid in taken {
                self.spies.remove(&pid);
                self.leave_to_agent(pid, exe_of(pid.0));
            }
        }
        let mut pids: Vec<Pid> = self.spies.keys().copied().collect();
        pids.sort();
        for pid in pids {
            let Some(spy) = self.spies.get_mut(&pid) else {
                continue;
            };
            let before = MonoNs::now();
            let traces = crate::collect::quietly(|| spy.get_stack_traces())
                .unwrap_or_else(|| Err(anyhow::anyhow!("py-spy failed (panicked) reading")));
            let after = MonoNs::now();
            let t = MonoNs(before.0 + (after.0 - before.0) / 2);
            let traces = match traces {
                Ok(t) => t,
                Err(e) => {
                    // A process that exited is dropped at the next discovery;
                    // a torn read of a running interpreter is just counted.
                    self.stats.errors += 1;
                    if self.first_error.is_none() {
                        self.first_error = Some(format!("{e:#}"));
                    }
                    continue;
                }
            };
            let single = traces.len() == 1;
            for tr in traces {
                // Python ≥ 3.11 stores the OS thread id; for older versions
                // a single-threaded process is its main thread.
                let tid = match tr.os_thread_id {
                    Some(id) => Tid(id as i32),
                    None if single => Tid(pid.0),
                    None => continue,
                };
                self.frames_buf.clear();
                // py-spy lists frames innermost first.
                for f in tr.frames.iter().rev() {
                    let key = PyKey {
                        name: f.name.clone(),
                        file: f.filename.clone(),
                        entry: f.is_entry || f.is_shim_entry,
                    };
                    let id = self
                        .interner
                        .frame(&key, &self.sink, |id, k| Event::PyFrame {
                            id,
                            name: k.name.clone(),
                            file: k.file.clone(),
                            entry: k.entry,
                        });
                    self.frames_buf.push(id);
                }
                if let Some(stack) = self.interner.stack(&self.frames_buf, &self.sink) {
                    self.interner.sample(pid, tid, t, stack, true, &self.sink);
                    self.stats.samples += 1;
                }
            }
        }
    }

    fn finish(mut self) -> StackStats {
        // The thread's own CPU time (reads, attaching, finding processes):
        // what it cost the machine, whatever the scheduler did.
        self.stats.busy_ns = crate::selfcost::thread_cpu_ns()
            .unwrap_or((self.busy + self.attach_time).as_nanos() as u64);
        let per_round = self.busy.as_secs_f64() * 1e3 / self.rounds.max(1) as f64;
        let left = if self.agent.is_some() {
            // Idle past the silence limit, and neither read nor left to
            // the agent since.
            let idle = self.idle_silent.len();
            format!(
                " and left {} to the in-process agent, which samples them (py-spy reads the Python processes the agent does not sample, and the ranks' main processes whose loop thread the wall-clock sampler cannot read with the agent's layout, for their waits in collectives){}",
                self.left_total,
                if idle > 0 {
                    format!("; {idle} more with the agent loaded stayed silent while using under {AGENT_SILENT_CPU_PERIODS} sampling periods of CPU (idle: py-spy did not read them)")
                } else {
                    String::new()
                }
            )
        } else {
            String::new()
        };
        self.stats.detail = format!(
            "py-spy (non-blocking) read {} Python process(es){left} in {} rounds ({per_round:.2} ms of CPU per round, {:.0} ms finding and attaching processes), at most {} Hz, reads within {:.1}% of a core; thread CPU {:.3} s",
            self.attached.len(),
            self.rounds,
            self.attach_time.as_secs_f64() * 1e3,
            self.frequency,
            CPU_BUDGET * 100.0,
            self.stats.busy_ns as f64 / 1e9
        );
        self.sink
            .send_blocking(Event::StackStats(self.stats.clone()));
        if let Some(e) = &self.first_error {
            self.stats.detail.push_str(&format!(
                "; {} reads failed (processes exiting, or torn non-blocking reads), first: {e}",
                self.stats.errors
            ));
        }
        let mut detail = self.stats.detail.clone();
        let mut unreadable = self.unreadable.clone();
        unreadable.sort();
        unreadable.dedup_by_key(|u| u.0);
        for (pid, why) in &unreadable {
            detail.push_str(&format!("; pid {pid}: native stacks only: {why}"));
        }
        if let Some(v) = &self.agent {
            let without: Vec<String> = self
                .ever_waited
                .iter()
                .filter(|(pid, _)| v.get(**pid).is_none())
                .map(|(pid, exe)| format!("{pid} ({exe})"))
                .collect();
            if !without.is_empty() {
                const SHOWN: usize = 10;
                detail.push_str(&format!(
                    "; {} Python process(es) ran without the in-process agent, which was loaded but never reported (a process running as another user cannot write into gpuprof's private ring folder; or it exited first): pid {}{}",
                    without.len(),
                    without[..without.len().min(SHOWN)].join(", "),
                    if without.len() > SHOWN { ", …" } else { "" }
                ));
            }
        }
        self.sink.send_blocking(Event::Coverage(Coverage {
            source: coverage::PYTHON_STACKS.into(),
            available: !self.attached.is_empty() || unreadable.is_empty(),
            detail,
        }));
        self.stats
    }
}

/// One line for a process py-spy could not read, with the fix when it is a
/// permission problem.
fn explain(e: &anyhow::Error) -> String {
    let chain = format!("{e:#}");
    let perm = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
    }) || chain.contains("Permission denied")
        || chain.contains("Operation not permitted");
    if perm {
        format!(
            "reading its memory was refused ({chain}); run gpuprof as the job's user with `sudo sysctl kernel.yama.ptrace_scope=0`, or give it CAP_SYS_PTRACE (in Docker: --cap-add SYS_PTRACE)"
        )
    } else {
        format!("py-spy could not read it ({chain})")
    }
}

/// Whether `pid` is the main process of a rank: its environment names a
/// rank ([`RankIds`]), and it is not a copy of a Python parent of the same
/// rank (a DataLoader worker, forked or spawned, inherits its rank's
/// variables; a rank started through a shell wrapper is still a rank).
/// None while its environment cannot be read (mid-exec, or refused).
pub(crate) fn is_rank_main(pid: Pid) -> Option<bool> {
    let env = read_rank_env(pid.0)?;
    if RankIds::from_env(&env).rank.is_none() {
        return Some(false);
    }
    let Some(ppid) = procfs::process::Process::new(pid.0)
        .and_then(|p| p.stat())
        .ok()
        .map(|st| st.ppid)
    else {
        return Some(true);
    };
    Some(
        !(read_rank_env(ppid).as_ref() == Some(&env)
            && looks_like_python(Pid(ppid), &exe_of(ppid))),
    )
}

/// The executable of a process ("" when it cannot be read).
pub(crate) fn exe_of(pid: i32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A cheap pre-check before asking py-spy (which scans the binary).
pub(crate) fn looks_like_python(pid: Pid, exe: &str) -> bool {
    let base = exe.rsplit('/').next().unwrap_or("");
    if base.starts_with("python") || base.starts_with("pypy") {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{}/maps", pid.0))
        .map(|m| m.contains("libpython"))
        .unwrap_or(false)
}

/// Every process below `root` (children of all its threads, recursively).
pub fn descendants(root: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut stack = vec![root];
    let mut seen = HashSet::new();
    let mut buf = Vec::new();
    while let Some(p) = stack.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let Some(tid) = t.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let path = format!("/proc/{p}/task/{tid}/children");
            if crate::collect::procfs::read_once(&path, &mut buf, false).is_err() {
                continue;
            }
            for c in crate::collect::procfs::pids_in(&buf) {
                if seen.insert(c) {
                    out.push(c);
                    stack.push(c);
                }
            }
        }
    }
    out
}
