//! The skeleton of a rule: what each rule fills in ([`CauseRule`]) and the
//! one place that makes a [`Finding`] of it. A rule measures (its scope,
//! its GPU time, its evidence lines) and words its title and fix; the
//! fields of the finding it does not decide (the rank of a per-rank
//! finding, the support a share rests on) are set here or later by the
//! diagnosis, never by hand in each rule.

use super::{Finding, FindingKind, GpuTime, Severity};

/// What a rule fills in for its finding.
pub(crate) struct CauseRule {
    pub kind: FindingKind,
    pub severity: Severity,
    /// What is wrong, in one line.
    pub title: String,
    /// GPU time explained; None for a risk or a setup problem that is not
    /// a time cost.
    pub gpu_time: Option<GpuTime>,
    /// Figures from this run.
    pub evidence: Vec<String>,
    /// What to change.
    pub fix: String,
}

impl CauseRule {
    /// A cause that costs GPU time: its severity is that of its share of
    /// the run.
    pub fn costing(
        kind: FindingKind,
        gpu_time: GpuTime,
        title: impl Into<String>,
        evidence: Vec<String>,
        fix: impl Into<String>,
    ) -> CauseRule {
        let severity = Severity::from_share(gpu_time.share);
        CauseRule {
            gpu_time: Some(gpu_time),
            ..CauseRule::risk(kind, severity, title, evidence, fix)
        }
    }

    /// A risk or a setup problem at a severity of its own, not a time cost.
    pub fn risk(
        kind: FindingKind,
        severity: Severity,
        title: impl Into<String>,
        evidence: Vec<String>,
        fix: impl Into<String>,
    ) -> CauseRule {
        CauseRule {
            kind,
            severity,
            title: title.into(),
            gpu_time: None,
            evidence,
            fix: fix.into(),
        }
    }

    /// The finding, about the whole job (no rank); its support, when its
    /// share rests on sampled intervals, is set by the diagnosis.
    pub fn finding(self) -> Finding {
        self.finding_of(None)
    }

    /// The finding about one rank (`None`: the whole job).
    pub fn finding_of(self, rank: Option<u32>) -> Finding {
        Finding {
            kind: self.kind,
            rank,
            severity: self.severity,
            title: self.title,
            gpu_time: self.gpu_time,
            evidence: self.evidence,
            fix: self.fix,
            support: None,
        }
    }
}
