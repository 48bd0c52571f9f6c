//! `gpuprof merge DIR... -o OUT`: the recordings of several nodes (or
//! ranks) of one job on one timeline — one `trace.json` with a process
//! group per node and rank, one `report.json` and `summary.md` across them,
//! with the straggler compared across all ranks and the clock uncertainty
//! stated.
//!
//! Memory: recordings are analysed one at a time (a few at once on
//! machines with the cores for it), each with the analysis' own bounds, and
//! only a compact summary of each is kept (its ranks' figures, findings,
//! the moments its ranks left collectives). Each recording's part of the
//! trace streams to a temporary file as soon as it is analysed; once every
//! clock offset is known the parts stream into `trace.json`, shifted. So
//! memory is bounded by a few analyses and the output's summaries, never by
//! the number or length of the inputs.
//!
//! A missing, unreadable, corrupt or too-new input is reported and left
//! out; the rest are merged. A recording cut short is merged with a
//! warning. Recordings of other gpuprof versions are merged (the format
//! version decides what can be read) and listed.

pub mod align;
pub mod report;

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::analysis::{self, Role};
use crate::diagnose::{self, ranks::RankFigures, Finding, FindingKind};
use crate::event::{Header, MonoNs};
use crate::export::common::{r, rn};
use crate::export::report_schema::{json_of, name_of};
use crate::export::trace::Fragment;
use crate::outdir::OutDir;
use crate::record::{self, RecordingReader};

/// What `gpuprof merge` was asked to do.
#[derive(Clone, Debug)]
pub struct MergeOptions {
    pub inputs: Vec<PathBuf>,
    pub output: PathBuf,
    /// Recordings analysed at once (None: up to 4, within the cores).
    pub jobs: Option<usize>,
    /// Target size of the merged trace in bytes: each recording keeps the
    /// timeline level of detail (see [`Fragment`]), counters averaged to
    /// fit. None: every event of every recording.
    pub trace_budget: Option<u64>,
}

/// Default size of the merged trace: what Perfetto opens comfortably.
pub const DEFAULT_TRACE_BUDGET: u64 = 256 << 20;

/// Counter bucket (µs) for one recording's share of the trace budget: its
/// counter tracks × duration / bucket points of about 80 bytes each, within
/// the share (never finer than the recording's own interval).
fn bucket_us(a: &analysis::Analysis, budget: Option<u64>) -> Option<f64> {
    let budget = budget?;
    let tracks = a.processes.len() * 6
        + 30
        + a.system.disks.len() * 3
        + a.gpu.devices.len() * 12
        + a.gpu
            .devices
            .iter()
            .map(|d| d.processes.len() * 2)
            .sum::<usize>();
    let points = (budget / 80).max(1) as f64;
    let dur_us = a.duration_s().max(1e-3) * 1e6;
    Some((dur_us * tracks as f64 / points).max(a.header.interval_ns as f64 / 1e3))
}

/// An input that was left out, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: String,
}

/// The result of a merge.
#[derive(Debug)]
pub struct MergeOutcome {
    pub merged: usize,
    pub skipped: Vec<Skipped>,
    pub written: Vec<PathBuf>,
    pub terminal_summary: String,
}

/// One recording, analysed: what the merged outputs need of it.
struct Node {
    path: PathBuf,
    header: Header,
    /// "node-a", or "node-a [rank 3]" when several recordings share a host.
    label: String,
    start: MonoNs,
    end: MonoNs,
    complete: bool,
    warnings: Vec<String>,
    ranks: Vec<RankFigures>,
    findings: Vec<Finding>,
    exits: Vec<(MonoNs, u64)>,
    end_anchor: Option<crate::event::ClockAnchor>,
    fragment: PathBuf,
    processes: usize,
    gpus: usize,
}

