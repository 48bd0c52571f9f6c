//! Opening the per-CPU sampling events and decoding their raw records.
//!
//! Why per CPU: an event opened on one task with `inherit` cannot be mmapped
//! (EINVAL); one event per CPU with `pid = job, inherit = true` can, and the
//! kernel then follows every fork of the job (this is what `perf record --
//! cmd` does). Inherited events write into their parent event's ring.
//!
//! Records are decoded here by hand rather than with `perf-event-data`,
//! because that crate does not expose the `sample_id_all` trailer (the
//! timestamp of MMAP2/COMM/FORK records), which the time ordering needs.

use std::io;

use perf_event::events::Software;
use perf_event::{Builder, Clock, SampleFlag, Sampler};

use super::sample::{Mmap2, Sample};
use crate::event::{MonoNs, Pid, Tid};

/// x86_64 `perf_regs` indices: BP = 6, SP = 7, IP = 8. Registers are dumped
/// in index order, so a sample carries [bp, sp, ip].
#[cfg(target_arch = "x86_64")]
pub const REGS_MASK: u64 = (1 << 6) | (1 << 7) | (1 << 8);
/// aarch64: x29 (fp) = 29, lr = 30, sp = 31, pc = 32.
#[cfg(target_arch = "aarch64")]
pub const REGS_MASK: u64 = (1 << 29) | (1 << 30) | (1 << 31) | (1 << 32);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub const REGS_MASK: u64 = 0;

const RECORD_MMAP2: u32 = 10;
const RECORD_LOST: u32 = 2;
const RECORD_COMM: u32 = 3;
const RECORD_EXIT: u32 = 4;
const RECORD_FORK: u32 = 7;
const RECORD_SAMPLE: u32 = 9;
const MISC_COMM_EXEC: u16 = 1 << 13;
const MISC_MMAP_BUILD_ID: u16 = 1 << 14;
/// `sample_id_all` trailer with TID | TIME | CPU: pid, tid, time, cpu, res.
const TRAILER: usize = 24;
/// Smallest ring tried when the preferred size cannot be locked.
const MIN_RING_BYTES: usize = 64 << 10;

/// How the sampling events are opened.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub frequency: u64,
    /// Bytes of user stack copied with each sample.
    pub stack_size: u32,
    /// Ring buffer data bytes per CPU (a power of two, in pages).
    pub ring_bytes: usize,
}

/// One opened ring per online CPU.
pub struct Rings {
    pub samplers: Vec<Sampler>,
    pub ring_bytes: usize,
    /// Events that write into another event's ring (`gpuprof attach`: one
    /// per thread and CPU); held only to keep them open.
    pub followers: Vec<perf_event::Counter>,
}

impl Rings {
    /// Turn on events opened off (`open` without `at_exec`). Enabling an
    /// inherited event turns on its copies in every task created meanwhile
    /// (the kernel applies it to the event's children).
    pub fn enable(&mut self) -> std::io::Result<()> {
        for s in self.samplers.iter_mut() {
            s.enable()?;
        }
        Ok(())
    }
}

/// `perf_event_open` failed; carries what the user can do about it.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct OpenError {
    pub message: String,
    pub errno: Option<i32>,
}

/// The online CPUs, from `/sys/devices/system/cpu/online` (e.g. "0-3,6").
pub fn online_cpus() -> Vec<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut cpus = parse_cpu_list(text.trim());
    if cpus.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        cpus = (0..n).collect();
    }
    cpus
}

pub fn parse_cpu_list(s: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                    if b >= a && b - a < 65536 {
                        out.extend(a..=b);
                    }
                }
            }
            None => {
                if let Ok(a) = part.trim().parse() {
                    out.push(a);
                }
            }
        }
    }
    out
}

/// The sysctl value, if readable.
pub fn perf_event_paranoid() -> Option<i32> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// One line saying why perf was refused and exactly how to allow it.
pub fn refusal_advice(err: &io::Error) -> String {
    refusal_advice_then(err, "no native stacks")
}

