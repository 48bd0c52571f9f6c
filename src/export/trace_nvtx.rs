//! The NVTX part of the Chrome trace.
//!
//! Push/pop ranges go on a track of their own per thread and domain, placed
//! just below the thread's own (stack) track: "NVTX <thread> (<tid>)" or
//! "NVTX <domain>: <thread> (<tid>)". They nest by construction; ranges
//! that would not nest on one track (a range still open when its thread
//! ended, closed there) go to an extra lane "… #2", so no slice ever
//! overlaps another without nesting. Start/end ranges, which may overlap
//! freely and end on another thread, go on per-process lanes
//! "NVTX start/end ranges". Marks are instant events on their thread's
//! track. Over [`TRACE_MAX_NVTX_SLICES`], the deepest nesting levels are
//! left out (said in the trace metadata), never the outermost ranges.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde_json::{json, Value};

use crate::analysis::nvtx::{NvtxAnalysis, NvtxRange};
use crate::analysis::Analysis;
use crate::event::{MonoNs, Pid, Tid};

use super::trace_ids::{NVTX_TID_BASE, STEPS_TID};
use super::trace_writer::TraceWriter;

/// Slices of NVTX ranges in the trace at most (~100 bytes each).
pub const TRACE_MAX_NVTX_SLICES: usize = 300_000;

/// A track key: process, thread (None: start/end lanes), domain, lane.
type TrackKey = (Pid, Option<Tid>, u32, usize);

/// Assign ranges (sorted by start, longer first) to lanes on which they
/// nest; returns the lane of each range.
fn lanes(ranges: &[&NvtxRange]) -> Vec<usize> {
    let mut stacks: Vec<Vec<MonoNs>> = Vec::new();
    let mut out = Vec::with_capacity(ranges.len());
    for r in ranges {
        let mut placed = None;
        for (i, st) in stacks.iter_mut().enumerate() {
            while st.last().is_some_and(|&e| e <= r.start) {
                st.pop();
            }
            if st.last().map_or(true, |&e| r.end <= e) {
                st.push(r.end);
                placed = Some(i);
                break;
            }
        }
        let lane = placed.unwrap_or_else(|| {
            stacks.push(vec![r.end]);
            stacks.len() - 1
        });
        out.push(lane);
    }
    out
}

fn thread_label(a: &Analysis, pid: Pid, tid: Tid) -> String {
    if let Some(n) = a.nvtx.thread_names.get(&(pid, tid)) {
        return format!("{n} ({tid})");
    }
    let comm = a
        .processes
        .get(&pid)
        .and_then(|p| p.threads.get(&tid))
        .map(|t| t.comm.as_str())
        .filter(|c| !c.is_empty());
    match comm {
        Some(c) => format!("{c} ({tid})"),
        None => format!("thread {tid}"),
    }
}

/// Sort index of a thread's NVTX tracks: right after the thread's own
/// track (see `trace::write_processes`).
fn sort_index(a: &Analysis, pid: Pid, tid: Option<Tid>, lane: usize) -> i64 {
    let j = tid.and_then(|tid| {
        a.processes
            .get(&pid)
            .and_then(|p| p.threads.keys().position(|t| *t == tid))
    });
    match j {
        Some(j) => (j * 4 + 1) as i64 + lane.min(1) as i64,
        None => 1_000_000 + lane as i64,
    }
}

fn args(n: &NvtxAnalysis, r: &NvtxRange) -> Option<Value> {
    let mut m = serde_json::Map::new();
    let d = n.domain(r.dom);
    if !d.is_empty() {
        m.insert("domain".into(), json!(d));
    }
    if r.cat != 0 {
        let c = n
            .categories
            .get(&(r.dom, r.cat))
            .cloned()
            .unwrap_or_else(|| r.cat.to_string());
        m.insert("category".into(), json!(c));
    }
    if let Some(p) = r.payload {
        m.insert("payload".into(), json!(p));
    }
    if let Some(t) = r.etid {
        m.insert("ended on thread".into(), json!(t.0));
    }
    if r.open {
        m.insert(
            "end".into(),
            json!("not seen: closed when its thread or process ended, or when recording stopped"),
        );
    }
    (!m.is_empty()).then_some(Value::Object(m))
}

