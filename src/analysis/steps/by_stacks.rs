//! Steps from the loop thread's stacks: a Python function that the
//! thread enters at a regular period, counted from the place that calls
//! it most.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{cv, median, regularity, whole_periods, Analysis, Role, MIN_REGULARITY};
use crate::analysis::stacks::FrameInfo;
use crate::event::{MonoNs, Pid, Tid};

/// The sampled thread that drives the loop: the job's main thread (or the
/// busiest thread of the busiest main process).
pub(super) fn loop_thread(a: &Analysis, only: Option<Pid>) -> Option<(Pid, Tid)> {
    let st = &a.stacks;
    let mut per: BTreeMap<(Pid, Tid), usize> = BTreeMap::new();
    for s in st
        .samples
        .iter()
        .filter(|s| only.map_or(true, |p| s.pid == p))
    {
        let main = a
            .processes
            .get(&s.pid)
            .map_or(s.pid == a.header.job_pid, |p| p.role == Role::Main);
        if main {
            *per.entry((s.pid, s.tid)).or_default() += 1;
        }
    }
    let job = only.unwrap_or(a.header.job_pid);
    if per.contains_key(&(job, Tid(job.0))) {
        return Some((job, Tid(job.0)));
    }
    per.into_iter()
        .max_by_key(|(k, n)| (*n, std::cmp::Reverse(*k)))
        .map(|(k, _)| k)
}

/// Steps from the loop thread's stacks: a function that the thread enters
/// at a regular period (its runs of consecutive samples start regularly).
/// Steps found in the stacks: intervals, how, function, pid, tid.
type StackSteps = (Vec<(MonoNs, MonoNs)>, String, String, Pid, Tid);

pub(super) fn from_stacks(a: &Analysis, only: Option<Pid>) -> Option<StackSteps> {
    let st = &a.stacks;
    let (pid, tid) = loop_thread(a, only)?;
    // The spacing of the analysed samples: the sampling period, or the
    // analysis bucket on a thinned (long) recording.
    let period = st.cell_ns(0);
    let samples: Vec<&crate::analysis::stacks::Sample> = st
        .samples
        .iter()
        .filter(|s| s.pid == pid && s.tid == tid)
        .collect();
    if samples.len() < MIN_LOOP_SAMPLES {
        return None;
    }
    // Python functions only: the loop is the job's Python code; samples
    // without Python frames (not merged) are skipped, so they neither end
    // nor start a run.
    let mut last: HashMap<&str, usize> = HashMap::new();
    let mut runs: HashMap<&str, Vec<Run>> = HashMap::new();
    // The same runs apart by call site (the Python frames above the
    // function, each at its line), where the recording has lines; and
    // each function's samples with that path known and unknown.
    let mut last_at: HashMap<Site, usize> = HashMap::new();
    let mut site_runs: HashMap<Site, Vec<Run>> = HashMap::new();
    let mut sited: HashMap<&str, (u32, u32)> = HashMap::new();
    // A stack of each site, and the depth of the function in it.
    let mut site_stack: HashMap<Site, (u32, usize)> = HashMap::new();
    // Samples of each function, and those inside LBFGS's step.
    let mut in_lbfgs: HashMap<&str, (u32, u32)> = HashMap::new();
    let mut k = 0usize;
    let mut prev_t: Option<MonoNs> = None;
    let wall = a.waits.thread(pid, tid);
    for s in &samples {
        // Samples come every period of CPU time: a wall gap of more than
        // two periods means the thread was off its CPU in between, and
        // may have left the function and come back meanwhile — unless the
        // wall-clock sampler's looks say it stayed runnable: preempted on
        // a busy machine, not waiting. Without that, two hogs on two cores
        // left a PyTorch loop's backward passes (34-60 ms of CPU each) one
        // sample per entry and its steps unfound.
        let on_cpu = prev_t.is_some_and(|p| {
            s.t.0.saturating_sub(p.0) <= 2 * period
                || wall.is_some_and(|w| w.stayed_runnable(p, s.t))
        });
        // Inside an import (as a PyTorch import registering its
        // operators): no training step runs there, and functions called
        // once per imported definition are entered at a regular period on a
        // slow machine (`CustomOpDef.__init__` was once taken for the steps
        // of a job still importing torch under load). The sample ends
        // every run.
        if st.stack_frames(s.stack).any(FrameInfo::imports) {
            k += 1;
            prev_t = Some(s.t);
            continue;
        }
        let mut seen = BTreeSet::new();
        let mut inside = false;
        // The Python frames above the one at hand, each at its line (a
        // hash of them), and the one that called it: None from the first
        // frame without a line.
        let mut above: Option<(u64, Option<(&str, u32)>)> = Some((0, None));
        let ids = st.lined_stack_ids(s.lined_stack);
        for (depth, &id) in ids.iter().enumerate() {
            let info = st.lined_frame(id);
            let f = info.label.as_str();
            if !is_python(f) {
                continue;
            }
            let counts = in_lbfgs.entry(f).or_default();
            counts.0 += 1;
            counts.1 += u32::from(inside);
            inside |= reevaluates_closure(info);
            let here = above;
            above = match (above, info.line) {
                (Some((h, _)), Some(l)) if l > 0 => Some((
                    (h.rotate_left(5) ^ u64::from(id)).wrapping_mul(0x517c_c1b7_2722_0a95),
                    Some((f, l)),
                )),
                _ => None,
            };
            if !seen.insert(f) {
                continue;
            }
            extend_run(runs.entry(f).or_default(), &mut last, f, k, s.t, on_cpu);
            let known = sited.entry(f).or_default();
            match here {
                Some((path, Some(at))) => {
                    known.0 += 1;
                    let site = Site { f, at, path };
                    let v = site_runs.entry(site).or_default();
                    extend_run(v, &mut last_at, site, k, s.t, on_cpu);
                    site_stack.entry(site).or_insert((s.lined_stack, depth));
                }
                _ => known.1 += 1,
            }
        }
        if !seen.is_empty() {
            k += 1;
            prev_t = Some(s.t);
        }
    }
    // What LBFGS's step calls runs as often as it evaluates its closure:
    // the model, its backward pass included, up to 20 times per step. The
    // step is then the optimizer's.
    runs.retain(|f, _| in_lbfgs.get(f).is_some_and(|&(n, inside)| 2 * inside <= n));
    let sites = busiest_sites(&mut runs, &site_runs, &sited);
    let f = choose_stack_step(&runs, period)?;
    let starts: Vec<MonoNs> = runs[f].iter().map(|r| r.start).collect();
    let iv: Vec<(MonoNs, MonoNs)> = starts.windows(2).map(|w| (w[0], w[1])).collect();
    let hz = 1e9 / period as f64;
    let marker = step_marker(f);
    let (from, places) = match sites.get(f) {
        Some(&(site, n, tied)) => {
            let text = site_text(st, site, &site_runs, &site_stack);
            (format!(" {text}{}", among_places(n, tied)), n)
        }
        None => (String::new(), 1),
    };
    let why = match (marker, places > 1) {
        (true, true) => ", a call that runs once per training step",
        (true, false) => ", a function that runs once per training step (once per micro-batch with gradient accumulation)",
        (false, _) => ", at a regular period",
    };
    Some((
        iv,
        format!(
            "estimated from the stacks of thread {tid} of process {pid}: `{f}` was entered {} times{from}{why} (stack samples at {hz:.0} Hz: steps shorter than ~{:.0} ms are not resolved, and each step boundary is known to ±{:.0} ms)",
            starts.len(),
            3e3 / hz,
            1e3 / hz
        ),
        f.to_string(),
        pid,
        tid,
    ))
}

