//! The job's process tree and per-process / per-thread figures from /proc.
//!
//! Discovery walks `/proc/PID/task/TID/children` from gpuprof's own
//! children. gpuprof is a child subreaper, so descendants whose parent
//! exited are reparented to it and stay reachable; every process of the
//! tree is therefore found without scanning all of /proc.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use procfs::process::Process;

use crate::collect::{NewsMark, TreeNews};
use crate::event::{Event, MonoNs, Pid, Tid};
use crate::record::Sink;

/// Passes during which a process's command line is re-read to catch an exec
/// that keeps the process name (2 s at the default interval).
const YOUNG_PASSES: u32 = 20;
/// With the perf reader's news of new processes, the tree is walked when
/// there is news, and this often without (a process perf does not follow);
/// between walks the known processes are read.
const REWALK_EVERY: Duration = Duration::from_secs(1);
/// Most `/proc` files kept open between passes (see [`Kept`]), and at most
/// a quarter of the open-files limit: the rest are opened on each pass.
const KEPT_MAX: usize = 1024;

struct ThreadState {
    stat: Kept,
    /// Seen in the last pass.
    alive: bool,
    comm: String,
    user: u64,
    sys: u64,
    state: char,
    cpu: i32,
}

struct ProcState {
    start_ticks: u64,
    comm: String,
    cmdline: Vec<String>,
    /// Passes this process has been seen in (saturating).
    seen: u32,
    exited: bool,
    stat: Kept,
    io: Kept,
    threads: HashMap<i32, ThreadState>,
    last: [u64; 8],
}

/// A `/proc` file read again on every pass through a descriptor kept open:
/// a read at offset 0 makes the kernel generate it afresh, and it saves the
/// path lookup, open and close of each pass (`openat` alone was 18% of the
/// /proc sampler's samples in a profile, with a stat file per thread every
/// 100 ms). A kept descriptor
/// stays tied to the task it was opened for: once that task is reaped the
/// read fails (ESRCH) even if its PID is reused.
#[derive(Default)]
pub(crate) struct Kept(Option<File>);

/// Descriptors kept open by every [`Kept`], against [`kept_limit`].
static KEPT_OPEN: AtomicUsize = AtomicUsize::new(0);

/// [`KEPT_MAX`], or a quarter of the open-files limit if lower: the job
/// does not share it (gpuprof's limit is its own), but perf events, the
/// agents' rings and the outputs need descriptors too.
fn kept_limit() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_or(1024, |(soft, _)| soft);
        KEPT_MAX.min(usize::try_from(soft / 4).unwrap_or(KEPT_MAX))
    })
}

impl Kept {
    /// A single-record file (one `show` per read, as `/proc/PID/stat`,
    /// `/proc/PID/io`, `/proc/stat`, `/proc/pressure/*` and cgroup
    /// counters are) into `buf`: the kernel generates the whole text and
    /// copies as much as asked, so a read shorter than asked is all of it
    /// and the read at the end, which returns nothing, is skipped (half
    /// the /proc sampler's `pread` calls). Opens `path()` when not kept,
    /// and keeps the descriptor while fewer than [`kept_limit`] are.
    pub(crate) fn read(
        &mut self,
        path: impl FnOnce() -> String,
        buf: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        self.read_with(path, buf, true)
    }

    /// A file of many records (`/proc/diskstats`): a short read may end at
    /// a record that did not fit the kernel's buffer, so read until the end.
    pub(crate) fn read_all(
        &mut self,
        path: impl FnOnce() -> String,
        buf: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        self.read_with(path, buf, false)
    }

    fn read_with(
        &mut self,
        path: impl FnOnce() -> String,
        buf: &mut Vec<u8>,
        single: bool,
    ) -> std::io::Result<()> {
        buf.clear();
        let mut opened = None;
        let f = match &self.0 {
            Some(f) => f,
            None => {
                let p = path();
                match File::open(&p) {
                    Ok(f) => &*opened.insert(f),
                    Err(e) => {
                        crate::collect::loss::note(&e, &p);
                        return Err(e);
                    }
                }
            }
        };
        read_into(f, buf, single)?;
        if opened.is_some() && KEPT_OPEN.load(Ordering::Relaxed) < kept_limit() {
            KEPT_OPEN.fetch_add(1, Ordering::Relaxed);
            self.0 = opened;
        }
        Ok(())
    }

