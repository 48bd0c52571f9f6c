//! Reading a recording, tolerant of local damage.
//!
//! The writer ends a gzip member every second (see [`super::write_loop`]),
//! so a recording is a chain of small, independently decodable blocks,
//! each with its own CRC. A flipped byte breaks the deflate stream or the
//! checksum of its own block only: the reader drops that block whole (about
//! a second of events), finds the next gzip header and goes on. A block is
//! checked before any of its events is used; blocks larger than
//! [`VERIFY_LIMIT`] (recordings of earlier versions are one stream) are used
//! as they are decoded.
//!
//! Within a block, a line that is not an event is skipped and counted, and
//! lines longer than [`MAX_LINE`] are skipped without being held in memory.
//! Every event then passes [`super::check::Checker`], which drops impossible
//! values and duplicated records. [`Damage`] counts everything that was left
//! out, and [`Damage::warnings`] says it in words.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use flate2::bufread::GzDecoder;

use super::check::Checker;
use super::{EVENTS_FILE, FORMAT_NAME, HEADER_COPY_FILE, RECORDING_DIR};
use crate::event::{Event, Header, MonoNs, RECORDING_VERSION};

/// Longest line read; longer ones are skipped (the largest real events, a
/// process with a huge command line or a chunk of symbol names, are far
/// below).
pub const MAX_LINE: usize = 16 << 20;
/// Blocks up to this size (decompressed) are checked whole before use.
pub const VERIFY_LIMIT: usize = 16 << 20;
const CHUNK: usize = 1 << 16;

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

/// What could not be used from a recording.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Damage {
    /// Compressed blocks that failed to decode or their checksum, skipped.
    pub bad_blocks: u64,
    /// Compressed bytes skipped with them.
    pub lost_bytes: u64,
    /// Size of the recording file.
    pub file_bytes: u64,
    /// Time spans whose events were in skipped blocks: (last event before,
    /// first event after), either unknown at the ends.
    pub gaps: Vec<(Option<MonoNs>, Option<MonoNs>)>,
    /// Lines that were not events (damaged text), skipped.
    pub bad_lines: u64,
    /// Lines longer than [`MAX_LINE`], skipped.
    pub long_lines: u64,
    /// Events of kinds this gpuprof does not know (a newer writer).
    pub unknown_events: u64,
    /// A large block used before its checksum could be verified failed it.
    pub unverified_failures: u64,
    /// The file ends inside a block (gpuprof was killed while writing, or
    /// the file was cut): bytes of it that could not be decoded.
    pub cut: bool,
    /// Events dropped by the value checks, by reason.
    pub invalid: std::collections::BTreeMap<String, u64>,
    /// Records seen twice (or out of their order), ignored.
    pub duplicates: u64,
    /// The header's own block was damaged: the header was read from the
    /// copy beside the recording.
    pub header_from_copy: bool,
}

impl Damage {
    pub fn is_clean(&self) -> bool {
        self.bad_blocks == 0
            && self.bad_lines == 0
            && self.long_lines == 0
            && self.unverified_failures == 0
            && self.invalid.is_empty()
            && self.duplicates == 0
    }

