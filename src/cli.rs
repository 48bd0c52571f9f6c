//! Command-line parsing (clap) into the clap-free configuration of
//! [`crate::config`] and the options of the other commands. No I/O
//! happens here, so parsing is unit-testable.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{ForwardSignals, PerfOptions, PythonFrames, RecordConfig, SamplerChoice};

const AFTER_HELP: &str = "\
Examples:
  gpuprof -- python train.py --epochs 1
  gpuprof -o prof/ --delay 5m --duration 60s -- torchrun --nproc-per-node 8 train.py
  gpuprof report gpuprof-myhost-20261129-140000/
  gpuprof explain input-pipeline-bound

Outputs (see docs/outputs.md): trace.json (open in ui.perfetto.dev), report.json,
summary.md, flamegraphs and folded stacks, the same stacks as profile.pb.gz
(`go tool pprof -http=: profile.pb.gz`) and profile.speedscope.json
(`npx speedscope profile.speedscope.json`), and recording/ (the raw events;
`gpuprof report DIR` rebuilds the rest).";

/// Profile a GPU training job: launch it, follow every process it spawns,
/// and say what the GPU is waiting on.
#[derive(Debug, Parser)]
#[command(name = "gpuprof", version, about, after_help = AFTER_HELP, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub record: RecordArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Record a job (the default action): `gpuprof record -- CMD...`.
    Record(RecordArgs),
    /// Rebuild every output of a recording from its `recording/` folder.
    Report(ReportArgs),
    /// Check this machine before a run (GPUs, driver, CUDA, CPU, memory,
    /// storage, PyTorch); exits 1 when a problem is found.
    Doctor(DoctorArgs),
    /// Compare two runs (output folders or report.json files): wall time,
    /// GPU busy, CPU and IO per role, findings fixed / remaining / new.
    Compare(CompareArgs),
    /// Record a job that is already running — PID and every process below
    /// it — until Ctrl-C, --duration or the job's end, without stopping or
    /// restarting it: `gpuprof attach 4242 --duration 2m`.
    Attach(AttachArgs),
    /// Explain a finding (what it means, the evidence, the fix); without an
    /// ID, list every finding.
    Explain(ExplainArgs),
    /// Put the recordings of several nodes (or ranks) of one job on one
    /// timeline: one trace.json (a process group per node and rank),
    /// report.json and summary.md, the straggler across all ranks, the
    /// clock uncertainty stated. Exits 1 when some inputs were left out.
    Merge(MergeArgs),
    /// Print every thread's Python and native stack of a running job — PID
    /// and every process below it, ranks and workers labelled — without
    /// recording and without stopping it: `gpuprof dump 4242`.
    Dump(DumpArgs),
}

#[derive(Debug, Args)]
pub struct DumpArgs {
    /// The job's process (e.g. torchrun's, or one rank's).
    #[arg(value_name = "PID")]
    pub pid: i32,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// A finding id, as printed in the diagnosis (e.g. `io-bound`).
    #[arg(value_name = "ID")]
    pub id: Option<String>,
}

#[derive(Debug, Args)]
pub struct MergeArgs {
    /// Output folders of `gpuprof -- CMD` (one per node or rank), or
    /// folders holding them (e.g. the shared folder of `-o shared/{host}`).
    #[arg(value_name = "DIR", required = true)]
    pub inputs: Vec<PathBuf>,
    /// Where to write the merged outputs [default:
    /// ./gpuprof-merged-<YYYYmmdd-HHMMSS>].
    #[arg(short, long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Recordings analysed at once [default: up to 4, within the cores];
    /// each takes the memory of one `gpuprof report`.
    #[arg(short, long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Size the merged trace.json aims at, in MB: each recording keeps
    /// its processes', GPUs' and machine's counters (averaged to fit) and
    /// GPU idle gaps; stacks, thread states and NVTX stay in its own trace.
    #[arg(long, value_name = "MB", default_value_t = 256)]
    pub trace_mb: u64,
    /// Every event of every recording in the merged trace, whatever its
    /// size.
    #[arg(long)]
    pub full_trace: bool,
    /// Print nothing but errors.
    #[arg(short, long)]
    pub quiet: bool,
}

