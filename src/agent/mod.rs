//! In-process agents: small shared objects (`src/agent/*.c`, built by
//! `build.rs` and embedded in this binary) that gpuprof places inside the
//! job's processes through the job's environment, for what can only be
//! seen from inside a process at the instant it happens.
//!
//! At record time [`AgentDir::create`] makes a private folder (mode 0700)
//! on a filesystem that allows executable mappings and writes the agents
//! into it; the session names them in the job's environment and removes
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

/// A private runtime folder for the agents and their shared memory; removed
/// (with everything in it) on drop.
#[derive(Debug)]
pub struct AgentDir {
    path: PathBuf,
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
            for attempt in 0..16u32 {
                let path = base.join(format!(
                    "gpuprof-{}-{:08x}",
                    std::process::id(),
                    nonce(attempt)
                ));
                match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                    Ok(()) => return Ok(AgentDir { path }),
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

    /// Write agent `name` into the folder (read and execute for the owner
    /// only) and return its path.
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
        Ok(path)
    }
}

impl Drop for AgentDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
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
    fn the_folder_is_private_and_removed_on_drop() {
        use std::os::unix::fs::PermissionsExt;
        let d = AgentDir::create().expect("agent folder");
        let p = d.path().to_path_buf();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert!(!noexec(&p));
        assert!(d.install("no-such-agent").is_err());
        drop(d);
        assert!(!p.exists());
    }
}
