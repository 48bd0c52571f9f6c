//! The causes beyond the input pipeline: the training loop's own work, the
//! cgroup's CPU limit, input workers restarted every epoch, host memory
//! pressure and the job's own writes. Each is a rule like those of
//! `rules.rs`: a pure function of the analysis, a timeline and the
//! optional GPU/stack evidence, with GPU time measured from the idle time
//! in the bins of its cause.

use std::collections::{BTreeMap, BTreeSet};

use crate::analysis::fold::FrameClass;
use crate::analysis::stacks::{pool_label, Attribution, Sample};
use crate::analysis::{Analysis, Role};
use crate::event::{Pid, Tid};
use crate::units::{bytes, pct, plural, rate};

use super::evidence::{is_python_frame, GpuEvidence};
use super::measure::{concurrent_workers, gpu_gap_lines, gpu_time};
use super::rule::CauseRule;
use super::thresholds as th;
use super::timeline::{Cause, InputThread, Timeline};
use super::{Finding, FindingKind};

/// Frames of a sampled stack shown for a function: the innermost Python
/// function and its callers, up to this many.
const FUNCTION_CHAIN: usize = 3;

/// What `pids` were running in the bins `in_bin` selects, from the stack
/// samples: per sample the innermost Python function with its callers
/// (`augment (train.py) ← compute_metrics ← log_step`; native frames when
/// it ran no Python), each sample weighted by how idle the GPU was when it
/// was taken (1 without GPU data, see [`idle_weighted`]) and by the
/// recorded samples it stands for. A process whose native samples have no
/// Python frames of their instant is named from py-spy's Python stacks of
/// the same bins instead, scaled to its native samples there, so that each
/// process still counts by the CPU it used. Shares of the total weight,
/// most first.
pub(super) fn functions_in(
    a: &Analysis,
    tl: &Timeline,
    pids: &BTreeSet<Pid>,
    in_bin: impl Fn(usize) -> bool,
    n: usize,
) -> Vec<(String, f64)> {
    functions_of(a, tl, |s| pids.contains(&s.pid), false, in_bin, n)
}

/// What the main threads were running in the bins `in_bin` selects, their
/// framework pool threads' work included (placed under their frames), as
/// [`functions_in`] counts it: the training loop's own time, without the
/// process's other threads (a collective library's network loop, a
/// logger's thread).
fn main_thread_functions(
    a: &Analysis,
    tl: &Timeline,
    in_bin: impl Fn(usize) -> bool,
    n: usize,
) -> Vec<(String, f64)> {
    let st = &a.stacks;
    let mains: BTreeSet<(Pid, Tid)> = tl.mains.iter().map(|t| (t.pid, t.tid)).collect();
    // A pool thread's sample works for a main thread when it was placed
    // under that thread's frames.
    let markers: BTreeSet<(Pid, String)> = mains
        .iter()
        .map(|&(pid, tid)| (pid, pool_label(pid, tid)))
        .collect();
    let works_for_main = |s: &Sample| {
        s.attribution == Attribution::PoolThread
            && st.stack_frames(s.py_stack).any(|f| {
                f.class == FrameClass::Marker && markers.contains(&(s.pid, f.name.clone()))
            })
    };
    functions_of(
        a,
        tl,
        |s| mains.contains(&(s.pid, s.tid)) || works_for_main(s),
        true,
        in_bin,
        n,
    )
}

