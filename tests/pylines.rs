//! Python line numbers (issue 33): the line each sampled frame was on, from
//! the instruction it was executing and its code object's line table,
//! decoded per CPython version (3.9 `co_lnotab`, 3.10 `co_linetable`, 3.11+
//! location table). Real gpuprof, real interpreters, real samples.

#[macro_use]
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const BIN: &str = env!("CARGO_BIN_EXE_gpuprof");

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuprof-pylines-{}-{}", name, std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Samples per `work (two_loops.py:LINE)` frame (the innermost Python
/// frame of each stack), and how many stacks had `work` by function only.
fn per_line(folded: &Path) -> (BTreeMap<String, u64>, u64) {
    let text = std::fs::read_to_string(folded).unwrap();
    let mut lines = BTreeMap::new();
    let mut by_function = 0;
    for l in text.lines() {
        let (stack, n) = l.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        for f in stack.split(';') {
            if let Some(rest) = f.strip_prefix("work (two_loops.py:") {
                *lines
                    .entry(rest.trim_end_matches(')').to_string())
                    .or_default() += n;
            } else if f == "work (two_loops.py)" {
                by_function += n;
            }
        }
    }
    (lines, by_function)
}

/// The line of the script's line holding `marker`.
fn line_of(script: &Path, marker: &str) -> String {
    let text = std::fs::read_to_string(script).unwrap();
    let i = text.lines().position(|l| l.contains(marker)).unwrap();
    (i + 1).to_string()
}

/// The 70/30 job (tests/scripts/two_loops.py: one function, two hot loops
/// on known lines doing 70% and 30% of its work, 1.5 s of CPU at 250 Hz)
/// on one CPython, recorded with `--lines` (`out`) and drawn again from the
/// recording without it (`again`).
struct Run {
    minor: u32,
    out: PathBuf,
    again: PathBuf,
}

/// The job on every installed CPython 3.9–3.13 the agent samples (lines
/// come with its same-instant frames), recorded once for the tests of this
/// file. ~3 s per version.
fn runs() -> &'static [Run] {
    static RUNS: OnceLock<Vec<Run>> = OnceLock::new();
    RUNS.get_or_init(|| {
        let script = common::repo().join("tests/scripts/two_loops.py");
        let dir = tmp("shares");
        let mut runs = Vec::new();
        for minor in 9..=13 {
            let Some(py) = common::python_minor(minor) else {
                continue;
            };
            let out = dir.join(format!("py{minor}"));
            let o = Command::new(BIN)
                .args(["-q", "--lines", "--frequency", "250", "-o"])
                .arg(&out)
                .arg("--")
                .arg(&py)
                .arg(&script)
                .arg("1.5")
                .output()
                .unwrap();
            assert_eq!(
                o.status.code(),
                Some(0),
                "{}",
                String::from_utf8_lossy(&o.stderr)
            );
            let r = common::report(&out);
            let procs = r["stacks"]["python"]["processes"].as_array().unwrap();
            if procs.iter().all(|p| p["sampler"] != "same-instant") {
                eprintln!("3.{minor}: the agent did not sample ({procs:?})");
                continue;
            }
            let again = dir.join(format!("again{minor}"));
            let o = Command::new(BIN)
                .arg("report")
                .arg(&out)
                .arg("-o")
                .arg(&again)
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            runs.push(Run { minor, out, again });
        }
        runs
    })
}

/// The lines of the two loops, `# LOOP_A` and `# LOOP_B`.
fn loop_lines() -> (String, String) {
    let script = common::repo().join("tests/scripts/two_loops.py");
    (line_of(&script, "# LOOP_A"), line_of(&script, "# LOOP_B"))
}

/// Whether `na` of `na + nb` samples is 70% within sampling noise (3σ of
/// a binomial share, plus one sample), with enough samples to tell.
fn check_share(what: &str, na: u64, nb: u64) -> f64 {
    let n = na + nb;
    assert!(n >= 100, "{what}: only {n} samples on the loops");
    let share = na as f64 / n as f64;
    let sigma = (0.7 * 0.3 / n as f64).sqrt();
    assert!(
        (share - 0.7).abs() <= 3.0 * sigma + 1.0 / n as f64,
        "{what}: the first loop has {share:.3} of {n} samples, not 0.70 ± {:.3}",
        3.0 * sigma
    );
    share
}

