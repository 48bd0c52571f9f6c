//! What a blocked thread's `/proc` files and memory say, for the
//! wall-clock sampler ([`super::offcpu`]) and `gpuprof dump`: its
//! `syscall` line (the call, its arguments, stack pointer and program
//! counter), its CPU time, whether the call works on a regular file, its
//! stack copied with `process_vm_readv`, and the markers that name the call
//! in a recorded stack.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use super::pyread::gather;
use crate::event::{Pid, Tid};

/// One parsed `/proc/PID/task/TID/syscall` line of a blocked thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyscallLine {
    /// -1: blocked, but not in a system call.
    pub nr: i64,
    pub args: [u64; 6],
    pub sp: u64,
    pub pc: u64,
}

/// Parse a `syscall` file: `None` for `running` or a malformed line.
pub fn parse_syscall(text: &str) -> Option<SyscallLine> {
    let mut it = text.split_ascii_whitespace();
    let nr: i64 = it.next()?.parse().ok()?;
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let rest: Vec<u64> = it.map(hex).collect::<Option<Vec<u64>>>()?;
    let (args, sp, pc) = match rest.len() {
        8 => {
            let mut a = [0; 6];
            a.copy_from_slice(&rest[..6]);
            (a, rest[6], rest[7])
        }
        // `-1 SP PC`: blocked outside a system call.
        2 if nr == -1 => ([0; 6], rest[0], rest[1]),
        _ => return None,
    };
    (sp != 0 && pc != 0).then_some(SyscallLine { nr, args, sp, pc })
}

/// A thread's `syscall` and `schedstat` files, kept open. A file of a
/// thread that has exited fails to read (its number may be reused by
/// another thread, which a new open would name).
pub(super) struct ThreadFiles {
    syscall: File,
    schedstat: File,
}

impl ThreadFiles {
    pub(super) fn open(pid: Pid, tid: Tid) -> Option<ThreadFiles> {
        let dir = format!("/proc/{}/task/{}", pid.0, tid.0);
        Some(ThreadFiles {
            syscall: File::open(format!("{dir}/syscall")).ok()?,
            schedstat: File::open(format!("{dir}/schedstat")).ok()?,
        })
    }

    /// The `syscall` line into `buf` (cleared first).
    pub(super) fn syscall(&self, buf: &mut String) -> bool {
        buf.clear();
        // A line is at most 6 + 8 * 21 characters.
        let mut b = [0u8; 256];
        match self.syscall.read_at(&mut b, 0) {
            Ok(n) if n > 0 && n < b.len() => match std::str::from_utf8(&b[..n]) {
                Ok(t) => {
                    buf.push_str(t);
                    true
                }
                Err(_) => false,
            },
            _ => false,
        }
    }

    /// The thread's CPU time in ns (first field of `schedstat`).
    pub(super) fn runtime_ns(&self) -> Option<u64> {
        let mut b = [0u8; 96];
        let n = self.schedstat.read_at(&mut b, 0).ok()?;
        let t = std::str::from_utf8(&b[..n]).ok()?;
        t.split_ascii_whitespace().next()?.parse().ok()
    }
}

/// Whether `pid`'s memory at `sp + offset` still holds each word.
pub(super) fn words_unchanged(pid: Pid, sp: u64, words: &[(u32, u64)]) -> bool {
    if words.is_empty() {
        return true;
    }
    // One remote piece per run of adjacent words, all read by one call.
    let mut remote: Vec<libc::iovec> = Vec::new();
    let mut prev_end = None;
    for &(off, _) in words {
        let a = sp + off as u64;
        match remote.last_mut() {
            Some(last) if prev_end == Some(a) => last.iov_len += 8,
            _ => remote.push(libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: 8,
            }),
        }
        prev_end = Some(a + 8);
    }
    let mut got = Vec::with_capacity(words.len() * 8);
    gather(pid, &remote, &mut got)
        && words
            .iter()
            .zip(got.chunks_exact(8))
            .all(|(w, g)| w.1.to_le_bytes() == g)
}

/// Copy up to `len` bytes of another process's memory at `addr`; a copy cut
/// short by the end of the stack's mapping keeps what was read.
pub fn copy_memory(pid: Pid, addr: u64, len: usize) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; len];
    // Never cross into an unmapped page: the first iovec piece per page
    // lets a partial read return what lies before the end of the mapping.
    let page = 4096u64;
    let mut local = Vec::new();
    let mut remote = Vec::new();
    let mut off = 0usize;
    while off < len {
        let a = addr + off as u64;
        let n = ((page - a % page) as usize).min(len - off);
        local.push(libc::iovec {
            iov_base: buf[off..].as_mut_ptr().cast(),
            iov_len: n,
        });
        remote.push(libc::iovec {
            iov_base: a as *mut libc::c_void,
            iov_len: n,
        });
        off += n;
    }
    // SAFETY: every local iovec points into `buf`, which outlives the call;
    // the remote ones are only read by the kernel.
    let got = unsafe {
        libc::process_vm_readv(
            pid.0,
            local.as_ptr(),
            local.len() as libc::c_ulong,
            remote.as_ptr(),
            remote.len() as libc::c_ulong,
            0,
        )
    };
    if got <= 0 {
        return None;
    }
    buf.truncate(got as usize);
    Some(buf)
}

