//! Python frames of another process's threads, read from outside with the
//! layout the in-process agent publishes (`src/agent/pystacks.c`,
//! `reader_block`), for the wall-clock sampler's blocked threads.
//!
//! py-spy reads the same chain, but each call first lists every thread of
//! the process and scans each one's `/proc` stat file (to tell idle threads,
//! which the sampler knows already), and reads each frame, code object and
//! string with a call of its own: ~117 µs per look at a loop thread here.
//! The agent already knows where CPython 3.9–3.13 keep a thread's frames
//! (it walks its own at signal time), so it publishes those offsets and the
//! interpreter's addresses in its ring's header page, and this reader:
//! - gathers what one look needs into few `process_vm_readv` calls (no
//!   ptrace, the job is never stopped): the agent's cookie (the process
//!   still runs the image that published the layout), the code-object
//!   generation counter, the GIL's state and each wanted thread's state;
//! - reads the frames of a 3.11+ data stack a page-window at a time (the
//!   older frames lie just below the newer);
//! - names code objects from a cache keyed by address, trusted without a
//!   read while the agent's generation counter (moved by every code
//!   object's deallocation) has not moved since the entry was checked: a
//!   code object freed and another born at the same address moves it.
//!   Otherwise each code object's header is read again and its name and
//!   file pointers compared.
//!
//! Frames come out as py-spy's do (outermost first; `(name, file, entry)`,
//! entry as py-spy's `is_entry || is_shim_entry`), so either reader can
//! serve a look: the sampler falls back to py-spy where the agent is not
//! loaded or a read here fails.

use rustc_hash::FxHashMap as HashMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::event::{Pid, Tid};

/// Offset of the reader's block in a ring's header page (pystacks.c).
const READER_OFFSET: usize = 2048;
const READER_MAGIC: u64 = 0x3130_4452_5950_5047;
const READER_VERSION: u32 = 1;
const RING_MAGIC: u64 = 0x3147_4e52_4652_5047;

// Indexes into the block's offsets (pystacks.c, RD_*).
const RT_INTERP_HEAD: usize = 0;
const INTERP_TSTATE_HEAD: usize = 1;
const TS_NEXT: usize = 2;
const TS_THREAD_ID: usize = 3;
const TS_NATIVE_TID: usize = 4;
const GIL_IN_INTERP: usize = 5;
const GIL_OFF: usize = 6;
const PTHREAD_TID: usize = 7;
const TS_FRAME: usize = 8;
const TS_CFRAME: usize = 9;
const CF_CURRENT: usize = 10;
const FR_BACK: usize = 11;
const FR_CODE: usize = 12;
const FR_OWNER: usize = 13;
const FR_IS_ENTRY: usize = 14;
const OWNER_CSTACK: usize = 15;
const FR_READ: usize = 16;
const CO_NAME: usize = 17;
const CO_FILE: usize = 18;
const CO_READ: usize = 19;
const STR_ASCII: usize = 20;
const STR_COMPACT: usize = 21;
const N_OFFSETS: usize = 22;

/// The GIL's state: {interval, last_holder, locked} in every version.
const GIL_HOLDER: usize = 8;
const GIL_LOCKED: usize = 16;
const GIL_READ: usize = 24;
/// Most frames and threads walked (py-spy's limit too): a longer chain is
/// taken for a cycle read mid-update.
const MAX_WALK: usize = 4096;
/// py-spy refuses strings of 4096 characters or more.
const MAX_STR_CHARS: i64 = 4096;
/// Most bytes read at once below a frame of a data stack (3.11+).
const WINDOW: u64 = 4096;

/// Why a look could not be served from the agent's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadError {
    /// The process no longer runs the image that published the layout
    /// (exec, exit): the reader is dropped.
    Gone,
    /// A read failed or what it found is not a frame chain (a thread not
    /// found, a pointer that is not a code object): py-spy reads this look.
    Inconsistent,
}

/// Frames of the threads read, and the GIL's holder.
#[derive(Debug, Default)]
pub struct Read {
    /// Outermost first, as `python_frames()` gives them.
    pub frames: HashMap<Tid, Vec<(String, String, bool)>>,
    /// The thread holding the GIL, with its innermost Python frame's
    /// (name, file) when it has one.
    pub holder: Option<(Tid, Option<(String, String)>)>,
}