    pub(crate) fn close(&mut self) {
        if self.0.take().is_some() {
            KEPT_OPEN.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Read `f` from its start into `buf` (cleared first), 4 KiB at a time: to
/// the end, or for a single-record file (`single`) to the first short read.
fn read_into(f: &File, buf: &mut Vec<u8>, single: bool) -> std::io::Result<()> {
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        let n = f.read_at(&mut chunk, buf.len() as u64)?;
        buf.extend_from_slice(&chunk[..n]);
        if n == 0 || single && n < chunk.len() {
            return Ok(());
        }
    }
}

/// A small `/proc` file read once into `buf`, its descriptor not kept:
/// open, one read (a single-record file, `single`, as [`Kept::read`]; to
/// the end otherwise), close. `std::fs::read` first asks the file's size,
/// which /proc gives as 0, then reads from 32 bytes up, doubling: six
/// calls for one `stat` file, eight with the open and close. The scans
/// of every process of the machine and of the job's threads once a
/// second were three quarters of the /proc sampler's system calls.
pub(crate) fn read_once(path: &str, buf: &mut Vec<u8>, single: bool) -> std::io::Result<()> {
    read_into(&File::open(path)?, buf, single)
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.close();
    }
}

/// Samples the job's process tree. Owned by the sampling thread; the reaper
/// calls [`TreeCollector::final_sample`] on a zombie before reaping it, so
/// the CPU and IO totals of the job's direct children are exact.
pub struct TreeCollector {
    sink: Sink,
    self_pid: i32,
    /// `gpuprof attach`: the running process whose tree is recorded (it is
    /// not gpuprof's child). `None`: gpuprof's own children.
    root: Option<i32>,
    ns_per_tick: u64,
    page_size: u64,
    procs: HashMap<i32, ProcState>,
    /// When the tree was last walked, and the news counter then.
    last_walk: NewsMark,
    /// Reused for every file read.
    buf: Vec<u8>,
}

impl TreeCollector {
    pub fn new(sink: Sink) -> TreeCollector {
        let tps = procfs::ticks_per_second().max(1);
        TreeCollector {
            sink,
            self_pid: std::process::id() as i32,
            root: None,
            ns_per_tick: 1_000_000_000 / tps,
            page_size: procfs::page_size(),
            procs: HashMap::new(),
            last_walk: NewsMark::default(),
            buf: Vec::with_capacity(4096),
        }
    }

    /// Record the tree of a running process instead of gpuprof's children.
    pub fn with_root(sink: Sink, root: Pid) -> TreeCollector {
        TreeCollector {
            root: Some(root.0),
            ..TreeCollector::new(sink)
        }
    }

    /// Every live process below gpuprof (the job and reparented orphans), or
    /// the attached root and every process below it.
    fn discover(&self) -> Vec<i32> {
        let mut seen = HashSet::new();
        let mut order = Vec::new();
        let mut stack = match self.root {
            Some(r) if std::path::Path::new(&format!("/proc/{r}")).exists() => vec![r],
            Some(_) => Vec::new(),
            None => children_of(self.self_pid),
        };
        while let Some(pid) = stack.pop() {
            if !seen.insert(pid) {
                continue;
            }
            order.push(pid);
            stack.extend(children_of(pid));
        }
        order
    }

    /// One sampling pass over the tree. With `news` (perf follows the
    /// job), the tree is walked only when a process was created or exec'd
    /// since the last walk, or `REWALK_EVERY` has passed: walking reads a
    /// `children` file per thread of every process, a third of a pass.
    pub fn tick(&mut self, news: Option<&TreeNews>) {
        let now = MonoNs::now();
        // Read before walking: a fork during the walk moves it again.
        let count = news.map(|n| n.processes());
        let mut live_set: HashSet<i32> = HashSet::new();
        if self.last_walk.due(count, Instant::now(), REWALK_EVERY) {
            self.last_walk.set(count, Instant::now());
            let live = self.discover();
            for pid in live {
                self.sample(pid, now, true, true);
                live_set.insert(pid);
            }
        } else {
            for pid in self.live_pids() {
                // Gone, or its PID already reused by a process that is not
                // the job's: exited.
                if self.sample(pid, now, true, false) {
                    live_set.insert(pid);
                }
            }
        }
        for (pid, st) in self.procs.iter_mut() {
            if !st.exited && !live_set.contains(pid) {
                st.exited = true;
                st.close_files();
                self.sink.send_blocking(Event::ProcessExit {
                    t: now,
                    pid: Pid(*pid),
                    status: None,
                });
            }
        }
        // Forget processes long gone so the map stays bounded; the
        // recording keeps their history.
        if self.procs.len() > 4096 {
            self.procs.retain(|_, st| !st.exited);
        }
    }

