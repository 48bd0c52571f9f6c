//! The wait tracks of the trace: for each thread the wall-clock sampler
//! looked at, a companion track ("… waits") with a slice per stretch it
//! was blocked in one wait class ("waiting: next batch", "waiting:
//! collective", …), right under the thread's stack slices, so that what
//! the loop waited for lines up with its CPU work and the GPU's idle gaps.
//! Each GPU idle gap also says in its args what the job's main threads
//! were waiting for during it (`loop_waiting`).
//!
//! Reduction levels merge stretches closer than the sampler's tick ×
//! 2^(level-1) into one slice that gives each class's share of its span.

use std::io::{self, Write};

use serde_json::{json, Value};

use super::trace_budget::{Class, Part};
use super::trace_writer::{merge_gap, TraceWriter};
use crate::analysis::waits::{ThreadWall, WaitClass, WaitRun};
use crate::analysis::{Analysis, Role};
use crate::event::MonoNs;

/// Wait track of a thread: `tid + WAIT_TID_OFFSET` (decimal, like the
/// state track's, so the tid shown ends with the thread's own).
pub const WAIT_TID_OFFSET: i64 = 2_000_000_000;

const CLASSES: [WaitClass; 8] = WaitClass::ALL;

fn index(c: WaitClass) -> usize {
    CLASSES
        .iter()
        .position(|x| *x == c)
        .unwrap_or(CLASSES.len() - 1)
}

/// Threads with a wait track, with their role.
fn tracked(a: &Analysis) -> impl Iterator<Item = (&ThreadWall, Role)> + '_ {
    a.waits.threads.iter().filter_map(|t| {
        let role = a.processes.get(&t.pid)?.role;
        (!t.runs.is_empty()).then_some((t, role))
    })
}

/// The wait tracks' names, after the thread's own track (its sort index
/// `j * 4`; NVTX lanes take `+ 1` and `+ 2`, the state track `+ 3`).
pub fn write_names<W: Write>(a: &Analysis, tw: &mut TraceWriter<W>) -> io::Result<()> {
    for (t, _) in tracked(a) {
        let Some(p) = a.processes.get(&t.pid) else {
            continue;
        };
        let Some(j) = p.threads.keys().position(|k| *k == t.tid) else {
            continue;
        };
        let comm = p
            .threads
            .get(&t.tid)
            .map_or("thread", |th| th.comm.as_str());
        tw.thread_name(
            t.pid.0 as i64,
            t.tid.0 as i64 + WAIT_TID_OFFSET,
            &format!("{comm} waits"),
            (j * 4 + 2) as i64,
        )?;
    }
    Ok(())
}

/// Stretches merged at a level: span and time per class.
struct Merged {
    from: MonoNs,
    to: MonoNs,
    ns: [u64; CLASSES.len()],
    runs: u32,
}

fn merge(runs: &[WaitRun], gap: u64) -> Vec<Merged> {
    let mut out: Vec<Merged> = Vec::new();
    for r in runs {
        let len = r.to.0.saturating_sub(r.from.0);
        match out.last_mut() {
            Some(m) if gap > 0 && r.from.0.saturating_sub(m.to.0) < gap => {
                m.to = m.to.max(r.to);
                m.ns[index(r.class)] += len;
                m.runs += 1;
            }
            _ => {
                let mut ns = [0; CLASSES.len()];
                ns[index(r.class)] = len;
                out.push(Merged {
                    from: r.from,
                    to: r.to,
                    ns,
                    runs: 1,
                });
            }
        }
    }
    out
}

