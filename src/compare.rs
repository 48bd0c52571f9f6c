//! `gpuprof compare A B`: two runs side by side from their report.json —
//! wall time, steps/s (measured by gpuprof from the job's NVTX step range or
//! its GPU/stack pattern; or read from the job's saved log with
//! `--log-a/--log-b`, for runs recorded before steps were measured),
//! GPU busy fraction and
//! idle gaps per GPU, CPU and IO per role, and which findings were fixed,
//! remain, or are new.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use regex::Regex;

use crate::export::report_schema::{self as schema, Report};

/// Matches "47.2 steps/s", "12.5 it/s", "3 step/s", "samples/s" is not a step rate.
pub const DEFAULT_STEPS_REGEX: &str = r"([0-9]+(?:\.[0-9]+)?)\s*(?:steps?|it|iters?|iterations?)/s";

#[derive(Clone, Debug, Default)]
pub struct CompareOptions {
    pub a: PathBuf,
    pub b: PathBuf,
    /// The job's output (stdout/stderr saved by the user) for each run.
    pub log_a: Option<PathBuf>,
    pub log_b: Option<PathBuf>,
    /// Regex whose first group is the steps/s figure (last match wins).
    pub steps_regex: Option<String>,
    pub markdown: bool,
}

/// One run's report.
pub struct Run {
    pub path: PathBuf,
    pub report: Report,
    pub steps_per_s: Option<f64>,
}

fn report_path(p: &Path) -> Result<PathBuf> {
    if p.is_dir() {
        let r = p.join("report.json");
        if r.is_file() {
            return Ok(r);
        }
        if crate::record::events_path(p).is_ok() {
            bail!(
                "{} has a recording but no report.json: run `gpuprof report {}` first",
                p.display(),
                p.display()
            );
        }
        bail!(
            "{} is not a gpuprof output folder (no report.json in it)",
            p.display()
        );
    }
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    bail!("{}: no such output folder or report.json", p.display())
}

pub fn load(p: &Path, log: Option<&Path>, re: &Regex) -> Result<Run> {
    let path = report_path(p)?;
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    // Refuses a newer schema_version; a missing field is named with the file.
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{} is not a gpuprof report.json: {e}", path.display()))?;
    let report: Report = if value.get("kind").and_then(|k| k.as_str()) == Some("merge") {
        merged_as_run(schema::from_value(value, &path)?)
    } else {
        schema::from_value(value, &path)?
    };
    let steps_per_s = match log {
        None => measured_steps(&report).map(|x| x.0),
        Some(l) => {
            let t = std::fs::read(l).with_context(|| format!("cannot read log {}", l.display()))?;
            let t = String::from_utf8_lossy(&t);
            re.captures_iter(&t)
                .filter_map(|c| c.get(1)?.as_str().parse::<f64>().ok())
                .last()
        }
    };
    Ok(Run {
        path,
        report,
        steps_per_s,
    })
}

/// What a merged report (`gpuprof merge`) has of a run's figures: its
/// span and findings.
fn merged_as_run(m: crate::merge::report::MergedReport) -> Report {
    Report {
        schema_version: m.schema_version,
        gpuprof_version: m.gpuprof_version,
        start_time: m.start_time,
        duration_s: m.duration_s,
        findings: m.findings.into_iter().map(|f| f.finding).collect(),
        ..Report::default()
    }
}

/// Steps/s measured by gpuprof itself (report.json `steps`), with how.
pub fn measured_steps(r: &Report) -> Option<(f64, String)> {
    let s = r.steps.as_ref()?;
    Some((s.steps_per_s?, s.method.clone()))
}

/// Findings by id with their severity (info findings left out: they are
/// notes, not problems).
fn problems(r: &Report) -> BTreeMap<String, String> {
    r.findings
        .iter()
        .filter(|f| f.severity != "info")
        .map(|f| (f.id.clone(), f.severity.clone()))
        .collect()
}

/// One GPU's figures.
#[derive(Clone, Copy, Default)]
struct GpuFigures {
    busy: Option<f64>,
    /// Idle seconds from the utilization deficit, over the sampled span
    /// and in the steady state.
    idle_s: Option<f64>,
    steady_idle_s: Option<f64>,
    gaps: Option<f64>,
    gaps_s: Option<f64>,
}

