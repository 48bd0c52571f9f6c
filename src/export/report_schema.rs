//! The types of `report.json` (one run): the exporter fills them and
//! serializes them; `compare` and the tests read reports back through them.
//! `docs/report.schema.json` is generated from them (`schemars`).
//!
//! Compatibility rule (see `docs/outputs.md`): adding a field keeps
//! [`SCHEMA_VERSION`]; removing or renaming one, or changing its type,
//! bumps it. A reader refuses a report with a newer `schema_version`.
//! Sections added after the first version carry `#[serde(default)]`, so
//! reports written before them still read.
//!
//! The file's bytes: the report is turned into a `serde_json::Value` before
//! it is written (see [`Report::to_pretty_bytes`]), so keys are sorted
//! whatever the order of the fields here. Fields that were `null` stay
//! `Option` without `skip_serializing_if`; only keys that may be absent
//! (`*_omitted`, `recording_bytes`) skip `None`.

use std::collections::BTreeMap;
use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The `schema_version` this build writes and the newest it reads.
pub const SCHEMA_VERSION: u32 = 1;

/// Mean, median, p95 and max of a sampled series.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SeriesStats {
    pub mean: f64,
    pub p50: f64,
    pub p95: f64,
    pub max: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Clock {
    pub anchor_monotonic_ns: u64,
    pub anchor_realtime_ns: u64,
    pub anchor_error_ns: u64,
    /// The kernel's clock discipline at the start (null when unknown).
    pub sync: Option<Value>,
    /// The second clock anchor, at the end (null when unknown).
    pub end_anchor: Option<Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Attached {
    pub pid: i32,
    pub at: Option<String>,
    pub job_running_before_s: f64,
    pub processes_at_attach: u32,
    pub threads_at_attach: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ThreadsOmitted {
    pub count: u64,
    pub cpu_s: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ThreadEntry {
    pub tid: i32,
    pub name: String,
    pub cpu_s: f64,
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    pub cpu_pct: Option<SeriesStats>,
    /// Seconds per scheduler state (`R`, `S`, `D`, ...).
    pub state_s: BTreeMap<String, f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProcessEntry {
    pub pid: i32,
    pub ppid: i32,
    pub role: String,
    pub label: String,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub node_rank: Option<u32>,
    pub world_size: Option<u32>,
    pub rank_env: Option<BTreeMap<String, String>>,
    pub is_job: bool,
    pub recovered: bool,
    pub comm: String,
    pub command: Vec<String>,
    pub exe: Option<String>,
    pub start_s: f64,
    pub end_s: f64,
    pub exited: bool,
    pub exit_code: Option<i32>,
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    pub cpu_s: f64,
    pub cpu_pct: Option<SeriesStats>,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub rchar: u64,
    pub wchar: u64,
    pub max_rss_bytes: u64,
    pub threads: Vec<ThreadEntry>,
    pub threads_omitted: Option<ThreadsOmitted>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProcessesOmitted {
    pub count: u64,
    pub threads: u64,
    pub cpu_s: f64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub max_rss_bytes: u64,
    pub exited: u64,
    pub by_role: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProcessesReused {
    pub count: u64,
    pub cpu_s: f64,
    pub listed: Vec<ProcessEntry>,
}

/// One role's processes and their CPU and IO totals.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RoleTotals {
    pub processes: u64,
    pub cpu_s: f64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Disk {
    pub name: String,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub busy_pct: Option<SeriesStats>,
    pub read_mb_per_s: Option<SeriesStats>,
    pub write_mb_per_s: Option<SeriesStats>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PressureStats {
    pub some_pct: Option<SeriesStats>,
    pub full_pct: Option<SeriesStats>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Pressure {
    pub cpu: Option<PressureStats>,
    pub io: Option<PressureStats>,
    pub memory: Option<PressureStats>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SystemMemory {
    pub total_bytes: u64,
    pub available_min_bytes: Option<u64>,
    pub swap_in_bytes: u64,
    pub swap_out_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CgroupCpu {
    pub path: Option<String>,
    pub cgroup_v2: bool,
    pub quota_cores: f64,
    pub period_us: u64,
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_s: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CgroupMemory {
    pub path: Option<String>,
    pub cgroup_v2: bool,
    pub limit_bytes: u64,
    pub usage_max_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Cgroup {
    pub cpu: Option<CgroupCpu>,
    pub memory: Option<CgroupMemory>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct System {
    pub cpus: u32,
    pub cpu_busy_pct: Option<SeriesStats>,
    pub iowait_pct: Option<SeriesStats>,
    pub steal_pct: Option<SeriesStats>,
    pub runnable_tasks: Option<SeriesStats>,
    pub blocked_tasks: Option<SeriesStats>,
    pub disks: Vec<Disk>,
    pub pressure: Pressure,
    pub memory: SystemMemory,
    pub cgroup: Option<Cgroup>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Coverage {
    pub source: String,
    pub available: bool,
    pub detail: String,
}

/// `gpu`: driver facts, the idle threshold, attribution and notes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GpuSummary {
    pub available: bool,
    pub driver_version: Option<String>,
    pub cuda_driver_version: Option<String>,
    pub devices: u64,
    pub idle_threshold_pct: f64,
    /// `by_pid` or `unavailable`.
    pub attribution: String,
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GpuProcessEntry {
    pub pid: i32,
    pub role: Option<String>,
    pub rank: Option<u32>,
    pub label: Option<String>,
    pub command: Option<Vec<String>>,
    /// `compute` or `graphics`.
    pub context: String,
    pub memory_max_bytes: Option<u64>,
    pub sm_pct_mean: Option<f64>,
    pub idle_s: Option<f64>,
    pub sampled_s: Option<f64>,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    pub first_seen_s: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GpuUtilization {
    pub mean_pct: Option<f64>,
    pub p50_pct: Option<f64>,
    pub p95_pct: Option<f64>,
    pub samples: u64,
    pub sample_period_s: f64,
    pub source: String,
    pub driver_busy_fraction: Option<f64>,
    pub sm_active_mean_pct: Option<f64>,
    pub sampled_from_monotonic_ns: Option<u64>,
    pub sampled_to_monotonic_ns: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GpuIdle {
    pub total_s: f64,
    pub share_of_sampled_time: f64,
    pub startup_s: f64,
    pub steady_s: f64,
    pub shutdown_s: f64,
    pub resolution_s: f64,
    pub source: String,
    pub method: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GpuIdleGaps {
    pub count: u64,
    pub total_s: f64,
    pub median_s: f64,
    pub max_s: f64,
    pub share_of_sampled_time: f64,
    pub threshold_pct: f64,
    pub resolution_s: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GpuMemory {
    pub total_bytes: Option<u64>,
    pub used_max_bytes: Option<u64>,
    pub used_max_share: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GpuClocks {
    pub sm_mhz_min: Option<u64>,
    pub sm_mhz_max: Option<u64>,
    pub sm_max_mhz: Option<u32>,
    pub memory_max_mhz: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GpuPower {
    pub max_w: Option<f64>,
    pub limit_w: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Throttle {
    pub reason: String,
    pub seconds: f64,
    pub first_active_s: f64,
    pub share_of_run: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PcieRate {
    pub mean: Option<f64>,
    pub max: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Pcie {
    pub gen_current_min: Option<u64>,
    pub gen_max: Option<u32>,
    pub width_current_min: Option<u64>,
    pub width_max: Option<u32>,
    pub degraded: Option<bool>,
    pub tx_mb_per_s: Option<PcieRate>,
    pub rx_mb_per_s: Option<PcieRate>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OtherGpuProcesses {
    pub count: u64,
    pub memory_max_bytes: u64,
}

/// One entry of `gpus`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GpuDevice {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub pci_bus_id: Option<String>,
    pub driver_version: Option<String>,
    pub mig_enabled: Option<bool>,
    pub utilization: Option<GpuUtilization>,
    pub busy_fraction: Option<f64>,
    pub idle: Option<GpuIdle>,
    pub idle_gaps: Option<GpuIdleGaps>,
    pub memory: GpuMemory,
    pub temperature_max_c: Option<u64>,
    pub clocks: GpuClocks,
    pub power: GpuPower,
    pub throttle_reasons: Vec<Throttle>,
    /// Entries left out of `throttle_reasons` (absent when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle_reasons_omitted: Option<u64>,
    pub pcie: Pcie,
    pub processes: Vec<GpuProcessEntry>,
    /// Entries left out of `processes` (absent when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes_omitted: Option<u64>,
    pub other_processes: OtherGpuProcesses,
    pub unsupported: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NvtxGroup {
    pub domain: String,
    pub name: String,
    pub distinct_names: u64,
    pub count: u64,
    pub total_s: f64,
    pub mean_s: f64,
    pub p50_s: Option<f64>,
    pub p95_s: Option<f64>,
    pub max_s: f64,
    pub quantiles_from: u64,
    pub gpu_busy_share: Option<f64>,
    pub level: Value,
    pub processes: u64,
    pub threads: u64,
    pub open: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NvtxRecording {
    pub lost_in_job: u64,
    pub over_budget: u64,
    pub unmatched: u64,
    pub bad_rings: u64,
    pub not_kept_in_analysis: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Nvtx {
    pub captured: bool,
    pub detail: Option<String>,
    pub processes: u64,
    pub threads: u64,
    pub ranges: u64,
    pub marks: u64,
    pub domains: Vec<String>,
    pub ranges_by_name: Vec<NvtxGroup>,
    pub names_left_out: u64,
    pub recording: NvtxRecording,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StepDist {
    pub mean_s: f64,
    pub p50_s: f64,
    pub p90_s: f64,
    pub p95_s: f64,
    pub p99_s: f64,
    pub min_s: f64,
    pub max_s: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SlowCause {
    pub kind: Value,
    pub text: String,
    pub excess_s: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SlowStep {
    pub index: u64,
    pub start_s: f64,
    pub duration_s: f64,
    pub vs_median: f64,
    pub causes: Vec<SlowCause>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StepWaitShare {
    pub class: Value,
    pub p50_s: f64,
    pub p90_s: f64,
    pub share: f64,
}

/// `steps`: how steps were found and their times.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Steps {
    /// `nvtx-range`, `nvtx-range-auto`, `gpu-idle-gaps`, a stack method, or `none`.
    pub method: String,
    pub how: String,
    pub name: Option<String>,
    pub pid: Option<i32>,
    pub tid: Option<i32>,
    pub count: u64,
    pub steps_per_s: Option<f64>,
    pub time: Option<StepDist>,
    pub range_time: Option<StepDist>,
    pub slow_threshold_s: Option<f64>,
    pub slow_count: u64,
    pub slow_pattern: Option<String>,
    pub slow_causes: Vec<String>,
    pub slow: Vec<SlowStep>,
    pub waits: Vec<StepWaitShare>,
    pub notes: Vec<String>,
    pub hint: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ClassShare {
    pub share: f64,
    pub seconds: f64,
    pub samples: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FramesCount {
    pub frames: Value,
    pub samples: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GilHolder {
    pub holder: Value,
    pub seconds: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WaitThread {
    pub pid: i32,
    pub tid: i32,
    pub process: Option<String>,
    pub main_thread: bool,
    pub samples: u64,
    pub span_s: f64,
    /// `steady_state` or `thread_life`.
    pub counted_over: String,
    pub on_cpu: ClassShare,
    pub unknown: ClassShare,
    pub blocked: BTreeMap<String, ClassShare>,
    pub other_top: Vec<FramesCount>,
    pub gil_holders: Vec<GilHolder>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Waits {
    pub method: String,
    pub threads: Vec<WaitThread>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Profiler {
    pub cpu_s: f64,
    pub cpu_s_by_component: BTreeMap<String, f64>,
    pub cpu_pct_of_one_core: f64,
    pub max_rss_bytes: u64,
    pub dropped_events: u64,
    /// The recording's size on disk (absent when unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recording_bytes: Option<u64>,
}

/// One finding (shared with the merged report, which adds `host`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Finding {
    pub id: String,
    pub rank: Option<u32>,
    /// `critical`, `warning` or `info`.
    pub severity: String,
    pub title: String,
    pub gpu_time_s: Option<f64>,
    pub gpu_time_share: Option<f64>,
    pub gpu_time_basis: Option<Value>,
    pub gpu_time_method: Option<String>,
    pub evidence: Vec<String>,
    pub fix: String,
    pub docs: String,
    pub established: bool,
    /// What the finding rests on (open-ended).
    pub support: Option<Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DiagnosisInfo {
    pub gpu_measured: bool,
    pub stacks_measured: bool,
    pub notes: Vec<String>,
    pub main_thread: Option<Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OutputMissing {
    pub file: String,
    pub error: String,
}

/// `report.json` of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "gpuprof report.json")]
pub struct Report {
    pub schema_version: u32,
    pub gpuprof_version: String,
    pub command: Vec<String>,
    pub host: String,
    pub rank: Option<String>,
    pub rank_env: BTreeMap<String, String>,
    pub clock: Clock,
    pub start_time: Option<String>,
    pub duration_s: f64,
    pub interval_s: f64,
    pub exit_code: Option<i32>,
    /// How the job ended (`{"exited": 0}`, `{"signaled": 9}`, ...).
    pub job_status: Option<Value>,
    pub stop_reason: Option<String>,
    pub attached: Option<Attached>,
    pub complete: bool,
    pub processes: Vec<ProcessEntry>,
    pub processes_omitted: Option<ProcessesOmitted>,
    #[serde(default)]
    pub processes_reused: Option<ProcessesReused>,
    pub roles: BTreeMap<String, RoleTotals>,
    pub system: System,
    pub coverage: Vec<Coverage>,
    pub gpu: GpuSummary,
    pub gpus: Vec<GpuDevice>,
    /// The stack sampler's figures (open-ended: per-role and per-version maps).
    #[serde(default)]
    pub stacks: Value,
    #[serde(default)]
    pub nvtx: Option<Nvtx>,
    #[serde(default)]
    pub steps: Option<Steps>,
    /// Programs outside the job (open-ended).
    #[serde(default)]
    pub other_programs: Value,
    #[serde(default)]
    pub waits: Option<Waits>,
    pub profiler: Option<Profiler>,
    pub warnings: Vec<String>,
    /// Ranked, most GPU time explained first.
    pub findings: Vec<Finding>,
    pub diagnosis: DiagnosisInfo,
    /// Per-rank figures (open-ended).
    #[serde(default)]
    pub ranks: Value,
    /// Frameworks, CUDA runtimes, filesystems found (open-ended).
    #[serde(default)]
    pub environment: Value,
    #[serde(default)]
    pub outputs_missing: Vec<OutputMissing>,
    /// What the trace holds (open-ended).
    #[serde(default)]
    pub trace: Value,
}

/// Why a report could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path} is not a gpuprof report.json: {why}")]
    NotJson { path: String, why: String },
    #[error("{path} is not a gpuprof report.json (no schema_version)")]
    NoVersion { path: String },
    #[error("{path} has schema_version {found}, newer than this gpuprof ({build}) reads (up to {known}): upgrade gpuprof to read it")]
    TooNew {
        path: String,
        found: u64,
        known: u32,
        build: &'static str,
    },
    #[error("{path} is not a gpuprof report.json this gpuprof can read: {why}")]
    Field { path: String, why: String },
}

/// Check `schema_version` and turn `v` into `T`; errors name the file
/// (`path`) and, for a missing or wrong field, the field.
pub fn from_value<T: serde::de::DeserializeOwned>(v: Value, path: &Path) -> Result<T, ReadError> {
    let p = path.display().to_string();
    let Some(found) = v.get("schema_version").and_then(|x| x.as_u64()) else {
        return Err(ReadError::NoVersion { path: p });
    };
    if found > u64::from(SCHEMA_VERSION) {
        return Err(ReadError::TooNew {
            path: p,
            found,
            known: SCHEMA_VERSION,
            build: env!("CARGO_PKG_VERSION"),
        });
    }
    // serde_json's message names the missing or mistyped field ("missing
    // field `duration_s`"), not the path to it.
    serde_json::from_value(v).map_err(|e| ReadError::Field {
        path: p,
        why: e.to_string(),
    })
}

/// Read a report from text (`path` names it in errors).
pub fn from_str<T: serde::de::DeserializeOwned>(text: &str, path: &Path) -> Result<T, ReadError> {
    let v: Value = serde_json::from_str(text).map_err(|e| ReadError::NotJson {
        path: path.display().to_string(),
        why: e.to_string(),
    })?;
    from_value(v, path)
}

/// The file's bytes: pretty JSON with sorted keys and a final newline.
pub fn to_pretty_bytes<T: Serialize>(report: &T) -> serde_json::Result<Vec<u8>> {
    // Through a Value: its maps sort the keys.
    let v = serde_json::to_value(report)?;
    let mut buf = serde_json::to_vec_pretty(&v)?;
    buf.push(b'\n');
    Ok(buf)
}

/// A serializable value as JSON (an enum's name, a struct of a lower layer).
pub fn json_of<T: Serialize>(t: &T) -> Value {
    serde_json::to_value(t).unwrap_or(Value::Null)
}

/// An enum's serialized name (`Role::Main` → `main`).
pub fn name_of<T: Serialize>(t: &T) -> String {
    match json_of(t) {
        Value::String(s) => s,
        v => v.to_string(),
    }
}

/// The JSON Schema of `T`, as the shipped file holds it.
pub fn schema_text<T: JsonSchema>() -> String {
    let schema = schemars::schema_for!(T);
    let mut s = serde_json::to_string_pretty(&schema).unwrap_or_default();
    s.push('\n');
    s
}

/// Test helper: `docs/<file>` must hold `generated`; with `GPUPROF_BLESS=1`
/// it is rewritten instead.
#[cfg(test)]
pub(crate) fn check_shipped_schema(file: &str, generated: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs")
        .join(file);
    if std::env::var_os("GPUPROF_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, generated).unwrap();
        return;
    }
    let shipped = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        shipped == generated,
        "{} differs from the schema generated from the types: run `GPUPROF_BLESS=1 cargo test --lib schema` and commit it",
        path.display()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_report_schema_is_current() {
        check_shipped_schema("report.schema.json", &schema_text::<Report>());
    }

    #[test]
    fn too_new_and_missing_fields_are_named() {
        let p = Path::new("x/report.json");
        let e = from_value::<Report>(serde_json::json!({"schema_version": 99}), p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("schema_version 99") && e.contains("upgrade gpuprof"),
            "{e}"
        );
        assert!(e.contains("x/report.json"), "{e}");
        let e = from_value::<Report>(serde_json::json!({"schema_version": 1}), p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("missing field") && e.contains("x/report.json"),
            "{e}"
        );
        let e = from_value::<Report>(serde_json::json!({}), p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no schema_version"), "{e}");
    }
}
