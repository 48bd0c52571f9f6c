//! A recording session: launch the job, run the collectors, pass signals
//! and the exit status through, then build the outputs from the recording
//! with the same code as `gpuprof report`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use tokio::signal::unix::{signal, SignalKind};

use crate::collect::cgroup::CgroupCollector;
use crate::collect::files::FilesCollector;
use crate::collect::gpu::{GpuCollector, GpuOptions};
use crate::collect::nvtx::{self, NvtxCollector, NvtxPlan};
use crate::collect::others::OthersCollector;
use crate::collect::procfs::TreeCollector;
use crate::collect::stacks::{AgentPlan, StackCollectors};
use crate::collect::system::SystemCollector;
use crate::collect::TreeNews;
use crate::config::{ForwardSignals, RecordConfig};
use crate::event::{ClockAnchor, Event, Footer, Header, JobStatus, MonoNs, Pid, RECORDING_VERSION};
use crate::launch;
use crate::outdir::{OutDir, Reserve};
use crate::outputs::GenerateOptions;
use crate::record::{self, Sink};

/// Collectors sampled together on one thread at `--interval`.
pub(crate) struct Samplers {
    tree: TreeCollector,
    system: SystemCollector,
    files: FilesCollector,
    cgroup: CgroupCollector,
    others: OthersCollector,
    /// The perf reader's news of new processes and libraries, once stacks
    /// are sampled: the tree and the libraries are then re-read on news.
    news: Option<Arc<TreeNews>>,
}

impl Samplers {
    fn tick(&mut self) {
        let news = self.news.as_deref();
        self.tree.tick(news);
        self.system.tick();
        let live = self.tree.live_pids();
        self.files.tick(&live, news);
        self.cgroup.tick(&live);
        self.others.tick(&live);
    }
}

pub(crate) struct SamplerThread {
    shared: Arc<Mutex<Option<Samplers>>>,
    stop: Arc<AtomicBool>,
    active: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SamplerThread {
    /// `root`: record that running process's tree (`gpuprof attach`)
    /// instead of gpuprof's children.
    pub(crate) fn start(
        sink: &Sink,
        interval: Duration,
        active: bool,
        root: Option<Pid>,
    ) -> Result<SamplerThread> {
        let tree = match root {
            Some(r) => TreeCollector::with_root(sink.clone(), r),
            None => TreeCollector::new(sink.clone()),
        };
        let shared = Arc::new(Mutex::new(Some(Samplers {
            tree,
            system: SystemCollector::new(sink.clone()),
            files: FilesCollector::new(sink.clone()),
            cgroup: CgroupCollector::new(sink.clone()),
            others: OthersCollector::new(sink.clone()),
            news: None,
        })));
        let stop = Arc::new(AtomicBool::new(false));
        let active = Arc::new(AtomicBool::new(active));
        let (s2, stop2, active2) = (shared.clone(), stop.clone(), active.clone());
        let thread = std::thread::Builder::new()
            .name("gpuprof-procfs".into())
            .spawn(move || {
                let _cost = crate::selfcost::Charge::new("/proc sampler");
                let mut next = Instant::now();
                while !stop2.load(Ordering::Acquire) {
                    if active2.load(Ordering::Acquire) {
                        if let Some(s) = s2.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                            s.tick();
                        }
                    }
                    // Fixed-rate ticks: a slow pass does not shift the grid.
                    next += interval;
                    let now = Instant::now();
                    if next < now {
                        next = now;
                    }
                    std::thread::park_timeout(next - now);
                }
            })
            .context("cannot start the /proc sampling thread")?;
        Ok(SamplerThread {
            shared,
            stop,
            active,
            thread: Some(thread),
        })
    }

    /// Re-read the tree and libraries on the perf reader's news (and a
    /// safety-net period) instead of at every pass.
    pub(crate) fn follow(&self, news: Option<Arc<TreeNews>>) {
        if let Some(s) = self
            .shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            s.news = news;
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Samplers) -> R) -> Option<R> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        self.shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .map(f)
    }

    /// Stop sampling after one last pass, and drop the collectors (and with
    /// them their sinks).
    fn finish(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        let last = self.shared.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut s) = last {
            if self.active.load(Ordering::Acquire) {
                s.tick();
                let live = s.tree.live_pids();
                s.others.flush(&live);
            }
        }
        self.active.store(false, Ordering::Release);
    }
}