    /// PIDs of the job's processes alive at the last pass.
    pub fn live_pids(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self
            .procs
            .iter()
            .filter(|(_, st)| !st.exited)
            .map(|(pid, _)| *pid)
            .collect();
        v.sort_unstable();
        v
    }

    /// Read the last figures of a process that has exited but is not yet
    /// reaped (its /proc entry still holds the final CPU and IO totals).
    pub fn final_sample(&mut self, pid: i32) {
        let now = MonoNs::now();
        self.sample(pid, now, false, true);
    }

    /// Mark a process reaped by gpuprof with its exit status.
    pub fn reaped(&mut self, pid: i32, status: Option<crate::event::JobStatus>) {
        let now = MonoNs::now();
        if let Some(st) = self.procs.get_mut(&pid) {
            st.exited = true;
            st.close_files();
        }
        self.sink.send_blocking(Event::ProcessExit {
            t: now,
            pid: Pid(pid),
            status,
        });
    }

    /// Read a process (and its threads); `adopt`: a process not known by
    /// this PID is new to the job (it was found in the tree), else it is
    /// left alone. Whether it was read.
    fn sample(&mut self, pid: i32, now: MonoNs, with_threads: bool, adopt: bool) -> bool {
        let mut buf = std::mem::take(&mut self.buf);
        let read = self.sample_with(pid, now, with_threads, adopt, &mut buf);
        self.buf = buf;
        read
    }

    fn sample_with(
        &mut self,
        pid: i32,
        now: MonoNs,
        with_threads: bool,
        adopt: bool,
        buf: &mut Vec<u8>,
    ) -> bool {
        let Some((stat, mut fresh)) = self.read_stat(pid, adopt, buf) else {
            return false;
        };
        let known = self.procs.get(&pid);
        let is_new = match known {
            None => true,
            // Same PID, different start time: the PID was reused.
            Some(st) => st.start_ticks != stat.starttime || st.exited && stat.state != 'Z',
        };
        if is_new && !adopt {
            return false;
        }
        // An exec usually renames the process; a wrapper that keeps the name
        // (pyenv's `python3` shim is a bash script named python3) does not,
        // so young processes also have their command line compared.
        let young = known.is_some_and(|st| st.seen < YOUNG_PASSES);
        let mut cmdline = None;
        let mut execed = known.is_some_and(|st| !is_new && st.comm != stat.comm);
        if !is_new && !execed && young {
            let now_cmd = Process::new(pid)
                .and_then(|p| p.cmdline())
                .unwrap_or_default();
            execed = known.is_some_and(|st| !now_cmd.is_empty() && st.cmdline != now_cmd);
            cmdline = Some(now_cmd);
        }
        if is_new || execed {
            self.announce(pid, now, &stat, cmdline, is_new, &mut fresh);
        }
        let st = self.procs.get_mut(&pid).expect("inserted above");
        if st.stat.0.is_none() {
            st.stat = fresh;
        }
        st.comm = stat.comm.clone();
        st.seen = st.seen.saturating_add(1);
        let (sink, ns_per_tick) = (&self.sink, self.ns_per_tick);
        st.sample(sink, pid, now, &stat, ns_per_tick, self.page_size, buf);
        if with_threads {
            st.sample_threads(sink, pid, now, stat.num_threads, ns_per_tick, buf);
        }
        true
    }

