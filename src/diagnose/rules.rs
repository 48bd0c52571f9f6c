//! The rules: one function per finding (or pair of findings that share
//! their evidence), each a pure function of the analysis, the timeline and
//! the optional GPU/stack evidence.

use std::collections::BTreeSet;

use crate::analysis::environment::is_network_fs;
use crate::analysis::{Analysis, Role};
use crate::units::{bytes as mb, pct, plural};

use super::evidence::{GpuDeviceEvidence, GpuEvidence, StackEvidence, ThrottleEvidence};
use super::measure::{concurrent_workers, gpu_gap_lines, gpu_time, measured_devices, Scope};
use super::rule::CauseRule;
use super::thresholds as th;
use super::timeline::{Cause, InputThread, Timeline};
use super::{accounting, causes};
use super::{Basis, Finding, FindingKind, GpuTime, Severity};

/// One scope per rank when the job has two ranks or more, else one for the
/// whole job.
pub fn scopes(a: &Analysis, gpu: Option<&GpuEvidence>) -> Vec<Scope> {
    if !a.multi_rank() {
        return vec![Scope {
            rank: None,
            tl: Timeline::build(a),
            gpu: gpu.cloned(),
        }];
    }
    a.ranks()
        .into_iter()
        .map(|r| {
            let pids: BTreeSet<_> = a
                .processes
                .values()
                .filter(|p| p.rank == Some(r))
                .map(|p| p.pid)
                .collect();
            Scope {
                rank: Some(r),
                tl: Timeline::build_scoped(a, Some(r)),
                gpu: gpu.and_then(|g| g.for_pids(&pids)),
            }
        })
        .collect()
}

/// Every rule. `tl` is the whole job's timeline; the input-side rules run
/// once per scope.
pub fn all(
    a: &Analysis,
    tl: &Timeline,
    scopes: &[Scope],
    gpu: Option<&GpuEvidence>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for sc in scopes {
        let g = sc.gpu.as_ref();
        let mut found = Vec::new();
        found.extend(io_bound(a, &sc.tl, g));
        found.extend(causes::write_stall(a, &sc.tl, g));
        found.extend(causes::worker_restarts(a, &sc.tl, g));
        found.extend(main_preprocessing(a, &sc.tl, g));
        found.extend(pipeline(a, &sc.tl, g));
        found.extend(causes::training_loop(a, &sc.tl, g));
        found.extend(super::compile::compilation(a, &sc.tl, g));
        scope_titles(&mut found, sc.rank);
        out.extend(found);
    }
    let io = out
        .iter()
        .filter(|f| f.kind == FindingKind::IoBound)
        .max_by(|x, y| x.rank_key().0.total_cmp(&y.rank_key().0))
        .cloned();
    out.extend(slow_storage(a, tl, io.as_ref()));
    out.extend(oversubscribed(a, tl, gpu));
    out.extend(super::others::other_programs(a));
    out.extend(causes::cpu_limit(a, tl, gpu));
    out.extend(causes::host_memory(a, tl, gpu));
    if let Some(g) = gpu {
        out.extend(gpu_not_used(a, g));
        out.extend(cuda_mismatch(a, g));
        out.extend(throttling(a, g));
        out.extend(memory_pressure(a, g));
        out.extend(pcie(g));
    }
    out
}

/// The unexplained-idle findings of every scope, given all other findings.
pub fn unexplained(a: &Analysis, scopes: &[Scope], findings: &[Finding]) -> Vec<Finding> {
    let mut out = Vec::new();
    for sc in scopes {
        let mut f: Vec<Finding> = accounting::unexplained(a, sc, findings)
            .into_iter()
            .collect();
        scope_titles(&mut f, sc.rank);
        out.extend(f);
    }
    out
}

/// Per-rank findings say which rank: "Rank 1: the input pipeline …" (but
/// "Rank 1: IO-bound …").
fn scope_titles(found: &mut [Finding], rank: Option<u32>) {
    let Some(r) = rank else { return };
    for f in found {
        f.rank = Some(r);
        let mut cs = f.title.chars();
        let title = match (cs.next(), cs.next()) {
            (Some(a), Some(b)) if b.is_lowercase() => {
                format!("{}{b}{}", a.to_lowercase(), cs.as_str())
            }
            _ => f.title.clone(),
        };
        f.title = format!("Rank {r}: {title}");
    }
}

/// The coverage finding (what was not measured).
pub fn coverage_finding(
    a: &Analysis,
    gpu: Option<&GpuEvidence>,
    stacks: Option<&StackEvidence>,
) -> Option<Finding> {
    coverage(a, gpu, stacks)
}

/// Start-up and shutdown idle time per measured GPU, for the notes.
pub fn edge_gap_notes(a: &Analysis, tl: &Timeline, g: &GpuEvidence) -> Vec<String> {
    measured_devices(Some(g))
        .iter()
        .filter_map(|d| {
            let s = d.idle_split(a.start, a.end);
            // The loop's first compile comes before its first kernel: that
            // part of the start-up is the compilation finding's.
            let compiling = d
                .phases(a.start, a.end)
                .startup
                .map(|w| {
                    tl.idle_by_cause(&d.idle, w)
                        .iter()
                        .filter(|(c, _)| *c == Some(Cause::Compiling))
                        .map(|(_, s)| s)
                        .sum::<f64>()
                })
                .filter(|c| *c >= 0.05);
            let (during, who) = match compiling {
                Some(c) => (
                    format!("; the loop compiling the model {c:.1} s of it"),
                    "the other findings (compilation counts its compile)",
                ),
                None => (String::new(), "findings"),
            };
            (s.startup_s + s.shutdown_s >= th::EDGE_IDLE_NOTE_S).then(|| {
                format!(
                    "GPU {} was idle {:.1} s before its first work (start-up: imports, model build, workers starting{during}) and {:.1} s after its last (shutdown); {who} attribute only the idle time in between.",
                    d.index, s.startup_s, s.shutdown_s
                )
            })
        })
        .collect()
}

