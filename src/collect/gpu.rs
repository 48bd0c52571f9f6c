//! GPU collector: NVML through `nvml-wrapper`, on its own thread.
//!
//! NVML is opened once (`GPUPROF_NVML_LIB` names the library when set — a
//! driver in an odd place, or the fake of `tests/fake-nvml`). Any init
//! error leaves gpuprof profiling the CPU only, with one clear line and a
//! `gpu` coverage entry saying why. Every metric is probed once per device:
//! what fails is disabled for the run and listed, never retried each tick.
//!
//! Utilization comes from the driver's timestamped history
//! (`nvmlDeviceGetSamples`, `nvmlDeviceGetProcessUtilization` with the
//! newest timestamp seen as `lastSeen`), not from poll-time reads: the
//! samples say when the GPU was busy, the poll only says when we asked.
//!
//! Where the GPU supports NVML's GPU Performance Monitoring (GPM: Hopper
//! and newer), a GPM sample is also taken at every poll and the share of
//! each poll interval during which compute or graphics work ran
//! (`NVML_GPM_METRIC_GRAPHICS_UTIL`) is recorded: the same question the
//! driver's utilization answers, at the poll interval (100 ms by default)
//! instead of its fixed 1/6 s. Where GPM is absent or fails, nothing
//! changes: the utilization samples are the measure.
//!
//! Drivers before R510 lack the `_v2`/`_v3` symbols nvml-wrapper calls for
//! process lists, memory and the CUDA version; those calls fall back to the
//! older symbols through `Nvml::lib()`.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::{Clock, PcieUtilCounter, Sampling, TemperatureSensor};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, GpmSample, Nvml};

use crate::event::{
    Coverage, Event, GpuContext, GpuIndex, GpuProc, GpuProcSample, GpuState, MonoNs, Pid,
};
use crate::record::Sink;

/// Environment variable naming the NVML library to load.
pub const NVML_LIB_ENV: &str = "GPUPROF_NVML_LIB";

/// PCIe throughput is measured by the driver over a 20 ms window per call
/// (two calls per GPU): polled every this many ticks, not every tick.
const PCIE_EVERY_TICKS: u64 = 10;
/// A GPM sample call longer than this (2 ms) was preempted: its instant is
/// retaken (see `Poller::gpm_sample`).
const GPM_STAMP_SLACK_NS: u64 = 2_000_000;
const GPM_STAMP_TRIES: u32 = 3;

#[derive(Clone, Debug)]
pub struct GpuOptions {
    /// Poll interval (`--gpu-interval`, default 100 ms).
    pub interval: Duration,
    /// Library to load instead of the default `libnvidia-ml.so.1`.
    pub lib_path: Option<OsString>,
}

impl GpuOptions {
    /// Options with the library taken from `GPUPROF_NVML_LIB`.
    pub fn from_env(interval: Duration) -> GpuOptions {
        GpuOptions {
            interval,
            lib_path: std::env::var_os(NVML_LIB_ENV).filter(|p| !p.is_empty()),
        }
    }
}

/// Why GPU metrics are unavailable for this run: the one line to print.
#[derive(Debug, Clone)]
pub struct GpuUnavailable(pub String);

impl std::fmt::Display for GpuUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GPU metrics unavailable: {}; profiling CPU only", self.0)
    }
}

/// How long `stop` waits for the GPU thread: a wedged driver (a GPU that
/// fell off the bus) can block an NVML call for minutes, and gpuprof must
/// never hold up the end of the job for it.
pub const STOP_WAIT: Duration = Duration::from_secs(5);

/// The collector's way to the recording. `stop` can cut it, so that a
/// thread stuck in a driver call does not keep the recording open.
#[derive(Clone)]
struct Out(Arc<Mutex<Option<Sink>>>);

impl Out {
    fn send(&self, ev: Event) {
        if let Some(s) = self.0.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            s.send(ev);
        }
    }
    fn send_blocking(&self, ev: Event) {
        if let Some(s) = self.0.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            s.send_blocking(ev);
        }
    }
    fn cut(&self) -> Option<Sink> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// The running collector.
pub struct GpuCollector {
    stop: Sender<()>,
    done: Receiver<()>,
    thread: JoinHandle<()>,
    out: Out,
    quiet: bool,
}

