//! In-process agents: small shared objects (`src/agent/*.c`, built by
//! `build.rs` and embedded in this binary) that gpuprof places inside the
//! job's processes through the job's environment, for what can only be
//! seen from inside a process at the instant it happens.
//!
//! At record time [`AgentDir::create`] makes a folder (mode 0711: others
//! may open the agents by name, not list or change anything) on a
//! filesystem that allows executable mappings and writes the agents into
//! it, readable by every user: a job that switches user (`su`, `gosu`,
//! `setpriv`, a container entrypoint) still starts its processes with the
//! agent in `LD_PRELOAD`, and a file that user cannot read makes the
//! dynamic loader print an error into the job's stderr. Such a process
//! cannot write into gpuprof's private ring folder, so it runs without
//! the agent (the report lists it); the session names them in the job's environment and removes
//! the folder when gpuprof exits. The folder must outlive the recording
//! window as long as the job runs: a preload path that vanished makes the
//! dynamic loader print an error in every process the job starts later.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

include!(concat!(env!("OUT_DIR"), "/agents.rs"));

/// The embedded shared object of agent `name` (the stem of its C file).
pub fn embedded(name: &str) -> Option<&'static [u8]> {
    EMBEDDED.iter().find(|(n, _)| *n == name).map(|(_, b)| *b)
}

/// The runtime folder's mode: see the module's note.
const DIR_MODE: u32 = 0o711;

/// A runtime folder for the agents and their shared memory; removed
/// (with everything in it) on drop.
#[derive(Debug)]
pub struct AgentDir {
    path: PathBuf,
    _held: Option<Held>,
}

