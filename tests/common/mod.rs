//! Helpers shared by the integration tests: they run the real gpuprof
//! binary on real processes and check the files it leaves.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_gpuprof");

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn sample(name: &str) -> PathBuf {
    repo().join("samples").join(name)
}

pub fn gpuprof() -> Command {
    let mut c = Command::new(BIN);
    c.stdin(Stdio::null());
    c
}

/// Run `gpuprof -q -o DIR -- args...`; returns the output folder and the
/// process output.
pub fn record(tmp: &Path, name: &str, extra: &[&str], job: &[&str]) -> (PathBuf, Output) {
    let out = tmp.join(name);
    let mut c = gpuprof();
    c.arg("-q")
        .arg("-o")
        .arg(&out)
        .args(extra)
        .arg("--")
        .args(job);
    let o = c.output().expect("run gpuprof");
    check_outputs(&out);
    (out, o)
}

/// Read a JSON file; a `report.json` is checked on the way
/// ([`check_report_json`]).
pub fn read_json(p: &Path) -> Value {
    let s = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
    let v: Value =
        serde_json::from_str(&s).unwrap_or_else(|e| panic!("parse {}: {e}", p.display()));
    if p.file_name().is_some_and(|n| n == "report.json") {
        check_report_json(&v, p);
    }
    v
}

/// A compiled shipped schema (`docs/<file>`), compiled once per test binary.
fn schema_validator(file: &str) -> &'static jsonschema::Validator {
    static REPORT: OnceLock<jsonschema::Validator> = OnceLock::new();
    static MERGED: OnceLock<jsonschema::Validator> = OnceLock::new();
    let cell = if file == "report.schema.json" {
        &REPORT
    } else {
        &MERGED
    };
    cell.get_or_init(|| {
        let schema = repo().join("docs").join(file);
        let text = std::fs::read_to_string(&schema).expect("shipped schema");
        let schema: Value = serde_json::from_str(&text).expect("schema is JSON");
        jsonschema::validator_for(&schema).expect("schema compiles")
    })
}

/// A report.json (single-run or merged) is valid against its shipped
/// schema (`docs/report.schema.json`, `docs/merged-report.schema.json`)
/// and reads into gpuprof's report types and back unchanged.
pub fn check_report_json(v: &Value, p: &Path) {
    use gpuprof::export::report_schema::{self as schema, Report};
    use gpuprof::merge::report::MergedReport;
    let merged = v["kind"] == "merge";
    let file = if merged {
        "merged-report.schema.json"
    } else {
        "report.schema.json"
    };
    let errors: Vec<String> = schema_validator(file)
        .iter_errors(v)
        .take(10)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect();
    assert!(
        errors.is_empty(),
        "{} does not match docs/{file}:\n{}",
        p.display(),
        errors.join("\n")
    );
    let back = if merged {
        serde_json::to_value(schema::from_value::<MergedReport>(v.clone(), p).unwrap())
    } else {
        serde_json::to_value(schema::from_value::<Report>(v.clone(), p).unwrap())
    }
    .unwrap();
    assert!(
        &back == v,
        "{} changes when read into the report types and written back",
        p.display()
    );
}

/// The report.json of an output folder, read into gpuprof's types
/// (after the checks of [`read_json`]).
pub fn typed_report(dir: &Path) -> gpuprof::export::report_schema::Report {
    let p = dir.join("report.json");
    let v = read_json(&p);
    gpuprof::export::report_schema::from_value(v, &p).unwrap()
}

/// The report.json of an output folder; the folder's trace and flamegraphs
/// are checked on the way (`check_outputs`), so every test that reads a
/// report checks the trace beside it.
pub fn report(dir: &Path) -> Value {
    check_outputs(dir);
    read_json(&dir.join("report.json"))
}

pub fn job_process(report: &Value) -> &Value {
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["is_job"] == true)
        .expect("job process in report")
}

/// What [`check_trace_file`] found in a trace.
#[derive(Debug, Default)]
pub struct TraceFacts {
    /// Bytes of the JSON (uncompressed).
    pub bytes: u64,
    pub events: u64,
    pub slices: u64,
    pub counters: u64,
    /// Flows (one per `bind_id`) and how many of them were checked
    /// against the target their cause slice names.
    pub flows: u64,
    pub flows_checked: u64,
    pub metadata: Value,
    /// (pid, tid) → thread name.
    pub thread_names: HashMap<(i64, i64), String>,
    /// pid → process name.
    pub process_names: HashMap<i64, String>,
    /// Root (depth 0) slices per (pid, tid): (start, end) in 0.1 µs.
    pub roots: HashMap<(i64, i64), Vec<(i64, i64)>>,
    /// Names of the counter tracks, as Perfetto names them, per pid.
    pub counter_tracks: HashMap<i64, std::collections::BTreeSet<String>>,
}

/// GPU processes of the trace (src/export/trace_gpu.rs).
const GPU_PID_BASE: i64 = 0x7100_0000;

