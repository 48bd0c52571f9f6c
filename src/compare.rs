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
use serde_json::Value;

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
    pub report: Value,
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
    let report: Value = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{} is not a gpuprof report.json: {e}", path.display()))?;
    if report.get("schema_version").is_none() {
        bail!(
            "{} is not a gpuprof report.json (no schema_version)",
            path.display()
        );
    }
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

/// Steps/s measured by gpuprof itself (report.json `steps`), with how.
pub fn measured_steps(r: &Value) -> Option<(f64, String)> {
    let s = r.get("steps")?;
    let v = s.get("steps_per_s")?.as_f64()?;
    let method = s.get("method")?.as_str()?.to_string();
    Some((v, method))
}

fn num(v: &Value, path: &[&str]) -> Option<f64> {
    let mut cur = v;
    for k in path {
        cur = cur.get(*k)?;
    }
    cur.as_f64()
}

/// Findings by id with their severity (info findings left out: they are
/// notes, not problems).
fn problems(r: &Value) -> BTreeMap<String, String> {
    r.get("findings")
        .and_then(|f| f.as_array())
        .map(|fs| {
            fs.iter()
                .filter_map(|f| {
                    let id = f.get("id")?.as_str()?.to_string();
                    let sev = f.get("severity")?.as_str()?.to_string();
                    (sev != "info").then_some((id, sev))
                })
                .collect()
        })
        .unwrap_or_default()
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
fn gpus(r: &Value) -> BTreeMap<i64, GpuFigures> {
    let mut out = BTreeMap::new();
    if let Some(gs) = r.get("gpus").and_then(|g| g.as_array()) {
        for (i, g) in gs.iter().enumerate() {
            let idx = g.get("index").and_then(|x| x.as_i64()).unwrap_or(i as i64);
            out.insert(
                idx,
                GpuFigures {
                    busy: num(g, &["busy_fraction"]),
                    idle_s: num(g, &["idle", "total_s"]),
                    steady_idle_s: num(g, &["idle", "steady_s"]),
                    gaps: num(g, &["idle_gaps", "count"]),
                    gaps_s: num(g, &["idle_gaps", "total_s"]),
                },
            );
        }
    }
    out
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
        num(ra, &["duration_s"]),
        num(rb, &["duration_s"]),
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
    for role in crate::analysis::Role::ALL.map(|r| r.as_str()) {
        let (x, y) = (
            num(ra, &["roles", role, "processes"]),
            num(rb, &["roles", role, "processes"]),
        );
        if x.unwrap_or(0.0) == 0.0 && y.unwrap_or(0.0) == 0.0 {
            continue;
        }
        rows.push(row(&format!("{role} processes"), x, y, &|v| {
            format!("{v:.0}")
        }));
        rows.push(row(
            &format!("{role} CPU"),
            num(ra, &["roles", role, "cpu_s"]),
            num(rb, &["roles", role, "cpu_s"]),
            &secs,
        ));
    }
    let read = |r: &Value| -> Option<f64> {
        let roles = r.get("roles")?.as_object()?;
        Some(
            roles
                .values()
                .filter_map(|v| v.get("read_bytes")?.as_f64())
                .sum(),
        )
    };
    rows.push(row("read from storage", read(ra), read(rb), &|v| {
        crate::units::bytes(v)
    }));
    rows.push(row(
        "iowait (mean)",
        num(ra, &["system", "iowait_pct", "mean"]),
        num(rb, &["system", "iowait_pct", "mean"]),
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
    use serde_json::json;

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
            let report = json!({"schema_version": 1, "duration_s": 10.0,
                "steps": {"method": "nvtx-range-auto", "steps_per_s": sps}});
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
            report: json!({"schema_version": 1, "duration_s": 10.0}),
            steps_per_s: None,
        };
        let c = compare(&old, &old);
        assert!(c.rows.iter().all(|r| !r.0.starts_with("steps/s")));
        assert!(c.notes.iter().any(|n| n.contains("--log-a")));
    }

    #[test]
    fn findings_fixed_remaining_new() {
        let run = |findings: Value, busy: f64| Run {
            path: PathBuf::from("x"),
            report: json!({"schema_version": 1, "duration_s": 10.0, "findings": findings,
                "gpus": [{"index": 0, "busy_fraction": busy, "idle_gaps": {"count": 3, "total_s": 1.0}}]}),
            steps_per_s: None,
        };
        let a = run(
            json!([{"id": "too-few-workers", "severity": "critical"},
                   {"id": "io-bound", "severity": "warning"},
                   {"id": "low-sample-coverage", "severity": "info"}]),
            0.3,
        );
        let b = run(
            json!([{"id": "io-bound", "severity": "info"},
                   {"id": "pcie-degraded", "severity": "warning"}]),
            0.8,
        );
        let c = compare(&a, &b);
        assert_eq!(c.fixed, vec!["io-bound", "too-few-workers"]);
        assert!(c.remaining.is_empty());
        assert_eq!(c.new, vec!["pcie-degraded (warning)"]);
        let busy = c.rows.iter().find(|r| r.0 == "GPU 0 busy").unwrap();
        assert_eq!((busy.1.as_str(), busy.2.as_str()), ("30%", "80%"));
        assert!(c.markdown().contains("| GPU 0 busy | 30% | 80% | +167% |"));
    }
}
