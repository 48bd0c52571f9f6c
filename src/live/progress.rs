//! The progress line and the early warnings on stderr while recording.
//!
//! The job writes to the same terminal, and nothing outside the job can know
//! *before* it writes. So the line is drawn conservatively (docs/outputs.md,
//! "While recording"):
//!
//! - It is shown only on a terminal, not with `-q`, and only after the
//!   terminal has been quiet for [`QUIET`]: gpuprof watches the terminal
//!   device with inotify, which reports every write to it (the job's and
//!   its own) as it happens.
//! - It is a line of its own, ended by a newline, so the cursor sits at the
//!   start of the empty line below it: whatever the job writes next starts
//!   there and never merges with it.
//! - It is updated in place (cursor up one line, rewrite) every
//!   [`REDRAW`], and only while nobody has written to the terminal since it
//!   was drawn; once the job has written, the old line is left in the
//!   scrollback as an ordinary line and a new one is drawn after the next
//!   quiet spell, at most every [`NEW_LINE_EVERY`].
//! - At the end it is erased when nothing was written after it.
//! - Drawing a new line starts with `\r\x1b[K`: a partial line the job left
//!   after [`QUIET`] of silence (a stalled progress bar) is erased; progress
//!   bars redraw themselves.
//! - Where the terminal cannot be watched, a plain line every
//!   [`PLAIN_EVERY`] instead.
//!
//! Early warnings ([`super::LiveState::alerts`]) are printed once each when
//! their condition starts, with the finding id, on a terminal or not
//! (a Slurm log wants them too), never with `-q`.

use std::collections::BTreeSet;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use super::{Live, LiveState};
use crate::analysis::Role;

/// Silence on the terminal before a new line is drawn.
pub const QUIET: Duration = Duration::from_secs(3);
/// How often the line is updated in place.
pub const REDRAW: Duration = Duration::from_secs(2);
/// At most one new line (after the job wrote) this often.
pub const NEW_LINE_EVERY: Duration = Duration::from_secs(120);
/// A plain line this often where the terminal cannot be watched.
pub const PLAIN_EVERY: Duration = Duration::from_secs(300);
/// A warning waits at most this long for a quiet terminal.
const WARN_WAIT: Duration = Duration::from_secs(10);
/// Nothing is drawn before the recording is this old.
const FIRST_AFTER: Duration = Duration::from_secs(2);

/// Where the line goes.
enum Mode {
    /// A terminal watched with inotify.
    InPlace { watch: Inotify },
    /// A terminal that cannot be watched: plain lines.
    Plain,
    /// Not a terminal: warnings only.
    WarningsOnly,
    /// `-q`.
    Off,
}

pub struct Progress {
    live: Live,
    mode: Mode,
    warn_window: Duration,
    recording_file: PathBuf,
    started: Instant,
    announced: BTreeSet<String>,
    pending_warnings: Vec<(Instant, String)>,
    /// Last write by anyone else seen on the terminal.
    last_foreign: Instant,
    /// Our line is the last thing on the terminal (nothing written since).
    shown: bool,
    last_draw: Option<Instant>,
    last_new_line: Option<Instant>,
    last_check: Option<Instant>,
    width: usize,
}

fn stderr_tty_path() -> Option<PathBuf> {
    std::fs::read_link("/proc/self/fd/2")
        .ok()
        .filter(|p| p.starts_with("/dev/"))
}

/// Columns of the terminal on stderr.
fn term_width() -> usize {
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(2, libc::TIOCGWINSZ, &mut ws) } == 0;
    if ok && ws.ws_col > 0 {
        ws.ws_col as usize
    } else {
        80
    }
}

/// One write(2) on stderr: the terminal applies it whole, never interleaved
/// with another process's write.
fn write_stderr(bytes: &[u8]) {
    let _ = nix::unistd::write(std::io::stderr().as_fd(), bytes);
}