    /// The stat of `pid`, through the kept descriptor of the process known
    /// by this PID; if that process is gone, the PID may now be another's:
    /// with `adopt`, it is opened afresh (returned with the stat, to be
    /// kept if the process is).
    fn read_stat(&mut self, pid: i32, adopt: bool, buf: &mut Vec<u8>) -> Option<(TaskStat, Kept)> {
        let stat_path = || format!("/proc/{pid}/stat");
        let mut fresh = Kept::default();
        let mut from_kept = false;
        if let Some(st) = self.procs.get_mut(&pid).filter(|st| !st.exited) {
            from_kept = st.stat.read(stat_path, buf).is_ok();
            if !from_kept {
                st.close_files();
            }
        }
        if !from_kept && (!adopt || fresh.read(stat_path, buf).is_err()) {
            return None;
        }
        let stat = TaskStat::parse(buf)?;
        Some((stat, fresh))
    }

    /// A process new to the job, or one that exec'd: its `process` event,
    /// and (new) its state, keeping `fresh`, the stat file it was read from.
    fn announce(
        &mut self,
        pid: i32,
        now: MonoNs,
        stat: &TaskStat,
        cmdline: Option<Vec<String>>,
        is_new: bool,
        fresh: &mut Kept,
    ) {
        let p = Process::new(pid).ok();
        let cmdline = cmdline.unwrap_or_else(|| {
            p.as_ref()
                .and_then(|p| p.cmdline().ok())
                .unwrap_or_default()
        });
        let exe = p
            .as_ref()
            .and_then(|p| p.exe().ok())
            .map(|p| p.to_string_lossy().into_owned());
        // The PID was reused between two passes: the recording says that
        // the process that had it ended, before naming the new one.
        if is_new && self.procs.get(&pid).is_some_and(|st| !st.exited) {
            self.sink.send_blocking(Event::ProcessExit {
                t: now,
                pid: Pid(pid),
                status: None,
            });
        }
        self.sink.send_blocking(Event::Process {
            t: now,
            pid: Pid(pid),
            ppid: Pid(stat.ppid),
            start_boot_ns: stat.starttime * self.ns_per_tick,
            comm: stat.comm.clone(),
            cmdline: cmdline.clone(),
            exe,
            rank_env: read_rank_env(pid),
        });
        if !is_new {
            if let Some(st) = self.procs.get_mut(&pid) {
                st.cmdline = cmdline;
            }
            return;
        }
        // The state of the process that had this PID goes, its files too.
        self.procs.insert(
            pid,
            ProcState {
                start_ticks: stat.starttime,
                comm: stat.comm.clone(),
                cmdline,
                seen: 0,
                exited: false,
                stat: std::mem::take(fresh),
                io: Kept::default(),
                threads: HashMap::new(),
                last: [u64::MAX; 8],
            },
        );
    }
}

impl ProcState {
    /// The process's CPU, memory and IO figures, sent when they changed.
    #[allow(clippy::too_many_arguments)]
    fn sample(
        &mut self,
        sink: &Sink,
        pid: i32,
        now: MonoNs,
        stat: &TaskStat,
        ns_per_tick: u64,
        page_size: u64,
        buf: &mut Vec<u8>,
    ) {
        let io = self
            .io
            .read(|| format!("/proc/{pid}/io"), buf)
            .ok()
            .and_then(|()| parse_io(buf));
        let rss = stat.rss * page_size;
        let (rb, wb, rc, wc) = io.unwrap_or_default();
        let vals = [
            stat.utime,
            stat.stime,
            rss,
            rb,
            wb,
            rc,
            wc,
            stat.num_threads as u64,
        ];
        if vals == self.last {
            return;
        }
        self.last = vals;
        sink.send(Event::ProcessSample {
            t: now,
            pid: Pid(pid),
            user_ns: stat.utime * ns_per_tick,
            sys_ns: stat.stime * ns_per_tick,
            rss_bytes: rss,
            read_bytes: rb,
            write_bytes: wb,
            rchar: rc,
            wchar: wc,
            threads: stat.num_threads as u32,
        });
    }

    /// Each thread's name (when it changed) and CPU time (when it moved).
    fn sample_threads(
        &mut self,
        sink: &Sink,
        pid: i32,
        now: MonoNs,
        num_threads: i64,
        ns_per_tick: u64,
        buf: &mut Vec<u8>,
    ) {
        for (tid, ts) in self.thread_stats(pid, num_threads, buf) {
            let th = self.threads.get_mut(&tid).expect("read above");
            if th.comm != ts.comm {
                th.comm = ts.comm.clone();
                sink.send_blocking(Event::Thread {
                    t: now,
                    pid: Pid(pid),
                    tid: Tid(tid),
                    comm: ts.comm.clone(),
                });
            }
            let cpu = ts.processor.unwrap_or(-1);
            if th.user != ts.utime || th.sys != ts.stime || th.state != ts.state {
                th.user = ts.utime;
                th.sys = ts.stime;
                th.state = ts.state;
                th.cpu = cpu;
                sink.send(Event::ThreadCpu {
                    t: now,
                    pid: Pid(pid),
                    tid: Tid(tid),
                    user_ns: ts.utime * ns_per_tick,
                    sys_ns: ts.stime * ns_per_tick,
                    state: ts.state,
                    cpu,
                });
            }
        }
    }

