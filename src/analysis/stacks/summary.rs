//! The stacks' figures for the report: sampler figures, per-role
//! summaries, and the Python sampler's report.

use super::intake::StackData;
use super::*;

/// The samplers' own figures into `rep` (lost records, truncations,
/// Python errors, their CPU, the frequency); returns the sampling period
/// (inferred from the samples for older or partial recordings).
pub(super) fn sampler_figures(
    rep: &mut StacksReport,
    d: &StackData,
    samples: &[Sample],
    bucket_ns: u64,
) -> u64 {
    let mut period_ns = 0;
    for st in &d.stats {
        match st.kind {
            Some(StackKind::Native) => {
                rep.sampler_named = !st.sampler.is_empty();
                rep.sampler = if st.sampler.is_empty() {
                    crate::vocab::stacks::SAMPLER_PERF.to_string()
                } else {
                    st.sampler.clone()
                };
                rep.sampler_detail = st.detail.clone();
                rep.lost_records += st.lost_records;
                rep.unwind_truncated += st.truncated;
                if st.interval_ns > 0 {
                    period_ns = st.interval_ns;
                }
            }
            Some(StackKind::Python) => {
                rep.python_stacks += st.samples;
                rep.python_errors += st.errors;
            }
            None => {}
        }
        rep.sampler_cpu_s += st.busy_ns as f64 / 1e9;
    }
    if !d.stats.iter().any(|s| s.kind == Some(StackKind::Python)) {
        // The Python sampler's counters were not written (gpuprof was
        // killed): count the stacks in the recording.
        rep.python_stacks = d.python.seen;
    }
    if rep.sampler.is_empty() {
        rep.sampler = if !samples.is_empty() {
            // Native counters not written (gpuprof killed): the samples'
            // own sources say which.
            if d.py_procs.values().any(|p| p.timer) {
                crate::vocab::stacks::SAMPLER_TIMER
            } else {
                crate::vocab::stacks::SAMPLER_PERF
            }
        } else if rep.python_stacks > 0 {
            "python-only"
        } else {
            "none"
        }
        .to_string();
    }
    rep.sampler_cpu_s = round4(rep.sampler_cpu_s);
    rep.frequency_hz = if period_ns > 0 {
        round4(1e9 / period_ns as f64)
    } else {
        0.0
    };
    if period_ns == 0 && bucket_ns == 0 {
        // Older or partial recordings: infer from the samples.
        let mut gaps: Vec<u64> = samples
            .windows(2)
            .filter(|w| w[0].tid == w[1].tid && w[0].pid == w[1].pid)
            .map(|w| w[1].t.0.saturating_sub(w[0].t.0))
            .filter(|g| *g > 0)
            .collect();
        gaps.sort_unstable();
        period_ns = gaps.get(gaps.len() / 2).copied().unwrap_or(0);
    }
    period_ns
}

impl Stacks {
    /// `report.samples_per_role` and `report.roles`.
    pub(super) fn summarize_roles(&mut self) {
        let mut roles = BTreeMap::new();
        for role in Role::ALL {
            let n = self.role_weight(Some(role));
            self.report.samples_per_role.insert(role.to_string(), n);
            if n == 0 {
                continue;
            }
            let processes = self.procs.values().filter(|m| m.role == role).count() as u64;
            roles.insert(
                role.to_string(),
                RoleStacks {
                    samples: n,
                    processes,
                    top_functions: self.top_functions(Some(role), TOP_FUNCTIONS),
                },
            );
        }
        self.report.roles = roles;
    }
}

/// `stacks.python`: per process (those that ran Python code, or that the
/// agent or py-spy saw) and per CPython version.
pub(super) fn python_report(
    d: &StackData,
    procs: &BTreeMap<Pid, ProcMeta>,
    per_proc: &BTreeMap<Pid, AttributionCounts>,
    py_only: &BTreeMap<Pid, u64>,
    agent_pids: &std::collections::BTreeSet<Pid>,
) -> PythonReport {
    let mut rep = PythonReport::default();
    let pids: std::collections::BTreeSet<Pid> = per_proc
        .iter()
        .filter(|(_, c)| c.python() > 0)
        .map(|(p, _)| *p)
        .chain(py_only.keys().copied())
        .chain(d.py_procs.keys().copied())
        .collect();
    for pid in pids {
        let counts = per_proc.get(&pid).cloned().unwrap_or_default();
        let info = d.py_procs.get(&pid);
        let version = info.map(|i| i.version.clone()).filter(|v| !v.is_empty());
        let minor = version
            .as_deref()
            .map(|v| v.splitn(3, '.').take(2).collect::<Vec<_>>().join("."))
            .unwrap_or_else(|| "unknown".into());
        let same_instant = agent_pids.contains(&pid);
        rep.by_version.entry(minor).or_default().merge(&counts);
        rep.counts.merge(&counts);
        let n_py_only = py_only.get(&pid).copied().unwrap_or(0);
        rep.python_only_stacks += n_py_only;
        rep.processes.push(PyProcessReport {
            pid,
            name: procs
                .get(&pid)
                .map(|m| m.name.clone())
                .unwrap_or_else(|| d.fallback_meta(pid).name),
            version,
            sampler: if same_instant {
                "same-instant"
            } else {
                "python-only"
            },
            native_sampler: if info.is_some_and(|i| i.timer) {
                Some(crate::vocab::stacks::SAMPLER_TIMER)
            } else if per_proc.contains_key(&pid) {
                Some(crate::vocab::stacks::SAMPLER_PERF)
            } else {
                None
            },
            detail: info.map(|i| i.detail.clone()).unwrap_or_default(),
            counts,
            python_only_stacks: n_py_only,
            py_spy_estimate: 0,
            agent: d.agent_stats.get(&pid).cloned(),
        });
    }
    rep
}