impl Progress {
    pub fn new(
        live: Live,
        quiet: bool,
        warn_window: Duration,
        recording_file: PathBuf,
    ) -> Progress {
        use std::io::IsTerminal;
        let mode = if quiet {
            Mode::Off
        } else if !std::io::stderr().is_terminal() {
            Mode::WarningsOnly
        } else if std::env::var("TERM").is_ok_and(|t| t == "dumb") {
            Mode::Plain
        } else {
            let watch = stderr_tty_path().and_then(|p| {
                let i = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok()?;
                i.add_watch(&p, AddWatchFlags::IN_MODIFY).ok()?;
                Some(i)
            });
            match watch {
                Some(watch) => Mode::InPlace { watch },
                None => Mode::Plain,
            }
        };
        let now = Instant::now();
        Progress {
            live,
            mode,
            warn_window,
            recording_file,
            started: now,
            announced: BTreeSet::new(),
            pending_warnings: Vec::new(),
            last_foreign: now,
            shown: false,
            last_draw: None,
            last_new_line: None,
            last_check: None,
            width: 80,
        }
    }

    /// True when anything was written to the terminal since the last call.
    fn drain(&mut self) -> bool {
        let Mode::InPlace { watch } = &self.mode else {
            return false;
        };
        let mut any = false;
        while let Ok(evs) = watch.read_events() {
            if evs.is_empty() {
                break;
            }
            any = true;
        }
        any
    }

    /// Write our own bytes and consume the event they cause.
    fn emit(&mut self, bytes: &[u8]) {
        write_stderr(bytes);
        self.drain();
    }

    /// Whether [`Progress::tick`] has anything to do (not with `-q`).
    pub fn ticks(&self) -> bool {
        !matches!(self.mode, Mode::Off)
    }

    /// Call often (every few hundred ms); it rate-limits itself.
    pub fn tick(&mut self) {
        if matches!(self.mode, Mode::Off) {
            return;
        }
        let now = Instant::now();
        if self.drain() {
            self.last_foreign = now;
            self.shown = false;
        }
        if self
            .last_check
            .is_some_and(|c| now - c < Duration::from_millis(900))
        {
            return;
        }
        self.last_check = Some(now);
        let (alerts, line) = {
            let st = self.live.lock();
            (
                st.alerts(self.warn_window),
                status_line(&st, &self.recording_file),
            )
        };
        for a in alerts {
            if self.announced.insert(a.key.clone()) {
                let msg = match a.finding {
                    Some(f) => {
                        format!("gpuprof: warning: {} [{f}: gpuprof explain {f}]", a.message)
                    }
                    None => format!(
                        "gpuprof: warning: {} (the diagnosis at the end names the cause)",
                        a.message
                    ),
                };
                self.pending_warnings.push((now, msg));
            }
        }
        match self.mode {
            Mode::Off => {}
            Mode::WarningsOnly | Mode::Plain => {
                for (_, w) in std::mem::take(&mut self.pending_warnings) {
                    eprintln!("{w}");
                }
                if matches!(self.mode, Mode::Plain)
                    && now - self.started >= PLAIN_EVERY
                    && self.last_draw.is_none_or_older(now, PLAIN_EVERY)
                {
                    eprintln!("{line}");
                    self.last_draw = Some(now);
                }
            }
            Mode::InPlace { .. } => self.draw_in_place(now, line),
        }
    }