    /// One line per kind of damage, with how much was lost. `rel` turns a
    /// time into seconds from the start of the recording.
    pub fn warnings(&self, rel: impl Fn(MonoNs) -> f64) -> Vec<String> {
        let mut out = Vec::new();
        if self.bad_blocks > 0 {
            let spans: Vec<String> = self
                .gaps
                .iter()
                .take(5)
                .map(|g| match g {
                    (Some(a), Some(b)) => format!("{:.1}–{:.1} s", rel(*a), rel(*b)),
                    (Some(a), None) => format!("after {:.1} s", rel(*a)),
                    (None, Some(b)) => format!("before {:.1} s", rel(*b)),
                    (None, None) => "unknown times".into(),
                })
                .collect();
            let more = if self.gaps.len() > 5 {
                format!(" and {} more", self.gaps.len() - 5)
            } else {
                String::new()
            };
            out.push(format!(
                "the recording is damaged: {} block(s) could not be decoded and were skipped ({} of {} compressed bytes, {:.2}%); events are missing at {}{more}",
                self.bad_blocks,
                self.lost_bytes,
                self.file_bytes,
                self.lost_bytes as f64 * 100.0 / self.file_bytes.max(1) as f64,
                spans.join(", ")
            ));
        }
        if self.header_from_copy {
            out.push(format!(
                "the recording's header could not be read from it: its copy ({RECORDING_DIR}/{HEADER_COPY_FILE}) was used"
            ));
        }
        if self.unverified_failures > 0 {
            out.push(format!(
                "{} large block(s) of this (older-format) recording failed their checksum after their events were read: figures may hold damaged values, and the rest of such a block was skipped",
                self.unverified_failures
            ));
        }
        if self.bad_lines > 0 || self.long_lines > 0 {
            out.push(format!(
                "{} damaged line(s) and {} line(s) longer than {} MB were skipped",
                self.bad_lines,
                self.long_lines,
                MAX_LINE >> 20
            ));
        }
        if !self.invalid.is_empty() {
            let n: u64 = self.invalid.values().sum();
            let why: Vec<String> = self
                .invalid
                .iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect();
            out.push(format!(
                "{n} event(s) with impossible values were left out: {}",
                why.join("; ")
            ));
        }
        if self.duplicates > 0 {
            out.push(format!(
                "{} duplicated or out-of-order record(s) were ignored",
                self.duplicates
            ));
        }
        out
    }
}

/// A reader that counts the bytes taken from it.
struct Counted<R> {
    inner: R,
    n: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        let k = self.inner.read(b)?;
        self.n += k as u64;
        Ok(k)
    }
}

impl<R: BufRead> BufRead for Counted<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.inner.fill_buf()
    }
    fn consume(&mut self, k: usize) {
        self.n += k as u64;
        self.inner.consume(k)
    }
}

type Input = Counted<BufReader<File>>;

/// Decompressed data from the blocks, member by member, with damaged
/// members skipped.
struct Blocks {
    /// Positioned at `base + n` bytes of the file.
    input: Option<Input>,
    base: u64,
    file_len: u64,
    /// A large member being read as a stream (not verified).
    streaming: Option<(u64, GzDecoder<Input>)>,
    damage: Damage,
    /// A damaged stretch began here and no good block followed yet.
    lost_from: Option<u64>,
    /// The caller should close a time gap at its next event.
    pub gap_open: bool,
}

enum Piece {
    /// Decoded bytes; `end_of_member`: a line cut at the end is damage.
    Data {
        bytes: Vec<u8>,
        end_of_member: bool,
    },
    End,
}

impl Blocks {
    fn pos(&self) -> u64 {
        self.base + self.input.as_ref().map_or(0, |i| i.n)
    }

    fn input_at(&mut self, off: u64) -> io::Result<()> {
        let mut f = match self.input.take() {
            Some(i) => i.inner.into_inner(),
            None => return Err(io::Error::other("no input")),
        };
        f.seek(SeekFrom::Start(off))?;
        self.input = Some(Counted {
            inner: BufReader::with_capacity(CHUNK, f),
            n: 0,
        });
        self.base = off;
        Ok(())
    }

    /// The offset of the next gzip member header at or after `from`.
    fn find_header(&mut self, from: u64) -> io::Result<Option<u64>> {
        self.input_at(from)?;
        let input = self.input.as_mut().expect("input");
        let mut off = from;
        let mut carry: Vec<u8> = Vec::new();
        loop {
            let buf = input.inner.fill_buf()?;
            if buf.is_empty() {
                return Ok(None);
            }
            let mut hay = std::mem::take(&mut carry);
            let hay_start = off - hay.len() as u64;
            hay.extend_from_slice(buf);
            let n = buf.len();
            input.inner.consume(n);
            off += n as u64;
            if let Some(i) = hay.windows(3).position(|w| w == [0x1f, 0x8b, 0x08]) {
                return Ok(Some(hay_start + i as u64));
            }
            carry = hay[hay.len().saturating_sub(2)..].to_vec();
        }
    }

    /// Record that bytes from `from` up to the next good member are lost.
    fn lose_from(&mut self, from: u64) {
        if self.lost_from.is_none() {
            self.lost_from = Some(from);
            self.damage.bad_blocks += 1;
            self.gap_open = true;
        }
    }