pub(super) fn describe_threads(ths: &[InputThread]) -> String {
    let mut names: Vec<String> = ths
        .iter()
        .map(|t| format!("`{}`", t.name))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    names.truncate(3);
    format!(
        "{} ({})",
        plural(ths.len(), "input thread"),
        names.join(", ")
    )
}

fn io_bound(a: &Analysis, tl: &Timeline, gpu: Option<&GpuEvidence>) -> Option<Finding> {
    let dur = a.duration_s();
    let io_s = tl.cause_s(Cause::Io);
    if dur <= 0.0 || io_s < th::MIN_SHARE * dur {
        return None;
    }
    let spans = tl.spans(Cause::Io);
    let s = &a.system;
    let inputs: &[InputThread] = if tl.workers.is_empty() {
        &tl.mains
    } else {
        &tl.workers
    };
    let d_share =
        inputs.iter().map(|t| t.state_share('D')).sum::<f64>() / inputs.len().max(1) as f64;
    let mut ev = vec![format!(
        "The {} were blocked in D state (uninterruptible, waiting for storage) {} of their time; for {:.1} s ({} of the run) most of them were.",
        describe_threads(inputs),
        pct(d_share),
        io_s,
        pct(io_s / dur)
    )];
    let mut sys = Vec::new();
    if let Some(w) = Timeline::mean_over(&s.iowait, &spans) {
        sys.push(format!("iowait {w:.0}% of all CPU time"));
    }
    if let Some(p) = Timeline::mean_over(&s.psi_io.some, &spans) {
        sys.push(format!("IO pressure {p:.0}% (some task stalled on IO)"));
    }
    if !sys.is_empty() {
        ev.push(format!("Meanwhile: {}.", sys.join(", ")));
    }
    let pids = tl.input_pids();
    let read_bps: f64 = a
        .processes
        .values()
        .filter(|p| pids.contains(&p.pid))
        .filter_map(|p| Timeline::mean_over(&p.read_bps, &spans))
        .sum();
    let write_bps: f64 = a
        .processes
        .values()
        .filter(|p| pids.contains(&p.pid))
        .filter_map(|p| Timeline::mean_over(&p.write_bps, &spans))
        .sum();
    let read_total: u64 = a.processes.values().map(|p| p.read_bytes).sum();
    ev.push(format!(
        "The job read {} from storage in all; while blocked its input processes read {}/s and wrote {}/s.",
        mb(read_total as f64),
        mb(read_bps),
        mb(write_bps)
    ));
    let mut busiest_disk = 0.0f64;
    for d in s.disks.values().filter(|d| d.read_bytes > 0) {
        let busy = Timeline::mean_over(&d.busy, &spans).unwrap_or(0.0);
        let rd = Timeline::mean_over(&d.read_bps, &spans).unwrap_or(0.0);
        if busy < 1.0 && rd < 1e5 {
            continue;
        }
        busiest_disk = busiest_disk.max(busy);
        ev.push(format!(
            "Disk {}: busy {busy:.0}% of the time, reading {}/s.",
            d.name,
            mb(rd)
        ));
    }
    ev.extend(causes::page_cache_thrash(a, tl));
    let mut throttled_hint = false;
    if busiest_disk < th::DISK_BUSY_PCT {
        throttled_hint = true;
        ev.push(
            "No disk was even half busy while the reads waited: the wait is likely an IO limit \
             (cgroup io.max / blkio throttle, a cloud volume's throughput or IOPS cap) or a \
             network filesystem."
                .to_string(),
        );
    }
    for f in a.env.files_by_mount(&pids).into_iter().take(3) {
        if let Some(m) = f.mount {
            ev.push(format!(
                "Data files such as `{}` are on {} ({}{}).",
                f.example,
                m.mount_point,
                m.fs_type,
                m.disk
                    .as_ref()
                    .map(|d| format!(" on {d}"))
                    .unwrap_or_default()
            ));
        }
    }
    ev.extend(gpu_gap_lines(
        a,
        tl,
        gpu,
        Cause::Io,
        "the input threads were blocked on IO",
    ));
    ev.extend(causes::cause_stack_line(
        a,
        tl,
        &causes::pids_of(inputs),
        Cause::Io,
        "input threads while they waited for storage",
    ));
    let gt = gpu_time(
        a,
        tl,
        gpu,
        Cause::Io,
        tl.weighted_s(Cause::Io, |_| 1.0),
        "time most input threads were blocked waiting for storage (nothing was being prepared for the GPU)",
    );
    let mem = a.system.mem_total as f64;
    let mut fix = format!(
        "Feed the GPU from faster storage: copy the dataset to local NVMe, or keep it in the page cache when it fits (this machine has {} of RAM); pack many small files into large preprocessed shards (WebDataset, TFRecord, LMDB) read sequentially; overlap reads with more DataLoader workers or a larger `prefetch_factor`.",
        mb(mem)
    );
    if throttled_hint {
        fix.push_str(" Check for an IO limit on the job's cgroup or volume.");
    }
    Some(
        CauseRule::costing(
            FindingKind::IoBound,
            gt,
            format!(
                "IO-bound: the input threads waited for storage reads {} of the run",
                pct(io_s / dur)
            ),
            ev,
            fix,
        )
        .finding(),
    )
}

