//! Training steps: which intervals were steps, how long each took, and
//! what differed during the slow ones.
//!
//! Where the steps come from, in order of preference (the report says
//! which was used):
//! 1. an NVTX range named with `--step-range`;
//! 2. an NVTX range chosen automatically: a range that repeats on one
//!    thread of a main process and covers most of that thread's time
//!    (a name with "step", "iter" or "batch" first; otherwise the
//!    outermost, descending one level when the outermost repeats too few
//!    times to be steps, e.g. epochs);
//! 3. the GPU's idle gaps, when they recur regularly (one wait per step);
//! 4. the main thread's stacks: a function entered at a regular period.
//!
//! A step runs from the start of its range to the start of the next one
//! (the time between two steps — waiting for data, say — belongs to the
//! step before); the last step ends with its range.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use super::nvtx::NvtxRange;
use super::{Analysis, Role};
use crate::event::{MonoNs, Pid, Tid};
use crate::vocab::nvtx::name_group;

mod by_stacks;
pub mod per_process;

#[cfg(test)]
use by_stacks::{choose_stack_step, step_marker, Run};
use by_stacks::{from_stacks, loop_thread};

/// Steps listed one by one in the analysis at most (the distribution and
/// counts cover all of them).
pub const MAX_STEPS: usize = 1_000_000;
/// Slow steps described in the report at most (slowest first).
pub const MAX_SLOW_LISTED: usize = 20;
/// A step is slow when it takes this many times the median step or more.
pub const SLOW_FACTOR: f64 = 1.5;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Dist {
    pub mean_s: f64,
    pub p50_s: f64,
    pub p90_s: f64,
    pub p95_s: f64,
    pub p99_s: f64,
    pub min_s: f64,
    pub max_s: f64,
}

impl Dist {
    fn of(v: &[f64]) -> Option<Dist> {
        if v.is_empty() {
            return None;
        }
        let mut s = v.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| s[((s.len() - 1) as f64 * p).round() as usize];
        Some(Dist {
            mean_s: s.iter().sum::<f64>() / s.len() as f64,
            p50_s: q(0.5),
            p90_s: q(0.9),
            p95_s: q(0.95),
            p99_s: q(0.99),
            min_s: s[0],
            max_s: s[s.len() - 1],
        })
    }
}

/// One thing that differed during a slow step.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Cause {
    /// `gpu-idle`, `io`, `cpu`, `workers`, `nvtx-range`, `stack`,
    /// `unknown`.
    pub kind: &'static str,
    pub text: String,
    /// The extra time it accounts for, where it is a time.
    pub excess_s: Option<f64>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SlowStep {
    /// 0-based step number in the recording.
    pub index: usize,
    /// Seconds from the start of the recording.
    pub start_s: f64,
    pub duration_s: f64,
    /// Duration / median step.
    pub vs_median: f64,
    pub causes: Vec<Cause>,
}

/// One wait class's time in the loop thread's steps.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StepWait {
    pub class: super::waits::WaitClass,
    /// Seconds per step: median and 90th percentile over the steps.
    pub p50_s: f64,
    pub p90_s: f64,
    /// Its seconds over all the steps' time.
    pub share: f64,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct Steps {
    /// `nvtx-range` (named with --step-range), `nvtx-range-auto`,
    /// `gpu-idle-gaps`, `python-stacks`, or `none`.
    pub method: String,
    /// How the steps were found, in a sentence.
    pub how: String,
    /// The step range (NVTX) or function (stacks).
    pub name: Option<String>,
    pub pid: Option<i32>,
    pub tid: Option<i32>,
    pub count: usize,
    pub steps_per_s: Option<f64>,
    /// Step times (start to next start).
    pub time: Option<Dist>,
    /// Durations of the step ranges themselves (NVTX methods).
    pub range_time: Option<Dist>,
    pub slow_threshold_s: Option<f64>,
    pub slow_count: usize,
    /// E.g. "every 5th step".
    pub slow_pattern: Option<String>,
    /// What differed most often in the slow steps.
    pub slow_causes: Vec<String>,
    pub slow: Vec<SlowStep>,
    pub notes: Vec<String>,
    /// Where the loop thread waited within its steps (the wall-clock
    /// sampler's blocked stretches), per wait class: seconds per step and
    /// the share of all step time. Empty when the thread was not looked at.
    pub waits: Vec<StepWait>,
    /// The steps, in time order (start, end).
    #[serde(skip)]
    pub intervals: Vec<(MonoNs, MonoNs)>,
    /// The thread that ran them (the loop's), where known.
    #[serde(skip)]
    pub loop_thread: Option<(Pid, Tid)>,
}

impl Steps {
    pub fn found(&self) -> bool {
        self.count > 0
    }
}

struct Cand {
    pid: Pid,
    tid: Tid,
    label: String,
    group: String,
    level: u32,
    ranges: Vec<(MonoNs, MonoNs)>,
    main: bool,
}

impl Cand {
    fn coverage(&self) -> f64 {
        let first = self.ranges.first().map(|r| r.0 .0).unwrap_or(0);
        let last = self.ranges.iter().map(|r| r.1 .0).max().unwrap_or(0);
        let span = last.saturating_sub(first) as f64;
        if span <= 0.0 {
            return 0.0;
        }
        self.ranges
            .iter()
            .map(|r| r.1 .0.saturating_sub(r.0 .0) as f64)
            .sum::<f64>()
            / span
    }
    /// Share of ranges that start before the previous one ended.
    fn overlap(&self) -> f64 {
        let mut n = 0;
        for w in self.ranges.windows(2) {
            if w[1].0 < w[0].1 {
                n += 1;
            }
        }
        n as f64 / self.ranges.len().max(1) as f64
    }
}