/// Check a trace (`trace.json` or `trace.json.gz`) against the rules of
/// Perfetto's JSON importer (google/perfetto,
/// src/trace_processor/importers/json/ and common/slice_tracker.cc,
/// flow_tracker.cc), reading it as a stream (bounded memory):
/// - the top level is an object with a `traceEvents` array and metadata
///   (clock anchor, trace budget);
/// - every event has a known phase (M, X, C, and i instants); metadata
///   names processes and threads,
///   and thread names do not repeat the tid (Perfetto shows it);
/// - `X` slices have finite, non-negative times, nest properly on their
///   track (or the importer moves them to an error track) and stay below
///   depth 512 (deeper ones are dropped); names have no control
///   characters (older versions reject the file);
/// - `C` counters carry one finite number, and the track name Perfetto
///   builds ("<name> <arg key>") does not end in "value";
/// - flows (`bind_id`): one `flow_out` and at least one `flow_in` per id,
///   on X slices of non-zero duration, the `flow_in` ends starting strictly
///   after the `flow_out` one (the importer pairs them in time order), and
///   a cause slice's flow lands on the very slice its `linked_slice` names
///   (pid, tid, start, name and depth);
/// - GPU processes sort before every other process;
/// - the file is within its budget and every reduced or dropped part is
///   listed among the reductions.
pub fn check_trace_file(path: &Path) -> TraceFacts {
    use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
    use std::io::Read;

    struct Events<'a>(&'a mut dyn FnMut(Value));
    impl<'de> DeserializeSeed<'de> for Events<'_> {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_seq(self)
        }
    }
    impl<'de> Visitor<'de> for Events<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array of trace events")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while let Some(v) = seq.next_element::<Value>()? {
                (self.0)(v);
            }
            Ok(())
        }
    }
    struct Top<'a>(&'a mut dyn FnMut(Value), Value, bool);
    impl<'de> Visitor<'de> for &mut Top<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a trace object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(k) = map.next_key::<String>()? {
                match k.as_str() {
                    "traceEvents" => {
                        map.next_value_seed(Events(&mut *self.0))?;
                        self.2 = true;
                    }
                    "metadata" => self.1 = map.next_value()?,
                    _ => {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
            }
            Ok(())
        }
    }

    struct Counted<R>(R, u64);
    impl<R: Read> Read for Counted<R> {
        fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.read(b)?;
            self.1 += n as u64;
            Ok(n)
        }
    }
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let gz = path.extension().is_some_and(|e| e == "gz");
    let reader: Box<dyn Read> = if gz {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    // Counted below the buffer: serde_json reads byte by byte.
    let mut counted = std::io::BufReader::with_capacity(1 << 20, Counted(reader, 0));

    // (pid, tid) → slices (start, end, index in `flagged` or usize::MAX).
    type Track = Vec<(i64, i64, usize)>;
    let mut tracks: HashMap<(i64, i64), Track> = HashMap::new();
    // Slices with a flow or a cause: (pid, tid, ts, dur, name, bind_id, out, linked).
    struct Flagged {
        pid: i64,
        tid: i64,
        ts: i64,
        dur: i64,
        name: String,
        bind: Option<(u64, bool)>,
        linked: Option<Value>,
        depth: usize,
    }
    let mut flagged: Vec<Flagged> = Vec::new();
    let mut facts = TraceFacts::default();
    let mut sort_index: HashMap<i64, i64> = HashMap::new();
    let mut problems: Vec<String> = Vec::new();
    let mut problem = |p: String| {
        if problems.len() < 20 {
            problems.push(p);
        }
    };
    let tenths = |v: &Value, what: &str, e: &Value| -> i64 {
        let x = v
            .as_f64()
            .unwrap_or_else(|| panic!("{what} is not a number in {e}"));
        assert!(x.is_finite() && x >= 0.0, "{what} {x} in {e}");
        (x * 10.0).round() as i64
    };
    let clean = |s: &str| !s.chars().any(|c| (c as u32) < 0x20 || c == '\u{7f}');
    // Processes with events other than metadata.
    let mut pids: std::collections::HashSet<i64> = Default::default();
    let mut on_event = |e: Value| {
        facts.events += 1;
        let ph = e["ph"]
            .as_str()
            .unwrap_or_else(|| panic!("event without ph: {e}"));
        let pid = e["pid"]
            .as_i64()
            .unwrap_or_else(|| panic!("event without an integer pid: {e}"));
        let tid = e["tid"].as_i64().unwrap_or(0);
        let name = e["name"].as_str().unwrap_or("");
        if !clean(name) {
            problem(format!("control character in a name: {e}"));
        }
        if ph != "M" {
            pids.insert(pid);
        }
        match ph {
            "M" => {
                let arg = &e["args"];
                match name {
                    "process_name" => {
                        let n = arg["name"].as_str().expect("process name").to_string();
                        assert!(clean(&n), "control character in {e}");
                        facts.process_names.insert(pid, n);
                    }
                    "thread_name" => {
                        let n = arg["name"].as_str().expect("thread name").to_string();
                        assert!(clean(&n), "control character in {e}");
                        if n.ends_with(&format!(" {tid}")) || n.ends_with(&format!("({tid})")) {
                            problem(format!(
                                "thread name repeats its tid (Perfetto shows it): {e}"
                            ));
                        }
                        facts.thread_names.insert((pid, tid), n);
                    }
                    "process_sort_index" => {
                        sort_index.insert(pid, arg["sort_index"].as_i64().expect("sort index"));
                    }
                    "thread_sort_index" => {}
                    _ => problem(format!("unknown metadata event {e}")),
                }
            }
            "X" => {
                facts.slices += 1;
                assert!(!name.is_empty(), "slice without a name: {e}");
                let ts = tenths(&e["ts"], "ts", &e);
                let dur = tenths(&e["dur"], "dur", &e);
                let bind = e.get("bind_id").map(|b| {
                    let id = b
                        .as_u64()
                        .unwrap_or_else(|| panic!("bind_id not an integer: {e}"));
                    let (i, o) = (e["flow_in"] == true, e["flow_out"] == true);
                    assert!(
                        i != o,
                        "a flow end must be exactly one of flow_in, flow_out: {e}"
                    );
                    assert!(dur > 0, "a flow bound to a zero-length slice: {e}");
                    (id, o)
                });
                let linked = e["args"].get("linked_slice").cloned();
                let idx = if bind.is_some() || linked.is_some() {
                    flagged.push(Flagged {
                        pid,
                        tid,
                        ts,
                        dur,
                        name: name.to_string(),
                        bind,
                        linked,
                        depth: 0,
                    });
                    flagged.len() - 1
                } else {
                    usize::MAX
                };
                tracks
                    .entry((pid, tid))
                    .or_default()
                    .push((ts, ts + dur, idx));
            }
            "C" => {
                facts.counters += 1;
                let args = e["args"]
                    .as_object()
                    .unwrap_or_else(|| panic!("counter without args: {e}"));
                assert_eq!(args.len(), 1, "one value per counter event: {e}");
                let (k, v) = args.iter().next().unwrap();
                let v = v
                    .as_f64()
                    .unwrap_or_else(|| panic!("counter value is not a number: {e}"));
                assert!(v.is_finite(), "counter value not finite: {e}");
                let track = format!("{name} {k}");
                if k == "value" || track.ends_with(" value") {
                    problem(format!("counter track named \"{track}\": {e}"));
                }
                tenths(&e["ts"], "ts", &e);
                facts.counter_tracks.entry(pid).or_default().insert(track);
            }
            "i" | "I" => {
                // An instant: a zero-length slice on its thread's track
                // (scope "t", the default), or on a process / global track.
                let ts = tenths(&e["ts"], "ts", &e);
                match e["s"].as_str().unwrap_or("t") {
                    "t" => tracks
                        .entry((pid, tid))
                        .or_default()
                        .push((ts, ts, usize::MAX)),
                    "p" | "g" => {}
                    s => problem(format!("unknown instant scope {s}: {e}")),
                }
            }
            other => problem(format!("unexpected phase {other}: {e}")),
        }
    };
    let mut top = Top(&mut on_event, Value::Null, false);
    {
        let mut de = serde_json::Deserializer::from_reader(&mut counted);
        serde::Deserializer::deserialize_map(&mut de, &mut top)
            .unwrap_or_else(|e| panic!("parse {}: {e}", path.display()));
        de.end()
            .unwrap_or_else(|e| panic!("trailing data in {}: {e}", path.display()));
    }
    let (meta, had_events) = (top.1, top.2);
    assert!(had_events, "no traceEvents array");
    facts.bytes = counted.get_ref().1;
    assert!(
        problems.is_empty(),
        "{}:\n{}",
        path.display(),
        problems.join("\n")
    );
    // Every process and every thread track is named (a job too short to
    // have its threads seen has no thread tracks at all).
    assert!(!facts.process_names.is_empty(), "no process_name metadata");
    for pid in &pids {
        assert!(
            facts.process_names.contains_key(pid),
            "events of process {pid}, which has no process_name"
        );
    }
    for track in tracks.keys() {
        assert!(
            facts.thread_names.contains_key(track),
            "slices on thread {track:?}, which has no thread_name"
        );
    }
    assert!(!sort_index.is_empty(), "no sort index metadata");
    assert!(
        meta["anchor_realtime_ns"].as_u64().is_some(),
        "no clock anchor in metadata"
    );

    // Nesting, per track, as the importer sees it: by start, longer first.
    for (k, v) in tracks.iter_mut() {
        v.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        let mut stack: Vec<i64> = Vec::new();
        for &(s, e, idx) in v.iter() {
            while stack.last().is_some_and(|&end| end <= s) {
                stack.pop();
            }
            if let Some(&end) = stack.last() {
                assert!(
                    e <= end,
                    "slice [{s}, {e}] (0.1 µs) overlaps its parent ending at {end} on {k:?}"
                );
            }
            assert!(stack.len() < 512, "slice deeper than 512 on {k:?}");
            if idx != usize::MAX {
                flagged[idx].depth = stack.len();
            }
            if stack.is_empty() {
                facts.roots.entry(*k).or_default().push((s, e));
            }
            stack.push(e);
        }
    }
    // Flows.
    let mut by_id: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, f) in flagged.iter().enumerate() {
        if let Some((id, _)) = f.bind {
            by_id.entry(id).or_default().push(i);
        }
    }
    for (id, ends) in &by_id {
        let outs: Vec<&Flagged> = ends
            .iter()
            .map(|i| &flagged[*i])
            .filter(|f| f.bind.unwrap().1)
            .collect();
        let ins: Vec<&Flagged> = ends
            .iter()
            .map(|i| &flagged[*i])
            .filter(|f| !f.bind.unwrap().1)
            .collect();
        assert_eq!(outs.len(), 1, "flow {id}: {} flow_out ends", outs.len());
        assert!(!ins.is_empty(), "flow {id} has no flow_in end");
        for i in &ins {
            assert!(
                i.ts > outs[0].ts,
                "flow {id}: the flow_in end starts at {} (0.1 µs), not after the flow_out end at {}",
                i.ts,
                outs[0].ts
            );
        }
        facts.flows += 1;
        // A cause slice names its target: the other end must be that slice.
        for (a, b) in [(outs[0], ins[0]), (ins[0], outs[0])] {
            if let Some(l) = &a.linked {
                assert_eq!(
                    l["pid"].as_i64(),
                    Some(b.pid),
                    "flow {id} lands on pid {}",
                    b.pid
                );
                assert_eq!(
                    l["tid"].as_i64(),
                    Some(b.tid),
                    "flow {id} lands on tid {}",
                    b.tid
                );
                assert_eq!(
                    l["name"].as_str(),
                    Some(b.name.as_str()),
                    "flow {id} lands on {}",
                    b.name
                );
                let lts = (l["ts"].as_f64().unwrap() * 10.0).round() as i64;
                assert_eq!(lts, b.ts, "flow {id}: target start");
                assert_eq!(
                    l["depth"].as_u64(),
                    Some(b.depth as u64),
                    "flow {id}: target depth"
                );
                assert!(b.dur > 0);
                facts.flows_checked += 1;
            }
        }
    }
    for f in &flagged {
        if f.linked.is_some() {
            assert!(
                f.bind.is_some(),
                "a cause slice names a target but has no flow: {}",
                f.name
            );
        }
    }
    // GPUs sort first.
    let gpu_max = sort_index
        .iter()
        .filter(|(p, _)| **p >= GPU_PID_BASE && **p < GPU_PID_BASE + 4096)
        .map(|x| *x.1)
        .max();
    let other_min = sort_index
        .iter()
        .filter(|(p, _)| !(**p >= GPU_PID_BASE && **p < GPU_PID_BASE + 4096))
        .map(|x| *x.1)
        .min();
    if let (Some(g), Some(o)) = (gpu_max, other_min) {
        assert!(
            g < o,
            "GPU processes must sort before the others ({g} >= {o})"
        );
    }
    // Budget and reductions.
    let b = &meta["trace_budget"];
    // Only a merge asked for every event (--full-trace) has no budget.
    let full_merge = meta["merged_by"].is_string() && b["budget_bytes"].is_null();
    let budget = b["budget_bytes"]
        .as_u64()
        .or(full_merge.then_some(u64::MAX))
        .expect("trace_budget.budget_bytes in metadata");
    assert!(
        facts.bytes <= budget,
        "trace of {} bytes over its budget of {budget}",
        facts.bytes
    );
    assert_eq!(b["within_budget"], true);
    let reductions: Vec<&str> = b["reductions"]
        .as_array()
        .expect("trace_budget.reductions")
        .iter()
        .map(|r| r.as_str().expect("reduction text"))
        .collect();
    for p in b["parts"].as_array().expect("trace_budget.parts") {
        let name = p["part"].as_str().unwrap();
        if p["level"].as_u64().unwrap_or(0) > 0 || p["dropped"] == true {
            assert!(
                p["dropped"] == true || p["reduction"].is_string(),
                "part {name} reduced without saying how: {p}"
            );
            assert!(
                reductions.iter().any(|r| r.starts_with(name)),
                "reduction of {name} missing from the metadata's reductions"
            );
        }
    }
    assert_eq!(
        b["flows"].as_u64(),
        Some(facts.flows),
        "flows in the metadata and in the trace"
    );
    facts.metadata = meta;
    facts
}

