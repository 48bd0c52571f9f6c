//! The in-process timer sampler (issue 33): where `perf_event_open` is
//! refused — here a seccomp filter that makes it fail with EPERM, as
//! Docker's default profile does, with gpuprof run as `nobody` — each
//! thread of the job samples itself on its own CPU-time clock, and every
//! output stays what a perf-sampled run gives. Real gpuprof, real Python
//! jobs (tests/scripts/, samples/), real timers and signals.

#[macro_use]
mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_gpuprof");

/// Recordings run one at a time: on a small machine, jobs profiled in
/// parallel starve each other.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn scripts() -> PathBuf {
    common::repo().join("tests/scripts")
}

/// A fresh folder that `nobody` may write into.
fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuprof-timer-{}-{}", name, std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

/// Build a C helper into `dir`.
fn build_c(dir: &Path, name: &str, src: &str, defs: &[String]) -> Option<PathBuf> {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).ok()?;
    let bin = dir.join(name);
    let st = Command::new("gcc")
        .arg("-O")
        .args(defs)
        .arg("-o")
        .arg(&bin)
        .arg(&c)
        .status()
        .ok()?;
    st.success().then_some(bin)
}

/// A helper that installs a seccomp filter making `perf_event_open` fail
/// with EPERM (after `PR_SET_NO_NEW_PRIVS`, as a container runtime does),
/// then execs its arguments: Docker's default profile for a container
/// without CAP_PERFMON or CAP_SYS_ADMIN.
fn deny_perf_helper(dir: &Path) -> Option<PathBuf> {
    build_c(
        dir,
        "deny-perf",
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
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_perf_event_open, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
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
        &[],
    )
}

/// How to run a command as `nobody` under the seccomp filter: a private
/// mount namespace in which the pyenv interpreters stay where they are but
/// the home folder above them (0700 for root) is passable, then `setpriv`
/// to uid/gid 65534, then the filter. `None` (with why) where that cannot
/// be done: not root, or no unshare/setpriv/gcc.
struct AsNobody {
    script: PathBuf,
    keep: PathBuf,
    home: PathBuf,
    deny: PathBuf,
}

impl AsNobody {
    fn new(dir: &Path) -> Result<AsNobody, String> {
        if !common::is_root() {
            return Err("needs root to run gpuprof as nobody".into());
        }
        for tool in ["unshare", "setpriv", "mount"] {
            if common::sh("sh", &["-c", &format!("command -v {tool}")]).is_err() {
                return Err(format!("no {tool} here"));
            }
        }
        let deny = deny_perf_helper(dir).ok_or("gcc could not build the seccomp helper")?;
        let home = PathBuf::from(std::env::var_os("HOME").ok_or("no HOME")?);
        let keep = dir.join("keep");
        std::fs::create_dir_all(&keep).map_err(|e| e.to_string())?;
        let script = dir.join("as-nobody.sh");
        // The home folder becomes an empty tmpfs (mode 0755) holding only
        // the pyenv folder, bound back in place: the interpreters keep their
        // paths (their libpython is found by an absolute RPATH).
        std::fs::write(
            &script,
            r#"#!/bin/sh
keep=$1; home=$2; shift 2
if [ -d "$home/.pyenv" ]; then
    mount --bind "$home/.pyenv" "$keep" && mount -t tmpfs -o mode=0755 tmpfs "$home" &&
        mkdir "$home/.pyenv" && mount --bind "$keep" "$home/.pyenv" || exit 125
fi
exec setpriv --reuid 65534 --regid 65534 --clear-groups "$@"
"#,
        )
        .map_err(|e| e.to_string())?;
        Ok(AsNobody {
            script,
            keep,
            home,
            deny,
        })
    }

    /// `gpuprof ARGS` as nobody, perf refused; HOME is `dir`.
    fn gpuprof(&self, dir: &Path, args: &[&str], env: &[(&str, &Path)]) -> Output {
        self.run(true, dir, args, env)
    }

