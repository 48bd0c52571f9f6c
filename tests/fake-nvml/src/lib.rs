//! A fake `libnvidia-ml.so` for testing gpuprof on machines without a GPU.
//!
//! gpuprof loads this library through exactly the same `nvml-wrapper` calls
//! it uses on a real driver (`GPUPROF_NVML_LIB=/path/to/libfake_nvml.so`);
//! nothing in gpuprof knows it is talking to a fake. What the "driver"
//! reports comes from a JSON scenario named by `FAKE_NVML_SCENARIO`
//! (format: `docs/testing.md`): devices and their figures over time,
//! injected errors, processes matched by `/proc/PID/cmdline`, and an
//! activity log written by the job that is turned into utilization samples
//! on a driver-like grid.
//!
//! Every export has the C signature and struct layout of `nvml.h` (sizes
//! checked at compile time) and runs inside `catch_unwind`: a bug here
//! returns `NVML_ERROR_UNKNOWN`, it never unwinds into C.
//!
//! Built twice: `fake-nvml` (a current driver) and `fake-nvml-old` (feature
//! `old-driver`: the `_v2`/`_v3` process-list, memory and CUDA-version
//! symbols are absent from the .so, as on drivers before R510).

// The exports take raw pointers from C callers, exactly like NVML's; every
// pointer is null-checked before it is written through (`put`, `put_str`).
#![allow(clippy::not_unsafe_ptr_arg_deref)]
// The old-driver build leaves out the exports that use some helpers.
#![cfg_attr(feature = "old-driver", allow(dead_code))]

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::io::{Read, Seek, SeekFrom};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use serde_json::Value;

// ---------------------------------------------------------------------------
// ABI: return codes, enums and struct layouts from nvml.h.

type Ret = c_uint;
const SUCCESS: Ret = 0;
const ERROR_UNINITIALIZED: Ret = 1;
const ERROR_INVALID_ARGUMENT: Ret = 2;
const ERROR_NOT_SUPPORTED: Ret = 3;
const ERROR_NOT_FOUND: Ret = 6;
const ERROR_INSUFFICIENT_SIZE: Ret = 7;
const ERROR_ARGUMENT_VERSION_MISMATCH: Ret = 25;
const ERROR_UNKNOWN: Ret = 999;

/// Error names a scenario may use, with their codes.
const ERROR_NAMES: &[(&str, Ret)] = &[
    ("UNINITIALIZED", 1),
    ("INVALID_ARGUMENT", 2),
    ("NOT_SUPPORTED", 3),
    ("NO_PERMISSION", 4),
    ("NOT_FOUND", 6),
    ("INSUFFICIENT_POWER", 8),
    ("DRIVER_NOT_LOADED", 9),
    ("TIMEOUT", 10),
    ("LIBRARY_NOT_FOUND", 12),
    ("FUNCTION_NOT_FOUND", 13),
    ("GPU_IS_LOST", 15),
    ("LIB_RM_VERSION_MISMATCH", 18),
    ("NO_DATA", 21),
    ("UNKNOWN", 999),
];

type Device = *mut c_void;

/// `nvmlPciInfo_t` (the v3 layout used by `nvmlDeviceGetPciInfo_v3`).
#[repr(C)]
pub struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// `nvmlMemory_t` (v1).
#[repr(C)]
pub struct Memory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
pub struct ProcessInfoV1 {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
}

