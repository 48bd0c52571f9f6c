//! The output folder, opened once and written only through its file
//! descriptor.
//!
//! Why: an output folder may be writable by someone else (created by
//! another user, or a shared folder). Opening `DIR/name` by path with
//! create+truncate follows whatever symlink that user planted there, and a
//! gpuprof running as root would overwrite the file it points at. So every
//! file is created relative to the folder's descriptor (`openat`) with
//! `O_CREAT | O_EXCL | O_NOFOLLOW` under a private temporary name and then
//! renamed over the final name (`renameat` replaces a symlink, it never
//! writes through it). Renaming the folder, or swapping a path component,
//! after it was opened changes nothing: the descriptor still names the
//! folder that was checked.
//!
//! Running as root, a folder owned by another user is refused, and so is a
//! symlink owned by another user as the folder itself (what the kernel's
//! `fs.protected_symlinks` does for sticky folders).

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::{fstat, fstatat, mkdirat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// Why an output folder cannot be used; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum OutDirError {
    #[error("output path {0} exists and is not a folder: choose another with -o DIR")]
    NotAFolder(PathBuf),
    #[error("output folder {path} is a symlink owned by {owner}: gpuprof does not follow another user's symlink; choose another folder with -o DIR")]
    ForeignSymlink { path: PathBuf, owner: String },
    #[error("output folder {path} belongs to {owner}: gpuprof running as root does not write into another user's folder (a symlink planted there could redirect its writes); choose a folder owned by root with -o DIR, or run gpuprof as that user")]
    ForeignFolder { path: PathBuf, owner: String },
    #[error("output folder {0} changed while gpuprof was opening it: try again, or choose another with -o DIR")]
    Changed(PathBuf),
    #[error("cannot create output folder {0}: {1} (choose another with -o DIR)")]
    Create(PathBuf, io::Error),
    #[error("cannot open output folder {0}: {1} (choose another with -o DIR)")]
    Open(PathBuf, io::Error),
}

/// An output folder opened for writing.
#[derive(Debug)]
pub struct OutDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// Temporary names are unique per process and call, so concurrent writers
/// (a session and a `gpuprof report`, or two reports) never share one.
static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);
const TEMP_SUFFIX: &str = ".gpuprof-tmp";

fn errno_io(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// "uid 65534 (nobody)", for messages.
pub fn describe_uid(uid: u32) -> String {
    let name = std::fs::read_to_string("/etc/passwd").ok().and_then(|p| {
        p.lines().find_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            f.next()?;
            (f.next()?.parse::<u32>().ok()? == uid).then(|| name.to_string())
        })
    });
    match name {
        Some(n) => format!("uid {uid} ({n})"),
        None => format!("uid {uid}"),
    }
}

