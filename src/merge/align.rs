//! Putting recordings of several hosts on one time axis.
//!
//! Every recording stores a wall-clock anchor: a `CLOCK_MONOTONIC` reading
//! paired with `CLOCK_REALTIME` (and the pair's own read error), the host's
//! clock-sync state (`adjtimex`: synchronised or not, maximum error), and
//! the kernel's boot id. Three methods, best first:
//!
//! 1. **Same boot** — recordings with the same boot id ran on one kernel and
//!    share `CLOCK_MONOTONIC` exactly (several gpuprof instances on one
//!    node, one per rank): their relative placement is exact.
//! 2. **Collective boundaries** — in synchronous training every rank leaves
//!    each collective (all-reduce, barrier) at the same moment. The moments
//!    ranks of two groups left collectives (from Python stack samples) are
//!    matched: the offset between the groups' clocks that lines up the most
//!    of them within the samples' resolution, searched within the anchors'
//!    uncertainty. Used only when one offset stands out (periodic steps make
//!    offsets a whole step apart look as good; then the search window must
//!    be under half a step, i.e. the clocks already roughly synchronised) and
//!    when it is tighter than the anchors.
//! 3. **Wall-clock anchors** — each group's anchor maps its monotonic time
//!    to wall time; the uncertainty between two hosts is the sum of their
//!    clocks' maximum errors (plus the anchors' read errors). A host whose
//!    clock is not synchronised (or whose state is unknown) makes the
//!    uncertainty unknown, and the report says so.

use crate::event::{ClockSync, MonoNs};

/// What alignment needs to know of one recording.
#[derive(Clone, Debug, Default)]
pub struct ClockInput {
    pub boot_id: Option<String>,
    pub anchor_monotonic_ns: u64,
    pub anchor_realtime_ns: u64,
    pub anchor_error_ns: u64,
    pub sync: Option<ClockSync>,
    /// When its ranks left collectives: (time, half-width of the interval
    /// it is known to lie in), sorted.
    pub exits: Vec<(MonoNs, u64)>,
}

/// How a recording was placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// The reference: the others are placed relative to it.
    Reference,
    SameBoot,
    CollectiveBoundaries,
    WallClock,
}

impl Method {
    pub fn describe(self) -> &'static str {
        match self {
            Method::Reference => "reference",
            Method::SameBoot => "same kernel clock as the reference (same boot id): exact",
            Method::CollectiveBoundaries => "refined from collective boundaries seen on both hosts",
            Method::WallClock => "wall-clock anchors (CLOCK_REALTIME)",
        }
    }
}

/// One recording's placement: its monotonic time + `offset_ns` is time on
/// the merged axis (wall-clock nanoseconds of the reference).
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub offset_ns: i128,
    pub method: Method,
    /// Uncertainty of its placement relative to the reference, in ns; None
    /// when unknown (a clock that is not synchronised).
    pub uncertainty_ns: Option<u64>,
    /// Collective boundaries matched, when refined.
    pub matched: usize,
}

/// Collective exits kept per recording for matching.
pub const MAX_EXITS: usize = 200_000;
/// Search window cap for the collective match when the anchors say nothing
/// (an unsynchronised clock): one minute.
const MAX_SEARCH_NS: u64 = 60_000_000_000;
/// Fewest matched boundaries that can refine an offset.
const MIN_MATCHES: usize = 8;
/// The best offset must match this many times more boundaries than the
/// best one at least one resolution apart.
const PEAK_RATIO: f64 = 1.5;

fn wall_error(c: &ClockInput) -> Option<u64> {
    match &c.sync {
        Some(s) if s.synchronized => Some(s.max_error_us * 1000 + c.anchor_error_ns),
        _ => None,
    }
}

fn anchor_offset(c: &ClockInput) -> i128 {
    c.anchor_realtime_ns as i128 - c.anchor_monotonic_ns as i128
}

