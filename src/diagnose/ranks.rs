//! Ranks side by side, and the straggler: the rank the others wait for.
//!
//! In synchronous data-parallel training every rank runs the same number of
//! steps at the same pace: each step ends in a collective (the gradient
//! all-reduce) that completes only when the slowest rank arrives. The
//! ranks that are ready first wait inside it. So the straggler is the rank
//! that waits least while the others wait much, and what the others lose
//! is their time in collectives beyond the straggler's own. When collective
//! calls are not visible on the Python stacks (NCCL waits on the GPU, or
//! DDP's all-reduce inside `backward`), a rank whose GPU sits idle while
//! the others' stay busy is the straggler: NCCL kernels spin on the GPU
//! while they wait, so the waiting ranks' GPUs look busy.
//!
//! [`figures`] measures each rank from one recording; [`straggler`] compares
//! ranks, from one recording or from all nodes' (`gpuprof merge`).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::analysis::{Analysis, Process, Role, Thread};
use crate::event::Pid;

use super::evidence::GpuEvidence;
use super::rule::CauseRule;
use super::thresholds as th;
use super::{Basis, Finding, FindingKind, GpuTime, Severity};
use crate::analysis::collectives::CountedFrom;
use crate::analysis::steps::per_process as steps;
use crate::units::pct;

/// One rank's figures, as report.json lists them under `ranks`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankFigures {
    pub rank: u32,
    pub local_rank: Option<u32>,
    pub node_rank: Option<u32>,
    pub world_size: Option<u32>,
    /// The host it ran on (the recording's).
    pub host: String,
    /// Its main processes (usually one) and its input workers.
    pub pids: Vec<i32>,
    pub worker_pids: Vec<i32>,
    /// GPUs its processes held a context on (the driver's process lists).
    pub gpus: Vec<u32>,
    /// Seconds its main process was alive in the recorded window.
    pub active_s: f64,
    /// Training steps per second, when the recording's steps were found on
    /// this rank's process (NVTX step ranges, GPU idle gaps or its stacks;
    /// see report.json `steps`). In synchronous training every rank runs at
    /// the same rate: the straggler sets it.
    pub steps_per_s: Option<f64>,
    /// How its steps were found (`nvtx-range`, `nvtx-range-auto`,
    /// `python-stacks`, …), or why it has no step rate. Absent from
    /// reports written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps_how: Option<String>,
    /// CPU seconds of all its processes.
    pub cpu_s: f64,
    /// Cores used by its busiest main thread over its life.
    pub main_cpu_cores: f64,
    /// Most workers alive at once.
    pub workers: usize,
    /// Mean over its workers (busiest thread each): cores used, and share
    /// of time running or waiting for a CPU (R).
    pub worker_cpu_cores: Option<f64>,
    pub worker_running_share: Option<f64>,
    /// Share of time its input threads (workers, else main thread) spent
    /// blocked in uninterruptible sleep (D, usually storage).
    pub input_blocked_share: Option<f64>,
    /// Time its most-waiting thread spent inside collective calls, the time
    /// its Python samples cover, and the share; None without Python stacks.
    pub collective_wait_s: Option<f64>,
    pub collective_sampled_s: Option<f64>,
    pub collective_share: Option<f64>,
    /// Python samples behind the collective figures.
    pub collective_samples: u64,
    /// The collective functions it waited in, most time first.
    pub collective_functions: Vec<String>,
    /// Where the collective figures are counted from (the end of the
    /// ranks' first collective, unless too few samples follow the first
    /// exit seen). Absent from reports written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective_counted_from: Option<CountedFrom>,
    /// Mean busy share of its GPUs, their idle time between start-up and
    /// shutdown, and time throttled (thermal or power) while busy.
    pub gpu_busy_share: Option<f64>,
    pub gpu_idle_s: Option<f64>,
    pub gpu_throttled_s: Option<f64>,
}

