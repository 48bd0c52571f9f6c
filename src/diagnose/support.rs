//! How well each finding is measured, and the severity its evidence allows.
//!
//! A rule sizes its finding by the share of the run it costs; that share
//! is counted from a finite number of observations — sampling intervals
//! (one reading of each thread's state and CPU per interval), each of
//! which the rules give one cause; a measured GPU time also rests on the
//! driver's utilization samples, which must not be too few. The same healthy job shows a cause in a few intervals by
//! chance (a thread read running at the instant it woke); a 1 s recording
//! has ten intervals, and one of them is 10% of the run. So the severity
//! of a finding is that of the *lower* end of the 95% confidence interval
//! of its share (a Wilson score interval, [`wilson`]) and its cause must be
//! seen in at least [`th::MIN_CAUSE_INTERVALS`] intervals (and a measured
//! one rest on at least as many driver samples): below what a
//! warning needs, a finding is info, says "possible" and how long to
//! record to know ([`Support::record_s_to_know`]). Possible findings rank
//! after the established ones, so that noise never becomes the top
//! finding of a run.

use serde::Serialize;

use crate::analysis::Analysis;
use crate::units::{pct, plural};

use super::evidence::GpuEvidence;
use super::measure::{measured_devices, Scope};
use super::thresholds as th;
use super::timeline::{Cause, Timeline};
use super::{Basis, Finding, FindingKind, Severity};

/// The evidence behind a finding's share, and what it establishes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Support {
    /// Sampling intervals of the recording.
    pub intervals: u64,
    /// Intervals whose cause is this finding's (for gpu-idle-unexplained:
    /// the observations its share amounts to).
    pub cause_intervals: u64,
    /// The driver's utilization samples over the recording, when the GPU
    /// time was measured.
    pub driver_samples: Option<u64>,
    /// Stack samples taken in the intervals of its cause.
    pub stack_samples: Option<u64>,
    /// Observations the share's interval rests on: the sampling intervals.
    pub observations: u64,
    /// The share of the run the finding costs, and its 95% interval.
    pub share: f64,
    pub share_low: f64,
    pub share_high: f64,
    /// The severity the rule gave from the share alone.
    pub severity_by_size: Severity,
    /// Whether the evidence establishes the finding at its size; when it
    /// does not, the finding is info and its title says "possibly".
    pub established: bool,
    /// Seconds of recording that would establish it at its size (at the
    /// same share), when it is not established and recording longer can.
    pub record_s_to_know: Option<f64>,
}