/// A shared lock on one of gpuprof's runtime folders, held as long as this
/// gpuprof lives: the kernel drops it when gpuprof dies, however it dies,
/// so [`remove_stale`] can tell a live gpuprof's folder from a killed one's
/// even where that gpuprof's PID cannot be seen (another PID namespace
/// sharing the folder).
#[derive(Debug)]
pub(crate) struct Held(#[allow(dead_code)] std::fs::File);

/// Hold `dir` (see [`Held`]); `None` where locks are not supported.
pub(crate) fn hold(dir: &Path) -> Option<Held> {
    use std::os::fd::AsRawFd;
    // Opened close-on-exec: the job does not inherit it.
    let f = std::fs::File::open(dir).ok()?;
    // SAFETY: flock on a descriptor we own.
    (unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0).then_some(Held(f))
}

/// Whether a live gpuprof holds `dir` (or it cannot be checked).
fn held_elsewhere(dir: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(dir) else {
        return true;
    };
    // SAFETY: flock on a descriptor we own; released when `f` closes.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}

impl AgentDir {
    /// Create the folder in the first of `$XDG_RUNTIME_DIR`, `$TMPDIR` (or
    /// `/tmp`) and `/dev/shm` that is writable and not mounted `noexec`.
    pub fn create() -> std::io::Result<AgentDir> {
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
            candidates.push(d.into());
        }
        candidates.push(std::env::temp_dir());
        candidates.push("/dev/shm".into());
        let mut last_err = None;
        for base in candidates {
            if !base.is_dir() || noexec(&base) {
                continue;
            }
            remove_stale(&base, agent_dir_owner);
            for attempt in 0..16u32 {
                let path = base.join(format!(
                    "gpuprof-{}-{:08x}",
                    std::process::id(),
                    nonce(attempt)
                ));
                match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                    Ok(()) => {
                        // Set, not asked of the umask (077 would keep it 0700).
                        use std::os::unix::fs::PermissionsExt;
                        if let Err(e) = std::fs::set_permissions(
                            &path,
                            std::fs::Permissions::from_mode(DIR_MODE),
                        ) {
                            let _ = std::fs::remove_dir(&path);
                            last_err = Some(e);
                            break;
                        }
                        let held = hold(&path);
                        return Ok(AgentDir { path, _held: held });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => {
                        last_err = Some(e);
                        break;
                    }
                }
            }
        }
        Err(last_err.unwrap_or_else(|| {
            std::io::Error::other(
                "no writable folder that allows executable mappings ($XDG_RUNTIME_DIR, $TMPDIR, /dev/shm)",
            )
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write agent `name` into the folder (read and execute for everyone,
    /// see the module's note) and return its path.
    pub fn install(&self, name: &str) -> std::io::Result<PathBuf> {
        let bytes = embedded(name).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no agent named {name} is built into this gpuprof"),
            )
        })?;
        let path = self.path.join(format!("libgpuprof_{name}.so"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o500)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?;
        f.write_all(bytes)?;
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o555))?;
        Ok(path)
    }
}

impl Drop for AgentDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The gpuprof PID in the name of an agent folder, `gpuprof-<pid>-<8 hex>`.
fn agent_dir_owner(name: &str) -> Option<i32> {
    let mut it = name.split('-');
    let (Some("gpuprof"), Some(pid), Some(nonce), None) =
        (it.next(), it.next(), it.next(), it.next())
    else {
        return None;
    };
    let hex = nonce.len() == 8 && nonce.bytes().all(|b| b.is_ascii_hexdigit());
    pid.parse().ok().filter(|_| hex)
}

/// What gpuprof itself puts in its runtime folders: the agents, the
/// rings of the Python agent and of NVTX, and the window word.
fn made_by_gpuprof(name: &str) -> bool {
    name.starts_with("libgpuprof_")
        || name.starts_with("gpuprof-nvtx-")
        || name.ends_with(".ring")
        || name.ends_with(".inst")
        || name.ends_with(".inst.tmp")
        || name == "rings"
        || name == "window"
}

/// Remove the runtime folders in `base` that a gpuprof killed before its
/// clean-up (SIGKILL, the OOM killer: no destructor runs) left behind. On
/// tmpfs they hold memory until the machine reboots: 2 MiB per Python
/// process of the job in rings alone. A folder goes only when all of these
/// hold:
/// - `owner` finds a gpuprof PID in its name, no process has that PID (a
///   reused PID keeps it, to be removed by a later run), and no gpuprof
///   holds it ([`Held`]);
/// - it belongs to this user, mode 0700, and holds nothing but what
///   gpuprof writes there (nested folders too);
/// - no live process maps a file in it: a job that outlived its gpuprof
///   still uses its agents, and a preload path that vanished would make the
///   dynamic loader complain in every process it starts.
pub(crate) fn remove_stale(base: &Path, owner: fn(&str) -> Option<i32>) {
    use std::os::unix::fs::MetadataExt;
    let uid = nix::unistd::getuid().as_raw();
    let Ok(rd) = std::fs::read_dir(base) else {
        return;
    };
    let stale: Vec<PathBuf> = rd
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let Some(pid) = name.to_str().and_then(owner) else {
                return false;
            };
            let ours = e.metadata().is_ok_and(|m| {
                m.is_dir() && m.uid() == uid && matches!(m.mode() & 0o777, 0o700 | DIR_MODE)
            });
            ours && pid > 0
                && !Path::new(&format!("/proc/{pid}")).exists()
                && only_ours(&e.path(), 2)
        })
        .map(|e| e.path())
        .collect();
    if stale.is_empty() {
        return;
    }
    let mapped = mapped_files();
    for dir in stale {
        if !mapped.iter().any(|m| m.starts_with(&dir)) && !held_elsewhere(&dir) {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// Whether `dir` holds only what gpuprof writes, `depth` levels down.
fn only_ours(dir: &Path, depth: u32) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    rd.flatten().all(|e| {
        let name = e.file_name();
        let Some(name) = name.to_str().filter(|n| made_by_gpuprof(n)) else {
            return false;
        };
        match e.file_type() {
            Ok(t) if t.is_dir() => depth > 0 && only_ours(&e.path(), depth - 1),
            Ok(t) => t.is_file() && !name.is_empty(),
            Err(_) => false,
        }
    })
}

/// The files mapped by any process this user can see, under a `gpuprof-`
/// folder (read only when there is a stale folder to remove).
fn mapped_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        if !e
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let Ok(maps) = std::fs::read_to_string(e.path().join("maps")) else {
            continue;
        };
        for line in maps.lines().filter(|l| l.contains("/gpuprof-")) {
            // The path is the sixth field, and may hold spaces.
            if let Some(i) = line.find(" /") {
                let p = line[i + 1..].trim_end_matches(" (deleted)");
                out.push(PathBuf::from(p));
            }
        }
    }
    out
}

