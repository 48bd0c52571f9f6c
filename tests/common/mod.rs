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
    (out, o)
}

pub fn read_json(p: &Path) -> Value {
    let s = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("parse {}: {e}", p.display()))
}

pub fn report(dir: &Path) -> Value {
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

/// Check a Chrome trace: parses, has metadata, and every `X` slice nests
/// properly within its thread. Returns the trace.
pub fn check_trace(path: &Path) -> Value {
    let t = read_json(path);
    let evs = t["traceEvents"].as_array().expect("traceEvents array");
    assert!(
        evs.iter()
            .any(|e| e["ph"] == "M" && e["name"] == "process_name"),
        "no process_name metadata"
    );
    assert!(
        evs.iter()
            .any(|e| e["ph"] == "M" && e["name"] == "thread_name"),
        "no thread_name metadata"
    );
    assert!(
        evs.iter()
            .any(|e| e["ph"] == "M" && e["name"] == "process_sort_index"),
        "no sort index metadata"
    );
    assert!(
        t["metadata"]["anchor_realtime_ns"].as_u64().is_some(),
        "no clock anchor in metadata"
    );
    let mut by_thread: HashMap<(i64, i64), Vec<(f64, f64)>> = HashMap::new();
    for e in evs {
        if e["ph"] == "X" {
            let ts = e["ts"].as_f64().expect("X has ts");
            let dur = e["dur"].as_f64().expect("X has dur");
            assert!(dur >= 0.0 && ts >= 0.0, "negative time in {e}");
            by_thread
                .entry((e["pid"].as_i64().unwrap(), e["tid"].as_i64().unwrap()))
                .or_default()
                .push((ts, ts + dur));
        }
    }
    for (k, mut v) in by_thread {
        // Sort by start, longer first, then check stack discipline.
        v.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut stack: Vec<f64> = Vec::new();
        for (s, e) in v {
            while stack.last().is_some_and(|&end| end <= s + 1e-6) {
                stack.pop();
            }
            if let Some(&end) = stack.last() {
                assert!(
                    e <= end + 1e-6,
                    "slice [{s}, {e}] overlaps its parent ending at {end} on {k:?}"
                );
            }
            stack.push(e);
        }
    }
    t
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