/// Folders to merge: each argument is an output folder of `gpuprof -- CMD`
/// (or its `recording/`), or a folder holding such folders (one per node,
/// as `-o shared/{host}` leaves them).
fn expand(inputs: &[PathBuf], skipped: &mut Vec<Skipped>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in inputs {
        if record::events_path(p).is_ok() {
            out.push(p.clone());
            continue;
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|c| c.is_dir() && record::events_path(c).is_ok())
            .collect();
        if found.is_empty() {
            let reason = match record::events_path(p) {
                Err(e) => e.to_string(),
                Ok(_) => unreachable!("checked above"),
            };
            skipped.push(Skipped {
                path: p.clone(),
                reason,
            });
        } else {
            found.sort();
            out.extend(found);
        }
    }
    // One recording named twice (`r1` and `r1/recording`, or through a
    // link) is one input: compared by the file that holds its events.
    let mut seen = BTreeSet::new();
    out.retain(|p| {
        let events = record::events_path(p).unwrap_or_else(|_| p.clone());
        seen.insert(events.canonicalize().unwrap_or(events))
    });
    out
}

/// What tells one recording from every other, copies included: the host,
/// its boot, the clock anchor taken at the start and the job's pid.
fn identity(h: &Header) -> (String, Option<String>, u64, u64, i32) {
    (
        h.host.clone(),
        h.boot_id.clone(),
        h.anchor_realtime_ns,
        h.anchor_monotonic_ns,
        h.job_pid.0,
    )
}

/// Analyse one recording: write its part of the trace to `fragment`, keep
/// its summary.
fn analyse(path: &Path, slot: u32, fragment: &Path, budget: Option<u64>) -> Result<Node> {
    let a = analysis::analyze_dir(path)?;
    let d = diagnose::diagnose_analysis(&a);
    let main_pids: BTreeSet<_> = a
        .processes
        .values()
        .filter(|p| p.role == Role::Main && p.rank.is_some())
        .map(|p| p.pid)
        .collect();
    let mut exits: Vec<(MonoNs, u64)> = a
        .collectives
        .threads
        .iter()
        .filter(|w| main_pids.contains(&w.pid))
        .flat_map(|w| w.exits.iter().copied())
        .collect();
    exits.sort();
    exits.truncate(align::MAX_EXITS);
    let file =
        File::create(fragment).with_context(|| format!("cannot create {}", fragment.display()))?;
    // Names and sort order are finished at assembly, when every node's
    // label and place are known.
    crate::export::trace::write_fragment(
        &a,
        BufWriter::with_capacity(1 << 16, file),
        Fragment::new(slot, String::new(), 0, bucket_us(&a, budget)),
        // Its share of the merged trace's budget; without one (a full
        // merge), every event.
        &crate::export::trace::TraceOptions {
            budget_bytes: budget.unwrap_or(u64::MAX),
            ..Default::default()
        },
    )
    .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
    .with_context(|| format!("cannot write {}", fragment.display()))?;
    Ok(Node {
        path: path.to_path_buf(),
        label: a.header.host.clone(),
        start: a.start,
        end: a.end,
        complete: a.footer.is_some(),
        warnings: a.warnings.clone(),
        ranks: d.ranks,
        findings: d.findings,
        exits,
        end_anchor: a.footer.as_ref().and_then(|f| f.end_anchor),
        fragment: fragment.to_path_buf(),
        processes: a.processes.len(),
        gpus: a.gpu.devices.len(),
        header: a.header,
    })
}

