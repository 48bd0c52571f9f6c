//! The fault pass of issue 35: a job must behave exactly as without
//! gpuprof, and a recording must be complete or say what it lost. One test
//! per break that pass found, each failing before its fix; the job's own
//! output under gpuprof is compared with the same job run bare.

#[macro_use]
mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("gpuprof-faults-")
        .tempdir()
        .unwrap()
}

fn is_root() -> bool {
    // SAFETY: no arguments, no failure.
    unsafe { libc::geteuid() == 0 }
}

/// The system's CPython, which every user can run, when there is one.
fn system_python() -> Option<PathBuf> {
    let p = PathBuf::from("/usr/bin/python3");
    p.is_file().then_some(p)
}

/// A Python the agent samples (the one on PATH).
fn python() -> String {
    std::env::var("GPUPROF_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn write_script(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Wait for `child` at most `limit`; kill it (and say so) past that.
fn wait_within(child: &mut Child, limit: Duration, what: &str) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {limit:?} (a hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = Output {
        status: child.wait().unwrap(),
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    use std::io::Read;
    if let Some(mut s) = child.stdout.take() {
        s.read_to_end(&mut out.stdout).unwrap();
    }
    if let Some(mut s) = child.stderr.take() {
        s.read_to_end(&mut out.stderr).unwrap();
    }
    out
}

/// The Python processes of a run and whether the agent sampled each.
fn samplers(r: &serde_json::Value) -> Vec<String> {
    r["stacks"]["python"]["processes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| p["sampler"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Two gpuprofs given one `-o`: exactly one records, the other is refused
/// before its job starts, neither hangs, and the first's recording is
/// untouched. Once with the second arriving during the first's run, and
/// three times started together (the race that hung 2 runs in 3).
#[test]
fn two_runs_given_one_folder_one_is_refused_and_neither_hangs() {
    let d = tmp();
    let same = d.path().join("same");
    let marker = |n: &str| d.path().join(format!("job-{n}-ran"));
    let start = |n: &str, secs: &str| -> Child {
        gpuprof()
            .args(["-q", "--no-stacks", "-o"])
            .arg(&same)
            .args(["--", "sh", "-c"])
            .arg(format!("touch {}; sleep {secs}", marker(n).display()))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut first = start("a", "1.5");
    let t0 = Instant::now();
    while !same.join("recording/events.jsonl.gz").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "first run never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut second = start("b", "0");
    let o2 = wait_within(&mut second, Duration::from_secs(10), "second run");
    let err = String::from_utf8_lossy(&o2.stderr);
    assert_ne!(o2.status.code(), Some(0), "{err}");
    assert!(err.contains("already holds a recording"), "{err}");
    assert!(!marker("b").exists(), "the refused run's job ran");
    let o1 = wait_within(&mut first, Duration::from_secs(60), "first run");
    assert!(
        o1.status.success(),
        "{}",
        String::from_utf8_lossy(&o1.stderr)
    );
    let r = report(&same);
    assert_eq!(r["complete"], true);
    assert!(marker("a").exists());

    for round in 0..3 {
        let dir = d.path().join(format!("race-{round}"));
        let mut runs: Vec<Child> = (0..2)
            .map(|_| {
                gpuprof()
                    .args(["-q", "--no-stacks", "-o"])
                    .arg(&dir)
                    .args(["--", "sleep", "0.3"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let outs: Vec<Output> = runs
            .iter_mut()
            .map(|c| wait_within(c, Duration::from_secs(30), "a racing run"))
            .collect();
        let ok = outs.iter().filter(|o| o.status.success()).count();
        assert_eq!(
            ok,
            1,
            "round {round}: {:?}",
            outs.iter()
                .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                .collect::<Vec<_>>()
        );
        assert_eq!(report(&dir)["complete"], true, "round {round}");
    }
}

/// A job that closes every descriptor, opens a file (fd 3) and forks: the
/// child writes to fd 3. The agent's after-fork path must not close or take
/// that number.
#[test]
fn a_job_that_closes_its_descriptors_and_forks_keeps_its_file() {
    let d = tmp();
    let script = write_script(
        d.path(),
        "closerange_fork.py",
        r#"
import os, sys, time
os.closerange(3, 1 << 16)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
t = time.process_time()
while time.process_time() - t < 0.3:
    pass
pid = os.fork()
if pid == 0:
    try:
        os.write(fd, b"from the child\n")
        os._exit(0)
    except OSError as e:
        print("child: write failed:", e, flush=True)
        os._exit(3)
_, st = os.waitpid(pid, 0)
os.write(fd, b"from the parent\n")
print("fd", fd, "child exit", os.waitstatus_to_exitcode(st), flush=True)
"#,
    );
    let bare_file = d.path().join("bare.txt");
    let bare = Command::new(python())
        .arg(&script)
        .arg(&bare_file)
        .output()
        .unwrap();
    assert!(bare.status.success());
    let file = d.path().join("profiled.txt");
    let out = d.path().join("o");
    let o = gpuprof()
        .arg("-q")
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(python())
        .arg(&script)
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), bare.status.code());
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&bare.stdout)
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        std::fs::read_to_string(&bare_file).unwrap()
    );
    let r = report(&out);
    if !samplers(&r).iter().any(|s| s == "same-instant") {
        skip!(
            "the in-process agent did not sample this Python: {:?}",
            samplers(&r)
        );
    }
}

/// Threads that block every signal and wait with sigtimedwait() see no
/// signal of the agent's, and read back the mask they set.
#[test]
fn a_job_that_blocks_every_signal_sees_none_of_the_agents() {
    let d = tmp();
    let script = write_script(
        d.path(),
        "sigwait_all.py",
        r#"
import signal, threading, time
def burn(s):
    # CPU time in user space, where the samples are taken: a bare
    # process_time() loop spends most of it in the clock's system call.
    t = time.process_time()
    while time.process_time() - t < s:
        for _ in range(20000):
            pass
def blocked(out):
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    burn(0.3)
    out.append(sorted(int(s) for s in signal.sigpending()))
    out.append(signal.sigtimedwait(signal.valid_signals(), 0.1))
    out.append(signal.SIGTRAP in signal.pthread_sigmask(signal.SIG_BLOCK, []))
res = []
th = threading.Thread(target=blocked, args=(res,))
th.start(); th.join()
print("thread:", res)
signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
burn(0.4)
print("pending:", sorted(int(s) for s in signal.sigpending()))
print("sigtimedwait:", signal.sigtimedwait(signal.valid_signals(), 0.1))
print("mask has SIGTRAP:", signal.SIGTRAP in signal.pthread_sigmask(signal.SIG_BLOCK, []))
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTRAP])
print("after unblocking:", signal.SIGTRAP in signal.pthread_sigmask(signal.SIG_BLOCK, []))
burn(0.2)
signal.pthread_sigmask(signal.SIG_SETMASK, [])
print("done")
"#,
    );
    let bare = Command::new(python()).arg(&script).output().unwrap();
    assert!(bare.status.success());
    let bare_out = String::from_utf8_lossy(&bare.stdout).into_owned();
    assert!(bare_out.contains("sigtimedwait: None"), "{bare_out}");
    let out = d.path().join("o");
    let o = gpuprof()
        .arg("-q")
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(python())
        .arg(&script)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&o.stdout), bare_out);
    let r = report(&out);
    if !samplers(&r).iter().any(|s| s == "same-instant") {
        skip!(
            "the in-process agent did not sample this Python: {:?}",
            samplers(&r)
        );
    }
    // The agent sampled the job: at 99 Hz, ~0.9 s of CPU gives ~90 chances
    // for a SIGTRAP to be left pending.
    assert!(
        r["stacks"]["python"]["same_instant"].as_u64() > Some(20),
        "{}",
        r["stacks"]["python"]
    );
}

/// A root job that runs a process as another user (as `su`, `gosu`,
/// `runuser` and container entrypoints do): that process loads the agent
/// without a word on the job's stderr, and the report says it ran without
/// the agent.
#[test]
fn a_process_of_another_user_gets_no_loader_error() {
    if !is_root() {
        skip!("needs root to switch user");
    }
    let Some(py) = system_python() else {
        skip!("no /usr/bin/python3 that another user can run");
    };
    if Command::new("setpriv").arg("--version").output().is_err() {
        skip!("no setpriv");
    }
    let d = tmp();
    let out = d.path().join("o");
    let code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint('ran as', __import__('os').getuid())";
    let o = gpuprof()
        .arg("-q")
        .arg("-o")
        .arg(&out)
        .args([
            "--",
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ])
        .arg(&py)
        .args(["-c", code])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ran as 65534\n");
    assert!(
        !err.contains("ld.so"),
        "a loader line on the job's stderr: {err}"
    );
    assert!(
        err.trim().is_empty(),
        "the job wrote nothing to stderr: {err}"
    );
    let r = report(&out);
    let py_cov = r["coverage"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["source"] == "python-stacks")
        .expect("python-stacks coverage");
    assert!(
        py_cov["detail"]
            .as_str()
            .unwrap()
            .contains("1 Python process(es) ran without the in-process agent"),
        "{py_cov}"
    );
}

fn raise_own_fd_limit(to: u64) -> bool {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointers to a local.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 || rl.rlim_max < to {
            return false;
        }
        rl.rlim_cur = rl.rlim_cur.max(to);
        libc::setrlimit(libc::RLIMIT_NOFILE, &rl) == 0
    }
}

/// 1 100 idle connections to `--metrics-addr` from a local user, gpuprof
/// limited to 1 024 descriptors: the recording still sees the job's main
/// process and its CPU time (or says what it lost).
#[test]
fn idle_metrics_connections_do_not_starve_the_recording() {
    if !raise_own_fd_limit(4096) {
        skip!("this test process cannot hold 1 100 connections (hard descriptor limit)");
    }
    let d = tmp();
    let script = write_script(
        d.path(),
        "busy.py",
        r#"
import multiprocessing as mp, time
def burn(s):
    t = time.process_time()
    while time.process_time() - t < s:
        pass
if __name__ == "__main__":
    # The workers start once the connections are held.
    time.sleep(2.0)
    ps = [mp.Process(target=burn, args=(1.0,)) for _ in range(2)]
    for p in ps: p.start()
    burn(1.5)
    for p in ps: p.join()
"#,
    );
    let port = free_port();
    let out = d.path().join("o");
    let mut cmd = gpuprof();
    cmd.arg("-q")
        .arg("-o")
        .arg(&out)
        .arg("--metrics-addr")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--")
        .arg(python())
        .arg(&script)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let rl = libc::rlimit {
                rlim_cur: 1024,
                rlim_max: 1024,
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let t0 = Instant::now();
    let mut conns = Vec::new();
    while conns.is_empty() {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(c) => conns.push(c),
            Err(_) if t0.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("the metrics endpoint never listened: {e}"),
        }
    }
    // Idle: connected, nothing sent, for the 2 s before the job starts its
    // workers. Once gpuprof stops accepting, the kernel's listen queue
    // fills and further attempts time out: keep trying for 1.5 s.
    let tries = Instant::now();
    while conns.len() < 1100 && tries.elapsed() < Duration::from_millis(1500) {
        if let Ok(c) = std::net::TcpStream::connect_timeout(
            &(std::net::Ipv4Addr::LOCALHOST, port).into(),
            Duration::from_millis(20),
        ) {
            conns.push(c);
        }
    }
    let o = wait_within(&mut child, Duration::from_secs(90), "gpuprof");
    drop(conns);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let r = report(&out);
    let main = job_process(&r);
    let lost = r["complete"] == false
        && r["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap_or("").contains("file descriptors"));
    if !lost {
        assert_eq!(r["complete"], true, "{}", r["warnings"]);
        // 1.5 s burnt by the main process, read from /proc.
        assert!(
            main["cpu_s"].as_f64().unwrap() > 1.0,
            "main process CPU {} with complete: true",
            main["cpu_s"]
        );
        let workers = r["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["cpu_s"].as_f64().unwrap_or(0.0) > 0.5)
            .count();
        assert!(workers >= 3, "main and two workers seen busy: {workers}");
    }
}

/// Under an address-space limit too small for gpuprof's buffers of 40
/// Python processes: the job's exit status passes through, gpuprof does not
/// abort, and report.json says what was lost.
#[test]
fn a_memory_limit_degrades_the_profile_instead_of_aborting() {
    let d = tmp();
    let script = write_script(
        d.path(),
        "forty.py",
        r#"
import multiprocessing as mp, sys, time
def work(i):
    t = time.process_time()
    while time.process_time() - t < 0.05:
        pass
    time.sleep(2)
if __name__ == "__main__":
    ps = [mp.Process(target=work, args=(i,)) for i in range(40)]
    for p in ps: p.start()
    for p in ps: p.join()
    print("done", flush=True)
    sys.exit(7)
"#,
    );
    let out = d.path().join("o");
    let mut cmd = gpuprof();
    cmd.arg("-q")
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(python())
        .arg(&script);
    // 200 MB of address space: the job runs (each process has its own), and
    // gpuprof's 40 agent rings (2 MiB each) and allocations do not all fit.
    // SAFETY: setrlimit only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let rl = libc::rlimit {
                rlim_cur: 200 << 20,
                rlim_max: 200 << 20,
            };
            libc::setrlimit(libc::RLIMIT_AS, &rl);
            Ok(())
        });
    }
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(7), "the job's status: {err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "done\n");
    assert!(!err.contains("memory allocation"), "{err}");
    let r = read_json(&out.join("report.json"));
    assert_eq!(r["complete"], false, "{}", r["warnings"]);
    let cov = r["coverage"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["source"] == "gpuprof-resources")
        .expect("a coverage entry for what gpuprof lost");
    assert!(
        cov["detail"].as_str().unwrap().contains("ulimit -v"),
        "{cov}"
    );
    let leftovers: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".gpuprof-tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// `merge -o` never replaces another run's outputs, never counts one
