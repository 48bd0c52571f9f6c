//! The recording's vocabulary: timestamped plain events that collectors emit
//! and the analysis consumes. Collectors know nothing about exporters; the
//! analysis knows nothing about `/proc`, NVML or perf.
//!
//! Every event carries `CLOCK_MONOTONIC` nanoseconds (`MonoNs`). Cumulative
//! kernel counters are recorded raw (not as rates) so that `gpuprof report`
//! can recompute every derived figure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Version of the recording format. Bump when a reader of the previous
/// version could misread a newer recording.
pub const RECORDING_VERSION: u32 = 1;
/// The header's `format`: what marks a file as a gpuprof recording.
pub const FORMAT_NAME: &str = "gpuprof-recording";

/// `CLOCK_MONOTONIC` nanoseconds.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct MonoNs(pub u64);

impl MonoNs {
    pub fn now() -> MonoNs {
        let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .expect("CLOCK_MONOTONIC is always available on Linux");
        MonoNs(ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64)
    }
    /// `CLOCK_BOOTTIME - CLOCK_MONOTONIC` now.
    pub fn boottime_offset() -> u64 {
        let ns = |id| {
            nix::time::clock_gettime(id)
                .map(|ts| ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64)
                .unwrap_or(0)
        };
        let mono = ns(nix::time::ClockId::CLOCK_MONOTONIC);
        ns(nix::time::ClockId::CLOCK_BOOTTIME).saturating_sub(mono)
    }
    pub fn secs_since(self, earlier: MonoNs) -> f64 {
        self.0.saturating_sub(earlier.0) as f64 / 1e9
    }
}

/// A process id (thread-group id).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Pid(pub i32);

/// A thread id.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Tid(pub i32);

impl std::fmt::Display for Pid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}
impl std::fmt::Display for Tid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// First event of every recording.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Header {
    /// Always "gpuprof-recording".
    pub format: String,
    pub version: u32,
    pub gpuprof_version: String,
    pub command: Vec<String>,
    pub host: String,
    /// `CLOCK_MONOTONIC` at the start of the recording: t = 0 in every output.
    pub start: MonoNs,
    /// `CLOCK_REALTIME` nanoseconds since the Unix epoch taken together with
    /// `start`, so NVML's wall-clock stamps and other hosts' traces can be
    /// mapped onto the monotonic axis.
    pub anchor_realtime_ns: u64,
    pub anchor_monotonic_ns: u64,
    /// Half the time it took to read the anchor pair: the pair's own error.
    #[serde(default)]
    pub anchor_error_ns: u64,
    /// /proc sampling interval.
    pub interval_ns: u64,
    pub cpus: u32,
    pub page_size: u64,
    pub clock_ticks_per_s: u64,
    /// Rank / node identity when the job runs under a launcher (RANK,
    /// SLURM_PROCID, ...), for merging traces of several ranks.
    #[serde(default)]
    pub rank: Option<String>,
    /// The launcher's variables in gpuprof's own environment
    /// ([`RANK_ENV_KEYS`] only): which node, task and job this recording is.
    #[serde(default, skip_serializing_if = "RankEnv::is_empty")]
    pub rank_env: RankEnv,
    /// The kernel's boot id (`/proc/sys/kernel/random/boot_id`): recordings
    /// with the same one share `CLOCK_MONOTONIC` exactly (one host, one
    /// boot), whatever their host names say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// How well the host's clock was synchronised when recording started
    /// (what bounds the wall-clock anchor's error when merging hosts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<ClockSync>,
    /// PID of the job's root process.
    pub job_pid: Pid,
    /// `CLOCK_BOOTTIME - CLOCK_MONOTONIC` at the start (time spent in
    /// suspend), to turn process start times from /proc (since boot) into
    /// monotonic time.
    #[serde(default)]
    pub boottime_offset_ns: u64,
    /// GPU idle threshold (`--idle-threshold`, percent): a utilization
    /// sample at or below it is idle.
    #[serde(default)]
    pub gpu_idle_threshold_pct: Option<f64>,
    /// `--step-range NAME`: the NVTX range that marks a training step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_range: Option<String>,
    /// Set by `gpuprof attach`: the job was already running and is not
    /// gpuprof's child; `job_pid` is the process attached to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attached: Option<Attached>,
}