impl RankFigures {
    /// "rank 1" or, when ranks of several hosts are compared, "rank 1 (node-b)".
    pub fn name(&self, hosts: usize) -> String {
        if hosts > 1 {
            format!("rank {} ({})", self.rank, self.host)
        } else {
            format!("rank {}", self.rank)
        }
    }
    fn gpu_idle_share(&self) -> Option<f64> {
        self.gpu_busy_share.map(|b| 1.0 - b)
    }
}

fn busiest(p: &Process) -> Option<&Thread> {
    p.threads
        .values()
        .max_by_key(|t| (t.user_ns + t.sys_ns, std::cmp::Reverse(t.tid)))
}

fn state_share(t: &Thread, state: char) -> f64 {
    let total: u64 = t.state_ns.values().sum();
    if total == 0 {
        0.0
    } else {
        t.state_ns.get(&state).copied().unwrap_or(0) as f64 / total as f64
    }
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Most processes alive at once among `ps`.
fn concurrent(a: &Analysis, ps: &[&Process]) -> usize {
    let mut edges: Vec<(u64, i32)> = Vec::new();
    for p in ps {
        let (s, e) = p.lifetime(a.end);
        edges.push((s.0, 1));
        edges.push((e.0, -1));
    }
    edges.sort();
    let (mut cur, mut max) = (0i32, 0i32);
    for (_, d) in edges {
        cur += d;
        max = max.max(cur);
    }
    max.max(0) as usize
}

/// Each rank's figures (sorted by rank); empty for a job without ranks.
pub fn figures(a: &Analysis, gpu: Option<&GpuEvidence>) -> Vec<RankFigures> {
    a.ranks()
        .into_iter()
        .map(|r| rank_figures(a, gpu, r))
        .collect()
}

fn rank_figures(a: &Analysis, gpu: Option<&GpuEvidence>, r: u32) -> RankFigures {
    let of_rank: Vec<&Process> = a.processes.values().filter(|p| p.rank == Some(r)).collect();
    let mains: Vec<&Process> = of_rank
        .iter()
        .copied()
        .filter(|p| p.role == Role::Main)
        .collect();
    let workers: Vec<&Process> = of_rank
        .iter()
        .copied()
        .filter(|p| p.role == Role::Worker)
        .collect();
    let ids = mains.first().map(|p| p.rank_ids).unwrap_or_default();
    let life = |p: &Process| {
        let (s, e) = p.lifetime(a.end);
        e.secs_since(s.max(a.start))
    };
    let active_s = mains.iter().map(|p| life(p)).fold(0.0, f64::max);
    let main_cpu_cores = mains
        .iter()
        .filter_map(|p| busiest(p).map(|t| (t, life(p))))
        .map(|(t, l)| {
            if l > 0.0 {
                (t.user_ns + t.sys_ns) as f64 / 1e9 / l
            } else {
                0.0
            }
        })
        .fold(0.0, f64::max);
    let wthreads: Vec<(&Thread, f64)> = workers
        .iter()
        .filter_map(|p| busiest(p).map(|t| (t, life(p))))
        .collect();
    let worker_cpu_cores = mean(
        &wthreads
            .iter()
            .filter(|(_, l)| *l > 0.0)
            .map(|(t, l)| (t.user_ns + t.sys_ns) as f64 / 1e9 / l)
            .collect::<Vec<_>>(),
    );
    let worker_running_share = mean(
        &wthreads
            .iter()
            .map(|(t, _)| state_share(t, 'R'))
            .collect::<Vec<_>>(),
    );
    let input_blocked_share = if wthreads.is_empty() {
        mains
            .iter()
            .filter_map(|p| busiest(p))
            .map(|t| state_share(t, 'D'))
            .reduce(f64::max)
    } else {
        mean(
            &wthreads
                .iter()
                .map(|(t, _)| state_share(t, 'D'))
                .collect::<Vec<_>>(),
        )
    };
    let main_pids: BTreeSet<Pid> = mains.iter().map(|p| p.pid).collect();
    let waits = a
        .collectives
        .threads
        .iter()
        .filter(|w| main_pids.contains(&w.pid) && w.samples > 0)
        .max_by(|x, y| {
            x.wait_s
                .total_cmp(&y.wait_s)
                .then(x.sampled_s.total_cmp(&y.sampled_s))
        });
    let mut functions: Vec<(&String, &f64)> = waits
        .map(|w| w.functions.iter().collect())
        .unwrap_or_default();
    functions.sort_by(|x, y| y.1.total_cmp(x.1).then(x.0.cmp(y.0)));

    let rank_pids: BTreeSet<Pid> = of_rank.iter().map(|p| p.pid).collect();
    let steps = rank_steps(a, &mains);
    let devs = gpu.and_then(|g| g.for_pids(&rank_pids));
    let devs = devs.as_ref().map(|g| g.devices.as_slice()).unwrap_or(&[]);
    let busy: Vec<f64> = devs.iter().filter_map(|d| d.busy_fraction).collect();
    let measured = !busy.is_empty();
    RankFigures {
        rank: r,
        local_rank: ids.local_rank,
        node_rank: ids.node_rank,
        world_size: ids.world_size,
        host: a.header.host.clone(),
        pids: mains.iter().map(|p| p.pid.0).collect(),
        worker_pids: workers.iter().map(|p| p.pid.0).collect(),
        gpus: devs.iter().map(|d| d.index).collect(),
        active_s,
        steps_per_s: steps.steps_per_s,
        steps_how: Some(steps.how),
        cpu_s: of_rank.iter().map(|p| p.cpu_s()).sum(),
        main_cpu_cores,
        workers: concurrent(a, &workers),
        worker_cpu_cores,
        worker_running_share,
        input_blocked_share,
        collective_wait_s: waits.map(|w| w.wait_s),
        collective_sampled_s: waits.map(|w| w.sampled_s),
        collective_share: waits.map(|w| w.share()),
        collective_samples: waits.map_or(0, |w| w.samples),
        collective_functions: functions.into_iter().take(3).map(|f| f.0.clone()).collect(),
        collective_counted_from: waits.map(|w| w.counted_from),
        gpu_busy_share: mean(&busy),
        gpu_idle_s: measured.then(|| {
            devs.iter()
                .filter(|d| d.busy_fraction.is_some())
                .map(|d| d.idle_split(a.start, a.end).steady_s)
                .sum::<f64>()
                / busy.len() as f64
        }),
        gpu_throttled_s: measured.then(|| {
            devs.iter()
                .map(|d| d.thermal.active_busy_s + d.power.active_busy_s)
                .sum()
        }),
    }
}

/// A rank's steps: those of its main process with the most (a rank with
/// several main processes is a wrapper and its Python child), or why none.
fn rank_steps(a: &Analysis, mains: &[&Process]) -> steps::ProcessSteps {
    let mut best: Option<steps::ProcessSteps> = None;
    for p in mains {
        let s = steps::steps_of(a, p.pid);
        if best.as_ref().map_or(true, |b| s.count > b.count) {
            best = Some(s);
        }
    }
    best.unwrap_or_else(|| steps::ProcessSteps {
        steps_per_s: None,
        count: 0,
        how: "no main process of this rank was seen".into(),
    })
}

/// A share of time in collectives: a wait that was seen is never shown as
/// "0%".
fn wait_pct(share: f64) -> String {
    if share > 0.0 && share < 0.005 {
        "<1%".into()
    } else {
        pct(share)
    }
}

/// "rank 0", "ranks 0 and 2", "ranks 0, 2 and 3", "15 ranks".
fn rank_list(rs: &[&RankFigures], hosts: usize) -> String {
    match rs.len() {
        0 => "no rank".into(),
        1 => rs[0].name(hosts),
        n if n <= 6 => {
            let names: Vec<String> = rs.iter().map(|r| r.name(hosts)).collect();
            format!(
                "{} and {}",
                names[..n - 1].join(", "),
                names[n - 1].trim_start_matches("rank ")
            )
            .replacen("rank ", "ranks ", 1)
        }
        n => format!("the {n} other ranks"),
    }
}

/// How the straggler was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    /// Time in collective calls (Python stacks).
    Waits,
    /// GPU idle while the other ranks' GPUs were busy.
    GpuIdle,
}