    /// `gpuprof ARGS` as nobody, perf_event_open allowed what the host's
    /// `perf_event_paranoid` allows a user (Ubuntu's and Debian's defaults
    /// refuse it all; the kernel's own, 2, allows user mode only).
    fn gpuprof_host_perf(&self, dir: &Path, args: &[&str]) -> Output {
        self.run(false, dir, args, &[])
    }

    fn run(&self, deny: bool, dir: &Path, args: &[&str], env: &[(&str, &Path)]) -> Output {
        let mut c = Command::new("unshare");
        c.args(["-m", "--propagation", "private", "sh"])
            .arg(&self.script)
            .arg(&self.keep)
            .arg(&self.home);
        if deny {
            c.arg(&self.deny);
        }
        c.arg(BIN).args(args).env("HOME", dir).current_dir(dir);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().expect("run gpuprof as nobody")
    }
}

fn folded(path: &Path) -> Vec<(String, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| {
            let (s, n) = l.rsplit_once(' ').expect("count");
            (s.to_string(), n.parse().expect("count"))
        })
        .collect()
}

/// Native-leaf samples of the alternation job by where they lie.
#[derive(Debug, Default, Clone, Copy)]
struct Truth {
    right: u64,
    unattributed: u64,
    wrong: u64,
}

impl Truth {
    fn total(&self) -> u64 {
        self.right + self.unattributed + self.wrong
    }
}

/// Every zlib leaf must lie under compress_block, every SHA-256 one under
/// hash_block (the innermost Python frame above it).
fn classify(lines: &[(String, u64)]) -> Truth {
    let mut t = Truth::default();
    for (stack, n) in lines {
        let frames: Vec<&str> = stack.split(';').collect();
        let zlib = frames
            .iter()
            .any(|f| *f == "zlib_compress" || f.starts_with("deflate") || f.contains("libz.so"));
        let sha = frames.iter().any(|f| {
            !f.contains(".py)")
                && (f.to_ascii_lowercase().contains("sha256")
                    || f.contains("EVP_Digest")
                    || f.contains("libcrypto"))
        });
        if zlib == sha {
            continue;
        }
        let want = if zlib {
            "compress_block (alternate.py)"
        } else {
            "hash_block (alternate.py)"
        };
        match frames.iter().rev().find(|f| f.ends_with(".py)")) {
            Some(f) if *f == want => t.right += n,
            Some(f)
                if *f == "compress_block (alternate.py)" || *f == "hash_block (alternate.py)" =>
            {
                t.wrong += n
            }
            _ if frames.iter().any(|f| f.starts_with("[python: ")) => t.unattributed += n,
            _ => {}
        }
    }
    t
}