/// [`functions_in`] of the samples `keep` selects; with `as_starter`, a
/// pool thread's sample is named as its starter's work (without the
/// `[pool thread of …]` frame), so that the two add up.
fn functions_of(
    a: &Analysis,
    tl: &Timeline,
    keep: impl Fn(&Sample) -> bool,
    as_starter: bool,
    in_bin: impl Fn(usize) -> bool,
    n: usize,
) -> Vec<(String, f64)> {
    let st = &a.stacks;
    let gpu = idle_weighted(a).then(|| a.gpu.idle_weights());
    let weight_of = |s: &crate::analysis::stacks::Sample| -> f64 {
        match tl.cause_bin_of(s.t) {
            Some(i) if in_bin(i) => {
                let idle = if let Some(g) = &gpu {
                    g.at(s.t).unwrap_or(0.0)
                } else {
                    1.0
                };
                // A thinned long recording keeps some samples for several.
                idle * s.weight as f64
            }
            _ => 0.0,
        }
    };
    let py_spy: BTreeSet<Pid> = st
        .python_only
        .iter()
        .filter(|s| keep(s))
        .map(|s| s.pid)
        .collect();
    // Per process: its functions, and the native samples' weight.
    let mut per_pid: BTreeMap<Pid, (BTreeMap<String, f64>, f64)> = BTreeMap::new();
    for s in st.samples.iter().filter(|s| keep(s)) {
        let weight = weight_of(s);
        if weight <= 0.0 {
            continue;
        }
        let e = per_pid.entry(s.pid).or_default();
        e.1 += weight;
        if py_spy.contains(&s.pid) {
            continue;
        }
        // A pool thread's sample is named as the Python view places it:
        // under the frames of the thread that started its work.
        let stack = if s.attribution == Attribution::PoolThread {
            s.py_stack
        } else {
            s.stack
        };
        let frames = st
            .stack(stack)
            .filter(|f| !(as_starter && f.starts_with(POOL_THREAD_PREFIX)));
        if let Some(name) = function_of(frames) {
            *e.0.entry(name).or_default() += weight;
        }
    }
    let mut py_only: BTreeMap<Pid, (BTreeMap<String, f64>, f64)> = BTreeMap::new();
    for s in st
        .python_only
        .iter()
        .filter(|s| py_spy.contains(&s.pid) && keep(s))
    {
        let weight = weight_of(s);
        if weight <= 0.0 {
            continue;
        }
        if let Some(name) = function_of(st.stack(s.stack)) {
            let e = py_only.entry(s.pid).or_default();
            *e.0.entry(name).or_default() += weight;
            e.1 += weight;
        }
    }
    for (pid, (names, py_total)) in py_only {
        let e = per_pid.entry(pid).or_default();
        // Without native samples (perf refused), py-spy's own weights.
        let scale = if e.1 > 0.0 { e.1 / py_total } else { 1.0 };
        for (name, w) in names {
            *e.0.entry(name).or_default() += w * scale;
        }
    }
    let mut w: BTreeMap<String, f64> = BTreeMap::new();
    for (names, _) in per_pid.into_values() {
        for (name, x) in names {
            *w.entry(name).or_default() += x;
        }
    }
    let total: f64 = w.values().sum();
    if total <= 0.0 {
        return Vec::new();
    }
    let mut v: Vec<(String, f64)> = w.into_iter().map(|(k, x)| (k, x / total)).collect();
    v.sort_by(|x, y| y.1.total_cmp(&x.1).then(x.0.cmp(&y.0)));
    v.truncate(n);
    v
}

/// A sample's function: its innermost Python frames, callers after
/// (`augment (train.py) ← __getitem__ ← fetch`), or
/// its innermost native frames when it has none (`gc_collect_main ←
/// _PyGC_CollectNoFail ← Py_FinalizeEx` says what a leaf alone does not).
/// A pool thread's sample placed under its starter's frames says so first
/// (`[pool thread of the main thread] ← Conv2d._conv_forward (conv.py) ←
/// forward`). Code that its file does not name is shown as its library
/// (`[libgomp.so.1]`), never as an address.
fn function_of<'a>(frames: impl Iterator<Item = &'a str>) -> Option<String> {
    let frames: Vec<&str> = frames.collect();
    let py: Vec<&str> = frames
        .iter()
        .copied()
        .filter(|f| is_python_frame(f))
        .collect();
    let pool = frames
        .iter()
        .copied()
        .find(|f| f.starts_with(POOL_THREAD_PREFIX));
    let mut chain: Vec<&str> = Vec::new();
    if py.is_empty() {
        for f in frames.iter().rev().map(|f| library_of(f)) {
            if chain.last() != Some(&f) {
                chain.push(f);
            }
            if chain.len() == FUNCTION_CHAIN {
                break;
            }
        }
    } else {
        chain.extend(pool);
        // The function with its file, its callers by name.
        chain.extend(
            py.iter()
                .rev()
                .take(FUNCTION_CHAIN - chain.len())
                .enumerate()
                .map(|(i, f)| if i == 0 { *f } else { chain_name(f) }),
        );
    }
    (!chain.is_empty()).then(|| {
        chain
            .iter()
            .map(|f| library_label(f))
            .collect::<Vec<_>>()
            .join(" ← ")
    })
}

