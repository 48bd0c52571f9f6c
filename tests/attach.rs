//! `gpuprof attach PID`: real jobs started by the test (so the test, not
//! gpuprof, is their parent and sees their exit status), recorded for a
//! window while they run.

#[macro_use]
mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn start_job(ctl: &Path, code: i32) -> Child {
    Command::new("python3")
        .arg(repo().join("tests/scripts/attach_job.py"))
        .arg(ctl)
        .arg(code.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the job")
}

fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Wait until `pid` has at least `n` child processes; returns them.
fn wait_children(pid: u32, n: usize) -> Vec<u32> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        let kids = children(pid);
        if kids.len() >= n {
            return kids;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the job did not start its workers");
}

/// CPU seconds (user + system) a process has used since it started.
fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields after the command: state is 0, utime 11, stime 12.
    (ticks(11) + ticks(12)) / 100.0
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
    let ctl = tmp.path();
    let mut job = start_job(ctl, 7);
    let pid = job.id();
    let early = wait_children(pid, 2);
    // Let the workers use CPU before gpuprof attaches, so that totals since
    // their start and figures of the window differ clearly (the wait
    // adapts to a busy machine).
    let t = Instant::now();
    while early.iter().any(|w| cpu_s(*w) < 0.5) && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let before: Vec<f64> = early.iter().map(|w| cpu_s(*w)).collect();
    let g = gpuprof()
        .args(["attach", &pid.to_string(), "-q", "--duration", "3s", "-o"])
        .arg(&out)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    // A worker that starts while gpuprof records.
    std::fs::write(ctl.join("fork-late"), b"").unwrap();
    let late = {
        let t = Instant::now();
        loop {
            let kids = children(pid);
            if let Some(k) = kids.iter().find(|k| !early.contains(k)) {
                break *k;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "no late worker");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    assert_eq!(tracer_of(pid), "0", "attach must not ptrace the job");
    let o = g.wait_with_output().unwrap();
    let after: Vec<f64> = early.iter().map(|w| cpu_s(*w)).collect();
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
    std::fs::write(ctl.join("stop"), b"").unwrap();
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
    assert!(r["attached"]["job_running_before_s"].as_f64().unwrap() > 0.0);
    assert_eq!(r["job_status"], "still_running");
    let procs = r["processes"].as_array().unwrap();
    let workers: Vec<_> = procs.iter().filter(|p| p["role"] == "worker").collect();
    assert_eq!(workers.len(), 3, "two workers and the late one: {procs:?}");
    assert!(workers
        .iter()
        .any(|w| w["pid"].as_u64() == Some(late as u64)));
    for (i, w) in early.iter().enumerate() {
        // The window's CPU, not the CPU since the worker started: at most
        // what /proc shows between just before attaching and just after
        // detaching (a tick of slack), and the CPU used before attaching is
        // far more than that slack.
        let p = workers
            .iter()
            .find(|p| p["pid"].as_u64() == Some(*w as u64))
            .expect("early worker in the report");
        let got = p["cpu_s"].as_f64().unwrap();
        let window = after[i] - before[i];
        assert!(
            before[i] >= 0.3,
            "worker {w} used {} s before attaching",
            before[i]
        );
        assert!(
            got <= window + 0.05,
            "worker {w}: {got} s reported, {window} s used during the window ({} s before it)",
            before[i]
        );
        assert!(got > 0.0, "worker {w}: no CPU in the window");
    }
    let main = procs
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid as u64))
        .unwrap();
    assert_eq!(main["role"], "main");
    check_trace(&out.join("trace.json"));

    if r["stacks"]["samples"].as_u64().unwrap_or(0) == 0 {
        skip!("no stack samples: perf refused here");
    }
    let folded = std::fs::read_to_string(out.join("stacks-worker.folded")).unwrap();
    // The native variant keeps one tower per process.
    let native = std::fs::read_to_string(out.join("stacks-worker-native.folded")).unwrap();
    let count_in = |text: &str, f: &dyn Fn(&str) -> bool| -> u64 {
        text.lines()
            .filter(|l| f(l))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
            .sum()
    };
    let count = |f: &dyn Fn(&str) -> bool| count_in(&folded, f);
    let total = count(&|_| true);
    let hot = count(&|l| l.contains("crunch"));
    assert!(
        total > 0 && hot * 2 > total,
        "crunch in {hot} of {total} worker samples"
    );
    // No same-instant frames in a process that was already running: the
    // worker flamegraph names the function from py-spy's nearest stack,
    // and says so.
    let labelled = count(&|l| {
        l.contains("crunch") && l.contains("[python: py-spy, same stack before and after]")
    });
    assert_eq!(labelled, hot, "estimated frames without their label");
    assert_eq!(
        r["stacks"]["python"]["same_instant"].as_u64(),
        Some(0),
        "{}",
        r["stacks"]["python"]
    );
    assert!(r["stacks"]["python"]["py_spy_estimate"].as_u64().unwrap() >= hot);
    // The late worker was sampled too (it inherited the events).
    assert!(
        count_in(&native, &|l| {
            l.split(';')
                .next()
                .is_some_and(|root| root.ends_with(&format!("({late})")))
        }) > 0,
        "no samples of the worker started while attached ({late})"
    );
}

#[test]
fn a_killed_gpuprof_leaves_the_attached_job_running() {
    let tmp = tempfile::tempdir().unwrap();
    let ctl = tmp.path();
    let job = start_job(ctl, 5);
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
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(ctl.join("stop"), b"").unwrap();
    let jo = job.wait_with_output().unwrap();
    assert_eq!(
        jo.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&jo.stderr)
    );
    assert!(String::from_utf8_lossy(&jo.stdout).contains("attach_job done"));
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