/// `nvmlProcessInfo_v2_t` and `nvmlProcessInfo_t` (the `_v3` functions):
/// the same layout.
#[repr(C)]
pub struct ProcessInfoV2 {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// `nvmlValue_t` (the 8-byte members only; the fake writes `uiVal`).
#[repr(C)]
#[allow(dead_code)]
pub union Value64 {
    d_val: f64,
    ui_val: c_uint,
    ull_val: c_ulonglong,
}

/// `nvmlSample_t`.
#[repr(C)]
pub struct Sample {
    time_stamp: c_ulonglong,
    sample_value: Value64,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessUtilizationSample {
    pid: c_uint,
    time_stamp: c_ulonglong,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

/// `nvmlGpmSupport_t`.
#[repr(C)]
pub struct GpmSupport {
    version: c_uint,
    is_supported_device: c_uint,
}

/// `nvmlGpmMetric_t`: one requested metric, filled in place.
#[repr(C)]
pub struct GpmMetric {
    metric_id: c_uint,
    nvml_return: Ret,
    value: f64,
    short_name: *const c_char,
    long_name: *const c_char,
    unit: *const c_char,
}

/// The head of `nvmlGpmMetricsGet_t`; `numMetrics` `GpmMetric`s follow
/// (the array's declared length differs between driver versions, so only
/// the requested ones are touched).
#[repr(C)]
pub struct GpmMetricsGetHead {
    version: c_uint,
    num_metrics: c_uint,
    sample1: *mut c_void,
    sample2: *mut c_void,
}

const GPM_METRICS_GET_VERSION: c_uint = 1;
const GPM_SUPPORT_VERSION: c_uint = 1;
/// `NVML_GPM_METRIC_GRAPHICS_UTIL`: % of time any compute/graphics work ran.
const GPM_METRIC_GRAPHICS_UTIL: c_uint = 1;
/// `NVML_GPM_METRIC_SM_UTIL`: % of SMs busy.
const GPM_METRIC_SM_UTIL: c_uint = 2;
/// The most metrics one call takes (`NVML_GPM_METRIC_MAX` of old headers;
/// newer ones allow more).
const GPM_METRIC_MAX: c_uint = 98;
const GPM_HANDLE_BASE: usize = 0x6770_0000;

const _: () = {
    assert!(std::mem::size_of::<GpmSupport>() == 8);
    assert!(std::mem::size_of::<GpmMetric>() == 40);
    assert!(std::mem::size_of::<GpmMetricsGetHead>() == 24);
    assert!(std::mem::size_of::<PciInfo>() == 68);
    assert!(std::mem::size_of::<Memory>() == 24);
    assert!(std::mem::size_of::<MemoryV2>() == 40);
    assert!(std::mem::size_of::<Utilization>() == 8);
    assert!(std::mem::size_of::<ProcessInfoV1>() == 16);
    assert!(std::mem::size_of::<ProcessInfoV2>() == 24);
    assert!(std::mem::size_of::<Value64>() == 8);
    assert!(std::mem::size_of::<Sample>() == 16);
    assert!(std::mem::size_of::<ProcessUtilizationSample>() == 32);
};

/// `NVML_STRUCT_VERSION(Memory, 2)`.
const MEMORY_V2_VERSION: c_uint = (std::mem::size_of::<MemoryV2>() as c_uint) | (2 << 24);

const SAMPLING_GPU_UTILIZATION: c_uint = 1;
const SAMPLING_MEMORY_UTILIZATION: c_uint = 2;
const VALUE_TYPE_UNSIGNED_INT: c_uint = 1;

/// How many samples the driver keeps per device and type: older ones are
/// overwritten, like the driver's ring buffer.
const RING: u64 = 120;

const HANDLE_BASE: usize = 0x6e76_0000;

// ---------------------------------------------------------------------------
// Clocks.

fn clock_ns(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out pointer.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The fake's time base: NVML stamps samples in µs since the Unix epoch; the
/// activity log uses CLOCK_MONOTONIC ns. One anchor pair maps between them.
#[derive(Clone, Copy)]
struct Clock {
    init_mono_ns: u64,
    init_real_ns: u64,
}

impl Clock {
    fn now() -> Clock {
        Clock {
            init_mono_ns: clock_ns(libc::CLOCK_MONOTONIC),
            init_real_ns: clock_ns(libc::CLOCK_REALTIME),
        }
    }
    fn mono_to_wall_us(&self, mono_ns: u64) -> u64 {
        (mono_ns as i128 - self.init_mono_ns as i128 + self.init_real_ns as i128).max(0) as u64
            / 1000
    }
    fn wall_us_to_mono(&self, wall_us: u64) -> u64 {
        (wall_us as i128 * 1000 - self.init_real_ns as i128 + self.init_mono_ns as i128).max(0)
            as u64
    }
    /// Seconds since `nvmlInit` for a wall-clock µs stamp (scenario time).
    fn scenario_t(&self, wall_us: u64) -> f64 {
        (wall_us as f64 * 1000.0 - self.init_real_ns as f64) / 1e9
    }
    fn now_t(&self) -> f64 {
        (clock_ns(libc::CLOCK_MONOTONIC) as f64 - self.init_mono_ns as f64) / 1e9
    }
}

// ---------------------------------------------------------------------------
// Scenario.

/// A figure over time: a constant, or steps `[[t_s, value], ...]` where t is
/// seconds since `nvmlInit` (each value holds until the next step).
#[derive(Clone, Debug)]
enum Series {
    Const(f64),
    Steps(Vec<(f64, f64)>),
}

impl Series {
    fn at(&self, t: f64) -> f64 {
        match self {
            Series::Const(v) => *v,
            Series::Steps(s) => {
                let mut v = s.first().map(|p| p.1).unwrap_or(0.0);
                for &(ts, val) in s {
                    if ts <= t {
                        v = val;
                    } else {
                        break;
                    }
                }
                v
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Compute,
    Graphics,
}

/// Processes matched by command line.
#[derive(Debug)]
struct Rule {
    cmdline_contains: String,
    /// Count a matching process forked (without exec) from another matching
    /// process, i.e. with its parent's command line (a DataLoader-style
    /// worker); off by default.
    include_children: bool,
    kind: Kind,
    used_memory_mib: Series,
    sm_util: Series,
    mem_util: Series,
    gpu_instance_id: Option<u32>,
    compute_instance_id: Option<u32>,
}

/// A process of another PID namespace (or user): its PID is shown as is.
#[derive(Debug)]
struct Foreign {
    pid: u32,
    kind: Kind,
    used_memory_mib: f64,
    sm_util: f64,
}

/// The job's GPU activity log and what was read of it.
#[derive(Debug)]
struct Activity {
    path: PathBuf,
    used_memory_mib: f64,
    offset: u64,
    partial: String,
    /// Per PID: a step in progress (start ns) and finished steps.
    open: HashMap<u32, u64>,
    done: HashMap<u32, VecDeque<(u64, u64)>>,
}

#[derive(Debug)]
struct FakeDevice {
    name: String,
    uuid: String,
    pci_bus_id: String,
    pci_device_id: u32,
    memory_total_mib: f64,
    memory_reserved_mib: f64,
    memory_base_used_mib: Series,
    memory_used_mib: Option<Series>,
    sample_period_us: u64,
    utilization: Series,
    memory_utilization: Series,
    clocks: [Series; 4],
    max_clocks: [f64; 4],
    temperature_c: Series,
    power_w: Series,
    power_limit_w: f64,
    throttle: Vec<(f64, u64)>,
    pcie_gen: Series,
    pcie_width: Series,
    pcie_max_gen: f64,
    pcie_max_width: f64,
    pcie_tx_kbps: Series,
    pcie_rx_kbps: Series,
    mig: Option<bool>,
    rules: Vec<Rule>,
    foreign: Vec<Foreign>,
    activity: Option<Activity>,
    /// GPU Performance Monitoring supported (Hopper and newer); off by
    /// default, like most GPUs.
    gpm: bool,
    errors: HashMap<String, Ret>,
    /// Function → how long a call takes, in ms (a slow or wedged driver).
    delays_ms: HashMap<String, u64>,
}

struct Scenario {
    driver_version: String,
    nvml_version: String,
    cuda_driver_version: i32,
    init_error: Option<Ret>,
    errors: HashMap<String, Ret>,
    devices: Vec<FakeDevice>,
}

type PResult<T> = Result<T, String>;

fn error_code(name: &str) -> PResult<Ret> {
    let n = name.trim_start_matches("NVML_ERROR_");
    ERROR_NAMES
        .iter()
        .find(|(k, _)| *k == n)
        .map(|(_, c)| *c)
        .ok_or_else(|| {
            format!(
                "unknown error name {name:?} (known: {})",
                ERROR_NAMES
                    .iter()
                    .map(|(k, _)| *k)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

fn parse_series(v: Option<&Value>, default: f64, what: &str) -> PResult<Series> {
    match v {
        None | Some(Value::Null) => Ok(Series::Const(default)),
        Some(Value::Number(n)) => Ok(Series::Const(n.as_f64().unwrap_or(default))),
        Some(Value::Array(a)) => {
            let mut steps = Vec::with_capacity(a.len());
            for p in a {
                let pair = p.as_array().filter(|p| p.len() == 2);
                match pair.and_then(|p| Some((p[0].as_f64()?, p[1].as_f64()?))) {
                    Some(s) => steps.push(s),
                    None => {
                        return Err(format!(
                            "{what}: expected a number or [[t_s, value], ...], found {p}"
                        ))
                    }
                }
            }
            steps.sort_by(|a, b| a.0.total_cmp(&b.0));
            Ok(Series::Steps(steps))
        }
        Some(other) => Err(format!(
            "{what}: expected a number or [[t_s, value], ...], found {other}"
        )),
    }
}

/// Clock-event ("throttle") reason bits of nvml.h, by the names a scenario uses.
const REASONS: &[(&str, u64)] = &[
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
];

fn parse_reason_set(v: &Value, what: &str) -> PResult<u64> {
    match v {
        Value::Number(n) => n.as_u64().ok_or_else(|| format!("{what}: bad bitmask {n}")),
        Value::Array(a) => {
            let mut bits = 0;
            for r in a {
                let name = r
                    .as_str()
                    .ok_or_else(|| format!("{what}: expected reason names, found {r}"))?;
                let bit = REASONS
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, b)| *b)
                    .ok_or_else(|| {
                        format!(
                            "{what}: unknown reason {name:?} (known: {})",
                            REASONS
                                .iter()
                                .map(|(k, _)| *k)
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    })?;
                bits |= bit;
            }
            Ok(bits)
        }
        other => Err(format!("{what}: expected a list of reasons, found {other}")),
    }
}

/// `["a", "b"]` (always) or `[[t_s, ["a"]], [t_s, []], ...]` (steps).
fn parse_throttle(v: Option<&Value>) -> PResult<Vec<(f64, u64)>> {
    let what = "throttle_reasons";
    match v {
        None | Some(Value::Null) => Ok(vec![(0.0, 0)]),
        Some(Value::Array(a)) if a.first().is_some_and(|x| x.is_array()) => {
            let mut out = Vec::new();
            for p in a {
                let p = p
                    .as_array()
                    .filter(|p| p.len() == 2)
                    .ok_or_else(|| format!("{what}: expected [t_s, [reasons]], found {p}"))?;
                let t = p[0]
                    .as_f64()
                    .ok_or_else(|| format!("{what}: bad time {}", p[0]))?;
                out.push((t, parse_reason_set(&p[1], what)?));
            }
            out.sort_by(|a, b| a.0.total_cmp(&b.0));
            Ok(out)
        }
        Some(v) => Ok(vec![(0.0, parse_reason_set(v, what)?)]),
    }
}

fn throttle_at(steps: &[(f64, u64)], t: f64) -> u64 {
    let mut v = steps.first().map(|s| s.1).unwrap_or(0);
    for &(ts, bits) in steps {
        if ts <= t {
            v = bits;
        } else {
            break;
        }
    }
    v
}

fn parse_errors(v: Option<&Value>, what: &str) -> PResult<HashMap<String, Ret>> {
    let mut out = HashMap::new();
    if let Some(v) = v {
        let o = v
            .as_object()
            .ok_or_else(|| format!("{what}: expected {{\"nvmlFunction\": \"ERROR\"}}"))?;
        for (k, e) in o {
            let e = e
                .as_str()
                .ok_or_else(|| format!("{what}.{k}: expected an error name"))?;
            out.insert(k.clone(), error_code(e)?);
        }
    }
    Ok(out)
}

fn parse_kind(v: Option<&Value>) -> PResult<Kind> {
    match v.and_then(|v| v.as_str()) {
        None | Some("compute") => Ok(Kind::Compute),
        Some("graphics") => Ok(Kind::Graphics),
        Some(o) => Err(format!("type: expected compute or graphics, found {o:?}")),
    }
}

/// `"${VAR}"` anywhere in a path is replaced by the environment variable.
fn expand_env(s: &str) -> PResult<String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let end = rest[i..]
            .find('}')
            .ok_or_else(|| format!("unterminated ${{ in {s:?}"))?;
        let var = &rest[i + 2..i + end];
        let val =
            std::env::var(var).map_err(|_| format!("{s:?} names ${{{var}}}, which is not set"))?;
        out.push_str(&val);
        rest = &rest[i + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Reject keys the fake does not know: a typo must not silently fall back
/// to a default.
fn known_keys(o: &serde_json::Map<String, Value>, what: &str, known: &[&str]) -> PResult<()> {
    for k in o.keys() {
        if !known.contains(&k.as_str()) {
            return Err(format!(
                "{what}: unknown key {k:?} (known: {})",
                known.join(", ")
            ));
        }
    }
    Ok(())
}

const TOP_KEYS: &[&str] = &[
    "description",
    "driver_version",
    "nvml_version",
    "cuda_driver_version",
    "init_error",
    "errors",
    "devices",
];
const DEVICE_KEYS: &[&str] = &[
    "description",
    "name",
    "uuid",
    "pci_bus_id",
    "pci_device_id",
    "memory_total_mib",
    "memory_reserved_mib",
    "memory_base_used_mib",
    "memory_used_mib",
    "sample_period_ms",
    "utilization",
    "memory_utilization",
    "clocks_mhz",
    "max_clocks_mhz",
    "temperature_c",
    "power_w",
    "power_limit_w",
    "throttle_reasons",
    "pcie",
    "mig",
    "processes",
    "foreign_processes",
    "activity_log",
    "gpm",
    "errors",
    "delays_ms",
];
const CLOCK_KEYS: &[&str] = &["graphics", "sm", "memory", "video"];
const PCIE_KEYS: &[&str] = &["gen", "width", "max_gen", "max_width", "tx_kbps", "rx_kbps"];
const PROCESS_KEYS: &[&str] = &[
    "cmdline_contains",
    "include_children",
    "type",
    "used_memory_mib",
    "sm_util",
    "mem_util",
    "gpu_instance_id",
    "compute_instance_id",
];
const FOREIGN_KEYS: &[&str] = &["pid", "type", "used_memory_mib", "sm_util"];
const ACTIVITY_KEYS: &[&str] = &["path", "used_memory_mib"];

fn f(o: &serde_json::Map<String, Value>, k: &str, default: f64) -> f64 {
    o.get(k).and_then(|v| v.as_f64()).unwrap_or(default)
}

fn parse_device(i: usize, v: &Value) -> PResult<FakeDevice> {
    let what = format!("devices[{i}]");
    let o = v
        .as_object()
        .ok_or_else(|| format!("{what}: expected an object"))?;
    known_keys(o, &what, DEVICE_KEYS)?;
    for (k, keys) in [
        ("clocks_mhz", CLOCK_KEYS),
        ("max_clocks_mhz", CLOCK_KEYS),
        ("pcie", PCIE_KEYS),
    ] {
        if let Some(Value::Object(sub)) = o.get(k) {
            known_keys(sub, &format!("{what}.{k}"), keys)?;
        }
    }
    let s = |k: &str, default: String| -> String {
        o.get(k)
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .unwrap_or(default)
    };
    let ser = |k: &str, default: f64| parse_series(o.get(k), default, &format!("{what}.{k}"));
    let clocks = o.get("clocks_mhz").and_then(|v| v.as_object());
    let maxc = o.get("max_clocks_mhz").and_then(|v| v.as_object());
    let clock = |name: &str, default: f64| {
        parse_series(
            clocks.and_then(|c| c.get(name)),
            default,
            &format!("{what}.clocks_mhz.{name}"),
        )
    };
    let maxclock = |name: &str, default: f64| maxc.map(|c| f(c, name, default)).unwrap_or(default);
    let pcie = o.get("pcie").and_then(|v| v.as_object());
    let pcie_ser = |k: &str, default: f64| {
        parse_series(
            pcie.and_then(|p| p.get(k)),
            default,
            &format!("{what}.pcie.{k}"),
        )
    };
    let pcie_max = |k: &str, default: f64| pcie.map(|p| f(p, k, default)).unwrap_or(default);

    let mut rules = Vec::new();
    if let Some(ps) = o.get("processes") {
        let ps = ps
            .as_array()
            .ok_or_else(|| format!("{what}.processes: expected a list"))?;
        for (j, p) in ps.iter().enumerate() {
            let pw = format!("{what}.processes[{j}]");
            let po = p
                .as_object()
                .ok_or_else(|| format!("{pw}: expected an object"))?;
            known_keys(po, &pw, PROCESS_KEYS)?;
            let pat = po
                .get("cmdline_contains")
                .and_then(|v| v.as_str())
                .ok_or_else(|| format!("{pw}: cmdline_contains (a string) is required"))?;
            rules.push(Rule {
                cmdline_contains: pat.to_string(),
                include_children: po
                    .get("include_children")
                    .and_then(|v| v.as_bool())
                    .unwrap_or(false),
                kind: parse_kind(po.get("type")).map_err(|e| format!("{pw}.{e}"))?,
                used_memory_mib: parse_series(
                    po.get("used_memory_mib"),
                    1024.0,
                    &format!("{pw}.used_memory_mib"),
                )?,
                sm_util: parse_series(po.get("sm_util"), 0.0, &format!("{pw}.sm_util"))?,
                mem_util: parse_series(po.get("mem_util"), 0.0, &format!("{pw}.mem_util"))?,
                gpu_instance_id: po
                    .get("gpu_instance_id")
                    .and_then(|v| v.as_u64())
                    .map(|v| v as u32),
                compute_instance_id: po
                    .get("compute_instance_id")
                    .and_then(|v| v.as_u64())
                    .map(|v| v as u32),
            });
        }
    }
    let mut foreign = Vec::new();
    if let Some(ps) = o.get("foreign_processes") {
        for (j, p) in ps
            .as_array()
            .ok_or_else(|| format!("{what}.foreign_processes: expected a list"))?
            .iter()
            .enumerate()
        {
            let pw = format!("{what}.foreign_processes[{j}]");
            let po = p
                .as_object()
                .ok_or_else(|| format!("{pw}: expected an object"))?;
            known_keys(po, &pw, FOREIGN_KEYS)?;
            foreign.push(Foreign {
                pid: po
                    .get("pid")
                    .and_then(|v| v.as_u64())
                    .ok_or_else(|| format!("{pw}: pid is required"))? as u32,
                kind: parse_kind(po.get("type")).map_err(|e| format!("{pw}.{e}"))?,
                used_memory_mib: f(po, "used_memory_mib", 1024.0),
                sm_util: f(po, "sm_util", 0.0),
            });
        }
    }
    let activity = match o.get("activity_log") {
        None | Some(Value::Null) => None,
        Some(v) => {
            let (path, mem) = match v {
                Value::String(p) => (p.clone(), 2048.0),
                Value::Object(a) => {
                    known_keys(a, &format!("{what}.activity_log"), ACTIVITY_KEYS)?;
                    let path = a
                        .get("path")
                        .and_then(|v| v.as_str())
                        .ok_or_else(|| format!("{what}.activity_log.path is required"))?;
                    (path.to_string(), f(a, "used_memory_mib", 2048.0))
                }
                _ => return Err(format!("{what}.activity_log: expected a path or an object")),
            };
            Some(Activity {
                path: PathBuf::from(
                    expand_env(&path).map_err(|e| format!("{what}.activity_log: {e}"))?,
                ),
                used_memory_mib: mem,
                offset: 0,
                partial: String::new(),
                open: HashMap::new(),
                done: HashMap::new(),
            })
        }
    };
    let period_ms = f(o, "sample_period_ms", 1000.0 / 6.0);
    if !(1.0..=10_000.0).contains(&period_ms) {
        return Err(format!(
            "{what}.sample_period_ms: {period_ms} is outside 1..10000"
        ));
    }
    let mig = match o.get("mig") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(Value::String(s)) if s == "enabled" => Some(true),
        Some(Value::String(s)) if s == "disabled" => Some(false),
        Some(o) => return Err(format!("{what}.mig: expected enabled/disabled, found {o}")),
    };
    Ok(FakeDevice {
        name: s("name", "NVIDIA Fake GPU".into()),
        uuid: s("uuid", format!("GPU-fa4e0000-0000-4000-8000-{:012x}", i)),
        pci_bus_id: s("pci_bus_id", format!("00000000:{:02X}:00.0", 0x18 + i)),
        pci_device_id: f(o, "pci_device_id", 0x2330_10de as f64) as u32,
        memory_total_mib: f(o, "memory_total_mib", 81559.0),
        memory_reserved_mib: f(o, "memory_reserved_mib", 0.0),
        memory_base_used_mib: ser("memory_base_used_mib", 0.0)?,
        memory_used_mib: match o.get("memory_used_mib") {
            None | Some(Value::Null) => None,
            Some(_) => Some(ser("memory_used_mib", 0.0)?),
        },
        sample_period_us: (period_ms * 1000.0).round() as u64,
        utilization: ser("utilization", 0.0)?,
        memory_utilization: ser("memory_utilization", 0.0)?,
        clocks: [
            clock("graphics", 1755.0)?,
            clock("sm", 1755.0)?,
            clock("memory", 2619.0)?,
            clock("video", 1635.0)?,
        ],
        max_clocks: [
            maxclock("graphics", 1980.0),
            maxclock("sm", 1980.0),
            maxclock("memory", 2619.0),
            maxclock("video", 1980.0),
        ],
        temperature_c: ser("temperature_c", 40.0)?,
        power_w: ser("power_w", 120.0)?,
        power_limit_w: f(o, "power_limit_w", 700.0),
        throttle: parse_throttle(o.get("throttle_reasons"))?,
        pcie_gen: pcie_ser("gen", 5.0)?,
        pcie_width: pcie_ser("width", 16.0)?,
        pcie_max_gen: pcie_max("max_gen", 5.0),
        pcie_max_width: pcie_max("max_width", 16.0),
        pcie_tx_kbps: pcie_ser("tx_kbps", 1000.0)?,
        pcie_rx_kbps: pcie_ser("rx_kbps", 1000.0)?,
        mig,
        rules,
        foreign,
        activity,
        gpm: match o.get("gpm") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(o) => return Err(format!("{what}.gpm: expected true or false, found {o}")),
        },
        errors: parse_errors(o.get("errors"), &format!("{what}.errors"))?,
        delays_ms: match o.get("delays_ms") {
            None => HashMap::new(),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| {
                    v.as_u64()
                        .map(|ms| (k.clone(), ms))
                        .ok_or_else(|| format!("{what}.delays_ms.{k}: expected milliseconds"))
                })
                .collect::<PResult<_>>()?,
            Some(_) => {
                return Err(format!(
                    "{what}.delays_ms: expected {{\"nvmlFunction\": ms}}"
                ))
            }
        },
    })
}

fn parse_scenario(text: &str) -> PResult<Scenario> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let o = v
        .as_object()
        .ok_or("expected a JSON object at the top level")?;
    known_keys(o, "scenario", TOP_KEYS)?;
    let init_error = match o.get("init_error").and_then(|v| v.as_str()) {
        Some(e) => Some(error_code(e)?),
        None => None,
    };
    let mut devices = Vec::new();
    if let Some(ds) = o.get("devices") {
        for (i, d) in ds
            .as_array()
            .ok_or("devices: expected a list")?
            .iter()
            .enumerate()
        {
            devices.push(parse_device(i, d)?);
        }
    }
    Ok(Scenario {
        driver_version: o
            .get("driver_version")
            .and_then(|v| v.as_str())
            .unwrap_or("550.54.15")
            .to_string(),
        nvml_version: o
            .get("nvml_version")
            .and_then(|v| v.as_str())
            .unwrap_or("12.550.54.15")
            .to_string(),
        cuda_driver_version: o
            .get("cuda_driver_version")
            .and_then(|v| v.as_i64())
            .unwrap_or(12040) as i32,
        init_error,
        errors: parse_errors(o.get("errors"), "errors")?,
        devices,
    })
}

// ---------------------------------------------------------------------------
// Processes on the machine, matched by command line.

#[derive(Clone)]
struct ProcEntry {
    ppid: u32,
    cmdline: String,
    /// When the PID was first listed (CLOCK_MONOTONIC ns).
    seen_at: u64,
}

/// A process this young may still be exec'ing (a shim or launcher that
/// execs the real program): its command line is re-read at every listing.
const YOUNG_NS: u64 = 3_000_000_000;

impl ProcEntry {
    fn settled(&self, now: u64) -> bool {
        now.saturating_sub(self.seen_at) >= YOUNG_NS
            // An empty command line is a kernel thread (child of kthreadd,
            // PID 2) or a process caught mid-exec: read it again.
            && (!self.cmdline.is_empty() || self.ppid == 2 || self.ppid == 0)
    }
}

/// A cached view of `/proc`. A driver does not scan /proc, and the fake's
/// cost counts against gpuprof's in the polling benchmark, so: the PID list
/// (one `getdents`) is refreshed at most every `LIST_NS`; a new PID is read
/// at once (and its parent again, which may have exec'd since); young PIDs
/// (`YOUNG_NS`) at every listing, since they may still exec; every PID at
/// most every `REREAD_NS`.
struct ProcTable {
    listed_at: u64,
    reread_at: u64,
    procs: HashMap<u32, ProcEntry>,
    /// Matches per (pattern, include_children), valid until the next listing.
    matched: HashMap<(String, bool), std::sync::Arc<Vec<u32>>>,
}

const LIST_NS: u64 = 250_000_000;
const REREAD_NS: u64 = 2_000_000_000;

/// The parent PID from `/proc/PID/stat` (after the parenthesized name,
/// which may itself hold spaces and parentheses).
fn read_ppid(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let close = s.rfind(')')?;
    s.get(close + 2..)?.split(' ').nth(1)?.parse().ok()
}

fn read_cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            String::from_utf8_lossy(&b)
                .trim_end_matches('\0')
                .replace('\0', " ")
        })
        .unwrap_or_default()
}

impl ProcTable {
    fn refresh(&mut self) {
        let now = clock_ns(libc::CLOCK_MONOTONIC);
        if self.listed_at != 0 && now.saturating_sub(self.listed_at) < LIST_NS {
            return;
        }
        self.listed_at = now;
        let reread = self.reread_at == 0 || now.saturating_sub(self.reread_at) >= REREAD_NS;
        if reread {
            self.reread_at = now;
        }
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return;
        };
        let mut next = HashMap::with_capacity(self.procs.len() + 8);
        let mut new_parents = Vec::new();
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            match self.procs.remove(&pid) {
                Some(old) if !reread && old.settled(now) => {
                    next.insert(pid, old);
                }
                old => {
                    let Some(ppid) = read_ppid(pid) else {
                        continue;
                    };
                    if old.is_none() {
                        new_parents.push(ppid);
                    }
                    let seen_at = old.map_or(now, |o| o.seen_at);
                    next.insert(
                        pid,
                        ProcEntry {
                            ppid,
                            cmdline: read_cmdline(pid),
                            seen_at,
                        },
                    );
                }
            }
        }
        // A new process's parent may have exec'd since it was read (the
        // forked-worker rule compares their command lines): re-read it.
        for ppid in new_parents {
            if let (Some(e), Some(pp)) = (next.get_mut(&ppid), read_ppid(ppid)) {
                e.ppid = pp;
                e.cmdline = read_cmdline(ppid);
            }
        }
        self.procs = next;
        self.matched.clear();
    }

    /// PIDs whose command line contains `pattern`, sorted; the caller's own
    /// PID never matches, and a process forked (without exec) from a
    /// matching one — same command line as its parent, like a DataLoader
    /// worker — only with `include_children`.
    fn matching(
        &mut self,
        pattern: &str,
        include_children: bool,
        self_pid: u32,
    ) -> std::sync::Arc<Vec<u32>> {
        if let Some(m) = self.matched.get(&(pattern.to_string(), include_children)) {
            return m.clone();
        }
        let procs = &self.procs;
        let matches = |pid: u32| {
            pid != self_pid && procs.get(&pid).is_some_and(|p| p.cmdline.contains(pattern))
        };
        let mut pids: Vec<u32> = procs
            .iter()
            .filter(|(pid, e)| {
                matches(**pid)
                    && (include_children
                        || !(matches(e.ppid)
                            && procs.get(&e.ppid).is_some_and(|p| p.cmdline == e.cmdline)))
            })
            .map(|(pid, _)| *pid)
            .collect();
        pids.sort_unstable();
        if std::env::var_os("FAKE_NVML_DEBUG").is_some() {
            let cands: Vec<String> = procs
                .iter()
                .filter(|(_, e)| e.cmdline.contains(pattern))
                .map(|(pid, e)| format!("{pid}<-{}: {}", e.ppid, e.cmdline))
                .collect();
            eprintln!("fake-nvml: {pattern:?} matches {pids:?} of {cands:?} (self {self_pid})");
        }
        let pids = std::sync::Arc::new(pids);
        self.matched
            .insert((pattern.to_string(), include_children), pids.clone());
        pids
    }

    fn alive(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }
}

// ---------------------------------------------------------------------------
// The fake driver's state.

struct Fake {
    scenario: Scenario,
    clock: Clock,
    procs: ProcTable,
    self_pid: u32,
    init_count: u32,
    /// GPM samples by handle: the device and CLOCK_MONOTONIC ns at which
    /// `nvmlGpmSampleGet` filled them (None: allocated, not yet filled).
    gpm_samples: HashMap<usize, Option<(usize, u64)>>,
    next_gpm: usize,
}

/// One process on a device as the driver lists it.
struct GpuProc {
    pid: u32,
    kind: Kind,
    used_bytes: u64,
    gi: Option<u32>,
    ci: Option<u32>,
    /// Where its SM utilization comes from.
    util: ProcUtilSource,
}

enum ProcUtilSource {
    Rule(usize),
    Foreign(f64),
    Activity,
}

const MIB: f64 = 1024.0 * 1024.0;

impl Activity {
    /// Read what the job appended since the last call. Lines:
    /// `B <pid> <ns>` (step began), `E <pid> <ns>` (step ended), where ns is
    /// CLOCK_MONOTONIC; `<pid> <start_ns> <end_ns>` is accepted as a whole step.
    fn poll(&mut self, keep_after_ns: u64) {
        if let Ok(mut file) = std::fs::File::open(&self.path) {
            let len = file.metadata().map(|m| m.len()).unwrap_or(0);
            if len < self.offset {
                // Truncated or replaced: start over.
                self.offset = 0;
                self.partial.clear();
                self.open.clear();
                self.done.clear();
            }
            if len > self.offset && file.seek(SeekFrom::Start(self.offset)).is_ok() {
                let mut buf = Vec::with_capacity((len - self.offset).min(1 << 20) as usize);
                let got = file
                    .take((len - self.offset).min(1 << 20))
                    .read_to_end(&mut buf)
                    .unwrap_or(0);
                self.offset += got as u64;
                self.partial.push_str(&String::from_utf8_lossy(&buf));
                let text = std::mem::take(&mut self.partial);
                let mut lines = text.split('\n').peekable();
                while let Some(line) = lines.next() {
                    if lines.peek().is_none() {
                        // No newline yet: the writer is mid-line.
                        self.partial = line.to_string();
                        break;
                    }
                    self.line(line);
                }
            }
        }
        for steps in self.done.values_mut() {
            while steps.front().is_some_and(|s| s.1 < keep_after_ns) {
                steps.pop_front();
            }
        }
        self.done.retain(|_, s| !s.is_empty());
    }