/// Choose, create and open the output folder, and prove it is writable,
/// before the job starts: a bad `-o` must never cost a training run.
/// Returns the folder, whether gpuprof created it, and the space reserved
/// for the final outputs (None when the disk is too full for it).
pub(crate) fn open_output(requested: Option<&Path>) -> Result<(OutDir, bool, Option<Reserve>)> {
    let path = match requested {
        Some(p) => match p
            .to_str()
            .filter(|s| crate::placeholders::has_placeholders(s))
        {
            Some(t) => PathBuf::from(
                crate::placeholders::expand(t, &crate::placeholders::Values::current(&hostname()))
                    .map_err(anyhow::Error::msg)?,
            ),
            None => p.to_path_buf(),
        },
        None => default_output_name(),
    };
    let (out, created) = OutDir::open(&path, true)?;
    let held = || {
        anyhow::anyhow!(
            "output folder {} already holds a recording (another gpuprof may be writing it): choose another with -o DIR, or remove it",
            path.display()
        )
    };
    if out.exists(record::RECORDING_DIR) {
        return Err(held());
    }
    if let Some(name) = crate::outputs::earlier_output(&out, |_| true) {
        anyhow::bail!(
            "output folder {} already holds {name} (from an earlier run?), which gpuprof would replace: choose another folder with -o DIR, or remove it",
            path.display()
        );
    }
    // The claim: creating `recording/` is atomic, so of two gpuprofs given
    // one folder exactly one goes on; the other stops here, before its job
    // starts, and touches nothing of the first's.
    match out.create_subdir(record::RECORDING_DIR) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(held()),
        Err(e) => {
            if created {
                let _ = std::fs::remove_dir(&path);
            }
            anyhow::bail!(
                "output folder {} is not writable ({e}): choose another with -o DIR",
                path.display()
            );
        }
    }
    // A merge claims its folder the other way round (its marker, then a
    // look for a recording): whichever came second sees the other.
    if let Some(name) = crate::outputs::earlier_output(&out, |_| true) {
        let _ = out.remove_empty_subdir(record::RECORDING_DIR);
        anyhow::bail!(
            "output folder {} is being written by another gpuprof ({name}): choose another folder with -o DIR",
            path.display()
        );
    }
    let fail = |e: std::io::Error| {
        let _ = out.remove_empty_subdir(record::RECORDING_DIR);
        if created {
            let _ = std::fs::remove_dir(&path);
        }
        anyhow::anyhow!(
            "output folder {} is not writable ({e}): choose another with -o DIR",
            path.display()
        )
    };
    let reserve = match Reserve::create(&out) {
        Ok(r) => Some(r),
        Err(e)
            if e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT) =>
        {
            // Not worth stopping the job for: the profile will say what is missing.
            eprintln!(
                "gpuprof: warning: the disk of {} is nearly full ({e}): the profile may be incomplete",
                path.display()
            );
            let probe = format!(".gpuprof-write-test.{}", std::process::id());
            match out.create_new(&probe) {
                Ok(_) => {
                    let _ = out.remove(&probe);
                    None
                }
                Err(e)
                    if e.raw_os_error() == Some(libc::ENOSPC)
                        || e.raw_os_error() == Some(libc::EDQUOT) =>
                {
                    None
                }
                Err(e) => return Err(fail(e)),
            }
        }
        Err(e) => return Err(fail(e)),
    };
    Ok((out, created, reserve))
}

/// [`open_output`] for a caller that opens the folder again by path (the
/// writer and the outputs then check it again): the folder's path and
/// whether gpuprof created it.
pub(crate) fn prepare_output(requested: Option<&Path>) -> Result<(PathBuf, bool)> {
    let (out, created, _reserve) = open_output(requested)?;
    Ok((out.path().to_path_buf(), created))
}

/// `gpuprof-<host>-<YYYYmmdd-HHMMSS>[-rank<N>]`, made unique in the
/// current directory.
fn default_output_name() -> PathBuf {
    let host = hostname();
    let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
    // The rank and host come from the environment: one component each, so
    // that `RANK=../../x` cannot put the folder elsewhere.
    let rank = rank_id()
        .map(|r| format!("-rank{}", crate::placeholders::sanitize(&r)))
        .unwrap_or_default();
    let host = crate::placeholders::sanitize(&host);
    let base = format!("gpuprof-{host}-{stamp}{rank}");
    let mut p = PathBuf::from(&base);
    let mut n = 2;
    while p.exists() {
        p = PathBuf::from(format!("{base}-{n}"));
        n += 1;
    }
    p
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .map(|h| h.split('.').next().unwrap_or("").to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into())
}

