//! NVTX ranges and marks of the job, from the recording: resolved names,
//! domains and threads, and per-name statistics with the GPU's busy share
//! inside the ranges.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::event::{Coverage, Event, MonoNs, NvtxStats, Pid, Tid};
use crate::vocab::nvtx::name_group;

/// Ranges kept in memory for the analysis; past this, ranges still count
/// in the per-name totals but are not kept one by one (bounded memory on
/// recordings of days).
pub const MAX_ANALYSIS_RANGES: usize = 2_000_000;

/// One range (or, with `end == start` and `mark`, an instant).
#[derive(Clone, Debug)]
pub struct NvtxRange {
    pub pid: Pid,
    pub tid: Tid,
    /// Start/end range ended on another thread.
    pub etid: Option<Tid>,
    /// Index into [`NvtxAnalysis::domains`].
    pub dom: u32,
    /// Index into [`NvtxAnalysis::names`].
    pub name: u32,
    pub start: MonoNs,
    pub end: MonoNs,
    pub lvl: u32,
    pub se: bool,
    pub open: bool,
    pub cat: u32,
    pub payload: Option<f64>,
}

impl NvtxRange {
    pub fn dur_ns(&self) -> u64 {
        self.end.0.saturating_sub(self.start.0)
    }
}

/// Per-name statistics (names grouped by [`name_group`]).
#[derive(Clone, Debug, Serialize)]
pub struct RangeGroup {
    pub domain: String,
    pub name: String,
    /// Distinct messages in the group (`step 1`, `step 2`, … are one group).
    pub distinct_names: usize,
    pub count: u64,
    pub total_s: f64,
    pub mean_s: f64,
    pub p50_s: Option<f64>,
    pub p95_s: Option<f64>,
    pub max_s: f64,
    /// Ranges the quantiles are computed from: all of them unless the
    /// recording kept some only as totals (over its detail budget).
    pub quantiles_from: u64,
    /// Share of the time inside these ranges that the job's GPUs were busy
    /// (time-weighted NVML utilization); None when the GPU was not measured.
    pub gpu_busy_share: Option<f64>,
    /// Nesting level of most of these ranges (0: outermost).
    pub level: u32,
    pub processes: usize,
    pub threads: usize,
    /// Ranges whose end was not seen (closed at their thread's or process's
    /// end, or at the end of the recording).
    pub open: u64,
}

#[derive(Clone, Debug, Default)]
pub struct NvtxAnalysis {
    /// Coverage as recorded (None: a recording without NVTX capture).
    pub coverage: Option<Coverage>,
    /// Interned messages (index 0: empty).
    pub names: Vec<String>,
    /// Domains by name, merged across processes (index 0: the default
    /// domain, "").
    pub domains: Vec<String>,
    /// Ranges sorted by start (marks are in `marks`).
    pub ranges: Vec<NvtxRange>,
    pub marks: Vec<NvtxRange>,
    /// Names given with `nvtxNameOsThread`.
    pub thread_names: BTreeMap<(Pid, Tid), String>,
    /// Category names by (domain index, category id).
    pub categories: BTreeMap<(u32, u32), String>,
    /// Processes whose NVTX calls were recorded.
    pub processes: BTreeSet<Pid>,
    pub stats: NvtxStats,
    /// Ranges left out of `ranges` by [`MAX_ANALYSIS_RANGES`].
    pub not_kept_in_analysis: u64,
    pub groups: Vec<RangeGroup>,
}

impl NvtxAnalysis {
    pub fn captured(&self) -> bool {
        self.coverage.as_ref().is_some_and(|c| c.available)
    }
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.marks.is_empty() && self.stats.over_budget == 0
    }
    pub fn name(&self, id: u32) -> &str {
        self.names
            .get(id as usize)
            .map(|s| s.as_str())
            .unwrap_or("")
    }
    pub fn domain(&self, id: u32) -> &str {
        self.domains
            .get(id as usize)
            .map(|s| s.as_str())
            .unwrap_or("")
    }
    /// "name" in the default domain, "domain: name" elsewhere.
    pub fn label(&self, r: &NvtxRange) -> String {
        let d = self.domain(r.dom);
        if d.is_empty() {
            self.name(r.name).to_string()
        } else {
            format!("{d}: {}", self.name(r.name))
        }
    }
}