/// On every installed CPython 3.9–3.13, with `--lines` the folded file and
/// the flamegraph show `work (two_loops.py:LINE)`, and the two loops'
/// shares of the function's samples are 70/30 within sampling noise;
/// nothing is filed under a third line or an undecoded one. The same
/// recording drawn again without `--lines` is by function.
#[test]
fn per_line_shares_match_the_work_on_each_python() {
    let (a, b) = loop_lines();
    let mut table = Vec::new();
    for Run { minor, out, again } in runs() {
        let (lines, by_function) = per_line(&out.join("stacks-main.folded"));
        assert_eq!(by_function, 0, "3.{minor}: frames without a line");
        let na = lines.get(&a).copied().unwrap_or(0);
        let nb = lines.get(&b).copied().unwrap_or(0);
        let n = na + nb;
        let others: u64 = lines.values().sum::<u64>() - n;
        // The while line around them runs once per 1000 sums: nothing
        // else, and no line left undecoded ("?").
        assert!(
            others as f64 <= 0.02 * n as f64 && !lines.contains_key("?"),
            "3.{minor}: {lines:?}"
        );
        let share = check_share(&format!("3.{minor}: {lines:?}"), na, nb);
        table.push(format!("3.{minor}: {share:.3} of {n}: {lines:?}"));
        let svg = std::fs::read_to_string(out.join("flame-main.svg")).unwrap();
        assert!(
            svg.contains(&format!("work (two_loops.py:{a})")),
            "3.{minor} SVG"
        );

        // The recording keeps the lines; by default the outputs are by
        // function.
        let (lines, by_function) = per_line(&again.join("stacks-main.folded"));
        assert!(lines.is_empty(), "3.{minor}: {lines:?}");
        assert!(by_function >= n, "3.{minor}: {by_function} < {n}");
    }
    eprintln!("{}", table.join("\n"));
    if runs().is_empty() {
        skip!("no CPython 3.9-3.13 sampled by the agent here");
    }
}

/// label → (self, total) samples of a folded file; with `--lines`, a frame
/// whose line was not decoded (`name (file.py:?)`) is by function, as the
/// profiles have no line for it.
fn functions(folded: &Path) -> BTreeMap<String, (u64, u64)> {
    let mut f: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for l in std::fs::read_to_string(folded).unwrap().lines() {
        let (stack, n) = l.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        // Without the process root, which the profiles keep as labels.
        let frames: Vec<String> = stack
            .split(';')
            .skip(1)
            .map(|x| x.replace(":?)", ")"))
            .collect();
        if let Some(leaf) = frames.last() {
            f.entry(leaf.clone()).or_default().0 += n;
        }
        let mut seen: Vec<&String> = Vec::new();
        for x in &frames {
            if !seen.contains(&x) {
                seen.push(x);
                f.entry(x.clone()).or_default().1 += n;
            }
        }
    }
    f
}

fn functions_json(v: &serde_json::Value) -> BTreeMap<String, (u64, u64)> {
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, e)| (k.clone(), (e[0].as_u64().unwrap(), e[1].as_u64().unwrap())))
        .collect()
}

/// `profile.pb.gz` and `profile.speedscope.json` hold every Python frame's
/// line whether or not `--lines` was given: the files drawn without it are
/// the same bytes as with it. Read back by their own readers (the
/// `pprof-format` and `speedscope` npm packages, as in tests/profiles.rs),
/// on every CPython the job ran on: pprof's samples per (function, line)
/// are the `--lines` folded file's, its samples per function the default
/// folded file's (by function nothing changed), and in both files the two
/// loops' shares of `work` are 70/30 within sampling noise.
#[test]
fn profiles_hold_the_lines_with_or_without_the_flag() {
    let modules = match common::node_modules() {
        Ok(m) => m,
        Err(why) => skip!("{why}"),
    };
    if runs().is_empty() {
        skip!("no CPython 3.9-3.13 sampled by the agent here");
    }
    let (a, b) = loop_lines();
    let mut table = Vec::new();
    for Run { minor, out, again } in runs() {
        for f in ["profile.pb.gz", "profile.speedscope.json"] {
            let x = std::fs::read(out.join(f)).unwrap();
            let y = std::fs::read(again.join(f)).unwrap();
            assert!(x == y, "3.{minor}: {f} differs with and without --lines");
        }

        let p = common::node_reader("read_pprof.js", &modules, &again.join("profile.pb.gz"));
        let by_line = functions_json(&p["roles"]["all"]["lines"]);
        let want = functions(&out.join("stacks-all.folded"));
        assert_eq!(by_line, want, "3.{minor}: pprof by line vs --lines folded");
        let by_function = functions_json(&p["roles"]["all"]["functions"]);
        let want = functions(&again.join("stacks-all.folded"));
        assert_eq!(by_function, want, "3.{minor}: pprof by function vs folded");
        let at = |l: &str| {
            by_line
                .get(&format!("work (two_loops.py:{l})"))
                .map_or(0, |e| e.1)
        };
        let pprof_share = check_share(&format!("3.{minor} pprof"), at(&a), at(&b));
        // Every `work` location has a line.
        for f in p["frames"].as_array().unwrap() {
            if f["name"] == "work" {
                assert!(f["line"].as_u64().unwrap() > 0, "3.{minor}: {f}");
            }
        }

        let s = common::node_reader(
            "read_speedscope.js",
            &modules,
            &again.join("profile.speedscope.json"),
        );
        let period = p["period"].as_u64().unwrap();
        let mut work: BTreeMap<String, u64> = BTreeMap::new();
        let mut work_total = 0;
        for profile in s["profiles"].as_array().unwrap() {
            for st in profile["stacks"].as_array().unwrap() {
                let w = st[1].as_u64().unwrap();
                assert_eq!(w % period, 0, "3.{minor}: {w} ns");
                let frames = st[0].as_array().unwrap();
                if let Some(f) = frames.iter().rev().find(|f| {
                    f[0] == "work" && f[1].as_str().is_some_and(|x| x.ends_with("two_loops.py"))
                }) {
                    let line = f[2].as_u64().map_or("?".to_string(), |l| l.to_string());
                    *work.entry(line).or_default() += w / period;
                    work_total += w / period;
                }
            }
        }
        assert_eq!(
            work_total, by_function["work (two_loops.py)"].1,
            "3.{minor}: speedscope's work vs the folded file's"
        );
        let (lines, _) = per_line(&out.join("stacks-all.folded"));
        assert_eq!(work, lines, "3.{minor}: speedscope's lines of work");
        let get = |l: &str| work.get(l).copied().unwrap_or(0);
        let ss_share = check_share(&format!("3.{minor} speedscope"), get(&a), get(&b));
        table.push(format!(
            "3.{minor}: pprof {pprof_share:.3}, speedscope {ss_share:.3} of {} samples",
            get(&a) + get(&b)
        ));
    }
    eprintln!("{}", table.join("\n"));
}