/// Merge the recordings in `opts.inputs` into `opts.output`.
pub fn run(opts: &MergeOptions) -> Result<MergeOutcome> {
    let mut skipped = Vec::new();
    let paths = expand(&opts.inputs, &mut skipped);
    // Headers first: a recording this gpuprof cannot read is left out
    // before any work is done.
    let mut readable: Vec<(PathBuf, Header)> = Vec::new();
    for p in paths {
        match RecordingReader::open(&p) {
            Ok(r) => {
                if let Some((first, _)) = readable
                    .iter()
                    .find(|(_, h)| identity(h) == identity(&r.header))
                {
                    skipped.push(Skipped {
                        reason: format!(
                            "the same recording as {} (a copy of it?): merged once",
                            first.display()
                        ),
                        path: p,
                    });
                    continue;
                }
                readable.push((p, r.header))
            }
            Err(e) => skipped.push(Skipped {
                path: p,
                reason: e.to_string(),
            }),
        }
    }
    if readable.len() > Fragment::MAX_SLOTS as usize {
        anyhow::bail!(
            "{} recordings to merge: at most {} fit one trace (Perfetto's 32-bit process ids); merge the nodes in groups, or record one gpuprof per node rather than per rank",
            readable.len(),
            Fragment::MAX_SLOTS
        );
    }
    if readable.is_empty() {
        let why: Vec<String> = skipped
            .iter()
            .map(|s| format!("{}: {}", s.path.display(), s.reason))
            .collect();
        anyhow::bail!(
            "nothing to merge: no readable gpuprof recording among the inputs{}{}",
            if why.is_empty() { "" } else { "\n  " },
            why.join("\n  ")
        );
    }
    // Opened once and written through its descriptor: never through a
    // symlink planted in it (see crate::outdir).
    let (out, _) = OutDir::open(&opts.output, true)?;
    // The claim: the marker first (atomic: a second merge stops here), then
    // a look for another run's files, which a merge must not replace.
    let tmp = match out.create_subdir(crate::outputs::CLAIM_DIR) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => anyhow::bail!(
            "output folder {} is being written by another `gpuprof merge` ({} exists; remove it if no merge runs): choose another with -o DIR",
            opts.output.display(),
            out.display(crate::outputs::CLAIM_DIR)
        ),
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", out.display(crate::outputs::CLAIM_DIR))),
    };
    // Another run's files, not a symlink planted there (it is replaced,
    // never followed: see crate::outdir).
    let other = if out.exists(record::RECORDING_DIR) {
        Some(record::RECORDING_DIR.to_string())
    } else {
        crate::outputs::earlier_output(&out, |n| {
            n != crate::outputs::CLAIM_DIR
                && std::fs::symlink_metadata(opts.output.join(n)).is_ok_and(|m| m.is_file())
        })
    };
    if let Some(name) = other {
        let _ = std::fs::remove_dir_all(tmp.path());
        anyhow::bail!(
            "output folder {} already holds {name} of another run, which the merge would replace: choose a new folder with -o DIR",
            opts.output.display()
        );
    }
    let result = merge_into(opts, &out, readable, skipped, tmp.path());
    let _ = std::fs::remove_dir_all(tmp.path());
    result
}