    fn close_files(&mut self) {
        self.stat.close();
        self.io.close();
        self.threads.clear();
    }

    /// The stat of each of the process's threads. The thread list is read
    /// again only when it may have changed: the process has another number
    /// of threads than those known, or a known one is gone (its kept
    /// descriptor fails once it is reaped, even if its TID is reused).
    /// Threads that are gone are forgotten.
    fn thread_stats(
        &mut self,
        pid: i32,
        num_threads: i64,
        buf: &mut Vec<u8>,
    ) -> Vec<(i32, TaskStat)> {
        let mut out = Vec::with_capacity(self.threads.len());
        if self.threads.len() as i64 == num_threads {
            for (&tid, th) in self.threads.iter_mut() {
                let path = || format!("/proc/{pid}/task/{tid}/stat");
                match th.stat.read(path, buf) {
                    Ok(()) => match TaskStat::parse(buf) {
                        Some(ts) => out.push((tid, ts)),
                        None => break,
                    },
                    Err(_) => break,
                }
            }
            if out.len() == self.threads.len() {
                return out;
            }
            out.clear();
        }
        let rd = match std::fs::read_dir(format!("/proc/{pid}/task")) {
            Ok(rd) => rd,
            Err(e) => {
                crate::collect::loss::note(&e, "the threads of a process");
                return out;
            }
        };
        for th in self.threads.values_mut() {
            th.alive = false;
        }
        for ent in rd.flatten() {
            let Some(tid) = ent.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            let th = self.threads.entry(tid).or_insert_with(|| ThreadState {
                stat: Kept::default(),
                alive: false,
                comm: String::new(),
                user: u64::MAX,
                sys: 0,
                state: '?',
                cpu: -1,
            });
            let path = || format!("/proc/{pid}/task/{tid}/stat");
            let mut read = th.stat.read(path, buf);
            if read.is_err() && th.stat.0.is_some() {
                // A kept descriptor of a thread gone, its TID reused.
                th.stat.close();
                read = th.stat.read(path, buf);
            }
            if let Some(ts) = read.ok().and_then(|()| TaskStat::parse(buf)) {
                th.alive = true;
                out.push((tid, ts));
            }
        }
        self.threads.retain(|_, th| th.alive);
        out
    }
}

/// Largest environment read from `/proc/PID/environ` (the kernel's own
/// limit on arguments plus environment is of this order).
const MAX_ENVIRON_BYTES: u64 = 4 << 20;

/// The rank variables ([`crate::event::RANK_ENV_KEYS`]) of a process's
/// environment as it was at exec. The rest of the environment is parsed in
/// memory and dropped, never recorded. None when it cannot be read (the
/// process exited, or reading another user's process was refused).
pub fn read_rank_env(pid: i32) -> Option<crate::event::RankEnv> {
    use std::io::Read;
    let f = std::fs::File::open(format!("/proc/{pid}/environ")).ok()?;
    let mut buf = Vec::new();
    f.take(MAX_ENVIRON_BYTES).read_to_end(&mut buf).ok()?;
    // A zombie (or a process mid-exec) shows an empty environment: unknown,
    // not "no rank".
    if buf.is_empty() {
        return None;
    }
    Some(crate::event::rank_env_from(buf.split(|b| *b == 0)))
}

/// Children of every thread of `pid` (needs CONFIG_PROC_CHILDREN, present
/// on every mainstream kernel).
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let what = "the job's process tree";
    let rd = match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(rd) => rd,
        Err(e) => {
            crate::collect::loss::note(&e, what);
            return out;
        }
    };
    let mut buf = Vec::new();
    for ent in rd.flatten() {
        let Some(tid) = ent.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        match read_once(&format!("/proc/{pid}/task/{tid}/children"), &mut buf, false) {
            Ok(()) => out.extend(pids_in(&buf)),
            Err(e) => {
                crate::collect::loss::note(&e, what);
            }
        }
    }
    out
}

