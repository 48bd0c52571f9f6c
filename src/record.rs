//! The recording: gzip-compressed JSON lines in
//! `recording/events.jsonl.gz`, written by one thread as events arrive.
//!
//! Why this shape: collectors never block on disk (bounded channel, one
//! writer); memory stays bounded whatever the run length; gzip keeps a
//! 16-thread hour well under the 50 MB budget (JSON lines of repeated keys
//! compress ~10x). The stream is a chain of independent gzip members, one
//! per second of events: a killed gpuprof leaves every finished second
//! readable, and a damaged byte costs only its own member (see
//! [`reader`]). Any gzip reader (`zcat`, `MultiGzDecoder`) reads the file
//! as one stream.
//!
//! A write error (a full disk, a quota) never reaches the job: the file is
//! cut back to its last complete member, which stays readable; later events
//! are counted as lost and the error goes into the footer, so the outputs
//! say what is missing.

mod check;
mod reader;

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use flate2::write::GzEncoder;
use flate2::Compression;

use crate::event::{Event, MonoNs};
use crate::outdir::{OutDir, Reserve};
pub use check::repair_header;
pub use reader::{events_path, Damage, OpenError, RecordingReader, MAX_LINE};

pub const RECORDING_DIR: &str = "recording";
pub const EVENTS_FILE: &str = "events.jsonl.gz";
/// A copy of the recording's header line, beside it: the header's block is
/// the one the whole recording cannot be read without.
pub const HEADER_COPY_FILE: &str = "header.json";
pub use crate::event::FORMAT_NAME;

/// Events waiting for the writer; collectors that find it full drop the
/// event and count it (lifecycle events wait for room). The queue's slots
/// are allocated and written when it is created, 368 bytes each: 65,536 of
/// them were 24 MB, and 2% of a short loader run's samples against 7% for
/// gpuprof's whole main thread (start-up and report). 16,384 (6 MB)
/// still hold 200 ms of 80,000 events a second; a loader job sends a few
/// hundred a second (samples travel in batches), a few thousand at start.
const CHANNEL_CAPACITY: usize = 1 << 14;
/// A gzip member ends after this long, or this much uncompressed data.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
const MEMBER_MAX_BYTES: usize = 4 << 20;
/// The writer wakes at most this often while events keep coming (the
/// queue holds [`CHANNEL_CAPACITY`] events meanwhile).
const BATCH_PAUSE: Duration = Duration::from_millis(200);

/// Where collectors send their events. Cheap to clone; never blocks.
#[derive(Clone)]
pub struct Sink {
    tx: SyncSender<Event>,
    dropped: Arc<AtomicU64>,
}

