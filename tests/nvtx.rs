//! NVTX capture end to end: real programs using the NVTX v3 API, run under
//! the real gpuprof binary, checked in trace.json and report.json.

#[macro_use]
mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

fn nvtx_job(tmp: &std::path::Path) -> Result<std::path::PathBuf, String> {
    build_nvtx_program(
        &repo().join("tests/scripts/nvtx_job.c"),
        &tmp.join("nvtx_job"),
    )
}

/// (track name, slice name, ts, dur, args) of every X slice on NVTX tracks,
/// per pid.
fn nvtx_slices(trace: &Value) -> Vec<(i64, String, String, f64, f64, Value)> {
    let evs = trace["traceEvents"].as_array().unwrap();
    let mut names = std::collections::HashMap::new();
    for e in evs {
        if e["ph"] == "M" && e["name"] == "thread_name" {
            names.insert(
                (e["pid"].as_i64().unwrap(), e["tid"].as_i64().unwrap()),
                e["args"]["name"].as_str().unwrap().to_string(),
            );
        }
    }
    evs.iter()
        .filter(|e| e["ph"] == "X")
        .filter_map(|e| {
            let key = (e["pid"].as_i64()?, e["tid"].as_i64()?);
            let track = names.get(&key)?;
            track.starts_with("NVTX").then(|| {
                (
                    key.0,
                    track.clone(),
                    e["name"].as_str().unwrap().to_string(),
                    e["ts"].as_f64().unwrap(),
                    e["dur"].as_f64().unwrap(),
                    e["args"].clone(),
                )
            })
        })
        .collect()
}

fn group<'a>(report: &'a Value, domain: &str, name: &str) -> &'a Value {
    report["nvtx"]["ranges_by_name"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["domain"] == domain && g["name"] == name)
        .unwrap_or_else(|| panic!("no range group {domain:?}/{name:?} in {}", report["nvtx"]))
}