/// The PIDs of a `children` file (numbers separated by spaces).
pub(crate) fn pids_in(buf: &[u8]) -> impl Iterator<Item = i32> + '_ {
    buf.split(u8::is_ascii_whitespace)
        .filter_map(|x| std::str::from_utf8(x).ok()?.parse().ok())
}

/// When a task with this `starttime` (clock ticks since boot, on
/// CLOCK_BOOTTIME) started, on CLOCK_MONOTONIC.
pub(crate) fn start_mono(starttime: u64) -> MonoNs {
    let tps = procfs::ticks_per_second().max(1);
    MonoNs((starttime * (1_000_000_000 / tps)).saturating_sub(MonoNs::boottime_offset()))
}

/// The fields of a `/proc/PID/stat` or `/proc/PID/task/TID/stat` line that
/// the sampler uses. Parsed here rather than with procfs's `Stat`, which
/// reads all 52 fields into a struct: at 10 Hz for each of the job's
/// threads, that parse was 11% of this thread's samples in a profile of a
/// loader job (and procfs's `Io`, which builds a map of its lines, 3.5%).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TaskStat {
    pub comm: String,
    pub state: char,
    pub ppid: i32,
    pub utime: u64,
    pub stime: u64,
    pub num_threads: i64,
    pub starttime: u64,
    /// Pages.
    pub rss: u64,
    /// The CPU it last ran on (field 39; absent before Linux 2.2.8).
    pub processor: Option<i32>,
}

impl TaskStat {
    /// The stat of `pid`, read afresh.
    pub(crate) fn read(pid: i32) -> Option<TaskStat> {
        let mut buf = Vec::with_capacity(512);
        read_once(&format!("/proc/{pid}/stat"), &mut buf, true).ok()?;
        TaskStat::parse(&buf)
    }

    pub(crate) fn parse(buf: &[u8]) -> Option<TaskStat> {
        // The name lies between the first '(' and the last ')': it may hold
        // either, and spaces.
        let open = buf.iter().position(|&b| b == b'(')?;
        let close = buf.iter().rposition(|&b| b == b')')?;
        let comm = String::from_utf8_lossy(buf.get(open + 1..close)?).into_owned();
        let rest = std::str::from_utf8(buf.get(close + 1..)?).ok()?;
        let mut f = rest.split_ascii_whitespace();
        let state = f.next()?.chars().next()?;
        // Each `nth(k)` skips k fields and takes the next (fields numbered
        // as in proc(5): state is 3).
        let ppid = f.next()?.parse().ok()?; // 4
        let utime = f.nth(9)?.parse().ok()?; // 14
        let stime = f.next()?.parse().ok()?; // 15
        let num_threads = f.nth(4)?.parse().ok()?; // 20
        let starttime = f.nth(1)?.parse().ok()?; // 22
        let rss = f.nth(1)?.parse().ok()?; // 24
        let processor = f.nth(14).and_then(|x| x.parse().ok()); // 39
        Some(TaskStat {
            comm,
            state,
            ppid,
            utime,
            stime,
            num_threads,
            starttime,
            rss,
            processor,
        })
    }
}

/// `/proc/PID/io`: (read_bytes, write_bytes, rchar, wchar); None when a
/// field is missing (the file is empty for a task that cannot be read).
fn parse_io(buf: &[u8]) -> Option<(u64, u64, u64, u64)> {
    let text = std::str::from_utf8(buf).ok()?;
    let (mut rb, mut wb, mut rc, mut wc) = (None, None, None, None);
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let slot = match k {
            "read_bytes" => &mut rb,
            "write_bytes" => &mut wb,
            "rchar" => &mut rc,
            "wchar" => &mut wc,
            _ => continue,
        };
        *slot = v.trim().parse().ok();
    }
    Some((rb?, wb?, rc?, wc?))
}

#[cfg(test)]
mod tests {
    use super::{parse_io, Kept, TaskStat};
    use procfs::{FromBufRead, FromRead};