fn merge_into(
    opts: &MergeOptions,
    out: &OutDir,
    readable: Vec<(PathBuf, Header)>,
    mut skipped: Vec<Skipped>,
    tmp: &Path,
) -> Result<MergeOutcome> {
    let mut nodes = analyse_all(opts, &readable, &mut skipped, tmp)?;
    order_and_label(&mut nodes);

    // Clocks.
    let clocks: Vec<align::ClockInput> = nodes
        .iter()
        .map(|(_, n)| align::ClockInput {
            boot_id: n.header.boot_id.clone(),
            anchor_monotonic_ns: n.header.anchor_monotonic_ns,
            anchor_realtime_ns: n.header.anchor_realtime_ns,
            anchor_error_ns: n.header.anchor_error_ns,
            sync: n.header.clock.clone(),
            exits: n.exits.clone(),
        })
        .collect();
    let places = align::place(&clocks);
    let origin = nodes
        .iter()
        .zip(&places)
        .map(|((_, n), p)| n.start.0 as i128 + p.offset_ns)
        .min()
        .unwrap_or(0);
    let end = nodes
        .iter()
        .zip(&places)
        .map(|((_, n), p)| n.end.0 as i128 + p.offset_ns)
        .max()
        .unwrap_or(origin);

    // Outputs.
    let mut written = Vec::new();
    let put = |name: &str, f: &mut dyn FnMut(&mut BufWriter<File>) -> std::io::Result<()>| {
        out.write_atomic(name, f)
            .with_context(|| format!("cannot write {}", out.display(name)))
            .map(|_| out.path().join(name))
    };
    written.push(put("trace.json", &mut |w| {
        let mut w = Counting(w, 0);
        let w = &mut w;
        let mut flows = 0u64;
        w.write_all(b"{\"traceEvents\":[\n")?;
        let mut first = true;
        for (k, ((slot, n), p)) in nodes.iter().zip(&places).enumerate() {
            // Whole tenths of a µs, the trace's own grain: every event of
            // a node moves by the same integer, so slices that nested or
            // touched still do (a float shift rounded per event could
            // split a shared edge by one tenth).
            let shift = ((n.start.0 as i128 + p.offset_ns - origin) as f64 / 100.0).round() as i64;
            let fix = Fragment::new(
                *slot as u32,
                format!("{} · ", n.label),
                (k as i64 + 1) * 1_000_000,
                None,
            );
            copy_fragment(&n.fragment, shift, &fix, w, &mut first, &mut flows)?;
        }
        w.write_all(b"\n],\"displayTimeUnit\":\"ms\",\"metadata\":")?;
        let mut meta = trace_metadata(&nodes, &places, origin);
        meta["trace_budget"] = budget_json(opts.trace_budget, w.1);
        meta["trace_budget"]["flows"] = json!(flows);
        serde_json::to_writer(&mut *w, &meta)?;
        w.write_all(b"}\n")
    })?);

    let all_ranks: Vec<RankFigures> = nodes.iter().flat_map(|(_, n)| n.ranks.clone()).collect();
    let findings = merged_findings(&nodes, &all_ranks);
    let m = Merged {
        nodes: &nodes,
        places: &places,
        origin,
        end,
        ranks: &all_ranks,
        findings: &findings,
        skipped: &skipped,
    };
    let report = report_json(&m);
    written.push(put("report.json", &mut |w| {
        w.write_all(&crate::export::report_schema::to_pretty_bytes(&report)?)
    })?);
    let md = summary_markdown(&m);
    written.push(put("summary.md", &mut |w| w.write_all(md.as_bytes()))?);
    Ok(MergeOutcome {
        merged: nodes.len(),
        skipped,
        written,
        terminal_summary: md
            .lines()
            .map(|l| l.replace('`', "").replace("**", ""))
            .collect::<Vec<_>>()
            .join("\n")
            + "\n",
    })
}

/// Analyse every readable recording with `opts.jobs` threads (each
/// writing its trace fragment into `tmp`); the ones that fail join
/// `skipped`. Fails when none is left.
fn analyse_all(
    opts: &MergeOptions,
    readable: &[(PathBuf, Header)],
    skipped: &mut Vec<Skipped>,
    tmp: &Path,
) -> Result<Vec<(usize, Node)>> {
    let jobs = opts
        .jobs
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .min(4)
        })
        .clamp(1, readable.len().max(1));
    // Analyse with `jobs` threads taking recordings in order.
    let n = readable.len() as u64;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: std::sync::Mutex<Vec<(usize, Result<Node>)>> = Default::default();
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((p, _)) = readable.get(i) else { break };
                let frag = tmp.join(format!("{i}.frag"));
                let r = analyse(p, i as u32, &frag, opts.trace_budget.map(|b| b / n));
                results
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((i, r));
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results.sort_by_key(|r| r.0);
    let mut nodes = Vec::new();
    for (i, r) in results {
        match r {
            Ok(n) => nodes.push((i, n)),
            Err(e) => skipped.push(Skipped {
                path: readable[i].0.clone(),
                reason: format!("{e:#}"),
            }),
        }
    }
    if nodes.is_empty() {
        let why: Vec<String> = skipped
            .iter()
            .map(|s| format!("{}: {}", s.path.display(), s.reason))
            .collect();
        anyhow::bail!("nothing to merge: {}", why.join("; "));
    }
    Ok(nodes)
}

