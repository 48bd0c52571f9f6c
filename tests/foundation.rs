//! The launcher, process tree, /proc collection, recording and exporters,
//! tested by running the real binary on real processes.

#[macro_use]
mod common;

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("gpuprof-test-")
        .tempdir()
        .unwrap()
}

#[test]
fn exit_code_passes_through() {
    let d = tmp();
    let (out, o) = record(d.path(), "o", &[], &["sh", "-c", "exit 3"]);
    assert_eq!(o.status.code(), Some(3));
    let r = report(&out);
    assert_eq!(r["exit_code"], 3);
    assert_eq!(r["complete"], true);
}

#[test]
fn death_by_signal_is_128_plus_signal() {
    let d = tmp();
    let (out, o) = record(d.path(), "o", &[], &["sh", "-c", "kill -9 $$"]);
    assert_eq!(o.status.code(), Some(137));
    assert_eq!(report(&out)["exit_code"], 137);
}

#[test]
fn missing_command_is_127_and_named() {
    let d = tmp();
    let (out, o) = record(d.path(), "o", &[], &["does-not-exist-gpuprof"]);
    assert_eq!(o.status.code(), Some(127));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("does-not-exist-gpuprof"), "stderr: {err}");
    assert!(
        !out.exists(),
        "no output folder is left for a job that never ran"
    );
}

#[test]
fn not_executable_is_126() {
    let d = tmp();
    let script = d.path().join("script.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    let (_, o) = record(d.path(), "o", &[], &[script.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(126));
    assert!(String::from_utf8_lossy(&o.stderr).contains("script.sh"));
}

#[test]
fn unwritable_output_stops_before_the_job_runs() {
    let d = tmp();
    let marker = d.path().join("job-ran");
    // A regular file where a folder is needed: unwritable even for root.
    let blocker = d.path().join("file");
    std::fs::write(&blocker, "x").unwrap();
    let bad = blocker.join("out");
    let o = gpuprof()
        .arg("-o")
        .arg(&bad)
        .arg("--")
        .args(["sh", "-c", &format!("touch {}", marker.display())])
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(0));
    assert!(
        !marker.exists(),
        "the job must not run when the output folder is unusable"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("-o"), "error should say how to fix it: {err}");
}