/// The track a counter event goes to, as Perfetto names it:
/// "<event name> <arg key>"; `None` for other events.
pub fn counter_track(e: &Value) -> Option<String> {
    if e["ph"] != "C" {
        return None;
    }
    let (k, _) = e["args"].as_object()?.iter().next()?;
    Some(format!("{} {k}", e["name"].as_str()?))
}

/// Check a Chrome trace (see [`check_trace_file`]) and return it parsed.
pub fn check_trace(path: &Path) -> Value {
    check_trace_file(path);
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let bytes = if path.extension().is_some_and(|e| e == "gz") {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut out)
            .expect("gunzip trace");
        out
    } else {
        bytes
    };
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// Check every output a run left in `dir` that has rules of its own: the
/// trace (`trace.json` or `trace.json.gz`) and the flamegraphs' size
/// (at most 1 MB each, the default bound). Returns the trace's facts.
pub fn check_outputs(dir: &Path) -> Option<TraceFacts> {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.ends_with(".svg") {
            let len = e.metadata().map(|m| m.len()).unwrap_or(0);
            assert!(len <= 1_000_000, "{name} is {len} bytes, over 1 MB");
        }
    }
    ["trace.json", "trace.json.gz"]
        .iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_file())
        .map(|p| check_trace_file(&p))
}

