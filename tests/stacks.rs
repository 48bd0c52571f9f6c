//! Stack sampling, end to end: the real gpuprof binary records real Python
//! jobs (tests/scripts/) with real perf samples, and the outputs are checked
//! against the acceptance criteria of issue 4.
//!
//! Tests that need perf skip (with a message saying why) where
//! `perf_event_open` is refused; the refused path itself is tested with a
//! seccomp helper that denies the syscall.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_gpuprof");

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuprof-test-{}-{}", name, std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Recording tests run one at a time: on a small machine, jobs profiled in
/// parallel would starve each other and the profiler.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn record(name: &str, args: &[&str], job: &[&str]) -> (PathBuf, i32) {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = tmp(name);
    let st = Command::new(BIN)
        .arg("-q")
        .arg("-o")
        .arg(&out)
        .args(args)
        .arg("--")
        .args(job)
        .status()
        .expect("run gpuprof");
    common::check_outputs(&out);
    (out, st.code().unwrap_or(-1))
}

/// The report, checked against its schema and types (`common::read_json`).
fn report(dir: &Path) -> Value {
    common::read_json(&dir.join("report.json"))
}

/// (stack, count) of a folded file.
fn folded(path: &Path) -> Vec<(String, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| {
            let (s, n) = l.rsplit_once(' ').expect("count");
            (s.to_string(), n.parse().expect("count is a number"))
        })
        .collect()
}

fn share(lines: &[(String, u64)], pred: impl Fn(&str) -> bool) -> f64 {
    let total: u64 = lines.iter().map(|l| l.1).sum();
    let hit: u64 = lines.iter().filter(|l| pred(&l.0)).map(|l| l.1).sum();
    hit as f64 / total.max(1) as f64
}