/// The rank of this process under torchrun/Slurm/MPI, for per-rank folders.
fn rank_id() -> Option<String> {
    ["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
}

/// The rank variables of gpuprof's own environment.
fn own_rank_env() -> crate::event::RankEnv {
    crate::event::RANK_ENV_KEYS
        .iter()
        .filter_map(|k| {
            let v = std::env::var_os(k)?;
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend(v.into_encoded_bytes());
            Some(kv)
        })
        .collect::<Vec<_>>()
        .iter()
        .flat_map(|kv| crate::event::rank_env_from([kv.as_slice()]))
        .collect()
}

pub(crate) fn make_header(cfg: &RecordConfig, job_pid: Pid) -> Header {
    let anchor = ClockAnchor::now();
    let start = MonoNs(anchor.monotonic_ns);
    Header {
        format: record::FORMAT_NAME.into(),
        version: RECORDING_VERSION,
        gpuprof_version: env!("CARGO_PKG_VERSION").into(),
        command: cfg
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        host: hostname(),
        start,
        anchor_realtime_ns: anchor.realtime_ns,
        anchor_monotonic_ns: anchor.monotonic_ns,
        anchor_error_ns: anchor.error_ns,
        clock: crate::collect::clock::clock_sync(),
        rank_env: own_rank_env(),
        boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty()),
        interval_ns: cfg.interval.as_nanos() as u64,
        cpus: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        page_size: procfs::page_size(),
        clock_ticks_per_s: procfs::ticks_per_second(),
        rank: rank_id(),
        job_pid,
        boottime_offset_ns: MonoNs::boottime_offset(),
        gpu_idle_threshold_pct: Some(cfg.idle_threshold_pct),
        step_range: cfg.step_range.clone(),
        attached: None,
    }
}

/// Record `cfg.command`; returns the exit code gpuprof should exit with (the
/// job's).
pub fn record(cfg: RecordConfig) -> Result<i32> {
    // Before anything else: a bad address must stop gpuprof before the job
    // starts and before an output folder is made.
    let metrics = crate::live::bind_metrics(&cfg)?;
    let (out, created, reserve) = open_output(cfg.output.as_deref())?;
    // In-process agents: written into a private runtime folder that stays
    // until gpuprof exits (the job may run on after the recording window).
    let agents = if cfg.no_nvtx {
        None
    } else {
        match crate::agent::AgentDir::create() {
            Ok(d) => Some(d),
            Err(e) => {
                say(cfg.quiet, &format!("no runtime folder for the in-process agents ({e}); NVTX ranges are not captured"));
                None
            }
        }
    };
    let nvtx_plan = if cfg.no_nvtx {
        NvtxPlan::disabled("disabled with --no-nvtx")
    } else {
        let plan = NvtxPlan::new(agents.as_ref(), std::env::var_os(nvtx::INJECTION_VAR));
        if let Some(why) = plan.not_captured.as_deref().filter(|_| agents.is_some()) {
            say(cfg.quiet, &format!("NVTX {why}"));
        }
        plan
    };
    // The same-instant Python agent is put into the job's environment, so
    // it is ready before the fork.
    let agent = StackCollectors::prepare_agent(cfg.stacks.as_ref());
    let mut env = nvtx_plan.env.clone();
    if let AgentPlan::Ready(a) = &agent {
        env.extend(a.env().iter().cloned());
    }
    let suspended = match launch::spawn_suspended(&cfg.command, &env) {
        Ok(s) => s,
        Err(e) => {
            undo_output(&out, created, reserve);
            eprintln!("gpuprof: {e}");
            return Ok(e.exit_code());
        }
    };
    // gpuprof's own descriptors (rings, /proc files kept open, metrics
    // connections) up to the hard limit: the job was forked with its own.
    raise_open_file_limit();
    // Descendants whose parent exits are reparented to us instead of init,
    // so the whole tree stays visible and their exit is observed.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let code = rt.block_on(run(
        cfg,
        (out, created, reserve),
        suspended,
        nvtx_plan,
        metrics,
        &agent,
    ));
    drop(agents);
    if let AgentPlan::Ready(a) = agent {
        // Orphans of the job may still start programs that preload it.
        let alive = !crate::collect::python::descendants(std::process::id() as i32).is_empty();
        a.finish(alive);
    }
    code
}