/// Order the nodes (by node index, then rank, then host and path) and
/// label each with its host, made unique when several share it.
fn order_and_label(nodes: &mut [(usize, Node)]) {
    // Order: by node index, then rank, then host and path.
    nodes.sort_by(|(_, x), (_, y)| {
        let key = |n: &Node| {
            let ids = crate::vocab::ranks::RankIds::from_env(&n.header.rank_env);
            (
                ids.node_rank.unwrap_or(u32::MAX),
                n.ranks.iter().map(|r| r.rank).min().unwrap_or(u32::MAX),
                n.header.host.clone(),
                n.path.clone(),
            )
        };
        key(x).cmp(&key(y))
    });
    // Labels: the host, made unique when several recordings share it.
    let hosts: Vec<String> = nodes.iter().map(|(_, n)| n.header.host.clone()).collect();
    for (_, n) in nodes.iter_mut() {
        if hosts.iter().filter(|h| **h == n.header.host).count() > 1 {
            let tag = match (&n.header.rank, n.ranks.first()) {
                (Some(r), _) => format!("rank {r}"),
                (None, Some(f)) => format!("rank {}", f.rank),
                (None, None) => n
                    .path
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            };
            n.label = format!("{} [{tag}]", n.header.host);
        }
        for f in n.ranks.iter_mut() {
            f.host = n.label.clone();
        }
    }
}

/// Every node's findings with its label, and the merged straggler finding
/// over all ranks, ranked as each node's diagnosis ranks them.
fn merged_findings(
    nodes: &[(usize, Node)],
    all_ranks: &[RankFigures],
) -> Vec<(Option<String>, Finding)> {
    let mut findings: Vec<(Option<String>, Finding)> = Vec::new();
    findings.extend(diagnose::ranks::straggler(all_ranks).map(|f| (None, f)));
    for (_, n) in nodes {
        for f in &n.findings {
            // Each node's own straggler compares only its local ranks: the
            // merged one above compares them all.
            if f.kind == FindingKind::StragglerRank && findings.iter().any(|x| x.0.is_none()) {
                continue;
            }
            findings.push((Some(n.label.clone()), f.clone()));
        }
    }
    findings.sort_by(|x, y| {
        let (a, b) = (&x.1, &y.1);
        let gt = |f: &Finding| f.gpu_time.as_ref().map_or(0.0, |g| g.seconds);
        // As in each node's diagnosis: possible findings after the
        // established ones.
        b.established()
            .cmp(&a.established())
            .then(gt(b).total_cmp(&gt(a)))
            .then(b.severity.cmp(&a.severity))
            .then(a.kind.cmp(&b.kind))
    });
    findings
}

/// Stream one node's fragment into the merged trace: every timestamp
/// shifted by `shift` tenths of a µs, names and sort order finished.
fn copy_fragment(
    frag: &Path,
    shift: i64,
    fix: &Fragment,
    w: &mut impl Write,
    first: &mut bool,
    flows: &mut u64,
) -> std::io::Result<()> {
    let rd = BufReader::with_capacity(1 << 16, File::open(frag)?);
    for line in rd.lines() {
        let line = line?;
        let Some((ts, ev)) = line.split_once('\t') else {
            continue;
        };
        if ts == "meta" {
            continue;
        }
        if !*first {
            w.write_all(b",\n")?;
        }
        *first = false;
        let needs_fix = ev.contains("\"process_name\"") || ev.contains("\"process_sort_index\"");
        // A gap's cause names the slice its flow lands on: on the merged
        // axis too.
        let linked = ev.contains("\"linked_slice\"");
        if ev.contains("\"flow_out\":true") {
            *flows += 1;
        }
        let ev: std::borrow::Cow<str> = if needs_fix || linked {
            let mut v: Value = serde_json::from_str(ev).map_err(std::io::Error::other)?;
            fix.rename(&mut v);
            if let Some(l) = v["args"].get_mut("linked_slice") {
                if let Some(t) = l["ts"].as_f64() {
                    l["ts"] = json!(shifted_tenths(t, shift) as f64 / 10.0);
                }
            }
            serde_json::to_string(&v)
                .map_err(std::io::Error::other)?
                .into()
        } else {
            ev.into()
        };
        if ts == "-" {
            w.write_all(ev.as_bytes())?;
        } else {
            let t: f64 = ts.parse().map_err(std::io::Error::other)?;
            let t = shifted_tenths(t, shift);
            // The event without its last `}`, then the shifted ts.
            let body = ev.strip_suffix('}').unwrap_or(&ev);
            let sep = if body.ends_with('{') { "" } else { "," };
            let sign = if t < 0 { "-" } else { "" };
            let a = t.unsigned_abs();
            write!(w, "{body}{sep}\"ts\":{sign}{}", a / 10)?;
            if a % 10 != 0 {
                write!(w, ".{}", a % 10)?;
            }
            w.write_all(b"}")?;
        }
    }
    Ok(())
}