impl GpuCollector {
    /// Start the GPU thread: it opens NVML (which can take seconds on a
    /// node without persistence mode, so the job is not held for it) and
    /// polls. If NVML cannot be used, the thread sends the `gpu` coverage
    /// entry, prints the one line saying why (unless `quiet`) and ends; the
    /// job is profiled without GPU metrics.
    pub fn start(opts: &GpuOptions, sink: Sink, quiet: bool) -> std::io::Result<GpuCollector> {
        let (stop, stop_rx) = std::sync::mpsc::channel();
        let (done_tx, done) = std::sync::mpsc::channel();
        let interval = opts.interval.max(Duration::from_millis(10));
        let lib = opts.lib_path.clone();
        let out = Out(Arc::new(Mutex::new(Some(sink))));
        let sink = out.clone();
        // The driver keeps seconds of history: samples from before this
        // moment are not the job's, those after it are, even if NVML takes
        // a while to open.
        let since_us = wall_us();
        let thread = std::thread::Builder::new()
            .name("gpuprof-gpu".into())
            .spawn(move || {
                let _cost = crate::selfcost::Charge::new("GPU poller");
                let unavailable = |why: String| {
                    sink.send_blocking(Event::Coverage(Coverage {
                        source: "gpu".into(),
                        available: false,
                        detail: why.clone(),
                    }));
                    if !quiet {
                        eprintln!("gpuprof: {}", GpuUnavailable(why));
                    }
                };
                match open(lib.as_deref()) {
                    Err(why) => unavailable(why),
                    Ok(nvml) => match nvml.device_count() {
                        Err(e) => unavailable(format!("NVML cannot count the GPUs: {e}")),
                        Ok(devices) => {
                            poll_thread(&nvml, devices, interval, since_us, &sink, stop_rx)
                        }
                    },
                }
                let _ = done_tx.send(());
            })?;
        Ok(GpuCollector {
            stop,
            done,
            thread,
            out,
            quiet,
        })
    }

    /// Take a last sample and stop; NVML is shut down when the thread ends.
    /// If the driver does not answer within `STOP_WAIT`, the thread is left
    /// behind, cut off from the recording, and coverage says so.
    /// Tell the thread to take its last poll and end, without waiting
    /// (see [`GpuCollector::stop`]).
    pub fn request_stop(&self) {
        let _ = self.stop.send(());
    }

    pub fn stop(self) {
        let _ = self.stop.send(());
        match self.done.recv_timeout(STOP_WAIT) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                let _ = self.thread.join();
            }
            Err(RecvTimeoutError::Timeout) => {
                let why = format!(
                    "the NVIDIA driver did not answer for {} s when recording stopped \
                     (a hung GPU?); GPU data ends at its last answer",
                    STOP_WAIT.as_secs()
                );
                if let Some(sink) = self.out.cut() {
                    sink.send_blocking(Event::Coverage(Coverage {
                        source: "gpu.stop".into(),
                        available: false,
                        detail: why.clone(),
                    }));
                }
                if !self.quiet {
                    eprintln!("gpuprof: warning: {why}");
                }
            }
        }
    }
}

fn open(lib: Option<&OsStr>) -> Result<Nvml, String> {
    let mut b = Nvml::builder();
    if let Some(p) = lib {
        b.lib_path(p);
    }
    let shown = lib
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| "libnvidia-ml.so.1".into());
    b.init().map_err(|e| match e {
        NvmlError::LibloadingError(e) => format!(
            "cannot load the NVIDIA management library {shown} ({e}); install the NVIDIA driver, \
             or set {NVML_LIB_ENV} to the path of libnvidia-ml.so.1"
        ),
        NvmlError::DriverNotLoaded => format!(
            "{shown} is installed but the NVIDIA kernel driver is not loaded \
             (nvidia-smi fails the same way; load the driver or reboot)"
        ),
        NvmlError::NoPermission => {
            format!("{shown}: no permission to talk to the NVIDIA driver (check /dev/nvidia*)")
        }
        NvmlError::FailedToLoadSymbol(s) => {
            format!("{shown} is not a usable NVML library: {s}")
        }
        other => format!("NVML ({shown}) failed to initialize: {other}"),
    })
}

/// The metrics probed once per device; each can be disabled for the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Metric {
    Utilization,
    ProcessUtilization,
    Memory,
    SmClock,
    MemClock,
    MaxClocks,
    Temperature,
    Power,
    PowerLimit,
    Throttle,
    PcieLink,
    PcieMaxLink,
    PcieThroughput,
    Processes,
    Mig,
}