/// The signals whose sender gpuprof notes: SIGINT (one from a process is
/// not passed on, see [`sigint_not_passed_on`]) and those passed on to the
/// job (`--forward-signals`).
const WATCHED: [Signal; 5] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];
/// The process that sent each watched signal last ([`sender_of`]).
static SENDERS: [std::sync::atomic::AtomicI32; 5] =
    [const { std::sync::atomic::AtomicI32::new(0) }; 5];

/// Note who sends the watched signals, beside tokio's own handlers.
fn watch_senders() {
    for (i, sig) in WATCHED.iter().enumerate() {
        // SAFETY: the action only reads the siginfo and stores an atomic,
        // which is async-signal-safe.
        let _ = unsafe {
            signal_hook_registry::register_sigaction(*sig as libc::c_int, move |info| {
                SENDERS[i].store(sender_of(info), Ordering::Relaxed);
            })
        };
    }
}

/// The sender of the last `sig` received since the last call (0 when none
/// was noted, or it came from the kernel, e.g. the terminal's Ctrl-C).
fn take_sender(sig: Signal) -> i32 {
    WATCHED
        .iter()
        .position(|s| *s == sig)
        .map_or(0, |i| SENDERS[i].swap(0, Ordering::Relaxed))
}

/// The process that sent a signal: si_code <= 0 means sent by a process
/// (kill, sigqueue, tgkill), above 0 by the kernel (0 here). -1: a
/// process of another pid namespace.
fn sender_of(info: &libc::siginfo_t) -> i32 {
    match info.si_code {
        c if c > 0 => 0,
        // SAFETY: si_pid is set for signals sent by a process.
        _ => Some(unsafe { info.si_pid() })
            .filter(|p| *p > 0)
            .unwrap_or(-1),
    }
}

/// Slurm's step daemon: it delivers a job step's signals (`scancel`,
/// `--signal`, the time limit) to every process of the step.
const SLURM_STEPD: &str = "slurmstepd";

/// Pass `sig`, which reached gpuprof, on to the job, unless
/// `--forward-signals` says the job has it already; the first time a
/// signal is kept back, say why.
fn pass_on(cfg: &RecordConfig, job: Pid, sig: Signal, told: &mut [bool; WATCHED.len()]) {
    let Some(i) = WATCHED.iter().position(|s| *s == sig) else {
        return;
    };
    let sender = take_sender(sig);
    let why = match cfg.forward_signals {
        ForwardSignals::Always => None,
        ForwardSignals::Never => Some(format!(
            "{sig} reached gpuprof and is not passed on (--forward-signals never): recording until the job exits"
        )),
        ForwardSignals::Auto if sender > 0 && comm_of(sender).as_deref() == Some(SLURM_STEPD) => Some(format!(
            "{sig} from {SLURM_STEPD} (pid {sender}) is not passed on: Slurm signals every process of the job step, so the job has its own (--forward-signals always passes it on); recording until the job exits"
        )),
        ForwardSignals::Auto if sender > 0 && timeout_signals_group_of(sender, job) => Some(format!(
            "{sig} from timeout (pid {sender}) is not passed on: GNU timeout signals its whole process group, the job's too, so the job has its own (--forward-signals always passes it on); recording until the job exits"
        )),
        ForwardSignals::Auto => None,
    };
    match why {
        None => {
            let _ = kill(nix::unistd::Pid::from_raw(job.0), sig);
        }
        Some(why) => {
            if !std::mem::replace(&mut told[i], true) {
                say(cfg.quiet, &why);
            }
        }
    }
}

