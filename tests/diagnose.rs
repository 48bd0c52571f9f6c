//! Diagnosis scenarios: the real gpuprof binary records the real
//! `samples/train_sim.py` and the top finding is asserted, together with
//! the absence of false alarms on a healthy run. Also `gpuprof doctor` on
//! this machine and `gpuprof compare` of two runs.
//!
//! The scenario runs are serialised (one lock): on a small machine two
//! CPU-heavy jobs at once would change each other's diagnosis.

#[macro_use]
mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

use common::{DiskOptions, SlowDisk};
use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

fn gpuprof() -> &'static str {
    env!("CARGO_BIN_EXE_gpuprof")
}

fn sim() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/train_sim.py")
}

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Record the job `cmd` into `out` (no GPU library); returns gpuprof's
/// output and the report.
fn record_cmd<S: AsRef<OsStr>>(out: &Path, cmd: &[S]) -> (Output, Value) {
    record_cmd_with(out, &[], cmd)
}

/// [`record_cmd`] with gpuprof options `opts`.
fn record_cmd_with<S: AsRef<OsStr>>(out: &Path, opts: &[&str], cmd: &[S]) -> (Output, Value) {
    let o = Command::new(gpuprof())
        .arg("-o")
        .arg(out)
        .args(opts)
        .arg("--")
        .args(cmd)
        .env_remove("GPUPROF_NVML_LIB")
        .output()
        .expect("gpuprof runs");
    let report = check_recorded(&o, out);
    (o, report)
}

/// Record `train_sim.py ARGS` into `out`; returns the report.
fn record(out: &Path, args: &[&str]) -> Value {
    let sim = sim();
    let mut cmd: Vec<&OsStr> = vec![OsStr::new("python3"), sim.as_os_str()];
    cmd.extend(args.iter().map(OsStr::new));
    record_cmd(out, &cmd).1
}

/// A job script of the tests (`tests/scripts/NAME`).
fn test_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scripts")
        .join(name)
}

/// The seconds of the diagnosis' start-up note ("Start-up (the job
/// importing modules) took 2.2 s …"); panics without one.
fn startup_note_s(report: &Value) -> f64 {
    report["diagnosis"]["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str())
        .find_map(|n| n.strip_prefix("Start-up (the job importing modules) took "))
        .and_then(|x| x.split(' ').next())
        .and_then(|x| x.parse().ok())
        // How the samples got their Python frames tells whether the edges
        // could be read at all, should this fail.
        .unwrap_or_else(|| {
            panic!(
                "a start-up note: {}; Python frames: {}",
                report["diagnosis"], report["stacks"]["python"]
            )
        })
}

fn check_recorded(o: &Output, out: &Path) -> Value {
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "gpuprof failed: {stderr}");
    assert!(
        stderr.contains("== gpuprof diagnosis =="),
        "the terminal summary starts with the diagnosis: {stderr}"
    );
    // Checked against docs/report.schema.json and the report types.
    let report = common::read_json(&out.join("report.json"));
    common::check_outputs(out);
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("## Diagnosis"), "{summary}");
    report
}

