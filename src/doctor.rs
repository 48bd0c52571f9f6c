//! `gpuprof doctor`: check the machine before a run, no job needed. GPUs,
//! driver and CUDA versions, persistence mode, throttle reasons,
//! temperatures, PCIe link, ECC; CPUs and their frequency governor; memory;
//! the storage behind `--data` with a short sequential read; and whether
//! the Python on PATH imports `torch` built with CUDA. Every check is ok,
//! warning or problem, with the fix.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use crate::analysis::environment::is_network_fs;
mod sampling;

use crate::collect::files::{dev_string, parse_mountinfo};
use crate::collect::gpu::NVML_LIB_ENV;
use crate::event::MountInfo;

/// Sequential reads slower than this are HDD-class: a training input
/// pipeline reading raw samples at this rate starves any modern GPU.
pub const SLOW_READ_MB_S: f64 = 100.0;
/// Read at most this much, for at most this long, in the read test.
const READ_TEST_BYTES: u64 = 256 << 20;
const READ_TEST_TIME: Duration = Duration::from_secs(3);
/// Less than this read is too little to measure a throughput.
const READ_TEST_MIN_BYTES: u64 = 16 << 20;
/// A GPU hotter than this at rest is close to its slowdown temperature.
const HOT_IDLE_C: u32 = 80;
/// Free space below this share of the filesystem.
const LOW_FREE_SHARE: f64 = 0.05;
/// The Python check's timeout (importing torch can take seconds).
const PYTHON_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Ok,
    Warning,
    Problem,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warning => "warning",
            Status::Problem => "PROBLEM",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Check {
    pub area: &'static str,
    pub status: Status,
    pub what: String,
    pub fix: Option<String>,
}

fn check(area: &'static str, status: Status, what: impl Into<String>) -> Check {
    Check {
        area,
        status,
        what: what.into(),
        fix: None,
    }
}

fn with_fix(mut c: Check, fix: impl Into<String>) -> Check {
    c.fix = Some(fix.into());
    c
}

#[derive(Clone, Debug, Default)]
pub struct DoctorOptions {
    pub data: Option<PathBuf>,
    /// Python interpreter to check (default: `python3`, then `python`, on PATH).
    pub python: Option<String>,
}

/// Run every check. Errors only on bad input (a `--data` path that does
/// not exist); everything the machine lacks is a check result.
pub fn run(opts: &DoctorOptions) -> anyhow::Result<Vec<Check>> {
    if let Some(p) = &opts.data {
        if let Err(e) = std::fs::metadata(p) {
            anyhow::bail!("--data {}: {e}", p.display());
        }
    }
    let mut out = Vec::new();
    let driver_cuda = gpu_checks(&mut out);
    cpu_checks(&mut out);
    memory_checks(&mut out);
    if let Some(p) = &opts.data {
        data_checks(p, &mut out);
    }
    python_checks(opts.python.as_deref(), driver_cuda, &mut out);
    sampling::stack_checks(&mut out);
    Ok(out)
}

/// Open NVML the way the recorder does (`collect::gpu`): `GPUPROF_NVML_LIB`
/// when set, the system's libnvidia-ml.so.1 otherwise. Unlike the
/// recorder's, the error comes as (what, fix), each one line, since doctor
/// prints the fix on a line of its own.
pub fn nvml_open() -> Result<Nvml, (String, String)> {
    let lib = std::env::var_os(NVML_LIB_ENV).filter(|p| !p.is_empty());
    let mut b = Nvml::builder();
    if let Some(p) = &lib {
        b.lib_path(p);
    }
    let shown = lib
        .as_ref()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| "libnvidia-ml.so.1".into());
    b.init().map_err(|e| match e {
        NvmlError::LibloadingError(e) => (
            format!("no NVIDIA driver: cannot load {shown} ({e})"),
            format!("install the NVIDIA driver (nvidia-smi must work), or set {NVML_LIB_ENV} to the path of libnvidia-ml.so.1 if it is installed in an unusual place"),
        ),
        NvmlError::DriverNotLoaded => (
            format!("no NVIDIA driver: {shown} is installed but the kernel driver is not loaded"),
            "load the driver (`modprobe nvidia`) or reboot after installing it; nvidia-smi fails the same way until then".into(),
        ),
        NvmlError::NoPermission => (
            format!("{shown}: no permission to talk to the NVIDIA driver"),
            "check the permissions of /dev/nvidia* (the user must be able to open them)".into(),
        ),
        other => (
            format!("NVML ({shown}) failed to initialize: {other}"),
            "check that nvidia-smi works; reinstall the driver if it does not".into(),
        ),
    })
}