/// GPU figures keyed by index.
fn gpus(r: &Report) -> BTreeMap<i64, GpuFigures> {
    r.gpus
        .iter()
        .map(|g| {
            (
                i64::from(g.index),
                GpuFigures {
                    busy: g.busy_fraction,
                    idle_s: g.idle.as_ref().map(|i| i.total_s),
                    steady_idle_s: g.idle.as_ref().map(|i| i.steady_s),
                    gaps: g.idle_gaps.as_ref().map(|i| i.count as f64),
                    gaps_s: g.idle_gaps.as_ref().map(|i| i.total_s),
                },
            )
        })
        .collect()
}

/// A table row: label, A, B, change.
type Row = (String, String, String, String);

fn fmt_opt(v: Option<f64>, f: &dyn Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "–".into())
}

fn change(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if a.abs() > 1e-12 => {
            let r = b / a;
            if (r - 1.0).abs() < 0.005 {
                "same".into()
            } else {
                format!("{:+.0}%", (r - 1.0) * 100.0)
            }
        }
        (Some(_), Some(b)) if b.abs() > 1e-12 => "new".into(),
        (Some(_), Some(_)) => "same".into(),
        _ => String::new(),
    }
}

fn row(label: &str, a: Option<f64>, b: Option<f64>, f: &dyn Fn(f64) -> String) -> Row {
    (label.into(), fmt_opt(a, f), fmt_opt(b, f), change(a, b))
}

pub struct Comparison {
    pub rows: Vec<Row>,
    pub fixed: Vec<String>,
    pub remaining: Vec<String>,
    pub new: Vec<String>,
    pub notes: Vec<String>,
    pub a: PathBuf,
    pub b: PathBuf,
}

