//! Same-instant Python frames (issues 8 and 18): the in-process agent
//! (`src/agent/pystacks.c`) on every installed CPython 3.9–3.13, the ring
//! it writes, and the job's own signals and children under it. Real
//! gpuprof, real Python jobs (tests/scripts/), real perf samples.

#[macro_use]
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpuprof::collect::perf::pyagent::{AgentRecord, AgentRings};
use gpuprof::vocab::stacks::agent_covers;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_gpuprof");

fn scripts() -> PathBuf {
    common::repo().join("tests/scripts")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuprof-pystacks-{}-{}", name, std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Recordings run one at a time: on a small machine, jobs profiled in
/// parallel starve each other.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn perf_refused() -> Option<String> {
    let mut a = [0u8; 128];
    a[0..4].copy_from_slice(&1u32.to_ne_bytes());
    a[4..8].copy_from_slice(&128u32.to_ne_bytes());
    let flags: u64 = 1 | (1 << 5) | (1 << 6);
    a[40..48].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: a is a valid perf_event_attr of the size it declares.
    let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, a.as_ptr(), 0, -1, -1, 0) };
    if fd < 0 {
        return Some(format!(
            "perf_event_open is refused here ({})",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: fd was just opened by us.
    unsafe { libc::close(fd as i32) };
    None
}

macro_rules! need_perf {
    () => {
        if let Some(why) = perf_refused() {
            skip!("{why}");
        }
    };
}

/// `gpuprof -q -o DIR ARGS -- JOB` with core dumps off (a job killed by
/// SIGTRAP would leave one); returns the folder and gpuprof's exit code.
fn record(name: &str, args: &[&str], job: &[&str]) -> (PathBuf, i32) {
    let (out, code, _) = record_stdout(name, args, job);
    (out, code)
}

/// [`record`], with what the job printed.
fn record_stdout(name: &str, args: &[&str], job: &[&str]) -> (PathBuf, i32, String) {
    record_env(name, &[], args, job)
}

/// [`record_stdout`], gpuprof run with `env` added to its environment.
fn record_env(
    name: &str,
    env: &[(&str, &str)],
    args: &[&str],
    job: &[&str],
) -> (PathBuf, i32, String) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = tmp(name);
    let st = Command::new("sh")
        .envs(env.iter().copied())
        .arg("-c")
        .arg("ulimit -c 0; exec \"$@\"")
        .arg("sh")
        .arg(BIN)
        .arg("-q")
        .arg("-o")
        .arg(&out)
        .args(args)
        .arg("--")
        .args(job)
        .current_dir(std::env::temp_dir())
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run gpuprof");
    (
        out,
        st.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&st.stdout).into_owned(),
    )
}

fn report(dir: &Path) -> Value {
    common::report(dir)
}

