//! Time spent inside collective communication calls (all-reduce, barrier,
//! all-gather, ...), from the Python stack samples.
//!
//! A rank that is ready first waits in the collective until the slowest
//! rank arrives, so the time each rank spends in collectives is the measure
//! of who waits for whom. It is read from Python stacks because they are
//! sampled whether the thread runs or is blocked (perf's cpu-clock samples
//! only see threads on a CPU, and a thread waiting for its peers sleeps).
//!
//! Shares are taken from the moment the thread's first collective ended
//! (the first exit from a collective seen in any thread after this one's
//! first sample: every rank leaves a collective together) to the thread's
//! end. Before that moment the ranks
//! have not yet met: the first collective absorbs their start-up skew (one
//! rank importing or loading its first batch more slowly is not a
//! straggler), and the time before it (`init_process_group`, building the
//! model) would dilute every share by an amount that depends on where the
//! sampler happened to look. Without any exit seen, shares start at the
//! thread's first sample in distributed code. Each sample stands for
//! the time until the thread's next sample (capped
//! at twice the thread's median sampling gap, so a pause of the sampler is
//! not counted). The moments a thread leaves a collective — shared by every
//! rank of the collective — are kept too: `gpuprof merge` aligns hosts'
//! clocks on them.

use std::collections::BTreeMap;

use crate::event::{MonoNs, Pid, Tid};
use crate::vocab::collectives::{is_collective_frame, is_distributed_frame};

use super::stacks::StackData;

/// Samples a thread needs from the end of the first collective on for its
/// share to be counted from there (fewer make the share a coin toss; the
/// straggler diagnosis asks as many of each rank).
pub const MIN_SAMPLES: usize = 10;

/// Moments kept per thread at which it left a collective.
pub const MAX_EXITS_PER_THREAD: usize = 50_000;

/// One thread's time in collectives.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ThreadWaits {
    pub pid: Pid,
    pub tid: Tid,
    /// Python samples of the thread, and those inside a collective.
    pub samples: u64,
    pub wait_samples: u64,
    /// Time covered by its samples, and the part inside collectives.
    pub sampled_s: f64,
    pub wait_s: f64,
    /// Seconds per collective function.
    pub functions: BTreeMap<String, f64>,
    /// The moment its samples are counted from.
    pub counted_from: CountedFrom,
    /// When it left a collective: (midpoint between the last sample inside
    /// and the first outside, half that interval in ns).
    pub exits: Vec<(MonoNs, u64)>,
}

impl ThreadWaits {
    pub fn share(&self) -> f64 {
        if self.sampled_s > 0.0 {
            self.wait_s / self.sampled_s
        } else {
            0.0
        }
    }
}

/// Where a thread's time in collectives is counted from (see [`waits`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CountedFrom {
    /// The end of the ranks' first collective: their start-up skew, which
    /// it absorbs, is left out.
    #[default]
    FirstCollectiveEnd,
    /// The first moment any rank was seen inside a collective: the first
    /// collective's skew is counted.
    FirstCollectiveStart,
    /// The thread's first sample in distributed code: the set-up between
    /// `init_process_group` and the first collective is counted too.
    FirstDistributedSample,
    /// Its first sample: it was never seen in distributed code (its share
    /// is 0), and no collective was seen elsewhere during its life.
    FirstSample,
    /// From its first to its last exit from the collective it left most
    /// often (the training loop's steady state), from the wall-clock
    /// sampler's looks at the main thread.
    RecurringCollective,
}

/// The threads' time in collectives.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Collectives {
    /// Per Python thread, sorted by (pid, tid).
    pub threads: Vec<ThreadWaits>,
}