/// Build both fake NVML drivers (`tests/fake-nvml`, `tests/fake-nvml-old`)
/// once per test binary, into a target folder of their own beside this
/// test's (a nested `cargo build` on the same target folder would wait for
/// the lock `cargo test` holds). Returns the folder holding
/// `libfake_nvml.so` and `libfake_nvml_old.so`.
pub fn fake_nvml_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        // <target>/<profile>/deps/<test>-<hash>
        let target = exe
            .ancestors()
            .nth(3)
            .expect("test executable inside a cargo target folder")
            .join("fake-nvml");
        let cargo = option_env!("CARGO").unwrap_or("cargo");
        let status = Command::new(cargo)
            .args(["build", "--quiet", "-p", "fake-nvml", "-p", "fake-nvml-old"])
            .arg("--target-dir")
            .arg(&target)
            .current_dir(repo())
            .status()
            .expect("run cargo to build the fake NVML");
        assert!(status.success(), "building tests/fake-nvml failed");
        target.join("debug")
    })
}

/// Say that the running test skipped its checks, and why. The line goes to
/// stderr and, when `.ci/run` sets `GPUPROF_TEST_SKIPS`, into that file, so
/// the run counts the test as skipped rather than passed. Use [`skip!`].
pub fn note_skip(why: &str) {
    let name = std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .unwrap_or("(unnamed test)")
        .to_string();
    eprintln!("SKIPPED: {name}: {why}");
    if let Some(path) = std::env::var_os("GPUPROF_TEST_SKIPS") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{name}\t{}", why.replace(['\n', '\t'], " "));
        }
    }
}

/// Skip the rest of the test with a reason (counted as skipped by `.ci/run`).
#[allow(unused_macros)]
macro_rules! skip {
    ($($arg:tt)*) => {{
        $crate::common::note_skip(&format!($($arg)*));
        return;
    }};
}

/// The interpreter of Python 3.`minor` when one is installed: pyenv's
/// (`$PYENV_ROOT` or `~/.pyenv`), else the system's `/usr/bin/python3.N`.
pub fn python_minor(minor: u32) -> Option<PathBuf> {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")));
    if let Some(root) = root {
        let prefix = format!("3.{minor}.");
        let mut found: Vec<PathBuf> = std::fs::read_dir(root.join("versions"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                e.file_name().to_str().is_some_and(|n| {
                    n.starts_with(&prefix) && n[prefix.len()..].chars().all(|c| c.is_ascii_digit())
                })
            })
            .map(|e| e.path().join("bin").join(format!("python3.{minor}")))
            .filter(|p| p.is_file())
            .collect();
        found.sort();
        if let Some(p) = found.pop() {
            return Some(p);
        }
    }
    let sys = PathBuf::from(format!("/usr/bin/python3.{minor}"));
    sys.is_file().then_some(sys)
}