/// The rank the others wait for, if one clearly is; see the module
/// documentation. `ranks` may come from several hosts.
pub fn straggler(ranks: &[RankFigures]) -> Option<Finding> {
    if ranks.len() < 2 {
        return None;
    }
    let hosts = ranks.iter().map(|r| &r.host).collect::<BTreeSet<_>>().len();
    let with_waits: Vec<&RankFigures> = ranks
        .iter()
        .filter(|r| r.collective_samples >= th::STRAGGLER_MIN_SAMPLES)
        .collect();
    let by_waits = (with_waits.len() >= 2)
        .then(|| {
            let s = *with_waits.iter().min_by(|x, y| {
                x.collective_share
                    .unwrap_or(0.0)
                    .total_cmp(&y.collective_share.unwrap_or(0.0))
                    .then(x.rank.cmp(&y.rank))
            })?;
            let others: Vec<&RankFigures> = with_waits
                .iter()
                .copied()
                .filter(|r| r.rank != s.rank || r.host != s.host)
                .collect();
            let med = median(
                others
                    .iter()
                    .map(|r| r.collective_share.unwrap_or(0.0))
                    .collect(),
            )?;
            let own = s.collective_share.unwrap_or(0.0);
            (med >= th::STRAGGLER_MIN_WAIT_SHARE && med - own >= th::STRAGGLER_WAIT_GAP)
                .then_some((s, others))
        })
        .flatten();
    let (method, s, others) = match by_waits {
        Some((s, o)) => (Method::Waits, s, o),
        None => {
            let with_gpu: Vec<&RankFigures> = ranks
                .iter()
                .filter(|r| r.gpu_busy_share.is_some())
                .collect();
            if with_gpu.len() < 2 {
                return None;
            }
            let s = *with_gpu.iter().max_by(|x, y| {
                x.gpu_idle_share()
                    .unwrap_or(0.0)
                    .total_cmp(&y.gpu_idle_share().unwrap_or(0.0))
                    .then(y.rank.cmp(&x.rank))
            })?;
            let others: Vec<&RankFigures> = with_gpu
                .iter()
                .copied()
                .filter(|r| r.rank != s.rank || r.host != s.host)
                .collect();
            let med = median(others.iter().filter_map(|r| r.gpu_idle_share()).collect())?;
            if s.gpu_idle_share().unwrap_or(0.0) - med < th::STRAGGLER_GPU_IDLE_GAP {
                return None;
            }
            (Method::GpuIdle, s, others)
        }
    };
    Some(finding(method, s, &others, hosts))
}