fn step_like(group: &str) -> bool {
    let g = group.to_ascii_lowercase();
    (g.contains("step") || g.contains("iter") || g.contains("batch")) && !g.contains("epoch")
}

/// Candidate step ranges: per thread, domain and name group.
fn candidates(a: &Analysis) -> Vec<Cand> {
    let n = &a.nvtx;
    let mut by: BTreeMap<(Pid, Tid, u32, String), Cand> = BTreeMap::new();
    let mut groups: HashMap<u32, String> = HashMap::new();
    for r in &n.ranges {
        let g = groups
            .entry(r.name)
            .or_insert_with(|| name_group(n.name(r.name)))
            .clone();
        let label = if n.domain(r.dom).is_empty() {
            g.clone()
        } else {
            format!("{}: {g}", n.domain(r.dom))
        };
        let c = by
            .entry((r.pid, r.tid, r.dom, g.clone()))
            .or_insert_with(|| Cand {
                pid: r.pid,
                tid: r.tid,
                label,
                group: g,
                level: r.lvl,
                ranges: Vec::new(),
                main: a
                    .processes
                    .get(&r.pid)
                    .map_or(r.pid == a.header.job_pid, |p| p.role == Role::Main),
            });
        c.level = c.level.min(r.lvl);
        c.ranges.push((r.start, r.end));
    }
    let mut v: Vec<Cand> = by.into_values().collect();
    for c in &mut v {
        c.ranges.sort();
    }
    v
}

/// Does `r` match the name the user gave?
fn matches(given: &str, c: &Cand, n: &super::nvtx::NvtxAnalysis, r: &NvtxRange) -> bool {
    let raw = n.name(r.name);
    raw == given || c.group == given || c.label == given || c.group == name_group(given)
}

fn choose_nvtx(
    a: &Analysis,
    given: Option<&str>,
    only: Option<Pid>,
    notes: &mut Vec<String>,
) -> Option<(Cand, bool)> {
    let mut cands = candidates(a);
    cands.retain(|c| only.map_or(true, |p| c.pid == p));
    if let Some(name) = given {
        // The thread where the named range repeats most.
        let n = &a.nvtx;
        let best = cands
            .iter()
            .filter(|c| {
                n.ranges
                    .iter()
                    .find(|r| {
                        r.pid == c.pid && r.tid == c.tid && name_group(n.name(r.name)) == c.group
                    })
                    .is_some_and(|r| matches(name, c, n, r))
            })
            .max_by_key(|c| (c.main, c.ranges.len(), std::cmp::Reverse(c.pid)))
            .map(|c| (c.pid, c.tid, c.label.clone()));
        match best {
            Some(k) => {
                let c = cands
                    .into_iter()
                    .find(|c| (c.pid, c.tid, c.label.clone()) == k)?;
                return Some((c, true));
            }
            None => {
                let mut names: Vec<String> = n
                    .groups
                    .iter()
                    .take(8)
                    .map(|g| format!("`{}`", g.name))
                    .collect();
                names.dedup();
                notes.push(if names.is_empty() {
                    format!("--step-range `{name}`: the job recorded no NVTX range; steps were looked for in the rest of the recording.")
                } else {
                    format!(
                        "--step-range `{name}`: no NVTX range has this name (ranges seen: {}); steps were chosen automatically.",
                        names.join(", ")
                    )
                });
            }
        }
    }
    let mut ok: Vec<Cand> = cands
        .into_iter()
        .filter(|c| c.ranges.len() >= 3 && c.overlap() <= 0.1)
        .collect();
    if ok.iter().any(|c| c.main) {
        ok.retain(|c| c.main);
    }
    let better = |x: &Cand, y: &Cand| -> std::cmp::Ordering {
        // Higher coverage, then more ranges, then lower pid/tid (stable).
        x.coverage()
            .total_cmp(&y.coverage())
            .then(x.ranges.len().cmp(&y.ranges.len()))
            .then(y.pid.cmp(&x.pid))
            .then(y.tid.cmp(&x.tid))
    };
    // 1. Named like a step.
    let named: Vec<&Cand> = ok.iter().filter(|c| step_like(&c.group)).collect();
    if let Some(min_lvl) = named.iter().map(|c| c.level).min() {
        let pick = named
            .iter()
            .filter(|c| c.level == min_lvl)
            .max_by(|x, y| better(x, y))
            .map(|c| (c.pid, c.tid, c.label.clone()));
        if let Some(k) = pick {
            let i = ok
                .iter()
                .position(|c| (c.pid, c.tid, c.label.clone()) == k)?;
            return Some((ok.swap_remove(i), false));
        }
    }
    // 2. The outermost range that repeats (at least 5 times), covering
    //    most of its thread's time; one level down when the outermost
    //    repeats too few times to be steps (epochs).
    for lvl in 0..4u32 {
        let pick = ok
            .iter()
            .filter(|c| c.level == lvl && c.ranges.len() >= 5 && c.coverage() >= 0.3)
            .max_by(|x, y| better(x, y))
            .map(|c| (c.pid, c.tid, c.label.clone()));
        if let Some(k) = pick {
            let i = ok
                .iter()
                .position(|c| (c.pid, c.tid, c.label.clone()) == k)?;
            return Some((ok.swap_remove(i), false));
        }
        if !ok.iter().any(|c| c.level == lvl) {
            break;
        }
    }
    None
}

