//! The CPU and memory limits of the cgroup the job runs in (a container's
//! `--cpus`/`--memory`, a Kubernetes pod's `resources.limits`, a Slurm
//! job's `--cpus-per-task` with the cgroup plugin, a systemd unit's
//! `CPUQuota=`), and how often the CPU limit throttled the job.
//!
//! Once a second the cgroup of every live process of the job is read from
//! `/proc/PID/cgroup`; the cgroup holding most of them is followed (a job
//! moved into a cgroup after it started is followed too), and its limits
//! are looked up; each tick the counters of the cgroup holding the
//! tightest limit are read:
//!
//! - cgroup v1 (the `cpu` controller's hierarchy): `cpu.cfs_quota_us` and
//!   `cpu.cfs_period_us` of the cgroup and each ancestor — the tightest
//!   quota limits —, and that cgroup's `cpu.stat` (`nr_periods`,
//!   `nr_throttled`, `throttled_time` in ns); `memory.limit_in_bytes` and
//!   `memory.usage_in_bytes` likewise in the `memory` hierarchy;
//! - cgroup v2: `cpu.max` (`QUOTA PERIOD` or `max PERIOD`) and `cpu.stat`
//!   (`nr_throttled`, `throttled_usec`); `memory.max` and `memory.current`.
//!
//! Paths are resolved through `/proc/self/mountinfo`, so a container with
//! its own cgroup namespace (paths relative to its root) works as well as
//! one that shows the host's paths. Nothing is emitted while no limit
//! exists.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::collect::procfs::Kept;
use crate::event::{CgroupCpu, CgroupMemory, Event, MonoNs};
use crate::record::Sink;

/// How often the job's processes' cgroups are looked up again.
const RESOLVE_PERIOD: Duration = Duration::from_secs(1);
/// At most this many processes are looked up per resolution (the cgroup
/// of a job is almost always shared by all its processes).
const MAX_PIDS: usize = 256;

/// A cgroup hierarchy as mounted: v1 with its controllers, or v2.
#[derive(Clone, Debug, PartialEq)]
struct Mount {
    /// Where it is mounted, and the path within the hierarchy of the mount's
    /// root (`/` unless a container bind-mounted its own cgroup).
    dir: PathBuf,
    root: String,
    v2: bool,
    controllers: Vec<String>,
}

/// The cgroup mounts of this machine, from `/proc/self/mountinfo` text.
fn parse_mounts(mountinfo: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 5 || r.is_empty() {
            continue;
        }
        let v2 = match r[0] {
            "cgroup2" => true,
            "cgroup" => false,
            _ => continue,
        };
        let controllers = if v2 {
            Vec::new()
        } else {
            r.get(2)
                .map(|o| o.split(',').map(str::to_string).collect())
                .unwrap_or_default()
        };
        out.push(Mount {
            dir: PathBuf::from(unescape(l[4])),
            root: unescape(l[3]),
            v2,
            controllers,
        });
    }
    out
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v as char);
                i += 4;
                continue;
            }
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

/// The cgroup of a process for one controller (v1) or the v2 hierarchy,
/// from `/proc/PID/cgroup` text: `HIER:CONTROLLERS:PATH` lines.
fn cgroup_path(text: &str, controller: Option<&str>) -> Option<String> {
    for line in text.lines() {
        let mut it = line.splitn(3, ':');
        let (_, ctl, path) = (it.next()?, it.next()?, it.next()?);
        match controller {
            Some(c) if ctl.split(',').any(|x| x == c) => return Some(path.to_string()),
            None if ctl.is_empty() => return Some(path.to_string()),
            _ => {}
        }
    }
    None
}