/// A fragment's ts (µs, written in tenths) moved by `shift` tenths.
fn shifted_tenths(t_us: f64, shift: i64) -> i64 {
    (t_us * 10.0).round() as i64 + shift
}

fn uncertainty_text(u: Option<u64>) -> String {
    match u {
        None => "unknown (a clock was not synchronised)".into(),
        Some(0) => "exact".into(),
        Some(ns) if ns < 1_000_000 => format!("±{:.0} µs", ns as f64 / 1e3),
        Some(ns) => format!("±{:.1} ms", ns as f64 / 1e6),
    }
}

/// The largest uncertainty of any node's placement (None: unknown).
fn overall_uncertainty(places: &[align::Placement]) -> Option<u64> {
    places
        .iter()
        .map(|p| p.uncertainty_ns)
        .try_fold(0u64, |acc, u| u.map(|u| acc.max(u)))
}

fn node_json(n: &Node, p: &align::Placement, origin: i128) -> report::MergedNode {
    let h = &n.header;
    let drift = n.end_anchor.map(|e| {
        (e.realtime_ns as i128 - e.monotonic_ns as i128)
            - (h.anchor_realtime_ns as i128 - h.anchor_monotonic_ns as i128)
    });
    report::MergedNode {
        path: n.path.display().to_string(),
        label: n.label.clone(),
        host: h.host.clone(),
        rank: h.rank.clone(),
        rank_env: h.rank_env.clone(),
        gpuprof_version: h.gpuprof_version.clone(),
        recording_version: h.version,
        command: h.command.clone(),
        complete: n.complete,
        warnings: n.warnings.clone(),
        start_s: rn((n.start.0 as i128 + p.offset_ns - origin) as f64 / 1e9, 6),
        duration_s: rn(n.end.secs_since(n.start), 3),
        processes: n.processes as u64,
        gpus: n.gpus as u64,
        ranks: n.ranks.iter().map(|f| f.rank).collect(),
        clock: report::NodeClock {
            method: name_of(&p.method),
            method_text: p.method.describe().to_string(),
            uncertainty_s: p.uncertainty_ns.map(|u| rn(u as f64 / 1e9, 9)),
            matched_boundaries: p.matched as u64,
            offset_ns: p.offset_ns.to_string(),
            boot_id: h.boot_id.clone(),
            sync: h.clock.as_ref().map(json_of),
            anchor_error_ns: h.anchor_error_ns,
            wall_clock_drift_during_run_ns: drift.map(|d| d as i64),
        },
        collective_boundaries: n.exits.len() as u64,
        findings: n.findings.len() as u64,
    }
}

/// Counts the bytes written through it.
struct Counting<W>(W, u64);

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = self.0.write(b)?;
        self.1 += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// The merged trace's budget in the shape of a recording's trace metadata
/// (`trace_budget`): `bytes` are those of its events.
fn budget_json(budget: Option<u64>, bytes: u64) -> Value {
    let reductions: Vec<String> = match budget {
        Some(_) => vec![
            "timeline level of detail: each recording keeps its processes', GPUs' and machine's \
             counters (averaged over buckets sized to fit its share of the budget), GPU idle gaps \
             and steps; stack slices, thread states, per-thread and per-CPU counters and NVTX \
             ranges stay in its own trace.json"
                .into(),
        ],
        None => Vec::new(),
    };
    json!({
        "budget_bytes": budget,
        "bytes": bytes,
        "within_budget": budget.map_or(true, |b| bytes <= b),
        "parts": [],
        "reductions": reductions,
    })
}

