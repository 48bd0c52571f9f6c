//! Gated launch of the job: fork, hold the child on a pipe until the caller
//! has attached what must see the job from its first instruction (perf
//! events opened with `enable_on_exec`), then let it exec.
//!
//! `std::process::Command` cannot do this: `spawn()` waits for the exec to
//! succeed, so a gate read in `pre_exec` would deadlock.

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, pipe2, ForkResult};

use crate::event::Pid;

/// Why the job could not be started. Exit codes follow the shell: 127 for a
/// command that is not there, 126 for one that cannot be executed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("no command given: put the job after `--`, e.g. `gpuprof -- python train.py`")]
    Empty,
    #[error("command not found: {0} (check the spelling, or give its full path)")]
    NotFound(String),
    #[error("cannot execute {0}: {1} (check that it is an executable file: chmod +x)")]
    NotExecutable(String, String),
    #[error("cannot reach {0}: {1} (a folder on its path cannot be searched by this user: check the folders' permissions, or run gpuprof as a user who can run the job)")]
    NotReachable(String, String),
    #[error("cannot start {0}: {1}")]
    Exec(String, String),
    #[error("cannot start the job: {0}")]
    Fork(nix::Error),
}

impl LaunchError {
    pub fn exit_code(&self) -> i32 {
        match self {
            LaunchError::NotFound(_) | LaunchError::Empty => 127,
            LaunchError::NotExecutable(..) | LaunchError::NotReachable(..) => 126,
            _ => 127,
        }
    }
}

/// A forked child blocked before `exec`.
pub struct Suspended {
    pub pid: Pid,
    program: String,
    gate_w: OwnedFd,
    err_r: OwnedFd,
}

/// Resolve `argv[0]` the way `execvp` would, so that a missing command is
/// reported before anything is forked.
pub fn resolve_program(name: &OsStr) -> Result<PathBuf, LaunchError> {
    let shown = name.to_string_lossy().into_owned();
    if name.is_empty() {
        return Err(LaunchError::Empty);
    }
    let check = |p: &Path| -> Option<Result<PathBuf, LaunchError>> {
        let md = match std::fs::metadata(p) {
            Ok(md) => md,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Some(Err(LaunchError::NotReachable(
                    shown.clone(),
                    "permission denied".into(),
                )));
            }
            Err(_) => return None,
        };
        if md.is_dir() {
            return Some(Err(LaunchError::NotExecutable(
                shown.clone(),
                "is a directory".into(),
            )));
        }
        // What this user may execute (root: any execute bit).
        let may_exec = nix::unistd::access(p, nix::unistd::AccessFlags::X_OK).is_ok();
        if md.permissions().mode() & 0o111 == 0 || !may_exec {
            return Some(Err(LaunchError::NotExecutable(
                shown.clone(),
                "permission denied".into(),
            )));
        }
        Some(Ok(p.to_path_buf()))
    };
    if name.as_bytes().contains(&b'/') {
        return check(Path::new(name)).unwrap_or(Err(LaunchError::NotFound(shown)));
    }
    let path =
        std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
    let mut first_err = None;
    for dir in std::env::split_paths(&path) {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        match check(&dir.join(name)) {
            Some(Ok(p)) => return Ok(p),
            // A folder of PATH this user cannot search holds nothing for
            // it (as for the shell).
            Some(Err(LaunchError::NotReachable(..))) => {}
            Some(Err(e)) if first_err.is_none() => first_err = Some(e),
            _ => {}
        }
    }
    Err(first_err.unwrap_or(LaunchError::NotFound(shown)))
}