fn intervals_from_starts(ranges: &[(MonoNs, MonoNs)]) -> Vec<(MonoNs, MonoNs)> {
    let mut out = Vec::with_capacity(ranges.len());
    for (i, r) in ranges.iter().enumerate() {
        let end = ranges.get(i + 1).map(|n| n.0).unwrap_or(r.1);
        out.push((r.0, end.max(r.0)));
    }
    out
}

/// Share of `v` within [0.6, 1.6] × its median: how regular a spacing is,
/// robust to the occasional slow step (which is what we look for).
fn regularity(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    let m = median(&mut s);
    if m <= 0.0 || v.is_empty() {
        return 0.0;
    }
    v.iter()
        .filter(|x| **x >= 0.6 * m && **x <= 1.6 * m)
        .count() as f64
        / v.len() as f64
}

/// Spacings regular enough to be steps.
const MIN_REGULARITY: f64 = 0.75;

/// The share of spacings within ×1.6 of the one before: steps whose rate
/// drifts (another tenant's load comes or goes, the job's data changes)
/// keep each spacing near its neighbours while the run's median fits only
/// part of them. Noise does not.
fn local_regularity(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    v.windows(2)
        .filter(|w| w[0] > 0.0 && w[1] >= w[0] / 1.6 && w[1] <= w[0] * 1.6)
        .count() as f64
        / (v.len() - 1) as f64
}

/// Spacings of a drifting rate: nearly every one near its neighbours.
const MIN_LOCAL_REGULARITY: f64 = 0.85;

fn cv(v: &[f64]) -> f64 {
    let m = v.iter().sum::<f64>() / v.len().max(1) as f64;
    if m <= 0.0 {
        return f64::INFINITY;
    }
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len().max(1) as f64;
    var.sqrt() / m
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Steps from the GPU's idle gaps: one gap per step, recurring regularly.
fn from_gpu_gaps(a: &Analysis) -> Option<(Vec<(MonoNs, MonoNs)>, String)> {
    let mut gaps: Vec<(MonoNs, MonoNs)> = a
        .gpu
        .idle_intervals()
        .into_iter()
        .filter(|g| g.0 >= a.start && g.1 <= a.end)
        .collect();
    if gaps.len() < 6 {
        return None;
    }
    // Start-up and shutdown idle are not steps.
    let mut durs: Vec<f64> = gaps.iter().map(|g| g.1.secs_since(g.0)).collect();
    let med = median(&mut durs);
    if gaps
        .first()
        .is_some_and(|g| g.1.secs_since(g.0) > 5.0 * med)
    {
        gaps.remove(0);
    }
    if gaps.last().is_some_and(|g| g.1.secs_since(g.0) > 5.0 * med) {
        gaps.pop();
    }
    if gaps.len() < 6 {
        return None;
    }
    let (iv, merged) = gap_steps(&gaps);
    let periods: Vec<f64> = iv.iter().map(|w| w.1.secs_since(w.0)).collect();
    if regularity(&periods) < MIN_REGULARITY && local_regularity(&periods) < MIN_LOCAL_REGULARITY {
        return None;
    }
    let res = a
        .gpu
        .devices
        .iter()
        .map(|d| d.resolution_ns)
        .max()
        .unwrap_or(0) as f64
        / 1e6;
    Some((
        iv,
        format!(
            "estimated from the GPU's idle gaps, which recur every {:.0} ms on average (one wait per step; NVML resolution {res:.0} ms): steps run from one gap's start to the next{}",
            periods.iter().sum::<f64>() / periods.len() as f64 * 1e3,
            if merged > 0 {
                format!("; {merged} stretch(es) with no gap seen, as long as several steps, after an ordinary gap, are counted as that many equal steps (the GPU went from one step to the next without a gap the driver's samples could show)")
            } else {
                String::new()
            }
        ),
    ))
}

/// The GPU's busy stretch between two ordinary idle gaps can hold several
/// steps: the next batch was ready (prefetched) and the GPU went straight
/// on, or the gap between them was shorter than one driver sample (a 300 ms
/// gap holds no whole 167 ms sample in one case in five). Such a period
/// lasts a whole number of typical periods. A slow step looks different:
/// its gap (the wait for its input) is longer, so a period is split only
/// when the gap that starts it is ordinary.
const MAX_STEPS_PER_STRETCH: f64 = 4.0;
/// How close to a whole number of typical periods a stretch must be.
const STRETCH_TOLERANCE: f64 = 0.2;

/// The number of typical periods `med` that a period `p` spans, when it is
/// 2 to [`MAX_STEPS_PER_STRETCH`] of them (within [`STRETCH_TOLERANCE`]):
/// steps run together, whose boundaries were not seen.
fn whole_periods(p: f64, med: f64) -> Option<f64> {
    let k = (p / med.max(1e-9)).round();
    ((2.0..=MAX_STEPS_PER_STRETCH).contains(&k) && (p - k * med).abs() <= STRETCH_TOLERANCE * med)
        .then_some(k)
}

/// Steps from the gaps' starts: one per period, or k equal ones where a
/// period spans k typical periods (see above); and how many periods were
/// split.
fn gap_steps(gaps: &[(MonoNs, MonoNs)]) -> (Vec<(MonoNs, MonoNs)>, usize) {
    let mut periods: Vec<f64> = gaps.windows(2).map(|w| w[1].0.secs_since(w[0].0)).collect();
    let med = median(&mut periods);
    let mut durs: Vec<f64> = gaps.iter().map(|g| g.1.secs_since(g.0)).collect();
    let med_gap = median(&mut durs);
    let mut out = Vec::new();
    let mut merged = 0;
    for w in gaps.windows(2) {
        let (from, to) = (w[0].0, w[1].0);
        let ordinary_gap = w[0].1.secs_since(w[0].0) <= 1.6 * med_gap;
        if let Some(k) = whole_periods(to.secs_since(from), med).filter(|_| ordinary_gap) {
            merged += 1;
            let step = (to.0 - from.0) / k as u64;
            for i in 0..k as u64 {
                let a = MonoNs(from.0 + i * step);
                let b = if i + 1 == k as u64 {
                    to
                } else {
                    MonoNs(a.0 + step)
                };
                out.push((a, b));
            }
        } else {
            out.push((from, to));
        }
    }
    (out, merged)
}

/// Figures of one interval, compared between slow and typical steps.
#[derive(Clone, Debug, Default)]
struct Metrics {
    gpu_idle_s: Option<f64>,
    read_b: f64,
    write_b: f64,
    io_wait_s: f64,
    main_cpu_s: f64,
    worker_cpu_s: f64,
    workers_started: usize,
    workers_exited: usize,
    ranges: HashMap<String, f64>,
    /// Sampled CPU time of the loop thread under each frame (once per
    /// sample), and in all.
    frames: HashMap<String, f64>,
    sampled_s: f64,
    /// Seconds the loop thread was blocked, per wait class.
    waits: HashMap<String, f64>,
}

fn overlap(iv: &[(MonoNs, MonoNs)], s: MonoNs, e: MonoNs) -> f64 {
    let i = iv.partition_point(|g| g.1 <= s);
    iv[i..]
        .iter()
        .take_while(|g| g.0 < e)
        .map(|g| g.1.min(e).0.saturating_sub(g.0.max(s).0) as f64 / 1e9)
        .sum()
}

struct Context<'a> {
    a: &'a Analysis,
    idle: Option<Vec<(MonoNs, MonoNs)>>,
    pid: Option<Pid>,
    step_group: Option<String>,
    ranges_on_thread: Vec<&'a NvtxRange>,
    samples: Vec<&'a super::stacks::Sample>,
    /// The loop thread's blocked stretches (wall-clock sampler).
    wait_runs: &'a [super::waits::WaitRun],
}