    fn close_loss(&mut self, at: u64) {
        if let Some(from) = self.lost_from.take() {
            self.damage.lost_bytes += at.saturating_sub(from);
        }
    }

    /// Skip to the next member after a damaged one that began at `start`.
    fn resync(&mut self, start: u64) -> io::Result<bool> {
        self.lose_from(start);
        match self.find_header(start + 1)? {
            Some(off) => {
                self.input_at(off)?;
                Ok(true)
            }
            None => {
                self.close_loss(self.file_len);
                Ok(false)
            }
        }
    }

    fn next_piece(&mut self) -> io::Result<Piece> {
        if let Some((start, mut dec)) = self.streaming.take() {
            let mut buf = vec![0u8; CHUNK];
            match read_some(&mut dec, &mut buf) {
                Ok(0) => {
                    self.input = Some(dec.into_inner());
                    return Ok(Piece::Data {
                        bytes: Vec::new(),
                        end_of_member: true,
                    });
                }
                Ok(k) => {
                    buf.truncate(k);
                    self.streaming = Some((start, dec));
                    return Ok(Piece::Data {
                        bytes: buf,
                        end_of_member: false,
                    });
                }
                Err(e) => {
                    self.input = Some(dec.into_inner());
                    if e.kind() == io::ErrorKind::UnexpectedEof {
                        self.damage.cut = true;
                        return Ok(Piece::End);
                    }
                    self.damage.unverified_failures += 1;
                    if !self.resync(start)? {
                        return Ok(Piece::End);
                    }
                    return Ok(Piece::Data {
                        bytes: Vec::new(),
                        end_of_member: true,
                    });
                }
            }
        }
        loop {
            let start = self.pos();
            if start >= self.file_len {
                self.close_loss(self.file_len);
                return Ok(Piece::End);
            }
            let input = self.input.take().expect("input");
            let mut dec = GzDecoder::new(input);
            let mut out = Vec::new();
            let mut buf = vec![0u8; CHUNK];
            let res = loop {
                match read_some(&mut dec, &mut buf) {
                    Ok(0) => break Ok(()),
                    Ok(k) => {
                        out.extend_from_slice(&buf[..k]);
                        if out.len() > VERIFY_LIMIT {
                            break Err(None);
                        }
                    }
                    Err(e) => break Err(Some(e)),
                }
            };
            match res {
                Ok(()) => {
                    self.input = Some(dec.into_inner());
                    self.close_loss(start);
                    return Ok(Piece::Data {
                        bytes: out,
                        end_of_member: true,
                    });
                }
                Err(None) => {
                    // Too large to hold: used as it comes.
                    self.close_loss(start);
                    self.streaming = Some((start, dec));
                    return Ok(Piece::Data {
                        bytes: out,
                        end_of_member: false,
                    });
                }
                Err(Some(e)) => {
                    let input = dec.into_inner();
                    let reached = self.base + input.n;
                    self.input = Some(input);
                    if e.kind() == io::ErrorKind::UnexpectedEof && reached >= self.file_len {
                        // The file ends inside this block: its complete
                        // lines were flushed before the cut (or before
                        // gpuprof was killed) and are used. Unless another
                        // block follows: then a damaged header made this
                        // one look longer than it is.
                        if let Some(off) = self.find_header(start + 1)? {
                            self.lose_from(start);
                            self.input_at(off)?;
                            continue;
                        }
                        self.close_loss(start);
                        self.damage.cut = true;
                        if out.is_empty() {
                            return Ok(Piece::End);
                        }
                        return Ok(Piece::Data {
                            bytes: out,
                            end_of_member: true,
                        });
                    }
                    if !self.resync(start)? {
                        return Ok(Piece::End);
                    }
                }
            }
        }
    }
}

/// `read` that retries on EINTR.
fn read_some<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            x => return x,
        }
    }
}

/// Lines out of the decoded pieces, bounded in length.
struct Lines {
    blocks: Blocks,
    buf: Vec<u8>,
    pos: usize,
    /// Skipping the rest of an over-long line.
    skipping: bool,
    /// `buf[pos..scanned]` holds no newline.
    scanned: usize,
    /// The last piece ended a member.
    member_done: bool,
    ended: bool,
}