/// A Python function's label ("name (file.py)").
fn is_python(label: &str) -> bool {
    label.ends_with(".py)")
}

/// A call site of a Python function: the function (its label), the
/// Python function that called it at the line of the call, and the path
/// of Python frames to it, each at its line (a hash): a helper called
/// from three lines of a loop (`self.manual_backward(loss)`) is three
/// places that call `backward`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Site<'a> {
    f: &'a str,
    at: (&'a str, u32),
    path: u64,
}

/// How the chosen place stands among the `n` that call the function,
/// `tied` of them (itself included) entered as often: nothing for a
/// function called from one place.
fn among_places(n: usize, tied: usize) -> String {
    if n <= 1 {
        return String::new();
    }
    let most = if tied > 1 {
        let others = tied - 1;
        let place = if others == 1 { "place" } else { "places" };
        format!("tied with {others} other {place} for the most entries of the {n} that call it")
    } else {
        format!("the most entered of the {n} places that call it")
    };
    format!(", {most} (a step passes each place once at most)")
}

/// "from line 149 of `gan (train.py)`", and, when other places that
/// call the function twice or more have that caller at that line too, the
/// nearest frame above that tells this place apart ("…, called from line
/// 52 of `fit (train.py)`", or "reached from" it through the frames
/// between: Lightning's `manual_backward` is four frames below the
/// training step's lines).
fn site_text(
    st: &crate::analysis::stacks::Stacks,
    site: Site,
    site_runs: &HashMap<Site, Vec<Run>>,
    site_stack: &HashMap<Site, (u32, usize)>,
) -> String {
    // The Python frames above a site's function, innermost first.
    let callers = |s: &Site| -> Vec<(&str, u32)> {
        let Some(&(stack, depth)) = site_stack.get(s) else {
            return Vec::new();
        };
        st.lined_stack_ids(stack)[..depth]
            .iter()
            .rev()
            .map(|&id| st.lined_frame(id))
            .filter(|i| is_python(&i.label))
            .map(|i| (i.label.as_str(), i.line.unwrap_or(0)))
            .collect()
    };
    let mine = callers(&site);
    let others: Vec<Vec<(&str, u32)>> = site_runs
        .iter()
        .filter(|(s, v)| s.f == site.f && **s != site && v.len() >= 2)
        .map(|(s, _)| callers(s))
        .collect();
    let mut n = 1;
    while n < mine.len() && others.iter().any(|o| o.len() >= n && o[..n] == mine[..n]) {
        n += 1;
    }
    let mut text = format!("from line {} of `{}`", site.at.1, site.at.0);
    if n >= 2 {
        let (label, line) = mine[n - 1];
        let how = if n == 2 {
            "called".to_string()
        } else {
            format!("reached through {} frames", n - 2)
        };
        text.push_str(&format!(", {how} from line {line} of `{label}`"));
    }
    text
}