fn throttle_names(r: ThrottleReasons) -> Vec<&'static str> {
    let all = [
        (ThrottleReasons::GPU_IDLE, "gpu_idle"),
        (
            ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
            "applications_clocks_setting",
        ),
        (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
        (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
        (ThrottleReasons::SYNC_BOOST, "sync_boost"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            "hw_power_brake_slowdown",
        ),
        (
            ThrottleReasons::DISPLAY_CLOCK_SETTING,
            "display_clock_setting",
        ),
    ];
    all.iter()
        .filter(|(b, _)| r.contains(*b))
        .map(|(_, n)| *n)
        .collect()
}

/// Returns the driver's CUDA version (major, minor) when known.
fn gpu_checks(out: &mut Vec<Check>) -> Option<(u32, u32)> {
    let nvml = match nvml_open() {
        Ok(n) => n,
        Err((what, fix)) => {
            out.push(with_fix(check("gpu", Status::Problem, what), fix));
            return None;
        }
    };
    let driver = nvml.sys_driver_version().ok();
    let cuda = nvml
        .sys_cuda_driver_version()
        .ok()
        .map(|v| ((v / 1000) as u32, ((v % 1000) / 10) as u32));
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => {
            out.push(with_fix(
                check(
                    "gpu",
                    Status::Problem,
                    format!("NVML cannot count the GPUs: {e}"),
                ),
                "check nvidia-smi; reinstall the driver if it fails too",
            ));
            return cuda;
        }
    };
    let ver = format!(
        "NVIDIA driver {}, CUDA {}; {count} GPU(s)",
        driver.as_deref().unwrap_or("(version unknown)"),
        cuda.map(|(a, b)| format!("{a}.{b}"))
            .unwrap_or_else(|| "(version unknown)".into())
    );
    if count == 0 {
        out.push(with_fix(
            check("gpu", Status::Problem, format!("{ver}: no GPU visible")),
            "check that the GPU is seated and powered (lspci | grep -i nvidia) and that the container was given GPUs (--gpus all)",
        ));
        return cuda;
    }
    out.push(check("gpu", Status::Ok, ver));
    for i in 0..count {
        let d = match nvml.device_by_index(i) {
            Ok(d) => d,
            Err(e) => {
                out.push(with_fix(
                    check("gpu", Status::Problem, format!("GPU {i}: cannot be opened: {e}")),
                    format!("run nvidia-smi -q -i {i}; a GPU that fails here has fallen off the bus or needs a reset"),
                ));
                continue;
            }
        };
        device_checks(out, &d, i);
    }
    cuda
}

