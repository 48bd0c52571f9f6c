//! Diagnosis: ranked findings with evidence and fixes, derived from the
//! [`Analysis`] alone (so `gpuprof report` re-derives them from a
//! recording).
//!
//! The catalogue is one closed enum, [`FindingKind`]; every finding has a
//! stable id, a severity, the GPU time it explains (seconds and share of
//! the run, measured from GPU idle gaps when the GPU was measured, an
//! estimate otherwise — and said so), evidence from this run, a concrete
//! fix and a section in `docs/findings.md` (printed by `gpuprof explain ID`). Findings are ranked by the GPU
//! time they explain. Every threshold is a named constant in
//! [`thresholds`], documented in `docs/findings.md` with its reason.
//!
//! Inputs beyond the CPU side come through [`GpuEvidence`] and
//! [`StackEvidence`]: small views of what the GPU and stack analyses
//! measured. [`diagnose`] takes them as `Option`s, so every CPU-side rule
//! works without them.

mod account;
mod accounting;
mod causes;
mod compile;
mod edges;
mod evidence;
mod gil;
mod measure;
mod others;
pub mod ranks;
mod rule;
mod rules;
pub mod support;
pub mod thresholds;
mod timeline;

use serde::Serialize;

use crate::analysis::Analysis;
pub use evidence::{
    GpuDeviceEvidence, GpuEvidence, StackEvidence, ThrottleEvidence, POWER_REASONS, THERMAL_REASONS,
};
pub use support::Support;
pub use timeline::{Cause, Timeline};

/// The catalogue. The order is the tie-break of the ranking: a cause ranks
/// before the symptom it explains (a CUDA mismatch before "GPU not used",
/// IO-bound before the slow storage behind it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FindingKind {
    CudaDriverMismatch,
    GpuNotUsed,
    StragglerRank,
    GilContention,
    ThermalThrottling,
    PowerCapped,
    CpuLimit,
    HostMemoryPressure,
    WorkerRestarts,
    IoBound,
    WriteStall,
    SlowStorage,
    MainProcessPreprocessing,
    TooFewWorkers,
    InputPipelineBound,
    CpuOversubscribed,
    OtherProgramsCpu,
    TrainingLoop,
    Compilation,
    GpuMemoryPressure,
    PcieDegraded,
    GpuIdleUnexplained,
    LowSampleCoverage,
}

impl FindingKind {
    pub const ALL: [FindingKind; 23] = [
        FindingKind::CudaDriverMismatch,
        FindingKind::GpuNotUsed,
        FindingKind::StragglerRank,
        FindingKind::GilContention,
        FindingKind::ThermalThrottling,
        FindingKind::PowerCapped,
        FindingKind::CpuLimit,
        FindingKind::HostMemoryPressure,
        FindingKind::WorkerRestarts,
        FindingKind::IoBound,
        FindingKind::WriteStall,
        FindingKind::SlowStorage,
        FindingKind::MainProcessPreprocessing,
        FindingKind::TooFewWorkers,
        FindingKind::InputPipelineBound,
        FindingKind::CpuOversubscribed,
        FindingKind::OtherProgramsCpu,
        FindingKind::TrainingLoop,
        FindingKind::Compilation,
        FindingKind::GpuMemoryPressure,
        FindingKind::PcieDegraded,
        FindingKind::GpuIdleUnexplained,
        FindingKind::LowSampleCoverage,
    ];

    /// The stable id (report.json, docs anchors, `gpuprof compare`).
    pub fn id(self) -> &'static str {
        match self {
            FindingKind::InputPipelineBound => "input-pipeline-bound",
            FindingKind::MainProcessPreprocessing => "main-process-preprocessing",
            FindingKind::TooFewWorkers => "too-few-workers",
            FindingKind::IoBound => "io-bound",
            FindingKind::SlowStorage => "slow-storage",
            FindingKind::ThermalThrottling => "thermal-throttling",
            FindingKind::PowerCapped => "power-capped",
            FindingKind::GpuMemoryPressure => "gpu-memory-pressure",
            FindingKind::GpuNotUsed => "gpu-not-used",
            FindingKind::CudaDriverMismatch => "cuda-driver-mismatch",
            FindingKind::PcieDegraded => "pcie-degraded",
            FindingKind::CpuOversubscribed => "cpu-oversubscribed",
            FindingKind::OtherProgramsCpu => "cpu-taken-by-other-programs",
            FindingKind::LowSampleCoverage => "low-sample-coverage",
            FindingKind::StragglerRank => "straggler-rank",
            FindingKind::GilContention => "gil-contention",
            FindingKind::CpuLimit => "cpu-limit",
            FindingKind::HostMemoryPressure => "host-memory-pressure",
            FindingKind::WorkerRestarts => "worker-restarts",
            FindingKind::WriteStall => "write-stall",
            FindingKind::TrainingLoop => "training-loop",
            FindingKind::Compilation => "compilation",
            FindingKind::GpuIdleUnexplained => "gpu-idle-unexplained",
        }
    }

    pub fn from_id(id: &str) -> Option<FindingKind> {
        FindingKind::ALL.into_iter().find(|k| k.id() == id)
    }

    /// Where the finding is explained: a command that prints its section
    /// of `docs/findings.md` from the binary itself, so it works wherever
    /// gpuprof is installed (a link into this repository would not).
    pub fn docs(self) -> String {
        format!("gpuprof explain {}", self.id())
    }
}