impl Context<'_> {
    fn metrics(&self, s: MonoNs, e: MonoNs) -> Metrics {
        let a = self.a;
        let dur = e.secs_since(s).max(0.0);
        let mut m = Metrics {
            gpu_idle_s: self.idle.as_ref().map(|iv| overlap(iv, s, e)),
            ..Default::default()
        };
        for p in a.processes.values() {
            let (from, to) = p.lifetime(a.end);
            if to <= s || from >= e {
                if p.role == Role::Worker && p.exited.is_some_and(|x| x >= s && x < e) {
                    m.workers_exited += 1;
                }
                continue;
            }
            m.read_b += p.read_bps.mean_in(s, e).unwrap_or(0.0) * dur;
            m.write_b += p.write_bps.mean_in(s, e).unwrap_or(0.0) * dur;
            let cpu = p.cpu.mean_in(s, e).unwrap_or(0.0) * dur;
            if Some(p.pid) == self.pid {
                m.main_cpu_s += cpu;
            } else if p.role == Role::Worker {
                m.worker_cpu_s += cpu;
            }
            if p.role == Role::Worker {
                if p.first_seen >= s && p.first_seen < e && p.first_seen > a.start {
                    m.workers_started += 1;
                }
                if p.exited.is_some_and(|x| x >= s && x < e) {
                    m.workers_exited += 1;
                }
            }
            for th in p.threads.values() {
                // A merged run (long recordings) holds D for a share of it.
                for run in th.state_runs.iter().filter(|r| r.d_ns > 0) {
                    let (f, t) = (run.from, run.to);
                    if t > s && f < e {
                        m.io_wait_s +=
                            t.min(e).0.saturating_sub(f.max(s).0) as f64 / 1e9 * run.share('D');
                    }
                }
            }
        }
        let i = self.ranges_on_thread.partition_point(|r| r.start < s);
        for r in self.ranges_on_thread[i..]
            .iter()
            .take_while(|r| r.start < e)
        {
            let g = name_group(a.nvtx.name(r.name));
            if Some(&g) == self.step_group.as_ref() {
                continue;
            }
            *m.ranges
                .entry(a.nvtx.label(r).replace(a.nvtx.name(r.name), &g))
                .or_default() += r.end.min(e).secs_since(r.start).max(0.0);
        }
        for (class, secs) in wait_overlap(self.wait_runs, s, e) {
            m.waits.insert(class.label().to_string(), secs);
        }
        let period = a.stacks.period_ns as f64 / 1e9;
        if period > 0.0 {
            let j = self.samples.partition_point(|x| x.t < s);
            // The Python view, as the flamegraphs show it: the program's
            // functions and the libraries' native frames, without the
            // interpreter's.
            for x in self.samples[j..].iter().take_while(|x| x.t < e) {
                let w = period * x.weight as f64;
                m.sampled_s += w;
                let mut seen = BTreeSet::new();
                for f in a.stacks.stack(x.py_stack) {
                    if seen.insert(f) {
                        *m.frames.entry(f.to_string()).or_default() += w;
                    }
                }
            }
        }
        m
    }
}

/// Seconds of each wait class in [s, e) of a thread's blocked stretches.
fn wait_overlap(
    runs: &[super::waits::WaitRun],
    s: MonoNs,
    e: MonoNs,
) -> BTreeMap<super::waits::WaitClass, f64> {
    let mut out = BTreeMap::new();
    let i = runs.partition_point(|r| r.to <= s);
    for r in runs[i..].iter().take_while(|r| r.from < e) {
        *out.entry(r.class).or_default() +=
            r.to.min(e).0.saturating_sub(r.from.max(s).0) as f64 / 1e9;
    }
    out
}

