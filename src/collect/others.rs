//! Other programs' CPU: once a second, how long the job's threads waited
//! runnable for a CPU, and which processes outside the job used CPU
//! meanwhile (another tenant's training, a build, a busy loop left
//! running), so that the diagnosis can name what took CPU the job wanted.
//! While the job's threads did not wait for a CPU, no other program took
//! one from them: the other processes are then read every
//! [`QUIET_PERIOD`], an interval covering the seconds since the last.
//!
//! - The job's threads: `/proc/PID/task/TID/schedstat` (time on a CPU,
//!   time waiting on a run queue, in ns) of every live process of the
//!   job; the sum of each thread's increase.
//! - Every other process: `/proc/PID/stat` (utime + stime). A process is
//!   the job's when it is one of the tree's live processes or their child
//!   (a fork the tree has not read yet); gpuprof itself is left out. The
//!   ones that used at least [`MIN_SHARE`] of a CPU in the interval are
//!   recorded, with their owner and, the first time, their command line,
//!   and which share of the time they were on one of the CPUs the job's
//!   threads may run on (`Cpus_allowed_list`): the CPU of each of their
//!   threads that used CPU is looked at at every sampling tick while they
//!   stay busy, when it is running or runnable.
//!
//! Cost: a `schedstat` read and a `sched_getaffinity` call per thread of
//! the job once a second; one `stat` read per process of the machine once
//! a second while the job waits for CPUs, every five seconds otherwise
//! (~10 ms of CPU with a thousand processes); and a `stat` read per busy
//! thread of the busy other processes (16 processes, 32 threads each at
//! most; 32 reads a tick at most, in turn) at every sampling tick.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use crate::collect::procfs::{read_once, TaskStat};
use crate::event::{Event, MonoNs, OtherProc, Pid};
use crate::record::Sink;

/// How often the job's threads' run-queue waits are read ...
const PERIOD: Duration = Duration::from_secs(1);
/// ... and the machine's other processes at least: every second while
/// the job's threads waited for a CPU (at least [`MIN_SHARE`] of the
/// time), else after this long. Reading every process's `stat` is the
/// cost that grows with the machine, not the job: a second of it was
/// 1.2% of a core with a thousand processes.
const QUIET_PERIOD: Duration = Duration::from_secs(5);
/// The shortest interval recorded at the end.
const FLUSH_MIN: Duration = Duration::from_millis(200);
/// A process outside the job is recorded when it used at least this share
/// of one CPU in the interval.
pub const MIN_SHARE: f64 = 0.02;
/// At most this many processes per interval, the busiest.
pub const MAX_PROCS: usize = 16;
/// Command lines are cut to this many characters.
const CMDLINE_MAX: usize = 200;

pub struct OthersCollector {
    sink: Sink,
    ns_per_tick: u64,
    own: i32,
    last: Option<Instant>,
    last_t: MonoNs,
    /// Per job thread: (run, wait) ns at the last pass.
    threads: HashMap<i32, (u64, u64)>,
    /// The job's threads' run and wait time since the last interval.
    run_ns: u64,
    wait_ns: u64,
    /// The CPUs the job's threads that ran or waited in the last interval
    /// may run on.
    job_cpus: Cpus,
    /// Busy other processes, watched at every tick.
    watch: HashMap<i32, Watched>,
    /// Where the next tick's turn of watched threads starts.
    watch_turn: usize,
    /// Per other process: (starttime, utime + stime in ticks).
    others: HashMap<i32, (u64, u64)>,
    /// Processes whose command line was recorded.
    named: HashSet<(i32, u64)>,
    users: HashMap<u32, String>,
}

impl OthersCollector {
    pub fn new(sink: Sink) -> OthersCollector {
        let tps = procfs::ticks_per_second().max(1);
        OthersCollector {
            sink,
            ns_per_tick: 1_000_000_000 / tps,
            own: std::process::id() as i32,
            last: None,
            last_t: MonoNs(0),
            threads: HashMap::new(),
            run_ns: 0,
            wait_ns: 0,
            job_cpus: Cpus::default(),
            watch: HashMap::new(),
            watch_turn: 0,
            others: HashMap::new(),
            named: HashSet::new(),
            users: read_users(),
        }
    }