/// The Python of the virtual environment that `.ci/run` fills with PyTorch
/// (CPU is enough), from `GPUPROF_TEST_TORCH_PYTHON` or the default place
/// `~/.cache/gpuprof-ci/torch-venv`; `None` when there is none.
pub fn torch_python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GPUPROF_TEST_TORCH_PYTHON") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let p =
        PathBuf::from(std::env::var_os("HOME")?).join(".cache/gpuprof-ci/torch-venv/bin/python");
    let ok = p.is_file()
        && Command::new(&p)
            .args(["-c", "import torch"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    ok.then_some(p)
}

/// The folder holding `nvtx3/nvToolsExt.h` (NVTX v3 is header-only): from
/// `GPUPROF_TEST_NVTX_INCLUDE`, else the `nvidia-nvtx` Python package in
/// the PyTorch test environment (`.ci/run` installs it there).
pub fn nvtx_include_dir() -> Option<PathBuf> {
    let has = |d: &Path| d.join("nvtx3/nvToolsExt.h").is_file();
    if let Some(d) = std::env::var_os("GPUPROF_TEST_NVTX_INCLUDE") {
        let d = PathBuf::from(d);
        return has(&d).then_some(d);
    }
    let py = torch_python()?;
    // <venv>/bin/python → <venv>/lib/python3.*/site-packages/nvidia/*/include
    let venv = py.parent()?.parent()?.to_path_buf();
    let mut found = Vec::new();
    for lib in std::fs::read_dir(venv.join("lib")).ok()?.flatten() {
        let nv = lib.path().join("site-packages/nvidia");
        for sub in std::fs::read_dir(&nv).into_iter().flatten().flatten() {
            let inc = sub.path().join("include");
            if has(&inc) {
                found.push(inc);
            }
        }
    }
    found.sort();
    found.pop()
}

/// Build a C test program against the NVTX headers; `None` (after saying
/// why) when there is no compiler or no headers.
pub fn build_nvtx_program(src: &Path, out: &Path) -> Result<PathBuf, String> {
    let inc = nvtx_include_dir().ok_or(
        "no NVTX v3 headers (pip install nvidia-nvtx into the test venv, or set GPUPROF_TEST_NVTX_INCLUDE)",
    )?;
    let st = Command::new("gcc")
        .args(["-O2", "-Wall", "-o"])
        .arg(out)
        .arg(src)
        .arg("-I")
        .arg(&inc)
        .args(["-ldl", "-lpthread"])
        .status()
        .map_err(|e| format!("cannot run gcc: {e}"))?;
    if !st.success() {
        return Err(format!("gcc could not build {}", src.display()));
    }
    Ok(out.to_path_buf())
}

/// Build `tests/scripts/sigtrap_race.c` (the job's own SIGTRAP
/// disposition rewritten while its threads raise SIGTRAPs) into a shared
/// library in `dir`, for `tests/scripts/sigtrap_race.py`.
pub fn build_sigtrap_race(dir: &Path) -> Result<PathBuf, String> {
    let so = dir.join("sigtrap_race.so");
    let st = Command::new("gcc")
        .args(["-O2", "-Wall", "-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(repo().join("tests/scripts/sigtrap_race.c"))
        .arg("-lpthread")
        .status()
        .map_err(|e| format!("cannot run gcc: {e}"))?;
    if !st.success() {
        return Err("gcc could not build sigtrap_race.c".into());
    }
    Ok(so)
}

/// The simulated GPU steps (start, end) in CLOCK_MONOTONIC ns that a job
/// wrote to its activity log (format in docs/testing.md): what the fake
/// driver's utilization follows, so the truth gpuprof is checked against.
pub fn activity_steps(log: &Path) -> Vec<(u64, u64)> {
    let text =
        std::fs::read_to_string(log).unwrap_or_else(|e| panic!("read {}: {e}", log.display()));
    let mut steps = Vec::new();
    let mut open = None;
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            ["B", _, t] => open = Some(t.parse::<u64>().unwrap()),
            ["E", _, t] => {
                if let Some(s) = open.take() {
                    steps.push((s, t.parse::<u64>().unwrap()));
                }
            }
            [_, s, e] if !l.starts_with('#') => {
                steps.push((s.parse().unwrap(), e.parse().unwrap()));
            }
            _ => {}
        }
    }
    steps.sort_unstable();
    steps
}

/// Seconds within [lo, hi) during which no logged step ran.
pub fn log_idle_s(steps: &[(u64, u64)], lo: u64, hi: u64) -> f64 {
    let mut busy = 0u64;
    let mut covered_to = lo;
    for &(s, e) in steps {
        let (s, e) = (s.max(covered_to), e.min(hi));
        if e > s {
            busy += e - s;
            covered_to = e;
        }
    }
    hi.saturating_sub(lo).saturating_sub(busy) as f64 / 1e9
}

/// What a job's activity log says about GPU `g` of a report: idle seconds
/// over the sampled span, and over its steady state (from the first step
/// to the end of the last, within the sampled span).
pub struct LogTruth {
    pub sampled_idle_s: f64,
    pub steady_idle_s: f64,
}

pub fn log_truth(g: &Value, log: &Path) -> LogTruth {
    let lo = g["utilization"]["sampled_from_monotonic_ns"]
        .as_u64()
        .expect("sampled span in report");
    let hi = g["utilization"]["sampled_to_monotonic_ns"]
        .as_u64()
        .expect("sampled span in report");
    let steps = activity_steps(log);
    let first = steps.first().map_or(lo, |s| s.0).max(lo);
    let last = steps.last().map_or(hi, |s| s.1).min(hi);
    LogTruth {
        sampled_idle_s: log_idle_s(&steps, lo, hi),
        steady_idle_s: log_idle_s(&steps, first, last.max(first)),
    }
}

/// A fresh, empty scratch folder for one test:
/// `$TMPDIR/gpuprof-<test binary>-<pid>-<name>`.
#[allow(dead_code)]
pub fn scratch(name: &str) -> PathBuf {
    let bin = std::env::current_exe()
        .ok()
        .and_then(|e| e.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| s.split('-').next().unwrap_or("test").to_string())
        .unwrap_or_else(|| "test".into());
    let d = std::env::temp_dir().join(format!("gpuprof-{bin}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A TCP port free right now on loopback (a rendezvous, a /metrics server).
#[allow(dead_code)]
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A message when this machine refuses perf events to us, `None` otherwise.
pub fn perf_refused() -> Option<String> {
    // A software cpu-clock counter on ourselves, user space only: what
    // gpuprof needs at perf_event_paranoid <= 2. perf_event_attr: type (u32),
    // size (u32), config (u64), ..., flags (u64) at byte 40.
    let mut a = [0u8; 128];
    a[0..4].copy_from_slice(&1u32.to_ne_bytes()); // PERF_TYPE_SOFTWARE
    a[4..8].copy_from_slice(&128u32.to_ne_bytes());
    let flags: u64 = 1 | (1 << 5) | (1 << 6); // disabled, exclude_kernel, exclude_hv
    a[40..48].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: a is a valid perf_event_attr of the size it declares.
    let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, a.as_ptr(), 0, -1, -1, 0) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Some(format!("perf_event_open is refused here ({e})"));
    }
    // SAFETY: fd was just opened by us.
    unsafe { libc::close(fd as i32) };
    None
}

/// Skip the test where perf events are refused.
#[allow(unused_macros)]
macro_rules! need_perf {
    () => {
        if let Some(why) = $crate::common::perf_refused() {
            skip!("{why}");
        }
    };
}

/// What a [`SlowDisk`] is made of.
#[derive(Clone, Debug, Default)]
pub struct DiskOptions {
    /// A data file `data` of this many MiB of random bytes (0: none).
    pub data_mb: u64,
    /// cgroup-v1 blkio limits for the processes put in its cgroup.
    pub read_bps: Option<u64>,
    pub write_bps: Option<u64>,
    /// Mark the loop device rotational, as a spinning disk reports itself.
    pub rotational: bool,
}

/// A slow disk made of a file-backed loop device holding an ext4, with
/// cgroup-v1 blkio limits for the processes moved into [`Self::cgroup`]
/// (`echo $$ > cgroup.procs` in the job's shell) and the data file dropped
/// from the page cache. Needs root and the v1 blkio controller (measured on
/// these machines, DESIGN.md §6). Everything is removed again by `Drop`.
pub struct SlowDisk {
    pub image: PathBuf,
    pub mnt: PathBuf,
    pub loopdev: Option<String>,
    mounted: bool,
    pub cgroup: Option<PathBuf>,
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.mnt).status();
        }
        if let Some(l) = &self.loopdev {
            let _ = Command::new("losetup").args(["-d", l]).status();
        }
        if let Some(cg) = &self.cgroup {
            let _ = std::fs::remove_dir(cg);
        }
        let _ = std::fs::remove_file(&self.image);
    }
}

