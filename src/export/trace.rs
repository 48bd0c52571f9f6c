//! Chrome Trace Event Format (JSON object form), as read by Perfetto
//! (ui.perfetto.dev) and chrome://tracing. Timestamps are µs from the start
//! of the recording; the monotonic/realtime anchor is in `metadata`.
//!
//! Layout: GPUs first (see `trace_gpu`), then one trace process per job
//! process (real PID) — main processes, workers, others — with counters for
//! CPU, IO and RSS and one CPU counter per thread; each thread's R/D state
//! runs on a companion track "<thread> state" (kept apart from the thread's
//! own track so that the stack slices there nest cleanly); NVTX ranges and
//! steps on tracks of their own (`trace_nvtx`); a synthetic "system" process
//! with machine-wide counters.
//!
//! The whole trace fits one size budget (see `trace_budget`): every kind of
//! track is a part with a priority class, reduced by merging when the
//! trace would not fit, and every reduction is listed in the metadata.
//!
//! Facts of Perfetto's JSON importer this follows: a counter event makes a
//! track named "<event name> <arg key>" (so the name is split at its last
//! space rather than given an arg "value"); thread tracks are shown as
//! "<thread name> <tid>" (so names carry no tid); X slices on one track
//! must nest (or they go to an error track); slices deeper than 512 are
//! dropped; control characters in strings make older versions reject the
//! file.

use std::io::{self, Write};

use serde_json::{json, Value};

use super::trace_budget::{self, BudgetOutcome, Class, Part, PartOutcome, Reduction};
use crate::analysis::{Analysis, Process, Role, Series, StateRun};

pub use super::trace_fragment::Fragment;
use super::trace_ids::{SORT_PROCESSES, SORT_SYSTEM, STATE_TID_OFFSET, SYSTEM_PID};
use super::trace_writer::{merge_gap, TraceWriter};

/// Options of the trace: its size budget and the view of its stack slices.
#[derive(Clone, Copy, Debug)]
pub struct TraceOptions {
    pub budget_bytes: u64,
    pub view: crate::analysis::stacks::View,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions {
            budget_bytes: trace_budget::DEFAULT_TRACE_BUDGET_BYTES,
            view: Default::default(),
        }
    }
}

/// A job process's track name: "rank 1 · python3 train.py …" for ranks,
/// their workers and launchers; "python3 train.py … [main]" otherwise.
pub fn process_track_name(p: &Process) -> String {
    let cmd = short_command(&p.cmdline, &p.comm);
    if p.rank.is_some() || p.role == Role::Launcher {
        format!("{} · {cmd}", p.label())
    } else {
        format!("{cmd} [{}]", p.role)
    }
}

/// Reduction levels of counter parts: each merges pairs of neighbouring
/// points once more. The floor keeps >= 512 points per track.
const COUNTER_FLOOR: u32 = 4;
const COUNTER_MAX: u32 = 14;

fn counter_reduction(level: u32) -> Reduction {
    (level > 0).then(|| {
        format!(
            "groups of {} neighbouring points merged into their time-weighted mean",
            1u64 << level
        )
    })
}

/// Short display form of a command line.
pub fn short_command(cmdline: &[String], comm: &str) -> String {
    if cmdline.is_empty() {
        return comm.to_string();
    }
    let mut parts: Vec<String> = Vec::new();
    for (i, a) in cmdline.iter().enumerate() {
        let a = if i == 0 {
            a.rsplit('/').next().unwrap_or(a)
        } else {
            a.as_str()
        };
        parts.push(a.to_string());
        if parts.iter().map(|p| p.len() + 1).sum::<usize>() > 60 {
            parts.push("…".into());
            break;
        }
    }
    parts.join(" ")
}

/// The trace's summary: what it holds and how it was reduced.
#[derive(Clone, Debug, Default)]
pub struct TraceSummary {
    pub budget: BudgetOutcome,
    pub flows: u64,
    pub events: u64,
}

impl TraceSummary {
    pub fn to_json(&self) -> Value {
        let mut v = serde_json::to_value(&self.budget).unwrap_or(Value::Null);
        if let Some(o) = v.as_object_mut() {
            o.insert("flows".into(), json!(self.flows));
            o.insert("events".into(), json!(self.events));
        }
        v
    }
}

/// Write the whole trace within `opts.budget_bytes` (see `trace_budget`).
pub fn write<W: Write>(a: &Analysis, w: W, opts: &TraceOptions) -> io::Result<(W, TraceSummary)> {
    write_with(a, w, None, opts)
}