#[test]
fn c_program_ranges_nest_with_domains_threads_and_a_forked_child() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = match nvtx_job(tmp.path()) {
        Ok(p) => p,
        Err(why) => skip!("{why}"),
    };
    let (out, o) = record(
        tmp.path(),
        "out",
        &["--no-stacks", "--no-gpu"],
        &[prog.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let trace = check_trace(&out.join("trace.json"));
    let sl = nvtx_slices(&trace);
    let job_pid = job_process(&report(&out))["pid"].as_i64().unwrap();
    let find = |name: &str| -> Vec<&(i64, String, String, f64, f64, Value)> {
        sl.iter().filter(|s| s.2 == name).collect()
    };
    // Steps with their phases nested inside, on the main thread's track.
    for i in 0..3 {
        let step = find(&format!("step {i}"));
        assert_eq!(step.len(), 1, "step {i}: {sl:?}");
        let s = step[0];
        assert_eq!(s.0, job_pid);
        assert!(
            s.1.starts_with("NVTX ") && s.1.contains(&format!("({job_pid})")),
            "{}",
            s.1
        );
        let inside = |n: &str| {
            find(n)
                .iter()
                .filter(|c| c.1 == s.1 && c.3 >= s.3 && c.3 + c.4 <= s.3 + s.4 + 0.01)
                .count()
        };
        assert_eq!(inside("forward"), 1, "forward inside step {i}");
        assert_eq!(inside("backward ✓"), 1, "wide-string range inside step {i}");
    }
    // A domain of its own: registered string, category and payload; its
    // own track. The forked child uses the domain handle it inherited.
    let reg = find("my library: registered load");
    assert_eq!(reg.len(), 2, "{sl:?}");
    let parent = reg.iter().find(|s| s.0 == job_pid).expect("parent's range");
    let child = reg
        .iter()
        .find(|s| s.0 != job_pid)
        .expect("forked child's range");
    assert!(parent.1.starts_with("NVTX my library: "), "{}", parent.1);
    assert_eq!(parent.5["category"], "io");
    assert_eq!(parent.5["payload"], 42.0);
    assert_eq!(child.5["domain"], "my library");
    let cw = find("child work");
    assert_eq!(cw.len(), 1);
    assert_eq!(
        cw[0].0, child.0,
        "the child's ranges are on the child's process"
    );
    // Another thread, named with nvtxNameOsThread.
    let tw = find("thread work");
    assert_eq!(tw.len(), 2);
    assert!(tw[0].1.starts_with("NVTX loader thread ("), "{}", tw[0].1);
    // A start/end range ended on the other thread.
    let h = find("handed over");
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].1, "NVTX start/end ranges");
    assert!(h[0].5["ended on thread"].as_i64().is_some());
    // Still open when the process ended.
    let lo = find("left open");
    assert_eq!(lo.len(), 1);
    assert!(lo[0].5["end"].as_str().unwrap().contains("not seen"));
    // The mark.
    let evs = trace["traceEvents"].as_array().unwrap();
    assert!(evs
        .iter()
        .any(|e| e["ph"] == "i" && e["name"] == "checkpoint saved"));

    let r = report(&out);
    let n = &r["nvtx"];
    assert_eq!(n["captured"], true);
    assert_eq!(n["processes"], 2);
    assert_eq!(n["domains"], serde_json::json!(["my library"]));
    assert_eq!(n["recording"]["lost_in_job"], 0);
    assert_eq!(n["recording"]["unmatched"], 0);
    let steps = group(&r, "", "step N");
    assert_eq!(steps["count"], 3);
    assert_eq!(steps["distinct_names"], 3);
    assert_eq!(steps["level"], 0);
    let fwd = group(&r, "", "forward");
    assert_eq!(fwd["count"], 3);
    assert_eq!(fwd["level"], 1);
    // Each forward spins 20 ms.
    let p50 = fwd["p50_s"].as_f64().unwrap();
    assert!((0.019..0.5).contains(&p50), "forward p50 {p50}");
    assert!(fwd["max_s"].as_f64().unwrap() >= p50);
    assert!(fwd["gpu_busy_share"].is_null(), "GPU not measured");
    let regd = group(&r, "my library", "registered load");
    assert_eq!(regd["count"], 2);
    assert_eq!(regd["processes"], 2);
    assert_eq!(group(&r, "", "left open")["open"], 1);
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("## NVTX ranges"), "{summary}");
    assert!(summary.contains("`forward`: 3 ×"), "{summary}");
}

#[test]
fn another_tools_injection_is_left_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = gpuprof()
        .args(["-q", "--no-stacks", "--no-gpu", "-o"])
        .arg(&out)
        .args(["--", "sh", "-c", "echo \"inj=$NVTX_INJECTION64_PATH\""])
        .env(
            "NVTX_INJECTION64_PATH",
            "/opt/nsight/libToolsInjection64.so",
        )
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "inj=/opt/nsight/libToolsInjection64.so"
    );
    let r = report(&out);
    let cov = r["coverage"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["source"] == "nvtx")
        .unwrap();
    assert_eq!(cov["available"], false);
    assert!(cov["detail"]
        .as_str()
        .unwrap()
        .contains("already sets NVTX_INJECTION64_PATH"));
    assert_eq!(r["nvtx"]["captured"], false);

    // Without it, the job is given gpuprof's library; with --no-nvtx, none.
    let o = gpuprof()
        .args(["-q", "--no-stacks", "--no-gpu", "-o"])
        .arg(tmp.path().join("out2"))
        .args(["--", "sh", "-c", "echo \"inj=$NVTX_INJECTION64_PATH\""])
        .env_remove("NVTX_INJECTION64_PATH")
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(line.ends_with("/libgpuprof_nvtx.so"), "{line}");
    let o = gpuprof()
        .args(["-q", "--no-stacks", "--no-gpu", "--no-nvtx", "-o"])
        .arg(tmp.path().join("out3"))
        .args(["--", "sh", "-c", "echo \"inj=$NVTX_INJECTION64_PATH\""])
        .env_remove("NVTX_INJECTION64_PATH")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "inj=");
    for out in ["out2", "out3"] {
        check_outputs(&tmp.path().join(out));
    }
}