/// Whether `sender` is GNU coreutils' `timeout` signalling the job's whole
/// process group: without `--foreground` it makes itself the leader of a
/// process group and sends its signal to the child, then to the group
/// (`kill(0, sig)`), which holds the job. `--foreground`, another
/// program's `timeout` (BusyBox's signals the child only) or a job in a
/// group of its own do not qualify: the job then has the signal only if
/// gpuprof passes it on.
fn timeout_signals_group_of(sender: i32, job: Pid) -> bool {
    let exe = std::fs::read_link(format!("/proc/{sender}/exe")).ok();
    if exe.as_deref().and_then(|p| p.file_name()) != Some(std::ffi::OsStr::new("timeout")) {
        return false;
    }
    let job_group = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(job.0)));
    if job_group.map(|g| g.as_raw()) != Ok(sender) {
        return false;
    }
    let Ok(args) = std::fs::read(format!("/proc/{sender}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = args.split(|b| *b == 0).skip(1).collect();
    !timeout_in_foreground(&args)
}

/// Whether `timeout`'s options (its arguments before DURATION) hold
/// `--foreground` or a prefix of it, as getopt takes: `--f` already, no
/// other long option of timeout starting with f (nor `--s` and `--k`
/// another than `--signal` and `--kill-after`).
fn timeout_in_foreground(args: &[&[u8]]) -> bool {
    let long = |a: &[u8], name: &[u8]| a.len() > 2 && name.starts_with(a);
    let mut i = 0;
    while let Some(a) = args.get(i) {
        if *a == b"--" || !a.starts_with(b"-") {
            return false;
        }
        if long(a, b"--foreground") {
            return true;
        }
        // The options whose value may be the next argument.
        if matches!(*a, b"-s" | b"-k") || long(a, b"--signal") || long(a, b"--kill-after") {
            i += 1;
        }
        i += 1;
    }
    false
}

fn comm_of(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// Why a SIGINT that a process sent to gpuprof is not passed on: it cannot
/// tell `kill PID` from `kill -PGID` (which reached the job already), and a
/// second SIGINT would interrupt the job's own clean-up.
fn sigint_not_passed_on(sender: i32) -> String {
    let from = if sender > 0 {
        format!("SIGINT from pid {sender}")
    } else {
        "SIGINT from a process".to_string()
    };
    // SAFETY: no arguments, no failure.
    let pgrp = unsafe { libc::getpgrp() };
    format!(
        "{from} reached gpuprof and is not passed on (a signal sent to the process group reaches the job too, and a second one would interrupt its clean-up): to interrupt the job, `kill -INT -{pgrp}` (the group, as Ctrl-C does); recording until the job exits (a second SIGINT stops recording now)"
    )
}

pub(crate) fn say(quiet: bool, msg: &str) {
    if !quiet {
        eprintln!("gpuprof: {msg}");
    }
}

async fn run(
    cfg: RecordConfig,
    (out, created, reserve): (OutDir, bool, Option<Reserve>),
    suspended: launch::Suspended,
    nvtx_plan: NvtxPlan,
    metrics: Option<std::net::TcpListener>,
    agent: &AgentPlan,
) -> Result<i32> {
    let mut sig = JobSignals::install()?;
    let header = make_header(&cfg, suspended.pid);
    // Live figures for the progress line, early warnings and --metrics-addr,
    // fed by the writer from the events it records.
    let live = crate::live::Live::new(cfg.warn_after + Duration::from_secs(5));
    let (sink, mut writer) = match record::start_writer(&out, Some(live.tap())) {
        Ok(x) => x,
        Err(e) => {
            suspended.abort();
            undo_output(&out, created, reserve);
            return Err(e);
        }
    };
    writer.hold_reserve(reserve);
    sink.send_blocking(Event::Header(header.clone()));
    let delayed = cfg.delay.is_some_and(|d| !d.is_zero());
    let mut cfg = cfg;
    if let Some(s) = cfg.stacks.as_mut() {
        s.hang_dir = Some(out.path().to_path_buf());
    }
    let (rec, mut nvtx) =
        match start_collectors(&cfg, sink, writer, suspended.pid, nvtx_plan, agent, delayed) {
            Ok(x) => x,
            Err(e) => {
                // The writer went with the failed start; the folder and the
                // child are ours to undo.
                suspended.abort();
                undo_output(&out, created, None);
                return Err(e);
            }
        };
    let job = match suspended.resume() {
        Ok(pid) => pid,
        Err(e) => {
            abandon(rec, nvtx, &out, created);
            eprintln!("gpuprof: {e}");
            return Ok(e.exit_code());
        }
    };
    let mut views = crate::live::Views::start(&live, out.path(), &cfg, metrics);
    let started = tokio::time::Instant::now();
    let window_start = started + cfg.delay.unwrap_or_default();
    let window_end = cfg.duration.map(|d| window_start + d);
    let mut recording = Some(rec);
    let mut interrupts = 0u32;
    let mut job_status: Option<JobStatus> = None;
    let mut stop_reason: Option<&str> = None;
    // Signals kept back from the job so far (see pass_on).
    let mut told = [false; WATCHED.len()];
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let far = started + Duration::from_secs(100 * 365 * 86400);

    loop {
        // Reap first: the SIGCHLD that ends the job may have arrived before
        // the select below was armed.
        let samplers_ref = recording.as_ref().map(|r| &r.samplers);
        if let Some(st) = reap(job, samplers_ref) {
            job_status = Some(st);
        }
        if job_status.is_some() {
            break;
        }
        let delay_pending = delayed
            && recording
                .as_ref()
                .is_some_and(|r| !r.samplers.active.load(Ordering::Acquire));
        tokio::select! {
            _ = sig.chld.recv() => {}
            _ = tick.tick(), if recording.is_some() && views.ticks() => views.tick(),
            _ = sig.int.recv() => {
                let sender = take_sender(Signal::SIGINT);
                interrupts += 1;
                if interrupts == 1 && sender == 0 {
                    say(cfg.quiet, "Ctrl-C went to the job; recording until it exits (Ctrl-C again stops recording now)");
                } else if interrupts == 1 {
                    say(cfg.quiet, &sigint_not_passed_on(sender));
                } else if recording.is_some() {
                    stop_reason = Some("interrupted");
                }
            }
            _ = sig.quit.recv() => {}
            _ = sig.term.recv() => pass_on(&cfg, job, Signal::SIGTERM, &mut told),
            _ = sig.hup.recv() => pass_on(&cfg, job, Signal::SIGHUP, &mut told),
            _ = sig.usr1.recv() => pass_on(&cfg, job, Signal::SIGUSR1, &mut told),
            _ = sig.usr2.recv() => pass_on(&cfg, job, Signal::SIGUSR2, &mut told),
            _ = tokio::time::sleep_until(window_start), if delay_pending => {
                if let Some(r) = recording.as_ref() {
                    open_window(r, &mut nvtx, cfg.quiet);
                }
            }
            _ = tokio::time::sleep_until(window_end.unwrap_or(far)), if window_end.is_some() && recording.is_some() => {
                stop_reason = Some("duration elapsed");
            }
        }
        if let Some(reason) = stop_reason.take() {
            if let Some(rec) = recording.take() {
                views.finish();
                finish_recording(
                    rec,
                    Some(&mut nvtx),
                    out.path(),
                    JobStatus::StillRunning,
                    reason,
                    cfg.quiet,
                    &cfg.outputs,
                );
                say(cfg.quiet, "recording stopped; the job keeps running and gpuprof will exit with its status");
            }
        }
    }
    let status = job_status.expect("loop ends with a status");
    views.finish();
    if let Some(rec) = recording.take() {
        finish_recording(
            rec,
            Some(&mut nvtx),
            out.path(),
            status,
            "job exited",
            cfg.quiet,
            &cfg.outputs,
        );
    }
    Ok(status.exit_code().unwrap_or(0))
}

/// The signals gpuprof handles while the job runs.
struct JobSignals {
    int: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
    chld: tokio::signal::unix::Signal,
}

impl JobSignals {
    /// Installed only after the fork: the job must inherit the dispositions
    /// gpuprof was started with (e.g. SIGHUP ignored under nohup), not
    /// gpuprof's own.
    fn install() -> Result<JobSignals> {
        let int = signal(SignalKind::interrupt())?;
        watch_senders();
        Ok(JobSignals {
            int,
            quit: signal(SignalKind::quit())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            usr1: signal(SignalKind::user_defined1())?,
            usr2: signal(SignalKind::user_defined2())?,
            chld: signal(SignalKind::child())?,
        })
    }
}

/// Start the collectors of a recording of `job` (forked, not yet exec'd)
/// into `sink`; with `delayed`, they wait for [`open_window`].
fn start_collectors(
    cfg: &RecordConfig,
    sink: Sink,
    writer: record::Writer,
    job: Pid,
    nvtx_plan: NvtxPlan,
    agent: &AgentPlan,
    delayed: bool,
) -> Result<(Recording, NvtxCollector)> {
    let samplers = SamplerThread::start(&sink, cfg.interval, !delayed, None)?;
    // The GPU thread starts before the job is released; it opens NVML on
    // its own time and takes the driver's samples from this moment on.
    let gpu = start_gpu(cfg, &sink)?;
    // Between fork and exec: perf events enabled by the job's exec.
    let stacks =
        StackCollectors::start(cfg.stacks.as_ref(), job, &sink, cfg.quiet, agent, !delayed);
    samplers.follow(stacks.news());
    // Lives until gpuprof exits: its ring folder must outlast the job's
    // use of it, even after a --duration window closed.
    let nvtx = NvtxCollector::start(nvtx_plan, &sink, !delayed);
    if !delayed {
        sink.send_blocking(Event::WindowStart { t: MonoNs::now() });
    }
    let rec = Recording {
        samplers,
        gpu,
        sink,
        writer,
        stacks,
    };
    Ok((rec, nvtx))
}

/// `--delay` elapsed: every collector starts recording.
fn open_window(r: &Recording, nvtx: &mut NvtxCollector, quiet: bool) {
    r.sink
        .send_blocking(Event::WindowStart { t: MonoNs::now() });
    r.samplers.active.store(true, Ordering::Release);
    r.stacks.set_active();
    nvtx.set_active();
    say(quiet, "--delay elapsed: recording started");
}

/// The job could not be started: stop the collectors and remove what
/// gpuprof put in the output folder.
fn abandon(rec: Recording, mut nvtx: NvtxCollector, out: &OutDir, created: bool) {
    let (sink, mut writer) = rec.stop_collectors(Some(&mut nvtx));
    drop(sink);
    let reserve = writer.take_reserve();
    drop(writer.finish());
    undo_output(out, created, reserve);
}

/// The GPU collector, unless `--no-gpu` (then a coverage entry says so).
pub(crate) fn start_gpu(cfg: &RecordConfig, sink: &Sink) -> Result<Option<GpuCollector>> {
    if cfg.no_gpu {
        sink.send_blocking(Event::Coverage(crate::event::Coverage {
            source: "gpu".into(),
            available: false,
            detail: "disabled with --no-gpu".into(),
        }));
        return Ok(None);
    }
    let opts = GpuOptions::from_env(cfg.gpu_interval);
    Ok(Some(
        GpuCollector::start(&opts, sink.clone(), cfg.quiet)
            .context("cannot start the GPU collector thread")?,
    ))
}

/// Reap every exited child (the job and reparented orphans); return the
/// job's status once it has exited.
fn reap(job: Pid, samplers: Option<&SamplerThread>) -> Option<JobStatus> {
    let mut job_status = None;
    loop {
        // WNOWAIT first: the zombie's /proc entry still holds its final CPU
        // and IO totals, which are read before it is reaped.
        let peek = waitid(
            Id::All,
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
        );
        let pid = match peek {
            Ok(WaitStatus::StillAlive) | Err(_) => break,
            Ok(ws) => match ws.pid() {
                Some(p) => p,
                None => break,
            },
        };
        if let Some(s) = samplers {
            s.with(|s| s.tree.final_sample(pid.as_raw()));
        }
        let status = match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(ws) => launch::job_status(ws),
            Err(_) => None,
        };
        if let Some(s) = samplers {
            s.with(|s| s.tree.reaped(pid.as_raw(), status));
        }
        if pid.as_raw() == job.0 {
            job_status = status;
        }
    }
    job_status
}

/// Everything that records while the window is open.
pub(crate) struct Recording {
    pub(crate) samplers: SamplerThread,
    pub(crate) gpu: Option<GpuCollector>,
    pub(crate) sink: Sink,
    /// Also holds the lock that marks the recording live for `gpuprof
    /// report` until the outputs are in, and the space kept for them.
    pub(crate) writer: record::Writer,
    pub(crate) stacks: StackCollectors,
}

impl Recording {
    /// Stop every collector (the last of their events are in the sink);
    /// the sink and the writer are left to the caller.
    fn stop_collectors(self, nvtx: Option<&mut NvtxCollector>) -> (Sink, record::Writer) {
        let Recording {
            mut samplers,
            gpu,
            sink,
            writer,
            stacks,
        } = self;
        // Every collector is told first and waited for after: each takes
        // its last pass (a driver poll, a ring drain, symbolizing) at the
        // same time, and the end of a run waits for the slowest, not the sum.
        if let Some(g) = &gpu {
            g.request_stop();
        }
        stacks.request_stop();
        if let Some(n) = &nvtx {
            n.request_stop();
        }
        if let Some(g) = gpu {
            g.stop();
        }
        samplers.finish();
        stacks.stop();
        if let Some(n) = nvtx {
            n.stop();
        }
        if let Some(c) = crate::collect::loss::coverage() {
            sink.send_blocking(Event::Coverage(c));
        }
        (sink, writer)
    }
}

/// Remove what gpuprof put in the output folder for a job that never ran.
pub(crate) fn undo_output(out: &OutDir, created: bool, reserve: Option<Reserve>) {
    drop(reserve);
    // Only what this run claimed: its `recording/` (see [`open_output`]).
    let _ = std::fs::remove_dir_all(out.path().join(record::RECORDING_DIR));
    if created {
        let _ = std::fs::remove_dir(out.path());
    }
}

/// `nvtx`: the NVTX reader, stopped here but kept by the caller (its ring
/// folder must outlast the job); None when attached to a running process.
pub(crate) fn finish_recording(
    rec: Recording,
    nvtx: Option<&mut NvtxCollector>,
    out: &Path,
    status: JobStatus,
    reason: &str,
    quiet: bool,
    outputs: &crate::outputs::OutputOptions,
) {
    let (sink, mut writer) = rec.stop_collectors(nvtx);
    let live = writer.take_live_lock();
    let reserve = writer.take_reserve();
    // The space kept for the end: the footer and the small outputs.
    drop(reserve);
    let (cpu_ns, max_rss) = crate::selfcost::self_usage();
    let mut footer = Footer {
        t: MonoNs::now(),
        status,
        reason: reason.into(),
        dropped_events: sink.dropped(),
        profiler_cpu_ns: cpu_ns,
        profiler_max_rss_bytes: max_rss,
        profiler_cpu_ns_by_component: crate::selfcost::by_component(),
        end_anchor: Some(ClockAnchor::now()),
        recording_error: None,
    };
    sink.send_blocking(Event::Footer(footer.clone()));
    drop(sink);
    let mut opts = GenerateOptions {
        session: true,
        outputs: outputs.clone(),
        ..Default::default()
    };
    let (finished, dir) = writer.finish();
    match finished {
        Ok(stats) => {
            footer.recording_error = stats.error;
        }
        Err(e) => opts
            .problems
            .push(format!("the recording could not be completed: {e:#}")),
    }
    opts.footer = Some(footer);
    let job = match status {
        JobStatus::Exited(c) => format!("the job exited with code {c}"),
        JobStatus::Signaled(s) => format!("the job was killed by signal {s}"),
        JobStatus::StillRunning => "the job is still running".into(),
        JobStatus::EndedUnknown => "the job ended".into(),
    };
    // The live lock goes with the outputs: released once they are in.
    match crate::outputs::generate_final(dir.path(), &dir, &opts, live) {
        Ok(outcome) => {
            if !quiet {
                eprint!("{}", outcome.terminal_summary);
            }
            if outcome.complete {
                if !quiet {
                    eprintln!("gpuprof: outputs in {}", out.display());
                }
            } else {
                // Said even with --quiet: the run looks fine otherwise.
                eprintln!(
                    "gpuprof: PROFILE INCOMPLETE ({job}; gpuprof exits with its status): what was written is in {}, report.json has \"complete\": false",
                    out.display()
                );
                for w in &outcome.analysis.warnings {
                    eprintln!("gpuprof:   {w}");
                }
            }
        }
        Err(e) => eprintln!(
            "gpuprof: PROFILE INCOMPLETE ({job}; gpuprof exits with its status): could not build the outputs from {}: {e:#}",
            out.display()
        ),
    }
}

/// One perf event per thread and CPU: a big job on a big machine needs more
/// descriptors than the usual soft limit of 1024.
pub(crate) fn raise_open_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::timeout_in_foreground;

    #[test]
    fn timeout_options_in_foreground() {
        let f = |args: &[&str]| {
            let v: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            timeout_in_foreground(&v)
        };
        assert!(f(&["--foreground", "10", "gpuprof"]));
        assert!(f(&["-s", "USR1", "--fore", "10", "gpuprof"]));
        assert!(f(&["--f", "--k", "5", "10", "gpuprof"]));
        assert!(f(&["--s", "TERM", "--f", "10", "gpuprof"]));
        assert!(f(&["--signal", "TERM", "-k", "5", "--foreground", "10"]));
        assert!(!f(&["10", "gpuprof", "--foreground"]));
        assert!(!f(&[
            "-s",
            "TERM",
            "10",
            "gpuprof",
            "--",
            "python",
            "--foreground"
        ]));
        assert!(!f(&["--signal=TERM", "-k5", "10", "gpuprof"]));
        assert!(!f(&["--", "--foreground"]));
    }
}