impl Lines {
    /// The next complete line (without its newline).
    fn next_line(&mut self) -> Option<Vec<u8>> {
        loop {
            // Only bytes not searched before: a long line costs its length
            // once, not once per piece.
            let from = self.pos.max(self.scanned);
            if let Some(i) = memchr::memchr(b'\n', &self.buf[from..]) {
                let end = from + i;
                let line = self.buf[self.pos..end].to_vec();
                self.pos = end + 1;
                self.scanned = self.pos;
                if line.len() > MAX_LINE {
                    self.blocks.damage.long_lines += 1;
                    continue;
                }
                return Some(line);
            }
            // No newline left in the buffer: keep the partial line.
            self.buf.drain(..self.pos);
            self.pos = 0;
            self.scanned = self.buf.len();
            if self.buf.len() > MAX_LINE {
                if !self.skipping {
                    self.blocks.damage.long_lines += 1;
                }
                self.skipping = true;
                self.buf.clear();
                self.scanned = 0;
            }
            if self.member_done && (!self.buf.is_empty() || self.skipping) {
                // A member ends with a complete line; anything else is a
                // cut line (damage) or the end of a killed stream.
                if !self.blocks.damage.cut && !self.skipping {
                    self.blocks.damage.bad_lines += 1;
                }
                self.buf.clear();
                self.scanned = 0;
            }
            if self.member_done {
                self.skipping = false;
            }
            if self.ended {
                return None;
            }
            match self.blocks.next_piece() {
                Ok(Piece::Data {
                    bytes,
                    end_of_member,
                }) => {
                    self.member_done = end_of_member;
                    if self.skipping {
                        // The rest of an over-long line is dropped as it
                        // comes, never held.
                        match memchr::memchr(b'\n', &bytes) {
                            Some(i) => {
                                self.skipping = false;
                                self.buf.extend_from_slice(&bytes[i + 1..]);
                            }
                            None => continue,
                        }
                    } else {
                        self.buf.extend_from_slice(&bytes);
                    }
                }
                Ok(Piece::End) | Err(_) => {
                    self.ended = true;
                    self.member_done = true;
                }
            }
        }
    }
}

/// A header line: the recording's header, or why it is not one (not a
/// gpuprof header, or one of a newer format version).
fn parse_header(line: &[u8], path: &Path) -> Result<Header, OpenError> {
    match serde_json::from_slice::<Event>(line) {
        Ok(Event::Header(h)) if h.format == FORMAT_NAME => Ok(h),
        _ => {
            // A newer version may have a header this version cannot parse;
            // read just the version to give the right advice.
            let v: Option<(String, u32)> = serde_json::from_slice::<serde_json::Value>(line)
                .ok()
                .and_then(|v| {
                    Some((
                        v.get("format")?.as_str()?.to_string(),
                        v.get("version")?.as_u64()?.min(u32::MAX as u64) as u32,
                    ))
                });
            match v {
                Some((f, found)) if f == FORMAT_NAME && found > RECORDING_VERSION => {
                    Err(OpenError::TooNew {
                        path: path.to_path_buf(),
                        found,
                        supported: RECORDING_VERSION,
                    })
                }
                _ => Err(OpenError::BadHeader(path.to_path_buf())),
            }
        }
    }
}

/// A recording opened for reading: an iterator of checked events.
pub struct RecordingReader {
    pub header: Header,
    pub path: PathBuf,
    lines: Lines,
    check: Checker,
    /// Set when the stream ended early (gpuprof killed, file cut).
    pub truncated: Option<String>,
    /// The events read so far.
    pub events: u64,
    /// Problems with the header's values (replaced by defaults).
    pub header_problems: Vec<String>,
    /// A line read before its turn: the first one after a damaged header
    /// block, when the header came from its copy.
    pending: Option<Vec<u8>>,
}

