//! What the job's processes load and read: the shared objects they map
//! (`/proc/PID/maps`: which framework build, which CUDA runtime) and the
//! regular files they hold open (`/proc/PID/fd`: which filesystem the data
//! comes from), plus, once at the start, the mounted filesystems with the
//! block device behind each and whether it is a spinning disk.
//!
//! Bounded by construction: maps are read when a process is first seen,
//! then every second for its first ten seconds (frameworks load CUDA
//! lazily) and every ten seconds after that; open files twice a second
//! while new ones turn up, down to every two seconds when none do.
//! Only what is new is recorded, with caps per process and per device, so
//! a job opening millions of small files costs a fixed amount.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::time::{Duration, Instant};

use crate::collect::{NewsMark, TreeNews};
use crate::event::{Event, MonoNs, MountInfo, OpenFile, Pid};
use crate::record::Sink;
use crate::vocab::files::is_shared_object;

/// Libraries recorded per process at most.
const MAX_LIBS_PER_PROCESS: usize = 4096;
/// Open files recorded per process and filesystem at most: enough to tell
/// a dataset from a few stray files.
const MAX_FILES_PER_DEVICE: u32 = 64;
/// File descriptors inspected per process per pass.
const MAX_FDS_PER_PASS: usize = 1024;
/// Mounts recorded at most (container hosts can have thousands).
const MAX_MOUNTS: usize = 512;

/// Open files are listed this often while passes find new ones; after a
/// pass that finds none the period doubles, up to `FILES_QUIET_EVERY`. A
/// listing reads the link of every descriptor (a worker's queues are a
/// dozen pipes): twice a second for every process, that was an eighth of
/// the /proc sampler's work on a loader job that opens no files.
const FILES_EVERY: Duration = Duration::from_millis(500);
const FILES_QUIET_EVERY: Duration = Duration::from_secs(2);
const MAPS_EARLY_EVERY: Duration = Duration::from_secs(1);
const MAPS_EARLY_FOR: Duration = Duration::from_secs(10);
const MAPS_LATE_EVERY: Duration = Duration::from_secs(10);

/// Kernel pseudo filesystems: never where training data lives.
const PSEUDO_FS: &[&str] = &[
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devpts",
    "mqueue",
    "debugfs",
    "tracefs",
    "securityfs",
    "pstore",
    "bpf",
    "configfs",
    "fusectl",
    "hugetlbfs",
    "autofs",
    "binfmt_misc",
    "rpc_pipefs",
    "nsfs",
    "efivarfs",
    "selinuxfs",
];

struct ProcFiles {
    born: Instant,
    next_maps: Instant,
    /// When `/proc/PID/maps` was last read, and the perf reader's count of
    /// new mappings then.
    last_maps: NewsMark,
    next_files: Instant,
    files_every: Duration,
    libs: HashSet<String>,
    files: HashSet<String>,
    per_dev: HashMap<String, u32>,
}

pub struct FilesCollector {
    sink: Sink,
    procs: HashMap<i32, ProcFiles>,
}

impl FilesCollector {
    /// Records the mount table right away.
    pub fn new(sink: Sink) -> FilesCollector {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")
            .map(|s| parse_mountinfo(&s))
            .unwrap_or_default();
        sink.send_blocking(Event::Mounts {
            t: MonoNs::now(),
            mounts,
        });
        FilesCollector {
            sink,
            procs: HashMap::new(),
        }
    }

