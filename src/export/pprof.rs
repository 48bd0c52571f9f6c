//! `profile.pb.gz`: the CPU stack samples in pprof's format (gzip-compressed
//! `profile.proto` of github.com/google/pprof), for `go tool pprof` and the
//! services that read it (Grafana Pyroscope, Parca, Datadog, …).
//!
//! One file for the whole job: the same samples as `stacks-all.folded`
//! (in the same view, `--flame`), each carrying labels for what the folded
//! files put in their root frame and file names:
//!
//! | label | kind | value |
//! |---|---|---|
//! | `role` | string | `main`, `worker`, `launcher`, `other` |
//! | `process` | string | the process's name (as in the folded roots) |
//! | `command` | string | its command line, when recorded |
//! | `thread` | string | the thread's name, when recorded |
//! | `pid`, `tid` | string | the numbers |
//! | `rank` | string | the process's rank, for jobs that have ranks |
//!
//! so `-tagfocus role=worker` is `stacks-worker.folded` and `-tagroot
//! process` puts the processes back at the root. Each sample holds two
//! values: `samples/count` and `cpu/nanoseconds` (count × the sampling
//! period, which is `period` with `period_type` `cpu/nanoseconds`), as Go's
//! own CPU profiles do. Samples of one thread with one stack are one
//! `Sample` (pprof keeps no time per sample). Python frames are functions
//! with their source file, one location per (function, line): the line the
//! frame was on, where the recording has it (every recording with the
//! agent's same-instant frames, `--lines` or not), else none (0, pprof's
//! "unknown"). pprof shows functions by default and lines with `-lines`
//! (its line granularity, in the web UI too). Native frames have their
//! library or executable as the location's mapping (`has_functions`, so
//! pprof does not try to symbolize again) and, as address, the file
//! offset: of a named function, the lowest offset sampled in it (the
//! analysis counts per function, not per instruction). py-spy's
//! Python-only stacks (processes without same-instant Python frames) are not
//! CPU samples of the same kind and are left out, as from the role files.
//!
//! The output is deterministic: ids and strings are numbered in the order
//! of the samples (sorted by process, thread, time), and gzip's header
//! carries no time.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use crate::analysis::stacks::View;
use crate::analysis::Analysis;
use crate::event::{Pid, Tid};
use crate::export::pb::Message;
use crate::export::sampled::{self, FrameDesc};

/// The file name.
pub const FILE: &str = "profile.pb.gz";

/// Field numbers of profile.proto.
mod field {
    pub const SAMPLE_TYPE: u32 = 1;
    pub const SAMPLE: u32 = 2;
    pub const MAPPING: u32 = 3;
    pub const LOCATION: u32 = 4;
    pub const FUNCTION: u32 = 5;
    pub const STRING_TABLE: u32 = 6;
    pub const TIME_NANOS: u32 = 9;
    pub const DURATION_NANOS: u32 = 10;
    pub const PERIOD_TYPE: u32 = 11;
    pub const PERIOD: u32 = 12;
    pub const COMMENT: u32 = 13;
    pub const DEFAULT_SAMPLE_TYPE: u32 = 14;
}

/// The string table: index 0 is "".
struct Strings {
    table: Vec<String>,
    ids: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        let mut s = Strings {
            table: Vec::new(),
            ids: HashMap::new(),
        };
        s.id("");
        s
    }

    fn id(&mut self, v: &str) -> i64 {
        if let Some(id) = self.ids.get(v) {
            return *id;
        }
        let id = self.table.len() as i64;
        self.table.push(v.to_string());
        self.ids.insert(v.to_string(), id);
        id
    }
}

fn value_type(s: &mut Strings, ty: &str, unit: &str) -> Message {
    let mut m = Message::new();
    m.int(1, s.id(ty)).int(2, s.id(unit));
    m
}

/// A label of a sample. Every label is a string, numbers too: services
/// that index pprof labels (Pyroscope, Parca) take string labels only, and
/// pprof drops a numeric label whose value is 0 (rank 0) and has no unit.
fn label(s: &mut Strings, key: &str, value: &str) -> Message {
    let mut m = Message::new();
    m.int(1, s.id(key)).int(2, s.id(value));
    m
}

/// The labels of one thread's samples.
fn thread_labels(a: &Analysis, s: &mut Strings, pid: Pid, tid: Tid) -> Vec<Message> {
    let mut out = Vec::new();
    let role = a
        .stacks
        .procs
        .get(&pid)
        .map_or_else(|| "other".to_string(), |m| m.role.to_string());
    out.push(label(s, "role", &role));
    out.push(label(s, "process", sampled::process_name(a, pid)));
    if let Some(p) = a.processes.get(&pid) {
        if !p.cmdline.is_empty() {
            out.push(label(s, "command", &p.cmdline.join(" ")));
        }
    }
    if let Some(name) = sampled::thread_name(a, pid, tid) {
        out.push(label(s, "thread", name));
    }
    out.push(label(s, "pid", &pid.to_string()));
    out.push(label(s, "tid", &tid.to_string()));
    if let Some(rank) = a.processes.get(&pid).and_then(|p| p.rank) {
        out.push(label(s, "rank", &rank.to_string()));
    }
    out
}