impl std::fmt::Display for FindingKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.id())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }

    /// Severity of a finding that costs `share` of the run (0..=1): see
    /// [`thresholds::CRITICAL_SHARE`] and [`thresholds::WARNING_SHARE`].
    pub fn from_share(share: f64) -> Severity {
        if share >= thresholds::CRITICAL_SHARE {
            Severity::Critical
        } else if share >= thresholds::WARNING_SHARE {
            Severity::Warning
        } else {
            Severity::Info
        }
    }
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the GPU time of a finding was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// From the GPU's measured idle gaps.
    Measured,
    /// The GPU was not measured; an estimate from CPU-side figures.
    Estimated,
}

/// The GPU time a finding explains.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuTime {
    pub seconds: f64,
    /// Share of the run (of all the job's GPUs' time when several).
    pub share: f64,
    pub basis: Basis,
    /// How the figure was obtained, in words.
    pub method: String,
}

/// One finding of this run.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    /// The rank the finding is about, when the job has several: per-rank
    /// findings never merge ranks into one claim.
    pub rank: Option<u32>,
    pub severity: Severity,
    /// What is wrong, in one line.
    pub title: String,
    /// GPU time explained; None when the finding is not a time cost (a risk,
    /// a setup problem that is not measured in time, missing data).
    pub gpu_time: Option<GpuTime>,
    /// Figures from this run.
    pub evidence: Vec<String>,
    /// What to change.
    pub fix: String,
    /// For findings sized by a share of sampled intervals: the evidence
    /// behind the share and what it establishes (see [`support`]).
    pub support: Option<Support>,
}

impl Finding {
    /// Whether the evidence establishes the finding; a finding that is
    /// not ("possibly …") is info and ranks after those that are.
    pub fn established(&self) -> bool {
        self.support.as_ref().map_or(true, |s| s.established)
    }

    pub(crate) fn rank_key(&self) -> (f64, Severity) {
        (
            self.gpu_time.as_ref().map_or(0.0, |g| g.seconds),
            self.severity,
        )
    }

    /// "12.3 s of GPU time (85% of the run, estimated)".
    pub fn gpu_time_text(&self) -> String {
        match &self.gpu_time {
            None => "no GPU time attributed".into(),
            Some(g) => format!(
                "{} {:.1} s of GPU time ({:.0}% of the run{})",
                if g.basis == Basis::Estimated {
                    "about"
                } else {
                    "cost"
                },
                g.seconds,
                g.share * 100.0,
                if g.basis == Basis::Estimated {
                    ", estimated from the CPU side"
                } else {
                    ", measured"
                }
            ),
        }
    }
}

/// The diagnosis of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Diagnosis {
    /// Ranked: most GPU time explained first.
    pub findings: Vec<Finding>,
    pub gpu_measured: bool,
    pub stacks_measured: bool,
    /// Caveats that apply to the whole diagnosis.
    pub notes: Vec<String>,
    /// What the job loaded and where its data came from.
    pub environment: EnvironmentSummary,
    /// Each rank's figures, when the job has ranks.
    pub ranks: Vec<ranks::RankFigures>,
    /// Where the main thread's time went over the training loop, from its
    /// stack samples (None without them).
    pub main_thread: Option<account::MainAccount>,
}

/// A framework library mapped by the job, and whether CUDA came with it.
#[derive(Clone, Debug, Serialize)]
pub struct FrameworkUse {
    pub pid: i32,
    pub name: &'static str,
    pub path: String,
    pub cuda: bool,
}

/// A filesystem the input processes read data files from.
#[derive(Clone, Debug, Serialize)]
pub struct DataFilesystem {
    pub mount_point: Option<String>,
    pub fs_type: Option<String>,
    pub source: Option<String>,
    pub disk: Option<String>,
    pub rotational: Option<bool>,
    pub network: bool,
    /// Distinct files seen open (capped by the collector) and their size.
    pub files: usize,
    pub bytes: u64,
    pub example: String,
}