impl MergeArgs {
    pub fn into_options(self) -> Result<crate::merge::MergeOptions, String> {
        if self.jobs == Some(0) {
            return Err("--jobs 0: give at least 1 recording analysed at once".into());
        }
        let output = self.output.unwrap_or_else(|| {
            PathBuf::from(format!(
                "gpuprof-merged-{}",
                chrono::Local::now().format("%Y%m%d-%H%M%S")
            ))
        });
        if self.inputs.iter().any(|i| i == &output) {
            return Err(format!(
                "-o {} is also an input: write the merge elsewhere",
                output.display()
            ));
        }
        if self.trace_mb == 0 {
            return Err("--trace-mb 0: give a size in MB (default 256), or --full-trace".into());
        }
        Ok(crate::merge::MergeOptions {
            inputs: self.inputs,
            output,
            jobs: self.jobs,
            trace_budget: (!self.full_trace).then_some(self.trace_mb << 20),
        })
    }
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The running job's process: its main Python process, or the
    /// `torchrun` agent to record every rank.
    #[arg(value_name = "PID")]
    pub pid: String,
    #[command(flatten)]
    pub record: RecordArgs,
}

impl AttachArgs {
    pub fn into_config(self) -> Result<RecordConfig, String> {
        let pid: i32 = match self.pid.trim().parse() {
            Ok(p) if p > 0 => p,
            _ => {
                return Err(format!(
                    "`{}` is not a process id: give the PID of the running job, e.g. `gpuprof attach $(pgrep -f train.py | head -1)`",
                    self.pid
                ))
            }
        };
        if !self.record.command.is_empty() {
            return Err(
                "attach records a process that is already running and takes no command: use `gpuprof -- CMD` to launch one"
                    .into(),
            );
        }
        let mut cfg = self.record.validated()?;
        cfg.attach = Some(crate::event::Pid(pid));
        Ok(cfg)
    }
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The dataset (file or folder): check the filesystem and device behind
    /// it and measure a short sequential read.
    #[arg(long, value_name = "PATH")]
    pub data: Option<PathBuf>,
    /// Python interpreter to check for PyTorch [default: python3 on PATH].
    #[arg(long, value_name = "PYTHON")]
    pub python: Option<String>,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The run before (output folder or its report.json).
    #[arg(value_name = "A")]
    pub a: PathBuf,
    /// The run after.
    #[arg(value_name = "B")]
    pub b: PathBuf,
    /// Print Markdown (to paste into a pull request) instead of a table.
    #[arg(long)]
    pub markdown: bool,
    /// The job's saved output for run A, to read steps/s from instead of
    /// the steps gpuprof measured (for runs recorded without a step range;
    /// gpuprof does not capture the job's output).
    #[arg(long, value_name = "FILE")]
    pub log_a: Option<PathBuf>,
    /// The job's saved output for run B.
    #[arg(long, value_name = "FILE")]
    pub log_b: Option<PathBuf>,
    /// Regex whose first group is steps/s in the logs (last match wins)
    /// [default: "N steps/s" or "N it/s"].
    #[arg(long, value_name = "REGEX")]
    pub steps_regex: Option<String>,
}

impl CompareArgs {
    pub fn into_options(self) -> crate::compare::CompareOptions {
        crate::compare::CompareOptions {
            a: self.a,
            b: self.b,
            log_a: self.log_a,
            log_b: self.log_b,
            steps_regex: self.steps_regex,
            markdown: self.markdown,
        }
    }
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Output folder [default: ./gpuprof-<host>-<YYYYmmdd-HHMMSS>].
    /// Created before the job starts; an unwritable folder stops gpuprof
    /// before the job runs. Placeholders let every node and rank write into
    /// one shared folder: {host}, {rank}, {local_rank}, {node}, {job},
    /// {step} (Slurm), {time}, {pid}, e.g. `-o /shared/prof/{job}/{host}`.
    #[arg(short, long, value_name = "DIR")]
    pub output: Option<PathBuf>,