    /// The light parsers agree with procfs's full ones on live files, and
    /// a name with parentheses and spaces does not shift the fields.
    #[test]
    fn stat_and_io_parse_as_procfs_does() {
        // std names the thread before it runs the closure.
        let (named, is_named) = std::sync::mpsc::channel();
        let (done, finish) = std::sync::mpsc::channel::<()>();
        let busy = std::thread::Builder::new()
            .name("x) (y z".into())
            .spawn(move || {
                named.send(()).unwrap();
                finish.recv().ok();
            })
            .unwrap();
        is_named.recv().unwrap();
        let mut files = vec!["/proc/self/stat".to_string()];
        for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            files.push(format!("{}/stat", t.path().display()));
        }
        let mut names = Vec::new();
        for f in files {
            let Ok(buf) = std::fs::read(&f) else {
                continue; // a thread of the test harness gone meanwhile
            };
            let ours = TaskStat::parse(&buf).unwrap_or_else(|| panic!("{f}: not parsed"));
            let theirs = procfs::process::Stat::from_read(&buf[..]).unwrap();
            assert_eq!(
                (
                    ours.comm.as_str(),
                    ours.state,
                    ours.ppid,
                    ours.utime,
                    ours.stime
                ),
                (
                    theirs.comm.as_str(),
                    theirs.state,
                    theirs.ppid,
                    theirs.utime,
                    theirs.stime
                ),
                "{f}"
            );
            assert_eq!(
                (ours.num_threads, ours.starttime, ours.rss, ours.processor),
                (
                    theirs.num_threads,
                    theirs.starttime,
                    theirs.rss,
                    theirs.processor
                ),
                "{f}"
            );
            names.push(ours.comm);
        }
        assert!(names.iter().any(|n| n == "x) (y z"), "{names:?}");
        drop(done);
        busy.join().unwrap();
        let line = b"42 (a) b) R 1 42 42 0 -1 4194304 10 0 0 0 7 3 0 0 20 0 2 0 555 100 9 1 1 1 1 1 1 1 1 1 1 1 1 1 17 1 0 0 0 0 0";
        let t = TaskStat::parse(line).unwrap();
        assert_eq!(
            (
                t.comm.as_str(),
                t.state,
                t.ppid,
                t.utime,
                t.stime,
                t.num_threads
            ),
            ("a) b", 'R', 1, 7, 3, 2)
        );
        assert_eq!((t.starttime, t.rss, t.processor), (555, 9, Some(1)));
        assert_eq!(TaskStat::parse(b"42 (cut"), None);
        assert_eq!(TaskStat::parse(b"42 (x) R 1 2"), None);

        let io = std::fs::read("/proc/self/io").unwrap();
        let theirs = procfs::process::Io::from_buf_read(&io[..]).unwrap();
        let ours = parse_io(&io).unwrap();
        assert_eq!(
            ours,
            (
                theirs.read_bytes,
                theirs.write_bytes,
                theirs.rchar,
                theirs.wchar
            )
        );
        assert_eq!(parse_io(b""), None);
    }

    #[test]
    fn kept_files_read_whole_whatever_their_size() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0usize, 1, 4095, 4096, 4097, 8192, 10_000] {
            let p = dir.path().join(format!("f{len}"));
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            std::fs::write(&p, &data).unwrap();
            let path = p.to_string_lossy().into_owned();
            let (mut k, mut buf) = (Kept::default(), Vec::new());
            k.read(|| path.clone(), &mut buf).unwrap();
            assert_eq!(buf, data, "single-record read of {len} bytes");
            // Kept open: read again at offset 0, not appended.
            k.read(|| unreachable!("kept"), &mut buf).unwrap();
            assert_eq!(buf.len(), len);
            let mut k = Kept::default();
            k.read_all(|| path.clone(), &mut buf).unwrap();
            assert_eq!(buf, data, "read to the end, {len} bytes");
        }
        // A /proc file generated afresh on each read through one descriptor.
        let (mut k, mut buf) = (Kept::default(), Vec::new());
        k.read(|| "/proc/self/stat".into(), &mut buf).unwrap();
        let text = String::from_utf8(buf.clone()).unwrap();
        assert!(text.starts_with(&format!("{} (", std::process::id())) && text.ends_with('\n'));
        k.read(|| unreachable!("kept"), &mut buf).unwrap();
        assert!(buf.ends_with(b"\n"));
    }
}