/// The wait tracks: of main and worker threads with the main stacks, of
/// other processes' threads with the detail.
pub fn parts(a: &Analysis) -> Vec<Part<'_>> {
    let run = a.end.0.saturating_sub(a.start.0);
    let tick = (1e9 / a.stacks.report.frequency_hz.max(1.0)) as u64;
    let level_to = |span: u64| (0..60).find(|l| merge_gap(tick, *l) >= span).unwrap_or(60);
    let mut out = Vec::new();
    for (class, main, label) in [
        (Class::MainStacks, true, "wait tracks (main, worker)"),
        (Class::Detail, false, "wait tracks (other)"),
    ] {
        if !tracked(a).any(|(_, r)| matches!(r, Role::Main | Role::Worker) == main) {
            continue;
        }
        out.push(Part {
            class,
            name: label.into(),
            max_level: level_to(run) + 1,
            floor_level: level_to(run / 4096),
            write: Box::new(move |level, tw| {
                let gap = merge_gap(tick, level);
                let mut merged = 0u64;
                for (t, role) in tracked(a) {
                    if matches!(role, Role::Main | Role::Worker) != main {
                        continue;
                    }
                    let (pid, tid) = (t.pid.0 as i64, t.tid.0 as i64 + WAIT_TID_OFFSET);
                    for m in merge(&t.runs, gap) {
                        if m.runs > 1 {
                            merged += 1;
                        }
                        write_run(tw, pid, tid, &m)?;
                    }
                }
                Ok((level > 0).then(|| {
                    format!(
                        "wait stretches less than {:.0} ms apart merged ({merged} merged slices; their args give each class's share)",
                        gap as f64 / 1e6
                    )
                }))
            }),
        });
    }
    out
}

fn write_run<W: Write>(tw: &mut TraceWriter<W>, pid: i64, tid: i64, m: &Merged) -> io::Result<()> {
    let (top, ns) =
        m.ns.iter()
            .enumerate()
            .max_by_key(|(i, n)| (**n, std::cmp::Reverse(*i)))
            .map(|(i, n)| (CLASSES[i], *n))
            .unwrap_or((WaitClass::Other, 0));
    if m.runs == 1 {
        return tw.slice(
            pid,
            tid,
            &format!("waiting: {}", top.label()),
            m.from,
            m.to,
            None,
        );
    }
    let span = m.to.0.saturating_sub(m.from.0).max(1) as f64;
    let pct = |n: u64| (n as f64 / span * 1000.0).round() / 10.0;
    let mut args = serde_json::Map::new();
    args.insert("blocked_pct".into(), json!(pct(m.ns.iter().sum())));
    for (i, n) in m.ns.iter().enumerate() {
        if *n > 0 {
            args.insert(
                format!("{}_pct", CLASSES[i].label().replace(' ', "_")),
                json!(pct(*n)),
            );
        }
    }
    let name = format!(
        "{} waiting: {} (merged)",
        if ns as f64 >= 0.5 * span {
            "mostly"
        } else {
            "partly"
        },
        top.label()
    );
    tw.slice_flow(
        pid,
        tid,
        &name,
        m.from,
        m.to,
        Some(&Value::Object(args)),
        None,
    )
}

/// What the job's main threads waited for during [from, to): per thread
/// with looks there, its class with the most time and that time's share
/// of the span ("main 1234: next batch 82%"). For a GPU idle gap's args.
pub fn during(a: &Analysis, from: MonoNs, to: MonoNs) -> Option<Value> {
    let span = to.0.saturating_sub(from.0);
    if span == 0 {
        return None;
    }
    let mut out = Vec::new();
    for (t, role) in tracked(a) {
        if role != Role::Main || t.pid.0 != t.tid.0 {
            continue;
        }
        let i = t.runs.partition_point(|r| r.to <= from);
        let mut ns = [0u64; CLASSES.len()];
        for r in t.runs[i..].iter().take_while(|r| r.from < to) {
            let o = r.to.min(to).0.saturating_sub(r.from.max(from).0);
            ns[index(r.class)] += o;
        }
        if let Some((k, n)) = ns
            .iter()
            .enumerate()
            .max_by_key(|x| *x.1)
            .filter(|x| *x.1 > 0)
        {
            out.push(format!(
                "{} {}: {} {:.0}%",
                a.processes
                    .get(&t.pid)
                    .map_or("process".into(), |p| p.label()),
                t.pid.0,
                CLASSES[k].label(),
                *n as f64 / span as f64 * 100.0
            ));
        }
    }
    (!out.is_empty()).then(|| json!(out))
}
