//! A step rate per process: each rank of a distributed job runs its own
//! training loop, and the job's steps (found on one process) say nothing
//! of another rank's. The same methods as for the job's steps, restricted
//! to one process: its NVTX step range (the job's, when it has one of
//! that name), else its main thread's stacks; or why not.

use super::by_stacks::{from_stacks, loop_thread, MIN_LOOP_SAMPLES};
use super::{choose_nvtx, intervals_from_starts, Analysis};
use crate::event::{MonoNs, Pid};

/// One process's steps: their rate, or why there is none.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessSteps {
    pub steps_per_s: Option<f64>,
    pub count: usize,
    /// How they were found (`nvtx-range`, `python-stacks`), or why none.
    pub how: String,
}

/// Steps inside the recorded window and their rate.
fn rate(a: &Analysis, iv: &[(MonoNs, MonoNs)]) -> (Option<f64>, usize) {
    let iv: Vec<&(MonoNs, MonoNs)> = iv.iter().filter(|s| s.1 > a.start && s.0 < a.end).collect();
    let span = match (iv.first(), iv.last()) {
        (Some(f), Some(l)) => l.1.secs_since(f.0),
        _ => 0.0,
    };
    ((span > 0.0).then(|| iv.len() as f64 / span), iv.len())
}

/// The steps of process `pid`.
pub fn steps_of(a: &Analysis, pid: Pid) -> ProcessSteps {
    let st = &a.steps;
    if st.pid == Some(pid.0) && st.found() {
        return ProcessSteps {
            steps_per_s: st.steps_per_s,
            count: st.count,
            how: st.method.clone(),
        };
    }
    // The job's NVTX step range by name, when it was one; else any range
    // of this process that looks like steps.
    let given = st
        .method
        .starts_with("nvtx-range")
        .then_some(st.name.as_deref())
        .flatten();
    let mut notes = Vec::new();
    if let Some((c, _)) = choose_nvtx(a, given, Some(pid), &mut notes) {
        let (sps, n) = rate(a, &intervals_from_starts(&c.ranges));
        if n > 0 {
            return ProcessSteps {
                steps_per_s: sps,
                count: n,
                how: "nvtx-range".into(),
            };
        }
    }
    if let Some((iv, ..)) = from_stacks(a, Some(pid)) {
        let (sps, n) = rate(a, &iv);
        if n > 0 {
            return ProcessSteps {
                steps_per_s: sps,
                count: n,
                how: "python-stacks".into(),
            };
        }
    }
    let main = loop_thread(a, Some(pid));
    let samples = a
        .stacks
        .samples
        .iter()
        .filter(|s| main == Some((s.pid, s.tid)))
        .count();
    let stacks = if samples < MIN_LOOP_SAMPLES {
        format!("only {samples} stack samples of its main thread (at least {MIN_LOOP_SAMPLES} needed to look for a loop)")
    } else {
        format!("no Python function of its main thread entered at a regular period in {samples} stack samples")
    };
    ProcessSteps {
        steps_per_s: None,
        count: 0,
        how: format!(
            "no steps found on process {pid}: no repeating NVTX range of its own, and {stacks}"
        ),
    }
}
