//! Build every output of a recording folder from `recording/` alone: used
//! at the end of `gpuprof -- CMD` and by `gpuprof report`.
//!
//! Outputs are written smallest first (`report.json`, `summary.md`, the
//! folded stacks and flamegraphs, `trace.json` last, then `report.json`
//! again with what the trace holds), each through a private temporary
//! renamed into place (see [`crate::outdir`]). One that cannot be written (a
//! full disk, or a bug in its exporter) leaves no temporary behind and does
//! not stop the others; `report.json` then says which are missing and why.
//!
//! A session and a `gpuprof report` of the same folder (run while the job is
//! still going) never interleave: files are renamed into place under a lock
//! on the folder, and a report that finds the session finished meanwhile
//! leaves the session's final outputs alone.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::{json, Value};

use crate::analysis::stacks::View;
use crate::analysis::{self, Analysis};
use crate::diagnose::{self, Diagnosis};
use crate::event::Footer;
use crate::export;
use crate::outdir::OutDir;

/// Choices about what the outputs show and how large they may be (the
/// recording is the same).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputOptions {
    /// The view of the flamegraphs, the main folded files and the trace's
    /// stack slices (`--flame`).
    pub flame: View,
    /// The NVTX range that marks a step (`gpuprof report --step-range`;
    /// else the one recorded with `--step-range`, else chosen
    /// automatically).
    pub step_range: Option<String>,
    /// Bound on the trace's JSON (uncompressed) size (`--trace-max-size`).
    pub trace_budget_bytes: u64,
    /// Write `trace.json.gz` instead of `trace.json` (`--trace-gzip`).
    pub trace_gzip: bool,
    /// Bound on each flamegraph SVG's size (`--flame-max-size`).
    pub flame_max_bytes: u64,
    /// Python frames by line, `name (file.py:LINE)` (`--lines`).
    pub python_lines: bool,
}

impl Default for OutputOptions {
    fn default() -> Self {
        OutputOptions {
            flame: View::default(),
            step_range: None,
            trace_budget_bytes: export::trace_budget::DEFAULT_TRACE_BUDGET_BYTES,
            trace_gzip: false,
            flame_max_bytes: export::flame::DEFAULT_SVG_MAX_BYTES,
            python_lines: false,
        }
    }
}

pub struct Outcome {
    pub analysis: Analysis,
    pub diagnosis: Diagnosis,
    pub written: Vec<PathBuf>,
    /// Outputs that could not be written: (file name, why).
    pub missing: Vec<(String, String)>,
    pub terminal_summary: String,
    /// Every output was written and the recording covers the whole window.
    pub complete: bool,
    /// Set when a report found that the recording session finished while it
    /// ran: nothing was written, the session's outputs stand.
    pub superseded: bool,
}

/// What the caller knows beyond the recording.
#[derive(Default, Clone)]
pub struct GenerateOptions {
    /// The session's own end record, used when the recording could not
    /// hold it (a full disk).
    pub footer: Option<Footer>,
    /// Problems the caller met, reported as warnings (e.g. the recording
    /// writer's error).
    pub problems: Vec<String>,
    /// The caller is the recording session itself (its outputs are final).
    pub session: bool,
    /// What the outputs show.
    pub outputs: OutputOptions,
}

/// Run one exporter so that a panic in it (a bug) costs that output only:
/// the others are still written. The panic's message becomes the error.
fn isolated<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(anyhow::anyhow!(
                "internal error while writing {what}: {msg} (please report it; the other outputs are complete)"
            ))
        }
    }
}

/// Analyze the recording in `rec_dir` and write the outputs into `out`.
pub fn generate(rec_dir: &Path, out: &OutDir, opts: &GenerateOptions) -> Result<Outcome> {
    generate_final(rec_dir, out, opts, None)
}

/// [`generate`] for the session's own final outputs. `live` is the lock
/// that marks the session's recording live for `gpuprof report`: it is
/// released once the outputs are in, while the folder's lock is still
/// held. Released after it, a report that began while the session was live
/// could take the folder's lock in between, still find the session live,
/// and replace the final outputs with its snapshot (the one path found to
/// a CI failure of `reports_run_against_a_live_session_never_disturb_it`).
pub fn generate_final(
    rec_dir: &Path,
    out: &OutDir,
    opts: &GenerateOptions,
    live: Option<std::os::fd::OwnedFd>,
) -> Result<Outcome> {
    let live_at_start = !opts.session && crate::record::session_is_live(rec_dir);
    let mut a = analysis::analyze_dir_with(
        rec_dir,
        &analysis::Options {
            step_range: opts.outputs.step_range.clone(),
            footer: opts.footer.clone(),
            live: live_at_start,
            python_lines: opts.outputs.python_lines,
        },
    )?;
    a.warnings.extend(opts.problems.iter().cloned());
    if !opts.problems.is_empty() {
        a.complete = false;
    }
    let recording_bytes = crate::record::events_path(rec_dir)
        .ok()
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| m.len());
    write_outputs(
        a,
        recording_bytes,
        out,
        &opts.outputs,
        live_at_start.then_some(rec_dir),
        live,
    )
}

