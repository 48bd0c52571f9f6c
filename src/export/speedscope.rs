//! `profile.speedscope.json`: the CPU stack samples in speedscope's file
//! format (www.speedscope.app/file-format-schema.json), the viewer py-spy
//! users know (`npx speedscope profile.speedscope.json`, or drop the file
//! on www.speedscope.app).
//!
//! One `sampled` profile per thread, named `process (pid) · thread (tid)`
//! and ordered by process and thread, so the viewer's profile menu switches
//! between the processes and their threads; the one with the most CPU time
//! opens first. Each holds the thread's samples in time order, in the same
//! view as the flamegraphs (`--flame`), with consecutive samples of one
//! stack joined into one; weights are CPU time in nanoseconds (samples ×
//! the sampling period). Speedscope's "Time Order" view therefore shows the
//! thread's CPU time one sample after another (time off the CPU is not in
//! it), and `startValue` is the first sample's time since the start of the
//! recording. Frames are shared: Python functions with their source file
//! and, where the recording has it (`--lines` or not), the line the frame
//! was on — one frame per (function, line), which speedscope shows as
//! `file:line` — native functions with their library. The same samples as
//! the folded files: the weights of all profiles add up to
//! `stacks-all.folded`'s count × the period.
//!
//! The file stays within [`DEFAULT_MAX_BYTES`]: past it, each thread's
//! samples of one stack are joined within windows of time (see
//! [`write_capped`]), and the file's name says so.

use std::collections::HashMap;
use std::io::{self, Write};

use crate::analysis::stacks::View;
use crate::analysis::Analysis;
use crate::export::sampled::{self, FrameDesc};

/// The file name.
pub const FILE: &str = "profile.speedscope.json";
/// The schema speedscope recognises the format by.
pub const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

fn json_str<W: Write>(w: &mut W, s: &str) -> io::Result<()> {
    serde_json::to_writer(&mut *w, s).map_err(io::Error::from)
}

/// Default bound on the file's size. The analysis keeps at most
/// [`crate::analysis::stacks::ANALYSIS_MAX_SAMPLES`] samples, one entry
/// each at most: ~100 bytes per entry for deep stacks would be 200 MB,
/// more than the viewer opens comfortably.
pub const DEFAULT_MAX_BYTES: u64 = 64_000_000;

/// One thread's profile before it is written.
struct Profile {
    name: String,
    start: u64,
    /// (stack id, weight in the profile's unit).
    samples: Vec<(u32, u64)>,
    total: u64,
}

/// A thread's entries: consecutive samples of one stack joined (`window`
/// 0), or, within each `window` ns of time, every sample of one stack
/// joined into one entry (in the order of their first sample).
fn entries(
    st: &crate::analysis::stacks::Stacks,
    thread: &[crate::analysis::stacks::Sample],
    view: View,
    window: u64,
    per_sample: u64,
) -> Vec<(u32, u64)> {
    let mut out: Vec<(u32, u64)> = Vec::new();
    let mut in_cell: HashMap<u32, usize> = HashMap::new();
    let mut cell = None;
    for s in thread {
        let stack = st.lined_view_stack(s, view);
        let w = (s.weight as u64).saturating_mul(per_sample);
        if window == 0 {
            match out.last_mut() {
                Some(last) if last.0 == stack => last.1 += w,
                _ => out.push((stack, w)),
            }
            continue;
        }
        let c = s.t.0 / window;
        if cell != Some(c) {
            cell = Some(c);
            in_cell.clear();
        }
        match in_cell.get(&stack) {
            Some(&i) => out[i].1 += w,
            None => {
                in_cell.insert(stack, out.len());
                out.push((stack, w));
            }
        }
    }
    out
}

