//! Stack outputs: `stacks-<role>.folded` (+ `-native`),
//! `flame-{main,workers,other,all}.svg`, `flame-workers-per-process.svg`,
//! `flame-gpu-idle.svg`, and the per-thread stack slices of the trace — in
//! the Python view by default, every frame with `--flame native` (see
//! [`crate::analysis::fold`]).
//!
//! All outputs are deterministic: folded lines are sorted, inferno colours
//! frames by a hash of their name (`deterministic`), and nothing depends on
//! hash-map order or the time of the run.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use inferno::flamegraph::{self, color::BasicPalette, color::Palette, Options};
use serde_json::json;

use crate::analysis::stacks::{AttributionCounts, FoldOptions, Sample, Stacks, View};
use crate::analysis::{Analysis, Role};
use crate::export::trace::TraceWriter;

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

/// Write an SVG flamegraph of folded lines. Empty input → `Ok(false)`,
/// nothing written.
pub fn svg<W: Write>(folded: &str, title: &str, subtitle: &str, w: W) -> io::Result<bool> {
    svg_in_units(folded, title, subtitle, "samples", 1.0, w)
}

/// As [`svg`], with counts in other units: the graph shows count ×
/// `factor` `count_name` (e.g. µs counts shown as ms: factor 0.001).
pub fn svg_in_units<W: Write>(
    folded: &str,
    title: &str,
    subtitle: &str,
    count_name: &str,
    factor: f64,
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
    flamegraph::from_lines(&mut opts, folded.lines(), w)
        .map_err(|e| io::Error::other(format!("flamegraph: {e}")))?;
    Ok(true)
}

/// The per-process variant of the workers' flamegraph (written when workers
/// of one name were merged into one tower).
pub const WORKERS_PER_PROCESS_SVG: &str = "flame-workers-per-process.svg";

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
    let sum = st.fold_summary(samples.iter().copied());
    let mut counts = AttributionCounts::default();
    for s in &samples {
        counts.add(s.attribution);
    }
    let n = sum.samples;
    let hz = st.report.frequency_hz;
    let mut parts = vec![if hz > 0.0 {
        format!("{n} samples at {hz} Hz (~{:.1} CPU-s)", n as f64 / hz)
    } else {
        format!("{n} samples")
    }];
    // How the samples that ran Python code got their Python frames.
    let py = counts.python();
    if py > 0 {
        let same = counts.same_instant + counts.same_instant_partial;
        parts.push(format!(
            "Python frames of the same instant: {:.1}%",
            100.0 * same as f64 / py as f64
        ));
        let near = samples.iter().filter(|s| st.py_spy_estimate(s)).count();
        if view == View::Python && near > 0 {
            parts.push(format!(
                "estimated from py-spy: {:.1}%",
                100.0 * near as f64 / py as f64
            ));
        }
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
    write: &mut dyn FnMut(&Path, &[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let groups = st.worker_groups();
    for (role, folded_name, svg_name, title) in ROLE_OUTPUTS {
        let n = st.role_samples(*role).count();
        if n == 0 {
            continue;
        }
        let has_workers = matches!(role, Some(Role::Worker) | None);
        let merged: &[(String, usize)] = if has_workers { &groups } else { &[] };
        let opts = FoldOptions {
            view,
            merge_workers: true,
        };
        let folded = st.folded_role(*role, opts);
        let p = dir.join(folded_name);
        write(&p, folded.as_bytes())?;
        written.push(p);
        let native = st.folded_role(
            *role,
            FoldOptions {
                view: View::Native,
                merge_workers: false,
            },
        );
        let p = dir.join(native_folded_name(folded_name));
        write(&p, native.as_bytes())?;
        written.push(p);
        let per_process =
            (*role == Some(Role::Worker) && !groups.is_empty()).then_some(WORKERS_PER_PROCESS_SVG);
        let mut buf = Vec::new();
        let (title, sub) = titles(st, title, st.role_samples(*role), view, merged, per_process);
        if svg(&folded, &title, &sub, &mut buf)? {
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
            let mut buf = Vec::new();
            let (title, sub) = titles(
                st,
                "workers, one tower per process",
                st.role_samples(*role),
                view,
                &[],
                None,
            );
            if svg(&folded, &title, &sub, &mut buf)? {
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
        write(&p, folded.as_bytes())?;
        written.push(p);
        let mut buf = Vec::new();
        let subtitle = format!(
            "{} Python stacks read by py-spy, not matched to CPU samples in time",
            st.python_only.len()
        );
        if svg(
            &folded,
            "Python stacks (Python-only view)",
            &subtitle,
            &mut buf,
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
/// [`crate::analysis::gpu::GpuAnalysis::idle_weight_at`]): at the driver's
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
    write: &mut dyn FnMut(&Path, &[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<PathBuf>> {
    let st = &a.stacks;
    let mut written = Vec::new();
    let devs = a.gpu.job_devices();
    if st.samples.is_empty() || devs.iter().all(|d| d.util_samples == 0) {
        return Ok(written);
    }
    let period_us = if st.period_ns > 0 {
        st.period_ns as f64 / 1e3
    } else if st.report.frequency_hz > 0.0 {
        1e6 / st.report.frequency_hz
    } else {
        1.0
    };
    let weighted: Vec<(&Sample, f64)> = st
        .samples
        .iter()
        .filter_map(|s| {
            let w = a.gpu.idle_weight_at(s.t)?;
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
    let folded = fold(view, true);
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
    let mut buf = Vec::new();
    if svg_in_units(&folded, &title, &sub, "ms", 1e-3, &mut buf)? {
        let p = dir.join("stacks-gpu-idle.folded");
        write(&p, folded.as_bytes())?;
        written.push(p);
        let p = dir.join("stacks-gpu-idle-native.folded");
        write(&p, fold(View::Native, false).as_bytes())?;
        written.push(p);
        let p = dir.join("flame-gpu-idle.svg");
        write(&p, &buf)?;
        written.push(p);
    }
    Ok(written)
}

/// The stack slices of every sampled thread, on the thread's own track, in
/// `view`. Returns trace metadata about them (count, thinning, budget).
pub fn write_trace<W: Write>(
    a: &Analysis,
    tw: &mut TraceWriter<W>,
    view: View,
) -> io::Result<serde_json::Value> {
    let st = &a.stacks;
    if st.samples.is_empty() {
        return Ok(serde_json::Value::Null);
    }
    // Threads that the /proc sampler never saw still need a track name.
    let mut named = std::collections::BTreeSet::new();
    for s in &st.samples {
        let known = a
            .processes
            .get(&s.pid)
            .is_some_and(|p| p.threads.contains_key(&s.tid));
        if !known && named.insert((s.pid, s.tid)) {
            let pid = s.pid.0 as i64;
            if !a.processes.contains_key(&s.pid) && named.insert((s.pid, crate::event::Tid(-1))) {
                tw.process_name(pid, &st.root_frame(s.pid), 3000)?;
            }
            tw.thread_name(pid, s.tid.0 as i64, &format!("thread {}", s.tid), 0)?;
        }
    }
    let (slices, thinned) = st.trace_slices(view);
    for sl in &slices {
        tw.slice(
            sl.pid.0 as i64,
            sl.tid.0 as i64,
            st.name(sl.name),
            sl.start,
            sl.end,
            None,
        )?;
    }
    Ok(json!({
        "slices": slices.len(),
        "budget": crate::analysis::stacks::TRACE_MAX_SLICES,
        "max_depth": crate::analysis::stacks::TRACE_MAX_DEPTH,
        "thinned_every_nth_sample": thinned,
        "view": view.as_str(),
    }))
}