/// The real interpreter, not a wrapper that execs it (pyenv shims are
/// shell scripts), so the job's process tree is just the Python processes.
fn python() -> &'static str {
    static PY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PY.get_or_init(|| {
        let o = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 is needed by the stack tests");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    })
}

fn assert_xml(path: &Path, must_contain: &[&str]) {
    let st = Command::new(python())
        .args([
            "-c",
            "import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])",
        ])
        .arg(path)
        .status()
        .expect("python3");
    assert!(st.success(), "{} is not well-formed XML", path.display());
    let text = std::fs::read_to_string(path).expect("svg");
    for m in must_contain {
        assert!(text.contains(m), "{} lacks {m}", path.display());
    }
}

#[test]
fn worker_and_main_functions_with_native_leaves() {
    need_perf!();
    let script = scripts().join("stacks_job.py");
    let (out, code) = record(
        "roles",
        &[],
        &[python(), script.to_str().unwrap(), "3", "2", "0"],
    );
    assert_eq!(code, 0);
    // gpuprof's own CPU by component: the collectors that ran are charged,
    // and the parts (main thread included) add up to the whole.
    let prof = &report(&out)["profiler"];
    let by = prof["cpu_s_by_component"]
        .as_object()
        .expect("by component");
    for c in ["perf reader", "/proc sampler", "recording writer"] {
        assert!(by.contains_key(c), "no {c}: {prof}");
    }
    assert!(by["perf reader"].as_f64().unwrap() > 0.0, "{prof}");
    let sum: f64 = by.values().map(|v| v.as_f64().unwrap()).sum();
    let total = prof["cpu_s"].as_f64().unwrap();
    assert!(
        (sum - total).abs() <= 0.001 * by.len() as f64,
        "{sum} of {total}: {prof}"
    );
    let workers = folded(&out.join("stacks-worker.folded"));
    let in_worker = share(&workers, |s| s.contains(";worker (stacks_job.py)"));
    eprintln!(
        "worker (stacks_job.py) in {:.1}% of worker samples",
        in_worker * 100.0
    );
    assert!(
        in_worker >= 0.6,
        "worker (stacks_job.py) in {:.0}% of worker samples",
        in_worker * 100.0
    );
    // zlib's deflate runs below the Python frame that called it.
    let native_under_python = workers.iter().any(|(s, _)| {
        s.find(";compress_batch (stacks_job.py);")
            .is_some_and(|i| s[i..].contains(";deflate"))
    });
    assert!(
        native_under_python,
        "no stack with deflate under compress_batch:\n{}",
        workers
            .iter()
            .filter(|l| l.0.contains("deflate"))
            .take(3)
            .map(|l| l.0.clone())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let main = folded(&out.join("stacks-main.folded"));
    assert!(
        share(&main, |s| s.contains(";train_loop (stacks_job.py)")) > 0.3,
        "train_loop missing from the main role"
    );
    assert_xml(
        &out.join("flame-workers.svg"),
        &["worker (stacks_job.py)", "deflate"],
    );
    assert_xml(&out.join("flame-main.svg"), &["train_loop (stacks_job.py)"]);
    assert_xml(
        &out.join("flame-all.svg"),
        &["worker (stacks_job.py)", "train_loop"],
    );

    let r = report(&out);
    let s = &r["stacks"];
    assert!(s["samples"].as_u64().unwrap() > 100, "{s}");
    assert_eq!(s["lost_records"], 0);
    let top = s["roles"]["worker"]["top_functions"].as_array().unwrap();
    assert!(!top.is_empty());
    // Every sampled thread has stack slices in the trace.
    let trace = common::check_trace(&out.join("trace.json"));
    let slices = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "worker (stacks_job.py)")
        .count();
    assert!(slices >= 2, "worker slices in the trace: {slices}");
    // No stack slice is shorter than one sampling period (99 Hz: 10.1 ms);
    // thread-state tracks live at tid + 10^9 and are not stack slices.
    let shortest = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"].as_i64().unwrap() < 1_000_000_000)
        .map(|e| e["dur"].as_f64().unwrap())
        .fold(f64::MAX, f64::min);
    assert!(shortest >= 10_100.0, "a stack slice of {shortest} µs");
    assert!(
        trace["metadata"]["stack_slices"]["stack slices (main, worker)"]["slices"]
            .as_u64()
            .unwrap()
            > 0
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn pure_python_samples_reach_the_thread_root() {
    need_perf!();
    let script = scripts().join("pure_python.py");
    let (out, code) = record("root", &[], &[python(), script.to_str().unwrap(), "1.5"]);
    assert_eq!(code, 0);
    let s = &report(&out)["stacks"];
    let cov = s["unwind_coverage"].as_f64().unwrap();
    assert!(s["samples"].as_u64().unwrap() >= 50, "{s}");
    assert!(
        cov >= 0.95,
        "only {:.1}% of samples reach _start/clone",
        cov * 100.0
    );
    let all = folded(&out.join("stacks-all-native.folded"));
    assert!(share(&all, |l| l.contains(";fib (pure_python.py)")) > 0.5);
    // By name, too: below the process root frame comes `_start`.
    let named = share(&all, |l| l.split(';').nth(1) == Some("_start"));
    assert!(named >= 0.95, "only {:.1}% start at _start", named * 100.0);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn short_lived_process_is_in_the_flamegraph_symbolized() {
    need_perf!();
    // The job forks a child that burns ~150 ms of CPU in `blip` and exits.
    let script = scripts().join("stacks_job.py");
    let (out, code) = record(
        "short",
        &[],
        &[python(), script.to_str().unwrap(), "0.6", "0", "0"],
    );
    assert_eq!(code, 0);
    let r = report(&out);
    let job = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["is_job"] == true)
        .unwrap()["pid"]
        .as_i64()
        .unwrap();
    // Samples of processes other than the job: the short-lived child
    // (every frame, one root per process).
    let all = folded(&out.join("stacks-all-native.folded"));
    let blip: Vec<&(String, u64)> = all
        .iter()
        .filter(|(s, _)| !s.contains(&format!(" ({job});")))
        .collect();
    assert!(!blip.is_empty(), "no sample of the short-lived child");
    assert!(
        blip.iter()
            .all(|(s, _)| s.contains(";_start;") && s.contains(";Py_BytesMain;")),
        "the child's frames are not symbolized: {blip:?}"
    );
    // perf's task records give its exact lifetime.
    let child_pid: i64 = blip[0].0.split(['(', ')']).nth(1).unwrap().parse().unwrap();
    let p = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == child_pid)
        .expect("child in the process table");
    let life = p["end_s"].as_f64().unwrap() - p["start_s"].as_f64().unwrap();
    assert!(life < 0.3 && p["exited"] == true, "lifetime {life} s: {p}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn report_rebuilds_identical_stack_outputs() {
    need_perf!();
    let script = scripts().join("stacks_job.py");
    // At ~1 kHz, too: the rings are sized so that nothing is lost.
    let (out, code) = record(
        "determinism",
        &["--frequency", "999"],
        &[python(), script.to_str().unwrap(), "1", "1", "0"],
    );
    assert_eq!(code, 0);
    let s = &report(&out)["stacks"];
    assert_eq!(s["lost_records"], 0, "{s}");
    assert!(s["samples"].as_u64().unwrap() > 500, "{s}");
    let names = [
        "stacks-main.folded",
        "stacks-worker.folded",
        "stacks-worker-native.folded",
        "stacks-all.folded",
        "flame-main.svg",
        "flame-workers.svg",
        "flame-all.svg",
    ];
    let first: Vec<Vec<u8>> = names
        .iter()
        .map(|n| std::fs::read(out.join(n)).unwrap_or_else(|e| panic!("{n}: {e}")))
        .collect();
    for _ in 0..2 {
        let st = Command::new(BIN)
            .args(["report", "-q"])
            .arg(&out)
            .status()
            .unwrap();
        assert!(st.success());
        for (n, before) in names.iter().zip(&first) {
            assert!(
                std::fs::read(out.join(n)).unwrap() == *before,
                "{n} changed when rebuilt by `gpuprof report`"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn no_stacks_records_nothing_and_says_so() {
    let (out, code) = record("nostacks", &["--no-stacks"], &["sh", "-c", "exit 4"]);
    assert_eq!(code, 4);
    let r = report(&out);
    let cov = r["coverage"].as_array().unwrap();
    assert!(cov.iter().any(|c| c["source"] == "native-stacks"
        && c["available"] == false
        && c["detail"].as_str().unwrap().contains("--no-stacks")));
    assert!(!out.join("flame-all.svg").exists());
    assert_eq!(r["stacks"]["samples"], 0);
    let _ = std::fs::remove_dir_all(&out);
}

/// A helper that makes one syscall fail (seccomp) and execs its arguments:
/// refused permissions, without changing the machine. `syscall` and `errno`
/// are C names, e.g. `__NR_perf_event_open`, `EACCES`.
fn deny_helper(name: &str, syscall: &str, errno: &str) -> Option<PathBuf> {
    let dir = tmp(name);
    std::fs::create_dir_all(&dir).ok()?;
    let src = dir.join("deny.c");
    std::fs::write(
        &src,
        r#"
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(int argc, char **argv) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, DENY_NR, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (DENY_ERRNO & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog p = { .len = 4, .filter = f };
    if (argc < 2 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p)) {
        perror("seccomp");
        return 125;
    }
    execv(argv[1], argv + 1);
    perror("execv");
    return 126;
}
"#,
    )
    .ok()?;
    let bin = dir.join("deny");
    let st = Command::new("gcc")
        .arg("-O")
        .arg(format!("-DDENY_NR={syscall}"))
        .arg(format!("-DDENY_ERRNO={errno}"))
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .status()
        .ok()?;
    st.success().then_some(bin)
}

fn deny_perf_helper() -> Option<PathBuf> {
    deny_helper("seccomp-perf", "__NR_perf_event_open", "EACCES")
}

#[test]
fn unreadable_python_falls_back_to_native_stacks_with_a_note() {
    need_perf!();
    // py-spy reads the interpreter with process_vm_readv; refuse it with
    // EACCES (with EPERM py-spy falls back to /proc/PID/mem, which a real
    // ptrace restriction refuses as well).
    let Some(helper) = deny_helper("seccomp-vmread", "__NR_process_vm_readv", "EACCES") else {
        skip!("gcc could not build the seccomp helper");
    };
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = tmp("ptrace");
    let script = scripts().join("pure_python.py");
    let st = Command::new(&helper)
        .arg(BIN)
        .arg("-q")
        .arg("-o")
        .arg(&out)
        .args(["--", python(), script.to_str().unwrap(), "0.8"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(0));
    let r = report(&out);
    let c = r["coverage"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["source"] == "python-stacks")
        .expect("python-stacks coverage");
    let detail = c["detail"].as_str().unwrap();
    assert!(
        detail.contains("native stacks only") && detail.contains("CAP_SYS_PTRACE"),
        "{detail}"
    );
    // Native stacks are still there, interpreter frames and all; in the
    // Python view an explicit frame says where Python code ran with its
    // frames unknown (the agent cannot read its own process either: it said
    // so and stayed out).
    let native = folded(&out.join("stacks-all-native.folded"));
    assert!(share(&native, |s| s.contains(";_PyEval_EvalFrameDefault")) > 0.5);
    let all = folded(&out.join("stacks-all.folded"));
    assert!(share(&all, |s| s.contains(";[python: not sampled]")) > 0.5);
    let py = &r["stacks"]["python"]["processes"][0];
    assert_eq!(py["sampler"], "python-only", "{py}");
    assert!(
        py["detail"]
            .as_str()
            .unwrap()
            .contains("process_vm_readv on itself failed"),
        "{py}"
    );
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(helper.parent().unwrap());
}

#[test]
fn refused_perf_is_explained_and_the_job_still_runs() {
    let Some(helper) = deny_perf_helper() else {
        skip!("gcc could not build the seccomp helper");
    };
    let out = tmp("refused");
    // perf events only: the default falls back to the in-process timer
    // sampler (tests/timer_sampler.rs).
    let o = Command::new(&helper)
        .arg(BIN)
        .arg("-o")
        .arg(&out)
        .args(["--sampler", "perf"])
        .args(["--", "sh", "-c", "echo job-ran; exit 3"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "exit code passes through");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stdout.contains("job-ran"));
    let line = stderr
        .lines()
        .find(|l| l.contains("perf_event_open"))
        .unwrap_or_else(|| panic!("no perf line in:\n{stderr}"));
    assert!(
        line.contains("perf_event_paranoid") && line.contains("CAP_PERFMON"),
        "{line}"
    );
    // The setting allows perf already: the advice names what refused it
    // (seccomp here), not a sysctl that changes nothing.
    let paranoid: Option<i32> = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse().ok());
    if paranoid.is_some_and(|p| p <= 2) {
        assert!(
            !line.contains("perf_event_paranoid=2") && line.contains("seccomp"),
            "{line}"
        );
    }
    let r = report(&out);
    let c = r["coverage"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["source"] == "native-stacks")
        .expect("native-stacks coverage");
    assert_eq!(c["available"], false);
    let detail = c["detail"].as_str().unwrap();
    assert!(detail.contains("sysctl kernel.perf_event_paranoid") || detail.contains("CAP_PERFMON"));
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(helper.parent().unwrap());
}

/// Frames of the interpreter's own machinery, by the names CPython gives
/// them (for checking the Python view; the product decides by file).
fn interpreter_internal(frame: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "_PyEval_",
        "PyEval_",
        "_PyObject_",
        "PyObject_",
        "_PyFunction_",
        "PyNumber_",
        "_PyLong_",
        "PyLong_",
        "_Py_",
        "Py_",
        "slot_tp_",
        "method_vectorcall",
        "cfunction_",
        "long_",
        "pymain_",
        "_PyRun_",
        "__libc_start",
    ];
    const NAMES: &[&str] = &["type_call", "_start", "k_mul", "x_add", "run_mod", "PyRun_"];
    PREFIXES.iter().any(|p| frame.starts_with(p)) || NAMES.contains(&frame)
}

/// Checks of a worker flamegraph in the Python view, as issue 15 asks:
/// no interpreter-internal frame, `user_fn` within 12 frames of the root,
/// the extension leaves `leaves` still there.
fn check_python_view(out: &Path, user_fn: &str, leaves: &[&[&str]]) {
    let py = folded(&out.join("stacks-worker.folded"));
    let bad: Vec<&str> = py
        .iter()
        .flat_map(|(s, _)| s.split(';').skip(1))
        .filter(|f| interpreter_internal(f))
        .collect();
    assert!(
        bad.is_empty(),
        "interpreter frames in the Python view: {bad:?}"
    );
    let depths: Vec<usize> = py
        .iter()
        .filter_map(|(s, _)| s.split(';').position(|f| f == user_fn))
        .collect();
    assert!(!depths.is_empty(), "{user_fn} is not in the Python view");
    let deepest = depths.iter().max().unwrap();
    assert!(
        *deepest <= 12,
        "{user_fn} is {deepest} frames below the root"
    );
    for alternatives in leaves {
        assert!(
            py.iter().any(|(s, _)| s
                .split(';')
                .any(|f| alternatives.iter().any(|l| f.contains(l)))),
            "no native leaf {alternatives:?} in the Python view"
        );
    }
    // The native variant has every frame, per process.
    let native = folded(&out.join("stacks-worker-native.folded"));
    assert!(share(&native, |s| s.split(';').nth(1) == Some("_start")) > 0.5);
    assert!(
        share(&native, |s| s
            .split(';')
            .filter(|f| interpreter_internal(f))
            .count()
            > 5)
            > 0.5
    );
    let (py_n, native_n): (u64, u64) = (
        py.iter().map(|l| l.1).sum(),
        native.iter().map(|l| l.1).sum(),
    );
    assert_eq!(py_n, native_n, "both views count every sample");
    let size = |n: &str| std::fs::metadata(out.join(n)).map_or(0, |m| m.len());
    eprintln!(
        "{}: flame-workers.svg {} bytes (Python view), flame-all.svg {} bytes; folded {} vs {} bytes (native)",
        out.display(),
        size("flame-workers.svg"),
        size("flame-all.svg"),
        size("stacks-worker.folded"),
        size("stacks-worker-native.folded"),
    );
}

#[test]
fn python_view_folds_the_interpreter_and_keeps_library_leaves() {
    need_perf!();
    let script = scripts().join("mixed_workers.py");
    let (out, code) = record(
        "pyview",
        &[],
        &[python(), script.to_str().unwrap(), "2", "2"],
    );
    assert_eq!(code, 0);
    check_python_view(
        &out,
        "worker (mixed_workers.py)",
        &[&["deflate"], &["SHA256", "sha256", "EVP_"]],
    );
    // Two forked workers of one name: one tower, and one per process.
    let py = folded(&out.join("stacks-worker.folded"));
    assert!(
        py.iter()
            .all(|(s, _)| s.starts_with("python3") && s.contains(" (2 processes)")),
        "{py:?}"
    );
    let svg = std::fs::read_to_string(out.join("flame-workers.svg")).unwrap();
    assert!(svg.contains("2 python3") && svg.contains("flame-workers-per-process.svg"));
    assert!(svg.contains("Python view, folded:"), "subtitle");
    assert!(!svg.contains("_PyEval_EvalFrameDefault"));
    assert_xml(
        &out.join("flame-workers-per-process.svg"),
        &["worker (mixed_workers.py)"],
    );
    // The trace's stack slices use the same view.
    let trace = common::check_trace(&out.join("trace.json"));
    assert_eq!(trace["metadata"]["stack_slices"]["view"], "python");
    let evs = trace["traceEvents"].as_array().unwrap();
    assert!(evs
        .iter()
        .any(|e| e["ph"] == "X" && e["name"] == "work (mixed_workers.py)"));
    assert!(!evs
        .iter()
        .any(|e| e["ph"] == "X" && e["name"] == "_PyEval_EvalFrameDefault"));
    // One option away: every frame, in the flamegraphs and the trace.
    let st = Command::new(BIN)
        .args(["report", "-q", "--flame", "native"])
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success());
    let svg = std::fs::read_to_string(out.join("flame-workers.svg")).unwrap();
    assert!(svg.contains("_PyEval_EvalFrameDefault") && svg.contains("every frame as sampled"));
    let trace = common::check_trace(&out.join("trace.json"));
    assert_eq!(trace["metadata"]["stack_slices"]["view"], "native");
    // A bad view is a one-line error.
    let o = Command::new(BIN)
        .args(["report", "-q", "--flame", "pythn"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("`native`"));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn python_view_of_a_pytorch_dataloader_with_pillow() {
    need_perf!();
    let Some(torch) = common::torch_python() else {
        skip!("no PyTorch venv (GPUPROF_TEST_TORCH_PYTHON or ~/.cache/gpuprof-ci/torch-venv)");
    };
    let script = scripts().join("torch_loader.py");
    let (out, code) = record(
        "pyview-torch",
        &[],
        &[torch.to_str().unwrap(), script.to_str().unwrap(), "3", "2"],
    );
    assert_eq!(code, 0);
    check_python_view(
        &out,
        "Images.__getitem__ (torch_loader.py)",
        // Pillow's resampling and transforms; libjpeg's decoder.
        &[
            &["ImagingResample", "ImagingTransform", "bilinear_filter"],
            &["libjpeg", "jpeg_", "ImagingJpegDecode"],
        ],
    );
    let py = folded(&out.join("stacks-worker.folded"));
    assert!(py
        .iter()
        .all(|(s, _)| s.starts_with("pt_data_worker (2 processes)")));
    let _ = std::fs::remove_dir_all(&out);
}

/// Without NVTX or a GPU, the steps of a real PyTorch training loop come
/// from the main thread's stacks: one per backward pass, though the two
/// DataLoader workers hand batches over unevenly; the job's imports (which
/// enter many functions a few times, `<module>` of several `utils.py`)
/// are not taken for steps.
#[test]
fn steps_of_a_pytorch_loop_from_its_backward_passes() {
    need_perf!();
    let Some(torch) = common::torch_python() else {
        skip!("no PyTorch venv (GPUPROF_TEST_TORCH_PYTHON or ~/.cache/gpuprof-ci/torch-venv)");
    };
    let script = scripts().join("torch_train.py");
    let (out, code) = record(
        "steps-torch",
        &[],
        &[torch.to_str().unwrap(), script.to_str().unwrap(), "40", "2"],
    );
    assert_eq!(code, 0);
    let r = report(&out);
    let s = &r["steps"];
    assert_eq!(s["method"], "python-stacks", "{s}");
    assert_eq!(s["name"], "Tensor.backward (_tensor.py)", "{s}");
    // 40 steps: 39 from one backward pass to the next.
    let n = s["count"].as_u64().unwrap();
    assert!((35..=40).contains(&n), "{n} steps of 39: {s}");
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    // The summary prints the rate to 2 decimals from the unrounded value and
    // report.json keeps 4: compare the numbers, not a re-rounded string
    // (9.84496 reads 9.84 there and 9.8450 here).
    let line = summary
        .lines()
        .find(|l| l.starts_with(&format!("- {n} steps, ")))
        .unwrap_or_else(|| panic!("no steps line: {summary}"));
    let tail = " steps/s; estimated from the main thread's stacks (`Tensor.backward (_tensor.py)` recurs).";
    assert!(line.ends_with(tail), "{line}");
    let printed: f64 = line[format!("- {n} steps, ").len()..line.len() - tail.len()]
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {line}"));
    let sps = s["steps_per_s"].as_f64().unwrap();
    assert!(
        (printed - sps).abs() <= 0.0051,
        "{printed} vs {sps}: {line}"
    );
    // The job never touches CUDA, so no process loads the driver's
    // libcuda.so, and the model ran on the CPU: the diagnosis says so, and
    // does not send the user after "host work" in the loop.
    let notes = r["diagnosis"]["notes"].to_string();
    assert!(notes.contains("nothing ran on a GPU"), "{notes}");
    for f in r["findings"].as_array().unwrap() {
        let fix = f["fix"].as_str().unwrap();
        assert!(!fix.starts_with("Take host work off"), "{f}");
        if f["id"] == "training-loop" {
            assert!(fix.starts_with("Run the model on a GPU"), "{f}");
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// With CPython's perf trampolines enabled by the job (`PYTHONPERFSUPPORT=1`,
/// 3.12+), every Python call runs through JIT code without unwind
/// information: unwinding gets through it with the trampoline rule, and the
/// Python frames come from `/tmp/perf-PID.map` (main process and forked
/// workers), the same instant as the native leaf.
fn trampolines_unwind(minor: u32) {
    need_perf!();
    let Some(py) = common::python_minor(minor) else {
        skip!("Python 3.{minor} is not installed");
    };
    let script = scripts().join("mixed_workers.py");
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = tmp(&format!("trampolines-3{minor}"));
    let st = Command::new(BIN)
        .arg("-q")
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(&py)
        .args([script.to_str().unwrap(), "3", "2"])
        .env("PYTHONPERFSUPPORT", "1")
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(0));
    check_trampolines(&out, &format!("3.{minor}"));
}

/// What [`trampolines_unwind`] checks, for a recording of
/// `mixed_workers.py` with perf trampolines (`label` names it in messages).
fn check_trampolines(out: &Path, label: &str) {
    let r = report(out);
    let s = &r["stacks"];
    let n = s["samples"].as_u64().unwrap();
    let cov = s["unwind_coverage"].as_f64().unwrap();
    let from_map = s["python_from_perf_map"].as_u64().unwrap();
    eprintln!("{label}: {n} samples, unwind coverage {cov}, {from_map} with Python frames from the perf map");
    assert!(n >= 30, "{s}");
    assert!(
        cov >= 0.97,
        "unwind coverage {cov} through perf trampolines: {s}"
    );
    assert!(
        from_map as f64 >= 0.8 * n as f64,
        "{from_map} of {n} samples have Python frames from the perf map"
    );
    // Every native leaf of zlib or OpenSSL is under the Python function that
    // called it, in the workers too.
    let native = folded(&out.join("stacks-all-native.folded"));
    let (mut right, mut wrong) = (0, 0);
    for (s, k) in &native {
        let pyf: Vec<&str> = s
            .split(';')
            .filter(|f| f.ends_with("(mixed_workers.py)"))
            .collect();
        // In the job's loop (OpenSSL also runs when hashlib is imported).
        if !s.contains(";work (mixed_workers.py);") {
            continue;
        }
        let want = if s.contains(";deflate") {
            "compress_block (mixed_workers.py)"
        } else if s.contains(";SHA256") || s.contains(";EVP_") {
            "hash_block (mixed_workers.py)"
        } else {
            continue;
        };
        if pyf.last() == Some(&want) {
            right += k;
        } else {
            eprintln!("elsewhere: {s}");
            wrong += k;
        }
    }
    eprintln!("{label}: native leaves under the right function {right}, elsewhere {wrong}");
    assert!(
        right > 0 && wrong * 100 <= right + wrong,
        "{right} right, {wrong} wrong"
    );
    let workers = folded(&out.join("stacks-worker.folded"));
    assert!(
        share(&workers, |s| s.contains(
            " (2 processes);worker (mixed_workers.py);work (mixed_workers.py)"
        )) > 0.5
    );
    assert!(
        !native
            .iter()
            .any(|(s, _)| s.contains("[anon") || s.contains("[//anon")),
        "unnamed JIT frames remain"
    );
    // The job's maps are its own files in /tmp; tidy them.
    for p in r["processes"].as_array().unwrap() {
        let _ = std::fs::remove_file(format!("/tmp/perf-{}.map", p["pid"]));
    }
    let _ = std::fs::remove_dir_all(out);
}

/// Attached to a running job with perf trampolines and two forked workers:
/// the workers were forked before gpuprof came, so no FORK record tells the
/// reader whose trampolines they run; those made by the main process before
/// the fork are named only in its map. Every stack still reaches the
/// thread's root (before: each worker's stack stopped at the first of them,
/// unwind coverage 0.32).
#[test]
fn perf_trampolines_unwind_in_workers_forked_before_attach() {
    need_perf!();
    let Some((minor, py)) = [12, 13]
        .into_iter()
        .find_map(|m| common::python_minor(m).map(|p| (m, p)))
    else {
        skip!("neither Python 3.12 nor 3.13 is installed");
    };
    let script = scripts().join("mixed_workers.py");
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = tmp(&format!("trampolines-attach-3{minor}"));
    let mut job = Command::new(&py)
        .args([script.to_str().unwrap(), "7", "2"])
        .env("PYTHONPERFSUPPORT", "1")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let kids = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .count()
    };
    let t0 = std::time::Instant::now();
    while kids(job.id()) < 2 && t0.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(kids(job.id()), 2, "the job did not start its workers");
    // Let the workers run their loop (and make their own trampolines).
    std::thread::sleep(std::time::Duration::from_millis(500));
    let st = Command::new(BIN)
        .args([
            "attach",
            &job.id().to_string(),
            "-q",
            "--duration",
            "3s",
            "-o",
        ])
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success());
    assert!(job.wait().unwrap().success());
    check_trampolines(&out, &format!("3.{minor} attached"));
}

#[test]
fn perf_trampolines_unwind_on_python_3_12() {
    trampolines_unwind(12);
}

#[test]
fn perf_trampolines_unwind_on_python_3_13() {
    trampolines_unwind(13);
}

/// Ground truth for pool placement: two operators alternate on a
/// two-thread pool, each from its own Python function, and a pool
/// sample's native leaf says which one it worked for (`sgemm`: the
/// products; ATen's element-wise loop: the sigmoids). At least 80% of the
/// pool samples that tell go under the right function: the placement is by
/// time (the starter's nearest sample), so the few near a switch may land
/// on the other side (each phase is 0.2 CPU-s long, ~10 periods per
/// thread, whatever the machine's speed; the pool waits passively, so
/// the phases are the operators' work and not spinning, and ~100-180
/// samples tell on a loaded machine as on an idle one: 87-96% went under
/// the right function in 8 runs, idle and beside three CPU hogs). Pool
/// samples whose unwinding
/// stopped inside a kernel (`[[unknown]]` at the root, no libgomp frame)
/// are the pool's too: none is left as a root of its own. ~10 s (importing
/// torch is ~4 CPU-s).
#[test]
fn pool_samples_go_under_the_python_function_whose_op_they_ran() {
    need_perf!();
    let Some(torch) = common::torch_python() else {
        skip!("no PyTorch venv (GPUPROF_TEST_TORCH_PYTHON or ~/.cache/gpuprof-ci/torch-venv)");
    };
    let script = scripts().join("torch_pool_ops.py");
    let (out, code) = record(
        "pool-ops",
        &[],
        &[torch.to_str().unwrap(), script.to_str().unwrap(), "10"],
    );
    assert_eq!(code, 0);
    let py = folded(&out.join("stacks-main.folded"));
    let (mut right, mut wrong) = (0u64, 0u64);
    for (s, n) in &py {
        let Some((caller, own)) = s.split_once(";[pool thread of the main thread];") else {
            continue;
        };
        let truth = if own.contains("gemm") {
            "products (torch_pool_ops.py)"
        } else if own.contains("for_each") || own.contains("Sleef") || own.contains("sigmoid") {
            "sigmoids (torch_pool_ops.py)"
        } else {
            continue; // spinning in the pool's own code: tells no operator
        };
        if caller.contains(truth) {
            right += n;
        } else {
            wrong += n;
        }
    }
    assert!(
        right + wrong >= 20,
        "{right} + {wrong} pool samples tell their operator: too few to judge"
    );
    assert!(
        right * 5 >= (right + wrong) * 4,
        "{right} of {} pool samples under the function that ran their operator",
        right + wrong
    );
    let cut_off: Vec<&(String, u64)> = py
        .iter()
        .filter(|(s, _)| !s.contains("[pool thread of") && s.contains(";[[unknown]];"))
        .filter(|(s, _)| s.contains("gemm") || s.contains("for_each") || s.contains("Sleef"))
        .filter(|(s, _)| !s.contains(".py);"))
        .collect();
    assert!(cut_off.is_empty(), "pool work left on its own: {cut_off:?}");
    let _ = std::fs::remove_dir_all(&out);
}

/// A conv net with two intra-op threads (`torch.set_num_threads(2)`, no
/// DataLoader): PyTorch's OpenMP pool thread runs half of each
/// convolution and spins between them. Its samples have no Python frames
/// of their own; the Python view puts them under the main thread's frames
/// of the operator that started the parallel region (`[pool thread of the
/// main thread]`), counts them as `pool_thread`, and the subtitle's shares
/// add up to 100%. Slow-ish (~10 s on two idle cores): importing torch
/// alone is ~4 CPU-s, and 4 CPU-s of training give the pool ~200 samples
/// whatever the machine's speed.
#[test]
fn pytorch_pool_threads_sit_under_the_python_op_that_started_them() {
    need_perf!();
    let Some(torch) = common::torch_python() else {
        skip!("no PyTorch venv (GPUPROF_TEST_TORCH_PYTHON or ~/.cache/gpuprof-ci/torch-venv)");
    };
    let script = scripts().join("torch_pool.py");
    let (out, code) = record(
        "pool-torch",
        &[],
        &[torch.to_str().unwrap(), script.to_str().unwrap(), "4", "2"],
    );
    assert_eq!(code, 0);
    let r = report(&out);
    let procs = r["stacks"]["python"]["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{procs:?}");
    let p = &procs[0];
    let n = |k: &str| p[k].as_u64().unwrap_or_else(|| panic!("{k}: {p}"));
    let py = folded(&out.join("stacks-main.folded"));
    let total: u64 = py.iter().map(|x| x.1).sum();
    // Every sample of the process is counted once, by how it got its
    // Python frames.
    let kinds = [
        "same_instant",
        "same_instant_partial",
        "native_unknown",
        "unattributed",
        "pool_thread",
        "native_only",
    ];
    assert_eq!(kinds.iter().map(|k| n(k)).sum::<u64>(), total, "{p}");
    let pool: u64 = py
        .iter()
        .filter(|(s, _)| s.contains(";[pool thread of the main thread];"))
        .map(|x| x.1)
        .sum();
    assert_eq!(pool, n("pool_thread"));
    // The pool thread works for the convolutions, forward and backward: at
    // 99 Hz over 40 steps it has a few hundred samples here; 5% of the
    // process is a floor no run with a working pool goes under.
    assert!(pool * 20 >= total, "{pool} of {total} under the pool label");
    let under_op = py
        .iter()
        .filter(|(s, _)| {
            s.contains(";[pool thread of the main thread];")
                && (s.contains(";Conv2d.forward (conv.py);")
                    || s.contains(";Tensor.backward (_tensor.py);"))
        })
        .map(|x| x.1)
        .sum::<u64>();
    assert!(under_op * 2 >= pool, "{under_op} of {pool} under the ops");
    // What is left without any Python frame: the interpreter's start-up and
    // shutdown (`[python interpreter]`, said as such), and a few samples
    // (library destructors at exit, pool samples with no main-thread
    // sample near them) — at most 5% of the process.
    let rootless: Vec<&(String, u64)> = py
        .iter()
        .filter(|(s, _)| {
            !s.contains(".py);") && !s.ends_with(".py)") && !s.contains(";[python interpreter]")
        })
        .collect();
    let rootless_n: u64 = rootless.iter().map(|x| x.1).sum();
    assert!(
        rootless_n * 20 <= total,
        "{rootless_n} of {total} without Python frames: {rootless:?}"
    );
    // The subtitle states the estimated share, and its shares add up.
    let svg = std::fs::read_to_string(out.join("flame-main.svg")).unwrap();
    let sub = svg
        .split("id=\"subtitle\"")
        .nth(1)
        .and_then(|s| s.split('>').nth(1))
        .and_then(|s| s.split('<').next())
        .unwrap();
    assert!(
        sub.contains("pool threads under their caller (estimated) "),
        "{sub}"
    );
    let shares: f64 = sub
        .split([',', '·'])
        .filter_map(|part| part.trim().strip_suffix('%'))
        .filter_map(|part| part.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!((shares - 100.0).abs() < 0.05, "{shares}: {sub}");
    let _ = std::fs::remove_dir_all(&out);
}

/// Wall-clock stack copies are sized by how deep the thread's earlier
/// stacks were unwound (plus a page): a thread that blocks for a second
/// near the top of its stack, then for a second ~21 KiB below it
/// (`tests/scripts/deep_block.c`), must have its deep stacks unwound whole
/// — the copy taken again at full size when the unwinding runs off the
/// sized one — down to `main`, never cut at the sized copy's end.
#[test]
fn a_stack_deeper_than_the_threads_earlier_ones_is_unwound_whole() {
    need_perf!();
    let build = tmp("deep-block-build");
    std::fs::create_dir_all(&build).unwrap();
    let bin = build.join("deep_block");
    let built = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(scripts().join("deep_block.c"))
        .status()
        .is_ok_and(|s| s.success());
    if !built {
        skip!("gcc could not build tests/scripts/deep_block.c");
    }
    let (out, code) = record("deep-block", &[], &[bin.to_str().unwrap()]);
    assert_eq!(code, 0);
    let stacks = folded(&out.join("stacks-loop-wall-native.folded"));
    let deep: Vec<&(String, u64)> = stacks
        .iter()
        .filter(|(s, _)| s.contains("deep_frame"))
        .collect();
    // Folded wall stacks count µs.
    let deep_us: u64 = deep.iter().map(|(_, n)| n).sum();
    assert!(
        deep_us > 500_000,
        "the deep phase's second was not seen blocked: {stacks:?}"
    );
    for (s, _) in &deep {
        assert!(
            s.contains(";main;deep_phase;deep_frame") && s.matches("deep_frame").count() == 21,
            "a deep stack cut short: {s}"
        );
    }
    let r = report(&out);
    let detail = r["coverage"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["detail"].as_str())
        .find(|d| d.contains("stack copies of"))
        .unwrap_or_else(|| panic!("no stack copy counts: {}", r["coverage"]))
        .to_string();
    let again: u64 = detail
        .split(" of them taken again whole")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{detail}"));
    assert!(
        again >= 1,
        "the deep stack was never copied again whole: {detail}"
    );
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&build);
}

/// gpuprof's own perf events never sample the kernel: a native job that
/// spends its time in system calls (`dd` copying `/dev/zero` to
/// `/dev/null`) has that time said, from its system time in `/proc`, in
/// the diagnosis, within 30% of what the shell's `time` measured, and in
/// the flame graph's subtitle.
#[test]
fn a_native_jobs_time_in_the_kernel_is_said() {
    need_perf!();
    let truth = tmp("kernel-truth");
    let job = format!(
        "TIMEFORMAT=%S; {{ time dd if=/dev/zero of=/dev/null bs=64k count=800000 status=none; }} 2> {}",
        truth.display()
    );
    let (out, code) = record("kernel", &[], &["bash", "-c", &job]);
    assert_eq!(code, 0);
    let sys: f64 = std::fs::read_to_string(&truth)
        .expect("the shell's time")
        .trim()
        .parse()
        .expect("seconds");
    assert!(sys >= 0.5, "dd spent only {sys} s in the kernel");
    let r = report(&out);
    let line = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["id"] == "low-sample-coverage")
        .flat_map(|f| f["evidence"].as_array().unwrap().iter())
        .filter_map(|e| e.as_str())
        .find(|e| e.contains("sampled by gpuprof's perf events"))
        .unwrap_or_else(|| panic!("not said: {}", r["findings"]))
        .to_string();
    let said: f64 = line
        .split("spent about ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(
        said >= 0.7 * sys && said <= 1.3 * sys,
        "said {said} s, dd's system time {sys} s: {line}"
    );
    assert!(line.contains("dd (pid "), "{line}");
    // The flame graph of every process says it under its (few) samples.
    let svg = std::fs::read_to_string(out.join("flame-all.svg")).expect("flame-all.svg");
    assert!(
        svg.contains("CPU-s more in the kernel not sampled"),
        "{svg}"
    );
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_file(&truth);
}