/// Steps drawn in the trace at most.
pub const TRACE_MAX_STEPS: usize = 100_000;

/// The steps as slices "step N" on a track "Steps (…)"; slow steps carry
/// their causes in args.
pub fn write_steps<W: Write>(a: &Analysis, tw: &mut TraceWriter<W>) -> io::Result<Value> {
    let s = &a.steps;
    if s.intervals.is_empty() {
        return Ok(Value::Null);
    }
    let pid = s.pid.map(|p| p as i64).unwrap_or(a.header.job_pid.0 as i64);
    if !a.processes.contains_key(&Pid(pid as i32)) {
        tw.process_name(pid, &format!("pid {pid}"), 3000)?;
    }
    let what = match s.method.as_str() {
        "nvtx-range" | "nvtx-range-auto" => s.name.clone().unwrap_or_default(),
        "gpu-idle-gaps" => "estimated from GPU idle gaps".into(),
        _ => "estimated from stacks".into(),
    };
    tw.thread_name(pid, STEPS_TID, &format!("Steps ({what})"), -1)?;
    let slow: BTreeMap<usize, &crate::analysis::steps::SlowStep> =
        s.slow.iter().map(|x| (x.index, x)).collect();
    let thr = s.slow_threshold_s.unwrap_or(f64::INFINITY);
    for (i, &(from, to)) in s.intervals.iter().enumerate().take(TRACE_MAX_STEPS) {
        let d = to.secs_since(from);
        let args = match slow.get(&i) {
            Some(x) => Some(json!({
                "slow": format!("{:.1}× the median step", x.vs_median),
                "causes": x.causes.iter().map(|c| c.text.clone()).collect::<Vec<_>>(),
            })),
            None if d >= thr => Some(json!({"slow": "yes (not analysed: only the slowest are)"})),
            None => None,
        };
        let name = if d >= thr {
            format!("step {i} (slow)")
        } else {
            format!("step {i}")
        };
        tw.slice(pid, STEPS_TID, &name, from, to, args)?;
    }
    Ok(json!({
        "steps": s.intervals.len().min(TRACE_MAX_STEPS),
        "method": s.method,
    }))
}