/// Run a command; its stdout, or why it failed.
pub fn sh(cmd: &str, args: &[&str]) -> Result<String, String> {
    let o = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

pub fn is_root() -> bool {
    // SAFETY: no arguments, no side effects.
    unsafe { libc::geteuid() == 0 }
}

/// Drop one file's pages from the page cache (after writing them back).
pub fn drop_from_page_cache(p: &Path) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
    f.sync_all().map_err(|e| e.to_string())?;
    // SAFETY: a valid open descriptor; advice only.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        return Err(format!("posix_fadvise: error {r}"));
    }
    Ok(())
}

impl SlowDisk {
    pub fn new(dir: &Path, o: DiskOptions) -> Result<SlowDisk, String> {
        if !is_root() {
            return Err("needs root (loop device, mount, cgroup)".into());
        }
        let blkio = Path::new("/sys/fs/cgroup/blkio");
        if (o.read_bps.is_some() || o.write_bps.is_some())
            && !blkio.join("blkio.throttle.read_bps_device").exists()
        {
            return Err("no cgroup-v1 blkio controller at /sys/fs/cgroup/blkio".into());
        }
        let mut d = SlowDisk {
            image: dir.join("disk.img"),
            mnt: dir.join("mnt"),
            loopdev: None,
            mounted: false,
            cgroup: None,
        };
        std::fs::create_dir_all(&d.mnt).map_err(|e| e.to_string())?;
        let size = (o.data_mb + 64).max(64);
        sh(
            "truncate",
            &["-s", &format!("{size}M"), d.image.to_str().unwrap()],
        )?;
        let l = sh("losetup", &["-f", "--show", d.image.to_str().unwrap()])?;
        d.loopdev = Some(l.clone());
        sh("mkfs.ext4", &["-q", &l])?;
        sh("mount", &[&l, d.mnt.to_str().unwrap()])?;
        d.mounted = true;
        let name = Path::new(&l)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if o.rotational {
            std::fs::write(format!("/sys/block/{name}/queue/rotational"), "1")
                .map_err(|e| format!("mark {name} rotational: {e}"))?;
        }
        if o.data_mb > 0 {
            let data = d.mnt.join("data");
            sh(
                "dd",
                &[
                    "if=/dev/urandom",
                    &format!("of={}", data.display()),
                    "bs=1M",
                    &format!("count={}", o.data_mb),
                    "status=none",
                ],
            )?;
            drop_from_page_cache(&data)?;
        }
        if o.read_bps.is_some() || o.write_bps.is_some() {
            let majmin = std::fs::read_to_string(format!("/sys/block/{name}/dev"))
                .map_err(|e| e.to_string())?;
            let cg = blkio.join(format!("gpuprof-test-{}-{name}", std::process::id()));
            std::fs::create_dir(&cg).map_err(|e| format!("{}: {e}", cg.display()))?;
            d.cgroup = Some(cg.clone());
            for (file, v) in [
                ("blkio.throttle.read_bps_device", o.read_bps),
                ("blkio.throttle.write_bps_device", o.write_bps),
            ] {
                if let Some(v) = v {
                    std::fs::write(cg.join(file), format!("{} {v}", majmin.trim()))
                        .map_err(|e| format!("blkio throttle: {e}"))?;
                }
            }
        }
        Ok(d)
    }
}

/// A swap file switched on for one test (at the lowest priority, so that
/// only memory that must go somewhere goes there) and off again by `Drop`.
/// Err says why not: no root, a machine that already swaps (the test would
/// not be alone with it), or a filesystem or container that refuses swapon.
pub struct SwapFile {
    path: PathBuf,
}