/// Count the sample at `k` (time `t`) into the runs of `key`: the run
/// before goes on when `key` was in the sample before, else a new one
/// starts.
fn extend_run<K: Copy + Eq + std::hash::Hash>(
    v: &mut Vec<Run>,
    last: &mut HashMap<K, usize>,
    key: K,
    k: usize,
    t: MonoNs,
    on_cpu: bool,
) {
    match v.last_mut() {
        Some(r) if last.get(&key).is_some_and(|&j| j + 1 == k) => r.samples += u32::from(on_cpu),
        _ => v.push(Run {
            start: t,
            samples: 1,
        }),
    }
    last.insert(key, k);
}

/// Most unsited samples of a function (a frame above it without its line)
/// for its call sites to stand for its entries.
const MAX_UNSITED_SHARE: f64 = 0.1;

/// Replaces each function's runs with those of its busiest call site,
/// where its samples' callers are known at their lines: a step passes
/// each place that calls a function once at most (a GAN's loop calls
/// `backward` for the discriminator's real and fake batches and for the
/// generator: 3 entries a step, counted once each as steps before), and
/// a place that runs on some steps only (an extra pass every 10th) is
/// not the step. Returns the site each function's runs now are, how many
/// places called it twice or more, and how many places (the site among
/// them) were entered as often as the site: among equals the first in
/// caller and line is taken, and `how` says they tie.
fn busiest_sites<'a>(
    runs: &mut HashMap<&'a str, Vec<Run>>,
    site_runs: &HashMap<Site<'a>, Vec<Run>>,
    sited: &HashMap<&'a str, (u32, u32)>,
) -> HashMap<&'a str, (Site<'a>, usize, usize)> {
    let mut by_f: HashMap<&str, Vec<(Site, &Vec<Run>)>> = HashMap::new();
    for (site, v) in site_runs {
        by_f.entry(site.f).or_default().push((*site, v));
    }
    let mut chosen = HashMap::new();
    for (f, mut sites) in by_f {
        let Some(rs) = runs.get_mut(f) else { continue };
        let (known, lost) = sited.get(f).copied().unwrap_or_default();
        if f64::from(lost) > MAX_UNSITED_SHARE * f64::from(known + lost) {
            continue;
        }
        // The most entries; among equals, the first caller and line.
        sites.sort_by_key(|(s, v)| (std::cmp::Reverse(v.len()), *s));
        let places = sites.iter().filter(|(_, v)| v.len() >= 2).count();
        let (site, v) = sites[0];
        let tied = sites.iter().filter(|(_, w)| w.len() == v.len()).count();
        *rs = v.clone();
        chosen.insert(f, (site, places, tied));
    }
    chosen
}

/// The `step` of an optimizer that evaluates its closure several times per
/// step: PyTorch's LBFGS (up to `max_iter`, 20 by default). The others
/// call it once at most, and Lightning runs every training step as such a
/// closure (`training_step` and its backward pass inside `Adam.step`): what
/// they call still runs once per step.
fn reevaluates_closure(f: &FrameInfo) -> bool {
    let func = f.name.rsplit('.').next().unwrap_or(&f.name);
    func == "step" && f.file.replace('\\', "/").ends_with("/torch/optim/lbfgs.py")
}

/// Fewest samples of the loop thread to look for its steps in.
pub(super) const MIN_LOOP_SAMPLES: usize = 50;

/// Fewest entries of a function for its spacing to count as a loop's: with
/// 5, three regular spacings of four passed (imports of several modules of
/// one file name, `<module> (utils.py)`, were once taken for the steps of
/// a PyTorch job).
const MIN_STACK_STARTS: usize = 8;