/// Write the outputs of an analysis into the folder `out_dir` (made if
/// missing); see [`generate`].
pub fn generate_from(
    a: Analysis,
    recording_bytes: Option<u64>,
    out_dir: &Path,
    opts: &OutputOptions,
) -> Result<Outcome> {
    let (out, _) = OutDir::open(out_dir, true)?;
    write_outputs(a, recording_bytes, &out, opts, None, None)
}

/// Write every output; `live`: the recording of a session that was live
/// when the analysis began (if it has finished since, nothing is written);
/// `release`: a lock to release once the outputs are in, before the
/// folder's lock (see [`generate_final`]).
fn write_outputs(
    mut a: Analysis,
    recording_bytes: Option<u64>,
    out: &OutDir,
    opts: &OutputOptions,
    live: Option<&Path>,
    release: Option<std::os::fd::OwnedFd>,
) -> Result<Outcome> {
    let diagnosis = diagnose::diagnose_analysis(&a);
    let trace_name = if opts.trace_gzip {
        "trace.json.gz"
    } else {
        "trace.json"
    };
    let build_report = |a: &Analysis, missing: &[(String, String)], trace: &Value| {
        let mut report = export::report::build(a);
        export::report::add_diagnosis(&mut report, &diagnosis);
        if let Some(prof) = report.profiler.as_mut() {
            prof.recording_bytes = recording_bytes;
        }
        report.outputs_missing = missing
            .iter()
            .map(|(f, e)| export::report_schema::OutputMissing {
                file: f.clone(),
                error: e.clone(),
            })
            .collect();
        report.trace = trace.clone();
        report
    };
    let render_report = |report: &export::report_schema::Report| -> std::io::Result<Vec<u8>> {
        Ok(export::report_schema::to_pretty_bytes(report)?)
    };
    let md = export::summary::markdown(&a, &diagnosis);
    let terminal_summary = export::summary::terminal(&a, &diagnosis);

    let _lock = out.lock()?;
    // Declared after the folder's lock, so dropped before it.
    let _release_first = release;
    if live.is_some_and(|rec| !crate::record::session_is_live(rec)) {
        return Ok(Outcome {
            complete: a.complete,
            analysis: a,
            diagnosis,
            written: Vec::new(),
            missing: Vec::new(),
            terminal_summary,
            superseded: true,
        });
    }
    out.remove_stale_temps();

    let mut written: Vec<PathBuf> = Vec::new();
    let mut missing: Vec<(String, String)> = Vec::new();
    let mut put = |name: &str, bytes: &[u8]| match out.write_atomic(name, |w| w.write_all(bytes)) {
        Ok(_) => written.push(out.path().join(name)),
        Err(e) => missing.push((name.to_string(), e.to_string())),
    };

    // Smallest and most useful first: on a nearly full disk these still fit.
    let report_bytes = render_report(&build_report(
        &a,
        &[],
        &json!({"path": trace_name, "written": false}),
    ))?;
    put("report.json", &report_bytes);
    put("summary.md", md.as_bytes());
    let mut by_path = |p: &Path, bytes: &[u8]| -> Result<()> {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        put(name, bytes);
        Ok(())
    };
    let flame = opts.flame;
    let flames = isolated("the flamegraphs", || {
        export::flame::write_role_outputs(
            &a.stacks,
            out.path(),
            flame,
            opts.flame_max_bytes,
            &mut by_path,
        )?;
        export::flame::write_gpu_idle(&a, out.path(), flame, opts.flame_max_bytes, &mut by_path)?;
        export::flame::write_loop_wall(&a, out.path(), flame, opts.flame_max_bytes, &mut by_path)?;
        Ok(())
    });
    if let Err(e) = flames {
        missing.push(("flamegraphs".into(), format!("{e:#}")));
    }
    if !a.stacks.samples.is_empty() {
        write_profiles(&a, out, flame, &mut written, &mut missing);
    }
    let trace_section = write_trace_section(&a, out, trace_name, opts, &mut written, &mut missing);

    if !missing.is_empty() {
        a.complete = false;
        for (f, e) in &missing {
            a.warnings.push(format!("{f} could not be written: {e}"));
        }
    }
    // The first report.json could know neither what the trace holds nor
    // what could not be written; the temporaries of the failed outputs are
    // gone, so this small rewrite usually fits.
    let fixed = render_report(&build_report(&a, &missing, &trace_section))?;
    match out.write_atomic("report.json", |w| w.write_all(&fixed)) {
        Ok(_) => {
            let p = out.path().join("report.json");
            if !written.contains(&p) {
                written.push(p);
            }
            missing.retain(|m| m.0 != "report.json");
        }
        Err(e) => {
            if let Some(m) = missing.iter_mut().find(|m| m.0 == "report.json") {
                m.1 = e.to_string();
            }
        }
    }
    Ok(Outcome {
        complete: a.complete && missing.is_empty(),
        analysis: a,
        diagnosis,
        written,
        missing,
        terminal_summary,
        superseded: false,
    })
}