pub fn compare(a: &Run, b: &Run) -> Comparison {
    let (ra, rb) = (&a.report, &b.report);
    let secs = |v: f64| format!("{v:.2} s");
    let mut rows = vec![row(
        "wall time",
        Some(ra.duration_s),
        Some(rb.duration_s),
        &secs,
    )];
    let mut notes = Vec::new();
    let (ma, mb) = (measured_steps(ra), measured_steps(rb));
    let from_logs = |r: &Run, m: &Option<(f64, String)>| {
        r.steps_per_s.is_some() && m.as_ref().map(|x| x.0) != r.steps_per_s
    };
    if a.steps_per_s.is_some() || b.steps_per_s.is_some() {
        let label = match (&ma, &mb) {
            (Some(x), Some(y)) if !from_logs(a, &ma) && !from_logs(b, &mb) => {
                if x.1 == y.1 {
                    format!("steps/s ({})", x.1)
                } else {
                    notes.push(format!(
                        "steps/s were measured differently in the two runs (A: {}, B: {}): compare with care, or name the same range with `gpuprof report DIR --step-range NAME`.",
                        x.1, y.1
                    ));
                    "steps/s (measured)".to_string()
                }
            }
            _ => "steps/s".to_string(),
        };
        rows.push(row(&label, a.steps_per_s, b.steps_per_s, &|v| {
            format!("{v:.2}")
        }));
        if a.steps_per_s.is_none() || b.steps_per_s.is_none() {
            notes.push("steps/s: one run has no step rate (no steps found in its recording and no --log given for it).".into());
        }
    } else {
        notes.push("steps/s: neither run has measured steps (no NVTX step range, no regular GPU or stack pattern): mark the training step with an NVTX range, or pass the job's saved logs with --log-a/--log-b (and --steps-regex if needed).".into());
    }
    let (ga, gb) = (gpus(ra), gpus(rb));
    let mut idx: Vec<i64> = ga.keys().chain(gb.keys()).copied().collect();
    idx.sort_unstable();
    idx.dedup();
    for i in &idx {
        let x = ga.get(i).copied().unwrap_or_default();
        let y = gb.get(i).copied().unwrap_or_default();
        rows.push(row(&format!("GPU {i} busy"), x.busy, y.busy, &|v| {
            format!("{:.0}%", v * 100.0)
        }));
        rows.push(row(&format!("GPU {i} idle"), x.idle_s, y.idle_s, &secs));
        rows.push(row(
            &format!("GPU {i} idle, steady state"),
            x.steady_idle_s,
            y.steady_idle_s,
            &secs,
        ));
        rows.push(row(
            &format!("GPU {i} fully idle gaps"),
            x.gaps,
            y.gaps,
            &|v| format!("{v:.0}"),
        ));
        rows.push(row(
            &format!("GPU {i} in fully idle gaps"),
            x.gaps_s,
            y.gaps_s,
            &secs,
        ));
    }
    if idx.is_empty() {
        notes.push("GPU: neither run has GPU figures (not measured).".into());
    }
    let role_fig =
        |r: &Report, role: &str, f: &dyn Fn(&schema::RoleTotals) -> f64| r.roles.get(role).map(f);
    for role in crate::analysis::Role::ALL.map(|r| r.as_str()) {
        let (x, y) = (
            role_fig(ra, role, &|t| t.processes as f64),
            role_fig(rb, role, &|t| t.processes as f64),
        );
        if x.unwrap_or(0.0) == 0.0 && y.unwrap_or(0.0) == 0.0 {
            continue;
        }
        rows.push(row(&format!("{role} processes"), x, y, &|v| {
            format!("{v:.0}")
        }));
        rows.push(row(
            &format!("{role} CPU"),
            role_fig(ra, role, &|t| t.cpu_s),
            role_fig(rb, role, &|t| t.cpu_s),
            &secs,
        ));
    }
    let read = |r: &Report| -> Option<f64> {
        (!r.roles.is_empty()).then(|| r.roles.values().map(|v| v.read_bytes as f64).sum())
    };
    rows.push(row("read from storage", read(ra), read(rb), &|v| {
        crate::units::bytes(v)
    }));
    rows.push(row(
        "iowait (mean)",
        ra.system.iowait_pct.as_ref().map(|s| s.mean),
        rb.system.iowait_pct.as_ref().map(|s| s.mean),
        &|v| format!("{v:.1}%"),
    ));
    let (pa, pb) = (problems(ra), problems(rb));
    let fixed = pa
        .keys()
        .filter(|k| !pb.contains_key(*k))
        .cloned()
        .collect();
    let remaining = pa
        .iter()
        .filter_map(|(k, sa)| pb.get(k).map(|sb| format!("{k} ({sa} → {sb})")))
        .collect();
    let new = pb
        .iter()
        .filter(|(k, _)| !pa.contains_key(*k))
        .map(|(k, s)| format!("{k} ({s})"))
        .collect();
    Comparison {
        rows,
        fixed,
        remaining,
        new,
        notes,
        a: a.path.clone(),
        b: b.path.clone(),
    }
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

impl Comparison {
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "# gpuprof compare\n\nA: `{}`  \nB: `{}`\n\n| | A | B | change |\n|---|---:|---:|---:|\n",
            self.a.display(),
            self.b.display()
        );
        for (l, a, b, c) in &self.rows {
            s.push_str(&format!("| {l} | {a} | {b} | {c} |\n"));
        }
        s.push_str(&format!(
            "\n**Findings fixed:** {}  \n**Remaining:** {}  \n**New:** {}\n",
            list(&self.fixed),
            list(&self.remaining),
            list(&self.new)
        ));
        for n in &self.notes {
            s.push_str(&format!("\n_{n}_\n"));
        }
        s
    }

    pub fn terminal(&self) -> String {
        let w0 = self
            .rows
            .iter()
            .map(|r| r.0.len())
            .max()
            .unwrap_or(0)
            .max(6);
        let w1 = self
            .rows
            .iter()
            .map(|r| r.1.chars().count())
            .max()
            .unwrap_or(0)
            .max(1);
        let w2 = self
            .rows
            .iter()
            .map(|r| r.2.chars().count())
            .max()
            .unwrap_or(0)
            .max(1);
        let mut s = format!(
            "A: {}\nB: {}\n\n{:<w0$}  {:>w1$}  {:>w2$}  change\n",
            self.a.display(),
            self.b.display(),
            "",
            "A",
            "B"
        );
        for (l, a, b, c) in &self.rows {
            s.push_str(&format!("{l:<w0$}  {a:>w1$}  {b:>w2$}  {c}\n"));
        }
        s.push_str(&format!(
            "\nfindings fixed:     {}\nfindings remaining: {}\nfindings new:       {}\n",
            list(&self.fixed),
            list(&self.remaining),
            list(&self.new)
        ));
        for n in &self.notes {
            s.push_str(&format!("({n})\n"));
        }
        s
    }
}

