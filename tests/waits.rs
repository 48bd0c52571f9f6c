//! Where the training loop waits: the wall-clock sampler's stacks of
//! blocked threads, their wait classes, and DDP's all-reduce waited for
//! inside `backward`. Each job logs its own truth; gpuprof's figures must
//! come within 10 points of it.

#[macro_use]
mod common;

use common::*;
use serde_json::Value;

/// Points between gpuprof's share and the job's own: a look every 10 ms
/// over ~2.5 s of loop gives ~250 looks, whose sampling error is ~3
/// points; the rest is time the job counts as waiting and gpuprof as
/// running (woken, waiting for a CPU on two loaded cores).
const TOLERANCE: f64 = 0.10;

/// The tests run one at a time: each measures shares of a thread's wall
/// time against the job's own clock, and gpuprof counts a woken thread
/// still waiting for a CPU as on a CPU (docs/stacks.md). Two DDP ranks
/// importing PyTorch beside the queue job on two cores would make that
/// wait, and not the product, decide the figure.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn script(name: &str) -> String {
    repo()
        .join("tests/scripts")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// The job's main thread in report.json `waits`.
fn main_thread<'a>(r: &'a Value, pid: &Value) -> &'a Value {
    r["waits"]["threads"]
        .as_array()
        .unwrap_or_else(|| panic!("no waits: {}", r["waits"]))
        .iter()
        .find(|t| t["pid"] == *pid && t["main_thread"] == true)
        .unwrap_or_else(|| panic!("main thread of {pid} not looked at: {}", r["waits"]))
}

fn share(t: &Value, class: &str) -> f64 {
    t["blocked"][class]["share"].as_f64().unwrap_or(0.0)
}