/// [`refusal_advice`], saying `then` of what gpuprof does instead.
pub fn refusal_advice_then(err: &io::Error, then: &str) -> String {
    let errno = err.raw_os_error();
    let paranoid = perf_event_paranoid();
    match errno {
        Some(libc::EACCES) | Some(libc::EPERM) => {
            let fix = match paranoid {
                Some(p) if p > 2 => {
                    "run `sudo sysctl kernel.perf_event_paranoid=2` (or give gpuprof CAP_PERFMON: `sudo setcap cap_perfmon+ep $(which gpuprof)`)".to_string()
                }
                // The setting allows it already: a container's seccomp
                // profile or a security module refused.
                Some(_) => "in a container allow the perf_event_open syscall (seccomp) and give CAP_PERFMON; elsewhere check the security module (SELinux, AppArmor) or give gpuprof CAP_PERFMON (`sudo setcap cap_perfmon+ep $(which gpuprof)`)".to_string(),
                _ => "give gpuprof CAP_PERFMON (`sudo setcap cap_perfmon+ep $(which gpuprof)`), or run `sudo sysctl kernel.perf_event_paranoid=2`; in a container also allow the perf_event_open syscall (seccomp) and CAP_PERFMON".to_string(),
            };
            format!(
                "perf_event_open was refused ({err}; kernel.perf_event_paranoid = {}): {then}; to allow it, {fix}",
                paranoid.map_or("unknown".into(), |p| p.to_string())
            )
        }
        Some(libc::ENOSYS) => format!(
            "perf_event_open is not available ({err}): this kernel has no perf events (CONFIG_PERF_EVENTS); {then}"
        ),
        Some(libc::ENOMEM) | Some(libc::EINVAL) => format!(
            "perf_event_open failed ({err}): the ring buffers could not be set up; try a smaller `--stack-size`, or raise `kernel.perf_event_mlock_kb`; {then}"
        ),
        _ => format!("perf_event_open failed ({err}): {then}"),
    }
}

/// The ring's wake-up mark for a ring of `size` bytes. The kernel wakes
/// the reader each time the ring's head moves on by this much, whatever
/// the reader has consumed; the reader drains every 20-50 ms anyway, so
/// the mark is a safety net for a rate its timer cannot keep up with.
/// Half the ring when the ring holds at least 200 ms of one CPU's samples
/// at full stack copies (the size [`ring_bytes_for`] asks for: at a
/// quarter, it woke the reader 24 times a second on a two-CPU loader job,
/// on top of its timer); a quarter for a smaller ring (memlock limits),
/// which needs the room left after the mark.
fn watermark(size: usize, opts: &OpenOptions) -> usize {
    let per_second = (opts.frequency as usize).saturating_mul(opts.stack_size as usize + 256);
    let share = if size.saturating_mul(5) >= per_second {
        2
    } else {
        4
    };
    (size / share).max(4096)
}

/// Open one disabled `cpu-clock` event per CPU on `pid` (inherited by every
/// task it creates), enabled by the kernel when `pid` execs (`at_exec`), or
/// left off until [`Rings::enable`].
pub fn open(
    pid: Pid,
    cpus: &[usize],
    opts: &OpenOptions,
    at_exec: bool,
) -> Result<Rings, OpenError> {
    let mut samplers = Vec::with_capacity(cpus.len());
    let mut ring_bytes = opts.ring_bytes;
    for &cpu in cpus {
        let mut b = builder(opts, watermark(ring_bytes.max(MIN_RING_BYTES), opts));
        b.observe_pid(pid.0)
            .one_cpu(cpu)
            .enabled(false)
            .enable_on_exec(at_exec);
        let mut counter = b.build().map_err(|e| OpenError {
            message: refusal_advice(&e),
            errno: e.raw_os_error(),
        })?;
        // Unprivileged users may lock only `perf_event_mlock_kb` (516 KiB
        // by default) per CPU beyond RLIMIT_MEMLOCK: retry with smaller rings
        // (lost records are counted and reported if they overflow).
        let mut size = ring_bytes.max(MIN_RING_BYTES);
        let sampler = loop {
            match counter.sampled(size) {
                Ok(s) => break s,
                Err(_) if size > MIN_RING_BYTES => {
                    size /= 2;
                    b.wakeup_watermark(watermark(size, opts));
                    let again = b.build().map_err(|e| OpenError {
                        message: refusal_advice(&e),
                        errno: e.raw_os_error(),
                    })?;
                    counter = again;
                }
                Err(e) => {
                    return Err(OpenError {
                        message: format!(
                            "cannot map the perf ring buffer ({} KiB on CPU {cpu}): {e}; raise `kernel.perf_event_mlock_kb` or the memlock limit (ulimit -l); no native stacks",
                            size / 1024
                        ),
                        errno: e.raw_os_error(),
                    })
                }
            }
        };
        ring_bytes = ring_bytes.min(size);
        samplers.push(sampler);
    }
    Ok(Rings {
        samplers,
        ring_bytes,
        followers: Vec::new(),
    })
}