struct RawRange {
    inst: u32,
    dom: u32,
    r: NvtxRange,
}

/// Builds the NVTX part of the analysis while the recording is read.
#[derive(Default)]
pub struct NvtxBuilder {
    coverage: Option<Coverage>,
    names: Vec<String>,
    /// inst → (pid, parent inst)
    instances: HashMap<u32, (Pid, Option<u32>)>,
    domains: HashMap<(u32, u32), String>,
    categories: Vec<(u32, u32, u32, String)>,
    thread_names: BTreeMap<(Pid, Tid), String>,
    ranges: Vec<RawRange>,
    marks: Vec<RawRange>,
    stats: NvtxStats,
    not_kept: u64,
}

impl NvtxBuilder {
    pub fn coverage(&mut self, c: &Coverage) {
        self.coverage = Some(c.clone());
    }

    pub fn add(&mut self, ev: &Event) {
        match ev {
            Event::NvtxInstance {
                inst, pid, parent, ..
            } => {
                self.instances.insert(*inst, (*pid, *parent));
            }
            Event::NvtxName { id, name } => {
                let i = *id as usize;
                if i < 50_000_000 {
                    if self.names.len() <= i {
                        self.names.resize(i + 1, String::new());
                    }
                    self.names[i] = name.clone();
                }
            }
            Event::NvtxDomain { inst, id, name } => {
                self.domains.insert((*inst, *id), name.clone());
            }
            Event::NvtxCategory {
                inst,
                dom,
                id,
                name,
            } => self.categories.push((*inst, *dom, *id, name.clone())),
            Event::NvtxThreadName { inst, tid, name } => {
                let pid = self.instances.get(inst).map(|x| x.0).unwrap_or(Pid(0));
                self.thread_names.insert((pid, *tid), name.clone());
            }
            Event::NvtxStats(s) => self.stats = s.clone(),
            Event::NvtxRanges(b) => {
                for r in &b.ranges {
                    let start = MonoNs(b.t0.0.saturating_add(r.s));
                    let range = NvtxRange {
                        pid: b.pid,
                        tid: b.tid,
                        etid: r.etid,
                        dom: 0,
                        name: r.n,
                        start,
                        end: MonoNs(start.0.saturating_add(r.d.unwrap_or(0))),
                        lvl: r.lvl,
                        se: r.se,
                        open: r.open,
                        cat: r.cat,
                        payload: r.p,
                    };
                    let raw = RawRange {
                        inst: b.inst,
                        dom: r.dom,
                        r: range,
                    };
                    if self.ranges.len() + self.marks.len() >= MAX_ANALYSIS_RANGES {
                        self.not_kept += 1;
                        // Still counted in the totals below.
                        self.stats.totals.push(crate::event::NvtxTotal {
                            inst: b.inst,
                            dom: r.dom,
                            name: r.n,
                            count: 1,
                            total_ns: r.d.unwrap_or(0),
                            max_ns: r.d.unwrap_or(0),
                        });
                        continue;
                    }
                    if r.d.is_some() {
                        self.ranges.push(raw);
                    } else {
                        self.marks.push(raw);
                    }
                }
            }
            _ => {}
        }
    }

    /// The domain name of (inst, id), looked up in the instance and then
    /// the instances it was forked from.
    fn domain_name(&self, inst: u32, id: u32) -> Option<&str> {
        if id == 0 {
            return Some("");
        }
        let mut cur = Some(inst);
        let mut hops = 0;
        while let Some(i) = cur {
            if let Some(n) = self.domains.get(&(i, id)) {
                return Some(n);
            }
            cur = self.instances.get(&i).and_then(|x| x.1);
            hops += 1;
            if hops > 64 {
                break;
            }
        }
        None
    }

