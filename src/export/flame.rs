//! Stack outputs: `stacks-<role>.folded` (+ `-native`),
//! `flame-{main,workers,other,all}.svg`, `flame-workers-per-process.svg`,
//! `flame-gpu-idle.svg` — in the Python view by default, every frame with
//! `--flame native` (see [`crate::analysis::fold`]); the trace's stack
//! slices are in `trace_stacks`.
//!
//! SVGs stay small enough to attach to a pull request (1 MB by default):
//! frames narrower than a pixel are not drawn, and when the file would
//! still be larger the threshold doubles; the subtitle says how many
//! frames were left out. The folded files keep every stack.
//!
//! All outputs are deterministic: folded lines are sorted, inferno colours
//! frames by a hash of their name (`deterministic`), and nothing depends on
//! hash-map order or the time of the run.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use inferno::flamegraph::{self, color::BasicPalette, color::Palette, Options};

use super::folded_budget;
use crate::analysis::stacks::{AttributionCounts, FoldOptions, Sample, Stacks, View};
use crate::analysis::{Analysis, Role};

/// (role, folded file, SVG file, title) of the per-role outputs; role None
/// is every process.
pub const ROLE_OUTPUTS: &[(Option<Role>, &str, &str, &str)] = &[
    (
        Some(Role::Main),
        "stacks-main.folded",
        "flame-main.svg",
        "main process(es)",
    ),
    (
        Some(Role::Worker),
        "stacks-worker.folded",
        "flame-workers.svg",
        "workers",
    ),
    (
        Some(Role::Launcher),
        "stacks-launcher.folded",
        "flame-launcher.svg",
        "launchers (torchrun agent, mpirun, wrapper scripts)",
    ),
    (
        Some(Role::Other),
        "stacks-other.folded",
        "flame-other.svg",
        "other processes",
    ),
    (None, "stacks-all.folded", "flame-all.svg", "all processes"),
];

/// Default bound on each SVG's size.
pub const DEFAULT_SVG_MAX_BYTES: u64 = 1_000_000;
/// Width of the picture, in pixels (inferno's default).
const IMAGE_WIDTH_PX: f64 = 1200.0;

/// Write an SVG flamegraph of folded lines (frames narrower than a pixel
/// left out). Empty input → `Ok(false)`, nothing written.
pub fn svg<W: Write>(folded: &str, title: &str, subtitle: &str, w: W) -> io::Result<bool> {
    svg_in_units(folded, title, subtitle, "samples", 1.0, 1.0, w)
}

/// As [`svg`], with counts in other units: the graph shows count ×
/// `factor` `count_name` (e.g. µs counts shown as ms: factor 0.001); frames
/// narrower than `min_px` pixels are not drawn.
pub fn svg_in_units<W: Write>(
    folded: &str,
    title: &str,
    subtitle: &str,
    count_name: &str,
    factor: f64,
    min_px: f64,
    w: W,
) -> io::Result<bool> {
    if folded.trim().is_empty() {
        return Ok(false);
    }
    let mut opts = Options::default();
    opts.title = title.to_string();
    opts.subtitle = Some(subtitle.to_string());
    opts.colors = Palette::Basic(BasicPalette::Hot);
    opts.deterministic = true;
    opts.count_name = count_name.into();
    opts.factor = factor;
    // inferno's minimum width is a percentage of the picture's width.
    opts.min_width = min_px * 100.0 / IMAGE_WIDTH_PX;
    flamegraph::from_lines(&mut opts, folded.lines(), w)
        .map_err(|e| io::Error::other(format!("flamegraph: {e}")))?;
    Ok(true)
}

/// Frames of the flamegraph of `folded` (one per distinct call path), and
/// how many of them are narrower than `min_px` pixels.
fn frames_narrower(folded: &str, min_px: f64) -> (usize, usize) {
    use std::collections::HashMap;
    let mut paths: HashMap<u64, u64> = HashMap::new();
    let mut total = 0u64;
    for line in folded.lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        total += n;
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for f in stack.split(';') {
            for b in f.bytes().chain(std::iter::once(b';')) {
                h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
            }
            *paths.entry(h).or_default() += n;
        }
    }
    let min = total as f64 * min_px / IMAGE_WIDTH_PX;
    let narrow = paths.values().filter(|n| (**n as f64) < min).count();
    (paths.len(), narrow)
}