    fn line(&mut self, line: &str) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let num = |s: &str| s.parse::<u64>().ok();
        match parts.as_slice() {
            ["B", pid, t] => {
                if let (Some(pid), Some(t)) = (num(pid), num(t)) {
                    self.open.insert(pid as u32, t);
                }
            }
            ["E", pid, t] => {
                if let (Some(pid), Some(t)) = (num(pid), num(t)) {
                    let pid = pid as u32;
                    if let Some(start) = self.open.remove(&pid) {
                        self.push(pid, start, t);
                    }
                }
            }
            [pid, s, e] => {
                if let (Some(pid), Some(s), Some(e)) = (num(pid), num(s), num(e)) {
                    self.push(pid as u32, s, e);
                }
            }
            _ => {}
        }
    }

    fn push(&mut self, pid: u32, start: u64, end: u64) {
        if end > start {
            let q = self.done.entry(pid).or_default();
            q.push_back((start, end));
            // Bounded: a runaway log cannot grow the fake without limit.
            if q.len() > 100_000 {
                q.pop_front();
            }
        }
    }

    fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        let mut v: Vec<u32> = self.done.keys().chain(self.open.keys()).copied().collect();
        v.sort_unstable();
        v.dedup();
        v.into_iter()
    }

    /// Busy ns of `pid` (or of any PID) within [a, b) in monotonic ns.
    fn busy_ns(&self, pid: Option<u32>, a: u64, b: u64, now: u64) -> u64 {
        let mut iv: Vec<(u64, u64)> = Vec::new();
        for (p, steps) in &self.done {
            if pid.is_none_or(|x| x == *p) {
                for &(s, e) in steps {
                    if e > a && s < b {
                        iv.push((s.max(a), e.min(b)));
                    }
                }
            }
        }
        for (p, &s) in &self.open {
            if pid.is_none_or(|x| x == *p) && s < b {
                iv.push((s.max(a), now.min(b)));
            }
        }
        iv.sort_unstable();
        let mut busy = 0;
        let mut cur: Option<(u64, u64)> = None;
        for (s, e) in iv {
            if e <= s {
                continue;
            }
            match cur {
                Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(e))),
                Some((cs, ce)) => {
                    busy += ce - cs;
                    cur = Some((s, e));
                }
                None => cur = Some((s, e)),
            }
        }
        if let Some((cs, ce)) = cur {
            busy += ce - cs;
        }
        busy
    }
}