#[cfg(test)]
impl Header {
    /// A header for unit tests: `python3` started at `start` as PID
    /// `job_pid`, 4 CPUs, /proc every 100 ms, no rank; tests change fields
    /// with struct update syntax.
    pub(crate) fn for_tests(start: MonoNs, job_pid: Pid) -> Header {
        Header {
            format: FORMAT_NAME.into(),
            version: RECORDING_VERSION,
            gpuprof_version: "test".into(),
            command: vec!["python3".into()],
            host: "h".into(),
            start,
            anchor_realtime_ns: 0,
            anchor_monotonic_ns: start.0,
            anchor_error_ns: 0,
            interval_ns: 100_000_000,
            cpus: 4,
            page_size: 4096,
            clock_ticks_per_s: 100,
            rank: None,
            rank_env: Default::default(),
            boot_id: None,
            clock: None,
            job_pid,
            boottime_offset_ns: 0,
            gpu_idle_threshold_pct: None,
            attached: None,
            step_range: None,
        }
    }
}

/// How `gpuprof attach` found the job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attached {
    /// When the attached process started, on the monotonic axis of the
    /// recording (before `Header::start`).
    pub process_start: MonoNs,
    /// Its threads and the processes below it when gpuprof attached.
    pub processes: u32,
    pub threads: u32,
}

/// Environment variables that say which rank, node and job a process
/// belongs to, as torchrun (torch.distributed.elastic), Slurm, Open MPI and
/// PMI launchers set them. Only these are ever read from a process's
/// environment; the rest (tokens, paths, credentials) never leaves it.
pub const RANK_ENV_KEYS: &[&str] = &[
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "TORCHELASTIC_RESTART_COUNT",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "PMIX_RANK",
];

/// The [`RANK_ENV_KEYS`] present in one environment, by name.
pub type RankEnv = std::collections::BTreeMap<String, String>;

/// Keep only the [`RANK_ENV_KEYS`] of a `KEY=VALUE` list (such as
/// `/proc/PID/environ` split at NUL bytes); values are capped at 64 bytes.
pub fn rank_env_from<'a>(vars: impl IntoIterator<Item = &'a [u8]>) -> RankEnv {
    let mut out = RankEnv::new();
    for kv in vars {
        let Some(eq) = kv.iter().position(|b| *b == b'=') else {
            continue;
        };
        let (k, v) = (&kv[..eq], &kv[eq + 1..]);
        let Ok(k) = std::str::from_utf8(k) else {
            continue;
        };
        if let Some(key) = RANK_ENV_KEYS.iter().find(|x| **x == k) {
            let v = String::from_utf8_lossy(&v[..v.len().min(64)]).into_owned();
            out.insert(key.to_string(), v);
        }
    }
    out
}

/// The host clock's synchronisation state from `adjtimex(2)` (read only),
/// taken when the recording starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockSync {
    /// The kernel considers the clock synchronised (an NTP/PTP daemon
    /// disciplines it: `STA_UNSYNC` clear).
    pub synchronized: bool,
    /// Maximum error the daemon reports, in µs (`maxerror`).
    pub max_error_us: u64,
    /// Estimated error, in µs (`esterror`).
    pub est_error_us: u64,
    /// Where it came from ("adjtimex").
    pub source: String,
}

/// How the job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Exited(i32),
    Signaled(i32),
    /// gpuprof stopped recording (window end, second Ctrl-C) while the job
    /// was still running.
    StillRunning,
    /// The job ended while `gpuprof attach` recorded it; only its parent
    /// learns how.
    EndedUnknown,
}

impl JobStatus {
    /// The shell-convention exit code for this status.
    pub fn exit_code(self) -> Option<i32> {
        match self {
            JobStatus::Exited(c) => Some(c),
            JobStatus::Signaled(s) => Some(128 + s),
            JobStatus::StillRunning | JobStatus::EndedUnknown => None,
        }
    }
}

/// Last event of a complete recording.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Footer {
    pub t: MonoNs,
    pub status: JobStatus,
    /// Why recording stopped: "job exited", "duration elapsed", "interrupted".
    pub reason: String,
    /// Events the writer could not accept (channel overflow); should be 0.
    #[serde(default)]
    pub dropped_events: u64,
    /// gpuprof's own CPU time (user + system) and peak RSS, to report its
    /// overhead.
    #[serde(default)]
    pub profiler_cpu_ns: u64,
    #[serde(default)]
    pub profiler_max_rss_bytes: u64,
    /// Part of `profiler_cpu_ns` by component (collector threads, the
    /// writer); what is not in it is the main thread's.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub profiler_cpu_ns_by_component: std::collections::BTreeMap<String, u64>,
    /// A second (`CLOCK_MONOTONIC`, `CLOCK_REALTIME`) pair taken at the
    /// end: how far the wall clock was slewed or stepped during the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_anchor: Option<ClockAnchor>,
    /// The recording could not be written to its end (a full disk): what
    /// failed and when. The recording stops there (a `window_stop` marks
    /// the last recorded moment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recording_error: Option<String>,
}