    /// How often /proc is sampled (per-thread CPU, IO, memory, system
    /// figures), e.g. `100ms`, `0.5s`.
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = parse_duration)]
    pub interval: Duration,

    /// Start recording this long after the job starts, e.g. `--delay 10m`
    /// to skip warm-up. Until then nothing is sampled: perf's events are
    /// off, and the in-process Python agent's timer still fires but returns
    /// at once (0.1% of a loader job's CPU, against 0.45% when sampling).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub delay: Option<Duration>,

    /// Stop recording after this long and write the outputs; the job keeps
    /// running and gpuprof still exits with its status, e.g. `--duration 2m`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Print nothing but errors (the summary still goes to summary.md).
    #[arg(short, long)]
    pub quiet: bool,

    /// Do not open NVML: profile the CPU side only.
    #[arg(long)]
    pub no_gpu: bool,

    /// How often NVML is polled, e.g. `100ms`. Utilization comes from the
    /// driver's own timestamped samples, so this sets latency and cost,
    /// not resolution.
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = parse_duration)]
    pub gpu_interval: Duration,

    /// GPU utilization (percent) at or below which a sample counts as idle
    /// when finding idle gaps.
    #[arg(long, value_name = "PERCENT", default_value_t = 5.0)]
    pub idle_threshold: f64,

    /// CPU stack samples per second per thread (perf, 1 to 1000).
    #[arg(long, value_name = "HZ", default_value_t = crate::collect::perf::DEFAULT_FREQUENCY)]
    pub frequency: u64,

    /// Bytes of user stack copied with each sample for DWARF unwinding
    /// (1024 to 65528, a multiple of 8); deeper stacks are cut.
    #[arg(long, value_name = "BYTES", default_value_t = crate::collect::perf::DEFAULT_STACK_SIZE)]
    pub stack_size: u32,

    /// Do not sample CPU stacks (no perf events, no py-spy).
    #[arg(long)]
    pub no_stacks: bool,

    /// Do not capture the job's NVTX ranges (gpuprof otherwise names its
    /// injection library in the job's NVTX_INJECTION64_PATH).
    #[arg(long)]
    pub no_nvtx: bool,

    /// What the flamegraphs and the trace's stack slices show: `python`
    /// (Python functions and the native library code they call, the
    /// interpreter's own frames and process start-up folded away) or
    /// `native` (every frame as sampled). Every frame is always in
    /// `stacks-<role>-native.folded`; `gpuprof report --flame` redraws.
    /// The same view goes into profile.pb.gz (pprof: `go tool pprof
    /// -http=: profile.pb.gz`; role, process, thread as labels) and
    /// profile.speedscope.json (`npx speedscope profile.speedscope.json`).
    #[arg(long, value_name = "VIEW", default_value = "python")]
    pub flame: crate::analysis::stacks::View,
    /// The NVTX range that marks one training step (its message, e.g.
    /// `train_step`; `step N` matches `step 1`, `step 2`, …). Without it, a
    /// repeating range is chosen automatically.
    #[arg(long, value_name = "NAME")]
    pub step_range: Option<String>,
    #[command(flatten)]
    pub outputs: OutputArgs,

    /// Serve the job's live figures in the Prometheus text format at
    /// http://HOST:PORT/metrics while recording, e.g. `127.0.0.1:9464`
    /// (`0.0.0.0:9464` for a Prometheus on another machine).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,

    /// Early warnings: print a warning (with the finding it points at) when
    /// a condition has held this long: GPU busy under 30%, thermal
    /// throttling, a saturated disk while the job waits on IO, no process
    /// on any GPU, host memory pressure, the cgroup's CPU limit throttling
    /// the job. `0` turns them off.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub warn_after: Duration,

    /// Hang reports: when the main thread of every rank (or of the job's
    /// own process) has stayed blocked this long without running, write
    /// every thread's Python and native stack of every process into the
    /// output folder (`hang-N.txt`), print one line per rank saying where
    /// it is stuck, and keep recording. `0` turns them off.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub hang_after: Duration,

    /// How Python processes get Python frames in their native stacks.
    /// `same-instant` (default): a small agent preloaded into the job
    /// samples each Python thread from inside (perf sigtrap), so every
    /// native sample carries the Python frames of that very instant; CPython
    /// 3.9–3.13. Measured on a 2-vCPU VM: the agent's handler is 0.2–0.7%
    /// of the job's CPU, and the whole profiler slowed a loader job that
    /// keeps every core busy ×1.006–1.015 (median of paired runs, depending on
    /// the host's load; see docs/stacks.md). `py-spy`: no agent;
    /// Python stacks are read from outside (non-blocking, within 1% of a
    /// core) into a separate Python-only view, and native samples of Python
    /// code stay under `[python: not sampled]`. Exact alternatives that
    /// cost more, not used by gpuprof: CPython 3.12+ perf trampolines
    /// (PYTHONPERFSUPPORT=1: ×1.9 on call-heavy code) and stopping the
    /// process per sample (`py-spy record --native`: ×1.05–1.8).
    #[arg(long, value_name = "MODE", value_enum, default_value_t = PythonFramesArg::SameInstant)]
    pub python_frames: PythonFramesArg,

    /// Who takes the native stacks. `auto` (default): perf events where
    /// they are allowed, else the in-process timer sampler. `timer`: each
    /// thread of the job samples itself on its own CPU-time clock (a
    /// per-thread POSIX timer, delivered to that thread, read by the agent
    /// preloaded into the job): needs no privilege, so it runs where
    /// `perf_event_open` is refused (Docker's and Kubernetes' defaults,
    /// `perf_event_paranoid` 3 or 4). `perf`: perf events only, no stacks
    /// where they are refused. See docs/stacks.md for what each measures.
    #[arg(long, value_name = "WHO", value_enum, default_value_t = SamplerArg::Auto)]
    pub sampler: SamplerArg,

    /// Whether SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 sent to gpuprof are
    /// passed on to the job. `auto`: yes, except those sent by
    /// `slurmstepd`, which signals every process of the job step, and by
    /// GNU `timeout` without `--foreground`, which signals its whole
    /// process group (the job has its own, and would otherwise get it
    /// twice: a SIGUSR1 checkpoint handler would run twice). `never`: for a
    /// scheduler or script that
    /// signals the whole process group or cgroup; gpuprof then records
    /// until the job exits. `always`: pass every one on.
    #[arg(long, value_name = "WHEN", value_enum, default_value_t = ForwardSignalsArg::Auto)]
    pub forward_signals: ForwardSignalsArg,

    /// The job to run, after `--`, e.g. `-- python train.py --epochs 1`.
    #[arg(
        value_name = "CMD",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<OsString>,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// An output folder written by `gpuprof -- CMD` (or its `recording/`).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Write the outputs here instead of into DIR.
    #[arg(short, long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Print nothing but errors.
    #[arg(short, long)]
    pub quiet: bool,
    /// What the flamegraphs and the trace's stack slices show: `python`
    /// (the interpreter's own frames folded away) or `native` (every frame);
    /// also profile.pb.gz (pprof: `go tool pprof -http=: profile.pb.gz`)
    /// and profile.speedscope.json (`npx speedscope
    /// profile.speedscope.json`), rebuilt here too.
    #[arg(long, value_name = "VIEW", default_value = "python")]
    pub flame: crate::analysis::stacks::View,
    /// The NVTX range that marks one training step (overrides the one
    /// given at record time).
    #[arg(long, value_name = "NAME")]
    pub step_range: Option<String>,
    #[command(flatten)]
    pub outputs: OutputArgs,
}