/// An SVG of at most `max_bytes` (unless even 64-pixel frames do not fit):
/// frames narrower than one pixel are left out, then 2, 4, ... pixels until
/// it fits, and the subtitle says how many. Counts as in [`svg_in_units`].
/// `None` for empty input.
pub fn svg_capped(
    folded: &str,
    title: &str,
    subtitle: &str,
    (count_name, factor): (&str, f64),
    max_bytes: u64,
) -> io::Result<Option<Vec<u8>>> {
    let mut min_px = 1.0;
    loop {
        let (frames, narrow) = frames_narrower(folded, min_px);
        let note = if narrow > 0 {
            format!(
                "{subtitle} · {narrow} of {frames} frames under {min_px:.0} px not drawn (all in .folded)"
            )
        } else {
            subtitle.to_string()
        };
        let mut buf = Vec::new();
        if !svg_in_units(folded, title, &note, count_name, factor, min_px, &mut buf)? {
            return Ok(None);
        }
        if buf.len() as u64 <= max_bytes || min_px >= 64.0 {
            return Ok(Some(buf));
        }
        min_px *= 2.0;
    }
}

const SAMPLES: (&str, f64) = ("samples", 1.0);

/// The per-process variant of the workers' flamegraph (written when workers
/// of one name were merged into one tower).
pub const WORKERS_PER_PROCESS_SVG: &str = "flame-workers-per-process.svg";

/// Folded stacks in `view` as the outputs show them: in the native view,
/// code its file does not name aggregated by library (the Python view
/// already is), for the flamegraph and its folded file alike.
fn by_name(folded: String, view: View) -> String {
    match view {
        View::Native => folded_budget::by_library(&folded),
        View::Python => folded,
    }
}

/// A folded file as written: by name (see [`by_name`]) and within the
/// folded size budget (see [`folded_budget`]). The flamegraphs are drawn
/// from the stacks before the budget: they have their own.
fn bounded(folded: &str, view: View) -> String {
    folded_budget::bound(
        &by_name(folded.to_string(), view),
        folded_budget::FOLDED_MAX_BYTES,
    )
}

/// The folded file with every frame of a role (`stacks-<role>-native.folded`).
pub fn native_folded_name(folded_name: &str) -> String {
    folded_name.replace(".folded", "-native.folded")
}

/// Characters of a subtitle that fit the flamegraph's 1200-pixel width.
const SUBTITLE_MAX_CHARS: usize = 160;