/// A `CLOCK_MONOTONIC` reading paired with `CLOCK_REALTIME`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockAnchor {
    pub monotonic_ns: u64,
    pub realtime_ns: u64,
    /// Half the time the pair took to read.
    pub error_ns: u64,
}

impl ClockAnchor {
    /// Read both clocks; of a few tries keep the tightest bracket.
    pub fn now() -> ClockAnchor {
        let read = |id| {
            nix::time::clock_gettime(id)
                .map(|ts| ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64)
                .unwrap_or(0)
        };
        let mut best: Option<ClockAnchor> = None;
        for _ in 0..5 {
            let m0 = read(nix::time::ClockId::CLOCK_MONOTONIC);
            let r = read(nix::time::ClockId::CLOCK_REALTIME);
            let m1 = read(nix::time::ClockId::CLOCK_MONOTONIC);
            let a = ClockAnchor {
                monotonic_ns: m0 + (m1 - m0) / 2,
                realtime_ns: r,
                error_ns: (m1 - m0).div_ceil(2),
            };
            if best.map_or(true, |b| a.error_ns < b.error_ns) {
                best = Some(a);
            }
        }
        best.expect("five tries")
    }
}

/// One measured source and whether it worked. Partial failure is data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// Stable name of what was (or was not) measured, e.g. "psi", "gpu", "stacks".
    pub source: String,
    pub available: bool,
    /// Why it is unavailable or what limits it, and how to fix that.
    pub detail: String,
}

/// Scheduler state letter from `/proc/PID/task/TID/stat`.
pub type TaskState = char;

/// Cumulative CPU times of one CPU (or the total) from `/proc/stat`, in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuTimes {
    pub user: u64,
    pub nice: u64,
    pub system: u64,
    pub idle: u64,
    pub iowait: u64,
    pub irq: u64,
    pub softirq: u64,
    pub steal: u64,
}

impl CpuTimes {
    /// Saturating: the figures come from a recording, which may be
    /// damaged; a sum past u64 is no time a CPU spent.
    pub fn total(&self) -> u64 {
        self.busy()
            .saturating_add(self.idle)
            .saturating_add(self.iowait)
    }
    pub fn busy(&self) -> u64 {
        [
            self.user,
            self.nice,
            self.system,
            self.irq,
            self.softirq,
            self.steal,
        ]
        .iter()
        .fold(0u64, |a, &b| a.saturating_add(b))
    }
}

/// Cumulative counters of one block device from `/proc/diskstats`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskCounters {
    pub name: String,
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    /// Milliseconds the device had IO in flight (basis of "busy %").
    pub io_ms: u64,
}

/// The CPU limit (CFS quota) of the cgroup the job runs in, with its
/// cumulative throttling counters (cgroup v1 `cpu.cfs_quota_us` /
/// `cpu.cfs_period_us` / `cpu.stat`, v2 `cpu.max` / `cpu.stat`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupCpu {
    /// The cgroup holding the limit (the job's, or an ancestor's), as
    /// `/proc/PID/cgroup` names it.
    pub path: String,
    pub v2: bool,
    pub quota_us: u64,
    pub period_us: u64,
    pub nr_periods: u64,
    pub nr_throttled: u64,
    pub throttled_ns: u64,
}

/// The memory limit of the cgroup the job runs in and its usage (page
/// cache included).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupMemory {
    pub path: String,
    pub v2: bool,
    pub limit_bytes: u64,
    pub usage_bytes: u64,
}

/// Cumulative stall time from one `/proc/pressure/*` file, in µs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Psi {
    pub some_us: u64,
    /// `full` is absent for cpu on older kernels.
    pub full_us: Option<u64>,
}

/// A GPU as NVML numbers it (`nvmlDeviceGetHandleByIndex`).
pub type GpuIndex = u32;

/// Whether a GPU process holds a compute (CUDA) or graphics context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuContext {
    Compute,
    Graphics,
}

/// One process on a GPU, as the driver lists it. PIDs are the driver's:
/// host PIDs, which do not match the job's inside a PID namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProc {
    pub pid: Pid,
    pub ctx: GpuContext,
    /// None when the driver does not report it (Windows WDDM, some vGPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem: Option<u64>,
    /// MIG GPU / compute instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gi: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci: Option<u32>,
}

/// The newest per-process utilization sample of one PID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcSample {
    pub pid: Pid,
    /// The driver's timestamp, µs since the Unix epoch.
    pub ts_us: u64,
    pub sm: u32,
    pub mem: u32,
}

/// The slowly changing state of one GPU. Each field is None when the
/// metric is unsupported (see `GpuDevice::unsupported`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuState {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_used: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_mhz: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_mhz: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temp_c: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_mw: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_limit_mw: Option<u32>,
    /// Clock-event ("throttle") reasons, the raw NVML bitmask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_gen: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_width: Option<u32>,
}

