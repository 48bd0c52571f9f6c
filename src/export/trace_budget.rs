//! One size budget for the trace, shared by every kind of track.
//!
//! The trace is made of *parts* (GPU counters, stack slices of main and
//! worker threads, per-thread CPU counters, ...), each in a priority
//! [`Class`]. Every part can be written at a reduction *level*: level 0 is
//! full resolution, each level halves the time resolution of what the part
//! draws by merging neighbours (counter points: time-weighted means; stack
//! slices: cells twice as wide; state runs and idle gaps: neighbours closer
//! than twice the distance merged, with their shares kept in the args).
//! Nothing is cut off in time.
//!
//! The planner measures parts by writing them to a byte counter, then
//! lowers resolution from the lowest-priority class up until the trace fits
//! (see [`plan`]): first each class down to its *floor* (the coarsest
//! resolution still worth reading: about 4096 cells over the run for
//! slices, 512 points per counter track), the GPU class left whole; then
//! past the floors, but each class keeping a guaranteed share of the
//! budget; then the GPU class; then the rest; and only if that is not
//! enough, whole parts are left out, lowest priority first — never a GPU
//! part.
//!
//! Each part's level, its size at full and at the chosen resolution and
//! what the reduction did are returned for the trace's metadata and
//! `report.json`. A new kind of track is one more [`Part`] in the class
//! that fits it.

use std::collections::HashMap;
use std::io::{self, Write};

use serde::Serialize;

use super::trace_writer::TraceWriter;
use crate::event::MonoNs;

/// Default budget for `trace.json`: Perfetto's UI runs in a browser tab
/// with about 2 GB of memory, and a JSON trace costs several times its size
/// once imported.
pub const DEFAULT_TRACE_BUDGET_BYTES: u64 = 256_000_000;

/// Bytes kept free for the trace's metadata (written last).
const METADATA_RESERVE: u64 = 64 * 1024;

/// Priority classes, most important first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Class {
    /// Process and thread names: always written, never reduced.
    Names,
    /// GPU counters, idle gaps (with their causes) and clock-event reasons.
    Gpu,
    /// Stack slices and scheduler states of main (rank) and worker threads.
    MainStacks,
    /// Per-process counters and the system's totals.
    ProcessCounters,
    /// Per-thread and per-CPU counters, stacks and states of other processes.
    Detail,
}

impl Class {
    pub fn number(self) -> u32 {
        self as u32
    }
    pub fn label(self) -> &'static str {
        match self {
            Class::Names => "process and thread names",
            Class::Gpu => "GPU tracks and idle gaps",
            Class::MainStacks => "main and worker stack slices and states",
            Class::ProcessCounters => "per-process and system counters",
            Class::Detail => "per-thread and per-CPU detail, other processes' stacks",
        }
    }
}

/// What writing a part at some level did: `None` when nothing was reduced.
pub type Reduction = Option<String>;

/// A writer of one part at a given level.
pub type PartFn<'a> =
    Box<dyn Fn(u32, &mut TraceWriter<&mut dyn Write>) -> io::Result<Reduction> + 'a>;

/// One kind of track in the trace.
pub struct Part<'a> {
    pub class: Class,
    pub name: String,
    /// The level from which the part does not get any smaller.
    pub max_level: u32,
    /// The coarsest level reached before higher classes are reduced.
    pub floor_level: u32,
    pub write: PartFn<'a>,
}

/// A part's outcome, for the metadata and the report.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PartOutcome {
    pub part: String,
    pub class: u32,
    pub priority: &'static str,
    /// 0: full resolution; each level halves the time resolution.
    pub level: u32,
    pub bytes_full: u64,
    pub bytes: u64,
    /// Left out entirely (only when merging could not fit the budget).
    pub dropped: bool,
    /// What was merged (None at full resolution).
    pub reduction: Option<String>,
}

/// The trace's size and every reduction made to fit it.
#[derive(Clone, Debug, Serialize, PartialEq, Default)]
pub struct BudgetOutcome {
    pub budget_bytes: u64,
    /// Bytes of the trace events (the metadata comes on top, a few kB).
    pub bytes: u64,
    pub within_budget: bool,
    pub parts: Vec<PartOutcome>,
    /// Every reduction, in words: those made to fit the budget and those
    /// the analysis made to stay within bounded memory.
    pub reductions: Vec<String>,
}