/// `LINE_LAYOUTS` in pystacks.c (where a frame's instruction and a code
/// object's line table are) against each installed CPython's headers.
#[test]
fn the_line_layouts_match_each_pythons_headers() {
    let src = std::fs::read_to_string(common::repo().join("src/agent/pystacks.c")).unwrap();
    let start = src
        .find("LINE_LAYOUTS[] = {")
        .expect("LINE_LAYOUTS in pystacks.c");
    let table: BTreeMap<u32, Vec<i64>> = src[start..]
        .lines()
        .skip(1)
        .take_while(|l| l.trim() != "};")
        .filter_map(|l| {
            let inner = l.trim().strip_prefix('{')?.strip_suffix("},")?;
            let v: Vec<i64> = inner
                .split(',')
                .map(|x| x.trim().parse().ok())
                .collect::<Option<_>>()?;
            Some((v[0] as u32, v))
        })
        .collect();
    assert_eq!(table.len(), 5, "LINE_LAYOUTS of 3.9-3.13");
    let dir = tmp("layouts");
    let mut checked = 0;
    for (minor, want) in &table {
        let Some(py) = common::python_minor(*minor) else {
            continue;
        };
        let Some(inc) = py
            .parent()
            .and_then(|b| b.parent())
            .map(|p| p.join(format!("include/python3.{minor}")))
            .filter(|i| i.join("internal").is_dir())
        else {
            continue;
        };
        let c = dir.join(format!("p{minor}.c"));
        std::fs::write(&c, PROBE).unwrap();
        let exe = dir.join(format!("p{minor}"));
        let ok = Command::new("gcc")
            .arg("-w")
            .arg("-I")
            .arg(&inc)
            .arg("-I")
            .arg(inc.join("internal"))
            .arg(&c)
            .arg("-o")
            .arg(&exe)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            continue;
        }
        let out = Command::new(&exe).output().unwrap();
        let got: Vec<i64> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(
            &got, want,
            "3.{minor}: headers say {got:?}, pystacks.c {want:?}"
        );
        checked += 1;
    }
    let _ = std::fs::remove_dir_all(&dir);
    if checked == 0 {
        skip!("no CPython 3.9-3.13 with its headers and gcc");
    }
}

/// Prints the LINE_LAYOUTS row of the CPython whose headers it is compiled
/// with.
const PROBE: &str = r#"
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#if PY_VERSION_HEX >= 0x030b0000
#include "internal/pycore_frame.h"
#else
#include <frameobject.h>
#endif
int main(void) {
#if PY_VERSION_HEX < 0x030a0000
    printf("%d %ld 0 %ld -1\n", PY_MINOR_VERSION, (long)offsetof(PyFrameObject, f_lasti),
           (long)offsetof(PyCodeObject, co_lnotab));
#elif PY_VERSION_HEX < 0x030b0000
    printf("%d %ld 1 %ld -1\n", PY_MINOR_VERSION, (long)offsetof(PyFrameObject, f_lasti),
           (long)offsetof(PyCodeObject, co_linetable));
#elif PY_VERSION_HEX < 0x030d0000
    printf("%d %ld 2 %ld %ld\n", PY_MINOR_VERSION, (long)offsetof(_PyInterpreterFrame, prev_instr),
           (long)offsetof(PyCodeObject, co_linetable), (long)offsetof(PyCodeObject, co_code_adaptive));
#else
    printf("%d %ld 2 %ld %ld\n", PY_MINOR_VERSION, (long)offsetof(_PyInterpreterFrame, instr_ptr),
           (long)offsetof(PyCodeObject, co_linetable), (long)offsetof(PyCodeObject, co_code_adaptive));
#endif
    return 0;
}
"#;
