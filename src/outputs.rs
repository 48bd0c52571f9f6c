//! Build every output of a recording folder from `recording/` alone: used
//! at the end of `gpuprof -- CMD` and by `gpuprof report`.
//!
//! Outputs are written smallest first (`report.json`, `summary.md`, the
//! folded stacks and flamegraphs, `trace.json` last), each through a private
//! temporary renamed into place (see [`crate::outdir`]). One that cannot be
//! written (a full disk) leaves no temporary behind and does not stop the
//! others; `report.json` then says which are missing and why.
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

/// Choices about what the outputs show (the recording is the same).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutputOptions {
    /// The view of the flamegraphs, the main folded files and the trace's
    /// stack slices (`--flame`).
    pub flame: View,
    /// The NVTX range that marks a step (`gpuprof report --step-range`;
    /// else the one recorded with `--step-range`, else chosen
    /// automatically).
    pub step_range: Option<String>,
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

/// Analyze the recording in `rec_dir` and write the outputs into `out`.
pub fn generate(rec_dir: &Path, out: &OutDir, opts: &GenerateOptions) -> Result<Outcome> {
    let live_at_start = !opts.session && crate::record::session_is_live(rec_dir);
    let mut a = analysis::analyze_dir_with(
        rec_dir,
        &analysis::Options {
            step_range: opts.outputs.step_range.clone(),
            footer: opts.footer.clone(),
            live: live_at_start,
        },
    )?;
    a.warnings.extend(opts.problems.iter().cloned());
    if !opts.problems.is_empty() {
        a.complete = false;
    }
    let diagnosis = diagnose::diagnose_analysis(&a);
    let recording_bytes = crate::record::events_path(rec_dir)
        .ok()
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| m.len());
    let build_report = |a: &Analysis, missing: &[(String, String)]| {
        let mut report = export::report::build(a);
        export::report::add_diagnosis(&mut report, &diagnosis);
        if let (Some(n), Some(prof)) = (
            recording_bytes,
            report.get_mut("profiler").and_then(|v| v.as_object_mut()),
        ) {
            prof.insert("recording_bytes".into(), n.into());
        }
        if let Some(obj) = report.as_object_mut() {
            obj.insert(
                "outputs_missing".into(),
                Value::Array(
                    missing
                        .iter()
                        .map(|(f, e)| json!({"file": f, "error": e}))
                        .collect(),
                ),
            );
        }
        report
    };
    let render_report = |report: &Value| -> std::io::Result<Vec<u8>> {
        let mut buf = serde_json::to_vec_pretty(report)?;
        buf.push(b'\n');
        Ok(buf)
    };
    let md = export::summary::markdown(&a, &diagnosis);
    let terminal_summary = export::summary::terminal(&a, &diagnosis);

    let _lock = out.lock()?;
    if live_at_start && !crate::record::session_is_live(rec_dir) {
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
    let report_bytes = render_report(&build_report(&a, &[]))?;
    put("report.json", &report_bytes);
    put("summary.md", md.as_bytes());
    let mut by_path = |p: &Path, bytes: &[u8]| -> Result<()> {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        put(name, bytes);
        Ok(())
    };
    let flame = opts.outputs.flame;
    export::flame::write_role_outputs(&a.stacks, out.path(), flame, &mut by_path)?;
    export::flame::write_gpu_idle(&a, out.path(), flame, &mut by_path)?;
    match out.write_atomic("trace.json", |w| {
        export::trace::write(&a, w, flame).map(|_| ())
    }) {
        Ok(_) => written.push(out.path().join("trace.json")),
        Err(e) => missing.push(("trace.json".into(), e.to_string())),
    }

    if !missing.is_empty() {
        a.complete = false;
        for (f, e) in &missing {
            a.warnings.push(format!("{f} could not be written: {e}"));
        }
        // The first report.json could not know; the temporaries of the
        // failed outputs are gone, so this small rewrite usually fits.
        let fixed = render_report(&build_report(&a, &missing))?;
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
