//! Profiles for other tools, read by those tools' own code: the real gpuprof
//! binary records a real Python job (tests/scripts/stacks_job.py: a main
//! process, two forked workers in pure Python and in zlib), and
//!
//! - `profile.pb.gz` is decoded by the `pprof-format` npm package (a pprof
//!   reader that shares no code with gpuprof), run with `node`;
//! - `profile.speedscope.json` is loaded by speedscope's own importer, from
//!   the `speedscope` npm package;
//!
//! and what they read must equal the folded files of the same run: sample
//! totals, per role and per process, and every function's self and total
//! samples (so the top functions and their shares).
//!
//! The packages live outside the checkout: `GPUPROF_TEST_NODE_MODULES`
//! (a `node_modules` folder), by default
//! `~/.cache/gpuprof-ci/npm/node_modules`, where `.ci/run` installs them
//! (`npm install --prefix ~/.cache/gpuprof-ci/npm pprof-format speedscope`).
//! Without node or the packages, or where perf is refused, the tests record
//! a skip.

#[macro_use]
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

/// label → (self, total) samples.
type Functions = BTreeMap<String, (u64, u64)>;

fn python() -> String {
    let o = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 is needed");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// One recording shared by the tests of this file (they only read it).
fn recording() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp =
            std::env::temp_dir().join(format!("gpuprof-test-profiles-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).expect("temp folder");
        let script = common::repo().join("tests/scripts/stacks_job.py");
        let (out, o) = common::record(
            &tmp,
            "run",
            &[],
            &[&python(), script.to_str().unwrap(), "3", "2", "0"],
        );
        assert!(
            o.status.success(),
            "gpuprof failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        out
    })
}

/// (stack without its root frame, root, count) of a folded file.
fn folded(path: &Path) -> Vec<(Vec<String>, String, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| {
            let (s, n) = l.rsplit_once(' ').expect("count");
            let mut frames: Vec<String> = s.split(';').map(str::to_string).collect();
            let root = frames.remove(0);
            (frames, root, n.parse().expect("count is a number"))
        })
        .collect()
}

fn functions_of(lines: &[(Vec<String>, String, u64)]) -> Functions {
    let mut f = Functions::new();
    for (stack, _, n) in lines {
        if let Some(leaf) = stack.last() {
            f.entry(leaf.clone()).or_default().0 += n;
        }
        let mut seen: Vec<&String> = Vec::new();
        for label in stack {
            if !seen.contains(&label) {
                seen.push(label);
                f.entry(label.clone()).or_default().1 += n;
            }
        }
    }
    f
}

fn total(lines: &[(Vec<String>, String, u64)]) -> u64 {
    lines.iter().map(|l| l.2).sum()
}

/// The `n` functions with the most self samples (then total, then name),
/// with their shares of `all` samples.
fn top(f: &Functions, all: u64, n: usize) -> Vec<(String, f64, f64)> {
    let mut v: Vec<(&String, &(u64, u64))> = f.iter().collect();
    v.sort_by(|a, b| {
        b.1 .0
            .cmp(&a.1 .0)
            .then(b.1 .1.cmp(&a.1 .1))
            .then(a.0.cmp(b.0))
    });
    v.into_iter()
        .take(n)
        .map(|(l, (s, t))| (l.clone(), *s as f64 / all as f64, *t as f64 / all as f64))
        .collect()
}

/// Assert two maps are equal, showing only the entries that differ.
fn assert_same<K: Ord + std::fmt::Debug, V: PartialEq + std::fmt::Debug>(
    got: &BTreeMap<K, V>,
    want: &BTreeMap<K, V>,
    what: &str,
) {
    let diff: Vec<String> = got
        .keys()
        .chain(want.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|k| got.get(k) != want.get(k))
        .map(|k| format!("{k:?}: got {:?}, want {:?}", got.get(k), want.get(k)))
        .collect();
    assert!(
        diff.is_empty(),
        "{what}: {} differ:\n{}",
        diff.len(),
        diff.join("\n")
    );
}

fn functions_json(v: &Value) -> Functions {
    v.as_object()
        .expect("functions")
        .iter()
        .map(|(k, e)| {
            (
                k.clone(),
                (e[0].as_u64().expect("self"), e[1].as_u64().expect("total")),
            )
        })
        .collect()
}