/// Which sampler produced a stack: the perf sampler's native (DWARF-unwound)
/// stacks or py-spy's Python stacks. Each has its own frame and stack ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StackKind {
    Native,
    Python,
}

/// Which sampler took a native sample.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum SampleSource {
    /// perf's per-CPU events: the kernel's copy of the user stack.
    #[default]
    Perf,
    /// The in-process agent (`src/agent/pystacks.c`): the native stack and
    /// the Python frames of the same instant, taken in the sampled thread.
    Agent,
    /// The wall-clock sampler (`collect::perf::offcpu`): at each tick, a
    /// blocked thread's stack (Python frames, native frames, then a marker
    /// naming its system call), or a one-marker stack saying it was on a
    /// CPU (`[on cpu]`) or that its read was dropped.
    Wall,
}

impl SampleSource {
    pub fn is_perf(&self) -> bool {
        *self == SampleSource::Perf
    }
}

/// A run of stack samples of one thread, compacted for the recording: times
/// are microsecond deltas and stacks are ids of interned [`Event::StackNode`]s,
/// so that after gzip a sample costs a few bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleBatch {
    pub kind: StackKind,
    pub pid: Pid,
    pub tid: Tid,
    /// Time of the first sample, truncated to whole microseconds.
    pub t0: MonoNs,
    /// Microseconds from the previous sample (the first is 0).
    pub dt_us: Vec<u32>,
    /// Leaf node of each sample's stack (`StackNode::id`).
    pub stacks: Vec<u32>,
    /// Indices (into `stacks`) of native samples whose unwinding stopped
    /// before the thread's root (stack copy too short, no unwind info).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incomplete: Vec<u32>,
    /// Native batches only: the sampler (perf's per-CPU events, or the
    /// in-process agent whose stacks also hold the Python frames of the
    /// same instant, as [`Event::InlinePyFrame`]s).
    #[serde(default, skip_serializing_if = "SampleSource::is_perf")]
    pub source: SampleSource,
}

impl SampleBatch {
    /// Sample times, reconstructed from `t0` and the deltas.
    pub fn times(&self) -> impl Iterator<Item = MonoNs> + '_ {
        let mut us = self.t0.0 / 1000;
        self.dt_us.iter().map(move |d| {
            us += *d as u64;
            MonoNs(us * 1000)
        })
    }
}

/// Counters of the stack samplers, emitted once at the end of recording.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackStats {
    pub kind: Option<StackKind>,
    /// Samples taken (native: perf samples of the job's tasks; python:
    /// thread stacks read by py-spy).
    pub samples: u64,
    /// Records the kernel dropped because a ring buffer was full.
    pub lost_records: u64,
    /// Samples whose unwinding stopped before the thread's root.
    pub truncated: u64,
    /// Samples with no usable user registers (e.g. in kernel threads).
    pub no_user_regs: u64,
    /// Attempts that failed (python: process unreadable at that moment).
    pub errors: u64,
    /// Wall time the sampler thread spent working, in ns.
    pub busy_ns: u64,
    /// Sampling period in ns (native: 1 s / frequency).
    #[serde(default)]
    pub interval_ns: u64,
    /// Ring buffer size per CPU in bytes (native) / sampling rate (python).
    pub detail: String,
    /// Native: which sampler took the stacks, "perf-events" or
    /// "in-process-timer" (empty in older recordings: perf events).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sampler: String,
}

/// One mounted filesystem, with the block device behind it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountInfo {
    pub mount_point: String,
    /// Filesystem type as the kernel names it (`ext4`, `nfs4`, `fuse.sshfs`).
    pub fs_type: String,
    /// What is mounted (`/dev/sda1`, `server:/export`).
    pub source: String,
    /// `major:minor` of the filesystem (`st_dev` of its files).
    pub dev: String,
    /// Whole block device behind it (`sda` for `sda1`), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
    /// `/sys/block/DISK/queue/rotational`: a spinning disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotational: Option<bool>,
}

/// A regular file a process of the job held open.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenFile {
    pub path: String,
    /// `major:minor` of the filesystem holding it.
    pub dev: String,
    /// Size in bytes when first seen.
    #[serde(default)]
    pub size: u64,
}