/// The blocked stretches of a thread the wall-clock sampler looked at.
fn wait_runs_of(a: &Analysis, pt: Option<(Pid, Tid)>) -> &[super::waits::WaitRun] {
    pt.and_then(|(p, t)| a.waits.thread(p, t))
        .map_or(&[], |w| w.runs.as_slice())
}

/// The loop thread's waits over the steps `iv`, per class (see
/// [`Steps::waits`]).
fn step_waits(runs: &[super::waits::WaitRun], iv: &[(MonoNs, MonoNs)]) -> Vec<StepWait> {
    if runs.is_empty() || iv.is_empty() {
        return Vec::new();
    }
    let total: f64 = iv.iter().map(|x| x.1.secs_since(x.0).max(0.0)).sum();
    let mut per: BTreeMap<super::waits::WaitClass, Vec<f64>> = BTreeMap::new();
    for (k, (s, e)) in iv.iter().enumerate() {
        for (class, secs) in wait_overlap(runs, *s, *e) {
            // Steps without this class count as 0 s of it.
            per.entry(class).or_insert_with(|| vec![0.0; iv.len()])[k] = secs;
        }
    }
    let mut out: Vec<StepWait> = per
        .into_iter()
        .filter_map(|(class, v)| {
            let d = Dist::of(&v)?;
            Some(StepWait {
                class,
                p50_s: d.p50_s,
                p90_s: d.p90_s,
                share: if total > 0.0 {
                    v.iter().sum::<f64>() / total
                } else {
                    0.0
                },
            })
        })
        .collect();
    out.sort_by(|a, b| b.share.total_cmp(&a.share));
    out
}

fn mb(b: f64) -> String {
    crate::units::bytes(b)
}

fn med_of(v: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.collect();
    median(&mut v)
}

/// A slow step's figures against the typical steps': the typical value of
/// a figure (the median over the typical steps) and whether a difference
/// is big enough to count (a quarter of the step's excess time).
struct Against<'a> {
    typical: &'a [Metrics],
    excess: f64,
}

impl Against<'_> {
    fn typical(&self, f: impl Fn(&Metrics) -> f64) -> f64 {
        med_of(self.typical.iter().map(f))
    }

    fn big(&self, x: f64) -> bool {
        x >= 0.25 * self.excess && x > 0.0
    }

    /// Per key of a per-name figure (NVTX ranges, frames): (slow minus
    /// typical, key, slow, typical).
    fn by_key<'m>(
        &self,
        slow: &'m HashMap<String, f64>,
        of: impl Fn(&Metrics) -> &HashMap<String, f64>,
    ) -> Vec<(f64, &'m String, f64, f64)> {
        slow.iter()
            .map(|(k, v)| {
                let tv = self.typical(|x| of(x).get(k).copied().unwrap_or(0.0));
                (v - tv, k, *v, tv)
            })
            .collect()
    }
}

/// What differed during one slow step (from `s` to `e`), compared with
/// the typical step.
fn causes(
    ctx: &Context,
    m: &Metrics,
    typical: &[Metrics],
    excess: f64,
    (s, e): (MonoNs, MonoNs),
) -> Vec<Cause> {
    let vs = Against { typical, excess };
    let mut out: Vec<Cause> = Vec::new();
    out.extend(gpu_idle_cause(m, &vs));
    out.extend(worker_cause(m, &vs));
    out.extend(io_cause(m, &vs));
    out.extend(cpu_causes(m, &vs));
    out.extend(range_causes(m, &vs));
    out.extend(wait_cause(m, &vs));
    out.extend(stack_cause(ctx, m, &vs, s, e));
    if out.is_empty() {
        out.push(Cause {
            kind: "unknown",
            text: "nothing measured differed from a typical step (GPU, IO, CPU, workers, ranges); look at this step in trace.json".into(),
            excess_s: None,
        });
    }
    out
}

fn gpu_idle_cause(m: &Metrics, vs: &Against) -> Option<Cause> {
    let idle = m.gpu_idle_s?;
    let ti = vs.typical(|x| x.gpu_idle_s.unwrap_or(0.0));
    vs.big(idle - ti).then(|| Cause {
        kind: "gpu-idle",
        text: format!("the GPU was idle {idle:.2} s (typical step {ti:.2} s)"),
        excess_s: Some(idle - ti),
    })
}

fn worker_cause(m: &Metrics, vs: &Against) -> Option<Cause> {
    let started = m.workers_started;
    if started > 0 && vs.typical(|x| x.workers_started as f64) < 0.5 {
        Some(Cause {
            kind: "workers",
            text: format!(
                "{started} input worker process(es) started during this step (none in a typical step): workers were (re)created — with PyTorch, `persistent_workers=True` keeps DataLoader workers between epochs"
            ),
            excess_s: None,
        })
    } else if m.workers_exited > 0 && vs.typical(|x| x.workers_exited as f64) < 0.5 {
        Some(Cause {
            kind: "workers",
            text: format!(
                "{} input worker process(es) exited during this step",
                m.workers_exited
            ),
            excess_s: None,
        })
    } else {
        None
    }
}

