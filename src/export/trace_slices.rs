//! The trace's stack slices: each thread's samples turned into nested
//! slices on a time grid, for the trace's thread tracks. Only the trace
//! exporter draws slices, so the slicing lives here rather than in the
//! stack analysis.

use crate::analysis::stacks::{Sample, Stacks, View, OUTER_FRAMES_CUT};
use crate::event::{MonoNs, Pid, Tid};
use crate::vocab::hash::splitmix64;

/// Deepest stack drawn in the trace (Perfetto keeps slices up to depth
/// 512): deeper stacks keep their innermost frames under a marker frame.
pub const TRACE_MAX_DEPTH: usize = 500;

/// A stack frame that was on a thread's stack from `start` to `end`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceSlice {
    pub pid: Pid,
    pub tid: Tid,
    pub depth: u32,
    pub name: u32,
    pub start: MonoNs,
    pub end: MonoNs,
}

/// The nested slices of one thread's samples at reduction `level`,
/// handed to `f` as they close (children before parents).
///
/// Sample times are put on a grid of [`Stacks::cell_ns`]: the
/// frequency-driven kernel sometimes samples twice within a period, and
/// a slice shorter than a period would claim a precision sampling does
/// not have. Of several samples in one cell one is drawn, chosen at
/// random (deterministically) by weight. A thread with no sample in two
/// cells in a row did not run (or was not sampled): everything ends one
/// cell after its last sample rather than bridging the gap. Stacks
/// deeper than [`TRACE_MAX_DEPTH`] keep their innermost frames under a
/// marker frame ([`OUTER_FRAMES_CUT`]).
pub fn walk_slices(
    st: &Stacks,
    thread: &[Sample],
    view: View,
    level: u32,
    f: &mut dyn FnMut(TraceSlice),
) {
    let Some(first) = thread.first() else {
        return;
    };
    let (pid, tid) = (first.pid, first.tid);
    let cell = st.cell_ns(level);
    let at = |slot: u64| MonoNs(slot.saturating_mul(cell));
    let mut open: Vec<(u32, MonoNs)> = Vec::new();
    let close =
        |open: &mut Vec<(u32, MonoNs)>, keep: usize, end: MonoNs, f: &mut dyn FnMut(TraceSlice)| {
            while open.len() > keep {
                let (name, start) = open.pop().expect("non-empty");
                f(TraceSlice {
                    pid,
                    tid,
                    depth: open.len() as u32,
                    name,
                    start,
                    end,
                });
            }
        };
    let mut prev_slot: Option<u64> = None;
    let mut frames: Vec<u32> = Vec::new();
    let mut i = 0;
    while i < thread.len() {
        // The samples of one cell, one of them drawn by weight.
        let slot = thread[i].t.0 / cell;
        let n = thread[i..]
            .iter()
            .take_while(|s| s.t.0 / cell == slot)
            .count();
        let cell_samples = &thread[i..i + n];
        i += n;
        let chosen = if n == 1 {
            cell_samples[0]
        } else {
            let total: u64 = cell_samples.iter().map(|s| s.weight.max(1) as u64).sum();
            let mut pick = splitmix64(slot ^ ((tid.0 as u64) << 32) ^ pid.0 as u64) % total;
            *cell_samples
                .iter()
                .find(|s| {
                    let w = s.weight.max(1) as u64;
                    if pick < w {
                        true
                    } else {
                        pick -= w;
                        false
                    }
                })
                .unwrap_or(&cell_samples[n - 1])
        };
        if let Some(p) = prev_slot {
            if slot > p + 2 {
                close(&mut open, 0, at(p + 1), f);
            }
        }
        let stack = st.stack_ids(st.view_stack(&chosen, view));
        frames.clear();
        if stack.len() > TRACE_MAX_DEPTH {
            frames.push(OUTER_FRAMES_CUT);
            frames.extend_from_slice(&stack[stack.len() - (TRACE_MAX_DEPTH - 1)..]);
        } else {
            frames.extend_from_slice(stack);
        }
        let common = open
            .iter()
            .zip(&frames)
            .take_while(|(o, f)| o.0 == **f)
            .count();
        close(&mut open, common, at(slot), f);
        for fr in &frames[common..] {
            open.push((*fr, at(slot)));
        }
        prev_slot = Some(slot);
    }
    if let Some(p) = prev_slot {
        close(&mut open, 0, at(p + 1), f);
    }
}

/// One thread's slices at `level`, sorted by (start, depth): parents
/// before their children, as trace readers expect at equal times.
pub fn thread_slices(st: &Stacks, thread: &[Sample], view: View, level: u32) -> Vec<TraceSlice> {
    let mut out = Vec::new();
    walk_slices(st, thread, view, level, &mut |s| out.push(s));
    out.sort_by_key(|s| (s.start, s.depth));
    out
}