/// One candidate explanation of why the straggler is slow: how far its
/// figure stands out, and the evidence and fix that go with it.
struct Why {
    margin: f64,
    cause: &'static str,
    evidence: String,
    fix: String,
}

fn med_of(others: &[&RankFigures], f: impl Fn(&RankFigures) -> Option<f64>) -> Option<f64> {
    median(others.iter().filter_map(|r| f(r)).collect())
}

fn causes(s: &RankFigures, others: &[&RankFigures], method: Method, name: &str) -> Vec<Why> {
    let mut out = Vec::new();
    let margin = th::STRAGGLER_CAUSE_MARGIN;
    if let (Some(wr), Some(med)) = (
        s.worker_running_share,
        med_of(others, |r| r.worker_running_share),
    ) {
        if wr >= th::STRAGGLER_BUSY_SHARE && wr - med >= margin {
            let cores = |x: Option<f64>| {
                x.map(|c| format!(", {} of a core", pct(c)))
                    .unwrap_or_default()
            };
            out.push(Why {
                margin: wr - med,
                cause: "its input pipeline",
                evidence: format!(
                    "Its input pipeline is behind: {name}'s {} DataLoader worker{} {} running or waiting for a CPU {} of the time{}; the other ranks' workers {}{}.",
                    s.workers,
                    if s.workers == 1 { "" } else { "s" },
                    if s.workers == 1 { "was" } else { "were" },
                    pct(wr),
                    cores(s.worker_cpu_cores),
                    pct(med),
                    cores(med_of(others, |r| r.worker_cpu_cores)),
                ),
                fix: format!(
                    "Give {name}'s input pipeline what the others have: more DataLoader workers or CPU cores on its node (check that no other job shares them), cheaper or offline augmentation; check that the data is split evenly (this rank may get larger or harder samples)."
                ),
            });
        }
    }
    if let Some(med) = med_of(others, |r| Some(r.main_cpu_cores)) {
        let m = s.main_cpu_cores;
        if m >= th::STRAGGLER_BUSY_SHARE && m - med >= margin {
            out.push(Why {
                margin: m - med,
                cause: "work in its main process",
                evidence: format!(
                    "Its main process computes more: {name}'s main thread used {} of a core, the other ranks' {}.",
                    pct(m),
                    pct(med)
                ),
                fix: format!(
                    "Find what {name}'s main process does that the others do not (its flamegraph root is \"{name}: …\"): logging, evaluation or checkpointing done on one rank only, preprocessing in the main process, or a larger share of the data; move it off the training loop or spread it over the ranks."
                ),
            });
        }
    }
    if let (Some(d), Some(med)) = (
        s.input_blocked_share,
        med_of(others, |r| r.input_blocked_share),
    ) {
        if d >= th::IO_D_SHARE && d - med >= margin {
            out.push(Why {
                margin: d - med,
                cause: "storage reads",
                evidence: format!(
                    "Its input waits for storage: {name}'s input threads were blocked on IO (D state) {} of the time, the other ranks' {}.",
                    pct(d),
                    pct(med)
                ),
                fix: format!(
                    "Check the storage {name} reads from (its node's local disk or mount, a network filesystem path): copy the dataset to local NVMe or page cache on that node, or shard it so each node reads locally."
                ),
            });
        }
    }
    if let (Some(t), Some(med), true) = (
        s.gpu_throttled_s,
        med_of(others, |r| r.gpu_throttled_s),
        s.active_s > 0.0,
    ) {
        let share = t / s.active_s;
        let med_share = med / s.active_s;
        if share >= th::MIN_SHARE && share - med_share >= th::MIN_SHARE {
            out.push(Why {
                margin: (share - med_share) * 2.0,
                cause: "a throttled GPU",
                evidence: format!(
                    "Its GPU is held back: {name}'s GPU {:?} was throttled (thermal or power) {t:.1} s while busy, the other ranks' {med:.1} s.",
                    s.gpus
                ),
                fix: format!("Check cooling and power limits of {name}'s GPU (`nvidia-smi -q -d TEMPERATURE,POWER,PERFORMANCE` on {}).", s.host),
            });
        }
    }
    if method == Method::Waits {
        if let (Some(b), Some(med)) = (s.gpu_busy_share, med_of(others, |r| r.gpu_busy_share)) {
            if b - med >= th::STRAGGLER_GPU_IDLE_GAP {
                out.push(Why {
                    margin: b - med,
                    cause: "more GPU work",
                    evidence: format!(
                        "Its GPU works longer: {name}'s GPU was busy {} of the time, the other ranks' {}.",
                        pct(b),
                        pct(med)
                    ),
                    fix: format!("Check that {name} gets the same batch size and sequence lengths as the others, and that its GPU is the same model at the same clocks."),
                });
            }
        }
    }
    out.sort_by(|x, y| y.margin.total_cmp(&x.margin));
    out
}