/// The Wilson score interval of a share `p` observed over `n`
/// observations, for a normal quantile `z`: (low, high). Unlike the
/// normal approximation it stays inside [0, 1] and is honest for small
/// `n` and shares near 0 or 1.
pub fn wilson(p: f64, n: f64, z: f64) -> (f64, f64) {
    if n <= 0.0 {
        return (0.0, 1.0);
    }
    let p = p.clamp(0.0, 1.0);
    let z2 = z * z;
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denom;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// Observations needed for a share `p` to be established at `target`:
/// its interval's low end at or above `target`, and the cause in at least
/// [`th::MIN_CAUSE_INTERVALS`] of them. None when no length would do
/// (the share is at or below the target).
pub fn observations_needed(p: f64, target: f64) -> Option<f64> {
    if p <= target {
        return None;
    }
    let ok = |n: f64| {
        wilson(p, n, th::SHARE_CONFIDENCE_Z).0 >= target && p * n >= th::MIN_CAUSE_INTERVALS
    };
    let mut hi = 1.0f64;
    while !ok(hi) {
        hi *= 2.0;
        if hi > 1e9 {
            return None;
        }
    }
    let mut lo = hi / 2.0;
    while hi - lo > 1.0 {
        let mid = ((lo + hi) / 2.0).floor();
        if ok(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi.ceil())
}

/// The severity the lower end of a share's interval allows.
fn severity_of_low(low: f64) -> Severity {
    Severity::from_share(low)
}

/// The cause whose intervals a finding counts, for the findings sized
/// from the timeline.
fn cause_of(k: FindingKind) -> Option<Cause> {
    Some(match k {
        FindingKind::IoBound | FindingKind::SlowStorage => Cause::Io,
        FindingKind::WriteStall => Cause::WriteStall,
        FindingKind::WorkerRestarts => Cause::WorkerRestart,
        FindingKind::MainProcessPreprocessing => Cause::MainPreprocessing,
        FindingKind::TooFewWorkers | FindingKind::InputPipelineBound => Cause::PipelineSaturated,
        FindingKind::CpuOversubscribed => Cause::Oversubscribed,
        FindingKind::TrainingLoop => Cause::TrainingLoop,
        FindingKind::Compilation => Cause::Compiling,
        FindingKind::CpuLimit => Cause::CpuLimited,
        FindingKind::HostMemoryPressure => Cause::MemoryPressure,
        _ => return None,
    })
}

/// Driver utilization samples over the recording on the measured GPUs
/// (the fewest of them).
fn driver_samples(gpu: Option<&GpuEvidence>) -> Option<u64> {
    measured_devices(gpu)
        .iter()
        .filter_map(|d| {
            let (a, b) = d.sampled?;
            (d.resolution_s > 0.0).then(|| (b.secs_since(a) / d.resolution_s).round() as u64)
        })
        .min()
}

/// Stack samples (recorded samples they stand for) taken in the intervals
/// of `cause`.
fn stack_samples_in(a: &Analysis, tl: &Timeline, cause: Cause) -> Option<u64> {
    if a.stacks.samples.is_empty() {
        return None;
    }
    Some(
        a.stacks
            .samples
            .iter()
            .filter(|s| {
                tl.cause_bin_of(s.t)
                    .is_some_and(|i| tl.cause[i] == Some(cause))
            })
            .map(|s| s.weight as u64)
            .sum(),
    )
}

/// The support of one finding, or None for findings not sized by a share
/// of sampled intervals (hardware and setup findings, which rest on the
/// device's or the job's own reports; coverage; stragglers, which have
/// their own sample minimum).
pub fn support_of(
    a: &Analysis,
    tl: &Timeline,
    gpu: Option<&GpuEvidence>,
    f: &Finding,
) -> Option<Support> {
    let gt = f.gpu_time.as_ref()?;
    let cause = cause_of(f.kind);
    if cause.is_none() && f.kind != FindingKind::GpuIdleUnexplained {
        return None;
    }
    // Whole intervals, as the coverage finding counts them (the last bin
    // of the timeline may be a sliver).
    let bin_s = tl.bin_ns as f64 / 1e9;
    let intervals = ((a.duration_s() / bin_s).round() as u64).max(1);
    let driver = if gt.basis == Basis::Measured {
        driver_samples(gpu)
    } else {
        None
    };
    // The driver's utilization is a measured fraction of each window, not
    // a binary reading: what makes a finding's share uncertain is which
    // intervals its cause was found in. Too few driver windows make the
    // measured side itself too coarse (below).
    let observations = intervals.max(1);
    let share = gt.share.clamp(0.0, 1.0);
    let cause_intervals = match cause {
        Some(c) => (tl.bins_of(c).count() as u64).min(intervals),
        None => (share * observations as f64).round() as u64,
    };
    let (low, high) = wilson(share, observations as f64, th::SHARE_CONFIDENCE_Z);
    let enough_intervals = cause_intervals as f64 >= th::MIN_CAUSE_INTERVALS
        && driver.map_or(true, |d| d as f64 >= th::MIN_CAUSE_INTERVALS);
    let by_evidence = if enough_intervals {
        severity_of_low(low)
    } else {
        Severity::Info
    };
    let severity_by_size = f.severity;
    let severity = severity_by_size.min(by_evidence);
    let there = enough_intervals && low >= th::MIN_SHARE;
    let established = there && !(severity == Severity::Info && severity_by_size > Severity::Info);
    let record_s_to_know = (!established)
        .then(|| {
            let target = if severity_by_size > Severity::Info {
                th::WARNING_SHARE
            } else {
                th::MIN_SHARE
            };
            let per_obs = a.duration_s() / observations as f64;
            observations_needed(share, target).map(|n| n * per_obs)
        })
        .flatten();
    Some(Support {
        intervals,
        cause_intervals,
        driver_samples: driver,
        stack_samples: cause.and_then(|c| stack_samples_in(a, tl, c)),
        observations,
        share,
        share_low: low,
        share_high: high,
        severity_by_size,
        established,
        record_s_to_know,
    })
}

/// "12 s", "3.5 min", "2.0 h": how long to record.
fn duration_text(s: f64) -> String {
    if s < 60.0 {
        format!("{:.0} s", s.ceil().max(1.0))
    } else if s < 3600.0 {
        format!("{:.1} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

impl Support {
    /// The evidence line: what the share rests on, and what it establishes.
    pub fn line(&self) -> String {
        let mut what = vec![format!(
            "its cause in {} of {} sampling intervals",
            self.cause_intervals, self.intervals
        )];
        if let Some(d) = self.driver_samples {
            what.push(format!("{d} driver utilization samples"));
        }
        if let Some(s) = self.stack_samples {
            what.push(format!("{} then", plural(s as usize, "stack sample")));
        }
        let figures = format!(
            "{}; its share of the run {} (95% interval {}–{} over {} observations)",
            what.join(", "),
            pct(self.share),
            pct(self.share_low),
            pct(self.share_high),
            self.observations
        );
        if self.established {
            let short = if self.severity_by_size == Severity::Critical
                && severity_of_low(self.share_low) < Severity::Critical
            {
                format!(
                    " — a warning, not critical: critical needs the whole interval at or above {}",
                    pct(th::CRITICAL_SHARE)
                )
            } else {
                String::new()
            };
            return format!("Evidence: {figures}{short}.");
        }
        let needs = if self.severity_by_size > Severity::Info {
            format!(
                "a warning needs the interval at or above {} and the cause in at least {:.0} intervals",
                pct(th::WARNING_SHARE),
                th::MIN_CAUSE_INTERVALS
            )
        } else {
            format!(
                "a finding needs the interval at or above {} and the cause in at least {:.0} intervals",
                pct(th::MIN_SHARE),
                th::MIN_CAUSE_INTERVALS
            )
        };
        let know = match self.record_s_to_know {
            Some(s) => format!(" Record at least {} to know.", duration_text(s)),
            None => " Its share is too close to the threshold for a longer recording to settle it."
                .to_string(),
        };
        format!("Possible, not established: {figures}; {needs}.{know}")
    }
}

/// "Possibly too few input workers: …", keeping a "Rank 1: " prefix in
/// front and an initialism ("IO-bound", "CPU oversubscribed") as it is.
fn possibly(title: &str) -> String {
    let (prefix, rest) = match title.strip_prefix("Rank ") {
        Some(r) => match r.find(": ") {
            Some(k) => title.split_at("Rank ".len() + k + 2),
            None => ("", title),
        },
        None => ("", title),
    };
    let mut cs = rest.chars();
    let body = match (cs.next(), cs.next()) {
        (Some(a), Some(b)) if b.is_lowercase() => {
            format!("{}{b}{}", a.to_lowercase(), cs.as_str())
        }
        _ => rest.to_string(),
    };
    if prefix.is_empty() {
        format!("Possibly {body}")
    } else {
        format!("{prefix}possibly {body}")
    }
}

/// Grade every finding sized by a share of sampled intervals: its
/// severity is at most what its evidence allows, and one that is not
/// established says "possibly" and how long to record.
pub fn grade(
    a: &Analysis,
    whole: &Timeline,
    scopes: &[Scope],
    gpu: Option<&GpuEvidence>,
    findings: &mut [Finding],
) {
    for f in findings.iter_mut() {
        let (tl, g) = match f.rank {
            Some(r) => match scopes.iter().find(|s| s.rank == Some(r)) {
                Some(s) => (&s.tl, s.gpu.as_ref()),
                None => (whole, gpu),
            },
            None if scopes.len() == 1 => (&scopes[0].tl, scopes[0].gpu.as_ref()),
            None => (whole, gpu),
        };
        let Some(s) = support_of(a, tl, g, f) else {
            continue;
        };
        f.severity = f.severity.min(if s.established {
            severity_of_low(s.share_low).max(Severity::Info)
        } else {
            Severity::Info
        });
        if !s.established {
            f.title = possibly(&f.title);
        }
        f.evidence.push(s.line());
        f.support = Some(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_matches_known_values() {
        // 1 of 9: 0.020–0.435 (z = 1.96).
        let (lo, hi) = wilson(1.0 / 9.0, 9.0, 1.96);
        assert!(
            (lo - 0.0199).abs() < 1e-3 && (hi - 0.4350).abs() < 1e-3,
            "{lo} {hi}"
        );
        // 50 of 100: 0.404–0.596.
        let (lo, hi) = wilson(0.5, 100.0, 1.96);
        assert!(
            (lo - 0.4038).abs() < 1e-3 && (hi - 0.5962).abs() < 1e-3,
            "{lo} {hi}"
        );
        assert_eq!(wilson(0.3, 0.0, 1.96), (0.0, 1.0));
    }

    #[test]
    fn observations_needed_grow_as_the_share_nears_the_threshold() {
        let a = observations_needed(0.5, 0.1).unwrap();
        let b = observations_needed(0.2, 0.1).unwrap();
        assert!(a < b, "{a} {b}");
        assert!(wilson(0.2, b, th::SHARE_CONFIDENCE_Z).0 >= 0.1);
        assert!(wilson(0.2, b - 1.0, th::SHARE_CONFIDENCE_Z).0 < 0.1);
        assert_eq!(observations_needed(0.1, 0.1), None);
    }

    #[test]
    fn possibly_keeps_rank_prefixes_and_initialisms() {
        assert_eq!(
            possibly("Too few input workers: all 2"),
            "Possibly too few input workers: all 2"
        );
        assert_eq!(
            possibly("IO-bound: the input threads"),
            "Possibly IO-bound: the input threads"
        );
        assert_eq!(
            possibly("Rank 1: the input pipeline"),
            "Rank 1: possibly the input pipeline"
        );
    }
}