/// The job's software and data, from its maps and open files.
#[derive(Clone, Debug, Default, Serialize)]
pub struct EnvironmentSummary {
    /// False for recordings made without the maps collector.
    pub libraries_recorded: bool,
    pub frameworks: Vec<FrameworkUse>,
    pub cuda_runtimes: Vec<crate::analysis::environment::CudaRuntime>,
    pub data_filesystems: Vec<DataFilesystem>,
}

impl EnvironmentSummary {
    fn build(a: &Analysis, tl: &Timeline) -> EnvironmentSummary {
        let mut pids = tl.input_pids();
        pids.extend(tl.mains.iter().map(|t| t.pid));
        let data_filesystems = a
            .env
            .files_by_mount(&pids)
            .into_iter()
            .map(|f| DataFilesystem {
                mount_point: f.mount.map(|m| m.mount_point.clone()),
                fs_type: f.mount.map(|m| m.fs_type.clone()),
                source: f.mount.map(|m| m.source.clone()),
                disk: f.mount.and_then(|m| m.disk.clone()),
                rotational: f.mount.and_then(|m| m.rotational),
                network: f
                    .mount
                    .is_some_and(|m| crate::analysis::environment::is_network_fs(&m.fs_type)),
                files: f.files,
                bytes: f.bytes,
                example: f.example,
            })
            .collect();
        EnvironmentSummary {
            libraries_recorded: a.env.maps_recorded,
            frameworks: a
                .env
                .frameworks()
                .into_iter()
                .map(|(f, cuda)| FrameworkUse {
                    pid: f.pid,
                    name: f.name,
                    path: f.path,
                    cuda,
                })
                .collect(),
            cuda_runtimes: a.env.cuda_runtimes(),
            data_filesystems,
        }
    }

    /// One line per fact, for the summary.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for f in &self.frameworks {
            out.push(format!(
                "{} loaded by process {} from `{}`{}.",
                f.name,
                f.pid,
                f.path,
                if f.cuda {
                    " with CUDA libraries"
                } else {
                    ": a CPU-only build (no CUDA library mapped)"
                }
            ));
        }
        for r in &self.cuda_runtimes {
            out.push(format!(
                "CUDA runtime {}{} mapped by process {} (`{}`).",
                r.major,
                r.minor.map(|m| format!(".{m}")).unwrap_or_default(),
                r.pid,
                r.path
            ));
        }
        for d in &self.data_filesystems {
            let kind = if d.network {
                ", a network filesystem"
            } else if d.rotational == Some(true) {
                ", a rotational disk"
            } else {
                ""
            };
            out.push(format!(
                "Data files such as `{}` ({} seen, {}) on {} ({}{}{kind}).",
                d.example,
                d.files,
                crate::units::bytes(d.bytes as f64),
                d.mount_point.as_deref().unwrap_or("an unknown mount"),
                d.fs_type.as_deref().unwrap_or("?"),
                d.disk
                    .as_ref()
                    .map(|x| format!(" on {x}"))
                    .unwrap_or_default()
            ));
        }
        out
    }
}

impl Diagnosis {
    /// The most costly established finding (possible ones are not an
    /// answer: their evidence is too thin).
    pub fn top(&self) -> Option<&Finding> {
        self.findings.iter().find(|f| f.established())
    }
}