/// What the collective shares of `s` and `others` are counted from.
fn counted_from(s: &RankFigures, others: &[&RankFigures], hosts: usize) -> String {
    let mut all: Vec<&RankFigures> = std::iter::once(s).chain(others.iter().copied()).collect();
    all.sort_by_key(|r| (r.host.clone(), r.rank));
    let mut parts = Vec::new();
    for (from, text) in [
        (CountedFrom::FirstCollectiveEnd, "from the end of the ranks' first collective"),
        (CountedFrom::FirstCollectiveStart, "from the first sample inside a collective, as no exit from one was sampled early enough: the first collective's start-up skew is included"),
        (CountedFrom::FirstDistributedSample, "from the rank's first sample in distributed code, as no collective was sampled early enough: set-up and start-up skew are included"),
        (CountedFrom::FirstSample, "from the rank's first sample, as it was never sampled in distributed code (none of its time was seen in a collective)"),
        (CountedFrom::RecurringCollective, "over the training loop's steady state, the same stretch of time on every rank: that of the main thread seen most inside its per-step collective, from its first exit from it (or, never seen leaving it, its first look inside) to its last look inside"),
    ] {
        let rs: Vec<&RankFigures> = all
            .iter()
            .copied()
            .filter(|r| r.collective_counted_from.unwrap_or_default() == from)
            .collect();
        if rs.len() == all.len() {
            return format!("time counted {text}");
        }
        if !rs.is_empty() {
            parts.push(format!("for {} {text}", rank_list(&rs, hosts)));
        }
    }
    format!("time counted {}", parts.join("; "))
}