/// As `nobody`, perf refused by seccomp, on every installed CPython
/// 3.9–3.13: one thread per process alternating two functions every 3 ms
/// whose native leaves differ (zlib, OpenSSL SHA-256), in the main process
/// and two forked workers. Every native leaf lies under the function that
/// ran it (≥ 99%, none under the other), and the run says which sampler
/// took the stacks. Slow-ish (~6 s per version, the job runs 3 s of wall
/// time so that each process gets enough CPU on a loaded machine): five
/// interpreters.
#[test]
fn as_nobody_without_perf_every_native_leaf_is_under_its_function() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tmp("alt");
    let nobody = match AsNobody::new(&dir) {
        Ok(n) => n,
        Err(why) => skip!("{why}"),
    };
    let mut tried = 0;
    let mut table = Vec::new();
    for minor in 9..=13 {
        let Some(py) = common::python_minor(minor) else {
            continue;
        };
        tried += 1;
        let out = dir.join(format!("alt{minor}"));
        let o = nobody.gpuprof(
            &dir,
            &[
                "-o",
                out.to_str().unwrap(),
                // The most this kernel's tick allows (gpuprof lowers it to
                // that): the job runs by wall time, and on a loaded machine
                // each process gets a fraction of a core.
                "--frequency",
                "1000",
                "--",
                py.to_str().unwrap(),
                scripts().join("alternate.py").to_str().unwrap(),
                "3",
                "2",
            ],
            &[],
        );
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "3.{minor}: {stderr}");
        // A line says perf was refused and what runs instead.
        let line = stderr
            .lines()
            .find(|l| l.contains("perf_event_open was refused"))
            .unwrap_or_else(|| panic!("3.{minor}: no perf line in {stderr}"));
        assert!(line.contains("in-process timer sampler"), "{line}");
        for role in ["main", "worker"] {
            let t = classify(&folded(&out.join(format!("stacks-{role}.folded"))));
            table.push(format!("3.{minor} {role}: {t:?}"));
            assert!(t.total() >= 20, "3.{minor} {role}: only {t:?}");
            assert_eq!(t.wrong, 0, "3.{minor} {role}: {t:?}");
            assert!(
                t.right as f64 >= 0.99 * t.total() as f64,
                "3.{minor} {role}: {t:?}"
            );
        }
        let r = common::report(&out);
        assert_eq!(
            r["stacks"]["sampler"], "in-process-timer",
            "{}",
            r["stacks"]
        );
        let procs = r["stacks"]["python"]["processes"].as_array().unwrap();
        assert_eq!(procs.len(), 3, "{}", r["stacks"]["python"]);
        for p in procs {
            assert_eq!(p["sampler"], "same-instant", "{p}");
            assert_eq!(p["native_sampler"], "in-process-timer", "{p}");
            assert_eq!(p["agent"]["dropped"], 0, "{p}");
        }
        let svg = std::fs::read_to_string(out.join("flame-workers.svg")).unwrap();
        assert!(svg.contains("by in-process timers"), "subtitle");
        // gpuprof ran as nobody: the recording is nobody's.
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            std::fs::metadata(out.join("report.json")).unwrap().uid(),
            65534
        );
    }
    eprintln!("{}", table.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
    if tried == 0 {
        skip!("no CPython 3.9-3.13 installed (pyenv)");
    }
}