/// A run of consecutive samples of the loop thread in one function: one
/// entry into it, as far as the samples tell.
#[derive(Clone, Copy, Debug)]
pub(super) struct Run {
    pub(super) start: MonoNs,
    /// Its samples known to be of one stay: the first, and each that came
    /// within two sampling periods of the one before. A thread mostly off
    /// its CPU (a loop that sleeps or waits between short steps) is
    /// sampled tens of ms apart, and two samples in one function may be
    /// two of its entries: with 4 ms steps, `_next_data` of a DataLoader
    /// seen in consecutive samples 35–70 ms apart was once taken for 12
    /// steps of 190 ms.
    pub(super) samples: u32,
}

/// Sampling ticks come every period of the thread's CPU time, so an entry
/// that takes at least a period is always sampled; one that takes less may
/// be missed, and a step without its sample would be counted as part of
/// the one before (a small model's backward pass, a few ms, was seen in 17
/// of 40 steps). A candidate's typical entry must span this many samples.
const MIN_MEDIAN_RUN: u32 = 2;

/// Most of a candidate's spacings that may be a whole multiple (2-4x,
/// within [`STRETCH_TOLERANCE`]) of the median: an entry that took less
/// than a sampling period now and then went unsampled, and two steps
/// were counted as one (a backward pass of 1-2 periods was missed in 4 of
/// 20 steps of a PyTorch job loading in its main process).
const MAX_MISSED_SHARE: f64 = 0.1;

/// Python functions that run once per training step by what they are:
/// PyTorch's backward pass (`loss.backward()`), and the step methods of the
/// usual training loops (`training_step` of Lightning and Hugging Face's
/// Trainer, `train_step` of Keras and many hand-written loops). With
/// gradient accumulation they run once per micro-batch.
pub(super) fn step_marker(f: &str) -> bool {
    let Some((func, _file)) = f.rsplit_once(" (") else {
        return false;
    };
    let last = func.rsplit('.').next().unwrap_or(func);
    f == "Tensor.backward (_tensor.py)" || last == "training_step" || last == "train_step"
}

/// The function whose entries (`runs`: function -> start of each run of
/// consecutive samples in it) mark the steps, sampled every `period` ns.
///
/// A function qualifies when it was entered at least [`MIN_STACK_STARTS`]
/// times, typically for at least two samples ([`MIN_MEDIAN_RUN`]), with
/// few spacings that look like an entry went unsampled
/// ([`MAX_MISSED_SHARE`]), on average at least 3 sampling periods apart
/// (shorter steps are not resolved), at a regular spacing
/// ([`regularity`]). A step marker
/// ([`step_marker`]) may instead be regular over pairs of steps: a
/// DataLoader with two workers often hands over batches short-long-short
/// (one waited for, the next ready), which is real step time, not an
/// irregular function. Markers come first; among equals, the most regular
/// spacing, then the most entries. A module body (`<module>`) never
/// qualifies: it runs once per import, and a loop at module level is the
/// outermost frame, which never recurs.
pub(super) fn choose_stack_step<'a>(
    runs: &HashMap<&'a str, Vec<Run>>,
    period: u64,
) -> Option<&'a str> {
    let mut best: Option<(bool, f64, usize, &str)> = None;
    for (&f, rs) in runs {
        if rs.len() < MIN_STACK_STARTS || f.starts_with("<module> (") {
            continue;
        }
        let mut lens: Vec<u32> = rs.iter().map(|r| r.samples).collect();
        lens.sort_unstable();
        if lens[lens.len() / 2] < MIN_MEDIAN_RUN {
            continue;
        }
        let starts: Vec<MonoNs> = rs.iter().map(|r| r.start).collect();
        let periods: Vec<f64> = starts
            .windows(2)
            .map(|w| w[1].0.saturating_sub(w[0].0) as f64)
            .collect();
        let mut p = periods.clone();
        let med = median(&mut p);
        if med < 3.0 * period as f64 {
            continue;
        }
        let missed = periods
            .iter()
            .filter(|&&x| whole_periods(x, med).is_some())
            .count();
        if missed as f64 > MAX_MISSED_SHARE * periods.len() as f64 {
            continue;
        }
        let marker = step_marker(f);
        let pairs: Vec<f64> = periods.windows(2).map(|w| w[0] + w[1]).collect();
        let c = if regularity(&periods) >= MIN_REGULARITY {
            cv(&periods)
        } else if marker && regularity(&pairs) >= MIN_REGULARITY {
            cv(&pairs)
        } else {
            continue;
        };
        // Markers first, then the lowest variation, the most entries, the name.
        let better = match best {
            None => true,
            Some((bm, bc, bn, bf)) => {
                (!marker, c, std::cmp::Reverse(starts.len()), f)
                    < (!bm, bc, std::cmp::Reverse(bn), bf)
            }
        };
        if better {
            best = Some((marker, c, starts.len(), f));
        }
    }
    best.map(|b| b.3)
}