/// Every Python thread's time in collectives, measured from the end of the
/// thread's first collective on (see the module's comment); exits are kept
/// from the thread's first sample in distributed code on.
///
/// A thread the wall-clock sampler looked at at least as often as py-spy
/// read it is measured from those looks instead: their stacks hold native
/// frames too, so DDP's gradient all-reduce, waited for inside
/// `loss.backward()` where no Python frame names a collective, counts.
pub fn analyze(d: &StackData, window: (MonoNs, MonoNs)) -> Collectives {
    let (mut names, mut threads) = d.python_marks(window, &is_collective_frame);
    let (_, mut dist) = d.python_marks(window, &is_distributed_frame);
    let (wall_names, wall, wall_dist) = super::waits::collective_marks(d, window);
    let offset = names.len() as u32;
    names.extend(wall_names);
    // Main threads only: the loop thread is looked at every tick, the
    // others less often than py-spy reads them.
    let looked: Marks = wall
        .into_iter()
        .filter(|(key, marks)| {
            key.0 .0 == key.1 .0 && marks.len() >= threads.get(key).map_or(0, |v| v.len())
        })
        .map(|(key, marks)| {
            let marks = marks
                .into_iter()
                .map(|(t, m)| (t, m.map(|i| i + offset)))
                .collect();
            (key, marks)
        })
        .collect();
    let (looked, steady) = cut_to_steady_states(looked);
    for (key, marks) in looked {
        threads.insert(key, marks);
        if let Some(dm) = wall_dist.get(&key) {
            dist.insert(key, dm.clone());
        }
    }
    waits(&names, threads, &dist, &steady)
}

/// The looked-at threads' marks, each cut to its steady state where it has
/// one ([`steady_states`]), and the threads that have one.
fn cut_to_steady_states(looked: Marks) -> (Marks, Vec<(Pid, Tid)>) {
    let spans = steady_states(&looked);
    let mut steady = Vec::new();
    let cut = looked
        .into_iter()
        .map(|(key, marks)| match spans.get(&key) {
            Some(&(lo, hi)) => {
                steady.push(key);
                (key, marks[lo..hi].to_vec())
            }
            None => (key, marks),
        })
        .collect();
    (cut, steady)
}

/// Each thread's steady state (indices into its looks). The loop's steady
/// state is the job's, not a rank's: every rank leaves the per-step
/// collective together, so it is read from the thread seen inside its
/// recurring collective most often (the rank that waits most) and the
/// same stretch of time is taken for every other thread with at least
/// [`MIN_SAMPLES`] looks in it. A straggler is seldom seen inside a
/// collective in its loop, and its own "steady state" was then a dozen
/// looks of a set-up collective (`c10d::Work::wait` while the other rank
/// built its model): 100% in collectives, and the waiting rank was named
/// the straggler's equal. A thread with too few looks in the job's
/// stretch keeps its own.
fn steady_states(threads: &Marks) -> BTreeMap<(Pid, Tid), (usize, usize)> {
    let own: BTreeMap<(Pid, Tid), (usize, usize)> = threads
        .iter()
        .filter_map(|(key, m)| steady_state(m).map(|span| (*key, span)))
        .collect();
    let job = own
        .iter()
        .max_by_key(|(key, (lo, hi))| {
            let m = &threads[*key];
            (
                m[*lo..*hi].iter().filter(|x| x.1.is_some()).count(),
                hi - lo,
            )
        })
        .map(|(key, &(lo, hi))| (threads[key][lo].0, threads[key][hi - 1].0));
    threads
        .iter()
        .filter_map(|(key, m)| {
            let shared = job.and_then(|(from, to)| {
                let lo = m.partition_point(|x| x.0 < from);
                let hi = m.partition_point(|x| x.0 <= to);
                (hi - lo >= MIN_SAMPLES).then_some((lo, hi))
            });
            shared.or_else(|| own.get(key).copied()).map(|s| (*key, s))
        })
        .collect()
}

/// The training loop's steady state in a thread's looks (indices into
/// `marks`): the stretch of its recurring collective ([`recurring`]), else
/// of the one it dwelt in ([`dwelling`]). Start-up (imports, the first
/// batch, DDP's set-up broadcast) and shutdown are left out, on every rank
/// alike.
///
/// A stretch followed by more than twice as many looks as it spans is not
/// the loop but a wait during set-up: a straggler arrives first at the
/// rendezvous or DDP's set-up broadcast and waits there for the others
/// (12–22 looks in `c10d::Work::wait` or `SocketImpl::waitForInput`), then
/// is seldom seen in a collective in its loop. Taken as its steady state,
/// that wait read as 100% in collectives and no straggler was named.
///
/// The test applies to each way of finding the stretch in turn: a rank
/// that waits in its all-reduce nearly all the time may be seen leaving it
/// only in the last steps of its loop (on a loaded machine: 3 exits in the
/// last 0.5 s of a 3 s loop, after 232 looks inside it), and that short
/// recurring stretch, rejected, left the rank no steady state at all — it
/// was counted from its first exit to its shutdown, 0.74 instead of 0.94 in
/// collectives.
fn steady_state(marks: &[(MonoNs, Option<u32>)]) -> Option<(usize, usize)> {
    let followed_by_less = |&(lo, hi): &(usize, usize)| marks.len() - hi <= 2 * (hi - lo);
    recurring(marks)
        .filter(followed_by_less)
        .or_else(|| dwelling(marks).filter(followed_by_less))
}