    /// Called at every sampling tick: looks at which CPU the busy other
    /// processes are on, and once a [`PERIOD`] takes the figures.
    pub fn tick(&mut self, job: &[i32]) {
        self.look_at_watched();
        if self.last.is_some_and(|l| l.elapsed() < PERIOD) {
            return;
        }
        let first = self.last.is_none();
        self.last = Some(Instant::now());
        let now = MonoNs::now();
        let (run, wait) = self.job_sched(job);
        self.run_ns += run;
        self.wait_ns += wait;
        if first {
            self.other_procs(job, now);
            self.last_t = now;
            return;
        }
        // Without a wait of the job's, no other program took a CPU it
        // wanted: the machine's processes are read again only after
        // `QUIET_PERIOD`, the interval then covering every second since.
        let interval_ns = now.0.saturating_sub(self.last_t.0);
        let waited = self.wait_ns as f64 >= MIN_SHARE * interval_ns as f64;
        if waited || interval_ns >= QUIET_PERIOD.as_nanos() as u64 {
            self.emit(job, now);
        }
    }

    /// At the end of the recording: the interval since the last one, if
    /// the machine's processes were read before.
    pub fn flush(&mut self, job: &[i32]) {
        let now = MonoNs::now();
        // Not right after an interval (the last pass may have just
        // recorded one): CPU times move in clock ticks of 10 ms, which
        // would be whole shares of a sliver of time.
        if self.last.is_none() || now.0.saturating_sub(self.last_t.0) < FLUSH_MIN.as_nanos() as u64
        {
            return;
        }
        let (run, wait) = self.job_sched(job);
        self.run_ns += run;
        self.wait_ns += wait;
        self.emit(job, now);
    }

    /// Read the machine's processes and record the interval since the
    /// last time they were.
    fn emit(&mut self, job: &[i32], now: MonoNs) {
        let procs = self.other_procs(job, now);
        let interval_ns = now.0.saturating_sub(self.last_t.0);
        self.last_t = now;
        let (run, wait) = (
            std::mem::take(&mut self.run_ns),
            std::mem::take(&mut self.wait_ns),
        );
        if interval_ns == 0 {
            return;
        }
        self.sink.send(Event::OtherCpu {
            t: now,
            interval_ns,
            job_run_ns: run,
            job_wait_ns: wait,
            procs,
        });
    }

    /// Whether the watched processes' busy threads that are running or
    /// runnable now are on one of the job's CPUs (a sleeping thread's
    /// last CPU says nothing): [`WATCH_PER_TICK`] of them a tick, in turn.
    fn look_at_watched(&mut self) {
        let total: usize = self.watch.values().map(|w| w.busy.len()).sum();
        if total == 0 {
            return;
        }
        let n = total.min(WATCH_PER_TICK);
        let start = self.watch_turn % total;
        self.watch_turn = (start + n) % total;
        let mut pids: Vec<i32> = self.watch.keys().copied().collect();
        pids.sort_unstable();
        let mut buf = Vec::with_capacity(512);
        let mut i = 0;
        for pid in pids {
            let Some(w) = self.watch.get_mut(&pid) else {
                continue;
            };
            for tid in &w.busy {
                // Within this tick's turn: the n threads from `start` on,
                // around the end.
                let turn = (i + total - start) % total < n;
                i += 1;
                if !turn
                    || read_once(&format!("/proc/{pid}/task/{tid}/stat"), &mut buf, true).is_err()
                {
                    continue;
                }
                let Some(st) = TaskStat::parse(&buf) else {
                    continue;
                };
                if let (Some(cpu), 'R') = (st.processor, st.state) {
                    w.seen += 1;
                    w.on += u32::from(self.job_cpus.has(cpu));
                }
            }
        }
    }