fn bench_line(stdout: &[u8]) -> f64 {
    let s = String::from_utf8_lossy(stdout);
    let med = s
        .split("median ")
        .nth(1)
        .and_then(|x| x.split(' ').next())
        .and_then(|x| x.parse::<f64>().ok());
    med.unwrap_or_else(|| panic!("no benchmark line in {s:?}"))
}

/// The cost of a push/pop pair on the job's thread, with and without
/// gpuprof's injection (Nsight Systems documents well under a microsecond
/// per call). Timed pair by pair; the median is robust to a loaded machine.
#[test]
fn push_pop_costs_well_under_a_microsecond() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = match nvtx_job(tmp.path()) {
        Ok(p) => p,
        Err(why) => skip!("{why}"),
    };
    // 10,000 pairs 50 µs apart: a high but realistic rate, which the
    // reader keeps up with (a ring holds ~4000 pairs).
    let args = ["bench", "10000", "50"];
    let mut without = Vec::new();
    let mut with = Vec::new();
    for i in 0..2 {
        let o = Command::new(&prog)
            .args(args)
            .env_remove("NVTX_INJECTION64_PATH")
            .output()
            .unwrap();
        without.push(bench_line(&o.stdout));
        let (out, o) = record(
            tmp.path(),
            &format!("b{i}"),
            &["--no-stacks", "--no-gpu"],
            &[prog.to_str().unwrap(), args[0], args[1], args[2]],
        );
        assert!(o.status.success());
        with.push(bench_line(&o.stdout));
        let r = report(&out);
        assert!(
            r["nvtx"]["ranges"].as_u64().unwrap() >= 10_000,
            "every pair was recorded: {}",
            r["nvtx"]
        );
    }
    let w = with.iter().cloned().fold(f64::INFINITY, f64::min);
    let wo = without.iter().cloned().fold(f64::INFINITY, f64::min);
    eprintln!("push/pop pair: {w:.1} ns under gpuprof, {wo:.1} ns without injection (median of 10000, best of 2)");
    assert!(w < 1000.0, "a push/pop pair costs {w} ns under gpuprof");
}