/// The checks of GPU `i`: temperature, persistence, clock-event reasons,
/// PCIe link, memory, ECC.
fn device_checks(out: &mut Vec<Check>, d: &nvml_wrapper::Device, i: u32) {
    let name = d.name().unwrap_or_else(|_| "unknown GPU".into());
    let tag = format!("GPU {i} ({name})");
    if let Ok(t) = d.temperature(TemperatureSensor::Gpu) {
        let c = check(
            "gpu",
            if t >= HOT_IDLE_C {
                Status::Warning
            } else {
                Status::Ok
            },
            format!("{tag}: temperature {t} °C"),
        );
        out.push(if t >= HOT_IDLE_C {
            with_fix(
                c,
                "check cooling and airflow before a long run (nvidia-smi -q -d TEMPERATURE)",
            )
        } else {
            c
        });
    }
    match d.is_in_persistent_mode() {
        Ok(true) => out.push(check("gpu", Status::Ok, format!("{tag}: persistence mode on"))),
        Ok(false) => out.push(with_fix(
            check("gpu", Status::Warning, format!("{tag}: persistence mode off (each CUDA start re-initialises the GPU, seconds per process)")),
            "sudo nvidia-smi -pm 1 (or enable nvidia-persistenced)",
        )),
        Err(_) => {}
    }
    if let Ok(r) = d.current_throttle_reasons() {
        let names = throttle_names(r);
        let thermal = r.intersects(
            ThrottleReasons::HW_THERMAL_SLOWDOWN
                | ThrottleReasons::SW_THERMAL_SLOWDOWN
                | ThrottleReasons::HW_SLOWDOWN,
        );
        let power =
            r.intersects(ThrottleReasons::SW_POWER_CAP | ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN);
        let what = format!(
            "{tag}: clock-event reasons now: {}",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        );
        out.push(if thermal {
            with_fix(
                check("gpu", Status::Problem, what),
                "the GPU is slowing down for heat or a hardware signal: check cooling, airflow, fans and the power supply",
            )
        } else if power {
            with_fix(
                check("gpu", Status::Warning, what),
                "the GPU is at its power limit: check `nvidia-smi -q -d POWER` and restore the default limit if it was lowered",
            )
        } else {
            check("gpu", Status::Ok, what)
        });
    }
    let link = (
        d.current_pcie_link_gen(),
        d.current_pcie_link_width(),
        d.max_pcie_link_gen(),
        d.max_pcie_link_width(),
    );
    if let (Ok(g), Ok(w), Ok(mg), Ok(mw)) = link {
        let what = format!("{tag}: PCIe link gen {g} x{w} (max gen {mg} x{mw})");
        out.push(if w < mw {
            with_fix(
                check("gpu", Status::Problem, what),
                "the link runs with fewer lanes than the card supports: reseat the card, check the slot wiring and risers",
            )
        } else if g < mg {
            with_fix(
                check("gpu", Status::Warning, what),
                "links drop their generation when idle to save power: recheck under load (nvidia-smi -q -d PCIE); if it stays low, check the slot, riser and BIOS PCIe setting",
            )
        } else {
            check("gpu", Status::Ok, what)
        });
    }
    if let Ok(m) = d.memory_info() {
        out.push(check(
            "gpu",
            Status::Ok,
            format!(
                "{tag}: memory {:.1} of {:.1} GiB in use",
                m.used as f64 / (1u64 << 30) as f64,
                m.total as f64 / (1u64 << 30) as f64
            ),
        ));
    }
    if let Ok(ecc) = d.is_ecc_enabled() {
        if ecc.currently_enabled {
            let unc = d
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .ok();
            let pending = d.are_pages_pending_retired().ok();
            match (unc, pending) {
                (Some(n), _) if n > 0 => out.push(with_fix(
                    check("gpu", Status::Problem, format!("{tag}: {n} uncorrected ECC errors since the driver loaded")),
                    "drain the node and have the GPU checked (nvidia-smi -q -d ECC,PAGE_RETIREMENT); results of jobs on it are suspect",
                )),
                (_, Some(true)) => out.push(with_fix(
                    check("gpu", Status::Warning, format!("{tag}: memory pages are pending retirement")),
                    "reset the GPU or reboot to retire them (nvidia-smi -r when idle)",
                )),
                _ => out.push(check("gpu", Status::Ok, format!("{tag}: ECC on, no uncorrected errors"))),
            }
        }
    }
}