/// A flamegraph's title and subtitle: what it shows, how many samples,
/// which view and what that view folded, which processes were merged. The
/// subtitle stays within the 1200-pixel width.
fn titles<'a>(
    st: &Stacks,
    title: &str,
    samples: impl Iterator<Item = &'a Sample>,
    view: View,
    merged: &[(String, usize)],
    per_process: Option<&str>,
) -> (String, String) {
    let samples: Vec<&Sample> = samples.collect();
    // Weighted: counts of every recorded sample, also on thinned (long)
    // recordings.
    let sum = st.fold_summary(samples.iter().copied());
    let mut counts = AttributionCounts::default();
    for s in &samples {
        counts.add_n(s.attribution, s.weight as u64);
    }
    let n = sum.samples;
    let hz = st.report.frequency_hz;
    // Which sampler took them (perf events or the in-process timers).
    let by = match st.report.sampler.as_str() {
        _ if !st.report.sampler_named => "",
        crate::vocab::stacks::SAMPLER_TIMER => " by in-process timers",
        crate::vocab::stacks::SAMPLER_PERF => " by perf events",
        _ => "",
    };
    let mut parts = vec![if hz > 0.0 {
        // Periods that ended in the kernel where the perf event may not
        // sample it: the samples are then of the time in user mode.
        let pids: BTreeSet<_> = samples.iter().map(|s| s.pid).collect();
        let unsampled: u64 = st
            .report
            .python
            .processes
            .iter()
            .filter(|p| pids.contains(&p.pid))
            .filter_map(|p| p.agent.as_ref())
            .filter(|a| a.kernel_sampled == Some(false))
            .map(|a| a.unsampled_periods)
            .sum();
        // And the system time of the threads gpuprof's perf events
        // sampled, which never sample the kernel (an estimate from /proc).
        let perf_s: f64 = pids
            .iter()
            .filter_map(|p| st.report.perf_kernel_s.get(p))
            .sum();
        let unsampled_s = unsampled as f64 / hz + perf_s;
        let share = unsampled_s / (n as f64 / hz + unsampled_s);
        let kernel = if unsampled_s >= crate::vocab::stacks::MIN_UNSAMPLED_KERNEL_S
            && share >= crate::vocab::stacks::MIN_UNSAMPLED_KERNEL_SHARE
        {
            // A count of periods is a lower bound; system time from /proc
            // is an estimate, and so is a sum with any of it.
            let bound = if perf_s > 0.0 { "about" } else { "at least" };
            format!("; {bound} {unsampled_s:.1} CPU-s more in the kernel not sampled")
        } else {
            String::new()
        };
        format!(
            "{n} samples{by} at {hz} Hz (~{:.1} CPU-s{kernel})",
            n as f64 / hz
        )
    } else {
        format!("{n} samples{by}")
    }];
    // How the samples got their Python frames, as shares of all of them
    // that add up to 100%.
    if counts.python() + counts.pool_thread > 0 {
        let near = samples.iter().filter(|s| st.py_spy_estimate(s)).count() as u64;
        let near = if view == View::Python { near } else { 0 };
        parts.push(attribution_shares(&counts, near));
    }
    match view {
        View::Python if sum.python_samples > 0 => {
            // The longest that fits: the interpreter files named, then not.
            let mut rest = Vec::new();
            if sum.start {
                rest.push("start-up".to_string());
            }
            for l in &sum.launchers {
                rest.push(format!("{l} bootstrap"));
            }
            let files = sum.interpreter_files.join(" + ");
            let mut candidates = Vec::new();
            for interp in [files.as_str(), "the interpreter"] {
                let mut folded: Vec<&str> = Vec::new();
                if !sum.interpreter_files.is_empty() && !interp.is_empty() {
                    folded.push(interp);
                }
                folded.extend(rest.iter().map(|r| r.as_str()));
                let view = if folded.is_empty() {
                    "Python view".to_string()
                } else {
                    format!("Python view, folded: {}", folded.join(", "))
                };
                candidates.push(format!("{view} · every frame: --flame native"));
                candidates.push(view);
            }
            let head = parts.join(" · ").chars().count() + " · ".len();
            let pick = candidates
                .iter()
                .find(|c| head + c.chars().count() <= SUBTITLE_MAX_CHARS)
                .unwrap_or(&candidates[candidates.len() - 1]);
            parts.push(pick.clone());
        }
        View::Python => {}
        View::Native => parts.push("every frame as sampled".into()),
    }
    let mut title = format!("CPU stacks: {title}");
    if !merged.is_empty() {
        let m: Vec<String> = merged
            .iter()
            .map(|(name, k)| format!("{k} {name} processes"))
            .collect();
        title.push_str(&format!(" · {} merged", m.join(", ")));
        if let Some(f) = per_process {
            title.push_str(&format!(" (per process: {f})"));
        }
    }
    (title, parts.join(" · "))
}

/// The samples by how they got their Python frames, in tenths of a percent
/// of all of them that add up to exactly 100% (largest remainders), the
/// empty kinds left out: `Python frames: same instant 56.8%, native callers
/// unknown 3.0% · pool threads under their caller (estimated) 32.2% ·
/// no Python 8.0%`. `near`: of the unattributed, those shown under an
/// estimate from py-spy.
fn attribution_shares(c: &AttributionCounts, near: u64) -> String {
    let kinds: [(&str, u64); 6] = [
        ("same instant", c.same_instant + c.same_instant_partial),
        ("native callers unknown", c.native_unknown),
        ("estimated from py-spy", near.min(c.unattributed)),
        ("unknown", c.unattributed - near.min(c.unattributed)),
        ("pool threads under their caller (estimated)", c.pool_thread),
        ("no Python", c.native_only),
    ];
    let total: u64 = kinds.iter().map(|k| k.1).sum();
    let exact: Vec<f64> = kinds
        .iter()
        .map(|k| 1000.0 * k.1 as f64 / total.max(1) as f64)
        .collect();
    let mut tenths: Vec<u64> = exact.iter().map(|x| x.floor() as u64).collect();
    let short = 1000u64.saturating_sub(tenths.iter().sum::<u64>());
    let mut order: Vec<usize> = (0..kinds.len()).filter(|&i| kinds[i].1 > 0).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for &i in order.iter().cycle().take(short as usize) {
        tenths[i] += 1;
    }
    let pct = |i: usize| format!("{} {}.{}%", kinds[i].0, tenths[i] / 10, tenths[i] % 10);
    let python: Vec<String> = (0..4).filter(|&i| kinds[i].1 > 0).map(pct).collect();
    let mut out = Vec::new();
    if !python.is_empty() {
        out.push(format!("Python frames: {}", python.join(", ")));
    }
    out.extend((4..6).filter(|&i| kinds[i].1 > 0).map(pct));
    out.join(" · ")
}