/// The stack samples for other tools: `profile.pb.gz` (pprof) and
/// `profile.speedscope.json` (speedscope), in the flamegraphs' view.
fn write_profiles(
    a: &Analysis,
    out: &OutDir,
    view: crate::analysis::stacks::View,
    written: &mut Vec<PathBuf>,
    missing: &mut Vec<(String, String)>,
) {
    let pprof = export::pprof::FILE;
    let speedscope = export::speedscope::FILE;
    for (name, r) in [
        (
            pprof,
            isolated(pprof, || {
                Ok(out.write_atomic(pprof, |w| export::pprof::write(a, view, w))?)
            }),
        ),
        (
            speedscope,
            isolated(speedscope, || {
                Ok(out.write_atomic(speedscope, |w| export::speedscope::write(a, view, w))?)
            }),
        ),
    ] {
        match r {
            Ok(_) => written.push(out.path().join(name)),
            Err(e) => missing.push((name.to_string(), format!("{e:#}"))),
        }
    }
}

/// Write the trace, and say in report.json's `trace` section what it holds
/// (or why it is missing); an older trace of the other form is removed.
fn write_trace_section(
    a: &Analysis,
    out: &OutDir,
    trace_name: &str,
    opts: &OutputOptions,
    written: &mut Vec<PathBuf>,
    missing: &mut Vec<(String, String)>,
) -> Value {
    match isolated(trace_name, || write_trace(a, out, trace_name, opts)) {
        Ok(t) => {
            written.push(out.path().join(trace_name));
            let mut section = t.to_json();
            if let Some(o) = section.as_object_mut() {
                o.insert("path".into(), trace_name.into());
                o.insert("written".into(), true.into());
                o.insert("gzip".into(), opts.trace_gzip.into());
            }
            // An older trace of the other form would contradict this one.
            let other = if opts.trace_gzip {
                "trace.json"
            } else {
                "trace.json.gz"
            };
            if out.exists(other) {
                let _ = out.remove(other);
            }
            section
        }
        Err(e) => {
            let e = format!("{e:#}");
            missing.push((trace_name.into(), e.clone()));
            json!({"path": trace_name, "written": false, "error": e})
        }
    }
}

/// `trace.json` (or `trace.json.gz`) within the budget.
fn write_trace(
    a: &Analysis,
    out: &OutDir,
    name: &str,
    opts: &OutputOptions,
) -> Result<export::trace::TraceSummary> {
    let topts = export::trace::TraceOptions {
        budget_bytes: opts.trace_budget_bytes,
        view: opts.flame,
    };
    let mut summary = None;
    out.write_atomic(name, |w| {
        if opts.trace_gzip {
            let gz = flate2::write::GzEncoder::new(w, flate2::Compression::default());
            let (gz, s) = export::trace::write(a, gz, &topts)?;
            summary = Some(s);
            gz.finish().map(|_| ())
        } else {
            let (_, s) = export::trace::write(a, w, &topts)?;
            summary = Some(s);
            Ok(())
        }
    })?;
    summary.ok_or_else(|| anyhow::anyhow!("the trace writer returned no summary"))
}

/// The folder a merge claims in its output folder while it writes (and
/// removes after): a recording session refuses a folder that holds it, and
/// a second merge cannot create it.
pub const CLAIM_DIR: &str = ".gpuprof-merge";

/// Whether `name` is one of the files gpuprof writes into an output
/// folder (an existing one would be replaced, so such a folder is refused),
/// or the marker of a merge writing into it.
fn is_output_name(name: &str) -> bool {
    matches!(
        name,
        "report.json"
            | "summary.md"
            | "trace.json"
            | "trace.json.gz"
            | crate::export::pprof::FILE
            | crate::export::speedscope::FILE
    ) || (name.starts_with("flame-") && name.ends_with(".svg"))
        || (name.starts_with("stacks-") && name.ends_with(".folded"))
        || name == CLAIM_DIR
}

/// The first file in `out` that a run would replace (see
/// [`is_output_name`]) and that `keep` takes.
pub(crate) fn earlier_output(out: &OutDir, keep: impl Fn(&str) -> bool) -> Option<String> {
    std::fs::read_dir(out.path())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .find(|n| is_output_name(n) && keep(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_holding_any_output_is_recognised() {
        for name in [
            "report.json",
            "trace.json.gz",
            "flame-all.svg",
            "stacks-worker-native.folded",
            "profile.pb.gz",
            "profile.speedscope.json",
        ] {
            assert!(is_output_name(name), "{name}");
        }
        assert!(!is_output_name("notes.txt"));
        assert!(!is_output_name("profile.json"));
    }

    #[test]
    fn a_panicking_exporter_costs_only_its_output() {
        let r: Result<()> = isolated("trace.json", || panic!("bug {}", 42));
        let e = format!("{:#}", r.unwrap_err());
        assert!(e.contains("trace.json") && e.contains("bug 42"), "{e}");
        assert!(e.contains("the other outputs are complete"), "{e}");
        let ok: Result<u32> = isolated("x", || Ok(7));
        assert_eq!(ok.unwrap(), 7);
    }
}