impl Metric {
    fn name(self) -> &'static str {
        match self {
            Metric::Utilization => "utilization",
            Metric::ProcessUtilization => "process_utilization",
            Metric::Memory => "memory",
            Metric::SmClock => "sm_clock",
            Metric::MemClock => "memory_clock",
            Metric::MaxClocks => "max_clocks",
            Metric::Temperature => "temperature",
            Metric::Power => "power",
            Metric::PowerLimit => "power_limit",
            Metric::Throttle => "throttle_reasons",
            Metric::PcieLink => "pcie_link",
            Metric::PcieMaxLink => "pcie_max_link",
            Metric::PcieThroughput => "pcie_throughput",
            Metric::Processes => "processes",
            Metric::Mig => "mig_mode",
        }
    }
}

/// Which process-list / memory call this driver has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    Current,
    V2,
    V1,
}

/// "not supported" / "missing in this driver" / other, for the coverage note.
fn why(e: &NvmlError) -> String {
    match e {
        NvmlError::NotSupported => "not supported by this GPU/driver".into(),
        NvmlError::FailedToLoadSymbol(_) => "missing from this driver version".into(),
        NvmlError::NoPermission => "no permission".into(),
        other => other.to_string(),
    }
}

struct Poller<'n> {
    gpu: GpuIndex,
    dev: Device<'n>,
    nvml: &'n Nvml,
    /// Metric → reason it is off for the run.
    off: BTreeMap<Metric, String>,
    /// Utilization read with `nvmlDeviceGetUtilizationRates` because the
    /// sample history is not available.
    util_instant: bool,
    proc_api: Api,
    mem_api: Api,
    last_util_ts: u64,
    last_proc_ts: u64,
    state: Option<GpuState>,
    procs: Option<Vec<GpuProc>>,
    /// Per-process (SM %, memory %) last recorded: recorded again on change.
    proc_util: BTreeMap<u32, (u32, u32)>,
    /// The last GPM sample and when it was taken, while GPM is in use.
    gpm: Option<(GpmSample<'n>, MonoNs)>,
    /// Why GPM is not used on this GPU (None while it is).
    gpm_off: Option<String>,
}

fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// NotFound from the history calls means "no new samples".
fn empty_if_not_found<T>(r: Result<Vec<T>, NvmlError>) -> Result<Vec<T>, NvmlError> {
    match r {
        Err(NvmlError::NotFound) => Ok(Vec::new()),
        other => other,
    }
}

fn sample_u32(v: &SampleValue) -> u32 {
    match *v {
        SampleValue::U32(x) => x,
        SampleValue::U64(x) => x.min(u32::MAX as u64) as u32,
        SampleValue::I64(x) => x.clamp(0, u32::MAX as i64) as u32,
        SampleValue::F64(x) => x.max(0.0).round() as u32,
    }
}