fn cpu_checks(out: &mut Vec<Check>) {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    out.push(check(
        "cpu",
        Status::Ok,
        format!("{cpus} CPUs available to gpuprof ({model})"),
    ));
    let mut govs = std::collections::BTreeSet::new();
    if let Ok(rd) = std::fs::read_dir("/sys/devices/system/cpu") {
        for e in rd.flatten() {
            let p = e.path().join("cpufreq/scaling_governor");
            if let Ok(g) = std::fs::read_to_string(p) {
                govs.insert(g.trim().to_string());
            }
        }
    }
    if govs.is_empty() {
        out.push(check(
            "cpu",
            Status::Ok,
            "CPU frequency governor not exposed (usual in VMs and containers)",
        ));
    } else {
        let list = govs.iter().cloned().collect::<Vec<_>>().join(", ");
        if govs.contains("powersave") {
            out.push(with_fix(
                check("cpu", Status::Warning, format!("CPU frequency governor: {list} (powersave keeps clocks low: slower data loading)")),
                "sudo cpupower frequency-set -g performance",
            ));
        } else {
            out.push(check(
                "cpu",
                Status::Ok,
                format!("CPU frequency governor: {list}"),
            ));
        }
    }
}

fn memory_checks(out: &mut Vec<Check>) {
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else {
        return;
    };
    let get = |k: &str| {
        text.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    let (Some(total), Some(avail)) = (get("MemTotal:"), get("MemAvailable:")) else {
        return;
    };
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let swap = get("SwapTotal:").unwrap_or(0);
    let what = format!(
        "memory {:.1} GiB, {:.1} GiB available; swap {:.1} GiB",
        gib(total),
        gib(avail),
        gib(swap)
    );
    if (avail as f64) < 0.1 * total as f64 {
        out.push(with_fix(
            check(
                "memory",
                Status::Warning,
                what + " (under 10% available: DataLoader workers may swap or be OOM-killed)",
            ),
            "stop what else is using memory, or plan fewer workers / a smaller prefetch",
        ));
    } else {
        out.push(check("memory", Status::Ok, what));
    }
}

fn mount_for(path: &Path) -> Option<MountInfo> {
    let md = std::fs::metadata(path).ok()?;
    let dev = dev_string(md.dev());
    let mounts = parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").ok()?);
    let abs = std::fs::canonicalize(path).ok()?;
    let abs = abs.to_string_lossy();
    let cands: Vec<&MountInfo> = mounts.iter().filter(|m| m.dev == dev).collect();
    let pool: Vec<&MountInfo> = if cands.is_empty() {
        mounts.iter().collect()
    } else {
        cands
    };
    pool.into_iter()
        .filter(|m| {
            let mp = m.mount_point.trim_end_matches('/');
            mp.is_empty() || abs == mp || abs.starts_with(&format!("{mp}/"))
        })
        .max_by_key(|m| m.mount_point.len())
        .cloned()
}

/// The largest regular file at or under `p` (a bounded walk).
fn file_to_read(p: &Path) -> Option<(PathBuf, u64)> {
    let md = std::fs::metadata(p).ok()?;
    if md.is_file() {
        return Some((p.to_path_buf(), md.len()));
    }
    let mut best: Option<(PathBuf, u64)> = None;
    let mut stack = vec![p.to_path_buf()];
    let mut seen = 0;
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            seen += 1;
            if seen > 10_000 {
                return best;
            }
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                let len = e.metadata().map(|m| m.len()).unwrap_or(0);
                if best.as_ref().map_or(true, |b| len > b.1) {
                    best = Some((e.path(), len));
                }
            }
        }
    }
    best
}