/// Diagnose a run. `gpu` and `stacks` are what the GPU and stack analyses
/// measured, when they did; every CPU-side rule works without them.
pub fn diagnose(
    a: &Analysis,
    gpu: Option<&GpuEvidence>,
    stacks: Option<&StackEvidence>,
) -> Diagnosis {
    let tl = Timeline::build(a);
    let scopes = rules::scopes(a, gpu);
    let mut findings = rules::all(a, &tl, &scopes, gpu);
    let rank_figures = ranks::figures(a, gpu);
    findings.extend(ranks::straggler(&rank_figures));
    let unexplained = rules::unexplained(a, &scopes, &findings);
    findings.extend(unexplained);
    findings.extend(gil::gil_contention(a));
    findings.extend(rules::coverage_finding(a, gpu, stacks));
    support::grade(a, &tl, &scopes, gpu, &mut findings);
    // Established findings first: a possible one (too little evidence)
    // never ranks above them, so that noise never tops a run.
    findings.sort_by(|x, y| {
        let (xs, xv) = x.rank_key();
        let (ys, yv) = y.rank_key();
        y.established()
            .cmp(&x.established())
            .then(ys.total_cmp(&xs))
            .then(yv.cmp(&xv))
            .then(x.kind.cmp(&y.kind))
    });
    let mut notes = Vec::new();
    let gpu_measured = gpu.is_some_and(|g| !g.devices.is_empty());
    if !gpu_measured {
        notes.push(match gpu_use(a) {
            GpuUse::NoneSeen => {
                "The GPU side was not measured, and nothing shows that this job uses a GPU: no \
                 process of it loaded a GPU framework (PyTorch, TensorFlow, JAX, PaddlePaddle) or \
                 a CUDA library. The findings say where its time went on the CPU; their GPU time \
                 is an estimate of what that would cost a job feeding a GPU (see each finding's \
                 method)."
            }
            GpuUse::NoDriver => {
                "The GPU side was not measured, and no process of the job loaded the NVIDIA \
                 driver's CUDA library (libcuda.so): nothing ran on a GPU, so the framework's \
                 work, the model's forward and backward passes included, ran on the CPU. GPU time \
                 figures are estimates from what the CPU did (see each finding's method)."
            }
            GpuUse::Unknown | GpuUse::Possible => {
                "The GPU side was not measured: GPU time figures are estimates from what the CPU \
                 did (see each finding's method)."
            }
        }
        .to_string());
        notes.extend(tl.edges_note());
    } else if let Some(g) = gpu {
        notes.extend(rules::edge_gap_notes(a, &tl, g));
    }
    Diagnosis {
        findings,
        gpu_measured,
        stacks_measured: stacks.is_some(),
        notes,
        environment: EnvironmentSummary::build(a, &tl),
        ranks: rank_figures,
        main_thread: Some(account::loop_account(a, &tl)).filter(|m| m.samples > 0),
    }
}

/// What the job's libraries say about its use of a GPU. Without a measured
/// GPU, the CPU-side estimates of GPU time may describe a GPU the job never
/// used (`dd`, a CPU-only script, a framework that found no GPU), and the
/// diagnosis says so instead of implying one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GpuUse {
    /// No libraries were recorded.
    Unknown,
    /// No GPU framework and no CUDA library.
    NoneSeen,
    /// A framework or CUDA library, but never the driver's `libcuda.so`:
    /// whatever the framework computed, it computed on the CPU.
    NoDriver,
    /// The driver's CUDA library was loaded: a GPU may have been used.
    Possible,
}

pub(crate) fn gpu_use(a: &Analysis) -> GpuUse {
    match (a.env.cuda_mapped(), a.env.cuda_driver_mapped()) {
        (None, _) | (_, None) => GpuUse::Unknown,
        (Some(false), _) if a.env.frameworks().is_empty() => GpuUse::NoneSeen,
        (_, Some(false)) => GpuUse::NoDriver,
        (_, Some(true)) => GpuUse::Possible,
    }
}

/// No GPU was measured and the job never loaded the driver's CUDA library
/// ([`GpuUse::NoDriver`]): what its framework computed, it computed on the
/// CPU. The rules that read a busy main thread as host work say so.
pub(super) fn ran_on_cpu(a: &Analysis, gpu: Option<&GpuEvidence>) -> bool {
    gpu.map_or(true, |g| g.devices.is_empty()) && gpu_use(a) == GpuUse::NoDriver
}

/// The start of their evidence line when [`ran_on_cpu`].
pub(super) const NO_DRIVER_EVIDENCE: &str =
    "No process of the job loaded the NVIDIA driver's CUDA library (libcuda.so), so nothing ran on a GPU";

/// Diagnose from the analysis alone, with whatever GPU and stack data it
/// holds (the entry point of `gpuprof report` and of every recording).
pub fn diagnose_analysis(a: &Analysis) -> Diagnosis {
    let gpu = evidence::gpu_from_analysis(a);
    let stacks = evidence::stacks_from_analysis(a);
    diagnose(a, gpu.as_ref(), stacks.as_ref())
}

impl Timeline {
    /// The whole job's timeline.
    pub fn build(a: &Analysis) -> Timeline {
        Timeline::build_scoped(a, None)
    }

    /// The timeline of one rank's input side (its main processes and its
    /// workers; `None`: every process). What the whole machine and job do
    /// (runnable threads, CPU busy, pressure) stays machine-wide, so every
    /// scope classifies a moment of CPU contention the same way.
    ///
    /// Built here, in steps, because each later step reads the timeline
    /// the earlier ones made: bins and causes, the loop's edges (which
    /// clear the causes of start-up and shutdown), then the stacks'
    /// grounding of the causes.
    pub fn build_scoped(a: &Analysis, rank: Option<u32>) -> Timeline {
        let mut tl = Timeline::binned(a, rank);
        edges::set_edges(a, &mut tl);
        compile::mark(a, &mut tl);
        account::ground(a, &mut tl);
        tl
    }
}

#[cfg(test)]
mod tests;