/// One NVTX range (or mark) of a thread, as the NVTX reader paired it.
/// Field names are short: a busy job writes many of these.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NvtxRangeRec {
    /// Start, ns after the batch's `t0`.
    pub s: u64,
    /// Duration in ns; `None` for a mark (an instant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub d: Option<u64>,
    /// Message: an [`Event::NvtxName`] id.
    pub n: u32,
    /// Domain id within the instance (0: the default domain).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dom: u32,
    /// Nesting level of a push/pop range in its domain on its thread (0:
    /// outermost), as NVTX counts it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lvl: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cat: u32,
    /// A start/end range (`nvtxRangeStart`/`End`): not nested, may end on
    /// another thread (`etid`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub se: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etid: Option<Tid>,
    /// The end was not seen: the range was still open when its thread or
    /// process ended or the recording stopped, which is its `d`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub open: bool,
    /// NVTX payload, as a number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p: Option<f64>,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

fn is_zero64(v: &u64) -> bool {
    *v == 0
}

/// Completed NVTX ranges of one thread of one instrumented process image.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NvtxBatch {
    /// The instance ([`Event::NvtxInstance`]).
    pub inst: u32,
    pub pid: Pid,
    pub tid: Tid,
    pub t0: MonoNs,
    pub ranges: Vec<NvtxRangeRec>,
}

/// NVTX ranges the recording kept only as totals (over the detail budget).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NvtxTotal {
    pub inst: u32,
    pub dom: u32,
    /// An [`Event::NvtxName`] id.
    pub name: u32,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
}

/// Counters of the NVTX reader; cumulative, written every few seconds and
/// at the end (the last one holds).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NvtxStats {
    /// Process images that loaded the injection library and recorded.
    pub instances: u64,
    /// Threads that recorded.
    pub threads: u64,
    /// Records the job's threads dropped because their ring was full
    /// (gpuprof's reader fell behind).
    pub lost_in_job: u64,
    /// Ranges and marks recorded in detail.
    pub kept: u64,
    /// Ranges and marks over the detail budget: counted in `totals`.
    pub over_budget: u64,
    /// Pops and ends without a matching push/start (records lost, or a
    /// range opened before a fork and closed in the child).
    pub unmatched: u64,
    /// Rings that could not be read (malformed).
    pub bad_rings: u64,
    /// Ranges not kept in detail, per name.
    #[serde(default)]
    pub totals: Vec<NvtxTotal>,
}

/// Every event of a recording. The serialized tag is `k`.
// The header is the large variant and there is one per recording; boxing it
// would cost every reader of `Event::Header` for a few hundred bytes held
// briefly in the writer's queue.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "k", rename_all = "snake_case")]
pub enum Event {
    Header(Header),
    Footer(Footer),
    Coverage(Coverage),
    /// Recording window: events outside [start, stop] are not recorded.
    WindowStart {
        t: MonoNs,
    },
    WindowStop {
        t: MonoNs,
    },