fn findings(report: &Value) -> Vec<(String, String)> {
    report["findings"]
        .as_array()
        .expect("report.json has findings")
        .iter()
        .map(|f| {
            (
                f["id"].as_str().unwrap().to_string(),
                f["severity"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The first finding about the job itself: `cpu-taken-by-other-programs`
/// (a true finding on a busy machine, e.g. under scripts/ci-under-load.sh,
/// and possibly the costlier one there) is passed over, so a test of what
/// the job does asserts it whatever else runs on the machine.
fn top(report: &Value) -> (String, String) {
    let (id, sev, _) = top_finding(report);
    (id, sev)
}

/// [`top`] with the finding itself.
fn top_finding(report: &Value) -> (String, String, Value) {
    let f = report["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["id"] != "cpu-taken-by-other-programs");
    match f {
        Some(f) => (
            f["id"].as_str().unwrap_or("").to_string(),
            f["severity"].as_str().unwrap_or("").to_string(),
            f.clone(),
        ),
        None => ("none".into(), "none".into(), Value::Null),
    }
}

/// `cpu-taken-by-other-programs` is left out: it is about the machine (on
/// a shared development machine another engineer's build does take CPU
/// from the job), and has a test of its own.
fn no_alarm(report: &Value) {
    for (id, sev) in findings(report) {
        assert!(
            sev == "info" || id == "cpu-taken-by-other-programs",
            "false alarm on a healthy run: {id} ({sev}): {}",
            serde_json::to_string_pretty(&report["findings"]).unwrap()
        );
    }
}

/// Every finding carries its evidence, fix, GPU time basis and the command
/// that explains it.
fn well_formed(report: &Value) {
    for f in report["findings"].as_array().unwrap() {
        let id = f["id"].as_str().unwrap();
        assert_eq!(f["docs"], format!("gpuprof explain {id}"));
        assert!(!f["fix"].as_str().unwrap().is_empty());
        assert!(!f["evidence"].as_array().unwrap().is_empty(), "{f}");
        if !f["gpu_time_s"].is_null() {
            // No GPU is measured in these runs: every time is an estimate.
            assert_eq!(f["gpu_time_basis"], "estimated", "{f}");
            assert!(f["gpu_time_method"].as_str().is_some());
        }
    }
    assert_eq!(report["diagnosis"]["gpu_measured"], false);
}

const HEALTHY: &[&str] = &[
    "--workers",
    "4",
    "--augment-ms",
    "3",
    "--gpu-ms",
    "20",
    "--steps",
    "150",
];
const ONE_WORKER_HEAVY: &[&str] = &[
    "--workers",
    "1",
    "--augment-ms",
    "40",
    "--gpu-ms",
    "10",
    "--steps",
    "70",
];

#[test]
fn healthy_pipeline_raises_no_alarm() {
    let _g = serial();
    let dir = common::test_dir();
    let out = dir.path().join("healthy");
    let report = record(&out, HEALTHY);
    well_formed(&report);
    no_alarm(&report);
    // The GPU side was not measured, and the summary says so.
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("GPU side was not measured"), "{summary}");
}

/// Issue 40: the healthy sample (enough workers, light work) recorded for
/// under a second, three times in a row, raises no warning or critical
/// finding in any run: ten sampling intervals are too few for a cause seen
/// in one or two of them to be more than "possibly", and the workers'
/// running readings at the instant they wake are not saturation.
#[test]
fn short_healthy_job_stays_quiet_run_after_run() {
    let _g = serial();
    let dir = common::test_dir();
    for i in 0..3 {
        let out = dir.path().join(format!("short{i}"));
        let report = record(
            &out,
            &[
                "--workers",
                "2",
                "--steps",
                "30",
                "--augment-ms",
                "2",
                "--gpu-ms",
                "20",
            ],
        );
        well_formed(&report);
        no_alarm(&report);
        // Whatever is only possible says so and ranks last.
        let fs = report["findings"].as_array().unwrap();
        let first_possible = fs.iter().position(|f| f["established"] == false);
        if let Some(k) = first_possible {
            assert!(
                fs[k..].iter().all(|f| f["established"] == false
                    && f["title"].as_str().unwrap().contains("ossibly")),
                "run {i}: {}",
                report["findings"]
            );
        }
    }
}

#[test]
fn preprocessing_in_the_main_process() {
    let _g = serial();
    let dir = common::test_dir();
    let out = dir.path().join("main");
    let report = record(
        &out,
        &[
            "--workers",
            "0",
            "--augment-ms",
            "40",
            "--gpu-ms",
            "10",
            "--steps",
            "70",
        ],
    );
    well_formed(&report);
    let (id, sev) = top(&report);
    assert_eq!(id, "main-process-preprocessing", "{}", report["findings"]);
    assert_ne!(sev, "info");
    // `gpuprof report` re-derives the same findings from the recording.
    let again = dir.path().join("again");
    let o = Command::new(gpuprof())
        .args(["report", "-q", "-o"])
        .arg(&again)
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    common::check_outputs(&again);
    let r2 = common::read_json(&again.join("report.json"));
    assert_eq!(findings(&r2), findings(&report));
}

/// Record `tests/scripts/slow_imports.py IMPORT_S WORK_S` into `out`.
/// The report, and the import's wall time as the job measured it (its
/// CPU time is `import_s`; on a loaded machine the wall time is longer).
fn record_slow_imports(out: &Path, import_s: &str, work_s: &str) -> (Value, f64) {
    record_slow_imports_with(out, &[import_s, work_s])
}

fn record_slow_imports_with(out: &Path, args: &[&str]) -> (Value, f64) {
    let script = test_script("slow_imports.py");
    record_slow_imports_via(out, &[], &script, OsStr::new(""), args)
}

/// As [`record_slow_imports_with`], the job run as `python3 FIRST [SECOND]
/// ARGS` (SECOND left out when empty: a launcher and the script) with
/// gpuprof options `opts`.
fn record_slow_imports_via(
    out: &Path,
    opts: &[&str],
    first: impl AsRef<OsStr>,
    second: impl AsRef<OsStr>,
    args: &[&str],
) -> (Value, f64) {
    let mut cmd = vec![OsStr::new("python3"), first.as_ref()];
    if !second.as_ref().is_empty() {
        cmd.push(second.as_ref());
    }
    cmd.extend(args.iter().map(OsStr::new));
    let (o, report) = record_cmd_with(out, opts, &cmd);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let imported: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("imported in "))
        .and_then(|x| x.split(' ').next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("the job prints its import time: {stdout}"));
    (report, imported)
}

/// Start-up as measured by the job itself: its import, plus the
/// interpreter's own start before it (well under a second).
fn assert_startup_is_the_import(report: &Value, imported: f64) {
    let startup = startup_note_s(report);
    assert!(
        startup >= 0.9 * imported && startup <= imported + 1.5,
        "start-up {startup} s, the import took {imported} s: {}",
        report["diagnosis"]
    );
}

/// The `main-process-preprocessing` finding of `slow_imports.py 2.0 2.0`:
/// its GPU time is the 2 s of batches, not the 4 s of computing in all.
fn batches_of_slow_imports(report: &Value) -> &Value {
    let f = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == "main-process-preprocessing")
        .unwrap_or_else(|| panic!("the batches are diagnosed: {}", report["findings"]));
    let gpu_s = f["gpu_time_s"].as_f64().unwrap();
    assert!((1.2..3.0).contains(&gpu_s), "{gpu_s} s: {f}");
    f
}

/// Without steps or a GPU, a start that is all imports (as `import torch`
/// from a cold page cache is: seconds of CPU and storage reads) is start-up,
/// told apart by the stacks (the import machinery's frames), and said so
/// — not batches prepared in the main process. Work after the imports is
/// still diagnosed, counted from where the imports end.
#[test]
fn slow_imports_are_start_up_not_batches() {
    let _g = serial();
    if let Some(why) = common::perf_refused() {
        skip!("start-up is read from stack samples: {why}");
    }
    let dir = common::test_dir();

    // Imports only: nothing to diagnose but the start-up.
    let (report, imported) = record_slow_imports(&dir.path().join("imports"), "2.0", "0");
    well_formed(&report);
    no_alarm(&report);
    assert_startup_is_the_import(&report, imported);

    // Imports, then 2 s of batches in the main thread.
    let (report, imported) = record_slow_imports(&dir.path().join("work"), "2.0", "2.0");
    well_formed(&report);
    let f = batches_of_slow_imports(&report);
    let method = f["gpu_time_method"].as_str().unwrap();
    assert!(method.contains("s of start-up (imports)"), "{method}");
    assert_startup_is_the_import(&report, imported);
    let stacks = f["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str())
        .find(|e| e.starts_with("Stack samples"))
        .unwrap_or_else(|| panic!("stack evidence: {f}"));
    assert!(stacks.contains("make_batch (slow_imports.py)"), "{stacks}");
}

/// The same job run by a launcher from its own module body (`runpy`, as
/// notebooks and wrappers run a program): the program's module body under
/// the launcher's is no import. Once, every sample of such a job was
/// counted as importing, and its 2 s of batches as none (0 s).
#[test]
fn a_script_run_by_a_launcher_is_not_an_import() {
    let _g = serial();
    if let Some(why) = common::perf_refused() {
        skip!("start-up is read from stack samples: {why}");
    }
    let dir = common::test_dir();
    let launch = test_script("launch.py");
    let script = test_script("slow_imports.py");
    let (report, imported) = record_slow_imports_via(
        &dir.path().join("launched"),
        &[],
        &launch,
        &script,
        &["2.0", "2.0"],
    );
    well_formed(&report);
    batches_of_slow_imports(&report);
    let main = &report["diagnosis"]["main_thread"];
    assert!(
        main["data_share"].as_f64().unwrap() > 0.6,
        "the batches are the data path: {main}"
    );
    assert_startup_is_the_import(&report, imported);
}

/// Without the in-process agent (`--python-frames py-spy`, as for an
/// interpreter it does not read), the native samples carry no Python
/// frames and py-spy's stacks tell the imports: the start-up is still the
/// import, and the batches after it are still diagnosed. Once, every
/// sample in the interpreter loop read as the program's code: no start-up,
/// and the import counted with the batches.
#[test]
fn without_the_agent_slow_imports_are_still_start_up() {
    let _g = serial();
    if let Some(why) = common::perf_refused() {
        skip!("start-up is read from stack samples: {why}");
    }
    let dir = common::test_dir();
    let script = test_script("slow_imports.py");
    let (report, imported) = record_slow_imports_via(
        &dir.path().join("py-spy"),
        &["--python-frames", "py-spy"],
        &script,
        "",
        &["2.0", "2.0"],
    );
    well_formed(&report);
    assert_startup_is_the_import(&report, imported);
    batches_of_slow_imports(&report);
}

/// An import whose body calls one function again and again (40 ms of CPU
/// each, 30 ms of its own between, as PyTorch's import registers its
/// operators): regular entries of one function, but inside an import,
/// where no training step runs. They are not taken for the steps (whose
/// first would end the start-up), and the start-up is still the whole
/// import. Under load, `CustomOpDef.__init__` of a job importing torch
/// once was.
#[test]
fn a_function_called_regularly_inside_an_import_is_no_step() {
    let _g = serial();
    if let Some(why) = common::perf_refused() {
        skip!("steps and start-up are read from stack samples: {why}");
    }
    let dir = common::test_dir();
    let (report, imported) =
        record_slow_imports_with(&dir.path().join("registers"), &["2.0", "0", "registers"]);
    well_formed(&report);
    assert!(
        !report["steps"]["name"]
            .as_str()
            .unwrap_or("")
            .starts_with("register ("),
        "{}",
        report["steps"]
    );
    no_alarm(&report);
    assert_startup_is_the_import(&report, imported);
}

/// `import torch` and a forward pass on the CPU, without a GPU: the
/// run is start-up and shutdown (PyTorch's static destructors), and no
/// finding blames batches or storage for it.
#[test]
fn importing_torch_is_start_up_and_shutdown() {
    let _g = serial();
    if let Some(why) = common::perf_refused() {
        skip!("start-up is read from stack samples: {why}");
    }
    let Some(py) = common::torch_python() else {
        skip!("no Python with PyTorch (GPUPROF_TEST_TORCH_PYTHON)");
    };
    let dir = common::test_dir();
    let code = "import torch, torch.nn as nn; print(nn.Linear(8, 8)(torch.zeros(1, 8)).shape)";
    let cmd = [py.as_os_str(), OsStr::new("-c"), OsStr::new(code)];
    let (_, report) = record_cmd(&dir.path().join("torch"), &cmd);
    well_formed(&report);
    for (id, _) in findings(&report) {
        // Other programs' CPU is a true finding on a busy machine (as
        // under scripts/ci-under-load.sh); nothing blames the job.
        assert!(
            ["low-sample-coverage", "cpu-taken-by-other-programs"].contains(&id.as_str()),
            "{}",
            report["findings"]
        );
    }
    assert!(startup_note_s(&report) > 0.0, "{}", report["diagnosis"]);
}

/// DataLoader workers started with `spawn` import PyTorch again before
/// their first batch: that is start-up too (it ends when the first batch
/// arrives), not an input pipeline that cannot keep up.
#[test]
fn spawned_workers_importing_is_start_up() {
    let _g = serial();
    if let Some(why) = common::perf_refused() {
        skip!("start-up is read from stack samples: {why}");
    }
    let Some(py) = common::torch_python() else {
        skip!("no Python with PyTorch (GPUPROF_TEST_TORCH_PYTHON)");
    };
    let dir = common::test_dir();
    let script = test_script("spawn_loader.py");
    let (o, report) = record_cmd(&dir.path().join("spawn"), &[&py, &script]);
    well_formed(&report);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let secs = |l: &str| l.split(' ').next().and_then(|x| x.parse::<f64>().ok());
    let first_batch: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("first batch after ").and_then(secs))
        .unwrap_or_else(|| panic!("the job prints its first batch: {stdout}"));
    let ready: Vec<f64> = stdout
        .lines()
        .filter_map(|l| l.split_once(" ready after ").and_then(|(_, x)| secs(x)))
        .collect();
    assert_eq!(
        ready.len(),
        2,
        "each worker prints when it is ready: {stdout}"
    );
    // The loop waits for the last worker's batches: the start lasts until
    // both are ready (on a busy machine, seconds apart).
    let last_ready = ready.iter().copied().fold(first_batch, f64::max);
    for (id, sev) in findings(&report) {
        assert!(
            sev == "info"
                || !["input-pipeline-bound", "too-few-workers", "io-bound"].contains(&id.as_str()),
            "{}",
            report["findings"]
        );
    }
    let startup = startup_note_s(&report);
    // Up to the first batch and both workers ready, their imports included
    // (the recording starts a little before the interpreter runs the file).
    assert!(
        startup >= 0.85 * first_batch && startup <= last_ready + 1.5,
        "start-up {startup} s, first batch after {first_batch} s, workers ready after {ready:?} s: {}",
        report["diagnosis"]
    );
}

#[test]
fn one_saturated_worker_is_input_bound_and_compare_shows_the_fix() {
    let _g = serial();
    let dir = common::test_dir();
    let before = dir.path().join("one-worker");
    let report = record(&before, ONE_WORKER_HEAVY);
    well_formed(&report);
    let (id, sev) = top(&report);
    assert!(
        id == "input-pipeline-bound" || id == "too-few-workers",
        "top finding {id}: {}",
        report["findings"]
    );
    assert_eq!(sev, "critical", "{}", report["findings"]);
    // The same through the report types.
    let typed = common::typed_report(&before);
    assert_eq!(
        (
            typed.findings[0].id.as_str(),
            typed.findings[0].severity.as_str()
        ),
        (id.as_str(), sev.as_str())
    );
    // With stack samples, the evidence names the augmentation function.
    if report["diagnosis"]["stacks_measured"] == true {
        let ev = top_finding(&report).2["evidence"].to_string();
        assert!(ev.contains("augment"), "{ev}");
    } else {
        eprintln!("no stack samples (perf refused?): the function is not named");
    }

    let after = dir.path().join("four-workers");
    let healthy = record(&after, HEALTHY);
    no_alarm(&healthy);

    // The job's output is the user's: save a log with a steps/s line.
    let log_a = dir.path().join("a.log");
    let log_b = dir.path().join("b.log");
    std::fs::write(&log_a, "70 steps in 4.00 s: 17.50 steps/s\n").unwrap();
    std::fs::write(&log_b, "150 steps in 3.10 s: 48.39 steps/s\n").unwrap();
    let o = Command::new(gpuprof())
        .arg("compare")
        .arg(&before)
        .arg(after.join("report.json"))
        .arg("--log-a")
        .arg(&log_a)
        .arg("--log-b")
        .arg(&log_b)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let fixed = text
        .lines()
        .find(|l| l.starts_with("findings fixed:"))
        .unwrap_or_default();
    assert!(fixed.contains(&id), "{id} should be fixed: {text}");
    assert!(text.contains("steps/s") && text.contains("17.50") && text.contains("48.39"));
    assert!(text.contains("worker CPU"), "{text}");

    let o = Command::new(gpuprof())
        .arg("compare")
        .arg("--markdown")
        .arg(&before)
        .arg(&after)
        .output()
        .unwrap();
    let md = String::from_utf8_lossy(&o.stdout);
    assert!(md.contains("| wall time |"), "{md}");
    // Other programs' CPU may be fixed too (a busy machine during the
    // first run): the line lists every finding fixed.
    let fixed_md = md
        .lines()
        .find(|l| l.starts_with("**Findings fixed:**"))
        .unwrap_or_default();
    assert!(fixed_md.contains(&id), "{md}");
}

#[test]
fn more_busy_workers_than_cores_is_oversubscription() {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    if cores > 8 {
        skip!("{cores} cores would need {} busy workers", 3 * cores);
    }
    let _g = serial();
    let dir = common::test_dir();
    let out = dir.path().join("oversubscribed");
    let workers = (3 * cores).to_string();
    let steps = (60 * cores).to_string();
    let report = record(
        &out,
        &[
            "--workers",
            &workers,
            "--augment-ms",
            "30",
            "--gpu-ms",
            "5",
            "--steps",
            &steps,
        ],
    );
    well_formed(&report);
    let (id, sev) = top(&report);
    assert_eq!(id, "cpu-oversubscribed", "{}", report["findings"]);
    assert_ne!(sev, "info");
    let top = top_finding(&report).2;
    let fix = top["fix"].as_str().unwrap();
    assert!(
        fix.contains(&format!("`num_workers` from {workers}")),
        "{fix}"
    );
}

#[test]
fn compare_rejects_what_is_not_a_report() {
    let dir = common::test_dir();
    let o = Command::new(gpuprof())
        .arg("compare")
        .arg(dir.path())
        .arg(dir.path().join("missing"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("not a gpuprof output folder"), "{err}");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"x\": 1}").unwrap();
    let o = Command::new(gpuprof())
        .arg("compare")
        .arg(&bad)
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a gpuprof report.json"));
    // A newer schema than this build knows: refused, naming both versions.
    let newer = dir.path().join("newer.json");
    std::fs::write(&newer, "{\"schema_version\": 999, \"duration_s\": 1.0}").unwrap();
    let o = Command::new(gpuprof())
        .arg("compare")
        .arg(&newer)
        .arg(&newer)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("schema_version 999") && err.contains("upgrade gpuprof"),
        "{err}"
    );
    assert!(err.contains("newer.json"), "{err}");
    // A required field missing: named, with the file (no panic).
    let partial = dir.path().join("partial.json");
    std::fs::write(&partial, "{\"schema_version\": 1}").unwrap();
    let o = Command::new(gpuprof())
        .arg("compare")
        .arg(&partial)
        .arg(&partial)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("missing field") && err.contains("partial.json"),
        "{err}"
    );
    let o = Command::new(gpuprof())
        .args(["compare", "a", "b", "--steps-regex", "([0-9"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("not a valid regex"), "{err}");
}

#[test]
fn doctor_without_a_driver_reports_it_and_checks_the_rest() {
    let dir = common::test_dir();
    let data = dir.path().join("data.bin");
    std::fs::write(&data, vec![7u8; 1 << 20]).unwrap();
    let o = Command::new(gpuprof())
        .arg("doctor")
        .arg("--data")
        .arg(&data)
        .env_remove("GPUPROF_NVML_LIB")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    if Path::new("/dev/nvidiactl").exists() {
        skip!("the no-driver assertions: this machine has an NVIDIA driver");
    }
    assert_eq!(o.status.code(), Some(1), "a problem gives exit 1: {text}");
    let gpu = text
        .lines()
        .find(|l| l.contains("no NVIDIA driver"))
        .unwrap_or_else(|| panic!("no driver line: {text}"));
    assert!(gpu.contains("PROBLEM"), "{gpu}");
    assert!(text.contains("fix: install the NVIDIA driver"), "{text}");
    for area in ["cpu", "memory", "data", "python"] {
        assert!(
            text.lines().any(|l| l.contains(&format!("] {area}"))),
            "{area} was not checked: {text}"
        );
    }
    assert!(text.contains("filesystem at"), "{text}");

    let o = Command::new(gpuprof())
        .args(["doctor", "--data", "/nonexistent/gpuprof-data"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--data /nonexistent/gpuprof-data"), "{err}");
}

#[test]
fn every_finding_has_a_docs_section() {
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/findings.md"))
            .unwrap();
    for k in gpuprof::diagnose::FindingKind::ALL {
        assert!(
            docs.lines().any(|l| l == format!("## {}", k.id())),
            "docs/findings.md has no section for {}",
            k.id()
        );
        assert_eq!(gpuprof::diagnose::FindingKind::from_id(k.id()), Some(k));
    }
}

#[test]
fn throttled_reads_are_io_bound() {
    let _g = serial();
    let dir = common::test_dir();
    let disk = match SlowDisk::new(
        dir.path(),
        DiskOptions {
            data_mb: 24,
            read_bps: Some(5 << 20),
            rotational: true,
            ..Default::default()
        },
    ) {
        Ok(d) => d,
        Err(why) => {
            skip!("the IO-bound scenario: {why}");
        }
    };
    let out = dir.path().join("io");
    let cg = disk.cgroup.as_ref().unwrap();
    let script = format!("echo $$ > {}/cgroup.procs && exec \"$@\"", cg.display());
    let o = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .arg(gpuprof())
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg("python3")
        .arg(sim())
        .args([
            "--workers",
            "2",
            "--augment-ms",
            "2",
            "--gpu-ms",
            "10",
            "--steps",
            "16",
            "--read-mb",
            "1",
            "--data",
        ])
        .arg(disk.mnt.join("data"))
        .env_remove("GPUPROF_NVML_LIB")
        .output()
        .unwrap();
    let report = check_recorded(&o, &out);
    well_formed(&report);
    let (id, sev) = top(&report);
    assert_eq!(id, "io-bound", "{}", report["findings"]);
    assert_eq!(sev, "critical", "{}", report["findings"]);
    let f = &top_finding(&report).2;
    let ev = f["evidence"].to_string();
    assert!(ev.contains("D state"), "{ev}");
    // The data file's filesystem is named from the open files.
    assert!(ev.contains(disk.mnt.to_str().unwrap()), "{ev}");
    // The disk says it is rotational: slow-storage, with io-bound's cost.
    let slow = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == "slow-storage")
        .unwrap_or_else(|| panic!("no slow-storage: {}", report["findings"]));
    assert_eq!(slow["severity"], f["severity"], "{slow}");
    assert_eq!(slow["gpu_time_s"], f["gpu_time_s"], "{slow}");
    let sev = slow["evidence"].to_string();
    assert!(sev.contains("rotational"), "{sev}");
    drop(disk);
}

/// The maps and open-files collector on a real process: stand-in shared
/// objects with the real names (built here with gcc) and a data file held
/// open show up in report.json `environment` and in summary.md.
#[test]
fn libraries_and_data_files_of_the_job_are_recorded() {
    let _g = serial();
    let dir = common::test_dir();
    let c = dir.path().join("empty.c");
    std::fs::write(&c, "int stand_in(void) { return 0; }\n").unwrap();
    let mut libs = Vec::new();
    for name in ["libtorch_cpu.so", "libcudart.so.12.4.127"] {
        let so = dir.path().join(name);
        let ok = Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&so)
            .arg(&c)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            skip!("gcc cannot build a shared object here");
        }
        libs.push(so);
    }
    let data = dir.path().join("shard-0000.bin");
    std::fs::write(&data, vec![1u8; 1 << 20]).unwrap();
    let out = dir.path().join("env");
    let script = "import ctypes, sys, time\n\
                  ctypes.CDLL(sys.argv[1]); ctypes.CDLL(sys.argv[2])\n\
                  f = open(sys.argv[3], 'rb'); f.read(); time.sleep(2.5)\n";
    let o = Command::new(gpuprof())
        .arg("-o")
        .arg(&out)
        .args(["--", "python3", "-c", script])
        .arg(&libs[0])
        .arg(&libs[1])
        .arg(&data)
        .output()
        .unwrap();
    let report = check_recorded(&o, &out);
    let env = &report["environment"];
    assert_eq!(env["libraries_recorded"], true, "{env}");
    let fw = &env["frameworks"][0];
    assert_eq!(fw["name"], "PyTorch", "{env}");
    assert_eq!(fw["cuda"], true, "libcudart is mapped too: {env}");
    let rt = &env["cuda_runtimes"][0];
    assert_eq!(
        (rt["major"].as_u64(), rt["minor"].as_u64()),
        (Some(12), Some(4))
    );
    let fs = env["data_filesystems"].as_array().unwrap();
    assert!(
        fs.iter()
            .any(|f| f["example"] == data.to_str().unwrap() && f["bytes"] == 1 << 20),
        "{env}"
    );
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("## Software and data"), "{summary}");
    assert!(summary.contains("CUDA runtime 12.4"), "{summary}");
}