/// Place every recording. The reference is the first one whose clock error
/// is smallest (a synchronised clock, else the first).
pub fn place(inputs: &[ClockInput]) -> Vec<Placement> {
    if inputs.is_empty() {
        return Vec::new();
    }
    let reference = (0..inputs.len())
        .min_by_key(|i| (wall_error(&inputs[*i]).unwrap_or(u64::MAX), *i))
        .unwrap_or(0);
    let r = &inputs[reference];
    let r_err = wall_error(r);
    inputs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if i == reference {
                return Placement {
                    offset_ns: anchor_offset(c),
                    method: Method::Reference,
                    uncertainty_ns: Some(0),
                    matched: 0,
                };
            }
            if c.boot_id.is_some() && c.boot_id == r.boot_id {
                return Placement {
                    offset_ns: anchor_offset(r),
                    method: Method::SameBoot,
                    uncertainty_ns: Some(0),
                    matched: 0,
                };
            }
            let wall = match (r_err, wall_error(c)) {
                (Some(a), Some(b)) => Some(a + b),
                _ => None,
            };
            let base = anchor_offset(c);
            // Offset of c relative to r's clock that the anchors give: a
            // moment t_c on c is t_c + base on the merged axis; the search
            // corrects base by delta.
            let window = wall.unwrap_or(MAX_SEARCH_NS).min(MAX_SEARCH_NS);
            if let Some((delta, matched, err)) =
                match_boundaries(&r.exits, anchor_offset(r), &c.exits, base, window)
            {
                if wall.map_or(true, |w| err < w) {
                    return Placement {
                        offset_ns: base + delta as i128,
                        method: Method::CollectiveBoundaries,
                        uncertainty_ns: Some(err),
                        matched,
                    };
                }
            }
            Placement {
                offset_ns: base,
                method: Method::WallClock,
                uncertainty_ns: wall,
                matched: 0,
            }
        })
        .collect()
}