impl Fake {
    fn device(&mut self, h: Device) -> Result<(usize, &mut FakeDevice), Ret> {
        let i = (h as usize).wrapping_sub(HANDLE_BASE);
        let n = self.scenario.devices.len();
        if i < n {
            Ok((i, &mut self.scenario.devices[i]))
        } else {
            Err(ERROR_INVALID_ARGUMENT)
        }
    }

    /// An injected error for `func` on device `i` (or system-wide).
    fn injected(&self, i: Option<usize>, func: &str) -> Result<(), Ret> {
        if let Some(i) = i {
            if let Some(&e) = self.scenario.devices[i].errors.get(func) {
                return Err(e);
            }
        }
        match self.scenario.errors.get(func) {
            Some(&e) => Err(e),
            None => Ok(()),
        }
    }

    fn t(&self) -> f64 {
        self.clock.now_t()
    }

    fn now_wall_us(&self) -> u64 {
        self.clock.mono_to_wall_us(clock_ns(libc::CLOCK_MONOTONIC))
    }

    /// Samples of the driver's history newer than `last_seen` (µs since the
    /// epoch), oldest first, on the device's grid: at most `RING`.
    fn grid(&mut self, i: usize, last_seen: u64) -> Vec<u64> {
        let dev = &self.scenario.devices[i];
        let p = dev.sample_period_us;
        // With an activity log a sample is published a few ms after its
        // period ends, so the job's log line for a step that ran in it has
        // been written (a driver publishes at once; the lag is invisible
        // next to a 100 ms poll).
        let lag = if dev.activity.is_some() { 5_000 } else { 0 };
        let now = self.now_wall_us().saturating_sub(lag);
        let first_possible = self.clock.init_real_ns / 1000 + p;
        let newest = now / p * p;
        if newest < first_possible {
            return Vec::new();
        }
        let mut oldest = (last_seen / p + 1) * p;
        oldest = oldest.max(first_possible.div_ceil(p) * p);
        oldest = oldest.max(newest.saturating_sub((RING - 1) * p));
        if oldest > newest {
            return Vec::new();
        }
        (0..=(newest - oldest) / p)
            .map(|k| oldest + k * p)
            .collect()
    }