    /// The increase of the job's threads' run and wait time since the last
    /// pass (threads seen for the first time count from now); the CPUs of
    /// those that ran or waited become [`Self::job_cpus`].
    fn job_sched(&mut self, job: &[i32]) -> (u64, u64) {
        let mut seen = HashMap::with_capacity(self.threads.len());
        let (mut run, mut wait) = (0u64, 0u64);
        let mut cpus = Cpus::default();
        for pid in job {
            let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            for e in dir.flatten() {
                let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                    continue;
                };
                let Some((r, w)) = read_schedstat(&format!("/proc/{pid}/task/{tid}/schedstat"))
                else {
                    continue;
                };
                let moved = match self.threads.get(&tid) {
                    Some(&(r0, w0)) => {
                        run += r.saturating_sub(r0);
                        wait += w.saturating_sub(w0);
                        r > r0 || w > w0
                    }
                    None => true,
                };
                // Read afresh: a launcher (`taskset`, `numactl`) sets it
                // just before it execs the job's program.
                if moved {
                    cpus.add(&Cpus::of_task(*pid, tid));
                }
                seen.insert(tid, (r, w));
            }
        }
        self.threads = seen;
        self.job_cpus = cpus;
        (run, wait)
    }

    /// Processes outside the job that used CPU since the last pass.
    fn other_procs(&mut self, job: &[i32], now: MonoNs) -> Vec<OtherProc> {
        let job: HashSet<i32> = job.iter().copied().collect();
        let dt = now.0.saturating_sub(self.last_t.0).max(1);
        let mut seen = HashMap::with_capacity(self.others.len());
        let mut busy: Vec<(u64, i32, u64, TaskStat, u32)> = Vec::new();
        let mut buf = Vec::with_capacity(512);
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if pid == self.own || job.contains(&pid) {
                continue;
            }
            if read_once(&format!("/proc/{pid}/stat"), &mut buf, true).is_err() {
                continue;
            }
            let Some(st) = TaskStat::parse(&buf) else {
                continue;
            };
            if job.contains(&st.ppid) || st.ppid == self.own {
                continue;
            }
            let ticks = st.utime + st.stime;
            let prev = self.others.get(&pid).copied();
            seen.insert(pid, (st.starttime, ticks));
            let used = match prev {
                Some((start, t0)) if start == st.starttime => ticks.saturating_sub(t0),
                // Started since the last pass: all of its CPU is new.
                _ if !self.others.is_empty() => ticks,
                _ => 0,
            } * self.ns_per_tick;
            if used as f64 >= MIN_SHARE * dt as f64 {
                let uid = e.metadata().map(|m| m.uid()).unwrap_or(u32::MAX);
                busy.push((used, pid, st.starttime, st, uid));
            }
        }
        self.others = seen;
        busy.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        busy.truncate(MAX_PROCS);
        let mut watched = std::mem::take(&mut self.watch);
        for b in &busy {
            let old = watched.get_mut(&b.1).map(|w| std::mem::take(&mut w.ticks));
            self.watch.insert(b.1, Watched::start(b.1, old));
        }
        busy.into_iter()
            .map(|(cpu_ns, pid, start, st, uid)| {
                // Where it ran: its CPU at each tick of the interval when it
                // was watched, else its CPU now.
                let on_job_cpus = match watched.get(&pid) {
                    Some(w) if w.seen > 0 => w.on as f32 / w.seen as f32,
                    _ => f32::from(u8::from(st.processor.is_some_and(|c| self.job_cpus.has(c)))),
                };
                let cmdline = if self.named.insert((pid, start)) {
                    read_cmdline(pid)
                } else {
                    String::new()
                };
                OtherProc {
                    pid: Pid(pid),
                    comm: st.comm,
                    user: self
                        .users
                        .get(&uid)
                        .cloned()
                        .unwrap_or_else(|| uid.to_string()),
                    cmdline,
                    cpu_ns,
                    on_job_cpus,
                }
            })
            .collect()
    }
}

/// At most this many threads of a busy process are watched ...
const WATCH_THREADS: usize = 32;
/// ... and this many threads of all of them looked at per tick, in turn:
/// another tenant's 16 busy processes of 32 threads were 512 `stat` reads
/// a tick, 5,120 a second.
const WATCH_PER_TICK: usize = 32;