impl Sink {
    /// Queue an event for the writer. A full queue (the disk cannot keep up)
    /// drops the event and counts it rather than stalling a collector.
    pub fn send(&self, ev: Event) {
        match self.tx.try_send(ev) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Queue an event that must not be lost (header, footer, process
    /// lifecycle): waits for room instead of dropping.
    pub fn send_blocking(&self, ev: Event) {
        let _ = self.tx.send(ev);
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// A sink onto a channel of the caller's (a collector's unit test reads
    /// what it sends).
    #[cfg(test)]
    pub(crate) fn from_parts(tx: SyncSender<Event>, dropped: Arc<AtomicU64>) -> Sink {
        Sink { tx, dropped }
    }
}

/// The writer thread's handle.
pub struct Writer {
    thread: std::thread::JoinHandle<WriterStats>,
    live: Option<OwnedFd>,
    /// The output folder the recording is in.
    out: OutDir,
    reserve: Option<Reserve>,
}

#[derive(Debug, Clone, Default)]
pub struct WriterStats {
    pub events: u64,
    pub compressed_bytes: u64,
    /// The first write error, in words with the time it happened; events
    /// after it are not in the recording.
    pub error: Option<String>,
    /// Events that could not be written after the error.
    pub lost_events: u64,
}

/// Sees every event, in order, on the writer thread just before it is
/// written (the live figures: `crate::live`). Must be cheap.
pub type Tap = Box<dyn FnMut(&Event) + Send>;

/// Start the writer in `out/recording/` (made here, or already made by the
/// caller's claim of the folder; a recording in it is never written over),
/// with a tap that sees every event. Returns the sink for collectors and the
/// writer handle; the writer ends when every `Sink` is dropped.
pub fn start_writer(out: &OutDir, tap: Option<Tap>) -> Result<(Sink, Writer)> {
    let rec = match out.create_subdir(RECORDING_DIR) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => out.open_subdir(RECORDING_DIR),
        r => r,
    }
    .with_context(|| format!("cannot create {}", out.display(RECORDING_DIR)))?;
    let file = rec
        .create_new(EVENTS_FILE)
        .with_context(|| format!("cannot create {}", rec.display(EVENTS_FILE)))?;
    // Best effort: without it the recording is as it was before copies.
    let header_copy = rec.create_new(HEADER_COPY_FILE).ok();
    // Held until the session's outputs are in place: `gpuprof report` sees
    // the lock and knows the recording is live.
    let live: OwnedFd = file.try_clone()?.into();
    // SAFETY: flock on a valid descriptor; nobody else has this new file.
    unsafe {
        libc::flock(live.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB);
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(CHANNEL_CAPACITY);
    let sink = Sink {
        tx,
        dropped: Arc::new(AtomicU64::new(0)),
    };
    let thread = std::thread::Builder::new()
        .name("gpuprof-writer".into())
        .spawn(move || write_loop(file, header_copy, rx, tap))
        .context("cannot start the recording writer thread")?;
    Ok((
        sink,
        Writer {
            thread,
            live: Some(live),
            out: out.try_clone()?,
            reserve: None,
        },
    ))
}

/// [`start_writer`] in the output folder at `out` (opened and checked
/// again, as [`OutDir::open`] does), with space kept for the final outputs
/// where the disk has it.
pub fn start_writer_with_tap(out: &Path, tap: Option<Tap>) -> Result<(Sink, Writer)> {
    let (dir, _) = OutDir::open(out, false)?;
    let reserve = Reserve::create(&dir).ok();
    let (sink, mut writer) = start_writer(&dir, tap)?;
    writer.hold_reserve(reserve);
    Ok((sink, writer))
}

impl Writer {
    /// The lock that marks the recording live; drop it once the session's
    /// outputs are written.
    pub fn take_live_lock(&mut self) -> Option<OwnedFd> {
        self.live.take()
    }

    /// Keep `reserve` until [`Writer::take_reserve`].
    pub fn hold_reserve(&mut self, reserve: Option<Reserve>) {
        self.reserve = reserve;
    }

    /// The space kept for the final outputs; dropping it frees the space.
    pub fn take_reserve(&mut self) -> Option<Reserve> {
        self.reserve.take()
    }

    /// Wait for the writer to drain the queue and close the file. Returns
    /// that and the output folder.
    pub fn finish(self) -> (Result<WriterStats>, OutDir) {
        self.thread.thread().unpark();
        let r = match self.thread.join() {
            Ok(r) => Ok(r),
            Err(_) => Err(anyhow::anyhow!("the recording writer thread panicked")),
        };
        (r, self.out)
    }
}

/// Whether a recording session still holds the recording in `dir` (it is
/// being written, or the session is writing its outputs).
pub fn session_is_live(dir: &Path) -> bool {
    let Ok(path) = events_path(dir) else {
        return false;
    };
    let Ok(f) = File::open(path) else {
        return false;
    };
    // SAFETY: flock on a valid descriptor, released when `f` closes.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)
}

/// Gzip members written to the file one at a time.
struct Members {
    file: File,
    /// End of the last member written whole.
    good_len: u64,
    enc: GzEncoder<Vec<u8>>,
    in_member: u64,
    member_bytes: usize,
    member_max_t: Option<MonoNs>,
    /// Latest event time in the file.
    written_t: Option<MonoNs>,
    start: Option<MonoNs>,
    stats: WriterStats,
    /// Encoded events not yet handed to the compressor.
    line: Vec<u8>,
}

/// Level 4: on the first 7 s of a loader job's recording (0.77 MB of
/// events, most of a short run's volume: every stack is new), level 6 took
/// 10.6 ms for 97.8 kB, level 4 6.3 ms for 102.0 kB, level 1 3.2 ms for
/// 160 kB. Level 4 is most of level 6's compression at 60% of its CPU.
fn new_encoder() -> GzEncoder<Vec<u8>> {
    GzEncoder::new(Vec::with_capacity(1 << 16), Compression::new(4))
}

/// Events are handed to the compressor in batches of about this many bytes
/// (each call into it has a fixed cost; one per event added up).
const ENCODE_BATCH_BYTES: usize = 32 << 10;

impl Members {
    fn push(&mut self, ev: &Event) {
        if self.stats.error.is_some() {
            self.stats.lost_events += 1;
            return;
        }
        if let Event::Header(h) = ev {
            self.start = Some(h.start);
        }
        let before = self.line.len();
        if serde_json::to_writer(&mut self.line, ev).is_err() {
            self.line.truncate(before);
            return;
        }
        self.line.push(b'\n');
        self.in_member += 1;
        self.member_bytes += self.line.len() - before;
        if self.line.len() >= ENCODE_BATCH_BYTES {
            // Writing into memory cannot fail.
            let _ = self.enc.write_all(&self.line);
            self.line.clear();
        }
        if let Some(t) = ev.time() {
            if self.member_max_t.map_or(true, |m| t > m) {
                self.member_max_t = Some(t);
            }
        }
        if self.member_bytes >= MEMBER_MAX_BYTES {
            self.end_member();
        }
    }

    /// Finish the current member and append it to the file. On failure the
    /// file is cut back to its last whole member.
    fn end_member(&mut self) {
        if self.in_member == 0 || self.stats.error.is_some() {
            return;
        }
        let _ = self.enc.write_all(&self.line);
        self.line.clear();
        let enc = std::mem::replace(&mut self.enc, new_encoder());
        let n = std::mem::take(&mut self.in_member);
        self.member_bytes = 0;
        let max_t = self.member_max_t.take();
        let res = enc.finish().and_then(|bytes| {
            self.file.write_all(&bytes)?;
            Ok(bytes.len() as u64)
        });
        match res {
            Ok(len) => {
                self.good_len += len;
                self.stats.events += n;
                if max_t > self.written_t {
                    self.written_t = max_t;
                }
            }
            Err(e) => {
                let _ = self.file.set_len(self.good_len);
                let _ = self.file.seek(SeekFrom::Start(self.good_len));
                self.stats.lost_events += n;
                let at = match (self.written_t, self.start) {
                    (Some(t), Some(s)) => format!(" after {:.1} s", t.secs_since(s)),
                    _ => String::new(),
                };
                self.stats.error = Some(format!(
                    "writing the recording failed{at} ({e}); events after that were not recorded"
                ));
            }
        }
    }
}

fn write_loop(
    file: File,
    mut header_copy: Option<File>,
    rx: Receiver<Event>,
    mut tap: Option<Tap>,
) -> WriterStats {
    let mut m = Members {
        file,
        good_len: 0,
        enc: new_encoder(),
        in_member: 0,
        member_bytes: 0,
        member_max_t: None,
        written_t: None,
        start: None,
        stats: WriterStats::default(),
        line: Vec::with_capacity(ENCODE_BATCH_BYTES + 4096),
    };
    let mut member_start = Instant::now();
    // Updated at each block, so that the footer's figures (taken while
    // this thread still runs) hold it up to the last second.
    let cost = crate::selfcost::Charge::new("recording writer");
    loop {
        let got = match rx.try_recv() {
            Ok(ev) => Ok(ev),
            Err(TryRecvError::Disconnected) => Err(RecvTimeoutError::Disconnected),
            Err(TryRecvError::Empty) => {
                // Let events gather rather than wake for each one: a
                // wake-up per event costs a futex call and two context
                // switches, which on a job that keeps every core busy are
                // taken from the job (thousands per second at the start of
                // a run, when every stack is new).
                // Parked, not slept: `Writer::finish` unparks it, so the
                // end of a run does not wait out the pause.
                let wait = FLUSH_EVERY.saturating_sub(member_start.elapsed());
                std::thread::park_timeout(BATCH_PAUSE.min(wait));
                let wait = FLUSH_EVERY.saturating_sub(member_start.elapsed());
                rx.recv_timeout(wait)
            }
        };
        if let (Ok(ev), Some(tap)) = (&got, tap.as_mut()) {
            tap(ev);
        }
        match got {
            Ok(Event::Footer(mut f)) => {
                m.end_member();
                if let Some(err) = m.stats.error.take() {
                    // The end record says what is missing; with the data
                    // cut at the error, the recording ends there.
                    f.recording_error = Some(err.clone());
                    let stop = m.written_t.unwrap_or(f.t);
                    m.push(&Event::WindowStop { t: stop });
                    m.push(&Event::Footer(f));
                    m.end_member();
                    m.stats.error = Some(err);
                } else {
                    m.push(&Event::Footer(f));
                }
            }
            Ok(ev) => {
                let header = matches!(ev, Event::Header(_));
                if let (true, Some(mut f)) = (header, header_copy.take()) {
                    // The same line as in the recording (the reader checks it
                    // as it checks the first line there).
                    let mut line = serde_json::to_vec(&ev).unwrap_or_default();
                    line.push(b'\n');
                    let _ = f.write_all(&line);
                }
                m.push(&ev);
                // The header gets a block of its own: whatever happens to
                // the rest, the recording can be opened.
                if header {
                    m.end_member();
                    member_start = Instant::now();
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if member_start.elapsed() >= FLUSH_EVERY {
            m.end_member();
            member_start = Instant::now();
            cost.update();
        }
    }
    m.end_member();
    if m.stats.error.is_none() {
        if let Err(e) = m.file.sync_all() {
            m.stats.error = Some(format!("the recording could not be saved ({e})"));
        }
    }
    m.stats.compressed_bytes = m.good_len;
    m.stats
}
