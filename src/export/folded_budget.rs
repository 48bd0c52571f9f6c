//! Bounded folded files. The native view keeps every frame as sampled,
//! and a long run of a deep C++ framework has a distinct call path in
//! nearly every sample: 10 MB of `stacks-main-native.folded` for 45 s of a
//! ResNet on the CPU, growing with the run. Two steps keep the files
//! bounded, each stated in the file itself:
//!
//! 1. Native code its file does not name aggregates by library, as in the
//!    Python view: `[libgomp.so.1+0x1de62]` is written `[libgomp.so.1]`,
//!    consecutive frames of one such library as one.
//! 2. A file still over [`FOLDED_MAX_BYTES`] keeps the first and last
//!    frames of each stack and merges those between into one
//!    [`MIDDLE_MERGED`] frame, fewer kept at each level until it fits: the
//!    process and its entry at the root and the functions that spent the
//!    time at the leaf stay, and every frame's count is still exact. Past
//!    the last level, the rarest stacks of each root are merged into one
//!    [`RARE_MERGED`] line.

use std::collections::BTreeMap;

/// Most bytes of one folded file: 4 MiB, whatever the run's length (an
/// hour writes at most this per file; see docs/outputs.md).
pub const FOLDED_MAX_BYTES: usize = 4 << 20;

/// The frame standing for the frames merged between a stack's first and
/// last ones.
pub const MIDDLE_MERGED: &str = "[middle frames merged: folded size budget]";
/// The frame standing for a root's rarest stacks, merged.
pub const RARE_MERGED: &str = "[rare stacks merged: folded size budget]";

/// Frames kept (first, last) at each level, until the file fits.
const LEVELS: &[(usize, usize)] = &[
    (24, 64),
    (16, 40),
    (12, 28),
    (8, 20),
    (6, 12),
    (4, 8),
    (3, 5),
    (2, 3),
];

/// An unnamed native frame, `[libz.so.1+0x1234]`: its library's label.
pub fn library_of(frame: &str) -> Option<&str> {
    let inner = frame.strip_prefix('[')?.strip_suffix(']')?;
    let (lib, off) = inner.rsplit_once("+0x")?;
    (!lib.is_empty() && !off.is_empty() && off.bytes().all(|b| b.is_ascii_hexdigit()))
        .then_some(lib)
}

/// Lines of folded text, `stack count`: the stack and its count (lines
/// without a count are left out).
fn parse(folded: &str) -> impl Iterator<Item = (&str, u64)> {
    folded.lines().filter_map(|l| {
        let (stack, n) = l.rsplit_once(' ')?;
        Some((stack, n.parse().ok()?))
    })
}

fn render(lines: &BTreeMap<String, u64>) -> String {
    let mut out = String::new();
    for (l, n) in lines {
        out.push_str(l);
        out.push(' ');
        out.push_str(&n.to_string());
        out.push('\n');
    }
    out
}

fn size(lines: &BTreeMap<String, u64>) -> usize {
    lines
        .iter()
        .map(|(l, n)| l.len() + 2 + n.to_string().len())
        .sum()
}

/// Unnamed native frames aggregated by library (step 1).
pub fn by_library(folded: &str) -> String {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for (stack, n) in parse(folded) {
        let mut out = String::with_capacity(stack.len());
        let mut last_lib: Option<&str> = None;
        for f in stack.split(';') {
            let lib = library_of(f);
            if lib.is_some() && lib == last_lib {
                continue;
            }
            last_lib = lib;
            if !out.is_empty() {
                out.push(';');
            }
            match lib {
                Some(l) => {
                    out.push('[');
                    out.push_str(l);
                    out.push(']');
                }
                None => out.push_str(f),
            }
        }
        *lines.entry(out).or_default() += n;
    }
    render(&lines)
}

/// Each stack of `lines` with its middle merged, keeping `first` and
/// `last` frames.
fn merge_middle(lines: &[(Vec<&str>, u64)], first: usize, last: usize) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for (frames, n) in lines {
        let line = if frames.len() > first + last + 1 {
            let mut v: Vec<&str> = frames[..first].to_vec();
            v.push(MIDDLE_MERGED);
            v.extend_from_slice(&frames[frames.len() - last..]);
            v.join(";")
        } else {
            frames.join(";")
        };
        *out.entry(line).or_default() += n;
    }
    out
}