/// From the thread's first exit from the collective it left most often
/// (the per-step all-reduce) to its last one. None when it left no
/// collective at least [`MIN_STEADY_EXITS`] times or too few looks lie
/// between.
fn recurring(marks: &[(MonoNs, Option<u32>)]) -> Option<(usize, usize)> {
    let mut exits: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, p) in marks.windows(2).enumerate() {
        if let (Some(m), None) = (p[0].1, p[1].1) {
            exits.entry(m).or_default().push(i + 1);
        }
    }
    let (m, at) = exits
        .into_iter()
        .max_by_key(|(m, v)| (v.len(), std::cmp::Reverse(*m)))
        .filter(|(_, at)| at.len() >= MIN_STEADY_EXITS)?;
    // To its last look inside that collective (the loop's last step) when
    // that comes later than the last exit seen: a rank that waits in it
    // almost all the time is seldom looked at outside it, the more so on
    // a loaded machine, and its last exit seen can come long before the
    // end of its loop (the span, and the seconds lost, were then a tenth
    // of the truth).
    let last_in = marks
        .iter()
        .rposition(|x| x.1 == Some(m))
        .map_or(0, |i| (i + 1).min(marks.len() - 1));
    let (lo, hi) = (*at.first()?, (*at.last()?).max(last_in));
    (at.len() >= MIN_STEADY_EXITS && hi - lo >= MIN_SAMPLES).then_some((lo, hi))
}

/// A rank that waits in the per-step collective almost all the time may
/// never be seen leaving it (on a loaded machine, a whole loop of looks
/// inside): its steady state is then the stretch from its first to its
/// last look inside the collective it was seen in most, when those looks
/// are most of that stretch. Without it, the count ran from the set-up
/// broadcast, start-up included, and a rank 95% in its all-reduce showed
/// 56%.
fn dwelling(marks: &[(MonoNs, Option<u32>)]) -> Option<(usize, usize)> {
    let mut looks: BTreeMap<u32, usize> = BTreeMap::new();
    for m in marks.iter().filter_map(|x| x.1) {
        *looks.entry(m).or_default() += 1;
    }
    let (m, n) = looks
        .into_iter()
        .max_by_key(|(m, n)| (*n, std::cmp::Reverse(*m)))?;
    let lo = marks.iter().position(|x| x.1 == Some(m))?;
    let hi = marks.iter().rposition(|x| x.1 == Some(m))? + 1;
    (n >= MIN_SAMPLES && 2 * n >= hi - lo).then_some((lo, hi))
}

/// Exits from one collective that make a steady state.
pub const MIN_STEADY_EXITS: usize = 3;

type Marks = BTreeMap<(Pid, Tid), Vec<(MonoNs, Option<u32>)>>;