/// Options of the outputs, for recording and for `gpuprof report`.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Most bytes trace.json may take (JSON, before any compression):
    /// beyond it the trace is made coarser, least important tracks first,
    /// and says how (see docs/outputs.md), e.g. `100MB`, `1GB`, `512MiB`.
    #[arg(long, value_name = "SIZE", default_value = "256MB")]
    pub trace_max_size: String,

    /// Write trace.json.gz (gzip; Perfetto opens it as is) instead of
    /// trace.json.
    #[arg(long)]
    pub trace_gzip: bool,

    /// Most bytes each flamegraph SVG may take: frames too narrow to see are
    /// left out of the picture (the folded stacks keep all), e.g. `1MB`.
    #[arg(long, value_name = "SIZE", default_value = "1MB")]
    pub flame_max_size: String,

    /// Python frames by line: `augment (train.py:42)`, the line each frame
    /// was on at the sample's instant (as py-spy shows them), in the
    /// flamegraphs, folded files, the trace's stack slices and report.json's
    /// top functions (profile.pb.gz and profile.speedscope.json stay by
    /// function); `file.py:?` where a line could not be decoded. Without it
    /// frames are by function. The
    /// recording always keeps the lines of the agent's same-instant frames
    /// (py-spy's have none): `gpuprof report --lines DIR` redraws.
    #[arg(long)]
    pub lines: bool,
}

