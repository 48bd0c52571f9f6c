//! `gpuprof attach PID`: real jobs started by the test (so the test, not
//! gpuprof, is their parent and sees their exit status), recorded for a
//! window while they run.

#[macro_use]
mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn start_job(seconds: f64, late: f64, code: i32) -> Child {
    Command::new("python3")
        .arg(repo().join("tests/scripts/attach_job.py"))
        .args([seconds.to_string(), late.to_string(), code.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the job")
}

/// Wait until `pid` has at least `n` child processes.
fn wait_children(pid: u32, n: usize) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        let kids =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if kids.split_whitespace().count() >= n {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the job did not start its workers");
}

fn tracer_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:").map(|v| v.trim().to_string()))
        .unwrap_or_default()
}

#[test]
fn attach_records_the_running_tree_for_a_window_and_leaves_the_job_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("att");
    // Workers burn CPU for 3 s before gpuprof attaches; a third worker is
    // forked 4.5 s in, while it records; the job ends at 8 s with code 7.
    let mut job = start_job(8.0, 4.5, 7);
    let pid = job.id();
    wait_children(pid, 2);
    std::thread::sleep(Duration::from_secs(3));
    let g = gpuprof()
        .args(["attach", &pid.to_string(), "-q", "--duration", "3s", "-o"])
        .arg(&out)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(tracer_of(pid), "0", "attach must not ptrace the job");
    let o = g.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Detached: the job runs on and ends with its own status.
    assert!(
        job.try_wait().unwrap().is_none(),
        "the job must keep running after gpuprof detached"
    );
    let jo = job.wait_with_output().unwrap();
    assert_eq!(jo.status.code(), Some(7));
    assert!(String::from_utf8_lossy(&jo.stdout).contains("attach_job done"));

    let r = report(&out);
    assert_eq!(
        r["attached"]["pid"].as_u64(),
        Some(pid as u64),
        "{}",
        r["attached"]
    );
    assert!(r["attached"]["job_running_before_s"].as_f64().unwrap() >= 2.5);
    assert_eq!(r["job_status"], "still_running");
    let dur = r["duration_s"].as_f64().unwrap();
    assert!((2.5..4.5).contains(&dur), "window {dur} s");
    let procs = r["processes"].as_array().unwrap();
    let workers: Vec<_> = procs.iter().filter(|p| p["role"] == "worker").collect();
    assert_eq!(workers.len(), 3, "two workers and the late one: {procs:?}");
    for w in &workers {
        // One busy thread each: CPU within the window, not since the start.
        let cpu = w["cpu_s"].as_f64().unwrap();
        assert!(
            cpu <= dur * 1.1,
            "worker {} CPU {cpu} s > window {dur} s",
            w["pid"]
        );
    }
    let early_cpu: f64 = workers
        .iter()
        .map(|w| w["cpu_s"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(early_cpu > 0.3 * dur, "workers were busy: {early_cpu} s");
    let main = procs
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid as u64))
        .unwrap();
    assert_eq!(main["role"], "main");

    if r["stacks"]["samples"].as_u64().unwrap_or(0) == 0 {
        skip!("no stack samples: perf refused here");
    }
    let folded = std::fs::read_to_string(out.join("stacks-worker.folded")).unwrap();
    let total: u64 = folded
        .lines()
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum();
    let hot: u64 = folded
        .lines()
        .filter(|l| l.contains("crunch"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum();
    assert!(
        total > 0 && hot * 2 > total,
        "crunch in {hot} of {total} worker samples"
    );
    // The late worker was sampled too (inherited events).
    let late = workers
        .iter()
        .map(|w| w["pid"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(
        folded.contains(&format!("({late})")),
        "no samples of the worker started while attached ({late})"
    );
    check_trace(&out.join("trace.json"));
}

#[test]
fn a_killed_gpuprof_leaves_the_attached_job_running() {
    let tmp = tempfile::tempdir().unwrap();
    let job = start_job(4.0, 10.0, 5);
    let pid = job.id();
    wait_children(pid, 2);
    let mut g = gpuprof()
        .args(["attach", &pid.to_string(), "-q", "-o"])
        .arg(tmp.path().join("k"))
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    g.kill().unwrap();
    g.wait().unwrap();
    let jo = job.wait_with_output().unwrap();
    assert_eq!(
        jo.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&jo.stderr)
    );
}

fn attach_err(args: &[&str]) -> (Option<i32>, String) {
    let o = gpuprof().arg("attach").args(args).output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn attach_refuses_what_it_cannot_record_with_a_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("never");
    let o = out.to_str().unwrap();

    // A PID that does not exist (a child that was reaped).
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id().to_string();
    gone.wait().unwrap();
    let (code, err) = attach_err(&[&gone_pid, "-o", o]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("no process") && err.contains("namespace"),
        "{err}"
    );

    // PID 1 is an ancestor of gpuprof (typically a PID taken from inside a
    // container): recording it would record the whole machine.
    let (code, err) = attach_err(&["1", "-o", o]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("ancestor of gpuprof"), "{err}");

    let (code, err) = attach_err(&["train.py", "-o", o]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a process id"), "{err}");

    let (code, err) = attach_err(&["123", "-o", o, "--", "python3"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("takes no command"), "{err}");
    assert!(
        !Path::new(&out).exists(),
        "no output folder for a refused attach"
    );

    // Another user's process, without privileges: a clear refusal.
    let is_root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
    let runuser = Path::new("/usr/sbin/runuser").exists() || Path::new("/sbin/runuser").exists();
    if !is_root || !runuser {
        skip!("the permission check needs root and runuser to run gpuprof as `nobody`");
    }
    let mut victim = Command::new("sleep").arg("30").spawn().unwrap();
    let o = Command::new("runuser")
        .args(["-u", "nobody", "--", BIN, "attach"])
        .arg(victim.id().to_string())
        .args(["-o", "/tmp/gpuprof-attach-nobody-never"])
        .output()
        .unwrap();
    victim.kill().ok();
    victim.wait().ok();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("permission denied") && err.contains("sudo gpuprof attach"),
        "{err}"
    );
    assert!(!Path::new("/tmp/gpuprof-attach-nobody-never").exists());
}