/// Write one recording's part of a merged trace through `fragment` (see
/// [`Fragment`]).
pub fn write_fragment<W: Write>(
    a: &Analysis,
    w: W,
    fragment: Fragment,
    opts: &TraceOptions,
) -> io::Result<W> {
    write_with(a, w, Some(fragment), opts).map(|(w, _)| w)
}

/// The parts a merge's timeline keeps (see `trace_fragment`); the
/// per-thread ones are not even built.
const TIMELINE_PARTS: &[&str] = &[
    "process and thread names",
    "GPU counters",
    super::trace_gaps::GAPS_PART,
    "GPU clock-event reasons",
    "steps",
    "process counters (CPU %, IO, RSS)",
    "system counters (CPU, disks, pressure, memory)",
];

fn write_with<W: Write>(
    a: &Analysis,
    w: W,
    fragment: Option<Fragment>,
    opts: &TraceOptions,
) -> io::Result<(W, TraceSummary)> {
    let timeline = fragment
        .as_ref()
        .is_some_and(|f| f.timeline_bucket_us.is_some());
    let ctx = super::trace_stacks::Context::new(a, opts.view);
    let nvtx_meta = std::cell::RefCell::new(serde_json::Map::new());
    let mut parts: Vec<Part> = Vec::new();
    parts.push(Part {
        class: Class::Names,
        name: "process and thread names".into(),
        max_level: 0,
        floor_level: 0,
        write: Box::new(|_, tw| {
            write_names(a, tw)?;
            super::trace_gpu::write_names(a, tw)?;
            ctx.write_names(tw)?;
            super::trace_waits::write_names(a, tw)?;
            Ok(None)
        }),
    });
    parts.extend(super::trace_gpu::parts(a, &ctx));
    parts.extend(ctx.stack_parts());
    parts.extend(super::trace_nvtx::parts(a, &nvtx_meta));
    parts.extend(super::trace_waits::parts(a));
    parts.extend(process_parts(a));
    parts.extend(system_parts(a));
    if timeline {
        parts.retain(|p| TIMELINE_PARTS.contains(&p.name.as_str()));
    }

    let plan = trace_budget::plan(&parts, a.start, opts.budget_bytes)?;
    ctx.prepare_flows(&parts, &plan.levels);

    let mut w = w;
    // Written through `&mut dyn Write`, like when measured.
    let mut inner = match fragment {
        Some(f) => TraceWriter::fragment(&mut w as &mut dyn Write, a.start, f),
        None => TraceWriter::new(&mut w as &mut dyn Write, a.start)?,
    };
    let mut outcomes = Vec::new();
    let mut reductions = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let (level, bytes, reduction) = match plan.levels[i] {
            Some(l) => {
                let before = inner.bytes;
                let r = (p.write)(l, &mut inner)?;
                (l, inner.bytes - before, r)
            }
            None => (p.max_level, 0, None),
        };
        let dropped = plan.levels[i].is_none();
        if dropped {
            reductions.push(format!(
                "{} left out: at the coarsest resolution the trace would still exceed {} bytes",
                p.name, opts.budget_bytes
            ));
        } else if let Some(r) = &reduction {
            reductions.push(format!("{}: {r}", p.name));
        }
        outcomes.push(PartOutcome {
            part: p.name.clone(),
            class: p.class.number(),
            priority: p.class.label(),
            level,
            bytes_full: plan.full[i],
            bytes,
            dropped,
            reduction,
        });
    }
    let (bytes, events) = (inner.bytes, inner.events);
    reductions.extend(analysis_reductions(a));
    let flows = ctx.flow_count();
    let budget = BudgetOutcome {
        budget_bytes: opts.budget_bytes,
        bytes,
        within_budget: bytes <= opts.budget_bytes,
        parts: outcomes,
        reductions,
    };
    let summary = TraceSummary {
        budget,
        flows,
        events,
    };
    let h = &a.header;
    let meta = json!({
        "gpuprof_version": h.gpuprof_version,
        "command": h.command,
        "host": h.host,
        "rank": h.rank,
        "clock": "CLOCK_MONOTONIC; ts = µs since start_monotonic_ns",
        "start_monotonic_ns": a.start.0,
        "anchor_monotonic_ns": h.anchor_monotonic_ns,
        "anchor_realtime_ns": h.anchor_realtime_ns,
        "interval_ns": h.interval_ns,
        "gpu_idle_threshold_pct": a.gpu.idle_threshold_pct,
        "gpu_sample_period_ms": a.gpu.devices.iter().map(|d| (d.resolution_ns as f64 / 1e5).round() / 10.0).collect::<Vec<_>>(),
        "stack_slices": ctx.slices_meta(),
        "nvtx": nvtx_meta.borrow().get("nvtx").cloned().unwrap_or(Value::Null),
        "steps": nvtx_meta.borrow().get("steps").cloned().unwrap_or(Value::Null),
        "trace_budget": summary.to_json(),
    });
    inner.finish(meta)?;
    Ok((w, summary))
}