fn noexec(dir: &Path) -> bool {
    nix::sys::statvfs::statvfs(dir)
        .map(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_NOEXEC))
        .unwrap_or(true)
}

fn nonce(attempt: u32) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    t ^ attempt.wrapping_mul(0x9e37_79b9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_folder_is_closed_to_others_and_removed_on_drop() {
        use std::os::unix::fs::PermissionsExt;
        let d = AgentDir::create().expect("agent folder");
        let p = d.path().to_path_buf();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        // Others may open a file by name, never list or write.
        assert_eq!(mode, 0o711);
        assert!(!noexec(&p));
        assert!(d.install("no-such-agent").is_err());
        drop(d);
        assert!(!p.exists());
    }

    /// Folders of a killed gpuprof go; a live one's, one still mapped by a
    /// job, one holding a user's file and look-alike names stay.
    #[test]
    fn runtime_folders_of_a_killed_gpuprof_are_removed() {
        use std::io::Write;
        let base = std::env::temp_dir().join(format!("gpuprof-sweep-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let mk = |n: &str, files: &[&str]| {
            let p = base.join(n);
            std::fs::DirBuilder::new().mode(0o700).create(&p).unwrap();
            for f in files {
                if let Some(sub) = f.strip_suffix('/') {
                    std::fs::DirBuilder::new()
                        .mode(0o700)
                        .create(p.join(sub))
                        .unwrap();
                } else {
                    std::fs::File::create(p.join(f))
                        .unwrap()
                        .write_all(b"x")
                        .unwrap();
                }
            }
            p
        };
        // A PID that no process has: a child that has been reaped.
        let mut c = std::process::Command::new("true").spawn().unwrap();
        c.wait().unwrap();
        let dead = c.id();
        let me = std::process::id();
        let gone = [
            mk(
                &format!("gpuprof-{dead}-0badcafe"),
                &[
                    "libgpuprof_pystacks.so",
                    "rings/",
                    "rings/1-ab.ring",
                    "rings/window",
                ],
            ),
            mk(
                &format!("gpuprof-{dead}-rings-0badcafe"),
                &["12-ab.ring", "window"],
            ),
            mk(
                &format!("gpuprof-nvtx-{dead}-0badcafe"),
                &["r-1-00ab-1.ring", "i-1-00ab.inst"],
            ),
        ];
        let kept = [
            mk(&format!("gpuprof-{me}-0badcafe"), &["libgpuprof_nvtx.so"]),
            mk(
                &format!("gpuprof-{dead}-0badcaf1"),
                &["libgpuprof_nvtx.so", "notes.txt"],
            ),
            // An output folder of a host named with digits.
            mk(&format!("gpuprof-{dead}-20261202-065700"), &["report.json"]),
        ];
        let mapped = mk(&format!("gpuprof-{dead}-0badcaf2"), &["libgpuprof_nvtx.so"]);
        // Held: a live gpuprof whose PID is not seen here.
        let held = mk(&format!("gpuprof-{dead}-0badcaf3"), &["libgpuprof_nvtx.so"]);
        let lock = hold(&held).expect("flock on a folder");
        let f = std::fs::File::open(mapped.join("libgpuprof_nvtx.so")).unwrap();
        // SAFETY: a private read-only mapping of a file we just wrote.
        let m = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                1,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        assert_ne!(m, libc::MAP_FAILED);
        remove_stale(&base, agent_dir_owner);
        remove_stale(&base, crate::collect::perf::pyagent::ring_dir_owner);
        remove_stale(&base, crate::collect::nvtx::nvtx_dir_owner);
        for p in &gone {
            assert!(!p.exists(), "{} stayed", p.display());
        }
        for p in kept.iter().chain([&mapped, &held]) {
            assert!(p.exists(), "{} went", p.display());
        }
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(m, 1) };
        drop(lock);
        remove_stale(&base, agent_dir_owner);
        assert!(!mapped.exists(), "unmapped, it goes");
        assert!(!held.exists(), "released, it goes");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