    fn refresh_activity(&mut self, i: usize) {
        let keep = clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(
            (RING + 10) * self.scenario.devices[i].sample_period_us * 1000 + 2_000_000_000,
        );
        if let Some(a) = self.scenario.devices[i].activity.as_mut() {
            a.poll(keep);
        }
    }

    /// Percent of the sample period ending at `ts` during which a "kernel"
    /// ran: from the activity log when there is one, else the scenario.
    fn util_at(&self, i: usize, ts: u64, pid: Option<u32>) -> u32 {
        let dev = &self.scenario.devices[i];
        match &dev.activity {
            Some(a) => {
                let p = dev.sample_period_us;
                let b = self.clock.wall_us_to_mono(ts);
                let s = self.clock.wall_us_to_mono(ts.saturating_sub(p));
                let busy = a.busy_ns(pid, s, b, clock_ns(libc::CLOCK_MONOTONIC));
                ((busy as f64 / (b - s).max(1) as f64) * 100.0)
                    .round()
                    .min(100.0) as u32
            }
            None => dev
                .utilization
                .at(self.clock.scenario_t(ts))
                .clamp(0.0, 100.0)
                .round() as u32,
        }
    }

    /// Percent of [a, b) (CLOCK_MONOTONIC ns) during which a "kernel" ran
    /// on device `i`: from the activity log, else the scenario's
    /// utilization at the window's middle.
    fn busy_pct_between(&mut self, i: usize, a: u64, b: u64) -> f64 {
        self.refresh_activity(i);
        let dev = &self.scenario.devices[i];
        match &dev.activity {
            Some(act) => {
                let busy = act.busy_ns(None, a, b, clock_ns(libc::CLOCK_MONOTONIC));
                (busy as f64 / (b - a).max(1) as f64 * 100.0).min(100.0)
            }
            None => {
                let mid = self.clock.mono_to_wall_us(a + (b - a) / 2);
                dev.utilization
                    .at(self.clock.scenario_t(mid))
                    .clamp(0.0, 100.0)
            }
        }
    }

    /// The processes on device `i`, as the driver would list them now.
    fn processes(&mut self, i: usize) -> Vec<GpuProc> {
        self.procs.refresh();
        self.refresh_activity(i);
        let t = self.t();
        let self_pid = self.self_pid;
        let dev = &self.scenario.devices[i];
        let mut out: Vec<GpuProc> = Vec::new();
        for (r, rule) in dev.rules.iter().enumerate() {
            let pids = self
                .procs
                .matching(&rule.cmdline_contains, rule.include_children, self_pid);
            for &pid in pids.iter() {
                if out.iter().any(|p| p.pid == pid) {
                    continue;
                }
                out.push(GpuProc {
                    pid,
                    kind: rule.kind,
                    used_bytes: (rule.used_memory_mib.at(t).max(0.0) * MIB) as u64,
                    gi: rule.gpu_instance_id,
                    ci: rule.compute_instance_id,
                    util: ProcUtilSource::Rule(r),
                });
            }
        }
        if let Some(a) = &dev.activity {
            for pid in a.pids() {
                if pid != self_pid && self.procs.alive(pid) && !out.iter().any(|p| p.pid == pid) {
                    out.push(GpuProc {
                        pid,
                        kind: Kind::Compute,
                        used_bytes: (a.used_memory_mib * MIB) as u64,
                        gi: None,
                        ci: None,
                        util: ProcUtilSource::Activity,
                    });
                }
            }
        }
        for fp in &dev.foreign {
            out.push(GpuProc {
                pid: fp.pid,
                kind: fp.kind,
                used_bytes: (fp.used_memory_mib * MIB) as u64,
                gi: None,
                ci: None,
                util: ProcUtilSource::Foreign(fp.sm_util),
            });
        }
        out
    }

    /// (total, reserved, used) bytes.
    fn memory(&mut self, i: usize) -> (u64, u64, u64) {
        let procs: u64 = self.processes(i).iter().map(|p| p.used_bytes).sum();
        let t = self.t();
        let dev = &self.scenario.devices[i];
        let total = (dev.memory_total_mib * MIB) as u64;
        let reserved = (dev.memory_reserved_mib * MIB) as u64;
        let used = match &dev.memory_used_mib {
            Some(s) => (s.at(t).max(0.0) * MIB) as u64,
            None => (dev.memory_base_used_mib.at(t).max(0.0) * MIB) as u64 + procs,
        };
        (total, reserved, used.min(total.saturating_sub(reserved)))
    }
}

static FAKE: Mutex<Option<Fake>> = Mutex::new(None);

fn lock() -> MutexGuard<'static, Option<Fake>> {
    FAKE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Run an export: NVML must be initialized, panics become NVML_ERROR_UNKNOWN.
fn with_fake(name: &str, f: impl FnOnce(&mut Fake) -> Result<(), Ret>) -> Ret {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut g = lock();
        match g.as_mut() {
            None => ERROR_UNINITIALIZED,
            Some(fake) => match f(fake) {
                Ok(()) => SUCCESS,
                Err(e) => e,
            },
        }
    }));
    r.unwrap_or_else(|_| {
        eprintln!("fake-nvml: {name} panicked; returning NVML_ERROR_UNKNOWN");
        ERROR_UNKNOWN
    })
}

/// Run a per-device export after checking the handle and injected errors.
fn with_device(name: &str, h: Device, f: impl FnOnce(&mut Fake, usize) -> Result<(), Ret>) -> Ret {
    with_fake(name, |fake| {
        let (i, dev) = fake.device(h)?;
        if let Some(&ms) = dev.delays_ms.get(name) {
            // Holding the driver lock, like a wedged driver: every other
            // call waits too.
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        fake.injected(Some(i), name)?;
        f(fake, i)
    })
}

/// Write a value through a C out-pointer.
fn put<T>(p: *mut T, v: T) -> Result<(), Ret> {
    if p.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null; the caller passes a pointer to a T as nvml.h says.
    unsafe { p.write(v) };
    Ok(())
}

fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), Ret> {
    if buf.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    let bytes = s.as_bytes();
    if bytes.len() + 1 > len as usize {
        return Err(ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: buf holds `len` bytes, checked above to fit s and the NUL.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, bytes.len());
        *buf.add(bytes.len()) = 0;
    }
    Ok(())
}