/// What makes a location: a Python function at a line (0: unknown), or
/// any other frame (each with its own address).
#[derive(Clone, Copy, Hash, PartialEq, Eq)]
enum LocationKey {
    Python { function: u64, line: u32 },
    Frame(u32),
}

/// Locations, functions and mappings, numbered from 1 as first used.
#[derive(Default)]
struct Tables {
    /// frame id → location id.
    frames: HashMap<u32, u64>,
    locations: HashMap<LocationKey, u64>,
    /// (name, source file or library) → function id: a Python function
    /// sampled on several lines is one function.
    functions: HashMap<(String, String), u64>,
    location_msgs: Vec<Message>,
    function_msgs: Vec<Message>,
    /// library path → (mapping id, highest address + 1).
    mappings: HashMap<String, (u64, u64)>,
    mapping_order: Vec<String>,
}

impl Tables {
    fn location(&mut self, a: &Analysis, s: &mut Strings, frame: u32) -> u64 {
        if let Some(id) = self.frames.get(&frame) {
            return *id;
        }
        let desc = sampled::describe(&a.stacks, frame);
        let (file, line) = match desc {
            FrameDesc::Python { file, line, .. } => (file, line),
            FrameDesc::Native { library, .. } | FrameDesc::Unnamed { library, .. } => {
                (library, None)
            }
            FrameDesc::Marker { .. } => ("", None),
        };
        let n = self.function_msgs.len() as u64 + 1;
        let function = *self
            .functions
            .entry((desc.name().to_string(), file.to_string()))
            .or_insert_with(|| {
                let mut func = Message::new();
                func.uint(1, n)
                    .int(2, s.id(desc.name()))
                    .int(3, s.id(desc.name()));
                if let FrameDesc::Python { file, .. } = desc {
                    func.int(4, s.id(file));
                }
                self.function_msgs.push(func);
                n
            });
        let key = match desc {
            FrameDesc::Python { .. } => LocationKey::Python {
                function,
                line: line.unwrap_or(0),
            },
            _ => LocationKey::Frame(frame),
        };
        if let Some(id) = self.locations.get(&key) {
            self.frames.insert(frame, *id);
            return *id;
        }
        let id = self.location_msgs.len() as u64 + 1;
        let mut loc = Message::new();
        loc.uint(1, id);
        match desc {
            FrameDesc::Python { .. } => {}
            FrameDesc::Native {
                library, offset, ..
            }
            | FrameDesc::Unnamed {
                library, offset, ..
            } => {
                let n = self.mappings.len() as u64 + 1;
                let m = self.mappings.entry(library.to_string()).or_insert_with(|| {
                    self.mapping_order.push(library.to_string());
                    (n, 0)
                });
                let address = offset.unwrap_or(0);
                m.1 = m.1.max(address + 1);
                loc.uint(2, m.0).uint(3, address);
            }
            FrameDesc::Marker { .. } => {}
        }
        // Line { function_id, line }: a line left out is 0, "unknown".
        let mut l = Message::new();
        l.uint(1, function).int(2, line.map_or(0, i64::from));
        loc.message(4, &l);
        self.location_msgs.push(loc);
        self.locations.insert(key, id);
        self.frames.insert(frame, id);
        id
    }
}