/// Chosen level per part; `None`: left out.
pub struct Plan {
    pub levels: Vec<Option<u32>>,
    pub full: Vec<u64>,
    pub planned: Vec<u64>,
}

/// A condition on the levels of every part.
type Test<'t> = dyn Fn(&mut Sizes, &[Option<u32>]) -> io::Result<bool> + 't;

struct Sizes<'p, 'a> {
    parts: &'p [Part<'a>],
    start: MonoNs,
    cache: HashMap<(usize, u32), u64>,
}

impl Sizes<'_, '_> {
    fn of(&mut self, i: usize, level: u32) -> io::Result<u64> {
        let level = level.min(self.parts[i].max_level);
        if let Some(b) = self.cache.get(&(i, level)) {
            return Ok(*b);
        }
        let mut sink = io::sink();
        let mut tw = TraceWriter::counting(&mut sink as &mut dyn Write, self.start);
        (self.parts[i].write)(level, &mut tw)?;
        let b = tw.bytes;
        self.cache.insert((i, level), b);
        Ok(b)
    }
}

/// Share of the room a class keeps before the GPU class is reduced (see
/// [`plan`]).
fn guarantee(class: Class) -> f64 {
    match class {
        Class::MainStacks => 0.25,
        Class::ProcessCounters | Class::Detail => 0.05,
        Class::Gpu | Class::Names => 0.0,
    }
}

/// Bytes of the parts at `levels` (of one class only, when given).
fn total(sizes: &mut Sizes, levels: &[Option<u32>], only: Option<Class>) -> io::Result<u64> {
    let mut t = 0;
    for (i, l) in levels.iter().enumerate() {
        if only.is_some_and(|c| sizes.parts[i].class != c) {
            continue;
        }
        if let Some(l) = l {
            t += sizes.of(i, *l)?;
        }
    }
    Ok(t)
}
/// Levels with `class` raised to `l` (each part capped by `limit`,
/// never lowered).
fn with_level(
    parts: &[Part],
    levels: &[Option<u32>],
    class: Class,
    l: u32,
    limit: &dyn Fn(&Part) -> u32,
) -> Vec<Option<u32>> {
    let mut out = levels.to_vec();
    for (i, p) in parts.iter().enumerate() {
        if p.class == class {
            if let Some(cur) = out[i] {
                out[i] = Some(l.min(limit(p)).max(cur));
            }
        }
    }
    out
}
/// The smallest class level in [lo, hi] for which `ok` holds, by
/// bisection; `None` when not even `hi` does.
fn smallest(
    sizes: &mut Sizes,
    levels: &[Option<u32>],
    class: Class,
    (lo, hi): (u32, u32),
    limit: &dyn Fn(&Part) -> u32,
    ok: &Test,
) -> io::Result<Option<u32>> {
    if !ok(sizes, &with_level(sizes.parts, levels, class, hi, limit))? {
        return Ok(None);
    }
    let (mut a, mut b) = (lo, hi);
    while a < b {
        let mid = a + (b - a) / 2;
        if ok(sizes, &with_level(sizes.parts, levels, class, mid, limit))? {
            b = mid;
        } else {
            a = mid + 1;
        }
    }
    Ok(Some(a))
}