#[test]
fn stdin_passes_through_unchanged() {
    let d = tmp();
    let input: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut child = gpuprof()
        .arg("-q")
        .arg("-o")
        .arg(d.path().join("o"))
        .args(["--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let data = input.clone();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let o = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert!(o.stdout == input, "stdout differs from stdin");
    check_outputs(&d.path().join("o"));
}

#[test]
fn sigpipe_default_in_job() {
    // `yes | head -1` ends because `yes` dies of SIGPIPE; under gpuprof the
    // job must see the same default disposition.
    let d = tmp();
    let (_, o) = record(
        d.path(),
        "o",
        &[],
        &["sh", "-c", "yes | head -1 >/dev/null; echo done"],
    );
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "done");
}

fn wait_for(cond: impl Fn() -> bool, limit: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn ctrl_c_reaches_the_job_and_outputs_are_complete() {
    let d = tmp();
    let out = d.path().join("o");
    let log = d.path().join("activity.log");
    let child = gpuprof()
        .arg("-q")
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg("python3")
        .arg(sample("train_sim.py"))
        .args([
            "--workers",
            "2",
            "--steps",
            "100000",
            "--gpu-ms",
            "5",
            "--augment-ms",
            "2",
            "--activity-log",
        ])
        .arg(&log)
        .stdout(Stdio::piped())
        .process_group(0) // its own group, like a terminal's foreground job
        .spawn()
        .unwrap();
    let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
    // Wait until the job is really training (its first steps are logged).
    assert!(
        wait_for(
            || std::fs::read_to_string(&log)
                .map(|s| s.lines().count() > 40)
                .unwrap_or(false),
            Duration::from_secs(20)
        ),
        "job did not start"
    );
    nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGINT).unwrap();
    let o = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("interrupted: stopped cleanly"),
        "the job's own handler ran: {stdout}"
    );
    assert_eq!(
        o.status.code(),
        Some(130),
        "gpuprof exits with the job's status"
    );
    let r = report(&out);
    assert_eq!(r["exit_code"], 130);
    assert_eq!(r["complete"], true);
    assert!(
        r["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["role"] == "worker")
            .count()
            >= 2,
        "{r:#}"
    );
    check_trace(&out.join("trace.json"));
    assert!(out.join("summary.md").is_file());
}

#[test]
fn sigterm_to_gpuprof_reaches_the_job() {
    let d = tmp();
    let out = d.path().join("o");
    let ready = d.path().join("ready");
    let script = format!(
        "trap 'echo got-term; exit 42' TERM; touch {}; while :; do sleep 0.05; done",
        ready.display()
    );
    let child = gpuprof()
        .arg("-q")
        .arg("-o")
        .arg(&out)
        .args(["--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_for(|| ready.exists(), Duration::from_secs(10)),
        "job did not start"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("got-term"));
    assert_eq!(o.status.code(), Some(42));
    assert_eq!(report(&out)["exit_code"], 42);
}

/// Slurm's step daemon signals every process of the step, gpuprof and the
/// job alike: by default gpuprof does not pass such a signal on, so the
/// job's handler (here a SIGUSR1 checkpoint handler) runs once. With
/// `--forward-signals always` it runs twice, which the default avoids.
#[test]
fn a_signal_slurmstepd_sends_to_every_process_reaches_the_job_once() {
    for (mode, expect) in [("auto", 1), ("always", 2)] {
        let d = tmp();
        let out = d.path().join("o");
        let ready = d.path().join("ready");
        let job = format!(
            "import os, signal, time\n\
             got = []\n\
             signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))\n\
             open({:?}, 'w').write(str(os.getpid()))\n\
             while not got: time.sleep(0.01)\n\
             time.sleep(1.5)\n\
             print('checkpoints', len(got))\n",
            ready.to_str().unwrap()
        );
        let child = gpuprof()
            .args(["-q", "--no-stacks", "--forward-signals", mode, "-o"])
            .arg(&out)
            .args(["--", "python3", "-c", &job])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        assert!(
            wait_for(
                || std::fs::read_to_string(&ready).is_ok_and(|s| !s.is_empty()),
                Duration::from_secs(20)
            ),
            "job did not start"
        );
        let job_pid = std::fs::read_to_string(&ready).unwrap();
        // A stand-in named slurmstepd (a script's process is named after
        // it): the job first, then gpuprof, as a step's processes are. It
        // stays alive afterwards, as slurmstepd does for the whole step
        // (gpuprof names the sender from /proc).
        let stepd = d.path().join("slurmstepd");
        std::fs::write(
            &stepd,
            "#!/bin/sh\nkill -USR1 \"$1\"; sleep 0.3; kill -USR1 \"$2\"; sleep 2\n",
        )
        .unwrap();
        std::fs::set_permissions(&stepd, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let st = std::process::Command::new(&stepd)
            .arg(job_pid.trim())
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert!(st.success());
        let o = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{mode}: {stdout}");
        assert!(
            stdout.contains(&format!("checkpoints {expect}")),
            "--forward-signals {mode}: {stdout}"
        );
    }
}

/// GNU `timeout` (without `--foreground`) sends its signal to gpuprof and
/// then to its whole process group, the job included: by default gpuprof
/// keeps its copy back and says so, and the job's handler runs once. With
/// `--foreground` timeout signals gpuprof alone, which passes it on.
/// (`--forward-signals always` is not run here: its second copy follows
/// the first by microseconds, and the kernel, or Python running its
/// handler once for both, may merge the two, so the count is not fixed;
/// the slurmstepd test above shows a second copy with a gap.)
#[test]
fn a_signal_from_timeout_reaches_the_job_once() {
    for foreground in [false, true] {
        let d = tmp();
        let out = d.path().join("o");
        // Waits at most 8 s for the signal: a job that never gets it
        // prints 0.
        let job = "import signal, time\n\
                   got = []\n\
                   signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))\n\
                   end = time.monotonic() + 8\n\
                   while not got and time.monotonic() < end: time.sleep(0.01)\n\
                   time.sleep(1.5)\n\
                   print('checkpoints', len(got))\n";
        let mut cmd = std::process::Command::new("timeout");
        cmd.args(["-s", "USR1"]);
        if foreground {
            cmd.arg("--foreground");
        }
        let o = cmd
            .arg("3")
            .arg(BIN)
            .args(["--no-stacks", "--no-gpu", "-o"])
            .arg(&out)
            .args(["--", "python3", "-c", job])
            .stdin(Stdio::null())
            .output()
            .expect("GNU timeout (coreutils)");
        let stdout = String::from_utf8_lossy(&o.stdout);
        let stderr = String::from_utf8_lossy(&o.stderr);
        // 124: timed out, after the job ended on its own.
        assert_eq!(o.status.code(), Some(124), "{foreground}: {stdout}");
        assert!(
            stdout.contains("checkpoints 1"),
            "--foreground {foreground}: {stdout}"
        );
        let kept_back = stderr.contains("SIGUSR1 from timeout (pid ");
        assert_eq!(
            kept_back, !foreground,
            "--foreground {foreground}: {stderr}"
        );
        assert!(out.join("report.json").exists());
    }
}

/// The kernel reuses PIDs: a busy process that exited keeps its own
/// figures when a later process of the job gets its PID (merged, the later
/// one's counters replaced them).
#[test]
fn a_reused_pid_keeps_both_processes_figures() {
    let d = tmp();
    let script = repo().join("tests/scripts/pid_reuse.py");
    let (out, o) = record(
        d.path(),
        "o",
        &["--no-stacks"],
        &["python3", script.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let Some(pid) = stdout
        .trim()
        .strip_prefix("reused PID ")
        .and_then(|p| p.parse::<i64>().ok())
    else {
        skip!("the job could not make the kernel reuse a PID (needs root for /proc/sys/kernel/ns_last_pid): {stdout}");
    };
    let r = report(&out);
    let cpu_of = |list: &Value| -> Vec<f64> {
        list.as_array()
            .unwrap()
            .iter()
            .filter(|p| p["pid"] == pid)
            .map(|p| p["cpu_s"].as_f64().unwrap())
            .collect()
    };
    let now = cpu_of(&r["processes"]);
    assert!(
        now.len() == 1 && (now[0] - 0.5).abs() < 0.2,
        "later process: {now:?}"
    );
    let before = cpu_of(&r["processes_reused"]["listed"]);
    assert!(
        before.len() == 1 && (before[0] - 1.0).abs() < 0.25,
        "earlier process: {before:?} in {}",
        r["processes_reused"]
    );
    let roles: f64 = r["roles"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v["cpu_s"].as_f64().unwrap())
        .sum();
    assert!(
        roles >= now[0] + before[0],
        "role totals {roles} miss a process"
    );
    assert!(r["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|w| w.as_str().unwrap().contains("processes_reused")));
}

#[test]
fn cpu_time_of_a_busy_process_is_accurate() {
    let d = tmp();
    let burn = "import time\nt=time.process_time()\nwhile time.process_time()-t<2.0: pass\n";
    let (out, o) = record(d.path(), "o", &[], &["python3", "-c", burn]);
    assert_eq!(o.status.code(), Some(0));
    let r = report(&out);
    // The job may be a launcher (e.g. a pyenv shim) that execs python: the
    // busiest process is the one that burned the CPU.
    let cpu = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["cpu_s"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(
        (cpu - 2.0).abs() <= 0.3,
        "cpu_s = {cpu}, expected 2.0 ± 15%"
    );
    let thread_cpu: f64 = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["threads"].as_array().unwrap())
        .map(|t| t["cpu_s"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(thread_cpu > 1.5, "busiest thread {thread_cpu} s");
}

#[test]
fn write_bytes_of_an_fsynced_file() {
    let d = tmp();
    let f = d.path().join("big.bin");
    let script = format!(
        "import os\nfd=os.open('{}', os.O_WRONLY|os.O_CREAT)\nb=b'x'*(1<<20)\nfor _ in range(64): os.write(fd,b)\nos.fsync(fd)\nos.close(fd)\n",
        f.display()
    );
    let (out, o) = record(d.path(), "o", &[], &["python3", "-c", &script]);
    assert_eq!(o.status.code(), Some(0));
    let r = report(&out);
    let wb = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["write_bytes"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(wb >= 60 << 20, "write_bytes = {wb}");
}

#[test]
fn workers_are_found_and_named() {
    let d = tmp();
    let (out, o) = record(
        d.path(),
        "o",
        &[],
        &[
            "python3",
            sample("train_sim.py").to_str().unwrap(),
            "--workers",
            "3",
            "--steps",
            "40",
            "--gpu-ms",
            "5",
        ],
    );
    assert_eq!(o.status.code(), Some(0));
    let r = report(&out);
    let workers: Vec<_> = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == "worker")
        .collect();
    assert!(workers.len() >= 3, "workers: {workers:?}");
    assert!(r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["role"] == "main"));
    let t = check_trace(&out.join("trace.json"));
    let evs = t["traceEvents"].as_array().unwrap();
    for name in [
        "CPU %",
        "IO read MB/s",
        "RSS MB",
        "CPU busy %",
        "CPU iowait %",
    ] {
        assert!(
            evs.iter()
                .any(|e| counter_track(e).as_deref() == Some(name)),
            "no {name} counter"
        );
    }
    assert!(evs.iter().any(|e| counter_track(e)
        .is_some_and(|t| t.starts_with("pt_data_worker ") && t.ends_with(" CPU %"))));
}

#[test]
fn short_lived_children_are_in_the_tree() {
    let d = tmp();
    let (out, _) = record(
        d.path(),
        "o",
        &[],
        &["sh", "-c", "for i in 1 2 3; do sleep 0.3 & done; wait"],
    );
    let r = report(&out);
    let sleeps = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["comm"] == "sleep")
        .count();
    assert_eq!(sleeps, 3, "{r}");
}

#[test]
fn report_rebuilds_outputs_from_a_copied_recording() {
    let d = tmp();
    let (out, _) = record(
        d.path(),
        "o",
        &[],
        &[
            "python3",
            sample("train_sim.py").to_str().unwrap(),
            "--workers",
            "1",
            "--steps",
            "20",
        ],
    );
    let copy = d.path().join("copy");
    std::fs::create_dir_all(copy.join("recording")).unwrap();
    std::fs::copy(
        out.join("recording/events.jsonl.gz"),
        copy.join("recording/events.jsonl.gz"),
    )
    .unwrap();
    let o = gpuprof()
        .arg("report")
        .arg("-q")
        .arg(&copy)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    check_outputs(&copy);
    for f in ["trace.json", "report.json", "summary.md"] {
        let a = std::fs::read(out.join(f)).unwrap();
        let b = std::fs::read(copy.join(f)).unwrap();
        assert!(a == b, "{f} differs after gpuprof report");
    }
}

#[test]
fn truncated_recording_gives_partial_outputs_and_a_warning() {
    let d = tmp();
    let (out, _) = record(
        d.path(),
        "o",
        &[],
        &[
            "python3",
            sample("train_sim.py").to_str().unwrap(),
            "--workers",
            "2",
            "--steps",
            "60",
        ],
    );
    let ev = std::fs::read(out.join("recording/events.jsonl.gz")).unwrap();
    let cut = d.path().join("cut");
    std::fs::create_dir_all(cut.join("recording")).unwrap();
    std::fs::write(
        cut.join("recording/events.jsonl.gz"),
        &ev[..ev.len() * 2 / 3],
    )
    .unwrap();
    let o = gpuprof().arg("report").arg(&cut).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = report(&cut);
    assert_eq!(r["complete"], false);
    assert!(!r["warnings"].as_array().unwrap().is_empty());
    assert!(
        !r["processes"].as_array().unwrap().is_empty(),
        "the readable part is analysed"
    );
    check_trace(&cut.join("trace.json"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("readable part") || err.contains("end marker"),
        "{err}"
    );
}

#[test]
fn report_errors_are_one_clear_line() {
    let d = tmp();
    let check = |args: &[&std::ffi::OsStr], needle: &str| {
        let o = gpuprof().arg("report").args(args).output().unwrap();
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(err.contains(needle), "{err} should contain {needle}");
        assert!(!err.contains("panicked"));
    };
    check(&["/nonexistent/gpuprof".as_ref()], "no such directory");
    let empty = d.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    check(&[empty.as_os_str()], "not a gpuprof output folder");

    // A recording from a newer gpuprof.
    let newer = d.path().join("newer/recording");
    std::fs::create_dir_all(&newer).unwrap();
    let f = std::fs::File::create(newer.join("events.jsonl.gz")).unwrap();
    let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::default());
    gz.write_all(b"{\"k\":\"header\",\"format\":\"gpuprof-recording\",\"version\":99}\n")
        .unwrap();
    gz.finish().unwrap();
    check(&[d.path().join("newer").as_os_str()], "newer");

    // Garbage where the recording should be.
    let junk = d.path().join("junk/recording");
    std::fs::create_dir_all(&junk).unwrap();
    std::fs::write(junk.join("events.jsonl.gz"), b"not gzip at all").unwrap();
    check(
        &[d.path().join("junk").as_os_str()],
        "not a gpuprof recording",
    );
}

#[test]
fn duration_window_stops_recording_but_not_the_job() {
    let d = tmp();
    let marker = d.path().join("finished");
    let t = Instant::now();
    let (out, o) = record(
        d.path(),
        "o",
        &["--duration", "0.5s"],
        &[
            "sh",
            "-c",
            &format!("sleep 1.5; touch {}; exit 5", marker.display()),
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(5),
        "exit status of the job after the window"
    );
    assert!(marker.exists(), "the job ran to its end");
    assert!(t.elapsed() >= Duration::from_millis(1400));
    let r = report(&out);
    assert_eq!(r["stop_reason"], "duration elapsed");
    assert!(
        r["duration_s"].as_f64().unwrap() < 1.0,
        "{}",
        r["duration_s"]
    );
}

#[test]
fn trace_options_gzip_and_a_small_budget() {
    let d = tmp();
    let (out, o) = record(
        d.path(),
        "o",
        &["--trace-gzip", "--trace-max-size", "1MB"],
        &[
            "python3",
            "-c",
            "import time; t=time.time()\nwhile time.time()-t<1.5: pass",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.join("trace.json.gz").is_file());
    assert!(!out.join("trace.json").exists());
    // check_outputs (in record) read the gzip; its facts again:
    let facts = check_outputs(&out).expect("a trace");
    assert!(facts.bytes <= 1_000_000);
    let r = report(&out);
    assert_eq!(r["trace"]["path"], "trace.json.gz");
    assert_eq!(r["trace"]["gzip"], true);
    assert_eq!(r["trace"]["written"], true);
    assert_eq!(r["trace"]["budget_bytes"], 1_000_000);
    assert_eq!(r["trace"], {
        let mut m = facts.metadata["trace_budget"].clone();
        for (k, v) in [
            ("path", "trace.json.gz".into()),
            ("written", true.into()),
            ("gzip", true.into()),
        ] {
            m[k] = v;
        }
        m
    });
    // Rebuilt without gzip: trace.json replaces trace.json.gz.
    let o = gpuprof()
        .arg("report")
        .arg("-q")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.join("trace.json").is_file());
    assert!(!out.join("trace.json.gz").exists());
    check_outputs(&out);

    // A bad size is a one-line error naming the option.
    for (opt, v) in [
        ("--trace-max-size", "12 parsecs"),
        ("--flame-max-size", "10kB"),
    ] {
        let o = gpuprof()
            .arg("report")
            .arg(opt)
            .arg(v)
            .arg(&out)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(opt), "{err}");
    }
}