#[test]
fn pprof_profile_decoded_by_pprof_format_matches_the_folded_files() {
    need_perf!();
    let modules = match common::node_modules() {
        Ok(m) => m,
        Err(why) => skip!("{why}"),
    };
    let out = recording();
    let p = common::node_reader("read_pprof.js", &modules, &out.join("profile.pb.gz"));
    let report = common::read_json(&out.join("report.json"));

    // Sample types and period as Go's CPU profiles have them.
    assert_eq!(
        p["sample_types"],
        serde_json::json!([["samples", "count"], ["cpu", "nanoseconds"]])
    );
    assert_eq!(p["period_type"], serde_json::json!(["cpu", "nanoseconds"]));
    assert_eq!(p["default_sample_type"], "cpu");
    let hz = report["stacks"]["frequency_hz"]
        .as_f64()
        .expect("frequency");
    let period = p["period"].as_u64().expect("period");
    assert!(
        (period as f64 - 1e9 / hz).abs() <= 1e9 / hz * 0.01,
        "period {period} ns at {hz} Hz"
    );
    assert!(p["time_nanos"].as_u64().unwrap() > 1_600_000_000_000_000_000);
    assert!(p["duration_nanos"].as_u64().unwrap() > 1_000_000_000);

    // Totals: all, per role, per process.
    let all = folded(&out.join("stacks-all.folded"));
    let n = total(&all);
    assert!(n > 100, "only {n} samples");
    assert_eq!(
        p["samples"].as_u64(),
        Some(n),
        "pprof samples vs stacks-all.folded"
    );
    assert_eq!(p["cpu_ns"].as_u64(), Some(n * period));
    assert_eq!(report["stacks"]["samples"].as_u64(), Some(n));
    for role in ["main", "worker", "launcher", "other"] {
        let f = out.join(format!("stacks-{role}.folded"));
        let want = if f.is_file() { total(&folded(&f)) } else { 0 };
        let got = p["roles"][role]["samples"].as_u64().unwrap_or(0);
        assert_eq!(got, want, "samples of role {role}");
    }
    assert!(p["roles"]["worker"]["samples"].as_u64().unwrap() > 0);
    let mut per_pid: BTreeMap<String, u64> = BTreeMap::new();
    for (_, root, k) in folded(&out.join("stacks-all-native.folded")) {
        let pid = root
            .rsplit_once(" (")
            .expect("name (pid)")
            .1
            .trim_end_matches(')');
        *per_pid.entry(pid.to_string()).or_default() += k;
    }
    let got: BTreeMap<String, u64> = p["pids"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect();
    assert_eq!(got, per_pid, "samples per process");
    for key in ["command", "pid", "process", "role", "thread", "tid"] {
        assert!(
            p["label_keys"].as_array().unwrap().iter().any(|k| k == key),
            "no {key} label: {}",
            p["label_keys"]
        );
    }

    // Every function's self and total samples, so the top functions and
    // their shares, per role and overall.
    let want = functions_of(&all);
    let got = functions_json(&p["roles"]["all"]["functions"]);
    assert_same(&got, &want, "functions of all processes");
    let top_want = top(&want, n, 10);
    assert_eq!(top(&got, n, 10), top_want);
    eprintln!("top functions: {top_want:?}");
    let workers = folded(&out.join("stacks-worker.folded"));
    assert_eq!(
        functions_json(&p["roles"]["worker"]["functions"]),
        functions_of(&workers),
        "functions of the workers"
    );

    // A Python frame keeps its file, a native frame its library.
    let frames = p["frames"].as_array().unwrap();
    let augment: Vec<&Value> = frames.iter().filter(|f| f["name"] == "augment").collect();
    assert!(!augment.is_empty(), "augment in the profile");
    // Its locations are its lines, within its body, where the agent read
    // them (same-instant frames); none (0, "unknown") otherwise.
    let script = std::fs::read_to_string(common::repo().join("tests/scripts/stacks_job.py"))
        .expect("stacks_job.py");
    let def = script
        .lines()
        .position(|l| l.starts_with("def augment("))
        .expect("def augment")
        + 1;
    let end = def
        + script
            .lines()
            .skip(def)
            .position(|l| l.starts_with("def "))
            .expect("a def after augment");
    let agent = report["stacks"]["python"]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["sampler"] == "same-instant");
    for f in &augment {
        assert!(
            f["file"]
                .as_str()
                .unwrap()
                .ends_with("tests/scripts/stacks_job.py"),
            "{f}"
        );
        assert!(f["library"].is_null(), "{f}");
        let line = f["line"].as_u64().unwrap();
        if agent {
            assert!(
                (def as u64..=end as u64).contains(&line),
                "{f}: not in {def}..={end}"
            );
        } else {
            assert_eq!(line, 0, "{f}");
        }
    }
    let zlib: Vec<&Value> = frames
        .iter()
        .filter(|f| f["library"].as_str().is_some_and(|l| l.contains("libz.so")))
        .collect();
    assert!(
        !zlib.is_empty(),
        "no location maps to libz: {:?}",
        frames.iter().map(|f| &f["library"]).collect::<Vec<_>>()
    );
    assert!(
        zlib.iter()
            .any(|f| f["name"].as_str().is_some_and(|n| n.contains("deflate"))),
        "no deflate in libz: {zlib:?}"
    );
    // Named functions have the file offset sampled in them; the Python
    // view's `[libz.so…]` frame (a run of unnamed frames) has none.
    for f in &zlib {
        let named = !f["name"].as_str().unwrap().starts_with('[');
        assert_eq!(f["address"].as_u64().unwrap() > 0, named, "{f}");
    }
}