/// What the py-spy sampler did: the `python-stacks` coverage entry.
fn python_stacks_detail(r: &Value) -> String {
    r["coverage"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["source"] == "python-stacks")
        .expect("python-stacks coverage")["detail"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The native-stacks coverage detail (the wall-clock sampler's counts).
fn native_stacks_detail(r: &Value) -> String {
    r["coverage"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["source"] == "native-stacks")
        .expect("native-stacks coverage")["detail"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The recording's events, one JSON object per line.
fn recorded_events(out: &Path) -> String {
    let mut events = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::MultiGzDecoder::new(
            std::fs::File::open(out.join("recording/events.jsonl.gz")).unwrap(),
        ),
        &mut events,
    )
    .unwrap();
    events
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

/// Samples whose native leaf is zlib's or SHA-256's, by where they lie:
/// (right, unattributed, wrong, other Python function).
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
    fn share(&self, n: u64) -> f64 {
        n as f64 / self.total().max(1) as f64
    }
    /// One line of the table the tests print.
    fn row(&self, label: &str) -> String {
        format!(
            "{label}: {} samples, right {:.1}%, unattributed {:.1}%, wrong {:.1}%",
            self.total(),
            100.0 * self.share(self.right),
            100.0 * self.share(self.unattributed),
            100.0 * self.share(self.wrong)
        )
    }
    /// Issue 8's bar: enough samples, none under the wrong function, at
    /// least 99% under the right one.
    fn check(&self, label: &str) {
        assert!(self.total() >= 20, "{label}: only {self:?}");
        assert_eq!(self.wrong, 0, "{label}: {self:?}");
        assert!(self.share(self.right) >= 0.99, "{label}: {self:?}");
    }
}

/// Whether a stack's native leaf is zlib's (`Some(true)`) or SHA-256's
/// (`Some(false)`); `None` for neither, or both.
fn zlib_leaf(frames: &[&str]) -> Option<bool> {
    let zlib = frames
        .iter()
        .any(|f| *f == "zlib_compress" || f.starts_with("deflate") || f.contains("libz.so"));
    let sha = frames.iter().any(|f| {
        !f.contains(".py)")
            && (f.to_ascii_lowercase().contains("sha256")
                || f.contains("EVP_Digest")
                || f.contains("libcrypto"))
    });
    (zlib != sha).then_some(zlib)
}

fn classify(lines: &[(String, u64)]) -> Truth {
    let mut t = Truth::default();
    for (stack, n) in lines {
        let frames: Vec<&str> = stack.split(';').collect();
        let Some(zlib) = zlib_leaf(&frames) else {
            continue;
        };
        let want = if zlib {
            "compress_block (alternate.py)"
        } else {
            "hash_block (alternate.py)"
        };
        let inner = frames.iter().rev().find(|f| f.ends_with(".py)"));
        match inner {
            Some(f) if *f == want => t.right += n,
            Some(f)
                if *f == "compress_block (alternate.py)" || *f == "hash_block (alternate.py)" =>
            {
                t.wrong += n
            }
            _ if frames.iter().any(|f| f.starts_with("[python: ")) => t.unattributed += n,
            // Under another Python function (e.g. hashlib's own module
            // code at import): not a sample of the alternation.
            _ => {}
        }
    }
    t
}

/// As [`classify`], by the function anywhere on the stack rather than the
/// innermost one (the fresh-code job runs its native work one frame in).
fn classify_outer(lines: &[(String, u64)]) -> Truth {
    let mut t = Truth::default();
    for (stack, n) in lines {
        let frames: Vec<&str> = stack.split(';').collect();
        let Some(zlib) = zlib_leaf(&frames) else {
            continue;
        };
        let has = |name: &str| frames.contains(&name);
        let (c, h) = (
            has("compress_block (alternate.py)"),
            has("hash_block (alternate.py)"),
        );
        match (zlib, c, h) {
            (true, true, false) | (false, false, true) => t.right += n,
            (_, true, _) | (_, _, true) => t.wrong += n,
            _ if frames.iter().any(|f| f.starts_with("[python: ")) => t.unattributed += n,
            _ => {}
        }
    }
    t
}

/// The alternation of issue 8 on every installed CPython 3.9–3.13, in the
/// main process and in forked workers: every zlib sample under
/// compress_block, every SHA-256 sample under hash_block, none under the
/// other; at least 99% placed (the rest explicitly unattributed).
#[test]
fn native_leaves_lie_under_the_python_function_that_ran_them() {
    need_perf!();
    let mut tried = 0;
    let mut table = Vec::new();
    for minor in 9..=13 {
        let Some(py) = common::python_minor(minor) else {
            continue;
        };
        tried += 1;
        let (out, code) = record(
            &format!("alt{minor}"),
            &["--frequency", "499"],
            &[
                py.to_str().unwrap(),
                scripts().join("alternate.py").to_str().unwrap(),
                "1.5",
                "2",
            ],
        );
        assert_eq!(code, 0, "3.{minor}: the job failed");
        for role in ["main", "worker"] {
            let t = classify(&folded(&out.join(format!("stacks-{role}.folded"))));
            table.push(t.row(&format!("3.{minor} {role}")));
            t.check(&format!("3.{minor} {role}"));
        }
        let r = report(&out);
        let p = &r["stacks"]["python"];
        let procs = p["processes"].as_array().unwrap();
        assert_eq!(procs.len(), 3, "{p}");
        for pr in procs {
            assert_eq!(pr["sampler"], "same-instant", "{pr}");
            assert!(
                pr["version"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("3.{minor}.")),
                "{pr}"
            );
            assert_eq!(pr["agent"]["dropped"], 0, "{pr}");
        }
        assert!(p["by_version"][format!("3.{minor}")]["same_instant"].as_u64() > Some(100));
        // The flamegraph says what happened.
        let svg = std::fs::read_to_string(out.join("flame-all.svg")).unwrap();
        assert!(svg.contains("Python frames: same instant "), "subtitle");
        // py-spy left the sampled processes alone: no Python-only view.
        assert!(!out.join("stacks-python-only.folded").exists());
        let _ = std::fs::remove_dir_all(&out);
    }
    eprintln!("{}", table.join("\n"));
    if tried == 0 {
        skip!("no CPython 3.9-3.13 installed (pyenv)");
    }
}

/// The agent trusts a code object it found alive, without reading it
/// again, until any code object is deallocated. Here the two functions are
/// compiled anew for every 3 ms slice and freed after it, so each is born
/// at the address the other just left: every zlib sample must still lie
/// under compress_block and every SHA-256 one under hash_block (a key kept
/// for an address after its object went would file them under the other).
#[test]
fn code_objects_reborn_at_one_address_keep_their_own_names() {
    need_perf!();
    let (mut tried, mut reused) = (0, 0);
    let mut table = Vec::new();
    for minor in 9..=13 {
        let Some(py) = common::python_minor(minor) else {
            continue;
        };
        tried += 1;
        let (out, code, stdout) = record_stdout(
            &format!("fresh{minor}"),
            &["--frequency", "499"],
            &[
                py.to_str().unwrap(),
                scripts().join("alternate.py").to_str().unwrap(),
                "1.5",
                "1",
                "0",
                "1",
            ],
        );
        assert_eq!(code, 0, "3.{minor}: the job failed");
        // Whether the allocator did give one function's address to the
        // other depends on the version (3.11-3.13 do, every slice).
        // By occurrence, not by line: with PYTHONUNBUFFERED set, print
        // writes the text and the newline apart, and the two processes'
        // lines can interleave ("...: 1fresh ...: 1\n\n").
        let shared: Vec<u64> = stdout
            .split("both functions: ")
            .skip(1)
            .map(|rest| {
                let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
                digits.parse().unwrap()
            })
            .collect();
        assert_eq!(shared.len(), 2, "3.{minor}: {stdout}");
        reused += shared.iter().filter(|&&n| n > 0).count();
        table.push(format!("3.{minor}: addresses shared {shared:?}"));
        for role in ["main", "worker"] {
            let t = classify_outer(&folded(&out.join(format!("stacks-{role}.folded"))));
            table.push(t.row(&format!("3.{minor} {role}")));
            t.check(&format!("3.{minor} {role}"));
        }
        let _ = std::fs::remove_dir_all(&out);
    }
    eprintln!("{}", table.join("\n"));
    if tried == 0 {
        skip!("no CPython 3.9-3.13 installed (pyenv)");
    }
    assert!(
        reused > 0,
        "no process reused an address: the test proved nothing"
    );
}

/// Issue 18: loader workers with a feeder thread on 3.10 and 3.11 — their
/// samples lie under Python functions, and the summary names the hot one.
#[test]
fn loader_workers_with_feeder_threads_have_python_frames() {
    need_perf!();
    let mut tried = 0;
    for minor in [10, 11] {
        let Some(py) = common::python_minor(minor) else {
            continue;
        };
        tried += 1;
        let (out, code) = record(
            &format!("loader{minor}"),
            &[],
            &[
                py.to_str().unwrap(),
                scripts().join("loader_job.py").to_str().unwrap(),
                "2.5",
                "2",
            ],
        );
        assert_eq!(code, 0);
        let w = folded(&out.join("stacks-worker.folded"));
        let total: u64 = w.iter().map(|l| l.1).sum();
        let under: u64 = w
            .iter()
            .filter(|l| l.0.split(';').any(|f| f.ends_with(".py)")))
            .map(|l| l.1)
            .sum();
        let feeder = w.iter().any(|l| l.0.contains("_feed (queues.py)"));
        eprintln!(
            "3.{minor}: {under} of {total} worker samples under a Python function; feeder thread sampled: {feeder}"
        );
        assert!(total >= 60, "3.{minor}: {total} worker samples");
        assert!(
            under as f64 >= 0.9 * total as f64,
            "3.{minor}: {under}/{total}"
        );
        let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
        assert!(
            summary.contains("augment (loader_job.py)"),
            "3.{minor}: the summary does not name augment:\n{summary}"
        );
        let _ = std::fs::remove_dir_all(&out);
    }
    if tried == 0 {
        skip!("neither CPython 3.10 nor 3.11 is installed (pyenv)");
    }
}

/// py-spy reads what the agent does not sample, and no more: a loader job's
/// processes are left to the agent (each py-spy read of a busy job is CPU
/// taken from it), a rank's main process too while the wall-clock sampler
/// reads its blocked loop thread with the agent's layout (its waits in
/// collectives come from those looks); with the sampler reading Python
/// frames through py-spy instead (`GPUPROF_WALL_PY=spy`), py-spy reads
/// the rank's main process for them (its forked workers, with the same
/// rank variables, are left to the agent). No process the agent spoke for
/// is said to have run without it.
#[test]
fn py_spy_reads_only_what_the_agent_does_not_sample() {
    need_perf!();
    let Some(py) = common::python_minor(11) else {
        skip!("CPython 3.11 is not installed (pyenv)");
    };
    let script = scripts().join("loader_job.py");
    let job = |rank: bool, seconds: &str| -> Vec<String> {
        let mut j: Vec<String> = vec!["env".into()];
        if rank {
            j.extend(["RANK=0".into(), "WORLD_SIZE=1".into()]);
        }
        j.extend([
            py.to_str().unwrap().to_string(),
            script.to_str().unwrap().to_string(),
            seconds.into(),
            "2".into(),
        ]);
        j
    };
    let coverage = |out: &Path| -> (String, u64) {
        let r = report(out);
        (
            python_stacks_detail(&r),
            r["stacks"]["python_stacks"].as_u64().unwrap(),
        )
    };
    for (rank, wall_spy) in [(false, false), (true, false), (true, true)] {
        // py-spy waits up to 3 s for the wall-clock sampler to read the
        // rank's loop thread with the agent's layout, which it never does
        // with GPUPROF_WALL_PY=spy: that job runs past it.
        let j = job(rank, if wall_spy { "4.5" } else { "2" });
        let args: Vec<&str> = j.iter().map(|s| s.as_str()).collect();
        let env: &[(&str, &str)] = if wall_spy {
            &[("GPUPROF_WALL_PY", "spy")]
        } else {
            &[]
        };
        let (out, code, _) = record_env(&format!("pyspy-left-{rank}-{wall_spy}"), env, &[], &args);
        assert_eq!(code, 0);
        let (detail, stacks) = coverage(&out);
        assert!(
            !detail.contains("without the in-process agent"),
            "processes the agent sampled said to run without it: {detail}"
        );
        let r = report(&out);
        let sampled = r["stacks"]["python"]["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["sampler"] == "same-instant")
            .count();
        assert_eq!(
            sampled, 3,
            "main and two workers sampled by the agent: {}",
            r["stacks"]["python"]
        );
        if wall_spy {
            assert!(
                detail.contains("read 1 Python process(es) and left 2 to the in-process agent"),
                "{detail}"
            );
            assert!(stacks > 0, "the rank's main process is read: {detail}");
        } else if rank {
            assert!(
                detail.contains("read 0 Python process(es) and left 3 to the in-process agent"),
                "{detail}"
            );
            assert_eq!(stacks, 0, "{detail}");
            let looks = native_stacks_detail(&r);
            let reads: u64 = looks
                .split(" reads with the agent's frame layout")
                .next()
                .and_then(|s| s.rsplit(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            assert!(
                reads > 0,
                "the rank's loop thread was not read with the agent's layout: {looks}"
            );
        } else {
            assert!(
                detail.contains("read 0 Python process(es) and left 3 to the in-process agent"),
                "{detail}"
            );
            assert_eq!(stacks, 0, "{detail}");
            // perf's own samples of the threads the agent kept up with were
            // not unwound (the recording marks them), and no output shows
            // them: the agent's samples of those threads are used.
            let events = recorded_events(&out);
            assert!(
                events.contains("[perf: not unwound"),
                "perf samples were all unwound"
            );
            // The reader decides as it reads; the analysis decides per
            // thread on the totals (`agent_covers`). A thread with few
            // samples (a worker's queue feeder: 5 agent samples to 11 of
            // perf's in one run) may end below the line after the reader
            // relied on the agent for some of them: the analysis then uses
            // perf's samples, and the thread's agent sample nearest in time
            // stands in for each one not unwound; one with no agent sample
            // within a second keeps the label, counted in the report. Only
            // such a thread may show them.
            let mut per_thread: BTreeMap<(u64, u64), (u64, u64)> = BTreeMap::new();
            for l in events.lines() {
                let e: Value = serde_json::from_str(l).unwrap();
                // The wall-clock sampler's looks at blocked threads are
                // neither the agent's nor perf's CPU samples.
                if e["k"] != "samples" || e["kind"] != "native" || e["source"] == "wall" {
                    continue;
                }
                let n = e["stacks"].as_array().map_or(0, |a| a.len() as u64);
                let c = per_thread
                    .entry((e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
                    .or_default();
                if e["source"] == "agent" {
                    c.0 += n;
                } else {
                    c.1 += n;
                }
            }
            let fell_back: Vec<u64> = per_thread
                .iter()
                .filter(|(_, &(a, p))| a > 0 && !agent_covers(a, p))
                .map(|(k, _)| k.0)
                .collect();
            let all = std::fs::read_to_string(out.join("stacks-all-native.folded")).unwrap();
            let labelled: u64 = all
                .lines()
                .filter(|l| l.contains("not unwound"))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
                .sum();
            assert_eq!(
                labelled,
                r["stacks"]["not_unwound"].as_u64().unwrap(),
                "labelled samples against the report's count: {}",
                r["stacks"]
            );
            for l in all.lines().filter(|l| l.contains("not unwound")) {
                let pid: u64 = l
                    .split_once(" (")
                    .and_then(|(_, r)| r.split_once(')'))
                    .and_then(|(p, _)| p.parse().ok())
                    .expect("pid");
                assert!(
                    fell_back.contains(&pid),
                    "{l}: no thread of {pid} fell back to perf: {per_thread:?}"
                );
            }
            // The busy threads (each process's main one) keep the agent's.
            for ((pid, tid), (a, p)) in &per_thread {
                if pid == tid && *p >= 50 {
                    assert!(agent_covers(*a, *p), "{pid}: agent {a}, perf {p}");
                }
            }
        }
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// A Python process that sleeps for the whole run (as `multiprocessing`'s
/// resource tracker, which a spawn-context DataLoader starts) never uses
/// the sampling period of CPU that brings the agent's first sample and
/// word. py-spy does not read it after the agent's silence limit (2 s):
/// read at 99 Hz, an idle process cost ~2% of a core. A process that then
/// computes is sampled by the agent as usual.
#[test]
fn an_idle_python_child_is_not_read_by_py_spy() {
    need_perf!();
    let Some(py) = common::python_minor(11) else {
        skip!("CPython 3.11 is not installed (pyenv)");
    };
    // The idle child must never reach the agent's first sample, whatever
    // its start-up costs on a loaded machine (a 3.11 start-up took more
    // than the 10 ms period under load): its agent samples once per second
    // of CPU, which a start-up never uses. The second child keeps the
    // default period; it sleeps 3 s, then computes. The job's own process
    // computes 50 ms first: its CPU after the agent's start was otherwise
    // about one sampling period, so on a fast machine it too stayed silent
    // in one CI run of five (2 silent processes, not 1).
    let job = r#"
import os, subprocess, sys, time
end = time.thread_time() + 0.05
while time.thread_time() < end: pass
slow = dict(os.environ, GPUPROF_PYSTACKS_PERIOD_NS="1000000000")
idle = subprocess.Popen([sys.executable, "-S", "-I", "-c", "import time; time.sleep(4)"], env=slow)
late = subprocess.Popen([sys.executable, "-S", "-I", "-c",
    "import time\ntime.sleep(3)\nend = time.thread_time() + 0.6\nwhile time.thread_time() < end: pass"])
idle.wait(); late.wait()
print("children done", idle.pid, late.pid)
"#;
    let (out, code, stdout) = record_stdout("idle-child", &[], &[py.to_str().unwrap(), "-c", job]);
    assert_eq!(code, 0);
    let pids: Vec<u64> = stdout
        .split_whitespace()
        .skip(2)
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(pids.len(), 2, "{stdout}");
    let r = report(&out);
    let detail = python_stacks_detail(&r);
    assert!(detail.contains("read 0 Python process(es)"), "{detail}");
    assert!(
        detail.contains("1 more with the agent loaded stayed silent while using under 10 sampling periods of CPU"),
        "{detail}"
    );
    assert_eq!(
        r["stacks"]["python_stacks"].as_u64().unwrap(),
        0,
        "{detail}"
    );
    // The late one was left to the agent once it spoke, and its computing
    // has same-instant Python frames.
    let late = r["stacks"]["python"]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pids[1]))
        .cloned()
        .unwrap_or_else(|| panic!("{}", r["stacks"]["python"]));
    assert_eq!(late["sampler"], "same-instant", "{late}");
    let _ = std::fs::remove_dir_all(&out);
}

/// The job's signals and children behave as without gpuprof: its own
/// SIGTRAP handler gets its SIGTRAP, a default SIGTRAP kills it the same
/// way, a thread with SIGTRAP blocked (sampled all the same, its mask read
/// back as it set it) and children started every way run normally.
#[test]
fn the_jobs_signals_and_children_are_untouched() {
    need_perf!();
    let Some(py) = common::python_minor(12).or_else(|| common::python_minor(11)) else {
        skip!("no CPython 3.11/3.12 installed (pyenv)");
    };
    let job = |m: &str| {
        vec![
            py.to_str().unwrap().to_string(),
            scripts()
                .join("signals_job.py")
                .to_str()
                .unwrap()
                .to_string(),
            m.to_string(),
        ]
    };
    let (out, code) = record(
        "sig-handler",
        &[],
        &job("handler")
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>(),
    );
    assert_eq!(code, 0, "the job's SIGTRAP handler did not run");
    let r = report(&out);
    let pr = &r["stacks"]["python"]["processes"][0];
    assert_eq!(pr["agent"]["handler_chained"], true, "{pr}");
    assert!(pr["same_instant"].as_u64().unwrap() > 0, "{pr}");
    let _ = std::fs::remove_dir_all(&out);

    let (out, code) = record(
        "sig-default",
        &[],
        &job("default")
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>(),
    );
    assert_eq!(code, 128 + libc::SIGTRAP, "died of its own SIGTRAP");
    let _ = std::fs::remove_dir_all(&out);

    let (out, code) = record(
        "sig-spawn",
        &[],
        &job("spawn").iter().map(|s| s.as_str()).collect::<Vec<_>>(),
    );
    assert_eq!(code, 0);
    let r = report(&out);
    let p = &r["stacks"]["python"];
    // The thread that blocks SIGTRAP read back its mask and found nothing
    // pending (the script asserts both), and the agent still sampled it:
    // SIGTRAP is never really blocked while the agent samples.
    let missed = p["unattributed_by_reason"]["thread not sampled by the agent"]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(
        missed, 0,
        "the blocked thread was sampled by the agent: {p}"
    );
    assert_eq!(p["processes"][0]["agent"]["late_signals"], 0, "{p}");
    let _ = std::fs::remove_dir_all(&out);
}

/// The job rewrites its own SIGTRAP disposition on two threads in a tight
/// loop while its other threads raise SIGTRAPs (at themselves and at a
/// writer, in the middle of its `sigaction` calls) and the agent samples
/// them all: the job runs to its end, every SIGTRAP a thread raised reaches
/// the job's handler exactly once, called as it was installed, and every
/// disposition `sigaction()` hands back is one the job set, whole.
#[test]
fn the_jobs_sigaction_races_the_agents_samples() {
    need_perf!();
    let Some(py) = common::python_minor(12).or_else(|| common::python_minor(11)) else {
        skip!("no CPython 3.11/3.12 installed (pyenv)");
    };
    let dir = tmp("sigrace-lib");
    std::fs::create_dir_all(&dir).unwrap();
    let so = match common::build_sigtrap_race(&dir) {
        Ok(so) => so,
        Err(e) => skip!("{e}"),
    };
    let (out, code, stdout) = record_stdout(
        "sigrace",
        &[],
        &[
            py.to_str().unwrap(),
            scripts().join("sigtrap_race.py").to_str().unwrap(),
            so.to_str().unwrap(),
            "2",
        ],
    );
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("race ok"), "{stdout}");
    let r = report(&out);
    let pr = &r["stacks"]["python"]["processes"][0];
    assert_eq!(pr["agent"]["handler_chained"], true, "{pr}");
    assert!(pr["same_instant"].as_u64().unwrap() > 0, "{pr}");
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without the agent (`--python-frames py-spy`): nothing matched in time;
/// native samples of Python code under `[python: not sampled]`, py-spy's
/// stacks as the Python-only view.
#[test]
fn without_the_agent_python_stacks_are_a_separate_view() {
    need_perf!();
    let Some(py) = common::python_minor(11).or_else(|| common::python_minor(12)) else {
        skip!("no CPython 3.11/3.12 installed (pyenv)");
    };
    let (out, code) = record(
        "pyspy",
        &["--python-frames", "py-spy"],
        &[
            py.to_str().unwrap(),
            scripts().join("alternate.py").to_str().unwrap(),
            "1.5",
            "0",
        ],
    );
    assert_eq!(code, 0);
    let t = classify(&folded(&out.join("stacks-main.folded")));
    assert_eq!((t.right, t.wrong), (0, 0), "{t:?}");
    assert!(t.unattributed > 5, "{t:?}");
    let only = folded(&out.join("stacks-python-only.folded"));
    assert!(
        only.iter()
            .any(|l| l.0.ends_with(";compress_block (alternate.py)")),
        "{only:?}"
    );
    assert!(out.join("flame-python-only.svg").exists());
    let r = report(&out);
    let pr = &r["stacks"]["python"]["processes"][0];
    assert_eq!(pr["sampler"], "python-only", "{pr}");
    assert!(pr["python_only_stacks"].as_u64().unwrap() > 0, "{pr}");
    let cov = r["coverage"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["source"] == "python-same-instant")
        .expect("coverage of the agent");
    assert_eq!(cov["available"], false);
    assert!(cov["detail"].as_str().unwrap().contains("--python-frames"));
    let _ = std::fs::remove_dir_all(&out);
}

/// The ring (src/agent/ring.h) under contention: 6 threads writing into a
/// small ring while gpuprof's reader drains it. Every record arrives whole
/// and in its thread's order, or was counted as dropped.
#[test]
fn the_ring_delivers_every_record_or_counts_it() {
    let dir = tmp("ring");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("ring_stress");
    let st = Command::new("gcc")
        .args(["-O2", "-std=gnu11", "-pthread", "-I"])
        .arg(common::repo().join("src/agent"))
        .arg(common::repo().join("tests/agent/ring_stress.c"))
        .arg("-o")
        .arg(&bin)
        .status();
    if !st.is_ok_and(|s| s.success()) {
        skip!("gcc could not build the ring writer");
    }
    let (threads, records) = (6u64, 4000u64);
    let child = Command::new(&bin)
        .arg(&dir)
        .args([
            threads.to_string(),
            records.to_string(),
            (256u64 << 10).to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut rings = AgentRings::new(dir.clone());
    let mut got: BTreeMap<i32, Vec<u64>> = BTreeMap::new();
    let mut buf = Vec::new();
    let check = |buf: &mut Vec<(usize, AgentRecord)>, got: &mut BTreeMap<i32, Vec<u64>>| {
        for (_, r) in buf.drain(..) {
            let AgentRecord::Sample(s) = r else {
                panic!("unexpected record {r:?}")
            };
            let regs = s.native.regs.unwrap();
            let (t, seq) = (regs[0], regs[1]);
            assert_eq!(t, s.native.tid.0 as u64);
            for (i, b) in s.native.stack.iter().enumerate() {
                assert_eq!(*b, (t * 31 + seq + i as u64) as u8, "torn record");
            }
            got.entry(s.native.tid.0).or_default().push(seq);
        }
    };
    // Drain while it writes, then what is left.
    let mut child = child;
    while child.try_wait().unwrap().is_none() {
        rings.drain(&mut buf, false);
        check(&mut buf, &mut got);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let out = child.wait_with_output().unwrap();
    rings.drain(&mut buf, true);
    check(&mut buf, &mut got);
    let dropped: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let received: u64 = got.values().map(|v| v.len() as u64).sum();
    for (t, seqs) in &got {
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "thread {t} out of order"
        );
    }
    assert_eq!(
        received + dropped,
        threads * records,
        "{received} + {dropped}"
    );
    assert_eq!(rings.dropped().values().sum::<u64>(), dropped);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Blocked loop threads' Python frames read with the layout the agent
/// publishes are py-spy's for the same look, on every installed CPython
/// 3.9–3.13: `GPUPROF_WALL_PY=check` has the wall-clock sampler read both
/// and compare them for each look whose thread stayed blocked through
/// both. The job's frames hold methods and nested functions (qualified
/// names), a non-ASCII name, and functions compiled anew every step whose
/// code objects are freed and reborn at one another's address (a name
/// cached by address alone would be the other one's). Helper threads
/// blocked beside the loop are compared too where py-spy names threads
/// (3.11+; before, only a process's lone thread).
#[test]
fn blocked_threads_frames_read_with_the_agents_layout_are_py_spys() {
    need_perf!();
    let mut tried = 0;
    let mut table = Vec::new();
    for minor in 9..=13 {
        let Some(py) = common::python_minor(minor) else {
            continue;
        };
        tried += 1;
        let threads = if minor >= 11 { "2" } else { "0" };
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let out = tmp(&format!("wallpy{minor}"));
        let o = Command::new(BIN)
            .env("GPUPROF_WALL_PY", "check")
            .args(["-q", "--no-gpu", "-o"])
            .arg(&out)
            .arg("--")
            .arg(&py)
            .arg(scripts().join("blocked_frames.py"))
            .args(["2.5", threads])
            .current_dir(std::env::temp_dir())
            .output()
            .expect("run gpuprof");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "3.{minor}: {stderr}");
        let r = report(&out);
        let detail = r["coverage"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["detail"].as_str())
            .find(|d| d.contains("wall-clock sampler"))
            .unwrap_or_else(|| panic!("3.{minor}: no wall-clock sampler: {}", r["coverage"]))
            .to_string();
        let count = |before: &str| -> u64 {
            let i = detail
                .find(before)
                .unwrap_or_else(|| panic!("3.{minor}: no {before:?} in {detail}"));
            detail[..i]
                .trim_end()
                .rsplit(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("3.{minor}: {detail}"))
        };
        let after = |prefix: &str| -> u64 {
            let i = detail
                .find(prefix)
                .unwrap_or_else(|| panic!("3.{minor}: no {prefix:?} in {detail}"));
            detail[i + prefix.len()..]
                .split(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("3.{minor}: {detail}"))
        };
        let agent = count("reads with the agent's frame layout");
        let checked = after("checked against py-spy: ");
        let differed = count("differed");
        table.push(format!(
            "3.{minor}: {agent} agent-layout reads, {checked} threads checked, {differed} differed"
        ));
        assert!(
            agent >= 30,
            "3.{minor}: the agent's layout was not used: {detail}"
        );
        assert!(checked >= 30, "3.{minor}: too few looks compared: {detail}");
        assert_eq!(differed, 0, "3.{minor}: {detail}\n{stderr}");
        let folded = std::fs::read_to_string(out.join("stacks-loop-wall.folded")).unwrap();
        for f in ["Loader.next_batch", "wärte", "fresh_a", "fresh_b"] {
            assert!(
                minor < 11 && f.contains('.') || folded.contains(f),
                "3.{minor}: {f} not in the loop's wall stacks"
            );
        }
        let _ = std::fs::remove_dir_all(&out);
    }
    eprintln!("{}", table.join("\n"));
    if tried == 0 {
        skip!("no CPython 3.9-3.13 installed (pyenv)");
    }
}

/// The GIL's holder, read with the agent's layout, on every installed
/// CPython 3.9–3.13: a pure-Python thread started 0.6 s into the loop,
/// after the loop process's threads were first listed, holds the GIL while
/// the loop waits for it;
/// the gil-contention finding names that thread's function. (The holder
/// once went unnamed: the thread list was walked again only for a blocked
/// thread it lacked, never for a holder.)
#[test]
fn the_gil_holder_is_named_with_the_agents_layout() {
    need_perf!();
    let mut tried = 0;
    for minor in 9..=13 {
        let Some(py) = common::python_minor(minor) else {
            continue;
        };
        tried += 1;
        let (out, code) = record(
            &format!("gil{minor}"),
            &["--no-gpu"],
            &[
                py.to_str().unwrap(),
                common::repo()
                    .join("tests/scripts/gil_job.py")
                    .to_str()
                    .unwrap(),
                "2.5",
                "0.6",
            ],
        );
        assert_eq!(code, 0, "3.{minor}: the job failed");
        let r = report(&out);
        let f = r["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["id"] == "gil-contention")
            .unwrap_or_else(|| panic!("3.{minor}: no gil-contention finding: {:#}", r["findings"]));
        let title = f["title"].as_str().unwrap();
        assert!(
            title.contains("spin_in_python (gil_job.py)"),
            "3.{minor}: {title}"
        );
        let _ = std::fs::remove_dir_all(&out);
    }
    if tried == 0 {
        skip!("no CPython 3.9-3.13 installed (pyenv)");
    }
}

/// The agent's per-version offsets (the LAYOUTS table of pystacks.c) are
/// those of each installed CPython's own headers.
#[test]
fn the_agents_layouts_match_each_pythons_headers() {
    let src = std::fs::read_to_string(common::repo().join("src/agent/pystacks.c")).unwrap();
    let table: BTreeMap<u32, Vec<i64>> = src
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let inner = l.strip_prefix('{')?.strip_suffix("},")?;
            let v: Vec<i64> = inner
                .split(',')
                .map(|x| x.trim().parse().ok())
                .collect::<Option<_>>()?;
            (v.len() == 16).then(|| (v[0] as u32, v))
        })
        .collect();
    assert_eq!(table.len(), 5, "LAYOUTS of 3.9-3.13 in pystacks.c");
    let mut checked = 0;
    for (minor, v) in &table {
        let Some(py) = common::python_minor(*minor) else {
            continue;
        };
        let inc = py
            .parent()
            .and_then(|b| b.parent())
            .map(|p| p.join(format!("include/python3.{minor}")));
        let Some(inc) = inc.filter(|i| i.join("internal").is_dir()) else {
            continue;
        };
        let dir = tmp(&format!("layout{minor}"));
        std::fs::create_dir_all(&dir).unwrap();
        let c = dir.join("o.c");
        std::fs::write(&c, LAYOUT_PROBE).unwrap();
        let exe = dir.join("o");
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
        let o = Command::new(&exe).output().unwrap();
        let got: Vec<i64> = String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(&got, v, "3.{minor}: headers say {got:?}, pystacks.c {v:?}");
        checked += 1;
        let _ = std::fs::remove_dir_all(&dir);
    }
    if checked == 0 {
        skip!("no CPython 3.9-3.13 with its headers and gcc");
    }
}

/// The reader's offsets (the THREAD_LAYOUTS table of pystacks.c: the
/// interpreter's thread list, thread ids, the GIL's state) are those of
/// each installed CPython's own headers.
#[test]
fn the_agents_thread_layouts_match_each_pythons_headers() {
    let src = std::fs::read_to_string(common::repo().join("src/agent/pystacks.c")).unwrap();
    let start = src.find("THREAD_LAYOUTS[] = {").expect("THREAD_LAYOUTS");
    let table: BTreeMap<u32, Vec<i64>> = src[start..]
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with("};"))
        .filter_map(|l| {
            let inner = l.trim().strip_prefix('{')?.strip_suffix("},")?;
            let v: Vec<i64> = inner
                .split(',')
                .map(|x| x.trim().parse().ok())
                .collect::<Option<_>>()?;
            Some((v[0] as u32, v))
        })
        .collect();
    assert_eq!(table.len(), 5, "THREAD_LAYOUTS of 3.9-3.13 in pystacks.c");
    let mut checked = 0;
    for (minor, v) in &table {
        let Some(py) = common::python_minor(*minor) else {
            continue;
        };
        let inc = py
            .parent()
            .and_then(|b| b.parent())
            .map(|p| p.join(format!("include/python3.{minor}")));
        let Some(inc) = inc.filter(|i| i.join("internal").is_dir()) else {
            continue;
        };
        let dir = tmp(&format!("threads{minor}"));
        std::fs::create_dir_all(&dir).unwrap();
        let c = dir.join("t.c");
        std::fs::write(&c, THREAD_PROBE).unwrap();
        let exe = dir.join("t");
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
        let o = Command::new(&exe).output().unwrap();
        let got: Vec<i64> = String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(&got, v, "3.{minor}: headers say {got:?}, pystacks.c {v:?}");
        checked += 1;
        let _ = std::fs::remove_dir_all(&dir);
    }
    if checked == 0 {
        skip!("no CPython 3.9-3.13 with its headers and gcc");
    }
}

/// Prints the THREAD_LAYOUTS row of the CPython whose headers it is
/// compiled with, and fails where the GIL's state does not start
/// {interval, last_holder, locked}.
const THREAD_PROBE: &str = r#"
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
int main(void) {
    long v[8];
    v[0] = PY_MINOR_VERSION;
    v[1] = offsetof(_PyRuntimeState, interpreters.head);
#if PY_VERSION_HEX < 0x030b0000
    v[2] = offsetof(PyInterpreterState, tstate_head);
#else
    v[2] = offsetof(PyInterpreterState, threads.head);
#endif
    v[3] = offsetof(PyThreadState, next);
    v[4] = offsetof(PyThreadState, thread_id);
#if PY_VERSION_HEX >= 0x030b0000
    v[5] = offsetof(PyThreadState, native_thread_id);
#else
    v[5] = -1;
#endif
#if PY_VERSION_HEX >= 0x030c0000
    v[6] = 1;
    v[7] = offsetof(PyInterpreterState, ceval.gil);
#else
    v[6] = 0;
    v[7] = offsetof(_PyRuntimeState, ceval.gil);
#endif
    if (offsetof(struct _gil_runtime_state, last_holder) != 8 ||
        offsetof(struct _gil_runtime_state, locked) != 16)
        return 1;
    for (int i = 0; i < 8; i++) printf("%ld ", v[i]);
    printf("\n");
    return 0;
}
"#;

/// Prints the LAYOUTS row of the CPython whose headers it is compiled with.
const LAYOUT_PROBE: &str = r#"
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
    long v[16];
    for (int i = 0; i < 16; i++) v[i] = -1;
    v[0] = PY_MINOR_VERSION;
    v[3] = 0;
#if PY_VERSION_HEX < 0x030b0000
    v[1] = offsetof(PyThreadState, frame);
    v[4] = offsetof(PyFrameObject, f_back);
    v[5] = offsetof(PyFrameObject, f_code);
    v[8] = offsetof(PyFrameObject, f_code) + 8;
    v[10] = offsetof(PyCodeObject, co_name);
#else
#if PY_VERSION_HEX < 0x030d0000
    v[2] = offsetof(PyThreadState, cframe);
    v[3] = offsetof(_PyCFrame, current_frame);
    v[5] = offsetof(_PyInterpreterFrame, f_code);
#else
    v[1] = offsetof(PyThreadState, current_frame);
    v[5] = offsetof(_PyInterpreterFrame, f_executable);
#endif
    v[4] = offsetof(_PyInterpreterFrame, previous);
    v[6] = offsetof(_PyInterpreterFrame, owner);
#if PY_VERSION_HEX < 0x030c0000
    v[7] = offsetof(_PyInterpreterFrame, is_entry);
#else
    v[9] = FRAME_OWNED_BY_CSTACK;
#endif
    v[8] = offsetof(_PyInterpreterFrame, localsplus);
    v[10] = offsetof(PyCodeObject, co_qualname);
#endif
    v[11] = offsetof(PyCodeObject, co_filename);
    v[12] = offsetof(PyCodeObject, co_firstlineno);
    v[13] = v[10] + 8;
    v[14] = sizeof(PyASCIIObject);
    v[15] = sizeof(PyCompactUnicodeObject);
    for (int i = 0; i < 16; i++) printf("%ld ", v[i]);
    printf("\n");
    return 0;
}
"#;

/// A forked child does not keep its parent's ring mapped: it makes its
/// own, and the parent's 2 MiB would otherwise stay in every DataLoader
/// worker's address space. The parent samples (its ring exists) before it
/// forks; the child lists its own mappings.
#[test]
fn a_forked_child_does_not_keep_its_parents_ring() {
    need_perf!();
    let Some(py) = common::python_minor(12).or_else(|| common::python_minor(11)) else {
        skip!("no CPython 3.11/3.12 installed (pyenv)");
    };
    let job = "import os, time\n\
        def spin(s):\n    end = time.monotonic() + s\n    x = 0\n    while time.monotonic() < end:\n        x += 1\n\
        spin(0.5)\n\
        parent = os.getpid()\n\
        pid = os.fork()\n\
        if pid:\n    os.waitpid(pid, 0)\n    raise SystemExit(0)\n\
        rings = [l.split()[-1] for l in open('/proc/self/maps') if l.rstrip().endswith('.ring')]\n\
        print('rings', len(rings), 'of the parent', sum(os.path.basename(r).startswith(f'{parent}-') for r in rings), flush=True)\n\
        os._exit(0)\n";
    let (out, code, stdout) = record_stdout("forkring", &[], &[py.to_str().unwrap(), "-c", job]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("of the parent 0"), "{stdout}");
    // The premise: the parent had a ring (its agent sampled it).
    let events = recorded_events(&out);
    assert!(
        events.contains("\"source\":\"agent\""),
        "the parent was not sampled by its agent"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// `--delay`: nothing is sampled before the recording window opens, in
/// gpuprof (perf's events are off) or in the job (the agent's handler
/// returns at once); once it opens, every process is sampled, the one
/// forked during the delay too (turning an inherited event on reaches its
/// copies in tasks created meanwhile).
#[test]
fn delay_samples_nothing_before_the_window() {
    need_perf!();
    let Some(py) = common::python_minor(12).or_else(|| common::python_minor(11)) else {
        skip!("no CPython 3.11/3.12 installed (pyenv)");
    };
    let job = "import os, time\n\
        def spin(until):\n    x = 0\n    while time.monotonic() < until:\n        x += 1\n\
        t0 = time.monotonic()\n\
        spin(t0 + 0.3)\n\
        pid = os.fork()\n\
        spin(t0 + 2.6)\n\
        if pid:\n    os.waitpid(pid, 0)\nelse:\n    os._exit(0)\n";
    let (out, code) = record(
        "delay",
        &["--delay", "1s"],
        &[py.to_str().unwrap(), "-c", job],
    );
    assert_eq!(code, 0);
    let events = recorded_events(&out);
    let mut window = None;
    // (source, pid) -> (samples, earliest batch start)
    let mut seen: BTreeMap<(String, u64), (u64, u64)> = BTreeMap::new();
    for l in events.lines() {
        let e: Value = serde_json::from_str(l).unwrap();
        if e["k"] == "window_start" {
            window = e["t"].as_u64();
        }
        if e["k"] != "samples" || e["kind"] != "native" {
            continue;
        }
        let source = e["source"].as_str().unwrap_or("perf").to_string();
        let c = seen
            .entry((source, e["pid"].as_u64().unwrap()))
            .or_insert((0, u64::MAX));
        c.0 += e["stacks"].as_array().unwrap().len() as u64;
        c.1 = c.1.min(e["t0"].as_u64().unwrap());
    }
    let window = window.expect("a window_start event");
    for ((source, pid), (n, first)) in &seen {
        // Batch times are kept to the microsecond.
        assert!(
            first + 1000 >= window,
            "{n} {source} samples of {pid}, the first {} ms before the window opened",
            (window - first) / 1_000_000
        );
    }
    let pids = |source: &str| -> usize {
        seen.iter()
            .filter(|((s, _), (n, _))| s == source && *n >= 20)
            .count()
    };
    assert_eq!(
        pids("agent"),
        2,
        "the agent sampled both processes: {seen:?}"
    );
    assert_eq!(pids("perf"), 2, "perf sampled both processes: {seen:?}");
    let r = report(&out);
    assert!(
        r["stacks"]["unwind_coverage"].as_f64().unwrap() >= 0.9,
        "{}",
        r["stacks"]
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// A thread's time in the kernel (system calls, page faults: reading files,
/// copying tensors into shared memory, faulting in fresh buffers) is CPU
/// time its stacks must show. A perf event that leaves the kernel out takes
/// no sample for a period that ends there: a job reading /dev/zero for 1.5
/// s of CPU showed none of it, and a loop of short system calls a third of
/// its samples. Where the kernel allows it (root, CAP_PERFMON or
/// perf_event_paranoid <= 1, on Linux 6.11 and later) those periods are
/// sampled, at the end of the system call they ended in; elsewhere they
/// are counted and said (`tests/timer_sampler.rs` runs the job as nobody).
#[test]
fn time_in_the_kernel_is_sampled_where_the_kernel_allows() {
    need_perf!();
    let Some(py) = common::python_minor(11).or_else(|| common::python_minor(12)) else {
        skip!("no Python 3.11 or 3.12 here");
    };
    let (out, code, stdout) = record_stdout(
        "kernel-time",
        &[],
        &[
            py.to_str().unwrap(),
            scripts().join("kernel_time.py").to_str().unwrap(),
            "1",
            "1.5",
        ],
    );
    assert_eq!(code, 0, "the job failed");
    let k = common::check_kernel_time(&out, &stdout, 99.0);
    let allowed = common::is_root() && common::kernel_traps_on_return();
    assert_eq!(
        k.kernel_sampled,
        Some(allowed),
        "root: {}, Linux 6.11 or later: {}: {k:?}",
        common::is_root(),
        common::kernel_traps_on_return()
    );
}
