//! Python line numbers (issue 33): the line each sampled frame was on, from
//! the instruction it was executing and its code object's line table,
//! decoded per CPython version (3.9 `co_lnotab`, 3.10 `co_linetable`, 3.11+
//! location table). Real gpuprof, real interpreters, real samples.

#[macro_use]
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

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

/// On every installed CPython 3.9–3.13: one function, two hot loops on
/// known lines doing 70% and 30% of its work. With `--lines` the folded
/// file and the flamegraph show `work (two_loops.py:LINE)`, and the two
/// lines' shares of the function's samples are 70/30 within sampling noise
/// (3σ of a binomial share, plus one sample); nothing is filed under a
/// third line or an undecoded one. The same recording drawn again without
/// `--lines` is by function. ~3 s per version.
#[test]
fn per_line_shares_match_the_work_on_each_python() {
    let script = common::repo().join("tests/scripts/two_loops.py");
    let (a, b) = (line_of(&script, "# LOOP_A"), line_of(&script, "# LOOP_B"));
    let dir = tmp("shares");
    let mut tried = 0;
    let mut table = Vec::new();
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
            // Lines come with the agent's same-instant frames.
            eprintln!("3.{minor}: the agent did not sample ({procs:?})");
            continue;
        }
        tried += 1;
        let (lines, by_function) = per_line(&out.join("stacks-main.folded"));
        assert_eq!(by_function, 0, "3.{minor}: frames without a line");
        let na = lines.get(&a).copied().unwrap_or(0);
        let nb = lines.get(&b).copied().unwrap_or(0);
        let n = na + nb;
        let others: u64 = lines.values().sum::<u64>() - n;
        table.push(format!("3.{minor}: {lines:?}"));
        assert!(
            n >= 100,
            "3.{minor}: only {n} samples on the loops: {lines:?}"
        );
        // The while line around them runs once per 1000 sums: nothing
        // else, and no line left undecoded ("?").
        assert!(
            others as f64 <= 0.02 * n as f64 && !lines.contains_key("?"),
            "3.{minor}: {lines:?}"
        );
        let share = na as f64 / n as f64;
        let sigma = (0.7 * 0.3 / n as f64).sqrt();
        assert!(
            (share - 0.7).abs() <= 3.0 * sigma + 1.0 / n as f64,
            "3.{minor}: line {a} has {share:.3} of {n} samples, not 0.70 ± {:.3}: {lines:?}",
            3.0 * sigma
        );
        let svg = std::fs::read_to_string(out.join("flame-main.svg")).unwrap();
        assert!(
            svg.contains(&format!("work (two_loops.py:{a})")),
            "3.{minor} SVG"
        );

        // The recording keeps the lines; by default the outputs are by
        // function.
        let again = dir.join(format!("again{minor}"));
        let o = Command::new(BIN)
            .arg("report")
            .arg(&out)
            .arg("-o")
            .arg(&again)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let (lines, by_function) = per_line(&again.join("stacks-main.folded"));
        assert!(lines.is_empty(), "3.{minor}: {lines:?}");
        assert!(by_function >= n, "3.{minor}: {by_function} < {n}");
    }
    eprintln!("{}", table.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
    if tried == 0 {
        skip!("no CPython 3.9-3.13 sampled by the agent here");
    }
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