/// A busy other process: its threads that used CPU in the last interval,
/// and how often one of them, running or runnable, was on the job's CPUs.
#[derive(Default)]
struct Watched {
    busy: Vec<i32>,
    /// Per thread: utime + stime (ticks) at the last pass.
    ticks: HashMap<i32, u64>,
    on: u32,
    seen: u32,
}

impl Watched {
    /// Its threads now; those that used CPU since `old` (all of them the
    /// first time), the busiest first.
    fn start(pid: i32, old: Option<HashMap<i32, u64>>) -> Watched {
        let mut w = Watched::default();
        let mut used: Vec<(u64, i32)> = Vec::new();
        let mut buf = Vec::with_capacity(512);
        if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for e in dir.flatten() {
                let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                    continue;
                };
                if read_once(&format!("/proc/{pid}/task/{tid}/stat"), &mut buf, true).is_err() {
                    continue;
                }
                let Some(st) = TaskStat::parse(&buf) else {
                    continue;
                };
                let t = st.utime + st.stime;
                let d = match &old {
                    Some(o) => t.saturating_sub(o.get(&tid).copied().unwrap_or(0)),
                    None => t.max(1),
                };
                w.ticks.insert(tid, t);
                if d > 0 || st.state == 'R' {
                    used.push((d, tid));
                }
            }
        }
        used.sort_by(|a, b| b.cmp(a));
        w.busy = used.into_iter().take(WATCH_THREADS).map(|x| x.1).collect();
        w
    }
}

/// A set of CPUs (`Cpus_allowed_list`).
#[derive(Clone, Debug, Default, PartialEq)]
struct Cpus(Vec<u64>);

impl Cpus {
    fn has(&self, cpu: i32) -> bool {
        let c = cpu.max(0) as usize;
        self.0.get(c / 64).is_some_and(|w| w & (1 << (c % 64)) != 0)
    }

    fn add(&mut self, o: &Cpus) {
        if self.0.len() < o.0.len() {
            self.0.resize(o.0.len(), 0);
        }
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            *a |= b;
        }
    }

    fn insert(&mut self, c: usize) {
        if self.0.len() <= c / 64 {
            self.0.resize(c / 64 + 1, 0);
        }
        self.0[c / 64] |= 1 << (c % 64);
    }

    /// A task's allowed CPUs; every CPU when they cannot be read. With
    /// `sched_getaffinity`, not `Cpus_allowed_list` in its `status` file:
    /// that file formats some fifty fields, and this ran for each of the
    /// job's threads every second.
    fn of_task(_pid: i32, tid: i32) -> Cpus {
        use nix::sched::{sched_getaffinity, CpuSet};
        match sched_getaffinity(nix::unistd::Pid::from_raw(tid)) {
            Ok(set) => {
                let mut c = Cpus::default();
                for i in (0..CpuSet::count()).filter(|&i| set.is_set(i).unwrap_or(false)) {
                    c.insert(i);
                }
                c
            }
            Err(_) => Cpus::all(),
        }
    }

    fn all() -> Cpus {
        let mut c = Cpus::default();
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        for i in 0..n.max(1024) {
            c.insert(i);
        }
        c
    }
}

/// `schedstat`: time on a CPU and time waiting on a run queue (ns).
fn read_schedstat(path: &str) -> Option<(u64, u64)> {
    let mut buf = Vec::with_capacity(64);
    read_once(path, &mut buf, true).ok()?;
    parse_schedstat(std::str::from_utf8(&buf).ok()?)
}

fn parse_schedstat(s: &str) -> Option<(u64, u64)> {
    let mut f = s.split_ascii_whitespace();
    Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
}

/// A process's command line, arguments joined by spaces, at most
/// [`CMDLINE_MAX`] characters.
fn read_cmdline(pid: i32) -> String {
    let Ok(b) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return String::new();
    };
    let s = String::from_utf8_lossy(&b)
        .trim_end_matches('\0')
        .replace('\0', " ");
    match s.char_indices().nth(CMDLINE_MAX) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