fn slow_storage(a: &Analysis, tl: &Timeline, io: Option<&Finding>) -> Option<Finding> {
    let mut pids: BTreeSet<_> = tl.input_pids();
    pids.extend(tl.mains.iter().map(|t| t.pid));
    let mut ev = Vec::new();
    let mut kinds = Vec::new();
    for f in a.env.files_by_mount(&pids) {
        let Some(m) = f.mount else { continue };
        if f.bytes < th::DATASET_MIN_BYTES && f.files < th::DATASET_MIN_FILES {
            continue;
        }
        if is_network_fs(&m.fs_type) {
            ev.push(format!(
                "The job read {} ({}) such as `{}` from {} on {}, a network filesystem ({}).",
                plural(f.files, "file"),
                mb(f.bytes as f64),
                f.example,
                m.source,
                m.mount_point,
                m.fs_type
            ));
            kinds.push("network filesystem");
        } else if m.rotational == Some(true) {
            let disk = m.disk.clone().unwrap_or_default();
            let read = a.system.disks.get(&disk).map_or(0, |d| d.read_bytes);
            if read >= th::SLOW_STORAGE_MIN_READ_BYTES {
                ev.push(format!(
                    "The job read {} ({}) such as `{}` from {} ({}, on {disk}, which the kernel reports as rotational, i.e. a spinning disk); {disk} served {} of reads during the run (all processes).",
                    plural(f.files, "file"),
                    mb(f.bytes as f64),
                    f.example,
                    m.mount_point,
                    m.fs_type,
                    mb(read as f64)
                ));
                kinds.push("rotational disk");
            }
        }
    }
    if ev.is_empty() {
        return None;
    }
    kinds.dedup();
    let (severity, gpu_time) = match io {
        Some(io) => {
            ev.push(
                "The input threads were IO-bound (see io-bound): this storage is the likely cause."
                    .into(),
            );
            (io.severity, io.gpu_time.clone())
        }
        None => {
            ev.push("The job did not wait on IO in this run: no GPU time is lost to it yet (larger datasets or a cold page cache would).".into());
            (Severity::Info, None)
        }
    };
    Some(CauseRule {
        kind: FindingKind::SlowStorage,
        severity,
        title: format!("Training data is read from a {}", kinds.join(" and a ")),
        gpu_time,
        evidence: ev,
        fix: "Copy the dataset to a local SSD/NVMe before training (or to /dev/shm when it fits in RAM), or convert it into large sequentially-read shards; on a network filesystem, cache it locally on first read.".into(),
    }.finding())
}

fn main_preprocessing(a: &Analysis, tl: &Timeline, gpu: Option<&GpuEvidence>) -> Option<Finding> {
    let dur = a.duration_s();
    let busy_s = tl.cause_s(Cause::MainPreprocessing);
    if !tl.workers.is_empty() || dur <= 0.0 || busy_s < th::MIN_SHARE * dur {
        return None;
    }
    let main = tl.mains.iter().max_by(|x, y| x.cpu_s.total_cmp(&y.cpu_s))?;
    // What the main thread's own samples say it did then (the timeline
    // gave these bins to the model instead when they show more model
    // than data: see `account::ground`).
    let acc =
        super::account::main_account(a, tl, |i| tl.cause[i] == Some(Cause::MainPreprocessing));
    let mut ev = vec![
        "The job has no input worker processes (DataLoader `num_workers=0`, or batches built in the training loop).".to_string(),
        format!(
            "Its main thread `{}` (pid {}) used {} of a core over its life ({:.1} s of CPU in {:.1} s) and was computing for {:.1} s ({} of the run).",
            main.name,
            main.pid,
            pct(main.cpu_share()),
            main.cpu_s,
            main.life_s,
            busy_s,
            pct(busy_s / dur)
        ),
    ];
    if acc.conclusive() {
        ev.push(format!(
            "Its stack samples while computing: {}.",
            acc.text()
        ));
    } else {
        ev.push(format!(
            "Too few stack samples of the main thread while it computed ({}, at least {} needed) to tell batch preparation from the model: the whole computing time is counted.",
            acc.samples,
            th::ACCOUNT_MIN_SAMPLES
        ));
    }
    ev.extend(gpu_gap_lines(
        a,
        tl,
        gpu,
        Cause::MainPreprocessing,
        "the main thread was computing",
    ));
    ev.extend(causes::cause_stack_line(
        a,
        tl,
        &causes::pids_of(&tl.mains),
        Cause::MainPreprocessing,
        "main process while its main thread was computing",
    ));
    // Only the data path's share of the computing time moves to workers.
    let data = if acc.conclusive() {
        acc.data_share
    } else {
        1.0
    };
    let est = data * tl.weighted_s(Cause::MainPreprocessing, |i| tl.main_cpu[i] as f64);
    let method = if acc.conclusive() {
        format!(
            "upper bound: the main thread's computing time × the data path's share of its stack samples then ({}); a loop that prepares each batch in the main process leaves the GPU waiting meanwhile",
            pct(data)
        )
    } else {
        "upper bound: the main thread's computing time; a loop that prepares each batch in the main process leaves the GPU waiting meanwhile".to_string()
    };
    let gt = gpu_time(a, tl, gpu, Cause::MainPreprocessing, est, &method);
    let cores = a.system.cpus.max(1);
    let n = (cores.saturating_sub(1)).clamp(1, 8);
    let mut fix = format!(
        "Move batch preparation into DataLoader worker processes: `DataLoader(..., num_workers={n}, pin_memory=True)` ({cores} cores here, one left for the main process), so the main process only launches GPU work."
    );
    if acc.conclusive() && acc.model_share >= th::ACCOUNT_SECOND_SHARE {
        fix.push_str(&format!(
            " The model itself took {} of the main thread's samples: workers do not take that part off it.",
            pct(acc.model_share)
        ));
    }
    if super::ran_on_cpu(a, gpu) {
        ev.push(format!(
            "{}: the framework computed the model on the CPU as well, in this same thread.",
            super::NO_DRIVER_EVIDENCE
        ));
        fix.push_str(" Nothing ran on a GPU in this run: on a machine with one, check that `torch.cuda.is_available()` is True and move the model and batches to it (`model.to(\"cuda\")`).");
    }
    let title = if acc.conclusive() {
        format!(
            "Batches are prepared in the main process: its main thread was busy {} of the run, {} of it in the data path",
            pct(busy_s / dur),
            pct(acc.data_share)
        )
    } else {
        format!(
            "Batches are prepared in the main process: its main thread was busy {} of the run",
            pct(busy_s / dur)
        )
    };
    Some(CauseRule::costing(FindingKind::MainProcessPreprocessing, gt, title, ev, fix).finding())
}

/// Saturated workers starved of CPU by other programs.
struct Starved {
    /// How much faster they would make batches with all their runnable time.
    speedup: f64,
    /// The loop's share of time waiting (not runnable).
    loop_waits: f64,
    /// Whether the loop would still wait for them then.
    still_bound: bool,
}