/// A real PyTorch loop marked with `torch.cuda.nvtx` (no GPU needed): its
/// steps are found automatically, the checkpoint every 5th step makes those
/// steps slow and is named as the cause, and the forked DataLoader
/// workers' ranges are theirs.
#[test]
fn torch_steps_with_a_slow_checkpoint_step_and_forked_worker_ranges() {
    let Some(py) = torch_python() else {
        skip!("no PyTorch test environment (see .ci/run)");
    };
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    let script = repo().join("tests/scripts/nvtx_steps.py");
    let (out, o) = record(
        tmp.path(),
        "out",
        &["--no-stacks", "--no-gpu", "--interval", "50ms"],
        &[
            py.to_str().unwrap(),
            script.to_str().unwrap(),
            "20",
            "5",
            ckpt.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = report(&out);
    let job = job_process(&r)["pid"].as_i64().unwrap();
    let workers: Vec<i64> = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == "worker")
        .map(|p| p["pid"].as_i64().unwrap())
        .collect();
    assert_eq!(workers.len(), 2, "{}", r["processes"]);

    // Ranges: the step with its phases, the workers' own ranges.
    assert_eq!(group(&r, "", "train_step")["count"], 20);
    assert_eq!(group(&r, "", "forward")["level"], 1);
    assert_eq!(group(&r, "", "save_checkpoint")["count"], 4);
    let load = group(&r, "", "load sample");
    assert_eq!(load["processes"], 2, "{load}");
    let trace = check_trace(&out.join("trace.json"));
    let sl = nvtx_slices(&trace);
    let load_pids: std::collections::BTreeSet<i64> = sl
        .iter()
        .filter(|s| s.2 == "load sample")
        .map(|s| s.0)
        .collect();
    assert_eq!(
        load_pids,
        workers.iter().copied().collect(),
        "each forked worker's ranges are on its own process"
    );
    assert!(sl.iter().any(|s| s.0 == job && s.2 == "train_step"));

    // Steps.
    let s = &r["steps"];
    assert_eq!(s["method"], "nvtx-range-auto", "{s}");
    assert_eq!(s["name"], "train_step");
    assert_eq!(s["count"], 20);
    let sps = s["steps_per_s"].as_f64().unwrap();
    assert!(sps > 0.5 && sps < 10.0, "{sps} steps/s");
    let p50 = s["time"]["p50_s"].as_f64().unwrap();
    assert!((0.1..0.3).contains(&p50), "median step {p50} s");
    // Every checkpoint step is slow and names the checkpoint. A loaded host
    // can make one more step slow (seen in CI: step 1's first backward
    // paging in libtorch, 0.10 s in D state); such a step is reported, but
    // must not be blamed on a checkpoint it did not have.
    let ckpt_steps = [4u64, 9, 14, 19];
    let mut slow: Vec<u64> = Vec::new();
    // Other slow steps that no other program's CPU use explains.
    let mut unexplained: Vec<u64> = Vec::new();
    for x in s["slow"].as_array().unwrap() {
        let i = x["index"].as_u64().unwrap();
        slow.push(i);
        let causes = x["causes"].as_array().unwrap();
        let has = |kind: &str, text: &str| {
            causes
                .iter()
                .any(|c| c["kind"] == kind && c["text"].as_str().unwrap().contains(text))
        };
        if ckpt_steps.contains(&i) {
            assert!(has("nvtx-range", "`save_checkpoint`"), "{x}");
            assert!(has("io", "wrote"), "{x}");
        } else {
            assert!(!has("nvtx-range", "`save_checkpoint`"), "{x}");
            if !has("other-program", "") {
                unexplained.push(i);
            }
        }
    }
    slow.sort();
    let extra: Vec<u64> = slow
        .iter()
        .copied()
        .filter(|i| !ckpt_steps.contains(i))
        .collect();
    // A loaded host makes more steps slow: those say which program took
    // the job's CPU; at most one step may be slow for no reason measured.
    assert!(
        ckpt_steps.iter().all(|i| slow.contains(i)) && unexplained.len() <= 1,
        "slow steps {slow:?}, unexplained {unexplained:?}: {s}"
    );
    match extra.len() {
        0 => assert_eq!(s["slow_pattern"], "every 5th step (steps 4, 9, …)", "{s}"),
        1 => assert_eq!(s["slow_pattern"], "mostly every 5th step", "{s}"),
        _ => {}
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("## Steps"), "{summary}");
    assert!(summary.contains("every 5th step"), "{summary}");
    assert!(
        !summary.contains("torch.cuda.nvtx.range_push(\"step\")"),
        "no hint when NVTX is used"
    );

    // Another step range, chosen at report time; a name that does not exist.
    let o = gpuprof()
        .args(["report", "-q", "--step-range", "forward", "-o"])
        .arg(tmp.path().join("rep"))
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r2 = report(&tmp.path().join("rep"));
    assert_eq!(r2["steps"]["method"], "nvtx-range");
    assert_eq!(r2["steps"]["name"], "forward");
    assert_eq!(r2["steps"]["count"], 20);
    let o = gpuprof()
        .args(["report", "-q", "--step-range", "no such range", "-o"])
        .arg(tmp.path().join("rep2"))
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success());
    let r3 = report(&tmp.path().join("rep2"));
    assert_eq!(r3["steps"]["method"], "nvtx-range-auto");
    assert!(r3["steps"]["notes"][0]
        .as_str()
        .unwrap()
        .contains("no NVTX range has this name"));

    // compare uses the measured steps/s.
    let o = gpuprof()
        .arg("compare")
        .arg(&out)
        .arg(tmp.path().join("rep"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}");
    assert!(text.contains("steps/s (measured)"), "{text}");
}

/// A job without NVTX: the summary says how to add a step range.
#[test]
fn a_job_without_nvtx_gets_the_two_line_hint() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, o) = record(
        tmp.path(),
        "out",
        &["--no-stacks", "--no-gpu"],
        &["python3", "-c", "import time; time.sleep(0.3)"],
    );
    assert!(o.status.success());
    let r = report(&out);
    assert_eq!(r["nvtx"]["captured"], true);
    assert_eq!(r["nvtx"]["ranges"], 0);
    let hint = r["steps"]["hint"].as_str().unwrap();
    assert!(
        hint.contains("torch.cuda.nvtx.range_push(\"step\")"),
        "{hint}"
    );
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("torch.cuda.nvtx.range_pop()"), "{summary}");
}