impl<'n> Poller<'n> {
    fn new(nvml: &'n Nvml, gpu: GpuIndex, dev: Device<'n>, since_us: u64) -> Poller<'n> {
        Poller {
            gpu,
            dev,
            nvml,
            off: BTreeMap::new(),
            util_instant: false,
            proc_api: Api::Current,
            mem_api: Api::Current,
            last_util_ts: since_us,
            last_proc_ts: since_us,
            state: None,
            procs: None,
            proc_util: BTreeMap::new(),
            gpm: None,
            gpm_off: Some("not probed".into()),
        }
    }

    /// A GPM sample and the instant it stands for (the middle of the call).
    /// The driver takes it at some moment inside the call, so a call that
    /// was preempted (a busy host) leaves the window's edge uncertain by
    /// half its length: such a sample is taken again, up to
    /// [`GPM_STAMP_TRIES`] times, and the last one kept. Any later sample
    /// is as good a window end as the first.
    fn gpm_sample(&self) -> Result<(GpmSample<'n>, MonoNs), NvmlError> {
        let mut tries = 0;
        loop {
            let before = MonoNs::now();
            let s = self.dev.gpm_sample()?;
            let after = MonoNs::now();
            tries += 1;
            if after.0 - before.0 <= GPM_STAMP_SLACK_NS || tries >= GPM_STAMP_TRIES {
                return Ok((s, MonoNs(before.0 + (after.0 - before.0) / 2)));
            }
        }
    }

    /// Use GPM when the GPU supports it and a first sample works. MIG
    /// instances would need per-instance samples: left to the driver's
    /// (absent) utilization there.
    fn probe_gpm(&mut self, mig: bool) {
        let r = if mig {
            Err("MIG mode".to_string())
        } else {
            match self.dev.gpm_support() {
                Ok(true) => self.gpm_sample().map_err(|e| why(&e)),
                Ok(false) => Err("not supported by this GPU (Hopper or newer)".into()),
                Err(e) => Err(why(&e)),
            }
        };
        match r {
            Ok(s) => {
                self.gpm = Some(s);
                self.gpm_off = None;
            }
            Err(w) => self.gpm_off = Some(w),
        }
    }

    /// GPM activity since the previous GPM sample. A failure turns GPM off
    /// for the run (the utilization samples remain).
    fn poll_gpm(&mut self, sink: &Out) {
        let Some((prev, from)) = self.gpm.take() else {
            return;
        };
        let (cur, t) = match self.gpm_sample() {
            Ok(x) => x,
            Err(e) => {
                self.gpm_off = Some(format!("sampling failed: {}", why(&e)));
                return;
            }
        };
        let got = nvml_wrapper::gpm::gpm_metrics_get(
            self.nvml,
            &prev,
            &cur,
            &[GpmMetricId::GraphicsUtil, GpmMetricId::SmUtil],
        );
        match got {
            Ok(v) => match v.first() {
                Some(Ok(busy)) => {
                    sink.send(Event::GpuActivity {
                        t,
                        gpu: self.gpu,
                        from,
                        busy_pct: busy.value.clamp(0.0, 100.0),
                        sm_active_pct: v
                            .get(1)
                            .and_then(|r| r.as_ref().ok())
                            .map(|m| m.value.clamp(0.0, 100.0)),
                    });
                    self.gpm = Some((cur, t));
                }
                Some(Err(e)) => {
                    self.gpm_off = Some(format!("graphics activity metric: {}", why(e)));
                }
                None => self.gpm_off = Some("no metric returned".into()),
            },
            Err(e) => self.gpm_off = Some(format!("metrics failed: {}", why(&e))),
        }
    }

    fn on(&self, m: Metric) -> bool {
        !self.off.contains_key(&m)
    }

    fn probe<T>(&mut self, m: Metric, r: Result<T, NvmlError>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.off.insert(m, why(&e));
                None
            }
        }
    }

    /// Probe everything once and send the device event.
    fn probe_all(&mut self, sink: &Out) {
        let d = &self.dev;
        let name = d.name().unwrap_or_else(|_| format!("GPU {}", self.gpu));
        let uuid = d.uuid().unwrap_or_default();
        let pci_bus_id = d.pci_info().ok().map(|p| p.bus_id);
        let mig = d.mig_mode();
        let mig_enabled = self.probe(Metric::Mig, mig).map(|m| m.current == 1);

        // The history calls answer NotFound when there is nothing new yet.
        let util = empty_if_not_found(self.dev.samples(Sampling::GpuUtilization, None));
        if let Err(e) = util {
            let instant = self.dev.utilization_rates();
            if instant.is_ok() {
                self.util_instant = true;
            } else {
                self.off.insert(Metric::Utilization, why(&e));
            }
        }
        let pu = empty_if_not_found(self.dev.process_utilization_stats(None));
        self.probe(Metric::ProcessUtilization, pu);

        let mem = self.read_memory();
        let mem_total = self.probe(Metric::Memory, mem).map(|m| m.0);
        let r = self.dev.clock_info(Clock::SM);
        self.probe(Metric::SmClock, r);
        let r = self.dev.clock_info(Clock::Memory);
        self.probe(Metric::MemClock, r);
        let max_sm = self.dev.max_clock_info(Clock::SM);
        let max_sm = self.probe(Metric::MaxClocks, max_sm);
        let max_mem = self.dev.max_clock_info(Clock::Memory).ok();
        let r = self.dev.temperature(TemperatureSensor::Gpu);
        self.probe(Metric::Temperature, r);
        let r = self.dev.power_usage();
        self.probe(Metric::Power, r);
        let r = self.dev.enforced_power_limit();
        self.probe(Metric::PowerLimit, r);
        let r = self.read_throttle();
        self.probe(Metric::Throttle, r);
        let r = self
            .dev
            .current_pcie_link_gen()
            .and_then(|_| self.dev.current_pcie_link_width());
        self.probe(Metric::PcieLink, r);
        let r = self.dev.max_pcie_link_gen();
        let pcie_max_gen = self.probe(Metric::PcieMaxLink, r);
        let pcie_max_width = self.dev.max_pcie_link_width().ok();
        let r = self.dev.pcie_throughput(PcieUtilCounter::Send);
        self.probe(Metric::PcieThroughput, r);
        let r = self.read_processes();
        self.probe(Metric::Processes, r);
        self.probe_gpm(mig_enabled == Some(true));

        sink.send_blocking(Event::GpuDevice {
            t: MonoNs::now(),
            gpu: self.gpu,
            name,
            uuid,
            pci_bus_id,
            mem_total,
            max_sm_mhz: max_sm,
            max_mem_mhz: max_mem,
            pcie_max_gen,
            pcie_max_width,
            mig_enabled,
            unsupported: self
                .off
                .iter()
                .map(|(m, why)| format!("{}: {}", m.name(), why))
                .chain(self.gpm_off.iter().map(|why| format!("gpm: {why}")))
                .collect(),
        });
    }

    /// The clock-event ("throttle") reason bits, raw: nvml-wrapper's
    /// `current_throttle_reasons` drops bits it does not know, and drivers
    /// from R535 name the call `...ClocksEventReasons` (the old name stays
    /// as an alias, for now).
    fn read_throttle(&self) -> Result<u64, NvmlError> {
        let lib = self.nvml.lib();
        let sym = lib
            .nvmlDeviceGetCurrentClocksEventReasons
            .as_ref()
            .or(lib.nvmlDeviceGetCurrentClocksThrottleReasons.as_ref())
            .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
        let mut bits: std::os::raw::c_ulonglong = 0;
        // SAFETY: nvml.h signature; a live device handle; a valid out pointer.
        nvml_wrapper::error::nvml_try(unsafe { sym(self.dev.handle(), &mut bits) })?;
        Ok(bits)
    }

    /// (total, used) bytes, falling back to the v1 call on old drivers.
    fn read_memory(&mut self) -> Result<(u64, u64), NvmlError> {
        if self.mem_api == Api::Current {
            match self.dev.memory_info() {
                Ok(m) => return Ok((m.total, m.used)),
                Err(NvmlError::FailedToLoadSymbol(_)) => self.mem_api = Api::V1,
                Err(e) => return Err(e),
            }
        }
        let sym = self
            .nvml
            .lib()
            .nvmlDeviceGetMemoryInfo
            .as_ref()
            .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
        // SAFETY: the symbol has nvml.h's signature; the handle is live for
        // the lifetime of `self.nvml`; the out struct is plain data.
        unsafe {
            let mut m: nvml_wrapper_sys::bindings::nvmlMemory_t = std::mem::zeroed();
            nvml_wrapper::error::nvml_try(sym(self.dev.handle(), &mut m))?;
            Ok((m.total, m.used))
        }
    }

    /// Compute and graphics processes, falling back to `_v2` and then v1
    /// symbols on old drivers.
    fn read_processes(&mut self) -> Result<Vec<GpuProc>, NvmlError> {
        if self.proc_api == Api::Current {
            // Graphics contexts are optional: data-center GPUs and some
            // drivers answer NotSupported, which must not cost the compute list.
            let r = self.dev.running_compute_processes().map(|c| {
                [
                    (c, GpuContext::Compute),
                    (
                        self.dev.running_graphics_processes().unwrap_or_default(),
                        GpuContext::Graphics,
                    ),
                ]
            });
            match r {
                Ok(lists) => {
                    let mut out = Vec::new();
                    for (list, ctx) in lists {
                        for p in list {
                            out.push(GpuProc {
                                pid: Pid(p.pid as i32),
                                ctx,
                                mem: match p.used_gpu_memory {
                                    UsedGpuMemory::Used(b) => Some(b),
                                    UsedGpuMemory::Unavailable => None,
                                },
                                gi: p.gpu_instance_id,
                                ci: p.compute_instance_id,
                            });
                        }
                    }
                    return Ok(out);
                }
                Err(NvmlError::FailedToLoadSymbol(_)) => self.proc_api = Api::V2,
                Err(e) => return Err(e),
            }
        }
        if self.proc_api == Api::V2 {
            match self.raw_processes_v2() {
                Err(NvmlError::FailedToLoadSymbol(_)) => self.proc_api = Api::V1,
                other => return other,
            }
        }
        self.raw_processes_v1()
    }

    fn raw_processes_v2(&self) -> Result<Vec<GpuProc>, NvmlError> {
        use nvml_wrapper_sys::bindings::nvmlProcessInfo_v2_t;
        let lib = self.nvml.lib();
        let mut out = Vec::new();
        for (sym, ctx) in [
            (
                lib.nvmlDeviceGetComputeRunningProcesses_v2.as_ref(),
                GpuContext::Compute,
            ),
            (
                lib.nvmlDeviceGetGraphicsRunningProcesses_v2.as_ref(),
                GpuContext::Graphics,
            ),
        ] {
            let sym = sym.map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()));
            // SAFETY: nvml.h signature; `count` bounds what the driver writes.
            let list: Result<Vec<nvmlProcessInfo_v2_t>, NvmlError> =
                sym.and_then(|sym| unsafe { raw_list(|c, p| sym(self.dev.handle(), c, p)) });
            let list = match (list, ctx) {
                (Ok(l), _) => l,
                // Graphics contexts are optional (see read_processes).
                (Err(_), GpuContext::Graphics) => Vec::new(),
                (Err(e), GpuContext::Compute) => return Err(e),
            };
            for p in list {
                let id = |v: u32| (v != u32::MAX).then_some(v);
                out.push(GpuProc {
                    pid: Pid(p.pid as i32),
                    ctx,
                    mem: Some(p.usedGpuMemory),
                    gi: id(p.gpuInstanceId),
                    ci: id(p.computeInstanceId),
                });
            }
        }
        Ok(out)
    }

    fn raw_processes_v1(&self) -> Result<Vec<GpuProc>, NvmlError> {
        use nvml_wrapper_sys::bindings::nvmlProcessInfo_v1_t;
        let lib = self.nvml.lib();
        let mut out = Vec::new();
        for (sym, ctx) in [
            (
                lib.nvmlDeviceGetComputeRunningProcesses.as_ref(),
                GpuContext::Compute,
            ),
            (
                lib.nvmlDeviceGetGraphicsRunningProcesses.as_ref(),
                GpuContext::Graphics,
            ),
        ] {
            let sym = sym.map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()));
            // SAFETY: as above, with the v1 struct the v1 symbol expects.
            let list: Result<Vec<nvmlProcessInfo_v1_t>, NvmlError> =
                sym.and_then(|sym| unsafe { raw_list(|c, p| sym(self.dev.handle(), c, p)) });
            let list = match (list, ctx) {
                (Ok(l), _) => l,
                (Err(_), GpuContext::Graphics) => Vec::new(),
                (Err(e), GpuContext::Compute) => return Err(e),
            };
            for p in list {
                out.push(GpuProc {
                    pid: Pid(p.pid as i32),
                    ctx,
                    mem: Some(p.usedGpuMemory),
                    gi: None,
                    ci: None,
                });
            }
        }
        Ok(out)
    }

    /// The device's utilization samples since the last tick (or its
    /// instant utilization where the driver keeps no history).
    fn poll_utilization(&mut self, sink: &Out, t: MonoNs) {
        if self.on(Metric::Utilization) {
            if self.util_instant {
                if let Ok(u) = self.dev.utilization_rates() {
                    sink.send(Event::GpuUtil {
                        t,
                        gpu: self.gpu,
                        samples: vec![(wall_us(), u.gpu)],
                    });
                }
            } else if let Ok(s) = empty_if_not_found(
                self.dev
                    .samples(Sampling::GpuUtilization, self.last_util_ts),
            ) {
                let samples: Vec<(u64, u32)> = s
                    .iter()
                    .filter(|s| s.timestamp > self.last_util_ts)
                    .map(|s| (s.timestamp, sample_u32(&s.value)))
                    .collect();
                if let Some(newest) = samples.iter().map(|s| s.0).max() {
                    self.last_util_ts = newest;
                    sink.send(Event::GpuUtil {
                        t,
                        gpu: self.gpu,
                        samples,
                    });
                }
            }
        }
    }

    /// Per-process utilization since the last tick: each process's newest
    /// row, sent when it changed.
    fn poll_process_utilization(&mut self, sink: &Out, t: MonoNs) {
        if self.on(Metric::ProcessUtilization) {
            if let Ok(rows) =
                empty_if_not_found(self.dev.process_utilization_stats(self.last_proc_ts))
            {
                let mut newest: BTreeMap<u32, GpuProcSample> = BTreeMap::new();
                for r in rows {
                    if r.pid == 0 || r.timestamp <= self.last_proc_ts {
                        continue;
                    }
                    let keep = newest.get(&r.pid).map_or(true, |o| r.timestamp > o.ts_us);
                    if keep {
                        newest.insert(
                            r.pid,
                            GpuProcSample {
                                pid: Pid(r.pid as i32),
                                ts_us: r.timestamp,
                                sm: r.sm_util,
                                mem: r.mem_util,
                            },
                        );
                    }
                }
                if let Some(ts) = newest.values().map(|s| s.ts_us).max() {
                    self.last_proc_ts = ts;
                    // Values hold until they change: record the changes.
                    let changed: Vec<GpuProcSample> = newest
                        .into_values()
                        .filter(|s| {
                            self.proc_util.insert(s.pid.0 as u32, (s.sm, s.mem))
                                != Some((s.sm, s.mem))
                        })
                        .collect();
                    if !changed.is_empty() {
                        sink.send(Event::GpuProcUtil {
                            t,
                            gpu: self.gpu,
                            samples: changed,
                        });
                    }
                }
            }
        }
    }

    /// One tick: history since the last tick, state when it changed.
    fn poll(&mut self, sink: &Out, tick: u64) {
        self.poll_gpm(sink);
        let t = MonoNs::now();
        self.poll_utilization(sink, t);
        self.poll_process_utilization(sink, t);

        let d = &self.dev;
        let state = GpuState {
            mem_used: None,
            sm_mhz: self
                .on(Metric::SmClock)
                .then(|| d.clock_info(Clock::SM).ok())
                .flatten(),
            mem_mhz: self
                .on(Metric::MemClock)
                .then(|| d.clock_info(Clock::Memory).ok())
                .flatten(),
            temp_c: self
                .on(Metric::Temperature)
                .then(|| d.temperature(TemperatureSensor::Gpu).ok())
                .flatten(),
            power_mw: self
                .on(Metric::Power)
                .then(|| d.power_usage().ok())
                .flatten(),
            power_limit_mw: self
                .on(Metric::PowerLimit)
                .then(|| d.enforced_power_limit().ok())
                .flatten(),
            throttle: self
                .on(Metric::Throttle)
                .then(|| self.read_throttle().ok())
                .flatten(),
            pcie_gen: self
                .on(Metric::PcieLink)
                .then(|| d.current_pcie_link_gen().ok())
                .flatten(),
            pcie_width: self
                .on(Metric::PcieLink)
                .then(|| d.current_pcie_link_width().ok())
                .flatten(),
        };
        let state = GpuState {
            mem_used: if self.on(Metric::Memory) {
                self.read_memory().ok().map(|m| m.1)
            } else {
                None
            },
            ..state
        };
        if self.state.as_ref() != Some(&state) {
            sink.send(Event::GpuState {
                t,
                gpu: self.gpu,
                state: state.clone(),
            });
            self.state = Some(state);
        }

        if self.on(Metric::PcieThroughput) && tick % PCIE_EVERY_TICKS == 0 {
            if let (Ok(tx), Ok(rx)) = (
                self.dev.pcie_throughput(PcieUtilCounter::Send),
                self.dev.pcie_throughput(PcieUtilCounter::Receive),
            ) {
                sink.send(Event::GpuPcie {
                    t: MonoNs::now(),
                    gpu: self.gpu,
                    tx_kbps: tx,
                    rx_kbps: rx,
                });
            }
        }

        if self.on(Metric::Processes) {
            if let Ok(mut procs) = self.read_processes() {
                procs.sort_by_key(|p| (p.pid, p.ctx == GpuContext::Graphics));
                if self.procs.as_ref() != Some(&procs) {
                    sink.send(Event::GpuProcesses {
                        t: MonoNs::now(),
                        gpu: self.gpu,
                        procs: procs.clone(),
                    });
                    self.procs = Some(procs);
                }
            }
        }
    }
}