    pub fn finish(
        self,
        window: (MonoNs, MonoNs),
        exits: &dyn Fn(Pid) -> Option<MonoNs>,
        gpu: &super::gpu::GpuAnalysis,
    ) -> NvtxAnalysis {
        let mut domains: Vec<String> = vec![String::new()];
        let mut dom_index: HashMap<String, u32> = HashMap::from([(String::new(), 0)]);
        let mut dom_of = |b: &NvtxBuilder, inst: u32, id: u32| -> u32 {
            let name = b
                .domain_name(inst, id)
                .map(|s| s.to_string())
                .unwrap_or_else(|| format!("domain {id}"));
            *dom_index.entry(name.clone()).or_insert_with(|| {
                domains.push(name);
                (domains.len() - 1) as u32
            })
        };
        let (w0, w1) = window;
        let mut ranges = Vec::with_capacity(self.ranges.len());
        for raw in &self.ranges {
            let mut r = raw.r.clone();
            if r.open {
                // Closed by the reader when it noticed the end: the process's
                // exit time, when known, is closer to the truth.
                if let Some(x) = exits(r.pid) {
                    if x < r.end {
                        r.end = x.max(r.start);
                    }
                }
            }
            if r.end < w0 || r.start > w1 {
                continue;
            }
            r.dom = dom_of(&self, raw.inst, raw.dom);
            ranges.push(r);
        }
        ranges.sort_by(|a, b| {
            (a.start, std::cmp::Reverse(a.end), a.pid, a.tid).cmp(&(
                b.start,
                std::cmp::Reverse(b.end),
                b.pid,
                b.tid,
            ))
        });
        let mut marks = Vec::with_capacity(self.marks.len());
        for raw in &self.marks {
            let mut r = raw.r.clone();
            if r.start < w0 || r.start > w1 {
                continue;
            }
            r.dom = dom_of(&self, raw.inst, raw.dom);
            marks.push(r);
        }
        marks.sort_by_key(|m| (m.start, m.pid, m.tid));
        let mut categories = BTreeMap::new();
        for (inst, dom, id, name) in &self.categories {
            let d = dom_of(&self, *inst, *dom);
            categories.insert((d, *id), name.clone());
        }
        let totals: Vec<(u32, u32, u64, u64, u64)> = self
            .stats
            .totals
            .iter()
            .map(|t| {
                (
                    dom_of(&self, t.inst, t.dom),
                    t.name,
                    t.count,
                    t.total_ns,
                    t.max_ns,
                )
            })
            .collect();
        let processes = self.instances.values().map(|x| x.0).collect();
        let mut a = NvtxAnalysis {
            coverage: self.coverage,
            names: self.names,
            domains,
            ranges,
            marks,
            thread_names: self.thread_names,
            categories,
            processes,
            stats: self.stats,
            not_kept_in_analysis: self.not_kept,
            groups: Vec::new(),
        };
        a.groups = groups(&a, &totals, gpu);
        a
    }
}

/// The GPUs' busy share over [from, to): mean NVML utilization of the GPUs
/// the job used (all GPUs when attribution is unavailable), over the part
/// of the interval they were sampled; None when not measured there.
pub fn gpu_busy_share(gpu: &super::gpu::GpuAnalysis, from: MonoNs, to: MonoNs) -> Option<f64> {
    let used: Vec<_> = gpu
        .devices
        .iter()
        .filter(|d| d.processes.iter().any(|p| p.in_job))
        .collect();
    let devs: Vec<_> = if used.is_empty() {
        gpu.devices.iter().collect()
    } else {
        used
    };
    let vals: Vec<f64> = devs
        .iter()
        .filter_map(|d| d.util.mean_in(from, to.max(MonoNs(from.0 + 1))))
        .collect();
    if vals.is_empty() {
        return None;
    }
    Some((vals.iter().sum::<f64>() / vals.len() as f64 / 100.0).clamp(0.0, 1.0))
}