fn trace_metadata(nodes: &[(usize, Node)], places: &[align::Placement], origin: i128) -> Value {
    json!({
        "merged_by": format!("gpuprof {}", env!("CARGO_PKG_VERSION")),
        "clock": "ts = µs since the earliest recording's start on the merged axis (see merge.nodes[].clock)",
        // ts = 0 is this wall-clock time (of the reference recording's clock).
        "anchor_realtime_ns": origin.max(0) as u64,
        "uncertainty_s": overall_uncertainty(places).map(|u| r(u as f64 / 1e9, 9)),
        "nodes": nodes.iter().zip(places).map(|((_, n), p)| node_json(n, p, origin)).collect::<Vec<_>>(),
    })
}

fn finding_json(host: &Option<String>, f: &Finding) -> report::MergedFinding {
    report::MergedFinding {
        host: host.clone(),
        finding: crate::export::report::finding_json(f),
    }
}

/// Everything the merged report and summary are made of.
struct Merged<'a> {
    nodes: &'a [(usize, Node)],
    places: &'a [align::Placement],
    /// Start and end of the merged axis (wall-clock ns of the reference).
    origin: i128,
    end: i128,
    ranks: &'a [RankFigures],
    /// Ranked; the node's label for a node's own finding.
    findings: &'a [(Option<String>, Finding)],
    skipped: &'a [Skipped],
}

fn report_json(m: &Merged) -> report::MergedReport {
    let Merged {
        nodes,
        places,
        origin,
        end,
        ranks,
        findings,
        skipped,
    } = *m;
    let versions: BTreeSet<&str> = nodes
        .iter()
        .map(|(_, n)| n.header.gpuprof_version.as_str())
        .collect();
    let start_wall = chrono::DateTime::from_timestamp((origin / 1_000_000_000) as i64, 0)
        .map(|d| d.to_rfc3339());
    report::MergedReport {
        schema_version: crate::export::report::SCHEMA_VERSION,
        kind: "merge".into(),
        gpuprof_version: env!("CARGO_PKG_VERSION").into(),
        start_time: start_wall,
        duration_s: rn((end - origin) as f64 / 1e9, 3),
        clock: report::MergedClock {
            uncertainty_s: overall_uncertainty(places).map(|u| rn(u as f64 / 1e9, 9)),
            uncertainty: uncertainty_text(overall_uncertainty(places)),
            methods: places
                .iter()
                .map(|p| p.method)
                .collect::<BTreeSet<_>>()
                .iter()
                .map(name_of)
                .collect(),
        },
        recorded_by_versions: versions.into_iter().map(String::from).collect(),
        nodes: nodes
            .iter()
            .zip(places)
            .map(|((_, n), p)| node_json(n, p, origin))
            .collect(),
        skipped: skipped
            .iter()
            .map(|s| report::SkippedInput {
                path: s.path.display().to_string(),
                reason: s.reason.clone(),
            })
            .collect(),
        ranks: json_of(&ranks),
        findings: findings.iter().map(|(h, f)| finding_json(h, f)).collect(),
    }
}