/// Reductions the analysis made to stay within bounded memory, in words.
fn analysis_reductions(a: &Analysis) -> Vec<String> {
    let mut out = Vec::new();
    let r = &a.stacks.report;
    if a.stacks.bucket_ns > 0 {
        out.push(format!(
            "stack analysis: more native samples than the analysis holds ({}): each thread kept \
             one sample per {:.1} ms, weighted by the samples it stands for (counts and shares \
             stay those of all {} recorded samples)",
            crate::analysis::stacks::ANALYSIS_MAX_SAMPLES,
            a.stacks.bucket_ns as f64 / 1e6,
            r.samples
        ));
    }
    let merged_threads = a
        .processes
        .values()
        .flat_map(|p| p.threads.values())
        .filter(|t| t.state_runs_merged)
        .count();
    if merged_threads > 0 {
        out.push(format!(
            "thread states: {merged_threads} threads had more than {} R/D runs; neighbouring \
             runs were merged (each keeps its time in R and in D)",
            crate::analysis::MAX_STATE_RUNS
        ));
    }
    let mut series = 0;
    let mut see = |s: &Series| {
        if s.halvings() > 0 {
            series += 1;
        }
    };
    for p in a.processes.values() {
        for s in [&p.cpu, &p.read_bps, &p.write_bps, &p.rss] {
            see(s);
        }
        for t in p.threads.values() {
            see(&t.cpu);
        }
    }
    let sys = &a.system;
    for s in [
        &sys.busy,
        &sys.iowait,
        &sys.steal,
        &sys.runnable,
        &sys.blocked,
    ] {
        see(s);
    }
    for s in &sys.per_cpu_busy {
        see(s);
    }
    for d in &a.gpu.devices {
        see(&d.util);
    }
    if series > 0 {
        let cap = crate::analysis::series::DEFAULT_CAP;
        out.push(format!(
            "counter series: {series} series had more than {cap} points; neighbouring points were \
             merged (time-weighted mean) to keep at most {cap}, about one per {:.1} s over the run",
            a.duration_s() / cap as f64
        ));
    }
    for n in &a.gpu.notes {
        if n.contains("kept as intervals") {
            out.push(n.clone());
        }
    }
    out
}

/// Process and thread names, and the state tracks' names.
fn write_names<W: Write>(a: &Analysis, tw: &mut TraceWriter<W>) -> io::Result<()> {
    for (i, p) in a.processes_in_order().into_iter().enumerate() {
        let pid = p.pid.0 as i64;
        tw.process_name(pid, &process_track_name(p), SORT_PROCESSES + i as i64)?;
        for (j, th) in p.threads.values().enumerate() {
            // Per thread: its own track (stack slices), then its NVTX
            // tracks (`trace_nvtx`), then its state track.
            let tid = th.tid.0 as i64;
            tw.thread_name(pid, tid, &thread_label(th), (j * 4) as i64)?;
            if !th.state_runs.is_empty() {
                tw.thread_name(
                    pid,
                    tid + STATE_TID_OFFSET,
                    &format!("{} state", thread_label(th)),
                    (j * 4 + 3) as i64,
                )?;
            }
        }
    }
    tw.process_name(
        SYSTEM_PID,
        &format!("system ({} CPUs)", a.system.cpus),
        SORT_SYSTEM,
    )
}

fn thread_label(th: &crate::analysis::Thread) -> String {
    if th.comm.is_empty() {
        "thread".into()
    } else {
        th.comm.clone()
    }
}