fn quantile_sorted(v: &[u64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    Some(v[i.min(v.len() - 1)] as f64 / 1e9)
}

/// Per-name statistics, most total time first.
fn groups(
    a: &NvtxAnalysis,
    totals: &[(u32, u32, u64, u64, u64)],
    gpu: &super::gpu::GpuAnalysis,
) -> Vec<RangeGroup> {
    #[derive(Default)]
    struct Acc {
        names: BTreeSet<u32>,
        durs: Vec<u64>,
        extra_count: u64,
        extra_total: u64,
        max: u64,
        busy_ns: f64,
        busy_known_ns: f64,
        levels: BTreeMap<u32, u64>,
        pids: BTreeSet<Pid>,
        threads: BTreeSet<(Pid, Tid)>,
        open: u64,
    }
    let mut group_of: HashMap<u32, String> = HashMap::new();
    let mut acc: BTreeMap<(u32, String), Acc> = BTreeMap::new();
    let mut key = |dom: u32, name: u32| -> (u32, String) {
        let g = group_of
            .entry(name)
            .or_insert_with(|| name_group(a.name(name)))
            .clone();
        (dom, g)
    };
    let measured = gpu.available && !gpu.devices.is_empty();
    for r in &a.ranges {
        let e = acc.entry(key(r.dom, r.name)).or_default();
        let d = r.dur_ns();
        e.names.insert(r.name);
        e.durs.push(d);
        e.max = e.max.max(d);
        *e.levels.entry(r.lvl).or_default() += 1;
        e.pids.insert(r.pid);
        e.threads.insert((r.pid, r.tid));
        e.open += r.open as u64;
        if measured && d > 0 {
            if let Some(b) = gpu_busy_share(gpu, r.start, r.end) {
                e.busy_ns += b * d as f64;
                e.busy_known_ns += d as f64;
            }
        }
    }
    for &(dom, name, count, total, max) in totals {
        let e = acc.entry(key(dom, name)).or_default();
        e.names.insert(name);
        e.extra_count += count;
        e.extra_total += total;
        e.max = e.max.max(max);
    }
    let mut out: Vec<RangeGroup> = acc
        .into_iter()
        .map(|((dom, name), mut e)| {
            e.durs.sort_unstable();
            let kept = e.durs.len() as u64;
            let count = kept + e.extra_count;
            let total = e.durs.iter().sum::<u64>() + e.extra_total;
            RangeGroup {
                domain: a.domain(dom).to_string(),
                name,
                distinct_names: e.names.len(),
                count,
                total_s: total as f64 / 1e9,
                mean_s: if count > 0 {
                    total as f64 / count as f64 / 1e9
                } else {
                    0.0
                },
                p50_s: quantile_sorted(&e.durs, 0.5),
                p95_s: quantile_sorted(&e.durs, 0.95),
                max_s: e.max as f64 / 1e9,
                quantiles_from: kept,
                gpu_busy_share: (e.busy_known_ns > 0.0).then(|| e.busy_ns / e.busy_known_ns),
                level: e
                    .levels
                    .iter()
                    .max_by_key(|(l, n)| (**n, std::cmp::Reverse(**l)))
                    .map(|(l, _)| *l)
                    .unwrap_or(0),
                processes: e.pids.len(),
                threads: e.threads.len(),
                open: e.open,
            }
        })
        .collect();
    out.sort_by(|x, y| {
        y.total_s
            .total_cmp(&x.total_s)
            .then_with(|| (&x.domain, &x.name).cmp(&(&y.domain, &y.name)))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_standing_alone_are_grouped() {
        assert_eq!(name_group("step 12"), "step N");
        assert_eq!(name_group("epoch=3/iter=40"), "epoch=N/iter=N");
        assert_eq!(name_group("conv2d"), "conv2d");
        assert_eq!(name_group("layer1"), "layer1");
        assert_eq!(name_group("step_12"), "step_N");
        assert_eq!(name_group("lr 0.001"), "lr N");
        assert_eq!(name_group("aten::add, seq = 1234"), "aten::add, seq = N");
        assert_eq!(name_group("12"), "N");
        assert_eq!(name_group("étape 7"), "étape N");
    }
}