fn summary_markdown(m: &Merged) -> String {
    let Merged {
        nodes,
        places,
        origin,
        end,
        ranks,
        findings,
        skipped,
    } = *m;
    let mut s = String::from("# gpuprof merge summary\n\n");
    s.push_str(&format!(
        "{} recording{} on one timeline, {:.1} s; clock uncertainty between them: {}.\n",
        nodes.len(),
        if nodes.len() == 1 { "" } else { "s" },
        (end - origin) as f64 / 1e9,
        uncertainty_text(overall_uncertainty(places))
    ));
    if !skipped.is_empty() {
        s.push_str("\n## Left out\n\n");
        for k in skipped {
            s.push_str(&format!("- `{}`: {}\n", k.path.display(), k.reason));
        }
    }
    s.push_str("\n## Diagnosis\n\n");
    if findings.is_empty() {
        s.push_str("No finding: nothing in these runs points at a cause of GPU waiting.\n");
    }
    for (i, (host, f)) in findings.iter().enumerate() {
        let prefix = host.as_ref().map(|h| format!("{h}: ")).unwrap_or_default();
        s.push_str(&crate::export::summary::finding_markdown(i + 1, &prefix, f));
    }
    let lines = diagnose::ranks::summary_lines(ranks);
    if !lines.is_empty() {
        s.push_str("\n## Ranks\n\n");
        for l in lines {
            s.push_str(&format!("- {l}\n"));
        }
    }
    s.push_str("\n## Recordings\n\n");
    for ((_, n), p) in nodes.iter().zip(places) {
        let h = &n.header;
        let ranks: Vec<String> = n.ranks.iter().map(|f| f.rank.to_string()).collect();
        s.push_str(&format!(
            "- **{}** (`{}`): starts at {:.3} s, {:.1} s long{}, {} processes{}; clock: {} ({}){}{}.\n",
            n.label,
            n.path.display(),
            (n.start.0 as i128 + p.offset_ns - origin) as f64 / 1e9,
            n.end.secs_since(n.start),
            if ranks.is_empty() {
                String::new()
            } else {
                format!(", ranks {}", ranks.join(", "))
            },
            n.processes,
            if n.gpus > 0 { format!(", {} GPUs", n.gpus) } else { String::new() },
            p.method.describe(),
            uncertainty_text(p.uncertainty_ns),
            if p.matched > 0 { format!(", {} boundaries matched", p.matched) } else { String::new() },
            if h.gpuprof_version != env!("CARGO_PKG_VERSION") {
                format!("; recorded by gpuprof {}", h.gpuprof_version)
            } else {
                String::new()
            },
        ));
        if !n.complete {
            s.push_str("  - the recording was cut short: its readable part is merged.\n");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slices that touched in a node's trace still touch after any shift:
    /// a float shift rounded per event split 0.4% of shared edges by a
    /// tenth, which the importer reads as a child overlapping its parent.
    #[test]
    fn shifted_slices_keep_their_shared_edges() {
        let dir = std::env::temp_dir().join(format!("gpuprof-merge-shift-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let frag = dir.join("frag");
        let mut text = String::new();
        let mut pairs = Vec::new();
        let mut x = 12345u64;
        for _ in 0..2000 {
            // A small LCG: arbitrary starts and lengths in tenths.
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let start = (x >> 20) % 10_000_000_000;
            let dur = 1 + (x >> 8) % 10_000_000;
            pairs.push(dur);
            let us = |t: u64| format!("{}.{}", t / 10, t % 10);
            text += &format!("{}\t{{\"ph\":\"X\",\"dur\":{}}}\n", us(start), us(dur));
            text += &format!("{}\t{{\"ph\":\"X\",\"dur\":1}}\n", us(start + dur));
        }
        std::fs::write(&frag, text).unwrap();
        let fix = Fragment::new(0, String::new(), 0, None);
        for ns in [0i128, 50, 149, 12_345_678_950, 987_654_321_049] {
            let shift = (ns as f64 / 100.0).round() as i64;
            let mut out = Vec::new();
            let (mut first, mut flows) = (true, 0);
            copy_fragment(&frag, shift, &fix, &mut out, &mut first, &mut flows).unwrap();
            let v: Value =
                serde_json::from_str(&format!("[{}]", String::from_utf8(out).unwrap())).unwrap();
            let ev = v.as_array().unwrap();
            let tenths = |x: &Value| (x.as_f64().unwrap() * 10.0).round() as i64;
            for (k, dur) in pairs.iter().enumerate() {
                let (a, b) = (&ev[2 * k], &ev[2 * k + 1]);
                assert_eq!(
                    tenths(&b["ts"]) - tenths(&a["ts"]),
                    *dur as i64,
                    "shift {ns} ns: {a} then {b}"
                );
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