impl RecordingReader {
    pub fn open(dir: &Path) -> Result<RecordingReader, OpenError> {
        let path = events_path(dir)?;
        let file = File::open(&path).map_err(|e| OpenError::Io(path.clone(), e))?;
        let file_len = file
            .metadata()
            .map_err(|e| OpenError::Io(path.clone(), e))?
            .len();
        let blocks = Blocks {
            input: Some(Counted {
                inner: BufReader::with_capacity(CHUNK, file),
                n: 0,
            }),
            base: 0,
            file_len,
            streaming: None,
            damage: Damage {
                file_bytes: file_len,
                ..Default::default()
            },
            lost_from: None,
            gap_open: false,
        };
        let mut lines = Lines {
            blocks,
            buf: Vec::new(),
            pos: 0,
            skipping: false,
            scanned: 0,
            member_done: false,
            ended: false,
        };
        // The header is the first line of the first block; if that block is
        // damaged, the copy the writer left beside the recording stands in.
        if lines.blocks.pos() != 0 {
            return Err(OpenError::BadHeader(path));
        }
        let first = lines.next_line();
        let in_place = match &first {
            Some(line) if lines.blocks.damage.bad_blocks == 0 => Some(parse_header(line, &path)),
            _ => None,
        };
        let (header, pending) = match in_place {
            Some(Ok(h)) => (h, None),
            Some(Err(e @ OpenError::TooNew { .. })) => return Err(e),
            _ => {
                // A header is a few KB: read no more than a line may hold.
                let mut copy = Vec::new();
                File::open(path.with_file_name(HEADER_COPY_FILE))
                    .and_then(|f| f.take(MAX_LINE as u64).read_to_end(&mut copy))
                    .map_err(|_| OpenError::BadHeader(path.clone()))?;
                let line = copy.split(|b| *b == b'\n').next().unwrap_or_default();
                let h = parse_header(line, &path)?;
                // What the first line was, if it was not the header: an
                // event of the first readable block.
                let first = first.filter(|_| lines.blocks.damage.bad_blocks > 0);
                lines.blocks.damage.header_from_copy = true;
                (h, first)
            }
        };
        if header.version > RECORDING_VERSION {
            return Err(OpenError::TooNew {
                path,
                found: header.version,
                supported: RECORDING_VERSION,
            });
        }
        let (header, header_problems) = super::check::repair_header(header);
        let check = Checker::new(&header);
        Ok(RecordingReader {
            header,
            path,
            lines,
            check,
            truncated: None,
            events: 0,
            header_problems,
            pending,
        })
    }

    /// Everything left out so far.
    pub fn damage(&self) -> Damage {
        let mut d = self.lines.blocks.damage.clone();
        d.invalid = self.check.invalid.clone();
        d.duplicates = self.check.duplicates;
        d
    }

    /// The problems of the recording in words (damage, header values).
    pub fn warnings(&self) -> Vec<String> {
        let start = self.header.start;
        let mut w = self.header_problems.clone();
        w.extend(
            self.damage()
                .warnings(|t| t.0 as f64 / 1e9 - start.0 as f64 / 1e9),
        );
        w
    }
}

impl Iterator for RecordingReader {
    type Item = Event;
    fn next(&mut self) -> Option<Event> {
        loop {
            let Some(line) = self.pending.take().or_else(|| self.lines.next_line()) else {
                if self.lines.blocks.damage.cut && self.truncated.is_none() {
                    self.truncated = Some(format!(
                        "{} ends inside a block (gpuprof was killed while writing, or the file was cut) after {} events; outputs cover the readable part only",
                        self.path.display(),
                        self.events
                    ));
                }
                if self.lines.blocks.gap_open {
                    self.lines.blocks.gap_open = false;
                    self.lines
                        .blocks
                        .damage
                        .gaps
                        .push((self.check.last_time(), None));
                }
                return None;
            };
            if line.is_empty() {
                continue;
            }
            let ev = match serde_json::from_slice::<Event>(&line) {
                Ok(ev) => ev,
                Err(e) => {
                    let unknown = e.is_data() && e.to_string().contains("unknown variant");
                    if unknown {
                        self.lines.blocks.damage.unknown_events += 1;
                    } else {
                        self.lines.blocks.damage.bad_lines += 1;
                    }
                    continue;
                }
            };
            let before = self.check.last_time();
            let Some(ev) = self.check.check(ev) else {
                continue;
            };
            if self.lines.blocks.gap_open {
                if let Some(t) = ev.time() {
                    self.lines.blocks.gap_open = false;
                    self.lines.blocks.damage.gaps.push((before, Some(t)));
                }
            }
            self.events += 1;
            return Some(ev);
        }
    }
}