fn finding(method: Method, s: &RankFigures, others: &[&RankFigures], hosts: usize) -> Finding {
    let name = s.name(hosts);
    let n_all = others.len() + 1;
    let mut ev = Vec::new();
    let (lost, basis_text) = match method {
        Method::Waits => {
            let own = s.collective_share.unwrap_or(0.0);
            let mut lost = 0.0;
            let mut each = Vec::new();
            for r in others {
                let l = (r.collective_share.unwrap_or(0.0) - own).max(0.0)
                    * r.collective_sampled_s.unwrap_or(0.0);
                lost += l;
                each.push(format!("{} lost {l:.1} s", r.name(hosts)));
            }
            let med = median(
                others
                    .iter()
                    .map(|r| r.collective_share.unwrap_or(0.0))
                    .collect(),
            )
            .unwrap_or(0.0);
            let mut fns: Vec<&String> = others
                .iter()
                .flat_map(|r| r.collective_functions.iter())
                .collect();
            fns.sort();
            fns.dedup();
            let fns: Vec<String> = fns.iter().take(3).map(|f| format!("`{f}`")).collect();
            let (whose, they) = if others.len() == 1 {
                ("its", "it")
            } else {
                ("their", "they")
            };
            ev.push(format!(
                "{} spent {} of {whose} time inside collective calls ({}), {name} only {}: {they} waited for {name}, {lost:.1} s in all ({}; {}).",
                capitalize(&rank_list(others, hosts)),
                wait_pct(med),
                if fns.is_empty() { "collectives".to_string() } else { fns.join(", ") },
                wait_pct(own),
                each.join(", "),
                counted_from(s, others, hosts),
            ));
            (lost, "the other ranks' time inside collective calls beyond the straggler's own, from stack samples of their main threads: the wall-clock sampler's (blocked threads' native and Python frames, which see DDP's all-reduce inside backward), else py-spy's Python stacks (each sample counts until the thread's next one)")
        }
        Method::GpuIdle => {
            let idle = s.gpu_idle_share().unwrap_or(0.0);
            let med =
                median(others.iter().filter_map(|r| r.gpu_idle_share()).collect()).unwrap_or(0.0);
            let excess = (idle - med).max(0.0) * s.active_s;
            ev.push(format!(
                "{name}'s GPU was idle {} of the time while the other ranks' were idle {}: in synchronous training each of them waits in its collectives for {name}'s extra {excess:.1} s (NCCL waits run on the GPU, so a waiting GPU looks busy).",
                pct(idle),
                pct(med)
            ));
            (excess * others.len() as f64, "the straggler's GPU idle time beyond the other ranks' median, times the number of other ranks (each waits that long in its collectives)")
        }
    };
    let whys = causes(s, others, method, &name);
    let (cause, fix) = match whys.first() {
        Some(w) => {
            ev.push(w.evidence.clone());
            (w.cause.to_string(), w.fix.clone())
        }
        None => {
            ev.push(format!(
                "Its own figures do not say why: main thread {} of a core, workers {} running, input threads blocked {}, GPU {}.",
                pct(s.main_cpu_cores),
                s.worker_running_share.map(pct).unwrap_or_else(|| "—".into()),
                s.input_blocked_share.map(pct).unwrap_or_else(|| "—".into()),
                s.gpu_busy_share.map(|b| format!("busy {}", pct(b))).unwrap_or_else(|| "not measured".into()),
            ));
            (
                "unknown".to_string(),
                format!("Look at {name}'s processes in trace.json and its flamegraph roots (\"{name}: …\") for what it does that the others do not; check its node's CPU, storage and network."),
            )
        }
    };
    for w in whys.iter().skip(1) {
        ev.push(w.evidence.clone());
    }
    if hosts > 1 {
        ev.push(format!("Rank {} ran on {}.", s.rank, s.host));
    }
    let total: f64 = others
        .iter()
        .map(|r| match method {
            Method::Waits => r.collective_sampled_s.unwrap_or(0.0),
            Method::GpuIdle => r.active_s,
        })
        .sum::<f64>()
        .max(1e-9);
    let share = (lost / total).min(1.0);
    CauseRule {
        kind: FindingKind::StragglerRank,
        severity: Severity::from_share(share).max(Severity::Warning),
        title: format!(
            "{} is the straggler: the other {} waited for it (cause: {cause})",
            capitalize(&name),
            if n_all == 2 {
                "rank".to_string()
            } else {
                format!("{} ranks", n_all - 1)
            },
        ),
        gpu_time: Some(GpuTime {
            seconds: lost,
            share,
            basis: Basis::Estimated,
            method: basis_text.to_string(),
        }),
        evidence: ev,
        fix,
    }
    .finding_of(Some(s.rank))
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

/// One line per rank for the summary.
pub fn summary_lines(ranks: &[RankFigures]) -> Vec<String> {
    let hosts = ranks.iter().map(|r| &r.host).collect::<BTreeSet<_>>().len();
    ranks
        .iter()
        .map(|r| {
            let mut parts = vec![format!(
                "pid {}",
                r.pids
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )];
            if let Some(l) = r.local_rank {
                parts.push(format!("local rank {l}"));
            }
            if !r.gpus.is_empty() {
                parts.push(format!(
                    "GPU {}",
                    r.gpus
                        .iter()
                        .map(|g| g.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            match (r.steps_per_s, &r.steps_how) {
                (Some(sps), _) => parts.push(format!("{sps:.2} steps/s")),
                (None, Some(_)) => parts.push("no steps found".into()),
                (None, None) => {}
            }
            parts.push(format!("main thread {} of a core", pct(r.main_cpu_cores)));
            if r.workers > 0 {
                parts.push(format!(
                    "{} worker{}{}",
                    r.workers,
                    if r.workers == 1 { "" } else { "s" },
                    r.worker_running_share
                        .map(|x| format!(" running {}", pct(x)))
                        .unwrap_or_default()
                ));
            }
            if let Some(c) = r.collective_share {
                parts.push(format!(
                    "in collectives {}{}",
                    wait_pct(c),
                    r.collective_functions
                        .first()
                        .map(|f| format!(" (`{f}`)"))
                        .unwrap_or_default()
                ));
            }
            if let Some(b) = r.gpu_busy_share {
                parts.push(format!("GPU busy {}", pct(b)));
            }
            format!("{}: {}.", capitalize(&r.name(hosts)), parts.join(", "))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(r: u32, wait: f64, worker_r: f64) -> RankFigures {
        RankFigures {
            rank: r,
            host: "h".into(),
            pids: vec![100 + r as i32],
            active_s: 10.0,
            main_cpu_cores: 0.2,
            workers: 1,
            worker_cpu_cores: Some(worker_r * 0.8),
            worker_running_share: Some(worker_r),
            input_blocked_share: Some(0.0),
            collective_wait_s: Some(wait * 10.0),
            collective_sampled_s: Some(10.0),
            collective_share: Some(wait),
            collective_samples: 80,
            collective_functions: vec!["all_reduce".into()],
            ..Default::default()
        }
    }

    #[test]
    fn the_rank_that_waits_least_is_the_straggler_with_its_cause() {
        let ranks = vec![rank(0, 0.70, 0.2), rank(1, 0.05, 0.95), rank(2, 0.65, 0.25)];
        let f = straggler(&ranks).expect("a straggler");
        assert_eq!(f.kind, FindingKind::StragglerRank);
        assert_eq!(f.rank, Some(1));
        assert!(
            f.title.starts_with("Rank 1 is the straggler"),
            "{}",
            f.title
        );
        assert!(f.title.contains("input pipeline"), "{}", f.title);
        assert!(
            f.evidence[0].starts_with("Ranks 0 and 2 spent 68%"),
            "{:?}",
            f.evidence
        );
        // Others lost (0.70-0.05)*10 + (0.65-0.05)*10 = 12.5 s of 20 s.
        let g = f.gpu_time.unwrap();
        assert!((g.seconds - 12.5).abs() < 1e-9, "{}", g.seconds);
        assert!((g.share - 0.625).abs() < 1e-9);
        assert_eq!(g.basis, Basis::Estimated);
    }

    #[test]
    fn balanced_ranks_have_no_straggler() {
        let ranks = vec![rank(0, 0.30, 0.5), rank(1, 0.25, 0.5), rank(2, 0.33, 0.5)];
        assert!(straggler(&ranks).is_none());
        // Too few samples to compare: nothing said.
        let mut few = vec![rank(0, 0.7, 0.2), rank(1, 0.05, 0.9)];
        few[1].collective_samples = 3;
        assert!(straggler(&few).is_none());
    }

    #[test]
    fn without_stacks_a_gpu_idle_while_the_others_are_busy_is_the_straggler() {
        let mut ranks: Vec<RankFigures> = (0..4)
            .map(|r| RankFigures {
                rank: r,
                host: if r < 2 { "node-a" } else { "node-b" }.into(),
                active_s: 100.0,
                gpus: vec![r % 2],
                gpu_busy_share: Some(0.9),
                gpu_idle_s: Some(10.0),
                main_cpu_cores: 0.3,
                ..Default::default()
            })
            .collect();
        ranks[3].gpu_busy_share = Some(0.55);
        ranks[3].main_cpu_cores = 0.95;
        let f = straggler(&ranks).expect("a straggler");
        assert_eq!(f.rank, Some(3));
        assert!(
            f.title.contains("rank 3 (node-b)") || f.title.contains("Rank 3 (node-b)"),
            "{}",
            f.title
        );
        assert!(f.title.contains("main process"), "{}", f.title);
        // 35 s of extra idle, waited by each of the 3 others.
        assert!((f.gpu_time.as_ref().unwrap().seconds - 105.0).abs() < 1e-6);
        assert!(f.evidence.iter().any(|e| e.contains("ran on node-b")));
    }
}