/// The marker naming a blocked thread's system call.
pub fn syscall_marker(nr: i64, regular_file: bool) -> &'static str {
    if nr < 0 {
        return "[blocked: not in a system call]";
    }
    let name = syscall_name(nr);
    let key = (nr, regular_file);
    let mut known = MARKERS.lock().unwrap_or_else(|e| e.into_inner());
    // One leaked string per (system call, file kind) ever seen: a few
    // dozen at most.
    known.entry(key).or_insert_with(|| {
        let s = match (name, regular_file) {
            (Some(n), true) => format!("[syscall: {n}, regular file]"),
            (Some(n), false) => format!("[syscall: {n}]"),
            (None, _) => format!("[syscall: {nr}]"),
        };
        Box::leak(s.into_boxed_str())
    })
}

/// Distinct GIL-holder markers kept; past this, one generic marker (the
/// strings live as long as the recording).
const MAX_GIL_MARKERS: usize = 4096;

/// `[gil held by thread TID in FUNCTION (FILE)]`.
pub fn gil_marker(tid: Tid, name: &str, file: &str) -> &'static str {
    static KNOWN: std::sync::LazyLock<std::sync::Mutex<HashMap<String, &'static str>>> =
        std::sync::LazyLock::new(Default::default);
    let base = file.rsplit('/').next().unwrap_or(file);
    let s = format!("{GIL_MARKER_PREFIX}{} in {name} ({base})]", tid.0);
    let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(m) = known.get(&s) {
        return m;
    }
    if known.len() >= MAX_GIL_MARKERS {
        return "[gil held by another thread]";
    }
    let m: &'static str = Box::leak(s.clone().into_boxed_str());
    known.insert(s, m);
    m
}

pub const GIL_MARKER_PREFIX: &str = "[gil held by thread ";

static MARKERS: std::sync::LazyLock<std::sync::Mutex<HashMap<(i64, bool), &'static str>>> =
    std::sync::LazyLock::new(Default::default);

/// Names of the system calls a training loop blocks in.
pub fn syscall_name(nr: i64) -> Option<&'static str> {
    let n = nr;
    #[cfg(target_arch = "x86_64")]
    {
        let x86 = match n {
            libc::SYS_poll => Some("poll"),
            libc::SYS_select => Some("select"),
            libc::SYS_epoll_wait => Some("epoll_wait"),
            libc::SYS_accept => Some("accept"),
            libc::SYS_open => Some("open"),
            _ => None,
        };
        if x86.is_some() {
            return x86;
        }
    }
    Some(match n {
        libc::SYS_read => "read",
        libc::SYS_write => "write",
        libc::SYS_pread64 => "pread64",
        libc::SYS_pwrite64 => "pwrite64",
        libc::SYS_readv => "readv",
        libc::SYS_writev => "writev",
        libc::SYS_openat => "openat",
        libc::SYS_fsync => "fsync",
        libc::SYS_fdatasync => "fdatasync",
        libc::SYS_futex => "futex",
        libc::SYS_nanosleep => "nanosleep",
        libc::SYS_clock_nanosleep => "clock_nanosleep",
        libc::SYS_epoll_pwait => "epoll_pwait",
        libc::SYS_ppoll => "ppoll",
        libc::SYS_pselect6 => "pselect6",
        libc::SYS_recvfrom => "recvfrom",
        libc::SYS_sendto => "sendto",
        libc::SYS_recvmsg => "recvmsg",
        libc::SYS_sendmsg => "sendmsg",
        libc::SYS_accept4 => "accept4",
        libc::SYS_connect => "connect",
        libc::SYS_wait4 => "wait4",
        libc::SYS_waitid => "waitid",
        libc::SYS_sched_yield => "sched_yield",
        _ => return None,
    })
}

/// System calls whose first argument is a file descriptor that may be a
/// regular file (file IO when it is).
fn fd_syscall(nr: i64) -> bool {
    matches!(
        nr,
        libc::SYS_read
            | libc::SYS_write
            | libc::SYS_pread64
            | libc::SYS_pwrite64
            | libc::SYS_readv
            | libc::SYS_writev
            | libc::SYS_fsync
            | libc::SYS_fdatasync
    )
}