impl SwapFile {
    pub fn on(path: &Path, mb: u64) -> Result<SwapFile, String> {
        if !is_root() {
            return Err("needs root (swapon)".into());
        }
        let swaps = std::fs::read_to_string("/proc/swaps").map_err(|e| e.to_string())?;
        if swaps.lines().count() > 1 {
            return Err("this machine already has swap".into());
        }
        let p = path.to_str().ok_or("swap path not UTF-8")?;
        sh("fallocate", &["-l", &format!("{mb}M"), p])?;
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|e| e.to_string())?;
        sh("mkswap", &[p])?;
        let s = SwapFile {
            path: path.to_path_buf(),
        };
        sh("swapon", &["-p", "-5", p])?;
        Ok(s)
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        let _ = Command::new("swapoff").arg(&self.path).status();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A cgroup-v1 cgroup of one controller, removed by `Drop` (after the job's
/// processes have left it by exiting).
pub struct TestCgroup {
    pub dir: PathBuf,
}

impl TestCgroup {
    /// `/sys/fs/cgroup/<controller>/gpuprof-test-<pid>-<name>` with the
    /// given files written; Err says why not (no root, no v1 controller).
    pub fn v1(
        controller: &str,
        name: &str,
        files: &[(&str, String)],
    ) -> Result<TestCgroup, String> {
        if !is_root() {
            return Err("needs root (cgroup)".into());
        }
        let root = Path::new("/sys/fs/cgroup").join(controller);
        if !root.join("cgroup.procs").exists() || !root.join("tasks").exists() {
            return Err(format!(
                "no cgroup-v1 {controller} controller at {}",
                root.display()
            ));
        }
        let dir = root.join(format!("gpuprof-test-{}-{name}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let cg = TestCgroup { dir };
        for (f, v) in files {
            std::fs::write(cg.dir.join(f), v).map_err(|e| format!("{f}: {e}"))?;
        }
        Ok(cg)
    }

    /// `sh -c 'echo $$ > …/cgroup.procs && exec "$@"' sh ARGS…`: run ARGS
    /// inside the cgroup.
    pub fn wrap(&self, args: &[&str]) -> Vec<String> {
        let mut v = vec![
            "sh".to_string(),
            "-c".to_string(),
            format!(
                "echo $$ > {}/cgroup.procs && exec \"$@\"",
                self.dir.display()
            ),
            "sh".to_string(),
        ];
        v.extend(args.iter().map(|s| s.to_string()));
        v
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // The job's processes have exited; the kernel may take a moment to
        // let go of the cgroup.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// Findings whose GPU time is idle time they explain (the rest are busy-time
/// slowdowns, setup problems, or repeat another finding's time).
const EXPLAINS_IDLE_NOT: &[&str] = &[
    "thermal-throttling",
    "power-capped",
    "gpu-not-used",
    "cuda-driver-mismatch",
    "straggler-rank",
    "slow-storage",
    "gpu-idle-unexplained",
];

/// Issue 9's accounting: on a GPU idle at least 30% of its sampled time,
/// the findings explain at least 80% of the steady-state idle time, or
/// `gpu-idle-unexplained` says how much they do not. Single-GPU,
/// single-rank reports. Returns (steady idle, explained, unexplained).
pub fn assert_idle_accounted(r: &Value) -> (f64, f64, f64) {
    let g = &r["gpus"][0];
    let steady = g["idle"]["steady_s"].as_f64().expect("idle.steady_s");
    let share = g["idle"]["share_of_sampled_time"].as_f64().unwrap();
    let fs = r["findings"].as_array().unwrap();
    let terms: Vec<f64> = fs
        .iter()
        .filter(|f| f["gpu_time_basis"] == "measured")
        .filter(|f| !EXPLAINS_IDLE_NOT.contains(&f["id"].as_str().unwrap()))
        .filter_map(|f| f["gpu_time_s"].as_f64())
        .collect();
    let explained: f64 = terms.iter().sum();
    // report.json rounds each figure to the millisecond: the product
    // decides on the unrounded ones, so at the 80% bar the rounded sum may
    // fall either side (fresh33: 5.042 s of 6.303 s read 79.99%, where the
    // product's own 5.042266 s of 6.302529 s is 80.004%). A finding is
    // owed only when the figures are below the bar however they rounded.
    let rounding = 0.0005 * (terms.len() as f64 + 0.8);
    let unexplained = fs
        .iter()
        .find(|f| f["id"] == "gpu-idle-unexplained")
        .and_then(|f| f["gpu_time_s"].as_f64());
    let ids: Vec<&str> = fs.iter().filter_map(|f| f["id"].as_str()).collect();
    eprintln!(
        "idle accounting: GPU idle {:.0}% of its sampled time, steady-state idle {steady:.2} s, findings explain {explained:.2} s ({:.0}%), gpu-idle-unexplained {}; findings {ids:?}",
        share * 100.0,
        100.0 * explained / steady.max(1e-9),
        unexplained.map_or("none".to_string(), |u| format!("{u:.2} s"))
    );
    if share >= 0.3 && explained + rounding < 0.8 * steady {
        let u = unexplained.unwrap_or_else(|| {
            panic!(
                "GPU idle {:.0}%: findings explain {explained:.2} s of {steady:.2} s and no gpu-idle-unexplained says how much is left: {}",
                share * 100.0,
                r["findings"]
            )
        });
        assert!(
            (explained + u - steady).abs() <= (0.05 * steady).max(0.05),
            "explained {explained:.2} s + unexplained {u:.2} s should be the steady idle {steady:.2} s: {}",
            r["findings"]
        );
    }
    (steady, explained, unexplained.unwrap_or(0.0))
}

/// The folder holding `pprof-format` and `speedscope`, with a working
/// `node`; Err says what is missing.
pub fn node_modules() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("GPUPROF_TEST_NODE_MODULES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").ok_or("HOME is not set")?)
            .join(".cache/gpuprof-ci/npm/node_modules"),
    };
    match Command::new("node").arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => return Err("node is not installed".into()),
    }
    for p in ["pprof-format", "speedscope"] {
        if !dir.join(p).join("package.json").is_file() {
            return Err(format!(
                "the npm package {p} is not in {} (set GPUPROF_TEST_NODE_MODULES, or run `npm install --prefix ~/.cache/gpuprof-ci/npm pprof-format speedscope`)",
                dir.display()
            ));
        }
    }
    Ok(dir)
}

/// Run a reader script of tests/scripts with node.
pub fn node_reader(script: &str, modules: &Path, file: &Path) -> Value {
    let o = Command::new("node")
        .arg(repo().join("tests/scripts").join(script))
        .arg(modules)
        .arg(file)
        .output()
        .expect("run node");
    assert!(
        o.status.success(),
        "{script} could not read {}: {}",
        file.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("the reader prints JSON")
}

/// A temporary folder for one test's recordings, removed when the test
/// passes and kept when it fails (its path printed), so that a failure seen
/// once on a busy machine can be read afterwards with `gpuprof report`.
pub struct TestDir(Option<tempfile::TempDir>);

#[allow(dead_code)]
pub fn test_dir() -> TestDir {
    TestDir(Some(tempfile::tempdir().expect("a temporary folder")))
}

#[allow(dead_code)]
impl TestDir {
    pub fn path(&self) -> &Path {
        self.0.as_ref().expect("alive until dropped").path()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(d) = self.0.take() {
                eprintln!(
                    "the test failed: its recordings are kept in {}",
                    d.keep().display()
                );
            }
        }
    }
}

/// Does this kernel send a perf event's SIGTRAP from the return path to
/// user mode (Linux 6.11 and later), so that the in-process agent may
/// sample the time in the kernel without interrupting system calls?
#[allow(dead_code)]
pub fn kernel_traps_on_return() -> bool {
    let r = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = r
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    major > 6 || (major == 6 && minor >= 11)
}

/// How `tests/scripts/kernel_time.py`'s main thread came out in a
/// recording: its samples in each phase against its CPU time there.
#[allow(dead_code)]
#[derive(Debug)]
pub struct KernelTime {
    /// The agent's perf event sampled the kernel (None: timers).
    pub kernel_sampled: Option<bool>,
    /// Samples under `soak` (the phase in the kernel) and `burn` (user
    /// mode), and the periods each phase lasted (CPU time × frequency).
    pub soak: u64,
    pub soak_periods: f64,
    pub burn: u64,
    pub burn_periods: f64,
    pub merged: u64,
    pub unsampled: u64,
}

/// Check a recording of `kernel_time.py` (`job_stdout`: its JSON line) at
/// `hz`: in user mode one sample per period; in the kernel one per period
/// where the kernel's periods are sampled (the timers, or the agent's perf
/// event with `kernel_sampled`), else none of them sampled but all counted
/// and the diagnosis and the flame graph saying how much is missing.
#[allow(dead_code)]
pub fn check_kernel_time(dir: &Path, job_stdout: &str, hz: f64) -> KernelTime {
    let line = job_stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line from the job: {job_stdout:?}"));
    let truth: Value = serde_json::from_str(line).expect("the job's JSON");
    let r = report(dir);
    let procs = r["stacks"]["python"]["processes"]
        .as_array()
        .expect("processes");
    let p = procs
        .iter()
        .find(|p| p["agent"].is_object())
        .unwrap_or_else(|| panic!("no process sampled by the agent: {procs:?}"));
    let agent = &p["agent"];
    let folded = std::fs::read_to_string(dir.join("stacks-main.folded")).expect("main folded");
    let (mut soak, mut burn) = (0, 0);
    for l in folded.lines() {
        let (stack, n) = l.rsplit_once(' ').expect("count");
        let n: u64 = n.parse().expect("count");
        if stack.contains("soak (kernel_time.py") {
            soak += n;
        } else if stack.contains("burn (kernel_time.py") {
            burn += n;
        }
    }
    let k = KernelTime {
        kernel_sampled: agent["kernel_sampled"].as_bool(),
        soak,
        soak_periods: truth["kernel_phase_s"].as_f64().unwrap() * hz,
        burn,
        burn_periods: truth["user_phase_s"].as_f64().unwrap() * hz,
        merged: agent["merged_periods"].as_u64().unwrap_or(0),
        unsampled: agent["unsampled_periods"].as_u64().unwrap_or(0),
    };
    let near = |n: u64, want: f64| (n as f64) >= 0.8 * want && (n as f64) <= 1.2 * want;
    assert!(
        truth["kernel_phase_system_s"].as_f64().unwrap()
            >= 0.7 * truth["kernel_phase_s"].as_f64().unwrap(),
        "the kernel phase ran mostly in user mode: {truth}"
    );
    assert!(near(k.burn, k.burn_periods), "user-mode samples: {k:?}");
    let summary = std::fs::read_to_string(dir.join("summary.md")).expect("summary.md");
    let said = summary
        .contains("in the kernel (system calls, page faults) where the sampler was not allowed");
    if k.kernel_sampled == Some(false) {
        assert!(
            (k.soak as f64) < 0.2 * k.soak_periods,
            "the kernel's periods were sampled after all: {k:?}"
        );
        assert!(
            (k.unsampled as f64) >= 0.8 * k.soak_periods,
            "the kernel's periods were not counted: {k:?}"
        );
        assert!(
            said,
            "the summary does not say what the stacks miss:\n{summary}"
        );
        let svg = std::fs::read_to_string(dir.join("flame-main.svg")).expect("flame-main.svg");
        assert!(
            svg.contains("in the kernel not sampled"),
            "the main flame graph's subtitle does not say what it misses"
        );
    } else {
        assert!(near(k.soak, k.soak_periods), "samples in the kernel: {k:?}");
        assert!(
            !said,
            "the summary says the kernel was not sampled:\n{summary}"
        );
        if k.kernel_sampled == Some(true) {
            // 10-30 ms in each system call: several periods end in one,
            // and their signal comes once, at its end.
            assert!(k.merged > 0, "no periods came merged: {k:?}");
        }
    }
    k
}