/// [`analyze`] on the threads' samples marked with their collective
/// (`threads`) and with distributed code (`dist`). The samples of a
/// thread in `steady` are already cut to the loop's steady state, and all
/// of them count: that stretch is the same for every rank, and another
/// rank's first exit inside it is no start. A straggler's first exit seen
/// came at the end of the loop, on a loaded machine where the waiting rank
/// was never seen leaving its all-reduce (its CPU bursts between steps
/// were ~2 ms), and the waiting rank was then counted over its last 42
/// looks: 0.4 s lost of 2.7 s.
fn waits(names: &[String], threads: Marks, dist: &Marks, steady: &[(Pid, Tid)]) -> Collectives {
    let mut out = Collectives::default();
    let mut per_thread = Vec::new();
    for ((pid, tid), samples) in threads {
        // From its first sample in distributed code; a thread never seen
        // there (a straggler rank, sampled while it waited for its input,
        // never inside a collective) counts from its first sample, share 0:
        // left out, its rank had no figure to compare on its own node.
        let from = dist
            .get(&(pid, tid))
            .and_then(|v| v.iter().find(|s| s.1.is_some()))
            .map(|s| s.0);
        let is_steady = steady.contains(&(pid, tid));
        let lo = if is_steady {
            0
        } else {
            from.map_or(0, |f| samples.partition_point(|s| s.0 < f))
        };
        per_thread.push((pid, tid, samples, lo, from.is_some(), is_steady));
    }
    let mut exits: Vec<MonoNs> = per_thread
        .iter()
        .filter_map(|(_, _, s, lo, _, _)| first_exit(&s[*lo..]))
        .collect();
    exits.sort();
    let mut entries: Vec<MonoNs> = per_thread
        .iter()
        .filter_map(|(_, _, s, lo, _, _)| s[*lo..].iter().find(|x| x.1.is_some()).map(|x| x.0))
        .collect();
    entries.sort();
    for (pid, tid, samples, lo, distributed, is_steady) in per_thread {
        let s = &samples[lo..];
        // Only moments inside the thread's life are its: a launcher's
        // rendezvous barrier, before the ranks existed, is not one of
        // theirs.
        let inside = |v: &[MonoNs]| match (samples.first(), s.last()) {
            (Some(first), Some(last)) => v.iter().find(|t| **t >= first.0 && **t < last.0).copied(),
            _ => None,
        };
        let after = |t: MonoNs| s.len() - s.partition_point(|x| x.0 < t);
        // Counted from the first of these that leaves enough samples:
        // - the end of the first collective: the first exit seen in any
        //   thread (a rank's first sample in distributed code is no bound,
        //   it may be deep in a collective);
        // - its start: the first sample seen inside one. A rank that waits
        //   in every collective is almost never sampled outside one, and a
        //   straggler almost never inside one, so the first exit seen can
        //   be the ranks' last, at the end of the run: counting from it
        //   left one sample, and a rank waiting 95% of the time read 0%.
        //   From the start, the first collective's start-up skew counts;
        // - the thread's first sample in distributed code (set-up such as
        //   imports after `init_process_group` dilutes the share).
        let (count_from, from) = if is_steady {
            (MonoNs(0), CountedFrom::RecurringCollective)
        } else {
            [
                (inside(&exits), CountedFrom::FirstCollectiveEnd),
                (inside(&entries), CountedFrom::FirstCollectiveStart),
            ]
            .into_iter()
            .find_map(|(t, f)| t.filter(|t| after(*t) >= MIN_SAMPLES).map(|t| (t, f)))
            .unwrap_or(if distributed {
                (MonoNs(0), CountedFrom::FirstDistributedSample)
            } else {
                (MonoNs(0), CountedFrom::FirstSample)
            })
        };
        let mut w = thread_waits(pid, tid, s, names, count_from);
        w.counted_from = from;
        out.threads.push(w);
    }
    out
}

/// The midpoint between a thread's last sample inside its first sampled
/// collective and its next sample outside one.
fn first_exit(s: &[(MonoNs, Option<u32>)]) -> Option<MonoNs> {
    s.windows(2)
        .find(|p| p[0].1.is_some() && p[1].1.is_none())
        .map(|p| MonoNs(p[0].0 .0 + (p[1].0 .0 - p[0].0 .0) / 2))
}