/// The common settings of every sampling event: `cpu-clock` on the user
/// side, user registers and stack, task records, monotonic time.
fn builder(opts: &OpenOptions, watermark: usize) -> Builder<'static> {
    let mut b = Builder::new(Software::CPU_CLOCK);
    b.inherit(true)
        .exclude_kernel(true)
        .exclude_hv(true)
        .sample_frequency(opts.frequency)
        .sample(
            SampleFlag::IP
                | SampleFlag::TID
                | SampleFlag::TIME
                | SampleFlag::CPU
                | SampleFlag::REGS_USER
                | SampleFlag::STACK_USER,
        )
        .sample_regs_user(REGS_MASK)
        .sample_stack_user(opts.stack_size)
        .mmap(true)
        .mmap2(true)
        .comm(true)
        .comm_exec(true)
        .task(true)
        .sample_id_all(true)
        .clockid(Clock::MONOTONIC)
        .wakeup_watermark(watermark);
    b
}

/// `PERF_EVENT_IOC_SET_OUTPUT` (`_IO('$', 5)`).
const IOC_SET_OUTPUT: libc::c_ulong = 0x2405;

/// Sample threads that already run (`gpuprof attach`): one event per
/// (thread, CPU), enabled at once and inherited by whatever the thread
/// creates from now on. An event on one task with `inherit` can only be
/// mmapped per CPU, and a ring per thread and CPU would cost memory in
/// proportion to both, so every event of a CPU writes into the ring of the
/// first one opened on it (`PERF_EVENT_IOC_SET_OUTPUT`), as `perf record -p`
/// does. Threads that exit before their turn are skipped. Returns the rings
/// and the threads that now carry an event.
pub fn open_on_threads(
    tids: &[Tid],
    cpus: &[usize],
    opts: &OpenOptions,
) -> Result<(Rings, Vec<Tid>), OpenError> {
    let mut rings = Rings {
        samplers: Vec::with_capacity(cpus.len()),
        ring_bytes: opts.ring_bytes.max(MIN_RING_BYTES),
        followers: Vec::new(),
    };
    let mut covered = Vec::new();
    let mut first_err: Option<io::Error> = None;
    for &cpu in cpus {
        let mut ring: Option<Sampler> = None;
        for &tid in tids {
            let b = {
                let mut b = builder(opts, watermark(rings.ring_bytes, opts));
                b.observe_pid(tid.0).one_cpu(cpu).enabled(true);
                b
            };
            let counter = match b.build() {
                Ok(c) => c,
                Err(e) => {
                    // ESRCH: the thread exited meanwhile. Anything else
                    // (permission) is reported if no thread could be opened.
                    if e.raw_os_error() != Some(libc::ESRCH) && first_err.is_none() {
                        first_err = Some(e);
                    }
                    continue;
                }
            };
            match &ring {
                None => {
                    let mut size = rings.ring_bytes;
                    let mut c = Some(counter);
                    let sampler = loop {
                        match c.take().expect("counter present").sampled(size) {
                            Ok(s) => break Some(s),
                            Err(_) if size > MIN_RING_BYTES => {
                                size /= 2;
                                c = Some(b.build().map_err(|e| OpenError {
                                    message: refusal_advice(&e),
                                    errno: e.raw_os_error(),
                                })?);
                            }
                            Err(e) => {
                                return Err(OpenError {
                                    message: format!(
                                        "cannot map the perf ring buffer ({} KiB on CPU {cpu}): {e}; raise `kernel.perf_event_mlock_kb` or the memlock limit (ulimit -l); no native stacks",
                                        size / 1024
                                    ),
                                    errno: e.raw_os_error(),
                                });
                            }
                        }
                    };
                    rings.ring_bytes = rings.ring_bytes.min(size);
                    ring = sampler;
                }
                Some(r) => {
                    use std::os::fd::AsRawFd;
                    // SAFETY: both are open perf event fds of this process.
                    let rc = unsafe {
                        libc::ioctl(counter.as_raw_fd(), IOC_SET_OUTPUT as _, r.as_raw_fd())
                    };
                    if rc != 0 {
                        let e = io::Error::last_os_error();
                        return Err(OpenError {
                            message: format!(
                                "cannot direct thread {tid}'s samples into the ring of CPU {cpu}: {e}; no native stacks"
                            ),
                            errno: e.raw_os_error(),
                        });
                    }
                    rings.followers.push(counter);
                }
            }
            if rings.samplers.is_empty() {
                covered.push(tid);
            }
        }
        match ring {
            Some(r) => rings.samplers.push(r),
            None => break,
        }
    }
    if rings.samplers.is_empty() {
        let e = first_err.unwrap_or_else(|| io::Error::from_raw_os_error(libc::ESRCH));
        return Err(OpenError {
            message: refusal_advice(&e),
            errno: e.raw_os_error(),
        });
    }
    Ok((rings, covered))
}