/// Counters per process: CPU, IO, RSS (class 3); per thread: CPU (class 4).
fn process_parts(a: &Analysis) -> Vec<Part<'_>> {
    let procs = Part {
        class: Class::ProcessCounters,
        name: "process counters (CPU %, IO, RSS)".into(),
        max_level: COUNTER_MAX,
        floor_level: COUNTER_FLOOR,
        write: Box::new(move |level, tw| {
            for p in a.processes.values() {
                let pid = p.pid.0 as i64;
                let ended = p.exited;
                tw.counter_at(pid, "CPU %", &p.cpu, 100.0, level, ended)?;
                tw.counter_at(pid, "IO read MB/s", &p.read_bps, 1e-6, level, ended)?;
                tw.counter_at(pid, "IO write MB/s", &p.write_bps, 1e-6, level, ended)?;
                tw.counter_at(pid, "RSS MB", &p.rss, 1e-6, level, ended)?;
            }
            Ok(counter_reduction(level))
        }),
    };
    let threads = Part {
        class: Class::Detail,
        name: "thread CPU counters".into(),
        max_level: COUNTER_MAX,
        floor_level: COUNTER_FLOOR,
        write: Box::new(move |level, tw| {
            for p in a.processes.values() {
                let pid = p.pid.0 as i64;
                for th in p.threads.values() {
                    let name = format!("{} {} CPU %", thread_label(th), th.tid.0);
                    tw.counter_at(pid, &name, &th.cpu, 100.0, level, p.exited)?;
                }
            }
            Ok(counter_reduction(level))
        }),
    };
    let mut out = vec![procs, threads];
    for (class, roles, label) in [
        (
            Class::MainStacks,
            &[Role::Main, Role::Worker][..],
            "thread states (main, worker)",
        ),
        (
            Class::Detail,
            &[Role::Launcher, Role::Other][..],
            "thread states (other)",
        ),
    ] {
        let run = a.end.0.saturating_sub(a.start.0);
        let interval = a.header.interval_ns.max(1);
        out.push(Part {
            class,
            name: label.into(),
            max_level: level_to_span(interval, run) + 1,
            floor_level: level_to_span(interval, run / 4096),
            write: Box::new(move |level, tw| {
                let gap = merge_gap(interval, level);
                let mut merged = 0u64;
                for p in a.processes.values().filter(|p| roles.contains(&p.role)) {
                    let pid = p.pid.0 as i64;
                    for th in p.threads.values() {
                        let stid = th.tid.0 as i64 + STATE_TID_OFFSET;
                        for run in merge_runs(&th.state_runs, gap) {
                            if !run.is_exact() {
                                merged += 1;
                            }
                            write_state(tw, pid, stid, &run)?;
                        }
                    }
                }
                Ok((level > 0).then(|| {
                    format!(
                        "runs less than {:.0} ms apart merged ({merged} merged slices; their \
                         args give the share of time in each state)",
                        gap as f64 / 1e6
                    )
                }))
            }),
        });
    }
    out
}

/// The smallest level whose merge gap reaches `span`.
fn level_to_span(unit: u64, span: u64) -> u32 {
    (0..60).find(|l| merge_gap(unit, *l) >= span).unwrap_or(60)
}

/// State runs with neighbours closer than `gap` merged.
fn merge_runs(runs: &[StateRun], gap: u64) -> Vec<StateRun> {
    if gap == 0 {
        return runs.to_vec();
    }
    let mut out: Vec<StateRun> = Vec::with_capacity(runs.len());
    for r in runs {
        match out.last_mut() {
            Some(last) if r.from.0.saturating_sub(last.to.0) < gap => *last = last.merge(r),
            _ => out.push(*r),
        }
    }
    out
}

fn write_state<W: Write>(
    tw: &mut TraceWriter<W>,
    pid: i64,
    tid: i64,
    run: &StateRun,
) -> io::Result<()> {
    if run.is_exact() {
        let label = match run.state() {
            'D' => "uninterruptible wait (D, usually IO)",
            _ => "running",
        };
        return tw.slice(pid, tid, label, run.from, run.to, None);
    }
    let (state, share) = (run.state(), run.share(run.state()));
    let label = match (state, share >= 0.5) {
        ('D', true) => "mostly D wait (merged)",
        ('D', false) => "partly D wait (merged)",
        (_, true) => "mostly running (merged)",
        (_, false) => "partly running (merged)",
    };
    let args = json!({
        "running_pct": (run.share('R') * 1000.0).round() / 10.0,
        "d_wait_pct": (run.share('D') * 1000.0).round() / 10.0,
    });
    tw.slice_flow(pid, tid, label, run.from, run.to, Some(&args), None)
}

