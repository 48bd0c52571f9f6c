//! The job's process tree and per-process / per-thread figures from /proc.
//!
//! Discovery walks `/proc/PID/task/TID/children` from gpuprof's own
//! children. gpuprof is a child subreaper, so descendants whose parent
//! exited are reparented to it and stay reachable; every process of the
//! tree is therefore found without scanning all of /proc.

use std::collections::{HashMap, HashSet};
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

struct ThreadState {
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
    threads: HashMap<i32, ThreadState>,
    last: [u64; 8],
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
        let Ok(proc_) = Process::new(pid) else {
            return false;
        };
        let Ok(stat) = proc_.stat() else {
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
            let now_cmd = proc_.cmdline().unwrap_or_default();
            execed = known.is_some_and(|st| !now_cmd.is_empty() && st.cmdline != now_cmd);
            cmdline = Some(now_cmd);
        }
        if is_new || execed {
            let cmdline = cmdline.unwrap_or_else(|| proc_.cmdline().unwrap_or_default());
            let exe = proc_.exe().ok().map(|p| p.to_string_lossy().into_owned());
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
            if let Some(st) = self.procs.get_mut(&pid).filter(|_| !is_new) {
                st.cmdline = cmdline.clone();
            }
            if is_new {
                self.procs.insert(
                    pid,
                    ProcState {
                        start_ticks: stat.starttime,
                        comm: stat.comm.clone(),
                        cmdline: cmdline.clone(),
                        seen: 0,
                        exited: false,
                        threads: HashMap::new(),
                        last: [u64::MAX; 8],
                    },
                );
            }
        }
        let ns_per_tick = self.ns_per_tick;
        let page_size = self.page_size;
        let st = self.procs.get_mut(&pid).expect("inserted above");
        st.comm = stat.comm.clone();
        st.seen = st.seen.saturating_add(1);

        let io = proc_.io().ok();
        let rss = stat.rss * page_size;
        let (rb, wb, rc, wc) = io
            .map(|io| (io.read_bytes, io.write_bytes, io.rchar, io.wchar))
            .unwrap_or_default();
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
        if vals != st.last {
            st.last = vals;
            self.sink.send(Event::ProcessSample {
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
        if !with_threads {
            return true;
        }
        let Ok(tasks) = proc_.tasks() else {
            return true;
        };
        for task in tasks.flatten() {
            let Ok(ts) = task.stat() else { continue };
            let tid = task.tid;
            let th = st.threads.entry(tid).or_insert_with(|| ThreadState {
                comm: String::new(),
                user: u64::MAX,
                sys: 0,
                state: '?',
                cpu: -1,
            });
            if th.comm != ts.comm {
                th.comm = ts.comm.clone();
                self.sink.send_blocking(Event::Thread {
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
                self.sink.send(Event::ThreadCpu {
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
        true
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
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for ent in rd.flatten() {
        let mut p = ent.path();
        p.push("children");
        if let Ok(s) = std::fs::read_to_string(&p) {
            out.extend(s.split_whitespace().filter_map(|x| x.parse::<i32>().ok()));
        }
    }
    out
}