/// A thread's waits, counting samples from `count_from` on; exits are
/// found in all of `s`.
fn thread_waits(
    pid: Pid,
    tid: Tid,
    s: &[(MonoNs, Option<u32>)],
    names: &[String],
    count_from: MonoNs,
) -> ThreadWaits {
    let mut w = ThreadWaits {
        pid,
        tid,
        ..Default::default()
    };
    let mut gaps: Vec<u64> = s.windows(2).map(|p| p[1].0 .0 - p[0].0 .0).collect();
    gaps.sort_unstable();
    let median = gaps.get(gaps.len() / 2).copied().unwrap_or(0);
    let cap = (2 * median).max(1_000_000);
    for (i, (t, mark)) in s.iter().enumerate() {
        let next = s.get(i + 1);
        let counted = *t >= count_from;
        let gap = next.map_or(median.min(cap), |n| (n.0 .0 - t.0).min(cap));
        let secs = gap as f64 / 1e9;
        if counted {
            w.samples += 1;
            w.sampled_s += secs;
        }
        if let Some(m) = mark {
            if counted {
                w.wait_samples += 1;
                w.wait_s += secs;
                *w.functions.entry(names[*m as usize].clone()).or_default() += secs;
            }
            if let Some((nt, None)) = next {
                let span = nt.0 - t.0;
                if span <= cap && w.exits.len() < MAX_EXITS_PER_THREAD {
                    w.exits.push((MonoNs(t.0 + span / 2), span.div_ceil(2)));
                }
            }
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Looks 10 ms apart with these marks.
    fn every_10_ms(m: &[Option<u32>]) -> Vec<(MonoNs, Option<u32>)> {
        m.iter()
            .enumerate()
            .map(|(i, x)| (MonoNs(i as u64 * 10 * MS), *x))
            .collect()
    }

    /// The steady state runs from the first to the last exit from the
    /// collective left most often; a one-off collective (set-up) before it
    /// and the shutdown after it are left out.
    #[test]
    fn steady_state_spans_the_recurring_collective() {
        // 0: set-up broadcast (mark 1), then 4 steps ending in mark 0,
        // then shutdown.
        let m: Vec<Option<u32>> = [
            &[Some(1), None, None][..],
            &[None, None, None, Some(0), Some(0)][..],
            &[None, None, None, Some(0), Some(0)][..],
            &[None, None, None, Some(0), Some(0)][..],
            &[None, None, None, Some(0), Some(0)][..],
            &[None; 6][..],
        ]
        .concat();
        let marks = every_10_ms(&m);
        assert_eq!(steady_state(&marks), Some((8, 23)));
        assert_eq!(
            steady_state(&marks[..14]),
            None,
            "two exits are no steady state"
        );
    }

    /// A rank seen inside its per-step collective at every look of its
    /// loop (never leaving it between two looks): the steady state is that
    /// stretch, not the time from the set-up broadcast on.
    #[test]
    fn a_rank_never_seen_leaving_its_collective_dwells_in_it() {
        let m: Vec<Option<u32>> = [
            &[None; 5][..],
            &[Some(1), Some(1), None][..],
            &[None; 20][..],
            &[Some(2), Some(0)][..],
            &[Some(0); 30][..],
            &[None; 10][..],
        ]
        .concat();
        let marks = every_10_ms(&m);
        assert_eq!(steady_state(&marks), Some((29, 60)));
        // Fewer than MIN_SAMPLES looks inside it: no steady state.
        let short: Vec<(MonoNs, Option<u32>)> =
            marks[..38].iter().chain(&marks[60..]).copied().collect();
        assert_eq!(steady_state(&short), None);
    }

    /// A rank seen leaving its per-step collective only in the last steps
    /// of its loop (the looks of a CI run under load, rank 0 of
    /// `tests/scripts/ddp_waits.py`): the recurring stretch is too short
    /// for what follows, and the stretch it dwelt in is the steady state.
    #[test]
    fn a_rank_seen_leaving_only_at_the_end_dwells_in_its_collective() {
        let mut m: Vec<Option<u32>> = Vec::new();
        for (n, x) in [
            (203, None),
            (14, Some(0)),
            (5, None),
            (10, Some(1)),
            (10, Some(0)),
            (232, Some(1)),
            (1, None),
            (17, Some(1)),
            (1, None),
            (20, Some(1)),
            (1, None),
            (9, Some(1)),
            (107, None),
        ] {
            m.extend(std::iter::repeat_n(x, n));
        }
        let marks = every_10_ms(&m);
        assert_eq!(recurring(&marks), Some((474, 523)));
        assert_eq!(steady_state(&marks), Some((222, 523)));
    }

    /// A straggler's own looks hold a dozen looks of a set-up wait and
    /// then a loop seldom seen in a collective: no steady state of its own.
    /// The waiting rank's recurring all-reduce gives the job's, and the
    /// straggler is counted over that same stretch.
    #[test]
    fn the_straggler_is_counted_over_the_waiting_ranks_steady_state() {
        // Rank 0: set-up, then 10 steps of 1 look outside and 9 inside
        // the all-reduce (mark 0), then shutdown.
        let mut r0 = vec![None; 20];
        for _ in 0..10 {
            r0.push(None);
            r0.extend([Some(0); 9]);
        }
        r0.push(None);
        r0.extend([None; 10]);
        // Rank 1: waits 13 looks in a set-up collective (mark 1) while
        // rank 0 builds its model, then is seen in its loop, once inside
        // the all-reduce.
        let mut r1 = vec![None; 5];
        r1.extend([Some(1); 13]);
        r1.extend([None; 52]);
        r1.push(Some(0));
        r1.extend([None; 60]);
        let (k0, k1, k2) = ((Pid(10), Tid(10)), (Pid(11), Tid(11)), (Pid(12), Tid(12)));
        let mut threads: Marks = BTreeMap::new();
        threads.insert(k0, every_10_ms(&r0));
        threads.insert(k1, every_10_ms(&r1));
        // Alone, the set-up wait (looks 5..18) is followed by 113 looks:
        // not the loop.
        assert_eq!(steady_state(&threads[&k1]), None);
        let own = steady_state(&threads[&k0]).unwrap();
        assert_eq!(own, (30, 120));
        let spans = steady_states(&threads);
        assert_eq!(spans[&k0], own);
        assert_eq!(spans[&k1], own, "the same looks in time");
        // A thread that was not looked at during the job's loop keeps its
        // own steady state.
        let late: Vec<(MonoNs, Option<u32>)> = every_10_ms(&r0)
            .into_iter()
            .map(|(t, m)| (MonoNs(t.0 + 10_000 * MS), m))
            .collect();
        threads.insert(k2, late);
        assert_eq!(steady_states(&threads)[&k2], own);
    }

    /// On a loaded machine the waiting rank is never seen leaving its
    /// all-reduce (a burst of ~2 ms of CPU between steps, looks 10 ms
    /// apart), and the straggler is seen leaving a collective once, near
    /// the end of the loop. Both are counted over the whole steady state:
    /// the straggler's late exit is not where the waiting rank's count
    /// starts (it was: 0.4 s lost of 2.7 s).
    #[test]
    fn a_late_exit_of_another_rank_does_not_shorten_the_steady_state() {
        // Rank 0: imports, a set-up wait (mark 1), 300 looks inside the
        // all-reduce (mark 0), shutdown.
        let mut r0 = vec![None; 100];
        r0.extend([Some(1); 9]);
        r0.extend([Some(0); 300]);
        r0.extend([None; 100]);
        // Rank 1: imports, a set-up wait, its loop outside collectives but
        // for one look inside the all-reduce 40 looks before the end.
        let mut r1 = vec![None; 100];
        r1.extend([Some(1); 6]);
        r1.extend([None; 263]);
        r1.push(Some(0));
        r1.extend([None; 139]);
        let (k0, k1) = ((Pid(10), Tid(10)), (Pid(11), Tid(11)));
        let looked: Marks = [(k0, every_10_ms(&r0)), (k1, every_10_ms(&r1))].into();
        let (cut, steady) = cut_to_steady_states(looked);
        assert_eq!(cut[&k0].len(), 300);
        assert_eq!(steady, vec![k0, k1]);
        let names = ["all-reduce".to_string(), "set-up".to_string()];
        let c = waits(&names, cut, &Marks::new(), &steady);
        let (w0, w1) = (&c.threads[0], &c.threads[1]);
        assert_eq!(w0.samples, 300, "rank 0 counted over its whole loop");
        assert!(w0.wait_s > 2.9, "{}", w0.wait_s);
        assert_eq!(w0.counted_from, CountedFrom::RecurringCollective);
        assert_eq!(w1.counted_from, CountedFrom::RecurringCollective);
        assert!(w1.share() < 0.01, "{}", w1.share());
    }

    #[test]
    fn collective_frames_are_recognised_by_function_and_file() {
        let f = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py";
        assert!(is_collective_frame("all_reduce", f));
        assert!(is_collective_frame("barrier", f));
        // The user's own function of the same name is not a collective.
        assert!(!is_collective_frame("all_reduce", "/home/me/train.py"));
        assert!(!is_collective_frame("init_process_group", f));
    }

    #[test]
    fn waits_are_time_weighted_and_exits_found() {
        // Samples every 10 ms: 3 in all_reduce, 2 outside, 1 inside, 1 out.
        let marks = [Some(0), Some(0), Some(0), None, None, Some(0), None];
        let s: Vec<(MonoNs, Option<u32>)> = marks
            .iter()
            .enumerate()
            .map(|(i, m)| (MonoNs(1_000 * MS + i as u64 * 10 * MS), *m))
            .collect();
        let w = thread_waits(Pid(1), Tid(1), &s, &["all_reduce".to_string()], MonoNs(0));
        assert_eq!(w.samples, 7);
        assert_eq!(w.wait_samples, 4);
        assert!((w.wait_s - 0.040).abs() < 1e-9, "{}", w.wait_s);
        assert!((w.sampled_s - 0.070).abs() < 1e-9, "{}", w.sampled_s);
        assert_eq!(
            w.exits,
            vec![(MonoNs(1_025 * MS), 5 * MS), (MonoNs(1_055 * MS), 5 * MS)]
        );
        assert!((w.functions["all_reduce"] - 0.040).abs() < 1e-9);
    }

    #[test]
    fn waits_count_from_the_first_collectives_end() {
        // Rank 1 arrives first and waits 300 ms in the first all_reduce for
        // rank 0 (start-up skew), then never waits; rank 0 waits in every
        // step after that. Samples every 10 ms from 0 to 2 s; both are in
        // distributed code from the start (init_process_group).
        let at = |i: u64| MonoNs(i * 10 * MS);
        let (mut r0, mut r1, mut d0, mut d1) = (vec![], vec![], vec![], vec![]);
        for i in 0..200 {
            // Rank 0: set-up for 300 ms, then half of every 100 ms step waiting.
            let m0 = (i >= 30 && i % 10 < 5).then_some(0);
            // Rank 1: in the first all_reduce from 20 to 300 ms.
            let m1 = (2..30).contains(&i).then_some(0);
            r0.push((at(i), m0));
            r1.push((at(i), m1));
            d0.push((at(i), Some(0)));
            d1.push((at(i), Some(0)));
        }
        let names = ["all_reduce".to_string()];
        let threads: Marks = [((Pid(10), Tid(10)), r0), ((Pid(11), Tid(11)), r1)].into();
        let dist: Marks = [((Pid(10), Tid(10)), d0), ((Pid(11), Tid(11)), d1)].into();
        let c = waits(&names, threads, &dist, &[]);
        let (w0, w1) = (&c.threads[0], &c.threads[1]);
        assert!((w0.share() - 0.5).abs() < 0.02, "{}", w0.share());
        assert!(w1.share() < 0.01, "start-up skew counted: {}", w1.share());
        // Both count from the first exit (rank 1 leaving at 295 ms: the
        // samples from 300 ms on), which still aligns clocks.
        assert_eq!((w0.samples, w1.samples), (170, 170));
        assert_eq!(w1.exits, vec![(MonoNs(295 * MS), 5 * MS)]);
    }

    #[test]
    fn an_exit_before_a_thread_existed_is_not_its_start() {
        // A launcher's rendezvous barrier ends at 25 ms; the rank enters
        // init_process_group at 100 ms, waits in its first all_reduce
        // until 295 ms, then half of every 100 ms step.
        let at = |i: u64| MonoNs(i * 10 * MS);
        let launcher: Vec<_> = (0..50).map(|i| (at(i), (i < 3).then_some(0))).collect();
        let rank: Vec<_> = (10..200)
            .map(|i| (at(i), (i < 30 || i % 10 >= 5).then_some(0)))
            .collect();
        let dist =
            |v: &[(MonoNs, Option<u32>)]| -> Vec<_> { v.iter().map(|s| (s.0, Some(0))).collect() };
        let names = ["barrier".to_string()];
        let dist: Marks = [
            ((Pid(1), Tid(1)), dist(&launcher[..3])),
            ((Pid(2), Tid(2)), dist(&rank)),
        ]
        .into();
        let threads: Marks = [((Pid(1), Tid(1)), launcher), ((Pid(2), Tid(2)), rank)].into();
        let c = waits(&names, threads, &dist, &[]);
        let r = &c.threads[1];
        assert_eq!(
            r.samples, 170,
            "counted from its own first collective's end"
        );
        assert!((r.share() - 0.5).abs() < 0.02, "{}", r.share());
    }

    #[test]
    fn a_rank_first_seen_in_distributed_code_late_counts_from_the_first_exit() {
        // Rank A leaves the first all_reduce at 295 ms. Rank B was sampled
        // from 0 but never in init_process_group: its first sample in
        // distributed code is 550 ms, inside a collective it leaves at
        // 895 ms. Its count starts at its first sample in distributed code
        // (295 ms is earlier), not at its own first exit: 145 samples.
        let at = |i: u64| MonoNs(i * 10 * MS);
        let a: Vec<_> = (0..200)
            .map(|i| (at(i), (2..30).contains(&i).then_some(0)))
            .collect();
        let b: Vec<_> = (0..200)
            .map(|i| {
                let waiting = (i >= 30 && i % 10 >= 5) || (55..90).contains(&i);
                (at(i), waiting.then_some(0))
            })
            .collect();
        let dist_a: Vec<_> = a.iter().map(|s| (s.0, Some(0))).collect();
        let dist_b: Vec<_> = b
            .iter()
            .map(|s| (s.0, (s.0 >= at(55)).then_some(0)))
            .collect();
        let names = ["all_reduce".to_string()];
        let threads: Marks = [((Pid(1), Tid(1)), a), ((Pid(2), Tid(2)), b)].into();
        let dist: Marks = [((Pid(1), Tid(1)), dist_a), ((Pid(2), Tid(2)), dist_b)].into();
        let c = waits(&names, threads, &dist, &[]);
        let w = &c.threads[1];
        assert_eq!((w.samples, w.wait_samples), (145, 35 + 55), "{w:?}");
    }

    #[test]
    fn an_exit_seen_only_at_the_end_counts_from_the_first_collectives_start() {
        // Samples every 65 ms. Both ranks are in init_process_group at
        // 0.65 s, import until 3.9 s, then rank 0 waits in all_reduce in
        // every step and is never sampled outside it until its exit at
        // the end; rank 1, the straggler, is sampled in all_reduce only
        // once, at the end. The only exits seen are the last.
        let at = |i: u64| MonoNs(i * 65 * MS);
        let r0: Vec<_> = (0..100)
            .map(|i| (at(i), (60..99).contains(&i).then_some(0)))
            .collect();
        let r1: Vec<_> = (0..100).map(|i| (at(i), (i == 98).then_some(0))).collect();
        let dist = |v: &[(MonoNs, Option<u32>)]| -> Vec<_> {
            v.iter()
                .enumerate()
                .map(|(i, s)| (s.0, (i == 10 || s.1.is_some()).then_some(0)))
                .collect()
        };
        let dist: Marks = [((Pid(1), Tid(1)), dist(&r0)), ((Pid(2), Tid(2)), dist(&r1))].into();
        let threads: Marks = [((Pid(1), Tid(1)), r0), ((Pid(2), Tid(2)), r1)].into();
        let c = waits(&["all_reduce".to_string()], threads, &dist, &[]);
        let (w0, w1) = (&c.threads[0], &c.threads[1]);
        for w in [w0, w1] {
            assert_eq!(w.counted_from, CountedFrom::FirstCollectiveStart, "{w:?}");
            assert_eq!(w.samples, 40, "{w:?}");
        }
        assert!(w0.share() > 0.9, "{}", w0.share());
        assert!(w1.share() < 0.1, "{}", w1.share());
    }

    #[test]
    fn a_thread_never_seen_in_distributed_code_counts_with_a_share_of_zero() {
        // On its own node (a merge's part), the straggler rank's main
        // thread is sampled 60 times, never in distributed code: it is
        // kept, from its first sample. Beside a rank seen in all_reduce
        // from 200 ms, it counts from there.
        let at = |i: u64| MonoNs(i * 50 * MS);
        let b: Vec<_> = (0..60).map(|i| (at(i), None)).collect();
        let names = ["all_reduce".to_string()];
        let alone = waits(
            &names,
            [((Pid(2), Tid(2)), b.clone())].into(),
            &Marks::new(),
            &[],
        );
        let w = &alone.threads[0];
        assert_eq!((w.samples, w.wait_samples), (60, 0));
        assert_eq!(w.counted_from, CountedFrom::FirstSample);
        let a: Vec<_> = (0..60).map(|i| (at(i), (i >= 4).then_some(0))).collect();
        let dist_a: Marks = [((Pid(1), Tid(1)), a.iter().map(|s| (s.0, Some(0))).collect())].into();
        let both = waits(
            &names,
            [((Pid(1), Tid(1)), a), ((Pid(2), Tid(2)), b)].into(),
            &dist_a,
            &[],
        );
        let w = &both.threads[1];
        assert_eq!(
            (w.samples, w.counted_from),
            (56, CountedFrom::FirstCollectiveStart)
        );
        assert_eq!(w.share(), 0.0);
        assert!(both.threads[0].share() > 0.99);
    }

    #[test]
    fn a_pause_in_sampling_is_not_counted_as_waiting() {
        // 10 ms apart, then one 2 s hole while inside the collective.
        let s = vec![
            (MonoNs(0), Some(0)),
            (MonoNs(10 * MS), Some(0)),
            (MonoNs(20 * MS), Some(0)),
            (MonoNs(2_020 * MS), None),
            (MonoNs(2_030 * MS), None),
        ];
        let w = thread_waits(Pid(1), Tid(1), &s, &["barrier".to_string()], MonoNs(0));
        assert!(w.wait_s <= 0.041, "{}", w.wait_s);
        assert!(w.exits.is_empty(), "an exit 2 s wide says nothing");
    }
}