    /// A process of the job, first seen (or seen again after exec).
    Process {
        t: MonoNs,
        pid: Pid,
        ppid: Pid,
        /// Start time from `/proc/PID/stat`, in ns since boot (CLOCK_BOOTTIME
        /// based; only used to tell a reused PID from the old process).
        start_boot_ns: u64,
        comm: String,
        cmdline: Vec<String>,
        exe: Option<String>,
        /// The launcher's rank variables in the process's own environment
        /// ([`RANK_ENV_KEYS`] only; nothing else of the environment is
        /// read into the recording). None when the environment could not be
        /// read (or the recording predates it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rank_env: Option<RankEnv>,
    },
    /// The process exited (or vanished) at about `t`.
    ProcessExit {
        t: MonoNs,
        pid: Pid,
        /// Known when gpuprof itself reaped it (the job and orphans).
        status: Option<JobStatus>,
    },
    /// A thread was first seen, or renamed (`comm` changed).
    Thread {
        t: MonoNs,
        pid: Pid,
        tid: Tid,
        comm: String,
    },
    /// Cumulative CPU of one thread; emitted only when something changed.
    ThreadCpu {
        t: MonoNs,
        pid: Pid,
        tid: Tid,
        user_ns: u64,
        sys_ns: u64,
        state: TaskState,
        /// CPU the thread last ran on.
        cpu: i32,
    },
    /// Whole-process figures (threads that exited are included in the CPU).
    ProcessSample {
        t: MonoNs,
        pid: Pid,
        user_ns: u64,
        sys_ns: u64,
        rss_bytes: u64,
        read_bytes: u64,
        write_bytes: u64,
        rchar: u64,
        wchar: u64,
        threads: u32,
    },
    /// Once a second: how long the job's threads ran and waited runnable
    /// (`/proc/PID/task/TID/schedstat`) over the last interval, and the
    /// processes outside the job that used CPU meanwhile.
    OtherCpu {
        t: MonoNs,
        /// The interval these figures cover, ending at `t`.
        interval_ns: u64,
        /// Sum over the job's threads: time on a CPU, and time runnable
        /// but waiting for one (the scheduler's run-queue delay).
        job_run_ns: u64,
        job_wait_ns: u64,
        /// Processes outside the job's tree (gpuprof excluded) that used at
        /// least [`crate::collect::others::MIN_SHARE`] of a CPU in the
        /// interval, most first, at most
        /// [`crate::collect::others::MAX_PROCS`].
        procs: Vec<OtherProc>,
    },
    /// `/proc/stat`: total and per-CPU cumulative times, runnable and
    /// blocked task counts.
    SystemCpu {
        t: MonoNs,
        total: CpuTimes,
        per_cpu: Vec<CpuTimes>,
        procs_running: u32,
        procs_blocked: u32,
    },
    /// `/proc/diskstats` for whole disks (partitions, loop/ram devices
    /// without IO are skipped).
    Disks {
        t: MonoNs,
        disks: Vec<DiskCounters>,
    },
    /// `/proc/pressure/{cpu,io,memory}`.
    Pressure {
        t: MonoNs,
        cpu: Option<Psi>,
        io: Option<Psi>,
        memory: Option<Psi>,
    },
    /// Limits of the cgroup most of the job's processes run in: emitted
    /// when a figure changed, only while a limit exists.
    Cgroup {
        t: MonoNs,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cpu: Option<CgroupCpu>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        memory: Option<CgroupMemory>,
    },
    /// A file whose code was sampled (an executable mapping), or a pseudo
    /// file such as `[vdso]` or `[anon]`.
    StackFile {
        id: u32,
        path: String,
    },
    /// A native frame: an instruction in a file, by file offset, so that it
    /// can be symbolized after the process has exited. Return addresses are
    /// recorded minus one (inside the call instruction).
    NativeFrame {
        id: u32,
        file: u32,
        offset: u64,
    },
    /// A Python function read by py-spy (line numbers are not kept: they
    /// would split one function into many frames).
    PyFrame {
        id: u32,
        name: String,
        file: String,
        /// The frame is the first of a run executed by one C call of the
        /// interpreter loop (`_PyEval_EvalFrameDefault`), as py-spy reports.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        entry: bool,
    },
    /// A Python function inside a native stack (the agent's same-instant
    /// samples): a frame id of the native space, like [`Event::NativeFrame`].
    /// Native stacks list their native frames outermost first, then these,
    /// outermost first, then at most one [`Event::StackMarker`].
    InlinePyFrame {
        id: u32,
        name: String,
        file: String,
        /// The oldest frame of the run one C call of the interpreter loop
        /// executes (its `_PyEval_EvalFrameDefault` frame).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        entry: bool,
        /// The line the frame was on at the sample's instant, decoded from
        /// the instruction it was executing; `Some(0)`: it could not be
        /// decoded; `None`: not recorded (older recordings).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        line: Option<u32>,
    },
    /// A pseudo-frame of a native stack (native frame space) saying why its
    /// Python frames are missing or partial, e.g. `[python: unreadable]`.
    StackMarker {
        id: u32,
        marker: String,
    },
    /// How the Python frames of a process are obtained: by the in-process
    /// agent at the instant of each native sample, or else by py-spy alone
    /// (`detail` says why the agent does not sample it).
    PyProcess {
        t: MonoNs,
        pid: Pid,
        /// CPython's version, e.g. "3.11.7".
        version: String,
        same_instant: bool,
        /// The agent samples with per-thread CPU-time timers (perf events
        /// refused, or `--sampler timer`), not a perf event.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        timer: bool,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        detail: String,
    },
    /// Counters of the in-process agent of one process, when recording ends.
    PyAgentStats {
        pid: Pid,
        /// Samples read from its ring.
        samples: u64,
        /// Samples whose Python frames could not be read or were cut, by
        /// status ("unreadable", "truncated", "inconsistent").
        #[serde(default)]
        partial: BTreeMap<String, u64>,
        /// Records dropped because its ring was full.
        dropped: u64,
        /// Signals delivered late because the thread had SIGTRAP blocked.
        late_signals: u64,
        /// Frames whose code object was never named (its name was lost).
        unknown_code: u64,
        /// The job set its own SIGTRAP disposition (it gets every SIGTRAP
        /// that is not the agent's).
        handler_chained: bool,
        /// Its perf event sampled the threads' periods in the kernel too
        /// (None: it sampled with timers, which count them anyway).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kernel_sampled: Option<bool>,
        /// Periods that came in one signal with a sample (a stretch in the
        /// kernel), counted as that sample's.
        #[serde(default, skip_serializing_if = "is_zero64")]
        merged_periods: u64,
        /// Periods that took no sample: they ended in the kernel, which the
        /// event did not sample.
        #[serde(default, skip_serializing_if = "is_zero64")]
        unsampled_periods: u64,
    },
    /// An interned stack: `frame` called from the stack `parent` (None: the
    /// outermost frame). Ids are per `kind`.
    StackNode {
        kind: StackKind,
        id: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent: Option<u32>,
        frame: u32,
    },
    Samples(SampleBatch),
    /// Names of native frames, written within a fraction of a second of their
    /// first sample (recordings of earlier versions: when recording ends).
    Symbols {
        /// (NativeFrame id, demangled function name)
        names: Vec<(u32, String)>,
        /// Frames that were looked up and have no name (stripped code,
        /// JIT); absent in earlier versions.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        unnamed: Vec<u32>,
    },
    StackStats(StackStats),
    /// From perf: a task was created (`pid == tid`: a new process).
    TaskFork {
        t: MonoNs,
        pid: Pid,
        tid: Tid,
        ppid: Pid,
        ptid: Tid,
    },
    /// From perf: a task ended (`pid == tid`: the process's main thread).
    TaskExit {
        t: MonoNs,
        pid: Pid,
        tid: Tid,
    },
    /// From perf: a task got a name, by `exec` or `prctl(PR_SET_NAME)`.
    TaskComm {
        t: MonoNs,
        pid: Pid,
        tid: Tid,
        comm: String,
        exec: bool,
    },
    /// `/proc/meminfo` and `/proc/vmstat`.
    Memory {
        t: MonoNs,
        total_bytes: u64,
        available_bytes: u64,
        swap_total_bytes: u64,
        swap_free_bytes: u64,
        /// Cumulative pages swapped in/out.
        pswpin: u64,
        pswpout: u64,
    },
    /// NVML opened: driver facts, once.
    GpuDriver {
        t: MonoNs,
        #[serde(default)]
        driver_version: Option<String>,
        /// As NVML encodes it: 1000 * major + 10 * minor (12040 = 12.4).
        #[serde(default)]
        cuda_driver_version: Option<i32>,
        devices: u32,
    },
    /// One GPU, once, with its fixed figures and what it cannot report.
    GpuDevice {
        t: MonoNs,
        gpu: GpuIndex,
        name: String,
        uuid: String,
        #[serde(default)]
        pci_bus_id: Option<String>,
        #[serde(default)]
        mem_total: Option<u64>,
        #[serde(default)]
        max_sm_mhz: Option<u32>,
        #[serde(default)]
        max_mem_mhz: Option<u32>,
        #[serde(default)]
        pcie_max_gen: Option<u32>,
        #[serde(default)]
        pcie_max_width: Option<u32>,
        #[serde(default)]
        mig_enabled: Option<bool>,
        /// Metrics this GPU does not support (probed once), by name.
        #[serde(default)]
        unsupported: Vec<String>,
    },
    /// Device utilization from the driver's timestamped history:
    /// `(µs since the Unix epoch, percent of the sample period during which
    /// a kernel ran)`. Mapped onto the monotonic axis with the header anchor.
    GpuUtil {
        t: MonoNs,
        gpu: GpuIndex,
        samples: Vec<(u64, u32)>,
    },
    /// GPU state; emitted when any field changed.
    GpuState {
        t: MonoNs,
        gpu: GpuIndex,
        #[serde(flatten)]
        state: GpuState,
    },
    /// PCIe throughput in KB/s (a 20 ms window measured by the driver).
    GpuPcie {
        t: MonoNs,
        gpu: GpuIndex,
        tx_kbps: u32,
        rx_kbps: u32,
    },
    /// Processes on a GPU (compute and graphics); emitted when the list or
    /// a process's memory changed.
    GpuProcesses {
        t: MonoNs,
        gpu: GpuIndex,
        procs: Vec<GpuProc>,
    },
    /// Per-process utilization: the newest sample per PID since the last
    /// poll (pid-0 rows dropped), for the PIDs whose values changed; a
    /// value holds until the PID's next sample.
    GpuProcUtil {
        t: MonoNs,
        gpu: GpuIndex,
        samples: Vec<GpuProcSample>,
    },
    /// GPU activity measured by NVML's GPU Performance Monitoring (GPM,
    /// Hopper and newer) between two samples gpuprof took at `from` and
    /// `t`: the share of that window during which any compute or graphics
    /// work ran (`NVML_GPM_METRIC_GRAPHICS_UTIL`), at the poll interval
    /// instead of the driver's 1/6 s. Windows follow each other.
    GpuActivity {
        t: MonoNs,
        gpu: GpuIndex,
        from: MonoNs,
        busy_pct: f64,
        /// `NVML_GPM_METRIC_SM_UTIL`: mean share of SMs busy, when read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sm_active_pct: Option<f64>,
    },
    /// Mounted filesystems, once at the start.
    Mounts {
        t: MonoNs,
        mounts: Vec<MountInfo>,
    },
    /// Shared objects newly mapped by a process (`/proc/PID/maps`), since
    /// the previous `Libraries` event of that process.
    Libraries {
        t: MonoNs,
        pid: Pid,
        added: Vec<String>,
    },
    /// Regular files a process held open that were not reported before
    /// (bounded per process and device).
    OpenFiles {
        t: MonoNs,
        pid: Pid,
        files: Vec<OpenFile>,
    },
    /// A process image whose NVTX calls are recorded (the injection library
    /// was loaded and wrote its first record). `parent`: the instance it
    /// was forked from, whose domain ids it inherits.
    NvtxInstance {
        t: MonoNs,
        inst: u32,
        pid: Pid,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent: Option<u32>,
    },
    /// An interned NVTX message (range or mark name).
    NvtxName {
        id: u32,
        name: String,
    },
    /// `nvtxDomainCreate`: domain `id` of instance `inst`.
    NvtxDomain {
        inst: u32,
        id: u32,
        name: String,
    },
    /// `nvtxNameCategory` / `nvtxDomainNameCategory`.
    NvtxCategory {
        inst: u32,
        dom: u32,
        id: u32,
        name: String,
    },
    /// `nvtxNameOsThread`.
    NvtxThreadName {
        inst: u32,
        tid: Tid,
        name: String,
    },
    NvtxRanges(NvtxBatch),
    NvtxStats(NvtxStats),
}