impl OutputArgs {
    pub fn to_options(&self) -> Result<crate::outputs::OutputOptions, String> {
        let size = |opt: &str, v: &str, min: u64| {
            let b =
                crate::export::trace_budget::parse_size(v).map_err(|e| format!("--{opt}: {e}"))?;
            if b < min {
                return Err(format!(
                    "--{opt} {v} is too small: give at least {} kB",
                    min / 1000
                ));
            }
            Ok(b)
        };
        Ok(crate::outputs::OutputOptions {
            trace_budget_bytes: size("trace-max-size", &self.trace_max_size, 1_000_000)?,
            trace_gzip: self.trace_gzip,
            flame_max_bytes: size("flame-max-size", &self.flame_max_size, 100_000)?,
            python_lines: self.lines,
            ..Default::default()
        })
    }
}

impl RecordArgs {
    pub fn into_config(self) -> Result<RecordConfig, String> {
        if self.command.is_empty() {
            return Err(
                "no command to profile: put the job after `--`, e.g. `gpuprof -- python train.py` (or `gpuprof attach PID` for a running job)"
                    .into(),
            );
        }
        self.validated()
    }

    /// Check every setting but the command.
    fn validated(self) -> Result<RecordConfig, String> {
        if self.interval < Duration::from_millis(10) || self.interval > Duration::from_secs(60) {
            return Err(format!(
                "--interval {:?} is out of range: use 10ms to 60s (default 100ms)",
                self.interval
            ));
        }
        if self.gpu_interval < Duration::from_millis(10)
            || self.gpu_interval > Duration::from_secs(60)
        {
            return Err(format!(
                "--gpu-interval {:?} is out of range: use 10ms to 60s (default 100ms)",
                self.gpu_interval
            ));
        }
        if !(0.0..100.0).contains(&self.idle_threshold) {
            return Err(format!(
                "--idle-threshold {} is out of range: give a GPU utilization percent from 0 to below 100 (default 5)",
                self.idle_threshold
            ));
        }
        if self
            .metrics_addr
            .as_deref()
            .is_some_and(|a| a.trim().is_empty())
        {
            return Err("--metrics-addr is empty: give HOST:PORT, e.g. 127.0.0.1:9464".into());
        }
        if self.duration.is_some_and(|d| d.is_zero()) {
            return Err(
                "--duration 0 would record nothing: give a positive duration such as 60s".into(),
            );
        }
        let stacks = if self.no_stacks {
            None
        } else {
            let o = PerfOptions {
                frequency: self.frequency,
                stack_size: self.stack_size,
                python_frames: self.python_frames.into(),
                hang_after: Some(self.hang_after).filter(|d| !d.is_zero()),
                hang_dir: None,
                sampler: self.sampler.into(),
            };
            o.validate()?;
            if o.sampler == SamplerChoice::Timer && !o.same_instant_python() {
                return Err("--sampler timer runs in the agent that --python-frames py-spy turns off: use one or the other".into());
            }
            Some(o)
        };
        let outputs = self.outputs.to_options()?;
        Ok(RecordConfig {
            stacks,
            outputs: crate::outputs::OutputOptions {
                flame: self.flame,
                step_range: None,
                ..outputs
            },
            command: self.command,
            output: self.output,
            interval: self.interval,
            delay: self.delay,
            duration: self.duration,
            quiet: self.quiet,
            no_gpu: self.no_gpu,
            gpu_interval: self.gpu_interval,
            idle_threshold_pct: self.idle_threshold,
            attach: None,
            no_nvtx: self.no_nvtx,
            step_range: self.step_range.filter(|s| !s.trim().is_empty()),
            metrics_addr: self.metrics_addr,
            warn_after: self.warn_after,
            forward_signals: self.forward_signals.into(),
        })
    }
}