/// Saturated by waiting: runnable throughout (`r`) but given less than
/// half of it (`cpu`), while other programs used more of the machine than
/// the job. Given all their runnable time, the workers would make batches
/// r/cpu times as fast; the loop, waiting (not runnable) a share w of its
/// time, would still wait for them if w > 1 - cpu/r. Then the pipeline
/// stays a cause beside the CPU others took (a worker too slow on a free
/// machine is still too slow); else that CPU is the cause
/// (cpu-taken-by-other-programs names it and costs the GPU time), not what
/// a batch costs.
fn starved(
    a: &Analysis,
    tl: &Timeline,
    (r, cpu): (f64, f64),
    others_more: bool,
) -> Option<Starved> {
    if !(cpu < th::STARVED_CPU_OF_RUNNABLE * r && others_more && super::others::names_any(a)) {
        return None;
    }
    let loop_waits = 1.0
        - tl.mean_of(Cause::PipelineSaturated, &tl.main_r)
            .unwrap_or(1.0);
    let speedup = r / cpu.max(1e-3);
    Some(Starved {
        speedup,
        loop_waits,
        still_bound: loop_waits > 1.0 - 1.0 / speedup,
    })
}

fn pipeline(a: &Analysis, tl: &Timeline, gpu: Option<&GpuEvidence>) -> Option<Finding> {
    let dur = a.duration_s();
    let sat_s = tl.cause_s(Cause::PipelineSaturated);
    if tl.workers.is_empty() || dur <= 0.0 || sat_s < th::MIN_SHARE * dur {
        return None;
    }
    let cores = tl.cores;
    let idle = tl
        .mean_of(Cause::PipelineSaturated, &tl.sys_busy)
        .map(|b| cores * (1.0 - b))
        .unwrap_or(0.0)
        .max(0.0);
    let n = concurrent_workers(tl);
    let r = tl.workers.iter().map(|w| w.state_share('R')).sum::<f64>() / tl.workers.len() as f64;
    let cpu = tl.workers.iter().map(|w| w.cpu_share()).sum::<f64>() / tl.workers.len() as f64;
    let main_cpu = tl
        .mean_of(Cause::PipelineSaturated, &tl.main_cpu)
        .unwrap_or(0.0);
    // Who used the CPU while the workers were saturated: the job, or
    // other programs on the machine competing with it.
    let spans = tl.spans(Cause::PipelineSaturated);
    let job_cores: f64 = a
        .processes
        .values()
        .filter_map(|p| Timeline::mean_over(&p.cpu, &spans))
        .sum();
    let busy_cores = cores - idle;
    let others = (busy_cores - job_cores).max(0.0);
    // The figures of the saturated intervals themselves: the whole run's
    // would set "saturated" beside workers that were idle most of it.
    let r_sat = tl
        .mean_of(Cause::PipelineSaturated, &tl.workers_r)
        .unwrap_or(0.0);
    let cpu_sat = tl
        .mean_of(Cause::PipelineSaturated, &tl.workers_cpu)
        .unwrap_or(0.0);
    let starved = starved(a, tl, (r_sat, cpu_sat), others > job_cores);
    if starved.as_ref().is_some_and(|s| !s.still_bound) {
        return None;
    }
    let mut ev = vec![
        format!(
            "{} {} saturated for {:.1} s ({} of the run): in that time running or waiting for a CPU {} of it and using {} of a core each (over the whole run: {} and {}).",
            plural(n, "input worker process"),
            if n == 1 { "was" } else { "were" },
            sat_s,
            pct(sat_s / dur),
            pct(r_sat),
            pct(cpu_sat),
            pct(r),
            pct(cpu)
        ),
        format!(
            "While they were saturated, {idle:.1} of {cores:.0} cores were idle and the main thread used {} of a core (it was waiting).",
            pct(main_cpu)
        ),
    ];
    if let Some(s) = starved {
        ev.push(format!(
            "Other programs took most of the workers' CPU (see cpu-taken-by-other-programs): given all the time they were runnable, they would make batches {:.1}× as fast, and the loop, waiting {} of its time, would still wait for them.",
            s.speedup,
            pct(s.loop_waits)
        ));
    } else if others >= th::OTHER_PROGRAMS_CORES {
        ev.push(format!(
            "Meanwhile the job used {job_cores:.1} cores and other programs on this machine {others:.1}: they compete with the workers for CPU."
        ));
    }
    ev.extend(gpu_gap_lines(
        a,
        tl,
        gpu,
        Cause::PipelineSaturated,
        "the workers were saturated",
    ));
    ev.extend(causes::cause_stack_line(
        a,
        tl,
        &causes::pids_of(&tl.workers),
        Cause::PipelineSaturated,
        "workers while they were saturated",
    ));
    let est = tl.weighted_s(Cause::PipelineSaturated, |i| {
        let m = tl.main_cpu[i];
        1.0 - if m.is_nan() { 0.0 } else { m as f64 }
    });
    let method = "upper bound: time the workers were saturated while the main thread was not computing (it waited for a batch, or for the GPU)";
    // Idle cores vary from interval to interval: too-few-workers only when
    // the lower end of their mean's 95% interval clears the threshold, so
    // that a machine near it does not flip the finding run to run (the
    // pipeline that cannot keep up is true either way).
    let idle_low = idle_cores_low(tl, cores);
    let too_few = idle_low >= th::IDLE_CORES_FOR_MORE_WORKERS;
    if !too_few && idle >= th::IDLE_CORES_FOR_MORE_WORKERS {
        ev.push(format!(
            "{idle:.1} cores were idle on average, but too unevenly to be sure another worker would get most of one (95% interval of the mean from {idle_low:.1} cores)."
        ));
    }
    let (kind, gt) = if too_few {
        (
            FindingKind::TooFewWorkers,
            gpu_time(a, tl, gpu, Cause::PipelineSaturated, est, method),
        )
    } else {
        (
            FindingKind::InputPipelineBound,
            gpu_time(a, tl, gpu, Cause::PipelineSaturated, est, method),
        )
    };
    let (title, fix) = if too_few {
        let more = ((idle + 0.25).floor() as usize).max(1);
        let suggested = (n + more).min(cores as usize).max(n + 1);
        (
            format!("Too few input workers: all {n} were saturated while {idle:.1} cores sat idle"),
            format!(
                "Raise `num_workers` from {n} to {suggested}: {idle:.1} of {cores:.0} cores were idle while the workers were saturated. If that is not enough, make each batch cheaper (offline preprocessing, cheaper augmentation)."
            ),
        )
    } else {
        (
            format!(
                "The input pipeline cannot keep up: its {} saturated{}",
                if n == 1 { "worker is".to_string() } else { format!("{n} workers are") },
                if idle >= th::IDLE_CORES_FOR_MORE_WORKERS { "" } else { " and no core is idle" }
            ),
            format!("{}Make each batch cheaper: preprocess once offline (store decoded/resized data), use cheaper augmentation or run it on the GPU (e.g. NVIDIA DALI, torchvision transforms on GPU tensors), or use a machine with more CPU cores per GPU. `pin_memory=True` and a larger `prefetch_factor` only smooth bursts.", if others >= th::OTHER_PROGRAMS_CORES { format!("Other programs took {others:.1} cores: run the job where it has the CPUs to itself, or stop them. ") } else { String::new() }),
        )
    };
    Some(CauseRule::costing(kind, gt, title, ev, fix).finding())
}