/// Machine-wide counters: totals (class 3), per CPU (class 4).
fn system_parts(a: &Analysis) -> Vec<Part<'_>> {
    let totals = Part {
        class: Class::ProcessCounters,
        name: "system counters (CPU, disks, pressure, memory)".into(),
        max_level: COUNTER_MAX,
        floor_level: COUNTER_FLOOR,
        write: Box::new(move |level, tw| {
            let s = &a.system;
            let mut c = |name: &str, series: &Series, scale: f64| {
                tw.counter_at(SYSTEM_PID, name, series, scale, level, None)
            };
            c("CPU busy %", &s.busy, 1.0)?;
            c("CPU iowait %", &s.iowait, 1.0)?;
            c("CPU steal %", &s.steal, 1.0)?;
            c("runnable tasks", &s.runnable, 1.0)?;
            c("tasks blocked on IO", &s.blocked, 1.0)?;
            for d in s.disks.values() {
                if d.read_bytes == 0 && d.write_bytes == 0 && d.busy.max() <= 0.0 {
                    continue;
                }
                c(&format!("disk {} busy %", d.name), &d.busy, 1.0)?;
                c(&format!("disk {} read MB/s", d.name), &d.read_bps, 1e-6)?;
                c(&format!("disk {} write MB/s", d.name), &d.write_bps, 1e-6)?;
            }
            for (name, ps) in [
                ("cpu", &s.psi_cpu),
                ("io", &s.psi_io),
                ("memory", &s.psi_memory),
            ] {
                c(&format!("PSI {name} some %"), &ps.some, 1.0)?;
                if name != "cpu" {
                    c(&format!("PSI {name} full %"), &ps.full, 1.0)?;
                }
            }
            c("memory available GB", &s.mem_available, 1e-9)?;
            c("swap used GB", &s.swap_used, 1e-9)?;
            c("swap in MB/s", &s.swap_in_bps, 1e-6)?;
            c("swap out MB/s", &s.swap_out_bps, 1e-6)?;
            Ok(counter_reduction(level))
        }),
    };
    let per_cpu = Part {
        class: Class::Detail,
        name: "per-CPU busy counters".into(),
        max_level: COUNTER_MAX,
        floor_level: COUNTER_FLOOR,
        write: Box::new(move |level, tw| {
            for (i, c) in a.system.per_cpu_busy.iter().enumerate() {
                tw.counter_at(SYSTEM_PID, &format!("CPU{i} busy %"), c, 1.0, level, None)?;
            }
            Ok(counter_reduction(level))
        }),
    };
    vec![totals, per_cpu]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::series::Series;
    use crate::event::MonoNs;

    fn written(f: impl FnOnce(&mut TraceWriter<&mut Vec<u8>>)) -> (String, u64) {
        let mut v = Vec::new();
        let bytes = {
            let mut tw = TraceWriter::counting(&mut v, MonoNs(1_000));
            f(&mut tw);
            tw.bytes
        };
        (String::from_utf8(v).unwrap(), bytes)
    }

    #[test]
    fn counters_are_named_without_a_value_key_and_end_at_exit() {
        let mut s = Series::default();
        s.push(MonoNs(1_000), MonoNs(2_000), 0.5);
        s.push(MonoNs(2_000), MonoNs(3_000), 0.5);
        let (out, bytes) = written(|tw| {
            tw.counter_at(7, "IO read MB/s", &s, 100.0, 0, Some(MonoNs(5_000)))
                .unwrap()
        });
        assert_eq!(bytes, out.len() as u64, "counted as written");
        let evs: Vec<Value> = out
            .split(",\n")
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(evs.len(), 2, "{out}");
        assert_eq!(evs[0]["name"], "IO read");
        assert_eq!(evs[0]["args"]["MB/s"], 50.0);
        assert_eq!(evs[1]["ts"], 4.0, "0 at the exit");
        assert_eq!(evs[1]["args"]["MB/s"], 0.0);
    }

    #[test]
    fn names_are_escaped_and_control_characters_replaced() {
        let (out, _) = written(|tw| {
            tw.slice(1, 2, "a\"b\\c\u{1}d", MonoNs(1_000), MonoNs(251_050), None)
                .unwrap()
        });
        let v: Value = serde_json::from_str(out.trim_start_matches(",\n")).unwrap();
        assert_eq!(v["name"], "a\"b\\c d");
        assert_eq!(v["ts"], 0.0);
        assert_eq!(v["dur"], 250.0);
    }

    #[test]
    fn merged_state_runs_keep_their_shares() {
        let ms = 1_000_000;
        let runs = vec![
            StateRun::new(MonoNs(0), MonoNs(10 * ms), 'R'),
            StateRun::new(MonoNs(15 * ms), MonoNs(20 * ms), 'D'),
            StateRun::new(MonoNs(100 * ms), MonoNs(110 * ms), 'R'),
        ];
        assert_eq!(merge_runs(&runs, 0), runs);
        let m = merge_runs(&runs, 10 * ms);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].r_ns, m[0].d_ns), (10 * ms, 5 * ms));
        assert!(!m[0].is_exact() && m[1].is_exact());
        assert!((m[0].share('R') - 0.5).abs() < 1e-9);
    }
}