/// The correction `delta` (ns, within ±`window`) to `c`'s offset that lines
/// up the most of its collective exits with the reference's; with the
/// number matched and the resulting uncertainty. None when too few match or
/// no single offset stands out.
fn match_boundaries(
    r: &[(MonoNs, u64)],
    r_off: i128,
    c: &[(MonoNs, u64)],
    c_off: i128,
    window: u64,
) -> Option<(i64, usize, u64)> {
    if r.len() < MIN_MATCHES || c.len() < MIN_MATCHES {
        return None;
    }
    // Resolution: the typical half-width of an exit's interval, both sides.
    let mut hw: Vec<u64> = r.iter().chain(c.iter()).map(|e| e.1).collect();
    hw.sort_unstable();
    let res = (2 * hw[hw.len() / 2]).max(1_000_000);
    let rt: Vec<i128> = r.iter().map(|e| e.0 .0 as i128 + r_off).collect();
    let w = window as i128;
    // Histogram of (reference exit - c exit) differences within the window.
    let nbins = (2 * w / res as i128 + 1) as usize;
    if nbins > 4_000_000 {
        return None;
    }
    let mut hist = vec![0u32; nbins];
    for e in c {
        let t = e.0 .0 as i128 + c_off;
        let lo = rt.partition_point(|x| *x < t - w);
        let hi = rt.partition_point(|x| *x <= t + w);
        for x in &rt[lo..hi] {
            let d = x - t + w;
            hist[(d / res as i128) as usize] += 1;
        }
    }
    // Best pair of neighbouring bins (an offset on a bin edge splits).
    let score = |i: usize| hist[i] + hist.get(i + 1).copied().unwrap_or(0);
    let best = (0..nbins).max_by_key(|i| (score(*i), std::cmp::Reverse(*i)))?;
    let peak = score(best);
    let second = (0..nbins)
        .filter(|i| i.abs_diff(best) > 2)
        .map(score)
        .max()
        .unwrap_or(0);
    if (peak as usize) < MIN_MATCHES || (peak as f64) < PEAK_RATIO * second as f64 {
        return None;
    }
    // Refine: median of the differences that fell in the peak.
    let lo_d = best as i128 * res as i128 - w;
    let hi_d = lo_d + 2 * res as i128;
    let mut ds: Vec<i128> = Vec::new();
    for e in c {
        let t = e.0 .0 as i128 + c_off;
        let lo = rt.partition_point(|x| *x < t + lo_d);
        let hi = rt.partition_point(|x| *x < t + hi_d);
        ds.extend(rt[lo..hi].iter().map(|x| x - t));
    }
    ds.sort_unstable();
    let delta = *ds.get(ds.len() / 2)?;
    Some((delta as i64, ds.len(), res))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn synced(max_error_ms: u64) -> Option<ClockSync> {
        Some(ClockSync {
            synchronized: true,
            max_error_us: max_error_ms * 1000,
            est_error_us: 0,
            source: "test".into(),
        })
    }

    /// Steps of 1.3 s ± a few ms: the moments every rank leaves the
    /// all-reduce, in true (wall) time.
    fn true_exits(n: usize) -> Vec<u64> {
        let mut t = 1_000_000 * MS;
        (0..n)
            .map(|i| {
                t += 1_300 * MS + ((i * 7919) % 40) as u64 * MS;
                t
            })
            .collect()
    }

    /// A host whose monotonic clock reads `true - boot` and whose wall clock
    /// is off by `skew`; exits seen at 25 ms resolution.
    fn host(boot: u64, skew: i64, sync: Option<ClockSync>, exits: &[u64]) -> ClockInput {
        let anchor_true = 999_000 * MS;
        ClockInput {
            boot_id: Some(format!("boot-{boot}")),
            anchor_monotonic_ns: anchor_true - boot,
            anchor_realtime_ns: (anchor_true as i64 + skew) as u64,
            anchor_error_ns: 1_000,
            sync,
            exits: exits
                .iter()
                .enumerate()
                .map(|(i, t)| (MonoNs(t - boot + (i as u64 % 3) * 5 * MS), 25 * MS))
                .collect(),
        }
    }

    #[test]
    fn same_boot_is_exact_and_wall_clock_states_its_uncertainty() {
        let ex = true_exits(50);
        let a = host(100 * MS, 0, synced(5), &ex);
        let mut b = host(100 * MS, 3 * MS as i64, synced(5), &[]);
        b.boot_id = a.boot_id.clone();
        let c = host(7_000 * MS, 2 * MS as i64, synced(20), &[]);
        let p = place(&[a, b, c]);
        assert_eq!(p[0].method, Method::Reference);
        assert_eq!(p[1].method, Method::SameBoot);
        assert_eq!(p[1].offset_ns, p[0].offset_ns);
        assert_eq!(p[2].method, Method::WallClock);
        assert_eq!(p[2].uncertainty_ns, Some(25 * MS + 2_000));
    }

    #[test]
    fn collective_boundaries_refine_a_coarse_wall_clock() {
        let ex = true_exits(60);
        // Host b's wall clock is 180 ms off, within its 250 ms max error.
        let a = host(100 * MS, 0, synced(250), &ex);
        let b = host(5_000 * MS, 180 * MS as i64, synced(250), &ex);
        let p = place(&[a.clone(), b]);
        assert_eq!(p[1].method, Method::CollectiveBoundaries, "{p:?}");
        assert!(p[1].matched >= 40, "{p:?}");
        // The true offset makes b's monotonic time + offset equal a's.
        let truth = p[0].offset_ns + (5_000 * MS - 100 * MS) as i128;
        let err = (p[1].offset_ns - truth).unsigned_abs();
        assert!(err <= 15 * MS as u128, "off by {} ms", err as f64 / 1e6);
        assert!(p[1].uncertainty_ns.unwrap() < 250 * MS);
    }

    #[test]
    fn an_unsynchronised_clock_is_unknown_unless_boundaries_settle_it() {
        let ex = true_exits(60);
        let a = host(100 * MS, 0, synced(10), &ex);
        // 40 s off and not synchronised: periodic steps make the match
        // ambiguous over such a window, so nothing is claimed.
        let b = host(5_000 * MS, 40_000 * MS as i64, None, &ex);
        let p = place(&[a, b]);
        assert_eq!(p[1].method, Method::WallClock, "{p:?}");
        assert_eq!(p[1].uncertainty_ns, None);
    }
}