/// Without NVTX, steps come from the GPU's recurring idle gaps (an
/// input-bound job waits once per step): the rate matches the job's own.
/// At the real driver period (1/6 s) a wait shows as a fully idle gap only
/// when it spans two samples or more, so the job's steps wait ~450 ms each.
#[test]
fn without_nvtx_steps_come_from_the_gpus_idle_gaps() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("activity.log");
    let out = tmp.path().join("out");
    let o = gpuprof()
        .args(["-q", "--no-stacks", "-o"])
        .arg(&out)
        .args(["--", "python3"])
        .arg(sample("train_sim.py"))
        .args([
            "--workers",
            "1",
            "--augment-ms",
            "450",
            "--gpu-ms",
            "150",
            "--steps",
            "12",
        ])
        .env("GPUPROF_NVML_LIB", fake_nvml_dir().join("libfake_nvml.so"))
        .env(
            "FAKE_NVML_SCENARIO",
            repo().join("samples/gpu/activity.json"),
        )
        .env("GPUPROF_ACTIVITY_LOG", &log)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}");
    let job_rate: f64 = stdout
        .rsplit(": ")
        .next()
        .and_then(|x| x.split(' ').next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no rate in {stdout:?}"));
    let r = report(&out);
    let s = &r["steps"];
    if s["method"] != "gpu-idle-gaps" {
        let keep = std::env::temp_dir().join("gpuprof-nvtx-gaps-failure");
        let _ = std::fs::remove_dir_all(&keep);
        let _ = std::fs::rename(&out, &keep);
        panic!(
            "{s}\nGPU: {}\n(kept in {})",
            r["gpus"][0]["idle_gaps"],
            keep.display()
        );
    }
    let count = s["count"].as_u64().unwrap();
    assert!((9..=12).contains(&count), "{count} steps found of 12");
    let rate = s["steps_per_s"].as_f64().unwrap();
    // The truth is the period of the job's own GPU steps, from its activity
    // log: steps from one idle gap to the next are periods too. The job's
    // printed rate also counts its start-up (the worker's first batch):
    // on a loaded CI host the job printed 1.65 steps/s against 2.185
    // estimated, where the steady period is ~2.2 a second.
    let logged = activity_steps(&log);
    let (first, last) = (logged[0].0, logged[logged.len() - 1].0);
    let log_rate = (logged.len() - 1) as f64 / ((last - first) as f64 / 1e9);
    assert!(
        (rate / log_rate - 1.0).abs() < 0.2,
        "estimated {rate} steps/s, the job's activity log {log_rate:.3} (it printed {job_rate})"
    );
    assert!(
        s["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("estimated")),
        "{s}"
    );
    assert!(s["hint"].as_str().unwrap().contains("range_push"));
}
