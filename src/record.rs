//! The recording: one gzip-compressed stream of JSON lines in
//! `recording/events.jsonl.gz`, written by one thread as events arrive.
//!
//! Why this shape: collectors never block on disk (bounded channel, one
//! writer); memory stays bounded whatever the run length; the stream is
//! sync-flushed every second so a killed gpuprof leaves a readable prefix; and
//! gzip keeps a 16-thread hour well under the 50 MB budget (JSON lines of
//! repeated keys compress ~10x).

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;

use crate::event::{Event, Header, RECORDING_VERSION};

pub const RECORDING_DIR: &str = "recording";
pub const EVENTS_FILE: &str = "events.jsonl.gz";
pub const FORMAT_NAME: &str = "gpuprof-recording";

/// Events waiting for the writer. At ~100 bytes each this bounds the queue
/// at a few MB; collectors that find it full drop the event and count it.
const CHANNEL_CAPACITY: usize = 1 << 16;
const FLUSH_EVERY: Duration = Duration::from_secs(1);

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
}

/// The writer thread's handle.
pub struct Writer {
    thread: std::thread::JoinHandle<Result<WriterStats>>,
}

#[derive(Debug, Clone, Copy)]
pub struct WriterStats {
    pub events: u64,
    pub compressed_bytes: u64,
}

/// Sees every event, in order, on the writer thread just before it is
/// written (the live figures: `crate::live`). Must be cheap.
pub type Tap = Box<dyn FnMut(&Event) + Send>;

/// Start the writer on `dir/recording/`. Returns the sink for collectors and
/// the writer handle; the writer ends when every `Sink` is dropped.
pub fn start_writer(out_dir: &Path) -> Result<(Sink, Writer)> {
    start_writer_with_tap(out_dir, None)
}

/// [`start_writer`], with a tap that sees every event.
pub fn start_writer_with_tap(out_dir: &Path, tap: Option<Tap>) -> Result<(Sink, Writer)> {
    let rec_dir = out_dir.join(RECORDING_DIR);
    std::fs::create_dir_all(&rec_dir)
        .with_context(|| format!("cannot create {}", rec_dir.display()))?;
    let path = rec_dir.join(EVENTS_FILE);
    let file = File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
    let (tx, rx) = std::sync::mpsc::sync_channel(CHANNEL_CAPACITY);
    let sink = Sink {
        tx,
        dropped: Arc::new(AtomicU64::new(0)),
    };
    let thread = std::thread::Builder::new()
        .name("gpuprof-writer".into())
        .spawn(move || write_loop(file, rx, tap))
        .context("cannot start the recording writer thread")?;
    Ok((sink, Writer { thread }))
}

impl Writer {
    /// Wait for the writer to drain the queue and close the file.
    pub fn finish(self) -> Result<WriterStats> {
        match self.thread.join() {
            Ok(r) => r,
            Err(_) => bail!("the recording writer thread panicked"),
        }
    }
}

fn write_loop(file: File, rx: Receiver<Event>, mut tap: Option<Tap>) -> Result<WriterStats> {
    let mut enc = GzEncoder::new(BufWriter::with_capacity(1 << 16, file), Compression::new(6));
    let mut line = Vec::with_capacity(512);
    let mut events = 0u64;
    let mut last_flush = Instant::now();
    loop {
        let ev = match rx.recv_timeout(FLUSH_EVERY) {
            Ok(ev) => Some(ev),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        };
        if let Some(ev) = ev {
            if let Some(tap) = tap.as_mut() {
                tap(&ev);
            }
            line.clear();
            serde_json::to_writer(&mut line, &ev)?;
            line.push(b'\n');
            enc.write_all(&line)?;
            events += 1;
        }
        if last_flush.elapsed() >= FLUSH_EVERY {
            // A sync flush ends the deflate block so everything so far can
            // be decoded even if gpuprof is killed before the trailer.
            enc.flush()?;
            last_flush = Instant::now();
        }
    }
    let mut inner = enc.finish()?;
    inner.flush()?;
    let file = inner.into_inner().map_err(|e| e.into_error())?;
    file.sync_all().ok();
    let compressed_bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    Ok(WriterStats {
        events,
        compressed_bytes,
    })
}