/// The folded label of a speedscope frame: Python frames (a source file
/// `….py`, or `<frozen …>`, `<string>`; native frames have a library path
/// or `[vdso]`) are `name (file)`.
fn speedscope_label(name: &str, file: Option<&str>) -> String {
    match file {
        Some(f) if f.ends_with(".py") || f.starts_with('<') => {
            let parts: Vec<&str> = f.split('/').collect();
            let base = parts[parts.len() - 1];
            let shown = if matches!(base, "__init__.py" | "__main__.py") && parts.len() > 1 {
                format!("{}/{base}", parts[parts.len() - 2])
            } else {
                base.to_string()
            };
            format!("{name} ({shown})")
        }
        _ => name.to_string(),
    }
}

#[test]
fn speedscope_profile_loaded_by_speedscope_matches_the_folded_files() {
    need_perf!();
    let modules = match common::node_modules() {
        Ok(m) => m,
        Err(why) => skip!("{why}"),
    };
    let out = recording();
    let path = out.join("profile.speedscope.json");
    let s = common::node_reader("read_speedscope.js", &modules, &path);
    eprintln!("speedscope {}", s["version"]);
    assert_eq!(
        s["schema"],
        "https://www.speedscope.app/file-format-schema.json"
    );
    let report = common::read_json(&out.join("report.json"));
    let hz = report["stacks"]["frequency_hz"]
        .as_f64()
        .expect("frequency");
    let raw: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let profiles = s["profiles"].as_array().unwrap();
    assert!(
        profiles.len() >= 3,
        "one profile per thread: {}",
        profiles.len()
    );
    assert_eq!(profiles.len(), raw["profiles"].as_array().unwrap().len());
    let all = folded(&out.join("stacks-all.folded"));
    let n = total(&all);
    let weights: u64 = profiles.iter().map(|p| p["total"].as_u64().unwrap()).sum();
    let period = weights / n;
    assert_eq!(weights, n * period, "weights are whole sampling periods");
    assert!(
        (period as f64 - 1e9 / hz).abs() <= 1e9 / hz * 0.01,
        "period {period} ns at {hz} Hz"
    );
    for p in profiles {
        assert_eq!(p["unit"], "nanoseconds");
    }

    // Per process: profiles are named `name (pid) · thread`.
    let mut want_pid: BTreeMap<String, u64> = BTreeMap::new();
    for (_, root, k) in folded(&out.join("stacks-all-native.folded")) {
        let pid = root.rsplit_once(" (").unwrap().1.trim_end_matches(')');
        *want_pid.entry(pid.to_string()).or_default() += k * period;
    }
    let mut got_pid: BTreeMap<String, u64> = BTreeMap::new();
    for p in profiles {
        let name = p["name"].as_str().unwrap();
        let proc_part = name.split(" · ").next().unwrap();
        let pid = proc_part.rsplit_once(" (").unwrap().1.trim_end_matches(')');
        *got_pid.entry(pid.to_string()).or_default() += p["total"].as_u64().unwrap();
    }
    assert_eq!(got_pid, want_pid, "CPU ns per process");
    // The profile shown first has the most CPU time.
    let active = s["active"].as_u64().unwrap() as usize;
    let max = profiles.iter().map(|p| p["total"].as_u64().unwrap()).max();
    assert_eq!(profiles[active]["total"].as_u64(), max);

    // Every stack with its time, as speedscope's own call tree holds it:
    // the folded file's lines, without their process root.
    let mut got: BTreeMap<Vec<String>, u64> = BTreeMap::new();
    for p in profiles {
        for st in p["stacks"].as_array().unwrap() {
            let stack: Vec<String> = st[0]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| speedscope_label(f[0].as_str().unwrap(), f[1].as_str()))
                .collect();
            let w = st[1].as_u64().unwrap();
            assert_eq!(w % period, 0, "{stack:?}: {w} ns");
            *got.entry(stack).or_default() += w / period;
        }
    }
    let mut want: BTreeMap<Vec<String>, u64> = BTreeMap::new();
    for (stack, _, k) in &all {
        *want.entry(stack.clone()).or_default() += k;
    }
    want.retain(|s, _| !s.is_empty());
    assert_same(&got, &want, "stacks as speedscope reads them");
    let lines: Vec<(Vec<String>, String, u64)> = got
        .into_iter()
        .map(|(s, k)| (s, String::new(), k))
        .collect();
    let (got_f, want_f) = (functions_of(&lines), functions_of(&all));
    assert_eq!(got_f, want_f);
    assert_eq!(top(&got_f, n, 10), top(&want_f, n, 10));
}

#[test]
fn report_rebuilds_both_profiles_byte_for_byte() {
    need_perf!();
    let out = recording();
    let again = out.with_file_name("rebuilt");
    let o = common::gpuprof()
        .args(["report", "-q"])
        .arg(out)
        .arg("-o")
        .arg(&again)
        .output()
        .expect("run gpuprof report");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for f in ["profile.pb.gz", "profile.speedscope.json"] {
        let a = std::fs::read(out.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        let b = std::fs::read(again.join(f)).unwrap_or_else(|e| panic!("rebuilt {f}: {e}"));
        assert!(a == b, "{f} differs when rebuilt by gpuprof report");
    }
}