/// A loop fed through a queue by a slow producer thread: the share of its
/// wall time waiting for the next batch is the job's own figure; the same
/// loop waiting in a stand-in for GPU synchronization is GPU-bound, never
/// "next batch". ~4 s per job (3 s of loop).
#[test]
fn a_loops_wait_for_batches_and_for_the_gpu_match_its_own_log() {
    let _g = serial();
    if let Some(why) = perf_refused() {
        skip!("{why}");
    }
    let tmp = scratch("queue");
    for mode in ["batch", "sync"] {
        let log = tmp.join(format!("{mode}.json"));
        let (out, o) = record(
            &tmp,
            mode,
            &["--no-gpu"],
            &[
                "python3",
                &script("queue_loop.py"),
                mode,
                log.to_str().unwrap(),
                "3",
            ],
        );
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let truth = read_json(&log);
        let truth = truth["waited_s"].as_f64().unwrap() / truth["loop_s"].as_f64().unwrap();
        let r = report(&out);
        let t = main_thread(&r, &job_process(&r)["pid"]);
        assert_eq!(t["counted_over"], "steady_state", "{t}");
        let (ours, other) = match mode {
            "batch" => (share(t, "next_batch"), share(t, "gpu_sync")),
            _ => (share(t, "gpu_sync"), share(t, "next_batch")),
        };
        assert!(
            (ours - truth).abs() <= TOLERANCE,
            "{mode}: gpuprof {ours:.3}, the job's own {truth:.3}: {t}"
        );
        assert_eq!(other, 0.0, "{mode}: {t}");
        // The loop's wall-clock flamegraph says the same: its blocked
        // towers weigh the waited share, its on-CPU ones are the loop's
        // own code, and together they are the span counted.
        let folded = std::fs::read_to_string(out.join("stacks-loop-wall.folded")).unwrap();
        let (mut total, mut waiting, mut computing) = (0u64, 0u64, 0u64);
        let marker = match mode {
            "batch" => "[waiting: next batch]",
            _ => "[waiting: GPU synchronization]",
        };
        for l in folded.lines() {
            let (path, n) = l.rsplit_once(' ').unwrap();
            let n: u64 = n.parse().unwrap();
            total += n;
            if path.contains(marker) {
                waiting += n;
            }
            if path.contains("compute (queue_loop.py)") && !path.contains("[waiting:") {
                computing += n;
            }
        }
        let wall_share = waiting as f64 / total.max(1) as f64;
        assert!(
            (wall_share - truth).abs() <= TOLERANCE,
            "{mode}: flame-loop-wall {wall_share:.3}, the job's own {truth:.3}:\n{folded}"
        );
        assert!(
            computing > 0,
            "{mode}: no on-CPU tower of compute:\n{folded}"
        );
        let span_us = t["span_s"].as_f64().unwrap() * 1e6;
        assert!(
            (total as f64 - span_us).abs() <= 0.1 * span_us,
            "{mode}: {total} µs drawn over a {span_us:.0} µs span"
        );
        assert!(out.join("flame-loop-wall.svg").is_file());
        let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
        let verdict = if mode == "sync" {
            "GPU-bound"
        } else {
            "Input-bound"
        };
        assert!(summary.contains(verdict), "{mode}: {summary}");
        if mode == "sync" {
            let ids: Vec<&str> = r["findings"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|f| f["id"].as_str())
                .collect();
            assert!(!ids.contains(&"input-pipeline-bound"), "{ids:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A rank started as torchrun's `Popen` starts it: forked by its launcher,
/// then exec'd with `RANK` set. Listed between the fork and the exec (here
/// 2.5 s apart), it had the launcher's environment and was once taken for
/// a helper for the whole run: its loop looked at one tick in four or
/// fewer, its waits in collectives (in DDP's backward) unseen. The exec
/// has it decided again: its main thread is looked at every tick, ~99 a
/// second for its 3 s loop.
#[test]
fn a_rank_forked_then_execed_is_looked_at_as_a_loop() {
    let _g = serial();
    if let Some(why) = perf_refused() {
        skip!("{why}");
    }
    let tmp = scratch("fork-exec");
    let launcher = r#"
import os, sys, time
pid = os.fork()
if pid == 0:
    time.sleep(2.5)
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    loop = "import time\nt = time.time()\nwhile time.time() - t < 3:\n    time.sleep(0.005)\n"
    os.execve(sys.executable, [sys.executable, "-c", loop], env)
os.write(1, f"rank pid {pid}\n".encode())
os.waitpid(pid, 0)
"#;
    let (out, o) = record(&tmp, "out", &["--no-gpu"], &["python3", "-c", launcher]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    let pid: i64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("rank pid "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("the launcher prints the rank's pid: {stdout}"));
    let r = report(&out);
    let t = main_thread(&r, &Value::from(pid));
    let looks = t["samples"].as_u64().unwrap();
    assert!(looks >= 150, "{looks} looks at the rank's loop in 3 s: {t}");
}

/// Real DDP (gloo, two ranks, rank 1's input slower): rank 0 waits for
/// rank 1 in DDP's gradient all-reduce, inside `loss.backward()`, where no
/// Python frame names a collective. Its share of time in collectives is
/// the job's own time in `backward`, and the straggler finding says what
/// rank 0 lost. Slow (~40 s on two loaded cores): two ranks importing
/// torch; the loop itself is 3 s.
#[test]
fn ddp_waits_inside_backward_count_as_collective_waits() {
    let _g = serial();
    let Some(py) = torch_python() else {
        skip!("no PyTorch virtual environment (see .ci/run): torchrun unavailable");
    };
    if let Some(why) = perf_refused() {
        skip!("{why}");
    }
    let torchrun = py.parent().unwrap().join("torchrun");
    let tmp = scratch("ddp");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let (out, o) = record(
        &tmp,
        "out",
        &["--no-gpu"],
        &[
            torchrun.to_str().unwrap(),
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            &port,
            &script("ddp_waits.py"),
            tmp.to_str().unwrap(),
            "30",
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r = report(&out);
    let ranks = r["ranks"].as_array().unwrap();
    let job = |rank: usize| {
        let j = read_json(&tmp.join(format!("rank{rank}.json")));
        j["backward_s"].as_f64().unwrap() / j["loop_s"].as_f64().unwrap()
    };
    let ours = ranks[0]["collective_share"].as_f64().unwrap();
    assert!(
        (ours - job(0)).abs() <= TOLERANCE,
        "rank 0: gpuprof {ours:.3} in collectives, the job {:.3} in backward: {}",
        job(0),
        ranks[0]
    );
    assert!(
        ranks[0]["collective_functions"][0]
            .as_str()
            .unwrap()
            .contains("Reducer"),
        "{}",
        ranks[0]
    );
    let s = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == "straggler-rank")
        .unwrap_or_else(|| panic!("no straggler finding: {:#}", r["findings"]));
    assert_eq!(s["rank"], 1, "{s}");
    let ev = s["evidence"].to_string();
    let lost: f64 = ev
        .split("rank 0 lost ")
        .nth(1)
        .and_then(|x| x.split(' ').next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("the seconds rank 0 lost: {ev}"));
    // Rank 0 waited most of the loop: at least half of its 3 s.
    assert!(lost > 1.0, "{ev}");
    // No "0%" for a wait that was seen.
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    for x in ranks {
        if x["collective_wait_s"].as_f64().unwrap_or(0.0) > 0.0 {
            let line = format!("Rank {}:", x["rank"]);
            let l = summary.lines().find(|l| l.contains(&line)).unwrap_or("");
            assert!(!l.contains("in collectives 0%"), "{l}");
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A pure-Python thread keeps the GIL while the loop comes back from
/// blocking calls: the GIL-contention finding names the holder's function.
/// ~4 s (3 s of loop).
#[test]
fn gil_contention_names_the_holders_function() {
    let _g = serial();
    if let Some(why) = perf_refused() {
        skip!("{why}");
    }
    let tmp = scratch("gil");
    let (out, o) = record(
        &tmp,
        "out",
        &["--no-gpu"],
        &["python3", &script("gil_job.py"), "3"],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r = report(&out);
    let t = main_thread(&r, &job_process(&r)["pid"]);
    assert!(share(t, "gil") >= 0.10, "{t}");
    let f = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == "gil-contention")
        .unwrap_or_else(|| panic!("no gil-contention finding: {:#}", r["findings"]));
    let title = f["title"].as_str().unwrap();
    assert!(title.contains("spin_in_python (gil_job.py)"), "{title}");
    let _ = std::fs::remove_dir_all(&tmp);
}

/// `gpuprof dump PID` on a running two-process job: both processes, each
/// thread's Python frames with lines and its native frames down to the
/// system call, and the job carries on (it is neither stopped nor killed).
#[test]
fn dump_prints_python_and_native_frames_and_leaves_the_job_running() {
    let _g = serial();
    use std::io::BufRead;
    let mut job = std::process::Command::new("python3")
        .arg(script("dump_job.py"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(job.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = job.id().to_string();
    // Both are blocked once the parent sleeps; give it a moment to get there.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let o = gpuprof().args(["dump", &pid]).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(text.contains(&format!("process {pid} (")), "{text}");
    assert_eq!(
        text.matches("\nprocess ").count() + 1,
        2,
        "two processes: {text}"
    );
    for f in ["py  parent_waits (", "py  child_waits (", "dump_job.py:"] {
        assert!(text.contains(f), "{f}: {text}");
    }
    assert!(text.contains("[syscall: clock_nanosleep]"), "{text}");
    assert!(text.contains("[syscall: read]"), "{text}");
    // Native frames, named, under the Python ones.
    assert!(text.contains("c   ") && text.contains("libc"), "{text}");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let state = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    assert_eq!(state, "S", "the job sleeps on, not stopped: {stat}");
    job.kill().unwrap();
    job.wait().unwrap();
}

/// A two-rank job in which rank 1 never enters the all-reduce: within
/// `--hang-after` the output folder holds a hang report naming rank 0 in
/// `all_reduce` and rank 1 in its own function; `gpuprof dump` on the
/// running job prints both ranks with Python and native frames and the
/// ranks carry on. Slow (~40 s on two loaded cores): two ranks importing
/// torch; the hang itself is detected after 3 s.
#[test]
fn a_hung_ddp_job_is_reported_and_dumped() {
    let _g = serial();
    let Some(py) = torch_python() else {
        skip!("no PyTorch virtual environment (see .ci/run): torchrun unavailable");
    };
    if let Some(why) = perf_refused() {
        skip!("{why}");
    }
    let torchrun = py.parent().unwrap().join("torchrun");
    let tmp = scratch("hang");
    let out = tmp.join("out");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let g = gpuprof()
        .args(["-q", "--no-gpu", "--hang-after", "3s", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&torchrun)
        .args([
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            &port,
        ])
        .arg(script("hang_job.py"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let report = out.join("hang-1.txt");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    while !report.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // The report is written whole at once; give the writer a moment.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let text = std::fs::read_to_string(&report).unwrap_or_default();
    let job = std::fs::read_to_string(format!("/proc/{}/task/{}/children", g.id(), g.id()))
        .unwrap_or_default();
    let job = job.split_whitespace().next().unwrap_or("0").to_string();
    let dump = gpuprof().args(["dump", &job]).output().unwrap();
    let dump = String::from_utf8_lossy(&dump.stdout).into_owned();
    // The ranks are still there, asleep, after the report and the dump.
    let ranks: Vec<String> = dump
        .lines()
        .filter(|l| l.starts_with("process ") && l.contains("(rank "))
        .map(|l| l.split_whitespace().nth(1).unwrap().to_string())
        .collect();
    let alive = ranks.iter().all(|p| {
        std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| s.contains(") S "))
    });
    // SIGTERM goes on to the job (torchrun stops its ranks).
    // SAFETY: kill with a valid pid and signal.
    unsafe { libc::kill(g.id() as i32, libc::SIGTERM) };
    let o = g.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!text.is_empty(), "no hang report: {stderr}");
    let head: Vec<&str> = text.lines().take(4).collect();
    let line = |r: &str| {
        head.iter()
            .find(|l| l.starts_with(r))
            .copied()
            .unwrap_or("")
    };
    assert!(line("rank 0").contains("in all_reduce ("), "{head:?}");
    assert!(
        line("rank 1").contains("in rank1_never_reduces ("),
        "{head:?}"
    );
    assert!(
        stderr.contains("looks hung") && stderr.contains("rank 1"),
        "{stderr}"
    );
    assert_eq!(ranks.len(), 2, "{dump}");
    assert!(alive, "the ranks carry on after the dump: {dump}");
    for f in ["py  all_reduce (", "py  rank1_never_reduces (", "c   "] {
        assert!(dump.contains(f), "{f}: {dump}");
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Per step: a PyTorch loop marked with NVTX whose steps each sleep
/// 0.06 + 0.04 s (its stand-in for the GPU), and every 5th writes and
/// syncs a ~100 MB checkpoint. The steps' waits give the sleep per step;
/// a checkpoint step that waited more than usual waited on file IO; the
/// loop's wait track in the trace holds the 1.5 s it slept.
#[test]
fn steps_say_where_the_loop_waited() {
    let _g = serial();
    let Some(py) = torch_python() else {
        skip!("no PyTorch virtual environment (see .ci/run)");
    };
    if let Some(why) = perf_refused() {
        skip!("{why}");
    }
    let tmp = scratch("steps");
    let ckpt = tmp.join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    let (out, o) = record(
        &tmp,
        "out",
        &["--no-gpu"],
        &[
            py.to_str().unwrap(),
            &script("nvtx_steps.py"),
            "15",
            "5",
            ckpt.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = report(&out);
    let s = &r["steps"];
    assert_eq!(s["name"], "train_step", "{s}");
    let sleep = s["waits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["class"] == "sleep")
        .unwrap_or_else(|| {
            panic!(
                "no sleep among the steps' waits: {s}\nwaits: {}",
                r["waits"]
            )
        });
    let p50 = sleep["p50_s"].as_f64().unwrap();
    assert!((0.07..0.13).contains(&p50), "slept {p50} s per step: {s}");
    for x in s["slow"].as_array().unwrap() {
        for c in x["causes"].as_array().unwrap() {
            if c["kind"] == "wait" && [4, 9, 14].contains(&x["index"].as_u64().unwrap()) {
                assert!(c["text"].as_str().unwrap().contains("on file IO"), "{x}");
            }
        }
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        summary.lines().any(
            |l| l.contains("Where the loop thread waited within its steps:") && l.contains("sleep")
        ),
        "{summary}"
    );
    let pid = job_process(&r)["pid"].as_i64().unwrap();
    let t = check_trace(&out.join("trace.json"));
    // 15 steps × 0.1 s of sleep, in stretches that end at a look (10 ms
    // apart): consecutive sleeps with nothing seen between them are one.
    let slept: f64 = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["ph"] == "X"
                && e["pid"] == pid
                && e["tid"] == pid + 2_000_000_000
                && e["name"] == "waiting: sleep"
        })
        .map(|e| e["dur"].as_f64().unwrap() / 1e6)
        .sum();
    assert!(
        (1.2..1.9).contains(&slept),
        "{slept:.3} s of sleep slices on the loop's wait track, 1.5 s slept"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}