fn digits(mut n: u64) -> u64 {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

/// Write the file, within [`DEFAULT_MAX_BYTES`].
pub fn write<W: Write>(a: &Analysis, view: View, w: W) -> io::Result<()> {
    write_capped(a, view, DEFAULT_MAX_BYTES, w)
}

/// Write the file within about `max_bytes`: when one entry per run of
/// samples does not fit, each thread's samples of one stack are joined
/// within windows of time (the sampling period × 2, 4, … as needed), which
/// keeps every total and the time order at the window's resolution; the
/// file's name says the window.
pub fn write_capped<W: Write>(a: &Analysis, view: View, max_bytes: u64, w: W) -> io::Result<()> {
    let st = &a.stacks;
    let period = sampled::period_ns(st);
    // Without a known period the weights are sample counts.
    let (unit, per_sample) = if period > 0 {
        ("nanoseconds", period)
    } else {
        ("none", 1)
    };
    // Shared frames, numbered as first used (samples are sorted by
    // process, thread and time); frames described alike are one (a Python
    // function whose line was not decoded, and the same function from
    // py-spy, which has no lines).
    let mut frame_index: HashMap<u32, usize> = HashMap::new();
    let mut by_desc: HashMap<FrameDesc, usize> = HashMap::new();
    let mut frames: Vec<u32> = Vec::new();
    // Bytes of each stack's JSON array.
    let mut stack_bytes: HashMap<u32, u64> = HashMap::new();
    for s in &st.samples {
        let stack = st.lined_view_stack(s, view);
        if stack_bytes.contains_key(&stack) {
            continue;
        }
        let mut b = 2;
        for f in st.lined_stack_ids(stack) {
            let i = *frame_index.entry(*f).or_insert_with(|| {
                *by_desc.entry(sampled::describe(st, *f)).or_insert_with(|| {
                    frames.push(*f);
                    frames.len() - 1
                })
            });
            b += digits(i as u64) + 1;
        }
        stack_bytes.insert(stack, b);
    }
    let mut head = Vec::new();
    write_frames(st, &frames, &mut head)?;

    let threads: Vec<&[crate::analysis::stacks::Sample]> = st.threads().collect();
    let mut level = 0;
    let (window, profiles) = loop {
        let window = if level == 0 { 0 } else { st.cell_ns(level) };
        let mut bytes = head.len() as u64 + 200 * threads.len() as u64;
        let mut profiles: Vec<Profile> = Vec::with_capacity(threads.len());
        for thread in &threads {
            let samples = entries(st, thread, view, window, per_sample);
            bytes += samples
                .iter()
                .map(|(k, w)| stack_bytes[k] + digits(*w) + 2)
                .sum::<u64>();
            let first = &thread[0];
            profiles.push(Profile {
                name: thread_title(a, first.pid, first.tid),
                start: first.t.0.saturating_sub(a.start.0),
                total: samples.iter().map(|x| x.1).sum(),
                samples,
            });
        }
        if bytes <= max_bytes || level >= crate::analysis::stacks::MAX_TRACE_LEVEL {
            break (window, profiles);
        }
        level += 1;
    };
    let active = profiles
        .iter()
        .enumerate()
        .max_by(|x, y| x.1.total.cmp(&y.1.total).then(y.0.cmp(&x.0)))
        .map_or(0, |(i, _)| i);

    let mut w = io::BufWriter::with_capacity(1 << 16, w);
    write!(w, "{{\"$schema\":")?;
    json_str(&mut w, SCHEMA)?;
    write!(w, ",\"exporter\":")?;
    json_str(&mut w, &format!("gpuprof@{}", env!("CARGO_PKG_VERSION")))?;
    write!(w, ",\"name\":")?;
    let mut name = if a.header.command.is_empty() {
        "gpuprof".to_string()
    } else {
        format!("gpuprof: {}", a.header.command.join(" "))
    };
    if window > 0 {
        name.push_str(&format!(
            " · samples of one stack joined per {} ms of each thread (to fit {} MB)",
            window as f64 / 1e6,
            max_bytes / 1_000_000
        ));
    }
    json_str(&mut w, &name)?;
    write!(w, ",\"activeProfileIndex\":{active},")?;
    w.write_all(&head)?;
    w.write_all(b",\"profiles\":[")?;
    for (i, p) in profiles.iter().enumerate() {
        if i > 0 {
            w.write_all(b",")?;
        }
        w.write_all(b"{\"type\":\"sampled\",\"name\":")?;
        json_str(&mut w, &p.name)?;
        write!(
            w,
            ",\"unit\":\"{unit}\",\"startValue\":{},\"endValue\":{},\"samples\":[",
            p.start,
            p.start + p.total
        )?;
        for (k, (stack, _)) in p.samples.iter().enumerate() {
            if k > 0 {
                w.write_all(b",")?;
            }
            w.write_all(b"[")?;
            for (j, f) in st.lined_stack_ids(*stack).iter().enumerate() {
                if j > 0 {
                    w.write_all(b",")?;
                }
                write!(w, "{}", frame_index[f])?;
            }
            w.write_all(b"]")?;
        }
        w.write_all(b"],\"weights\":[")?;
        for (k, (_, wgt)) in p.samples.iter().enumerate() {
            if k > 0 {
                w.write_all(b",")?;
            }
            write!(w, "{wgt}")?;
        }
        w.write_all(b"]}")?;
    }
    w.write_all(b"]}\n")?;
    w.flush()
}

/// `process (pid) · thread (tid)`.
fn thread_title(a: &Analysis, pid: crate::event::Pid, tid: crate::event::Tid) -> String {
    let process = sampled::process_name(a, pid);
    match sampled::thread_name(a, pid, tid) {
        Some(t) => format!("{process} ({pid}) · {t} ({tid})"),
        None => format!("{process} ({pid}) · thread {tid}"),
    }
}

/// `"shared":{"frames":[…]}`.
fn write_frames(
    st: &crate::analysis::stacks::Stacks,
    frames: &[u32],
    w: &mut Vec<u8>,
) -> io::Result<()> {
    w.write_all(b"\"shared\":{\"frames\":[")?;
    for (i, f) in frames.iter().enumerate() {
        if i > 0 {
            w.write_all(b",")?;
        }
        w.write_all(b"{\"name\":")?;
        let desc = sampled::describe(st, *f);
        json_str(w, desc.name())?;
        match desc {
            FrameDesc::Python { file, line, .. } => {
                if !file.is_empty() {
                    w.write_all(b",\"file\":")?;
                    json_str(w, file)?;
                }
                // speedscope shows it as `file:line`.
                if let Some(l) = line {
                    write!(w, ",\"line\":{l}")?;
                }
            }
            FrameDesc::Native { library, .. } | FrameDesc::Unnamed { library, .. } => {
                w.write_all(b",\"file\":")?;
                json_str(w, library)?;
            }
            _ => {}
        }
        w.write_all(b"}")?;
    }
    w.write_all(b"]}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::sampled::tiny_analysis;
    use serde_json::Value;

    fn render(a: &Analysis, max: u64) -> Value {
        let mut buf = Vec::new();
        write_capped(a, View::Native, max, &mut buf).unwrap();
        serde_json::from_slice(&buf).expect("valid JSON")
    }

    #[test]
    fn one_profile_per_thread_with_joined_runs_and_cpu_weights() {
        let a = tiny_analysis();
        let j = render(&a, DEFAULT_MAX_BYTES);
        assert_eq!(j["$schema"], SCHEMA);
        assert_eq!(j["name"], "gpuprof: python3 app.py");
        let frames: Vec<(String, Option<String>)> = j["shared"]["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["name"].as_str().unwrap().to_string(),
                    f["file"].as_str().map(String::from),
                )
            })
            .collect();
        let lib = Some("/opt/app/libapp.so".to_string());
        assert_eq!(
            frames,
            [
                ("main".to_string(), lib.clone()),
                ("work".to_string(), lib.clone()),
                ("[libapp.so+0x300]".to_string(), lib.clone()),
            ]
        );
        let p = j["profiles"].as_array().unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0]["name"], "python3 (100) · python3 (100)");
        assert_eq!(p[1]["name"], "python3 (100) · loader (101)");
        assert_eq!(p[0]["type"], "sampled");
        assert_eq!(p[0]["unit"], "nanoseconds");
        // work ×2 joined, unnamed, work, main: root to leaf.
        assert_eq!(
            p[0]["samples"],
            serde_json::json!([[0, 1], [0, 1, 2], [0, 1], [0]])
        );
        let ms = 10_000_000u64;
        assert_eq!(p[0]["weights"], serde_json::json!([2 * ms, ms, ms, ms]));
        assert_eq!(p[0]["startValue"], 1_000_000_000u64);
        assert_eq!(p[0]["endValue"], 1_000_000_000u64 + 5 * ms);
        assert_eq!(j["activeProfileIndex"], 0);
    }

    #[test]
    fn a_small_bound_joins_stacks_within_windows_and_keeps_totals() {
        let a = tiny_analysis();
        let full = render(&a, DEFAULT_MAX_BYTES);
        let small = render(&a, 600);
        let total = |j: &Value| -> Vec<u64> {
            j["profiles"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    p["weights"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|w| w.as_u64().unwrap())
                        .sum()
                })
                .collect()
        };
        assert_eq!(total(&small), total(&full));
        let n = |j: &Value| j["profiles"][0]["samples"].as_array().unwrap().len();
        assert!(n(&small) < n(&full), "{small}");
        assert!(
            small["name"].as_str().unwrap().contains("joined per"),
            "{}",
            small["name"]
        );
        // Deterministic.
        assert_eq!(render(&a, 600), small);
    }
}