/// A busy loop started outside the job's tree, pinned to the job's CPU,
/// takes about half of the job's runnable time. The diagnosis names it
/// (its command, pid and user) with the share it took, within 15 points of
/// what the hog's own CPU time over the job's window implies (the job
/// reads the hog's /proc/PID/stat at its start and end; it is always
/// runnable, so the hog's CPU share of that window is the share it took).
/// Both are pinned to one CPU so that the hog's CPU was the job's to lose;
/// other load on that CPU (builds) lowers both figures alike. ~8 s.
#[test]
fn a_cpu_hog_outside_the_job_is_named_with_its_share() {
    let _g = serial();
    let cpu = (std::thread::available_parallelism().map_or(1, |n| n.get()) - 1).to_string();
    let mut hog = Command::new("taskset")
        .args(["-c", &cpu, "sh", "-c", "while :; do :; done"])
        .spawn()
        .expect("taskset runs");
    let hog_pid = hog.id().to_string();
    let dir = common::test_dir();
    let out = dir.path().join("hogged");
    let script = test_script("hogged_job.py");
    let (o, r) = record_cmd(
        &out,
        &[
            OsStr::new("taskset"),
            OsStr::new("-c"),
            OsStr::new(&cpu),
            OsStr::new("python3"),
            script.as_os_str(),
            OsStr::new(&hog_pid),
            OsStr::new("6"),
        ],
    );
    let _ = hog.kill();
    let _ = hog.wait();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let implied: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("hog share "))
        .and_then(|x| x.trim().parse().ok())
        .unwrap_or_else(|| panic!("the job prints the hog's share: {stdout}"));
    let f = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == "cpu-taken-by-other-programs")
        .unwrap_or_else(|| panic!("no finding for the hog: {}", r["findings"]));
    let all = r["other_programs"]["processes"].as_array().unwrap();
    let p = all
        .iter()
        .find(|p| p["pid"].as_i64().map(|x| x.to_string()) == Some(hog_pid.clone()))
        .unwrap_or_else(|| panic!("{}", r["other_programs"]));
    // Named among the (at most three) processes of the finding, unless on
    // a shared machine (or under scripts/ci-under-load.sh) three others
    // took more than it did.
    let named = f["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str())
        .any(|e| {
            e.contains(&format!("(pid {hog_pid}, user ")) && e.contains("while :; do :; done")
        });
    let took = |p: &Value| p["took_s"].as_f64().unwrap_or(0.0);
    let above = all.iter().filter(|q| took(q) > took(p)).count();
    assert!(named || above >= 3, "{above} took more: {f}");
    let share = p["share_of_runnable"].as_f64().unwrap();
    assert!(
        (share - implied).abs() <= 0.15,
        "reported {share}, the hog's own CPU implies {implied}: {p}"
    );
    well_formed(&r);
}

#[test]
fn the_report_check_refuses_what_the_schema_does_not_allow() {
    // The helper every test reads report.json through must fail on a
    // report that does not match docs/report.schema.json.
    let p = Path::new("broken/report.json");
    for bad in [
        serde_json::json!({"schema_version": 1}),
        serde_json::json!({"kind": "merge", "schema_version": 1, "nodes": "x"}),
    ] {
        let r = std::panic::catch_unwind(|| common::check_report_json(&bad, p));
        assert!(r.is_err(), "{bad} passed the schema check");
    }
}