#[derive(Clone, Debug)]
struct Layout {
    minor: u32,
    runtime: u64,
    code_type: u64,
    code_gen: u64,
    cookie_addr: u64,
    cookie: u64,
    off: [i32; N_OFFSETS],
}

impl Layout {
    /// The block in a ring's header page, when the agent wrote one.
    fn parse(page: &[u8]) -> Option<Layout> {
        let u64_at = |o: usize| Some(u64::from_ne_bytes(page.get(o..o + 8)?.try_into().ok()?));
        let u32_at = |o: usize| Some(u32::from_ne_bytes(page.get(o..o + 4)?.try_into().ok()?));
        if u64_at(0)? != RING_MAGIC {
            return None;
        }
        let b = READER_OFFSET;
        if u64_at(b)? != READER_MAGIC || u32_at(b + 8)? != READER_VERSION {
            return None;
        }
        let mut off = [0i32; N_OFFSETS];
        for (i, o) in off.iter_mut().enumerate() {
            *o = u32_at(b + 56 + 4 * i)? as i32;
        }
        let l = Layout {
            minor: u32_at(b + 12)?,
            runtime: u64_at(b + 16)?,
            code_type: u64_at(b + 24)?,
            code_gen: u64_at(b + 32)?,
            cookie_addr: u64_at(b + 40)?,
            cookie: u64_at(b + 48)?,
            off,
        };
        // Offsets that index the buffers read below must be sane.
        let fields = [
            TS_NEXT,
            TS_THREAD_ID,
            FR_BACK,
            FR_CODE,
            FR_READ,
            CO_NAME,
            CO_FILE,
            CO_READ,
        ];
        let sane = fields.iter().all(|&i| (0..4096).contains(&l.off[i]))
            && l.off[FR_READ] >= l.off[FR_BACK].max(l.off[FR_CODE]) + 8
            && l.off[CO_READ] >= l.off[CO_NAME].max(l.off[CO_FILE]) + 8
            && l.off[CO_READ] >= 16
            && (l.off[TS_FRAME] >= 0) != (l.off[TS_CFRAME] >= 0)
            && (9..=13).contains(&l.minor);
        sane.then_some(l)
    }

    fn o(&self, i: usize) -> usize {
        self.off[i] as usize
    }

    /// Bytes of a thread state read: up to its last field used.
    fn ts_read(&self) -> usize {
        [TS_NEXT, TS_THREAD_ID, TS_NATIVE_TID, TS_FRAME, TS_CFRAME]
            .iter()
            .map(|&i| self.off[i])
            .max()
            .unwrap_or(0) as usize
            + 8
    }
}

/// A code object's names, and the pointers they were read from.
struct Code {
    name_ptr: u64,
    file_ptr: u64,
    name: String,
    file: String,
}

/// A thread state found in the interpreter's list.
#[derive(Clone, Copy)]
struct Thread {
    tstate: u64,
    /// Its `thread_id` (pthread_self) when it was found: a 3.9/3.10 thread
    /// state is matched to its thread by it.
    pthread: u64,
}

/// The reader of one process.
pub struct PyReader {
    pid: Pid,
    lay: Layout,
    /// The GIL's state (3.12+: found through the interpreter); 0 unknown.
    gil: u64,
    threads: HashMap<Tid, Thread>,
    codes: HashMap<u64, Code>,
    /// The generation at which every cached code object was last checked
    /// (0: none).
    gen: u32,
    /// When the thread list was last walked: a wanted thread not in it
    /// since is taken for one that runs no Python (a native helper) until
    /// it is walked again, [`RELIST_AFTER`] later — or sooner, when the
    /// list's head moved since (CPython puts a new thread's state at the
    /// head), or the walk found a thread state not yet bound to its thread.
    listed: Option<Instant>,
    /// The interpreter whose thread list was walked (0: not yet), and the
    /// list's head then.
    interp: u64,
    head: u64,
    /// The walk found a thread state whose thread had not started yet
    /// (3.11+: its native id still 0).
    unbound: bool,
    /// Looks served.
    pub reads: u64,
}