/// Choose a level for every part so that the trace fits `budget` bytes:
/// 1. lower classes down to their floors, lowest priority first (the GPU
///    class untouched);
/// 2. past their floors, lowest priority first, but each no smaller than a
///    guaranteed share of the budget (a quarter for main and worker
///    stacks, 5% for the others), so that the GPU class is never kept whole
///    at the price of the stacks that explain its gaps;
/// 3. the GPU class;
/// 4. lower classes past their guaranteed shares;
/// 5. whole parts left out, lowest priority (and largest) first — never a
///    GPU part.
///
/// Each step stops as soon as the trace fits, at the finest level that
/// fits (by bisection: sizes shrink as levels grow).
pub fn plan(parts: &[Part], start: MonoNs, budget: u64) -> io::Result<Plan> {
    let room = budget.saturating_sub(METADATA_RESERVE);
    let mut sizes = Sizes {
        parts,
        start,
        cache: HashMap::new(),
    };
    let n = parts.len();
    let mut levels: Vec<Option<u32>> = vec![Some(0); n];
    let full: Vec<u64> = (0..n).map(|i| sizes.of(i, 0)).collect::<io::Result<_>>()?;

    let class_level = |levels: &[Option<u32>], class: Class| {
        (0..n)
            .filter(|i| parts[*i].class == class)
            .filter_map(|i| levels[i])
            .min()
            .unwrap_or(0)
    };
    let fits = |sizes: &mut Sizes, l: &[Option<u32>]| Ok(total(sizes, l, None)? <= room);
    let floor = |p: &Part| p.floor_level.min(p.max_level);
    let max = |p: &Part| p.max_level;
    let lower = [Class::Detail, Class::ProcessCounters, Class::MainStacks];

    // Reduce `class` within `limit` (up to its level `cap`) until the
    // trace fits; true when it does.
    let step = |sizes: &mut Sizes,
                levels: &mut Vec<Option<u32>>,
                class: Class,
                cap: u32,
                limit: &dyn Fn(&Part) -> u32|
     -> io::Result<bool> {
        if !parts.iter().any(|p| p.class == class) {
            return Ok(false);
        }
        let lo = class_level(levels, class);
        let cap = cap.max(lo);
        match smallest(sizes, levels, class, (lo, cap), limit, &fits)? {
            Some(l) => {
                *levels = with_level(parts, levels, class, l, limit);
                Ok(true)
            }
            None => {
                *levels = with_level(parts, levels, class, cap, limit);
                Ok(false)
            }
        }
    };

    let mut done = fits(&mut sizes, &levels)?;
    // 1. Floors, lowest priority first.
    for class in lower {
        if done {
            break;
        }
        done = step(&mut sizes, &mut levels, class, u32::MAX, &floor)?;
    }
    // 2. Past the floors down to each class's guaranteed share.
    for class in lower {
        if done {
            break;
        }
        let g = (guarantee(class) * room as f64) as u64;
        let lo = class_level(&levels, class);
        let hi = parts
            .iter()
            .filter(|p| p.class == class)
            .map(|p| p.max_level)
            .max()
            .unwrap_or(0);
        let small_enough =
            |sizes: &mut Sizes, l: &[Option<u32>]| Ok(total(sizes, l, Some(class))? <= g);
        // The finest level at which the class is within its share: it is
        // not reduced past that in this step.
        let cap = smallest(
            &mut sizes,
            &levels,
            class,
            (lo, hi.max(lo)),
            &max,
            &small_enough,
        )?
        .unwrap_or(hi);
        done = step(&mut sizes, &mut levels, class, cap, &max)?;
    }
    // 3. The GPU class.
    if !done {
        done = step(&mut sizes, &mut levels, Class::Gpu, u32::MAX, &max)?;
    }
    // 4. Lower classes past their shares.
    for class in lower {
        if done {
            break;
        }
        done = step(&mut sizes, &mut levels, class, u32::MAX, &max)?;
    }
    // 5. Still too large at the coarsest resolution: leave out whole parts,
    // lowest priority and largest first; never GPU parts or names.
    for class in lower {
        let mut idx: Vec<usize> = (0..n).filter(|i| parts[*i].class == class).collect();
        idx.sort_by_key(|i| std::cmp::Reverse(full[*i]));
        for i in idx {
            if total(&mut sizes, &levels, None)? <= room {
                break;
            }
            levels[i] = None;
        }
    }
    // A part that reduction did not make smaller (merging can even add
    // points where a value repeated) stays at full resolution.
    for i in 0..n {
        if let Some(l) = levels[i] {
            if l > 0 && sizes.of(i, l)? >= full[i] {
                levels[i] = Some(0);
            }
        }
    }
    let planned = levels
        .iter()
        .enumerate()
        .map(|(i, l)| l.map_or(Ok(0), |l| sizes.of(i, l)))
        .collect::<io::Result<_>>()?;
    Ok(Plan {
        levels,
        full,
        planned,
    })
}