/// The lower end of the 95% interval of the mean idle cores over the
/// saturated intervals (each interval one observation).
fn idle_cores_low(tl: &Timeline, cores: f64) -> f64 {
    let v: Vec<f64> = tl
        .bins_of(Cause::PipelineSaturated)
        .filter(|&i| !tl.sys_busy[i].is_nan())
        .map(|i| (cores * (1.0 - tl.sys_busy[i] as f64)).max(0.0))
        .collect();
    let k = v.len() as f64;
    if k < 2.0 {
        return 0.0;
    }
    let mean = v.iter().sum::<f64>() / k;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (k - 1.0);
    mean - th::SHARE_CONFIDENCE_Z * (var / k).sqrt()
}

fn oversubscribed(a: &Analysis, tl: &Timeline, gpu: Option<&GpuEvidence>) -> Option<Finding> {
    let dur = a.duration_s();
    let os = tl.cause_s(Cause::Oversubscribed);
    if dur <= 0.0 || os < th::MIN_SHARE * dur {
        return None;
    }
    let runnable = tl
        .mean_of(Cause::Oversubscribed, &tl.job_runnable)
        .unwrap_or(0.0);
    let mut ev = vec![format!(
        "For {os:.1} s ({} of the run) the job had {runnable:.1} threads running or waiting for a CPU on average, on {:.0} cores.",
        pct(os / dur),
        tl.cores
    )];
    if let Some(p) = tl.mean_of(Cause::Oversubscribed, &tl.psi_cpu) {
        ev.push(format!(
            "CPU pressure: some task was waiting for a CPU {} of that time.",
            pct(p)
        ));
    }
    // Who was runnable: many processes with one busy thread each (more
    // workers than cores) or few processes with many (thread pools).
    let spans = tl.spans(Cause::Oversubscribed);
    let busy: Vec<(f64, usize, Role)> = a
        .processes
        .values()
        .map(|p| {
            let r: f64 = p
                .threads
                .values()
                .map(|t| runs_in_spans(&t.state_runs, 'R', &spans))
                .sum();
            (r / os, p.threads.len(), p.role)
        })
        .filter(|(r, _, _)| *r >= th::OVERSUBSCRIBED_BUSY_PROCESS_RUNNABLE)
        .collect();
    let busy_procs = busy.len().max(1);
    let per_proc = runnable / busy_procs as f64;
    let pools = per_proc >= th::THREAD_POOL_RUNNABLE_PER_PROCESS;
    let max_threads = busy.iter().map(|b| b.1).max().unwrap_or(0);
    ev.push(format!(
        "{} had runnable threads then, {per_proc:.1} each on average; the largest has {max_threads} threads.",
        plural(busy_procs, "process")
    ));
    let workers = concurrent_workers(tl);
    ev.extend(gpu_gap_lines(
        a,
        tl,
        gpu,
        Cause::Oversubscribed,
        "the CPU was oversubscribed",
    ));
    let est = tl.weighted_s(Cause::Oversubscribed, |i| {
        let p = tl.psi_cpu[i];
        if p.is_nan() {
            1.0 - tl.cores / (tl.job_runnable[i] as f64).max(tl.cores)
        } else {
            p as f64
        }
    });
    let gt = gpu_time(
        a,
        tl,
        gpu,
        Cause::Oversubscribed,
        est,
        "time some task of the machine waited for a CPU while the job's runnable threads far exceeded the cores",
    );
    Some(
        CauseRule::costing(
            FindingKind::CpuOversubscribed,
            gt,
            format!(
                "CPU oversubscribed: {runnable:.1} runnable threads for {:.0} cores",
                tl.cores
            ),
            ev,
            if pools {
                format!(
                    "Cap the threads per process so that all of them fit the {:.0} cores: thread pools (OpenMP/MKL/BLAS, the framework's intra-op threads) multiply with the worker count. Set `OMP_NUM_THREADS=1` (and `MKL_NUM_THREADS=1`) for DataLoader workers, `torch.set_num_threads(k)` in the main process, and keep `num_workers` no higher than the cores left.",
                    tl.cores
                )
            } else {
                format!(
                    "More busy processes than cores: lower `num_workers` from {workers} to at most {} (one core left for the main process, so it can launch GPU work promptly). The CPU itself is then the limit: make each batch cheaper or use more cores per GPU.",
                    (tl.cores as usize).saturating_sub(1).max(1)
                )
            },
        )
        .finding(),
    )
}

/// Seconds of `state` runs falling inside `spans` (both sorted by time).
pub(super) fn runs_in_spans(
    runs: &[crate::analysis::StateRun],
    state: char,
    spans: &[(crate::event::MonoNs, crate::event::MonoNs)],
) -> f64 {
    let mut total = 0.0;
    for run in runs {
        // A merged run (long recordings) holds the state for a share of it.
        let share = run.share(state);
        if share <= 0.0 {
            continue;
        }
        let (a, b) = (run.from, run.to);
        let first = spans.partition_point(|sp| sp.1 <= a);
        for sp in &spans[first..] {
            if sp.0 >= b {
                break;
            }
            let lo = a.max(sp.0);
            let hi = b.min(sp.1);
            if hi > lo {
                total += hi.secs_since(lo) * share;
            }
        }
    }
    total
}