    /// One pass over the live processes of the job. With `news` (perf
    /// follows the job), a process's maps are re-read only after a new
    /// executable mapping somewhere in the job, or every `MAPS_LATE_EVERY`:
    /// reading the maps of a process with hundreds of mappings every second
    /// was a fifth of this thread's work.
    pub fn tick(&mut self, live: &[i32], news: Option<&TreeNews>) {
        let now = Instant::now();
        // Read before the maps are: a library loaded meanwhile moves it again.
        let count = news.map(|n| n.mappings());
        let live_set: HashSet<i32> = live.iter().copied().collect();
        self.procs.retain(|pid, _| live_set.contains(pid));
        for &pid in live {
            let st = self.procs.entry(pid).or_insert_with(|| ProcFiles {
                born: now,
                next_maps: now,
                last_maps: NewsMark::default(),
                next_files: now,
                files_every: FILES_EVERY,
                libs: HashSet::new(),
                files: HashSet::new(),
                per_dev: HashMap::new(),
            });
            if now >= st.next_maps && st.last_maps.due(count, now, MAPS_LATE_EVERY) {
                let every = if now.duration_since(st.born) < MAPS_EARLY_FOR {
                    MAPS_EARLY_EVERY
                } else {
                    MAPS_LATE_EVERY
                };
                st.next_maps = now + every;
                st.last_maps.set(count, now);
                let added = new_libraries(pid, &mut st.libs);
                if !added.is_empty() {
                    self.sink.send(Event::Libraries {
                        t: MonoNs::now(),
                        pid: Pid(pid),
                        added,
                    });
                }
            }
            if now >= st.next_files {
                let files = new_open_files(pid, st);
                st.files_every = if files.is_empty() {
                    (st.files_every * 2).min(FILES_QUIET_EVERY)
                } else {
                    FILES_EVERY
                };
                st.next_files = now + st.files_every;
                if !files.is_empty() {
                    self.sink.send(Event::OpenFiles {
                        t: MonoNs::now(),
                        pid: Pid(pid),
                        files,
                    });
                }
            }
        }
    }
}