impl Event {
    /// Timestamp of the event, if it has one.
    pub fn time(&self) -> Option<MonoNs> {
        use Event::*;
        match self {
            Header(h) => Some(h.start),
            Footer(f) => Some(f.t),
            Coverage(_)
            | StackFile { .. }
            | NativeFrame { .. }
            | PyFrame { .. }
            | InlinePyFrame { .. }
            | StackMarker { .. }
            | PyAgentStats { .. }
            | StackNode { .. }
            | Symbols { .. }
            | StackStats(_)
            | NvtxName { .. }
            | NvtxDomain { .. }
            | NvtxCategory { .. }
            | NvtxThreadName { .. }
            | NvtxStats(_) => None,
            NvtxRanges(b) => Some(b.t0),
            Samples(b) => Some(b.t0),
            WindowStart { t }
            | WindowStop { t }
            | Process { t, .. }
            | ProcessExit { t, .. }
            | Thread { t, .. }
            | ThreadCpu { t, .. }
            | ProcessSample { t, .. }
            | SystemCpu { t, .. }
            | OtherCpu { t, .. }
            | Disks { t, .. }
            | Pressure { t, .. }
            | Cgroup { t, .. }
            | Memory { t, .. }
            | GpuDriver { t, .. }
            | GpuDevice { t, .. }
            | GpuUtil { t, .. }
            | GpuState { t, .. }
            | GpuPcie { t, .. }
            | GpuProcesses { t, .. }
            | GpuProcUtil { t, .. }
            | GpuActivity { t, .. }
            | TaskFork { t, .. }
            | TaskExit { t, .. }
            | TaskComm { t, .. }
            | PyProcess { t, .. }
            | Mounts { t, .. }
            | Libraries { t, .. }
            | OpenFiles { t, .. }
            | NvtxInstance { t, .. } => Some(*t),
        }
    }
}