fn gpu_not_used(a: &Analysis, g: &GpuEvidence) -> Option<Finding> {
    if g.devices.is_empty() || g.devices.iter().any(|d| d.job_processes > 0) {
        return None;
    }
    // Without per-process attribution (PID namespace) the driver's process
    // lists cannot tell; the libraries can: a process that uses CUDA maps
    // the driver's libcuda.so.
    let cuda_mapped = a.env.cuda_mapped();
    if !g.attribution_available && cuda_mapped != Some(false) {
        return None;
    }
    let dur = a.duration_s();
    let names: Vec<String> = g
        .devices
        .iter()
        .map(|d| format!("GPU {} ({})", d.index, d.name))
        .collect();
    let mut ev = vec![if g.attribution_available {
        format!(
            "{} GPU(s) present: {}; no process of the job ever held a context on any of them.",
            g.devices.len(),
            names.join(", ")
        )
    } else {
        format!(
            "{} GPU(s) present: {}; the driver's process lists cannot be matched to the job (PID namespace?), but no process of the job loaded a CUDA library, so none used a GPU.",
            g.devices.len(),
            names.join(", ")
        )
    }];
    let mut fix = "Make the job use the GPU: check `CUDA_VISIBLE_DEVICES` (empty or wrong indices hide the GPUs), that the code moves the model and batches to the device (`.to(\"cuda\")`), and that `python -c 'import torch; print(torch.cuda.is_available())'` prints True.".to_string();
    let fws = a.env.frameworks();
    for (fw, cuda) in &fws {
        if !cuda {
            ev.push(format!(
                "{} was loaded from `{}` with no CUDA library mapped: a CPU-only build.",
                fw.name, fw.path
            ));
        }
    }
    if fws.iter().any(|(_, c)| !c) {
        fix = "Install the CUDA build of the framework (e.g. `pip install torch --index-url https://download.pytorch.org/whl/cu124` matching the driver), then check `torch.cuda.is_available()`.".into();
    } else if cuda_mapped == Some(false) && g.attribution_available {
        ev.push("No process of the job mapped a CUDA library (`libcuda`, `libcudart`).".into());
    }
    Some(
        CauseRule {
            kind: FindingKind::GpuNotUsed,
            severity: Severity::Critical,
            title: "The job never used the GPU".into(),
            gpu_time: Some(GpuTime {
                seconds: dur * g.devices.len() as f64,
                share: 1.0,
                basis: Basis::Measured,
                method: "the whole run on every GPU: no process of the job was ever on one".into(),
            }),
            evidence: ev,
            fix,
        }
        .finding(),
    )
}

fn cuda_mismatch(a: &Analysis, g: &GpuEvidence) -> Option<Finding> {
    let (dmaj, dmin) = g.driver_cuda?;
    let mut worst: Option<(bool, String)> = None;
    let mut seen = BTreeSet::new();
    for rt in a.env.cuda_runtimes() {
        if !seen.insert(rt.path.clone()) {
            continue;
        }
        let major_newer = rt.major > dmaj;
        let minor_newer = rt.major == dmaj && rt.minor.is_some_and(|m| m > dmin);
        if !(major_newer || minor_newer) {
            continue;
        }
        let ver = match rt.minor {
            Some(m) => format!("{}.{m}", rt.major),
            None => format!("{}", rt.major),
        };
        let line = format!(
            "Process {} mapped CUDA runtime {ver} (`{}`); the driver{} supports CUDA up to {dmaj}.{dmin}.",
            rt.pid,
            rt.path,
            g.driver_version
                .as_ref()
                .map(|v| format!(" {v}"))
                .unwrap_or_default()
        );
        if worst.as_ref().map_or(true, |(m, _)| !*m && major_newer) {
            worst = Some((major_newer, line));
        }
    }
    let (major_newer, line) = worst?;
    let on_gpu = g.devices.iter().any(|d| d.job_processes > 0);
    let dur = a.duration_s();
    let mut ev = vec![line];
    let (severity, gpu_time) = if major_newer && !on_gpu {
        ev.push(
            "No process of the job reached the GPU: CUDA initialisation fails with this driver."
                .into(),
        );
        (
            Severity::Critical,
            Some(GpuTime {
                seconds: dur * g.devices.len().max(1) as f64,
                share: 1.0,
                basis: Basis::Measured,
                method: "the whole run: the job could not use the GPU".into(),
            }),
        )
    } else if major_newer {
        (Severity::Warning, None)
    } else {
        ev.push("Same major version: CUDA minor-version compatibility lets it run, but kernels JIT-compiled from PTX and features of the newer minor version can fail.".into());
        (Severity::Warning, None)
    };
    Some(CauseRule {
        kind: FindingKind::CudaDriverMismatch,
        severity,
        title: format!("The job's CUDA runtime is newer than the driver (CUDA {dmaj}.{dmin})"),
        gpu_time,
        evidence: ev,
        fix: format!("Upgrade the NVIDIA driver to one that supports the job's CUDA runtime, or install the framework build for CUDA {dmaj}.x or older (e.g. the matching `--index-url https://download.pytorch.org/whl/cuXYZ` wheel)."),
    }.finding())
}