/// Where the files of `path` (a `/proc/PID/cgroup` path) live under `m`.
fn cgroup_dir(m: &Mount, path: &str) -> Option<PathBuf> {
    let rel = if m.root == "/" {
        path
    } else if path == m.root {
        ""
    } else {
        path.strip_prefix(&m.root)
            .filter(|r| r.starts_with('/'))
            // Inside a cgroup namespace the paths are already relative.
            .unwrap_or(path)
    };
    let dir = m.dir.join(rel.trim_start_matches('/'));
    dir.is_dir().then_some(dir)
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

fn read_u64(p: &Path) -> Option<u64> {
    read(p)?.trim().parse().ok()
}

/// `KEY VALUE` lines (cpu.stat).
fn stat(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The directories from `dir` up to the mount point, innermost first.
fn ancestors<'a>(m: &'a Mount, dir: &'a Path) -> impl Iterator<Item = &'a Path> + 'a {
    dir.ancestors().take_while(move |d| d.starts_with(&m.dir))
}

/// The path `/proc/PID/cgroup` would show for a directory of `m`.
fn shown_path(m: &Mount, dir: &Path) -> String {
    let rel = dir
        .strip_prefix(&m.dir)
        .map(|r| r.to_string_lossy().into_owned())
        .unwrap_or_default();
    let base = m.root.trim_end_matches('/');
    let p = if rel.is_empty() {
        base.to_string()
    } else {
        format!("{base}/{rel}")
    };
    if p.is_empty() {
        "/".into()
    } else {
        p
    }
}

/// The tightest CPU quota over a cgroup and its ancestors: the cgroup that
/// holds it, whose counters are the ones that move when it throttles.
#[derive(Clone, Debug, PartialEq)]
struct CpuLimit {
    v2: bool,
    dir: PathBuf,
    path: String,
    quota_us: u64,
    period_us: u64,
}

fn cpu_limit(m: &Mount, dir: &Path) -> Option<CpuLimit> {
    let mut best: Option<(f64, &Path, u64, u64)> = None;
    for d in ancestors(m, dir) {
        let (quota, period) = if m.v2 {
            let t = read(&d.join("cpu.max"))?;
            let mut f = t.split_whitespace();
            let q = f.next()?;
            let p: u64 = f.next().and_then(|p| p.parse().ok()).unwrap_or(100_000);
            match q.parse::<u64>() {
                Ok(q) => (q, p),
                Err(_) => continue,
            }
        } else {
            let q = read(&d.join("cpu.cfs_quota_us"))?;
            let q: i64 = q.trim().parse().ok()?;
            let p = read_u64(&d.join("cpu.cfs_period_us")).unwrap_or(100_000);
            if q <= 0 {
                continue;
            }
            (q as u64, p)
        };
        if period == 0 {
            continue;
        }
        let cores = quota as f64 / period as f64;
        if best.map_or(true, |b| cores < b.0) {
            best = Some((cores, d, quota, period));
        }
    }
    let (_, d, quota_us, period_us) = best?;
    Some(CpuLimit {
        v2: m.v2,
        dir: d.to_path_buf(),
        path: shown_path(m, d),
        quota_us,
        period_us,
    })
}

/// The limit with the throttling counters of its cgroup (`cpu.stat` text).
fn cpu_figures(l: &CpuLimit, cpu_stat: &str) -> CgroupCpu {
    let throttled_ns = if l.v2 {
        stat(cpu_stat, "throttled_usec").unwrap_or(0) * 1000
    } else {
        stat(cpu_stat, "throttled_time").unwrap_or(0)
    };
    CgroupCpu {
        path: l.path.clone(),
        v2: l.v2,
        quota_us: l.quota_us,
        period_us: l.period_us,
        nr_periods: stat(cpu_stat, "nr_periods").unwrap_or(0),
        nr_throttled: stat(cpu_stat, "nr_throttled").unwrap_or(0),
        throttled_ns,
    }
}

/// The tightest memory limit over a cgroup and its ancestors (below the
/// machine's memory), and the file of that cgroup's usage.
#[derive(Clone, Debug, PartialEq)]
struct MemoryLimit {
    v2: bool,
    usage_file: PathBuf,
    path: String,
    limit_bytes: u64,
}

fn memory_limit(m: &Mount, dir: &Path, mem_total: u64) -> Option<MemoryLimit> {
    let mut best: Option<(u64, &Path)> = None;
    for d in ancestors(m, dir) {
        let limit = if m.v2 {
            match read(&d.join("memory.max"))?.trim() {
                "max" => continue,
                v => v.parse().ok()?,
            }
        } else {
            read_u64(&d.join("memory.limit_in_bytes"))?
        };
        if limit >= mem_total {
            continue;
        }
        if best.map_or(true, |b| limit < b.0) {
            best = Some((limit, d));
        }
    }
    let (limit_bytes, d) = best?;
    Some(MemoryLimit {
        v2: m.v2,
        usage_file: d.join(if m.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        }),
        path: shown_path(m, d),
        limit_bytes,
    })
}

fn memory_figures(l: &MemoryLimit, usage: &str) -> CgroupMemory {
    CgroupMemory {
        path: l.path.clone(),
        v2: l.v2,
        limit_bytes: l.limit_bytes,
        usage_bytes: usage.trim().parse().unwrap_or(0),
    }
}

/// A counter file read every tick through a kept descriptor. `None` when
/// it cannot be read (a removed cgroup: the next resolution finds where
/// the job went), so that no figures are reported rather than zeros.
fn read_kept(k: &mut Kept, path: &Path, buf: &mut Vec<u8>) -> Option<String> {
    if k.read(|| path.to_string_lossy().into_owned(), buf).is_err() {
        k.close();
        return None;
    }
    Some(String::from_utf8_lossy(buf).into_owned())
}

/// The cgroup followed for one resource: the hierarchy and the directory.
#[derive(Clone, Debug, PartialEq)]
struct Followed {
    mount: Mount,
    dir: PathBuf,
}