/// Shared objects in `/proc/PID/maps` not seen before for this process.
fn new_libraries(pid: i32, seen: &mut HashSet<String>) -> Vec<String> {
    let Ok(bytes) = std::fs::read(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let mut added = Vec::new();
    for path in text.lines().filter_map(maps_path) {
        if seen.len() >= MAX_LIBS_PER_PROCESS {
            break;
        }
        if is_shared_object(path) && !seen.contains(path) {
            seen.insert(path.to_string());
            added.push(path.to_string());
        }
    }
    added.sort();
    added
}

/// The path column of a `/proc/PID/maps` line (it may contain spaces).
pub fn maps_path(line: &str) -> Option<&str> {
    let mut rest = line;
    for _ in 0..5 {
        let rest2 = rest.trim_start();
        let end = rest2.find(char::is_whitespace)?;
        rest = &rest2[end..];
    }
    let p = rest.trim();
    p.starts_with('/').then_some(p)
}

fn new_open_files(pid: i32, st: &mut ProcFiles) -> Vec<OpenFile> {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for ent in rd.flatten().take(MAX_FDS_PER_PASS) {
        // stdin/stdout/stderr are the job's terminal or log files, not data.
        let Some(fd) = ent.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if fd <= 2 {
            continue;
        }
        let Ok(target) = std::fs::read_link(ent.path()) else {
            continue;
        };
        let path = target.to_string_lossy().into_owned();
        if !path.starts_with('/')
            || path.starts_with("/dev/")
            || path.starts_with("/proc/")
            || path.starts_with("/sys/")
            || st.files.contains(&path)
        {
            continue;
        }
        // Follows the link: the open file itself, even if deleted or renamed.
        let Ok(md) = std::fs::metadata(ent.path()) else {
            continue;
        };
        let ft = md.file_type();
        if !ft.is_file() || ft.is_fifo() || ft.is_socket() {
            continue;
        }
        // Executable files are programs being run, not data: a shell holds
        // the script it interprets open (pyenv's `python3` shim is one).
        if std::os::unix::fs::PermissionsExt::mode(&md.permissions()) & 0o111 != 0 {
            continue;
        }
        // Only files opened for reading only: logs and checkpoints being
        // written are not where the input comes from.
        if !opened_read_only(pid, fd) {
            continue;
        }
        let dev = dev_string(md.dev());
        let n = st.per_dev.entry(dev.clone()).or_default();
        if *n >= MAX_FILES_PER_DEVICE {
            continue;
        }
        *n += 1;
        st.files.insert(path.clone());
        out.push(OpenFile {
            path,
            dev,
            size: md.len(),
        });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Whether `/proc/PID/fdinfo/FD` shows the file open with `O_RDONLY`
/// (access mode bits of `flags:`, octal). Unknown counts as no.
fn opened_read_only(pid: i32, fd: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")) else {
        return false;
    };
    flags_read_only(&text)
}

/// The access mode of an fdinfo text is O_RDONLY.
pub fn flags_read_only(fdinfo: &str) -> bool {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        .is_some_and(|f| f & libc::O_ACCMODE as u32 == libc::O_RDONLY as u32)
}

/// `major:minor` of a `st_dev`, as `/proc/self/mountinfo` writes it.
pub fn dev_string(dev: u64) -> String {
    format!("{}:{}", libc::major(dev), libc::minor(dev))
}

/// Undo the octal escapes of mountinfo (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            let oct = &s[i + 1..i + 4];
            if let Ok(v) = u8::from_str_radix(oct, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parse `/proc/self/mountinfo` and resolve each mount's block device.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let pre: Vec<&str> = pre.split_whitespace().collect();
        let post: Vec<&str> = post.split_whitespace().collect();
        if pre.len() < 5 || post.is_empty() {
            continue;
        }
        let fs_type = post[0].to_string();
        if PSEUDO_FS.contains(&fs_type.as_str()) {
            continue;
        }
        let dev = pre[2].to_string();
        let (disk, rotational) = block_device(&dev);
        out.push(MountInfo {
            mount_point: unescape(pre[4]),
            fs_type,
            source: post.get(1).map(|s| unescape(s)).unwrap_or_default(),
            dev,
            disk,
            rotational,
        });
        if out.len() >= MAX_MOUNTS {
            break;
        }
    }
    out
}

/// The whole disk behind `major:minor` (a partition's parent) and its
/// rotational flag, from sysfs.
pub fn block_device(dev: &str) -> (Option<String>, Option<bool>) {
    let Ok(p) = std::fs::canonicalize(format!("/sys/dev/block/{dev}")) else {
        return (None, None);
    };
    let disk_path = if p.join("partition").exists() {
        match p.parent() {
            Some(parent) => parent.to_path_buf(),
            None => return (None, None),
        }
    } else {
        p
    };
    let disk = disk_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    let rotational = std::fs::read_to_string(disk_path.join("queue/rotational"))
        .ok()
        .and_then(|s| match s.trim() {
            "1" => Some(true),
            "0" => Some(false),
            _ => None,
        });
    (disk, rotational)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines() {
        assert_eq!(
            maps_path("7f0-7f1 r-xp 00000000 fd:01 1234   /usr/lib/libcudart.so.12.4.127"),
            Some("/usr/lib/libcudart.so.12.4.127")
        );
        assert_eq!(
            maps_path("7f0-7f1 r-xp 00000000 fd:01 1234   /opt/my dir/libx.so (deleted)"),
            Some("/opt/my dir/libx.so (deleted)")
        );
        assert_eq!(maps_path("7f0-7f1 rw-p 00000000 00:00 0 "), None);
        assert_eq!(maps_path("7f0-7f1 rw-p 00000000 00:00 0   [heap]"), None);
        assert!(is_shared_object("/x/libtorch_cuda.so"));
        assert!(is_shared_object("/x/libcudart.so.12"));
        assert!(is_shared_object("/x/_C.cpython-311-x86_64-linux-gnu.so"));
        assert!(!is_shared_object("/usr/bin/python3.11"));
        assert!(!is_shared_object("/data/some.sorted"));
    }

    #[test]
    fn fdinfo_access_mode() {
        assert!(flags_read_only("pos:\t0\nflags:\t0100000\nmnt_id:\t22\n"));
        assert!(!flags_read_only("pos:\t0\nflags:\t0100001\nmnt_id:\t22\n"));
        assert!(!flags_read_only("pos:\t0\nflags:\t02100002\n"));
        assert!(!flags_read_only("garbage"));
    }

    #[test]
    fn mountinfo_lines() {
        let text = "\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
23 22 0:21 / /proc rw - proc proc rw
40 22 0:45 / /mnt/my\\040data rw - nfs4 srv:/export rw,vers=4.2
bad line
";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mount_point, "/");
        assert_eq!(m[0].fs_type, "ext4");
        assert_eq!(m[0].dev, "254:1");
        assert_eq!(m[1].mount_point, "/mnt/my data");
        assert_eq!(m[1].source, "srv:/export");
    }
}