    fn draw_in_place(&mut self, now: Instant, line: String) {
        self.width = term_width();
        // Look again just before drawing: the job may have written since
        // the tick began (reading the live figures takes a while on a busy
        // machine), and moving up one line would then erase its output.
        if self.drain() {
            self.last_foreign = now;
            self.shown = false;
        }
        let quiet = now - self.last_foreign >= QUIET;
        let warn_due = self
            .pending_warnings
            .first()
            .is_some_and(|(t, _)| quiet || now - *t >= WARN_WAIT);
        let mut out = String::new();
        if warn_due {
            out.push_str(if self.shown {
                "\x1b[A\r\x1b[K"
            } else {
                "\r\x1b[K"
            });
            for (_, w) in std::mem::take(&mut self.pending_warnings) {
                out.push_str(&w);
                out.push('\n');
            }
            self.shown = false;
            if quiet {
                out.push_str(&self.fit(&line));
                out.push('\n');
                self.shown = true;
                self.last_draw = Some(now);
            }
            self.emit(out.as_bytes());
            return;
        }
        if now - self.started < FIRST_AFTER || !quiet {
            return;
        }
        if self.shown {
            // Ticks come every few hundred ms: allow for their jitter.
            if self
                .last_draw
                .is_none_or_older(now, REDRAW.saturating_sub(Duration::from_millis(150)))
            {
                out.push_str("\x1b[A\r\x1b[K");
                out.push_str(&self.fit(&line));
                out.push('\n');
                self.last_draw = Some(now);
                self.emit(out.as_bytes());
            }
        } else if self.last_new_line.is_none_or_older(now, NEW_LINE_EVERY) {
            out.push_str("\r\x1b[K");
            out.push_str(&self.fit(&line));
            out.push('\n');
            self.shown = true;
            self.last_draw = Some(now);
            self.last_new_line = Some(now);
            self.emit(out.as_bytes());
        }
    }

    /// Cut to the terminal's width, so the line never wraps (moving up one
    /// line must land on it).
    fn fit(&self, line: &str) -> String {
        line.chars()
            .take(self.width.saturating_sub(1).max(20))
            .collect()
    }

    /// Erase the line if nothing was written after it; print warnings still
    /// waiting. Call before gpuprof prints its summary.
    pub fn finish(&mut self) {
        if self.drain() {
            self.shown = false;
        }
        let mut out = String::new();
        if matches!(self.mode, Mode::InPlace { .. }) && self.shown {
            out.push_str("\x1b[A\r\x1b[K");
            self.shown = false;
        }
        for (_, w) in std::mem::take(&mut self.pending_warnings) {
            out.push_str(&w);
            out.push('\n');
        }
        if !out.is_empty() {
            self.emit(out.as_bytes());
        }
        self.mode = Mode::Off;
    }
}

trait OlderThan {
    fn is_none_or_older(&self, now: Instant, d: Duration) -> bool;
}

impl OlderThan for Option<Instant> {
    fn is_none_or_older(&self, now: Instant, d: Duration) -> bool {
        self.map_or(true, |t| now - t >= d)
    }
}

fn clock(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

fn size(bytes: u64) -> String {
    let mb = bytes as f64 / 1e6;
    if mb >= 1000.0 {
        format!("{:.1} GB", mb / 1e3)
    } else if mb >= 10.0 {
        format!("{mb:.0} MB")
    } else {
        format!("{mb:.1} MB")
    }
}

/// `gpuprof: recording 12:34 | GPU 34% busy (last min) | workers 3.9 cores | 12 MB`
pub fn status_line(st: &LiveState, recording_file: &std::path::Path) -> String {
    let gpu = if st.gpus.is_empty() {
        if st.gpu_driver {
            "no GPU".to_string()
        } else {
            "GPU not measured".to_string()
        }
    } else {
        match st.gpu_busy(60.0) {
            Some(b) => format!(
                "GPU {:.0}% busy (last {})",
                b * 100.0,
                if st.elapsed_s() >= 60.0 {
                    "min".to_string()
                } else {
                    format!("{:.0} s", st.elapsed_s())
                }
            ),
            None => "GPU no samples yet".to_string(),
        }
    };
    let cpu = match st.role_cores(10.0) {
        Some(c) => {
            let (i, v) = c
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, v)| (i, *v))
                .unwrap_or((0, 0.0));
            let name = match super::ROLES[i] {
                Role::Main => "main",
                Role::Worker => "workers",
                Role::Launcher => "launcher",
                Role::Other => "other",
            };
            if v < 0.005 {
                "job CPU idle".to_string()
            } else {
                format!("{name} {v:.2} cores")
            }
        }
        None => "CPU -".to_string(),
    };
    let bytes = std::fs::metadata(recording_file)
        .map(|m| m.len())
        .unwrap_or(0);
    format!(
        "gpuprof: recording {} | {gpu} | {cpu} | {} recorded",
        clock(st.elapsed_s()),
        size(bytes)
    )
}