fn io_cause(m: &Metrics, vs: &Against) -> Option<Cause> {
    let (tr, tw, td) = (
        vs.typical(|x| x.read_b),
        vs.typical(|x| x.write_b),
        vs.typical(|x| x.io_wait_s),
    );
    let io_wait = m.io_wait_s - td;
    let read_more = m.read_b - tr >= 1e6 && m.read_b > 2.0 * tr;
    let write_more = m.write_b - tw >= 1e6 && m.write_b > 2.0 * tw;
    if !(read_more || write_more || vs.big(io_wait)) {
        return None;
    }
    let mut parts = Vec::new();
    if read_more {
        parts.push(format!("read {} (typical step {})", mb(m.read_b), mb(tr)));
    }
    if write_more {
        parts.push(format!("wrote {} (typical step {})", mb(m.write_b), mb(tw)));
    }
    if vs.big(io_wait) {
        parts.push(format!(
            "threads waited on IO (D state) {:.2} s (typical {td:.2} s)",
            m.io_wait_s
        ));
    }
    Some(Cause {
        kind: "io",
        text: format!("IO: the job {}", parts.join(", ")),
        excess_s: vs.big(io_wait).then_some(io_wait),
    })
}

/// The CPU of the step's process and of the input workers, each when it
/// was well above a typical step's.
fn cpu_causes(m: &Metrics, vs: &Against) -> Vec<Cause> {
    let tc = vs.typical(|x| x.main_cpu_s);
    let twc = vs.typical(|x| x.worker_cpu_s);
    [
        (m.main_cpu_s, tc, "the step's process"),
        (m.worker_cpu_s, twc, "input workers"),
    ]
    .into_iter()
    .filter(|(v, t, _)| vs.big(v - t))
    .map(|(v, t, who)| Cause {
        kind: "cpu",
        text: format!("CPU: {who} used {v:.2} CPU-s (typical step {t:.2})"),
        excess_s: Some(v - t),
    })
    .collect()
}

/// NVTX ranges inside the step that took longer than usual (the two that
/// took the most extra time).
fn range_causes(m: &Metrics, vs: &Against) -> Vec<Cause> {
    let mut rs = vs.by_key(&m.ranges, |x| &x.ranges);
    rs.retain(|x| vs.big(x.0));
    rs.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(y.1)));
    rs.into_iter()
        .take(2)
        .map(|(ex, k, v, tv)| Cause {
            kind: "nvtx-range",
            text: if tv > 0.0 {
                format!("range `{k}` took {v:.2} s (typical step {tv:.2} s)")
            } else {
                format!("range `{k}` took {v:.2} s (not in a typical step)")
            },
            excess_s: Some(ex),
        })
        .collect()
}

/// The wait class in which the loop thread spent the most extra time,
/// when that is a big share of the step's excess.
fn wait_cause(m: &Metrics, vs: &Against) -> Option<Cause> {
    let mut ws = vs.by_key(&m.waits, |x| &x.waits);
    ws.retain(|x| vs.big(x.0));
    ws.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(y.1)));
    let (ex, class, v, tv) = ws.into_iter().next()?;
    let phrase = super::waits::WaitClass::ALL
        .iter()
        .find(|c| c.label() == class)
        .map_or("blocked", |c| c.phrase());
    Some(Cause {
        kind: "wait",
        text: format!("the loop thread waited {v:.2} s {phrase} (typical step {tv:.2} s)"),
        excess_s: Some(ex),
    })
}

/// Functions on the loop thread specific to the slow step: the outermost
/// and the innermost frames that account for most of the extra time.
fn stack_cause(ctx: &Context, m: &Metrics, vs: &Against, s: MonoNs, e: MonoNs) -> Option<Cause> {
    let mut fs = specific_frames(m, vs);
    // Depth order: a frame's position in the step's first stack that holds it.
    let j = ctx.samples.partition_point(|x| x.t < s);
    let step = &ctx.samples[j..ctx.samples.partition_point(|x| x.t < e).max(j)];
    let depth = |f: &str| -> usize {
        step.iter()
            .find_map(|x| ctx.a.stacks.stack(x.py_stack).position(|n| n == f))
            .unwrap_or(usize::MAX)
    };
    fs.sort_by_cached_key(|x| (depth(x.1), x.1.clone()));
    let (outer, inner) = (fs.first()?, fs.last()?);
    let text = if outer.1 == inner.1 {
        format!(
            "the loop thread was in `{}` for ~{:.2} s (typical step {:.2} s)",
            outer.1, outer.2, outer.3
        )
    } else {
        format!(
            "the loop thread was in `{}` → … → `{}` for ~{:.2} s (typical step {:.2} s)",
            outer.1, inner.1, outer.2, outer.3
        )
    };
    Some(Cause {
        kind: "stack",
        text,
        excess_s: Some(outer.0),
    })
}

/// The frames of the slow step's loop thread that account for most of its
/// extra time and are rare in a typical step, as [`Against::by_key`] gives
/// them; none when no frame took a big share of the extra time.
fn specific_frames<'m>(m: &'m Metrics, vs: &Against) -> Vec<(f64, &'m String, f64, f64)> {
    let mut fs = vs.by_key(&m.frames, |x| &x.frames);
    let max_ex = fs.iter().map(|x| x.0).fold(0.0, f64::max);
    if !vs.big(max_ex) {
        return Vec::new();
    }
    // The loop's trunk (`main`, the training loop's function) is under
    // nearly every sample of the slow step and of the typical steps alike:
    // when the typical steps barely compute, its median there is ~0 and it
    // would pass for the slow step's own. Steps without samples tell
    // nothing about it.
    let typical_sampled: f64 = vs.typical.iter().map(|x| x.sampled_s).sum();
    let trunk = |k: &String| {
        let typical: f64 = vs
            .typical
            .iter()
            .map(|x| x.frames.get(k).copied().unwrap_or(0.0))
            .sum();
        typical_sampled > 0.0
            && m.frames.get(k).copied().unwrap_or(0.0) >= 0.9 * m.sampled_s
            && typical >= 0.9 * typical_sampled
    };
    fs.retain(|x| x.0 >= 0.6 * max_ex && x.3 <= 0.25 * x.2 && !trunk(x.1));
    fs
}

