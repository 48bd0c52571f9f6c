//! The configuration of a recording, clap-free: what `cli.rs` parses and
//! validates the flags of `gpuprof record` and `gpuprof attach` into, and
//! what the session (`session`, `attach`, `live`) reads. Every choice is an
//! enum here or in the layer that acts on it (`--python-frames` and
//! `--sampler` in `collect::perf`, `--flame` in `analysis::stacks`),
//! never a string or a flag's spelling.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

pub use crate::analysis::stacks::View;
pub use crate::collect::perf::{PerfOptions, PythonFrames, SamplerChoice};
pub use crate::outputs::OutputOptions;

/// Validated settings of a recording.
#[derive(Debug, Clone)]
pub struct RecordConfig {
    pub command: Vec<OsString>,
    pub output: Option<PathBuf>,
    pub interval: Duration,
    pub delay: Option<Duration>,
    pub duration: Option<Duration>,
    pub quiet: bool,
    pub no_gpu: bool,
    pub gpu_interval: Duration,
    pub idle_threshold_pct: f64,
    /// Stack sampling settings; `None` with `--no-stacks`.
    pub stacks: Option<PerfOptions>,
    /// `gpuprof attach PID`: the running process to record (no command).
    pub attach: Option<crate::event::Pid>,
    pub no_nvtx: bool,
    pub outputs: OutputOptions,
    pub step_range: Option<String>,
    /// `--metrics-addr`, as given (bound before the job starts).
    pub metrics_addr: Option<String>,
    /// Early-warning window; zero: no early warnings.
    pub warn_after: Duration,
    /// `--forward-signals`.
    pub forward_signals: ForwardSignals,
}

/// Which of the signals sent to gpuprof are passed on to the job
/// (`--forward-signals`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardSignals {
    /// All but those from a sender that signals every process of the job.
    Auto,
    Always,
    Never,
}