/// Limits are looked up when the cgroups are resolved (once a second: a
/// limit changed by hand shows within that), and only the counters of the
/// cgroup that holds each limit are read every tick: reading every
/// ancestor's limit files every tick opened 9 files per tick in a
/// three-level hierarchy, for limits that almost never change.
pub struct CgroupCollector {
    sink: Sink,
    mounts: Vec<Mount>,
    mem_total: u64,
    resolved_at: Option<Instant>,
    cpu: Option<(CpuLimit, Kept)>,
    memory: Option<(MemoryLimit, Kept)>,
    last: (Option<CgroupCpu>, Option<CgroupMemory>),
    buf: Vec<u8>,
}

impl CgroupCollector {
    pub fn new(sink: Sink) -> CgroupCollector {
        let mounts = read(Path::new("/proc/self/mountinfo"))
            .map(|t| parse_mounts(&t))
            .unwrap_or_default();
        let mem_total = procfs::Current::current()
            .map(|m: procfs::Meminfo| m.mem_total)
            .unwrap_or(u64::MAX);
        CgroupCollector {
            sink,
            mounts,
            mem_total,
            resolved_at: None,
            cpu: None,
            memory: None,
            last: (None, None),
            buf: Vec::new(),
        }
    }

    /// The hierarchy holding `controller`: v1's mount of it, else v2 when
    /// it enables the controller (or is the only hierarchy).
    fn mount_for(&self, controller: &str) -> Option<&Mount> {
        self.mounts
            .iter()
            .find(|m| !m.v2 && m.controllers.iter().any(|c| c == controller))
            .or_else(|| {
                self.mounts.iter().find(|m| {
                    m.v2 && read(&m.dir.join("cgroup.controllers"))
                        .is_some_and(|c| c.split_whitespace().any(|x| x == controller))
                })
            })
    }