/// recording twice, and a rank variable cannot move the default folder.
#[test]
fn merge_and_default_folders_stay_where_they_belong() {
    let d = tmp();
    let (r1, o) = record(d.path(), "r1", &["--no-stacks"], &["sleep", "0.2"]);
    assert!(o.status.success());
    let (r2, o) = record(d.path(), "r2", &["--no-stacks"], &["sleep", "0.1"]);
    assert!(o.status.success());
    let before = std::fs::read(r2.join("report.json")).unwrap();

    // Into another recorded run's folder: refused, nothing replaced.
    let o = gpuprof()
        .args(["merge", "-q"])
        .arg(&r1)
        .arg("-o")
        .arg(&r2)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("of another run"), "{err}");
    assert_eq!(std::fs::read(r2.join("report.json")).unwrap(), before);
    assert!(!r2.join(".gpuprof-merge").exists());

    // `gpuprof report r1 -o r2`: refused too; into a new folder, and into
    // the same one again, it writes.
    let o = gpuprof()
        .args(["report", "-q"])
        .arg(&r1)
        .arg("-o")
        .arg(&r2)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("another run's recording"), "{err}");
    assert_eq!(std::fs::read(r2.join("report.json")).unwrap(), before);
    let view = d.path().join("view");
    for _ in 0..2 {
        let o = gpuprof()
            .args(["report", "-q"])
            .arg(&r1)
            .arg("-o")
            .arg(&view)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }

    // Into a merged folder: refused as well.
    let m = d.path().join("m");
    let o = gpuprof()
        .args(["merge", "-q"])
        .arg(&r1)
        .arg("-o")
        .arg(&m)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let merged = std::fs::read(m.join("report.json")).unwrap();
    let o = gpuprof()
        .args(["merge", "-q"])
        .arg(&r1)
        .arg("-o")
        .arg(&m)
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(0));
    assert_eq!(std::fs::read(m.join("report.json")).unwrap(), merged);

    // One recording named twice, and a copy of it: one node.
    let copy = d.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    let status = Command::new("cp")
        .arg("-r")
        .arg(r1.join("recording"))
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    let m2 = d.path().join("m2");
    let o = gpuprof()
        .args(["merge", "-q"])
        .arg(&r1)
        .arg(r1.join("recording"))
        .arg(&copy)
        .arg("-o")
        .arg(&m2)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let r = read_json(&m2.join("report.json"));
    assert_eq!(r["nodes"].as_array().unwrap().len(), 1, "{err}");
    assert!(err.contains("the same recording as"), "{err}");

    // RANK=../../x: the default folder stays in the working directory.
    let work = d.path().join("work/sub");
    std::fs::create_dir_all(&work).unwrap();
    let o = gpuprof()
        .args(["-q", "--no-stacks", "--", "true"])
        .current_dir(&work)
        .env("RANK", "../../escaped")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!d.path().join("escaped").exists());
    assert!(!d.path().join("work/escaped").exists());
    let made: Vec<String> = std::fs::read_dir(&work)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(made.len(), 1, "{made:?}");
    assert!(
        made[0].starts_with("gpuprof-") && made[0].contains("-rank"),
        "{made:?}"
    );
    assert!(work.join(&made[0]).join("report.json").is_file());
}