/// uid → user name from `/etc/passwd` (read once; users of a directory
/// service are shown by number).
fn read_users() -> HashMap<u32, String> {
    let text = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    parse_passwd(&text)
}

fn parse_passwd(text: &str) -> HashMap<u32, String> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let uid = f.nth(1)?.parse().ok()?;
            Some((uid, name.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_and_passwd_parse() {
        assert_eq!(
            parse_schedstat("2351963462 105361009 4012\n"),
            Some((2351963462, 105361009))
        );
        assert_eq!(parse_schedstat("12\n"), None);
        let u = parse_passwd("root:x:0:0:root:/root:/bin/bash\nbad\nnobody:x:65534:65534::/:/x\n");
        assert_eq!(u.get(&0).map(String::as_str), Some("root"));
        assert_eq!(u.get(&65534).map(String::as_str), Some("nobody"));
        assert_eq!(u.len(), 2);
    }

    /// A thread pinned to one CPU (as `taskset` pins a job) has that CPU
    /// alone; its process's other threads keep theirs.
    #[test]
    fn a_threads_allowed_cpus_are_its_affinity() {
        use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
        let me = nix::unistd::Pid::from_raw(0);
        let mine = sched_getaffinity(me).unwrap();
        let Some(one) = (0..CpuSet::count()).find(|&i| mine.is_set(i).unwrap_or(false)) else {
            panic!("no CPU allowed");
        };
        let pid = std::process::id() as i32;
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let mut set = CpuSet::new();
            set.set(one).unwrap();
            sched_setaffinity(me, &set).unwrap();
            tx.send(nix::unistd::gettid().as_raw()).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let c = Cpus::of_task(pid, tid);
        done_tx.send(()).unwrap();
        t.join().unwrap();
        let allowed: Vec<usize> = (0..CpuSet::count()).filter(|&i| c.has(i as i32)).collect();
        assert_eq!(allowed, vec![one]);
        let here = Cpus::of_task(pid, nix::unistd::gettid().as_raw());
        for i in 0..CpuSet::count() {
            assert_eq!(here.has(i as i32), mine.is_set(i).unwrap(), "CPU {i}");
        }
    }

    fn spawn(cmd: &str) -> std::process::Child {
        std::process::Command::new("sh")
            .args(["-c", cmd])
            .spawn()
            .unwrap()
    }

    /// Both on the first CPU this process may use.
    fn pin_together(pids: &[u32]) {
        use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
        let mine = sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
        let one = (0..CpuSet::count())
            .find(|&i| mine.is_set(i).unwrap_or(false))
            .unwrap();
        let mut set = CpuSet::new();
        set.set(one).unwrap();
        for p in pids {
            sched_setaffinity(nix::unistd::Pid::from_raw(*p as i32), &set).unwrap();
        }
    }

    fn other_cpu(evs: &[Event]) -> Vec<(u64, u64, &[OtherProc])> {
        evs.iter()
            .filter_map(|e| match e {
                Event::OtherCpu {
                    interval_ns,
                    job_wait_ns,
                    procs,
                    ..
                } => Some((*interval_ns, *job_wait_ns, procs.as_slice())),
                _ => None,
            })
            .collect()
    }

    /// A busy child of this test process (not of the "job") is listed with
    /// its CPU; the job's own processes never are. The job (a `sleep`)
    /// never waits for a CPU: a second later the machine's processes are
    /// not read again, and the interval recorded at the end covers both
    /// seconds.
    #[test]
    fn a_busy_process_outside_the_job_is_listed() {
        let (tx, rx) = std::sync::mpsc::sync_channel(16);
        let sink = crate::record::Sink::from_parts(tx, Default::default());
        let mut c = OthersCollector::new(sink);
        let mut hog = spawn("while :; do :; done");
        let hog_pid = hog.id() as i32;
        let mut job = spawn("exec sleep 30");
        let job_pids = [job.id() as i32];
        // Asleep, past its start (which may wait for a CPU beside the hog).
        while TaskStat::read(job_pids[0]).map_or(true, |s| s.comm != "sleep" || s.state != 'S') {
            std::thread::sleep(Duration::from_millis(10));
        }
        c.own = -1;
        c.tick(&job_pids);
        std::thread::sleep(Duration::from_millis(1100));
        c.tick(&job_pids);
        let ticked: Vec<Event> = rx.try_iter().collect();
        std::thread::sleep(Duration::from_millis(1000));
        c.flush(&job_pids);
        let _ = hog.kill();
        let _ = hog.wait();
        let _ = job.kill();
        let _ = job.wait();
        assert!(other_cpu(&ticked).is_empty(), "{ticked:?}");
        let evs: Vec<Event> = rx.try_iter().collect();
        let got = other_cpu(&evs);
        let [(interval_ns, wait_ns, procs)] = got.as_slice() else {
            panic!("{evs:?}");
        };
        assert!(*interval_ns >= 2_000_000_000, "{interval_ns}");
        assert_eq!(*wait_ns, 0, "a sleeping job never waits for a CPU");
        let p = procs.iter().find(|p| p.pid.0 == hog_pid);
        let p = p.unwrap_or_else(|| panic!("{procs:?}"));
        assert_eq!(p.comm, "sh");
        assert!(p.cmdline.contains("while :; do :; done"), "{p:?}");
        assert!(p.cpu_ns > 50_000_000, "{p:?}");
    }

    /// Watched threads past [`WATCH_PER_TICK`] are looked at in turn: a
    /// busy loop (always running or runnable) listed 40 times is seen 32
    /// times a tick, every listing once in 5 ticks of 8.
    #[test]
    fn watched_threads_are_looked_at_a_bounded_few_a_tick() {
        let (tx, _rx) = std::sync::mpsc::sync_channel(16);
        let sink = crate::record::Sink::from_parts(tx, Default::default());
        let mut c = OthersCollector::new(sink);
        let mut hog = spawn("while :; do :; done");
        let pid = hog.id() as i32;
        // In its loop (past its start, when it may sleep on a page).
        while TaskStat::read(pid).map_or(true, |s| s.utime < 2) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let w = Watched {
            busy: vec![pid; 40],
            ..Default::default()
        };
        c.watch.insert(pid, w);
        c.look_at_watched();
        let first = c.watch[&pid].seen;
        for _ in 0..4 {
            c.look_at_watched();
        }
        let _ = hog.kill();
        let _ = hog.wait();
        assert_eq!(first, WATCH_PER_TICK as u32);
        assert_eq!(c.watch[&pid].seen, 5 * WATCH_PER_TICK as u32);
        assert_eq!(c.watch_turn, 0, "5 turns of 32 are 4 rounds of 40");
    }

    /// A job that waits for its CPU (a busy loop sharing it with another)
    /// has the other processes read every second.
    #[test]
    fn a_job_waiting_for_a_cpu_has_the_others_read_every_second() {
        let (tx, rx) = std::sync::mpsc::sync_channel(16);
        let sink = crate::record::Sink::from_parts(tx, Default::default());
        let mut c = OthersCollector::new(sink);
        let mut hog = spawn("while :; do :; done");
        let mut job = spawn("while :; do :; done");
        pin_together(&[hog.id(), job.id()]);
        let job_pids = [job.id() as i32];
        c.own = -1;
        c.tick(&job_pids);
        std::thread::sleep(Duration::from_millis(1100));
        c.tick(&job_pids);
        let _ = hog.kill();
        let _ = hog.wait();
        let _ = job.kill();
        let _ = job.wait();
        let evs: Vec<Event> = rx.try_iter().collect();
        let got = other_cpu(&evs);
        let [(interval_ns, wait_ns, procs)] = got.as_slice() else {
            panic!("{evs:?}");
        };
        // Sharing one CPU, the job waits about half of the time.
        assert!(*wait_ns * 5 > *interval_ns, "{wait_ns} of {interval_ns}");
        assert!(
            procs.iter().any(|p| p.pid.0 == hog.id() as i32),
            "{procs:?}"
        );
    }
}
