//! A GPU's idle gaps as the trace draws them at a reduction level: the
//! GPU tracks draw them and the stack tracks point flows at their causes.

use crate::analysis::gpu::GpuDeviceAnalysis;
use crate::event::MonoNs;

use super::trace_writer::merge_gap;

pub const GAPS_PART: &str = "GPU idle gaps and their causes";
/// Gaps per GPU that get causes at level 0 (the longest); halved per level.
pub const MAX_CAUSE_SPANS: usize = 2048;

/// Idle gaps as drawn at a level: neighbours merged.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub start: MonoNs,
    pub end: MonoNs,
    pub idle_ns: u64,
    /// `d.idle_gaps[first..first + gaps]`.
    pub first: usize,
    pub gaps: usize,
}

pub fn spans(d: &GpuDeviceAnalysis, level: u32) -> Vec<Span> {
    let gap = merge_gap(d.resolution_ns.max(1), level);
    let mut out: Vec<Span> = Vec::new();
    for (i, &(s, e)) in d.idle_gaps.iter().enumerate() {
        let len = e.0.saturating_sub(s.0);
        match out.last_mut() {
            // Overlapping gaps (never from the analysis) merge too: slices
            // on one track must nest.
            Some(last) if s < last.end || (gap > 0 && s.0.saturating_sub(last.end.0) < gap) => {
                last.end = last.end.max(e);
                last.idle_ns += len;
                last.gaps += 1;
            }
            _ => out.push(Span {
                start: s,
                end: e,
                idle_ns: len,
                first: i,
                gaps: 1,
            }),
        }
    }
    out
}