/// Add threads found after [`open_on_threads`] (created by a thread that
/// carried no event yet) to the existing rings.
pub fn add_threads(
    rings: &mut Rings,
    tids: &[Tid],
    cpus: &[usize],
    opts: &OpenOptions,
) -> Vec<Tid> {
    use std::os::fd::AsRawFd;
    let mut covered = Vec::new();
    for &tid in tids {
        let mut ok = false;
        for (&cpu, ring) in cpus.iter().zip(&rings.samplers) {
            let mut b = builder(opts, (rings.ring_bytes / 4).max(4096));
            b.observe_pid(tid.0).one_cpu(cpu).enabled(true);
            let Ok(counter) = b.build() else { break };
            // SAFETY: both are open perf event fds of this process.
            let rc =
                unsafe { libc::ioctl(counter.as_raw_fd(), IOC_SET_OUTPUT as _, ring.as_raw_fd()) };
            if rc == 0 {
                rings.followers.push(counter);
                ok = true;
            }
        }
        if ok {
            covered.push(tid);
        }
    }
    covered
}

/// Ring size for a rate: room for ~250 ms of samples at full stack copies on
/// one CPU, between 512 KiB and 8 MiB. At 99 Hz with 32 KiB stacks this is
/// 1 MiB; at 1 kHz, 8 MiB (the reader drains every 20 ms at most).
pub fn ring_bytes_for(frequency: u64, stack_size: u32) -> usize {
    let per_sample = stack_size as usize + 256;
    let want = (frequency as usize).saturating_mul(per_sample) / 4;
    want.clamp(512 << 10, 8 << 20).next_power_of_two()
}

/// A decoded record. Samples borrow nothing: the stack copy is trimmed to
/// the bytes the kernel actually filled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Sample(Sample),
    /// A look at a thread by the wall-clock sampler (blocked threads).
    Wall(super::offcpu::WallRecord),
    Mmap2(Mmap2),
    Comm {
        pid: Pid,
        tid: Tid,
        t: MonoNs,
        comm: String,
        exec: bool,
    },
    Fork {
        pid: Pid,
        ppid: Pid,
        tid: Tid,
        ptid: Tid,
        t: MonoNs,
    },
    Exit {
        pid: Pid,
        tid: Tid,
        t: MonoNs,
    },
    Lost {
        lost: u64,
        t: MonoNs,
    },
    /// A sample of a thread whose same instant the Python agent sampled
    /// (decided as it was read: its stack was not copied).
    Covered {
        pid: Pid,
        tid: Tid,
        t: MonoNs,
    },
    /// A record of the in-process Python agent, from ring `ring`.
    Agent {
        ring: usize,
        rec: super::pyagent::AgentRecord,
    },
}