/// The profile, uncompressed (profile.proto's `Profile` message).
pub fn encode(a: &Analysis, view: View) -> Vec<u8> {
    let st = &a.stacks;
    let period = sampled::period_ns(st);
    let mut s = Strings::new();
    let mut p = Message::new();
    p.message(field::SAMPLE_TYPE, &value_type(&mut s, "samples", "count"));
    p.message(
        field::SAMPLE_TYPE,
        &value_type(&mut s, "cpu", "nanoseconds"),
    );

    // (pid, tid, stack by line) → recorded samples. Samples come sorted
    // by (pid, tid, t); the map sorts stacks within a thread.
    let mut counts: BTreeMap<(Pid, Tid, u32), u64> = BTreeMap::new();
    for x in &st.samples {
        *counts
            .entry((x.pid, x.tid, st.lined_view_stack(x, view)))
            .or_default() += x.weight as u64;
    }
    let mut tables = Tables::default();
    let mut labels: Option<((Pid, Tid), Vec<Message>)> = None;
    for ((pid, tid), stack, n) in counts.iter().map(|((p, t, k), n)| ((*p, *t), *k, *n)) {
        if labels.as_ref().map(|l| l.0) != Some((pid, tid)) {
            labels = Some(((pid, tid), thread_labels(a, &mut s, pid, tid)));
        }
        let ids: Vec<u64> = st
            .lined_stack_ids(stack)
            .iter()
            .rev()
            .map(|f| tables.location(a, &mut s, *f))
            .collect();
        let mut sample = Message::new();
        sample
            .packed(1, ids)
            .packed(2, [n, n.saturating_mul(period)]);
        for l in &labels.as_ref().expect("set above").1 {
            sample.message(3, l);
        }
        p.message(field::SAMPLE, &sample);
    }
    for path in &tables.mapping_order {
        let (id, limit) = tables.mappings[path];
        let mut m = Message::new();
        m.uint(1, id)
            .uint(3, limit)
            .int(5, s.id(path))
            .bool(7, true);
        p.message(field::MAPPING, &m);
    }
    for l in &tables.location_msgs {
        p.message(field::LOCATION, l);
    }
    for f in &tables.function_msgs {
        p.message(field::FUNCTION, f);
    }

    let h = &a.header;
    let wall = h.anchor_realtime_ns as i128 + a.start.0 as i128 - h.anchor_monotonic_ns as i128;
    let comments = [
        format!("gpuprof {}", env!("CARGO_PKG_VERSION")),
        format!(
            "CPU stack samples of every process of the job, {} view (--flame {}); the same samples as stacks-all.folded",
            view.as_str(),
            view.as_str()
        ),
    ];
    let comment_ids: Vec<i64> = comments.iter().map(|c| s.id(c)).collect();
    let default_type = s.id("cpu");
    let period_type = value_type(&mut s, "cpu", "nanoseconds");
    for t in &s.table {
        p.string(field::STRING_TABLE, t);
    }
    p.int(field::TIME_NANOS, wall.clamp(0, i64::MAX as i128) as i64)
        .int(
            field::DURATION_NANOS,
            a.end.0.saturating_sub(a.start.0) as i64,
        )
        .message(field::PERIOD_TYPE, &period_type)
        .int(field::PERIOD, period as i64);
    p.packed(field::COMMENT, comment_ids.iter().map(|c| *c as u64));
    p.int(field::DEFAULT_SAMPLE_TYPE, default_type);
    p.into_bytes()
}