fn c_array<const N: usize>(s: &str) -> [c_char; N] {
    let mut a = [0 as c_char; N];
    for (d, b) in a.iter_mut().zip(s.bytes().take(N - 1)) {
        *d = b as c_char;
    }
    a
}

// ---------------------------------------------------------------------------
// Exports: init and system.

fn init(name: &str) -> Ret {
    let r = catch_unwind(|| {
        let mut g = lock();
        if let Some(fake) = g.as_mut() {
            fake.init_count += 1;
            return SUCCESS;
        }
        let Some(path) = std::env::var_os("FAKE_NVML_SCENARIO") else {
            eprintln!("fake-nvml: FAKE_NVML_SCENARIO is not set: name a scenario file (see docs/testing.md)");
            return ERROR_UNKNOWN;
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!(
                    "fake-nvml: cannot read scenario {}: {e}",
                    path.to_string_lossy()
                );
                return ERROR_UNKNOWN;
            }
        };
        let scenario = match parse_scenario(&text) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("fake-nvml: scenario {}: {e}", path.to_string_lossy());
                return ERROR_UNKNOWN;
            }
        };
        if let Some(e) = scenario.init_error {
            return e;
        }
        *g = Some(Fake {
            scenario,
            clock: Clock::now(),
            procs: ProcTable {
                listed_at: 0,
                reread_at: 0,
                procs: HashMap::new(),
                matched: HashMap::new(),
            },
            self_pid: std::process::id(),
            init_count: 1,
            gpm_samples: HashMap::new(),
            next_gpm: 0,
        });
        SUCCESS
    });
    r.unwrap_or_else(|_| {
        eprintln!("fake-nvml: {name} panicked");
        ERROR_UNKNOWN
    })
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Ret {
    init("nvmlInit_v2")
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> Ret {
    init("nvmlInit")
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    init("nvmlInitWithFlags")
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Ret {
    catch_unwind(|| {
        let mut g = lock();
        match g.as_mut() {
            None => ERROR_UNINITIALIZED,
            Some(fake) => {
                fake.init_count -= 1;
                if fake.init_count == 0 {
                    *g = None;
                }
                SUCCESS
            }
        }
    })
    .unwrap_or(ERROR_UNKNOWN)
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    let s: &'static [u8] = match result {
        0 => b"Success\0",
        1 => b"Uninitialized\0",
        2 => b"Invalid Argument\0",
        3 => b"Not Supported\0",
        4 => b"Insufficient Permissions\0",
        6 => b"Not Found\0",
        7 => b"Insufficient Size\0",
        9 => b"Driver Not Loaded\0",
        12 => b"NVML Shared Library Not Found\0",
        13 => b"Function Not Found\0",
        15 => b"GPU is lost\0",
        25 => b"Argument version mismatch\0",
        _ => b"Unknown Error\0",
    };
    s.as_ptr() as *const c_char
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    with_fake("nvmlSystemGetDriverVersion", |f| {
        f.injected(None, "nvmlSystemGetDriverVersion")?;
        put_str(version, length, &f.scenario.driver_version)
    })
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    with_fake("nvmlSystemGetNVMLVersion", |f| {
        f.injected(None, "nvmlSystemGetNVMLVersion")?;
        put_str(version, length, &f.scenario.nvml_version)
    })
}

fn cuda_version(name: &str, out: *mut c_int) -> Ret {
    with_fake(name, |f| {
        f.injected(None, name)?;
        put(out, f.scenario.cuda_driver_version)
    })
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetCudaDriverVersion(out: *mut c_int) -> Ret {
    cuda_version("nvmlSystemGetCudaDriverVersion", out)
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub extern "C" fn nvmlSystemGetCudaDriverVersion_v2(out: *mut c_int) -> Ret {
    cuda_version("nvmlSystemGetCudaDriverVersion_v2", out)
}

fn device_count(name: &str, count: *mut c_uint) -> Ret {
    with_fake(name, |f| {
        f.injected(None, name)?;
        put(count, f.scenario.devices.len() as c_uint)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    device_count("nvmlDeviceGetCount_v2", count)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> Ret {
    device_count("nvmlDeviceGetCount", count)
}

fn handle_by_index(name: &str, index: c_uint, out: *mut Device) -> Ret {
    with_fake(name, |f| {
        f.injected(None, name)?;
        if index as usize >= f.scenario.devices.len() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        put(out, (HANDLE_BASE + index as usize) as Device)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, out: *mut Device) -> Ret {
    handle_by_index("nvmlDeviceGetHandleByIndex_v2", index, out)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByIndex(index: c_uint, out: *mut Device) -> Ret {
    handle_by_index("nvmlDeviceGetHandleByIndex", index, out)
}

// ---------------------------------------------------------------------------
// Exports: device identity.

#[no_mangle]
pub extern "C" fn nvmlDeviceGetIndex(h: Device, index: *mut c_uint) -> Ret {
    with_device("nvmlDeviceGetIndex", h, |_, i| put(index, i as c_uint))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetName(h: Device, name: *mut c_char, length: c_uint) -> Ret {
    with_device("nvmlDeviceGetName", h, |f, i| {
        put_str(name, length, &f.scenario.devices[i].name)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetUUID(h: Device, uuid: *mut c_char, length: c_uint) -> Ret {
    with_device("nvmlDeviceGetUUID", h, |f, i| {
        put_str(uuid, length, &f.scenario.devices[i].uuid)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetPciInfo_v3(h: Device, pci: *mut PciInfo) -> Ret {
    with_device("nvmlDeviceGetPciInfo_v3", h, |f, i| {
        let d = &f.scenario.devices[i];
        // "DDDDDDDD:BB:DD.F"
        let parts: Vec<&str> = d.pci_bus_id.split([':', '.']).collect();
        let hex = |k: usize| {
            parts
                .get(k)
                .and_then(|s| u32::from_str_radix(s, 16).ok())
                .unwrap_or(0)
        };
        let legacy = d
            .pci_bus_id
            .get(d.pci_bus_id.len().saturating_sub(12)..)
            .map(|tail| format!("0000:{tail}"))
            .unwrap_or_default();
        put(
            pci,
            PciInfo {
                bus_id_legacy: c_array(&legacy),
                domain: hex(0),
                bus: hex(1),
                device: hex(2),
                pci_device_id: d.pci_device_id,
                pci_sub_system_id: 0x1839_10de,
                bus_id: c_array(&d.pci_bus_id),
            },
        )
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMigMode(
    h: Device,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    with_device("nvmlDeviceGetMigMode", h, |f, i| {
        match f.scenario.devices[i].mig {
            None => Err(ERROR_NOT_SUPPORTED),
            Some(m) => {
                put(current, m as c_uint)?;
                put(pending, m as c_uint)
            }
        }
    })
}

// ---------------------------------------------------------------------------
// Exports: memory.

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub extern "C" fn nvmlDeviceGetMemoryInfo_v2(h: Device, mem: *mut MemoryV2) -> Ret {
    with_device("nvmlDeviceGetMemoryInfo_v2", h, |f, i| {
        if mem.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null pointer to the caller's struct.
        if unsafe { (*mem).version } != MEMORY_V2_VERSION {
            return Err(ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (total, reserved, used) = f.memory(i);
        put(
            mem,
            MemoryV2 {
                version: MEMORY_V2_VERSION,
                total,
                reserved,
                free: total - reserved - used,
                used,
            },
        )
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMemoryInfo(h: Device, mem: *mut Memory) -> Ret {
    with_device("nvmlDeviceGetMemoryInfo", h, |f, i| {
        let (total, reserved, used) = f.memory(i);
        // v1 counts the driver's reservation as used.
        put(
            mem,
            Memory {
                total,
                free: total - reserved - used,
                used: used + reserved,
            },
        )
    })
}

// ---------------------------------------------------------------------------
// Exports: utilization.

fn mig_blocks_util(f: &Fake, i: usize) -> Result<(), Ret> {
    // With MIG enabled, device and process utilization are not supported.
    if f.scenario.devices[i].mig == Some(true) {
        Err(ERROR_NOT_SUPPORTED)
    } else {
        Ok(())
    }
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetUtilizationRates(h: Device, util: *mut Utilization) -> Ret {
    with_device("nvmlDeviceGetUtilizationRates", h, |f, i| {
        mig_blocks_util(f, i)?;
        f.refresh_activity(i);
        let grid = f.grid(i, 0);
        let ts = grid.last().copied().unwrap_or(0);
        let gpu = if ts == 0 { 0 } else { f.util_at(i, ts, None) };
        let t = f.t();
        let memory = f.scenario.devices[i].memory_utilization.at(t).round() as c_uint;
        put(util, Utilization { gpu, memory })
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetSamples(
    h: Device,
    sample_type: c_uint,
    last_seen: c_ulonglong,
    value_type: *mut c_uint,
    count: *mut c_uint,
    samples: *mut Sample,
) -> Ret {
    with_device("nvmlDeviceGetSamples", h, |f, i| {
        mig_blocks_util(f, i)?;
        if sample_type != SAMPLING_GPU_UTILIZATION && sample_type != SAMPLING_MEMORY_UTILIZATION {
            return Err(ERROR_NOT_SUPPORTED);
        }
        if count.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        f.refresh_activity(i);
        let grid = f.grid(i, last_seen);
        if grid.is_empty() {
            return Err(ERROR_NOT_FOUND);
        }
        put(value_type, VALUE_TYPE_UNSIGNED_INT)?;
        if samples.is_null() {
            return put(count, grid.len() as c_uint);
        }
        // SAFETY: count is non-null (checked above).
        let room = unsafe { *count } as usize;
        let n = room.min(grid.len());
        for (k, &ts) in grid.iter().take(n).enumerate() {
            let v = if sample_type == SAMPLING_GPU_UTILIZATION {
                f.util_at(i, ts, None)
            } else {
                let t = f.clock.scenario_t(ts);
                f.scenario.devices[i].memory_utilization.at(t).round() as u32
            };
            // SAFETY: the caller's array holds `*count` samples and k < that.
            unsafe {
                samples.add(k).write(Sample {
                    time_stamp: ts,
                    sample_value: Value64 { ui_val: v },
                })
            };
        }
        put(count, n as c_uint)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetProcessUtilization(
    h: Device,
    utilization: *mut ProcessUtilizationSample,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> Ret {
    with_device("nvmlDeviceGetProcessUtilization", h, |f, i| {
        mig_blocks_util(f, i)?;
        if count.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let procs = f.processes(i);
        let grid = f.grid(i, last_seen);
        if grid.is_empty() || procs.is_empty() {
            return Err(ERROR_NOT_FOUND);
        }
        let mut rows: Vec<ProcessUtilizationSample> = Vec::new();
        for &ts in &grid {
            let t = f.clock.scenario_t(ts);
            for p in &procs {
                let (sm, mem) = match p.util {
                    ProcUtilSource::Rule(r) => {
                        let rule = &f.scenario.devices[i].rules[r];
                        (rule.sm_util.at(t), rule.mem_util.at(t))
                    }
                    ProcUtilSource::Foreign(sm) => (sm, 0.0),
                    ProcUtilSource::Activity => (f.util_at(i, ts, Some(p.pid)) as f64, 0.0),
                };
                rows.push(ProcessUtilizationSample {
                    pid: p.pid,
                    time_stamp: ts,
                    sm_util: sm.clamp(0.0, 100.0).round() as c_uint,
                    mem_util: mem.clamp(0.0, 100.0).round() as c_uint,
                    enc_util: 0,
                    dec_util: 0,
                });
            }
        }
        // Drivers pad the buffer with pid-0 rows; consumers must drop them.
        rows.push(ProcessUtilizationSample {
            pid: 0,
            time_stamp: grid[grid.len() - 1],
            sm_util: 0,
            mem_util: 0,
            enc_util: 0,
            dec_util: 0,
        });
        // SAFETY: count is non-null (checked above).
        let room = unsafe { *count } as usize;
        if utilization.is_null() || room < rows.len() {
            if utilization.is_null() {
                put(count, rows.len() as c_uint)?;
                return Err(ERROR_INSUFFICIENT_SIZE);
            }
            // The grid moved on between the size query and this call:
            // return the oldest rows that fit, the next call gets the rest.
            rows.truncate(room);
        }
        for (k, r) in rows.iter().enumerate() {
            // SAFETY: k < room, the caller's array length.
            unsafe {
                utilization.add(k).write(*r);
            }
        }
        put(count, rows.len() as c_uint)
    })
}

// ---------------------------------------------------------------------------
// Exports: clocks, temperature, power, throttling.

fn clock_index(clock: c_uint) -> Result<usize, Ret> {
    if clock < 4 {
        Ok(clock as usize)
    } else {
        Err(ERROR_INVALID_ARGUMENT)
    }
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetClockInfo(h: Device, clock: c_uint, mhz: *mut c_uint) -> Ret {
    with_device("nvmlDeviceGetClockInfo", h, |f, i| {
        let c = clock_index(clock)?;
        let t = f.t();
        put(
            mhz,
            f.scenario.devices[i].clocks[c].at(t).max(0.0).round() as c_uint,
        )
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMaxClockInfo(h: Device, clock: c_uint, mhz: *mut c_uint) -> Ret {
    with_device("nvmlDeviceGetMaxClockInfo", h, |f, i| {
        let c = clock_index(clock)?;
        put(
            mhz,
            f.scenario.devices[i].max_clocks[c].max(0.0).round() as c_uint,
        )
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetTemperature(h: Device, sensor: c_uint, temp: *mut c_uint) -> Ret {
    with_device("nvmlDeviceGetTemperature", h, |f, i| {
        if sensor != 0 {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let t = f.t();
        put(
            temp,
            f.scenario.devices[i].temperature_c.at(t).max(0.0).round() as c_uint,
        )
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetPowerUsage(h: Device, mw: *mut c_uint) -> Ret {
    with_device("nvmlDeviceGetPowerUsage", h, |f, i| {
        let t = f.t();
        put(
            mw,
            (f.scenario.devices[i].power_w.at(t).max(0.0) * 1000.0).round() as c_uint,
        )
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetEnforcedPowerLimit(h: Device, mw: *mut c_uint) -> Ret {
    with_device("nvmlDeviceGetEnforcedPowerLimit", h, |f, i| {
        put(
            mw,
            (f.scenario.devices[i].power_limit_w.max(0.0) * 1000.0).round() as c_uint,
        )
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetPowerManagementLimit(h: Device, mw: *mut c_uint) -> Ret {
    with_device("nvmlDeviceGetPowerManagementLimit", h, |f, i| {
        put(
            mw,
            (f.scenario.devices[i].power_limit_w.max(0.0) * 1000.0).round() as c_uint,
        )
    })
}

fn throttle(name: &str, h: Device, out: *mut c_ulonglong) -> Ret {
    with_device(name, h, |f, i| {
        let t = f.t();
        put(out, throttle_at(&f.scenario.devices[i].throttle, t))
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    h: Device,
    out: *mut c_ulonglong,
) -> Ret {
    throttle("nvmlDeviceGetCurrentClocksThrottleReasons", h, out)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(h: Device, out: *mut c_ulonglong) -> Ret {
    throttle("nvmlDeviceGetCurrentClocksEventReasons", h, out)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetSupportedClocksThrottleReasons(
    h: Device,
    out: *mut c_ulonglong,
) -> Ret {
    with_device("nvmlDeviceGetSupportedClocksThrottleReasons", h, |_, _| {
        put(out, REASONS.iter().fold(0, |a, r| a | r.1))
    })
}

// ---------------------------------------------------------------------------
// Exports: PCIe.

#[no_mangle]
pub extern "C" fn nvmlDeviceGetPcieThroughput(
    h: Device,
    counter: c_uint,
    kbps: *mut c_uint,
) -> Ret {
    with_device("nvmlDeviceGetPcieThroughput", h, |f, i| {
        let t = f.t();
        let d = &f.scenario.devices[i];
        let v = match counter {
            0 => d.pcie_tx_kbps.at(t),
            1 => d.pcie_rx_kbps.at(t),
            _ => return Err(ERROR_INVALID_ARGUMENT),
        };
        put(kbps, v.max(0.0).round() as c_uint)
    })
}

macro_rules! pcie_link {
    ($fname:ident, $field:ident, series) => {
        #[no_mangle]
        pub extern "C" fn $fname(h: Device, out: *mut c_uint) -> Ret {
            with_device(stringify!($fname), h, |f, i| {
                let t = f.t();
                put(
                    out,
                    f.scenario.devices[i].$field.at(t).max(0.0).round() as c_uint,
                )
            })
        }
    };
    ($fname:ident, $field:ident, fixed) => {
        #[no_mangle]
        pub extern "C" fn $fname(h: Device, out: *mut c_uint) -> Ret {
            with_device(stringify!($fname), h, |f, i| {
                put(out, f.scenario.devices[i].$field.max(0.0).round() as c_uint)
            })
        }
    };
}

pcie_link!(nvmlDeviceGetCurrPcieLinkGeneration, pcie_gen, series);
pcie_link!(nvmlDeviceGetCurrPcieLinkWidth, pcie_width, series);
pcie_link!(nvmlDeviceGetMaxPcieLinkGeneration, pcie_max_gen, fixed);
pcie_link!(nvmlDeviceGetMaxPcieLinkWidth, pcie_max_width, fixed);

// ---------------------------------------------------------------------------
// Exports: process lists. One implementation, three struct versions.

fn process_list<T>(
    name: &str,
    h: Device,
    kind: Kind,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(&GpuProc) -> T,
) -> Ret {
    with_device(name, h, |f, i| {
        if count.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let procs: Vec<GpuProc> = f
            .processes(i)
            .into_iter()
            .filter(|p| p.kind == kind)
            .collect();
        // SAFETY: non-null, checked above.
        let room = unsafe { *count } as usize;
        // SAFETY: as above.
        unsafe { *count = procs.len() as c_uint };
        if procs.is_empty() {
            return Ok(());
        }
        if infos.is_null() || room < procs.len() {
            return Err(ERROR_INSUFFICIENT_SIZE);
        }
        for (k, p) in procs.iter().enumerate() {
            // SAFETY: k < procs.len() <= room, the caller's array length.
            unsafe { infos.add(k).write(make(p)) };
        }
        Ok(())
    })
}

/// `0xFFFFFFFF`: no MIG instance.
const NO_INSTANCE: c_uint = u32::MAX;

fn v2(p: &GpuProc) -> ProcessInfoV2 {
    ProcessInfoV2 {
        pid: p.pid,
        used_gpu_memory: p.used_bytes,
        gpu_instance_id: p.gi.unwrap_or(NO_INSTANCE),
        compute_instance_id: p.ci.unwrap_or(NO_INSTANCE),
    }
}

fn v1(p: &GpuProc) -> ProcessInfoV1 {
    ProcessInfoV1 {
        pid: p.pid,
        used_gpu_memory: p.used_bytes,
    }
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    h: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfoV2,
) -> Ret {
    let name = "nvmlDeviceGetComputeRunningProcesses_v3";
    process_list(name, h, Kind::Compute, count, infos, v2)
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    h: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfoV2,
) -> Ret {
    let name = "nvmlDeviceGetGraphicsRunningProcesses_v3";
    process_list(name, h, Kind::Graphics, count, infos, v2)
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    h: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfoV2,
) -> Ret {
    let name = "nvmlDeviceGetComputeRunningProcesses_v2";
    process_list(name, h, Kind::Compute, count, infos, v2)
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    h: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfoV2,
) -> Ret {
    let name = "nvmlDeviceGetGraphicsRunningProcesses_v2";
    process_list(name, h, Kind::Graphics, count, infos, v2)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    h: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfoV1,
) -> Ret {
    let name = "nvmlDeviceGetComputeRunningProcesses";
    process_list(name, h, Kind::Compute, count, infos, v1)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetGraphicsRunningProcesses(
    h: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfoV1,
) -> Ret {
    let name = "nvmlDeviceGetGraphicsRunningProcesses";
    process_list(name, h, Kind::Graphics, count, infos, v1)
}

// ---------------------------------------------------------------------------
// GPU Performance Monitoring (Hopper and newer; `"gpm": true` in a device
// of the scenario). A sample records when it was taken; the metrics of two
// samples are the activity between those instants, from the activity log.

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub extern "C" fn nvmlGpmQueryDeviceSupport(h: Device, support: *mut GpmSupport) -> Ret {
    with_device("nvmlGpmQueryDeviceSupport", h, |f, i| {
        if support.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null, a caller's nvmlGpmSupport_t.
        if unsafe { (*support).version } != GPM_SUPPORT_VERSION {
            return Err(ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let supported = f.scenario.devices[i].gpm as c_uint;
        put(
            support,
            GpmSupport {
                version: GPM_SUPPORT_VERSION,
                is_supported_device: supported,
            },
        )
    })
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub extern "C" fn nvmlGpmSampleAlloc(sample: *mut *mut c_void) -> Ret {
    with_fake("nvmlGpmSampleAlloc", |f| {
        f.injected(None, "nvmlGpmSampleAlloc")?;
        // Bounded: a caller that never frees cannot grow the fake forever.
        if f.gpm_samples.len() >= 4096 {
            return Err(ERROR_UNKNOWN);
        }
        f.next_gpm += 1;
        let handle = GPM_HANDLE_BASE + f.next_gpm;
        f.gpm_samples.insert(handle, None);
        put(sample, handle as *mut c_void)
    })
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub extern "C" fn nvmlGpmSampleFree(sample: *mut c_void) -> Ret {
    with_fake("nvmlGpmSampleFree", |f| {
        f.gpm_samples
            .remove(&(sample as usize))
            .map(|_| ())
            .ok_or(ERROR_INVALID_ARGUMENT)
    })
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub extern "C" fn nvmlGpmSampleGet(h: Device, sample: *mut c_void) -> Ret {
    with_device("nvmlGpmSampleGet", h, |f, i| {
        if !f.scenario.devices[i].gpm {
            return Err(ERROR_NOT_SUPPORTED);
        }
        let now = clock_ns(libc::CLOCK_MONOTONIC);
        match f.gpm_samples.get_mut(&(sample as usize)) {
            Some(slot) => {
                *slot = Some((i, now));
                Ok(())
            }
            None => Err(ERROR_INVALID_ARGUMENT),
        }
    })
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub extern "C" fn nvmlGpmMetricsGet(req: *mut GpmMetricsGetHead) -> Ret {
    with_fake("nvmlGpmMetricsGet", |f| {
        f.injected(None, "nvmlGpmMetricsGet")?;
        if req.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller's nvmlGpmMetricsGet_t starts with
        // this head.
        let head = unsafe { &*req };
        if head.version != GPM_METRICS_GET_VERSION {
            return Err(ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        if head.num_metrics > GPM_METRIC_MAX {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let get = |s: *mut c_void| f.gpm_samples.get(&(s as usize)).copied().flatten();
        let (Some((d1, t1)), Some((d2, t2))) = (get(head.sample1), get(head.sample2)) else {
            return Err(ERROR_INVALID_ARGUMENT);
        };
        if d1 != d2 || t2 <= t1 {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        f.injected(Some(d1), "nvmlGpmMetricsGet")?;
        let busy = f.busy_pct_between(d1, t1, t2);
        // SAFETY: `numMetrics` metrics follow the head in the caller's
        // struct (nvml.h); only those are written.
        let metrics = unsafe {
            std::slice::from_raw_parts_mut(
                (req as *mut u8).add(std::mem::size_of::<GpmMetricsGetHead>()) as *mut GpmMetric,
                head.num_metrics as usize,
            )
        };
        for m in metrics {
            let (ret, value, names): (Ret, f64, [&'static [u8]; 3]) = match m.metric_id {
                GPM_METRIC_GRAPHICS_UTIL => (
                    SUCCESS,
                    busy,
                    [b"gr_util\0", b"Graphics Utilization\0", b"%\0"],
                ),
                // Every busy moment keeps all SMs busy in this fake.
                GPM_METRIC_SM_UTIL => (SUCCESS, busy, [b"sm_util\0", b"SM Utilization\0", b"%\0"]),
                _ => (ERROR_NOT_SUPPORTED, 0.0, [b"\0", b"\0", b"\0"]),
            };
            m.nvml_return = ret;
            m.value = value;
            m.short_name = names[0].as_ptr() as *const c_char;
            m.long_name = names[1].as_ptr() as *const c_char;
            m.unit = names[2].as_ptr() as *const c_char;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_steps_hold_until_the_next_step() {
        let s = parse_series(Some(&serde_json::json!([[0, 10], [2.5, 90]])), 0.0, "x").unwrap();
        assert_eq!(s.at(-1.0), 10.0);
        assert_eq!(s.at(1.0), 10.0);
        assert_eq!(s.at(2.5), 90.0);
        assert_eq!(s.at(100.0), 90.0);
    }

    #[test]
    fn throttle_names_become_nvml_bits() {
        let t = parse_throttle(Some(&serde_json::json!([
            [0, []],
            [1, ["hw_thermal_slowdown", "sw_power_cap"]]
        ])))
        .unwrap();
        assert_eq!(throttle_at(&t, 0.5), 0);
        assert_eq!(throttle_at(&t, 1.5), 0x44);
        assert!(parse_throttle(Some(&serde_json::json!(["too_hot"]))).is_err());
    }

    #[test]
    fn activity_busy_time_merges_overlapping_steps() {
        let mut a = Activity {
            path: PathBuf::new(),
            used_memory_mib: 0.0,
            offset: 0,
            partial: String::new(),
            open: HashMap::new(),
            done: HashMap::new(),
        };
        a.line("B 7 100");
        a.line("E 7 200");
        a.line("8 150 250");
        a.line("B 7 400");
        assert_eq!(a.busy_ns(None, 0, 300, 1000), 150);
        assert_eq!(a.busy_ns(Some(7), 0, 300, 1000), 100);
        // The open step runs until "now".
        assert_eq!(a.busy_ns(Some(7), 300, 1000, 450), 50);
    }

    #[test]
    fn shipped_scenarios_parse_and_typos_are_rejected() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../samples/gpu");
        let mut n = 0;
        std::env::set_var("GPUPROF_ACTIVITY_LOG", "/dev/null");
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let text = std::fs::read_to_string(&p).unwrap();
            if let Err(e) = parse_scenario(&text) {
                panic!("{}: {e}", p.display());
            }
            n += 1;
        }
        assert!(n >= 10);
        let e = parse_scenario(r#"{"devices": [{"temprature_c": 90}]}"#)
            .err()
            .unwrap();
        assert!(e.contains("unknown key \"temprature_c\""), "{e}");
        let e = parse_scenario(r#"{"devices": [{"pcie": {"gne": 3}}]}"#)
            .err()
            .unwrap();
        assert!(e.contains("devices[0].pcie"), "{e}");
    }

    #[test]
    fn env_expansion_names_the_missing_variable() {
        std::env::set_var("FAKE_NVML_TEST_DIR", "/tmp/x");
        assert_eq!(
            expand_env("${FAKE_NVML_TEST_DIR}/a.log").unwrap(),
            "/tmp/x/a.log"
        );
        let e = expand_env("${FAKE_NVML_SURELY_UNSET}/a").unwrap_err();
        assert!(e.contains("FAKE_NVML_SURELY_UNSET"), "{e}");
    }
}