impl Record {
    pub fn time(&self) -> MonoNs {
        match self {
            Record::Sample(s) => s.t,
            Record::Wall(w) => w.time(),
            Record::Mmap2(m) => m.t,
            Record::Comm { t, .. }
            | Record::Fork { t, .. }
            | Record::Exit { t, .. }
            | Record::Lost { t, .. }
            | Record::Covered { t, .. } => *t,
            Record::Agent { rec, .. } => rec.time(),
        }
    }
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn u32(&mut self) -> Option<u32> {
        let v = self.b.get(self.pos..self.pos + 4)?;
        self.pos += 4;
        Some(u32::from_ne_bytes(v.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        let v = self.b.get(self.pos..self.pos + 8)?;
        self.pos += 8;
        Some(u64::from_ne_bytes(v.try_into().ok()?))
    }
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let v = self.b.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(v)
    }
}

fn trailer_time(body: &[u8]) -> Option<MonoNs> {
    let start = body.len().checked_sub(TRAILER)?;
    let mut c = Cursor {
        b: &body[start..],
        pos: 8,
    };
    c.u64().map(MonoNs)
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// The thread and time of a sample record (`ty`, its body without the
/// header), read without copying its stack; `None` for other records.
pub fn sample_head(ty: u32, body: &[u8]) -> Option<(Pid, Tid, MonoNs)> {
    if ty != RECORD_SAMPLE {
        return None;
    }
    // After the ip: pid, tid, time (the layout `parse` reads).
    let mut c = Cursor { b: body, pos: 8 };
    let pid = c.u32()? as i32;
    let tid = c.u32()? as i32;
    let t = c.u64()?;
    Some((Pid(pid), Tid(tid), MonoNs(t)))
}

/// Decode one record body (without its 8-byte header) of the layout that
/// [`open`] configures. Unknown record types and malformed bodies → `None`.
pub fn parse(ty: u32, misc: u16, body: &[u8], nregs: usize) -> Option<Record> {
    let mut c = Cursor { b: body, pos: 0 };
    match ty {
        RECORD_SAMPLE => {
            let ip = c.u64()?;
            let pid = c.u32()? as i32;
            let tid = c.u32()? as i32;
            let t = c.u64()?;
            let _cpu = c.u64()?;
            let abi = c.u64()?;
            let regs = if abi != 0 {
                let mut r = [0u64; 4];
                for i in 0..nregs {
                    let v = c.u64()?;
                    if let Some(slot) = r.get_mut(i) {
                        *slot = v;
                    }
                }
                Some(r)
            } else {
                None
            };
            let size = c.u64()? as usize;
            let mut stack = Vec::new();
            if size > 0 {
                let data = c.bytes(size)?;
                let dyn_size = (c.u64()? as usize).min(size);
                stack.extend_from_slice(&data[..dyn_size]);
            }
            Some(Record::Sample(Sample {
                pid: Pid(pid),
                tid: Tid(tid),
                t: MonoNs(t),
                regs,
                ip,
                stack,
            }))
        }
        RECORD_MMAP2 => {
            let pid = c.u32()? as i32;
            let tid = c.u32()? as i32;
            let addr = c.u64()?;
            let len = c.u64()?;
            let pgoff = c.u64()?;
            // maj/min/ino/ino_generation, or build id: 24 bytes either way.
            let _ = misc & MISC_MMAP_BUILD_ID;
            c.bytes(24)?;
            let prot = c.u32()?;
            let _flags = c.u32()?;
            let end = body.len().checked_sub(TRAILER)?;
            let name = body.get(c.pos..end)?;
            Some(Record::Mmap2(Mmap2 {
                pid: Pid(pid),
                tid: Tid(tid),
                t: trailer_time(body)?,
                addr,
                len,
                pgoff,
                prot,
                path: cstr(name),
            }))
        }
        RECORD_COMM => {
            let pid = c.u32()? as i32;
            let tid = c.u32()? as i32;
            let end = body.len().checked_sub(TRAILER)?;
            let name = body.get(c.pos..end)?;
            Some(Record::Comm {
                pid: Pid(pid),
                tid: Tid(tid),
                t: trailer_time(body)?,
                comm: cstr(name),
                exec: misc & MISC_COMM_EXEC != 0,
            })
        }
        RECORD_FORK | RECORD_EXIT => {
            let pid = c.u32()? as i32;
            let ppid = c.u32()? as i32;
            let tid = c.u32()? as i32;
            let ptid = c.u32()? as i32;
            let t = MonoNs(c.u64()?);
            Some(if ty == RECORD_FORK {
                Record::Fork {
                    pid: Pid(pid),
                    ppid: Pid(ppid),
                    tid: Tid(tid),
                    ptid: Tid(ptid),
                    t,
                }
            } else {
                Record::Exit {
                    pid: Pid(pid),
                    tid: Tid(tid),
                    t,
                }
            })
        }
        RECORD_LOST => {
            let _id = c.u64()?;
            let lost = c.u64()?;
            Some(Record::Lost {
                lost,
                t: trailer_time(body).unwrap_or_default(),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u64s(v: &[u64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    #[test]
    fn sample_records_decode_and_trim_the_stack() {
        let mut body = u64s(&[0x401000]); // ip
        body.extend(7u32.to_ne_bytes()); // pid
        body.extend(8u32.to_ne_bytes()); // tid
        body.extend(u64s(&[123_456, 1, 2])); // time, cpu+res, abi
        body.extend(u64s(&[0xb0, 0x5000, 0x401000])); // bp, sp, ip
        body.extend(u64s(&[16])); // stack size
        body.extend([0xaa; 16]);
        body.extend(u64s(&[8])); // dyn_size
        let r = parse(RECORD_SAMPLE, 0, &body, 3).expect("decodes");
        let Record::Sample(s) = r else {
            panic!("not a sample")
        };
        assert_eq!((s.pid, s.tid, s.t), (Pid(7), Tid(8), MonoNs(123_456)));
        assert_eq!(s.regs, Some([0xb0, 0x5000, 0x401000, 0]));
        assert_eq!(s.stack, vec![0xaa; 8]);
        assert_eq!(
            sample_head(RECORD_SAMPLE, &body),
            Some((Pid(7), Tid(8), MonoNs(123_456)))
        );
        assert_eq!(sample_head(RECORD_COMM, &body), None);
        assert_eq!(sample_head(RECORD_SAMPLE, &body[..20]), None);
        // Every truncation is rejected, none panics.
        for n in 0..body.len() {
            let _ = parse(RECORD_SAMPLE, 0, &body[..n], 3);
        }
        assert!(parse(RECORD_SAMPLE, 0, &body[..40], 3).is_none());
    }

    #[test]
    fn mmap2_and_comm_take_their_time_from_the_trailer() {
        let mut body = Vec::new();
        body.extend(5u32.to_ne_bytes());
        body.extend(6u32.to_ne_bytes());
        body.extend(u64s(&[0x1000, 0x2000, 0x3000])); // addr len pgoff
        body.extend([0u8; 24]); // maj min ino ino_gen
        body.extend(5u32.to_ne_bytes()); // prot r-x
        body.extend(2u32.to_ne_bytes()); // flags
        body.extend(b"/usr/lib/x.so\0\0\0");
        body.extend(5u32.to_ne_bytes()); // trailer pid, tid
        body.extend(6u32.to_ne_bytes());
        body.extend(u64s(&[999, 0])); // time, cpu
        let Some(Record::Mmap2(m)) = parse(RECORD_MMAP2, 0, &body, 3) else {
            panic!("not an mmap2")
        };
        assert_eq!(m.path, "/usr/lib/x.so");
        assert_eq!(
            (m.addr, m.len, m.pgoff, m.t),
            (0x1000, 0x2000, 0x3000, MonoNs(999))
        );
        let mut comm = Vec::new();
        comm.extend(5u32.to_ne_bytes());
        comm.extend(6u32.to_ne_bytes());
        comm.extend(b"pt_data_worker\0\0");
        comm.extend(u64s(&[0, 777, 0]));
        let Some(Record::Comm { comm, exec, t, .. }) = parse(RECORD_COMM, MISC_COMM_EXEC, &comm, 3)
        else {
            panic!("not a comm")
        };
        assert_eq!(
            (comm.as_str(), exec, t),
            ("pt_data_worker", true, MonoNs(777))
        );
        for n in 0..body.len() {
            let _ = parse(RECORD_MMAP2, 0, &body[..n], 3);
        }
    }

    #[test]
    fn cpu_lists_and_ring_sizes() {
        assert_eq!(parse_cpu_list("0-3,6"), vec![0, 1, 2, 3, 6]);
        assert_eq!(parse_cpu_list("5"), vec![5]);
        assert!(parse_cpu_list("3-1,x").is_empty());
        assert_eq!(ring_bytes_for(99, 32 * 1024), 1 << 20);
        assert_eq!(ring_bytes_for(1000, 32 * 1024), 8 << 20);
        assert_eq!(ring_bytes_for(1, 1024), 512 << 10);
    }

    #[test]
    fn the_wake_up_mark_leaves_room_in_a_small_ring() {
        let opts = |frequency| OpenOptions {
            frequency,
            stack_size: 32 * 1024,
            ring_bytes: ring_bytes_for(frequency, 32 * 1024),
        };
        // The rings sized for the rate hold ≥ 250 ms: woken every half.
        for f in [99, 1000] {
            let o = opts(f);
            assert_eq!(watermark(o.ring_bytes, &o), o.ring_bytes / 2, "{f} Hz");
        }
        // A ring cut down by memlock limits (512 KiB at 99 Hz holds ~160
        // ms, at 1 kHz ~16 ms): a quarter, as before.
        assert_eq!(watermark(512 << 10, &opts(99)), 128 << 10);
        assert_eq!(watermark(512 << 10, &opts(1000)), 128 << 10);
        assert_eq!(watermark(8 << 10, &opts(99)), 4096);
    }
}
