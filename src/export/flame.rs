//! Stack outputs: `stacks-<role>.folded`, `flame-{main,workers,all}.svg`,
//! `flame-gpu-idle.svg`, and the per-thread stack slices of the trace.
//!
//! All outputs are deterministic: folded lines are sorted, inferno colours
//! frames by a hash of their name (`deterministic`), and nothing depends on
//! hash-map order or the time of the run.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use inferno::flamegraph::{self, color::BasicPalette, color::Palette, Options};
use serde_json::json;

use crate::analysis::stacks::Stacks;
use crate::analysis::{Analysis, Role};
use crate::event::MonoNs;
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
    if folded.trim().is_empty() {
        return Ok(false);
    }
    let mut opts = Options::default();
    opts.title = title.to_string();
    opts.subtitle = Some(subtitle.to_string());
    opts.colors = Palette::Basic(BasicPalette::Hot);
    opts.deterministic = true;
    opts.count_name = "samples".into();
    flamegraph::from_lines(&mut opts, folded.lines(), w)
        .map_err(|e| io::Error::other(format!("flamegraph: {e}")))?;
    Ok(true)
}

fn subtitle(st: &Stacks, samples: usize) -> String {
    let hz = st.report.frequency_hz;
    if hz > 0.0 {
        format!(
            "{samples} samples at {hz} Hz (~{:.1} CPU-seconds); root frames are processes: name (pid)",
            samples as f64 / hz
        )
    } else {
        format!("{samples} samples; root frames are processes: name (pid)")
    }
}

/// Write the folded files and flamegraphs of every role that has samples
/// into `dir`, through `write` (the caller's atomic writer). Returns the
/// paths written.
pub fn write_role_outputs(
    st: &Stacks,
    dir: &Path,
    write: &mut dyn FnMut(&Path, &[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for (role, folded_name, svg_name, title) in ROLE_OUTPUTS {
        let n = st.role_samples(*role).count();
        if n == 0 {
            continue;
        }
        let folded = st.folded_role(*role);
        let p = dir.join(folded_name);
        write(&p, folded.as_bytes())?;
        written.push(p);
        let mut buf = Vec::new();
        if svg(
            &folded,
            &format!("CPU stacks: {title}"),
            &subtitle(st, n),
            &mut buf,
        )? {
            let p = dir.join(svg_name);
            write(&p, &buf)?;
            written.push(p);
        }
    }
    Ok(written)
}

/// `flame-gpu-idle.svg` (+ `stacks-gpu-idle.folded`): only the samples
/// taken while a GPU was idle, all processes. Writes nothing when no sample
/// falls in `idle`.
pub fn write_gpu_idle(
    st: &Stacks,
    idle: &[(MonoNs, MonoNs)],
    dir: &Path,
    write: &mut dyn FnMut(&Path, &[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<PathBuf>> {
    let folded = st.folded_during(idle);
    let n: u64 = folded
        .lines()
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    let mut written = Vec::new();
    let mut buf = Vec::new();
    if svg(
        &folded,
        "CPU stacks while the GPU was idle",
        &subtitle(st, n as usize),
        &mut buf,
    )? {
        let p = dir.join("stacks-gpu-idle.folded");
        write(&p, folded.as_bytes())?;
        written.push(p);
        let p = dir.join("flame-gpu-idle.svg");
        write(&p, &buf)?;
        written.push(p);
    }
    Ok(written)
}

/// The stack slices of every sampled thread, on the thread's own track.
/// Returns trace metadata about them (count, thinning, budget).
pub fn write_trace<W: Write>(
    a: &Analysis,
    tw: &mut TraceWriter<W>,
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
    let (slices, thinned) = st.trace_slices();
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
    }))
}