/// See [`PyReader::listed`].
const RELIST_AFTER: Duration = Duration::from_secs(1);
/// The list is walked again for a GIL holder not in it at most this often.
const HOLDER_RELIST: Duration = Duration::from_millis(50);

/// One remote piece.
fn iov(addr: u64, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    }
}

/// Read `remote` pieces of `pid`'s memory into `buf` back to back: all of
/// them, or `false`.
pub(super) fn gather(pid: Pid, remote: &[libc::iovec], buf: &mut Vec<u8>) -> bool {
    let total: usize = remote.iter().map(|r| r.iov_len).sum();
    buf.clear();
    buf.resize(total, 0);
    // IOV_MAX is 1024; callers stay far below.
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: total,
    };
    // SAFETY: the local iovec covers `buf`, which outlives the call; the
    // remote ones are only read by the kernel (a bad address is an error).
    let n = unsafe {
        libc::process_vm_readv(
            pid.0,
            &local,
            1,
            remote.as_ptr(),
            remote.len() as libc::c_ulong,
            0,
        )
    };
    n == total as isize
}

fn u64_in(b: &[u8], o: usize) -> u64 {
    b.get(o..o + 8)
        .map_or(0, |s| u64::from_ne_bytes(s.try_into().expect("8 bytes")))
}

fn u32_in(b: &[u8], o: usize) -> u32 {
    b.get(o..o + 4)
        .map_or(0, |s| u32::from_ne_bytes(s.try_into().expect("4 bytes")))
}

/// A frame as walked: its code object and whether it is an entry.
struct Walked {
    code: u64,
    entry: bool,
}

