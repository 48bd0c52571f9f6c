//! GIL contention: the training loop blocked waiting for the interpreter
//! lock that another thread of its process held. Seen only by the
//! wall-clock sampler (a thread waiting for the GIL is off-CPU), which
//! reads, at the same moment, which thread held the lock and in which
//! Python function (the interpreter's GIL state, read with the agent's
//! published layout or by py-spy: `collect::perf::offcpu`).

use crate::analysis::waits::WaitClass;
use crate::analysis::Analysis;
use crate::units::pct;

use super::rule::CauseRule;
use super::{Basis, Finding, FindingKind, GpuTime, Severity};

pub fn gil_contention(a: &Analysis) -> Vec<Finding> {
    let run_s = a.end.secs_since(a.start).max(1e-9);
    let mut out = Vec::new();
    for t in &a.waits.threads {
        if t.pid.0 != t.tid.0 || t.samples < crate::analysis::waits::MIN_LOOKS {
            continue;
        }
        let Some(gil) = t.waits.get(&WaitClass::Gil) else {
            continue;
        };
        if gil.share < super::thresholds::GIL_MIN_SHARE {
            continue;
        }
        let p = a.processes.get(&t.pid);
        let label = p.map_or_else(|| format!("process {}", t.pid.0), |p| p.label());
        let holder = t
            .gil_holders
            .first()
            .map_or("another thread".to_string(), |h| h.0.clone());
        let mut ev = vec![format!(
            "The main thread of {label} (pid {}) waited for the GIL {} of its time ({:.1} s of {:.1} s{}).",
            t.pid.0,
            pct(gil.share),
            gil.seconds,
            t.span_s,
            if t.steady { ", over its loop's steady state" } else { "" },
        )];
        let holders: Vec<String> = t
            .gil_holders
            .iter()
            .map(|(h, s)| format!("{h}: {s:.1} s"))
            .collect();
        if !holders.is_empty() {
            ev.push(format!(
                "Holding the GIL meanwhile (read at the same moment): {}.",
                holders.join("; ")
            ));
        }
        out.push(CauseRule {
            kind: FindingKind::GilContention,
            severity: Severity::from_share(gil.seconds / run_s),
            title: format!(
                "The training loop of {label} waits for the GIL {} of its time, held by {holder}",
                pct(gil.share)
            ),
            gpu_time: Some(GpuTime {
                seconds: gil.seconds,
                share: gil.seconds / run_s,
                basis: Basis::Estimated,
                method: "the loop thread's time blocked waiting for the GIL, from the wall-clock sampler's looks (each counts until the next); the GPU starves for at most that long".into(),
            }),
            evidence: ev,
            fix: format!("Take the work of {holder} off the interpreter lock: move it to another process (a DataLoader worker, multiprocessing), or make it release the GIL (numpy/torch operations on whole arrays instead of Python loops); a thread that polls in pure Python should sleep between polls."),
        }.finding_of(p.and_then(|p| p.rank)));
    }
    out
}