/// The driver's two-call list protocol: ask for the count, then fill.
///
/// # Safety
/// `call(count, buf)` must be an NVML list function that writes at most
/// `*count` elements of `T` to `buf`.
unsafe fn raw_list<T>(
    call: impl Fn(*mut u32, *mut T) -> nvml_wrapper_sys::bindings::nvmlReturn_t,
) -> Result<Vec<T>, NvmlError> {
    use nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE as INSUFFICIENT;
    let mut count: u32 = 0;
    match call(&mut count, std::ptr::null_mut()) {
        INSUFFICIENT => {}
        other => {
            nvml_wrapper::error::nvml_try(other)?;
            return Ok(Vec::new());
        }
    }
    // Headroom for processes that start between the two calls.
    count += 5;
    let mut buf: Vec<T> = Vec::with_capacity(count as usize);
    nvml_wrapper::error::nvml_try(call(&mut count, buf.as_mut_ptr()))?;
    buf.set_len((count as usize).min(buf.capacity()));
    Ok(buf)
}

fn poll_thread(
    nvml: &Nvml,
    devices: u32,
    interval: Duration,
    since_us: u64,
    sink: &Out,
    stop: Receiver<()>,
) {
    let driver_version = nvml.sys_driver_version().ok();
    let cuda = match nvml.sys_cuda_driver_version() {
        Ok(v) => Some(v),
        Err(NvmlError::FailedToLoadSymbol(_)) => {
            // Old driver: the v1 symbol.
            nvml.lib()
                .nvmlSystemGetCudaDriverVersion
                .as_ref()
                .ok()
                .and_then(|sym| {
                    let mut v = 0;
                    // SAFETY: nvml.h signature, a valid out pointer.
                    let r = unsafe { sym(&mut v) };
                    nvml_wrapper::error::nvml_try(r).ok().map(|_| v)
                })
        }
        Err(_) => None,
    };
    sink.send_blocking(Event::GpuDriver {
        t: MonoNs::now(),
        driver_version: driver_version.clone(),
        cuda_driver_version: cuda,
        devices,
    });

    let mut pollers = Vec::new();
    let mut lost = Vec::new();
    for i in 0..devices {
        match nvml.device_by_index(i) {
            Ok(d) => pollers.push(Poller::new(nvml, i, d, since_us)),
            Err(e) => lost.push(format!("GPU {i}: {e}")),
        }
    }
    for p in &mut pollers {
        p.probe_all(sink);
    }

    // Coverage: one entry for NVML, one per metric that some GPU lacks.
    let mut detail = format!(
        "NVML: {} GPU(s), driver {}, CUDA driver {}",
        devices,
        driver_version.as_deref().unwrap_or("unknown"),
        cuda.map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
            .unwrap_or_else(|| "unknown".into()),
    );
    if !lost.is_empty() {
        detail.push_str(&format!("; not opened: {}", lost.join(", ")));
    }
    let gpm: Vec<String> = pollers
        .iter()
        .filter(|p| p.gpm.is_some())
        .map(|p| p.gpu.to_string())
        .collect();
    if !gpm.is_empty() {
        detail.push_str(&format!(
            "; GPM activity (at the poll interval) on GPU {}",
            gpm.join(", ")
        ));
    }
    if pollers.iter().any(|p| p.util_instant) {
        detail.push_str("; utilization read instantaneously (no sample history from this driver)");
    }
    if pollers
        .iter()
        .any(|p| p.proc_api != Api::Current || p.mem_api != Api::Current)
    {
        detail.push_str("; old driver: process lists/memory through the pre-R510 NVML calls");
    }
    sink.send_blocking(Event::Coverage(Coverage {
        source: "gpu".into(),
        available: devices > 0,
        detail: if devices == 0 {
            "NVML works but reports no GPU".into()
        } else {
            detail
        },
    }));
    let mut by_metric: BTreeMap<Metric, Vec<String>> = BTreeMap::new();
    for p in &pollers {
        for (m, why) in &p.off {
            by_metric
                .entry(*m)
                .or_default()
                .push(format!("GPU {} ({why})", p.gpu));
        }
    }
    for (m, gpus) in by_metric {
        sink.send_blocking(Event::Coverage(Coverage {
            source: format!("gpu.{}", m.name()),
            available: false,
            detail: format!("not measured on {}", gpus.join(", ")),
        }));
    }

    let mut tick: u64 = 0;
    let mut next = Instant::now();
    loop {
        for p in &mut pollers {
            p.poll(sink, tick);
        }
        tick += 1;
        next += interval;
        let now = Instant::now();
        if next < now {
            // Fell behind (a slow driver call): skip, do not burst.
            next = now + interval;
        }
        match stop.recv_timeout(next - now) {
            Err(RecvTimeoutError::Timeout) => continue,
            // Stop: one last poll so the samples up to the end are kept.
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                for p in &mut pollers {
                    p.poll(sink, tick);
                }
                break;
            }
        }
    }
    // GPM that worked at first and then failed: the windows stop there.
    let failed: Vec<String> = pollers
        .iter()
        .filter(|p| gpm.contains(&p.gpu.to_string()))
        .filter_map(|p| p.gpm_off.as_ref().map(|w| format!("GPU {} ({w})", p.gpu)))
        .collect();
    if !failed.is_empty() {
        sink.send_blocking(Event::Coverage(Coverage {
            source: "gpu.gpm".into(),
            available: false,
            detail: format!(
                "GPM activity stopped during the run on {}; idle time falls back to the driver's utilization samples there",
                failed.join(", ")
            ),
        }));
    }
}