fn throttle_finding(
    a: &Analysis,
    g: &GpuEvidence,
    kind: FindingKind,
    pick: impl Fn(&GpuDeviceEvidence) -> &ThrottleEvidence,
) -> Option<Finding> {
    let dur = a.duration_s();
    if dur <= 0.0 {
        return None;
    }
    let mut secs = 0.0;
    let mut ev = Vec::new();
    let mut upper = false;
    let devs = g.job_devices();
    for d in &devs {
        let t = pick(d);
        if t.active_s < th::MIN_SHARE * dur {
            continue;
        }
        let reasons: Vec<String> = t
            .reasons
            .iter()
            .map(|(n, s)| format!("{n} {s:.1} s"))
            .collect();
        ev.push(format!(
            "GPU {} ({}): throttled {:.1} s ({} of the run), {:.1} s of it while busy; reasons: {}.",
            d.index,
            d.name,
            t.active_s,
            pct(t.active_s / dur),
            t.active_busy_s,
            reasons.join(", ")
        ));
        match t.clock_ratio {
            Some(r) => {
                ev.push(format!(
                    "SM clock at {} of its maximum while throttled.",
                    pct(r)
                ));
                secs += t.active_busy_s * (1.0 - r).clamp(0.0, 1.0);
            }
            None => {
                upper = true;
                secs += t.active_busy_s;
            }
        }
    }
    if ev.is_empty() {
        return None;
    }
    let share = (secs / (dur * devs.len().max(1) as f64)).min(1.0);
    let mut severity = Severity::from_share(share).max(Severity::Warning);
    let (title, fix) = match kind {
        FindingKind::ThermalThrottling => (
            "The GPU slowed its clocks because it ran too hot".to_string(),
            "Improve cooling: check airflow, fan curves and the inlet temperature (`nvidia-smi -q -d TEMPERATURE,PERFORMANCE`), clean dust filters, and spread hot GPUs apart.".to_string(),
        ),
        _ => {
            // Running at the power limit under full load is how many GPUs
            // normally operate: a warning at most.
            severity = severity.min(Severity::Warning);
            (
                "The GPU was held back by its power limit".to_string(),
                "Check the power limit (`nvidia-smi -q -d POWER`): raise it to the board's default if it was lowered (`nvidia-smi -pl WATTS`), and check the PSU and power cabling; at the default limit under full load this is expected.".to_string(),
            )
        }
    };
    Some(
        CauseRule {
            kind,
            severity,
            title,
            gpu_time: Some(GpuTime {
                seconds: secs,
                share,
                basis: Basis::Measured,
                method: if upper {
                    "upper bound: time throttled while busy (clocks not measured)".into()
                } else {
                    "time throttled while busy × the share of clock speed lost".into()
                },
            }),
            evidence: ev,
            fix,
        }
        .finding(),
    )
}

fn throttling(a: &Analysis, g: &GpuEvidence) -> Vec<Finding> {
    let mut out = Vec::new();
    out.extend(throttle_finding(
        a,
        g,
        FindingKind::ThermalThrottling,
        |d| &d.thermal,
    ));
    out.extend(throttle_finding(a, g, FindingKind::PowerCapped, |d| {
        &d.power
    }));
    out
}

fn memory_pressure(a: &Analysis, g: &GpuEvidence) -> Option<Finding> {
    let mut ev = Vec::new();
    for d in g.job_devices() {
        let (Some(total), Some(used)) = (d.mem_total, d.mem_used_max) else {
            continue;
        };
        if total == 0 || (used as f64) < th::GPU_MEMORY_PRESSURE * total as f64 {
            continue;
        }
        ev.push(format!(
            "GPU {} ({}): up to {} of {} memory used ({}).",
            d.index,
            d.name,
            mb(used as f64),
            mb(total as f64),
            pct(used as f64 / total as f64)
        ));
    }
    if ev.is_empty() {
        return None;
    }
    let s = &a.system;
    if s.swap_in_bytes + s.swap_out_bytes > 0 {
        ev.push(format!(
            "The host swapped too: {} in, {} out.",
            mb(s.swap_in_bytes as f64),
            mb(s.swap_out_bytes as f64)
        ));
    }
    Some(CauseRule::risk(FindingKind::GpuMemoryPressure, Severity::Warning, "GPU memory nearly full", ev, "Leave headroom: smaller batch (with gradient accumulation to keep the effective size), mixed precision (AMP), activation checkpointing; `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` reduces fragmentation.").finding())
}

fn pcie(g: &GpuEvidence) -> Option<Finding> {
    let mut ev = Vec::new();
    for d in &g.devices {
        let (Some((bg, bw)), Some((mg, mw))) = (d.pcie_best, d.pcie_max) else {
            continue;
        };
        if bg < mg || bw < mw {
            ev.push(format!(
                "GPU {} ({}): PCIe link at best gen {bg} x{bw} during the run; the card and slot support gen {mg} x{mw}.",
                d.index, d.name
            ));
        }
    }
    if ev.is_empty() {
        return None;
    }
    Some(CauseRule::risk(FindingKind::PcieDegraded, Severity::Warning, "PCIe link below its maximum", ev, "Reseat the card, check that the slot is wired x16 and not shared, check risers and the BIOS PCIe generation setting; confirm under load with `nvidia-smi -q -d PCIE` (links slow down when idle).").finding())
}

/// What the stacks leave out of the threads that gpuprof's own perf events
/// sampled (native programs, threads the in-process agent did not sample):
/// those events never sample the kernel, so their time in system calls
/// and page faults is in no stack. Its amount is their system time in
/// `/proc` (clock ticks: an estimate).
fn perf_kernel_unsampled(a: &Analysis) -> Option<String> {
    let rep = &a.stacks.report;
    let hz = rep.frequency_hz;
    let kernel_s: f64 = rep.perf_kernel_s.values().sum();
    if hz <= 0.0 || kernel_s < crate::vocab::stacks::MIN_UNSAMPLED_KERNEL_S {
        return None;
    }
    // Of the job's whole CPU time: a thread with a few ms of system time
    // and no sample is not news.
    let job_s: f64 = a
        .processes
        .values()
        .map(|p| (p.user_ns + p.sys_ns) as f64 / 1e9)
        .sum();
    let share = kernel_s / job_s.max(kernel_s);
    if share < crate::vocab::stacks::MIN_UNSAMPLED_KERNEL_SHARE {
        return None;
    }
    let (pid, top) = rep
        .perf_kernel_s
        .iter()
        .max_by(|x, y| x.1.total_cmp(y.1).then(y.0.cmp(x.0)))?;
    let name = a.processes.get(pid).map(|p| p.comm.as_str()).unwrap_or("?");
    Some(format!(
        "stacks: the threads sampled by gpuprof's perf events (native code, threads the in-process agent did not sample) spent about {kernel_s:.1} CPU-s ({:.0}% of the job's CPU time) in the kernel (their system time in /proc): those events take no sample there, so the flame graphs leave that time out (most in {name} (pid {}): {top:.1} s).",
        100.0 * share,
        pid.0
    ))
}