/// Write the folded files and flamegraphs of every role that has samples
/// into `dir`, through `write` (the caller's atomic writer): in `view`,
/// workers of one name merged, with every frame per process in
/// `stacks-<role>-native.folded` and, when workers were merged, one tower
/// per worker in `flame-workers-per-process.svg`. Returns the paths
/// written.
pub fn write_role_outputs(
    st: &Stacks,
    dir: &Path,
    view: View,
    max_bytes: u64,
    write: &mut dyn FnMut(&Path, &[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let groups = st.worker_groups();
    for (role, folded_name, svg_name, title) in ROLE_OUTPUTS {
        let n = st.role_weight(*role);
        if n == 0 {
            continue;
        }
        let has_workers = matches!(role, Some(Role::Worker) | None);
        let merged: &[(String, usize)] = if has_workers { &groups } else { &[] };
        let opts = FoldOptions {
            view,
            merge_workers: true,
        };
        let folded = by_name(st.folded_role(*role, opts), view);
        let p = dir.join(folded_name);
        write(&p, bounded(&folded, view).as_bytes())?;
        written.push(p);
        let native = st.folded_role(
            *role,
            FoldOptions {
                view: View::Native,
                merge_workers: false,
            },
        );
        let p = dir.join(native_folded_name(folded_name));
        write(&p, bounded(&native, View::Native).as_bytes())?;
        written.push(p);
        let per_process =
            (*role == Some(Role::Worker) && !groups.is_empty()).then_some(WORKERS_PER_PROCESS_SVG);
        let (title, sub) = titles(st, title, st.role_samples(*role), view, merged, per_process);
        if let Some(buf) = svg_capped(&folded, &title, &sub, SAMPLES, max_bytes)? {
            let p = dir.join(svg_name);
            write(&p, &buf)?;
            written.push(p);
        }
        if let Some(name) = per_process {
            let folded = st.folded_role(
                *role,
                FoldOptions {
                    view,
                    merge_workers: false,
                },
            );
            let (title, sub) = titles(
                st,
                "workers, one tower per process",
                st.role_samples(*role),
                view,
                &[],
                None,
            );
            if let Some(buf) = svg_capped(&folded, &title, &sub, SAMPLES, max_bytes)? {
                let p = dir.join(name);
                write(&p, &buf)?;
                written.push(p);
            }
        }
    }
    if !st.python_only.is_empty() {
        // py-spy's stacks of the Python processes without same-instant
        // frames: their only Python view.
        let folded = st.folded(
            st.python_only.iter(),
            FoldOptions {
                view: View::Native,
                merge_workers: false,
            },
        );
        let p = dir.join(PYTHON_ONLY_FOLDED);
        write(&p, bounded(&folded, View::Python).as_bytes())?;
        written.push(p);
        let subtitle = format!(
            "{} Python stacks read by py-spy, not matched to CPU samples in time",
            st.python_only.iter().map(|s| s.weight as u64).sum::<u64>()
        );
        if let Some(buf) = svg_capped(
            &folded,
            "Python stacks (Python-only view)",
            &subtitle,
            SAMPLES,
            max_bytes,
        )? {
            let p = dir.join(PYTHON_ONLY_SVG);
            write(&p, &buf)?;
            written.push(p);
        }
    }
    Ok(written)
}

/// The Python-only view: py-spy's stacks of the Python processes whose
/// native samples have no same-instant Python frames.
pub const PYTHON_ONLY_FOLDED: &str = "stacks-python-only.folded";
pub const PYTHON_ONLY_SVG: &str = "flame-python-only.svg";

/// `flame-gpu-idle.svg` (+ `stacks-gpu-idle.folded`, and every frame per
/// process in `stacks-gpu-idle-native.folded`): what every process did
/// while the job's GPUs were idle. Each CPU sample is weighted by the idle
/// share of the driver sample covering it (mean over the job's GPUs,
/// [`crate::analysis::gpu::GpuAnalysis::idle_weights`]): at the driver's
/// 1/6 s resolution a sample cannot be placed inside or outside a kernel,
/// but (1 − utilization) is the chance that the GPU was idle at its
/// instant, so the weighted counts estimate the CPU time spent during GPU
/// idle time without bias. Counts are µs of CPU time (a sample stands for
/// one sampling period); samples taken where the GPU was not sampled count
/// for nothing. Writes nothing without GPU data or samples.
pub fn write_gpu_idle(
    a: &Analysis,
    dir: &Path,
    view: View,
    max_bytes: u64,
    write: &mut dyn FnMut(&Path, &[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<PathBuf>> {
    let st = &a.stacks;
    let mut written = Vec::new();
    let devs = a.gpu.job_devices();
    if st.samples.is_empty() || devs.iter().all(|d| d.util_samples == 0) {
        return Ok(written);
    }
    let period_us = period_us(st);
    let idle = a.gpu.idle_weights();
    let weighted: Vec<(&Sample, f64)> = st
        .samples
        .iter()
        .filter_map(|s| {
            // A sample of a thinned (long) recording stands for `weight`.
            let w = idle.at(s.t)? * s.weight as f64;
            (w > 0.0).then_some((s, w))
        })
        .collect();
    let fold = |view, merge_workers| {
        st.folded_weighted(
            weighted.iter().copied(),
            FoldOptions {
                view,
                merge_workers,
            },
            period_us,
        )
    };
    let folded = by_name(fold(view, true), view);
    let groups = st.worker_groups();
    let (title, sub) = titles(
        st,
        "while the GPU was idle",
        weighted.iter().map(|x| x.0),
        view,
        &groups,
        None,
    );
    let cpu_s = weighted.iter().map(|x| x.1).sum::<f64>() * period_us / 1e6;
    let source = devs
        .iter()
        .find(|d| d.util_samples > 0)
        .map_or(String::new(), |d| d.util_source.describe(d.resolution_ns));
    let head = format!(
        "~{cpu_s:.1} CPU-s while the GPU idled: samples weighted by its idle share in the {source}"
    );
    let sub = match sub.split_once(" · ") {
        Some((_, view_part)) => format!("{head} · {view_part}"),
        None => head,
    };
    if let Some(buf) = svg_capped(&folded, &title, &sub, ("ms", 1e-3), max_bytes)? {
        let p = dir.join("stacks-gpu-idle.folded");
        write(&p, bounded(&folded, view).as_bytes())?;
        written.push(p);
        let p = dir.join("stacks-gpu-idle-native.folded");
        write(
            &p,
            bounded(&fold(View::Native, false), View::Native).as_bytes(),
        )?;
        written.push(p);
        let p = dir.join("flame-gpu-idle.svg");
        write(&p, &buf)?;
        written.push(p);
    }
    Ok(written)
}

/// `flame-loop-wall.svg` (+ `stacks-loop-wall.folded` and its native
/// view): the wall time of each process's main thread (the training loop)
/// over the span its waits were counted (the loop's steady state where one
/// was found), on and off the CPU together, in µs. On-CPU time is drawn
/// from the CPU samples of that thread (each one sampling period); blocked
/// time from the wall-clock sampler's looks (each the time until the next
/// look), under `[waiting: CLASS]` and the system call it was blocked in.
/// The time the looks found it on a CPU beyond what its CPU samples cover
/// (runnable but waiting for a CPU, or not sampled) is
/// [`ON_CPU_UNSAMPLED`]. Writes nothing when no main thread was looked at.
pub fn write_loop_wall(
    a: &Analysis,
    dir: &Path,
    view: View,
    max_bytes: u64,
    write: &mut dyn FnMut(&Path, &[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<PathBuf>> {
    let st = &a.stacks;
    let mut written = Vec::new();
    let threads: Vec<_> = a
        .waits
        .threads
        .iter()
        .filter(|t| {
            t.pid.0 == t.tid.0
                && a.processes
                    .get(&t.pid)
                    .is_some_and(|p| p.role == Role::Main)
        })
        .collect();
    if threads.is_empty() {
        return Ok(written);
    }
    let period_us = period_us(st);
    let fold = |view: View| -> String {
        let mut lines: BTreeMap<String, u64> = BTreeMap::new();
        let add_folded = |lines: &mut BTreeMap<String, u64>, folded: &str| {
            for l in folded.lines() {
                if let Some((path, n)) = l.rsplit_once(' ') {
                    *lines.entry(path.to_string()).or_default() += n.parse::<u64>().unwrap_or(0);
                }
            }
        };
        for t in &threads {
            let on: Vec<(&Sample, f64)> = st
                .samples
                .iter()
                .filter(|s| s.pid == t.pid && s.tid == t.tid)
                .filter(|s| s.t >= t.window.0 && s.t < t.window.1)
                .map(|s| (s, s.weight as f64))
                .collect();
            let on_us = on.iter().map(|x| x.1).sum::<f64>() * period_us;
            add_folded(
                &mut lines,
                &st.folded_weighted(
                    on.into_iter(),
                    FoldOptions {
                        view,
                        merge_workers: false,
                    },
                    period_us,
                ),
            );
            let root = st.root_frame(t.pid);
            let k = usize::from(view == View::Native);
            for (path, ns) in &t.off_cpu[k] {
                let us = ns / 1000;
                if us > 0 {
                    *lines.entry(format!("{root};{path}")).or_default() += us;
                }
            }
            let rest = t.on_cpu.seconds * 1e6 - on_us;
            if rest >= 1.0 {
                *lines
                    .entry(format!("{root};{ON_CPU_UNSAMPLED}"))
                    .or_default() += rest as u64;
            }
        }
        let mut out = String::new();
        for (l, n) in lines {
            out.push_str(&format!("{l} {n}\n"));
        }
        out
    };
    let folded = by_name(fold(view), view);
    let wall_s: f64 = threads
        .iter()
        .map(|t| (t.window.1 .0 - t.window.0 .0) as f64 / 1e9)
        .sum();
    let which = if threads.len() == 1 {
        "the main thread".to_string()
    } else {
        format!("the main threads of {} processes", threads.len())
    };
    let steady = if threads.iter().all(|t| t.steady) {
        "the loop's steady state"
    } else {
        "its life where no loop was found"
    };
    let title = "Wall time of the training loop: on and off the CPU";
    let sub = format!(
        "{wall_s:.1} s of {which} over {steady} · on-CPU from CPU samples, blocked time from the wall-clock sampler under [waiting: …] · {} view",
        match view {
            View::Python => "Python",
            View::Native => "native",
        }
    );
    if let Some(buf) = svg_capped(&folded, title, &sub, ("ms", 1e-3), max_bytes)? {
        let p = dir.join("stacks-loop-wall.folded");
        write(&p, bounded(&folded, view).as_bytes())?;
        written.push(p);
        let p = dir.join("stacks-loop-wall-native.folded");
        write(&p, bounded(&fold(View::Native), View::Native).as_bytes())?;
        written.push(p);
        let p = dir.join("flame-loop-wall.svg");
        write(&p, &buf)?;
        written.push(p);
    }
    Ok(written)
}

/// The CPU time one stack sample stands for, in µs.
fn period_us(st: &Stacks) -> f64 {
    if st.period_ns > 0 {
        st.period_ns as f64 / 1e3
    } else if st.report.frequency_hz > 0.0 {
        1e6 / st.report.frequency_hz
    } else {
        1.0
    }
}

/// In `flame-loop-wall.svg`: time the wall-clock sampler found the thread
/// on a CPU beyond what its CPU samples cover.
pub const ON_CPU_UNSAMPLED: &str =
    "[on a CPU without a user-space sample: kernel time, or runnable]";