impl PyReader {
    /// The reader of `pid` from its agent ring in `ring_dir`, when the
    /// agent published its layout there and the process still runs that
    /// image.
    pub fn find(ring_dir: &Path, pid: Pid) -> Option<PyReader> {
        let prefix = format!("{}-", pid.0);
        let rd = std::fs::read_dir(ring_dir).ok()?;
        let mut page = vec![0u8; 4096];
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(n) = name.to_str() else { continue };
            if !n.starts_with(&prefix) || !n.ends_with(".ring") {
                continue;
            }
            let Ok(f) = std::fs::File::open(e.path()) else {
                continue;
            };
            if f.read_exact_at(&mut page, 0).is_err() {
                continue;
            }
            let Some(lay) = Layout::parse(&page) else {
                continue;
            };
            let r = PyReader {
                pid,
                lay,
                gil: 0,
                threads: HashMap::default(),
                codes: HashMap::default(),
                gen: 0,
                listed: None,
                interp: 0,
                head: 0,
                unbound: false,
                reads: 0,
            };
            if r.current() {
                return Some(r);
            }
        }
        None
    }

    /// The process still runs the image whose agent published the layout.
    fn current(&self) -> bool {
        let mut b = Vec::new();
        gather(self.pid, &[iov(self.lay.cookie_addr, 8)], &mut b)
            && u64_in(&b, 0) == self.lay.cookie
    }

    /// The frames of `tids` and the GIL's holder.
    pub fn read(&mut self, tids: &[Tid]) -> Result<Read, ReadError> {
        let lay = self.lay.clone();
        let ts_read = lay.ts_read();
        if self.gil == 0 && lay.off[GIL_IN_INTERP] == 0 {
            self.gil = lay.runtime + lay.o(GIL_OFF) as u64;
        }
        // One call: cookie, generation, the GIL, each known thread state.
        let mut remote = vec![iov(lay.cookie_addr, 8), iov(lay.code_gen, 8)];
        if self.gil != 0 {
            remote.push(iov(self.gil, GIL_READ));
        }
        // The thread list's head, to tell a thread started since the last
        // walk (not known yet) from one that runs no Python.
        let interp = self.interp;
        if interp != 0 {
            remote.push(iov(interp + lay.o(INTERP_TSTATE_HEAD) as u64, 8));
        }
        let known: Vec<(Tid, Thread)> = tids
            .iter()
            .filter_map(|t| self.threads.get(t).map(|th| (*t, *th)))
            .collect();
        for (_, th) in &known {
            remote.push(iov(th.tstate, ts_read));
        }
        let mut buf = Vec::new();
        if !gather(self.pid, &remote, &mut buf) {
            // A thread state freed (its thread gone) fails the whole call:
            // tell that from an exec'd process, then list the threads anew.
            if !self.current() {
                return Err(ReadError::Gone);
            }
            self.threads.clear();
            return self.read_listed(tids, None);
        }
        if u64_in(&buf, 0) != lay.cookie {
            return Err(ReadError::Gone);
        }
        let gen = u32_in(&buf, 8);
        let mut at = 16;
        let gil = (self.gil != 0).then(|| {
            let g = &buf[at..at + GIL_READ];
            at += GIL_READ;
            (u32_in(g, GIL_LOCKED) != 0).then(|| u64_in(g, GIL_HOLDER))
        });
        let head = (interp != 0).then(|| {
            at += 8;
            u64_in(&buf, at - 8)
        });
        let mut blocks: HashMap<Tid, (u64, Vec<u8>)> = HashMap::default();
        let mut stale = known.len() < tids.len() && self.relist_due(head);
        for (tid, th) in &known {
            let b = &buf[at..at + ts_read];
            at += ts_read;
            if self.names_thread(b, *tid, th) {
                blocks.insert(*tid, (th.tstate, b.to_vec()));
            } else {
                stale = true;
            }
        }
        if stale {
            return self.read_listed(tids, Some((gen, gil.flatten())));
        }
        self.read_blocks(tids, blocks, gen, gil.flatten())
    }

    /// Whether a wanted thread that is not in the list walked last calls
    /// for walking it again: the list changed (its head moved, or a thread
    /// state found then was not yet bound to its thread), or it was walked
    /// [`RELIST_AFTER`] ago. Otherwise the thread runs no Python.
    fn relist_due(&self, head: Option<u64>) -> bool {
        let Some(listed) = self.listed else {
            return true;
        };
        let since = listed.elapsed();
        head.is_some_and(|h| h != self.head)
            || (self.unbound && since >= HOLDER_RELIST)
            || since >= RELIST_AFTER
    }

    /// Whether a thread state read (`b`) is still `tid`'s.
    fn names_thread(&self, b: &[u8], tid: Tid, th: &Thread) -> bool {
        let l = &self.lay;
        if l.off[TS_NATIVE_TID] >= 0 {
            u64_in(b, l.o(TS_NATIVE_TID)) as i64 == tid.0 as i64
        } else {
            u64_in(b, l.o(TS_THREAD_ID)) == th.pthread
        }
    }

    /// List the interpreter's threads again, then read.
    fn read_listed(
        &mut self,
        tids: &[Tid],
        state: Option<(u32, Option<u64>)>,
    ) -> Result<Read, ReadError> {
        let blocks = self.list_threads()?;
        let (gen, holder) = match state {
            Some(s) => s,
            None => {
                let mut remote = vec![iov(self.lay.code_gen, 8)];
                if self.gil != 0 {
                    remote.push(iov(self.gil, GIL_READ));
                }
                let mut b = Vec::new();
                if !gather(self.pid, &remote, &mut b) {
                    return Err(ReadError::Inconsistent);
                }
                let holder = (self.gil != 0 && u32_in(&b, 8 + GIL_LOCKED) != 0)
                    .then(|| u64_in(&b, 8 + GIL_HOLDER));
                (u32_in(&b, 0), holder)
            }
        };
        let wanted = tids
            .iter()
            .filter_map(|t| blocks.get(t).map(|b| (*t, b.clone())))
            .collect();
        self.read_blocks(tids, wanted, gen, holder)
    }

    /// Walk the interpreter's list of thread states: tid → (thread state,
    /// what was read of it). Also finds the GIL's state on 3.12+.
    fn list_threads(&mut self) -> Result<HashMap<Tid, (u64, Vec<u8>)>, ReadError> {
        let l = self.lay.clone();
        let ts_read = l.ts_read();
        self.listed = Some(Instant::now());
        let mut b = Vec::new();
        if !gather(
            self.pid,
            &[iov(l.runtime + l.o(RT_INTERP_HEAD) as u64, 8)],
            &mut b,
        ) {
            return Err(ReadError::Inconsistent);
        }
        let interp = u64_in(&b, 0);
        if interp == 0 {
            return Err(ReadError::Inconsistent);
        }
        let mut remote = vec![iov(interp + l.o(INTERP_TSTATE_HEAD) as u64, 8)];
        if l.off[GIL_IN_INTERP] == 1 {
            remote.push(iov(interp + l.o(GIL_OFF) as u64, 8));
        }
        if !gather(self.pid, &remote, &mut b) {
            return Err(ReadError::Inconsistent);
        }
        let mut ts = u64_in(&b, 0);
        (self.interp, self.head) = (interp, ts);
        if l.off[GIL_IN_INTERP] == 1 {
            self.gil = u64_in(&b, 8);
        }
        let mut found: Vec<(u64, Vec<u8>)> = Vec::new();
        while ts != 0 {
            if found.len() >= MAX_WALK || !gather(self.pid, &[iov(ts, ts_read)], &mut b) {
                return Err(ReadError::Inconsistent);
            }
            found.push((ts, b.clone()));
            ts = u64_in(&b, l.o(TS_NEXT));
        }
        self.threads.clear();
        let mut out = HashMap::default();
        if l.off[TS_NATIVE_TID] >= 0 {
            self.unbound = found
                .iter()
                .any(|(_, blk)| u64_in(blk, l.o(TS_NATIVE_TID)) == 0);
            for (ts, blk) in found {
                let tid = Tid(u64_in(&blk, l.o(TS_NATIVE_TID)) as i32);
                let pthread = u64_in(&blk, l.o(TS_THREAD_ID));
                self.threads.insert(
                    tid,
                    Thread {
                        tstate: ts,
                        pthread,
                    },
                );
                out.insert(tid, (ts, blk));
            }
            return Ok(out);
        }
        // 3.9/3.10: the kernel's id from each thread's glibc descriptor,
        // where the agent found it; a lone thread is the main one.
        let pts: Vec<u64> = found
            .iter()
            .map(|(_, blk)| u64_in(blk, l.o(TS_THREAD_ID)))
            .collect();
        let tids: Vec<Option<Tid>> = if l.off[PTHREAD_TID] >= 0 {
            let remote: Vec<libc::iovec> = pts
                .iter()
                .map(|p| iov(p + l.o(PTHREAD_TID) as u64, 4))
                .collect();
            if !gather(self.pid, &remote, &mut b) {
                return Err(ReadError::Inconsistent);
            }
            (0..pts.len())
                .map(|i| Some(Tid(u32_in(&b, 4 * i) as i32)))
                .collect()
        } else if found.len() == 1 {
            vec![Some(Tid(self.pid.0))]
        } else {
            vec![None; found.len()]
        };
        for ((ts, blk), (tid, pthread)) in found.into_iter().zip(tids.into_iter().zip(pts)) {
            if let Some(tid) = tid {
                self.threads.insert(
                    tid,
                    Thread {
                        tstate: ts,
                        pthread,
                    },
                );
                out.insert(tid, (ts, blk));
            }
        }
        Ok(out)
    }

    /// Walk the frame chains of the thread states read and name their code
    /// objects.
    fn read_blocks(
        &mut self,
        tids: &[Tid],
        blocks: HashMap<Tid, (u64, Vec<u8>)>,
        gen: u32,
        holder: Option<u64>,
    ) -> Result<Read, ReadError> {
        let l = self.lay.clone();
        // Each wanted thread's innermost frame: in its state, or (3.11,
        // 3.12) in its _PyCFrame, read for all of them in one call.
        let mut firsts: Vec<(Tid, u64)> = Vec::new();
        let mut cframes = Vec::new();
        for tid in tids {
            let Some((_, b)) = blocks.get(tid) else {
                continue;
            };
            if l.off[TS_FRAME] >= 0 {
                firsts.push((*tid, u64_in(b, l.o(TS_FRAME))));
            } else {
                let cf = u64_in(b, l.o(TS_CFRAME));
                if cf == 0 {
                    return Err(ReadError::Inconsistent);
                }
                cframes.push((*tid, cf + l.o(CF_CURRENT) as u64));
            }
        }
        if !cframes.is_empty() {
            let remote: Vec<libc::iovec> = cframes.iter().map(|c| iov(c.1, 8)).collect();
            let mut b = Vec::new();
            if !gather(self.pid, &remote, &mut b) {
                return Err(ReadError::Inconsistent);
            }
            for (i, (tid, _)) in cframes.iter().enumerate() {
                firsts.push((*tid, u64_in(&b, 8 * i)));
            }
        }
        let mut walked: Vec<(Tid, Vec<Walked>)> = Vec::with_capacity(firsts.len());
        for (tid, f) in firsts {
            walked.push((tid, self.walk(f, usize::MAX)?));
        }
        // The GIL's holder, when it is not among them: its innermost
        // Python frame only.
        let mut holder_tid = None;
        let mut holder_walk = None;
        if let Some(h) = holder.filter(|h| *h != 0) {
            let find = |r: &PyReader| {
                r.threads
                    .iter()
                    .find(|(_, th)| th.tstate == h)
                    .map(|(t, _)| *t)
            };
            let mut tid = find(self);
            // A thread started since the list was walked (the list is
            // walked again only for a wanted thread it lacks): walk it
            // again, at most every HOLDER_RELIST.
            if tid.is_none()
                && self.listed.map_or(true, |t| t.elapsed() >= HOLDER_RELIST)
                && self.list_threads().is_ok()
            {
                tid = find(self);
            }
            match tid {
                Some(t) if walked.iter().any(|w| w.0 == t) => holder_tid = Some(t),
                Some(t) => {
                    let mut b = Vec::new();
                    let first = if l.off[TS_FRAME] >= 0 {
                        gather(self.pid, &[iov(h + l.o(TS_FRAME) as u64, 8)], &mut b)
                            .then(|| u64_in(&b, 0))
                    } else {
                        gather(self.pid, &[iov(h + l.o(TS_CFRAME) as u64, 8)], &mut b)
                            .then(|| u64_in(&b, 0))
                            .filter(|cf| *cf != 0)
                            .and_then(|cf| {
                                gather(self.pid, &[iov(cf + l.o(CF_CURRENT) as u64, 8)], &mut b)
                                    .then(|| u64_in(&b, 0))
                            })
                    };
                    holder_tid = Some(t);
                    // A running thread's chain changes as it is read: a
                    // failed walk names no function (as py-spy's would).
                    holder_walk = first.and_then(|f| self.walk(f, 1).ok());
                }
                // A holder not in the list read (it just started): unnamed.
                None => {}
            }
        }
        // Name every code object met.
        let mut codes: Vec<u64> = walked
            .iter()
            .flat_map(|w| w.1.iter().map(|f| f.code))
            .chain(holder_walk.iter().flatten().map(|f| f.code))
            .collect();
        codes.sort_unstable();
        codes.dedup();
        self.name_codes(&codes, gen)?;
        let mut out = Read::default();
        let named = |w: &[Walked]| -> Vec<(String, String, bool)> {
            let mut v: Vec<(String, String, bool)> = Vec::with_capacity(w.len());
            // Innermost first here; py-spy skips the frames of 3.13's
            // shim code ("<shim>", or no file) as it skips C-stack frames,
            // and marks the frame just inside one an entry.
            for f in w {
                let c = &self.codes[&f.code];
                if c.file.is_empty() || c.file == "<shim>" {
                    if let Some(last) = v.last_mut() {
                        last.2 = true;
                    }
                    continue;
                }
                v.push((c.name.clone(), c.file.clone(), f.entry));
            }
            // The outermost frame is always an entry (py-spy).
            if let Some(last) = v.last_mut() {
                last.2 = true;
            }
            v.reverse();
            v
        };
        for (tid, w) in &walked {
            out.frames.insert(*tid, named(w));
        }
        if let Some(t) = holder_tid {
            let innermost = match &holder_walk {
                Some(w) => named(w).pop(),
                None => out.frames.get(&t).and_then(|v| v.last().cloned()),
            };
            out.holder = Some((t, innermost.map(|f| (f.0, f.1))));
        }
        self.reads += 1;
        Ok(out)
    }

    /// A frame chain from `f`, innermost first, as py-spy walks it: frames
    /// of the C stack (3.12+ shims) skipped, the frame just inside one
    /// marked an entry. At most `keep` Python frames.
    fn walk(&self, mut f: u64, keep: usize) -> Result<Vec<Walked>, ReadError> {
        let l = &self.lay;
        let fr_read = l.o(FR_READ);
        let stack = l.off[FR_IS_ENTRY] >= 0 || l.off[OWNER_CSTACK] >= 0;
        let mut out: Vec<Walked> = Vec::new();
        let mut win: Vec<u8> = Vec::new();
        let (mut lo, mut hi) = (0u64, 0u64);
        let mut visited = 0;
        while f != 0 && out.len() < keep {
            visited += 1;
            if visited > MAX_WALK {
                return Err(ReadError::Inconsistent);
            }
            // `f` comes from the process's memory, read while it runs: an
            // address near the top of the space is a torn read, not a frame.
            let Some(f_end) = f.checked_add(fr_read as u64) else {
                return Err(ReadError::Inconsistent);
            };
            if !(f >= lo && f_end <= hi) {
                // 3.11+: the older frames usually lie just below, within
                // the page: read from the page's start (or a window) up to
                // this frame's end.
                let below = if stack {
                    (f & (WINDOW - 1)).min(WINDOW - fr_read as u64)
                } else {
                    0
                };
                let start = f - below;
                let len = (f - start) as usize + fr_read;
                if !gather(self.pid, &[iov(start, len)], &mut win) {
                    return Err(ReadError::Inconsistent);
                }
                lo = start;
                hi = start + len as u64;
            }
            let fr = &win[(f - lo) as usize..(f - lo) as usize + fr_read];
            let back = u64_in(fr, l.o(FR_BACK));
            let code = u64_in(fr, l.o(FR_CODE));
            let cstack = l.off[OWNER_CSTACK] >= 0
                && fr.get(l.o(FR_OWNER)).copied() == Some(l.off[OWNER_CSTACK] as u8);
            // 3.13: a frame without an executable is not a Python one.
            if cstack || code == 0 {
                if let Some(last) = out.last_mut() {
                    last.entry = true;
                }
                f = back;
                continue;
            }
            let entry = match l.minor {
                9 | 10 => true,
                11 => fr.get(l.o(FR_IS_ENTRY)).copied().unwrap_or(0) != 0,
                _ => false,
            };
            out.push(Walked { code, entry });
            f = back;
        }
        Ok(out)
    }

    /// Make sure every code object in `codes` is named in the cache.
    fn name_codes(&mut self, codes: &[u64], gen: u32) -> Result<(), ReadError> {
        let l = self.lay.clone();
        // While no code object was freed since the cache was checked, an
        // address names the same object: no read. The counter is odd while
        // one is being freed, and 0 where the agent could not count.
        let trusted = gen != 0 && gen % 2 == 0 && gen == self.gen;
        let check: Vec<u64> = codes
            .iter()
            .copied()
            .filter(|c| !trusted || !self.codes.contains_key(c))
            .collect();
        if check.is_empty() {
            return Ok(());
        }
        if !trusted {
            // What was checked at another generation is checked again.
            self.gen = 0;
        }
        let co_read = l.o(CO_READ);
        let remote: Vec<libc::iovec> = check.iter().map(|c| iov(*c, co_read)).collect();
        let mut b = Vec::new();
        if !gather(self.pid, &remote, &mut b) {
            return Err(ReadError::Inconsistent);
        }
        let mut strings: Vec<(u64, u64, u64)> = Vec::new();
        for (i, c) in check.iter().enumerate() {
            let h = &b[i * co_read..(i + 1) * co_read];
            if u64_in(h, 8) != l.code_type {
                return Err(ReadError::Inconsistent);
            }
            let (np, fp) = (u64_in(h, l.o(CO_NAME)), u64_in(h, l.o(CO_FILE)));
            let same = self
                .codes
                .get(c)
                .is_some_and(|k| k.name_ptr == np && k.file_ptr == fp);
            if !same {
                strings.push((*c, np, fp));
            }
        }
        if !strings.is_empty() {
            let ptrs: Vec<u64> = strings.iter().flat_map(|s| [s.1, s.2]).collect();
            let texts = self.read_strings(&ptrs)?;
            for (k, (c, np, fp)) in strings.into_iter().enumerate() {
                self.codes.insert(
                    c,
                    Code {
                        name_ptr: np,
                        file_ptr: fp,
                        name: texts[2 * k].clone(),
                        file: texts[2 * k + 1].clone(),
                    },
                );
            }
        }
        if gen != 0 && gen % 2 == 0 {
            if !trusted {
                // Every entry is checked at this generation only if all
                // were; keep the cache small and exact instead.
                self.codes.retain(|c, _| codes.binary_search(c).is_ok());
            }
            self.gen = gen;
        }
        Ok(())
    }

    /// Python str objects' text: heads in one call, characters in another.
    fn read_strings(&self, ptrs: &[u64]) -> Result<Vec<String>, ReadError> {
        let l = &self.lay;
        let head = l.o(STR_COMPACT);
        if ptrs.contains(&0) {
            return Err(ReadError::Inconsistent);
        }
        let remote: Vec<libc::iovec> = ptrs.iter().map(|p| iov(*p, head)).collect();
        let mut b = Vec::new();
        if !gather(self.pid, &remote, &mut b) {
            return Err(ReadError::Inconsistent);
        }
        let mut kinds = Vec::with_capacity(ptrs.len());
        let mut remote = Vec::with_capacity(ptrs.len());
        for (i, p) in ptrs.iter().enumerate() {
            let h = &b[i * head..(i + 1) * head];
            let len = u64_in(h, 16) as i64;
            let state = u32_in(h, 32);
            let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
            if compact == 0 || !matches!(kind, 1 | 2 | 4) || !(0..MAX_STR_CHARS).contains(&len) {
                return Err(ReadError::Inconsistent);
            }
            let data = p + if ascii == 1 {
                l.o(STR_ASCII)
            } else {
                l.o(STR_COMPACT)
            } as u64;
            kinds.push((kind as u8, ascii == 1, len as usize * kind as usize));
            if len > 0 {
                remote.push(iov(data, len as usize * kind as usize));
            }
        }
        if !remote.is_empty() && !gather(self.pid, &remote, &mut b) {
            return Err(ReadError::Inconsistent);
        }
        let mut at = 0;
        let mut out = Vec::with_capacity(ptrs.len());
        for (kind, ascii, n) in kinds {
            let s = &b[at..at + n];
            at += n;
            let text = if ascii {
                String::from_utf8_lossy(s).into_owned()
            } else {
                super::pyagent::decode_str(s, kind).ok_or(ReadError::Inconsistent)?
            };
            out.push(text);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header page with the ring's magic and a reader block of 3.12's
    /// layout parses; a torn or foreign one does not.
    #[test]
    fn the_reader_block_parses_and_insane_ones_are_refused() {
        let mut page = vec![0u8; 4096];
        page[0..8].copy_from_slice(&RING_MAGIC.to_ne_bytes());
        let b = READER_OFFSET;
        page[b..b + 8].copy_from_slice(&READER_MAGIC.to_ne_bytes());
        page[b + 8..b + 12].copy_from_slice(&READER_VERSION.to_ne_bytes());
        page[b + 12..b + 16].copy_from_slice(&12u32.to_ne_bytes());
        let offs: [i32; N_OFFSETS] = [
            40, 72, 8, 136, 144, 1, 384, -1, -1, 56, 0, 8, 0, 70, -1, 3, 72, 128, 112, 136, 40, 56,
        ];
        for (i, o) in offs.iter().enumerate() {
            page[b + 56 + 4 * i..b + 60 + 4 * i].copy_from_slice(&o.to_ne_bytes());
        }
        let l = Layout::parse(&page).expect("parses");
        assert_eq!(l.minor, 12);
        assert_eq!(l.ts_read(), 152);
        page[b + 56 + 4 * FR_READ..b + 60 + 4 * FR_READ].copy_from_slice(&4i32.to_ne_bytes());
        assert!(
            Layout::parse(&page).is_none(),
            "a frame read shorter than its fields"
        );
        page[b..b + 8].fill(0);
        assert!(Layout::parse(&page).is_none(), "no magic: not written yet");
    }
}