/// A job whose printed output must be the same bare and under gpuprof.
const HELD_JOB: &str = r#"
import os, signal, sys, threading, time
mode = sys.argv[1]
def burn(s):
    t = time.process_time()
    while time.process_time() - t < s:
        pass
if mode == "itimers":
    # The job's own SIGALRM and SIGPROF timers: every signal reaches its
    # handlers, none of gpuprof's does.
    got = {"alrm": 0, "prof": 0, "other": []}
    signal.signal(signal.SIGALRM, lambda s, f: got.__setitem__("alrm", got["alrm"] + 1))
    signal.signal(signal.SIGPROF, lambda s, f: got.__setitem__("prof", got["prof"] + 1))
    for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTRAP):
        signal.signal(s, lambda s, f: got["other"].append(s))
    signal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)
    signal.setitimer(signal.ITIMER_PROF, 0.01, 0.01)
    burn(0.6)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.setitimer(signal.ITIMER_PROF, 0)
    print("alrm ok" if got["alrm"] >= 20 else got, "prof ok" if got["prof"] >= 20 else got, "other", got["other"])
elif mode == "eintr":
    # A blocking read interrupted by the job's own signal, without
    # SA_RESTART: exactly one EINTR-free retry by Python, same result.
    r, w = os.pipe()
    signal.signal(signal.SIGALRM, lambda s, f: os.write(w, b"x"))
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    burn(0.1)
    print("read", os.read(r, 1))