/// Write `profile.pb.gz`: the profile, gzip-compressed (what pprof reads).
pub fn write<W: Write>(a: &Analysis, view: View, w: W) -> io::Result<()> {
    let mut gz = flate2::GzBuilder::new().write(w, flate2::Compression::default());
    gz.write_all(&encode(a, view))?;
    gz.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::pb::decode::{fields, packed, Value};
    use crate::export::sampled::tiny_analysis;

    fn bytes_of(f: &[(u32, Value)], n: u32) -> Vec<Vec<u8>> {
        f.iter()
            .filter(|x| x.0 == n)
            .map(|x| match &x.1 {
                Value::Bytes(b) => b.clone(),
                v => panic!("field {n}: {v:?}"),
            })
            .collect()
    }

    fn uint(f: &[(u32, Value)], n: u32) -> u64 {
        f.iter().find(|x| x.0 == n).map_or(0, |x| match x.1 {
            Value::Varint(v) => v,
            _ => panic!("field {n}"),
        })
    }

    #[test]
    fn profile_decodes_with_samples_labels_mappings_and_functions() {
        let a = tiny_analysis();
        let buf = encode(&a, View::Native);
        let p = fields(&buf);
        let strings: Vec<String> = bytes_of(&p, field::STRING_TABLE)
            .into_iter()
            .map(|b| String::from_utf8(b).unwrap())
            .collect();
        assert_eq!(strings[0], "");
        let s = |i: u64| strings[i as usize].as_str();
        let types: Vec<(String, String)> = bytes_of(&p, field::SAMPLE_TYPE)
            .iter()
            .map(|b| {
                let f = fields(b);
                (s(uint(&f, 1)).to_string(), s(uint(&f, 2)).to_string())
            })
            .collect();
        assert_eq!(
            types,
            [
                ("samples".into(), "count".into()),
                ("cpu".into(), "nanoseconds".into())
            ]
        );
        assert_eq!(uint(&p, field::PERIOD), 10_000_000);
        assert_eq!(s(uint(&p, field::DEFAULT_SAMPLE_TYPE)), "cpu");
        assert_eq!(uint(&p, field::DURATION_NANOS), 3_000_000_000);
        assert_eq!(uint(&p, field::TIME_NANOS), 1_800_000_000_000_000_000);

        // Functions and locations by id.
        let funcs: std::collections::BTreeMap<u64, String> = bytes_of(&p, field::FUNCTION)
            .iter()
            .map(|b| {
                let f = fields(b);
                (uint(&f, 1), s(uint(&f, 2)).to_string())
            })
            .collect();
        let maps = bytes_of(&p, field::MAPPING);
        assert_eq!(maps.len(), 1);
        let m = fields(&maps[0]);
        assert_eq!(s(uint(&m, 5)), "/opt/app/libapp.so");
        assert_eq!(uint(&m, 7), 1, "has_functions");
        assert_eq!(uint(&m, 3), 0x301, "memory_limit past the highest address");
        let mut locs = std::collections::BTreeMap::new();
        for b in bytes_of(&p, field::LOCATION) {
            let f = fields(&b);
            assert_eq!(uint(&f, 2), uint(&m, 1), "mapping");
            let line = fields(&bytes_of(&f, 4)[0]);
            locs.insert(uint(&f, 1), (funcs[&uint(&line, 1)].clone(), uint(&f, 3)));
        }
        let by_name: std::collections::BTreeMap<&str, u64> =
            locs.values().map(|(n, a)| (n.as_str(), *a)).collect();
        assert_eq!(by_name["main"], 0x100);
        assert_eq!(by_name["work"], 0x200);
        assert_eq!(by_name["[libapp.so+0x300]"], 0x300);

        // Samples: (thread, leaf-first names) → [count, cpu ns].
        let mut got = std::collections::BTreeMap::new();
        for b in bytes_of(&p, field::SAMPLE) {
            let f = fields(&b);
            let ids = packed(&bytes_of(&f, 1)[0]);
            let names: Vec<String> = ids.iter().map(|i| locs[i].0.clone()).collect();
            let vals = packed(&bytes_of(&f, 2)[0]);
            let mut labels = std::collections::BTreeMap::new();
            for l in bytes_of(&f, 3) {
                let lf = fields(&l);
                let v = if uint(&lf, 2) != 0 {
                    s(uint(&lf, 2)).to_string()
                } else {
                    uint(&lf, 3).to_string()
                };
                labels.insert(s(uint(&lf, 1)).to_string(), v);
            }
            assert_eq!(labels["role"], "main");
            assert_eq!(labels["process"], "python3");
            assert_eq!(labels["command"], "python3 app.py");
            assert_eq!(labels["pid"], "100");
            assert!(!labels.contains_key("rank"));
            got.insert((labels["thread"].clone(), names.join(";")), vals);
        }
        let ms = 10_000_000;
        let want: std::collections::BTreeMap<(String, String), Vec<u64>> = [
            (("python3", "main"), vec![1, ms]),
            (("python3", "work;main"), vec![3, 3 * ms]),
            (("python3", "[libapp.so+0x300];work;main"), vec![1, ms]),
            (("loader", "main"), vec![1, ms]),
            (("loader", "[libapp.so+0x300];work;main"), vec![1, ms]),
        ]
        .into_iter()
        .map(|((t, n), v)| ((t.to_string(), n.to_string()), v))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_process_with_a_rank_carries_it_as_a_label_even_rank_0() {
        let env: crate::event::RankEnv = [("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "4")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let a = crate::export::sampled::tiny_analysis_with_env(Some(env));
        assert_eq!(a.processes[&Pid(100)].rank, Some(0));
        let p = fields(&encode(&a, View::Native));
        let strings: Vec<Vec<u8>> = bytes_of(&p, field::STRING_TABLE);
        let rank_key = strings.iter().position(|s| s == b"rank").expect("rank key") as u64;
        for b in bytes_of(&p, field::SAMPLE) {
            let f = fields(&b);
            let rank: Vec<String> = bytes_of(&f, 3)
                .iter()
                .map(|l| fields(l))
                .filter(|l| uint(l, 1) == rank_key)
                .map(|l| String::from_utf8(strings[uint(&l, 2) as usize].clone()).unwrap())
                .collect();
            // Rank 0 too (a numeric label of 0 without a unit would be dropped).
            assert_eq!(rank, ["0"]);
        }
    }

    #[test]
    fn gzip_output_is_deterministic_and_decompresses_to_the_profile() {
        use std::io::Read;
        let a = tiny_analysis();
        let (mut x, mut y) = (Vec::new(), Vec::new());
        write(&a, View::Python, &mut x).unwrap();
        write(&a, View::Python, &mut y).unwrap();
        assert_eq!(x, y);
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&x[..])
            .read_to_end(&mut raw)
            .unwrap();
        assert_eq!(raw, encode(&a, View::Python));
    }
}