/// A process outside the job, in [`Event::OtherCpu`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OtherProc {
    pub pid: Pid,
    /// `/proc/PID/comm`.
    pub comm: String,
    /// Its owner's name (the uid as a number when it has none).
    pub user: String,
    /// Its command line, the first time the process is listed (empty
    /// afterwards, and for kernel threads); at most 200 characters.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cmdline: String,
    /// CPU time it used in the interval (user + system).
    pub cpu_ns: u64,
    /// Share of the interval's looks (one per sampling tick) that found it
    /// on a CPU the job's threads may run on (1 in recordings before it).
    #[serde(default = "one")]
    pub on_job_cpus: f32,
}

fn one() -> f32 {
    1.0
}

#[cfg(test)]
mod tests {
    use super::CpuTimes;

    /// A damaged recording's `/proc/stat` figures (the fuzz test found
    /// u64::MAX in one) saturate instead of overflowing.
    #[test]
    fn cpu_times_saturate() {
        let c = CpuTimes {
            user: u64::MAX,
            idle: 5,
            ..Default::default()
        };
        assert_eq!((c.busy(), c.total()), (u64::MAX, u64::MAX));
        let c = CpuTimes {
            user: 1,
            nice: 2,
            system: 3,
            idle: 4,
            iowait: 5,
            irq: 6,
            softirq: 7,
            steal: 8,
        };
        assert_eq!((c.busy(), c.total()), (27, 36));
    }
}