    /// The cgroup (directory) holding most of the processes whose
    /// `/proc/PID/cgroup` texts are `texts`, for `controller`.
    fn resolve(&self, controller: &str, texts: &[String]) -> Option<Followed> {
        let m = self.mount_for(controller)?;
        let mut count: HashMap<String, usize> = HashMap::new();
        for t in texts {
            if let Some(p) = cgroup_path(t, (!m.v2).then_some(controller)) {
                *count.entry(p).or_default() += 1;
            }
        }
        let (path, _) = count
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))?;
        Some(Followed {
            mount: m.clone(),
            dir: cgroup_dir(m, &path)?,
        })
    }

    /// One pass: `pids` are the job's live processes.
    pub fn tick(&mut self, pids: &[i32]) {
        if pids.is_empty() || self.mounts.is_empty() {
            return;
        }
        if self
            .resolved_at
            .map_or(true, |t| t.elapsed() >= RESOLVE_PERIOD)
        {
            self.resolved_at = Some(Instant::now());
            // Each process's file once for both controllers.
            let texts: Vec<String> = pids
                .iter()
                .take(MAX_PIDS)
                .filter_map(|pid| {
                    let mut buf = Vec::new();
                    crate::collect::procfs::read_once(
                        &format!("/proc/{pid}/cgroup"),
                        &mut buf,
                        true,
                    )
                    .ok()?;
                    String::from_utf8(buf).ok()
                })
                .collect();
            let cpu = self
                .resolve("cpu", &texts)
                .and_then(|f| cpu_limit(&f.mount, &f.dir));
            if cpu.as_ref() != self.cpu.as_ref().map(|c| &c.0) {
                self.cpu = cpu.map(|l| (l, Kept::default()));
            }
            let memory = self
                .resolve("memory", &texts)
                .and_then(|f| memory_limit(&f.mount, &f.dir, self.mem_total));
            if memory.as_ref() != self.memory.as_ref().map(|m| &m.0) {
                self.memory = memory.map(|l| (l, Kept::default()));
            }
        }
        let buf = &mut self.buf;
        let cpu = self.cpu.as_mut().and_then(|(l, k)| {
            let st = read_kept(k, &l.dir.join("cpu.stat"), buf)?;
            Some(cpu_figures(l, &st))
        });
        let memory = self.memory.as_mut().and_then(|(l, k)| {
            let usage = read_kept(k, &l.usage_file, buf)?;
            Some(memory_figures(l, &usage))
        });
        let now = (cpu, memory);
        if now != self.last && (now.0.is_some() || now.1.is_some()) {
            self.sink.send(Event::Cgroup {
                t: MonoNs::now(),
                cpu: now.0.clone(),
                memory: now.1.clone(),
            });
        }
        self.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
35 24 0:30 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
36 35 0:31 / /sys/fs/cgroup/cpu rw,relatime shared:5 - cgroup cgroup rw,cpu
37 35 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
38 35 0:33 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
39 24 0:34 / /mnt/with\\040space rw - ext4 /dev/sda1 rw";

    #[test]
    fn mounts_and_paths() {
        let m = parse_mounts(MOUNTINFO);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].controllers, vec!["rw", "cpu"]);
        assert!(!m[0].v2 && m[2].v2);
        assert_eq!(m[1].root, "/docker/abc");
        assert_eq!(unescape("/mnt/with\\040space"), "/mnt/with space");
        let cg = "12:memory:/docker/abc\n4:cpu,cpuacct:/job/7\n0::/user.slice\n";
        assert_eq!(cgroup_path(cg, Some("cpu")).as_deref(), Some("/job/7"));
        assert_eq!(
            cgroup_path(cg, Some("memory")).as_deref(),
            Some("/docker/abc")
        );
        assert_eq!(cgroup_path(cg, None).as_deref(), Some("/user.slice"));
        assert_eq!(cgroup_path(cg, Some("blkio")), None);
        assert_eq!(
            stat("nr_periods 32\nnr_throttled 31\n", "nr_throttled"),
            Some(31)
        );
    }

    fn read_cpu(m: &Mount, dir: &Path) -> Option<CgroupCpu> {
        let l = cpu_limit(m, dir)?;
        Some(cpu_figures(
            &l,
            &read_kept(
                &mut Kept::default(),
                &l.dir.join("cpu.stat"),
                &mut Vec::new(),
            )?,
        ))
    }

    fn read_memory(m: &Mount, dir: &Path, mem_total: u64) -> Option<CgroupMemory> {
        let l = memory_limit(m, dir, mem_total)?;
        Some(memory_figures(
            &l,
            &read_kept(&mut Kept::default(), &l.usage_file, &mut Vec::new())?,
        ))
    }

    #[test]
    fn the_tightest_quota_of_the_chain_with_its_counters() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let job = root.join("pod/job");
        std::fs::create_dir_all(&job).unwrap();
        for (d, q) in [
            (root.to_path_buf(), "-1"),
            (root.join("pod"), "40000"),
            (job.clone(), "80000"),
        ] {
            std::fs::write(d.join("cpu.cfs_quota_us"), q).unwrap();
            std::fs::write(d.join("cpu.cfs_period_us"), "100000").unwrap();
        }
        std::fs::write(
            root.join("pod/cpu.stat"),
            "nr_periods 32\nnr_throttled 31\nthrottled_time 2500000000\n",
        )
        .unwrap();
        let m = Mount {
            dir: root.to_path_buf(),
            root: "/".into(),
            v2: false,
            controllers: vec!["cpu".into()],
        };
        let c = read_cpu(&m, &job).unwrap();
        assert_eq!((c.quota_us, c.period_us), (40000, 100000));
        assert_eq!((c.nr_periods, c.nr_throttled), (32, 31));
        assert_eq!(c.throttled_ns, 2_500_000_000);
        assert_eq!(c.path, "/pod");
        // v2: cpu.max, throttled_usec; "max" means no limit.
        std::fs::write(job.join("cpu.max"), "50000 100000\n").unwrap();
        std::fs::write(root.join("pod/cpu.max"), "max 100000\n").unwrap();
        std::fs::write(root.join("cpu.max"), "max 100000\n").unwrap();
        std::fs::write(
            job.join("cpu.stat"),
            "usage_usec 9\nnr_periods 5\nnr_throttled 2\nthrottled_usec 1500\n",
        )
        .unwrap();
        let m2 = Mount { v2: true, ..m };
        let c = read_cpu(&m2, &job).unwrap();
        assert_eq!(
            (c.quota_us, c.nr_throttled, c.throttled_ns),
            (50000, 2, 1_500_000)
        );
        assert_eq!(c.path, "/pod/job");
        // Memory: a limit below the machine's memory.
        std::fs::write(job.join("memory.max"), "1073741824\n").unwrap();
        std::fs::write(job.join("memory.current"), "5000\n").unwrap();
        std::fs::write(root.join("pod/memory.max"), "max\n").unwrap();
        std::fs::write(root.join("memory.max"), "max\n").unwrap();
        let mm = read_memory(&m2, &job, 16 << 30).unwrap();
        assert_eq!((mm.limit_bytes, mm.usage_bytes), (1 << 30, 5000));
        // A counter that cannot be read (the cgroup was removed) gives no
        // figures, not zeros.
        let l = memory_limit(&m2, &job, 16 << 30).unwrap();
        let mut kept = Kept::default();
        assert!(read_kept(&mut kept, &l.usage_file, &mut Vec::new()).is_some());
        std::fs::remove_file(&l.usage_file).unwrap();
        assert!(read_kept(&mut Kept::default(), &l.usage_file, &mut Vec::new()).is_none());
        assert!(read_memory(&m2, &job, 1 << 29).is_none());
    }
}