/// What the stacks leave out when the in-process agent's perf event could
/// not sample the kernel: its periods that ended there took no sample, and
/// the flame graphs' shares are of the time in user mode.
fn kernel_unsampled(a: &Analysis) -> Option<String> {
    let hz = a.stacks.report.frequency_hz;
    let mut per: Vec<(u64, u64, &str, crate::event::Pid, &str)> = a
        .stacks
        .report
        .python
        .processes
        .iter()
        .filter_map(|p| {
            let ag = p.agent.as_ref()?;
            (ag.kernel_sampled == Some(false)).then(|| {
                (
                    ag.unsampled_periods,
                    ag.samples + ag.merged_periods + ag.unsampled_periods,
                    p.name.as_str(),
                    p.pid,
                    p.detail.as_str(),
                )
            })
        })
        .collect();
    let unsampled: u64 = per.iter().map(|p| p.0).sum();
    let total: u64 = per.iter().map(|p| p.1).sum();
    if hz <= 0.0
        || total == 0
        || (unsampled as f64) < crate::vocab::stacks::MIN_UNSAMPLED_KERNEL_SHARE * total as f64
        || (unsampled as f64 / hz) < crate::vocab::stacks::MIN_UNSAMPLED_KERNEL_S
    {
        return None;
    }
    per.sort_by(|x, y| y.0.cmp(&x.0).then(x.3.cmp(&y.3)));
    let (top_n, top_total, name, pid, why) = per[0];
    let why = why
        .strip_prefix("time in the kernel not sampled: ")
        .unwrap_or(why);
    Some(format!(
        "stacks: the Python processes spent at least {:.1} CPU-s ({:.0}% of their CPU time) in the kernel (system calls, page faults) where the sampler was not allowed to take samples: the flame graphs leave that time out, and their shares are of the rest, the time in user mode (most in {name} (pid {pid}): {:.0}% of its CPU time). Why: {why}.",
        unsampled as f64 / hz,
        100.0 * unsampled as f64 / total as f64,
        100.0 * top_n as f64 / top_total.max(1) as f64,
    ))
}

fn coverage(
    a: &Analysis,
    gpu: Option<&GpuEvidence>,
    stacks: Option<&StackEvidence>,
) -> Option<Finding> {
    let mut ev = Vec::new();
    let mut fixes = Vec::new();
    let mut inconclusive = false;
    for c in a.coverage.values().filter(|c| !c.available) {
        ev.push(format!("{}: {}", c.source, c.detail));
    }
    if gpu.is_none() && !a.coverage.contains_key("gpu") {
        ev.push(
            "gpu: this recording holds no GPU data; GPU time is estimated from the CPU side."
                .into(),
        );
        fixes.push("record on a machine with the NVIDIA driver (or point GPUPROF_NVML_LIB at libnvidia-ml.so.1)");
    }
    if stacks.is_none() {
        // The samplers' coverage entries (native-stacks, python-stacks) say
        // why when they could not run; otherwise say what is missing.
        let entries: Vec<_> = a
            .coverage
            .values()
            .filter(|c| c.source.contains("stacks"))
            .collect();
        if entries.is_empty() {
            ev.push("stacks: no stack samples in this recording; findings cannot name the functions involved.".into());
        } else if entries.iter().all(|c| c.available) {
            ev.push(
                "stacks: the samplers ran but recorded no sample of the job (too short a run?)."
                    .into(),
            );
        }
    }
    if let Some(s) = stacks {
        let total = s.total_samples + s.lost_records;
        if total > 0 && s.lost_records as f64 > th::MAX_LOST_SHARE * total as f64 {
            inconclusive = true;
            ev.push(format!(
                "stacks: {} of {} sample records were lost (ring buffer full).",
                s.lost_records, total
            ));
            fixes.push("lower --frequency or raise the ring buffer size");
        }
    }
    if let Some(line) = kernel_unsampled(a) {
        ev.push(line);
        fixes.push("for stacks of the time in the kernel too, run gpuprof as root or with CAP_PERFMON (or set kernel.perf_event_paranoid to 1) on Linux 6.11 or later");
    }
    if let Some(line) = perf_kernel_unsampled(a) {
        ev.push(line);
    }
    let intervals = a.duration_s() * 1e9 / a.header.interval_ns.max(1) as f64;
    // A short recording is not an alarm: every finding's severity already
    // allows for the intervals behind it (see `support`).
    let mut short = false;
    let record_more;
    if intervals < th::MIN_INTERVALS {
        short = true;
        ev.push(format!(
            "The recording covers {:.2} s, {intervals:.0} sampling intervals: too few for precise shares. Each finding's severity allows for the intervals behind it (its \"Evidence\" line gives them); one without enough evidence for a warning is info and says \"possibly\".",
            a.duration_s()
        ));
        record_more = format!(
            "record at least {:.0} s (or with a shorter --interval)",
            (th::MIN_INTERVALS * a.header.interval_ns as f64 / 1e9).ceil()
        );
        fixes.push(&record_more);
    }
    for w in &a.warnings {
        inconclusive = true;
        ev.push(w.clone());
    }
    if ev.is_empty() {
        return None;
    }
    if fixes.is_empty() {
        fixes.push("see each line above for how to enable what was missing");
    }
    Some(
        CauseRule {
            kind: FindingKind::LowSampleCoverage,
            severity: if inconclusive {
                Severity::Warning
            } else {
                Severity::Info
            },
            title: if inconclusive {
                "Parts of this run were not measured well enough to conclude".into()
            } else if short {
                "This run is short: its figures are imprecise".into()
            } else {
                "Some sources were not measured".into()
            },
            gpu_time: None,
            evidence: ev,
            fix: {
                let mut f = fixes.join("; ");
                if let Some(c) = f.get_mut(0..1) {
                    c.make_ascii_uppercase();
                }
                f.push('.');
                f
            },
        }
        .finding(),
    )
}