/// Load both runs and compare them.
pub fn run(opts: &CompareOptions) -> Result<Comparison> {
    let pattern = opts.steps_regex.as_deref().unwrap_or(DEFAULT_STEPS_REGEX);
    let re = Regex::new(pattern).map_err(|e| {
        // The regex error draws a caret under the pattern over several
        // lines; keep the message on one.
        let why = e.to_string();
        let last = why.lines().last().unwrap_or("").trim();
        let last = last.strip_prefix("error: ").unwrap_or(last);
        anyhow::anyhow!("--steps-regex `{pattern}` is not a valid regex: {last}")
    })?;
    if re.captures_len() < 2 {
        bail!("--steps-regex `{pattern}` needs a capture group around the number, e.g. `([0-9.]+) steps/s`");
    }
    let a = load(&opts.a, opts.log_a.as_deref(), &re)?;
    let b = load(&opts.b, opts.log_b.as_deref(), &re)?;
    Ok(compare(&a, &b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::report_schema::{Finding, GpuDevice, GpuIdleGaps, Steps};

    fn report(duration_s: f64) -> Report {
        Report {
            schema_version: schema::SCHEMA_VERSION,
            duration_s,
            ..Report::default()
        }
    }

    #[test]
    fn default_regex_reads_common_rate_lines() {
        let re = Regex::new(DEFAULT_STEPS_REGEX).unwrap();
        let get = |s: &str| {
            re.captures_iter(s)
                .filter_map(|c| c[1].parse::<f64>().ok())
                .last()
        };
        assert_eq!(get("80 steps in 4.43 s: 18.04 steps/s"), Some(18.04));
        assert_eq!(get("100%|████| 50/50 [00:02<00:00, 21.3it/s]"), Some(21.3));
        assert_eq!(get("throughput 900 samples/s"), None);
    }

    #[test]
    fn measured_steps_are_compared_when_both_runs_have_them() {
        let run = |sps: f64| {
            let report = Report {
                steps: Some(Steps {
                    method: "nvtx-range-auto".into(),
                    steps_per_s: Some(sps),
                    ..Steps::default()
                }),
                ..report(10.0)
            };
            Run {
                path: PathBuf::from("x"),
                steps_per_s: measured_steps(&report).map(|x| x.0),
                report,
            }
        };
        let c = compare(&run(4.0), &run(5.0));
        let r = c.rows.iter().find(|r| r.0.starts_with("steps/s")).unwrap();
        assert_eq!(r.0, "steps/s (nvtx-range-auto)");
        assert_eq!(
            (r.1.as_str(), r.2.as_str(), r.3.as_str()),
            ("4.00", "5.00", "+25%")
        );
        // An older report without `steps`: no rate, and the note says how.
        let old = Run {
            path: PathBuf::from("y"),
            report: report(10.0),
            steps_per_s: None,
        };
        let c = compare(&old, &old);
        assert!(c.rows.iter().all(|r| !r.0.starts_with("steps/s")));
        assert!(c.notes.iter().any(|n| n.contains("--log-a")));
    }

    #[test]
    fn findings_fixed_remaining_new() {
        let run = |findings: &[(&str, &str)], busy: f64| Run {
            path: PathBuf::from("x"),
            report: Report {
                findings: findings
                    .iter()
                    .map(|(id, severity)| Finding {
                        id: id.to_string(),
                        severity: severity.to_string(),
                        ..Finding::default()
                    })
                    .collect(),
                gpus: vec![GpuDevice {
                    index: 0,
                    busy_fraction: Some(busy),
                    idle_gaps: Some(GpuIdleGaps {
                        count: 3,
                        total_s: 1.0,
                        ..GpuIdleGaps::default()
                    }),
                    ..GpuDevice::default()
                }],
                ..report(10.0)
            },
            steps_per_s: None,
        };
        let a = run(
            &[
                ("too-few-workers", "critical"),
                ("io-bound", "warning"),
                ("low-sample-coverage", "info"),
            ],
            0.3,
        );
        let b = run(&[("io-bound", "info"), ("pcie-degraded", "warning")], 0.8);
        let c = compare(&a, &b);
        assert_eq!(c.fixed, vec!["io-bound", "too-few-workers"]);
        assert!(c.remaining.is_empty());
        assert_eq!(c.new, vec!["pcie-degraded (warning)"]);
        let busy = c.rows.iter().find(|r| r.0 == "GPU 0 busy").unwrap();
        assert_eq!((busy.1.as_str(), busy.2.as_str()), ("30%", "80%"));
        assert!(c.markdown().contains("| GPU 0 busy | 30% | 80% | +167% |"));
    }
}