fn ordinal(k: usize) -> String {
    let suffix = match (k % 10, k % 100) {
        (1, x) if x != 11 => "st",
        (2, x) if x != 12 => "nd",
        (3, x) if x != 13 => "rd",
        _ => "th",
    };
    format!("{k}{suffix}")
}

/// "every 5th step" when the slow steps (sorted indices among the steps
/// `range` examined) recur at a fixed stride; "mostly every 5th step" when
/// at least three quarters of them do and the rest are strays (a noisy host
/// makes one more step slow, anywhere in the run). The stride's steps over
/// the whole range must all be slow but for at most one in five: three
/// slow steps 5 apart in a run of a thousand are no pattern.
fn pattern(idx: &[usize], range: std::ops::Range<usize>) -> Option<String> {
    if idx.len() < 3 {
        return None;
    }
    // Candidate strides: the most common distances to the next few slow
    // steps (a stray between two periodic ones hides the stride from the
    // next-neighbour distance). Eight candidates keep this linear however
    // many steps are slow.
    let mut dist: HashMap<usize, usize> = HashMap::new();
    for (i, a) in idx.iter().enumerate() {
        for b in &idx[i + 1..idx.len().min(i + 4)] {
            if b - a >= 2 {
                *dist.entry(b - a).or_default() += 1;
            }
        }
    }
    let mut cands: Vec<(usize, usize)> = dist.into_iter().collect();
    cands.sort_by_key(|&(k, n)| (std::cmp::Reverse(n), k));
    // Best chain: most members, then fewest missing, then smallest stride.
    use std::cmp::Reverse;
    let mut best = None;
    for &(k, _) in cands.iter().take(8) {
        let mut classes: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &i in idx {
            classes.entry(i % k).or_default().push(i);
        }
        for (&r, m) in &classes {
            // Steps of this residue class in the range.
            let upto = |x: usize| if x > r { (x - r - 1) / k + 1 } else { 0 };
            let slots = upto(range.end) - upto(range.start);
            let missing = slots.saturating_sub(m.len());
            if m.len() < 3 || missing * 4 > m.len() {
                continue;
            }
            let key = (m.len(), Reverse(missing), Reverse(k));
            if best.map_or(true, |(b, _)| key > b) {
                best = Some((key, m[0]));
            }
        }
    }
    let ((members, Reverse(missing), Reverse(k)), first) = best?;
    if members == idx.len() && missing == 0 {
        Some(format!(
            "every {} step (steps {}, {}, …)",
            ordinal(k),
            first,
            first + k
        ))
    } else if members * 4 >= idx.len() * 3 {
        Some(format!("mostly every {} step", ordinal(k)))
    } else {
        None
    }
}
/// Why the `slow` steps (indices into `iv`, whose durations are `durs`)
/// took longer than the median `med`: each compared with up to 300
/// typical steps, on the loop thread (`thread`, else [`loop_thread`]).
/// The slowest listed, and the kinds of cause seen most often.
fn examine_slow(
    a: &Analysis,
    iv: &[(MonoNs, MonoNs)],
    durs: &[f64],
    med: f64,
    slow: &[usize],
    (pid, tid): (Option<Pid>, Option<Tid>),
    step_group: Option<String>,
) -> (Vec<SlowStep>, Vec<String>) {
    let mut listed = Vec::new();
    let measured = a.gpu.available && !a.gpu.devices.is_empty();
    let loop_pt = match (pid, tid) {
        (Some(p), Some(t)) => Some((p, t)),
        _ => loop_thread(a, None),
    };
    let mut ranges_on_thread: Vec<&NvtxRange> = match loop_pt {
        Some((p, t)) => a
            .nvtx
            .ranges
            .iter()
            .filter(|r| r.pid == p && r.tid == t)
            .collect(),
        None => Vec::new(),
    };
    ranges_on_thread.sort_by_key(|r| r.start);
    let samples = match loop_pt {
        Some((p, t)) => a
            .stacks
            .samples
            .iter()
            .filter(|s| s.pid == p && s.tid == t)
            .collect(),
        None => Vec::new(),
    };
    let ctx = Context {
        a,
        idle: measured.then(|| a.gpu.idle_intervals()),
        pid: loop_pt.map(|x| x.0),
        step_group,
        ranges_on_thread,
        samples,
        wait_runs: wait_runs_of(a, loop_pt),
    };
    // Typical steps: up to 300 of the others, evenly spread.
    let normal: Vec<usize> = (0..iv.len()).filter(|i| !slow.contains(i)).collect();
    let stride = normal.len().div_ceil(300).max(1);
    let typical: Vec<Metrics> = normal
        .iter()
        .step_by(stride)
        .map(|&i| ctx.metrics(iv[i].0, iv[i].1))
        .collect();
    let mut order = slow.to_vec();
    order.sort_by(|x, y| durs[*y].total_cmp(&durs[*x]).then(x.cmp(y)));
    let mut kinds: BTreeMap<&'static str, (usize, String)> = BTreeMap::new();
    for &i in order.iter().take(MAX_SLOW_LISTED.max(50)) {
        let m = ctx.metrics(iv[i].0, iv[i].1);
        let cs = causes(&ctx, &m, &typical, durs[i] - med, iv[i]);
        // A step counts once per kind: it may have two of one kind
        // (the CPU of the main process and of the workers).
        let mut counted = BTreeSet::new();
        for c in &cs {
            let e = kinds.entry(c.kind).or_insert((0, c.text.clone()));
            if counted.insert(c.kind) {
                e.0 += 1;
            }
        }
        if listed.len() < MAX_SLOW_LISTED {
            listed.push(SlowStep {
                index: i,
                start_s: a.rel_s(iv[i].0),
                duration_s: durs[i],
                vs_median: durs[i] / med,
                causes: cs,
            });
        }
    }
    let examined = order.len().min(MAX_SLOW_LISTED.max(50));
    let mut ks: Vec<(&&str, &(usize, String))> = kinds.iter().collect();
    ks.sort_by(|x, y| y.1 .0.cmp(&x.1 .0).then(x.0.cmp(y.0)));
    let common = ks
        .into_iter()
        .take(3)
        .map(|(_, (n, text))| format!("{text} — in {n} of {examined} slow steps examined"))
        .collect();
    (listed, common)
}