/// Errors opening a recording, each with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{0}: no such directory")]
    Missing(PathBuf),
    #[error("{0} is not a gpuprof output folder: it has no {RECORDING_DIR}/{EVENTS_FILE} (pass the folder that `gpuprof -- CMD` created)")]
    NotARecording(PathBuf),
    #[error("{0}: not a gpuprof recording (its first line is not a gpuprof header)")]
    BadHeader(PathBuf),
    #[error("{path}: recording format version {found} is newer than this gpuprof understands (up to {supported}); upgrade gpuprof to read it")]
    TooNew {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("cannot read {0}: {1}")]
    Io(PathBuf, std::io::Error),
}

/// A recording opened for reading.
pub struct RecordingReader {
    pub header: Header,
    pub path: PathBuf,
    lines: std::io::Lines<BufReader<MultiGzDecoder<BufReader<File>>>>,
    /// Set when the stream ended early (gpuprof killed, file cut).
    pub truncated: Option<String>,
    line_no: u64,
}

/// Find the recording inside an output folder (or the recording folder itself).
pub fn events_path(dir: &Path) -> Result<PathBuf, OpenError> {
    if !dir.is_dir() {
        return Err(OpenError::Missing(dir.to_path_buf()));
    }
    for cand in [
        dir.join(RECORDING_DIR).join(EVENTS_FILE),
        dir.join(EVENTS_FILE),
    ] {
        if cand.is_file() {
            return Ok(cand);
        }
    }
    Err(OpenError::NotARecording(dir.to_path_buf()))
}

impl RecordingReader {
    pub fn open(dir: &Path) -> Result<RecordingReader, OpenError> {
        let path = events_path(dir)?;
        let file = File::open(&path).map_err(|e| OpenError::Io(path.clone(), e))?;
        let dec = MultiGzDecoder::new(BufReader::new(file));
        let mut lines = BufReader::with_capacity(1 << 16, dec).lines();
        let first = match lines.next() {
            Some(Ok(l)) => l,
            _ => return Err(OpenError::BadHeader(path)),
        };
        let header = match serde_json::from_str::<Event>(&first) {
            Ok(Event::Header(h)) if h.format == FORMAT_NAME => h,
            _ => {
                // A newer version may have a header this version cannot parse;
                // read just the version to give the right advice.
                let v: Option<(String, u32)> = serde_json::from_str::<serde_json::Value>(&first)
                    .ok()
                    .and_then(|v| {
                        Some((
                            v.get("format")?.as_str()?.to_string(),
                            v.get("version")?.as_u64()? as u32,
                        ))
                    });
                match v {
                    Some((f, found)) if f == FORMAT_NAME && found > RECORDING_VERSION => {
                        return Err(OpenError::TooNew {
                            path,
                            found,
                            supported: RECORDING_VERSION,
                        })
                    }
                    _ => return Err(OpenError::BadHeader(path)),
                }
            }
        };
        if header.version > RECORDING_VERSION {
            return Err(OpenError::TooNew {
                path,
                found: header.version,
                supported: RECORDING_VERSION,
            });
        }
        Ok(RecordingReader {
            header,
            path,
            lines,
            truncated: None,
            line_no: 1,
        })
    }
}

impl Iterator for RecordingReader {
    type Item = Event;
    fn next(&mut self) -> Option<Event> {
        if self.truncated.is_some() {
            return None;
        }
        loop {
            match self.lines.next() {
                None => return None,
                Some(Err(e)) => {
                    self.truncated = Some(format!(
                        "{} ends early after line {} ({}); outputs cover the readable part only",
                        self.path.display(),
                        self.line_no,
                        e
                    ));
                    return None;
                }
                Some(Ok(l)) => {
                    self.line_no += 1;
                    match serde_json::from_str::<Event>(&l) {
                        Ok(ev) => return Some(ev),
                        Err(e) => {
                            // A cut line is the normal end of a truncated stream;
                            // an unknown event from a newer minor writer is skipped.
                            if e.is_eof() || e.is_syntax() {
                                self.truncated = Some(format!(
                                    "{} is cut at line {}; outputs cover the readable part only",
                                    self.path.display(),
                                    self.line_no
                                ));
                                return None;
                            }
                            continue;
                        }
                    }
                }
            }
        }
    }
}