/// The most common stacks that fit in `max` bytes; the rest of each root
/// merged into one line.
fn keep_common(lines: BTreeMap<String, u64>, max: usize) -> BTreeMap<String, u64> {
    let mut by_count: Vec<(String, u64)> = lines.into_iter().collect();
    by_count.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
    let mut kept: BTreeMap<String, u64> = BTreeMap::new();
    let mut rare: BTreeMap<String, u64> = BTreeMap::new();
    let mut used = 0usize;
    let reserve = max / 8;
    for (l, n) in by_count {
        let len = l.len() + 2 + n.to_string().len();
        if used + len <= max.saturating_sub(reserve) {
            used += len;
            kept.insert(l, n);
        } else {
            let root = l.split(';').next().unwrap_or("?").to_string();
            *rare.entry(format!("{root};{RARE_MERGED}")).or_default() += n;
        }
    }
    // Every count stays: one line per root (a process), within the room
    // reserved for them on any but a file of thousands of processes.
    for (l, n) in rare {
        *kept.entry(l).or_default() += n;
    }
    kept
}

/// `folded` within `max` bytes (step 2); unchanged when it fits.
pub fn bound(folded: &str, max: usize) -> String {
    if folded.len() <= max {
        return folded.to_string();
    }
    let lines: Vec<(Vec<&str>, u64)> = parse(folded)
        .map(|(s, n)| (s.split(';').collect(), n))
        .collect();
    let mut merged = BTreeMap::new();
    for &(first, last) in LEVELS {
        merged = merge_middle(&lines, first, last);
        if size(&merged) <= max {
            return render(&merged);
        }
    }
    render(&keep_common(merged, max))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn total(folded: &str) -> u64 {
        parse(folded).map(|x| x.1).sum()
    }

    #[test]
    fn unnamed_frames_aggregate_by_library() {
        let f = "py (1);main;[libgomp.so.1+0x1de62];[libgomp.so.1+0x1b497];[libc.so.6+0x891f4] 2\n\
                 py (1);main;[libgomp.so.1+0x1e02a];[libgomp.so.1+0x1b4c9];[libc.so.6+0x891f4] 3\n\
                 py (1);main;deflate;deflate 1\n";
        let out = by_library(f);
        assert_eq!(
            out,
            "py (1);main;[libgomp.so.1];[libc.so.6] 5\npy (1);main;deflate;deflate 1\n"
        );
        // Not an offset: left as it is.
        assert_eq!(library_of("[unknown]"), None);
        assert_eq!(library_of("[anon+0xzz]"), None);
    }

    #[test]
    fn a_file_over_budget_keeps_its_ends_and_every_count() {
        // 2000 distinct deep stacks that differ in their middle.
        let mut f = String::new();
        for i in 0..2000 {
            let mid: Vec<String> = (0..40).map(|k| format!("f{}_{k}", i % 97 + k)).collect();
            f.push_str(&format!(
                "py (7);_start;main;{};leaf{} 1\n",
                mid.join(";"),
                i % 5
            ));
        }
        let max = 20_000;
        assert!(f.len() > max);
        let out = bound(&f, max);
        assert!(out.len() <= max, "{} bytes", out.len());
        assert_eq!(total(&out), total(&f));
        for l in out.lines() {
            assert!(l.starts_with("py (7);"), "{l}");
        }
        assert!(out.contains(MIDDLE_MERGED) || out.contains(RARE_MERGED));
        // A file that fits is unchanged.
        assert_eq!(bound(&f, f.len()), f);
    }

    #[test]
    fn past_the_last_level_the_rarest_stacks_merge() {
        let mut f = String::new();
        for i in 0..500 {
            f.push_str(&format!(
                "p (1);a;leaf_with_a_long_distinct_name_{i} {}\n",
                1 + i % 3
            ));
        }
        let out = bound(&f, 4000);
        assert!(out.len() <= 4000, "{}", out.len());
        assert_eq!(total(&out), total(&f));
        assert!(out.contains(&format!("p (1);{RARE_MERGED} ")), "{out}");
    }
}