/// Find the steps of the recording and analyse the slow ones.
pub fn analyze(a: &Analysis, step_range: Option<&str>) -> Steps {
    let mut notes = Vec::new();
    let mut steps = Steps::default();
    let mut range_durs: Option<Vec<f64>> = None;
    let mut step_group = None;
    let (iv, method, how, name, pid, tid) = if let Some((c, given)) =
        choose_nvtx(a, step_range, None, &mut notes)
    {
        let iv = intervals_from_starts(&c.ranges);
        range_durs = Some(c.ranges.iter().map(|r| r.1.secs_since(r.0)).collect());
        step_group = Some(c.group.clone());
        let how = if given {
            format!(
                "NVTX range `{}` named with --step-range, on thread {} of process {}",
                c.label, c.tid, c.pid
            )
        } else {
            format!(
                "NVTX range `{}` chosen automatically: it repeats {} times on thread {} of process {} (nesting level {}) and covers {:.0}% of the time from its first start to its last end; name another with --step-range",
                c.label,
                c.ranges.len(),
                c.tid,
                c.pid,
                c.level,
                c.coverage() * 100.0
            )
        };
        let method = if given {
            "nvtx-range"
        } else {
            "nvtx-range-auto"
        };
        (iv, method, how, Some(c.label), Some(c.pid), Some(c.tid))
    } else if let Some((iv, how)) = from_gpu_gaps(a) {
        (iv, "gpu-idle-gaps", how, None, None, None)
    } else if let Some((iv, how, f, pid, tid)) = from_stacks(a, None) {
        (iv, "python-stacks", how, Some(f), Some(pid), Some(tid))
    } else {
        steps.method = "none".into();
        steps.how = "no steps found: no repeating NVTX range, no regular GPU idle gaps, no function of the main thread entered at a regular period".into();
        steps.notes = notes;
        return steps;
    };
    let iv: Vec<(MonoNs, MonoNs)> = iv
        .into_iter()
        .filter(|s| s.1 > a.start && s.0 < a.end)
        .take(MAX_STEPS)
        .collect();
    if iv.is_empty() {
        steps.method = "none".into();
        steps.how = "no steps inside the recorded window".into();
        steps.notes = notes;
        return steps;
    }
    let durs: Vec<f64> = iv.iter().map(|s| s.1.secs_since(s.0)).collect();
    let span = iv.last().unwrap().1.secs_since(iv[0].0);
    steps.method = method.into();
    steps.how = how;
    steps.name = name;
    steps.pid = pid.map(|p| p.0);
    steps.tid = tid.map(|t| t.0);
    steps.count = iv.len();
    steps.steps_per_s = (span > 0.0).then(|| iv.len() as f64 / span);
    steps.time = Dist::of(&durs);
    steps.range_time = range_durs.as_deref().and_then(Dist::of);

    // Slow steps.
    let med = steps.time.as_ref().map(|d| d.p50_s).unwrap_or(0.0);
    if iv.len() >= 5 && med > 0.0 {
        let thr = med * SLOW_FACTOR;
        steps.slow_threshold_s = Some(thr);
        // The job's first step is warm-up (allocations, compilation,
        // autotuning, workers starting), not an anomaly: said apart, when
        // the recording saw the job start (not attached, not delayed) or
        // the steps' process started during the recording.
        let launched_here = a.saw_job_start();
        let born_in_window = pid
            .and_then(|p| a.processes.get(&p))
            .is_some_and(|p| p.first_seen.0 > a.start.0 + 1_000_000_000);
        let warmup = launched_here || born_in_window;
        if warmup && durs[0] >= thr {
            notes.push(format!(
                "step 0, the job's first, took {:.3} s ({:.1}× the median): warm-up (allocations, compilation, autotuning, workers starting); not counted among the slow steps",
                durs[0],
                durs[0] / med
            ));
        }
        let first = usize::from(warmup);
        let slow: Vec<usize> = (first..iv.len())
            .filter(|&i| durs[i] >= thr && durs[i] - med >= 0.001)
            .collect();
        steps.slow_count = slow.len();
        steps.slow_pattern = pattern(&slow, first..iv.len());
        if !slow.is_empty() {
            (steps.slow, steps.slow_causes) =
                examine_slow(a, &iv, &durs, med, &slow, (pid, tid), step_group);
        }
    }
    if method == "gpu-idle-gaps" || method == "python-stacks" {
        notes.push("steps are estimated (see `how`): add an NVTX range around the training step for exact step times".into());
    }
    let loop_pt = match (pid, tid) {
        (Some(p), Some(t)) => Some((p, t)),
        _ => loop_thread(a, None),
    };
    steps.waits = step_waits(wait_runs_of(a, loop_pt), &iv);
    steps.loop_thread = loop_pt;
    steps.notes = notes;
    steps.intervals = iv;
    steps
}

#[cfg(test)]
mod tests;