impl OutDir {
    /// Open `path` as an output folder, creating it (and missing parents)
    /// when `create` is set. Returns the folder and whether it was created.
    pub fn open(path: &Path, create: bool) -> Result<(OutDir, bool), OutDirError> {
        let euid = unsafe { libc::geteuid() };
        let mut created = false;
        let lst = match std::fs::symlink_metadata(path) {
            Ok(md) => Some(md),
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| OutDirError::Create(path.to_path_buf(), e))?;
                }
                match std::fs::create_dir(path) {
                    Ok(()) => created = true,
                    // Created meanwhile by someone else: checked below.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(OutDirError::Create(path.to_path_buf(), e)),
                }
                Some(
                    std::fs::symlink_metadata(path)
                        .map_err(|e| OutDirError::Open(path.to_path_buf(), e))?,
                )
            }
            Err(e) => return Err(OutDirError::Open(path.to_path_buf(), e)),
        };
        let lst = lst.expect("metadata present");
        let is_link = lst.file_type().is_symlink();
        if is_link && lst.uid() != euid && lst.uid() != 0 {
            return Err(OutDirError::ForeignSymlink {
                path: path.to_path_buf(),
                owner: describe_uid(lst.uid()),
            });
        }
        if !is_link && !lst.is_dir() {
            return Err(OutDirError::NotAFolder(path.to_path_buf()));
        }
        let mut flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        if !is_link {
            flags |= OFlag::O_NOFOLLOW;
        }
        let fd = nix::fcntl::open(path, flags, Mode::empty()).map_err(|e| match e {
            nix::Error::ENOTDIR => OutDirError::NotAFolder(path.to_path_buf()),
            nix::Error::ELOOP => OutDirError::Changed(path.to_path_buf()),
            e => OutDirError::Open(path.to_path_buf(), errno_io(e)),
        })?;
        let st = fstat(&fd).map_err(|e| OutDirError::Open(path.to_path_buf(), errno_io(e)))?;
        if !is_link && (st.st_dev != lst.dev() || st.st_ino != lst.ino()) {
            return Err(OutDirError::Changed(path.to_path_buf()));
        }
        if euid == 0 && st.st_uid != 0 {
            return Err(OutDirError::ForeignFolder {
                path: path.to_path_buf(),
                owner: describe_uid(st.st_uid),
            });
        }
        Ok((
            OutDir {
                fd,
                path: path.to_path_buf(),
            },
            created,
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The same folder through a second descriptor.
    pub fn try_clone(&self) -> io::Result<OutDir> {
        Ok(OutDir {
            fd: self.fd.try_clone()?,
            path: self.path.clone(),
        })
    }

    /// `name` inside the folder, for messages.
    pub fn display(&self, name: &str) -> String {
        self.path.join(name).display().to_string()
    }

    /// Whether an entry `name` exists (a symlink counts, it is not followed).
    pub fn exists(&self, name: &str) -> bool {
        fstatat(&self.fd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
    }

    /// Create a new file; fails if anything, a symlink included, is there.
    pub fn create_new(&self, name: &str) -> io::Result<File> {
        let fd = openat(
            &self.fd,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o666),
        )
        .map_err(errno_io)?;
        Ok(File::from(fd))
    }

    /// Open an existing regular file for reading, not through a symlink.
    pub fn open_read(&self, name: &str) -> io::Result<File> {
        let fd = openat(
            &self.fd,
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno_io)?;
        Ok(File::from(fd))
    }

    /// Create the sub-folder `name` (it must not exist) and open it.
    pub fn create_subdir(&self, name: &str) -> io::Result<OutDir> {
        mkdirat(&self.fd, name, Mode::from_bits_truncate(0o777)).map_err(errno_io)?;
        self.open_subdir(name)
    }

    /// Open the existing sub-folder `name`, not through a symlink.
    pub fn open_subdir(&self, name: &str) -> io::Result<OutDir> {
        let fd = openat(
            &self.fd,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno_io)?;
        Ok(OutDir {
            fd,
            path: self.path.join(name),
        })
    }

    /// Remove the sub-folder `name` if it is empty.
    pub fn remove_empty_subdir(&self, name: &str) -> io::Result<()> {
        unlinkat(&self.fd, name, UnlinkatFlags::RemoveDir).map_err(errno_io)
    }

    /// Remove the entry `name` (a file or a symlink, never what it points at).
    pub fn remove(&self, name: &str) -> io::Result<()> {
        unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir).map_err(errno_io)
    }

    /// Create a private temporary for `name`: `.NAME.PID-SEQ.gpuprof-tmp`.
    fn create_temp(&self, name: &str) -> io::Result<(String, File)> {
        let pid = std::process::id();
        let mut last = None;
        for _ in 0..64 {
            let seq = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
            let tmp = format!(".{name}.{pid}-{seq}{TEMP_SUFFIX}");
            match self.create_new(&tmp) {
                Ok(f) => return Ok((tmp, f)),
                // Planted by someone: take another name.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no free temporary name")))
    }

    /// Write `name` through a private temporary, synced, then renamed over
    /// `name`; a reader never sees a half-written file, and on failure the
    /// temporary is removed and `name` is left as it was. Returns the size.
    pub fn write_atomic(
        &self,
        name: &str,
        f: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>,
    ) -> io::Result<u64> {
        let tmp = self.write_temp(name, f)?;
        self.commit(tmp)
    }

    /// Write the temporary of `name` (see [`OutDir::write_atomic`]) without
    /// renaming it yet.
    pub fn write_temp(
        &self,
        name: &str,
        f: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>,
    ) -> io::Result<Temp> {
        let (tmp, file) = self.create_temp(name)?;
        let result = (|| {
            let mut w = BufWriter::with_capacity(1 << 16, file);
            f(&mut w)?;
            w.flush()?;
            let file = w.into_inner().map_err(|e| e.into_error())?;
            // Errors of a full or failing disk (NFS, quota) may only show here.
            file.sync_all()?;
            file.metadata().map(|m| m.len())
        })();
        match result {
            Ok(len) => Ok(Temp {
                tmp,
                name: name.to_string(),
                len,
            }),
            Err(e) => {
                let _ = self.remove(&tmp);
                Err(e)
            }
        }
    }

    /// Rename a written temporary over its final name.
    pub fn commit(&self, t: Temp) -> io::Result<u64> {
        match renameat(&self.fd, t.tmp.as_str(), &self.fd, t.name.as_str()) {
            Ok(()) => Ok(t.len),
            Err(e) => {
                let _ = self.remove(&t.tmp);
                Err(errno_io(e))
            }
        }
    }

    /// Drop a written temporary.
    pub fn discard(&self, t: Temp) {
        let _ = self.remove(&t.tmp);
    }

    /// Remove temporaries left by gpuprof processes that no longer exist
    /// (killed while writing). Returns how many were removed.
    pub fn remove_stale_temps(&self) -> usize {
        let Ok(rd) = std::fs::read_dir(format!("/proc/self/fd/{}", self.fd.as_raw_fd())) else {
            return 0;
        };
        let mut n = 0;
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(pid) = temp_owner(&name) else {
                continue;
            };
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                if let Some(s) = name.to_str() {
                    if self.remove(s).is_ok() {
                        n += 1;
                    }
                }
            }
        }
        n
    }

    /// Hold an exclusive lock on the folder (`flock`) until the guard drops:
    /// outputs are renamed into place under it, so that a session and a
    /// concurrent `gpuprof report` never interleave their final writes.
    pub fn lock(&self) -> io::Result<DirLock> {
        let fd = self.fd.try_clone()?;
        loop {
            // SAFETY: flock on a valid descriptor.
            if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(DirLock { fd });
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The pid in a temporary's name `.NAME.PID-SEQ.gpuprof-tmp`.
fn temp_owner(name: &OsStr) -> Option<u32> {
    let s = std::str::from_utf8(name.as_bytes()).ok()?;
    let stem = s.strip_suffix(TEMP_SUFFIX)?;
    let (_, tail) = stem.rsplit_once('.')?;
    tail.split_once('-')?.0.parse().ok()
}

/// A written, synced temporary waiting to be renamed into place.
#[derive(Debug)]
pub struct Temp {
    tmp: String,
    name: String,
    pub len: u64,
}

impl Temp {
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Space set aside in the output folder while recording, released just
/// before the outputs are written: if the job (or anything else) fills the
/// disk, `report.json` and `summary.md` still fit. Released when dropped.
#[derive(Debug)]
pub struct Reserve {
    dir: OutDir,
    name: String,
}

/// Size of [`Reserve`]: several times a large report.json.
const RESERVE_BYTES: i64 = 4 << 20;

impl Reserve {
    pub fn create(out: &OutDir) -> io::Result<Reserve> {
        let name = format!(".reserve.{}-0{TEMP_SUFFIX}", std::process::id());
        let f = out.create_new(&name)?;
        let reserve = Reserve {
            dir: out.try_clone()?,
            name,
        };
        // SAFETY: fallocate on a valid descriptor.
        let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, RESERVE_BYTES) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            let unsupported = matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
            );
            // Filesystems without fallocate: write the space instead.
            let written = unsupported
                && (|| -> io::Result<()> {
                    let mut w = BufWriter::new(&f);
                    let zero = vec![0u8; 1 << 16];
                    for _ in 0..(RESERVE_BYTES as usize / zero.len()) {
                        w.write_all(&zero)?;
                    }
                    w.flush()?;
                    f.sync_all()
                })()
                .is_ok();
            if !written {
                return Err(e);
            }
        }
        Ok(reserve)
    }
}

impl Drop for Reserve {
    fn drop(&mut self) {
        let _ = self.dir.remove(&self.name);
    }
}

/// See [`OutDir::lock`].
pub struct DirLock {
    fd: OwnedFd,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // SAFETY: unlock on a valid descriptor (closing it would too).
        unsafe {
            libc::flock(self.fd.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_replace_a_symlink_instead_of_following_it() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let out = d.path().join("out");
        std::fs::create_dir(&out).unwrap();
        std::os::unix::fs::symlink(&victim, out.join("report.json")).unwrap();
        let (dir, created) = OutDir::open(&out, true).unwrap();
        assert!(!created);
        dir.write_atomic("report.json", |w| w.write_all(b"{}"))
            .unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(
            std::fs::read_to_string(out.join("report.json")).unwrap(),
            "{}"
        );
        assert!(!std::fs::symlink_metadata(out.join("report.json"))
            .unwrap()
            .file_type()
            .is_symlink());
        // create_new never follows either.
        std::os::unix::fs::symlink(&victim, out.join("x")).unwrap();
        assert!(dir.create_new("x").is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    }

    #[test]
    fn failed_writes_leave_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        let (dir, created) = OutDir::open(&d.path().join("a/b"), true).unwrap();
        assert!(created);
        let e = dir
            .write_atomic("t.json", |_| Err(io::Error::other("boom")))
            .unwrap_err();
        assert_eq!(e.to_string(), "boom");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn temp_names_carry_the_writer_pid() {
        assert_eq!(
            temp_owner(OsStr::new(".trace.json.123-4.gpuprof-tmp")),
            Some(123)
        );
        assert_eq!(temp_owner(OsStr::new("trace.json")), None);
    }
}