elif mode == "forks":
    codes = []
    for i in range(200):
        pid = os.fork()
        if pid == 0:
            os._exit(i % 7)
        codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    print("forks", sum(codes), len(codes))
elif mode == "threads":
    done = []
    def work(i):
        burn(0.001)
        done.append(i)
    ts = [threading.Thread(target=work, args=(i,)) for i in range(2000)]
    for t in ts: t.start()
    for t in ts: t.join()
    print("threads", len(done))
elif mode == "trace":
    calls = []
    sys.settrace(lambda f, e, a: calls.append(e) if e == "call" else None)
    def f(): return 1
    for _ in range(100): f()
    sys.settrace(None)
    print("traced calls", calls.count("call"))
    if sys.version_info >= (3, 12):
        m = sys.monitoring
        m.use_tool_id(3, "t")
        seen = []
        m.register_callback(3, m.events.PY_START, lambda c, o: seen.append(c.co_name))
        m.set_events(3, m.events.PY_START)
        for _ in range(50): f()
        m.set_events(3, 0)
        print("monitored", seen.count("f"))
"#;

/// A named job: its argv and the environment it adds.
type Case = (String, Vec<String>, Vec<(String, String)>);

/// The fault cases that held in the fault pass, kept: the job's own timers
/// and signals, EINTR, 200 forks, 2 000 threads, tracing and monitoring, a
/// user's own LD_PRELOAD, a static and a setuid binary, `ulimit -n 64`: the
/// same output and status as bare.
#[test]
fn fault_cases_that_held_still_hold() {
    let d = tmp();
    let script = write_script(d.path(), "held.py", HELD_JOB);
    let s = script.to_str().unwrap().to_string();
    let py = python();
    // The user's own preloaded library, which must still load.
    let mine = d.path().join("mine.c");
    std::fs::write(
        &mine,
        "#include <stdio.h>\n#include <stdlib.h>\n__attribute__((constructor)) static void hi(void) { if (getenv(\"SAY_MINE\")) fputs(\"mine loaded\\n\", stderr); }\n",
    )
    .unwrap();
    let so = d.path().join("libmine.so");
    let stat = d.path().join("static-hello");
    let hello = d.path().join("hello.c");
    std::fs::write(
        &hello,
        "#include <stdio.h>\nint main(void) { puts(\"static ok\"); return 3; }\n",
    )
    .unwrap();
    let gcc = |args: &[&str]| {
        Command::new("gcc")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    };
    let have_so = gcc(&[
        "-shared",
        "-fPIC",
        "-o",
        so.to_str().unwrap(),
        mine.to_str().unwrap(),
    ]);
    let have_static = gcc(&[
        "-static",
        "-o",
        stat.to_str().unwrap(),
        hello.to_str().unwrap(),
    ]);

    let mut cases: Vec<Case> = ["itimers", "eintr", "forks", "threads", "trace"]
        .iter()
        .map(|m| {
            (
                m.to_string(),
                vec![py.clone(), s.clone(), m.to_string()],
                vec![],
            )
        })
        .collect();
    if have_so {
        cases.push((
            "user LD_PRELOAD".into(),
            vec![py.clone(), s.clone(), "eintr".into()],
            vec![
                ("LD_PRELOAD".into(), so.to_str().unwrap().into()),
                ("SAY_MINE".into(), "1".into()),
            ],
        ));
    } else {
        note_skip("no gcc for the LD_PRELOAD case");
    }
    if have_static {
        cases.push((
            "static binary".into(),
            vec![stat.to_str().unwrap().into()],
            vec![],
        ));
    }
    if is_root() && Path::new("/usr/bin/chfn").is_file() {
        // setuid root: the loader ignores LD_PRELOAD paths for it, silently.
        cases.push((
            "setuid binary".into(),
            vec!["/usr/bin/chfn".into(), "--help".into()],
            vec![],
        ));
    }
    cases.push((
        "ulimit -n 64".into(),
        vec![
            "sh".into(),
            "-c".into(),
            format!("ulimit -n 64 && exec {py} {s} forks"),
        ],
        vec![],
    ));
    for (i, (name, argv, env)) in cases.iter().enumerate() {
        let bare = Command::new(&argv[0])
            .args(&argv[1..])
            .envs(env.iter().cloned())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let out = d.path().join(format!("o{i}"));
        let o = gpuprof()
            .arg("-q")
            .arg("-o")
            .arg(&out)
            .arg("--")
            .args(argv)
            .envs(env.iter().cloned())
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            bare.status.code(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&bare.stdout),
            "{name}"
        );
        // With LD_PRELOAD set for gpuprof's command, gpuprof loads the
        // user's library too: one more line, its own.
        let own = if name == "user LD_PRELOAD" {
            "mine loaded\n"
        } else {
            ""
        };
        assert_eq!(
            String::from_utf8_lossy(&o.stderr),
            format!("{own}{}", String::from_utf8_lossy(&bare.stderr)),
            "{name}: the job's stderr"
        );
        assert!(out.join("report.json").is_file(), "{name}");
    }
}