/// `--python-frames`, as spelled on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PythonFramesArg {
    SameInstant,
    PySpy,
}

impl From<PythonFramesArg> for PythonFrames {
    fn from(a: PythonFramesArg) -> PythonFrames {
        match a {
            PythonFramesArg::SameInstant => PythonFrames::SameInstant,
            PythonFramesArg::PySpy => PythonFrames::PySpy,
        }
    }
}

/// `--sampler`, as spelled on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SamplerArg {
    Auto,
    Perf,
    Timer,
}

impl From<SamplerArg> for SamplerChoice {
    fn from(a: SamplerArg) -> SamplerChoice {
        match a {
            SamplerArg::Auto => SamplerChoice::Auto,
            SamplerArg::Perf => SamplerChoice::Perf,
            SamplerArg::Timer => SamplerChoice::Timer,
        }
    }
}

/// `--forward-signals`, as spelled on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ForwardSignalsArg {
    Auto,
    Always,
    Never,
}

impl From<ForwardSignalsArg> for ForwardSignals {
    fn from(a: ForwardSignalsArg) -> ForwardSignals {
        match a {
            ForwardSignalsArg::Auto => ForwardSignals::Auto,
            ForwardSignalsArg::Always => ForwardSignals::Always,
            ForwardSignalsArg::Never => ForwardSignals::Never,
        }
    }
}

