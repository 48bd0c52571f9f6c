//! Build every output of a recording folder from `recording/` alone: used
//! at the end of `gpuprof -- CMD` and by `gpuprof report`.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::analysis::stacks::View;
use crate::analysis::{self, Analysis};
use crate::diagnose::{self, Diagnosis};
use crate::export;

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
    pub terminal_summary: String,
}

/// Write `path` through a temporary file, so that a reader never sees a
/// half-written output.
pub(crate) fn write_atomic(
    path: &Path,
    f: impl FnOnce(BufWriter<File>) -> std::io::Result<BufWriter<File>>,
) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let file = File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let w = f(BufWriter::with_capacity(1 << 16, file))
        .with_context(|| format!("cannot write {}", path.display()))?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all().ok();
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Analyze the recording in `rec_dir` and write the outputs into `out_dir`.
pub fn generate(rec_dir: &Path, out_dir: &Path, opts: &OutputOptions) -> Result<Outcome> {
    let a = analysis::analyze_dir_with(
        rec_dir,
        &analysis::Options {
            step_range: opts.step_range.clone(),
        },
    )?;
    std::fs::create_dir_all(out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;
    let mut written = Vec::new();

    let trace = out_dir.join("trace.json");
    write_atomic(&trace, |w| export::trace::write(&a, w, opts.flame))?;
    written.push(trace);

    let diagnosis = diagnose::diagnose_analysis(&a);
    let mut report = export::report::build(&a);
    export::report::add_diagnosis(&mut report, &diagnosis);
    if let Ok(p) = crate::record::events_path(rec_dir) {
        if let (Ok(md), Some(prof)) = (
            std::fs::metadata(p),
            report.get_mut("profiler").and_then(|v| v.as_object_mut()),
        ) {
            prof.insert("recording_bytes".into(), md.len().into());
        }
    }
    let report_path = out_dir.join("report.json");
    write_atomic(&report_path, |mut w| {
        serde_json::to_writer_pretty(&mut w, &report)?;
        std::io::Write::write_all(&mut w, b"\n")?;
        Ok(w)
    })?;
    written.push(report_path);

    let mut write_bytes = |p: &Path, bytes: &[u8]| {
        write_atomic(p, |mut w| {
            std::io::Write::write_all(&mut w, bytes)?;
            Ok(w)
        })
    };
    written.extend(export::flame::write_role_outputs(
        &a.stacks,
        out_dir,
        opts.flame,
        &mut write_bytes,
    )?);
    written.extend(export::flame::write_gpu_idle(
        &a,
        out_dir,
        opts.flame,
        &mut write_bytes,
    )?);

    let summary = out_dir.join("summary.md");
    let md = export::summary::markdown(&a, &diagnosis);
    write_atomic(&summary, |mut w| {
        std::io::Write::write_all(&mut w, md.as_bytes())?;
        Ok(w)
    })?;
    written.push(summary);

    let terminal_summary = export::summary::terminal(&a, &diagnosis);
    Ok(Outcome {
        analysis: a,
        diagnosis,
        written,
        terminal_summary,
    })
}