/// Write the NVTX tracks; returns the trace metadata about them.
pub fn write_nvtx<W: Write>(a: &Analysis, tw: &mut TraceWriter<W>) -> io::Result<Value> {
    let n = &a.nvtx;
    if n.ranges.is_empty() && n.marks.is_empty() {
        return Ok(Value::Null);
    }
    // Budget: keep whole nesting levels, outermost first.
    let mut per_level: BTreeMap<u32, usize> = BTreeMap::new();
    for r in &n.ranges {
        *per_level.entry(r.lvl).or_default() += 1;
    }
    let mut max_level = u32::MAX;
    let mut kept = 0usize;
    for (&lvl, &c) in &per_level {
        if kept + c > TRACE_MAX_NVTX_SLICES && lvl > 0 {
            max_level = lvl - 1;
            break;
        }
        kept += c;
    }
    let left_out: usize = per_level
        .iter()
        .filter(|(l, _)| **l > max_level)
        .map(|(_, c)| *c)
        .sum();

    // Group ranges by track (before lanes).
    let mut groups: BTreeMap<(Pid, Option<Tid>, u32), Vec<&NvtxRange>> = BTreeMap::new();
    for r in n.ranges.iter().filter(|r| r.lvl <= max_level) {
        let tid = (!r.se).then_some(r.tid);
        groups.entry((r.pid, tid, r.dom)).or_default().push(r);
    }
    let mut tracks: BTreeMap<TrackKey, i64> = BTreeMap::new();
    let mut next_tid: BTreeMap<Pid, i64> = BTreeMap::new();
    let mut track_id = |tw: &mut TraceWriter<W>, key: TrackKey| -> io::Result<i64> {
        if let Some(t) = tracks.get(&key) {
            return Ok(*t);
        }
        let (pid, tid, dom, lane) = key;
        let k = next_tid.entry(pid).or_insert(NVTX_TID_BASE);
        let id = *k;
        *k += 1;
        if !a.processes.contains_key(&pid) && id == NVTX_TID_BASE {
            tw.process_name(pid.0 as i64, &format!("pid {pid}"), 3000)?;
        }
        let d = n.domain(dom);
        let mut name = match tid {
            Some(t) => format!("NVTX {}", thread_label(a, pid, t)),
            None => "NVTX start/end ranges".to_string(),
        };
        if !d.is_empty() {
            name = name.replacen("NVTX ", &format!("NVTX {d}: "), 1);
        }
        if lane > 0 {
            name.push_str(&format!(" #{}", lane + 1));
        }
        tw.thread_name(pid.0 as i64, id, &name, sort_index(a, pid, tid, lane))?;
        tracks.insert(key, id);
        Ok(id)
    };
    let mut slices = 0usize;
    for ((pid, tid, dom), rs) in &groups {
        for (r, lane) in rs.iter().zip(lanes(rs)) {
            let t = track_id(tw, (*pid, *tid, *dom, lane))?;
            tw.slice(pid.0 as i64, t, &n.label(r), r.start, r.end, args(n, r))?;
            slices += 1;
        }
    }
    for m in &n.marks {
        let t = track_id(tw, (m.pid, Some(m.tid), m.dom, 0))?;
        let ts = tw.ts(m.start);
        let mut v = json!({"ph":"i","s":"t","name":n.label(m),"pid":m.pid.0,"tid":t,"ts":ts});
        if let Some(x) = args(n, m) {
            v["args"] = x;
        }
        tw.raw(&v)?;
    }
    Ok(json!({
        "slices": slices,
        "marks": n.marks.len(),
        "budget": TRACE_MAX_NVTX_SLICES,
        "levels_left_out_from": if left_out > 0 { json!(max_level + 1) } else { Value::Null },
        "slices_left_out": left_out,
    }))
}

/// The NVTX parts of the trace (see `trace_budget`): ranges and marks, and
/// the steps, in the class of the main threads' stacks. They are written
/// whole (`write_nvtx` bounds the ranges itself); the planner may leave
/// them out only as a last resort. Their metadata goes into `meta`
/// ("nvtx", "steps").
pub fn parts<'a>(
    a: &'a Analysis,
    meta: &'a std::cell::RefCell<serde_json::Map<String, Value>>,
) -> Vec<super::trace_budget::Part<'a>> {
    use super::trace_budget::{Class, Part};
    let mut out = Vec::new();
    if !a.nvtx.ranges.is_empty() || !a.nvtx.marks.is_empty() {
        out.push(Part {
            class: Class::MainStacks,
            name: "NVTX ranges".into(),
            max_level: 0,
            floor_level: 0,
            write: Box::new(move |_, tw| {
                let v = write_nvtx(a, tw)?;
                meta.borrow_mut().insert("nvtx".into(), v);
                Ok(None)
            }),
        });
    }
    if !a.steps.intervals.is_empty() {
        out.push(Part {
            class: Class::MainStacks,
            name: "steps".into(),
            max_level: 0,
            floor_level: 0,
            write: Box::new(move |_, tw| {
                let v = write_steps(a, tw)?;
                meta.borrow_mut().insert("steps".into(), v);
                Ok(None)
            }),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: u64, e: u64) -> NvtxRange {
        NvtxRange {
            pid: Pid(1),
            tid: Tid(1),
            etid: None,
            dom: 0,
            name: 0,
            start: MonoNs(s),
            end: MonoNs(e),
            lvl: 0,
            se: false,
            open: false,
            cat: 0,
            payload: None,
        }
    }

    #[test]
    fn ranges_that_do_not_nest_get_another_lane() {
        let v = [r(0, 10), r(1, 5), r(2, 4), r(6, 12), r(11, 13), r(20, 30)];
        let refs: Vec<&NvtxRange> = v.iter().collect();
        // [6,12) overlaps [0,10) without nesting: lane 1; [11,13) fits on
        // lane 0 again once [0,10) ended.
        assert_eq!(lanes(&refs), vec![0, 0, 0, 1, 0, 0]);
    }
}