/// A size option such as `256MB`, `1.5GB`, `512MiB`, `800kB` or a plain
/// number of bytes. Decimal units (kB, MB, GB) are powers of 1000, binary
/// ones (KiB, MiB, GiB) of 1024.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad =
        || format!("invalid size `{s}`: use a number with a unit, e.g. 256MB, 1GB, 512MiB, 800kB");
    let v: f64 = num.parse().map_err(|_| bad())?;
    let mul = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        _ => return Err(bad()),
    };
    let bytes = v * mul;
    if !bytes.is_finite() || !(1.0..=1e15).contains(&bytes) {
        return Err(bad());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A part of `events` events that halve with each level, down to `min`.
    fn part(class: Class, events: u64, min: u64, floor: u32) -> Part<'static> {
        Part {
            class,
            name: format!("{class:?}"),
            max_level: 20,
            floor_level: floor,
            write: Box::new(move |level, tw| {
                let n = (events >> level).max(min);
                for i in 0..n {
                    tw.counter_value(1, "x y", MonoNs(i * 1000), 1.0)?;
                }
                Ok((level > 0).then(|| format!("level {level}")))
            }),
        }
    }

    #[test]
    fn lowest_priority_is_reduced_first_and_gpu_last() {
        let parts = vec![
            part(Class::Gpu, 10_000, 10, 0),
            part(Class::MainStacks, 10_000, 10, 3),
            part(Class::Detail, 100_000, 10, 3),
        ];
        let one = {
            let mut s = Sizes {
                parts: &parts,
                start: MonoNs(0),
                cache: HashMap::new(),
            };
            s.of(0, 0).unwrap()
        };
        // Room for everything but about half of the detail part.
        let budget = METADATA_RESERVE + one * 7;
        let p = plan(&parts, MonoNs(0), budget).unwrap();
        assert_eq!(p.levels[0], Some(0), "GPU untouched");
        assert_eq!(p.levels[1], Some(0), "main stacks untouched");
        assert!(p.levels[2].unwrap() >= 1);
        assert!(p.planned.iter().sum::<u64>() <= budget);

        // Less room: detail goes to its floor, then main stacks shrink.
        let budget = METADATA_RESERVE + one * 18 / 10;
        let p = plan(&parts, MonoNs(0), budget).unwrap();
        assert_eq!(p.levels[0], Some(0));
        assert!(p.levels[2].unwrap() >= 3);
        assert!(p.levels[1].unwrap() >= 1);
        assert!(p.planned.iter().sum::<u64>() <= budget);

        // Tiny: everything past its floor, GPU included, nothing dropped.
        let budget = METADATA_RESERVE + one / 10;
        let p = plan(&parts, MonoNs(0), budget).unwrap();
        assert!(p.levels.iter().all(|l| l.is_some_and(|l| l > 0)));
        assert!(p.planned.iter().sum::<u64>() <= budget);

        // Impossible: lower parts are dropped, the GPU part never.
        let p = plan(&parts, MonoNs(0), METADATA_RESERVE + 10).unwrap();
        assert!(p.levels[0].is_some());
        assert_eq!(p.levels[2], None);
    }

    #[test]
    fn the_gpu_class_is_not_kept_whole_at_the_price_of_the_stacks() {
        // A GPU part alone larger than the budget, and main stacks as large.
        let parts = vec![
            part(Class::Gpu, 10_000, 10, 0),
            part(Class::MainStacks, 10_000, 10, 2),
        ];
        let one = {
            let mut s = Sizes {
                parts: &parts,
                start: MonoNs(0),
                cache: HashMap::new(),
            };
            s.of(0, 0).unwrap()
        };
        let room = one * 8 / 10;
        let p = plan(&parts, MonoNs(0), METADATA_RESERVE + room).unwrap();
        assert!(p.levels[0].unwrap() >= 1, "the GPU part had to shrink");
        // The stacks keep about their guaranteed quarter, not a crumb.
        assert!(
            p.planned[1] * 8 >= room,
            "stacks kept {} of {room}",
            p.planned[1]
        );
        assert!(p.planned.iter().sum::<u64>() <= room);
    }

    #[test]
    fn sizes_parse_with_their_units() {
        assert_eq!(parse_size("256MB"), Ok(256_000_000));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("1.5 GB"), Ok(1_500_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("-3MB").is_err());
    }
}