/// Whether the call works on a regular file: its descriptor names a path
/// (not a pipe, socket or device), or it opens one. `fd_dir`: the
/// process's `/proc/PID/fd`, kept open (a lookup relative to it costs a
/// fifth less than the whole path); opened, or opened again when it fails
/// (the process it named is gone and its PID reused), here.
pub(super) fn on_regular_file(pid: Pid, s: &SyscallLine, fd_dir: &mut Option<File>) -> bool {
    #[cfg(target_arch = "x86_64")]
    if s.nr == libc::SYS_open {
        return true;
    }
    if s.nr == libc::SYS_openat {
        return true;
    }
    if !fd_syscall(s.nr) || s.args[0] > i32::MAX as u64 {
        return false;
    }
    // The descriptor is resolved at every look, never remembered by its
    // number: a loop closes a socket and opens its checkpoint file within
    // a step, and the file gets the socket's number.
    let name = std::ffi::CString::new(s.args[0].to_string()).expect("digits");
    let mut buf = [0u8; 512];
    for fresh in [false, true] {
        if fresh || fd_dir.is_none() {
            *fd_dir = File::open(format!("/proc/{}/fd", pid.0)).ok();
        }
        let Some(dir) = fd_dir.as_ref() else {
            return false;
        };
        // SAFETY: `name` is a NUL-terminated string and `buf` a writable
        // buffer of the length given.
        let n = unsafe {
            libc::readlinkat(
                dir.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n > 0 {
            let p = &buf[..n as usize];
            return p.starts_with(b"/") && !p.starts_with(b"/dev/");
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscall_lines_parse() {
        let l =
            parse_syscall("230 0x1 0x0 0x7ffe85ec0880 0x0 0x0 0x0 0x7ffe85ec0878 0x7f1c06ced503\n")
                .unwrap();
        assert_eq!(l.nr, 230);
        assert_eq!(l.args[2], 0x7ffe85ec0880);
        assert_eq!((l.sp, l.pc), (0x7ffe85ec0878, 0x7f1c06ced503));
        assert_eq!(parse_syscall("running\n"), None);
        let l = parse_syscall("-1 0x7ffe85ec0878 0x7f1c06ced503").unwrap();
        assert_eq!(l.nr, -1);
        assert_eq!(parse_syscall("0 0x1 0x2"), None, "truncated line");
        assert_eq!(parse_syscall(""), None);
    }

    #[test]
    fn markers_name_the_call_and_file_kind() {
        assert_eq!(syscall_marker(libc::SYS_futex, false), "[syscall: futex]");
        assert_eq!(
            syscall_marker(libc::SYS_fsync, true),
            "[syscall: fsync, regular file]"
        );
        assert_eq!(syscall_marker(-1, false), "[blocked: not in a system call]");
        assert_eq!(syscall_marker(100_000, false), "[syscall: 100000]");
    }

    /// A thread of this process blocked in a read of a pipe: its syscall
    /// line names the call and the pipe's descriptor, and its stack can be
    /// copied.
    #[test]
    fn a_reused_descriptor_number_is_named_by_what_it_is_now() {
        // A loop closes a socket or pipe and opens its checkpoint file,
        // which gets the same number: the file is a regular file.
        let pid = Pid(std::process::id() as i32);
        let mut fds = [0; 2];
        // SAFETY: fds is a valid array of two ints.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let line = |fd: i32, nr: i64| SyscallLine {
            nr,
            args: [fd as u64, 0, 0, 0, 0, 0],
            sp: 1,
            pc: 1,
        };
        let mut fd_dir = None;
        assert!(!on_regular_file(
            pid,
            &line(fds[0], libc::SYS_read),
            &mut fd_dir
        ));
        let dir = std::env::temp_dir().join(format!("gpuprof-fdreuse-{}", pid.0));
        std::fs::write(&dir, b"x").unwrap();
        let path = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
        let file = loop {
            // SAFETY: closing a descriptor this test owns; opening a path.
            unsafe { libc::close(fds[0]) };
            // SAFETY: `path` is NUL-terminated.
            let f = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) };
            assert!(f >= 0);
            if f == fds[0] {
                break f;
            }
            // Another thread of the test binary took the number first.
            fds[0] = f;
        };
        assert!(on_regular_file(
            pid,
            &line(file, libc::SYS_fsync),
            &mut fd_dir
        ));
        assert!(on_regular_file(
            pid,
            &line(file, libc::SYS_read),
            &mut fd_dir
        ));
        // And back: the number now names the pipe again (dup2 replaces it
        // at once, so no other thread of the test binary can take it).
        // SAFETY: both descriptors are this test's.
        assert_eq!(unsafe { libc::dup2(fds[1], file) }, file);
        assert!(!on_regular_file(
            pid,
            &line(file, libc::SYS_write),
            &mut fd_dir
        ));
        // SAFETY: closing descriptors this test owns.
        unsafe {
            libc::close(file);
            libc::close(fds[1]);
        }
        let _ = std::fs::remove_file(&dir);
    }
}