/// 200 concurrent requests to `--metrics-addr`, half of them malformed
/// (garbage, an over-long head, a request line cut short, a bare close):
/// each is answered or closed, a good scrape still works, and the
/// recording is complete.
#[test]
fn concurrent_and_malformed_metrics_requests_are_answered() {
    use std::io::{Read, Write};
    let d = tmp();
    let port = free_port();
    let out = d.path().join("o");
    let mut child = gpuprof()
        .args(["-q", "--no-stacks", "-o"])
        .arg(&out)
        .arg("--metrics-addr")
        .arg(format!("127.0.0.1:{port}"))
        .args(["--", "sleep", "6"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(20), "never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    let request = |i: usize| -> Vec<u8> {
        match i % 6 {
            0 => b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            1 => vec![0xff; 300],
            2 => {
                let mut v = b"GET /metrics HTTP/1.1\r\nX-Long: ".to_vec();
                v.extend(std::iter::repeat_n(b'a', 40_000));
                v
            }
            3 => b"GET".to_vec(),
            4 => Vec::new(),
            _ => b"POST /metrics HTTP/1.1\r\n\r\n".to_vec(),
        }
    };
    let handles: Vec<_> = (0..200)
        .map(|i| {
            let body = request(i);
            std::thread::spawn(move || -> Option<String> {
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
                s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
                let _ = s.write_all(&body);
                let _ = s.shutdown(std::net::Shutdown::Write);
                let mut resp = Vec::new();
                let _ = s.read_to_end(&mut resp);
                Some(String::from_utf8_lossy(&resp).into_owned())
            })
        })
        .collect();
    let answers: Vec<Option<String>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let good = answers
        .iter()
        .enumerate()
        .filter(|(i, a)| i % 6 == 0 && a.as_deref().is_some_and(|r| r.starts_with("HTTP/1.1 200")))
        .count();
    assert_eq!(good, 34, "every well-formed scrape answered");
    assert!(
        answers
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 6 == 5)
            .all(|(_, a)| a.as_deref().is_some_and(|r| r.starts_with("HTTP/1.1 405"))),
        "POST refused"
    );
    let o = wait_within(&mut child, Duration::from_secs(60), "gpuprof");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(report(&out)["complete"], true);
}