/// Read `path` sequentially after dropping it from the page cache; MB/s.
fn read_speed(path: &Path) -> std::io::Result<(u64, f64)> {
    let mut f = std::fs::File::open(path)?;
    // Drop the file's cached pages so the disk, not RAM, is measured
    // (allowed for any reader; clean pages only).
    unsafe {
        use std::os::fd::AsRawFd;
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
    let mut buf = vec![0u8; 1 << 20];
    let start = Instant::now();
    let mut total = 0u64;
    while total < READ_TEST_BYTES && start.elapsed() < READ_TEST_TIME {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    let secs = start.elapsed().as_secs_f64().max(1e-6);
    Ok((total, total as f64 / 1e6 / secs))
}

fn data_checks(p: &Path, out: &mut Vec<Check>) {
    let shown = p.display().to_string();
    match mount_for(p) {
        Some(m) => {
            let dev = m
                .disk
                .as_ref()
                .map(|d| format!(" on {d}"))
                .unwrap_or_default();
            let what = format!(
                "{shown}: {} filesystem at {} ({}{dev})",
                m.fs_type, m.mount_point, m.source
            );
            if is_network_fs(&m.fs_type) {
                out.push(with_fix(
                    check("data", Status::Warning, what + ": a network filesystem"),
                    "copy the dataset to local SSD/NVMe before training, or cache it locally on first read",
                ));
            } else if m.rotational == Some(true) {
                out.push(with_fix(
                    check("data", Status::Warning, what + ": the kernel reports a rotational (spinning) disk; virtual disks often claim this, the read test below tells"),
                    "copy the dataset to an SSD/NVMe, or pack it into large shards read sequentially",
                ));
            } else {
                out.push(check("data", Status::Ok, what));
            }
        }
        None => out.push(check(
            "data",
            Status::Warning,
            format!("{shown}: the filesystem behind it could not be determined"),
        )),
    }
    if let Ok(s) = nix::sys::statvfs::statvfs(p) {
        let total = s.blocks() as f64 * s.fragment_size() as f64;
        let free = s.blocks_available() as f64 * s.fragment_size() as f64;
        let what = format!(
            "{shown}: {} free of {}",
            crate::units::bytes(free),
            crate::units::bytes(total)
        );
        if total > 0.0 && free / total < LOW_FREE_SHARE {
            out.push(with_fix(
                check("data", Status::Warning, what),
                "free space before writing checkpoints and logs there",
            ));
        } else {
            out.push(check("data", Status::Ok, what));
        }
    }
    match file_to_read(p) {
        None => out.push(check(
            "data",
            Status::Warning,
            format!("{shown}: no readable file to measure the read speed"),
        )),
        Some((f, _)) => match read_speed(&f) {
            Err(e) => out.push(check(
                "data",
                Status::Warning,
                format!("{}: cannot be read: {e}", f.display()),
            )),
            Ok((n, _)) if n < READ_TEST_MIN_BYTES => out.push(check(
                "data",
                Status::Ok,
                format!(
                    "{}: only {} to read, too little to measure the read speed",
                    f.display(),
                    crate::units::bytes(n as f64)
                ),
            )),
            Ok((n, mbs)) => {
                let what = format!(
                    "sequential read of {}: {} ({} read, page cache dropped first)",
                    f.display(),
                    crate::units::rate(mbs * 1e6),
                    crate::units::bytes(n as f64)
                );
                if mbs < SLOW_READ_MB_S {
                    out.push(with_fix(
                        check("data", Status::Warning, what + ": HDD-class speed"),
                        "move the dataset to faster local storage, or check for an IO limit on this volume",
                    ));
                } else {
                    out.push(check("data", Status::Ok, what));
                }
            }
        },
    }
}

const TORCH_PROBE: &str = r#"
import json, sys
try:
    import torch
except Exception as e:
    print(json.dumps({"error": type(e).__name__ + ": " + str(e)}))
    sys.exit(0)
ok = False
try:
    ok = bool(torch.cuda.is_available())
except Exception:
    pass
print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda, "available": ok}))
"#;

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn run_with_timeout(cmd: &Path, args: &[&str], timeout: Duration) -> Result<String, String> {
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", cmd.display()))?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} did not finish within {} s",
                    cmd.display(),
                    timeout.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(e.to_string()),
        }
    }
    let mut s = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut s);
    }
    Ok(s)
}