/// Parse `250ms`, `1.5s`, `10m`, `2h`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| {
        format!("invalid duration `{s}`: use a number with a unit, e.g. 100ms, 30s, 10m, 2h")
    })?;
    let mul = match unit.trim() {
        "" | "s" | "sec" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        // Accepted so that a too-short duration gets the option's own
        // range message, like 0 does.
        "ns" => 1e-9,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        u => {
            return Err(format!(
                "invalid duration unit `{u}` in `{s}`: use ms, s, m or h"
            ))
        }
    };
    let secs = v * mul;
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(format!("invalid duration `{s}`"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("100ms").unwrap(), Duration::from_millis(100));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert_eq!(parse_duration("1ns").unwrap(), Duration::from_nanos(1));
    }

    #[test]
    fn default_action_is_record() {
        let cli = Cli::try_parse_from(["gpuprof", "--", "python3", "-c", "pass"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.record.command, vec!["python3", "-c", "pass"]);
        let cli =
            Cli::try_parse_from(["gpuprof", "-q", "--interval", "50ms", "--", "sh", "-x"]).unwrap();
        let cfg = cli.record.into_config().unwrap();
        assert_eq!(cfg.interval, Duration::from_millis(50));
        assert_eq!(cfg.command, vec!["sh", "-x"]);
    }

    #[test]
    fn subcommands() {
        let cli = Cli::try_parse_from(["gpuprof", "report", "out"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Report(r)) if r.dir.as_os_str() == "out"));
        let cli = Cli::try_parse_from(["gpuprof", "record", "--", "true"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Record(_))));
        let cli = Cli::try_parse_from(["gpuprof", "doctor", "--data", "/d"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Doctor(d)) if d.data.is_some()));
        let cli = Cli::try_parse_from(["gpuprof", "compare", "a", "b", "--markdown"]).unwrap();
        assert!(
            matches!(cli.command, Some(Command::Compare(c)) if c.markdown && c.b.as_os_str() == "b")
        );
        let cli = Cli::try_parse_from(["gpuprof", "explain", "io-bound"]).unwrap();
        assert!(
            matches!(cli.command, Some(Command::Explain(e)) if e.id.as_deref() == Some("io-bound"))
        );
        let cli = Cli::try_parse_from(["gpuprof", "explain"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Explain(e)) if e.id.is_none()));
    }

    #[test]
    fn gpu_flags() {
        let cli = Cli::try_parse_from(["gpuprof", "--", "true"]).unwrap();
        let cfg = cli.record.into_config().unwrap();
        assert!(!cfg.no_gpu);
        assert_eq!(cfg.gpu_interval, Duration::from_millis(100));
        assert_eq!(cfg.idle_threshold_pct, 5.0);
        let cli = Cli::try_parse_from([
            "gpuprof",
            "--no-gpu",
            "--gpu-interval",
            "250ms",
            "--idle-threshold",
            "10",
            "--",
            "true",
        ])
        .unwrap();
        let cfg = cli.record.into_config().unwrap();
        assert!(cfg.no_gpu);
        assert_eq!(cfg.gpu_interval, Duration::from_millis(250));
        assert_eq!(cfg.idle_threshold_pct, 10.0);
        for bad in [["--idle-threshold", "100"], ["--gpu-interval", "1ms"]] {
            let cli = Cli::try_parse_from(["gpuprof", bad[0], bad[1], "--", "true"]).unwrap();
            assert!(cli.record.into_config().unwrap_err().contains(bad[0]));
        }
    }

    #[test]
    fn bad_settings_are_explained() {
        let cli = Cli::try_parse_from(["gpuprof", "--interval", "1ms", "--", "true"]).unwrap();
        assert!(cli.record.into_config().unwrap_err().contains("--interval"));
        // Too short is one error, whatever the unit.
        for short in ["0", "1ns", "5us"] {
            let cli = Cli::try_parse_from(["gpuprof", "--interval", short, "--", "true"]).unwrap();
            let e = cli.record.into_config().unwrap_err();
            assert!(
                e.contains("is out of range: use 10ms to 60s"),
                "{short}: {e}"
            );
        }
        let cli = Cli::try_parse_from(["gpuprof"]).unwrap();
        assert!(cli.record.into_config().unwrap_err().contains("--"));
        let cli = Cli::try_parse_from(["gpuprof", "--frequency", "5000", "--", "true"]).unwrap();
        assert!(cli
            .record
            .into_config()
            .unwrap_err()
            .contains("--frequency"));
        let cli = Cli::try_parse_from(["gpuprof", "--stack-size", "100", "--", "true"]).unwrap();
        assert!(cli
            .record
            .into_config()
            .unwrap_err()
            .contains("--stack-size"));
        let cli = Cli::try_parse_from(["gpuprof", "--no-stacks", "--", "true"]).unwrap();
        assert!(cli.record.into_config().unwrap().stacks.is_none());
    }

    #[test]
    fn attach_takes_a_pid_and_no_command() {
        let cfg = |args: &[&str]| {
            let mut v = vec!["gpuprof", "attach"];
            v.extend(args);
            match Cli::try_parse_from(v).unwrap().command {
                Some(Command::Attach(a)) => a.into_config(),
                other => panic!("not attach: {other:?}"),
            }
        };
        let c = cfg(&["4242", "--duration", "30s", "-o", "x"]).unwrap();
        assert_eq!(c.attach, Some(crate::event::Pid(4242)));
        assert_eq!(c.duration, Some(Duration::from_secs(30)));
        assert!(c.command.is_empty());
        assert!(cfg(&["abc"]).unwrap_err().contains("not a process id"));
        assert!(cfg(&["0"]).unwrap_err().contains("not a process id"));
        assert!(cfg(&["12", "--", "python"])
            .unwrap_err()
            .contains("takes no command"));
        assert!(cfg(&["12", "--interval", "1ms"])
            .unwrap_err()
            .contains("--interval"));
    }
}