/// The frame the Python view puts above a pool thread's own frames.
const POOL_THREAD_PREFIX: &str = "[pool thread of ";

/// An unnamed native frame, `[libgomp.so.1+0x1de62]`, as its library
/// `[libgomp.so.1` (closed by [`library_label`]); other frames as they are.
fn library_of(frame: &str) -> &str {
    match frame.rfind("+0x") {
        Some(i) if frame.starts_with('[') && frame.ends_with(']') => &frame[..i],
        _ => frame,
    }
}

fn library_label(frame: &str) -> String {
    if frame.starts_with('[') && !frame.ends_with(']') {
        format!("{frame}]")
    } else {
        frame.to_string()
    }
}

/// A Python frame in a chain: its function without the file, except a
/// module body, which only its file names (`<module> (torch/__init__.py)`).
fn chain_name(frame: &str) -> &str {
    if frame.starts_with("<module> (") {
        frame
    } else {
        frame.split(" (").next().unwrap_or(frame)
    }
}

/// Whether [`functions_in`] weights samples by how idle the GPU was: when
/// the GPU's utilization was sampled.
pub(super) fn idle_weighted(a: &Analysis) -> bool {
    a.gpu.devices.iter().any(|d| d.util_samples > 0)
}

/// "`augment ← compute_metrics` 85%, `log_step` 9%". Functions under 1%
/// after the first are left out: "`work` 100%, `dumps` 0%" says nothing of
/// the second.
pub(super) fn functions_text(fs: &[(String, f64)]) -> String {
    fs.iter()
        .enumerate()
        .filter(|(i, (_, s))| *i == 0 || *s >= 0.01)
        .map(|(_, (f, s))| format!("`{f}` {}", pct(*s)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// "Stack samples of the workers while they were saturated: …": what
/// `pids` ran in the bins of `cause` only. The same threads' samples over
/// the whole run would put their start-up (imports, a spawned worker's
/// unpickling of the dataset) among the functions of the cause.
pub(super) fn cause_stack_line(
    a: &Analysis,
    tl: &Timeline,
    pids: &BTreeSet<Pid>,
    cause: Cause,
    who_while: &str,
) -> Option<String> {
    let fs = functions_in(a, tl, pids, |i| tl.cause[i] == Some(cause), 3);
    if fs.is_empty() {
        return None;
    }
    Some(format!(
        "Stack samples of the {who_while}{}: {}.",
        if idle_weighted(a) {
            " (each weighted by how idle the GPU was)"
        } else {
            ""
        },
        functions_text(&fs)
    ))
}

/// The busiest main thread of a timeline.
fn main_thread(tl: &Timeline) -> Option<&InputThread> {
    tl.mains.iter().max_by(|x, y| x.cpu_s.total_cmp(&y.cpu_s))
}

pub(super) fn pids_of(ths: &[InputThread]) -> BTreeSet<Pid> {
    ths.iter().map(|t| t.pid).collect()
}

/// The training loop itself: the input keeps up (workers not saturated,
/// or no workers and the main thread's samples show the model or the
/// loop's own code rather than the data path, see `account::ground`)
/// while the main thread computes: the model's host side (on the CPU, the
/// model itself), metrics, logging, `.item()`-style host work.
pub(super) fn training_loop(
    a: &Analysis,
    tl: &Timeline,
    gpu: Option<&GpuEvidence>,
) -> Option<Finding> {
    let dur = a.duration_s();
    let loop_s = tl.cause_s(Cause::TrainingLoop);
    if dur <= 0.0 || loop_s < th::MIN_SHARE * dur {
        return None;
    }
    let main = main_thread(tl)?;
    let r = tl.mean_of(Cause::TrainingLoop, &tl.main_r).unwrap_or(0.0);
    let cpu = tl.mean_of(Cause::TrainingLoop, &tl.main_cpu).unwrap_or(0.0);
    let head = format!(
        "For {loop_s:.1} s ({} of the run) the main thread `{}` (pid {}) was running or waiting for a CPU {} of the time (using {} of a core)",
        pct(loop_s / dur),
        main.name,
        main.pid,
        pct(r),
        pct(cpu),
    );
    let mut ev = vec![if tl.workers.is_empty() {
        format!("{head}; the job has no input worker processes, and the main thread's stack samples then show more of the model or of the loop's own code than of preparing batches.")
    } else {
        let wr = tl
            .mean_of(Cause::TrainingLoop, &tl.workers_r)
            .unwrap_or(0.0);
        format!(
            "{head} while its {} kept up: they were running only {} of that time, their prefetch queues full.",
            plural(concurrent_workers(tl), "input worker"),
            pct(wr)
        )
    }];
    if r > cpu + 0.2 {
        ev.push(format!(
            "It got a core only {} of that time: other work on this machine delayed it further.",
            pct(cpu / r.max(1e-9))
        ));
    }
    let acc = super::account::main_account(a, tl, |i| tl.cause[i] == Some(Cause::TrainingLoop));
    if acc.conclusive() {
        ev.push(format!("Its stack samples then: {}.", acc.text()));
    }
    ev.extend(gpu_gap_lines(
        a,
        tl,
        gpu,
        Cause::TrainingLoop,
        "the training loop was computing",
    ));
    let fs = functions_in(
        a,
        tl,
        &pids_of(&tl.mains),
        |i| tl.cause[i] == Some(Cause::TrainingLoop),
        4,
    );
    // The fix names the main thread's own work (its pool threads' with
    // it): the process's other threads (a collective library's network
    // loop, a logger) are not what keeps the loop busy.
    let named = main_thread_functions(a, tl, |i| tl.cause[i] == Some(Cause::TrainingLoop), 1)
        .first()
        .map(|f| f.0.clone());
    if !fs.is_empty() {
        ev.push(format!(
            "What the main process ran then (all its threads){}: {}.",
            if idle_weighted(a) {
                " (stack samples, each weighted by how idle the GPU was)"
            } else {
                " (stack samples)"
            },
            functions_text(&fs)
        ));
    }
    let est = tl.weighted_s(Cause::TrainingLoop, |i| tl.main_r[i] as f64);
    let gt = gpu_time(
        a,
        tl,
        gpu,
        Cause::TrainingLoop,
        est,
        "upper bound: the time the main thread was running while its input was ready (an asynchronous GPU may run queued work meanwhile)",
    );
    // A loop that computes while the GPU is busy (launching ahead, or
    // spinning in a synchronisation) costs nothing.
    if gt.share < th::MIN_SHARE {
        return None;
    }
    let (title, fix) = loop_title_fix(a, tl, gpu, &acc, loop_s / dur, named, &mut ev);
    Some(CauseRule::costing(FindingKind::TrainingLoop, gt, title, ev, fix).finding())
}

/// The training-loop finding's title and fix: the model computed on the
/// CPU (nothing ran on a GPU), or the loop's host work keeping a GPU
/// waiting; with the data path's share when it matters too.
fn loop_title_fix(
    a: &Analysis,
    tl: &Timeline,
    gpu: Option<&GpuEvidence>,
    acc: &super::account::MainAccount,
    share: f64,
    named: Option<String>,
    ev: &mut Vec<String>,
) -> (String, String) {
    let named = |pre: &str, post: &str| {
        named
            .as_ref()
            .map(|f| format!("{pre}`{f}`{post}"))
            .unwrap_or_default()
    };
    let model = if acc.conclusive() {
        format!(", {} of its samples in the model", pct(acc.model_share))
    } else {
        String::new()
    };
    // Batch preparation that the main thread did too, when it is a large
    // part: workers would take that part off it.
    let data_too = if tl.workers.is_empty()
        && acc.conclusive()
        && acc.data_share >= th::ACCOUNT_SECOND_SHARE
    {
        format!(
            " The main thread also prepared the batches ({} of its samples in the data path): `DataLoader(..., num_workers=N)` takes that part off it.",
            pct(acc.data_share)
        )
    } else {
        String::new()
    };
    // Without the driver's CUDA library nothing ran on a GPU: the loop's
    // "host work" is the model itself, computed on the CPU, and taking
    // logging off the critical path is not the fix.
    if super::ran_on_cpu(a, gpu) {
        ev.push(format!(
            "{}: the framework computed the model on the CPU, in the main thread.",
            super::NO_DRIVER_EVIDENCE
        ));
        (
            format!(
                "The training loop computes the model on the CPU: its main thread was busy {} of the run while its input was ready{model}, and nothing ran on a GPU",
                pct(share)
            ),
            format!(
                "Run the model on a GPU{}. On a machine with one, check that `python -c 'import torch; print(torch.cuda.is_available())'` prints True (a CUDA build of the framework and a driver that supports it), and move the model and each batch to it (`model.to(\"cuda\")`, `batch.to(\"cuda\", non_blocking=True)`). Then record again: host work left in the loop is what this finding is about.{data_too}",
                named(" (the main thread's time went to ", " above all)")
            ),
        )
    } else {
        (
            format!(
                "The training loop's own host work keeps the GPU waiting: the main thread was busy {} of the run while its input was ready{model}",
                pct(share)
            ),
            format!(
                "Take host work off the loop's critical path{}: compute metrics and log every N steps instead of every step; keep running sums on the GPU and read them rarely (each `.item()`, `.cpu()`, `float(loss)` or `print(tensor)` waits for the GPU); move logging, metrics and checkpoint preparation to a background thread; cut per-step Python overhead (fewer small operations, `torch.compile`, CUDA graphs).{data_too}",
                named(" — it is ", " above all")
            ),
        )
    }
}

/// The job waited for its own writes: checkpoints or logs written from the
/// training loop (or by the input processes).
pub(super) fn write_stall(
    a: &Analysis,
    tl: &Timeline,
    gpu: Option<&GpuEvidence>,
) -> Option<Finding> {
    let dur = a.duration_s();
    let secs = tl.cause_s(Cause::WriteStall);
    if dur <= 0.0 || secs < th::MIN_SHARE * dur {
        return None;
    }
    let spans = tl.spans(Cause::WriteStall);
    let main_blocked = tl.mean_of(Cause::WriteStall, &tl.main_d).unwrap_or(0.0) >= th::IO_D_SHARE;
    let (who, pids) = match (main_blocked, main_thread(tl)) {
        (true, Some(m)) => (
            format!("The main thread `{}` (pid {})", m.name, m.pid),
            pids_of(&tl.mains),
        ),
        _ => ("The input threads".to_string(), tl.input_pids()),
    };
    let written: u64 = a
        .processes
        .values()
        .filter(|p| pids.contains(&p.pid))
        .map(|p| p.write_bytes)
        .sum();
    let mut ev = vec![
        format!(
            "{who} was blocked in D state (uninterruptible, waiting for storage) while its writes went to storage, for {secs:.1} s ({} of the run): checkpoints, logs or dumps written from the training loop.",
            pct(secs / dur),
        ),
        format!(
            "Those processes wrote {} to storage during the run.",
            bytes(written as f64)
        ),
    ];
    for d in a.system.disks.values().filter(|d| d.write_bytes > 0) {
        let busy = Timeline::mean_over(&d.busy, &spans).unwrap_or(0.0);
        let wr = Timeline::mean_over(&d.write_bps, &spans).unwrap_or(0.0);
        if busy >= 1.0 || wr >= 1e5 {
            ev.push(format!(
                "Disk {}: busy {busy:.0}% of that time, writing {}.",
                d.name,
                rate(wr)
            ));
        }
    }
    ev.extend(gpu_gap_lines(
        a,
        tl,
        gpu,
        Cause::WriteStall,
        "the job waited for its writes",
    ));
    let fs = functions_in(a, tl, &pids, |i| tl.cause[i] == Some(Cause::WriteStall), 3);
    if !fs.is_empty() {
        ev.push(format!("Writing from: {}.", functions_text(&fs)));
    }
    let gt = gpu_time(
        a,
        tl,
        gpu,
        Cause::WriteStall,
        tl.weighted_s(Cause::WriteStall, |_| 1.0),
        "upper bound: the time the job was blocked on its writes",
    );
    if gt.share < th::MIN_SHARE {
        return None;
    }
    Some(
        CauseRule::costing(
            FindingKind::WriteStall,
            gt,
            format!(
                "The job stalls on its own writes (checkpoints, logs) {} of the run",
                pct(secs / dur)
            ),
            ev,
            "Write off the training loop: copy the state to CPU memory and save it from a background thread or process (`torch.distributed.checkpoint.async_save`, or `torch.save` in a `threading.Thread`), save less often, or save to fast local storage (NVMe, `/dev/shm`) and copy it off asynchronously; buffer logs instead of flushing them every step.",
        )
        .finding(),
    )
}

/// Input workers started anew (e.g. each epoch, without
/// `persistent_workers=True`), with the GPU idle while they start.
pub(super) fn worker_restarts(
    a: &Analysis,
    tl: &Timeline,
    gpu: Option<&GpuEvidence>,
) -> Option<Finding> {
    let dur = a.duration_s();
    if tl.restarts.is_empty() || dur <= 0.0 {
        return None;
    }
    let lens: Vec<f64> = tl
        .restarts
        .iter()
        .map(|r| r.ready.secs_since(r.down))
        .collect();
    let gt = gpu_time(
        a,
        tl,
        gpu,
        Cause::WorkerRestart,
        tl.weighted_s(Cause::WorkerRestart, |_| 1.0),
        "upper bound: from the old workers exiting to the new ones' first run of computing ending",
    );
    if gt.share < th::MIN_SHARE {
        return None;
    }
    let k = tl.restarts.len();
    let size = tl.restarts.iter().map(|r| r.size).max().unwrap_or(0);
    let mean = lens.iter().sum::<f64>() / k as f64;
    let max = lens.iter().cloned().fold(0.0, f64::max);
    let mut ev = vec![
        format!(
            "The input workers were started {} times: {} of {} (a PyTorch DataLoader without `persistent_workers=True` starts its workers anew every epoch).",
            k + 1,
            plural(k, "restart"),
            plural(size, "worker")
        ),
        format!(
            "Each restart took {:.2} s on average (longest {max:.2} s), from the old workers exiting to the new ones being ready{}.",
            mean,
            if gpu.is_some() {
                " (the GPU working again)"
            } else {
                " (their first run of computing over)"
            }
        ),
    ];
    ev.extend(gpu_gap_lines(
        a,
        tl,
        gpu,
        Cause::WorkerRestart,
        "the workers were restarting",
    ));
    let new_workers: BTreeSet<Pid> = a
        .processes_with_role(Role::Worker)
        .filter(|p| {
            tl.restarts.iter().any(|r| {
                p.first_seen >= r.up
                    && p.first_seen.0 <= r.up.0 + (th::WORKER_GENERATION_S * 1e9) as u64
            })
        })
        .map(|p| p.pid)
        .collect();
    let fs = functions_in(
        a,
        tl,
        &new_workers,
        |i| tl.cause[i] == Some(Cause::WorkerRestart),
        3,
    );
    if !fs.is_empty() {
        ev.push(format!(
            "The new workers spent that time in: {}.",
            functions_text(&fs)
        ));
    }
    Some(
        CauseRule::costing(
            FindingKind::WorkerRestarts,
            gt,
            format!(
                "The input workers are restarted {} and the GPU waits while they start",
                if k == 1 {
                    "once".to_string()
                } else {
                    format!("{k} times")
                }
            ),
            ev,
            "Keep the workers across epochs: `DataLoader(..., persistent_workers=True)` (with `num_workers > 0`); keep `worker_init_fn` and the dataset's set-up cheap (open files and connections lazily, in the worker), so that a start that does happen is short.",
        )
        .finding(),
    )
}

/// The job's cgroup CPU limit throttled it.
pub(super) fn cpu_limit(a: &Analysis, tl: &Timeline, gpu: Option<&GpuEvidence>) -> Option<Finding> {
    let cg = &a.system.cgroup;
    let quota = cg.cpu_quota_cores?;
    let dur = a.duration_s();
    let secs = tl.cause_s(Cause::CpuLimited);
    if dur <= 0.0 || secs < th::MIN_SHARE * dur {
        return None;
    }
    let spans = tl.spans(Cause::CpuLimited);
    let job_cores: f64 = a
        .processes
        .values()
        .filter_map(|p| Timeline::mean_over(&p.cpu, &spans))
        .sum();
    let runnable = tl
        .mean_of(Cause::CpuLimited, &tl.job_runnable)
        .unwrap_or(0.0);
    let workers = concurrent_workers(tl);
    let path = cg.cpu_path.as_deref().unwrap_or("?");
    let mut ev = vec![
        format!(
            "The job's cgroup `{path}` (cgroup {}) is limited to {quota:.2} CPUs ({} µs per {} µs period) on this {:.0}-core machine.",
            if cg.cpu_v2 { "v2" } else { "v1" },
            (quota * cg.cpu_period_us as f64).round(),
            cg.cpu_period_us,
            tl.cores
        ),
        format!(
            "It was throttled (out of quota, waiting for the next period) in {} of its {} periods ({}), {:.1} s of throttled time; for {secs:.1} s ({} of the run) most of its periods were throttled.",
            cg.throttled_periods,
            cg.periods,
            pct(cg.throttled_periods as f64 / cg.periods.max(1) as f64),
            cg.throttled_s,
            pct(secs / dur)
        ),
        format!(
            "Meanwhile the job used {job_cores:.2} cores with {runnable:.1} threads wanting one: its demand is above the limit, not the machine's cores."
        ),
    ];
    ev.extend(gpu_gap_lines(
        a,
        tl,
        gpu,
        Cause::CpuLimited,
        "the cgroup was throttled",
    ));
    let est = tl.weighted_s(Cause::CpuLimited, |i| tl.cg_throttled[i] as f64);
    let gt = gpu_time(
        a,
        tl,
        gpu,
        Cause::CpuLimited,
        est,
        "the time weighted by the share of throttled periods",
    );
    let need = (workers + 1).max(runnable.ceil() as usize).max(1);
    Some(
        CauseRule::costing(
            FindingKind::CpuLimit,
            gt,
            format!(
                "The container's CPU limit ({quota:.2} CPUs) throttles the job {} of the run",
                pct(secs / dur)
            ),
            ev,
            format!(
                "Raise the CPU limit of the job's container or cgroup to at least {need} CPUs (the main process plus one per DataLoader worker): Kubernetes `resources.limits.cpu` (or no CPU limit, keeping `requests`), `docker run --cpus`, Slurm `--cpus-per-task`, systemd `CPUQuota=`. Within the limit, fewer workers do not help: the work is the same; make each batch cheaper instead."
            ),
        )
        .finding(),
    )
}

/// The input processes read their dataset from storage again and again: it
/// does not stay in the page cache. One line of evidence, or None.
pub(super) fn page_cache_thrash(a: &Analysis, tl: &Timeline) -> Option<String> {
    let mut pids = tl.input_pids();
    pids.extend(tl.mains.iter().map(|t| t.pid));
    let dataset: u64 = a.env.files_by_mount(&pids).iter().map(|f| f.bytes).sum();
    if dataset < th::DATASET_MIN_BYTES {
        return None;
    }
    let read: u64 = a
        .processes
        .values()
        .filter(|p| pids.contains(&p.pid))
        .map(|p| p.read_bytes)
        .sum();
    if (read as f64) < th::PAGE_CACHE_REREAD * dataset as f64 {
        return None;
    }
    let room = match a.system.cgroup.memory_limit_bytes {
        Some(l) => format!("the job's cgroup may use {}", bytes(l as f64)),
        None if !a.system.mem_available.is_empty() => format!(
            "as little as {} of memory was available",
            bytes(a.system.mem_available.quantile(0.0))
        ),
        None => "memory was short".to_string(),
    };
    Some(format!(
        "The input processes read {} from storage, {:.1}× the {} of data files they held open: the dataset did not stay in the page cache ({room}), so it is read from disk again and again.",
        bytes(read as f64),
        read as f64 / dataset as f64,
        bytes(dataset as f64)
    ))
}

/// Host memory pressure: tasks stalled on memory (reclaim, swap-in, a page
/// cache too small for the dataset).
pub(super) fn host_memory(
    a: &Analysis,
    tl: &Timeline,
    gpu: Option<&GpuEvidence>,
) -> Option<Finding> {
    let dur = a.duration_s();
    let secs = tl.cause_s(Cause::MemoryPressure);
    if dur <= 0.0 || secs < th::MIN_SHARE * dur {
        return None;
    }
    let spans = tl.spans(Cause::MemoryPressure);
    let s = &a.system;
    let some = Timeline::mean_over(&s.psi_memory.some, &spans).unwrap_or(0.0);
    let full = Timeline::mean_over(&s.psi_memory.full, &spans);
    let mut ev = vec![format!(
        "For {secs:.1} s ({} of the run) tasks stalled waiting for memory {some:.0}% of the time (PSI memory \"some\"{}): reclaiming page cache or swapping in.",
        pct(secs / dur),
        full.map(|f| format!("; all tasks at once {f:.0}%")).unwrap_or_default()
    )];
    if s.swap_in_bytes + s.swap_out_bytes > 0 {
        ev.push(format!(
            "The machine swapped {} in and {} out.",
            bytes(s.swap_in_bytes as f64),
            bytes(s.swap_out_bytes as f64)
        ));
    }
    if !s.mem_available.is_empty() {
        ev.push(format!(
            "Memory available fell to {} of {}.",
            bytes(s.mem_available.quantile(0.0)),
            bytes(s.mem_total as f64)
        ));
    }
    if let Some(l) = s.cgroup.memory_limit_bytes {
        ev.push(format!(
            "The job's cgroup `{}` is limited to {} of memory and used up to {} (page cache included).",
            s.cgroup.memory_path.as_deref().unwrap_or("?"),
            bytes(l as f64),
            bytes(s.cgroup.memory_usage_max as f64)
        ));
    }
    ev.extend(page_cache_thrash(a, tl));
    ev.extend(gpu_gap_lines(
        a,
        tl,
        gpu,
        Cause::MemoryPressure,
        "tasks stalled on memory",
    ));
    let est = tl.weighted_s(Cause::MemoryPressure, |i| tl.psi_mem[i] as f64);
    let gt = gpu_time(
        a,
        tl,
        gpu,
        Cause::MemoryPressure,
        est,
        "the time weighted by the share some task stalled on memory",
    );
    Some(
        CauseRule::costing(
            FindingKind::HostMemoryPressure,
            gt,
            format!(
                "Host memory pressure: tasks stall waiting for memory {} of the run",
                pct(secs / dur)
            ),
            ev,
            "Give the job memory headroom: raise its memory limit (Kubernetes `resources.limits.memory`, `docker run --memory`, Slurm `--mem`) or stop other memory users on the machine; shrink the job's footprint (fewer DataLoader workers — each holds its own copy of the dataset object —, a smaller `prefetch_factor`, memory-mapped data instead of loading it in every worker); when the dataset cannot stay in the page cache, pack it smaller or read it from faster storage.",
        )
        .finding(),
    )
}

#[cfg(test)]
mod tests {
    use super::function_of;

    #[test]
    fn evidence_names_libraries_not_addresses_and_says_pool_threads() {
        let native = [
            "python (7)",
            "[libc.so.6+0x891f4]",
            "[libgomp.so.1+0x1b497]",
            "[libgomp.so.1+0x1de62]",
        ];
        assert_eq!(
            function_of(native.into_iter()).unwrap(),
            "[libgomp.so.1] ← [libc.so.6] ← python (7)"
        );
        let pool = [
            "main (train.py)",
            "Conv2d.forward (conv.py)",
            "Conv2d._conv_forward (conv.py)",
            "at::native::conv",
            "[pool thread of the main thread]",
            "[libgomp.so.1]",
        ];
        assert_eq!(
            function_of(pool.into_iter()).unwrap(),
            "[pool thread of the main thread] ← Conv2d._conv_forward (conv.py) ← Conv2d.forward"
        );
    }
}