/// Share of a role's samples with `frame` on the stack, and the count.
fn share_with(r: &Value, role: &str, frame: &str) -> (f64, u64) {
    let role = &r["stacks"]["roles"][role];
    let n = role["samples"].as_u64().unwrap_or(0);
    let pct = role["top_functions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["function"] == frame)
        .and_then(|f| f["total_pct"].as_f64())
        .unwrap_or(0.0);
    (pct / 100.0, n)
}

/// The loader job (one saturated worker, GPU activity from the fake NVML):
/// perf-sampled as root, then timer-sampled as nobody with perf refused.
/// Both leave `flame-main.svg`, `flame-workers.svg` and
/// `flame-gpu-idle.svg`; the workers' top frame is the same, with a share
/// within sampling noise (3σ of the two binomial shares). ~15 s: two
/// 4-second loader runs.
#[test]
fn loader_outputs_under_the_timer_match_a_perf_run() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(why) = common::perf_refused() {
        skip!("the perf-sampled run to compare with needs perf: {why}");
    }
    let Some(py) = common::python_minor(11).or_else(|| common::python_minor(12)) else {
        skip!("no CPython 3.11/3.12 installed (pyenv)");
    };
    let dir = tmp("loader");
    let nobody = match AsNobody::new(&dir) {
        Ok(n) => n,
        Err(why) => skip!("{why}"),
    };
    let lib = common::fake_nvml_dir().join("libfake_nvml.so");
    let scen = common::sample("gpu/activity.json");
    let job = |log: &Path| -> Vec<String> {
        [
            py.to_str().unwrap(),
            common::sample("train_sim.py").to_str().unwrap(),
            "--workers",
            "1",
            "--augment-ms",
            "40",
            "--gpu-ms",
            "10",
            "--steps",
            "50",
            "--activity-log",
            log.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let run = |name: &str, as_nobody: bool| -> (PathBuf, Value) {
        let out = dir.join(name);
        let log = dir.join(format!("{name}.log"));
        let mut args: Vec<String> = vec!["-q".into(), "-o".into(), out.display().to_string()];
        args.push("--".into());
        args.extend(job(&log));
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let env = [
            ("GPUPROF_NVML_LIB", lib.as_path()),
            ("FAKE_NVML_SCENARIO", scen.as_path()),
            ("GPUPROF_ACTIVITY_LOG", log.as_path()),
        ];
        let o = if as_nobody {
            nobody.gpuprof(&dir, &args, &env)
        } else {
            let mut c = Command::new(BIN);
            c.args(&args);
            for (k, v) in env {
                c.env(k, v);
            }
            c.output().unwrap()
        };
        assert_eq!(
            o.status.code(),
            Some(0),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let r = common::report(&out);
        (out, r)
    };
    let (perf_out, perf) = run("perf", false);
    let (timer_out, timer) = run("timer", true);
    assert_eq!(perf["stacks"]["sampler"], "perf-events");
    assert_eq!(timer["stacks"]["sampler"], "in-process-timer");
    for out in [&perf_out, &timer_out] {
        for f in ["flame-main.svg", "flame-workers.svg", "flame-gpu-idle.svg"] {
            assert!(out.join(f).is_file(), "{} has no {f}", out.display());
        }
        let idle = std::fs::read_to_string(out.join("stacks-gpu-idle.folded")).unwrap();
        assert!(idle.contains("augment (train_sim.py)"), "{}", out.display());
    }
    let top = |r: &Value| {
        r["stacks"]["roles"]["worker"]["top_functions"][0]["function"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(top(&perf), "augment (train_sim.py)");
    assert_eq!(top(&timer), top(&perf));
    let (p1, n1) = share_with(&perf, "worker", "augment (train_sim.py)");
    let (p2, n2) = share_with(&timer, "worker", "augment (train_sim.py)");
    assert!(n1 >= 50 && n2 >= 50, "samples: perf {n1}, timer {n2}");
    let p = (p1 * n1 as f64 + p2 * n2 as f64) / (n1 + n2) as f64;
    let sigma = (p * (1.0 - p) * (1.0 / n1 as f64 + 1.0 / n2 as f64)).sqrt();
    // One sample's worth on each side as a floor: with p near 1, σ is ~0.
    let bound = 3.0 * sigma + 1.0 / n1 as f64 + 1.0 / n2 as f64;
    assert!(
        (p1 - p2).abs() <= bound,
        "augment: perf {p1:.3} of {n1}, timer {p2:.3} of {n2}, bound {bound:.3}"
    );
    eprintln!("augment: perf {p1:.3} of {n1}, timer {p2:.3} of {n2}, bound {bound:.3}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The job's own signal use behaves as without gpuprof under the timer
/// sampler (`--sampler timer`): a SIGALRM interval timer while sleeping and
/// computing, a SIGPROF profiling timer, a thread that blocks every signal
/// (it reads back its mask, finds nothing pending, and is sampled all the
/// same), 200 short forked children. Same exit status and output.
#[test]
fn the_jobs_signals_are_untouched_under_the_timer() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(py) = common::python_minor(11).or_else(|| common::python_minor(12)) else {
        skip!("no CPython 3.11/3.12 installed (pyenv)");
    };
    let dir = tmp("signals");
    let script = scripts().join("timer_signals.py");
    for mode in ["itimer", "sigprof", "blockall", "fork200"] {
        let bare = Command::new(&py).arg(&script).arg(mode).output().unwrap();
        assert_eq!(bare.status.code(), Some(0), "{mode} without gpuprof");
        let out = dir.join(mode);
        // 499 Hz asked: above this kernel's tick rate the timers would
        // merge expirations, so gpuprof lowers it (checked below).
        let o = Command::new(BIN)
            .args(["-q", "--sampler", "timer", "--frequency", "499", "-o"])
            .arg(&out)
            .arg("--")
            .arg(&py)
            .arg(&script)
            .arg(mode)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), bare.status.code(), "{mode}");
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&bare.stdout),
            "{mode}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let r = common::report(&out);
        assert_eq!(r["stacks"]["sampler"], "in-process-timer", "{mode}");
        if mode == "blockall" {
            // The thread that blocked every signal computed 0.4 s of CPU:
            // sampled by its timer all along, each sample one period.
            let hz = r["stacks"]["frequency_hz"].as_f64().unwrap();
            let n: u64 = folded(&out.join("stacks-main.folded"))
                .iter()
                .filter(|(s, _)| s.contains("blocked (timer_signals.py)"))
                .map(|(_, n)| n)
                .sum();
            let cpu_s = n as f64 / hz;
            assert!(
                (0.3..=0.5).contains(&cpu_s),
                "{n} samples at {hz} Hz = {cpu_s:.3} CPU-s for 0.4 s of CPU"
            );
            let p = &r["stacks"]["python"]["processes"][0];
            assert_eq!(p["agent"]["late_signals"], 0, "{p}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The job's SIGTRAP disposition rewritten on two threads in a tight loop
/// while its other threads raise SIGTRAPs and the timers sample them all
/// (as `tests/pystacks.rs` does under perf): the job runs to its end, and
/// each of its SIGTRAPs reaches its handler once, as installed.
#[test]
fn the_jobs_sigaction_races_the_timer_samples() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(py) = common::python_minor(12).or_else(|| common::python_minor(11)) else {
        skip!("no CPython 3.11/3.12 installed (pyenv)");
    };
    let dir = tmp("sigrace");
    let so = match common::build_sigtrap_race(&dir) {
        Ok(so) => so,
        Err(e) => skip!("{e}"),
    };
    let out = dir.join("out");
    let o = Command::new(BIN)
        .args(["-q", "--sampler", "timer", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&py)
        .arg(scripts().join("sigtrap_race.py"))
        .arg(&so)
        .arg("2")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("race ok"), "{stdout}");
    let r = common::report(&out);
    assert_eq!(r["stacks"]["sampler"], "in-process-timer");
    let pr = &r["stacks"]["python"]["processes"][0];
    assert_eq!(pr["agent"]["handler_chained"], true, "{pr}");
    assert!(pr["same_instant"].as_u64().unwrap() > 0, "{pr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `gpuprof doctor` says which sampler a recording would use and, where
/// perf events are refused, what each privilege would add.
#[test]
fn doctor_says_which_sampler_runs_and_what_privileges_would_add() {
    let dir = tmp("doctor");
    let Some(deny) = deny_perf_helper(&dir) else {
        skip!("gcc could not build the seccomp helper");
    };
    let o = Command::new(&deny)
        .arg(BIN)
        .arg("doctor")
        .env_remove("GPUPROF_NVML_LIB")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("] stacks"))
        .unwrap_or_else(|| panic!("no stacks check: {text}"));
    assert!(
        line.contains("[warning]")
            && line.contains("perf_event_open is refused")
            && line.contains("in-process timer sampler")
            && line.contains("a seccomp filter"),
        "{line}"
    );
    let fix = text
        .lines()
        .skip_while(|l| !l.contains("] stacks"))
        .nth(1)
        .unwrap_or("");
    assert!(
        fix.contains("what each privilege would add") && fix.contains("CAP_PERFMON"),
        "{fix}"
    );
    if common::perf_refused().is_none() {
        let o = Command::new(BIN)
            .arg("doctor")
            .env_remove("GPUPROF_NVML_LIB")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.lines()
                .any(|l| l.contains("[     ok] stacks perf events allowed")),
            "{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `gpuprof attach` where perf events are refused cannot place the timer
/// sampler in processes already running: it says so, with how much is
/// missing (the tree's processes and threads) and how to get it, and falls
/// back to py-spy's Python stacks.
#[test]
fn attach_without_perf_says_what_is_missing_and_reads_python() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(py) = common::python_minor(11).or_else(|| common::python_minor(12)) else {
        skip!("no CPython 3.11/3.12 installed (pyenv)");
    };
    let dir = tmp("attach");
    let Some(deny) = deny_perf_helper(&dir) else {
        skip!("gcc could not build the seccomp helper");
    };
    let mut job = Command::new(&py)
        .args([
            "-c",
            "import threading, time\n\
             def spin(s):\n    e = time.time() + s\n    while time.time() < e: sum(range(1000))\n\
             t = threading.Thread(target=spin, args=(8,)); t.start(); spin(8); t.join()",
        ])
        .spawn()
        .unwrap();
    // Both threads running before attaching (Python starts slowly on a
    // loaded machine).
    let tasks = format!("/proc/{}/task", job.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::read_dir(&tasks).map_or(0, |d| d.count()) < 2
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = dir.join("out");
    let o = Command::new(&deny)
        .arg(BIN)
        .args(["attach", &job.id().to_string(), "--duration", "2", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    let _ = job.kill();
    let _ = job.wait();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("perf_event_open was refused"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        line.contains("no native stacks of the 1 process(es) and 2 thread(s)")
            && line.contains("gpuprof -- CMD")
            && line.contains("py-spy"),
        "{line}"
    );
    let r = common::report(&out);
    let cov = |src: &str| {
        r["coverage"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["source"] == src)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(cov("native-stacks")["available"], false);
    assert_eq!(r["stacks"]["sampler"], "python-only", "{}", r["stacks"]);
    assert!(r["stacks"]["python_stacks"].as_u64().unwrap_or(0) > 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The timer sampler samples the job's native programs too (they load the
/// agent, which takes their native stacks without Python frames): a shell
/// loop of the job, by its own timers.
#[test]
fn native_programs_of_the_job_are_sampled_by_their_timers() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tmp("native");
    let out = dir.join("out");
    // ~0.5-1 s of the shell's own CPU, whatever the load.
    let o = Command::new(BIN)
        .args(["-q", "--sampler", "timer", "-o"])
        .arg(&out)
        .args([
            "--",
            "sh",
            "-c",
            "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; echo done",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "done\n");
    let r = common::report(&out);
    assert_eq!(r["stacks"]["sampler"], "in-process-timer");
    let folded = folded(&out.join("stacks-all-native.folded"));
    let n: u64 = folded.iter().map(|(_, n)| n).sum();
    assert!(n >= 10, "{n} samples of the shell: {folded:?}");
    // Unwound to the program's start, and no Python anywhere.
    assert!(
        folded
            .iter()
            .filter(|(s, _)| s.contains(";_start;") || s.contains(";__libc_start_main"))
            .map(|(_, n)| n)
            .sum::<u64>()
            * 10
            >= n * 9,
        "{folded:?}"
    );
    assert!(r["stacks"]["python"]["processes"]
        .as_array()
        .is_none_or(|p| p.is_empty()));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without privileges the time in the kernel is either sampled (the
/// timers, which count it like any CPU time; or a host whose
/// `perf_event_paranoid` is 1 or less) or counted and said: a job reading
/// /dev/zero for 1.5 s of CPU once showed none of it, and nothing said so.
/// As nobody with perf as the host allows it, then with perf refused (the
/// timers).
#[test]
fn as_nobody_the_time_in_the_kernel_is_sampled_or_said() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tmp("kernel");
    let nobody = match AsNobody::new(&dir) {
        Ok(n) => n,
        Err(why) => skip!("{why}"),
    };
    let Some(py) = common::python_minor(11).or_else(|| common::python_minor(12)) else {
        skip!("no Python 3.11 or 3.12 here");
    };
    let paranoid: i32 = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(2);
    let script = scripts().join("kernel_time.py");
    let job = [py.to_str().unwrap(), script.to_str().unwrap(), "1", "1.5"];
    for host_perf in [true, false] {
        let out = dir.join(if host_perf { "host-perf" } else { "no-perf" });
        let mut args = vec!["-o", out.to_str().unwrap(), "--"];
        args.extend(job);
        let o = if host_perf {
            nobody.gpuprof_host_perf(&dir, &args)
        } else {
            nobody.gpuprof(&dir, &args, &[])
        };
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{stderr}");
        let k = common::check_kernel_time(&out, &String::from_utf8_lossy(&o.stdout), 99.0);
        let want = match (host_perf, paranoid) {
            (false, _) | (true, 3..) => None,
            (true, ..=1) if common::kernel_traps_on_return() => Some(true),
            (true, _) => Some(false),
        };
        assert_eq!(
            k.kernel_sampled,
            want,
            "perf {}, perf_event_paranoid {paranoid}: {k:?}",
            if host_perf {
                "as the host allows"
            } else {
                "refused"
            }
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
