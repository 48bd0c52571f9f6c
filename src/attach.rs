//! `gpuprof attach PID`: record a job that is already running, without
//! stopping, restarting or signalling it.
//!
//! What differs from a launched recording: the job is not gpuprof's child,
//! so Ctrl-C and SIGTERM stop the recording and never reach the job, and
//! its exit status goes to its own parent; perf events are opened on every
//! thread that runs (and inherited by what they create from then on); the
//! Python frames come from the non-blocking py-spy sampler only (nothing can
//! be placed inside a running interpreter); counters are measured from the
//! moment of attaching. Closing the perf events when recording stops
//! removes them from the job; nothing else is left in it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::signal::unix::{signal, SignalKind};

use crate::collect::stacks::StackCollectors;
use crate::config::RecordConfig;
use crate::event::{Attached, Event, JobStatus, MonoNs, Pid};
use crate::record;
use crate::session::{self, say, Recording, SamplerThread};

/// What gpuprof learned about the process before attaching.
struct Target {
    pid: Pid,
    start_ticks: u64,
    cmdline: Vec<String>,
    processes: u32,
    threads: u32,
    process_start: MonoNs,
}

/// Record the running process `cfg.attach` and its descendants; returns
/// gpuprof's exit code (0: the recording was made).
pub fn attach(cfg: RecordConfig) -> Result<i32> {
    let pid = cfg.attach.context("attach needs a PID")?;
    if cfg.delay.is_some() {
        bail!("--delay does not apply to `gpuprof attach`: attach when the recording should start (use --duration to end it)");
    }
    let target = check_target(pid)?;
    let metrics = crate::live::bind_metrics(&cfg)?;
    if cfg.stacks.is_some() {
        session::raise_open_file_limit();
    }
    let (out, created) = session::prepare_output(cfg.output.as_deref())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let r = rt.block_on(run(cfg, out.clone(), target, metrics));
    if r.is_err() && created {
        let _ = std::fs::remove_dir_all(&out);
    }
    r
}

/// Refuse, with the reason and what to do, a PID that cannot or should not
/// be recorded.
fn check_target(pid: Pid) -> Result<Target> {
    let me = std::process::id() as i32;
    if pid.0 == me {
        bail!("PID {pid} is gpuprof itself: give the PID of the training job");
    }
    let proc_ = procfs::process::Process::new(pid.0).map_err(|_| {
        anyhow::anyhow!(
            "no process {pid} here: it has exited, or it runs in another PID namespace (a container's PIDs differ from the host's: run gpuprof inside the job's container, or give the PID that `ps` shows where gpuprof runs)"
        )
    })?;
    let stat = proc_
        .stat()
        .map_err(|e| anyhow::anyhow!("cannot read /proc/{pid}/stat: {e}"))?;
    if matches!(stat.state, 'Z' | 'X') {
        bail!("process {pid} ({}) has already exited", stat.comm);
    }
    // PF_KTHREAD: a kernel thread has no user space to profile.
    if stat.flags & 0x0020_0000 != 0 {
        bail!("PID {pid} ({}) is a kernel thread, not a job: give the PID of the training job's process", stat.comm);
    }
    // Recording an ancestor would record gpuprof (and the shell around it)
    // too; with PID 1 it is every process of the machine. Usually the PID
    // was taken from another PID namespace.
    let mut up = nix::unistd::getppid().as_raw();
    for _ in 0..4096 {
        if up == pid.0 {
            bail!(
                "PID {pid} ({}) is an ancestor of gpuprof itself, so recording it would record gpuprof and everything around it: give the training job's PID (e.g. `pgrep -f train.py`); if the job runs in a container, its PID there differs from its PID here (`docker top CONTAINER`)",
                stat.comm
            );
        }
        if up <= 1 {
            break;
        }
        up = procfs::process::Process::new(up)
            .and_then(|p| p.stat())
            .map(|s| s.ppid)
            .unwrap_or(0);
    }
    let uid = proc_.uid().unwrap_or(u32::MAX);
    let euid = nix::unistd::geteuid().as_raw();
    let readable = proc_.environ().is_ok();
    if (euid != 0 && uid != euid) || !readable {
        let owner = user_name(uid);
        bail!(
            "cannot attach to PID {pid} ({}, owned by {owner}): permission denied; run gpuprof as {owner} or as root (`sudo gpuprof attach {pid}`)",
            stat.comm
        );
    }
    let cmdline = proc_.cmdline().unwrap_or_default();
    let mut processes = 1u32;
    let mut threads = stat.num_threads.max(0) as u32;
    for d in crate::collect::python::descendants(pid.0) {
        if let Ok(s) = procfs::process::Process::new(d).and_then(|p| p.stat()) {
            processes += 1;
            threads += s.num_threads.max(0) as u32;
        }
    }
    let process_start = crate::collect::procfs::start_mono(stat.starttime);
    Ok(Target {
        pid,
        start_ticks: stat.starttime,
        cmdline,
        processes,
        threads,
        process_start,
    })
}

fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| format!("uid {uid}"))
}

/// Whether the process attached to still runs (same PID, same start).
fn alive(t: &Target) -> bool {
    match procfs::process::Process::new(t.pid.0).and_then(|p| p.stat()) {
        Ok(s) => s.starttime == t.start_ticks && !matches!(s.state, 'Z' | 'X'),
        Err(_) => false,
    }
}

async fn run(
    cfg: RecordConfig,
    out: PathBuf,
    target: Target,
    metrics: Option<std::net::TcpListener>,
) -> Result<i32> {
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;

    let mut header = session::make_header(&cfg, target.pid);
    header.command = target.cmdline.clone();
    header.attached = Some(Attached {
        process_start: target.process_start,
        processes: target.processes,
        threads: target.threads,
    });
    let live = crate::live::Live::new(cfg.warn_after + Duration::from_secs(5));
    let (sink, writer) = record::start_writer_with_tap(&out, Some(live.tap()))?;
    sink.send_blocking(Event::Header(header));
    // The window opens before the first sample: the analysis then takes
    // each running process's first sample as its baseline, so counters
    // cover the window, not the time since the process started.
    sink.send_blocking(Event::WindowStart { t: MonoNs::now() });
    let samplers = SamplerThread::start(&sink, cfg.interval, true, Some(target.pid))?;
    let gpu = session::start_gpu(&cfg, &sink)?;
    let mut perf = cfg.stacks.clone();
    if let Some(s) = perf.as_mut() {
        s.hang_dir = Some(out.clone());
    }
    let stacks = StackCollectors::start_attached(perf.as_ref(), target.pid, &sink, cfg.quiet);
    samplers.follow(stacks.news());
    sink.send_blocking(Event::Coverage(crate::event::Coverage {
        source: crate::vocab::coverage::NVTX.into(),
        available: false,
        detail: "not captured: NVTX is captured only for jobs gpuprof launches (NVTX_INJECTION64_PATH must be set when the job starts)".into(),
    }));
    say(
        cfg.quiet,
        &format!(
            "attached to PID {} ({} process(es), {} threads); Ctrl-C stops recording (the job keeps running)",
            target.pid, target.processes, target.threads
        ),
    );
    let rec = Recording {
        samplers,
        gpu,
        sink,
        writer,
        stacks,
    };
    let started = tokio::time::Instant::now();
    let end = cfg.duration.map(|d| started + d);
    let far = started + Duration::from_secs(100 * 365 * 86400);
    let mut views = crate::live::Views::start(&live, &out, &cfg, metrics);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let (status, reason) = loop {
        tokio::select! {
            _ = tick.tick() => {
                if !alive(&target) {
                    break (JobStatus::EndedUnknown, "job exited");
                }
                views.tick();
            }
            _ = sigint.recv() => break (JobStatus::StillRunning, "interrupted"),
            _ = sigterm.recv() => break (JobStatus::StillRunning, "interrupted"),
            _ = sighup.recv() => break (JobStatus::StillRunning, "interrupted"),
            _ = tokio::time::sleep_until(end.unwrap_or(far)), if end.is_some() => {
                break (JobStatus::StillRunning, "duration elapsed");
            }
        }
    };
    views.finish();
    session::finish_recording(rec, None, &out, status, reason, cfg.quiet, &cfg.outputs);
    if status == JobStatus::StillRunning {
        say(cfg.quiet, "detached; the job keeps running");
    }
    Ok(0)
}