fn python_checks(python: Option<&str>, driver_cuda: Option<(u32, u32)>, out: &mut Vec<Check>) {
    let exe = match python {
        Some(p) if p.contains('/') => Some(PathBuf::from(p)),
        Some(p) => find_on_path(p),
        None => find_on_path("python3").or_else(|| find_on_path("python")),
    };
    let Some(exe) = exe else {
        out.push(with_fix(
            check("python", Status::Warning, "no python3 or python on PATH"),
            "activate the environment the job runs in, then rerun gpuprof doctor",
        ));
        return;
    };
    let shown = exe.display().to_string();
    let text = match run_with_timeout(&exe, &["-c", TORCH_PROBE], PYTHON_TIMEOUT) {
        Ok(t) => t,
        Err(e) => {
            out.push(check("python", Status::Warning, format!("{shown}: {e}")));
            return;
        }
    };
    let v: serde_json::Value = match text
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
    {
        Some(v) => v,
        None => {
            out.push(check(
                "python",
                Status::Warning,
                format!("{shown}: the torch check printed nothing readable"),
            ));
            return;
        }
    };
    if let Some(err) = v.get("error").and_then(|e| e.as_str()) {
        out.push(with_fix(
            check("python", Status::Warning, format!("{shown}: torch does not import ({err})")),
            "install PyTorch in this environment (pip install torch, the CUDA build matching the driver), or activate the job's environment",
        ));
        return;
    }
    let ver = v.get("version").and_then(|x| x.as_str()).unwrap_or("?");
    let cuda = v.get("cuda").and_then(|x| x.as_str());
    let available = v
        .get("available")
        .and_then(|x| x.as_bool())
        .unwrap_or(false);
    match cuda {
        None => out.push(with_fix(
            check(
                "python",
                if driver_cuda.is_some() { Status::Problem } else { Status::Warning },
                format!("{shown}: torch {ver} is a CPU-only build"),
            ),
            "install the CUDA build: pip install torch --index-url https://download.pytorch.org/whl/cuXYZ (XYZ no newer than the driver's CUDA version)",
        )),
        Some(c) => {
            let parsed: Option<(u32, u32)> = c.split_once('.').and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
            let what = format!("{shown}: torch {ver} built with CUDA {c}, CUDA available: {available}");
            match (parsed, driver_cuda) {
                (Some((rm, _)), Some((dm, dn))) if rm > dm => out.push(with_fix(
                    check("python", Status::Problem, format!("{what}; the driver supports CUDA up to {dm}.{dn}")),
                    format!("upgrade the NVIDIA driver, or install a torch build for CUDA {dm}.x"),
                )),
                (_, Some(_)) if !available => out.push(with_fix(
                    check("python", Status::Problem, what),
                    "torch cannot reach the GPU: check CUDA_VISIBLE_DEVICES and that the driver works (nvidia-smi)",
                )),
                (_, None) => out.push(with_fix(
                    check("python", Status::Warning, what + " (but no NVIDIA driver, see above)"),
                    "fix the driver first",
                )),
                _ => out.push(check("python", Status::Ok, what)),
            }
        }
    }
}

/// The checks for the terminal, one or two lines each.
pub fn render(checks: &[Check]) -> String {
    let mut s = String::new();
    for c in checks {
        s.push_str(&format!(
            "[{:>7}] {:<6} {}\n",
            c.status.as_str(),
            c.area,
            c.what
        ));
        if let Some(f) = &c.fix {
            if c.status != Status::Ok {
                s.push_str(&format!("          {:<6} fix: {f}\n", ""));
            }
        }
    }
    let problems = checks
        .iter()
        .filter(|c| c.status == Status::Problem)
        .count();
    let warnings = checks
        .iter()
        .filter(|c| c.status == Status::Warning)
        .count();
    s.push_str(&format!(
        "gpuprof doctor: {problems} problem(s), {warnings} warning(s), {} check(s) ok\n",
        checks.len() - problems - warnings
    ));
    s
}