/// Fork the job, blocked before exec. Stdio, working directory, signal mask
/// and dispositions are inherited unchanged; so is the environment, except
/// for the variables in `env`, which are set (replacing any of the same
/// name) for the job alone.
pub fn spawn_suspended(
    argv: &[OsString],
    env: &[(OsString, OsString)],
) -> Result<Suspended, LaunchError> {
    let first = argv.first().ok_or(LaunchError::Empty)?;
    let program = resolve_program(first)?;
    let shown = first.to_string_lossy().into_owned();
    // Everything the child touches is prepared before fork: after fork in a
    // multi-threaded process only async-signal-safe calls are allowed.
    let prog_c = CString::new(program.as_os_str().as_bytes())
        .map_err(|_| LaunchError::Exec(shown.clone(), "NUL byte in path".into()))?;
    let args_c: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| LaunchError::Exec(shown.clone(), "NUL byte in an argument".into()))?;
    let mut arg_ptrs: Vec<*const libc::c_char> = args_c.iter().map(|a| a.as_ptr()).collect();
    arg_ptrs.push(std::ptr::null());
    let env_c: Option<Vec<CString>> = if env.is_empty() {
        None
    } else {
        let mut vars: Vec<(OsString, OsString)> = std::env::vars_os()
            .filter(|(k, _)| !env.iter().any(|(e, _)| e == k))
            .collect();
        vars.extend(env.iter().cloned());
        Some(
            vars.iter()
                .filter_map(|(k, v)| {
                    let mut kv = k.as_bytes().to_vec();
                    kv.push(b'=');
                    kv.extend_from_slice(v.as_bytes());
                    CString::new(kv).ok()
                })
                .collect(),
        )
    };
    let env_ptrs: Option<Vec<*const libc::c_char>> = env_c.as_ref().map(|vars| {
        let mut p: Vec<*const libc::c_char> = vars.iter().map(|v| v.as_ptr()).collect();
        p.push(std::ptr::null());
        p
    });

    let (gate_r, gate_w) = pipe2(OFlag::O_CLOEXEC).map_err(LaunchError::Fork)?;
    let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC).map_err(LaunchError::Fork)?;
    let (gate_w_raw, err_r_raw) = (gate_w.as_raw_fd(), err_r.as_raw_fd());

    // SAFETY: the child only calls async-signal-safe functions (read,
    // execv/execve, write, _exit) on memory prepared before the fork.
    match unsafe { fork() }.map_err(LaunchError::Fork)? {
        ForkResult::Child => unsafe {
            // The parent's ends: while the child held the gate's write end
            // itself, the parent closing its copy (giving up on the job)
            // never reached this read, and both waited for each other.
            libc::close(gate_w_raw);
            libc::close(err_r_raw);
            let mut b = [0u8; 1];
            let n = loop {
                let n = libc::read(gate_r.as_raw_fd(), b.as_mut_ptr().cast(), 1);
                if n >= 0 || *libc::__errno_location() != libc::EINTR {
                    break n;
                }
            };
            if n != 1 {
                // The profiler gave up before releasing the job.
                libc::_exit(127);
            }
            // Rust ignores SIGPIPE in its own processes; the job must get
            // the default (as std::process::Command also restores), or a
            // `job | head` pipeline would behave differently under gpuprof.
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            match &env_ptrs {
                Some(envp) => libc::execve(prog_c.as_ptr(), arg_ptrs.as_ptr(), envp.as_ptr()),
                None => libc::execv(prog_c.as_ptr(), arg_ptrs.as_ptr()),
            };
            let errno = *libc::__errno_location();
            let bytes = errno.to_ne_bytes();
            libc::write(err_w.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
            libc::_exit(if errno == libc::ENOENT { 127 } else { 126 });
        },
        ForkResult::Parent { child } => {
            drop(gate_r);
            drop(err_w);
            Ok(Suspended {
                pid: Pid(child.as_raw()),
                program: shown,
                gate_w,
                err_r,
            })
        }
    }
}

impl Suspended {
    /// Release the child and wait until it has exec'd (or failed to).
    pub fn resume(self) -> Result<Pid, LaunchError> {
        let Suspended {
            pid,
            program,
            gate_w,
            err_r,
        } = self;
        let _ = nix::unistd::write(&gate_w, &[1u8]);
        drop(gate_w);
        let mut buf = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            match nix::unistd::read(&err_r, &mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => break,
            }
        }
        if got == 0 {
            return Ok(pid); // CLOEXEC closed the pipe: exec succeeded.
        }
        let _ = waitpid(nix::unistd::Pid::from_raw(pid.0), None);
        let errno = nix::errno::Errno::from_raw(i32::from_ne_bytes(buf));
        Err(match errno {
            nix::errno::Errno::ENOENT => LaunchError::NotFound(program),
            nix::errno::Errno::EACCES | nix::errno::Errno::ENOEXEC | nix::errno::Errno::EISDIR => {
                LaunchError::NotExecutable(program, errno.desc().to_string())
            }
            e => LaunchError::Exec(program, e.desc().to_string()),
        })
    }

    /// Give up on the job before it ran: the child exits without exec. It
    /// is killed as well, so that no path can leave it (or this wait)
    /// blocked: it has not exec'd, so nothing of the job is lost.
    pub fn abort(self) {
        let pid = nix::unistd::Pid::from_raw(self.pid.0);
        drop(self);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = waitpid(pid, None);
    }
}

/// Decode a wait status into the job's status.
pub fn job_status(ws: WaitStatus) -> Option<crate::event::JobStatus> {
    use crate::event::JobStatus;
    match ws {
        WaitStatus::Exited(_, c) => Some(JobStatus::Exited(c)),
        WaitStatus::Signaled(_, s, _) => Some(JobStatus::Signaled(s as i32)),
        _ => None,
    }
}
